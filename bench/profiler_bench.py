"""What profiling costs on simdev against what it costs on the CPU, measured
in the same run (the aim: device profiling of a loop of small operators at
most 2x the cost of CPU profiling of the same loop).

  python bench/profiler_bench.py           the full run
  python bench/profiler_bench.py --quick   tiny sizes, to check that it runs

The loop: `ops` small elementwise operators on a 256-element tensor. Four
ways, taking turns within each round (Note [Rounds and spread] in
simdev_bench.py): the loop on the CPU, unprofiled and under
torch.autograd.profiler.profile() (CPU profiling); the loop on simdev,
unprofiled and under profile(use_device="simdev") (device profiling, two
timing events per operator, Note [Profiler device times]); and both under
torch.profiler.profile, the CPU's with ProfilerActivity.CPU, simdev's with
PrivateUse1 too (Note [Kineto device activities]). A profiled figure is the
whole `with` block, per operator, then again including the post-processing
that reads the device times (key_averages()); for torch.profiler the two
parts are also given apart (the `with` block, whose exit collects the trace,
and key_averages(), PyTorch's Python pass over every event). Rows give
the median over rounds with the interquartile range, and the per-round
ratio simdev/CPU.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from torch.autograd.profiler import profile  # noqa: E402
from torch.profiler import ProfilerActivity  # noqa: E402
from torch.profiler import profile as kineto_profile  # noqa: E402

from simdev_bench import header, machine_line, rounds_of, row  # noqa: E402


def loop(x, ops):
    for _ in range(ops // 2):
        x = (x * 1.0001).relu()
    return x


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    ops, rounds = (20, 3) if args.quick else (400, 25)
    print(machine_line())
    print(f"simdev host-visible memory: {torch.simdev.get_device_properties(0)['host_visible_memory']}; "
          f"{ops} operators per loop, {rounds} rounds; pyperf not installed: rounds with "
          f"median and interquartile range")
    torch.set_num_threads(1)
    xs = {"cpu": torch.randn(256), "simdev": torch.randn(256, device="simdev")}
    use = {"cpu": None, "simdev": "simdev"}

    def sync(dev):
        if dev == "simdev":
            torch.simdev.synchronize()

    def plain(dev):
        def run():
            sync(dev)
            t0 = time.perf_counter()
            loop(xs[dev], ops)
            sync(dev)
            return (time.perf_counter() - t0) / ops * 1e6
        return run

    def profiled(dev, post):
        def run():
            sync(dev)
            t0 = time.perf_counter()
            with profile(use_device=use[dev]) as prof:
                loop(xs[dev], ops)
                sync(dev)
            if post:
                prof.key_averages()
            return (time.perf_counter() - t0) / ops * 1e6
        return run

    def traced(dev, parts):
        """torch.profiler (Kineto): CPU activity, plus the device's for simdev.
        The whole, and its two parts (the `with` block, key_averages()) into
        `parts`, a list of pairs."""
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.PrivateUse1] if dev == "simdev" else [])

        def run():
            sync(dev)
            t0 = time.perf_counter()
            with kineto_profile(activities=acts) as prof:
                loop(xs[dev], ops)
                sync(dev)
            t1 = time.perf_counter()
            prof.key_averages()
            t2 = time.perf_counter()
            parts.append(((t1 - t0) / ops * 1e6, (t2 - t1) / ops * 1e6))
            return (t2 - t0) / ops * 1e6
        return run

    # Warm pools and caches (the event pool grows to two events per
    # operator at the first profiled loop).
    parts = {"cpu": [], "simdev": []}
    for dev in ("cpu", "simdev"):
        profiled(dev, True)()
        traced(dev, [])()
    fns = [plain("simdev"), plain("cpu"), profiled("simdev", False), profiled("cpu", False),
           profiled("simdev", True), profiled("cpu", True), traced("simdev", parts["simdev"]),
           traced("cpu", parts["cpu"])]
    s = rounds_of(fns, rounds, lambda fn: fn())
    # rounds_of's warm-up run comes first in each list; pair the rest by round.
    part = {dev: p[-rounds:] for dev, p in parts.items()}
    header()
    row("loop, unprofiled (per operator)", s[0], s[1], "us")
    row("loop under the profiler (per operator)", s[2], s[3], "us")
    row("  + reading the results (key_averages)", s[4], s[5], "us")
    row("profiler's added cost (per operator)", [p - q for p, q in zip(s[2], s[0])],
        [p - q for p, q in zip(s[3], s[1])], "us")
    row("torch.profiler, + reading the results", s[6], s[7], "us")
    row("  the with block (its exit collects the trace)", [p[0] for p in part["simdev"]],
        [p[0] for p in part["cpu"]], "us")
    row("  key_averages()", [p[1] for p in part["simdev"]], [p[1] for p in part["cpu"]], "us")
    print("\nrows 2-4: torch.autograd.profiler.profile, use_device='simdev' (device times from "
          "timing events) against no use_device (CPU times only);\nrow 5: torch.profiler.profile "
          "with activities CPU and PrivateUse1 (device activities) against CPU only, whole and "
          "in its two parts (rows 6-7)")


if __name__ == "__main__":
    main()
