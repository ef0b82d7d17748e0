"""policy: the learned reaching policy (ONNX) as a lifecycle node.

configure loads and validates the model (sidecar, hash, joint order); activate starts the
control timer. Each period it reads the latest /joint_states and goal, runs the policy and
publishes the nominal joint velocity command on /robot_wm/action_nominal. It never talks to the
hardware: the safety filter is the only publisher of hardware commands. With a stale joint
state or no goal it publishes nothing, and the filter's staleness check stops the arm.
"""
from __future__ import annotations

import time

import numpy as np
from geometry_msgs.msg import PointStamped
from rclpy.context import Context
from rclpy.lifecycle import Node as LifecycleNode
from rclpy.lifecycle import State, TransitionCallbackReturn
from rclpy.qos import QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray

from robot_wm.nodes.conversions import InputError, joint_state_arrays, vector
from robot_wm.nodes.params import declare
from robot_wm.nodes.runner import main_for


class PolicyNode(LifecycleNode):
    """Run the ONNX policy each control period on the latest joint state and goal."""

    def __init__(self, context: Context | None = None, node_name: str = "policy") -> None:
        super().__init__(node_name, context=context)
        self.model_path = declare(self, "model_path", "", "policy .onnx (empty: models/policy.onnx of the package)", read_only=True)
        self.period_s = declare(self, "control_period_s", 0.01, "control period (s)", range_=(0.002, 0.1), read_only=True)
        self.stale_s = declare(self, "stale_after_s", 0.05, "joint state older than this (s) is not used", range_=(0.001, 1.0), read_only=True)
        self.joint_names = list(declare(self, "joint_names", [""], "joint order of commands", read_only=True))
        self.states_topic = declare(self, "joint_states_topic", "/joint_states", "sensor_msgs/JointState input", read_only=True)
        self.goal_topic = declare(self, "goal_topic", "/robot_wm/goal", "geometry_msgs/PointStamped goal (m, base frame)", read_only=True)
        self.action_topic = declare(self, "action_topic", "/robot_wm/action_nominal", "Float64MultiArray nominal command (rad/s)", read_only=True)
        self.autostart = declare(self, "autostart", True, "configure and activate on start-up", read_only=True)
        self.runner = None
        self.kin = None
        self._timer = None
        self._pub = None
        self._state: tuple[float, np.ndarray, np.ndarray] | None = None
        self._goal: np.ndarray | None = None
        self.input_errors = 0
        self.create_subscription(JointState, self.states_topic, self._on_state, QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE))
        self.create_subscription(PointStamped, self.goal_topic, self._on_goal, 10)
        if self.autostart:
            self._autostart_timer = self.create_timer(0.0, self._autostart)

    def _autostart(self) -> None:
        self._autostart_timer.cancel()
        if self.trigger_configure() == TransitionCallbackReturn.SUCCESS:
            self.trigger_activate()

    # ---- lifecycle
    def on_configure(self, state: State) -> TransitionCallbackReturn:
        from robot_wm import description
        from robot_wm.core.kinematics import Kinematics
        from robot_wm.core.onnx_model import ModelError
        from robot_wm.core.policy_runner import PolicyRunner
        from robot_wm.core.task import load_task
        from robot_wm.paths import data_path

        try:
            urdf = description.expand()
            names = description.joint_limits(urdf).names
            if self.joint_names == [""]:
                self.joint_names = list(names)
            task = load_task()
            path = self.model_path or str(data_path("models", "policy.onnx", must_exist=False))
            self.runner = PolicyRunner(path, self.joint_names, task.control_dt_s)
            self.kin = Kinematics(urdf, self.joint_names)
        except (ModelError, ValueError, OSError) as exc:
            self.get_logger().error(f"configure failed: {exc}")
            return TransitionCallbackReturn.FAILURE
        self._pub = self.create_lifecycle_publisher(Float64MultiArray, self.action_topic, 10)
        self.get_logger().info(f"policy {self.runner.version} loaded from {path}")
        return TransitionCallbackReturn.SUCCESS

    def on_activate(self, state: State) -> TransitionCallbackReturn:
        self._timer = self.create_timer(self.period_s, self._on_tick)
        return super().on_activate(state)

    def on_deactivate(self, state: State) -> TransitionCallbackReturn:
        if self._timer is not None:
            self.destroy_timer(self._timer)
            self._timer = None
        return super().on_deactivate(state)

    def on_cleanup(self, state: State) -> TransitionCallbackReturn:
        if self._pub is not None:
            self.destroy_lifecycle_publisher(self._pub)
            self._pub = None
        self.runner = None
        return TransitionCallbackReturn.SUCCESS

    # ---- inputs
    def _on_state(self, msg: JointState) -> None:
        try:
            q, qdot = joint_state_arrays(msg, self.joint_names if self.joint_names != [""] else list(msg.name))
        except InputError as exc:
            self.input_errors += 1
            self._state = None
            self.get_logger().error(f"ignoring joint state: {exc}", throttle_duration_sec=1.0)
            return
        self._state = (time.monotonic(), q, qdot)

    def _on_goal(self, msg: PointStamped) -> None:
        try:
            self._goal = vector([msg.point.x, msg.point.y, msg.point.z], 3, "goal")
        except InputError as exc:
            self.get_logger().error(f"ignoring goal: {exc}", throttle_duration_sec=1.0)

    # ---- control
    def _on_tick(self) -> None:
        from robot_wm.core.policy_runner import PolicyOutputError, make_obs

        if self._state is None or self._goal is None or self.runner is None:
            return
        received_s, q, qdot = self._state
        if time.monotonic() - received_s > self.stale_s:
            self.get_logger().warning("joint state stale: not commanding", throttle_duration_sec=1.0)
            return
        try:
            action = self.runner.act(make_obs(q, qdot, self.kin.tool_position_m(q), self._goal))
        except (PolicyOutputError, ValueError) as exc:
            self.get_logger().error(f"policy failed, not commanding: {exc}", throttle_duration_sec=1.0)
            return
        self._pub.publish(Float64MultiArray(data=action.astype(float).tolist()))


main = main_for(PolicyNode)

if __name__ == "__main__":
    main()
