"""One graph definition for `robot-wm up` and the launch file; configs agree with the URDF."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

from robot_wm import description, graph
from robot_wm.paths import config_path
from robot_wm.process_group import command_for

REPO = Path(__file__).resolve().parent.parent


def test_embedded_plan_runs_without_ros_install():
    specs = graph.plan("mujoco", overrides={"profile": "real_twin"}, fallbacks=True)
    runnable = [s for s in specs if not s.needs_ros_install]
    assert [s.name for s in runnable] == ["arm_sim", "robot_state_publisher", "safety_filter", "world_model", "policy",
                                          "trust_monitor", "goal_sequencer"]
    by_name = {s.name: s for s in runnable}
    assert by_name["safety_filter"].parameters["default_trust_level"] == 3  # STOP until the monitor speaks
    assert by_name["trust_monitor"].parameters["simulated_arm"] is True  # a policy in SIM may run on the embedded arm
    assert {s.name: s for s in graph.plan("topic_based")}["trust_monitor"].parameters["simulated_arm"] is False
    assert by_name["trust_monitor"].parameters["task"] == "reach"
    assert {s.name: s for s in graph.plan("mujoco", task="track")}["trust_monitor"].parameters["task"] == "track"
    assert str(config_path("trust.yaml")) in command_for(by_name["trust_monitor"], python="python")
    assert "trust_monitor" not in {s.name for s in graph.plan("mujoco", trust=False)}
    assert "default_trust_level" not in {s.name: s for s in graph.plan("mujoco", trust=False)}["safety_filter"].parameters
    cmd = command_for(runnable[0], python="python")
    assert cmd[:3] == ["python", "-m", "robot_wm.nodes.arm_sim"]
    assert "__node:=arm_sim" in cmd and "arm_sim:profile:=real_twin" in cmd
    assert str(config_path("robot.yaml")) in cmd and str(config_path("arm_sim.yaml")) in cmd


def test_the_task_picks_the_target_node_and_the_policys_task():
    """reach: goal_sequencer; track: path_sequencer; the policy gets the task, composed or not."""
    for task, target, absent in (("reach", "goal_sequencer", "path_sequencer"),
                                 ("track", "path_sequencer", "goal_sequencer")):
        by_name = {s.name: s for s in graph.plan("mujoco", task=task)}
        assert target in by_name and absent not in by_name
        assert by_name["policy"].parameters["task"] == task
        cmd = command_for(by_name[target], python="python")
        assert cmd[:3] == ["python", "-m", f"robot_wm.nodes.{target}"]
        assert (REPO / "scripts" / target).stat().st_mode & 0o111
        composed = {s.name: s for s in graph.plan("mujoco", task=task, composed=True)}
        assert f"policy:task:={task}" in command_for(composed["control_stack"], python="python")
    assert "path_sequencer" not in {s.name for s in graph.plan("mujoco", task="track", stack=False)}
    with pytest.raises(graph.GraphError, match="task 'push'"):
        graph.plan("mujoco", task="push")


@pytest.mark.parametrize("hardware", ["mock", "topic_based", "acme_driver/AcmeSystem"])
def test_ros2_control_plan(hardware):
    specs = graph.plan(hardware, hardware_params="ip=127.0.0.1", fallbacks=True)
    by_name = {s.name: s for s in specs}
    assert by_name["controller_manager"].executable == "ros2_control_node"
    assert by_name["controller_manager"].param_files == (config_path("controllers.yaml"),)
    assert by_name["spawner_forward_velocity_controller"].arguments[0] == "forward_velocity_controller"
    urdf = by_name["robot_state_publisher"].parameters["robot_description"]
    assert "<param name=\"ip\">127.0.0.1</param>" in urdf
    assert "arm_sim" not in by_name
    with pytest.raises(ValueError, match="ROS 2 install"):
        command_for(by_name["controller_manager"])


@pytest.mark.parametrize("hardware", ["mock", "topic_based", "acme_driver/AcmeSystem", "gazebo"])
def test_ros2_control_plans_include_the_command_watchdog(hardware):
    """JointGroupVelocityController holds the last command forever: on every ros2_control choice a
    watchdog process (runnable without a ROS install) deactivates it when the commands stop."""
    by_name = {s.name: s for s in graph.plan(hardware)}
    watchdog = by_name["command_watchdog"]
    assert watchdog.module == "robot_wm.nodes.command_watchdog" and not watchdog.needs_ros_install
    assert watchdog.param_files == (config_path("robot.yaml"), config_path("command_watchdog.yaml"))
    cmd = command_for(watchdog, python="python")
    assert cmd[:3] == ["python", "-m", "robot_wm.nodes.command_watchdog"] and "__node:=command_watchdog" in cmd
    params = yaml.safe_load(config_path("command_watchdog.yaml").read_text())["command_watchdog"]["ros__parameters"]
    assert params["velocity_controller"] == "forward_velocity_controller"
    assert params["controller_manager"] == "/controller_manager"
    assert (REPO / "scripts" / "command_watchdog").stat().st_mode & 0o111
    # the embedded arm times out on its own (arm_sim command_timeout_s): no watchdog there
    assert "command_watchdog" not in {s.name for s in graph.plan("mujoco")}


def test_gazebo_plan_spawns_into_gazebo():
    names = [s.name for s in graph.plan("gazebo")]
    assert "gz_spawn" in names and "controller_manager" not in names


def test_bad_hardware_and_bad_graph_are_named(tmp_path):
    with pytest.raises(graph.GraphError, match="hardware"):
        graph.plan("two words")
    bad = tmp_path / "graph.yaml"
    bad.write_text("hardware: {mujoco: [{name: x, package: robot_wm}], ros2_control: []}\ncommon: []\nstack: []\n")
    with pytest.raises(graph.GraphError, match="'executable'"):
        graph.plan("mujoco", graph_path=bad)
    bad.write_text("hardware: {mujoco: [{name: x, package: p, executable: e, colour: red}], ros2_control: []}\ncommon: []\nstack: []\n")
    with pytest.raises(graph.GraphError, match="colour"):
        graph.plan("mujoco", graph_path=bad)
    bad.write_text("hardware: {mujoco: []}\ncommon: []\nstack: []\n")
    with pytest.raises(graph.GraphError, match="ros2_control"):
        graph.plan("mujoco", graph_path=bad)


def test_launch_file_builds_its_nodes_from_the_graph_plan():
    """The launch file defers to graph.plan and sets up loopback DDS (read from its source, so that it
    holds without the ROS 2 tools too; test_launch_tier.py runs it where `make ros-tools` could)."""
    source = (REPO / "launch" / "bringup.launch.py").read_text()
    tree = ast.parse(source)
    calls = {f"{n.func.value.id}.{n.func.attr}" for n in ast.walk(tree)
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name)}
    assert "graph.plan" in calls and "rosenv.loopback_env" in calls
    args = {n.args[0].value for n in ast.walk(tree) if isinstance(n, ast.Call)
            and getattr(n.func, "id", "") == "DeclareLaunchArgument"}
    assert args == {"hardware", "hardware_params", "profile", "composed", "enable", "task", "trust", "realtime_priority", "learn",
                    "joint_calibration_file", "filter_rate"}


def test_controllers_yaml_matches_the_description():
    cfg = yaml.safe_load(config_path("controllers.yaml").read_text())
    cm = cfg["controller_manager"]["ros__parameters"]
    assert cm["update_rate"] == 500
    assert cm["forward_velocity_controller"]["type"] == "velocity_controllers/JointGroupVelocityController"
    assert cm["joint_state_broadcaster"]["type"] == "joint_state_broadcaster/JointStateBroadcaster"
    joints = cfg["forward_velocity_controller"]["ros__parameters"]["joints"]
    assert tuple(joints) == description.joint_limits(description.expand()).names


def test_robot_yaml_matches_the_description():
    params = yaml.safe_load(config_path("robot.yaml").read_text())["/**"]["ros__parameters"]
    assert tuple(params["joint_names"]) == description.joint_limits(description.expand()).names
    assert params["command_topic"] == "/forward_velocity_controller/commands"
    assert params["joint_states_topic"] == "/joint_states"


def test_package_xml_declares_the_launch_path_dependencies():
    import xml.etree.ElementTree as ET

    root = ET.parse(REPO / "package.xml").getroot()
    deps = {e.text for e in root if e.tag.endswith("depend")}
    for needed in ("rclpy", "sensor_msgs", "std_msgs", "std_srvs", "geometry_msgs", "diagnostic_msgs",
                   "visualization_msgs", "lifecycle_msgs", "controller_manager", "controller_manager_msgs",
                   "ros2_controllers", "robot_state_publisher", "xacro"):
        assert needed in deps, f"package.xml lacks {needed}"
    assert root.find("export/build_type").text == "ament_cmake"


def test_composed_plan_hosts_the_hot_path_in_one_process():
    specs = graph.plan("mujoco", composed=True)
    by_name = {s.name: s for s in specs}
    stack = by_name["control_stack"]
    assert stack.composes == ("safety_filter", "world_model", "policy")
    assert not {"safety_filter", "world_model", "policy"} & set(by_name)
    cmd = command_for(stack, python="python")
    assert cmd[:3] == ["python", "-m", "robot_wm.nodes.composed"] and not any("__node:=" in c for c in cmd)
    assert {p.name for p in stack.param_files} == {"robot.yaml", "control.yaml", "safety.yaml"}
    assert [s.name for s in graph.plan("mujoco", stack=False) if not s.needs_ros_install] == ["arm_sim"]
    assert [s.name for s in graph.plan("mujoco", stack=False, fallbacks=True)] == ["arm_sim",
                                                                                            "robot_state_publisher"]


def test_composed_plan_passes_overrides_to_every_hosted_node():
    """`robot-wm up --composed` with overrides: each hosted node gets them under its own name (a
    bare /** override would lose to the node's own section of the params files)."""
    specs = {s.name: s for s in graph.plan("mujoco", composed=True, overrides={"control_period_s": 0.004})}
    cmd = command_for(specs["control_stack"], python="python")
    for node in ("safety_filter", "world_model", "policy"):
        assert f"{node}:control_period_s:=0.004" in cmd
    assert "arm_sim:control_period_s:=0.004" in command_for(specs["arm_sim"], python="python")


@pytest.mark.parametrize("composed", [False, True])
def test_the_filter_rate_sets_only_the_safety_filters_period(composed):
    """`robot-wm up --filter-rate 500` / `filter_rate:=500`: the filter at 2 ms, the policy and the
    world model at the graph's rate; a rate that is not a whole multiple of the control rate up to
    1 kHz is refused by name (250 Hz would put the model's 10 ms step out of step with the filter)."""
    specs = graph.plan("mujoco", composed=composed, filter_rate_hz=500.0)
    if composed:
        cmd = command_for(next(s for s in specs if s.name == "control_stack"), python="python")
        assert "safety_filter:control_period_s:=0.002" in cmd
        assert not any(f"{n}:control_period_s" in " ".join(cmd) for n in ("policy", "world_model"))
    else:
        params = {s.name: s.parameters for s in specs}
        assert params["safety_filter"]["control_period_s"] == 0.002
        assert "control_period_s" not in params["policy"] and "control_period_s" not in params["world_model"]
    for bad in (0.0, -500.0, float("nan"), 1e6, "500", 50.0, 250.0, 2000.0):
        with pytest.raises(graph.GraphError, match="filter rate"):
            graph.plan("mujoco", composed=composed, filter_rate_hz=bad)


def test_the_safety_filter_enables_itself_only_on_the_embedded_arm_and_stops_without_trust(tmp_path):
    """enable_on_start only by an explicit request and only on the embedded arm; the phase before the
    first TrustState follows the hardware; a graph with a trust monitor forces STOP before it speaks."""
    filt = lambda specs: next(s for s in specs if s.name == "safety_filter")  # noqa: E731
    assert "enable_on_start" not in filt(graph.plan("mujoco")).parameters
    assert filt(graph.plan("mujoco", enable=True)).parameters["enable_on_start"] is True
    with pytest.raises(graph.GraphError, match="embedded arm only"):
        graph.plan("mock", enable=True)
    assert filt(graph.plan("mujoco")).parameters["default_phase"] == 0  # SIM: the embedded arm is a simulator
    assert filt(graph.plan("mock")).parameters["default_phase"] == 2  # REAL on any ros2_control hardware
    pol = lambda specs: next(s for s in specs if s.name == "policy")  # noqa: E731
    for hw in ("mujoco", "mock"):  # the policy's slew limit uses the same phase's acceleration box
        assert pol(graph.plan(hw)).parameters["phase"] == filt(graph.plan(hw)).parameters["default_phase"]
    assert "default_trust_level" not in filt(graph.plan("mujoco", trust=False)).parameters  # config/control.yaml: FULL
    assert filt(graph.plan("mujoco")).parameters["default_trust_level"] == 3  # STOP: the graph has a monitor
    graph_yaml = yaml.safe_load((REPO / "config" / "graph.yaml").read_text())
    graph_yaml["stack"] = [e for e in graph_yaml["stack"] if e["name"] != "trust_monitor"]
    without = tmp_path / "graph.yaml"
    without.write_text(yaml.safe_dump(graph_yaml))
    assert "default_trust_level" not in filt(graph.plan("mujoco", graph_path=without)).parameters


def test_a_task_without_a_shipped_policy_runs_the_scripted_baseline(capsys, monkeypatch):
    """Both tasks ship a learned policy: nothing is overridden. A task without one (a package
    built without models/track/) gives the policy node scripted=true in up, the launch file and
    the demo, and says so."""
    assert graph.shipped_policy("reach") and graph.policy_overrides("reach") == {}
    assert graph.shipped_policy("track") and graph.policy_overrides("track") == {}
    monkeypatch.setattr(graph, "shipped_policy", lambda task: task == "reach")
    assert graph.policy_overrides("track", "up") == {"scripted": True}
    assert "no learned track policy is shipped" in capsys.readouterr().out
    by_name = {s.name: s for s in graph.plan("mujoco", task="track", overrides=graph.policy_overrides("track"))}
    assert "policy:scripted:=true" in command_for(by_name["policy"], python="python")


def test_realtime_priority_reaches_the_arm_and_control_processes_but_never_the_learner():
    """`robot-wm up --realtime-priority 50 --learn`: the learner's torch training at SCHED_FIFO ran level
    with the control threads (a bench_online run showed a 56 ms command gap while it exported a model)."""
    for composed in (False, True):
        by_name = {s.name: s for s in graph.plan("mujoco", overrides={"realtime_priority": 50}, learn=True,
                                                   composed=composed)}
        assert "realtime_priority" not in by_name["adaptation"].parameters
        control = "control_stack" if composed else "safety_filter"
        assert by_name[control].parameters["realtime_priority"] == 50
        assert by_name["arm_sim"].parameters["realtime_priority"] == 50
