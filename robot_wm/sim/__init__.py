"""robot_wm.sim: the embedded MuJoCo arm as a plain Python library (no ROS, no torch).

``ArmSim`` is one arm with a ros2_control-like velocity interface, sensor models and fault
injection; ``VecArmSim`` steps many of them for data collection; ``DynamicsProfile`` /
``load_profile`` / ``sample_profile`` describe how an arm (or its simulator) behaves.
"""
from robot_wm.sim.arm import ArmSim, CommandRejected, JointState
from robot_wm.sim.faults import FAULT_KINDS, ActiveFault, FaultError, FaultInjector
from robot_wm.sim.model import TIMESTEP_S, ArmModel, ModelError, build_model, build_spec, urdf_for_mujoco
from robot_wm.sim.profiles import (
    LINK_NAMES,
    DynamicsProfile,
    ProfileError,
    default_randomization_ranges,
    load_profile,
    profile_from_mapping,
    profile_names,
    sample_profile,
)
from robot_wm.sim.vec import VecArmSim, VecObservation

__all__ = [
    "ActiveFault",
    "ArmModel",
    "ArmSim",
    "CommandRejected",
    "DynamicsProfile",
    "FAULT_KINDS",
    "FaultError",
    "FaultInjector",
    "JointState",
    "LINK_NAMES",
    "ModelError",
    "ProfileError",
    "TIMESTEP_S",
    "VecArmSim",
    "VecObservation",
    "build_model",
    "build_spec",
    "default_randomization_ranges",
    "load_profile",
    "profile_from_mapping",
    "profile_names",
    "sample_profile",
    "urdf_for_mujoco",
]
