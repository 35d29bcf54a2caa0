"""simdev tensors on torch.multiprocessing queues: a clear error, never a hang.

PyTorch pickles a tensor put on a ``torch.multiprocessing`` queue in the
queue's feeder thread, through reducers that know CPU and CUDA memory only:
for any other device the reducer raises there, the feeder thread prints the
error, and the receiver waits forever. simdev has no inter-process memory
handles, so its tensors (and storages) cannot be shared; their reducer
instead sends a marker whose unpickling raises, so that the receiver's
``get()`` fails at once with a RuntimeError naming the backend and the
tensor, and what to do instead.
"""
from multiprocessing.reduction import ForkingPickler

import torch
import torch.multiprocessing.reductions as _reductions

_DEVICE = "simdev"


def _unshareable(what: str):
    raise RuntimeError(
        f"{_DEVICE}: {what} cannot be shared between processes: {_DEVICE} has no "
        "inter-process memory handles. Move it to the CPU first (tensor.cpu()) and "
        "back to the device in the receiving process."
    )


def _reduce_tensor(tensor):
    if tensor.device.type == _DEVICE:
        return (_unshareable, (f"a {_DEVICE} tensor ({tensor.device}, {tensor.dtype}, "
                               f"shape {tuple(tensor.shape)})",))
    return _reductions.reduce_tensor(tensor)


def _reduce_storage(storage):
    if storage.device.type == _DEVICE:
        return (_unshareable, (f"a {_DEVICE} storage ({storage.device}, {storage.nbytes()} bytes)",))
    return _reductions.reduce_storage(storage)


def _reduce_typed_storage(storage):
    if storage.device.type == _DEVICE:
        return (_unshareable, (f"a {_DEVICE} storage ({storage.device}, {storage.dtype})",))
    return _reductions.reduce_typed_storage(storage)


# Importing torch.multiprocessing registered PyTorch's reducers; these replace them.
for _t in torch._tensor_classes:
    ForkingPickler.register(_t, _reduce_tensor)
ForkingPickler.register(torch.Tensor, _reduce_tensor)
ForkingPickler.register(torch.nn.parameter.Parameter, _reduce_tensor)
ForkingPickler.register(torch.UntypedStorage, _reduce_storage)
ForkingPickler.register(torch.TypedStorage, _reduce_typed_storage)
