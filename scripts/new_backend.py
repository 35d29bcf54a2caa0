#!/usr/bin/env python3
"""Starts a new accelkit backend: copies accelkit's vendor template
(templates/vendor_backend) to DEST under the backend's name.

    python3 scripts/new_backend.py acme --dest ../acme-backend

The template's backend is called `skel`; every occurrence is replaced, in
file contents and in file names: `skel` by the name (namespace, device type
"acme", package torch_acme, files acme_runtime.hpp...), `Skel` by its
CamelCase form (class AcmeRuntime) and `SKEL` by its upper case (the
variables ACME_VISIBLE_DEVICES, the CMake options ACME_WITH_TORCH...).

The name must be a backend name as accelkit's contract defines it (a
lower-case identifier of at most 32 characters, not one of PyTorch's own
device types: is_valid_backend_name in include/accelkit/detail/contract.hpp,
read from there), and also not a C++ or Python keyword, and not a name that
torch already has (torch.<name> becomes the device module): each refusal
says why. DEST must not exist or be empty; --force writes the template's files
into it again and removes only files that an earlier run of this script wrote
and the template no longer has (listed in DEST/.accelkit-template-files):
nothing else in DEST is touched (the vendor's own files, .git, build/).

Where accelkit comes from in the new project: ACCELKIT_FETCH in its
CMakeLists.txt. Run from an accelkit source tree, the default is that tree
(FetchContent of a local path); --accelkit sets another path or URL, and
--accelkit '' makes it find an installed accelkit (find_package).
Needs only the Python standard library; imports torch only to check the name
against torch's attributes, when torch is installed (--no-torch-check skips).
"""
import argparse
import keyword
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# In a new project: the files this script wrote there (for --force).
MANIFEST = ".accelkit-template-files"
# A source tree: scripts/ beside templates/ and include/. An installed SDK:
# share/accelkit/scripts beside share/accelkit/templates, headers in include/.
SOURCE_ROOT = HERE.parent
TEMPLATE = SOURCE_ROOT / "templates" / "vendor_backend"
CONTRACT_CANDIDATES = [SOURCE_ROOT / "include/accelkit/detail/contract.hpp",
                       HERE.parents[2] / "include/accelkit/detail/contract.hpp"
                       if len(HERE.parents) > 2 else None]
TOKEN = re.compile(r"skel|Skel|SKEL")

CPP_KEYWORDS = set("""alignas alignof and and_eq asm auto bitand bitor bool break case catch
char char8_t char16_t char32_t class compl concept const consteval constexpr constinit const_cast
continue co_await co_return co_yield decltype default delete do double dynamic_cast else enum
explicit export extern false float for friend goto if inline int long mutable namespace new
noexcept not not_eq nullptr operator or or_eq private protected public register
reinterpret_cast requires return short signed sizeof static static_assert static_cast struct
switch template this thread_local throw true try typedef typeid typename union unsigned using
virtual void volatile wchar_t while xor xor_eq std accelkit""".split())


class Refused(Exception):
    pass


def reserved_device_types():
    """PyTorch's device types that a backend may not take, as the SDK lists
    them (is_valid_backend_name)."""
    for path in CONTRACT_CANDIDATES:
        if path and path.is_file():
            text = path.read_text()
            m = re.search(r"reserved\[\]\s*=\s*\{([^}]*)\}", text)
            if m:
                return re.findall(r'"([a-z0-9_]+)"', m.group(1))
    raise Refused("cannot find accelkit's include/accelkit/detail/contract.hpp beside this "
                  "script to read the reserved device types")


def check_name(name, torch_check=True):
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        raise Refused(f"'{name}' is not a lower-case identifier ([a-z][a-z0-9_]*): the name is "
                      "the device type, a C++ namespace and a Python module")
    if len(name) > 32:
        raise Refused(f"'{name}' has {len(name)} characters (at most 32)")
    if "__" in name or name.endswith("_"):
        raise Refused(f"'{name}' has a double or trailing underscore (reserved in C++, or "
                      "ambiguous as a variable prefix)")
    if name in reserved_device_types():
        raise Refused(f"'{name}' is one of PyTorch's own device types")
    if name in CPP_KEYWORDS or keyword.iskeyword(name):
        raise Refused(f"'{name}' is a C++ or Python keyword (or a namespace the project uses)")
    if torch_check:
        probe = subprocess.run(
            [sys.executable, "-c", "import sys, torch; print(hasattr(torch, sys.argv[1]))", name],
            capture_output=True, text=True, env=dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0"))
        if probe.returncode == 0 and probe.stdout.strip() == "True":
            raise Refused(f"torch.{name} already exists: the device module torch.{name} would "
                          "replace it")


def camel(name):
    return "".join(part[:1].upper() + part[1:] for part in name.split("_"))


def instantiate(name, dest, accelkit, force=False):
    if not TEMPLATE.is_dir():
        raise Refused(f"the template is not at {TEMPLATE}")
    if dest.exists() and any(dest.iterdir()) and not force:
        raise Refused(f"{dest} exists and is not empty (--force replaces it)")
    # With --force, files whose text is unchanged are left alone (a build of
    # the project then rebuilds nothing), and of the files an earlier run
    # wrote (its manifest) those the template no longer has go. Nothing else
    # in DEST is removed: it may hold the vendor's own work and .git.
    manifest = dest / MANIFEST
    earlier = set()
    if manifest.is_file():
        earlier = {dest / line for line in manifest.read_text().splitlines() if line.strip()}
    forms = {"skel": name, "Skel": camel(name), "SKEL": name.upper()}
    written = []
    for src in sorted(TEMPLATE.rglob("*")):
        rel = src.relative_to(TEMPLATE)
        if src.is_dir() or "__pycache__" in rel.parts or rel.parts[0] == "build":
            continue
        out = dest / TOKEN.sub(lambda m: forms[m.group(0)], str(rel))
        out.parent.mkdir(parents=True, exist_ok=True)
        text = TOKEN.sub(lambda m: forms[m.group(0)], src.read_text())
        if rel.as_posix() == "CMakeLists.txt":
            text, n = re.subn(r'set\(ACCELKIT_FETCH "[^"]*"', f'set(ACCELKIT_FETCH "{accelkit}"',
                              text, count=1)
            if n != 1:
                raise Refused("the template's CMakeLists.txt has no set(ACCELKIT_FETCH ...)")
        if not out.is_file() or out.read_text() != text:
            out.write_text(text)
            shutil.copymode(src, out)
        written.append(out)
    for p in earlier - set(written):
        rel = p.relative_to(dest) if p.is_relative_to(dest) else None
        if rel is not None and ".." not in rel.parts and p.is_file():
            p.unlink()
    manifest.write_text("".join(f"{p.relative_to(dest).as_posix()}\n" for p in written))
    return written


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("name", help="the backend's name: device type, namespace, package suffix")
    ap.add_argument("--dest", type=Path, required=True, help="the new project's folder")
    default_accelkit = str(SOURCE_ROOT) if (SOURCE_ROOT / "CMakeLists.txt").is_file() and \
        (SOURCE_ROOT / "include/accelkit/accelkit.hpp").is_file() else ""
    ap.add_argument("--accelkit", default=default_accelkit,
                    help="ACCELKIT_FETCH's default: a path or URL of accelkit for FetchContent, or "
                         f"'' for find_package (default: {default_accelkit or 'find_package'})")
    ap.add_argument("--force", action="store_true", help="replace DEST if it is not empty")
    ap.add_argument("--no-torch-check", action="store_true",
                    help="do not import torch to check the name against its attributes")
    args = ap.parse_args(argv)
    try:
        check_name(args.name, torch_check=not args.no_torch_check)
        written = instantiate(args.name, args.dest.resolve(), args.accelkit, args.force)
    except Refused as e:
        print(f"new_backend.py: refused: {e}", file=sys.stderr)
        return 2
    dest = args.dest.resolve()
    print(f"new_backend.py: {args.name} ({camel(args.name)}Runtime, device '{args.name}', "
          f"{args.name.upper()}_* variables, package torch_{args.name}): {len(written)} files in "
          f"{dest}")
    print(f"  next: cmake -S {dest} -B {dest}/build -G Ninja && cmake --build {dest}/build && "
          f"ctest --test-dir {dest}/build   (see {dest}/README.md)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
