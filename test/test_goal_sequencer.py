"""The goal sequencer judges the arm's 500 Hz joint states at its own rate, by their stamps, and
deserializes only those: the goals are still reached and timed out as before, one episode each."""
from __future__ import annotations

import struct
import time

import numpy as np
import pytest
from rclpy.serialization import serialize_message
from sensor_msgs.msg import JointState

from robot_wm.nodes.conversions import cdr_stamp_ns


def _state(names, q, stamp_ns: int) -> bytes:
    msg = JointState(name=list(names), position=[float(v) for v in q], velocity=[0.0] * len(q), effort=[0.0] * len(q))
    msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(stamp_ns, 1_000_000_000)
    return serialize_message(msg)


def test_the_stamp_is_read_from_plain_cdr_in_either_byte_order_and_refused_elsewhere():
    data = _state(["a"], [0.1], 1_234_567_890_123)
    assert data[:2] == b"\x00\x01" and cdr_stamp_ns(data) == 1_234_567_890_123  # what rmw_fastrtps writes
    stamp = struct.pack(">iI", 7, 9) + b"\x00" * 8
    assert cdr_stamp_ns(b"\x00\x00\x00\x00" + stamp) == 7_000_000_009  # CDR_BE
    assert cdr_stamp_ns(b"\x00\x06\x00\x00" + stamp) == 7_000_000_009  # CDR2_BE
    assert cdr_stamp_ns(b"\x00\x07\x00\x00" + struct.pack("<iI", 7, 9) + b"\x00" * 8) == 7_000_000_009  # CDR2_LE
    for other in (b"\x00\x03", b"\x00\x09", b"\x00\x0b", b"\x01\x01"):  # PL_CDR_LE, D_CDR2_LE, PL_CDR2_LE, unknown
        assert cdr_stamp_ns(other + b"\x00\x00" + stamp) is None
    assert cdr_stamp_ns(b"\x00\x01\x00\x00\x01") is None  # too short for a stamp


@pytest.fixture
def sequencer(ros_context, monkeypatch):
    """The node, never spun: the test hands it the bytes a raw subscription would, and drives the
    arrival clock of unstamped states."""
    from robot_wm.nodes import goal_sequencer

    arrival = [10**12]
    monkeypatch.setattr(goal_sequencer, "_arrival_ns", lambda: arrival[0])
    node = goal_sequencer.GoalSequencer(context=ros_context)
    judged: list[JointState] = []
    judge = node._on_state
    node._on_state = lambda msg: (judged.append(msg), judge(msg))[1]
    yield node, judged, arrival
    node.destroy_node()


@pytest.mark.ros
def test_500_hz_states_are_judged_at_100_hz_by_their_stamps_jitter_and_all(sequencer):
    node, judged, _ = sequencer
    q = np.zeros(len(node.joint_names))
    t0 = 1_000_000_000_000
    jitter = np.random.default_rng(0).uniform(-100_000, 100_000, 500).astype(int)  # +-0.1 ms
    for k in range(500):  # one second of the arm's stream, 2 ms apart
        node._on_raw_state(_state(node.joint_names, q, t0 + k * 2_000_000 + int(jitter[k])))
    assert len(judged) == 100
    stamps = np.array([m.header.stamp.sec * 10**9 + m.header.stamp.nanosec for m in judged])
    assert np.all(np.abs(np.diff(stamps) - 10_000_000) <= 200_000)
    node._on_raw_state(_state(node.joint_names, q, t0 - 5_000_000_000))  # a restarted arm's clock: at once
    assert len(judged) == 101
    node._on_raw_state(b"\x00\x01\x00\x00garbage-that-is-no-joint-state")  # unreadable: counted, nothing raised
    node._on_raw_state(b"\x00")
    assert len(judged) == 101 and node.rejected >= 1


@pytest.mark.ros
def test_an_unstamped_stream_is_judged_by_arrival(sequencer):
    node, judged, arrival = sequencer
    q = np.zeros(len(node.joint_names))
    for k in range(150):  # 0.3 s of a 500 Hz stream, by the test's clock
        arrival[0] = 10**12 + k * 2_000_000
        node._on_raw_state(_state(node.joint_names, q, 0))
    assert len(judged) == 30  # 100 Hz


@pytest.mark.ros
def test_a_state_without_the_arms_joints_takes_no_slot(sequencer):
    node, judged, _ = sequencer
    q = np.zeros(len(node.joint_names))
    t0 = 3_000_000_000_000
    node._on_raw_state(_state(["gripper_finger"], [0.01], t0))  # another publisher on /joint_states
    node._on_raw_state(_state(node.joint_names, q, t0 + 2_000_000))  # the arm's, 2 ms later: judged
    assert len(judged) == 2 and node.rejected == 1
    assert judged[-1].name == list(node.joint_names)


def _feed_until(node, q, done, stamp0: int, limit_s: float = 30.0) -> None:
    """The arm's 500 Hz stream at ``q`` until ``done()`` (wall-clock bounded: a loaded machine waits)."""
    end, k = time.monotonic() + limit_s, 0
    while time.monotonic() < end and not done():
        node._on_raw_state(_state(node.joint_names, q, stamp0 + k * 2_000_000))
        k += 1
        time.sleep(0.002)


@pytest.mark.ros
def test_a_goal_is_reached_once_and_the_next_timed_out_through_the_raw_path(sequencer):
    node, _, _ = sequencer
    episodes: list = []
    node._episode = lambda success, error_m, duration_s: episodes.append((success, error_m))
    q = np.array([0.3, -1.2, 1.4, -1.6, -1.5, 0.0])[: len(node.joint_names)]
    node.fixed = np.array([node.kin.tool_position_m(q), [0.3, 0.3, 0.9]])  # the second out of reach
    node.timeout_s, node.settle_s = 30.0, 0.05
    node.index = -1
    node._next_goal()
    _feed_until(node, q, lambda: node.index == 1, 2_000_000_000_000)  # reached, settled, next goal
    assert node.reached == 1 and node.timed_out == 0 and episodes[0][0] is True
    node.timeout_s = 0.3
    _feed_until(node, q, lambda: node.timed_out == 1, 2_100_000_000_000)
    assert node.reached == 1 and node.index == 2 and [e[0] for e in episodes] == [True, False]
    assert episodes[1][1] > 0.1  # the distance at the end, measured


@pytest.mark.ros
def test_a_hold_that_ends_after_the_time_out_is_one_success_not_two_episodes(sequencer):
    node, _, _ = sequencer
    episodes: list = []
    node._episode = lambda success, error_m, duration_s: episodes.append(success)
    q = np.array([0.3, -1.2, 1.4, -1.6, -1.5, 0.0])[: len(node.joint_names)]
    node.fixed = np.array([node.kin.tool_position_m(q)])
    node.index = -1
    node._next_goal()
    node._inside_since = time.monotonic() - 10.0  # inside for long enough...
    node._goal_since = time.monotonic() - 10.0  # ... and past the time-out when the state is judged
    node.timeout_s = 1.0
    node._on_raw_state(_state(node.joint_names, q, 4_000_000_000_000))
    assert episodes == [True] and node.reached == 1 and node.timed_out == 0


@pytest.mark.ros
def test_the_time_out_fires_without_any_state(sequencer):
    node, judged, _ = sequencer
    events: list[str] = []
    node._event = events.append
    node._goal_since = time.monotonic() - 10.0
    node.timeout_s = 1.0
    node._publish()  # the goal's publish timer
    assert not judged and node.timed_out == 1
    assert any("timed out after 1.0 s (no usable joint state)" in e for e in events)
