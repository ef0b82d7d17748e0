"""The trust monitor's own calibration (``calibrate_s``: what `robot-wm trust calibrate --live` runs).

The node records normal operation for ``calibrate_s`` seconds, then fits the calibration (effort
model, per-joint scales, thresholds and their tails) and judges with it. The fit takes 0.4-0.7 s of
CPU on 300-600 s recorded (more on a loaded machine); on the monitor's period thread no TrustState
went out meanwhile, and the safety filter stops the arm on one older than ``trust_timeout_s``
(1 s): the end of a calibration could stop the arm for stale trust. So the fit runs on a thread of
its own, just below the period thread (``model_swap.loader_scheduling``: the interpreter lock handed
back every 0.5 ms), while the periods go on publishing "calibrating"; the first period that finds
it done writes the file and takes the calibration in (a fit a reconfigure left behind writes
nothing). A fit that fails, for whatever reason, leaves the monitor at STOP with the reason.
"""
from __future__ import annotations

import math
import threading

from robot_wm.nodes.model_swap import loader_scheduling


class BackgroundFit:
    """``fn(*args)`` on a daemon thread just below the caller's; ``done()``, then ``result`` or ``error``."""

    def __init__(self, fn, *args, name: str = "trust_calibration_fit") -> None:
        self.result = None
        self.error: BaseException | None = None
        self._done = threading.Event()
        threading.Thread(target=self._run, args=(fn, args), name=name, daemon=True).start()

    def _run(self, fn, args) -> None:
        try:
            with loader_scheduling():
                self.result = fn(*args)
        except BaseException as exc:  # noqa: BLE001 (any failure is reported by the period that takes it)
            self.error = exc
        finally:
            self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout_s: float | None = None) -> bool:
        return self._done.wait(timeout_s)


class LiveCalibration:
    """The recording and the fit of ``TrustMonitorNode`` (a mixin: it uses the node's ``_recording``,
    ``tracker``, ``params``, ``_config``, ``_kin``, ``_path``, ``_publish`` and logger; the fit's
    thread only what ``_record`` hands it)."""

    _fitting: BackgroundFit | None = None

    def _record(self, t_s: float, effort) -> None:
        level = 0 if self.simulated_arm else 1
        if self._fitting is None:
            self._recording.add(t_s, self.tracker, effort)
            elapsed = self._recording.elapsed_s
            if elapsed < self.calibrate_s:
                self._publish(level, 1.0, math.nan, math.nan,
                              f"calibrating: {elapsed:.0f} of {self.calibrate_s:g} s of normal operation recorded")
                return
            from robot_wm.core.trust.settings import config_from_params

            # everything the fit uses, taken here: a reconfigure meanwhile changes the node, not this fit
            self._fitting = BackgroundFit(_fit_calibration, self._recording, self.profile, config_from_params(self.params)[1],
                                          self._config, self.dt_s, self._model_version or "unknown")
        if not self._fitting.done():
            self._publish(level, 1.0, math.nan, math.nan,
                          f"calibrating: {self._recording.elapsed_s:.0f} s of normal operation recorded; "
                          "fitting the calibration")
            return
        fitting, self._fitting, self._recording = self._fitting, None, None
        self._take_calibration(fitting)

    def _take_calibration(self, fitting: BackgroundFit) -> None:
        """On the period thread: write the fitted calibration and judge with it, or STOP saying why."""
        from robot_wm.core.trust import TrustMonitor
        from robot_wm.core.trust import calibration as calib_io
        from robot_wm.core.trust.tracker import TrustTracker

        try:
            if fitting.error is not None:
                raise fitting.error
            if fitting.result is None:
                raise RuntimeError("the fit returned no calibration")
            cal = fitting.result
            tracker = TrustTracker(TrustMonitor(self._config, cal), self._kin, self.dt_s,
                                   command_timeout_s=self.hardware_command_timeout_s or None)
            calib_io.save(cal, self._path)  # only the fit this node still waits for writes the file
        except BaseException as exc:  # noqa: BLE001 (whatever failed: STOP with the reason, never a crash)
            self.problem = f"calibration failed: {type(exc).__name__}: {exc}"
            self.get_logger().error(f"{self.problem}; publishing STOP")
            return
        self.calibration, self.tracker = cal, tracker
        self.get_logger().warning(
            f"calibration written to {self._path} ({cal.periods} held-out periods, exceedance {cal.exceedance:g}): "
            + ", ".join(f"{k} {v:.3g}" for k, v in cal.thresholds.items()) + "; judging with it from now on")


def _fit_calibration(recording, profile: str, settings, config, dt_s: float, model_version: str):
    """On the fit's thread: the calibration of ``recording`` (from the values the period gave it only)."""
    from robot_wm.learning.trust_eval import calibrate_run

    run = recording.run(profile)
    return calibrate_run(run, settings.exceedance, settings.floor_map(), config, model_version=model_version,
                         source=f"ros:{profile}:{run.t_s[-1] - run.t_s[0]:.0f}s", dt_s=dt_s,
                         alarms_per_hour=settings.alarms_per_hour)

__all__ = ["BackgroundFit", "LiveCalibration"]
