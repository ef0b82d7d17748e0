"""Imagination actor-critic: learns in imagination, exports with normalization and scaling inside."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from robot_wm import description
from robot_wm.core.onnx_model import ModelError, load_model
from robot_wm.core.task import load_task
from robot_wm.learning.config import ConfigError, load_section
from robot_wm.learning.data import CollectConfig, collect
from robot_wm.learning.policy import Actor, ObsNormalizer, PolicyConfig, export_policy, lambda_returns, train_policy
from robot_wm.learning.torch_kinematics import TorchToolFK

URDF = description.expand()
JOINTS = description.joint_limits(URDF).names
TASK = load_task()


class Integrator:
    """Known dynamics (a perfect velocity-controlled arm): tests the learner, not a world model."""

    history = 2

    def step(self, q, qdot, actions):
        return q + actions[:, -1] * TASK.control_dt_s, actions[:, -1], torch.zeros(q.shape[0])


@pytest.fixture(scope="module")
def small_data():
    return collect(CollectConfig(transitions=3000, n_envs=8, episode_steps=50, seed=1), TASK, progress=False)


def test_lambda_returns_match_a_hand_computation():
    rewards = torch.tensor([[1.0], [2.0]])
    values = torch.tensor([[0.0], [10.0], [20.0]])
    ret = lambda_returns(rewards, values, discount=0.5, lambda_=0.5)
    r1 = 2.0 + 0.5 * (0.5 * 20.0 + 0.5 * 20.0)
    r0 = 1.0 + 0.5 * (0.5 * 10.0 + 0.5 * r1)
    assert ret[:, 0].tolist() == pytest.approx([r0, r1])


def _closed_loop_distance(actor, fk, steps=150, n=64):
    """Mean final tool-goal distance of the deterministic actor under the known dynamics."""
    gen = np.random.default_rng(123)
    q = torch.as_tensor(description.initial_positions(JOINTS) + gen.uniform(-0.15, 0.15, (n, 6)), dtype=torch.float32)
    qd = torch.zeros(n, 6)
    goal = torch.as_tensor(TASK.sample_goals(gen, n), dtype=torch.float32)
    with torch.no_grad():
        for _ in range(steps):
            a = actor(torch.cat([q, qd, fk(q), goal], -1))
            q, qd = q + a * TASK.control_dt_s, a
        return float(torch.linalg.norm(fk(q) - goal, dim=-1).mean())


def test_training_in_imagination_brings_the_tool_to_the_goal(small_data):
    fk = TorchToolFK(URDF, JOINTS)
    home = description.initial_positions(JOINTS)
    untrained, _ = train_policy(PolicyConfig(iterations=1, batch=64, horizon=10, hidden=64, seed=0),
                                Integrator(), fk, small_data, TASK, home, progress=False)
    before = _closed_loop_distance(untrained, fk)
    actor, report = train_policy(PolicyConfig(iterations=150, batch=64, horizon=10, hidden=64, seed=0),
                                 Integrator(), fk, small_data, TASK, home, progress=False)
    after = _closed_loop_distance(actor, fk)
    assert after < 0.5 * before, (before, after)
    assert report.history[-1]["distance_m"] < report.history[0]["distance_m"]


def test_exported_policy_matches_torch_and_carries_normalization_and_scaling(tmp_path, small_data):
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    mean, std = rng.normal(size=18).astype(np.float32), rng.uniform(0.5, 2, 18).astype(np.float32)
    limits = np.asarray(TASK.action_limit_radps)
    actor = Actor(ObsNormalizer(mean, std), limits, hidden=32)
    with torch.no_grad():  # large outputs so the tanh scaling is exercised
        actor.net[-1].weight.mul_(8.0)
    path = export_policy(actor, tmp_path / "policy.onnx", joint_names=JOINTS, task=TASK,
                         dataset_sha256=small_data.sha256, version="test")
    model = load_model(path, "policy", JOINTS, TASK.control_dt_s)
    obs = rng.normal(size=(64, 18)).astype(np.float32) * 3
    onnx_out = model.run(obs=obs)["action_radps"]
    with torch.no_grad():
        torch_out = actor(torch.as_tensor(obs)).numpy()
        # end to end: normalization then tanh scaling, written out by hand
        z = (torch.as_tensor(obs) - torch.as_tensor(mean)) / torch.as_tensor(std)
        feats = torch.cat([z, (torch.as_tensor(obs[:, 15:18]) - torch.as_tensor(obs[:, 12:15])) / 0.1], -1)
        manual = (torch.tanh(actor.net(feats)[:, :6]) * torch.as_tensor(limits, dtype=torch.float32)).numpy()
    np.testing.assert_allclose(onnx_out, torch_out, atol=1e-5)
    np.testing.assert_allclose(torch_out, manual, atol=1e-6)
    assert np.all(np.abs(onnx_out) <= limits + 1e-6) and np.abs(onnx_out).max() > 0.5 * limits.min()
    assert model.meta["action_limit_radps"] == list(TASK.action_limit_radps)
    with pytest.raises(ModelError, match="world_model"):
        load_model(path, "world_model")


def test_bad_policy_config_names_the_field(tmp_path):
    bad = tmp_path / "training.yaml"
    bad.write_text("policy:\n  horizon: 0\n")
    with pytest.raises(ConfigError, match="horizon"):
        load_section(bad, "policy", PolicyConfig)
    bad.write_text("policy:\n  horizn: 10\n")
    with pytest.raises(ConfigError, match="horizn"):
        load_section(bad, "policy", PolicyConfig)
    bad.write_text("policy:\n  discount: yes\n")
    with pytest.raises(ConfigError, match="discount"):
        load_section(bad, "policy", PolicyConfig)


def test_limit_costs_are_the_filter_limits_as_hinges():
    """Each cost is zero inside its limit and grows with the excess: tool speed, nearness to a
    joint's soft limit, a command change beyond the acceleration limit."""
    from robot_wm.core.safety import load_safety_limits
    from robot_wm.learning.policy import LimitCosts

    lim = load_safety_limits()
    cfg = PolicyConfig(limit_cost=1.0, limit_speed_fraction=0.9, limit_margin_rad=0.15, limit_accel_fraction=0.8)
    costs = LimitCosts(cfg, lim, TASK.control_dt_s)
    q = torch.as_tensor(description.initial_positions(JOINTS), dtype=torch.float32).repeat(4, 1)
    q[1, 1] = lim.upper_rad[1] - 0.05  # 0.10 rad inside the 0.15 margin of shoulder_lift's upper limit
    tool0 = torch.zeros(4, 3)
    tool1 = torch.zeros(4, 3)
    tool1[2, 0] = 0.6 * TASK.control_dt_s  # 0.6 m/s, 0.15 above 0.9 * 0.5
    a_prev = torch.zeros(4, 6)
    a = torch.zeros(4, 6)
    a[3, 0] = 0.8 * lim.accel_max_radps2[0] * TASK.control_dt_s + 0.02  # 0.02 rad/s beyond the change limit
    c = costs(q, tool0, tool1, a, a_prev)
    assert c.tolist() == pytest.approx([0.0, 0.10, 0.15, 0.02], abs=1e-5)


def test_training_with_limit_costs_keeps_the_imagined_arm_inside_the_limits(small_data):
    """The same short run with and without limit costs: the policy trained with them pays less of
    them in imagination (here: fast reaches whose tool speed would exceed the limit)."""
    fk = TorchToolFK(URDF, JOINTS)
    home = description.initial_positions(JOINTS)
    common = dict(iterations=120, batch=64, horizon=10, hidden=64, seed=0, limit_speed_fraction=0.5)
    _, free = train_policy(PolicyConfig(**common), Integrator(), fk, small_data, TASK, home, progress=False)
    _, aware = train_policy(PolicyConfig(limit_cost=20.0, **common), Integrator(), fk, small_data, TASK, home,
                            progress=False)
    assert free.history[-1]["limit_cost"] == 0.0  # not computed without the weight
    assert aware.history[-1]["limit_cost"] < aware.history[0]["limit_cost"]
