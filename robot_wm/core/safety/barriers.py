"""Barrier functions of the safety filter: braking distances, the acceleration box, the workspace.

* :func:`brake_speed`: the largest speed from which coasting, then braking, stops within a distance;
* :func:`accel_box`: the per-joint command interval allowed by the speed and acceleration limits
  around the previous command;
* :class:`Workspace`: positions and Jacobians of the monitored points (pinocchio) and their
  barrier values against the table plane and the keep-out boxes and spheres.
"""
from __future__ import annotations

import numpy as np
import pinocchio as pin

from robot_wm.core.safety.limits import SafetyLimits
from robot_wm.core.safety.types import BoundSource

_EZ = np.array([0.0, 0.0, 1.0])
_FACE_NORMALS = np.vstack([-np.eye(3), np.eye(3)])  # outward normals of the faces min x, y, z, max x, y, z
# plain ints: np.where with IntEnum scalars costs 3x more (the hot path calls it every period)
_SPEED, _ACCELERATION = int(BoundSource.SPEED), int(BoundSource.ACCELERATION)


def brake_speed(dist, decel, dt_s: float, coast_s: float = 0.0):
    """Largest speed v >= 0 with v (dt + coast) + v²/(2 decel) <= dist (0 where dist <= 0).

    A joint (or point) moving at v for one period plus ``coast_s`` (reaction time, input age) and
    then braking at ``decel`` stops within ``dist``; from there the set {v : v <= this} is
    reachable again next period.
    """
    t = dt_s + coast_s
    return decel * (np.sqrt(t * t + 2.0 * np.maximum(dist, 0.0) / decel) - t)


def accel_box(u_prev: np.ndarray, vmax: np.ndarray, amax: np.ndarray, s_v: float, s_a: float,
              dt_brake_s: float, dt_up_s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per-joint command interval: speed limit ∩ the acceleration box around the previous command.

    Around ``u_prev`` (the command sent last period: exactly known, unlike a measured velocity
    that can be noisy, stale or a glitch) the command may brake toward zero at the full a_max over
    ``dt_brake_s`` and speed up at a_max * s_a over ``dt_up_s`` (braking authority is never
    scaled down). The speed limit v_max * s_v is approached from above at a_max (a lowered limit
    is reached by a ramp, not a jump); |u| <= v_max always.

    Returns:
        (lo, hi, lo_source, hi_source): the interval and which limit binds each side
        (BoundSource.SPEED or ACCELERATION).
    """
    a_dt, a_dt_s = amax * dt_brake_s, amax * s_a * dt_up_s
    lo = np.maximum(u_prev - a_dt, np.minimum(u_prev, 0.0) - a_dt_s)
    hi = np.minimum(u_prev + a_dt, np.maximum(u_prev, 0.0) + a_dt_s)
    vcap = np.minimum(vmax, np.maximum(vmax * s_v, np.abs(u_prev) - a_dt))
    box_lo = np.minimum(np.maximum(-vcap, lo), vcap)
    box_hi = np.maximum(np.minimum(vcap, hi), -vcap)
    lo_src = np.where(box_lo <= -vcap + 1e-12, _SPEED, _ACCELERATION)
    hi_src = np.where(box_hi >= vcap - 1e-12, _SPEED, _ACCELERATION)
    return box_lo, box_hi, lo_src, hi_src


class Workspace:
    """The monitored points (the tool first) and their barriers against the table and keep-outs.

    Args:
        kinematics: ``robot_wm.core.kinematics.Kinematics`` of the arm.
        limits: the safety limits (table height, keep-outs, clearances, monitored frames).
    Raises:
        ValueError: a monitored frame is not in the URDF.
    """

    def __init__(self, kinematics, limits: SafetyLimits) -> None:
        model = kinematics.model
        self._model, self._data = model, kinematics.data
        names = tuple(kinematics.joint_names)
        self._perm = np.array([model.joints[model.getJointId(j)].idx_q for j in names])
        self._perm_v = np.array([model.joints[model.getJointId(j)].idx_v for j in names])
        # the URDF's joint order is usually the robot's: then a slice, not a gather, per point
        self._cols = slice(None) if np.array_equal(self._perm_v, np.arange(model.nv)) else self._perm_v
        self._qpin = pin.neutral(model)
        tool_frame = model.frames[kinematics.tool_frame_id].name
        #: Frames of the monitored points, the tool first.
        self.frames = (tool_frame,) + tuple(f for f in limits.monitored_frames if f != tool_frame)
        missing = [f for f in self.frames if not model.existFrame(f)]
        if missing:
            raise ValueError(f"safety.monitored_frames {missing} are not frames of the URDF")
        self._frame_ids = [model.getFrameId(f) for f in self.frames]
        boxes, spheres = limits.boxes, limits.spheres
        self._table_z = limits.table_z_m
        self._box_lo = np.array([b[0] for b in boxes]).reshape(1, -1, 3)
        self._box_hi = np.array([b[1] for b in boxes]).reshape(1, -1, 3)
        self._sph_c = np.array([c for c, _ in spheres]).reshape(1, -1, 3)
        self._sph_r = np.array([r for _, r in spheres])
        k, n = len(self._frame_ids), len(names)
        #: Obstacle names in barrier order (per point): the table, the boxes, the spheres.
        self.obstacles = ("table",) + tuple(f"keepout_box{i}" for i in range(len(boxes))) + tuple(
            f"keepout_sphere{i}" for i in range(len(spheres)))
        n_obs = len(self.obstacles)
        clearance = np.array([limits.tool_clearance_m] + [limits.link_clearance_m] * (k - 1))
        self._offset = np.repeat(clearance[:, None], n_obs, axis=1)
        #: Point index of every barrier row (point * n_obstacles + obstacle).
        self.point_of_row = np.repeat(np.arange(k), n_obs)
        self._pts, self._jac = np.empty((k, 3)), np.empty((k, 3, n))
        self._h, self._g = np.zeros((k, n_obs)), np.zeros((k, n_obs, 3))
        self._g[:, 0] = _EZ  # the table's gradient

    @property
    def n_rows(self) -> int:
        """Number of barrier rows (points x obstacles)."""
        return self._h.size

    def row_names(self) -> list[str]:
        """Name of every barrier row, e.g. ``table:tool0``."""
        return [f"{o}:{f}" for f in self.frames for o in self.obstacles]

    def points(self, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Positions (K, 3) and linear Jacobians (K, 3, n) of the monitored points (tool first)."""
        model, data = self._model, self._data
        self._qpin[self._perm] = q
        pin.computeJointJacobians(model, data, self._qpin)
        pin.updateFramePlacements(model, data)
        pts, jac = self._pts, self._jac
        for k, fid in enumerate(self._frame_ids):
            pts[k] = data.oMf[fid].translation
            jac[k] = pin.getFrameJacobian(model, data, fid, pin.LOCAL_WORLD_ALIGNED)[:3, self._cols]
        return pts, jac

    def barriers(self, pts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Barrier values h (W,) and unit gradients g (W, 3), row = point * O + obstacle.

        Table: h = z − z_table − clearance. Box: signed distance to the box minus the clearance
        (outside: distance to the closest point, gradient away from it; inside: minus the depth
        below the nearest face, gradient its outward normal). Sphere: distance to the centre minus
        radius and clearance, gradient radial.
        """
        h, g = self._h, self._g
        h[:, 0] = pts[:, 2] - self._table_z
        nb = self._box_lo.shape[1]
        if nb:
            p = pts[:, None, :]
            diff = p - np.minimum(np.maximum(p, self._box_lo), self._box_hi)
            dist = np.sqrt(np.einsum("kbi,kbi->kb", diff, diff))
            inside = dist <= 1e-12
            if inside.any():
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
        return (h - self._offset).reshape(-1), g.reshape(-1, 3)
