"""scripts/new_backend.py touches nothing outside DEST and nothing in DEST
but its own files (Note [What new_backend.py touches]; ctest:
consumer.skeleton.safety).

    check_new_backend_safety.py WORK_DIR [CMAKE]

- --force refuses, exit 2 naming the link, and changes nothing when a
  manifest entry goes through a link out of DEST, when README.md, a folder
  of the template (src/, tests/) or the manifest is a link, or when a
  manifest entry leaves DEST with `..`; nothing in DEST is written either,
  although the link is met only after files that come before it;
- a manifest entry that names a file the command did not write (no digest,
  or the file has changed) removes nothing;
- a DEST that is a file is refused (exit 2), not a traceback;
- the accelkit location goes into CMakeLists.txt as one argument that CMake
  evaluates to exactly the string given (run by CMAKE -P): backslashes
  (C:\\src\\accelkit, a literal \\n), a newline, quotes, $ and ;, brackets.
Prints "new_backend safety: ok"."""
import contextlib
import hashlib
import importlib.util
import io
import os
import re
import shutil
import subprocess
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "new_backend.py"
problems = []


def load_script():
    spec = importlib.util.spec_from_file_location("new_backend", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


NEW_BACKEND = load_script()


def run(*args):
    """The command's main() in this process: its exit status ("traceback"
    if it raised) and what it printed."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = NEW_BACKEND.main([*map(str, args), "--no-torch-check"])
        except SystemExit as e:  # argparse
            code = e.code
        except Exception:
            code = "traceback"
            traceback.print_exc()
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def snapshot(folder):
    """Every entry below `folder` (links not followed): its kind and bytes."""
    seen = {}
    for path in sorted(Path(folder).rglob("*")):
        rel = path.relative_to(folder).as_posix()
        if path.is_symlink():
            seen[rel] = ("link", os.readlink(path))
        elif path.is_file():
            seen[rel] = ("file", path.read_bytes())
        else:
            seen[rel] = ("folder", None)
    return seen


def fresh(work, name):
    """A new project made by the command, with a file of the vendor's own
    and an edited CMakeLists.txt (which a refused --force must leave)."""
    dest = work / name
    r = run("acme", "--dest", dest)
    if r.returncode != 0:
        problems.append(f"{name}: the first run failed: {r.returncode} {r.stderr}")
    (dest / "src" / "acme_kernels.cpp").write_text("// the vendor's own\n")
    (dest / "CMakeLists.txt").write_text("# edited by the vendor\n")
    return dest


def add_to_manifest(dest, entry, data=None):
    line = f"{hashlib.sha256(data).hexdigest()}  {entry}\n" if data is not None else f"{entry}\n"
    manifest = dest / ".accelkit-template-files"
    manifest.write_text(manifest.read_text() + line)


def expect_refused(case, dest, outside, named):
    """--force into `dest` must exit 2 naming `named`, and change nothing in
    `dest` or `outside`."""
    before = snapshot(dest), snapshot(outside)
    r = run("acme", "--dest", dest, "--force")
    if r.returncode != 2 or str(named) not in r.stderr:
        problems.append(f"{case}: exit {r.returncode}, said {r.stderr.strip()[-600:]!r} "
                        f"(wanted exit 2 naming {named})")
    after = snapshot(dest), snapshot(outside)
    for where, b, a in (("outside DEST", before[1], after[1]), ("in DEST", before[0], after[0])):
        if a != b:
            changed = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
            problems.append(f"{case}: --force changed {where}: {changed}")


def check_links(work):
    outside = work / "outside"
    outside.mkdir()
    victim = outside / "victim.txt"
    victim.write_text("not the command's\n")

    # A manifest entry through a link to a folder outside DEST, with the
    # digest of the file there.
    dest = fresh(work, "entry_through_link")
    (dest / "elsewhere").symlink_to(outside)
    add_to_manifest(dest, "elsewhere/victim.txt", victim.read_bytes())
    expect_refused("a manifest entry through a link", dest, outside, dest / "elsewhere")

    # README.md a link to a file outside DEST.
    dest = fresh(work, "readme_link")
    (dest / "README.md").unlink()
    (dest / "README.md").symlink_to(victim)
    expect_refused("README.md a link", dest, outside, dest / "README.md")

    # tests/, the template's last folder, a link: met after the files
    # before it, which must not be written either.
    dest = fresh(work, "folder_link")
    shutil.rmtree(dest / "tests")
    (outside / "tests").mkdir()
    (dest / "tests").symlink_to(outside / "tests")
    expect_refused("the folder tests/ a link", dest, outside, dest / "tests")

    # The manifest itself a link (it is read, then written).
    dest = fresh(work, "manifest_link")
    (outside / "manifest").write_text((dest / ".accelkit-template-files").read_text())
    (dest / ".accelkit-template-files").unlink()
    (dest / ".accelkit-template-files").symlink_to(outside / "manifest")
    expect_refused("the manifest a link", dest, outside, dest / ".accelkit-template-files")

    # A manifest entry that leaves DEST.
    dest = fresh(work, "entry_outside")
    add_to_manifest(dest, "../outside/victim.txt", victim.read_bytes())
    expect_refused("a manifest entry with ..", dest, outside, "../outside/victim.txt")

    if not victim.is_file() or victim.read_text() != "not the command's\n":
        problems.append("the file outside DEST was removed or changed")


def check_own_files(work):
    """--force removes only files it wrote and that are unchanged."""
    dest = fresh(work, "vendor_files")
    own = dest / "src" / "acme_kernels.cpp"
    changed = dest / "src" / "acme_changed.cpp"
    changed.write_text("// written by an older template\n")
    add_to_manifest(dest, "src/acme_kernels.cpp")
    add_to_manifest(dest, "src/acme_changed.cpp", b"// what the older template wrote\n")
    r = run("acme", "--dest", dest, "--force")
    if r.returncode != 0:
        problems.append(f"--force with the vendor's files in the manifest: exit {r.returncode}: "
                        f"{r.stderr}")
    for p in (own, changed):
        if not p.is_file():
            problems.append(f"--force removed {p.name}, which the manifest names without the "
                            "digest of what is there")
        elif str(p) not in r.stdout:
            problems.append(f"--force kept {p.name} without saying so: {r.stdout!r}")
    if "accelkit_add_torch_backend(acme" not in (dest / "CMakeLists.txt").read_text():
        problems.append("--force did not write CMakeLists.txt again")


def check_dest_file(work):
    dest = work / "a_file"
    dest.write_text("a file\n")
    r = run("acme", "--dest", dest, "--force")
    if r.returncode != 2 or str(dest) not in r.stderr or "not a folder" not in r.stderr:
        problems.append(f"DEST a file: exit {r.returncode}, said {r.stderr.strip()[-600:]!r}")


def check_cmake_values(work, cmake):
    values = ["C:\\src\\accelkit", "/opt/a\\nb", "/opt/two\nlines", '/opt/"quoted"',
              "/opt/${HOME};$ENV{PATH};x", "/opt/x]]y]=]z", "\n/opt/leading newline",
              "/opt/with space # and hash", "/opt/a;b", "https://example.com/accelkit.tar.gz", ""]
    for i, value in enumerate(values):
        dest = work / f"cmake_{i}"
        r = run("acme", "--dest", dest, "--accelkit", value)
        if r.returncode != 0:
            problems.append(f"--accelkit {value!r}: exit {r.returncode}: {r.stderr.strip()[-600:]}")
            continue
        text = (dest / "CMakeLists.txt").read_text()
        m = re.search(r"^set\(ACCELKIT_FETCH .*?CACHE STRING \"[^\"]*\"\)\n", text, re.S | re.M)
        if not m:
            problems.append(f"--accelkit {value!r}: no set(ACCELKIT_FETCH ... CACHE STRING ...)")
            continue
        out = work / f"cmake_{i}.value"
        script = work / f"cmake_{i}.cmake"
        script.write_text(m.group(0) + f'file(WRITE [[{out}]] "${{ACCELKIT_FETCH}}")\n')
        p = subprocess.run([cmake, "-P", str(script)], capture_output=True, text=True)
        got = out.read_bytes().decode() if out.is_file() else None
        if p.returncode != 0 or got != value:
            problems.append(f"--accelkit {value!r}: CMake read {got!r} (exit {p.returncode}: "
                            f"{p.stderr.strip()[-300:]!r}) from {m.group(0)!r}")


def main():
    work = Path(sys.argv[1]).resolve()
    cmake = sys.argv[2] if len(sys.argv) > 2 else shutil.which("cmake")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    check_links(work)
    check_own_files(work)
    check_dest_file(work)
    check_cmake_values(work, cmake)
    for p in problems:
        print("problem:", p)
    if not problems:
        print("new_backend safety: ok")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
