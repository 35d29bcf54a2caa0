"""Graph replay against eager launches on a backend's native kernels, measured in the same run.

  python bench/graph_bench.py                    simdev (its native kernels), the full run
  python bench/graph_bench.py --backend ocl      the ocl backend (its native OpenCL kernels)
  python bench/graph_bench.py --quick            few rounds, to check that it runs

Prints the machine, then for each workload the host time per step eager (the operators
launched one by one from Python) and replayed (one torch.accelerator.Graph.replay() of the
same operators captured once), with the ratio eager/replay, and the time to completion per
step (the step, then a synchronize) both ways:

- a chain of 100 elementwise operators (`x = x + y`, float32, 1,024 elements);
- a decode-like step: an MLP of 4 layers (Linear 256-256, ReLU between), batch 1.

Host time is what the calling thread spends before the call returns (the work may still be
queued): what a graph saves; its wall time, and its CPU time (time.thread_time, which a
loaded machine inflates less). Each round measures a block of steps of each side in turn, the
order reversed every other round, each block ending with a synchronize (Note [Rounds and
spread] in simdev_bench.py); a row prints the median with the interquartile range, and the
median of the per-round ratios. Every workload first checks that the replay's result equals
the eager one's, bit for bit (the same kernels on the same inputs).

Memory: the graph's private pool's reserved bytes after capture and the peak of its allocated
bytes, against the eager step's peak allocated bytes (torch.<name>.max_memory_allocated over
one step, above what was allocated before it).

The backends run their native kernels: simdev with SIMDEV_NATIVE_KERNELS=1, ocl with
OCL_NATIVE_KERNELS=1 (operators run as host kernels or through the CPU fallback cannot be
captured).
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchlib import machine_line, rounds_of, spread  # noqa: E402

BACKENDS = {
    "simdev": ("torch_simdev", {"SIMDEV_NATIVE_KERNELS": "1"}),
    "ocl": ("torch_ocl", {"OCL_NATIVE_KERNELS": "1"}),
}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=sorted(BACKENDS), default="simdev")
    p.add_argument("--quick", action="store_true")
    a = p.parse_args()
    module, env = BACKENDS[a.backend]
    for k, v in env.items():
        os.environ.setdefault(k, v)

    import importlib

    import torch

    importlib.import_module(module)
    name = a.backend
    mod = getattr(torch, name)
    ops = getattr(torch.ops, name)
    dev = torch.device(name, 0)
    steps, rounds = (5, 3) if a.quick else (50, 30)

    print(machine_line())
    print(f"backend: {name}; {steps} steps a block, {rounds} rounds")

    def block(fn, sync_each):
        """Per step, in us: the calling thread's wall time in the calls, its CPU time in them
        (time.thread_time: what launching costs the host, which a loaded machine inflates
        less than wall time), and the wall time to completion."""
        torch.accelerator.synchronize()
        host = cpu = 0.0
        t0 = time.perf_counter()
        for _ in range(steps):
            c0, h0 = time.thread_time(), time.perf_counter()
            fn()
            host += time.perf_counter() - h0
            cpu += time.thread_time() - c0
            if sync_each:
                torch.accelerator.synchronize()
        torch.accelerator.synchronize()
        total = time.perf_counter() - t0
        return host / steps * 1e6, cpu / steps * 1e6, total / steps * 1e6

    def capture(fn, side):
        """A graph of fn captured on `side` (after a warm-up run there); the output it made."""
        side.wait_stream(torch.accelerator.current_stream(dev))
        with side:
            fn()
        torch.accelerator.synchronize()
        g = torch.accelerator.Graph()
        with side:
            g.capture_begin()
            try:
                out = fn()
            finally:
                g.capture_end()
        torch.accelerator.synchronize()
        return g, out

    def workload(title, make):
        fn, inputs = make()
        side = torch.Stream(dev)
        mod.reset_peak_memory_stats(0)
        before = mod.memory_allocated(0)
        eager_out = fn()
        torch.accelerator.synchronize()
        eager_peak = mod.max_memory_allocated(0) - before
        g, graph_out = capture(fn, side)
        graph_out.zero_()
        g.replay()
        torch.accelerator.synchronize()
        if not torch.equal(graph_out.cpu(), eager_out.cpu()):
            raise SystemExit(f"{title}: the replay's result differs from the eager one's")
        # The replay reads its inputs when it runs: change them, both sides follow.
        with torch.no_grad():
            inputs[0].mul_(0.5)
        eager_out = fn()
        g.replay()
        torch.accelerator.synchronize()
        if not torch.equal(graph_out.cpu(), eager_out.cpu()):
            raise SystemExit(f"{title}: after the inputs changed, the replay differs")
        stats = json.loads(ops.pool_stats_json(0, list(g.pool())))
        pool_reserved = stats["reserved_bytes.all.current"]
        pool_peak = stats["allocated_bytes.all.peak"]

        figures = (("host wall per step", False, 0), ("host CPU per step", False, 1),
                   ("time to completion", True, 2))
        for label, sync_each, which in figures:
            eager, replay = rounds_of([fn, g.replay], rounds,
                                      lambda f: block(f, sync_each)[which])
            ratios = [e / r for e, r in zip(eager, replay)]
            print(f"  {title:34s} {label:20s} eager {spread(eager):>24s} us   "
                  f"replay {spread(replay):>24s} us   eager/replay {spread(ratios)}x")
        print(f"  {title:34s} memory: graph pool reserved {pool_reserved} B (its peak "
              f"allocated {pool_peak} B); eager peak allocated {eager_peak} B")
        g.reset()

    def chain():
        x = torch.randn(1024, device=dev)
        y = torch.randn(1024, device=dev)

        def fn():
            z = x
            for _ in range(100):
                z = z + y
            return z
        return fn, [y]

    def decode():
        torch.manual_seed(0)
        layers = []
        for i in range(4):
            layers.append(torch.nn.Linear(256, 256))
            if i < 3:
                layers.append(torch.nn.ReLU())
        model = torch.nn.Sequential(*layers).to(dev)
        x = torch.randn(1, 256, device=dev)

        def fn():
            with torch.no_grad():
                return model(x)
        return fn, [x]

    print(f"  {'workload':34s} {'figure':20s} median [25%-75%]")
    workload("100 x (x + y), 1,024 float32", chain)
    workload("MLP 4 x Linear(256), batch 1", decode)
    print("graph bench: done")


if __name__ == "__main__":
    main()
