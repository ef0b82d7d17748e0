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

Human intervention (``robot_wm.core.teleop``): /robot_wm/intervention/take (robot_wm/srv/
Intervention) replaces the policy's nominal by the operator's jog, /robot_wm/teleop/joint_velocity
(std_msgs/Float64MultiArray, rad/s in joint order) or /robot_wm/teleop/twist (geometry_msgs/
TwistStamped, the tool in the base frame), clipped to the limits in force and slew-limited like the
policy, still through the safety filter; no teleop message for ``teleop_deadman_s`` -> zero.
/robot_wm/intervention/release hands back to the policy, only from rest (every joint slower than
``release_rest_radps``), the policy's first command ramping from the measured velocity: no jump.
Who commands is published on /robot_wm/intervention/state (robot_wm/msg/InterventionState,
transient local, on change and at 1 Hz: the flag a recording carries into the data) and every
take-over is appended, with its reason and times, to ``intervention_log`` (JSON lines).

A node that runs the registry's active policy (``model_path`` empty) swaps in the policy of a newly
activated set between two periods (``/robot_wm/model_update``, ``robot_wm.nodes.model_swap.PolicySwap``).
In the MIXED phase it can explore, bounded by the world model's uncertainty (``exploration_*``
parameters, ``robot_wm.nodes.policy_exploration``; off by default).
"""
from __future__ import annotations

import time

import numpy as np
from geometry_msgs.msg import PointStamped
from rclpy.context import Context
from rclpy.lifecycle import State, TransitionCallbackReturn
from std_msgs.msg import Float64MultiArray
from trajectory_msgs.msg import MultiDOFJointTrajectory

from robot_wm.core.safety.limits import TrustLevel
from robot_wm.core.slew import DEFAULT_SLEW_FRACTION, trust_scales
from robot_wm.core.teleop import DEFAULT_DEADMAN_S, DEFAULT_REST_RADPS
from robot_wm.nodes.control_node import ControlNode
from robot_wm.nodes.conversions import InputError, vector
from robot_wm.nodes.model_swap import PERIOD_ENDS, PLACE_POLICY
from robot_wm.nodes.params import declare
from robot_wm.nodes.runner import NodeConfigError, main_for


class PolicyNode(ControlNode):
    """Run the ONNX policy each control period on the latest joint state and goal."""

    def __init__(self, context: Context | None = None, node_name: str = "policy") -> None:
        super().__init__(node_name, context=context)
        self.task_name = declare(self, "task", "reach", "task of the policy: reach (goal) or track (reference path)",
                                 read_only=True)
        self.model_path = declare(self, "model_path", "", "policy .onnx (empty: the task's active set of the model "
                                  "registry, robot_wm.registry.resolve; with none, the package's models/policy.onnx "
                                  "for reach, models/track/policy.onnx for track)", read_only=True)
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
        self.deadman_s = declare(self, "teleop_deadman_s", DEFAULT_DEADMAN_S, "no teleop message for this long -> "
                                 "zero (s)", range_=(0.01, 2.0), read_only=True)
        self.rest_radps = declare(self, "release_rest_radps", DEFAULT_REST_RADPS, "an intervention is released only "
                                  "with every joint slower than this (rad/s)", range_=(1e-4, 0.5), read_only=True)
        self.intervention_log = declare(self, "intervention_log", "", "JSON-lines log of take-overs (empty: "
                                        "$ROBOT_WM_STATE_DIR/interventions.jsonl)", read_only=True)
        self.runner = None
        self.teleop = None  # robot_wm.core.teleop.Teleop (configured)
        from robot_wm.core.teleop import Intervention

        self.intervention = Intervention(self.rest_radps)
        self.slew = None  # robot_wm.core.slew.SlewLimiter, or None (command_slew_fraction 0)
        self.kin = None
        self._pub = None
        self.task = None
        self._goal: np.ndarray | None = None
        self._reference = None  # ReferenceWindow
        self._limits = None  # the safety limits whose trust-level scales the output follows
        self._tool_speed_full = float("inf")  # tool-speed limit at FULL in this node's phase (m/s)
        self._action_limit = None
        self._trust: tuple[int, int] | None = None  # (level, phase) of the latest TrustState
        if self.task_name not in ("reach", "track"):
            raise NodeConfigError(f"{node_name}: parameter task={self.task_name!r}: expected 'reach' or 'track'")
        if self.task_name == "reach":
            self.create_subscription(PointStamped, self.goal_topic, self._on_goal, 10)
        else:
            self.create_subscription(MultiDOFJointTrajectory, self.reference_topic, self._on_reference, 10)
        from robot_wm.msg import TrustState

        self.create_subscription(TrustState, "/robot_wm/trust", self._on_trust, 10)
        from robot_wm.nodes.policy_exploration import PolicyExploration

        self.exploration = PolicyExploration(self, self.period_s)
        self._swap = None  # robot_wm.nodes.model_swap.PolicySwap: a policy that follows the registry
        self._intervention_setup()

    # ---- lifecycle
    def on_configure(self, state: State) -> TransitionCallbackReturn:
        from robot_wm import description
        from robot_wm.core.kinematics import Kinematics
        from robot_wm.core.onnx_model import ModelError
        from robot_wm.core.policy_runner import PolicyRunner
        from robot_wm.core.safety import SafetyLimitsError, load_safety_limits
        from robot_wm.core.slew import SlewLimiter, slew_delta
        from robot_wm.core.tasks import get_task
        from robot_wm.registry import resolve

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
                path = self.model_path or str(resolve(self.task_name, "policy", warn=self.get_logger().warning))
                self.runner = PolicyRunner(path, self.joint_names, self.task.control_dt_s, task=self.task_name)
                if not self.model_path and self._swap is None:  # the registry's active policy: follow its updates
                    from robot_wm.nodes.model_swap import PolicySwap

                    self._swap = PolicySwap(self, self.task_name, self.joint_names, self.task.control_dt_s,
                                           in_use=lambda: getattr(self.runner, "version", None))
            self.kin = Kinematics(urdf, self.joint_names)
            self._action_limit = np.asarray(self.task.action_limit_radps, dtype=float)  # what exploration is a fraction of
            self._limits = load_safety_limits()
            # the filter's tool-speed limit at FULL in this node's phase: times the trust speed factor, the limit in force
            self._tool_speed_full = self._limits.tool_speed_max_mps * self._limits.scale_for(TrustLevel.FULL, self.phase).speed
            self.slew = (SlewLimiter(slew_delta(self._limits, self.period_s, self.slew_fraction, self.phase))
                         if self.slew_fraction > 0 else None)
            from robot_wm.core.teleop import Teleop

            self.teleop = Teleop(self.kin, np.zeros(len(self.joint_names)), self.deadman_s)
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
        try:
            return trust_scales(self._limits, *self._trust, base_phase=self.phase)
        except ValueError:  # a malformed TrustState: the filter latches on it; here the safe choice
            return 0.0, 1.0

    def control_step(self) -> None:
        """Run the policy on the latest joint state and goal or reference; publish the nominal command."""
        from robot_wm.core.policy_runner import PolicyOutputError

        if self.runner is None:
            return
        if self._swap is not None:  # (a scripted node has none)
            new = self._swap.take(self.runner)
            if new is not None:
                from robot_wm.nodes.model_swap import retire

                retire(self.runner)
                self.runner = new
        state = self.fresh_state()
        if state is None:
            self.get_logger().warning("no fresh joint state: not commanding", throttle_duration_sec=1.0)
            return
        q, qdot = state
        if self.intervention.active:
            self._teleop_step(q, qdot)
            return
        obs = self._observation(q, qdot)
        if obs is None:
            return
        try:
            action = self.runner.act(obs)
        except (PolicyOutputError, ValueError) as exc:
            self.get_logger().error(f"policy failed, not commanding: {exc}", throttle_duration_sec=1.0)
            return
        speed, accel = self._trust_scales()
        action = self.exploration.apply(action * speed, self._action_limit * speed, self._trust,  # the limits in force
                                        q, self.kin, self._tool_speed_full * speed)
        if self.slew is not None:
            action = self.slew.limit(action, qdot, accel)
        self._pub.publish(Float64MultiArray(data=action.astype(float).tolist()))
        PERIOD_ENDS.mark(PLACE_POLICY)

    # ---- human intervention
    def _intervention_setup(self) -> None:
        from geometry_msgs.msg import TwistStamped
        from rclpy.qos import DurabilityPolicy, QoSProfile

        from robot_wm.msg import InterventionState
        from robot_wm.srv import Intervention as InterventionSrv

        self._state_pub = self.create_publisher(
            InterventionState, "/robot_wm/intervention/state",
            QoSProfile(depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL))
        self.create_subscription(Float64MultiArray, "/robot_wm/teleop/joint_velocity", self._on_teleop_joint, 10)
        self.create_subscription(TwistStamped, "/robot_wm/teleop/twist", self._on_teleop_twist, 10)
        self.create_service(InterventionSrv, "/robot_wm/intervention/take", self._on_take)
        self.create_service(InterventionSrv, "/robot_wm/intervention/release", self._on_release)
        self._state_since = self.get_clock().now().to_msg()
        self._state_reason = "policy in command (start-up)"
        self.create_timer(1.0, self._publish_intervention_state)
        self._publish_intervention_state()

    def _on_teleop_joint(self, msg: Float64MultiArray) -> None:
        self._teleop_input(lambda t: self.teleop.joint_velocity(t, list(msg.data)))

    def _on_teleop_twist(self, msg) -> None:
        lin, ang = msg.twist.linear, msg.twist.angular
        self._teleop_input(lambda t: self.teleop.twist(t, [lin.x, lin.y, lin.z], [ang.x, ang.y, ang.z],
                                                       msg.header.frame_id))

    def _teleop_input(self, apply) -> None:
        from robot_wm.core.teleop import TeleopInputError

        if self.teleop is None or not self.intervention.active:
            return  # jogs outside a take-over are not commands (a stale jog must not move the arm later)
        try:
            apply(time.monotonic())
        except TeleopInputError as exc:
            self.get_logger().error(f"ignoring teleop command: {exc}", throttle_duration_sec=1.0)

    def _now_s(self) -> float:
        return self.get_clock().now().nanoseconds * 1e-9

    def _on_take(self, request, response):
        def take():
            if self.teleop is None:
                return False, "policy node not configured: nothing to take over from"
            self.teleop.clear()
            ok, message = self.intervention.take(request.reason, self._now_s())
            if ok:
                self._state_changed(f"operator took over: {self.intervention.current.reason}")
            return ok, message

        return self._answer("take", take, response)

    def _on_release(self, request, response):
        def release():
            state = self.fresh_state()
            rec = self.intervention.current
            ok, message = self.intervention.release(request.reason, self._now_s(), None if state is None else state[1])
            if ok:
                if self.slew is not None:
                    self.slew.reset()  # the policy's first command is limited around the measured (rest) velocity
                self.teleop.clear()
                self._log_intervention(rec)
                self._state_changed(f"handed back to the policy: {rec.release_reason}")
            return ok, message

        return self._answer("release", release, response)

    def _answer(self, verb: str, body, response):
        """Run a service's body; it always answers (an exception is a refusal naming it) and logs."""
        try:
            response.success, response.message = body()
        except Exception as exc:  # noqa: BLE001 - a service must answer; the filter keeps guarding
            response.success, response.message = False, f"{verb} failed inside the policy node: {exc!r}"
        try:
            self.get_logger().warning(f"intervention {verb}: {'accepted' if response.success else 'refused'}: "
                                      f"{response.message}")
        except Exception:  # noqa: BLE001 - logging must not end the node
            pass
        return response

    def _state_changed(self, reason: str) -> None:
        self._state_since = self.get_clock().now().to_msg()
        self._state_reason = reason
        self._publish_intervention_state()

    def _publish_intervention_state(self) -> None:
        from robot_wm.msg import InterventionState

        msg = InterventionState(active=self.intervention.active, since=self._state_since, reason=self._state_reason,
                                count=len(self.intervention.records))
        msg.header.stamp = self.get_clock().now().to_msg()
        self._state_pub.publish(msg)

    def _log_intervention(self, record) -> None:
        import json
        from pathlib import Path

        from robot_wm.paths import state_dir

        path = Path(self.intervention_log) if self.intervention_log else state_dir() / "interventions.jsonl"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a") as f:
                f.write(json.dumps({"node": self.get_fully_qualified_name(), "task": self.task_name,
                                    **record.to_json()}) + "\n")
        except OSError as exc:
            self.get_logger().error(f"intervention log {path}: {exc} (the intervention itself went through)")

    def _teleop_step(self, q: np.ndarray, qdot: np.ndarray) -> None:
        """The operator's jog in the policy's slot: clipped to the limits in force, slew-limited."""
        speed, accel = self._trust_scales()  # the same factors as the policy's (0 on a malformed TrustState)
        full = self._limits.scale_for(TrustLevel.FULL, self.phase).speed
        self.teleop.set_speed_max(np.asarray(self._limits.velocity_max_radps) * speed * full)
        action = self.teleop.command(time.monotonic(), q)
        if self.slew is not None:
            action = self.slew.limit(action, qdot, accel)
        self._pub.publish(Float64MultiArray(data=action.astype(float).tolist()))
        PERIOD_ENDS.mark(PLACE_POLICY)


main = main_for(PolicyNode)

if __name__ == "__main__":
    main()
