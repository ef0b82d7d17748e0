"""demo_recorder: record demonstrations from a running stack, one rosbag2 MCAP bag per episode.

Subscribes to every demonstration topic (``robot_wm.bags.TOPICS``) as serialized messages (the
CDR bytes DDS delivered, written unchanged, as ``ros2 bag record`` does; receive time on the
node's clock), keeps the last ``buffer_s`` of them, and when the task's sequencer announces the end
of an episode (``EpisodeResult`` on /robot_wm/episodes: its stamp is the end, ``duration_s`` its
length) writes the messages from ``preroll_s`` before the episode's start to its end into
``<out>/<task>_<robot>_<index>``, with the episode's metadata (``robot_wm.bags.EpisodeMeta``):

* ``source``: ``teleop`` when an operator held the arm (``/robot_wm/intervention/state`` active)
  at any time in the episode, else ``scripted`` or ``policy`` as the policy node runs;
* ``interventions``: operator take-overs that began in the episode; ``filter_interventions``:
  SafetyStatus messages in it whose state was not OK;
* ``models``: the policy's version (the policy node's parameters and the model's sidecar) and the
  world model's (``model_version`` of /robot_wm/prediction).

The safety filter's tare in force (the latest ``/robot_wm/payload``, latched) goes into every bag,
also when it was taken long before the episode: a calibration from the bags needs it.

An episode whose window is not fully in the buffer (the recorder started in the middle of it) is
skipped with a message, not written short.
"""
from __future__ import annotations

import collections
import json
import queue
import threading
import time
from pathlib import Path

from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from rclpy.serialization import deserialize_message

from robot_wm import bags

PREROLL_S = 0.5
_ASK_AGAIN_S = 2.0  # a parameter request unanswered this long is sent again (s)
_POLICY_WAIT_S = 15.0  # how long a bag waits to learn what the policy node runs (s)


def _msg_class(msgtype: str):
    import importlib

    pkg, _, name = msgtype.split("/")
    return getattr(importlib.import_module(f"{pkg}.msg"), name)


class DemoRecorder(Node):
    """Record ``demos`` episodes (0: until stopped) into ``out``; ``done`` is set when finished."""

    def __init__(self, out: Path, demos: int, *, task: str, robot: str, context=None, buffer_s: float = 30.0,
                 policy_node: str = "/policy", on_episode=None) -> None:
        super().__init__("demo_recorder", context=context)
        self.out, self.demos, self.task, self.robot = Path(out), int(demos), task, robot
        self.buffer_ns = int(buffer_s * 1e9)
        self.policy_node = policy_node
        self.on_episode = on_episode
        self.buffer: collections.deque = collections.deque()
        self.first_ns: int | None = None
        self.lock = threading.Lock()
        self.written: list[Path] = []
        self.payload: tuple | None = None  # (topic, receive ns, raw) of the latest /robot_wm/payload
        self.skipped: list[str] = []
        self.done = threading.Event()
        self.world_model_version = ""
        self.policy_source, self.policy_version = None, ""
        self.policy_model_path = self.policy_task = ""  # the policy node's parameters, once it has answered
        self.policy_known = threading.Event()  # set once the policy node has said what it runs
        self._policy_waited = False
        reliable = QoSProfile(depth=200, reliability=ReliabilityPolicy.RELIABLE)
        latched = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)
        for topic, msgtype in bags.TOPICS.items():
            qos = latched if topic in ("/robot_wm/intervention/state", bags.PAYLOAD_TOPIC) else reliable
            self.create_subscription(_msg_class(msgtype), topic, self._keeper(topic), qos, raw=True)
        from robot_wm.msg import WorldModelPrediction

        self.create_subscription(WorldModelPrediction, "/robot_wm/prediction", self._on_prediction, 10)
        from rcl_interfaces.srv import GetParameters

        self._param_client = self.create_client(GetParameters, f"{policy_node}/get_parameters")
        self._param_future, self._param_sent_s = None, 0.0
        self.create_timer(0.5, self._ask_policy)
        # bags are written off the executor: a callback that blocks loses messages from the queues
        self._jobs: "queue.Queue" = queue.Queue()
        self._writer = threading.Thread(target=self._write_loop, name="demo_recorder_writer", daemon=True)
        self._writer.start()

    # ---------------------------------------------------------------------------------- inputs
    def _keeper(self, topic: str):
        def keep(data: bytes) -> None:
            now = self.get_clock().now().nanoseconds
            with self.lock:
                if self.first_ns is None:
                    self.first_ns = now
                self.buffer.append((topic, now, bytes(data)))
                if topic == bags.PAYLOAD_TOPIC:  # the tare in force: every bag carries it (it is published rarely)
                    self.payload = (topic, now, bytes(data))
                while self.buffer and self.buffer[0][1] < now - self.buffer_ns:
                    self.buffer.popleft()
            if topic == "/robot_wm/episodes":
                self._episode_ended(data, now)

        return keep

    def _on_prediction(self, msg) -> None:
        self.world_model_version = msg.model_version

    def _ask_policy(self) -> None:
        """The policy node's parameters: is it the scripted baseline, which model does it run?"""
        from rcl_interfaces.srv import GetParameters

        if self.policy_source is not None:
            return
        now_s = time.monotonic()
        if self._param_future is not None and not self._param_future.done() and now_s - self._param_sent_s > _ASK_AGAIN_S:
            # a request sent as the service was discovered can lose its response (a loaded machine): ask again
            self._param_client.remove_pending_request(self._param_future)
            self._param_future = None
        if self._param_future is None:
            if not self._param_client.service_is_ready():
                return
            self._param_future = self._param_client.call_async(GetParameters.Request(names=["scripted", "model_path", "task"]))
            self._param_sent_s = now_s
            return
        if not self._param_future.done():
            return
        result = self._param_future.result()
        values = result.values if result is not None else []
        scripted = bool(values[0].bool_value) if values else False
        model_path = values[1].string_value if len(values) > 1 else ""
        self.policy_model_path = model_path
        self.policy_task = values[2].string_value if len(values) > 2 else ""
        self.policy_source = "scripted" if scripted else "policy"
        self.policy_version = "scripted" if scripted else _policy_version(model_path, self.task)
        self.policy_known.set()

    # ---------------------------------------------------------------------------------- episodes
    def _episode_ended(self, data: bytes, received_ns: int) -> None:
        from robot_wm.msg import EpisodeResult

        result = deserialize_message(data, EpisodeResult)
        end_ns = bags.stamp_ns(result.header)
        start_ns = end_ns - int(round(result.duration_s * 1e9))
        with self.lock:
            # up to this EpisodeResult itself (received after its stamp)
            window = [m for m in self.buffer if start_ns - PREROLL_S * 1e9 <= m[1] <= max(end_ns, received_ns)]
            if self.payload is not None and self.payload[1] < start_ns - PREROLL_S * 1e9:
                window.insert(0, self.payload)  # taken before the episode: still the one in force
            first = self.first_ns
            oldest = self.buffer[0][1] if self.buffer else None
        name = f"{self.task}_{self.robot}_{result.index:04d}"
        if first is None or first > start_ns - PREROLL_S * 1e9:
            self.skipped.append(f"{name}: began before the recorder started")
            self.get_logger().info(f"episode {result.index} skipped: it began before the recorder started")
            return
        if oldest is None or oldest > start_ns - PREROLL_S * 1e9:
            self.skipped.append(f"{name}: {result.duration_s:.1f} s, longer than the recorder's buffer")
            self.get_logger().warning(f"episode {result.index} skipped: {result.duration_s:.1f} s does not fit the "
                                      f"{self.buffer_ns * 1e-9:.0f} s buffer (buffer_s)")
            return
        if self.done.is_set():
            return  # enough episodes: the caller is stopping
        self._jobs.put((name, result, start_ns, end_ns, window))

    def _write_loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            self._write(*job)

    def stop_writer(self, timeout_s: float = 10.0) -> None:
        """Write what is queued, then end the writer thread."""
        self._jobs.put(None)
        self._writer.join(timeout=timeout_s)

    def destroy_node(self):
        if self._writer.is_alive():
            self.stop_writer()
        return super().destroy_node()

    def __del__(self):  # noqa: D105 - a recorder dropped without destroy_node still ends its thread
        try:
            if self._writer.is_alive():
                self._jobs.put(None)
        except AttributeError:
            pass

    def _write(self, name: str, result, start_ns: int, end_ns: int, window) -> None:
        if self.demos and len(self.written) >= self.demos:
            return  # queued before the last one was written: no more than asked
        if not self.policy_known.is_set() and not self._policy_waited:  # once: a silent node does not hold every bag
            self._policy_waited = True
            if not self.policy_known.wait(_POLICY_WAIT_S):
                self.get_logger().warning(f"episode {result.index}: {self.policy_node} did not say what it runs "
                                          f"within {_POLICY_WAIT_S:g} s: its bags say source 'policy' and no policy "
                                          "version until it does")
        path = self.out / name
        k = 1
        while path.exists() or path.with_name(path.name + ".partial").exists():
            path, k = self.out / f"{name}-{k}", k + 1
        try:
            meta = self._meta(result, start_ns, end_ns, window)
            with bags.EpisodeBagWriter(path) as writer:
                for topic, t_ns, raw in window:
                    writer.write_raw(topic, t_ns, raw)
                writer.close(meta)
        except Exception as exc:  # noqa: BLE001 - a failed bag is reported; the recorder keeps going
            self.skipped.append(f"{name}: {exc}")
            self.get_logger().error(f"episode {result.index}: bag not written: {exc}")
            return
        self.written.append(path)
        self.get_logger().info(f"episode {result.index} ({meta.source}, success={meta.success}) -> {path}")
        if self.on_episode is not None:
            self.on_episode(path, meta)
        if self.demos and len(self.written) >= self.demos:
            self.done.set()

    def _meta(self, result, start_ns: int, end_ns: int, window) -> bags.EpisodeMeta:
        from robot_wm.msg import InterventionState, SafetyStatus

        taken, takeovers, changed = False, 0, 0
        previous_count = None
        for topic, t_ns, raw in window:
            if topic == "/robot_wm/intervention/state":
                s = deserialize_message(raw, InterventionState)
                if t_ns >= start_ns:
                    taken |= bool(s.active)
                    if previous_count is not None and s.count > previous_count:
                        takeovers += s.count - previous_count
                previous_count = s.count
            elif topic == "/robot_wm/safety_status" and t_ns >= start_ns:
                changed += deserialize_message(raw, SafetyStatus).state != SafetyStatus.OK
        from robot_wm import description

        names = description.joint_limits(description.expand()).names
        source = "teleop" if taken else (self.policy_source or "policy")
        from robot_wm.core.tasks import get_task

        return bags.EpisodeMeta(task=result.task or self.task, robot=self.robot, source=source,
                                success=bool(result.success), error_m=float(result.error_m),
                                interventions=int(takeovers), filter_interventions=int(changed),
                                start_ns=start_ns, end_ns=end_ns, dt_s=get_task(self.task).control_dt_s,
                                joint_names=list(names), index=int(result.index), library=False,
                                models={"policy": self.policy_version, "world_model": self.world_model_version},
                                extra={"policy_node": self.policy_node})


def _policy_version(model_path: str, task: str) -> str:
    """The version in the sidecar of the policy the node runs ("" when it cannot be read): its
    model_path, or what an empty one resolves to (the task's active set in the registry, else the
    shipped file; ``robot_wm.registry.resolve``, as the policy node does)."""
    try:
        if model_path:
            path = Path(model_path)
        else:
            from robot_wm import registry

            path = registry.resolve(task, "policy")
        side = json.loads(path.with_suffix(".json").read_text())
        return str(side.get("version", ""))
    except (OSError, ValueError):
        return ""


def record_live(out: Path, demos: int, *, task: str, robot: str, timeout_s: float, progress=print) -> tuple[list[Path], list[str]]:
    """Record from the running stack until ``demos`` episodes are written or ``timeout_s`` passes."""
    import rclpy
    from rclpy.context import Context
    from rclpy.executors import SingleThreadedExecutor

    from robot_wm.rosenv import apply_loopback_dds

    apply_loopback_dds()
    context = Context()
    rclpy.init(context=context)
    node = DemoRecorder(out, demos, task=task, robot=robot, context=context,
                        on_episode=lambda p, m: progress(f"record: {p.name}: {m.source}, success={m.success}, "
                                                         f"error {1e3 * (m.error_m or 0):.1f} mm"))
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    deadline = time.monotonic() + timeout_s
    try:
        while not node.done.is_set() and time.monotonic() < deadline:
            executor.spin_once(timeout_sec=0.05)
    except KeyboardInterrupt:
        pass
    finally:
        node.stop_writer()  # what is queued is written before the count is taken
        written, skipped = list(node.written), list(node.skipped)
        executor.shutdown(timeout_sec=1.0)
        node.destroy_node()
        rclpy.shutdown(context=context)
    return written, skipped
