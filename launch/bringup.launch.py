"""Bring up robot_wm on a ROS 2 install.

    ros2 launch robot_wm bringup.launch.py hardware:=mock|gazebo|mujoco|topic_based|<plugin> \
        [hardware_params:="ip=10.0.0.2;port=50002"] [profile:=nominal|real_twin|<file.yaml>] [enable:=true]
        [joint_calibration_file:=<robot-wm calibrate joints output>]

The safety filter starts latched (zero command) until an operator enables it (`robot-wm reset`, or
`ros2 service call /robot_wm/reset_estop std_srvs/srv/Trigger`); ``enable:=true`` lets it enable
itself, on the embedded arm (hardware:=mujoco) only.

The process list comes from robot_wm.graph.plan() (config/graph.yaml), the same definition
`robot-wm up` uses, so the two cannot drift. A node whose package is not installed and that has a
fallback in graph.yaml (robot_state_publisher: robot_wm's state publisher) is replaced by it, with a
warning; so the pip path (`make ros-tools`) runs this file too. DDS is kept on loopback unless
ROBOT_WM_DDS=system.
"""
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, IncludeLaunchDescription, OpaqueFunction, SetEnvironmentVariable
from launch.launch_description_sources import PythonLaunchDescriptionSource
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node


def _per_node_params_file(nodes, parameters, own=None) -> str:
    import atexit
    import os
    import tempfile

    import yaml

    with tempfile.NamedTemporaryFile("w", prefix="robot_wm_composed_", suffix=".yaml", delete=False) as f:
        yaml.safe_dump({node: {"ros__parameters": {**parameters, **(own or {}).get(node, {})}} for node in nodes}, f)
    atexit.register(lambda path=f.name: os.path.exists(path) and os.remove(path))  # when ros2 launch exits
    return f.name


def _installed(package: str) -> bool:
    from ament_index_python.packages import PackageNotFoundError, get_package_prefix

    try:
        get_package_prefix(package)
        return True
    except PackageNotFoundError:
        return False


def _nodes(context):
    import launch.logging

    from robot_wm import graph, rosenv  # imported at launch time, after the workspace is sourced

    hardware = LaunchConfiguration("hardware").perform(context)
    hardware_params = LaunchConfiguration("hardware_params").perform(context)
    profile = LaunchConfiguration("profile").perform(context)
    composed = LaunchConfiguration("composed").perform(context).lower() in ("true", "1", "yes")
    enable = LaunchConfiguration("enable").perform(context).lower() in ("true", "1", "yes")
    task = LaunchConfiguration("task").perform(context)
    trust = LaunchConfiguration("trust").perform(context).lower() in ("true", "1", "yes")
    learn = LaunchConfiguration("learn").perform(context).lower() in ("true", "1", "yes")
    actions = [SetEnvironmentVariable(k, v) for k, v in rosenv.loopback_env({}).items()]
    overrides = {"profile": profile} if hardware == graph.EMBEDDED else {}
    overrides.update(graph.policy_overrides(task, "bringup"))
    realtime = int(LaunchConfiguration("realtime_priority").perform(context) or 0)
    if realtime:  # SCHED_FIFO for the arm and control processes (robot_wm.realtime)
        overrides["realtime_priority"] = realtime
    log = launch.logging.get_logger("robot_wm.bringup")
    joint_calibration = LaunchConfiguration("joint_calibration_file").perform(context)
    if joint_calibration and hardware in graph.PYTHON_ARMS:  # a robot_wm driver applies it (robot_wm.driver)
        overrides["joint_calibration_file"] = joint_calibration
    elif joint_calibration:
        log.warning(f"joint_calibration_file is applied by robot_wm's Python drivers; for the ros2_control arm "
                    f"{hardware!r} set each joint's transmission joint_offset to minus its offset_rad instead")
    filter_rate = LaunchConfiguration("filter_rate").perform(context).strip()
    try:
        filter_rate_hz = float(filter_rate) if filter_rate else None
    except ValueError:
        raise graph.GraphError(f"filter_rate:={filter_rate!r}: expected the safety filter's rate in Hz, e.g. 500") from None
    for spec in graph.plan(hardware, hardware_params=hardware_params, overrides=overrides, composed=composed,
                           enable=enable, task=task, trust=trust, learn=learn, installed=_installed, warn=log.warning,
                           filter_rate_hz=filter_rate_hz):
        params = [str(p) for p in spec.param_files]
        inline = dict(spec.parameters)
        if inline or spec.node_parameters:
            # launch_ros writes an inline dict under /** when the node has no namespace, and /** loses
            # to the node's own section of the params files (control.yaml's enable_on_start: false):
            # give the node (or each node a composed process hosts) a section of its own instead
            params.append(_per_node_params_file(spec.composes or (spec.name,), inline, spec.node_parameters))
            inline = {}
        actions.append(
            Node(
                package=spec.package,
                executable=spec.executable,
                name=spec.name if spec.executable != "spawner" and not spec.composes else None,
                parameters=params + ([inline] if inline else []),
                arguments=list(spec.arguments),
                output="screen",
            )
        )
    if hardware == "gazebo":
        from ament_index_python.packages import get_package_share_directory

        gz_launch = get_package_share_directory("ros_gz_sim") + "/launch/gz_sim.launch.py"
        actions.insert(0, IncludeLaunchDescription(PythonLaunchDescriptionSource(gz_launch), launch_arguments={"gz_args": "-r empty.sdf"}.items()))
    return actions


def generate_launch_description():
    from robot_wm import rosenv

    rosenv.apply_loopback_dds()  # this process too, before anything in it could start DDS
    return LaunchDescription([
        DeclareLaunchArgument("hardware", default_value="mock",
                              description="mock | gazebo | mujoco | topic_based | <ros2_control plugin name>"),
        DeclareLaunchArgument("hardware_params", default_value="",
                              description="extra plugin parameters, 'name=value;name2=value2'"),
        DeclareLaunchArgument("profile", default_value="nominal",
                              description="embedded arm dynamics profile (hardware:=mujoco only)"),
        DeclareLaunchArgument("joint_calibration_file", default_value="",
                              description="encoder offsets the arm's robot_wm driver subtracts (robot-wm calibrate joints)"),
        DeclareLaunchArgument("composed", default_value="false",
                              description="run policy, world model and safety filter in one process"),
        DeclareLaunchArgument("enable", default_value="false",
                              description="the safety filter enables itself (hardware:=mujoco only; "
                                          "otherwise an operator calls /robot_wm/reset_estop)"),
        DeclareLaunchArgument("trust", default_value="true",
                              description="the trust monitor judges the world model and feeds the filter's trust level"),
        DeclareLaunchArgument("task", default_value="reach",
                              description="reach (goal_sequencer) | track (path_sequencer); the policy's task"),
        DeclareLaunchArgument("learn", default_value="false",
                              description="run the online learner of the world model (robot_wm adaptation node)"),
        DeclareLaunchArgument("realtime_priority", default_value="0",
                              description="SCHED_FIFO priority 1..98 of the control and embedded-arm processes "
                                          "(0: the normal scheduler; needs CAP_SYS_NICE or an rtprio limit)"),
        DeclareLaunchArgument("filter_rate", default_value="",
                              description="the safety filter's own rate in Hz, e.g. 500 (the arm's joint-state rate); "
                                          "empty: the control rate of config/control.yaml"),
        OpaqueFunction(function=_nodes),
    ])
