"""The trust monitor's side of a world-model swap (robot_wm/nodes/trust_swap.py, trust_monitor.py).

Looking a model's calibration up verifies the registry's active set (every file's SHA-256, the
sidecars, the robot description): 11-23 ms of CPU, measured live. The monitor does it off the thread
that judges its periods when the model was announced, and never more than once a second per model
on that thread when a model has no calibration (it says STOP meanwhile), instead of once a period.
"""
from __future__ import annotations

import threading
import time

from conftest import wait_for


def _announce(node, prefetch, version: str, *, task: str = "reach", kind: str = "world_model", stamp=None) -> None:
    from robot_wm.msg import ModelUpdate

    msg = ModelUpdate(task=task, model_kind=kind, action="activate", accepted=True, set_version=f"set-{version}",
                      version=version)
    msg.header.stamp = stamp or node.get_clock().now().to_msg()
    prefetch._on_update(msg)


def test_an_announced_models_calibration_is_looked_up_off_the_callback_thread(ros_context, registry, monkeypatch):
    """With the registry's real lookup: the announced model's calibration is ready for the period that
    first sees the model, found on another thread; what is not for this task, not a world model, or
    announced before the node started (transient local history) is not looked up."""
    from rclpy.node import Node

    from robot_wm.core.onnx_model import read_sidecar
    from robot_wm.nodes import trust_swap

    active = registry.active("reach")
    version = read_sidecar(active.world_model_path)["version"]
    threads = []
    real = trust_swap.calibration_for
    monkeypatch.setattr(trust_swap, "calibration_for",
                        lambda *a, **k: (threads.append(threading.current_thread().name), real(*a, **k))[1])
    node = Node("prefetch_test", context=ros_context)
    try:
        prefetch = trust_swap.CalibrationPrefetch(node, "reach", "real_twin")
        before = node.get_clock().now().to_msg()
        before.sec -= 10
        _announce(node, prefetch, version, stamp=before)
        _announce(node, prefetch, version, task="track")
        _announce(node, prefetch, version, kind="policy")
        time.sleep(0.2)
        assert threads == [] and prefetch.take(version) is None and prefetch.misses == 1
        _announce(node, prefetch, version)
        assert wait_for(lambda: version in prefetch._ready, 10.0)
        cal, where = prefetch.take(version)
        assert cal is not None and cal.model_version == version and where.endswith("trust/real_twin.json")
        assert threads == ["calibration_prefetch"] and prefetch.hits == 1
        assert prefetch.take(version) is None  # handed over once
        for k in range(2 * prefetch.KEEP):  # models announced and never seen are not kept for ever
            _announce(node, prefetch, f"other-{k}")
        assert wait_for(lambda: len(threads) == 1 + 2 * prefetch.KEEP, 20.0)
        time.sleep(0.1)
        assert len(prefetch._ready) <= prefetch.KEEP and all(cal is None for cal, _ in prefetch._ready.values())
        disabled = trust_swap.CalibrationPrefetch(node, "reach", "real_twin", enabled=False)  # calibration_file given
        _announce(node, disabled, version)
        time.sleep(0.2)
        assert disabled._ready == {}
    finally:
        node.destroy_node()


def test_a_model_without_a_calibration_is_looked_up_at_most_once_a_second_and_a_prefetched_one_at_once(
        registry, monkeypatch):
    """On the trust monitor itself: a model whose set has no calibration for it keeps the monitor at STOP
    with the reason; the lookup is not repeated every period (it would keep a core busy at the control
    processes' real-time priority), only once a second. A prefetched calibration is taken without one."""
    import rclpy
    from rclpy.context import Context

    from robot_wm.core.onnx_model import read_sidecar
    from robot_wm.nodes import trust_monitor

    version = read_sidecar(registry.active("reach").world_model_path)["version"]
    calls = []
    real = trust_monitor.calibration_for
    monkeypatch.setattr(trust_monitor, "calibration_for", lambda *a, **k: (calls.append(a[2]), real(*a, **k))[1])
    context = Context()
    rclpy.init(context=context, args=["--ros-args", "-p", "autostart:=false", "-p", "profile:=real_twin"])
    node = trust_monitor.TrustMonitorNode(context=context)
    try:
        node.trigger_configure()
        assert node.tracker is not None
        for _ in range(20):  # twenty periods of a model no set has a calibration for
            assert not node._swap_calibration("wm-nobody")
        assert calls == ["wm-nobody"]
        node._lookup_failed = ("wm-nobody", time.monotonic() - 1.5)
        assert not node._swap_calibration("wm-nobody") and calls == ["wm-nobody"] * 2
        found = real("reach", "real_twin", version)
        node._prefetch._ready[version] = found
        assert node._swap_calibration(version) and calls == ["wm-nobody"] * 2  # prefetched: no lookup here
        assert node.calibration.model_version == version and node._lookup_failed is None
    finally:
        node.destroy_node()
        rclpy.shutdown(context=context)
