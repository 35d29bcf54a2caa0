#!/usr/bin/env bash
# Installs what accelkit's build needs, configures and builds it. Sourced by
# scripts/demo and scripts/test; each step is skipped when already done.
#   Debian packages: cmake, g++, ninja, ccache, fmt, Catch2
#   .venv:           torch==2.13.0 (the CPU wheel on this machine), pytest, numpy,
#                    expecttest (PyTorch's operator database needs it)
#   build/:          configured with Ninja and ccache, then built
set -euo pipefail

ACCELKIT_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ACCELKIT_BUILD="${ACCELKIT_BUILD:-$ACCELKIT_ROOT/build}"
ACCELKIT_VENV="$ACCELKIT_ROOT/.venv"
TORCH_VERSION=2.13.0

log() { printf '[accelkit setup] %s\n' "$*" >&2; }

install_debian_packages() {
  local wanted=(cmake g++ ninja-build ccache libfmt-dev catch2 python3) missing=()
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

install_venv() {
  local py="$ACCELKIT_VENV/bin/python"
  if [ ! -x "$py" ]; then
    log "creating $ACCELKIT_VENV"
    python3 -m venv "$ACCELKIT_VENV"
  fi
  if ! "$py" - "$TORCH_VERSION" <<'PY' 2>/dev/null
import sys, importlib.metadata as m
assert m.version("torch").split("+")[0] == sys.argv[1]
m.version("pytest"); m.version("numpy"); m.version("expecttest")
PY
  then
    # Pinned: this version is the CPU wheel on this machine's disk; any other
    # pulls a CUDA build of several GB.
    log "installing torch==$TORCH_VERSION, pytest, numpy and expecttest into $ACCELKIT_VENV"
    "$ACCELKIT_VENV/bin/pip" install -q --disable-pip-version-check \
      "torch==$TORCH_VERSION" pytest numpy expecttest
  fi
}

configure_and_build() {
  if [ ! -f "$ACCELKIT_BUILD/build.ninja" ]; then
    log "configuring $ACCELKIT_BUILD"
    local torch_prefix
    torch_prefix="$("$ACCELKIT_VENV/bin/python" -c \
      'import torch.utils; print(torch.utils.cmake_prefix_path)' 2>/dev/null)"
    cmake -S "$ACCELKIT_ROOT" -B "$ACCELKIT_BUILD" -G Ninja \
      -DCMAKE_BUILD_TYPE=RelWithDebInfo -DACCELKIT_WERROR=ON \
      -DCMAKE_CXX_COMPILER_LAUNCHER=ccache \
      -DCMAKE_PREFIX_PATH="$torch_prefix" \
      -DPython3_EXECUTABLE="$ACCELKIT_VENV/bin/python" >/dev/null
  fi
  cmake --build "$ACCELKIT_BUILD"
  # `import torch_simdev` in the venv finds the package the build made.
  local site
  site="$("$ACCELKIT_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  local pth="$site/accelkit_build.pth"
  if [ "$(cat "$pth" 2>/dev/null)" != "$ACCELKIT_BUILD/python" ]; then
    echo "$ACCELKIT_BUILD/python" > "$pth"
  fi
}

install_debian_packages
install_venv
configure_and_build
