"""The policy's output stage: a per-period slew limit on the nominal command.

The safety filter keeps every command inside an acceleration box around the command it sent last,
``u_prev ± a_max · dt`` (``robot_wm.core.safety.barriers.accel_box``). A policy whose command jumps —
a new goal, a reference path starting, the residual's correction switching sign — would be cut
back by the filter for a few periods each time: the filter would be the controller. The slew
limit gives the policy slot the same rule, so that its nominal already lies in that box::

    slew = SlewLimiter(slew_delta(limits, dt_s, fraction, phase))
    u_nom = slew.limit(policy.act(obs), qdot_radps)   # within delta of the previous output, per joint

The base is the limiter's own previous output. It is re-anchored to the measured joint velocity
after ``reset`` and whenever the arm has not followed the commands (the previous output and the
measured velocity differ by more than ``REANCHOR_STEPS`` steps on a joint: the filter stopped the
arm, an e-stop, a push): a policy that kept ramping up while the arm was held would otherwise
start far outside the filter's box when it is released. Between the two, a drive that lags the
command by up to ``REANCHOR_STEPS`` periods at full acceleration keeps its ramp.
numpy only.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from robot_wm.core.safety.limits import TrustLevel

#: Fraction of the filter's acceleration box the policy slot uses (config/control.yaml
#: ``policy.command_slew_fraction``; the policy node's parameter default).
DEFAULT_SLEW_FRACTION = 0.95

#: The base is re-anchored to the measured velocity when it leads or trails it by more than this
#: many steps (delta) on any joint.
REANCHOR_STEPS = 5.0


class SlewLimiter:
    """Limit the change of a joint-velocity command per control period to ``delta_radps`` per joint.

    Args:
        delta_radps: the largest change per period, rad/s, one positive value per joint.
    Raises:
        ValueError: ``delta_radps`` is not a vector of positive finite numbers.
    """

    def __init__(self, delta_radps) -> None:
        delta = np.asarray(delta_radps, dtype=float)
        if delta.ndim != 1 or delta.size == 0 or not np.all(np.isfinite(delta)) or np.any(delta <= 0):
            raise ValueError(f"slew limit delta_radps={delta_radps!r}: expected a positive finite value per joint")
        self.delta_radps = delta
        self._base: np.ndarray | None = None
        #: periods in which the limit changed the command (an output-stage statistic)
        self.limited_count = 0

    def reset(self) -> None:
        """Forget the base: the next command is limited around the measured velocity."""
        self._base = None

    def limit(self, u_radps, qdot_radps, scale: float = 1.0) -> np.ndarray:
        """Return ``u`` moved into ``base ± scale · delta`` (per joint); (n,) or a batch (B, n).

        Args:
            u_radps: the policy's command.
            qdot_radps: the measured joint velocity (the base after a reset or a re-anchor).
            scale: factor on the limit (``trust_scales``: the filter's acceleration box shrinks at a
                reduced trust level).
        """
        u = np.asarray(u_radps, dtype=float)
        qdot = np.broadcast_to(np.asarray(qdot_radps, dtype=float), u.shape) if u.ndim else None
        if u.shape[-1:] != self.delta_radps.shape or qdot is None:
            raise ValueError(f"slew limit: command of shape {u.shape}, expected (..., {self.delta_radps.size})")
        base = self._base
        if base is None or base.shape != u.shape:
            base = qdot
        else:  # rows whose arm did not follow: from the measured velocity again
            lost = np.any(np.abs(base - qdot) > REANCHOR_STEPS * self.delta_radps, axis=-1, keepdims=True)
            base = np.where(lost, qdot, base)
        delta = self.delta_radps * float(scale)
        out = np.clip(u, base - delta, base + delta)
        if np.any(out != u):
            self.limited_count += 1
        self._base = out.copy()
        return out


def trust_scales(limits, level, phase, base_phase=None) -> tuple[float, float]:
    """(speed, acceleration) factors of the safety filter's limits at ``level`` relative to FULL, in
    ``phase``: what the policy slot scales its command and its slew limit by, so that at a reduced
    trust level the nominal respects the reduced limits itself instead of leaning on the filter
    (demo, nominal arm: 33 % of the moving periods filtered without it). At STOP and HUMAN the
    command is zero and the slew limit unscaled (the arm decelerates at the slew rate).

    ``base_phase``: the phase the slot's own limits are for (its slew box, ``slew_delta``; the
    filter's configured default phase). The filter applies the tighter of ``phase`` and it, and so
    do these factors; relative to FULL in ``base_phase``.
    """
    base = phase if base_phase is None else base_phase
    full = limits.scale_for(TrustLevel.FULL, base)
    a, b = limits.scale_for(level, phase), limits.scale_for(level, base)
    speed, accel = min(a.speed, b.speed), min(a.acceleration, b.acceleration)
    if speed == 0.0:
        return 0.0, 1.0
    return speed / full.speed, accel / full.acceleration


def slew_delta(limits, dt_s: float, fraction: float, phase=None) -> np.ndarray:
    """The slew limit per joint, rad/s per period: ``fraction`` of the safety filter's acceleration
    box at full trust in ``phase`` (``SafetyLimits.scale_for``; None: the phase-free limit).

    Raises:
        ValueError: ``fraction`` outside (0, 1] or ``dt_s`` not positive.
    """
    if not (np.isfinite(fraction) and 0.0 < fraction <= 1.0):
        raise ValueError(f"slew fraction {fraction!r}: expected a fraction in (0, 1]")
    if not (np.isfinite(dt_s) and dt_s > 0.0):
        raise ValueError(f"dt_s={dt_s!r}: expected a positive control period")
    scale = 1.0 if phase is None else limits.scale_for(TrustLevel.FULL, phase).acceleration
    return fraction * scale * np.asarray(limits.accel_max_radps2, dtype=float) * dt_s


def load_slew_fraction(path: Path | None = None) -> float:
    """``policy.command_slew_fraction`` of config/control.yaml (0 = off), as the policy node reads it.

    Raises:
        ValueError: unreadable file or a value outside [0, 1] (the message names both).
    """
    import yaml

    from robot_wm.paths import config_path

    path = Path(path) if path is not None else config_path("control.yaml")
    try:
        section = (yaml.safe_load(path.read_text()) or {}).get("policy", {}).get("ros__parameters", {})
    except (OSError, yaml.YAMLError, AttributeError) as exc:
        raise ValueError(f"{path}: cannot read policy.command_slew_fraction: {exc}") from exc
    value = section.get("command_slew_fraction", DEFAULT_SLEW_FRACTION)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{path}: policy.command_slew_fraction={value!r}: expected a fraction in [0, 1] (0 = off)")
    return float(value)


__all__ = ["DEFAULT_SLEW_FRACTION", "REANCHOR_STEPS", "SlewLimiter", "load_slew_fraction", "slew_delta", "trust_scales"]
