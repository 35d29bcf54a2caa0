"""The overlap sweep: every operator of PyTorch's OpInfo database (op_db) that
takes out=, run with outputs that alias its inputs, on the device and on the
CPU; both must end alike: both refuse (the same exception type; where either
gives one of PyTorch's overlap messages, the same message), or both succeed
with the same values in every tensor touched (Note [One host storage per
device storage], include/accelkit/torch/fallback.hpp).

    python overlap_sweep.py [--samples N] [--jobs J] [--modes 1,mapped,0]
                            [--ops a,b] [--timeout S]

For each operator, in float32 (int64 where the CPU has no float32 kernel),
the first N samples (default 2) whose functional form runs on the CPU give
the output's shape and dtype; the out= tensor (for several outputs: the
first) is then
  full      the input itself, or another tensor argument of the output's
            shape and dtype;
  partial   over one byte storage with an input (the first two tensor
            arguments in turn), starting one element after it (or before);
  disjoint  over that storage, past the input's end (no overlap: what must
            still work, and must not disturb the input);
  expanded  a single element expanded to the output's shape.
Each case runs twice on the CPU (where the two differ, random draws or
uninitialized memory, only the outcomes are compared) and once on the
device, in each memory mode of simdev (SIMDEV_HOST_VISIBLE=1 direct,
mapped, 0 copies), one process per mode and group of operators; a crash or
a hang is charged to the operator that was running. Differences listed in
KNOWN_DIFFERENCES (each with its reason) are reported and allowed; an entry
that no longer differs anywhere is a failure (a stale entry). Prints a table
and exits non-zero on any failure.
"""
import argparse
import concurrent.futures
import json
import math
import os
import subprocess
import sys
import time

BACKEND = "simdev"
MODES = {"1": "direct", "mapped": "mapped", "0": "copies"}

# (operator, case) -> why the device cannot end as the CPU does; case None:
# every case of the operator.
KNOWN_DIFFERENCES = {}
# (operator, case) -> why the case is not run, on either side.
NOT_RUN = {
    ("narrow_copy", "expanded"): "PyTorch's CPU kernel writes an expanded out= as if it were "
                                 "contiguous, past its memory (the CPU's own heap corrupted)",
    ("nn.functional.avg_pool3d", "expanded"): "as narrow_copy: the CPU kernel writes past an "
                                              "expanded out='s memory",
}

CHILD = r'''
import json, math, sys, warnings
warnings.simplefilter("ignore")
import torch
BACKEND, SAMPLES = sys.argv[1], int(sys.argv[2])
NOT_RUN = {tuple(k) for k in json.loads(sys.argv[3])}
__import__("torch_" + BACKEND)
from torch.testing._internal.common_methods_invocations import op_db
OPS = {o.name + ("." + o.variant_test_name if o.variant_test_name else ""): o for o in op_db}
OVERLAP = ("refer to a single memory location", "refers to a single memory location")


def place(x, device):
    if isinstance(x, torch.Tensor):
        return x.to(device) if device != "cpu" else x.clone()
    if isinstance(x, torch.device) or (isinstance(x, str) and x == "cpu"):
        return torch.device(device)  # a factory's device= argument
    if isinstance(x, (list, tuple)):
        return type(x)(place(e, device) for e in x)
    if isinstance(x, dict):
        return {k: place(v, device) for k, v in x.items()}
    return x


def slots(sample):
    """Paths to the sample's tensors: ("input",), ("input", i), ("args", i), ("kwargs", k)."""
    out = []
    if isinstance(sample.input, torch.Tensor):
        out.append(("input",))
    elif isinstance(sample.input, (list, tuple)):
        out += [("input", i) for i, t in enumerate(sample.input) if isinstance(t, torch.Tensor)]
    out += [("args", i) for i, a in enumerate(sample.args) if isinstance(a, torch.Tensor)]
    out += [("kwargs", k) for k, v in sample.kwargs.items() if isinstance(v, torch.Tensor)]
    return out


def get(call, path):
    x = call[path[0]]
    return x if len(path) == 1 else x[path[1]]


def put(call, path, t):
    if len(path) == 1:
        call[path[0]] = t
    else:
        c = list(call[path[0]]) if not isinstance(call[path[0]], dict) else dict(call[path[0]])
        c[path[1]] = t
        call[path[0]] = c


def shared(target, shape, dtype, where, device):
    """A byte storage holding a copy of `target` and a tensor of `shape` and
    `dtype` placed `where` (partial: one element after the target's start,
    or before it; disjoint: past its end)."""
    align = max(target.element_size(), torch.empty(0, dtype=dtype).element_size(), 8)
    t_bytes = target.numel() * target.element_size()
    o_bytes = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
    if where == "partial":
        if t_bytes > align and o_bytes > 0:
            t_at, o_at = 0, align
        elif o_bytes > align and t_bytes > 0:
            t_at, o_at = align, 0
        else:
            return None
    else:
        t_at, o_at = 0, -(-t_bytes // align) * align
    size = max(t_at + t_bytes, o_at + o_bytes)
    base = torch.zeros(size + align, dtype=torch.uint8, device=device)
    view = lambda at, n, dt, shp: base[at:at + n].view(dt).view(shp)
    t = view(t_at, t_bytes, target.dtype, target.shape)
    t.copy_(target.to(device))
    return base, t, view(o_at, o_bytes, dtype, shape)


def outcome(op, sample, device, case, path, expected):
    call = {"input": place(sample.input, device), "args": list(place(sample.args, device)),
            "kwargs": place(sample.kwargs, device)}
    first = expected[0] if isinstance(expected, (tuple, list)) else expected
    fresh = lambda e: torch.zeros(e.shape, dtype=e.dtype, device=device)
    outs = [fresh(e) for e in expected] if isinstance(expected, (tuple, list)) else None
    watch = []
    if case == "full":
        o = get(call, path)
        watch.append(o)
    elif case in ("partial", "disjoint"):
        made = shared(get(call, path), first.shape, first.dtype, case, device)
        if made is None:
            return None
        _, t, o = made
        put(call, path, t)
        watch.append(t)  # the input, after the operator wrote over or beside it
    else:  # expanded
        o = torch.zeros((1,) * first.dim(), dtype=first.dtype, device=device).expand(first.shape)
    if outs is not None:
        outs[0] = o
        out = type(expected)(outs)
    else:
        out = o
    try:
        r = op(call["input"], *call["args"], **call["kwargs"], out=out)
    except Exception as e:
        return {"kind": type(e).__name__, "message": str(e).split("\n")[0]}
    results = list(r) if isinstance(r, (tuple, list)) else [r]
    values = [x for x in results if isinstance(x, torch.Tensor)] + watch
    return {"kind": "ok", "values": [v.detach().cpu() for v in values]}


def same_values(a, b):
    if len(a) != len(b):
        return f"{len(a)} tensors against {len(b)}"
    for want, got in zip(a, b):
        try:
            torch.testing.assert_close(got, want, equal_nan=True, check_stride=False)
        except AssertionError as e:
            return " ".join(str(e).split())[:300]
    return None


def compare(want, again, got):
    """None when the device ended as the CPU did, else why not."""
    if want["kind"] != got["kind"]:
        w = want.get("message", "values")
        g = got.get("message", "values")
        return f"the CPU: {want['kind']} ({w[:120]}); the device: {got['kind']} ({g[:160]})"
    if want["kind"] != "ok":
        overlap = any(s in m for m in (want["message"], got["message"]) for s in OVERLAP)
        if overlap and want["message"] != got["message"]:
            return f"the CPU: {want['message'][:120]}; the device: {got['message'][:160]}"
        return None
    if again["kind"] == "ok" and same_values(want["values"], again["values"]) is not None:
        return None  # the CPU's own values vary (random draws, uninitialized memory)
    return same_values(want["values"], got["values"])


def run(name):
    op = OPS[name]
    dtypes = op.supported_dtypes("cpu")
    dtype = next((d for d in (torch.float32, torch.int64) if d in dtypes), None)
    rows = []
    if dtype is None:
        return rows
    taken = 0
    for sample in op.sample_inputs("cpu", dtype, requires_grad=False):
        if taken == SAMPLES:
            break
        try:
            expected = op(sample.input, *sample.args, **sample.kwargs)
        except Exception:
            continue
        if isinstance(expected, (tuple, list)):
            if not expected or not all(isinstance(e, torch.Tensor) for e in expected):
                continue
        elif not isinstance(expected, torch.Tensor):
            continue
        first = expected[0] if isinstance(expected, (tuple, list)) else expected
        if first.layout != torch.strided:
            continue
        taken += 1
        given = {"input": sample.input, "args": sample.args, "kwargs": sample.kwargs}
        paths = [p for p in slots(sample) if get(given, p).layout == torch.strided]
        cases = []
        for p in paths:
            t = get(given, p)
            if t.shape == first.shape and t.dtype == first.dtype:
                cases.append(("full", p))
        for p in paths[:2]:
            cases += [("partial", p), ("disjoint", p)]
        if first.numel() > 1:
            cases.append(("expanded", None))
        for case, p in cases:
            if (name, case) in NOT_RUN:
                continue
            want = outcome(op, sample, "cpu", case, p, expected)
            if want is None:
                continue
            again = outcome(op, sample, "cpu", case, p, expected)
            got = outcome(op, sample, BACKEND, case, p, expected)
            why = compare(want, again, got)
            kind = "ok" if want["kind"] == "ok" else "overlap" if any(
                s in want["message"] for s in OVERLAP) else "error"
            rows.append({"case": case, "kind": kind, "differs": why})
    return rows


for name in sys.argv[4:]:
    print("START " + name, flush=True)
    try:
        rows = run(name)
        print("RESULT " + json.dumps({"op": name, "rows": rows}), flush=True)
    except Exception as e:  # the sweep itself failed on this operator
        failed = f"{type(e).__name__}: {e}"[:300]
        print("RESULT " + json.dumps({"op": name, "rows": [], "failed": failed}), flush=True)
'''

LISTING = r'''
import json, warnings
warnings.simplefilter("ignore")
import torch
from torch.testing._internal.common_methods_invocations import op_db
print(json.dumps([o.name + ("." + o.variant_test_name if o.variant_test_name else "")
                  for o in op_db if o.supports_out]))
'''


def known(name, case):
    """The entry of KNOWN_DIFFERENCES that lists this difference, if any."""
    for key in ((name, case), (name, None)):
        if key in KNOWN_DIFFERENCES:
            return key
    return None


def environment(mode):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
           "SIMDEV_HOST_VISIBLE": mode, "SIMDEV_DEVICE_COUNT": "1", "SIMDEV_MEMORY_MB": "256",
           "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    for k in ("SIMDEV_VISIBLE_DEVICES", "SIMDEV_INJECT_FAULT", "SIMDEV_ALLOC_CONF",
              "SIMDEV_FALLBACK", "SIMDEV_FALLBACK_BLOCKLIST"):
        env.pop(k, None)
    return env


def run_chunk(mode, chunk, samples, timeout):
    results, remaining = {}, list(chunk)
    while remaining:
        command = [sys.executable, "-c", CHILD, BACKEND, str(samples), json.dumps(list(NOT_RUN)),
                   *remaining]
        try:
            p = subprocess.run(command, capture_output=True, text=True, env=environment(mode),
                               timeout=timeout)
            out, ended = p.stdout, (f"the process died ({p.returncode}): {p.stderr[-300:]}"
                                    if p.returncode else "")
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            ended = f"timed out ({timeout:.0f} s for its group)"
        started = None
        for line in out.splitlines():
            if line.startswith("START "):
                started = line[6:]
            elif line.startswith("RESULT "):
                r = json.loads(line[7:])
                results[r["op"]] = r
                started = None
        if ended:
            victim = started or next(n for n in remaining if n not in results)
            results[victim] = {"op": victim, "rows": [], "failed": ended}
        remaining = [n for n in remaining if n not in results]
    return mode, results


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--modes", default="1,mapped,0")
    ap.add_argument("--ops", default="")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--groups", type=int, default=2, help="processes per mode")
    args = ap.parse_args()
    modes = args.modes.split(",")
    p = subprocess.run([sys.executable, "-c", LISTING], capture_output=True, text=True,
                       env=environment("1"))
    if p.returncode:
        print(p.stderr[-3000:])
        return 1
    names = json.loads(p.stdout.strip().splitlines()[-1])
    if args.ops:
        names = [n for n in names if n in args.ops.split(",")]
    t0 = time.monotonic()
    per = max(1, math.ceil(len(names) / args.groups))
    work = [(m, names[i:i + per]) for m in modes for i in range(0, len(names), per)]
    results = {m: {} for m in modes}
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        for mode, r in pool.map(lambda w: run_chunk(w[0], w[1], args.samples, args.timeout), work):
            results[mode].update(r)

    failures, seen_known = [], set()
    header = (f"{'memory':<8}{'operators':>10}{'covered':>9}{'cases':>7}{'refused':>9}"
              f"{'errors':>8}{'equal':>7}{'known':>7}{'failures':>10}")
    print(header)
    print("-" * len(header))
    for mode in modes:
        c = dict.fromkeys(["covered", "cases", "overlap", "error", "ok", "known", "failures"], 0)
        for name in names:
            r = results[mode][name]
            if r.get("failed"):
                c["failures"] += 1
                failures.append(f"{name} ({MODES[mode]}): {r['failed']}")
                continue
            c["covered"] += bool(r["rows"])
            for row in r["rows"]:
                c["cases"] += 1
                if row["differs"] is None:
                    c[row["kind"]] += 1
                elif known(name, row["case"]):
                    c["known"] += 1
                    seen_known.add(known(name, row["case"]))
                else:
                    c["failures"] += 1
                    failures.append(f"{name} {row['case']} ({MODES[mode]}): {row['differs']}")
        print(f"{MODES[mode]:<8}{len(names):>10}{c['covered']:>9}{c['cases']:>7}{c['overlap']:>9}"
              f"{c['error']:>8}{c['ok']:>7}{c['known']:>7}{c['failures']:>10}")
    print("-" * len(header))
    print(f"{time.monotonic() - t0:.0f} s, {args.samples} sample(s) per operator; refused: both "
          "raised PyTorch's overlap error, alike; errors: both raised another error of one type; "
          "equal: both ran, every tensor touched equal; covered: operators with a sample both "
          "sides compared")
    if not args.ops and len(modes) == len(MODES):
        for key in sorted(set(KNOWN_DIFFERENCES) - seen_known, key=str):
            failures.append(f"stale known difference {key}: it no longer differs")
    for key in sorted(seen_known, key=str):
        print(f"known difference: {key[0]} {key[1] or '(every case)'}: {KNOWN_DIFFERENCES[key]}")
    for key in sorted(NOT_RUN):
        print(f"not run: {key[0]} {key[1]}: {NOT_RUN[key]}")
    for f in failures:
        print("FAIL", f)
    print(f"overlap sweep: {'ok' if not failures else f'{len(failures)} failures'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
