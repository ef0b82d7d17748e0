"""The real episodes of ``robot-wm train mixed`` on a running stack: the demonstration recorder
(``robot_wm.nodes.recorder.DemoRecorder``) with the MIXED loop's bookkeeping.

Between ``start_round`` and the round's last bag it counts the episodes the task's sequencer ends
(``/robot_wm/episodes``), by the library loop's rules (``robot_wm.learning.mixed_episodes``):

* an episode counts only if it **began at trust FULL in the MIXED phase** (the library loop waits at
  rest for FULL before each episode; here the stack runs on and the paths that begin lower are
  passed over, said so in ``passed``);
* **an intervention** (a ``SafetyStatus`` other than OK or FILTERING; a stale-input stop only once
  it lasts the sequencer's hold time, 0.25 s: shorter ones are a loaded machine's hiccups, which the
  library loop does not have and the sequencer scores as part of the path) **or a trust drop** (to
  ``end_level`` or lower, from a better level reached in the episode) **ends the episode** at that
  moment: its bag ends there, says why (``extra.mixed.ended``) and counts as failed. A filter stop
  that holds the path (the sequencer starts it over and never reports it) is written when the stop
  comes, from the path's start;
* any ``TrustState`` in another phase while a round runs ends the run (``error``): the phase is an
  operator's to change, and the run never leaves MIXED on its own.

Each bag's ``extra`` carries ``{"phase": "MIXED", "mixed": summary}`` with the library loop's keys:
success, how it ended, the filter's active periods, the exploration's uncertainty and scale (from the
policy node's ``/robot_wm/exploration``), and the limit violations of the measured arm state
(``robot_wm.learning.stack_eval.PlantCheck`` on the bag's joint states).
"""
from __future__ import annotations

import collections
import dataclasses
import threading
import time
import types
from pathlib import Path

import numpy as np
from rclpy.serialization import deserialize_message
from std_msgs.msg import Float64MultiArray

from robot_wm import bags
from robot_wm.nodes.policy_exploration import EXPLORATION_TOPIC
from robot_wm.nodes.recorder import PREROLL_S, DemoRecorder

_RUNNING = ("OK", "FILTERING")
HOLD_AFTER_S = 0.25  # path_sequencer's hold_after_s: a longer stop starts the path over
POSTROLL_S = 0.3  # messages received this long after an episode's end go into its bag too
_FULL, _MIXED = 0, 1


class MixedRecorder(DemoRecorder):
    """``DemoRecorder`` with the MIXED loop's episode rules (module docstring)."""

    def __init__(self, out: Path, *, task: str, robot: str, end_level: int = 2, context=None, on_episode=None) -> None:
        super().__init__(out, 0, task=task, robot=robot, context=context, on_episode=on_episode, buffer_s=60.0)
        self.end_level = int(end_level)
        self.indices: list[int] = []
        self.round = 0
        self.summaries: list[dict] = []
        self.passed: list[str] = []
        self.error = ""
        self.in_force: dict[str, str] = {}
        self.exploration_std = 0.0
        self._round_lock = threading.Lock()
        self._episode_start_ns: int | None = None  # the running path's start (the last end, or the filter's resumption)
        self._stopped, self._stopped_ns, self._stop_counted = False, 0, False
        self.filter_reason = ""  # why the filter holds the arm now ("" while it runs)
        self._recorded_until_ns = 0  # an EpisodeResult whose window began before this was already written
        self.trust_level: int | None = None
        self.trust_phase: int | None = None
        self._explore: collections.deque = collections.deque(maxlen=12_000)  # (receive ns, [u, scale, level, phase])
        self.create_subscription(Float64MultiArray, EXPLORATION_TOPIC, self._on_exploration, 50)

    # ---------------------------------------------------------------------------------- the round
    def start_round(self, out: Path, indices: list[int], round_index: int, in_force: dict[str, str],
                    exploration_std: float) -> None:
        with self._round_lock:
            self.out = Path(out)
            self.indices, self.round = list(indices), int(round_index)
            self.in_force, self.exploration_std = dict(in_force), float(exploration_std)
            self.summaries, self.written = [], []
            self.done.clear()
            self._recorded_until_ns = self.get_clock().now().nanoseconds  # nothing from before the round counts

    def _next_index(self) -> int | None:
        with self._round_lock:
            return self.indices.pop(0) if self.indices else None

    # ---------------------------------------------------------------------------------- inputs
    def _keeper(self, topic: str):
        keep = super()._keeper(topic)

        def keep_and_watch(data: bytes) -> None:
            keep(data)
            if topic == bags.STATUS_TOPIC:
                self._on_status(data)
            elif topic == "/robot_wm/trust":
                self._on_trust(data)

        return keep_and_watch

    def _on_exploration(self, msg) -> None:
        with self.lock:
            self._explore.append((self.get_clock().now().nanoseconds, np.asarray(msg.data, dtype=float)))

    def _on_trust(self, data: bytes) -> None:
        from robot_wm.msg import TrustState

        msg = deserialize_message(data, TrustState)
        self.trust_level, self.trust_phase = int(msg.level), int(msg.phase)
        if self.indices and self.trust_phase != _MIXED and not self.error:
            self.error = (f"the trust monitor says phase {('SIM', 'MIXED', 'REAL')[min(self.trust_phase, 2)]} "
                          f"({msg.reason}): train mixed runs only in MIXED and never changes the phase")
            self.done.set()

    def _on_status(self, data: bytes) -> None:
        from robot_wm.msg import SafetyStatus

        msg = deserialize_message(data, SafetyStatus)
        now = self.get_clock().now().nanoseconds
        running = msg.state_text in _RUNNING
        self.filter_reason = "" if running else (msg.fault_reason or msg.state_text)
        if running and self._stopped:
            self._stopped = False
            if now - self._stopped_ns >= HOLD_AFTER_S * 1e9:
                self._episode_start_ns = now  # the sequencer starts a held path over when the filter runs again
        elif not running and not self._stopped:
            self._stopped, self._stopped_ns, self._stop_counted = True, now, False
        if not running and not self._stop_counted:
            # a stale-input stop that clears within the sequencer's hold time is the machine's hiccup, part of
            # the path (as the sequencer scores it); any other stop, or a longer one, is an intervention
            transient = msg.fault_reason.startswith("stale input") and now - self._stopped_ns < HOLD_AFTER_S * 1e9
            if not transient:
                self._stop_counted = True
                self._intervention(msg, self._stopped_ns)

    def _intervention(self, msg, at_ns: int) -> None:
        start = self._episode_start_ns
        if start is None or start < self._recorded_until_ns or not self.indices:
            return
        # the path the stop interrupts: written now (the sequencer holds it and never reports it)
        self._recorded_until_ns = at_ns
        reason = f"intervention: the safety filter went to {msg.state_text} ({msg.fault_reason or 'no reason given'})"
        result = types.SimpleNamespace(task=self.task, index=0, success=False, error_m=float("nan"),
                                       duration_s=(at_ns - start) * 1e-9)
        self._queue(result, start, at_ns, reason)

    # ---------------------------------------------------------------------------------- episodes
    def _episode_ended(self, data: bytes, received_ns: int) -> None:
        from robot_wm.msg import EpisodeResult

        result = deserialize_message(data, EpisodeResult)
        end_ns = bags.stamp_ns(result.header)
        start_ns = end_ns - int(round(result.duration_s * 1e9))
        self._episode_start_ns = end_ns
        if not self.indices or self.done.is_set():
            return
        if start_ns < self._recorded_until_ns:
            return  # began before the round, or its interrupted part is written already
        level, phase = self._trust_at(start_ns)
        if level != _FULL or phase != _MIXED:
            self.passed.append(f"path {result.index}: began at trust level {level} phase {phase}, not FULL in MIXED")
            return
        self._recorded_until_ns = end_ns
        self._queue(result, start_ns, end_ns, None)

    def _trust_at(self, t_ns: int) -> tuple[int | None, int | None]:
        from robot_wm.msg import TrustState

        with self.lock:
            last = None
            for topic, t, raw in self.buffer:
                if t > t_ns:
                    break
                if topic == "/robot_wm/trust":
                    last = raw
        if last is None:
            return None, None
        msg = deserialize_message(last, TrustState)
        return int(msg.level), int(msg.phase)

    def _queue(self, result, start_ns: int, end_ns: int, ended: str | None) -> None:
        from robot_wm.msg import TrustState

        with self.lock:
            window = [m for m in self.buffer if start_ns - PREROLL_S * 1e9 <= m[1] <= end_ns]
        if ended is None:  # a trust drop inside the window ends the episode there
            best = 4
            for topic, t, raw in window:
                if topic != "/robot_wm/trust" or t < start_ns:
                    continue
                level = int(deserialize_message(raw, TrustState).level)
                if level >= self.end_level and best < self.end_level:
                    ended, end_ns = f"trust drop: level {best} -> {level}", t
                    window = [m for m in window if m[1] <= t]
                    result = types.SimpleNamespace(task=result.task, index=result.index, success=False,
                                                   error_m=float("nan"), duration_s=(t - start_ns) * 1e-9)
                    break
                best = min(best, level)
        index = self._next_index()
        if index is None:
            return
        name = f"{self.task}_{self.robot}_{index:04d}"
        job = types.SimpleNamespace(task=result.task or self.task, index=index, success=bool(result.success) and ended is None,
                                    error_m=float(result.error_m), duration_s=float(result.duration_s), ended=ended,
                                    path=int(result.index))
        self._jobs.put((name, job, start_ns, end_ns, None))  # the window is cut when the post-roll is in

    def _meta(self, result, start_ns: int, end_ns: int, window) -> bags.EpisodeMeta:
        ended, index = result.ended, result.index
        meta = super()._meta(result, start_ns, end_ns, window)
        with self.lock:
            ex = [v for t, v in self._explore if start_ns <= t <= end_ns]
        u = np.array([v[0] for v in ex]) if ex else np.zeros(0)
        s = np.array([v[1] for v in ex]) if ex else np.zeros(0)
        finite = u[np.isfinite(u)]
        filtering = sum(1 for topic, t, raw in window if topic == bags.STATUS_TOPIC and t >= start_ns
                        and _state_text(raw) == "FILTERING")
        summary = {"index": index, "round": self.round, "success": bool(meta.success), "ended": ended,
                   "trust_settle_s": 0.0, "periods": int(round(result.duration_s / meta.dt_s)),
                   "tracking_rms_m": None if ended or not np.isfinite(result.error_m) else round(float(result.error_m), 6),
                   "filter_periods": int(filtering), "violations": _violations(window, start_ns, end_ns, meta.joint_names),
                   "exploration": {"enabled": self.exploration_std > 0, "std_fraction": self.exploration_std,
                                   "uncertainty_median_radps": round(float(np.median(finite)), 6) if finite.size else None,
                                   "scale_mean": round(float(s.mean()), 6) if s.size else None,
                                   "share_off": round(float(np.mean(s <= 0.0)), 6) if s.size else None,
                                   "trust_full_share": round(float(np.mean([v[2] == 0 for v in ex])), 6) if ex else None}}
        self._summary_pending = summary
        return dataclasses.replace(meta, models={**meta.models, **self.in_force}, error_m=None if ended else meta.error_m,
                                   extra={**meta.extra, "phase": "MIXED", "mixed": summary, "path": result.path})

    def _write(self, name: str, job, start_ns: int, end_ns: int, window) -> None:
        if window is None:
            # a loaded machine delivers the last states of an episode after its end was announced: wait
            # for them (``POSTROLL_S``), or the bag's states would stop short of its end
            wait_s = (end_ns + POSTROLL_S * 1e9 - self.get_clock().now().nanoseconds) * 1e-9
            if wait_s > 0:
                time.sleep(min(wait_s, POSTROLL_S))
            with self.lock:
                window = [m for m in self.buffer if start_ns - PREROLL_S * 1e9 <= m[1] <= end_ns + POSTROLL_S * 1e9]
        self._summary_pending = None
        before = len(self.written)
        super()._write(name, job, start_ns, end_ns, window)
        if len(self.written) > before and self._summary_pending is not None:
            self.summaries.append(self._summary_pending)
            with self._round_lock:
                finished = not self.indices
            if finished and self._jobs.empty():
                self.done.set()


def _state_text(raw: bytes) -> str:
    from robot_wm.msg import SafetyStatus

    return deserialize_message(raw, SafetyStatus).state_text


_CHECKS: dict = {}


def _violations(window, start_ns: int, end_ns: int, joint_names) -> dict[str, int]:
    """Limit breaches of the measured arm state in the episode (``PlantCheck`` on each joint state;
    tool speed from J(q) q̇): what the arm did, as the library loop checks its plant."""
    from sensor_msgs.msg import JointState

    from robot_wm import description
    from robot_wm.core.kinematics import Kinematics
    from robot_wm.core.safety import load_safety_limits
    from robot_wm.learning.stack_eval import VIOLATION_KINDS, PlantCheck
    from robot_wm.nodes.conversions import InputError, joint_state_arrays

    key = tuple(joint_names)
    if key not in _CHECKS:  # the description is expanded once per process
        kin = Kinematics(description.expand(), list(joint_names))
        _CHECKS[key] = (kin, PlantCheck(kin, load_safety_limits()))
    kin, check = _CHECKS[key]
    counts = dict.fromkeys(VIOLATION_KINDS, 0)
    for topic, t, raw in window:
        if topic != bags.STATES_TOPIC or not start_ns <= t <= end_ns:
            continue
        try:
            q, v = joint_state_arrays(deserialize_message(raw, JointState), list(joint_names))
        except InputError:
            continue
        for kind, hit in check(q, float(np.linalg.norm(kin.tool_linear_velocity_mps(q, v)))).items():
            counts[kind] += int(hit)
    return counts
