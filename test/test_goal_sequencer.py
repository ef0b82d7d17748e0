"""The goal sequencer judges the arm's 500 Hz joint states at its own rate, by their stamps, and
deserializes only those: the goals are still reached and timed out as before."""
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


def test_the_stamp_is_read_from_the_bytes_in_either_byte_order():
    data = _state(["a"], [0.1], 1_234_567_890_123)
    assert cdr_stamp_ns(data) == 1_234_567_890_123
    big = b"\x00\x00\x00\x00" + struct.pack(">iI", 7, 9) + b"\x00" * 8  # CDR_BE: the header's 2nd byte 0
    assert cdr_stamp_ns(big) == 7_000_000_009
    assert cdr_stamp_ns(b"\x00\x01\x00\x00\x01") is None  # too short for a stamp


@pytest.fixture
def sequencer(ros_context):
    from robot_wm.nodes.goal_sequencer import GoalSequencer

    node = GoalSequencer(context=ros_context)
    judged: list[JointState] = []
    judge = node._on_state
    node._on_state = lambda msg: (judged.append(msg), judge(msg))
    yield node, judged
    node.destroy_node()


@pytest.mark.ros
def test_500_hz_states_are_judged_at_100_hz_by_their_stamps(sequencer):
    node, judged = sequencer
    q = np.zeros(len(node.joint_names))
    t0 = 1_000_000_000_000
    for k in range(500):  # one second of the arm's stream, 2 ms apart
        node._on_raw_state(_state(node.joint_names, q, t0 + k * 2_000_000))
    assert len(judged) == 100
    stamps = [m.header.stamp.sec * 10**9 + m.header.stamp.nanosec for m in judged]
    assert np.all(np.diff(stamps) == 10_000_000)
    node._on_raw_state(_state(node.joint_names, q, t0 - 5_000_000_000))  # a restarted arm's clock: at once
    assert len(judged) == 101
    node._on_raw_state(b"\x00\x01\x00\x00garbage-that-is-no-joint-state")  # unreadable: skipped, nothing raised
    node._on_raw_state(b"\x00")
    assert len(judged) == 101


@pytest.mark.ros
def test_an_unstamped_stream_is_judged_by_arrival(sequencer, monkeypatch):
    from robot_wm.nodes import goal_sequencer

    node, judged = sequencer
    q = np.zeros(len(node.joint_names))
    arrival = [0]
    monkeypatch.setattr(goal_sequencer.time, "monotonic_ns", lambda: arrival[0])
    for k in range(150):  # 0.3 s of a 500 Hz stream, by a clock of the test's
        arrival[0] = 10**12 + k * 2_000_000
        node._on_raw_state(_state(node.joint_names, q, 0))
    assert len(judged) == 30  # 100 Hz


@pytest.mark.ros
def test_a_goal_is_reached_and_the_next_one_timed_out_through_the_raw_path(sequencer):
    node, judged = sequencer
    q = np.array([0.3, -1.2, 1.4, -1.6, -1.5, 0.0])[: len(node.joint_names)]
    node.fixed = np.array([node.kin.tool_position_m(q), [0.3, 0.3, 0.9]])  # the second out of reach
    node.timeout_s, node.settle_s = 0.6, 0.05
    node.index = -1
    node._next_goal()
    t0, k = 2_000_000_000_000, 0
    end = time.monotonic() + 30.0  # (a loaded machine: the loop ends on the time-out it waits for)
    while time.monotonic() < end and node.timed_out == 0:
        node._on_raw_state(_state(node.joint_names, q, t0 + k * 2_000_000))
        k += 1
        time.sleep(0.002)
    assert node.reached == 1 and node.timed_out == 1 and node.index == 2
