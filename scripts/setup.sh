#!/usr/bin/env bash
# Installs what accelkit's build needs, configures and builds it. Sourced by
# scripts/demo and scripts/test; each step is skipped when already done.
# ACCELKIT_SETUP=demo (scripts/demo) builds only simdev's wheel, what the demo
# runs; otherwise (scripts/test) every target is built as well.
#   Debian packages: cmake, g++, ninja, ccache, fmt, Catch2, OpenCL/PoCL, Vulkan/lavapipe,
#                    glslang, iproute2
#   .venv:           torch==2.13.0 (the CPU wheel on this machine), pytest, numpy,
#                    expecttest (PyTorch's operator database needs it),
#                    scikit-build-core (builds backends' wheels); for the test
#                    command also mkdocs (and Debian's doxygen): the docs site,
#                    and torchao==0.18.0 without dependencies (install_torchao)
#   build/:          configured with Ninja and ccache, then built; on a fresh
#                    clone the test command builds the targets that need no
#                    PyTorch while pip installs the venv (build_without_torch)
#   simdev:          its pip package (build/packages/torch_simdev, built in
#                    build.wheel.torch_simdev) installed into .venv, so that
#                    `import torch` there loads it (autoload)
set -euo pipefail

ACCELKIT_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ACCELKIT_BUILD="${ACCELKIT_BUILD:-$ACCELKIT_ROOT/build}"
case "$ACCELKIT_BUILD" in /*) ;; *) ACCELKIT_BUILD="$PWD/$ACCELKIT_BUILD" ;; esac
ACCELKIT_VENV="$ACCELKIT_ROOT/.venv"
# simdev's wheel is configured and built (scikit-build-core's build-dir) in
# <build>.wheel.torch_simdev when the build folder sits in the checkout, so
# that its compile commands, relative to the folder (CCACHE_BASEDIR below),
# are the build's, and ccache serves them; elsewhere in scikit-build-core's
# default, <build>/packages/torch_simdev/build. tests/CMakeLists.txt's
# python.simdev.autoload builds it again in the same folder, by the same rule.
ACCELKIT_WHEEL_BUILD=""
if [ "$(dirname "$ACCELKIT_BUILD")" = "$ACCELKIT_ROOT" ]; then
  ACCELKIT_WHEEL_BUILD="$ACCELKIT_BUILD.wheel.torch_simdev"
fi
TORCH_VERSION=2.13.0

# ccache keys objects with debug information by their build directory too
# (hash_dir); without it, the wheel's build and the build-option tests get
# this build's objects (Note [One registration source for every build tree]).
export CCACHE_NOHASHDIR=1
# ccache also keys objects by the absolute paths on their command lines. With
# the checkout as its base directory it keys them by the paths relative to
# the build folder instead, so that a build in another clone (CI's) and
# builds that sit at the same place relative to the sources (the build-option
# builds, beside build/; the skeleton's builds and its wheel, siblings under
# build/) get the objects compiled once.
export CCACHE_BASEDIR="$ACCELKIT_ROOT"

log() { printf '[accelkit setup] %s\n' "$*" >&2; }

install_debian_packages() {
  # OpenCL (examples/opencl, tested on PoCL): the headers, the ICD loader and
  # PoCL's CPU device. Vulkan (examples/vulkan, tested on lavapipe): the
  # headers and loader, Mesa's CPU device and glslang (shaders to SPIR-V).
  # iproute2: `ip netns` for the distributed test across two network
  # namespaces. The test command also builds the documentation site, whose
  # API reference Doxygen makes.
  local wanted=(cmake g++ ninja-build ccache libfmt-dev catch2 python3
                opencl-headers ocl-icd-opencl-dev pocl-opencl-icd
                libvulkan-dev mesa-vulkan-drivers glslang-tools iproute2) missing=()
  [ "${ACCELKIT_SETUP:-test}" = demo ] || wanted+=(doxygen)
  for pkg in "${wanted[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" \
      || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return
  local sudo=()
  [ "$(id -u)" -ne 0 ] && sudo=(sudo)
  log "installing Debian packages: ${missing[*]}"
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
}

# The venv's packages the set-up needs that are missing or of another
# version, one pip requirement a line (none: the venv is complete).
missing_venv_packages() {
  local py="$ACCELKIT_VENV/bin/python"
  if ! "$py" - "$TORCH_VERSION" <<'PY' 2>/dev/null
import sys, importlib.metadata as m
assert m.version("torch").split("+")[0] == sys.argv[1]
m.version("pytest"); m.version("numpy"); m.version("expecttest")
m.version("scikit-build-core")
PY
  then
    # Pinned: this version is the CPU wheel on this machine's disk; any other
    # pulls a CUDA build of several GB.
    printf '%s\n' "torch==$TORCH_VERSION" pytest numpy expecttest scikit-build-core
  fi
  # The documentation site's generator, for the test command's docs.site.
  if [ "${ACCELKIT_SETUP:-test}" != demo ] && ! "$py" -c \
       'import importlib.metadata as m; assert m.version("mkdocs") == "1.6.1"' 2>/dev/null; then
    echo "mkdocs==1.6.1"
  fi
}

create_venv() {
  if [ ! -x "$ACCELKIT_VENV/bin/python" ]; then
    log "creating $ACCELKIT_VENV"
    python3 -m venv "$ACCELKIT_VENV"
  fi
}

# Installs what missing_venv_packages lists, in one pip run.
install_venv() {
  create_venv
  local missing=()
  mapfile -t missing < <(missing_venv_packages)
  [ ${#missing[@]} -eq 0 ] && return
  log "installing ${missing[*]} into $ACCELKIT_VENV"
  "$ACCELKIT_VENV/bin/pip" install -q --disable-pip-version-check "${missing[@]}"
}

# torchao's prepare_pt2e/convert_pt2e, for the PT2E model of
# tests/python/test_quantized.py: PyTorch 2.13 no longer ships them in
# torch.ao. Pinned (0.18.0 works with torch 2.13) and installed without
# dependencies: it requires none, and pip must never replace the pinned torch.
install_torchao() {
  [ "${ACCELKIT_SETUP:-test}" = demo ] && return
  "$ACCELKIT_VENV/bin/python" -c \
    'import importlib.metadata as m; assert m.version("torchao") == "0.18.0"' 2>/dev/null && return
  log "installing torchao==0.18.0 (without dependencies) into $ACCELKIT_VENV"
  "$ACCELKIT_VENV/bin/pip" install -q --disable-pip-version-check --no-deps torchao==0.18.0
}

# Configures the build folder where it has no build.ninja yet, or where
# the set-up configured it without PyTorch (build_without_torch, below).
configure() {
  local pending="$ACCELKIT_BUILD/accelkit-setup-torch-pending"
  if [ ! -f "$ACCELKIT_BUILD/build.ninja" ] || [ -f "$pending" ]; then
    log "configuring $ACCELKIT_BUILD"
    local torch_prefix
    torch_prefix="$("$ACCELKIT_VENV/bin/python" -c \
      'import torch.utils; print(torch.utils.cmake_prefix_path)' 2>/dev/null)"
    cmake -S "$ACCELKIT_ROOT" -B "$ACCELKIT_BUILD" -G Ninja \
      -DCMAKE_BUILD_TYPE=RelWithDebInfo -DACCELKIT_WERROR=ON \
      -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DACCELKIT_WITH_TORCH=ON \
      -DCMAKE_PREFIX_PATH="$torch_prefix" \
      -DPython3_EXECUTABLE="$ACCELKIT_VENV/bin/python" >/dev/null
    rm -f "$pending"
  fi
}

# A fresh clone's test command: pip spends minutes installing PyTorch on
# one CPU (most of it waiting on downloads and the disk), and nothing of the
# build needs PyTorch but its adapters and the backends' modules. So pip runs
# in the background while the build folder, configured without PyTorch
# (ACCELKIT_WITH_TORCH=OFF, so that no half-installed torch is looked for),
# builds every other target; configure, after pip, adds the PyTorch targets
# to the same folder, whose other objects stay as they are. A stamp marks
# the folder until then, so that an interrupted set-up configures it again.
build_without_torch() {
  mkdir -p "$ACCELKIT_BUILD"
  local pip_log="$ACCELKIT_BUILD/accelkit-setup-pip.log"
  install_venv >"$pip_log" 2>&1 &
  local pip_pid=$!
  touch "$ACCELKIT_BUILD/accelkit-setup-torch-pending"
  log "building the targets without PyTorch while pip installs into $ACCELKIT_VENV (log: $pip_log)"
  if ! { cmake -S "$ACCELKIT_ROOT" -B "$ACCELKIT_BUILD" -G Ninja \
           -DCMAKE_BUILD_TYPE=RelWithDebInfo -DACCELKIT_WERROR=ON \
           -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DACCELKIT_WITH_TORCH=OFF \
           -DPython3_EXECUTABLE="$ACCELKIT_VENV/bin/python" >/dev/null &&
         cmake --build "$ACCELKIT_BUILD"; }; then
    kill "$pip_pid" 2>/dev/null || true
    wait "$pip_pid" 2>/dev/null || true
    return 1
  fi
  if ! wait "$pip_pid"; then
    cat "$pip_log" >&2
    log "pip failed (above)"
    return 1
  fi
}

# simdev's pip package, made by accelkit_add_torch_backend: pip builds its
# wheel with scikit-build-core against the venv's torch (no build isolation,
# which would fetch a torch of its own; no dependency resolution, which could
# replace the pinned torch) in $ACCELKIT_WHEEL_BUILD (above), and installs
# it. Skipped while nothing it is built from changed since the last install.
# Autoload is off for the build, whose CMake may import torch: an installed
# simdev that is out of date must not be what it loads.
install_simdev() {
  local pkg="$ACCELKIT_BUILD/packages/torch_simdev"
  local stamp="$ACCELKIT_BUILD/packages/torch_simdev.installed"
  local site
  site="$("$ACCELKIT_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  # Earlier set-ups put build/python on the venv's path instead.
  rm -f "$site/accelkit_build.pth"
  if [ -f "$stamp" ] && "$ACCELKIT_VENV/bin/python" -c \
       'import importlib.metadata as m; m.version("torch-simdev")' 2>/dev/null \
     && [ -z "$(find "$ACCELKIT_ROOT/include" "$ACCELKIT_ROOT/python" "$ACCELKIT_ROOT/cmake" "$ACCELKIT_ROOT/src" \
                  "$ACCELKIT_ROOT/examples/simdev" "$pkg/pyproject.toml" -newer "$stamp" \
                  -print -quit)" ]; then
    return
  fi
  log "building simdev's wheel and installing it into $ACCELKIT_VENV"
  TORCH_DEVICE_BACKEND_AUTOLOAD=0 "$ACCELKIT_VENV/bin/pip" install -q --disable-pip-version-check \
    --no-build-isolation --no-deps --force-reinstall \
    ${ACCELKIT_WHEEL_BUILD:+--config-settings=build-dir="$ACCELKIT_WHEEL_BUILD"} "$pkg"
  touch "$stamp"
}

install_debian_packages
create_venv
if [ "${ACCELKIT_SETUP:-test}" != demo ] && [ ! -f "$ACCELKIT_BUILD/build.ninja" ] \
   && [ -n "$(missing_venv_packages)" ]; then
  build_without_torch
fi
install_venv
install_torchao
configure  # also writes simdev's package (build/packages/torch_simdev)
if [ "${ACCELKIT_SETUP:-test}" != demo ]; then
  cmake --build "$ACCELKIT_BUILD"
fi
install_simdev
