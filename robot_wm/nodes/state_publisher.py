"""robot_state_publisher's job in Python, for machines without it (the pip path has no wheel of it).

What RViz, Foxglove and every TF user expect from a ROS arm: the description on
``/robot_description`` (std_msgs/String, transient local, like robot_state_publisher's) and the arm's
TF, the fixed joints once on ``/tf_static`` and the movable ones on ``/tf`` from each
``/joint_states`` (stamped with the joint state's stamp, at most ``publish_frequency`` Hz, judged by
the stamps). config/graph.yaml names the C++ robot_state_publisher first; robot_wm.graph.plan picks
this node where that package cannot be found (``robot-wm up`` always: it starts no C++ nodes).
The transforms come from robot_wm.core.tf_tree (pinocchio, the URDF's joints as the tree's edges).
"""
from __future__ import annotations

import time

from geometry_msgs.msg import TransformStamped
from rclpy.context import Context
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from rclpy.serialization import deserialize_message
from sensor_msgs.msg import JointState
from std_msgs.msg import String
from tf2_msgs.msg import TFMessage

from robot_wm.core.tf_tree import Transform, TransformTree
from robot_wm.nodes.conversions import cdr_stamp_ns
from robot_wm.nodes.params import declare
from robot_wm.nodes.runner import NodeConfigError, main_for

_arrival_ns = time.monotonic_ns  # the clock of unstamped states (a name of its own: tests drive it)
_LATCHED = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)


class StatePublisherNode(Node):
    """/robot_description, /tf_static and /tf of the arm, from the description and /joint_states."""

    def __init__(self, context: Context | None = None, node_name: str = "robot_state_publisher") -> None:
        super().__init__(node_name, context=context)
        description = declare(self, "robot_description", "", "the expanded URDF (robot_wm.graph.plan sets it)",
                              read_only=True)
        self.rate_hz = declare(self, "publish_frequency", 50.0, "most /tf messages per second (Hz, by stamp)",
                               range_=(0.1, 1000.0), read_only=True)
        self.prefix = declare(self, "frame_prefix", "", "prefix of every frame name in /tf and /tf_static",
                              read_only=True)
        states_topic = declare(self, "joint_states_topic", "/joint_states", "sensor_msgs/JointState input",
                               read_only=True)
        if not description:
            from robot_wm import description as desc

            description = desc.expand()  # started by hand: the package's own arm
        try:
            self.tree = TransformTree(description)
        except ValueError as exc:
            raise NodeConfigError(f"robot_state_publisher: parameter robot_description: {exc}") from exc
        self._period_ns = int(1e9 / self.rate_hz)
        self._last_ns: int | None = None
        self.rejected = 0
        self._tf_pub = self.create_publisher(TFMessage, "/tf", 100)
        self._static_pub = self.create_publisher(TFMessage, "/tf_static", _LATCHED)
        self._description_pub = self.create_publisher(String, "/robot_description", _LATCHED)
        self._description_pub.publish(String(data=description))
        self._static_pub.publish(TFMessage(transforms=[self._msg(t, self.get_clock().now().to_msg())
                                                       for t in self.tree.static_transforms()]))
        # raw: of the arm's 500 Hz states only the 50 Hz that are published are deserialized (a
        # deserialized subscription cost a quarter of a core, on a 2-core machine that runs the stack)
        self.create_subscription(JointState, states_topic, self._on_raw_joint_state,
                                 QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE), raw=True)
        self.get_logger().info(f"publishing /robot_description, /tf_static and /tf (joints {list(self.tree.joint_names)}, "
                               f"at most {self.rate_hz:g} Hz) from {states_topic}")

    def _msg(self, t: Transform, stamp) -> TransformStamped:
        msg = TransformStamped()
        msg.header.stamp = stamp
        msg.header.frame_id = self.prefix + t.parent
        msg.child_frame_id = self.prefix + t.child
        tr, rot = msg.transform.translation, msg.transform.rotation
        tr.x, tr.y, tr.z = t.translation
        rot.x, rot.y, rot.z, rot.w = t.rotation_xyzw
        return msg

    def _on_raw_joint_state(self, data: bytes) -> None:
        # an unstamped arm (0), or a header this reader does not know: at most the rate by arrival
        stamp_ns = cdr_stamp_ns(data) or _arrival_ns()
        if self._last_ns is not None and 0 <= stamp_ns - self._last_ns < self._period_ns:
            return  # stamps going backwards (a restarted source) publish at once
        try:
            msg = deserialize_message(data, JointState)
        except Exception as exc:  # noqa: BLE001 - an unreadable message is counted, never the end of the node
            self.rejected += 1
            self.get_logger().warning(f"unreadable joint state ignored: {type(exc).__name__}: {exc}",
                                      throttle_duration_sec=5.0)
            return
        self._on_joint_state(msg, stamp_ns)

    def _on_joint_state(self, msg: JointState, stamp_ns: int) -> None:
        if len(msg.name) != len(msg.position):
            self.rejected += 1
            self.get_logger().warning(f"joint state with {len(msg.name)} names and {len(msg.position)} positions: "
                                      "ignored", throttle_duration_sec=5.0)
            return
        try:
            transforms = self.tree.transforms(dict(zip(msg.name, msg.position)))
        except ValueError as exc:
            self.rejected += 1
            self.get_logger().warning(f"joint state ignored: {exc}", throttle_duration_sec=5.0)
            return
        self._last_ns = stamp_ns
        self._tf_pub.publish(TFMessage(transforms=[self._msg(t, msg.header.stamp) for t in transforms]))


main = main_for(StatePublisherNode)

if __name__ == "__main__":
    main()
