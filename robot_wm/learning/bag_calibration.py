"""Trust calibration from recorded normal operation: ``robot-wm trust calibrate --bags DIR``.

The trust monitor's thresholds are conformal quantiles of its signals during normal operation
(``robot_wm.learning.trust_eval``). Demonstration bags are normal operation of the arm itself, so
they can give them without running the arm again — for any world model, e.g. the one ``adapt``
just made from the same bags. Each episode is replayed period by period as the trust_monitor
node sees it: the joint state at the period (on the control grid), the mean of the measured
efforts since the previous period, the filter's verdict then (FILTERING or not), and the world
model's prediction made one period earlier from the state and the command actually sent
(``WorldModelRunner``, the world_model node's own runner). The signals go through the node's own
``TrustTracker`` and then through ``calibrate_run``: the effort model is fit on the first half of
the periods, the thresholds are the quantiles of the second half. A period no command was sent
for ``hardware_command_timeout_s`` before (by the SafetyStatus stamps: the filter stamps one with
each command) is not judged, as the node does not judge it.

Recorded by the library-mode simulator, a bag carries the joint states of the control periods
only (100 Hz, not the arm's 500 Hz), so its efforts are instantaneous rather than averaged over
the period; the effort signal's thresholds come out a little wider than the node's own
calibration would make them. The data need not come from the world model being calibrated, but
the more of it the model was trained on, the tighter (more alarm-prone, never less safe) the
prediction-error thresholds: ``trust calibrate --live`` on the arm refreshes them.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from robot_wm import bags


def needed_seconds(exceedance: float, dt_s: float = 0.01, settle_s: float = 3.0) -> float:
    """Normal operation a calibration at ``exceedance`` needs (the live calibration's rule): the
    quantile of the held-out half must rest on at least 1.5 / exceedance periods."""
    return settle_s + 1.5 * 2.0 / exceedance * dt_s


def replay_run(directory: Path, world_model_path: Path, config, *, task: str | None = None,
               skipped: list[str] | None = None, command_timeout_s: float | None = None):
    """The monitor's signals over every episode of ``directory`` (a ``trust_eval.Run``, episodes
    back to back on one clock). With ``skipped``, an episode the loader refuses (a hole in its
    joint states) is left out and its reason appended there; without, it raises. With
    ``command_timeout_s`` (the hardware's), a period no command was sent for that long before (by
    the SafetyStatus stamps, one per command sent) is not judged, as the node does not judge it: the
    driver stopped the arm then, while the replay holds the last command. A bag's tare (``Episode.payload_kg``)
    goes to the tracker as the node's does (at the tool frame's origin: the trust monitor's
    ``payload_com_m`` is not known here); the calibration's effort model then records the first episode's."""
    from robot_wm import description
    from robot_wm.core.kinematics import Kinematics
    from robot_wm.core.safety.types import FilterState
    from robot_wm.core.tasks import get_task
    from robot_wm.core.trust import TrustMonitor
    from robot_wm.core.trust.tracker import TrustTracker
    from robot_wm.core.world_model_runner import WorldModelRunner
    from robot_wm.learning.demos import DEFAULT_MAX_GAP_S, episode_arrays
    from robot_wm.learning.trust_eval import RunRecorder, _recording_calibration

    urdf = description.expand()
    names = description.joint_limits(urdf).names
    kin = Kinematics(urdf, names)
    complete, broken = bags.list_bags(Path(directory))
    if broken:
        raise bags.BagError(f"{directory}: {', '.join(f'{p.name} ({bags.broken_reason(p)})' for p in broken)}")
    if not complete:
        raise bags.BagError(f"{directory}: no demonstration bags")
    rec = RunRecorder(len(names))
    clock = 0.0
    first_payload = None  # the first episode's tare: the one the effort regressors stand for
    version = None
    for path in complete:
        ep = bags.read_episode(path, names)
        if task is not None and ep.meta.task != task:
            raise bags.BagError(f"{path}: a recording of task {ep.meta.task!r}, not {task!r}")
        dt = get_task(ep.meta.task).control_dt_s
        steps = int(math.floor(ep.meta.duration_s / dt + 1e-6))
        try:
            q, qd, action = episode_arrays(ep, steps, dt, DEFAULT_MAX_GAP_S)
        except bags.BagError as exc:
            if skipped is None:
                raise
            skipped.append(str(exc))
            continue
        grid = ep.meta.start_ns + np.round(np.arange(steps + 1) * dt * 1e9).astype(np.int64)
        # the mean measured effort of each period (t_k-1, t_k], as the node averages the 500 Hz states
        cuts = np.searchsorted(ep.state_t_ns, grid, side="right")
        status_idx = np.searchsorted(ep.status_t_ns, grid, side="right") - 1
        runner = WorldModelRunner(world_model_path, names, dt, analytic=False)  # predicts only
        version = runner.version
        cal = _recording_calibration(runner.version)
        tracker = TrustTracker(TrustMonitor(config, cal), kin, dt, command_timeout_s=command_timeout_s or None)
        if ep.payload_kg is not None:  # the filter's tare in force: the efforts are judged as the node judges them
            first_payload = ep.payload_kg if first_payload is None else first_payload
            tracker.set_payload(ep.payload_kg, first_payload)
        sent = np.sort(clock + (ep.status_stamp_ns - ep.meta.start_ns) * 1e-9)  # the commands' send times, replay clock
        fed = 0
        for k in range(steps + 1):
            t = clock + k * dt
            lo, hi = (cuts[k - 1] if k else max(cuts[0] - 1, 0)), cuts[k]
            efforts = ep.effort_nm[lo:hi] if hi > lo else ep.effort_nm[max(hi - 1, 0):hi]
            effort = np.mean(efforts, axis=0) if len(efforts) and np.all(np.isfinite(efforts)) else None
            intervened = None
            if status_idx[k] >= 0:
                intervened = int(ep.status_state[status_idx[k]]) == int(FilterState.FILTERING)
            while fed < len(sent) and sent[fed] <= t + 1e-9:  # as the node hears of them: up to the period
                tracker.command(float(sent[fed]))
                fed += 1
            tracker.measurement(t, q[k], qd[k], effort, intervened)
            rec.add(t, tracker, effort)
            if k < steps:
                pred = runner.predict(q[k], qd[k], action[k])
                tracker.prediction(t, pred.next_state, pred.epistemic_std, pred.aleatoric_std)
        clock += (steps + 1) * dt + 1.0  # a second between episodes: the smoothing starts afresh-ish
    return rec.run(str(directory)), version, len(complete)


def calibrate_from_bags(directory: Path, world_model_path: Path, *, config_file: Path | None = None,
                        task: str | None = None, out: Path | None = None):
    """A calibration of the world model at ``world_model_path`` from the bags of ``directory``.

    Returns:
        (the Calibration, the file written or None, seconds of operation used).
    Raises:
        BagError: an unusable bag; ValueError: too little operation for the configured exceedance.
    """
    from robot_wm.core.trust import calibration as calib_io
    from robot_wm.core.trust.settings import load_trust_config
    from robot_wm.learning.trust_eval import calibrate_run

    config, settings = load_trust_config(config_file)
    run, version, n = replay_run(directory, world_model_path, config, task=task,
                                 command_timeout_s=settings.command_timeout_s)
    seconds = float(len(run.t_s) * 0.01)
    need = needed_seconds(settings.exceedance)
    if seconds < need:
        raise ValueError(f"{directory}: {n} episode(s), {seconds:.0f} s of operation: a calibration at exceedance "
                         f"{settings.exceedance:g} (config/trust.yaml) needs {need:.0f} s; record more")
    cal = calibrate_run(run, settings.exceedance, settings.floor_map(), config, model_version=version,
                        source=f"bags:{Path(directory).name}:{n}ep:{seconds:.0f}s", alarms_per_hour=settings.alarms_per_hour)
    path = calib_io.save(cal, Path(out)) if out is not None else None
    return cal, path, seconds
