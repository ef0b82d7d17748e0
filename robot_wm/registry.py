"""The model registry: versioned model sets on disk, one ``active`` pointer per task.

A model set is what a task runs: ``world_model.onnx`` + ``policy.onnx`` with their sidecars and the
trust monitor's calibrations for that world model (``trust/<profile>.json``). The registry keeps
each set in its own directory with a ``modelset.json`` that records its lineage (parent set, the
sidecars' versions and hashes, training data hashes, command, metrics, the robot description, joint
order and control period it was made for) and the SHA-256 of every file (format and checks:
``robot_wm.modelset``)::

    <root>/                       $ROBOT_WM_MODELS_DIR, else state_dir()/models
      .lock                       writers (add, activate, rollback) take it in turn (flock)
      <task>/<version>/           world_model.onnx/.json, policy.onnx/.json, trust/*.json, modelset.json
      <task>/active.json          {"version", "previous": [newest first], ...}: the task's active set
      <task>/.staging-*           a set being written (never read; removed by the next add)

Versions are ``<task>-<NNNN>-<8 hex>``: a counter per task (the shipped sets are 0001 and 0002) and
the start of the set's content hash (SHA-256 over its files' names and hashes).

Atomicity: a set is written into a staging directory, fsynced, verified and renamed into place
(one ``rename``); the active pointer is a temporary file fsynced and ``os.replace``d over
``active.json``, then the directory is fsynced. A crash at any point leaves the previously active
set active and intact; a half-written set is never listed.

Nodes resolve their default model through :func:`resolve`: the active set's file, or the shipped
file when the registry has no active set for the task (or its pointer cannot be read, said in a
warning). An active set that fails verification or does not fit this robot is never loaded and
never silently replaced: :func:`resolve` raises ``ModelError`` with the problems, so the node
fails to configure (the safety filter stops the arm) until an operator rolls back or activates
another set.

Usage::

    reg = Registry()
    reg.ensure_shipped()
    info = reg.add(Path("runs/adapted"), "track", parent=reg.active("track").version,
                   lineage={"training_data": {"demo_bags_sha256": [...]}, "command": "robot-wm adapt ..."})
    reg.activate("track", info.version)   # refused (RegistryError) with the reasons if it does not fit
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from robot_wm.core.atomic import fsync_dir, write_json
from robot_wm.core.onnx_model import ModelError, read_sidecar, sha256_file
from robot_wm.modelset import (MODEL_FILES, MODELSET_FILE, MODELSET_FORMAT, TRUST_DIR, ModelSetInfo, Problem,
                               Reason, RegistryError, RobotFacts, calibration_version, compatibility, content_sha256,
                               digest, integrity, read_modelset, robot_facts, set_files)
from robot_wm.paths import data_path, state_dir

ACTIVE_FORMAT = "robot_wm-active/1"
ACTIVE_FILE = "active.json"
CALIBRATION = "calibration"  # the third kind resolve() knows: the trust calibration of a profile
HISTORY_LEN = 50  # versions kept in the active pointer's history
_STAGING = ".staging-"
_LOG = logging.getLogger(__name__)
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
__all__ = ["CALIBRATION", "SHIPPED", "ModelSetInfo", "Problem", "Reason", "Registry", "RegistryError", "RobotFacts",
           "registry_root", "resolve", "robot_facts", "shipped_path"]


@dataclass(frozen=True)
class ShippedSet:
    """A set the package ships (the registry's first entries)."""

    task: str
    directory: str  # under the share dir
    calibrations: str | None  # directory of its trust calibrations (those for its world model are taken)
    default: bool  # the task's default: activated when the task has no active set yet
    part: str  # the tools/train_default_models.sh part that made it


SHIPPED = (
    ShippedSet("reach", "models", "models/trust", True, "reach"),
    ShippedSet("reach", "models/reach_sim_only", None, False, "reach_sim_only"),
    ShippedSet("track", "models/track", "models/trust/track", True, "track"),
    ShippedSet("track", "models/track_sim_only", None, False, "track_sim_only"),
)


def registry_root() -> Path:
    """``$ROBOT_WM_MODELS_DIR`` if set, else ``state_dir()/models``."""
    env = os.environ.get("ROBOT_WM_MODELS_DIR")
    return Path(env) if env else state_dir() / "models"


def known_tasks() -> tuple[str, ...]:
    """The tasks of the node graph (robot_wm.graph.TASKS)."""
    from robot_wm.graph import TASKS

    return tuple(TASKS)


def _check_task(task: str) -> None:
    if task not in known_tasks():
        raise RegistryError(f"task {task!r}: expected one of {list(known_tasks())}")




class Registry:
    """Versioned model sets under ``root`` (default :func:`registry_root`), one active set per task.

    Args:
        root: the registry directory (created on the first write).
        robot: what this install runs (default: :func:`robot_facts`, computed when first needed).
    """

    def __init__(self, root: Path | str | None = None, *, robot: RobotFacts | None = None) -> None:
        self.root = Path(root) if root is not None else registry_root()
        self._robot = robot
        self._lock_depth = 0
        self._thread_lock = threading.RLock()

    @property
    def robot(self) -> RobotFacts:
        if self._robot is None:
            self._robot = robot_facts()
        return self._robot

    # ---- reading
    def versions(self, task: str) -> list[str]:
        """Version directories of ``task``, oldest first (readable or not)."""
        task_dir = self.root / task
        if not task_dir.is_dir():
            return []
        names = [p.name for p in task_dir.iterdir() if p.is_dir() and not p.name.startswith(".")]
        return sorted(names, key=lambda n: (_counter(task, n), n))

    def get(self, task: str, version: str) -> ModelSetInfo:
        """The set ``version`` of ``task``. Raises RegistryError when it is absent or unreadable."""
        _check_task(task)
        path = self.root / task / version
        return ModelSetInfo.from_doc(path, read_modelset(path))

    def list(self, task: str | None = None) -> list[ModelSetInfo]:
        """The readable sets of ``task`` (or of every task), oldest first; see ``versions`` for all."""
        tasks = [task] if task is not None else known_tasks()
        out = []
        for t in tasks:
            for version in self.versions(t):
                try:
                    out.append(self.get(t, version))
                except RegistryError as exc:
                    _LOG.warning("model registry: skipping %s/%s: %s", t, version, exc)
        return out

    def active_pointer(self, task: str) -> dict[str, Any] | None:
        """The task's ``active.json`` (None when there is none). Raises RegistryError when unreadable."""
        _check_task(task)
        path = self.root / task / ACTIVE_FILE
        try:
            doc = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, json.JSONDecodeError) as exc:
            raise RegistryError(f"{path}: unreadable ({exc})") from exc
        if (not isinstance(doc, dict) or doc.get("format") != ACTIVE_FORMAT or not isinstance(doc.get("version"), str)
                or not isinstance(doc.get("previous"), list)):
            raise RegistryError(f"{path}: not a {ACTIVE_FORMAT} pointer with 'version' and 'previous'")
        return doc

    def active(self, task: str) -> ModelSetInfo | None:
        """The active set of ``task``, or None when the task has none."""
        pointer = self.active_pointer(task)
        return None if pointer is None else self.get(task, pointer["version"])

    # ---- checking
    def verify(self, task: str, version: str) -> list[Problem]:
        """Recheck a set: its modelset.json, every file's SHA-256, no file missing or added, the
        sidecars against the models and the lineage, the calibrations against the world model."""
        _check_task(task)
        return integrity(self.root / task / version, task, version)

    def compatibility(self, info: ModelSetInfo, task: str | None = None) -> list[Problem]:
        """Whether ``info`` fits ``task`` (default: its own) and this install's robot description,
        joint order and control period."""
        return compatibility(info, task or info.task, self.robot)

    def check(self, task: str, version: str) -> list[Problem]:
        """``verify`` plus ``compatibility``: everything ``activate`` refuses for."""
        problems = self.verify(task, version)
        try:
            info = self.get(task, version)
        except RegistryError:
            return problems  # verify says why modelset.json cannot be read
        return problems + self.compatibility(info, task)

    # ---- writing
    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Writers take ``<root>/.lock`` (flock) in turn; re-entrant within this object."""
        import fcntl

        with self._thread_lock:
            if self._lock_depth:
                self._lock_depth += 1
                try:
                    yield
                finally:
                    self._lock_depth -= 1
                return
            self.root.mkdir(parents=True, exist_ok=True)
            with open(self.root / ".lock", "a") as fh:
                fcntl.flock(fh, fcntl.LOCK_EX)
                self._lock_depth = 1
                try:
                    yield
                finally:
                    self._lock_depth = 0
                    fcntl.flock(fh, fcntl.LOCK_UN)

    def add(self, set_dir: Path, task: str, *, parent: str | None, lineage: dict[str, Any],
            activate: bool = False) -> ModelSetInfo:
        """Register a copy of the set in ``set_dir`` (the two models, their sidecars, ``trust/*.json``).

        Args:
            set_dir: directory holding world_model.onnx/.json, policy.onnx/.json [, trust/<profile>.json].
            task: the task it is for (``activate`` refuses a policy of another task).
            parent: the registered version it was derived from, or None.
            lineage: what the sidecars cannot say: ``training_data`` (``sim_dataset_sha256``,
                ``demo_bags_sha256``: a list), ``command``, ``metrics``, ``robot_description_sha256``
                (default: this install's), and any further keys (kept as given). The sidecars'
                versions, hashes, joint order and period are read from the files.
            activate: activate it once written (refused with RegistryError if it does not fit; the
                set stays registered).
        Returns:
            The new set. Raises RegistryError when a file is missing, the parent unknown, the lineage
            malformed or the copy fails verification (nothing is registered then).
        """
        return self._add(set_files(Path(set_dir)), task, parent=parent, lineage=lineage, activate=activate,
                         source=str(Path(set_dir).resolve()))

    def _add(self, files: dict[str, Path], task: str, *, parent: str | None, lineage: dict[str, Any],
             activate: bool, source: str | None, shipped: str | None = None) -> ModelSetInfo:
        _check_task(task)
        if not isinstance(lineage, dict):
            raise RegistryError(f"lineage: expected a dict, got {type(lineage).__name__}")
        with self._locked():
            if parent is not None and not any(parent in self.versions(t) for t in known_tasks()):
                raise RegistryError(f"parent {parent!r} is not a registered version (robot-wm models list)")
            task_dir = self.root / task
            task_dir.mkdir(parents=True, exist_ok=True)
            for stale in task_dir.glob(_STAGING + "*"):  # a crashed writer's (we hold the lock)
                shutil.rmtree(stale, ignore_errors=True)
            staging = Path(tempfile.mkdtemp(prefix=_STAGING, dir=task_dir))
            try:
                hashes = {}
                for name, src in files.items():
                    dst = staging / name
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(src, dst)
                    with open(dst, "rb") as fh:
                        os.fsync(fh.fileno())
                    hashes[name] = sha256_file(dst)  # of the copy: a bad copy cannot pass verification
                content = content_sha256(hashes)
                counter = max([_counter(task, v) for v in self.versions(task)] + [0]) + 1
                version = f"{task}-{counter:04d}-{content[:8]}"
                doc = {
                    "format": MODELSET_FORMAT, "version": version, "task": task, "parent": parent,
                    "created_unix_s": time.time(),
                    "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "content_sha256": content, "source": source, "shipped": shipped,
                    "lineage": self._lineage(staging, lineage), "files": dict(sorted(hashes.items())),
                }
                doc["digest_sha256"] = digest(doc)
                with open(staging / MODELSET_FILE, "w") as fh:
                    json.dump(doc, fh, indent=2)
                    fh.write("\n")
                    fh.flush()
                    os.fsync(fh.fileno())
                problems = integrity(staging, task, version, located=False)
                if problems:
                    raise RegistryError(f"not registered: {'; '.join(map(str, problems))}", problems)
                for sub in [staging / TRUST_DIR, staging]:
                    if sub.is_dir():
                        fsync_dir(sub)
                os.rename(staging, task_dir / version)  # the one step that makes it visible
                fsync_dir(task_dir)
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
            info = self.get(task, version)
            if activate:
                self.activate(task, version)
            return info

    def _lineage(self, staging: Path, given: dict[str, Any]) -> dict[str, Any]:
        """The set's lineage: the sidecars' facts plus the caller's ``given`` keys (validated)."""
        sidecars = {}
        for kind, onnx in MODEL_FILES.items():
            try:
                sidecars[kind] = read_sidecar(staging / onnx)
            except ModelError as exc:
                raise RegistryError(f"not registered: {exc}") from exc
        wm, pol = sidecars["world_model"], sidecars["policy"]
        derived = {
            "task": pol.get("task"),
            "world_model": {"version": wm["version"], "sha256": wm["sha256"]},
            "policy": {"version": pol["version"], "sha256": pol["sha256"]},
            "joint_names": list(pol["joint_names"]),
            "dt_s": float(pol["dt_s"]),
        }
        for key, value in derived.items():
            if key in given and given[key] != value:
                raise RegistryError(f"lineage[{key!r}]={given[key]!r}: read from the sidecars ({value!r}), "
                                    "do not give it")
        data = dict(given.get("training_data") or {})
        unknown = set(data) - {"sim_dataset_sha256", "demo_bags_sha256"}
        if unknown:
            raise RegistryError(f"lineage['training_data']: unknown keys {sorted(unknown)}; expected "
                                "sim_dataset_sha256, demo_bags_sha256")
        data.setdefault("sim_dataset_sha256", pol.get("training_data_sha256"))
        data.setdefault("demo_bags_sha256", [])
        bags = data["demo_bags_sha256"]
        if not isinstance(bags, list) or not all(isinstance(h, str) and _HEX64.match(h) for h in bags):
            raise RegistryError(f"lineage['training_data']['demo_bags_sha256']={bags!r}: expected a list of "
                                "64-hex SHA-256 strings")
        sim = data["sim_dataset_sha256"]
        if sim is not None and not (isinstance(sim, str) and _HEX64.match(sim)):
            raise RegistryError(f"lineage['training_data']['sim_dataset_sha256']={sim!r}: expected a 64-hex "
                                "SHA-256 string or None")
        robot_sha = given.get("robot_description_sha256") or self.robot.description_sha256
        if not (isinstance(robot_sha, str) and _HEX64.match(robot_sha)):
            raise RegistryError(f"lineage['robot_description_sha256']={robot_sha!r}: expected a 64-hex SHA-256")
        command = given.get("command", pol.get("training_command"))
        if not isinstance(command, str):
            raise RegistryError(f"lineage['command']={command!r}: expected a string")
        metrics = given.get("metrics", pol.get("metrics", {}))
        if not isinstance(metrics, dict):
            raise RegistryError(f"lineage['metrics']: expected a dict, got {type(metrics).__name__}")
        return {**given, **derived, "training_data": data, "command": command, "metrics": metrics,
                "robot_description_sha256": robot_sha}

    def activate(self, task: str, version: str) -> ModelSetInfo:
        """Make ``version`` the task's active set (atomically), after ``check``.

        Raises:
            RegistryError: naming every problem (hash mismatch, missing file, another task, robot
                description, joint order or control period); the active set is unchanged then.
        """
        _check_task(task)
        with self._locked():
            if version not in self.versions(task):
                raise RegistryError(f"{task} has no version {version!r} (robot-wm models list --task {task})")
            problems = self.check(task, version)
            if problems:
                raise RegistryError(f"refusing to activate {task} {version}: {'; '.join(map(str, problems))}",
                                    problems)
            try:
                current = self.active_pointer(task)
            except RegistryError as exc:  # replaced by the new pointer; its history is lost
                _LOG.warning("model registry: %s; writing a new pointer", exc)
                current = None
            history = [] if current is None else [current["version"], *current["previous"]]
            if history and history[0] == version:
                history = history[1:]
            self._switch(task, version, history)
            return self.get(task, version)

    def rollback(self, task: str) -> ModelSetInfo:
        """Activate the previously active set of ``task`` (the pointer's history), after ``check``.

        Raises:
            RegistryError: no active set, no previous version, or the previous set is refused.
        """
        _check_task(task)
        with self._locked():
            current = self.active_pointer(task)
            if current is None or not current["previous"]:
                raise RegistryError(f"{task}: no previously active version to roll back to")
            target = current["previous"][0]
            problems = self.check(task, target)
            if problems:
                raise RegistryError(f"refusing to roll {task} back to {target}: {'; '.join(map(str, problems))} "
                                    "(activate another version explicitly)", problems)
            self._switch(task, target, current["previous"][1:])
            return self.get(task, target)

    def _switch(self, task: str, version: str, previous: list[str]) -> None:
        write_json(self.root / task / ACTIVE_FILE, {
            "format": ACTIVE_FORMAT, "task": task, "version": version, "previous": previous[:HISTORY_LEN],
            "switched_unix_s": time.time()})

    def ensure_shipped(self) -> list[ModelSetInfo]:
        """Import the shipped sets (with their trust calibrations) unless already registered, and
        activate ``models/`` (reach) and ``models/track/`` (track) where the task has no active set.
        Idempotent. Returns the shipped sets' entries.
        """
        out = []
        with self._locked():
            for ship in SHIPPED:
                src = data_path(*ship.directory.split("/"), must_exist=False)
                if not (src / MODEL_FILES["policy"]).is_file():
                    continue  # an install without this set
                files = {n: p for n, p in set_files(src).items() if not n.startswith(TRUST_DIR + "/")}
                if ship.calibrations is not None:
                    wm_version = json.loads((src / "world_model.json").read_text()).get("version")
                    for cal in sorted(data_path(*ship.calibrations.split("/"), must_exist=False).glob("*.json")):
                        if calibration_version(cal) == wm_version:
                            files[f"{TRUST_DIR}/{cal.name}"] = cal
                content = content_sha256({n: sha256_file(p) for n, p in files.items()})
                known = [i for i in self.list(ship.task) if i.shipped == ship.directory and i.content_sha256 == content]
                info = known[0] if known else self._add(
                    files, ship.task, parent=None, activate=False, source=str(src), shipped=ship.directory,
                    lineage={"command": f"tools/train_default_models.sh {ship.part}"})
                out.append(info)
                if ship.default and not (self.root / ship.task / ACTIVE_FILE).exists():
                    try:
                        self.activate(ship.task, info.version)
                    except RegistryError as exc:
                        _LOG.warning("model registry: shipped %s not activated: %s", ship.directory, exc)
        return out


def _counter(task: str, version: str) -> int:
    m = re.match(rf"^{re.escape(task)}-(\d+)-", version)
    return int(m.group(1)) if m else 0


def shipped_path(task: str, kind: str, profile: str = "nominal") -> Path:
    """The package's file of ``kind`` for ``task``: today's defaults (models/, models/track/,
    models/trust/[track/]<profile>.json)."""
    _check_task(task)
    ship = next(s for s in SHIPPED if s.task == task and s.default)
    if kind == CALIBRATION:
        return data_path(*ship.calibrations.split("/"), f"{Path(profile).stem}.json", must_exist=False)
    if kind not in MODEL_FILES:
        raise ValueError(f"kind {kind!r}: expected one of {[*MODEL_FILES, CALIBRATION]}")
    return data_path(*ship.directory.split("/"), MODEL_FILES[kind], must_exist=False)


def resolve(task: str, kind: str, *, profile: str = "nominal", root: Path | str | None = None,
            warn: Callable[[str], None] | None = None) -> Path:
    """The default file of ``kind`` ("world_model", "policy", "calibration") for ``task``.

    The active set's file, or the shipped one when the registry has no active set for the task or
    its pointer cannot be read (``warn`` says why). A calibration the active set lacks: the shipped
    one, with a warning (the trust monitor refuses it if it is for another world model).

    Raises:
        ModelError: the active set fails verification or does not fit this robot (the problems
            listed): it is never loaded, and never silently replaced by another set.
    """
    if kind not in (*MODEL_FILES, CALIBRATION):
        raise ValueError(f"kind {kind!r}: expected one of {[*MODEL_FILES, CALIBRATION]}")
    warn = warn or _LOG.warning
    shipped = shipped_path(task, kind, profile)
    reg = Registry(root)
    try:
        pointer = reg.active_pointer(task)
    except (RegistryError, OSError) as exc:
        warn(f"model registry: {exc}; using the shipped {kind} {shipped}")
        return shipped
    if pointer is None:
        return shipped
    version = pointer["version"]
    problems = reg.check(task, version)
    if problems:
        raise ModelError(f"the active {task} model set {version} ({reg.root}) is refused: "
                         f"{'; '.join(map(str, problems))} — `robot-wm models verify {task}`, then "
                         f"`robot-wm models rollback {task}` or activate another set")
    info = reg.get(task, version)
    if kind == CALIBRATION:
        path = info.calibration_path(profile)
        if not path.is_file():
            warn(f"the active {task} model set {version} has no trust calibration for profile "
                 f"{Path(profile).stem!r}; using the shipped {shipped}")
            return shipped
        return path
    return info.path / MODEL_FILES[kind]
