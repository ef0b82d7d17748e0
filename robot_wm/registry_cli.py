"""`robot-wm models ...`: the model registry from the command line (robot_wm.registry).

Every verb first registers the shipped sets (idempotent: ``Registry.ensure_shipped``), so the
registry is never empty. Exit status: 0; 1 when a set is refused, fails verification or is not
found (the reason, and each problem, on stderr; `verify` lists them on stdout); 2 for a usage error.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any


ANNOUNCE_WAIT_S = 5.0  # at most this long the CLI waits for a running graph to discover it (less when one does)
ANNOUNCE_SETTLE_S = 1.0  # ... and this long after the last of its nodes has
ANNOUNCE_MAX_S = 15.0  # in all

def _registry():
    from robot_wm.registry import Registry

    reg = Registry()
    reg.ensure_shipped()
    return reg


def _summary(info, active: bool) -> dict[str, Any]:
    lin = info.lineage
    return {"task": info.task, "version": info.version, "active": active, "parent": info.parent,
            "created_utc": info.doc.get("created_utc"), "world_model": lin["world_model"]["version"],
            "policy": lin["policy"]["version"], "calibrations": info.calibrations,
            "demo_bags": len(lin["training_data"]["demo_bags_sha256"]), "shipped": info.shipped,
            "path": str(info.path)}


def _active_versions(reg, tasks) -> dict[str, str | None]:
    from robot_wm.registry import RegistryError

    out = {}
    for task in tasks:
        try:
            pointer = reg.active_pointer(task)
        except RegistryError as exc:
            print(f"robot-wm models: {exc}", file=sys.stderr)
            pointer = None
        out[task] = pointer["version"] if pointer else None
    return out


def _fail(exc: Exception) -> int:
    print(f"robot-wm models: {exc}", file=sys.stderr)
    for problem in getattr(exc, "problems", []):
        print(f"  - [{problem.reason.value}] {problem.text}", file=sys.stderr)
    return 1


def _cmd_list(args: argparse.Namespace) -> int:
    from robot_wm.registry import RegistryError, known_tasks

    try:
        reg = _registry()
        tasks = [args.task] if args.task else list(known_tasks())
        active = _active_versions(reg, tasks)
        rows = [_summary(i, active[i.task] == i.version) for t in tasks for i in reg.list(t)]
    except RegistryError as exc:
        return _fail(exc)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"registry {reg.root}")
    for r in rows:
        origin = f"shipped {r['shipped']}/" if r["shipped"] else f"parent {r['parent'] or '-'}"
        print(f"{'*' if r['active'] else ' '} {r['version']:<22} {r['created_utc'] or '':<20} {r['world_model']:<26} "
              f"{r['policy']:<30} {origin}")
    print("* = active")
    return 0


def _cmd_show(args: argparse.Namespace) -> int:
    from robot_wm.registry import RegistryError

    try:
        reg = _registry()
        info = reg.active(args.task) if args.version == "active" else reg.get(args.task, args.version)
        if info is None:
            raise RegistryError(f"{args.task}: no active model set")
        active = _active_versions(reg, [args.task])[args.task] == info.version
    except RegistryError as exc:
        return _fail(exc)
    if args.json:
        print(json.dumps({**info.doc, "path": str(info.path), "active": active}, indent=2))
        return 0
    lin, data = info.lineage, info.lineage["training_data"]
    lines = [
        ("version", f"{info.version}{'  (active)' if active else ''}"), ("task", info.task),
        ("path", str(info.path)), ("parent", info.parent or "-"),
        ("created", f"{info.doc.get('created_utc')} ({time.ctime(info.created_unix_s)})"),
        ("source", f"{info.source or '-'}{f'  (shipped {info.shipped})' if info.shipped else ''}"),
        ("world model", f"{lin['world_model']['version']}  sha256 {lin['world_model']['sha256'][:16]}..."),
        ("policy", f"{lin['policy']['version']}  sha256 {lin['policy']['sha256'][:16]}...  (task {lin.get('task')})"),
        ("calibrations", ", ".join(info.calibrations) or "-"),
        ("sim data", data["sim_dataset_sha256"] or "-"),
        ("demo bags", f"{len(data['demo_bags_sha256'])}" + "".join(f"\n{'':14}{h}" for h in data["demo_bags_sha256"])),
        ("command", lin["command"]),
        ("robot", f"description {lin['robot_description_sha256'][:16]}..., dt_s {lin['dt_s']}, "
                  f"joints {', '.join(lin['joint_names'])}"),
        ("metrics", ", ".join(lin["metrics"]) or "-"),
        ("files", "".join(f"\n{'':14}{h[:16]}...  {n}" for n, h in info.files.items())),
    ]
    for key, value in lines:
        print(f"{key + ':':<13} {value}")
    print("(--json for the metrics and the full lineage)")
    return 0


def _cmd_activate(args: argparse.Namespace) -> int:
    from robot_wm.registry import RegistryError

    try:
        info = _registry().activate(args.task, args.version)
    except RegistryError as exc:
        return _fail(exc)
    print(f"{args.task}: {info.version} active (policy {info.lineage['policy']['version']}, world model "
          f"{info.lineage['world_model']['version']})")
    _announce(args, "activate", f"activated by an operator (robot-wm models activate {args.task} {args.version})")
    return 0


def _cmd_rollback(args: argparse.Namespace) -> int:
    from robot_wm.registry import RegistryError

    try:
        reg = _registry()
        before = _active_versions(reg, [args.task])[args.task]
        info = reg.rollback(args.task)
    except RegistryError as exc:
        return _fail(exc)
    print(f"{args.task}: rolled back from {before} to {info.version}")
    _announce(args, "rollback", f"rolled back by an operator (robot-wm models rollback {args.task})", before)
    return 0


def _announce(args: argparse.Namespace, action: str, reason: str, previous: str = "") -> None:
    """Tell a running graph (``/robot_wm/model_update``): its world_model node and safety filter swap the
    task's active world model in between two periods; a node started later loads it anyway."""
    if not args.announce:
        print("not announced (--no-announce): running nodes keep their world model until their next configure")
        return
    import rclpy
    from rclpy.duration import Duration

    from robot_wm.msg import ModelUpdate
    from robot_wm.nodes.model_swap import UPDATE_QOS, UPDATE_TOPIC
    from robot_wm.nodes.trust_swap import announce
    from robot_wm.rosenv import apply_loopback_dds

    apply_loopback_dds()
    context = rclpy.Context()
    rclpy.init(context=context)
    try:
        node = rclpy.create_node("robot_wm_models_cli", context=context)
        pub = node.create_publisher(ModelUpdate, UPDATE_TOPIC, UPDATE_QOS)
        listeners = _wait_for_listeners(node, pub)
        announce(node, pub, args.task, action, reason, previous_set=previous)
        pub.wait_for_all_acked(Duration(seconds=ANNOUNCE_WAIT_S))  # delivered before the node goes
        print(f"announced on /robot_wm/model_update ({listeners} running node(s) listening: they swap it in "
              "between two periods)" if listeners else "no running graph heard it: nodes load it when they start")
        node.destroy_node()
    finally:
        rclpy.shutdown(context=context)


def _wait_for_listeners(node, pub) -> int:
    """Let a running graph's nodes match the announcement's publisher (discovery), and return how many did.

    Waits up to ``ANNOUNCE_WAIT_S`` for the first; then until every subscriber the graph knows of has
    matched and no new one has for ``ANNOUNCE_SETTLE_S``, within ``ANNOUNCE_MAX_S`` in all. A loaded machine
    can discover the nodes one by one over more than a second; a reader that matches after the publisher
    has gone never hears the announcement (it is acknowledged only by those matched). A fixed second
    after the first match is what a CI run's rollback had when it never reached the filter and the
    world_model node."""
    from robot_wm.nodes.model_swap import UPDATE_TOPIC

    start = time.monotonic()
    seen, since = 0, start
    while True:
        now = time.monotonic()
        matched = pub.get_subscription_count()
        if matched != seen:
            seen, since = matched, now
        if not matched and now - start >= ANNOUNCE_WAIT_S:
            return 0
        if matched and matched >= node.count_subscribers(UPDATE_TOPIC) and now - since >= ANNOUNCE_SETTLE_S:
            return matched
        if now - start >= ANNOUNCE_MAX_S:
            return matched
        time.sleep(0.05)


def _cmd_verify(args: argparse.Namespace) -> int:
    from robot_wm.registry import RegistryError, known_tasks

    try:
        reg = _registry()
        tasks = [args.task] if args.task else list(known_tasks())
        targets = [(t, v) for t in tasks for v in ([args.version] if args.version else reg.versions(t))]
        if args.version and args.version not in reg.versions(args.task):
            raise RegistryError(f"{args.task} has no version {args.version!r}")
        active = _active_versions(reg, tasks)
        failed = 0
        for task, version in targets:
            problems = reg.check(task, version)
            mark = "*" if active[task] == version else " "
            print(f"{mark} {task}/{version}: {'ok' if not problems else f'{len(problems)} problem(s)'}")
            for problem in problems:
                print(f"    - [{problem.reason.value}] {problem.text}")
            failed += bool(problems)
    except RegistryError as exc:
        return _fail(exc)
    print(f"{len(targets) - failed} of {len(targets)} model sets verified (hashes, files, sidecars, lineage, "
          "this robot's description, joints and period)")
    return 1 if failed else 0


def _cmd_import(args: argparse.Namespace) -> int:
    from robot_wm.registry import RegistryError

    lineage: dict[str, Any] = {}
    if args.command:
        lineage["command"] = args.command
    if args.demo_bag_sha256:
        lineage["training_data"] = {"demo_bags_sha256": list(args.demo_bag_sha256)}
    try:
        reg = _registry()
        info = reg.add(Path(args.dir), args.task, parent=args.parent, lineage=lineage, activate=args.activate)
    except RegistryError as exc:
        return _fail(exc)
    print(f"{args.task}: registered {info.version} from {args.dir} ({len(info.files)} files)"
          + ("; active" if args.activate else f"; `robot-wm models activate {args.task} {info.version}` to use it"))
    return 0


def add_parser(verbs: argparse._SubParsersAction) -> None:
    """Add `robot-wm models` and its verbs to the robot-wm parser."""
    from robot_wm.graph import TASKS

    p = verbs.add_parser("models", help="the model registry: versioned model sets, the active one per task "
                                        "(list, show, activate, rollback, verify, import)")
    sub = p.add_subparsers(dest="models_verb", metavar="MODELS_VERB", required=True)
    q = sub.add_parser("list", help="the registered model sets (* = active)")
    q.add_argument("--task", choices=TASKS, default=None, help="only this task")
    q.add_argument("--json", action="store_true", help="one JSON list")
    q.set_defaults(func=_cmd_list)
    q = sub.add_parser("show", help="one set's lineage: parent, data hashes, command, robot, files")
    q.add_argument("task", choices=TASKS)
    q.add_argument("version", help="a version (robot-wm models list) or 'active'")
    q.add_argument("--json", action="store_true", help="its modelset.json (with the metrics)")
    q.set_defaults(func=_cmd_show)
    q = sub.add_parser("activate", help="make a set the task's active one (refused, with the reasons, when it "
                                        "fails verification or was made for another robot, task or period)")
    q.add_argument("task", choices=TASKS)
    q.add_argument("version")
    q.add_argument("--no-announce", dest="announce", action="store_false",
                   help="do not tell a running graph (its nodes keep their model until their next configure)")
    q.set_defaults(func=_cmd_activate)
    q = sub.add_parser("rollback", help="activate the previously active set of the task (a running graph swaps it in)")
    q.add_argument("task", choices=TASKS)
    q.add_argument("--no-announce", dest="announce", action="store_false",
                   help="do not tell a running graph (its nodes keep their model until their next configure)")
    q.set_defaults(func=_cmd_rollback)
    q = sub.add_parser("verify", help="recheck every hash and whether each set fits this robot (exit 1 on a problem)")
    q.add_argument("task", nargs="?", choices=TASKS, default=None, help="only this task")
    q.add_argument("version", nargs="?", default=None, help="only this version")
    q.set_defaults(func=_cmd_verify)
    q = sub.add_parser("import", help="register a model set directory (world_model.onnx/.json, policy.onnx/.json, "
                                      "trust/<profile>.json)")
    q.add_argument("dir", help="the set's directory (e.g. the --out of robot-wm export)")
    q.add_argument("--task", required=True, choices=TASKS)
    q.add_argument("--parent", default=None, help="the registered version it was derived from")
    q.add_argument("--command", default=None, help="the command that made it (default: the policy sidecar's)")
    q.add_argument("--demo-bag-sha256", nargs="*", default=None, help="SHA-256 of each demonstration bag it "
                                                                      "was trained on")
    q.add_argument("--activate", action="store_true", help="activate it once registered")
    q.set_defaults(func=_cmd_import)
