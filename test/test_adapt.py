"""robot-wm adapt: models rebuilt from their ONNX graphs, the fine-tune on a tiny shifted set, refusals."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from robot_wm.learning import demos
from robot_wm.learning.adapt import AdaptConfig, AdaptError, adapt
from robot_wm.learning.onnx_import import policy_from_onnx, world_model_from_onnx
from robot_wm.paths import data_path

TRACK = Path(data_path("models", "track"))
TINY = AdaptConfig(wm_epochs=15, wm_patience=6, policy_iterations=6, critic_warmup=2, validate_every=2, eval_episodes=0,
                   replay_transitions=3200, holdout_fraction=0.25, test_fraction=0.25, threads=1)


@pytest.fixture(scope="module")
def shifted(tmp_path_factory):
    """Four library-mode episodes on worn_heavy (heavy links, slow drives: far from the training arms)."""
    out = tmp_path_factory.mktemp("worn_heavy")
    demos.record_library("track", "worn_heavy", 4, out, progress=False)
    return out


def test_shipped_models_rebuild_exactly_from_their_onnx_graphs():
    """The fine-tune starts from the deployed weights: rebuilt from the ONNX initializers and checked
    against onnxruntime inside the loaders (which raise on a mismatch)."""
    wm = world_model_from_onnx(TRACK / "world_model.onnx")
    assert wm.members == 5 and wm.variance_scale_or_none() is None
    actor, cfg, side = policy_from_onnx(TRACK / "policy.onnx", "track")
    assert side["version"].startswith("policy-") and cfg.prior == "scripted"
    with pytest.raises(AdaptError, match="not 'reach'"):
        policy_from_onnx(TRACK / "policy.onnx", "reach")


def test_variance_scale_travels_through_the_exported_graph(tmp_path):
    from robot_wm.learning.world_model import export_world_model

    wm = world_model_from_onnx(TRACK / "world_model.onnx")
    q, qd, a = torch.zeros(2, 6), torch.full((2, 6), 0.1), torch.full((2, 3, 6), 0.2)
    before = wm.predict(q, qd, a)
    scale = torch.linspace(0.5, 3.0, 12)
    wm.set_variance_scale(scale)
    after = wm.predict(q, qd, a)
    torch.testing.assert_close(after.aleatoric_var, before.aleatoric_var * scale)
    torch.testing.assert_close(after.epistemic_var, before.epistemic_var * scale)
    torch.testing.assert_close(after.next_qdot_radps, before.next_qdot_radps)
    path = export_world_model(wm, tmp_path / "world_model.onnx", "0" * 64, version="wm-test-{onnx_sha8}")
    again = world_model_from_onnx(path)  # parity with the new graph is checked inside
    torch.testing.assert_close(again.variance_scale_or_none(), scale)
    with pytest.raises(ValueError, match="finite positive"):
        wm.set_variance_scale(torch.zeros(12))


def test_adapt_improves_held_out_prediction_on_a_shifted_arm(shifted, tmp_path):
    """Seconds of fine-tuning on two worn_heavy episodes (one more for validation): the one-step
    error on the test episode, which nothing was fit or tuned on, falls; the intervals are
    recalibrated; both models export and load in the runtime, and the sidecars carry the lineage
    (parent versions, the bags' hashes)."""
    from robot_wm import description
    from robot_wm.core.onnx_model import read_sidecar
    from robot_wm.core.policy_runner import PolicyRunner
    from robot_wm.core.world_model_runner import WorldModelRunner

    out = tmp_path / "adapted"
    report = adapt("track", shifted, TRACK, out, TINY, progress=False, command="pytest")
    wm = report["world_model"]
    assert (report["train_episodes"], report["holdout_episodes"], report["test_episodes"]) == (2, 1, 1)
    assert wm["after"]["one_step"]["rmse_qdot_radps"] < 0.9 * wm["before"]["one_step"]["rmse_qdot_radps"]
    assert abs(wm["after"]["calibration"]["coverage90"] - 0.9) <= 0.1  # scaled on the validation episode
    assert report["policy"]["validation"][0][0] == TINY.critic_warmup  # the base actor was a candidate
    assert len(wm["finetune"]["variance_scale"]) == 12
    names = description.joint_limits(description.expand()).names
    runner = WorldModelRunner(out / "world_model.onnx", names, 0.01)
    assert runner.version == report["versions"]["world_model"] != report["base_versions"]["world_model"]
    policy = PolicyRunner(out / "policy.onnx", names, 0.01, np.ones(6), task="track")
    assert policy.version == report["versions"]["policy"]
    for kind in ("world_model", "policy"):
        lineage = read_sidecar(out / f"{kind}.onnx")["lineage"]
        assert lineage["parent_version"] == report["base_versions"][kind]
        assert sorted(lineage["demo_bag_sha256"]) == sorted(report["demo_bag_sha256"])
        assert lineage["demo_robots"] == ["worn_heavy"]
    saved = json.loads((out / "adapt.json").read_text())
    assert saved["versions"] == report["versions"] and saved["timing"]["train_cpu_s"] > 0


def test_policy_fine_tune_holds_the_actor_during_the_critic_warm_up(shifted):
    """With the warm-up covering every iteration the actor comes back unchanged: a fresh critic
    alone never moves a working policy."""
    from robot_wm import description
    from robot_wm.core.tasks import get_task
    from robot_wm.learning.pipeline import WorldModelDynamics
    from robot_wm.learning.policy import train_policy
    from robot_wm.learning.torch_kinematics import TorchToolFK

    actor, cfg, _ = policy_from_onnx(TRACK / "policy.onnx", "track")
    data, _, _ = demos.load_demos(shifted)
    urdf = description.expand()
    names = description.joint_limits(urdf).names
    import dataclasses

    small = dataclasses.replace(cfg, iterations=3, batch=32)
    out, _ = train_policy(small, WorldModelDynamics(world_model_from_onnx(TRACK / "world_model.onnx")),
                          TorchToolFK(urdf, names), data, get_task("track").spec, description.initial_positions(names),
                          progress=False, init_actor=actor, critic_warmup=3)
    for (k, a), b in zip(actor.state_dict().items(), out.state_dict().values()):
        torch.testing.assert_close(a, b, msg=k)


def test_adapt_refuses_what_it_cannot_use(shifted, tmp_path):
    from robot_wm.bags import BagError

    one = tmp_path / "one"
    one.mkdir()
    first = sorted(p for p in shifted.iterdir())[0]
    (one / first.name).symlink_to(first, target_is_directory=True)
    with pytest.raises(AdaptError, match="at least 3"):
        adapt("track", one, TRACK, tmp_path / "o1", TINY, progress=False)
    with pytest.raises(BagError, match="not 'reach'"):
        adapt("reach", shifted, Path(data_path("models")), tmp_path / "o2", TINY, progress=False)
    (tmp_path / "empty").mkdir()
    with pytest.raises(BagError, match="no demonstration bags"):
        adapt("track", tmp_path / "empty", TRACK, tmp_path / "o3", TINY, progress=False)
    bad = tmp_path / "bad_base"
    bad.mkdir()
    for f in ("world_model.onnx", "policy.onnx", "policy.json"):
        (bad / f).write_bytes((TRACK / f).read_bytes())
    side = json.loads((TRACK / "world_model.json").read_text())
    side.pop("config")
    (bad / "world_model.json").write_text(json.dumps(side))
    with pytest.raises(AdaptError, match="no training config"):
        adapt("track", shifted, bad, tmp_path / "o4", TINY, progress=False)


def test_adapt_cli_writes_the_set_the_report_and_registers_it(shifted, tmp_path, capsys, monkeypatch):
    from robot_wm import registry
    from robot_wm.cli import main

    monkeypatch.setenv("ROBOT_WM_MODELS_DIR", str(tmp_path / "registry"))
    out = tmp_path / "set"
    with pytest.raises(SystemExit) as code:
        main(["adapt", "--task", "track", "--demos", str(shifted), "--out", str(out), "--wm-epochs", "2",
              "--policy-iterations", "3", "--replay", "0", "--no-eval", "--threads", "1", "--no-progress",
              "--activate", "--json"])
    assert code.value.code == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (out / "adapt.png").stat().st_size > 10_000
    reg = registry.Registry()
    active = reg.active("track")
    assert active.version == report["registry"]["version"] and active.parent == report["registry"]["parent"]
    assert active.parent == "track-0001-" + active.parent.split("-")[-1]  # the shipped tracking set
    assert registry.resolve("track", "policy").parent == active.path
    with pytest.raises(SystemExit) as code:
        main(["adapt", "--task", "track", "--demos", str(shifted), "--out", str(out), "--no-progress"])
    assert code.value.code == 2
    assert "not empty" in capsys.readouterr().err


def test_validation_keeps_the_best_actor_and_is_deterministic(shifted):
    """The fine-tune returns the actor its validation scored best: when that is the starting one,
    the base policy comes back unchanged; the imagined-tracking validation gives the same score
    for the same actor."""
    import dataclasses

    from robot_wm import description
    from robot_wm.core.tasks import get_task
    from robot_wm.learning.adapt import ImaginedTracking
    from robot_wm.learning.pipeline import WorldModelDynamics
    from robot_wm.learning.policy import train_policy
    from robot_wm.learning.torch_kinematics import TorchToolFK

    actor, cfg, _ = policy_from_onnx(TRACK / "policy.onnx", "track")
    wm = world_model_from_onnx(TRACK / "world_model.onnx")
    data, _, _ = demos.load_demos(shifted)
    urdf = description.expand()
    names = description.joint_limits(urdf).names
    fk = TorchToolFK(urdf, names)
    spec = get_task("track").spec
    check = ImaginedTracking(wm, data, spec, fk, n=16, horizon=20)
    first = check(actor)
    assert first == check(actor) and 0.0 < first < 0.02
    calls = []

    def validate(a):  # the first (unchanged) actor scores best
        calls.append(1)
        return 0.0 if len(calls) == 1 else 1.0

    small = dataclasses.replace(cfg, iterations=4, batch=32, actor_lr=1e-2)
    out, report = train_policy(small, WorldModelDynamics(wm), fk, data, spec, description.initial_positions(names),
                               progress=False, init_actor=actor, validate=validate, validate_every=2)
    assert [it for it, _ in report.validation] == [0, 2, 4]
    for (k, a), b in zip(actor.state_dict().items(), out.state_dict().values()):
        torch.testing.assert_close(a, b, msg=k)
