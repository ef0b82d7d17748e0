"""The demo's PNG report (robot_wm.demo): joint trajectories with limits, tool speed, the filter's
interventions, the prediction error with the trust score and level; for tracking, the tracking
error and the reference against the tool path; operator events and the take-over marked."""
from __future__ import annotations

from pathlib import Path

import numpy as np


def tool_speeds(mon, kin) -> tuple[np.ndarray, np.ndarray]:
    """Tool speed |J(q) q̇| from the measured joint states (receive times jitter too much to differentiate)."""
    with mon.lock:
        js = list(mon.js)
    t = np.array([x[0] for x in js])
    speed = np.array([np.linalg.norm(kin.tool_linear_velocity_mps(x[1], x[2])) for x in js])
    return t, speed


def write_report(mon, kin, limits, names, t0: float, path: Path, task: str = "reach") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with mon.lock:
        js = list(mon.js)
        status = list(mon.status)
        pred = list(mon.pred_err)
        trust = list(mon.trust)
        events = list(mon.events)
        reference = list(mon.reference)
    t = np.array([x[0] for x in js]) - t0
    q = np.array([x[1] for x in js])
    track = task == "track" and len(reference) > 1
    fig = plt.figure(figsize=(11, 16 if track else 12))
    rows = 6 if track else 4
    axes = [fig.add_subplot(rows, 1, 1)]
    axes += [fig.add_subplot(rows, 1, k, sharex=axes[0]) for k in range(2, 5)]
    ax = axes[0]
    for i, name in enumerate(names):
        line, = ax.plot(t, q[:, i], lw=1, label=name)
        ax.axhline(limits.upper_rad[i], color=line.get_color(), ls=":", lw=0.8)
        ax.axhline(limits.lower_rad[i], color=line.get_color(), ls=":", lw=0.8)
    ax.set_ylabel("joint position (rad)")
    ax.set_title("joint trajectories (dotted: safety limits)")
    ax.legend(ncol=3, fontsize=7, loc="upper right")
    ts, speed = tool_speeds(mon, kin)
    axes[1].plot(ts - t0, speed, lw=0.8)
    axes[1].axhline(limits.tool_speed_max_mps, color="r", ls="--", label="limit")
    axes[1].set_ylabel("tool speed (m/s)")
    axes[1].legend(fontsize=8)
    st = np.array([s[0] for s in status]) - t0
    axes[2].plot(st, [s[3] for s in status], lw=0.8, label="|u_safe - u_nominal| (rad/s)")
    axes[2].step(st, [s[1] for s in status], where="post", lw=0.8, label="state (0 OK, 1 FILTERING, 2 STOPPING, 3 STOPPED, 4 ESTOP, 5 FAULT)")
    axes[2].set_ylabel("safety filter")
    axes[2].legend(fontsize=7)
    if pred:
        axes[3].plot(np.array([p[0] for p in pred]) - t0, [p[1] for p in pred], lw=0.6)
    axes[3].set_ylabel("prediction error (rad/s)")
    if trust:
        tw = axes[3].twinx()
        tt = np.array([x[0] for x in trust]) - t0
        tw.plot(tt, [x[2] for x in trust], color="tab:green", lw=0.9, label="trust score")
        tw.step(tt, [x[1] / 4.0 for x in trust], where="post", color="tab:red", lw=0.8,
                label="trust level / 4 (0 FULL, .25 CAUTIOUS, .5 SLOW, .75 STOP, 1 HUMAN)")
        tw.set_ylim(-0.05, 1.05)
        tw.set_ylabel("trust")
        tw.legend(fontsize=7, loc="upper right")
    axes[3].set_xlabel("time (s)")
    if track:
        _track_panels(fig, axes, kin, js, reference, t0)
    taken = next((te for te, text in events if text.startswith("operator: take over") and "accepted" in text), None)
    given = next((te for te, text in events if text.startswith("operator: release") and "accepted" in text), None)
    for ax in axes:
        for te, text in events:
            if text.startswith("operator"):
                ax.axvline(te - t0, color="k", lw=0.8, alpha=0.5)
        if taken is not None:
            ax.axvspan(taken - t0, (given if given is not None else events[-1][0]) - t0, color="tab:orange",
                       alpha=0.15, label="operator in control" if ax is axes[1] else None)
    if taken is not None:
        axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _track_panels(fig, axes, kin, js, reference, t0: float) -> None:
    """Tracking error over time (under the time panels) and the reference path against the actual
    tool path, projected on the base frame's x-y and x-z planes (the bottom row)."""
    t_js = np.array([x[0] for x in js])
    tool = np.array([kin.tool_position_m(x[1]) for x in js])
    t_ref = np.array([r[0] for r in reference])
    ref = np.array([r[1] for r in reference])
    inside = (t_ref >= t_js[0]) & (t_ref <= t_js[-1])
    t_ref, ref = t_ref[inside], ref[inside]
    at_ref = np.stack([np.interp(t_ref, t_js, tool[:, k]) for k in range(3)], axis=1)
    err = np.linalg.norm(at_ref - ref, axis=1)
    ax = fig.add_subplot(6, 1, 5, sharex=axes[0])
    ax.plot(t_ref - t0, err * 1e3, lw=0.8)
    ax.set_ylabel("|tool - reference| (mm)")
    ax.set_ylim(0, max(20.0, float(np.percentile(err, 95)) * 1e3 * 1.2) if len(err) else 20.0)
    ax.set_xlabel("time (s)")
    axes.append(ax)
    for col, (i, j, label) in enumerate(((0, 1, "x-y"), (0, 2, "x-z"))):
        ax = fig.add_subplot(6, 2, 11 + col)
        ax.plot(ref[:, i], ref[:, j], "k--", lw=0.8, label="reference")
        ax.plot(at_ref[:, i], at_ref[:, j], lw=0.8, alpha=0.8, label="tool (measured)")
        ax.set_aspect("equal", adjustable="datalim")
        ax.set_title(f"reference vs tool path ({label}, m)", fontsize=9)
        ax.legend(fontsize=7)
