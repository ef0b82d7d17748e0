"""robot-wm: one command for the whole robot_wm stack.

Run `robot-wm <verb> --help` for details of each verb.
"""
from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path
from typing import NoReturn

EPILOG = """\
examples:
  robot-wm doctor                     check this machine (interfaces, DDS profile, URDF, models)
  robot-wm doctor --driver            ... and the running arm driver against the topic contract
  robot-wm sim --profile real_twin    run only the embedded MuJoCo arm (Ctrl-C to stop)
  robot-wm up                         bring up the node graph on the embedded arm
  robot-wm demo                       the whole stack on the embedded arm: goals, then paths; push, e-stop, reports
  robot-wm estop | reset | status     operator commands for the running stack's safety filter
  robot-wm tare                       re-tare the F/T sensor after a payload change (e-stop first)
  robot-wm trust status | promote | demote --reason "..."   the trust level and the deployment phase
  robot-wm intervene take --reason "..."; robot-wm teleop; robot-wm intervene release --reason "..."
  robot-wm models list | show T V | activate T V | rollback T | verify   the model registry (active set per task)
  eval "$(robot-wm env)"              give this shell robot_wm's loopback-only DDS settings

learning (CPU, minutes; commands behind the shipped models: models/README.md):
  robot-wm collect                    domain-randomized simulated transitions -> data/sim_100k.npz
  robot-wm train world-model          ensemble world model -> runs/world_model/world_model.pt
  robot-wm train policy               actor-critic in the world model's imagination -> runs/policy/policy.pt
  robot-wm export --world-model runs/world_model/world_model.pt --policy runs/policy/policy.pt
  robot-wm eval --profile real_twin --episodes 200 --seed 0 [--json]
  robot-wm eval --task track --stack --no-policy      the tracking baseline through the safety filter
  robot-wm report sim2real --task track --profiles nominal real_twin worn_heavy
  robot-wm record --task track --demos 50 --out demos/real_twin [--library --profile real_twin]
  robot-wm demos inspect demos/real_twin   counts, durations, topics, success, gaps of the bags
  robot-wm adapt --task track --demos demos/real_twin --out runs/adapted_real_twin [--activate]
  robot-wm train mixed --library --profile worn_heavy --out runs/mixed_wh --real-episodes 50   MIXED-phase training

Every process robot-wm starts keeps DDS traffic on loopback (config/fastdds_loopback.xml);
set ROBOT_WM_DDS=system to manage DDS yourself (e.g. robot PC + GPU box).
"""


def _cmd_sim(args: argparse.Namespace) -> NoReturn:
    from robot_wm.nodes.arm_sim import ArmSimNode
    from robot_wm.nodes.runner import exit_process, run_nodes
    from robot_wm.paths import config_path

    ros_args = ["--ros-args", "--params-file", str(config_path("robot.yaml")), "--params-file", str(config_path("arm_sim.yaml")),
                "-p", f"arm_sim:profile:={args.profile}", "-p", f"arm_sim:publish_rate_hz:={float(args.rate)}",
                "-p", f"arm_sim:command_timeout_s:={float(args.command_timeout)}",
                "-p", f"arm_sim:publish_clock:={str(args.clock).lower()}"]
    exit_process(run_nodes([lambda ctx: ArmSimNode(context=ctx)], ["robot-wm-sim", *ros_args]))


def _cmd_up(args: argparse.Namespace) -> int:
    from robot_wm.graph import EMBEDDED, PYTHON_ARMS, plan
    from robot_wm.rosenv import loopback_env
    from robot_wm.process_group import ProcessGroup

    if args.hardware not in PYTHON_ARMS:
        print(f"hardware {args.hardware!r} runs through ros2_control, which needs a ROS 2 install:\n"
              f"  ros2 launch robot_wm bringup.launch.py hardware:={args.hardware}\n"
              f"without a ROS install, use the embedded arm: robot-wm up --hardware {EMBEDDED}", file=sys.stderr)
        return 2
    from robot_wm.graph import policy_overrides

    overrides = {"profile": args.profile, **policy_overrides(args.task, "up")}
    if args.realtime_priority:  # SCHED_FIFO for the arm and control processes (robot_wm.realtime)
        overrides["realtime_priority"] = args.realtime_priority
    if args.joint_calibration:  # the arm driver's (robot_wm.driver): checked now, not when the arm starts
        from robot_wm import description
        from robot_wm.core.joint_calibration import JointCalibrationError, load

        try:
            robot = load(args.joint_calibration, description.joint_limits(description.expand()).names).robot
        except JointCalibrationError as exc:
            print(f"up: --joint-calibration: {exc}", file=sys.stderr)
            return 2
        if robot and args.hardware == EMBEDDED and robot != Path(args.profile).stem:
            print(f"up: --joint-calibration {args.joint_calibration} was measured on arm {robot!r}, not the embedded "
                  f"arm's profile {args.profile!r}", file=sys.stderr)
            return 2
        overrides["joint_calibration_file"] = str(Path(args.joint_calibration).resolve())
    specs = plan(args.hardware, overrides=overrides, composed=args.composed, enable=args.enable, task=args.task,
                 trust=not args.no_trust, learn=args.learn, filter_rate_hz=args.filter_rate)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    group = ProcessGroup(specs, loopback_env())
    for spec in group.skipped:
        print(f"up: skipping {spec.name} ({spec.package}/{spec.executable}): needs a ROS 2 install")
    group.start()
    for child in group.children:
        print(f"up: {child.spec.name} running (pid {child.process.pid})")
    print(f"up: graph running on {args.hardware}; Ctrl-C to stop", flush=True)
    if not args.enable:
        print("up: the safety filter starts latched (zero command) until an operator enables it: robot-wm reset",
              flush=True)
    code = 0
    while not stop.is_set():
        failed = group.failed()
        if failed:
            print(f"up: {', '.join(c.spec.name for c in failed)} exited "
                  f"({', '.join(str(c.process.returncode) for c in failed)}); stopping the graph", file=sys.stderr)
            code = 1
            break
        stop.wait(0.1)
    codes = group.stop()
    print(f"up: stopped ({', '.join(f'{k}={v}' for k, v in codes.items())})")
    return code


def _cmd_demo(args: argparse.Namespace) -> int:
    out = Path(args.out) if args.out else None
    from robot_wm.demo import run_demos

    return run_demos(args.task, profile=args.profile, duration_s=args.duration, out_dir=out, composed=args.composed)


def _cmd_doctor(args: argparse.Namespace) -> int:
    from robot_wm.doctor import run_doctor

    return run_doctor(live=not args.offline, driver=args.driver, move=not args.no_motion, rest_margin_s=args.rest_margin)


def _cmd_env(args: argparse.Namespace) -> int:
    from robot_wm.rosenv import shell_exports

    print(shell_exports())
    return 0


def _trigger_verb(service: str):
    """A verb that calls one std_srvs/Trigger service of the safety filter."""

    def run(args: argparse.Namespace) -> int:
        from robot_wm.operator import call_trigger

        return call_trigger(service, args.timeout)

    return run


def _phase_verb(promote: bool):
    def run(args: argparse.Namespace) -> int:
        from robot_wm.operator import change_phase

        return change_phase(promote, args.reason, args.timeout)

    return run


def _intervene_verb(take: bool):
    def run(args: argparse.Namespace) -> int:
        from robot_wm.operator import intervene

        return intervene(take, args.reason, args.timeout)

    return run


def _cmd_teleop(args: argparse.Namespace) -> int:
    from robot_wm import teleop_keys

    try:
        keys = teleop_keys.parse_script(args.script) if args.script is not None else None
    except ValueError as exc:
        print(f"robot-wm teleop: {exc}", file=sys.stderr)
        return 2
    return teleop_keys.run(args.rate, args.hold, args.speed, args.linear, args.timeout, keys)


def _cmd_status(args: argparse.Namespace) -> int:
    from robot_wm.operator import show_status

    return show_status(args.watch, args.timeout)


def _cmd_trust_calibrate(args: argparse.Namespace) -> int:
    from robot_wm.learning.trust_eval import calibrate_main

    return calibrate_main(args)


def _cmd_trust_status(args: argparse.Namespace) -> int:
    from robot_wm.operator import show_trust

    return show_trust(args.watch, args.timeout)


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of the robot-wm command."""
    parser = argparse.ArgumentParser(
        prog="robot-wm",
        description="robot_wm: world-model-bridged sim-to-real control of a 6-DOF arm on ROS 2.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)

    p = verbs.add_parser("sim", help="run the embedded MuJoCo arm alone (the ros2_control topic contract)")
    p.add_argument("--profile", default="nominal", help="dynamics profile: nominal, real_twin or a path to a profile YAML")
    p.add_argument("--rate", type=float, default=500.0, help="/joint_states rate in Hz (default 500)")
    p.add_argument("--command-timeout", type=float, default=0.05, help="decelerate to rest after this many seconds without a command")
    p.add_argument("--clock", action="store_true", help="publish simulated time on /clock")
    p.set_defaults(func=_cmd_sim)

    p = verbs.add_parser("up", help="bring up the node graph (config/graph.yaml) on the embedded arm")
    p.add_argument("--hardware", default="mujoco", help="mujoco (default) or example (the driver kit's imaginary arm); other hardware needs `ros2 launch` on a ROS install")
    p.add_argument("--profile", default="nominal", help="embedded arm dynamics profile")
    p.add_argument("--composed", action="store_true", help="policy, world model and safety filter in one process (lowest latency)")
    p.add_argument("--joint-calibration", default=None, metavar="FILE",
                   help="the arm's joint calibration (robot-wm calibrate joints), applied by its driver")
    p.add_argument("--task", default="reach", choices=("reach", "track"),
                   help="reach: goals (goal_sequencer); track: reference paths (path_sequencer)")
    p.add_argument("--enable", action="store_true",
                   help="let the safety filter enable itself once its inputs are healthy (embedded and example arms only; "
                        "without it the filter waits for `robot-wm reset`)")
    p.add_argument("--no-trust", action="store_true",
                   help="leave the trust monitor out (the filter runs on its configured default trust level)")
    p.add_argument("--realtime-priority", type=int, default=0, metavar="PRIO",
                   help="SCHED_FIFO priority 1..98 for the arm and control processes (0, default: the normal "
                        "scheduler); needs root, CAP_SYS_NICE or an rtprio limit, else a warning and normal scheduling")
    p.add_argument("--learn", action="store_true",
                   help="run the online learner: it adapts the world model to the arm while it runs and the nodes "
                        "swap accepted models in (config/adaptation.yaml)")
    p.add_argument("--filter-rate", type=float, default=None, metavar="HZ",
                   help="the safety filter's own rate, e.g. 500 (the arm's joint-state rate; best --composed): the policy "
                        "and world model stay at 100 Hz, the filter ages the model's newest linearization")
    p.set_defaults(func=_cmd_up)

    p = verbs.add_parser("demo", help="the main job: the whole stack on the embedded arm, live status, summary and PNG report")
    p.add_argument("--profile", default="nominal", help="embedded arm dynamics profile")
    p.add_argument("--task", default="both", choices=("reach", "track", "both"),
                   help="reach: goals; track: reference paths; both (default): reach, then track")
    p.add_argument("--duration", type=float, default=None,
                   help="seconds of each run (default 60 reach, 45 track; push at 40 %%, e-stop at 70 %%)")
    p.add_argument("--composed", action="store_true", help="policy, world model and safety filter in one process")
    p.add_argument("--out", default="out/demo", help="directory for the summary (and report) files")
    p.set_defaults(func=_cmd_demo)

    p = verbs.add_parser("doctor", help="check the environment and say how to fix what is wrong")
    p.add_argument("--offline", action="store_true", help="skip the live ROS 2 round trip")
    p.add_argument("--driver", action="store_true",
                   help="check the running arm driver against the topic contract (docs/drivers.md): joint names and "
                        "order, rate and stamps, diagnostics, and, with no other command publisher, that a slow "
                        "command moves the last joint and the command timeout brings it to rest (the arm moves)")
    p.add_argument("--no-motion", action="store_true", help="with --driver: do not command the arm")
    p.add_argument("--rest-margin", type=float, default=0.25,
                   help="with --driver: seconds after the command timeout the arm may take to be at rest (default 0.25)")
    p.set_defaults(func=_cmd_doctor)

    p = verbs.add_parser("estop", help="operator: latch the e-stop (zero command within one control period)")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the safety filter")
    p.set_defaults(func=_trigger_verb("/robot_wm/estop"))
    p = verbs.add_parser("reset", help="operator: release the e-stop / latched fault (refused while a fault persists)")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the safety filter")
    p.set_defaults(func=_trigger_verb("/robot_wm/reset_estop"))
    p = verbs.add_parser("tare", help="operator: re-tare the F/T sensor (while latched, at rest, nothing touching the tool)")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the safety filter")
    p.set_defaults(func=_trigger_verb("/safety_filter/tare"))
    p = verbs.add_parser("status", help="operator: print the safety filter's state")
    p.add_argument("--watch", type=float, default=0.0, help="keep printing for this many seconds")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for a status message")
    p.set_defaults(func=_cmd_status)

    p = verbs.add_parser("trust", help="the trust monitor: calibrate its thresholds, show its state, acknowledge HUMAN")
    trust = p.add_subparsers(dest="trust_verb", metavar="TRUST_VERB", required=True)
    q = trust.add_parser("calibrate", help="operate the embedded arm normally and write the thresholds (library mode, "
                                           "or --live: the whole ROS graph, as the trust monitor will see it)")
    q.add_argument("--live", action="store_true", help="record on the running ROS graph (robot-wm up) instead of the "
                                                       "library loop: what the trust monitor node uses")
    q.add_argument("--bags", default=None, help="calibrate from recorded normal operation instead: a directory of "
                                                "demonstration bags (robot-wm record); needs --out")
    q.add_argument("--profile", default="nominal", help="embedded arm dynamics profile (default nominal)")
    q.add_argument("--seconds", type=float, default=None, help="seconds of operation (default: config/trust.yaml)")
    q.add_argument("--seed", type=int, default=0, help="goal and sensor-noise seed")
    q.add_argument("--task", default="reach", choices=("reach", "track"),
                   help="--live: the task whose normal operation is recorded (default reach; library mode: reach)")
    q.add_argument("--models", default=None, help="model set directory (default: the shipped models/)")
    q.add_argument("--out", default=None, help="calibration file (default: models/trust/<profile>.json)")
    q.add_argument("--no-progress", action="store_true", help="no progress bar")
    q.set_defaults(func=_cmd_trust_calibrate)
    q = trust.add_parser("status", help="operator: print the trust monitor's level, score and reason")
    q.add_argument("--watch", type=float, default=0.0, help="keep printing for this many seconds")
    q.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for a TrustState")
    q.set_defaults(func=_cmd_trust_status)
    q = trust.add_parser("acknowledge", help="operator: release HUMAN (refused while the evidence is not clean)")
    q.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the trust monitor")
    q.set_defaults(func=_trigger_verb("/trust_monitor/acknowledge"))

    for verb, promote, text in (("promote", True, "ask for the next deployment phase (SIM -> MIXED -> REAL); "
                                                    "refused with the unmet criteria"),
                                ("demote", False, "go back one deployment phase (always granted)")):
        q = trust.add_parser(verb, help=f"operator: {text}")
        q.add_argument("--reason", required=True, help="why (kept in the phase's history)")
        q.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the trust monitor")
        q.set_defaults(func=_phase_verb(promote))

    p = verbs.add_parser("intervene", help="operator: take over from the policy (teleoperation through the safety "
                                           "filter) or hand back to it (only from rest)")
    inter = p.add_subparsers(dest="intervene_verb", metavar="INTERVENE_VERB", required=True)
    for verb, take in (("take", True), ("release", False)):
        q = inter.add_parser(verb, help="take over from the policy" if take else "hand back to the policy (at rest)")
        q.add_argument("--reason", required=True, help="why (logged with the intervention and flagged in the data)")
        q.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the policy node")
        q.set_defaults(func=_intervene_verb(take))

    p = verbs.add_parser("teleop", help="operator: keyboard jog of the joints or the tool (base frame), with a "
                                        "deadman; after `robot-wm intervene take`")
    p.add_argument("--rate", type=float, default=30.0, help="jog messages per second while a key is held")
    p.add_argument("--hold", type=float, default=0.6, help="a key counts as held this long after its last event "
                                                          "(s; above the terminal's initial key-repeat delay)")
    p.add_argument("--speed", type=float, default=0.2, help="joint jog speed, rad/s (+/- change it)")
    p.add_argument("--linear", type=float, default=0.03, help="tool jog speed, m/s (+/- change it)")
    p.add_argument("--script", default=None, help="keys from a script instead of the keyboard: DELAY_S:KEY,... "
                                                  "(e.g. 0:q,0.2:q,0.2:q; keys as in the help above)")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the safety filter's status")
    p.set_defaults(func=_cmd_teleop)

    p = verbs.add_parser("env", help="print export lines with robot_wm's loopback-only DDS settings")
    p.set_defaults(func=_cmd_env)

    p = verbs.add_parser("bench", help="benchmarks of the hot path (numbers, never pass/fail)")
    bench = p.add_subparsers(dest="bench", required=True)
    q = bench.add_parser("hotpath", help="compute of one control period in process, per stage (p50/p99/max µs), "
                                         "optionally against a baseline revision")
    from robot_wm.benchmarks import e2e, hotpath
    hotpath.add_arguments(q)
    q.set_defaults(func=hotpath.command)
    q = bench.add_parser("e2e", help="the stack under ROS end to end: missed periods, latency, CPU and memory per "
                                     "process, optionally against a baseline revision")
    e2e.add_arguments(q)
    q.set_defaults(func=e2e.command)

    from robot_wm.learning.demos_cli import add_parsers as add_demo_parsers
    from robot_wm.learning.joint_calibration_run import add_parser as add_calibrate_parser
    from robot_wm.learning.pipeline import add_parsers
    from robot_wm.learning.report import add_parser as add_report_parser
    from robot_wm.registry_cli import add_parser as add_models_parser

    add_parsers(verbs)
    add_demo_parsers(verbs)
    add_report_parser(verbs)
    add_models_parser(verbs)
    add_calibrate_parser(verbs)
    return parser


def main(argv: list[str] | None = None) -> None:
    """Entry point of the robot-wm command."""
    args = build_parser().parse_args(argv)
    sys.exit(args.func(args))


if __name__ == "__main__":
    main()
