"""Trains a small MLP and a small CNN on the cudart backend, on torch.cuda and on the CPU, from
the same initial weights and data, and compares them (issue 20; run by scripts/gpu_check).

cudart runs add, mul and relu as its own CUDA kernels and everything else through the SDK's
CPU fallback, so its losses must follow the CPU's closely (the check: every loss within 1e-4
relative, the final weights within 1e-4, and the loss falling). torch.cuda's differ by its own
kernels' rounding (TF32 off); they are printed for comparison, and its time per step beside
cudart's. Exit status 1 when cudart does not match the CPU.

usage: gpu_check_train.py [--steps N] [--json PATH]"""
import argparse
import json
import sys
import time

import torch
import torch.nn.functional as F
import torch_cudart  # noqa: F401  (registers torch.cudart)


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32),
                               torch.nn.Tanh(), torch.nn.Linear(32, 4))


def cnn():
    return torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU(),
                               torch.nn.MaxPool2d(2), torch.nn.Conv2d(4, 8, 3, padding=1),
                               torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                               torch.nn.Linear(8, 4))


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()
    elif device == "cudart":
        torch.cudart.synchronize()


def train(make, shape, device, steps):
    torch.manual_seed(0)
    model = make().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, *shape, generator=g).to(device)
    y = torch.randint(0, 4, (64,), generator=g).to(device)
    losses = []
    sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    sync(device)
    ms = (time.perf_counter() - t0) * 1e3 / steps
    return losses, [p.detach().cpu() for p in model.parameters()], ms


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--json")
    args = ap.parse_args()
    if torch.cudart.device_count() == 0:
        print(f"gpu_check_train: no cudart device: {torch.cudart.init_error()}")
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    devices = ["cpu", "cudart"] + (["cuda"] if torch.cuda.is_available() else [])
    ok = True
    out = {}
    for name, make, shape in (("mlp", mlp, (16,)), ("cnn", cnn, (1, 8, 8))):
        runs = {d: train(make, shape, d, args.steps) for d in devices}
        cpu_losses, cpu_params, _ = runs["cpu"]
        print(f"\n{name}: {args.steps} steps of SGD (momentum 0.9), batch 64")
        out[name] = {}
        for d, (losses, params, ms) in runs.items():
            loss_diff = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, cpu_losses))
            param_diff = max((p - q).abs().max().item() for p, q in zip(params, cpu_params))
            print(f"  {d:7s} loss {losses[0]:.5f} -> {losses[-1]:.5f}; vs CPU: loss rel diff "
                  f"{loss_diff:.2e}, weights max diff {param_diff:.2e}; {ms:.2f} ms/step")
            out[name][d] = {"losses": losses, "loss_rel_diff": loss_diff,
                            "param_max_diff": param_diff, "ms_per_step": ms}
        losses, _, _ = runs["cudart"]
        fine = (out[name]["cudart"]["loss_rel_diff"] <= 1e-4 and
                out[name]["cudart"]["param_max_diff"] <= 1e-4 and losses[-1] < losses[0])
        print(f"  cudart {'matches' if fine else 'DOES NOT match'} the CPU")
        ok = ok and fine
    print("\nfallback report (cudart, most time first):")
    for op, count, ms in torch.cudart.fallback_report()[:12]:
        print(f"  {op:48s} {count:6d} calls {ms:9.1f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
