"""The payload the operator declared by a tare, for the trust monitor's effort model.

The safety filter publishes each tare that declares a payload (its first, and the first after an
operator's ``~/tare``: ``ForceTare.declared``) on ``/robot_wm/payload`` (latched; the mass only: one
pose at rest does not give the centre of mass). A payload mounted and tared is no
anomaly, but the effort model of normal operation does not know its mass, so its signal would hold
the arm at SLOW until a new calibration. ``TrustTracker.set_payload`` takes the dynamics of the
change off the measured efforts: a point mass at ``payload_com_m`` in the tool frame (the node
parameter; the integrator's declaration, as on most arms' payload settings). The message is kept
here and handed to the tracker on the period thread (the tracker is the period's alone), again to
each tracker a live calibration makes (a world-model swap keeps the tracker, its effort model and
the payload given). The first tare heard stands for the calibration's when its effort model does
not record one (a calibration made before payloads were recorded): a monitor restarted after a
re-tare then takes the payload on for the calibration's, and the effort signal holds the arm at
SLOW until a recalibration (the safe side). A change within ``TrustTracker.PAYLOAD_DEADBAND_KG``
is none (a tare's mass carries the sensor's bias along gravity at its pose). A payload picked up
without a tare is not declared: the effort signal still sees it.
"""
from __future__ import annotations

import math
import threading

from geometry_msgs.msg import InertiaStamped
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy

from robot_wm.core.trust.effort import PAYLOAD_RANGE_KG, plausible_payload
from robot_wm.nodes.params import declare

#: The safety filter's declared tares (start-up, ``~/tare``): ``inertia.m`` the payload's mass (kg), in
#: ``header.frame_id`` (the F/T frame); the centre of mass and inertia are not measured (zero).
#: Latched (transient local): a trust monitor started later hears the tare in force.
PAYLOAD_TOPIC = "/robot_wm/payload"
PAYLOAD_QOS = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)


class DeclaredPayload:
    """Listen for the filter's tares on ``node``; ``apply(tracker)`` once per period."""

    def __init__(self, node) -> None:
        com = declare(node, "payload_com_m", [0.0, 0.0, 0.0], "where a tared payload's centre of mass sits in the "
                      "tool frame (m; the F/T tare measures the mass only): its torques are taken off the efforts "
                      "the effort model judges (robot_wm.graph.plan sets the embedded arm's profile's)", read_only=True)
        if len(com) != 3 or not all(math.isfinite(float(c)) and abs(float(c)) <= 1.0 for c in com):
            from robot_wm.nodes.runner import NodeConfigError

            raise NodeConfigError(f"trust_monitor: parameter 'payload_com_m' = {list(com)}: expected [x, y, z] in m, "
                                  "each within 1 m of the tool frame")
        self.com_m = [float(c) for c in com]
        self._node = node
        self._lock = threading.Lock()
        self._heard: tuple[float, str] | None = None  # (kg, frame) of the latest tare
        self.first_kg: float | None = None  # the first tare heard (this process)
        self._applied: tuple | None = None  # (tracker, kg) last given
        self._applied_kg: float | None = None  # the tare last logged
        self.problem: str | None = None  # the latest message refused, for the diagnostics
        node.create_subscription(InertiaStamped, PAYLOAD_TOPIC, self._on_payload, PAYLOAD_QOS)

    def _on_payload(self, msg: InertiaStamped) -> None:
        kg = float(msg.inertia.m)
        if not plausible_payload(kg) or not msg.header.frame_id:
            lo, hi = PAYLOAD_RANGE_KG
            self.problem = (f"{PAYLOAD_TOPIC}: a tare of {msg.inertia.m!r} kg in frame {msg.header.frame_id!r} refused "
                            f"(expected {lo:g}..{hi:g} kg in the F/T sensor's frame); the last one is kept")
            self._node.get_logger().error(self.problem, throttle_duration_sec=5.0)
            return
        with self._lock:
            self._heard = (kg, msg.header.frame_id)
            if self.first_kg is None:
                self.first_kg = kg
        self.problem = None

    @property
    def kg(self) -> float | None:
        with self._lock:
            return None if self._heard is None else self._heard[0]

    def apply(self, tracker) -> None:
        """Give ``tracker`` the latest tare, if it has not had it (on the period thread)."""
        with self._lock:
            heard, first = self._heard, self.first_kg
        if heard is None or tracker is None or self._applied == (tracker, heard[0]):
            return
        self._applied = (tracker, heard[0])
        tracker.payload_com_m = self.com_m
        delta = tracker.set_payload(heard[0], first)
        if self._applied_kg != heard[0]:  # once per tare, not per tracker a calibration makes
            self._applied_kg = heard[0]
            self._node.get_logger().info(
                f"payload tared at {heard[0]:.2f} kg ({heard[1] or 'F/T frame'}): the effort model takes the torques of "
                f"{delta:+.2f} kg at {self.com_m} m in the tool frame off the efforts it judges")

    def diagnostics(self, tracker) -> dict[str, str]:
        if self.problem:
            return {"payload": self.problem}
        if self.kg is None:
            return {"payload": f"no tare heard on {PAYLOAD_TOPIC}"}
        delta = 0.0 if tracker is None else tracker.payload_delta_kg
        return {"payload": f"{self.kg:.2f} kg tared; {delta:+.2f} kg taken off the efforts judged"}


__all__ = ["PAYLOAD_QOS", "PAYLOAD_TOPIC", "DeclaredPayload"]
