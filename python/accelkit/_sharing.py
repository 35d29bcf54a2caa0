"""Device tensors and storages on torch.multiprocessing queues and pipes.

PyTorch pickles what is put on a ``torch.multiprocessing`` queue through
reducers that know CPU and CUDA memory only. This module registers reducers
for the backend's tensors, Parameters, UntypedStorages and TypedStorages:
they arrive in the other process (spawn or fork) as views of the same device
memory, as CUDA's do (Note [Sharing device memory between processes] in
accelkit/torch/ipc.hpp says how, and how long the memory lives).

A backend whose runtime has no inter-process memory members cannot share:
its reducers send a marker whose unpickling raises, so that the receiver's
``get()`` fails at once with a RuntimeError naming the backend and the
tensor, and what to do instead (a reducer that raised would leave the
receiver waiting forever: the queue's feeder thread only prints it). Memory
that cannot be shared (an expandable segment's, memory received from
another process) is refused the same way, with the reason.
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


def _can_share() -> bool:
    return _backend.ops.ipc_has_memory()


def _refused(message: str):
    raise RuntimeError(message)


def _share_or_refuse(storage):
    """(True, what _share returns), or (False, a marker that raises the
    reason in the receiver)."""
    try:
        return True, _share(storage)
    except RuntimeError as e:
        return False, (_refused, (str(e).split("\nException raised from")[0],))


def _cache_key(meta):
    # (device, handle, segment size, offset, bytes, pid, fd, slot, event):
    # the sender's segment and the storage's place in it, as CUDA keys
    # torch.multiprocessing's shared_cache by (handle, offset).
    return (_backend.name, meta[5], meta[0], meta[1], meta[3])


def _share(storage):
    """What another process needs to open `storage` (a send: the memory is
    kept until that process released it)."""
    whole = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
    meta = tuple(_backend.ops.ipc_share(whole))
    # A send to this process itself finds the storage here (as CUDA's).
    _reductions.shared_cache[_cache_key(meta)] = _reductions.StorageWeakRef(storage)
    return meta


def _open(meta):
    """The storage `meta` (from _share) names: the one this process already
    holds over that memory, or the memory opened."""
    key = _cache_key(meta)
    storage = _reductions.storage_from_cache(torch.UntypedStorage, key)
    if storage is not None:
        _backend.ops.ipc_take_pending(*meta)  # orders and counts this send too
        return storage
    storage = _backend.ops.ipc_open(*meta).untyped_storage()
    _reductions.shared_cache[key] = _reductions.StorageWeakRef(storage)
    return storage


def _empty_storage(device: int):
    return torch.UntypedStorage(0, device=torch.device(_backend.name, device))


def _rebuild_tensor(cls, dtype, device, meta, offset, size, stride, requires_grad):
    storage = _empty_storage(device) if meta is None else _open(meta)
    t = torch._utils._rebuild_tensor(
        torch.TypedStorage(wrap_storage=storage, dtype=dtype, _internal=True),
        offset, size, stride)
    if cls is torch.nn.parameter.Parameter:
        # In the constructor: integer Parameters refuse requires_grad=True later.
        return torch.nn.parameter.Parameter(t, requires_grad=requires_grad)
    t.requires_grad = requires_grad
    return t


def _reduce_tensor(tensor):
    if tensor.device.type != _backend.name:
        return _reductions.reduce_tensor(tensor)
    if not _can_share():
        return (_unshareable, (f"a {_backend.name} tensor ({tensor.device}, {tensor.dtype}, "
                               f"shape {tuple(tensor.shape)})",))
    if tensor.layout != torch.strided:
        # Sparse layouts send their strided parts through this reducer.
        return _reductions.reduce_tensor(tensor)
    if tensor.requires_grad and not tensor.is_leaf:
        raise RuntimeError(
            f"{_backend.name}: cowardly refusing to serialize a non-leaf tensor which "
            "requires_grad, since autograd does not support crossing process boundaries. "
            "If you just want to transfer the data, call detach() on the tensor before "
            "serializing (e.g., putting it on the queue).")
    torch.utils.hooks.warn_if_has_hooks(tensor)
    storage = tensor.untyped_storage()
    meta = None
    if storage.nbytes() > 0:
        ok, meta = _share_or_refuse(storage)
        if not ok:
            return meta
    return (_rebuild_tensor, (type(tensor), tensor.dtype, tensor.device.index, meta,
                              tensor.storage_offset(), tuple(tensor.size()), tensor.stride(),
                              tensor.requires_grad))


def _rebuild_storage(device, meta):
    return _empty_storage(device) if meta is None else _open(meta)


def _reduce_storage(storage):
    if storage.device.type != _backend.name:
        return _reductions.reduce_storage(storage)
    if not _can_share():
        return (_unshareable, (f"a {_backend.name} storage ({storage.device}, "
                               f"{storage.nbytes()} bytes)",))
    meta = None
    if storage.nbytes() > 0:
        ok, meta = _share_or_refuse(storage)
        if not ok:
            return meta
    return (_rebuild_storage, (storage.device.index, meta))


def _reduce_typed_storage(storage):
    device = storage._untyped_storage.device  # TypedStorage.device warns (deprecated)
    if device.type != _backend.name:
        return _reductions.reduce_typed_storage(storage)
    if not _can_share():
        return (_unshareable, (f"a {_backend.name} storage ({device}, {storage.dtype})",))
    # Its untyped storage goes through _reduce_storage.
    return _reductions.reduce_typed_storage(storage)


def _rebuild_event(device, handle):
    from .device.streams import Event
    return Event.from_ipc_handle(device, handle)


def _reduce_event(event):
    return (_rebuild_event, (event.device.index, event.ipc_handle()))


def register() -> None:
    """Replaces the reducers importing torch.multiprocessing registered."""
    for t in torch._tensor_classes:
        ForkingPickler.register(t, _reduce_tensor)
    ForkingPickler.register(torch.Tensor, _reduce_tensor)
    ForkingPickler.register(torch.nn.parameter.Parameter, _reduce_tensor)
    ForkingPickler.register(torch.UntypedStorage, _reduce_storage)
    ForkingPickler.register(torch.TypedStorage, _reduce_typed_storage)
    from .device.streams import Event
    ForkingPickler.register(Event, _reduce_event)
