"""The embedded MuJoCo arm as a ROS 2 node speaking the ros2_control topic contract.

Publishes ``sensor_msgs/JointState`` on /joint_states (what joint_state_broadcaster publishes) and
takes joint velocity commands as ``std_msgs/Float64MultiArray`` on
/forward_velocity_controller/commands (what JointGroupVelocityController takes). Nothing
downstream can tell it from a real arm behind ros2_control. Physics runs at 1 ms, locked to the
wall clock; the command timeout, latency and noise live in robot_wm.sim.
"""
from __future__ import annotations

import time

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from geometry_msgs.msg import WrenchStamped
from rclpy.context import Context
from rclpy.node import Node
from rclpy.qos import QoSProfile, ReliabilityPolicy, HistoryPolicy
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray
from std_srvs.srv import Trigger

from robot_wm.nodes.params import declare
from robot_wm.nodes.runner import NodeConfigError, main_for
from robot_wm.sim import ArmSim, CommandRejected, load_profile
from robot_wm.srv import InjectFault

_PHYSICS_DT_S = 0.001
_MAX_CATCHUP_STEPS = 100  # beyond this the sim skips ahead instead of running a burst


class ArmSimNode(Node):
    """Embedded arm: MuJoCo physics behind /joint_states and /forward_velocity_controller/commands."""

    def __init__(self, context: Context | None = None, node_name: str = "arm_sim") -> None:
        super().__init__(node_name, context=context)
        profile_name = declare(self, "profile", "nominal", "dynamics profile: nominal, real_twin or a YAML path", read_only=True)
        rate_hz = declare(self, "publish_rate_hz", 500.0, "joint state publish rate (Hz)", range_=(1.0, 1000.0), read_only=True)
        timeout_s = declare(self, "command_timeout_s", 0.05, "no command for this long (s) -> decelerate to rest", range_=(0.002, 5.0), read_only=True)
        seed = declare(self, "seed", 0, "random seed of sensor noise", range_=(0, 2**31 - 1), read_only=True)
        self.publish_clock = declare(self, "publish_clock", False, "publish simulated time on /clock", read_only=True)
        states_topic = declare(self, "joint_states_topic", "/joint_states", "sensor_msgs/JointState output", read_only=True)
        command_topic = declare(self, "command_topic", "/forward_velocity_controller/commands", "Float64MultiArray joint velocity input (rad/s)", read_only=True)
        wrench_topic = declare(self, "wrench_topic", "/robot_wm/wrench", "WrenchStamped of the wrist F/T sensor (N, N*m)", read_only=True)
        self.ft_frame = declare(self, "ft_frame", "ft_sensor_link", "frame of the wrench", read_only=True)

        try:
            profile = load_profile(profile_name)
            self.sim = ArmSim(profile=profile, seed=seed, command_timeout_s=timeout_s)
        except (ValueError, OSError) as exc:
            raise NodeConfigError(f"arm_sim: cannot build the simulator with profile {profile_name!r}: {exc}") from exc
        self.joint_names = list(
            declare(self, "joint_names", list(self.sim.joint_names), "joint order of commands and states", read_only=True)
        )
        if list(self.sim.joint_names) != self.joint_names:
            raise NodeConfigError(
                f"arm_sim: parameter joint_names {self.joint_names} does not match the URDF's {list(self.sim.joint_names)}"
            )

        sensor_qos = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE, history=HistoryPolicy.KEEP_LAST)
        self._state_pub = self.create_publisher(JointState, states_topic, sensor_qos)
        self._wrench_pub = self.create_publisher(WrenchStamped, wrench_topic, sensor_qos)
        self._clock_pub = self.create_publisher(Clock, "/clock", 10) if self.publish_clock else None
        self._diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self.create_subscription(Float64MultiArray, command_topic, self._on_command, sensor_qos)
        self.create_service(InjectFault, "~/inject_fault", self._on_inject_fault)
        self.create_service(Trigger, "~/reset", self._on_reset)

        self._state_msg = JointState(name=self.joint_names)
        self._rejected = 0
        self._skipped_steps = 0
        self._start_wall_s = time.monotonic()
        self._steps_done = 0
        self.create_timer(1.0 / rate_hz, self._on_tick)
        self.create_timer(1.0, self._publish_diagnostics)
        self.get_logger().info(
            f"embedded arm up: profile={profile.name}, {rate_hz:.0f} Hz on {states_topic}, commands on {command_topic}"
        )

    def _on_command(self, msg: Float64MultiArray) -> None:
        try:
            self.sim.set_command(np.asarray(msg.data, dtype=float))
        except CommandRejected as exc:
            self._rejected += 1
            self.get_logger().error(f"command rejected, arm holds: {exc}", throttle_duration_sec=1.0)

    def _on_tick(self) -> None:
        target = int((time.monotonic() - self._start_wall_s) / _PHYSICS_DT_S)
        n_steps = target - self._steps_done
        if n_steps > _MAX_CATCHUP_STEPS:
            self._skipped_steps += n_steps - _MAX_CATCHUP_STEPS
            self.get_logger().warning(f"simulation fell {n_steps} ms behind real time; skipping ahead", throttle_duration_sec=5.0)
            n_steps = _MAX_CATCHUP_STEPS
        if n_steps > 0:
            self.sim.step(n_steps)
        self._steps_done = target
        self._publish_state()

    def _publish_state(self) -> None:
        stamp = self.get_clock().now().to_msg()
        state = self.sim.joint_state()
        msg = self._state_msg
        msg.header.stamp = stamp
        msg.position = state.position_rad.tolist()
        msg.velocity = state.velocity_radps.tolist()
        msg.effort = state.effort_nm.tolist()
        self._state_pub.publish(msg)
        force_n, torque_nm = self.sim.wrench()
        wrench = WrenchStamped()
        wrench.header.stamp = stamp
        wrench.header.frame_id = self.ft_frame
        wrench.wrench.force.x, wrench.wrench.force.y, wrench.wrench.force.z = (float(v) for v in force_n)
        wrench.wrench.torque.x, wrench.wrench.torque.y, wrench.wrench.torque.z = (float(v) for v in torque_nm)
        self._wrench_pub.publish(wrench)
        if self._clock_pub is not None:
            sim_ns = int(round(self.sim.time_s * 1e9))
            clock = Clock()
            clock.clock.sec, clock.clock.nanosec = divmod(sim_ns, 1_000_000_000)
            self._clock_pub.publish(clock)

    def _on_inject_fault(self, request: InjectFault.Request, response: InjectFault.Response) -> InjectFault.Response:
        try:
            self.sim.faults.apply(
                request.kind,
                force_n=np.asarray(request.force_n, dtype=float),
                duration_s=request.duration_s,
                payload_kg=request.payload_kg,
                noise_std=request.noise_std,
                latency_s=request.latency_s,
            )
        except ValueError as exc:
            response.success, response.message = False, f"fault {request.kind!r} refused: {exc}"
            self.get_logger().error(response.message)
            return response
        response.success, response.message = True, f"fault {request.kind!r} injected"
        self.get_logger().warning(response.message)
        return response

    def _on_reset(self, request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
        self.sim.reset()
        response.success, response.message = True, "simulator reset to the initial configuration"
        return response

    def _publish_diagnostics(self) -> None:
        elapsed_s = max(time.monotonic() - self._start_wall_s, 1e-9)
        status = DiagnosticStatus(name="robot_wm/arm_sim", hardware_id="mujoco")
        status.level = DiagnosticStatus.WARN if (self.sim.timed_out or self._skipped_steps) else DiagnosticStatus.OK
        status.message = "command timeout: holding" if self.sim.timed_out else "running"
        status.values = [
            KeyValue(key="sim_time_s", value=f"{self.sim.time_s:.3f}"),
            KeyValue(key="real_time_factor", value=f"{self.sim.time_s / elapsed_s:.3f}"),
            KeyValue(key="rejected_commands", value=str(self._rejected)),
            KeyValue(key="skipped_steps", value=str(self._skipped_steps)),
        ]
        msg = DiagnosticArray(status=[status])
        msg.header.stamp = self.get_clock().now().to_msg()
        self._diag_pub.publish(msg)

    def before_shutdown(self) -> None:
        """Called by the runner before the node is destroyed."""
        self.get_logger().info("embedded arm shutting down")


main = main_for(ArmSimNode)

if __name__ == "__main__":
    main()
