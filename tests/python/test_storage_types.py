"""The legacy typed storage classes of the device module (Note [Legacy storage classes] in
python/accelkit/device/_legacy_storage.py): torch.<name>.FloatStorage and the eleven others, as
torch.cuda has them: Tensor.storage_type(), storage().type(), isinstance, construction on
the device, and what they refuse."""
import warnings

import pytest
import torch

from backend import DEV, MOD

# torch.storage's map of dtypes to legacy class names: the twelve torch.cuda defines.
NAMES = {dtype: name for dtype, name in torch.storage._dtype_to_storage_type_map().items()
         if hasattr(torch.cuda, name)}


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "TypedStorage is deprecated")
        yield


def test_the_device_module_has_the_twelve_classes_of_torch_cuda():
    assert len(NAMES) == 12
    for name in NAMES.values():
        cls = getattr(MOD, name)
        assert cls.__module__ == f"torch.{DEV}" and cls.__name__ == name
        assert cls in torch._storage_classes


@pytest.mark.parametrize("dtype", list(NAMES), ids=str)
def test_storage_type_is_the_device_modules_class(dtype):
    t = torch.zeros(4, dtype=dtype, device=DEV)
    cls = getattr(MOD, NAMES[dtype])
    assert t.storage_type() is cls
    assert t.storage().type() == f"torch.{DEV}.{NAMES[dtype]}"
    assert cls._dtype == dtype
    # The CPU's classes stay the CPU's.
    assert torch.zeros(4, dtype=dtype).storage_type() is getattr(torch, NAMES[dtype])


def test_isinstance_checks_the_device_and_the_dtype():
    s = torch.ones(3, device=DEV).storage()
    assert isinstance(s, MOD.FloatStorage)
    assert not isinstance(s, MOD.DoubleStorage)
    assert not isinstance(s, torch.FloatStorage)
    assert not isinstance(torch.ones(3).storage(), MOD.FloatStorage)


def test_the_classes_make_storages_on_the_device():
    s = MOD.FloatStorage(4)
    assert (s.device.type, s.dtype, s.size()) == (DEV, torch.float32, 4)
    d = MOD.DoubleStorage([1, 2, 3])
    assert d.device.type == DEV and d.tolist() == [1.0, 2.0, 3.0]
    t = torch.arange(3, dtype=torch.int32, device=DEV)
    w = MOD.IntStorage(wrap_storage=t.untyped_storage())
    assert w.data_ptr() == t.data_ptr() and w.tolist() == [0, 1, 2]
    # To the CPU and back, through the legacy classes' names.
    assert w.cpu().type() == "torch.IntStorage"
    assert torch.zeros(2, device=DEV).storage().double().type() == f"torch.{DEV}.DoubleStorage"


def test_the_dtype_attribute_warns_as_torch_cudas():
    # PyTorch warns once per process unless told to warn always.
    was = torch.storage._get_always_warn_typed_storage_removal()
    torch.storage._set_always_warn_typed_storage_removal(True)
    try:
        for module in (torch.cuda, MOD):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                assert module.HalfStorage.dtype == torch.half
            assert ["TypedStorage is deprecated" in str(w.message) for w in caught] == [True]
    finally:
        torch.storage._set_always_warn_typed_storage_removal(was)


def test_what_torch_cudas_classes_refuse_is_refused_naming_the_backend():
    with pytest.raises(RuntimeError, match=f"Device of 'wrap_storage' must be {DEV}, but got cpu"):
        MOD.FloatStorage(wrap_storage=torch.ones(2).untyped_storage())
    with pytest.raises(RuntimeError, match=f"from_buffer: Not available for {DEV} storage"):
        MOD.FloatStorage.from_buffer(b"\0\0\0\0", "native")
    with pytest.raises(RuntimeError, match=f"_new_shared_filename: Not available for {DEV}"):
        MOD.FloatStorage._new_shared_filename(None, None, 4)
    with pytest.raises(TypeError, match="Argument type not recognized"):
        MOD.FloatStorage(1.5)
