"""`robot-wm demo` end to end: the arm in its own process, scripted commands over ROS 2, summary."""
from __future__ import annotations

import json

import numpy as np
import pytest

from robot_wm.demo import summarize
from robot_wm.nodes.scripted_commander import Recording, Segment

from conftest import PYTHON, wait_for

pytestmark = pytest.mark.ros


def test_demo_runs_and_reports_what_the_arm_did(spawn, tmp_path):
    proc = spawn([PYTHON, "-m", "robot_wm.cli", "demo", "--out", str(tmp_path)])
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
