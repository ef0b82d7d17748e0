"""The hot swap's loader thread (robot_wm/nodes/model_swap.py) and the control thread.

The loader shares the interpreter lock with the control thread, so it must run whenever it holds it:
scheduled below other processes (the first version: nice 10) it kept a SCHED_FIFO control thread waiting
up to 96 ms behind busy processes (priority inversion; ``bench/bench_swap_load.py`` measures it). It
runs just below the control thread instead, and the control thread's callback never waits for a load.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from conftest import wait_for

CHILD = """
import os, sys, threading
from robot_wm.nodes.model_swap import below_the_control_thread
fifo = sys.argv[1]
if fifo != "normal":
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(int(fifo)))
seen = {}
def loader():
    seen["text"] = below_the_control_thread()
    tid = threading.get_native_id()
    seen["policy"] = os.sched_getscheduler(tid)
    seen["priority"] = os.sched_getparam(tid).sched_priority
    seen["nice"] = os.getpriority(os.PRIO_PROCESS, tid)
t = threading.Thread(target=loader); t.start(); t.join()
main = threading.get_native_id()
print(seen["policy"] == os.SCHED_FIFO, seen["priority"], seen["nice"], os.sched_getparam(main).sched_priority, "|", seen["text"])
"""


def _child(arg: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", CHILD, arg], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


@pytest.mark.skipif(not hasattr(os, "sched_setscheduler") or os.geteuid() != 0,
                    reason="SCHED_FIFO needs the right to raise priorities (root here)")
def test_the_loader_runs_one_realtime_priority_below_the_control_thread():
    """In child processes (this one stays on the normal scheduler)."""
    fifo, prio, nice, main_prio, *_ = _child("50")
    assert (fifo, prio, main_prio) == ("True", "49", "50")  # still real-time: before every normal process
    fifo, prio, *_ = _child("1")
    assert (fifo, prio) == ("True", "1")  # there is nothing lower on SCHED_FIFO


def test_under_the_normal_scheduler_the_loader_keeps_the_control_threads_nice_value():
    fifo, prio, nice, *rest = _child("normal")
    assert (fifo, nice) == ("False", "0"), rest  # not nice 10: it would wait behind every busy process
    assert "as the control thread" in " ".join(rest)


def test_an_announcement_during_a_load_never_waits_on_the_callback_thread_and_loads_in_order(ros_context):
    """The second announcement arrives while the first is still loading: the callback (the control
    thread in the composed process) returns at once, and the second model is loaded after the first."""
    from rclpy.node import Node

    from robot_wm.msg import ModelUpdate
    from robot_wm.nodes.model_swap import WorldModelSwap

    node = Node("swap_order_test", context=ros_context)
    try:
        swap = WorldModelSwap(node, "reach", ["j1"], 0.01, analytic=False)
        release, order = threading.Event(), []

        def build(msg) -> None:  # stands for loading a model: the first blocks until released
            if msg.set_version == "first":
                assert release.wait(10.0)
            order.append(msg.set_version)

        swap._build = build

        def update(version: str) -> ModelUpdate:
            msg = ModelUpdate(task="reach", model_kind="world_model", action="activate", accepted=True,
                              set_version=version)
            msg.header.stamp = node.get_clock().now().to_msg()
            return msg

        swap._on_update(update("first"))
        assert wait_for(lambda: swap._loading is not None and swap._loading.is_alive(), 5.0)
        returned = threading.Event()
        callback = threading.Thread(target=lambda: (swap._on_update(update("second")), returned.set()), daemon=True)
        callback.start()
        assert wait_for(returned.is_set, 5.0), "the callback waited for the model being loaded"
        assert order == []
        release.set()
        assert wait_for(lambda: order == ["first", "second"], 10.0), order
    finally:
        release.set()
        node.destroy_node()


def test_the_learner_node_refuses_a_realtime_priority():
    """However it gets one (a launch file of the integrator's, a parameter file), the learner keeps the
    normal scheduler: its training at SCHED_FIFO would run level with the control threads."""
    import rclpy
    from rclpy.context import Context

    from robot_wm.nodes.adaptation_node import AdaptationNode

    context = Context()
    rclpy.init(args=["--ros-args", "-p", "realtime_priority:=50", "-p", "autostart:=false"], context=context)
    try:
        node = AdaptationNode(context=context)
        try:
            assert node.realtime_priority == 0
        finally:
            node.destroy_node()
    finally:
        rclpy.shutdown(context=context)


def test_overlapping_loads_put_the_switch_interval_back_when_the_last_one_ends():
    """The filter's and the world model's loaders share the process's switch interval: with each one
    saving and restoring it, the first to end set 5 ms while the other still loaded, and the last left
    0.5 ms for good."""
    from robot_wm.nodes.model_swap import _SWITCH_INTERVAL_S, loader_scheduling

    before = sys.getswitchinterval()
    first_in, second_in, first_may_end = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def first() -> None:
        with loader_scheduling():
            first_in.set()
            assert first_may_end.wait(10.0)

    def second() -> None:
        assert first_in.wait(10.0)
        with loader_scheduling():
            second_in.set()
            t.join(10.0)  # the first load ends while this one runs
            seen["after_first_ended"] = sys.getswitchinterval()

    t = threading.Thread(target=first)
    u = threading.Thread(target=second)
    t.start()
    u.start()
    assert second_in.wait(10.0)
    first_may_end.set()
    u.join(10.0)
    assert seen["after_first_ended"] == pytest.approx(min(before, _SWITCH_INTERVAL_S))
    assert sys.getswitchinterval() == pytest.approx(before)


def test_the_policy_swap_takes_only_the_active_sets_policy_checked_and_loaded_off_the_control_thread(
        ros_context, registry, tmp_path):
    """An announced policy that is not the registry's active one, or whose bytes are not the announced
    ones, is refused with the reason and nothing changes; the active set's policy is loaded (checked as
    a policy of this task and arm) and handed over once, at the start of a period."""
    import json
    import shutil

    from rclpy.node import Node

    from robot_wm import description
    from robot_wm.core.onnx_model import read_sidecar
    from robot_wm.core.policy_runner import PolicyRunner
    from robot_wm.msg import ModelUpdate
    from robot_wm.nodes.model_swap import PolicySwap

    names = list(description.joint_limits(description.expand()).names)
    shipped = registry.active("track")
    # a second set: the shipped one, its policy under another version
    variant = tmp_path / "variant"
    shutil.copytree(shipped.path, variant, ignore=shutil.ignore_patterns("modelset.json"))
    side = read_sidecar(variant / "policy.onnx")
    doc = json.loads((variant / "policy.json").read_text())
    doc["version"] = side["version"] + "-variant"
    (variant / "policy.json").write_text(json.dumps(doc))
    other = registry.add(variant, "track", parent=shipped.version, lineage={"command": "test"}, activate=False)
    node = Node("policy_swap_test", context=ros_context)
    try:
        swap = PolicySwap(node, "track", names, 0.01)
        current = PolicyRunner(shipped.policy_path, names, 0.01, task="track")

        def announce(info, sha256=None) -> ModelUpdate:
            s = read_sidecar(info.policy_path)
            msg = ModelUpdate(task="track", model_kind="policy", action="activate", accepted=True, set_version=info.version,
                              version=s["version"], path=str(info.policy_path), sha256=sha256 or s["sha256"])
            msg.header.stamp = node.get_clock().now().to_msg()
            swap._on_update(msg)
            swap._loading.join(10.0)

        announce(other)  # registered, not active
        assert "is not the registry's active track policy" in swap.last_refusal and swap.take(current) is None
        registry.activate("track", other.version)
        announce(other, sha256="0" * 64)
        assert "SHA-256 differs" in swap.last_refusal and swap.take(current) is None
        announce(other)
        new = swap.take(current)
        assert new is not None and new.version.endswith("-variant") and swap.swaps == 1
        assert swap.take(new) is None  # handed over once
    finally:
        node.destroy_node()


def test_an_announcement_of_the_model_in_use_loads_nothing_unless_another_is_on_its_way_in(ros_context):
    """A learner's set carries the same policy: the policy node must not load it again at every swap
    (each load costs the control process). The same model announced while another loads, is loaded,
    or is being handed over to the control thread is loaded, in order: the node ends on the last one."""
    from types import SimpleNamespace

    from rclpy.node import Node

    from robot_wm.msg import ModelUpdate
    from robot_wm.nodes.model_swap import WorldModelSwap

    node = Node("swap_in_use_test", context=ros_context)
    release, built = threading.Event(), []
    try:
        running = {"version": "v1"}
        swap = WorldModelSwap(node, "reach", ["j1"], 0.01, analytic=False, in_use=lambda: running["version"])

        def build(msg) -> None:  # stands for loading a model: v2 blocks until released
            if msg.version == "v2":
                assert release.wait(10.0)
            built.append(msg.version)
            with swap._lock:
                swap._pending = (SimpleNamespace(version=msg.version), msg)

        swap._build = build

        def update(version: str) -> None:
            msg = ModelUpdate(task="reach", model_kind="world_model", action="activate", accepted=True,
                              set_version=f"set-{version}", version=version)
            msg.header.stamp = node.get_clock().now().to_msg()
            swap._on_update(msg)

        update("v1")
        assert swap._loading is None and built == []  # the model in use: nothing loaded
        update("v2")
        assert wait_for(lambda: swap._loading is not None and swap._loading.is_alive(), 5.0)
        update("v1")  # v2 is on its way in: v1 must follow it
        release.set()
        assert wait_for(lambda: built == ["v2", "v1"], 10.0), built
        swap._loading.join(5.0)
        assert swap.take(SimpleNamespace(version="v1", action_history=None, qdot_history=None)) is None  # v1 again
        # handed over but not yet installed by the node: the model "in use" is about to change
        with swap._lock:
            swap._pending = (SimpleNamespace(version="v3", reset=lambda *a: None), None)
        swap._next(SimpleNamespace(version="v1"))
        update("v1")
        assert wait_for(lambda: built[-1:] == ["v1"] and len(built) == 3, 5.0), built
        swap._loading.join(5.0)
        swap._pending = None
        running["version"] = "v3"
        swap._handed = "v3"
        n = len(built)
        update("v3")
        assert len(built) == n and not swap._loading.is_alive()
        running["version"] = None  # unknown (no model): loaded
        swap._handed = None
        update("v3")
        assert wait_for(lambda: len(built) == n + 1, 5.0), built

        def broken() -> str:
            raise RuntimeError("no controller yet")

        swap._in_use = broken  # a node that cannot say: loaded, never raised on its callback
        swap._loading.join(5.0)
        swap._pending = None
        update("v4")
        assert wait_for(lambda: built[-1:] == ["v4"], 5.0), built
    finally:
        release.set()
        node.destroy_node()


def test_the_learner_announces_every_rejection_whatever_kind_came_before():
    """A candidate that could not be tried (too little data: a warning) and one the gate refused (info)
    are both announced, in either order. rclpy raises when one call site logs at another severity than
    it did first: that ended the attempt's thread before the rejection was published (seen live, 2026-12-07)."""
    import rclpy
    from rclpy.context import Context

    from robot_wm.learning.online import Attempt, GateResult
    from robot_wm.nodes.adaptation_node import AdaptationNode

    no_data = Attempt(0.0, error="RuntimeError: too little contiguous data: 8.8 s", previous_set_version="reach-0001")
    refused = Attempt(0.0, verdict=GateResult(False, ["held-out qdot RMSE 0.0071 vs 0.0071 rad/s: less than 5% better"],
                                             {"rmse": 0.0071}), previous_set_version="reach-0001", world_model_version="wm-x")
    for order in ((no_data, refused), (refused, no_data)):
        context = Context()
        rclpy.init(args=["--ros-args", "-p", "autostart:=false"], context=context)
        try:
            node = AdaptationNode(context=context)
            published = []
            queue = list(order)
            node.learner = type("Learner", (), {"attempt": lambda self: queue.pop(0)})()
            node._update_pub = type("Pub", (), {"publish": lambda self, m: published.append(m)})()
            try:
                node._attempt()
                node._attempt()
                assert [(m.action, m.accepted) for m in published] == [("reject", False)] * 2
                assert [m.reason for m in published] == [a.error or a.verdict.text for a in order]
            finally:
                node.destroy_node()
        finally:
            rclpy.shutdown(context=context)


def test_a_period_ends_with_the_latest_control_path_node_still_running_periods():
    """In the composed process the policy acts, the filter sends the command and the world model predicts
    from it: the period's work ends with the prediction, not half-way. A node that stops marking (100 ms)
    no longer holds the end back; a node alone ends its own periods."""
    from robot_wm.nodes.model_swap import PLACE_FILTER, PLACE_POLICY, PLACE_WORLD_MODEL, PeriodEnds

    now = [0]
    ends = PeriodEnds(clock=lambda: now[0])  # a clock of the test's own: no load can age a node's marks
    ends.mark(PLACE_FILTER)  # alone so far: its mark ends a period
    assert ends.count == 1
    ends.mark(PLACE_WORLD_MODEL)  # the world_model node's first prediction
    assert ends.count == 2
    for _ in range(3):
        before = ends.count
        ends.mark(PLACE_POLICY)
        ends.mark(PLACE_FILTER)
        assert ends.count == before, "a period ended before the world model's prediction"
        ends.mark(PLACE_WORLD_MODEL)
        assert ends.count == before + 1
    for period in range(1, 21):  # the world_model node stops predicting; the others go on every 10 ms
        now[0] += 10_000_000
        before = ends.count
        ends.mark(PLACE_POLICY)
        assert ends.count == before
        ends.mark(PLACE_FILTER)
        assert ends.count == before + (period > 10)  # once its last prediction is over 100 ms old


def test_a_loader_step_starts_right_after_a_period_ends_and_never_waits_for_one_that_does_not_come():
    import time

    from robot_wm.nodes.model_swap import PLACE_FILTER, PeriodEnds

    ends = PeriodEnds()
    started = time.monotonic()
    assert ends.wait_for_slack(0.05) is False  # no control period runs (an inactive node): go on
    assert 0.04 <= time.monotonic() - started < 5.0
    seen = {}

    def step() -> None:
        seen["ok"] = ends.wait_for_slack(60.0)

    def a_period_ends() -> bool:  # every 10 ms until the step has started (one before it waits is not its slack)
        ends.mark(PLACE_FILTER)
        return "ok" in seen

    t = threading.Thread(target=step)
    t.start()
    assert wait_for(a_period_ends, 30.0)
    t.join(10.0)
    assert seen["ok"] is True  # it started in a period's slack (woken within 1 ms of its end), not at its timeout


def test_a_paced_load_waits_for_the_slack_before_each_step_that_holds_the_interpreter_lock():
    """Each step of a load of a millisecond or more (each session's creation, parsing and building the
    linearization graph, each sample of its check, each warm-up run) waits for the slack first."""
    from robot_wm.contracts import JOINT_NAMES
    from robot_wm.nodes.model_swap import load_runner
    from robot_wm.paths import data_path

    path = data_path("models", "world_model.onnx")
    for analytic, steps in ((True, 1 + 3 + 4 + 3), (False, 1 + 3)):
        calls = []
        runner = load_runner(path, JOINT_NAMES, 0.01, analytic, pace=lambda: calls.append(1))
        assert len(calls) == steps, (analytic, len(calls))
        assert runner.linearization.startswith("analytic") == analytic
