"""The trust monitor's deployment-phase side (a mixin of ``TrustMonitorNode``): the evidence a
phase gathers (operating time, episodes, the trust score), the operator's promote and demote
services, automatic demotion on an anomaly with its request for a human, and the phase file kept
every 5 s. The phase machine itself is ``robot_wm.core.trust.phase``."""
from __future__ import annotations

import time

from robot_wm.core.safety.limits import TrustLevel
from robot_wm.msg import EpisodeResult, InterventionRequest

STATUS_FRESH_S = 0.1  # a safety status older than this says nothing about this period


class PhaseOperations:
    """Methods of ``TrustMonitorNode`` for the deployment phase (it owns the state they use)."""

    def _on_episode(self, msg: EpisodeResult) -> None:
        if self.phases is None:
            return
        if self._intervention or not self._operating():
            self._episodes_ignored += 1  # an episode under teleop or a held arm is no evidence for the policy
            return
        self._episodes += 1
        self.phases.episode(bool(msg.success))

    def _calibrated(self) -> bool:
        cal = self.calibration
        return (cal is not None and self._recording is None and self._model_version is not None
                and cal.model_version == self._model_version and not self.problem)

    def _on_promote(self, request, response):
        return self._phase_service(request, response, promote=True)

    def _on_demote(self, request, response):
        return self._phase_service(request, response, promote=False)

    def _phase_service(self, request, response, promote: bool):
        verb = "promote" if promote else "demote"
        try:
            if self.phases is None:
                response.success, response.message, response.unmet = (
                    False, self._phase_problem or self.problem or "not configured", [])
            elif promote:
                ok, message, unmet = self.phases.promote(request.reason, calibrated=self._calibrated())
                response.success, response.message, response.unmet = ok, message, list(unmet)
            else:
                ok, message = self.phases.demote(request.reason)
                response.success, response.message, response.unmet = ok, message, []
            response.phase = self.phase
            text = (f"operator {verb} ({request.reason or 'no reason'}): "
                    f"{'granted' if response.success else 'refused'}: {response.message}")
            if response.success:
                self.get_logger().warning(text)
            else:
                self.get_logger().info(text)
        except Exception as exc:  # noqa: BLE001 - a failed write keeps the old phase in force and says so
            response.success, response.message, response.unmet = False, f"{verb} failed: {exc!r}", []
            response.phase = self.phase
        return response

    def _operating(self) -> bool:
        """The arm moves under the policy: a moving level in force and the filter enabled (OK, FILTERING)."""
        fresh = self._status is not None and time.monotonic() - self._status[0] <= STATUS_FRESH_S
        return (self._last_level is not None and self._last_level < 3 and fresh and self._status[1] in (0, 1)
                and not self._intervention)

    def _phase_bookkeeping(self, out) -> None:
        """Evidence, automatic demotion, the MIXED phase's call for a human; the file every 5 s."""
        ph, monitor = self.phases, self.tracker.monitor
        now = time.monotonic()
        if self._operate_t is not None and self._operating():
            ph.operate(min(now - self._operate_t, 0.1), out.score)
        self._operate_t = now
        if monitor.anomalies > self._anomalies_seen:
            self._anomalies_seen = monitor.anomalies
            before = ph.phase
            action = ph.anomaly(out.reason)
            if action != "demoted":  # (a demotion says so below, with its reason)
                called = monitor.level == TrustLevel.HUMAN  # (the monitor's step has decided it)
                self.get_logger().warning(f"anomaly {monitor.anomalies} in phase {ph.phase.name} (two signals agree"
                                          f"{'; a human is called' if called else ''}): {out.reason}")
            if action == "demoted":
                self._demotion.demoted()
                self.get_logger().error(f"phase {before.name} -> {ph.phase.name}: automatic demotion on an anomaly: "
                                        f"{out.reason}")
                self._request(InterventionRequest.SEVERITY_WARNING,
                              f"automatic demotion {before.name} -> {ph.phase.name} on an anomaly: {out.reason}")
        if now - self._phase_saved_t >= 5.0:
            self._phase_saved_t = now
            try:
                ph.save()
            except OSError as exc:  # the phase can no longer be kept: hold the arm and say why
                self._phase_problem = f"phase file {self._phase_path}: cannot write it: {exc}"
                self.get_logger().error(f"{self._phase_problem}; publishing STOP")

    def _request(self, severity: int, reason: str) -> None:
        msg = InterventionRequest(severity=int(severity), phase=self.phase, reason=reason[:500])
        msg.header.stamp = self.get_clock().now().to_msg()
        if self._request_pub is not None:
            self._request_pub.publish(msg)
        self.get_logger().warning(f"intervention requested: {reason}")


__all__ = ["STATUS_FRESH_S", "PhaseOperations"]
