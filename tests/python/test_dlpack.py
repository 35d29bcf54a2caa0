"""DLPack by tensor (Note [DLPack by tensor] in python/accelkit/_dlpack.py):
the capability schema's device types in __dlpack_device__ and in capsules,
zero-copy round trips through every entry point, pinned CPU tensors, numpy
and a minimal producer as the other side, copies, streams and bad inputs."""
import ctypes

import numpy
import pytest
import torch
import torch.utils.dlpack as tdl
from torch.utils.dlpack import DLDeviceType

from backend import DEV, MOD, simdev_only, two_devices

PROPS = MOD.get_device_properties(0)
TYPE = PROPS["dlpack_device_type"]
PINNED = PROPS["dlpack_pinned_device_type"]

# Reading capsules the way a C consumer does: DLManagedTensor(Versioned).
_capi = ctypes.PyDLL(None)
_valid = _capi.PyCapsule_IsValid
_valid.argtypes, _valid.restype = [ctypes.py_object, ctypes.c_char_p], ctypes.c_int
_pointer = _capi.PyCapsule_GetPointer
_pointer.argtypes, _pointer.restype = [ctypes.py_object, ctypes.c_char_p], ctypes.c_void_p


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", ctypes.c_uint32), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class Managed(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


class Versioned(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32),
                ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p),
                ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


IS_COPIED = 1 << 1


def managed(capsule):
    """The capsule's DLManagedTensor or DLManagedTensorVersioned."""
    if _valid(capsule, b"dltensor_versioned"):
        return Versioned.from_address(_pointer(capsule, b"dltensor_versioned"))
    assert _valid(capsule, b"dltensor"), "not an unconsumed DLPack capsule"
    return Managed.from_address(_pointer(capsule, b"dltensor"))


def device_of(capsule):
    d = managed(capsule).dl_tensor.device
    return (d.device_type, d.device_id)


class Producer:
    """A library's array that implements only the two protocol methods, over
    a capsule, and remembers the stream it was asked to order on."""

    def __init__(self, capsule, device):
        self.capsule, self.device, self.streams = capsule, device, []

    def __dlpack__(self, stream=None):
        self.streams.append(stream)
        return self.capsule

    def __dlpack_device__(self):
        return self.device


def shares(a, b):
    """a and b are views of the same memory: pointers equal, writes seen both ways."""
    assert a.data_ptr() == b.data_ptr()
    a.view(-1)[0] = 41
    assert b.view(-1)[0].item() == 41
    b.view(-1)[-1] = 42
    assert a.view(-1)[-1].item() == 42


# The example backends' types: kDLExtDev unless DLPack has the vendor's own.
EXPECTED = {"simdev": (DLDeviceType.kDLExtDev, DLDeviceType.kDLCPU),
            "ocl": (DLDeviceType.kDLOpenCL, DLDeviceType.kDLCPU),
            "cudart": (DLDeviceType.kDLCUDA, DLDeviceType.kDLCUDAHost)}


def test_the_schema_carries_dlpack_device_types():
    assert (TYPE, PINNED) == EXPECTED.get(DEV, (TYPE, PINNED))
    assert DLDeviceType(TYPE) and DLDeviceType(PINNED)
    assert PINNED in (DLDeviceType.kDLCPU, DLDeviceType.kDLCUDAHost, DLDeviceType.kDLROCMHost)


def test_dlpack_device_of_a_device_tensor_is_the_schema_type_and_index():
    t = torch.arange(4.0, device=DEV)
    device = t.__dlpack_device__()
    assert device == (TYPE, 0)
    assert isinstance(device[0], DLDeviceType)


@two_devices
def test_dlpack_device_names_the_tensors_device():
    t = torch.ones(3, device=f"{DEV}:1")
    assert t.__dlpack_device__() == (MOD.get_device_properties(1)["dlpack_device_type"], 1)
    u = torch.from_dlpack(t)
    assert u.device == torch.device(DEV, 1)
    shares(t, u)


def test_cpu_tensors_keep_pytorchs_dlpack_device_and_pinned_ones_report_the_schema():
    assert torch.ones(2).__dlpack_device__() == (DLDeviceType.kDLCPU, 0)
    pinned = torch.ones(2).pin_memory()
    assert pinned.is_pinned()
    # PyTorch says kDLCUDAHost of every pinned tensor; the backend's pinned
    # memory is what its schema says.
    assert pinned.__dlpack_device__() == (PINNED, 0)


@pytest.mark.parametrize("max_version", [None, (1, 0)])
def test_dunder_dlpack_exports_the_schema_device_zero_copy(max_version):
    t = torch.arange(12.0, device=DEV).reshape(3, 4)
    capsule = t.__dlpack__(max_version=max_version)
    versioned = max_version is not None
    assert _valid(capsule, b"dltensor_versioned" if versioned else b"dltensor")
    m = managed(capsule)
    assert device_of(capsule) == (TYPE, 0)
    assert m.dl_tensor.data == t.data_ptr()
    if versioned:
        assert m.major == 1 and not m.flags & IS_COPIED
    u = torch.from_dlpack(capsule)
    assert u.device == t.device and torch.equal(u.cpu(), t.cpu())
    shares(t, u)


def test_to_dlpack_and_from_dlpack_under_both_names_round_trip_zero_copy():
    t = torch.arange(6, dtype=torch.int32, device=DEV)
    capsule = torch.utils.dlpack.to_dlpack(t)
    assert device_of(capsule) == (TYPE, 0)
    u = torch.utils.dlpack.from_dlpack(capsule)
    shares(t, u)
    assert torch.to_dlpack is tdl.to_dlpack and torch.from_dlpack is tdl.from_dlpack
    v = torch.from_dlpack(torch.to_dlpack(u))
    shares(t, v)


def test_torch_from_dlpack_of_a_device_tensor_shares_its_memory():
    t = torch.randn(5, 3, device=DEV)
    u = torch.from_dlpack(t)
    assert u.device == t.device and u.dtype == t.dtype and u.shape == t.shape
    shares(t, u)
    shares(t, tdl.from_dlpack(t))


def test_a_capsule_of_the_backend_keeps_the_memory_until_the_tensor_dies():
    torch.accelerator.synchronize()
    before = MOD.memory_allocated()
    t = torch.full((1 << 16,), 3.0, device=DEV)
    u = torch.from_dlpack(t.__dlpack__(max_version=(1, 0)))
    del t
    assert MOD.memory_allocated() > before  # u holds it through the producer's deleter
    assert u.sum().item() == 3.0 * (1 << 16)
    del u
    torch.accelerator.synchronize()
    assert MOD.memory_allocated() == before


@pytest.mark.parametrize("make", [
    lambda t: t[:, 1::2],        # strided
    lambda t: t.t(),             # transposed
    lambda t: t[1:, 2:],         # offset into the storage
    lambda t: t[2],              # a row at an offset
    lambda t: t[0, 0],           # zero dimensions
    lambda t: t[:0],             # empty
])
def test_views_cross_with_their_strides_and_offsets(make):
    base = torch.arange(30.0, device=DEV).reshape(5, 6)
    view = make(base)
    for u in (torch.from_dlpack(view), torch.from_dlpack(view.__dlpack__(max_version=(1, 0)))):
        assert u.shape == view.shape
        assert torch.equal(u.cpu(), view.cpu())
        if view.numel():
            assert u.data_ptr() == view.data_ptr()
            u.fill_(-1.0)
            assert torch.equal(view.cpu(), torch.full(view.shape, -1.0))


def test_a_byte_offset_in_a_capsule_is_honoured():
    base = torch.arange(8.0, device=DEV)
    capsule = base[2:].__dlpack__()
    m = managed(capsule)
    m.dl_tensor.data -= 8  # the same element two floats on, through byte_offset
    m.dl_tensor.byte_offset = 8
    u = torch.from_dlpack(capsule)
    assert u.data_ptr() == base[2:].data_ptr()
    assert torch.equal(u.cpu(), base[2:].cpu())


def test_copy_true_gives_new_memory_and_says_so():
    t = torch.arange(4.0, device=DEV)
    u = torch.from_dlpack(t, copy=True)
    assert u.device == t.device and u.data_ptr() != t.data_ptr()
    assert torch.equal(u.cpu(), t.cpu())
    capsule = t.__dlpack__(max_version=(1, 0), copy=True)
    assert managed(capsule).flags & IS_COPIED
    assert managed(capsule).dl_tensor.data != t.data_ptr()
    shares(t, torch.from_dlpack(t, copy=False))


def test_dl_device_and_device_arguments():
    t = torch.arange(4.0, device=DEV)
    same = t.__dlpack__(dl_device=(TYPE, 0), copy=False)
    assert device_of(same) == (TYPE, 0) and managed(same).dl_tensor.data == t.data_ptr()
    on_cpu = t.__dlpack__(dl_device=(DLDeviceType.kDLCPU, 0), max_version=(1, 0))
    assert device_of(on_cpu) == (1, 0) and managed(on_cpu).flags & IS_COPIED
    assert torch.equal(torch.from_dlpack(on_cpu), t.cpu())
    with pytest.raises(BufferError, match=f"{DEV}: .*needs a copy, and copy=False"):
        t.__dlpack__(dl_device=(DLDeviceType.kDLCPU, 0), copy=False)
    with pytest.raises(BufferError, match=f"{DEV}: dl_device \\({TYPE}, 9\\) names no {DEV}"):
        t.__dlpack__(dl_device=(TYPE, 9))
    with pytest.raises(BufferError, match=f"{DEV}: cannot export to DLPack device \\(7, 0\\)"):
        t.__dlpack__(dl_device=(DLDeviceType.kDLVulkan, 0))
    # A CPU tensor asked for on the device.
    c = torch.arange(3.0)
    up = c.__dlpack__(dl_device=(TYPE, 0))
    assert device_of(up) == (TYPE, 0)
    assert torch.equal(torch.from_dlpack(up).cpu(), c)
    # torch.from_dlpack(device=...): the same device shares, another copies.
    shares(t, torch.from_dlpack(t, device=DEV))
    cpu = torch.from_dlpack(t, device="cpu")
    assert cpu.device.type == "cpu" and torch.equal(cpu, t.cpu())
    with pytest.raises(ValueError, match="without copying"):
        torch.from_dlpack(t, device="cpu", copy=False)


def test_a_cpu_tensor_pinned_by_the_backend_crosses_zero_copy():
    p = torch.arange(8.0).pin_memory()
    u = torch.from_dlpack(p)
    assert u.device.type == "cpu"
    shares(p, u)
    capsule = p.__dlpack__(max_version=(1, 0))
    assert device_of(capsule) == (PINNED, 0)
    a = numpy.from_dlpack(p)
    assert a.ctypes.data == p.data_ptr()
    a[1] = 99.0
    assert p[1].item() == 99.0


def test_numpy_reads_cpu_tensors_and_refuses_device_memory():
    c = torch.arange(6.0).reshape(2, 3)[:, 1:]
    a = numpy.from_dlpack(c)
    assert a.ctypes.data == c.data_ptr() and (a == c.numpy()).all()
    back = torch.from_dlpack(numpy.arange(5.0))
    assert back.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    with pytest.raises((BufferError, RuntimeError, ValueError)):
        numpy.from_dlpack(torch.ones(2, device=DEV))


def test_a_minimal_producer_of_the_backends_type_is_imported_zero_copy():
    t = torch.arange(10, dtype=torch.int64, device=DEV)
    p = Producer(torch.utils.dlpack.to_dlpack(t), (TYPE, 0))
    u = torch.from_dlpack(p)
    shares(t, u)
    # The producer was asked to order its work before the consumer's stream.
    assert p.streams[-1] == torch.accelerator.current_stream(0).stream_id
    with pytest.raises(RuntimeError, match="consumed only once"):
        torch.from_dlpack(p)  # the capsule was used


def test_stream_arguments():
    t = torch.ones(4, device=DEV)
    default = MOD.default_stream(0)
    side = MOD.Stream()
    for stream in (-1, None, default.stream_id, side.stream_id):
        assert device_of(t.__dlpack__(stream=stream)) == (TYPE, 0)
    with pytest.raises(TypeError, match="stream must be"):
        t.__dlpack__(stream=1.5)
    with pytest.raises(ValueError, match=f"{DEV}: stream id .* names no stream"):
        t.__dlpack__(stream=12345)
    with pytest.raises(BufferError, match="stream must be None or -1 for a tensor in host memory"):
        t.__dlpack__(dl_device=(DLDeviceType.kDLCPU, 0), stream=side.stream_id)


@simdev_only
def test_the_consumers_stream_waits_for_the_producers_work():
    side = MOD.Stream()
    x = torch.zeros(1 << 12, device=DEV)
    src = torch.arange(1 << 12, dtype=torch.float32).pin_memory()
    y = torch.full((1 << 12,), -1.0, device=DEV)
    MOD.synchronize()
    gate = torch.ops.simdev_driver.hold(side)
    try:
        with MOD.stream(side):
            x.copy_(src, non_blocking=True)  # queued behind the held stream
            x.__dlpack__(stream=MOD.default_stream().stream_id)
        y.copy_(x)  # on the default stream, which waits for the export's event
    finally:
        torch.ops.simdev_driver.release(gate)
    MOD.synchronize()
    assert torch.equal(y.cpu(), src)


def test_bad_inputs_are_pytorchs_errors_naming_the_backend():
    t = torch.ones(3, device=DEV, requires_grad=True)
    with pytest.raises(BufferError, match=f"{DEV}: can't export a tensor that requires gradient"):
        t.__dlpack__()
    with pytest.raises(BufferError, match="requires gradient"):
        torch.from_dlpack(t)
    shares(t.detach(), torch.from_dlpack(t.detach()))
    # A capsule of a device type neither PyTorch nor the backend has: PyTorch's
    # error, and the capsule's deleter still runs once (when it dies).
    capsule = torch.utils.dlpack.to_dlpack(torch.ones(2))
    managed(capsule).dl_tensor.device.device_type = int(DLDeviceType.kDLVulkan)
    with pytest.raises(BufferError, match="Unsupported device_type: 7"):
        torch.from_dlpack(capsule)
    # The backend's import refuses a capsule that is not of its types.
    cpu = torch.utils.dlpack.to_dlpack(torch.ones(2))
    address = _pointer(cpu, b"dltensor")
    with pytest.raises(ValueError, match=f"{DEV}: DLPack device type 1 is neither"):
        torch.ops.__getattr__(DEV).dlpack_import(address, False)
    # ... and a device index that is not visible, as an IndexError.
    capsule = torch.utils.dlpack.to_dlpack(torch.ones(2, device=DEV))
    managed(capsule).dl_tensor.device.device_id = 7
    with pytest.raises(IndexError, match=DEV):
        torch.from_dlpack(capsule)
    managed(capsule).dl_tensor.device.device_id = 0  # the capsule's own deleter frees it
    capsule = torch.utils.dlpack.to_dlpack(torch.ones(2, device=DEV))
    torch.from_dlpack(capsule)
    with pytest.raises(RuntimeError, match="consumed only once"):
        torch.from_dlpack(capsule)


def test_install_is_idempotent_and_keeps_pytorchs_functions_for_the_rest():
    import importlib
    dl = importlib.import_module(f"torch_{DEV}._accelkit._dlpack")
    entry = torch.Tensor.__dlpack__
    dl.install()
    assert torch.Tensor.__dlpack__ is entry
    assert entry._accelkit_backend == DEV
    assert entry.__wrapped__ is dl._original["__dlpack__"]
