"""Differentiable tool-position kinematics in torch, built from the same URDF via pinocchio.

The imagination trainer needs the reward (tool-to-goal distance) as a differentiable function of
predicted joint positions, and the scripted prior (robot_wm.learning.scripted_prior) the tool
Jacobian; pinocchio is the reference both are tested against.
"""
from __future__ import annotations

import numpy as np
import pinocchio as pin
import torch


class TorchToolFK(torch.nn.Module):
    """Batched forward kinematics q (B x N, joint order) -> tool position (B x 3, base frame, m)."""

    def __init__(self, urdf_xml: str, joint_names: tuple[str, ...] | list[str], tool_frame: str = "tool0") -> None:
        super().__init__()
        model = pin.buildModelFromXML(urdf_xml)
        chain_rot, chain_trans, axes, index = [], [], [], []
        frame = model.frames[model.getFrameId(tool_frame)]
        joint_id = frame.parentJoint
        path = []
        while joint_id > 0:
            path.append(joint_id)
            joint_id = model.parents[joint_id]
        path.reverse()
        names = list(joint_names)
        for jid in path:
            placement = model.jointPlacements[jid]
            chain_rot.append(placement.rotation.copy())
            chain_trans.append(placement.translation.copy())
            shortname = model.joints[jid].shortname()
            if shortname not in ("JointModelRZ", "JointModelRevoluteUnaligned"):
                raise ValueError(f"joint {model.names[jid]}: only revolute z joints are supported, got {shortname}")
            axes.append(np.array([0.0, 0.0, 1.0]) if shortname == "JointModelRZ" else model.joints[jid].extract().axis.copy())
            index.append(names.index(model.names[jid]))
        self.register_buffer("rot", torch.tensor(np.array(chain_rot), dtype=torch.float32))
        self.register_buffer("trans", torch.tensor(np.array(chain_trans), dtype=torch.float32))
        self.register_buffer("tool_trans", torch.tensor(frame.placement.translation.copy(), dtype=torch.float32))
        self.index = index
        if any(not np.allclose(a, [0, 0, 1]) for a in axes):
            raise ValueError("TorchToolFK supports joints rotating about their local z axis (as in the URDF)")

    def forward(self, q_rad: torch.Tensor) -> torch.Tensor:
        """Return the tool position for each row of ``q_rad``."""
        return self.position_and_jacobian(q_rad, jacobian=False)[0]

    def position_and_jacobian(self, q_rad: torch.Tensor, jacobian: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Return the tool position (…, 3) and, with ``jacobian``, its linear Jacobian (…, 3, N),
        columns in joint order (base-aligned, as pinocchio's LOCAL_WORLD_ALIGNED rows 0-2).

        Column of revolute joint k: z_k x (p_tool - o_k), from the joint's axis and origin along
        the chain (plain tensor ops, so the graph exports to ONNX)."""
        batch = q_rad.shape[:-1]
        R = torch.eye(3, dtype=q_rad.dtype, device=q_rad.device).expand(*batch, 3, 3)
        p = torch.zeros(*batch, 3, dtype=q_rad.dtype, device=q_rad.device)
        origins, axes = [], []
        for k, j in enumerate(self.index):
            p = p + (R @ self.trans[k].to(q_rad.dtype).unsqueeze(-1)).squeeze(-1)
            R = R @ self.rot[k].to(q_rad.dtype)
            origins.append(p)
            axes.append(R[..., :, 2])  # the joint's z axis (unchanged by its own rotation)
            c, s = torch.cos(q_rad[..., j]), torch.sin(q_rad[..., j])
            z, o = torch.zeros_like(c), torch.ones_like(c)
            Rz = torch.stack([c, -s, z, s, c, z, z, z, o], dim=-1).reshape(*batch, 3, 3)
            R = R @ Rz
        tool = p + (R @ self.tool_trans.to(q_rad.dtype).unsqueeze(-1)).squeeze(-1)
        if not jacobian:
            return tool, None
        columns = [torch.zeros_like(tool)] * q_rad.shape[-1]
        for k, j in enumerate(self.index):
            columns[j] = cross3(axes[k], tool - origins[k])
        return tool, torch.stack(columns, dim=-1)


def cross3(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a x b over the last axis (written out: ONNX has no cross product)."""
    ax, ay, az = a[..., 0], a[..., 1], a[..., 2]
    bx, by, bz = b[..., 0], b[..., 1], b[..., 2]
    return torch.stack([ay * bz - az * by, az * bx - ax * bz, ax * by - ay * bx], dim=-1)
