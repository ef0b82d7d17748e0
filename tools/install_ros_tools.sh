#!/usr/bin/env bash
# Install the real ROS 2 command line and launch system into a pip venv that holds the ROS 2 wheels:
# `ros2 launch`, `ros2 topic|service|param|node|lifecycle|interface|action|pkg|run`, launch_testing.
# None of them is on the package index; they install from upstream source archives (`git archive`
# snapshots, unmodified; see SOURCES.md in ../shared/vendor/ros2):
#
#   tools/install_ros_tools.sh SRC_DIR VENV_DIR     e.g. tools/install_ros_tools.sh ../shared/vendor/ros2 .venv
#
# SRC_DIR holds launch.tar.gz, launch_ros.tar.gz, ros2cli.tar.gz, composition_interfaces.tar.gz and
# rosidl_runtime_py.tar.gz. Their index dependencies are pinned in requirements-ros-tools.txt.
# composition_interfaces (imported by launch_ros) is an interface package: it is generated with the
# same CMake route and wheel fix-ups as robot_wm's own msg/ (tools/build_interfaces.sh), applied to an
# extracted copy. A .pth file puts the venv on AMENT_PREFIX_PATH for every Python started from it, so
# `ros2 launch robot_wm ...` and `ros2 run robot_wm ...` find the package (the wheels do not set it),
# and applies the loopback-only DDS settings, so that `ros2 topic hz` in a plain shell stays on 127.0.0.1.
#
# Idempotent: does nothing when the archives, this script and the pins are unchanged and the tools
# still import (stamp in VENV_DIR/.robot_wm-ros-tools). ROBOT_WM_FORCE_BUILD=1 reinstalls anyway.
# Exit status 3: SRC_DIR lacks the archives (the Makefile's optional route treats that as "skip").
set -euo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 SRC_DIR VENV_DIR" >&2
  exit 2
fi
ARCHIVES=(launch launch_ros ros2cli composition_interfaces rosidl_runtime_py)
if [[ ! -d "$1" ]]; then
  echo "install_ros_tools: source directory '$1' does not exist (set ROS2_TOOLS_SRC to a directory of the archives ${ARCHIVES[*]/%/.tar.gz})" >&2
  exit 3
fi
SRC="$(cd "$1" && pwd -P)"
missing=()
for a in "${ARCHIVES[@]}"; do [[ -f "$SRC/$a.tar.gz" ]] || missing+=("$a.tar.gz"); done
if [[ ${#missing[@]} -gt 0 ]]; then
  echo "install_ros_tools: $SRC lacks ${missing[*]}" >&2
  exit 3
fi
VENV="$(cd "$2" && pwd -P)"
PY="$VENV/bin/python"
if [[ ! -x "$PY" ]]; then
  echo "install_ros_tools: $PY not found (is '$2' a venv? run 'make setup' first)" >&2
  exit 2
fi
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
BUILD="$REPO/build/ros_tools"
STAMP="$VENV/.robot_wm-ros-tools"
mkdir -p "$BUILD"
exec 9>"$REPO/build/.ros_tools.lock"  # one install at a time per checkout
flock 9

inputs_hash() {
  (
    echo "venv=$VENV"
    cd "$REPO" && sha256sum tools/install_ros_tools.sh requirements-ros-tools.txt cmake/pip_wheels_fixups.cmake
    cd "$SRC" && sha256sum "${ARCHIVES[@]/%/.tar.gz}"
  ) | sha256sum | cut -d' ' -f1
}

# What `make test` relies on, checked from / so that nothing comes from the source tree.
tools_check() {
  (cd / && "$PY" -c '
import launch, launch_ros, launch_testing, launch_testing_ros, launch_pytest, ros2cli, rosidl_runtime_py
from composition_interfaces.srv import LoadNode
LoadNode.Request()  # loads the C typesupport extension
' >/dev/null 2>&1) && "$VENV/bin/ros2" pkg prefix robot_wm >/dev/null 2>&1
}

HASH="$(inputs_hash)"
if [[ -z "${ROBOT_WM_FORCE_BUILD:-}" && -f "$STAMP" && "$(cat "$STAMP")" == "$HASH" ]] && tools_check; then
  echo "install_ros_tools: up to date ($VENV)"
  exit 0
fi
rm -f "$STAMP"
echo "install_ros_tools: installing the ROS 2 CLI and launch system from $SRC into $VENV"

# Every Python started from the venv (the ros2 CLI, ros2 launch, the ros2 daemon) finds the venv's
# packages on the ament index (the venv first, then whatever the user set: a sourced ROS install keeps
# working) and keeps DDS on loopback like robot_wm's own processes (robot_wm/rosenv.py), unless
# ROBOT_WM_DDS=system. A .pth file runs it at interpreter start.
SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
cat >"$SITE/_robot_wm_ros_env.py" <<'EOF'
"""Written by robot_wm's tools/install_ros_tools.sh, run at every interpreter start in this venv."""
import os
import sys

_p = [x for x in os.environ.get("AMENT_PREFIX_PATH", "").split(os.pathsep) if x]
os.environ["AMENT_PREFIX_PATH"] = os.pathsep.join(_p if sys.prefix in _p else [sys.prefix] + _p)
if os.environ.get("ROBOT_WM_DDS") != "system":
    os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
    _profile = os.environ.get("ROBOT_WM_FASTDDS_PROFILE") or os.path.join(
        sys.prefix, "share", "robot_wm", "config", "fastdds_loopback.xml")
    if "FASTDDS_DEFAULT_PROFILES_FILE" not in os.environ and os.path.isfile(_profile):
        os.environ["FASTDDS_DEFAULT_PROFILES_FILE"] = _profile
EOF
echo "import _robot_wm_ros_env" >"$SITE/robot_wm_ros_env.pth"
rm -f "$SITE/robot_wm_ament_prefix.pth"  # the first version of this file
export AMENT_PREFIX_PATH="$VENV${AMENT_PREFIX_PATH:+:$AMENT_PREFIX_PATH}"
export CMAKE_PREFIX_PATH="$VENV${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
export PATH="$VENV/bin:$PATH"

"$PY" -m pip install -q -r "$REPO/requirements-ros-tools.txt"

rm -rf "$BUILD/src"
mkdir -p "$BUILD/src"
for a in "${ARCHIVES[@]}"; do tar -xzf "$SRC/$a.tar.gz" -C "$BUILD/src"; done

# ---- composition_interfaces: an interface package, generated like robot_wm's msg/ ----
if (cd / && "$PY" -c 'import composition_interfaces.srv' >/dev/null 2>&1) && \
   [[ ! -f "$VENV/share/composition_interfaces/.robot_wm_built" ]]; then
  echo "install_ros_tools: composition_interfaces is already importable (not built here): leaving it alone"
else
  CI_SRC="$BUILD/src/composition_interfaces/composition_interfaces"
  CI_BUILD="$BUILD/composition_interfaces"
  # the wheels' CMake exports carry the build machine's paths: apply robot_wm's fix-ups after the
  # generation (to the extracted copy; the archive stays as upstream made it)
  grep -q "rosidl_generate_interfaces" "$CI_SRC/CMakeLists.txt" \
    || { echo "install_ros_tools: $CI_SRC/CMakeLists.txt has no rosidl_generate_interfaces (unexpected source)" >&2; exit 1; }
  sed -i "s|^ament_export_dependencies(rosidl_default_runtime)|include(\"$REPO/cmake/pip_wheels_fixups.cmake\")\nrobot_wm_fix_pip_wheel_targets()\nrobot_wm_fix_exported_include_dirs(composition_interfaces__rosidl_generator_py)\n&|" \
    "$CI_SRC/CMakeLists.txt"
  rm -rf "$CI_BUILD" && mkdir -p "$CI_BUILD"
  cmake -S "$CI_SRC" -B "$CI_BUILD" -DCMAKE_PREFIX_PATH="$VENV" -DCMAKE_INSTALL_PREFIX="$VENV" \
    -DPython3_EXECUTABLE="$PY" -DBUILD_TESTING=OFF -DCMAKE_BUILD_TYPE=Release >"$CI_BUILD/configure.log" 2>&1 \
    || { cat "$CI_BUILD/configure.log" >&2; echo "install_ros_tools: composition_interfaces: cmake configure failed" >&2; exit 1; }
  cmake --build "$CI_BUILD" -j2 >"$CI_BUILD/build.log" 2>&1 \
    || { tail -n 60 "$CI_BUILD/build.log" >&2; echo "install_ros_tools: composition_interfaces: build failed" >&2; exit 1; }
  cmake --install "$CI_BUILD" >"$CI_BUILD/install.log" 2>&1 \
    || { tail -n 60 "$CI_BUILD/install.log" >&2; echo "install_ros_tools: composition_interfaces: install failed" >&2; exit 1; }
  touch "$VENV/share/composition_interfaces/.robot_wm_built"
fi

# ---- the Python packages, in dependency order (pip would not know: their deps are ROS keys) ----
S="$BUILD/src"
PACKAGES=(
  "$S/rosidl_runtime_py"
  "$S/launch/launch" "$S/launch/launch_xml" "$S/launch/launch_yaml" "$S/launch/launch_testing" "$S/launch/launch_pytest"
  "$S/launch_ros/launch_ros" "$S/launch_ros/launch_testing_ros"
  "$S/ros2cli/ros2cli" "$S/ros2cli/ros2pkg" "$S/ros2cli/ros2run" "$S/ros2cli/ros2topic" "$S/ros2cli/ros2service"
  "$S/ros2cli/ros2param" "$S/ros2cli/ros2node" "$S/ros2cli/ros2lifecycle" "$S/ros2cli/ros2interface"
  "$S/ros2cli/ros2action" "$S/launch_ros/ros2launch"
)
"$PY" -m pip install --no-deps --no-build-isolation "${PACKAGES[@]}" >"$BUILD/pip.log" 2>&1 \
  || { tail -n 40 "$BUILD/pip.log" >&2; echo "install_ros_tools: pip install of the tools failed (log: $BUILD/pip.log)" >&2; exit 1; }

if ! tools_check; then
  echo "install_ros_tools: installed, but the tools do not work:" >&2
  (cd / && "$PY" -c 'import launch, launch_ros, launch_testing, ros2cli; from composition_interfaces.srv import LoadNode; LoadNode.Request()') >&2 || true
  "$VENV/bin/ros2" pkg prefix robot_wm >&2 || true
  exit 1
fi
echo "$HASH" >"$STAMP"
echo "install_ros_tools: done ($VENV): $("$VENV/bin/ros2" pkg list 2>/dev/null | wc -l) packages on the ament index"
