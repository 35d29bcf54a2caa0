"""The fault sweep: every runtime member fails at each of its first calls in a
fixed workload run through PyTorch, now (the call throws) and later (its
queued work fails, the error arriving at a later call); each case must end
with a clear error naming the backend or a correct result, never a crash or
a hang, and the same process must then compute correct results with the
allocator's statistics and the driver's memory back at their baseline.

    python fault_sweep.py [--calls N] [--jobs J] [--timeout S]
                          [--memory both|visible|hidden|mapped|expandable|all]

Each case is a process of its own (a crash or a hang is that case's
failure, not the sweep's), with SIMDEV_INJECT_FAULT=member@n[:async] from
its start, so that the calls that set the backend up (discovery, streams,
pools) are swept too. The cases are forked from this process once it has
imported torch (without the backend: autoloading is off, and the child
imports torch_simdev itself), so that each pays for loading the backend,
not for importing torch: that import was most of a case's time. It runs
the workload (tensors on two devices, copies both ways including
non-blocking pinned ones, operators on a side stream, streams and events, a
wait across devices, a host signal, graphs, a training step, empty_cache),
compares every result with the same workload on the CPU, runs it again with
the fault gone, then empties the caches and compares the allocator's
statistics, the driver's device bytes and pinned blocks with a reference
process that ran without a fault. The members come from the contract's own
list (torch.ops.simdev.runtime_members). Prints a table and exits non-zero
on any failure.

The graphs are three captures on a side stream of work simdev records
without its native kernels (pinned copies both ways, device copies, a
memset, a fill, an allocation from the graph's pool): through
torch.accelerator.Graph, through torch.simdev.graph, and with keep_graph
(instantiated at the first replay); each replayed twice with its inputs
changed in place between replays, compared with the CPU, and reset (its
pool given back) before the statistics are compared. So each graph member
that the SDK calls is reached at calls 1 to 3 (graph_launch at 1 to 6,
now and, its first captured work failing when it runs, later);
the runtime's stream_is_capturing is not (the SDK answers whether a stream
captures from its own registry of captures): its cases are "unreached".
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

CHILD = r'''
import json, os, sys
import torch, torch_simdev

member = sys.argv[1]  # its fault comes from SIMDEV_INJECT_FAULT; "" for the reference run
driver = torch.ops.simdev_driver


def emit(**row):
    print("ROW " + json.dumps(row), flush=True)


def run(dev0, dev1, a, w):
    """The workload on two devices (or twice on the CPU, for the expected values)."""
    on = lambda t, d: t.to(d) if d != "cpu" else t.clone()
    x0 = on(a, dev0)
    x1 = x0.to(dev1)                                  # between devices
    if dev0 != "cpu":
        pinned = a.pin_memory()
        side = torch.Stream(device=dev0)
        main = torch.accelerator.current_stream(0)
        side.wait_stream(main)
        start = torch.Event(enable_timing=True)
        start.record(side)
        with torch.simdev.stream(side):
            y = pinned.to(dev0, non_blocking=True)    # pinned, in flight
            z = (y * 2 + 1).relu()                    # operators on a side stream
            done = torch.Event(enable_timing=True)
            done.record(side)
        side.query()
        done.synchronize()
        assert start.elapsed_time(done) >= 0
        main.wait_event(done)
        torch.Stream(device=dev1).wait_stream(side)   # across devices
        z.record_stream(main)
        out = torch.empty(64, 64).pin_memory()
        out.copy_(z, non_blocking=True)               # device -> pinned, in flight
        host_signal(side)
    else:
        out = (a * 2 + 1).relu()
    replays = graphs(dev0, a)                         # captured, replayed, reset
    zeros = torch.zeros(4096, device=dev0)            # a fill
    big = torch.empty(3 << 20, device=dev0)           # a segment of its own
    big.fill_(1.0)
    total = (x0.sum() + zeros.sum() + big[:16].sum()).cpu()
    del big, zeros
    wt = on(w, dev1).requires_grad_(True)             # a training step on the second device
    loss = (x1 @ wt.t()).square().mean()
    loss.backward()
    with torch.no_grad():
        wt -= 0.1 * wt.grad
    if dev0 != "cpu":
        assert torch.simdev.get_device_properties(1)["name"]
        torch.accelerator.synchronize(0)
        torch.accelerator.synchronize(1)
    return {"z": out.clone(), "x1": x1.cpu(), "loss": loss.detach().cpu(),
            "w": wt.detach().cpu(), "sum": total, "graphs": replays}


def graph_inputs(a, r, i):
    """The inputs of replay i of graph r: a pinned host one and a device one."""
    flat = a.flatten()[:1024]
    return flat * (i + 1) + r, flat.flip(0) - i


def graphs(dev, a):
    """Three graphs captured on a side stream of `dev`, of the work simdev
    captures without its native kernels: a pinned copy in, a device copy
    into the graph's pool, a memset, a fill, a device copy from another
    input, a pinned copy out. The first through torch.accelerator.Graph,
    the second through torch.simdev.graph, the third with keep_graph
    (instantiated at its first replay); each replayed twice with its inputs
    changed in place between replays, then reset (its pool given back).
    Returns the six replays' outputs (on the CPU: what they must be)."""
    outs = []
    if dev == "cpu":
        for r in range(3):
            for i in range(2):
                hin, other = graph_inputs(a, r, i)
                t = hin.clone()
                t[:256] = 0
                t[256:512] = r + 0.5
                t[768:] = other[768:]
                outs.append(t)
        return torch.stack(outs)
    side = torch.Stream(device=dev)
    for r in range(3):
        hin = torch.zeros(1024).pin_memory()
        hout = torch.zeros(1024).pin_memory()
        src = torch.zeros(1024, device=dev)
        other = torch.zeros(1024, device=dev)
        g = torch.simdev.Graph() if r == 1 else torch.accelerator.Graph(keep_graph=r == 2)
        def record():
            src.copy_(hin, non_blocking=True)          # pinned -> device
            static = src.clone()                       # from the graph's pool
            static[:256].zero_()                       # a memset
            static[256:512].fill_(r + 0.5)             # a fill
            static[768:].copy_(other[768:])            # device -> device
            hout.copy_(static, non_blocking=True)      # device -> pinned
            return static                              # the graph's output

        # Plain with statements: an exception raised in contextlib.ExitStack's
        # __exit__ is in a reference cycle with its frame, which would keep
        # this workload's tensors alive past the statistics' comparison.
        try:
            if r == 1:
                with torch.simdev.graph(g, stream=side):
                    static = record()
            else:
                with side, g:
                    static = record()
            assert hout.abs().sum().item() == 0       # recorded, not run
            for i in range(2):
                new_hin, new_other = graph_inputs(a, r, i)
                hin.copy_(new_hin)                     # the static inputs, in place
                other.copy_(new_other)
                g.replay()
                torch.accelerator.synchronize(0)
                outs.append(hout.clone())
        finally:
            g.reset()
    return torch.stack(outs)


def host_signal(stream):
    """A host signal the stream waits for, completed by the host (Note [Host
    signals]); completed and destroyed whatever fails, as accelkit.distributed
    does, so that no stream waits forever: a failed completion is tried once
    more (a driver's failure there would leave the stream stuck)."""
    ops = torch.ops.simdev
    sig = ops.signal_create(0)
    try:
        ops.stream_wait_signal(stream, sig)
    finally:
        try:
            ops.signal_complete(0, sig, 0)
        except Exception:
            ops.signal_complete(0, sig, 0)
            raise
        finally:
            ops.signal_destroy(0, sig)


def workload():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(64, 64, generator=g)
    w = torch.randn(8, 64, generator=g) * 0.1
    want = run("cpu", "cpu", a, w)
    got = run("simdev:0", "simdev:1", a, w)
    torch.simdev.empty_cache()                        # every device tensor of run() is gone
    torch.ops.simdev.host_empty_cache()
    return all(torch.allclose(got[k], want[k], rtol=1e-5, atol=1e-6) for k in want)


def level():
    torch.accelerator.synchronize(0)
    torch.accelerator.synchronize(1)
    torch.simdev.empty_cache()
    torch.ops.simdev.host_empty_cache()
    return {"allocated": [torch.simdev.memory_allocated(d) for d in range(2)],
            "reserved": [torch.simdev.memory_reserved(d) for d in range(2)],
            "driver": [driver.bytes_in_use(d) for d in range(2)],
            "pinned": driver.pinned_blocks()}


def clear(e):
    return isinstance(e, (RuntimeError, ValueError, IndexError)) and "simdev" in str(e)


def attempt():
    # ('correct'|'wrong'|'error'|'unclear', message)
    try:
        ok = workload()
        torch.accelerator.synchronize(0)
        torch.accelerator.synchronize(1)
    except Exception as e:  # noqa: BLE001
        return ("error" if clear(e) else "unclear", f"{type(e).__name__}: {str(e).splitlines()[0]}")
    return ("correct" if ok else "wrong", "")


def finish(**row):
    emit(**row)
    # Leave at once: at interpreter teardown PyTorch's autograd device threads
    # can abort the process while they take the GIL (a CPython/PyTorch exit
    # race, not the case's outcome).
    sys.stdout.flush()
    os._exit(0)


outcome, message = attempt()
if outcome == "correct" and member and driver.fault_pending(member):
    outcome = "unreached"  # the workload makes fewer than n such calls
driver.clear_faults()
recovered = attempt()[0] == "correct"
try:
    lv = level()
except Exception as e:  # noqa: BLE001
    lv = f"{type(e).__name__}: {e}"
finish(outcome=outcome, message=message, recovered=recovered, level=lv)
'''

ASYNC = {"memcpy_async", "memset_async", "memcpy_peer_async", "event_record", "stream_wait_event",
         "stream_wait_peer_event", "stream_wait_signal", "graph_launch"}
# Called only for memory the host reaches through maps (SIMDEV_HOST_VISIBLE=
# mapped): swept in the mapped mode only (--memory mapped or all), and there
# alone, since every other member is swept by the visible and hidden modes
# (the default, both, leaves the mapped mode out: it keeps CTest's run short).
MAPPED_ONLY = {"host_map", "host_unmap"}
# Called only by the caching allocator's expandable segments (Note [Virtual
# memory]): swept in the expandable mode alone (SIMDEV_HOST_VISIBLE=1 and
# SIMDEV_ALLOC_CONF=expandable_segments:True), which the default, both,
# includes for these members only; its large tensor (`big`) grows a segment
# and empty_cache unmaps it.
EXPANDABLE_ONLY = {"vm_granularity", "vm_reserve", "vm_release", "vm_create", "vm_destroy",
                   "vm_map", "vm_unmap"}
MODE_NAMES = {"1": "visible", "0": "hidden", "mapped": "mapped", "expandable": "expand"}
# Discovery runs once per process (as CUDA's): after device_count failed the
# process has no devices, by design; the case must end with a clear error.
NO_RECOVERY = {"device_count"}


def members(env):
    out = subprocess.run([sys.executable, "-c", "import torch, torch_simdev; "
                          "print('\\n'.join(torch.ops.simdev.runtime_members()))"],
                         capture_output=True, text=True, env=env, check=True)
    return out.stdout.split()


# What every case's process sees, set in this process before torch is
# imported (torch reads some of them at import).
CASE_ENV = {"SIMDEV_DEVICE_COUNT": "2", "SIMDEV_MEMORY_MB": "256", "OMP_NUM_THREADS": "1",
            "PYTHONWARNINGS": "ignore", "TORCH_CPP_LOG_LEVEL": "ERROR",
            "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
CASE_UNSET = ("SIMDEV_INJECT_FAULT", "SIMDEV_VISIBLE_DEVICES", "SIMDEV_ALLOC_CONF",
              "SIMDEV_NO_MEMORY_CACHING")


class Case:
    """One case's process, forked from this one: the workload with `fault`
    injected from the start (None: the reference run), then again without it."""

    def __init__(self, key, member, fault, visible, timeout, folder):
        self.key, self.timeout = key, timeout
        self.out = os.path.join(folder, f"{len(os.listdir(folder))}.out")
        fd = os.open(self.out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        self.start = time.monotonic()
        sys.stdout.flush()
        sys.stderr.flush()
        self.pid = os.fork()
        if self.pid == 0:  # the case: never returns
            try:
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                if visible == "expandable":
                    os.environ["SIMDEV_HOST_VISIBLE"] = "1"
                    os.environ["SIMDEV_ALLOC_CONF"] = "expandable_segments:True"
                else:
                    os.environ["SIMDEV_HOST_VISIBLE"] = visible
                if fault:
                    os.environ["SIMDEV_INJECT_FAULT"] = fault
                import warnings
                warnings.simplefilter("ignore")
                sys.argv = ["case", member]
                exec(compile(CHILD, "<fault sweep case>", "exec"), {"__name__": "__main__"})
                os._exit(0)
            except BaseException:  # noqa: BLE001
                import traceback
                traceback.print_exc()
                sys.stderr.flush()
                os._exit(1)
        os.close(fd)

    def poll(self):
        """The case's row once its process has ended (killed past its
        timeout: a hang), else None."""
        pid, status = os.waitpid(self.pid, os.WNOHANG)
        if pid == 0:
            if time.monotonic() - self.start < self.timeout:
                return None
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
            return {"outcome": "hang", "message": f"no result in {self.timeout:.0f} s",
                    "recovered": False, "level": None}
        with open(self.out) as f:
            text = f.read()
        rows = [json.loads(l[4:]) for l in text.splitlines() if l.startswith("ROW ")]
        code = os.waitstatus_to_exitcode(status)
        if code == 0 and rows:
            return rows[-1]
        lines = [l for l in text.splitlines() if not l.startswith("ROW ")]
        last = (lines or [f"exit status {code}"])[-1].strip()
        return {"outcome": "crash", "message": last[:200], "recovered": False, "level": None}


def run_cases(cases, jobs, timeout):
    """Runs `cases` ((key, member, fault, visible) each), `jobs` at a time,
    from this one thread (forking from one thread only is safe). Returns
    {key: row}."""
    results, running, todo = {}, [], list(cases)
    with tempfile.TemporaryDirectory(prefix="fault_sweep_") as folder:
        while todo or running:
            while todo and len(running) < jobs:
                key, member, fault, visible = todo.pop(0)
                running.append(Case(key, member, fault, visible, timeout, folder))
            for c in list(running):
                row = c.poll()
                if row is not None:
                    results[c.key] = row
                    running.remove(c)
            time.sleep(0.01)
    return results


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=3, help="faults at calls 1..N of each member")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--memory",
                    choices=["both", "visible", "hidden", "mapped", "expandable", "all"],
                    default="both",
                    help="device memory the host may touch (host kernels, zero-copy fallback), "
                         "or not (copying paths), or only between host_map and host_unmap "
                         "(mapped: the map members only), or visible memory in expandable "
                         "segments (the vm members only); both = visible, hidden and "
                         "expandable")
    args = ap.parse_args()
    env = {**os.environ, **CASE_ENV}
    for k in CASE_UNSET:
        env.pop(k, None)
    every = members(env)
    names = [m for m in every if m not in MAPPED_ONLY | EXPANDABLE_ONLY]
    mapped_names = [m for m in every if m in MAPPED_ONLY]
    expandable_names = [m for m in every if m in EXPANDABLE_ONLY]
    os.environ.update(CASE_ENV)
    for k in CASE_UNSET:
        os.environ.pop(k, None)
    import torch  # noqa: F401  (for the cases: see run_cases)
    modes = {"both": ["1", "0", "expandable"], "visible": ["1"], "hidden": ["0"],
             "mapped": ["mapped"], "expandable": ["expandable"],
             "all": ["1", "0", "mapped", "expandable"]}[args.memory]

    def kinds_of(v):
        ms = {"mapped": mapped_names, "expandable": expandable_names}.get(v, names)
        return [(m, False) for m in ms] + [(m, True) for m in ms if m in ASYNC]
    cases = [(("reference", v), "", None, v) for v in modes]
    for v in modes:
        for m, a in kinds_of(v):
            for n in range(1, args.calls + 1):
                cases.append(((v, a, m, n), m, f"{m}@{n}" + (":async" if a else ""), v))
    t0 = time.monotonic()
    results = run_cases(cases, args.jobs, args.timeout)
    reference = {v: results.pop(("reference", v)) for v in modes}

    failures = []
    for v, ref in reference.items():
        if ref["outcome"] != "correct" or not ref["recovered"]:
            failures.append(f"reference run (memory {v}): {ref['outcome']} {ref['message']}")
    header = (f"{'memory':<8}{'member':<24}{'fault':<7}{'cases':>6}{'errors':>8}{'correct':>9}"
              f"{'unreached':>11}{'recovered':>11}{'leaks':>7}  failures")
    print(header)
    print("-" * len(header))
    totals = dict.fromkeys(["cases", "errors", "correct", "unreached", "recovered", "leaks",
                            "failures"], 0)
    passed = 0
    for v in modes:
        memory = MODE_NAMES[v]
        for m, a in kinds_of(v):
            kind = "later" if a else "now"
            c = dict.fromkeys(["cases", "errors", "correct", "unreached", "recovered", "leaks"], 0)
            bad = 0
            for n in range(1, args.calls + 1):
                r = results[(v, a, m, n)]
                problems = []
                c["cases"] += 1
                if r["outcome"] in ("error", "correct", "unreached"):
                    c[{"error": "errors"}.get(r["outcome"], r["outcome"])] += 1
                else:
                    problems.append(f"{r['outcome']}: {r['message']}")
                if r["recovered"]:
                    c["recovered"] += 1
                elif m not in NO_RECOVERY and not problems:
                    problems.append("did not recover")
                if r["level"] is not None and r["level"] != reference[v]["level"] and m not in NO_RECOVERY:
                    c["leaks"] += 1
                    problems.append(f"leak: {r['level']} (reference {reference[v]['level']})")
                if problems:
                    bad += 1
                    failures += [f"{m}@{n}{':async' if a else ''} (memory {memory}): {p}"
                                 for p in problems]
                else:
                    passed += 1
            for k in c:
                totals[k] += c[k]
            totals["failures"] += bad
            print(f"{memory:<8}{m:<24}{kind:<7}{c['cases']:>6}{c['errors']:>8}{c['correct']:>9}"
                  f"{c['unreached']:>11}{c['recovered']:>11}{c['leaks']:>7}  {bad}")
    print("-" * len(header))
    print(f"{'total':<39}{totals['cases']:>6}{totals['errors']:>8}{totals['correct']:>9}"
          f"{totals['unreached']:>11}{totals['recovered']:>11}{totals['leaks']:>7}  "
          f"{totals['failures']}")
    print(f"{len(cases)} processes, {time.monotonic() - t0:.0f} s; errors: a clear "
          "error naming the backend; unreached: the workload makes fewer calls of that member")
    for f in failures:
        print("FAIL", f)
    print(f"fault sweep: {passed} passed, {totals['cases'] - passed} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
