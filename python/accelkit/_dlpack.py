"""DLPack for the backend's tensors and the CPU tensors it pinned, with the
device types of the capability schema: Tensor.__dlpack__,
Tensor.__dlpack_device__, torch.from_dlpack (torch.utils.dlpack.from_dlpack)
and torch.to_dlpack (torch.utils.dlpack.to_dlpack), installed by
accelkit.install (Note [DLPack by tensor])."""
import ctypes
import functools
import threading

import torch
import torch.utils.dlpack as _torch_dlpack
from torch.overrides import handle_torch_function, has_torch_function_unary
from torch.utils.dlpack import DLDeviceType

from . import _backend

__all__ = ["install"]

# Note [DLPack by tensor]
# Problem: PyTorch's DLPack functions know a PrivateUse1 device only under
# the name "privateuse1": Tensor.__dlpack_device__, and so torch.from_dlpack
# of a tensor, fail for a renamed device type ("Unknown device type simdev
# for Dlpack"); its C++ gives the device kDLExtDev whatever the vendor's
# DLPack type, maps a vendor's type to a PyTorch device type nothing
# implements (kDLOpenCL), and says kDLCUDAHost of every pinned CPU tensor.
# Decision: install() replaces Tensor.__dlpack__, Tensor.__dlpack_device__,
# torch.from_dlpack and torch.to_dlpack (and their torch.utils.dlpack names)
# with functions that handle the backend's tensors, the CPU tensors it
# pinned, and objects and capsules of its device types, with the schema's
# types (Note [DLPack device types] in properties.hpp; the C++ side is Note
# [DLPack through the schema] in torch/dlpack.hpp), and hand everything else
# to PyTorch's function unchanged. Streams, as the DLPack Python
# specification and CUDA's (an int naming a stream is the stream's
# stream_id on the tensor's device): stream=-1 orders nothing; None is the
# device's default stream; an int is a stream of the backend, which waits
# on an event recorded on the tensor's current stream unless it is that
# stream; torch.from_dlpack passes the current stream's id to a producer of
# the backend's device type. A consumer that needs a copy gets it (dl_device
# elsewhere, copy=True) or a BufferError with copy=False, as the
# specification says.
# Limits: code that bound PyTorch's functions by name before install
# (`from torch.utils.dlpack import from_dlpack`) keeps PyTorch's, as do
# consumers that read Tensor.__dlpack_c_exchange_api__ rather than call
# __dlpack__; one backend per process, as PrivateUse1.

_CPU = int(DLDeviceType.kDLCPU)
_NAMES = {False: ctypes.create_string_buffer(b"dltensor"),
          True: ctypes.create_string_buffer(b"dltensor_versioned")}
_USED_NAMES = {False: ctypes.create_string_buffer(b"used_dltensor"),
               True: ctypes.create_string_buffer(b"used_dltensor_versioned")}

# The capsule functions of the C API, as function objects of this module's
# own (ctypes.pythonapi's are shared with whoever sets their argtypes).
_capi = ctypes.PyDLL(ctypes.pythonapi._name)
_capsule_is_valid = _capi.PyCapsule_IsValid
_capsule_is_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_is_valid.restype = ctypes.c_int
_capsule_pointer = _capi.PyCapsule_GetPointer
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_pointer.restype = ctypes.c_void_p
_capsule_set_name = _capi.PyCapsule_SetName
_capsule_set_name.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_set_name.restype = ctypes.c_int


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLTensorHead(ctypes.Structure):  # DLTensor's first members
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice)]


class _VersionedHead(ctypes.Structure):  # DLManagedTensorVersioned's
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32),
                ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p),
                ("flags", ctypes.c_uint64), ("dl_tensor", _DLTensorHead)]


_original = {}       # PyTorch's functions, by name
_types = None        # (device types of the visible devices, pinned type), from the schema
_consume = threading.Lock()  # one consumer of a capsule at a time


def _schema_types():
    global _types
    if _types is None:
        found = [int(t) for t in _backend.ops.dlpack_device_types()]
        _types = (tuple(found[:-1]), found[-1])
    return _types


def _ours(device_type) -> bool:
    """Whether the backend handles a DLPack device type: its devices', or its
    pinned memory's where that is not kDLCPU (PyTorch handles kDLCPU)."""
    if int(device_type) == _CPU:
        return False
    devices, pinned = _schema_types()
    return int(device_type) in devices or int(device_type) == pinned


def _device_type(value: int):
    try:
        return DLDeviceType(value)
    except ValueError:  # a type newer than PyTorch's enumeration
        return value


def _capsule_tensor(capsule):
    """(address, versioned) of an unconsumed DLPack capsule's tensor, or None."""
    for versioned in (True, False):
        if _capsule_is_valid(capsule, _NAMES[versioned]):
            return _capsule_pointer(capsule, _NAMES[versioned]), versioned
    return None


def _capsule_device(address: int, versioned: bool):
    if versioned:
        device = _VersionedHead.from_address(address).dl_tensor.device
    else:
        device = _DLTensorHead.from_address(address).device
    return device.device_type, device.device_id


def _import(capsule) -> torch.Tensor:
    """A tensor over a capsule's memory, the capsule marked used (its
    producer's deleter then runs when the tensor's storage dies)."""
    with _consume:
        found = _capsule_tensor(capsule)
        if found is None or not _ours(_capsule_device(*found)[0]):
            return torch._C._from_dlpack(capsule)  # PyTorch's, and its errors
        address, versioned = found
        tensor = _backend.ops.dlpack_import(address, versioned)
        _capsule_set_name(capsule, _USED_NAMES[versioned])
        return tensor


def _pinned_ours(tensor: torch.Tensor) -> bool:
    """A CPU tensor the backend pinned, where its pinned type is not kDLCPU
    (PyTorch's export then says the truth already)."""
    return (tensor.device.type == "cpu" and tensor.is_pinned()
            and _schema_types()[1] != _CPU)


def _dlpack_device(self):
    if has_torch_function_unary(self):
        return handle_torch_function(torch.Tensor.__dlpack_device__, (self,), self)
    if self.device.type == _backend.name or (self.device.type == "cpu" and self.is_pinned()):
        device_type, index = _backend.ops.dlpack_device(self)
        return (_device_type(device_type), index)
    return _original["__dlpack_device__"](self)


def _target(dl_device):
    """(torch.device, pinned) that a __dlpack__ dl_device names."""
    try:
        device_type, index = (int(v) for v in dl_device)
    except (TypeError, ValueError):
        raise BufferError(f"{_backend.name}: dl_device is a pair (device type, index), got "
                          f"{dl_device!r}") from None
    if device_type == _CPU:
        return torch.device("cpu"), False
    devices, pinned = _schema_types()
    if device_type in devices:
        if not 0 <= index < len(devices) or devices[index] != device_type:
            raise BufferError(f"{_backend.name}: dl_device {(device_type, index)} names no "
                              f"{_backend.name} device ({len(devices)} visible)")
        return torch.device(_backend.name, index), False
    if device_type == pinned:
        return torch.device("cpu"), True
    raise BufferError(f"{_backend.name}: cannot export to DLPack device {(device_type, index)}: "
                      f"{_backend.name} exports to its devices, the CPU and its pinned memory")


def _order(index: int, stream) -> None:
    """Makes the consumer's stream (__dlpack__'s `stream`) wait for the work
    queued on the device's current stream (Note [DLPack by tensor])."""
    if stream == -1:
        return
    current = torch.accelerator.current_stream(index)
    if stream is None:
        consumer = _backend.ops.default_stream(index)
    else:
        consumer = torch.Stream(stream_id=stream, device_index=index,
                                device_type=current.device_type)
    if consumer == current:
        return
    event = torch.Event(device=torch.device(_backend.name, index))
    event.record(current)
    consumer.wait_event(event)  # ValueError naming the backend for an id of no stream


def _dlpack(self, *, stream=-1, max_version=None, dl_device=None, copy=None):
    if has_torch_function_unary(self):
        return handle_torch_function(torch.Tensor.__dlpack__, (self,), self, stream=stream,
                                     max_version=max_version, dl_device=dl_device, copy=copy)
    on_device = self.device.type == _backend.name
    to_device = (dl_device is not None and self.device.type == "cpu"
                 and _ours(_target_type(dl_device)))
    if not (on_device or to_device or _pinned_ours(self)):
        return _original["__dlpack__"](self, stream=stream, max_version=max_version,
                                       dl_device=dl_device, copy=copy)
    name = _backend.name
    if self.requires_grad:
        raise BufferError(f"{name}: can't export a tensor that requires gradient to DLPack, "
                          "use tensor.detach()")
    if self.is_conj():
        raise BufferError(f"{name}: can't export a tensor with the conjugate bit set to DLPack")
    if self.layout != torch.strided:
        raise BufferError(f"{name}: can't export a tensor of layout {self.layout} to DLPack "
                          "(only torch.strided)")
    if stream is not None and type(stream) is not int:
        raise TypeError(f"{name}: stream must be ``int`` or ``none``, got "
                        f"{type(stream).__name__}")
    data, copied = self, False
    if dl_device is not None:
        device, pinned = _target(dl_device)
        if device != self.device or (pinned and not self.is_pinned()):
            if copy is False:
                raise BufferError(f"{name}: exporting a {self.device} tensor to DLPack device "
                                  f"{tuple(int(v) for v in dl_device)} needs a copy, and "
                                  "copy=False")
            data = self.to(device)
            data = data.pin_memory() if pinned else data
            copied = True
    if copy and not copied:
        data, copied = self.clone().detach(), True
    if data.device.type == name:
        _order(data.device.index, stream)
    elif stream is not None and stream != -1:
        raise BufferError(f"{name}: stream must be None or -1 for a tensor in host memory, "
                          f"got {stream}")
    versioned = max_version is not None and max_version[0] >= 1
    capsule = torch._C._to_dlpack_versioned(data) if versioned else torch._C._to_dlpack(data)
    address = _capsule_pointer(capsule, _NAMES[versioned])
    _backend.ops.dlpack_set_export_device(address, versioned, data, copied)
    return capsule


def _target_type(dl_device):
    try:
        return int(dl_device[0])
    except (TypeError, ValueError, IndexError):
        return _CPU  # not ours: PyTorch's __dlpack__ reports it


def _to_dlpack(tensor, **kwargs):
    ours = isinstance(tensor, torch.Tensor) and (tensor.device.type == _backend.name
                                                 or _pinned_ours(tensor))
    if not ours:
        return _original["to_dlpack"](tensor, **kwargs)
    if kwargs:  # dl_device, copy: as __dlpack__ takes them
        return _dlpack(tensor, **kwargs)
    capsule = _original["to_dlpack"](tensor)
    _backend.ops.dlpack_set_export_device(_capsule_pointer(capsule, _NAMES[False]), False,
                                          tensor, False)
    return capsule


def _torch_device_to_dl(device: torch.device):
    if device.type == _backend.name:
        index = _backend.index(device)
        return (_schema_types()[0][index], index)
    return tuple(torch._C._torchDeviceToDLDevice(device))


def _from_dlpack(ext_tensor, *, device=None, copy=None):
    original = _original["from_dlpack"]
    if not hasattr(ext_tensor, "__dlpack__"):
        found = _capsule_tensor(ext_tensor)
        if found is None or device is not None or copy is not None \
                or not _ours(_capsule_device(*found)[0]):
            return original(ext_tensor, device=device, copy=copy)
        return _import(ext_tensor)
    ext_device = tuple(ext_tensor.__dlpack_device__())
    if not _ours(ext_device[0]):
        return original(ext_tensor, device=device, copy=copy)
    # PyTorch's steps (torch/utils/dlpack.py), with the backend's device types.
    kwargs = {"max_version": (1, 0)}
    if copy is not None:
        kwargs["copy"] = copy
    cross_device = False
    if device is not None:
        if isinstance(device, str):
            device = torch.device(device)
        if not isinstance(device, torch.device):
            raise TypeError(f"{_backend.name}: from_dlpack: device must be a torch.device or "
                            f"a str, got {type(device).__name__}")
        target = _torch_device_to_dl(device)
        cross_device = (int(ext_device[0]), int(ext_device[1])) != target
        if not cross_device:
            kwargs["dl_device"] = target
        elif copy is False:
            raise ValueError(f"{_backend.name}: cannot move DLPack tensor from device "
                             f"{ext_device} to {target} without copying. Set copy=None or "
                             "copy=True.")
    if int(ext_device[0]) in _schema_types()[0]:
        kwargs["stream"] = torch.accelerator.current_stream(int(ext_device[1])).stream_id
    producer_copied = True
    capsule = None
    for drop in (None, "max_version", "copy", "dl_device"):
        if drop is not None:
            kwargs.pop(drop, None)
            producer_copied = producer_copied and drop != "copy"
        try:
            capsule = ext_tensor.__dlpack__(**kwargs)
            break
        except TypeError:
            if drop == "dl_device":
                raise
    tensor = _import(capsule)
    if copy is True and not producer_copied and not cross_device:
        tensor = tensor.clone()
    if cross_device:
        tensor = tensor.to(device)
    return tensor


def install() -> None:
    """Replaces PyTorch's DLPack functions with the backend's (Note [DLPack
    by tensor]); once per process."""
    if getattr(torch.Tensor.__dlpack__, "_accelkit_backend", None) is not None:
        return
    _original.update(__dlpack__=torch.Tensor.__dlpack__,
                     __dlpack_device__=torch.Tensor.__dlpack_device__,
                     from_dlpack=_torch_dlpack.from_dlpack, to_dlpack=_torch_dlpack.to_dlpack)
    wrapped = {"__dlpack__": _dlpack, "__dlpack_device__": _dlpack_device,
               "from_dlpack": _from_dlpack, "to_dlpack": _to_dlpack}
    for key, fn in wrapped.items():
        functools.update_wrapper(fn, _original[key])
        fn._accelkit_backend = _backend.name
    torch.Tensor.__dlpack__ = _dlpack
    torch.Tensor.__dlpack_device__ = _dlpack_device
    torch.from_dlpack = _torch_dlpack.from_dlpack = _from_dlpack
    torch.to_dlpack = _torch_dlpack.to_dlpack = _to_dlpack
