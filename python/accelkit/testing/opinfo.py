"""PyTorch's own operator samples on a backend against the CPU.

    python -m accelkit.testing.opinfo [--backend simdev] [--dtypes float32,...]
        [--directions forward,backward,out,nested] [--samples 1] [--ops a,b] [--jobs 2] [--json out.json]

For every OpInfo of the wheel's op_db (torch.testing._internal.
common_methods_invocations; importing it needs `expecttest`) and every dtype
asked for that the backend reports (its capability schema's `dtypes`) and
the CPU supports for the operator: forward outputs, where the operator has
a CPU backward for the dtype, gradients, and where it takes out=, the same
samples with out= tensors on the device (filled, not contiguous, empty),
and the nested samples of njt_op_db in both layouts (direction nested),
compared with the CPU's; every call's warnings too (_opinfo_child.py says
how). Operators run in child processes, several items
each, restarted past an item that crashes or hangs, which is charged to that
item. Each item ends as match, mismatch (the largest error in the message),
error (the device raised where the CPU did not, or another exception type),
crash (the child died or hung) or "not compared" (no sample both sides take,
a CUDA-only operator). The conformance kit runs QUICK (or everything) as its
group "opinfo", where a failure on the SDK's list of known differences
(known_differences.py) is reported as one; tests/opinfo/test_opinfo.py runs
every operator under pytest against that list; run directly, it prints
every failure and the tally.
"""
import argparse
import concurrent.futures
import json
import math
import os
import subprocess
import sys
import time

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_opinfo_child.py")
DTYPES = ["float32", "float16", "bfloat16", "int64", "bool", "complex64"]
STATUSES = ("match", "mismatch", "error", "crash", "not compared")
FAILED = ("mismatch", "error", "crash")

# The conformance kit's fixed set (--opinfo quick): common operators of every
# kind (elementwise, reductions, linear algebra, indexing, shape, nn), tried
# in float32 and int64 forward and float32 backward, one sample each.
QUICK = ["add", "sub", "mul", "div.no_rounding_mode", "exp", "log", "sqrt", "abs", "neg",
         "sin", "tanh", "sigmoid", "pow", "clamp", "where", "sum", "mean", "amax", "argmax",
         "cumsum", "mm", "matmul", "bmm", "index_select", "gather", "cat", "stack", "transpose",
         "nn.functional.relu", "softmax", "nn.functional.linear",
         "nn.functional.conv2d", "nn.functional.layer_norm", "nn.functional.cross_entropy",
         "masked_fill", "sort", "topk", "flip"]
QUICK_DTYPES = ["float32", "int64"]

LISTING = r'''
import json, sys, warnings
warnings.simplefilter("ignore")
import torch
backend = sys.argv[1]
__import__("torch_" + backend)
from torch.testing._internal.common_methods_invocations import op_db
sys.path.insert(0, sys.argv[3])
import _nested_samples
props = getattr(torch, backend).get_device_properties(0)
items = {}
for name in sys.argv[2].split(","):
    d = getattr(torch, name)
    items[name] = {
        "forward": [o.name + ("." + o.variant_test_name if o.variant_test_name else "")
                    for o in op_db if d in o.supported_dtypes("cpu")],
        "backward": [o.name + ("." + o.variant_test_name if o.variant_test_name else "")
                     for o in op_db if o.supports_autograd and d in o.supported_backward_dtypes("cpu")],
        "out": [o.name + ("." + o.variant_test_name if o.variant_test_name else "")
                for o in op_db if o.supports_out and d in o.supported_dtypes("cpu")],
        "nested": _nested_samples.names(d) if name in sys.argv[4].split(",") else [],
    }
print(json.dumps({"dtypes": props["dtypes"], "host_visible_memory": props["host_visible_memory"],
                  "items": items}))
'''


def environment():
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}


def listing(backend, dtypes, nested_dtypes=None):
    """The backend's dtypes and memory mode, and the operators per dtype
    and direction that the CPU supports (nested: for nested_dtypes only,
    default all; listing them makes samples)."""
    nested = ",".join(dtypes if nested_dtypes is None else nested_dtypes)
    p = subprocess.run([sys.executable, "-c", LISTING, backend, ",".join(dtypes), os.path.dirname(CHILD),
                        nested],
                       capture_output=True, text=True, env=environment())
    if p.returncode != 0:
        raise RuntimeError(f"listing the operators failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def run_chunk(backend, chunk, samples, timeout):
    results, remaining = {}, list(chunk)
    while remaining:
        command = [sys.executable, CHILD, backend, str(samples), *remaining]
        try:
            p = subprocess.run(command, capture_output=True, text=True, env=environment(), timeout=timeout)
            out, ended = p.stdout, (f"the process died ({p.returncode})" if p.returncode else "")
            err = p.stderr
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
            ended = f"timed out ({timeout:.0f} s for its chunk)"
        started = None
        for line in out.splitlines():
            if line.startswith("START "):
                started = line[6:]
            elif line.startswith("RESULT "):
                r = json.loads(line[7:])
                results[r["item"]] = r
                started = None
        if ended:
            # The item running when the process ended, or the next one; a process that ends
            # after its last item's result (at exit) is charged to that item.
            victim = started or next((n for n in remaining if n not in results), remaining[-1])
            if victim in results:
                ended += " after its last item"
            tail = err.strip().splitlines()[-12:]
            results[victim] = {"item": victim, "status": "crash",
                               "message": ended + (": " + "\n".join(tail) if tail else "")}
        remaining = [n for n in remaining if n not in results]
    return results


def run(backend, items, samples=1, jobs=2, timeout=600, chunks_per_job=3):
    """{item: {"item", "status", "message"}} for items "op|dtype|direction";
    status is match, mismatch, error, crash, "not compared" or "not
    applicable" (the CPU does not support the operator in that dtype or
    direction: an item not from the listing)."""
    per = max(1, math.ceil(len(items) / (jobs * chunks_per_job)))
    chunks = [items[i:i + per] for i in range(0, len(items), per)]
    results = {}
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        for r in pool.map(lambda c: run_chunk(backend, c, samples, timeout), chunks):
            results.update(r)
    return results


def items_for(found, dtypes, directions, ops=None):
    out = []
    for d in dtypes:
        for direction in directions:
            out += [f"{name}|{d}|{direction}" for name in found["items"][d][direction]
                    if not ops or name in ops]
    return out


def kit_run(report, backend, ctx, full=False, ops=None, dtypes=None, samples=1,
            directions=("forward", "backward"), jobs=2, log=None):
    """The kit's group "opinfo": one check per item "op dtype direction"
    (pass: match; fail: mismatch, error, crash; skip: not compared); a
    failure on the SDK's list of known differences (known_differences.py),
    for the memory mode of device 0, or on the report's vendor list, is a
    known difference."""
    import time as _time

    from .known_differences import known
    memory = "host-visible" if ctx.props["host_visible_memory"] else "hidden"
    t0 = _time.monotonic()
    wanted = dtypes or (DTYPES if full or ops else QUICK_DTYPES)
    tried = [d for d in wanted if d in ctx.props["dtypes"]]
    if full:  # every operator: listed by a child (op_db's names per dtype)
        items = items_for(listing(backend, tried, tried if "nested" in directions else []),
                          tried, directions)
    else:  # named operators: a child drops those the CPU does not support
        quick = not ops
        items = [f"{op}|{d}|{w}" for d in tried for w in directions for op in (ops or QUICK)
                 if not (quick and w == "backward" and d != "float32")]  # quick: float32 only
    # A child imports torch and op_db first (seconds): the quick set runs in
    # one child per job.
    per_job = 3 if full else 1
    chunk = math.ceil(len(items) / (jobs * per_job))  # a timeout is a chunk's
    results = run(backend, items, samples=samples, jobs=jobs,
                  timeout=max(300, 2 * samples * chunk), chunks_per_job=per_job)
    each = (_time.monotonic() - t0) / max(1, len(items))
    items = [i for i in items if results[i]["status"] != "not applicable"]
    for item in items:
        r = results[item]
        op, dtype, direction = item.split("|")
        status = {"match": "pass", "not compared": "skip"}.get(r["status"], "fail")
        message = r["message"] if status == "pass" else f"{r['status']}: {r['message']}"
        status = report.add("opinfo", f"{op} {dtype} {direction}",
                            f"PyTorch's OpInfo samples of {op} ({dtype}, {direction}) on the "
                            "device match the CPU", status, message, r.get("duration_s", each),
                            known=known(op, dtype, direction, memory))
        if log and status != "pass":
            log(f"{status:<4} opinfo/{op} {dtype} {direction}: {message[:200]}")
    if log:
        n = {s: sum(results[i]["status"] == s for i in items) for s in STATUSES}
        log(f"opinfo: {len(items)} items, " + ", ".join(f"{n[s]} {s}" for s in STATUSES)
            + f" ({_time.monotonic() - t0:.0f} s)")
    return results


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="simdev")
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--directions", default="forward,backward,out,nested")
    ap.add_argument("--samples", type=int, default=1)
    ap.add_argument("--ops", default="")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--json", default="", help="also write every item's result here")
    args = ap.parse_args()
    dtypes = args.dtypes.split(",")
    found = listing(args.backend, dtypes, dtypes if "nested" in args.directions.split(",") else [])
    dtypes = [d for d in dtypes if d in found["dtypes"]]
    directions = args.directions.split(",")
    items = items_for(found, dtypes, directions, set(args.ops.split(",")) if args.ops else None)
    t0 = time.monotonic()
    results = run(args.backend, items, args.samples, args.jobs, args.timeout)
    for item in items:
        r = results[item]
        if r["status"] != "match":
            print(f"{r['status']:8} {item}: {r['message']}")
    memory = "host-visible" if found["host_visible_memory"] else "hidden"
    for d in dtypes:
        for direction in directions:
            rs = [r for i, r in results.items() if i.split("|")[1:] == [d, direction]]
            count = {s: sum(r["status"] == s for r in rs) for s in STATUSES}
            print(f"{d} {direction}, {memory} memory, {args.samples} samples: {len(rs)} operators, "
                  + ", ".join(f"{count[s]} {s}" for s in STATUSES))
    print(f"({time.monotonic() - t0:.0f} s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"backend": args.backend, "memory": memory, "samples": args.samples,
                       "results": [results[i] for i in items]}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
