"""The real ROS 2 tools on the pip path: the launch_testing tier and Ctrl-C under `ros2 launch`.

Runs when `make ros-tools` has installed launch, launch_ros, launch_testing and the ros2 CLI into
the venv (`make test` installs them when ../shared/vendor/ros2 or $ROS2_TOOLS_SRC holds the source
archives); otherwise the tier is skipped, saying so. On a ROS install the same files run too.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import REPO, wait_for
from rosclient import ArmClient

pytestmark = [pytest.mark.ros, pytest.mark.slow]


def _tool(name: str) -> str | None:
    beside = Path(sys.executable).with_name(name)
    return str(beside) if beside.is_file() else shutil.which(name)


_MISSING = [m for m in ("launch", "launch_ros", "launch_testing", "ros2launch", "ros2cli")
            if importlib.util.find_spec(m) is None] + [t for t in ("ros2", "launch_test") if _tool(t) is None]
if _MISSING:
    pytest.skip(f"launch_testing tier skipped: the ROS 2 CLI and launch system are not installed "
                f"(missing {', '.join(_MISSING)}); `make ros-tools` installs them from ../shared/vendor/ros2 "
                "or ROS2_TOOLS_SRC=DIR", allow_module_level=True)


def _run_logged(cmd: list[str], timeout_s: float) -> tuple[int, str]:
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd="/",
                                start_new_session=True)
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            code = -999
        log.seek(0)
        return code, log.read()


def test_the_launch_testing_tier_passes():
    """test/launch/launch_bringup.py under launch_test: running state, rate, lifecycle, parameters,
    e-stop, clean exit codes (run from / so that nothing comes from the source tree but the test)."""
    code, out = _run_logged([_tool("launch_test"), str(REPO / "test" / "launch" / "launch_bringup.py")], 420)
    assert code == 0, out[-6000:]
    assert "Ran 5 tests" in out and "FAILED" not in out


def test_ctrl_c_stops_the_composed_bringup_cleanly_and_the_arm_is_visible(ros_context):
    """`ros2 launch ... composed:=true`, then SIGINT to the whole process group (what a terminal's
    Ctrl-C does): /robot_description and /tf were there, every process finishes cleanly, none is left."""
    from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
    from std_msgs.msg import String
    from tf2_msgs.msg import TFMessage

    from robot_wm.msg import SafetyStatus

    log = tempfile.NamedTemporaryFile("w+", prefix="robot_wm_launch_", suffix=".log", delete=False)
    proc = subprocess.Popen([_tool("ros2"), "launch", "robot_wm", "bringup.launch.py", "hardware:=mujoco",
                             "composed:=true", "enable:=true"], stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, cwd="/", start_new_session=True,
                            env={**os.environ, "ROBOT_WM_FALLBACKS": "1"})  # the product graph: with TF
    client = ArmClient(ros_context, name="launch_tier_ctrl_c", start=False)  # records /robot_wm/safety_status
    got: dict[str, list] = {"description": [], "tf": []}
    latched = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)
    client.node.create_subscription(String, "/robot_description", got["description"].append, latched)
    client.node.create_subscription(TFMessage, "/tf", got["tf"].append, 10)
    client.start()

    def output() -> str:
        log.flush()
        return Path(log.name).read_text(errors="replace")

    try:
        running = (SafetyStatus.OK, SafetyStatus.FILTERING)
        assert wait_for(lambda: got["description"] and got["tf"] and client.statuses
                        and client.statuses[-1].state in running, 150.0, 0.1), output()[-4000:]
        assert "<robot" in got["description"][0].data
        assert {t.child_frame_id for t in got["tf"][-1].transforms} >= {"shoulder_link", "wrist_3_link"}
        t0 = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)  # the terminal's Ctrl-C: the launch and every node get it
        code = proc.wait(timeout=30)
        elapsed = time.monotonic() - t0
    finally:
        client.close()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = output()
    Path(log.name).unlink(missing_ok=True)
    started = text.count("process started with pid")
    assert code == 0, text[-4000:]
    assert started >= 5 and text.count("process has finished cleanly") == started, text[-4000:]
    assert "process has died" not in text and "Traceback" not in text, text[-4000:]
    with pytest.raises(ProcessLookupError):
        os.killpg(proc.pid, 0)  # nothing of the group is left
    assert elapsed < 20.0
