"""A node that drives the arm through a scripted joint-velocity sequence and records what it did.

Used by ``robot-wm demo`` (until the learned policy and safety filter take over the command path)
and by tests: it publishes on the hardware command topic and records /joint_states, so what it
measures is what the arm actually did.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import numpy as np
from rclpy.context import Context
from rclpy.node import Node
from rclpy.qos import QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray


@dataclass(frozen=True)
class Segment:
    """One step of the script: a name, a duration (s) and a joint velocity (rad/s) or None (send nothing)."""

    name: str
    duration_s: float
    velocity_radps: tuple[float, ...] | None


def default_script() -> list[Segment]:
    """Return the demo sequence: single joints, coupled joints, then silence to show the command timeout."""
    z = (0.0,) * 6
    return [
        Segment("hold", 1.0, z),
        Segment("pan +", 1.5, (0.4, 0, 0, 0, 0, 0)),
        Segment("pan -", 1.5, (-0.4, 0, 0, 0, 0, 0)),
        Segment("lift/elbow", 1.5, (0, -0.25, 0.35, 0, 0, 0)),
        Segment("lift/elbow back", 1.5, (0, 0.25, -0.35, 0, 0, 0)),
        Segment("wrists", 1.5, (0, 0, 0, 0.5, -0.5, 0.8)),
        Segment("wrists back", 1.5, (0, 0, 0, -0.5, 0.5, -0.8)),
        Segment("pan + (then silence)", 0.8, (0.5, 0, 0, 0, 0, 0)),
        Segment("silence: driver timeout", 1.2, None),
    ]


@dataclass
class Recording:
    """Joint states received (wall-clock receive time, position, velocity) and commands sent."""

    t_s: list[float] = field(default_factory=list)
    q_rad: list[np.ndarray] = field(default_factory=list)
    v_radps: list[np.ndarray] = field(default_factory=list)
    cmd_t_s: list[float] = field(default_factory=list)
    cmd_radps: list[np.ndarray] = field(default_factory=list)
    segment_at_cmd: list[int] = field(default_factory=list)


class ScriptedCommander(Node):
    """Publish a Segment script on the command topic at ``rate_hz`` and record /joint_states."""

    def __init__(
        self,
        script: list[Segment],
        context: Context | None = None,
        rate_hz: float = 100.0,
        command_topic: str = "/forward_velocity_controller/commands",
        joint_states_topic: str = "/joint_states",
        node_name: str = "scripted_commander",
    ) -> None:
        super().__init__(node_name, context=context)
        self.script = script
        self.recording = Recording()
        self._lock = threading.Lock()
        qos = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
        self._pub = self.create_publisher(Float64MultiArray, command_topic, qos)
        self.create_subscription(JointState, joint_states_topic, self._on_state, qos)
        self._t0_s: float | None = None
        self._period_s = 1.0 / rate_hz
        self._timer = None
        self.done = threading.Event()

    def _on_state(self, msg: JointState) -> None:
        with self._lock:
            self.recording.t_s.append(time.monotonic())
            self.recording.q_rad.append(np.array(msg.position))
            self.recording.v_radps.append(np.array(msg.velocity))

    def has_state(self) -> bool:
        """True once a joint state arrived."""
        with self._lock:
            return bool(self.recording.t_s)

    def start(self) -> None:
        """Start the script now."""
        self._t0_s = time.monotonic()
        self._timer = self.create_timer(self._period_s, self._on_tick)

    @property
    def t0_s(self) -> float | None:
        """Monotonic time the script started."""
        return self._t0_s

    def segment_index(self, now_s: float) -> int:
        """Return the index of the segment active at ``now_s`` (len(script) when finished)."""
        elapsed = now_s - (self._t0_s or now_s)
        for i, seg in enumerate(self.script):
            if elapsed < seg.duration_s:
                return i
            elapsed -= seg.duration_s
        return len(self.script)

    def _on_tick(self) -> None:
        now = time.monotonic()
        i = self.segment_index(now)
        if i >= len(self.script):
            self.done.set()
            self._timer.cancel()
            return
        velocity = self.script[i].velocity_radps
        if velocity is None:
            return
        self._pub.publish(Float64MultiArray(data=[float(v) for v in velocity]))
        with self._lock:
            self.recording.cmd_t_s.append(now)
            self.recording.cmd_radps.append(np.array(velocity, dtype=float))
            self.recording.segment_at_cmd.append(i)

    def snapshot(self) -> tuple[float, np.ndarray, np.ndarray] | None:
        """Return the latest (receive time, q, v) or None."""
        with self._lock:
            if not self.recording.t_s:
                return None
            return self.recording.t_s[-1], self.recording.q_rad[-1], self.recording.v_radps[-1]
