"""SafetyController: the whole safety filter's control period, from plain inputs to one command.

The safety_filter node, the composed control stack, the benchmarks, the library-mode evaluation
and the tests all run this one object (moveit_servo's split: a core class on plain types, a thin
node that converts messages and runs the timer)::

    ctrl = SafetyController(limits, kinematics, ControllerConfig(dt_s=0.01), model=runner)
    out = ctrl.step(now_s, joint=JointSample(q, qdot, stamp_s), nominal=NominalSample(u, stamp_s),
                    wrench=WrenchSample(force_sensor_n, stamp_s, "ft_sensor_link"),
                    trust=TrustSample(level, phase, stamp_s))
    send(out.u_safe_radps)

Each period it: checks every input (a malformed one is a latched FAULT naming it, a stale or
missing one a stop), computes their ages from the stamps, maps trust to limit scales (STOP/HUMAN
latch), tares the F/T sensor at rest and turns its reading into a base-frame contact force,
linearizes the world model about the nominal command, solves the CBF-QP
(:class:`~robot_wm.core.safety.qp.SafetyFilter`) from the previous command, applies the latches of
:class:`~robot_wm.core.safety.supervisor.SafetySupervisor`, watches the soft-row slack, and
remembers the command it returns (the next period's acceleration box and controlled stop start
from it). It never raises from ``step``: an unexpected exception is a controlled stop and a
latched FAULT (traceback in the output once).
"""
from __future__ import annotations

import dataclasses
import math
import traceback
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from robot_wm.core.safety.config import STANDSTILL_TAU_S, ControllerConfig  # noqa: F401 (re-exported)
from robot_wm.core.safety.inputs import (
    MOVING_LEVELS,
    JointSample,
    NominalSample,
    TrustSample,
    WrenchSample,
    check_joint,
    check_nominal,
    check_stamp,
    check_wrench,
    parse_trust,
)
from robot_wm.core.safety.limits import Phase, SafetyLimits, ScaleFactors, TrustLevel
from robot_wm.core.safety.multirate import ModelSchedule
from robot_wm.core.safety.qp import SafetyFilter
from robot_wm.core.safety.supervisor import SafetySupervisor
from robot_wm.core.safety.types import (
    RUNNING_STATES,
    SLACK_FAMILIES,
    FaultKind,
    FilterInput,
    FilterOutput,
    FilterState,
    Latch,
    LinearizedModel,
)
from robot_wm.core.safety.validate import ParsedInput, Problem, as_scalar, check_model
from robot_wm.core.safety.wrench import ForceTare, PayloadAcceleration

#: The payload-inertia estimate's joint accelerations are clamped to this many times the filter's
#: acceleration limit (a drive that lags its command overshoots the box; a glitching sensor does not
#: get to make up more inertial force than that).
PAYLOAD_QDD_FACTOR = 2.0


# ---------------------------------------------------------------------------- inputs

class WorldModel(Protocol):
    """What the controller needs of a world model (``WorldModelRunner``)."""

    def linearize_with_std(self, q_rad, qdot_radps, u_radps) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...

    def commit(self, action_radps) -> None: ...


# ---------------------------------------------------------------------------- output
@dataclass(frozen=True)
class ControllerOutput(FilterOutput):
    """The command to send (``u_safe_radps``), the period's status, and what the controller saw.

    Attributes (beyond FilterOutput's):
        latches: names of the latches holding the arm (``Latch`` values).
        input_age_periods: age of the oldest control input (joint state, nominal, wrench).
        trust_level, phase: what the limits were scaled for this period.
        force_base_n: the contact force used (base frame, tared), or None.
        traceback: the traceback of an unexpected exception, the first time it occurs ("" else).
    """

    latches: tuple[str, ...] = ()
    input_age_periods: float = math.nan
    trust_level: int = TrustLevel.STOP
    phase: int = Phase.REAL
    force_base_n: np.ndarray | None = None
    traceback: str = ""


# ---------------------------------------------------------------------------- controller
class SafetyController:
    """The safety filter's control period: inputs in, one command and status out.

    Args:
        limits: safety limits (config/safety.yaml).
        kinematics: ``robot_wm.core.kinematics.Kinematics`` of the arm; its joint order is the
            order of every array.
        config: how inputs are treated (``ControllerConfig``).
        model: the world model runner (``linearize_with_std`` + ``commit``), or None (kinematic
            model; a FAULT every period with ``config.require_model``).
        latches: latches carried over from an earlier controller (lifecycle cleanup/configure).
    Raises:
        SafetyLimitsError / ValueError: limits or config invalid, or inconsistent with the URDF.
    """

    def __init__(self, limits: SafetyLimits, kinematics: Any, config: ControllerConfig, model: WorldModel | None = None,
                 *, latches: dict[Latch, str] | None = None) -> None:
        self.config = config
        self.kinematics = kinematics
        self.model = model
        self.filter = SafetyFilter(limits, kinematics, config.dt_s, require_model=config.require_model)
        self.n = self.filter.n
        self.supervisor = SafetySupervisor(latch_stale=config.latch_stale, latches=latches)
        if config.force_sensor and not kinematics.model.existFrame(config.ft_frame):
            raise ValueError(f"ft_frame {config.ft_frame!r} is not a frame of the URDF (force_sensor is true)")
        self.tare = ForceTare(max(1, round(config.tare_window_s / config.dt_s)), config.tare_max_bias_n,
                              config.tare_max_payload_kg, change_tolerance_n=config.tare_tolerance_n)
        self.payload_accel = (PayloadAcceleration(kinematics, config.ft_frame, config.payload_accel_tau_s, 3 * config.dt_s,
                                                  PAYLOAD_QDD_FACTOR * np.asarray(limits.acceleration_max_radps2))
                              if config.force_sensor and config.payload_accel_tau_s > 0 else None)
        m_dt = config.model_dt_s
        self.schedule = (ModelSchedule(m_dt, config.dt_s, self.filter.hw_velocity_radps, self.filter.joint_names)
                         if m_dt is not None and m_dt > config.dt_s * (1 + 1e-9) else None)
        # the policy runs at the model's step: its nominal ages in those periods, not the filter's
        self._nominal_period_s = config.dt_s if self.schedule is None else float(m_dt)
        self.last_command = np.zeros(self.n)  # what was sent last period: zero before the first
        self.qdot_smoothed: np.ndarray | None = None  # measured velocity low-passed for the standstill check
        self.last_output: ControllerOutput | None = None
        self._last_step_s: float | None = None
        self._slack_periods = 0
        # auto_enable releases the start latch of a fresh start only, never carried latches
        self._auto_enable_pending = bool(config.auto_enable) and not latches
        self._tracebacks_seen: set[tuple[str, str]] = set()
        self._noted: list[Problem] = []  # latching problems of messages checked on arrival
        self._last_trust: TrustSample | None = None
        self._scale_cache: dict[tuple, ScaleFactors] = {}

    # ------------------------------------------------------------------ status
    @property
    def limits(self) -> SafetyLimits:
        """The limits in force."""
        return self.filter.limits

    @property
    def state(self) -> FilterState:
        """State reported by the latest step (ESTOP while latched before the first)."""
        if self.last_output is None:
            return FilterState.ESTOP if self.supervisor.latched else FilterState.STOPPED
        return self.last_output.state

    def summary(self) -> dict[str, str]:
        """Key/value status for diagnostics (DiagnosticStatus.values)."""
        sup, last = self.supervisor, self.last_output
        out = {
            "state": self.state.name,
            "latches": sup.latch_text(),
            "fault_now": sup.fault_now.reason if sup.fault_now else "",
            "periods": str(sup.periods),
            "stop_events": str(sup.stop_events),
            "ft_tare": ("off (no F/T sensor)" if not self.config.force_sensor else
                        f"{self.tare.tare.payload_kg:.2f} kg payload, bias {np.round(self.tare.tare.bias_sensor_n, 2).tolist()} N"
                        if self.tare.ready else "not tared yet") + (f" ({self.tare.last_refusal})" if self.tare.last_refusal else ""),
        }
        if last is not None:
            out.update({
                "reason": last.reason,
                "trust": f"{TrustLevel(last.trust_level).name}/{Phase(last.phase).name}",
                "active_constraints": ",".join(last.active_constraints),
                "intervention_norm_radps": f"{last.intervention_norm:.4g}",
                "solver_status": last.solver_status_text,
                "solver_iterations": str(last.iterations),
                "solve_time_us": f"{last.solve_time_s * 1e6:.1f}",
                "max_slack": f"{last.max_slack:.3g}",
                "input_age_periods": f"{last.input_age_periods:.2f}",
            })
        for name, count in sorted(sup.constraint_counts.items()):
            out[f"active_periods:{name}"] = str(count)
        for name, count in sorted(sup.state_counts.items()):
            out[f"state_periods:{name}"] = str(count)
        return out

    # ------------------------------------------------------------------ operator
    def request_estop(self, reason: str = "") -> tuple[bool, str]:
        """Latch the e-stop: the command is zero from now on (the caller sends a zero at once).

        Returns:
            (True, message); a repeated request keeps the first reason.
        """
        text = str(reason).strip() or "e-stop requested (no reason given)"
        already = Latch.ESTOP in self.supervisor.latches
        self.supervisor.latch(Latch.ESTOP, text)
        self.last_command = np.zeros(self.n)
        if already:
            return True, f"e-stop already latched ({self.supervisor.latches[Latch.ESTOP]}); still latched"
        return True, f"e-stop latched: {text}"

    def reset(self) -> tuple[bool, str]:
        """An operator's reset: release every latch if this period's inputs allow it."""
        ok, message = self.supervisor.reset()
        if ok:
            self.filter.reset()
            self._slack_periods = 0
            self._auto_enable_pending = False  # from now on only an operator enables
        return ok, message

    def hold(self, reason: str) -> None:
        """Latch the start latch (lifecycle deactivate, shutdown: the caller sends a zero command).

        A reset is refused until a control period has checked the inputs again.
        """
        self.supervisor.latch(Latch.START, f"{reason}: waiting for operator enable (call /robot_wm/reset_estop)")
        self.supervisor.evaluated = False
        self.last_command = np.zeros(self.n)

    def request_tare(self) -> tuple[bool, str]:
        """An operator's re-tare: forget the tare; the next rest window while latched takes a new one.

        Only while a latch holds the arm (it must be at rest, and the operator says it is free).
        """
        if not self.config.force_sensor:
            return False, "tare refused: force_sensor is false (no F/T sensor)"
        if not self.supervisor.latched:
            return False, "tare refused: e-stop first (the arm must be held at rest, out of contact)"
        self.tare.forget()
        return True, (f"tare: the next {self.config.tare_window_s:g} s at rest take a new tare (plausibility "
                      "bounds only: make sure nothing touches the tool)")

    def note(self, sample: JointSample | NominalSample | WrenchSample | TrustSample) -> None:
        """Check one message as it arrives (between periods).

        The period uses only the newest sample of each input; a malformed message followed by a good
        one within the same period would otherwise never be seen. A malformed one is remembered and
        latched by the next period; a trust level STOP/HUMAN latches at once.
        """
        try:
            problem = None
            if isinstance(sample, JointSample):
                problem = check_joint(sample, self.n)[2]
            elif isinstance(sample, NominalSample):
                problem = check_nominal(sample, self.n)[1]
            elif isinstance(sample, WrenchSample):
                problem = check_wrench(sample, self.config.ft_frame)[1] if self.config.force_sensor else None
            elif isinstance(sample, TrustSample):
                level, _, problem = parse_trust(sample)
                if level is not None and level not in MOVING_LEVELS:
                    self.supervisor.latch(Latch.TRUST, f"trust level {level.name} (TrustState"
                                                       f"{': ' + sample.reason if sample.reason else ''})")
            if problem is not None and len(self._noted) < 10:
                self._noted.append(problem)
        except Exception as exc:  # noqa: BLE001 (a check must not raise into a subscription callback)
            self._noted.append(Problem(FaultKind.INTERNAL, f"{FaultKind.INTERNAL.text}: checking a message: "
                                                           f"{type(exc).__name__}"))

    def parameter_fault(self, reason: str) -> None:
        """Latch a FAULT for a malformed or out-of-range parameter value (the change was refused)."""
        self.supervisor.latch(Latch.FAULT, f"{FaultKind.PARAMETER.text}: {reason}")

    def set_limits(self, limits: SafetyLimits) -> bool:
        """Apply new limits in place (latches, previous command, tare and timing are kept).

        Returns:
            False when ``limits`` equal the ones in force (nothing changes), True when applied.
        Raises:
            SafetyLimitsError / ValueError: the limits cannot be used with this arm (nothing changes).
        """
        if limits == self.filter.limits:
            return False
        new = SafetyFilter(limits, self.kinematics, self.config.dt_s, require_model=self.config.require_model)
        new.carry_timing(self.filter)
        self.filter = new
        self._scale_cache.clear()
        return True

    # ------------------------------------------------------------------ the period
    def step(self, now_s: float, *, joint: JointSample | None, nominal: NominalSample | None,
             wrench: WrenchSample | None = None, trust: TrustSample | None = None) -> ControllerOutput:
        """Run one control period; the returned ``u_safe_radps`` is the command to send.

        Args:
            now_s: the time of this period on the same clock as the samples' stamps, s.
            joint, nominal, wrench, trust: the latest sample of each input, or None if none was
                ever received.
        Returns:
            The command and the period's status. Never raises.
        """
        try:
            out = self._step(float(now_s), joint, nominal, wrench, trust)
        except Exception as exc:  # noqa: BLE001 (the last gate must answer every period)
            out = self._internal_fault(exc)
        self._finish(out)
        return out

    def internal_fault(self, exc: BaseException) -> ControllerOutput:
        """A period that failed outside ``step`` (e.g. in the node's message conversion)."""
        out = self._internal_fault(exc)
        self._finish(out)
        return out

    def _finish(self, out: ControllerOutput) -> None:
        self.last_command = np.array(out.u_safe_radps, dtype=float)
        self.last_output = out
        if self.schedule is not None:
            self.schedule.sent(self.last_command)  # committed once per model step (the step's mean)
        elif self.model is not None:
            try:  # the world model conditions on the commands actually sent
                self.model.commit(self.last_command)
            except Exception as exc:  # noqa: BLE001 (a broken model latches; the command stands)
                self.supervisor.record_problem(Problem(FaultKind.MODEL, f"{FaultKind.MODEL.text}: commit failed: "
                                                                        f"{type(exc).__name__}: {exc}"))
        self.supervisor.count(out.state, out.active_constraints)
        # the start-up's trust latch (the default STOP before the monitor has spoken, or the monitor's
        # own start-up STOP) belongs to the start: reset() refuses until the level is a moving one
        if self._auto_enable_pending and set(self.supervisor.latches) <= {Latch.START, Latch.TRUST} \
                and Latch.START in self.supervisor.latches:
            if self.reset()[0]:
                self._auto_enable_pending = False

    def _internal_fault(self, exc: BaseException) -> ControllerOutput:
        try:
            where = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
            key = (type(exc).__name__, f"{where.filename}:{where.lineno}" if where else "")
            text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        except Exception:  # noqa: BLE001
            key, text = (type(exc).__name__, ""), f"{type(exc).__name__} (no traceback)"
        first = key not in self._tracebacks_seen
        self._tracebacks_seen.add(key)
        try:
            reason = f"{FaultKind.INTERNAL.text}: {type(exc).__name__}: {exc}"
        except Exception:  # noqa: BLE001 (an exception whose text cannot be made)
            reason = f"{FaultKind.INTERNAL.text}: {type(exc).__name__}"
        try:
            self.supervisor.record_problem(Problem(FaultKind.INTERNAL, reason))
            u = self.filter.controlled_stop(self.last_command)
        except Exception:  # noqa: BLE001 (a second failure: the one command that needs nothing)
            u = np.zeros(self.n)
        return ControllerOutput(u_safe_radps=u, state=FilterState.FAULT, reason=reason, fault_kind=FaultKind.INTERNAL,
                                intervention_norm=math.nan, latches=self.supervisor.latch_names(),
                                traceback=text if first else "")

    def _step(self, now: float, joint, nominal, wrench, trust) -> ControllerOutput:
        cfg, dt, n, sup = self.config, self.config.dt_s, self.n, self.supervisor
        elapsed = None if self._last_step_s is None else max(now - self._last_step_s, 0.0)
        self._last_step_s = now
        problems: list[Problem] = list(self._noted)  # malformed messages seen between periods
        self._noted.clear()
        ages: list[tuple[str, float]] = []

        def stamped(name: str, stamp_s, period_s: float = dt) -> None:
            problem = check_stamp(name, stamp_s, now, dt)
            if problem is None:
                ages.append((name, (now - float(stamp_s)) / period_s))  # in the periods it comes at
            else:
                problems.append(problem)

        q = qd = None
        if joint is None:
            problems.append(Problem(FaultKind.MISSING, "no joint state received yet (/joint_states)"))
        else:
            q, qd, problem = check_joint(joint, n)
            if problem is None:
                stamped("joint state", joint.stamp_s)
                self._smooth(qd)
            else:
                problems.append(problem)
        u_nom = None
        if nominal is not None:
            u_nom, problem = check_nominal(nominal, n)
            if problem is None:
                stamped("nominal command", nominal.stamp_s, self._nominal_period_s)
            else:
                problems.append(problem)
        level, phase = self._trust(now, trust, problems)
        force = self._force(now, wrench, q, qd, problems, stamped, joint) if cfg.force_sensor else None
        age_name, age = max(ages, key=lambda a: a[1]) if ages else ("", 0.0)
        age = max(age, 0.0)  # a stamp within one period ahead (clock skew) counts as fresh
        if age > self.limits.stale_limit_periods:
            problems.append(Problem(FaultKind.STALE, f"stale input: {age_name} {age:.3g} periods old > "
                                    f"stale_limit_periods {self.limits.stale_limit_periods}"))
        # the world model is checked every period, latched or not: a reset is refused while it is broken
        model, model_checked = self._linearize(now, q, qd, u_nom, problems) if q is not None else (None, False)
        problem = next((p for p in problems if p.kind.latches), problems[0] if problems else None)
        sup.record_problem(problem)
        extra = dict(latches=(), input_age_periods=age, trust_level=level, phase=phase, force_base_n=force)

        if sup.latched:
            return self._latched_output(elapsed, qd, u_nom, extra)
        if problem is not None:
            return self._stop_output(FilterState.FAULT, problem.reason, problem.kind, elapsed, qd, u_nom, extra)
        if u_nom is None:
            return self._stop_output(FilterState.STOPPING, "waiting for the nominal command", None, elapsed, qd, None,
                                     extra)
        s = self._scales(level, phase)
        if np.isfinite(self.last_command).all():  # every input checked above: the QP need not parse them again
            q_age = age if self.schedule is None else max(age, self.schedule.age_s(now) / dt)  # the model's, too
            out = self.filter.filter_checked(ParsedInput(q, qd, u_nom, self.last_command, model, force, s.speed,
                                                         s.acceleration, q_age, elapsed), model_checked)
        else:  # (never: the filter only commands finite values) let the filter's own checks name it
            out = self.filter.filter(FilterInput(
                q_rad=q, qdot_radps=qd, u_nominal_radps=u_nom, u_prev_radps=self.last_command, model=model,
                model_checked=model_checked, force_n=force, trust_scale=s.speed, accel_scale=s.acceleration,
                input_age_periods=age, elapsed_s=elapsed))
        if out.fault_kind is not None:
            sup.record_problem(Problem(out.fault_kind, out.reason))
            if sup.latched:
                out = dataclasses.replace(out, reason=f"{out.reason} (latched: reset to resume)")
        elif out.state == FilterState.STOPPING and self._at_standstill(out.u_safe_radps, qd):
            out = dataclasses.replace(out, state=FilterState.STOPPED)
        if out.state in RUNNING_STATES:
            out = self._watch_slack(out, elapsed, qd, u_nom, extra)
        fields = out.__dict__
        return ControllerOutput(**{name: fields[name] for name in _FILTER_FIELDS}, **dict(extra, latches=sup.latch_names()))

    # ------------------------------------------------------------------ pieces of the period
    def _linearize(self, now, q, qd, u_nom, problems: list[Problem]) -> tuple[LinearizedModel | None, bool | Problem]:
        """The world model's linearization about the nominal (zero before the first), or None; and
        whether it passed ``check_model`` at ``q`` (then the QP does not check it again), or the
        implausibility that makes the QP use the kinematic model."""
        if self.model is None:
            if self.config.require_model:
                problems.append(Problem(FaultKind.MODEL, f"{FaultKind.MODEL.text}: world model missing (require_model)"))
            return None, False
        u = u_nom if u_nom is not None else np.zeros(self.n)
        try:
            if self.schedule is not None:  # the model's step is longer: its newest linearization, aged to now
                if self.schedule.due(self.model, now):
                    self.schedule.renew(self.model, now, q, qd, u)
                checked = self.schedule.current(q, qd, u)  # checked when taken (multirate.ModelSchedule)
            else:
                lin = LinearizedModel(*self.model.linearize_with_std(q, qd, u))
                checked = check_model(lin, q, self.filter.hw_velocity_radps, self.config.dt_s, self.filter.joint_names)
        except Exception as exc:  # noqa: BLE001 (onnxruntime raises its own types)
            problems.append(Problem(FaultKind.MODEL, f"{FaultKind.MODEL.text}: linearization failed: "
                                                     f"{type(exc).__name__}: {exc}"))
            return None, False
        if isinstance(checked, Problem):
            if checked.kind == FaultKind.MODEL or self.config.require_model:
                problems.append(checked)
                return None, False
            # the QP replaces it by the kinematic model this period and says so
            return (lin, False) if self.schedule is None else (None, checked)
        return checked, True

    def _scales(self, level: TrustLevel, phase: Phase) -> ScaleFactors:
        """Speed and acceleration factors: the level's, and the tighter of the message's phase and the
        configured one (a TrustState can tighten the phase, never loosen it: SIM claimed on a real arm).

        Kept per (level, phase) for the limits in force (``set_limits`` forgets them): one lookup
        per period instead of two enum conversions and two ScaleFactors."""
        key = (int(level), int(phase))
        cached = self._scale_cache.get(key)
        if cached is None:
            lim = self.limits
            a, b = lim.scale_for(level, phase), lim.scale_for(level, self.config.default_phase)
            cached = ScaleFactors(float(min(a.speed, b.speed)), float(min(a.acceleration, b.acceleration)))
            self._scale_cache[key] = cached
        return cached

    def _trust(self, now: float, trust: TrustSample | None, problems: list[Problem]) -> tuple[TrustLevel, Phase]:
        """(level, phase) for this period; STOP/HUMAN latch; sets whether trust blocks a reset."""
        cfg, sup = self.config, self.supervisor
        trust = trust if trust is not None else self._last_trust  # a sample once seen is not forgotten
        if trust is None:
            level, phase = cfg.default_trust_level, cfg.default_phase
            source, problem = "the default trust level (no TrustState received yet)", None
        else:
            self._last_trust = trust
            level, phase, problem = parse_trust(trust)
            if problem is None:
                problem = check_stamp("trust state", trust.stamp_s, now, cfg.dt_s)
            if problem is not None:
                problems.append(problem)
                sup.trust_blocks_reset = "trust state malformed"
                return TrustLevel.STOP, Phase.REAL
            age_s = now - float(trust.stamp_s)
            if age_s > cfg.trust_timeout_s:
                problem = Problem(FaultKind.STALE, f"stale input: trust state {age_s:.3g} s old > trust_timeout_s "
                                  f"{cfg.trust_timeout_s:g}")
                problems.append(problem)
            source = f"TrustState{': ' + trust.reason if trust.reason else ''}"
        if level not in MOVING_LEVELS:
            sup.latch(Latch.TRUST, f"trust level {level.name} ({source})")
            sup.trust_blocks_reset = f"trust level is {level.name}: a moving level (FULL, CAUTIOUS, SLOW) must come first"
        elif problem is not None:
            sup.trust_blocks_reset = f"trust state stale ({problem.reason})"
        else:
            sup.trust_blocks_reset = ""
        return level, phase

    def _force(self, now: float, wrench: WrenchSample | None, q, qd, problems: list[Problem], stamped, joint=None):
        """The contact force in the base frame (tared), or None; problems are appended."""
        cfg = self.config
        if wrench is None:
            problems.append(Problem(FaultKind.MISSING, "no wrench received yet (force_sensor is true: the F/T "
                                                       "sensor is required)"))
            return None
        force_s, problem = check_wrench(wrench, cfg.ft_frame)
        if problem is not None:
            problems.append(problem)
            return None
        n_before = len(problems)
        stamped("wrench", wrench.stamp_s)
        if q is None or len(problems) > n_before:
            return None  # the joint state's (or the stamp's) own problem stops this period
        age = (now - float(wrench.stamp_s)) / cfg.dt_s
        rot = self.kinematics.frame_pose(q, cfg.ft_frame).rotation
        at_rest = (age <= self.limits.stale_limit_periods and self.supervisor.latched
                   and not self.last_command.any() and self._resting(qd))
        self.tare.observe(force_s, rot, at_rest)
        if not self.tare.ready:
            why = self.tare.last_refusal or f"the arm must rest {cfg.tare_window_s:g} s out of contact while latched"
            problems.append(Problem(FaultKind.MISSING, f"F/T sensor not tared yet: {why}"))
            return None
        contact = self.tare.tare.contact_force_base(force_s, rot)
        if self.payload_accel is not None:  # the payload's inertia reads as force while the arm moves
            stamp = as_scalar(joint.stamp_s) or 0.0  # checked with q this period (q is None otherwise)
            contact = contact + max(self.tare.tare.payload_kg, 0.0) * self.payload_accel.update(stamp, q, qd)
        return contact

    def _smooth(self, qd: np.ndarray) -> None:
        """Low-pass the measured velocity (first order, STANDSTILL_TAU_S) for the standstill check."""
        if self.qdot_smoothed is None:
            self.qdot_smoothed = np.array(qd, dtype=float)
            return
        alpha = self.config.dt_s / (STANDSTILL_TAU_S + self.config.dt_s)
        self.qdot_smoothed += alpha * (qd - self.qdot_smoothed)

    def _resting(self, qd) -> bool:
        """The arm is still: every joint's low-passed velocity below standstill_radps (and this
        period's sample below 5x that: one real jolt is never "rest")."""
        tol = self.config.standstill_radps
        return (qd is not None and self.qdot_smoothed is not None and bool((np.abs(self.qdot_smoothed) < tol).all())
                and bool((np.abs(qd) < 5.0 * tol).all()))

    def _at_standstill(self, u: np.ndarray, qd) -> bool:
        return (not np.asarray(u).any()) and self._resting(qd)

    def _latched_output(self, elapsed, qd, u_nom, extra) -> ControllerOutput:
        sup = self.supervisor
        if sup.holds_zero:
            u, state = np.zeros(self.n), FilterState.ESTOP
        else:
            u = self.filter.controlled_stop(self.last_command, elapsed)
            state = FilterState.STOPPED if self._at_standstill(u, qd) else FilterState.STOPPING
        reason = sup.latch_text()
        kind = None
        if sup.fault_now is not None:
            kind = sup.fault_now.kind
            reason += f"; input: {sup.fault_now.reason}"
            if state != FilterState.ESTOP:
                state = FilterState.FAULT
        elif Latch.FAULT in sup.latches or Latch.TRUST in sup.latches:
            reason += "; inputs healthy: reset to resume" if not sup.trust_blocks_reset else f"; {sup.trust_blocks_reset}"
        return ControllerOutput(u_safe_radps=u, state=state, reason=reason, fault_kind=kind,
                                intervention_norm=_norm(u, u_nom), **dict(extra, latches=sup.latch_names()))

    def _stop_output(self, state, reason, kind, elapsed, qd, u_nom, extra) -> ControllerOutput:
        u = self.filter.controlled_stop(self.last_command, elapsed)
        if state == FilterState.STOPPING and self._at_standstill(u, qd):
            state = FilterState.STOPPED
        if self.supervisor.latched:  # this period's fault latched
            reason = f"{reason} (latched: reset to resume)"
        return ControllerOutput(u_safe_radps=u, state=state, reason=reason, fault_kind=kind,
                                intervention_norm=_norm(u, u_nom), **dict(extra, latches=self.supervisor.latch_names()))

    def _watch_slack(self, out: FilterOutput, elapsed, qd, u_nom, extra) -> FilterOutput:
        """A soft constraint exceeded beyond its tolerance for longer than slack_time_s: latched FAULT."""
        over = [f"{fam} {out.slack.get(fam, 0.0):.3g} > {tol:g}"
                for fam, tol in zip(SLACK_FAMILIES, self.config.slack_tolerance) if out.slack.get(fam, 0.0) > tol]
        self._slack_periods = self._slack_periods + 1 if over else 0
        if self._slack_periods * self.config.dt_s <= self.config.slack_time_s:
            return out
        p = Problem(FaultKind.SLACK, f"{FaultKind.SLACK.text} for {self._slack_periods} periods "
                                     f"(> slack_time_s {self.config.slack_time_s:g}): {', '.join(over)}")
        self.supervisor.record_problem(p)
        stop = self._stop_output(FilterState.FAULT, p.reason, p.kind, elapsed, qd, u_nom, extra)
        return dataclasses.replace(stop, slack=out.slack, max_slack=out.max_slack)


_FILTER_FIELDS = tuple(f.name for f in dataclasses.fields(FilterOutput))


def _norm(u: np.ndarray, u_nom) -> float:
    return float(np.linalg.norm(u - u_nom)) if u_nom is not None else math.nan


__all__ = [
    "ControllerConfig", "ControllerOutput", "JointSample", "NominalSample", "SafetyController", "TrustSample",
    "WrenchSample",
]
