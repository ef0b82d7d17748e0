"""Exploration bounded by the world model's uncertainty (the MIXED phase's real episodes).

One rule for both places a policy explores on an arm: ``robot-wm train mixed --library`` (the
library loop, ``robot_wm.learning.mixed_episodes.ExploringPolicy``) and the policy node on a
running stack (its ``exploration_*`` parameters, set by ``robot-wm train mixed`` on the live graph).

* The noise is Ornstein-Uhlenbeck, temporally correlated over ``tau_s`` and of unit stationary
  variance (``OUNoise``); what is added to the command is ``scale * std * limit * noise``, clipped
  to the action limit.
* ``exploration_scale``: ``1`` while the world model's epistemic std of the next joint velocities
  (max over joints) is at or below ``low``, falling linearly to ``0`` at ``high`` and ``0`` above it
  or when it is not finite (no prediction: conservative, the deterministic policy alone); times the
  trust level's factor (FULL 1, CAUTIOUS 0.5, any lower level 0).

numpy only (no rclpy, no torch).
"""
from __future__ import annotations

import math

import numpy as np

from robot_wm.core.safety.limits import TrustLevel

TRUST_FACTORS = {TrustLevel.FULL: 1.0, TrustLevel.CAUTIOUS: 0.5}  # other levels: no exploration


def exploration_scale(uncertainty: float, low: float, high: float, level: TrustLevel = TrustLevel.FULL) -> float:
    """The exploration rule (module docstring): in [0, 1]."""
    u = float(uncertainty)
    if not math.isfinite(u) or u >= high:
        return 0.0
    scale = 1.0 if u <= low else (high - u) / (high - low)
    try:
        factor = TRUST_FACTORS.get(TrustLevel(level), 0.0)
    except ValueError:  # not a level: no exploration
        return 0.0
    return scale * factor


SETTING_NAMES = ("exploration_std", "exploration_tau_s", "uncertainty_low_radps", "uncertainty_high_radps")


def check_settings(std: float, tau_s: float, low: float, high: float, prefix: str = "",
                   names: tuple[str, str, str, str] = SETTING_NAMES) -> None:
    """Raise ValueError naming the setting (``prefix`` + its name in ``names``) that is out of range."""
    n = [prefix + x for x in names]
    if not (math.isfinite(std) and 0.0 <= std <= 1.0):
        raise ValueError(f"{n[0]}={std}: expected a fraction of the action limit in [0, 1]")
    if not (math.isfinite(tau_s) and tau_s > 0):
        raise ValueError(f"{n[1]}={tau_s}: expected > 0 s")
    if not (math.isfinite(low) and math.isfinite(high) and 0.0 <= low < high):
        raise ValueError(f"{n[2]}={low}, {n[3]}={high}: expected 0 <= low < high (rad/s)")


class OUNoise:
    """Unit-variance Ornstein-Uhlenbeck noise sampled every ``dt_s`` with correlation time ``tau_s``."""

    def __init__(self, n: int, dt_s: float, tau_s: float, seed: int) -> None:
        self.alpha = float(np.exp(-dt_s / tau_s))
        self.rng = np.random.default_rng(seed)
        self.value = np.zeros(int(n))

    def step(self) -> np.ndarray:
        self.value = self.alpha * self.value + math.sqrt(1.0 - self.alpha ** 2) * self.rng.standard_normal(self.value.shape[0])
        return self.value

    def reset(self) -> None:
        self.value = np.zeros_like(self.value)


def explore(action: np.ndarray, noise: np.ndarray, scale: float, std: float, limit: np.ndarray) -> np.ndarray:
    """``action`` plus ``scale * std * limit * noise``, clipped to ``±limit`` (unchanged when either is 0)."""
    if scale <= 0.0 or std <= 0.0:
        return action
    return np.clip(action + scale * std * limit * noise, -limit, limit)
