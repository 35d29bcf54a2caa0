"""torch.distributed for the installed backend: a c10d process group named
after the device (``init_process_group("cpu:gloo,simdev:simdev")``, or
``init_process_group()`` on a machine whose accelerator is the device) that
runs every collective on an inner gloo group.

Note [Collectives on gloo]
~~~~~~~~~~~~~~~~~~~~~~~~~~
The group is a Python ``torch.distributed.ProcessGroup`` (PyTorch calls its
methods from Python and, for DDP's reducer, from C++ through its Python
trampoline), registered with ``Backend.register_backend(name, ...,
devices=[name])`` by ``accelkit.install``. Each collective over device
tensors runs on a gloo group of its own (built on the same store), over CPU
tensors that are

- views of the device memory itself when the device's memory is
  host-visible and the tensor is contiguous (zero-copy: gloo reads and
  writes the device memory in place);
- otherwise, blocks of the backend's pinned pool, filled from the device
  at the collective's start, and copied back to the device tensors when
  gloo is done.

The collective starts after the work queued on the device's current
stream, without blocking the calling thread (Note [The start on the group's
thread]): the call records an event on that stream and returns; a thread of
the group's own waits for the event, copies staged inputs to pinned memory
and then calls gloo, in the order the collectives were issued. The returned
work's ``wait()`` (and ``async_op=False``) makes the device's current stream
wait for it, on the device, and returns without blocking the calling thread,
as CUDA's NCCL does, on a runtime with the host signal members (Note [wait()
on the stream]); elsewhere, or with ``pg.stream_wait = False``
(``ACCELKIT_STREAM_WAIT=0``), it blocks the calling thread until the results
are in device memory. With ``async_op=True``, device work queued on the
tensors between the call and ``wait()`` races with the collective (on CUDA
it would run after it). The work's future (DDP's communication hooks)
completes when the results are in device memory.

CPU tensors go to the inner gloo group unchanged, so the group also serves
``cpu:`` when it is the only one (``init_process_group("simdev")``).
Reductions: SUM, PRODUCT, MIN, MAX, BAND, BOR, BXOR on gloo, AVG as a SUM
divided by the group's size (integers truncated, as NCCL does); PREMUL_SUM
is refused, as are bitwise reductions of floating-point tensors.

Note [The vendor collective slot]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A backend whose library ships its own collectives replaces gloo for the
ones it implements by registering PyTorch operators in the namespace
``<name>_collectives`` (``TORCH_LIBRARY(<name>_collectives, m)`` in the
backend library). ``open``, ``unlink``, ``supports`` and ``close`` make the
slot; each collective is optional, and so is ``abort`` (README's slot table
has the schemas)::

    open(str name, int rank, int size, bool create) -> int   # a communicator
    unlink(str name) -> ()                # rank 0, once every rank opened it
    supports(str collective, str op, ScalarType dtype) -> bool
    all_reduce(int comm, int seq, Tensor(a!) t, str op, float timeout_s) -> ()
    reduce(int comm, int seq, Tensor(a!) t, int root, str op, float timeout_s) -> ()
    broadcast(int comm, int seq, Tensor(a!) t, int root, float timeout_s) -> ()
    all_gather(int comm, int seq, Tensor(a!) output, Tensor input, float timeout_s) -> ()
    reduce_scatter(int comm, int seq, Tensor(a!) output, Tensor input, str op,
                   float timeout_s) -> ()
    all_to_all(int comm, int seq, Tensor(a!) output, Tensor input, int[] output_splits,
               int[] input_splits, float timeout_s) -> ()   # splits in elements
    barrier(int comm, int seq, float timeout_s) -> ()
    abort(int comm, str reason) -> ()     # the group failed: fail every rank's waits
    close(int comm) -> ()

``seq`` is the collective's number in the group, the same on every rank and
growing with each collective the group issues (a collective that failed on
some rank before reaching the library still takes its number): a library
whose protocol can meet what a failed collective left behind (a peer's
message or slot) tags its steps with it, so that a leftover is never read
as a later collective's data. ``abort`` is called, from any thread and
while a collective of the library may be running, once the group failed
(Note [A failed group]): the library then fails every rank's running and
later collectives with `reason`.

The group connects them when it is made (``_Native.connect``): through the
c10d store every rank says whether it has the library and which host it is
on (hostname and boot id); only if all have it and share one host, rank 0
opens a communicator under a fresh name (``/accelkit-<name>-<pid>-<hex>``)
and publishes it, the others open it, every rank reports success, and rank
0 unlinks the name; one failure anywhere leaves the whole group on gloo.
``pg.native`` is then the connection, or None (``ACCELKIT_NATIVE_COLLECTIVES=0``
on every rank turns it off). A collective goes to the library when it
registers the operator and ``supports(collective, op, dtype)`` says so (op:
the reduce op's name, "" for the others; barrier asks with torch.uint8):
the answer depends only on values the ranks agreed on (_agree checks the
dtype, the element count and, for reductions, the op, and the root), so all
ranks take the same path; everything else runs on gloo (gather, scatter,
the list form of reduce_scatter, send and recv always do).
all_gather's list form goes through the library's all_gather into one
tensor, then into the list. The library works on the same CPU tensors gloo
would get (views of host-visible device memory, or staged blocks;
contiguous; CPU tensors as given, contiguous copies where they are not),
once the stream's work is done (Note [The start on the group's thread]), on
one thread of the connection's own in the order of the calls (the returned
work completes when it and the copy back are done), with the group's
timeout. simdev implements all seven through POSIX shared memory
(examples/simdev/simdev_collective.cpp, Note [simdev's shared-memory
collectives]).
"""
import atexit
import collections
import ctypes
import datetime
import functools
import itertools
import os
import queue
import secrets
import socket
import threading
import time
import warnings
import weakref

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

from . import _backend

__all__ = ["ProcessGroup", "register"]

_C10D = torch._C._distributed_c10d

_REDUCE_NAMES = {ReduceOp.SUM: "SUM", ReduceOp.PRODUCT: "PRODUCT", ReduceOp.MIN: "MIN",
                 ReduceOp.MAX: "MAX", ReduceOp.BAND: "BAND", ReduceOp.BOR: "BOR",
                 ReduceOp.BXOR: "BXOR", ReduceOp.AVG: "AVG", ReduceOp.PREMUL_SUM: "PREMUL_SUM"}
_BITWISE = (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR)


def _op_name(op) -> str:
    for kind, name in _REDUCE_NAMES.items():
        if op == kind:
            return name
    return repr(op)


_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
           torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64, torch.complex128]


def _dtype_code(dtype) -> int:
    return _DTYPES.index(dtype) if dtype in _DTYPES else len(_DTYPES)


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
        self.cpu = []  # the CPU tensors handed out (kept: Note [Completion on a thread ...])
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

    def get(self, t, read=True, write=True):
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


def _signal_ops():
    """The backend's host signal operators (Note [Host signals] in accelkit's
    device/backend.hpp) when its streams wait for them on the device, else
    None (the runtime lacks the members, or the library predates them)."""
    global _SIGNALS
    if _SIGNALS is None:
        ops = getattr(torch.ops, _backend.name)
        try:
            _SIGNALS = ops if bool(ops.stream_signals()) else False
        except (AttributeError, RuntimeError):
            _SIGNALS = False
    return _SIGNALS or None


_SIGNALS = None
_SDK_STREAMS = {}


def _sdk_stream(device):
    """The SDK's own stream of `device` (torch.ops.<name>.sdk_stream), or
    None where the streams do not wait for signals."""
    ops = _signal_ops()
    if ops is None:
        return None
    if device.index not in _SDK_STREAMS:
        _SDK_STREAMS[device.index] = ops.sdk_stream(device.index)
    return _SDK_STREAMS[device.index]


# The error a collective's failure completes its signals with: the streams
# that wait for them report it as their asynchronous error.
_SIGNAL_FAILED = 1


def _finish_signal(index, signal, code, reason="", failures=None):
    """Completes a signal a stream waits for, never raising (on a completion
    thread): a failed completion is tried once more, since a signal left
    incomplete would hold its streams forever. A signal completed with a
    failure (`code` not 0) stays alive in `failures` (the group's), so that
    its streams stay failed until the group is destroyed (Note [Failed
    waits] in accelkit's device/failed_waits.hpp); the others are destroyed
    at once."""
    ops = _signal_ops()
    for attempt in range(2):
        try:
            ops.signal_complete(index, signal, code, reason)
            break
        except Exception as e:  # noqa: BLE001
            if attempt:
                warnings.warn(f"{_backend.name}: a stream's wait for a collective could not be "
                              f"released (its stream stays waiting): {e}", RuntimeWarning,
                              stacklevel=1)
                return
    if code != 0 and failures is not None:
        failures.keep_signal(index, signal)
        return
    _destroy_signal(index, signal)


def _destroy_signal(index, signal):
    try:
        _signal_ops().signal_destroy(index, signal)
    except Exception as e:  # noqa: BLE001
        warnings.warn(f"{_backend.name}: a collective's host signal was not destroyed: {e}",
                      RuntimeWarning, stacklevel=1)


def _reason(name, error):
    """`error`'s text without a leading "<name>: " (the errors that quote it
    name the backend once)."""
    text = str(error)
    return text[len(name) + 2:] if text.startswith(f"{name}: ") else text


class _Failures:
    """The group's failure.

    Note [A failed group]
    ~~~~~~~~~~~~~~~~~~~~~
    Problem: a collective that fails on one rank may have been entered by
    the others (a rank whose staging failed never reaches gloo or the
    vendor's library, while its peers wait there), and what a failed
    collective leaves behind (a peer's half-written slot, gloo's pending
    operation) must never be read as a later collective's data.
    Decision: as NCCL's communicator abort, the first failure of a
    collective the ranks agreed to run (its start, the staging, gloo's or
    the library's error, the copy back, or this rank's own error after the
    agreement) fails the group: every later call of the group on this rank
    raises a DistBackendError quoting that first failure, until the group
    is destroyed (destroy_process_group) and made again. The failed rank
    publishes its failure in the c10d store and takes part in no more
    exchanges; the other ranks learn it from the vendor's library, whose
    communicator the failure aborts for every rank at once (abort: simdev's
    waits see it at their next poll), or, on gloo, when their own
    collective or their next agreement (_agree) meets the silent rank, past
    the group's timeout: their groups fail then, quoting the failure the
    first rank published (a failed agreement fails the group: its exchange
    is out of step). The
    streams that waited for a failed collective stay failed until the group
    is destroyed (Note [Failed waits]): the group keeps the failed signals
    alive until its shutdown.
    Limits: a rank blocked inside gloo itself learns of a peer's failure
    only from gloo's own timeout; collectives without an agreement (gather,
    scatter, barrier, send and recv) fail on this rank only.
    Shared by the group and its works, which hold no group (Note [No group
    in the callbacks])."""

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


class _Work(_C10D.Work):
    """A collective in flight.

    Note [wait() on the stream]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~
    As on CUDA's NCCL, `wait()` (and the implicit one of async_op=False)
    makes the current stream of the collective's device wait for it and
    returns without blocking the calling thread: it queues the stream's wait
    for a host signal (Note [Host signals]) that the work's completion,
    on the group's own thread once the results are in device memory,
    completes, so the work queued afterwards on that stream runs after the
    collective. A collective that fails completes its signals with an error:
    the waiting streams report it at every synchronize or query, from any
    thread, until the group is destroyed (Note [Failed waits]), so the
    thread that uses the collective's output on that stream gets it even
    when another thread synchronized first; the failure is reported as a
    RuntimeWarning with its cause (gloo's, naming the peer), and fails the
    group (Note [A failed group]): every later call raises it, as NCCL's do
    after a communicator failed. A work already complete when waited for
    needs no signal, and its wait() raises its error, as NCCL's does.
    `wait(timeout)` with a timeout blocks the calling thread until the
    results are in device memory, raising the error, or a RuntimeError past
    the timeout (NCCL: "ran for ... before timing out"); `synchronize()` (and
    `block_current_stream()`) queue the stream's wait without raising;
    `is_completed()` never blocks; `get_future()` completes when the results
    are in device memory. Where the stream cannot wait for the host (a
    runtime without the signal members, or CPU tensors), wait() blocks the
    calling thread as above.
    With `pg.stream_wait = False` (ACCELKIT_STREAM_WAIT=0) wait() blocks the
    calling thread until the results are in device memory instead.
    The completion runs Python (this thread's _settle, the staged copy back),
    so a thread that blocks on such a stream while holding the GIL would
    deadlock the process: FSDP2's optimizer step did, in a foreach kernel
    under DTensor's Python dispatch that waited for the stream. The SDK's
    blocking waits release the GIL (Note [Blocking waits release the GIL] in
    accelkit/torch/python_lock.hpp)."""

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

    def _bind(self, device, failures, stream_wait=True):
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


class _Ordered:
    """A thread of the group's own that runs jobs in the order given.

    Note [Completion on a thread of the group's own]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    A collective's work completes on this thread, which waits for gloo's
    work (the GIL released), runs the copy back and sets the work's future;
    gloo's threads run no Python. Python run there (a `then` callback on
    gloo's future) is dropped there, after the callback, taking the GIL: if
    the interpreter is finalizing by then (the program exits right after
    its last collective), taking the GIL ends the thread (pthread_exit),
    whose unwinding through gloo's noexcept frames calls std::terminate, the
    abort "terminate called without an active exception" seen in DDP
    teardown (the core's stack: ProcessGroupGloo::runLoop ->
    Future::markCompleted -> ~PythonFunctionGuard -> take_gil ->
    PyThread_exit_thread). The same happens when gloo's thread drops the
    last reference to a tensor that has a Python object (~AsyncWork ->
    TensorImpl::decref_pyobject -> take_gil): so this thread keeps its last
    jobs (and their gloo works and tensors) until later jobs do, and
    after its end in a module-level list (dropped by later threads' ends
    or when the interpreter clears this module, on its own thread), so
    gloo's thread, which drops its reference after completing the work
    (under load, a while after), does not hold the last one. The thread is joined before the
    interpreter finalizes: by the group's shutdown (destroy_process_group)
    or, for a program that exits without it, at exit (_close_all). The zero-
    copy views own no Python buffer (_Host._view).

    Note [No group in the callbacks]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    The jobs hold values, never the group: were the last reference to go on
    a thread of the group (destroy_process_group while a work is in flight
    or just done), the group's destructor would join that thread from
    itself ("Resource deadlock avoided")."""

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


def _on_gloo_failed(name, what, e):
    """gloo's error `e` in `what` as the error the caller sees, naming the
    backend and the collective (a DistBackendError stays one)."""
    cls = dist.DistBackendError if isinstance(e, getattr(dist, "DistBackendError", ())) \
        else RuntimeError
    return cls(f"{name}: {what} on gloo failed: {e}")


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

    def start(self, start, fut, inline):
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


def _host_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = "?"
    return f"{socket.gethostname()}/{boot}"


class _Native:
    """The vendor's collective library connected for one group (Note [The
    vendor collective slot])."""

    MEMBERS = ("open", "unlink", "supports", "close")
    # The collectives the group routes to the library when it registers them
    # (README's slot table has their schemas).
    COLLECTIVES = ("all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter",
                   "all_to_all", "barrier")

    def __init__(self, ops, comm, timeout_s):
        self.ops, self.comm, self.timeout_s = ops, comm, timeout_s
        self.calls = collections.Counter()  # collectives handed to the library
        self.has = set()
        for c in self.COLLECTIVES:
            try:
                getattr(ops, c)
            except (AttributeError, RuntimeError):
                continue
            self.has.add(c)
        self._answers = {}
        close = ops.close
        self._thread = _Ordered("accelkit-native", on_exit=lambda: close(comm),
                                join_s=2 * timeout_s)

    def close(self):
        """Ends the connection's thread once the queued calls are done (the
        group's shutdown: destroy_process_group), which closes the
        communicator; no thread of the group is left running at exit."""
        self._thread.close()

    @staticmethod
    def library(name):
        """The backend's `<name>_collectives` operators, or None."""
        ns = getattr(torch.ops, f"{name}_collectives")
        try:
            for m in _Native.MEMBERS:
                getattr(ns, m)
        except (AttributeError, RuntimeError):
            return None
        return ns

    @staticmethod
    def _open(ops, name, shm, rank, size, create):
        """The library's open(), or None when it fails (any error of the
        library: simdev's when /dev/shm has too little room for the
        segment): the group then runs on gloo, as when the library is
        absent."""
        try:
            return ops.open(shm, rank, size, create)
        except Exception as e:  # noqa: BLE001 (any failure of the library)
            warnings.warn(f"accelkit: {name}: the vendor collective library did not connect, "
                          f"the group's collectives run on gloo: {e}", RuntimeWarning,
                          stacklevel=4)
            return None

    @classmethod
    def connect(cls, name, store, rank, size, timeout):
        ops = cls.library(name)
        enabled = (ops is not None and size > 1
                   and os.environ.get("ACCELKIT_NATIVE_COLLECTIVES", "1") != "0")
        store = dist.PrefixStore("accelkit-native/", store)
        store.set(f"host/{rank}", f"{int(enabled)} {_host_id()}")
        hosts = [store.get(f"host/{r}").decode() for r in range(size)]
        if not all(h.startswith("1 ") for h in hosts) or len(set(hosts)) != 1:
            return None
        comm = None
        try:
            if rank == 0:
                shm = f"/accelkit-{name}-{os.getpid()}-{secrets.token_hex(6)}"
                try:
                    comm = cls._open(ops, name, shm, 0, size, True)
                finally:
                    store.set("name", shm if comm is not None else "")
            else:
                shm = store.get("name").decode()
                comm = cls._open(ops, name, shm, rank, size, False) if shm else None
            store.set(f"open/{rank}", str(int(comm is not None)))
            every = [store.get(f"open/{r}") == b"1" for r in range(size)]
        except BaseException:
            # The store failed (its timeout): the group does not come up.
            if comm is not None:
                try:
                    ops.close(comm)
                except Exception:  # noqa: BLE001  (the store's error is the one to raise)
                    pass
            raise
        finally:
            # Rank 0 unlinks the name once every rank opened it, or when
            # connecting failed: none is left in /dev/shm. Every rank decides
            # below from the same `every`: a failed unlink must not make rank 0
            # leave while the others go on.
            if rank == 0 and comm is not None:
                try:
                    ops.unlink(shm)
                except Exception as e:  # noqa: BLE001 (any failure of the library)
                    warnings.warn(f"accelkit: {name}: could not unlink the shared segment "
                                  f"{shm}: {e}", RuntimeWarning, stacklevel=3)
        if not all(every):
            if comm is not None:
                ops.close(comm)
            return None
        return cls(ops, comm, timeout.total_seconds())

    def supports(self, collective, op, dtype):
        """Whether the library runs `collective` with reduce op `op` ("" for
        the others) on `dtype` (barrier: torch.uint8): it registers the
        operator and its supports() says so. The answer depends only on
        these, which the ranks agreed on: kept."""
        if collective not in self.has:
            return False
        key = (collective, op, dtype)
        if key not in self._answers:
            self._answers[key] = bool(self.ops.supports(collective, op, dtype))
        return self._answers[key]

    def count(self, collective):
        """How many `collective`s the library ran (its own count, where it
        keeps one: simdev's calls(comm, collective)), else handed to it."""
        if hasattr(self.ops, "calls"):
            return int(self.ops.calls(self.comm, collective))
        return self.calls[collective]

    def reductions(self):
        """all_reduce calls the library ran."""
        return self.count("all_reduce")

    def abort(self, reason):
        """Fails the library's running and later collectives on every rank
        (Note [A failed group]), where the library has abort()."""
        try:
            abort = self.ops.abort
        except (AttributeError, RuntimeError):
            return
        abort(self.comm, reason)

    def call(self, collective, outputs, seq, *args, timeout_s=-1):
        """The library's `collective(comm, seq, *args, timeout_s)` as a
        function for the connection's thread (`run`); `seq`: the
        collective's number in the group. The library takes contiguous CPU
        tensors: others among `args` go as contiguous copies, and those in
        `outputs` are copied back."""
        self.calls[collective] += 1
        op = getattr(self.ops, collective)
        comm = self.comm
        timeout_s = timeout_s if timeout_s > 0 else self.timeout_s
        back = []
        given = []
        for a in args:
            if isinstance(a, torch.Tensor) and not a.is_contiguous():
                c = a.contiguous()
                if any(a is o for o in outputs):
                    back.append((a, c))
                a = c
            given.append(a)

        def run():
            op(comm, seq, *given, timeout_s)
            for a, c in back:
                a.copy_(c)
        run.collective = collective
        return run

    def run(self, call, finish, fut, result):
        """Queues `call()` then `finish()` on the connection's thread; `fut`
        completes with `result` after both."""
        def job():
            call()
            finish()
        self._thread.put(job, fut, result)


def _collective(method):
    """A collective of the group: an error raised after the ranks' agreement
    (the others went on into the collective) fails the group (Note [A
    failed group])."""
    @functools.wraps(method)
    def run(self, *args, **kwargs):
        self._tls.agreed = False
        try:
            return method(self, *args, **kwargs)
        except BaseException as e:  # a KeyboardInterrupt after the agreement too
            if getattr(self._tls, "agreed", False):
                self._tls.agreed = False
                self._failures.fail(e if isinstance(e, Exception) else RuntimeError(
                    f"{self.name}: interrupted after the ranks agreed to run the "
                    f"collective ({type(e).__name__})"))
            raise
    return run


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


class ProcessGroup(dist.ProcessGroup):
    """The backend's c10d process group (Note [Collectives on gloo])."""

    def __init__(self, store, rank: int, size: int, timeout: datetime.timedelta):
        super().__init__(rank, size)
        self.name = _backend.name
        self._rank, self._size = rank, size
        self.gloo = dist.ProcessGroupGloo(dist.PrefixStore("accelkit-gloo/", store), rank, size,
                                          timeout)
        # The ranks' agreement (_agree) on a gloo group of its own: it runs on
        # the calling thread, the collectives on the group's (Note [The start
        # on the group's thread]), and one gloo group's calls must come in the
        # same order on every rank.
        self._check_gloo = dist.ProcessGroupGloo(dist.PrefixStore("accelkit-check/", store), rank,
                                                 size, timeout)
        self._visible = {}
        self.check_agreement = True  # _agree
        self._timeout_s = timeout.total_seconds()
        # Note [Collectives in issue order]: the last work issued, whether its
        # results reach memory late (staged, or the vendor's library), and
        # whether it is a send or receive.
        self._last = (None, False, False)
        # The receives still in flight, with their tensors and whether their
        # results come late (staged): Note [Collectives in issue order].
        self._p2p_writes = []
        self._starter = _Starter(join_s=2 * self._timeout_s)
        self._failures = _Failures(self.name)  # Note [A failed group]
        # Where a failed rank publishes its failure for the others.
        self._published = _Published(store, rank, size)
        self._failures.on_fail(self._published.publish)
        # The collectives' numbers (Note [The vendor collective slot]): one for
        # every collective issued, the same on every rank.
        self._seq = itertools.count(1)
        # Whether the calling thread's collective got past the ranks'
        # agreement (Note [A failed group]: _collective).
        self._tls = threading.local()
        # Note [wait() on the stream]; ACCELKIT_STREAM_WAIT=0 makes wait() block the host.
        self.stream_wait = os.environ.get("ACCELKIT_STREAM_WAIT", "1") != "0"
        # Note [Completion on a thread of the group's own]
        self._done = _Ordered("accelkit-completion", join_s=2 * self._timeout_s)
        # Note [The vendor collective slot]
        self.native = _Native.connect(self.name, store, rank, size, timeout)
        if self.native is not None:
            self._failures.on_fail(self.native.abort)
        self._group_name, self._group_desc = "", ""

    # -- identity
    def getBackendName(self) -> str:
        return self.name

    def _get_backend_name(self) -> str:
        return self.name

    # PyTorch keeps a group's name and description in its registered C++
    # backends, which this group has none of: kept here.
    def getGroupName(self) -> str:
        return self._group_name

    def setGroupName(self, name: str) -> None:
        self._group_name = name

    def getGroupDesc(self) -> str:
        return self._group_desc

    def setGroupDesc(self, desc: str) -> None:
        self._group_desc = desc

    # init_process_group(device_id=...) binds the group to the device and
    # asks the backend registered for it whether it splits communicators:
    # this group is its own backend, for the device and for the CPU, and
    # does not split.
    supports_splitting = False

    def _get_backend(self, device):
        device = torch.device(device)
        if device.type in (self.name, "cpu"):
            return self
        return super()._get_backend(device)

    def shutdown(self) -> None:
        """destroy_process_group's call: the group's threads (completion,
        vendor slot) end here, after the jobs queued on them (Note
        [Completion on a thread of the group's own])."""
        native, self.native = self.native, None
        self._starter.close()  # the queued starts first: they hand work to the others
        if native is not None:
            native.close()
        self._done.close()
        self._failures.release()  # the failed signals: their streams recover
        super().shutdown()

    def host_visible(self, index: int) -> bool:
        if index not in self._visible:
            props = torch.get_device_module(self.name).get_device_properties(index)
            self._visible[index] = bool(props.host_visible_memory)
        return self._visible[index]

    # -- checks
    def _reduce_op(self, op, tensors):
        if op == ReduceOp.PREMUL_SUM:
            raise ValueError(f"{self.name}: ReduceOp.PREMUL_SUM is not supported by this "
                             "process group (it runs on gloo)")
        known = any(op == kind for kind in _REDUCE_NAMES)
        if not known:
            raise ValueError(f"{self.name}: unsupported reduce op {op!r}")
        if any(op == b for b in _BITWISE):
            for t in tensors:
                if t.is_floating_point() or t.is_complex():
                    raise ValueError(f"{self.name}: ReduceOp.{_op_name(op)} needs integer or "
                                     f"bool tensors, got {t.dtype}")
        if op == ReduceOp.AVG:
            opts_op = ReduceOp.SUM
        else:
            opts_op = op
        return opts_op

    def _avg(self, cpu_tensors):
        size = self._size  # not self: Note [No group in the callbacks]

        def run():
            for t in cpu_tensors:
                if t.is_floating_point() or t.is_complex():
                    t.div_(size)
                else:
                    t.div_(size, rounding_mode="trunc")
        return run

    @staticmethod
    def _chain(*steps):
        def run():
            for s in steps:
                s()
        return run

    # The collectives the agreement tells apart, by their names in errors.
    _KINDS = ("all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor",
              "reduce_scatter", "reduce_scatter_tensor", "all_to_all_single")
    # A row of the agreement: the collective, its number, the tensor's dtype
    # and element count, this rank's state, the reduce op, the root rank,
    # and whether splits follow (all_to_all_single).
    _ROW = 8
    _OK, _REFUSED = 0, 1

    def _agree(self, what: str, tensor, numel=None, state=0, op=None, root=None,
               splits=None, seq=0):
        """Refuses a collective whose ranks disagree on the collective, its
        number in the group, the tensor's dtype or element count, the reduce
        `op` or the `root` rank (gloo itself aborts the process on a size
        mismatch, and the vendor slot's choice depends on these: Note [The
        vendor collective slot]): a small allgather of each rank's row of
        fixed width first, on a gloo group of its own, so every rank raises
        the same ValueError, naming the collective and the values. A rank
        whose own checks failed (`state` _REFUSED) takes part too, and the
        others raise naming it (it raises its own error). `splits` (all_to_all_single: this rank's
        output and input splits in elements, one per rank each) go in a
        second allgather once every rank agreed that the collective is
        all_to_all_single, and every rank checks that each rank sends each
        peer what that peer expects (gloo aborts the process otherwise).
        Off when `check_agreement` is False."""
        if not self.check_agreement or self._size == 1:
            return
        numel = tensor.numel() if numel is None else numel
        code = -1 if op is None else list(_REDUCE_NAMES.values()).index(_op_name(op)) \
            if _op_name(op) in _REDUCE_NAMES.values() else len(_REDUCE_NAMES)
        kind = self._KINDS.index(what) if what in self._KINDS else len(self._KINDS)
        mine = torch.tensor([kind, seq, _dtype_code(tensor.dtype), numel, state, code,
                             -1 if root is None else root, int(splits is not None)],
                            dtype=torch.int64)
        rows = self._allgather_rows(what, mine)
        if state != self._OK:
            return  # the caller raises this rank's own error
        refused = [i for i, r in enumerate(rows) if r[4] == self._REFUSED]
        if refused:
            raise ValueError(f"{self.name}: {what}: rank(s) {', '.join(map(str, refused))} "
                             "refused the collective (their own error says why)")

        def kind_name(c):
            return self._KINDS[c] if 0 <= c < len(self._KINDS) else "another collective"
        if any(r[0] != rows[0][0] for r in rows):
            raise ValueError(f"{self.name}: {what}: the ranks' collectives disagree: "
                             + ", ".join(f"rank {i} calls {kind_name(r[0])}"
                                         for i, r in enumerate(rows)))
        if any(r[1] != rows[0][1] for r in rows):
            raise ValueError(f"{self.name}: {what}: the ranks disagree on how many collectives "
                             "the group ran before this one (a collective called on some "
                             "ranks only): " + ", ".join(f"rank {i} calls its collective #{r[1]}"
                                                        for i, r in enumerate(rows)))
        if any(r[5] != rows[0][5] for r in rows):
            names = list(_REDUCE_NAMES.values())

            def opname(c):
                return f"ReduceOp.{names[c]}" if 0 <= c < len(names) else "another op"
            raise ValueError(f"{self.name}: {what}: the ranks' reduce ops disagree: "
                             + ", ".join(f"rank {i} has {opname(r[5])}"
                                         for i, r in enumerate(rows)))
        if any(r[6] != rows[0][6] for r in rows):
            raise ValueError(f"{self.name}: {what}: the ranks' root ranks disagree: "
                             + ", ".join(f"rank {i} has root {r[6]}" for i, r in enumerate(rows)))
        if splits is not None:
            self._agree_splits(what, splits)
        pairs = [r[2:4] for r in rows]
        if any(r != pairs[0] for r in pairs):
            def desc(r):
                dt = _DTYPES[r[0]] if r[0] < len(_DTYPES) else "another dtype"
                return f"{dt} x {r[1]}"
            raise ValueError(f"{self.name}: {what}: the ranks' tensors disagree: "
                             + ", ".join(f"rank {i} has {desc(r)}" for i, r in enumerate(pairs)))

    def _allgather_rows(self, what, mine):
        """Every rank's `mine` (one width on every rank), as lists. A failed
        exchange fails the group (Note [A failed group]), quoting a failure
        another rank published if there is one."""
        width = mine.numel()
        every = torch.empty(width * self._size, dtype=torch.int64)
        try:
            self._check_gloo._allgather_base(every, mine).wait()
        except RuntimeError as e:
            error = self._published.quoted(
                self.name, _on_gloo_failed(self.name, f"{what} (the ranks' agreement)", e))
            self._failures.fail(error)
            raise error from e
        return every.view(self._size, width).tolist()

    def _agree_splits(self, what, splits):
        """all_to_all_single's splits, once every rank agreed on the
        collective: each rank sends each peer what that peer expects."""
        n = self._size
        rows = self._allgather_rows(what, torch.tensor([int(x) for x in splits],
                                                       dtype=torch.int64))
        outs = [r[:n] for r in rows]
        ins = [r[n:2 * n] for r in rows]
        bad = [(i, j) for i in range(n) for j in range(n) if ins[i][j] != outs[j][i]]
        if bad:
            i, j = bad[0]
            raise ValueError(
                f"{self.name}: {what}: the ranks' splits disagree (rank {i} sends "
                f"{ins[i][j]} elements to rank {j}, which expects {outs[j][i]}): "
                + ", ".join(f"rank {r} has input splits {ins[r]} and output splits "
                            f"{outs[r]}" for r in range(n)) + " (in elements)")

    def _checked(self, what: str, tensor, check, numel=None, op=None, root=None,
                 splits=None):
        """Runs this rank's own checks (`check()`, which raises on a bad
        argument and returns what the collective needs), then the ranks'
        agreement (_agree), which a rank whose check failed joins too, so
        that no rank is left waiting for it: every rank raises. A failed group raises its failure at once
        (Note [A failed group]). Gives the collective its number in the
        group (Note [The vendor collective slot])."""
        self._failures.check()  # Note [A failed group]
        seq = next(self._seq)
        self._tls.seq = seq
        result, failed = None, None
        try:
            result = check()
        except Exception as e:  # noqa: BLE001  (joins the agreement, then raised)
            failed = e
        state = self._OK if failed is None else self._REFUSED
        self._agree(what, tensor, numel, state=state, op=op, root=root, seq=seq,
                    splits=None if splits is None else splits(result) if state == self._OK
                    else [])
        if failed is not None:
            raise failed
        self._tls.agreed = True
        return result

    def _unchecked(self, numbered=True):
        """The start of a collective without an agreement (gather, scatter,
        barrier; send and recv, `numbered` False: one rank's send is
        another's receive): raises the group's failure, and gives the
        collective its number."""
        self._failures.check()  # Note [A failed group]
        if numbered:
            self._tls.seq = next(self._seq)
        self._tls.agreed = True

    # Note [The start on the group's thread]
    # A collective starts after the work queued on the current stream of its
    # device, as on CUDA, without blocking the calling thread: the call
    # records an event on that stream (none when the stream is idle), and the
    # start (the event's wait, the staged inputs' copy to pinned memory, the
    # call into gloo or the vendor's library) runs on a thread of the group's
    # own, in the order the collectives were issued, or inline on the
    # calling thread when nothing is queued there, the stream is idle and
    # nothing needs waiting for or copying: either way the group's gloo
    # calls come in issue order, the same on every rank. The ranks' agreement
    # (_agree) stays on the calling thread, on a gloo group of its own: it
    # blocks until every rank has issued the collective, not for the stream.
    # A start that fails (the stream's asynchronous error, gloo's refusal)
    # fails the work.
    #
    # Note [Collectives in issue order]
    # c10d runs a group's collectives in the order they were issued, and a
    # later one sees what an earlier one wrote (NCCL: one stream). gloo keeps
    # that order among its own collectives on memory it reads and writes in
    # place; it does not when a collective's results reach device memory
    # only later (staged: copied back on completion), when a collective reads
    # its inputs outside gloo (staged: the copy to pinned memory at its
    # start), nor across engines (the vendor's library runs on a thread of
    # its own). So the start of a collective first waits, on the group's
    # thread, for the one issued before it when that one's results come late
    # (staged, the library's, or an AVG's, divided on the completion thread
    # after gloo's sum), or when this one runs on the library or
    # stages its inputs. A send or receive waits only for what it must: the
    # collective before it (not a send or receive) on that rule, and an
    # earlier receive still in flight only where this one's tensors overlap
    # that one's (a send of what is being received; on either memory): a
    # receive issued before a send on both ranks (batch_isend_irecv([irecv,
    # isend])) would otherwise wait for the peer's send, itself behind the
    # peer's receive. The receives in flight are kept (_p2p_writes), and the
    # next collective that is neither waits for the staged ones (their
    # results come late). With every collective whose results come late
    # waited for by the next one that is not a send or receive, the rule
    # holds across any run of collectives. The earlier ones' errors are left
    # to their own wait(). The calling thread does not wait.
    # (A failure of a collective fails the group: Note [A failed group].)
    # The start waits for the stream's work at most the group's timeout
    # (_wait_ready): a stream held up forever fails the collective, as a
    # peer that never comes does.
    def _ready_event(self, host):
        """An event recorded on the current stream of the collective's
        device, or None when the stream is idle (or the tensors are on the
        CPU)."""
        if not host.on_device:
            return None
        stream = torch.accelerator.current_stream(host.device)
        try:
            if stream.query():
                return None
            return stream.record_event()
        except RuntimeError:
            # The stream's error: a collective's failure that completed its
            # signal with an error is the cause to report.
            self._failures.check()
            raise

    def _launch(self, host, result, gloo=None, native=None, post=None, p2p=False, what="",
                writes=False):
        """Issues the collective whose start calls `gloo()` (which returns
        gloo's work) or runs `native` (a _Native.call) on the vendor's
        library, with `post()` run on its CPU tensors before the copy back
        (Note [The start on the group's thread]); returns its work. `what`:
        the collective's name, for gloo's errors; `writes`: a receive (into
        `result`)."""
        finish = host.finish if post is None else self._chain(post, host.finish)
        what = what or getattr(native, "collective", "")
        fut = torch.futures.Future()
        work = _Work(fut)._bind(host.device if host.on_device else None, self._failures,
                                self.stream_wait)
        ready = self._ready_event(host)
        # (AVG's division, post, runs on the completion thread: its results
        # come late even on memory gloo reads and writes in place.)
        late = native is not None or bool(host.back) or post is not None
        outside = native is not None or bool(host.fills)
        done = self._done
        connection = self.native if native is not None else None
        published = self._published
        failures = self._failures
        timeout_s = self._timeout_s
        name = self.name
        with self._starter.lock:
            prev, prev_late, prev_p2p = self._last
            self._last = (work, late, p2p)
            # Note [Collectives in issue order]: the works this one's start
            # waits for.
            pending = [e for e in self._p2p_writes if not e[0]._settled_event.is_set()]
            if p2p:
                waits = [prev] if prev is not None and not prev_p2p and (prev_late or outside) \
                    else []
                waits += [w for w, outs, _ in pending if _overlap(result, outs)]
                if writes:
                    pending.append((work, list(result), late))
            else:
                waits = [prev] if prev is not None and (
                    prev_late or native is not None or outside) else []
                waits += [w for w, _, w_late in pending if w_late and w is not prev]
                pending = [e for e in pending if not e[2]]
            self._p2p_writes = pending

            def start():
                # A collective issued before an earlier one failed here
                # must not reach gloo: its number there would pair it with
                # the peers' earlier collective (Note [A failed group]).
                failures.check()
                if ready is not None:
                    _wait_ready(ready, timeout_s, name, what)
                for w in waits:
                    try:
                        w._wait_host()
                    except Exception:  # noqa: BLE001  (raised by its own wait())
                        pass
                failures.check()  # an earlier collective failed meanwhile
                host.stage()
                if connection is not None:
                    connection.run(native, finish, fut, result)
                    return
                job = _gloo_job(gloo, finish, name, what, published)
                if p2p:
                    # On a thread of its own: a receive waits for its peer,
                    # whose send may come only after collectives of this rank
                    # that must complete first (one thread for both would
                    # deadlock).
                    thread = _Ordered("accelkit-p2p", join_s=2 * timeout_s)
                    thread.put(job, fut, result)
                    thread.end()
                else:
                    done.put(job, fut, result)
            inline = (ready is None and not host.fills
                      and all(w._settled_event.is_set() for w in waits))
            self._starter.start(start, fut, inline)
        return work

    def _native_for(self, collective, op, dtype):
        """The vendor's library when it runs this collective (Note [The
        vendor collective slot]), else None."""
        native = self.native
        if native is not None and native.supports(collective, op, dtype):
            return native
        return None

    @staticmethod
    def _timeout(opts):
        return opts.timeout.total_seconds() if getattr(opts, "timeout", None) is not None else -1

    # -- collectives
    @_collective
    def allreduce(self, tensors, opts=None):
        opts = opts if opts is not None else dist.AllreduceOptions()
        op = opts.reduceOp
        host, gloo_op = self._checked("all_reduce", tensors[0], lambda: (
            _Host(self, tensors, tensors, "all_reduce"), self._reduce_op(op, tensors)), op=op)
        for t in tensors[1:]:
            self._agree("all_reduce", t, op=op)
        cpu = [host.get(t) for t in tensors]
        native = self._native_for("all_reduce", _op_name(op), tensors[0].dtype) \
            if len(tensors) == 1 else None
        if native is not None:
            return self._launch(host, tensors, native=native.call(
                "all_reduce", cpu, self._tls.seq, cpu[0], _op_name(op),
                timeout_s=self._timeout(opts)))
        o = dist.AllreduceOptions()
        o.reduceOp = gloo_op
        o.timeout = opts.timeout
        gloo = self.gloo
        post = self._avg(cpu) if op == ReduceOp.AVG else None
        return self._launch(host, tensors, what="all_reduce",
                            gloo=lambda: gloo.allreduce(cpu, o), post=post)

    def allreduce_coalesced(self, tensors, opts=None):
        works = [self.allreduce([t], _allreduce_opts(opts)) for t in tensors]
        return _all_of(works, tensors)._bind(works[0]._device if works else None,
                                              self._failures, self.stream_wait)

    @_collective
    def broadcast(self, tensors, opts=None):
        opts = opts if opts is not None else dist.BroadcastOptions()
        host = self._checked("broadcast", tensors[0], lambda: _Host(
            self, tensors, tensors if opts.rootRank != self._rank else (), "broadcast"),
            root=opts.rootRank)
        for t in tensors[1:]:
            self._agree("broadcast", t, root=opts.rootRank)
        root = opts.rootRank == self._rank
        cpu = [host.get(t, read=root, write=not root) for t in tensors]
        native = self._native_for("broadcast", "", tensors[0].dtype) if len(tensors) == 1 else None
        if native is not None:
            return self._launch(host, tensors, native=native.call(
                "broadcast", cpu, self._tls.seq, cpu[0], opts.rootRank,
                timeout_s=self._timeout(opts)))
        gloo = self.gloo
        return self._launch(host, tensors, what="broadcast", gloo=lambda: gloo.broadcast(cpu, opts))

    @_collective
    def reduce(self, tensors, opts=None):
        opts = opts if opts is not None else dist.ReduceOptions()
        op = opts.reduceOp
        host, gloo_op = self._checked("reduce", tensors[0], lambda: (
            _Host(self, tensors, tensors if opts.rootRank == self._rank else (), "reduce"),
            self._reduce_op(op, tensors)), op=op, root=opts.rootRank)
        for t in tensors[1:]:
            self._agree("reduce", t, op=op, root=opts.rootRank)
        root = opts.rootRank == self._rank
        cpu = [host.get(t, write=root) for t in tensors]
        native = self._native_for("reduce", _op_name(op), tensors[0].dtype) \
            if len(tensors) == 1 else None
        if native is not None:
            return self._launch(host, tensors, native=native.call(
                "reduce", cpu, self._tls.seq, cpu[0], opts.rootRank, _op_name(op),
                timeout_s=self._timeout(opts)))
        o = dist.ReduceOptions()
        o.reduceOp, o.rootRank, o.rootTensor, o.timeout = gloo_op, opts.rootRank, opts.rootTensor, opts.timeout
        gloo = self.gloo
        post = self._avg(cpu) if op == ReduceOp.AVG and root else None
        return self._launch(host, tensors, what="reduce",
                            gloo=lambda: gloo.reduce(cpu, o), post=post)

    @_collective
    def allgather(self, output_lists, inputs, opts=None):
        opts = opts if opts is not None else dist.AllgatherOptions()

        def check():
            outs = [t for ts in output_lists for t in ts]
            host = _Host(self, list(inputs) + outs, outs, "all_gather")
            for ts, t in zip(output_lists, inputs):
                if len(ts) != self._size or any(o.numel() != t.numel() or o.dtype != t.dtype
                                                for o in ts):
                    raise ValueError(
                        f"{self.name}: all_gather: the output list has "
                        f"{[(o.dtype, o.numel()) for o in ts]}, expected {self._size} tensors "
                        f"of {t.dtype} x {t.numel()}")
            return host
        host = self._checked("all_gather", inputs[0], check)
        for t in inputs[1:]:
            self._agree("all_gather", t)
        cpu_in = [host.get(t, write=False) for t in inputs]
        cpu_out = [[host.get(t, read=False) for t in ts] for ts in output_lists]
        native = self._native_for("all_gather", "", inputs[0].dtype) if len(inputs) == 1 else None
        if native is not None:
            # The library gathers into one tensor; the list's tensors from it.
            flat = torch.empty(self._size * inputs[0].numel(), dtype=inputs[0].dtype)
            host.cpu.append(flat)
            outs, n = cpu_out[0], inputs[0].numel()

            def split():
                for r, o in enumerate(outs):
                    o.copy_(flat[r * n:(r + 1) * n].view(o.shape))
            return self._launch(host, output_lists, native=native.call(
                "all_gather", [flat], self._tls.seq, flat, cpu_in[0],
                timeout_s=self._timeout(opts)), post=split)
        gloo = self.gloo
        return self._launch(host, output_lists, what="all_gather",
                            gloo=lambda: gloo.allgather(cpu_out, cpu_in, opts))

    @_collective
    def _allgather_base(self, output, input, opts=None):
        opts = opts if opts is not None else dist.AllgatherOptions()

        def check():
            host = _Host(self, [output, input], [output], "all_gather_into_tensor")
            if output.numel() != input.numel() * self._size:
                raise ValueError(f"{self.name}: all_gather_into_tensor: the output has "
                                 f"{output.numel()} elements, expected {input.numel()} x "
                                 f"{self._size} ranks")
            if output.dtype != input.dtype:
                raise ValueError(f"{self.name}: all_gather_into_tensor: the output is "
                                 f"{output.dtype}, the input {input.dtype}")
            return host
        host = self._checked("all_gather_into_tensor", input, check)
        cpu_in = host.get(input, write=False)
        cpu_out = host.get(output, read=False)
        native = self._native_for("all_gather", "", input.dtype)
        if native is not None:
            return self._launch(host, [output], native=native.call(
                "all_gather", [cpu_out], self._tls.seq, cpu_out, cpu_in,
                timeout_s=self._timeout(opts)))
        gloo = self.gloo
        return self._launch(host, [output], what="all_gather_into_tensor",
                            gloo=lambda: gloo._allgather_base(cpu_out, cpu_in, opts))

    all_gather_single = _allgather_base

    @_collective
    def reduce_scatter(self, outputs, input_lists, opts=None):
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        op = opts.reduceOp
        host, gloo_op = self._checked("reduce_scatter", outputs[0], lambda: (
            _Host(self, list(outputs) + [t for ts in input_lists for t in ts], outputs,
                  "reduce_scatter"),
            self._reduce_op(op, list(outputs))), op=op)
        cpu_out = [host.get(t, read=False) for t in outputs]
        cpu_in = [[host.get(t, write=False) for t in ts] for ts in input_lists]
        o = dist.ReduceScatterOptions()
        o.reduceOp, o.timeout = gloo_op, opts.timeout
        gloo = self.gloo
        post = self._avg(cpu_out) if op == ReduceOp.AVG else None
        return self._launch(host, outputs, what="reduce_scatter",
                            gloo=lambda: gloo.reduce_scatter(cpu_out, cpu_in, o),
                            post=post)

    @_collective
    def _reduce_scatter_base(self, output, input, opts=None):
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        op = opts.reduceOp

        def check():
            host = _Host(self, [output, input], [output], "reduce_scatter_tensor")
            if input.numel() != output.numel() * self._size:
                raise ValueError(f"{self.name}: reduce_scatter_tensor: the input has "
                                 f"{input.numel()} elements, expected {output.numel()} x "
                                 f"{self._size} ranks")
            if output.dtype != input.dtype:
                raise ValueError(f"{self.name}: reduce_scatter_tensor: the output is "
                                 f"{output.dtype}, the input {input.dtype}")
            return host, self._reduce_op(op, [output])
        host, gloo_op = self._checked("reduce_scatter_tensor", input, check, op=op)
        cpu_out = host.get(output, read=False)
        cpu_in = host.get(input, write=False)
        native = self._native_for("reduce_scatter", _op_name(op), input.dtype)
        if native is not None:
            return self._launch(host, [output], native=native.call(
                "reduce_scatter", [cpu_out], self._tls.seq, cpu_out, cpu_in, _op_name(op),
                timeout_s=self._timeout(opts)))
        o = dist.ReduceScatterOptions()
        o.reduceOp, o.timeout = gloo_op, opts.timeout
        gloo = self.gloo
        post = self._avg([cpu_out]) if op == ReduceOp.AVG else None
        return self._launch(host, [output], what="reduce_scatter_tensor",
                            gloo=lambda: gloo._reduce_scatter_base(cpu_out, cpu_in, o),
                            post=post)

    reduce_scatter_single = _reduce_scatter_base

    @_collective
    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        opts = opts if opts is not None else dist.AllToAllOptions()
        outs, ins = list(output_split_sizes), list(input_split_sizes)

        def elements(t, splits, which):
            """c10d's splits (rows of dim 0; even when not given) in
            elements, checked against the tensor."""
            rows = t.size(0) if t.dim() > 0 else 1
            row = t.numel() // rows if rows else 0
            if not splits:
                if rows % self._size:
                    raise ValueError(f"{self.name}: all_to_all_single: the {which}'s {rows} "
                                     f"rows do not split evenly between {self._size} ranks")
                splits = [rows // self._size] * self._size
            if len(splits) != self._size or sum(splits) != rows or min(splits) < 0:
                raise ValueError(f"{self.name}: all_to_all_single: {which} splits {splits} for "
                                 f"{self._size} ranks and {rows} rows")
            return [int(n) * row for n in splits]

        def check():
            host = _Host(self, [output, input], [output], "all_to_all_single")
            return host, elements(output, outs, "output"), elements(input, ins, "input")
        # The dtype (numel 0) and the splits, in elements.
        host, out_elems, in_elems = self._checked("all_to_all_single", input, check, numel=0,
                                                  splits=lambda r: r[1] + r[2])
        cpu_out = host.get(output, read=False)
        cpu_in = host.get(input, write=False)
        native = self._native_for("all_to_all", "", input.dtype)
        if native is not None:
            return self._launch(host, [output], native=native.call(
                "all_to_all", [cpu_out], self._tls.seq, cpu_out, cpu_in, out_elems, in_elems,
                timeout_s=self._timeout(opts)))
        gloo = self.gloo
        return self._launch(host, [output], what="all_to_all_single",
                            gloo=lambda: gloo.alltoall_base(
            cpu_out, cpu_in, outs, ins, opts))

    all_to_all_single = alltoall_base

    @_collective
    def gather(self, output_lists, inputs, opts=None):
        opts = opts if opts is not None else dist.GatherOptions()
        self._unchecked()
        outs = [t for ts in output_lists for t in ts]
        host = _Host(self, list(inputs) + outs, outs, "gather")
        cpu_in = [host.get(t, write=False) for t in inputs]
        cpu_out = [[host.get(t, read=False) for t in ts] for ts in output_lists]
        gloo = self.gloo
        return self._launch(host, output_lists, what="gather",
                            gloo=lambda: gloo.gather(cpu_out, cpu_in, opts))

    @_collective
    def scatter(self, outputs, input_lists, opts=None):
        opts = opts if opts is not None else dist.ScatterOptions()
        self._unchecked()
        host = _Host(self, list(outputs) + [t for ts in input_lists for t in ts], outputs,
                     "scatter")
        cpu_out = [host.get(t, read=False) for t in outputs]
        cpu_in = [[host.get(t, write=False) for t in ts] for ts in input_lists]
        gloo = self.gloo
        return self._launch(host, outputs, what="scatter",
                            gloo=lambda: gloo.scatter(cpu_out, cpu_in, opts))

    @_collective
    def send(self, tensors, dst: int, tag: int = 0):
        self._unchecked(numbered=False)
        host = _Host(self, tensors)
        cpu = [host.get(t, write=False) for t in tensors]
        gloo = self.gloo
        return self._launch(host, tensors, what="send",
                            gloo=lambda: gloo.send(cpu, dst, tag), p2p=True)

    @_collective
    def recv(self, tensors, src: int, tag: int = 0):
        self._unchecked(numbered=False)
        host = _Host(self, tensors, tensors, "recv")
        cpu = [host.get(t, read=False) for t in tensors]
        gloo = self.gloo
        return self._launch(host, tensors, what="recv",
                            gloo=lambda: gloo.recv(cpu, src, tag), p2p=True,
                            writes=True)

    @_collective
    def recv_anysource(self, tensors, tag: int = 0):
        self._unchecked(numbered=False)
        host = _Host(self, tensors, tensors, "recv")
        cpu = [host.get(t, read=False) for t in tensors]
        gloo = self.gloo
        return self._launch(host, tensors, what="recv",
                            gloo=lambda: gloo.recv_anysource(cpu, tag), p2p=True,
                            writes=True)

    @_collective
    def barrier(self, opts=None):
        opts = opts if opts is not None else dist.BarrierOptions()
        self._unchecked()
        host = _Host(self, [])
        native = self._native_for("barrier", "", torch.uint8)
        if native is not None:
            return self._launch(host, [], native=native.call(
                "barrier", [], self._tls.seq, timeout_s=self._timeout(opts)))
        gloo = self.gloo
        return self._launch(host, [], what="barrier", gloo=lambda: gloo.barrier(opts))


def _allreduce_opts(coalesced):
    o = dist.AllreduceOptions()
    if coalesced is not None:
        o.reduceOp, o.timeout = coalesced.reduceOp, coalesced.timeout
    return o


def _all_of(works, result):
    futs = [w.get_future() for w in works]

    def done(f):
        for g in f.value():
            g.value()
        return result
    return _Work(torch.futures.collect_all(futs).then(done))


def _create(store, rank, size, timeout):
    return ProcessGroup(store, rank, size, timeout)


def register(name: str) -> None:
    """Registers the process group as torch.distributed's backend `name`
    for the device type `name` (accelkit.install calls it)."""
    if not dist.is_available() or name.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(name, _create, devices=[name])
