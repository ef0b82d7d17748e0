"""ControllerConfig: how the SafetyController treats its inputs (the node's read-only parameters)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from robot_wm.core.safety.limits import Phase, TrustLevel
from robot_wm.core.safety.types import SLACK_FAMILIES
from robot_wm.core.safety.validate import as_scalar, as_vector

#: Time constant (s) of the low-pass on the measured velocity that judges standstill (tare, STOPPED).
STANDSTILL_TAU_S = 0.05


@dataclass(frozen=True)
class ControllerConfig:
    """How the controller treats its inputs (the node's read-only parameters).

    Attributes:
        dt_s: control period, s.
        model_dt_s: the world model's step, s (None: ``dt_s``), a whole number of periods. Longer than ``dt_s``: the model is
            linearized once per model step and aged in the periods between
            (``robot_wm.core.safety.multirate``).
        require_model: a missing or implausible world model is a FAULT (else: kinematic model).
        latch_stale: stale inputs latch like malformed ones (else: stop while stale).
        default_trust_level, default_phase: the trust level and phase before the first TrustState.
            STOP by default: a graph with a trust monitor must not move before it speaks; a graph
            without one sets the level it runs at explicitly.
        trust_timeout_s: a TrustState older than this is stale (controlled stop).
        force_sensor: True = the arm has a wrist F/T sensor: its wrench is required (missing or
            stale is a fault) and tared at rest. False = no sensor: the contact-force limit is off
            (the node warns at start).
        ft_frame: the frame the wrench must be given in.
        tare_window_s: readings at rest averaged into one tare.
        tare_max_bias_n, tare_max_payload_kg: plausibility bounds of a first tare (out of contact).
        tare_tolerance_n: a later tare is refused when the reading at rest differs from the current
            tare's by more than this (a contact, or a payload change: ``request_tare`` re-tares).
        payload_accel_tau_s: the payload's inertial force is added back to the contact force, its
            acceleration estimated from the measured joint state with the velocity's difference
            low-passed over this (s; ``wrench.PayloadAcceleration``); 0 = no compensation.
        standstill_radps: the arm is at rest when every |qdot| is below this, on the measured
            velocity low-passed over ``STANDSTILL_TAU_S`` (sensor noise of 0.01 rad/s per sample
            would otherwise keep a resting arm "moving" and refuse every tare).
        slack_tolerance: per soft family (tool_speed_mps, workspace_m, contact_force_mps), the
            slack beyond which a soft constraint counts as not kept.
        slack_time_s: a soft constraint not kept for longer than this is a latched FAULT.
        auto_enable: release the start latch by itself once the inputs allow it (the embedded-arm
            demo graph only; never on hardware); a trust latch set before that first enable is part
            of the start-up and goes with it once the trust level is a moving one.
    """

    dt_s: float
    model_dt_s: float | None = None
    require_model: bool = True
    latch_stale: bool = False
    default_trust_level: int = TrustLevel.STOP
    default_phase: int = Phase.REAL
    trust_timeout_s: float = 1.0
    force_sensor: bool = True
    ft_frame: str = "ft_sensor_link"
    tare_window_s: float = 0.3
    tare_max_bias_n: float = 10.0
    tare_max_payload_kg: float = 5.0
    tare_tolerance_n: float = 5.0
    payload_accel_tau_s: float = 0.02
    standstill_radps: float = 0.02
    slack_tolerance: tuple[float, float, float] = (0.05, 0.005, 0.02)
    slack_time_s: float = 0.1
    auto_enable: bool = False

    def __post_init__(self) -> None:
        def positive(name: str, high: float = math.inf) -> None:
            x = as_scalar(getattr(self, name))
            if x is None or not 0.0 < x <= high:
                raise ValueError(f"ControllerConfig.{name}={getattr(self, name)!r}: expected a number in (0, {high:g}]")

        positive("dt_s", 1.0)
        if self.model_dt_s is not None:
            m = as_scalar(self.model_dt_s)
            k = m / self.dt_s if m is not None else math.nan
            if m is None or not self.dt_s <= m <= 1.0 or abs(k - round(k)) > 1e-6 * k:
                raise ValueError(f"ControllerConfig.model_dt_s={self.model_dt_s!r}: expected the world model's step in "
                                 f"[dt_s={self.dt_s:g}, 1] s and a whole number of filter periods (a filter period "
                                 "longer than the model's step, or out of step with it, cannot use it)")
        for name in ("trust_timeout_s", "tare_window_s", "tare_max_bias_n", "tare_max_payload_kg", "tare_tolerance_n",
                     "standstill_radps", "slack_time_s"):
            positive(name)
        tau = as_scalar(self.payload_accel_tau_s)
        if tau is None or not 0.0 <= tau <= 1.0:
            raise ValueError(f"ControllerConfig.payload_accel_tau_s={self.payload_accel_tau_s!r}: expected a number in "
                             "[0, 1] s (0: no compensation of the payload's inertia)")
        for name, enum in (("default_trust_level", TrustLevel), ("default_phase", Phase)):
            try:
                object.__setattr__(self, name, enum(int(getattr(self, name))))
            except (TypeError, ValueError) as exc:
                raise ValueError(f"ControllerConfig.{name}={getattr(self, name)!r}: expected one of "
                                 f"{[f'{x.name}={x.value}' for x in enum]}") from exc
        tol = as_vector(self.slack_tolerance, len(SLACK_FAMILIES))
        if tol is None or np.any(tol < 0):
            raise ValueError(f"ControllerConfig.slack_tolerance={self.slack_tolerance!r}: expected "
                             f"{len(SLACK_FAMILIES)} values >= 0 for {SLACK_FAMILIES}")
        object.__setattr__(self, "slack_tolerance", tuple(float(x) for x in tol))



__all__ = ["STANDSTILL_TAU_S", "ControllerConfig"]
