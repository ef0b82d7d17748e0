"""The model registry (robot_wm.registry): versioned sets, the active pointer, refusals, resolution."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from robot_wm import registry as registry_module
from robot_wm.core.onnx_model import ModelError, sha256_file
from robot_wm.paths import data_path
from robot_wm.registry import Reason, Registry, RegistryError, resolve

MODEL_NAMES = ("world_model.onnx", "world_model.json", "policy.onnx", "policy.json")
BAG = "ab" * 32  # a demonstration bag's SHA-256


@pytest.fixture
def root(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "registry"
    monkeypatch.setenv("ROBOT_WM_MODELS_DIR", str(path))
    return path


@pytest.fixture
def reg(root) -> Registry:
    reg = Registry()
    reg.ensure_shipped()
    return reg


def make_set(tmp_path: Path, shipped: str = "models/track", calibrations: str | None = "models/trust/track",
             name: str = "set", **sidecar_changes) -> Path:
    """A set directory copied from a shipped one; ``sidecar_changes`` are written into both sidecars."""
    out = tmp_path / name
    out.mkdir()
    for n in MODEL_NAMES:
        shutil.copyfile(data_path(*shipped.split("/"), n), out / n)
    if calibrations:
        (out / "trust").mkdir()
        shutil.copyfile(data_path(*calibrations.split("/"), "nominal.json"), out / "trust" / "nominal.json")
    for side in ("world_model.json", "policy.json"):
        meta = json.loads((out / side).read_text())
        meta.update({k: v for k, v in sidecar_changes.items() if k != "task" or side == "policy.json"})
        (out / side).write_text(json.dumps(meta))
    return out


def active_version(reg: Registry, task: str) -> str:
    return reg.active_pointer(task)["version"]


# ---- an empty registry is today's behaviour
def test_an_empty_registry_resolves_every_default_to_the_shipped_file(root):
    warnings = []
    cases = {("reach", "world_model"): ("models", "world_model.onnx"),
             ("reach", "policy"): ("models", "policy.onnx"),
             ("track", "world_model"): ("models", "track", "world_model.onnx"),
             ("track", "policy"): ("models", "track", "policy.onnx"),
             ("reach", "calibration"): ("models", "trust", "real_twin.json"),
             ("track", "calibration"): ("models", "trust", "track", "nominal.json")}
    for (task, kind), parts in cases.items():
        profile = "real_twin" if parts[-1] == "real_twin.json" else "nominal"
        assert resolve(task, kind, profile=profile, warn=warnings.append) == data_path(*parts)
    assert warnings == [] and not root.exists()  # resolving writes nothing


def test_ensure_shipped_registers_the_four_shipped_sets_once(root):
    reg = Registry()
    first = reg.ensure_shipped()
    assert [i.shipped for i in first] == ["models", "models/reach_sim_only", "models/track", "models/track_sim_only"]
    assert [i.version.split("-")[1] for i in first] == ["0001", "0002", "0001", "0002"]
    assert active_version(reg, "reach") == first[0].version and active_version(reg, "track") == first[2].version
    assert first[0].calibrations == ["nominal", "real_twin"] and first[2].calibrations == ["nominal", "real_twin"]
    assert first[1].calibrations == [] and first[3].calibrations == []  # none made for their world models
    assert first[2].files["policy.onnx"] == sha256_file(data_path("models", "track", "policy.onnx"))
    assert first[0].lineage["command"] == "tools/train_default_models.sh reach"
    assert first[0].lineage["training_data"]["sim_dataset_sha256"].startswith("d58c2d20")
    assert all(reg.check(i.task, i.version) == [] for i in first)
    again = Registry().ensure_shipped()
    assert [i.version for i in again] == [i.version for i in first]
    assert sum(len(reg.versions(t)) for t in ("reach", "track")) == 4
    # an operator's choice is kept: the shipped default is not re-activated over it
    reg.activate("reach", first[1].version)
    reg.ensure_shipped()
    assert active_version(reg, "reach") == first[1].version


# ---- add, list, get
def test_add_copies_the_set_with_its_lineage_and_lists_it(reg, tmp_path):
    parent = active_version(reg, "track")
    src = make_set(tmp_path)
    info = reg.add(src, "track", parent=parent, lineage={
        "training_data": {"demo_bags_sha256": [BAG]}, "command": "robot-wm adapt --task track",
        "metrics": {"success": 0.9}, "adapt": {"demos": 1}})
    assert info.version.startswith("track-0003-") and len(info.version) == len("track-0003-") + 8
    assert info.parent == parent and info.path == reg.root / "track" / info.version
    lin = info.lineage
    assert lin["training_data"] == {"sim_dataset_sha256": json.loads((src / "policy.json").read_text())[
        "training_data_sha256"], "demo_bags_sha256": [BAG]}
    assert lin["command"] == "robot-wm adapt --task track" and lin["metrics"] == {"success": 0.9}
    assert lin["adapt"] == {"demos": 1} and lin["task"] == "track" and lin["dt_s"] == 0.01
    assert lin["policy"]["version"] == json.loads((src / "policy.json").read_text())["version"]
    assert lin["robot_description_sha256"] == reg.robot.description_sha256
    assert sorted(info.files) == sorted([*MODEL_NAMES, "trust/nominal.json"])
    assert reg.get("track", info.version) == info
    assert [i.version for i in reg.list("track")][-1] == info.version
    assert active_version(reg, "track") == parent  # add does not activate by default
    shutil.rmtree(src)  # the registry holds a copy
    assert reg.verify("track", info.version) == []


def test_add_refuses_what_it_cannot_vouch_for_and_registers_nothing(reg, tmp_path):
    before = reg.versions("track")
    src = make_set(tmp_path)
    with pytest.raises(RegistryError, match="parent 'track-0099-00000000' is not a registered version"):
        reg.add(src, "track", parent="track-0099-00000000", lineage={})
    with pytest.raises(RegistryError, match="demo_bags_sha256"):
        reg.add(src, "track", parent=None, lineage={"training_data": {"demo_bags_sha256": ["not-a-hash"]}})
    with pytest.raises(RegistryError, match="read from the sidecars"):
        reg.add(src, "track", parent=None, lineage={"dt_s": 0.02})
    with pytest.raises(RegistryError, match="task 'reech'"):
        reg.add(src, "reech", parent=None, lineage={})
    tampered = make_set(tmp_path, name="tampered")
    with open(tampered / "policy.onnx", "ab") as fh:
        fh.write(b"\0")
    with pytest.raises(RegistryError, match="policy.onnx: SHA-256"):
        reg.add(tampered, "track", parent=None, lineage={})
    (src / "world_model.json").unlink()
    with pytest.raises(RegistryError, match="no world_model.json"):
        reg.add(src, "track", parent=None, lineage={})
    other = make_set(tmp_path, shipped="models/track_sim_only", name="other")  # a calibration of another model
    with pytest.raises(RegistryError, match="trust/nominal.json is for world model"):
        reg.add(other, "track", parent=None, lineage={})
    assert reg.versions("track") == before and not list((reg.root / "track").glob(".staging-*"))


# ---- activation, rollback
def test_activate_and_rollback_walk_the_pointer_history(reg, tmp_path):
    shipped = active_version(reg, "track")
    a = reg.add(make_set(tmp_path, name="a"), "track", parent=shipped, lineage={}, activate=True)
    b = reg.add(make_set(tmp_path, name="b"), "track", parent=a.version, lineage={})
    reg.activate("track", b.version)
    assert reg.active_pointer("track")["previous"] == [a.version, shipped]
    assert reg.active("track") == b
    assert reg.rollback("track").version == a.version
    assert reg.active_pointer("track")["previous"] == [shipped]
    assert reg.rollback("track").version == shipped
    with pytest.raises(RegistryError, match="no previously active version"):
        reg.rollback("track")
    with pytest.raises(RegistryError, match="has no version 'track-0042-deadbeef'"):
        reg.activate("track", "track-0042-deadbeef")


def test_resolve_returns_the_active_sets_files_and_follows_a_rollback(reg, tmp_path):
    shipped = reg.active("track")
    new = reg.add(make_set(tmp_path), "track", parent=shipped.version, lineage={}, activate=True)
    warnings = []
    assert resolve("track", "policy", warn=warnings.append) == new.path / "policy.onnx"
    assert resolve("track", "world_model", warn=warnings.append) == new.path / "world_model.onnx"
    assert resolve("track", "calibration", profile="nominal", warn=warnings.append) == new.path / "trust/nominal.json"
    assert warnings == []
    # a profile the set has no calibration for: the shipped file, said in a warning
    assert resolve("track", "calibration", profile="real_twin", warn=warnings.append) == \
        data_path("models", "trust", "track", "real_twin.json", must_exist=False)
    assert "no trust calibration for profile 'real_twin'" in warnings[0]
    reg.rollback("track")
    assert resolve("track", "policy") == shipped.path / "policy.onnx"
    assert resolve("reach", "world_model") == reg.active("reach").path / "world_model.onnx"


# ---- atomicity: a crash between writing and switching
def test_a_crash_while_adding_leaves_the_active_set_active_and_intact(reg, tmp_path, monkeypatch):
    active = reg.active("track")
    versions = reg.versions("track")

    def crash(*args, **kwargs):
        raise OSError("power cut")

    with monkeypatch.context() as patch:
        patch.setattr(registry_module.os, "rename", crash)  # the set is written, not yet in place
        with pytest.raises(OSError, match="power cut"):
            reg.add(make_set(tmp_path, name="a"), "track", parent=None, lineage={}, activate=True)
    assert reg.versions("track") == versions and reg.active("track") == active
    assert reg.check("track", active.version) == []
    assert not list((reg.root / "track").glob(".staging-*"))  # cleaned up on the way out

    # a hard crash leaves its staging directory behind (no cleanup ran): never listed, removed by the next add
    with monkeypatch.context() as patch:
        patch.setattr(registry_module.os, "rename", crash)
        patch.setattr(registry_module.shutil, "rmtree", lambda *a, **k: None)
        with pytest.raises(OSError):
            reg.add(make_set(tmp_path, name="b"), "track", parent=None, lineage={}, activate=True)
    assert len(list((reg.root / "track").glob(".staging-*"))) == 1
    assert reg.versions("track") == versions and reg.active("track") == active
    assert resolve("track", "policy") == active.path / "policy.onnx"
    info = reg.add(make_set(tmp_path, name="c"), "track", parent=None, lineage={})
    assert not list((reg.root / "track").glob(".staging-*")) and info.version.startswith("track-0003-")


def test_a_crash_while_switching_leaves_the_previous_set_active(reg, tmp_path, monkeypatch):
    active = reg.active("track")
    pointer = (reg.root / "track" / "active.json").read_bytes()
    new = reg.add(make_set(tmp_path), "track", parent=active.version, lineage={})

    def crash(*args, **kwargs):
        raise OSError("power cut")

    with monkeypatch.context() as patch:
        patch.setattr(registry_module.os, "replace", crash)  # the new pointer is written, not yet in place
        with pytest.raises(OSError, match="power cut"):
            reg.activate("track", new.version)
        with pytest.raises(OSError, match="power cut"):
            reg.add(make_set(tmp_path, name="again"), "track", parent=None, lineage={}, activate=True)
    assert (reg.root / "track" / "active.json").read_bytes() == pointer
    assert reg.active("track") == active and reg.check("track", active.version) == []
    assert sorted(p.name for p in (reg.root / "track").iterdir() if p.is_file()) == ["active.json"]  # no temp left
    assert resolve("track", "policy") == active.path / "policy.onnx"
    assert reg.activate("track", new.version).version == new.version  # and it works once the disk is back


# ---- refusals, each naming its reason
def _refusal(reg: Registry, task: str, version: str) -> RegistryError:
    before = reg.active_pointer(task)
    with pytest.raises(RegistryError) as err:
        reg.activate(task, version)
    assert reg.active_pointer(task) == before  # nothing switched
    return err.value


def test_a_tampered_missing_or_added_file_is_refused_naming_it(reg, tmp_path):
    sets = [reg.add(make_set(tmp_path, name=n), "track", parent=None, lineage={}) for n in "abcd"]
    with open(sets[0].path / "policy.onnx", "r+b") as fh:
        fh.seek(100)
        byte = fh.read(1)
        fh.seek(100)
        fh.write(bytes([byte[0] ^ 1]))
    (sets[1].path / "trust" / "nominal.json").unlink()
    (sets[2].path / "notes.txt").write_text("added later")
    doc = json.loads((sets[3].path / "modelset.json").read_text())
    doc["lineage"]["dt_s"] = 0.02
    (sets[3].path / "modelset.json").write_text(json.dumps(doc))
    expected = [(Reason.HASH_MISMATCH, "policy.onnx has SHA-256"),
                (Reason.MISSING_FILE, "trust/nominal.json is missing"),
                (Reason.UNLISTED_FILE, "notes.txt is not in modelset.json"),
                (Reason.METADATA, "digest does not match")]
    for info, (reason, words) in zip(sets, expected):
        err = _refusal(reg, "track", info.version)
        assert [p.reason for p in err.problems] == [reason], err.problems
        assert words in str(err) and f"refusing to activate track {info.version}" in str(err)
        assert [p.reason for p in reg.verify("track", info.version)] == [reason]


@pytest.mark.parametrize("changes, lineage, reason, words", [
    ({"task": "reach"}, {}, Reason.TASK, "made for task 'reach', not 'track'"),
    ({"joint_names": [f"j{i}" for i in range(6)]}, {}, Reason.JOINT_NAMES, "joint order ['j0'"),
    ({"dt_s": 0.02}, {}, Reason.CONTROL_PERIOD, "trained for dt_s=0.02, the controller runs at control_period_s=0.01"),
    ({}, {"robot_description_sha256": "0" * 64}, Reason.ROBOT_DESCRIPTION, "made for robot description 0000"),
])
def test_a_set_made_for_another_task_robot_or_period_is_refused(reg, tmp_path, changes, lineage, reason, words):
    info = reg.add(make_set(tmp_path, **changes), "track", parent=None, lineage=lineage)
    assert reg.verify("track", info.version) == []  # intact: registered, only not for this install
    err = _refusal(reg, "track", info.version)
    assert [p.reason for p in err.problems] == [reason] and words in str(err), str(err)


def test_the_robot_description_hash_ignores_the_install_path_and_the_hardware_plugin():
    from robot_wm.registry import robot_facts

    facts = robot_facts()
    assert len(facts.description_sha256) == 64 and facts.dt_s == 0.01 and len(facts.joint_names) == 6
    assert Registry(robot=facts).robot is facts


def test_the_robot_facts_are_computed_once_per_description_and_control_file(tmp_path, monkeypatch):
    """Every registry lookup checks a set against them (a hot swap's loader too), and computing them
    holds the interpreter lock in stretches: once per control.yaml and its modification time."""
    import os

    from robot_wm.paths import _MARKER, DataFileError, share_dir
    from robot_wm.registry import robot_facts

    share = tmp_path / "share"
    for part in ("config", "urdf"):
        shutil.copytree(share_dir() / part, share / part)
    shutil.copyfile(share_dir() / _MARKER, share / _MARKER)
    monkeypatch.setenv("ROBOT_WM_SHARE", str(share))
    first = robot_facts()
    assert robot_facts() is first and first.dt_s == 0.01
    control = share / "config" / "control.yaml"
    control.write_text(control.read_text().replace("control_period_s: 0.01", "control_period_s: 0.002", 1))
    later = control.stat().st_mtime_ns + 1_000_000_000
    os.utime(control, ns=(later, later))
    changed = robot_facts()
    assert changed.dt_s == 0.002 and changed.description_sha256 == first.description_sha256
    control.unlink()
    with pytest.raises(DataFileError, match="control.yaml"):  # a missing file is never taken from the cache
        robot_facts()


def test_a_check_of_a_set_hashes_each_model_once(reg, tmp_path, monkeypatch):
    """Every registry lookup checks the active set (a hot swap's loaders too): the sidecars are checked
    against the hashes just computed, not hashed again."""
    from collections import Counter

    from robot_wm import modelset
    from robot_wm.core import onnx_model

    info = reg.add(make_set(tmp_path), "track", parent=None, lineage={})
    counts = Counter()
    real = onnx_model.sha256_file
    monkeypatch.setattr(modelset, "sha256_file", lambda p: (counts.update([Path(p).name]), real(p))[1])
    monkeypatch.setattr(onnx_model, "sha256_file", lambda p: (counts.update([Path(p).name]), real(p))[1])
    assert reg.check("track", info.version) == []
    assert counts["world_model.onnx"] == 1 and counts["policy.onnx"] == 1, counts
    # the hash handed over is the one the sidecar is checked against: a sidecar for another file is refused
    with pytest.raises(ModelError, match="does not match the sidecar"):
        onnx_model.read_sidecar(info.path / "policy.onnx", sha256="0" * 64)


# ---- resolution never loads a refused set
def test_resolve_raises_for_a_refused_active_set_and_falls_back_only_for_an_unreadable_pointer(reg, tmp_path):
    new = reg.add(make_set(tmp_path), "track", parent=None, lineage={}, activate=True)
    (new.path / "world_model.onnx").write_bytes(b"not a model")
    for kind in ("world_model", "policy", "calibration"):
        with pytest.raises(ModelError, match=f"active track model set {new.version} .* is refused: .*world_model.onnx"):
            resolve("track", kind)
    (reg.root / "track" / "active.json").write_text("{ half a file")
    warnings = []
    assert resolve("track", "policy", warn=warnings.append) == data_path("models", "track", "policy.onnx")
    assert "active.json: unreadable" in warnings[0] and "using the shipped policy" in warnings[0]
    assert reg.activate("track", reg.versions("track")[0])  # activation repairs the pointer


# ---- the node graph: the world model and the safety filter learn the task
def test_the_world_model_node_and_the_filter_get_the_task_of_the_graph():
    from robot_wm import graph

    for task in ("reach", "track"):
        for composed in (False, True):
            specs = {s.name: s for s in graph.plan("mujoco", task=task, composed=composed)}
            hosts = [specs["control_stack"]] if composed else [specs["world_model"], specs["safety_filter"]]
            assert all(s.parameters["task"] == task for s in hosts)


# ---- the command line
def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    from robot_wm.cli import main

    with pytest.raises(SystemExit) as done:
        main(["models", *argv])
    out = capsys.readouterr()
    return done.value.code, out.out, out.err


def test_cli_round_trip(root, tmp_path, capsys):
    code, out, _ = _cli(capsys, "list", "--json")
    rows = json.loads(out)
    assert code == 0 and [r["version"].split("-")[1] for r in rows] == ["0001", "0002", "0001", "0002"]
    shipped = next(r["version"] for r in rows if r["task"] == "track" and r["active"])
    code, out, _ = _cli(capsys, "import", str(make_set(tmp_path)), "--task", "track", "--parent", shipped,
                        "--demo-bag-sha256", BAG, "--command", "robot-wm adapt --task track")
    assert code == 0 and "registered track-0003-" in out
    version = out.split("registered ")[1].split()[0]
    code, out, _ = _cli(capsys, "activate", "track", version, "--no-announce")  # (announcing: test_online_ros)
    assert code == 0 and f"{version} active" in out
    code, out, _ = _cli(capsys, "show", "track", "active", "--json")
    doc = json.loads(out)
    assert doc["version"] == version and doc["parent"] == shipped and doc["active"] is True
    assert doc["lineage"]["training_data"]["demo_bags_sha256"] == [BAG]
    code, out, _ = _cli(capsys, "show", "track", version)
    assert code == 0 and "(active)" in out and f"parent:       {shipped}" in out
    code, out, _ = _cli(capsys, "list", "--task", "track")
    assert code == 0 and f"* {version}" in out
    code, out, _ = _cli(capsys, "verify")
    assert code == 0 and "5 of 5 model sets verified" in out

    (Registry().root / "track" / version / "policy.json").write_text("{}")
    code, out, _ = _cli(capsys, "verify", "track")
    assert code == 1 and "[hash mismatch]" in out and "policy.json has SHA-256" in out and "2 of 3" in out
    code, out, _ = _cli(capsys, "verify", "track", shipped)
    assert code == 0 and "1 of 1" in out
    code, _, err = _cli(capsys, "activate", "track", version)  # already active; refused all the same
    assert code == 1 and "refusing to activate" in err and "[hash mismatch]" in err
    code, out, _ = _cli(capsys, "rollback", "track", "--no-announce")
    assert code == 0 and f"rolled back from {version} to {shipped}" in out
    code, _, err = _cli(capsys, "rollback", "track")
    assert code == 1 and "no previously active version" in err
    code, _, err = _cli(capsys, "show", "track", "track-0077-00000000")
    assert code == 1 and "no such model set" in err


# ---- the nodes load the active set by default, and explicit paths still win
@pytest.mark.ros
def test_the_nodes_load_the_active_set_and_an_explicit_path_wins(reg, tmp_path, monkeypatch):
    import rclpy
    from rclpy.context import Context

    from robot_wm.nodes.policy_node import PolicyNode
    from robot_wm.nodes.safety_filter_node import SafetyFilterNode
    from robot_wm.nodes.trust_monitor import TrustMonitorNode
    from robot_wm.nodes.world_model_node import WorldModelNode

    new = reg.add(make_set(tmp_path), "track", parent=None, lineage={}, activate=True)

    def configured(args: list[str]) -> dict[str, str]:
        context = Context()
        rclpy.init(context=context, args=["--ros-args", "-p", "autostart:=false", *args])
        nodes = [cls(context=context) for cls in (PolicyNode, WorldModelNode, SafetyFilterNode, TrustMonitorNode)]
        try:
            for node in nodes:
                node.trigger_configure()
            policy, wm, filt, trust = nodes
            return {"policy": str(policy.runner.model.path), "world_model": str(wm.runner.model.path),
                    "filter": str(filt.controller.model.model.path), "calibration": trust._path}
        finally:
            for node in nodes:
                node.destroy_node()
            rclpy.shutdown(context=context)

    paths = configured(["-p", "task:=track"])
    assert paths == {"policy": str(new.path / "policy.onnx"), "world_model": str(new.path / "world_model.onnx"),
                     "filter": str(new.path / "world_model.onnx"), "calibration": str(new.path / "trust/nominal.json")}
    explicit = str(data_path("models", "track", "world_model.onnx"))
    paths = configured(["-p", "task:=track", "-p", f"world_model_path:={explicit}",
                        "-p", f"world_model:model_path:={explicit}"])
    assert paths["filter"] == explicit and paths["world_model"] == explicit
    assert paths["policy"] == str(new.path / "policy.onnx")
    monkeypatch.setenv("ROBOT_WM_MODELS_DIR", str(tmp_path / "empty"))
    paths = configured([])
    assert paths == {"policy": str(data_path("models", "policy.onnx")),
                     "world_model": str(data_path("models", "world_model.onnx")),
                     "filter": str(data_path("models", "world_model.onnx")),
                     "calibration": str(data_path("models", "trust", "nominal.json"))}


def test_the_registry_needs_no_ros_torch_or_onnxruntime(tmp_path):
    """Import, register, verify, activate and resolve with rclpy, torch, onnx and onnxruntime blocked."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import importlib.abc, sys

        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("rclpy", "torch", "onnx", "onnxruntime"):
                    raise ImportError(f"{name} is blocked in this test")

        sys.meta_path.insert(0, Block())
        from robot_wm import registry_cli  # noqa: F401
        from robot_wm.registry import Registry, resolve

        reg = Registry(sys.argv[1])
        shipped = reg.ensure_shipped()
        assert all(reg.check(i.task, i.version) == [] for i in shipped)
        reg.activate("track", shipped[3].version)
        assert resolve("track", "policy", root=sys.argv[1]) == shipped[3].path / "policy.onnx"
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", script, str(tmp_path / "reg")], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0 and "ok" in result.stdout, result.stdout + result.stderr


def test_a_tampered_active_set_holds_the_arm_and_ends_no_process(reg, tmp_path):
    """A file of the active set changed after activation: the filter configures without a model and
    holds the arm with a zero command, the fault latched and an operator's reset refused
    (require_model), the policy node refuses to
    configure, the trust monitor says STOP naming the problem — and each node stays up."""
    import numpy as np
    import rclpy
    from rclpy.context import Context
    from rclpy.lifecycle import TransitionCallbackReturn

    from robot_wm import description
    from robot_wm.core.safety import FilterState, JointSample, NominalSample, TrustSample, WrenchSample
    from robot_wm.core.safety.limits import Phase, TrustLevel
    from robot_wm.nodes.policy_node import PolicyNode
    from robot_wm.nodes.safety_filter_node import SafetyFilterNode
    from robot_wm.nodes.trust_monitor import TrustMonitorNode

    new = reg.add(make_set(tmp_path), "track", parent=None, lineage={}, activate=True)
    with open(new.path / "world_model.onnx", "ab") as fh:
        fh.write(b"tampered")
    context = Context()
    rclpy.init(context=context, args=["--ros-args", "-p", "autostart:=false", "-p", "task:=track"])
    nodes = [cls(context=context) for cls in (PolicyNode, SafetyFilterNode, TrustMonitorNode)]
    try:
        policy, filt, trust = nodes
        assert policy.on_configure(None) == TransitionCallbackReturn.FAILURE
        filt.trigger_configure()
        assert filt.controller is not None and filt.controller.model is None
        q0 = description.initial_positions(description.joint_limits(description.expand()).names)
        ctrl = filt.controller
        for k in range(40):  # an operator's reset and full trust do not make it move either
            t = 0.01 * k
            out = ctrl.step(t, joint=JointSample(q0, np.zeros(6), t), nominal=NominalSample(np.full(6, 0.5), t),
                            wrench=WrenchSample(np.zeros(3), t, ctrl.config.ft_frame),
                            trust=TrustSample(TrustLevel.FULL, Phase.SIM, t, "test"))
            assert out.state in (FilterState.ESTOP, FilterState.FAULT) and not np.any(out.u_safe_radps), out
            if k == 30:
                ok, why = ctrl.reset()
                assert not ok, why  # refused while the fault persists
        assert "world model missing (require_model)" in out.reason, out.reason
        trust.trigger_configure()
        assert trust.problem and "world_model.onnx" in trust.problem
    finally:
        for node in nodes:
            node.destroy_node()
        rclpy.shutdown(context=context)
