"""Training configuration: YAML sections validated into frozen dataclasses with clear errors."""
from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration value is missing, unknown or of the wrong type; the message names it."""


def _coerce(source: str, name: str, value: Any, annotation: Any) -> Any:
    origin = typing.get_origin(annotation)
    if annotation is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{source}: {name}={value!r}: expected true or false")
        return value
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{source}: {name}={value!r}: expected an integer")
        return value
    if annotation is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{source}: {name}={value!r}: expected a number")
        return float(value)
    if annotation is str:
        if not isinstance(value, str):
            raise ConfigError(f"{source}: {name}={value!r}: expected a string")
        return value
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{source}: {name}={value!r}: expected a list")
        item_type = typing.get_args(annotation)[0]
        return tuple(_coerce(source, f"{name}[{i}]", v, item_type) for i, v in enumerate(value))
    return value


def from_mapping(cls: type[T], data: Any, source: str) -> T:
    """Build dataclass ``cls`` from a mapping, naming any unknown, missing or mistyped field.

    Fields the mapping omits keep their defaults; ``cls.__post_init__`` may add range checks.
    """
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of settings, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - fields)
    if unknown:
        raise ConfigError(f"{source}: unknown settings {unknown}; known: {sorted(fields)}")
    kwargs = {k: _coerce(source, k, v, hints[k]) for k, v in data.items()}
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{source}: {exc}") from exc


def load_section(path: Path, section: str, cls: type[T]) -> T:
    """Read ``section`` of a YAML file into ``cls``."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of sections")
    return from_mapping(cls, raw.get(section), f"{path} [{section}]")
