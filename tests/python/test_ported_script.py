"""A training script written for torch.cuda, run on simdev with only the
device name replaced, against the same training computed on the CPU."""
import math
import textwrap

import pytest
import torch
import torch.nn as nn

from backend import DEV, MOD

# Seeding, a DataLoader with pinned memory, non-blocking copies on a side
# stream, events with timing, AMP with a GradScaler, checkpointing (with
# dropout), the profiler, and save/load with map_location: what a CUDA
# training script reaches for, written as one is.
CUDA_SCRIPT = textwrap.dedent(
    """
    import os
    import torch
    import torch.nn as nn
    from torch.utils.checkpoint import checkpoint
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    torch.cuda.manual_seed_all(0)
    device = torch.device("cuda:0")

    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.25), nn.Linear(32, 4)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cuda")
    data = TensorDataset(inputs, targets)
    loader = DataLoader(data, batch_size=16, pin_memory=True, pin_memory_device="cuda")

    copy_stream = torch.cuda.Stream()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    losses, step_ms, pinned = [], [], []
    with torch.autograd.profiler.profile(use_device="cuda") as prof:
        for epoch in range(2):
            for x, y in loader:
                pinned.append(x.is_pinned())
                with torch.cuda.stream(copy_stream):
                    x = x.to(device, non_blocking=True)
                    y = y.to(device, non_blocking=True)
                torch.cuda.current_stream().wait_stream(copy_stream)
                start.record()
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    h = checkpoint(model[:3], x, use_reentrant=False)
                    out = model[3](h)
                loss = nn.functional.mse_loss(out.float(), y)
                opt.zero_grad()
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
                end.record()
                end.synchronize()
                step_ms.append(start.elapsed_time(end))
                losses.append(loss.item())
    torch.cuda.synchronize()

    path = os.path.join(tmp, "model.pt")
    torch.save(model.state_dict(), path)
    restored = torch.load(path, map_location="cuda:1" if torch.cuda.device_count() > 1 else "cuda:0")
    profiled = [e for e in prof.key_averages() if e.key == "aten::addmm"]
    """
)


def run_ported(tmp_path, inputs, targets):
    namespace = {"inputs": inputs, "targets": targets, "tmp": str(tmp_path)}
    exec(compile(CUDA_SCRIPT.replace("cuda", DEV), "ported_script", "exec"), namespace)
    return namespace


def run_on_cpu(inputs, targets):
    """The same training, written for the CPU: the same seed, batches,
    dropout draws, autocast dtype and scaler (which does nothing on the CPU
    at these magnitudes but check for overflow)."""
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.25), nn.Linear(32, 4))
    # The device's dropout draws from its own generator, seeded 0 and
    # untouched by the weights' initialization (as CUDA's): so here.
    torch.manual_seed(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cpu")
    losses = []
    for epoch in range(2):
        for i in range(0, len(inputs), 16):
            x, y = inputs[i : i + 16], targets[i : i + 16]
            with torch.autocast("cpu", dtype=torch.bfloat16):
                h = checkpoint(model[:3], x, use_reentrant=False)
                out = model[3](h)
            loss = nn.functional.mse_loss(out.float(), y)
            opt.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            losses.append(loss.item())
    return model, losses


def test_a_cuda_training_script_runs_unchanged_on_simdev_and_matches_the_cpu(tmp_path):
    g = torch.Generator().manual_seed(1)
    inputs = torch.randn(64, 16, generator=g)
    targets = torch.randn(64, 4, generator=g)

    ns = run_ported(tmp_path, inputs, targets)
    cpu_model, cpu_losses = run_on_cpu(inputs, targets)

    # Pinned batches from the DataLoader, positive step times.
    assert all(ns["pinned"]) and len(ns["pinned"]) == 8
    assert all(ms > 0 for ms in ns["step_ms"])
    # The same losses, step by step, and the same weights at the end: the
    # first step exactly; later ones within bfloat16's rounding (a matrix
    # product's operands may reach the CPU's kernel in another layout, which
    # sums in another order). Another dropout mask, or a recompute that did
    # not restore the generator, changes a loss by percents.
    assert len(ns["losses"]) == len(cpu_losses) == 8
    assert ns["losses"][0] == cpu_losses[0]
    for got, want in zip(ns["losses"], cpu_losses):
        assert math.isfinite(got)
        assert got == pytest.approx(want, rel=1e-3)
    for (name, p), q in zip(ns["model"].state_dict().items(), cpu_model.state_dict().values()):
        assert p.device.type == DEV
        torch.testing.assert_close(p.cpu(), q, rtol=1e-3, atol=1e-4, msg=name)
    # The second epoch's losses are lower: the script trained.
    assert sum(ns["losses"][4:]) < sum(ns["losses"][:4])
    # Saved and loaded onto another device, unchanged.
    want_device = f"{DEV}:1" if MOD.device_count() > 1 else f"{DEV}:0"
    for name, t in ns["restored"].items():
        assert str(t.device) == want_device
        torch.testing.assert_close(t.cpu(), ns["model"].state_dict()[name].cpu(), rtol=0, atol=0)
    # The profiler saw the matrix products, with device time.
    assert ns["profiled"], "aten::addmm missing from the profile"
    assert ns["profiled"][0].count >= 8
    assert ns["profiled"][0].device_time_total > 0
