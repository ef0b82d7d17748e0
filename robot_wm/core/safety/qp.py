"""The CBF-QP safety filter: the QP that turns a proposed joint-velocity command into a safe one.

Each control period :meth:`SafetyFilter.filter` solves

    minimize   ½‖u − u_nom‖² + ½ w Σ_f s_f²                    over u (rad/s), slacks s_f ≥ 0
    subject to, for every barrier h, linearized in u around the current state,
               h(x⁺) ≥ h(x) − γ(h(x)) + margin            (x⁺ ≈ f0 + B (u − u_nom))

with the families of :mod:`~robot_wm.core.safety.layout` (docs/safety_filter.md has the
derivations and numbers). One OSQP problem is set up at construction (fixed sparsity); each period
only q, l, u and the values of A change (``update`` + warm ``solve``). Anything that is not a
solved, verified QP — bad or stale input, infeasible QP, solver failure, failed post-check, trust
scale 0 — gives a **controlled stop**: the previous command ramped toward zero at the stop
deceleration, then zero. The nominal command is never passed through unchecked.

This class is the QP alone: it keeps no latch and no memory of what was sent (the previous
command is an input). :class:`~robot_wm.core.safety.controller.SafetyController` runs the whole
control period around it.
"""
from __future__ import annotations

import collections
import math
import time
from typing import Any

import numpy as np
import osqp
from scipy import sparse

from robot_wm.contracts import STATE_LAYOUT
from robot_wm.core.safety import speed as speed_polytope
from robot_wm.core.safety.barriers import Workspace, accel_box, brake_speed
from robot_wm.core.safety.layout import RowLayout
from robot_wm.core.safety.report import active_names, slack_record, unkept_soft_row
from robot_wm.core.safety.limits import SafetyLimits
from robot_wm.core.safety.types import (
    QpSnapshot,
    OSQP_BUDGET_SPENT,
    OSQP_INFEASIBLE,
    OSQP_SOLVED,
    OSQP_SOLVED_INACCURATE,
    SOLVER_NOT_RUN,
    BoundSource,
    FaultKind,
    FilterInput,
    FilterOutput,
    FilterState,
    no_slack,
    solver_status_text,
)
from robot_wm.core.safety.validate import (
    ParsedInput,
    Problem,
    as_scalar,
    as_vector,
    check_model,
    parse_filter_input,
)

_Q, _QD = STATE_LAYOUT["q_rad"], STATE_LAYOUT["qdot_radps"]  # the world model's state vector

#: Periods over which the largest input age sets the braking coast time (an age that spikes and
#: drops again must not shrink the braking distance faster than the command can follow).
AGE_WINDOW = 10

#: Reach used in the curvature (second-order) bound of the point linearization, m: a UR5e-class arm
#: reaches 0.85 m; every second derivative of a point position is bounded by its distance from an axis.
REACH_M = 1.0

#: Above the force limit the tool must move away from the contact at least this fast (m/s); when
#: the other limits do not allow that, the filter stops the arm instead.
FORCE_RETREAT_MPS = 0.01


_POSITION, _BRAKING = int(BoundSource.POSITION), int(BoundSource.BRAKING)  # plain ints are faster in numpy


def _short(joint: str) -> str:
    return joint[:-len("_joint")] if joint.endswith("_joint") else joint


class SafetyFilter:
    """CBF-QP safety filter over joint velocity commands (one OSQP problem, set up once).

    Args:
        limits: the safety limits (checked against the URDF limits in ``kinematics``).
        kinematics: ``robot_wm.core.kinematics.Kinematics`` of the arm (joint order, tool frame).
        dt_s: control period, s.
        require_model: True = a missing or implausible world model is a FAULT (stop);
            False = use the kinematic model in its place (the output's reason says so).
        slack_weight: quadratic penalty w on each soft-constraint slack s (cost ½ w s²). A soft row
            active with multiplier λ is exceeded by λ/w; the soft rows are tightened by
            SOFT_MARGIN so that this does not show in the true constraint. (A linear, exact
            penalty makes the slack rows' multipliers equal to its weight, which slows ADMM
            down by an order of magnitude.)
        osqp_settings: overrides of the OSQP settings (see ``DEFAULT_OSQP_SETTINGS``).
    Raises:
        SafetyLimitsError / ValueError: limits outside the URDF's, joint-count or frame mismatch.
    """

    #: OSQP settings tuned for a small warm-started QP every period: eps 1e-3 + polishing (the
    #: polished solution is exact on its active set; hard rows carry HARD_MARGIN for the rare
    #: unpolished one); no Ruiz scaling (the rows are already in comparable units, rad/s and m/s,
    #: and unscaled ADMM needed fewer iterations on recorded streams); max_iter/time_limit bound the
    #: worst case, and hitting them stops the arm.
    DEFAULT_OSQP_SETTINGS = dict(
        eps_abs=1e-3, eps_rel=1e-3, eps_prim_inf=1e-5, eps_dual_inf=1e-5, max_iter=4000, polishing=True,
        polish_refine_iter=3, warm_starting=True, verbose=False, check_termination=5, adaptive_rho=True,
        scaling=0,
    )
    #: The coupled hard rows (world-model position and braking rows, the force row above the limit)
    #: are tightened by this much (row units) inside the QP so that a solution within the solver
    #: tolerance still satisfies the true bounds, which the post-check verifies. The box rows
    #: (single joints) are instead clipped exactly after the solve.
    HARD_MARGIN_RADPS = 5e-3
    #: Soft rows are tightened by this much (m/s) inside the QP (absorbs the λ/w of the slack penalty).
    SOFT_MARGIN_MPS = 5e-3
    #: Tolerance of the post-check on the true hard bounds (row units).
    POSTCHECK_TOL = 1e-6
    #: A row is reported active when within this of its bound (row units).
    ACTIVE_TOL = 6e-3

    def __init__(
        self,
        limits: SafetyLimits,
        kinematics: Any,
        dt_s: float,
        *,
        require_model: bool = False,
        slack_weight: float = 1e3,
        osqp_settings: dict | None = None,
    ) -> None:
        dt = float(dt_s)
        if not (math.isfinite(dt) and 0.0 < dt <= 1.0):
            raise ValueError(f"dt_s={dt_s!r}: expected a control period in (0, 1] s")
        w = float(slack_weight)
        if not (math.isfinite(w) and w > 0):
            raise ValueError(f"slack_weight={slack_weight!r}: expected a positive number")
        self.limits = limits
        self.dt_s = dt
        self.require_model = bool(require_model)
        self.joint_names = tuple(kinematics.joint_names)
        n = self.n = len(self.joint_names)
        if limits.n_joints != n:
            raise ValueError(f"safety limits describe {limits.n_joints} joints, the kinematics {n} {self.joint_names}")
        model = kinematics.model
        perm_q = np.array([model.joints[model.getJointId(j)].idx_q for j in self.joint_names])
        perm_v = np.array([model.joints[model.getJointId(j)].idx_v for j in self.joint_names])
        self.hw_velocity_radps = np.asarray(model.velocityLimit[perm_v], dtype=float)
        limits.check_within(model.lowerPositionLimit[perm_q], model.upperPositionLimit[perm_q],
                            self.hw_velocity_radps, self.joint_names)
        self.workspace = Workspace(kinematics, limits)
        self.point_frames = self.workspace.frames
        self._joint_short = [_short(j) for j in self.joint_names]

        # limits as arrays
        self._lo, self._hi = limits.lower_rad, limits.upper_rad
        self._vmax, self._amax = limits.vel_max_radps, limits.accel_max_radps2
        self._astop = limits.stop_decel_radps2
        self._abrake = limits.brake_fraction * self._amax
        self._abrake2 = np.concatenate((self._abrake, self._abrake))  # both sides of every joint in one call
        self._kin_err_rad = 0.5 * self._amax * dt * dt  # kinematic-model error bound on q⁺
        # this period's timing (set from FilterInput.elapsed_s / input_age_periods)
        self._dt_brake = dt  # time braking and the stop ramp may use: elapsed, clipped to [dt, stale dt]
        self._dt_up = dt  # time speeding up may use: elapsed, at most dt
        self._ages: collections.deque[float] = collections.deque(maxlen=AGE_WINDOW)
        self._coast_s = limits.reaction_time_s  # + the largest input age of the last AGE_WINDOW periods

        # ------------------------------------------------------------ rows
        n_sp = len(speed_polytope.SPEED_DIRECTIONS)
        lay = self.layout = RowLayout.build(n, n_sp, self.workspace.n_rows)
        self.m, self.nx = lay.m, lay.nx
        #: Name of every constraint row (box rows are renamed by what binds them, see _active).
        self.row_names = (
            [f"velocity_limit:{j}" for j in self._joint_short] + [f"joint_limit:{j}" for j in self._joint_short] * 2
            + ["tool_speed"] * n_sp + self.workspace.row_names() + ["contact_force"] + ["slack"] * 3
        )
        # sparsity pattern (fixed for the life of the filter) and the constant entries of A
        pattern = np.zeros((lay.m, lay.nx), dtype=bool)
        pattern[lay.box, :n] = np.eye(n, dtype=bool)
        pattern[lay.pos.start:lay.force + 1, :n] = True  # position, braking, speed, workspace, force rows
        pattern[lay.speed, lay.col_slack_speed] = True
        pattern[lay.ws, lay.col_slack_ws] = True
        pattern[lay.force, lay.col_slack_force] = True
        pattern[lay.slack, n:] = np.eye(3, dtype=bool)
        cols, rows = np.nonzero(pattern.T)  # column-major = CSC order
        self._csc_rows, self._csc_cols = rows, cols
        A = self._A = np.zeros((lay.m, lay.nx))
        A[lay.box, :n] = np.eye(n)
        A[lay.speed, lay.col_slack_speed] = -1.0
        A[lay.ws, lay.col_slack_ws] = 1.0
        A[lay.force, lay.col_slack_force] = -1.0
        A[lay.slack, n:] = np.eye(3)
        # bounds: the constant sides are set once
        self._l, self._u = np.full(lay.m, -np.inf), np.full(lay.m, np.inf)
        self._l[lay.slack] = 0.0
        self._l_qp, self._u_qp = self._l.copy(), self._u.copy()
        self._margin_qp = np.zeros(lay.m)
        self._margin_qp[lay.coupled] = self.HARD_MARGIN_RADPS  # box rows are clipped exactly
        self._margin_qp[lay.soft] = self.SOFT_MARGIN_MPS
        # per-period bookkeeping of the box rows: which limit binds each side, the exact hard box
        self._lo_src = np.full(n, BoundSource.SPEED)
        self._hi_src = np.full(n, BoundSource.SPEED)
        self._hard_lo, self._hard_hi = np.zeros(n), np.zeros(n)
        self._force_hard = False  # the force row is hard this period (force above the limit)
        self._jac_tool = np.zeros((3, n))
        self._tool_speed_lim = limits.tool_speed_max_mps
        self._speed_margin = 0.0  # this period's look-ahead margin of the tool-speed rows, m/s
        self._tool_jacobian = lambda q_rad: kinematics.tool_jacobian(q_rad)[:3]
        self._kinematic_rows = False  # A's coupled rows currently hold the kinematic model (identity)
        self._q = np.zeros(lay.nx)
        self._P = sparse.diags(np.concatenate([np.ones(n), np.full(3, w)]), format="csc")

        # generous: on a loaded 2-core machine a preempted solve must not read as a solver failure
        self.osqp_settings = dict(self.DEFAULT_OSQP_SETTINGS, time_limit=0.9 * dt)
        self.osqp_settings.update(osqp_settings or {})
        # a representative problem (mid-range posture at rest) for the set-up
        q_mid = 0.5 * (self._lo + self._hi)
        conflict = self._assemble(q_mid, np.zeros(n), np.zeros(n), np.zeros(n), None, None, 1.0, 1.0)
        if conflict:
            raise ValueError(f"safety limits admit no command at rest in the middle of the joint range: {conflict}")
        self._last_Ax = A[rows, cols]
        a_csc = sparse.csc_matrix((self._last_Ax, rows, np.searchsorted(cols, np.arange(lay.nx + 1))),
                                  shape=(lay.m, lay.nx))
        self._solver = osqp.OSQP()
        self._solver.setup(self._P, self._q, a_csc, self._l_qp, self._u_qp, **self.osqp_settings)
        self.setup_count = 1  # the only setup(): every period is update() + solve()

    # ------------------------------------------------------------------ API
    def reset(self) -> None:
        """Forget the timing history (the arm is known to be at rest, e.g. after a reset)."""
        self._dt_brake = self._dt_up = self.dt_s
        self._ages.clear()
        self._coast_s = self.limits.reaction_time_s

    def carry_timing(self, other: "SafetyFilter") -> None:
        """Take over another filter's timing history (input ages, elapsed): limits applied in place."""
        self._ages.extend(other._ages)
        self._dt_brake, self._dt_up = other._dt_brake, other._dt_up
        self._coast_s = self.limits.reaction_time_s + (max(self._ages) * self.dt_s if self._ages else 0.0)

    def snapshot(self) -> QpSnapshot:
        """A copy of the QP assembled in the latest period (what OSQP solved when it was solved)."""
        return QpSnapshot(self._A.copy(), self._l_qp.copy(), self._u_qp.copy(), self._q.copy(),
                          float(self._P.diagonal()[self.n]), self.layout)

    def controlled_stop(self, u_prev_radps: Any = None, elapsed_s: float | None = None) -> np.ndarray:
        """The next command of a controlled stop: the previous command ramped toward zero, then zero.

        Each joint's speed drops by ``stop_deceleration_radps2`` times the time since the previous
        command (``elapsed_s`` clipped to [dt, stale_limit_periods * dt]; None: the latest
        filtered period's, else one period): a late period brakes by more, so the stop keeps its
        deceleration in real time. The ramp starts from the command sent last (known exactly,
        independent of sensors); a missing or malformed one counts as zero.
        """
        base = as_vector(u_prev_radps, self.n)
        if base is None:
            return np.zeros(self.n)
        base = np.clip(base, -self.hw_velocity_radps, self.hw_velocity_radps)
        dt_b = self._dt_brake if elapsed_s is None else self._clip_brake(as_scalar(elapsed_s))
        return np.copysign(np.maximum(np.abs(base) - self._astop * dt_b, 0.0), base)

    def filter(self, inp: FilterInput) -> FilterOutput:
        """Filter one period's nominal command; never raises for bad input (that is a FAULT stop).

        Args:
            inp: measured state, nominal and previous command, optional model, force, trust scale
                and input age.
        Returns:
            The command to send with the status of this period.
        """
        parsed = parse_filter_input(inp, self.n, self.limits.stale_limit_periods)
        u_prev = getattr(inp, "u_prev_radps", None)
        if isinstance(parsed, Problem):
            return self._stop(FilterState.FAULT, parsed.reason, u_prev, getattr(inp, "u_nominal_radps", None),
                              kind=parsed.kind)
        return self.filter_checked(parsed, getattr(inp, "model_checked", False) is True)

    def filter_checked(self, p: ParsedInput, model_checked: bool | Problem = False) -> FilterOutput:
        """:meth:`filter` for inputs the caller has validated as ``parse_filter_input`` does.

        ``SafetyController`` checks every input of its period (and the world model's linearization:
        ``model_checked``) before it calls this; parsing them again cost the hot path ~15 µs.
        """
        self._set_timing(p.elapsed, p.age)
        mdl, note = p.model, ""
        if mdl is None and self.require_model:
            return self._stop(FilterState.FAULT, "world model missing (require_model=True)", p.u_prev, p.u_nom,
                              kind=FaultKind.MODEL)
        if isinstance(model_checked, Problem):  # judged implausible already (SafetyController, multirate)
            mdl, note = None, model_checked.reason + ": kinematic model used this period"
        elif mdl is not None and not model_checked:
            checked = check_model(mdl, p.q, self.hw_velocity_radps, self.dt_s, self.joint_names)
            if isinstance(checked, Problem):
                if checked.kind == FaultKind.MODEL or self.require_model:
                    return self._stop(FilterState.FAULT, checked.reason, p.u_prev, p.u_nom, kind=checked.kind)
                # without require_model an implausible model is replaced by the conservative kinematic one
                mdl, note = None, checked.reason + ": kinematic model used this period"
            else:
                mdl = checked
        if p.s_v == 0.0 or p.s_a == 0.0:
            return self._stop(FilterState.STOPPING, f"trust scale {p.s_v:g} (speed) / {p.s_a:g} (acceleration): stop",
                              p.u_prev, p.u_nom)
        # an absurd nominal is scaled (direction kept) into the hardware velocity limits
        over = float(np.max(np.abs(p.u_nom) / self.hw_velocity_radps))
        u_nom = p.u_nom / over if over > 1.0 else p.u_nom
        conflict = self._assemble(p.q, p.qd, u_nom, p.u_prev, mdl, p.force, p.s_v, p.s_a, u_lin=p.u_nom)
        if conflict:
            return self._stop(FilterState.STOPPING, f"infeasible: {conflict}", p.u_prev, p.u_nom)
        # the QP's unique optimum is u_nom whenever u_nom meets every constraint with zero slack
        if self._feasible(u_nom):
            scaled = over > 1.0
            reasons = [f"nominal command scaled by {1 / over:.3g} into the hardware limits"] if scaled else []
            return FilterOutput(
                u_safe_radps=u_nom.copy(), state=FilterState.FILTERING if scaled else FilterState.OK,
                reason="; ".join(reasons + ([note] if note else [])),
                intervention_norm=float(np.linalg.norm(u_nom - p.u_nom)),
                solver_status=SOLVER_NOT_RUN, solver_status_text="not run (nominal feasible)",
            )
        return self._solve(u_nom, p.u_nom, p.u_prev, note)

    # ------------------------------------------------------------- internals
    def _set_timing(self, elapsed: float | None, age: float) -> None:
        dt = self.dt_s
        self._dt_brake = self._clip_brake(elapsed)
        self._dt_up = dt if elapsed is None else min(max(elapsed, 0.0), dt)
        self._ages.append(age)
        self._coast_s = self.limits.reaction_time_s + max(self._ages) * dt

    def _clip_brake(self, elapsed: float | None) -> float:
        dt = self.dt_s
        return dt if elapsed is None else min(max(elapsed, dt), max(self.limits.stale_limit_periods, 1) * dt)

    def _assemble(self, q, qd, u_nom, u_prev, mdl, force, s_v, s_a, u_lin=None) -> str | None:
        """Fill the values of A and the bounds l, u for this period.

        ``u_nom`` is the nominal of the cost (scaled into the hardware limits); ``u_lin`` the
        command the model was linearized at (the nominal as given; x⁺ ≈ f0 + B (u − u_lin)).

        Returns a description of the conflict when the hard rows are already known to be
        infeasible (every box-merged bound concerns one joint), else None.
        """
        n, dt, lim, A, l, u, lay = self.n, self.dt_s, self.limits, self._A, self._l, self._u, self.layout
        alpha, kappa = lim.cbf_alpha, lim.robustness_kappa
        kin = mdl is None
        if kin:
            margin_q = self._kin_err_rad  # the kinematic model's error bound on q⁺
        else:
            f0q, f0qd, bq, bqd = mdl.f0[_Q], mdl.f0[_QD], mdl.B[_Q], mdl.B[_QD]
            u_lin = u_nom if u_lin is None else u_lin
            margin_q = kappa * mdl.sigma[_Q]  # κ σ on q⁺

        # box rows: speed limit ∩ acceleration box around the previous command
        box_lo, box_hi, box_lo_src, box_hi_src = accel_box(u_prev, self._vmax, self._amax, s_v, s_a,
                                                           self._dt_brake, self._dt_up)

        # joint positions, h_up = q_max − q, h_lo = q − q_min:
        #   position: h(q⁺) >= (1 − α) h(q) + margin  (h < 0: h(q⁺) >= h(q) + margin, no further violation)
        #   braking:  u <= v_b(h − margin), the speed from which a_brake stops within the distance
        #             left after coasting one period plus the reaction time (latency, lag, input age)
        h_up, h_lo = self._hi - q, q - self._lo
        pos_hi = (alpha * np.maximum(h_up, 0.0) - margin_q) / dt
        pos_lo = (-alpha * np.maximum(h_lo, 0.0) + margin_q) / dt
        # both sides of every joint in one call (elementwise: the same numbers as one call per side)
        margin_2 = np.concatenate((margin_q, margin_q))
        brk = brake_speed(np.concatenate((h_up, h_lo)) - margin_2, self._abrake2, dt, self._coast_s)
        brk_hi, brk_lo = brk[:n], -brk[n:]

        if kin:
            # every hard row bounds one joint: merge them into the box rows (redundant active rows
            # slow ADMM down) and find conflicts without solving
            if not self._kinematic_rows:
                A[lay.pos, :n] = np.eye(n)
                A[lay.brake, :n] = np.eye(n)
                self._kinematic_rows = True
            lo, hi, conflict = self._merge(box_lo, box_hi, box_lo_src, box_hi_src, brk_lo, brk_hi, pos_lo, pos_hi)
            if conflict is not None:
                return self._conflict_text(conflict, lo, hi)
            l[lay.box], u[lay.box] = lo, hi
            l[lay.coupled], u[lay.coupled] = -np.inf, np.inf
        else:
            self._kinematic_rows = False
            c = (q - f0q + bq @ u_lin) / dt
            A[lay.pos, :n] = bq / dt
            l[lay.pos], u[lay.pos] = c + pos_lo, c + pos_hi
            # At a limit (inside the robust margin) or past it, "h(q⁺) >= h(q) + κσ" asks the model's
            # mean to retreat by κσ in one period: with the acceleration box that is often infeasible
            # even at rest; so would the predicted-velocity braking row whenever the model predicts a
            # little drift at zero command. There both coupled rows of that joint are freed and "command
            # no further into the limit" holds exactly through the command braking bound merged into
            # the box rows below (v_b = 0 inside the margin).
            cb = bqd @ u_lin - f0qd
            A[lay.brake, :n] = bqd
            brk_next = brake_speed(np.concatenate((h_lo, h_up)) - margin_2, self._abrake2, dt)
            l[lay.brake] = cb - brk_next[:n]
            u[lay.brake] = cb + brk_next[n:]
            at_limit = (h_up <= margin_q) | (h_lo <= margin_q)
            if at_limit.any():
                l[lay.pos][at_limit], u[lay.pos][at_limit] = -np.inf, np.inf
                l[lay.brake][at_limit], u[lay.brake][at_limit] = -np.inf, np.inf
            # the braking bound holds for the command itself too (the drive converges to it):
            # merged into the box rows, exact per joint
            lo, hi, conflict = self._merge(box_lo, box_hi, box_lo_src, box_hi_src, brk_lo, brk_hi)
            # unit-norm coupled rows: a lagging drive gives them coefficients ~0.1 next to the box
            # rows' 1, and unscaled ADMM then ran into its iteration limit (same feasible set)
            rows = lay.coupled
            a_rows = A[rows, :n]
            norm = np.sqrt((a_rows * a_rows).sum(axis=1))  # = np.linalg.norm(a_rows, axis=1)
            if conflict is None:
                conflict = self._unreachable_rows(lo, hi, a_rows, norm)
            if conflict is not None:
                return self._conflict_text(conflict, lo, hi)
            l[lay.box], u[lay.box] = lo, hi
            norm = np.maximum(norm, 1e-9)
            A[rows, :n] = a_rows / norm[:, None]
            l[rows] /= norm
            u[rows] /= norm

        # points: positions and Jacobians at the current state
        pts, jac = self.workspace.points(q)
        jt = self._jac_tool
        jt[:] = jac[0]

        # tool speed ‖J u‖ <= v of the COMMANDED joint velocity (the set-point the drive converges
        # to; a lagging drive's next velocity lies between qdot and u, so bounding u bounds it too
        # once the arm is within the limit): polytope inscribed in the ball, a vertex along J u_nom.
        # The command applies while the arm moves on (coasting the reaction time and the input age,
        # then one period): the bound is lowered by how much the previous command's tool speed
        # grows over that horizon, so that it holds at the posture where the command ends too.
        self._tool_speed_lim = lim.tool_speed_max_mps * s_v
        self._speed_margin = 0.0 if not u_prev.any() else speed_polytope.speed_growth(
            jt, self._tool_jacobian(q + u_prev * (self._coast_s + dt)), u_prev, self._tool_speed_lim)
        # ... and by the part of the drive's tracking error (q̇ − u_prev) that would carry the tool faster
        rows = A[lay.speed, :n] = speed_polytope.speed_rows(jt, u_nom)
        u[lay.speed] = ((self._tool_speed_lim - self._speed_margin) * speed_polytope.SPEED_POLYTOPE_COS
                        - speed_polytope.drive_error_tightening(rows, qd, u_prev, self._tool_speed_lim))

        # workspace barriers (table, keep-outs) of every monitored point, on the COMMAND:
        #   h + g·J u dt >= h − γ(h) + margins,  γ(h) = min(α h, dt v_b(h)) (h >= 0), 0 (h < 0)
        h, g = self.workspace.barriers(pts)
        gj = np.einsum("wi,wij->wj", g, jac[self.workspace.point_of_row])  # (W, n) = dh/dq
        box_w = np.maximum(np.abs(l[lay.box]), np.abs(u[lay.box]))
        dq_bound = float(box_w.sum()) * dt  # ‖q⁺ − q‖₁ over the box
        margin = np.abs(gj) @ (margin_q * np.ones(n)) + 0.5 * REACH_M * dq_bound * dq_bound
        gamma = np.where(h >= 0.0, np.minimum(alpha * h, dt * brake_speed(h, lim.workspace_deceleration_mps2, dt,
                                                                           self._coast_s)), 0.0)
        A[lay.ws, :n] = gj
        l[lay.ws] = (margin - gamma) / dt

        # contact force on the COMMAND: n = F/|F| is the force the environment exerts on the tool,
        # so "into the contact" is −n. From onset on the row is −n·J u <= 0 (soft); above the limit
        # it is hard and asks for a retreat: −n·J u <= −FORCE_RETREAT_MPS (else the QP is
        # infeasible and the arm stops).
        fr = lay.force
        fnorm = 0.0 if force is None else math.sqrt(float(force @ force))
        self._force_hard = force is not None and fnorm > lim.force_limit_n
        if fnorm > 0.0 and fnorm >= lim.force_onset_fraction * lim.force_limit_n:
            A[fr, :n] = -(force / fnorm) @ jt
            u[fr] = -FORCE_RETREAT_MPS if self._force_hard else 0.0
        else:
            A[fr, :n], u[fr] = 0.0, np.inf
        A[fr, lay.col_slack_force] = 0.0 if self._force_hard else -1.0
        self._margin_qp[fr] = self.HARD_MARGIN_RADPS if self._force_hard else self.SOFT_MARGIN_MPS

        self._qp_bounds()
        self._q[:n] = -u_nom
        return None

    def _conflict_text(self, conflict: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> str:
        i = int(np.argmax(conflict))
        return (f"joint_limit:{self._joint_short[i]} cannot be kept within the velocity/acceleration "
                f"limits (allowed command [{lo[i]:.4g}, {hi[i]:.4g}] rad/s is empty)")

    def _unreachable_rows(self, lo: np.ndarray, hi: np.ndarray, a: np.ndarray, norm: np.ndarray) -> np.ndarray | None:
        """Free the sides of coupled world-model rows that no command in the box [lo, hi] can meet.

        Such a side means that, for the model, the joint's velocity and the drive's lag already
        carry it to within the robust margin of its limit in this period (a relative-degree-two
        effect a one-step row cannot express). That side of its position row is replaced by the
        exact command rule "no further into that limit" (``lo``/``hi`` are tightened in place), a
        braking-row side is left to the command braking bound. Tightening the box can make another
        row unmeetable, so this repeats until nothing changes; a box that becomes empty is a
        conflict (returned as a mask), i.e. a controlled stop. The check uses the QP's own
        tightened bounds (HARD_MARGIN on the unit-normalized row). The limit is never slacked.

        Args:
            lo, hi: the box rows' bounds (tightened in place).
            a, norm: the coupled rows' coefficients (before normalization) and their norms.
        """
        n, rows = self.n, self.layout.coupled  # n position rows, then n braking rows
        pos, neg = np.maximum(a, 0.0), np.minimum(a, 0.0)
        m = self.HARD_MARGIN_RADPS * norm
        l_r, u_r = self._l[rows], self._u[rows]  # views: freeing a side writes through
        for _ in range(2 * n):
            up_bad = np.isfinite(u_r) & (pos @ lo + neg @ hi > u_r - m)
            lo_bad = np.isfinite(l_r) & (pos @ hi + neg @ lo < l_r + m)
            if not (up_bad.any() or lo_bad.any()):
                break
            u_r[up_bad], l_r[lo_bad] = np.inf, -np.inf
            for r in np.flatnonzero(up_bad[:n]):
                hi[r], self._hi_src[r] = min(hi[r], 0.0), BoundSource.BRAKING
            for r in np.flatnonzero(lo_bad[:n]):
                lo[r], self._lo_src[r] = max(lo[r], 0.0), BoundSource.BRAKING
        empty = lo > hi
        return empty if empty.any() else None

    def _merge(self, box_lo, box_hi, box_lo_src, box_hi_src, brk_lo, brk_hi, pos_lo=None, pos_hi=None):
        """Per-joint intersection of the box, (position) and braking bounds.

        Returns (lo, hi, conflict mask or None); records which limit binds each side (on a tie the
        first of box, position, braking).
        """
        hi, lo = box_hi, box_lo
        self._hi_src[:], self._lo_src[:] = box_hi_src, box_lo_src
        for bound_hi, bound_lo, source in (((pos_hi, pos_lo, _POSITION),) if pos_hi is not None else ()) + (
                (brk_hi, brk_lo, _BRAKING),):
            tighter_hi, tighter_lo = bound_hi < hi, bound_lo > lo
            hi, lo = np.where(tighter_hi, bound_hi, hi), np.where(tighter_lo, bound_lo, lo)
            self._hi_src[tighter_hi], self._lo_src[tighter_lo] = source, source
        bad = lo > hi
        return lo, hi, (bad if bad.any() else None)

    def _qp_bounds(self) -> None:
        """Bounds the QP sees: coupled hard rows tightened by HARD_MARGIN (to the midpoint if
        narrower), soft rows by SOFT_MARGIN; and the per-joint hard box used for the final clip."""
        l, u, lay = self._l, self._u, self.layout
        self._hard_lo[:], self._hard_hi[:] = l[lay.box], u[lay.box]
        lq, uq = self._l_qp, self._u_qp
        lq[:] = l + self._margin_qp
        uq[:] = u - self._margin_qp
        narrow = np.nonzero(lq[lay.hard] > uq[lay.hard])[0] + lay.hard.start  # only rows with two finite bounds
        if narrow.size:
            lq[narrow] = uq[narrow] = 0.5 * (l[narrow] + u[narrow])

    def _feasible(self, u_nom: np.ndarray) -> bool:
        """True when u_nom (with zero slack) satisfies every row at its TRUE bound."""
        val = self._A[:, :self.n] @ u_nom
        return bool((val >= self._l).all() and (val <= self._u).all())

    def _solve(self, u_nom: np.ndarray, u_nom_raw: np.ndarray, u_prev: np.ndarray, note: str) -> FilterOutput:
        solver, n, lay = self._solver, self.n, self.layout
        ax = self._A[self._csc_rows, self._csc_cols]
        t0 = time.perf_counter()
        if np.array_equal(ax, self._last_Ax):
            solver.update(q=self._q, l=self._l_qp, u=self._u_qp)
        else:
            solver.update(q=self._q, l=self._l_qp, u=self._u_qp, Ax=ax)
            self._last_Ax = ax
        res = solver.solve(raise_error=False)
        status, iters = int(res.info.status_val), int(res.info.iter)
        solve_time = time.perf_counter() - t0
        text = solver_status_text(status)
        extra = dict(solver_status=status, solver_status_text=text, iterations=iters, solve_time_s=solve_time)
        spent = status in OSQP_BUDGET_SPENT and res.x is not None
        if status not in (OSQP_SOLVED, OSQP_SOLVED_INACCURATE) and not spent:
            if status in OSQP_INFEASIBLE:
                return self._stop(FilterState.STOPPING, f"infeasible: QP {text}", u_prev, u_nom_raw, **extra)
            return self._stop(FilterState.FAULT, f"solver: {text} after {iters} iterations", u_prev, u_nom_raw,
                              kind=FaultKind.SOLVER, **extra)
        u = np.array(res.x[:n], dtype=float)
        if not np.isfinite(u).all():
            return self._stop(FilterState.FAULT, "solver returned non-finite values", u_prev, u_nom_raw,
                              kind=FaultKind.SOLVER, **extra)
        # the box rows bound single joints: enforce them exactly
        u = np.minimum(np.maximum(u, self._hard_lo), self._hard_hi)
        # post-check: every hard row (box, position, braking; force above its limit) at its TRUE bound
        val = self._A[:, :n] @ u
        hard = list(range(lay.hard.start, lay.hard.stop)) + ([lay.force] if self._force_hard else [])
        viol = np.maximum(self._l[hard] - val[hard], val[hard] - self._u[hard])
        if (viol > self.POSTCHECK_TOL).any():
            i = int(np.argmax(viol))
            return self._stop(FilterState.FAULT, f"post-check failed: {self.row_names[hard[i]]} violated by {viol[i]:.3g}",
                              u_prev, u_nom_raw, kind=FaultKind.POSTCHECK, **extra)
        if status == OSQP_SOLVED_INACCURATE or spent:  # safe (post-checked), maybe further from the nominal than optimal
            # the last iterate of a slow ADMM run: used only when it keeps the soft rows too (report.py)
            if unkept := (unkept_soft_row(self, val, self.POSTCHECK_TOL) if spent else ""):
                return self._stop(FilterState.FAULT, f"solver: {text} after {iters} iterations (its last iterate "
                                  f"{unkept})", u_prev, u_nom_raw, kind=FaultKind.SOLVER, **extra)
            note = "; ".join(filter(None, (note, f"QP {text} after {iters} iterations, passed the post-check")))
        slack = slack_record(self, u, val)
        return FilterOutput(
            u_safe_radps=u, state=FilterState.FILTERING, reason=note, active_constraints=active_names(self, val),
            intervention_norm=float(np.linalg.norm(u - u_nom_raw)), max_slack=max(slack.values()), slack=slack,
            **extra,
        )

    def _stop(self, state: FilterState, reason: str, u_prev: Any, u_nom: Any, *, kind: FaultKind | None = None,
              **extra) -> FilterOutput:
        """A controlled-stop output: the previous command ramped toward zero."""
        u = self.controlled_stop(u_prev)
        nominal = as_vector(u_nom, self.n)
        norm = float(np.linalg.norm(u - nominal)) if nominal is not None else math.nan
        extra.setdefault("solver_status_text", "not run")
        return FilterOutput(u_safe_radps=u, state=state, reason=reason, fault_kind=kind, intervention_norm=norm,
                            slack=no_slack(), **extra)


__all__ = ["SafetyFilter", "QpSnapshot", "AGE_WINDOW", "REACH_M", "FORCE_RETREAT_MPS"]
