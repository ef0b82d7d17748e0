"""The trust monitor's side of world-model swaps: the calibration that comes with a new model, and rollback.

When the world model in ``/robot_wm/prediction`` changes (an online update, an operator's
activation or rollback), the monitor needs thresholds for that model: ``calibration_for`` finds the
registry's active set whose world model it is and loads that set's calibration for the profile (the
online learner issues one with every accepted candidate). Without one the monitor keeps saying
STOP with the reason, as before.

``RollbackGuard`` feeds ``robot_wm.core.trust.swap.SwapWatch`` every measured period; when the rule
asks for it, it rolls the task's registry pointer back (only if the model it judges is still the
active one: someone else may have moved on) and announces the rollback on ``/robot_wm/model_update``,
so the world_model node and the safety filter swap the previous model back in.
"""
from __future__ import annotations

import time
from pathlib import Path

from rclpy.node import Node


from robot_wm.core.trust.swap import SwapWatch, SwapWatchConfig
from robot_wm.nodes.model_swap import UPDATE_QOS, UPDATE_TOPIC


def calibration_for(task: str, profile: str, model_version: str, warn=None):
    """The registry's calibration for ``model_version`` (the task's active set), or (None, why not)."""
    from robot_wm.core.onnx_model import ModelError
    from robot_wm.core.trust import CalibrationError
    from robot_wm.core.trust import calibration as calib_io
    from robot_wm.registry import resolve

    try:
        path = Path(resolve(task, "calibration", profile=profile, warn=warn))
        return calib_io.load(path, model_version), str(path)
    except (ModelError, CalibrationError, OSError) as exc:
        return None, str(exc)


def announce(node: Node, publisher, task: str, action: str, reason: str, *, accepted: bool = True,
             previous_set: str = "") -> None:
    """Publish a ModelUpdate for the task's active set after ``action``: its world model (the
    world_model node and the safety filter swap it in) and its policy (the policy node does; a set
    that carries the same policy, as the online learner's do, changes nothing there)."""
    from robot_wm.core.onnx_model import read_sidecar
    from robot_wm.msg import ModelUpdate
    from robot_wm.registry import Registry

    active = Registry().active(task)
    for kind in ("world_model", "policy"):
        msg = ModelUpdate(model_kind=kind, task=task, action=action, reason=reason, accepted=accepted,
                          previous_set_version=previous_set)
        msg.header.stamp = node.get_clock().now().to_msg()
        if active is not None:
            path = active.world_model_path if kind == "world_model" else active.policy_path
            side = read_sidecar(path)
            msg.set_version, msg.version, msg.path, msg.sha256 = active.version, side["version"], str(path), side["sha256"]
        publisher.publish(msg)


class RollbackGuard:
    """Rolls the registry back when a swapped-in world model does worse on the live arm (see the module docstring)."""

    def __init__(self, node: Node, task: str, config: SwapWatchConfig, dt_s: float, enabled: bool = True) -> None:
        from robot_wm.msg import ModelUpdate

        self.node, self.task, self.enabled = node, task, enabled
        self.watch = SwapWatch(config, dt_s)
        self.shadow = ShadowErrors(dt_s)
        self.rollbacks: list[str] = []  # reasons, for diagnostics
        self.publisher = node.create_publisher(ModelUpdate, UPDATE_TOPIC, UPDATE_QOS)

    def update(self, t_s: float, model_version: str | None, velocity_error: float | None, qdot_radps=None) -> None:
        """One measured period of the running model (``qdot_radps``: the measured velocity, for the shadow's error)."""
        if model_version is None:
            return
        shadow = None if qdot_radps is None else self.shadow.error_for(t_s, qdot_radps, self.watch.previous_version)
        verdict = self.watch.update(t_s, model_version, velocity_error, shadow)
        if verdict is None or not self.enabled:
            return
        from robot_wm.core.onnx_model import read_sidecar
        from robot_wm.modelset import RegistryError
        from robot_wm.registry import Registry

        log = self.node.get_logger()
        try:
            reg = Registry()
            active = reg.active(self.task)
            if active is None or read_sidecar(active.world_model_path)["version"] != verdict.version:
                log.warning(f"{verdict.reason}; not rolled back: it is no longer the registry's active world model")
                return
            back = reg.rollback(self.task)
        except (RegistryError, OSError, ValueError) as exc:
            log.error(f"{verdict.reason}; rollback refused: {exc}")
            return
        self.rollbacks.append(f"{time.strftime('%H:%M:%S')} {active.version} -> {back.version}: {verdict.reason}")
        log.error(f"world model rolled back: {active.version} -> {back.version}: {verdict.reason}")
        announce(self.node, self.publisher, self.task, "rollback", verdict.reason, previous_set=active.version)


def declare_rollback(node: Node) -> tuple[SwapWatchConfig, bool]:
    """The trust monitor's rollback parameters (config/trust.yaml rollback_*)."""
    from robot_wm.nodes.params import declare

    d = SwapWatchConfig()
    config = SwapWatchConfig(
        factor=declare(node, "rollback_factor", d.factor, "after a world-model swap: roll back when the live "
                       "velocity error is worse than before by this factor ...", range_=(1.01, 100.0), read_only=True),
        hold_s=declare(node, "rollback_hold_s", d.hold_s, "... for this long (s)", range_=(0.1, 600.0), read_only=True),
        window_s=declare(node, "rollback_window_s", d.window_s, "the errors compared are medians over this (s)",
                         range_=(0.1, 600.0), read_only=True),
        watch_s=declare(node, "rollback_watch_s", d.watch_s, "a swap is watched this long (s)", range_=(1.0, 36000.0),
                        read_only=True))
    enabled = declare(node, "rollback", True, "roll the registry back on such evidence (false: log it only)",
                      read_only=True)
    return config, enabled


class ShadowErrors:
    """The replaced model's one-step velocity errors, from its shadow predictions
    (``/robot_wm/prediction_shadow``, published by the world_model node for a while after a swap)."""

    def __init__(self, dt_s: float) -> None:
        self.dt_s = float(dt_s)
        self._pending: list[tuple[float, str, object]] = []  # (the stamp it is for, version, predicted qdot)

    def add(self, made_at_s: float, version: str, qdot_radps) -> None:
        self._pending.append((float(made_at_s) + self.dt_s, version, qdot_radps))
        del self._pending[:-16]

    def error_for(self, t_s: float, qdot_radps, previous_version: str | None) -> float | None:
        """RMS over the joints of (shadow prediction - measured) qdot for the state stamped ``t_s``, or None."""
        import numpy as np

        match = [p for p in self._pending if abs(p[0] - t_s) <= 0.5 * self.dt_s and p[1] == previous_version]
        self._pending = [p for p in self._pending if p[0] > t_s + 0.5 * self.dt_s]
        if not match:
            return None
        diff = np.asarray(match[-1][2], dtype=float) - np.asarray(qdot_radps, dtype=float)
        return float(np.sqrt(np.mean(diff * diff)))
