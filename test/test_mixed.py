"""robot-wm train mixed: the alternation, uncertainty-bounded exploration, episodes ended by an
intervention or a trust drop, resume after a kill, and refusals."""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from robot_wm import bags, description
from robot_wm.core.safety import TrustLevel
from robot_wm.core.trust import calibration as calib_io
from robot_wm.learning.adapt import AdaptConfig
from robot_wm.learning.mixed import (EpisodeGuard, ExploringPolicy, MixedConfig, MixedError, exploration_scale,
                                     imagination_episodes, parse_ratio, run_real_episodes, train_mixed, _wm_version)
from robot_wm.paths import data_path

TRACK = Path(data_path("models", "track"))
REAL_TWIN_CAL = Path(data_path("models", "trust", "track", "real_twin.json"))
TINY_ADAPT = AdaptConfig(wm_epochs=2, wm_patience=2, critic_warmup=2, validate_every=2, eval_episodes=0,
                         replay_transitions=1600, threads=1)
TINY = MixedConfig(real_per_round=3, ratio="1:2", validation_every=3)


def _calibration():
    return calib_io.load(REAL_TWIN_CAL, _wm_version(TRACK))


# ------------------------------------------------------------------------------ settings
def test_ratio_and_settings_refused_with_the_reason():
    assert parse_ratio("1:10") == (1, 10) and parse_ratio("2:1") == (2, 1) and parse_ratio("1:0") == (1, 0)
    assert imagination_episodes(10, "1:10") == 100 and imagination_episodes(5, "2:3") == 7
    for bad in ("1", "0:5", "a:b", "1:-1", "1:2:3"):
        with pytest.raises(ValueError, match="ratio"):
            parse_ratio(bad)
    with pytest.raises(ValueError, match="uncertainty_low_radps"):
        MixedConfig(uncertainty_low_radps=0.03, uncertainty_high_radps=0.02)
    with pytest.raises(ValueError, match="end_level"):
        MixedConfig(end_level="SOMETIMES")
    with pytest.raises(ValueError, match="window_steps"):
        MixedConfig(window_steps=20)


# ------------------------------------------------------------------------------ exploration
@settings(max_examples=300, deadline=None)
@given(u1=st.floats(-1.0, 1.0), u2=st.floats(-1.0, 1.0), low=st.floats(0.0, 0.05), width=st.floats(1e-4, 0.05),
       level=st.sampled_from(list(TrustLevel)))
def test_exploration_scale_falls_with_uncertainty_and_is_zero_above_the_threshold(u1, u2, low, width, level):
    high = low + width
    a, b = sorted((u1, u2))
    sa, sb = exploration_scale(a, low, high, level), exploration_scale(b, low, high, level)
    assert 0.0 <= sb <= sa <= 1.0  # never more exploration where the model knows less
    factor = {TrustLevel.FULL: 1.0, TrustLevel.CAUTIOUS: 0.5}.get(level, 0.0)
    if b >= high:
        assert sb == 0.0
    if a <= low:
        assert sa == factor
    assert exploration_scale(float("nan"), low, high, level) == 0.0


_KIN = None


def _kinematics():
    global _KIN
    if _KIN is None:
        from robot_wm.core.kinematics import Kinematics

        urdf = description.expand()
        _KIN = Kinematics(urdf, description.joint_limits(urdf).names)
    return _KIN


@settings(max_examples=300, deadline=None)
@given(q=st.lists(st.floats(-3.0, 3.0), min_size=6, max_size=6), a=st.lists(st.floats(-1.0, 1.0), min_size=6, max_size=6),
       noise=st.lists(st.floats(-5.0, 5.0), min_size=6, max_size=6), std=st.floats(0.0, 1.0), scale=st.floats(0.0, 1.0),
       speed=st.sampled_from([1.0, 0.5, 0.25]))
def test_exploration_never_takes_the_command_past_a_limit_in_force(q, a, noise, std, scale, speed):
    """Adversarial states and noise: the explored command stays in the joint box in force and the tool
    within the budget of its speed limit in force, or, where the policy's own command is above the
    budget, no faster than the policy asked."""
    from robot_wm.core.exploration import TOOL_SPEED_BUDGET, explore

    kin = _kinematics()
    limit = np.full(6, 1.0) * speed
    action = np.asarray(a) * limit  # the policy's command, scaled to the speed in force
    jac = kin.tool_jacobian(np.asarray(q))[:3]  # linear rows: the tool speed
    v_max = 0.5 * speed
    out = explore(action, np.asarray(noise), scale, std, limit, jac, v_max)
    assert np.all(np.abs(out) <= limit + 1e-12)
    budget = TOOL_SPEED_BUDGET * v_max
    assert np.linalg.norm(jac @ out) <= max(budget, np.linalg.norm(jac @ action)) * (1 + 1e-9) + 1e-12
    # the tool rule only ever shrinks the joint-space noise, along its own direction
    free = explore(action, np.asarray(noise), scale, std, limit)
    d_free, d_out = free - action, out - action
    if np.linalg.norm(jac @ free) <= budget:  # the noise is cut only where it has to be
        np.testing.assert_array_equal(out, free)
    elif np.linalg.norm(jac @ action) < budget:  # ... and then just to the budget
        assert np.linalg.norm(jac @ out) == pytest.approx(budget, rel=1e-6)
    if np.linalg.norm(d_free) > 1e-9:
        k = float(d_out @ d_free) / float(d_free @ d_free)
        assert -1e-9 <= k <= 1.0 + 1e-9
        np.testing.assert_allclose(d_out, k * d_free, atol=1e-9)
    else:
        np.testing.assert_allclose(d_out, 0.0, atol=1e-9)


def test_the_exploring_policy_applies_the_rule_to_the_world_models_own_uncertainty():
    """Real policy and world model: the noise added is the rule's scale times one noise sequence;
    above the threshold the command is the policy's own."""
    from robot_wm import description
    from robot_wm.core.policy_runner import PolicyRunner
    from robot_wm.core.tasks import get_task
    from robot_wm.core.world_model_runner import WorldModelRunner

    task = get_task("track")
    names = description.joint_limits(description.expand()).names
    policy = PolicyRunner(TRACK / "policy.onnx", names, 0.01, task.action_limit_radps, task="track")
    wm = WorldModelRunner(TRACK / "world_model.onnx", names, 0.01, analytic=False)
    eps = task.episodes(3, 0, description.initial_positions(names))
    rng = np.random.default_rng(1)
    obs = []
    for i in range(3):
        q = eps.q0_rad[i] + rng.normal(0, 0.05, 6)
        obs.append(task.observation(eps, i, 2.0, q, rng.normal(0, 0.2, 6), np.array([0.4, 0.0, 0.4])))
    u = [float(np.max(wm.predict(o[:6], o[6:12], policy.act(o), commit=False).epistemic_std[6:])) for o in obs]
    lo_u, hi_u = min(u), max(u)

    def run(low, high):
        p = ExploringPolicy(policy, wm, dataclasses.replace(MixedConfig(), uncertainty_low_radps=low,
                                                            uncertainty_high_radps=high), task.action_limit_radps, 0.01, 7)
        return np.array([p.act(o) - policy.act(o) for o in obs]), p.log

    full, log_full = run(hi_u + 1.0, hi_u + 2.0)  # everything well below: full exploration
    off, log_off = run(0.0, lo_u * 0.999)  # everything above: none
    mid, log_mid = run(0.0, 2.0 * hi_u)  # in between: the linear scale
    assert np.all(off == 0.0) and all(s == 0.0 for _, s, _ in log_off)
    assert np.all(np.abs(full).max(axis=1) > 0) and all(s == 1.0 for _, s, _ in log_full)
    limit = np.asarray(task.action_limit_radps)
    for k, (uk, s, _) in enumerate(log_mid):
        assert s == pytest.approx(1.0 - uk / (2.0 * hi_u))
        unclipped = np.abs(policy.act(obs[k]) + full[k]) < limit
        np.testing.assert_allclose(mid[k][unclipped], s * full[k][unclipped], rtol=1e-9, atol=1e-12)
    # at the MIXED phase's speed (0.5) the noise is a fraction of the limit in force and never takes
    # the command past it: the filter's reduced limits are respected by the policy slot itself
    cfg = dataclasses.replace(MixedConfig(), exploration_std=1.0, uncertainty_low_radps=hi_u + 1.0,
                              uncertainty_high_radps=hi_u + 2.0)
    slow = ExploringPolicy(policy, wm, cfg, limit, 0.01, 7, speed_factor=lambda: 0.5)
    fast = ExploringPolicy(policy, wm, cfg, limit, 0.01, 7)
    for _ in range(200):
        for o in obs:
            a_slow, a_fast = slow.act(o), fast.act(o)
            assert np.all(np.abs(a_slow) <= 0.5 * limit + 1e-12)
            inside = (np.abs(a_fast) < limit) & (np.abs(a_slow) < 0.5 * limit)
            np.testing.assert_allclose(a_slow[inside], 0.5 * a_fast[inside], rtol=1e-9, atol=1e-12)
    # with the arm's kinematics the noise also keeps the tool within the budget of the tool-speed
    # limit in force (a tight 0.05 m/s here, so that the rule has work to do)
    from robot_wm.core.exploration import TOOL_SPEED_BUDGET

    kin, v_max = _kinematics(), 0.05
    tool = ExploringPolicy(policy, wm, cfg, limit, 0.01, 7, speed_factor=lambda: 0.5, kinematics=kin,
                           tool_speed_max_mps=v_max / 0.5)
    cut = 0
    for _ in range(100):
        for o in obs:
            a = tool.act(o)
            jac = kin.tool_jacobian(o[:6])[:3]
            own = np.linalg.norm(jac @ (0.5 * policy.act(o)))
            assert np.linalg.norm(jac @ a) <= max(TOOL_SPEED_BUDGET * v_max, own) * (1 + 1e-9)
            cut += np.linalg.norm(jac @ a) < np.linalg.norm(jac @ slow.act(o)) - 1e-9
    assert cut > 0


# ------------------------------------------------------------------------------ episodes that end early
def test_a_filter_stop_ends_the_episode_and_the_bag_says_so(tmp_path):
    """Fault injection: a 1 kN shove on the arm mid-episode; the filter stops it (an intervention),
    the episode ends there, counts as failed and its bag records why (and stays loadable)."""
    cfg = dataclasses.replace(MixedConfig(), end_level="HUMAN")  # only the filter ends it here
    [ep] = run_real_episodes("track", "real_twin", TRACK, _calibration(), [0], tmp_path, cfg, progress=False,
                             fault=(2.0, {"kind": "push", "force_n": [0.0, 0.0, -1000.0], "duration_s": 0.5}))
    assert ep["ended"].startswith("intervention: the safety filter went to") and not ep["success"]
    assert ep["periods"] < 600
    meta = bags.read_meta(tmp_path / "track_real_twin_0000")
    assert meta.extra["mixed"]["ended"] == ep["ended"] and meta.success is False and meta.extra["phase"] == "MIXED"
    assert meta.duration_s == pytest.approx(ep["periods"] * 0.01, abs=0.02)


def test_a_trust_drop_ends_the_episode_and_the_bag_says_so(tmp_path):
    [ep] = run_real_episodes("track", "real_twin", TRACK, _calibration(), [0], tmp_path, MixedConfig(), progress=False,
                             fault=(2.0, {"kind": "push", "force_n": [0.0, 0.0, -400.0], "duration_s": 0.5}))
    assert ep["ended"].startswith("trust drop: FULL -> ") and not ep["success"]
    assert bags.read_meta(tmp_path / "track_real_twin_0000").extra["mixed"]["ended"] == ep["ended"]
    # shorter than a training window: kept on disk, left out of the windows (and of the validation split)
    from robot_wm.learning.mixed import _long_enough, split_bags

    bag = tmp_path / "track_real_twin_0000"
    assert 100 < ep["periods"] < 400
    assert _long_enough([bag], 400) == [] and _long_enough([bag], 100) == [bag]
    assert split_bags([bag], 5) == ([bag], [])  # one episode: it trains (train_mixed then says validation is missing)


def test_the_guard_reads_the_real_filters_stop_and_only_a_drop_of_trust():
    from robot_wm import description
    from robot_wm.core.kinematics import Kinematics
    from robot_wm.core.safety import ControllerConfig, JointSample, SafetyController, load_safety_limits
    from robot_wm.core.trust.monitor import TrustOutput

    urdf = description.expand()
    names = description.joint_limits(urdf).names
    ctrl = SafetyController(load_safety_limits(), Kinematics(urdf, names), ControllerConfig(dt_s=0.01, require_model=False))
    q = np.asarray(description.initial_positions(names))
    res = ctrl.step(0.0, joint=JointSample(q, np.zeros(6), 0.0), nominal=None)
    guard = EpisodeGuard(TrustLevel.SLOW)
    assert guard(res, None).startswith("intervention")  # latched at start-up: ESTOP

    def trust(level):
        return TrustOutput(level, level, 1.0, 0.0, 1.0, {}, "why")

    guard = EpisodeGuard(TrustLevel.SLOW)
    assert guard(None, trust(TrustLevel.STOP)) is None  # still climbing after a start: not a drop
    assert guard(None, trust(TrustLevel.CAUTIOUS)) is None
    assert guard(None, trust(TrustLevel.SLOW)).startswith("trust drop: CAUTIOUS -> SLOW")


# ------------------------------------------------------------------------------ the loop
def _child(out: Path, registry: Path, real: int) -> subprocess.Popen:
    script = f"""
import dataclasses
from pathlib import Path
from robot_wm.learning.adapt import AdaptConfig
from robot_wm.learning.mixed import MixedConfig, train_mixed
train_mixed("track", Path({str(TRACK)!r}), Path({str(out)!r}), "real_twin", {real},
            MixedConfig(**{dataclasses.asdict(TINY)!r}), AdaptConfig(**{dataclasses.asdict(TINY_ADAPT)!r}),
            register=True, progress=False)
"""
    env = dict(os.environ, ROBOT_WM_MODELS_DIR=str(registry))
    return subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


@pytest.fixture(scope="module")
def killed_and_resumed(tmp_path_factory):
    """A run of 9 real episodes (3 rounds of 3), killed once its first round is done and the second
    has begun, then resumed by the same call."""
    root = tmp_path_factory.mktemp("mixed")
    out, registry = root / "run", root / "registry"
    child = _child(out, registry, 9)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and child.poll() is None:
            state = out / "mixed.json"
            if state.exists() and json.loads(state.read_text())["rounds"] and len(bags.list_bags(out / "real")[0]) >= 4:
                break
            time.sleep(0.2)
        assert child.poll() is None, f"the run ended before it could be killed: {child.stderr.read().decode()[-2000:]}"
        child.send_signal(signal.SIGKILL)
    finally:
        if child.poll() is None:
            child.kill()
        child.wait(timeout=30)
    before = json.loads((out / "mixed.json").read_text())
    os.environ["ROBOT_WM_MODELS_DIR"] = str(registry)
    try:
        report = train_mixed("track", TRACK, out, "real_twin", 9, TINY, TINY_ADAPT, register=True, progress=False,
                             evaluate=False)
    finally:
        del os.environ["ROBOT_WM_MODELS_DIR"]
    return before, report, out, registry


def test_a_killed_run_resumes_from_its_last_finished_round(killed_and_resumed):
    before, report, out, _ = killed_and_resumed
    assert len(before["rounds"]) == 1 and before["real_episodes_done"] == 3
    assert report["finished"] and report["real_episodes_done"] == 9
    assert [r["round"] for r in report["rounds"]] == [1, 2, 3]
    assert report["rounds"][0] == before["rounds"][0]  # the finished round is kept as it was
    indices = sorted(bags.read_meta(p).index for p in bags.list_bags(out / "real")[0])
    assert indices == list(range(9))  # every episode once: none lost, none run twice
    assert not bags.list_bags(out / "real")[1]  # an interrupted bag was moved aside, not trained on
    # the final set at the top of the run, the last round's
    assert (out / "policy.onnx").read_bytes() == (Path(report["rounds"][-1]["set"]) / "policy.onnx").read_bytes()
    assert (out / "trust" / "real_twin.json").exists()


def test_real_episodes_and_imagination_alternate_at_the_ratio(killed_and_resumed):
    _, report, out, _ = killed_and_resumed
    r, i = parse_ratio(TINY.ratio)
    for row in report["rounds"]:
        assert row["real_episodes"] == TINY.real_per_round
        assert row["policy"]["imagination_episodes"] == TINY.real_per_round * i // r
        assert row["world_model"]["training_windows"] > 0 and row["world_model"]["validation_windows"] > 0
    # the episodes of round k were run by the set of round k-1 (the alternation, read from the bags)
    sets = [TRACK] + [Path(row["set"]) for row in report["rounds"]]
    for p in bags.list_bags(out / "real")[0]:
        meta = bags.read_meta(p)
        k = meta.extra["mixed"]["round"]
        assert meta.models["world_model"] == _wm_version(sets[k - 1])
        assert meta.extra["phase"] == "MIXED" and meta.source == "policy"


def test_every_round_is_registered_with_its_lineage(killed_and_resumed):
    from robot_wm.registry import Registry

    _, report, _, registry = killed_and_resumed
    reg = Registry(registry)
    versions = [row["registry"]["version"] for row in report["rounds"]]
    infos = {i.version: i for i in reg.list("track")}
    assert all(v in infos for v in versions)
    assert [row["registry"]["parent"] for row in report["rounds"][1:]] == versions[:-1]
    assert report["rounds"][0]["registry"]["parent"] is not None  # the shipped track set
    assert reg.active("track").version not in versions  # never activated by the run (an operator's decision)
    side = json.loads((Path(report["rounds"][1]["set"]) / "world_model.json").read_text())
    assert side["lineage"]["mixed_round"] == 2 and len(side["lineage"]["real_bag_sha256"]) == 6


def test_a_run_with_other_settings_is_not_resumed_in_its_directory(killed_and_resumed):
    _, _, out, _ = killed_and_resumed
    with pytest.raises(MixedError, match="other settings"):
        train_mixed("track", TRACK, out, "real_twin", 12, dataclasses.replace(TINY, ratio="1:3"), TINY_ADAPT,
                    progress=False, evaluate=False)


def test_refusals_name_the_problem(tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    with pytest.raises(MixedError, match="not empty"):
        train_mixed("track", TRACK, tmp_path / "full", "real_twin", 3, TINY, TINY_ADAPT, progress=False)
    with pytest.raises(MixedError, match="no world_model.onnx"):
        train_mixed("track", tmp_path, tmp_path / "out", "real_twin", 3, TINY, TINY_ADAPT, progress=False)
    with pytest.raises(MixedError, match="real-episodes"):
        train_mixed("track", TRACK, tmp_path / "out2", "real_twin", 0, TINY, TINY_ADAPT, progress=False)


def test_the_cli_refuses_a_missing_arm_and_a_missing_profile(tmp_path):
    for argv, text in ((["train", "mixed", "--out", str(tmp_path / "a"), "--real-episodes", "3"], "say which arm"),
                       (["train", "mixed", "--library", "--out", str(tmp_path / "a"), "--real-episodes", "3"], "--profile"),
                       (["train", "mixed", "--library", "--profile", "nominal", "--robot", "ur5e", "--out", str(tmp_path / "a"),
                         "--real-episodes", "3"], "--robot is for a running stack")):
        proc = subprocess.run([sys.executable, "-m", "robot_wm.cli", *argv], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and text in proc.stderr, proc.stderr


def test_a_round_without_enough_usable_episodes_trains_nothing_and_the_next_trains_on_them_too(tmp_path, monkeypatch):
    """Fault injection: round 1's episodes all count as too short (as when interventions end them
    early on a loaded machine): the round records them and keeps the set in force, it does not end
    the run; round 2 trains on both rounds' episodes."""
    from robot_wm.learning import mixed

    calls = []
    real_long_enough = mixed._long_enough

    def first_round_unusable(paths, window):
        calls.append(len(paths))
        return [] if len(calls) == 1 else real_long_enough(paths, window)

    monkeypatch.setattr(mixed, "_long_enough", first_round_unusable)
    report = train_mixed("track", TRACK, tmp_path / "run", "real_twin", 6, TINY, TINY_ADAPT, progress=False, evaluate=False)
    first, second = report["rounds"]
    assert "too few usable real episodes" in first["skipped"] and first["world_model"] is None
    assert first["set"] == str(TRACK.resolve()) and not first["policy"]["accepted"]
    assert first["real_episodes"] == 3 and calls == [3, 6]
    assert "skipped" not in second and second["world_model"]["training_windows"] + second["world_model"]["validation_windows"] > 0
    assert report["finished"] and report["real_episodes_done"] == 6
    assert len(bags.list_bags(tmp_path / "run" / "real")[0]) == 6


def test_a_short_run_improves_a_deliberately_mismatched_policy(tmp_path):
    """The shipped tracking policy with its last layer knocked off (noise on its weights): six real
    episodes on the real twin and sixty imagination episodes later, the stack tracks new paths
    (SIM-phase limits, through the filter) clearly better, on the arm itself."""
    import shutil

    import torch

    from robot_wm import description
    from robot_wm.core.tasks import get_task
    from robot_wm.learning.adapt import _stack_eval
    from robot_wm.learning.onnx_import import policy_from_onnx
    from robot_wm.learning.policy import export_policy

    mismatched = tmp_path / "mismatched"
    mismatched.mkdir()
    actor, pcfg, _ = policy_from_onnx(TRACK / "policy.onnx", "track")
    with torch.no_grad():
        last = actor.net[-1]
        last.weight.add_(0.3 * torch.randn(last.weight.shape, generator=torch.Generator().manual_seed(0)))
    export_policy(actor, mismatched / "policy.onnx", joint_names=description.joint_limits(description.expand()).names,
                  task=get_task("track").spec, dataset_sha256="0" * 64, version="policy-mismatched-{onnx_sha8}", config=pcfg)
    for name in ("world_model.onnx", "world_model.json"):
        shutil.copyfile(TRACK / name, mismatched / name)
    before = _stack_eval(mismatched, "track", "real_twin", 6, 1000)
    adapt_cfg = dataclasses.replace(TINY_ADAPT, critic_warmup=10, validate_every=10)
    report = train_mixed("track", mismatched, tmp_path / "run", "real_twin", 6,
                         MixedConfig(real_per_round=6, ratio="1:10", validation_every=3), adapt_cfg, progress=False,
                         evaluate=False)
    [row] = report["rounds"]
    assert row["policy"]["accepted"] and row["policy"]["imagination_episodes"] == 60
    after = _stack_eval(tmp_path / "run", "track", "real_twin", 6, 1000)
    assert after["tracking_rms_m_median"] < 0.7 * before["tracking_rms_m_median"], (before, after)
    assert after["violations"] == 0
