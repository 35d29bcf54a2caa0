"""The ocl backend (examples/opencl) through PyTorch against the CPU, measured in the same run.

  python bench/opencl_bench.py           the full run
  python bench/opencl_bench.py --quick   few rounds, to check that it runs

Prints the machine, then the training step of an MLP (64-256-256-10, SGD, batch 128, the
model of bench/simdev_bench.py) on the OpenCL device against the CPU, once per SVM kind
(OCL_SVM=fine: host kernels run in place on device memory; coarse: the SDK copies around
them), each in a child process of its own, on the calling thread
(torch.autograd.set_multithreading_enabled(False), as simdev_bench's calling-thread row) and
with one intra-op thread on both sides. Blocks of steps on the device and on the CPU take
turns, each block ending with a synchronize (Note [Rounds and spread] in simdev_bench.py);
a row prints medians with the interquartile range, and the median of the per-round ratios.
"""
import argparse
import gc
import json
import os
import subprocess
import sys
import time
from benchlib import machine_line, spread

def child(quick):
    import torch
    import torch.nn.functional as F
    import torch_ocl  # noqa: F401

    torch.set_num_threads(1)
    torch.autograd.set_multithreading_enabled(False)

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

    steps = {"ocl": make_step("ocl"), "cpu": make_step("cpu")}
    sync = {"ocl": torch.ocl.synchronize, "cpu": lambda: None}
    rounds, per_block = (2, 2) if quick else (15, 40)
    samples = {"ocl": [], "cpu": []}
    gc.collect()
    gc.disable()
    for r in range(rounds):
        for side in (("ocl", "cpu") if r % 2 == 0 else ("cpu", "ocl")):
            t0 = time.perf_counter()
            for _ in range(per_block):
                steps[side]()
            sync[side]()
            samples[side].append((time.perf_counter() - t0) / per_block * 1e3)
    gc.enable()
    print(json.dumps({"samples": samples}))




def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--child", action="store_true")
    args = parser.parse_args()
    if args.child:
        child(args.quick)
        return
    import torch  # noqa: F401  (its version in the machine line)
    print(machine_line())
    print(f"ocl benchmark{' (quick smoke run: figures not meaningful)' if args.quick else ''}:"
          " the MLP training step on the OpenCL device vs the CPU\n")
    print(f"{'figure':40s} {'ocl':>24s} {'cpu':>24s} {'unit':4s} {'ocl/cpu':>22s}")
    for svm in ("fine", "coarse"):
        env = dict(os.environ, OCL_SVM=svm, OMP_NUM_THREADS="1",
                   TORCH_DEVICE_BACKEND_AUTOLOAD="0")
        cmd = [sys.executable, os.path.abspath(__file__), "--child"] + (["--quick"] if args.quick else [])
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
        if r.returncode != 0:
            print(f"MLP step, {svm} SVM: the child failed:\n{r.stderr}")
            sys.exit(1)
        out = json.loads(r.stdout.strip().splitlines()[-1])
        s = out["samples"]
        ratios = [a / b for a, b in zip(s["ocl"], s["cpu"])]
        name = f"MLP training step, {svm} SVM"
        print(f"{name:40s} {spread(s['ocl'], 3):>24s} {spread(s['cpu'], 3):>24s} {'ms':4s} "
              f"{spread(ratios, 3) + 'x':>22s}")


if __name__ == "__main__":
    main()
