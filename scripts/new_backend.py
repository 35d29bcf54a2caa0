#!/usr/bin/env python3
"""Starts a new accelkit backend: copies accelkit's vendor template
(templates/vendor_backend) to DEST under the backend's name.

    python3 scripts/new_backend.py acme --dest ../acme-backend

The template's backend is called `skel`; every occurrence is replaced, in
file contents and in file names: `skel` by the name (device type "acme",
package torch_acme, files acme_runtime.hpp...), the C++ namespace by
--namespace (default: the name), the class SkelRuntime by --class (default:
the name's CamelCase form and Runtime, AcmeRuntime), `SKEL` by --env-prefix
(default: the name in upper case: the CMake options ACME_WITH_TORCH..., the
runtime's own environment variables). The variables the SDK reads
(ACME_VISIBLE_DEVICES, ACME_ALLOC_CONF, ACME_FALLBACK...) always follow the
name.

    python3 scripts/new_backend.py vkdev --namespace vkdev --class VulkanRuntime \
        --env-prefix VKDEV --dest ../vkdev-backend

Names that collide with a well-known library's or with PyTorch's (namespace
vk, the class VkRuntime, VK_ variables: Vulkan's own) are written as asked,
with a warning on stderr for each, naming the library and the option that
changes it (Note [Names that collide]).

The name must be a backend name as accelkit's contract defines it (a
lower-case identifier of at most 32 characters, not one of PyTorch's own
device types: is_valid_backend_name in include/accelkit/detail/contract.hpp,
read from there), and also not a C++ or Python keyword, and not a name that
torch already has (torch.<name> becomes the device module): each refusal
says why. DEST must not exist or be empty; --force writes the template's files
into it again and removes only files that an earlier run of this script wrote,
that the template no longer has and that have not changed since (listed with
their SHA-256 in DEST/.accelkit-template-files): nothing else in DEST is
touched (the vendor's own files, .git, build/). Every path is checked before
anything is written: one that goes through a symbolic link below DEST, or
leaves DEST, is refused (Note [What new_backend.py touches]).

Where accelkit comes from in the new project: ACCELKIT_FETCH in its
CMakeLists.txt. Run from an accelkit source tree, the default is that tree
(FetchContent of a local path); --accelkit sets another path or URL, and
--accelkit '' makes it find an installed accelkit (find_package).
Needs only the Python standard library (POSIX); imports torch only to check
the name against torch's attributes, when torch is installed
(--no-torch-check skips).
"""
import argparse
import errno
import hashlib
import keyword
import os
import re
import stat
import subprocess
import sys
from pathlib import Path, PurePosixPath

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
# The template's name in each of its roles, most specific first: the SDK's
# own variables (always the name's), the runtime class, the C++ namespace
# (in `namespace skel` and before `::SkelRuntime`), then the rest.
TOKEN = re.compile(r"(?P<sdk_var>SKEL(?=_(?:VISIBLE_DEVICES|ALLOC_CONF|FALLBACK|AUTOCOMPARE)))"
                   r"|(?P<cls>SkelRuntime)"
                   r"|(?P<ns>(?<=namespace )skel\b|\bskel(?=::SkelRuntime))"
                   r"|(?P<name>skel)|(?P<camel>Skel)|(?P<prefix>SKEL)")

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


# accelkit's inner namespaces: inside namespace accelkit (where the SDK's
# registration names the class) they hide a global namespace of the same name.
ACCELKIT_NAMESPACES = {"detail", "support", "testing", "compat", "host",
                       "torch_adapter"}


class Names:
    """What the template's `skel` becomes in each role."""

    def __init__(self, name, namespace=None, cls=None, env_prefix=None):
        self.name = name
        self.namespace = namespace or name
        self.cls = cls or f"{camel(name)}Runtime"
        self.env_prefix = env_prefix or name.upper()

    def replace(self, match):
        return {"sdk_var": self.name.upper(), "cls": self.cls, "ns": self.namespace,
                "name": self.name, "camel": camel(self.name),
                "prefix": self.env_prefix}[match.lastgroup]


def check_options(names):
    """Refuses a namespace, class or prefix that would not compile or would
    not read as one."""
    parts = names.namespace.split("::")
    for part in parts:
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", part) or "__" in part:
            raise Refused(f"--namespace '{names.namespace}' is not a C++ namespace (identifiers "
                          "separated by ::, each starting with a letter, no double underscore)")
        if part in CPP_KEYWORDS:
            raise Refused(f"--namespace '{names.namespace}': '{part}' is a C++ keyword or a "
                          "namespace the project uses")
    if parts[0] in ACCELKIT_NAMESPACES:
        raise Refused(f"namespace '{names.namespace}' (the name's unless --namespace gives "
                      f"one): accelkit has a namespace '{parts[0]}', which the SDK's "
                      "registration, inside namespace accelkit, would find instead of yours "
                      "(choose another with --namespace)")
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", names.cls) or "__" in names.cls:
        raise Refused(f"--class '{names.cls}' is not a C++ class name (a letter, then letters, "
                      "digits and single underscores)")
    if names.cls in CPP_KEYWORDS or names.cls == names.namespace:
        raise Refused(f"--class '{names.cls}' is a C++ keyword or the namespace's own name")
    if not re.fullmatch(r"[A-Z][A-Z0-9_]*", names.env_prefix) or "__" in names.env_prefix or \
            names.env_prefix.endswith("_"):
        raise Refused(f"--env-prefix '{names.env_prefix}' is not an upper-case identifier "
                      "without a trailing underscore ([A-Z][A-Z0-9_]*; the template adds the _: "
                      "ACME gives ACME_WITH_TORCH)")


# Note [Names that collide]
# Problem: the name alone made the namespace, the class and the variables'
# prefix, so a Vulkan backend named vk got `namespace vk`, `VkRuntime` and
# VK_* variables: Vulkan-Hpp's namespace, a name of Vulkan's type style and
# the Vulkan loader's variables. Such a project compiles, then breaks or
# confuses when the driver's headers come in.
# Decision: --namespace, --class and --env-prefix choose each; a name, chosen
# or derived, that a well-known library or PyTorch uses gets a warning on
# stderr naming the library and the option that changes it, and the project
# is written as asked (the vendor may mean it: a CUDA backend's own `cuda`
# namespace inside its driver's tree).
# Limits: the lists below are the accelerator APIs and the libraries a
# backend links (PyTorch's namespaces, variables and device types); a clash
# with anything else is not seen. The SDK's own variables follow the name
# (<NAME>_VISIBLE_DEVICES...): only another name changes them.
LIBRARY_NAMESPACES = {
    "vk": "Vulkan-Hpp's namespace (vk::Device...)",
    "vulkan": "the namespace of PyTorch's Vulkan backend (at::native::vulkan)",
    "cl": "the OpenCL C++ bindings' namespace (cl::Buffer...)",
    "cuda": "libcu++'s and CUDA's namespace (cuda::std...)",
    "cub": "CUB's namespace", "thrust": "Thrust's namespace",
    "hip": "HIP's namespace", "rocm": "ROCm's namespace",
    "ze": "Level Zero's prefix (ze_...)",
    "sycl": "SYCL's namespace (sycl::queue...)",
    "mtl": "metal-cpp's namespace (MTL::Device...)", "ns": "metal-cpp's Foundation namespace (NS::)",
    "wgpu": "WebGPU's C++ namespace (wgpu::Device...)", "dawn": "Dawn's namespace",
    "torch": "PyTorch's namespace", "at": "ATen's namespace (PyTorch)",
    "c10": "c10's namespace (PyTorch)", "caffe2": "caffe2's namespace (PyTorch)",
}
LIBRARY_CLASS_PREFIXES = {
    "Vk": "Vulkan's types (VkDevice, VkBuffer...)",
    "Cl": "OpenCL's names (cl::Buffer, cl_mem...)",
    "CU": "the CUDA driver API's types (CUdevice, CUstream...)",
    "MTL": "Metal's types (MTLDevice, MTLBuffer...)",
    "WGPU": "WebGPU's C types (WGPUDevice...)",
    "Ze": "Level Zero's types",
}
LIBRARY_ENV_PREFIXES = {
    "VK": "the Vulkan loader's variables and Vulkan's macros (VK_ICD_FILENAMES, VK_SUCCESS...)",
    "CL": "OpenCL's macros (CL_SUCCESS...)",
    "CUDA": "CUDA's variables (CUDA_VISIBLE_DEVICES...)",
    "CU": "the CUDA driver API's macros (CU_DEVICE_ATTRIBUTE_...)",
    "HIP": "HIP's variables (HIP_VISIBLE_DEVICES...)",
    "ROCR": "ROCm's variables (ROCR_VISIBLE_DEVICES)",
    "ZE": "Level Zero's variables (ZE_AFFINITY_MASK...)",
    "SYCL": "SYCL's variables", "ONEAPI": "oneAPI's variables (ONEAPI_DEVICE_SELECTOR)",
    "MTL": "Metal's variables (MTL_DEBUG_LAYER...)",
    "WGPU": "WebGPU's variables",
    "TORCH": "PyTorch's variables (TORCH_DEVICE_BACKEND_AUTOLOAD...)",
    "PYTORCH": "PyTorch's variables (PYTORCH_CUDA_ALLOC_CONF...)",
    "OMP": "OpenMP's variables", "KMP": "OpenMP's variables", "MKL": "MKL's variables",
    "NCCL": "NCCL's variables", "GLOO": "gloo's variables",
}


def collisions(names):
    """Warnings (text) for names that well-known libraries or PyTorch use
    (Note [Names that collide])."""
    device_types = reserved_device_types()
    out = []
    for part in names.namespace.split("::"):
        key = part.lower()
        if key in LIBRARY_NAMESPACES or key in device_types:
            what = LIBRARY_NAMESPACES.get(key) or f"one of PyTorch's device types ({key})"
            out.append(f"namespace '{names.namespace}': '{part}' is {what}; choose another "
                       "with --namespace")
    for prefix, what in LIBRARY_CLASS_PREFIXES.items():
        rest = names.cls[len(prefix):]
        if names.cls.startswith(prefix) and (not rest or rest[0].isupper() or rest[0].isdigit()):
            out.append(f"class '{names.cls}' is in the style of {what}; choose another with "
                       "--class")
    uses = [(names.env_prefix, f"--env-prefix '{names.env_prefix}' (the CMake options "
             f"{names.env_prefix}_WITH_TORCH..., the runtime's own variables)",
             "choose another with --env-prefix"),
            (names.name.upper(), f"the SDK's variables {names.name.upper()}_VISIBLE_DEVICES, "
             f"{names.name.upper()}_ALLOC_CONF... (from the name '{names.name}')",
             "only another name changes them")]
    for prefix, used, fix in uses:
        for key in dict.fromkeys([prefix, prefix.split("_")[0]]):
            if key in LIBRARY_ENV_PREFIXES:
                what = LIBRARY_ENV_PREFIXES[key]
            elif key.lower() in device_types:
                what = f"the name of PyTorch's {key.lower()} device"
            else:
                continue
            out.append(f"{used}: {key}_ is {what}; {fix}")
            break
    return out


# Note [What new_backend.py touches]
# DEST may come from elsewhere (a cloned repository), so nothing in it is
# trusted: not its manifest, not its links. The command first makes the
# whole plan (every file's text, every removal) and checks it, then writes:
# - every path it writes, reads or removes lies inside DEST and goes through
#   no symbolic link below DEST: a link on the way, or a link, folder or
#   device where a file goes, is refused naming the path, and nothing is
#   written. The writes and removals themselves walk DEST a folder at a
#   time with O_NOFOLLOW, so a link made between the check and the write is
#   refused too (POSIX; DEST itself may be a link the caller names);
# - the manifest records each file it wrote with its SHA-256 (the format of
#   sha256sum): a file the template no longer has is removed only if it is
#   still what the command wrote. A file changed since, or named by a
#   manifest line without a digest, stays (the output names it), so a
#   manifest that names the vendor's own files removes none of them. The
#   limit: a line with the digest of what a file holds now removes it (the
#   manifest's author then knew the file's exact content);
# - the accelkit location goes into CMakeLists.txt as one CMake argument
#   that evaluates to exactly the string given (cmake_argument). A `;` in
#   it stays in the value, where CMake reads it as a list separator once the
#   variable is expanded unquoted.


def cmake_argument(value):
    """`value` as one CMake argument that evaluates to exactly `value`:
    quoted when it has no character that CMake reads there (\\, ", $, a
    control character), otherwise a bracket argument ([=[...]=], with
    enough `=` that the closing bracket is not in the value), in which CMake
    reads no escapes or variables."""
    if not re.search(r'[\\"$\x00-\x1f\x7f]', value):
        return f'"{value}"'
    n = 0
    while f"]{'=' * n}]" in value + "]":
        n += 1
    # A newline right after the opening bracket is not part of the argument.
    lead = "\n" if value[:1] in ("\n", "\r") else ""
    return f"[{'=' * n}[{lead}{value}]{'=' * n}]"


def digest(data):
    return hashlib.sha256(data).hexdigest()


def relative_path(text, what):
    """A manifest entry as a path relative to DEST, refused if it leaves it."""
    rel = PurePosixPath(text)
    if rel.is_absolute() or not rel.parts or any(p in ("..", ".") for p in rel.parts) or \
            "\\" in text:
        raise Refused(f"{what} names {text!r}, which is not a path inside DEST")
    return rel


def check_path(dest, rel, what, file_only=True):
    """Refuses `rel` under `dest` if a part of it that exists is a symbolic
    link or a folder on the way is not one, and, if `file_only`, if it is
    there but not a regular file."""
    path = dest
    for i, part in enumerate(rel.parts):
        path = path / part
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return
        if stat.S_ISLNK(st.st_mode):
            raise Refused(f"{path} is a symbolic link (to {os.readlink(path)}), on the way to "
                          f"{what}: new_backend.py touches only files inside {dest} and follows "
                          "no link (remove the link, or choose another --dest)")
        last = i == len(rel.parts) - 1
        if not last and not stat.S_ISDIR(st.st_mode):
            raise Refused(f"{path} is not a folder, on the way to {what}")
        if last and file_only and not stat.S_ISREG(st.st_mode):
            raise Refused(f"{path} is not a regular file ({what})")


def check_dest(dest, force):
    if dest == TEMPLATE or TEMPLATE in dest.parents or dest in TEMPLATE.parents:
        raise Refused(f"{dest} is, or is inside, or holds the template {TEMPLATE}")
    if dest.exists():
        if not dest.is_dir():
            raise Refused(f"{dest} exists and is not a folder")
        if any(dest.iterdir()) and not force:
            raise Refused(f"{dest} exists and is not empty (--force writes the template's files "
                          "into it again)")
        if not os.access(dest, os.W_OK | os.X_OK):
            raise Refused(f"{dest} is not writable")
        return
    parent = dest.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise Refused(f"cannot make {dest}: {parent} is not a writable folder")


def plan(names, dest, accelkit, force):
    """What instantiate writes and removes, checked: (writes, removals,
    kept), writes as (relative path, bytes, mode), removals and kept as
    relative paths."""
    if not TEMPLATE.is_dir():
        raise Refused(f"the template is not at {TEMPLATE}")
    try:
        accelkit.encode("utf-8")
    except UnicodeEncodeError:
        raise Refused(f"--accelkit {accelkit!r} is not valid UTF-8") from None
    check_dest(dest, force)
    writes = []
    for src in sorted(TEMPLATE.rglob("*")):
        rel = src.relative_to(TEMPLATE)
        if src.is_dir() or "__pycache__" in rel.parts or rel.parts[0] == "build":
            continue
        out = PurePosixPath(TOKEN.sub(names.replace, rel.as_posix()))
        text = TOKEN.sub(names.replace, src.read_text(encoding="utf-8"))
        if rel.as_posix() == "CMakeLists.txt":
            text, n = re.subn(r'set\(ACCELKIT_FETCH "[^"]*"',
                              lambda m: f"set(ACCELKIT_FETCH {cmake_argument(accelkit)}",
                              text, count=1)
            if n != 1:
                raise Refused("the template's CMakeLists.txt has no set(ACCELKIT_FETCH ...)")
        check_path(dest, out, f"the template's {out}")
        writes.append((out, text.encode("utf-8"), stat.S_IMODE(src.stat().st_mode)))
    manifest = PurePosixPath(MANIFEST)
    check_path(dest, manifest, "the manifest")
    written = {rel for rel, _, _ in writes}
    removals, kept = [], []
    for line in (read_file(dest, manifest) or b"").decode("utf-8", "replace").splitlines():
        m = re.fullmatch(r"([0-9a-f]{64})  (.+)", line)
        want, entry = (m.group(1), m.group(2)) if m else (None, line)
        if not entry.strip():
            continue
        rel = relative_path(entry, f"{dest / MANIFEST}")
        check_path(dest, rel, f"{rel}, named by {dest / MANIFEST}", file_only=False)
        if rel in written or not (dest / rel).is_file():
            continue  # not there, or not a file (that the command would have written)
        data = read_file(dest, rel)
        (removals if want is not None and digest(data) == want else kept).append(rel)
    return writes, removals, kept


def open_folder(root, parts, create):
    """The folder `parts` below the open folder `root`, walked without
    following links (made when `create`); a file descriptor."""
    fd = os.dup(root)
    try:
        for part in parts:
            if create:
                try:
                    os.mkdir(part, dir_fd=fd)
                except FileExistsError:
                    pass
            child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def refuse_link(path, e):
    if e.errno in (errno.ELOOP, errno.ENOTDIR):
        raise Refused(f"{path} changed into a symbolic link or a file while new_backend.py "
                      "wrote (it follows no link)") from None
    raise e


def read_file(dest, rel):
    """The bytes of `rel` in `dest` read without following a link; None if
    there is no such file."""
    if not dest.is_dir():
        return None
    root = os.open(dest, os.O_RDONLY | os.O_DIRECTORY)
    try:
        folder = open_folder(root, rel.parts[:-1], create=False)
        try:
            fd = os.open(rel.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)
        finally:
            os.close(folder)
    except FileNotFoundError:
        return None
    except OSError as e:
        refuse_link(dest / rel, e)
    finally:
        os.close(root)
    with os.fdopen(fd, "rb") as f:
        return f.read()


def write_files(dest, writes, removals):
    dest.mkdir(parents=True, exist_ok=True)
    root = os.open(dest, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for rel, data, mode in writes:
            try:
                folder = open_folder(root, rel.parts[:-1], create=True)
                try:
                    # A file whose text is unchanged is left alone: a build of
                    # the project then rebuilds nothing.
                    if read_file(dest, rel) == data:
                        continue
                    fd = os.open(rel.name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW,
                                 0o600, dir_fd=folder)
                finally:
                    os.close(folder)
            except OSError as e:
                refuse_link(dest / rel, e)
            with os.fdopen(fd, "wb") as f:
                os.fchmod(f.fileno(), mode)
                f.write(data)
        for rel in removals:
            try:
                folder = open_folder(root, rel.parts[:-1], create=False)
                try:
                    os.unlink(rel.name, dir_fd=folder)
                finally:
                    os.close(folder)
            except OSError as e:
                refuse_link(dest / rel, e)
    finally:
        os.close(root)


def instantiate(names, dest, accelkit, force=False):
    """Writes the template into `dest` (Note [What new_backend.py touches])
    under `names` (a Names, or the backend's name for the defaults); the
    paths written and those kept that an earlier run wrote."""
    if isinstance(names, str):
        names = Names(names)
    writes, removals, kept = plan(names, dest, accelkit, force)
    manifest = "".join(f"{digest(data)}  {rel}\n" for rel, data, _ in writes).encode("utf-8")
    write_files(dest, writes + [(PurePosixPath(MANIFEST), manifest, 0o644)], removals)
    return [dest / rel for rel, _, _ in writes], [dest / rel for rel in kept]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("name", help="the backend's name: device type, namespace, package suffix")
    ap.add_argument("--dest", type=Path, required=True, help="the new project's folder")
    default_accelkit = str(SOURCE_ROOT) if (SOURCE_ROOT / "CMakeLists.txt").is_file() and \
        (SOURCE_ROOT / "include/accelkit/accelkit.hpp").is_file() else ""
    ap.add_argument("--accelkit", default=default_accelkit,
                    help="ACCELKIT_FETCH's default: a path or URL of accelkit for FetchContent, or "
                         f"'' for find_package (default: {default_accelkit or 'find_package'})")
    ap.add_argument("--namespace", help="the C++ namespace (default: the name; a::b nests)")
    ap.add_argument("--class", dest="cls", metavar="CLASS",
                    help="the runtime class (default: the name in CamelCase and Runtime)")
    ap.add_argument("--env-prefix", metavar="PREFIX",
                    help="the prefix, without its _, of the CMake options and the runtime's own "
                         "environment variables (default: the name in upper case); the SDK's "
                         "variables follow the name")
    ap.add_argument("--force", action="store_true", help="replace DEST if it is not empty")
    ap.add_argument("--no-torch-check", action="store_true",
                    help="do not import torch to check the name against its attributes")
    args = ap.parse_args(argv)
    dest = args.dest.resolve()
    names = Names(args.name, args.namespace, args.cls, args.env_prefix)
    try:
        check_name(args.name, torch_check=not args.no_torch_check)
        check_options(names)
        warnings = collisions(names)
        written, kept = instantiate(names, dest, args.accelkit, args.force)
    except Refused as e:
        print(f"new_backend.py: refused: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"new_backend.py: failed: {e}", file=sys.stderr)
        return 1
    for w in warnings:
        print(f"new_backend.py: warning: {w}", file=sys.stderr)
    for p in kept:
        print(f"new_backend.py: kept {p}: an earlier run wrote it and the template no longer has "
              "it, but it has changed since (or the manifest gives no digest for it)")
    print(f"new_backend.py: {args.name} ({names.namespace}::{names.cls}, device '{args.name}', "
          f"{names.env_prefix}_* options, package torch_{args.name}): {len(written)} files in "
          f"{dest}")
    print(f"  next: cmake -S {dest} -B {dest}/build -G Ninja && cmake --build {dest}/build && "
          f"ctest --test-dir {dest}/build   (see {dest}/README.md)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
