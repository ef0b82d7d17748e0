"""PolicyRunner (ONNX policy) and ScriptedPolicy: observation layout, input checks, output contract."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from robot_wm.contracts import JOINT_NAMES, OBS_LAYOUT, layout_json, policy_signature
from robot_wm.core.onnx_model import ModelError
from robot_wm.core.policy_runner import PolicyOutputError, PolicyRunner, ScriptedPolicy, make_obs
from robot_wm.core.task import load_task

LIMITS = [1.0, 1.0, 1.0, 1.5, 1.5, 1.5]


def export_policy(tmp_path, forward, name="policy", extra=None, joint_names=JOINT_NAMES):
    """Export ``forward(obs) -> action`` as a real policy ONNX graph + sidecar under tmp_path."""
    torch = pytest.importorskip("torch")
    from robot_wm.learning.export import example_inputs, export_onnx, write_sidecar

    class Net(torch.nn.Module):
        def forward(self, obs):
            return forward(torch, obs)

    sig = policy_signature()
    path = export_onnx(Net(), example_inputs(sig, batch=1), tmp_path / f"{name}.onnx", sig.input_names, sig.output_names)
    meta = {"action_limit_radps": LIMITS, "obs_layout": layout_json(OBS_LAYOUT)}
    meta.update(extra or {})
    write_sidecar(path, model_kind="policy", version="t1", joint_names=joint_names, dt_s=0.01,
                  training_data_sha256="0" * 64, extra={k: v for k, v in meta.items() if v is not None})
    return path


def half_q(torch, obs):
    return 0.5 * obs[:, 0:6]


def test_make_obs_layout_single_and_batch():
    q, qd, tool, goal = np.arange(6.0), 10 + np.arange(6.0), [20.0, 21, 22], [30.0, 31, 32]
    obs = make_obs(q, qd, tool, goal)
    assert obs.shape == (18,)
    for block, value in zip(OBS_LAYOUT, (q, qd, tool, goal)):
        np.testing.assert_array_equal(obs[OBS_LAYOUT[block]], value)
    batch = make_obs(np.tile(q, (4, 1)), np.tile(qd, (4, 1)), np.tile(tool, (4, 1)), goal)  # one goal broadcasts
    assert batch.shape == (4, 18)
    np.testing.assert_array_equal(batch, np.tile(obs, (4, 1)))


@pytest.mark.parametrize("bad", ["q_rad", "tool_m"])
def test_make_obs_names_the_bad_part(bad):
    parts = {"q_rad": np.zeros(6), "qdot_radps": np.zeros(6), "tool_m": np.zeros(3), "goal_m": np.zeros(3)}
    parts[bad] = np.zeros(5)
    with pytest.raises(ValueError, match=bad):
        make_obs(**parts)
    with pytest.raises(ValueError, match="batch sizes"):
        make_obs(np.zeros((2, 6)), np.zeros((3, 6)), np.zeros(3), np.zeros(3))


def test_runner_runs_the_graph(tmp_path):
    runner = PolicyRunner(export_policy(tmp_path, half_q), JOINT_NAMES, 0.01)
    q = np.array([0.1, -0.2, 0.3, -0.4, 0.5, -0.6])
    one = runner.act(make_obs(q, np.zeros(6), np.zeros(3), np.zeros(3)))
    assert one.shape == (6,) and one.dtype == float
    np.testing.assert_allclose(one, 0.5 * q, rtol=1e-6)
    batch = runner.act(make_obs(np.stack([q, -q, 2 * q]), np.zeros(6), np.zeros(3), np.zeros(3)))
    assert batch.shape == (3, 6)
    np.testing.assert_allclose(batch[1], -0.5 * q, rtol=1e-6)
    assert runner.clipped_count == 0
    assert "policy.onnx" in runner.name and runner.version == "t1"
    np.testing.assert_array_equal(runner.action_limit_radps, LIMITS)


@pytest.mark.parametrize("shape", [(17,), (2, 17), (2, 3, 18), (0, 18), ()])
def test_runner_rejects_wrong_obs_shape(tmp_path, shape):
    runner = PolicyRunner(export_policy(tmp_path, half_q), JOINT_NAMES, 0.01)
    with pytest.raises(ValueError, match=r"shape.*18"):
        runner.act(np.zeros(shape))


def test_runner_rejects_nonfinite_obs_naming_rows_and_blocks(tmp_path):
    runner = PolicyRunner(export_policy(tmp_path, half_q), JOINT_NAMES, 0.01)
    obs = np.zeros((3, 18))
    obs[2, 7] = np.nan
    with pytest.raises(ValueError, match=r"NaN.*\[2\].*qdot_radps"):
        runner.act(obs)
    obs[2, 7], obs[0, 16] = 0.0, np.inf
    with pytest.raises(ValueError, match="goal_m"):
        runner.act(obs)
    with pytest.raises(ValueError, match="numeric"):
        runner.act([["a"] * 18])


def test_nan_output_raises_never_returns_nan(tmp_path):
    # NaN only for rows whose first joint is beyond 1 rad: the error names those rows
    path = export_policy(tmp_path, lambda torch, obs: obs[:, 0:6] * 0.0 + torch.where(
        obs[:, 0:1] > 1.0, torch.full_like(obs[:, 0:1], float("nan")), torch.zeros_like(obs[:, 0:1])))
    runner = PolicyRunner(path, JOINT_NAMES, 0.01)
    obs = np.zeros((4, 18))
    assert np.all(runner.act(obs) == 0.0)
    obs[[1, 3], 0] = 2.0
    with pytest.raises(PolicyOutputError, match=r"policy.onnx.*NaN/Inf.*\[1, 3\]"):
        runner.act(obs)
    with pytest.raises(PolicyOutputError):
        runner.act(obs[1])


def test_out_of_limit_output_is_clipped(tmp_path):
    path = export_policy(tmp_path, lambda torch, obs: obs[:, 0:6] * 0.0 + 100.0 - 200.0 * (obs[:, 0:6] > 0))
    runner = PolicyRunner(path, JOINT_NAMES, 0.01)
    obs = np.zeros(18)
    obs[0] = 1.0
    np.testing.assert_allclose(runner.act(obs), [-1.0, 1.0, 1.0, 1.5, 1.5, 1.5])
    assert runner.clipped_count == 6


def test_tighter_given_limit_wins(tmp_path):
    runner = PolicyRunner(export_policy(tmp_path, lambda torch, obs: obs[:, 0:6] * 0.0 + 5.0), JOINT_NAMES, 0.01,
                          action_limit_radps=[0.5, 2, 2, 2, 2, 2])
    np.testing.assert_allclose(runner.act(np.zeros(18)), [0.5, 1.0, 1.0, 1.5, 1.5, 1.5])
    with pytest.raises(ValueError, match="action_limit_radps"):
        PolicyRunner(export_policy(tmp_path, half_q, name="p2"), JOINT_NAMES, 0.01, action_limit_radps=[1, 1, 1])


def test_model_checks(tmp_path):
    path = export_policy(tmp_path, half_q)
    with pytest.raises(ModelError, match="joint order"):
        PolicyRunner(path, tuple(reversed(JOINT_NAMES)), 0.01)
    with pytest.raises(ModelError, match="dt_s"):
        PolicyRunner(path, JOINT_NAMES, 0.02)
    path.with_suffix(".json").unlink()
    with pytest.raises(ModelError, match="sidecar"):
        PolicyRunner(path, JOINT_NAMES, 0.01)
    with pytest.raises(ModelError, match="not found"):
        PolicyRunner(tmp_path / "nothing.onnx", JOINT_NAMES, 0.01)


def test_sidecar_layout_and_limits_are_checked(tmp_path):
    swapped = {"q_rad": [6, 12], "qdot_radps": [0, 6], "tool_m": [12, 15], "goal_m": [15, 18]}
    with pytest.raises(ModelError, match="obs_layout"):
        PolicyRunner(export_policy(tmp_path, half_q, name="a", extra={"obs_layout": swapped}), JOINT_NAMES, 0.01)
    path = export_policy(tmp_path, half_q, name="b", extra={"action_limit_radps": None})
    with pytest.raises(ModelError, match="action_limit_radps"):
        PolicyRunner(path, JOINT_NAMES, 0.01)
    assert PolicyRunner(path, JOINT_NAMES, 0.01, action_limit_radps=LIMITS).act(np.zeros(18)).shape == (6,)


def test_wrong_kind_and_signature_refused(tmp_path):
    torch = pytest.importorskip("torch")
    from robot_wm.learning.export import export_onnx, write_sidecar

    class WorldModel(torch.nn.Module):
        def forward(self, obs):
            return obs[:, :6]

    path = export_onnx(WorldModel(), (torch.zeros(1, 18),), tmp_path / "wm.onnx", ["obs"], ["action_radps"])
    write_sidecar(path, model_kind="world_model", version="1", joint_names=JOINT_NAMES, dt_s=0.01,
                  training_data_sha256="")
    with pytest.raises(ModelError, match="expected 'policy'"):
        PolicyRunner(path, JOINT_NAMES, 0.01)
    path = export_onnx(WorldModel(), (torch.zeros(1, 18),), tmp_path / "p.onnx", ["state"], ["action_radps"])
    write_sidecar(path, model_kind="policy", version="1", joint_names=JOINT_NAMES, dt_s=0.01, training_data_sha256="",
                  extra={"action_limit_radps": LIMITS})
    with pytest.raises(ModelError, match="inputs"):
        PolicyRunner(path, JOINT_NAMES, 0.01)


def test_scripted_policy_same_interface():
    task = load_task()
    policy = ScriptedPolicy.from_description(task)
    kin = policy.reacher.kin
    q = policy.reacher.q_home + 0.05
    goal = np.array([-0.45, -0.05, 0.3])
    obs = make_obs(q, np.zeros(6), kin.tool_position_m(q), goal)
    one = policy.act(obs)
    assert one.shape == (6,)
    np.testing.assert_allclose(one, policy.reacher(q, goal))
    batch = policy.act(np.stack([obs, obs]))
    assert batch.shape == (2, 6)
    assert np.all(np.abs(batch) <= np.asarray(task.action_limit_radps) + 1e-12)
    # moving along the command brings the tool nearer the goal
    q_next = q + 0.01 * one
    assert np.linalg.norm(kin.tool_position_m(q_next) - goal) < np.linalg.norm(kin.tool_position_m(q) - goal)
    with pytest.raises(ValueError, match="shape"):
        policy.act(np.zeros(12))


def test_core_runner_and_evaluator_import_without_torch_or_rclpy(tmp_path):
    task_yaml = tmp_path / "task.yaml"
    task_yaml.write_text("/**:\n  ros__parameters:\n    task:\n      episode_s: 0.5\n      success_hold_s: 0.1\n")
    code = (
        "import sys, json\n"
        "sys.modules['torch'] = None; sys.modules['rclpy'] = None\n"
        "import robot_wm.core.policy_runner\n"
        "from robot_wm.learning.evaluate import main\n"
        f"sys.exit(main(['--no-policy', '--episodes', '2', '--json', '--no-progress', '--task-file', {str(task_yaml)!r}]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["baseline"]["episodes"] == 2
