"""Common base of the control-path lifecycle nodes (policy, world_model, safety_filter).

What they share: ``autostart`` (configure + activate at start-up, so no lifecycle manager is
needed), the latest joint state in the configured joint order with its receive time (a malformed
message sets ``state_error`` until the next good one, is counted, and makes ``fresh_state`` None), and a control timer that activate starts and deactivate stops.

With ``step_on_state`` the period follows the arm's own stream instead of a free-running timer:
the control step runs as soon as a joint state arrives once a period (less a little slack for
the stream's jitter) has passed since the last step — on this process's clock, or on the arm's
(the states' stamps, so that delivery jitter does not skip a period) — so the state it uses is as fresh as its
delivery (a timer's phase against the arm's stream adds up to a joint-state interval, and a period
of waiting when the two drift). The timer stays: when states stop arriving it runs the step
after 1.25 periods, so a silent arm is still noticed (stale input: the filter stops it).
"""
from __future__ import annotations

import math
import time

import numpy as np
from rclpy.context import Context
from rclpy.lifecycle import Node as LifecycleNode
from rclpy.lifecycle import State, TransitionCallbackReturn
from rclpy.qos import QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import JointState

from robot_wm.nodes.conversions import InputError, joint_state_arrays
from robot_wm.nodes.params import declare
from robot_wm.realtime import PRIORITY_RANGE

_MAX_STAMP_LAG_S = 1.0  # lag beyond this is counted as this much (it is stale either way)
_OFFSET_BLOCK = 500  # messages per block of the running minimum of receipt - stamp (1 s at 500 Hz)
_STEP_SLACK_S = 0.001  # step_on_state: a state this much (at most 20 % of a period) early still starts the period


#: QoS of the control inputs: reliable, keep only the newest message.
LATEST_ONLY = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE)


class ControlNode(LifecycleNode):
    """A lifecycle node with autostart, the latest joint state and a control timer.

    Subclasses define ``control_step()``, called every ``control_period_s`` while active.
    """

    #: False for a node that reads /joint_states its own way (every message, not only the latest):
    #: then ``state`` / ``fresh_state`` stay empty and the messages are not parsed twice
    SUBSCRIBES_JOINT_STATES = True
    #: False for a node without a control period (activate starts no timer; control_step is never called)
    CONTROL_TIMER = True

    def __init__(self, node_name: str, context: Context | None = None, **node_options) -> None:
        super().__init__(node_name, context=context, **node_options)
        self.period_s = declare(self, "control_period_s", 0.01, "control period (s), 1 ms to 100 ms", range_=(0.001, 0.1), read_only=True)
        self.stale_s = declare(self, "stale_after_s", 0.05, "inputs older than this (s) are stale", range_=(0.001, 1.0), read_only=True)
        self.joint_names = list(declare(self, "joint_names", [""], "joint order of commands and states", read_only=True))
        self.joint_states_topic = declare(self, "joint_states_topic", "/joint_states", "sensor_msgs/JointState input", read_only=True)
        self.autostart = declare(self, "autostart", True, "configure and activate on start-up", read_only=True)
        self.step_on_state = declare(
            self, "step_on_state", False, "run the control step when a joint state arrives once a period has "
            "passed (latency: delivery + compute), a timer only when states stop; false: on a free-running timer",
            read_only=True)
        self._last_step_s = -math.inf
        self._last_step_stamp_ns = 0  # stamp of the state that started the last step (0: the timer did)
        self.realtime_priority = declare(
            self, "realtime_priority", 0, "SCHED_FIFO priority of this node's process, 1..98 (0: the normal "
            "scheduler; needs CAP_SYS_NICE or an rtprio limit, robot_wm.realtime)", range_=PRIORITY_RANGE, read_only=True)
        # last GOOD (time it was measured on time.monotonic(), q_rad, qdot_radps)
        self.state: tuple[float, np.ndarray, np.ndarray] | None = None
        self.state_error: str | None = None
        self.state_stamp_ns = 0  # header stamp of the latest good joint state (0: none yet / unstamped)
        self.state_received_ns = 0  # wall-clock time it was received (time.time_ns())
        self._offset_block_min, self._offset_prev_min, self._offset_count = math.inf, math.inf, 0
        self.state_errors = 0
        self._control_timer = None
        # depth 1: a node that falls behind skips straight to the newest state instead of working
        # through a queue of old ones (a loaded 2-core machine otherwise controls on 100 ms old states)
        if self.SUBSCRIBES_JOINT_STATES:
            self.create_subscription(JointState, self.joint_states_topic, self._joint_state_arrived, LATEST_ONLY)
        if self.autostart:
            self._autostart_timer = self.create_timer(0.0, self._autostart)

    def _autostart(self) -> None:
        self._autostart_timer.cancel()
        if self.trigger_configure() == TransitionCallbackReturn.SUCCESS:
            self.trigger_activate()

    def _joint_state_arrived(self, msg: JointState) -> None:
        self._on_joint_state(msg)
        if self.step_on_state and self._control_timer is not None:
            now = time.monotonic()
            stamp_ns = self.state_stamp_ns if self.state_error is None else 0
            if self._starts_step(now, stamp_ns):
                self._run_step(now, stamp_ns)

    def _starts_step(self, now: float, stamp_ns: int) -> bool:
        """Whether a state arriving now (stamped ``stamp_ns``, 0: none usable) starts a period.

        Yes once a period (less the slack) has passed on this clock, or once the arm's own clock
        has moved a period (less the slack) on from the state the last step used: a state delivered
        early after one delivered late still starts its period (else the period after it is
        skipped, and the interval between two commands doubles), while more than half a period
        passed here (a stream whose stamps race cannot run the step at its own rate).
        """
        slack = min(0.2 * self.period_s, _STEP_SLACK_S)
        since = now - self._last_step_s
        if since >= self.period_s - slack:
            return True
        ahead_s = (stamp_ns - self._last_step_stamp_ns) * 1e-9
        return bool(stamp_ns and self._last_step_stamp_ns and since >= 0.5 * self.period_s
                    and self.period_s - slack <= ahead_s <= 2.0 * self.period_s)

    def _on_control_timer(self) -> None:
        now = time.monotonic()
        if not self.step_on_state or now - self._last_step_s >= 1.25 * self.period_s:
            self._run_step(now, 0)

    def _run_step(self, now: float, stamp_ns: int) -> None:
        # the arm's clock the next state must move on from: the state's stamp, but at least a period
        # (less the slack) on from the last one, so that steps the receiver's clock started on late
        # states cannot add up with the stamp rule to more than one step per period of the arm's clock
        # (an arm whose clock went back, e.g. restarted, starts the reference over)
        ref, period_ns = self._last_step_stamp_ns, int(self.period_s * 1e9)
        slack_ns = int(min(0.2 * self.period_s, _STEP_SLACK_S) * 1e9)
        keep = stamp_ns and ref and stamp_ns > ref - 2 * period_ns
        self._last_step_stamp_ns = max(stamp_ns, ref + period_ns - slack_ns) if keep else stamp_ns
        self._last_step_s = now
        self.control_step()

    def _on_joint_state(self, msg: JointState) -> None:
        try:
            q, qdot = joint_state_arrays(msg, self.joint_names if self.joint_names != [""] else list(msg.name))
        except Exception as exc:  # noqa: BLE001 (InputError, or a message no conversion expected: flag it, never raise)
            # keep the last good state, flag the error: the filter latches a FAULT naming it
            self.state_error = str(exc) if isinstance(exc, InputError) else f"unreadable message: {type(exc).__name__}: {exc}"
            self.state_errors += 1
            self.get_logger().error(f"bad joint state: {exc}", throttle_duration_sec=1.0)
            return
        self.state_error = None
        self.state = (time.monotonic() - self._stamp_lag_s(msg), q, qdot)
        self.state_stamp_ns = msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec
        self.state_received_ns = time.time_ns()

    def _stamp_lag_s(self, msg: JointState) -> float:
        """How much older than its fastest delivery this message is (s; 0 for unstamped ones).

        The receipt-minus-stamp offset is compared with its minimum over the last
        2 x ``_OFFSET_BLOCK`` messages: a constant offset (another host's clock, sim time) cancels,
        what remains is queueing in DDS or in this executor, which counts against freshness.
        """
        stamp_ns = msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec
        if not stamp_ns:
            return 0.0
        offset = (self.get_clock().now().nanoseconds - stamp_ns) * 1e-9
        self._offset_block_min = min(self._offset_block_min, offset)
        self._offset_count += 1
        if self._offset_count >= _OFFSET_BLOCK:
            self._offset_prev_min, self._offset_block_min, self._offset_count = self._offset_block_min, math.inf, 0
        lag = offset - min(self._offset_prev_min, self._offset_block_min)
        return min(max(lag, 0.0), _MAX_STAMP_LAG_S)

    def fresh_state(self, now_s: float | None = None) -> tuple[np.ndarray, np.ndarray] | None:
        """The latest (q_rad, qdot_radps) if it is fresh and the latest message was usable, else None."""
        if self.state is None or self.state_error is not None:
            return None
        received_s, q, qdot = self.state
        return (q, qdot) if (now_s or time.monotonic()) - received_s <= self.stale_s else None

    def on_activate(self, state: State) -> TransitionCallbackReturn:
        self._last_step_s, self._last_step_stamp_ns = -math.inf, 0
        if self.CONTROL_TIMER:
            self._control_timer = self.create_timer(self.period_s, self._on_control_timer)
        return super().on_activate(state)

    def on_deactivate(self, state: State) -> TransitionCallbackReturn:
        if self._control_timer is not None:
            self.destroy_timer(self._control_timer)
            self._control_timer = None
        return super().on_deactivate(state)
