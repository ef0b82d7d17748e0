"""The world_model node in-process: the forecast marker is decimated and computed only for a listener."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from robot_wm.contracts import JOINT_NAMES

from conftest import wait_for


@pytest.mark.ros
def test_the_forecast_marker_is_decimated_and_rolled_only_while_someone_listens():
    import rclpy
    from rclpy.context import Context
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.lifecycle import TransitionCallbackReturn
    from sensor_msgs.msg import JointState
    from std_msgs.msg import Float64MultiArray
    from visualization_msgs.msg import Marker

    from robot_wm.msg import WorldModelPrediction
    from robot_wm.nodes.world_model_node import WorldModelNode

    context = Context()
    rclpy.init(context=context, args=["--ros-args", "-p", "autostart:=false", "-p", "forecast_steps:=20",
                                      "-p", "forecast_rate_hz:=10.0"])
    node = WorldModelNode(context=context)
    listener = rclpy.create_node("forecast_listener", context=context)
    executor = SingleThreadedExecutor(context=context)
    spinner = None
    try:
        assert node.trigger_configure() == TransitionCallbackReturn.SUCCESS
        assert node.trigger_activate() == TransitionCallbackReturn.SUCCESS
        q = np.array([0.0, -0.8, 1.2, -0.4, 0.3, 0.0])

        def periods(n: int) -> float:
            start = time.monotonic()
            for _ in range(n):
                state = JointState(name=list(JOINT_NAMES), position=q.tolist(), velocity=[0.0] * 6)
                state.header.stamp = node.get_clock().now().to_msg()
                node._on_joint_state(state)
                node._on_command(Float64MultiArray(data=[0.2, -0.1, 0.1, 0.0, 0.3, 0.0]))
                time.sleep(0.01)
            return time.monotonic() - start

        predictions, markers = [], []
        listener.create_subscription(WorldModelPrediction, "/robot_wm/prediction", predictions.append, 100)
        periods(30)  # nobody on the marker topic: no forecast rolled
        assert node.forecasts == 0
        listener.create_subscription(Marker, "/robot_wm/prediction_marker", markers.append, 100)
        executor.add_node(listener)
        spinner = threading.Thread(target=executor.spin, daemon=True)
        spinner.start()
        assert wait_for(lambda: node._marker_pub.get_subscription_count() > 0, 10.0)
        elapsed = periods(100)
        assert 1 <= node.forecasts <= elapsed / 0.1 + 1, (node.forecasts, elapsed)
        assert wait_for(lambda: len(markers) >= node.forecasts and len(predictions) >= 100, 5.0)
        m = markers[-1]
        assert (m.type, m.header.frame_id, len(m.points)) == (Marker.LINE_STRIP, "base_link", 21)
        path = np.array([(p.x, p.y, p.z) for p in m.points])
        assert np.all(np.isfinite(path)) and np.linalg.norm(path[-1] - path[0]) > 1e-3  # it moves under the command
    finally:
        executor.shutdown(timeout_sec=2.0)
        if spinner is not None:
            spinner.join(timeout=3.0)
        listener.destroy_node()
        node.destroy_node()
        rclpy.shutdown(context=context)
