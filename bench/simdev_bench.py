"""simdev through PyTorch against the CPU, measured in the same run.

  python bench/simdev_bench.py           the full run
  python bench/simdev_bench.py --quick   tiny sizes, to check that it runs

Prints the machine first (CPU model, usable CPUs, C library), then each
figure on simdev next to the same on the CPU, with the ratio: per-op
latency of a small elementwise op and of empty+free, host<->device copy
bandwidth at 256 MiB (into and from pageable and pinned memory) against
memcpy (a CPU tensor copy), and the training-step time of an MLP.

Note [Rounds and spread]
Every row is measured in rounds, simdev and the CPU taking turns within
each round (the other way round every other round), so that a slow spell
of a shared machine lands on both sides alike. A row prints the median of its rounds for each side with the
interquartile range in brackets (the middle half of the rounds), and the
median of the per-round ratios with theirs. Python's cyclic garbage
collector is paused while timing, as timeit does.

Note [Training step figures]
The step is measured in child processes, twice: with the process confined
to one core, and on every core it may use. The CPU's step runs on one
thread (torch.set_num_threads(1)), so one core is the like-for-like
comparison. On more cores, PyTorch's autograd engine runs simdev's
backward on its device thread (as for every device but the CPU) on another
core while the caller sleeps: two wake-ups across cores per backward,
whose cost is the machine's and not the backend's (tens of microseconds
each on a virtual machine whose idle cores halt), and the step's tensors
cross between the two cores' caches. The one-op backward row shows the
fixed cost; the calling-thread row shows the step without it
(torch.autograd.set_multithreading_enabled(False)); the control row shows
the same pattern without simdev: the CPU's own step with its backward
handed to another thread, against the plain CPU step (both columns CPU). Within a child, blocks
of steps on simdev and on the CPU take turns, each block ending with a
synchronize: the blocks are the rounds of Note [Rounds and spread].
"""
import argparse
import json
import os
import queue
import subprocess
import sys
import threading
import time

# A step child (Note [Training step figures]) is confined to its cores before
# torch starts any thread, so that every thread (the autograd engine's,
# simdev's stream workers, OpenMP's) inherits the mask.
_CORES = os.environ.pop("SIMDEV_BENCH_CORES", None)
if _CORES:
    os.sched_setaffinity(0, {int(c) for c in _CORES.split(",")})

import torch  # noqa: E402

import torch_simdev  # noqa: F401

from benchlib import machine_line, mlp_step, rounds_of, spread  # noqa: E402,F401




def per_call_us(fn, calls):
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def header():
    print(f"{'figure':52s} {'simdev':>22s} {'cpu':>22s} {'unit':6s} {'simdev/cpu':>20s}")
    print(f"{'':52s} {'median [25%-75%]':>22s} {'median [25%-75%]':>22s} {'':6s} "
          f"{'median [25%-75%]':>20s}")


def row(name, sim, cpu, unit, suffix=""):
    """Samples of each side, paired by round; the ratio is simdev's over the
    CPU's (for a time, below 1 is faster; for a bandwidth, above 1)."""
    ratios = [s / c for s, c in zip(sim, cpu)]
    r = spread(ratios).split(" ", 1)
    print(f"{name:52s} {spread(sim):>22s} {spread(cpu):>22s} {unit:6s} "
          f"{r[0] + 'x ' + r[1]:>20s}{suffix}")




def step_figures(quick):
    """The child's part (Note [Training step figures]): medians in ms and us."""
    torch.set_num_threads(1)
    steps, blocks = (2, 3) if quick else (10, 40)

    def block_ms(step):
        torch.accelerator.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        torch.accelerator.synchronize()
        return (time.perf_counter() - t0) / steps * 1e3

    def interleaved(sim, cpu, time_block):
        return rounds_of([sim, cpu], blocks, time_block)

    sim_step, cpu_step = mlp_step("simdev"), mlp_step("cpu")
    fig = {"step": interleaved(sim_step, cpu_step, block_ms)}
    torch.autograd.set_multithreading_enabled(False)
    fig["step_caller"] = interleaved(sim_step, cpu_step, block_ms)
    torch.autograd.set_multithreading_enabled(True)

    def tiny_backward(device):
        x = torch.ones(4, device=device, requires_grad=True)
        loss = (x * 2).sum()
        return lambda: loss.backward(retain_graph=True)

    calls = 20 if quick else 200
    fig["tiny"] = interleaved(tiny_backward("simdev"), tiny_backward("cpu"),
                              lambda f: per_call_us(f, calls))

    # The control, without simdev: the CPU's own step with its backward
    # handed to another thread while the caller waits, the engine's pattern
    # for devices. What that costs here is the machine's (Note [Training
    # step figures]).
    requests, done = queue.Queue(), queue.Queue()

    def backward_thread():
        while True:
            loss = requests.get()
            loss.backward()
            del loss
            done.put(None)

    threading.Thread(target=backward_thread, daemon=True).start()

    def handed(loss):
        requests.put(loss)
        done.get()

    fig["cpu_handed"] = interleaved(mlp_step("cpu", handed), cpu_step, block_ms)
    return fig


def _child_figures(cores, quick):
    cmd = [sys.executable, os.path.abspath(__file__), "--step-child"]
    if quick:
        cmd.append("--quick")
    env = dict(os.environ, SIMDEV_BENCH_CORES=",".join(map(str, cores)))
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    p.add_argument("--step-child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.step_child:
        print(json.dumps(step_figures(args.quick)), flush=True)
        # No interpreter finalization: PyTorch's autograd device thread may
        # still be releasing a graph's thread-local state, and finalizing
        # under it aborts ("terminate called without an active exception").
        os._exit(0)
    # Small operators in rounds of `calls` calls (Note [Rounds and spread]).
    calls, rounds = (50, 3) if args.quick else (2000, 31)
    mib = 4 if args.quick else 256
    torch.set_num_threads(1)

    print(machine_line())
    header()
    a_s, b_s = torch.randn(1024, device="simdev"), torch.randn(1024, device="simdev")
    a_c, b_c = a_s.cpu(), b_s.cpu()
    torch.accelerator.synchronize()

    def op_row(name, sim_fn, cpu_fn):
        row(name, *rounds_of([sim_fn, cpu_fn], rounds, lambda f: per_call_us(f, calls)), "us")

    op_row("add of two 1024-float tensors (per op)", lambda: a_s + b_s, lambda: a_c + b_c)
    op_row("multiply by a Python scalar, 1024 floats (per op)", lambda: a_s * 0.5,
           lambda: a_c * 0.5)
    # The same call on both sides: naming a device costs the Python argument
    # parser about 0.3 us whichever device it is.
    op_row("empty(1024, device=...) + free (per pair)",
           lambda: torch.empty(1024, device="simdev"), lambda: torch.empty(1024, device="cpu"))
    op_row("empty_like(1024 floats) + free (per pair)", lambda: torch.empty_like(a_s),
           lambda: torch.empty_like(a_c))

    # The training step runs in child processes (see step_figures): once with
    # the process on one core, once on every core it may use.
    cores = sorted(os.sched_getaffinity(0))
    configs = [("one core", cores[:1])]
    if len(cores) > 1:
        configs.append((f"{len(cores)} cores", cores))
    for label, use in configs:
        fig = _child_figures(use, args.quick)
        row(f"MLP training step (SGD, batch 128), {label}", *fig["step"], "ms")
        row("  the same, backward on the calling thread", *fig["step_caller"], "ms")
        row("  backward of a one-op graph (engine handoff)", *fig["tiny"], "us")
        # Both columns CPU: the handed-off step against the plain one.
        row("  control, CPU only: backward on another thread", *fig["cpu_handed"], "ms")

    # Copies in rounds (Note [Rounds and spread]): within each round the CPU's
    # own copy (memcpy, between two pageable tensors) and each transfer take
    # turns; every transfer row's CPU column is the same memcpy samples.
    n = mib << 20
    host = torch.empty(n, dtype=torch.uint8).fill_(7)
    host2 = torch.empty(n, dtype=torch.uint8).fill_(1)
    pinned = torch.empty(n, dtype=torch.uint8, pin_memory=True).fill_(7)
    dev = torch.empty(n, dtype=torch.uint8, device="simdev")
    copy_rounds = 3 if args.quick else 15

    def gbps(fn):
        torch.accelerator.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.accelerator.synchronize()
        return n / (time.perf_counter() - t0) / 1e9

    copies = {
        "host->device copy, pageable": lambda: dev.copy_(host),
        "device->host copy, pageable": lambda: host2.copy_(dev),
        "host->device copy, pinned": lambda: dev.copy_(pinned),
        "device->host copy, pinned": lambda: pinned.copy_(dev),
    }
    memcpy, *samples = rounds_of([lambda: host2.copy_(host), *copies.values()], copy_rounds, gbps)
    for name, got in zip(copies, samples):
        row(f"{name}, {mib} MiB", got, memcpy, "GB/s", suffix=" of memcpy")
    del dev

    print("\nvisible to the host:", torch.simdev.get_device_properties(0)["host_visible_memory"])


if __name__ == "__main__":
    main()
