"""The effort signal: what the drives push against, compared with what normal operation needs.

Why a second model beside the world model: a velocity-controlled arm rejects a payload or a push
within a period or two, so its *motion* barely changes and the world model's one-step error does
not see them (library mode, real_twin, 2.5 kg: the median RMS z-score moves 0.256 → 0.256). The
drives' *effort* does: the joints that hold the load push harder at once. The measured effort
(``JointState.effort``) is compared with a per-joint linear model of normal operation::

    τ_j ≈ θ_j · [g_j(q), q̈_j, q̇_j, tanh(q̇_j / v_c), 1]

with g the gravity torques of the URDF's arm (pinocchio, ``Kinematics.gravity_torque_nm``), q̈ the
finite difference of the measured velocities, v_c a Coulomb smoothing velocity. The five
coefficients per joint are a least-squares fit on normal operation of the arm at hand (so a real
arm whose masses, friction or gravity compensation differ from the URDF is its own reference);
the residual is scaled by its standard deviation in the fit. ``EffortSignal`` smooths each joint's
*signed* z-score (an EWMA, ``effort_tau_s``) before taking the RMS over the joints: a load is a
bias of one sign on the joints that carry it, which the signed mean keeps while it averages the
noise away (real_twin, 2.5 kg, 50 ms: normal maximum 2.40 over 28 s, payload median 2.54 and the
normal maximum crossed 5 periods after the onset; the RMS of unsigned z-scores needed 7 periods
for a smaller margin). numpy + the kinematics.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: the per-joint regressors, in column order
FEATURES = ("gravity", "acceleration", "velocity", "coulomb", "bias")
#: velocity at which the Coulomb regressor tanh(q̇ / v_c) is 76 % on (rad/s)
COULOMB_VELOCITY_RADPS = 0.02
#: floor on a joint's residual std (N·m): a joint that never carries load must not divide by ~0
MIN_RESIDUAL_STD_NM = 0.05


class EffortModelError(ValueError):
    """An effort model cannot be fit or used; the message says which input or field."""


def features(gravity_nm: np.ndarray, qdot_radps: np.ndarray, qddot_radps2: np.ndarray) -> np.ndarray:
    """Regressors for one period, (N, len(FEATURES)): row j is joint j's."""
    g, v, a = (np.asarray(x, dtype=float) for x in (gravity_nm, qdot_radps, qddot_radps2))
    return np.stack([g, a, v, np.tanh(v / COULOMB_VELOCITY_RADPS), np.ones_like(g)], axis=-1)


@dataclass(frozen=True)
class EffortModel:
    """Per-joint coefficients (N, len(FEATURES)) and residual std (N,) of normal operation."""

    coefficients: np.ndarray
    residual_std_nm: np.ndarray

    @classmethod
    def fit(cls, feats: np.ndarray, effort_nm: np.ndarray) -> "EffortModel":
        """Least squares per joint on normal operation.

        Args:
            feats: (T, N, len(FEATURES)) regressors, one row per period.
            effort_nm: (T, N) measured efforts.
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
        return cls(coef, np.maximum(std, MIN_RESIDUAL_STD_NM))

    def z(self, feats: np.ndarray, effort_nm: np.ndarray) -> np.ndarray:
        """Per-joint residual z-scores for one period (feats (N, F), effort (N,))."""
        pred = np.einsum("jf,jf->j", self.coefficients, feats)
        return (np.asarray(effort_nm, dtype=float) - pred) / self.residual_std_nm

    def error(self, feats: np.ndarray, effort_nm: np.ndarray) -> float:
        """``effort_error``: the RMS over joints of the residual z-scores."""
        z = self.z(feats, effort_nm)
        return math.sqrt(float(np.mean(z * z)))

    def to_dict(self) -> dict:
        return {"features": list(FEATURES), "coulomb_velocity_radps": COULOMB_VELOCITY_RADPS,
                "coefficients": self.coefficients.tolist(), "residual_std_nm": self.residual_std_nm.tolist()}

    @classmethod
    def from_dict(cls, doc: object, n_joints: int | None = None) -> "EffortModel":
        """Read ``to_dict``'s output back; raise EffortModelError naming what is wrong."""
        if not isinstance(doc, dict) or doc.get("features") != list(FEATURES):
            raise EffortModelError(f"effort model: expected a mapping with features {list(FEATURES)}")
        if doc.get("coulomb_velocity_radps") != COULOMB_VELOCITY_RADPS:
            raise EffortModelError(f"effort model: made with coulomb_velocity_radps={doc.get('coulomb_velocity_radps')!r}, "
                                   f"this code uses {COULOMB_VELOCITY_RADPS}")
        try:
            coef = np.asarray(doc["coefficients"], dtype=float)
            std = np.asarray(doc["residual_std_nm"], dtype=float)
        except (KeyError, TypeError, ValueError) as exc:
            raise EffortModelError(f"effort model: coefficients / residual_std_nm unreadable: {exc}") from exc
        if coef.ndim != 2 or coef.shape[1] != len(FEATURES) or std.shape != (coef.shape[0],):
            raise EffortModelError(f"effort model: coefficients {coef.shape}, residual_std_nm {std.shape}: expected "
                                   f"(N, {len(FEATURES)}) and (N,)")
        if n_joints is not None and coef.shape[0] != n_joints:
            raise EffortModelError(f"effort model: made for {coef.shape[0]} joints, the arm has {n_joints}")
        if not (np.all(np.isfinite(coef)) and np.all(np.isfinite(std)) and np.all(std > 0)):
            raise EffortModelError("effort model: non-finite coefficients or a non-positive residual std")
        return cls(coef, std)


class EffortSignal:
    """``effort_error`` per period: the RMS over joints of each joint's EWMA of signed z-scores.

    Each z-score enters its EWMA clipped to ±``clip_z``: a command step on a real control path
    (jitter between the filter's timer and the drive's) makes torque transients that no model of
    the period's momentum balance follows (ROS path, nominal arm: single-period z-scores of 30-70 at
    goal changes), while a load is a bias of a few units that lasts; the clip keeps the one from
    looking like the other and leaves the other as it is.

    Args:
        model: the effort model of normal operation.
        tau_s: the per-joint EWMA time constant (s).
        clip_z: the clip on each joint's z-score.
    """

    def __init__(self, model: EffortModel, tau_s: float, clip_z: float = 4.0) -> None:
        if not (math.isfinite(tau_s) and tau_s > 0):
            raise EffortModelError(f"effort_tau_s={tau_s!r}: expected a positive time constant (s)")
        if not (math.isfinite(clip_z) and clip_z > 0):
            raise EffortModelError(f"effort_clip_z={clip_z!r}: expected a positive number")
        self.model, self.tau_s, self.clip_z = model, float(tau_s), float(clip_z)
        self._mean = np.zeros(model.coefficients.shape[0])
        # the regression's columns, contiguous, and 1 / std: ``update_state`` needs no feature matrix
        c = np.asarray(model.coefficients, dtype=float)
        self._cols = [np.ascontiguousarray(c[:, k]) for k in range(c.shape[1])]
        self._inv_std = 1.0 / np.asarray(model.residual_std_nm, dtype=float)
        self._alpha_cache: tuple[float, float] = (-1.0, 0.0)

    def update(self, feats: np.ndarray, effort_nm: np.ndarray, dt_s: float) -> float:
        """Add one period's efforts (``dt_s`` since the previous); return the smoothed RMS."""
        alpha = 1.0 - math.exp(-max(float(dt_s), 0.0) / self.tau_s)
        z = np.clip(self.model.z(feats, effort_nm), -self.clip_z, self.clip_z)
        self._mean += alpha * (z - self._mean)
        return math.sqrt(float(np.mean(self._mean * self._mean)))

    def update_state(self, gravity_nm: np.ndarray, qdot_radps: np.ndarray, qddot_radps2: np.ndarray,
                     effort_nm: np.ndarray, dt_s: float) -> float:
        """``update(features(g, q̇, q̈), effort, dt)`` without building the feature matrix (the
        monitor's per-period path: the same numbers, a third of the time)."""
        dt = max(float(dt_s), 0.0)
        if dt != self._alpha_cache[0]:
            self._alpha_cache = (dt, 1.0 - math.exp(-dt / self.tau_s))
        alpha = self._alpha_cache[1]
        cg, ca, cv, cc, cb = self._cols
        pred = cg * gravity_nm + ca * qddot_radps2 + cv * qdot_radps + cc * np.tanh(qdot_radps / COULOMB_VELOCITY_RADPS) + cb
        z = (effort_nm - pred) * self._inv_std
        np.clip(z, -self.clip_z, self.clip_z, out=z)
        m = self._mean
        m += alpha * (z - m)
        return math.sqrt(float(m @ m) / m.size)

    def reset(self) -> None:
        self._mean[:] = 0.0


__all__ = ["COULOMB_VELOCITY_RADPS", "FEATURES", "EffortModel", "EffortModelError", "EffortSignal", "features"]
