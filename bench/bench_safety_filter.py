"""Benchmark of the CBF-QP safety filter (robot_wm.core.safety): QP solve time, filter() time, vs cvxpy.

The stream: a kinematic arm (q += u dt, qdot = u) at 100 Hz driven by a policy-like nominal —
DLS reaching to random goals with noise, interleaved with adversarial segments (full speed into
joint limits, down into the table, into the keep-out box) — so that the constraints are active in
a realistic share of periods. Reported:

  * filter() wall time per call (all periods, and the periods that needed the QP);
  * the QP's update()+solve() wall time and OSQP iterations (p50 / p99 / max);
  * the same QP written the way cvxpy code usually is — a new cp.Problem from the numpy rows every
    period, default solver — on the periods that needed the QP, with the solver cvxpy chose, the
    agreement of the two solutions, and the ratio of the times;
  * for reference, OSQP with a fresh setup() every period (no warm start, no reuse).

Usage: python bench/bench_safety_filter.py [--periods 6000] [--cvxpy-samples 300]
Prints numbers only; timings are never pass/fail.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import osqp
from scipy import sparse

from robot_wm import description
from robot_wm.contracts import JOINT_NAMES, N_JOINTS
from robot_wm.core.kinematics import Kinematics
from robot_wm.core.reacher import DlsReacher
from robot_wm.core.safety import FilterInput, SafetyFilter, load_safety_limits

DT = 0.01
HOME = description.initial_positions(JOINT_NAMES)  # config/initial_positions.yaml


def _pct(values, unit_scale: float = 1e6, fmt: str = "{:8.1f}") -> str:
    v = np.asarray(values, dtype=float) * unit_scale
    if v.size == 0:
        return "(none)"
    p50, p99, mx = np.percentile(v, 50), np.percentile(v, 99), v.max()
    return f"p50 {fmt.format(p50)}  p99 {fmt.format(p99)}  max {fmt.format(mx)}"


def stream(filt: SafetyFilter, kin: Kinematics, periods: int, seed: int = 0):
    """Run the closed loop; yield (FilterOutput, filter wall time, (QpSnapshot, solution) or None) per period."""
    limits = filt.limits
    rng = np.random.default_rng(seed)
    reacher = DlsReacher(kin, HOME, limits.vel_max_radps * 1.5, max_tool_speed_mps=0.8)
    q, qd = HOME.copy(), np.zeros(N_JOINTS)
    box_center = np.array(limits.keepout_boxes_m[:3]) + 0.5 * (
        np.array(limits.keepout_boxes_m[3:6]) - np.array(limits.keepout_boxes_m[:3]))
    goal, mode = rng.uniform([-0.6, -0.3, 0.15], [-0.3, 0.2, 0.5]), "reach"
    for t in range(periods):
        if t % 150 == 0:
            mode = rng.choice(["reach", "reach", "reach", "limits", "table", "keepout"])
            goal = rng.uniform([-0.6, -0.3, 0.15], [-0.3, 0.2, 0.5])
            burst = rng.choice([-1.0, 1.0], N_JOINTS) * limits.vel_max_radps * 2.0
        if mode == "reach":
            nominal = reacher(q, goal) + 0.05 * rng.standard_normal(N_JOINTS)
        elif mode == "limits":
            nominal = burst
        else:
            target = np.array([-0.5, -0.1, -0.3]) if mode == "table" else box_center
            nominal = reacher(q, target)
        t0 = time.perf_counter()
        out = filt.filter(FilterInput(q, qd, nominal, u_prev_radps=qd))  # the kinematic arm tracks its command
        wall = time.perf_counter() - t0
        snap = None
        if out.solver_status != 0:  # the QP was solved: keep its data for the comparisons
            snap = (filt.snapshot(), out.u_safe_radps.copy())
        yield out, wall, snap
        qd = out.u_safe_radps
        q = q + qd * DT
        if out.is_stop and not np.any(qd):
            q, qd = HOME.copy(), np.zeros(N_JOINTS)  # an unrecoverable state stopped the arm: start over


def cvxpy_solve(cp, filt: SafetyFilter, snap) -> tuple[np.ndarray, float, str]:
    """The same QP as people usually write it in cvxpy: a new problem from the rows, every call."""
    qp = snap[0]
    A, l, u, q, lay = qp.A, qp.l, qp.u, qp.q, qp.layout
    n = filt.n
    t0 = time.perf_counter()
    x = cp.Variable(n)
    s = cp.Variable(3, nonneg=True)
    u_nom = -q[:n]
    w = qp.slack_weight
    cons = []
    a_u, a_s = A[:, :n], A[:, n:]
    for rows in (lay.hard, lay.soft):
        a, lo, hi, asl = a_u[rows], l[rows], u[rows], a_s[rows]
        expr = a @ x + asl @ s
        fin_lo, fin_hi = np.isfinite(lo), np.isfinite(hi)
        if fin_lo.any():
            cons.append(expr[fin_lo] >= lo[fin_lo])
        if fin_hi.any():
            cons.append(expr[fin_hi] <= hi[fin_hi])
    prob = cp.Problem(cp.Minimize(0.5 * cp.sum_squares(x - u_nom) + 0.5 * w * cp.sum_squares(s)), cons)
    prob.solve()
    wall = time.perf_counter() - t0
    return np.asarray(x.value, dtype=float), wall, prob.solver_stats.solver_name


def osqp_fresh_setup(filt: SafetyFilter, snap) -> float:
    """OSQP with a new setup() for this one problem (what a naive direct OSQP user does)."""
    qp = snap[0]
    n = filt.n
    t0 = time.perf_counter()
    solver = osqp.OSQP()
    p = sparse.diags(np.r_[np.ones(n), np.full(qp.A.shape[1] - n, qp.slack_weight)], format="csc")
    solver.setup(p, qp.q, sparse.csc_matrix(qp.A), qp.l, qp.u, **filt.osqp_settings)
    solver.solve(raise_error=False)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--periods", type=int, default=6000)
    parser.add_argument("--cvxpy-samples", type=int, default=300)
    args = parser.parse_args()

    urdf = description.expand()
    kin = Kinematics(urdf, description.joint_limits(urdf).names)
    limits = load_safety_limits()
    filt = SafetyFilter(limits, kin, DT)
    print(f"safety filter: {filt.n} joints, {filt.m} rows x {filt.nx} variables; OSQP {osqp.__version__} settings {filt.osqp_settings}")

    # warm-up (imports, caches), then the measured stream
    for _ in stream(filt, kin, 300, seed=99):
        pass
    outs, walls, snaps = [], [], []
    for out, wall, snap in stream(filt, kin, args.periods, seed=1):
        if snap is not None:
            snaps.append((snap, out, len(outs)))
        outs.append(out)
        walls.append(wall)
    qp_periods = [i for i, o in enumerate(outs) if o.solver_status != 0]
    states: dict[str, int] = {}
    for o in outs:
        states[o.state.name] = states.get(o.state.name, 0) + 1
    print(f"\nstream: {len(outs)} periods at {1 / DT:.0f} Hz; states {states}; QP solved in {len(qp_periods)} "
          f"({100 * len(qp_periods) / len(outs):.0f} %), the others passed the nominal (feasible) or stopped")
    print(f"filter() total, all periods      [us]: {_pct(walls)}")
    print(f"filter() total, QP periods       [us]: {_pct([walls[i] for i in qp_periods])}")
    print(f"QP update()+solve()              [us]: {_pct([outs[i].solve_time_s for i in qp_periods])}")
    print(f"OSQP iterations                       : {_pct([outs[i].iterations for i in qp_periods], 1, '{:8.0f}')}")
    fails = sum(o.solver_status not in (0, 1) for o in outs)
    print(f"solver failures (stop)                : {fails}")

    try:
        import cvxpy as cp
    except ImportError:
        print("\ncvxpy not installed (pip install cvxpy==1.9.3, see requirements-test.txt): comparison skipped")
        return
    rng = np.random.default_rng(0)
    pick = rng.choice(len(snaps), size=min(args.cvxpy_samples, len(snaps)), replace=False)
    cvx_times, fresh_times, ours_qp, ours_total, diffs, solver_names = [], [], [], [], [], set()
    for k in pick:
        snap, out, idx = snaps[k]
        x, wall, name = cvxpy_solve(cp, filt, snap)
        solver_names.add(name)
        cvx_times.append(wall)
        diffs.append(float(np.max(np.abs(x - snap[1]))))
        fresh_times.append(osqp_fresh_setup(filt, snap))
        ours_qp.append(out.solve_time_s)
        ours_total.append(walls[idx])
    print(f"\ncvxpy {cp.__version__} ({', '.join(sorted(solver_names))}), new cp.Problem per period, "
          f"{len(pick)} QP periods of the stream:")
    print(f"cvxpy build+solve                [us]: {_pct(cvx_times)}")
    print(f"OSQP fresh setup()+solve()       [us]: {_pct(fresh_times)}")
    print(f"this filter: QP update()+solve() [us]: {_pct(ours_qp)}")
    print(f"this filter: whole filter()      [us]: {_pct(ours_total)}")
    med = lambda v: float(np.median(v))  # noqa: E731
    print(f"ratio cvxpy / this filter's whole filter(): {med(cvx_times) / med(ours_total):6.1f}x (median), "
          f"{np.percentile(cvx_times, 99) / np.percentile(ours_total, 99):6.1f}x (p99)")
    print(f"ratio cvxpy / this filter's QP update+solve: {med(cvx_times) / med(ours_qp):6.1f}x (median)")
    print(f"ratio fresh OSQP setup / warm update+solve: {med(fresh_times) / med(ours_qp):6.1f}x (median)")
    far = 100.0 * np.mean(np.asarray(diffs) > 1e-4)
    print(f"solution agreement |u_cvxpy - u_filter|_inf: median {np.median(diffs):.2e}, max {np.max(diffs):.2e} rad/s; "
          f"{far:.1f} % above 1e-4 (solves whose polish step failed: the filter's answer is then accurate to "
          "eps 1e-3, slightly suboptimal, its hard rows still exact)")


if __name__ == "__main__":
    main()
