"""launch_testing tier: `ros2 launch robot_wm bringup.launch.py` on the embedded arm, checked with the
`ros2` CLI an operator would use.

    launch_test test/launch/launch_bringup.py        (what test/test_launch_tier.py runs in `make test`)

The bring-up must reach its running state (filter enabled, trust monitor past STOP, the arm under
command), publish /joint_states at the configured rate (judged by their stamps), answer
`ros2 lifecycle get`, accept a tighter safety limit from `ros2 param set` and refuse a looser one,
and stop the arm on `ros2 service call /robot_wm/estop std_srvs/srv/Trigger`; after the launch is
shut down (SIGINT to every process) every process must have exited cleanly.
The file is named so that pytest does not collect it: launch_test runs it.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
import unittest

import launch
import launch_testing
import launch_testing.actions
import launch_testing.asserts
from ament_index_python.packages import get_package_share_directory
from launch.actions import IncludeLaunchDescription
from launch.launch_description_sources import PythonLaunchDescriptionSource

CLI = ("--no-daemon", "--spin-time", "5")  # no daemon left behind; discovery time on a loaded machine
STATE_RATE_HZ = 500.0  # config/arm_sim.yaml publish_rate_hz
CONTROL_RATE_HZ = 100.0  # config/control.yaml
COMMAND_TIMEOUT_S = 0.05  # config/arm_sim.yaml command_timeout_s
READY_TIMEOUT_S = 120.0  # a cold start of seven processes on a loaded 2-core machine


def generate_test_description():
    bringup = os.path.join(get_package_share_directory("robot_wm"), "launch", "bringup.launch.py")
    return launch.LaunchDescription([
        IncludeLaunchDescription(PythonLaunchDescriptionSource(bringup),
                                 launch_arguments={"hardware": "mujoco", "enable": "true"}.items()),
        launch_testing.actions.ReadyToTest(),
    ]), {}


def ros2(*args: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess:
    """Run the `ros2` CLI of this interpreter's environment (the venv's, else a ROS install's on PATH)."""
    beside = os.path.join(os.path.dirname(sys.executable), "ros2")
    exe = beside if os.path.isfile(beside) else (shutil.which("ros2") or "ros2")
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout_s)


class Watcher:
    """Joint states, safety statuses and trust states, recorded by a node spinning in a thread."""

    def __init__(self) -> None:
        import rclpy
        from rclpy.context import Context
        from rclpy.experimental import EventsExecutor
        from rclpy.qos import QoSProfile, ReliabilityPolicy
        from sensor_msgs.msg import JointState

        from robot_wm.msg import SafetyStatus, TrustState
        from robot_wm.nodes.runner import SpinThread

        self.context = Context()
        rclpy.init(context=self.context)
        self.node = rclpy.create_node("launch_tier_watcher", context=self.context)
        self.lock = threading.Lock()
        self.states: list[tuple[float, list[float]]] = []  # (stamp s, velocities)
        self.statuses: list = []
        self.trust: list = []
        qos = QoSProfile(depth=200, reliability=ReliabilityPolicy.RELIABLE)
        self.node.create_subscription(JointState, "/joint_states", self._on_state, qos)
        self.node.create_subscription(SafetyStatus, "/robot_wm/safety_status", self._keep(self.statuses), qos)
        self.node.create_subscription(TrustState, "/robot_wm/trust", self._keep(self.trust), qos)
        self.executor = EventsExecutor(context=self.context)  # keeps up with 500 Hz on a loaded machine
        self.executor.add_node(self.node)
        self.spinner = SpinThread(self.executor)

    def _keep(self, into: list):
        def cb(msg) -> None:
            with self.lock:
                into.append(msg)
        return cb

    def _on_state(self, msg) -> None:
        stamp = msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9
        with self.lock:
            self.states.append((stamp, list(msg.velocity)))

    def wait(self, predicate, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self.lock:
                if predicate():
                    return True
            time.sleep(0.05)
        with self.lock:
            return bool(predicate())

    def close(self) -> None:
        import rclpy

        self.spinner.stop()
        self.node.destroy_node()
        rclpy.shutdown(context=self.context)


class TestBringup(unittest.TestCase):
    """In order: running state, rate, lifecycle, parameters, then the e-stop (it latches the filter)."""

    @classmethod
    def setUpClass(cls) -> None:
        cls.watch = Watcher()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.watch.close()

    def test_1_the_bringup_reaches_its_running_state(self) -> None:
        from robot_wm.msg import SafetyStatus, TrustState

        w = self.watch
        running = (SafetyStatus.OK, SafetyStatus.FILTERING)
        ok = w.wait(lambda: w.statuses and w.statuses[-1].state in running and w.trust
                    and w.trust[-1].level != TrustState.LEVEL_STOP, READY_TIMEOUT_S)
        last = (w.statuses[-1].state_text if w.statuses else "no SafetyStatus",
                w.trust[-1].reason if w.trust else "no TrustState")
        self.assertTrue(ok, f"not running after {READY_TIMEOUT_S:.0f} s: filter {last[0]!r}, trust {last[1]!r}")
        # the policy is commanding the arm to its goals: some joint moves
        self.assertTrue(w.wait(lambda: max(abs(v) for v in w.states[-1][1]) > 0.05, 30.0), "the arm never moved")

    def test_2_joint_states_arrive_at_the_control_rate_at_least(self) -> None:
        """The arm is configured for 500 Hz (config/arm_sim.yaml). With the whole stack on a 2-core
        machine it sustains less (about 170-260 Hz measured: the stack's CPU, issue #13), so what is
        asserted is what the control loop needs: every 100 Hz period has a fresh state, and no gap
        reaches the 50 ms command timeout; the rate is printed."""
        w = self.watch
        with w.lock:
            start = len(w.states)
        self.assertTrue(w.wait(lambda: len(w.states) >= start + 1000, 30.0), "fewer than 1000 joint states in 30 s")
        with w.lock:
            stamps = sorted(s for s, _ in w.states[start:])
        rate_hz = (len(stamps) - 1) / (stamps[-1] - stamps[0])  # as received by this client
        gaps = [b - a for a, b in zip(stamps, stamps[1:])]
        print(f"/joint_states: {rate_hz:.0f} Hz received (configured {STATE_RATE_HZ:.0f} Hz), "
              f"median gap {sorted(gaps)[len(gaps) // 2] * 1e3:.1f} ms, max {max(gaps) * 1e3:.1f} ms", flush=True)
        self.assertGreaterEqual(rate_hz, CONTROL_RATE_HZ)
        self.assertLess(max(gaps), COMMAND_TIMEOUT_S)

    def test_3_lifecycle_nodes_answer_ros2_lifecycle_get(self) -> None:
        out = ros2("lifecycle", "get", *CLI)  # every lifecycle node of the graph, one call
        self.assertEqual(out.returncode, 0, f"ros2 lifecycle get: {out.stdout}{out.stderr}")
        for node in ("/safety_filter", "/world_model", "/policy", "/trust_monitor"):
            self.assertIn(f"{node}: active [3]", out.stdout, out.stdout)

    def test_4_ros2_param_set_tightens_a_safety_limit_and_cannot_loosen_one(self) -> None:
        name = "safety.tool_speed_max_mps"
        before = float(ros2("param", "get", "/safety_filter", name, *CLI).stdout.split()[-1])
        tighter = ros2("param", "set", "/safety_filter", name, str(round(before * 0.9, 4)), *CLI)
        self.assertIn("Set parameter successful", tighter.stdout, tighter.stdout + tighter.stderr)
        looser = ros2("param", "set", "/safety_filter", name, str(round(before * 1.5, 4)), *CLI)
        refusal = looser.stdout + looser.stderr
        self.assertIn("Setting parameter failed", refusal)
        self.assertIn("only get safer", refusal)
        now = float(ros2("param", "get", "/safety_filter", name, *CLI).stdout.split()[-1])
        self.assertAlmostEqual(now, round(before * 0.9, 4))

    def test_5_the_estop_service_stops_the_arm(self) -> None:
        from robot_wm.msg import SafetyStatus

        w = self.watch
        out = ros2("service", "call", "/robot_wm/estop", "std_srvs/srv/Trigger")
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        self.assertIn("success=True", out.stdout)
        with w.lock:
            t_call = w.states[-1][0]  # the arm's clock when the call had been answered
        self.assertTrue(w.wait(lambda: w.statuses[-1].state == SafetyStatus.ESTOP, 5.0), w.statuses[-1].state_text)
        # at rest (every joint < 0.01 rad/s), by the joint states' stamps, within a second of the call
        self.assertTrue(w.wait(lambda: w.states[-1][0] > t_call + 1.0, 10.0))
        with w.lock:
            after = [(s, max(abs(v) for v in vel)) for s, vel in w.states if s > t_call + 1.0]
        self.assertLess(max(v for _, v in after), 0.01, "the arm still moves a second after the e-stop")


@launch_testing.post_shutdown_test()
class TestShutdown(unittest.TestCase):
    def test_every_process_exits_cleanly(self, proc_info) -> None:
        launch_testing.asserts.assertExitCodes(proc_info)
