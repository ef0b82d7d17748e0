"""TrustTracker: pairs each world-model prediction with the joint state it predicted, adds the
efforts and the filter's verdict, and runs the ``TrustMonitor`` on the result. The node and the
library-mode runs (calibration, the detection benchmark) use this same object.

    tracker = TrustTracker(TrustMonitor(config, calibration), kinematics, dt_s=0.01)
    tracker.prediction(made_at_s, next_state, epistemic_std, aleatoric_std)  # for made_at + dt
    out = tracker.measurement(t_s, q, qdot, effort, intervened)              # one period's verdict

The filter's interventions count only while the level in force is FULL: under a reduced level the
filter is *meant* to cut the nominal down to the scaled limits, and counting that would hold the
level down by its own effect (a loop measured in library mode: SLOW made the filter act on 48 % of
the periods, which kept the intervention signal over its threshold for good). Below FULL the
intervention sample is 0, so the smoothed rate decays while the reduced level is in force.

``raw`` holds the last period's unsmoothed signals (what calibration quantiles after smoothing).
A prediction is used for the measurement whose stamp is within half a period of ``made_at + dt``;
without one the period has no prediction signals (the monitor's ``stale_s`` turns a lasting gap
into STOP). The response lag also needs the q̇ the prediction started from: the previous
measurement's, when its stamp is the prediction's ``made_at`` within half a period (else the
period adds nothing to it).

The hardware's command timeout: the world model predicts the arm's response to the command sent,
but a driver that has had no command for ``command_timeout_s`` brings the arm to rest by itself
(the embedded arm's simulator, a ros2_control driver, the command watchdog). Given that timeout and
when each command was sent (``command(t_s)``; the node reads it from the filter's SafetyStatus
stamps, published with each command), a period in which the hardware may have been on its
own (no command for longer than the timeout, up to two periods after the stream resumed) has no
prediction signals: a stall of the command stream is the filter's and the driver's to handle (they
stop the arm on it), not evidence against the model. ``unjudged`` counts such periods. Without a
timeout, or before the first command, every period is judged (library mode reports no commands).

A payload the operator declared by a tare (``set_payload``: the safety filter's F/T tare, which the
node hears on /robot_wm/payload) has the torques of its change from the calibration's tare taken off
the efforts before the effort model judges them (``effort.py``, "A declared payload").
numpy + the kinematics (pinocchio); no rclpy.
"""
from __future__ import annotations

import bisect
import math

import numpy as np

from robot_wm.core.safety.limits import TrustLevel
from robot_wm.core.trust.effort import EffortModel, EffortSignal, features
from robot_wm.core.trust.monitor import TrustMonitor, TrustOutput
from robot_wm.core.trust.signals import ResponseLag, Signal, period_signals

_PE, _DIS, _INT, _EFF, _LAG = (sig.value for sig in (Signal.PREDICTION_ERROR, Signal.DISAGREEMENT,
                                                     Signal.INTERVENTION, Signal.EFFORT, Signal.LAG))


class TrustTracker:
    """See the module docstring.

    Args:
        monitor: the level state machine with its calibration.
        kinematics: the arm's ``Kinematics`` (gravity torques for the effort signal).
        dt_s: the control period the predictions are made for.
        effort_model: the effort model; default: the calibration's (None: no effort signal).
        command_timeout_s: the hardware's command timeout (s; None: every period is judged).
    """

    SETTLE_PERIODS = 2  # periods after a command stream resumes that are still not judged

    def __init__(self, monitor: TrustMonitor, kinematics, dt_s: float, effort_model: EffortModel | None = None,
                 command_timeout_s: float | None = None) -> None:
        if not (math.isfinite(dt_s) and dt_s > 0):
            raise ValueError(f"dt_s={dt_s!r}: expected a positive control period (s)")
        if command_timeout_s is not None and not (math.isfinite(command_timeout_s) and command_timeout_s > 0):
            raise ValueError(f"command_timeout_s={command_timeout_s!r}: expected the hardware's command timeout "
                             "(s, > 0), or None to judge every period")
        self.command_timeout_s = None if command_timeout_s is None else float(command_timeout_s)
        self._commands: list[float] = []  # send stamps of the latest commands, in order
        self.unjudged = 0  # periods with a prediction not judged: the hardware's command timeout may have run
        self.monitor = monitor
        self.last_velocity_error: float | None = None  # of the latest measurement (None: no prediction for it)
        self.kin = kinematics
        self.dt_s = float(dt_s)
        cal_effort = monitor.calibration.effort_model
        self.effort_model = effort_model if effort_model is not None else (
            EffortModel.from_dict(cal_effort, len(kinematics.joint_names)) if cal_effort is not None else None)
        # the signal the model was calibrated with (its smoothing, clip and joint scales; the config's
        # effort_tau_s / effort_clip_z are what the next calibration uses)
        self.effort = EffortSignal(self.effort_model) if self.effort_model else None
        self.lag = ResponseLag(monitor.config.lag_tau_s)
        self._pending: list[tuple[float, list, list, list]] = []  # (for stamp, mean, epistemic, aleatoric std)
        self._prev: tuple[float, np.ndarray] | None = None  # (stamp, qdot) of the previous measurement
        self.raw: dict[str, float | None] = {}
        self.last_lag_sums: tuple[float, float, float] | None = None  # of the latest measurement (None: no lag)
        self._last_state: tuple | None = None  # (gravity, inertial, q̇, q̈) of the last measurement with efforts
        self.payload_kg: float | None = None  # the safety filter's latest tare (None: none given)
        self.payload_reference_kg: float | None = None  # the tare the effort regressors stand for (None: none)
        self.payload_delta_kg = 0.0  # payload_kg − payload_reference_kg: its torques are taken off the efforts
        self.payload_com_m = np.zeros(3)  # where that mass sits, in the tool frame (m)
        #: the efforts the effort signal judged in the last measurement (the declared payload's change taken off;
        #: None: none), what a calibration recorded from this tracker must fit
        self.last_effort_nm: np.ndarray | None = None

    #: A tare's mass carries the F/T sensor bias's component along gravity at the pose it was taken in
    #: (one pose cannot split them: real_twin's 1.3 N bias moves its 0.8 kg tare over 0.67-0.94 kg from pose
    #: to pose): a change smaller than this (kg) is not taken for a payload change. 0.5 kg is the safety
    #: filter's own line, tare_tolerance_n (5 N) / g: a smaller change it re-tares by itself.
    PAYLOAD_DEADBAND_KG = 0.5

    def set_payload(self, payload_kg: float, first_kg: float | None = None) -> float:
        """The safety filter's F/T tare: the payload now at the tool (kg). Returns the mass whose
        gravity and inertial torques (a point mass at ``payload_com_m`` in the tool frame) are taken
        off the measured efforts from now on: the payload less the one the effort model was fit with
        (its ``payload_kg``), or, for a model that does not record one, less ``first_kg`` (the first
        tare the caller heard: the arm as it was tared at start is taken for the calibration's), or
        nothing; within ``PAYLOAD_DEADBAND_KG`` of it, nothing.

        Raises:
            ValueError: a payload that is not a finite number.
        """
        kg = float(payload_kg)
        if not math.isfinite(kg):
            raise ValueError(f"payload_kg={payload_kg!r}: expected the tared payload in kg")
        recorded = None if self.effort_model is None else self.effort_model.payload_kg
        ref = recorded if recorded is not None else (kg if first_kg is None else float(first_kg))
        delta = kg - ref
        self.payload_kg, self.payload_reference_kg = kg, ref
        self.payload_delta_kg = delta if abs(delta) >= self.PAYLOAD_DEADBAND_KG else 0.0
        return self.payload_delta_kg

    @property
    def last_features(self) -> np.ndarray | None:
        """(N, F) effort regressors of the last measurement with efforts (None: none), for calibration."""
        return None if self._last_state is None else features(*self._last_state)

    def prediction(self, made_at_s: float, next_state: np.ndarray, epistemic_std: np.ndarray,
                   aleatoric_std: np.ndarray) -> None:
        """A prediction made from the state stamped ``made_at_s``, for one period later."""
        mean, epi, ale = (np.asarray(a, dtype=float) for a in (next_state, epistemic_std, aleatoric_std))
        # one finiteness check for the three: a sum of squares (one C call each; a NaN or an infinity makes
        # it not finite, and so does a value too large to square, as in measurement)
        if mean.ndim != 1 or mean.shape != epi.shape or mean.shape != ale.shape or not math.isfinite(
                float(mean @ mean) + float(epi @ epi) + float(ale @ ale)):
            return  # a malformed prediction is no prediction (the node reports it)
        self._pending.append((float(made_at_s) + self.dt_s, mean.tolist(), epi.tolist(), ale.tolist()))
        del self._pending[:-8]

    def command(self, t_s: float) -> None:
        """A command was sent to the hardware at ``t_s`` (the clock of the measurements' stamps)."""
        t = float(t_s)
        if not math.isfinite(t):
            return
        if self._commands and t < self._commands[-1]:
            bisect.insort(self._commands, t)
        else:
            self._commands.append(t)
        if len(self._commands) > 256:
            del self._commands[:-128]

    def hardware_on_its_own(self, t_s: float) -> bool:
        """Whether the hardware may have been on its command timeout at ``t_s`` (or had left it less
        than ``SETTLE_PERIODS`` before): no command for longer than ``command_timeout_s``."""
        arrivals, timeout = self._commands, self.command_timeout_s
        if timeout is None or not arrivals:
            return False
        i = bisect.bisect_right(arrivals, t_s)
        if i == 0:
            return False  # nothing known before t_s (start-up, or older than what is kept)
        if t_s - arrivals[i - 1] > timeout:
            return True
        settle = self.SETTLE_PERIODS * self.dt_s
        j = i - 1
        while j > 0 and arrivals[j] >= t_s - settle:
            if arrivals[j] - arrivals[j - 1] > timeout:  # this command ended a silence
                return True
            j -= 1
        return False

    def next_target_s(self) -> float | None:
        """The stamp the oldest pending prediction is for (None: none pending)."""
        return min((p[0] for p in self._pending), default=None)

    def drop_through(self, target_s: float) -> None:
        """Forget the pending predictions for stamps up to ``target_s``."""
        self._pending = [p for p in self._pending if p[0] > target_s]

    def _prediction_for(self, t_s: float):
        best = None
        for item in self._pending:
            if abs(item[0] - t_s) <= 0.5 * self.dt_s and (best is None or abs(item[0] - t_s) < abs(best[0] - t_s)):
                best = item
        self._pending = [p for p in self._pending if p[0] > t_s + 0.5 * self.dt_s]
        return best

    def measurement(self, t_s: float, q_rad: np.ndarray, qdot_radps: np.ndarray, effort_nm: np.ndarray | None,
                    intervened: bool | None) -> TrustOutput:
        """One period: the joint state measured at ``t_s``, the filter's verdict.

        ``effort_nm`` is the mean measured effort since the previous measurement (None: no
        efforts): with q̈ the velocity change over the same interval, the effort model compares
        the momentum balance of the whole interval, which does not depend on where in a command
        period the joint states happen to be sampled."""
        q, qd = np.asarray(q_rad, dtype=float), np.asarray(qdot_radps, dtype=float)
        finite = math.isfinite(float(q @ q) + float(qd @ qd))  # one check (an overflow counts as not finite)
        pred = self._prediction_for(t_s)
        pe = dis = eff = lag = None
        self.last_velocity_error: float | None = None  # RMS of predicted - measured qdot, rad/s (this period)
        self.last_lag_sums = None  # (Σ e·Δv̂, Σ Δv̂², dt) this period's response lag was updated with
        if pred is not None and finite and self.hardware_on_its_own(t_s):
            self.unjudged += 1
            pred = None
        if pred is not None and finite:
            target, mean, epi, ale = pred
            if len(mean) == len(q) + len(qd) and q.ndim == qd.ndim == 1:
                # the response lag needs the q̇ the prediction started from: the previous measurement's,
                # when that was the state it was made from (within half a period)
                prev = self._prev
                start = prev if prev is not None and abs(prev[0] - (target - self.dt_s)) <= 0.5 * self.dt_s else None
                pe, dis, self.last_velocity_error, cross, power = period_signals(
                    mean, epi, ale, q.tolist(), qd.tolist(), None if start is None else start[1].tolist())
                if start is not None:
                    self.last_lag_sums = (cross, power, t_s - start[0])
                    lag = self.lag.update(*self.last_lag_sums)
        if intervened is not None and self.monitor.level != TrustLevel.FULL:
            intervened = False
        self._last_state = self.last_effort_nm = None
        if effort_nm is not None and len(effort_nm) == len(qd) and self._prev is not None:
            t_prev, qd_prev = self._prev
            step = t_s - t_prev
            tau = np.array(effort_nm, dtype=float)  # a copy: last_effort_nm must not be the caller's buffer
            if 0.25 * self.dt_s <= step <= 4.0 * self.dt_s and finite and math.isfinite(float(tau @ tau)):
                qdd = (qd - qd_prev) / step
                self._last_state = (*self.kin.inverse_dynamics_nm(q, qd, qdd), qd, qdd)
                if self.payload_delta_kg:  # what the declared payload's change needs is not the model's business
                    g_p, i_p = self.kin.point_mass_torques_nm(q, qd, qdd, self.payload_delta_kg, com_m=self.payload_com_m)
                    tau = tau - g_p - i_p
                self.last_effort_nm = tau
                if self.effort is not None:
                    eff = self.effort.update_state(*self._last_state, tau, step)
        if finite:
            self._prev = (float(t_s), qd.copy())
        self.raw = {_PE: pe, _DIS: dis, _INT: None if intervened is None else float(bool(intervened)), _EFF: eff,
                    _LAG: lag}
        return self.monitor.step(t_s, prediction_error=pe, disagreement=dis, intervened=intervened, effort_error=eff,
                                 response_lag=lag)


__all__ = ["TrustTracker"]
