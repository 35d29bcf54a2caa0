"""torch.compile on simdev against torch.compile on the CPU and
simdev run eagerly, in one run, on one thread (host-visible simdev: Inductor's
C++ kernels on the device memory, Note [Compiled kernels on host-visible
memory] in python/accelkit/compile/wrappers.py).

  python bench/compile_torch_bench.py           the full run
  python bench/compile_torch_bench.py --quick   few rounds, to check that it runs
  python bench/compile_torch_bench.py --no-first-compile   the per-call figures only
  python bench/compile_torch_bench.py --cpu-time   per-call figures in the process's CPU time
  taskset -c 1 python bench/compile_torch_bench.py   on one core (every thread, the children too)

Figures, per model (an MLP 64-256-256-10 on a batch of 128; a CNN of two
3x3 convolutions, batch norm, pooling and a linear layer on 32 images of
3x32x32): the forward alone and a training step (forward, backward, SGD),
each as simdev compiled, CPU compiled and simdev eager, in rounds (Note
[Rounds and spread] in simdev_bench.py: the three take turns in each round),
median ms per call with the interquartile range, and the per-round ratios
simdev compiled / CPU compiled and simdev compiled / simdev eager. First
the time of the first compiled call (Dynamo, AOT autograd, Inductor, the C++
compiler; in a child process each, with an empty Inductor cache, so that
each side compiles its code afresh) of each model's training step, simdev's against the CPU's.
"""
import argparse
import copy
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("SIMDEV_HOST_VISIBLE", "1")

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from simdev_bench import machine_line, rounds_of, spread  # noqa: E402

DEV = "simdev"


def mlp():
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                         nn.Linear(256, 10)), (128, 64)


def cnn():
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10)), (32, 3, 32, 32)


def setup(make, device, compiled):
    """A forward and a training step of a fresh copy of the model on `device`."""
    torch.manual_seed(0)
    model, shape = make()
    model = copy.deepcopy(model).to(device)
    x = torch.randn(shape).to(device)
    y = torch.randint(0, 10, (shape[0],)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    fwd = torch.compile(model) if compiled else model

    def forward():
        with torch.no_grad():
            return fwd(x)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(fwd(x), y)
        loss.backward()
        opt.step()
        return loss

    return forward, step


def timed(calls, clock=time.perf_counter):
    def measure(f):
        torch.accelerator.synchronize()
        t0 = clock()
        for _ in range(calls):
            f()
        torch.accelerator.synchronize()
        return (clock() - t0) / calls * 1e3
    return measure


def first_compile_s(model, device):
    """The first compiled training step of `model` on `device`, in a child
    with an empty Inductor cache of its own (so that neither side reuses
    the other's compiled kernels)."""
    import subprocess
    import tempfile
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, TORCHINDUCTOR_FX_GRAPH_CACHE="0",
                   TORCHINDUCTOR_COMPILE_THREADS="1")
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--first-compile-child",
                              model, device], check=True, stdout=subprocess.PIPE, text=True,
                             env=env).stdout
    return float(out.strip().splitlines()[-1])


def first_compile_child(model, device):
    torch.set_num_threads(1)
    _, step = setup({"mlp": mlp, "cnn": cnn}[model], device, compiled=True)
    torch.accelerator.synchronize()
    t0 = time.perf_counter()
    step()
    torch.accelerator.synchronize()
    print(time.perf_counter() - t0)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    p.add_argument("--no-first-compile", action="store_true",
                   help="skip the first-compile times (minutes: four children compiling afresh)")
    p.add_argument("--cpu-time", action="store_true",
                   help="time the calls in the process's CPU time (all its threads) instead of "
                        "wall time: on a shared machine, leaves out other processes' turns")
    p.add_argument("--first-compile-child", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.first_compile_child:
        return first_compile_child(*args.first_compile_child)
    torch.set_num_threads(1)
    import torch._inductor.config as iconfig
    iconfig.compile_threads = 1
    torch._dynamo.config.cache_size_limit = 64
    calls, rounds = (3, 3) if args.quick else (10, 11)
    clock = time.process_time if args.cpu_time else time.perf_counter

    print(machine_line())
    print("torch.compile, one thread; host-visible simdev (Inductor's C++ kernels on device memory)"
          + ("; the process's CPU time, not wall time" if args.cpu_time else ""))
    print()
    if not args.no_first_compile:
        print(f"{'first compile of the training step':38s} {'simdev s':>10s} {'cpu s':>10s} "
              f"{'ratio':>8s}")
        for name, make in (("mlp", mlp), ("cnn", cnn)):
            s, c = first_compile_s(name, DEV), first_compile_s(name, "cpu")
            print(f"{name:38s} {s:10.2f} {c:10.2f} {s / c:7.2f}x")
        torch.compiler.reset()
        print()
    print(f"{'figure (ms per call)':22s} {'simdev compiled':>22s} {'cpu compiled':>22s} "
          f"{'simdev eager':>22s} {'sim.comp/cpu.comp':>20s} {'sim.comp/sim.eager':>20s}")
    for name, make in (("mlp", mlp), ("cnn", cnn)):
        sides = [setup(make, DEV, True), setup(make, "cpu", True), setup(make, DEV, False)]
        for what, k in (("forward", 0), ("train step", 1)):
            fns = [side[k] for side in sides]
            sc, cc, se = rounds_of(fns, rounds, timed(calls, clock))
            r1 = spread([a / b for a, b in zip(sc, cc)]).split(" ", 1)
            r2 = spread([a / b for a, b in zip(sc, se)]).split(" ", 1)
            print(f"{name + ' ' + what:22s} {spread(sc, 3):>22s} {spread(cc, 3):>22s} "
                  f"{spread(se, 3):>22s} {r1[0] + 'x ' + r1[1]:>20s} {r2[0] + 'x ' + r2[1]:>20s}")
    # The backward of a loss on the device runs on autograd's thread for the
    # device (as for CUDA), the CPU's on the calling thread: two thread
    # hand-offs per backward, which the training steps above pay too.
    print()
    tiny = []
    for device in (DEV, "cpu"):
        w = torch.ones(16, device=device, requires_grad=True)
        tiny.append(lambda w=w: (w * 2).sum().backward())
    sd, cd = rounds_of(tiny, rounds, timed(calls * 10, clock))
    r = spread([a / b for a, b in zip(sd, cd)]).split(" ", 1)
    print(f"{'backward of w * 2':22s} {spread([v * 1e3 for v in sd], 1) + ' us':>22s} "
          f"{spread([v * 1e3 for v in cd], 1) + ' us':>22s} {'(autograd on the device thread)':>22s} "
          f"{r[0] + 'x ' + r[1]:>20s}")
    print("compile bench: done")


if __name__ == "__main__":
    main()
