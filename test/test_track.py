"""The tracking task (robot_wm.core.track) and the common task interface (robot_wm.core.tasks)."""
from __future__ import annotations

import dataclasses
import json
import subprocess

import numpy as np
import pytest

from robot_wm import description
from robot_wm.contracts import JOINT_NAMES
from robot_wm.core.tasks import TASK_NAMES, get_task
from robot_wm.core.track import ReferenceWindow, TrackConfigError, TrackScore, TrackSpec, load_track
from robot_wm.learning.stack_eval import evaluate_stack

from conftest import PYTHON


@pytest.fixture(scope="module")
def spec() -> TrackSpec:
    return load_track()


def test_the_shipped_track_config_is_valid_and_names_a_bad_field():
    spec = load_track()
    assert spec.obs_dim == 2 * len(JOINT_NAMES) + 3 + 3 * len(spec.preview_s)
    for field, value, match in [("peak_speed_mps", (0.05, 0.0), "peak_speed_mps"), ("shapes", ("spiral",), "shapes"),
                                ("preview_s", (0.05, 0.1), "preview_s"), ("lead_in_s", -1.0, "lead_in_s"),
                                ("size_m", (0.04, 0.5), "size_m"), ("episode_s", 2.0, "leaves less than")]:
        with pytest.raises(TrackConfigError, match=match):
            dataclasses.replace(spec, **{field: value})
    with pytest.raises(TrackConfigError, match="unknown track fields"):
        TrackSpec.from_mapping({"speed": 1.0})


def test_paths_stay_in_the_workspace_under_the_speed_limit_and_start_smoothly(spec):
    paths = spec.sample_paths(np.random.default_rng(4), 200)
    t = np.arange(0.0, spec.episode_s + 1e-9, 0.002)
    lo, hi = np.asarray(spec.workspace_min_m), np.asarray(spec.workspace_max_m)
    assert set(paths.shape) == set(spec.shapes)
    for i in range(len(paths)):
        p = paths.position(i, t)
        assert np.all(p >= lo - 1e-9) and np.all(p <= hi + 1e-9), (paths.shape[i], p.min(0), p.max(0))
        v = np.linalg.norm(np.diff(p, axis=0), axis=1) / 0.002
        assert v.max() <= spec.peak_speed_mps[1] + 1e-3 and v.max() <= 0.5  # under the 0.5 m/s tool limit
        assert v.max() == pytest.approx(paths.peak_speed_mps[i], rel=0.05)
        assert np.all(v[t[1:] <= spec.lead_in_s] < 1e-9)  # the reference waits at its start point
        assert np.max(np.abs(np.diff(v))) < 0.02  # no velocity step anywhere (the ramp)
        pv = paths.preview(i, 2.0, spec.preview_s).reshape(-1, 3)
        np.testing.assert_allclose(pv[0], paths.position(i, 2.0))
        np.testing.assert_allclose(pv[-1], paths.position(i, 2.0 + spec.preview_s[-1]))


def test_the_score_counts_only_after_the_lead_in_and_the_reward_follows_it(spec):
    score = TrackScore(spec)
    score.update(0.5, np.array([0.0, 0.0, 0.1]), np.zeros(3))  # during the lead-in: not scored
    for k, err in enumerate([0.001, 0.002, 0.003]):
        score.update(spec.scored_from_s + 0.01 * k, np.array([err, 0.0, 0.0]), np.zeros(3))
    assert score.max_m == pytest.approx(0.003) and score.rms_m == pytest.approx(np.sqrt((1 + 4 + 9) / 3) * 1e-3)
    assert score.success
    score.update(spec.scored_from_s + 1.0, np.array([spec.success_max_m * 1.5, 0, 0]), np.zeros(3))
    assert not score.success
    # reward = the success metric's direction: a smaller error is a larger reward
    ref, a = np.zeros(3), np.zeros(6)
    rewards = [spec.reward(np.array([e, 0, 0]), ref, a) for e in (0.0, 0.002, 0.01, 0.05)]
    assert all(x > y for x, y in zip(rewards, rewards[1:]))


def test_the_baseline_tracks_on_nominal_and_the_arms_dynamics_cost_accuracy(spec):
    """The scripted tracker succeeds on the nominal simulator; on a worn arm with a heavy tool
    (config/sim_profiles/worn_heavy.yaml: lag, latency, payload, friction) the same episodes cost
    it more than twice the RMS error: the task is one where the arm's dynamics matter."""
    task = get_task("track")
    baseline = task.baseline()
    nominal = evaluate_stack(baseline, "nominal", episodes=6, seed=1, task=task, stack=False)
    worn = evaluate_stack(baseline, "worn_heavy", episodes=6, seed=1, task=task, stack=False)
    n, w = nominal.to_dict(), worn.to_dict()
    assert n["success_rate"] >= 5 / 6 and n["tracking_rms_m_median"] < 0.003, n
    assert w["tracking_rms_m_median"] > 2 * n["tracking_rms_m_median"], (n, w)
    assert n["violations"] == 0 and w["violations"] == 0


def test_a_reference_window_gives_the_preview_for_the_receivers_own_time(spec):
    """A window sampled at the control period from t0, read 7 ms later, gives the path at
    t0 + 7 ms + offsets (to interpolation accuracy), and knows when it no longer covers them."""
    paths = spec.sample_paths(np.random.default_rng(3), 4)
    for i in range(len(paths)):
        t0 = 2.3
        window = ReferenceWindow(100.0, spec.control_dt_s, paths.position(i, t0 + np.arange(51) * spec.control_dt_s))
        now = 100.007
        got = window.preview(now, spec.preview_s).reshape(-1, 3)
        want = paths.position(i, t0 + 0.007 + np.asarray(spec.preview_s))
        assert np.max(np.linalg.norm(got - want, axis=1)) < 2e-4  # linear between 10 ms samples
        assert window.covers(now, spec.preview_s)
        assert not window.covers(100.0 + 0.5 - 0.2 + 0.01, spec.preview_s)  # the preview runs off its end
        assert not window.covers(99.99, spec.preview_s)  # from the future
    with pytest.raises(ValueError, match="non-finite"):
        ReferenceWindow(0.0, 0.01, [[0, 0, 0], [np.nan, 0, 0]])
    with pytest.raises(ValueError, match="shape"):
        ReferenceWindow(0.0, 0.01, [[0, 0, 0]])
    with pytest.raises(ValueError, match="step"):
        ReferenceWindow(0.0, 0.0, [[0, 0, 0], [0, 0, 0]])


def test_every_task_has_the_same_interface():
    q_home = description.initial_positions(JOINT_NAMES)
    for name in TASK_NAMES:
        task = get_task(name)
        eps = task.episodes(3, 0, q_home)
        assert len(eps) == 3 and eps.q0_rad.shape == (3, len(JOINT_NAMES))
        obs = task.observation(eps, 0, 0.0, q_home, np.zeros(6), np.array([-0.5, -0.1, 0.4]))
        assert obs.ndim == 1 and np.all(np.isfinite(obs))
        action = task.baseline().act(obs)
        assert action.shape == (len(JOINT_NAMES),) and np.all(np.isfinite(action))
        score = task.new_score(eps, 0)
        score.update(0.01, np.array([-0.5, -0.1, 0.4]))
        assert isinstance(score.success, bool) and score.metrics()
    again = get_task("track").episodes(5, 0, q_home)  # episode i depends only on (seed, i)
    first = get_task("track").episodes(3, 0, q_home)
    np.testing.assert_allclose(again.q0_rad[:3], first.q0_rad)
    np.testing.assert_allclose(again.targets.center_m[:3], first.targets.center_m)
    with pytest.raises(ValueError, match="unknown task"):
        get_task("juggle")


def test_eval_track_json_reports_the_tracking_metrics():
    run = subprocess.run([PYTHON, "-m", "robot_wm.cli", "eval", "--task", "track", "--no-policy", "--episodes", "2",
                          "--json", "--no-progress"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout)
    assert out["task"] == "track" and out["policy"] is None
    for key in ("success_rate", "tracking_rms_m_median", "tracking_max_m_p90", "peak_tool_speed_mps_max", "violations"):
        assert key in out["baseline"]
    # without --policy the shipped tracking policy runs (models/track/); a missing file is named
    missing = subprocess.run([PYTHON, "-m", "robot_wm.cli", "eval", "--task", "track", "--policy", "nope/policy.onnx",
                              "--json", "--no-progress"], capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "nope/policy.onnx" in missing.stderr and "not found" in missing.stderr


def test_train_export_eval_round_trip_for_track(tmp_path):
    """A short imagination run on known dynamics learns to close in on the reference; the exported
    graph carries the task and its layout, PolicyRunner refuses it for reach, and `robot-wm eval
    --task track --policy` runs it closed loop on the simulator."""
    import torch

    from robot_wm.core.onnx_model import ModelError
    from robot_wm.core.policy_runner import PolicyRunner
    from robot_wm.core.task import load_task
    from robot_wm.learning.data import CollectConfig, collect
    from robot_wm.learning.policy import PolicyConfig, export_policy, train_policy
    from robot_wm.learning.torch_kinematics import TorchToolFK

    class Integrator:
        history = 2

        def step(self, q, qdot, actions):
            return q + actions[:, -1] * 0.01, actions[:, -1], torch.zeros(q.shape[0])

    spec = load_track()
    urdf = description.expand()
    data = collect(CollectConfig(transitions=2000, n_envs=8, episode_steps=50, seed=1), load_task(), progress=False)
    actor, report = train_policy(PolicyConfig(iterations=60, batch=64, horizon=10, hidden=64, seed=0), Integrator(),
                                 TorchToolFK(urdf, JOINT_NAMES), data, spec, description.initial_positions(JOINT_NAMES),
                                 progress=False)
    assert report.history[-1]["distance_m"] < report.history[0]["distance_m"]
    path = export_policy(actor, tmp_path / "policy.onnx", joint_names=JOINT_NAMES, task=spec,
                         dataset_sha256=data.sha256, version="test")
    runner = PolicyRunner(path, JOINT_NAMES, spec.control_dt_s, task="track")
    assert runner.task == "track" and runner.act(np.zeros(spec.obs_dim)).shape == (len(JOINT_NAMES),)
    with pytest.raises(ModelError, match="track"):
        PolicyRunner(path, JOINT_NAMES, spec.control_dt_s, task="reach")
    with pytest.raises(ValueError, match="expected"):
        runner.act(np.zeros(18))  # a reach observation
    run = subprocess.run([PYTHON, "-m", "robot_wm.cli", "eval", "--task", "track", "--policy", str(path), "--episodes",
                          "1", "--json", "--no-progress", "--no-baseline"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(run.stdout)["policy"]["tracking_rms_m_median"] is not None


def test_report_sim2real_writes_the_table_json_and_png(tmp_path):
    """The report over rows x profiles (here the baseline alone, 1 episode, without the filter to be
    quick): Markdown, JSON and a PNG, one cell per (row, profile)."""
    out = tmp_path / "report"
    run = subprocess.run([PYTHON, "-m", "robot_wm.cli", "report", "sim2real", "--task", "track", "--profiles",
                          "nominal", "worn_heavy", "--episodes", "1", "--no-stack", "--out", str(out), "--no-progress"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    doc = json.loads((out / "sim2real_track.json").read_text())
    assert doc["profiles"] == ["nominal", "worn_heavy"] and "scripted baseline" in doc["rows"]
    assert set(doc["cells"]["scripted baseline"]) == {"nominal", "worn_heavy"}
    table = (out / "sim2real_track.md").read_text()
    assert "| scripted baseline |" in table and "worn_heavy" in table
    assert (out / "sim2real_track.png").stat().st_size > 1000
    bad = subprocess.run([PYTHON, "-m", "robot_wm.cli", "report", "sim2real", "--task", "track", "--sim-only",
                          str(tmp_path / "nothing"), "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "policy.onnx not found" in bad.stderr


def test_a_malformed_reference_message_is_refused_with_the_reason():
    """The policy node's reading of /robot_wm/reference: NaN, too few points, several transforms
    or uneven times are refused (InputError naming the fault); a good message round-trips."""
    from builtin_interfaces.msg import Duration
    from geometry_msgs.msg import Transform
    from trajectory_msgs.msg import MultiDOFJointTrajectory, MultiDOFJointTrajectoryPoint

    from robot_wm.nodes.conversions import InputError
    from robot_wm.nodes.path_sequencer import reference_window

    def message(points, times_ns, transforms=1):
        msg = MultiDOFJointTrajectory()
        msg.header.stamp.sec, msg.header.stamp.nanosec = 100, 0
        for p, ns in zip(points, times_ns):
            tf = Transform()
            tf.translation.x, tf.translation.y, tf.translation.z = (float(v) for v in p)
            msg.points.append(MultiDOFJointTrajectoryPoint(
                transforms=[tf] * transforms, time_from_start=Duration(sec=ns // 10**9, nanosec=ns % 10**9)))
        return msg

    pts = [[-0.4, 0.0, 0.3 + 0.001 * k] for k in range(30)]
    ok = reference_window(message(pts, [k * 10_000_000 for k in range(30)]))
    assert ok.start_s == pytest.approx(100.0) and ok.step_s == pytest.approx(0.01)
    assert ok.preview(100.015, (0.0, 0.1)).tolist() == pytest.approx([-0.4, 0.0, 0.3015, -0.4, 0.0, 0.3115])
    for msg, match in ((message(pts[:1], [0]), "at least 2"),
                       (message([[np.nan, 0, 0]] + pts[1:], [k * 10_000_000 for k in range(30)]), "non-finite"),
                       (message(pts, [k * 10_000_000 for k in range(30)], transforms=2), "transforms"),
                       (message(pts, [k * k * 1_000_000 for k in range(30)]), "equally spaced")):
        with pytest.raises(InputError, match=match):
            reference_window(msg)


@pytest.mark.ros
def test_the_path_holds_only_for_a_filter_stopped_longer_than_hold_after_s(ros_context):
    """A path starts on a running filter; a stop shorter than hold_after_s (a few stale periods on a
    loaded machine) lets it run on and be scored, a longer one holds it at its start, and it starts
    over when the filter runs again; a path ends after episode_s of running."""
    from robot_wm.msg import SafetyStatus
    from robot_wm.nodes.path_sequencer import PathSequencer

    node = PathSequencer(context=ros_context)
    try:
        clock = {"t": 1000.0}
        node._now_s = lambda: clock["t"]
        events = []
        node._event = events.append

        def status(text, reason=""):
            node._on_status(SafetyStatus(state_text=text, fault_reason=reason))

        def run(seconds):
            for _ in range(int(round(seconds / 0.02))):
                clock["t"] += 0.02
                node._publish()

        status("ESTOP", "start: waiting for operator enable")
        run(1.0)
        assert node.holding and node.path_start_s == pytest.approx(clock["t"])  # held: clock at zero
        status("FILTERING")
        started = clock["t"]
        assert not node.holding and events[-1] == "path 0 (re)starts: safety filter FILTERING"
        run(1.0)
        status("FAULT", "stale input: nominal command 6 periods old")  # 0.1 s: part of the path
        run(0.1)
        status("OK")
        run(1.0)
        assert node.path_start_s == started and node.index == 0 and not any("held" in e for e in events)
        status("STOPPING", "trust level STOP")  # longer than hold_after_s: held, said why
        run(0.5)
        assert node.holding and events[-1] == "path 0 held at its start: safety filter STOPPING: trust level STOP"
        status("FILTERING")
        restarted = clock["t"]
        run(node.spec.episode_s - 0.5)
        assert node.index == 0 and node.path_start_s == restarted
        run(1.0)
        assert node.index == 1 and node.results[0]["path"] == 0
    finally:
        node.destroy_node()
