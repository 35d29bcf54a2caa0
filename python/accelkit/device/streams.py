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

    def wait_event(self, event) -> None:
        """Work queued on this stream later waits for `event`'s record."""
        if getattr(event, "_ipc", None) is not None:
            return event.wait(self)
        return super().wait_event(event)

    def record_event(self, event=None):
        """Records `event` (a new one for None) on this stream; returns it."""
        if getattr(event, "_ipc", None) is not None:
            event.record(self)
            return event
        return super().record_event(event)

    @classmethod
    def _of(cls, s: torch.Stream) -> "Stream":
        return cls(stream_id=s.stream_id, device_index=s.device_index, device_type=s.device_type)


class Event(torch.Event):
    """An event of the backend, as torch.cuda.Event: `enable_timing` for
    elapsed_time, `blocking` for a synchronize() that sleeps rather than
    spins, `interprocess` for an event another process can wait for
    (ipc_handle(), Event.from_ipc_handle; never with timing). External
    (graph) events are not supported."""

    def __new__(cls, enable_timing: bool = False, blocking: bool = False,
                interprocess: bool = False, external: bool = False):
        if external:
            raise ValueError(f"{_backend.name}: external events (of graph capture) are not "
                             "supported (external=True)")
        if interprocess and enable_timing:
            raise ValueError(f"{_backend.name}: an interprocess event cannot time "
                             "(interprocess=True with enable_timing=True)")
        self = super().__new__(cls, device=_backend.name, enable_timing=enable_timing,
                               blocking=blocking)
        self._ipc = None
        if interprocess:
            if not _backend.ops.ipc_has_events():
                raise RuntimeError(f"{_backend.name}: events cannot be shared between processes: "
                                   f"{_backend.name}'s runtime has no inter-process event members "
                                   "(interprocess=True)")
            device = _backend.index(None, optional=True)
            self._ipc = _IpcEvent(_backend.ops.ipc_event_create(device), device)
        return self

    @classmethod
    def from_ipc_handle(cls, device, handle: bytes) -> "Event":
        """The event of another process that `handle` (its ipc_handle())
        names, on `device`: wait, query and synchronize follow that
        process's last record; it cannot be recorded here."""
        if not isinstance(handle, (bytes, bytearray)):
            raise TypeError(f"{_backend.name}: from_ipc_handle expects the bytes of "
                            f"ipc_handle(), got {type(handle).__name__}")
        index = _backend.index(device, optional=True)
        self = super().__new__(cls, device=_backend.name)
        self._ipc = _IpcEvent(_backend.ops.ipc_event_open(index, bytes(handle).hex()), index)
        return self

    def ipc_handle(self) -> bytes:
        """The bytes that name this event to another process
        (Event.from_ipc_handle there). The event must have been made with
        interprocess=True."""
        if self._ipc_event() is None:
            raise RuntimeError(f"{_backend.name}: ipc_handle() needs an event made with "
                               "interprocess=True")
        return bytes.fromhex(_backend.ops.ipc_event_handle(self._ipc.id))

    @property
    def device(self):
        if self._ipc_event() is not None:
            return torch.device(_backend.name, self._ipc.device)
        return super().device

    def record(self, stream=None) -> None:
        if self._ipc_event() is None:
            return super().record(stream) if stream is not None else super().record()
        _backend.ops.ipc_event_record(self._ipc.id, self._stream(stream))

    def wait(self, stream=None) -> None:
        if self._ipc_event() is None:
            return super().wait(stream) if stream is not None else super().wait()
        _backend.ops.ipc_event_wait(self._ipc.id, self._stream(stream))

    def query(self) -> bool:
        if self._ipc_event() is None:
            return super().query()
        return _backend.ops.ipc_event_query(self._ipc.id)

    def synchronize(self) -> None:
        if self._ipc_event() is None:
            return super().synchronize()
        _backend.ops.ipc_event_synchronize(self._ipc.id)

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
        if self._ipc_event() is not None or getattr(end_event, "_ipc", None) is not None:
            raise ValueError(f"{_backend.name}: elapsed_time needs events created with "
                             "enable_timing (not interprocess ones)")
        return _backend.ops.event_elapsed_time(self.event_id, end_event.event_id)

    def _ipc_event(self):
        return getattr(self, "_ipc", None)

    def _stream(self, stream):
        if stream is None:
            return torch.accelerator.current_stream(self._ipc.device)
        return stream


class _IpcEvent:
    """The backend's inter-process event behind an Event, by id; destroyed
    with it."""

    __slots__ = ("id", "device", "_destroy")

    def __init__(self, id: int, device: int):
        self.id = id
        self.device = device
        # Kept: the module may be gone when this is collected at exit.
        self._destroy = _backend.ops.ipc_event_destroy

    def __del__(self):
        try:
            self._destroy(self.id)
        except Exception:  # at interpreter exit
            pass


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
