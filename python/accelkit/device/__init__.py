"""torch.<name>: the device module of the backend this process installed
(accelkit.install), with torch.cuda's names and semantics wherever they are
not CUDA's own (tests/python/test_device_module.py lists the
exceptions and why).

Nothing here initializes the backend unless it says so: is_available,
device_count and the generators' functions never do.
"""
import json

import torch

from .. import _backend
from . import amp, graphs, memory, random, streams  # noqa: F401  (torch.<name>.amp, ...)
from .graphs import *  # noqa: F401,F403
from .memory import *  # noqa: F401,F403
from .random import *  # noqa: F401,F403
from ._legacy_storage import *  # noqa: F401,F403  (FloatStorage & co.: Note [Legacy storage classes])
from .streams import *  # noqa: F401,F403


def is_available() -> bool:
    """Whether a device is visible. Never raises, creates no context."""
    return _backend.ops.device_count() > 0


def device_count() -> int:
    """The number of visible devices. Never raises, creates no context."""
    return _backend.ops.device_count()


def init_error() -> str:
    """Why device_count() is 0 (empty when discovery succeeded)."""
    return _backend.ops.init_error()


def is_initialized() -> bool:
    """Whether the backend has been initialized (by init or a first use)."""
    return _backend.ops.is_initialized()


def init() -> None:
    """Initializes the backend now rather than at its first use (a
    RuntimeError naming the reason if it cannot be)."""
    _backend.ops.init()


def _is_in_bad_fork() -> bool:
    """True in a child forked after the backend was initialized (device use
    raises there); torch.manual_seed asks it before seeding the devices."""
    return _backend.ops.in_bad_fork()


def __getattr__(attr):
    # Module attributes that follow the backend's state, as torch.cuda's:
    # torch.utils.checkpoint saves the devices' RNG states only when
    # `_initialized` is true.
    if attr == "_initialized":
        return _backend.ops.is_initialized()
    if attr == "default_generators":
        return tuple(_backend.ops.default_generator(i) for i in range(device_count()))
    raise AttributeError(f"module 'torch.{_backend.name}' has no attribute {attr!r}")


def current_device() -> int:
    """The index of the current device of this thread."""
    return torch.accelerator.current_device_index()


def set_device(device) -> None:
    """Makes a device current for this thread (a negative index changes nothing)."""
    if isinstance(device, int) and not isinstance(device, bool) and device < 0:
        return
    torch.accelerator.set_device_index(_backend.index(device))


def synchronize(device=None) -> None:
    """Waits for all work queued on a device (the current one by default)."""
    torch.accelerator.synchronize(_backend.index(device, optional=True))


class device:  # noqa: N801 (torch.cuda.device)
    """Context manager that makes a device current: ``with torch.<name>.device(1):``.
    None and -1 change nothing."""

    def __init__(self, device):
        negative = isinstance(device, int) and not isinstance(device, bool) and device < 0
        self.idx = None if device is None or negative else _backend.index(device)
        self.prev_idx = None

    def __enter__(self):
        if self.idx is not None:
            self.prev_idx = current_device()
            if self.prev_idx != self.idx:
                set_device(self.idx)
        return self

    def __exit__(self, *exc):
        if self.prev_idx is not None and self.prev_idx != self.idx:
            set_device(self.prev_idx)
        return False


class device_of(device):  # noqa: N801 (torch.cuda.device_of)
    """Makes the device of a tensor or storage current (nothing for one of
    another device type)."""

    def __init__(self, obj):
        on_device = obj.device.type == _backend.name
        super().__init__(obj.device if on_device else None)


class _DeviceProperties(dict):
    """A device's capability schema, as in the report. Its keys are also
    attributes (``props.total_memory``), as torch.cuda's properties are."""

    def __getattr__(self, key):
        try:
            return self[key]
        except KeyError:
            raise AttributeError(f"{_backend.name} device properties have no {key!r}") from None


def get_device_properties(device=None) -> _DeviceProperties:
    """The capability schema of a device. RuntimeError when it cannot be read
    (in a child forked after the backend was initialized, as with CUDA)."""
    index = _backend.index(device, optional=True)
    entry = json.loads(_backend.ops.report_json())["devices"][index]
    if entry.get("error"):
        raise RuntimeError(entry["error"])
    return _DeviceProperties(entry)


def get_device_name(device=None) -> str:
    """The name of a device (the current one by default)."""
    return get_device_properties(device)["name"]


def get_device_capability(device=None) -> dict:
    """What a device can do, as torch.accelerator.get_device_capability
    reports it ({"supported_dtypes": {...}}): compute capability numbers
    (major, minor) are CUDA's own and have no meaning here."""
    return torch.accelerator.get_device_capability(
        torch.device(_backend.name, _backend.index(device, optional=True)))


def can_device_access_peer(device, peer_device) -> bool:
    """Whether `device` can reach `peer_device`'s memory directly."""
    return _backend.ops.can_access_peer(_backend.index(device, optional=True),
                                        _backend.index(peer_device))


def supported_dtypes(device=None) -> list:
    """The dtypes with native kernels, from the capability schema."""
    return list(get_device_properties(device)["dtypes"])


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """Whether the current device's capability schema reports bfloat16."""
    return "bfloat16" in get_device_properties()["dtypes"]


def get_amp_supported_dtype() -> list:
    """The lower-precision dtypes autocast may use on the current device:
    float16 and bfloat16 where its capability schema reports them."""
    if device_count() == 0:
        return []
    dtypes = get_device_properties()["dtypes"]
    return [d for d in (torch.float16, torch.bfloat16) if str(d).split(".")[1] in dtypes]


def ipc_collect() -> None:
    """Frees the device memory this process sent to other processes that
    every receiver has released, as torch.cuda.ipc_collect (it is also
    freed at each send and before the allocator reports out of memory)."""
    _backend.ops.ipc_collect()


def report() -> str:
    """The device and capability report (text)."""
    return _backend.ops.report_text()


def fallback_report() -> list:
    """Operators that ran through the CPU fallback: (op, count, total ms), most time first."""
    rows = []
    for line in _backend.ops.fallback_report().splitlines():
        op, count, ms = line.rsplit(" ", 2)
        rows.append((op, int(count), float(ms)))
    return rows


def reset_fallback_report() -> None:
    """Zeroes the fallback report's counts."""
    _backend.ops.reset_fallback_report()
