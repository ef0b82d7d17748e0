#!/usr/bin/env bash
# Build and install robot_wm's ROS interfaces (msg/, srv/) into a pip venv that holds the ROS 2
# wheels ("pip path"; the colcon path is .ci/colcon_check.sh).
#
#   tools/build_interfaces.sh VENV_DIR        e.g. tools/build_interfaces.sh .venv
#
# Installs robot_wm/{msg,srv} (+ typesupport libs, share/robot_wm, lib/robot_wm) into VENV_DIR.
# The Python code itself is installed by pip (`pip install -e .`), hence ROBOT_WM_INSTALL_PYTHON=OFF.
# Idempotent: skips everything when the inputs (hash in build/interfaces/.robot_wm_stamp) are
# unchanged and the installed module still imports. Set ROBOT_WM_FORCE_BUILD=1 to rebuild anyway.
#
# First, for each interface package no wheel provides (`controller_manager_msgs`: srv/SwitchController
# for the command watchdog; `tf2_msgs`: msg/TFMessage for the state publisher's /tf), when it is not
# importable, it builds the stand-in in tools/interfaces/<pkg> into VENV_DIR the same way. A stand-in
# installed by this script carries a stamp in VENV_DIR/share/<pkg> and is rebuilt when its sources
# change; a package from elsewhere (a sourced ROS install) is left alone.
set -euo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 VENV_DIR" >&2
  exit 2
fi
VENV="$(cd "$1" && pwd -P)"
PY="$VENV/bin/python"
if [[ ! -x "$PY" ]]; then
  echo "build_interfaces: $PY not found (is '$1' a venv?)" >&2
  exit 2
fi

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
BUILD="$REPO/build/interfaces"
STAMP="$BUILD/.robot_wm_stamp"
mkdir -p "$BUILD"

# One build at a time per checkout (several engineers/tests may call this concurrently).
exec 9>"$REPO/build/.interfaces.lock"
flock 9

# Hash of everything the install depends on. Data dirs are included so share/robot_wm in the venv
# never goes stale; file names are part of the hash, so adding/removing a script triggers a rebuild.
inputs_hash() {
  (
    cd "$REPO"
    echo "venv=$VENV"
    sha256sum "tools/build_interfaces.sh" CMakeLists.txt package.xml
    local dirs=() d
    for d in msg srv cmake launch config urdf models scripts; do
      if [[ -d "$d" ]]; then dirs+=("$d"); fi  # empty dirs are not in git: a clone may lack some
    done
    find "${dirs[@]}" -type f ! -name '*.pyc' ! -path '*/__pycache__/*' -print0 \
      | LC_ALL=C sort -z | xargs -0 -r sha256sum
    sha256sum robot_wm/__init__.py
  ) | sha256sum | cut -d' ' -f1
}

# Proves the installed (site-packages) module loads, independent of the source tree: run from /.
import_check() {
  (cd / && "$PY" -c '
from robot_wm.msg import WorldModelPrediction, SafetyStatus, TrustState, ModelUpdate, EpisodeResult, InterventionRequest, InterventionState
from robot_wm.srv import InjectFault, PhaseChange, Intervention
SafetyStatus(); InjectFault.Request(); PhaseChange.Request(); InterventionState()  # loads the C typesupport extension
' >/dev/null 2>&1)
}

# The wheels do not set these; rosidl finds its typesupports through the ament index.
export AMENT_PREFIX_PATH="$VENV${AMENT_PREFIX_PATH:+:$AMENT_PREFIX_PATH}"
export CMAKE_PREFIX_PATH="$VENV${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
export PATH="$VENV/bin:$PATH"

# ---- stand-ins for interface packages no wheel provides (pip path only) ----
# tools/interfaces/<pkg>: controller_manager_msgs (SwitchController, for the command watchdog) and
# tf2_msgs (TFMessage, for the state publisher's /tf). Each is built only when <pkg> is not already
# importable from elsewhere (a sourced ROS install); ours carry a stamp in VENV/share/<pkg>.
standin_import_check() {  # PKG IMPORT_CODE
  (cd / && "$PY" -c "$2" >/dev/null 2>&1)
}

standin_inputs_hash() {  # PKG
  (
    cd "$REPO"
    echo "venv=$VENV"
    sha256sum tools/build_interfaces.sh cmake/pip_wheels_fixups.cmake
    find "tools/interfaces/$1" -type f -print0 | LC_ALL=C sort -z | xargs -0 -r sha256sum
  ) | sha256sum | cut -d' ' -f1
}

build_standin() {  # PKG IMPORT_CODE (the import also loads the C typesupport extension)
  local pkg="$1" code="$2" hash
  local src="$REPO/tools/interfaces/$pkg" build="$REPO/build/$pkg" stamp="$VENV/share/$pkg/.robot_wm_stamp"
  fail() { echo "build_interfaces: $pkg: $1" >&2; exit 1; }
  hash="$(standin_inputs_hash "$pkg")"
  if standin_import_check "$pkg" "$code"; then
    if [[ ! -f "$stamp" ]]; then
      echo "build_interfaces: $pkg is already importable (not the stand-in): leaving it alone"
      return 0
    fi
    if [[ -z "${ROBOT_WM_FORCE_BUILD:-}" && "$(cat "$stamp")" == "$hash" ]]; then
      echo "build_interfaces: $pkg stand-in up to date ($VENV)"
      return 0
    fi
  fi
  mkdir -p "$build"
  if [[ -f "$build/CMakeCache.txt" ]] && \
     ! grep -qxF "CMAKE_INSTALL_PREFIX:PATH=$VENV" "$build/CMakeCache.txt"; then
    find "$build" -mindepth 1 -delete
  fi
  echo "build_interfaces: building the $pkg stand-in into $VENV"
  rm -f "$stamp"
  cmake -S "$src" -B "$build" \
    -DCMAKE_PREFIX_PATH="$VENV" \
    -DCMAKE_INSTALL_PREFIX="$VENV" \
    -DPython3_EXECUTABLE="$PY" \
    -DROBOT_WM_CMAKE_DIR="$REPO/cmake" \
    -DBUILD_TESTING=OFF \
    -DCMAKE_BUILD_TYPE=Release >"$build/configure.log" 2>&1 \
    || { cat "$build/configure.log" >&2; fail "cmake configure failed"; }
  cmake --build "$build" -j2 >"$build/build.log" 2>&1 \
    || { tail -n 60 "$build/build.log" >&2; fail "build failed"; }
  cmake --install "$build" >"$build/install.log" 2>&1 \
    || { tail -n 60 "$build/install.log" >&2; fail "install failed"; }
  if ! standin_import_check "$pkg" "$code"; then
    (cd / && "$PY" -c "$code") >&2 || true
    fail "installed, but '$code' fails (above)"
  fi
  mkdir -p "$(dirname "$stamp")"
  echo "$hash" >"$stamp"
  echo "build_interfaces: $pkg stand-in done ($VENV)"
}

build_standin controller_manager_msgs \
  'from controller_manager_msgs.srv import SwitchController; SwitchController.Request(); SwitchController.Response()'
build_standin tf2_msgs 'from tf2_msgs.msg import TFMessage; TFMessage()'

# ---- robot_wm interfaces ----
HASH="$(inputs_hash)"
if [[ -z "${ROBOT_WM_FORCE_BUILD:-}" && -f "$STAMP" && "$(cat "$STAMP")" == "$HASH" ]] && import_check; then
  echo "build_interfaces: up to date ($VENV)"
  exit 0
fi

# A build dir configured for another venv caches that venv's package paths: start over.
if [[ -f "$BUILD/CMakeCache.txt" ]] && \
   ! grep -qxF "CMAKE_INSTALL_PREFIX:PATH=$VENV" "$BUILD/CMakeCache.txt"; then
  echo "build_interfaces: build dir was configured for another prefix; cleaning it"
  find "$BUILD" -mindepth 1 -delete
fi

echo "build_interfaces: building robot_wm interfaces into $VENV"
rm -f "$STAMP"
cmake -S "$REPO" -B "$BUILD" \
  -DCMAKE_PREFIX_PATH="$VENV" \
  -DCMAKE_INSTALL_PREFIX="$VENV" \
  -DPython3_EXECUTABLE="$PY" \
  -DROBOT_WM_INSTALL_PYTHON=OFF \
  -DBUILD_TESTING=OFF \
  -DCMAKE_BUILD_TYPE=Release >"$BUILD/configure.log" 2>&1 \
  || { cat "$BUILD/configure.log" >&2; echo "build_interfaces: cmake configure failed" >&2; exit 1; }
grep -E "^-- robot_wm:|^    [A-Za-z_]+::" "$BUILD/configure.log" || true
cmake --build "$BUILD" -j2 >"$BUILD/build.log" 2>&1 \
  || { tail -n 60 "$BUILD/build.log" >&2; echo "build_interfaces: build failed" >&2; exit 1; }
cmake --install "$BUILD" >"$BUILD/install.log" 2>&1 \
  || { tail -n 60 "$BUILD/install.log" >&2; echo "build_interfaces: install failed" >&2; exit 1; }

if ! import_check; then
  echo "build_interfaces: installed, but 'import robot_wm.msg' from $VENV fails:" >&2
  (cd / && "$PY" -c 'from robot_wm.msg import SafetyStatus; SafetyStatus()') >&2 || true
  exit 1
fi
echo "$HASH" >"$STAMP"
echo "build_interfaces: done ($VENV)"
