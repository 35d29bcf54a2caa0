"""The CPU tensors a collective hands gloo or the vendor's library for its
device tensors: views of host-visible device memory, or staged blocks of
pinned memory copied from and back to the device (Note [Collectives on
gloo])."""
import ctypes

import torch

from .signals import _sdk_stream


class _Host:
    """The CPU tensors one collective hands gloo (or the vendor's library)
    for its device tensors, the copies to them before (staged inputs) and
    back to the device after, and the event the start waits for (Note
    [Collectives on gloo]). Keeps the device tensors and the CPU tensors
    alive until the collective is done."""

    def __init__(self, pg, tensors, written=(), what=""):
        # Holds no reference to the group: the last one must not go on a
        # gloo thread, whose destructor would join itself (Note [No group
        # in the callbacks]).
        self.keep = list(tensors)
        # The CPU tensors handed out, kept (Note [Completion on a thread of
        # the group's own]).
        self.cpu = []
        self.fills = []  # (device tensor, CPU tensor) to copy to the host at the start
        self.back = []  # (device tensor, CPU tensor) to copy back
        devices = {t.device for t in tensors}
        if len(devices) > 1:
            raise ValueError(f"{pg.name}: a collective's tensors must be on one device, got "
                             f"tensors on {', '.join(sorted(str(d) for d in devices))}")
        self.device = devices.pop() if devices else torch.device("cpu")
        _refuse_overlap(pg.name, what, written)  # the results go back into them
        self.on_device = self.device.type == pg.name
        self.visible = self.on_device and pg.host_visible(self.device.index)

    def _view(self, t):
        """A CPU tensor over `t`'s memory that owns nothing (the device
        tensor stays alive in `keep`): no Python object behind it, so gloo's
        threads drop it without the GIL (Note [Completion on a thread of
        the group's own])."""
        n = t.numel() * t.element_size()
        if n == 0:
            return torch.empty(t.shape, dtype=t.dtype)
        make = getattr(torch._C, "_construct_storage_from_data_pointer", None)
        if make is None:  # an older PyTorch: a view through a Python buffer
            raw = (ctypes.c_char * n).from_address(t.data_ptr())
            return torch.frombuffer(raw, dtype=torch.uint8).view(t.dtype).view(t.shape)
        storage = make(t.data_ptr(), torch.device("cpu"), n)
        return torch.empty(0, dtype=t.dtype).set_(storage, 0, t.shape, t.stride())

    def get(self, t, *, read=True, write=True):
        """The CPU tensor gloo uses for `t`: `read` if gloo reads it, `write`
        if it writes the result there. Staged, it is filled at the start
        (stage), after the stream's work."""
        if not self.on_device:
            return t
        if self.visible and t.is_contiguous():
            cpu = self._view(t)
        else:
            cpu = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            if read:
                self.fills.append((t, cpu))
            if write:
                self.back.append((t, cpu))
        self.cpu.append(cpu)
        return cpu

    def _on_sdk_stream(self, copy):
        """Runs the blocking copies `copy()` on the SDK's own stream of the
        device, which no stream waiting for a collective holds up (a copy on
        the thread's current stream, the default stream, would wait behind
        a wait() queued there for this very collective: Note [wait() on the
        stream])."""
        stream = _sdk_stream(self.device)
        previous = torch.accelerator.current_stream(self.device) if stream is not None else None
        if stream is not None:
            torch.accelerator.set_stream(stream)
        try:
            copy()
            if stream is not None:
                stream.synchronize()
        finally:
            if previous is not None:
                torch.accelerator.set_stream(previous)

    def stage(self):
        """At the start, once the stream's work is done: the staged inputs
        from device memory (blocking copies)."""
        if not self.fills:
            return

        def copy():
            for t, buf in self.fills:
                buf.copy_(t)
        self._on_sdk_stream(copy)
        self.fills = []

    def finish(self):
        """After gloo: the results into device memory (blocking copies)."""
        if not self.back:
            return

        def copy():
            for t, buf in self.back:
                t.copy_(buf)
        self._on_sdk_stream(copy)
        self.back = []




def _refuse_overlap(name, what, tensors):
    """Refuses device tensors a collective writes whose elements share memory
    (an expanded tensor), in PyTorch's words: the results could not be
    written back."""
    for t in tensors:
        if t.device.type == name and torch._debug_has_internal_overlap(t) == 1:
            raise RuntimeError(
                f"{name}: {what}: unsupported operation: more than one element of the "
                f"written-to tensor refers to a single memory location (shape "
                f"{tuple(t.shape)}, strides {t.stride()}). Please clone() the tensor before "
                f"performing the operation.")



def _overlap(tensors, others):
    """Whether any of `tensors` shares memory with any of `others` (the
    bytes each spans in its storage)."""
    def span(t):
        if t.numel() == 0:
            return None
        start = t.storage_offset()
        end = start + sum((n - 1) * st for n, st in zip(t.shape, t.stride()) if n > 0) + 1
        return (t.untyped_storage().data_ptr(), start * t.element_size(), end * t.element_size())
    mine = [x for x in map(span, tensors) if x is not None]
    theirs = [x for x in map(span, others) if x is not None]
    return any(a[0] == b[0] and a[1] < b[2] and b[1] < a[2] for a in mine for b in theirs)

