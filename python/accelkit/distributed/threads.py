"""The group's own threads: the completion thread, the start thread and the
vendor library's connection each run jobs in the order given (Note
[Completion on a thread of the group's own], Note [The start on the group's
thread])."""
import atexit
import collections
import queue
import threading
import time
import weakref

from .failures import _on_gloo_failed

# Note [Completion on a thread of the group's own]
# Problem: Python run on one of gloo's threads (a `then` callback on gloo's
# future), or the last reference to a tensor with a Python object dropped
# there, takes the GIL; while the interpreter finalizes, taking the GIL ends
# the thread, whose unwinding through gloo's noexcept frames calls
# std::terminate ("terminate called without an active exception" in DDP
# teardown).
# Decision: gloo's threads run no Python. A collective completes on a
# thread of the group's own (_Ordered), which waits for gloo's work with the
# GIL released, runs the copy back and sets the work's future. That thread
# keeps its last jobs (their gloo works and tensors) until later jobs
# replace them, and after its end in a module-level list (_graveyard), so
# gloo's thread, which drops its reference a while after completing the
# work, never holds the last one. The zero-copy views own no Python buffer
# (_Host._view). The thread is joined before the interpreter finalizes: by
# the group's shutdown (destroy_process_group) or at exit (_close_all).
# Limits: at exit the threads get _EXIT_JOIN_S in all; a job still waiting
# on a dead peer past that is left to the process's end.

# Note [No group in the callbacks]
# Problem: were the last reference to the group dropped on one of its own
# threads (destroy_process_group while a work is in flight or just done),
# the group's destructor would join that thread from itself ("Resource
# deadlock avoided").
# Decision: jobs, works, staging and failure records hold values, never the
# group.
# Limits: every closure handed to a thread of the group is written to keep
# that rule; nothing enforces it.


class _Ordered:
    """A thread of the group's own that runs jobs in the order given (Note
    [Completion on a thread of the group's own])."""

    _live = {}  # thread -> (its end, the join's timeout), until it ends
    _lock = threading.Lock()

    def __init__(self, name, on_exit=None, join_s=None):
        jobs = queue.SimpleQueue()
        self._jobs = jobs
        self._join_s = join_s
        self._thread = threading.Thread(target=_serve, args=(jobs, on_exit), daemon=True,
                                        name=name)
        self._finalizer = weakref.finalize(self, jobs.put, None)
        with _Ordered._lock:
            _Ordered._live[self._thread] = (self._finalizer, join_s)
        self._thread.start()

    def end(self):
        """Ends the thread once the queued jobs are done (not waiting)."""
        self._finalizer()

    def put(self, run, fut, result):
        """Completes `fut` with `result` once `run()` returned on this thread
        (or fails it with its exception); `fut` None: `run()` alone (it
        raises nothing)."""
        self._jobs.put((run, fut, result))

    def close(self):
        """Ends the thread once the queued jobs are done, and joins it."""
        self._finalizer()  # queues the end, once
        if self._thread is not threading.current_thread():
            self._thread.join(self._join_s)


_graveyard = collections.deque(maxlen=64)  # the last jobs of ended threads: _serve


# At exit, the group's threads get this long in all to finish their queued
# jobs: a job still waiting on a dead peer would otherwise hold the exit for
# up to twice the group's timeout (30 minutes by default).
_EXIT_JOIN_S = 10.0


def _close_all():
    with _Ordered._lock:
        live = list(_Ordered._live.items())
    deadline = time.monotonic() + _EXIT_JOIN_S
    for thread, (end, join_s) in live:
        end()
        thread.join(max(0.0, min(join_s, deadline - time.monotonic())))


atexit.register(_close_all)  # before the interpreter finalizes


def _serve(jobs, on_exit):
    """An _Ordered thread: holds no group (Note [No group in the callbacks]).
    Keeps the last jobs (their gloo work and tensors) a while, so that gloo's
    thread, which drops its reference just after completing the work, does
    not drop the last one (Note [Completion on a thread of the group's
    own])."""
    retired = collections.deque(maxlen=16)
    while True:
        job = jobs.get()
        if job is None:
            break
        run, fut, result = job
        try:
            run()
        except Exception as e:  # handed to the waiter of the work
            if fut is not None:
                fut.set_exception(e)
        else:
            if fut is not None:
                fut.set_result(result)
        retired.append(job)
        del job, run, fut, result
    # Not dropped here either: gloo's thread may not have dropped its
    # reference to the last works yet (under load, a while); kept until
    # later threads end, or the interpreter clears this module.
    _graveyard.extend(retired)
    if on_exit is not None:
        on_exit()
    with _Ordered._lock:
        _Ordered._live.pop(threading.current_thread(), None)


def _wait_ready(ready, timeout_s, name, what):
    """Waits for the event `ready` (the work queued on the stream before a
    collective), at most `timeout_s`; raises its error, or past the
    timeout."""
    deadline = time.monotonic() + timeout_s
    delay = 1e-5
    while not ready.query():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name}: {what or 'the collective'}: the work queued on the "
                               f"stream before it did not complete within the group's "
                               f"timeout of {timeout_s:g} s")
        time.sleep(delay)
        delay = min(2 * delay, 2e-3)


def _gloo_job(start, finish, name, what, published=None):
    """Starts gloo's work (`start()`), and returns its completion (Note
    [Completion on a thread of the group's own]); gloo's errors, from
    either, name the backend and the collective, and quote the failure a
    peer `published` (Note [A failed group]), where one did."""
    try:
        work = start()
    except RuntimeError as e:
        raise _on_gloo_failed(name, what, e) from e
    try:
        fut = work.get_future()
    except RuntimeError:
        fut = None  # send and receive have no future in gloo

    def run():
        try:
            if fut is not None:
                fut.wait()  # raises gloo's error
            else:
                work.wait()
        except RuntimeError as e:
            error = _on_gloo_failed(name, what, e)
            raise (published.quoted(name, error) if published is not None else error) from e
        finish()
    return run


class _Starter:
    """Starts the group's collectives in the order they were issued (Note
    [The start on the group's thread]): inline on the calling thread when
    nothing is queued and nothing needs waiting for, else on a thread of
    the group's own. Holds no group (Note [No group in the callbacks])."""

    def __init__(self, join_s):
        self.lock = threading.Lock()
        self._pending = [0]  # starts queued on the thread, not yet done
        self._thread = _Ordered("accelkit-start", join_s=join_s)

    def start(self, start, fut, *, inline):
        """`start()` now if `inline` and nothing is queued (its error
        raised to the caller, and `fut` failed with it), else on the
        thread (its error fails `fut`). Called with `lock` held, which
        keeps the issue order."""
        if inline and self._pending[0] == 0:
            try:
                start()
            except BaseException as e:
                if not fut.done():
                    fut.set_exception(e)
                raise
            return
        self._pending[0] += 1
        pending, lock = self._pending, self.lock
        self._thread.put(lambda: _start_queued(start, fut, pending, lock), None, None)

    def close(self):
        self._thread.close()


def _start_queued(start, fut, pending, lock):
    """A start on the _Starter's thread (which this holds no reference to)."""
    try:
        start()
    except Exception as e:  # noqa: BLE001  the work's error
        if not fut.done():
            fut.set_exception(e)
    finally:
        with lock:
            pending[0] -= 1

