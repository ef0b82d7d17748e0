"""``robot-wm bench hotpath``: the control period's compute in one process, per stage, and against a baseline.

The closed loop (100 Hz, a kinematic arm q += u dt) does exactly what the policy, world_model and
safety_filter nodes compute each period, with the shipped models: tool FK + ``PolicyRunner.act``
(policy node), ``WorldModelRunner.predict`` (world_model node) and ``SafetyController.step``
(safety_filter node: input checks, the world model's linearization, the F/T frame, the CBF-QP
with every constraint family, OSQP, latches). The nominal command is the policy's, interleaved
every 150 periods with adversarial segments (full speed into the joint limits, down into the
table, into the keep-out box), so that the QP is active in a fair share of periods. ``total`` =
policy + world model + safety filter per period: what one process of the composed stack computes.

``--baseline REF`` measures another version of the code on the same machine in the same run:
REF is a git revision (checked out with ``git archive`` into a temporary directory) or a
directory holding a ``robot_wm`` package. This file runs as a child process with that tree first
on ``sys.path``, so it measures whatever ``robot_wm`` it imports; it uses only APIs that older
versions have. Rounds alternate between the two trees so that a change of machine load hits
both; ratios are baseline / ours (> 1: ours is faster).

Prints a table, then ONE JSON object (the last line).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

DT_S = 0.01  # the shipped models' control period

#: Stages timed each period, with what they are (µs; the QP rows only over periods that solved a QP).
STAGE_LABELS = {
    "kinematics.tool_position": "pinocchio tool FK (policy node)",
    "kinematics.ft_frame_pose": "pinocchio F/T frame pose (filter node)",
    "kinematics.filter_points": "pinocchio points+Jacobians (in the filter)",
    "policy.act": "make_obs + PolicyRunner.act (ONNX)",
    "world_model.linearize": "WorldModelRunner.linearize_with_std",
    "world_model.predict": "WorldModelRunner.predict (batch 1, world_model node)",
    "qp.osqp_update_solve": "OSQP update+solve (QP periods)",
    "filter.controller_step": "SafetyController.step, all periods",
    "filter.controller_step_qp": "SafetyController.step, QP periods",
    "node.policy_step": "policy control_step compute",
    "node.safety_filter_step": "safety_filter control_step compute",
    "node.period_total": "policy + safety_filter compute / period",
    "total": "policy + world_model + safety_filter / period",
}


def stats_us(values_ns) -> dict[str, float]:
    """p50 / p99 / max / mean (µs) and the count of nanosecond durations."""
    v = np.asarray(values_ns, dtype=float) / 1e3
    if v.size == 0:
        return {"n": 0, "p50_us": math.nan, "p99_us": math.nan, "max_us": math.nan, "mean_us": math.nan}
    return {"n": int(v.size), "p50_us": float(np.percentile(v, 50)), "p99_us": float(np.percentile(v, 99)),
            "max_us": float(v.max()), "mean_us": float(v.mean())}


@dataclass
class HotPath:
    """The objects the policy and safety_filter nodes build in on_configure (shipped models)."""

    names: tuple[str, ...]
    task: Any
    kin_policy: Any
    kin_filter: Any
    policy: Any
    wm: Any  # the safety filter's runner (the controller linearizes with it)
    predictor: Any  # the world_model node's own runner (predict)
    ctrl: Any  # the SafetyController the safety_filter node runs

    @property
    def filt(self) -> Any:
        """The controller's QP (SafetyFilter)."""
        return self.ctrl.filter


def build_hot_path(dt_s: float = DT_S) -> HotPath:
    """Build the hot path exactly as the nodes do (own Kinematics per node, shipped ONNX models)."""
    from robot_wm import description
    from robot_wm.core.kinematics import Kinematics
    from robot_wm.core.policy_runner import PolicyRunner
    from robot_wm.core.safety import ControllerConfig, Phase, SafetyController, TrustLevel, load_safety_limits
    from robot_wm.core.task import load_task
    from robot_wm.core.world_model_runner import WorldModelRunner
    from robot_wm.paths import data_path

    urdf = description.expand()
    names = tuple(description.joint_limits(urdf).names)
    task = load_task()
    kin_filter = Kinematics(urdf, names)
    wm_path = data_path("models", "world_model.onnx")
    wm = WorldModelRunner(wm_path, names, task.control_dt_s)
    try:  # the world_model node's runner predicts only (older code has no such option)
        predictor = WorldModelRunner(wm_path, names, task.control_dt_s, analytic=False)
    except TypeError:
        predictor = WorldModelRunner(wm_path, names, task.control_dt_s)
    # as the node configures it on the embedded arm (F/T sensor on, trust FULL in SIM)
    config = ControllerConfig(dt_s=dt_s, require_model=True, default_trust_level=TrustLevel.FULL,
                              default_phase=Phase.SIM, force_sensor=True)
    return HotPath(
        names=names, task=task, kin_policy=Kinematics(urdf, names), kin_filter=kin_filter,
        policy=PolicyRunner(data_path("models", "policy.onnx"), names, task.control_dt_s), wm=wm, predictor=predictor,
        ctrl=SafetyController(load_safety_limits(), kin_filter, config, model=wm),
    )


def enable_hot_path(hp: HotPath, q: np.ndarray) -> None:
    """Tare at rest and enable the controller, as an operator does at start-up (not timed)."""
    from robot_wm.core.safety import JointSample, NominalSample, WrenchSample

    for k in range(200):
        t_s = -2.0 + k * DT_S
        hp.ctrl.step(t_s, joint=JointSample(q, np.zeros_like(q), t_s), nominal=NominalSample(np.zeros_like(q), t_s),
                     wrench=WrenchSample(np.zeros(3), t_s, hp.ctrl.config.ft_frame))
        if hp.ctrl.reset()[0]:
            return
    raise RuntimeError(f"the safety controller could not be enabled: {hp.ctrl.summary()}")


def stage_timings(periods: int = 2000, seed: int = 1, hot: HotPath | None = None,
                  keep_samples: bool = False) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run the closed loop for ``periods`` periods; return (result, per-period samples if kept).

    result: ``{"stages": {key: stats_us}, "periods", "qp_periods", "states": {name: count}}``.
    """
    from robot_wm import description
    from robot_wm.core.policy_runner import make_obs
    from robot_wm.core.reacher import DlsReacher
    from robot_wm.core.safety import JointSample, NominalSample, WrenchSample

    hp = hot or build_hot_path()
    home = description.initial_positions(hp.names)
    limits = hp.filt.limits
    rng = np.random.default_rng(seed)
    reacher = DlsReacher(hp.kin_filter, home, limits.vel_max_radps * 1.5, max_tool_speed_mps=0.8)
    box = np.array(limits.keepout_boxes_m[:6], dtype=float) if len(limits.keepout_boxes_m) >= 6 else None
    box_center = 0.5 * (box[:3] + box[3:]) if box is not None else np.array([-0.5, 0.0, 0.2])
    goal = hp.task.sample_goals(rng, 1)[0]
    mode, burst = "reach", np.zeros(len(hp.names))
    q, qd = home.copy(), np.zeros(len(hp.names))
    hp.wm.reset()
    hp.predictor.reset()
    ft = hp.ctrl.config.ft_frame
    wrench = lambda t_s: WrenchSample(np.zeros(3), t_s, ft)  # noqa: E731 (a free tool: the tare is zero)
    sim_t = 0.0
    enable_hot_path(hp, q)
    keys = [k for k in STAGE_LABELS if k not in ("filter.controller_step_qp", "qp.osqp_update_solve")]
    t = {k: np.zeros(periods, dtype=np.int64) for k in keys}
    qp_ns, step_qp_ns, states, samples = [], [], {}, []
    warm = min(100, periods)
    pc = time.perf_counter_ns
    for i in range(-warm, periods):  # negative i: warm-up periods, not recorded
        if i % 150 == 0:
            mode = rng.choice(["reach", "reach", "reach", "limits", "table", "keepout"])
            goal = hp.task.sample_goals(rng, 1)[0]
            burst = rng.choice([-1.0, 1.0], 6) * limits.vel_max_radps * 2.0
        t0 = pc()
        tool = hp.kin_policy.tool_position_m(q)
        t1 = pc()
        obs = make_obs(q, qd, tool, goal)
        action = hp.policy.act(obs)
        t2 = pc()
        if mode == "reach":
            nominal = action
        elif mode == "limits":
            nominal = burst
        else:
            nominal = reacher(q, np.array([-0.5, -0.1, -0.3]) if mode == "table" else box_center)
        hist = hp.wm.action_history if keep_samples else None
        t3 = pc()
        f0, _, _ = hp.wm.linearize_with_std(q, qd, nominal)  # the controller's call, timed alone
        t4 = pc()
        _ = hp.kin_filter.frame_pose(q, ft).rotation  # the controller's F/T rotation, timed alone
        t6 = pc()
        sim_t += DT_S  # the joint state is half a period old, as the node sees it on average
        out = hp.ctrl.step(sim_t, joint=JointSample(q, qd, sim_t - 0.5 * DT_S), nominal=NominalSample(nominal, sim_t),
                           wrench=wrench(sim_t))  # linearize + F/T + QP + latches + commit: the node's step
        t7 = pc()
        hp.predictor.predict(q, qd, out.u_safe_radps)  # the world_model node: the command actually sent, committed
        t5 = pc()
        hp.filt.workspace.points(q)  # the QP's own FK + Jacobians, timed alone (step computes them)
        t8 = pc()
        solved = out.solver_status != 0
        if i >= 0:
            for key, val in (("kinematics.tool_position", t1 - t0), ("kinematics.ft_frame_pose", t6 - t4),
                             ("kinematics.filter_points", t8 - t5), ("policy.act", t2 - t1),
                             ("world_model.linearize", t4 - t3), ("world_model.predict", t5 - t7),
                             ("filter.controller_step", t7 - t6),
                             ("node.policy_step", t2 - t0), ("node.safety_filter_step", t7 - t6),
                             ("node.period_total", (t2 - t0) + (t7 - t6)),
                             ("total", (t2 - t0) + (t7 - t6) + (t5 - t7))):
                t[key][i] = val
            states[out.state.name] = states.get(out.state.name, 0) + 1
            if solved:
                qp_ns.append(int(out.solve_time_s * 1e9))
                step_qp_ns.append(t7 - t6)
            if keep_samples:
                samples.append(dict(
                    q=q.copy(), qd=qd.copy(), obs=obs.copy(), nominal=np.array(nominal, dtype=float), hist=hist,
                    t_act=t2 - t1, t_lin=t4 - t3, t_pred=t5 - t7, t_ft=t6 - t4, t_step=t7 - t6,
                    t_qp=int(out.solve_time_s * 1e9) if solved else 0, action=action.copy(), f0=f0.copy(),
                    snap=(hp.filt.snapshot(), out.u_safe_radps.copy()) if solved else None))
        # the kinematic arm
        qd = np.asarray(out.u_safe_radps, dtype=float)
        q = q + qd * DT_S
        if hp.ctrl.supervisor.latched and not np.any(qd):
            hp.ctrl.reset()  # the operator (a latched fault stops the stream otherwise)
        if out.is_stop and not np.any(qd):  # stopped for good (e.g. deep in a keep-out): start over
            q, qd = home.copy(), np.zeros(len(hp.names))
            hp.wm.reset()
            hp.predictor.reset()
    stages = {k: stats_us(v) for k, v in t.items()}
    stages["qp.osqp_update_solve"] = stats_us(qp_ns)
    stages["filter.controller_step_qp"] = stats_us(step_qp_ns)
    stages = {k: stages[k] for k in STAGE_LABELS}
    return {"stages": stages, "periods": periods, "qp_periods": len(qp_ns), "states": states}, samples


# ------------------------------------------------------------------------------ child and orchestration
def _child(periods: int, seed: int) -> int:
    """Measure the ``robot_wm`` first on sys.path; print its result as one JSON line."""
    hp = build_hot_path()
    res, _ = stage_timings(periods, seed=seed, hot=hp)
    res["linearization"] = getattr(hp.wm, "linearization", "finite differences (batch 13)")
    res["code"] = str(Path(sys.modules["robot_wm.core"].__file__).resolve().parents[2])
    print(json.dumps(res))
    return 0


def checkout(ref: str, repo: Path, into: Path) -> Path:
    """A tree of the code at ``ref``: a directory with a ``robot_wm`` package, or a git revision of ``repo``.

    Returns the directory to put first on sys.path.
    """
    given = Path(ref)
    if given.is_dir():
        if not (given / "robot_wm" / "__init__.py").is_file():
            raise ValueError(f"--baseline {ref}: the directory has no robot_wm package")
        return given.resolve()
    archive = into / "baseline.tar"
    proc = subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", "-o", str(archive), ref,
                           "robot_wm", "config", "models", "urdf"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise ValueError(f"--baseline {ref}: not a directory and not a git revision of {repo}: {proc.stderr.strip()}")
    tree = into / "tree"
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    return tree


def _measure(tree: Path, periods: int, seed: int) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", "--periods", str(periods),
                           "--seed", str(seed)], capture_output=True, text=True, env=env, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"the hot-path measurement of {tree} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _merge(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Rounds of one tree as one result: per stage the median over rounds of p50/p99, the max of max."""
    out = {"rounds": len(results), "periods": sum(r["periods"] for r in results),
           "qp_periods": sum(r["qp_periods"] for r in results), "linearization": results[0].get("linearization"),
           "code": results[0].get("code"), "stages": {}}
    for key in results[0]["stages"]:
        rows = [r["stages"][key] for r in results if r["stages"].get(key, {}).get("n")]
        if not rows:
            continue
        out["stages"][key] = {"n": sum(r["n"] for r in rows), "p50_us": float(np.median([r["p50_us"] for r in rows])),
                              "p99_us": float(np.median([r["p99_us"] for r in rows])),
                              "max_us": float(max(r["max_us"] for r in rows)),
                              "mean_us": float(np.mean([r["mean_us"] for r in rows]))}
    return out


def run(periods: int, rounds: int, baseline: str | None, seed: int = 1) -> dict[str, Any]:
    """Measure this tree (and the baseline's), alternating rounds; return the JSON document."""
    repo = Path(__file__).resolve().parents[2]
    doc: dict[str, Any] = {"benchmark": "hotpath", "periods_per_round": periods, "rounds": rounds, "dt_s": DT_S,
                           "targets_us": {"total_p50": 150, "total_p99": 300}}
    with tempfile.TemporaryDirectory(prefix="robot_wm_baseline_") as tmp:
        trees = {"ours": repo}
        if baseline:
            trees["baseline"] = checkout(baseline, repo, Path(tmp))
        results: dict[str, list] = {k: [] for k in trees}
        for r in range(rounds):
            for name, tree in trees.items():
                print(f"bench hotpath: round {r + 1}/{rounds}, {name} ({tree})", file=sys.stderr, flush=True)
                results[name].append(_measure(tree, periods, seed + r))
    doc["ours"] = _merge(results["ours"])
    if baseline:
        doc["baseline_ref"] = baseline
        doc["baseline"] = _merge(results["baseline"])
        doc["ratio_baseline_over_ours"] = {
            key: {q: doc["baseline"]["stages"][key][q] / s[q] for q in ("p50_us", "p99_us") if s[q] > 0}
            for key, s in doc["ours"]["stages"].items() if key in doc["baseline"]["stages"]}
    return doc


def print_table(doc: dict[str, Any], stream=sys.stdout) -> None:
    """The human-readable table of a ``run`` document."""
    ours, base = doc["ours"], doc.get("baseline")
    say = lambda s: print(s, file=stream)  # noqa: E731
    say(f"hot path in one process: {ours['periods']} periods at {1 / DT_S:.0f} Hz in {ours['rounds']} round(s), "
        f"QP solved in {ours['qp_periods']}; world model linearized by {ours['linearization']}")
    if base:
        say(f"baseline {doc['baseline_ref']}: linearized by {base['linearization']}")
    head = f"  {'stage':<26} {'what':<46} {'p50 µs':>8} {'p99 µs':>8} {'max µs':>8}"
    say(head + ("   baseline p50 / p99    ratio p50 / p99" if base else ""))
    for key, label in STAGE_LABELS.items():
        s = ours["stages"].get(key)
        if not s:
            continue
        line = f"  {key:<26} {label:<46} {s['p50_us']:8.1f} {s['p99_us']:8.1f} {s['max_us']:8.1f}"
        if base and key in base["stages"]:
            b = base["stages"][key]
            line += f"   {b['p50_us']:8.1f} / {b['p99_us']:8.1f}   {b['p50_us'] / s['p50_us']:5.2f}x / {b['p99_us'] / s['p99_us']:5.2f}x"
        say(line)
    total = ours["stages"]["total"]
    say(f"  target: total p50 <= {doc['targets_us']['total_p50']} µs, p99 <= {doc['targets_us']['total_p99']} µs; "
        f"measured p50 {total['p50_us']:.0f}, p99 {total['p99_us']:.0f}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``robot-wm bench hotpath``."""
    parser.add_argument("--periods", type=int, default=2000, help="closed-loop periods per round (default 2000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per tree, alternating with the baseline (default 3)")
    parser.add_argument("--baseline", metavar="REF|DIR",
                        help="also measure this git revision (or a directory with a robot_wm package) and print ratios")
    parser.add_argument("--json", action="store_true", help="only the JSON document on stdout (progress on stderr)")


def command(args: argparse.Namespace) -> int:
    """``robot-wm bench hotpath``: the table, then one JSON object on the last line."""
    if args.periods < 100 or args.rounds < 1:
        print("bench hotpath: --periods must be >= 100 and --rounds >= 1", file=sys.stderr)
        return 2
    try:
        doc = run(args.periods, args.rounds, args.baseline)
    except (ValueError, RuntimeError) as exc:
        print(f"bench hotpath: {exc}", file=sys.stderr)
        return 2
    if not args.json:
        print_table(doc)
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    if "--child" in sys.argv:
        ap = argparse.ArgumentParser()
        ap.add_argument("--child", action="store_true")
        ap.add_argument("--periods", type=int, default=2000)
        ap.add_argument("--seed", type=int, default=1)
        a = ap.parse_args()
        sys.exit(_child(a.periods, a.seed))
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(p)
    sys.exit(command(p.parse_args()))
