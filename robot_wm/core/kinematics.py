"""Arm kinematics with pinocchio: tool pose, frame positions and Jacobians from the URDF."""
from __future__ import annotations

import numpy as np
import pinocchio as pin


class Kinematics:
    """Forward kinematics and Jacobians of one frame chain, built from URDF text.

    Args:
        urdf_xml: the expanded robot description.
        joint_names: joint order of the q vectors passed in (e.g. from config/robot.yaml).
        tool_frame: frame whose pose ``tool_position_m`` returns.
    """

    def __init__(self, urdf_xml: str, joint_names: list[str] | tuple[str, ...], tool_frame: str = "tool0") -> None:
        self.model = pin.buildModelFromXML(urdf_xml)
        self.data = self.model.createData()
        model_joints = [self.model.names[i] for i in range(1, self.model.njoints)]
        if sorted(model_joints) != sorted(joint_names):
            raise ValueError(f"joint_names {list(joint_names)} do not match the URDF's joints {model_joints}")
        # q in joint_names order -> pinocchio's q layout (all joints here are 1-DOF revolute)
        self._perm = np.array([self.model.joints[self.model.getJointId(n)].idx_q for n in joint_names])
        self._in_order = bool(np.array_equal(self._perm, np.arange(self.model.nq)))  # no permutation needed
        if not self.model.existFrame(tool_frame):
            raise ValueError(f"tool_frame {tool_frame!r} is not a frame of the URDF")
        self.tool_frame_id = self.model.getFrameId(tool_frame)
        self.joint_names = tuple(joint_names)

    def _q(self, q_rad: np.ndarray) -> np.ndarray:
        q_rad = np.asarray(q_rad, dtype=float)
        if q_rad.shape != (len(self.joint_names),):
            raise ValueError(f"q_rad has shape {q_rad.shape}, expected ({len(self.joint_names)},)")
        if self._in_order:
            return np.ascontiguousarray(q_rad)  # pinocchio reads it, never writes it
        q = np.empty(self.model.nq)
        q[self._perm] = q_rad
        return q

    @property
    def velocity_limits_radps(self) -> np.ndarray:
        """The URDF's joint velocity limits (the hardware's), in joint order."""
        v = [self.model.joints[self.model.getJointId(n)].idx_v for n in self.joint_names]
        return np.asarray(self.model.velocityLimit[v], dtype=float)

    def frame_pose(self, q_rad: np.ndarray, frame: str | None = None) -> pin.SE3:
        """Return T_base_frame for the given joint positions (default frame: the tool)."""
        frame_id = self.tool_frame_id if frame is None else self.model.getFrameId(frame)
        pin.framesForwardKinematics(self.model, self.data, self._q(q_rad))
        return self.data.oMf[frame_id].copy()

    def tool_position_m(self, q_rad: np.ndarray) -> np.ndarray:
        """Return the tool position in the base frame (m)."""
        return self.frame_pose(q_rad).translation.copy()

    def tool_jacobian(self, q_rad: np.ndarray) -> np.ndarray:
        """Return the 6xN tool Jacobian in the base-aligned frame at the tool (LOCAL_WORLD_ALIGNED), columns in joint order."""
        q = self._q(q_rad)
        jac = pin.computeFrameJacobian(self.model, self.data, q, self.tool_frame_id, pin.LOCAL_WORLD_ALIGNED)
        return jac[:, self._perm]

    def tool_linear_velocity_mps(self, q_rad: np.ndarray, v_radps: np.ndarray) -> np.ndarray:
        """Return the tool's linear velocity in the base frame (m/s)."""
        return self.tool_jacobian(q_rad)[:3] @ np.asarray(v_radps, dtype=float)

    def frame_linear_acceleration(self, q_rad: np.ndarray, v_radps: np.ndarray, a_radps2: np.ndarray,
                                  frame: str | None = None) -> np.ndarray:
        """Return a frame's classical linear acceleration ``J a + J̇ v`` in the base frame (m/s²;
        default frame: the tool) for joint positions, velocities and accelerations in joint order."""
        frame_id = self.tool_frame_id if frame is None else self.model.getFrameId(frame)
        v, a = np.empty(self.model.nv), np.empty(self.model.nv)
        v[self._perm], a[self._perm] = v_radps, a_radps2
        pin.forwardKinematics(self.model, self.data, self._q(q_rad), v, a)
        pin.updateFramePlacement(self.model, self.data, frame_id)
        return pin.getFrameClassicalAcceleration(self.model, self.data, frame_id, pin.LOCAL_WORLD_ALIGNED).linear.copy()

    def inverse_dynamics_nm(self, q_rad: np.ndarray, v_radps: np.ndarray, a_radps2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Return (gravity torques g(q), coupled inertial torques M(q) a + C(q, v) v) of the URDF's arm
        (N·m, joint order): pinocchio's recursive Newton-Euler, the whole rigid-body model."""
        q = self._q(q_rad)
        if self._in_order:  # the trust monitor's per-period path: no copies into pinocchio's layout
            v, a = np.ascontiguousarray(v_radps, dtype=float), np.ascontiguousarray(a_radps2, dtype=float)
            g = pin.computeGeneralizedGravity(self.model, self.data, q).copy()
            return g, pin.rnea(self.model, self.data, q, v, a) - g
        v, a = np.empty(self.model.nv), np.empty(self.model.nv)
        v[self._perm], a[self._perm] = v_radps, a_radps2
        g = pin.computeGeneralizedGravity(self.model, self.data, q)[self._perm]
        total = pin.rnea(self.model, self.data, q, v, a)[self._perm]
        return g.copy(), total - g

    def point_mass_torques_nm(self, q_rad: np.ndarray, v_radps: np.ndarray, a_radps2: np.ndarray, mass_kg: float,
                              com_m=(0.0, 0.0, 0.0), frame: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Return (gravity, inertial) joint torques (N·m, joint order) of a point mass rigidly at
        ``com_m`` in a frame (default: the tool): what ``inverse_dynamics_nm`` would add for it. With
        J the point's linear Jacobian and p̈ = J a + J̇ v its classical acceleration (base frame):
        gravity −m Jᵀ g⃗, inertial m Jᵀ p̈."""
        frame_id = self.tool_frame_id if frame is None else self.model.getFrameId(frame)
        q = self._q(q_rad)
        v, a = np.empty(self.model.nv), np.empty(self.model.nv)
        v[self._perm], a[self._perm] = v_radps, a_radps2
        pin.forwardKinematics(self.model, self.data, q, v, a)
        pose = pin.updateFramePlacement(self.model, self.data, frame_id)
        acc = pin.getFrameClassicalAcceleration(self.model, self.data, frame_id, pin.LOCAL_WORLD_ALIGNED)
        vel = pin.getFrameVelocity(self.model, self.data, frame_id, pin.LOCAL_WORLD_ALIGNED)
        jac = pin.computeFrameJacobian(self.model, self.data, q, frame_id, pin.LOCAL_WORLD_ALIGNED)
        r = pose.rotation @ np.asarray(com_m, dtype=float)  # frame origin -> the point, base axes
        w = vel.angular
        # the point: ṗ = v_o + ω × r, p̈ = a_o + α × r + ω × (ω × r) (α: the frame's angular acceleration)
        p_acc = acc.linear + np.cross(acc.angular, r) + np.cross(w, np.cross(w, r))
        p_jac = jac[:3] - np.cross(r, jac[3:].T).T  # J_v − [r]× J_ω
        m = float(mass_kg)
        gravity = -m * (p_jac.T @ self.model.gravity.linear)
        inertial = m * (p_jac.T @ p_acc)
        return gravity[self._perm], inertial[self._perm]

    def gravity_torque_nm(self, q_rad: np.ndarray) -> np.ndarray:
        """Return the joint torques that hold the URDF's arm against gravity at ``q_rad`` (N·m, joint order)."""
        return pin.computeGeneralizedGravity(self.model, self.data, self._q(q_rad))[self._perm].copy()
