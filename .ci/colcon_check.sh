#!/usr/bin/env bash
# Proves the colcon path: the repo builds as the ament_cmake package robot_wm in a fresh colcon
# workspace (using ament_cmake & friends from the pip venv) and robot_wm.msg/srv import from that
# workspace's install space.
#
#   .ci/colcon_check.sh [VENV_DIR]      (default: <repo>/.venv)
#
# Env: ROBOT_WM_KEEP_WS=1 keeps the temp workspace for inspection.
set -euo pipefail
T0=$SECONDS

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
VENV="$(cd "${1:-$REPO/.venv}" && pwd -P)"
PY="$VENV/bin/python"
[[ -x "$PY" && -x "$VENV/bin/colcon" ]] || { echo "colcon_check: need $PY and $VENV/bin/colcon" >&2; exit 2; }

WS="$(mktemp -d /tmp/robot_wm_colcon.XXXXXX)"
cleanup() {
  if [[ -n "${ROBOT_WM_KEEP_WS:-}" ]]; then
    echo "colcon_check: kept workspace $WS"
  else
    rm -rf "$WS"
  fi
}
trap cleanup EXIT

# Snapshot of the package (a copy, not a symlink: colcon must not see the venv or build dirs, and
# concurrent edits in the checkout must not change the tree mid-build).
mkdir -p "$WS/src/robot_wm"
tar -C "$REPO" -cf - \
    --exclude=./.venv --exclude=./.git --exclude=./build --exclude=./install --exclude=./log \
    --exclude=./out --exclude=__pycache__ --exclude=.pytest_cache --exclude=.hypothesis \
    --exclude='*.egg-info' . \
  | tar -C "$WS/src/robot_wm" -xf -

# Use ament_cmake, rosidl and colcon from the venv, as `source .venv/bin/activate` would, plus the
# ament/CMake search paths the wheels do not set. Nothing else from a ROS install.
export VIRTUAL_ENV="$VENV"
export PATH="$VENV/bin:$PATH"
export AMENT_PREFIX_PATH="$VENV"
export CMAKE_PREFIX_PATH="$VENV"
unset PYTHONPATH COLCON_PREFIX_PATH

echo "colcon_check: colcon build --merge-install in $WS"
T_BUILD=$SECONDS
if ! (cd "$WS" && colcon --log-base "$WS/log" build --merge-install \
        --base-paths src --build-base build --install-base install \
        --cmake-args -DPython3_EXECUTABLE="$PY" -DBUILD_TESTING=OFF \
        >"$WS/colcon.out" 2>&1); then
  cat "$WS/colcon.out" >&2
  find "$WS/log" -name stdout_stderr.log -exec tail -n 80 {} \; >&2 2>/dev/null || true
  echo "colcon_check: FAIL (colcon build)" >&2
  exit 1
fi
echo "colcon_check: build took $((SECONDS - T_BUILD)) s"

INSTALL="$WS/install"
SITE="$(ls -d "$INSTALL"/lib/python3*/site-packages | head -n1)"

fail() { echo "colcon_check: FAIL ($*)" >&2; exit 1; }
[[ -f "$INSTALL/share/robot_wm/package.xml" ]] || fail "no share/robot_wm/package.xml"
[[ -d "$INSTALL/lib/robot_wm" ]] || fail "no lib/robot_wm"
[[ -f "$INSTALL/share/ament_index/resource_index/packages/robot_wm" ]] || fail "not in the ament index"
[[ -f "$SITE/robot_wm/__init__.py" ]] || fail "no robot_wm in $SITE"
# ROBOT_WM_INSTALL_PYTHON=ON: our sources are installed, and our __init__.py (extend_path) must
# have replaced the empty one that rosidl_generator_py installs.
grep -q extend_path "$SITE/robot_wm/__init__.py" || fail "installed robot_wm/__init__.py is not ours"
for sub in core nodes sim learning; do
  [[ ! -d "$REPO/robot_wm/$sub" || -f "$SITE/robot_wm/$sub/__init__.py" ]] || fail "robot_wm.$sub not installed"
done

# Import from the install space, from a cwd outside the repo, with the install space first on
# PYTHONPATH and on LD_LIBRARY_PATH. The wheels' bootstrapper re-execs Python with an
# LD_LIBRARY_PATH built from a *set* (random order), which could pick the venv's copy of
# librobot_wm__*.so (from tools/build_interfaces.sh); so compute its path once and pass ours with
# the install space first and the bootstrap marked done.
VENV_LD="$(cd / && "$PY" -c 'import os; print(os.environ.get("LD_LIBRARY_PATH", ""))')"
(
  cd /
  export PYTHONPATH="$SITE"
  export LD_LIBRARY_PATH="$INSTALL/lib${VENV_LD:+:$VENV_LD}"
  export _ROS_WHEELS_BOOTSTRAP_COMPLETE=1
  export AMENT_PREFIX_PATH="$INSTALL:$VENV"
  export ROBOT_WM_INSTALL="$INSTALL"
  "$PY" - <<'PYEOF'
import os
import sys

install = os.path.realpath(os.environ["ROBOT_WM_INSTALL"])

import robot_wm
import robot_wm.msg
import robot_wm.srv
from robot_wm.msg import ModelUpdate, SafetyStatus, TrustState, WorldModelPrediction
from robot_wm.srv import InjectFault
from rclpy.serialization import deserialize_message, serialize_message
from ament_index_python.packages import get_package_prefix, get_package_share_directory

print("robot_wm.msg.__file__ =", robot_wm.msg.__file__)
print("robot_wm.srv.__file__ =", robot_wm.srv.__file__)
print("robot_wm.__path__     =", list(robot_wm.__path__))
for mod in (robot_wm.msg, robot_wm.srv):
    assert os.path.realpath(mod.__file__).startswith(install + os.sep), f"{mod.__name__} not from {install}"

# Exercise the C typesupport, then check which robot_wm shared objects got mapped.
msg = SafetyStatus(state=SafetyStatus.FILTERING, active_constraints=["joint_limit:j1"])
assert deserialize_message(serialize_message(msg), SafetyStatus) == msg
req = InjectFault.Request(kind="push", force_n=[1.0, 2.0, 3.0])
assert deserialize_message(serialize_message(req), InjectFault.Request) == req
for cls in (WorldModelPrediction, TrustState, ModelUpdate):
    assert deserialize_message(serialize_message(cls()), cls) == cls()

with open("/proc/self/maps") as f:
    libs = sorted({line.split()[-1] for line in f if "robot_wm" in line.split()[-1]})
print("loaded robot_wm objects:")
for lib in libs:
    print("   ", lib)
assert libs, "no robot_wm shared objects loaded"
stray = [lib for lib in libs if not os.path.realpath(lib).startswith(install + os.sep)]
assert not stray, f"robot_wm objects loaded from outside the install space: {stray}"

assert os.path.realpath(get_package_prefix("robot_wm")) == install
print("share dir:", get_package_share_directory("robot_wm"))
PYEOF
) || fail "import from the install space"

echo "colcon_check: lib/robot_wm: $(ls "$INSTALL/lib/robot_wm" | tr '\n' ' ')"
echo "colcon_check: PASS (colcon build + install-space import) in $((SECONDS - T0)) s"
