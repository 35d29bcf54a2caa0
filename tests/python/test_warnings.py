"""Warnings: each user-visible call on the device warns as the same call on
the CPU does, the same warnings as often (Note [Composites the CPU must run],
include/accelkit/torch/ops.hpp). PyTorch's warn-once warnings are made to
warn on every call (torch.set_warn_always) so that neither side takes them
from the other. The OpInfo comparison (tests/opinfo) checks the warnings of
every op_db sample it runs on simdev; this file checks the operators that
warn on the CPU in their first samples, on every backend."""
import warnings

import pytest
import torch

from backend import DEV


@pytest.fixture(autouse=True)
def warn_always():
    before = torch.is_warn_always_enabled()
    torch.set_warn_always(True)
    yield
    torch.set_warn_always(before)


def recorded(f):
    """The warnings f() raised, each as "Category: message"."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        f()
    return sorted(f"{w.category.__name__}: {w.message}" for w in caught)


def on_both(f, *tensors):
    """The warnings of f on CPU tensors and on their device copies."""
    want = recorded(lambda: f(*[t.clone() for t in tensors]))
    got = recorded(lambda: f(*[t.to(DEV) for t in tensors]))
    assert want, "the CPU raised no warning: the case tests nothing"
    return got, want


def test_index_with_a_uint8_mask_warns_once_as_on_the_cpu():
    x = torch.arange(6.0).reshape(2, 3)
    mask = torch.tensor([1, 0], dtype=torch.uint8)
    got, want = on_both(lambda a, m: a[m], x, mask)
    assert len(want) == 1 and "uint8" in want[0]
    assert got == want


@pytest.mark.parametrize("inplace", [False, True], ids=["scatter", "scatter_"])
def test_scatter_with_a_reduce_warns_once_as_on_the_cpu(inplace):
    x = torch.zeros(3, 4)
    index = torch.tensor([[0, 1], [1, 2]])
    src = torch.ones(2, 2)

    def f(a, i, s):
        return a.scatter_(0, i, s, reduce="add") if inplace else torch.scatter(a, 0, i, s, reduce="add")
    got, want = on_both(f, x, index, src)
    assert len(want) == 1 and "reduce argument" in want[0]
    assert got == want


# op_db's operators whose first samples warn on the CPU in float32 (a
# deprecated argument or function, degrees of freedom <= 0, a 3-d input to
# dropout2d, a missing stft window, ...).
WARNING_OPS = ["scatter", "std.unbiased", "var.unbiased", "std_mean.unbiased", "var_mean.unbiased",
               "nn.functional.kl_div", "nn.functional.dropout2d", "nn.functional.upsample_nearest",
               "nn.functional.upsample_bilinear", "stft", "qr", "lu", "triangular_solve"]


@pytest.fixture(scope="module")
def op_db_ops():
    pytest.importorskip("expecttest")
    from torch.testing._internal.common_methods_invocations import op_db
    return {o.name + ("." + o.variant_test_name if o.variant_test_name else ""): o for o in op_db}


@pytest.mark.parametrize("name", WARNING_OPS)
def test_op_db_samples_warn_as_on_the_cpu(op_db_ops, name):
    op = op_db_ops[name]
    warned = 0
    for i, s in enumerate(op.sample_inputs("cpu", torch.float32)):
        if i >= 4:
            break

        def run(device, s=s):
            def move(x):
                if isinstance(x, torch.Tensor):
                    return x.to(device)
                if isinstance(x, (list, tuple)):
                    return type(x)(move(e) for e in x)
                return x
            torch.manual_seed(0)
            op(move(s.input), *move(s.args), **{k: move(v) for k, v in s.kwargs.items()})
        want = recorded(lambda: run("cpu"))
        got = [w.replace(f"{DEV}:0", "cpu").replace(DEV, "cpu") for w in recorded(lambda: run(DEV))]
        assert sorted(got) == want, f"sample {i}"
        warned += bool(want)
    assert warned, f"no sample of {name} warned on the CPU: the case tests nothing"


@pytest.mark.parametrize("loss", ["mse_loss", "smooth_l1_loss"])
def test_a_reduced_loss_warns_as_little_as_on_the_cpu(loss):
    # No warning on the CPU; PyTorch's structured composite would hand the
    # out= form a result that its shape function resizes, with a warning.
    f = getattr(torch.nn.functional, loss)
    a, b = torch.randn(5), torch.randn(5)
    want = recorded(lambda: f(a, b))
    got = recorded(lambda: f(a.to(DEV), b.to(DEV)))
    assert want == [] and got == want


def test_a_complex_half_conversion_warns_once_as_on_the_cpu():
    # PyTorch warns when a ComplexHalf tensor is made; the SDK's staging
    # buffers on the host (memory the host cannot reach) make none of their own.
    got, want = on_both(lambda a: a.to(torch.chalf), torch.arange(4.0))
    assert len(want) == 1 and "ComplexHalf" in want[0]
    assert got == want
