"""A scripted check of the bare arm through its topic contract (test-side only).

A joint-velocity sequence goes straight onto the hardware command topic and what the arm did is
judged on /joint_states: tracking per segment, then the driver's command timeout bringing it to
rest. In the product only the safety filter publishes hardware commands, so this lives with the
tests (it was ``robot-wm demo --scripted``); it drives an arm_sim process with no control stack.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from std_msgs.msg import Float64MultiArray

from robot_wm import description

SETTLE_S = 0.25  # ignore the first part of each segment when judging tracking (acceleration)
TRACKING_TOLERANCE_RADPS = 0.05
STOP_TOLERANCE_RADPS = 0.01
STOP_WITHIN_S = 0.5


@dataclass(frozen=True)
class Segment:
    """One step of the script: a name, a duration (s) and a joint velocity (rad/s) or None (send nothing)."""

    name: str
    duration_s: float
    velocity_radps: tuple[float, ...] | None


def _joint_velocity(**radps: float) -> tuple[float, ...]:
    """A command in the description's joint order: the named joints at their speed, the others at 0."""
    names = description.joint_limits(description.expand()).names
    unknown = set(radps) - set(names)
    if unknown:
        raise ValueError(f"unknown joints {sorted(unknown)}; the arm has {list(names)}")
    return tuple(float(radps.get(n, 0.0)) for n in names)


def default_script() -> list[Segment]:
    """Single joints, coupled joints, then silence to show the command timeout."""
    v = _joint_velocity
    return [
        Segment("hold", 1.0, v()),
        Segment("pan +", 1.5, v(shoulder_pan_joint=0.4)),
        Segment("pan -", 1.5, v(shoulder_pan_joint=-0.4)),
        Segment("lift/elbow", 1.5, v(shoulder_lift_joint=-0.25, elbow_joint=0.35)),
        Segment("lift/elbow back", 1.5, v(shoulder_lift_joint=0.25, elbow_joint=-0.35)),
        Segment("wrists", 1.5, v(wrist_1_joint=0.5, wrist_2_joint=-0.5, wrist_3_joint=0.8)),
        Segment("wrists back", 1.5, v(wrist_1_joint=-0.5, wrist_2_joint=0.5, wrist_3_joint=-0.8)),
        Segment("pan + (then silence)", 0.8, v(shoulder_pan_joint=0.5)),
        Segment("silence: driver timeout", 1.2, None),
    ]


def run_script(client, script: list[Segment], rate_hz: float = 100.0) -> float:
    """Publish ``script`` through ``client`` (a rosclient.ArmClient) on a fixed schedule; return its start time.

    Segment boundaries are absolute (start + cumulative durations), so that ``summarize`` can
    judge each segment by the same clock however long a publish takes.
    """
    t0 = time.monotonic()
    end = t0
    for seg in script:
        end += seg.duration_s
        if seg.velocity_radps is None:
            time.sleep(max(0.0, end - time.monotonic()))
            continue
        msg = Float64MultiArray(data=[float(x) for x in seg.velocity_radps])
        while time.monotonic() < end:
            client.pub.publish(msg)
            time.sleep(min(1.0 / rate_hz, max(0.0, end - time.monotonic())))
    return t0


@dataclass
class ArmCheck:
    """What the scripted check measured on /joint_states."""

    joint_states_received: int
    joint_states_period_ms_p50: float
    joint_states_period_ms_p99: float
    joint_states_period_ms_max: float
    tracking_error_radps: dict[str, float]
    worst_tracking_error_radps: float
    stop_after_timeout_s: float | None
    passed: bool


def summarize(t_s, v_radps, script: list[Segment], t0_s: float) -> ArmCheck:
    """Rate, per-segment tracking error and command-timeout stop from joint states (receive time, velocity)."""
    t = np.asarray(t_s, dtype=float)
    v = np.asarray(v_radps, dtype=float)
    periods_ms = np.diff(t) * 1e3 if len(t) > 1 else np.array([np.nan])
    errors: dict[str, float] = {}
    start = t0_s
    last_command_end = None
    for seg in script:
        end = start + seg.duration_s
        if seg.velocity_radps is not None:
            window = (t >= start + SETTLE_S) & (t < end)
            if window.any():
                err = np.abs(v[window] - np.array(seg.velocity_radps)).max(axis=1)
                errors[seg.name] = float(np.median(err))
            last_command_end = end
        start = end
    stop_s = None
    if last_command_end is not None and len(v):
        resting = (t >= last_command_end) & (np.abs(v).max(axis=1) < STOP_TOLERANCE_RADPS)
        if resting.any():
            # the command timeout is measured from the last command the arm received
            stop_s = float(t[resting][0] - last_command_end)
    worst = max(errors.values()) if errors else float("nan")
    passed = bool(errors) and worst < TRACKING_TOLERANCE_RADPS and stop_s is not None and stop_s < STOP_WITHIN_S
    return ArmCheck(
        joint_states_received=len(t),
        joint_states_period_ms_p50=float(np.percentile(periods_ms, 50)),
        joint_states_period_ms_p99=float(np.percentile(periods_ms, 99)),
        joint_states_period_ms_max=float(np.max(periods_ms)),
        tracking_error_radps=errors,
        worst_tracking_error_radps=float(worst),
        stop_after_timeout_s=stop_s,
        passed=passed,
    )
