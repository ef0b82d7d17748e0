"""The arm description: xacro expands for every hardware choice and all consumers agree on it."""
from __future__ import annotations

import shutil
import subprocess
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from robot_wm import description
from robot_wm.core.kinematics import Kinematics

HARDWARE = {
    "mock": "mock_components/GenericSystem",
    "gazebo": "gz_ros2_control/GazeboSimSystem",
    "topic_based": "topic_based_ros2_control/TopicBasedSystem",
    "mujoco": "mock_components/GenericSystem",
    "my_vendor_driver/MyArmSystem": "my_vendor_driver/MyArmSystem",
}
JOINTS = ("shoulder_pan_joint", "shoulder_lift_joint", "elbow_joint", "wrist_1_joint", "wrist_2_joint", "wrist_3_joint")


def _check_urdf() -> str:
    for candidate in ("/usr/bin/check_urdf", shutil.which("check_urdf")):
        if candidate and shutil.which(candidate):
            return candidate
    pytest.fail("check_urdf not found: `make test` installs liburdfdom-tools (tools/ensure_system_deps.sh)")


@pytest.mark.parametrize("hardware,plugin", HARDWARE.items())
def test_xacro_expands_and_passes_check_urdf(hardware, plugin, tmp_path):
    urdf = description.expand(hardware=hardware, hardware_params="robot_ip=127.0.0.1;port=50002")
    path = tmp_path / "arm.urdf"
    path.write_text(urdf)
    result = subprocess.run([_check_urdf(), str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Successfully Parsed XML" in result.stdout
    root = ET.fromstring(urdf)
    assert root.find("ros2_control/hardware/plugin").text == plugin
    params = {p.get("name"): p.text for p in root.findall("ros2_control/hardware/param")}
    assert params["robot_ip"] == "127.0.0.1" and params["port"] == "50002"
    # every joint offers the velocity command interface the forward velocity controller claims
    for joint in root.findall("ros2_control/joint"):
        assert [c.get("name") for c in joint.findall("command_interface")] == ["velocity"]
        assert {s.get("name") for s in joint.findall("state_interface")} == {"position", "velocity", "effort"}
    assert [j.get("name") for j in root.findall("ros2_control/joint")] == list(JOINTS)


def test_gazebo_description_carries_the_gz_ros2_control_plugin():
    root = ET.fromstring(description.expand(hardware="gazebo", controllers_file="/abs/controllers.yaml"))
    plugin = root.find("gazebo/plugin")
    assert plugin is not None and plugin.get("filename") == "gz_ros2_control-system"
    assert plugin.find("parameters").text == "/abs/controllers.yaml"
    assert ET.fromstring(description.expand(hardware="mock")).find("gazebo") is None


def test_description_without_ros2_control_block():
    assert ET.fromstring(description.expand(ros2_control=False)).find("ros2_control") is None


def test_limits_are_the_ur5e_specifications():
    limits = description.joint_limits(description.expand())
    assert limits.names == JOINTS
    np.testing.assert_allclose(limits.velocity_radps, np.pi)  # 180 deg/s on every joint
    np.testing.assert_allclose(limits.effort_nm, [150, 150, 150, 28, 28, 28])
    np.testing.assert_allclose(limits.upper_rad, [2 * np.pi, 2 * np.pi, np.pi, 2 * np.pi, 2 * np.pi, 2 * np.pi])
    np.testing.assert_allclose(limits.lower_rad, -limits.upper_rad)


def test_the_contracts_joint_order_is_the_descriptions_and_the_shipped_models():
    import json

    import yaml

    from robot_wm.contracts import JOINT_NAMES, N_JOINTS
    from robot_wm.paths import config_path, data_path

    assert JOINT_NAMES == description.joint_limits(description.expand()).names and N_JOINTS == len(JOINT_NAMES)
    robot = yaml.safe_load(config_path("robot.yaml").read_text())["/**"]["ros__parameters"]
    assert tuple(robot["joint_names"]) == JOINT_NAMES
    for model in ("policy.json", "world_model.json"):
        assert tuple(json.loads(data_path("models", model).read_text())["joint_names"]) == JOINT_NAMES, model


def test_pinocchio_loads_same_joints_limits_and_ur5e_reach():
    import pinocchio as pin

    urdf = description.expand()
    model = pin.buildModelFromXML(urdf)
    limits = description.joint_limits(urdf)
    assert tuple(model.names[1:]) == limits.names
    np.testing.assert_allclose(model.lowerPositionLimit, limits.lower_rad)
    np.testing.assert_allclose(model.upperPositionLimit, limits.upper_rad)
    np.testing.assert_allclose(model.velocityLimit, limits.velocity_radps)
    np.testing.assert_allclose(model.effortLimit, limits.effort_nm)
    # UR5e at zero configuration: tool 0.8172 m out (|a2|+|a3|), d4+d5... off axis, d1-d6 up
    kin = Kinematics(urdf, limits.names)
    np.testing.assert_allclose(np.abs(kin.tool_position_m(np.zeros(6))), [0.8172, 0.2329, 0.0628], atol=1e-4)
    assert sum(i.mass for i in model.inertias) == pytest.approx(4.0 + 3.761 + 8.058 + 2.846 + 1.37 + 1.3 + 0.365)


def test_kinematics_rejects_bad_inputs():
    urdf = description.expand()
    with pytest.raises(ValueError, match="do not match"):
        Kinematics(urdf, ["a", "b"])
    with pytest.raises(ValueError, match="not a frame"):
        Kinematics(urdf, JOINTS, tool_frame="nope")
    kin = Kinematics(urdf, JOINTS)
    with pytest.raises(ValueError, match="shape"):
        kin.tool_position_m(np.zeros(5))


def test_kinematics_jacobian_matches_finite_differences():
    kin = Kinematics(description.expand(), JOINTS)
    rng = np.random.default_rng(0)
    for _ in range(20):
        q = rng.uniform(-np.pi, np.pi, 6)
        v = rng.normal(size=6)
        eps = 1e-7
        fd = (kin.tool_position_m(q + eps * v) - kin.tool_position_m(q - eps * v)) / (2 * eps)
        np.testing.assert_allclose(kin.tool_linear_velocity_mps(q, v), fd, atol=1e-6)


def test_initial_positions_are_above_the_table():
    q0 = description.initial_positions(JOINTS)
    kin = Kinematics(description.expand(), JOINTS)
    assert kin.tool_position_m(q0)[2] > 0.3
