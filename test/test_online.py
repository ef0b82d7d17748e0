"""Online adaptation without ROS: the buffer, the validation gate, the learner in library mode, the rollback rule.

The "real" arm is the embedded simulator on a profile (``trust_eval.operate``: the shipped reach
stack, the filter with its world model); the learner sees what the world_model node pairs.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from robot_wm import description
from robot_wm.core.kinematics import Kinematics
from robot_wm.core.trust.swap import SwapWatch, SwapWatchConfig
from robot_wm.learning.online import (
    LearnerConfig,
    OnlineLearner,
    RealBuffer,
    ValidationGate,
    held_out_samples,
)

URDF = description.expand()
JOINTS = tuple(description.joint_limits(URDF).names)
DT = 0.01


@pytest.fixture(scope="module")
def kin():
    return Kinematics(URDF, JOINTS)


def _record(profile: str, seconds: float, seed: int = 3, fault=None) -> np.ndarray:
    """(T, 3, 6) samples (q, qdot, command sent) of the library-mode stack on ``profile``."""
    from robot_wm.learning import trust_eval

    rows = []
    trust_eval.operate(profile, seconds, seed, fault=fault,
                       on_period=lambda t, q, qd, u: rows.append(np.array([q, qd, u])))
    return np.asarray(rows)


@pytest.fixture(scope="module")
def twin_samples():
    return _record("real_twin", 40.0)


# ------------------------------------------------------------------------------------------ the buffer
def test_the_buffer_keeps_a_fixed_memory_and_cuts_segments_at_gaps():
    cfg = LearnerConfig(buffer_s=1.0, window_s=0.2, reservoir_windows=3)
    buf = RealBuffer(6, DT, cfg)
    mem = buf.memory_bytes
    rng = np.random.default_rng(0)
    t = 0.0
    for i in range(2000):
        t += DT if i % 500 else 0.5  # a stop every 5 s
        assert buf.add(t, *rng.normal(size=(3, 6)))
    assert len(buf) == buf.capacity == 100 and buf.memory_bytes == mem
    assert 1 <= len(buf.reservoir) <= 3 and all(w.shape == (21, 3, 6) for w in buf.reservoir)
    tail_t, _ = buf.contiguous_tail()
    assert np.all(np.diff(tail_t) <= cfg.max_gap_periods * DT)
    t += 1.0  # a gap: the next sample starts a new segment
    assert buf.add(t, *np.zeros((3, 6)))
    assert len(buf.contiguous_tail()[0]) == 1
    # refused: non-finite, misshapen, not later than the previous sample
    assert not buf.add(t + DT, np.full(6, np.nan), np.zeros(6), np.zeros(6))
    assert not buf.add(t + DT, np.zeros(5), np.zeros(6), np.zeros(6))
    assert not buf.add(t, np.zeros(6), np.zeros(6), np.zeros(6))


def test_learner_settings_are_checked_naming_the_field():
    for bad, field in (({"buffer_s": -1.0}, "buffer_s"), ({"epochs": 0}, "epochs"), ({"real_share": 1.5}, "real_share"),
                       ({"coverage_band": (0.9, 0.8)}, "coverage_band"), ({"cpu_fraction": 2.0}, "cpu_fraction"),
                       ({"buffer_s": 4.0, "window_s": 2.0}, "buffer_s")):
        with pytest.raises(ValueError, match=field):
            LearnerConfig(**bad)


# ------------------------------------------------------------------------------------------ the gate
def _exported(tmp_path, name: str, change=None):
    """The shipped world model rebuilt from its ONNX, changed by ``change(model)``, exported as a runner."""
    import torch

    from robot_wm.core.world_model_runner import WorldModelRunner
    from robot_wm.learning.onnx_import import world_model_from_onnx
    from robot_wm.learning.world_model import export_world_model
    from robot_wm.paths import data_path

    model = world_model_from_onnx(data_path("models", "world_model.onnx"))
    if change is not None:
        with torch.no_grad():
            change(model)
    path = export_world_model(model, tmp_path / name / "world_model.onnx", "0" * 64, version=f"wm-{name}-{{onnx_sha8}}")
    return model, WorldModelRunner(path, JOINTS, DT, analytic=False)


def test_the_gate_rejects_corrupted_weights_and_a_model_of_another_arm_and_says_why(tmp_path, twin_samples):
    from robot_wm.learning.online import _parity

    _, active = _exported(tmp_path, "active")
    held = held_out_samples(twin_samples[-600:], active.action_history_length)
    gate = ValidationGate(LearnerConfig(), None)
    # corrupted weights: the second hidden layer scaled
    model, bad = _exported(tmp_path, "corrupted", lambda m: m.hidden[1].weight.mul_(1.5))
    verdict = gate.judge(bad, active, held, _parity(model, bad))
    assert not verdict.accepted and "less than 5% better" in verdict.text, verdict.text
    assert verdict.metrics["candidate_rmse_qdot_radps"] > verdict.metrics["active_rmse_qdot_radps"]
    # the same model judged against itself gains nothing
    model, same = _exported(tmp_path, "same")
    verdict = gate.judge(same, active, held, _parity(model, same))
    assert not verdict.accepted and verdict.metrics["rmse_gain"] == pytest.approx(0.0, abs=1e-6)
    # an export that does not match what was trained is refused whatever its numbers
    verdict = gate.judge(same, active, held, 5e-3)
    assert not verdict.accepted and "exported ONNX differs from the trained model" in verdict.text
    # a model fine-tuned on another arm (worn_heavy) does worse on this one (real_twin)
    other = _record("worn_heavy", 30.0, seed=5)
    tuned = _finetuned_on(tmp_path, other)
    verdict = gate.judge(tuned, active, held, 0.0)
    assert not verdict.accepted, verdict.text


def _finetuned_on(tmp_path, samples: np.ndarray):
    """The shipped world model fine-tuned on ``samples`` (as the learner does), exported."""
    from robot_wm.core.world_model_runner import WorldModelRunner
    from robot_wm.learning.adapt import AdaptConfig, finetune_world_model
    from robot_wm.learning.onnx_import import world_model_from_onnx
    from robot_wm.learning.online import windows_dataset
    from robot_wm.learning.world_model import export_world_model
    from robot_wm.paths import data_path

    data = windows_dataset(samples, 200, DT, JOINTS, Kinematics(URDF, JOINTS), "real")
    train, stop = data.subset(np.arange(data.n_episodes - 2)), data.subset(np.arange(data.n_episodes - 2, data.n_episodes))
    model, _ = finetune_world_model(world_model_from_onnx(data_path("models", "world_model.onnx")), train, stop, None,
                                    AdaptConfig(wm_epochs=6, wm_lr=1e-3, replay_transitions=0, threads=1), progress=False)
    path = export_world_model(model, tmp_path / "other_arm" / "world_model.onnx", "0" * 64, version="wm-other-{onnx_sha8}")
    return WorldModelRunner(path, JOINTS, DT, analytic=False)


def test_the_gate_checks_coverage_and_the_simulator_reference(tmp_path, twin_samples):
    model, active = _exported(tmp_path, "active")
    held = held_out_samples(twin_samples[-600:], active.action_history_length)
    # intervals shrunk 100x: they cover almost none of the errors
    model, narrow = _exported(tmp_path, "narrow", lambda m: m.set_variance_scale([1e-4] * 12))
    verdict = ValidationGate(LearnerConfig(min_improvement=0.0, min_nll_gain=-1e9), None).judge(narrow, active, held, 0.0)
    assert not verdict.accepted and "90 % intervals cover" in verdict.text, verdict.text
    # the simulator reference: a copy of the held-out set standing in, the corrupted model regresses on it
    model, bad = _exported(tmp_path, "corrupted", lambda m: m.hidden[1].weight.mul_(1.5))
    gate = ValidationGate(LearnerConfig(min_improvement=-1.0, min_nll_gain=-1e9, coverage_band=(0.01, 1.0)), held)
    verdict = gate.judge(bad, active, held, 0.0)
    assert not verdict.accepted and "simulator reference error grew" in verdict.text, verdict.text


def test_the_gate_refuses_a_candidate_the_safety_filter_would_refuse(tmp_path, twin_samples, kin):
    """A candidate whose slope for one joint has the wrong sign (the current command's input to the
    network negated for shoulder_lift) would make the filter stop the arm (MODEL_IMPLAUSIBLE): the
    gate asks the filter's check_model at every held-out state and refuses it, naming the joint; the
    active model itself passes the same check, and an unchanged copy gets through."""
    from robot_wm.learning.online import SlopeCheck

    _, active = _exported(tmp_path, "active")
    held = held_out_samples(twin_samples[-600:], active.action_history_length)
    lax = LearnerConfig(min_improvement=-1.0, min_nll_gain=-1e9, coverage_band=(0.01, 1.0), max_sim_regression=1.0)
    gate = ValidationGate(lax, None, SlopeCheck(kin.velocity_limits_radps, DT, JOINTS))
    _, same = _exported(tmp_path, "same")
    verdict = gate.judge(same, active, held, 0.0)
    assert verdict.accepted, verdict.text
    assert verdict.metrics["candidate_filter_refusals"] == verdict.metrics["active_filter_refusals"] == 0.0

    def wrong_sign(m):
        col = m.n_features - 6 * m.config.qdot_history - 6 + 1  # features: q, qdot, commands (u_t last), qdot history
        m.hidden[0].weight[:, col, :].mul_(-1.0)

    model, flipped = _exported(tmp_path, "flipped", wrong_sign)
    verdict = gate.judge(flipped, active, held, 0.0)
    assert not verdict.accepted, verdict.text
    assert "safety filter would refuse its linearization" in verdict.text and "shoulder_lift_joint" in verdict.text
    assert verdict.metrics["candidate_filter_refusals"] > 0.5 * len(held.q)
    # the reason is the check's own (its prediction error is also far worse: no margin lets that in)
    assert "safety filter" not in ValidationGate(lax, None).judge(flipped, active, held, 0.0).text


# ------------------------------------------------------------------------------------------ the learner
def test_the_learner_adapts_to_a_payload_and_registers_with_lineage(tmp_path, kin):
    """Library mode, real_twin with 2.5 kg added at 15 s: the learner's accepted candidates go into the
    registry as the active set (lineage: the parent set, the data window, the gate's numbers), the
    stack swaps them in between two periods, and on the same recorded periods the last accepted model
    predicts the payload arm better than the shipped one."""
    from robot_wm.core.world_model_runner import WorldModelRunner
    from robot_wm.learning import trust_eval
    from robot_wm.registry import Registry

    reg = Registry(root=tmp_path / "models")
    reg.ensure_shipped()
    shipped = reg.active("reach")
    cfg = LearnerConfig(min_new_s=8.0, min_train_s=8.0, train_s=16.0, validation_s=4.0, epochs=6,
                        replay_transitions=1600, reference_transitions=1600, cpu_fraction=1.0)
    learner = OnlineLearner("reach", cfg, reg, kin, DT, log_path=tmp_path / "attempts.jsonl")
    rows = []

    def on_period(t, q, qd, u):
        rows.append(np.array([q, qd, u]))
        learner.add(t, q, qd, u)
        if learner.ready()[0] and learner.attempt().accepted:
            return str(reg.active("reach").world_model_path)
        return None

    old_payload = trust_eval.FAULTS["payload"]
    run = trust_eval.operate("real_twin", 60.0, 3, fault=("payload", 15.0), on_period=on_period)
    assert trust_eval.FAULTS["payload"] == old_payload
    accepted = [a for a in learner.attempts if a.accepted]
    assert accepted, [a.verdict.text if a.verdict else a.error for a in learner.attempts]
    active = reg.active("reach")
    assert active.version == accepted[-1].set_version and active.parent == accepted[-1].previous_set_version
    assert active.lineage["online"]["real_window"]["samples"] > 0 and "candidate_rmse_qdot_radps" in active.lineage["metrics"]
    assert not reg.verify("reach", active.version)  # every file hashed and intact
    log = [json.loads(line) for line in (tmp_path / "attempts.jsonl").read_text().splitlines()]
    assert len(log) == len(learner.attempts) and [e["accepted"] for e in log] == [a.accepted for a in learner.attempts]
    assert [v for _, v in run.swaps] == [a.world_model_version for a in accepted]
    # on the last 10 s (payload on), the adapted model predicts better than the shipped one
    tail = np.asarray(rows)[-1000:]
    errs = {}
    for name, path in (("shipped", shipped.world_model_path), ("adapted", active.world_model_path)):
        runner = WorldModelRunner(path, JOINTS, DT, analytic=False)
        held = held_out_samples(tail, runner.action_history_length)
        out = runner.predict_batch(held.q, held.qd, held.actions)
        errs[name] = float(np.sqrt(np.mean((out.next_qdot_radps - held.next_state[:, 6:]) ** 2)))
    assert errs["adapted"] < 0.95 * errs["shipped"], errs
    # the calibrations came along, re-issued for the new world model
    cal = json.loads(active.calibration_path("real_twin").read_text())
    assert cal["model_version"] == accepted[-1].world_model_version and "inherited" in cal["source"]


def test_an_attempt_without_an_active_set_or_data_is_recorded_not_raised(tmp_path, kin):
    from robot_wm.registry import Registry

    learner = OnlineLearner("reach", LearnerConfig(), Registry(root=tmp_path / "empty"), kin, DT)
    att = learner.attempt()
    assert not att.accepted and "no active reach set" in att.error
    assert learner.ready() == (False, "0.0 of 12 s of new data")


# ------------------------------------------------------------------------------------------ rollback rule
CFG = SwapWatchConfig(factor=1.5, hold_s=1.0, window_s=1.0, watch_s=10.0)


def _run(errors_old, errors_new, shadow=None, swap_at=200):
    """Feed SwapWatch: the old model until ``swap_at``, then the new one; return (verdict period or None, watch)."""
    watch = SwapWatch(CFG, DT)
    for k in range(len(errors_new)):
        t = k * DT
        if k < swap_at:
            v = watch.update(t, "old", errors_old[k])
        else:
            v = watch.update(t, "new", errors_new[k], None if shadow is None else shadow[k])
        if v is not None:
            return k, watch
    return None, watch


def test_a_model_worse_on_the_live_arm_is_rolled_back_after_the_hold():
    n = 1200
    old, new = np.full(n, 0.01), np.full(n, 0.02)  # the new model is twice as wrong
    k, watch = _run(old, new)
    assert k is not None and watch.verdict.previous_version == "old" and watch.verdict.version == "new"
    assert (k - 200) * DT >= CFG.window_s + CFG.hold_s - 2 * DT
    assert "before the swap" in watch.verdict.reason
    k, _ = _run(old, np.full(n, 0.013))  # worse, but within the factor
    assert k is None


def test_a_change_of_the_arm_right_after_a_swap_is_not_blamed_on_the_new_model():
    """The arm changes (a payload) just after the swap: both models' errors rise; the shadow shows the
    new model is no worse than the old on the same periods: no rollback (the pre-swap baseline would)."""
    n = 1200
    old = np.full(n, 0.01)
    new, shadow = np.full(n, 0.03), np.full(n, 0.035)
    assert _run(old, new)[0] is not None  # without the shadow: rolled back (the confusion it avoids)
    assert _run(old, new, shadow)[0] is None
    k, watch = _run(old, new, np.full(n, 0.015))  # with the shadow showing the new model worse: rolled back
    assert k is not None and "on the same periods (shadow)" in watch.verdict.reason


def test_a_model_the_safety_filter_refuses_after_a_swap_is_rolled_back_at_once():
    """Refusals of the just swapped-in model count within watch_s of its swap; ``refusals`` of them ask
    for a rollback, however good its error; refusals of another version, of a model never swapped in,
    or after the watch do not."""
    cfg = SwapWatchConfig(factor=1.5, hold_s=1.0, window_s=1.0, watch_s=10.0, refusals=3)
    watch = SwapWatch(cfg, DT)
    for k in range(100):
        watch.update(k * DT, "old", 0.01)
    assert watch.refused(0.5, "old", "slope") is None  # the first model: no swap to undo
    watch.update(1.0, "new", 0.005)
    assert watch.refused(1.01, "old", "slope") is None  # the replaced model, late: not the new one's
    assert watch.refused(1.02, "new", "slope B implausible") is None
    assert watch.refused(3.0, "new", "slope B implausible") is None
    verdict = watch.refused(4.0, "new", "model slope B implausible here (shoulder_lift_joint)")
    assert verdict is not None and (verdict.version, verdict.previous_version) == ("new", "old")
    assert "refused its linearization in 3 periods within 3.0 s" in verdict.reason and "shoulder_lift_joint" in verdict.reason
    assert watch.refused(4.1, "new", "again") is None  # asked once
    # a swap resets the count; refusals after the watch are not the swap's
    watch.update(5.0, "newer", 0.005)
    watch.refused(5.1, "newer", "x")
    watch.refused(5.2, "newer", "x")
    assert watch.refused(15.3, "newer", "x") is None
    with pytest.raises(ValueError, match="refusals"):
        SwapWatchConfig(refusals=0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.001, 0.1), min_size=50, max_size=50), st.floats(0.2, 1.4))
def test_no_rollback_while_the_new_model_is_within_the_factor_of_the_old_on_the_same_periods(base, ratio):
    """Property: whatever the errors, a new model whose error is at most ``factor`` x the shadow's on
    every period is never rolled back, and nothing is watched past watch_s."""
    old = np.resize(np.array(base), 2000)
    shadow = np.resize(np.array(base[::-1]), 2000)
    new = shadow * ratio
    k, watch = _run(old, new, shadow)
    assert k is None
    assert not watch.watching  # watch_s over: the new model stays
    assert math.isfinite(watch.baseline)
