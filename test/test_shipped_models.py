"""The default models in models/ load through their sidecars and do their job."""
from __future__ import annotations

import numpy as np

from robot_wm import description
from robot_wm.core.policy_runner import PolicyRunner
from robot_wm.core.task import load_task
from robot_wm.core.world_model_runner import WorldModelRunner
from robot_wm.learning.evaluate import evaluate
from robot_wm.paths import data_path

JOINTS = description.joint_limits(description.expand()).names
TASK = load_task()


def test_shipped_policy_reaches_its_goals_on_nominal_and_real_twin():
    policy = PolicyRunner(data_path("models", "policy.onnx"), JOINTS, TASK.control_dt_s)
    for profile in ("nominal", "real_twin"):
        report = evaluate(policy, profile, episodes=24, seed=7, task=TASK)
        assert report.success_rate >= 0.9, (profile, report.to_dict())


def test_shipped_world_model_predicts_a_commanded_motion():
    runner = WorldModelRunner(data_path("models", "world_model.onnx"), JOINTS, TASK.control_dt_s)
    q = description.initial_positions(JOINTS)
    qdot = np.zeros(6)
    command = np.array([0.5, 0.0, 0.0, 0.0, 0.0, 0.0])
    for _ in range(10):  # hold the command for 0.1 s: the drive's lag and latency are long gone
        pred = runner.predict(q, qdot, command)
        q, qdot = pred.next_q_rad, pred.next_qdot_radps
    assert abs(qdot[0] - 0.5) < 0.05 and np.all(np.abs(qdot[1:]) < 0.05)
    assert np.all(np.isfinite(pred.epistemic_std)) and np.all(pred.aleatoric_std > 0)
    f0, jac = runner.linearize(q, qdot, command)
    assert jac.shape == (12, 6) and jac[6, 0] > 0.1  # commanding the pan joint speeds it up


def test_shipped_tracking_policy_follows_its_paths_through_the_stack():
    """models/track/: the residual tracking policy, through the safety filter with its world model."""
    from robot_wm.core.tasks import get_task
    from robot_wm.learning.stack_eval import evaluate_stack

    task = get_task("track")
    policy = PolicyRunner(data_path("models", "track", "policy.onnx"), JOINTS, task.control_dt_s, task="track")
    assert "scripted baseline" in policy.model.meta["prior"] and policy.model.meta["tool_speed_cap_mps"] <= 0.5
    report = evaluate_stack(policy, "real_twin", episodes=4, seed=3, task=task,
                            models_dir=data_path("models", "track"), progress=False).to_dict()
    assert report["tracking_rms_m_median"] < 0.008 and report["violations"] == 0, report
    assert report["intervention_rate"] < 0.1, report


def test_every_shipped_model_set_loads_through_its_sidecars():
    from robot_wm.core.tasks import get_task

    for name, task in (("track", "track"), ("track_sim_only", "track"), ("reach_sim_only", "reach"),
                       ("track_adapted_real_twin", "track")):
        spec = get_task(task).spec
        PolicyRunner(data_path("models", name, "policy.onnx"), JOINTS, spec.control_dt_s, task=task)
        WorldModelRunner(data_path("models", name, "world_model.onnx"), JOINTS, spec.control_dt_s)


def test_shipped_versions_name_their_content():
    """A version ends with the first 8 hex digits of its ONNX file's SHA-256: the reaching policies
    before and after the limit-aware recipe came from the same data and seed and once shared one."""
    import json

    sidecars = sorted(p for p in data_path("models").glob("**/*.json") if p.with_suffix(".onnx").exists())
    assert len(sidecars) >= 8
    for path in sidecars:
        meta = json.loads(path.read_text())
        assert meta["version"].endswith("-" + meta["sha256"][:8]), (path, meta["version"])


def test_shipped_policies_are_the_current_export_of_their_weights(tmp_path):
    """Every shipped policy computes the tool kinematics once (issue #13: re-exported from the same
    weights, robot_wm/learning/reexport.py, within 1e-5 rad/s of the graph before), and the stack's
    two re-export to themselves bit for bit (what `robot-wm export` writes for the same training)."""
    import json
    import shutil

    import onnx

    from robot_wm.learning.reexport import SHIPPED, reexport_policy

    for directory, task in SHIPPED:
        path = data_path(*directory.split("/"), "policy.onnx")
        assert sum(n.op_type == "Cos" for n in onnx.load(str(path)).graph.node) == 1, path
        assert json.loads(path.with_suffix(".json").read_text())["reexport"]["max_abs_deviation_radps"] <= 1e-5
        if directory in ("models", "models/track"):
            copy = tmp_path / task
            copy.mkdir()
            for name in ("policy.onnx", "policy.json"):
                shutil.copy(path.with_name(name), copy / name)
            assert reexport_policy(copy / "policy.onnx", task)["unchanged"], path
