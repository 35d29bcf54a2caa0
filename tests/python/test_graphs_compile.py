"""torch.compile(mode="reduce-overhead") on the backend: compiled graphs captured into the
backend's graphs and replayed, through Inductor's graph policy (python/accelkit/compile/graphs.py,
Note [Graphs under torch.compile]; docs/graphs.md).

Compiling is slow: these tests run in the ctest entry python.simdev.compile
(ACCELKIT_COMPILE_TESTS=1) and skip in the directory-wide runs."""
import os
import warnings

import pytest
import torch

from backend import DEV, IS_SIMDEV, MOD

ENABLED = os.environ.get("ACCELKIT_COMPILE_TESTS") == "1"
pytestmark = pytest.mark.skipif(
    not ENABLED,
    reason="compile tests are slow: ctest python.simdev.compile runs them (ACCELKIT_COMPILE_TESTS=1)")

CALLS = [0]


def _rotate(x):
    y = torch.empty_like(x)
    h = x.numel() // 2
    y[:h].copy_(x[h:])
    y[h:].copy_(x[:h])
    return y


@torch.library.custom_op("accelkit_graphs_test::rotate", mutates_args=())
def rotate(x: torch.Tensor) -> torch.Tensor:
    """An operator of the backend's own work (device copies): the compiled code calls it
    as an extern kernel, which a graph captures."""
    CALLS[0] += 1
    return _rotate(x)


@rotate.register_fake
def _(x):
    return torch.empty_like(x)


@pytest.fixture(autouse=True)
def _reset_dynamo():
    import torch._inductor.config as iconfig
    torch.compiler.reset()
    with iconfig.patch(compile_threads=1, fx_graph_cache=False):
        yield
    torch.compiler.reset()


def test_the_policy_is_installed_with_inductor():
    import torch._inductor.compile_fx  # noqa: F401 (the backend registers when it is imported)
    import torch._inductor.config as iconfig
    policy = iconfig.cudagraph_policy
    assert policy is not None and type(policy).__name__ == f"{DEV.capitalize()}GraphPolicy"


def test_reduce_overhead_replays_a_captured_graph():
    f = torch.compile(lambda x: rotate(rotate(x)), mode="reduce-overhead")
    x = torch.randn(1024).to(DEV)
    CALLS[0] = 0
    first = f(x)
    assert torch.equal(first.cpu(), x.cpu())
    assert CALLS[0] == 4  # warm-up and capture, each calling the operator twice
    kept = first.clone()
    for _ in range(3):
        x = torch.randn(1024).to(DEV)
        out = f(x)
        assert torch.equal(out.cpu(), x.cpu())
    assert CALLS[0] == 4  # replayed: the operator's Python code did not run again
    assert torch.equal(first.cpu(), kept.cpu())  # an earlier output stays the caller's


def test_without_reduce_overhead_nothing_is_captured():
    f = torch.compile(lambda x: rotate(x))
    x = torch.randn(256).to(DEV)
    CALLS[0] = 0
    for _ in range(3):
        assert torch.equal(f(x).cpu(), _rotate(x).cpu())
    assert CALLS[0] == 3


@pytest.mark.skipif(not IS_SIMDEV, reason="simdev's compiled kernels run on the host")
def test_compiled_host_kernels_run_as_compiled_with_a_warning():
    f = torch.compile(lambda x: (x * 2 + 1).relu(), mode="reduce-overhead")
    x = torch.randn(1000).to(DEV)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = f(x)
    assert any(f"skipping {DEV} graphs" in str(w.message) and "cannot be captured" in str(w.message)
               for w in caught), [str(w.message) for w in caught]
    torch.testing.assert_close(out.cpu(), (x.cpu() * 2 + 1).relu())
    x2 = torch.randn(1000).to(DEV)
    torch.testing.assert_close(f(x2).cpu(), (x2.cpu() * 2 + 1).relu())
    assert not MOD.is_current_stream_capturing()
