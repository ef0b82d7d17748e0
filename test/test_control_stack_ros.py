"""The control path end to end on the embedded arm, in separate processes: the safety filter is
the only publisher of hardware commands; e-stop, reset and the watchdogs measured on the arm."""
from __future__ import annotations

import signal
import subprocess
import threading
import time

import numpy as np
import pytest
from std_msgs.msg import Float64MultiArray
from std_srvs.srv import Trigger

from robot_wm import graph
from robot_wm.process_group import command_for

from conftest import PYTHON, wait_for
from rosclient import ArmClient

pytestmark = pytest.mark.ros
# enable=True: the filter releases its start latch by itself once its inputs are healthy (the start
# latch itself is tested in test_safety_filter_ros.py)
SPECS = {s.name: s for s in graph.plan("mujoco", enable=True, trust=False) if not s.needs_ros_install}


class NominalSource:
    """Publish a (changeable) nominal command on /robot_wm/action_nominal at 100 Hz from a thread,
    and record every hardware command the filter sends.

    Each command is kept with its receive time (``time.monotonic()`` in this process) and its
    publish time (the publisher's ``source_timestamp``, wall clock). On a loaded machine this
    process may handle a service response before older commands still queued for it, so "sent
    after the e-stop" must be judged by the publish time, not by when the test saw it.
    """

    def __init__(self, client: ArmClient) -> None:
        self.pub = client.node.create_publisher(Float64MultiArray, "/robot_wm/action_nominal", 10)
        self.value = [0.0] * 6
        self.commands: list[tuple[float, np.ndarray]] = []
        self.published: list[tuple[float, np.ndarray]] = []
        client.node.create_subscription(Float64MultiArray, "/forward_velocity_controller/commands", self._on_command, 10)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.pub.publish(Float64MultiArray(data=[float(v) for v in self.value]))
            time.sleep(0.01)

    def _on_command(self, msg: Float64MultiArray, info) -> None:
        u = np.array(msg.data)
        self.commands.append((time.monotonic(), u))
        self.published.append((info["source_timestamp"] * 1e-9, u))

    def commands_since(self, t0: float) -> list[tuple[float, np.ndarray]]:
        """Commands received at or after ``t0`` (time.monotonic())."""
        return [c for c in list(self.commands) if c[0] >= t0]

    def published_since(self, t0_wall: float) -> list[tuple[float, np.ndarray]]:
        """Commands published at or after ``t0_wall`` (time.time(), the publisher's clock)."""
        return [c for c in list(self.published) if c[0] >= t0_wall]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=1.0)


@pytest.fixture
def stack(spawn, ros_context):
    """arm_sim + safety_filter (with the shipped world model) as processes; nominal from the test."""
    arm = spawn(command_for(SPECS["arm_sim"]))
    filt = spawn(command_for(SPECS["safety_filter"]))
    client = ArmClient(ros_context, start=False)
    source = NominalSource(client)  # its subscription exists before the client spins
    client.start()
    try:
        assert client.wait_for_state(60.0), arm.output()
        # running and enabled: its status says so (the start latch is released by enable_on_start)
        assert wait_for(lambda: client.statuses and not client.statuses[-1].latches, 60.0), filt.output()
        yield arm, filt, client, source
    finally:
        source.close()
        client.close()


def _moving(client, tol=0.05):
    latest = client.latest()
    return latest is not None and np.abs(latest[2]).max() > tol


def _at_rest(client, tol=0.01):
    latest = client.latest()
    return latest is not None and np.abs(latest[2]).max() < tol


def test_estop_zeroes_the_command_stops_the_arm_and_latches_until_reset(stack):
    _, filt, client, source = stack
    source.value = [0.4, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert wait_for(lambda: _moving(client), 10.0), filt.output()
    t_request = time.time()  # wall clock: compared with the filter's publish times
    resp = client.call(Trigger, "/robot_wm/estop", Trigger.Request())
    t_response = time.time()
    assert resp.success, resp.message
    assert wait_for(lambda: len(source.published_since(t_response)) > 0, 10.0)
    # the service callback itself publishes a zero before it answers (one period = 10 ms), and from
    # then on every command is zero: the all-zero tail of the commands sent since the request must
    # have started before the answer
    during = source.published_since(t_request)
    nonzero = [i for i, (_, u) in enumerate(during) if np.any(u != 0.0)]
    tail_start = nonzero[-1] + 1 if nonzero else 0
    assert tail_start < len(during), f"no zero command after the e-stop: {during[-3:]}"
    t_zero = during[tail_start][0]  # the filter's e-stop zero, by its publish stamp
    assert t_zero <= t_response, f"the zero stream started {t_zero - t_response:.4f} s after the e-stop answered"
    # at rest within 300 ms of the filter's e-stop zero, by the arm's own stamps (waiting on the test's clock is
    # generous). From the zero, not from the request: a loaded machine may take a while to discover the service
    # and deliver the call (the filter's answer came after its zero: checked above); the arm's own stalls added
    assert wait_for(lambda: client.rest_after(t_zero) is not None, 10.0), f"arm not at rest: {client.latest()[2]}"
    rest = client.rest_after(t_zero)
    stall = client.stalls(t_zero, t_zero + rest)
    assert rest < 0.3 + stall, f"at rest {rest:.3f} s after the e-stop zero (the arm's own stalls {stall:.3f} s)"
    # adversarial nominal commands while latched: every command sent after the answer is exactly zero
    source.value = [1.5, -1.5, 1.5, 2.0, -2.0, 2.0]
    t_hostile = time.time()
    # >= 50 periods published after the hostile nominal (judged by the filter's publish stamps)
    assert wait_for(lambda: len(source.published_since(t_hostile)) > 50, 10.0), len(source.published_since(t_hostile))
    after = source.published_since(t_response)
    assert all(np.all(u == 0.0) for _, u in after), [u for _, u in after if np.any(u)][:3]
    assert _at_rest(client)
    # reset is refused while a fault persists (non-finite nominal) and accepted once inputs are healthy
    statuses = client.statuses
    source.value = [float("nan")] * 6
    # the filter has seen it (on a loaded machine that can take longer than a period or two)
    assert wait_for(lambda: statuses and statuses[-1].fault_kind == "nominal"
                    and "u_nominal_radps" in statuses[-1].fault_reason, 10.0), statuses[-1:]
    try:
        resp = client.call(Trigger, "/robot_wm/reset_estop", Trigger.Request())
    except TimeoutError:
        pytest.fail("reset_estop did not answer; filter output:\n" + filt.output()[-3000:])
    assert not resp.success and "fault persists" in resp.message
    source.value = [0.3, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert wait_for(lambda: statuses and statuses[-1].fault_kind == "", 10.0), statuses[-1:]
    resp = client.call(Trigger, "/robot_wm/reset_estop", Trigger.Request())
    assert resp.success, resp.message
    assert wait_for(lambda: _moving(client), 10.0), "arm did not resume after reset"


def test_operator_cli_estop_status_and_reset(stack):
    _, _, client, source = stack
    source.value = [0.0, 0.0, 0.3, 0.0, 0.0, 0.0]
    assert wait_for(lambda: _moving(client), 10.0)
    run = lambda *verb: subprocess.run([PYTHON, "-m", "robot_wm.cli", *verb], capture_output=True, text=True, timeout=60)  # noqa: E731
    out = run("estop")
    assert out.returncode == 0 and out.stdout.startswith("OK"), out.stdout + out.stderr
    assert wait_for(lambda: _at_rest(client), 10.0)
    status = run("status")
    assert status.returncode == 0 and "ESTOP" in status.stdout, status.stdout + status.stderr
    out = run("reset")
    assert out.returncode == 0, out.stdout + out.stderr
    out = run("reset")
    assert out.returncode == 1 and "nothing to reset" in out.stdout


def test_nominal_source_dying_stops_the_arm_within_a_few_periods(stack):
    _, _, client, source = stack
    source.value = [0.5, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert wait_for(lambda: _moving(client, 0.3), 10.0)
    source.close()  # the policy "dies": no more nominal commands
    t_dead = time.time()
    assert wait_for(lambda: client.rest_after(t_dead) is not None, 10.0), f"still moving: {client.latest()[2]}"
    # stale after 5 periods (50 ms), then a controlled stop at 10 rad/s^2 from 0.5 rad/s: ~100 ms (+ the arm's stalls)
    rest = client.rest_after(t_dead)
    stall = client.stalls(t_dead, t_dead + rest)
    assert rest < 0.4 + stall, f"at rest {rest:.3f} s after the nominal stopped (the arm's own stalls {stall:.3f} s)"
    # the filter keeps commanding zero: 50 commands published from 0.3 s after the death on
    assert wait_for(lambda: len(source.published_since(t_dead + 0.3)) >= 50, 10.0)
    assert all(np.all(u == 0.0) for _, u in source.published_since(t_dead + 0.3))


def test_killing_the_filter_stops_the_arm_through_its_own_timeout(stack):
    _, filt, client, source = stack
    source.value = [0.0, 0.4, -0.4, 0.0, 0.0, 0.0]
    assert wait_for(lambda: _moving(client, 0.3), 10.0)
    t_kill = time.time()
    filt.process.send_signal(signal.SIGKILL)  # no goodbye command: only the driver's timeout is left
    assert wait_for(lambda: client.rest_after(t_kill) is not None, 10.0), f"arm still moving: {client.latest()[2]}"
    # 50 ms driver timeout + a controlled deceleration from 0.4 rad/s: ~0.1 s on an idle machine, + the
    # arm's own stalls (ArmClient.stalls). The bound says the driver's timeout stops the arm with no filter
    # at all; without it the arm would keep the last command.
    rest = client.rest_after(t_kill)
    stall = client.stalls(t_kill, t_kill + rest)
    assert rest < 1.0 + stall, f"at rest {rest:.3f} s after the filter died (the arm's own stalls {stall:.3f} s)"


@pytest.mark.parametrize("bad", [[0.1] * 5, [0.1, float("nan"), 0, 0, 0, 0]], ids=["wrong_length", "nan"])
def test_malformed_nominal_stops_the_arm_with_a_clear_status(stack, bad):
    from robot_wm.msg import SafetyStatus

    _, _, client, source = stack
    statuses = client.statuses
    source.value = [0.4, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert wait_for(lambda: _moving(client, 0.3), 10.0)
    t_bad = time.time()
    source.value = bad
    assert wait_for(lambda: client.rest_after(t_bad) is not None, 10.0)
    rest = client.rest_after(t_bad)  # one period to see it, then the controlled stop from 0.4 rad/s (+ the arm's stalls)
    stall = client.stalls(t_bad, t_bad + rest)
    assert rest < 0.5 + stall, f"at rest {rest:.3f} s after the bad nominal (the arm's own stalls {stall:.3f} s)"
    assert wait_for(lambda: statuses and statuses[-1].state == SafetyStatus.FAULT, 10.0)
    assert "u_nominal_radps" in statuses[-1].fault_reason and statuses[-1].fault_kind == "nominal"


@pytest.mark.parametrize("bad", ["unknown_joint", "nan"])
def test_malformed_joint_state_is_a_latched_fault_with_a_controlled_stop(stack, bad):
    """A malformed /joint_states message (an unknown joint name, a NaN) while the arm moves: the
    filter stops the arm by its controlled stop, reports FAULT naming the bad message, and only a
    reset after the joint states are healthy again releases it."""
    from robot_wm.msg import SafetyStatus
    from sensor_msgs.msg import JointState

    _, _, client, source = stack
    statuses = client.statuses
    rogue = client.node.create_publisher(JointState, "/joint_states", 10)
    source.value = [0.4, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert wait_for(lambda: _moving(client, 0.3), 10.0)
    good = client.latest()
    names = list(good[4])
    position = [float(x) for x in good[1]]
    if bad == "unknown_joint":
        names[0] = "gripper_joint"
    else:
        position[2] = float("nan")
    msg = JointState(name=names, position=position, velocity=[0.0] * 6)
    n_before = len(statuses)

    def bad_joint_fault() -> str | None:
        """The reason of the first FAULT naming the rogue message since it was sent, if any. Another
        FAULT first (a stale nominal when a loaded machine stalls the filter) is not the one asked for:
        the rogue stream goes on until this one is seen."""
        return next((s.fault_reason for s in list(statuses)[n_before:] if s.state == SafetyStatus.FAULT
                     and s.fault_kind == "joint_state"), None)

    t_rogue = time.time()
    end = time.monotonic() + 10.0
    while time.monotonic() < end and bad_joint_fault() is None:
        rogue.publish(msg)  # the arm's own 500 Hz stream goes on: the filter must catch one of these
        time.sleep(0.002)
    t_seen = time.time()
    reason = bad_joint_fault()
    assert reason is not None, [(s.state, s.fault_reason) for s in statuses[-3:]]
    assert "bad joint state" in reason and ("gripper_joint" in reason or "non-finite" in reason), reason
    assert wait_for(lambda: client.rest_after(t_rogue) is not None, 10.0), "arm still moving after a malformed joint state"
    # seen while the rogue messages flowed, then the controlled stop from 0.4 rad/s (< 0.5 s)
    assert client.rest_after(t_rogue) < (t_seen - t_rogue) + 1.0
    time.sleep(0.2)
    assert _at_rest(client) and statuses[-1].state != SafetyStatus.OK  # latched, healthy input again
    resp = client.call(Trigger, "/robot_wm/reset_estop", Trigger.Request())
    assert resp.success and "bad joint state" in resp.message, resp.message
    assert wait_for(lambda: _moving(client), 10.0), "arm did not resume after reset"


def _stop_story(client: ArmClient, t_kill: float) -> str:
    """What a slow stop looked like, for the failure message: the filter's states and the arm's
    fastest joint, both by their stamps relative to the kill."""
    rest = client.rest_after(t_kill)
    lines = [f"at rest {rest:.3f} s after the policy died" if rest is not None else "not at rest"]
    last = None
    for m in list(client.statuses):
        t = m.header.stamp.sec + 1e-9 * m.header.stamp.nanosec - t_kill
        if t > -0.1 and (m.state, m.fault_kind) != last:
            lines.append(f"  filter {t:+.3f} s {m.state_text} {m.fault_kind} {m.fault_reason[:80]}")
            last = (m.state, m.fault_kind)
    with client.lock:
        after = [(s[5] - t_kill, float(np.abs(s[2]).max())) for s in client.states if s[5] >= t_kill - 0.1]
    lines += [f"  arm {t:+.3f} s max|qdot| {v:.3f}" for t, v in after[::25]]
    return "\n".join(lines[:120])


def test_killing_the_policy_process_stops_the_arm_within_a_few_periods(spawn, ros_context):
    """The real policy node (ONNX, goals from the goal sequencer) drives the arm through the filter;
    SIGKILL on the policy process: its nominal goes stale and the filter brings the arm to rest."""
    from robot_wm.msg import SafetyStatus

    procs = {name: spawn(command_for(SPECS[name])) for name in ("arm_sim", "safety_filter", "policy", "goal_sequencer")}
    client = ArmClient(ros_context)
    statuses = client.statuses
    try:
        assert client.wait_for_state(60.0), procs["arm_sim"].output()
        assert wait_for(lambda: _moving(client, 0.1), 60.0), procs["policy"].output()[-2000:] + procs["safety_filter"].output()[-2000:]
        t_kill = time.time()
        procs["policy"].process.send_signal(signal.SIGKILL)
        assert wait_for(lambda: client.rest_after(t_kill) is not None, 10.0), f"still moving: {client.latest()[2]}"
        # stale after 5 periods (50 ms), then a controlled stop from at most ~1.5 rad/s at 10-15 rad/s^2 (+ the
        # arm's own stalls)
        rest = client.rest_after(t_kill)
        stall = client.stalls(t_kill, t_kill + rest)
        assert rest < 0.5 + stall, f"(the arm's own stalls {stall:.3f} s)\n" + _stop_story(client, t_kill)
        assert wait_for(lambda: statuses and statuses[-1].state == SafetyStatus.FAULT
                        and statuses[-1].fault_kind == "stale" and "nominal" in statuses[-1].fault_reason, 10.0), \
            statuses[-1:]
        assert client.rest_after(t_kill) is not None  # and it stays at rest
        assert wait_for(lambda: "controlled stop, FAULT (stale): stale input: nominal" in procs["safety_filter"].output(),
                        10.0), procs["safety_filter"].output()[-2000:]
    finally:
        client.close()


def test_the_tracking_policy_follows_the_path_sequencers_reference_through_the_filter(spawn, ros_context):
    """task track end to end: path_sequencer publishes reference windows, the policy node (with the
    task's scripted tracker in the policy's slot, scripted=true, for determinism; the demo test runs
    the shipped learned one) reads them for its own
    time and drives the arm through the filter; the path is scored on the measured tool. Stopping
    the reference stops the policy's commands (the filter's staleness check then stops the arm)."""
    from std_msgs.msg import String

    from robot_wm.msg import SafetyStatus

    specs = {s.name: s for s in graph.plan("mujoco", enable=True, task="track", overrides={"scripted": True}, trust=False)
             if not s.needs_ros_install}
    procs = {name: spawn(command_for(specs[name])) for name in ("arm_sim", "safety_filter", "policy", "path_sequencer")}
    client = ArmClient(ros_context, start=False)
    events: list[str] = []
    nominal: list[tuple[float, float]] = []  # (received, time.time(); published, the policy's source stamp)
    client.node.create_subscription(String, "/path_sequencer/events", lambda m: events.append(m.data), 10)
    client.node.create_subscription(Float64MultiArray, "/robot_wm/action_nominal",
                                    lambda m, info: nominal.append((time.time(), info["source_timestamp"] * 1e-9)), 10)
    client.start()
    try:
        assert client.wait_for_state(60.0), procs["arm_sim"].output()
        assert wait_for(lambda: any(" done: RMS " in e for e in events), 60.0), \
            procs["policy"].output()[-2000:] + procs["path_sequencer"].output()[-2000:]
        done = next(e for e in events if " done: RMS " in e)
        rms_mm = float(done.split(" done: RMS ")[1].split(" mm")[0])
        assert 0.0 < rms_mm < 15.0, done  # the arm followed the path (a still arm is ~50-100 mm off)
        assert done.startswith("path 0 done"), events
        assert wait_for(lambda: any(e.startswith("path 1: ") for e in events), 10.0), events
        # a loaded machine may delay an input past its age limit (stale) or a solve past its time
        # limit (solver): controlled stops that release themselves; nothing else may show up
        load = ("stale", "solver")
        faults = [s.fault_reason for s in client.statuses if s.state == SafetyStatus.FAULT and s.fault_kind not in load]
        assert not faults, faults[:3]
        procs["path_sequencer"].process.send_signal(signal.SIGKILL)
        t_kill = time.time()
        # the last window covers 0.5 s: the policy stops once it no longer covers the preview. Quiet for 1 s here,
        # and the last command judged by its publish stamp (a loaded machine may hand it to this process late)
        assert wait_for(lambda: nominal and nominal[-1][0] < time.time() - 1.0, 10.0)
        last = max(published for _, published in nominal)
        assert last - t_kill < 0.6, f"commanded {last - t_kill:.2f} s after the reference stopped"
        assert wait_for(lambda: client.rest_after(t_kill) is not None, 10.0), f"still moving: {client.latest()[2]}"
    finally:
        client.close()


def test_the_filter_at_the_arms_500hz_uses_the_world_model_and_drives_the_arm(spawn, ros_context):
    """`--filter-rate 500`: the safety filter every 2 ms on the arm's joint states with the 10 ms world
    model (its newest linearization, aged: robot_wm.core.safety.multirate), the nominal at 100 Hz.
    Judged by the status stamps (about five filter periods per nominal), the filter's own word that
    it filters with the model, the arm following the nominal, and an e-stop that still holds it."""
    from robot_wm.msg import SafetyStatus

    specs = {s.name: s for s in graph.plan("mujoco", enable=True, trust=False, filter_rate_hz=500.0)
             if not s.needs_ros_install}
    assert specs["safety_filter"].parameters["control_period_s"] == 0.002
    arm = spawn(command_for(specs["arm_sim"]))
    filt = spawn(command_for(specs["safety_filter"]))
    client = ArmClient(ros_context, start=False)
    source = NominalSource(client)
    client.start()
    try:
        assert client.wait_for_state(60.0), arm.output()
        assert wait_for(lambda: client.statuses and not client.statuses[-1].latches, 60.0), filt.output()
        assert "linearized by" in filt.output() and "using the kinematic model" not in filt.output(), filt.output()
        source.value = [0.3, 0.0, 0.0, 0.0, 0.0, 0.0]
        assert wait_for(lambda: _moving(client, 0.2), 10.0), client.latest()
        n0 = len(client.statuses)

        def rates() -> list[tuple[float, int]]:
            """(filter periods per second of stamps, end index) of every 100th run of 1000 statuses in a row
            received since n0. A run with a dropped status (this client starved) or a stalled filter reads slow:
            the first fast one is the evidence, not the first 1000 a loaded machine happened to deliver."""
            got = client.statuses[n0:]
            stamp = lambda s: s.header.stamp.sec + s.header.stamp.nanosec * 1e-9  # noqa: E731
            return [(999 / (stamp(got[i + 999]) - stamp(got[i])), n0 + i + 1000) for i in range(0, len(got) - 999, 100)]

        assert wait_for(lambda: any(rate > 300.0 for rate, _ in rates()), 60.0, 0.1), \
            f"{max(rates(), default=(0.0, 0))[0]:.0f} filter periods per second of stamps at most"
        end = next(i for rate, i in rates() if rate > 300.0)
        # a loaded machine may delay an input past its age limit or a solve past its time limit;
        # nothing else may stop it, the world model least (every status up to the window's end)
        load = ("stale", "solver")
        faults = [s.fault_reason for s in client.statuses[n0:end] if s.state == SafetyStatus.FAULT and s.fault_kind not in load]
        assert not faults, faults[:3]
        # following the nominal (again, after any stop a loaded machine caused)
        assert wait_for(lambda: abs(client.latest()[2][0] - 0.3) < 0.05, 10.0), client.latest()[2]
        t0 = time.time()
        assert client.call(Trigger, "/robot_wm/estop", Trigger.Request()).success
        assert wait_for(lambda: client.rest_after(t0) is not None, 10.0), client.latest()[2]
        time.sleep(0.5)
        assert _at_rest(client, 0.02), client.latest()[2]
        assert filt.process.poll() is None and arm.process.poll() is None
    finally:
        source.close()
        client.close()
