"""The ocl backend (examples/opencl) through PyTorch against the CPU and raw OpenCL, measured
in the same run.

  python bench/opencl_bench.py           the full run
  python bench/opencl_bench.py --quick   few rounds, to check that it runs

Prints the machine, then, in child processes (one per SVM kind, OCL_SVM=fine: host kernels
run in place on device memory; coarse: the SDK copies around them, and per native kernels on
or off, OCL_NATIVE_KERNELS), on the calling thread (torch.autograd.set_multithreading_enabled
(False), as simdev_bench's calling-thread row) and with one intra-op thread on both sides:

- the training step of an MLP (64-256-256-10, SGD, batch 128, the model of
  bench/simdev_bench.py) on the OpenCL device against the CPU: with ocl's native OpenCL
  kernels (examples/opencl/opencl_kernels.cpp: addmm, mm, relu, threshold_backward, sum on
  the device's queues) and without them (every operator on the CPU's kernels: host kernels
  in place, or the copying fallback);
- a small `add` (1024 float32) through the backend against the same OpenCL kernel enqueued
  directly (torch.ops.ocl_kernels.add_directly: arguments set and clEnqueueNDRangeKernel on
  the stream's queue in a C++ loop, no event), through the backend both from a Python loop
  (torch.add) and from a C++ loop (at::add, torch.ops.ocl_kernels.add_through_backend); and
  the direct loop with what the runtime adds to each enqueue (an event asked for and the
  previous released, a clFlush: add_directly's track), to tell the OpenCL calls' share of the
  overhead from the SDK's and the kernel's.

Blocks of calls on each side take turns, each block ending with a synchronize (Note [Rounds
and spread] in simdev_bench.py); a row prints medians with the interquartile range, and the
median of the per-round ratios against the row's baseline. The add rows also give the calling
thread's CPU time per add (time.thread_time: what the launch costs the host, which a loaded
machine inflates less than wall time).

  python bench/opencl_bench.py --add-only                   the add rows only (fine SVM)
  python bench/opencl_bench.py --add-only --against DIR     the add rows of the build in DIR
      (a copy of an earlier build's build/python: its torch_ocl and accelkit) beside this
      one's, in child processes taking turns (--pairs of them), each child measuring its
      own direct baseline: before and after a change, in one run; each child reports the
      torch_ocl it imported, and the run stops with an error naming DIR unless 'before'
      came from DIR and 'after' did not
"""
import argparse
import gc
import json
import os
import subprocess
import sys
import time
from benchlib import machine_line, mlp_step, spread

def child(quick, add_only):
    import torch
    import torch_ocl  # noqa: F401

    torch.set_num_threads(1)
    torch.autograd.set_multithreading_enabled(False)

    def measure(sides, rounds, per_block, unit):
        """{side: per-call times in `unit` seconds}: blocks of per_block calls taking turns."""
        samples = {k: [] for k in sides}
        cpu = {k: [] for k in sides}  # the calling thread's CPU time per call
        names = list(sides)
        gc.collect()
        gc.disable()
        for r in range(rounds):
            for side in names if r % 2 == 0 else names[::-1]:
                run, sync = sides[side]
                t0, c0 = time.perf_counter(), time.thread_time()
                run(per_block)
                c1 = time.thread_time()
                sync()
                samples[side].append((time.perf_counter() - t0) / per_block * unit)
                cpu[side].append((c1 - c0) / per_block * unit)
        gc.enable()
        samples["thread_cpu"] = cpu
        return samples

    def repeat(f):
        def run(n):
            for _ in range(n):
                f()
        return run

    kops = torch.ops.ocl_kernels
    native = kops.enabled()
    launches0 = kops.launches()
    steps = {} if add_only else {"ocl": mlp_step("ocl"), "cpu": mlp_step("cpu")}
    no_sync = lambda: None  # noqa: E731
    out = {"native": native, "torch_ocl": os.path.realpath(torch_ocl.__file__)}
    if not add_only:
        out["mlp"] = measure({"ocl": (repeat(steps["ocl"]), torch.ocl.synchronize),
                              "cpu": (repeat(steps["cpu"]), no_sync)},
                             *((2, 2) if quick else (15, 40)), 1e3)
        out["mlp_launches"] = kops.launches() - launches0
    if native:
        a = torch.randn(1024, device="ocl")
        b = torch.randn(1024, device="ocl")
        c = torch.empty(1024, device="ocl")
        kops.add_directly(a, b, c, 1)  # the program built, each path run once
        kops.add_through_backend(a, b, 1)
        torch.add(a, b)
        torch.ocl.synchronize()
        sides = {"direct": (lambda n: kops.add_directly(a, b, c, n), torch.ocl.synchronize),
                 "cxx": (lambda n: kops.add_through_backend(a, b, n), torch.ocl.synchronize),
                 "python": (repeat(lambda: torch.add(a, b)), torch.ocl.synchronize)}
        if "track" in str(kops.add_directly.default._schema):  # not in older builds
            sides["tracked"] = (lambda n: kops.add_directly(a, b, c, n, 3),
                                torch.ocl.synchronize)
        out["add"] = measure(sides, *((2, 20) if quick else (15, 400)), 1e6)
        torch.testing.assert_close(c.cpu(), (a + b).cpu(), rtol=0, atol=0)
    print(json.dumps(out))




def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--add-only", action="store_true",
                        help="only the small add's rows, on fine-grained SVM")
    parser.add_argument("--against", metavar="DIR",
                        help="with --add-only: also measure the torch_ocl in DIR (a copy of an "
                             "earlier build's build/python), children taking turns")
    parser.add_argument("--pairs", type=int, default=5,
                        help="with --against: child processes per build (default 5)")
    args = parser.parse_args()
    if args.child:
        child(args.quick, args.add_only)
        return
    if args.against and not args.add_only:
        parser.error("--against needs --add-only")
    before = os.path.realpath(args.against) if args.against else None
    if before and not os.path.isdir(os.path.join(before, "torch_ocl")):
        sys.exit(f"opencl_bench: --against {args.against}: no torch_ocl package in "
                 f"{before} (expected a copy of an earlier build's build/python)")
    import torch  # noqa: F401  (its version in the machine line)
    print(machine_line())
    print(f"load average at the start: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(f"ocl benchmark{' (quick smoke run: figures not meaningful)' if args.quick else ''}:"
          " the MLP training step on the OpenCL device vs the CPU, a small add vs the same"
          " OpenCL kernel enqueued directly\n")
    print(f"{'figure':46s} {'ocl':>24s} {'baseline':>24s} {'unit':4s} {'ratio':>22s}")

    def row(name, ocl, base, unit):
        ratios = [x / y for x, y in zip(ocl, base)]
        print(f"{name:46s} {spread(ocl, 3):>24s} {spread(base, 3):>24s} {unit:4s} "
              f"{spread(ratios, 3) + 'x':>22s}")

    def under(path, folder):
        return os.path.commonpath([path, folder]) == folder

    def run_child(svm, native, pythonpath=None):
        env = dict(os.environ, OCL_SVM=svm, OCL_NATIVE_KERNELS=native, OMP_NUM_THREADS="1",
                   TORCH_DEVICE_BACKEND_AUTOLOAD="0")
        if pythonpath:
            env["PYTHONPATH"] = os.pathsep.join([pythonpath] + [p for p in [env.get("PYTHONPATH")] if p])
        cmd = ([sys.executable, os.path.abspath(__file__), "--child"] +
               (["--quick"] if args.quick else []) + (["--add-only"] if args.add_only else []))
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
        if r.returncode != 0:
            print(f"{svm} SVM, OCL_NATIVE_KERNELS={native}: the child failed:\n{r.stderr}")
            sys.exit(1)
        return json.loads(r.stdout.strip().splitlines()[-1])

    def add_rows(s, svm, label=""):
        row(f"add 1024 f32, {svm} SVM{label}: torch.add, Python loop (vs direct)",
            s["python"], s["direct"], "us")
        row(f"add 1024 f32, {svm} SVM{label}: at::add, C++ loop (vs direct)",
            s["cxx"], s["direct"], "us")
        c = s["thread_cpu"]
        row("  the same, calling thread's CPU per add", c["cxx"], c["direct"], "us")
        if s.get("tracked"):
            row("  direct + an event and a clFlush per launch", s["tracked"], s["direct"], "us")
            row("  the same, calling thread's CPU per add", c["tracked"], c["direct"], "us")
        print(f"  (the kernel enqueued directly: {spread(s['direct'], 3)} us per add; "
              f"the calling thread's CPU per add: at::add {spread(c['cxx'], 2)}, "
              f"torch.add {spread(c['python'], 2)}, direct {spread(c['direct'], 2)} us)")

    if args.against:
        # Children of the two builds take turns; each child measures its own direct
        # baseline, so a ratio compares a build with the raw enqueue in the same process.
        builds = [("before", before), ("after", None)]
        sides = ("python", "cxx", "direct", "tracked")
        got = {name: {k: [] for k in sides} for name, _ in builds}
        for name, _ in builds:
            got[name]["thread_cpu"] = {k: [] for k in sides}
        loaded = {}  # build: the folder its torch_ocl came from
        for i in range(args.pairs):
            for name, path in (builds if i % 2 == 0 else builds[::-1]):
                out = run_child("fine", "1", path)
                # A child imports whatever torch_ocl its PYTHONPATH finds first: refuse a
                # 'before' that is not DIR's or an 'after' that is (its figures would compare
                # a build with itself).
                if (name == "before") != under(out["torch_ocl"], before):
                    sys.exit(f"opencl_bench: --against {args.against}: the '{name}' child "
                             f"loaded torch_ocl from {out['torch_ocl']}, which is "
                             f"{'not ' if name == 'before' else ''}under {before}")
                loaded[name] = os.path.dirname(os.path.dirname(out["torch_ocl"]))
                s = out["add"]
                for k in sides:
                    got[name][k] += s.get(k, [])
                    got[name]["thread_cpu"][k] += s["thread_cpu"].get(k, [])
        for name, path in builds:
            add_rows(got[name], "fine", f" ({name}: {loaded[name]})")
        print(f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
        return

    # --quick checks each path once: the native kernels' rows on fine-grained memory, the
    # fallback's on coarse-grained memory (two children, not four).
    combos = ([("fine", "1")] if args.add_only else
              [("fine", "1"), ("coarse", "0")] if args.quick else
              [("fine", "1"), ("fine", "0"), ("coarse", "1"), ("coarse", "0")])
    for svm, native in combos:
        out = run_child(svm, native)
        if "mlp" in out:
            kind = "native kernels" if out["native"] else "no native kernels"
            m = out["mlp"]
            row(f"MLP step, {svm} SVM, {kind} (vs CPU)", m["ocl"], m["cpu"], "ms")
            print(f"  (native kernel launches in its steps: {out['mlp_launches']})")
        if "add" in out:
            add_rows(out["add"], svm)
    print(f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
