"""torch.<name>.FloatStorage and the other legacy typed storage classes, as
torch.cuda has them (Note [Legacy storage classes])."""
import torch
from torch._utils import classproperty
from torch.storage import _LegacyStorage, _warn_typed_storage_removal

from .. import _backend

# Note [Legacy storage classes]
# PyTorch's typed storages are deprecated but still answered: a device
# tensor's storage_type() and storage().type() look the class up by name in
# the device's module (TypedStorage._get_legacy_storage_class:
# getattr(torch.<name>, "FloatStorage")), isinstance(s, torch.cuda.FloatStorage)
# asks the class's module for its device, and torch.cuda.FloatStorage(3)
# makes a storage on the device. torch.cuda defines twelve such classes, one
# per dtype of torch.storage's map; without them storage_type() is None on
# the device. So the device module defines the same twelve, whose module is
# torch.<name> (the device they make storages on): they behave as
# torch.cuda's, warn as they do (TypedStorage's deprecation warning), and
# refuse what torch.cuda's refuse (from_buffer, shared file and weak-pointer
# constructors) naming the backend. Limits: they are the classes of nothing
# but typed storages (as torch.cuda's); PyTorch's own device-generic test of
# storage_type() expects the CPU's classes for any device but CUDA.
_DTYPES = {
    "ByteStorage": torch.uint8,
    "DoubleStorage": torch.double,
    "FloatStorage": torch.float,
    "HalfStorage": torch.half,
    "LongStorage": torch.long,
    "IntStorage": torch.int,
    "ShortStorage": torch.short,
    "CharStorage": torch.int8,
    "BoolStorage": torch.bool,
    "BFloat16Storage": torch.bfloat16,
    "ComplexDoubleStorage": torch.cdouble,
    "ComplexFloatStorage": torch.cfloat,
}

__all__ = list(_DTYPES)


class _DeviceLegacyStorage(_LegacyStorage):
    @classmethod
    def from_buffer(cls, *args, **kwargs):
        _warn_typed_storage_removal()
        raise RuntimeError(f"from_buffer: Not available for {_backend.name} storage")

    @classmethod
    def _new_with_weak_ptr(cls, *args, **kwargs):
        raise RuntimeError(f"_new_with_weak_ptr: Not available for {_backend.name} storage")

    @classmethod
    def _new_shared_filename(cls, manager, obj, size, *, device=None, dtype=None):
        raise RuntimeError(f"_new_shared_filename: Not available for {_backend.name} storage")


def _legacy_class(name, dtype):
    def _dtype(cls):
        return dtype

    def _dtype_warned(cls):
        _warn_typed_storage_removal()
        return dtype

    return type(_DeviceLegacyStorage)(name, (_DeviceLegacyStorage,), {
        "__module__": f"torch.{_backend.name}",
        "__qualname__": name,
        "dtype": classproperty(_dtype_warned),
        "_dtype": classproperty(_dtype),
    })


for _name, _dt in _DTYPES.items():
    globals()[_name] = _legacy_class(_name, _dt)
    torch._storage_classes.add(globals()[_name])
del _name, _dt
