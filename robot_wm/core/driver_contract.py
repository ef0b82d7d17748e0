"""The arm driver's side of the topic contract, without ROS: command checks, the command timeout,
the driver's state, and the measurements ``robot-wm doctor --driver`` makes on /joint_states.

robot_wm.driver.ArmDriver (the node) applies these; they are kept here so that the contract is
written once and tested on plain arrays.
"""
from __future__ import annotations

import enum
import math
from collections.abc import Sequence

import numpy as np


class DriverState(enum.IntEnum):
    """What a driver reports on /diagnostics (level: OK, WARN, ERROR)."""

    RUNNING = 0  # commands arrive within the timeout (or none was ever sent: the arm is at rest)
    TIMED_OUT = 1  # no command for command_timeout_s: brought to rest, held until a fresh command
    FAULT = 2  # an exception in the driver's own code: at rest, commands refused until ~/reset


STATE_TEXT = {
    DriverState.RUNNING: "running",
    DriverState.TIMED_OUT: "command timeout: holding",
    DriverState.FAULT: "driver fault",
}


class Refusal(enum.Enum):
    """Why a command is refused (a driver logs each kind at most once a second, say why in text)."""

    WRONG_LENGTH = "wrong length"
    NOT_FINITE = "not finite"
    OVER_LIMIT = "beyond the velocity limits"
    FAULT = "driver fault"


def check_command(command: np.ndarray, joint_names: Sequence[str], velocity_limits_radps: np.ndarray,
                  check_limits: bool = True) -> tuple[Refusal, str] | None:
    """Return why a joint velocity command must be refused (the kind and a text naming the joints
    and values), or None when it may reach the drives.

    Args:
        command: the command's values (rad/s), expected in ``joint_names`` order.
        joint_names: the URDF's joints, in order.
        velocity_limits_radps: the URDF's velocity limit of each joint.
        check_limits: False for hardware that clamps to its limits itself.
    """
    n = len(joint_names)
    if command.shape != (n,):
        return Refusal.WRONG_LENGTH, f"{command.size} values, expected {n} ({', '.join(joint_names)})"
    bad = [f"{name}={v}" for name, v in zip(joint_names, command) if not math.isfinite(v)]
    if bad:
        return Refusal.NOT_FINITE, f"non-finite values ({', '.join(bad)})"
    if check_limits:
        over = [f"{name} {v:+.3f} (limit {lim:.3f})" for name, v, lim in zip(joint_names, command, velocity_limits_radps)
                if abs(v) > lim * (1 + 1e-9)]
        if over:
            return Refusal.OVER_LIMIT, f"beyond the URDF velocity limits: {', '.join(over)} rad/s"
    return None


class CommandTimeout:
    """The command timeout: ``expired(now_s)`` is True once, when no command came for ``timeout_s``.

    Until the first command nothing can expire (the arm has not moved); after expiry it stays
    expired (``timed_out``) until the next command.
    """

    def __init__(self, timeout_s: float) -> None:
        if not (math.isfinite(timeout_s) and timeout_s > 0):
            raise ValueError(f"command timeout {timeout_s!r} s: expected a finite time > 0 s")
        self.timeout_s = float(timeout_s)
        self.timed_out = False
        self._last_s: float | None = None

    def command(self, now_s: float) -> None:
        """A valid command arrived at ``now_s``."""
        self._last_s, self.timed_out = now_s, False

    def expired(self, now_s: float) -> bool:
        """True on the check at which the timeout runs out (once per silence)."""
        if self._last_s is None or self.timed_out or now_s - self._last_s <= self.timeout_s:
            return False
        self.timed_out = True
        return True

    def clear(self) -> None:
        """Forget the last command (after a reset: nothing is commanded, nothing can expire)."""
        self._last_s, self.timed_out = None, False


# ---------------------------------------------------------------- measured on /joint_states (doctor)
def rate_hz(stamps_s: Sequence[float]) -> float:
    """The publish rate from header stamps: 1 / median gap (robust to a late or dropped message)."""
    gaps = np.diff(np.sort(np.asarray(stamps_s, dtype=float)))
    gaps = gaps[gaps > 0]
    return float(1.0 / np.median(gaps)) if gaps.size else 0.0


def rest_after_s(stamps_s: Sequence[float], speeds_radps: Sequence[float], t0_s: float,
                 tol_radps: float = 0.01) -> float | None:
    """Seconds from ``t0_s`` to rest, judged by the states' own stamps.

    Args:
        stamps_s: header stamps of the joint states, in arrival order.
        speeds_radps: the largest |velocity| of each state.
        t0_s: when the commands stopped, on the stamps' clock.
        tol_radps: at rest below this.
    Returns:
        The stamp of the first state after ``t0_s`` from which every later state is at rest, minus
        ``t0_s``; None when the last state is not at rest.
    """
    after = [(s, v) for s, v in zip(stamps_s, speeds_radps) if s >= t0_s]
    if not after or after[-1][1] >= tol_radps:
        return None
    i = len(after)
    while i > 0 and after[i - 1][1] < tol_radps:
        i -= 1
    return after[i][0] - t0_s


__all__ = ["CommandTimeout", "DriverState", "Refusal", "STATE_TEXT", "check_command", "rate_hz", "rest_after_s"]
