"""Graph capture and replay through torch.simdev's graph names (python/accelkit/device/graphs.py,
docs/graphs.md): Graph (CUDAGraph), graph(), graph_pool_handle, is_current_stream_capturing,
make_graphed_callables, over PyTorch's accelerator graph and the SDK's captures.

The graphs in this process hold device copies only (what a stream queues without a kernel);
simdev's native kernels (add, relu: SIMDEV_NATIVE_KERNELS=1 at load) are captured in child
processes. simdev's host kernels (PyTorch's CPU kernels on device memory) cannot be captured."""
import importlib.util
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch

from backend import DEV, IS_SIMDEV, MOD, OPS, simdev_capacity, simdev_only


def _rotate(x):
    """A computation of device copies only: the two halves swapped, in a new tensor."""
    y = torch.empty_like(x)
    h = x.numel() // 2
    y[:h].copy_(x[h:])
    y[h:].copy_(x[:h])
    return y.clone()


def _pool_ranges(pool):
    return [(s["address"], s["address"] + s["total_size"]) for s in MOD.memory_snapshot(pool)]


def _in_pool(t, pool):
    return any(lo <= t.data_ptr() < hi for lo, hi in _pool_ranges(pool))


def _use_count(pool, device=0):
    return OPS.mempool_use_count(device, list(pool))


def _captures():
    """Whether the backend captures graphs (simdev must; another backend may refuse)."""
    x = torch.zeros(4, device=DEV)
    g = MOD.Graph()
    try:
        with MOD.graph(g):
            x.clone()
    except (NotImplementedError, RuntimeError) as e:
        if IS_SIMDEV:
            raise
        return str(e)
    return None


@pytest.fixture(autouse=True, scope="module")
def _backend_captures():
    # Asked when the tests run, not at collection: the capture initializes the
    # backend, which other files' tests must not find done.
    refusal = _captures()
    if refusal is not None:
        pytest.skip(f"{DEV} does not capture: {refusal}")


def test_the_names_are_torch_cudas():
    assert MOD.CUDAGraph is MOD.Graph and issubclass(MOD.Graph, torch._C._acceleratorGraph)
    assert MOD.graphs.make_graphed_callables is MOD.make_graphed_callables
    assert sys.modules[f"torch.{DEV}.graphs"] is MOD.graphs
    a, b = MOD.graph_pool_handle(), MOD.graph_pool_handle()
    assert a != b and a[0] > 0 and a[1] == 0 and b[1] == 0


def test_capture_and_replay_equal_eager_and_replay_reads_the_inputs_in_place():
    x = torch.arange(1024, dtype=torch.float32, device=DEV)
    eager = _rotate(x)
    g = MOD.Graph()
    dst = torch.zeros(1024, device=DEV)
    with MOD.graph(g):
        out = _rotate(x)
        dst.copy_(out)
    assert torch.equal(dst.cpu(), torch.zeros(1024))  # captured, not run
    g.replay()
    assert torch.equal(dst.cpu(), eager.cpu())
    assert torch.equal(out.cpu(), eager.cpu())
    for k in range(3):  # the static input updated in place, then replayed
        x.copy_(torch.randn(1024).to(DEV))
        g.replay()
        assert torch.equal(out.cpu(), _rotate(x).cpu())
    assert _in_pool(out, g.pool())  # what the capture allocated is the graph's pool's


def test_the_graph_context_captures_on_a_side_stream_and_restores_the_current_one():
    before = MOD.current_stream()
    g = MOD.Graph()
    x = torch.ones(16, device=DEV)
    with MOD.graph(g):
        assert MOD.is_current_stream_capturing()
        inside = MOD.current_stream()
        x.clone()
    assert inside != before and inside != MOD.default_stream()
    assert MOD.current_stream() == before and not MOD.is_current_stream_capturing()
    s = MOD.Stream()
    with MOD.graph(MOD.Graph(), stream=s):
        assert MOD.current_stream() == s
        x.clone()


def test_capture_on_the_default_stream_is_refused():
    g = MOD.Graph()
    with MOD.stream(MOD.default_stream()):
        with pytest.raises(RuntimeError, match="default stream"):
            g.capture_begin()
        assert not MOD.is_current_stream_capturing()


def test_capture_begun_twice_on_one_stream_is_refused():
    s = MOD.Stream()
    x = torch.arange(64, dtype=torch.float32, device=DEV)
    g1, g2 = MOD.Graph(), MOD.Graph()
    with MOD.stream(s):
        g1.capture_begin()
        with pytest.raises(RuntimeError, match="captur"):
            g2.capture_begin()
        out = x.clone()  # the first capture goes on
        g1.capture_end()
    x.copy_(torch.full((64,), 7.0).to(DEV))
    g1.replay()
    assert torch.equal(out.cpu(), torch.full((64,), 7.0))


@pytest.mark.parametrize("what", ["item", "cpu", "synchronize"])
def test_what_cannot_be_captured_says_so_and_the_stream_is_usable_after(what):
    x = torch.ones(8, device=DEV)
    g = MOD.Graph()
    calls = {"item": lambda: x[0].item(),
             "cpu": lambda: x.cpu(),
             "synchronize": lambda: torch.accelerator.synchronize()}
    with pytest.raises(RuntimeError, match="captur") as info:
        with MOD.graph(g):
            x.clone()
            calls[what]()
    assert DEV in str(info.value)
    assert not MOD.is_current_stream_capturing()
    g2 = MOD.Graph()  # the same (default capture) stream captures again
    with MOD.graph(g2):
        out = x.clone()
    x.copy_(torch.full((8,), 3.0).to(DEV))
    g2.replay()
    assert torch.equal(out.cpu(), torch.full((8,), 3.0))


def test_two_graphs_share_a_pool_and_it_lives_until_both_are_reset():
    x = torch.arange(512, dtype=torch.float32, device=DEV)
    g1 = MOD.Graph()
    with MOD.graph(g1):
        mid = _rotate(x)
    g2 = MOD.Graph()
    with MOD.graph(g2, pool=g1.pool()):
        out = _rotate(mid[:256]).clone()  # reads g1's output
    pool = g1.pool()
    assert g2.pool() == pool and _use_count(pool) == 2
    assert _in_pool(mid, pool) and _in_pool(out, pool)
    g1.replay()
    g2.replay()
    assert torch.equal(out.cpu(), _rotate(_rotate(x)[:256]).cpu())
    g1.reset()
    assert _use_count(pool) == 1
    x.copy_(torch.randn(512).to(DEV))
    mid.copy_(_rotate(x))  # g1's output written eagerly; g2 still replays from the pool
    g2.replay()
    assert torch.equal(out.cpu(), _rotate(_rotate(x)[:256]).cpu())
    g2.reset()
    assert _use_count(pool) == 0
    del mid, out
    assert MOD.memory_snapshot(pool) == []  # freed blocks went back to the driver


def test_a_pool_from_graph_pool_handle_is_shared_by_its_captures():
    pool = MOD.graph_pool_handle()
    x = torch.ones(32, device=DEV)
    graphs = [MOD.Graph() for _ in range(3)]
    outs = []
    for g in graphs:
        with MOD.graph(g, pool=pool):
            outs.append(x.clone())
    assert all(g.pool() == pool for g in graphs) and _use_count(pool) == 3
    assert all(_in_pool(o, pool) for o in outs)
    for g in graphs:
        g.reset()
    assert _use_count(pool) == 0


@pytest.mark.parametrize("mode", ["global", "thread_local", "relaxed"])
def test_capture_on_a_side_stream_while_another_thread_allocates(mode):
    x = torch.arange(4096, dtype=torch.float32, device=DEV)
    done, errors, theirs = threading.Event(), [], []

    def other():
        try:
            with MOD.stream(MOD.Stream()):
                while not done.is_set():
                    t = torch.empty(4096, device=DEV)
                    t.copy_(x)
                    theirs.append(t)
                    time.sleep(0.001)
                MOD.current_stream().synchronize()
        except Exception as e:  # noqa: BLE001 (reported by the assertion below)
            errors.append(e)

    thread = threading.Thread(target=other)
    g = MOD.Graph()
    thread.start()
    try:
        time.sleep(0.01)
        with MOD.graph(g, capture_error_mode=mode):
            outs = [_rotate(x) for _ in range(20)]
            time.sleep(0.02)  # the other thread allocates while the capture is open
    finally:
        done.set()
        thread.join()
    assert errors == []
    assert len(theirs) > 0
    assert all(torch.equal(t.cpu(), x.cpu()) for t in theirs[:5])
    pool = g.pool()
    assert not any(_in_pool(t, pool) for t in theirs)  # only the capture's stream is routed
    assert all(_in_pool(o, pool) for o in outs)
    g.replay()
    assert torch.equal(outs[-1].cpu(), _rotate(x).cpu())


@pytest.mark.parametrize("mode", ["global", "thread_local", "relaxed"])
def test_an_event_query_on_another_thread_during_capture_follows_the_mode(mode):
    # global refuses the query on any thread and invalidates the capture;
    # thread_local refuses it on the capturing thread only; relaxed allows it.
    x = torch.ones(256, device=DEV)
    ev = MOD.Event()
    ev.record(MOD.Stream())
    ev.synchronize()
    opened, asked, outcome = threading.Event(), threading.Event(), []

    def other():
        opened.wait(30)
        try:
            outcome.append(ev.query())
        except RuntimeError as e:
            outcome.append(e)
        asked.set()

    thread = threading.Thread(target=other)
    thread.start()
    g = MOD.Graph()
    try:
        with MOD.graph(g, capture_error_mode=mode):
            out = x.clone()
            opened.set()
            asked.wait(30)
    except RuntimeError as e:
        ended = e
    else:
        ended = None
    thread.join()
    if mode == "global":
        assert isinstance(outcome[0], RuntimeError) and "captur" in str(outcome[0])
        assert ended is not None and "invalidated" in str(ended)
    else:
        assert outcome == [True] and ended is None
        g.replay()
        assert torch.equal(out.cpu(), x.cpu())
    assert not MOD.is_current_stream_capturing()


@simdev_only
def test_a_graph_destroyed_while_replays_are_queued_frees_nothing_early():
    src = torch.zeros(2048, device=DEV)
    g = MOD.Graph()
    with MOD.graph(g):
        out = _rotate(src)  # its intermediates are blocks of the graph's pool
    pool = g.pool()
    values = [torch.randn(2048).to(DEV) for _ in range(3)]
    results = [torch.empty(2048, device=DEV) for _ in range(3)]
    MOD.synchronize()
    s = MOD.current_stream()
    gate = torch.ops.simdev_driver.hold(s)
    for v, r in zip(values, results):  # all queued behind the gate, on s
        src.copy_(v)
        g.replay()
        r.copy_(out)
    torch.ops.simdev_driver.release_later(gate, 300)
    start = time.monotonic()
    del g  # waits for the queued replays before the pool goes
    waited = time.monotonic() - start
    assert waited > 0.2, waited
    assert _use_count(pool) == 0
    MOD.synchronize()
    for v, r in zip(values, results):
        assert torch.equal(r.cpu(), _rotate(v).cpu())


@simdev_capacity
def test_out_of_memory_during_capture_is_a_clear_error_and_the_pool_is_released():
    x = torch.ones(1024, device=DEV)
    MOD.synchronize()
    MOD.empty_cache()
    reserved = MOD.memory_reserved()
    g = MOD.Graph()
    pools = []
    with pytest.raises(torch.OutOfMemoryError, match=DEV):
        with MOD.graph(g):
            pools.append(g.pool())
            kept = x.clone()  # noqa: F841 (a block of the pool, alive when the error comes)
            torch.empty(300 * 2**20, dtype=torch.uint8, device=DEV)  # beyond 256 MB
    assert not MOD.is_current_stream_capturing()
    assert _use_count(pools[0]) == 0  # the failed capture's graph was reset
    del kept
    assert MOD.memory_snapshot(pools[0]) == []
    MOD.empty_cache()
    assert MOD.memory_reserved() == reserved
    g2 = MOD.Graph()
    with MOD.graph(g2):
        out = x.clone()
    g2.replay()
    assert torch.equal(out.cpu(), torch.ones(1024))


def test_keep_graph_instantiates_at_the_first_replay_and_reset_allows_a_new_capture():
    x = torch.arange(256, dtype=torch.float32, device=DEV)
    g = MOD.Graph(keep_graph=True)
    with MOD.graph(g):
        out = _rotate(x)
    g.replay()
    assert torch.equal(out.cpu(), _rotate(x).cpu())
    g.reset()
    with MOD.graph(g):
        out2 = x.clone()
    g.replay()
    assert torch.equal(out2.cpu(), x.cpu())


def test_debug_dump_writes_what_the_sdk_knows(tmp_path):
    g = MOD.Graph()
    g.enable_debug_mode()
    x = torch.ones(8, device=DEV)
    with MOD.graph(g):
        x.clone()
    g.replay()
    path = tmp_path / "graph.txt"
    g.debug_dump(str(path))
    text = path.read_text()
    assert DEV in text and "aten::clone" in text  # the captured operators, in debug mode


def test_torch_accelerator_graph_works_with_the_graph_context():
    x = torch.arange(128, dtype=torch.float32, device=DEV)
    g = torch.accelerator.Graph()
    with MOD.graph(g):
        out = _rotate(x)
    g.replay()
    assert torch.equal(out.cpu(), _rotate(x).cpu())
    s = MOD.Stream()
    g2 = torch.accelerator.Graph(pool=g.pool())
    with s, g2:  # PyTorch's own context: capture on the current stream
        out2 = x.clone()
    g2.replay()
    assert torch.equal(out2.cpu(), x.cpu()) and g2.pool() == g.pool()
    g3 = torch.accelerator.Graph(pool=g.pool())
    with MOD.graph(g3):  # its pool, given at construction, is kept
        x.clone()
    assert g3.pool() == g.pool()


def test_arguments_are_checked_with_the_backends_name():
    with pytest.raises(ValueError, match=DEV):
        MOD.graph(MOD.Graph(), capture_error_mode="strict")
    with pytest.raises(ValueError, match=DEV):
        MOD.graph(MOD.Graph(), pool="pool")
    with pytest.raises(NotImplementedError, match=DEV):
        MOD.graph(MOD.Graph(), check_input_liveness=True)


# --------------------------------------------------- make_graphed_callables

def test_make_graphed_callables_refuses_what_it_cannot_graph():
    m = torch.nn.Linear(4, 4).to(DEV)
    m.register_forward_hook(lambda *a: None)
    with pytest.raises(ValueError, match="hooks"):
        MOD.make_graphed_callables(m, (torch.ones(4, device=DEV),))
    with pytest.raises(TypeError, match="tensors"):
        MOD.make_graphed_callables(lambda x, n: x, (torch.ones(4, device=DEV), 3))


@simdev_only
def test_a_small_mlp_through_host_kernels_is_refused_by_operator():
    # simdev's Linear and relu are host kernels, which cannot be captured: the
    # refusal names the operator (the MLP graphs where a backend's kernels are its own:
    # test_make_graphed_callables_trains_as_eager_with_native_kernels).
    mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to(DEV)
    with pytest.raises(RuntimeError, match=r"aten::\w+.*cannot be captured"):
        MOD.make_graphed_callables(mlp, (torch.randn(2, 8, device=DEV),))
    assert not MOD.is_current_stream_capturing()


# ------------------------------------------- native kernels (child processes)

# A child ends with os._exit once its checks passed: PyTorch's autograd device
# thread may drop a finished backward's Python state while the interpreter
# finalizes, and taking the GIL then aborts the process ("terminate called
# without an active exception"; pytorch/pytorch#117762), whatever the backend.
_EXIT = "\nimport os, sys\nsys.stdout.flush()\nsys.stderr.flush()\nos._exit(0)\n"


def _child(code, **env):
    full = {**os.environ, "SIMDEV_NATIVE_KERNELS": "1", **env}
    r = subprocess.run([sys.executable, "-c",
                        "import torch, torch_simdev\n" + textwrap.dedent(code) + _EXIT],
                       capture_output=True, text=True, env=full, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


@simdev_only
def test_native_kernels_are_captured_and_replayed_equal_to_eager():
    _child("""
        M = torch.simdev
        x = torch.randn(1024).to('simdev'); w = torch.randn(1024).to('simdev')
        def f(x):
            h = x
            for _ in range(10):
                h = torch.relu(h + w) * 0.5 + x
            return h
        g = M.Graph()
        with M.graph(g):
            y = f(x)
        for k in range(3):
            x.copy_(torch.randn(1024).to('simdev'))
            g.replay()
            torch.testing.assert_close(y.cpu(), f(x).cpu(), rtol=0, atol=0)
            h, xc, wc = x.cpu(), x.cpu(), w.cpu()
            for _ in range(10):
                h = torch.relu(h + wc) * 0.5 + xc
            torch.testing.assert_close(y.cpu(), h, rtol=1e-6, atol=1e-6)
    """)


@simdev_only
def test_make_graphed_callables_trains_a_small_mlp_as_eager_does():
    # simdev's native kernels (Linear's mm and addmm, relu and its backward, sum): a
    # training step through the graphed MLP (forward and backward replayed, loss and
    # SGD eager) gives eager's losses and parameters.
    _child("""
        M = torch.simdev
        def mlp():
            return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                       torch.nn.Linear(32, 32), torch.nn.ReLU(),
                                       torch.nn.Linear(32, 4))
        torch.manual_seed(1)
        eager = mlp().to('simdev'); graphed = mlp().to('simdev')
        graphed.load_state_dict(eager.state_dict())
        sample = torch.randn(8, 16, device='simdev')
        graphed = M.make_graphed_callables(graphed, (sample,))
        opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (eager, graphed)]
        for step in range(5):
            x = torch.randn(8, 16).to('simdev'); t = torch.randn(8, 4).to('simdev')
            losses = []
            for m, o in zip((eager, graphed), opts):
                o.zero_grad(set_to_none=False)
                loss = ((m(x) - t) ** 2).mean()
                loss.backward()
                o.step()
                losses.append(loss.item())
            assert abs(losses[0] - losses[1]) <= 1e-5 * max(1.0, abs(losses[0])), losses
        for p, q in zip(eager.parameters(), graphed.parameters()):
            torch.testing.assert_close(q.cpu(), p.cpu(), rtol=1e-5, atol=1e-6)
        graphed.eval()  # the original forward in another training state
        torch.testing.assert_close(graphed(x).cpu(), eager.eval()(x).cpu(), rtol=1e-5, atol=1e-6)
    """)


@simdev_only
def test_a_graphed_function_equals_eager_and_its_results_are_the_callers():
    _child("""
        M = torch.simdev
        def f(x, w):
            return torch.relu(x * w + 1.0) * x
        w = torch.randn(256).to('simdev').requires_grad_()
        sample = (torch.randn(256, device='simdev', requires_grad=True),
                  torch.randn(256, device='simdev', requires_grad=True))
        g = M.make_graphed_callables(f, sample)
        for step in range(3):
            x = torch.randn(256).to('simdev').requires_grad_()
            y = g(x, w)
            xe, we = x.detach().requires_grad_(), w.detach().requires_grad_()
            e = f(xe, we)
            torch.testing.assert_close(y.cpu(), e.cpu(), rtol=0, atol=0)
            (y * 3).sum().backward()
            (e * 3).sum().backward()
            torch.testing.assert_close(x.grad.cpu(), xe.grad.cpu(), rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(w.grad.cpu(), we.grad.cpu(), rtol=1e-6, atol=1e-6)
            w.grad = None
            kept = y.detach().clone()
            g(torch.randn(256).to('simdev'), w)  # the next call leaves this one's output alone
            torch.testing.assert_close(y.detach().cpu(), kept.cpu(), rtol=0, atol=0)
    """)


@simdev_only
def test_several_graphed_callables_share_a_pool_and_chain():
    _child("""
        M = torch.simdev
        torch.manual_seed(2)
        a = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).to('simdev')
        b = torch.nn.Linear(8, 2).to('simdev')
        ea = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).to('simdev')
        eb = torch.nn.Linear(8, 2).to('simdev')
        ea.load_state_dict(a.state_dict()); eb.load_state_dict(b.state_dict())
        sx = torch.randn(4, 8, device='simdev')
        sh = torch.randn(4, 8, device='simdev', requires_grad=True)
        pool = M.graph_pool_handle()
        ga, gb = M.make_graphed_callables((a, b), ((sx,), (sh,)), pool=pool)
        x = torch.randn(4, 8).to('simdev')
        out, ref = gb(ga(x)), eb(ea(x))
        torch.testing.assert_close(out.cpu(), ref.cpu(), rtol=1e-5, atol=1e-6)
        out.sum().backward(); ref.sum().backward()
        for p, q in zip(list(a.parameters()) + list(b.parameters()),
                        list(ea.parameters()) + list(eb.parameters())):
            torch.testing.assert_close(p.grad.cpu(), q.grad.cpu(), rtol=1e-5, atol=1e-6)
        assert torch.ops.simdev.mempool_use_count(0, list(pool)) == 4  # two graphs per callable
    """)


def test_a_backend_without_graph_members_refuses_clearly():
    if importlib.util.find_spec("torch_minimal") is None:
        pytest.skip("the minimal backend's package (build/python/torch_minimal) is not built")
    r = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import torch, torch_minimal
        M = torch.minimal
        assert M.is_current_stream_capturing() is False
        x = torch.ones(4, device='minimal')
        try:
            with M.graph(M.Graph()):
                x.clone()
        except (RuntimeError, NotImplementedError) as e:
            print('refused:', e)
        assert not M.is_current_stream_capturing()
    """)], capture_output=True, text=True, timeout=120,
        env={**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "refused:" in r.stdout and "minimal" in r.stdout.split("refused:")[1], r.stdout
    assert "capture" in r.stdout.split("refused:")[1], r.stdout
