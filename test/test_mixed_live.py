"""``robot-wm train mixed`` on a running stack (no --library): the live graph's episodes, the policy
node's exploration in MIXED, each round's set activated and swapped into the running nodes."""
from __future__ import annotations

import os
import types
import threading
import time

import numpy as np
import pytest

from conftest import wait_for
from robot_wm.learning.adapt import AdaptConfig
from robot_wm.learning.mixed import MixedConfig, MixedError

TINY = MixedConfig(real_per_round=3, ratio="1:2", validation_every=3)
TINY_ADAPT = AdaptConfig(wm_epochs=2, wm_patience=2, critic_warmup=2, validate_every=2, eval_episodes=0,
                         replay_transitions=1600, threads=1)


def _mixed_phase_file(path):
    from robot_wm.core.safety import Phase
    from robot_wm.core.trust.phase import PhaseState, PhaseStore

    PhaseStore(path).save(PhaseState(phase=Phase.MIXED))
    return path


@pytest.mark.ros
@pytest.mark.slow
def test_a_live_round_explores_in_mixed_records_its_episodes_and_swaps_its_set_into_the_running_stack(
        spawn, ros_context, registry, tmp_path):
    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from std_msgs.msg import Float64MultiArray

    from robot_wm import bags, graph
    from robot_wm.learning.adapt_cli import default_base
    from robot_wm.learning.mixed import train_mixed
    from robot_wm.learning.mixed_live import LiveArm
    from robot_wm.process_group import command_for

    phase = _mixed_phase_file(tmp_path / "phase.json")
    specs = [s for s in graph.plan("mujoco", overrides={"profile": "nominal", "phase_file": str(phase)}, enable=True,
                                   task="track") if not s.needs_ros_install]
    env = {"ROBOT_WM_MODELS_DIR": os.environ["ROBOT_WM_MODELS_DIR"]}
    procs = {s.name: spawn(command_for(s), env) for s in specs}
    # a witness of the exploration the policy node applies (what the trainer's recorder also hears)
    witness = rclpy.create_node("exploration_witness", context=ros_context)
    explored = []
    witness.create_subscription(Float64MultiArray, "/robot_wm/exploration", lambda m: explored.append(list(m.data)), 100)
    executor = SingleThreadedExecutor(context=ros_context)
    executor.add_node(witness)
    spinner = threading.Thread(target=executor.spin, daemon=True)
    spinner.start()
    arm = LiveArm("track", "nominal", TINY, episode_timeout_s=40.0, progress=lambda line: None)
    out = tmp_path / "run"
    try:
        base = default_base("track")
        report = train_mixed("track", base, out, "nominal", 6, TINY, TINY_ADAPT, progress=False, arm=arm, stop_after_rounds=1)
        if report["rounds"][-1].get("skipped"):  # interventions (a loaded machine: the filter's solver out of time)
            # ended round 1's episodes early, too few to train on: the run goes on, the next round trains on all
            report = train_mixed("track", base, out, "nominal", 6, TINY, TINY_ADAPT, progress=False, arm=arm,
                                 stop_after_rounds=1)
        trained = report["rounds"][-1]
        assert "skipped" not in trained, trained["skipped"]
        new_set = trained["registry"]["version"]
        new_wm = trained["world_model"]
        assert registry.active("track").version == new_set, "the round's set is the active one"
        # the running world_model node predicts with the round's world model; the policy node said it swapped
        active = registry.active("track")
        from robot_wm.core.onnx_model import read_sidecar

        assert arm.wm_version == read_sidecar(active.world_model_path)["version"], new_wm
        if trained["policy"]["accepted"]:
            assert any(read_sidecar(active.policy_path)["version"] in line for line in arm.swapped), arm.swapped
        # the node refuses exploration settings that break the rule, naming them (and keeps its own)
        arm.cfg = types.SimpleNamespace(exploration_tau_s=0.2, uncertainty_low_radps=0.05, uncertainty_high_radps=0.02)
        with pytest.raises(MixedError, match="refused.*exploration_uncertainty_low_radps"):
            arm._set_exploration(0.1)
        arm.cfg = TINY
    except Exception:
        print("\n".join(f"--- {n}\n{p.output()[-3000:]}" for n, p in procs.items()))
        raise
    finally:
        arm.close()
        executor.shutdown(timeout_sec=2.0)
        spinner.join(timeout=3.0)
        witness.destroy_node()
    real = sorted((out / "real").iterdir())
    assert len(real) == 3 * len(report["rounds"])
    for path in real:
        meta = bags.read_meta(path)
        m = meta.extra["mixed"]
        assert meta.extra["phase"] == "MIXED" and not meta.library and m["round"] in (1, len(report["rounds"]))
        assert m["exploration"]["enabled"] and m["exploration"]["std_fraction"] == TINY.exploration_std
        assert m["violations"] == {"joint_limit": 0, "tool_speed": 0, "workspace": 0}
        if m["ended"] is None:  # an episode that ran its course: the sequencer's length, the filter watched it
            assert meta.duration_s == pytest.approx(6.0, abs=0.05)
            assert m["exploration"]["scale_mean"] is not None and m["exploration"]["uncertainty_median_radps"] is not None
    # exploration happened in MIXED only, bounded by the rule, and is off again after the round
    samples = np.array(explored)
    assert samples.shape[0] > 100
    # (the policy node also reports its periods before the first TrustState: phase -1, scale 0, no exploration)
    exploring = samples[samples[:, 1] > 0]
    assert exploring.shape[0] > 0 and np.all(exploring[:, 3] == 1.0), "every exploring period was in the MIXED phase"
    assert np.all((samples[:, 1] >= 0) & (samples[:, 1] <= 1)) and samples[:, 1].max() > 0
    stopped = len(explored)
    time.sleep(1.0)
    assert len(explored) <= stopped + 2, "the policy node stopped exploring when the round ended"


@pytest.mark.ros
def test_a_live_run_is_refused_without_a_stack_or_outside_the_mixed_phase(ros_context, registry, monkeypatch, tmp_path):
    import rclpy
    from rclpy.qos import QoSProfile

    from robot_wm.learning import mixed_live
    from robot_wm.learning.adapt_cli import default_base
    from robot_wm.msg import TrustState

    monkeypatch.setattr(mixed_live, "READY_TIMEOUT_S", 3.0)
    arm = mixed_live.LiveArm("track", "nominal", TINY, progress=lambda line: None)
    try:
        with pytest.raises(MixedError, match="no TrustState"):
            arm.check(default_base("track"))
        # a trust monitor in SIM (a real TrustState on the real topic): refused, naming the phase and the way on
        node = rclpy.create_node("sim_phase_monitor", context=ros_context)
        pub = node.create_publisher(TrustState, "/robot_wm/trust", QoSProfile(depth=10))
        stop = threading.Event()

        def publish():
            while not stop.is_set():
                pub.publish(TrustState(level=TrustState.LEVEL_FULL, phase=TrustState.PHASE_SIM, reason="test"))
                time.sleep(0.05)

        t = threading.Thread(target=publish, daemon=True)
        t.start()
        try:
            assert wait_for(lambda: arm.recorder.trust_phase is not None, 10.0)
            with pytest.raises(MixedError, match="phase SIM.*trust promote"):
                arm.check(default_base("track"))
        finally:
            stop.set()
            t.join(timeout=2.0)
            node.destroy_node()
    finally:
        arm.close()


def test_the_policy_nodes_exploration_settings_are_checked_by_name():
    from robot_wm.core.exploration import OUNoise, check_settings, explore

    check_settings(0.1, 0.2, 0.008, 0.02)
    for args, name in (((1.5, 0.2, 0.0, 0.1), "exploration_std"), ((0.1, 0.0, 0.0, 0.1), "exploration_tau_s"),
                       ((0.1, 0.2, 0.03, 0.02), "uncertainty_low_radps"), ((float("nan"), 0.2, 0.0, 0.1), "exploration_std")):
        with pytest.raises(ValueError, match=name):
            check_settings(*args)
    # the noise: unit stationary variance, correlated over tau; explore() never leaves the limit
    noise = OUNoise(6, 0.01, 0.2, seed=3)
    x = np.array([noise.step().copy() for _ in range(20_000)])
    assert np.std(x[2000:]) == pytest.approx(1.0, abs=0.1)
    lag = int(0.2 / 0.01)
    corr = np.mean([np.corrcoef(x[2000:-lag, j], x[2000 + lag:, j])[0, 1] for j in range(6)])
    assert corr == pytest.approx(np.exp(-1.0), abs=0.1)
    limit = np.full(6, 1.0)
    for row in x[:500]:
        out = explore(np.full(6, 0.95), 10 * row, 1.0, 0.5, limit)
        assert np.all(np.abs(out) <= limit)
    assert np.array_equal(explore(np.full(6, 0.3), x[0], 0.0, 0.5, limit), np.full(6, 0.3))


def test_the_policy_node_explores_only_in_mixed_at_a_moving_level_with_a_fresh_finite_prediction(ros_context):
    """PolicyExploration, as the policy node runs it: a NaN or stale prediction, another phase, or a
    level below CAUTIOUS leaves the command alone; a parameter set that breaks the rule is refused and
    changes nothing."""
    from rclpy.node import Node
    from rclpy.parameter import Parameter

    from robot_wm.msg import WorldModelPrediction
    from robot_wm.nodes.policy_exploration import PolicyExploration

    class Host(Node):
        period_s = 0.01

    node = Host("exploration_host", context=ros_context)
    try:
        ex = PolicyExploration(node, 0.01)
        limit, action = np.full(6, 1.0), np.full(6, 0.2)
        assert ex.apply(action, limit, (0, 1)) is action  # off by default
        assert node.set_parameters([Parameter("exploration_std", value=0.3)])[0].successful

        def predict(u: float) -> None:
            msg = WorldModelPrediction(joint_names=[f"j{i}" for i in range(6)], velocity_std_epistemic_radps=[u] * 6)
            msg.header.stamp = node.get_clock().now().to_msg()
            ex._on_prediction(msg)

        assert np.array_equal(ex.apply(action, limit, (0, 1)), action), "no prediction yet: no exploration"
        predict(float("nan"))
        assert np.array_equal(ex.apply(action, limit, (0, 1)), action), "a NaN uncertainty: no exploration"
        predict(0.001)
        assert not np.array_equal(ex.apply(action, limit, (0, 1)), action), "MIXED, FULL, a sure model: it explores"
        for trust in ((0, 0), (0, 2), (2, 1), (3, 1), (4, 1), None, (99, 1)):
            assert np.array_equal(ex.apply(action, limit, trust), action), trust
        predict(0.05)
        assert np.array_equal(ex.apply(action, limit, (0, 1)), action), "an unsure model: conservative"
        predict(0.001)
        ex.uncertainty_ns -= int(1e9)  # a prediction a second old says nothing about now
        assert np.array_equal(ex.apply(action, limit, (0, 1)), action)
        result = node.set_parameters_atomically([Parameter("exploration_uncertainty_low_radps", value=0.5)])
        assert not result.successful and "exploration_uncertainty_low_radps" in result.reason
        assert ex.low == 0.008 and ex.std == 0.3
    finally:
        node.destroy_node()


def test_a_round_waiting_on_a_latched_filter_tells_the_operator_once(monkeypatch):
    """The trust level moves again but the filter still holds the arm (a latch from a trust STOP or
    an e-stop): the run says once what the operator must do, and goes on when the round is done."""
    import robot_wm.learning.mixed_live as ml

    monkeypatch.setattr(ml, "LATCH_NOTICE_S", 0.2)
    said: list[str] = []
    arm = object.__new__(ml.LiveArm)
    arm.progress = said.append
    rec = types.SimpleNamespace(done=threading.Event(), trust_level=0, filter_reason="")
    timer = threading.Timer(1.0, rec.done.set)
    rec.filter_reason = "trust: trust level STOP; trust level is STOP: a moving level must come first"
    timer.start()
    try:
        assert arm._wait_round(rec, 5.0)
    finally:
        timer.cancel()
    assert len(said) == 1 and "robot-wm reset" in said[0] and "trust level STOP" in said[0]
    rec.done.clear()
    rec.filter_reason, rec.trust_level = "", 0  # the filter runs: nothing to say
    threading.Timer(0.5, rec.done.set).start()
    assert arm._wait_round(rec, 5.0) and len(said) == 1
