"""torch.<name>.streams: streams and events as torch.cuda's (classes derived
from torch.Stream and torch.Event, so torch.accelerator takes them), and the
current-stream functions."""
from typing import Any

import torch

from .. import _backend

__all__ = ["Stream", "Event", "StreamContext", "stream", "current_stream", "default_stream",
           "set_stream"]


class Stream(torch.Stream):
    """A stream of a device (the current one for device=None), from the
    backend's pool. `priority`: 0 is the default, negative numbers are more
    urgent (see the capability schema's stream_priorities)."""

    def __new__(cls, device=None, priority: int = 0, **kwargs):
        if "stream_id" in kwargs:  # an existing stream, by its ids
            return super().__new__(cls, priority=priority, **kwargs)
        if kwargs:
            raise TypeError(f"{_backend.name}: Stream() got unexpected arguments {sorted(kwargs)}")
        index = _backend.index(device, optional=True)
        return super().__new__(cls, device=torch.device(_backend.name, index), priority=priority)

    @classmethod
    def _of(cls, s: torch.Stream) -> "Stream":
        return cls(stream_id=s.stream_id, device_index=s.device_index, device_type=s.device_type)


class Event(torch.Event):
    """An event of the backend, as torch.cuda.Event: `enable_timing` for
    elapsed_time, `blocking` for a synchronize() that sleeps rather than
    spins. Inter-process and external (graph) events are not supported."""

    def __new__(cls, enable_timing: bool = False, blocking: bool = False,
                interprocess: bool = False, external: bool = False):
        if interprocess:
            raise ValueError(f"{_backend.name}: events cannot be shared between processes "
                             "(interprocess=True)")
        if external:
            raise ValueError(f"{_backend.name}: external events (of graph capture) are not "
                             "supported (external=True)")
        return super().__new__(cls, device=_backend.name, enable_timing=enable_timing,
                               blocking=blocking)

    def elapsed_time(self, end_event) -> float:
        """Milliseconds from this event to `end_event`, both recorded (and
        created with enable_timing). torch.Event.elapsed_time accepts only
        an exact torch.Event as its argument, so this class times itself."""
        if not isinstance(end_event, torch.Event):
            raise TypeError(f"{_backend.name}: elapsed_time expects an event, got "
                            f"{type(end_event).__name__}")
        if end_event.device.type != _backend.name:
            raise ValueError(f"{_backend.name}: elapsed_time between events of two backends "
                             f"({_backend.name} and {end_event.device.type})")
        return _backend.ops.event_elapsed_time(self.event_id, end_event.event_id)


def current_stream(device=None) -> Stream:
    """The current stream of a device (the current device by default)."""
    return Stream._of(torch.accelerator.current_stream(_backend.index(device, optional=True)))


def default_stream(device=None) -> Stream:
    """The default stream of a device (the current device by default)."""
    return Stream._of(_backend.ops.default_stream(_backend.index(device, optional=True)))


def set_stream(stream) -> None:
    """Makes `stream` current on its device (a no-op for None)."""
    if stream is not None:
        torch.accelerator.set_stream(stream)


class StreamContext:
    """Makes `stream` current on its device for the length of a `with`
    block, and restores the previous current streams (of the current
    device and of the stream's device) afterwards. None changes nothing."""

    def __init__(self, stream):
        self.stream = stream
        self.src_prev_stream = None
        self.dst_prev_stream = None

    def __enter__(self):
        if self.stream is None:
            return None
        self.src_prev_stream = current_stream()
        if self.src_prev_stream.device != self.stream.device:
            self.dst_prev_stream = current_stream(self.stream.device)
        set_stream(self.stream)
        return self.stream

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        if self.stream is None:
            return False
        if self.dst_prev_stream is not None:
            set_stream(self.dst_prev_stream)
        set_stream(self.src_prev_stream)
        return False


def stream(stream) -> StreamContext:
    """`with torch.<name>.stream(s):` runs the block's work on `s`."""
    return StreamContext(stream)
