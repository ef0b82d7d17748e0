"""A scripted reacher: damped-least-squares Jacobian control of the tool position.

The baseline the learned policy is compared against (same task, same episodes), and the
"expert" half of the exploration mix in data collection. Redundancy (6 joints, 3-D goal) is
resolved by a null-space pull toward a home posture, which keeps the wrist pointing down.
"""
from __future__ import annotations

import numpy as np

from robot_wm.core.kinematics import Kinematics


class DlsReacher:
    """v = J⁺_λ · k·(goal − tool) + (I − J⁺J)·k_home·(q_home − q), clipped to the velocity limits.

    Args:
        kinematics: the arm's kinematics (joint order = the action order).
        q_home_rad: posture the null-space term pulls toward.
        v_limit_radps: per-joint velocity limits of the output (rad/s).
        gain_per_s: proportional gain on the tool position error (1/s).
        damping: DLS damping λ (m); larger is smoother near singularities.
        max_tool_speed_mps: cap on the commanded tool speed (m/s).
        home_gain_per_s: null-space gain (1/s).
    """

    def __init__(
        self,
        kinematics: Kinematics,
        q_home_rad: np.ndarray,
        v_limit_radps: np.ndarray,
        gain_per_s: float = 4.0,
        damping: float = 0.05,
        max_tool_speed_mps: float = 0.4,
        home_gain_per_s: float = 1.0,
    ) -> None:
        self.kin = kinematics
        self.q_home = np.asarray(q_home_rad, dtype=float)
        self.v_limit = np.asarray(v_limit_radps, dtype=float)
        self.gain = gain_per_s
        self.damping = damping
        self.max_tool_speed = max_tool_speed_mps
        self.home_gain = home_gain_per_s

    def __call__(self, q_rad: np.ndarray, goal_m: np.ndarray) -> np.ndarray:
        """Return the joint velocity command (rad/s) for one arm."""
        q_rad = np.asarray(q_rad, dtype=float)
        v_tool = self.gain * (np.asarray(goal_m, dtype=float) - self.kin.tool_position_m(q_rad))
        return self._command(q_rad, v_tool)

    def track(self, q_rad: np.ndarray, reference_m: np.ndarray, reference_velocity_mps: np.ndarray,
              gain_per_s: float) -> np.ndarray:
        """Command (rad/s) that follows a moving reference: v = v_ref + gain (p_ref - p), then DLS."""
        q_rad = np.asarray(q_rad, dtype=float)
        v_tool = np.asarray(reference_velocity_mps, dtype=float) + gain_per_s * (
            np.asarray(reference_m, dtype=float) - self.kin.tool_position_m(q_rad))
        return self._command(q_rad, v_tool)

    def _command(self, q_rad: np.ndarray, v_tool: np.ndarray) -> np.ndarray:
        """A tool velocity (capped at max_tool_speed) as joint velocities, with the null-space pull home."""
        jac = self.kin.tool_jacobian(q_rad)[:3]
        speed = np.linalg.norm(v_tool)
        if speed > self.max_tool_speed:
            v_tool = v_tool * (self.max_tool_speed / speed)
        jjt = jac @ jac.T + (self.damping**2) * np.eye(3)
        pinv = jac.T @ np.linalg.solve(jjt, np.eye(3))
        null = np.eye(len(q_rad)) - pinv @ jac
        v = pinv @ v_tool + null @ (self.home_gain * (self.q_home - q_rad))
        # scale the whole vector (not per joint) so the direction of motion is kept
        ratio = np.max(np.abs(v) / self.v_limit)
        return v / ratio if ratio > 1.0 else v

    def batch(self, q_rad: np.ndarray, goal_m: np.ndarray) -> np.ndarray:
        """Return commands for a batch (n x 6 joint positions, n x 3 goals)."""
        return np.stack([self(q, g) for q, g in zip(q_rad, goal_m)])
