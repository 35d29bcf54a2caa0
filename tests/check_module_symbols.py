"""A backend's module exports none of the SDK's adapters (ctest:
python.module_symbols): every symbol of namespace torch_adapter, the
module's bound backend among them, is hidden (Note [Backend interface]), so that the
adapters of two backends' modules in one process never share a
function-local static (GCC makes those STB_GNU_UNIQUE, which the dynamic
linker unifies across libraries) nor call each other's functions.

    python tests/check_module_symbols.py <module.so> [<pattern>]

Lists the module's exported definitions (nm -D --defined-only) and fails,
naming them, if one contains <pattern> (default torch_adapter::) or is the
bound backend; prints how many symbols of the SDK it exports otherwise."""
import subprocess
import sys


def main() -> int:
    module = sys.argv[1]
    pattern = sys.argv[2] if len(sys.argv) > 2 else "torch_adapter::"
    out = subprocess.run(["nm", "-DC", "--defined-only", module], check=True,
                         capture_output=True, text=True).stdout.splitlines()
    bad = [l for l in out if pattern in l or "torch_adapter::backend()" in l]
    sdk = [l for l in out if "accelkit::" in l]
    if bad:
        print(f"{module} exports {len(bad)} symbol(s) naming {pattern} or the bound backend:")
        for l in bad[:20]:
            print("  ", l)
        return 1
    print(f"{module}: no exported symbol names {pattern} or the bound backend "
          f"({len(out)} exported definitions, {len(sdk)} of them accelkit's)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
