"""Residual policies: the scripted baselines in torch (the prior) match the numpy baselines, the
prior travels inside the exported graph, and a checkpoint with a prior loads back."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from robot_wm import description
from robot_wm.core.kinematics import Kinematics
from robot_wm.core.policy_runner import PolicyRunner
from robot_wm.core.tasks import get_task
from robot_wm.learning.policy import Actor, ObsNormalizer, PolicyConfig, export_form, export_policy, task_layout
from robot_wm.learning.scripted_prior import ToolSpeedCap, inverse3, scripted_prior
from robot_wm.learning.torch_kinematics import ExportToolFK, TorchToolFK

URDF = description.expand()
JOINTS = description.joint_limits(URDF).names
HOME = description.initial_positions(JOINTS)
KIN = Kinematics(URDF, JOINTS)
FK = TorchToolFK(URDF, JOINTS)


def _observations(task, n: int, seed: int) -> np.ndarray:
    """Observations the baseline meets: near home and far from it, targets near and far (so the
    tool-speed cap and the joint-limit scaling both act), at random times of the episode."""
    rng = np.random.default_rng(seed)
    eps = task.episodes(n, seed, HOME)
    rows = []
    for i in range(n):
        q = eps.q0_rad[i] + rng.normal(0.0, rng.choice([0.05, 0.5]), len(JOINTS))
        qdot = rng.normal(0.0, 0.3, len(JOINTS))
        rows.append(task.observation(eps, i, rng.uniform(0.0, task.episode_s), q, qdot, KIN.tool_position_m(q)))
    return np.stack(rows)


def test_the_torch_jacobian_is_pinocchios():
    q = np.random.default_rng(0).uniform(-3, 3, (32, len(JOINTS)))
    tool, jac = FK.position_and_jacobian(torch.as_tensor(q))
    for i in range(len(q)):
        np.testing.assert_allclose(tool[i].numpy(), KIN.tool_position_m(q[i]), atol=1e-6)  # the chain constants are float32
        np.testing.assert_allclose(jac[i].numpy(), KIN.tool_jacobian(q[i])[:3], atol=1e-6)  # the chain constants are float32


@pytest.mark.parametrize("order", ["urdf", "reversed", "extra joint"])
def test_the_export_kinematics_are_the_training_ones_and_pinocchios(order):
    """ExportToolFK (the exported graphs' form) against TorchToolFK (training's) and pinocchio, also
    for a joint order that is not the chain's and a joint off the chain (its column is zero)."""
    names = {"urdf": JOINTS, "reversed": JOINTS[::-1],
             "extra joint": (*JOINTS[:3], "gripper_joint", *JOINTS[3:])}[order]
    fk = TorchToolFK(URDF, names)
    export = ExportToolFK(fk, len(names))
    q = np.random.default_rng(2).uniform(-3.5, 3.5, (64, len(names)))
    on_chain = [names.index(j) for j in JOINTS]
    for dtype, atol in ((torch.float32, 1e-6), (torch.float64, 1e-6)):  # the chain constants are float32
        qt = torch.as_tensor(q, dtype=dtype)
        tool, jac = export.position_and_jacobian(qt)
        want_tool, want_jac = fk.position_and_jacobian(qt)
        assert tool.dtype == jac.dtype == dtype and jac.shape == (64, 3, len(names))
        np.testing.assert_allclose(tool.numpy(), want_tool.numpy(), atol=atol)
        np.testing.assert_allclose(jac.numpy(), want_jac.numpy(), atol=atol)
        for i in range(0, 64, 4):
            np.testing.assert_allclose(tool[i].numpy(), KIN.tool_position_m(q[i, on_chain]), atol=1e-6)
            np.testing.assert_allclose(jac[i][:, on_chain].numpy(), KIN.tool_jacobian(q[i, on_chain])[:3], atol=1e-6)
    if order == "extra joint":
        assert torch.all(jac[..., names.index("gripper_joint")] == 0)


def test_the_adjugate_inverse_inverts():
    m = torch.as_tensor(np.random.default_rng(1).normal(size=(16, 3, 3)))
    m = m @ m.transpose(-1, -2) + 0.01 * torch.eye(3, dtype=m.dtype)
    np.testing.assert_allclose((m @ inverse3(m)).numpy(), np.broadcast_to(np.eye(3), (16, 3, 3)), atol=1e-8)


@pytest.mark.parametrize("name", ["reach", "track"])
def test_the_prior_is_the_scripted_baseline(name):
    task = get_task(name)
    prior = scripted_prior(task, task_layout(task.spec), FK).double()
    baseline = task.baseline()
    obs = _observations(task, 64, seed=3)
    expected = np.stack([baseline.act(o) for o in obs])
    with torch.no_grad():
        got = prior(torch.as_tensor(obs)).numpy()
    np.testing.assert_allclose(got, expected, atol=1e-6)  # the chain constants are float32
    assert np.any(np.abs(expected).max(1) > 0.99 * np.min(task.action_limit_radps))  # the scaling was exercised


def _residual_actor(task, correction: float, cap_mps: float | None = None) -> Actor:
    obs = _observations(task, 256, seed=5)
    mean, std = obs.mean(0).astype(np.float32), np.maximum(obs.std(0), 1e-3).astype(np.float32)
    layout = task_layout(task.spec)
    fk = TorchToolFK(URDF, JOINTS)
    cap = ToolSpeedCap(fk, layout["q_rad"], cap_mps) if cap_mps else None
    actor = Actor(ObsNormalizer(mean, std, layout), np.asarray(task.action_limit_radps), 32,
                  scripted_prior(task, layout, fk), residual_fraction=0.3, speed_cap=cap)
    with torch.no_grad():
        actor.net[-1].weight.mul_(correction / 0.01)
    return actor.eval()


@pytest.mark.parametrize("name", ["reach", "track"])
def test_the_exported_residual_policy_carries_the_prior_and_bounds_the_correction(tmp_path, name):
    task = get_task(name)
    obs = _observations(task, 64, seed=7)
    baseline = np.stack([task.baseline().act(o) for o in obs])
    limits = np.asarray(task.action_limit_radps)

    still = _residual_actor(task, correction=0.0)  # no correction: exactly the baseline
    with torch.no_grad():
        np.testing.assert_allclose(still(torch.as_tensor(obs, dtype=torch.float32)).numpy(), baseline, atol=2e-5)

    actor = _residual_actor(task, correction=20.0)  # a large correction: the bounds act
    path = export_policy(actor, tmp_path / "policy.onnx", joint_names=JOINTS, task=task.spec,
                         dataset_sha256="0" * 64, version="test", config=PolicyConfig(prior="scripted"))
    runner = PolicyRunner(path, JOINTS, task.control_dt_s, task=name)
    onnx_out = np.stack([runner.act(o) for o in obs])
    with torch.no_grad():
        torch_out = actor(torch.as_tensor(obs, dtype=torch.float32)).numpy()
    np.testing.assert_allclose(onnx_out, torch_out, atol=1e-4)  # float32 DLS near singular postures
    assert np.all(np.abs(onnx_out) <= limits + 1e-5)
    correction = onnx_out - baseline
    assert np.abs(correction).max() > 0.1 * limits.min()  # the correction is really there
    unscaled = np.max(np.abs(baseline + correction) / limits, axis=1) < 0.999
    assert np.all(np.abs(correction[unscaled]) <= 0.3 * limits + 1e-4)
    assert "scripted baseline" in runner.model.meta["prior"]


@pytest.mark.parametrize("name", ["reach", "track"])
def test_the_speed_cap_keeps_the_implied_tool_speed_under_it_in_the_exported_graph(tmp_path, name):
    task = get_task(name)
    actor = _residual_actor(task, correction=20.0, cap_mps=0.3)
    path = export_policy(actor, tmp_path / "policy.onnx", joint_names=JOINTS, task=task.spec,
                         dataset_sha256="0" * 64, version="test", config=PolicyConfig(prior="scripted"))
    runner = PolicyRunner(path, JOINTS, task.control_dt_s, task=name)
    obs = _observations(task, 64, seed=11)
    speeds = []
    for o in obs:
        a = runner.act(o)
        speeds.append(np.linalg.norm(KIN.tool_linear_velocity_mps(o[:len(JOINTS)], a)))
    assert max(speeds) <= 0.3 + 1e-4 and max(speeds) > 0.29  # the cap binds, and holds
    assert runner.model.meta["tool_speed_cap_mps"] == pytest.approx(0.3)


@pytest.mark.parametrize("name", ["reach", "track"])
def test_the_export_form_is_the_actor_with_the_kinematics_once_in_a_small_graph(tmp_path, name):
    """export_policy exports ``export_form(actor)``: the same function as the actor training runs
    (which it leaves as it was), with the prior's and the cap's tool kinematics computed once."""
    import onnx

    task = get_task(name)
    actor = _residual_actor(task, correction=20.0, cap_mps=0.3)
    keys = list(actor.state_dict())
    form = export_form(actor)
    assert actor.kinematics is None and list(actor.state_dict()) == keys and form.kinematics is not None
    obs = torch.as_tensor(_observations(task, 256, seed=13), dtype=torch.float32)
    with torch.no_grad():
        np.testing.assert_allclose(form(obs).numpy(), actor(obs).numpy(), atol=1e-6)
        np.testing.assert_allclose(form.double()(obs.double()).numpy(), actor.double()(obs.double()).numpy(), atol=1e-9)
    path = export_policy(actor.float(), tmp_path / "policy.onnx", joint_names=JOINTS, task=task.spec,
                         dataset_sha256="0" * 64, version="test", config=PolicyConfig(prior="scripted"))
    nodes = onnx.load(str(path)).graph.node
    assert sum(n.op_type == "Cos" for n in nodes) == 1  # one forward kinematics for the prior and the cap
    assert len(nodes) < 300, len(nodes)  # 748-782 with TorchToolFK, computed twice


def test_a_checkpoint_with_a_prior_loads_back_with_it(tmp_path):
    from robot_wm.learning.pipeline import POLICY_CHECKPOINT_FORMAT, load_policy_checkpoint
    from robot_wm.contracts import layout_json

    task = get_task("track")
    actor = _residual_actor(task, correction=5.0, cap_mps=0.45)
    cfg = PolicyConfig(hidden=32, prior="scripted", residual_fraction=0.3, speed_cap_fraction=0.9)
    torch.save({"format": POLICY_CHECKPOINT_FORMAT, "state_dict": actor.state_dict(), "config": cfg.__dict__,
                "task": "track", "obs_layout": layout_json(task_layout(task.spec)), "obs_mean": actor.norm.mean.tolist(),
                "obs_std": actor.norm.std.tolist(), "action_limit_radps": list(task.action_limit_radps)},
               tmp_path / "policy.pt")
    loaded, _ = load_policy_checkpoint(tmp_path / "policy.pt")
    obs = torch.as_tensor(_observations(task, 16, seed=9), dtype=torch.float32)
    with torch.no_grad():
        np.testing.assert_allclose(loaded(obs).numpy(), actor(obs).numpy(), atol=1e-6)


def test_an_unknown_prior_is_refused_by_name():
    with pytest.raises(ValueError, match="policy.prior"):
        PolicyConfig(prior="expert")
    with pytest.raises(ValueError, match="residual_fraction"):
        PolicyConfig(residual_fraction=0.0)
    with pytest.raises(ValueError, match="speed_cap_fraction"):
        PolicyConfig(speed_cap_fraction=1.5)
