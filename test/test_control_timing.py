"""The control period's timing: steps that follow the arm's joint states, and real-time scheduling.

``step_on_state`` (robot_wm.nodes.control_node): while joint states arrive, each control step is
started by one of them, once per period; when they stop, the timer still runs the step (a silent
arm must be noticed). ``realtime_priority`` (robot_wm.realtime): SCHED_FIFO for every thread of
the process where the OS allows it, a clear refusal where it does not. Judged by what started
each step and by counts, never by a timing threshold.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.parameter import Parameter
from sensor_msgs.msg import JointState

from conftest import wait_for
from robot_wm import description
from robot_wm.nodes.control_node import ControlNode
from robot_wm.realtime import apply_realtime

JOINTS = list(description.joint_limits(description.expand()).names)


class Recording(ControlNode):
    """A control node that notes, for every step, what started it and the stamp of the state it had."""

    def __init__(self, context, step_on_state: bool, period_s: float = 0.02) -> None:
        self.steps: list[tuple[str, int]] = []
        self._source = "timer"
        super().__init__("timing_probe", context=context, parameter_overrides=[
            Parameter("step_on_state", value=step_on_state), Parameter("control_period_s", value=period_s),
            Parameter("joint_names", value=JOINTS)])

    def _joint_state_arrived(self, msg):
        self._source = "state"
        try:
            super()._joint_state_arrived(msg)
        finally:
            self._source = "timer"

    def control_step(self) -> None:
        self.steps.append((self._source, self.state_stamp_ns))


@contextlib.contextmanager
def _arm(context, node: Recording, name: str = "timing_arm"):
    """Spin ``node`` on a thread of its own, active; yield (publisher node, /joint_states publisher).
    Everything is stopped and destroyed on the way out, also on failure."""
    pub_node = Node(name, context=context)
    pub = pub_node.create_publisher(JointState, "/joint_states", 10)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            executor.spin_once(timeout_sec=0.002)

    thread = threading.Thread(target=spin, daemon=True)
    thread.start()
    try:
        assert wait_for(lambda: node._control_timer is not None, 10.0), "the probe never became active"
        yield pub_node, pub
    finally:
        stop.set()
        thread.join(timeout=2.0)
        executor.remove_node(node)
        node.destroy_node()
        pub_node.destroy_node()


def _run(context, node: Recording, publish_s: float, silent_s: float, rate_hz: float = 250.0) -> int:
    """Publish joint states at ``rate_hz`` for ``publish_s``, then none for ``silent_s``; return how many were sent.

    On a schedule: a wake-up this (loaded) machine delays publishes the states it owes at once, so that
    ``rate_hz`` states a second are sent however slowly this thread runs (a test compares the steps with
    how many states there were: at a tenth of the rate, one step per state would be right)."""
    with _arm(context, node) as (pub_node, pub):
        sent, start = 0, time.monotonic()
        while time.monotonic() < start + publish_s:
            while sent < min(time.monotonic() - start, publish_s) * rate_hz:
                msg = JointState(name=JOINTS, position=[0.0] * 6, velocity=[0.0] * 6)
                msg.header.stamp = pub_node.get_clock().now().to_msg()
                pub.publish(msg)
                sent += 1
            time.sleep(1.0 / rate_hz)
        time.sleep(silent_s)
        return sent


def test_steps_follow_the_joint_states_and_the_timer_takes_over_when_they_stop(ros_context):
    node = Recording(ros_context, step_on_state=True)
    sent = _run(ros_context, node, publish_s=2.0, silent_s=1.0)
    by_state = [s for s in node.steps if s[0] == "state"]
    by_timer = [s for s in node.steps if s[0] == "timer"]
    assert sent > 100 and by_state, node.steps[:5]
    # one step per period, not one per state (250 Hz states, 50 Hz periods)
    assert len(by_state) < 0.5 * sent, (len(by_state), sent)
    # a state-started step used the state that started it: no two of them on the same state
    stamps = [s[1] for s in by_state]
    assert len(set(stamps)) == len(stamps)
    # while states flowed the states started the steps (the timer only where one came late)
    last_state_step = max(i for i, s in enumerate(node.steps) if s[0] == "state")
    timer_while_flowing = sum(s[0] == "timer" for s in node.steps[:last_state_step])
    assert timer_while_flowing < 0.2 * len(by_state), (timer_while_flowing, len(by_state))
    # after the last state the timer keeps the period going (the filter then sees the state go stale)
    assert len(node.steps) - 1 - last_state_step >= 10, "no timer steps after the states stopped"
    assert len(by_timer) >= 10


def test_a_state_delivered_early_after_a_late_one_still_starts_its_period(ros_context):
    """States one period apart on the arm's clock, delivered with jitter (alternately 0.75 and 1.15
    periods apart, as a loaded machine delivers them): every state starts its own step. On this
    process's clock alone each early one was skipped (less than a period after the late one)."""
    node = Recording(ros_context, step_on_state=True, period_s=0.02)
    with _arm(ros_context, node, "timing_arm_jitter") as (pub_node, pub):
        t0 = pub_node.get_clock().now().nanoseconds
        stamps = []
        for k in range(60):
            msg = JointState(name=JOINTS, position=[0.0] * 6, velocity=[0.0] * 6)
            stamp = t0 + k * 20_000_000
            msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(stamp, 1_000_000_000)
            pub.publish(msg)
            stamps.append(stamp)
            time.sleep(0.015 if k % 2 else 0.023)  # the late one before the timer's 1.25 periods
        assert wait_for(lambda: any(s[1] == stamps[-1] for s in node.steps), 5.0)
    by_state = [s[1] for s in node.steps if s[0] == "state"]
    started = set(by_state) & set(stamps)
    assert len(started) >= 50, f"{len(started)} of 60 states started a step"  # the old rule: about half
    assert len(by_state) == len(set(by_state))


@pytest.mark.parametrize("seed", range(5))
def test_late_and_early_states_never_start_more_than_one_step_per_period_of_the_arms_clock(ros_context, seed):
    """500 Hz states one period of 2 ms apart on the arm's clock, delivered 0-5 ms late at random
    (in arrival order), to a 100 Hz step_on_state node: the steps, started by either clock, keep to
    the period: at most one per period (less the slack) of the arm's clock, and no period missed."""
    node = Recording(ros_context, step_on_state=True, period_s=0.01)
    try:
        rng = np.random.default_rng(seed)
        stamps = 1_000_000_000_000 + 2_000_000 * np.arange(1000)  # 2 s of the arm's clock
        arrivals = np.arange(1000) * 0.002 + rng.uniform(0.0, 0.005, 1000)
        node._control_timer = object()  # active (the test drives the rule, no timer runs)
        for i in np.argsort(arrivals, kind="stable"):
            if node._starts_step(float(arrivals[i]), int(stamps[i])):
                node._run_step(float(arrivals[i]), int(stamps[i]))
        steps = len(node.steps)
        assert 190 <= steps <= 2.0 / (0.01 - 0.001) + 1, steps
    finally:
        node._control_timer = None
        node.destroy_node()


def test_without_step_on_state_the_timer_runs_every_step(ros_context):
    node = Recording(ros_context, step_on_state=False)
    _run(ros_context, node, publish_s=1.0, silent_s=0.2)
    assert node.steps and all(s[0] == "timer" for s in node.steps)


def test_realtime_priority_zero_and_bad_values_change_nothing():
    assert apply_realtime(0) == (False, "real-time scheduling off (realtime_priority 0)")
    for bad in (-1, 99, 2.5, True):
        applied, text = apply_realtime(bad)
        assert not applied and "expected an integer in [0, 98]" in text
    assert os.sched_getscheduler(0) == os.SCHED_OTHER


CHILD = """
import os, threading, time
from robot_wm.realtime import apply_realtime
t = threading.Thread(target=time.sleep, args=(2,), daemon=True); t.start()
ok, text = apply_realtime(30)
policies = {int(tid): os.sched_getscheduler(int(tid)) for tid in os.listdir('/proc/self/task')}
print(ok, text, sorted(set(policies.values())) == [os.SCHED_FIFO], len(policies))
"""


@pytest.mark.skipif(not hasattr(os, "sched_setscheduler"), reason="no SCHED_FIFO on this OS")
def test_realtime_priority_moves_every_thread_or_says_why_not():
    """In a child process (this one must stay on the normal scheduler): with the right to raise
    priorities every thread goes to SCHED_FIFO; without it (here: the unprivileged user nobody) the
    process keeps the normal scheduler and the text says how to grant it."""
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    privileged = os.geteuid() == 0
    if privileged:
        ok, rest = out.stdout.split(" ", 1)
        assert ok == "True" and "SCHED_FIFO priority 30" in rest and rest.split()[-2] == "True", out.stdout
    setpriv = shutil.which("setpriv")
    if not (privileged and setpriv):
        pytest.skip("dropping the privilege needs root and setpriv")
    env = dict(os.environ)
    out = subprocess.run([setpriv, "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--inh-caps=-all",
                          sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("False realtime_priority 30: not permitted") and "rtprio limit" in out.stdout, out.stdout
