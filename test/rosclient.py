"""A test-side ROS client: records /joint_states, /robot_wm/wrench and /robot_wm/safety_status,
publishes commands, calls services.

Every subscription is made before the spin thread starts: one created on the node while another
thread is inside ``spin_once`` was once never served in a CI run (no status ever arrived)."""
from __future__ import annotations

import threading
import time

import numpy as np
from geometry_msgs.msg import WrenchStamped
from rclpy.context import Context
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.qos import QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray

from robot_wm import graph
from robot_wm.nodes.runner import SpinThread
from robot_wm.process_group import command_for


def arm_sim_command(**params) -> list[str]:
    """The command line of the graph's arm_sim process alone (no control stack), with parameter overrides."""
    spec = next(s for s in graph.plan("mujoco", overrides=params or None, stack=False) if s.name == "arm_sim")
    return command_for(spec)


class ArmClient:
    """Talk to an arm through the ros2_control topic contract from a test, spinning in a thread."""

    def __init__(self, context: Context, name: str = "test_client", start: bool = True) -> None:
        self.node = Node(name, context=context)
        qos = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
        self.lock = threading.Lock()
        # (receive time.monotonic(), q, qdot, effort, names, header stamp in s: the arm's wall clock)
        self.states: list[tuple[float, np.ndarray, np.ndarray, np.ndarray, list[str], float]] = []
        self.wrenches: list[WrenchStamped] = []
        self.pub = self.node.create_publisher(Float64MultiArray, "/forward_velocity_controller/commands", qos)
        self.node.create_subscription(JointState, "/joint_states", self._on_state, qos)
        self.node.create_subscription(WrenchStamped, "/robot_wm/wrench", self._on_wrench, qos)
        from robot_wm.msg import SafetyStatus

        self.statuses: list[SafetyStatus] = []  # every /robot_wm/safety_status, in arrival order
        self.node.create_subscription(SafetyStatus, "/robot_wm/safety_status", self.statuses.append,
                                      QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE))
        self._clients: dict = {}
        self.executor = SingleThreadedExecutor(context=context)
        self.executor.add_node(self.node)
        self.spinner = SpinThread(self.executor, timeout_s=0.02, start=start)

    def start(self) -> None:
        """Start spinning (``start=False`` lets a caller add subscriptions on ``node`` first)."""
        self.spinner.start()

    def _on_state(self, msg: JointState) -> None:
        with self.lock:
            stamp = msg.header.stamp.sec + 1e-9 * msg.header.stamp.nanosec
            self.states.append((time.monotonic(), np.array(msg.position), np.array(msg.velocity), np.array(msg.effort),
                                list(msg.name), stamp))

    def _on_wrench(self, msg: WrenchStamped) -> None:
        with self.lock:
            self.wrenches.append(msg)

    def latest(self):
        """Return the latest (t, q, v, effort, names) or None."""
        with self.lock:
            return self.states[-1] if self.states else None

    def states_since(self, t0: float):
        """Return the joint states received after monotonic time ``t0``."""
        with self.lock:
            return [s for s in self.states if s[0] >= t0]

    def stamped_between(self, t0_wall: float, t1_wall: float, wait_s: float = 5.0) -> list:
        """The joint states the arm stamped within [t0_wall, t1_wall] (time.time()), after waiting up to
        ``wait_s`` for one stamped past ``t1_wall`` (so the window is complete however late delivery is):
        a window judged by the arm's clock, not by when this loaded machine handed the messages over."""
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            latest = self.latest()
            if latest is not None and latest[5] > t1_wall:
                break
            time.sleep(0.01)
        with self.lock:
            return [s for s in self.states if t0_wall <= s[5] <= t1_wall]

    def rest_after(self, t_wall: float, tol_radps: float = 0.01) -> float | None:
        """Seconds from ``t_wall`` (time.time()) to the arm's rest, judged by the joint states' own
        stamps: the stamp of the first state after ``t_wall`` from which every state received so far
        has all |qdot| < tol, minus ``t_wall``; None if the arm is not at rest (yet)."""
        with self.lock:
            after = [(s[5], float(np.abs(s[2]).max())) for s in self.states if s[5] >= t_wall]
        if not after or after[-1][1] >= tol_radps:
            return None
        i = len(after)
        while i > 0 and after[i - 1][1] < tol_radps:
            i -= 1
        return after[i][0] - t_wall if i < len(after) else None

    def wait_for_state(self, timeout_s: float = 30.0) -> bool:
        """Wait until joint states flow."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.latest() is not None:
                return True
            time.sleep(0.02)
        return False

    def command_for(self, data, duration_s: float, rate_hz: float = 100.0) -> None:
        """Publish ``data`` (a sequence of floats) at ``rate_hz`` for ``duration_s``."""
        end = time.monotonic() + duration_s
        msg = Float64MultiArray(data=[float(x) for x in data])
        while time.monotonic() < end:
            self.pub.publish(msg)
            time.sleep(1.0 / rate_hz)

    def command_until(self, data, done, min_s: float, max_s: float = 10.0) -> bool:
        """Publish ``data`` at 100 Hz for at least ``min_s``, and on until ``done()`` (at most ``max_s``): a
        loaded machine that delivers the command or the states late gets a longer command, not a judgement
        on the stale states this client had at a fixed time. Returns ``done()``."""
        start = time.monotonic()
        while time.monotonic() - start < min_s or (not done() and time.monotonic() - start < max_s):
            self.command_for(data, 0.01)
        return bool(done())

    def rested_for(self, t_wall: float, seconds: float) -> bool:
        """At rest since ``t_wall`` (time.time()) by the arm's stamps (``rest_after``), and this client
        holds ``seconds`` of that rest (states stamped that long after the first one at rest)."""
        rest, latest = self.rest_after(t_wall), self.latest()
        return rest is not None and latest[5] - (t_wall + rest) >= seconds

    def command_until_stamped(self, data, settle_s: float, min_states: int = 50, min_s: float = 0.8,
                              max_s: float = 10.0) -> tuple[list, float]:
        """Publish ``data`` at 100 Hz for at least ``min_s``, and on until this client has received more
        than ``min_states`` joint states the arm stamped from ``settle_s`` after the first command (at
        most ``max_s``): a loaded machine that starves the arm or this client gets a longer window, not
        a short count. Returns (the states stamped in that window, time.time() after the last command)."""
        t0_wall = time.time()

        def sampled() -> int:
            with self.lock:
                return sum(1 for s in self.states if s[5] >= t0_wall + settle_s)

        self.command_until(data, lambda: sampled() > min_states, min_s, max_s)
        t_last_wall = time.time()  # the last command was published before this
        return self.stamped_between(t0_wall + settle_s, t_last_wall), t_last_wall

    def stalls(self, t0_wall: float, t1_wall: float) -> float:
        """Seconds the arm's own stamps stood still between ``t0_wall`` and ``t1_wall`` (gaps past 20 ms
        between two of its joint states): while the arm's process is not scheduled its simulation does
        not run either (it skips ahead afterwards), so a stop takes that much longer by its stamps. Such
        stalls (a loaded CI box once measured 1.0 s, once 2.9 s) are the machine's, not the stop's, and
        are added to a bound."""
        with self.lock:
            stamps = [st[5] for st in self.states if t0_wall - 0.1 <= st[5] <= t1_wall]
        return sum(max(0.0, b - a - 0.02) for a, b in zip(stamps, stamps[1:]))

    def call(self, srv_type, name: str, request, timeout_s: float = 10.0):
        """Call a service and return its response (raises TimeoutError)."""
        # one client per service for the whole test: creating and destroying a client per call
        # while another thread spins can lose the response of a later call
        client = self._clients.get(name)
        if client is None:
            client = self._clients[name] = self.node.create_client(srv_type, name)
        if not client.wait_for_service(timeout_sec=timeout_s):
            raise TimeoutError(f"service {name} not available")
        future = client.call_async(request)
        deadline = time.monotonic() + timeout_s
        while not future.done():
            if time.monotonic() > deadline:
                raise TimeoutError(f"service {name} did not answer")
            time.sleep(0.01)
        return future.result()

    def close(self) -> None:
        """Stop spinning and destroy the node."""
        self.spinner.stop()
        self.executor.remove_node(self.node)
        self.node.destroy_node()
        self.executor.shutdown(timeout_sec=1.0)
