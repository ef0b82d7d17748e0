"""Dynamics profiles of the simulated arm: the ways one arm (or its simulator) differs from another.

A :class:`DynamicsProfile` is a frozen, validated record. ``nominal`` is the ideal simulator (no
friction, exact masses, no lag, latency or noise); ``real_twin`` differs the way a real arm differs
from its simulator. Profiles are YAML files (``config/sim_profiles/<name>.yaml``, schema in
``docs/sim_profiles.md``); fields a file omits take the nominal value. :func:`sample_profile` draws
profiles for domain randomization over exactly these fields.

Per-joint fields are in the joint order of the description (``robot_wm.contracts.JOINT_NAMES``).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from robot_wm.contracts import N_JOINTS
from robot_wm.paths import data_path

#: The moving links, child of each joint in JOINT_NAMES (the order of ``link_mass_scale``).
LINK_NAMES = (
    "shoulder_link",
    "upper_arm_link",
    "forearm_link",
    "wrist_1_link",
    "wrist_2_link",
    "wrist_3_link",
)

#: Largest command latency a profile may ask for; the model's control history is sized for it, so
#: that every profile compiles to the same MjData layout (batched environments need that).
MAX_COMMAND_LATENCY_S = 0.1
#: Largest actuator lag a profile may ask for (same reason).
MAX_ACTUATOR_LAG_S = 0.1

PROFILE_DIR = ("config", "sim_profiles")


class ProfileError(ValueError):
    """A dynamics profile (file, mapping or randomization range) is malformed."""


@dataclass(frozen=True)
class _Field:
    """Schema of one profile field: its kind, unit, bounds and meaning."""

    kind: str  # "str" | "scalar" | "joints" | "vec3" | "links"
    unit: str
    low: float
    high: float
    doc: str
    low_open: bool = False  # True: value must be strictly greater than low


#: The profile schema: validation, randomization and the table in docs/sim_profiles.md follow it.
SCHEMA: dict[str, _Field] = {
    "name": _Field("str", "", 0, 0, "profile name (defaults to the file name)"),
    "description": _Field("str", "", 0, 0, "free text: what this profile stands for"),
    "coulomb_friction_nm": _Field(
        "joints", "N·m", 0.0, 1000.0, "Coulomb (dry) joint friction torque; it also holds the joint at rest"
    ),
    "viscous_damping_nms": _Field("joints", "N·m·s/rad", 0.0, 1000.0, "viscous joint damping"),
    "armature_kgm2": _Field(
        "joints", "kg·m²", 0.0, 10.0, "reflected rotor inertia of each drive (the 1 ms loop needs it)", low_open=True
    ),
    "link_mass_scale": _Field(
        "links", "-", 0.0, 10.0, "mass and inertia scale of each moving link: a number, 6 numbers or {link: scale}",
        low_open=True,
    ),
    "payload_kg": _Field("scalar", "kg", 0.0, 20.0, "payload mass mounted on the flange, unknown to the drive"),
    "payload_com_m": _Field("vec3", "m", -1.0, 1.0, "payload centre of mass in the tool0 frame"),
    "actuator_lag_s": _Field(
        "scalar", "s", 0.0, MAX_ACTUATOR_LAG_S, "first-order lag of each drive's velocity reference"
    ),
    "command_latency_s": _Field(
        "scalar", "s", 0.0, MAX_COMMAND_LATENCY_S, "dead time between set_command and the drive acting on it"
    ),
    "position_noise_std_rad": _Field("scalar", "rad", 0.0, 1.0, "std of white noise on measured joint positions"),
    "velocity_noise_std_radps": _Field("scalar", "rad/s", 0.0, 10.0, "std of white noise on measured joint velocities"),
    "effort_noise_std_nm": _Field("scalar", "N·m", 0.0, 100.0, "std of white noise on measured joint efforts"),
    "force_noise_std_n": _Field("scalar", "N", 0.0, 100.0, "std of white noise on measured F/T forces"),
    "torque_noise_std_nm": _Field("scalar", "N·m", 0.0, 10.0, "std of white noise on measured F/T torques"),
    "encoder_offset_rad": _Field("joints", "rad", -0.5, 0.5, "constant error of each measured joint position"),
    "force_bias_n": _Field("vec3", "N", -100.0, 100.0, "constant bias of the measured F/T force (sensor frame)"),
    "torque_bias_nm": _Field("vec3", "N·m", -10.0, 10.0, "constant bias of the measured F/T torque (sensor frame)"),
    "velocity_gain_nms": _Field(
        "joints", "N·m·s/rad", 0.0, 1e5, "proportional gain kv of each drive's velocity loop", low_open=True
    ),
    "integral_gain_nm_per_rad": _Field(
        "joints", "N·m/rad", 0.0, 1e7, "integral gain ki of the velocity loop (on the integrated velocity error)"
    ),
    "integral_limit_nm": _Field(
        "joints", "N·m", 0.0, 1000.0, "largest torque the integral term may contribute (anti-windup)"
    ),
    "stop_deceleration_radps2": _Field(
        "joints", "rad/s²", 0.0, 1000.0, "deceleration of the driver's controlled stop (timeout, rejected command)",
        low_open=True,
    ),
}


def _joints(*values: float) -> tuple[float, ...]:
    return tuple(float(v) for v in values)


@dataclass(frozen=True)
class DynamicsProfile:
    """How the simulated arm behaves: friction, masses, payload, drive lag/latency/gains, sensor errors.

    The defaults are the ``nominal`` profile (the ideal simulator). Every field is validated on
    construction; per-joint fields are tuples in ``JOINT_NAMES`` order. See ``SCHEMA`` for units.
    """

    name: str = "nominal"
    description: str = "ideal simulator: URDF masses, no friction, no lag, latency or sensor noise"
    coulomb_friction_nm: tuple[float, ...] = _joints(0, 0, 0, 0, 0, 0)
    viscous_damping_nms: tuple[float, ...] = _joints(0, 0, 0, 0, 0, 0)
    armature_kgm2: tuple[float, ...] = _joints(0.1, 0.1, 0.1, 0.1, 0.1, 0.1)
    link_mass_scale: tuple[float, ...] = _joints(1, 1, 1, 1, 1, 1)
    payload_kg: float = 0.0
    payload_com_m: tuple[float, float, float] = (0.0, 0.0, 0.0)
    actuator_lag_s: float = 0.0
    command_latency_s: float = 0.0
    position_noise_std_rad: float = 0.0
    velocity_noise_std_radps: float = 0.0
    effort_noise_std_nm: float = 0.0
    force_noise_std_n: float = 0.0
    torque_noise_std_nm: float = 0.0
    encoder_offset_rad: tuple[float, ...] = _joints(0, 0, 0, 0, 0, 0)
    force_bias_n: tuple[float, float, float] = (0.0, 0.0, 0.0)
    torque_bias_nm: tuple[float, float, float] = (0.0, 0.0, 0.0)
    # Drive tuning: kv = 500 M gives a 2 ms velocity loop at each joint's largest inertia M
    # (armature included); ki = kv^2 / (8 M) holds a 1 N·m unmodeled load at the wrist within
    # 0.3 mrad; the integral term may supply about a fifth of each joint's effort limit.
    velocity_gain_nms: tuple[float, ...] = _joints(2000, 2000, 450, 60, 52, 50)
    integral_gain_nm_per_rad: tuple[float, ...] = _joints(120000, 120000, 28000, 3600, 3200, 3100)
    integral_limit_nm: tuple[float, ...] = _joints(30, 30, 30, 6, 6, 6)
    stop_deceleration_radps2: tuple[float, ...] = _joints(10, 10, 10, 10, 10, 10)

    def __post_init__(self) -> None:
        for f in fields(self):
            object.__setattr__(self, f.name, _coerce(f.name, getattr(self, f.name), "DynamicsProfile"))

    def to_dict(self) -> dict[str, Any]:
        """Return the profile as plain YAML-ready types (lists and floats)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    def replace(self, **changes: Any) -> "DynamicsProfile":
        """Return a copy with some fields changed (validated like any profile)."""
        unknown = sorted(set(changes) - set(SCHEMA))
        if unknown:
            raise ProfileError(f"DynamicsProfile.replace: unknown fields {unknown}; known fields: {sorted(SCHEMA)}")
        return dataclasses.replace(self, **changes)

    def randomized(
        self, rng: np.random.Generator, ranges: Mapping[str, Any], name: str | None = None
    ) -> "DynamicsProfile":
        """Return a copy with the fields in ``ranges`` drawn uniformly (see :func:`sample_profile`)."""
        return sample_profile(rng, ranges, base=self, name=name)


def _fail(source: str, name: str, value: Any, expected: str) -> ProfileError:
    return ProfileError(f"{source}: field {name!r} = {value!r}: expected {expected}")


def _number(source: str, name: str, value: Any, spec: _Field, whole: Any = None) -> float:
    """Check one number against its field's bounds; ``whole`` is the field value reported on error."""
    shown = value if whole is None else whole
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise _fail(source, name, shown, f"a number in {spec.unit or 'no unit'}")
    x = float(value)
    if not math.isfinite(x):
        raise _fail(source, name, shown, "a finite number")
    lo_ok = x > spec.low if spec.low_open else x >= spec.low
    if not lo_ok or x > spec.high:
        bracket = "(" if spec.low_open else "["
        raise _fail(source, name, shown, f"values in {bracket}{spec.low:g}, {spec.high:g}] {spec.unit}".rstrip())
    return x


def _vector(source: str, name: str, value: Any, spec: _Field, n: int, allow_scalar: bool) -> tuple[float, ...]:
    if allow_scalar and not isinstance(value, (list, tuple, np.ndarray, Mapping, str)):
        x = _number(source, name, value, spec)
        return tuple([x] * n)
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if not isinstance(value, (list, tuple)):
        what = f"a number or a list of {n} numbers" if allow_scalar else f"a list of {n} numbers"
        raise _fail(source, name, value, f"{what} in {spec.unit}")
    if len(value) != n:
        per = "joint" if n == N_JOINTS else "axis"
        raise _fail(source, name, value, f"exactly {n} values (one per {per}), got {len(value)}")
    return tuple(_number(source, name, v, spec, whole=value) for v in value)


def _coerce(name: str, value: Any, source: str) -> Any:
    """Validate one field value and return it normalized (tuples of floats); raise ProfileError."""
    spec = SCHEMA[name]
    if spec.kind == "str":
        if not isinstance(value, str):
            raise _fail(source, name, value, "a string")
        if name == "name" and not value.strip():
            raise _fail(source, name, value, "a non-empty name")
        return value
    if spec.kind == "scalar":
        return _number(source, name, value, spec)
    if spec.kind == "vec3":
        return _vector(source, name, value, spec, 3, allow_scalar=False)
    if spec.kind == "joints":
        return _vector(source, name, value, spec, N_JOINTS, allow_scalar=True)
    if spec.kind == "links":
        if isinstance(value, Mapping):
            unknown = sorted(str(k) for k in value if k not in LINK_NAMES)
            if unknown:
                raise _fail(source, name, dict(value), f"link names from {list(LINK_NAMES)}, not {unknown}")
            return tuple(_number(source, name, value.get(link, 1.0), spec, whole=dict(value)) for link in LINK_NAMES)
        return _vector(source, name, value, spec, N_JOINTS, allow_scalar=True)
    raise AssertionError(f"unhandled schema kind {spec.kind!r}")  # schema bug, not user input


def profile_from_mapping(data: Any, source: str = "<mapping>", default_name: str | None = None) -> DynamicsProfile:
    """Build a profile from a parsed YAML mapping, naming ``source`` in every error.

    Args:
        data: the mapping; may be wrapped as a ROS parameter file (``/**: ros__parameters: {...}``).
        source: file path or label used in error messages.
        default_name: name to use when the mapping has no ``name``.
    Returns:
        The validated profile; omitted fields take their nominal values.
    """
    if isinstance(data, Mapping) and len(data) == 1:
        (only,) = data.values()
        if isinstance(only, Mapping) and set(only) == {"ros__parameters"}:
            data = only["ros__parameters"]
    if not isinstance(data, Mapping):
        raise ProfileError(
            f"{source}: expected a mapping of profile fields at the top level, got {type(data).__name__}"
        )
    unknown = sorted(str(k) for k in data if k not in SCHEMA)
    if unknown:
        raise ProfileError(f"{source}: unknown field(s) {unknown}; known fields: {sorted(SCHEMA)}")
    values = {k: _coerce(k, v, source) for k, v in data.items()}
    if "name" not in values and default_name:
        values["name"] = default_name
    return DynamicsProfile(**values)


def profile_names() -> list[str]:
    """Return the names of the profiles shipped in config/sim_profiles/."""
    return sorted(p.stem for p in data_path(*PROFILE_DIR).glob("*.yaml"))


def load_profile(name_or_path: str | Path | DynamicsProfile) -> DynamicsProfile:
    """Load a dynamics profile by shipped name ("nominal", "real_twin") or from a YAML file.

    Args:
        name_or_path: a shipped profile name, a path to a YAML file, or a profile (returned as is).
    Returns:
        The validated profile.
    Raises:
        ProfileError: unknown name, unreadable file, or a malformed field (the message names the
            file, the field, the value and what was expected).
    """
    import yaml

    if isinstance(name_or_path, DynamicsProfile):
        return name_or_path
    if not isinstance(name_or_path, (str, Path)):
        raise ProfileError(
            f"load_profile: expected a profile name, a YAML path or a DynamicsProfile, got {name_or_path!r}"
        )
    text = str(name_or_path)
    looks_like_path = isinstance(name_or_path, Path) or "/" in text or text.endswith((".yaml", ".yml"))
    if looks_like_path:
        path = Path(name_or_path)
    else:
        path = data_path(*PROFILE_DIR, f"{text}.yaml", must_exist=False)
        if not path.is_file():
            raise ProfileError(f"unknown dynamics profile {text!r}: expected one of {profile_names()} or a YAML path")
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read dynamics profile: {exc}") from exc
    except yaml.YAMLError as exc:
        raise ProfileError(f"{path}: not valid YAML: {exc}") from exc
    return profile_from_mapping(raw if raw is not None else {}, source=str(path), default_name=path.stem)


def sample_profile(
    rng: np.random.Generator,
    ranges: Mapping[str, Any],
    base: DynamicsProfile | str | Path | None = None,
    name: str | None = None,
) -> DynamicsProfile:
    """Draw a profile for domain randomization: each field in ``ranges`` uniform in [low, high].

    Args:
        rng: the random generator (the only source of randomness).
        ranges: ``{field: (low, high)}``; for per-joint / 3-vector fields low and high may be
            numbers (every element drawn independently in the same range) or per-element lists.
        base: profile supplying the fields not randomized (default: nominal).
        name: name of the result (default: ``"<base name>-randomized"``).
    Returns:
        The validated profile.
    Raises:
        ProfileError: unknown or non-numeric field, malformed range, or a drawn value outside
            the field's bounds.
    """
    base_profile = DynamicsProfile() if base is None else load_profile(base)
    changes: dict[str, Any] = {}
    for key, bounds in ranges.items():
        spec = SCHEMA.get(key)
        if spec is None:
            raise ProfileError(f"randomization ranges: unknown field {key!r}; known fields: {sorted(SCHEMA)}")
        if spec.kind == "str":
            raise ProfileError(f"randomization ranges: field {key!r} is text and cannot be randomized")
        if not isinstance(bounds, (list, tuple)) or len(bounds) != 2:
            raise ProfileError(f"randomization ranges: field {key!r} = {bounds!r}: expected a (low, high) pair")
        size = {"scalar": None, "vec3": 3, "joints": N_JOINTS, "links": N_JOINTS}[spec.kind]
        try:
            low = np.broadcast_to(np.asarray(bounds[0], dtype=float), () if size is None else (size,))
            high = np.broadcast_to(np.asarray(bounds[1], dtype=float), () if size is None else (size,))
        except (ValueError, TypeError) as exc:
            raise ProfileError(
                f"randomization ranges: field {key!r} = {bounds!r}: expected numbers or lists of {size} numbers"
            ) from exc
        if not (np.all(np.isfinite(low)) and np.all(np.isfinite(high)) and np.all(low <= high)):
            raise ProfileError(f"randomization ranges: field {key!r} = {bounds!r}: expected finite low <= high")
        drawn = rng.uniform(low, high)
        changes[key] = float(drawn) if size is None else tuple(float(v) for v in drawn)
    changes["name"] = name if name is not None else f"{base_profile.name}-randomized"
    try:
        return dataclasses.replace(base_profile, **changes)
    except ProfileError as exc:
        raise ProfileError(f"randomization ranges produced an invalid profile: {exc}") from exc


def default_randomization_ranges() -> dict[str, tuple[Any, Any]]:
    """Return ranges that span the nominal simulator and beyond the real twin (a starting point)."""
    return {
        "coulomb_friction_nm": ([0.0] * 3 + [0.0] * 3, [5.0] * 3 + [1.5] * 3),
        "viscous_damping_nms": ([0.0] * 3 + [0.0] * 3, [3.0] * 3 + [0.6] * 3),
        "armature_kgm2": (0.08, 0.15),
        "link_mass_scale": (0.9, 1.2),
        "payload_kg": (0.0, 2.0),
        "payload_com_m": ([-0.02, -0.02, 0.0], [0.02, 0.02, 0.1]),
        "actuator_lag_s": (0.0, 0.015),
        "command_latency_s": (0.0, 0.008),
        "position_noise_std_rad": (0.0, 2e-4),
        "velocity_noise_std_radps": (0.0, 0.01),
        "effort_noise_std_nm": (0.0, 1.0),
        "encoder_offset_rad": (-0.003, 0.003),
    }
