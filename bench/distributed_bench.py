"""torch.distributed on simdev (accelkit.distributed) against gloo on CPU
tensors, measured in the same run, 2 ranks (2 processes on this machine).

Prints the machine first, then for each memory mode (host-visible: gloo
works on the device memory in place; staged: SIMDEV_HOST_VISIBLE=0, through
pinned blocks) a process pair that measures:

- all_reduce (SUM, float32) bus bandwidth as nccl-tests define it
  (bytes x 2(n-1)/n / time) at 4 KiB, 1 MiB and 64 MiB: CPU tensors through
  gloo ("cpu"), simdev tensors through the backend's group on gloo
  ("simdev"), the same with the ranks' agreement check off (check_agreement
  = False, "unchecked"), and simdev tensors through the vendor collective
  slot, simdev's shared-memory all_reduce ("native", checked and unchecked);
  the slot is off for the other sides (pg.native = None);
- a training step of an MLP: plain on one device (no communication) against
  DistributedDataParallel over the two processes (the same per-rank batch).

Each row is measured in rounds, the sides taking turns within a round; a
row prints the median of its rounds for each side, their spread (min-max),
and the median of the per-round ratios to the CPU (or plain) side.

    PYTHONPATH=build/python python bench/distributed_bench.py [--rounds 7] [--quick]
"""
import argparse
import datetime
import os
import platform
import statistics
import sys
import tempfile
import time
from benchlib import cpu_model



SIZES = [(4 << 10, "4 KiB", 200), (1 << 20, "1 MiB", 20), (64 << 20, "64 MiB", 2)]


def _worker(rank, world, store_path, rounds, quick, queue):
    import torch
    import torch.distributed as dist

    import torch_simdev  # noqa: F401

    torch.set_num_threads(1)
    torch.simdev.set_device(rank)
    dev = torch.device("simdev", rank)
    dist.init_process_group("cpu:gloo,simdev:simdev", store=dist.FileStore(store_path, world),
                            rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    pg = dist.distributed_c10d._get_default_group()
    rows = []

    native = pg.native  # the vendor slot: simdev's shared-memory all_reduce, or None

    def timed(x, iters, check=True, slot=False):
        pg.check_agreement = check
        pg.native = native if slot else None
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        if x.device.type != "cpu":  # wait() made the stream wait: the last one ends here
            torch.accelerator.synchronize(x.device)
        return (time.perf_counter() - t0) / iters

    for nbytes, label, iters in SIZES:
        if quick:
            iters = max(1, iters // 10)
        n = nbytes // 4
        xc = torch.ones(n)
        xd = torch.ones(n, device=dev)
        timed(xc, 1), timed(xd, 1)  # warm-up (connections, pinned blocks)
        sides = {"cpu": [], "simdev": [], "simdev, unchecked": []}
        if native is not None:
            timed(xd, 1, slot=True)
            sides.update({"native": [], "native, unchecked": []})
        for _ in range(rounds):
            sides["cpu"].append(timed(xc, iters))
            sides["simdev"].append(timed(xd, iters))
            sides["simdev, unchecked"].append(timed(xd, iters, check=False))
            if native is not None:
                sides["native"].append(timed(xd, iters, slot=True))
                sides["native, unchecked"].append(timed(xd, iters, check=False, slot=True))
        pg.check_agreement, pg.native = True, native
        rows.append(("all_reduce", label, nbytes, sides))

    # DDP step against the plain step on one device
    torch.manual_seed(0)
    def mlp():
        return torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(),
                                   torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                                   torch.nn.Linear(1024, 10)).to(dev)
    plain = mlp()
    ddp = torch.nn.parallel.DistributedDataParallel(mlp())
    x = torch.randn(64, 256, device=dev)
    y = torch.randint(0, 10, (64,), device=dev)

    def steps(net, k):
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(k):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(x), y).backward()
            opt.step()
        torch.accelerator.synchronize(dev)
        return (time.perf_counter() - t0) / k

    k = 2 if quick else 5
    steps(plain, 1), steps(ddp, 1)
    sides = {"1 process (plain)": [], "2 processes (DDP)": []}
    for _ in range(rounds):
        sides["1 process (plain)"].append(steps(plain, k))
        sides["2 processes (DDP)"].append(steps(ddp, k))
    rows.append(("step", "MLP 256-1024-1024-10, batch 64/rank", 0, sides))
    if rank == 0:
        queue.put(rows)
    dist.destroy_process_group()


def _report(rows, mode):
    print(f"\n## {mode}")
    for kind, label, nbytes, sides in rows:
        names = list(sides)
        base = sides[names[0]]
        for name in names:
            vals = sides[name]
            ratios = [b / v for b, v in zip(base, vals)]
            if kind == "all_reduce":
                bw = [nbytes * 2 * (2 - 1) / 2 / v / 1e9 for v in vals]  # busbw, 2 ranks
                print(f"all_reduce {label:>7} {name:<18} busbw {statistics.median(bw):7.3f} GB/s "
                      f"({min(bw):.3f}-{max(bw):.3f}); {statistics.median(vals) * 1e6:10.1f} us; "
                      f"x{statistics.median(ratios):.2f} of cpu ({min(ratios):.2f}-{max(ratios):.2f})")
            else:
                ms = [v * 1e3 for v in vals]
                print(f"step {label}: {name:<18} {statistics.median(ms):8.2f} ms "
                      f"({min(ms):.2f}-{max(ms):.2f}); plain/this "
                      f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="one round, few iterations (smoke run)")
    ap.add_argument("--modes", default="1,0", help="SIMDEV_HOST_VISIBLE values to run")
    args = ap.parse_args()
    rounds = 1 if args.quick else args.rounds
    import multiprocessing
    print(f"cpu: {cpu_model()}, {len(os.sched_getaffinity(0))} usable CPUs; "
          f"{' '.join(platform.libc_ver()).strip()}; python {platform.python_version()}")
    print(f"2 ranks, 2 processes on this machine; {rounds} rounds; medians (min-max)")
    for visible in args.modes.split(","):
        os.environ["SIMDEV_HOST_VISIBLE"] = visible
        os.environ.setdefault("SIMDEV_DEVICE_COUNT", "2")
        os.environ.setdefault("SIMDEV_MEMORY_MB", "1024")
        ctx = multiprocessing.get_context("spawn")
        queue = ctx.Queue()
        with tempfile.TemporaryDirectory() as d:
            store = os.path.join(d, "store")
            procs = [ctx.Process(target=_worker, args=(r, 2, store, rounds, args.quick, queue))
                     for r in range(2)]
            for p in procs:
                p.start()
            rows = queue.get(timeout=1800)
            for p in procs:
                p.join()
        _report(rows, "host-visible device memory (zero-copy)" if visible == "1"
                else "not host-visible (staged through pinned memory)")
    print("\ndistributed bench: done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
