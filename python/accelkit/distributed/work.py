"""A collective in flight: the work c10d hands out, whose wait() makes the
current stream wait for the collective on the device (Note [wait() on the
stream])."""
import threading
import warnings

import torch

from .. import _backend
from .failures import _reason
from .signals import _SIGNAL_FAILED, _finish_signal, _signal_ops

_C10D = torch._C._distributed_c10d

# Note [wait() on the stream]
# Problem: c10d's wait() (and async_op=False) must order the work queued
# after it behind the collective; blocking the calling thread until the
# results are in device memory does that but stalls the host, which CUDA's
# NCCL does not.
# Decision: as on NCCL, wait() queues, on the current stream of the
# collective's device, a wait for a host signal (Note [Host signals]) that
# the work's completion completes once the results are in device memory,
# and returns. A failed collective completes its signals with an error: the
# waiting streams report it at every synchronize or query until the group
# is destroyed (Note [Failed waits]), it is reported as a RuntimeWarning,
# and it fails the group (Note [A failed group]). A work already complete
# needs no signal; its wait() raises its error. wait(timeout) blocks the
# calling thread until the results are in device memory, raising past the
# timeout; synchronize() queues the stream's wait without raising.
# Limits: where the stream cannot wait for the host (a runtime without the
# signal members, CPU tensors) or with pg.stream_wait = False
# (ACCELKIT_STREAM_WAIT=0), wait() blocks the calling thread. The completion
# runs Python, so a thread blocking on such a stream while holding the GIL
# would deadlock; the SDK's blocking waits release it (Note [Blocking waits
# release the GIL]).


class _Work(_C10D.Work):
    """A collective in flight (Note [wait() on the stream])."""
    def __init__(self, fut):
        super().__init__()
        self._fut = fut
        self._device = None  # set by _bind: the collective's device
        self._failures = None
        self._lock = threading.Lock()
        self._signals = []  # (device index, signal) that streams wait for
        self._settled = False  # _settle has run
        self._settled_event = threading.Event()
        self._hidden = False  # a wait() returned before the end
        fut.add_done_callback(self._settle)

    def _bind(self, device, failures, *, stream_wait=True):
        """The collective's device (None: CPU tensors, or `stream_wait` off:
        the group's choice) and the group's failures; before the work is
        handed out."""
        if (stream_wait and device is not None and device.type == _backend.name
                and _signal_ops() is not None):
            self._device = device
        self._failures = failures
        return self

    def _settle(self, fut):
        """On the thread that completed the future: fails the group on the
        collective's failure (Note [A failed group]) and completes the
        signals the streams wait for."""
        try:
            fut.value()
            error = None
        except Exception as e:  # noqa: BLE001  the collective's error
            error = e
        with self._lock:
            self._settled = True
            signals = self._signals
            self._signals = None
            hidden = self._hidden
        try:
            if error is not None and self._failures is not None:
                self._failures.fail(error)
            if error is not None and hidden:
                warnings.warn(f"{_backend.name}: a collective failed after its work's wait() "
                              f"had returned; the streams that wait for it report it at every "
                              f"synchronize until the group is destroyed: {error}",
                              RuntimeWarning, stacklevel=1)
        except Exception:  # noqa: BLE001  nothing may raise on the completion thread
            pass
        code = 0 if error is None else _SIGNAL_FAILED
        reason = "" if error is None else _reason(_backend.name, error)
        for index, signal in signals or ():
            _finish_signal(index, signal, code, reason, self._failures)
        self._settled_event.set()

    def _stream_wait(self):
        """Queues the current stream's wait for the collective; False when it
        has completed already (nothing queued)."""
        # Nothing that calls into torch (or allocates much: a garbage
        # collection there may run finalizers that wait for this very work)
        # runs under the lock, which _settle takes on the completion thread.
        if self._settled:
            return False
        ops = _signal_ops()
        index = self._device.index
        signal = ops.signal_create(index)
        try:
            ops.stream_wait_signal(torch.accelerator.current_stream(self._device), signal)
        except BaseException:
            _finish_signal(index, signal, 0)
            raise
        with self._lock:
            settled = self._settled
            if not settled:
                self._signals.append((index, signal))
                self._hidden = True
        if settled:  # completed meanwhile: nothing to wait for
            error = self.exception()
            _finish_signal(index, signal, 0 if error is None else _SIGNAL_FAILED,
                           "" if error is None else _reason(_backend.name, error),
                           self._failures)
            return False
        return True

    def _wait_host(self, timeout_s=None):
        """Blocks until the results are in device memory (and the signals
        completed); raises the collective's error, or past `timeout_s`."""
        # The completion (_settle, which hands a failure to the group) first.
        if not self._settled_event.wait(timeout_s):
            raise RuntimeError(f"{_backend.name}: the collective did not complete within the "
                               f"wait's timeout of {timeout_s:g} s")
        self._fut.wait()  # raises the collective's error
        return True

    def wait(self, timeout=None):
        seconds = timeout.total_seconds() if timeout is not None else 0
        if seconds > 0:  # asked: the calling thread waits (0 is c10d's "no timeout")
            return self._wait_host(seconds)
        if self._device is None or not self._stream_wait():
            return self._wait_host()
        return True

    def synchronize(self):
        if self._device is None:
            self._settled_event.wait()
        else:
            self._stream_wait()

    block_current_stream = synchronize

    def get_future(self):
        return self._fut

    def is_completed(self):
        return self._fut.done()

    def is_success(self):
        if not self._fut.done():
            return False
        try:
            self._fut.value()
        except Exception:
            return False
        return True

    def exception(self):
        if not self._fut.done():
            return None
        try:
            self._fut.value()
        except Exception as e:
            return e
        return None


def _all_of(works, result):
    """One work for `works` (allreduce_coalesced's), completing with `result`."""
    futs = [w.get_future() for w in works]

    def done(f):
        for g in f.value():
            g.value()
        return result
    return _Work(torch.futures.collect_all(futs).then(done))

