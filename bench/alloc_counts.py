#!/usr/bin/env python3
"""Instructions, mispredicted branches and cache misses per free and
allocation, for accelkit's device allocator and the naive pool, counted by
callgrind (its cache and branch simulation) on memory_bench's own workloads:
figures that do not depend on the machine's load, as wall time does.

  bench/alloc_counts.py [--bench build/bench/memory_bench]

Workloads: the hit path (one block freed and taken again: 4 KiB, a small
block, and 16 MiB, a block with a record) and the random allocations of
memory_bench (sizes uniform in [1 B, 64 KiB]) at N = 1e3 and 1e5 live
blocks, each counted over 20,000 pairs after 100,000 to reach a steady
state (the hit path after 1,000). Needs valgrind (Debian package valgrind).
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

EVENTS = {
    'Ir': 'instructions',
    'Bcm': 'mispredicted conditional branches',
    'Bim': 'mispredicted indirect branches',
    'D1mr': 'L1 data read misses',
    'D1mw': 'L1 data write misses',
    'DLmr': 'last-level read misses',
    'DLmw': 'last-level write misses',
}


def counts(bench, which, live, warm, pairs, size=None):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, 'callgrind.out')
        cmd = ['valgrind', '--tool=callgrind', '--cache-sim=yes', '--branch-sim=yes',
               '--collect-atstart=no', '--toggle-collect=*measured_pairs*',
               f'--callgrind-out-file={out}', bench, '--pairs', which, str(live), str(warm),
               str(pairs)] + ([str(size)] if size else [])
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        events, values = None, None
        with open(out) as f:
            for line in f:
                if line.startswith('events:'):
                    events = line.split()[1:]
                elif line.startswith('summary:'):
                    values = [int(v) for v in line.split()[1:]]
    got = dict(zip(events, values))
    return {k: got.get(k, 0) / pairs for k in EVENTS}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--bench', default='build/bench/memory_bench')
    ap.add_argument('--pairs', type=int, default=20000)
    ap.add_argument('--warmup', type=int, default=100000)
    a = ap.parse_args()
    if not os.access(a.bench, os.X_OK):
        sys.exit(f'alloc_counts: no memory_bench at {a.bench!r} (build it, or give --bench)')
    if not shutil.which('valgrind'):
        sys.exit('alloc_counts: needs valgrind (apt-get install valgrind)')
    print(benchlib.machine_line())
    print('callgrind per free and allocation (its simulated caches are this machine\'s)')
    workloads = [('hit path, 4 KiB', 1, 4096), ('hit path, 16 MiB', 1, 16 << 20),
                 ('random, N = 1e3', 1000, None), ('random, N = 1e5', 100000, None)]
    for title, live, size in workloads:
        warm = a.warmup if size is None else 1000
        acc = counts(a.bench, 'accelkit', live, warm, a.pairs, size)
        nv = counts(a.bench, 'naive', live, warm, a.pairs, size)
        print(f'\n== {title} ==')
        print(f'{"":36} {"accelkit":>10} {"naive pool":>11} {"accelkit/naive":>15}')
        for k, name in EVENTS.items():
            ratio = f'{acc[k] / nv[k]:.2f}x' if nv[k] >= 0.05 else '-'
            print(f'{name:36} {acc[k]:10.2f} {nv[k]:11.2f} {ratio:>15}')


if __name__ == '__main__':
    main()
