"""The backend this process installed (PyTorch has one PrivateUse1 slot, so
there is at most one): its name and its operators, for the device module."""
import torch

name = None  # "simdev", set by accelkit.install
ops = None   # torch.ops.<name>


def index(device, *, optional=False) -> int:
    """A device argument (None, an index, "<name>:1", a torch.device) as a
    valid index: the current device for None or a device without an index;
    IndexError for an index out of range, ValueError for another device
    type (each naming the backend). `optional=False` refuses None, as
    torch.cuda's functions that need a device do."""
    if device is None:
        if not optional:
            raise ValueError(f"{name}: expected a device, got None")
        return torch.accelerator.current_device_index()
    if isinstance(device, bool) or not isinstance(device, (int, str, torch.device)):
        raise ValueError(f"{name}: expected a device (an index, '{name}:N' or a "
                         f"torch.device), got {device!r}")
    if isinstance(device, int):
        idx = device
    else:
        d = torch.device(device)
        if d.type != name:
            raise ValueError(f"{name}: expected a {name} device, got {d}")
        if d.index is None:
            return torch.accelerator.current_device_index()
        idx = d.index
    ops.check_device(idx)  # IndexError naming the backend, the index and the count
    return idx


def index_or_current(device) -> int:
    """index(), but -1 for the current device (None, or a device without an
    index), which the backend's operators resolve without initializing it."""
    if device is None or (isinstance(device, (str, torch.device))
                          and torch.device(device).type == name
                          and torch.device(device).index is None):
        return -1
    return index(device)
