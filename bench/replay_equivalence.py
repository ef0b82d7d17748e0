"""Does a change of the safety core still command the same? Replay one input stream through two versions.

A closed loop like ``robot-wm bench hotpath``'s (policy reaching, interleaved with full speed into
the joint limits, down into the table and into the keep-out box, on a kinematic arm) records every
period's inputs to ``SafetyController.step`` (joint state, nominal, wrench, time) and the operator's
resets. The same stream is then replayed, open loop, through the ``SafetyController`` of this tree
and of ``--baseline REF`` (a git revision or a directory with a ``robot_wm`` package), each in its
own process, both with the world model linearized by central differences (so that only the
controller and QP code differ). Printed: the largest difference of the commands, and the periods
whose state, fault kind, latches or active constraints differ.

Usage: python bench/replay_equivalence.py --baseline REF [--periods 6000] [--seed 3] [--analytic]
(``--analytic``: this tree linearizes with its analytic graph, to see what that changes.)
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def record(periods: int, seed: int, path: Path) -> None:
    """Run the closed loop on this tree and save every period's controller inputs."""
    from robot_wm import description
    from robot_wm.benchmarks.hotpath import DT_S, build_hot_path, enable_hot_path
    from robot_wm.core.policy_runner import make_obs
    from robot_wm.core.reacher import DlsReacher
    from robot_wm.core.safety import JointSample, NominalSample, WrenchSample

    hp = build_hot_path()
    home = description.initial_positions(hp.names)
    lim = hp.filt.limits
    rng = np.random.default_rng(seed)
    reacher = DlsReacher(hp.kin_filter, home, lim.vel_max_radps * 1.5, max_tool_speed_mps=0.8)
    box = np.array(lim.keepout_boxes_m[:6], dtype=float)
    box_center = 0.5 * (box[:3] + box[3:])
    q, qd = home.copy(), np.zeros(6)
    enable_hot_path(hp, q)
    rows = {k: [] for k in ("t", "q", "qd", "u_nom", "force", "reset")}
    mode, goal, burst = "reach", hp.task.sample_goals(rng, 1)[0], np.zeros(6)
    t = 0.0
    for i in range(periods):
        if i % 150 == 0:
            mode = rng.choice(["reach", "reach", "limits", "table", "keepout"])
            goal = hp.task.sample_goals(rng, 1)[0]
            burst = rng.choice([-1.0, 1.0], 6) * lim.vel_max_radps * 2.0
        if mode == "reach":
            nominal = hp.policy.act(make_obs(q, qd, hp.kin_policy.tool_position_m(q), goal))
        elif mode == "limits":
            nominal = burst
        else:
            nominal = reacher(q, np.array([-0.5, -0.1, -0.3]) if mode == "table" else box_center)
        nominal = nominal + rng.normal(0.0, 0.05, 6)  # noise: more distinct QPs
        force = rng.normal(0.0, 2.0, 3) if i % 700 > 600 else np.zeros(3)  # contacts now and then
        t += DT_S * (1.0 + (0.6 if rng.random() < 0.03 else 0.0))  # a few late periods
        out = hp.ctrl.step(t, joint=JointSample(q, qd, t - 0.5 * DT_S), nominal=NominalSample(nominal, t),
                           wrench=WrenchSample(force, t, hp.ctrl.config.ft_frame))
        reset = bool(hp.ctrl.supervisor.latched and not np.any(out.u_safe_radps))
        for k, v in (("t", t), ("q", q.copy()), ("qd", qd.copy()), ("u_nom", nominal), ("force", force),
                     ("reset", reset)):
            rows[k].append(v)
        if reset:
            hp.ctrl.reset()
        qd = np.asarray(out.u_safe_radps, dtype=float)
        q = q + qd * DT_S
        if out.is_stop and not np.any(qd):
            q, qd = home.copy(), np.zeros(6)
    np.savez(path, **{k: np.asarray(v) for k, v in rows.items()})


def replay(stream: Path, out: Path, analytic: bool) -> None:
    """Replay a recorded stream through the SafetyController of the robot_wm first on sys.path."""
    from robot_wm import description
    from robot_wm.core.kinematics import Kinematics
    from robot_wm.core.safety import (
        ControllerConfig, JointSample, NominalSample, Phase, SafetyController, TrustLevel, WrenchSample,
        load_safety_limits,
    )
    from robot_wm.core.world_model_runner import WorldModelRunner
    from robot_wm.paths import data_path

    urdf = description.expand()
    names = tuple(description.joint_limits(urdf).names)
    kin = Kinematics(urdf, names)
    try:
        wm = WorldModelRunner(data_path("models", "world_model.onnx"), names, 0.01, analytic=analytic)
    except TypeError:  # older code: finite differences only
        wm = WorldModelRunner(data_path("models", "world_model.onnx"), names, 0.01)
    config = ControllerConfig(dt_s=0.01, require_model=True, default_trust_level=TrustLevel.FULL,
                              default_phase=Phase.SIM, force_sensor=True)
    ctrl = SafetyController(load_safety_limits(), kin, config, model=wm)
    # OSQP's wall-clock limit (0.9 dt) makes a preempted solve a FAULT: off, so that only the code differs
    ctrl.filter._solver.update_settings(time_limit=1e3)
    s = np.load(stream)
    q0 = s["q"][0]
    for k in range(200):  # tare and enable as the recording did
        t = -2.0 + k * 0.01
        ctrl.step(t, joint=JointSample(q0, np.zeros(6), t), nominal=NominalSample(np.zeros(6), t),
                  wrench=WrenchSample(np.zeros(3), t, config.ft_frame))
        if ctrl.reset()[0]:
            break
    us, info, took = [], [], []
    for i in range(len(s["t"])):
        t = float(s["t"][i])
        t0 = time.perf_counter_ns()
        o = ctrl.step(t, joint=JointSample(s["q"][i], s["qd"][i], t - 0.005), nominal=NominalSample(s["u_nom"][i], t),
                      wrench=WrenchSample(s["force"][i], t, config.ft_frame))
        took.append(time.perf_counter_ns() - t0)
        us.append(o.u_safe_radps)
        info.append([o.state.name, str(o.fault_kind), ",".join(o.latches), ",".join(sorted(o.active_constraints))])
        if s["reset"][i]:
            ctrl.reset()
    np.save(out, np.asarray(us))
    out.with_suffix(".json").write_text(json.dumps({"info": info, "step_ns": took}))


def _child(tree: Path, *args: str) -> None:
    env = dict(os.environ, PYTHONPATH=str(tree))
    subprocess.run([sys.executable, str(Path(__file__).resolve()), *args], check=True, env=env)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", required=False, help="git revision or directory with a robot_wm package")
    ap.add_argument("--periods", type=int, default=6000)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--analytic", action="store_true", help="this tree linearizes with its analytic graph")
    ap.add_argument("--record", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--replay", nargs=2, type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.record:
        record(a.periods, a.seed, a.record)
        return 0
    if a.replay:
        replay(a.replay[0], a.replay[1], a.analytic)
        return 0
    from robot_wm.benchmarks.hotpath import checkout

    with tempfile.TemporaryDirectory(prefix="robot_wm_replay_") as tmp:
        tmp = Path(tmp)
        base = checkout(a.baseline, ROOT, tmp)
        stream = tmp / "stream.npz"
        _child(ROOT, "--record", str(stream), "--periods", str(a.periods), "--seed", str(a.seed))
        _child(ROOT, "--replay", str(stream), str(tmp / "ours.npy"), *(["--analytic"] if a.analytic else []))
        _child(base, "--replay", str(stream), str(tmp / "base.npy"))
        u_ours, u_base = np.load(tmp / "ours.npy"), np.load(tmp / "base.npy")
        d_ours, d_base = (json.loads((tmp / f"{w}.json").read_text()) for w in ("ours", "base"))
    i_ours, i_base = d_ours["info"], d_base["info"]
    diff = np.abs(u_ours - u_base).max(axis=1)
    fields = ("state", "fault_kind", "latches", "active constraints")
    mism = {f: [i for i in range(len(i_ours)) if i_ours[i][j] != i_base[i][j]] for j, f in enumerate(fields)}
    states = {}
    for row in i_ours:
        states[row[0]] = states.get(row[0], 0) + 1
    print(f"{len(diff)} periods replayed (states of this tree: {states})")
    print(f"largest |u_ours - u_baseline|: {diff.max():.3g} rad/s (period {int(diff.argmax())}); "
          f"periods differing by > 1e-6: {int((diff > 1e-6).sum())}, > 1e-3: {int((diff > 1e-3).sum())}")
    for name, d in (("this tree", d_ours), ("baseline", d_base)):
        ns = np.asarray(d["step_ns"]) / 1e3
        print(f"SafetyController.step on {name}: p50 {np.percentile(ns, 50):.0f} µs, p99 {np.percentile(ns, 99):.0f} µs")
    for f, idx in mism.items():
        print(f"periods whose {f} differ: {len(idx)}" + (f" (first {idx[:5]}: ours {[i_ours[i] for i in idx[:2]]} "
                                                         f"vs baseline {[i_base[i] for i in idx[:2]]})" if idx else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
