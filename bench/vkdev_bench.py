"""The vkdev backend (examples/vulkan) through PyTorch against the CPU and raw Vulkan, measured
in the same run.

  python bench/vkdev_bench.py           the full run
  python bench/vkdev_bench.py --quick   few rounds, to check that it runs

Prints the machine and the Vulkan device, then, in child processes (one per host-access mode,
VKDEV_HOST_ACCESS=none: memory the host cannot address, every operator without a native
kernel copied through the CPU; direct: host-visible memory, the CPU's kernels in place; and
per native kernels on or off, VKDEV_NATIVE_KERNELS), on the calling thread
(torch.autograd.set_multithreading_enabled(False)) with one intra-op thread on both sides:

- the training step of an MLP (64-256-256-10, SGD, batch 128: bench/benchlib.py's mlp_step) on
  the Vulkan device against the CPU, and the native kernels' launches per step;
- a small `add` (1024 float32) through the backend (torch.add from a Python loop, the stream's
  command buffer submitted by the runtime) against the same shader's pipeline recorded on a
  command buffer of its own with raw Vulkan calls (torch.ops.vkdev_kernels.add_directly:
  all of a block's dispatches in one vkQueueSubmit and a fence wait, and one submission and
  wait per add);
- a 256 MiB device-to-device copy (Tensor.copy_ and a synchronize) against a raw
  vkCmdCopyBuffer of the same bytes submitted and waited for (copy_directly).

Blocks of calls on each side take turns, each block ending with a synchronize; a row prints
medians with the interquartile range, and the median of the per-round ratios against the
row's baseline. Last, the lines of each file the vendor wrote (examples/vulkan).
"""
import argparse
import gc
import json
import os
import subprocess
import sys
import time

from benchlib import machine_line, mlp_step, spread

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COPY_BYTES = 256 << 20


def child(quick, copies):
    import torch
    import torch_vkdev  # noqa: F401

    torch.set_num_threads(1)
    torch.autograd.set_multithreading_enabled(False)
    sync = torch.vkdev.synchronize

    def measure(sides, rounds, per_block, unit):
        """{side: per-call times in `unit` seconds}: blocks of per_block calls taking turns."""
        samples = {k: [] for k in sides}
        names = list(sides)
        gc.collect()
        gc.disable()
        for r in range(rounds):
            for side in names if r % 2 == 0 else names[::-1]:
                run, done = sides[side]
                t0 = time.perf_counter()
                run(per_block)
                done()
                samples[side].append((time.perf_counter() - t0) / per_block * unit)
        gc.enable()
        return samples

    def repeat(f):
        def run(n):
            for _ in range(n):
                f()
        return run

    kops = torch.ops.vkdev_kernels
    native = kops.enabled()
    out = {"native": native, "device": torch.vkdev.get_device_name(0)}
    steps = {"vkdev": mlp_step("vkdev"), "cpu": mlp_step("cpu")}
    sync()
    launches0 = kops.launches()
    rounds, per_block = (2, 2) if quick else (15, 20)
    out["mlp"] = measure({"vkdev": (repeat(steps["vkdev"]), sync),
                          "cpu": (repeat(steps["cpu"]), lambda: None)}, rounds, per_block, 1e3)
    out["mlp_launches"] = (kops.launches() - launches0) / (rounds * per_block)
    if native:
        a = torch.randn(1024, device="vkdev")
        b = torch.randn(1024, device="vkdev")
        c = torch.empty(1024, device="vkdev")
        torch.add(a, b)
        sync()
        kops.add_directly(a, b, c, 1)
        out["add"] = measure(
            {"torch.add": (repeat(lambda: torch.add(a, b)), sync),
             "direct": (lambda n: kops.add_directly(a, b, c, n), lambda: None),
             "direct_each": (lambda n: kops.add_directly(a, b, c, n, True), lambda: None)},
            *((2, 20) if quick else (15, 200)), 1e6)
        torch.testing.assert_close(c.cpu(), (a + b).cpu(), rtol=0, atol=0)
    if copies:
        n = (1 << 20) if quick else COPY_BYTES
        src = torch.randint(0, 255, (n,), dtype=torch.uint8).to("vkdev")
        dst = torch.empty(n, dtype=torch.uint8, device="vkdev")
        dst.copy_(src)
        sync()
        kops.copy_directly(src, dst, n, 1)
        out["copy_bytes"] = n
        out["copy"] = measure({"copy_": (repeat(lambda: dst.copy_(src)), sync),
                               "direct": (lambda k: kops.copy_directly(src, dst, n, k), lambda: None)},
                              *((2, 1) if quick else (10, 2)), 1e3)
        assert torch.equal(dst.cpu(), src.cpu())
    print(json.dumps(out))


def vendor_lines():
    """(path, lines) of each file under examples/vulkan, and the total."""
    top = os.path.join(ROOT, "examples", "vulkan")
    rows = []
    for folder, _, files in sorted(os.walk(top)):
        for name in sorted(files):
            path = os.path.join(folder, name)
            with open(path, "rb") as f:
                rows.append((os.path.relpath(path, ROOT), sum(1 for _ in f)))
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--copies", action="store_true")
    args = parser.parse_args()
    if args.child:
        child(args.quick, args.copies)
        return
    import torch  # noqa: F401  (its version in the machine line)
    print(machine_line())
    print(f"load average at the start: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(f"vkdev benchmark{' (quick smoke run: figures not meaningful)' if args.quick else ''}:"
          " the MLP training step on the Vulkan device vs the CPU, a small add vs the same"
          " shader submitted directly, device copies vs vkCmdCopyBuffer\n")

    def run_child(access, native, copies):
        env = dict(os.environ, VKDEV_HOST_ACCESS=access, VKDEV_NATIVE_KERNELS=native,
                   OMP_NUM_THREADS="1", TORCH_DEVICE_BACKEND_AUTOLOAD="0")
        for k in ("VKDEV_VISIBLE_DEVICES", "VKDEV_INJECT_FAULT", "VKDEV_ALLOC_CONF", "VKDEV_FALLBACK"):
            env.pop(k, None)
        cmd = ([sys.executable, os.path.abspath(__file__), "--child"] +
               (["--quick"] if args.quick else []) + (["--copies"] if copies else []))
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
        if r.returncode != 0:
            print(f"VKDEV_HOST_ACCESS={access}, VKDEV_NATIVE_KERNELS={native}: the child failed:\n"
                  f"{r.stdout}{r.stderr}")
            sys.exit(1)
        return json.loads(r.stdout.strip().splitlines()[-1])

    print(f"{'figure':52s} {'vkdev':>24s} {'baseline':>24s} {'unit':4s} {'ratio':>22s}")

    def row(name, got, base, unit):
        ratios = [x / y for x, y in zip(got, base)]
        print(f"{name:52s} {spread(got, 3):>24s} {spread(base, 3):>24s} {unit:4s} "
              f"{spread(ratios, 3) + 'x':>22s}")

    combos = ([("none", "1"), ("direct", "0")] if args.quick else
              [("none", "1"), ("direct", "1"), ("none", "0"), ("direct", "0")])
    device = None
    for access, native in combos:
        out = run_child(access, native, copies=native == "1")
        device = out["device"]
        kind = "native kernels" if out["native"] else "no native kernels"
        m = out["mlp"]
        row(f"MLP step, {access}, {kind} (vs CPU)", m["vkdev"], m["cpu"], "ms")
        print(f"  (native kernel launches per step: {out['mlp_launches']:.0f})")
        if "add" in out:
            s = out["add"]
            row(f"add 1024 f32, {access}: torch.add (vs one submission)", s["torch.add"],
                s["direct"], "us")
            row(f"add 1024 f32, {access}: torch.add (vs submit+wait each)", s["torch.add"],
                s["direct_each"], "us")
        if "copy" in out:
            c, mib = out["copy"], out["copy_bytes"] / (1 << 20)
            row(f"copy {mib:.0f} MiB device to device, {access} (vs vkCmdCopyBuffer)",
                c["copy_"], c["direct"], "ms")
            gbps = lambda ms: out["copy_bytes"] / (ms / 1e3) / 1e9  # noqa: E731
            print(f"  ({gbps(sorted(c['copy_'])[len(c['copy_']) // 2]):.2f} GB/s through the "
                  f"backend, {gbps(sorted(c['direct'])[len(c['direct']) // 2]):.2f} GB/s raw)")
    print(f"device: {device}")
    print("\nlines the vendor wrote (examples/vulkan):")
    rows = vendor_lines()
    apart = ("vkdev_test_ops.cpp", "README.md")  # test and benchmark operators; documentation
    for path, n in rows:
        print(f"  {n:6d} {path}{'  (counted apart)' if path.endswith(apart) else ''}")
    print(f"  {sum(n for p, n in rows if not p.endswith(apart)):6d} total: the backend "
          f"(runtime, kernels, shaders, report, CMake)")
    print(f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
