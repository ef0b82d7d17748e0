"""What the trust monitor reports on /diagnostics (robot_wm/nodes/trust_monitor.py): its level and
signals, its compute per period, the deployment phase's evidence, the calibration, the rollbacks."""
from __future__ import annotations

import numpy as np


def diagnostic_values(monitor, level: int, score: float, ratios: dict | None) -> dict[str, str]:
    """Key/values of the monitor's DiagnosticStatus (``monitor``: the TrustMonitorNode, read only)."""
    values = {"level": str(level), "score": f"{score:.3f}", "phase": str(monitor.phase),
              "intervention": str(monitor._intervention).lower(),
              "callback_errors": str(monitor.callback_errors),
              "periods_unjudged_command_gap": str(monitor.tracker.unjudged if monitor.tracker is not None else 0),
              "model_version": monitor._model_version or "none"}
    for k, v in (ratios or {}).items():
        values[f"ratio_{k}"] = f"{v:.3f}"
    if monitor._compute_us:
        us = np.asarray(monitor._compute_us)
        values["compute_cpu_us_p50"] = f"{np.percentile(us[:, 0], 50):.0f}"
        values["compute_cpu_us_p99"] = f"{np.percentile(us[:, 0], 99):.0f}"
        values["compute_wall_us_p50"] = f"{np.percentile(us[:, 1], 50):.0f}"
        values["compute_wall_us_p99"] = f"{np.percentile(us[:, 1], 99):.0f}"
    if monitor.phases is not None:
        ev = monitor.phases.state.evidence
        values.update({"phase_minutes": f"{ev.operating_s / 60.0:.2f}", "phase_episodes": str(ev.episodes),
                       "phase_success_rate": f"{ev.success_rate:.3f}", "phase_mean_score": f"{ev.mean_score:.3f}",
                       "phase_anomalies": str(ev.anomalies), "phase_file": monitor._phase_path})
    if monitor.calibration is not None:
        values["calibration_model_version"] = monitor.calibration.model_version
        values["calibration_source"] = monitor.calibration.source
        values.update({f"calibration_{k}": f"{v:.4g}" for k, v in monitor.calibration.thresholds.items()})
    values.update(monitor._payload.diagnostics(monitor.tracker))
    if monitor._refresh is not None:
        values["calibration_refresh"] = (f"{monitor._refresh.collected} of {monitor._refresh.periods} normal periods "
                                         f"({monitor._refresh.skipped} skipped)")
    if monitor._rollback is not None:
        values["rollbacks"] = str(len(monitor._rollback.rollbacks))
        if monitor._rollback.rollbacks:
            values["last_rollback"] = monitor._rollback.rollbacks[-1]
    return values
