"""Dynamo's device interface for the installed backend, built from
torch.<name> with torch.cuda's semantics: current device and stream,
streams and events, synchronize, device count, availability, the capability
schema as properties, memory."""
import os

import torch

from .. import _backend

_interface = None  # the device interface class, once built


def _properties(device=None):
    """torch.<name>.get_device_properties, with the names Inductor reads of
    CUDA's properties (multi_processor_count, warp_size, major) filled in
    from the capability schema where it has them."""
    mod = getattr(torch, _backend.name)
    props = mod.get_device_properties(device)
    if "multi_processor_count" not in props:
        units = props.get("compute_units") or props.get("multi_processor_count")
        if not units or props.get("host_visible_memory"):
            # Inductor's C++ kernels run on the host's cores on host-visible
            # memory: its reduction splits should see those.
            units = units or os.cpu_count() or 1
        props["multi_processor_count"] = int(units)
    return props


def _compute_capability(device=None):
    """CUDA's interface answers major * 10 + minor; the capability schema has
    no such numbers. A backend whose schema reports `compute_capability` (or
    `major`/`minor`) gets it; otherwise the empty string, as the CPU's and
    MPS's interfaces answer."""
    props = getattr(torch, _backend.name).get_device_properties(device)
    if "compute_capability" in props:
        return props["compute_capability"]
    if "major" in props:
        return int(props["major"]) * 10 + int(props.get("minor", 0))
    return ""


def device_interface():
    """The Dynamo device interface of the installed backend (built once;
    torch._dynamo.device_interface must be importable, which importing it
    here does)."""
    global _interface
    if _interface is not None:
        return _interface
    from torch._dynamo.device_interface import DeviceInterface

    name = _backend.name
    mod = getattr(torch, name)

    def exchange(device: int) -> int:
        # torch.cuda._exchange_device: a negative index changes nothing and
        # answers -1; otherwise makes it current and answers the previous one.
        if device < 0:
            return -1
        prev = mod.current_device()
        if prev != device:
            mod.set_device(device)
        return prev

    class Worker:
        """Properties and the current device for Inductor's compile workers."""
        set_device = staticmethod(mod.set_device)
        current_device = staticmethod(mod.current_device)
        get_device_properties = staticmethod(_properties)

    class Interface(DeviceInterface):
        device = mod.device
        Event = mod.Event
        Stream = mod.Stream

        current_device = staticmethod(mod.current_device)
        set_device = staticmethod(mod.set_device)
        exchange_device = staticmethod(exchange)
        maybe_exchange_device = staticmethod(exchange)
        device_count = staticmethod(mod.device_count)
        is_available = staticmethod(mod.is_available)
        stream = staticmethod(mod.stream)
        current_stream = staticmethod(mod.current_stream)
        set_stream = staticmethod(mod.set_stream)
        synchronize = staticmethod(mod.synchronize)
        get_compute_capability = staticmethod(_compute_capability)
        is_bf16_supported = staticmethod(mod.is_bf16_supported)
        memory_allocated = staticmethod(mod.memory_allocated)

        @staticmethod
        def _set_stream_by_id(stream_id: int, device_index: int, device_type: int) -> None:
            torch.accelerator.set_stream(torch.Stream(
                stream_id=stream_id, device_index=device_index, device_type=device_type))

        @staticmethod
        def get_raw_stream(device_idx: int) -> int:
            # The current stream's id (c10's; CUDA answers its cudaStream_t):
            # what generated code hands a vendor's kernels.
            return torch.accelerator.current_stream(device_idx).stream_id

        @classmethod
        def get_device_properties(cls, device=None):
            return _properties(device)

        @classmethod
        def is_dtype_supported(cls, dtype: torch.dtype, including_emulation: bool = False) -> bool:
            return str(dtype).split(".")[1] in mod.get_device_properties()["dtypes"]

        @staticmethod
        def is_triton_capable(device=None) -> bool:
            return False

    Interface.Worker = Worker
    Interface.__name__ = Interface.__qualname__ = f"{name.capitalize()}Interface"
    _interface = Interface
    return Interface
