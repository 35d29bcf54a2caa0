"""The cudart backend against PyTorch's own CUDA backend on the same GPU, side by side in one
run (issue 20; run by scripts/gpu_check, which puts _build-gpu/python on PYTHONPATH).

Figures, each the median of interleaved rounds with its interquartile range:
  - allocation hit path: torch.empty(1 KiB) + free through accelkit's caching pool (cudart)
    vs through torch.cuda's, and raw cudaMalloc + cudaFree (through ctypes; the ctypes call
    overhead, measured on cudaGetDevice, is printed beside it);
  - event record + query: torch.cudart.Event vs torch.cuda.Event;
  - host<->device bandwidth from pinned memory, 256 MiB copies (target >= 0.95x torch.cuda);
  - launch overhead of a small elementwise kernel (a + b on 1024 float32, the backend's own
    CUDA kernel) vs the same on torch.cuda (target <= 1.2x).

usage: gpu_check_bench.py [--rounds N] [--json PATH]"""
import argparse
import ctypes
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
import benchlib  # noqa: E402

import torch  # noqa: E402
import torch_cudart  # noqa: E402,F401  (registers torch.cudart)


def per_op_ns(fn, n, sync):
    sync()
    t0 = time.perf_counter_ns()
    fn(n)
    sync()
    return (time.perf_counter_ns() - t0) / n


def rounds_of(cases, rounds):
    """Runs each case once per round, interleaved; returns {name: [per-round values]}."""
    out = {name: [] for name in cases}
    for _ in range(rounds):
        for name, run in cases.items():
            out[name].append(run())
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--json")
    args = ap.parse_args()
    if not torch.cuda.is_available() or torch.cudart.device_count() == 0:
        print("gpu_check_bench: no GPU (torch.cuda available: "
              f"{torch.cuda.is_available()}, cudart devices: {torch.cudart.device_count()})")
        return 2
    print(benchlib.machine_line())
    print(f"gpu: {torch.cuda.get_device_name(0)}; cudart sees "
          f"{torch.cudart.get_device_name(0)}")
    results = {"machine": benchlib.machine_line(), "gpu": torch.cuda.get_device_name(0),
               "figures": {}}

    def sync_cudart():
        torch.cudart.synchronize()

    def sync_cuda():
        torch.cuda.synchronize()

    def report(title, values, unit, ours, theirs, target=None, lower_is_better=True):
        print(f"\n{title}")
        for name, xs in values.items():
            print(f"  {name:34s} {benchlib.spread(xs)} {unit}")
        ratio = statistics.median(values[ours]) / statistics.median(values[theirs])
        verdict = ""
        if target is not None:
            met = ratio <= target if lower_is_better else ratio >= target
            verdict = (f" (target {'<=' if lower_is_better else '>='} {target}x: "
                       f"{'met' if met else 'MISSED'})")
        print(f"  {ours} / {theirs}: {ratio:.3f}x{verdict}")
        results["figures"][title] = {
            "unit": unit, "ratio": ratio, "target": target,
            "values": {k: {"median": statistics.median(v), "q": benchlib.quartiles(v)}
                       for k, v in values.items()}}

    # ------------------------------------------------------------ allocation hit path
    def alloc_loop(dev):
        def run(n):
            for _ in range(n):
                t = torch.empty(256, device=dev)
                del t
        return run

    # Raw cudaMalloc + cudaFree, through ctypes on the libcudart the backend loaded.
    lib = ctypes.CDLL(os.path.join(os.path.dirname(torch_cudart.__file__), "_C.so"))
    lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    lib.cudaFree.argtypes = [ctypes.c_void_p]
    lib.cudaGetDevice.argtypes = [ctypes.POINTER(ctypes.c_int)]

    def raw_loop(n):
        p = ctypes.c_void_p()
        for _ in range(n):
            if lib.cudaMalloc(ctypes.byref(p), 1024) != 0:
                raise RuntimeError("cudaMalloc failed")
            lib.cudaFree(p)

    def ctypes_loop(n):
        d = ctypes.c_int()
        for _ in range(n):
            lib.cudaGetDevice(ctypes.byref(d))

    torch.cuda.set_device(0)
    torch.cudart.set_device(0)
    n = 20000
    for f, s in ((alloc_loop("cudart"), sync_cudart), (alloc_loop("cuda"), sync_cuda)):
        per_op_ns(f, 2000, s)  # warm the pools
    values = rounds_of({
        "cudart: torch.empty + free": lambda: per_op_ns(alloc_loop("cudart"), n, sync_cudart),
        "torch.cuda: torch.empty + free": lambda: per_op_ns(alloc_loop("cuda"), n, sync_cuda),
        "raw cudaMalloc + cudaFree (ctypes)": lambda: per_op_ns(raw_loop, 500, sync_cuda),
        "ctypes call overhead (cudaGetDevice)": lambda: per_op_ns(ctypes_loop, n, sync_cuda),
    }, args.rounds)
    report("allocation hit path (1 KiB)", values, "ns/op", "cudart: torch.empty + free",
           "torch.cuda: torch.empty + free")
    print(f"  raw cudaMalloc+cudaFree / cudart pool: "
          f"{statistics.median(values['raw cudaMalloc + cudaFree (ctypes)']) / statistics.median(values['cudart: torch.empty + free']):.1f}x")

    # ------------------------------------------------------------ event record + query
    def event_loop(mod):
        e = mod.Event()

        def run(n):
            for _ in range(n):
                e.record()
                e.query()
        return run

    for f, s in ((event_loop(torch.cudart), sync_cudart), (event_loop(torch.cuda), sync_cuda)):
        per_op_ns(f, 1000, s)
    values = rounds_of({
        "cudart: Event.record + query": lambda: per_op_ns(event_loop(torch.cudart), n, sync_cudart),
        "torch.cuda: Event.record + query": lambda: per_op_ns(event_loop(torch.cuda), n, sync_cuda),
    }, args.rounds)
    report("event record + query", values, "ns/op", "cudart: Event.record + query",
           "torch.cuda: Event.record + query")

    # ------------------------------------------------------------ pinned bandwidth
    size = 256 << 20
    host = torch.empty(size, dtype=torch.uint8, pin_memory=True)  # the accelerator's: cudart
    host.fill_(1)
    print(f"\npinned host buffer: {size >> 20} MiB, is_pinned={host.is_pinned()}")
    dev_cudart = torch.empty(size, dtype=torch.uint8, device="cudart")
    dev_cuda = torch.empty(size, dtype=torch.uint8, device="cuda")

    def gbps(copy, sync, reps=5):
        def run():
            sync()
            t0 = time.perf_counter()
            for _ in range(reps):
                copy()
            sync()
            return reps * size / (time.perf_counter() - t0) / 1e9
        return run

    for direction, ours, theirs in (
            ("host to device", lambda: dev_cudart.copy_(host, non_blocking=True),
             lambda: dev_cuda.copy_(host, non_blocking=True)),
            ("device to host", lambda: host.copy_(dev_cudart, non_blocking=True),
             lambda: host.copy_(dev_cuda, non_blocking=True))):
        gbps(ours, sync_cudart, 2)()
        gbps(theirs, sync_cuda, 2)()
        values = rounds_of({f"cudart: {direction}": gbps(ours, sync_cudart),
                            f"torch.cuda: {direction}": gbps(theirs, sync_cuda)}, args.rounds)
        report(f"pinned bandwidth, {direction}, 256 MiB", values, "GB/s",
               f"cudart: {direction}", f"torch.cuda: {direction}", target=0.95,
               lower_is_better=False)
    del dev_cudart, dev_cuda, host

    # ------------------------------------------------------------ launch overhead
    def add_loop(dev):
        a = torch.ones(1024, device=dev)
        b = torch.ones(1024, device=dev)

        def run(n):
            for _ in range(n):
                c = a + b
            del c
        return run

    check = torch.ones(1024, device="cudart") + torch.ones(1024, device="cudart")
    assert check.cpu().eq(2).all(), "cudart's add kernel gave a wrong result"
    for f, s in ((add_loop("cudart"), sync_cudart), (add_loop("cuda"), sync_cuda)):
        per_op_ns(f, 2000, s)
    values = rounds_of({
        "cudart: a + b (1024 float32)": lambda: per_op_ns(add_loop("cudart"), n, sync_cudart),
        "torch.cuda: a + b (1024 float32)": lambda: per_op_ns(add_loop("cuda"), n, sync_cuda),
    }, args.rounds)
    report("small elementwise launch overhead", values, "ns/op", "cudart: a + b (1024 float32)",
           "torch.cuda: a + b (1024 float32)", target=1.2)

    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
