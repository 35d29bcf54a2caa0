"""Device tensors between processes through torch.multiprocessing (docs/ipc.md),
tested from the outside through the user API only: queues and pipes of the
spawn and fork contexts, Event(interprocess=True), ipc_handle,
Event.from_ipc_handle, ipc_collect, and the test hook memory._ipc_state().

This process (initialized) is the producer for a spawned worker that runs
commands sent to it (one worker for the module: each start imports torch for
2-4 s), and the consumer of what the worker sends back. The fork context
runs in a fresh interpreter, which forks before it initializes the device
(as CUDA requires). The last test that uses the worker kills it. Values
come back as Python lists, never as CPU tensors, whose sharing would open
descriptors.
"""
import gc
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
import traceback
import warnings

import pytest
import torch
import torch.multiprocessing as mp
from multiprocessing.reduction import ForkingPickler

from backend import DEV, IS_SIMDEV, MOD, OPS, renamed, simdev_capacity


# simdev's runtime has the inter-process members; another backend says so.
HAS_IPC = IS_SIMDEV or OPS.ipc_has_memory()
needs_ipc = pytest.mark.skipif(
    not HAS_IPC, reason=f"{DEV}'s runtime has no inter-process memory members")


def _fds():
    return len(os.listdir("/proc/self/fd"))


def _settled():
    """Drops what the garbage collector holds and waits for the device."""
    gc.collect()
    torch.accelerator.synchronize(0)


def _resources():
    _settled()
    return {"ipc": MOD.memory._ipc_state(), "fds": _fds(),
            "allocated": MOD.memory_allocated(0), "driver_free": MOD.mem_get_info(0)[0]}


def _hold(gate_stream):
    """simdev's test knob: work queued on the stream waits until released;
    None elsewhere (the test then orders real asynchronous work)."""
    return torch.ops.simdev_driver.hold(gate_stream) if IS_SIMDEV else None


def _release_later(gate, ms):
    if gate is not None:
        torch.ops.simdev_driver.release_later(gate, ms)


# ------------------------------------------------------------- the worker
# Commands the worker runs (module functions, pickled by name). _KEPT holds
# what a command keeps alive for a later one.
_KEPT = {}
_CONN = []


def _serve(inbox, outbox, conn):
    torch.set_num_threads(1)
    _CONN.append(conn)
    while True:
        try:
            msg = inbox.get()  # opens what the message carries
            if msg is None:
                return
            fn, args = msg
            out = ("ok", fn(*args))
            del msg, args
        except BaseException:
            out = ("error", traceback.format_exc())
        outbox.put(out)
        del out


class _Worker:
    def __init__(self):
        ctx = mp.get_context("spawn")
        self.inbox, self.outbox = ctx.Queue(), ctx.Queue()
        self.conn, child_conn = ctx.Pipe()  # Connection.send pickles in the calling thread
        self.proc = ctx.Process(target=_serve, args=(self.inbox, self.outbox, child_conn),
                                daemon=True)
        self.proc.start()
        child_conn.close()

    def send(self, fn, *args):
        self.inbox.put((fn, args))

    def reply(self, timeout=120):
        deadline = time.monotonic() + timeout
        while True:
            try:
                status, out = self.outbox.get(timeout=1.0)
                break
            except Exception:  # queue.Empty
                if not self.proc.is_alive():
                    raise AssertionError(f"the worker exited ({self.proc.exitcode})") from None
                if time.monotonic() > deadline:
                    raise AssertionError(f"the worker did not answer in {timeout} s") from None
        if status == "error":
            raise AssertionError(f"in the worker:\n{out}")
        return out

    def call(self, fn, *args, timeout=120):
        self.send(fn, *args)
        return self.reply(timeout)

    def close(self):
        if self.proc.is_alive():
            self.inbox.put(None)
            self.proc.join(timeout=30)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        for q in (self.inbox, self.outbox):
            q.close()
            q.cancel_join_thread()
        self.conn.close()


@pytest.fixture(scope="module")
def worker():
    w = _Worker()
    yield w
    w.close()


def _values(t, n=None):
    return (t.flatten()[:n] if n else t).tolist()


def _read_then_double(t):
    before = _values(t)
    t.mul_(2)
    torch.accelerator.synchronize(0)
    return before


def _make_and_keep(name, n, value):
    _KEPT[name] = torch.full((n,), value, device=DEV)
    return _KEPT[name]


def _kept_values(name, n=None):
    torch.accelerator.synchronize(0)
    return _values(_KEPT[name], n)


def _keep(name, obj):
    _KEPT[name] = obj
    return None


def _drop(*names):
    for name in names:
        _KEPT.pop(name, None)
    _settled()
    return None


def _state():
    return _resources()


def _views(a, b, whole):
    same = a.untyped_storage().data_ptr() == whole.untyped_storage().data_ptr()
    out = {"offsets": (a.storage_offset(), b.storage_offset()),
           "b": (tuple(b.shape), b.stride()), "same_storage": same,
           "a_minus_whole": a.data_ptr() - whole.data_ptr(),
           "a": _values(a), "b_values": _values(b)}
    a.fill_(-1.0)  # through one view, seen through the other
    torch.accelerator.synchronize(0)
    out["whole_after"] = _values(whole[95:105])
    return out


def _two_tensors(p, q):
    opened_after = MOD.memory._ipc_state()["opened"]
    return {"delta": q.data_ptr() - p.data_ptr(), "opened": opened_after,
            "values": (_values(p, 2), _values(q, 2))}


def _types(param, storage, typed):
    t = torch.empty(0, dtype=torch.float32, device=storage.device).set_(storage)
    t.add_(100.0)  # written through the storage: the producer sees it
    torch.accelerator.synchronize(0)
    return {"param": (type(param).__name__, param.requires_grad, param.device.type,
                      round(param.sum().item(), 3)),
            "storage": (type(storage).__name__, storage.device.type, storage.nbytes()),
            "typed": (type(typed).__name__, typed.dtype, typed.device.type, typed.tolist())}


def _sum_of(t):
    return t.sum().item()


def _sum_from_conn():
    t = _CONN[0].recv()
    return t.sum().item()


def _open_event(h):
    e = h if isinstance(h, torch.Event) else MOD.Event.from_ipc_handle(0, h)
    _KEPT["event"] = e
    _KEPT["waiter"] = torch.full((4,), 1.0, device=DEV)
    _KEPT["twos"] = torch.full((4,), 2.0).pin_memory()
    s = torch.accelerator.current_stream(0)
    e.wait(s)                       # this process's stream waits for the other's record
    _KEPT["waiter"].copy_(_KEPT["twos"], non_blocking=True)  # queued behind the wait
    return {"query": e.query(), "stream_query": s.query()}


def _event_done():
    e = _KEPT["event"]
    e.synchronize()
    torch.accelerator.current_stream(0).synchronize()
    return {"query": e.query(), "waiter": _values(_KEPT["waiter"])}


def _receive_many(n):
    got = [_CONN[0].recv() for _ in range(n)]
    opened = MOD.memory._ipc_state()["opened"]
    fds = _fds()
    wrong = [i for i, t in enumerate(got) if t.shape != (64,) or t[0].item() != float(i)
             or t[-1].item() != float(i)]
    del got
    return {"wrong": wrong, "opened_holding": opened, "fds_holding": fds, **_resources()}


def _send_on_conn(n, value):
    t = torch.full((n,), value, device=DEV)
    _KEPT["unreceived"] = t
    _CONN[0].send(t)  # written to the pipe; the other side reads it later
    return os.getpid()


# ------------------------------------------------------------------ tests

@needs_ipc
def test_a_tensor_sent_to_a_spawned_process_is_the_same_memory_both_ways(worker):
    x = torch.arange(4096, dtype=torch.float32, device=DEV)
    assert worker.call(_read_then_double, x) == list(range(4096))
    assert torch.equal(x.cpu(), torch.arange(4096, dtype=torch.float32) * 2)  # its write

    y = worker.call(_make_and_keep, "y", 1000, 3.0)   # the other way: made there
    assert y.device.type == DEV and _values(y) == [3.0] * 1000
    y.add_(1.0)
    torch.accelerator.synchronize(0)
    assert worker.call(_kept_values, "y") == [4.0] * 1000  # our write, seen there
    del y
    worker.call(_drop, "y")


@needs_ipc
def test_views_keep_their_offsets_and_strides_over_one_shared_storage(worker):
    whole = torch.arange(10000, dtype=torch.float32, device=DEV)
    a = whole[100:200]
    b = whole[1000:2000].view(10, 100).t()
    out = worker.call(_views, a, b, whole)
    assert out["offsets"] == (100, 1000)
    assert out["b"] == ((100, 10), (1, 100))
    assert out["same_storage"] and out["a_minus_whole"] == 400
    assert out["a"] == list(range(100, 200))
    assert out["b_values"] == whole[1000:2000].view(10, 100).t().tolist()
    assert out["whole_after"] == [95.0, 96.0, 97.0, 98.0, 99.0, -1.0, -1.0, -1.0, -1.0, -1.0]
    assert _values(whole[95:105]) == out["whole_after"]


@needs_ipc
def test_tensors_of_one_segment_open_it_once_at_the_same_distance(worker):
    p = torch.full((256,), 1.0, device=DEV)
    q = torch.full((256,), 2.0, device=DEV)
    segments = [(s["address"], s["address"] + s["total_size"]) for s in MOD.memory_snapshot()
                if s["device"] == 0]
    seg_p = [s for s in segments if s[0] <= p.data_ptr() < s[1]]
    seg_q = [s for s in segments if s[0] <= q.data_ptr() < s[1]]
    assert seg_p and seg_p == seg_q, "the allocator put the two small tensors in two segments"
    before = worker.call(_state)["ipc"]["opened"]
    out = worker.call(_two_tensors, p, q)
    assert out["delta"] == q.data_ptr() - p.data_ptr()
    assert out["opened"] - before <= 1
    assert out["values"] == ([1.0, 1.0], [2.0, 2.0])


@needs_ipc
def test_parameters_and_storages_arrive_as_their_own_types(worker):
    torch.manual_seed(0)
    param = torch.nn.Parameter(torch.randn(8, 8, device=DEV))
    src = torch.arange(16, dtype=torch.float32, device=DEV)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # TypedStorage is deprecated
        typed = torch.arange(4, dtype=torch.float64, device=DEV).storage()
        out = worker.call(_types, param, src.untyped_storage(), typed)
    assert out["param"] == ("Parameter", True, DEV, round(param.sum().item(), 3))
    assert out["storage"] == ("UntypedStorage", DEV, 64)
    assert out["typed"] == ("TypedStorage", torch.float64, DEV, [0.0, 1.0, 2.0, 3.0])
    assert _values(src) == [100.0 + i for i in range(16)]


@needs_ipc
def test_writes_queued_before_the_send_are_seen_by_the_consumer(worker):
    n = 1 << 20
    side = torch.Stream(device=DEV)
    sevens, fives = torch.full((n,), 7.0).pin_memory(), torch.full((n,), 5.0).pin_memory()
    # A pipe pickles in the calling thread: the event is recorded on the
    # current stream there, the side stream.
    x = torch.zeros(n, device=DEV)
    _settled()
    gate = _hold(side)
    _release_later(gate, 300)  # from a thread of the driver's, after the send
    with MOD.stream(side):
        x.copy_(sevens, non_blocking=True)  # queued behind the held stream
        worker.conn.send(x)
    assert worker.call(_sum_from_conn) == 7.0 * n
    # A queue pickles in its feeder thread, on the default stream: as on
    # CUDA, that stream waits for the side stream before put().
    y = torch.zeros(n, device=DEV)
    _settled()
    gate = _hold(side)
    _release_later(gate, 300)
    with MOD.stream(side):
        y.copy_(fives, non_blocking=True)
    torch.accelerator.current_stream(0).wait_stream(side)
    assert worker.call(_sum_of, y) == 5.0 * n


@needs_ipc
def test_an_interprocess_event_orders_another_processs_stream(worker):
    with pytest.raises(ValueError, match=DEV):
        MOD.Event(interprocess=True, enable_timing=True)
    side = torch.Stream(device=DEV)
    e = MOD.Event(interprocess=True)
    handle = e.ipc_handle()
    assert isinstance(handle, bytes) and handle
    for sent in (handle, e):  # its handle's bytes, then the event itself through the queue
        gate = _hold(side)
        e.record(side)
        if gate is not None:
            assert worker.call(_open_event, sent) == {"query": False, "stream_query": False}
            torch.ops.simdev_driver.release(gate)
        else:
            worker.call(_open_event, sent)
        assert worker.call(_event_done) == {"query": True, "waiter": [2.0] * 4}
        worker.call(_drop, "event", "waiter", "twos")


@needs_ipc
def test_a_thousand_small_tensors_sent_and_released_leave_nothing_behind(worker):
    n = 1000
    warm = torch.ones(64, device=DEV)  # the first send opens what stays open (a ref file)
    worker.call(_sum_of, warm)
    del warm
    MOD.ipc_collect()
    MOD.empty_cache()
    start, w_start = _resources(), worker.call(_state)
    free_start = MOD.mem_get_info(0)[0]
    reserved_start = MOD.memory_reserved(0)

    sent = [torch.full((64,), float(i), device=DEV) for i in range(n)]
    worker.send(_receive_many, n)
    for t in sent:
        worker.conn.send(t)
    del t
    out = worker.reply()
    assert out["wrong"] == []
    assert out["opened_holding"] >= 1
    del sent
    MOD.ipc_collect()
    end = _resources()
    MOD.empty_cache()
    assert end["ipc"] == start["ipc"], (start, end)
    assert end["fds"] == start["fds"]
    assert end["allocated"] == start["allocated"]
    assert MOD.memory_reserved(0) == reserved_start
    assert MOD.mem_get_info(0)[0] == free_start
    # The consumer: every segment it opened closed, its descriptors back.
    assert out["ipc"] == w_start["ipc"], (w_start, out)
    assert out["fds"] == w_start["fds"]
    assert out["allocated"] == w_start["allocated"]
    assert out["driver_free"] == w_start["driver_free"]


@needs_ipc
@simdev_capacity
def test_memory_a_consumer_released_is_reclaimed_when_the_device_is_full(worker):
    MOD.ipc_collect()
    MOD.empty_cache()
    start = MOD.memory._ipc_state()["sent"]
    room = MOD.mem_get_info(0)[0]
    n = int(room * 0.6) // 4
    big = torch.empty(n, device=DEV)
    worker.call(_keep, "big", big)
    del big
    worker.call(_drop, "big")  # released there; nothing here has collected it yet
    assert MOD.memory._ipc_state()["sent"] == start + 1
    again = torch.empty(n, device=DEV)  # no room beside it: the allocator reclaims it first
    assert MOD.memory._ipc_state()["sent"] == start
    del again
    MOD.empty_cache()


_FORK = """
import os, traceback
import torch, torch_simdev
import torch.multiprocessing as mp

def child(to_child, to_parent):
    try:
        x = to_child.get(timeout=60)                 # made by the parent after the fork
        to_parent.put(("read", x[:4].tolist()))
        x.add_(1.0)
        torch.accelerator.synchronize(0)
        to_parent.put(("wrote", None))
        y = torch.full((1024,), 5.0, device='simdev')
        to_parent.put(("y", y))
        assert to_child.get(timeout=60) == "check y"
        to_parent.put(("y seen", y[:4].tolist()))
        z = torch.full((8,), 9.0, device='simdev')
        to_parent.put(("z", z))                      # opened only after this process exited
    except BaseException:
        to_parent.put(("error", traceback.format_exc()))
    to_parent.close()
    to_parent.join_thread()

ctx = mp.get_context('fork')
assert not torch.simdev.is_initialized()
to_child, to_parent = ctx.Queue(), ctx.Queue()
p = ctx.Process(target=child, args=(to_child, to_parent))
p.start()
x = torch.arange(1024, dtype=torch.float32, device='simdev')
start = torch.simdev.memory._ipc_state()
to_child.put(x)
print('child read', to_parent.get(timeout=60))
print('child wrote', to_parent.get(timeout=60)[0], x[:4].tolist())
_, y = to_parent.get(timeout=60)
print('y', y[:4].tolist())
y.mul_(2.0)
torch.accelerator.synchronize(0)
to_child.put("check y")
print('y seen by child', to_parent.get(timeout=60))
p.join(timeout=60)
print('child exit', p.exitcode)
try:
    z = to_parent.get(timeout=60)
    print('z', z[1][:4].tolist())
except RuntimeError as e:
    print('z error', str(e).replace(chr(10), ' '))
print('y after exit', y[:4].tolist())
del x, y
torch.simdev.ipc_collect()
print('sent', torch.simdev.memory._ipc_state()['sent'], start['sent'], 'child pid', p.pid)
"""


@needs_ipc
def test_fork_both_ways_and_a_producer_that_exits_first():
    r = subprocess.run([sys.executable, "-c", renamed(textwrap.dedent(_FORK))],
                       capture_output=True, text=True, timeout=180,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    out = r.stdout
    assert r.returncode == 0, out + r.stderr
    assert "child read ('read', [0.0, 1.0, 2.0, 3.0])" in out, out + r.stderr
    assert "child wrote wrote [1.0, 2.0, 3.0, 4.0]" in out, out
    assert "y [5.0, 5.0, 5.0, 5.0]" in out, out
    assert "y seen by child ('y seen', [10.0, 10.0, 10.0, 10.0])" in out, out
    assert "child exit 0" in out, out
    pid = out.split("child pid ")[1].split()[0]
    # Memory opened before the producer exited stays readable; a handle
    # opened after is a clear error naming the backend and the producer.
    assert "y after exit [10.0, 10.0, 10.0, 10.0]" in out, out
    z = [line for line in out.splitlines() if line.startswith("z ")][0]
    assert z.startswith("z error") and DEV in z and pid in z, z
    sent = out.split("sent ")[1].split()
    assert sent[0] == sent[1], out  # the child's death released the parent's tensor


@needs_ipc
def test_a_killed_process_releases_what_it_opened_and_what_it_sent_stays_readable(worker):
    """Last: kills the module's worker."""
    MOD.ipc_collect()
    start = _resources()
    big = torch.full((1 << 20,), 3.0, device=DEV)  # 4 MiB: a segment of its own
    worker.call(_keep, "big", big)                  # the worker holds our memory
    w = worker.call(_make_and_keep, "w", 4096, 6.0)  # and we hold its memory
    pid = worker.call(_send_on_conn, 16, 8.0)        # a handle we open after its death
    del big
    MOD.ipc_collect()
    assert MOD.memory_allocated(0) > start["allocated"]  # kept while the worker holds it
    os.kill(worker.proc.pid, signal.SIGKILL)
    worker.proc.join(timeout=30)
    assert worker.proc.exitcode == -signal.SIGKILL
    MOD.ipc_collect()
    assert MOD.memory_allocated(0) == start["allocated"]
    assert MOD.memory._ipc_state()["sent"] == start["ipc"]["sent"]
    assert _values(w) == [6.0] * 4096                 # opened before the death: still ours
    with pytest.raises(RuntimeError, match=rf"{DEV}.*{pid}"):
        worker.conn.recv()
    del w
    assert _resources()["ipc"]["opened"] == start["ipc"]["opened"]


@pytest.mark.skipif(not IS_SIMDEV, reason="expandable segments need the virtual-memory members "
                                           "(simdev's)")
def test_memory_in_expandable_segments_is_refused_naming_the_setting():
    torch._C._accelerator_setAllocatorSettings("expandable_segments:True")
    try:
        x = torch.ones(1 << 21, device=DEV)  # 8 MiB: a large, expandable segment
        payload = ForkingPickler.dumps(x)    # the refusal travels to the receiver
    finally:
        torch._C._accelerator_setAllocatorSettings("expandable_segments:False")
    with pytest.raises(RuntimeError, match=f"{DEV}: the storage at .* is in an expandable "
                                           "segment.*expandable_segments:False"):
        pickle.loads(payload)
    del x
    MOD.empty_cache()
    y = torch.ones(1 << 21, device=DEV)      # the setting off again: shared
    assert pickle.loads(ForkingPickler.dumps(y)).data_ptr() == y.data_ptr()


def test_a_backend_without_ipc_refuses_with_a_clear_error():
    if HAS_IPC:
        pytest.skip(f"{DEV} shares device memory between processes (the other tests)")
    q = mp.get_context("spawn").Queue()
    q.put(torch.ones(3, device=DEV))
    with pytest.raises(RuntimeError, match=f"{DEV}: a {DEV} tensor .*cannot be shared between "
                                           f"processes: {DEV} has no inter-process memory"):
        q.get(timeout=30)
    with pytest.raises(RuntimeError, match=f"{DEV}: .*has no inter-process"):
        pickle.loads(ForkingPickler.dumps(torch.ones(3, device=DEV).untyped_storage()))
