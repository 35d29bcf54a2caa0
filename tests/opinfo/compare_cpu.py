"""PyTorch's own operator samples on a backend against the CPU (issue 13).

    python tests/opinfo/compare_cpu.py [--backend simdev] [--dtypes float32,...]
        [--directions forward,backward] [--samples 1] [--ops a,b] [--jobs 2]

For every OpInfo of the wheel's op_db (torch.testing._internal.
common_methods_invocations; importing it needs `expecttest`) and every dtype
asked for that the backend reports (its capability schema's `dtypes`) and
the CPU supports for the operator: forward outputs and, where the operator
has a CPU backward for the dtype, gradients, compared with the CPU's
(opinfo_child.py says how). Operators run in child processes, several items
each, restarted past an item that crashes or hangs, which is charged to that
item. tests/opinfo/test_opinfo.py runs it under pytest against the list of
known differences; run directly, it prints every failure and the tally.
"""
import argparse
import concurrent.futures
import json
import math
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DTYPES = ["float32", "float16", "bfloat16", "int64", "bool", "complex64"]

LISTING = r'''
import json, sys, warnings
warnings.simplefilter("ignore")
import torch
backend = sys.argv[1]
__import__("torch_" + backend)
from torch.testing._internal.common_methods_invocations import op_db
props = getattr(torch, backend).get_device_properties(0)
items = {}
for name in sys.argv[2].split(","):
    d = getattr(torch, name)
    items[name] = {
        "forward": [o.name + ("." + o.variant_test_name if o.variant_test_name else "")
                    for o in op_db if d in o.supported_dtypes("cpu")],
        "backward": [o.name + ("." + o.variant_test_name if o.variant_test_name else "")
                     for o in op_db if o.supports_autograd and d in o.supported_backward_dtypes("cpu")],
    }
print(json.dumps({"dtypes": props["dtypes"], "host_visible_memory": props["host_visible_memory"],
                  "items": items}))
'''


def environment():
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}


def listing(backend, dtypes):
    """The backend's dtypes and memory mode, and the operators per dtype
    and direction that the CPU supports."""
    p = subprocess.run([sys.executable, "-c", LISTING, backend, ",".join(dtypes)],
                       capture_output=True, text=True, env=environment())
    if p.returncode != 0:
        raise RuntimeError(f"listing the operators failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def run_chunk(backend, chunk, samples, timeout):
    results, remaining = {}, list(chunk)
    while remaining:
        command = [sys.executable, os.path.join(HERE, "opinfo_child.py"), backend, str(samples), *remaining]
        try:
            p = subprocess.run(command, capture_output=True, text=True, env=environment(), timeout=timeout)
            out, ended = p.stdout, (f"the process died ({p.returncode})" if p.returncode else "")
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
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
            victim = started or next(n for n in remaining if n not in results)
            results[victim] = {"item": victim, "status": "crash", "message": ended}
        remaining = [n for n in remaining if n not in results]
    return results


def run(backend, items, samples=1, jobs=2, timeout=600):
    """{item: {"item", "status", "message"}} for items "op|dtype|direction";
    status is match, differs, crash or "not compared"."""
    per = max(1, math.ceil(len(items) / (jobs * 3)))
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="simdev")
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--directions", default="forward,backward")
    ap.add_argument("--samples", type=int, default=1)
    ap.add_argument("--ops", default="")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=600)
    args = ap.parse_args()
    dtypes = args.dtypes.split(",")
    found = listing(args.backend, dtypes)
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
            count = {s: sum(r["status"] == s for r in rs) for s in ("match", "differs", "crash", "not compared")}
            print(f"{d} {direction}, {memory} memory, {args.samples} samples: {len(rs)} operators, "
                  f"{count['match']} match, {count['differs']} differ, {count['crash']} crash, "
                  f"{count['not compared']} not compared")
    print(f"({time.monotonic() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
