"""adaptation: the online learner of the world model, in its own process (torch), below the control path.

It records what the world_model node pairs — each command the safety filter sends, with the newest
joint state at the moment it was sent (the command's DDS source time against the states' stamps, so
that a learner running late at its lower priority still pairs them as they happened) — into the bounded buffer of ``robot_wm.learning.online.OnlineLearner``; once a second it
asks whether an attempt is due (enough new data; sooner when the trust monitor's normalized
prediction error rises past half its threshold) and runs it in a worker thread: a candidate
fine-tuned from the active world model, the validation gate, and, when it passes, a new model set in
the registry, activated and announced on ``/robot_wm/model_update`` (rejections are announced too,
``accepted: false``). Every attempt goes to a JSON-lines log.

It never sits on the control path: the world_model node and the safety filter load an announced
model themselves, off their control threads (``robot_wm.nodes.model_swap``). The process lowers its
own priority (``nice``), trains on ``threads`` torch threads and sleeps between batches to stay within
``cpu_fraction`` of a core; killing it leaves the stack running on the active model.
"""
from __future__ import annotations

import collections
import os
import threading
from pathlib import Path

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.context import Context
from rclpy.lifecycle import State, TransitionCallbackReturn
from rclpy.qos import QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray

from robot_wm.contracts import N_JOINTS
from robot_wm.msg import ModelUpdate, TrustState
from robot_wm.nodes.control_node import ControlNode
from robot_wm.nodes.conversions import InputError, joint_state_arrays, vector
from robot_wm.nodes.model_swap import UPDATE_QOS, UPDATE_TOPIC
from robot_wm.nodes.params import declare
from robot_wm.nodes.runner import main_for

_CHECK_PERIOD_S = 1.0  # how often an attempt is considered
_STATE_HISTORY = 250  # joint states kept to pair commands with (0.5 s at 500 Hz)
_PAIR_WITHIN_NS = 50_000_000  # a command pairs with a state at most this old when it was sent


class AdaptationNode(ControlNode):
    """The online learner (see the module docstring)."""

    CONTROL_TIMER = False  # no control period: it records on commands and checks once a second
    SUBSCRIBES_JOINT_STATES = False  # every state is kept a moment (queued, not only the latest): see _on_state

    def __init__(self, context: Context | None = None, node_name: str = "adaptation") -> None:
        super().__init__(node_name, context=context)
        from robot_wm.learning.online import LearnerConfig

        if self.realtime_priority:  # at SCHED_FIFO its training would run level with the control threads
            self.get_logger().warning(f"realtime_priority {self.realtime_priority} ignored: the learner never runs "
                                      "real-time (it must not take the control path's CPU; it runs at nice)")
            self.realtime_priority = 0

        d = LearnerConfig()
        self.task = declare(self, "task", "reach", "the task whose active model set is adapted (reach, track)",
                            read_only=True)
        self.nice = declare(self, "nice", 10, "how much this process lowers its own CPU priority (0..19)",
                            range_=(0, 19), read_only=True)
        self.log_path = declare(self, "log_path", "", "JSON-lines log of the attempts (empty: "
                                "$ROBOT_WM_STATE_DIR/online/<task>.jsonl)", read_only=True)
        command_topic = declare(self, "command_topic", "/forward_velocity_controller/commands",
                                "the command sent to the hardware", read_only=True)
        values = {}
        for name, value in vars(d).items():
            if name in ("coverage_band", "seed"):
                continue
            values[name] = declare(self, f"online.{name}", value, f"robot_wm.learning.online.LearnerConfig.{name}",
                                   read_only=True)
        band = declare(self, "online.coverage_band", list(d.coverage_band), "held-out coverage of the candidate's "
                       "90 % intervals must lie in [low, high]", read_only=True)
        try:
            self.config = LearnerConfig(**values, coverage_band=tuple(band))
        except (TypeError, ValueError) as exc:
            from robot_wm.nodes.runner import NodeConfigError

            raise NodeConfigError(f"{node_name}: {exc}") from exc
        self.learner = None
        self._urgent = False
        self._worker: threading.Thread | None = None
        self._update_pub = None
        self._check_timer = None
        queued = QoSProfile(depth=200, reliability=ReliabilityPolicy.RELIABLE)  # a late learner loses nothing
        self._states: collections.deque = collections.deque(maxlen=_STATE_HISTORY)  # (stamp_ns, q, qdot)
        self._commands: collections.deque = collections.deque(maxlen=_STATE_HISTORY)  # (sent_ns, command) to pair
        self.create_subscription(JointState, self.joint_states_topic, self._on_state, queued)
        self.create_subscription(Float64MultiArray, command_topic, self._on_command, queued)
        self.create_subscription(TrustState, "/robot_wm/trust", self._on_trust, 10)

    def on_configure(self, state: State) -> TransitionCallbackReturn:
        from robot_wm import description
        from robot_wm.core.kinematics import Kinematics
        from robot_wm.core.task import load_task
        from robot_wm.learning.online import OnlineLearner
        from robot_wm.paths import state_dir
        from robot_wm.registry import Registry

        try:
            if self.nice:
                os.nice(self.nice)
            urdf = description.expand()
            if self.joint_names == [""]:
                self.joint_names = list(description.joint_limits(urdf).names)
            kin = Kinematics(urdf, self.joint_names)
            registry = Registry()
            registry.ensure_shipped()
            if registry.active(self.task) is None:
                raise ValueError(f"the registry has no active {self.task} set to adapt (robot-wm models list)")
            log = Path(self.log_path) if self.log_path else state_dir() / "online" / f"{self.task}.jsonl"
            self.learner = OnlineLearner(self.task, self.config, registry, kin, load_task().control_dt_s, log_path=log)
        except (OSError, ValueError) as exc:
            self.get_logger().error(f"configure failed: {exc}")
            return TransitionCallbackReturn.FAILURE
        self._update_pub = self.create_publisher(ModelUpdate, UPDATE_TOPIC, UPDATE_QOS)
        self._diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self.get_logger().info(
            f"online learner for {self.task}: {self.config.buffer_s:g} s buffer "
            f"({self.learner.buffer.memory_bytes / 2**20:.1f} MiB), an attempt every >= {self.config.min_new_s:g} s "
            f"of new data, <= {self.config.cpu_fraction:.0%} of a core at nice {self.nice}; log {log}")
        return TransitionCallbackReturn.SUCCESS

    def on_activate(self, state: State) -> TransitionCallbackReturn:
        self._check_timer = self.create_timer(_CHECK_PERIOD_S, self._check)
        return super().on_activate(state)

    def on_deactivate(self, state: State) -> TransitionCallbackReturn:
        if self._check_timer is not None:
            self.destroy_timer(self._check_timer)
            self._check_timer = None
        return super().on_deactivate(state)

    def control_step(self) -> None:  # (no control timer: CONTROL_TIMER is False)
        pass

    # ---- inputs
    def _on_state(self, msg: JointState) -> None:
        try:
            q, qdot = joint_state_arrays(msg, self.joint_names if self.joint_names != [""] else list(msg.name))
        except Exception:  # noqa: BLE001 (a malformed state: the filter latches on it; the learner skips it)
            return
        self._states.append((msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec, q, qdot))
        self._pair()

    def _on_command(self, msg: Float64MultiArray, info) -> None:
        if self.learner is None or self._check_timer is None:
            return
        try:
            command = vector(msg.data, N_JOINTS, "command")
        except InputError:
            return  # the filter latches on malformed commands; the learner just skips them
        self._commands.append((info["source_timestamp"], command))
        self._pair()

    def _pair(self) -> None:
        """Pair each waiting command with the newest state stamped before it was sent, once a later state
        has arrived (the two queues are served in any order); a command with no state within 50 ms is dropped."""
        while self._commands and self._states and self._states[-1][0] >= self._commands[0][0]:
            sent_ns, command = self._commands.popleft()
            before = None
            for state in reversed(self._states):
                if state[0] <= sent_ns:
                    before = state
                    break
            if before is not None and sent_ns - before[0] <= _PAIR_WITHIN_NS:
                self.learner.add(sent_ns * 1e-9, before[1], before[2], command)

    def _on_trust(self, msg: TrustState) -> None:
        # the monitor's normalized prediction error rising past half its threshold: adapt sooner
        self._urgent = bool(msg.threshold > 0 and msg.normalized_error > 0.5 * msg.threshold)

    # ---- attempts
    def _check(self) -> None:
        if self.learner is None:
            return
        busy = self._worker is not None and self._worker.is_alive()
        ready, why = (False, "an attempt is running") if busy else self.learner.ready(urgent=self._urgent)
        self._publish_diagnostics(why)
        if ready:
            self._worker = threading.Thread(target=self._attempt, name="online_learner", daemon=True)
            self._worker.start()

    def _publish_diagnostics(self, waiting_for: str) -> None:
        """The learner's state on /diagnostics (once a second)."""
        from diagnostic_msgs.msg import DiagnosticStatus, KeyValue

        lr, buf = self.learner, self.learner.buffer
        last = lr.attempts[-1] if lr.attempts else None
        values = {
            "buffered_s": f"{len(buf) * lr.dt_s:.1f}", "contiguous_s": f"{len(buf.contiguous_tail()[0]) * lr.dt_s:.1f}",
            "reservoir_windows": str(len(buf.reservoir)), "buffer_mib": f"{buf.memory_bytes / 2**20:.1f}",
            "waiting_for": waiting_for, "attempts": str(len(lr.attempts)),
            "accepted": str(sum(a.accepted for a in lr.attempts)), "urgent": str(self._urgent),
            "last_attempt": "" if last is None else (last.verdict.text if last.verdict else last.error),
        }
        status = DiagnosticStatus(level=DiagnosticStatus.OK, name=f"{self.get_name()}: online learner",
                                  message=f"{len(lr.attempts)} attempts, {values['accepted']} accepted",
                                  values=[KeyValue(key=k, value=v) for k, v in values.items()])
        arr = DiagnosticArray(status=[status])
        arr.header.stamp = self.get_clock().now().to_msg()
        self._diag_pub.publish(arr)

    def _attempt(self) -> None:
        att = self.learner.attempt()
        log = self.get_logger()
        msg = ModelUpdate(model_kind="world_model", task=self.task, previous_set_version=att.previous_set_version,
                          version=att.world_model_version, accepted=att.accepted)
        msg.header.stamp = self.get_clock().now().to_msg()
        if att.verdict is not None:
            metrics = {k: v for k, v in att.verdict.metrics.items() if np.isfinite(v)}
            msg.metric_names, msg.metric_values = list(metrics), [float(v) for v in metrics.values()]
        if att.accepted:
            from robot_wm.core.onnx_model import read_sidecar

            active = self.learner.registry.get(self.task, att.set_version)
            msg.action, msg.set_version, msg.path = "activate", att.set_version, str(active.world_model_path)
            msg.sha256 = read_sidecar(active.world_model_path)["sha256"]
            msg.reason = att.verdict.text
            log.warning(f"world model {att.world_model_version} accepted as {att.set_version} "
                        f"({att.seconds:.1f} s, {att.cpu_s:.1f} CPU-s): {att.verdict.text}")
        else:
            msg.action, msg.set_version = "reject", att.previous_set_version
            msg.reason = att.verdict.text if att.verdict is not None else att.error
            text = f"candidate {att.world_model_version or '-'} not used ({att.seconds:.1f} s): {msg.reason}"
            # two call sites: rclpy raises when one call site logs at another severity than it did first,
            # and that ended the attempt's thread before the rejection was announced
            if att.verdict is not None:
                log.info(text)  # refused by the gate
            else:
                log.warning(text)  # could not be tried
        self._update_pub.publish(msg)


# the commands' DDS source times come as MessageInfo, which rclpy's EventsExecutor does not hand over. Off
# shared memory (UDP on loopback): killed while it holds a lock of Fast DDS's shared-memory transport, the
# learner would block every process that sends to it (the safety filter, the arm) for a second (rosenv)
main = main_for(AdaptationNode, executor_kind="single", shared_memory=False)

if __name__ == "__main__":
    main()
