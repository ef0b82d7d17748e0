"""``robot-wm record``, ``robot-wm demos inspect`` and ``robot-wm adapt``: demonstrations as rosbag2 bags (``robot_wm.bags``)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def cmd_record(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if args.demos < 1:
        print(f"record: --demos {args.demos}: expected at least 1", file=sys.stderr)
        return 2
    if args.library:
        from robot_wm.learning.demos import record_library

        args.profile = args.profile or "nominal"
        from robot_wm.sim import ProfileError

        try:
            paths = record_library(args.task, args.profile, args.demos, out, seed=args.seed, source=args.source,
                                   models_dir=Path(args.models) if args.models else None,
                                   progress=not args.no_progress, first_index=args.first_index,
                                   joint_calibration=args.joint_calibration)
        except (ProfileError, ValueError, OSError) as exc:
            print(f"record: {exc}", file=sys.stderr)
            return 2
        print(f"record: {len(paths)} episode bag(s) of {args.task} on {args.profile} (library mode) in {out}")
        return 0
    if args.source != "policy" or args.models or args.first_index:
        print("record: --source/--models/--first-index are for --library; a running stack records what it runs "
              "(scripted: true on the policy node for the baseline; an operator's take-over is marked teleop)",
              file=sys.stderr)
        return 2
    from robot_wm.nodes.recorder import record_live

    if args.robot is None and args.profile is None:
        print("record: say which arm the episodes come from: --robot NAME (hardware) or --profile P "
              "(the profile the embedded arm runs); it goes into every bag's metadata", file=sys.stderr)
        return 2
    robot = args.robot or Path(args.profile).stem
    print(f"record: waiting for {args.demos} {args.task} episode(s) from the running stack "
          f"(robot {robot}; Ctrl-C to stop) -> {out}", flush=True)
    written, skipped = record_live(out, args.demos, task=args.task, robot=robot, timeout_s=args.timeout,
                                   progress=lambda line: print(line, flush=True))
    for line in skipped:
        print(f"record: skipped {line}")
    print(f"record: {len(written)} episode bag(s) in {out}")
    if not written:
        print("record: nothing recorded: is the stack up and enabled (robot-wm up --task ..., robot-wm reset)?",
              file=sys.stderr)
    return 0 if len(written) >= args.demos else 1


def cmd_inspect(args: argparse.Namespace) -> int:
    from robot_wm.bags import BagError
    from robot_wm.learning.demos import format_inspection, inspect_demos

    try:
        report = inspect_demos(Path(args.dir))
    except BagError as exc:
        print(f"demos inspect: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report, default=str))
    else:
        print(format_inspection(report))
    return 0 if not report["problems"] else 1


def _cmd_adapt(args: argparse.Namespace) -> int:
    from robot_wm.learning.adapt_cli import cmd_adapt  # torch: imported only when adapting

    return cmd_adapt(args)


def _add_adapt_parser(verbs) -> None:
    p = verbs.add_parser("adapt", help="fine-tune a model set (world model, then policy in its imagination) on "
                                       "recorded demonstrations, and evaluate before/after")
    p.add_argument("--task", default="track", choices=("reach", "track"))
    p.add_argument("--demos", required=True, help="directory of demonstration bags (robot-wm record)")
    p.add_argument("--base", default=None, help="base model set (default: the task's active set, else the shipped one)")
    p.add_argument("--out", required=True, help="directory of the new model set (must not exist or be empty)")
    p.add_argument("--config", default=None, help="training YAML (default: config/training.yaml, section adapt)")
    p.add_argument("--joint-calibration", default=None, help="the stack evaluation on the demos' profile: " + "the arm driver's joint calibration (robot-wm calibrate joints) applied to the library arm's joint states")
    p.add_argument("--policy-iterations", type=int, default=None, help="override (0: adapt the world model only)")
    p.add_argument("--wm-epochs", type=int, default=None)
    p.add_argument("--replay", type=int, default=None, help="simulator replay transitions (0: none)")
    p.add_argument("--eval-episodes", type=int, default=None)
    p.add_argument("--no-eval", action="store_true", help="skip the stack evaluation")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--register", action="store_true", help="add the set to the model registry")
    p.add_argument("--activate", action="store_true", help="add it and make it the task's active set")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=_cmd_adapt)


def add_parsers(verbs: argparse._SubParsersAction) -> None:
    p = verbs.add_parser("record", help="record demonstrations, one rosbag2 MCAP bag per episode (from the running "
                                        "stack, or --library from the library-mode simulator)")
    p.add_argument("--task", default="track", choices=("reach", "track"))
    p.add_argument("--demos", type=int, required=True, help="episodes to record")
    p.add_argument("--out", required=True, help="directory of the bags")
    p.add_argument("--library", action="store_true", help="run the episodes on the library-mode simulator "
                                                          "(much faster than real time) instead of recording a running stack")
    p.add_argument("--profile", default=None, help="simulator profile (name or YAML file; --library default nominal); "
                                                   "live: the profile the embedded arm runs (names the robot)")
    p.add_argument("--robot", default=None, help="live: the robot's name in the metadata (default: the profile's)")
    p.add_argument("--source", default="policy", choices=("policy", "scripted"),
                   help="--library: who drives the episodes (default: the model set's policy)")
    p.add_argument("--models", default=None, help="--library: model set directory (default: the shipped one)")
    p.add_argument("--seed", type=int, default=0, help="--library: episode seed (paths / goals, starts)")
    p.add_argument("--first-index", type=int, default=0, help="--library: index of the first episode (add to a directory)")
    p.add_argument("--joint-calibration", default=None, help="--library: " + "the arm driver's joint calibration (robot-wm calibrate joints) applied to the library arm's joint states")
    p.add_argument("--timeout", type=float, default=3600.0, help="live: give up after this many seconds")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_record)

    demos = verbs.add_parser("demos", help="demonstration bags: inspect").add_subparsers(dest="what", metavar="WHAT",
                                                                                         required=True)
    q = demos.add_parser("inspect", help="counts, durations, topics, success, gaps and problems of a directory of bags")
    q.add_argument("dir")
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=cmd_inspect)

    _add_adapt_parser(verbs)
