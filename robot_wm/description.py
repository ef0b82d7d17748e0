"""The arm's robot description: the xacro in urdf/ expanded to URDF, plus the facts read from it.

There is one description (``urdf/robot_wm_arm.urdf.xacro``); pinocchio, MuJoCo, the launch file
and robot_state_publisher all consume its expansion, so joint names and limits cannot drift.
"""
from __future__ import annotations

import functools
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from robot_wm.paths import data_path

XACRO_FILE = ("urdf", "robot_wm_arm.urdf.xacro")


@dataclass(frozen=True)
class JointLimits:
    """Limits of the actuated joints, in description order."""

    names: tuple[str, ...]
    lower_rad: np.ndarray
    upper_rad: np.ndarray
    velocity_radps: np.ndarray
    effort_nm: np.ndarray


def xacro_path() -> Path:
    """Return the path of the top-level xacro file."""
    return data_path(*XACRO_FILE)


def expand(
    hardware: str = "mock",
    hardware_params: str = "",
    prefix: str = "",
    ros2_control: bool = True,
    controllers_file: str = "",
) -> str:
    """Expand the arm xacro to a URDF string.

    Args:
        hardware: mock | gazebo | topic_based | mujoco | a ros2_control plugin name.
        hardware_params: extra plugin parameters, ``"name=value;name2=value2"``.
        prefix: joint/link name prefix.
        ros2_control: include the ``<ros2_control>`` block.
        controllers_file: absolute path of controllers.yaml (used by hardware=gazebo).
    Returns:
        The URDF XML text.
    """
    return _expand_cached(str(xacro_path()), hardware, hardware_params, prefix, bool(ros2_control), controllers_file)


@functools.lru_cache(maxsize=16)
def _expand_cached(
    path: str, hardware: str, hardware_params: str, prefix: str, ros2_control: bool, controllers_file: str
) -> str:
    import xacro  # imported lazily: only description users need it

    mappings = {
        "hardware": hardware,
        "hardware_params": hardware_params,
        "prefix": prefix,
        "ros2_control": "true" if ros2_control else "false",
        "controllers_file": controllers_file,
    }
    doc = xacro.process_file(path, mappings=mappings)
    return doc.toprettyxml(indent="  ")


def joint_limits(urdf_xml: str) -> JointLimits:
    """Read the revolute/prismatic joints and their <limit> elements from URDF text."""
    root = ET.fromstring(urdf_xml)
    names, lo, hi, vel, eff = [], [], [], [], []
    for joint in root.findall("joint"):
        if joint.get("type") not in ("revolute", "prismatic"):
            continue
        limit = joint.find("limit")
        if limit is None:
            raise ValueError(f"joint {joint.get('name')!r} has no <limit> element")
        names.append(joint.get("name"))
        lo.append(float(limit.get("lower", "nan")))
        hi.append(float(limit.get("upper", "nan")))
        vel.append(float(limit.get("velocity", "nan")))
        eff.append(float(limit.get("effort", "nan")))
    return JointLimits(tuple(names), np.array(lo), np.array(hi), np.array(vel), np.array(eff))


def initial_positions(joint_names: tuple[str, ...] | list[str]) -> np.ndarray:
    """Return the start configuration from config/initial_positions.yaml in the given joint order."""
    import yaml

    path = data_path("config", "initial_positions.yaml")
    table = yaml.safe_load(path.read_text()).get("initial_positions", {})
    missing = [n for n in joint_names if n not in table]
    if missing:
        raise ValueError(f"{path}: initial_positions lacks joints {missing}")
    return np.array([float(table[n]) for n in joint_names])
