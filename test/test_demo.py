"""`robot-wm demo` end to end (the whole stack), and the bare arm's tracking and timeout through its topics."""
from __future__ import annotations

import json
import time

import numpy as np
import pytest

from conftest import PYTHON, wait_for
from robot_wm.contracts import JOINT_NAMES
from rosclient import ArmClient, arm_sim_command
from scripted_arm import Segment, default_script, run_script, summarize

pytestmark = pytest.mark.ros


def test_scripted_arm_tracks_its_commands_and_stops_on_the_timeout(spawn, ros_context):
    """The arm alone in its own process, a scripted velocity sequence over ROS 2, judged on /joint_states."""
    proc = spawn(arm_sim_command())
    client = ArmClient(ros_context)
    script = default_script()
    try:
        assert client.wait_for_state(30.0), "no /joint_states from arm_sim:\n" + proc.output()
        for _ in range(3):  # again if this observer missed part of the run (see below)
            wall_minus_mono = time.time() - time.monotonic()
            t0 = run_script(client, script)
            time.sleep(0.1)  # the last joint states of the silence
            states = client.states_since(t0)
            # judged at the joint states' own stamps (the arm's wall clock, put on the script's monotonic
            # one): a moment this process was not scheduled delays their receipt, not the arm's stop
            stamps = [s[5] - wall_minus_mono for s in states]
            # a stall of the machine (CI once: 1.3 s without a joint state, a whole segment unjudged)
            # leaves a hole in what was observed, and a starved observer receives too few of the 500 Hz
            # states (test_driver_kit's client, CI once: 35 of 250): the arm is then judged on another run
            if len(stamps) > 1000 and np.diff(stamps).max() < 0.2:
                break
    finally:
        client.close()
    check = summarize(stamps, [s[2] for s in states], script, t0)
    assert check.joint_states_received > 1000
    assert set(check.tracking_error_radps) == {s.name for s in script if s.velocity_radps is not None}
    assert check.worst_tracking_error_radps < 0.05, check.tracking_error_radps
    assert check.stop_after_timeout_s is not None and 0.0 < check.stop_after_timeout_s < 0.5
    assert check.passed
    assert "Traceback" not in proc.output()


def _states(v_of_t, t_end=3.0, dt=0.002):
    t = np.arange(0.0, t_end, dt)
    return t, [np.asarray(v_of_t(x), dtype=float) for x in t]


def test_summary_fails_when_the_arm_does_not_follow():
    script = [Segment("move", 1.0, (0.5, 0, 0, 0, 0, 0)), Segment("silence", 1.0, None)]
    still = summarize(*_states(lambda t: np.zeros(6)), script, 0.0)
    assert not still.passed and still.tracking_error_radps["move"] == pytest.approx(0.5)
    never_stops = summarize(*_states(lambda t: [0.5, 0, 0, 0, 0, 0]), script, 0.0)
    assert not never_stops.passed and never_stops.stop_after_timeout_s is None
    good = summarize(*_states(lambda t: [0.5 if t < 1.1 else 0.0, 0, 0, 0, 0, 0]), script, 0.0)
    assert good.passed and good.stop_after_timeout_s == pytest.approx(0.1, abs=0.01)


def test_demo_runs_the_whole_stack_and_writes_its_report(spawn, tmp_path):
    """`make demo`'s job, shortened: goals, then reference paths, through policy + world model +
    safety filter, a push, an e-stop and a reset in each, measured on the arm; the PNG reports and
    the JSON summaries are written."""
    proc = spawn([PYTHON, "-m", "robot_wm.cli", "demo", "--duration", "16", "--out", str(tmp_path)])
    assert wait_for(lambda: proc.process.poll() is not None, 360.0, 0.2), proc.output()
    out = proc.output()
    assert "Traceback" not in out, out
    summary = json.loads((tmp_path / "demo_summary.json").read_text())
    assert (tmp_path / "demo_report.png").stat().st_size > 10_000
    assert summary["estop_to_rest_s"] is not None and summary["estop_to_rest_s"] < 0.3
    assert summary["resumed_after_reset"]
    assert summary["filter_states"].get("ESTOP", 0) > 100  # latched for the 3 s until the reset
    # every controlled stop is accounted for, by kind, with the reason it began with
    stopped = sum(int(what.split()[0]) for what in summary["filter_stops"].values())
    assert stopped == summary["filter_states"].get("STOPPING", 0) + summary["filter_states"].get("FAULT", 0), summary
    assert all(kind.split()[0] in ("STOPPING", "FAULT") and " periods; first: " in what
               for kind, what in summary["filter_stops"].items()), summary["filter_stops"]
    assert summary["goals_reached"] >= 1
    assert summary["max_limit_overshoot_rad"] < 0.05  # well inside the URDF's limits
    assert set(summary["near_limit_fraction"]) == set(JOINT_NAMES)  # every joint, by name
    assert all(0.0 <= v <= 1.0 for v in summary["near_limit_fraction"].values())
    # the operator's take-over: jogged through the filter within the limits in force, handed back
    assert summary["intervention_taken"] and summary["intervention_released_after_s"] is not None, summary["events"]
    assert summary["teleop_peak_speed_ratio"] is not None and summary["teleop_peak_speed_ratio"] <= 1.05
    # one short demo is not the evidence a promotion needs: refused, with what is missing
    assert summary["phase"] == "SIM" and any("min in SIM" in u for u in summary["promotion_unmet"])
    track = json.loads((tmp_path / "track_summary.json").read_text())
    assert (tmp_path / "track_report.png").stat().st_size > 10_000
    assert track["task"] == "track" and track["paths_done"] >= 1 and track["tracking_rms_m_median"] is not None
    assert track["estop_to_rest_s"] is not None and track["estop_to_rest_s"] < 0.3 and track["resumed_after_reset"]
    assert track["max_limit_overshoot_rad"] < 0.05
    assert 0.0 <= track["intervention_rate"] <= 1.0
    assert "path 0:" in out and "path 0 done: RMS" in out
    assert proc.process.returncode == (0 if summary["passed"] and track["passed"] else 1)
