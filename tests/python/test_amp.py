"""Automatic mixed precision on simdev (torch.autocast, GradScaler,
checkpointing), compared with the same code on the CPU where PyTorch's CPU
policy agrees with CUDA's."""
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from backend import DEV, MOD

EXACT = dict(rtol=0, atol=0)  # the kernels are the CPU's


def _linear_model(device):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                               torch.nn.Linear(16, 4)).to(device)


def test_amp_supported_dtypes_come_from_the_capability_schema():
    assert MOD.get_amp_supported_dtype() == [torch.float16, torch.bfloat16]
    assert torch.amp.is_autocast_available(DEV)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_autocast_runs_matrix_products_low_and_losses_in_float32_as_cuda(dtype):
    a = torch.randn(4, 8)
    b = torch.randn(8, 3)
    with torch.autocast(DEV, dtype=dtype):
        assert torch.is_autocast_enabled(DEV)
        mm = a.to(DEV) @ b.to(DEV)  # lower precision
        lin = F.linear(a.to(DEV), b.t().to(DEV))
        soft = torch.softmax(mm, dim=1)  # float32 (fp32_set_opt_dtype)
        loss = F.mse_loss(mm, torch.zeros_like(mm))  # float32
        added = a.to(DEV) + 1  # not listed: its input dtype
        mixed = torch.addcmul(torch.zeros(4, 3, device=DEV), mm, mm)  # promote: the widest
    assert (mm.dtype, lin.dtype) == (dtype, dtype)
    assert (soft.dtype, loss.dtype, added.dtype, mixed.dtype) == (torch.float32,) * 4
    with torch.autocast("cpu", dtype=dtype):  # the CPU's policy agrees on these
        cpu_mm = a @ b
        cpu_lin = F.linear(a, b.t())
        cpu_loss = F.mse_loss(cpu_mm, torch.zeros_like(cpu_mm))
    torch.testing.assert_close(mm.cpu(), cpu_mm, **EXACT)
    torch.testing.assert_close(lin.cpu(), cpu_lin, **EXACT)
    torch.testing.assert_close(loss.cpu(), cpu_loss, **EXACT)


def test_autocast_forward_and_backward_match_the_cpu():
    # mse_loss: float32 under both policies (log_softmax, in cross_entropy,
    # is float32 under CUDA's and bfloat16 under the CPU's).
    x = torch.randn(32, 8)
    y = torch.randn(32, 4)
    grads = {}
    for device in ("cpu", DEV):
        model = _linear_model(device)
        with torch.autocast(device, dtype=torch.bfloat16):
            out = model(x.to(device))
            loss = F.mse_loss(out, y.to(device))
        assert out.dtype == torch.bfloat16 and loss.dtype == torch.float32
        loss.backward()
        grads[device] = [p.grad.cpu() for p in model.parameters()]
    for g_sim, g_cpu in zip(grads[DEV], grads["cpu"]):
        assert g_sim.dtype == torch.float32
        torch.testing.assert_close(g_sim, g_cpu, **EXACT)


def test_torch_simdev_amp_autocast_is_the_device_autocast():
    x = torch.randn(2, 2, device=DEV)
    with MOD.amp.autocast():
        assert (x @ x).dtype == torch.float16
    with MOD.amp.autocast(dtype=torch.bfloat16):
        assert (x @ x).dtype == torch.bfloat16
    with MOD.amp.autocast(enabled=False):
        assert (x @ x).dtype == torch.float32


def test_autocast_to_a_dtype_the_schema_does_not_report():
    with pytest.raises(ValueError, match=rf"{DEV}: autocast to torch.float64 is not supported.*"
                                         r"torch.float16, torch.bfloat16"):
        MOD.amp.autocast(dtype=torch.float64)
    # torch.autocast itself (PyTorch's code) warns, naming the backend, and stays off.
    x = torch.randn(2, 2, device=DEV)
    with pytest.warns(UserWarning, match=f"In {DEV} autocast, but the target dtype is not supported"):
        with torch.autocast(DEV, dtype=torch.float64):
            assert (x @ x).dtype == torch.float32


def test_binary_cross_entropy_is_refused_under_autocast_as_on_cuda():
    p = torch.rand(4, device=DEV)
    with torch.autocast(DEV):
        with pytest.raises(RuntimeError, match="binary_cross_entropy.*refused under autocast"):
            F.binary_cross_entropy(p, torch.ones_like(p))
        loss = F.binary_cross_entropy_with_logits(p, torch.ones_like(p))
    assert loss.dtype == torch.float32


def _scaled_training(device, steps, poison_step=None):
    model = _linear_model(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler(device, init_scale=2.0**8, growth_interval=2)
    g = torch.Generator().manual_seed(3)
    scales, losses = [], []
    for step in range(steps):
        x = torch.randn(16, 8, generator=g).to(device)
        y = torch.randn(16, 4, generator=g).to(device)
        opt.zero_grad()
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = F.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        if step == poison_step:
            next(model.parameters()).grad[0, 0] = float("inf")
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
        losses.append(loss.item())
    return scales, losses, [p.detach().cpu() for p in model.parameters()]


def test_grad_scaler_unscales_skips_non_finite_steps_and_matches_the_cpu():
    cpu = _scaled_training("cpu", 6, poison_step=3)
    sim = _scaled_training(DEV, 6, poison_step=3)
    # Growth every 2 finite steps, halved at the step with an inf gradient.
    assert sim[0] == [256.0, 512.0, 512.0, 256.0, 256.0, 512.0]
    assert sim[0] == cpu[0]
    torch.testing.assert_close(torch.tensor(sim[1]), torch.tensor(cpu[1]), **EXACT)
    for a, b in zip(sim[2], cpu[2]):
        torch.testing.assert_close(a, b, **EXACT)


def test_grad_scaler_of_the_device_module():
    scaler = MOD.amp.GradScaler(init_scale=4.0)
    assert scaler._device == DEV and scaler.get_scale() == 4.0
    w = torch.ones(2, device=DEV, requires_grad=True)
    scaler.scale((w * 3).sum()).backward()
    assert w.grad.tolist() == [12.0, 12.0]
    opt = torch.optim.SGD([w], lr=1.0)
    scaler.unscale_(opt)
    assert w.grad.tolist() == [3.0, 3.0]


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return F.dropout(torch.tanh(self.lin(x)), p=0.5, training=True)


def _grads(device, mode, autocast=False):
    torch.manual_seed(0)
    block = _Block().to(device)
    x = torch.randn(4, 8).to(device).requires_grad_()
    torch.manual_seed(9)
    ctx = torch.autocast(device, dtype=torch.bfloat16) if autocast else torch.autocast(device, enabled=False)
    with ctx:
        out = block(x) if mode is None else checkpoint(block, x, use_reentrant=mode)
    out.float().sum().backward()
    return [x.grad.cpu()] + [p.grad.cpu() for p in block.parameters()]


@pytest.mark.parametrize("use_reentrant", [True, False])
@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "autocast"])
def test_checkpoint_with_dropout_gives_the_gradients_of_the_plain_forward(use_reentrant, autocast):
    MOD.init()  # as after any device use: checkpoint then saves the device RNG state
    assert MOD._initialized
    plain = _grads(DEV, None, autocast)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "None of the inputs have requires_grad" or the like
        checkpointed = _grads(DEV, use_reentrant, autocast)
    for a, b in zip(checkpointed, plain):
        torch.testing.assert_close(a, b, **EXACT)
    cpu = _grads("cpu", use_reentrant, autocast)  # the same draws as on the CPU
    for a, b in zip(checkpointed, cpu):
        torch.testing.assert_close(a, b, **EXACT)
