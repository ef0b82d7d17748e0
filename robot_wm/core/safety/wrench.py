"""The wrist force/torque sensor: tare (bias and payload weight) and the contact force in the base frame.

A wrist F/T sensor reads, in its own frame,

    F_s = b_s + R_bsᵀ w_b + R_bsᵀ F_contact,     w_b = (0, 0, −m g)

with a constant sensor bias ``b_s`` (a property of the sensor: stored in the SENSOR frame), the
weight of whatever hangs below it (payload mass ``m``; a constant vector in the BASE frame) and the
contact force the safety filter wants. The tare estimates ``b_s`` and ``m`` from readings taken
**at rest** (measured joint speeds below the standstill threshold, zero command) and **out of
contact**. From one pose the split is: the reading's component along gravity is the payload's
weight, the rest is bias. Out of contact is checked by plausibility: a tare is refused when the
implied payload mass is negative or above ``max_payload_kg`` (a push from below or above), or the
implied bias exceeds ``max_bias_n`` (a sideways contact). The filter takes tares only while a
latch holds the arm (at start-up, after an e-stop or fault) — the operator's reset is the
statement that the arm is free — and never while it moves under the policy. Once a tare exists, a
new one is taken only when the reading at rest agrees with the current tare (a contact pressing
from above would otherwise pass as a heavier payload); after a payload change the operator
re-tares (``ForceTare.forget`` via the node's ``~/tare`` service, while latched).

While the arm moves, the payload's own inertia reads as force too: ``F_s`` above holds at rest;
moving, the sensor carries ``− m a`` more (``a``: the payload's acceleration, base frame). A 2.5 kg
tool tracking a path at 0.45 m/s read up to 29 N of "contact" this way and the filter stopped the
arm on a 20 N limit it never touched (worn_heavy, 32 episodes: 75 stop periods, the filter active in
6.9 % of all periods). ``PayloadAcceleration`` estimates ``a`` as the F/T frame's linear
acceleration from the measured joint state (pinocchio, ``J q̈ + J̇ q̇``, with ``q̈`` the measured
velocity's difference low-passed over ``tau_s``) and the contact force adds ``m a`` back
(``ControllerConfig.payload_accel_tau_s``; 0 turns it off). The estimate lags the true acceleration
by about ``tau_s``: for that long after a sudden change the error
is about ``m (a_est − a)``; an impact while the tool was accelerating into the surface reads up to
``m a_before`` weaker for about ``tau_s`` than without the compensation, then right. The mass is
the tare's (its single-pose split puts the bias's component along gravity into it: at most
``tare_max_bias_n / g``; never below zero here), and the acceleration is the sensor frame's, not
the payload's centre of mass: a tool whose mass sits off the sensor's axis adds ``m (α × r + ω × (ω
× r))`` unmodelled (a few N for 0.1 m at fast wrist rotations).

Known limit: a payload picked up or dropped while running reads as a contact force (the F/T
sensor cannot tell them apart); re-tare by an e-stop, ``~/tare`` and a reset at rest.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

GRAVITY_MPS2 = 9.81
_EZ = np.array([0.0, 0.0, 1.0])


@dataclass(frozen=True)
class Tare:
    """One accepted tare: sensor bias (sensor frame, N) and payload mass (kg)."""

    bias_sensor_n: np.ndarray
    payload_kg: float

    def contact_force_base(self, force_sensor_n: np.ndarray, rot_base_sensor: np.ndarray) -> np.ndarray:
        """The contact force on the tool in the base frame (N): bias and payload weight removed."""
        return rot_base_sensor @ (force_sensor_n - self.bias_sensor_n) + self.payload_kg * GRAVITY_MPS2 * _EZ


def estimate_tare(force_sensor_n: np.ndarray, rot_base_sensor: np.ndarray) -> Tare:
    """Split one at-rest reading into payload weight (along gravity) and sensor bias (the rest)."""
    c = -(rot_base_sensor.T @ _EZ)  # unit direction of gravity in the sensor frame
    along = float(force_sensor_n @ c)
    return Tare(bias_sensor_n=force_sensor_n - along * c, payload_kg=along / GRAVITY_MPS2)


class ForceTare:
    """Collects at-rest readings into tares and keeps the latest plausible one.

    Args:
        window_periods: readings averaged into one tare (e.g. 0.3 s of control periods).
        max_bias_n: largest plausible sensor bias (N); a larger one means a sideways contact.
        max_payload_kg: largest plausible payload; a heavier one means a push from above.
        mass_tolerance_kg: how far below zero the implied payload may be (noise); more means a push
            from below (e.g. resting on the table).
        change_tolerance_n: once a tare exists, a new one is taken only when the reading at rest
            is within this of what the current tare predicts (a contact pushing from above would
            otherwise pass as payload); ``forget`` lets an operator re-tare after a payload change.
    """

    def __init__(self, window_periods: int, max_bias_n: float = 10.0, max_payload_kg: float = 5.0,
                 mass_tolerance_kg: float = 0.3, change_tolerance_n: float = 5.0) -> None:
        if window_periods < 1:
            raise ValueError(f"window_periods={window_periods!r}: expected >= 1")
        self.window_periods = int(window_periods)
        self.max_bias_n = float(max_bias_n)
        self.max_payload_kg = float(max_payload_kg)
        self.mass_tolerance_kg = float(mass_tolerance_kg)
        self.change_tolerance_n = float(change_tolerance_n)
        self.tare: Tare | None = None
        #: the last tare taken fresh (the first, or the first after ``forget``: an operator's re-tare), what a
        #: payload change is declared by; the refreshes of a resting arm (within change_tolerance_n) keep it
        self.declared: Tare | None = None
        self.last_refusal = ""
        self.tares_taken = 0
        self._sum = np.zeros(3)
        self._count = 0
        self._rot = np.eye(3)

    @property
    def ready(self) -> bool:
        """True once a plausible tare exists."""
        return self.tare is not None

    def forget(self) -> None:
        """Drop the tare (an operator's re-tare): the next rest window takes a new one."""
        self.tare = None
        self.last_refusal = ""
        self._sum[:] = 0.0
        self._count = 0

    def observe(self, force_sensor_n: np.ndarray, rot_base_sensor: np.ndarray, at_rest: bool) -> None:
        """Add one reading; ``at_rest`` False (moving, commanded, stale) restarts the window."""
        if not at_rest:
            self._sum[:] = 0.0
            self._count = 0
            return
        self._sum += force_sensor_n
        self._count += 1
        self._rot = rot_base_sensor
        if self._count >= self.window_periods:
            self._take(self._sum / self._count, self._rot.copy())
            self._sum[:] = 0.0
            self._count = 0

    def _take(self, mean_force_n: np.ndarray, rot: np.ndarray) -> None:
        cand = estimate_tare(mean_force_n, rot)
        bias = float(np.linalg.norm(cand.bias_sensor_n))
        change = 0.0 if self.tare is None else float(np.linalg.norm(self.tare.contact_force_base(mean_force_n, rot)))
        if change > self.change_tolerance_n:
            self.last_refusal = (f"tare refused: the reading at rest differs from the current tare by {change:.1f} N "
                                 f"(> {self.change_tolerance_n:g} N): a contact? (a payload change: re-tare)")
        elif cand.payload_kg < -self.mass_tolerance_kg or cand.payload_kg > self.max_payload_kg:
            self.last_refusal = (f"tare refused: the reading at rest implies a payload of {cand.payload_kg:.2f} kg "
                                 f"(expected 0..{self.max_payload_kg:g} kg): contact from below or above?")
        elif bias > self.max_bias_n:
            self.last_refusal = (f"tare refused: the reading at rest implies a sensor bias of {bias:.1f} N "
                                 f"(at most {self.max_bias_n:g} N): a sideways contact?")
        else:
            if self.tare is None:
                self.declared = cand
            self.tare = cand
            self.tares_taken += 1
            self.last_refusal = ""


class PayloadAcceleration:
    """The F/T frame's linear acceleration in the base frame (m/s²) from the measured joint state.

    ``q̈`` is the measured velocity's difference between two joint samples, low-passed to first
    order over ``tau_s`` (sensor noise of 0.01 rad/s per sample differenced at 100 Hz is 1.4 rad/s²)
    and clamped to ``±qdd_max_radps2`` (what the drives can do: a noisy or faulty velocity sensor
    cannot make up more inertial force than that). A sample whose velocity jumped by more than
    ``qdd_max_radps2`` allows since the last one taken is held back once (a glitch: the estimate
    and the reference stay; the next sample is differenced against the last good one); a second
    such sample in a row is taken (the arm really changed speed: a hit). The frame's classical
    acceleration ``J q̈ + J̇ q̇`` comes from pinocchio. A gap longer than ``max_gap_s``, a stamp
    going back or ``reset`` restarts the estimate from zero; a repeated stamp (the same sample
    again) leaves it as it is.
    """

    def __init__(self, kinematics, frame: str, tau_s: float, max_gap_s: float, qdd_max_radps2) -> None:
        self.kin, self.frame = kinematics, frame
        self.tau_s, self.max_gap_s = float(tau_s), float(max_gap_s)
        self.qdd_max = np.broadcast_to(np.asarray(qdd_max_radps2, dtype=float), (len(kinematics.joint_names),)).copy()
        self.reset()

    def reset(self) -> None:
        self._t: float | None = None
        self._qd: np.ndarray | None = None
        self._held = False
        self.glitches = 0  # samples held back as glitches, in all
        self.qdd = np.zeros(len(self.kin.joint_names))

    def update(self, t_s: float, q_rad: np.ndarray, qd_radps: np.ndarray) -> np.ndarray:
        """Take one joint sample (stamp ``t_s``); return the frame's acceleration now (m/s², base frame)."""
        qd = np.asarray(qd_radps, dtype=float)
        t = float(t_s)
        if t == self._t:  # the same sample again (no newer joint state this period): nothing new
            return self.kin.frame_linear_acceleration(q_rad, self._qd, self.qdd, self.frame)
        if self._t is not None and self._t < t <= self._t + self.max_gap_s:
            h = t - self._t
            if not self._held and np.any(np.abs(qd - self._qd) > self.qdd_max * h):
                self._held = True  # a glitch until the next sample says otherwise
                self.glitches += 1
                return self.kin.frame_linear_acceleration(q_rad, self._qd, self.qdd, self.frame)
            self._held = False
            self.qdd += h / (self.tau_s + h) * ((qd - self._qd) / h - self.qdd)
            np.clip(self.qdd, -self.qdd_max, self.qdd_max, out=self.qdd)
        else:  # the first sample, a gap or a stamp going back: start again
            self._held = False
            self.qdd[:] = 0.0
        self._t, self._qd = t, qd.copy()
        return self.kin.frame_linear_acceleration(q_rad, qd, self.qdd, self.frame)
