"""The fused recurrent cells (Note [Fused recurrent cells] in include/accelkit/torch/recurrent.hpp):
nn.LSTM, nn.GRU, LSTMCell and GRUCell take _thnn_fused_lstm_cell / _thnn_fused_gru_cell on
the device, as on CUDA; their outputs, gradients (the fused backward) and second
derivatives (create_graph: the differentiable backward) match the CPU's unfused cells."""
import copy

import pytest
import torch

from backend import DEV

FUSED = ["_thnn_fused_lstm_cell", "_thnn_fused_lstm_cell_backward_impl", "_thnn_fused_gru_cell",
         "_thnn_fused_gru_cell_backward"]
LSTM_CELL = torch.ops.aten._thnn_fused_lstm_cell
GRU_CELL = torch.ops.aten._thnn_fused_gru_cell
TOL = dict(rtol=1e-9, atol=1e-9)  # float64


def grads(module, inputs, create_graph=False):
    """(outputs, gradients of a weighted sum of the outputs w.r.t. inputs and parameters)."""
    out = module(*inputs)
    flat = [t for t in (out if isinstance(out, tuple) else (out,)) for t in
            (t if isinstance(t, tuple) else (t,))]
    loss = sum((t * torch.linspace(-1, 1, t.numel(), dtype=t.dtype, device=t.device)
                .view_as(t)).sum() for t in flat)
    wrt = [t for t in inputs if t.requires_grad] + list(module.parameters())
    return flat, torch.autograd.grad(loss, wrt, create_graph=create_graph)


def on_device(module, inputs):
    return (copy.deepcopy(module).to(DEV),
            [t.detach().to(DEV).requires_grad_(t.requires_grad) for t in inputs])


def assert_matches_cpu(module, inputs):
    want_out, want_grads = grads(module, inputs)
    got_out, got_grads = grads(*on_device(module, inputs))
    for got, want in zip(got_out + list(got_grads), want_out + list(want_grads)):
        assert got.device.type == DEV
        torch.testing.assert_close(got.cpu(), want, **TOL)


def test_the_fused_cells_are_the_devices_kernels_and_the_layers_call_them():
    from torch.utils._python_dispatch import TorchDispatchMode

    for op in FUSED:
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{op}", "PrivateUse1"), op

    class Called(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.add(func._schema.name)
            return func(*args, **(kwargs or {}))

    for kind in ("LSTM", "GRU"):
        module = getattr(torch.nn, kind)(3, 2).to(DEV)
        x = torch.randn(4, 1, 3, device=DEV, requires_grad=True)
        with Called() as called:
            module(x)[0].sum().backward()
        fused = [op for op in FUSED if kind.lower() in op]
        assert {f"aten::{op}" for op in fused} <= called.names, (kind, sorted(called.names))


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
@pytest.mark.parametrize("bias", [True, False])
def test_recurrent_layers_match_the_cpu(kind, bias):
    torch.manual_seed(0)
    extra = {"proj_size": 2} if kind == "LSTM" and bias else {}
    module = getattr(torch.nn, kind)(5, 4, num_layers=2, bias=bias, batch_first=True,
                                     bidirectional=True, dtype=torch.float64, **extra)
    x = torch.randn(3, 4, 5, dtype=torch.float64, requires_grad=True)
    assert_matches_cpu(module, [x])


@pytest.mark.parametrize("kind", ["LSTMCell", "GRUCell"])
@pytest.mark.parametrize("bias", [True, False])
def test_cells_match_the_cpu(kind, bias):
    torch.manual_seed(1)
    module = getattr(torch.nn, kind)(5, 3, bias=bias, dtype=torch.float64)
    x = torch.randn(2, 5, dtype=torch.float64, requires_grad=True)
    h = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    state = (h, torch.randn(2, 3, dtype=torch.float64, requires_grad=True)) if kind == "LSTMCell" else h

    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.cell = module

        def forward(self, x, *state):
            return self.cell(x, state if len(state) == 2 else state[0])

    assert_matches_cpu(Step(), [x, *(state if isinstance(state, tuple) else (state,))])


@pytest.mark.parametrize("which", [0, 1])
def test_lstm_cell_backward_through_one_output(which):
    # The fused backward takes an undefined gradient for the output not used.
    torch.manual_seed(2)
    cell = torch.nn.LSTMCell(4, 3, dtype=torch.float64)
    x = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)

    class One(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.cell = cell

        def forward(self, x):
            return self.cell(x)[which]

    assert_matches_cpu(One(), [x])


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_second_derivatives_match_the_cpu(kind):
    torch.manual_seed(3)
    module = getattr(torch.nn, kind)(3, 2, dtype=torch.float64)
    x = torch.randn(3, 2, 3, dtype=torch.float64, requires_grad=True)

    def second(module, x):
        _, first = grads(module, [x], create_graph=True)
        penalty = sum((g * g).sum() for g in first)
        return torch.autograd.grad(penalty, [x] + list(module.parameters()))

    want = second(module, x)
    device_module, (device_x,) = on_device(module, [x])
    got = second(device_module, device_x)
    for g, w in zip(got, want):
        torch.testing.assert_close(g.cpu(), w, **TOL)


@pytest.mark.parametrize("op,gates", [(LSTM_CELL, 4),
                                       (GRU_CELL, 3)])
def test_gradcheck_and_gradgradcheck_of_the_fused_operators(op, gates):
    torch.manual_seed(4)

    def make(*shape):
        return torch.randn(*shape, dtype=torch.float64, device=DEV, requires_grad=True)

    args = (make(2, 2 * gates), make(2, 2 * gates), make(2, 2), make(2 * gates), make(2 * gates))
    # The workspace (LSTM's third output) is not differentiable.
    fn = (lambda *a: op(*a)[:2]) if gates == 4 else (lambda *a: op(*a)[0])
    assert torch.autograd.gradcheck(fn, args)
    assert torch.autograd.gradgradcheck(fn, args)


def test_the_workspace_holds_what_cudas_does():
    torch.manual_seed(5)
    ig, hg = torch.randn(2, 8, dtype=torch.float64), torch.randn(2, 8, dtype=torch.float64)
    cx, b1, b2 = torch.randn(2, 2, dtype=torch.float64), torch.randn(8, dtype=torch.float64), \
        torch.randn(8, dtype=torch.float64)
    hy, cy, ws = LSTM_CELL(*(t.to(DEV) for t in (ig, hg, cx, b1, b2)))
    g = ((hg + b2) + (ig + b1)).chunk(4, 1)
    acts = [g[0].sigmoid(), g[1].sigmoid(), g[2].tanh(), g[3].sigmoid()]
    torch.testing.assert_close(ws.cpu(), torch.cat(acts, 1), **TOL)
    torch.testing.assert_close(cy.cpu(), acts[1] * cx + acts[0] * acts[2], **TOL)
    torch.testing.assert_close(hy.cpu(), acts[3] * (acts[1] * cx + acts[0] * acts[2]).tanh(),
                               **TOL)
    hx = torch.randn(2, 2, dtype=torch.float64)
    hy, ws = GRU_CELL(*(t.to(DEV) for t in (ig[:, :6], hg[:, :6], hx)))
    assert ws.shape == (2, 10)
    torch.testing.assert_close(ws.cpu()[:, 6:8], hx, **TOL)
    torch.testing.assert_close(ws.cpu()[:, 8:], hg[:, 4:6], **TOL)


def test_bad_arguments_are_refused_with_cudas_checks():
    g = torch.randn(2, 8, device=DEV)
    with pytest.raises(RuntimeError, match=r"Expected 2-dimensional tensor.*'input_gates'.*"
                                           r"_thnn_fused_lstm_cell"):
        LSTM_CELL(g[0], g[0], torch.randn(2, device=DEV))
    with pytest.raises(RuntimeError, match=r"'cx'.*_thnn_fused_lstm_cell"):
        LSTM_CELL(g, g, torch.randn(2, 3, device=DEV))
    with pytest.raises(RuntimeError, match=r"'hidden_gates'.*_thnn_fused_gru_cell"):
        GRU_CELL(torch.randn(2, 6, device=DEV), torch.randn(2, 3, device=DEV),
                                   torch.randn(2, 2, device=DEV))
    with pytest.raises(RuntimeError, match=r"Expected all tensors to be on the same device.*"
                                           r"_thnn_fused_lstm_cell"):
        LSTM_CELL(g, g, torch.randn(2, 2))


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
@pytest.mark.parametrize("bias", [True, False])
def test_gradcheck_and_gradgradcheck_of_the_layers_on_the_device(kind, bias):
    # As PyTorch's own test of the layers' gradients and double backward does.
    torch.manual_seed(6)
    module = getattr(torch.nn, kind)(4, 4, bias=bias, dtype=torch.float64).to(DEV)
    x = torch.rand(1, 3, 4, dtype=torch.float64, device=DEV, requires_grad=True)

    def flat(x):
        out, state = module(x)
        return (out, *(state if isinstance(state, tuple) else (state,)))

    assert torch.autograd.gradcheck(flat, (x,), check_batched_grad=False)
    assert torch.autograd.gradgradcheck(flat, (x,), check_batched_grad=False)
