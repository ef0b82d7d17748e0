"""The driver kit: a base class for an arm driver that speaks robot_wm's hardware topic contract.

The contract is what ros2_control's joint_state_broadcaster and JointGroupVelocityController speak,
so that nothing downstream can tell a driver from a ros2_control arm:

- ``sensor_msgs/JointState`` on ``/joint_states`` at ``publish_rate_hz``, stamped when measured,
  every joint of the URDF in the order of ``joint_names`` (position rad, velocity rad/s, effort N·m);
- ``std_msgs/Float64MultiArray`` joint velocities (rad/s) on ``/forward_velocity_controller/commands``;
  a command of the wrong length, not finite or beyond the URDF's velocity limits is refused with an
  error naming what was wrong, and the arm is brought to rest;
- the **command timeout**: no command for ``command_timeout_s`` and the arm is brought to rest, and
  stays there until a fresh command comes (the safety filter stops publishing when it must: this
  is the arm's last line);
- ``diagnostic_msgs/DiagnosticArray`` on ``/diagnostics`` once a second, ``robot_wm/<node name>``:
  OK, WARN while timed out, ERROR after a driver fault, with ``command_timeout_s`` and
  ``publish_rate_hz`` among its values (``robot-wm doctor --driver`` reads them);
- ``~/reset`` (``std_srvs/Trigger``): the driver's :meth:`~ArmDriver.reset`, and a latched fault cleared;
- an exception from the driver's own methods never ends the node: it is logged, reported as ERROR,
  the arm is brought to rest and commands are refused until ``~/reset``;
- a publish the middleware refuses (Fast DDS on a loaded machine: "cannot publish data") is a
  transport fault, not the arm's: it is counted, logged and reported as WARN, never latched. The
  arm is fine; a consumer that misses states stops commanding, which the command timeout turns into
  rest. Drivers publish what else they measure with :meth:`~ArmDriver.publish_measurement`;
- the arm is brought to rest when the node shuts down;
- ``joint_calibration_file`` (``robot-wm calibrate joints``): the encoder offsets it holds are
  subtracted from the measured positions before they are published, as ros2_control's
  SimpleTransmission applies its ``joint_offset``, so every node sees calibrated angles; a file
  that cannot be used refuses the node's start, naming what was wrong.

A driver subclasses :class:`ArmDriver` and implements :meth:`~ArmDriver.read_state`,
:meth:`~ArmDriver.write_velocity` and :meth:`~ArmDriver.bring_to_rest` (and, where the arm needs
them, :meth:`~ArmDriver.reset`, :meth:`~ArmDriver.step`, :meth:`~ArmDriver.publish_extras`). The
embedded MuJoCo arm (robot_wm.nodes.arm_sim) and the example driver of an imaginary arm
(robot_wm.nodes.example_arm) are two such drivers; docs/drivers.md is the guide. The checks
themselves live in robot_wm.core.driver_contract (no ROS).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
from builtin_interfaces.msg import Time
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rclpy.context import Context
from rclpy.impl.implementation_singleton import rclpy_implementation as _rclpy
from rclpy.node import Node
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray
from std_srvs.srv import Trigger

from robot_wm.core.driver_contract import STATE_TEXT, CommandTimeout, DriverState, Refusal, check_command
from robot_wm.nodes.params import declare
from robot_wm.nodes.runner import NodeConfigError
from robot_wm.realtime import PRIORITY_RANGE

_DIAG_LEVEL = {DriverState.RUNNING: DiagnosticStatus.OK, DriverState.TIMED_OUT: DiagnosticStatus.WARN,
               DriverState.FAULT: DiagnosticStatus.ERROR}
_REFUSAL_LOG_PERIOD_S = 1.0  # a stream of bad commands logs each kind of refusal once a second
_PUBLISH_WARN_S = 5.0  # a failed publish keeps /diagnostics at WARN this long
RCLError = _rclpy.RCLError  # what rclpy raises when rcl_publish fails


_REQUIRED = ("read_state", "write_velocity", "bring_to_rest")  # what every driver implements


class ArmDriver(Node):
    """Base of an arm driver: the topic contract, the command timeout, diagnostics and reset.

    Subclasses implement ``read_state``, ``write_velocity`` and ``bring_to_rest``; every call of
    them is guarded (an exception latches a fault, see the module docstring). Class attribute
    ``refuse_over_limit`` (default True): a command beyond the URDF's velocity limits is refused;
    hardware that clamps to its limits itself may set it False.

    Args:
        node_name: the node's name (graph.yaml's entry names it too).
        context: the rclpy context (robot_wm.nodes.runner passes it).
        hardware_id: what diagnostics call the hardware (e.g. a serial number).
        publish_rate_hz, command_timeout_s: defaults of the parameters of the same names.
    Raises:
        NodeConfigError: ``joint_names`` do not match the URDF's joints, or a parameter is out of range.
    """

    refuse_over_limit = True

    def __init__(self, node_name: str, context: Context | None = None, *, hardware_id: str = "arm",
                 publish_rate_hz: float = 500.0, command_timeout_s: float = 0.05) -> None:
        missing = [m for m in _REQUIRED if getattr(type(self), m) is getattr(ArmDriver, m)]
        if missing:  # refused before the node exists: never a driver that faults on every tick
            raise NodeConfigError(f"{type(self).__name__}: an ArmDriver must implement {missing} "
                                  "(docs/drivers.md)")
        super().__init__(node_name, context=context)
        from robot_wm import description

        limits = description.joint_limits(description.expand())
        self.rate_hz = declare(self, "publish_rate_hz", publish_rate_hz, "joint state publish rate (Hz)",
                               range_=(1.0, 1000.0), read_only=True)
        self.command_timeout_s = declare(self, "command_timeout_s", command_timeout_s,
                                         "no command for this long (s) -> the arm is brought to rest",
                                         range_=(0.002, 5.0), read_only=True)
        self.states_topic = declare(self, "joint_states_topic", "/joint_states", "sensor_msgs/JointState output",
                                    read_only=True)
        self.command_topic = declare(self, "command_topic", "/forward_velocity_controller/commands",
                                     "Float64MultiArray joint velocity input (rad/s)", read_only=True)
        self.joint_names = list(declare(self, "joint_names", list(limits.names), "joint order of commands and states",
                                        read_only=True))
        self.realtime_priority = declare(
            self, "realtime_priority", 0, "SCHED_FIFO priority of the driver's process, 1..98 (0: the normal "
            "scheduler; robot_wm.realtime)", range_=PRIORITY_RANGE, read_only=True)
        if self.joint_names != list(limits.names):
            raise NodeConfigError(f"{node_name}: parameter joint_names {self.joint_names} does not match the URDF's "
                                  f"{list(limits.names)}")
        self.joint_calibration_file = declare(
            self, "joint_calibration_file", "", "encoder offsets subtracted from the measured positions (robot-wm "
            "calibrate joints; '' none)", read_only=True)
        self.joint_calibration = None
        if self.joint_calibration_file:
            from robot_wm.core.joint_calibration import JointCalibrationError, load

            try:
                self.joint_calibration = load(self.joint_calibration_file, self.joint_names)
            except JointCalibrationError as exc:
                raise NodeConfigError(f"{node_name}: parameter joint_calibration_file: {exc}") from None
        self.limits = limits
        self.hardware_id = hardware_id
        self.fault: str | None = None  # the first exception of the driver's own methods, until ~/reset
        self.rejected = 0  # commands refused (malformed, beyond the limits, or during a fault)
        self._refusal_logged_s: dict[Refusal, float] = {}
        self.failed_publishes = 0  # publishes the middleware refused (never a fault: see publish_measurement)
        self._last_failed_publish: tuple[float, str, str] | None = None  # (monotonic s, topic, error)
        self._timeout = CommandTimeout(self.command_timeout_s)
        self._last_tick_s = time.monotonic()
        qos = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE, history=HistoryPolicy.KEEP_LAST)
        self._state_pub = self.create_publisher(JointState, self.states_topic, qos)
        self._diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self.create_subscription(Float64MultiArray, self.command_topic, self._on_command, qos)
        self.create_service(Trigger, "~/reset", self._on_reset)
        self._state_msg = JointState(name=self.joint_names)
        self.create_timer(1.0 / self.rate_hz, self._on_tick)
        self.create_timer(1.0, self._publish_diagnostics)

    # ------------------------------------------------------------------ what a driver implements
    def read_state(self) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Return the measured positions (rad), velocities (rad/s) and efforts (N·m, or None) in
        ``joint_names`` order. Called at ``publish_rate_hz``."""
        ...  # required: ArmDriver.__init__ refuses a driver without it

    def write_velocity(self, command_radps: np.ndarray) -> None:
        """Send a checked joint velocity command (rad/s, ``joint_names`` order) to the drives."""
        ...  # required: ArmDriver.__init__ refuses a driver without it

    def bring_to_rest(self) -> None:
        """Bring the arm to a controlled stop and hold it until the next ``write_velocity``
        (a refused command, a fault, shutdown, and by default the command timeout)."""
        ...  # required: ArmDriver.__init__ refuses a driver without it

    def reset(self) -> str:
        """Reset the hardware (``~/reset``); return what was done. Default: nothing to reset."""
        return "nothing to reset"

    def step(self, dt_s: float) -> None:
        """Advance a simulated arm by ``dt_s`` before each state is read (real hardware: nothing)."""

    def publish_extras(self, stamp: Time) -> None:
        """Publish what else the arm measures, with the joint state's stamp (e.g. a wrench)."""

    def on_command_timeout(self) -> None:
        """The command timeout ran out. Default: :meth:`bring_to_rest`. Override only where the
        hardware stops by its own timeout of the same length (the embedded arm's simulator)."""
        self.bring_to_rest()

    @property
    def timed_out(self) -> bool:
        """True from the command timeout until the next valid command."""
        return self._timeout.timed_out

    def warning(self) -> str | None:
        """A condition to report as WARN on /diagnostics (None: nothing)."""
        return None

    def diagnostic_values(self) -> list[tuple[str, str]]:
        """Extra (key, value) pairs for /diagnostics."""
        return []

    def publish_measurement(self, publisher: Any, msg: Any) -> bool:
        """Publish ``msg``; False when the middleware refused it.

        A refused publish (rcl's "cannot publish data": Fast DDS when a reliable reader falls behind
        on a loaded machine, after ``max_blocking_time``) is counted, logged once a second and
        reported as WARN on /diagnostics for a few seconds; it is not a driver fault and latches
        nothing. Any other exception (a wrong message type) is the driver's own and is raised.
        """
        try:
            publisher.publish(msg)
            return True
        except RCLError as exc:
            self.failed_publishes += 1
            error = str(exc).split(",")[0]  # "Failed to publish: cannot publish data" without the source lines
            self._last_failed_publish = (time.monotonic(), publisher.topic_name, error)
            self.get_logger().warning(f"publish on {publisher.topic_name} failed ({error}); "
                                      f"{self.failed_publishes} so far, the arm carries on", throttle_duration_sec=1.0)
            return False

    def _publish_warning(self) -> str | None:
        if self._last_failed_publish is None or time.monotonic() - self._last_failed_publish[0] > _PUBLISH_WARN_S:
            return None
        _, topic, error = self._last_failed_publish
        return f"{self.failed_publishes} publishes refused by the middleware (last on {topic}: {error})"

    # ------------------------------------------------------------------ the contract
    @property
    def state(self) -> DriverState:
        """The driver's state, as /diagnostics reports it."""
        if self.fault is not None:
            return DriverState.FAULT
        return DriverState.TIMED_OUT if self.timed_out else DriverState.RUNNING

    def _guarded(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Call a driver method; on an exception latch the fault, log it, bring the arm to rest; None."""
        try:
            return fn(*args)
        except Exception as exc:  # noqa: BLE001 (a driver error must not end the node or leave the arm moving)
            text = f"{what}: {type(exc).__name__}: {exc}"
            self.fault = self.fault or text
            self.get_logger().error(f"driver fault in {text}; the arm is brought to rest, commands refused until "
                                    "~/reset", throttle_duration_sec=1.0)
            if fn is not self.bring_to_rest:
                try:
                    self.bring_to_rest()
                except Exception as rest_exc:  # noqa: BLE001
                    self.get_logger().error(f"bring_to_rest failed too: {type(rest_exc).__name__}: {rest_exc}",
                                            throttle_duration_sec=1.0)
            return None

    def _on_command(self, msg: Float64MultiArray) -> None:
        command = np.asarray(msg.data, dtype=float)
        refusal = check_command(command, self.joint_names, self.limits.velocity_radps, self.refuse_over_limit)
        if refusal is None and self.fault is not None:
            refusal = Refusal.FAULT, f"driver fault latched ({self.fault}); call ~/reset"
        if refusal is not None:
            self.rejected += 1
            kind, text = refusal
            now_s = time.monotonic()
            if now_s - self._refusal_logged_s.get(kind, -1e9) >= _REFUSAL_LOG_PERIOD_S:  # each kind once a second
                self._refusal_logged_s[kind] = now_s
                self.get_logger().error(f"command rejected, arm brought to rest: {text}")
            self._guarded("bring_to_rest", self.bring_to_rest)
            return
        self._timeout.command(time.monotonic())
        self._guarded("write_velocity", self.write_velocity, command)

    def _on_tick(self) -> None:
        now_s = time.monotonic()
        if self._timeout.expired(now_s):
            self.get_logger().warning(f"no command for {self.command_timeout_s * 1e3:.0f} ms: bringing the arm to rest",
                                      throttle_duration_sec=5.0)
            self._guarded("on_command_timeout", self.on_command_timeout)
        self._guarded("step", self.step, now_s - self._last_tick_s)
        self._last_tick_s = now_s
        stamp = self.get_clock().now().to_msg()  # the measurement's time: taken as the state is read
        state = self._guarded("read_state", self.read_state)
        if state is None:
            return  # nothing measured, nothing published: consumers see the states stop
        position, velocity, effort = state
        msg = self._state_msg
        msg.header.stamp = stamp
        if self.joint_calibration is not None:  # a position vector of the wrong size is the driver's fault
            position = self._guarded("read_state", self.joint_calibration.correct, position)
            if position is None:
                return
        msg.position = np.asarray(position, dtype=float).tolist()
        msg.velocity = np.asarray(velocity, dtype=float).tolist()
        msg.effort = [] if effort is None else np.asarray(effort, dtype=float).tolist()
        self.publish_measurement(self._state_pub, msg)
        self._guarded("publish_extras", self.publish_extras, stamp)

    def _on_reset(self, request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
        previous, self.fault = self.fault, None
        done = self._guarded("reset", self.reset)
        if done is None:
            response.success, response.message = False, f"reset failed: {self.fault}"
            return response
        self._timeout.clear()
        response.success = True
        response.message = str(done) + (f"; fault cleared: {previous}" if previous else "")
        self.get_logger().info(f"reset: {response.message}")
        return response

    def _publish_diagnostics(self) -> None:
        state = self.state
        extra = self._guarded("diagnostic_values", self.diagnostic_values) or []
        refused = self._publish_warning()
        warning = (self._guarded("warning", self.warning) or refused) if state == DriverState.RUNNING else None
        state = self.state  # a failing hook above is a fault too
        status = DiagnosticStatus(name=f"robot_wm/{self.get_name()}", hardware_id=self.hardware_id)
        status.level = DiagnosticStatus.WARN if (warning and state == DriverState.RUNNING) else _DIAG_LEVEL[state]
        status.message = {DriverState.FAULT: f"{STATE_TEXT[state]}: {self.fault} (call ~/reset)"}.get(
            state, warning or STATE_TEXT[state])
        if refused and state == DriverState.TIMED_OUT:  # what usually follows refused states: no commands
            status.message += f"; {refused}"
        pairs = [("state", state.name), ("rejected_commands", str(self.rejected)),
                 ("command_timeout_s", f"{self.command_timeout_s:g}"), ("publish_rate_hz", f"{self.rate_hz:g}"),
                 ("failed_publishes", str(self.failed_publishes)),
                 ("joint_calibration", self.joint_calibration_file or "none")]
        status.values = [KeyValue(key=k, value=v) for k, v in pairs + list(extra)]
        msg = DiagnosticArray(status=[status])
        msg.header.stamp = self.get_clock().now().to_msg()
        self.publish_measurement(self._diag_pub, msg)

    def before_shutdown(self) -> None:
        """Called by the runner before the node is destroyed: the arm is left at rest."""
        self._guarded("bring_to_rest", self.bring_to_rest)


__all__ = ["ArmDriver"]
