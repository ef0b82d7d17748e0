"""Fault injection for ArmSim: pushes, payload changes, sensor freezes, noise bursts, latency spikes.

Every fault starts at the current sim time and lasts ``duration_s`` (0 = until :meth:`clear`).
One fault of each kind is active at a time: a new one replaces the previous one of its kind.
:meth:`FaultInjector.apply` takes the fields of the ``robot_wm/srv/InjectFault`` request, so the
ROS node's service handler is one call.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

if TYPE_CHECKING:  # import cycle: arm.py owns a FaultInjector
    from robot_wm.sim.arm import ArmSim

#: Fault kinds accepted by :meth:`FaultInjector.apply` (the InjectFault service's ``kind``).
FAULT_KINDS = ("push", "payload", "sensor_freeze", "sensor_noise", "latency", "clear")

MAX_PUSH_N = 2000.0
MAX_PAYLOAD_KG = 20.0
MAX_NOISE_STD = 1.0
MAX_LATENCY_S = 10.0
MAX_DURATION_S = 1e6

_NEVER = 2**62  # a step index no simulation reaches


class FaultError(ValueError):
    """A fault request is malformed (the message names the field, the value and what was expected)."""


@dataclass(frozen=True)
class ActiveFault:
    """A fault in effect: its kind, parameters, start and end (None: until cleared), sim time in s."""

    kind: str
    start_s: float
    end_s: float | None
    params: dict[str, Any] = field(default_factory=dict)


def _finite(name: str, value: Any, low: float, high: float, unit: str, low_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise FaultError(f"{name} = {value!r}: expected a number in {unit}")
    x = float(value)
    ok = math.isfinite(x) and (x > low if low_open else x >= low) and x <= high
    if not ok:
        bracket = "(" if low_open else "["
        raise FaultError(f"{name} = {value!r}: expected a finite value in {bracket}{low:g}, {high:g}] {unit}")
    return x


def _duration(duration_s: Any) -> float:
    return _finite("duration_s", duration_s, 0.0, MAX_DURATION_S, "s (0 = until clear)")


class FaultInjector:
    """Injects faults into one ArmSim (``sim.faults``); all times are sim time."""

    def __init__(self, sim: "ArmSim") -> None:
        """Attach to a simulator (ArmSim creates its own injector)."""
        self._sim = sim
        self._active: dict[str, tuple[int, int, ActiveFault]] = {}  # kind -> (start_step, end_step, fault)
        self._frozen: Any = None

    # ------------------------------------------------------------- public API
    def push(self, force_n: Sequence[float], duration_s: float = 0.0) -> str:
        """Push the tool: a force at the tool0 origin, in the base frame, for a duration.

        Args:
            force_n: ``[fx, fy, fz]`` in N (base frame).
            duration_s: how long, s (0 = until clear).
        Returns:
            A one-line description of the fault now in effect.
        """
        try:
            f = np.asarray(force_n, dtype=float)
        except (TypeError, ValueError):
            raise FaultError(f"force_n = {force_n!r}: expected 3 numbers [fx, fy, fz] in N (base frame)") from None
        if f.shape != (3,):
            raise FaultError(f"force_n = {force_n!r}: expected exactly 3 values [fx, fy, fz] in N (base frame)")
        if not np.all(np.isfinite(f)) or np.linalg.norm(f) > MAX_PUSH_N:
            raise FaultError(f"force_n = {f.tolist()}: expected finite values with |force| <= {MAX_PUSH_N:g} N")
        duration = _duration(duration_s)
        self._sim._set_push_force(f)
        return self._start("push", duration, force_n=f.tolist())

    def payload(self, payload_kg: float, duration_s: float = 0.0) -> str:
        """Add a payload at the tool (on top of the profile's), effective immediately.

        Args:
            payload_kg: extra mass in kg (0 removes the extra payload); at the profile's payload CoM.
            duration_s: how long, s (0 = until clear).
        Returns:
            A one-line description of the fault now in effect.
        """
        kg = _finite("payload_kg", payload_kg, 0.0, MAX_PAYLOAD_KG, "kg")
        duration = _duration(duration_s)
        self._sim._set_extra_payload(kg)
        return self._start("payload", duration, payload_kg=kg)

    def sensor_freeze(self, duration_s: float = 0.0) -> str:
        """Freeze the measured joint state and wrench at their current values for a duration.

        Args:
            duration_s: how long, s (0 = until clear); stamps keep advancing.
        Returns:
            A one-line description of the fault now in effect.
        """
        duration = _duration(duration_s)
        self._frozen = None
        self._frozen = self._sim._measurement_snapshot()
        return self._start("sensor_freeze", duration)

    def sensor_noise(self, noise_std: float, duration_s: float = 0.0) -> str:
        """Add a burst of white noise to the measured joints: std in rad on positions, rad/s on velocities.

        Args:
            noise_std: extra standard deviation (added in quadrature to the profile's).
            duration_s: how long, s (0 = until clear).
        Returns:
            A one-line description of the fault now in effect.
        """
        std = _finite("noise_std", noise_std, 0.0, MAX_NOISE_STD, "rad (positions) / rad/s (velocities)")
        duration = _duration(duration_s)
        return self._start("sensor_noise", duration, noise_std=std)

    def latency(self, latency_s: float, duration_s: float = 0.0) -> str:
        """Add command latency: commands set during the spike reach the drive ``latency_s`` later.

        Args:
            latency_s: extra delay, s (> 0), on top of the profile's command latency.
            duration_s: how long, s (0 = until clear).
        Returns:
            A one-line description of the fault now in effect.
        """
        lat = _finite("latency_s", latency_s, 0.0, MAX_LATENCY_S, "s", low_open=True)
        duration = _duration(duration_s)
        return self._start("latency", duration, latency_s=lat)

    def clear(self) -> str:
        """End every fault now (payload back to the profile's, push removed, sensors live)."""
        for kind in list(self._active):
            self._end(kind)
        return "cleared all faults"

    def apply(
        self,
        kind: str,
        *,
        force_n: Sequence[float] | None = None,
        duration_s: float = 0.0,
        payload_kg: float = 0.0,
        noise_std: float = 0.0,
        latency_s: float = 0.0,
    ) -> str:
        """Apply a fault described by the InjectFault service fields, dispatching on ``kind``.

        Args:
            kind: one of ``FAULT_KINDS``.
            force_n: push force [fx, fy, fz], N, base frame (kind "push").
            duration_s: duration, s (0 = until clear).
            payload_kg: extra payload, kg (kind "payload").
            noise_std: extra noise std (kind "sensor_noise").
            latency_s: extra command latency, s (kind "latency").
        Returns:
            A one-line description, suitable for the service response message.
        Raises:
            ValueError: unknown kind (FaultError for malformed fields).
        """
        if kind == "push":
            return self.push([] if force_n is None else force_n, duration_s)
        if kind == "payload":
            return self.payload(payload_kg, duration_s)
        if kind == "sensor_freeze":
            return self.sensor_freeze(duration_s)
        if kind == "sensor_noise":
            return self.sensor_noise(noise_std, duration_s)
        if kind == "latency":
            return self.latency(latency_s, duration_s)
        if kind == "clear":
            return self.clear()
        raise ValueError(f"kind = {kind!r}: expected one of {list(FAULT_KINDS)}")

    @property
    def active(self) -> dict[str, ActiveFault]:
        """The faults in effect now, by kind."""
        now = self._sim._now_step()
        return {k: f for k, (_, end, f) in self._active.items() if end > now}

    # ------------------------------------------------ queries used by ArmSim
    def extra_noise_std(self) -> float:
        """Extra measurement noise std from an active noise burst (0 if none)."""
        fault = self._live("sensor_noise")
        return fault.params["noise_std"] if fault else 0.0

    def extra_latency_steps(self) -> int:
        """Extra command delay from an active latency spike, in physics steps (0 if none)."""
        fault = self._live("latency")
        if fault is None:
            return 0
        return max(1, int(round(fault.params["latency_s"] / self._sim.dt_s)))

    def frozen_measurement(self) -> Any:
        """The measurement snapshot while a sensor freeze is active, else None."""
        return self._frozen if self._live("sensor_freeze") else None

    def next_event_step(self, now: int) -> int:
        """The next step index at which a fault ends (a huge number if none)."""
        if not self._active:
            return _NEVER
        ends = [end for (_, end, _) in self._active.values() if end > now]
        return min(ends, default=_NEVER)

    def expire(self, now: int) -> bool:
        """End the faults whose time is up; return True if any ended."""
        if not self._active:
            return False
        done = [k for k, (_, end, _) in self._active.items() if end <= now]
        for kind in done:
            self._end(kind)
        return bool(done)

    # --------------------------------------------------------------- helpers
    def _live(self, kind: str) -> ActiveFault | None:
        if not self._active:
            return None
        entry = self._active.get(kind)
        if entry is None or entry[1] <= self._sim._now_step():
            return None
        return entry[2]

    def _start(self, kind: str, duration_s: float, **params: Any) -> str:
        now = self._sim._now_step()
        dt = self._sim.dt_s
        if duration_s > 0.0:
            end_step = now + max(1, int(round(duration_s / dt)))
            end_s: float | None = end_step * dt
        else:
            end_step, end_s = _NEVER, None
        fault = ActiveFault(kind=kind, start_s=now * dt, end_s=end_s, params=params)
        self._active[kind] = (now, end_step, fault)
        detail = ", ".join(f"{k}={v}" for k, v in params.items())
        until = "until clear" if end_s is None else f"until t={end_s:.3f} s"
        return f"{kind}{' (' + detail + ')' if detail else ''} from t={now * dt:.3f} s {until}"

    def _end(self, kind: str) -> None:
        self._active.pop(kind, None)
        if kind == "push":
            self._sim._set_push_force(np.zeros(3))
        elif kind == "payload":
            self._sim._set_extra_payload(0.0)
        elif kind == "sensor_freeze":
            self._frozen = None
