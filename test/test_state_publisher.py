"""/robot_description and the arm's TF on every path: robot_wm's state publisher (robot_state_publisher's
job where no package provides it) and the transform tree it publishes."""
from __future__ import annotations

import math

import numpy as np
import pinocchio as pin
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from robot_wm import description, graph
from robot_wm.core.kinematics import Kinematics
from robot_wm.core.tf_tree import TransformTree
from robot_wm.process_group import command_for

from conftest import wait_for
from rosclient import ArmClient, arm_sim_command

URDF = description.expand()
JOINTS = description.joint_limits(URDF).names
TREE = TransformTree(URDF)
KIN = Kinematics(URDF, JOINTS)


def _se3(t):
    return pin.XYZQUATToSE3(np.r_[t.translation, t.rotation_xyzw])


def _chain(transforms, child):
    """Compose parent->child edges from the root to ``child`` (what a TF listener does)."""
    by_child = {t.child: t for t in transforms}
    pose = pin.SE3.Identity()
    while child in by_child:
        edge = by_child[child]
        pose = _se3(edge) * pose
        child = edge.parent
    return child, pose


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-math.pi, math.pi), min_size=len(JOINTS), max_size=len(JOINTS)))
def test_the_tree_composes_to_the_kinematics_tool_pose(q):
    q = np.array(q)
    transforms = TREE.transforms(dict(zip(JOINTS, q))) + TREE.static_transforms()
    root, pose = _chain(transforms, "tool0")
    expected = KIN.frame_pose(q)
    assert root == "world"
    np.testing.assert_allclose(pose.translation, expected.translation, atol=1e-9)
    np.testing.assert_allclose(pose.rotation, expected.rotation, atol=1e-9)
    for t in transforms:
        assert np.linalg.norm(t.rotation_xyzw) == pytest.approx(1.0)


def test_the_tree_has_one_edge_per_urdf_joint_and_keeps_unnamed_joints():
    tree = TransformTree(URDF)
    moving = tree.transforms({})
    assert [t.child for t in moving] == ["shoulder_link", "upper_arm_link", "forearm_link", "wrist_1_link",
                                         "wrist_2_link", "wrist_3_link"]
    assert {t.child for t in tree.static_transforms()} == {"base_link", "ft_sensor_link", "tool0"}
    tree.transforms({JOINTS[0]: 0.7, "gripper_joint": 3.0})  # another device's joint on the topic: ignored
    after = tree.transforms({JOINTS[1]: 0.2})  # a partial message: joint 0 keeps 0.7
    expected = TransformTree(URDF).transforms({JOINTS[0]: 0.7, JOINTS[1]: 0.2})
    assert after == expected
    with pytest.raises(ValueError, match="not finite"):
        tree.transforms({JOINTS[2]: float("nan")})
    assert tree.transforms({}) == expected  # the NaN changed nothing
    with pytest.raises(ValueError, match="not a usable URDF"):
        TransformTree("<robot name='x'><link name='a'/>")


def test_plans_use_the_state_publisher_where_robot_state_publisher_is_missing():
    specs = {s.name: s for s in graph.plan("mujoco", fallbacks=True)}  # the pip path: nothing C++
    rsp = specs["robot_state_publisher"]
    assert (rsp.package, rsp.executable, rsp.module) == ("robot_wm", "state_publisher", "robot_wm.nodes.state_publisher")
    assert rsp.parameters["robot_description"] == URDF
    warnings = []
    specs = {s.name: s for s in graph.plan("mock", installed=lambda p: p != "robot_state_publisher", warn=warnings.append,
                                                fallbacks=True)}
    assert specs["robot_state_publisher"].executable == "state_publisher"
    assert warnings == ["package 'robot_state_publisher' not found: robot_wm's state_publisher runs as "
                        "robot_state_publisher instead"]
    specs = {s.name: s for s in graph.plan("mock", installed=lambda p: True, warn=warnings.append, fallbacks=False)}
    assert specs["robot_state_publisher"].executable == "robot_state_publisher"  # a ROS install: the real one, always
    assert "robot_state_publisher" not in {s.name for s in graph.plan("mujoco", fallbacks=False)}
    assert len(warnings) == 1


def test_a_malformed_fallback_entry_is_named(tmp_path):
    text = (graph.config_path("graph.yaml").read_text()
            .replace("fallback: {package: robot_wm, executable: state_publisher, module: robot_wm.nodes.state_publisher}",
                     "fallback: {package: robot_wm}"))
    bad = tmp_path / "graph.yaml"
    bad.write_text(text)
    with pytest.raises(graph.GraphError, match=r"common\[0\]: field 'fallback' must map exactly"):
        graph.plan("mujoco", graph_path=bad)


@pytest.mark.ros
def test_the_node_publishes_the_description_and_tf_stamped_like_the_joint_states(spawn, ros_context):
    from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
    from sensor_msgs.msg import JointState
    from std_msgs.msg import String
    from tf2_msgs.msg import TFMessage

    arm = spawn(arm_sim_command())
    spec = next(s for s in graph.plan("mujoco", stack=False, fallbacks=True) if s.name == "robot_state_publisher")
    pub = spawn(command_for(spec))
    client = ArmClient(ros_context, start=False)  # records /joint_states with their stamps
    tf: list = []
    client.node.create_subscription(TFMessage, "/tf", tf.append, 100)
    stray = client.node.create_publisher(JointState, "/joint_states", 10)
    client.start()
    late = None
    try:
        assert wait_for(lambda: len(tf) >= 60, 60.0), f"no /tf:\n{pub.output()}\n{arm.output()}"
        # a late subscriber still gets the description and the static transforms (transient local)
        late = ArmClient(ros_context, name="late_client", start=False)
        latched = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)
        described, static = [], []
        late.node.create_subscription(String, "/robot_description", described.append, latched)
        late.node.create_subscription(TFMessage, "/tf_static", static.append, latched)
        late.start()
        assert wait_for(lambda: described and static, 20.0), pub.output()
        assert described[0].data == URDF
        assert {t.child_frame_id for t in static[0].transforms} == {"base_link", "ft_sensor_link", "tool0"}
        # a NaN joint state from a faulty source is ignored; the node goes on. Sent again until the node says
        # so: one sent before the node's reader matched this publisher (discovery, slow on a loaded machine)
        # would be lost, and the node would have nothing to ignore
        nan_state = JointState(name=list(JOINTS), position=[float("nan")] * len(JOINTS))
        assert wait_for(lambda: stray.publish(nan_state) or "not finite" in pub.output(), 20.0, 0.1), pub.output()
        n = len(tf)
        assert wait_for(lambda: len(tf) >= n + 20, 20.0), pub.output()
        assert pub.process.poll() is None and "not finite" in pub.output()

        def stamp(m):
            return m.transforms[0].header.stamp.sec + 1e-9 * m.transforms[0].header.stamp.nanosec

        def observed():
            with client.lock:
                states = {s[5]: s[1] for s in client.states if s[4]}  # stamp (s) -> positions
            tfs = list(tf)
            return states, tfs, [m for m in tfs if stamp(m) in states]

        # each /tf carries a measured joint state's stamp and its positions (this client may drop some
        # of the 500 Hz states on a loaded machine, or discover the arm late: compare those it has)
        assert wait_for(lambda: len(observed()[2]) >= 5, 20.0), [(len(x)) for x in observed()]
        states, tfs, matched = observed()
        stamps = [stamp(m) for m in tfs[-40:]]
        # at most publish_frequency (50 Hz), judged by the stamps: 20 ms apart (one 2 ms state period of slack)
        assert min(np.diff(stamps)) >= 0.018
        for m in matched[-5:]:
            expected = TransformTree(URDF).transforms(dict(zip(JOINTS, states[stamp(m)])))
            for msg_t, exp in zip(m.transforms, expected):
                assert (msg_t.header.frame_id, msg_t.child_frame_id) == (exp.parent, exp.child)
                r = msg_t.transform.rotation
                np.testing.assert_allclose([r.x, r.y, r.z, r.w], exp.rotation_xyzw, atol=1e-9)
    finally:
        if late is not None:
            late.close()
        client.close()
    assert pub.stop() == 0


@pytest.mark.ros
def test_an_unstamped_arm_gets_tf_at_the_rate_by_arrival_not_once(ros_context, monkeypatch):
    """Stamps of 0 (a driver that does not stamp): the rate limit falls back to the arrival time;
    before, the first state's 0 held every later one back for good."""
    from rclpy.serialization import serialize_message
    from sensor_msgs.msg import JointState

    from robot_wm.nodes import state_publisher
    from robot_wm.nodes.state_publisher import StatePublisherNode

    node = StatePublisherNode(context=ros_context)
    sent: list = []
    node._tf_pub.publish = sent.append
    arrival = [0]
    monkeypatch.setattr(state_publisher, "_arrival_ns", lambda: arrival[0])
    try:
        data = serialize_message(JointState(name=list(JOINTS), position=[0.1] * len(JOINTS)))
        for k in range(150):  # 0.3 s of a 500 Hz stream, by a clock of the test's
            arrival[0] = 10**12 + k * 2_000_000
            node._on_raw_joint_state(data)
        assert len(sent) == 15  # 50 Hz
        node._on_raw_joint_state(b"\x00\x01\x00\x00" + b"\xff" * 40)  # unreadable: counted, the node goes on
        assert len(sent) == 15 and node.rejected == 1
    finally:
        node.destroy_node()
