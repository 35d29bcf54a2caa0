"""torch.simdev: the device module, with the names torch.cuda users know."""
import json

import torch

_ops = torch.ops.simdev


def is_available() -> bool:
    """Whether a simdev device is visible. Never raises, creates no context."""
    return _ops.device_count() > 0


def device_count() -> int:
    return _ops.device_count()


def init_error() -> str:
    """Why device_count() is 0 (empty when discovery succeeded)."""
    return _ops.init_error()


def is_initialized() -> bool:
    return _ops.is_initialized()


def _is_in_bad_fork() -> bool:
    """True in a child forked after simdev was initialized (device use raises there)."""
    return _ops.in_bad_fork()


def _seed64(seed) -> int:
    """A seed as PyTorch takes it (any int, kept modulo 2**64), in the signed
    64-bit form the backend's operators carry."""
    seed = int(seed) & 0xFFFF_FFFF_FFFF_FFFF
    return seed - (1 << 64) if seed >= (1 << 63) else seed


def manual_seed_all(seed: int) -> None:
    """Seeds the default generator of every simdev device (torch.manual_seed
    does too). Random operators on simdev draw from their device's generator."""
    _ops.manual_seed_all(_seed64(seed))


def manual_seed(seed: int) -> None:
    """Seeds the current simdev device's default generator."""
    _ops.manual_seed(-1, _seed64(seed))


def initial_seed(device=None) -> int:
    """The seed of a device's default generator (the current device's by default)."""
    return _ops.initial_seed(_index(device)) & 0xFFFF_FFFF_FFFF_FFFF


def get_rng_state(device="simdev") -> torch.Tensor:
    """The state of a device's default generator, as a ByteTensor."""
    return _ops.get_rng_state(_index(device))


def set_rng_state(new_state: torch.Tensor, device="simdev") -> None:
    """Restores a state from get_rng_state into a device's default generator."""
    _ops.set_rng_state(_index(device), new_state)


def current_device() -> int:
    return torch.accelerator.current_device_index()


def set_device(device) -> None:
    torch.accelerator.set_device_index(_index(device))


def synchronize(device=None) -> None:
    torch.accelerator.synchronize(_index(device))


class device:
    """Context manager that makes a simdev device current: ``with torch.simdev.device(1):``."""

    def __init__(self, device):
        # None and -1 change nothing, as with torch.cuda.device.
        self.index = _index(device) if device is not None and device != -1 else None
        self.previous = None

    def __enter__(self):
        if self.index is not None:
            self.previous = current_device()
            set_device(self.index)
        return self

    def __exit__(self, *exc):
        if self.previous is not None:
            set_device(self.previous)
        return False


class stream:
    """Context manager that makes a stream current on its device."""

    def __init__(self, stream):
        self.stream = stream
        self.previous = None

    def __enter__(self):
        if self.stream is not None:
            self.previous = torch.accelerator.current_stream(self.stream.device_index)
            torch.accelerator.set_stream(self.stream)
        return self.stream

    def __exit__(self, *exc):
        if self.previous is not None:
            torch.accelerator.set_stream(self.previous)
        return False


def Stream(device=None, priority: int = 0) -> torch.Stream:  # noqa: N802 (torch.cuda.Stream)
    return torch.Stream(device=torch.device("simdev", _index(device)), priority=priority)


def Event(enable_timing: bool = False, blocking: bool = False) -> torch.Event:  # noqa: N802
    return torch.Event(device="simdev", enable_timing=enable_timing, blocking=blocking)


def is_bf16_supported() -> bool:
    return "bfloat16" in get_device_properties()["dtypes"]


def supported_dtypes(device=None) -> list:
    """The dtypes with native kernels, from the capability schema."""
    return list(get_device_properties(device)["dtypes"])


def current_stream(device=None) -> torch.Stream:
    return torch.accelerator.current_stream(_index(device))


def set_stream(stream: torch.Stream) -> None:
    torch.accelerator.set_stream(stream)


def memory_allocated(device=None) -> int:
    return torch.accelerator.memory_allocated(_index(device))


def max_memory_allocated(device=None) -> int:
    return torch.accelerator.max_memory_allocated(_index(device))


def memory_reserved(device=None) -> int:
    return torch.accelerator.memory_reserved(_index(device))


def memory_stats(device=None) -> dict:
    return json.loads(_ops.memory_stats_json(_index(device)))


def memory_snapshot(device=None) -> dict:
    return json.loads(_ops.memory_snapshot_json(_index(device)))


def empty_cache() -> None:
    torch.accelerator.empty_cache()


def reset_peak_memory_stats(device=None) -> None:
    torch.accelerator.reset_peak_memory_stats(_index(device))


def set_per_process_memory_fraction(fraction: float, device=None) -> None:
    _ops.set_memory_fraction(float(fraction), _index(device))


def mem_get_info(device=None):
    return torch.accelerator.get_memory_info(_index(device))


class _DeviceProperties(dict):
    """A device's capability schema, as in the report. Its keys are also
    attributes (``props.total_memory``), as torch.cuda's properties are."""

    def __getattr__(self, key):
        try:
            return self[key]
        except KeyError:
            raise AttributeError(f"simdev device properties have no {key!r}") from None


def get_device_properties(device=None) -> _DeviceProperties:
    """The capability schema of a device. RuntimeError when it cannot be read
    (in a child forked after simdev was initialized, as with CUDA)."""
    index = _index(device)
    entry = json.loads(_ops.report_json())["devices"][index]
    if entry.get("error"):
        raise RuntimeError(entry["error"])
    return _DeviceProperties(entry)


def get_device_name(device=None) -> str:
    return get_device_properties(device)["name"]


def report() -> str:
    """The device and capability report (text)."""
    return _ops.report_text()


def fallback_report() -> list:
    """Operators that ran through the CPU fallback: (op, count, total ms), most time first."""
    rows = []
    for line in _ops.fallback_report().splitlines():
        op, count, ms = line.rsplit(" ", 2)
        rows.append((op, int(count), float(ms)))
    return rows


def reset_fallback_report() -> None:
    _ops.reset_fallback_report()


def _index(device) -> int:
    """A device argument (None, an index, "simdev:1", a torch.device) as a
    valid index: IndexError for one out of range, ValueError for another
    device type."""
    if device is None:
        return torch.accelerator.current_device_index()
    if isinstance(device, int):
        index = device
    else:
        d = torch.device(device)
        if d.type != "simdev":
            raise ValueError(f"simdev: expected a simdev device, got {d}")
        if d.index is None:
            return torch.accelerator.current_device_index()
        index = d.index
    _ops.check_device(index)  # IndexError naming the backend and the valid range
    return index
