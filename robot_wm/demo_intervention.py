"""The demo's operator taking over (robot_wm.demo): take, jog the tool up through the policy node's
teleop slot and the safety filter, let the deadman stop it, hand back at rest; and its numbers."""
from __future__ import annotations

import numpy as np

from robot_wm.core.safety.limits import Phase, TrustLevel


def summarize_intervention(summary, mon, kin, limits, t0: float) -> None:
    """The take-over's numbers, and whether it went as it must: taken, the jog within the limits in
    force (SLOW while an operator is in control, times the phase), handed back at rest."""
    with mon.lock:
        events = list(mon.events)
        js = list(mon.js)
    taken = next((t for t, e in events if e.startswith("operator: take over") and "accepted" in e), None)
    released = next((t for t, e in events if e.startswith("operator: release") and "accepted" in e), None)
    jog = next((t for t, e in events if e.startswith("operator: jog")), None)
    jog_end = next((t for t, e in events if e.startswith("operator: jog ends")), None)
    summary.intervention_taken = taken is not None
    summary.intervention_released_after_s = None if taken is None or released is None else released - taken
    if jog is not None and jog_end is not None:
        window = [x for x in js if jog <= x[0] <= jog_end + 0.3]
        phase = Phase[summary.phase] if summary.phase in Phase.__members__ else Phase.SIM
        cap = np.asarray(limits.velocity_max_radps) * limits.scale_for(TrustLevel.SLOW, phase).speed
        if window:
            summary.teleop_peak_speed_ratio = float(max(np.max(np.abs(qd) / cap) for _, _, qd in window))
            summary.teleop_tool_rise_m = float(kin.tool_position_m(window[-1][1])[2] - kin.tool_position_m(window[0][1])[2])
    summary.passed = bool(summary.passed and summary.intervention_taken
                          and summary.intervention_released_after_s is not None
                          and summary.teleop_peak_speed_ratio is not None and summary.teleop_peak_speed_ratio <= 1.05
                          and (summary.teleop_tool_rise_m or 0.0) > 0.005)


class Hand:
    """The operator's take-over in the demo: take, jog the tool up 1.5 s (TwistStamped, base frame,
    through the policy node's teleop slot and the filter), let the deadman stop it, hand back at rest."""

    JOG_S, RISE_MPS = 1.5, 0.03

    def __init__(self, node, call) -> None:
        from geometry_msgs.msg import TwistStamped

        self.node, self.call = node, call  # call(node, srv_type, name, request): the demo's service call
        self.pub = node.create_publisher(TwistStamped, "/robot_wm/teleop/twist", 10)
        self.stage = "take"
        self._last_try = -1e9

    def step(self, t: float, mon) -> None:
        from geometry_msgs.msg import TwistStamped

        from robot_wm.srv import Intervention

        if self.stage == "take":
            resp = self.call(self.node, Intervention, "/robot_wm/intervention/take",
                         Intervention.Request(reason="demo: the operator moves the tool up by hand"))
            mon.event(f"operator: take over ({'accepted' if resp.success else 'refused'}: {resp.message})")
            self.stage = "wait" if resp.success else "done"
            self._t = t
        elif self.stage == "wait" and t - self._t >= 1.0:  # the policy's command is gone, the arm slows
            mon.event(f"operator: jog the tool up {self.RISE_MPS * 1e3:.0f} mm/s for {self.JOG_S:g} s "
                      "(teleop twist, base frame)")
            self.stage, self._t = "jog", t
        elif self.stage == "jog":
            if t - self._t < self.JOG_S:
                msg = TwistStamped()
                msg.header.stamp = self.node.get_clock().now().to_msg()
                msg.header.frame_id = "base_link"
                msg.twist.linear.z = self.RISE_MPS
                self.pub.publish(msg)
            else:
                mon.event("operator: jog ends (no more teleop messages: the deadman stops the arm)")
                self.stage, self._t = "release", t
        elif self.stage == "release" and t - self._last_try >= 0.5:
            self._last_try = t
            resp = self.call(self.node, Intervention, "/robot_wm/intervention/release",
                         Intervention.Request(reason="demo: tool clear, back to the policy"))
            if resp.success or t - self._t > 10.0:
                mon.event(f"operator: release ({'accepted' if resp.success else 'refused'}: {resp.message})")
                self.stage = "done"
