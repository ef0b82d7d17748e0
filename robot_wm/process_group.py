"""Start the node graph as child processes and stop it cleanly: the pip-path `robot-wm up`.

Each robot_wm node runs in its own process (``python -m <module> --ros-args ...``), exactly as
``ros2 run`` would start it. Children die with the process that owns the group (PR_SET_PDEATHSIG), get SIGINT in
reverse start order on shutdown and SIGKILL if they outstay the grace period.
"""
from __future__ import annotations

import ctypes
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from robot_wm.graph import ProcessSpec

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _param_arg(key: str, value: Any) -> str:
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, str):
        text = value
    else:
        text = repr(value)
    return f"{key}:={text}"


def _params_file(node: str, key: str, value: str) -> Path:
    """A params file holding one parameter that a ``-p`` argument cannot carry (a URDF: YAML-unsafe,
    many lines). Named by its content, in the temp directory, so a graph started again reuses it."""
    import hashlib
    import os
    import tempfile

    import yaml

    text = yaml.safe_dump({node: {"ros__parameters": {key: value}}})
    path = Path(tempfile.gettempdir()) / "robot_wm_params" / f"{hashlib.sha256(text.encode()).hexdigest()[:24]}.yaml"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(text)
        os.replace(tmp, path)
    return path


def command_for(spec: ProcessSpec, python: str = sys.executable) -> list[str]:
    """Return the command line that starts ``spec`` on the pip path (no ROS install)."""
    if spec.module is None:
        raise ValueError(f"node {spec.name!r} ({spec.package}/{spec.executable}) needs a ROS 2 install to run")
    cmd = [python, "-m", spec.module, *spec.arguments, "--ros-args"]
    if not spec.composes:  # a composed process hosts several nodes under their own names
        cmd += ["-r", f"__node:={spec.name}"]
    for path in spec.param_files:
        cmd += ["--params-file", str(path)]
    for node in spec.composes or (spec.name,):
        for key, value in {**spec.parameters, **spec.node_parameters.get(node, {})}.items():
            if isinstance(value, str) and ("\n" in value or value.lstrip().startswith("<")):
                cmd += ["--params-file", str(_params_file(node, key, value))]  # after the config files: it wins
                continue
            # node-qualified: a bare -p is a /** override and loses to the node's own entry in a params file
            cmd += ["-p", f"{node}:{_param_arg(key, value)}"]
    return cmd


@dataclass
class Child:
    """A started node process."""

    spec: ProcessSpec
    process: subprocess.Popen


class ProcessGroup:
    """Own the node processes of one bring-up."""

    def __init__(self, specs: list[ProcessSpec], env: dict[str, str], grace_s: float = 1.5) -> None:
        self.specs = [s for s in specs if not s.needs_ros_install]
        self.skipped = [s for s in specs if s.needs_ros_install]
        self.env = env
        self.grace_s = grace_s
        self.children: list[Child] = []

    def start(self) -> None:
        """Start every node that can run without a ROS install."""
        for spec in self.specs:
            process = subprocess.Popen(command_for(spec), env=self.env, preexec_fn=_die_with_parent)
            self.children.append(Child(spec, process))

    def failed(self) -> list[Child]:
        """Return children that exited on their own."""
        return [c for c in self.children if c.process.poll() is not None]

    def stop(self) -> dict[str, int | None]:
        """SIGINT every child (reverse order), wait up to the grace period, then SIGKILL; return exit codes."""
        for child in reversed(self.children):
            if child.process.poll() is None:
                child.process.send_signal(signal.SIGINT)
        deadline = time.monotonic() + self.grace_s
        for child in self.children:
            try:
                child.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.process.kill()
                child.process.wait()
        return {c.spec.name: c.process.returncode for c in self.children}

    def __enter__(self) -> "ProcessGroup":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def pids(group: ProcessGroup) -> list[int]:
    """Return the PIDs of the group's processes (for operators and tests)."""
    return [c.process.pid for c in group.children]


__all__ = ["Child", "ProcessGroup", "command_for", "pids"]
