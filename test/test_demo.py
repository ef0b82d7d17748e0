"""`robot-wm demo` end to end: the arm in its own process, scripted commands over ROS 2, summary."""
from __future__ import annotations

import json

import numpy as np
import pytest

from robot_wm.demo import summarize
from robot_wm.nodes.scripted_commander import Recording, Segment

from conftest import PYTHON, wait_for

pytestmark = pytest.mark.ros


def test_scripted_demo_runs_and_reports_what_the_arm_did(spawn, tmp_path):
    proc = spawn([PYTHON, "-m", "robot_wm.cli", "demo", "--scripted", "--out", str(tmp_path)])
    assert wait_for(lambda: proc.process.poll() is not None, 90.0, 0.1), proc.output()
    out = proc.output()
    assert proc.process.returncode == 0, out
    assert "PASS" in out and "Traceback" not in out
    summary = json.loads((tmp_path / "demo_summary.json").read_text())
    assert summary["passed"] and summary["profile"] == "nominal"
    assert summary["joint_states_received"] > 1000
    assert summary["worst_tracking_error_radps"] < 0.05
    assert 0.0 < summary["stop_after_timeout_s"] < 0.5


def _recording(v_of_t, t_end=3.0, dt=0.002):
    rec = Recording()
    for t in np.arange(0.0, t_end, dt):
        rec.t_s.append(float(t))
        rec.q_rad.append(np.zeros(6))
        rec.v_radps.append(np.asarray(v_of_t(t), dtype=float))
    return rec


def test_summary_fails_when_the_arm_does_not_follow():
    script = [Segment("move", 1.0, (0.5, 0, 0, 0, 0, 0)), Segment("silence", 1.0, None)]
    still = summarize(_recording(lambda t: np.zeros(6)), script, 0.0, "nominal")
    assert not still.passed and still.tracking_error_radps["move"] == pytest.approx(0.5)
    never_stops = summarize(_recording(lambda t: [0.5, 0, 0, 0, 0, 0]), script, 0.0, "nominal")
    assert not never_stops.passed and never_stops.stop_after_timeout_s is None
    good = summarize(_recording(lambda t: [0.5 if t < 1.1 else 0.0, 0, 0, 0, 0, 0]), script, 0.0, "nominal")
    assert good.passed and good.stop_after_timeout_s == pytest.approx(0.1, abs=0.01)


def test_stack_demo_runs_the_whole_stack_and_writes_its_report(spawn, tmp_path):
    """`make demo`'s job, shortened: goals through policy + world model + safety filter, a push,
    an e-stop and a reset, measured on the arm; the PNG report and the JSON summary are written."""
    proc = spawn([PYTHON, "-m", "robot_wm.cli", "demo", "--duration", "16", "--out", str(tmp_path)])
    assert wait_for(lambda: proc.process.poll() is not None, 180.0, 0.2), proc.output()
    out = proc.output()
    assert "Traceback" not in out, out
    summary = json.loads((tmp_path / "stack_demo_summary.json").read_text())
    assert (tmp_path / "stack_demo_report.png").stat().st_size > 10_000
    assert summary["estop_to_rest_s"] is not None and summary["estop_to_rest_s"] < 0.3
    assert summary["resumed_after_reset"]
    assert summary["filter_states"].get("ESTOP", 0) > 100  # latched for the 3 s until the reset
    assert summary["goals_reached"] >= 1
    assert summary["max_limit_overshoot_rad"] < 0.05  # well inside the URDF's limits
    assert proc.process.returncode == (0 if summary["passed"] else 1)
