"""safety_filter: the CBF-QP safety filter (OSQP), the ONLY publisher of hardware commands.

Each control period it takes the latest /joint_states, the policy's nominal command
(/robot_wm/action_nominal), the wrist wrench and the trust state, linearizes the world model
about the nominal command, and publishes the command closest to the nominal one that keeps every
barrier (joint limits, speed and acceleration, tool speed, table and keep-outs, contact force) on
/forward_velocity_controller/commands. Any NaN/Inf, stale or missing input, a solver failure or an
infeasible QP gives a controlled stop, never the nominal command. E-stop (/robot_wm/estop) is
latched: zero within one period, released only by /robot_wm/reset_estop, which is refused while a
fault persists. Status on /robot_wm/safety_status every period and on /diagnostics at 1 Hz.

Safety limits are ROS parameters ``safety.<field>`` (config/safety.yaml); at run time a change is
accepted only if it makes the robot safer (SafetyLimits.tighten), so loosening ones are read-only.
"""
from __future__ import annotations

import time

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from geometry_msgs.msg import WrenchStamped
from rcl_interfaces.msg import ParameterDescriptor, SetParametersResult
from rclpy.context import Context
from rclpy.exceptions import InvalidParameterTypeException, InvalidParameterValueException
from rclpy.lifecycle import State, TransitionCallbackReturn
from std_msgs.msg import Float64MultiArray
from std_srvs.srv import Trigger

from robot_wm.core.safety import (
    FilterInput,
    FilterState,
    LinearizedModel,
    SafetyFilter,
    SafetyLimits,
    SafetyLimitsError,
    SafetySupervisor,
    load_safety_limits,
)
from robot_wm.msg import SafetyStatus, TrustState
from robot_wm.nodes.control_node import LATEST_ONLY, ControlNode
from robot_wm.nodes.params import declare
from robot_wm.nodes.runner import main_for

_TARE_S = 0.3  # wrench samples averaged at start-up (no contact assumed) to remove payload weight and bias


class SafetyFilterNode(ControlNode):
    """Filter the nominal command through the CBF-QP each period and publish the hardware command."""

    def __init__(self, context: Context | None = None, node_name: str = "safety_filter") -> None:
        super().__init__(node_name, context=context)
        self.model_path = declare(self, "world_model_path", "", "world model .onnx (empty: models/world_model.onnx of the package)", read_only=True)
        self.require_model = declare(self, "require_model", True, "a missing world model is a fault (else: kinematic model)", read_only=True)
        self.latch_faults = declare(self, "latch_faults", True, "faults stop the arm until /robot_wm/reset_estop", read_only=True)
        self.default_level = declare(self, "default_trust_level", 0, "trust level until a TrustState arrives (TrustState LEVEL_*)", range_=(0, 4), read_only=True)
        self.default_phase = declare(self, "default_phase", 0, "phase until a TrustState arrives (TrustState PHASE_*)", range_=(0, 2), read_only=True)
        self.trust_timeout_s = declare(self, "trust_timeout_s", 1.0, "a TrustState older than this falls back to the default (s)", range_=(0.05, 60.0), read_only=True)
        nominal_topic = declare(self, "nominal_topic", "/robot_wm/action_nominal", "the policy's command (rad/s)", read_only=True)
        self.command_topic = declare(self, "command_topic", "/forward_velocity_controller/commands", "hardware command output (rad/s)", read_only=True)
        wrench_topic = declare(self, "wrench_topic", "/robot_wm/wrench", "wrist F/T (N, N*m)", read_only=True)
        self.limits = self._declare_limits()
        self.add_on_set_parameters_callback(self._on_set_parameters)
        from robot_wm.core.task import load_task
        from robot_wm.nodes.runner import NodeConfigError

        self.model_dt_s = load_task().control_dt_s  # the step the shipped world model predicts
        self.use_model = abs(self.period_s - self.model_dt_s) < 1e-9
        if not self.use_model and self.require_model:
            raise NodeConfigError(
                f"safety_filter: control_period_s={self.period_s:g} s differs from the world model's step "
                f"{self.model_dt_s:g} s (config/task.yaml control_dt_s): run at the model's period, or set "
                "require_model:=false to filter with the kinematic model at this rate")

        self.kin = None
        self.supervisor: SafetySupervisor | None = None
        self.runner = None
        self._cmd_pub = None
        self._status_pub = None
        self._diag_pub = None
        self._nominal: tuple[float, np.ndarray] | None = None
        self._trust: tuple[float, int, int] | None = None
        self._force_sensor: np.ndarray | None = None
        self._tare: list[np.ndarray] = []
        self._tare_base: np.ndarray | None = None
        self._started = False
        self._last_step_s: float | None = None  # when the previous filtered command was computed
        self.create_subscription(Float64MultiArray, nominal_topic, self._on_nominal, LATEST_ONLY)
        self.create_subscription(WrenchStamped, wrench_topic, self._on_wrench, LATEST_ONLY)
        self.create_subscription(TrustState, "/robot_wm/trust", self._on_trust, 10)
        self.create_service(Trigger, "/robot_wm/estop", self._on_estop)
        self.create_service(Trigger, "/robot_wm/reset_estop", self._on_reset)

    # ---- parameters: limits may only get safer at run time
    def _declare_limits(self) -> SafetyLimits:
        defaults = load_safety_limits().to_mapping()
        values = {}
        for name, default in defaults.items():
            desc = ParameterDescriptor(description=f"safety limit {name} (config/safety.yaml; only tightening changes accepted)")
            try:
                values[name] = self.declare_parameter(f"safety.{name}", default, desc).value
            except (InvalidParameterTypeException, InvalidParameterValueException) as exc:
                from robot_wm.nodes.runner import NodeConfigError

                raise NodeConfigError(f"safety_filter: parameter 'safety.{name}' (default {default!r}): {exc}") from exc
        try:
            return SafetyLimits.from_mapping({k: list(v) if isinstance(v, (list, tuple)) else v for k, v in values.items()},
                                             source="safety parameters")
        except SafetyLimitsError as exc:
            from robot_wm.nodes.runner import NodeConfigError

            raise NodeConfigError(f"safety_filter: {exc}") from exc

    def _on_set_parameters(self, params) -> SetParametersResult:
        changes = {p.name[len("safety."):]: (list(p.value) if isinstance(p.value, (list, tuple)) else p.value)
                   for p in params if p.name.startswith("safety.")}
        if not changes:
            return SetParametersResult(successful=True)
        try:
            tightened = self.limits.tighten(**changes)
        except SafetyLimitsError as exc:
            return SetParametersResult(successful=False, reason=str(exc))
        self.limits = tightened
        if self.kin is not None:
            self._build_filter()  # between periods: the executor runs callbacks one at a time
        self.get_logger().warning(f"safety limits tightened: {sorted(changes)}")
        return SetParametersResult(successful=True)

    # ---- lifecycle
    def on_configure(self, state: State) -> TransitionCallbackReturn:
        from robot_wm import description
        from robot_wm.core.kinematics import Kinematics
        from robot_wm.core.onnx_model import ModelError
        from robot_wm.core.world_model_runner import WorldModelRunner
        from robot_wm.paths import data_path

        urdf = description.expand()
        limits = description.joint_limits(urdf)
        if self.joint_names == [""]:
            self.joint_names = list(limits.names)
        try:
            self.limits.check_within(limits.lower_rad, limits.upper_rad, limits.velocity_radps, limits.names)
            self.kin = Kinematics(urdf, self.joint_names)
        except (SafetyLimitsError, ValueError) as exc:
            self.get_logger().error(f"configure failed: {exc}")
            return TransitionCallbackReturn.FAILURE
        path = self.model_path or str(data_path("models", "world_model.onnx", must_exist=False))
        try:
            if not self.use_model:
                raise ValueError(f"its {self.model_dt_s:g} s step is not this filter's {self.period_s:g} s period")
            self.runner = WorldModelRunner(path, self.joint_names, self.period_s)
        except (ModelError, ValueError, OSError) as exc:
            self.runner = None
            # the filter still starts: with require_model every period is a FAULT (controlled stop)
            self.get_logger().error(f"world model unavailable ({exc}); "
                                    + ("every period will stop the arm" if self.require_model else "using the kinematic model"))
        self._build_filter()
        self._cmd_pub = self.create_publisher(Float64MultiArray, self.command_topic, 10)
        self._status_pub = self.create_publisher(SafetyStatus, "/robot_wm/safety_status", 10)
        self._diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        return TransitionCallbackReturn.SUCCESS

    def _build_filter(self) -> None:
        old = self.supervisor
        filt = SafetyFilter(self.limits, self.kin, self.period_s, require_model=self.require_model)
        self.supervisor = SafetySupervisor(filt, latch_faults=self.latch_faults)
        if old is not None and old.estopped:
            self.supervisor.request_estop("e-stop carried over a limits change")

    def on_activate(self, state: State) -> TransitionCallbackReturn:
        self.create_timer(1.0, self._publish_diagnostics)
        self.get_logger().info(f"safety filter active at {1.0 / self.period_s:.0f} Hz; sole publisher of {self.command_topic}")
        return super().on_activate(state)

    def on_deactivate(self, state: State) -> TransitionCallbackReturn:
        if self._cmd_pub is not None:
            self._cmd_pub.publish(Float64MultiArray(data=[0.0] * len(self.joint_names)))
        if self.supervisor is not None:
            self.supervisor.filter.record_sent(np.zeros(len(self.joint_names)))  # what was just sent
        self._last_step_s = None  # re-activation starts a fresh timing history
        return super().on_deactivate(state)

    # ---- inputs
    def _on_nominal(self, msg: Float64MultiArray) -> None:
        # kept as received: a wrong length or NaN reaches the filter, which stops the arm and says why
        self._nominal = (time.monotonic(), np.asarray(msg.data, dtype=float))

    def _on_wrench(self, msg: WrenchStamped) -> None:
        f = msg.wrench.force
        self._force_sensor = np.array([f.x, f.y, f.z])

    def _on_trust(self, msg: TrustState) -> None:
        self._trust = (time.monotonic(), int(msg.level), int(msg.phase))

    # ---- services
    def _on_estop(self, request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
        response.success, response.message = self.supervisor.request_estop("operator e-stop") if self.supervisor else (False, "not configured")
        if response.success and self._cmd_pub is not None:
            self._cmd_pub.publish(Float64MultiArray(data=[0.0] * len(self.joint_names)))  # now, not next period
        self.get_logger().warning(f"E-STOP: {response.message}")
        return response

    def _on_reset(self, request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
        if self.supervisor is None:
            response.success, response.message = False, "reset refused: the safety filter is not configured"
        else:
            response.success, response.message = self.supervisor.reset()
        # one call site per severity: rclpy refuses a call site whose severity changes between calls
        if response.success:
            self.get_logger().info(response.message)
        else:
            self.get_logger().warning(response.message)
        return response

    # ---- the control period
    def _force_base(self, q: np.ndarray) -> np.ndarray | None:
        if self._force_sensor is None:
            return None
        rot = self.kin.frame_pose(q, "ft_sensor_link").rotation
        force = rot @ self._force_sensor
        if self._tare_base is None:
            self._tare.append(force)
            if len(self._tare) * self.period_s >= _TARE_S:
                self._tare_base = np.mean(self._tare, axis=0)
            return None
        return force - self._tare_base

    def _scale(self, now: float) -> tuple[float, float]:
        level, phase = self.default_level, self.default_phase
        if self._trust is not None and now - self._trust[0] <= self.trust_timeout_s:
            _, level, phase = self._trust
        factors = self.limits.scale_for(level, phase)
        return factors.speed, factors.acceleration

    def control_step(self) -> None:
        """One period: filter the nominal command and publish the hardware command and status."""
        now = time.monotonic()
        if self.state is None and self.state_error is None:
            self._publish(np.zeros(len(self.joint_names)), None, "waiting for /joint_states")
            return
        if self.state is None:  # only malformed joint states so far: the arm never moved under this filter
            out = self.supervisor.fault(f"bad joint state: {self.state_error}", None, latch=False)
            self._publish(out.u_safe_radps, out, out.reason)
            return
        received_s, q, qdot = self.state
        if not self._started:
            if self._nominal is None:
                self._publish(np.zeros(len(self.joint_names)), None, "waiting for the nominal command")
                return
            self._started = True
        state_age = (now - received_s) / self.period_s
        nominal_age = (now - self._nominal[0]) / self.period_s
        u_nom = self._nominal[1]
        model = None
        if self.runner is not None and u_nom.shape == (6,) and np.all(np.isfinite(u_nom)):
            model = LinearizedModel(*self.runner.linearize_with_std(q, qdot, u_nom))
        speed, accel = self._scale(now)
        elapsed = None if self._last_step_s is None else now - self._last_step_s
        self._last_step_s = now
        inp = FilterInput(q_rad=q, qdot_radps=qdot, u_nominal_radps=u_nom, model=model, force_n=self._force_base(q),
                          trust_scale=speed, accel_scale=accel, input_age_periods=max(state_age, nominal_age),
                          elapsed_s=elapsed)
        if self.state_error is not None:  # the latest joint state was unusable: fault, controlled stop
            out = self.supervisor.fault(f"bad joint state: {self.state_error}", qdot, elapsed_s=elapsed)
        else:
            out = self.supervisor.step(inp)
        if self.runner is not None:
            self.runner.commit(out.u_safe_radps)
        self._publish(out.u_safe_radps, out, out.reason)

    def _publish(self, u: np.ndarray, out, reason: str) -> None:
        self._cmd_pub.publish(Float64MultiArray(data=np.asarray(u, dtype=float).tolist()))
        msg = SafetyStatus()
        msg.header.stamp = self.get_clock().now().to_msg()
        if out is None:
            msg.state, msg.state_text, msg.fault_reason = SafetyStatus.STOPPED, "STOPPED", reason
        else:
            msg.state = int(out.state)
            msg.state_text = out.state_text
            msg.active_constraints = list(out.active_constraints)
            msg.intervention_norm = float(out.intervention_norm)
            msg.solver_status = int(out.solver_status)
            msg.solver_status_text = out.solver_status_text
            msg.iterations = int(out.iterations)
            msg.solve_time_s = float(out.solve_time_s)
            msg.max_slack = float(out.max_slack)
            msg.fault_reason = reason
        self._status_pub.publish(msg)

    def _publish_diagnostics(self) -> None:
        if self.supervisor is None:
            return
        state = self.supervisor.state
        status = DiagnosticStatus(name="robot_wm/safety_filter", hardware_id="robot_wm")
        status.level = {FilterState.OK: DiagnosticStatus.OK, FilterState.FILTERING: DiagnosticStatus.OK}.get(
            state, DiagnosticStatus.ERROR if state in (FilterState.FAULT, FilterState.ESTOP) else DiagnosticStatus.WARN)
        status.message = state.name
        status.values = [KeyValue(key=k, value=str(v)) for k, v in self.supervisor.summary().items()]
        msg = DiagnosticArray(status=[status])
        msg.header.stamp = self.get_clock().now().to_msg()
        self._diag_pub.publish(msg)

    def before_shutdown(self) -> None:
        """Leave the hardware with a zero command (its own timeout would stop it anyway)."""
        if self._cmd_pub is not None:
            self._cmd_pub.publish(Float64MultiArray(data=[0.0] * len(self.joint_names)))


main = main_for(SafetyFilterNode)

if __name__ == "__main__":
    main()
