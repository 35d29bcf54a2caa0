"""What the Python benchmarks share: the machine they ran on, and a median with its spread.

Torch-free, so that the benchmarks that time `import torch` or the compiler can use it."""
import gc
import os
import platform
import statistics
import sys


def cpu_model():
    """The CPU's model name from /proc/cpuinfo, else what platform knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "Hardware") and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def machine_line():
    """The CPU model, usable CPUs and C library, and torch's version where torch is imported."""
    libc = " ".join(platform.libc_ver()).strip() or "unknown C library"
    line = f"cpu: {cpu_model()}, {len(os.sched_getaffinity(0))} usable CPUs; {libc}"
    torch = sys.modules.get("torch")
    return line + (f"; torch {torch.__version__}" if torch is not None else "")


def quartiles(xs, method="inclusive"):
    """The first and third quartiles of xs (statistics.quantiles' method)."""
    if len(xs) < 2:
        return xs[0], xs[0]
    q1, _, q3 = statistics.quantiles(xs, n=4, method=method)
    return q1, q3


def spread(xs, digits=2):
    """The median and interquartile range of xs, as 'median [q1-q3]'."""
    m = statistics.median(xs)
    q1, q3 = quartiles(xs)
    return f"{m:.{digits}f} [{q1:.{digits}f}-{q3:.{digits}f}]"


def rounds_of(fns, rounds, measure):
    """Note [Rounds and spread] (simdev_bench.py): `rounds` rounds, each
    measuring every fn in turn (in reverse order every other round, so that
    no fn always follows the same one), after one warm-up measure of each;
    returns one list of samples per fn. Python's cyclic garbage collector is
    paused while timing."""
    for fn in fns:
        measure(fn)  # warm-up
    samples = [[] for _ in fns]
    order = list(range(len(fns)))
    gc.collect()
    gc.disable()
    try:
        for r in range(rounds):
            for i in (order if r % 2 == 0 else order[::-1]):
                samples[i].append(measure(fns[i]))
    finally:
        gc.enable()
    return samples


def mlp_step(device, backward=None):
    """The benchmarks' MLP training step on `device` (64-256-256-10, batch
    128, SGD), warmed up by three steps: a function running one more step.
    `backward(loss)` replaces loss.backward(). Imports torch when called
    (this module stays torch-free)."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(128, 64).to(device)
    y = torch.randint(0, 10, (128,)).to(device)
    backward = backward or (lambda loss: loss.backward())

    def step():
        opt.zero_grad()
        backward(F.cross_entropy(model(x), y))
        opt.step()

    for _ in range(3):
        step()
    return step
