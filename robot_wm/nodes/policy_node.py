"""policy: the learned policy (ONNX) of a task as a lifecycle node.

``task`` (read-only) picks the task: ``reach`` (the goal on /robot_wm/goal, from goal_sequencer)
or ``track`` (the reference path window on /robot_wm/reference, from path_sequencer; the preview
is read for this node's current time, see ``robot_wm.core.track.ReferenceWindow``). configure
loads and validates the model (sidecar, hash, joint order, and that it is a policy of this task);
activate starts the control timer. Each period it reads the latest /joint_states and target,
runs the policy, scales the command to the trust level in force (/robot_wm/trust: the filter's
reduced speed and acceleration at CAUTIOUS and SLOW, zero at STOP and HUMAN, ``trust_scales``),
limits its change per period to the safety filter's acceleration box (``command_slew_fraction``,
``robot_wm.core.slew``) and publishes the nominal joint velocity
command on /robot_wm/action_nominal. It
never talks to the hardware: the safety filter is the only publisher of hardware commands. With
a stale joint state, no goal, or a reference window that does not cover the preview it
publishes nothing, and the filter's staleness check stops the arm.
"""
from __future__ import annotations

import numpy as np
from geometry_msgs.msg import PointStamped
from rclpy.context import Context
from rclpy.lifecycle import State, TransitionCallbackReturn
from std_msgs.msg import Float64MultiArray
from trajectory_msgs.msg import MultiDOFJointTrajectory

from robot_wm.core.slew import DEFAULT_SLEW_FRACTION
from robot_wm.nodes.control_node import ControlNode
from robot_wm.nodes.conversions import InputError, vector
from robot_wm.nodes.params import declare
from robot_wm.nodes.runner import NodeConfigError, main_for


class PolicyNode(ControlNode):
    """Run the ONNX policy each control period on the latest joint state and goal."""

    def __init__(self, context: Context | None = None, node_name: str = "policy") -> None:
        super().__init__(node_name, context=context)
        self.task_name = declare(self, "task", "reach", "task of the policy: reach (goal) or track (reference path)",
                                 read_only=True)
        self.model_path = declare(self, "model_path", "", "policy .onnx (empty: the package's models/policy.onnx for "
                                  "reach, models/track/policy.onnx for track)", read_only=True)
        self.scripted = declare(self, "scripted", False,
                                "run the task's scripted baseline (DLS reacher / tracker) in the policy's slot "
                                "instead of a learned model: commissioning, or a task without a learned policy "
                                "that beats it", read_only=True)
        self.reference_topic = declare(self, "reference_topic", "/robot_wm/reference",
                                       "trajectory_msgs/MultiDOFJointTrajectory reference window (track)",
                                       read_only=True)
        self.goal_topic = declare(self, "goal_topic", "/robot_wm/goal", "geometry_msgs/PointStamped goal (m, base frame)", read_only=True)
        self.action_topic = declare(self, "action_topic", "/robot_wm/action_nominal", "Float64MultiArray nominal command (rad/s)", read_only=True)
        self.slew_fraction = declare(self, "command_slew_fraction", DEFAULT_SLEW_FRACTION,
                                     "the nominal changes by at most this fraction of the safety filter's "
                                     "acceleration box (acceleration_max * dt of config/safety.yaml, scaled for "
                                     "the phase) per period (1; 0 = off)", range_=(0.0, 1.0), read_only=True)
        self.phase = declare(self, "phase", 2, "deployment phase whose acceleration scale the slew limit uses "
                             "(TrustState PHASE_*; robot_wm.graph.plan sets the safety filter's default_phase)",
                             range_=(0, 2), read_only=True)
        self.runner = None
        self.slew = None  # robot_wm.core.slew.SlewLimiter, or None (command_slew_fraction 0)
        self.kin = None
        self._pub = None
        self.task = None
        self._goal: np.ndarray | None = None
        self._reference = None  # ReferenceWindow
        self._limits = None  # the safety limits whose trust-level scales the output follows
        self._trust: tuple[int, int] | None = None  # (level, phase) of the latest TrustState
        if self.task_name not in ("reach", "track"):
            raise NodeConfigError(f"{node_name}: parameter task={self.task_name!r}: expected 'reach' or 'track'")
        if self.task_name == "reach":
            self.create_subscription(PointStamped, self.goal_topic, self._on_goal, 10)
        else:
            self.create_subscription(MultiDOFJointTrajectory, self.reference_topic, self._on_reference, 10)
        from robot_wm.msg import TrustState

        self.create_subscription(TrustState, "/robot_wm/trust", self._on_trust, 10)

    # ---- lifecycle
    def on_configure(self, state: State) -> TransitionCallbackReturn:
        from robot_wm import description
        from robot_wm.core.kinematics import Kinematics
        from robot_wm.core.onnx_model import ModelError
        from robot_wm.core.policy_runner import PolicyRunner
        from robot_wm.core.safety import SafetyLimitsError, load_safety_limits
        from robot_wm.core.slew import SlewLimiter, slew_delta
        from robot_wm.core.tasks import get_task
        from robot_wm.paths import data_path

        try:
            urdf = description.expand()
            names = description.joint_limits(urdf).names
            if self.joint_names == [""]:
                self.joint_names = list(names)
            self.task = get_task(self.task_name)
            if self.scripted:
                if self.model_path:
                    raise ValueError(f"parameters scripted=true and model_path={self.model_path!r}: give one of them")
                self.runner, path = self.task.baseline(), "the task's definition (scripted)"
            else:
                default = ("models", "policy.onnx") if self.task_name == "reach" else ("models", "track", "policy.onnx")
                path = self.model_path or str(data_path(*default, must_exist=False))
                self.runner = PolicyRunner(path, self.joint_names, self.task.control_dt_s, task=self.task_name)
            self.kin = Kinematics(urdf, self.joint_names)
            self._limits = load_safety_limits()
            self.slew = (SlewLimiter(slew_delta(self._limits, self.period_s, self.slew_fraction, self.phase))
                         if self.slew_fraction > 0 else None)
        except (ModelError, SafetyLimitsError, ValueError, OSError) as exc:
            self.get_logger().error(f"configure failed: {exc}")
            return TransitionCallbackReturn.FAILURE
        self._pub = self.create_lifecycle_publisher(Float64MultiArray, self.action_topic, 10)
        version = getattr(self.runner, "version", None) or getattr(self.runner, "name", "scripted")
        if self.scripted:
            self.get_logger().warning(f"{self.task_name}: running the SCRIPTED baseline ({version}), not a learned policy")
        else:
            self.get_logger().info(f"{self.task_name} policy {version} loaded from {path}")
        return TransitionCallbackReturn.SUCCESS

    def on_activate(self, state: State) -> TransitionCallbackReturn:
        if self.slew is not None:
            self.slew.reset()
        return super().on_activate(state)

    def on_cleanup(self, state: State) -> TransitionCallbackReturn:
        if self._pub is not None:
            self.destroy_lifecycle_publisher(self._pub)
            self._pub = None
        self.runner = None
        return TransitionCallbackReturn.SUCCESS

    # ---- inputs
    def _on_goal(self, msg: PointStamped) -> None:
        try:
            self._goal = vector([msg.point.x, msg.point.y, msg.point.z], 3, "goal")
        except InputError as exc:
            self.get_logger().error(f"ignoring goal: {exc}", throttle_duration_sec=1.0)

    def _on_reference(self, msg: MultiDOFJointTrajectory) -> None:
        from robot_wm.nodes.path_sequencer import reference_window

        try:
            self._reference = reference_window(msg)
        except InputError as exc:
            self._reference = None  # a bad window is no window: the policy stops commanding
            self.get_logger().error(f"ignoring reference: {exc}", throttle_duration_sec=1.0)

    # ---- control
    def _observation(self, q: np.ndarray, qdot: np.ndarray) -> np.ndarray | None:
        """The task's observation, or None (and a warning) without a usable target."""
        from robot_wm.core.policy_runner import make_obs
        from robot_wm.core.track import track_obs

        tool = self.kin.tool_position_m(q)
        if self.task_name == "reach":
            return None if self._goal is None else make_obs(q, qdot, tool, self._goal)
        if self._reference is None:
            return None
        now_s = self.get_clock().now().nanoseconds * 1e-9
        offsets = self.task.spec.preview_s
        if not self._reference.covers(now_s, offsets):
            self.get_logger().warning(
                f"reference window [{self._reference.start_s:.3f}, {self._reference.end_s:.3f}] s does not cover "
                f"now {now_s:.3f} s + preview {max(offsets):g} s (stale or late reference): not commanding",
                throttle_duration_sec=1.0)
            return None
        return track_obs(q, qdot, tool, self._reference.preview(now_s, offsets))

    def _on_trust(self, msg) -> None:
        self._trust = (int(msg.level), int(msg.phase))

    def _trust_scales(self) -> tuple[float, float]:
        """The trust level's (speed, acceleration) factors relative to FULL (1, 1 before any TrustState:
        a graph without a monitor runs the filter on its default level)."""
        if self._trust is None or self._limits is None:
            return 1.0, 1.0
        from robot_wm.core.slew import trust_scales

        try:
            return trust_scales(self._limits, *self._trust)
        except ValueError:  # a malformed TrustState: the filter latches on it; here the safe choice
            return 0.0, 1.0

    def control_step(self) -> None:
        """Run the policy on the latest joint state and goal or reference; publish the nominal command."""
        from robot_wm.core.policy_runner import PolicyOutputError

        if self.runner is None:
            return
        state = self.fresh_state()
        if state is None:
            self.get_logger().warning("no fresh joint state: not commanding", throttle_duration_sec=1.0)
            return
        q, qdot = state
        obs = self._observation(q, qdot)
        if obs is None:
            return
        try:
            action = self.runner.act(obs)
        except (PolicyOutputError, ValueError) as exc:
            self.get_logger().error(f"policy failed, not commanding: {exc}", throttle_duration_sec=1.0)
            return
        speed, accel = self._trust_scales()
        action = action * speed
        if self.slew is not None:
            action = self.slew.limit(action, qdot, accel)
        self._pub.publish(Float64MultiArray(data=action.astype(float).tolist()))


main = main_for(PolicyNode)

if __name__ == "__main__":
    main()
