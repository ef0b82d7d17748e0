"""Hot swap of the world model (and of the policy, ``PolicySwap``) in a running node: load off the control thread, swap between two periods.

``WorldModelSwap`` listens on ``/robot_wm/model_update`` (``robot_wm/msg/ModelUpdate``). An update for
this node's task that activates a set (the online learner's "activate", the trust monitor's or an
operator's "rollback") is loaded in a thread of its own: the file must be the registry's active
world model of the task (an announcement that is not, or comes late, is ignored), its SHA-256 the
announced one, and it must load as a world model of this arm and period (``WorldModelRunner``:
sidecar, hash, joint order, signature; the filter's runner also builds and checks its linearization).
The control thread then calls ``take`` at the start of a period: the new runner, with the committed
command history of the one it replaces, or None. Loading never happens on the control thread, and
nothing is swapped half-way through a period. A model that fails to load is refused with the reason
(logged; ``last_refusal``) and the current one stays.

The loader shares the interpreter lock with the control thread. A few steps of a load hold it for
milliseconds in one C call (creating an onnxruntime session: 3 ms; freeing one when a replaced model
is retired), and whenever the control thread lets the lock go in a period (each onnxruntime run, each
publish) a loader running beside it takes it for up to a switch interval. So the loader runs its
steps (each a few milliseconds at most) in the slack after a period's work: ``PERIOD_ENDS``, which the
control-path nodes of the process mark at the end of their work each period, and each step starts
within 1 ms of such an end, so that the lock is free again before the next period begins.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy

SWAP_ACTIONS = ("activate", "rollback")
_SWITCH_INTERVAL_S = 0.0005  # the interpreter's thread switch interval while a model loads (default 5 ms)
_RETIRE_AFTER_S = 1.0  # a replaced model is freed this long after the swap, off the control thread
_SLACK_WAIT_S = 0.05  # a loader's step waits at most this long for a period to end (none runs: it goes on)
_SLACK_START_NS = 1_000_000  # and starts only this soon after the end (woken later, it waits for the next)
_ACTIVE_NS = 100_000_000  # a node that has not marked a period end for this long is not running periods
#: places in a period of the control-path nodes (``PeriodEnds.mark``): the policy acts on the joint state,
#: the safety filter sends the command, the world_model node predicts from the command sent
PLACE_POLICY, PLACE_FILTER, PLACE_WORLD_MODEL = 0, 1, 2
UPDATE_TOPIC = "/robot_wm/model_update"
#: QoS of /robot_wm/model_update, publishers and subscribers alike: reliable, and kept for a node that
#: matches late (a short-lived publisher such as `robot-wm models rollback` may be gone by then)
UPDATE_QOS = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)


class WorldModelSwap:
    """The world-model hot swap of one node (see the module docstring).

    Args:
        node: the node (logging, the subscription).
        task: its task; updates for another are ignored.
        joint_names, dt_s: what the new runner must fit.
        analytic: build the linearization graph (the safety filter) or not (predict only).
        in_use: the version of the model the node runs now (None: unknown). An announcement of that
            model, with no other on its way in, loads nothing: a set that carries the same policy
            (the online learner's do) would otherwise cost the control process a load at every swap.
    """

    def __init__(self, node: Node, task: str, joint_names, dt_s: float, *, analytic: bool,
                 in_use: Callable[[], str | None] | None = None) -> None:
        from robot_wm.msg import ModelUpdate

        self.node, self.task = node, task
        self.joint_names, self.dt_s, self.analytic = list(joint_names), float(dt_s), analytic
        self._in_use = in_use or (lambda: None)
        self._lock = threading.Lock()
        self._pending = None  # (runner, update message)
        self._handed: str | None = None  # the version ``take`` last handed over (or found in use)
        self._loading: threading.Thread | None = None
        self.last_refusal = ""
        self.swaps = 0
        self._paced = [0, 0]  # the last load's steps: [without a period's slack (none came), in one]
        self._started_ns = node.get_clock().now().nanoseconds  # older announcements are history (transient local)
        node.create_subscription(ModelUpdate, UPDATE_TOPIC, self._on_update, UPDATE_QOS)

    KIND = "world_model"

    def _on_update(self, msg) -> None:
        if msg.task != self.task or msg.model_kind != self.KIND or msg.action not in SWAP_ACTIONS \
                or not msg.accepted:
            return
        if msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec < self._started_ns:
            return  # kept for late subscribers from before this node started: it loaded the active model anyway
        if self._in_use_already(msg.version):
            self.node.get_logger().info(f"model update {msg.set_version} ({msg.action}): {self.KIND.replace('_', ' ')} "
                                        f"{msg.version} is the one in use; nothing to load")
            return
        previous = self._loading
        if previous is not None and previous.is_alive():  # waited for on the new loader, not on this thread
            self.node.get_logger().warning(f"model update {msg.set_version}: still loading the previous one; "
                                           "this one is loaded after it")
        self._loading = threading.Thread(target=self._load, args=(msg, previous), name=f"{self.KIND}_swap",
                                         daemon=True)
        self._loading.start()

    def _in_use_already(self, version: str) -> bool:
        """``version`` is the model this node runs, and no other is on its way in (loading, loaded, or
        being handed over to the control thread: ``take`` records what it handed before the node has it)."""
        if not version:
            return False
        with self._lock:
            busy = self._pending is not None or (self._loading is not None and self._loading.is_alive())
            handed = self._handed
        try:
            running = self._in_use()
        except Exception:  # noqa: BLE001 (unknown: load it, as before)
            return False
        return not busy and version == running and handed in (None, running)

    def _load(self, msg, previous: threading.Thread | None) -> None:
        if previous is not None:
            previous.join()  # announcements are loaded in the order they came
        with _LOADS_IN_TURN, loader_scheduling():
            self._build(msg)

    def _build(self, msg) -> None:
        from robot_wm.core.onnx_model import sha256_file
        from robot_wm.registry import resolve

        try:
            path = Path(msg.path)
            active = Path(resolve(self.task, self.KIND))
            if path.resolve() != active.resolve():
                raise ValueError(f"{path} is not the registry's active {self.task} {self.KIND.replace('_', ' ')} ({active}): "
                                 "a late or stale announcement")
            if msg.sha256 and sha256_file(path) != msg.sha256:
                raise ValueError(f"{path}: SHA-256 differs from the announced {msg.sha256[:16]}...")
            started, self._paced = time.monotonic(), [0, 0]
            runner = self._load_runner(path)
        except Exception as exc:  # noqa: BLE001 (anything that fails to load is refused, never raised)
            self.last_refusal = f"model update {msg.set_version} ({msg.action}) refused: {type(exc).__name__}: {exc}"
            self.node.get_logger().error(f"{self.last_refusal}; keeping the current {self.KIND.replace('_', ' ')}")
            return
        with self._lock:
            self._pending = (runner, msg)
        self.node.get_logger().info(f"{self.KIND.replace('_', ' ')} {runner.version} ({msg.action} {msg.set_version}) loaded "
                                    + (f"(linearized by {runner.linearization}) " if self.analytic else "")
                                    + f"off the control thread in {1e3 * (time.monotonic() - started):.0f} ms "
                                    f"({self._paced[1]} of {sum(self._paced)} steps in a period's slack): "
                                    "swapped in at the next period")

    def _pace(self) -> None:
        """Before each step of a load: wait for a period's slack (counted: in one, or none came)."""
        self._paced[PERIOD_ENDS.wait_for_slack()] += 1

    def _load_runner(self, path):
        return load_runner(path, self.joint_names, self.dt_s, self.analytic, pace=self._pace)

    def _next(self, current):
        """The loaded (runner, update) unless there is none or ``current`` is that model already."""
        if self._pending is None:
            return None
        with self._lock:
            runner, msg = self._pending
            self._pending = None
            self._handed = runner.version
        if current is not None and getattr(current, "version", None) == runner.version:
            return None  # already this model (an announcement kept for late subscribers, heard again)
        return runner, msg

    def take(self, current):
        """At the start of a period: the loaded runner, carrying ``current``'s command history, or None."""
        loaded = self._next(current)
        if loaded is None:
            return None
        runner, msg = loaded
        if current is not None:
            try:
                runner.reset(current.action_history, current.qdot_history)
            except Exception as exc:  # noqa: BLE001 (another history length: the new model starts from rest)
                self.node.get_logger().warning(f"world model swap: history not carried over ({exc})")
        self.swaps += 1
        self.node.get_logger().warning(f"world model swapped: {getattr(current, 'version', None)} -> {runner.version} "
                                       f"({msg.action}: {msg.reason})")
        return runner


class PolicySwap(WorldModelSwap):
    """The same hot swap for the policy node (``model_kind`` "policy"): the file must be the
    registry's active policy of the task, its SHA-256 the announced one, and it must load as a
    policy of this task, arm and period (``PolicyRunner``); ``take`` hands the new runner over at the
    start of a period. ``robot-wm train mixed`` announces the policy of each round's set this way."""

    KIND = "policy"

    def __init__(self, node: Node, task: str, joint_names, dt_s: float,
                 in_use: Callable[[], str | None] | None = None) -> None:
        super().__init__(node, task, joint_names, dt_s, analytic=False, in_use=in_use)

    def _load_runner(self, path):
        import numpy as np

        from robot_wm.core.policy_runner import PolicyRunner, layout_width

        runner = PolicyRunner(path, self.joint_names, self.dt_s, task=self.task, pace=self._pace)
        obs = np.zeros(layout_width(runner.obs_layout))
        for _ in range(3):  # the session's first runs allocate and plan: not on the control thread
            self._pace()
            runner.act(obs)
        return runner

    def take(self, current):
        loaded = self._next(current)
        if loaded is None:
            return None
        runner, msg = loaded
        self.swaps += 1
        self.node.get_logger().warning(f"policy swapped: {getattr(current, 'version', None)} -> {runner.version} "
                                       f"({msg.action} {msg.set_version}: {msg.reason})")
        return runner


def retire(runner, after_s: float = _RETIRE_AFTER_S) -> None:
    """Release a replaced runner off the control thread: freeing its onnxruntime sessions takes 0.4-6.5 ms
    (the filter's, with the linearization graph) with the interpreter lock held, much of a period's budget
    if the control thread did it. A thread of its own keeps the last reference for ``after_s`` (the caller
    drops its own meanwhile) and then lets it go, just below the control thread, in a period's slack."""
    if runner is None:
        return
    threading.Thread(target=_release_later, args=([runner], after_s), name="world_model_retire", daemon=True).start()


def _release_later(box: list, after_s: float) -> None:
    threading.Event().wait(after_s)
    below_the_control_thread()
    PERIOD_ENDS.wait_for_slack()  # freeing a session holds the interpreter lock for milliseconds
    box.clear()


def load_runner(path, joint_names, dt_s: float, analytic: bool, pace: Callable[[], object] | None = None):
    """The loader's work: the runner of ``path`` (checked as a world model of this arm and period; with
    its linearization graph when ``analytic``), its sessions already run a few times. onnxruntime's first
    runs of a session allocate and plan, which would otherwise fall on the control thread's first
    periods with it. ``pace``: see ``WorldModelRunner``."""
    import numpy as np

    from robot_wm.core.world_model_runner import WorldModelRunner

    runner = WorldModelRunner(path, joint_names, dt_s, analytic=analytic, pace=pace)
    n = len(runner.joint_names)
    q, zero = np.zeros(n), np.zeros(n)
    for _ in range(3):
        if pace is not None:
            pace()
        runner.predict(q, zero, zero, commit=False)
        if analytic:
            runner.linearize_with_std(q, zero, zero)
    return runner


#: One load at a time in a process: the composed process's world_model node and safety filter load the
#: same announced model. Side by side, two loaders at SCHED_FIFO one below the control thread hold both
#: cores and hand the interpreter lock to each other at every point where the control thread's period lets
#: it go (each onnxruntime run, each publish): 6 of 116 swaps in bench_swap_storm.py missed a period, 2 of
#: 118 in turn. (The in-process bench_swap_load.py showed no difference: its loads never overlap a real
#: executor's callbacks.)
_LOADS_IN_TURN = threading.Lock()
_interval_lock = threading.Lock()
_interval_users = 0  # loader threads inside loader_scheduling (the filter's and the world model's may overlap)
_interval_before = 0.0  # the switch interval before the first of them


@contextmanager
def loader_scheduling(place: Callable[[], str] | None = None):
    """Run the body (on the loader thread) just below the control thread (``place``: elsewhere), handing
    the interpreter lock back every 0.5 ms instead of every 5 ms so that a period waits at most that long
    for it. The switch interval is the process's: loads that overlap share it, and the last one out puts it back."""
    global _interval_users, _interval_before
    with _interval_lock:
        if _interval_users == 0:
            _interval_before = sys.getswitchinterval()
            sys.setswitchinterval(min(_interval_before, _SWITCH_INTERVAL_S))
        _interval_users += 1
    try:
        (place or below_the_control_thread)()
        yield
    finally:
        with _interval_lock:
            _interval_users -= 1
            if _interval_users == 0:
                sys.setswitchinterval(_interval_before)


def below_the_control_thread() -> str:
    """Schedule the calling thread, started by the control thread, just below it; returns what it set.

    The loader holds the interpreter lock in stretches (onnx parsing, graph building) and the control
    thread then waits for it, so the loader must run whenever it holds the lock: a loader put below
    other processes makes the control thread wait for whatever else the CPU runs (priority inversion; at
    nice 10 among busy processes it held a SCHED_FIFO control thread up to 96 ms,
    ``bench/bench_swap_load.py``). Under SCHED_FIFO/RR the thread runs one priority lower (before every
    normal process, after the control threads and the arm); under the normal scheduler it keeps the
    control thread's priority. Where the OS says no, nothing changes."""
    tid = threading.get_native_id()
    try:
        policy = os.sched_getscheduler(tid)
        if policy not in (os.SCHED_FIFO, os.SCHED_RR):
            return f"normal scheduler, nice {os.getpriority(os.PRIO_PROCESS, tid)} (as the control thread)"
        priority = max(os.sched_getparam(tid).sched_priority - 1, 1)
        os.sched_setscheduler(tid, policy, os.sched_param(priority))
        return f"{'SCHED_FIFO' if policy == os.SCHED_FIFO else 'SCHED_RR'} {priority}"
    except (OSError, AttributeError) as exc:
        return f"unchanged ({exc})"


def below_realtime() -> str:
    """Schedule the calling thread at the normal scheduler (nice unchanged): below every real-time thread
    of every process. For work that is not the control path's, in a process that is real-time (the trust
    monitor's calibration lookups): one priority below its own thread, as a loader, it held a core for
    11-23 ms against the control process's loaders, which wait for a core while holding that process's
    interpreter lock, and its control thread waits with them (``bench/bench_swap_storm.py``)."""
    tid = threading.get_native_id()
    try:
        if os.sched_getscheduler(tid) in (os.SCHED_FIFO, os.SCHED_RR):
            os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
        return f"normal scheduler, nice {os.getpriority(os.PRIO_PROCESS, tid)}"
    except (OSError, AttributeError) as exc:
        return f"unchanged ({exc})"


class PeriodEnds:
    """When this process's control work of a period is done: the slack in which a loader's long steps start.

    Each control-path node of the process marks the end of its work in a period (``mark`` with its
    place: ``PLACE_POLICY``, ``PLACE_FILTER``, ``PLACE_WORLD_MODEL``). The period's work ends with the
    mark of the latest place among the nodes still marking (within the last 100 ms): in the composed
    process the world_model node's prediction, in a process of its own each node's own step. A mark
    costs the control thread an uncontended lock (about a microsecond)."""

    def __init__(self, clock: Callable[[], int] = time.monotonic_ns) -> None:
        self._clock = clock  # ns
        self._cond = threading.Condition(threading.Lock())
        self._last_ns: dict[int, int] = {}  # place -> its latest mark
        self._ends = 0
        self._end_ns = 0

    def mark(self, place: int) -> None:
        """Called by the control thread when its node's work of this period is done."""
        now = self._clock()
        with self._cond:
            self._last_ns[place] = now
            if all(p <= place or now - t > _ACTIVE_NS for p, t in self._last_ns.items()):
                self._ends += 1
                self._end_ns = now
                self._cond.notify_all()

    @property
    def count(self) -> int:
        """Periods ended so far."""
        return self._ends

    def wait_for_slack(self, timeout_s: float = _SLACK_WAIT_S) -> bool:
        """Block until a period's work has just ended (True; woken more than 1 ms after it, wait for the
        next), or ``timeout_s`` passes without one (False: no control period is running; go on)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            seen = self._ends
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
                if self._ends != seen:
                    if self._clock() - self._end_ns <= _SLACK_START_NS:
                        return True
                    seen = self._ends


#: The process's period ends (one control thread per process).
PERIOD_ENDS = PeriodEnds()
