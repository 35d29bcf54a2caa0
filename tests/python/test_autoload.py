"""Autoload: simdev's pip package declares an entry point
in PyTorch's `torch.backends` group, so that `import torch` alone installs
torch.simdev, and TORCH_DEVICE_BACKEND_AUTOLOAD=0 turns that off.

Here the installed package is stood in for by its metadata: a dist-info
with the entry points of the generated pyproject.toml, on the path before
the package in build/python (the same resolution an installed wheel gets:
the entry point names a module, found on sys.path). CTest's
python.simdev.autoload builds and installs the real wheel with pip.

Two backends (Note [Two backends in one environment] in accelkit/__init__.py):
simdev and minimal, both built here, each declared by its own dist-info on
its own path entry (the path's order is the entry points' order), and a
backend of another kind that renames PyTorch's slot; CTest's
python.two_backends installs two real wheels into one venv."""
import json
import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
import torch

from backend import IS_SIMDEV

if not IS_SIMDEV:  # the entry point and wheel checked here are torch_simdev's
    pytest.skip("checks torch_simdev's own package", allow_module_level=True)

import torch_simdev  # noqa: E402

PACKAGE = Path(torch_simdev.__file__).parent
PYPROJECT = PACKAGE.parent.parent / "packages" / "torch_simdev" / "pyproject.toml"


def _pyproject():
    if not PYPROJECT.is_file():
        pytest.fail(f"no generated {PYPROJECT} beside {PACKAGE} (accelkit_add_torch_backend)")
    return tomllib.loads(PYPROJECT.read_text())


def _dist_info(where: Path, pyproject: Path) -> Path:
    """A dist-info in `where` made from a generated pyproject.toml's metadata."""
    project = tomllib.loads(pyproject.read_text())["project"]
    info = where / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    lines = []
    for group, eps in project["entry-points"].items():
        lines.append(f"[{group}]")
        lines += [f"{k} = {v}" for k, v in eps.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return where


@pytest.fixture
def installed(tmp_path):
    """A path entry holding torch_simdev's dist-info."""
    _pyproject()
    return _dist_info(tmp_path, PYPROJECT)


def _python(code, path, **env):
    full = {k: v for k, v in os.environ.items()
            if k not in ("TORCH_DEVICE_BACKEND_AUTOLOAD", "ACCELKIT_BACKEND")}
    full.update(env)
    paths = path if isinstance(path, list) else [path]
    full["PYTHONPATH"] = os.pathsep.join([*map(str, paths), str(PACKAGE.parent)])
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                       text=True, env=full, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_the_generated_package_declares_the_entry_point_and_pins_torch():
    meta = _pyproject()
    assert meta["project"]["entry-points"]["torch.backends"] == {"simdev": "torch_simdev:_autoload"}
    assert meta["project"]["entry-points"]["accelkit.backends"] == {"simdev": "torch_simdev"}
    assert meta["project"]["dependencies"] == [f"torch=={torch.__version__.split('+')[0]}"]
    # torch is never a build requirement: an isolated build would fetch one.
    assert not any(r.startswith("torch") for r in meta["build-system"]["requires"])
    assert meta["build-system"]["build-backend"] == "scikit_build_core.build"


def test_import_torch_alone_installs_the_backend(installed):
    out = _python("""
        import sys, torch
        print(torch._C._get_privateuse1_backend_name(), torch.simdev.device_count())
        print(torch.randn(3, device="simdev:1").device)
        print(sys.modules["torch_simdev"].__file__)
        """, installed, SIMDEV_DEVICE_COUNT="2")
    name_count, device, origin = out.splitlines()
    assert name_count == "simdev 2"
    assert device == "simdev:1"
    # The package in build/python, once, though an "installed" one is declared.
    assert Path(origin).parent == PACKAGE


def test_importing_the_package_before_torch_installs_it_once(installed):
    # Torch's import runs the entry point while the package is still being
    # imported (Note [Importing the package before torch]).
    out = _python("""
        import torch_simdev
        import torch
        print(torch._C._get_privateuse1_backend_name(), torch.ones(2, device="simdev:1").sum().item())
        print(torch_simdev._autoload() is torch.simdev)
        """, installed, SIMDEV_DEVICE_COUNT="2")
    assert out.splitlines() == ["simdev 2.0", "True"]


def test_autoload_off_leaves_the_slot_until_the_package_is_imported(installed):
    out = _python("""
        import sys, torch
        print(torch._C._get_privateuse1_backend_name(), hasattr(torch, "simdev"),
              "torch_simdev" in sys.modules)
        import torch_simdev
        print(torch._C._get_privateuse1_backend_name(), torch.ones(2, device="simdev").sum().item())
        """, installed, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert out.splitlines() == ["privateuseone False False", "simdev 2.0"]


def test_the_entry_point_installs_once():
    # torch calls it after importing the package, which installed the device.
    assert torch_simdev._autoload() is torch.simdev
    assert torch_simdev._autoload() is torch.simdev


# ------------------------------------------------------------ two backends
MINIMAL = PACKAGE.parent / "torch_minimal"


@pytest.fixture
def two(tmp_path):
    """Path entries declaring simdev (first) and minimal, the example built
    beside it, and a third one for a backend of another kind."""
    if not (MINIMAL / "__init__.py").is_file():
        pytest.fail(f"no {MINIMAL} beside {PACKAGE} (examples/minimal, built with simdev)")
    paths = {"simdev": tmp_path / "a", "minimal": tmp_path / "b"}
    _dist_info(paths["simdev"], PYPROJECT)
    _dist_info(paths["minimal"], PYPROJECT.parent.parent / "torch_minimal" / "pyproject.toml")
    # Another kind of backend (as torch_npu): its entry point takes the slot
    # by renaming it, and it declares no accelkit.backends entry point.
    other = tmp_path / "c"
    info = other / "torch_fakenpu-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch_fakenpu\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[torch.backends]\nfakenpu = torch_fakenpu:_autoload\n")
    (other / "torch_fakenpu.py").write_text(
        "import torch\n"
        "def _autoload():\n"
        "    torch.utils.rename_privateuse1_backend('fakenpu')\n")
    paths["fakenpu"] = other
    return paths


# `import torch` in a child, recording every warning ("always": the once is
# the SDK's, not the warnings module's), then what holds the slot and which
# packages are imported.
_IMPORT = textwrap.dedent("""
    import json, sys, warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        {before}
        import torch
    print(json.dumps({{
        "slot": torch._C._get_privateuse1_backend_name(),
        "warnings": [f"{{w.category.__name__}}: {{w.message}}" for w in caught
                     if "accelkit" in w.filename or "torch_" in w.filename],
        "modules": sorted(m for m in ("torch_simdev", "torch_minimal") if m in sys.modules)}}))
    """)


def _import_torch(paths, order, before="", after="", **env):
    code = _IMPORT.format(before=before) + textwrap.dedent(after)
    out = _python(code, [paths[n] for n in order], SIMDEV_DEVICE_COUNT="2", **env)
    return json.loads(out.splitlines()[0]), out.splitlines()[1:]


@pytest.mark.parametrize("order", [("simdev", "minimal"), ("minimal", "simdev")])
def test_two_backends_the_first_takes_the_slot_and_the_other_warns_once(two, order):
    first, second = order
    got, rest = _import_torch(two, order, after=f"""
        print(torch.ones(2, device="{first}").device.type)
        try:
            import torch_{second}
        except RuntimeError as e:
            print("RuntimeError:", e)
        """)
    assert got["slot"] == first
    assert got["modules"] == [f"torch_{first}"]  # the other stays unloaded
    assert len(got["warnings"]) == 1, got["warnings"]
    warning = got["warnings"][0]
    assert warning.startswith(f"RuntimeWarning: {second}: not loaded by `import torch`: "
                              f"PyTorch's one PrivateUse1 slot is held by '{first}'"), warning
    assert f"ACCELKIT_BACKEND={second} to load {second} instead" in warning
    assert "installed: minimal, simdev" in warning
    # An explicit import of the other still raises, naming both.
    assert rest[0] == first
    assert rest[1].startswith(f"RuntimeError: accelkit.install('{second}'): PyTorch's "
                              f"PrivateUse1 slot is held by '{first}' already"), rest
    assert f"set ACCELKIT_BACKEND={second}" in rest[1]


@pytest.mark.parametrize("choice", ["simdev", "minimal"])
def test_accelkit_backend_chooses_and_the_others_say_nothing(two, choice):
    for order in (("simdev", "minimal"), ("minimal", "simdev")):
        got, rest = _import_torch(two, order, ACCELKIT_BACKEND=choice, after=f"""
            print(torch.{choice}.device_count(), torch.ones(2, device="{choice}").device.type)
            """)
        assert got == {"slot": choice, "warnings": [], "modules": [f"torch_{choice}"]}, (order, got)
        assert rest == [f"{2 if choice == 'simdev' else 1} {choice}"]


@pytest.mark.parametrize("value,message", [
    ("nosuch", "ACCELKIT_BACKEND='nosuch' names no installed accelkit backend; none was "
               "loaded by `import torch` (installed: minimal, simdev)"),
    ("torch-simdev", "ACCELKIT_BACKEND='torch-simdev' is not a backend's name (a lower-case "
                     "identifier, as the device type); no accelkit backend was loaded by "
                     "`import torch` (installed: minimal, simdev)"),
    ("SimDev", "ACCELKIT_BACKEND='SimDev' is not a backend's name"),
])
def test_accelkit_backend_naming_no_backend_warns_once_and_loads_none(two, value, message):
    got, rest = _import_torch(two, ("simdev", "minimal"), ACCELKIT_BACKEND=value, after="""
        import torch_minimal
        print(torch._C._get_privateuse1_backend_name())
        """)
    assert got["slot"] == "privateuseone" and got["modules"] == []
    assert len(got["warnings"]) == 1, got["warnings"]
    assert got["warnings"][0].startswith(f"RuntimeWarning: {message}"), got["warnings"]
    # The variable is autoload's: an explicit import still installs.
    assert rest == ["minimal"]


def test_a_slot_held_by_another_kind_of_backend(two):
    got, _ = _import_torch(two, ("fakenpu", "simdev", "minimal"))
    assert got["slot"] == "fakenpu" and got["modules"] == []
    assert sorted(w.split(":")[1].strip() for w in got["warnings"]) == ["minimal", "simdev"]
    assert all("slot is held by 'fakenpu'" in w for w in got["warnings"]), got["warnings"]
    # Chosen, it says so; nothing else warns.
    got, _ = _import_torch(two, ("fakenpu", "simdev", "minimal"), ACCELKIT_BACKEND="simdev")
    assert got["slot"] == "fakenpu"
    assert got["warnings"] == [
        "RuntimeWarning: simdev: not loaded by `import torch` although ACCELKIT_BACKEND=simdev: "
        "PyTorch's one PrivateUse1 slot is held by 'fakenpu', loaded first; set "
        "TORCH_DEVICE_BACKEND_AUTOLOAD=0 and import the package of the one to use"]


def test_the_package_imported_before_torch_goes_first(two):
    # Minimal's package is being imported when torch's import runs simdev's
    # entry point, the first (Note [Importing the package before torch]).
    got, rest = _import_torch(two, ("simdev", "minimal"), before="import torch_minimal", after="""
        print(torch.ones(2, device="minimal").device.type)
        """)
    assert got["slot"] == "minimal" and got["modules"] == ["torch_minimal"]
    assert len(got["warnings"]) == 1, got["warnings"]
    assert got["warnings"][0].startswith(
        "RuntimeWarning: simdev: not loaded by `import torch`: PyTorch's one PrivateUse1 slot "
        "goes to 'minimal', whose package is being imported; set ACCELKIT_BACKEND=simdev"), got
    assert rest == ["minimal"]
    # ACCELKIT_BACKEND decides autoload even so; the explicit import then raises.
    out = _python("""
        try:
            import torch_minimal
        except RuntimeError as e:
            import torch
            print(torch._C._get_privateuse1_backend_name(), "|", e)
        """, [two["simdev"], two["minimal"]], ACCELKIT_BACKEND="simdev")
    assert out.startswith("simdev | accelkit.install('minimal'): PyTorch's PrivateUse1 slot "
                          "is held by 'simdev' already in this process (chosen by "
                          "ACCELKIT_BACKEND=simdev)"), out


def test_two_backends_with_autoload_off(two):
    got, rest = _import_torch(two, ("simdev", "minimal"), TORCH_DEVICE_BACKEND_AUTOLOAD="0",
                              ACCELKIT_BACKEND="simdev", after="""
        import torch_minimal
        print(torch._C._get_privateuse1_backend_name())
        """)
    assert got == {"slot": "privateuseone", "warnings": [], "modules": []}
    assert rest == ["minimal"]
