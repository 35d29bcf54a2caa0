"""Builds a backend's pip package (made by accelkit_add_torch_backend) with
`pip install`, and checks that plain `import torch` loads it in an
environment where it is the only backend installed.

    check_backend_wheel.py PACKAGE_DIR NAME WORK_DIR [--devices N] [--build-dir DIR]

PACKAGE_DIR is <build>/packages/torch_<name>; WORK_DIR is emptied and
holds the installed package (WORK_DIR/site, `pip install --target`) and a
view of this interpreter's site-packages (and of what their .pth files add)
without any other package of PyTorch's `torch.backends` entry point group
(WORK_DIR/view, symbolic links), so that a backend installed in the venv (scripts/setup.sh installs
simdev) does not take PyTorch's one PrivateUse1 slot first. The checks run
`python -S` with only those two on the path:
- autoload on: `import torch` alone installs torch.<name> from WORK_DIR/site
  (NAME's device count is N, and with N > 0 a tensor is made there);
- TORCH_DEVICE_BACKEND_AUTOLOAD=0: `import torch` leaves the slot alone, and
  `import torch_<name>` then installs the device;
- with N > 0, the conformance kit from the wheel alone (the SDK inside it as
  torch_<name>._accelkit, no `accelkit` package on the path): `python -m
  torch_<name>.testing --checks tensors/factories` and `python -m
  torch_<name>._accelkit.testing` on one OpInfo operator (its child
  processes), both without --device, pass and report on NAME.
--build-dir sets scikit-build-core's build directory (default: the one the
package's pyproject.toml names, PACKAGE_DIR/build). Prints "backend wheel: ok" at the end; exits non-zero at the first failure.
"""
import argparse
import configparser
import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path


def fail(message: str) -> None:
    print(f"check_backend_wheel: {message}", file=sys.stderr)
    sys.exit(1)


def run(cmd, env=None, check_output=True) -> str:
    print("+", " ".join(map(str, cmd)), flush=True)
    r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(r.stdout, end="", flush=True)
    if r.returncode != 0 and check_output:
        fail(f"exit status {r.returncode}: {' '.join(map(str, cmd))}")
    return r.stdout


def backend_files(site_dir: Path) -> set:
    """Top-level names in `site_dir` that belong to distributions with a
    torch.backends entry point (their dist-info and what their RECORD lists)."""
    names = set()
    for info in site_dir.glob("*.dist-info"):
        eps = info / "entry_points.txt"
        if not eps.is_file():
            continue
        parser = configparser.ConfigParser(delimiters=("=",))
        parser.optionxform = str
        parser.read(eps)
        if not parser.has_section("torch.backends"):
            continue
        names.add(info.name)
        record = info / "RECORD"
        if record.is_file():
            for line in record.read_text().splitlines():
                top = line.split(",", 1)[0].split("/", 1)[0]
                if top and not top.startswith(".."):
                    names.add(top)
    return names


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("package_dir", type=Path)
    ap.add_argument("name")
    ap.add_argument("work_dir", type=Path)
    ap.add_argument("--devices", type=int, default=0)
    ap.add_argument("--build-dir", type=Path, default=None)
    args = ap.parse_args()
    package = f"torch_{args.name}"
    if not (args.package_dir / "pyproject.toml").is_file():
        fail(f"no pyproject.toml in {args.package_dir}")
    shutil.rmtree(args.work_dir, ignore_errors=True)
    site_dir, view = args.work_dir / "site", args.work_dir / "view"
    view.mkdir(parents=True)

    # The wheel, built by scikit-build-core against this environment's torch.
    settings = [f"--config-settings=build-dir={args.build_dir}"] if args.build_dir else []
    run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps",
         "--disable-pip-version-check", "--no-input", "--target", str(site_dir), *settings,
         str(args.package_dir)])
    infos = list(site_dir.glob(f"{package}-*.dist-info"))
    if len(infos) != 1:
        fail(f"expected one {package} dist-info in {site_dir}, found {infos}")
    eps = (infos[0] / "entry_points.txt").read_text()
    if "[torch.backends]" not in eps or f"{args.name} = {package}:_autoload" not in eps:
        fail(f"the wheel's entry points lack {args.name} in torch.backends:\n{eps}")
    if not list((site_dir / package).glob("_C*")) or not (site_dir / package / "_accelkit").is_dir():
        fail(f"the wheel lacks {package}/_C or {package}/_accelkit")

    # This interpreter's path (its site-packages, and what .pth files add)
    # without other backends, the standard library and PYTHONPATH; in path
    # order, the first of a name winning as on sys.path.
    stdlib = {Path(sysconfig.get_paths()[k]).resolve() for k in ("stdlib", "platstdlib")}
    ignored = {Path(p).resolve() for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    ignored.add(Path(__file__).resolve().parent)
    dirs = []
    for p in sys.path + site.getsitepackages():
        d = Path(p).resolve() if p else None
        if (d is None or not d.is_dir() or d in ignored or d in dirs
                or any(d == s or s in d.parents and "site-packages" not in d.parts for s in stdlib)):
            continue
        dirs.append(d)
    for d in dirs:
        skip = backend_files(d)
        for entry in d.iterdir():
            if entry.name in skip or entry.suffix == ".pth" or (view / entry.name).exists():
                continue
            (view / entry.name).symlink_to(entry)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "TORCH_DEVICE_BACKEND_AUTOLOAD", "PYTHONHOME")}
    env["PYTHONPATH"] = os.pathsep.join([str(site_dir), str(view)])

    on = run([sys.executable, "-S", "-c", textwrap.dedent(f"""
        import sys, torch
        name = {args.name!r}
        assert torch._C._get_privateuse1_backend_name() == name, torch._C._get_privateuse1_backend_name()
        mod = sys.modules[{package!r}]
        assert mod.__file__.startswith({str(site_dir)!r}), mod.__file__
        assert getattr(torch, name) is sys.modules["torch." + name]
        n = getattr(torch, name).device_count()
        assert n == {args.devices}, n
        if n:
            x = torch.arange(4.0, device=name) * 2
            assert x.device.type == name and x.cpu().tolist() == [0.0, 2.0, 4.0, 6.0], x
        print("autoload on:", name, "devices", n)
        """)], env=env)
    if f"autoload on: {args.name} devices {args.devices}" not in on:
        fail("autoload on: unexpected output")

    env_off = dict(env, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    off = run([sys.executable, "-S", "-c", textwrap.dedent(f"""
        import sys, torch
        assert torch._C._get_privateuse1_backend_name() == "privateuseone"
        assert {package!r} not in sys.modules and not hasattr(torch, {args.name!r})
        import {package}
        assert torch._C._get_privateuse1_backend_name() == {args.name!r}
        print("autoload off: explicit import", torch.{args.name}.device_count())
        """)], env=env_off)
    if f"autoload off: explicit import {args.devices}" not in off:
        fail("autoload off: unexpected output")

    if args.devices:
        for module, selection in (
                (f"{package}.testing", ["--checks", "tensors/factories"]),
                (f"{package}._accelkit.testing", ["--groups", "opinfo", "--opinfo-ops", "add",
                                                  "--opinfo-dtypes", "float32",
                                                  "--opinfo-directions", "forward"])):
            report = args.work_dir / f"{module}.json"
            out = run([sys.executable, "-S", "-m", module, *selection, "--report", str(report)],
                      env=env)
            kit = json.loads(report.read_text())
            names = [f"{c['group']}/{c['name']}:{c['status']}" for c in kit["checks"]]
            if kit["backend"] != args.name or not names or \
                    any(not n.endswith(":pass") for n in names) or "1 passed, 0 failed" not in out:
                fail(f"python -m {module}: the kit's report on {kit['backend']}: {names}")
            print(f"python -m {module}: {', '.join(names)}")
    print("backend wheel: ok")


if __name__ == "__main__":
    main()
