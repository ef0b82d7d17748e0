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


class CalibrationPrefetch:
    """The calibration of each announced world model, looked up before the model's first prediction.

    ``calibration_for`` verifies the registry's active set (every file's SHA-256, the sidecars, the
    robot description): 11-23 ms of CPU, measured live. On the thread that judges the periods, and at
    the control processes' real-time priority, that was a trust period missed at every swap and a
    core taken from the control path while the nodes swap (``python bench/bench_swap_storm.py``). So
    an announcement on ``/robot_wm/model_update`` (a world model of this task, activated or rolled
    back) starts the lookup on a thread of its own, and ``take(version)`` hands the result to the period; a model
    seen without one (an announcement missed or late) is looked up on the period thread as before.
    The lookup runs below every real-time thread (``model_swap.below_realtime``): just below the
    node's own, it held a core while the control process's loaders waited for one holding that
    process's interpreter lock, and the control thread missed periods (11 in 58 swaps, against 6-7
    with the lookup on the period thread; ``python bench/bench_swap_storm.py``).
    Announcements made before the node started are history (transient local): not looked up."""

    KEEP = 4  # results kept for models not yet seen (swaps in quick succession)

    def __init__(self, node: Node, task: str, profile: str, enabled: bool = True) -> None:
        import threading

        from robot_wm.msg import ModelUpdate

        self.node, self.task, self.profile, self.enabled = node, task, profile, enabled
        self._lock = threading.Lock()
        self._ready: dict[str, tuple] = {}  # world model version -> calibration_for's (calibration, where)
        self._started_ns = node.get_clock().now().nanoseconds
        self.hits = self.misses = 0
        node.create_subscription(ModelUpdate, UPDATE_TOPIC, self._on_update, UPDATE_QOS)

    def _on_update(self, msg) -> None:
        from robot_wm.nodes.model_swap import SWAP_ACTIONS

        if not self.enabled or msg.task != self.task or msg.model_kind != "world_model" or not msg.accepted \
                or msg.action not in SWAP_ACTIONS or not msg.version \
                or msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec < self._started_ns:
            return
        import threading

        threading.Thread(target=self._look_up, args=(msg.version,), name="calibration_prefetch", daemon=True).start()

    def _look_up(self, version: str) -> None:
        from robot_wm.nodes.model_swap import below_realtime, loader_scheduling

        try:
            with loader_scheduling(below_realtime):
                found = calibration_for(self.task, self.profile, version)
        except Exception as exc:  # noqa: BLE001 (the period thread looks it up again and says why)
            self.node.get_logger().warning(f"calibration lookup for world model {version} failed: {exc}")
            return
        with self._lock:
            self._ready[version] = found
            for old in list(self._ready)[:-self.KEEP]:
                del self._ready[old]

    def take(self, version: str):
        """The (calibration, where) looked up for ``version``, or None (not announced, or not ready yet)."""
        with self._lock:
            found = self._ready.pop(version, None)
        if found is None:
            self.misses += 1
        else:
            self.hits += 1
        return found


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
        self._roll_back(self.watch.update(t_s, model_version, velocity_error, shadow))

    def refused(self, t_s: float, model_version: str | None, why: str) -> None:
        """The safety filter refused the running model's linearization this period (a MODEL_IMPLAUSIBLE fault)."""
        if model_version is not None:
            self._roll_back(self.watch.refused(t_s, model_version, why))

    def _roll_back(self, verdict) -> None:
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
                        read_only=True),
        refusals=declare(node, "rollback_refusals", d.refusals, "... and rolled back at once when the safety filter "
                         "refuses the new model's linearization in this many periods", range_=(1, 100000), read_only=True))
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
