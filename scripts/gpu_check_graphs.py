"""Graphs on an accelkit backend, against torch.cuda's on the same GPU, in one run (run by
scripts/gpu_check for cudart, which puts _build-gpu/python on PYTHONPATH).

Checks, each printed as ok or FAILED (exit status 1 when one fails):
  - capture and replay: a sequence of OPS small elementwise operators (x * a, + b, relu, in
    turn, on NUMEL float32: the backend's own kernels) warmed up on a side stream, captured
    with torch.<backend>.graph, replayed after new inputs are copied into the static input:
    each replay equals the sequence run eagerly on the CPU;
  - make_graphed_callables: a module (x * w + b) * x graphed with
    torch.<backend>.make_graphed_callables: its output and its parameters' gradients equal
    the same module's run eagerly on the backend.
Figures (medians of interleaved rounds, with interquartile ranges): the host time per
replay of the captured sequence, per replay with the queue drained (REPLAYS replays, then a
synchronize), and per eager sequence; on the backend, and where torch.cuda is available on
torch.cuda.CUDAGraph capturing the same sequence, with the ratios backend / torch.cuda.

usage: gpu_check_graphs.py [--backend cudart] [--ops 100] [--numel 1024] [--replays 200]
                           [--rounds 7] [--json PATH]
       gpu_check_graphs.py --self-check   # what needs no device: the CPU side of the checks,
                                          # the figures' arithmetic, scripts/gpu_check's syntax
Exit status: 0 every check passed, 1 one failed, 2 no device of the backend (nothing run)."""
import argparse
import contextlib
import importlib
import io
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "bench"))
import benchlib  # noqa: E402

import torch  # noqa: E402


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="cudart",
                    help="the accelkit backend's device type (its module torch_<backend>)")
    ap.add_argument("--ops", type=int, default=100, help="operators in the captured sequence")
    ap.add_argument("--numel", type=int, default=1024, help="elements of each operand")
    ap.add_argument("--replays", type=int, default=200, help="replays per timed round")
    ap.add_argument("--rounds", type=int, default=7, help="interleaved timed rounds")
    ap.add_argument("--json", help="write the results there")
    ap.add_argument("--self-check", action="store_true",
                    help="check what needs no device, then exit")
    args = ap.parse_args(argv)
    for name in ("ops", "numel", "replays", "rounds"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    return args


# ------------------------------------------------------------------ the workload

def operands(numel, device, seed=0):
    """The sequence's constant operands a and b, and a first input, on `device`."""
    g = torch.Generator().manual_seed(seed)
    a = torch.rand(numel, generator=g) * 0.2 + 0.9  # around 1: the values stay bounded
    b = torch.rand(numel, generator=g) - 0.5
    x = torch.randn(numel, generator=g)
    return a.to(device), b.to(device), x.to(device)


def sequence(x, a, b, ops):
    """`ops` elementwise operators on x, in turn x * a, + b, relu: one kernel each."""
    y = x
    for i in range(ops):
        k = i % 3
        if k == 0:
            y = y * a
        elif k == 1:
            y = y + b
        else:
            y = torch.relu(y)
    return y


class Elementwise(torch.nn.Module):
    """(x * w + b) * x: forward and backward in mul and add of one shape (the kernels every
    backend here has; relu's backward is not among cudart's)."""

    def __init__(self, numel):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.w = torch.nn.Parameter(torch.rand(numel, generator=g) + 0.5)
        self.b = torch.nn.Parameter(torch.rand(numel, generator=g) - 0.5)

    def forward(self, x):
        return (x * self.w + self.b) * x


def count_operators(fn, *args):
    """The ATen operators fn(*args) runs (the CPU side: no device needed)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func.overloadpacket.__name__))
            return func(*args, **(kwargs or {}))

    with Count() as c:
        fn(*args)
    return c.ops


# ------------------------------------------------------------------ the figures

def per_replay_ns(run, n, sync):
    """Host ns per call of run() over n calls, and ns per call with the queue drained
    (n calls, then sync)."""
    sync()
    t0 = time.perf_counter_ns()
    for _ in range(n):
        run()
    t1 = time.perf_counter_ns()
    sync()
    t2 = time.perf_counter_ns()
    return (t1 - t0) / n, (t2 - t0) / n


def summarize(values):
    """{name: [per-round values]} -> {name: {"median", "q"}} (the JSON form)."""
    return {k: {"median": statistics.median(v), "q": list(benchlib.quartiles(v))}
            for k, v in values.items()}


def ratio(values, ours, theirs):
    return statistics.median(values[ours]) / statistics.median(values[theirs])


# ------------------------------------------------------------------ the checks

class Checks:
    def __init__(self):
        self.failed = []
        self.results = {}

    def run(self, name, fn):
        print(f"\n=== {name}")
        try:
            out = fn()
        except Exception as e:  # noqa: BLE001  (each check reports and the run goes on)
            import traceback
            traceback.print_exc()
            print(f"FAILED {name}: {type(e).__name__}: {e}")
            self.failed.append(name)
            return None
        print(f"ok {name}")
        return out


def capture_sequence(mod, device, a, b, static_x, ops, pool=None):
    """The sequence warmed up on a side stream and captured with mod.graph: (graph, output)."""
    s = mod.Stream()
    s.wait_stream(mod.current_stream())
    with mod.stream(s):
        for _ in range(3):
            sequence(static_x, a, b, ops)
    mod.current_stream().wait_stream(s)
    g = mod.CUDAGraph()
    with mod.graph(g, pool=pool):
        static_y = sequence(static_x, a, b, ops)
    return g, static_y


def check_capture_replay(mod, device, args):
    a, b, x = operands(args.numel, device)
    static_x = x.clone()
    g, static_y = capture_sequence(mod, device, a, b, static_x, args.ops)
    a_cpu, b_cpu = a.cpu(), b.cpu()
    for seed in (10, 11):
        new_x = torch.randn(args.numel, generator=torch.Generator().manual_seed(seed))
        static_x.copy_(new_x.to(device))
        g.replay()
        mod.synchronize()
        torch.testing.assert_close(static_y.cpu(), sequence(new_x, a_cpu, b_cpu, args.ops))
    print(f"  {args.ops} operators on {args.numel} float32 captured; two replays with new "
          "inputs equal the CPU's eager results")
    g.reset()


def check_graphed_callables(mod, device, args):
    torch.manual_seed(0)
    eager = Elementwise(args.numel).to(device)
    graphed = Elementwise(args.numel).to(device)
    graphed.load_state_dict(eager.state_dict())
    sample = torch.randn(args.numel, device=device)
    graphed = mod.make_graphed_callables(graphed, (sample,))
    for seed in (20, 21):
        x = torch.randn(args.numel, generator=torch.Generator().manual_seed(seed)).to(device)
        grad = torch.randn(args.numel, generator=torch.Generator().manual_seed(seed + 50))
        grad = grad.to(device)
        outs = []
        for m in (eager, graphed):
            for p in m.parameters():
                p.grad = None
            y = m(x)
            y.backward(grad)
            outs.append((y.detach().cpu(), m.w.grad.cpu(), m.b.grad.cpu()))
        for got, want in zip(outs[1], outs[0]):
            torch.testing.assert_close(got, want)
    print("  make_graphed_callables: output and gradients equal the eager module's, "
          "for two inputs")


def time_replays(mod, device, args, cuda):
    """The figures; torch.cuda beside the backend where `cuda`."""
    def setup(m, dev):
        a, b, x = operands(args.numel, dev)
        static_x = x.clone()
        g, _ = capture_sequence(m, dev, a, b, static_x, args.ops)
        return g, (lambda: sequence(static_x, a, b, args.ops)), m.synchronize

    cases = {args.backend: setup(mod, device)}
    if cuda:
        cases["torch.cuda"] = setup(torch.cuda, "cuda")
    n = args.replays
    for g, eager, sync in cases.values():  # warm
        per_replay_ns(g.replay, max(1, n // 10), sync)
        per_replay_ns(eager, max(1, n // 10), sync)
    values = {}
    for _ in range(args.rounds):
        for name, (g, eager, sync) in cases.items():
            host, drained = per_replay_ns(g.replay, n, sync)
            values.setdefault(f"{name}: replay, host", []).append(host / 1e3)
            values.setdefault(f"{name}: replay, drained", []).append(drained / 1e3)
            host, drained = per_replay_ns(eager, n, sync)
            values.setdefault(f"{name}: eager sequence, host", []).append(host / 1e3)
            values.setdefault(f"{name}: eager sequence, drained", []).append(drained / 1e3)
    print(f"\n{args.ops} operators on {args.numel} float32, {n} replays per round, "
          f"{args.rounds} rounds (us per replay or per eager sequence, median [q1-q3])")
    for name, xs in values.items():
        print(f"  {name:40s} {benchlib.spread(xs)}")
    ratios = {}
    for kind in ("host", "drained"):
        ours = f"{args.backend}: replay, {kind}"
        ratios[f"{args.backend} replay / {args.backend} eager, {kind}"] = ratio(
            values, ours, f"{args.backend}: eager sequence, {kind}")
        if cuda:
            ratios[f"{args.backend} replay / torch.cuda replay, {kind}"] = ratio(
                values, ours, f"torch.cuda: replay, {kind}")
    for name, r in ratios.items():
        print(f"  {name}: {r:.3f}x")
    for g, _, _ in cases.values():
        g.reset()
    return {"values": summarize(values), "ratios": ratios}


# ------------------------------------------------------------------ self-check

def self_check():
    """What needs no device. Returns the number of failures."""
    failures = 0

    def expect(cond, what):
        nonlocal failures
        print(f"{'ok' if cond else 'FAILED'} {what}")
        failures += 0 if cond else 1

    args = parse_args([])
    expect((args.backend, args.ops, args.numel, args.replays, args.rounds)
           == ("cudart", 100, 1024, 200, 7), "the defaults: cudart, 100 operators on 1024")
    args = parse_args(["--backend", "ocl", "--ops", "9", "--numel", "16", "--json", "x.json"])
    expect((args.backend, args.ops, args.numel, args.json) == ("ocl", 9, 16, "x.json"),
           "the options parse")
    for bad in (["--ops", "0"], ["--rounds", "-1"], ["--numel", "x"]):
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                parse_args(bad)
            ok = False
        except SystemExit as e:
            ok = e.code == 2
        expect(ok, f"{' '.join(bad)} is refused")

    a, b, x = operands(1024, "cpu")
    ops = count_operators(sequence, x, a, b, 100)
    expect(len(ops) == 100 and set(ops) == {"mul", "add", "relu"},
           f"the sequence runs 100 operators, mul, add and relu (ran {len(ops)})")
    y = sequence(x, a, b, 100)
    expect(bool(torch.isfinite(y).all()) and float(y.abs().max()) < 1e3,
           "the sequence's values stay bounded")
    m = Elementwise(16)
    xs, ones = torch.randn(16), torch.ones(16)
    ops = count_operators(lambda v: m(v).backward(ones), xs)
    moves = {"copy_", "detach", "new_empty_strided", "empty_strided", "empty_like", "clone"}
    expect(set(ops) - moves == {"mul", "add"},
           f"the module's forward and backward compute with mul and add only ({sorted(set(ops))})")
    expect(torch.allclose(m.w.grad, xs * xs) and torch.allclose(m.b.grad, xs),
           "the module's gradients: dw = x * x, db = x")

    calls = []
    host, drained = per_replay_ns(lambda: calls.append(1), 5, lambda: calls.append("sync"))
    expect(calls.count(1) == 5 and calls.count("sync") == 2 and 0 <= host <= drained,
           "per_replay_ns: n calls between two synchronizes, host <= drained")
    values = {"o: replay, host": [1.0, 2.0, 3.0], "t: replay, host": [2.0, 4.0, 6.0]}
    expect(ratio(values, "o: replay, host", "t: replay, host") == 0.5, "ratio of medians")
    expect(summarize(values)["o: replay, host"]["median"] == 2.0, "summary's median")

    rc = subprocess.run(["bash", "-n", os.path.join(HERE, "gpu_check")]).returncode
    expect(rc == 0, "scripts/gpu_check parses (bash -n)")
    return failures


# ------------------------------------------------------------------ main

def main(argv=None):
    args = parse_args(argv)
    if args.self_check:
        return 1 if self_check() else 0
    try:
        importlib.import_module(f"torch_{args.backend}")
    except ImportError as e:
        print(f"gpu_check_graphs: torch_{args.backend} does not import ({e})")
        return 2
    mod = getattr(torch, args.backend)
    if mod.device_count() == 0:
        init = getattr(mod, "init_error", lambda: "")()
        print(f"gpu_check_graphs: no {args.backend} device{': ' + init if init else ''}")
        return 2
    device = torch.device(args.backend, 0)
    cuda = torch.cuda.is_available()
    print(benchlib.machine_line())
    print(f"{args.backend}: {mod.get_device_name(0)}; torch.cuda: "
          f"{torch.cuda.get_device_name(0) if cuda else 'not available (no comparison)'}")
    results = {"machine": benchlib.machine_line(), "backend": args.backend,
               "device": mod.get_device_name(0),
               "cuda": torch.cuda.get_device_name(0) if cuda else None,
               "ops": args.ops, "numel": args.numel}
    checks = Checks()
    checks.run("capture and replay equal eager", lambda: check_capture_replay(mod, device, args))
    checks.run("make_graphed_callables equals eager",
               lambda: check_graphed_callables(mod, device, args))
    figures = checks.run("replay time" + (" against torch.cuda.CUDAGraph" if cuda else ""),
                         lambda: time_replays(mod, device, args, cuda))
    results["figures"] = figures
    results["failed"] = checks.failed
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    print(f"\ngpu_check_graphs: {3 - len(checks.failed)} of 3 passed"
          + (f"; FAILED: {', '.join(checks.failed)}" if checks.failed else ""))
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
