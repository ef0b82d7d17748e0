"""The arm's transform tree, what robot_state_publisher computes: one transform per URDF joint.

For every joint of the description, the pose of its child link in its parent link's frame: fixed
joints once (``/tf_static``), movable ones for given joint positions (``/tf``). The kinematics are
pinocchio's (the same model as robot_wm.core.kinematics); the tree's edges are the URDF's joints, so
the frame names are the URDF's link names, as RViz and Foxglove expect.
"""
from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pinocchio as pin


@dataclass(frozen=True)
class Transform:
    """The pose of ``child`` in ``parent``'s frame: translation (m) and quaternion (x, y, z, w)."""

    parent: str
    child: str
    translation: tuple[float, float, float]
    rotation_xyzw: tuple[float, float, float, float]


@dataclass(frozen=True)
class _Edge:
    joint: str
    kind: str
    parent_frame: int
    child_frame: int
    parent: str
    child: str


class TransformTree:
    """Transforms of the URDF's joints for joint positions given by name.

    Args:
        urdf_xml: the expanded robot description.
    Raises:
        ValueError: the description is not a URDF pinocchio can build, or names a link it lacks.
    """

    def __init__(self, urdf_xml: str) -> None:
        try:
            root = ET.fromstring(urdf_xml)
            self.model = pin.buildModelFromXML(urdf_xml)
        except (ET.ParseError, RuntimeError, ValueError) as exc:
            raise ValueError(f"robot description is not a usable URDF: {exc}") from exc
        self.data = self.model.createData()
        edges = []
        for joint in root.findall("joint"):
            parent, child = joint.find("parent"), joint.find("child")
            if parent is None or child is None:
                raise ValueError(f"URDF joint {joint.get('name')!r} lacks its parent or child link")
            names = parent.get("link"), child.get("link")
            for name in names:
                if not self.model.existFrame(name, pin.BODY):
                    raise ValueError(f"URDF joint {joint.get('name')!r} names link {name!r}, which the model lacks")
            edges.append(_Edge(joint.get("name"), joint.get("type", ""), self.model.getFrameId(names[0], pin.BODY),
                               self.model.getFrameId(names[1], pin.BODY), *names))
        self._fixed = [e for e in edges if e.kind == "fixed"]
        self._moving = [e for e in edges if e.kind != "fixed"]
        self._q = pin.neutral(self.model)
        self._index = {self.model.names[i]: self.model.joints[i].idx_q for i in range(1, self.model.njoints)
                       if self.model.joints[i].nq == 1}
        self.joint_names = tuple(e.joint for e in self._moving)

    def _transforms(self, edges: list[_Edge]) -> list[Transform]:
        pin.framesForwardKinematics(self.model, self.data, self._q)
        out = []
        for e in edges:
            pose = self.data.oMf[e.parent_frame].actInv(self.data.oMf[e.child_frame])
            quat = pin.Quaternion(pose.rotation).coeffs()  # x, y, z, w
            out.append(Transform(e.parent, e.child, tuple(float(v) for v in pose.translation),
                                 tuple(float(v) for v in quat)))
        return out

    def static_transforms(self) -> list[Transform]:
        """The fixed joints' transforms (they do not depend on the joint positions)."""
        return self._transforms(self._fixed)

    def transforms(self, positions: Mapping[str, float]) -> list[Transform]:
        """The movable joints' transforms at ``positions`` (rad, by joint name).

        Joints the mapping does not name keep their last given position (at first: zero).
        Raises:
            ValueError: a position is not finite (the previous positions are kept).
        """
        updates = {}
        for name, value in positions.items():
            idx = self._index.get(name)
            if idx is None:
                continue  # a joint of another device on the same topic: not ours
            if not np.isfinite(value):
                raise ValueError(f"joint {name!r}: position {value!r} is not finite")
            updates[idx] = float(value)
        for idx, value in updates.items():
            self._q[idx] = value
        return self._transforms(self._moving)


__all__ = ["Transform", "TransformTree"]
