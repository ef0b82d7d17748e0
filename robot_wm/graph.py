"""The node graph, defined once in config/graph.yaml and turned into a process plan here.

``plan(hardware)`` is the single source for both ways of bringing robot_wm up:
launch/bringup.launch.py maps each ProcessSpec to a ``launch_ros.actions.Node``; ``robot-wm up``
starts the specs that have a Python module as subprocesses. Tests check the plan directly.
"""
from __future__ import annotations

import math

import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from robot_wm.paths import config_path

EMBEDDED = "mujoco"
KNOWN_HARDWARE = ("mock", "gazebo", "topic_based", "mujoco", "example")
SAFETY_FILTER = "safety_filter"
TRUST_MONITOR = "trust_monitor"
LEARNER = "adaptation"
POLICY = "policy"
WORLD_MODEL = "world_model"
TASKS = ("reach", "track")
_PHASE_SIM, _PHASE_REAL, _LEVEL_STOP = 0, 2, 3  # msg/TrustState.msg PHASE_SIM, PHASE_REAL, LEVEL_STOP
EXAMPLE = "example"  # the driver kit's imaginary arm (robot_wm.nodes.example_arm)
SIMULATED_HARDWARE = (EMBEDDED, EXAMPLE, "mock", "gazebo")  # a policy in phase SIM may run on these (not on a real arm)
PYTHON_ARMS = (EMBEDDED, EXAMPLE)  # simulated arms with a Python driver: `robot-wm up` runs them, enable is allowed
# parameters the stack needs for an arm that differs from the embedded one (the imaginary arm has no F/T sensor)
_ARM_STACK_PARAMETERS = {EXAMPLE: {"safety_filter": {"force_sensor": False}}}


class GraphError(ValueError):
    """config/graph.yaml is malformed; the message names the entry and field."""


@dataclass(frozen=True)
class ProcessSpec:
    """One process of the graph: what to start, with which parameters."""

    name: str
    package: str
    executable: str
    module: str | None = None
    param_files: tuple[Path, ...] = ()
    arguments: tuple[str, ...] = ()
    parameters: dict[str, Any] = field(default_factory=dict)
    composes: tuple[str, ...] = ()  # node names a composed process hosts (their names are not remapped)
    node_parameters: dict[str, dict[str, Any]] = field(default_factory=dict)  # per hosted node, beyond ``parameters``
    fallback: ProcessSpec | None = None  # started instead where ``package`` is not installed (graph.yaml)

    @property
    def needs_ros_install(self) -> bool:
        """True when only a ROS 2 install can start it (no Python module of robot_wm)."""
        return self.module is None


_ALLOWED_KEYS = {"name", "package", "executable", "module", "params", "arguments", "description", "fallback"}
_FALLBACK_KEYS = {"package", "executable", "module"}


def _parse_entry(entry: Any, where: str) -> tuple[ProcessSpec, bool]:
    if not isinstance(entry, dict):
        raise GraphError(f"{where}: expected a mapping, got {entry!r}")
    unknown = set(entry) - _ALLOWED_KEYS
    if unknown:
        raise GraphError(f"{where}: unknown keys {sorted(unknown)}; allowed: {sorted(_ALLOWED_KEYS)}")
    for key in ("name", "package", "executable"):
        if not isinstance(entry.get(key), str) or not entry[key]:
            raise GraphError(f"{where}: field {key!r} must be a non-empty string, got {entry.get(key)!r}")
    params = entry.get("params", [])
    if not isinstance(params, list):
        raise GraphError(f"{where}: field 'params' must be a list of file names in config/, got {params!r}")
    fallback = entry.get("fallback")
    if fallback is not None:
        if not isinstance(fallback, dict) or set(fallback) - _FALLBACK_KEYS or not all(
                isinstance(fallback.get(k), str) and fallback[k] for k in _FALLBACK_KEYS):
            raise GraphError(f"{where}: field 'fallback' must map exactly {sorted(_FALLBACK_KEYS)} to non-empty "
                             f"strings (a node the pip path can start), got {fallback!r}")
        fallback = ProcessSpec(entry["name"], fallback["package"], fallback["executable"], fallback["module"])
    spec = ProcessSpec(
        name=entry["name"],
        package=entry["package"],
        executable=entry["executable"],
        module=entry.get("module"),
        param_files=tuple(config_path(p) for p in params),
        arguments=tuple(str(a) for a in entry.get("arguments", [])),
        fallback=fallback,
    )
    return spec, bool(entry.get("description", False))


def _compose(specs: list[ProcessSpec], entry: Any) -> list[ProcessSpec]:
    """Replace the nodes listed in the graph's ``composed`` entry by one process hosting them all."""
    if not isinstance(entry, dict) or not isinstance(entry.get("nodes"), list) or not entry["nodes"]:
        raise GraphError("graph.yaml: 'composed' must map name, package, executable, module and a non-empty nodes list")
    members = [s for s in specs if s.name in entry["nodes"]]
    missing = sorted(set(entry["nodes"]) - {s.name for s in members})
    if missing:
        raise GraphError(f"graph.yaml composed.nodes names {missing}, which are not in the stack")
    params: list[Path] = []
    for s in members:
        params += [p for p in s.param_files if p not in params]
    # what every hosted node gets alike (the plan's overrides), and what one of them gets alone
    # (the safety filter's own period at --filter-rate, its default phase): as when separate
    shared = {k: v for k, v in members[0].parameters.items()
              if all(k in o.parameters and o.parameters[k] == v for o in members[1:])}
    own = {s.name: {k: v for k, v in s.parameters.items() if k not in shared} for s in members}
    merged = ProcessSpec(entry["name"], entry["package"], entry["executable"], entry.get("module"), tuple(params),
                         parameters=shared, composes=tuple(s.name for s in members),
                         node_parameters={name: p for name, p in own.items() if p})
    first = specs.index(members[0])
    rest = [s for s in specs if s not in members]
    return rest[:first] + [merged] + rest[first:]


def shipped_policy(task: str) -> bool:
    """True when the package ships a learned policy for ``task`` (models/ or models/track/)."""
    from robot_wm.paths import data_path

    parts = ("models", "policy.onnx") if task == "reach" else ("models", "track", "policy.onnx")
    return Path(data_path(*parts, must_exist=False)).is_file()


def policy_overrides(task: str, who: str = "robot_wm") -> dict[str, Any]:
    """Parameters for a task without a shipped learned policy: the policy node runs the task's
    scripted baseline (``scripted: true``), said once on stdout. Empty when one is shipped."""
    if shipped_policy(task):
        return {}
    print(f"{who} ({task}): no learned {task} policy is shipped; the policy node runs the task's scripted "
          "baseline through the same stack (scripted: true)", flush=True)
    return {"scripted": True}


def load_graph(path: Path | None = None) -> dict[str, Any]:
    """Read and validate config/graph.yaml (or ``path``)."""
    path = path or config_path("graph.yaml")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise GraphError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise GraphError(f"{path}: expected a mapping with keys hardware, common, stack")
    for key in ("hardware", "common", "stack"):
        if key not in data:
            raise GraphError(f"{path}: missing top-level key {key!r}")
    hardware = data["hardware"]
    if not isinstance(hardware, dict) or EMBEDDED not in hardware or "ros2_control" not in hardware:
        raise GraphError(f"{path}: 'hardware' must map at least '{EMBEDDED}' and 'ros2_control' to node lists")
    return data


def plan(
    hardware: str = EMBEDDED,
    *,
    hardware_params: str = "",
    graph_path: Path | None = None,
    overrides: dict[str, Any] | None = None,
    composed: bool = False,
    stack: bool = True,
    enable: bool = False,
    task: str = "reach",
    trust: bool = True,
    learn: bool = False,
    filter_rate_hz: float | None = None,
    installed: Callable[[str], bool] | None = None,
    warn: Callable[[str], None] | None = None,
    fallbacks: bool | None = None,
) -> list[ProcessSpec]:
    """Return the processes that bring up robot_wm on ``hardware``.

    Args:
        hardware: mujoco (embedded arm), mock, gazebo, topic_based, or a ros2_control plugin name.
        hardware_params: extra plugin parameters for the description, ``"name=value;name2=value2"``.
        graph_path: alternative graph file (tests).
        overrides: parameters set on every robot_wm node (e.g. ``{"profile": "real_twin"}`` for arm_sim).
        composed: run the graph's ``composed.nodes`` in one process (config/graph.yaml ``composed``).
        stack: include the control stack (False: only the hardware side, e.g. for driving the arm directly).
        trust: include the trust monitor (False: the filter runs on its configured default trust level,
            e.g. to exercise the filter alone; the product graph has it).
        learn: include the online learner of the world model (graph.yaml ``learner``; it adapts the
            task's active model set in the registry and announces updates the nodes swap in).
        enable: let the safety filter release its start latch by itself (``enable_on_start``);
            allowed on the embedded and example arms only — on hardware an operator enables it.
        task: the task the stack runs ("reach": goal_sequencer, "track": path_sequencer; graph.yaml
            ``tasks``); the policy node gets it as its ``task`` parameter.
        filter_rate_hz: the safety filter's own rate (its ``control_period_s``), e.g. 500 for the arm's
            joint-state rate while the policy and world model stay at theirs; None: the graph's. Above
            the world model's rate the filter ages the model's newest linearization
            (robot_wm.core.safety.multirate).
        installed: whether a ROS package can be started (the launch file passes an ament index
            lookup). None: only what has a Python module (the pip path, ``robot-wm up``). An entry
            with a ``fallback`` whose package cannot be started is replaced by its fallback.
        warn: told of each such replacement (one line a person can read).
        fallbacks: False leaves such entries out instead (robot_wm's state publisher costs about a
            fifth of a core at the arm's 500 Hz). None: ``$ROBOT_WM_FALLBACKS`` != "0" (the test
            harness sets 0 so the 2 cores go to what each test measures; the TF tests pass True).
    Returns:
        ProcessSpecs in start order: hardware, common nodes, then the control stack.

    The trust monitor gets ``simulated_arm`` (the embedded arm, mock, gazebo: a policy in phase SIM
    may run there, on any other hardware the monitor holds it until promoted) and ``task``; the
    world model node and the safety filter get ``task`` too (the registry's active set of the task
    gives both their default world model, robot_wm.registry.resolve).
    The safety filter also gets ``default_phase`` from the hardware (SIM on the embedded arm, REAL
    on every other), and ``default_trust_level`` STOP whenever the graph has a trust monitor (the
    arm must not move before the monitor has spoken).
    """
    from robot_wm import description  # xacro is needed only when a node takes the description

    if not hardware or any(c.isspace() for c in hardware):
        raise GraphError(f"hardware {hardware!r}: expected mock, gazebo, topic_based, mujoco or a plugin name")
    if enable and hardware not in PYTHON_ARMS:
        raise GraphError(f"enable (enable_on_start) is for the embedded arm only, not hardware {hardware!r}: "
                         "on hardware an operator enables the safety filter (robot-wm reset)")
    if task not in TASKS:
        raise GraphError(f"task {task!r}: expected one of {list(TASKS)}")
    if filter_rate_hz is not None:
        from robot_wm.core.task import load_task

        rate = 1.0 / load_task().control_dt_s  # the policy's and world model's (config/task.yaml)
        k = filter_rate_hz / rate if isinstance(filter_rate_hz, (int, float)) else math.nan
        if not (1.0 <= k and filter_rate_hz <= 1000.0 and abs(k - round(k)) <= 1e-6 * k):
            raise GraphError(f"filter rate {filter_rate_hz!r} Hz: expected a whole multiple of the control rate "
                             f"{rate:g} Hz up to 1000 Hz (e.g. 500, the arm's joint-state rate)")
    data = load_graph(graph_path)
    group = hardware if hardware in data["hardware"] else "ros2_control"
    entries = [(f"hardware.{group}[{i}]", e) for i, e in enumerate(data["hardware"][group] or [])]
    entries += [(f"common[{i}]", e) for i, e in enumerate(data["common"] or [])]
    if stack:
        entries += [(f"stack[{i}]", e) for i, e in enumerate(data["stack"] or [])]
        entries += [(f"tasks.{task}[{i}]", e) for i, e in enumerate((data.get("tasks") or {}).get(task) or [])]
        if learn:
            entries += [(f"learner[{i}]", e) for i, e in enumerate(data.get("learner") or [])]
    if not trust:
        entries = [(w, e) for w, e in entries if not (isinstance(e, dict) and e.get("name") == TRUST_MONITOR)]
    specs = []
    for where, entry in entries:
        spec, wants_description = _parse_entry(entry, f"graph.yaml {where}")
        params: dict[str, Any] = {}
        if wants_description:
            params["robot_description"] = description.expand(
                hardware=hardware, hardware_params=hardware_params, controllers_file=str(config_path("controllers.yaml"))
            )
        if overrides and spec.package == "robot_wm":
            params.update(overrides)
        if spec.name == POLICY:  # the task, and the phase whose acceleration box its slew limit uses
            params["task"] = task
            params["phase"] = _PHASE_SIM if hardware in PYTHON_ARMS else _PHASE_REAL
        if spec.name == TRUST_MONITOR:  # whether the arm is a simulator, the task whose normal operation it knows
            params["simulated_arm"] = hardware in SIMULATED_HARDWARE
            params["task"] = task
            if hardware == EMBEDDED and "payload_com_m" not in (overrides or {}):  # (a tare measures the mass only)
                from robot_wm.sim.profiles import load_profile

                params["payload_com_m"] = [float(c) for c in load_profile(params.get("profile", "nominal")).payload_com_m]
        if spec.name in (WORLD_MODEL, SAFETY_FILTER, LEARNER):  # the task's active world model: the same file
            params["task"] = task
        if spec.name == LEARNER:  # never real-time: its training would take the control path's CPU (it runs at nice)
            params.pop("realtime_priority", None)
        params.update(_ARM_STACK_PARAMETERS.get(hardware, {}).get(spec.name, {}))
        if spec.name == SAFETY_FILTER:
            params["default_phase"] = _PHASE_SIM if hardware in PYTHON_ARMS else _PHASE_REAL
            if filter_rate_hz is not None:
                params["control_period_s"] = 1.0 / float(filter_rate_hz)
            if enable:
                params["enable_on_start"] = True
        if spec.fallback is not None and not (spec.module is not None if installed is None else installed(spec.package)):
            if not (os.environ.get("ROBOT_WM_FALLBACKS", "1") != "0" if fallbacks is None else fallbacks):
                continue
            fb = spec.fallback
            if warn is not None:
                warn(f"package {spec.package!r} not found: {fb.package}'s {fb.executable} runs as {spec.name} instead")
            spec = replace(spec, package=fb.package, executable=fb.executable, module=fb.module, fallback=None)
        specs.append(ProcessSpec(spec.name, spec.package, spec.executable, spec.module, spec.param_files, spec.arguments, params))
    if any(s.name == TRUST_MONITOR for s in specs):
        specs = [replace(s, parameters={**s.parameters, "default_trust_level": _LEVEL_STOP})
                 if s.name == SAFETY_FILTER else s for s in specs]
    if composed and stack:
        specs = _compose(specs, data.get("composed"))
    names = [s.name for s in specs]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise GraphError(f"graph.yaml: node names used twice for hardware {hardware!r}: {duplicates}")
    return specs
