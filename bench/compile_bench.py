"""Compile time of a backend's registration: the translation units that
accelkit_add_torch_backend compiles for a backend (taken from the build's own
compile commands, the compiler launcher such as ccache dropped) against a
translation unit that includes only <torch/extension.h>, compiled with the
same command (plus the Python include directory that extension.h needs), in
interleaved rounds. The units are the registration unit
(accelkit_register_backend.cpp, ACCELKIT_REGISTER_BACKEND(R): the one unit
compiled for each runtime) and the SDK's library part (accelkit_torch_*.cpp:
the torch adapters, compiled once per project and shared by its backends;
Note [Backend interface]). Prints per unit the median CPU time (user + system
of the compiler: on a loaded machine the wall time mostly measures the other
processes) and wall time, their spread (min-max), peak memory (the
compiler's maximum resident set) and the ratios to the extension.h baseline;
then the registration unit's ratio, the library part's, and the total CPU
time of all of them, with the CPU model and the load.

    python bench/compile_bench.py --build build --target torch_simdev [--rounds 3]

It asserts nothing about times (Note: benchmarks print figures). Run it on a
machine as quiet as can be: it runs one compiler at a time."""
import argparse
import os
import shlex
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from benchlib import cpu_model



def is_sdk_unit(src: str) -> bool:
    """The registration unit or a unit of the SDK's library part."""
    base = os.path.basename(src)
    return base == "accelkit_register_backend.cpp" or (
        base.startswith("accelkit_torch_") and base.endswith(".cpp"))


def registration_commands(build: str, target: str):
    """The compile commands of the target's registration unit and of the
    SDK's library part, the registration unit first."""
    out = subprocess.run(["ninja", "-C", build, "-t", "commands", target], check=True,
                         capture_output=True, text=True).stdout
    found = []
    for line in out.splitlines():
        args = shlex.split(line)
        if "-c" not in args:
            continue
        src = args[args.index("-c") + 1]
        if is_sdk_unit(src):
            found.append((src, args))
    found.sort(key=lambda u: os.path.basename(u[0]) != "accelkit_register_backend.cpp")
    if not found or os.path.basename(found[0][0]) != "accelkit_register_backend.cpp":
        sys.exit(f"no registration unit (accelkit_register_backend.cpp) in {target}'s commands")
    return found


def plain(args, src, obj):
    """The command without launcher and dependency files, compiling src into obj."""
    if os.path.basename(args[0]) in ("ccache", "sccache"):
        args = args[1:]
    out, skip = [], 0
    for i, a in enumerate(args):
        if skip:
            skip -= 1
            continue
        if a in ("-MD", "-MMD"):
            continue
        if a in ("-MT", "-MF", "-o"):
            skip = 1
            continue
        if a == "-c":
            skip = 1
            continue
        out.append(a)
    return out + ["-o", obj, "-c", src]


def phases(err):
    """GCC's -ftime-report phase lines (parsing, template instantiation, code generation)."""
    return [" ".join(l.split()) for l in err.splitlines() if l.strip().startswith("phase ")]


def timed(cmd, cwd):
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = p.stderr.read().decode(errors="replace")  # before waiting: a full pipe would block it
    p.stderr.close()
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    if status != 0:
        sys.exit(f"compile failed: {' '.join(cmd)}\n{err}")
    cpu = usage.ru_utime + usage.ru_stime
    return wall, cpu, usage.ru_maxrss / 1024 / 1024, phases(err)  # GiB (ru_maxrss is in KiB)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--target", default="torch_simdev")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--replace", action="append", default=[], metavar="OLD=NEW",
                    help="replace OLD by NEW in the registration's commands (to measure a "
                         "snapshot of the sources, e.g. a baseline's include directory)")
    ap.add_argument("--time-report", action="store_true",
                    help="compile with GCC's -ftime-report and print each unit's phases "
                         "(slightly slower: for finding what is heavy, not for figures)")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    units = registration_commands(build, a.target)
    for r in a.replace:
        old, new = r.split("=", 1)
        units = [(src.replace(old, new), [x.replace(old, new) for x in args])
                 for src, args in units]
    tmp = tempfile.mkdtemp(prefix="accelkit_compile_bench_")
    ext_src = os.path.join(tmp, "extension_only.cpp")
    with open(ext_src, "w") as f:
        f.write("#include <torch/extension.h>\n")
    first_args = units[0][1]
    ext_cmd = plain(first_args, ext_src, os.path.join(tmp, "ext.o"))
    ext_cmd.insert(1, "-I" + sysconfig.get_paths()["include"])
    cmds = [("torch/extension.h only", ext_cmd)]
    for i, (src, args) in enumerate(units):
        cmds.append((os.path.basename(src), plain(args, src, os.path.join(tmp, f"reg{i}.o"))))
    if a.time_report:
        cmds = [(n, c[:1] + ["-ftime-report"] + c[1:]) for n, c in cmds]
    print(f"compile bench: {a.rounds} interleaved rounds, one compiler at a time")
    print(f"cpu: {cpu_model()} ({os.cpu_count()} cpus), load average at start "
          f"{os.getloadavg()[0]:.2f}")
    print(f"compiler: {cmds[0][1][0]}")
    wall = {name: [] for name, _ in cmds}
    cpu = {name: [] for name, _ in cmds}
    mem = {name: [] for name, _ in cmds}
    for r in range(a.rounds):
        for name, cmd in cmds:
            w, c, m, ph = timed(cmd, build)
            for line in ph:
                print(f"    {name}: {line}")
            wall[name].append(w)
            cpu[name].append(c)
            mem[name].append(m)
        print(f"  round {r + 1} (cpu s/wall s/peak GiB): " +
              ", ".join(f"{n} {cpu[n][-1]:.1f}/{wall[n][-1]:.1f}/{mem[n][-1]:.2f}"
                        for n, _ in cmds), flush=True)
    print(f"load average at end {os.getloadavg()[0]:.2f}")
    med = statistics.median
    base = cmds[0][0]
    print(f"{'unit':40s} {'cpu s':>7s} {'min-max':>13s} {'ratio':>6s} {'wall s':>7s} "
          f"{'min-max':>13s} {'ratio':>6s} {'peak GiB':>9s}")
    for name, _ in cmds:
        print(f"{name:40s} {med(cpu[name]):7.1f} {min(cpu[name]):6.1f}-{max(cpu[name]):<6.1f} "
              f"{med(cpu[name]) / med(cpu[base]):6.2f} {med(wall[name]):7.1f} "
              f"{min(wall[name]):6.1f}-{max(wall[name]):<6.1f} "
              f"{med(wall[name]) / med(wall[base]):6.2f} {max(mem[name]):9.2f}")
    reg = cmds[1][0]
    lib = [n for n, _ in cmds[2:]]
    b = med(cpu[base])
    print(f"registration unit (compiled per runtime): cpu {med(cpu[reg]):.1f} s "
          f"({med(cpu[reg]) / b:.2f}x extension.h), peak {max(mem[reg]):.2f} GiB "
          f"against {max(mem[base]):.2f} GiB")
    if lib:
        lib_total = sum(med(cpu[n]) for n in lib)
        largest = max(med(cpu[n]) for n in lib)
        print(f"library part (compiled once per project), {len(lib)} unit(s): cpu sum "
              f"{lib_total:.1f} s ({lib_total / b:.2f}x), largest unit {largest:.1f} s "
              f"({largest / b:.2f}x); peak {max(max(mem[n]) for n in lib):.2f} GiB")
    total = sum(med(cpu[n]) for n, _ in cmds[1:])
    print(f"total, {len(cmds) - 1} unit(s): cpu {total:.1f} s ({total / b:.2f}x extension.h)")


if __name__ == "__main__":
    main()
