"""policy: the learned reaching policy (ONNX) as a lifecycle node.

configure loads and validates the model (sidecar, hash, joint order); activate starts the
control timer. Each period it reads the latest /joint_states and goal, runs the policy and
publishes the nominal joint velocity command on /robot_wm/action_nominal. It never talks to the
hardware: the safety filter is the only publisher of hardware commands. With a stale joint
state or no goal it publishes nothing, and the filter's staleness check stops the arm.
"""
from __future__ import annotations

import numpy as np
from geometry_msgs.msg import PointStamped
from rclpy.context import Context
from rclpy.lifecycle import State, TransitionCallbackReturn
from std_msgs.msg import Float64MultiArray

from robot_wm.nodes.control_node import ControlNode
from robot_wm.nodes.conversions import InputError, vector
from robot_wm.nodes.params import declare
from robot_wm.nodes.runner import main_for


class PolicyNode(ControlNode):
    """Run the ONNX policy each control period on the latest joint state and goal."""

    def __init__(self, context: Context | None = None, node_name: str = "policy") -> None:
        super().__init__(node_name, context=context)
        self.model_path = declare(self, "model_path", "", "policy .onnx (empty: models/policy.onnx of the package)", read_only=True)
        self.goal_topic = declare(self, "goal_topic", "/robot_wm/goal", "geometry_msgs/PointStamped goal (m, base frame)", read_only=True)
        self.action_topic = declare(self, "action_topic", "/robot_wm/action_nominal", "Float64MultiArray nominal command (rad/s)", read_only=True)
        self.runner = None
        self.kin = None
        self._pub = None
        self._goal: np.ndarray | None = None
        self.create_subscription(PointStamped, self.goal_topic, self._on_goal, 10)

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

    # ---- control
    def control_step(self) -> None:
        """Run the policy on the latest joint state and goal; publish the nominal command."""
        from robot_wm.core.policy_runner import PolicyOutputError, make_obs

        if self._goal is None or self.runner is None:
            return
        state = self.fresh_state()
        if state is None:
            self.get_logger().warning("no fresh joint state: not commanding", throttle_duration_sec=1.0)
            return
        q, qdot = state
        try:
            action = self.runner.act(make_obs(q, qdot, self.kin.tool_position_m(q), self._goal))
        except (PolicyOutputError, ValueError) as exc:
            self.get_logger().error(f"policy failed, not commanding: {exc}", throttle_duration_sec=1.0)
            return
        self._pub.publish(Float64MultiArray(data=action.astype(float).tolist()))


main = main_for(PolicyNode)

if __name__ == "__main__":
    main()
