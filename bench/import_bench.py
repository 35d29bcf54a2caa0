"""`import torch` with and without an installed backend autoloaded: the wall
time of a fresh interpreter that runs `import torch`, with
TORCH_DEVICE_BACKEND_AUTOLOAD=0 (the baseline) and =1, and of
`import torch, torch_<name>` with autoload off (the backend imported by hand),
in interleaved rounds; prints median, spread (min-max and interquartile) and
the ratio to the baseline, with the CPU model; then the backend's own import
timed inside the process, which the difference of process times (noisy:
hundreds of ms between runs on a loaded machine) hides.

    .venv/bin/python bench/import_bench.py                   # simdev, installed by scripts/setup.sh
    python bench/import_bench.py --rounds 5 --name vendor    # quick
    python bench/import_bench.py --pythonpath A:B --no-site  # a view of an environment

It asserts nothing about times (Note: benchmarks print figures)."""
import argparse
import os
import platform
import statistics
import subprocess
import sys
import time

from benchlib import cpu_model, quartiles




def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", default="simdev")
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--pythonpath", help="PYTHONPATH for the children")
    ap.add_argument("--no-site", action="store_true", help="run the children with -S")
    args = ap.parse_args()

    env = {k: v for k, v in os.environ.items() if k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    if args.pythonpath is not None:
        env["PYTHONPATH"] = args.pythonpath
    flags = ["-S"] if args.no_site else []
    package = f"torch_{args.name}"
    check = (f"import torch, sys; assert hasattr(torch, {args.name!r}) == {{}}, "
             f"'autoload did not do what was asked'")
    cases = {
        "import torch (autoload off)": ("0", check.format(False)),
        f"import torch (autoload on: {args.name})": ("1", check.format(True)),
        f"import torch, {package} (autoload off)": ("0", f"import torch, {package}"),
    }
    times = {case: [] for case in cases}
    for case, (autoload, code) in cases.items():  # warm the page cache
        subprocess.run([args.python, *flags, "-c", code], env=dict(env, TORCH_DEVICE_BACKEND_AUTOLOAD=autoload),
                       check=True)
    for _ in range(args.rounds):
        for case, (autoload, code) in cases.items():
            t0 = time.perf_counter()
            subprocess.run([args.python, *flags, "-c", code],
                           env=dict(env, TORCH_DEVICE_BACKEND_AUTOLOAD=autoload), check=True)
            times[case].append(time.perf_counter() - t0)

    # The backend's own share, timed inside the process (less noisy than the
    # difference of two process times): importing the package after torch.
    inner = []
    code = (f"import time, torch; t = time.perf_counter(); import {package}; "
            "print(time.perf_counter() - t)")
    for _ in range(args.rounds):
        out = subprocess.run([args.python, *flags, "-c", code], env=dict(env, TORCH_DEVICE_BACKEND_AUTOLOAD="0"),
                             check=True, capture_output=True, text=True).stdout
        inner.append(float(out))

    import torch  # noqa: E402  (the version, in this interpreter)
    print(f"import_bench: {cpu_model()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"torch {torch.__version__}, {args.rounds} interleaved rounds")
    base = statistics.median(times[next(iter(cases))])
    for case, xs in times.items():
        med = statistics.median(xs)
        q1, q3 = quartiles(xs, method="exclusive")
        print(f"  {case:<44} median {med * 1e3:7.1f} ms  min-max {min(xs) * 1e3:7.1f}-{max(xs) * 1e3:7.1f}"
              f"  IQR {q1 * 1e3:7.1f}-{q3 * 1e3:7.1f}  ({med / base:.3f}x)")
    med = statistics.median(inner)
    q1, q3 = quartiles(inner, method="exclusive")
    print(f"  {'import ' + package + ' after torch, in-process':<44} median {med * 1e3:7.1f} ms"
          f"  min-max {min(inner) * 1e3:7.1f}-{max(inner) * 1e3:7.1f}  IQR {q1 * 1e3:7.1f}-{q3 * 1e3:7.1f}"
          f"  ({med / base:.1%} of the baseline's median)")


if __name__ == "__main__":
    main()
