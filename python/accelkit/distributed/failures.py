"""The group's failure: recorded once, raised by every later call, and
published in the c10d store for the other ranks (Note [A failed group])."""
import threading

import torch.distributed as dist

from .signals import _destroy_signal

# Note [A failed group]
# Problem: a collective that fails on one rank may have been entered by the
# others (a rank whose staging failed never reaches gloo or the vendor's
# library while its peers wait there), and what a failed collective leaves
# behind (a peer's half-written slot, gloo's pending operation) must never
# be read as a later collective's data.
# Decision: as NCCL's communicator abort, the first failure of a collective
# the ranks agreed to run (its start, the staging, gloo's or the library's
# error, the copy back, or this rank's own error after the agreement) fails
# the group: every later call on this rank raises a DistBackendError quoting
# that failure until the group is destroyed and made again. The failed rank
# publishes its failure in the c10d store and takes part in no more
# exchanges; its peers learn it from the vendor's library (abort) or, on
# gloo, when their collective or next agreement meets the silent rank past
# the group's timeout, and then quote what it published. The streams that
# waited for a failed collective stay failed until the group is destroyed
# (Note [Failed waits]): the group keeps the failed signals until shutdown.
# Limits: a rank blocked inside gloo learns of a peer's failure only from
# gloo's own timeout; collectives without an agreement (gather, scatter,
# barrier, send, recv) fail on this rank only.


def _reason(name, error):
    """`error`'s text without a leading "<name>: " (the errors that quote it
    name the backend once)."""
    text = str(error)
    return text[len(name) + 2:] if text.startswith(f"{name}: ") else text


class _Failures:
    """The group's failure (Note [A failed group]). Shared by the group and
    its works, which hold no group (Note [No group in the callbacks])."""

    def __init__(self, name):
        self._name = name
        self._lock = threading.Lock()
        self._first = None
        self._signals = []  # (device index, signal) completed with the failure
        self._released = False  # the group was shut down: signals go at once
        self._on_fail = []  # called once with the first failure's text

    def on_fail(self, fn):
        self._on_fail.append(fn)

    def fail(self, error):
        """Records `error` as the group's failure, unless one is recorded."""
        with self._lock:
            if self._first is not None:
                return
            self._first = error
            callbacks = list(self._on_fail)
        for fn in callbacks:
            try:
                fn(_reason(self._name, error))
            except Exception:  # noqa: BLE001  (the failure is recorded; the rest is best effort)
                pass

    @property
    def error(self):
        return self._first

    def raised(self):
        """The error every later call raises, or None."""
        first = self._first
        if first is None:
            return None
        cls = getattr(dist, "DistBackendError", RuntimeError)
        e = cls(f"{self._name}: the process group failed in an earlier collective and refuses "
                f"every later one until it is destroyed (destroy_process_group) and made "
                f"again; the first failure: {_reason(self._name, first)}")
        e.__cause__ = first
        return e

    def check(self):
        e = self.raised()
        if e is not None:
            raise e

    def keep_signal(self, index, signal):
        with self._lock:
            if not self._released:
                self._signals.append((index, signal))
                return
        _destroy_signal(index, signal)  # a collective that ended after the shutdown

    def release(self):
        """The group's shutdown: the failed signals go, and with them their
        streams' failure."""
        with self._lock:
            signals, self._signals = self._signals, []
            self._released = True
        for index, signal in signals:
            _destroy_signal(index, signal)


class _Published:
    """The failures of the group's ranks in the c10d store (Note [A failed
    group]): this rank's, published once, and the others'. Holds no group
    (Note [No group in the callbacks])."""

    def __init__(self, store, rank, size):
        self._store = dist.PrefixStore("accelkit-failed/", store)
        self._rank, self._size = rank, size
        self._done = threading.Event()

    def publish(self, reason):
        """This rank's failure, once, from a thread of its own (a store
        whose server is gone would hold the caller up to its timeout)."""
        if self._done.is_set():
            return
        self._done.set()
        store, key = self._store, str(self._rank)

        def put():
            try:
                store.set(key, reason)
            except Exception:  # noqa: BLE001  (the others then quote none)
                pass
        threading.Thread(target=put, daemon=True, name="accelkit-publish").start()

    def others(self):
        """The failures other ranks published: [(rank, reason)]."""
        found = []
        for r in range(self._size):
            if r == self._rank:
                continue
            try:
                if self._store.check([str(r)]):
                    found.append((r, self._store.get(str(r)).decode(errors="replace")))
            except Exception:  # noqa: BLE001  (a store that fails names nothing)
                pass
        return found

    def quoted(self, name, error):
        """`error` (gloo's, meeting a silent peer) as the failure a peer
        published before, where one did."""
        found = self.others()
        if not found:
            return error
        r, reason = found[0]
        cls = getattr(dist, "DistBackendError", RuntimeError)
        return cls(f"{name}: the process group of rank {r} failed ({reason}); here: "
                   f"{_reason(name, error)}")



def _on_gloo_failed(name, what, e):
    """gloo's error `e` in `what` as the error the caller sees, naming the
    backend and the collective (a DistBackendError stays one)."""
    cls = dist.DistBackendError if isinstance(e, getattr(dist, "DistBackendError", ())) \
        else RuntimeError
    return cls(f"{name}: {what} on gloo failed: {e}")
