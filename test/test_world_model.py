"""World-model ensemble: learns, knows what it does not know, exports one graph, and the runner uses it."""
from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from robot_wm import description
from robot_wm.contracts import world_model_signature
from robot_wm.core.onnx_model import ModelError, load_model
from robot_wm.core.task import load_task
from robot_wm.core.world_model_runner import WorldModelInputError, WorldModelRunner
from robot_wm.learning.config import ConfigError, load_section
from robot_wm.learning.data import CollectConfig, collect
from robot_wm.learning.world_model import (
    WorldModel,
    WorldModelConfig,
    export_world_model,
    load_checkpoint,
    save_checkpoint,
)
from robot_wm.learning.world_model_training import make_transitions, train_world_model
from robot_wm.learning.world_model_eval import ConstantVelocityPredictor, evaluate_world_model
from robot_wm.paths import config_path

URDF = description.expand()
JOINTS = description.joint_limits(URDF).names
TASK = load_task()
TINY = WorldModelConfig(members=5, hidden_sizes=(128, 128), epochs=15, batch_size=128, lr=2e-3, patience=15, seed=0)


@pytest.fixture(scope="module")
def data():
    """Randomized training episodes and separately collected held-out episodes (a few seconds)."""
    train = collect(CollectConfig(transitions=9600, n_envs=32, episode_steps=100, seed=3), TASK, progress=False)
    held = collect(CollectConfig(transitions=1600, n_envs=16, episode_steps=100, seed=4), TASK, progress=False)
    return train, held


@pytest.fixture(scope="module")
def trained(data):
    torch.manual_seed(0)
    return train_world_model(TINY, data[0], progress=False)


@pytest.fixture(scope="module")
def exported(trained, data, tmp_path_factory):
    path = tmp_path_factory.mktemp("wm") / "world_model.onnx"
    export_world_model(trained[0], path, data[0].sha256, metrics={"note": "test"})
    return path


def test_training_reduces_the_holdout_loss_and_beats_constant_velocity(trained, data):
    model, report = trained
    assert min(report.best_holdout_nll) < report.initial_holdout_nll
    assert report.holdout_mse[-1] < report.initial_holdout_mse
    ours = evaluate_world_model(model, data[1], horizons=(10, 50), start_stride=25, urdf_xml=URDF)
    base = evaluate_world_model(ConstantVelocityPredictor(TASK.control_dt_s), data[1], start_stride=25, urdf_xml=URDF)
    assert ours["one_step"]["rmse_qdot_radps"] < 0.8 * base["one_step"]["rmse_qdot_radps"]
    assert ours["rollout"]["10"]["tool_err_mean_m"] < 0.8 * base["rollout"]["10"]["tool_err_mean_m"]
    assert ours["rollout"]["50"]["tool_err_mean_m"] < 0.8 * base["rollout"]["50"]["tool_err_mean_m"]
    assert 0.5 < ours["calibration"]["coverage90"] <= 1.0


def test_onnx_matches_torch_for_several_batch_sizes(trained, exported):
    model = trained[0]
    onnx = load_model(exported, "world_model", JOINTS, TASK.control_dt_s)
    contract = world_model_signature(model.action_history)
    assert [(d["name"], d["shape"]) for d in onnx.meta["inputs"]] == [(t.name, list(t.shape)) for t in contract.inputs]
    assert [(d["name"], d["shape"]) for d in onnx.meta["outputs"]] == [(t.name, list(t.shape)) for t in contract.outputs]
    assert onnx.meta["ensemble_size"] == 5 and onnx.meta["action_history"] == model.action_history
    assert len(onnx.meta["normalization"]["feature_mean"]) == model.n_features
    import onnx as onnx_lib

    ops = [node.op_type for node in onnx_lib.load(str(exported)).graph.node]
    assert ops.count("MatMul") == len(model.config.hidden_sizes) + 1  # one batched matmul per layer, all members
    gen = torch.Generator().manual_seed(1)
    home = torch.as_tensor(description.initial_positions(JOINTS), dtype=torch.float32)
    for b in (1, 13, 100):
        q = home + 0.8 * torch.randn(b, 6, generator=gen)
        qd = torch.randn(b, 6, generator=gen)
        act = torch.randn(b, model.action_history, 6, generator=gen)
        with torch.no_grad():
            expected = model(q, qd, act)
        got = onnx.run(q_rad=q.numpy(), qdot_radps=qd.numpy(), action_radps=act.numpy())
        for name, ref in zip(contract.output_names, expected):
            assert got[name].shape == tuple(ref.shape)
            np.testing.assert_allclose(got[name], ref.numpy(), atol=1e-5, rtol=0, err_msg=f"{name}, batch {b}")


def test_corrupted_or_mismatched_models_are_refused(exported, tmp_path):
    shutil.copy(exported, tmp_path / "wm.onnx")
    raw = json.loads(exported.with_suffix(".json").read_text())
    raw["onnx_file"] = "wm.onnx"

    def sidecar(**changes):
        (tmp_path / "wm.json").write_text(json.dumps(raw | changes))

    sidecar()
    load_model(tmp_path / "wm.onnx", "world_model", JOINTS, TASK.control_dt_s)  # the copy itself is fine
    sidecar(joint_names=list(reversed(JOINTS)))
    with pytest.raises(ModelError, match="joint order"):
        load_model(tmp_path / "wm.onnx", "world_model", JOINTS, TASK.control_dt_s)
    sidecar(model_kind="policy")
    with pytest.raises(ModelError, match="'policy' model, expected 'world_model'"):
        load_model(tmp_path / "wm.onnx", "world_model", JOINTS, TASK.control_dt_s)
    sidecar(dt_s=0.02)
    with pytest.raises(ModelError, match="dt_s=0.02"):
        WorldModelRunner(tmp_path / "wm.onnx", JOINTS, TASK.control_dt_s)
    sidecar()
    blob = bytearray((tmp_path / "wm.onnx").read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    (tmp_path / "wm.onnx").write_bytes(bytes(blob))
    with pytest.raises(ModelError, match="SHA-256"):
        WorldModelRunner(tmp_path / "wm.onnx", JOINTS, TASK.control_dt_s)


def test_epistemic_variance_grows_far_outside_the_training_data(trained, data):
    model = trained[0]
    tr = make_transitions(data[1], model.action_history)
    inside = model.predict(tr.q_rad, tr.qdot_radps, tr.action_radps).epistemic_var
    far_q = tr.q_rad + 3.0  # poses ~170 degrees away on every joint
    far_v = 6.0 * torch.sign(tr.qdot_radps + 1e-3)  # joint speeds well beyond every command seen
    far_a = 6.0 * torch.sign(tr.action_radps + 1e-3)
    outside = model.predict(far_q, far_v, far_a).epistemic_var
    # per state component: the median far-out disagreement dwarfs the in-distribution one
    ratio = outside.median(0).values / inside.median(0).values
    assert torch.all(ratio > 10.0), ratio


def test_runner_linearize_matches_finite_differences_of_predict(exported, data):
    runner = WorldModelRunner(exported, JOINTS, TASK.control_dt_s)
    d = data[1]
    q, qd = d.q_rad[0, 40], d.qdot_radps[0, 40]
    runner.reset()
    for a in d.action_radps[0, 40 - runner.action_history_length + 1:40]:
        runner.commit(a)
    history = runner.action_history
    u = d.action_radps[0, 40]
    f0, jac = runner.linearize(q, qd, u)
    np.testing.assert_array_equal(runner.action_history, history)  # linearize does not commit
    assert f0.shape == (12,) and jac.shape == (12, 6)
    np.testing.assert_allclose(f0, runner.predict(q, qd, u, commit=False).next_state, atol=1e-6)
    h = 2e-2
    for j in range(6):
        e = np.eye(6)[j] * h
        up, down = runner.predict(q, qd, u + e, commit=False), runner.predict(q, qd, u - e, commit=False)
        fd = (up.next_state - down.next_state) / (2 * h)
        np.testing.assert_allclose(jac[:, j], fd, atol=2e-3, rtol=5e-2, err_msg=f"column {j}")
    # the command moves the next velocity of its own joint most
    assert np.all(np.diag(jac[6:]) > 0.1), np.diag(jac[6:])
    # the linear model predicts a changed command the way the model itself does (small step)
    du = np.full(6, 0.05)
    np.testing.assert_allclose(f0 + jac @ du, runner.predict(q, qd, u + du, commit=False).next_state, atol=5e-3)


def test_runner_keeps_the_command_history_and_validates_inputs(exported):
    runner = WorldModelRunner(exported, JOINTS, TASK.control_dt_s)
    h = runner.action_history_length
    assert runner.action_history.shape == (h - 1, 6) and not runner.action_history.any()
    q = description.initial_positions(JOINTS)
    p = runner.predict(q, np.zeros(6), np.full(6, 0.3))
    assert p.next_q_rad.shape == (6,) and p.epistemic_std.shape == (12,) and np.all(p.total_std >= p.aleatoric_std)
    if h > 1:
        np.testing.assert_array_equal(runner.action_history[-1], np.full(6, 0.3))
    with pytest.raises(WorldModelInputError, match="q_rad has shape"):
        runner.predict(q[:5], np.zeros(6), np.zeros(6))
    with pytest.raises(WorldModelInputError, match="action_radps .*NaN"):
        runner.predict(q, np.zeros(6), np.array([0, 0, np.nan, 0, 0, 0]))
    with pytest.raises(WorldModelInputError, match="qdot_radps .*NaN"):
        runner.linearize(q, np.full(6, np.inf), np.zeros(6))
    with pytest.raises(WorldModelInputError, match="action_radps has shape"):
        runner.predict_batch(q[None], np.zeros((1, 6)), np.zeros((1, h + 1, 6)))


def test_step_and_rollout_are_differentiable_and_consistent(trained):
    model = trained[0]
    b, h = 4, model.action_history
    gen = torch.Generator().manual_seed(0)
    home = torch.as_tensor(description.initial_positions(JOINTS), dtype=torch.float32)
    state = torch.cat([home.expand(b, 6), torch.zeros(b, 6)], -1).requires_grad_(True)
    actions = (0.3 * torch.randn(b, h, 6, generator=gen)).requires_grad_(True)
    nxt, std = model.step(state, actions, member="random", sample=True, generator=gen)
    assert nxt.shape == (b, 12) and std.shape == (b, 12) and torch.all(std >= 0)
    nxt.sum().backward()
    assert actions.grad.abs().sum() > 0 and state.grad.abs().sum() > 0
    with torch.no_grad():
        mean_step, _ = model.step(state, actions, member="mean")
        pred = model.predict(state[:, :6], state[:, 6:], actions)
        torch.testing.assert_close(mean_step, torch.cat([pred.next_q_rad, pred.next_qdot_radps], -1))
        one, _ = model.step(state, actions, member=2)
        roll = model.rollout(state[:, :6], state[:, 6:], actions[:, -1:].expand(b, 5, 6).contiguous(), actions[:, :-1])
        torch.testing.assert_close(roll.q_rad[:, 1], mean_step[:, :6])
        assert roll.q_rad.shape == (b, 6, 6) and roll.epistemic_std.shape == (b, 5, 12)
    with pytest.raises(ValueError, match="member="):
        model.step(state, actions, member=7)
    with pytest.raises(ValueError, match="action_radps has shape"):
        model.step(state, actions[:, :1] if h > 1 else actions.expand(b, 2, 6), member="mean")
    assert not torch.allclose(one, mean_step)


def test_checkpoint_round_trip(trained, tmp_path):
    model = trained[0]
    path = save_checkpoint(model, tmp_path / "wm.pt", dataset_sha256="abc", metrics={"x": 1})
    loaded, record = load_checkpoint(path)
    assert record["dataset_sha256"] == "abc" and loaded.config == model.config
    q, qd, a = torch.zeros(3, 6), torch.ones(3, 6), torch.ones(3, model.action_history, 6)
    with torch.no_grad():
        for x, y in zip(model(q, qd, a), loaded(q, qd, a)):
            torch.testing.assert_close(x, y, rtol=0, atol=0)


def test_training_is_deterministic_for_a_seed(data):
    cfg = dataclasses.replace(TINY, hidden_sizes=(32,), epochs=2, max_train_transitions=1500)
    a, ra = train_world_model(cfg, data[0], progress=False)
    b, rb = train_world_model(cfg, data[0], progress=False)
    assert ra.holdout_nll == rb.holdout_nll
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(x, y), name
    c, _ = train_world_model(dataclasses.replace(cfg, seed=1), data[0], progress=False)
    assert not torch.equal(a.head.weight, c.head.weight)


def test_bad_config_values_name_the_field(tmp_path):
    with pytest.raises(ValueError, match="world_model.members=0"):
        WorldModelConfig(members=0)
    with pytest.raises(ValueError, match="world_model.holdout_fraction"):
        WorldModelConfig(holdout_fraction=1.0)
    with pytest.raises(ValueError, match="world_model.q_features"):
        WorldModelConfig(q_features="fourier")
    path = tmp_path / "training.yaml"
    path.write_text("world_model:\n  members: 5\n  hiden_sizes: [32]\n")
    with pytest.raises(ConfigError, match="unknown settings \\['hiden_sizes'\\]"):
        load_section(path, "world_model", WorldModelConfig)
    path.write_text("world_model:\n  action_history: 0\n")
    with pytest.raises(ConfigError, match="action_history=0"):
        load_section(path, "world_model", WorldModelConfig)
    path.write_text("world_model:\n  hidden_sizes: [64, 'x']\n")
    with pytest.raises(ConfigError, match="hidden_sizes\\[1\\]"):
        load_section(path, "world_model", WorldModelConfig)


def test_the_shipped_config_section_loads():
    cfg = load_section(config_path("training.yaml"), "world_model", WorldModelConfig)
    assert cfg.members >= 5 and cfg.action_history >= 1


def test_the_runner_imports_without_torch():
    code = ("import sys; sys.modules['torch'] = None; import robot_wm.core.world_model_runner; "
            "assert 'rclpy' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_qdot_history_model_exports_and_runs(data, tmp_path):
    cfg = dataclasses.replace(TINY, hidden_sizes=(32,), epochs=1, qdot_history=2, max_train_transitions=1000)
    model, _ = train_world_model(cfg, data[0], progress=False)
    path = export_world_model(model, tmp_path / "wm_qd.onnx", data[0].sha256)
    runner = WorldModelRunner(path, JOINTS, TASK.control_dt_s)
    assert runner.qdot_history_length == 2
    d = data[1]
    t = 30
    runner.reset(action_history=d.action_radps[0, t - 2:t], qdot_history=d.qdot_radps[0, t - 2:t])
    pred = runner.predict(d.q_rad[0, t], d.qdot_radps[0, t], d.action_radps[0, t])
    f = lambda x: torch.as_tensor(x, dtype=torch.float32)[None]  # noqa: E731
    with torch.no_grad():
        ref = model.predict(f(d.q_rad[0, t]), f(d.qdot_radps[0, t]), f(d.action_radps[0, t - 2:t + 1]),
                            f(d.qdot_radps[0, t - 2:t]))
    np.testing.assert_allclose(pred.next_qdot_radps, ref.next_qdot_radps[0].numpy(), atol=1e-5)
    np.testing.assert_array_equal(runner.qdot_history[-1], d.qdot_radps[0, t])  # committed with the action
    f0, jac = runner.linearize(d.q_rad[0, t + 1], d.qdot_radps[0, t + 1], d.action_radps[0, t + 1])
    assert jac.shape == (12, 6) and np.all(np.isfinite(jac))
    with pytest.raises(ValueError, match="qdot_history_radps"):
        model.step(torch.zeros(1, 12), torch.zeros(1, model.action_history, 6))


def test_eval_world_model_cli_reports_three_held_out_sets(exported):
    import json
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "robot_wm.cli", "eval-world-model", "--model", str(exported), "--json", "--eval-transitions", "800"],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert set(report) == {"nominal", "randomized", "real_twin"}
    for metrics in report.values():
        assert 0.0 <= metrics["cov90"] <= 1.0 and metrics["tool10_mm"] > 0.0
    missing = subprocess.run([sys.executable, "-m", "robot_wm.cli", "eval-world-model", "--model", "/nonexistent.onnx"],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "/nonexistent.onnx" in missing.stderr


def test_linearize_with_std_gives_the_nominal_prediction_and_its_std_in_one_call():
    """The safety filter takes f0, B and the κσ std from ONE batched inference; they match the
    separate linearize() and predict(commit=False) calls (shipped model)."""
    from robot_wm.paths import data_path

    runner = WorldModelRunner(data_path("models", "world_model.onnx"), JOINTS, TASK.control_dt_s)
    q = np.array([0.1, -1.4, 1.5, -1.6, -1.5, 0.2])
    qd = np.array([0.2, -0.1, 0.0, 0.3, 0.0, -0.1])
    u = np.array([0.3, 0.1, -0.2, 0.0, 0.4, 0.0])
    f0, jac, std = runner.linearize_with_std(q, qd, u)
    f0_ref, jac_ref = runner.linearize(q, qd, u)
    pred = runner.predict(q, qd, u, commit=False)
    np.testing.assert_array_equal(f0, f0_ref)
    np.testing.assert_array_equal(jac, jac_ref)
    np.testing.assert_allclose(f0, pred.next_state, atol=1e-5)
    np.testing.assert_allclose(std, pred.total_std, rtol=1e-4, atol=1e-7)
    assert std.shape == (12,) and np.all(std > 0)


def test_linearize_batch_gives_what_the_filter_gets_at_each_state_and_changes_no_history():
    """The stateless batch (a validation gate's) equals linearize_with_std with each row's history,
    the analytic graph the filter runs included; the runner's own history is left alone."""
    from robot_wm.paths import data_path

    runner = WorldModelRunner(data_path("models", "world_model.onnx"), JOINTS, TASK.control_dt_s)
    assert runner.linearization.startswith("analytic")
    rng = np.random.default_rng(4)
    b, h = 7, runner.action_history_length
    q, qd = rng.normal(0.0, 0.5, (b, 6)), rng.normal(0.0, 0.3, (b, 6))
    acts = rng.normal(0.0, 0.3, (b, h, 6))
    before = runner.action_history
    f0, jac, std = runner.linearize_batch(q, qd, acts)
    np.testing.assert_array_equal(runner.action_history, before)
    assert f0.shape == (b, 12) and jac.shape == (b, 12, 6) and std.shape == (b, 12)
    for i in range(b):
        runner.reset(action_history=acts[i, :-1])
        f0_i, jac_i, std_i = runner.linearize_with_std(q[i], qd[i], acts[i, -1])
        np.testing.assert_allclose(f0[i], f0_i, atol=1e-6)
        np.testing.assert_allclose(jac[i], jac_i, atol=2e-4 * np.abs(jac_i).max())
        np.testing.assert_allclose(std[i], std_i, rtol=1e-4, atol=1e-7)
    with pytest.raises(WorldModelInputError, match="linearize_batch"):
        runner.linearize_batch(q, qd, acts[:3])
    with pytest.raises(WorldModelInputError, match="NaN"):
        runner.linearize_batch(np.full((b, 6), np.nan), qd, acts)


def test_the_linearization_graph_carries_no_weights_and_gives_the_same_numbers():
    """The hot swap builds the linearization graph on a loader thread beside the control thread: its
    layer weights are handed to the session from memory (external initializers), not copied into the
    serialized graph, and the session answers exactly as the runner's own, also once the arrays it was
    given are gone (this onnxruntime copies them; its C API asks that they outlive the session)."""
    import gc

    from robot_wm.core import wm_linearization as wl
    from robot_wm.paths import data_path

    path = data_path("models", "world_model.onnx")
    runner = WorldModelRunner(path, JOINTS, TASK.control_dt_s)
    weights = wl.read_ensemble(path, runner.model.meta)
    graph, external = wl.linearization_graph(weights)
    weight_bytes = sum(a.nbytes for a in external.values())
    assert weight_bytes > 1_000_000 and len(graph) < 0.01 * weight_bytes, (len(graph), weight_bytes)
    assert {"w0", "w1", "w_head"} <= set(external)
    lin = wl.Linearizer(graph, {k: v.copy() for k, v in external.items()})  # the only copies: the session's
    del external
    gc.collect()
    q = np.array([0.1, -1.4, 1.5, -1.6, -1.5, 0.2])
    qd = np.array([0.2, -0.1, 0.0, 0.3, 0.0, -0.1])
    u = np.array([0.3, 0.1, -0.2, 0.0, 0.4, 0.0])
    f0_ref, jac_ref, std_ref = runner.linearize_with_std(q, qd, u)
    for _ in range(50):  # allocations that would reuse freed weight memory
        np.random.default_rng(0).normal(size=(500, 500))
    runner._linearizer = lin
    f0, jac, std = runner.linearize_with_std(q, qd, u)
    np.testing.assert_array_equal(f0, f0_ref)
    np.testing.assert_array_equal(jac, jac_ref)
    np.testing.assert_array_equal(std, std_ref)


@pytest.mark.parametrize("variant", ["shipped_like", "qdot_history_sincos", "variance_scale"])
def test_linearization_graph_is_the_exact_jacobian_of_the_ensemble(variant, tmp_path):
    """The one-call linearization graph (robot_wm.core.wm_linearization) returns the ensemble's mean,
    its exact Jacobian with respect to the current command (torch autograd of the same weights) and
    the predictive std, for every architecture option the exporter has."""
    cfg = {"shipped_like": WorldModelConfig(members=3, hidden_sizes=(32, 32, 32), seed=1),
           "qdot_history_sincos": WorldModelConfig(members=2, hidden_sizes=(24, 16), action_history=2, qdot_history=2,
                                                   q_features="sincos", seed=2),
           "variance_scale": WorldModelConfig(members=4, hidden_sizes=(20,), action_history=1, seed=3)}[variant]
    torch.manual_seed(cfg.seed)
    model = WorldModel(cfg, JOINTS, TASK.control_dt_s)
    with torch.no_grad():  # non-trivial normalization, biases and log-variance bounds
        for name, buf in model.named_buffers():
            buf.copy_(torch.rand_like(buf) + 0.5 if name.endswith("std") else torch.randn_like(buf) * 0.1)
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    if variant == "variance_scale":
        model.set_variance_scale(torch.linspace(0.5, 2.0, 12))
    path = export_world_model(model.eval(), tmp_path / "wm.onnx", "0" * 64)
    runner = WorldModelRunner(path, JOINTS, TASK.control_dt_s)
    assert runner.linearization.startswith("analytic"), runner.linearization
    rng = np.random.default_rng(0)
    h, k = cfg.action_history, cfg.qdot_history
    for _ in range(5):
        q, qd = rng.uniform(-2, 2, 6), rng.uniform(-1, 1, 6)
        runner.reset(rng.uniform(-1, 1, (h - 1, 6)), rng.uniform(-1, 1, (k, 6)))
        u = rng.uniform(-1, 1, 6)
        f0, jac, std = runner.linearize_with_std(q, qd, u)
        t = lambda x: torch.as_tensor(np.asarray(x), dtype=torch.float32)[None]  # noqa: E731
        past = t(runner.action_history)

        def next_state(cmd):
            acts = torch.cat([past, cmd[None, None]], 1)
            qh = t(runner.qdot_history) if k else None
            p = model.predict(t(q), t(qd), acts, qh)
            return torch.cat([p.next_q_rad, p.next_qdot_radps], -1)[0]

        want_jac = torch.autograd.functional.jacobian(next_state, t(u)[0]).numpy()
        pred = runner.predict(q, qd, u, commit=False)
        np.testing.assert_allclose(f0, pred.next_state, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(std, pred.total_std, rtol=1e-4, atol=1e-7)
        np.testing.assert_allclose(jac, want_jac, rtol=1e-4, atol=1e-5 * np.abs(want_jac).max())


def test_a_world_model_the_linearization_builder_does_not_recognize_is_linearized_by_differences(exported, tmp_path):
    """A model whose weights the builder cannot read (here: a sidecar without the training config)
    still loads; linearize falls back to central differences and says why."""
    path = tmp_path / "world_model.onnx"
    shutil.copy(exported, path)
    side = json.loads(exported.with_suffix(".json").read_text())
    side.pop("config")
    path.with_suffix(".json").write_text(json.dumps(side))
    fallback = WorldModelRunner(path, JOINTS, TASK.control_dt_s)
    assert fallback.linearization.startswith("finite differences (the sidecar has no training config")
    analytic = WorldModelRunner(exported, JOINTS, TASK.control_dt_s)
    q, qd, u = np.full(6, 0.2), np.full(6, 0.1), np.full(6, -0.3)
    for got, want in zip(fallback.linearize_with_std(q, qd, u), analytic.linearize_with_std(q, qd, u)):
        np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-4)
