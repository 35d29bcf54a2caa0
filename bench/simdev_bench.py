"""simdev through PyTorch against the CPU, measured in the same run.

  python bench/simdev_bench.py           the full run
  python bench/simdev_bench.py --quick   tiny sizes, to check that it runs

Prints each figure on simdev next to the same on the CPU, with the ratio:
per-op latency of a small elementwise op and of empty+free, host<->device
copy bandwidth at 256 MiB against memcpy (a CPU tensor copy), and the
training-step time of an MLP.

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
synchronize, and the figure is the median block; Python's cyclic garbage
collector is paused while timing, as timeit does, so that its pauses do
not land on one side.
"""
import argparse
import gc
import json
import os
import queue
import statistics
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
import torch.nn.functional as F  # noqa: E402

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


def make_step(device, backward=lambda loss: loss.backward()):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(128, 64).to(device)
    y = torch.randint(0, 10, (128,)).to(device)

    def step():
        opt.zero_grad()
        backward(F.cross_entropy(model(x), y))
        opt.step()

    for _ in range(3):
        step()
    return step


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
        gc.collect()
        gc.disable()
        try:
            s, c = [], []
            for _ in range(blocks):
                s.append(time_block(sim))
                c.append(time_block(cpu))
        finally:
            gc.enable()
        return statistics.median(s), statistics.median(c)

    sim_step, cpu_step = make_step("simdev"), make_step("cpu")
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
                              lambda f: per_call_us(f, calls, repeats=1))

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

    fig["cpu_handed"] = interleaved(make_step("cpu", handed), cpu_step, block_ms)
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
    calls = 50 if args.quick else 5000
    mib = 4 if args.quick else 256
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
