"""Safety limits of the CBF-QP filter: a frozen, validated record read from config/safety.yaml.

Every per-joint field follows the joint order of config/robot.yaml. Every field has a unit, a
valid range and a *loosening direction* (:data:`SCHEMA`): the change that makes the robot less
safe. Limits may only get safer at run time: :meth:`SafetyLimits.tighten` applies changes and
refuses any that loosens, naming the field, the old and new value and why. A ROS node declares
the fields of :data:`LOOSENING_FIELDS` (looser when increased) and :data:`LOOSENING_IF_DECREASED`
with a set-parameters callback that routes every change through ``tighten`` (or simply read-only).

Trust level and phase scale the speed and acceleration limits down (:meth:`SafetyLimits.scale_for`);
levels STOP and HUMAN give 0 = controlled stop. Level and phase values match msg/TrustState.msg.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np


class SafetyLimitsError(ValueError):
    """A safety limit is malformed, out of range, or a change would loosen safety; the message names it."""


class TrustLevel(IntEnum):
    """Autonomy levels, as the LEVEL_* constants of msg/TrustState.msg."""

    FULL = 0
    CAUTIOUS = 1
    SLOW = 2
    STOP = 3
    HUMAN = 4


class Phase(IntEnum):
    """Deployment phases, as the PHASE_* constants of msg/TrustState.msg."""

    SIM = 0
    MIXED = 1
    REAL = 2


class ScaleFactors(NamedTuple):
    """Factors on the speed limits (joint and tool) and on the acceleration limits; 0 = stop."""

    speed: float
    acceleration: float


@dataclass(frozen=True)
class FieldSpec:
    """Schema of one limit: kind, unit, inclusive range, the direction that loosens safety, meaning.

    ``loosens`` is ``"increase"`` (a larger value is less safe), ``"decrease"`` (a smaller value is
    less safe) or ``"shrink"`` (a set field: removing or shrinking an element is less safe).
    """

    kind: str  # "joints" | "scalar" | "int" | "levels" | "phases" | "boxes" | "spheres" | "frames"
    unit: str
    low: float
    high: float
    loosens: str
    doc: str
    low_open: bool = False  # value must be strictly greater than low


_INF = math.inf

#: Every field of SafetyLimits: unit, range, loosening direction and meaning (the node's parameter
#: descriptors and docs/safety_filter.md follow this table).
SCHEMA: dict[str, FieldSpec] = {
    "position_lower_rad": FieldSpec(
        "joints", "rad", -2 * math.pi, 2 * math.pi, "decrease",
        "soft lower joint limits (inside the URDF's); hard: never slacked"),
    "position_upper_rad": FieldSpec(
        "joints", "rad", -2 * math.pi, 2 * math.pi, "increase",
        "soft upper joint limits (inside the URDF's); hard: never slacked"),
    "velocity_max_radps": FieldSpec(
        "joints", "rad/s", 0.0, 10.0, "increase", "joint speed limits |u| <= v (<= the URDF's)", low_open=True),
    "acceleration_max_radps2": FieldSpec(
        "joints", "rad/s^2", 0.0, 100.0, "increase",
        "joint acceleration limits |u - qdot| <= a dt (speeding up is scaled by trust, braking is not)",
        low_open=True),
    "stop_deceleration_radps2": FieldSpec(
        "joints", "rad/s^2", 0.0, 100.0, "decrease",
        "deceleration of the controlled stop (>= brake_fraction * acceleration_max)", low_open=True),
    "brake_fraction": FieldSpec(
        "scalar", "-", 0.0, 1.0, "increase",
        "fraction of acceleration_max the joint-limit braking barrier assumes (margin for tracking lag)",
        low_open=True),
    "reaction_time_s": FieldSpec(
        "scalar", "s", 0.0, 1.0, "decrease",
        "time the joint-limit braking assumes a joint keeps its speed before a braking command bites "
        "(command latency + actuator lag; each period's input age is added)"),
    "tool_speed_max_mps": FieldSpec(
        "scalar", "m/s", 0.0, 3.0, "increase", "tool (tool0 origin) linear speed limit", low_open=True),
    "table_z_m": FieldSpec("scalar", "m", -2.0, 2.0, "decrease", "table plane height in the base frame"),
    "tool_clearance_m": FieldSpec(
        "scalar", "m", 0.0, 1.0, "decrease", "clearance of the tool point from the table and the keep-outs"),
    "link_clearance_m": FieldSpec(
        "scalar", "m", 0.0, 1.0, "decrease",
        "clearance of the monitored link points from the table and the keep-outs (covers link radius)"),
    "monitored_frames": FieldSpec(
        "frames", "", 0, 0, "shrink", "link frames whose origins are kept off the table and out of keep-outs"),
    "keepout_boxes_m": FieldSpec(
        "boxes", "m", -5.0, 5.0, "shrink",
        "keep-out boxes, base frame, flat: [xmin, ymin, zmin, xmax, ymax, zmax] per box"),
    "keepout_spheres_m": FieldSpec(
        "spheres", "m", -5.0, 5.0, "shrink", "keep-out spheres, base frame, flat: [cx, cy, cz, radius] per sphere"),
    "workspace_deceleration_mps2": FieldSpec(
        "scalar", "m/s^2", 0.0, 50.0, "increase",
        "deceleration the workspace barriers assume when approaching the table or a keep-out", low_open=True),
    "force_limit_n": FieldSpec("scalar", "N", 0.0, 500.0, "increase", "contact force limit", low_open=True),
    "force_onset_fraction": FieldSpec(
        "scalar", "-", 0.0, 1.0, "increase",
        "from |F| >= fraction * force_limit_n on, no tool motion into the contact", low_open=True),
    "cbf_alpha": FieldSpec(
        "scalar", "-", 0.0, 1.0, "increase", "CBF rate: h(x+) >= (1 - alpha) h(x) (1 = one-step)", low_open=True),
    "robustness_kappa": FieldSpec(
        "scalar", "-", 0.0, 10.0, "decrease", "barriers are tightened by kappa * (world model's predicted std)"),
    "stale_limit_periods": FieldSpec(
        "int", "periods", 0, 100, "increase", "inputs older than this many control periods -> stop (FAULT)"),
    "level_speed_scale": FieldSpec(
        "levels", "-", 0.0, 1.0, "increase", "speed factor for trust levels [FULL, CAUTIOUS, SLOW] (STOP/HUMAN: 0)",
        low_open=True),
    "level_accel_scale": FieldSpec(
        "levels", "-", 0.0, 1.0, "increase", "acceleration factor for [FULL, CAUTIOUS, SLOW]", low_open=True),
    "phase_speed_scale": FieldSpec(
        "phases", "-", 0.0, 1.0, "increase", "speed factor for phases [SIM, MIXED, REAL]", low_open=True),
    "phase_accel_scale": FieldSpec(
        "phases", "-", 0.0, 1.0, "increase", "acceleration factor for phases [SIM, MIXED, REAL]", low_open=True),
}

#: Fields that loosen safety when increased (make them read-only, or accept only decreases).
LOOSENING_FIELDS: tuple[str, ...] = tuple(k for k, s in SCHEMA.items() if s.loosens == "increase")
#: Fields that loosen safety when decreased (make them read-only, or accept only increases).
LOOSENING_IF_DECREASED: tuple[str, ...] = tuple(k for k, s in SCHEMA.items() if s.loosens == "decrease")
#: Set-valued fields: removing or shrinking an element loosens; adding or growing one tightens.
GROW_ONLY_FIELDS: tuple[str, ...] = tuple(k for k, s in SCHEMA.items() if s.loosens == "shrink")

_BOX_SIZE = 6
_SPHERE_SIZE = 4


def _number(name: str, value: Any, spec: FieldSpec, integer: bool = False) -> float | int:
    """Check one number against its spec; return it as float (or int)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise SafetyLimitsError(f"safety.{name}={value!r}: expected a number in {spec.unit or 'units'}")
    if integer and float(value) != int(value):
        raise SafetyLimitsError(f"safety.{name}={value!r}: expected an integer ({spec.unit})")
    x = float(value)
    low_ok = x > spec.low if spec.low_open else x >= spec.low
    if not (math.isfinite(x) and low_ok and x <= spec.high):
        bracket = "(" if spec.low_open else "["
        raise SafetyLimitsError(
            f"safety.{name}={value!r}: expected a finite value in "
            f"{bracket}{spec.low}, {spec.high}] {spec.unit}".rstrip()
        )
    return int(x) if integer else x


def _numbers(name: str, value: Any, spec: FieldSpec, length: int | None = None, multiple: int | None = None):
    if isinstance(value, (str, bytes)) or not isinstance(value, (Sequence, np.ndarray)):
        raise SafetyLimitsError(f"safety.{name}={value!r}: expected a list of numbers ({spec.unit})")
    items = list(value)
    if length is not None and len(items) != length:
        raise SafetyLimitsError(f"safety.{name} has {len(items)} values {items}: expected {length} ({spec.doc})")
    if multiple is not None and len(items) % multiple:
        raise SafetyLimitsError(
            f"safety.{name} has {len(items)} values: expected a multiple of {multiple} ({spec.doc})"
        )
    return tuple(_number(f"{name}[{i}]", v, spec) for i, v in enumerate(items))


@dataclass(frozen=True)
class SafetyLimits:
    """Limits of the safety filter (units in the names; see :data:`SCHEMA` for ranges and meaning).

    Lists given to the constructor are stored as tuples; every field is validated on construction
    and a bad value raises :class:`SafetyLimitsError` naming the field, the value and the expectation.
    """

    position_lower_rad: tuple[float, ...] = (-3.0, -3.0, -2.8, -3.0, -3.0, -3.0)
    position_upper_rad: tuple[float, ...] = (3.0, 0.0, 2.8, 3.0, 3.0, 3.0)
    velocity_max_radps: tuple[float, ...] = (1.5, 1.5, 1.5, 2.0, 2.0, 2.0)
    acceleration_max_radps2: tuple[float, ...] = (10.0, 10.0, 10.0, 15.0, 15.0, 15.0)
    stop_deceleration_radps2: tuple[float, ...] = (10.0, 10.0, 10.0, 15.0, 15.0, 15.0)
    brake_fraction: float = 0.5
    reaction_time_s: float = 0.02
    tool_speed_max_mps: float = 0.5
    table_z_m: float = 0.0
    tool_clearance_m: float = 0.05
    link_clearance_m: float = 0.08
    monitored_frames: tuple[str, ...] = ("forearm_link", "wrist_1_link", "wrist_2_link")
    keepout_boxes_m: tuple[float, ...] = ()
    keepout_spheres_m: tuple[float, ...] = ()
    workspace_deceleration_mps2: float = 2.0
    force_limit_n: float = 20.0
    force_onset_fraction: float = 0.7
    cbf_alpha: float = 0.5
    robustness_kappa: float = 2.0
    stale_limit_periods: int = 3
    level_speed_scale: tuple[float, float, float] = (1.0, 0.6, 0.3)
    level_accel_scale: tuple[float, float, float] = (1.0, 0.7, 0.5)
    phase_speed_scale: tuple[float, float, float] = (1.0, 0.5, 1.0)
    phase_accel_scale: tuple[float, float, float] = (1.0, 0.6, 1.0)

    def __post_init__(self) -> None:
        put = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731 (frozen dataclass)
        n = None
        for name, spec in SCHEMA.items():
            value = getattr(self, name)
            if spec.kind == "joints":
                vec = _numbers(name, value, spec, length=n)
                if not vec:
                    raise SafetyLimitsError(f"safety.{name} is empty: expected one value per joint")
                n = len(vec)
                put(name, vec)
            elif spec.kind == "scalar":
                put(name, _number(name, value, spec))
            elif spec.kind == "int":
                put(name, _number(name, value, spec, integer=True))
            elif spec.kind in ("levels", "phases"):
                vec = _numbers(name, value, spec, length=3)
                if spec.kind == "levels" and any(b > a for a, b in zip(vec, vec[1:])):
                    raise SafetyLimitsError(f"safety.{name}={list(vec)}: expected non-increasing factors "
                                            "(FULL >= CAUTIOUS >= SLOW)")
                if spec.kind == "phases" and vec[1] > min(vec[0], vec[2]):
                    # MIXED: the first runs on the real arm, an operator standing by: the tightest
                    raise SafetyLimitsError(f"safety.{name}={list(vec)}: expected MIXED no looser than SIM and "
                                            "REAL (MIXED <= SIM, MIXED <= REAL)")
                put(name, vec)
            elif spec.kind == "boxes":
                vec = _numbers(name, value, spec, multiple=_BOX_SIZE)
                for k in range(len(vec) // _BOX_SIZE):
                    lo, hi = vec[_BOX_SIZE * k:_BOX_SIZE * k + 3], vec[_BOX_SIZE * k + 3:_BOX_SIZE * (k + 1)]
                    if any(a >= b for a, b in zip(lo, hi)):
                        raise SafetyLimitsError(
                            f"safety.{name} box {k}: min {list(lo)} must be below max {list(hi)} on every axis"
                        )
                put(name, vec)
            elif spec.kind == "spheres":
                vec = _numbers(name, value, spec, multiple=_SPHERE_SIZE)
                for k in range(len(vec) // _SPHERE_SIZE):
                    if vec[_SPHERE_SIZE * k + 3] <= 0:
                        raise SafetyLimitsError(
                            f"safety.{name} sphere {k}: radius {vec[_SPHERE_SIZE * k + 3]}: expected > 0 m"
                        )
                put(name, vec)
            elif spec.kind == "frames":
                if isinstance(value, str) or not all(isinstance(f, str) and f for f in value):
                    raise SafetyLimitsError(f"safety.{name}={value!r}: expected a list of frame names")
                frames = tuple(value)
                if len(set(frames)) != len(frames):
                    raise SafetyLimitsError(f"safety.{name}={list(frames)}: frame names must be unique")
                put(name, frames)
        lo, hi = self.lower_rad, self.upper_rad
        bad = [f"joint {i}: [{a}, {b}]" for i, (a, b) in enumerate(zip(lo, hi)) if not a < b]
        if bad:
            raise SafetyLimitsError(f"safety.position_lower_rad must be below position_upper_rad: {', '.join(bad)}")
        if 2.0 * self.brake_fraction * (1.0 - self.cbf_alpha) > 1.0 + 1e-12:
            raise SafetyLimitsError(
                f"safety.brake_fraction={self.brake_fraction} with cbf_alpha={self.cbf_alpha}: expected "
                "2 * brake_fraction * (1 - cbf_alpha) <= 1 (otherwise approaching a joint limit can demand "
                "more deceleration than acceleration_max_radps2 allows; docs/safety_filter.md)"
            )
        slow = self.stop_decel_radps2 < self.brake_fraction * self.accel_max_radps2 - 1e-12
        if np.any(slow):
            i = int(np.argmax(slow))
            raise SafetyLimitsError(
                f"safety.stop_deceleration_radps2[{i}]={self.stop_deceleration_radps2[i]}: expected >= "
                f"brake_fraction * acceleration_max_radps2[{i}] = {self.brake_fraction * self.accel_max_radps2[i]:g} "
                "rad/s^2 (a controlled stop must brake at least as hard as the joint-limit barrier assumes)"
            )

    # ------------------------------------------------------------------ views
    @property
    def n_joints(self) -> int:
        """Number of joints the per-joint fields describe."""
        return len(self.position_lower_rad)

    @property
    def lower_rad(self) -> np.ndarray:
        """Soft lower joint limits as an array (rad)."""
        return np.array(self.position_lower_rad)

    @property
    def upper_rad(self) -> np.ndarray:
        """Soft upper joint limits as an array (rad)."""
        return np.array(self.position_upper_rad)

    @property
    def vel_max_radps(self) -> np.ndarray:
        """Joint speed limits as an array (rad/s)."""
        return np.array(self.velocity_max_radps)

    @property
    def accel_max_radps2(self) -> np.ndarray:
        """Joint acceleration limits as an array (rad/s²)."""
        return np.array(self.acceleration_max_radps2)

    @property
    def stop_decel_radps2(self) -> np.ndarray:
        """Controlled-stop decelerations as an array (rad/s²)."""
        return np.array(self.stop_deceleration_radps2)

    @property
    def boxes(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Keep-out boxes as (min corner, max corner) pairs, base frame (m)."""
        v = self.keepout_boxes_m
        return [(np.array(v[k:k + 3]), np.array(v[k + 3:k + 6])) for k in range(0, len(v), _BOX_SIZE)]

    @property
    def spheres(self) -> list[tuple[np.ndarray, float]]:
        """Keep-out spheres as (center, radius) pairs, base frame (m)."""
        v = self.keepout_spheres_m
        return [(np.array(v[k:k + 3]), float(v[k + 3])) for k in range(0, len(v), _SPHERE_SIZE)]

    def scale_for(self, level: int, phase: int) -> ScaleFactors:
        """Speed and acceleration factors for a trust level and a deployment phase.

        Args:
            level: a TrustLevel value (msg/TrustState.msg LEVEL_*).
            phase: a Phase value (msg/TrustState.msg PHASE_*).
        Returns:
            ScaleFactors in (0, 1] (level factor times phase factor); (0, 0) for STOP and HUMAN.
        Raises:
            SafetyLimitsError: unknown level or phase.
        """
        try:
            lvl, ph = TrustLevel(int(level)), Phase(int(phase))
        except (TypeError, ValueError) as exc:
            raise SafetyLimitsError(
                f"scale_for(level={level!r}, phase={phase!r}): expected level in "
                f"{[f'{x.name}={x.value}' for x in TrustLevel]} and phase in {[f'{x.name}={x.value}' for x in Phase]}"
            ) from exc
        if lvl in (TrustLevel.STOP, TrustLevel.HUMAN):
            return ScaleFactors(0.0, 0.0)
        return ScaleFactors(
            self.level_speed_scale[lvl] * self.phase_speed_scale[ph],
            self.level_accel_scale[lvl] * self.phase_accel_scale[ph],
        )

    # ------------------------------------------------------ run-time changes
    def loosening_reasons(self, other: "SafetyLimits") -> list[str]:
        """Every way ``other`` is less safe than ``self`` (empty: ``other`` is as safe or safer)."""
        reasons = []
        for name, spec in SCHEMA.items():
            old, new = getattr(self, name), getattr(other, name)
            if old == new:
                continue
            if spec.kind in ("joints", "levels", "phases", "scalar", "int"):
                olds = old if isinstance(old, tuple) else (old,)
                news = new if isinstance(new, tuple) else (new,)
                if len(olds) != len(news):
                    reasons.append(f"{name}: {len(olds)} -> {len(news)} values (the shape is fixed at start-up)")
                    continue
                for i, (a, b) in enumerate(zip(olds, news)):
                    where = f"{name}[{i}]" if isinstance(old, tuple) else name
                    if (spec.loosens == "increase" and b > a) or (spec.loosens == "decrease" and b < a):
                        reasons.append(f"{where}: {a} -> {b} loosens safety (a {spec.loosens} loosens this limit)")
            elif spec.kind == "frames":
                dropped = [f for f in old if f not in new]
                if dropped:
                    reasons.append(f"{name}: removing {dropped} loosens safety (frames may only be added)")
            elif spec.kind == "boxes":
                for k, (lo, hi) in enumerate(self.boxes):
                    if not any(np.all(nlo <= lo) and np.all(nhi >= hi) for nlo, nhi in other.boxes):
                        reasons.append(f"{name}: box {k} {list(lo)}..{list(hi)} is no longer covered by a keep-out box")
            elif spec.kind == "spheres":
                for k, (c, r) in enumerate(self.spheres):
                    if not any(np.linalg.norm(nc - c) + r <= nr + 1e-12 for nc, nr in other.spheres):
                        reasons.append(f"{name}: sphere {k} {list(c)} r={r} is no longer covered by a keep-out sphere")
        return reasons

    def tighten(self, **changes: Any) -> "SafetyLimits":
        """Return a copy with ``changes`` applied, refusing any change that loosens safety.

        Args:
            changes: field=value pairs (same units and shapes as the fields).
        Returns:
            The new, validated limits.
        Raises:
            SafetyLimitsError: an unknown field, an invalid value, or a loosening change (the message
                lists every loosening change; such limits are read-only at run time).
        """
        unknown = sorted(set(changes) - set(SCHEMA))
        if unknown:
            raise SafetyLimitsError(f"tighten: unknown safety fields {unknown}; known: {sorted(SCHEMA)}")
        new = dataclasses.replace(self, **changes)
        reasons = self.loosening_reasons(new)
        if reasons:
            raise SafetyLimitsError(
                "tighten refused: limits may only get safer at run time; " + "; ".join(reasons)
            )
        return new

    # ------------------------------------------------------------ checks
    def check_within(self, lower_rad: Sequence[float], upper_rad: Sequence[float],
                     velocity_radps: Sequence[float], joint_names: Sequence[str] | None = None) -> None:
        """Check that the soft limits lie within the robot description's (URDF) limits.

        Args:
            lower_rad, upper_rad, velocity_radps: the URDF's limits in the same joint order.
            joint_names: names used in the error message.
        Raises:
            SafetyLimitsError: naming the joint and both limits.
        """
        lo, hi, vel = (np.asarray(x, dtype=float) for x in (lower_rad, upper_rad, velocity_radps))
        n = self.n_joints
        if lo.shape != (n,) or hi.shape != (n,) or vel.shape != (n,):
            raise SafetyLimitsError(f"check_within: the description has {lo.shape[0]} joints, the safety limits {n}")
        names = list(joint_names) if joint_names is not None else [f"joint {i}" for i in range(n)]
        problems = []
        for i in range(n):
            if self.position_lower_rad[i] < lo[i] or self.position_upper_rad[i] > hi[i]:
                problems.append(
                    f"{names[i]}: soft limits [{self.position_lower_rad[i]}, {self.position_upper_rad[i]}] rad "
                    f"exceed the URDF's [{lo[i]:.6g}, {hi[i]:.6g}]"
                )
            if self.velocity_max_radps[i] > vel[i]:
                problems.append(
                    f"{names[i]}: velocity_max_radps {self.velocity_max_radps[i]} exceeds the URDF's {vel[i]:.6g} rad/s"
                )
        if problems:
            raise SafetyLimitsError("safety limits outside the robot description: " + "; ".join(problems))

    # ---------------------------------------------------------------- I/O
    def to_mapping(self) -> dict[str, Any]:
        """The fields as plain Python values (lists for tuples), e.g. for ROS parameters."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], source: str = "safety") -> "SafetyLimits":
        """Build from a mapping of field -> value, rejecting unknown fields by name."""
        if not isinstance(data, Mapping):
            raise SafetyLimitsError(f"{source}: expected a mapping of safety fields, got {type(data).__name__}")
        unknown = sorted(set(data) - set(SCHEMA))
        if unknown:
            raise SafetyLimitsError(f"{source}: unknown safety fields {unknown}; known: {sorted(SCHEMA)}")
        return cls(**dict(data))


def load_safety_limits(path: Path | str | None = None) -> SafetyLimits:
    """Read the limits from config/safety.yaml (ROS parameter format, key ``/**.ros__parameters.safety``).

    Args:
        path: the YAML file; default the package's config/safety.yaml.
    Raises:
        SafetyLimitsError: unreadable file, wrong layout, unknown field or invalid value (named).
    """
    import yaml

    from robot_wm.paths import config_path

    path = Path(path) if path is not None else config_path("safety.yaml")
    try:
        data = yaml.safe_load(path.read_text())
        section = data["/**"]["ros__parameters"]["safety"]
    except (OSError, yaml.YAMLError) as exc:
        raise SafetyLimitsError(f"{path}: cannot read the safety limits: {exc}") from exc
    except (KeyError, TypeError) as exc:
        raise SafetyLimitsError(f"{path}: expected a /** -> ros__parameters -> safety mapping") from exc
    return SafetyLimits.from_mapping(section, source=str(path))
