"""A device tensor handed from one process to another through a
torch.multiprocessing queue (docs/ipc.md) against a copy through the CPU,
measured in the same run, and what 1,000 small tensors sent and released
leave behind.

Prints the machine first, then:

- handoff: a float32 tensor of --mib MiB (default 256), refilled before each
  round, put on a queue by this process; the time from put() to the first
  read in a spawned consumer (its last element, .item()). "ipc": the tensor
  as is (the consumer maps this process's memory and its stream waits for
  the producer's event); "through the CPU": tensor.cpu() -> queue ->
  .to(device) in the consumer. The sides take turns within each round,
  in reverse order every other round (Note [Rounds and spread] in
  bench/simdev_bench.py): median [interquartile range]; the ratio is the
  median of the per-round ratios. The consumer drops what it received
  each round, so each "ipc" round opens the memory anew. Bytes copied: by
  construction (device to host, into shared memory, host to device), and
  the driver's count of copies in both processes while the handoffs ran
  (simdev's counter; not counting the copy of 4 bytes each first read makes).
- 1,000 small tensors (64 floats each) sent one by one through a pipe, held
  by the consumer, then released: per process, the live sent entries and
  opened segments (memory._ipc_state()), open file descriptors, and device
  memory (allocated; reserved after empty_cache; the driver's free bytes),
  at the start, while held, and after the release (and ipc_collect).

    PYTHONPATH=build/python python bench/ipc_bench.py [--rounds 9] [--mib 256] [--quick]
"""
import argparse
import gc
import os
import statistics
import time

from benchlib import machine_line, quartiles

BACKEND = "simdev"


def _now():
    return time.clock_gettime(time.CLOCK_MONOTONIC)  # one clock for both processes


def _fds():
    return len(os.listdir("/proc/self/fd"))


def _resources(torch, mod):
    gc.collect()
    torch.accelerator.synchronize(0)
    state = mod.memory._ipc_state()
    return {"sent": state["sent"], "opened": state["opened"], "ref_files": state["ref_files"],
            "fds": _fds(), "allocated": mod.memory_allocated(0)}


def _copies(torch):
    return torch.ops.simdev_driver.copies() if hasattr(torch.ops, "simdev_driver") else -1


def _consumer(data, replies, conn):
    import torch
    import torch_simdev  # noqa: F401

    torch.set_num_threads(1)
    mod = getattr(torch, BACKEND)
    dev = torch.device(BACKEND, 0)
    while True:
        kind, payload = data.get()
        if kind == "stop":
            return
        if kind == "ipc":
            value = payload[-1].item()
            t1 = _now()
        elif kind == "cpu":
            moved = payload.to(dev)
            value = moved[-1].item()
            t1 = _now()
            del moved
        elif kind == "state":
            replies.put(_resources(torch, mod))
            continue
        elif kind == "many":
            got = [conn.recv() for _ in range(payload)]
            bad = sum(1 for i, t in enumerate(got) if t[0].item() != float(i))
            holding = _resources(torch, mod)
            del got
            replies.put((bad, holding, _resources(torch, mod)))
            continue
        del payload
        replies.put((t1, value, _copies(torch)))


def _handoff(torch, mod, data, replies, x, rounds):
    last = {"consumer": None}
    copies = {"ipc": 0, "cpu": 0}

    def handoff(name, r):
        x.fill_(float(r))
        torch.accelerator.synchronize(0)
        mine = _copies(torch)
        t0 = _now()
        host = x.cpu() if name == "cpu" else x
        data.put((name, host))
        t1, value, theirs = replies.get(timeout=300)
        assert value == float(r), (value, r)
        del host
        if last["consumer"] is not None:  # the consumer's read of one element: not the handoff's
            copies[name] += (_copies(torch) - mine) + (theirs - last["consumer"] - 1)
        last["consumer"] = theirs
        return t1 - t0

    def ipc(r):
        return handoff("ipc", r)

    def cpu(r):
        return handoff("cpu", r)

    ipc(-1), cpu(-1)  # warm-up: the consumer's first allocation, the queue's thread
    copies.update(ipc=0, cpu=0)
    sides = {"ipc": [], "cpu": []}
    for r in range(rounds):
        for name in (("ipc", "cpu") if r % 2 == 0 else ("cpu", "ipc")):
            sides[name].append((ipc if name == "ipc" else cpu)(r))
        mod.ipc_collect()
    return sides, copies


def _ms(xs):
    q1, q3 = quartiles([v * 1e3 for v in xs])
    return f"{statistics.median(xs) * 1e3:.2f} ms [{q1:.2f}-{q3:.2f}]"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--small", type=int, default=1000, help="small tensors sent and released")
    ap.add_argument("--quick", action="store_true", help="tiny sizes: proves the bench runs")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.mib, args.small = 1, 4, 50

    import torch
    import torch.multiprocessing as mp
    import torch_simdev  # noqa: F401

    torch.set_num_threads(1)
    mod = getattr(torch, BACKEND)
    dev = torch.device(BACKEND, 0)
    print(machine_line())
    ctx = mp.get_context("spawn")
    data, replies = ctx.Queue(), ctx.Queue()
    conn, child_conn = ctx.Pipe()
    proc = ctx.Process(target=_consumer, args=(data, replies, child_conn), daemon=True)
    proc.start()
    child_conn.close()
    try:
        n = args.mib << 18  # float32 elements
        x = torch.empty(n, device=dev)
        sides, copies = _handoff(torch, mod, data, replies, x, args.rounds)
        ratios = [c / i for c, i in zip(sides["cpu"], sides["ipc"])]
        print(f"\nhandoff of a {args.mib} MiB tensor through a queue, put() to the consumer's "
              f"first read, {args.rounds} rounds:")
        print(f"  ipc:             {_ms(sides['ipc'])}; bytes copied: 0")
        print(f"  through the CPU: {_ms(sides['cpu'])}; bytes copied: {3 * args.mib} MiB "
              f"(device to host, into shared memory, host to device)")
        q1, q3 = quartiles(ratios)
        print(f"  ratio (through the CPU / ipc): {statistics.median(ratios):.1f}x "
              f"[{q1:.1f}-{q3:.1f}]")
        print(f"  driver copies per handoff, both processes (the first read's own copy of 4 "
              f"bytes not counted): ipc {copies['ipc'] / args.rounds:g}, through the CPU "
              f"{copies['cpu'] / args.rounds:g}")
        del x
        mod.ipc_collect()

        # 1,000 small tensors.
        warm = torch.ones(64, device=dev)  # what the first send opens and keeps (a ref file)
        data.put(("ipc", warm))
        replies.get(timeout=300)
        del warm
        mod.ipc_collect()
        mod.empty_cache()
        start = _resources(torch, mod)
        start["reserved"] = mod.memory_reserved(0)
        start["driver_free"] = mod.mem_get_info(0)[0]
        data.put(("state", None))
        c_start = replies.get(timeout=300)
        sent = [torch.full((64,), float(i), device=dev) for i in range(args.small)]
        t0 = _now()
        data.put(("many", args.small))
        for t in sent:
            conn.send(t)
        del t
        bad, c_holding, c_end = replies.get(timeout=600)
        elapsed = _now() - t0
        holding = _resources(torch, mod)
        del sent
        mod.ipc_collect()
        end = _resources(torch, mod)
        mod.empty_cache()
        end["reserved"] = mod.memory_reserved(0)
        end["driver_free"] = mod.mem_get_info(0)[0]
        holding["reserved"] = holding["driver_free"] = None
        print(f"\n{args.small} small tensors (64 floats) sent one by one through a pipe and held "
              f"by the consumer ({elapsed * 1e3 / args.small:.2f} ms per tensor, {bad} wrong "
              f"values), then released:")
        print(f"  {'':34} {'start':>12} {'held':>12} {'released':>12}")
        for key in ("sent", "opened", "ref_files", "fds", "allocated", "reserved", "driver_free"):
            row = [start[key], holding[key], end[key]]
            print(f"  producer {key:<25} " + " ".join(f"{'-' if v is None else v:>12}" for v in row))
        for key in ("sent", "opened", "ref_files", "fds", "allocated"):
            row = [c_start[key], c_holding[key], c_end[key]]
            print(f"  consumer {key:<25} " + " ".join(f"{v:>12}" for v in row))
        back = all(start[k] == end[k] for k in start) and all(c_start[k] == c_end[k]
                                                              for k in c_start)
        print(f"  back to the start in both processes: {'yes' if back else 'NO'}")
    finally:
        data.put(("stop", None))
        proc.join(timeout=60)
        if proc.is_alive():
            proc.kill()


if __name__ == "__main__":
    main()
