"""safety_filter: the CBF-QP safety filter (OSQP), the ONLY publisher of hardware commands.

A thin adapter over :class:`robot_wm.core.safety.SafetyController`: it converts messages into
stamped samples, runs one ``step`` per control period and publishes the command on
/forward_velocity_controller/commands and the status on /robot_wm/safety_status (every period)
and /diagnostics (1 Hz). Inputs: /joint_states, the policy's nominal command
(/robot_wm/action_nominal), the wrist wrench (/robot_wm/wrench), the trust state (/robot_wm/trust).

Fail-safe (docs/safety_filter.md has the full table): the filter starts LATCHED ("waiting for
operator enable") on every start and configure and after every deactivate; only
/robot_wm/reset_estop releases a latch (``enable_on_start`` lets the embedded-arm demo graph enable
itself). E-stop (/robot_wm/estop) publishes a zero command from the service callback itself.
Malformed inputs and parameters latch a FAULT; no callback exception can end the process — it is
a controlled stop and a latched FAULT, its traceback logged once.

Safety limits are ROS parameters ``safety.<field>`` (config/safety.yaml); at run time a change is
accepted only if it makes the robot safer, is applied in place (latches are kept), and a value
that is malformed or out of range is refused and latches a FAULT.
"""
from __future__ import annotations

import dataclasses
import functools
import re
import time
import traceback
from collections.abc import Callable

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from geometry_msgs.msg import InertiaStamped, WrenchStamped
from rcl_interfaces.msg import ParameterDescriptor, SetParametersResult
from rclpy.context import Context
from rclpy.exceptions import InvalidParameterTypeException, InvalidParameterValueException
from rclpy.lifecycle import State, TransitionCallbackReturn
from rclpy.qos import QoSProfile, ReliabilityPolicy
from std_msgs.msg import Float64MultiArray
from std_srvs.srv import Trigger

from robot_wm.core.safety import (
    ControllerConfig,
    ControllerOutput,
    FilterState,
    JointSample,
    Latch,
    NominalSample,
    SafetyController,
    SafetyLimits,
    SafetyLimitsError,
    TrustSample,
    WrenchSample,
    load_safety_limits,
)
from robot_wm.msg import SafetyStatus, TrustState
from robot_wm.nodes.control_node import LATEST_ONLY, ControlNode

ANY_SENSOR = QoSProfile(depth=1, reliability=ReliabilityPolicy.BEST_EFFORT)  # see the wrench subscription
from robot_wm.nodes.model_swap import PERIOD_ENDS, PLACE_FILTER, retire

_DIGITS = re.compile(r"[0-9][0-9.e+-]*")  # the numbers in a stop's reason (ages, values)
from robot_wm.nodes.params import declare
from robot_wm.nodes.runner import NodeConfigError, main_for
from robot_wm.nodes.trust_payload import PAYLOAD_QOS, PAYLOAD_TOPIC

_DIAG_LEVEL = {FilterState.OK: DiagnosticStatus.OK, FilterState.FILTERING: DiagnosticStatus.OK,
               FilterState.STOPPING: DiagnosticStatus.WARN, FilterState.STOPPED: DiagnosticStatus.WARN,
               FilterState.ESTOP: DiagnosticStatus.ERROR, FilterState.FAULT: DiagnosticStatus.ERROR}


def _guarded(fn):
    """Run a callback so that no exception can leave it: it becomes a latched FAULT (logged once)."""

    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        try:
            return fn(self, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 (an exception in a callback would end the process)
            return self._callback_failed(fn.__name__, exc, args)

    return wrapper


@dataclasses.dataclass(frozen=True)
class PeriodRecord:
    """Wall-clock times of one control period (ns, ``time.time_ns()``), for latency measurements."""

    state_stamp_ns: int  # header stamp of the joint state the period consumed (0: none yet)
    state_received_ns: int  # when that joint state was received
    step_start_ns: int  # when the control step began
    publish_ns: int  # when the command was handed to publish()
    state: int  # the period's FilterState


class SafetyFilterNode(ControlNode):
    """Run SafetyController each period and publish the hardware command and the status."""

    #: Timing hook (benchmarks): when set, called with a PeriodRecord after every period's publish.
    #: Set it on the class before the node is created; it costs two clock reads per period.
    period_hook: Callable[[PeriodRecord], None] | None = None

    def __init__(self, context: Context | None = None, node_name: str = "safety_filter") -> None:
        super().__init__(node_name, context=context)
        self.model_path = declare(self, "world_model_path", "", "world model .onnx (empty: the task's active set "
                                  "of the model registry, robot_wm.registry.resolve; with none, the package's)",
                                  read_only=True)
        self.task = declare(self, "task", "reach", "the task whose active model set gives the default world model "
                            "(reach, track; robot_wm.graph.plan sets it, as for the world_model node)", read_only=True)
        self._swap = None  # WorldModelSwap once configured from the registry (online updates, rollbacks)
        require_model = declare(self, "require_model", True, "a missing or implausible world model is a fault (else: kinematic model)", read_only=True)
        latch_stale = declare(self, "latch_stale", False, "stale inputs latch like malformed ones (else: stop while stale)", read_only=True)
        level = declare(self, "default_trust_level", 3, "trust level before the first TrustState (TrustState LEVEL_*; 3 = STOP)", range_=(0, 4), read_only=True)
        phase = declare(self, "default_phase", 2, "deployment phase before the first TrustState (TrustState PHASE_*; 2 = REAL)", range_=(0, 2), read_only=True)
        trust_timeout = declare(self, "trust_timeout_s", 1.0, "a TrustState older than this is stale: controlled stop (s)", range_=(0.05, 60.0), read_only=True)
        force_sensor = declare(self, "force_sensor", True, "the arm has a wrist F/T sensor: its wrench is required and the force limit applies (false: no sensor, force limit off)", read_only=True)
        self.ft_frame = declare(self, "ft_frame", "ft_sensor_link", "frame of the wrench (URDF frame of the F/T sensor)", read_only=True)
        tare_window = declare(self, "tare_window_s", 0.3, "F/T readings at rest averaged into one tare (s)", range_=(0.01, 10.0), read_only=True)
        tare_bias = declare(self, "tare_max_bias_n", 10.0, "largest plausible F/T bias; more at rest means a contact (N)", range_=(0.1, 1000.0), read_only=True)
        tare_payload = declare(self, "tare_max_payload_kg", 5.0, "largest plausible payload below the F/T sensor (kg)", range_=(0.01, 100.0), read_only=True)
        tare_tol = declare(self, "tare_tolerance_n", 5.0, "a later tare must agree with the current one within this (N); ~/tare re-tares", range_=(0.1, 1000.0), read_only=True)
        payload_tau = declare(self, "payload_accel_tau_s", 0.02, "low-pass of the joint acceleration estimate whose payload inertia is added back to the contact force (s; 0: no compensation)", range_=(0.0, 1.0), read_only=True)
        slack_time = declare(self, "slack_time_s", 0.1, "a soft constraint exceeded beyond its tolerance for longer than this latches a FAULT (s)", range_=(0.001, 10.0), read_only=True)
        slack_tol = declare(self, "slack_tolerance", [0.05, 0.005, 0.02], "tolerances of tool speed (m/s), workspace (m), force (m/s) slack", read_only=True)
        enable = declare(self, "enable_on_start", False, "release the start latch by itself once inputs allow (embedded-arm demo graph only; never on hardware)", read_only=True)
        nominal_topic = declare(self, "nominal_topic", "/robot_wm/action_nominal", "the policy's command (rad/s)", read_only=True)
        self.command_topic = declare(self, "command_topic", "/forward_velocity_controller/commands", "hardware command output (rad/s)", read_only=True)
        wrench_topic = declare(self, "wrench_topic", "/robot_wm/wrench", "wrist F/T (N, N*m)", read_only=True)
        self.limits = self._declare_limits()
        from robot_wm.core.task import load_task

        self.model_dt_s = load_task().control_dt_s  # the step the shipped world model predicts
        # at the model's step, or a whole fraction of it (the 500 Hz gate: the model's newest linearization, aged)
        steps = self.model_dt_s / self.period_s
        self.use_model = steps >= 1.0 - 1e-9 and abs(steps - round(steps)) <= 1e-6 * steps
        if not self.use_model and require_model:
            raise NodeConfigError(
                f"safety_filter: control_period_s={self.period_s:g} s is neither the world model's step "
                f"{self.model_dt_s:g} s (config/task.yaml control_dt_s) nor a whole fraction of it: run at such a "
                "period, or set require_model:=false to filter with the kinematic model at this rate")
        try:
            self.config = ControllerConfig(
                dt_s=self.period_s, model_dt_s=self.model_dt_s if self.use_model else None, require_model=require_model,
                latch_stale=latch_stale, default_trust_level=level,
                default_phase=phase, trust_timeout_s=trust_timeout, force_sensor=force_sensor, ft_frame=self.ft_frame,
                tare_window_s=tare_window, tare_max_bias_n=tare_bias, tare_max_payload_kg=tare_payload, tare_tolerance_n=tare_tol,
                payload_accel_tau_s=payload_tau, slack_tolerance=tuple(slack_tol), slack_time_s=slack_time, auto_enable=enable)
        except ValueError as exc:
            raise NodeConfigError(f"safety_filter: {exc}") from exc
        if not force_sensor:
            self.get_logger().warning("force_sensor is false: no wrist F/T sensor, the contact-force limit "
                                      f"(safety.force_limit_n = {self.limits.force_limit_n:g} N) is NOT enforced")
        if enable:
            self.get_logger().warning("enable_on_start is true: the filter releases its start latch by itself "
                                      "(embedded-arm demo graph only)")

        self.controller: SafetyController | None = None
        self._carried_latches: dict[Latch, str] = {}  # latches kept across cleanup -> configure
        self._configured_before = False
        self._cmd_pub = self.create_publisher(Float64MultiArray, self.command_topic, 10)
        self._status_pub = self.create_publisher(SafetyStatus, "/robot_wm/safety_status", 10)
        self._diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self._payload_pub = self.create_publisher(InertiaStamped, PAYLOAD_TOPIC, PAYLOAD_QOS)
        self._tare_published = None  # the declared tare last published on PAYLOAD_TOPIC
        self._nominal: NominalSample | None = None
        self._wrench: WrenchSample | None = None
        self._trust: TrustSample | None = None
        self._reported: set[tuple[str, str]] = set()  # (callback, exception type) already logged
        self._stop_logged: tuple[int, str, str] | None = None  # (state, fault kind, reason) of the stop in progress
        self._stop_periods = 0  # periods since that stop began
        self._stop_log_times: dict[tuple[int, str, str], float] = {}  # kind of stop -> when it was last logged
        self._stop_quiet = False  # the stop in progress repeats one logged within the second: not logged
        self.add_on_set_parameters_callback(self._on_set_parameters)
        self.create_subscription(Float64MultiArray, nominal_topic, self._on_nominal, LATEST_ONLY)
        # best effort matches both kinds of F/T publisher: the sensor-data QoS of most drivers (a
        # reliable reader gets nothing from them) and the reliable one of ros2_control's broadcaster and
        # the embedded arm; a lost sample is replaced by the next one 2 ms later
        self.create_subscription(WrenchStamped, wrench_topic, self._on_wrench, ANY_SENSOR)
        self.create_subscription(TrustState, "/robot_wm/trust", self._on_trust, 10)
        self.create_service(Trigger, "/robot_wm/estop", self._on_estop)
        self.create_service(Trigger, "/robot_wm/reset_estop", self._on_reset)
        self.create_service(Trigger, "~/tare", self._on_tare)
        self.create_timer(1.0, self._publish_diagnostics)  # once: it reports whatever state the node is in

    # ---- parameters: limits may only get safer at run time, applied in place
    def _declare_limits(self) -> SafetyLimits:
        defaults = load_safety_limits().to_mapping()
        values = {}
        for name, default in defaults.items():
            desc = ParameterDescriptor(description=f"safety limit {name} (config/safety.yaml; only tightening changes accepted)")
            try:
                values[name] = self.declare_parameter(f"safety.{name}", default, desc).value
            except (InvalidParameterTypeException, InvalidParameterValueException) as exc:
                raise NodeConfigError(f"safety_filter: parameter 'safety.{name}' (default {default!r}): {exc}") from exc
        try:
            return SafetyLimits.from_mapping({k: list(v) if isinstance(v, (list, tuple)) else v for k, v in values.items()},
                                             source="safety parameters")
        except SafetyLimitsError as exc:
            raise NodeConfigError(f"safety_filter: {exc}") from exc

    def _on_set_parameters(self, params) -> SetParametersResult:
        try:
            return self._apply_parameters(params)
        except Exception as exc:  # noqa: BLE001 (a parameter callback must not take the filter down)
            self._callback_failed("set_parameters", exc, ())
            return SetParametersResult(successful=False, reason=f"internal error applying parameters: {exc}")

    def _apply_parameters(self, params) -> SetParametersResult:
        changes = {p.name[len("safety."):]: (list(p.value) if isinstance(p.value, (list, tuple)) else p.value)
                   for p in params if p.name.startswith("safety.")}
        if not changes:
            return SetParametersResult(successful=True)
        try:
            candidate = dataclasses.replace(self.limits, **changes)
        except (SafetyLimitsError, TypeError, ValueError) as exc:  # malformed or out of range: refuse and latch
            return self._refuse_parameter(str(exc), latch=True)
        reasons = self.limits.loosening_reasons(candidate)
        if reasons:  # valid but looser: refused, nothing latched
            return self._refuse_parameter("limits may only get safer at run time; " + "; ".join(reasons), latch=False)
        if self.controller is not None:
            try:
                changed = self.controller.set_limits(candidate)
            except (SafetyLimitsError, ValueError) as exc:
                return self._refuse_parameter(str(exc), latch=True)
            if changed:
                self.get_logger().warning(f"safety limits tightened in place: {sorted(changes)}")
        self.limits = candidate
        return SetParametersResult(successful=True)

    def _refuse_parameter(self, reason: str, latch: bool) -> SetParametersResult:
        if latch and self.controller is not None:
            self.controller.parameter_fault(reason)
            self.get_logger().error(f"parameter refused and FAULT latched: {reason}")
        else:
            self.get_logger().warning(f"parameter refused: {reason}")
        return SetParametersResult(successful=False, reason=reason)

    # ---- lifecycle
    def on_configure(self, state: State) -> TransitionCallbackReturn:
        from robot_wm import description
        from robot_wm.core.kinematics import Kinematics
        from robot_wm.core.onnx_model import ModelError
        from robot_wm.core.world_model_runner import WorldModelRunner
        from robot_wm.registry import resolve

        urdf = description.expand()
        limits = description.joint_limits(urdf)
        if self.joint_names == [""]:
            self.joint_names = list(limits.names)
        runner = None
        try:
            if not self.use_model:
                raise ValueError(f"its {self.model_dt_s:g} s step is not a whole number of this filter's "
                                 f"{self.period_s:g} s periods")
            path = self.model_path or str(resolve(self.task, "world_model", warn=self.get_logger().warning))
            runner = WorldModelRunner(path, self.joint_names, self.model_dt_s)
            self.get_logger().info(f"world model {runner.version} loaded from {path}; linearized by {runner.linearization}")
            if not self.model_path and self._swap is None:  # registry-managed: updates are swapped in between periods
                from robot_wm.nodes.model_swap import WorldModelSwap

                self._swap = WorldModelSwap(self, self.task, self.joint_names, self.model_dt_s, analytic=True,
                                            in_use=lambda: getattr(getattr(self.controller, "model", None), "version", None))
        except (ModelError, ValueError, OSError) as exc:
            # the filter still starts: with require_model every period is a FAULT (controlled stop)
            self.get_logger().error(f"world model unavailable ({exc}); "
                                    + ("every period will stop the arm" if self.config.require_model else "using the kinematic model"))
        # latches come along from the controller this node had (cleanup, error) and enable_on_start
        # releases the start latch of the first configure only: a later configure waits for an operator
        carried = dict(self.controller.supervisor.latches) if self.controller is not None else self._carried_latches
        config = self.config if not self._configured_before else dataclasses.replace(self.config, auto_enable=False)
        try:
            kin = Kinematics(urdf, self.joint_names)
            self.controller = SafetyController(self.limits, kin, config, runner, latches=carried)
        except (SafetyLimitsError, ValueError) as exc:
            self.get_logger().error(f"configure failed: {exc}")
            return TransitionCallbackReturn.FAILURE
        self._configured_before = True
        return TransitionCallbackReturn.SUCCESS

    def on_activate(self, state: State) -> TransitionCallbackReturn:
        latched = self.controller.supervisor.latch_text() if self.controller else ""
        self.get_logger().info(f"safety filter active at {1.0 / self.period_s:.0f} Hz; sole publisher of "
                               f"{self.command_topic}" + (f"; latched: {latched}" if latched else ""))
        return super().on_activate(state)

    def on_deactivate(self, state: State) -> TransitionCallbackReturn:
        self._send_zero()
        if self.controller is not None:
            self.controller.hold("deactivated (lifecycle)")
        return super().on_deactivate(state)

    def on_cleanup(self, state: State) -> TransitionCallbackReturn:
        if self.controller is not None:
            self._carried_latches = dict(self.controller.supervisor.latches)
        self.controller = None
        return TransitionCallbackReturn.SUCCESS

    def on_shutdown(self, state: State) -> TransitionCallbackReturn:
        self._halt("shut down (lifecycle)")
        return TransitionCallbackReturn.SUCCESS

    def on_error(self, state: State) -> TransitionCallbackReturn:
        self._halt("lifecycle error")
        return TransitionCallbackReturn.SUCCESS

    def _halt(self, reason: str) -> None:
        """Stop commanding: no more control periods, the start latch set, a zero command sent."""
        if self._control_timer is not None:  # rclpy timers are not lifecycle-managed
            self.destroy_timer(self._control_timer)
            self._control_timer = None
        if self.controller is not None:
            self.controller.hold(reason)
        self._send_zero()

    # ---- inputs: stored as stamped samples; every check happens in the controller, which also sees
    # each message as it arrives (note): a malformed one replaced within a period still latches
    def _note(self, sample) -> None:
        if self.controller is not None:
            self.controller.note(sample)

    @_guarded
    def _on_joint_state(self, msg) -> None:
        super()._on_joint_state(msg)
        if self.state_error is not None:
            self._note(JointSample(None, None, time.monotonic(), error=self.state_error))

    @_guarded
    def _on_nominal(self, msg: Float64MultiArray) -> None:
        self._nominal = NominalSample(np.asarray(msg.data, dtype=float), time.monotonic())
        self._note(self._nominal)

    @_guarded
    def _on_wrench(self, msg: WrenchStamped) -> None:
        f = msg.wrench.force
        self._wrench = WrenchSample(np.array([f.x, f.y, f.z]), time.monotonic(), msg.header.frame_id)
        self._note(self._wrench)

    @_guarded
    def _on_trust(self, msg: TrustState) -> None:
        self._trust = TrustSample(int(msg.level), int(msg.phase), time.monotonic(), msg.reason)
        self._note(self._trust)

    # ---- services
    @_guarded
    def _on_estop(self, request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
        if self.controller is None:
            response.success, response.message = False, "e-stop refused: the safety filter is not configured"
            self._send_zero()
        else:
            response.success, response.message = self.controller.request_estop("operator e-stop")
            self._send_zero()  # now, not next period
        self.get_logger().warning(f"E-STOP: {response.message}")
        return response

    @_guarded
    def _on_tare(self, request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
        if self.controller is None:
            response.success, response.message = False, "tare refused: the safety filter is not configured"
        else:
            response.success, response.message = self.controller.request_tare()
        self.get_logger().warning(response.message)
        return response

    @_guarded
    def _on_reset(self, request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
        if self.controller is None:
            response.success, response.message = False, "reset refused: the safety filter is not configured"
        else:
            response.success, response.message = self.controller.reset()
        # one call site per severity: rclpy refuses a call site whose severity changes between calls
        if response.success:
            self.get_logger().info(response.message)
        else:
            self.get_logger().warning(response.message)
        return response

    # ---- the control period
    def _joint_sample(self) -> JointSample | None:
        if self.state_error is not None:
            return JointSample(None, None, time.monotonic(), error=self.state_error)
        if self.state is None:
            return None
        received_s, q, qdot = self.state
        return JointSample(q, qdot, received_s)

    @_guarded
    def control_step(self) -> None:
        """One period: run the controller and publish the hardware command and the status."""
        start_ns = time.time_ns() if self.period_hook is not None else 0
        if self._swap is not None and self.controller.model is not None:  # loaded off this thread: swapped between periods
            swapped = self._swap.take(self.controller.model)
            if swapped is not None:
                retire(self.controller.model)  # freed off this thread
                self.controller.model = swapped
        try:
            out = self.controller.step(time.monotonic(), joint=self._joint_sample(), nominal=self._nominal,
                                       wrench=self._wrench, trust=self._trust)
        except Exception as exc:  # noqa: BLE001 (step never raises; this guards the adapter around it)
            out = self.controller.internal_fault(exc)
        if out.traceback:
            self.get_logger().error(f"unexpected exception in a control period (controlled stop, FAULT latched):\n{out.traceback}")
        self._log_stop(out)
        self._publish(out)
        PERIOD_ENDS.mark(PLACE_FILTER)  # a model loader's long steps start now, in the slack
        if self.period_hook is not None:
            self.period_hook(PeriodRecord(self.state_stamp_ns, self.state_received_ns, start_ns, time.time_ns(), int(out.state)))

    def _log_stop(self, out: ControllerOutput) -> None:
        """One log line when the filter starts a controlled stop (STOPPING or FAULT, with its reason) and
        one when it runs again: the status topic says it every period, an operator's log once. The same
        kind of stop again within a second (an input flapping around its stale limit) is not logged
        again, nor is its end; a different kind always is."""
        state = int(out.state)
        if state in (FilterState.STOPPING, FilterState.FAULT):
            kind = out.fault_kind.value if out.fault_kind is not None else ""
            key = (state, kind, _DIGITS.sub("#", out.reason))  # the same stop, whatever its numbers say
            self._stop_periods += 1
            if key != self._stop_logged:
                self._stop_logged = key
                now, last = time.monotonic(), self._stop_log_times.get(key)
                self._stop_quiet = last is not None and now - last < 1.0
                if not self._stop_quiet:
                    self._stop_log_times[key] = now
                    self.get_logger().warning(f"controlled stop, {out.state_text}" + (f" ({kind})" if kind else "")
                                              + f": {out.reason}")
        elif state in (FilterState.OK, FilterState.FILTERING) and self._stop_logged is not None:
            if not self._stop_quiet:
                self.get_logger().info(f"running again ({out.state_text}) after {self._stop_periods} periods of controlled stop")
            self._stop_logged, self._stop_periods = None, 0

    def _publish(self, out: ControllerOutput) -> None:
        self._cmd_pub.publish(Float64MultiArray(data=np.asarray(out.u_safe_radps, dtype=float).tolist()))
        msg = SafetyStatus()
        msg.header.stamp = self.get_clock().now().to_msg()
        msg.state = int(out.state)
        msg.state_text = out.state_text
        msg.active_constraints = list(out.active_constraints)
        msg.intervention_norm = float(out.intervention_norm)
        msg.solver_status = int(out.solver_status)
        msg.solver_status_text = out.solver_status_text
        msg.iterations = int(out.iterations)
        msg.solve_time_s = float(out.solve_time_s)
        msg.max_slack = float(out.max_slack)
        msg.fault_reason = out.reason
        msg.fault_kind = out.fault_kind.value if out.fault_kind is not None else ""
        msg.latches = list(out.latches)
        self._status_pub.publish(msg)
        tare = self.controller.tare.declared  # the trust monitor's effort model takes a declared payload on
        if tare is not None and tare is not self._tare_published:
            self._publish_payload(tare, msg.header.stamp)

    def _publish_payload(self, tare, stamp) -> None:
        """The declared tare on PAYLOAD_TOPIC. It is for the trust monitor, after this period's command and
        status: a failure here is logged and the next period tries again; it never ends the period."""
        try:
            payload = InertiaStamped()
            payload.header.stamp, payload.header.frame_id = stamp, self.ft_frame
            payload.inertia.m = float(tare.payload_kg)  # the mass only: one pose does not give the centre of mass
            self._payload_pub.publish(payload)
            self._tare_published = tare
        except Exception as exc:  # noqa: BLE001 (the command and status are out; the filter must go on)
            self.get_logger().error(f"{PAYLOAD_TOPIC}: the tare could not be published ({type(exc).__name__}: {exc}); "
                                    "trying again next period", throttle_duration_sec=5.0)

    def _send_zero(self) -> None:
        self._cmd_pub.publish(Float64MultiArray(data=[0.0] * len(self.joint_names)))

    def _callback_failed(self, where: str, exc: Exception, args) -> object:
        """An exception escaped a callback: latch a FAULT, send a controlled stop, log it once."""
        key = (where, type(exc).__name__)
        if key not in self._reported:
            self._reported.add(key)
            self.get_logger().error(f"exception in {where} (controlled stop, FAULT latched):\n"
                                    + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
        try:
            if self.controller is not None:
                self._publish(self.controller.internal_fault(exc))
            else:
                self._send_zero()
        except Exception:  # noqa: BLE001 (nothing more can be done from here; the next period tries again)
            pass
        response = args[-1] if args and isinstance(args[-1], Trigger.Response) else None
        if response is not None:
            response.success, response.message = False, f"internal error: {type(exc).__name__}: {exc}"
        return response

    def _publish_diagnostics(self) -> None:
        try:
            ctrl = self.controller
            status = DiagnosticStatus(name="robot_wm/safety_filter", hardware_id="robot_wm")
            if ctrl is None:
                status.level, status.message = DiagnosticStatus.WARN, "not configured"
            else:
                status.level, status.message = _DIAG_LEVEL[ctrl.state], ctrl.state.name
                values = ctrl.summary()
                values["world_model"] = str(getattr(ctrl.model, "version", "none (kinematic model)"))
                values["world_model_swaps"] = str(self._swap.swaps if self._swap is not None else 0)
                if self._swap is not None and self._swap.last_refusal:
                    values["world_model_refused"] = self._swap.last_refusal
                status.values = [KeyValue(key=k, value=str(v)) for k, v in values.items()]
            msg = DiagnosticArray(status=[status])
            msg.header.stamp = self.get_clock().now().to_msg()
            self._diag_pub.publish(msg)
        except Exception as exc:  # noqa: BLE001 (diagnostics must never take the filter down)
            self._callback_failed("diagnostics", exc, ())

    def before_shutdown(self) -> None:
        """Leave the hardware with a zero command (its own timeout would stop it anyway)."""
        self._send_zero()


main = main_for(SafetyFilterNode)

if __name__ == "__main__":
    main()
