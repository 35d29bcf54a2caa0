"""Device tensors between processes on cudart, over CUDA's IPC (examples/cudart: cudaIpc*),
through torch.multiprocessing with a spawned consumer, and the same on torch.cuda for
reference (run by scripts/gpu_check, which puts _build-gpu/python on PYTHONPATH):
  - both ways: the consumer reads a tensor the producer filled, adds 1 to it in place (the
    same memory: the producer reads the result) and sends back a tensor of its own;
  - an Event(interprocess=True) recorded behind the producer's fill, sent as ipc_handle(),
    opened in the consumer with Event.from_ipc_handle, its stream waiting on it before the read;
  - handoff: a --mib MiB float32 tensor, the time from put() to the consumer's first read
    (.item() of its last element), against tensor.cpu() -> queue -> .to(device) in the
    consumer; the median of --rounds rounds, the two taking turns.

usage: gpu_check_ipc.py [--rounds N] [--mib M] [--devices cudart,cuda] [--json PATH]
(exit status 1: a check failed)"""
import argparse
import json
import statistics
import sys
import time

import importlib

import torch
import torch.multiprocessing as mp


def load(device):
    """torch.<device>: PyTorch's own cuda, or an accelkit backend's module, imported."""
    if device != "cuda":
        importlib.import_module(f"torch_{device}")
    return getattr(torch, device)


def now():
    return time.clock_gettime(time.CLOCK_MONOTONIC)  # one clock for both processes


def consumer(device, inbox, outbox):
    try:
        serve(device, inbox, outbox)
    except Exception as e:  # told to the producer, which fails the check naming it
        outbox.put(("error", f"{type(e).__name__}: {e}"))


def serve(device, inbox, outbox):
    mod = load(device)
    kept = []  # what this process sent back lives until the producer is done with it
    while True:
        msg = inbox.get()
        kind = msg[0]
        if kind == "end":
            return
        if kind == "both":
            x, last = msg[1], msg[2]
            ok = x[-1].item() == last
            x.add_(1)
            mod.synchronize()
            kept.append(torch.full((1024,), 7.0, device=device))
            outbox.put((ok, kept[-1]))
        elif kind == "event":
            x, handle = msg[1], msg[2]
            event = mod.Event.from_ipc_handle(mod.current_device(), handle)
            mod.current_stream().wait_event(event)
            outbox.put(x.sum().item())
        elif kind == "handoff":
            outbox.put((msg[1].view(-1)[-1].item(), now()))
        elif kind == "cpu":
            outbox.put((msg[1].to(device).view(-1)[-1].item(), now()))


def run(device, rounds, mib):
    mod = load(device)
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=consumer, args=(device, inbox, outbox))
    p.start()
    out, failures = {}, []

    def answer(timeout=60):
        reply = outbox.get(timeout=timeout)
        if isinstance(reply, tuple) and reply and reply[0] == "error":
            raise RuntimeError(f"the {device} consumer: {reply[1]}")
        return reply

    try:
        x = torch.arange(1 << 18, dtype=torch.float32, device=device)
        inbox.put(("both", x, float((1 << 18) - 1)))
        ok, theirs = answer(120)  # the first answer waits for the consumer's start
        mod.synchronize()
        both = ok and torch.equal(x.cpu(), torch.arange(1 << 18, dtype=torch.float32) + 1) and \
            torch.equal(theirs.cpu(), torch.full((1024,), 7.0))
        del theirs
        if not both:
            failures.append(f"{device}: a tensor sent both ways did not read as written")

        y = torch.zeros(1 << 24, dtype=torch.float32, device=device)
        event = mod.Event(interprocess=True)
        for _ in range(20):  # work queued ahead of the fill, so the consumer's wait matters
            y.mul_(1.0)
        y.fill_(2.0)
        event.record()
        inbox.put(("event", y, event.ipc_handle()))
        total = answer()
        if total != 2.0 * (1 << 24):
            failures.append(f"{device}: the consumer waiting on the interprocess event read a "
                            f"sum of {total}, not {2.0 * (1 << 24)}")
        mod.synchronize()

        t = torch.empty(mib << 18, dtype=torch.float32, device=device)
        times = {"ipc": [], "cpu": []}
        for r in range(rounds):
            order = ("ipc", "cpu") if r % 2 == 0 else ("cpu", "ipc")
            for side in order:
                t.fill_(float(r + 1))
                mod.synchronize()
                t0 = now()
                inbox.put(("handoff", t) if side == "ipc" else ("cpu", t.cpu()))
                value, t1 = answer()
                if value != float(r + 1):
                    failures.append(f"{device}: handoff ({side}) read {value}, not {r + 1}")
                times[side].append((t1 - t0) * 1e3)
        out = {"both_ways": both, "event_ordered": total == 2.0 * (1 << 24),
               "handoff_ipc_ms": statistics.median(times["ipc"]),
               "handoff_cpu_ms": statistics.median(times["cpu"])}
        out["ratio"] = out["handoff_cpu_ms"] / out["handoff_ipc_ms"]
        print(f"{device}: both ways {'ok' if both else 'FAILED'}, event "
              f"{'ok' if out['event_ordered'] else 'FAILED'}; {mib} MiB handoff to the first "
              f"read: {out['handoff_ipc_ms']:.2f} ms through IPC, {out['handoff_cpu_ms']:.2f} ms "
              f"through the CPU ({out['ratio']:.1f}x), median of {rounds}")
        inbox.put(("end",))
        p.join(60)
    finally:
        if p.is_alive():
            p.kill()
    return out, failures


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--devices", default="cudart,cuda",
                    help="device types, in turn (any accelkit backend's: simdev on a machine "
                         "without a GPU)")
    ap.add_argument("--json")
    args = ap.parse_args()
    results, failures = {}, []
    for device in args.devices.split(","):
        try:
            results[device], failed = run(device, args.rounds, args.mib)
            failures += failed
        except Exception as e:
            failures.append(f"{device}: {type(e).__name__}: {e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    for f in failures:
        print("FAILED:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
