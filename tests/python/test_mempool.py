"""User memory pools of the caching allocator through torch.simdev (MemPool, use_mem_pool,
memory_snapshot(mempool_id=...): python/accelkit/device/memory.py, docs/graphs.md), as
torch.cuda's: this thread's allocations come from the pool inside use_mem_pool, its freed
blocks serve only it, and it lives while anything uses it."""
import gc
import threading

import pytest
import torch

from backend import DEV, IS_SIMDEV, MOD


def _ranges(pool_id):
    return [(s["address"], s["address"] + s["total_size"]) for s in MOD.memory_snapshot(pool_id)]


def _in(t, pool_id):
    return any(lo <= t.data_ptr() < hi for lo, hi in _ranges(pool_id))


def test_a_pool_has_a_user_id_and_counts_its_users():
    pool = MOD.MemPool()
    first, second = pool.id
    assert first == 0 and second > 0  # user pools are (0, n); graph pools (n, 0)
    assert MOD.MemPool().id != pool.id
    assert pool.use_count() == 1 and pool.allocator is None
    with MOD.use_mem_pool(pool):
        assert pool.use_count() == 2
    assert pool.use_count() == 1


def test_allocations_in_use_mem_pool_come_from_the_pool_and_its_blocks_serve_only_it():
    pool = MOD.MemPool()
    outside = torch.empty(1000, device=DEV)
    with MOD.use_mem_pool(pool):
        inside = torch.ones(1000, device=DEV)
        address = inside.data_ptr()
    assert _in(inside, pool.id) and not _in(outside, pool.id)
    assert torch.equal(inside.cpu(), torch.ones(1000))
    segments = pool.snapshot()
    assert segments and all(tuple(s["segment_pool_id"]) == pool.id for s in segments)
    del inside
    MOD.synchronize()
    again = torch.empty(1000, device=DEV)  # outside the pool: never its freed block
    assert again.data_ptr() != address and not _in(again, pool.id)
    with MOD.use_mem_pool(pool):
        reused = torch.empty(1000, device=DEV)
    assert reused.data_ptr() == address  # the pool's own block, cached for it


def test_use_mem_pool_routes_this_threads_allocations_only():
    pool = MOD.MemPool()
    theirs = []
    go, done = threading.Event(), threading.Event()

    def other():
        go.wait()
        theirs.append(torch.empty(4096, device=DEV))
        done.set()

    t = threading.Thread(target=other)
    t.start()
    with MOD.use_mem_pool(pool):
        go.set()
        done.wait(30)
        mine = torch.empty(4096, device=DEV)
    t.join()
    assert _in(mine, pool.id) and not _in(theirs[0], pool.id)


def test_a_dropped_pool_returns_its_memory_once_its_tensors_are_freed():
    # Graphs and pools of earlier tests held in reference cycles (a caught
    # exception's traceback) go first, so that none gives its memory back
    # while this test compares reserved memory.
    gc.collect()
    MOD.synchronize()
    MOD.empty_cache()
    reserved = MOD.memory_reserved()
    pool = MOD.MemPool()
    pool_id = pool.id
    with MOD.use_mem_pool(pool):
        t = torch.empty(4 * 2**20, dtype=torch.uint8, device=DEV)
    del pool
    assert MOD.memory_reserved() > reserved and MOD.memory_snapshot(pool_id) != []
    del t  # the pool's last block: its segment goes back to the driver
    MOD.synchronize()
    MOD.empty_cache()
    assert MOD.memory_snapshot(pool_id) == []
    assert MOD.memory_reserved() == reserved


def test_memory_snapshot_of_a_pool_and_of_everything():
    pool = MOD.MemPool()
    with MOD.use_mem_pool(pool):
        a = torch.empty(2048, device=DEV)
    b = torch.empty(2048, device=DEV)
    every = MOD.memory_snapshot()
    mine = MOD.memory_snapshot(mempool_id=pool.id)
    assert all("segment_pool_id" in s for s in every)
    assert {(s["device"], s["address"]) for s in mine} <= {(s["device"], s["address"]) for s in every}
    assert _in(a, pool.id) and not _in(b, pool.id)
    assert MOD.memory_snapshot(mempool_id=(0, 10**9)) == []  # an id no pool has
    with pytest.raises(ValueError, match=DEV):
        MOD.memory_snapshot(mempool_id=(1, 2, 3))


def test_a_graph_captures_into_a_mempool():
    pool = MOD.MemPool()
    x = torch.arange(64, dtype=torch.float32, device=DEV)
    g = MOD.Graph()
    try:
        with MOD.graph(g, pool=pool.id):
            out = x.clone()
    except (NotImplementedError, RuntimeError) as e:  # a backend without graphs (simdev has them)
        if IS_SIMDEV or "cannot capture" not in str(e):
            raise
        pytest.skip(str(e))
    assert g.pool() == pool.id and pool.use_count() == 2 and _in(out, pool.id)
    x.copy_(torch.full((64,), 5.0).to(DEV))
    g.replay()
    assert torch.equal(out.cpu(), torch.full((64,), 5.0))
    g.reset()
    assert pool.use_count() == 1


def test_what_the_sdks_pools_do_not_have_is_refused_by_name():
    with pytest.raises(NotImplementedError, match=DEV):
        MOD.MemPool(allocator=object())
    with pytest.raises(NotImplementedError, match=DEV):
        MOD.MemPool(use_on_oom=True)
    with pytest.raises(TypeError, match=DEV):
        with MOD.use_mem_pool((0, 1)):
            pass


def test_memory_stats_give_each_private_pools_reserved_bytes_as_cuda_keys_them():
    pool = MOD.MemPool()
    with MOD.use_mem_pool(pool):
        t = torch.empty(3 * 2**20, dtype=torch.uint8, device=DEV)
    key = f"reserved_bytes_by_private_pools.{pool.id[0]}_{pool.id[1]}.all.current"
    stats = MOD.memory_stats()
    reserved = sum(s["total_size"] for s in pool.snapshot())
    assert stats[key] == reserved >= t.numel()
    assert stats["reserved_bytes.all.current"] >= reserved
    nested = MOD.memory_stats_as_nested_dict()
    assert nested["reserved_bytes_by_private_pools"][pool.id]["all"]["current"] == reserved
