"""world_model: the learned world model (ONNX ensemble) predicting the arm's next state.

On each command actually sent to the hardware (/forward_velocity_controller/commands: what the
safety filter let through, not what the policy wanted) it takes the latest /joint_states (the
state the filter judged) and publishes a WorldModelPrediction of the next measured state with its
epistemic and aleatoric standard deviations on /robot_wm/prediction, stamped with that state's
stamp: the trust monitor pairs it with the state measured one period later. Predicting on the
command rather than on a timer of its own keeps the pair aligned (on a timer, a prediction could
be made with the previous period's command: the ROS path's one-step error was 2-3x the library
loop's). While no command arrives (the hardware holds zero) it predicts zero on its timer.

Optionally it also rolls the model ``forecast_steps`` periods ahead under the current command and
publishes the predicted tool path as a visualization_msgs/Marker on /robot_wm/prediction_marker
(RViz, Foxglove): at most ``forecast_rate_hz`` times a second, and only while something subscribes
to it. The forecast is ``forecast_steps - 1`` further inferences and forward kinematics: rolled on
every 100 Hz period it was most of this node's CPU, for a picture nobody may be looking at.
"""
from __future__ import annotations

import time

import numpy as np
from geometry_msgs.msg import Point
from rclpy.context import Context
from rclpy.lifecycle import State, TransitionCallbackReturn
from std_msgs.msg import Float64MultiArray
from visualization_msgs.msg import Marker

from robot_wm.contracts import N_JOINTS, STATE_LAYOUT
from robot_wm.msg import WorldModelPrediction
from robot_wm.nodes.control_node import LATEST_ONLY, ControlNode
from robot_wm.nodes.conversions import InputError, vector
from robot_wm.nodes.model_swap import PERIOD_ENDS, PLACE_WORLD_MODEL, retire
from robot_wm.nodes.params import declare
from robot_wm.nodes.runner import main_for


class WorldModelNode(ControlNode):
    """Predict the next joint state each control period from the state and the command sent."""

    def __init__(self, context: Context | None = None, node_name: str = "world_model") -> None:
        super().__init__(node_name, context=context)
        self.model_path = declare(self, "model_path", "", "world model .onnx (empty: the task's active set of the "
                                  "model registry, robot_wm.registry.resolve; with none, the package's)",
                                  read_only=True)
        self.task = declare(self, "task", "reach", "the task whose active model set gives the default world model "
                            "(reach, track; robot_wm.graph.plan sets it, as for the safety filter)", read_only=True)
        self._swap = None  # WorldModelSwap once configured from the registry
        self.shadow_s = declare(self, "shadow_s", 60.0, "after a swap, the replaced model also predicts for this long "
                                "(s) on /robot_wm/prediction_shadow: the trust monitor's reference for a rollback "
                                "(0: off)", range_=(0.0, 3600.0), read_only=True)
        self._shadow = None  # (the replaced runner, until when it predicts on /robot_wm/prediction_shadow)
        self._shadow_pub = None
        self.forecast_steps = declare(self, "forecast_steps", 0, "periods of the tool-path forecast marker (0: off)", range_=(0, 200), read_only=True)
        self.forecast_period_s = 1.0 / declare(self, "forecast_rate_hz", 10.0, "forecast markers per second at most",
                                                range_=(0.1, 1000.0), read_only=True)
        self.forecasts = 0  # markers published
        self._last_forecast_s = -np.inf
        command_topic = declare(self, "command_topic", "/forward_velocity_controller/commands", "the command sent to the hardware", read_only=True)
        self.base_frame = declare(self, "base_frame", "base_link", "frame of the forecast marker", read_only=True)
        self.runner = None
        self.kin = None
        self._pred_pub = None
        self._marker_pub = None
        self._command: tuple[float, np.ndarray] | None = None
        self.create_subscription(Float64MultiArray, command_topic, self._on_command, LATEST_ONLY)

    def on_configure(self, state: State) -> TransitionCallbackReturn:
        from robot_wm import description
        from robot_wm.core.kinematics import Kinematics
        from robot_wm.core.onnx_model import ModelError
        from robot_wm.core.task import load_task
        from robot_wm.core.world_model_runner import WorldModelRunner
        from robot_wm.registry import resolve

        try:
            urdf = description.expand()
            if self.joint_names == [""]:
                self.joint_names = list(description.joint_limits(urdf).names)
            path = self.model_path or str(resolve(self.task, "world_model", warn=self.get_logger().warning))
            # predictions only (the safety filter linearizes with its own runner)
            self.runner = WorldModelRunner(path, self.joint_names, load_task().control_dt_s, analytic=False)
            self.kin = Kinematics(urdf, self.joint_names)
        except (ModelError, ValueError, OSError) as exc:
            self.get_logger().error(f"configure failed: {exc}")
            return TransitionCallbackReturn.FAILURE
        if not self.model_path and self._swap is None:  # registry-managed: online updates and rollbacks swap it
            from robot_wm.nodes.model_swap import WorldModelSwap

            self._swap = WorldModelSwap(self, self.task, self.joint_names, load_task().control_dt_s, analytic=False,
                                        in_use=lambda: getattr(self.runner, "version", None))
            self._shadow_pub = self.create_publisher(WorldModelPrediction, "/robot_wm/prediction_shadow", 10)
        self._pred_pub = self.create_lifecycle_publisher(WorldModelPrediction, "/robot_wm/prediction", 10)
        if self.forecast_steps:
            self._marker_pub = self.create_lifecycle_publisher(Marker, "/robot_wm/prediction_marker", 10)
        self.get_logger().info(f"world model {self.runner.version} loaded from {path}")
        return TransitionCallbackReturn.SUCCESS

    def on_activate(self, state: State) -> TransitionCallbackReturn:
        self.runner.reset()
        return super().on_activate(state)

    def _on_command(self, msg: Float64MultiArray) -> None:
        try:
            self._command = (time.monotonic(), vector(msg.data, N_JOINTS, "command"))
        except InputError as exc:
            self.get_logger().error(f"ignoring command: {exc}", throttle_duration_sec=1.0)
            return
        if self._pred_pub is not None and self._control_timer is not None:  # active
            self._predict(self._command[1])
            PERIOD_ENDS.mark(PLACE_WORLD_MODEL)  # the last of a period's work in the composed process

    def control_step(self) -> None:
        """Without commands (the hardware holds zero after its timeout) predict zero each period."""
        if not (self._command and time.monotonic() - self._command[0] <= self.stale_s):
            self._predict(np.zeros(N_JOINTS))
            PERIOD_ENDS.mark(PLACE_WORLD_MODEL)

    def _predict(self, command: np.ndarray) -> None:
        """Predict the next state from the latest one and ``command``; publish it."""
        state = self.fresh_state(time.monotonic())
        if state is None or self.runner is None:
            return
        q, qdot = state
        if self._swap is not None:  # a world model loaded off this thread comes in between two predictions
            swapped = self._swap.take(self.runner)
            if swapped is not None:
                if self.shadow_s > 0:  # the replaced model predicts beside it for a while: the rollback's reference
                    retire(self._shadow[0] if self._shadow is not None else None)  # freed off this thread
                    self._shadow = (self.runner, time.monotonic() + self.shadow_s)
                else:
                    retire(self.runner)
                self.runner = swapped
        pred = self.runner.predict(q, qdot, command)
        msg = WorldModelPrediction(joint_names=self.joint_names, model_version=self.runner.version, horizon_steps=1,
                                   dt_s=float(self.period_s))
        # the stamp of the state the prediction starts from (the message's contract): the trust
        # monitor pairs it with the joint state stamped one period later
        if self.state_stamp_ns:
            msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(self.state_stamp_ns, 1_000_000_000)
        else:
            msg.header.stamp = self.get_clock().now().to_msg()
        msg.position_rad = pred.next_q_rad.tolist()
        msg.velocity_radps = pred.next_qdot_radps.tolist()
        q_block, qdot_block = STATE_LAYOUT["q_rad"], STATE_LAYOUT["qdot_radps"]
        msg.position_std_epistemic_rad = pred.epistemic_std[q_block].tolist()
        msg.position_std_aleatoric_rad = pred.aleatoric_std[q_block].tolist()
        msg.velocity_std_epistemic_radps = pred.epistemic_std[qdot_block].tolist()
        msg.velocity_std_aleatoric_radps = pred.aleatoric_std[qdot_block].tolist()
        self._pred_pub.publish(msg)
        if self._shadow is not None:
            self._predict_shadow(q, qdot, command, msg.header.stamp)
        if self._forecast_due():
            self._publish_forecast(q, pred.next_q_rad, pred.next_qdot_radps, command, msg.header.stamp)

    def _predict_shadow(self, q: np.ndarray, qdot: np.ndarray, command: np.ndarray, stamp) -> None:
        """The replaced world model's prediction of the same period, while its shadow time lasts."""
        runner, until = self._shadow
        if time.monotonic() > until:
            retire(runner)  # freed off this thread
            self._shadow = None
            return
        try:
            pred = runner.predict(q, qdot, command)
        except Exception as exc:  # noqa: BLE001 (the shadow is advice: it ends, the node goes on)
            self.get_logger().warning(f"shadow prediction of {runner.version} ended: {exc}")
            retire(runner)
            self._shadow = None
            return
        msg = WorldModelPrediction(joint_names=self.joint_names, model_version=runner.version, horizon_steps=1,
                                   dt_s=float(self.period_s), position_rad=pred.next_q_rad.tolist(),
                                   velocity_radps=pred.next_qdot_radps.tolist())
        msg.header.stamp = stamp
        self._shadow_pub.publish(msg)

    def _forecast_due(self) -> bool:
        if self._marker_pub is None:
            return False
        now = time.monotonic()
        if now - self._last_forecast_s < self.forecast_period_s or not self._marker_pub.get_subscription_count():
            return False
        self._last_forecast_s = now
        return True

    def _publish_forecast(self, q_now: np.ndarray, q: np.ndarray, qdot: np.ndarray, command: np.ndarray, stamp) -> None:
        """Roll the model on under the current command; publish the tool path as a line strip."""
        history = self.runner.action_history  # the H-1 latest commands, this period's included
        path = [self.kin.tool_position_m(q_now), self.kin.tool_position_m(q)]
        for _ in range(self.forecast_steps - 1):
            window = np.vstack([history, command])
            batch = self.runner.predict_batch(q[None], qdot[None], window[None])
            history = window[1:]
            q, qdot = batch.next_q_rad[0], batch.next_qdot_radps[0]
            path.append(self.kin.tool_position_m(q))
        marker = Marker(ns="robot_wm_forecast", id=0, type=Marker.LINE_STRIP, action=Marker.ADD)
        marker.header.stamp = stamp
        marker.header.frame_id = self.base_frame
        marker.scale.x = 0.005
        marker.color.r, marker.color.g, marker.color.b, marker.color.a = 0.1, 0.6, 1.0, 0.9
        marker.pose.orientation.w = 1.0
        marker.points = [Point(x=float(p[0]), y=float(p[1]), z=float(p[2])) for p in path]
        self._marker_pub.publish(marker)
        self.forecasts += 1


main = main_for(WorldModelNode)

if __name__ == "__main__":
    main()
