"""The MLP training step at each host access level (Note [Host access levels]), against the
CPU, measured in one run.

  python bench/host_access_bench.py           the full run
  python bench/host_access_bench.py --quick   few rounds, to check that it runs

Rows, each in a child process of its own with the CPU measured beside it:
  simdev, SIMDEV_HOST_VISIBLE=1       direct: host kernels and the fallback in place
  simdev, SIMDEV_HOST_VISIBLE=mapped  mapped: the same, at host_map's view of the pages
  simdev, SIMDEV_HOST_VISIBLE=0       none: the copying fallback
  ocl, OCL_SVM=fine                   direct (fine-grained SVM)
  ocl, OCL_SVM=coarse                 mapped (clEnqueueSVMMap/clEnqueueSVMUnmap): after
  ocl, OCL_SVM=coarse OCL_HOST_MAP=0  none: the copying fallback, as before map/unmap
The model is bench/simdev_bench.py's and bench/opencl_bench.py's (64-256-256-10, SGD,
batch 128), on the calling thread with one intra-op thread on both sides; device and CPU
blocks of steps take turns, each ending with a synchronize (ocl with its native kernels off:
OCL_NATIVE_KERNELS=0, as the rows measure host access); a row prints medians with the
interquartile range and the median of the per-round ratios. A backend that is not built
(torch_ocl without OpenCL) is said and skipped.
"""
import argparse
import gc
import importlib
import json
import os
import subprocess
import sys
import time

from benchlib import machine_line, mlp_step, spread

ROWS = [
    ("simdev", {"SIMDEV_HOST_VISIBLE": "1"}, "direct"),
    ("simdev", {"SIMDEV_HOST_VISIBLE": "mapped"}, "mapped"),
    ("simdev", {"SIMDEV_HOST_VISIBLE": "0"}, "none (copying fallback)"),
    ("ocl", {"OCL_SVM": "fine"}, "fine SVM, direct"),
    ("ocl", {"OCL_SVM": "coarse"}, "coarse SVM, mapped"),
    ("ocl", {"OCL_SVM": "coarse", "OCL_HOST_MAP": "0"}, "coarse SVM, none (before)"),
]


def child(backend, quick):
    import torch

    importlib.import_module(f"torch_{backend}")
    torch.set_num_threads(1)
    torch.autograd.set_multithreading_enabled(False)
    dev_module = getattr(torch, backend)

    steps = {"dev": mlp_step(backend), "cpu": mlp_step("cpu")}
    sync = {"dev": dev_module.synchronize, "cpu": lambda: None}
    rounds, per_block = (2, 2) if quick else (11, 30)
    samples = {"dev": [], "cpu": []}
    gc.collect()
    gc.disable()
    for r in range(rounds):
        for side in (("dev", "cpu") if r % 2 == 0 else ("cpu", "dev")):
            t0 = time.perf_counter()
            for _ in range(per_block):
                steps[side]()
            sync[side]()
            samples[side].append((time.perf_counter() - t0) / per_block * 1e3)
    gc.enable()
    access = dev_module.get_device_properties(0)["host_access"]
    print(json.dumps({"samples": samples, "host_access": access}))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--child", metavar="BACKEND")
    args = parser.parse_args()
    if args.child:
        child(args.child, args.quick)
        return
    import torch  # noqa: F401  (its version in the machine line)
    print(machine_line())
    print(f"host access benchmark{' (quick smoke run: figures not meaningful)' if args.quick else ''}:"
          " the MLP training step per host access level vs the CPU\n")
    print(f"{'figure':44s} {'device':>22s} {'cpu':>22s} {'unit':4s} {'device/cpu':>20s}")
    for backend, knobs, label in ROWS:
        # Host kernels and the fallback only: the OpenCL backend's own kernels,
        # on by default, would take the MLP's operators (opencl_bench.py
        # measures them).
        env = dict(os.environ, OMP_NUM_THREADS="1", TORCH_DEVICE_BACKEND_AUTOLOAD="0",
                   SIMDEV_DEVICE_COUNT="1", OCL_NATIVE_KERNELS="0", **knobs)
        for k in ("SIMDEV_INJECT_FAULT", "SIMDEV_VISIBLE_DEVICES", "SIMDEV_NATIVE_KERNELS",
                  "OCL_VISIBLE_DEVICES"):
            env.pop(k, None)
        cmd = [sys.executable, os.path.abspath(__file__), "--child", backend]
        r = subprocess.run(cmd + (["--quick"] if args.quick else []), env=env,
                           capture_output=True, text=True, timeout=1200)
        name = f"MLP step, {backend} {label}"
        if r.returncode != 0:
            if f"No module named 'torch_{backend}'" in r.stderr:
                print(f"{name:44s} skipped: torch_{backend} is not built")
                continue
            print(f"{name}: the child failed:\n{r.stderr[-3000:]}")
            sys.exit(1)
        out = json.loads(r.stdout.strip().splitlines()[-1])
        s = out["samples"]
        ratios = [a / b for a, b in zip(s["dev"], s["cpu"])]
        print(f"{name:44s} {spread(s['dev'], 3):>22s} {spread(s['cpu'], 3):>22s} {'ms':4s} "
              f"{spread(ratios, 3) + 'x':>20s}   (host_access {out['host_access']})")


if __name__ == "__main__":
    main()
