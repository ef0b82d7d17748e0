"""Whole-stack evaluation in library mode (``robot-wm eval --stack``): the counting of interventions
and plant violations on hand-built cases, and the stack run on the shipped models."""
from __future__ import annotations

import json
import subprocess
from types import SimpleNamespace

import numpy as np
import pytest

from robot_wm.contracts import N_JOINTS, OBS_LAYOUT
from robot_wm.core.safety import load_safety_limits
from robot_wm.core.task import load_task
from robot_wm.learning.stack_eval import JOINT_TOL_RAD, SPEED_TOL_MPS, PlantCheck, evaluate_stack

from conftest import PYTHON


class Constant:
    """A policy that always proposes the same command."""

    def __init__(self, u, name="constant") -> None:
        self.u, self.name = np.asarray(u, dtype=float), name

    def act(self, obs):
        return self.u.copy()


class IntoTheLimit:
    """Full speed on the elbow toward its upper limit, whatever happens: a hostile policy."""

    name = "into the limit"

    def act(self, obs):
        u = np.zeros(N_JOINTS)
        u[2] = 1.0 if obs[OBS_LAYOUT["q_rad"]][2] < 3.5 else 0.0
        return u


class FakeKinematics:
    """Points where the test wants them: the tool at ``tool``, every link frame at ``link``."""

    def __init__(self, tool, link) -> None:
        self.tool, self.link = np.asarray(tool, float), np.asarray(link, float)

    def tool_position_m(self, q):
        return self.tool

    def frame_pose(self, q, frame):
        return SimpleNamespace(translation=self.link)


def test_plant_check_counts_each_kind_of_breach_beyond_its_tolerance():
    limits = load_safety_limits()
    free = FakeKinematics([-0.4, 0.0, 0.4], [-0.2, 0.0, 0.5])
    check = PlantCheck(free, limits)
    q = np.zeros(N_JOINTS)
    q[1] = limits.upper_rad[1]  # shoulder_lift exactly at its soft limit (0 rad)
    assert check(q, 0.4) == {"joint_limit": False, "tool_speed": False, "workspace": False}
    q_over = q.copy()
    q_over[1] += JOINT_TOL_RAD + 1e-3
    assert check(q_over, 0.4)["joint_limit"]
    q_coast = q.copy()
    q_coast[1] += JOINT_TOL_RAD - 1e-3  # within the drive's coast tolerance: not a breach
    assert not check(q_coast, 0.4)["joint_limit"]
    assert check(q, limits.tool_speed_max_mps + SPEED_TOL_MPS + 0.01)["tool_speed"]
    box = np.asarray(limits.keepout_boxes_m[:6])
    in_box = FakeKinematics((box[:3] + box[3:]) / 2, [-0.2, 0.0, 0.5])
    assert PlantCheck(in_box, limits)(q, 0.1)["workspace"]
    below_table = FakeKinematics([-0.4, 0.0, 0.4], [-0.2, 0.0, -0.01])  # a link point under the table
    assert PlantCheck(below_table, limits)(q, 0.1)["workspace"]


def test_a_policy_the_filter_never_touches_has_no_interventions():
    report = evaluate_stack(Constant(np.zeros(N_JOINTS), "still"), "nominal", episodes=1, seed=0)
    d = report.to_dict()
    assert d["intervention_rate"] == 0.0 and d["violations"] == 0
    assert report.states == {"OK": load_task().episode_steps}


def test_a_jumping_policy_reaches_the_filter_slew_limited_and_passes_unchanged():
    """A policy that jumps from rest to 0.8 rad/s on every joint: the policy slot's slew limit
    (config/control.yaml command_slew_fraction, as the policy node) ramps it within the filter's
    acceleration box, so the filter passes every period of the ramp unchanged."""
    from robot_wm.core.slew import load_slew_fraction
    from robot_wm.learning.stack_eval import build_stack

    built = build_stack(load_task().control_dt_s)
    assert built.slew_delta_radps is not None and load_slew_fraction() > 0
    trace: list = []
    report = evaluate_stack(Constant(np.full(N_JOINTS, 0.3), "jump"), "nominal", episodes=1, seed=0, trace=trace)
    enabled = next(k for k, p in enumerate(trace) if p.enabled_after)
    nominals = np.array([p.nominal_radps for p in trace[enabled + 1:]])
    steps = np.abs(np.diff(nominals, axis=0))
    assert np.all(steps <= built.slew_delta_radps + 1e-12)  # never more than one step per period
    ramp = slice(0, 3)  # 0.3 rad/s in 3-4 steps of 0.095 (0.1425 on the wrists)
    assert np.all(nominals[ramp] < 0.3) and np.all(nominals[6] == 0.3)
    first = {k: v for k, v in report.constraints.items() if k.startswith("acceleration_limit")}
    assert not first, f"the filter cut the ramp: {first}"


def test_interventions_and_violations_are_counted_on_a_hostile_policy():
    """Full speed at the elbow's upper limit: the filter acts (interventions > 0: the braking bound
    near the limit) and the plant stays within its limits."""
    report = evaluate_stack(IntoTheLimit(), "nominal", episodes=1, seed=0)
    d = report.to_dict()
    assert 0.05 < d["intervention_rate"] <= 1.0, d
    assert d["violations"] == 0, d["violations_by_kind"]
    assert report.states["FILTERING"] == report.interventions.sum() - sum(
        v for k, v in report.states.items() if k not in ("OK", "FILTERING"))


def test_eval_stack_json_has_the_policy_and_the_baseline_through_the_filter(tmp_path):
    run = subprocess.run([PYTHON, "-m", "robot_wm.cli", "eval", "--stack", "--episodes", "2", "--seed", "3", "--json",
                          "--no-progress"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout)
    assert out["stack"] is True and out["episodes"] == 2
    for key in ("policy", "baseline"):
        d = out[key]
        for field in ("success_rate", "intervention_rate", "violations", "final_error_m_median",
                      "peak_tool_speed_mps_max"):
            assert field in d, (key, field)
        assert 0.0 <= d["intervention_rate"] <= 1.0 and d["violations"] == 0
    bad = subprocess.run([PYTHON, "-m", "robot_wm.cli", "eval", "--stack", "--models", str(tmp_path / "none"),
                          "--json", "--no-progress"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "not a directory" in bad.stderr


@pytest.mark.parametrize("delay", [-1, 1.5, True])
def test_a_bad_nominal_delay_is_refused(delay):
    with pytest.raises(ValueError, match="nominal_delay_periods"):
        evaluate_stack(Constant(np.zeros(N_JOINTS)), "nominal", episodes=1, nominal_delay_periods=delay)


def test_the_safety_filter_node_commands_what_the_stack_evaluation_commanded(monkeypatch):
    """Parity: the periods of an `eval --stack` episode (joint states, wrenches, nominals and their
    times) replayed through the safety_filter NODE — its message conversions, its stamps, its
    callbacks, on a fake clock — give the same commands, to float precision."""
    import time as time_module

    import rclpy
    from geometry_msgs.msg import WrenchStamped
    from rclpy.context import Context
    from sensor_msgs.msg import JointState
    from std_msgs.msg import Float64MultiArray
    from std_srvs.srv import Trigger

    from robot_wm.contracts import JOINT_NAMES
    from robot_wm.core.tasks import get_task
    from robot_wm.nodes.safety_filter_node import SafetyFilterNode

    trace: list = []
    task = get_task("reach")
    evaluate_stack(task.baseline(), "real_twin", episodes=1, seed=2, task=task, trace=trace)
    assert len(trace) > task.episode_steps and any(p.enabled_after for p in trace)

    clock = {"now": 0.0}
    monkeypatch.setattr(time_module, "monotonic", lambda: clock["now"])
    context = Context()
    # the stack evaluation's filter: the node on the embedded arm (config/control.yaml + graph.plan)
    rclpy.init(context=context, args=["--ros-args", "-p", "default_trust_level:=0", "-p", "default_phase:=0",
                                      "-p", "autostart:=false"])
    node = SafetyFilterNode(context=context)
    sent: list[np.ndarray] = []
    try:
        assert node.trigger_configure() is not None and node.controller is not None
        node._cmd_pub = SimpleNamespace(publish=lambda msg: sent.append(np.array(msg.data)))
        node._status_pub = SimpleNamespace(publish=lambda msg: None)
        delivered = None
        for p in trace:
            message = (p.nominal_stamp_s, tuple(p.nominal_radps))
            if message != delivered:  # the policy's message arrives when it was sent
                clock["now"] = p.nominal_stamp_s
                node._on_nominal(Float64MultiArray(data=[float(x) for x in p.nominal_radps]))
                delivered = message
            clock["now"] = p.t_s
            node._on_joint_state(JointState(name=list(JOINT_NAMES), position=[float(x) for x in p.q_rad],
                                            velocity=[float(x) for x in p.qdot_radps]))
            wrench = WrenchStamped()
            wrench.header.frame_id = "ft_sensor_link"
            wrench.wrench.force.x, wrench.wrench.force.y, wrench.wrench.force.z = (float(x) for x in p.force_sensor_n)
            node._on_wrench(wrench)
            node.control_step()
            if p.enabled_after:
                assert node._on_reset(Trigger.Request(), Trigger.Response()).success
    finally:
        node.destroy_node()
        rclpy.shutdown(context=context)
    commands = np.array([p.command_radps for p in trace])
    assert len(sent) == len(commands)
    np.testing.assert_allclose(np.array(sent), commands, atol=1e-9)
    assert np.abs(commands).max() > 0.1  # the arm did move: the comparison covers filtered commands


def test_a_heavy_tool_tracking_fast_is_no_contact_and_a_push_on_it_still_is():
    """worn_heavy's 2.5 kg tool tracking a path: its inertia alone read as 20+ N of contact and the
    filter stopped the arm on a path that touches nothing. With the payload's acceleration added
    back (``payload_accel_tau_s``, on by default) the contact row stays quiet on the same episodes,
    and a real 60 N push on the moving tool is still met by it (as without the compensation)."""
    import dataclasses
    from pathlib import Path

    from robot_wm import description
    from robot_wm.core.policy_runner import PolicyRunner
    from robot_wm.core.tasks import get_task
    from robot_wm.core.world_model_runner import WorldModelRunner
    from robot_wm.learning.stack_eval import _run_episode, build_stack
    from robot_wm.paths import data_path
    from robot_wm.sim import load_profile

    task, models = get_task("track"), Path(data_path("models", "track"))
    built = build_stack(task.control_dt_s, models)
    assert built.config.payload_accel_tau_s > 0
    names = tuple(built.kinematics.joint_names)
    policy = PolicyRunner(models / "policy.onnx", names, task.control_dt_s, task.action_limit_radps, task="track")
    wm = WorldModelRunner(built.world_model_path, names, task.control_dt_s)
    prof = load_profile("worn_heavy")
    eps = task.episodes(2, 0, description.initial_positions(names))
    off = dataclasses.replace(built, config=dataclasses.replace(built.config, payload_accel_tau_s=0.0))

    def run(stack, i, fault=None):
        return _run_episode(policy, prof, stack, wm, PlantCheck(stack.kinematics, stack.limits), task, eps, i, 1,
                            fault=fault)

    stops = loud = 0
    for i in (0, 1):
        without, with_ = run(off, i), run(built, i)
        quiet = with_["constraints"].get("contact_force", 0)
        assert with_["states"].get("STOPPING", 0) == 0 and quiet <= 2, (i, quiet)  # 2: the row's 14 N onset is near
        loud += without["constraints"].get("contact_force", 0)
        stops += without["states"].get("STOPPING", 0)
    assert loud > 20 and stops > 0  # without: the inertia read as contact, and it stopped the arm
    push = (2.0, {"kind": "push", "force_n": [0.0, 0.0, -60.0], "duration_s": 0.5})
    pushed, pushed_off = run(built, 0, push), run(off, 0, push)
    assert pushed["constraints"].get("contact_force", 0) >= 0.8 * pushed_off["constraints"].get("contact_force", 0) > 20
