"""python -m accelkit.testing --device NAME ...: see accelkit/testing/__init__.py.
From a backend's package (torch_<name>._accelkit.testing, or torch_<name>.testing
which calls main), --device defaults to that backend."""
import argparse
import os
import sys


def package_backend():
    """The backend whose package carries this copy of the SDK
    (torch_<name>._accelkit), or None for the SDK's own package."""
    top = (__package__ or "").split(".")[0]
    if top == "accelkit" or not top:
        return None
    module = sys.modules.get(top)
    return getattr(module, "_accelkit_backend", None)


def main(argv=None, prog=None):
    from . import GROUPS, CHECKS, run
    from .known_differences import load as load_known
    from .report import unwritable
    default = package_backend()
    ap = argparse.ArgumentParser(prog=prog or (f"python -m {__package__}" if __package__
                                               else "python -m accelkit.testing"),
                                 description="accelkit's conformance kit (Python side)")
    ap.add_argument("--device", required=default is None, default=default,
                    help="the backend's device name (torch.<name>)"
                         + (f"; default {default}" if default else ""))
    ap.add_argument("--groups", default="", help=f"groups to run (default all): {','.join(GROUPS)},opinfo")
    ap.add_argument("--skip", default="", help="groups to skip")
    ap.add_argument("--checks", default="", help="only these checks (name or group/name)")
    ap.add_argument("--report", default=None, help="the JSON report's path (.txt beside it)")
    ap.add_argument("--opinfo", choices=("quick", "full", "none"), default="quick",
                    help="quick: a fixed set of operators (accelkit.testing.opinfo.QUICK); "
                         "full: every OpInfo of op_db")
    ap.add_argument("--opinfo-ops", default="", help="these OpInfo operators instead")
    ap.add_argument("--opinfo-dtypes", default="",
                    help="dtypes to try (default: quick float32,int64; full: six, where reported)")
    ap.add_argument("--opinfo-directions", default="forward,backward")
    ap.add_argument("--opinfo-samples", type=int, default=1, help="samples per operator")
    ap.add_argument("--jobs", type=int, default=2, help="OpInfo child processes at once")
    ap.add_argument("--rtol", type=float, default=1e-4, help="tolerance of CPU comparisons")
    ap.add_argument("--atol", type=float, default=1e-5)
    ap.add_argument("--import", dest="imports", default="",
                    help="modules to import after the backend, here and in every OpInfo child "
                         "(e.g. one that registers kernels through torch.library)")
    ap.add_argument("--known-differences", dest="known", default=None, metavar="FILE",
                    help="the vendor's known differences: lines 'group/name: reason' (wildcards "
                         "allowed); failures they name are reported apart and do not fail the "
                         "run (the SDK's own list always applies)")
    ap.add_argument("--list", action="store_true", help="list the checks and their rules")
    args = ap.parse_args(argv)
    split = (lambda s: [x for x in s.split(",") if x])
    if args.list:
        for c in CHECKS:
            print(f"{c.group}/{c.name}: {c.rule}")
        return 0
    if sys.flags.optimize:
        print(f"{args.device}: accelkit's conformance kit does not run under python -O "
              "(PYTHONOPTIMIZE), which removes the assert statements its checks are made of",
              file=sys.stderr)
        return 2
    known = None
    if args.known:
        try:
            known = load_known(args.known)
        except (OSError, ValueError) as e:
            why = f"{e.filename}: {e.strerror or e}" if isinstance(e, OSError) else str(e)
            print(f"{ap.prog}: --known-differences: {why}; no check run", file=sys.stderr)
            return 2
    path = args.report or os.environ.get("ACCELKIT_CONFORMANCE_REPORT") or \
        f"accelkit_conformance_python_{args.device}.json"
    why = unwritable(path)
    if why:
        source = "--report" if args.report else \
            "ACCELKIT_CONFORMANCE_REPORT" if os.environ.get("ACCELKIT_CONFORMANCE_REPORT") else \
            "the default path"
        print(f"{ap.prog}: cannot write the report ({source}): {why}; no check run",
              file=sys.stderr)
        return 2
    report = run(args.device, imports=split(args.imports), groups=split(args.groups), skip=split(args.skip),
                 names=split(args.checks), opinfo=args.opinfo,
                 opinfo_ops=split(args.opinfo_ops) or None,
                 opinfo_dtypes=split(args.opinfo_dtypes) or None,
                 opinfo_samples=args.opinfo_samples,
                 opinfo_directions=split(args.opinfo_directions), jobs=args.jobs, rtol=args.rtol,
                 atol=args.atol, log=lambda line: print(line, flush=True),
                 known_differences=known)
    groups, totals = report.summary().splitlines()[-2:]
    for line in report.known_summary():
        print(line)
    print(groups)
    try:
        report.write(path)
    except OSError as e:
        print(totals, flush=True)
        print(f"{ap.prog}: the report was not written: {e.filename}: {e.strerror or e}",
              file=sys.stderr)
        return 1
    print(totals + f" (report: {path})")
    return 1 if report.failed() else 0


if __name__ == "__main__":
    sys.exit(main())
