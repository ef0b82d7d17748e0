"""The CBF-QP safety filter: the last gate between a proposed joint-velocity command and the arm.

Each control period :meth:`SafetyFilter.filter` solves

    minimize   ½‖u − u_nom‖² + ½ w Σ_f s_f²                    over u (rad/s), slacks s_f ≥ 0
    subject to, for every barrier h, linearized in u around the current state,
               h(x⁺) ≥ h(x) − γ(h(x)) + margin            (x⁺ ≈ f0 + B (u − u_nom))

with the families (docs/safety_filter.md has the derivations and numbers):

* joint position limits (HARD, never slacked): a position row with the CBF rate α and braking
  bounds: the command within what the barrier's braking deceleration can stop in the remaining
  distance after coasting one period plus the reaction time and the input age, and (world model)
  the predicted next velocity after coasting one period;
* joint velocity |u| ≤ v_max·scale and acceleration: u within a_max·dt of the measured velocity
  or of the previous command (HARD box, the hull of both; speeding up is scaled by trust, braking
  never is);
* tool linear speed ≤ v_tool·scale (soft) of the commanded joint velocity: a 26-face polytope
  inscribed in the speed ball, rotated each period so that one of its vertices points along the
  nominal tool velocity;
* table plane and keep-out boxes/spheres for the tool and the monitored link points (soft);
* contact force: from |F| ≥ onset·limit on, no tool motion into the contact (soft).

One OSQP problem is set up at construction (fixed sparsity); each period only q, l, u and the
values of A change (``update`` + warm ``solve``). Anything that is not a solved, verified QP —
bad or stale input, infeasible QP, solver failure, failed post-check, trust scale 0 — gives a
**controlled stop**: the last command ramped toward zero at the stop deceleration, then zero.
The nominal command is never passed through unchecked.
"""
from __future__ import annotations

import collections
import dataclasses
import itertools
import math
import time
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import numpy as np
import osqp
import pinocchio as pin
from scipy import sparse

from robot_wm.core.safety.limits import SafetyLimits


class FilterState(IntEnum):
    """Safety filter state, as the constants of msg/SafetyStatus.msg."""

    OK = 0  # nominal command passes unchanged
    FILTERING = 1  # command modified by the QP to keep the constraints
    STOPPING = 2  # controlled stop (trust scale 0, infeasible QP)
    STOPPED = 3  # at standstill, zero commanded (set by the supervisor)
    ESTOP = 4  # e-stop latched (set by the supervisor)
    FAULT = 5  # bad/stale input, solver failure, failed post-check: controlled stop


#: Human-readable text of each state (SafetyStatus.state_text).
STATE_TEXT: dict[FilterState, str] = {s: s.name for s in FilterState}

#: solver_status when no QP was solved this period (not an OSQP value: those start at 1).
SOLVER_NOT_RUN = 0
_OSQP_SOLVED = 1
_OSQP_INFEASIBLE = (3, 4)


#: Periods over which the largest input age sets the braking coast time (an age that spikes and
#: drops again must not shrink the braking distance faster than the command can follow).
_AGE_WINDOW = 10

#: Start of every staleness fault reason (the supervisor treats those as non-latching by default).
STALE_PREFIX = "stale input:"


def solver_status_text(status: int) -> str:
    """Text of an OSQP status value (or of SOLVER_NOT_RUN)."""
    if status == SOLVER_NOT_RUN:
        return "not run"
    try:
        return osqp.SolverStatus(status).name.removeprefix("OSQP_").lower().replace("_", " ")
    except ValueError:
        return f"unknown status {status}"


#: Unit directions of the tool-speed polytope: the 26 neighbours of the 3x3x3 grid (faces, edges and
#: corners of a cube). The polytope {w : d·w ≤ r} has all its vertices at distance r/cos θ with
#: cos θ = 0.886452 (computed below), so r = v cos θ inscribes it in the ball ‖w‖ ≤ v: it contains
#: the ball of radius 0.886 v (worst-case conservatism 11.4 %) and touches the sphere at its vertices.
_GRID = np.array([d for d in itertools.product((-1, 0, 1), repeat=3) if any(d)], dtype=float)
SPEED_DIRECTIONS = _GRID / np.linalg.norm(_GRID, axis=1, keepdims=True)


def _polytope_vertices(directions: np.ndarray) -> np.ndarray:
    """Vertices of {w : d·w ≤ 1} (brute force over plane triples; 26 planes -> 2600 triples)."""
    verts = []
    for i, j, k in itertools.combinations(range(len(directions)), 3):
        m = directions[[i, j, k]]
        if abs(np.linalg.det(m)) < 1e-9:
            continue
        x = np.linalg.solve(m, np.ones(3))
        if np.all(directions @ x <= 1 + 1e-9):
            verts.append(x)
    return np.array(verts)


_VERTS = _polytope_vertices(SPEED_DIRECTIONS)
#: cos θ: inner radius / outer radius of the speed polytope (0.886452 for the 26 directions).
SPEED_POLYTOPE_COS = float(1.0 / np.linalg.norm(_VERTS, axis=1).max())
#: A vertex direction of the polytope; the polytope is rotated so that it points along the nominal
#: tool velocity, where the speed limit is then exact.
_VERTEX_DIR = _VERTS[np.argmax(np.linalg.norm(_VERTS, axis=1))] / np.linalg.norm(_VERTS, axis=1).max()
_EZ = np.array([0.0, 0.0, 1.0])
_FACE_NORMALS = np.vstack([-np.eye(3), np.eye(3)])  # outward normals of the faces min x, y, z, max x, y, z

#: Reach used in the curvature (second-order) bound of the point linearization, m: a UR5e-class arm
#: reaches 0.85 m; every second derivative of a point position is bounded by its distance from an axis.
REACH_M = 1.0


def _rotation_to(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Rotation matrix R with R a = b for unit vectors a, b (Rodrigues)."""
    v = np.array([a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0]])
    c = float(a @ b)
    if c < -1.0 + 1e-9:  # opposite: rotate by π about an axis orthogonal to a
        axis = np.array([0.0, -a[2], a[1]]) if abs(a[0]) < 0.9 else np.array([-a[2], 0.0, a[0]])
        axis /= math.sqrt(float(axis @ axis))
        return 2.0 * np.outer(axis, axis) - np.eye(3)
    vx = np.array([[0.0, -v[2], v[1]], [v[2], 0.0, -v[0]], [-v[1], v[0], 0.0]])
    return np.eye(3) + vx + (vx @ vx) / (1.0 + c)


@dataclass(frozen=True)
class LinearizedModel:
    """One-step prediction x⁺ ≈ f0 + B (u − u_nominal), x = (q_rad, qdot_radps), with its std.

    This is ``WorldModelRunner.linearize`` (f0, B) plus ``Prediction.total_std`` (sigma).
    """

    f0: np.ndarray  # (12,) predicted next (q, qdot) at the nominal command
    B: np.ndarray  # (12, 6) d x⁺ / d u
    sigma: np.ndarray  # (12,) predictive std of x⁺


@dataclass(frozen=True)
class FilterInput:
    """Everything the filter needs for one control period (arrays in joint order).

    Attributes:
        q_rad, qdot_radps: measured joint state.
        u_nominal_radps: the proposed command (e.g. the policy's action).
        model: the world model's linearization; None = kinematic model q⁺ = q + u dt, qdot⁺ = u
            with the error bound ½ a_max dt² on q⁺ (see docs/safety_filter.md).
        force_n: external contact force on the tool, base frame, N: the force the environment
            exerts ON the tool (pressing down on a table reads +z), payload weight and bias removed.
        trust_scale: factor on the speed limits in [0, 1] (0 = controlled stop).
        accel_scale: factor on the acceleration limits (speeding up only) in [0, 1]; None = trust_scale.
        input_age_periods: age of the oldest input in control periods (the node measures it). It
            is added to ``reaction_time_s`` in the joint-limit braking distance.
        elapsed_s: time since the previous command was sent, s (the node measures it); None = one
            period. The acceleration box and the controlled-stop ramp use it (clipped to
            [dt, stale_limit_periods * dt]), so a late period brakes as hard in real time as an
            on-time one instead of stretching the stop.
    """

    q_rad: Any
    qdot_radps: Any
    u_nominal_radps: Any
    model: LinearizedModel | None = None
    force_n: Any = None
    trust_scale: float = 1.0
    accel_scale: float | None = None
    input_age_periods: float = 0.0
    elapsed_s: float | None = None


@dataclass(frozen=True)
class FilterOutput:
    """The command to send and everything SafetyStatus.msg reports about this period."""

    u_safe_radps: np.ndarray
    state: FilterState
    reason: str = ""
    active_constraints: tuple[str, ...] = ()
    intervention_norm: float = 0.0
    solver_status: int = SOLVER_NOT_RUN
    solver_status_text: str = "not run"
    iterations: int = 0
    solve_time_s: float = 0.0
    max_slack: float = 0.0
    slack: dict[str, float] = field(default_factory=dict)

    @property
    def state_text(self) -> str:
        """Name of the state (SafetyStatus.state_text)."""
        return STATE_TEXT[self.state]

    @property
    def fault_reason(self) -> str:
        """The reason for FAULT or ESTOP; empty otherwise (SafetyStatus.fault_reason)."""
        return self.reason if self.state in (FilterState.FAULT, FilterState.ESTOP) else ""

    @property
    def is_stop(self) -> bool:
        """True when the command is a controlled stop (or zero) rather than a filtered command."""
        return self.state not in (FilterState.OK, FilterState.FILTERING)


_NO_SLACK = {"tool_speed_mps": 0.0, "workspace_m": 0.0, "contact_force_mps": 0.0}
_NO_INPUT = object()  # stands for a missing input in _stop (no measured velocity, no nominal)


def _short(joint: str) -> str:
    return joint[:-len("_joint")] if joint.endswith("_joint") else joint


class SafetyFilter:
    """CBF-QP safety filter over joint velocity commands (one OSQP problem, set up once).

    Args:
        limits: the safety limits (checked against the URDF limits in ``kinematics``).
        kinematics: ``robot_wm.core.kinematics.Kinematics`` of the arm (joint order, tool frame).
        dt_s: control period, s.
        require_model: True = a missing world model (``inp.model is None``) is a FAULT (stop);
            False = use the kinematic model.
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
    #: The coupled hard rows (world-model position and braking rows) are tightened by this much
    #: (rad/s) inside the QP so that a solution within the solver tolerance still satisfies the
    #: true bounds, which the post-check verifies. The box rows (single joints: speed, acceleration
    #: and, with the kinematic model, the joint limits) are instead clipped exactly after the solve.
    HARD_MARGIN_RADPS = 5e-3
    #: Soft rows are tightened by this much (m/s) inside the QP (absorbs the λ/w of the slack penalty).
    SOFT_MARGIN_MPS = 5e-3
    #: Tolerance of the post-check on the true hard bounds (row units: rad/s).
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
        self.limits = limits
        self.dt_s = dt
        self.require_model = bool(require_model)
        self.joint_names = tuple(kinematics.joint_names)
        n = self.n = len(self.joint_names)
        if limits.n_joints != n:
            raise ValueError(f"safety limits describe {limits.n_joints} joints, the kinematics {n} {self.joint_names}")
        self._model, self._data = kinematics.model, kinematics.data
        model = self._model
        self._perm = np.array([model.joints[model.getJointId(j)].idx_q for j in self.joint_names])
        self._perm_v = np.array([model.joints[model.getJointId(j)].idx_v for j in self.joint_names])
        self._qpin = pin.neutral(model)
        urdf_lo = model.lowerPositionLimit[self._perm]
        urdf_hi = model.upperPositionLimit[self._perm]
        self.hw_velocity_radps = np.asarray(model.velocityLimit[self._perm_v], dtype=float)
        limits.check_within(urdf_lo, urdf_hi, self.hw_velocity_radps, self.joint_names)

        # frames: the tool first, then the monitored link points
        tool_frame = model.frames[kinematics.tool_frame_id].name
        self.point_frames = (tool_frame,) + tuple(f for f in limits.monitored_frames if f != tool_frame)
        missing = [f for f in self.point_frames if not model.existFrame(f)]
        if missing:
            raise ValueError(f"safety.monitored_frames {missing} are not frames of the URDF")
        self._frame_ids = [model.getFrameId(f) for f in self.point_frames]
        self._clearance = np.array([limits.tool_clearance_m] + [limits.link_clearance_m] * (len(self._frame_ids) - 1))

        # limits as arrays
        self._lo, self._hi = limits.lower_rad, limits.upper_rad
        self._vmax, self._amax = limits.vel_max_radps, limits.accel_max_radps2
        self._astop = limits.stop_decel_radps2
        self._abrake = limits.brake_fraction * self._amax
        # this period's timing (set by _parse from FilterInput.elapsed_s / input_age_periods)
        self._dt_brake = dt  # time braking and the stop ramp may use: elapsed, clipped to [dt, stale dt]
        self._dt_up = dt  # time speeding up may use: elapsed, at most dt
        self._ages: collections.deque[float] = collections.deque(maxlen=_AGE_WINDOW)
        self._coast_s = limits.reaction_time_s  # + the largest input age of the last _AGE_WINDOW periods
        self._a_ws = limits.workspace_deceleration_mps2
        self._kin_err_rad = 0.5 * self._amax * dt * dt  # kinematic-model error bound on q⁺
        self._table_z = limits.table_z_m
        boxes, spheres = limits.boxes, limits.spheres
        self._box_lo = np.array([b[0] for b in boxes]).reshape(1, -1, 3)
        self._box_hi = np.array([b[1] for b in boxes]).reshape(1, -1, 3)
        self._sph_c = np.array([c for c, _ in spheres]).reshape(1, -1, 3)
        self._sph_r = np.array([r for _, r in spheres])
        self.speed_polytope_cos = SPEED_POLYTOPE_COS

        # ------------------------------------------------------------ rows
        k_pts, n_obs = len(self._frame_ids), 1 + len(boxes) + len(spheres)
        n_ws, n_sp = k_pts * n_obs, len(SPEED_DIRECTIONS)
        self._r_box, self._r_pos, self._r_brake = 0, n, 2 * n
        self._r_speed = 3 * n
        self._r_ws = self._r_speed + n_sp
        self._r_force = self._r_ws + n_ws
        self._r_slack = self._r_force + 1
        self.m = self._r_slack + 3
        self.nx = n + 3  # u, then the slacks of: workspace, tool speed, force
        s_ws, s_sp, s_f = n, n + 1, n + 2
        joints = [_short(j) for j in self.joint_names]
        self._joint_short = joints
        obstacles = ["table"] + [f"keepout_box{k}" for k in range(len(boxes))] + [
            f"keepout_sphere{k}" for k in range(len(spheres))]
        #: Name of every constraint row (box rows are renamed by what binds them, see _active).
        self.row_names = (
            [f"velocity_limit:{j}" for j in joints] + [f"joint_limit:{j}" for j in joints] * 2
            + ["tool_speed"] * n_sp + [f"{o}:{f}" for f in self.point_frames for o in obstacles]
            + ["contact_force"] + ["slack"] * 3
        )
        self._ws_point = np.repeat(np.arange(k_pts), n_obs)
        self._ws_offset = np.repeat(self._clearance[:, None], n_obs, axis=1)
        self._pts, self._jac = np.empty((k_pts, 3)), np.empty((k_pts, 3, n))
        self._h, self._g = np.zeros((k_pts, n_obs)), np.zeros((k_pts, n_obs, 3))
        self._g[:, 0] = _EZ  # the table's gradient

        # sparsity pattern (fixed for the life of the filter) and the constant entries of A
        pattern = np.zeros((self.m, self.nx), dtype=bool)
        pattern[:n, :n] = np.eye(n, dtype=bool)
        pattern[n:self._r_force + 1, :n] = True  # position, braking, speed, workspace, force rows
        pattern[self._r_speed:self._r_ws, s_sp] = True
        pattern[self._r_ws:self._r_force, s_ws] = True
        pattern[self._r_force, s_f] = True
        pattern[self._r_slack:, n:] = np.eye(3, dtype=bool)
        cols, rows = np.nonzero(pattern.T)  # column-major = CSC order
        self._csc_rows, self._csc_cols = rows, cols
        A = self._A = np.zeros((self.m, self.nx))
        A[:n, :n] = np.eye(n)
        A[self._r_speed:self._r_ws, s_sp] = -1.0
        A[self._r_ws:self._r_force, s_ws] = 1.0
        A[self._r_force, s_f] = -1.0
        A[self._r_slack:, n:] = np.eye(3)
        # bounds: the constant sides are set once
        self._l, self._u = np.full(self.m, -np.inf), np.full(self.m, np.inf)
        self._l[self._r_slack:] = 0.0
        self._l_qp, self._u_qp = self._l.copy(), self._u.copy()
        self._margin_qp = np.zeros(self.m)
        self._margin_qp[self._r_pos:self._r_speed] = self.HARD_MARGIN_RADPS  # box rows are clipped exactly
        self._margin_qp[self._r_speed:self._r_slack] = self.SOFT_MARGIN_MPS
        self._hi_src, self._lo_src = np.zeros(n, dtype=int), np.zeros(n, dtype=int)
        w = float(slack_weight)
        if not (math.isfinite(w) and w > 0):
            raise ValueError(f"slack_weight={slack_weight!r}: expected a positive number")
        self._q = np.zeros(self.nx)
        self._P = sparse.diags(np.concatenate([np.ones(n), np.full(3, w)]), format="csc")

        # generous: on a loaded 2-core machine a preempted solve must not read as a solver failure
        self.osqp_settings = dict(self.DEFAULT_OSQP_SETTINGS, time_limit=0.9 * dt)
        self.osqp_settings.update(osqp_settings or {})
        self._last_u: np.ndarray | None = None
        self._qd_now: np.ndarray | None = None
        self._A_kinematic = False
        # a representative problem (mid-range posture at rest) for the set-up
        q_mid = 0.5 * (self._lo + self._hi)
        conflict = self._assemble(q_mid, np.zeros(n), np.zeros(n), None, None, 1.0, 1.0)
        if conflict:
            raise ValueError(f"safety limits admit no command at rest in the middle of the joint range: {conflict}")
        self._last_Ax = A[rows, cols]
        a_csc = sparse.csc_matrix((self._last_Ax, rows, np.searchsorted(cols, np.arange(self.nx + 1))),
                                  shape=(self.m, self.nx))
        self._solver = osqp.OSQP()
        self._solver.setup(self._P, self._q, a_csc, self._l_qp, self._u_qp, **self.osqp_settings)
        self.setup_count = 1  # the only setup(): every period is update() + solve()

    # ------------------------------------------------------------------ API
    @property
    def last_command_radps(self) -> np.ndarray | None:
        """The command this filter (or its supervisor, via ``record_sent``) sent last (a copy)."""
        return None if self._last_u is None else self._last_u.copy()

    def record_sent(self, u_radps: np.ndarray) -> None:
        """Tell the filter what was actually sent this period (the supervisor overrides it on e-stop)."""
        self._last_u = np.array(u_radps, dtype=float)

    def reset(self) -> None:
        """Forget the last command and the timing history (the arm is known to be at rest, e.g.
        after an e-stop reset or a lifecycle deactivate)."""
        self._last_u = None
        self._qd_now = None
        self._dt_brake = self._dt_up = self.dt_s
        self._ages.clear()
        self._coast_s = self.limits.reaction_time_s

    def controlled_stop(self, qdot_radps: Any = None, elapsed_s: float | None = None) -> np.ndarray:
        """The next command of a controlled stop: the last command ramped toward zero, then zero.

        Each joint's speed drops by ``stop_deceleration_radps2`` times the time since the last
        command: ``elapsed_s`` when given, else the latest parsed input's (clipped to
        [dt, stale_limit_periods * dt]; a late period brakes by more, so the stop keeps its
        deceleration in real time; an early one still brakes by a full period). The ramp starts from the last command sent
        (known exactly, independent of sensors); before the first command it starts from the
        measured velocity when that is finite, else from zero.
        """
        base = self._last_u
        if base is None:
            qd = _as_vector(qdot_radps, self.n)
            base = qd if qd is not None else np.zeros(self.n)
        base = np.clip(base, -self.hw_velocity_radps, self.hw_velocity_radps)
        dt_b = self._dt_brake if elapsed_s is None else self._clip_brake(_as_scalar(elapsed_s))
        return np.copysign(np.maximum(np.abs(base) - self._astop * dt_b, 0.0), base)

    def _clip_brake(self, elapsed: float | None) -> float:
        dt = self.dt_s
        return dt if elapsed is None else min(max(elapsed, dt), max(self.limits.stale_limit_periods, 1) * dt)

    def check_input(self, inp: Any) -> str | None:
        """Return why ``inp`` cannot be filtered (a FAULT reason), or None when it is usable."""
        return self._parse(inp)[0]

    def filter(self, inp: FilterInput) -> FilterOutput:
        """Filter one period's nominal command; never raises for bad input (that is a FAULT stop).

        Args:
            inp: measured state, nominal command, optional model, force, trust scale and input age.
        Returns:
            The command to send with the status of this period.
        """
        out = self._filter(inp)
        if self._model_note and out.state in (FilterState.OK, FilterState.FILTERING):
            out = dataclasses.replace(out, reason="; ".join(r for r in (out.reason, self._model_note) if r))
        return out

    def _filter(self, inp: FilterInput) -> FilterOutput:
        self._qd_now = None
        self._model_note = ""
        fault, parsed = self._parse(inp)
        if fault is not None:
            return self._stop(FilterState.FAULT, fault, inp if inp is not None else _NO_INPUT)
        q, qd, u_nom_raw, mdl, force, s_v, s_a = parsed
        self._qd_now = qd
        if s_v == 0.0 or s_a == 0.0:
            return self._stop(FilterState.STOPPING, f"trust scale {s_v:g} (speed) / {s_a:g} (acceleration): stop", inp)
        # an absurd nominal is scaled (direction kept) into the hardware velocity limits
        over = np.max(np.abs(u_nom_raw) / self.hw_velocity_radps)
        u_nom = u_nom_raw / over if over > 1.0 else u_nom_raw
        conflict = self._assemble(q, qd, u_nom, mdl, force, s_v, s_a, u_lin=u_nom_raw)
        if conflict:
            return self._stop(FilterState.STOPPING, f"infeasible: {conflict}", inp)

        # the QP's unique optimum is u_nom whenever u_nom meets every constraint with zero slack
        if self._feasible(u_nom):
            out_u = u_nom.copy()
            self._last_u = out_u
            return FilterOutput(
                u_safe_radps=out_u, state=FilterState.OK if over <= 1.0 else FilterState.FILTERING,
                reason="" if over <= 1.0 else f"nominal command scaled by {1 / over:.3g} into the hardware limits",
                active_constraints=(), intervention_norm=float(np.linalg.norm(out_u - u_nom_raw)),
                solver_status=SOLVER_NOT_RUN, solver_status_text="not run (nominal feasible)", slack=_NO_SLACK.copy(),
            )
        return self._solve(u_nom, u_nom_raw)

    # ------------------------------------------------------------- internals
    def _parse(self, inp: Any):
        """Validate one input; return (fault reason or None, parsed values)."""
        n = self.n
        if not isinstance(inp, FilterInput):
            return f"input is {type(inp).__name__}, expected FilterInput", None
        dt = self.dt_s
        elapsed = dt if inp.elapsed_s is None else _as_scalar(inp.elapsed_s)
        self._dt_brake = self._clip_brake(elapsed)
        self._dt_up = dt if elapsed is None else min(max(elapsed, 0.0), dt)
        if elapsed is None or elapsed < 0:
            return f"elapsed_s = {inp.elapsed_s!r}: expected a finite time >= 0 s or None", None
        arrays = []
        for name in ("q_rad", "qdot_radps", "u_nominal_radps"):
            vec = _as_vector(getattr(inp, name), n)
            if vec is None:
                return f"{name} = {_show(getattr(inp, name))}: expected {n} finite values", None
            arrays.append(vec)
        q, qd, u_nom = arrays
        age = _as_scalar(inp.input_age_periods)
        if age is None or age < 0:
            return f"input_age_periods = {inp.input_age_periods!r}: expected a finite age >= 0 periods", None
        if age > self.limits.stale_limit_periods:
            return f"{STALE_PREFIX} {age:g} periods old > stale_limit_periods {self.limits.stale_limit_periods}", None
        self._ages.append(age)
        self._coast_s = self.limits.reaction_time_s + max(self._ages) * dt
        s_v = _as_scalar(inp.trust_scale)
        if s_v is None or not 0.0 <= s_v <= 1.0:
            return f"trust_scale = {inp.trust_scale!r}: expected a number in [0, 1]", None
        s_a = s_v if inp.accel_scale is None else _as_scalar(inp.accel_scale)
        if s_a is None or not 0.0 <= s_a <= 1.0:
            return f"accel_scale = {inp.accel_scale!r}: expected a number in [0, 1] or None", None
        force = None
        if inp.force_n is not None:
            force = _as_vector(inp.force_n, 3)
            if force is None:
                return f"force_n = {_show(inp.force_n)}: expected 3 finite values (N, base frame) or None", None
        mdl = inp.model
        if mdl is None:
            if self.require_model:
                return "world model missing (require_model=True)", None
        else:
            reason, mdl = self._check_model(mdl, q)
            if reason:
                return reason, None
        return None, (q, qd, u_nom, mdl, force, s_v, s_a)

    def _check_model(self, mdl: Any, q: np.ndarray):
        n, dt = self.n, self.dt_s
        if not isinstance(mdl, LinearizedModel):
            return f"model is {type(mdl).__name__}, expected LinearizedModel", None
        try:
            f0, B, sig = (np.asarray(x, dtype=float) if x is not None else None for x in (mdl.f0, mdl.B, mdl.sigma))
        except (TypeError, ValueError):
            return "model f0/B/sigma are not numeric arrays", None
        shapes_ok = (f0 is not None and f0.shape == (2 * n,) and B is not None and B.shape == (2 * n, n)
                     and sig is not None and sig.shape == (2 * n,))
        if not shapes_ok:
            shapes = [None if x is None else np.shape(x) for x in (mdl.f0, mdl.B, mdl.sigma)]
            return f"model shapes f0/B/sigma = {shapes}: expected ({2 * n},), ({2 * n}, {n}), ({2 * n},)", None
        if not (np.all(np.isfinite(f0)) and np.all(np.isfinite(B)) and np.all(np.isfinite(sig))):
            return "model contains NaN or Inf", None
        if np.any(sig < 0):
            return f"model sigma has negative entries {sig[sig < 0].tolist()}", None
        # physical plausibility: the arm cannot outrun its hardware limits, and a command cannot
        # move it backwards (a model that says otherwise would make the filter push the wrong way)
        step = np.abs(f0[:n] - q)
        reach = 2.0 * self.hw_velocity_radps * dt + 1e-3
        if np.any(step > reach):
            i = int(np.argmax(step - reach))
            return (f"model inconsistent: predicts {self.joint_names[i]} moves {step[i]:.3g} rad in one period "
                    f"(at most {reach[i]:.3g} rad at the hardware speed limit)"), None
        if np.any(np.abs(f0[n:]) > 2.0 * self.hw_velocity_radps):
            return "model inconsistent: predicts joint velocities beyond twice the hardware limit", None
        bq, bqd = B[:n], B[n:]
        out_of_range = np.any(np.abs(bq) > 2.0 * dt) or np.any(np.abs(bqd) > 2.0)
        if out_of_range or np.any(np.diag(bq) < 0) or np.any(np.diag(bqd) < 0):
            # A learned model's local slope can be implausible in a corner of the state space it has
            # seen little of, while its prediction is fine. That is no reason to stop the arm: this
            # period is filtered with the conservative kinematic model instead, and the output says so.
            self._model_note = ("world-model slope B implausible here (expected |dq+/du| <= 2 dt, |dqdot+/du| <= 2, "
                                "non-negative diagonals): kinematic model used this period")
            return None, None
        return None, LinearizedModel(f0, B, sig)

    def _kinematics(self, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Positions (K, 3) and linear Jacobians (K, 3, n) of the monitored points (tool first)."""
        model, data = self._model, self._data
        self._qpin[self._perm] = q
        pin.computeJointJacobians(model, data, self._qpin)
        pin.updateFramePlacements(model, data)
        pts, jac = self._pts, self._jac
        for k, fid in enumerate(self._frame_ids):
            pts[k] = data.oMf[fid].translation
            jac[k] = pin.getFrameJacobian(model, data, fid, pin.LOCAL_WORLD_ALIGNED)[:3, self._perm_v]
        return pts, jac

    def _barriers(self, pts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Workspace barrier values h (W,) and unit gradients g (W, 3), row = point * O + obstacle.

        Table: h = z − z_table − clearance. Box: signed distance to the box minus the clearance
        (outside: distance to the closest point, gradient away from it; inside: minus the depth
        below the nearest face, gradient its outward normal). Sphere: distance to the centre minus
        radius and clearance, gradient radial.
        """
        h, g = self._h, self._g  # (K, O), (K, O, 3); g[:, 0] is the table's +z, set once
        h[:, 0] = pts[:, 2] - self._table_z
        nb = self._box_lo.shape[1]
        if nb:
            p = pts[:, None, :]
            diff = p - np.minimum(np.maximum(p, self._box_lo), self._box_hi)
            dist = np.sqrt(np.einsum("kbi,kbi->kb", diff, diff))
            inside = dist <= 1e-12
            if inside.any():  # signed distance to the nearest face, gradient its outward normal
                depth = np.concatenate([p - self._box_lo, self._box_hi - p], axis=2)  # (K, B, 6)
                face = np.argmin(depth, axis=2)
                diff = np.where(inside[..., None], _FACE_NORMALS[face], diff)
                dist = np.where(inside, -np.min(depth, axis=2), dist)
                g[:, 1:1 + nb] = diff / np.where(inside, 1.0, dist)[..., None]
            else:
                g[:, 1:1 + nb] = diff / dist[..., None]
            h[:, 1:1 + nb] = dist
        if len(self._sph_r):
            diff = pts[:, None, :] - self._sph_c
            dist = np.sqrt(np.einsum("ksi,ksi->ks", diff, diff))
            far = dist > 1e-9
            g[:, 1 + nb:] = np.where(far[..., None], diff / np.where(far, dist, 1.0)[..., None], _EZ)
            h[:, 1 + nb:] = dist - self._sph_r
        return (h - self._ws_offset).reshape(-1), g.reshape(-1, 3)

    def _assemble(self, q, qd, u_nom, mdl, force, s_v, s_a, u_lin=None) -> str | None:
        """Fill the values of A and the bounds l, u for this period.

        ``u_nom`` is the nominal of the cost (scaled into the hardware limits); ``u_lin`` the
        command the model was linearized at (the nominal as given; x⁺ ≈ f0 + B (u − u_lin)).

        Returns a description of the conflict when the hard rows are already known to be
        infeasible (kinematic model: every hard row bounds one joint), else None.
        """
        n, dt, lim, A, l, u = self.n, self.dt_s, self.limits, self._A, self._l, self._u
        alpha, kappa = lim.cbf_alpha, lim.robustness_kappa
        b0, p0, k0, s0, w0, f0_ = self._r_box, self._r_pos, self._r_brake, self._r_speed, self._r_ws, self._r_force
        kin = mdl is None
        if kin:
            f0q, f0qd, bq, bqd = q + u_nom * dt, u_nom, None, None
            margin_q = self._kin_err_rad  # the kinematic model's error bound on q⁺
            sig_qd = None
        else:
            f0q, f0qd, bq, bqd = mdl.f0[:n], mdl.f0[n:], mdl.B[:n], mdl.B[n:]
            # the model's prediction at u = 0, so the rows below read f0 + B (u − u_lin) = off + B u
            u_lin = u_nom if u_lin is None else u_lin
            margin_q = kappa * mdl.sigma[:n]  # κ σ on q⁺
            sig_qd = mdl.sigma[n:]

        # box rows: speed limit ∩ acceleration box around the measured velocity and the previous command
        refs = (qd,) if self._last_u is None else (qd, self._last_u)
        box_lo, box_hi, self._vel_lo, self._vel_hi = self._accel_box(refs, s_v, s_a)

        # joint positions, h_up = q_max − q, h_lo = q − q_min:
        #   position: h(q⁺) >= (1 − α) h(q) + margin  (h < 0: h(q⁺) >= h(q) + margin, no further violation)
        #   braking:  qdot⁺ and u <= v_b(h − margin), the speed from which a_brake stops within the
        #             distance left after coasting one period plus the reaction time (latency, lag, input age)
        h_up, h_lo = self._hi - q, q - self._lo
        pos_hi = (alpha * np.maximum(h_up, 0.0) - margin_q) / dt
        pos_lo = (-alpha * np.maximum(h_lo, 0.0) + margin_q) / dt
        # the command's bound counts the reaction time (latency, drive lag, input age); the world
        # model's predicted velocity already contains the lag, so its row coasts one period only
        brk_hi = self._brake_speed(h_up - margin_q, self._abrake, self._coast_s)
        brk_lo = -self._brake_speed(h_lo - margin_q, self._abrake, self._coast_s)

        if kin:
            # every hard row bounds one joint: merge them into the box rows (redundant active rows
            # slow ADMM down) and find conflicts without solving
            if not self._A_kinematic:
                A[p0:p0 + n, :n] = np.eye(n)
                A[k0:k0 + n, :n] = np.eye(n)
                self._A_kinematic = True
            lo, hi, conflict = self._merge(box_lo, box_hi, pos_lo, pos_hi, brk_lo, brk_hi)
            if conflict is not None:
                i = int(np.argmax(conflict))
                return (f"joint_limit:{self._joint_short[i]} cannot be kept within the velocity/acceleration "
                        f"limits (allowed command [{lo[i]:.4g}, {hi[i]:.4g}] rad/s is empty)")
            l[b0:b0 + n], u[b0:b0 + n] = lo, hi
            l[p0:k0 + n], u[p0:k0 + n] = -np.inf, np.inf
        else:
            self._A_kinematic = False
            c = (q - f0q + bq @ u_lin) / dt
            A[p0:p0 + n, :n] = bq / dt
            l[p0:p0 + n], u[p0:p0 + n] = c + pos_lo, c + pos_hi
            # At a limit (inside the robust margin) or past it, "h(q⁺) >= h(q) + κσ" asks the model's
            # mean to retreat by κσ in one period: with the acceleration box that is often infeasible
            # even at rest, and the arm would stay stopped for good; so would the predicted-velocity
            # braking row whenever the model predicts a little drift at zero command. There both
            # coupled rows of that joint are freed and "command no further into the limit"
            # (u_i <= 0 at the upper, >= 0 at the lower limit) holds exactly through the command
            # braking bound merged into the box rows below (v_b = 0 inside the margin). Keeping the
            # coupled rows as well made the QP infeasible or ADMM hit its iteration limit there.
            cb = bqd @ u_lin - f0qd
            A[k0:k0 + n, :n] = bqd
            l[k0:k0 + n] = cb - self._brake_speed(h_lo - margin_q, self._abrake)
            u[k0:k0 + n] = cb + self._brake_speed(h_up - margin_q, self._abrake)
            at_limit = np.flatnonzero((h_up <= margin_q) | (h_lo <= margin_q))
            l[p0 + at_limit], u[p0 + at_limit] = -np.inf, np.inf
            l[k0 + at_limit], u[k0 + at_limit] = -np.inf, np.inf
            # the braking bound holds for the command itself too (the drive converges to it):
            # merged into the box rows, exact per joint
            free = np.full(n, np.inf)
            lo, hi, conflict = self._merge(box_lo, box_hi, -free, free, brk_lo, brk_hi)
            if conflict is None:
                conflict = self._unreachable_rows(lo, hi)
            if conflict is not None:
                i = int(np.argmax(conflict))
                return (f"joint_limit:{self._joint_short[i]} cannot be kept within the velocity/acceleration "
                        f"limits (allowed command [{lo[i]:.4g}, {hi[i]:.4g}] rad/s is empty)")
            l[b0:b0 + n], u[b0:b0 + n] = lo, hi
            # unit-norm coupled rows: a lagging drive gives them coefficients ~0.1 next to the box
            # rows' 1, and unscaled ADMM then ran into its iteration limit (same feasible set)
            norm = np.maximum(np.linalg.norm(A[p0:k0 + n, :n], axis=1), 1e-9)
            A[p0:k0 + n, :n] /= norm[:, None]
            l[p0:k0 + n] /= norm
            u[p0:k0 + n] /= norm

        # points: positions and Jacobians at the current state
        pts, jac = self._kinematics(q)

        # tool speed ‖J u‖ <= v of the COMMANDED joint velocity (the set-point the drive converges
        # to; the predicted qdot⁺ of a lagging drive lies between qdot and u, so bounding u bounds
        # it too once the arm is within the limit): polytope inscribed in the ball, a vertex along
        # the nominal tool velocity
        jt = jac[0]
        v_nom = jt @ u_nom
        speed_nom = math.sqrt(float(v_nom @ v_nom))
        rot_jt = jt if speed_nom <= 1e-9 else _rotation_to(_VERTEX_DIR, v_nom / speed_nom).T @ jt
        djt = SPEED_DIRECTIONS @ rot_jt  # (M, n): d_k · J
        self._speed_ctx = (jt, lim.tool_speed_max_mps * s_v)
        ms = len(SPEED_DIRECTIONS)
        A[s0:s0 + ms, :n] = djt
        u[s0:s0 + ms] = lim.tool_speed_max_mps * s_v * SPEED_POLYTOPE_COS

        # workspace barriers (table, keep-outs) of every monitored point, on the COMMAND (as the
        # joint braking bound: a lagging drive converges to u, and the model's one-step position
        # barely moves with u, so a row on it let link points coast into their clearance):
        #   h + g·J u dt >= h − γ(h) + margins,  γ(h) = min(α h, dt v_b(h)) (h >= 0), 0 (h < 0),
        #   v_b with the reaction time and input age as the coast
        h, g = self._barriers(pts)
        gj = np.einsum("wi,wij->wj", g, jac[self._ws_point])  # (W, n) = dh/dq
        nw = len(h)
        box_w = np.maximum(np.abs(l[b0:b0 + n]), np.abs(u[b0:b0 + n]))
        dq_bound = float(box_w.sum()) * dt  # ‖q⁺ − q‖₁ over the box
        margin = np.abs(gj) @ (margin_q * np.ones(n)) + 0.5 * REACH_M * dq_bound * dq_bound
        gamma = np.where(h >= 0.0, np.minimum(alpha * h, dt * self._brake_speed(h, self._a_ws, self._coast_s)), 0.0)
        A[w0:w0 + nw, :n] = gj
        l[w0:w0 + nw] = (margin - gamma) / dt

        # contact force: from onset on, no tool motion into the contact; n = F/|F| is the force the
        # environment exerts on the tool, so "into the contact" is −n and the row is −n·J qdot⁺ <= 0
        fnorm = 0.0 if force is None else math.sqrt(float(force @ force))
        if fnorm > 0.0 and fnorm >= lim.force_onset_fraction * lim.force_limit_n:
            row = -(force / fnorm) @ jt
            if kin:
                A[f0_, :n], u[f0_] = row, 0.0
            else:
                A[f0_, :n] = row @ bqd
                u[f0_] = -kappa * (np.abs(row) @ sig_qd) - row @ (f0qd - bqd @ u_lin)
        else:
            A[f0_, :n], u[f0_] = 0.0, np.inf

        self._qp_bounds()
        self._q[:n] = -u_nom
        return None

    def _unreachable_rows(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray | None:
        """Free the sides of coupled world-model rows that no command in the box [lo, hi] can meet.

        Such a side means that, for the model, the joint's velocity and the drive's lag already
        carry it to within the robust margin of its limit in this period (a relative-degree-two
        effect a one-step row cannot express). That side of its position row is replaced by the
        exact command rule "no further into that limit" (``lo``/``hi`` are tightened in place), a
        braking-row side is left to the command braking bound. Tightening the box can make another
        row unmeetable, so this repeats until nothing changes; a box that becomes empty is a
        conflict (returned as a mask), i.e. a controlled stop. The check uses the QP's own
        tightened bounds (HARD_MARGIN on the unit-normalized row). The limit is never slacked.
        """
        n, p0 = self.n, self._r_pos
        rows = slice(p0, p0 + 2 * n)  # n position rows, then n braking rows
        a = self._A[rows, :n]
        pos, neg = np.maximum(a, 0.0), np.minimum(a, 0.0)
        m = self.HARD_MARGIN_RADPS * np.linalg.norm(a, axis=1)
        l_r, u_r = self._l[rows], self._u[rows]  # views: freeing a side writes through
        for _ in range(2 * n):
            up_bad = np.isfinite(u_r) & (pos @ lo + neg @ hi > u_r - m)
            lo_bad = np.isfinite(l_r) & (pos @ hi + neg @ lo < l_r + m)
            if not (up_bad.any() or lo_bad.any()):
                break
            u_r[up_bad], l_r[lo_bad] = np.inf, -np.inf
            for r in np.flatnonzero(up_bad[:n]):
                hi[r], self._hi_src[r] = min(hi[r], 0.0), 2
            for r in np.flatnonzero(lo_bad[:n]):
                lo[r], self._lo_src[r] = max(lo[r], 0.0), 2
        empty = lo > hi
        return empty if empty.any() else None

    def _merge(self, box_lo, box_hi, pos_lo, pos_hi, brk_lo, brk_hi):
        """Per-joint intersection of the box, position and braking bounds (kinematic model).

        Returns (lo, hi, conflict mask or None); records which family binds each side.
        """
        his = np.array([box_hi, pos_hi, brk_hi])
        los = np.array([box_lo, pos_lo, brk_lo])
        self._hi_src, self._lo_src = his.argmin(axis=0), los.argmax(axis=0)
        hi, lo = his.min(axis=0), los.max(axis=0)
        bad = lo > hi
        return lo, hi, (bad if bad.any() else None)

    def _qp_bounds(self) -> None:
        """Bounds the QP sees: coupled hard rows tightened by HARD_MARGIN (to the midpoint if
        narrower), soft rows by SOFT_MARGIN; and the per-joint hard box used for the final clip."""
        l, u, n = self._l, self._u, self.n
        b0, h1 = self._r_box, self._r_brake + n
        self._hard_lo, self._hard_hi = l[b0:b0 + n].copy(), u[b0:b0 + n].copy()
        lq, uq = self._l_qp, self._u_qp
        lq[:] = l + self._margin_qp
        uq[:] = u - self._margin_qp
        narrow = np.nonzero(lq[b0:h1] > uq[b0:h1])[0] + b0  # only rows with two finite bounds
        if narrow.size:
            lq[narrow] = uq[narrow] = 0.5 * (l[narrow] + u[narrow])

    def _accel_box(self, refs: tuple[np.ndarray, ...], s_v: float, s_a: float):
        """Per-joint command box: speed limit ∩ the hull of the acceleration boxes around ``refs``.

        ``refs`` are the measured velocity and (when there is one) the previous command. Around a
        reference r the command may brake toward zero at the full a_max and speed up at a_max * s_a
        (braking authority is never scaled down). Taking the hull of both boxes means the command
        can always continue smoothly from the previous command (measurement noise, tracking lag or
        a chattering drive cannot drag it around or trap it) and starts from the measured velocity
        after a stop or reset. The speed limit v_max * s_v is approached from above at a_max (a
        lowered limit is reached by a ramp, not a jump); a joint measured beyond even that keeps
        |u| <= v_max (the speed limit wins). Returns (lo, hi, lo_is_speed_limit, hi_is_speed_limit).
        """
        # braking uses the real elapsed time (at least a period), speeding up at most a period
        a_dt, a_dt_s = self._amax * self._dt_brake, self._amax * s_a * self._dt_up
        ref = np.array(refs)  # (1 or 2, n)
        lo = np.maximum(ref - a_dt, np.minimum(ref, 0.0) - a_dt_s).min(axis=0)
        hi = np.minimum(ref + a_dt, np.maximum(ref, 0.0) + a_dt_s).max(axis=0)
        fastest = np.abs(ref).max(axis=0)
        vcap = np.minimum(self._vmax, np.maximum(self._vmax * s_v, fastest - a_dt))
        box_lo = np.minimum(np.maximum(-vcap, lo), vcap)
        box_hi = np.maximum(np.minimum(vcap, hi), -vcap)
        return box_lo, box_hi, box_lo <= -vcap + 1e-12, box_hi >= vcap - 1e-12

    def _brake_speed(self, dist, decel, coast_s: float = 0.0):
        """Largest speed v >= 0 with v (dt + coast) + v²/(2 decel) <= dist (0 where dist <= 0).

        A joint (or point) moving at v for one period plus ``coast_s`` (reaction time, input age)
        and then braking at ``decel`` stops within ``dist``; from there the set {v : v <= this} is
        reachable again next period.
        """
        t = self.dt_s + coast_s
        return decel * (np.sqrt(t * t + 2.0 * np.maximum(dist, 0.0) / decel) - t)

    def _feasible(self, u_nom: np.ndarray) -> bool:
        """True when u_nom (with zero slack) satisfies every row at its TRUE bound."""
        val = self._A[:, :self.n] @ u_nom
        return bool((val >= self._l).all() and (val <= self._u).all())

    def _solve(self, u_nom: np.ndarray, u_nom_raw: np.ndarray) -> FilterOutput:
        solver, n = self._solver, self.n
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
        if status != _OSQP_SOLVED:
            if status in _OSQP_INFEASIBLE:
                return self._stop(FilterState.STOPPING, f"infeasible: QP {text}", None, u_nom_raw, **extra)
            return self._stop(FilterState.FAULT, f"solver: {text} after {iters} iterations", None, u_nom_raw, **extra)
        u = np.array(res.x[:n], dtype=float)
        if not np.isfinite(u).all():
            return self._stop(FilterState.FAULT, "solver returned non-finite values", None, u_nom_raw, **extra)
        # the box rows bound single joints: enforce them exactly
        u = np.minimum(np.maximum(u, self._hard_lo), self._hard_hi)
        # post-check: every hard row (box, position, braking) at its TRUE bound
        val = self._A[:, :n] @ u
        hs = slice(self._r_box, self._r_brake + n)
        viol = np.maximum(self._l[hs] - val[hs], val[hs] - self._u[hs])
        if (viol > self.POSTCHECK_TOL).any():
            i = int(np.argmax(viol))
            return self._stop(FilterState.FAULT, f"post-check failed: {self.row_names[i]} violated by {viol[i]:.3g}",
                              None, u_nom_raw, **extra)
        slack = self._slack(u, val)
        self._last_u = u
        return FilterOutput(
            u_safe_radps=u, state=FilterState.FILTERING, reason="", active_constraints=self._active(val),
            intervention_norm=float(np.linalg.norm(u - u_nom_raw)), max_slack=max(slack.values()), slack=slack,
            **extra,
        )

    def _active(self, val: np.ndarray) -> tuple[str, ...]:
        """Names of the rows within ACTIVE_TOL of (or beyond) a bound, unique, in row order."""
        tol, n, b0 = self.ACTIVE_TOL, self.n, self._r_box
        near = (val <= self._l + tol) | (val >= self._u - tol)
        near[self._r_slack:] = False
        names: list[str] = []
        for idx in np.nonzero(near)[0]:
            if idx < b0 + n:  # box row: the velocity, acceleration or (merged) joint limit that binds
                i = idx - b0
                upper = val[idx] >= self._u[idx] - tol
                src = self._hi_src[i] if upper else self._lo_src[i]
                vel = self._vel_hi[i] if upper else self._vel_lo[i]
                kind = "joint_limit:" if src else ("velocity_limit:" if vel else "acceleration_limit:")
                names.append(kind + self._joint_short[i])
            else:
                names.append(self.row_names[idx])
        return tuple(dict.fromkeys(names))

    def _slack(self, u: np.ndarray, val: np.ndarray) -> dict[str, float]:
        """How far the final command exceeds each soft family, in that family's units (0 = met).

        Tool speed: commanded tool speed |J u| above the limit, m/s, measured on the ball (not on
        the polytope); workspace: barrier deficit of the next state, m; force: speed into the
        contact, m/s.
        """
        w0, f0_ = self._r_ws, self._r_force
        jt, v_lim = self._speed_ctx
        v = jt @ u
        over = np.maximum(val - self._u, self._l - val)
        return {
            "tool_speed_mps": max(math.sqrt(float(v @ v)) - v_lim, 0.0),
            "workspace_m": max(float(over[w0:f0_].max(initial=0.0)), 0.0) * self.dt_s,
            "contact_force_mps": max(float(over[f0_]), 0.0),
        }

    def _stop(self, state: FilterState, reason: str, inp: Any, u_nom_raw: Any = None, **extra) -> FilterOutput:
        """A controlled-stop output (``inp`` given: before the QP; None: after it, same period)."""
        qd = getattr(inp, "qdot_radps", None) if inp is not None else self._qd_now
        u = self.controlled_stop(qd)
        self._last_u = u
        if u_nom_raw is None and inp is not None:
            u_nom_raw = _as_vector(getattr(inp, "u_nominal_radps", None), self.n)
        norm = float(np.linalg.norm(u - u_nom_raw)) if u_nom_raw is not None else math.nan
        extra.setdefault("solver_status_text", "not run")
        return FilterOutput(u_safe_radps=u, state=state, reason=reason, intervention_norm=norm,
                            slack=_NO_SLACK.copy(), **extra)


def _as_vector(value: Any, n: int) -> np.ndarray | None:
    """value as a finite float vector of length n, or None."""
    if value is None:
        return None
    try:
        arr = np.array(value, dtype=float)
    except (TypeError, ValueError):
        return None
    if arr.shape != (n,) or not np.all(np.isfinite(arr)):
        return None
    return arr


def _as_scalar(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _show(value: Any) -> str:
    try:
        return repr(np.asarray(value).tolist())[:120]
    except Exception:  # noqa: BLE001 (only for the message)
        return repr(value)[:120]
