"""config/trust.yaml as the library reads it (the node reads the same file as --params-file)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from robot_wm.core.trust.monitor import TrustConfig
from robot_wm.core.trust.signals import SIGNALS

SECTION = "trust_monitor"


@dataclass(frozen=True)
class CalibrationSettings:
    """How `robot-wm trust calibrate` makes thresholds (see config/trust.yaml)."""

    exceedance: float = 1e-4
    seconds: float = 600.0
    floors: tuple[tuple[str, float], ...] = ()
    refresh_seconds: float = 600.0  # an inherited calibration is refreshed on this much live normal operation (0: never)
    refresh_max_factor: float = 1.5  # a refreshed threshold stays at most this multiple of the inherited one
    alarms_per_hour: float = 0.0  # target level drops per hour of normal operation, over all signals (0: off)
    #: the hardware's command timeout (hardware_command_timeout_s): a replayed period with no command sent for longer
    #: is not judged, as the node does not judge it (0: every period is)
    command_timeout_s: float = 0.05

    def floor_map(self) -> dict[str, float]:
        return dict(self.floors)


def config_from_params(params: dict) -> tuple[TrustConfig, CalibrationSettings]:
    """TrustConfig and CalibrationSettings from a ``ros__parameters`` mapping (missing: defaults).

    Raises:
        ValueError: a value of the wrong type or range (the message names the parameter).
    """
    d = TrustConfig()
    kw = {}
    for name in ("min_duration_s", "slow_ratio", "clean_hold_s", "human_after_s", "stale_s", "stop_stale_s", "clip_ratio", "effort_tau_s", "effort_clip_z",
                 "lag_tau_s", "anomaly_window_s"):
        kw[name] = _number(params, name, getattr(d, name))
    tau = params.get("tau_s", list(d.tau_s))
    if not isinstance(tau, (list, tuple)) or not all(_is_number(x) for x in tau):
        raise ValueError(f"{SECTION}.tau_s={tau!r}: expected {len(SIGNALS)} time constants (s)")
    kw["tau_s"] = tuple(float(x) for x in tau)
    kw["human_on_anomaly"] = bool(params.get("human_on_anomaly", d.human_on_anomaly))
    config = TrustConfig(**kw)
    exceedance = _number(params, "calibration_exceedance", 1e-4)
    if not 0.0 < exceedance < 1.0:
        raise ValueError(f"{SECTION}.calibration_exceedance={exceedance!r}: expected a probability in (0, 1)")
    seconds = _number(params, "calibration_seconds", 600.0)
    if seconds <= 0:
        raise ValueError(f"{SECTION}.calibration_seconds={seconds!r}: expected a positive duration (s)")
    floors = tuple((s.value, _number(params, f"floor_{s.value}", 0.0)) for s in SIGNALS)
    refresh_s = _number(params, "refresh_seconds", 600.0)
    if refresh_s < 0:
        raise ValueError(f"{SECTION}.refresh_seconds={refresh_s!r}: expected a duration >= 0 s (0: never refresh)")
    refresh_factor = _number(params, "refresh_max_factor", 1.5)
    if refresh_factor < 1.0:
        raise ValueError(f"{SECTION}.refresh_max_factor={refresh_factor!r}: expected >= 1 (a refresh may tighten a "
                         "threshold freely, loosen it at most by this factor)")
    alarms = _number(params, "false_alarms_per_hour", 0.0)
    if alarms < 0:
        raise ValueError(f"{SECTION}.false_alarms_per_hour={alarms!r}: expected a rate >= 0 per hour (0: thresholds "
                         "from the per-period exceedance alone)")
    command_timeout_s = _number(params, "hardware_command_timeout_s", 0.05)
    if command_timeout_s < 0:
        raise ValueError(f"{SECTION}.hardware_command_timeout_s={command_timeout_s!r}: expected a duration >= 0 s "
                         "(0: judge every period)")
    return config, CalibrationSettings(exceedance, seconds, floors, refresh_s, refresh_factor, alarms, command_timeout_s)


PHASE_KEYS = ("min_minutes", "min_episodes", "min_success_rate", "min_mean_score", "anomaly_free_minutes",
              "require_calibration")


def phase_config_from_params(params: dict):
    """PhaseConfig from the flat ``phase_<step>_<criterion>`` parameters (step: to_mixed, to_real).

    Raises:
        ValueError: a value of the wrong type or range (the message names the parameter).
    """
    from robot_wm.core.trust.phase import criteria_from_mapping

    data: dict = {"to_mixed": {}, "to_real": {}}
    for step in data:
        for key in PHASE_KEYS:
            name = f"phase_{step}_{key}"
            if name not in params:
                continue
            v = params[name]
            if key == "require_calibration":
                if not isinstance(v, bool):
                    raise ValueError(f"{SECTION}.{name}={v!r}: expected true or false")
            elif key == "min_episodes":
                if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                    raise ValueError(f"{SECTION}.{name}={v!r}: expected an integer >= 0")
            else:
                v = _number(params, name, 0.0)
            data[step][key] = v
    try:
        return criteria_from_mapping(data, SECTION)
    except ValueError as exc:
        raise ValueError(f"{SECTION}: {exc}") from None


def load_phase_config(path: Path | None = None):
    """The promotion criteria of config/trust.yaml (or ``path``); ValueError names what is wrong."""
    params = _read_params(path)
    try:
        return phase_config_from_params(params)
    except ValueError as exc:
        raise ValueError(f"{path or 'config/trust.yaml'}: {exc}") from exc


def _read_params(path: Path | None) -> dict:
    import yaml

    from robot_wm.paths import config_path

    path = Path(path) if path is not None else config_path("trust.yaml")
    try:
        doc = yaml.safe_load(path.read_text()) or {}
        return doc.get(SECTION, {}).get("ros__parameters", {})
    except (OSError, yaml.YAMLError, AttributeError) as exc:
        raise ValueError(f"{path}: cannot read {SECTION}.ros__parameters: {exc}") from exc


def load_trust_config(path: Path | None = None) -> tuple[TrustConfig, CalibrationSettings]:
    """Read config/trust.yaml (or ``path``).

    Raises:
        ValueError: unreadable file or a bad value (the message names the file and the parameter).
    """
    import yaml

    from robot_wm.paths import config_path

    path = Path(path) if path is not None else config_path("trust.yaml")
    try:
        doc = yaml.safe_load(path.read_text()) or {}
        params = doc.get(SECTION, {}).get("ros__parameters", {})
    except (OSError, yaml.YAMLError, AttributeError) as exc:
        raise ValueError(f"{path}: cannot read {SECTION}.ros__parameters: {exc}") from exc
    try:
        return config_from_params(params)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from exc


def _is_number(x) -> bool:
    return not isinstance(x, bool) and isinstance(x, (int, float)) and math.isfinite(x)


def _number(params: dict, name: str, default: float) -> float:
    v = params.get(name, default)
    if not _is_number(v):
        raise ValueError(f"{SECTION}.{name}={v!r}: expected a finite number")
    return float(v)


__all__ = ["CalibrationSettings", "PHASE_KEYS", "config_from_params", "load_phase_config", "load_trust_config",
           "phase_config_from_params"]
