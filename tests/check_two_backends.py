"""Two accelkit backends' wheels in one venv: `import torch` loads one and
the other warns once; ACCELKIT_BACKEND picks either (Note [Two backends in
one environment] in python/accelkit/__init__.py).

    check_two_backends.py WORK WHEEL_WORK_DIR WHEEL_WORK_DIR [--devices NAME=N ...]

Each WHEEL_WORK_DIR is one that tests/check_backend_wheel.py filled (CTest's
python.simdev.autoload and consumer.skeleton.wheel): its site/ holds the
backend's wheel as pip installed it, its view/ this interpreter's
site-packages without any backend. Nothing is compiled here: each installed
distribution is packed again as the wheel it came from (its files, the
dist-info pip wrote less INSTALLER, REQUESTED, direct_url.json and RECORD,
which is written anew), a venv is made in WORK (without pip, its
site-packages reaching torch through a .pth naming the first view/), and pip
installs both wheels into it (--no-index --no-deps). Then, in the venv's
python, with no PYTHONPATH:
- `import torch` works, one backend holds the slot, the other warned once
  (naming the holder and ACCELKIT_BACKEND) and `import torch_<other>` is a
  RuntimeError naming both;
- ACCELKIT_BACKEND=<name> loads that one, for each, without a warning;
- ACCELKIT_BACKEND=<a name not installed> loads none, with one warning
  listing both;
- TORCH_DEVICE_BACKEND_AUTOLOAD=0 loads none; `import torch_<name>` then does.
--devices gives a backend's device count (default 1). Prints
"two backends: ok" at the end; exits non-zero at the first failure.
"""
import argparse
import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path

INSTALL_TIME = {"INSTALLER", "REQUESTED", "direct_url.json", "RECORD"}


def fail(message: str) -> None:
    print(f"check_two_backends: {message}", file=sys.stderr)
    sys.exit(1)


def run(cmd, env=None) -> str:
    shown = [str(c) if "\n" not in str(c) else "<code>" for c in cmd]
    print("+", " ".join(shown), flush=True)
    r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(r.stdout, end="", flush=True)
    if r.returncode != 0:
        fail(f"exit status {r.returncode}: {' '.join(map(str, cmd))}")
    return r.stdout


def backend(site: Path):
    """(name, package, dist-info) of the one backend installed in `site`."""
    infos = [i for i in site.glob("*.dist-info")
             if "[torch.backends]" in (i / "entry_points.txt").read_text(errors="replace")]
    if len(infos) != 1:
        fail(f"expected one backend's dist-info in {site}, found {infos}")
    for line in (infos[0] / "entry_points.txt").read_text().split("[torch.backends]")[1].splitlines():
        if "=" in line:
            name, value = (p.strip() for p in line.split("=", 1))
            return name, value.split(":")[0], infos[0]
    fail(f"no torch.backends entry point in {infos[0]}")


def repack(site: Path, info: Path, package: str, out: Path) -> Path:
    """The wheel of the distribution `info` installed in `site`."""
    tag = next(line.split(":", 1)[1].strip() for line in (info / "WHEEL").read_text().splitlines()
               if line.startswith("Tag:"))
    wheel = out / f"{info.name[:-len('.dist-info')]}-{tag}.whl"
    files = [p for p in sorted((site / package).rglob("*")) if p.is_file()
             and "__pycache__" not in p.parts]
    files += [p for p in sorted(info.iterdir()) if p.is_file() and p.name not in INSTALL_TIME]
    record = []
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        for p in files:
            data = p.read_bytes()
            arc = p.relative_to(site).as_posix()
            z.writestr(arc, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{arc},sha256={digest},{len(data)}")
        record.append(f"{info.name}/RECORD,,")
        z.writestr(f"{info.name}/RECORD", "\n".join(record) + "\n")
    return wheel


# `import torch` in the venv, recording every warning ("always": the once is
# the SDK's); then what holds the slot and which backends' packages are loaded.
PROBE = textwrap.dedent("""
    import json, sys, warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import torch
    slot = torch._C._get_privateuse1_backend_name()
    out = {{"slot": slot, "modules": sorted(m for m in {packages!r} if m in sys.modules),
            "warnings": [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)],
            "site": sys.modules["torch_" + slot].__file__ if slot != "privateuseone" else None}}
    if slot != "privateuseone":
        x = torch.arange(4.0, device=slot) * 2
        out["devices"] = getattr(torch, slot).device_count()
        out["tensor"] = [x.device.type, x.cpu().tolist()]
    for name in {names!r}:
        if name != slot:
            try:
                __import__("torch_" + name)
                out["import " + name] = "imported"
            except RuntimeError as e:
                out["import " + name] = "RuntimeError: " + str(e)
            break
    print("probe:", json.dumps(out))
    """)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("work", type=Path)
    ap.add_argument("wheel_work", type=Path, nargs=2)
    ap.add_argument("--devices", action="append", default=[])
    args = ap.parse_args()
    devices = dict(d.split("=", 1) for d in args.devices)
    shutil.rmtree(args.work, ignore_errors=True)
    wheels = args.work / "wheels"
    wheels.mkdir(parents=True)

    backends = {}
    for work in args.wheel_work:
        name, package, info = backend(work / "site")
        if package != f"torch_{name}":
            fail(f"{info}: expected the package torch_{name}, got {package}")
        backends[name] = repack(work / "site", info, package, wheels)
    names = sorted(backends)
    if len(names) != 2:
        fail(f"expected two backends of different names, got {names}")

    # The venv: no pip of its own (the running one installs into it), torch
    # through a .pth (the view holds no backend).
    venv = args.work / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    purelib = Path(run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
                   .strip().splitlines()[-1])
    (purelib / "torch_view.pth").write_text(str((args.wheel_work[0] / "view").resolve()) + "\n")
    run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-index", "--no-deps",
         "--disable-pip-version-check", "--no-input", *map(str, backends.values())])

    base = {k: v for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "PYTHONHOME", "TORCH_DEVICE_BACKEND_AUTOLOAD",
                         "ACCELKIT_BACKEND")
            and not any(k == f"{n.upper()}_VISIBLE_DEVICES" for n in names)}
    packages = [f"torch_{n}" for n in names]

    def probe(**env) -> dict:
        out = run([str(python), "-c", PROBE.format(packages=packages, names=names)],
                  env=dict(base, **env))
        lines = [line for line in out.splitlines() if line.startswith("probe: ")]
        if not lines:
            fail(f"no probe output with {env}")
        got = json.loads(lines[-1][len("probe: "):])
        print(f"  {env or 'no variable'}: {got}", flush=True)
        return got

    def expect(cond, what, got):
        if not cond:
            fail(f"{what}: {got}")

    listed = ", ".join(names)
    # Both installed, in the venv's site-packages, from the wheels.
    got = probe(TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    expect(got["slot"] == "privateuseone" and got["modules"] == [] and got["warnings"] == [],
           "autoload off: a backend was loaded", got)
    for name in names:
        out = run([str(python), "-c", textwrap.dedent(f"""
            import importlib.metadata as m, sys, torch, torch_{name}
            d = m.distribution("torch-{name}")
            print(d.read_text("INSTALLER").strip(), d.locate_file("") == __import__("pathlib").Path({str(purelib)!r}),
                  torch._C._get_privateuse1_backend_name(), torch.{name}.device_count())
            """)], env=dict(base, TORCH_DEVICE_BACKEND_AUTOLOAD="0"))
        expect(out.strip().splitlines()[-1] == f"pip True {name} {devices.get(name, '1')}",
               f"autoload off: import torch_{name} from the venv", out)

    # Neither chosen: one loads, the other warns once.
    got = probe()
    holder = got["slot"]
    expect(holder in names, "import torch: no backend holds the slot", got)
    other = next(n for n in names if n != holder)
    expect(got["modules"] == [f"torch_{holder}"], "import torch: the other's package is loaded", got)
    expect(got["site"].startswith(str(purelib)), "import torch: not the venv's package", got)
    expect(got["devices"] == int(devices.get(holder, "1"))
           and got["tensor"] == [holder, [0.0, 2.0, 4.0, 6.0]], "import torch: the device", got)
    expect(len(got["warnings"]) == 1, "import torch: not one warning", got)
    w = got["warnings"][0]
    expect(w.startswith(f"{other}: not loaded by `import torch`: PyTorch's one PrivateUse1 slot "
                        f"is held by '{holder}'") and f"ACCELKIT_BACKEND={other}" in w
           and f"installed: {listed}" in w, "import torch: the warning", got)
    e = got[f"import {other}"]
    expect(e.startswith(f"RuntimeError: accelkit.install('{other}'): PyTorch's PrivateUse1 "
                        f"slot is held by '{holder}'"), f"import torch_{other}", got)

    # Each chosen.
    for name in names:
        got = probe(ACCELKIT_BACKEND=name)
        expect(got["slot"] == name and got["modules"] == [f"torch_{name}"]
               and got["warnings"] == [] and got["devices"] == int(devices.get(name, "1")),
               f"ACCELKIT_BACKEND={name}", got)
        other = next(n for n in names if n != name)
        expect(got[f"import {other}"].startswith(
            f"RuntimeError: accelkit.install('{other}'): PyTorch's PrivateUse1 slot is held "
            f"by '{name}' already in this process (chosen by ACCELKIT_BACKEND={name})"),
            f"ACCELKIT_BACKEND={name}: import torch_{other}", got)

    # A name not installed.
    got = probe(ACCELKIT_BACKEND="nosuch")
    expect(got["slot"] == "privateuseone" and got["modules"] == [] and got["warnings"] == [
        f"ACCELKIT_BACKEND='nosuch' names no installed accelkit backend; none was loaded by "
        f"`import torch` (installed: {listed})"], "ACCELKIT_BACKEND=nosuch", got)
    print("two backends: ok")


if __name__ == "__main__":
    main()
