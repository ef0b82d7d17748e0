"""Human intervention: an operator takes over from the policy and jogs the arm, through the safety filter.

    hand = Intervention(rest_radps=0.02)
    ok, why = hand.take("tool caught on the fixture", t_s)     # the policy's slot now takes teleop
    teleop = Teleop(kin, speed_max_radps, deadman_s=0.2)
    teleop.joint_velocity(t_s, v)                              # or teleop.twist(t_s, linear, angular)
    nominal = teleop.command(t_s, q)                           # zero once no message came for deadman_s
    ok, why = hand.release("cleared", t_s, qdot)               # refused unless the arm is at rest

``Teleop`` turns the operator's joint velocities or tool twist (base frame: the tool origin's linear
velocity and the angular velocity, base axes) into a joint-velocity nominal: the twist through a
damped least-squares inverse of pinocchio's tool Jacobian, every joint clipped to ``speed_max``
(the filter's limits scaled for the level in force, so the filter guards rather than steers). The
nominal still goes to the safety filter, which is the final word on every limit. The deadman: no
teleop message for ``deadman_s`` -> zero. ``Intervention`` is who commands (policy or operator),
with the log of every take-over and release (reason, times) that goes into the data. numpy only.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

DEFAULT_DEADMAN_S = 0.2
DEFAULT_REST_RADPS = 0.02


class TeleopInputError(ValueError):
    """A teleop message that cannot be a command (wrong size, NaN, wrong frame); it is ignored."""


class Teleop:
    """The operator's jog command, with a deadman.

    Args:
        kin: ``robot_wm.core.kinematics.Kinematics`` of the arm (the twist's Jacobian).
        speed_max_radps: per-joint speed cap of the output (rad/s, positive).
        deadman_s: no message for this long -> zero.
        damping: DLS damping (m-ish); keeps joint speeds bounded near singularities.
    """

    def __init__(self, kin, speed_max_radps, deadman_s: float = DEFAULT_DEADMAN_S, damping: float = 0.05) -> None:
        cap = np.asarray(speed_max_radps, dtype=float)
        if cap.shape != (len(kin.joint_names),) or not np.all(np.isfinite(cap)) or np.any(cap < 0):
            raise ValueError(f"speed_max_radps={speed_max_radps!r}: expected {len(kin.joint_names)} speeds >= 0 (rad/s)")
        if not (math.isfinite(deadman_s) and deadman_s > 0):
            raise ValueError(f"deadman_s={deadman_s!r}: expected a positive duration (s)")
        self.kin, self.speed_max, self.deadman_s, self.damping = kin, cap, float(deadman_s), float(damping)
        self.n = len(kin.joint_names)
        self._last_t: float | None = None
        self._joint: np.ndarray | None = None
        self._twist: np.ndarray | None = None

    def set_speed_max(self, speed_max_radps) -> None:
        self.speed_max = np.asarray(speed_max_radps, dtype=float)

    def clear(self) -> None:
        """Forget every message (a take-over starts from zero, not from an old jog)."""
        self._last_t, self._joint, self._twist = None, None, None

    def joint_velocity(self, t_s: float, v_radps) -> None:
        """A joint-velocity jog (rad/s, joint order). Raises TeleopInputError (the command is unchanged)."""
        v = np.asarray(v_radps, dtype=float)
        if v.shape != (self.n,) or not np.all(np.isfinite(v)):
            raise TeleopInputError(f"teleop joint velocity {list(np.ravel(v))!r}: expected {self.n} finite values "
                                   f"(rad/s, order {list(self.kin.joint_names)})")
        self._joint, self._twist, self._last_t = v, None, float(t_s)

    def twist(self, t_s: float, linear_mps, angular_radps, frame_id: str = "", base_frame: str = "base_link") -> None:
        """A tool twist in the base frame. Raises TeleopInputError (the command is unchanged)."""
        if frame_id not in ("", base_frame):
            raise TeleopInputError(f"teleop twist in frame {frame_id!r}: expected the base frame {base_frame!r}")
        w = np.concatenate([np.asarray(linear_mps, dtype=float).ravel(), np.asarray(angular_radps, dtype=float).ravel()])
        if w.shape != (6,) or not np.all(np.isfinite(w)):
            raise TeleopInputError(f"teleop twist {w.tolist()!r}: expected 3 linear (m/s) + 3 angular (rad/s) finite values")
        self._twist, self._joint, self._last_t = w, None, float(t_s)

    def deadman(self, t_s: float) -> bool:
        """True when the deadman holds the command at zero (no message, or none for ``deadman_s``)."""
        return self._last_t is None or t_s - self._last_t > self.deadman_s

    def command(self, t_s: float, q_rad) -> np.ndarray:
        """The joint-velocity nominal now: zero under the deadman, else the jog clipped per joint."""
        if self.deadman(t_s):
            return np.zeros(self.n)
        if self._joint is not None:
            v = self._joint
        else:
            jac = self.kin.tool_jacobian(np.asarray(q_rad, dtype=float))
            v = jac.T @ np.linalg.solve(jac @ jac.T + self.damping ** 2 * np.eye(6), self._twist)
            peak = np.max(np.abs(v) / np.maximum(self.speed_max, 1e-12)) if np.any(v) else 0.0
            if peak > 1.0:  # keep the twist's direction: scale the whole vector, not joint by joint
                v = v / peak
        return np.clip(v, -self.speed_max, self.speed_max)


@dataclass
class InterventionRecord:
    """One take-over: why, when (node clock, s) and how it ended."""

    reason: str
    taken_s: float
    released_s: float | None = None
    release_reason: str = ""

    def to_json(self) -> dict:
        return {"reason": self.reason, "taken_s": self.taken_s, "released_s": self.released_s,
                "release_reason": self.release_reason,
                "duration_s": None if self.released_s is None else self.released_s - self.taken_s}


class Intervention:
    """Who commands the arm: the policy, or an operator (taken over).

    Args:
        rest_radps: a release needs every joint slower than this (rad/s).
    """

    def __init__(self, rest_radps: float = DEFAULT_REST_RADPS) -> None:
        if not (math.isfinite(rest_radps) and rest_radps > 0):
            raise ValueError(f"rest_radps={rest_radps!r}: expected a positive speed (rad/s)")
        self.rest_radps = float(rest_radps)
        self.records: list[InterventionRecord] = []

    @property
    def active(self) -> bool:
        return bool(self.records) and self.records[-1].released_s is None

    @property
    def current(self) -> InterventionRecord | None:
        return self.records[-1] if self.active else None

    def take(self, reason: str, t_s: float) -> tuple[bool, str]:
        if self.active:
            return False, f"already taken over (since {self.current.taken_s:.3f} s: {self.current.reason})"
        self.records.append(InterventionRecord(reason or "no reason given", float(t_s)))
        return True, f"operator in control: {self.records[-1].reason}"

    def release(self, reason: str, t_s: float, qdot_radps) -> tuple[bool, str]:
        """Hand back to the policy; refused unless taken over and at rest (``qdot_radps`` None: unknown)."""
        if not self.active:
            return False, "not taken over: the policy is in command"
        if qdot_radps is None:
            return False, "no fresh joint state: cannot tell that the arm is at rest"
        speed = float(np.max(np.abs(np.asarray(qdot_radps, dtype=float))))
        if not math.isfinite(speed) or speed > self.rest_radps:
            return False, (f"the arm is moving ({speed:.3g} rad/s > {self.rest_radps:g} rad/s at rest): "
                           "release only from rest (stop jogging and wait)")
        rec = self.records[-1]
        rec.released_s, rec.release_reason = float(t_s), reason or "no reason given"
        return True, f"handed back to the policy after {rec.released_s - rec.taken_s:.1f} s"


__all__ = ["DEFAULT_DEADMAN_S", "DEFAULT_REST_RADPS", "Intervention", "InterventionRecord", "Teleop",
           "TeleopInputError"]
