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


class ExportToolFK(torch.nn.Module):
    """``TorchToolFK.position_and_jacobian`` in a few dozen ONNX nodes: the form exported graphs use.

    Training keeps ``TorchToolFK`` (the shipped policies were trained with its rounding); this is
    the same function to float32 rounding (a test holds the two, and pinocchio, equal). Batched
    over the joints instead of one joint at a time:

    * a link's transform (its placement times the joint's rotation about z, homogeneous 4x4) is
      linear in (cos q, sin q), so all links are ``cos q * A + sin q * B + C`` with constant
      (J, 4, 4) tensors A, B, C folded from the placements;
    * the chain is J - 1 matmuls of (…, 1, 4, 4); joint k's origin and z axis are columns 3 and 2
      of the k-th cumulative transform (the joint's own rotation is about that axis and leaves its
      origin in place);
    * the Jacobian's columns z_k x (p_tool - o_k) are one cross product over all joints.
    """

    def __init__(self, fk: TorchToolFK, n_joints: int) -> None:
        super().__init__()
        rot, trans = fk.rot.double(), fk.trans.double()
        n_links = rot.shape[0]
        rz_cos = torch.tensor([[1.0, 0, 0], [0, 1, 0], [0, 0, 0]], dtype=torch.float64)
        rz_sin = torch.tensor([[0.0, -1, 0], [1, 0, 0], [0, 0, 0]], dtype=torch.float64)
        rz_one = torch.tensor([[0.0, 0, 0], [0, 0, 0], [0, 0, 1]], dtype=torch.float64)
        link_cos, link_sin, link_one = (torch.zeros(n_links, 4, 4, dtype=torch.float64) for _ in range(3))
        link_cos[:, :3, :3], link_sin[:, :3, :3], link_one[:, :3, :3] = rot @ rz_cos, rot @ rz_sin, rot @ rz_one
        link_one[:, :3, 3], link_one[:, 3, 3] = trans, 1.0
        for name, value in (("link_cos", link_cos), ("link_sin", link_sin), ("link_one", link_one)):
            self.register_buffer(name, value.float())
        self.register_buffer("tool_point", torch.cat([fk.tool_trans, torch.ones(1)]))  # homogeneous, last link's frame
        self.register_buffer("roll_1", torch.tensor([1, 2, 0]))
        self.register_buffer("roll_2", torch.tensor([2, 0, 1]))
        #: the chain's joints in joint order (None: they are all of them, in joint order)
        self.register_buffer("chain_index", None if fk.index == list(range(n_joints)) else torch.tensor(fk.index))
        # chain position -> joint column of the Jacobian (None: the identity); joints off the chain get zeros
        select = torch.zeros(n_links, n_joints)
        select[range(n_links), fk.index] = 1.0
        self.register_buffer("to_joints", None if self.chain_index is None else select)

    def forward(self, q_rad: torch.Tensor) -> torch.Tensor:
        """Return the tool position for each row of ``q_rad``."""
        return self.position_and_jacobian(q_rad)[0]

    def position_and_jacobian(self, q_rad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Return the tool position (…, 3) and its linear Jacobian (…, 3, N), as ``TorchToolFK``'s."""
        q = (q_rad if self.chain_index is None else q_rad[..., self.chain_index])[..., None, None]  # (…, J, 1, 1)
        links = torch.cos(q) * self.link_cos + torch.sin(q) * self.link_sin + self.link_one  # (…, J, 4, 4)
        frames = list(links.split(1, dim=-3))
        for k in range(1, len(frames)):
            frames[k] = frames[k - 1] @ frames[k]
        frames = torch.cat(frames, dim=-3)[..., :3, :]  # (…, J, 3, 4): joint k's frame in the base
        tool = frames[..., -1, :, :] @ self.tool_point.to(frames.dtype)  # (…, 3)
        z, d = frames[..., 2], tool.unsqueeze(-2) - frames[..., 3]  # (…, J, 3): z_k, p_tool - o_k
        # z x d with the components rolled by one and by two: cross3's products and differences in
        # 7 nodes instead of its 20 (training keeps cross3: this form's gradients round differently)
        columns = z[..., self.roll_1] * d[..., self.roll_2] - z[..., self.roll_2] * d[..., self.roll_1]
        jac = columns.transpose(-1, -2)
        return tool, (jac if self.to_joints is None else jac @ self.to_joints.to(jac.dtype))
