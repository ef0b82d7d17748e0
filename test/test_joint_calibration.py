"""Joint zero-offset calibration (robot_wm.core.joint_calibration, ``robot-wm calibrate joints``):
the fit recovers offsets from poses and an outside reference, says which it cannot see, refuses
data that are not joint offsets; the file's every flaw is named; the library arm behind a
calibrated driver reports the true angles; the whole command on the worn arm; and the driver kit
publishes calibrated positions or refuses to start on a bad file."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from robot_wm import description
from robot_wm.core import joint_calibration as jc
from robot_wm.core.joint_calibration import JointCalibration, JointCalibrationError, fit_joint_offsets
from robot_wm.core.kinematics import Kinematics

from conftest import wait_for

URDF = description.expand()
JOINTS = description.joint_limits(URDF).names
KIN = Kinematics(URDF, JOINTS)
HOME = description.initial_positions(JOINTS)


def _poses(n: int, seed: int) -> np.ndarray:
    return HOME + np.random.default_rng(seed).uniform(-0.6, 0.6, (n, len(JOINTS)))


def _data(offset, n=20, seed=0, ref_std=5e-5):
    rng = np.random.default_rng(seed + 100)
    q_true = _poses(n, seed)
    p = np.array([KIN.tool_position_m(q) for q in q_true]) + rng.normal(0, ref_std, (n, 3))
    return q_true + offset, p, q_true


# ---------------------------------------------------------------- the fit
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(offset=st.lists(st.floats(-0.01, 0.01), min_size=6, max_size=6), seed=st.integers(0, 10_000))
def test_the_fit_recovers_every_offset_that_moves_the_tool_and_leaves_no_tool_error(offset, seed):
    offset = np.array(offset)
    q_meas, p, q_true = _data(offset, seed=seed)
    cal = fit_joint_offsets(KIN, q_meas, p, reference_std_m=5e-5)
    seen = np.array(cal.observable)
    # tool0 lies on the last wrist joint's axis: its offset cannot be seen, and does not matter for the tool
    assert seen[:5].all() and not seen[5] and abs(cal.offset_rad[5]) < 1e-6
    err = cal.offset_rad - offset
    assert np.all(np.abs(err[seen]) < 5 * cal.std_rad[seen] + 1e-5), (err, cal.std_rad)
    left = max(np.linalg.norm(KIN.tool_position_m(q - cal.offset_rad) - KIN.tool_position_m(t)) for q, t in zip(q_meas, q_true))
    assert left < 2e-4 and cal.residual_rms_m_after < 2e-4
    assert cal.residual_rms_m_before >= cal.residual_rms_m_after


@pytest.mark.parametrize("mangle, words", [
    (lambda q, p: (q[:2], p[:2]), "2 poses; at least 3"),
    (lambda q, p: (q[:, :5], p), "expected joints (N, 6)"),
    (lambda q, p: (q, p[:, :2]), "reference points (N, 3)"),
    (lambda q, p: (np.where(np.arange(len(q))[:, None] == 4, np.nan, q), p), "non-finite values in poses [4]"),
    # another arm's, or another frame's points: no set of joint offsets explains them
    (lambda q, p: (q, p + np.random.default_rng(1).normal(0, 0.02, p.shape)), "do not fit joint offsets alone"),
])
def test_data_that_are_not_joint_offsets_are_refused_naming_why(mangle, words):
    q, p, _ = _data(np.full(6, 0.003))
    with pytest.raises(JointCalibrationError, match=None) as err:
        fit_joint_offsets(KIN, *mangle(q, p), reference_std_m=5e-5)
    assert words in str(err.value), err.value


def test_a_reference_registered_off_the_base_is_refused_but_a_yaw_of_it_is_the_first_joints_offset():
    """What the fit can and cannot tell from a joint offset (documented in the module and README)."""
    q, p, _ = _data(np.zeros(6), n=24, ref_std=1e-5)
    with pytest.raises(JointCalibrationError, match="registered off base_link or its marker off tool0"):
        fit_joint_offsets(KIN, q, p + [0.0, 0.0, 0.001], reference_std_m=1e-5)  # the tracker 1 mm off in z
    yaw = 0.003
    rz = np.array([[np.cos(yaw), -np.sin(yaw), 0], [np.sin(yaw), np.cos(yaw), 0], [0, 0, 1]])
    cal = fit_joint_offsets(KIN, q, p @ rz.T, reference_std_m=1e-5)  # the tracker's frame turned about z
    assert cal.offset_rad[0] == pytest.approx(-yaw, abs=2e-5) and np.allclose(cal.offset_rad[1:5], 0, atol=1e-4)


# ---------------------------------------------------------------- the file
def _cal(offset=(0.001, -0.002, 0.0, 0.0005, 0.0, 0.0)) -> JointCalibration:
    return JointCalibration(JOINTS, np.array(offset), np.full(6, 1e-5), (True,) * 5 + (False,), "worn_heavy", poses=12)


def test_the_file_round_trips_in_any_joint_order(tmp_path):
    path = jc.save(_cal(), tmp_path / "cal.json")
    back = jc.load(path, JOINTS)
    np.testing.assert_array_equal(back.offset_rad, _cal().offset_rad)
    assert back.observable == _cal().observable and back.robot == "worn_heavy" and back.poses == 12
    flipped = jc.load(path, tuple(reversed(JOINTS)))
    np.testing.assert_array_equal(flipped.offset_rad, _cal().offset_rad[::-1])
    np.testing.assert_allclose(back.correct(HOME + back.offset_rad), HOME)


@pytest.mark.parametrize("write, words", [
    (None, "no such file"),
    ("{not json", "unreadable"),
    ('{"joints": {}}', "not a joint calibration"),
    (lambda d: {**d, "joints": {}}, "'joints' must map each joint name"),
    (lambda d: {**d, "joints": {**d["joints"], "elbow_joint": {"offset_rad": "x"}}}, "joint 'elbow_joint' has no numeric"),
    (lambda d: {**d, "joints": {**d["joints"], "elbow_joint": {"offset_rad": 0.3}}}, "elbow_joint=+0.3000 rad"),
    (lambda d: {**d, "joints": {k: v for k, v in d["joints"].items() if k != "wrist_1_joint"}}, "not ["),
    (lambda d: {**d, "joints": {**d["joints"], "extra_joint": {"offset_rad": 0.0}}}, "not ["),
    (lambda d: {**d, "joints": {**d["joints"], "elbow_joint": {"offset_rad": 0.0, "observable": "false"}}},
     "observable 'false' is not true or false"),
    (lambda d: {**d, "joints": {**d["joints"], "elbow_joint": {"offset_rad": 0.0, "std_rad": -1}}}, "std_rad -1"),
    (lambda d: {**d, "poses": "x"}, "poses='x'"),
    (lambda d: {**d, "residual_rms_m": [1]}, "residual_rms_m=[1]"),
    (lambda d: {**d, "extra": [1, 2]}, "extra an object"),
])
def test_every_flaw_of_a_calibration_file_is_named(tmp_path, write, words):
    path = tmp_path / "cal.json"
    if callable(write):
        path.write_text(json.dumps(write(_cal().to_dict())))
    elif write is not None:
        path.write_text(write)
    with pytest.raises(JointCalibrationError) as err:
        jc.load(path, JOINTS)
    assert str(path) in str(err.value) and words in str(err.value), err.value
    with pytest.raises(JointCalibrationError, match="non-finite offsets"):
        JointCalibration(JOINTS, np.array([math.nan] + [0.0] * 5), np.zeros(6), (True,) * 6)


# ---------------------------------------------------------------- library mode
def test_the_library_arm_behind_a_calibrated_driver_reports_the_true_angles():
    from robot_wm.learning.stack_eval import library_arm
    from robot_wm.sim import load_profile

    prof = load_profile("worn_heavy")
    cal = JointCalibration(JOINTS, np.array(prof.encoder_offset_rad), np.zeros(6), (True,) * 6)
    raw, fixed = library_arm(prof, 3, HOME), library_arm(prof, 3, HOME, cal)
    for arm in (raw, fixed):
        arm.set_command(np.array([0.2, -0.1, 0.1, 0, 0, 0]))
        arm.step(100)
    true = fixed.true_joint_state().position_rad
    assert np.max(np.abs(raw.joint_state().position_rad - true)) > 4e-3  # the profile's 5 mrad offsets
    assert np.max(np.abs(fixed.joint_state().position_rad - true)) < 1e-3  # only the sensor noise left
    np.testing.assert_array_equal(fixed.tool_position_m(), fixed._sim.tool_position_m())


def test_calibrate_joints_on_the_worn_arm_finds_its_offsets_and_writes_a_file_the_stack_loads(tmp_path, capsys):
    from robot_wm.cli import main
    from robot_wm.learning.stack_eval import build_stack

    out, csv = tmp_path / "worn.json", tmp_path / "poses.csv"
    with pytest.raises(SystemExit) as code:
        main(["calibrate", "joints", "--library", "--profile", "worn_heavy", "--poses", "10", "--out", str(out),
              "--save-measurements", str(csv), "--json"])
    assert code.value.code == 0
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    err = np.array(doc["extra"]["error_rad"])
    seen = [doc["joints"][j]["observable"] for j in JOINTS]
    assert seen == [True] * 5 + [False] and np.max(np.abs(err[:5])) < 5e-4, doc
    # 3 mm of tool error before, a tenth of a millimetre after
    assert doc["extra"]["tool_error_uncalibrated_m_median"] > 2e-3 and doc["extra"]["tool_error_left_m_max"] < 2e-4
    # the worn wrist sags under the heavy tool at some poses: those are skipped, named, and spares taken
    skipped = doc["extra"]["skipped"]
    assert doc["poses"] == 10 and skipped and all("not at rest" in s for s in skipped), skipped
    assert build_stack(0.01, joint_calibration=out).joint_calibration.robot == "worn_heavy"

    # the integrator's path: the same measurements as a CSV give the same offsets
    with pytest.raises(SystemExit) as code:
        main(["calibrate", "joints", "--measurements", str(csv), "--tracker-noise-mm", "0.01", "--out",
              str(tmp_path / "csv.json"), "--json"])
    assert code.value.code == 0
    again = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for j in JOINTS[:5]:
        assert again["joints"][j]["offset_rad"] == pytest.approx(doc["joints"][j]["offset_rad"], abs=2e-5)

    csv.write_text("shoulder_pan_joint,x,y,z\n0.1,0,0,0\n")
    with pytest.raises(SystemExit) as code:
        main(["calibrate", "joints", "--measurements", str(csv), "--out", str(tmp_path / "x.json")])
    assert code.value.code == 2 and "header lacks columns" in capsys.readouterr().err


def test_a_stack_evaluation_refuses_a_bad_calibration_file_before_it_runs_and_another_arms(tmp_path):
    from robot_wm.learning.stack_eval import build_stack, library_arm

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**_cal().to_dict(), "joints": {"elbow_joint": {"offset_rad": 0.0}}}))
    with pytest.raises(JointCalibrationError, match="bad.json: is for joints"):
        build_stack(0.01, joint_calibration=bad)
    with pytest.raises(JointCalibrationError, match="of arm 'worn_heavy' on the arm 'real_twin'"):
        library_arm("real_twin", 0, HOME, _cal())


# ---------------------------------------------------------------- the driver kit
@pytest.mark.ros
def test_the_driver_publishes_calibrated_positions_and_refuses_a_bad_file(spawn, ros_context, tmp_path):
    from robot_wm import graph
    from robot_wm.process_group import command_for

    from rosclient import ArmClient

    spec = next(s for s in graph.plan(graph.EXAMPLE, stack=False) if s.name == "example_arm")
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    refused = spawn(command_for(spec) + ["--ros-args", "-p", f"joint_calibration_file:={bad}"])
    assert wait_for(lambda: refused.process.poll() is not None, 30.0), refused.output()
    assert refused.process.returncode != 0 and "not a joint calibration" in refused.output(), refused.output()

    path = jc.save(_cal(), tmp_path / "cal.json")
    proc = spawn(command_for(spec) + ["--ros-args", "-p", f"joint_calibration_file:={path}"])
    client = ArmClient(ros_context)
    try:
        assert client.wait_for_state(30.0), proc.output()
        np.testing.assert_allclose(client.latest()[1], HOME - _cal().offset_rad, atol=1e-9)
    finally:
        client.close()
    assert proc.stop() == 0 and "Traceback" not in proc.output()


def test_up_hands_the_file_to_the_arm_driver_and_refuses_a_bad_one_before_starting_anything(tmp_path, capsys,
                                                                                              monkeypatch):
    from robot_wm import graph
    from robot_wm.cli import build_parser
    from robot_wm.process_group import command_for

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**_cal().to_dict(), "joints": {**_cal().to_dict()["joints"],
                                                              "elbow_joint": {"offset_rad": 0.5}}}))
    args = build_parser().parse_args(["up", "--joint-calibration", str(bad)])
    assert args.func(args) == 2 and "elbow_joint=+0.5000 rad" in capsys.readouterr().err
    path = jc.save(_cal(), tmp_path / "cal.json")
    args = build_parser().parse_args(["up", "--profile", "real_twin", "--joint-calibration", str(path)])
    assert args.func(args) == 2 and "measured on arm 'worn_heavy', not the embedded arm's profile" in capsys.readouterr().err

    seen = {}

    class Planned(Exception):
        pass

    def plan(*a, overrides=None, **kw):  # what up would start, caught before anything starts
        seen.update(overrides)
        raise Planned

    monkeypatch.setattr(graph, "plan", plan)
    with pytest.raises(Planned):
        args = build_parser().parse_args(["up", "--profile", "worn_heavy", "--joint-calibration", str(path)])
        args.func(args)
    assert seen["joint_calibration_file"] == str(path.resolve()) and seen["profile"] == "worn_heavy"
    monkeypatch.undo()
    arm = next(s for s in graph.plan("mujoco", overrides=seen) if s.name == "arm_sim")
    assert f"arm_sim:joint_calibration_file:={path}" in " ".join(command_for(arm))


def test_demonstrations_recorded_behind_the_calibration_carry_the_true_angles_and_say_so(tmp_path):
    from robot_wm import bags
    from robot_wm.core.tasks import get_task
    from robot_wm.learning.demos import record_library
    from robot_wm.sim import load_profile

    prof = load_profile("worn_heavy")
    cal = jc.save(JointCalibration(JOINTS, np.array(prof.encoder_offset_rad), np.zeros(6), (True,) * 6, "worn_heavy"),
                  tmp_path / "cal.json")
    (raw,) = record_library("reach", "worn_heavy", 1, tmp_path / "raw", progress=False)
    (fixed,) = record_library("reach", "worn_heavy", 1, tmp_path / "fixed", progress=False, joint_calibration=cal)
    q0 = get_task("reach").episodes(1, 0, HOME).q0_rad[0]  # the arm starts at rest there (true angles)
    first = {p: bags.read_episode(p).q_rad[0] for p in (raw, fixed)}
    assert np.max(np.abs(first[raw] - q0 - prof.encoder_offset_rad)) < 1e-3  # the encoders as they read
    assert np.max(np.abs(first[fixed] - q0)) < 1e-3
    assert bags.read_meta(fixed).extra["joint_calibration"]["shoulder_pan_joint"] == pytest.approx(0.005)
    assert "joint_calibration" not in bags.read_meta(raw).extra


def test_adapt_evaluates_behind_the_calibration_its_demos_were_recorded_through_or_refuses(tmp_path):
    from types import SimpleNamespace

    from robot_wm.learning.adapt import AdaptError, _check_demo_calibration

    cal = _cal()
    note = {j: round(float(o), 7) for j, o in zip(cal.joint_names, cal.offset_rad)}
    calibrated = SimpleNamespace(library=True, extra={"joint_calibration": note}, robot="worn_heavy", index=3)
    plain = SimpleNamespace(library=True, extra={}, robot="worn_heavy", index=4)
    _check_demo_calibration([calibrated], jc.save(cal, tmp_path / "cal.json"))  # the same: fine
    _check_demo_calibration([plain], None)
    with pytest.raises(AdaptError, match="demo worn_heavy #4 was recorded behind joint calibration None"):
        _check_demo_calibration([calibrated, plain], cal)
    with pytest.raises(AdaptError, match="demo worn_heavy #3 .* would run behind None"):
        _check_demo_calibration([calibrated], None)
