"""PyTorch's own operator samples on the device against the CPU (issue 13).

    python tests/opinfo/compare_cpu.py [--dtype float32] [--samples 2] [--ops a,b] [--jobs 2]

For every OpInfo of the wheel's op_db (torch.testing._internal.
common_methods_invocations; importing it needs `expecttest`) that supports
the dtype on the CPU: the first samples are made on the device and copied
to the CPU (as PyTorch's test_compare_cpu does), the operator run on both,
and every tensor output compared
(torch.testing.assert_close with the OpInfo's tolerances), forward only for
now. Operators run in child processes in chunks; each reports its operator
before running it, so that a crash is charged to its operator. Prints the
tally and the failures.

A first version: not yet part of the test command (no known-differences
list yet); see the session note on issue 13.
"""
import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import time

CHILD = r'''
import json, sys, warnings
warnings.simplefilter("ignore")
import torch, torch_simdev
from torch.testing._internal.common_methods_invocations import op_db

dtype = getattr(torch, sys.argv[1]); samples = int(sys.argv[2]); names = sys.argv[3].split(",")
ops = {o.name + ("." + o.variant_test_name if o.variant_test_name else ""): o for o in op_db}


def to_cpu(x):
    if isinstance(x, torch.Tensor):
        return x.detach().cpu()
    if isinstance(x, torch.device) or (isinstance(x, str) and x.startswith("simdev")):
        return "cpu"
    if isinstance(x, (list, tuple)):
        return type(x)(to_cpu(e) for e in x)
    if isinstance(x, dict):
        return {k: to_cpu(v) for k, v in x.items()}
    return x


def tensors(x):
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for e in x for t in tensors(e)]
    return []


from torch.testing._internal.opinfo.core import DecorateInfo


from torch.testing._internal.common_device_type import toleranceOverride


def compare_cpu_decorators(op):
    for d in op.decorators:
        if isinstance(d, DecorateInfo) and d.test_name == "test_compare_cpu" \
                and d.device_type in (None, "privateuse1") \
                and (d.dtypes is None or dtype in d.dtypes):
            yield from d.decorators


def pytorch_excludes(op):
    # PyTorch's own skips and expected failures of test_compare_cpu for
    # every device (nondeterministic results such as empty(), comparisons
    # that cannot hold such as as_strided on a CPU copy's storage).
    return any(not isinstance(d, toleranceOverride) for d in compare_cpu_decorators(op))


def tolerance(op):
    # PyTorch's own tolerance for test_compare_cpu, if it sets one.
    for d in compare_cpu_decorators(op):
        if isinstance(d, toleranceOverride) and dtype in d.d:
            return {"atol": d.d[dtype].atol, "rtol": d.d[dtype].rtol}
    return {}


for name in names:
    op = ops[name]
    print("START " + name, flush=True)
    status, message = "match", ""
    if name.startswith("jiterator_"):
        print("RESULT " + json.dumps({"op": name, "status": "cuda-only", "message": "Jiterator"}), flush=True)
        continue
    if pytorch_excludes(op):
        print("RESULT " + json.dumps({"op": name, "status": "excluded", "message": "by PyTorch"}), flush=True)
        continue
    try:
        # As PyTorch's test_compare_cpu: samples made on the device, a CPU
        # copy of each (factory operators get device="cpu").
        it = op.sample_inputs("simdev", dtype, requires_grad=False)
        for i, s in enumerate(it):
            if i >= samples:
                break
            cpu_input, cpu_args, cpu_kwargs = to_cpu(s.input), to_cpu(s.args), to_cpu(s.kwargs)
            torch.manual_seed(0)
            got = op(s.input, *s.args, **s.kwargs)
            torch.manual_seed(0)
            want = op(cpu_input, *cpu_args, **cpu_kwargs)
            w, g = tensors(want), tensors(got)
            if len(w) != len(g):
                raise AssertionError(f"{len(g)} outputs on the device, {len(w)} on the CPU")
            for a, b in zip(w, g):
                if a.device.type == "cpu" and b.device.type != "simdev":
                    raise AssertionError(f"an output is on {b.device}, not on the device")
                torch.testing.assert_close(b.cpu(), a, equal_nan=True, check_device=False,
                                           check_stride=False, **tolerance(op))
    except Exception as e:  # noqa: BLE001
        status, message = "differs", f"{type(e).__name__}: {str(e).strip().splitlines()[0][:160] if str(e).strip() else ''}"
    print("RESULT " + json.dumps({"op": name, "status": status, "message": message}), flush=True)
'''


def run_chunk(chunk, dtype, samples, timeout, env):
    results, remaining = {}, list(chunk)
    while remaining:
        try:
            p = subprocess.run([sys.executable, "-c", CHILD, dtype, str(samples), ",".join(remaining)],
                               capture_output=True, text=True, env=env, timeout=timeout)
            out, crashed = p.stdout, p.returncode != 0
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            crashed = True
        started = None
        for line in out.splitlines():
            if line.startswith("START "):
                started = line[6:]
            elif line.startswith("RESULT "):
                r = json.loads(line[7:])
                results[r["op"]] = r
                started = None
        done = [n for n in remaining if n in results]
        if crashed:
            victim = started or remaining[len(done)]
            results[victim] = {"op": victim, "status": "crash", "message": "the process died"}
        remaining = [n for n in remaining if n not in results]
    return results


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--ops", default="")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--chunk", type=int, default=60)
    ap.add_argument("--timeout", type=float, default=600)
    args = ap.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    listing = subprocess.run(
        [sys.executable, "-c",
         "import torch, torch_simdev, sys\n"
         "from torch.testing._internal.common_methods_invocations import op_db\n"
         f"d = getattr(torch, '{args.dtype}')\n"
         "print('\\n'.join(o.name + ('.' + o.variant_test_name if o.variant_test_name else '') "
         "for o in op_db if d in o.supported_dtypes('cpu')))"],
        capture_output=True, text=True, env=env, check=True).stdout.split()
    names = [n for n in listing if not args.ops or n in args.ops.split(",")]
    chunks = [names[i:i + args.chunk] for i in range(0, len(names), args.chunk)]
    t0 = time.monotonic()
    results = {}
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        for r in pool.map(lambda c: run_chunk(c, args.dtype, args.samples, args.timeout, env), chunks):
            results.update(r)
    tally = {"match": 0, "differs": 0, "crash": 0, "excluded": 0, "cuda-only": 0}
    for r in results.values():
        tally[r["status"]] += 1
    for name in names:
        r = results[name]
        if r["status"] in ("differs", "crash"):
            print(f"{r['status']:8} {name}: {r['message']}")
    memory = "host-visible" if os.environ.get("SIMDEV_HOST_VISIBLE", "1") == "1" else "hidden"
    print(f"{args.dtype}, forward, {memory} memory, {args.samples} samples: {len(names)} operators, "
          f"{tally['match']} match, {tally['differs']} differ, {tally['crash']} crash, "
          f"{tally['excluded']} excluded by PyTorch's own test_compare_cpu, "
          f"{tally['cuda-only']} CUDA-only "
          f"({time.monotonic() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
