"""Demonstration episodes as rosbag2 bags: one MCAP bag per episode, written and read with ``rosbags``.

A demonstration is what the stack did during one task episode, recorded from the topics the nodes
speak (``TOPICS``: the measured joint states, the command the arm was sent, the policy's nominal,
the task's reference or goal, the wrist wrench, the filter's ``SafetyStatus``, the monitor's
``TrustState``, the intervention flag and the sequencer's ``EpisodeResult``), plus the episode's
metadata (``EpisodeMeta``) in the bag's ``metadata.yaml`` ``custom_data`` under ``robot_wm.episode``
(JSON). The same files come from the running stack (``robot_wm.nodes.recorder``: the serialized
messages as DDS delivered them) and from the library-mode simulator
(``robot_wm.learning.demos.record_library``: the same messages built here, stamped with simulated
time), so one loader reads both.

**Format**: rosbag2 metadata version 9 with the MCAP storage plugin. Version 9 is what rosbag2 on
Jazzy and Kilted writes and reads (it added per-topic QoS history/depth; the ``ros2 bag`` of both
releases reads it, and ``rosbags`` writes nothing newer); MCAP is the default storage of both. The
message definitions are embedded in the MCAP file (``ros2msg`` schemas), so a reader needs no
robot_wm install to decode ``robot_wm/msg/*`` messages.

A bag is written under ``<name>.partial/`` and renamed into place only after ``metadata.yaml`` is
complete: a crash leaves a ``.partial`` directory that ``demos inspect`` reports and the loader
refuses, never a bag that looks whole.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np

META_KEY = "robot_wm.episode"
META_FORMAT = "robot_wm-demo/1"
BAG_VERSION = 9
SOURCES = ("policy", "scripted", "teleop")

#: topic -> message type of everything a demonstration carries.
TOPICS: dict[str, str] = {
    "/joint_states": "sensor_msgs/msg/JointState",
    "/forward_velocity_controller/commands": "std_msgs/msg/Float64MultiArray",
    "/robot_wm/action_nominal": "std_msgs/msg/Float64MultiArray",
    "/robot_wm/reference": "trajectory_msgs/msg/MultiDOFJointTrajectory",
    "/robot_wm/goal": "geometry_msgs/msg/PointStamped",
    "/robot_wm/wrench": "geometry_msgs/msg/WrenchStamped",
    "/robot_wm/safety_status": "robot_wm/msg/SafetyStatus",
    "/robot_wm/trust": "robot_wm/msg/TrustState",
    "/robot_wm/intervention/state": "robot_wm/msg/InterventionState",
    "/robot_wm/episodes": "robot_wm/msg/EpisodeResult",
    "/robot_wm/payload": "geometry_msgs/msg/InertiaStamped",
}
STATES_TOPIC = "/joint_states"
COMMAND_TOPIC = "/forward_velocity_controller/commands"
STATUS_TOPIC = "/robot_wm/safety_status"
#: the safety filter's F/T tares (latched): a bag carries the one in force, for its calibration's effort model
PAYLOAD_TOPIC = "/robot_wm/payload"
#: what a bag must hold to be a demonstration at all (the loader's training input)
REQUIRED_TOPICS = (STATES_TOPIC, COMMAND_TOPIC)
#: the task's target: one of these per task
TARGET_TOPICS = {"track": "/robot_wm/reference", "reach": "/robot_wm/goal"}


class BagError(ValueError):
    """A demonstration bag is missing, truncated, corrupt or not what the caller needs; the
    message names the bag and what is wrong."""


@dataclass
class EpisodeMeta:
    """Per-episode metadata (``custom_data`` of the bag's metadata.yaml)."""

    task: str
    robot: str  # the simulator profile, or the hardware's name
    source: str  # policy | scripted | teleop (the operator commanded at some point)
    success: bool | None
    error_m: float | None  # the task's score (tracking RMS, or final distance for reach)
    interventions: int  # operator take-overs during the episode
    filter_interventions: int  # control periods the safety filter changed the command
    start_ns: int
    end_ns: int
    dt_s: float
    joint_names: list[str]
    models: dict[str, str] = field(default_factory=dict)  # kind -> version (policy, world_model)
    index: int = 0
    library: bool = False  # recorded from the library-mode simulator, not a running stack
    extra: dict[str, Any] = field(default_factory=dict)
    format: str = META_FORMAT

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise BagError(f"episode source {self.source!r}: expected one of {', '.join(SOURCES)}")
        if self.end_ns < self.start_ns:
            raise BagError(f"episode ends ({self.end_ns} ns) before it starts ({self.start_ns} ns)")

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) * 1e-9

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str, where: str) -> "EpisodeMeta":
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise BagError(f"{where}: custom_data {META_KEY} is not JSON ({exc})") from exc
        if not isinstance(raw, dict) or raw.get("format") != META_FORMAT:
            raise BagError(f"{where}: custom_data {META_KEY} has format {raw.get('format') if isinstance(raw, dict) else raw!r}, "
                           f"expected {META_FORMAT!r}")
        try:
            return cls(**raw)
        except TypeError as exc:
            raise BagError(f"{where}: custom_data {META_KEY} does not match {META_FORMAT}: {exc}") from exc


# ------------------------------------------------------------------------------------------ types
def _msg_dir() -> Path:
    from robot_wm.paths import data_path

    return data_path("msg")


@functools.lru_cache(maxsize=1)
def typestore():
    """The Jazzy message store plus robot_wm's own messages (from msg/*.msg)."""
    from rosbags.typesys import Stores, get_types_from_msg, get_typestore

    store = get_typestore(Stores.ROS2_JAZZY)
    types = {}
    for path in sorted(_msg_dir().glob("*.msg")):
        types.update(get_types_from_msg(path.read_text(), f"robot_wm/msg/{path.stem}"))
    store.register(types)
    return store


def _stamp(t_ns: int):
    t = typestore().types
    return t["builtin_interfaces/msg/Time"](sec=int(t_ns // 1_000_000_000), nanosec=int(t_ns % 1_000_000_000))


def _header(t_ns: int, frame: str = ""):
    return typestore().types["std_msgs/msg/Header"](stamp=_stamp(t_ns), frame_id=frame)


def stamp_ns(header) -> int:
    """A message header's stamp in ns."""
    return int(header.stamp.sec) * 1_000_000_000 + int(header.stamp.nanosec)


class Messages:
    """Builders of the demonstration topics' messages (library mode writes what the nodes publish)."""

    def __init__(self) -> None:
        self.t = typestore().types

    def joint_state(self, t_ns: int, names, q, qd, effort):
        return self.t["sensor_msgs/msg/JointState"](
            header=_header(t_ns), name=list(names), position=np.asarray(q, dtype=np.float64),
            velocity=np.asarray(qd, dtype=np.float64), effort=np.asarray(effort, dtype=np.float64))

    def float64_array(self, values):
        layout = self.t["std_msgs/msg/MultiArrayLayout"](dim=[], data_offset=0)
        return self.t["std_msgs/msg/Float64MultiArray"](layout=layout, data=np.asarray(values, dtype=np.float64))

    def wrench(self, t_ns: int, frame: str, force, torque):
        v = self.t["geometry_msgs/msg/Vector3"]
        w = self.t["geometry_msgs/msg/Wrench"](force=v(*map(float, force)), torque=v(*map(float, torque)))
        return self.t["geometry_msgs/msg/WrenchStamped"](header=_header(t_ns, frame), wrench=w)

    def payload(self, t_ns: int, frame: str, mass_kg: float):
        """A tare as the safety filter publishes it: the mass only."""
        v = self.t["geometry_msgs/msg/Vector3"](0.0, 0.0, 0.0)
        inertia = self.t["geometry_msgs/msg/Inertia"](m=float(mass_kg), com=v, ixx=0.0, ixy=0.0, ixz=0.0, iyy=0.0,
                                                      iyz=0.0, izz=0.0)
        return self.t["geometry_msgs/msg/InertiaStamped"](header=_header(t_ns, frame), inertia=inertia)

    def point(self, t_ns: int, frame: str, p):
        return self.t["geometry_msgs/msg/PointStamped"](
            header=_header(t_ns, frame), point=self.t["geometry_msgs/msg/Point"](*map(float, p)))

    def reference(self, t_ns: int, frame: str, step_s: float, points_m, tool: str = "tool0"):
        """A reference window as the path sequencer publishes it (first point at the stamp)."""
        tr, v3 = self.t["geometry_msgs/msg/Transform"], self.t["geometry_msgs/msg/Vector3"]
        quat, dur = self.t["geometry_msgs/msg/Quaternion"], self.t["builtin_interfaces/msg/Duration"]
        point = self.t["trajectory_msgs/msg/MultiDOFJointTrajectoryPoint"]
        pts = []
        for k, p in enumerate(np.asarray(points_m, dtype=float)):
            ns = int(round(k * step_s * 1e9))
            pts.append(point(transforms=[tr(translation=v3(*map(float, p)), rotation=quat(0.0, 0.0, 0.0, 1.0))],
                             velocities=[], accelerations=[], time_from_start=dur(sec=ns // 1_000_000_000,
                                                                                   nanosec=ns % 1_000_000_000)))
        return self.t["trajectory_msgs/msg/MultiDOFJointTrajectory"](header=_header(t_ns, frame), joint_names=[tool],
                                                                     points=pts)

    def safety_status(self, t_ns: int, state: int, state_text: str, constraints, norm: float, fault_reason: str = "",
                      latches=()):
        return self.t["robot_wm/msg/SafetyStatus"](
            header=_header(t_ns), state=int(state), state_text=state_text, active_constraints=list(constraints),
            intervention_norm=float(norm), solver_status=0, solver_status_text="", iterations=0, solve_time_s=0.0,
            max_slack=0.0, fault_reason=fault_reason, fault_kind="", latches=list(latches))

    def trust(self, t_ns: int, score: float, level: int, phase: int, error: float, threshold: float, reason: str):
        return self.t["robot_wm/msg/TrustState"](header=_header(t_ns), score=float(score), level=int(level),
                                                 phase=int(phase), normalized_error=float(error),
                                                 threshold=float(threshold), reason=reason)

    def intervention_state(self, t_ns: int, active: bool, since_ns: int, reason: str, count: int):
        return self.t["robot_wm/msg/InterventionState"](header=_header(t_ns), active=bool(active),
                                                        since=_stamp(since_ns), reason=reason, count=int(count))

    def episode_result(self, t_ns: int, task: str, index: int, success: bool, error_m: float, duration_s: float):
        return self.t["robot_wm/msg/EpisodeResult"](header=_header(t_ns), task=task, index=int(index),
                                                    success=bool(success), error_m=float(error_m),
                                                    duration_s=float(duration_s))


# ------------------------------------------------------------------------------------------ writing
class EpisodeBagWriter:
    """Write one episode's bag: ``write``/``write_raw`` messages, then ``close(meta)``.

    The bag appears at ``path`` only when ``close`` succeeds (written under ``path.partial``).
    Use as a context manager: an exception aborts and removes the partial bag.
    """

    def __init__(self, path: Path) -> None:
        from rosbags.rosbag2 import StoragePlugin, Writer

        self.path = Path(path)
        if self.path.exists():
            raise BagError(f"{self.path}: already exists (one bag per episode; choose another --out)")
        # <name>.partial/<name>/ while writing: the storage file is named after its directory
        self._partial = self.path.with_name(self.path.name + ".partial")
        if self._partial.exists():
            shutil.rmtree(self._partial)
        self._partial.mkdir(parents=True)
        self._writer = Writer(self._partial / self.path.name, version=BAG_VERSION, storage_plugin=StoragePlugin.MCAP)
        self._writer.open()
        self._connections: dict[str, Any] = {}
        self.count = 0

    def _connection(self, topic: str):
        conn = self._connections.get(topic)
        if conn is None:
            if topic not in TOPICS:
                raise BagError(f"topic {topic!r} is not a demonstration topic ({', '.join(TOPICS)})")
            conn = self._writer.add_connection(topic, TOPICS[topic], typestore=typestore())
            self._connections[topic] = conn
        return conn

    def write(self, topic: str, t_ns: int, message) -> None:
        """Serialize and write ``message`` (a ``typestore()`` message) received at ``t_ns``."""
        self._connection(topic)  # an unknown topic is refused by name
        self.write_raw(topic, t_ns, typestore().serialize_cdr(message, TOPICS[topic]))

    def write_raw(self, topic: str, t_ns: int, data: bytes | memoryview) -> None:
        """Write an already CDR-serialized message (as rclpy's raw subscriptions deliver it)."""
        self._writer.write(self._connection(topic), int(t_ns), data)
        self.count += 1

    def close(self, meta: EpisodeMeta) -> Path:
        self._writer.set_custom_data(META_KEY, meta.to_json())
        self._writer.close()
        os.replace(self._partial / self.path.name, self.path)
        self._partial.rmdir()
        return self.path

    def abort(self) -> None:
        try:
            self._writer.close()
        except Exception:  # noqa: BLE001 - best effort: the partial bag is removed below either way
            pass
        shutil.rmtree(self._partial, ignore_errors=True)

    def __enter__(self) -> "EpisodeBagWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()


# ------------------------------------------------------------------------------------------ reading
@dataclass
class Episode:
    """One demonstration bag, decoded: arrays on the bag's own clock (ns)."""

    path: Path
    meta: EpisodeMeta
    topics: dict[str, int]  # topic -> message count
    state_t_ns: np.ndarray  # (S,) header stamps of /joint_states, moved onto the bag's clock (see read_episode)
    q_rad: np.ndarray  # (S, N) in meta.joint_names order
    qdot_radps: np.ndarray
    effort_nm: np.ndarray
    command_t_ns: np.ndarray  # (C,) receive times of the applied commands
    command_radps: np.ndarray  # (C, N)
    reference: list[tuple[int, float, np.ndarray]]  # (stamp ns, step s, points (P, 3)) per window
    goals: list[tuple[int, np.ndarray]]  # (stamp ns, point) for reach
    sha256: str  # of the bag's files (the lineage of a model trained on it)
    status_t_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # SafetyStatus receive times
    status_state: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # ... and its state
    #: SafetyStatus header stamps, moved onto the bag's clock like the joint states': the filter stamps one
    #: with each command it sends, so these are the commands' send times (a recorder's stall does not move them)
    status_stamp_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    #: the safety filter's tare in force (the last /robot_wm/payload in the bag, kg; None: none recorded)
    payload_kg: float | None = None

    @property
    def duration_s(self) -> float:
        return self.meta.duration_s


def bag_sha256(path: Path) -> str:
    """Content hash of a bag directory (its files, by name)."""
    digest = hashlib.sha256()
    for f in sorted(Path(path).iterdir()):
        if f.is_file():
            digest.update(f.name.encode())
            with f.open("rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(chunk)
    return digest.hexdigest()


def list_bags(directory: Path) -> tuple[list[Path], list[Path]]:
    """(bag directories, broken ones), sorted. Broken: an interrupted recording (``.partial``) or
    any other sub-directory without a metadata.yaml (e.g. storage whose recorder died first):
    never passed over silently (``demos inspect`` lists them, the loader refuses the directory)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise BagError(f"demonstrations directory not found: {directory}")
    bags, broken = [], []
    for p in sorted(directory.iterdir()):
        if not p.is_dir():
            continue
        if p.name.endswith(".partial") or not (p / "metadata.yaml").is_file():
            broken.append(p)
        else:
            bags.append(p)
    return bags, broken


def broken_reason(path: Path) -> str:
    return ("interrupted recording (.partial): not a demonstration" if path.name.endswith(".partial")
            else "no metadata.yaml (not a rosbag2 bag, or its recording was cut off)")


def read_meta(path: Path) -> EpisodeMeta:
    """The episode metadata of a bag, from its metadata.yaml alone (cheap)."""
    import yaml

    path = Path(path)
    if path.name.endswith(".partial"):
        raise BagError(f"{path}: an interrupted recording (.partial): no metadata, not a demonstration")
    meta_file = path / "metadata.yaml"
    if not meta_file.is_file():
        raise BagError(f"{path}: no metadata.yaml (not a rosbag2 bag, or truncated)")
    try:
        info = (yaml.safe_load(meta_file.read_text()) or {})["rosbag2_bagfile_information"]
        if not isinstance(info, dict):
            raise TypeError(f"rosbag2_bagfile_information is a {type(info).__name__}")
        custom_data = info.get("custom_data") or {}
        if not isinstance(custom_data, dict):
            raise TypeError(f"custom_data is a {type(custom_data).__name__}")
    except (yaml.YAMLError, KeyError, TypeError, UnicodeDecodeError, OSError) as exc:
        raise BagError(f"{meta_file}: not rosbag2 metadata ({type(exc).__name__}: {exc})") from exc
    custom = custom_data.get(META_KEY)
    if custom is None:
        raise BagError(f"{path}: no {META_KEY} in custom_data (not recorded by robot-wm record)")
    return EpisodeMeta.from_json(custom, str(meta_file))


def read_episode(path: Path, joint_names: Iterable[str] | None = None) -> Episode:
    """Decode a demonstration bag; ``BagError`` naming the bag for anything unusable.

    Checks: complete (not .partial), readable (corrupt or truncated storage is named), holds the
    required topics with finite values for every joint of ``joint_names`` (default: the bag's own).
    """
    from rosbags.rosbag2 import Reader
    from rosbags.rosbag2.errors import ReaderError

    path = Path(path)
    meta = read_meta(path)
    names = list(joint_names) if joint_names is not None else list(meta.joint_names)
    store = typestore()
    topics: dict[str, int] = {}
    st_t, st_log, st_q, st_v, st_e, cmd_t, cmd_v, ref, goals = [], [], [], [], [], [], [], [], []
    status_t, status_state, status_stamp = [], [], []
    payload_kg = None
    try:
        with Reader(path) as reader:
            for conn in reader.connections:
                topics[conn.topic] = topics.get(conn.topic, 0) + conn.msgcount
            wanted = [c for c in reader.connections if c.topic in TOPICS and c.topic in
                      (STATES_TOPIC, COMMAND_TOPIC, TARGET_TOPICS["track"], TARGET_TOPICS["reach"], STATUS_TOPIC,
                       PAYLOAD_TOPIC)]
            for conn, t_ns, raw in reader.messages(connections=wanted):
                msg = store.deserialize_cdr(raw, conn.msgtype)
                if conn.topic == STATES_TOPIC:
                    order = _order(list(msg.name), names, path)
                    n_msg = len(msg.name)
                    for field_name in ("position", "velocity"):
                        if len(getattr(msg, field_name)) != n_msg:
                            raise BagError(f"{path}: {STATES_TOPIC} at {t_ns} ns has {len(getattr(msg, field_name))} "
                                           f"{field_name} values for {n_msg} joints (a demonstration needs both)")
                    st_t.append(stamp_ns(msg.header))
                    st_log.append(t_ns)
                    st_q.append(np.asarray(msg.position, float)[order])
                    st_v.append(np.asarray(msg.velocity, float)[order])
                    st_e.append(np.asarray(msg.effort, float)[order] if len(msg.effort) == n_msg
                                else np.full(len(names), np.nan))
                elif conn.topic == COMMAND_TOPIC:
                    data = np.asarray(msg.data, float)
                    if data.shape != (len(names),):
                        raise BagError(f"{path}: {COMMAND_TOPIC} message at {t_ns} ns has {data.size} values, "
                                       f"expected {len(names)}")
                    cmd_t.append(t_ns)
                    cmd_v.append(data)
                elif conn.topic == PAYLOAD_TOPIC:
                    from robot_wm.core.trust.effort import PAYLOAD_RANGE_KG, plausible_payload

                    if not plausible_payload(msg.inertia.m):
                        raise BagError(f"{path}: {PAYLOAD_TOPIC} at {t_ns} ns has mass {msg.inertia.m!r} kg (a tare: "
                                       f"{PAYLOAD_RANGE_KG[0]:g}..{PAYLOAD_RANGE_KG[1]:g} kg)")
                    payload_kg = float(msg.inertia.m)
                elif conn.topic == STATUS_TOPIC:
                    status_t.append(t_ns)
                    status_state.append(int(msg.state))
                    status_stamp.append(stamp_ns(msg.header))
                elif conn.topic == TARGET_TOPICS["track"]:
                    pts = np.array([[p.transforms[0].translation.x, p.transforms[0].translation.y,
                                     p.transforms[0].translation.z] for p in msg.points], float).reshape(-1, 3)
                    step = 0.0
                    if len(msg.points) > 1:
                        d = msg.points[1].time_from_start
                        step = d.sec + d.nanosec * 1e-9
                    ref.append((stamp_ns(msg.header), step, pts))
                else:
                    goals.append((stamp_ns(msg.header), np.array([msg.point.x, msg.point.y, msg.point.z])))
    except BagError:
        raise
    except (ReaderError, Exception) as exc:  # noqa: BLE001 - rosbags and the MCAP reader raise many kinds on bad files
        raise BagError(f"{path}: cannot read the bag ({type(exc).__name__}: {exc}); truncated or corrupt?") from exc
    for topic in REQUIRED_TOPICS:
        if not topics.get(topic):
            raise BagError(f"{path}: no {topic} messages (a demonstration needs {', '.join(REQUIRED_TOPICS)})")
    arrays = [np.asarray(a, float) for a in (st_q, st_v, st_e)]
    for label, a in zip(("position", "velocity"), arrays[:2]):
        if not np.all(np.isfinite(a)):
            raise BagError(f"{path}: {STATES_TOPIC} holds non-finite {label} values")
    if not np.all(np.isfinite(cmd_v)):
        raise BagError(f"{path}: {COMMAND_TOPIC} holds non-finite values")
    # Commands carry receive times (the recorder's clock), joint states the arm's stamps. On one
    # host the two differ by the transport latency; across hosts also by the clock offset. The
    # median receive-minus-stamp of the joint states estimates both: the states (and the episode's
    # bounds, stamped by the sequencer beside the arm) move onto the receive clock, once per bag.
    offset = int(np.median(np.asarray(st_log, np.int64) - np.asarray(st_t, np.int64))) if st_t else 0
    meta.start_ns, meta.end_ns = meta.start_ns + offset, meta.end_ns + offset
    meta.extra = dict(meta.extra, clock_offset_ns=offset)
    cmd_order = np.argsort(np.asarray(cmd_t, np.int64), kind="stable")
    return Episode(path, meta, topics, np.asarray(st_t, np.int64) + offset, *arrays,
                   np.asarray(cmd_t, np.int64)[cmd_order],
                   np.asarray(cmd_v, float).reshape(-1, len(names))[cmd_order], ref, goals, bag_sha256(path),
                   np.asarray(status_t, np.int64), np.asarray(status_state, np.int64),
                   np.asarray(status_stamp, np.int64) + offset, payload_kg)


def _order(msg_names: list[str], names: list[str], path: Path) -> np.ndarray:
    try:
        return np.array([msg_names.index(n) for n in names])
    except ValueError:
        missing = [n for n in names if n not in msg_names]
        raise BagError(f"{path}: {STATES_TOPIC} lacks joint(s) {', '.join(missing)} (has {', '.join(msg_names)}): "
                       f"recorded on another robot?") from None


def iter_episodes(directory: Path, joint_names: Iterable[str] | None = None) -> Iterator[Episode]:
    """Every complete bag of a directory, decoded in name order (partial ones are an error)."""
    bags, broken = list_bags(directory)
    if broken:
        raise BagError(f"{directory}: {', '.join(f'{p.name} ({broken_reason(p)})' for p in broken)}: "
                       f"delete or move them, or record again")
    for path in bags:
        yield read_episode(path, joint_names)
