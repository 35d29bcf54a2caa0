"""simdev through PyTorch against the CPU, measured in the same run.

  python bench/simdev_bench.py           the full run
  python bench/simdev_bench.py --quick   tiny sizes, to check that it runs

Prints each figure on simdev next to the same on the CPU, with the ratio:
per-op latency of a small elementwise op and of empty+free, host<->device
copy bandwidth at 256 MiB against memcpy (a CPU tensor copy), and the
training-step time of an MLP.
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import torch_simdev  # noqa: F401


def per_call_us(fn, calls, repeats=7):
    fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(samples)


def row(name, sim, cpu, unit, lower_is_better=True):
    ratio = sim / cpu if lower_is_better else cpu / sim
    print(f"{name:52s} {sim:12.2f} {cpu:12.2f} {unit:6s} {ratio:8.2f}x")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    calls = 50 if args.quick else 5000
    mib = 4 if args.quick else 256
    steps = 3 if args.quick else 20
    torch.set_num_threads(1)

    print(f"{'figure':52s} {'simdev':>12s} {'cpu':>12s} {'unit':6s} {'simdev/cpu':>9s}")
    a_s, b_s = torch.randn(1024, device="simdev"), torch.randn(1024, device="simdev")
    a_c, b_c = a_s.cpu(), b_s.cpu()
    torch.accelerator.synchronize()
    row("add of two 1024-float tensors (per op)", per_call_us(lambda: a_s + b_s, calls),
        per_call_us(lambda: a_c + b_c, calls), "us")
    row("multiply by a Python scalar, 1024 floats (per op)", per_call_us(lambda: a_s * 0.5, calls),
        per_call_us(lambda: a_c * 0.5, calls), "us")
    # The same call on both sides: naming a device costs the Python argument
    # parser about 0.3 us whichever device it is.
    row("empty(1024, device=...) + free (per pair)",
        per_call_us(lambda: torch.empty(1024, device="simdev"), calls),
        per_call_us(lambda: torch.empty(1024, device="cpu"), calls), "us")
    row("empty_like(1024 floats) + free (per pair)", per_call_us(lambda: torch.empty_like(a_s), calls),
        per_call_us(lambda: torch.empty_like(a_c), calls), "us")

    def make_step(device):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                    torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                    torch.nn.Linear(256, 10)).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x = torch.randn(128, 64).to(device)
        y = torch.randint(0, 10, (128,)).to(device)

        def step():
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()

        for _ in range(3):
            step()
        return step

    def block_ms(step):
        torch.accelerator.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        torch.accelerator.synchronize()
        return (time.perf_counter() - t0) / steps * 1e3

    # Blocks of steps on each device in turn, the median of each: a 2-core
    # machine's noise hits both sides alike.
    sim_step, cpu_step = make_step("simdev"), make_step("cpu")
    sim_ms, cpu_ms = [], []
    for _ in range(3 if args.quick else 9):
        sim_ms.append(block_ms(sim_step))
        cpu_ms.append(block_ms(cpu_step))
    row("MLP training step (SGD, batch 128)", statistics.median(sim_ms), statistics.median(cpu_ms), "ms")

    # The same with backward run on the calling thread, as the CPU's always
    # is: what is left once the engine's device-thread handoff (below) is
    # taken out. A diagnostic, not the default.
    torch.autograd.set_multithreading_enabled(False)
    sim_ms, cpu_ms = [], []
    for _ in range(3 if args.quick else 9):
        sim_ms.append(block_ms(sim_step))
        cpu_ms.append(block_ms(cpu_step))
    torch.autograd.set_multithreading_enabled(True)
    row("  the same, backward on the calling thread", statistics.median(sim_ms),
        statistics.median(cpu_ms), "ms")

    # Part of every backward on a device other than the CPU: PyTorch's
    # autograd engine runs it on a thread of its own for the device and the
    # caller waits for it (the same for CUDA). A graph of one tiny op shows
    # that fixed cost.
    def tiny_backward(device):
        x = torch.ones(4, device=device, requires_grad=True)
        loss = (x * 2).sum()
        return lambda: loss.backward(retain_graph=True)

    row("backward of a one-op graph (engine thread handoff)",
        per_call_us(tiny_backward("simdev"), calls // 10), per_call_us(tiny_backward("cpu"), calls // 10), "us")

    # Last, so that the process does not exit straight after a backward:
    # PyTorch's autograd device thread may still be releasing the graph's
    # thread-local state, and a Python interpreter that finalizes under it
    # aborts the process ("terminate called without an active exception").
    n = mib << 20
    host = torch.empty(n, dtype=torch.uint8).fill_(7)
    host2 = torch.empty(n, dtype=torch.uint8)
    dev = torch.empty(n, dtype=torch.uint8, device="simdev")
    reps = 3 if args.quick else 5

    def bandwidth(fn):
        fn()
        best = min(_timed(fn) for _ in range(reps))
        return n / best / 1e9

    def _timed(fn):
        t0 = time.perf_counter()
        fn()
        torch.accelerator.synchronize()
        return time.perf_counter() - t0

    memcpy = bandwidth(lambda: host2.copy_(host))
    h2d = bandwidth(lambda: dev.copy_(host))
    d2h = bandwidth(lambda: host2.copy_(dev))
    print(f"{'host->device copy, ' + str(mib) + ' MiB (GB/s)':52s} {h2d:12.2f} {memcpy:12.2f} {'GB/s':6s} {h2d / memcpy:8.2f}x of memcpy")
    print(f"{'device->host copy, ' + str(mib) + ' MiB (GB/s)':52s} {d2h:12.2f} {memcpy:12.2f} {'GB/s':6s} {d2h / memcpy:8.2f}x of memcpy")
    del dev

    print("\nvisible to the host:", torch.simdev.get_device_properties(0)["host_visible_memory"])


if __name__ == "__main__":
    main()
