"""What part of an arm profile's tracking error no learning from the arm's own sensors can remove:
its encoder offsets.

    python bench/bench_profile_floor.py [--profile worn_heavy] [--sets models/track DIR ...]
                                        [--episodes 32] [--seed 1000]
                                        [--joint-calibration FILE] [--json]

A constant offset between a joint's true and measured angle is invisible to everything the stack
learns from (joint states, efforts, the wrist F/T): the world model, the policy and the trust
monitor all live in the measured joint space, so the tool goes where the measured angles say it
is, off by the offsets' forward-kinematics error. Only a kinematic calibration against an outside
reference (a tracker, a touch probe, the maker's calibration file) removes it. For each model set
this evaluates the whole stack (``eval --stack``'s loop, SIM-phase limits) on the profile and on
the same profile with its encoder offsets set to zero (the arm after such a calibration), same
paths, and reports the tool-position error the offsets alone make on the states the arm visited
(``|FK(q_measured) - FK(q_measured - offset)|``). With ``--joint-calibration`` (``robot-wm
calibrate joints``) each set is also evaluated on the profile as it is, behind a driver that
applies that calibration: what the fit recovers of the floor. Prints a table and, last, one JSON
object.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def _evaluate(set_dir: Path, profile, episodes: int, seed: int, trace: list | None = None,
              joint_calibration=None) -> dict:
    from robot_wm import description
    from robot_wm.core.policy_runner import PolicyRunner
    from robot_wm.core.tasks import get_task
    from robot_wm.learning.stack_eval import evaluate_stack

    task = get_task("track")
    names = description.joint_limits(description.expand()).names
    policy = PolicyRunner(set_dir / "policy.onnx", names, task.control_dt_s, task.action_limit_radps, task="track")
    d = evaluate_stack(policy, profile, episodes, seed, task=task, models_dir=set_dir, trace=trace,
                       joint_calibration=joint_calibration).to_dict()
    return {k: d[k] for k in ("success_rate", "tracking_rms_m_median", "tracking_rms_m_p90", "intervention_rate",
                              "violations")}


def main() -> int:
    import numpy as np

    from robot_wm import description
    from robot_wm.core.kinematics import Kinematics
    from robot_wm.sim import load_profile

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="worn_heavy", help="a simulator profile: name or YAML file (default worn_heavy)")
    ap.add_argument("--sets", nargs="+", type=Path, default=[REPO / "models" / "track"],
                    help="tracking model sets to evaluate (default: the shipped models/track)")
    ap.add_argument("--episodes", type=int, default=32)
    ap.add_argument("--seed", type=int, default=1000)
    ap.add_argument("--joint-calibration", type=Path, default=None, help="also evaluate behind this joint calibration")
    ap.add_argument("--json", action="store_true", help="only the JSON object on stdout")
    args = ap.parse_args()

    prof = load_profile(args.profile)
    offset = np.asarray(prof.encoder_offset_rad, dtype=float)
    calibrated = dataclasses.replace(prof, name=f"{prof.name}_calibrated", encoder_offset_rad=tuple(0.0 for _ in offset))
    urdf = description.expand()
    kin = Kinematics(urdf, description.joint_limits(urdf).names)
    rows = []
    for set_dir in args.sets:
        trace: list = []
        as_is = _evaluate(set_dir, prof, args.episodes, args.seed, trace)
        fixed = _evaluate(set_dir, calibrated, args.episodes, args.seed)
        fitted = None if args.joint_calibration is None else _evaluate(set_dir, prof, args.episodes, args.seed,
                                                                         joint_calibration=args.joint_calibration)
        err = np.array([np.linalg.norm(kin.tool_position_m(p.q_rad) - kin.tool_position_m(p.q_rad - offset))
                        for p in trace[::10]])
        rows.append({"set": str(set_dir), "profile": as_is, "encoder_offsets_zeroed": fixed,
                     "offset_tool_error_m": {"median": round(float(np.median(err)), 6),
                                             "p90": round(float(np.percentile(err, 90)), 6)},
                     **({"joint_calibration": fitted} if fitted is not None else {})})
        if not args.json:
            print(f"{set_dir}: {prof.name} {as_is['success_rate']:.0%} / {1e3 * as_is['tracking_rms_m_median']:.2f} mm, "
                  f"offsets zeroed {fixed['success_rate']:.0%} / {1e3 * fixed['tracking_rms_m_median']:.2f} mm; the offsets "
                  f"alone move the tool {1e3 * np.median(err):.2f} mm (median)" + (
                      "" if fitted is None else f"; behind the joint calibration {fitted['success_rate']:.0%} / "
                                                f"{1e3 * fitted['tracking_rms_m_median']:.2f} mm"), flush=True)
    print(json.dumps({"profile": prof.name, "encoder_offset_rad": offset.tolist(), "episodes": args.episodes,
                      "seed": args.seed, "joint_calibration": None if args.joint_calibration is None else
                      str(args.joint_calibration), "sets": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
