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
  writes the device memory in place), taken once the work queued on the
  device's current stream is done (the caller's thread waits for that
  stream: ``stream.synchronize()``);
- otherwise, blocks of the backend's pinned pool, filled from the device by
  a copy on the current stream (which the caller's thread waits for), and
  copied back to the device tensors when gloo is done.

The collective is then running on gloo's threads and the call returns; the
returned work's ``wait()`` (and ``async_op=False``) makes the device's
current stream wait for it, on the device, and returns without blocking the
calling thread, as CUDA's NCCL does, on a runtime with the host signal
members (Note [wait() on the stream]); elsewhere, or with
``pg.stream_wait = False`` (``ACCELKIT_STREAM_WAIT=0``), it blocks the
calling thread until the results are in device memory. Unlike NCCL, the start
blocks the calling thread (until the current stream's work is done). With
``async_op=True``, device work queued on the tensors between the call and
``wait()`` races with the collective (on CUDA it would run after it). The
work's future (DDP's communication hooks) completes when the results are in
device memory.

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
backend library; each member optional, the slot unused without them)::

    open(str name, int rank, int size, bool create) -> int   # a communicator
    unlink(str name) -> ()                # rank 0, once every rank opened it
    supports(str collective, str op, ScalarType dtype) -> bool
    all_reduce(int comm, Tensor(a!) t, str op, float timeout_s) -> ()
    close(int comm) -> ()

The group connects them when it is made (``_Native.connect``): through the
c10d store every rank says whether it has the library and which host it is
on (hostname and boot id); only if all have it and share one host, rank 0
opens a communicator under a fresh name (``/accelkit-<name>-<pid>-<hex>``)
and publishes it, the others open it, every rank reports success, and rank
0 unlinks the name; one failure anywhere leaves the whole group on gloo.
``pg.native`` is then the connection, or None (``ACCELKIT_NATIVE_COLLECTIVES=0``
on every rank turns it off). A collective goes to the library when
``supports(collective, op, dtype)`` says so: its answer depends only on
values the ranks agreed on (_agree checks the dtype, the element count and,
for reductions, the op), so all ranks take the same path; everything else
runs on gloo. The library works on the same CPU tensors gloo would get
(views of host-visible device memory, or staged blocks; contiguous), after
the same stream synchronize, on one thread of the connection's own in the
order of the calls (the returned work completes when it and the copy back
are done), with the group's timeout. Only ``all_reduce`` is routed today;
another collective is a ``supports`` answer and a method here away.
simdev implements ``all_reduce`` of float32/float64 with SUM, AVG, MIN, MAX
through POSIX shared memory (examples/simdev/simdev_collective.cpp, Note
[simdev's shared-memory all_reduce]).
"""
import atexit
import collections
import ctypes
import datetime
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
    """The CPU tensors one collective hands gloo for its device tensors, and
    the copies back to the device once gloo is done (Note [Collectives on
    gloo]). Keeps the device tensors alive until then."""

    def __init__(self, pg, tensors):
        # Holds no reference to the group: the last one must not go on a
        # gloo thread, whose destructor would join itself (Note [No group
        # in the callbacks]).
        self.keep = list(tensors)
        self.back = []  # (device tensor, CPU tensor) to copy back
        devices = {t.device for t in tensors}
        if len(devices) > 1:
            raise ValueError(f"{pg.name}: a collective's tensors must be on one device, got "
                             f"tensors on {', '.join(sorted(str(d) for d in devices))}")
        self.device = devices.pop() if devices else torch.device("cpu")
        self.on_device = self.device.type == pg.name
        self.visible = False
        if self.on_device:
            self.visible = pg.host_visible(self.device.index)
            # The collective comes after the work queued on the current stream:
            # gloo reads host-visible memory in place, and the results of a
            # staged collective are copied back on a gloo thread, on another
            # stream.
            torch.accelerator.current_stream(self.device).synchronize()

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

    def _staged(self, t, fill):
        buf = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        if fill:
            buf.copy_(t)  # on the current stream, which this thread waits for
        return buf

    def get(self, t, read=True, write=True):
        """The CPU tensor gloo uses for `t`: `read` if gloo reads it, `write`
        if it writes the result there."""
        if not self.on_device:
            return t
        if self.visible and t.is_contiguous():
            return self._view(t)
        buf = self._staged(t, read)
        if write:
            self.back.append((t, buf))
        return buf

    def finish(self):
        """After gloo: the results into device memory (blocking copies), on
        the SDK's own stream of the device, which no stream waiting for a
        collective holds up (a copy on the thread's current stream, the
        default stream, would wait behind a wait() queued there for this
        very collective: Note [wait() on the stream])."""
        if not self.back:
            return
        stream = _sdk_stream(self.device)
        previous = torch.accelerator.current_stream(self.device) if stream is not None else None
        if stream is not None:
            torch.accelerator.set_stream(stream)
        try:
            for t, buf in self.back:
                t.copy_(buf)
            if stream is not None:
                stream.synchronize()
        finally:
            if previous is not None:
                torch.accelerator.set_stream(previous)
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


def _finish_signal(index, signal, code):
    """Completes and destroys a signal a stream waits for, never raising (on
    a completion thread): a failed completion is tried once more, since a
    signal left incomplete would hold its streams forever."""
    ops = _signal_ops()
    for attempt in range(2):
        try:
            ops.signal_complete(index, signal, code)
            break
        except Exception as e:  # noqa: BLE001
            if attempt:
                warnings.warn(f"{_backend.name}: a stream's wait for a collective could not be "
                              f"released (its stream stays waiting): {e}", RuntimeWarning,
                              stacklevel=1)
                return
    try:
        ops.signal_destroy(index, signal)
    except Exception as e:  # noqa: BLE001
        warnings.warn(f"{_backend.name}: a collective's host signal was not destroyed: {e}",
                      RuntimeWarning, stacklevel=1)


class _Failures:
    """Errors of collectives that failed after their work's wait() had
    returned (Note [wait() on the stream]), raised by the group's next call,
    once. Shared by the group and its works, which hold no group (Note [No
    group in the callbacks])."""

    def __init__(self):
        self._lock = threading.Lock()
        self._errors = []

    def add(self, error):
        with self._lock:
            self._errors.append(error)

    def raise_first(self, name):
        with self._lock:
            errors, self._errors = self._errors, []
        if errors:
            raise RuntimeError(f"{name}: a collective failed after its work's wait() had "
                               f"returned (the streams that waited for it report an error "
                               f"too): {errors[0]}") from errors[0]


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
    the waiting streams report it as an asynchronous error at their next
    synchronize or query (as CUDA reports a kernel's fault), the failure is
    reported as a RuntimeWarning with its cause (gloo's, naming the peer),
    and the group's next call raises it as a RuntimeError (as NCCL's next
    call does after a communicator failed). A work already complete when
    waited for needs no signal, and its wait() raises its error, as NCCL's
    does. `wait(timeout)` with a timeout blocks the calling thread until the
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
        """On the thread that completed the future: completes the signals the
        streams wait for, and hands a hidden failure to the group."""
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
            if error is not None and hidden:
                if self._failures is not None:
                    self._failures.add(error)
                warnings.warn(f"{_backend.name}: a collective failed after its work's wait() "
                              f"had returned; the streams that wait for it report an error at "
                              f"their next synchronize: {error}", RuntimeWarning, stacklevel=1)
        except Exception:  # noqa: BLE001  nothing may raise on the completion thread
            pass
        code = 0 if error is None else _SIGNAL_FAILED
        for index, signal in signals or ():
            _finish_signal(index, signal, code)
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
            _finish_signal(index, signal, 0 if self._fut.done() and self.is_success()
                           else _SIGNAL_FAILED)
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

    def submit(self, run, result):
        """A work whose future completes with `result` once `run()` returned
        on this thread (or fails with its exception)."""
        fut = torch.futures.Future()
        self._jobs.put((run, fut, result))
        return _Work(fut)

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
            fut.set_exception(e)
        else:
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


def _gloo_job(work, finish):
    """The completion of gloo's `work` (Note [Completion on a thread of the
    group's own])."""
    try:
        fut = work.get_future()
    except RuntimeError:
        fut = None  # send and receive have no future in gloo

    def run():
        if fut is not None:
            fut.wait()  # raises gloo's error
        else:
            work.wait()
        finish()
    return run


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

    MEMBERS = ("open", "unlink", "supports", "all_reduce", "close")

    def __init__(self, ops, comm, timeout_s):
        self.ops, self.comm, self.timeout_s = ops, comm, timeout_s
        self.calls = 0  # collectives handed to the library
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
                    comm = ops.open(shm, 0, size, True)
                finally:
                    store.set("name", shm if comm is not None else "")
            else:
                shm = store.get("name").decode()
                comm = ops.open(shm, rank, size, False) if shm else None
        except RuntimeError:
            comm = None
        ok = comm is not None
        store.set(f"open/{rank}", str(int(ok)))
        every = [store.get(f"open/{r}") == b"1" for r in range(size)]
        if rank == 0 and comm is not None:
            # Every rank decides below from the same `every`: a failed unlink
            # (the name is then left in /dev/shm) must not make rank 0 leave
            # while the others go on.
            try:
                ops.unlink(shm)
            except Exception as e:  # noqa: BLE001 (any failure of the library)
                warnings.warn(f"accelkit: {name}: could not unlink the shared segment {shm}: {e}",
                              RuntimeWarning, stacklevel=2)
        if not all(every):
            if comm is not None:
                ops.close(comm)
            return None
        return cls(ops, comm, timeout.total_seconds())

    def supports(self, collective, op, tensors):
        return (len(tensors) == 1 and op in _REDUCE_NAMES.values()
                and bool(self.ops.supports(collective, op, tensors[0].dtype)))

    def reductions(self):
        """all_reduce calls the library ran (its own count)."""
        return int(self.ops.reduces(self.comm)) if hasattr(self.ops, "reduces") else self.calls

    def all_reduce(self, cpu, op, timeout_s, finish, result):
        """Queues the library's all_reduce of the CPU tensor `cpu`; returns
        the work."""
        self.calls += 1
        work = cpu if cpu.is_contiguous() else cpu.contiguous()
        ops, comm = self.ops, self.comm
        timeout_s = timeout_s if timeout_s > 0 else self.timeout_s

        def run():
            ops.all_reduce(comm, work, op, timeout_s)
            if work is not cpu:
                cpu.copy_(work)
            finish()
        return self._thread.submit(run, result)


class ProcessGroup(dist.ProcessGroup):
    """The backend's c10d process group (Note [Collectives on gloo])."""

    def __init__(self, store, rank: int, size: int, timeout: datetime.timedelta):
        super().__init__(rank, size)
        self.name = _backend.name
        self._rank, self._size = rank, size
        self.gloo = dist.ProcessGroupGloo(dist.PrefixStore("accelkit-gloo/", store), rank, size,
                                          timeout)
        self._visible = {}
        self.check_agreement = True  # _agree
        self._timeout_s = timeout.total_seconds()
        self._last = (None, True)  # Note [Collectives in issue order]
        self._failures = _Failures()  # Note [wait() on the stream]
        # Note [wait() on the stream]; ACCELKIT_STREAM_WAIT=0 makes wait() block the host.
        self.stream_wait = os.environ.get("ACCELKIT_STREAM_WAIT", "1") != "0"
        # Note [Completion on a thread of the group's own]
        self._done = _Ordered("accelkit-completion", join_s=2 * self._timeout_s)
        # Note [The vendor collective slot]
        self.native = _Native.connect(self.name, store, rank, size, timeout)
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

    def shutdown(self) -> None:
        """destroy_process_group's call: the group's threads (completion,
        vendor slot) end here, after the jobs queued on them (Note
        [Completion on a thread of the group's own])."""
        native, self.native = self.native, None
        if native is not None:
            native.close()
        self._done.close()
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

    def _agree(self, what: str, tensor, numel=None, failed=False, op=None):
        """Refuses a collective whose ranks disagree on the tensor's dtype or
        element count, or on the reduce `op` (gloo itself aborts the process
        on a size mismatch, and the vendor slot's choice depends on these:
        Note [The vendor collective slot]): a small allgather of each rank's
        (dtype, count, failed, op) first, so every rank raises the same
        ValueError, naming the collective and the values. A rank whose own
        checks `failed` takes part too, and the others raise naming it (it
        raises its own error). Off when `check_agreement` is False."""
        if not self.check_agreement or self._size == 1:
            return
        numel = tensor.numel() if numel is None else numel
        code = -1 if op is None else list(_REDUCE_NAMES.values()).index(_op_name(op)) \
            if _op_name(op) in _REDUCE_NAMES.values() else len(_REDUCE_NAMES)
        mine = torch.tensor([_dtype_code(tensor.dtype), numel, int(failed), code],
                            dtype=torch.int64)
        every = torch.empty(4 * self._size, dtype=torch.int64)
        self.gloo._allgather_base(every, mine).wait()
        rows = every.view(self._size, 4).tolist()
        if failed:
            return  # the caller raises this rank's own error
        refused = [i for i, r in enumerate(rows) if r[2]]
        if refused:
            raise ValueError(f"{self.name}: {what}: rank(s) {', '.join(map(str, refused))} "
                             "refused the collective (their own error says why)")
        if any(r[3] != rows[0][3] for r in rows):
            names = list(_REDUCE_NAMES.values())

            def opname(c):
                return f"ReduceOp.{names[c]}" if 0 <= c < len(names) else "another op"
            raise ValueError(f"{self.name}: {what}: the ranks' reduce ops disagree: "
                             + ", ".join(f"rank {i} has {opname(r[3])}"
                                         for i, r in enumerate(rows)))
        rows = [r[:2] for r in rows]
        if any(r != rows[0] for r in rows):
            def desc(r):
                dt = _DTYPES[r[0]] if r[0] < len(_DTYPES) else "another dtype"
                return f"{dt} x {r[1]}"
            raise ValueError(f"{self.name}: {what}: the ranks' tensors disagree: "
                             + ", ".join(f"rank {i} has {desc(r)}" for i, r in enumerate(rows)))

    def _checked(self, what: str, tensor, check, numel=None, op=None):
        """Runs this rank's own checks (`check()`, which raises ValueError
        and returns what the collective needs), then the ranks' agreement
        (_agree), which a rank whose check failed joins too, so that no rank
        is left waiting for it: every rank raises."""
        self._order()
        try:
            result, failed = check(), None
        except ValueError as e:
            result, failed = None, e
        self._agree(what, tensor, numel, failed=failed is not None, op=op)
        if failed is not None:
            raise failed
        return result

    # Note [Collectives in issue order]
    # c10d runs a group's collectives in the order they were issued, and a
    # later one sees what an earlier one wrote (NCCL: one stream). gloo keeps
    # that order among its own collectives on memory it reads and writes in
    # place; it does not when a collective's results reach device memory
    # only later (staged: copied back on completion, while the next one's
    # staging copy is read at issue), nor across engines (the vendor's
    # library runs on a thread of its own). So a collective (or send, recv)
    # first waits, on the host, for the one issued before it, unless both run
    # on gloo in place; that earlier collective's error is left to its own
    # wait().
    # (A failure of a collective whose wait() had returned is raised here,
    # by the next call: Note [wait() on the stream].)
    def _order(self, switching=False):
        last, in_place = self._last
        if last is not None and not (in_place and not switching):
            try:
                last._wait_host()
            except Exception:  # noqa: BLE001  (raised by its own wait())
                pass
        self._failures.raise_first(self.name)

    def _issued(self, host, work, native=False):
        """Records `work` as the last issued (host: its _Host; `native`: on
        the vendor's library) for _order, and binds it to the collective's
        device (Note [wait() on the stream]); returns it."""
        self._last = (work, not native and not host.back)
        return work._bind(host.device if host.on_device else None, self._failures,
                          self.stream_wait)

    # -- collectives
    def allreduce(self, tensors, opts=None):
        opts = opts if opts is not None else dist.AllreduceOptions()
        op = opts.reduceOp
        host, gloo_op = self._checked("all_reduce", tensors[0], lambda: (
            _Host(self, tensors), self._reduce_op(op, tensors)), op=op)
        for t in tensors[1:]:
            self._agree("all_reduce", t, op=op)
        cpu = [host.get(t) for t in tensors]
        native = self.native
        if native is not None and native.supports("all_reduce", _op_name(op), cpu):
            timeout = opts.timeout.total_seconds() if opts.timeout is not None else -1
            self._order(switching=True)
            return self._issued(host, native.all_reduce(cpu[0], _op_name(op), timeout,
                                                        host.finish, tensors), native=True)
        o = dist.AllreduceOptions()
        o.reduceOp = gloo_op
        o.timeout = opts.timeout
        work = self.gloo.allreduce(cpu, o)
        post = self._avg(cpu) if op == ReduceOp.AVG else (lambda: None)
        return self._issued(host, self._done.submit(_gloo_job(work, self._chain(post, host.finish)), tensors))

    def allreduce_coalesced(self, tensors, opts=None):
        works = [self.allreduce([t], _allreduce_opts(opts)) for t in tensors]
        return _all_of(works, tensors)._bind(works[0]._device if works else None,
                                              self._failures, self.stream_wait)

    def broadcast(self, tensors, opts=None):
        opts = opts if opts is not None else dist.BroadcastOptions()
        host = self._checked("broadcast", tensors[0], lambda: _Host(self, tensors))
        for t in tensors[1:]:
            self._agree("broadcast", t)
        root = opts.rootRank == self._rank
        cpu = [host.get(t, read=root, write=not root) for t in tensors]
        work = self.gloo.broadcast(cpu, opts)
        return self._issued(host, self._done.submit(_gloo_job(work, host.finish), tensors))

    def reduce(self, tensors, opts=None):
        opts = opts if opts is not None else dist.ReduceOptions()
        op = opts.reduceOp
        host, gloo_op = self._checked("reduce", tensors[0], lambda: (
            _Host(self, tensors), self._reduce_op(op, tensors)), op=op)
        for t in tensors[1:]:
            self._agree("reduce", t)
        root = opts.rootRank == self._rank
        cpu = [host.get(t, write=root) for t in tensors]
        o = dist.ReduceOptions()
        o.reduceOp, o.rootRank, o.rootTensor, o.timeout = gloo_op, opts.rootRank, opts.rootTensor, opts.timeout
        work = self.gloo.reduce(cpu, o)
        post = self._avg(cpu) if op == ReduceOp.AVG and root else (lambda: None)
        return self._issued(host, self._done.submit(_gloo_job(work, self._chain(post, host.finish)), tensors))

    def allgather(self, output_lists, inputs, opts=None):
        opts = opts if opts is not None else dist.AllgatherOptions()
        host = self._checked("all_gather", inputs[0], lambda: _Host(
            self, list(inputs) + [t for ts in output_lists for t in ts]))
        for t in inputs[1:]:
            self._agree("all_gather", t)
        cpu_in = [host.get(t, write=False) for t in inputs]
        cpu_out = [[host.get(t, read=False) for t in ts] for ts in output_lists]
        work = self.gloo.allgather(cpu_out, cpu_in, opts)
        return self._issued(host, self._done.submit(_gloo_job(work, host.finish), output_lists))

    def _allgather_base(self, output, input, opts=None):
        opts = opts if opts is not None else dist.AllgatherOptions()

        def check():
            if output.numel() != input.numel() * self._size:
                raise ValueError(f"{self.name}: all_gather_into_tensor: the output has "
                                 f"{output.numel()} elements, expected {input.numel()} x "
                                 f"{self._size} ranks")
            return _Host(self, [output, input])
        host = self._checked("all_gather_into_tensor", input, check)
        cpu_in = host.get(input, write=False)
        cpu_out = host.get(output, read=False)
        work = self.gloo._allgather_base(cpu_out, cpu_in, opts)
        return self._issued(host, self._done.submit(_gloo_job(work, host.finish), [output]))

    all_gather_single = _allgather_base

    def reduce_scatter(self, outputs, input_lists, opts=None):
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        op = opts.reduceOp
        host, gloo_op = self._checked("reduce_scatter", outputs[0], lambda: (
            _Host(self, list(outputs) + [t for ts in input_lists for t in ts]),
            self._reduce_op(op, list(outputs))), op=op)
        cpu_out = [host.get(t, read=False) for t in outputs]
        cpu_in = [[host.get(t, write=False) for t in ts] for ts in input_lists]
        o = dist.ReduceScatterOptions()
        o.reduceOp, o.timeout = gloo_op, opts.timeout
        work = self.gloo.reduce_scatter(cpu_out, cpu_in, o)
        post = self._avg(cpu_out) if op == ReduceOp.AVG else (lambda: None)
        return self._issued(host, self._done.submit(_gloo_job(work, self._chain(post, host.finish)), outputs))

    def _reduce_scatter_base(self, output, input, opts=None):
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        op = opts.reduceOp

        def check():
            if input.numel() != output.numel() * self._size:
                raise ValueError(f"{self.name}: reduce_scatter_tensor: the input has "
                                 f"{input.numel()} elements, expected {output.numel()} x "
                                 f"{self._size} ranks")
            return _Host(self, [output, input]), self._reduce_op(op, [output])
        host, gloo_op = self._checked("reduce_scatter_tensor", input, check, op=op)
        cpu_out = host.get(output, read=False)
        cpu_in = host.get(input, write=False)
        o = dist.ReduceScatterOptions()
        o.reduceOp, o.timeout = gloo_op, opts.timeout
        work = self.gloo._reduce_scatter_base(cpu_out, cpu_in, o)
        post = self._avg([cpu_out]) if op == ReduceOp.AVG else (lambda: None)
        return self._issued(host, self._done.submit(_gloo_job(work, self._chain(post, host.finish)), [output]))

    reduce_scatter_single = _reduce_scatter_base

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        opts = opts if opts is not None else dist.AllToAllOptions()
        host = self._checked("all_to_all_single", input, lambda: _Host(self, [output, input]),
                             numel=0)  # the dtype
        cpu_out = host.get(output, read=False)
        cpu_in = host.get(input, write=False)
        work = self.gloo.alltoall_base(cpu_out, cpu_in, list(output_split_sizes),
                                       list(input_split_sizes), opts)
        return self._issued(host, self._done.submit(_gloo_job(work, host.finish), [output]))

    all_to_all_single = alltoall_base

    def gather(self, output_lists, inputs, opts=None):
        opts = opts if opts is not None else dist.GatherOptions()
        self._failures.raise_first(self.name)
        host = _Host(self, list(inputs) + [t for ts in output_lists for t in ts])
        cpu_in = [host.get(t, write=False) for t in inputs]
        cpu_out = [[host.get(t, read=False) for t in ts] for ts in output_lists]
        work = self.gloo.gather(cpu_out, cpu_in, opts)
        return self._issued(host, self._done.submit(_gloo_job(work, host.finish), output_lists))

    def scatter(self, outputs, input_lists, opts=None):
        opts = opts if opts is not None else dist.ScatterOptions()
        self._failures.raise_first(self.name)
        host = _Host(self, list(outputs) + [t for ts in input_lists for t in ts])
        cpu_out = [host.get(t, read=False) for t in outputs]
        cpu_in = [[host.get(t, write=False) for t in ts] for ts in input_lists]
        work = self.gloo.scatter(cpu_out, cpu_in, opts)
        return self._issued(host, self._done.submit(_gloo_job(work, host.finish), outputs))

    def send(self, tensors, dst: int, tag: int = 0):
        self._order()
        host = _Host(self, tensors)
        cpu = [host.get(t, write=False) for t in tensors]
        work = self.gloo.send(cpu, dst, tag)
        return self._issued(host, _p2p(_gloo_job(work, host.finish), tensors, self._timeout_s))

    def recv(self, tensors, src: int, tag: int = 0):
        self._order()
        host = _Host(self, tensors)
        cpu = [host.get(t, read=False) for t in tensors]
        work = self.gloo.recv(cpu, src, tag)
        return self._issued(host, _p2p(_gloo_job(work, host.finish), tensors, self._timeout_s))

    def recv_anysource(self, tensors, tag: int = 0):
        self._order()
        host = _Host(self, tensors)
        cpu = [host.get(t, read=False) for t in tensors]
        work = self.gloo.recv_anysource(cpu, tag)
        return self._issued(host, _p2p(_gloo_job(work, host.finish), tensors, self._timeout_s))

    def barrier(self, opts=None):
        self._failures.raise_first(self.name)
        return self.gloo.barrier(opts if opts is not None else dist.BarrierOptions())


def _p2p(run, result, timeout_s):
    """A send's or receive's completion, on a thread of its own: a receive
    waits for its peer, whose send may come only after collectives of this
    rank that must complete first (one thread for both would deadlock)."""
    thread = _Ordered("accelkit-p2p", join_s=2 * timeout_s)
    work = thread.submit(run, result)
    thread.end()
    return work


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
