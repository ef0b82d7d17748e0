"""Demonstration bags: round trip, what rosbags itself reads back, and every kind of bad bag."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from robot_wm import bags
from robot_wm.bags import BagError, EpisodeBagWriter, EpisodeMeta, Messages
from robot_wm.learning import demos

NAMES = ["shoulder_pan_joint", "shoulder_lift_joint", "elbow_joint", "wrist_1_joint", "wrist_2_joint", "wrist_3_joint"]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """Two library-mode tracking episodes on real_twin, and the filter trace of the same episodes."""
    out = tmp_path_factory.mktemp("demos")
    paths = demos.record_library("track", "real_twin", 2, out, progress=False)
    return out, paths


def _meta(**kw) -> EpisodeMeta:
    base = dict(task="track", robot="nominal", source="policy", success=True, error_m=0.004, interventions=0,
                filter_interventions=0, start_ns=1_000_000_000, end_ns=7_000_000_000, dt_s=0.01, joint_names=NAMES)
    return EpisodeMeta(**(base | kw))


def _synthetic(path: Path, *, steps: int = 601, gap_at: int | None = None, names=NAMES, meta=None) -> Path:
    """A hand-made bag: states every 10 ms from 1 s (optionally a 200 ms hole), a command each."""
    m = Messages()
    with EpisodeBagWriter(path) as w:
        for k in range(steps):
            if gap_at is not None and gap_at <= k < gap_at + 20:
                continue
            t = 1_000_000_000 + k * 10_000_000
            w.write(bags.STATES_TOPIC, t, m.joint_state(t, names, np.full(6, 0.001 * k), np.full(6, 0.1), np.zeros(6)))
            w.write(bags.COMMAND_TOPIC, t, m.float64_array(np.full(6, 0.1)))
        return w.close(meta or _meta(joint_names=list(names)))


def test_round_trip_gives_the_samples_the_stack_ran_on(recorded):
    """record (library) -> bags -> load_demos: exactly the joint states and commands of the run."""
    from robot_wm import description
    from robot_wm.core.policy_runner import PolicyRunner
    from robot_wm.core.tasks import get_task
    from robot_wm.learning.stack_eval import evaluate_stack
    from robot_wm.paths import data_path

    out, paths = recorded
    data, metas, shas = demos.load_demos(out)
    task = get_task("track")
    assert data.q_rad.shape == (2, task.episode_steps + 1, 6) and data.action_radps.shape == (2, task.episode_steps, 6)
    assert [m.robot for m in metas] == ["real_twin"] * 2 and all(m.source == "policy" and m.library for m in metas)
    assert len(set(shas)) == 2 and all(len(s) == 64 for s in shas)
    names = description.joint_limits(description.expand()).names
    models = Path(data_path("models", "track"))
    trace: list = []
    report = evaluate_stack(PolicyRunner(models / "policy.onnx", names, task.control_dt_s, task.action_limit_radps,
                                         task="track"), "real_twin", 2, 0, task=task, models_dir=models, trace=trace)
    for i in range(2):
        rows = [p for p in trace if p.episode == i][-task.episode_steps:]  # the task's periods (after the start-up)
        np.testing.assert_array_equal(np.array([p.command_radps for p in rows]), data.action_radps[i])
        np.testing.assert_array_equal(np.array([p.q_rad for p in rows]), data.q_rad[i, :-1])
        np.testing.assert_array_equal(np.array([p.qdot_radps for p in rows]), data.qdot_radps[i, :-1])
    assert [m.success for m in metas] == report.success.tolist()
    np.testing.assert_allclose([m.error_m for m in metas], report.metrics["tracking_rms_m"])


def test_rosbags_reads_every_topic_and_the_metadata(recorded):
    """A plain rosbags Reader (what ros2 bag info uses the same metadata of) decodes all topics,
    robot_wm's messages from the definitions embedded in the MCAP file."""
    import yaml
    from rosbags.rosbag2 import Reader
    from rosbags.typesys import Stores, get_typestore

    _, paths = recorded
    info = yaml.safe_load((paths[0] / "metadata.yaml").read_text())["rosbag2_bagfile_information"]
    assert info["version"] == 9 and info["storage_identifier"] == "mcap"
    assert [f["path"] for f in info["files"]] == [f"{paths[0].name}.mcap"]
    assert json.loads(info["custom_data"][bags.META_KEY])["format"] == bags.META_FORMAT
    store = get_typestore(Stores.ROS2_JAZZY)
    with Reader(paths[0]) as reader:
        topics = {c.topic: c.msgtype for c in reader.connections}
        assert set(topics) == set(bags.TOPICS) - {"/robot_wm/goal"}
        # the custom types come from the bag's own schemas, no robot_wm install needed
        from rosbags.typesys import get_types_from_msg
        for conn in reader.connections:
            if conn.msgtype.startswith("robot_wm/"):
                store.register(get_types_from_msg(conn.msgdef.data, conn.msgtype))
        decoded = {}
        for conn, _, raw in reader.messages():
            decoded.setdefault(conn.topic, store.deserialize_cdr(raw, conn.msgtype))
    assert decoded["/robot_wm/safety_status"].state_text in ("OK", "FILTERING", "ESTOP")
    assert 0.0 <= decoded["/robot_wm/trust"].score <= 1.0
    assert decoded["/robot_wm/episodes"].task == "track"
    assert len(decoded["/robot_wm/reference"].points) >= 50
    # the filter's start-up tare: real_twin's 0.8 kg gripper (the tare splits off the sensor's bias along gravity)
    assert decoded["/robot_wm/payload"].header.frame_id == "ft_sensor_link"
    assert 0.6 < decoded["/robot_wm/payload"].inertia.m < 1.1
    assert bags.read_episode(paths[0]).payload_kg == pytest.approx(decoded["/robot_wm/payload"].inertia.m, abs=0.1)


def test_inspect_summarizes_and_the_cli_prints_it(recorded, capsys):
    from robot_wm.cli import main

    out, _ = recorded
    report = demos.inspect_demos(out)
    assert report["bags"] == report["usable"] == 2 and not report["problems"]
    assert report["robots"] == {"real_twin": 2} and report["sources"] == {"policy": 2}
    assert report["max_state_gap_s"] == pytest.approx(0.01) and report["duration_s"]["min"] == pytest.approx(6.0)
    with pytest.raises(SystemExit) as code:
        main(["demos", "inspect", str(out)])
    assert code.value.code == 0
    assert "2 usable of 2" in capsys.readouterr().out


def test_truncated_and_corrupt_bags_are_named_and_never_loaded(recorded, tmp_path):
    out, paths = recorded
    bad = tmp_path / "demos"
    shutil.copytree(out, bad)
    mcap = bad / paths[0].name / f"{paths[0].name}.mcap"
    mcap.write_bytes(mcap.read_bytes()[: mcap.stat().st_size // 3])  # truncated mid-file
    with pytest.raises(BagError, match=paths[0].name):
        bags.read_episode(bad / paths[0].name)
    with pytest.raises(BagError, match=paths[0].name):
        demos.load_demos(bad)
    report = demos.inspect_demos(bad)
    assert report["usable"] == 1 and report["problems"][0]["bag"] == paths[0].name
    garbage = bad / paths[1].name / f"{paths[1].name}.mcap"
    garbage.write_bytes(b"\x00" * 4096)
    with pytest.raises(BagError, match="truncated or corrupt"):
        bags.read_episode(bad / paths[1].name)


def test_partial_recordings_missing_metadata_and_foreign_bags(tmp_path):
    d = tmp_path / "demos"
    good = _synthetic(d / "ok")
    (d / "ok2.partial").mkdir()
    with pytest.raises(BagError, match="interrupted recording"):
        demos.load_demos(d)
    assert any("interrupted" in p["problem"] for p in demos.inspect_demos(d)["problems"])
    shutil.rmtree(d / "ok2.partial")
    (d / "no_meta").mkdir()  # storage without metadata (its recorder died): listed, refused
    (d / "no_meta" / "no_meta.mcap").write_bytes(b"\x89MCAP0\r\n")
    with pytest.raises(BagError, match="no metadata.yaml"):
        demos.load_demos(d)
    assert demos.inspect_demos(d)["problems"] == [{"bag": "no_meta", "problem": bags.broken_reason(d / "no_meta")}]
    shutil.rmtree(d / "no_meta")
    meta_file = good / "metadata.yaml"
    text = meta_file.read_text()
    meta_file.write_text(text.replace(bags.META_KEY, "someone.else"))
    with pytest.raises(BagError, match="not recorded by robot-wm record"):
        bags.read_meta(good)
    meta_file.write_text(text.replace("robot_wm-demo/1", "robot_wm-demo/9"))
    with pytest.raises(BagError, match="format"):
        bags.read_meta(good)
    meta_file.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(BagError, match="not rosbag2 metadata"):
        bags.read_meta(good)
    meta_file.write_text("rosbag2_bagfile_information: [1, 2]\n")
    with pytest.raises(BagError, match="not rosbag2 metadata"):
        bags.read_meta(good)
    meta_file.unlink()
    with pytest.raises(BagError, match="no metadata.yaml"):
        bags.read_meta(good)
    other = _synthetic(tmp_path / "other_robot", names=[f"joint_{i}" for i in range(6)])
    with pytest.raises(BagError, match="recorded on another robot"):
        bags.read_episode(other, NAMES)


def test_gaps_short_episodes_and_other_tasks_are_refused_with_the_reason(tmp_path):
    gap = _synthetic(tmp_path / "a" / "gap", gap_at=300)
    with pytest.raises(BagError, match=r"silent for 2\d\d ms at 2\.9\d\d s"):
        demos.load_demos([gap], task="track")
    short = _synthetic(tmp_path / "b" / "short", steps=200)
    with pytest.raises(BagError, match="cut short"):
        demos.load_demos([short], task="track", steps=600)  # the metadata says 6 s, the states end at 2 s
    tiny = _synthetic(tmp_path / "e" / "tiny", steps=30, meta=_meta(end_ns=1_300_000_000))
    with pytest.raises(BagError, match="shorter than 50 control periods"):
        demos.load_demos([tiny], task="track")
    reach_ok = _synthetic(tmp_path / "f" / "reach_goal", steps=300, meta=_meta(task="reach", end_ns=3_990_000_000))
    data, _, _ = demos.load_demos([reach_ok], task="reach")  # ended at the goal: its own length
    assert data.n_steps == 299
    reach = _synthetic(tmp_path / "c" / "reach", meta=_meta(task="reach"))
    with pytest.raises(BagError, match="task 'reach', not 'track'"):
        demos.load_demos([reach], task="track")
    ok = _synthetic(tmp_path / "d" / "ok")
    data, _, _ = demos.load_demos([ok], task="track")
    np.testing.assert_allclose(data.q_rad[0, :, 0], 0.001 * np.arange(601))
    np.testing.assert_allclose(data.action_radps, 0.1)


def test_command_in_force_is_the_last_one_received_in_the_period(tmp_path):
    """Live timing: states at t_k, commands 1 ms later, one period missing -> the previous one held."""
    m = Messages()
    path = tmp_path / "d" / "live"
    with EpisodeBagWriter(path) as w:
        for k in range(611):
            t = 1_000_000_000 + k * 10_000_000
            w.write(bags.STATES_TOPIC, t, m.joint_state(t, NAMES, np.zeros(6), np.zeros(6), np.zeros(6)))
            if k != 5:
                w.write(bags.COMMAND_TOPIC, t + 1_000_000, m.float64_array(np.full(6, float(k))))
        w.close(_meta())
    data, _, _ = demos.load_demos([path], task="track")
    a = data.action_radps[0, :, 0]
    assert a[0] == 0.0 and a[4] == 4.0 and a[5] == 4.0 and a[6] == 6.0  # period 5 sent nothing: 4 still in force


def test_writer_never_leaves_a_bag_that_looks_whole(tmp_path):
    m = Messages()
    path = tmp_path / "ep"
    with pytest.raises(RuntimeError):
        with EpisodeBagWriter(path) as w:
            w.write(bags.STATES_TOPIC, 1, m.joint_state(1, NAMES, np.zeros(6), np.zeros(6), np.zeros(6)))
            raise RuntimeError("recorder died")
    assert not path.exists() and not (tmp_path / "ep.partial").exists()
    _synthetic(path, steps=3)
    with pytest.raises(BagError, match="already exists"):
        EpisodeBagWriter(path)
    with pytest.raises(BagError, match="expected one of"):
        _meta(source="monkey")
    with pytest.raises(BagError, match="not a demonstration topic"):
        with EpisodeBagWriter(tmp_path / "ep3") as w:
            w.write("/chatter", 1, m.float64_array([1.0]))


def test_trust_calibration_from_recorded_operation(recorded, tmp_path):
    """trust calibrate --bags: the monitor's signals replayed from the bags with the chosen world
    model give finite thresholds for that model; too little operation for the configured
    exceedance is refused with what it needs."""
    from robot_wm.core.trust import calibration as calib_io
    from robot_wm.learning.bag_calibration import calibrate_from_bags
    from robot_wm.paths import config_path, data_path

    out, _ = recorded
    wm = Path(data_path("models", "track", "world_model.onnx"))
    with pytest.raises(ValueError, match="needs 303 s; record more"):
        calibrate_from_bags(out, wm)
    loose = tmp_path / "trust.yaml"
    loose.write_text(config_path("trust.yaml").read_text().replace("calibration_exceedance: 1.0e-4",
                                                                   "calibration_exceedance: 1.0e-2"))
    cal, path, seconds = calibrate_from_bags(out, wm, config_file=loose, out=tmp_path / "cal.json")
    assert seconds == pytest.approx(12.02, abs=0.05)
    again = calib_io.load(path, cal.model_version)
    assert again.model_version == cal.model_version and again.model_version.startswith("wm-")
    assert all(np.isfinite(v) and v > 0 for v in again.thresholds.values()), again.thresholds
    assert again.source.startswith("bags:")
    # the effort model records the tare the bags carried (the trust monitor compares later tares with it)
    assert 0.6 < again.effort_model["payload_kg"] < 1.1


def test_a_replayed_period_with_no_command_sent_is_not_judged_as_the_node_does_not(tmp_path):
    """The filter stamps a SafetyStatus with each command it sends. A recording with 200 ms of none
    (a stalled stack: the driver's 50 ms timeout ramps the arm to rest, while the replay holds the
    last command and the world model predicts it) gives those periods no prediction signals when
    replayed with the hardware's command timeout, as the trust_monitor node does not judge them;
    every other period is judged alike."""
    from robot_wm.core.trust.settings import load_trust_config
    from robot_wm.learning.bag_calibration import replay_run
    from robot_wm.paths import data_path

    m = Messages()
    command = np.array([0.2, -0.1, 0.1, 0.0, 0.0, 0.0])
    q, v = np.array([0.0, -1.2, 1.2, -1.5708, -1.5708, 0.0]), np.zeros(6)
    gap = range(300, 320)
    with EpisodeBagWriter(tmp_path / "demos" / "ep") as w:
        for k in range(601):
            t = 1_000_000_000 + k * 10_000_000
            stalled = k in gap
            target = np.zeros(6) if stalled and k >= gap.start + 5 else command  # the driver's timeout after 50 ms
            v = v + 0.3 * (target - v)
            q = q + v * 0.01
            w.write(bags.STATES_TOPIC, t, m.joint_state(t, NAMES, q, v, np.zeros(6)))
            if not stalled:
                w.write(bags.COMMAND_TOPIC, t, m.float64_array(command))
                w.write(bags.STATUS_TOPIC, t, m.safety_status(t, 0, "OK", [], 0.0))
        w.close(_meta())
    config, settings = load_trust_config(None)
    wm = Path(data_path("models", "track", "world_model.onnx"))
    judged, _, _ = replay_run(tmp_path / "demos", wm, config)
    ruled, _, _ = replay_run(tmp_path / "demos", wm, config, command_timeout_s=settings.command_timeout_s)
    error, error_ruled = judged.raw["prediction_error"], ruled.raw["prediction_error"]
    skipped = np.isnan(error_ruled) & ~np.isnan(error)
    t_gap = (gap.start - 1) * 0.01 + settings.command_timeout_s  # the last command, then the timeout
    assert skipped.any() and np.all((judged.t_s[skipped] > t_gap - 0.011) & (judged.t_s[skipped] < gap.stop * 0.01 + 0.03))
    assert np.nanmax(error[skipped]) > 3.0 * np.nanmedian(error), "the held command should have mispredicted the stop"
    same = ~skipped
    np.testing.assert_array_equal(error[same], error_ruled[same])
