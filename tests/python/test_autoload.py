"""Autoload: simdev's pip package declares an entry point
in PyTorch's `torch.backends` group, so that `import torch` alone installs
torch.simdev, and TORCH_DEVICE_BACKEND_AUTOLOAD=0 turns that off.

Here the installed package is stood in for by its metadata: a dist-info
with the entry points of the generated pyproject.toml, on the path before
the package in build/python (the same resolution an installed wheel gets:
the entry point names a module, found on sys.path). CTest's
python.simdev.autoload builds and installs the real wheel with pip."""
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


@pytest.fixture
def installed(tmp_path):
    """A path entry holding torch_simdev's dist-info, made from the generated
    pyproject.toml's metadata."""
    project = _pyproject()["project"]
    info = tmp_path / f"torch_simdev-{project['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    lines = []
    for group, eps in project["entry-points"].items():
        lines.append(f"[{group}]")
        lines += [f"{k} = {v}" for k, v in eps.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return tmp_path


def _python(code, path, **env):
    full = {k: v for k, v in os.environ.items() if k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    full.update(env)
    full["PYTHONPATH"] = os.pathsep.join([str(path), str(PACKAGE.parent)])
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                       text=True, env=full, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_the_generated_package_declares_the_entry_point_and_pins_torch():
    meta = _pyproject()
    assert meta["project"]["entry-points"]["torch.backends"] == {"simdev": "torch_simdev:_autoload"}
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


def test_a_second_installed_backend_fails_import_torch_naming_both(installed):
    # Another backend's package (standing in: its entry point installs the
    # name "other" through the SDK after simdev took PyTorch's one slot).
    info = installed / "torch_other-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch_other\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[torch.backends]\nother = torch_other:_autoload\n")
    (installed / "torch_other.py").write_text(
        "def _autoload():\n"
        "    import torch_simdev\n"
        "    torch_simdev._accelkit.install('other')\n")
    env = {k: v for k, v in os.environ.items() if k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    env["PYTHONPATH"] = os.pathsep.join([str(installed), str(PACKAGE.parent)])
    r = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode != 0
    assert "Failed to load the backend extension: other" in r.stderr
    assert "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in r.stderr
    assert "accelkit.install('other'): this process installed 'simdev' already" in r.stderr
