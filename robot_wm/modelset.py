"""One model set on disk: its files, its ``modelset.json`` and the checks that refuse it.

A model set is what a task runs: ``world_model.onnx`` + ``policy.onnx`` with their sidecars and the
trust monitor's calibrations for that world model (``trust/<profile>.json``). Registered, it also
holds ``modelset.json`` (format ``robot_wm-modelset/1``)::

    {"format", "version", "task", "parent", "created_unix_s", "created_utc", "content_sha256",
     "source", "shipped",
     "lineage": {"task", "world_model": {"version", "sha256"}, "policy": {"version", "sha256"},
                 "training_data": {"sim_dataset_sha256", "demo_bags_sha256": [...]}, "command",
                 "metrics", "robot_description_sha256", "joint_names", "dt_s", ...},
     "files": {"world_model.onnx": sha256, ..., "trust/nominal.json": sha256},
     "digest_sha256": SHA-256 of the rest (an edit of modelset.json itself is detected)}

``integrity`` rechecks a set (every hash, nothing missing or added, the sidecars against the
models and the lineage, the calibrations against the world model); ``compatibility`` says whether
it fits a task and this install's robot (``robot_facts``). Both return typed ``Problem``s.
``robot_wm.registry`` keeps the sets; this module knows one.
"""
from __future__ import annotations

import enum
import functools
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from robot_wm.core.onnx_model import ModelError, read_sidecar, sha256_file

MODELSET_FORMAT = "robot_wm-modelset/1"
MODELSET_FILE = "modelset.json"
TRUST_DIR = "trust"
MODEL_FILES = {"world_model": "world_model.onnx", "policy": "policy.onnx"}  # kind -> file (sidecar: .json)
REQUIRED_FILES = frozenset(n for onnx in MODEL_FILES.values() for n in (onnx, onnx.replace(".onnx", ".json")))


class RegistryError(ModelError):
    """A model set cannot be added, found or activated; ``problems`` says why (may be empty)."""

    def __init__(self, message: str, problems: list[Problem] | None = None) -> None:
        super().__init__(message)
        self.problems = list(problems or [])


class Reason(enum.Enum):
    """Why a set fails verification (integrity) or does not fit this install (compatibility)."""

    MISSING_FILE = "missing file"
    HASH_MISMATCH = "hash mismatch"
    UNLISTED_FILE = "unlisted file"
    METADATA = "bad metadata"
    SIDECAR = "bad sidecar"
    CALIBRATION = "calibration for another world model"
    TASK = "another task"
    ROBOT_DESCRIPTION = "another robot description"
    JOINT_NAMES = "another joint order"
    CONTROL_PERIOD = "another control period"


@dataclass(frozen=True)
class Problem:
    """One reason a set is refused: what kind, and a sentence naming the file or field and the values."""

    reason: Reason
    text: str

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class RobotFacts:
    """What this install runs: the robot description's hash, the joint order and the control period."""

    description_sha256: str
    joint_names: tuple[str, ...]
    dt_s: float


def robot_facts() -> RobotFacts:
    """This install's robot: the expanded URDF's hash (``description_sha256``), its joints, and
    ``control_period_s`` of config/control.yaml.

    The hash is the SHA-256 of the C14N form of ``description.expand(ros2_control=False)``
    (comments and whitespace dropped): the arm's links, joints, masses and limits, not the
    hardware plugin, nor the install path xacro writes into a comment.

    Computed once per description and control.yaml (its path and modification time): every registry
    lookup checks a set against them, a hot swap's loader among them, and the C14N and YAML parsing
    hold the interpreter lock for up to 1.4 and 3 ms at a time, which the control thread beside the
    loader waits for (``bench/bench_swap_storm.py``). The URDF's expansion is cached by path already.
    """
    from robot_wm import description
    from robot_wm.paths import config_path

    path = config_path("control.yaml")
    try:
        mtime_ns = path.stat().st_mtime_ns
    except OSError as exc:
        raise RegistryError(f"{path}: cannot be read: {exc}") from exc
    return _robot_facts(str(description.xacro_path()), str(path), mtime_ns)


@functools.lru_cache(maxsize=8)
def _robot_facts(xacro: str, control_yaml: str, mtime_ns: int) -> RobotFacts:
    import xml.etree.ElementTree as ET

    import yaml

    from robot_wm import description

    canonical = ET.canonicalize(description.expand(ros2_control=False), strip_text=True)
    names = description.joint_limits(description.expand()).names
    path = Path(control_yaml)
    try:
        dt_s = float(yaml.safe_load(path.read_text())["/**"]["ros__parameters"]["control_period_s"])
    except (KeyError, TypeError, ValueError, yaml.YAMLError) as exc:
        raise RegistryError(f"{path}: cannot read /**.ros__parameters.control_period_s: {exc}") from exc
    return RobotFacts(hashlib.sha256(canonical.encode()).hexdigest(), tuple(names), dt_s)


@dataclass(frozen=True)
class ModelSetInfo:
    """One registered set: its ``modelset.json`` and where it lies."""

    version: str
    task: str
    path: Path
    parent: str | None
    created_unix_s: float
    content_sha256: str
    lineage: dict[str, Any]
    files: dict[str, str]  # relative name -> SHA-256
    source: str | None = None
    shipped: str | None = None  # the shipped directory it was imported from (models, models/track, ...)
    doc: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_doc(cls, path: Path, doc: dict[str, Any]) -> ModelSetInfo:
        """The info of the set at ``path`` from its checked ``modelset.json`` (``read_modelset``)."""
        try:
            return cls(version=doc["version"], task=doc["task"], path=path, parent=doc["parent"],
                       created_unix_s=float(doc["created_unix_s"]), content_sha256=doc["content_sha256"],
                       lineage=dict(doc["lineage"]), files=dict(doc["files"]), source=doc.get("source"),
                       shipped=doc.get("shipped"), doc=doc)
        except (KeyError, TypeError, ValueError) as exc:
            raise RegistryError(f"{path / MODELSET_FILE}: malformed ({exc!r})") from exc

    @property
    def world_model_path(self) -> Path:
        return self.path / MODEL_FILES["world_model"]

    @property
    def policy_path(self) -> Path:
        return self.path / MODEL_FILES["policy"]

    def calibration_path(self, profile: str) -> Path:
        """``trust/<profile>.json`` of the set (a profile may be given as a YAML path: its stem counts)."""
        return self.path / TRUST_DIR / f"{Path(profile).stem}.json"

    @property
    def calibrations(self) -> list[str]:
        """Profiles the set has a trust calibration for."""
        return sorted(Path(n).stem for n in self.files if n.startswith(TRUST_DIR + "/"))


def digest(doc: dict[str, Any]) -> str:
    """SHA-256 of a modelset.json document without its ``digest_sha256`` (canonical JSON)."""
    body = {k: v for k, v in doc.items() if k != "digest_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def content_sha256(files: dict[str, str]) -> str:
    """SHA-256 of a set's content: its files' relative names and hashes (the 8 hex of its version)."""
    return hashlib.sha256("".join(f"{n}\0{h}\n" for n, h in sorted(files.items())).encode()).hexdigest()


def set_files(set_dir: Path) -> dict[str, Path]:
    """The files of a set directory: the two models with their sidecars and ``trust/*.json``."""
    files: dict[str, Path] = {}
    for onnx in MODEL_FILES.values():
        for name in (onnx, Path(onnx).with_suffix(".json").name):
            if not (set_dir / name).is_file():
                raise RegistryError(f"{set_dir}: no {name} (a model set holds {sorted(REQUIRED_FILES)})")
            files[name] = set_dir / name
    for cal in sorted((set_dir / TRUST_DIR).glob("*.json")):
        files[f"{TRUST_DIR}/{cal.name}"] = cal
    return files


def calibration_version(path: Path) -> str | None:
    """The world model version a trust calibration names (``model_version``), None when unreadable."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return doc.get("model_version") if isinstance(doc, dict) else None


def read_modelset(path: Path) -> dict[str, Any]:
    """The checked ``modelset.json`` of ``path``; RegistryError (with its one Problem) when it cannot be."""
    meta = path / MODELSET_FILE

    def fail(reason: Reason, text: str) -> RegistryError:
        return RegistryError(text, [Problem(reason, text)])

    if not path.is_dir():
        raise fail(Reason.MISSING_FILE, f"{path}: no such model set")
    try:
        doc = json.loads(meta.read_text())
    except FileNotFoundError:
        raise fail(Reason.MISSING_FILE, f"{meta}: missing") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise fail(Reason.METADATA, f"{meta}: unreadable ({exc})") from exc
    if not isinstance(doc, dict) or doc.get("format") != MODELSET_FORMAT:
        raise fail(Reason.METADATA, f"{meta}: not a {MODELSET_FORMAT} file")
    if doc.get("digest_sha256") != digest(doc):
        raise fail(Reason.METADATA, f"{meta}: its digest does not match its content (the file was edited)")
    if not isinstance(doc.get("files"), dict) or not isinstance(doc.get("lineage"), dict):
        raise fail(Reason.METADATA, f"{meta}: 'files' and 'lineage' must be objects")
    return doc


def integrity(path: Path, task: str, version: str, located: bool = True) -> list[Problem]:
    """Problems of the set directory ``path`` (``located``: it should be ``<task>/<version>``)."""
    try:
        doc = read_modelset(path)
    except RegistryError as exc:
        return exc.problems
    problems = []
    if located and (doc.get("version") != version or doc.get("task") != task):
        problems.append(Problem(Reason.METADATA, f"{path / MODELSET_FILE}: describes {doc.get('task')}/"
                                                 f"{doc.get('version')}, not {task}/{version}"))
    files = doc["files"]
    for name in sorted(REQUIRED_FILES - set(files)):
        problems.append(Problem(Reason.MISSING_FILE, f"{version}: modelset.json lists no {name}"))
    intact: dict[str, str] = {}  # name -> its SHA-256, for the files that match modelset.json
    for name, want in sorted(files.items()):
        f = path / name
        if not f.is_file():
            problems.append(Problem(Reason.MISSING_FILE, f"{version}: {name} is missing"))
            continue
        got = sha256_file(f)
        if got != want:
            problems.append(Problem(Reason.HASH_MISMATCH, f"{version}: {name} has SHA-256 {got[:16]}..., "
                                                          f"modelset.json records {str(want)[:16]}..."))
        else:
            intact[name] = got
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        rel = f.relative_to(path).as_posix()
        if rel != MODELSET_FILE and rel not in files:
            problems.append(Problem(Reason.UNLISTED_FILE, f"{version}: {rel} is not in modelset.json "
                                                          "(added after registration)"))
    if REQUIRED_FILES <= intact.keys():
        problems += _sidecar_problems(path, version, doc["lineage"], intact)
    return problems


def _sidecar_problems(path: Path, version: str, lineage: dict, intact: dict[str, str]) -> list[Problem]:
    """The sidecars against their models and the lineage; the calibrations (``intact`` ones) against the world
    model. ``intact``: the files' SHA-256s just computed (not hashed again: every registry lookup runs this,
    a hot swap's loaders too)."""
    problems, metas = [], {}
    for kind, onnx in MODEL_FILES.items():
        try:
            metas[kind] = meta = read_sidecar(path / onnx, sha256=intact.get(onnx))
        except ModelError as exc:
            problems.append(Problem(Reason.SIDECAR, f"{version}: {exc}"))
            continue
        if meta["model_kind"] != kind:
            problems.append(Problem(Reason.SIDECAR, f"{version}: {onnx} is a {meta['model_kind']!r} model"))
        recorded = lineage.get(kind) or {}
        if recorded.get("version") != meta["version"] or recorded.get("sha256") != meta["sha256"]:
            problems.append(Problem(Reason.METADATA, f"{version}: lineage names {kind} {recorded.get('version')}, "
                                                     f"the sidecar is {meta['version']}"))
        for key in ("joint_names", "dt_s"):
            if meta[key] != lineage.get(key):
                problems.append(Problem(Reason.SIDECAR, f"{version}: {onnx}'s {key} {meta[key]!r} differs from "
                                                        f"the set's {lineage.get(key)!r}"))
    if "world_model" in metas:
        wm_version = metas["world_model"]["version"]
        for name in sorted(n for n in intact if n.startswith(TRUST_DIR + "/")):
            got = calibration_version(path / name)
            if got != wm_version:
                problems.append(Problem(Reason.CALIBRATION, f"{version}: {name} is for world model {got!r}, the "
                                                            f"set's is {wm_version!r}"))
    return problems


def compatibility(info: ModelSetInfo, task: str, robot: RobotFacts) -> list[Problem]:
    """Whether the set ``info`` fits ``task`` and the robot ``robot`` (description, joints, period)."""
    lin = info.lineage
    problems = []
    if lin.get("task") != task:
        problems.append(Problem(Reason.TASK, f"{info.version}: its policy was made for task {lin.get('task')!r}, "
                                             f"not {task!r}"))
    if lin.get("robot_description_sha256") != robot.description_sha256:
        problems.append(Problem(Reason.ROBOT_DESCRIPTION, f"{info.version}: made for robot description "
                                f"{str(lin.get('robot_description_sha256'))[:16]}..., this install runs "
                                f"{robot.description_sha256[:16]}... (urdf/ changed since it was made)"))
    if tuple(lin.get("joint_names") or ()) != robot.joint_names:
        problems.append(Problem(Reason.JOINT_NAMES, f"{info.version}: joint order {lin.get('joint_names')}, "
                                                    f"this robot's is {list(robot.joint_names)}"))
    dt_s = lin.get("dt_s")
    if not isinstance(dt_s, (int, float)) or abs(float(dt_s) - robot.dt_s) > 1e-9:
        problems.append(Problem(Reason.CONTROL_PERIOD, f"{info.version}: trained for dt_s={dt_s}, the controller "
                                f"runs at control_period_s={robot.dt_s:g} (config/control.yaml)"))
    return problems
