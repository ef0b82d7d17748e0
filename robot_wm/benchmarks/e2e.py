"""``robot-wm bench e2e``: the stack under ROS, end to end — missed periods, latency, CPU and memory per process.

The processes of ``robot-wm up`` [--composed] (config/graph.yaml through ``robot_wm.graph.plan``) on
the embedded arm, in a ROS domain of this run's own and a state directory of its own (phase files,
registry), owned by a ``robot_wm.process_group.ProcessGroup`` (SIGINT, then SIGKILL, in a
``finally``). Two measurements per configuration:

* **in the chain**: the safety_filter process (or the composed one) is started through this file
  (``--child``), which sets the node's supported timing hook (``SafetyFilterNode.period_hook``) to
  record wall-clock ``time.time_ns()``: the ``header.stamp`` of the JointState each control step
  consumed, when the step began and when the command was handed to ``publish()``. Latency =
  command publish call − consumed JointState stamp; missed periods = intervals between
  consecutive command publishes longer than 1.5 of the filter's periods.
* **external**: an observer in this process subscribes to /joint_states and the commands with
  ``(msg, MessageInfo)`` callbacks: latency = the command's DDS ``source_timestamp`` − the stamp of
  the newest JointState sent before it.

Plus the CPU (% of one core, /proc/<pid>/stat) and memory (RSS, PSS, USS) of every process.
``--baseline REF`` runs the same configuration with the node processes of another revision of the
code (``git archive`` into a temporary tree, first on their PYTHONPATH) right after ours, and gives
ratios (baseline / ours). ``bench/bench_control_path.py`` runs this engine at several rates and
modes. Prints a table, then ONE JSON object (the last line).
"""
from __future__ import annotations

import argparse
import atexit
import dataclasses
import importlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

MAIN_MODES = ("separate", "composed")  # the shipped executor (runner.make_executor's default: EventsExecutor)
BASELINE_MODES = ("separate_single", "composed_single")  # the same stacks with ROBOT_WM_EXECUTOR=single
MODES = MAIN_MODES + BASELINE_MODES
EXECUTOR_ENV = "ROBOT_WM_EXECUTOR"  # read by robot_wm.nodes.runner.make_executor
EXECUTOR_CLASS = {"events": "EventsExecutor", "single": "SingleThreadedExecutor"}
CONTROL_NODES = ("safety_filter", "world_model", "policy")
COMMAND_TOPIC = "/forward_velocity_controller/commands"
ARM_DEFAULT_RATE_HZ = 500.0
ARM_MAX_RATE_HZ = 1000.0  # arm_sim's declared range of publish_rate_hz ends here
PERIOD_RANGE_S = (0.001, 0.1)  # ControlNode's declared range of control_period_s (1 kHz is allowed)


def _child(argv: list[str]) -> int:
    """``--child MODULE RECORD_PATH --ros-args ...``: run a node module with the filter instrumented.

    The SafetyFilterNode's timing hook (``SafetyFilterNode.period_hook``) notes the wall-clock
    times of every period (see the module docstring). The executor is whatever the runner's ``make_executor``
    builds from $ROBOT_WM_EXECUTOR (set by the parent per mode); a pass-through wrapper only
    notes its class. The records are written when the process stops (SIGINT), the executor's
    class next to them (RECORD_PATH with the suffix .executor).
    """
    module, record_path = argv[0], argv[1]
    ros_args = argv[2:]
    from robot_wm.nodes import runner
    from robot_wm.nodes.safety_filter_node import SafetyFilterNode as cls

    records: list[tuple[int, int, int, int, int]] = []
    built: list[str] = []
    orig_make_executor = runner.make_executor

    def record(r) -> None:  # SafetyFilterNode's supported timing hook
        records.append((r.state_stamp_ns, r.state_received_ns, r.step_start_ns, r.publish_ns, r.state))

    def make_executor(context, kind=None):  # selection unchanged: only note what was built
        executor = orig_make_executor(context, kind)
        built.append(type(executor).__name__)
        return executor

    cls.period_hook = staticmethod(record)  # a class attribute: not a method of the node
    runner.make_executor = make_executor
    sys.argv = [module, *ros_args]
    def save() -> None:
        np.save(record_path, np.asarray(records, dtype=np.int64).reshape(-1, 5))
        Path(record_path).with_suffix(".executor").write_text(",".join(built))

    # at exit, however the process ends: the entry point by runner.exit_process (the atexit handlers, then
    # os._exit), a baseline revision's by SystemExit and then this process's own exit
    atexit.register(save)
    code: Any = 0
    try:
        importlib.import_module(module).main()
    except SystemExit as exc:
        code = exc.code
    return int(code or 0)


def executor_kind(mode: str) -> str:
    """The executor a mode runs its node processes on: "single" for the *_single baselines, else "events"."""
    return "single" if mode.endswith("_single") else "events"


def mode_env(mode: str, env: dict[str, str]) -> dict[str, str]:
    """The node processes' environment for ``mode``: the shipped default (no $ROBOT_WM_EXECUTOR) or =single."""
    env = dict(env)
    env.pop(EXECUTOR_ENV, None)
    if executor_kind(mode) == "single":
        env[EXECUTOR_ENV] = "single"
    return env


def _specs_for(mode: str, rate_hz: float, filter_rate_hz: float | None = None,
               realtime_priority: int = 0, step_on_state: bool | None = None) -> tuple[list, float]:
    """The ProcessSpecs of ``robot-wm up`` [--composed] with the control period set; return (specs, arm rate).

    ``control_period_s`` goes in as a plan override, which ``command_for`` hands to every hosted node
    of the composed process (node-qualified ``-p``); nodes that do not declare it ignore it.
    ``filter_rate_hz``: the safety filter's own period (``_command`` appends it for that node only).
    ``realtime_priority``: SCHED_FIFO for the arm and control processes (robot_wm.realtime).
    """
    from robot_wm.graph import plan

    fastest = max(rate_hz, filter_rate_hz or 0.0)
    arm_rate = min(max(ARM_DEFAULT_RATE_HZ, fastest), ARM_MAX_RATE_HZ)
    specs = []
    overrides: dict = {"control_period_s": 1.0 / rate_hz}
    if realtime_priority:
        overrides["realtime_priority"] = int(realtime_priority)
    if step_on_state is not None:  # else config/control.yaml's
        overrides["step_on_state"] = bool(step_on_state)
    if abs(rate_hz - 100.0) > 1e-9 or (filter_rate_hz and filter_rate_hz < 100.0 - 1e-9):
        # the shipped world model predicts 10 ms steps: a filter slower than that refuses to start
        # with it (require_model) and is benchmarked with its kinematic model instead; a faster one
        # (--filter-rate 500) uses the model's newest linearization, aged (core.safety.multirate)
        overrides["require_model"] = False
    for s in plan("mujoco", composed=mode.startswith("composed"), overrides=overrides, enable=True):
        if s.needs_ros_install:
            continue  # robot_state_publisher: not started by `robot-wm up` without a ROS install either
        if s.name == "arm_sim":
            s = dataclasses.replace(s, parameters={**s.parameters, "publish_rate_hz": float(arm_rate)})
        specs.append(s)
    return specs, arm_rate


def _command(spec, record: Path | None, filter_rate_hz: float | None = None) -> list[str]:
    """``command_for(spec)``; the safety_filter (or composed) process via ``--child`` when ``record`` is given,
    and with the filter's own ``control_period_s`` when ``filter_rate_hz`` is given (the last -p wins)."""
    from robot_wm.process_group import command_for

    cmd = command_for(spec)
    hosts_filter = spec.name == "safety_filter" or "safety_filter" in spec.composes
    if record is not None and hosts_filter:
        # this file by path: it imports only numpy at the top, so it runs against any tree's robot_wm
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", spec.module, str(record),
               *cmd[cmd.index("--ros-args"):]]
    if filter_rate_hz and hosts_filter:
        cmd += ["-p", f"safety_filter:control_period_s:={1.0 / filter_rate_hz!r}"]
    return cmd


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (/proc/<pid>/stat); 0.0 when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def memory_of(pid: int) -> dict[str, float]:
    """RSS, PSS and USS of a process in MiB (psutil when installed, else /proc/<pid>/smaps_rollup)."""
    try:
        import psutil

        info = psutil.Process(pid).memory_full_info()
        return {"rss_mib": info.rss / 2**20, "pss_mib": info.pss / 2**20, "uss_mib": info.uss / 2**20,
                "source": "psutil"}
    except ImportError:
        pass
    fields: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        parts = line.split()
        if len(parts) >= 2 and parts[1].isdigit():
            fields[parts[0].rstrip(":")] = int(parts[1])  # kB
    uss = fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0)
    return {"rss_mib": fields.get("Rss", 0) / 1024, "pss_mib": fields.get("Pss", 0) / 1024, "uss_mib": uss / 1024,
            "source": "/proc/smaps_rollup"}


class Recorder:
    """Observer in this process: /joint_states (stamp, source time) and commands (source, receive time)."""

    def __init__(self, context) -> None:
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.node import Node
        from rclpy.qos import QoSProfile, ReliabilityPolicy
        from sensor_msgs.msg import JointState
        from std_msgs.msg import Float64MultiArray

        from robot_wm.nodes.runner import SpinThread

        self.node = Node("bench_control_path_observer", context=context)
        qos = QoSProfile(depth=200, reliability=ReliabilityPolicy.RELIABLE)
        self.js: list[tuple[int, int]] = []
        self.cmd: list[tuple[int, int]] = []
        self.moving = False  # a non-zero command was seen: the policy's nominal got through the filter
        self.node.create_subscription(JointState, "/joint_states", self._on_js, qos)
        self.node.create_subscription(Float64MultiArray, COMMAND_TOPIC, self._on_cmd, qos)
        # the observer is not a robot_wm node: it stays on rclpy's plain SingleThreadedExecutor in every mode
        self.executor = SingleThreadedExecutor(context=context)
        self.executor.add_node(self.node)
        self.spinner = SpinThread(self.executor)

    def _on_js(self, msg, info) -> None:
        self.js.append((msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec, info["source_timestamp"]))

    def _on_cmd(self, msg, info) -> None:
        self.cmd.append((info["source_timestamp"], info["received_timestamp"]))
        if not self.moving and any(msg.data):
            self.moving = True

    def clear(self) -> None:
        self.js, self.cmd, self.moving = [], [], False

    def close(self) -> None:
        self.spinner.stop()
        self.executor.remove_node(self.node)
        self.node.destroy_node()
        self.executor.shutdown(timeout_sec=1.0)


def _gaps(times_ns: np.ndarray, period_s: float) -> dict[str, Any]:
    """Inter-arrival stats and missed periods (intervals > 1.5 periods) of a sorted time series."""
    from robot_wm.benchmarks.hotpath import stats_us

    if times_ns.size < 2:
        return {"n": int(times_ns.size), "missed": 0, "missed_pct": math.nan, "rate_hz": math.nan,
                "interval": stats_us([])}
    d = np.diff(times_ns)
    missed = int(np.sum(d > 1.5 * period_s * 1e9))
    return {"n": int(times_ns.size), "missed": missed, "missed_pct": 100.0 * missed / d.size,
            "rate_hz": float(d.size / ((times_ns[-1] - times_ns[0]) * 1e-9)), "interval": stats_us(d)}


def _tail(path: Path, lines: int = 3) -> str:
    try:
        text = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    errors = [ln.strip() for ln in text if "Error" in ln or "Exception:" in ln or "error" in ln]
    return " | ".join((errors or text)[-lines:])[-600:]


def run_config(mode: str, rate_hz: float, seconds: float, warmup: float, recorder: Recorder, env: dict[str, str],
               workdir: Path, instrument: bool, startup_timeout: float = 90.0, filter_rate_hz: float | None = None,
               code: Path | None = None, tag: str | None = None, realtime_priority: int = 0,
               step_on_state: bool | None = None) -> dict[str, Any]:
    """Start the stack for one (mode, rate), measure for ``seconds`` after ``warmup``, stop it; return numbers.

    ``filter_rate_hz``: the safety filter at its own rate (default: ``rate_hz``); missed periods and
    latency are the filter's. ``code``: run the node processes from this tree (a ``robot_wm`` package
    first on their PYTHONPATH: the baseline of ``robot-wm bench e2e --baseline``).
    """
    from robot_wm.benchmarks.hotpath import stats_us
    from robot_wm.process_group import Child, ProcessGroup, _die_with_parent

    filter_rate = filter_rate_hz or rate_hz
    period = 1.0 / filter_rate
    specs, arm_rate = _specs_for(mode, rate_hz, filter_rate_hz, realtime_priority, step_on_state)
    env = mode_env(mode, env)
    if code is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(code)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    tag = tag or f"{mode}_{int(rate_hz)}"
    record = workdir / f"{tag}_filter.npy" if instrument else None
    res: dict[str, Any] = {"mode": mode, "rate_hz": rate_hz, "filter_rate_hz": filter_rate, "period_s": period,
                           "realtime_priority": int(realtime_priority),
                           "arm_sim_rate_hz": arm_rate, "code": str(code) if code else "this tree",
                           "executor": EXECUTOR_CLASS[executor_kind(mode)],
                           EXECUTOR_ENV: env.get(EXECUTOR_ENV, "(unset: the shipped default)"),
                           "status": "ok", "instrumented": instrument}
    group = ProcessGroup(specs, env)
    logs: dict[str, Path] = {}
    recorder.clear()
    t_start = time.monotonic()
    try:
        for spec in group.specs:  # ProcessGroup.start() with each child's output in a log file and our command
            logs[spec.name] = workdir / f"{tag}_{spec.name}.log"
            with open(logs[spec.name], "wb") as log:
                proc = subprocess.Popen(_command(spec, record, filter_rate_hz), env=env, stdout=log,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=workdir,
                                        preexec_fn=_die_with_parent)
            group.children.append(Child(spec, proc))
        res["processes"] = {c.spec.name: c.process.pid for c in group.children}
        # up = the filter passes a non-zero command (it publishes zeros while it waits for the policy)
        deadline = time.monotonic() + startup_timeout
        while time.monotonic() < deadline and not group.failed() and not recorder.moving:
            time.sleep(0.05)
        res["startup_s"] = time.monotonic() - t_start
        if group.failed():
            control = [c for c in group.children if c.spec.name in CONTROL_NODES or c.spec.composes]
            settle = time.monotonic() + 5.0  # let the other control processes finish failing too
            while time.monotonic() < settle and any(c.process.poll() is None for c in control):
                time.sleep(0.05)
            failed = group.failed()
            res["error"] = "; ".join(f"{c.spec.name} exited {c.process.returncode}: {_tail(logs[c.spec.name])}"
                                     for c in failed)
            res["status"] = "failed"
            refused = [c for c in failed if c.process.returncode == 2 and "configuration error" in _tail(
                logs[c.spec.name], 20)]
            if refused and len(refused) == len(failed):  # the runner's exit 2: a parameter it does not accept
                res["status"] = "refused"
                first = next((c for c in refused if c.spec.name in CONTROL_NODES or c.spec.composes), refused[0])
                why = _tail(logs[first.spec.name], 1).split("configuration error:", 1)[-1].strip()
                res["error"] = (f"{', '.join(c.spec.name for c in refused)} refused the configuration "
                                f"(control_period_s={period:g}; ControlNode accepts {PERIOD_RANGE_S[0]:g}.."
                                f"{PERIOD_RANGE_S[1]:g} s) and exited 2: {why}; "
                                f"arm_sim kept running at {arm_rate:.0f} Hz")
        elif not recorder.cmd:
            res["status"], res["error"] = "failed", f"no command on {COMMAND_TOPIC} within {startup_timeout:.0f} s"
        elif not recorder.moving:
            res["note"] = f"only zero commands within {startup_timeout:.0f} s (the policy's nominal never got through)"
        time.sleep(warmup)
        cpu0 = {c.spec.name: _cpu_s(c.process.pid) for c in group.children}
        own0, m0 = time.process_time(), time.monotonic()
        w0 = time.time_ns()
        time.sleep(seconds if res["status"] == "ok" else min(seconds, 2.0))
        w1 = time.time_ns()
        span = time.monotonic() - m0
        res["cpu_pct"] = {c.spec.name: 100.0 * (_cpu_s(c.process.pid) - cpu0[c.spec.name]) / span
                          for c in group.children if c.process.poll() is None and cpu0[c.spec.name] > 0}
        control = {c.spec.name for c in group.children if c.spec.name in CONTROL_NODES or c.spec.composes}
        res["control_cpu_pct"] = sum(v for k, v in res["cpu_pct"].items() if k in control)  # policy+wm+filter
        res["stack_cpu_pct"] = sum(res["cpu_pct"].values())  # every node process
        res["cpu_pct"]["bench observer (this process)"] = 100.0 * (time.process_time() - own0) / span
        res["memory"] = {}
        for c in group.children:
            if c.process.poll() is None:
                try:
                    res["memory"][c.spec.name] = memory_of(c.process.pid)
                except OSError:
                    pass
        js = np.asarray(list(recorder.js), dtype=np.int64).reshape(-1, 2)
        cmd = np.asarray(list(recorder.cmd), dtype=np.int64).reshape(-1, 2)
        js = js[np.argsort(js[:, 1])]
        js_w = js[(js[:, 1] >= w0) & (js[:, 1] < w1)]
        res["joint_states"] = _gaps(js_w[:, 1], 1.0 / arm_rate)
        if res["status"] == "ok":
            cmd = cmd[np.argsort(cmd[:, 0])]
            cmd_w = cmd[(cmd[:, 0] >= w0) & (cmd[:, 0] < w1)]
            res["commands_observed"] = _gaps(cmd_w[:, 0], period)
            idx = np.searchsorted(js[:, 1], cmd_w[:, 0], side="right") - 1
            ok = idx >= 0
            res["latency_external"] = stats_us(cmd_w[ok, 0] - js[idx[ok], 0])
            res["command_transport"] = stats_us(cmd_w[:, 1] - cmd_w[:, 0])  # filter's publish -> this observer
    finally:
        res["stop_s"] = _stop(group)
        res["exit_codes"] = {c.spec.name: c.process.returncode for c in group.children}
        res["wall_s"] = time.monotonic() - t_start
    if record is not None and res["status"] == "ok":
        try:
            rec = np.load(record)
        except OSError as exc:
            res["in_chain"] = {"error": f"no records from the filter process ({exc})"}
        else:
            res["in_chain"] = _in_chain(rec, w0, w1, period)
        seen = record.with_suffix(".executor")
        res["executor_built"] = seen.read_text() if seen.is_file() else None  # as make_executor reported it
        if res["executor_built"] and res["executor_built"] != res["executor"]:
            res["note"] = (res.get("note", "") + f"; executor built {res['executor_built']}, expected "
                           f"{res['executor']}").lstrip("; ")
    return res


def _stop(group, grace_s: float = 8.0) -> dict[str, float | None]:
    """SIGINT every child (reverse start order), note when each exits, then ``ProcessGroup.stop`` (SIGKILL) the rest.

    Returns seconds from SIGINT to exit per child (None: it had to be killed).
    """
    import signal

    t0 = time.monotonic()
    for child in reversed(group.children):
        if child.process.poll() is None:
            child.process.send_signal(signal.SIGINT)
    exited: dict[str, float | None] = {c.spec.name: None for c in group.children}
    while time.monotonic() - t0 < grace_s and any(c.process.poll() is None for c in group.children):
        for c in group.children:
            if exited[c.spec.name] is None and c.process.poll() is not None:
                exited[c.spec.name] = time.monotonic() - t0
        time.sleep(0.02)
    for c in group.children:
        if exited[c.spec.name] is None and c.process.poll() is not None:
            exited[c.spec.name] = time.monotonic() - t0
    group.grace_s = 0.5
    group.stop()  # SIGINT again + SIGKILL after 0.5 s for any child still running
    return exited


def _in_chain(rec: np.ndarray, w0: int, w1: int, period: float) -> dict[str, Any]:
    """Latency and missed periods from the filter's own records within the window."""
    from robot_wm.benchmarks.hotpath import stats_us
    from robot_wm.core.safety import FilterState

    rec = rec[(rec[:, 3] >= w0) & (rec[:, 3] < w1)]
    ran = rec[(rec[:, 4] >= 0) & (rec[:, 0] > 0)]  # periods that ran the filter on a received state
    states = {FilterState(s).name if s >= 0 else "WAITING": int(np.sum(rec[:, 4] == s)) for s in np.unique(rec[:, 4])}
    same = int(np.sum(np.diff(ran[:, 0]) == 0)) if len(ran) > 1 else 0
    return {"latency": stats_us(ran[:, 3] - ran[:, 0]),  # command publish call - consumed JointState stamp
            "state_delivery": stats_us(ran[:, 1] - ran[:, 0]),  # stamp -> filter's joint-state callback
            "state_age_at_step": stats_us(ran[:, 2] - ran[:, 0]),  # stamp -> control step start
            "compute": stats_us(ran[:, 3] - ran[:, 2]),  # control step start -> publish call
            "publishes": _gaps(rec[:, 3], period), "states": states, "same_state_reused": same}




# ------------------------------------------------------------------------------ robot-wm bench e2e
def summary(r: dict[str, Any]) -> dict[str, Any]:
    """The headline numbers of one configuration (what the table and the ratios show)."""
    ic = r.get("in_chain") or {}
    pubs = ic.get("publishes") or r.get("commands_observed") or {}
    lat = ic.get("latency") or {}
    ext = r.get("latency_external") or {}
    return {
        "status": r["status"], "commands_per_s": pubs.get("rate_hz", math.nan), "missed_periods": pubs.get("missed"),
        "periods": (pubs.get("n") or 1) - 1, "missed_pct": pubs.get("missed_pct", math.nan),
        "latency_p50_ms": lat.get("p50_us", math.nan) / 1e3, "latency_p99_ms": lat.get("p99_us", math.nan) / 1e3,
        "latency_max_ms": lat.get("max_us", math.nan) / 1e3,
        "external_latency_p50_ms": ext.get("p50_us", math.nan) / 1e3,
        "external_latency_p99_ms": ext.get("p99_us", math.nan) / 1e3,
        "cpu_pct": r.get("cpu_pct", {}), "control_cpu_pct": r.get("control_cpu_pct", math.nan),
        "stack_cpu_pct": r.get("stack_cpu_pct", math.nan),
        "robot_wm_cpu_pct": sum(v for k, v in r.get("cpu_pct", {}).items()
                                if k not in ("arm_sim", "bench observer (this process)")),
        "filter_states": ic.get("states", {}), "error": r.get("error", ""), "note": r.get("note", ""),
    }


def measure(mode: str, rate_hz: float, seconds: float, warmup: float, *, filter_rate_hz: float | None = None,
            trees: dict[str, Path | None], domain_id: int, logs: Path | None = None,
            instrument: bool = True, realtime_priority: int = 0,
            step_on_state: bool | None = None) -> dict[str, dict[str, Any]]:
    """Run one configuration once per code tree (``{"ours": None, "baseline": DIR}``); return the results by name."""
    import rclpy
    from rclpy.context import Context
    from rclpy.signals import SignalHandlerOptions

    from robot_wm.rosenv import apply_loopback_dds, loopback_env

    apply_loopback_dds(domain_id=domain_id)  # loopback-only DDS, a domain of this run's own
    results: dict[str, dict[str, Any]] = {}
    ctx = Context()
    rclpy.init(context=ctx, signal_handler_options=SignalHandlerOptions.NO)
    recorder = Recorder(ctx)
    try:
        with tempfile.TemporaryDirectory(prefix="robot_wm_bench_e2e_") as tmp:
            workdir = logs or Path(tmp)
            workdir.mkdir(parents=True, exist_ok=True)
            for name, code in trees.items():
                env = loopback_env(domain_id=domain_id)
                env["PYTHONUNBUFFERED"] = "1"
                env["ROBOT_WM_STATE_DIR"] = str(Path(tmp) / f"state_{name}")  # phase files, registry: not the user's
                print(f"bench e2e: {mode} at {rate_hz:g} Hz" + (f", filter at {filter_rate_hz:g} Hz" if filter_rate_hz else "")
                      + f", {name} ({code or 'this tree'}), {seconds:g} s after {warmup:g} s", file=sys.stderr, flush=True)
                results[name] = run_config(mode, rate_hz, seconds, warmup, recorder, env, workdir, instrument,
                                           filter_rate_hz=filter_rate_hz, code=code, tag=f"{name}_{mode}_{int(rate_hz)}",
                                           realtime_priority=realtime_priority, step_on_state=step_on_state)
    finally:
        recorder.close()
        rclpy.shutdown(context=ctx)
    return results


def print_summary(doc: dict[str, Any], stream=sys.stdout) -> None:
    """The table of a ``robot-wm bench e2e`` document."""
    say = lambda s: print(s, file=stream)  # noqa: E731
    say(f"{doc['mode']} stack, policy and world model at {doc['rate_hz']:g} Hz, safety filter at "
        f"{doc['filter_rate_hz']:g} Hz, {doc['seconds']:g} s measured"
        + (f", arm and control processes at SCHED_FIFO {doc['realtime_priority']}" if doc["realtime_priority"] else ""))
    rows = [("commands/s", "commands_per_s", "{:.1f}"), ("missed periods", "missed_periods", "{}"),
            ("missed %", "missed_pct", "{:.3f}"), ("latency p50 ms (state stamp -> publish)", "latency_p50_ms", "{:.2f}"),
            ("latency p99 ms", "latency_p99_ms", "{:.2f}"), ("latency max ms", "latency_max_ms", "{:.2f}"),
            ("external latency p50 / p99 ms", None, None), ("CPU, robot_wm processes (% of a core)", "robot_wm_cpu_pct", "{:.0f}"),
            ("CPU, control path (policy+wm+filter)", "control_cpu_pct", "{:.0f}"), ("CPU, every process", "stack_cpu_pct", "{:.0f}")]
    names = [n for n in ("ours", "baseline") if n in doc]
    say(f"  {'':<42}" + "".join(f"{n:>14}" for n in names) + ("   ratio baseline/ours" if len(names) == 2 else ""))
    for label, key, fmt in rows:
        if key is None:
            vals = [f"{doc[n]['external_latency_p50_ms']:.2f}/{doc[n]['external_latency_p99_ms']:.2f}" for n in names]
            say(f"  {label:<42}" + "".join(f"{v:>14}" for v in vals))
            continue
        vals = [doc[n][key] for n in names]
        line = f"  {label:<42}" + "".join(f"{(fmt.format(v) if v is not None else '-'):>14}" for v in vals)
        if len(names) == 2 and isinstance(vals[0], (int, float)) and vals[0] and isinstance(vals[1], (int, float)):
            line += f"   {vals[1] / vals[0]:.2f}x"
        say(line)
    for n in names:
        cpu = ", ".join(f"{k} {v:.0f}" for k, v in doc[n]["cpu_pct"].items())
        say(f"  {n}: CPU % per process: {cpu}; filter states {doc[n]['filter_states']}"
            + (f"; {doc[n]['status']}: {doc[n]['error']}" if doc[n]["status"] != "ok" else "")
            + (f"; note: {doc[n]['note']}" if doc[n]["note"] else ""))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``robot-wm bench e2e``."""
    parser.add_argument("--rate", type=float, default=100.0, help="control rate of the policy and world model, Hz")
    parser.add_argument("--seconds", type=float, default=30.0, help="measurement window, s (default 30)")
    parser.add_argument("--warmup", type=float, default=3.0, help="wait after the first moving command, s")
    parser.add_argument("--composed", action="store_true", help="policy, world model and filter in one process")
    parser.add_argument("--filter-rate", type=float, help="the safety filter's own rate, Hz (default: --rate)")
    parser.add_argument("--baseline", metavar="REF|DIR",
                        help="also run the node processes of this git revision (or directory) and print ratios")
    parser.add_argument("--realtime-priority", type=int, default=0, metavar="PRIO",
                        help="SCHED_FIFO priority of the arm and control processes (0: the normal scheduler)")
    parser.add_argument("--step-on-state", choices=("true", "false"),
                        help="the control nodes' step_on_state (default: config/control.yaml's)")
    parser.add_argument("--logs", type=Path, help="keep the node logs and filter records in this folder")
    parser.add_argument("--domain-id", type=int, default=150 + os.getpid() % 50, help="ROS domain of this run")
    parser.add_argument("--json", action="store_true", help="only the JSON document on stdout")


def command(args: argparse.Namespace) -> int:
    """``robot-wm bench e2e``: the table, then one JSON object on the last line."""
    from robot_wm.benchmarks.hotpath import checkout

    for name in ("rate", "filter_rate"):
        value = getattr(args, name)
        if value is not None and not 1.0 / PERIOD_RANGE_S[1] <= value <= 1.0 / PERIOD_RANGE_S[0]:
            print(f"bench e2e: --{name.replace('_', '-')} {value:g} Hz: expected 10..1000 Hz", file=sys.stderr)
            return 2
    if args.seconds <= 0 or args.warmup < 0:
        print("bench e2e: --seconds must be > 0 and --warmup >= 0", file=sys.stderr)
        return 2
    mode = "composed" if args.composed else "separate"
    repo = Path(__file__).resolve().parents[2]
    with tempfile.TemporaryDirectory(prefix="robot_wm_baseline_") as tmp:
        trees: dict[str, Path | None] = {"ours": None}
        if args.baseline:
            try:
                trees["baseline"] = checkout(args.baseline, repo, Path(tmp))
            except ValueError as exc:
                print(f"bench e2e: {exc}", file=sys.stderr)
                return 2
        raw = measure(mode, args.rate, args.seconds, args.warmup, filter_rate_hz=args.filter_rate, trees=trees,
                      domain_id=args.domain_id, logs=args.logs, realtime_priority=args.realtime_priority,
                      step_on_state=None if args.step_on_state is None else args.step_on_state == "true")
    doc: dict[str, Any] = {"benchmark": "e2e", "mode": mode, "rate_hz": args.rate,
                           "realtime_priority": args.realtime_priority, "step_on_state": args.step_on_state,
                           "filter_rate_hz": args.filter_rate or args.rate, "seconds": args.seconds,
                           "loadavg": os.getloadavg(),
                           "targets": {"composed_100hz_missed": 0, "separate_missed_pct": 0.1, "latency_p99_ms": 2.0,
                                       "filter_500hz_missed_pct": 0.1, "stack_cpu_pct": 50}}
    for name, r in raw.items():
        doc[name] = summary(r)
        doc[f"{name}_raw"] = r
    if args.baseline:
        doc["baseline_ref"] = args.baseline
    if not args.json:
        print_summary(doc)
    print(json.dumps(_jsonable(doc), allow_nan=False))
    return 0 if all(doc[n]["status"] == "ok" for n in raw) else 1


def _jsonable(obj: Any) -> Any:
    """Numbers JSON can hold (NaN/inf become None, numpy scalars plain)."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(obj) else None
    return obj


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        sys.exit(_child(sys.argv[2:]))
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(p)
    sys.exit(command(p.parse_args()))
