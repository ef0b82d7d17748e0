"""The effort signal: what the drives push against, compared with what normal operation needs.

Why a second model beside the world model: a velocity-controlled arm rejects a payload or a push
within a period or two, so its *motion* barely changes and the world model's one-step error does
not see them (library mode, real_twin, 2.5 kg: the median RMS z-score moves 0.256 → 0.256). The
drives' *effort* does: the joints that hold the load push harder at once. The measured effort
(``JointState.effort``) is compared with a per-joint linear model of normal operation::

    τ_j ≈ θ_j · [g_j(q), (M(q) q̈ + C(q, q̇) q̇)_j, q̈_j, q̇_j, tanh(q̇_j / v_c), 1]

with g and the coupled inertial torques M q̈ + C q̇ of the URDF's whole rigid-body model
(pinocchio's recursive Newton-Euler, ``Kinematics.inverse_dynamics_nm``), q̈ the finite difference
of the measured velocities (its own column: the drives' rotor inertia), v_c a Coulomb smoothing
velocity. The six coefficients per joint are a least-squares fit on normal operation of the arm at
hand (so a real arm whose masses, friction or gravity compensation differ from the URDF is its own
reference); the residual is scaled by its standard deviation in the fit. The coupled term matters:
with per-joint regressors alone a moving arm's inertial coupling was left in the residuals
(nominal arm, residual std of the elbow 1.33 → 0.18 N·m with it).

``EffortSignal`` smooths each joint's *signed*, clipped z-score (an EWMA): a load is a bias of one
sign on the joints that carry it, which the signed mean keeps while it averages the noise away.
The signal is the **largest** smoothed |bias| over the joints, each divided by its own scale: the
(1 − α) quantile of that joint's smoothed bias in normal operation (``joint_scale``, set by the
calibration), so every joint is judged against its own normal spread and a load on one or two
joints is not averaged away over six (library mode, nominal arm: 2.5 kg seen after 9 periods at
p90 instead of 36 with the RMS of unscaled biases, with fewer level drops in normal operation).
The smoothing and the clip the scales were made with are part of the model (``tau_s``,
``clip_z``): a model is always used with the signal it was calibrated for.

**A declared payload.** A payload the operator mounts and tares (the safety filter's F/T tare,
``robot-wm tare``) is no anomaly, but the model of normal operation does not know its mass: the
effort signal stays over its threshold and the arm at SLOW until a new calibration. So a model
records the tared payload its data stood for (``payload_kg``), and the tracker takes the torques of
the difference off the measured efforts (a point mass at the tool: its gravity and inertial
torques, ``Kinematics.point_mass_torques_nm``) before they are judged; the coefficients stay the
fit's (adding them to the regressors instead would scale them by the fitted gravity coefficients,
which absorb the arm's own unmodelled masses: real_twin's wrist_2 has 5.2). A payload that is
not tared (picked up while running) changes nothing here: it is still seen. numpy + the kinematics.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from robot_wm.core.trust.signals import EwmaWeight

#: the per-joint regressors, in column order
FEATURES = ("gravity", "inertial", "acceleration", "velocity", "coulomb", "bias")
#: velocity at which the Coulomb regressor tanh(q̇ / v_c) is 76 % on (rad/s)
COULOMB_VELOCITY_RADPS = 0.02
#: floor on a joint's residual std (N·m): a joint that never carries load must not divide by ~0
MIN_RESIDUAL_STD_NM = 0.05
#: floor on a joint's signal scale (its smoothed z-score's normal quantile)
MIN_JOINT_SCALE = 0.5


class EffortModelError(ValueError):
    """An effort model cannot be fit or used; the message says which input or field."""


#: the tares taken as plausible anywhere a payload is read (kg: the trust monitor's topic, bags, effort
#: models): a safety filter's tare refuses below -mass_tolerance and above tare_max_payload_kg (5 kg by
#: default); anything outside this is no tare of a wrist F/T sensor
PAYLOAD_RANGE_KG = (-1.0, 50.0)


def plausible_payload(value) -> bool:
    """Whether ``value`` is a tare's mass: a finite number (not a bool) within PAYLOAD_RANGE_KG."""
    try:
        kg = float(value)
    except (TypeError, ValueError):
        return False
    return not isinstance(value, bool) and PAYLOAD_RANGE_KG[0] <= kg <= PAYLOAD_RANGE_KG[1]


def _payload(what: str, value) -> float | None:
    """A recorded payload (kg) or None; EffortModelError naming it otherwise."""
    if value is None:
        return None
    if not plausible_payload(value):
        raise EffortModelError(f"{what}: payload_kg={value!r}: expected the tared payload in kg "
                               f"({PAYLOAD_RANGE_KG[0]:g}..{PAYLOAD_RANGE_KG[1]:g}) or null")
    return float(value)


def features(gravity_nm: np.ndarray, inertial_nm: np.ndarray, qdot_radps: np.ndarray,
             qddot_radps2: np.ndarray) -> np.ndarray:
    """Regressors for one period, (N, len(FEATURES)): row j is joint j's."""
    g, m, v, a = (np.asarray(x, dtype=float) for x in (gravity_nm, inertial_nm, qdot_radps, qddot_radps2))
    return np.stack([g, m, a, v, np.tanh(v / COULOMB_VELOCITY_RADPS), np.ones_like(g)], axis=-1)


@dataclass(frozen=True)
class EffortModel:
    """Per-joint coefficients (N, len(FEATURES)) and residual std (N,) of normal operation, and the
    signal it is judged by: the EWMA time constant ``tau_s`` and clip ``clip_z`` of the z-scores,
    and each joint's ``joint_scale`` (see the module docstring; ``calibrated`` sets it)."""

    coefficients: np.ndarray
    residual_std_nm: np.ndarray
    tau_s: float = 0.03
    clip_z: float = 8.0
    joint_scale: np.ndarray | None = None  # None: 1 for every joint (before calibration)
    #: the F/T tare's payload (kg) the data of the fit stood for (None: not recorded); the torques of a
    #: later tare's difference are taken off the efforts judged (``TrustTracker.set_payload``)
    payload_kg: float | None = None

    @classmethod
    def fit(cls, feats: np.ndarray, effort_nm: np.ndarray, tau_s: float = 0.03, clip_z: float = 8.0,
            payload_kg: float | None = None) -> "EffortModel":
        """Least squares per joint on normal operation (joint scales 1: see ``calibrated``).

        Args:
            feats: (T, N, len(FEATURES)) regressors, one row per period.
            effort_nm: (T, N) measured efforts.
            tau_s, clip_z: the signal's smoothing and clip (``EffortSignal``).
            payload_kg: the tared payload the regressors stood for (None: not known).
        Raises:
            EffortModelError: shapes disagree, values are not finite, or too few periods (< 50).
        """
        f, tau = np.asarray(feats, dtype=float), np.asarray(effort_nm, dtype=float)
        if f.ndim != 3 or f.shape[2] != len(FEATURES) or tau.shape != f.shape[:2]:
            raise EffortModelError(f"effort fit: features {f.shape} and efforts {tau.shape}: expected (T, N, "
                                   f"{len(FEATURES)}) and (T, N)")
        if f.shape[0] < 50:
            raise EffortModelError(f"effort fit: {f.shape[0]} periods of normal operation, need at least 50")
        if not (np.all(np.isfinite(f)) and np.all(np.isfinite(tau))):
            raise EffortModelError("effort fit: non-finite features or efforts in the normal-operation data")
        coef = np.zeros((f.shape[1], len(FEATURES)))
        std = np.zeros(f.shape[1])
        for j in range(f.shape[1]):
            coef[j] = np.linalg.lstsq(f[:, j], tau[:, j], rcond=None)[0]
            std[j] = float(np.std(tau[:, j] - f[:, j] @ coef[j]))
        return cls(coef, np.maximum(std, MIN_RESIDUAL_STD_NM), float(tau_s), float(clip_z),
                   payload_kg=_payload("effort fit", payload_kg))

    def calibrated(self, feats: np.ndarray, effort_nm: np.ndarray, dt_s: float, exceedance: float) -> "EffortModel":
        """This model with each joint's scale: the (1 − ``exceedance``) quantile of the joint's
        smoothed |z| over the periods given (normal operation, in order), floored at MIN_JOINT_SCALE."""
        signal = EffortSignal(self)
        biases = np.array([signal.update(f, e, dt_s, per_joint=True).copy() for f, e in zip(feats, effort_nm)])
        if biases.shape[0] < 50:
            raise EffortModelError(f"effort scales: {biases.shape[0]} periods of normal operation, need at least 50")
        scale = np.maximum(np.quantile(np.abs(biases), 1.0 - exceedance, axis=0), MIN_JOINT_SCALE)
        return EffortModel(self.coefficients, self.residual_std_nm, self.tau_s, self.clip_z, scale, self.payload_kg)

    def z(self, feats: np.ndarray, effort_nm: np.ndarray) -> np.ndarray:
        """Per-joint residual z-scores for one period (feats (N, F), effort (N,))."""
        pred = np.einsum("jf,jf->j", self.coefficients, feats)
        return (np.asarray(effort_nm, dtype=float) - pred) / self.residual_std_nm

    def to_dict(self) -> dict:
        scale = np.ones(len(self.residual_std_nm)) if self.joint_scale is None else self.joint_scale
        return {"features": list(FEATURES), "coulomb_velocity_radps": COULOMB_VELOCITY_RADPS,
                "coefficients": self.coefficients.tolist(), "residual_std_nm": self.residual_std_nm.tolist(),
                "tau_s": self.tau_s, "clip_z": self.clip_z, "joint_scale": np.asarray(scale, dtype=float).tolist(),
                "payload_kg": self.payload_kg}

    @classmethod
    def from_dict(cls, doc: object, n_joints: int | None = None) -> "EffortModel":
        """Read ``to_dict``'s output back; raise EffortModelError naming what is wrong."""
        if not isinstance(doc, dict) or doc.get("features") != list(FEATURES):
            got = doc.get("features") if isinstance(doc, dict) else None
            raise EffortModelError(f"effort model: made with features {got}, this code uses {list(FEATURES)}: "
                                   f"run `robot-wm trust calibrate` again")
        if doc.get("coulomb_velocity_radps") != COULOMB_VELOCITY_RADPS:
            raise EffortModelError(f"effort model: made with coulomb_velocity_radps={doc.get('coulomb_velocity_radps')!r}, "
                                   f"this code uses {COULOMB_VELOCITY_RADPS}")
        try:
            coef = np.asarray(doc["coefficients"], dtype=float)
            std = np.asarray(doc["residual_std_nm"], dtype=float)
            scale = np.asarray(doc["joint_scale"], dtype=float)
            tau_s, clip_z = float(doc["tau_s"]), float(doc["clip_z"])
        except (KeyError, TypeError, ValueError) as exc:
            raise EffortModelError(f"effort model: coefficients / residual_std_nm / joint_scale / tau_s / clip_z "
                                   f"unreadable: {exc!r}") from exc
        if coef.ndim != 2 or coef.shape[1] != len(FEATURES) or std.shape != (coef.shape[0],) or scale.shape != std.shape:
            raise EffortModelError(f"effort model: coefficients {coef.shape}, residual_std_nm {std.shape}, joint_scale "
                                   f"{scale.shape}: expected (N, {len(FEATURES)}), (N,) and (N,)")
        if n_joints is not None and coef.shape[0] != n_joints:
            raise EffortModelError(f"effort model: made for {coef.shape[0]} joints, the arm has {n_joints}")
        if not (np.all(np.isfinite(coef)) and np.all(np.isfinite(std)) and np.all(std > 0)):
            raise EffortModelError("effort model: non-finite coefficients or a non-positive residual std")
        if not (np.all(np.isfinite(scale)) and np.all(scale > 0)):
            raise EffortModelError(f"effort model: joint_scale {scale.tolist()}: expected positive numbers")
        if not (math.isfinite(tau_s) and tau_s > 0 and math.isfinite(clip_z) and clip_z > 0):
            raise EffortModelError(f"effort model: tau_s={tau_s!r}, clip_z={clip_z!r}: expected positive numbers")
        return cls(coef, std, tau_s, clip_z, scale, _payload("effort model", doc.get("payload_kg")))


class EffortSignal:
    """``effort_error`` per period: the largest over the joints of each joint's EWMA of signed,
    clipped z-scores over its scale (the model's ``tau_s``, ``clip_z``, ``joint_scale``).

    Each z-score enters its EWMA clipped to ±``clip_z``: a command step on a real control path
    (jitter between the filter's timer and the drive's) makes torque transients that no model of
    the period's momentum balance follows (ROS path, nominal arm: single-period z-scores of 30-70 at
    goal changes), while a load is a bias that lasts; the clip keeps the one from looking like the
    other and leaves the other as it is.
    """

    def __init__(self, model: EffortModel) -> None:
        if not (math.isfinite(model.tau_s) and model.tau_s > 0):
            raise EffortModelError(f"effort tau_s={model.tau_s!r}: expected a positive time constant (s)")
        if not (math.isfinite(model.clip_z) and model.clip_z > 0):
            raise EffortModelError(f"effort clip_z={model.clip_z!r}: expected a positive number")
        self.model, self.tau_s, self.clip_z = model, float(model.tau_s), float(model.clip_z)
        n = model.coefficients.shape[0]
        # per joint as Python floats: six joints are too few for numpy, whose per-call overhead was
        # two thirds of this signal's time (9.6 µs a period with arrays, 3.1 µs with this loop)
        scale = np.ones(n) if model.joint_scale is None else np.asarray(model.joint_scale, dtype=float)
        self._joints = tuple(zip(np.asarray(model.coefficients, dtype=float).tolist(),
                                 (1.0 / np.asarray(model.residual_std_nm, dtype=float)).tolist(),
                                 (1.0 / scale).tolist()))
        self._mean = [0.0] * n
        self._alpha = EwmaWeight(self.tau_s)

    def _add(self, z: list[float], dt_s: float) -> float:
        alpha, clip, m, worst = self._alpha(dt_s), self.clip_z, self._mean, 0.0
        for j, (zj, (_, _, inv_scale)) in enumerate(zip(z, self._joints)):
            zj = clip if zj > clip else (-clip if zj < -clip else zj)
            mj = m[j] = m[j] + alpha * (zj - m[j])
            r = abs(mj) * inv_scale
            if r > worst:
                worst = r
        return worst

    def update(self, feats: np.ndarray, effort_nm: np.ndarray, dt_s: float, per_joint: bool = False):
        """Add one period's efforts (``dt_s`` since the previous); return the signal (``per_joint``:
        the joints' smoothed z-scores instead, unscaled)."""
        value = self._add(self.model.z(feats, effort_nm).tolist(), dt_s)
        return np.array(self._mean) if per_joint else value

    def update_state(self, gravity_nm: np.ndarray, inertial_nm: np.ndarray, qdot_radps: np.ndarray,
                     qddot_radps2: np.ndarray, effort_nm: np.ndarray, dt_s: float) -> float:
        """``update(features(g, Mq̈ + Cq̇, q̇, q̈), effort, dt)`` without building the feature matrix
        (the monitor's per-period path: the same arithmetic, a third of the time)."""
        tanh, vc = math.tanh, COULOMB_VELOCITY_RADPS
        z = [(e - (c[0] * g + c[1] * m + c[2] * a + c[3] * v + c[4] * tanh(v / vc) + c[5])) * inv_std
             for (c, inv_std, _), g, m, v, a, e in zip(self._joints, gravity_nm.tolist(), inertial_nm.tolist(),
                                                       qdot_radps.tolist(), qddot_radps2.tolist(), effort_nm.tolist())]
        return self._add(z, dt_s)

    def reset(self) -> None:
        self._mean = [0.0] * len(self._mean)


__all__ = ["COULOMB_VELOCITY_RADPS", "FEATURES", "MIN_JOINT_SCALE", "EffortModel", "EffortModelError", "EffortSignal", "features"]
