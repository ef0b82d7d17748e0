"""goal_sequencer: hands the policy one reaching goal after another.

Goals come from the ``goals_m`` parameter (a flat list x, y, z, x, y, z, ... in the base frame)
or, when it is empty, are drawn uniformly from the task's goal box with ``seed``. A goal is
"reached" when the tool (FK of /joint_states) stays within the task's success radius for its hold
time (judged on at most ``state_rate_hz`` of the arm's states a second, by their stamps: the
others are not deserialized); the sequencer then moves on, as it does after ``goal_timeout_s``. Goals go out on
/robot_wm/goal (geometry_msgs/PointStamped) at ``publish_rate_hz``; every finished goal (reached or
timed out) as a robot_wm/EpisodeResult on /robot_wm/episodes (the trust phases' evidence).
"""
from __future__ import annotations

import math
import time

import numpy as np
from geometry_msgs.msg import PointStamped
from rclpy.context import Context
from rclpy.node import Node
from rclpy.qos import QoSProfile, ReliabilityPolicy
from rclpy.serialization import deserialize_message
from sensor_msgs.msg import JointState
from std_msgs.msg import String

from robot_wm.nodes.conversions import InputError, cdr_stamp_ns, joint_state_arrays
from robot_wm.nodes.params import declare
from robot_wm.nodes.runner import NodeConfigError, main_for

_arrival_ns = time.monotonic_ns  # the clock of unstamped states (a name of its own: tests drive it)


class GoalSequencer(Node):
    """Publish goals in sequence; advance when the tool reached the goal or on timeout."""

    def __init__(self, context: Context | None = None, node_name: str = "goal_sequencer") -> None:
        super().__init__(node_name, context=context)
        from robot_wm import description
        from robot_wm.core.kinematics import Kinematics
        from robot_wm.core.task import load_task

        goals = list(declare(self, "goals_m", [0.0], "flat goal list x,y,z,... (m, base frame); [] or [0.0]: random in the task box"))
        self.seed = declare(self, "seed", 0, "seed of random goals", range_=(0, 2**31 - 1))
        self.timeout_s = declare(self, "goal_timeout_s", 6.0, "move on after this long (s)", range_=(0.5, 600.0))
        self.settle_s = declare(self, "settle_s", 0.5, "pause at a reached goal before the next (s)", range_=(0.0, 10.0))
        rate_hz = declare(self, "publish_rate_hz", 10.0, "goal publish rate (Hz)", range_=(0.5, 100.0))
        state_rate_hz = declare(self, "state_rate_hz", 100.0, "joint states judged per second at most (by their "
                                "stamps; the arm's others are not deserialized)", range_=(1.0, 10000.0))
        # a tenth of a period's tolerance: a 500 Hz stream's jitter does not turn 100 Hz into 83
        self._state_gap_ns = int(0.9e9 / state_rate_hz)
        self._last_state_ns: int | None = None
        self._last_dist: float | None = None  # the tool's distance to the goal at the last judged state
        self.rejected = 0
        self.frame = declare(self, "base_frame", "base_link", "frame of the goals")
        self.task = load_task()
        urdf = description.expand()
        self.joint_names = list(description.joint_limits(urdf).names)
        self.kin = Kinematics(urdf, self.joint_names)
        self.rng = np.random.default_rng(self.seed)
        if goals in ([], [0.0]):
            self.fixed = None
        else:
            if len(goals) % 3:
                raise NodeConfigError(f"goal_sequencer: goals_m has {len(goals)} numbers, expected a multiple of 3 (x, y, z per goal)")
            self.fixed = np.asarray(goals, dtype=float).reshape(-1, 3)
            if not np.all(np.isfinite(self.fixed)) or np.any(self.fixed[:, 2] <= 0.0):
                raise NodeConfigError(f"goal_sequencer: goals_m must be finite and above the table (z > 0), got {self.fixed.tolist()}")
        self.index = -1
        self.goal = None
        self.reached = 0
        self.timed_out = 0
        self._inside_since: float | None = None
        self._goal_since = time.monotonic()
        self._reached_at: float | None = None
        self._pub = self.create_publisher(PointStamped, "/robot_wm/goal", 10)
        self._event_pub = self.create_publisher(String, "~/events", 10)
        from robot_wm.msg import EpisodeResult

        self._episode_pub = self.create_publisher(EpisodeResult, "/robot_wm/episodes", 10)
        # raw: a 500 Hz stream deserialized and judged in full cost this node about a tenth of a core
        self.create_subscription(JointState, "/joint_states", self._on_raw_state,
                                 QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE), raw=True)
        self._next_goal()
        self.create_timer(1.0 / rate_hz, self._publish)

    def _next_goal(self) -> None:
        self.index += 1
        if self.fixed is not None:
            self.goal = self.fixed[self.index % len(self.fixed)]
        else:
            self.goal = self.task.sample_goals(self.rng, 1)[0]
        self._goal_since = time.monotonic()
        self._inside_since = None
        self._reached_at = None
        self._last_dist = None
        self._event(f"goal {self.index}: ({self.goal[0]:+.3f}, {self.goal[1]:+.3f}, {self.goal[2]:+.3f}) m")

    def _episode(self, success: bool, error_m: float, duration_s: float) -> None:
        from robot_wm.msg import EpisodeResult

        msg = EpisodeResult(task="reach", index=max(self.index, 0), success=bool(success), error_m=float(error_m),
                            duration_s=float(duration_s))
        msg.header.stamp = self.get_clock().now().to_msg()
        self._episode_pub.publish(msg)

    def _event(self, text: str) -> None:
        self.get_logger().info(text)
        self._event_pub.publish(String(data=text))

    def _on_raw_state(self, data: bytes) -> None:
        # an unstamped arm (0), or a header this reader does not know: by arrival
        stamp_ns = cdr_stamp_ns(data) or _arrival_ns()
        last = self._last_state_ns
        if last is not None and 0 <= stamp_ns - last < self._state_gap_ns:
            return  # (a stamp going backwards, a restarted arm, is judged at once)
        try:
            msg = deserialize_message(data, JointState)
        except Exception as exc:  # noqa: BLE001 - an unreadable message is counted and skipped
            self._reject(f"unreadable joint state: {type(exc).__name__}: {exc}")
            return
        if self._on_state(msg):
            self._last_state_ns = stamp_ns  # (a message without the arm's joints takes no slot)

    def _reject(self, why: str) -> None:
        self.rejected += 1
        self.get_logger().warning(f"{why} (ignored; {self.rejected} so far)", throttle_duration_sec=10.0)

    def _on_state(self, msg: JointState) -> bool:
        """Judge one joint state; False when it cannot be used (not the arm's joints, not finite)."""
        try:
            q, _ = joint_state_arrays(msg, self.joint_names)
        except InputError as exc:
            self._reject(f"joint state: {exc}")
            return False
        now = time.monotonic()
        if self._reached_at is not None:
            if now - self._reached_at >= self.settle_s:
                self._next_goal()
            return True
        dist = float(np.linalg.norm(self.kin.tool_position_m(q) - self.goal))
        self._last_dist = dist
        if dist < self.task.success_radius_m:
            self._inside_since = self._inside_since or now
            if now - self._inside_since >= self.task.success_hold_s:
                self.reached += 1
                self._reached_at = now
                self._event(f"goal {self.index} reached in {now - self._goal_since:.2f} s")
                self._episode(True, dist, now - self._goal_since)
                return True  # (one episode per goal: a hold that ends late is still a success)
        else:
            self._inside_since = None
        self._check_timeout(now)
        return True

    def _check_timeout(self, now: float) -> None:
        """The goal's time is up (from a state, or from the publish timer when none is judged)."""
        if self._reached_at is not None or now - self._goal_since <= self.timeout_s:
            return
        self.timed_out += 1
        dist = self._last_dist
        where = "no usable joint state" if dist is None else f"distance {dist * 1e3:.0f} mm"
        self._event(f"goal {self.index} timed out after {self.timeout_s:.1f} s ({where})")
        self._episode(False, math.nan if dist is None else dist, now - self._goal_since)
        self._next_goal()

    def _publish(self) -> None:
        self._check_timeout(time.monotonic())  # also when no state comes (or none can be judged)
        msg = PointStamped()
        msg.header.stamp = self.get_clock().now().to_msg()
        msg.header.frame_id = self.frame
        msg.point.x, msg.point.y, msg.point.z = (float(v) for v in self.goal)
        self._pub.publish(msg)


main = main_for(GoalSequencer)

if __name__ == "__main__":
    main()
