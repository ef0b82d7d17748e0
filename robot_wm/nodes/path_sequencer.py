"""path_sequencer: hands the tracking policy one reference path after another (task ``track``).

Paths are drawn from the tracking task (``config/task.yaml`` ``track``: lines, arcs, circles and
figure-eights in the workspace box, 0.05-0.45 m/s) with ``seed``, one every ``episode_s``: the
reference holds the path's start point for the lead-in, then moves along the path. At
``publish_rate_hz`` the node publishes the next ``window_s`` of the reference on
/robot_wm/reference as a ``trajectory_msgs/MultiDOFJointTrajectory`` (one "joint", the tool;
header stamp = time of the first point; points every ``track.control_dt_s``, each with its
``time_from_start``), so a receiver reads the reference for its own current time
(``robot_wm.core.track.ReferenceWindow``).

While the safety filter is not running (``wait_for_filter``: its /robot_wm/safety_status is not
OK or FILTERING: start latch, e-stop, fault, stop) for ``hold_after_s`` or longer, the reference
holds the current path's start point and the path's clock stays at zero: a path starts, or starts
over, only on an arm that can follow it (and after a reset the arm is not asked to catch up a
reference that ran on). A shorter break -- a few periods of stale input on a loaded machine, a
moment's controlled stop -- is part of the path and of its score: restarting on each would, on a
busy machine, never let a path end.

It also scores each path as the task does, on the MEASURED tool position (FK of /joint_states,
judged at each message's header stamp): RMS and maximum error after the lead-in, and success by
the task's thresholds. One line per path on ~/events and in the log.
"""
from __future__ import annotations

import numpy as np
from geometry_msgs.msg import Transform
from rclpy.context import Context
from rclpy.node import Node
from rclpy.qos import QoSProfile, ReliabilityPolicy
from rclpy.time import Time
from sensor_msgs.msg import JointState
from std_msgs.msg import String
from trajectory_msgs.msg import MultiDOFJointTrajectory, MultiDOFJointTrajectoryPoint

from robot_wm.nodes.conversions import InputError, joint_state_arrays
from robot_wm.nodes.params import declare
from robot_wm.nodes.runner import NodeConfigError, main_for

REFERENCE_TOPIC = "/robot_wm/reference"
TOOL_NAME = "tool0"


def _ns(t_s: float) -> int:
    return int(round(t_s * 1e9))


class PathSequencer(Node):
    """Publish reference windows of one path after another; score the measured tool on each."""

    def __init__(self, context: Context | None = None, node_name: str = "path_sequencer") -> None:
        super().__init__(node_name, context=context)
        from robot_wm import description
        from robot_wm.core.kinematics import Kinematics
        from robot_wm.core.track import TrackConfigError, load_track

        self.seed = declare(self, "seed", 0, "seed of the random paths", range_=(0, 2**31 - 1))
        rate_hz = declare(self, "publish_rate_hz", 50.0, "reference publish rate (Hz)", range_=(1.0, 1000.0))
        self.window_s = declare(self, "window_s", 0.5,
                                "length of each published reference window (s); must outlast the preview "
                                "plus a few publish periods", range_=(0.05, 10.0))
        self.frame = declare(self, "base_frame", "base_link", "frame of the reference")
        self.wait_for_filter = declare(self, "wait_for_filter", True,
                                       "hold the path at its start while the safety filter is not OK/FILTERING",
                                       read_only=True)
        self.hold_after_s = declare(self, "hold_after_s", 0.25,
                                    "a filter not running for this long holds the path at its start (s); "
                                    "shorter breaks are part of the path", range_=(0.0, 10.0))
        try:
            self.spec = load_track()
        except (TrackConfigError, OSError) as exc:
            raise NodeConfigError(f"{node_name}: {exc}") from exc
        need = max(self.spec.preview_s) + 2.0 / rate_hz
        if self.window_s < need:
            raise NodeConfigError(f"{node_name}: window_s={self.window_s:g} s is shorter than the task's preview "
                                  f"({max(self.spec.preview_s):g} s) plus two publish periods ({need:g} s)")
        urdf = description.expand()
        self.joint_names = list(description.joint_limits(urdf).names)
        self.kin = Kinematics(urdf, self.joint_names)
        self.rng = np.random.default_rng(self.seed)
        self.index = -1
        self.paths = None
        self.path_start_s = 0.0
        self.score = None
        self.succeeded = 0
        self.failed = 0
        self.results: list[dict] = []
        self.filter_running = not self.wait_for_filter
        self.filter_state = "unknown (no /robot_wm/safety_status yet)"
        self.filter_reason = ""
        self.stopped_since_s: float | None = None if self.filter_running else -np.inf  # not running since
        self.holding = not self.filter_running  # the path is held at its start
        self._pub = self.create_publisher(MultiDOFJointTrajectory, REFERENCE_TOPIC, 10)
        self._event_pub = self.create_publisher(String, "~/events", 10)
        from robot_wm.msg import EpisodeResult

        self._episode_pub = self.create_publisher(EpisodeResult, "/robot_wm/episodes", 10)
        self.create_subscription(JointState, "/joint_states", self._on_state,
                                 QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE))
        if self.wait_for_filter:
            from robot_wm.msg import SafetyStatus

            self.create_subscription(SafetyStatus, "/robot_wm/safety_status", self._on_status, 10)
        self._next_path(self._now_s())
        self.create_timer(1.0 / rate_hz, self._publish)

    def _now_s(self) -> float:
        return self.get_clock().now().nanoseconds * 1e-9

    def _next_path(self, now_s: float) -> None:
        from robot_wm.core.track import TrackScore

        self.index += 1
        self.paths = self.spec.sample_paths(self.rng, 1)  # path i: the i-th of one seeded draw
        self.path_start_s = now_s
        self.score = TrackScore(self.spec)
        p = self.paths
        self._event(f"path {self.index}: {p.shape[0]} of {p.size_m[0] * 100:.1f} cm at {p.peak_speed_mps[0]:.2f} m/s "
                    f"around ({p.center_m[0][0]:+.3f}, {p.center_m[0][1]:+.3f}, {p.center_m[0][2]:+.3f}) m")

    def _event(self, text: str) -> None:
        self.get_logger().info(text)
        self._event_pub.publish(String(data=text))

    def _finish_path(self, now_s: float) -> None:
        s = self.score
        ok = s.success
        self.succeeded += int(ok)
        self.failed += int(not ok)
        self.results.append({"path": self.index, "shape": self.paths.shape[0], "rms_m": s.rms_m, "max_m": s.max_m,
                             "success": ok})
        self._event(f"path {self.index} done: RMS {s.rms_m * 1e3:.1f} mm, max {s.max_m * 1e3:.1f} mm "
                    f"({'success' if ok else 'FAILED'}; measured tool)")
        from robot_wm.msg import EpisodeResult

        msg = EpisodeResult(task="track", index=max(self.index, 0), success=bool(ok), error_m=float(s.rms_m),
                            duration_s=float(self.spec.episode_s))
        msg.header.stamp = self.get_clock().now().to_msg()
        self._episode_pub.publish(msg)
        self._next_path(now_s)

    def _on_status(self, msg) -> None:
        running = msg.state_text in ("OK", "FILTERING")
        if running and self.stopped_since_s is not None:
            self.stopped_since_s = None
            if self.holding:
                self.holding = False
                self._event(f"path {self.index} (re)starts: safety filter {msg.state_text}")
        elif not running and self.stopped_since_s is None:
            self.stopped_since_s = self._now_s()
        self.filter_running, self.filter_state = running, msg.state_text
        self.filter_reason = msg.fault_reason

    def _on_state(self, msg: JointState) -> None:
        try:
            q, _ = joint_state_arrays(msg, self.joint_names)
        except InputError:
            return
        t_s = Time.from_msg(msg.header.stamp).nanoseconds * 1e-9 - self.path_start_s
        if 0.0 <= t_s <= self.spec.episode_s:
            self.score.update(t_s, self.kin.tool_position_m(q), self.paths.position(0, t_s))

    def _publish(self) -> None:
        from robot_wm.core.track import TrackScore

        now_s = self._now_s()
        if self.stopped_since_s is not None and now_s - self.stopped_since_s >= self.hold_after_s:
            if not self.holding:
                self.holding = True
                why = f": {self.filter_reason}" if self.filter_reason else ""
                self._event(f"path {self.index} held at its start: safety filter {self.filter_state}{why}")
            self.path_start_s = now_s  # hold the start point; the path's clock and score start over
            self.score = TrackScore(self.spec)
        if now_s - self.path_start_s >= self.spec.episode_s:
            self._finish_path(now_s)
        dt = self.spec.control_dt_s
        k = np.arange(int(np.ceil(self.window_s / dt)) + 1)
        points = self.paths.position(0, now_s - self.path_start_s + k * dt)
        msg = MultiDOFJointTrajectory()
        msg.header.stamp = Time(nanoseconds=_ns(now_s)).to_msg()
        msg.header.frame_id = self.frame
        msg.joint_names = [TOOL_NAME]
        for j, p in zip(k, points):
            point = MultiDOFJointTrajectoryPoint()
            tf = Transform()
            tf.translation.x, tf.translation.y, tf.translation.z = (float(v) for v in p)
            tf.rotation.w = 1.0
            point.transforms = [tf]
            ns = _ns(j * dt)
            point.time_from_start.sec, point.time_from_start.nanosec = ns // 1_000_000_000, ns % 1_000_000_000
            msg.points.append(point)
        self._pub.publish(msg)


def reference_window(msg: MultiDOFJointTrajectory):
    """A ``ReferenceWindow`` from a reference message; raises InputError naming what is wrong.

    The points must be equally spaced in ``time_from_start`` (as path_sequencer publishes them).
    """
    from robot_wm.core.track import ReferenceWindow

    if len(msg.points) < 2:
        raise InputError(f"reference: {len(msg.points)} point(s), expected at least 2")
    times, pts = [], []
    for k, point in enumerate(msg.points):
        if len(point.transforms) != 1:
            raise InputError(f"reference point {k}: {len(point.transforms)} transforms, expected 1 (the tool)")
        tr = point.transforms[0].translation
        pts.append((tr.x, tr.y, tr.z))
        times.append(point.time_from_start.sec + point.time_from_start.nanosec * 1e-9)
    steps = np.diff(times)
    if not np.all(steps > 0) or np.ptp(steps) > 1e-6:
        raise InputError(f"reference: time_from_start must be equally spaced and increasing, got steps "
                         f"{np.unique(np.round(steps, 6)).tolist()[:5]}")
    start_s = Time.from_msg(msg.header.stamp).nanoseconds * 1e-9 + times[0]
    try:
        return ReferenceWindow(start_s, float(steps[0]), pts)
    except ValueError as exc:
        raise InputError(str(exc)) from exc


main = main_for(PathSequencer)

if __name__ == "__main__":
    main()
