"""The accelkit demo: simdev, a simulated accelerator, as a PyTorch device.

Prints the device and capability report, trains a small model on simdev with
the same computation on the CPU beside it, then shows the memory statistics
and which operators ran on the CPU (through the fallback or as host kernels).
"""
import argparse
import time

import torch
import torch.nn.functional as F

import torch_simdev  # noqa: F401  registers the "simdev" device and torch.simdev


def train(device, steps, log_every=0):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 128), torch.nn.ReLU(),
        torch.nn.Linear(128, 64), torch.nn.ReLU(),
        torch.nn.Linear(64, 10)).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(256, 32, generator=g)
    y = (x[:, :10].argmax(dim=1))  # a learnable rule
    x, y = x.to(device), y.to(device)
    losses = []
    t0 = time.perf_counter()
    for step in range(1, steps + 1):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if log_every and (step % log_every == 0 or step == 1):
            acc = (model(x).argmax(dim=1) == y).float().mean().item()
            print(f"  step {step:3d}  loss {losses[-1]:.4f}  accuracy {acc:.2%}")
    return losses, time.perf_counter() - t0


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()

    print(torch.simdev.report())
    print(f"torch.device('simdev:1') -> {torch.device('simdev:1')}; "
          f"torch.accelerator.device_count() = {torch.accelerator.device_count()}\n")

    print(f"Training an MLP for {args.steps} steps on simdev:0 (Adam):")
    sim_losses, sim_time = train("simdev", args.steps, log_every=max(1, args.steps // 6))
    cpu_losses, cpu_time = train("cpu", args.steps)
    diff = max(abs(a - b) for a, b in zip(sim_losses, cpu_losses))
    print(f"\nfinal loss: simdev {sim_losses[-1]:.6f}, cpu {cpu_losses[-1]:.6f} "
          f"(largest difference over all steps {diff:.2e})")
    print(f"time: simdev {sim_time:.2f} s, cpu {cpu_time:.2f} s\n")

    stats = torch.simdev.memory_stats(0)
    print("Memory on simdev:0:")
    for key in ["allocation.all.current", "allocation.all.allocated", "allocated_bytes.all.peak",
                "reserved_bytes.all.current", "num_device_alloc", "num_alloc_retries", "num_ooms"]:
        print(f"  {key:28s} {stats[key]}")
    print(f"  memory_allocated()           {torch.simdev.memory_allocated(0)}")

    print("\nOperators that ran on the CPU, through the fallback or as host kernels"
          " (most time first; the ones to write device kernels for):")
    print(f"  {'operator':45s} {'calls':>7s} {'ms':>9s}")
    for op, count, ms in torch.simdev.fallback_report()[:15]:
        print(f"  {op:45s} {count:7d} {ms:9.2f}")


if __name__ == "__main__":
    main()
