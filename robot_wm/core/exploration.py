"""Exploration bounded by the world model's uncertainty (the MIXED phase's real episodes).

One rule for both places a policy explores on an arm: ``robot-wm train mixed --library`` (the
library loop, ``robot_wm.learning.mixed_episodes.ExploringPolicy``) and the policy node on a
running stack (its ``exploration_*`` parameters, set by ``robot-wm train mixed`` on the live graph).

* The noise is Ornstein-Uhlenbeck, temporally correlated over ``tau_s`` and of unit stationary
  variance (``OUNoise``); what is added to the command is ``scale * std * limit * noise``, clipped
  to ``±limit``, where ``limit`` is the action limit **in force**: the task's, times the speed
  factor the policy's command is scaled by (the phase's and the trust level's, ``trust_scales``).
  Relative to the unscaled limit, the noise of a MIXED episode (speed 0.5) was twice its stated
  size and its clip let the command past the filter's reduced limits: the filter acted in 10 % of
  the periods of the library loop's real episodes, 0.5 % without exploration.
* The noise never takes the **tool** past ``TOOL_SPEED_BUDGET`` of the tool-speed limit in force
  either (given the tool Jacobian at the measured state): it is shrunk along its own direction to
  the largest part that keeps ``|J u|`` within the budget, and dropped when the policy's command is
  already above it. Joint-space noise adds tool speed the policy did not ask for; near the path's
  fastest parts it was what the filter cut (library loop, worn_heavy, 8 episodes: filter active in
  3.2 % of the periods, 80 % of them on ``tool_speed``, against 0.5 % without exploration).
  The budget leaves the filter's look-ahead margin free, so that the filter stays a guard.
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
TOOL_SPEED_BUDGET = 0.85  # exploration keeps the tool within this fraction of the tool-speed limit in force


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


def explore(action: np.ndarray, noise: np.ndarray, scale: float, std: float, limit: np.ndarray,
            tool_jacobian: np.ndarray | None = None, tool_speed_max_mps: float = math.inf) -> np.ndarray:
    """``action`` plus ``scale * std * limit * noise``, clipped to ``±limit`` (unchanged when either is 0).

    ``limit``: the action limit in force (the task's times the speed factor the command was scaled
    by), so that the noise is a fraction of what the arm may do now and never takes the command
    past it. ``tool_jacobian`` (3 x n, at the measured state) and ``tool_speed_max_mps`` (the
    tool-speed limit in force): the added part is shrunk so that ``|J u|`` stays within
    ``TOOL_SPEED_BUDGET`` of it (module docstring); ``action`` itself is only clipped to ``±limit``."""
    if scale <= 0.0 or std <= 0.0:
        return action
    action = np.clip(action, -limit, limit)  # exploring, the command is held to the limit in force
    out = np.clip(action + scale * std * limit * noise, -limit, limit)
    if tool_jacobian is None or not math.isfinite(tool_speed_max_mps):
        return out
    if np.shape(tool_jacobian) != (3, action.shape[0]):
        raise ValueError(f"tool_jacobian of shape {np.shape(tool_jacobian)}: expected the linear rows, (3, {action.shape[0]})")
    v_max = TOOL_SPEED_BUDGET * tool_speed_max_mps
    v_a = tool_jacobian @ action
    v_d = tool_jacobian @ (out - action)
    if float(np.linalg.norm(v_a + v_d)) <= v_max:
        return out
    c = float(v_a @ v_a) - v_max * v_max
    if c >= 0.0:  # the policy's own command is at or above the budget: add nothing
        return action
    a, b = float(v_d @ v_d), 2.0 * float(v_a @ v_d)
    k = (-b + math.sqrt(b * b - 4.0 * a * c)) / (2.0 * a)  # |v_a + k v_d| = v_max, the root in (0, 1)
    return action + min(max(k, 0.0), 1.0) * (out - action)  # between two points of the box: inside it
