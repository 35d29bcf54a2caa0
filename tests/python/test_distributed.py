"""torch.distributed on simdev tensors (accelkit.distributed: Note [Collectives
on gloo]): every collective between two processes against expected values,
stream order, async work, the errors, and a rank that dies mid-collective.
Runs in the memory mode of the environment (SIMDEV_HOST_VISIBLE; ctest runs
both). Each process uses simdev:<rank>."""
import os

import pytest

if os.environ.get("ACCELKIT_TEST_BACKEND", "simdev") != "simdev":
    # simdev's devices and test knobs (a held stream, SIMDEV_VISIBLE_DEVICES per rank).
    pytest.skip("the distributed tests run on simdev", allow_module_level=True)

import datetime
import multiprocessing
import sys
import threading
import time
import traceback

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

import torch_simdev  # noqa: F401

WORLD = 2
pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed unavailable")


def _init(store_path, rank, world=WORLD, timeout_s=20, backend="cpu:gloo,simdev:simdev"):
    store = dist.FileStore(store_path, world)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))


def _entry(fn, rank, store_path, queue, args):
    try:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        torch.simdev.set_device(rank % torch.simdev.device_count())
        out = fn(rank, store_path, *args)
        queue.put((rank, "ok", out))
    except BaseException:  # reported to the test, which fails naming it
        queue.put((rank, "error", traceback.format_exc()))
    finally:
        queue.close()
        queue.join_thread()  # the result is out before the group goes
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:
                pass


def _spawn(fn, tmp_path, args=(), timeout=90, world=WORLD):
    """Runs fn(rank, store_path, *args) in `world` fresh processes; returns
    {rank: result}, failing with each process's traceback."""
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    store_path = str(tmp_path / "store")
    procs = [ctx.Process(target=_entry, args=(fn, r, store_path, queue, args)) for r in range(world)]
    for p in procs:
        p.start()
    results, errors = {}, []
    deadline = time.monotonic() + timeout
    try:
        while len(results) + len(errors) < world:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"distributed workers did not finish in {timeout} s "
                                     f"(results from ranks {sorted(results)})")
            try:
                rank, status, out = queue.get(timeout=min(left, 1.0))
            except Exception:
                if all(not p.is_alive() for p in procs) and queue.empty():
                    codes = [p.exitcode for p in procs]
                    raise AssertionError(f"workers exited without a result: {codes}") from None
                continue
            if status == "ok":
                results[rank] = out
            else:
                errors.append(f"rank {rank}:\n{out}")
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    assert not errors, "\n".join(errors)
    return results


def _rank0_with_rank1_dying(fn, tmp_path, args=(), timeout=90):
    """Runs fn(rank, store_path, *args) in two fresh processes, rank 1 of
    which exits without a result; returns rank 0's result and both exit
    codes."""
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    store_path = str(tmp_path / "store")
    procs = [ctx.Process(target=_entry, args=(fn, r, store_path, queue, args)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        rank, status, out = queue.get(timeout=timeout)
    finally:
        for p in procs:
            p.join(timeout=20)
            if p.is_alive():
                p.kill()
    assert (rank, status) == (0, "ok"), out
    return out, [p.exitcode for p in procs]


# ---------------------------------------------------------------- collectives
def _collectives(rank, store_path):
    _init(store_path, rank)
    dev = torch.device("simdev", rank)
    n = 1000
    base = torch.arange(n, dtype=torch.float32)

    def on(t):
        return t.to(dev)

    # all_reduce, every op (float and integer)
    vals = [base + 1, base * 2 + 1]  # rank 0, rank 1
    expect = {ReduceOp.SUM: vals[0] + vals[1], ReduceOp.PRODUCT: vals[0] * vals[1],
              ReduceOp.MIN: torch.minimum(*vals), ReduceOp.MAX: torch.maximum(*vals),
              ReduceOp.AVG: (vals[0] + vals[1]) / 2}
    for op, want in expect.items():
        x = on(vals[rank])
        dist.all_reduce(x, op=op)
        assert x.device == dev
        torch.testing.assert_close(x.cpu(), want, msg=f"all_reduce {op}")
    ints = [torch.tensor([0b1100, 7, 5], dtype=torch.int64), torch.tensor([0b1010, 2, -5], dtype=torch.int64)]
    for op, want in {ReduceOp.BAND: ints[0] & ints[1], ReduceOp.BOR: ints[0] | ints[1],
                     ReduceOp.BXOR: ints[0] ^ ints[1],
                     ReduceOp.AVG: torch.div(ints[0] + ints[1], 2, rounding_mode="trunc")}.items():
        x = on(ints[rank])
        dist.all_reduce(x, op=op)
        assert torch.equal(x.cpu(), want), (op, x.cpu(), want)
    # bool MAX (logical or)
    x = on(torch.tensor([rank == 0, False, True]))
    dist.all_reduce(x, op=ReduceOp.MAX)
    assert x.cpu().tolist() == [True, False, True]

    # a non-contiguous tensor (staged even on host-visible memory)
    m = on(torch.arange(12, dtype=torch.float32).reshape(3, 4) * (rank + 1))
    col = m[:, 1]
    dist.all_reduce(col)
    assert col.cpu().tolist() == [3.0 * v for v in (1, 5, 9)]
    assert m.cpu()[:, 0].tolist() == [(rank + 1) * v for v in (0, 4, 8)]  # untouched

    # broadcast from rank 1
    x = on(base * 3) if rank == 1 else torch.zeros(n, device=dev)
    dist.broadcast(x, src=1)
    torch.testing.assert_close(x.cpu(), base * 3)

    # reduce to rank 1
    x = on(vals[rank])
    dist.reduce(x, dst=1, op=ReduceOp.SUM)
    if rank == 1:
        torch.testing.assert_close(x.cpu(), vals[0] + vals[1])

    # all_gather (list) and all_gather_into_tensor
    mine = on(torch.full((5,), float(rank + 1)))
    outs = [torch.empty(5, device=dev) for _ in range(WORLD)]
    dist.all_gather(outs, mine)
    assert [o.cpu().tolist() for o in outs] == [[1.0] * 5, [2.0] * 5]
    flat = torch.empty(10, device=dev)
    dist.all_gather_into_tensor(flat, mine)
    assert flat.cpu().tolist() == [1.0] * 5 + [2.0] * 5

    # reduce_scatter_tensor (SUM and AVG)
    inp = on(torch.arange(8, dtype=torch.float32) * (rank + 1))
    out = torch.empty(4, device=dev)
    dist.reduce_scatter_tensor(out, inp)
    assert out.cpu().tolist() == [3.0 * v for v in range(rank * 4, rank * 4 + 4)]
    dist.reduce_scatter_tensor(out, inp, op=ReduceOp.AVG)
    assert out.cpu().tolist() == [1.5 * v for v in range(rank * 4, rank * 4 + 4)]

    # all_to_all_single, even and uneven splits
    inp = on(torch.arange(4, dtype=torch.float32) + 10 * rank)
    out = torch.empty(4, device=dev)
    dist.all_to_all_single(out, inp)
    assert out.cpu().tolist() == ([0.0, 1.0, 10.0, 11.0] if rank == 0 else [2.0, 3.0, 12.0, 13.0])
    in_splits = [1, 3] if rank == 0 else [2, 2]
    out_splits = [1, 2] if rank == 0 else [3, 2]
    out = torch.empty(sum(out_splits), device=dev)
    dist.all_to_all_single(out, inp, out_splits, in_splits)
    want = [0.0, 10.0, 11.0] if rank == 0 else [1.0, 2.0, 3.0, 12.0, 13.0]
    assert out.cpu().tolist() == want

    # send / recv (and isend / irecv)
    if rank == 0:
        dist.send(on(base + 7), dst=1)
        got = torch.empty(n, device=dev)
        dist.recv(got, src=1)
        torch.testing.assert_close(got.cpu(), base - 7)
    else:
        got = torch.empty(n, device=dev)
        dist.recv(got, src=0)
        torch.testing.assert_close(got.cpu(), base + 7)
        dist.send(on(base - 7), dst=0)
    peer = 1 - rank
    ops = [dist.P2POp(dist.isend, on(torch.full((3,), float(rank))), peer),
           dist.P2POp(dist.irecv, torch.empty(3, device=dev), peer)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    assert ops[1].tensor.cpu().tolist() == [float(peer)] * 3
    # The receive first on both ranks: staged, the send does not wait for
    # the receive, which waits for the peer's send (Note [Collectives in
    # issue order]); a send of the tensor being received does wait for it
    # (rank 0 forwards what it received: 2 back to rank 1, which sums), and
    # a later all_reduce of the received tensor sees what came in.
    t0 = time.monotonic()
    got = torch.empty(3, device=dev)
    ops = [dist.P2POp(dist.irecv, got, peer),
           dist.P2POp(dist.isend, on(torch.full((3,), float(rank + 1))), peer)]
    works = dist.batch_isend_irecv(ops)
    if rank == 0:
        works.append(dist.isend(got, dst=1))  # after the receive into it
    else:
        back = torch.empty(3, device=dev)
        works.append(dist.irecv(back, src=0))
    reduced = dist.all_reduce(got, async_op=True)  # after the receive
    for w in works + [reduced]:
        w.wait()
    took = time.monotonic() - t0
    assert took < 10, f"irecv before isend on both ranks took {took:.1f} s"
    if rank == 1:
        assert back.cpu().tolist() == [2.0] * 3, back.cpu()  # rank 0 forwarded rank 1's 2
    assert got.cpu().tolist() == [3.0] * 3, got.cpu()  # 2 + 1

    # async_op work objects: wait, is_completed, the future's value
    x = on(vals[rank])
    work = dist.all_reduce(x, async_op=True)
    work.wait()  # the stream waits (Note [wait() on the stream]): x.cpu() comes after
    torch.testing.assert_close(x.cpu(), vals[0] + vals[1])
    assert work.is_completed()
    y = on(vals[rank])
    fut = dist.all_reduce(y, async_op=True).get_future()
    res = fut.wait()
    torch.testing.assert_close(res[0].cpu(), vals[0] + vals[1])

    # Back to back, async, on one tensor: the second sees what the first
    # wrote, as c10d promises (Note [Collectives in issue order]; staged, the
    # second's copy to the host was read before the first's results came
    # back). Rank 1 joins late, so the first is still running when rank 0
    # issues the second.
    # (The ranks' agreement check, a blocking exchange on gloo, would order
    # them by itself: off here, as for speed.)
    _group().check_agreement = False
    z = on(torch.full((4096,), float(rank + 1)))
    if rank == 1:
        time.sleep(0.5)
    first = dist.all_reduce(z, async_op=True)
    second = dist.all_reduce(z, async_op=True)
    first.wait()
    second.wait()
    assert z.cpu().unique().tolist() == [6.0], z.cpu().unique()
    # An AVG on gloo, then a SUM of the same tensor: the SUM reduces the
    # averages (AVG's division runs on the completion thread, after gloo's
    # sum: on host-visible memory, where gloo works in place, the SUM must
    # still wait for it). Repeated: the race was lost about half the time.
    pg, native = _group(), _group().native
    pg.native = None  # the library divides inside its own collective
    try:
        wrong = []
        for i in range(10):
            a = on(torch.full((1 << 18,), float(rank + 1) * 2))  # 2, 4 -> 3 -> 6
            avg = dist.all_reduce(a, op=ReduceOp.AVG, async_op=True)
            total = dist.all_reduce(a, op=ReduceOp.SUM, async_op=True)
            avg.wait()
            total.wait()
            if a.cpu().unique().tolist() != [6.0]:
                wrong.append((i, a.cpu().unique().tolist()))
    finally:
        pg.native = native
    _group().check_agreement = True
    assert not wrong, f"AVG then SUM on one tensor: {wrong}"

    # CPU tensors through the same group
    c = torch.full((4,), float(rank + 1))
    dist.all_reduce(c)
    assert c.tolist() == [3.0] * 4
    dist.barrier()
    _stream_order(rank)
    _start_does_not_block(rank)
    _stream_side_wait(rank)
    _wait_holding_the_gil(rank)
    _native_slot(rank)
    return "done"


def _group():
    """The backend's process group (accelkit.distributed.ProcessGroup: c10d
    keeps a Python group as the default group itself)."""
    pg = dist.distributed_c10d._get_default_group()
    assert isinstance(pg, torch_simdev._accelkit.distributed.ProcessGroup), type(pg)
    return pg


def _native_slot(rank):
    """simdev's own all_reduce through the vendor collective slot (Note [The
    vendor collective slot]): the float reductions it implements run there
    (its own counter moves), with the bits gloo gives for the same inputs;
    the others fall back to gloo (the counter stays)."""
    pg = _group()
    native = pg.native
    assert native is not None, "simdev's collective library was not connected"
    dev = torch.device("simdev", rank)
    gen = torch.Generator().manual_seed(rank)
    # 1.5 M floats: two chunks of the 4 MiB slots; a small float64 one too.
    cases = [(torch.randn(3 << 19, generator=gen), ReduceOp.SUM),
             (torch.randn(3 << 19, generator=gen), ReduceOp.AVG),
             (torch.randn(1000, generator=gen, dtype=torch.float64), ReduceOp.MAX),
             (torch.randn(1000, generator=gen), ReduceOp.MIN)]
    for values, op in cases:
        before = native.reductions()
        x = values.to(dev)
        dist.all_reduce(x, op=op)
        torch.accelerator.synchronize(dev)  # the stream waited for it: done by now
        assert native.reductions() == before + 1, f"{op} {values.dtype} did not run natively"
        pg.native = None  # the same on gloo, on both ranks
        try:
            y = values.to(dev)
            dist.all_reduce(y, op=op)
        finally:
            pg.native = native
        assert torch.equal(x.cpu(), y.cpu()), f"native {op} differs from gloo's"
    _native_collectives(rank, pg, native, dev)
    # async, and a CPU tensor through the same group
    x = torch.full((4096,), float(rank + 1), device=dev)
    work = dist.all_reduce(x, async_op=True)
    work.wait()
    assert x.cpu().unique().tolist() == [3.0]
    c = torch.full((10,), float(rank + 1))
    before = native.reductions()
    dist.all_reduce(c)
    assert c.tolist() == [3.0] * 10 and native.reductions() == before + 1
    # A native all_reduce, then a broadcast on gloo of the same tensor: the
    # broadcast sends the reduced values, as if one engine ran both (Note
    # [Collectives in issue order]); rank 1 joins late, so the native one is
    # still waiting when rank 0 issues the broadcast.
    # (Unchecked: the agreement check's blocking exchange would order them.)
    pg.check_agreement = False
    x = torch.full((1 << 16,), float(rank + 1), device=dev)
    if rank == 1:
        time.sleep(0.5)
    reduced = dist.all_reduce(x, async_op=True)
    sent = dist.broadcast(x, src=0, async_op=True)
    reduced.wait()
    sent.wait()
    pg.check_agreement = True
    assert x.cpu().unique().tolist() == [3.0], x.cpu().unique()
    # what it does not implement: gloo, right, the counter unmoved
    before = native.reductions()
    for t, op, want in [(torch.full((8,), rank + 2, dtype=torch.int64), ReduceOp.SUM, 5),
                        (torch.full((8,), float(rank + 2)), ReduceOp.PRODUCT, 6.0),
                        (torch.full((8,), float(rank + 2), dtype=torch.bfloat16), ReduceOp.SUM, 5.0)]:
        x = t.to(dev)
        dist.all_reduce(x, op=op)
        assert x.cpu().tolist() == [want] * 8, (op, t.dtype, x.cpu())
    assert native.reductions() == before
    # A collective on gloo completes on the group's own thread, never
    # running Python on one of gloo's (Note [Completion on a thread of the
    # group's own]): rank 1 joins only once rank 0 has chained the callback
    # (the store says when), so rank 0's work completes after that.
    # (Unchecked: the agreement check's blocking exchange would wait for
    # rank 1, which waits for rank 0's callback.)
    pg.check_agreement = False
    store = dist.distributed_c10d._get_default_store()
    y = torch.full((1000,), float(rank), device=dev, dtype=torch.int64)
    if rank == 1:
        store.get("completion_thread")
    work = dist.all_reduce(y, async_op=True)
    ran_on = []
    chained = work.get_future().then(lambda f: ran_on.append(threading.current_thread().name))
    if rank == 0:
        store.set("completion_thread", "rank 0 chained its callback")
    work.wait()
    chained.wait()
    pg.check_agreement = True
    assert y.cpu().unique().tolist() == [1]
    if rank == 0:
        assert ran_on == ["accelkit-completion"], ran_on
    # destroy_process_group ends the group's threads (none left at exit)
    dist.destroy_process_group()
    assert pg.native is None
    left = [t.name for t in threading.enumerate() if t.name.startswith("accelkit-")]
    assert not left, left


class _Refusing:
    """A vendor library whose supports() refuses `collective` (the rest of
    it the real one's)."""

    def __init__(self, ops, collective):
        self._ops, self._collective = ops, collective

    def __getattr__(self, member):
        return getattr(self._ops, member)

    def supports(self, collective, op, dtype):
        return collective != self._collective and self._ops.supports(collective, op, dtype)


def _native_collectives(rank, pg, native, dev):
    """The collectives other than all_reduce that simdev's library
    implements (Note [simdev's shared-memory collectives]: reduce,
    broadcast, all_gather in both forms, reduce_scatter_tensor,
    all_to_all_single with even and uneven splits, barrier) go through the
    slot: each moves its own counter by one and gives gloo's results for the
    same inputs; what it refuses (an integer reduce_scatter, or a collective
    its supports() refuses) runs on gloo, the counter unmoved."""
    n = 3 << 19  # 6 MiB of float32: two steps of the 4 MiB slots
    mine = torch.randn(n, generator=torch.Generator().manual_seed(10 + rank))
    theirs = [torch.randn(n, generator=torch.Generator().manual_seed(10 + r)) for r in range(WORLD)]

    def both(name, run):
        """run() through the slot (its counter moves by one), then on gloo;
        both results on the CPU."""
        before = native.count(name)
        a = run()
        torch.accelerator.synchronize(dev)
        assert native.count(name) == before + 1, f"{name} did not run natively"
        pg.native = None  # the same on gloo, on both ranks
        try:
            b = run()
        finally:
            pg.native = native
        return a, b

    def bcast(values):
        def run():
            x = values.to(dev) if rank == 1 else torch.zeros_like(values, device=dev)
            dist.broadcast(x, src=1)
            return x.cpu()
        return run
    a, b = both("broadcast", bcast(theirs[1]))
    assert torch.equal(a, theirs[1]) and torch.equal(a, b)
    ints = torch.arange(1000, dtype=torch.int64) * 7  # any dtype: bytes
    a, b = both("broadcast", bcast(ints))
    assert torch.equal(a, ints) and torch.equal(b, ints)

    def reduce():
        x = mine.to(dev)
        dist.reduce(x, dst=0, op=ReduceOp.SUM)
        return x.cpu()
    a, b = both("reduce", reduce)
    if rank == 0:
        assert torch.equal(a, b) and torch.equal(a, theirs[0] + theirs[1])
    else:
        assert torch.equal(a, mine)  # a reduce leaves the others' tensors

    def gather_list():
        outs = [torch.empty(n, device=dev) for _ in range(WORLD)]
        dist.all_gather(outs, mine.to(dev))
        return torch.stack([o.cpu() for o in outs])
    a, b = both("all_gather", gather_list)
    assert torch.equal(a, b) and torch.equal(a, torch.stack(theirs))

    def gather_flat():
        out = torch.empty(WORLD * n, device=dev)
        dist.all_gather_into_tensor(out, mine.to(dev))
        return out.cpu()
    a, b = both("all_gather", gather_flat)
    assert torch.equal(a, b) and torch.equal(a, torch.cat(theirs))

    for op in (ReduceOp.SUM, ReduceOp.AVG, ReduceOp.MAX):
        def scatter():
            out = torch.empty(n // WORLD, device=dev)
            dist.reduce_scatter_tensor(out, mine.to(dev), op=op)
            return out.cpu()
        a, b = both("reduce_scatter", scatter)
        assert torch.equal(a, b), f"native reduce_scatter {op} differs from gloo's"
    half = slice(rank * n // WORLD, (rank + 1) * n // WORLD)
    torch.testing.assert_close(a, torch.maximum(theirs[0][half], theirs[1][half]))

    def a2a(inp, out_rows, out_splits=None, in_splits=None):
        def run():
            out = torch.empty((out_rows,) + tuple(inp.shape[1:]), device=dev)
            dist.all_to_all_single(out, inp.to(dev), out_splits, in_splits)
            return out.cpu()
        return run
    rows = mine.view(-1, 8)  # rows of 8: two steps per pair
    a, b = both("all_to_all", a2a(rows, rows.size(0)))
    half = rows.size(0) // 2
    assert torch.equal(a, b) and torch.equal(a, torch.cat(
        [t.view(-1, 8)[rank * half:(rank + 1) * half] for t in theirs]))
    small = torch.arange(4, dtype=torch.float32) + 10 * rank
    a, b = both("all_to_all", a2a(small, 3 if rank == 0 else 5, [1, 2] if rank == 0 else [3, 2],
                                  [1, 3] if rank == 0 else [2, 2]))
    assert torch.equal(a, b) and a.tolist() == ([0.0, 10.0, 11.0] if rank == 0
                                                else [1.0, 2.0, 3.0, 12.0, 13.0])

    before = native.count("barrier")
    dist.barrier()
    assert native.count("barrier") == before + 1

    # Refused: gloo, right, the counter unmoved.
    before = native.count("reduce_scatter")
    out = torch.empty(4, device=dev, dtype=torch.int64)
    dist.reduce_scatter_tensor(out, torch.arange(8, device=dev, dtype=torch.int64) * (rank + 1))
    assert out.cpu().tolist() == [3 * v for v in range(rank * 4, rank * 4 + 4)]
    assert native.count("reduce_scatter") == before
    real = native.ops
    native.ops, native._answers = _Refusing(real, "broadcast"), {}
    try:
        before = native.count("broadcast")
        a = bcast(theirs[1])()
        assert torch.equal(a, theirs[1]) and native.count("broadcast") == before
    finally:
        native.ops, native._answers = real, {}


def test_collectives_two_ranks(tmp_path):
    """Every collective, then one queued behind a held stream, then the
    native collective of the vendor slot (one process pair for all:
    starting one costs seconds)."""
    assert _spawn(_collectives, tmp_path) == {0: "done", 1: "done"}


# --------------------------------------------------------------- stream order
def _stream_order(rank):
    """The collective starts after the work queued on the current stream:
    hold a side stream, queue a write on it, release it later; the
    all_reduce must see the write."""
    dev = torch.device("simdev", rank)
    s = torch.simdev.Stream(dev)
    x = torch.zeros(1 << 16, device=dev)
    src = torch.full((1 << 16,), float(rank + 1)).pin_memory()
    torch.accelerator.synchronize(dev)
    with torch.simdev.stream(s):
        gate = torch.ops.simdev_driver.hold(s)
        x.copy_(src, non_blocking=True)  # queued behind the gate
        assert not s.query()
        torch.ops.simdev_driver.release_later(gate, 300)
        dist.all_reduce(x)
        x.mul_(2)  # after the collective, on the same stream
    torch.accelerator.synchronize(dev)
    assert x.cpu().unique().tolist() == [6.0], x.cpu().unique()


def _start_does_not_block(rank):
    """The start does not block the calling thread (Note [The start on the
    group's thread]): with the current stream held and a write queued on
    it, all_reduce returns while the stream is still held, on gloo and
    through the vendor slot, and the collective sees the write once the
    stream is released (staged: the copy to pinned memory comes after it
    too). A start that blocked would return only when the timer releases
    the stream, 10 s later."""
    pg = _group()
    native = pg.native
    dev = torch.device("simdev", rank)
    n = 1 << 16
    for slot, async_op in ((False, False), (True, True), (False, True)):
        pg.native = native if slot else None
        before = native.reductions()
        s = torch.simdev.Stream(dev)
        x = torch.zeros(n, device=dev)
        src = torch.full((n,), float(rank + 1)).pin_memory()
        torch.accelerator.synchronize(dev)
        released = threading.Event()
        with torch.simdev.stream(s):
            gate = torch.ops.simdev_driver.hold(s)
            x.copy_(src, non_blocking=True)  # queued behind the gate

            def release():
                if not released.is_set():
                    released.set()
                    torch.ops.simdev_driver.release(gate)
            timer = threading.Timer(10.0, release)
            timer.start()
            t0 = time.monotonic()
            work = dist.all_reduce(x, async_op=async_op)
            if async_op:
                work.wait()  # the stream waits: returns too
            took = time.monotonic() - t0
            held = not released.is_set() and not s.query()
            timer.cancel()
            release()
        torch.accelerator.synchronize(dev)
        pg.native = native
        assert held, f"all_reduce (slot {slot}, async {async_op}) returned only after the " \
                     f"stream was released ({took:.1f} s)"
        assert x.cpu().unique().tolist() == [3.0], (slot, async_op, x.cpu().unique())
        assert native.reductions() == before + int(slot), (slot, native.reductions(), before)


def _stream_side_wait(rank):
    """wait() makes the current stream wait for the collective and returns
    without blocking the calling thread (Note [wait() on the stream]): rank
    1 joins the all_reduce only once rank 0's wait() has returned, so a
    wait() that blocked would never return (the group's timeout would fail
    it). Work queued on the stream after the wait, a copy out and a copy in
    (queued copies of pinned memory, which block nothing), runs after the
    collective: the copy out reads the reduced values, and the collective
    does not overwrite the copy in."""
    pg = _group()
    pg.check_agreement = False  # its blocking exchange would wait for rank 1
    assert pg.stream_wait  # the default (ACCELKIT_STREAM_WAIT=0 turns it off)
    store = dist.distributed_c10d._get_default_store()
    dev = torch.device("simdev", rank)
    n = 1 << 16
    x = torch.full((n,), float(rank + 1), device=dev)
    if rank == 0:
        out = torch.empty(n).pin_memory()
        src = torch.full((n,), 7.0).pin_memory()
        work = dist.all_reduce(x, async_op=True)
        work.wait()
        returned = not work.is_completed()
        stream_busy = not torch.accelerator.current_stream(dev).query()
        out.copy_(x, non_blocking=True)
        x.copy_(src, non_blocking=True)
        store.set("stream_side_wait", "rank 0's wait() returned")
        torch.accelerator.synchronize(dev)
        assert returned and stream_busy, (returned, stream_busy)
        assert work.is_completed() and work.is_success()
        assert out.unique().tolist() == [3.0], out.unique()
        assert x.cpu().unique().tolist() == [7.0], x.cpu().unique()
    else:
        store.get("stream_side_wait")  # blocks until rank 0's wait() has returned
        dist.all_reduce(x)
        assert x.cpu().unique().tolist() == [3.0], x.cpu().unique()
    pg.check_agreement = True


def _wait_holding_the_gil(rank):
    """A thread that blocks on a stream waiting for a collective while it
    holds the GIL (an operator under DTensor's dispatch, which calls the
    local kernels with the GIL taken: FSDP2's optimizer step) does not
    deadlock the collective's completion, which runs Python on the group's
    own thread (Note [Blocking waits release the GIL]). Rank 1 joins the
    all_reduce half a second after rank 0 has started blocking."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate

    pg = _group()
    pg.check_agreement = False
    store = dist.distributed_c10d._get_default_store()
    dev = torch.device("simdev", rank)
    mesh = init_device_mesh("simdev", (WORLD,))
    x = torch.full((1 << 12,), float(rank + 1), device=dev)
    y = DTensor.from_local(torch.ones(1 << 12, device=dev), mesh, [Replicate()], run_check=False)
    if rank == 0:
        work = dist.all_reduce(x, async_op=True)
        work.wait()  # the stream waits; this thread goes on
        store.set("holding_the_gil", "rank 0 blocks next")
        y.mul_(2)  # a host kernel (or the copying fallback) waits for the stream
        assert work.is_completed()
    else:
        store.get("holding_the_gil")
        time.sleep(0.5)
        dist.all_reduce(x)
    assert x.cpu().unique().tolist() == [3.0], x.cpu().unique()
    assert y.to_local().cpu().unique().tolist() == [2.0 if rank == 0 else 1.0]
    pg.check_agreement = True


# ---------------------------------------------------------------------- errors
def _bad_inputs(rank, store_path):
    _init(store_path, rank, world=1)
    errs = {}
    a = torch.ones(4, device="simdev:0")
    b = torch.ones(4, device="simdev:1")
    for what, call in {
        "two devices": lambda: dist.all_gather([torch.empty(4, device="simdev:0"), b], a),
        "device and cpu": lambda: dist.all_gather_into_tensor(torch.empty(4), a),
        "premul": lambda: dist.all_reduce(a, op=dist._make_nccl_premul_sum(2.0)),
        "bitwise float": lambda: dist.all_reduce(a, op=ReduceOp.BAND),
        "gather size": lambda: dist.all_gather_into_tensor(torch.empty(3, device="simdev:0"), a),
    }.items():
        try:
            call()
        except (ValueError, RuntimeError) as e:
            errs[what] = f"{type(e).__name__}: {e}"
        else:
            errs[what] = None
    # the group stays usable
    dist.all_reduce(a)
    assert a.cpu().tolist() == [1.0] * 4
    return errs


def test_bad_inputs_are_clear_errors(tmp_path):
    errs = _spawn(_bad_inputs, tmp_path, world=1)[0]
    assert "simdev" in errs["two devices"] and "simdev:0" in errs["two devices"] \
        and "simdev:1" in errs["two devices"], errs
    assert "cpu" in errs["device and cpu"] and "simdev:0" in errs["device and cpu"], errs
    assert "PREMUL_SUM" in errs["premul"] and errs["premul"].startswith("ValueError"), errs
    assert "BAND" in errs["bitwise float"] and "torch.float32" in errs["bitwise float"], errs
    assert "all_gather_into_tensor" in errs["gather size"], errs


def _mismatch(rank, store_path):
    _init(store_path, rank, timeout_s=5)
    dev = torch.device("simdev", rank)
    cases = {
        "size": lambda: dist.all_reduce(torch.ones(100 if rank == 0 else 50, device=dev)),
        "dtype": lambda: dist.broadcast(torch.ones(100, device=dev, dtype=torch.float32 if rank == 0
                                                   else torch.float64), src=0),
        "gather": lambda: dist.all_gather_into_tensor(
            torch.empty(2 * (4 + rank), device=dev), torch.ones(4 + rank, device=dev)),
        # One rank's own check fails (a bitwise op on floats, a wrong output
        # size): it still joins the agreement, so the other raises too
        # instead of waiting for it.
        "own check": lambda: dist.reduce(torch.ones(8, device=dev, dtype=torch.float32 if rank == 0
                                                    else torch.int32), dst=0, op=dist.ReduceOp.BAND),
        "one rank's size": lambda: dist.all_gather_into_tensor(
            torch.empty(8 + rank, device=dev), torch.ones(4, device=dev)),
        "op": lambda: dist.all_reduce(torch.ones(8, device=dev),
                                      op=ReduceOp.SUM if rank == 0 else ReduceOp.MAX),
        # (gloo would wait for a root that sends nothing; simdev's library too)
        "root": lambda: dist.broadcast(torch.ones(8, device=dev), src=rank),
    }
    out = {}
    for kind, call in cases.items():
        try:
            call()
        except Exception as e:  # noqa: BLE001  the error is the result
            out[kind] = f"{type(e).__name__}: {e}"
        else:
            out[kind] = None
    x = torch.ones(10, device=dev)
    dist.all_reduce(x)  # the group stays usable
    out["after"] = x.cpu().tolist()
    return out


def test_mismatch_across_ranks_is_an_error(tmp_path):
    res = _spawn(_mismatch, tmp_path, timeout=120)
    for rank, out in res.items():
        assert out["size"].startswith("ValueError") and "all_reduce" in out["size"] \
            and "rank 0 has torch.float32 x 100" in out["size"] \
            and "rank 1 has torch.float32 x 50" in out["size"], (rank, out)
        assert "broadcast" in out["dtype"] and "torch.float64 x 100" in out["dtype"], (rank, out)
        assert out["gather"] is not None and "all_gather_into_tensor" in out["gather"], (rank, out)
        assert out["own check"].startswith("ValueError"), (rank, out)
        assert ("ReduceOp.BAND needs integer or bool tensors" if rank == 0
                else "reduce: rank(s) 0 refused") in out["own check"], (rank, out)
        assert out["one rank's size"].startswith("ValueError"), (rank, out)
        assert ("the output has 9 elements" if rank == 1 else "rank(s) 1 refused") \
            in out["one rank's size"], (rank, out)
        assert out["op"].startswith("ValueError") and "all_reduce" in out["op"] \
            and "rank 0 has ReduceOp.SUM, rank 1 has ReduceOp.MAX" in out["op"], (rank, out)
        assert out["root"].startswith("ValueError") and "broadcast" in out["root"] \
            and "rank 0 has root 0, rank 1 has root 1" in out["root"], (rank, out)
        assert out["after"] == [2.0] * 10


def _mismatched_splits(rank, store_path, native):
    if not native:
        os.environ["ACCELKIT_NATIVE_COLLECTIVES"] = "0"
    _init(store_path, rank, timeout_s=5)
    assert (_group().native is not None) == native
    dev = torch.device("simdev", rank)
    inp = torch.arange(4, dtype=torch.float32, device=dev) + 10 * rank
    in_splits = [1, 3] if rank == 0 else [2, 2]
    out_splits = [1, 2] if rank == 0 else [2, 2]  # rank 1 expects 2 from rank 0, gets 3
    out = torch.empty(sum(out_splits), device=dev)
    try:
        dist.all_to_all_single(out, inp, out_splits, in_splits)
        torch.accelerator.synchronize(dev)
    except Exception as e:  # noqa: BLE001  the error is the result
        err = f"{type(e).__name__}: {e}"
    else:
        err = None
    x = torch.ones(10, device=dev)
    dist.all_reduce(x)  # the group stays usable
    return err, x.cpu().tolist()


@pytest.mark.parametrize("native", [True, False], ids=["native", "gloo"])
def test_mismatched_all_to_all_splits_are_an_error(tmp_path, native):
    """all_to_all_single whose splits disagree across the ranks (gloo
    aborts the process on them): every rank raises the same ValueError
    naming the ranks' splits, on gloo (ACCELKIT_NATIVE_COLLECTIVES=0) and
    through the vendor slot, and the group stays usable."""
    res = _spawn(_mismatched_splits, tmp_path, args=(native,), timeout=120)
    for rank, (err, after) in res.items():
        assert err is not None and err.startswith("ValueError: simdev: all_to_all_single"), \
            (rank, err)
        assert "rank 0 sends 3 elements to rank 1, which expects 2" in err \
            and "rank 0 has input splits [1, 3] and output splits [1, 2]" in err \
            and "rank 1 has input splits [2, 2] and output splits [2, 2]" in err, (rank, err)
        assert after == [2.0] * 10, (rank, after)
    assert res[0][0] == res[1][0]


def _dead_rank(rank, store_path, native, collective):
    if not native:
        os.environ["ACCELKIT_NATIVE_COLLECTIVES"] = "0"
    _init(store_path, rank, timeout_s=5)
    # Without the agreement's allgather (on gloo) before each collective,
    # the collective itself meets the dead rank: simdev's shared-memory one,
    # or gloo's.
    _group().check_agreement = not native
    assert _group().stream_wait  # the default
    assert (_group().native is not None) == native
    dev = torch.device("simdev", rank)
    x = torch.ones(1 << 22, device=dev)
    dist.all_reduce(x)  # both alive
    torch.accelerator.synchronize(dev)  # and done: the stream waited for it
    store = dist.distributed_c10d._get_default_store()
    if rank == 1:
        if native:
            # Dies while rank 0's collective waits for it, once rank 0's
            # wait() of it has returned (Note [wait() on the stream]).
            store.get("dead_rank/waited")
        else:
            dist.all_reduce(x, async_op=True)  # starts the next one, and dies in it
        os._exit(3)
    issue = {
        "all_reduce": lambda: dist.all_reduce(x, async_op=True),
        "broadcast": lambda: dist.broadcast(x, src=0, async_op=True),
        "all_gather": lambda: dist.all_gather_into_tensor(
            torch.empty(2 << 20, device=dev), x[:1 << 20], async_op=True),
    }[collective]
    t0 = time.monotonic()
    calls, own = 0, None
    try:
        work = issue()
        work.wait()  # the stream waits for it; this thread goes on
        calls += 1
        store.set("dead_rank/waited", "1")
        if native:
            # The calling thread waits for the failure (its own error), which
            # the group's next call raises too.
            try:
                work.wait(datetime.timedelta(seconds=20))
            except Exception as e:  # noqa: BLE001  the error is the result
                own = f"{type(e).__name__}: {e}"
        dist.all_reduce(x)
        calls += 1
    except Exception as e:  # noqa: BLE001  the error is the result
        err = f"{type(e).__name__}: {e}"
    else:
        err = None
    took = time.monotonic() - t0
    # The stream that waited for the failed collective reports it too, at
    # every synchronize until the group is destroyed (Note [Failed waits]).
    stream_errs = []
    for _ in range(2):
        try:
            torch.accelerator.synchronize(dev)
        except Exception as e:  # noqa: BLE001  the error is the result
            stream_errs.append(f"{type(e).__name__}: {e}")
        else:
            stream_errs.append(None)
    dist.destroy_process_group()
    torch.accelerator.synchronize(dev)  # the failure went with the group
    return (err, took, calls, stream_errs, own)


@pytest.mark.parametrize("native,collective", [
    pytest.param(True, "all_reduce", id="native_unchecked"),
    pytest.param(True, "all_gather", id="native_all_gather"),
    pytest.param(True, "broadcast", id="native_broadcast", marks=pytest.mark.skipif(
        os.environ.get("SIMDEV_HOST_VISIBLE") == "0", reason="one memory mode is enough")),
    pytest.param(False, "all_reduce", id="gloo_checked", marks=pytest.mark.skipif(
        os.environ.get("SIMDEV_HOST_VISIBLE") == "0", reason="one memory mode is enough"))])
def test_dead_rank_fails_within_timeout(tmp_path, native, collective):
    """Rank 1 dies: rank 0's collectives fail within the group's timeout
    (5 s), never hang: on simdev's shared-memory collectives (which name the
    collective and the rank that exited), rank 1 dies while rank 0's
    collective waits for it, after that collective's wait() made the stream
    wait and returned: the error comes from the work's wait with a timeout
    (which blocks the calling thread), from rank 0's next call (the group
    failed: Note [A failed group]) and from its stream until the group is
    destroyed (Note [Failed waits]); on gloo, rank 1 dies inside an
    all_reduce and the agreement check's allgather (or gloo's collective)
    meets the dead peer: the error names the backend and the collective."""
    out, codes = _rank0_with_rank1_dying(_dead_rank, tmp_path, (native, collective))
    err, took, calls, stream_errs, own = out
    assert err is not None and took < 20, out
    if native:
        named = f"simdev_collectives: {collective}: rank 1"
        assert own is not None and own.startswith("RuntimeError") and named in own \
            and "exited in the middle of the collective" in own, out
        assert named in err and "exited in the middle of the collective" in err, out
        # The collective's wait() made the stream wait and returned; its
        # failure failed the group (every later call raises it), and the
        # stream reports it at every synchronize.
        assert calls == 1 and err.startswith("DistBackendError") \
            and "the process group failed in an earlier collective" in err, out
        for stream_err in stream_errs:
            assert stream_err is not None and stream_err.startswith("RuntimeError") \
                and "waited for work on the host that failed" in stream_err \
                and named in stream_err, out
    else:
        # gloo's error (from the agreement or the collective), naming the
        # backend and the collective.
        assert err.startswith(("RuntimeError", "DistBackendError")) \
            and "simdev: all_reduce" in err and " on gloo failed: " in err, out
    assert codes[1] == 3


# ----------------------------------------------------------------------- FSDP2
def _fsdp2(rank, store_path):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    import ddp_train
    _init(store_path, rank)
    dev = torch.device("simdev", rank)
    mesh = init_device_mesh("simdev", (WORLD,))
    net = ddp_train.model().to(dev)
    for layer in net:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(net, mesh=mesh)
    ddp_train.train(net, dev, WORLD, rank)
    # The parameters whole: each rank's shard (dim 0, even here), gathered
    # through the group (DTensor.full_tensor() goes through the functional
    # collectives, which this group does not serve: docs/distributed.md).
    full = {}
    for k, v in net.state_dict().items():
        local = v.to_local().contiguous()
        parts = [torch.empty_like(local) for _ in range(WORLD)]
        dist.all_gather(parts, local)
        full[k] = torch.cat(parts).cpu().tolist()  # plain data through the queue
    try:
        net.state_dict()["0.bias"].full_tensor()
        functional = None
    except Exception as e:  # noqa: BLE001  reported to the test
        functional = f"{type(e).__name__}: {str(e)[:300]}"
    return (full, functional) if rank == 0 else None


def test_fsdp2_trains_like_one_cpu_process(tmp_path):
    """fully_shard over the two ranks (all_gather_into_tensor and
    reduce_scatter_tensor through the group) trains to the parameters of
    the same training on one CPU process."""
    sys.path.insert(0, os.path.dirname(__file__))
    import ddp_train
    got, functional = _spawn(_fsdp2, tmp_path, timeout=120)[0]
    print("full_tensor():", functional)
    want = ddp_train.train(ddp_train.model(), "cpu").state_dict()
    assert got.keys() == want.keys()
    for k in want:
        torch.testing.assert_close(torch.tensor(got[k]), want[k], rtol=1e-5, atol=1e-6, msg=k)


# ------------------------------------------------------- connecting the library
def test_a_failed_unlink_does_not_make_the_ranks_diverge(monkeypatch):
    """Rank 0 unlinks the segment's name once every rank opened it; a library
    whose unlink fails there is reported as a warning, and rank 0 connects as
    the others do (had it raised, rank 0 would leave for gloo while rank 1
    waits in the native all_reduce)."""
    from accelkit import distributed as ad

    real = ad._Native.library("simdev")
    assert real is not None

    class Failing:
        def __getattr__(self, member):
            return getattr(real, member)

        def unlink(self, name):
            real.unlink(name)
            raise RuntimeError("simdev_collectives: unlink failed (injected)")

    monkeypatch.setattr(ad._Native, "library", staticmethod(lambda name: Failing()))
    monkeypatch.setenv("ACCELKIT_NATIVE_COLLECTIVES", "1")
    store = dist.HashStore()
    results = {}

    def connect(rank):
        results[rank] = ad._Native.connect("simdev", store, rank, 2, datetime.timedelta(seconds=20))

    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        threads = [threading.Thread(target=connect, args=(r,)) for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    try:
        assert sorted(results) == [0, 1], results
        assert all(results[r] is not None for r in range(2)), results
        assert any("could not unlink the shared segment" in str(w.message) and
                   "unlink failed (injected)" in str(w.message) for w in caught), \
            [str(w.message) for w in caught]
    finally:
        for c in results.values():
            if c is not None:
                c.close()


def _small_shm(rank, store_path):
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _init(store_path, rank)
    dev = torch.device("simdev", rank)
    x = torch.full((1 << 20,), float(rank + 1), device=dev)  # 4 MiB: past the room there is
    dist.all_reduce(x)
    return (_group().native is None, [str(w.message) for w in caught
                                      if "vendor collective library" in str(w.message)],
            x.cpu().unique().tolist())


_SMALL_SHM_CHILD = """
import pathlib, sys
sys.path.insert(0, sys.argv[1])
import test_distributed
print("RESULT", repr(test_distributed._spawn(test_distributed._small_shm, pathlib.Path(sys.argv[2]))))
"""


def test_a_small_dev_shm_falls_back_to_gloo(tmp_path):
    """simdev's library reserves its segment's pages when it creates it: in
    a /dev/shm too small for them (a private mount namespace's 256 KiB
    tmpfs; the segment of two ranks is 8 MiB and its header) open raises a
    RuntimeError naming the library and the size, which rank 0 reports as
    a warning, and both ranks run on gloo (with ftruncate alone, the first
    collective that touched a page past the room died of SIGBUS)."""
    import shutil
    import subprocess
    if os.geteuid() != 0 or shutil.which("unshare") is None \
            or subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("needs a private mount namespace (unshare -m, as root)")
    script = 'mount -t tmpfs -o size=256k tmpfs /dev/shm && exec "$0" -c "$1" "$2" "$3"'
    proc = subprocess.run(["unshare", "-m", "sh", "-c", script, sys.executable, _SMALL_SHM_CHILD,
                           os.path.dirname(os.path.abspath(__file__)), str(tmp_path)],
                          capture_output=True, text=True, timeout=180)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (proc.returncode, proc.stdout[-3000:],
                                            proc.stderr[-3000:])
    res = eval(lines[-1][len("RESULT "):])  # noqa: S307  (our own child's repr)
    for rank, (on_gloo, warned, values) in res.items():
        assert on_gloo and values == [3.0], (rank, res)
    (warning,) = res[0][1]
    import re
    reserved = re.search(r"simdev_collectives: open: could not reserve (\d+) bytes of shared "
                         r"memory for /accelkit-simdev-\S+ \(2 ranks\)", warning)
    assert warning.startswith("accelkit: simdev: the vendor collective library did not connect") \
        and reserved and int(reserved.group(1)) > 8 << 20 \
        and "No space left on device" in warning, warning
    assert res[1][1] == [], res


def _connect_both(ad, store):
    """_Native.connect on ranks 0 and 1 (threads); {rank: connection or the
    error's text}."""
    results = {}

    def connect(rank):
        try:
            results[rank] = ad._Native.connect("simdev", store, rank, 2,
                                               datetime.timedelta(seconds=5))
        except Exception as e:  # noqa: BLE001  the error is the result
            results[rank] = f"{type(e).__name__}: {e}"
    threads = [threading.Thread(target=connect, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return results


def test_a_failed_connect_falls_back_and_leaves_no_segment(monkeypatch):
    """A library whose open() raises something other than a RuntimeError
    (here a ValueError on rank 0) leaves both ranks on gloo, with a warning
    (it had raised out of rank 0's connect while rank 1 waited for it); and
    a store that fails after rank 0 created the segment (its timeout) raises
    out of connect on both ranks, rank 0 unlinking the name (it was left in
    /dev/shm)."""
    import warnings
    from accelkit import distributed as ad

    real = ad._Native.library("simdev")
    assert real is not None
    monkeypatch.setenv("ACCELKIT_NATIVE_COLLECTIVES", "1")

    class Refusing:
        def __getattr__(self, member):
            return getattr(real, member)

        def open(self, name, rank, size, create):
            if create:
                raise ValueError("simdev_collectives: open refused (injected)")
            return real.open(name, rank, size, create)

    monkeypatch.setattr(ad._Native, "library", staticmethod(lambda name: Refusing()))
    store = dist.HashStore()
    store.set_timeout(datetime.timedelta(seconds=5))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = _connect_both(ad, store)
    assert results == {0: None, 1: None}, results
    assert any("the vendor collective library did not connect" in str(w.message)
               and "open refused (injected)" in str(w.message) for w in caught), \
        [str(w.message) for w in caught]

    # The store fails once rank 0 has created the segment.
    monkeypatch.setattr(ad._Native, "library", staticmethod(lambda name: real))

    class FailingStore:
        def __init__(self, store):
            self._store = store

        def set(self, key, value):
            self._store.set(key, value)

        def get(self, key):
            if key.startswith("open/"):
                raise RuntimeError("store timeout (injected)")
            return self._store.get(key)
    monkeypatch.setattr(dist, "PrefixStore", lambda prefix, store: FailingStore(store))
    mine = f"accelkit-simdev-{os.getpid()}-"
    before = {n for n in os.listdir("/dev/shm") if n.startswith(mine)}
    results = _connect_both(ad, dist.HashStore())
    assert all(isinstance(r, str) and "store timeout (injected)" in r
               for r in results.values()), results
    left = {n for n in os.listdir("/dev/shm") if n.startswith(mine)} - before
    assert not left, left
