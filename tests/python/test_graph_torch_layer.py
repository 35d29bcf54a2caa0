"""The torch layer's graphs (Note [Graphs through PyTorch]): torch.accelerator.Graph over the
SDK's GraphImpl captures the current stream into a graph whose allocations come from a private
pool, replays it reading memory at run time, and releases the pool on reset after the queued
replays; torch.Stream.is_capturing() is the guard's; what the host would do is refused during
capture naming the ATen operator, and the stream is usable after (Note [Refusals during
capture]); pinned copies are captured and their storage kept until reset (Note [Captured
pinned copies]).

The elementwise operators are simdev's native kernels only with SIMDEV_NATIVE_KERNELS=1 at the
library's load, so the tests that capture them run in a child process; the rest (copies,
fills, refusals of the host kernels) run here."""
import json
import os
import subprocess
import sys
import textwrap
import threading

import pytest
import torch

from backend import DEV, MOD, OPS, renamed, simdev_only



def _graphs_work():
    """Whether the backend captures: its runtime has the graph members and an empty capture
    on a side stream succeeds (ocl's members refuse where the device lacks
    cl_khr_command_buffer); else why not."""
    if not hasattr(torch.accelerator, "Graph"):
        return False, f"PyTorch {torch.__version__} has no torch.accelerator.Graph"
    if "stream_begin_capture" not in OPS.runtime_members():
        return False, f"{DEV}'s runtime has no graph members"
    g = torch.accelerator.Graph()
    try:
        with torch.Stream(device=DEV):
            g.capture_begin()
        g.capture_end()
    except (RuntimeError, NotImplementedError) as e:
        return False, f"{DEV} cannot capture here: {e}"
    g.reset()
    return True, ""


HAS_GRAPHS = "stream_begin_capture" in OPS.runtime_members()
CAPTURES, WHY_NOT = _graphs_work()
graphs = pytest.mark.skipif(not CAPTURES, reason=WHY_NOT)


def _pool_count(g):
    return OPS.mempool_use_count(0, list(g.pool()))


def _reserved(pool):
    return json.loads(OPS.pool_stats_json(0, list(pool)))["reserved_bytes.all.current"]


def _child(code):
    env = {**os.environ, "SIMDEV_NATIVE_KERNELS": "1"}
    r = subprocess.run([sys.executable, "-c", "import torch, torch_simdev\n" + textwrap.dedent(code)],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


@graphs
@simdev_only
def test_capture_and_replay_of_native_kernels_equal_eager_and_read_inputs_at_replay():
    out = _child("""
        a = torch.randn(1024).to('simdev')
        b = torch.randn(1024).to('simdev')
        def step(a, b):
            h = torch.relu(a + b)
            return h + a
        eager = step(a, b).cpu()
        out = torch.zeros(1024, device='simdev')
        s = torch.Stream(device='simdev')
        g = torch.accelerator.Graph()
        with s, g:
            out.copy_(step(a, b))
        print('unchanged by the capture', out.abs().sum().item() == 0)
        g.replay()
        torch.accelerator.synchronize()
        print('replay equals eager', torch.equal(out.cpu(), eager))
        a.copy_(torch.full((1024,), -2.0))          # static input updated in place
        g.replay()
        torch.accelerator.synchronize()
        print('replay reads the new input', torch.equal(out.cpu(), step(a, b).cpu()))
        print('graph pool', g.pool()[0] > 0 and g.pool()[1] == 0)
    """)
    assert out.split("\n")[:4] == ["unchanged by the capture True", "replay equals eager True",
                                   "replay reads the new input True", "graph pool True"], out


@graphs
@simdev_only
def test_captured_copies_and_fills_run_at_replay_not_at_capture():
    src = torch.arange(4096.0, device=DEV)
    dst = torch.zeros(4096, device=DEV)
    ones = torch.zeros(1000, device=DEV)
    zeros = torch.full((1000,), 9.0, device=DEV)
    bytes_ = torch.zeros(64, dtype=torch.uint8, device=DEV)
    s = torch.Stream(device=DEV)
    g = torch.accelerator.Graph()
    with s, g:
        dst.copy_(src)
        ones.fill_(1.5)      # not one repeated byte: written from a pinned buffer
        zeros.zero_()        # a memset
        bytes_.fill_(7)      # one repeated byte: a memset
        clone = src.clone()  # allocated from the graph's pool
    # Nothing ran: the capture recorded the work.
    assert dst.sum().item() == 0 and ones.sum().item() == 0 and zeros[0].item() == 9.0
    g.replay()
    torch.accelerator.synchronize()
    assert torch.equal(dst.cpu(), torch.arange(4096.0))
    assert torch.equal(clone.cpu(), torch.arange(4096.0))
    assert torch.equal(ones.cpu(), torch.full((1000,), 1.5))
    assert torch.equal(zeros.cpu(), torch.zeros(1000))
    assert torch.equal(bytes_.cpu(), torch.full((64,), 7, dtype=torch.uint8))
    src.copy_(torch.arange(4096.0).flip(0))  # read at replay, not at capture
    g.replay()
    torch.accelerator.synchronize()
    assert torch.equal(dst.cpu(), torch.arange(4096.0).flip(0))
    g.reset()


@graphs
@simdev_only
def test_pinned_copies_are_captured_and_their_storage_kept_until_reset():
    torch.accelerator.synchronize()
    dev = torch.zeros(2048, device=DEV)
    back = torch.zeros(2048).pin_memory()
    s = torch.Stream(device=DEV)
    g = torch.accelerator.Graph()
    src = torch.arange(2048.0).pin_memory()
    live = MOD.host_memory_stats()["active_requests.current"]
    with s, g:
        dev.copy_(src)                        # host -> device, pinned: captured
        back.copy_(dev, non_blocking=False)   # device -> host, pinned: captured
    assert back.sum().item() == 0             # not run at capture
    del src                                   # the graph keeps its storage
    assert MOD.host_memory_stats()["active_requests.current"] == live
    g.replay()
    torch.accelerator.synchronize()
    assert torch.equal(back, torch.arange(2048.0))
    g.reset()
    assert MOD.host_memory_stats()["active_requests.current"] == live - 1


REFUSED = [
    ("a host kernel", lambda x: x + 1, r"aten::add\.Tensor \(PyTorch's CPU kernel run by the host"),
    ("the CPU fallback", lambda x: torch.cumsum(x, 0), r"aten::cumsum\.out \(the CPU fallback"),
    ("Tensor.item()", lambda x: x[0].item(), r"aten::_local_scalar_dense"),
    (".cpu()", lambda x: x.cpu(), r"aten::_copy_from \(a copy with pageable host memory"),
    ("print", lambda x: print(x), r"aten::\S+ .*cannot be captured into a graph"),
    ("a strided copy", lambda x: x.view(32, 32).t().contiguous(),
     r"aten::_copy_from \(a copy between different dtypes or layouts"),
]


@graphs
@pytest.mark.parametrize("what,f,pattern", REFUSED, ids=[r[0] for r in REFUSED])
def test_refused_during_capture_naming_the_operator_and_the_stream_usable_after(what, f, pattern):
    if what == "a host kernel" and DEV != "simdev":
        pytest.skip("add is a host kernel on simdev without its native kernels")
    x = torch.arange(1024.0, device=DEV)
    s = torch.Stream(device=DEV)
    g = torch.accelerator.Graph()
    with s:
        g.capture_begin()
        pool = g.pool()
        assert s.is_capturing()
        with pytest.raises(RuntimeError, match=pattern) as refused:
            f(x)
        assert "the capture is invalidated" in str(refused.value)
        with pytest.raises(RuntimeError, match="invalidated by aten::"):
            g.capture_end()
        assert not s.is_capturing()
        assert OPS.mempool_use_count(0, list(pool)) == 0  # the pool's use dropped
        y = x * 2                                         # the stream works again
    s.synchronize()
    assert y[5].item() == 10.0
    # The graph can capture again.
    dst = torch.zeros(4, device=DEV)
    with s, g:
        dst.copy_(x[:4])
    g.replay()
    torch.accelerator.synchronize()
    assert dst.tolist() == [0.0, 1.0, 2.0, 3.0]
    g.reset()


@graphs
def test_capture_on_the_default_stream_is_refused():
    g = torch.accelerator.Graph()
    with pytest.raises(RuntimeError, match="default stream"):
        g.capture_begin()
    assert not torch.accelerator.current_stream().is_capturing()


@graphs
def test_is_capturing_follows_the_capture_and_only_the_capturing_stream():
    s, other = torch.Stream(device=DEV), torch.Stream(device=DEV)
    g = torch.accelerator.Graph()
    assert not s.is_capturing()
    with s:
        g.capture_begin()
        assert s.is_capturing() and torch.accelerator.current_stream().is_capturing()
        assert not other.is_capturing()
        assert OPS.is_stream_capturing(s) and OPS.capture_underway(0)
        if MOD.device_count() > 1:
            assert not OPS.capture_underway(1)
        g.capture_end()
    assert not s.is_capturing() and not OPS.capture_underway(0)
    g.reset()


@graphs
@simdev_only
def test_reset_releases_the_pool_after_queued_replays():
    src = torch.arange(1 << 16, dtype=torch.float32, device=DEV)
    s = torch.Stream(device=DEV)
    g = torch.accelerator.Graph()
    with s, g:
        out = src.clone()   # a block of the graph's pool
    pool = g.pool()
    assert _pool_count(g) == 1 and _reserved(pool) > 0
    del out                 # freed to the pool, which the graph still uses
    assert _reserved(pool) > 0
    gate = torch.ops.simdev_driver.hold(s)
    released = threading.Event()

    def release():
        released.set()
        torch.ops.simdev_driver.release(gate)

    timer = threading.Timer(0.3, release)
    timer.start()
    try:
        with s:
            g.replay()      # queued behind the held point
            g.replay()
        g.reset()           # waits for both replays before the pool goes
        assert released.is_set()
    finally:
        timer.cancel()
        if not released.is_set():
            release()
    assert OPS.mempool_use_count(0, list(pool)) == 0
    assert _reserved(pool) == 0


@graphs
def test_two_graphs_share_a_pool_until_both_are_reset():
    x = torch.arange(256.0, device=DEV)
    s = torch.Stream(device=DEV)
    g1 = torch.accelerator.Graph()
    with s, g1:
        a = x.clone()
    g2 = torch.accelerator.Graph(pool=g1.pool())
    with s, g2:
        b = a.clone()
    assert g2.pool() == g1.pool() and _pool_count(g1) == 2
    g1.replay(); g2.replay()
    torch.accelerator.synchronize()
    assert torch.equal(b.cpu(), torch.arange(256.0))
    pool = g1.pool()
    del a, b
    g1.reset()
    assert OPS.mempool_use_count(0, list(pool)) == 1
    g2.reset()
    assert OPS.mempool_use_count(0, list(pool)) == 0 and _reserved(pool) == 0


@graphs
def test_keep_graph_instantiates_at_first_replay_and_debug_dump_says_what_was_captured(tmp_path):
    x = torch.arange(16.0, device=DEV)
    dst = torch.zeros(16, device=DEV)
    s = torch.Stream(device=DEV)
    g = torch.accelerator.Graph(keep_graph=True)
    g.enable_debug_mode()
    with s, g:
        dst.copy_(x)
    g.replay()
    g.replay()
    torch.accelerator.synchronize()
    assert dst.tolist() == x.tolist()
    path = tmp_path / "graph.txt"
    g.debug_dump(str(path))
    text = path.read_text()
    assert f"backend: {DEV}" in text and "replays: 2" in text and "keep_graph: true" in text
    assert "aten::copy_" in text and f"pool: ({g.pool()[0]}, 0)" in text
    g.reset()


@graphs
def test_a_pool_used_beside_a_graph_keeps_its_memory_until_its_last_use_is_released():
    x = torch.arange(1 << 14, dtype=torch.float32, device=DEV)
    s = torch.Stream(device=DEV)
    pool = tuple(OPS.new_mempool_id(False))
    OPS.mempool_create(0, list(pool))   # a use beside the graph's, as a MemPool holds
    g = torch.accelerator.Graph(pool=pool)
    with s, g:
        y = x.clone()
    del y
    g.reset()
    assert _reserved(pool) > 0          # still used: reserved
    OPS.empty_cache_pool(0, list(pool))
    assert _reserved(pool) > 0          # a pool in use keeps its memory
    OPS.mempool_release(0, list(pool))  # the last use: its free segments go back
    OPS.empty_cache_pool(0, list(pool))
    assert _reserved(pool) == 0 and OPS.mempool_use_count(0, list(pool)) == 0


def test_new_mempool_ids_number_graph_pools_and_user_pools_apart():
    g1, g2 = OPS.new_mempool_id(False), OPS.new_mempool_id(False)
    u1 = OPS.new_mempool_id(True)
    assert g1[1] == 0 and g2[1] == 0 and g2[0] > g1[0] > 0
    assert u1[0] == 0 and u1[1] > 0
    with pytest.raises(ValueError, match="two non-negative integers"):
        OPS.mempool_use_count(0, [1])


@pytest.mark.skipif(HAS_GRAPHS or not hasattr(torch.accelerator, "Graph"),
                    reason=f"{DEV}'s runtime has graph members, or PyTorch has no "
                           "torch.accelerator.Graph")
def test_a_runtime_without_graph_members_refuses_naming_the_backend():
    s = torch.Stream(device=DEV)
    g = torch.accelerator.Graph()
    with s, pytest.raises((RuntimeError, NotImplementedError), match=f"{DEV}.*cannot capture graphs"):
        g.capture_begin()
    assert not s.is_capturing()
