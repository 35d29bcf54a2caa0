"""Device tensors on torch.multiprocessing queues: a clear error, never a hang.

PyTorch pickles a tensor put on a ``torch.multiprocessing`` queue in the
queue's feeder thread, through reducers that know CPU and CUDA memory only:
for any other device the reducer raises there, the feeder thread prints the
error, and the receiver waits forever. A backend made with accelkit has no
inter-process memory handles, so its tensors (and storages) cannot be
shared; their reducer instead sends a marker whose unpickling raises, so
that the receiver's ``get()`` fails at once with a RuntimeError naming the
backend and the tensor, and what to do instead.
"""
from multiprocessing.reduction import ForkingPickler

import torch
import torch.multiprocessing.reductions as _reductions

from . import _backend


def _unshareable(what: str):
    name = _backend.name
    raise RuntimeError(
        f"{name}: {what} cannot be shared between processes: {name} has no "
        "inter-process memory handles. Move it to the CPU first (tensor.cpu()) and "
        "back to the device in the receiving process."
    )


def _reduce_tensor(tensor):
    if tensor.device.type == _backend.name:
        return (_unshareable, (f"a {_backend.name} tensor ({tensor.device}, {tensor.dtype}, "
                               f"shape {tuple(tensor.shape)})",))
    return _reductions.reduce_tensor(tensor)


def _reduce_storage(storage):
    if storage.device.type == _backend.name:
        return (_unshareable, (f"a {_backend.name} storage ({storage.device}, "
                               f"{storage.nbytes()} bytes)",))
    return _reductions.reduce_storage(storage)


def _reduce_typed_storage(storage):
    if storage.device.type == _backend.name:
        return (_unshareable, (f"a {_backend.name} storage ({storage.device}, {storage.dtype})",))
    return _reductions.reduce_typed_storage(storage)


def register() -> None:
    """Replaces the reducers importing torch.multiprocessing registered."""
    for t in torch._tensor_classes:
        ForkingPickler.register(t, _reduce_tensor)
    ForkingPickler.register(torch.Tensor, _reduce_tensor)
    ForkingPickler.register(torch.nn.parameter.Parameter, _reduce_tensor)
    ForkingPickler.register(torch.UntypedStorage, _reduce_storage)
    ForkingPickler.register(torch.TypedStorage, _reduce_typed_storage)
