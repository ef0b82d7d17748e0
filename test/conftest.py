"""Test harness: loopback-only DDS and a ROS domain of this run's own, before any node starts.

Processes started through the ``spawn`` fixture are stopped (SIGINT, then SIGKILL) when the test
ends, pass or fail, and die with the test process if it is killed.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from robot_wm.rosenv import loopback_env

REPO = Path(__file__).resolve().parent.parent
# A domain of our own per run: parallel runs (and a developer's shell) do not cross-talk.
DOMAIN_ID = int(os.environ.get("ROBOT_WM_TEST_DOMAIN_ID", 0)) or 10 + os.getpid() % 90
os.environ.update(loopback_env(domain_id=DOMAIN_ID))
os.environ.setdefault("PYTHONUNBUFFERED", "1")
# Persistent state (the deployment phase, the intervention log) of this run only, never the user's.
os.environ["ROBOT_WM_STATE_DIR"] = tempfile.mkdtemp(prefix="robot_wm_test_state_")
# robot_wm's Python state publisher (graph.yaml fallback for robot_state_publisher, about a fifth of a
# core at 500 Hz) only where a test asks for it (graph.plan(fallbacks=True)): the 2 cores go to what
# each test measures; the product graph (robot-wm up, ros2 launch) has it
os.environ["ROBOT_WM_FALLBACKS"] = "0"
# ... and the model registry under it (state_dir()/models), never a developer's ROBOT_WM_MODELS_DIR
os.environ.pop("ROBOT_WM_MODELS_DIR", None)


def wait_for(predicate: Callable[[], bool], timeout_s: float, poll_s: float = 0.01) -> bool:
    """Poll ``predicate`` until it is true or ``timeout_s`` passes; return its last value."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(poll_s)
    return bool(predicate())


class Spawned:
    """A child process whose combined output goes to a file (a full pipe would block it)."""

    def __init__(self, cmd: list[str], env: dict[str, str]) -> None:
        self.log = tempfile.NamedTemporaryFile(prefix="robot_wm_test_", suffix=".log", delete=False)
        self.cmd = cmd
        self.process = subprocess.Popen(
            cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO,
            preexec_fn=_die_with_parent,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def output(self) -> str:
        """Everything the process printed so far."""
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")

    def stop(self, sig: int = signal.SIGINT, timeout_s: float = 5.0) -> int:
        """Send ``sig``, wait up to ``timeout_s``, SIGKILL if still alive; return the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def _die_with_parent() -> None:
    import ctypes

    ctypes.CDLL("libc.so.6").prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@pytest.fixture
def spawn():
    """Start processes with the test's DDS environment; all are stopped at teardown."""
    started: list[Spawned] = []

    def _spawn(cmd: list[str], extra_env: dict[str, str] | None = None) -> Spawned:
        env = dict(os.environ)
        env.update(extra_env or {})
        child = Spawned(cmd, env)
        started.append(child)
        return child

    yield _spawn
    for child in started:
        child.stop(timeout_s=3.0)
        Path(child.log.name).unlink(missing_ok=True)


@pytest.fixture
def ros_context():
    """An rclpy context of the test's own, shut down at teardown."""
    import rclpy
    from rclpy.context import Context

    context = Context()
    rclpy.init(context=context)
    yield context
    if context.ok():
        rclpy.shutdown(context=context)


@pytest.fixture
def registry(tmp_path, monkeypatch):
    """A registry of the test's own (the node processes get it through ROBOT_WM_MODELS_DIR)."""
    from robot_wm.registry import Registry

    monkeypatch.setenv("ROBOT_WM_MODELS_DIR", str(tmp_path / "models"))
    reg = Registry()
    reg.ensure_shipped()
    return reg


PYTHON = sys.executable
# test/launch/ holds launch_testing descriptions: `launch_test` runs them (test/test_launch_tier.py)
collect_ignore = ["launch"]


@pytest.fixture(scope="module")
def kin():
    """The arm's kinematics (pinocchio) in the URDF's joint order; a test module may define its own."""
    from robot_wm import description
    from robot_wm.core.kinematics import Kinematics

    urdf = description.expand()
    return Kinematics(urdf, description.joint_limits(urdf).names)


@pytest.fixture(scope="module")
def limits():
    """The shipped safety limits (config/safety.yaml)."""
    from robot_wm.core.safety import load_safety_limits

    return load_safety_limits()
