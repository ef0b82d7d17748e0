"""The embedded MuJoCo arm as a ROS 2 node speaking the ros2_control topic contract.

Publishes ``sensor_msgs/JointState`` on /joint_states (what joint_state_broadcaster publishes) and
takes joint velocity commands as ``std_msgs/Float64MultiArray`` on
/forward_velocity_controller/commands (what JointGroupVelocityController takes). Nothing
downstream can tell it from a real arm behind ros2_control. Physics runs at 1 ms, locked to the
wall clock; the command timeout, latency and noise live in robot_wm.sim.

It is one driver of the driver kit (robot_wm.driver.ArmDriver: the topic contract, command
checks, /diagnostics, ``~/reset``); what is its own: the physics, the wrench, /clock and
``~/inject_fault``.
"""
from __future__ import annotations

import time

import numpy as np
from builtin_interfaces.msg import Time
from geometry_msgs.msg import WrenchStamped
from rclpy.context import Context
from rclpy.qos import QoSProfile, ReliabilityPolicy, HistoryPolicy
from rosgraph_msgs.msg import Clock

from robot_wm.driver import ArmDriver
from robot_wm.nodes.params import declare
from robot_wm.nodes.runner import NodeConfigError, main_for
from robot_wm.sim import ArmSim, CommandRejected, load_profile
from robot_wm.srv import InjectFault

_PHYSICS_DT_S = 0.001
_SKIP_WARN_S = 5.0  # /diagnostics says WARN this long after the physics last skipped steps
_CATCHUP_SHARE = 0.6  # of the command timeout: the longest burst of physics a late tick runs (the rest is skipped)


class ArmSimNode(ArmDriver):
    """Embedded arm: MuJoCo physics behind /joint_states and /forward_velocity_controller/commands.

    The command timeout is the simulator's own (in sim time, measured from when a command reaches
    its drives, then the profile's stop deceleration), so the base's timeout only reports it;
    commands beyond the velocity limits are clamped by the simulator, as a velocity-limited drive does.
    """

    refuse_over_limit = False

    def __init__(self, context: Context | None = None, node_name: str = "arm_sim") -> None:
        super().__init__(node_name, context=context, hardware_id="mujoco")
        profile_name = declare(self, "profile", "nominal", "dynamics profile: nominal, real_twin or a YAML path", read_only=True)
        seed = declare(self, "seed", 0, "random seed of sensor noise", range_=(0, 2**31 - 1), read_only=True)
        self.publish_clock = declare(self, "publish_clock", False, "publish simulated time on /clock", read_only=True)
        wrench_topic = declare(self, "wrench_topic", "/robot_wm/wrench", "WrenchStamped of the wrist F/T sensor (N, N*m)", read_only=True)
        self.ft_frame = declare(self, "ft_frame", "ft_sensor_link", "frame of the wrench", read_only=True)

        try:
            profile = load_profile(profile_name)
            self.sim = ArmSim(profile=profile, seed=seed, command_timeout_s=self.command_timeout_s)
        except (ValueError, OSError) as exc:
            raise NodeConfigError(f"arm_sim: cannot build the simulator with profile {profile_name!r}: {exc}") from exc
        if list(self.sim.joint_names) != self.joint_names:
            raise NodeConfigError(
                f"arm_sim: parameter joint_names {self.joint_names} does not match the URDF's {list(self.sim.joint_names)}"
            )

        sensor_qos = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE, history=HistoryPolicy.KEEP_LAST)
        self._wrench_pub = self.create_publisher(WrenchStamped, wrench_topic, sensor_qos)
        self._clock_pub = self.create_publisher(Clock, "/clock", 10) if self.publish_clock else None
        self.create_service(InjectFault, "~/inject_fault", self._on_inject_fault)
        # a tick late by more than this runs this much physics and skips the rest: the commands sent while this
        # process was stalled wait in its queue, so a longer burst with the last one would run the simulator's
        # watchdog (sim time) and stop the arm for a stall of the emulator's own, which a real arm never has
        self._max_catchup_steps = max(1, int(_CATCHUP_SHARE * self.command_timeout_s / _PHYSICS_DT_S))
        self._skipped_steps = 0
        self._last_skip_s = -1e9
        self._start_wall_s = time.monotonic()
        self._steps_done = 0
        self.get_logger().info(
            f"embedded arm up: profile={profile.name}, {self.rate_hz:.0f} Hz on {self.states_topic}, "
            f"commands on {self.command_topic}"
        )

    # ---- the driver (robot_wm.driver.ArmDriver)
    def write_velocity(self, command_radps: np.ndarray) -> None:
        try:
            self.sim.set_command(command_radps)
        except CommandRejected as exc:  # the base checked it already; the simulator has the last word
            self.rejected += 1
            self.get_logger().error(f"command rejected, arm holds: {exc}", throttle_duration_sec=1.0)

    def bring_to_rest(self) -> None:
        self.sim.stop()  # what a rejected command did before the driver kit: the profile's stop ramp

    def on_command_timeout(self) -> None:
        """Nothing: the simulator's own watchdog (same ``command_timeout_s``, in sim time) stops the arm."""

    @property
    def timed_out(self) -> bool:
        return self.sim.timed_out

    def step(self, dt_s: float) -> None:
        """Physics at 1 ms, locked to the wall clock (not to ``dt_s``: ticks jitter, the clock does not)."""
        target = int((time.monotonic() - self._start_wall_s) / _PHYSICS_DT_S)
        n_steps = target - self._steps_done
        if n_steps > self._max_catchup_steps:
            # fell behind (the process was descheduled or paused): skip rather than burst past the watchdog
            self._skipped_steps += n_steps - self._max_catchup_steps
            self._last_skip_s = time.monotonic()
            n_steps = self._max_catchup_steps
        if n_steps > 0:
            self.sim.step(n_steps)
        self._steps_done = target

    def read_state(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        state = self.sim.joint_state()
        return state.position_rad, state.velocity_radps, state.effort_nm

    def publish_extras(self, stamp: Time) -> None:
        """The wrist wrench with the joint state's stamp, and /clock."""
        force_n, torque_nm = self.sim.wrench()
        wrench = WrenchStamped()
        wrench.header.stamp = stamp
        wrench.header.frame_id = self.ft_frame
        wrench.wrench.force.x, wrench.wrench.force.y, wrench.wrench.force.z = (float(v) for v in force_n)
        wrench.wrench.torque.x, wrench.wrench.torque.y, wrench.wrench.torque.z = (float(v) for v in torque_nm)
        self.publish_measurement(self._wrench_pub, wrench)
        if self._clock_pub is not None:
            clock = Clock()
            sim_ns = int(round(self.sim.time_s * 1e9))
            clock.clock.sec, clock.clock.nanosec = divmod(sim_ns, 1_000_000_000)
            self.publish_measurement(self._clock_pub, clock)

    def reset(self) -> str:
        self.sim.reset()
        return "simulator reset to the initial configuration"

    def warning(self) -> str | None:
        """While the physics skipped steps in the last ``_SKIP_WARN_S``: the simulator runs behind the wall clock."""
        if time.monotonic() - self._last_skip_s > _SKIP_WARN_S:
            return None
        return f"physics steps skipped (the process fell behind): {self._skipped_steps} since start-up"

    def diagnostic_values(self) -> list[tuple[str, str]]:
        elapsed_s = max(time.monotonic() - self._start_wall_s, 1e-9)
        return [("sim_time_s", f"{self.sim.time_s:.3f}"), ("real_time_factor", f"{self.sim.time_s / elapsed_s:.3f}"),
                ("skipped_steps", str(self._skipped_steps))]

    # ---- the embedded arm's own
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

    def before_shutdown(self) -> None:
        """Called by the runner before the node is destroyed: the arm is left at rest."""
        self.get_logger().info("embedded arm shutting down")
        super().before_shutdown()


main = main_for(ArmSimNode)

if __name__ == "__main__":
    main()
