"""The world model at its own step, the safety filter at a shorter period (10 ms model, 2 ms filter).

The shipped world model predicts one 10 ms step; the arm's joint states come at 500 Hz, and the
last gate should run at that rate. Linearizing the ensemble every 2 ms would cost most of a core,
and the model was never trained on 2 ms steps. So the filter linearizes once per model step (the
newest linearization, about the newest nominal) and uses it *aged* in the periods in between:

- **rebased on the state measured now**: the model's velocity change over its step, from where the
  arm was at the linearization, becomes the change over the filter's period from where the arm is
  now: the share a first-order drive makes in the shorter period (``step_share``: with ``β`` the
  share of a command step the model's drive follows within its step, ``(1 − (1 − β)^r) / β`` of
  the step's change, ``r = dt / model_dt``; ``r`` itself for a slow drive). The position follows
  by the trapezoid over the period;
- **shifted to the newest nominal**: ``f0`` moves by ``B (u_nom − u_lin)`` (exact within the
  linearization), so the QP's ``x⁺ ≈ f0 + B (u − u_nom)`` holds with the nominal it is given;
- **its uncertainty**: the std the model gives for its whole step, not scaled down to the period
  (the safe side: the linearization is up to a step old, and the QP tightens the position rows by
  κ σ_q);
- **its age counts**: the time since the linearization is an input age (the larger of it and the
  inputs' ages), which the braking rows coast through before they brake
  (``qp.SafetyFilter._set_timing``).
- **checked when taken**: ``check_model`` at the model's step against the state it was taken at;
  a broken one is a MODEL fault until the next step, an implausible one (without
  ``require_model``) gives the kinematic model until the next step. The aged one is a function of
  it and of this period's checked inputs and is not judged again (an absurd nominal or a velocity
  glitch must not be blamed on the model).

The model is told one command per model step, the mean of the commands sent over it: under a
zero-order hold for the model's step that mean moves the arm as far as the commands did.

``ModelSchedule`` is used by ``SafetyController`` only when the filter's period is shorter than the
model's step; at equal periods the controller linearizes every period as before.
"""
from __future__ import annotations

import numpy as np

from robot_wm.core.safety.types import FaultKind, LinearizedModel
from robot_wm.core.safety.validate import Problem, check_model

#: A linearization is renewed once it is this close (in filter periods) to a model step old: with
#: 2 ms periods against a 10 ms step, every fifth period even when a period comes a little early.
RENEW_SLACK_PERIODS = 0.5


def step_share(beta: np.ndarray, ratio: float) -> np.ndarray:
    """The share of a model step's velocity change that a period of ``ratio`` of it makes.

    ``beta``: per joint, the share of a command step the drive follows within the model's step (the
    diagonal of dq̇⁺/du). A first-order drive closes ``1 − (1 − β)^ratio`` of its error in the
    shorter period: that over ``β`` is the factor on the model step's change (``ratio`` as β → 0,
    1 for a drive that follows at once).
    """
    b = np.clip(beta, 1e-6, 1.0 - 1e-9)
    return -np.expm1(ratio * np.log1p(-b)) / b


class _Aging:
    """What aging needs of one linearization, computed once per model step (not every period)."""

    __slots__ = ("n", "base", "beta", "k", "bqd", "u_lin", "B", "sigma", "half")

    def __init__(self, lin: LinearizedModel, qd_lin: np.ndarray, u_lin: np.ndarray, dt_s: float, model_dt_s: float):
        n = self.n = len(qd_lin)
        self.bqd = lin.B[n:]
        self.beta = np.clip(np.diagonal(self.bqd), 0.0, 1.0)
        self.k = step_share(self.beta, dt_s / model_dt_s)
        # the velocity change at u_lin from q̇_lin, rebased: + β q̇_lin here, − β q̇ in each period
        self.base = lin.f0[n:] - qd_lin + self.beta * qd_lin
        self.u_lin = u_lin
        self.half = 0.5 * dt_s
        bqd_aged = self.k[:, None] * self.bqd
        self.B = np.vstack([self.half * bqd_aged, bqd_aged])
        self.sigma = lin.sigma  # the model's own, for its whole step (never written to)

    def at(self, q: np.ndarray, qd: np.ndarray, u_nom: np.ndarray) -> LinearizedModel:
        change = self.base + self.bqd @ (u_nom - self.u_lin) - self.beta * qd
        qd_next = qd + self.k * change
        return LinearizedModel(np.concatenate([q + self.half * (qd + qd_next), qd_next]), self.B, self.sigma)


def age_linearization(lin: LinearizedModel, q_lin: np.ndarray, qd_lin: np.ndarray, u_lin: np.ndarray,
                      q: np.ndarray, qd: np.ndarray, u_nom: np.ndarray, dt_s: float, model_dt_s: float) -> LinearizedModel:
    """A model step's linearization as one of the filter's periods from the state measured now.

    Args:
        lin: the model's linearization (f0, B, sigma) for its own step, taken at (q_lin, qd_lin)
            about the command u_lin.
        q, qd, u_nom: this period's measured state and nominal.
        dt_s, model_dt_s: the filter's period and the model's step (dt_s <= model_dt_s).
    Returns:
        The velocity: ``q̇ + k (f0_q̇ + B_q̇ (u_nom − u_lin) − q̇_lin − β (q̇ − q̇_lin))`` with the slope
        ``k B_q̇``, ``β`` the diagonal of ``B_q̇`` (the model's velocity change rebased on the velocity
        now, for a drive that follows its command) and ``k`` per joint from ``step_share``; the
        position by the trapezoid over the period from q̇ to the predicted q̇⁺; the std as the model
        gives it for its whole step. (``q_lin`` is not needed: the position follows the velocity.)
    """
    return _Aging(lin, np.asarray(qd_lin, dtype=float), np.asarray(u_lin, dtype=float), dt_s, model_dt_s).at(q, qd, u_nom)


class ModelSchedule:
    """One linearization per model step, aged in every filter period; one commit per model step.

    Args:
        model_dt_s: the world model's step, s.
        dt_s: the filter's period, s (shorter than the model's step).
        hw_velocity_radps, joint_names: for ``check_model`` of each new linearization (at the
            model's step, against the state it was taken at).
    """

    def __init__(self, model_dt_s: float, dt_s: float, hw_velocity_radps: np.ndarray, joint_names: tuple[str, ...]):
        if not 0.0 < dt_s < model_dt_s:
            raise ValueError(f"ModelSchedule: the filter's period {dt_s!r} s must be shorter than the model's step "
                             f"{model_dt_s!r} s")
        self.model_dt_s, self.dt_s = float(model_dt_s), float(dt_s)
        self._hw, self._names = hw_velocity_radps, joint_names
        self._model = None  # the model the cache belongs to (a swapped model starts a new step)
        self._taken_s: float | None = None
        self._aging: _Aging | None = None  # the newest good linearization, ready to age
        self._problem: Problem | None = None  # what check_model found wrong with it
        self._sent: np.ndarray | None = None  # sum of the commands sent since the model's last step
        self._count = 0
        self.linearizations = 0

    def age_s(self, now_s: float) -> float:
        """Time since the linearization in use was taken (0 before the first)."""
        return 0.0 if self._taken_s is None else max(now_s - self._taken_s, 0.0)

    def due(self, model, now_s: float) -> bool:
        """Whether this period takes a new linearization: a model step on (less half a period), a
        swapped model, or a clock that went back. A failed one is retried a model step later, not
        every period (the arm is stopping then, and the model's history keeps its step)."""
        return (model is not self._model or self._taken_s is None
                or now_s - self._taken_s >= self.model_dt_s - RENEW_SLACK_PERIODS * self.dt_s
                or now_s < self._taken_s)

    def renew(self, model, now_s: float, q: np.ndarray, qd: np.ndarray, u: np.ndarray) -> None:
        """Tell the model the mean command of the step that ended, and linearize it at (q, qd, u).

        Raises what the model raises (the controller turns it into a MODEL fault); until the next
        model step the schedule then has no linearization and says so (``current``).
        """
        if model is not self._model:
            self._model, self._sent, self._count = model, None, 0
        self._taken_s, self._aging = now_s, None
        self._problem = Problem(FaultKind.MODEL, f"{FaultKind.MODEL.text}: no linearization this model step "
                                                 "(the last one failed)")
        if self._count:
            mean, self._sent, self._count = self._sent / self._count, None, 0
            model.commit(mean)
        lin = LinearizedModel(*model.linearize_with_std(q, qd, u))
        self.linearizations += 1
        checked = check_model(lin, q, self._hw, self.model_dt_s, self._names)
        if isinstance(checked, Problem):  # broken, or implausible here: nothing of it is aged or used
            self._problem = checked
            return
        self._problem = None
        self._aging = _Aging(checked, np.array(qd, dtype=float), np.array(u, dtype=float), self.dt_s, self.model_dt_s)

    def current(self, q: np.ndarray, qd: np.ndarray, u_nom: np.ndarray) -> LinearizedModel | Problem:
        """This period's model: the newest linearization aged to now, or what is wrong with it."""
        return self._problem if self._aging is None else self._aging.at(q, qd, u_nom)

    def sent(self, command: np.ndarray) -> None:
        """Record the command sent this period (committed as part of the model step's mean)."""
        c = np.asarray(command, dtype=float)
        self._sent = c.copy() if self._sent is None else self._sent + c
        self._count += 1


__all__ = ["RENEW_SLACK_PERIODS", "ModelSchedule", "age_linearization", "step_share"]
