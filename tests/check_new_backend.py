"""scripts/new_backend.py refuses bad names and bad destinations clearly,
and replaces the template's name everywhere (ctest: consumer.skeleton.names); and, with --pyproject, that the new
project's generated pip package carries its settings (consumer.skeleton.pyproject).
--namespace, --class and --env-prefix choose those names (the SDK's
variables keep following the name), bad ones are refused, and names that
collide with well-known libraries or PyTorch get a warning on stderr
naming the library and the option (Note [Names that collide]).

    check_new_backend.py WORK_DIR
    check_new_backend.py --pyproject PYPROJECT_TOML ACCELKIT_FETCH NAME

Each refusal must exit 2 with a message naming the offending value; a good
name must leave no trace of the template's `skel` in any file name or
content (the accelkit location written into CMakeLists.txt aside, a path
that may contain anything) and give the CamelCase class of a name with
underscores. Prints "new_backend: ok"."""
import contextlib
import hashlib
import importlib.util
import io
import re
import shutil
import subprocess
import sys
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
    """The command's main() in this process (a Python start per case costs
    seconds under load): its exit status and what it printed."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = NEW_BACKEND.main(list(args))
        except SystemExit as e:  # argparse
            code = e.code
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def check_pyproject(path, accelkit, name):
    """The pip package generated in the new project's build carries where
    accelkit comes from, the project's torch option and the autoload entry
    point (its wheel's configure starts from these alone)."""
    text = Path(path).read_text()
    for want in (f"ACCELKIT_FETCH = '{accelkit}'", f"{name.upper()}_WITH_TORCH = 'ON'",
                 f"{name} = 'torch_{name}:_autoload'", "[project.entry-points.'torch.backends']"):
        if want not in text:
            problems.append(f"{path} lacks {want!r}")


def check_options(work):
    """The namespace (nested here), the class and the prefix as asked; the
    SDK's variables from the name."""
    dest = work / "vkdev"
    r = run("vkdev", "--dest", str(dest), "--no-torch-check", "--namespace", "vkdev::rt",
            "--class", "VulkanRuntime", "--env-prefix", "VKD")
    if r.returncode != 0 or "warning" in r.stderr:
        problems.append(f"vkdev with options: exit {r.returncode}: {r.stderr!r}")
        return
    wanted = {
        "src/vkdev_runtime.hpp": ["namespace vkdev::rt {", "}  // namespace vkdev::rt",
                                  "class VulkanRuntime : public accelkit::Runtime<VulkanRuntime>",
                                  'name = "vkdev"', "VKDEV_VISIBLE_DEVICES", "VKDEV_ALLOC_CONF",
                                  "VKD_DEVICE_COUNT"],
        "src/vkdev_report.cpp": ["Backend<vkdev::rt::VulkanRuntime>"],
        "tests/vkdev_kit.cpp": ["ACCELKIT_CONFORMANCE_SUITE(vkdev::rt::VulkanRuntime)"],
        "CMakeLists.txt": ["option(VKD_WITH_TORCH", "option(VKD_PYTHON_KIT",
                           "CLASS vkdev::rt::VulkanRuntime", "accelkit_add_torch_backend(vkdev",
                           "torch_vkdev", "VKD_WITH_TORCH=ON"],
        "README.md": ["-DVKD_WITH_TORCH=OFF", "torch.device(\"vkdev\")"],
    }
    for rel, wants in wanted.items():
        path = dest / rel
        text = path.read_text() if path.is_file() else ""
        for want in wants:
            if want not in text:
                problems.append(f"options: {rel} lacks {want!r}")
        for unwanted in ("VkdevRuntime", "VKDEV_WITH_TORCH", "VKDEV_DEVICE_COUNT", "namespace vkdev {"):
            if unwanted in text:
                problems.append(f"options: {rel} still has {unwanted!r}")
    # The renamed runtime compiles: the report program instantiates the SDK's
    # Backend<> with the nested namespace's class (a syntax check, seconds).
    compiler = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if compiler:
        r = subprocess.run([compiler, "-std=c++17", "-fsyntax-only", f"-I{ROOT / 'include'}",
                            f"-I{dest / 'src'}", str(dest / "src" / "vkdev_report.cpp")],
                           capture_output=True, text=True)
        if r.returncode != 0:
            problems.append(f"options: src/vkdev_report.cpp does not compile: {r.stderr[-2000:]}")
    refusals = [("--namespace", "vk dev"), ("--namespace", "std"), ("--namespace", "support"),
                ("--namespace", "a::"), ("--class", "9Runtime"), ("--class", "class"),
                ("--env-prefix", "vkd"), ("--env-prefix", "VKD_")]
    for option, value in refusals:
        r = run("vkdev", "--dest", str(work / "refused_option"), "--no-torch-check", option, value)
        if r.returncode != 2 or f"'{value}'" not in r.stderr:
            problems.append(f"{option} {value!r}: exit {r.returncode}, said {r.stderr!r}")
        if (work / "refused_option").exists():
            problems.append(f"{option} {value!r}: refused, yet {work / 'refused_option'} was written")


def check_warnings(work):
    """Each colliding name: one warning naming it, the library and the
    option that changes it; the project is written all the same."""
    cases = [
        (["vk"], ["namespace 'vk'", "Vulkan-Hpp", "--namespace", "class 'VkRuntime'",
                  "Vulkan's types", "--class", "--env-prefix 'VK'", "VK_ is the Vulkan loader's",
                  "VK_VISIBLE_DEVICES", "only another name"]),
        (["acme", "--namespace", "cl", "--class", "CUAcme", "--env-prefix", "CUDA_ACME"],
         ["namespace 'cl'", "OpenCL", "class 'CUAcme'", "CUDA driver API",
          "--env-prefix 'CUDA_ACME'", "CUDA_ is CUDA's"]),
        (["acme", "--namespace", "acme::xpu", "--class", "MTLAcme", "--env-prefix", "TORCH"],
         ["'xpu' is one of PyTorch's device types", "class 'MTLAcme'", "Metal",
          "TORCH_ is PyTorch's"]),
        (["acme", "--namespace", "mtl", "--env-prefix", "ZE"],
         ["namespace 'mtl'", "metal-cpp", "ZE_ is Level Zero's"]),
        (["acme", "--namespace", "vulkan", "--env-prefix", "PYTORCH_ACME"],
         ["namespace 'vulkan'", "PYTORCH_ is PyTorch's"]),
    ]
    for i, (args, wants) in enumerate(cases):
        dest = work / f"collides{i}"
        r = run(*args, "--dest", str(dest), "--no-torch-check")
        if r.returncode != 0 or not (dest / "CMakeLists.txt").is_file():
            problems.append(f"{args}: exit {r.returncode}, project not written: {r.stderr!r}")
        warnings = [line for line in r.stderr.splitlines() if "new_backend.py: warning:" in line]
        for want in wants:
            if want not in r.stderr:
                problems.append(f"{args}: no warning saying {want!r}: {r.stderr!r}")
        if not warnings or "warning" in r.stdout:
            problems.append(f"{args}: warnings not on stderr alone: {r.stdout!r} {r.stderr!r}")
    # Lookalikes that collide with nothing stay quiet.
    r = run("acme", "--dest", str(work / "quiet"), "--no-torch-check", "--namespace", "vkdev",
            "--class", "VulkanRuntime", "--env-prefix", "CUSTOM", )
    if r.returncode != 0 or "warning" in r.stderr:
        problems.append(f"vkdev/VulkanRuntime/CUSTOM warned: {r.stderr!r}")
    r = run("acme", "--dest", str(work / "quiet2"), "--no-torch-check", "--class", "Client")
    if r.returncode != 0 or "warning" in r.stderr:
        problems.append(f"class Client warned: {r.stderr!r}")


def main():
    if sys.argv[1] == "--pyproject":
        check_pyproject(*sys.argv[2:5])
        for p in problems:
            print("problem:", p)
        if not problems:
            print("pyproject: ok")
        return 1 if problems else 0
    work = Path(sys.argv[1])
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    refusals = [
        ("Acme", "lower-case identifier"), ("1acme", "lower-case identifier"),
        ("acme-gpu", "lower-case identifier"), ("", "lower-case identifier"),
        ("a" * 33, "at most 32"), ("acme__gpu", "double or trailing underscore"),
        ("acme_", "double or trailing underscore"), ("cuda", "PyTorch's own device types"),
        ("privateuseone", "PyTorch's own device types"), ("namespace", "keyword"),
        ("lambda", "keyword"), ("nn", "torch.nn already exists"),
    ]
    for name, why in refusals:
        r = run(name, "--dest", str(work / "refused"))
        said = r.stderr.strip()
        if r.returncode != 2 or why not in said or f"'{name}'" not in said and "torch." not in said:
            problems.append(f"{name!r}: exit {r.returncode}, said {said!r} (wanted {why!r})")
        if (work / "refused").exists():
            problems.append(f"{name!r}: refused, yet {work / 'refused'} was written")

    good = work / "acme_gpu"
    r = run("acme_gpu", "--dest", str(good), "--no-torch-check", "--accelkit", "/opt/sdk-skel")
    if r.returncode != 0:
        problems.append(f"acme_gpu: exit {r.returncode}: {r.stderr}")
    again = run("acme_gpu", "--dest", str(good), "--no-torch-check")
    if again.returncode != 2 or "not empty" not in again.stderr or str(good) not in again.stderr:
        problems.append(f"a second run into {good} was not refused: {again.stderr!r}")
    files = [p for p in good.rglob("*") if p.is_file()]
    if len(files) < 6:
        problems.append(f"only {len(files)} files written")
    for p in files:
        rel = p.relative_to(good).as_posix()
        text = p.read_text()
        if rel == "CMakeLists.txt":
            if 'set(ACCELKIT_FETCH "/opt/sdk-skel"' not in text:
                problems.append("--accelkit was not written as ACCELKIT_FETCH's default")
            text = text.replace("/opt/sdk-skel", "")
        for m in re.finditer(r"(?i)skel", rel + "\n" + text):
            problems.append(f"{rel}: the template's name is left: ...{(rel + text)[m.start() - 20:m.end() + 20]!r}")
            break
    runtime = good / "src" / "acme_gpu_runtime.hpp"
    if not runtime.is_file():
        problems.append("no src/acme_gpu_runtime.hpp")
    else:
        text = runtime.read_text()
        for want in ("namespace acme_gpu", "class AcmeGpuRuntime", 'name = "acme_gpu"',
                     "ACME_GPU_VISIBLE_DEVICES"):
            if want not in text:
                problems.append(f"acme_gpu_runtime.hpp lacks {want!r}")
    cmake = (good / "CMakeLists.txt").read_text()
    for want in ("option(ACME_GPU_WITH_TORCH", "accelkit_add_torch_backend(acme_gpu",
                 "CLASS acme_gpu::AcmeGpuRuntime", "acme_gpu.kit.cpp"):
        if want not in cmake:
            problems.append(f"CMakeLists.txt lacks {want!r}")

    if "warning" in r.stderr:
        problems.append(f"acme_gpu: warned about a name no library uses: {r.stderr!r}")
    check_options(work)
    check_warnings(work)

    # --force writes the template's files again and removes only what an
    # earlier run wrote and the template no longer has: the vendor's own
    # files and .git stay.
    own = good / "src" / "acme_gpu_kernels.cpp"
    own.write_text("// the vendor's own\n")
    head = good / ".git" / "HEAD"
    head.parent.mkdir()
    head.write_text("ref: refs/heads/main\n")
    (good / "CMakeLists.txt").write_text("edited\n")
    dropped = good / "dropped_by_the_template.txt"
    dropped.write_text("from an older template\n")
    manifest = good / ".accelkit-template-files"
    if not manifest.is_file():
        problems.append("no .accelkit-template-files manifest written")
    else:
        manifest.write_text(manifest.read_text() + hashlib.sha256(dropped.read_bytes()).hexdigest()
                            + "  dropped_by_the_template.txt\n")
    r = run("acme_gpu", "--dest", str(good), "--no-torch-check", "--accelkit", "/opt/sdk-skel",
            "--force")
    if r.returncode != 0:
        problems.append(f"--force: exit {r.returncode}: {r.stderr}")
    if not own.is_file() or own.read_text() != "// the vendor's own\n":
        problems.append("--force removed or changed a file of the vendor's own")
    if not head.is_file():
        problems.append("--force removed .git")
    if "accelkit_add_torch_backend(acme_gpu" not in (good / "CMakeLists.txt").read_text():
        problems.append("--force did not write the template's CMakeLists.txt again")
    if dropped.exists():
        problems.append("--force kept a file an earlier run wrote that the template no longer has")
    for p in problems:
        print("problem:", p)
    if not problems:
        print("new_backend: ok")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
