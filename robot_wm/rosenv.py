"""Keep DDS on loopback: the environment every robot_wm ROS process starts with.

Fast DDS multicasts discovery on every interface by default. robot_wm ships a loopback-only
profile (config/fastdds_loopback.xml: shared memory + UDPv4 bound to 127.0.0.1, no multicast) and
applies it, with ``ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST``, before any node starts: in the CLI,
in each node's ``main``, in the launch file and in the test harness.

A process that must never hold up another (the online learner) takes the variant that receives over
UDP (config/fastdds_loopback_udp.xml, ``shared_memory=False``): a process killed while it holds the
lock of its shared-memory port blocks every process that sends to it for a second.

Multi-host deployments (robot PC + GPU box) opt out with ``ROBOT_WM_DDS=system``: the
environment is then left exactly as the user set it.
"""
from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from collections.abc import MutableMapping
from pathlib import Path

from robot_wm.paths import data_path

PROFILE_ENV = "ROBOT_WM_FASTDDS_PROFILE"  # override the shipped profile with another loopback one
OPT_OUT_ENV = "ROBOT_WM_DDS"  # "system": leave DDS settings to the user
_NS = "{http://www.eprosima.com}"


class DdsConfigError(RuntimeError):
    """The DDS environment is not the loopback-only one robot_wm requires."""


def profile_path(shared_memory: bool = True) -> Path:
    """Return the Fast DDS profile robot_wm applies (``$ROBOT_WM_FASTDDS_PROFILE`` or the shipped one:
    shared memory + UDP, or UDP alone with ``shared_memory=False``)."""
    override = os.environ.get(PROFILE_ENV)
    if override:
        return Path(override)
    return data_path("config", "fastdds_loopback.xml" if shared_memory else "fastdds_loopback_udp.xml", must_exist=False)


def loopback_env(base: MutableMapping[str, str] | None = None, domain_id: int | None = None,
                 shared_memory: bool = True) -> dict[str, str]:
    """Return a copy of ``base`` (default: os.environ) with the loopback-only DDS settings applied.

    Args:
        base: environment to start from.
        domain_id: ROS_DOMAIN_ID to set (tests use their own); None keeps the inherited one.
        shared_memory: False for the UDP-only profile (see the module docstring).
    Returns:
        The new environment mapping (for subprocesses).
    """
    env = dict(os.environ if base is None else base)
    if env.get(OPT_OUT_ENV) == "system":
        return env
    path = profile_path(shared_memory)
    problems = check_profile(path)
    if problems:
        raise DdsConfigError("; ".join(problems) + f" (set {OPT_OUT_ENV}=system to manage DDS yourself)")
    env["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
    env["FASTDDS_DEFAULT_PROFILES_FILE"] = str(path.resolve())
    env.setdefault("RMW_IMPLEMENTATION", "rmw_fastrtps_cpp")
    env.pop("ROS_STATIC_PEERS", None)
    if domain_id is not None:
        env["ROS_DOMAIN_ID"] = str(int(domain_id))
    return env


def apply_loopback_dds(domain_id: int | None = None, shared_memory: bool = True) -> None:
    """Apply the loopback-only DDS settings to this process; call before ``rclpy.init``."""
    os.environ.update(loopback_env(domain_id=domain_id, shared_memory=shared_memory))


def check_profile(path: Path) -> list[str]:
    """Return what makes ``path`` unusable as a loopback-only Fast DDS profile (empty list: fine)."""
    if not path.is_file():
        return [f"Fast DDS profile not found: {path}"]
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as exc:
        return [f"Fast DDS profile {path} is not valid XML: {exc}"]
    problems = []
    for elem in root.iter():
        if elem.tag in (f"{_NS}address", "address") and elem.text and not elem.text.strip().startswith("127."):
            problems.append(f"{path}: address {elem.text.strip()!r} is not on loopback (127.0.0.0/8)")
    builtin = [e for e in root.iter() if e.tag in (f"{_NS}useBuiltinTransports", "useBuiltinTransports")]
    if not builtin or any((e.text or "").strip().lower() != "false" for e in builtin):
        problems.append(f"{path}: useBuiltinTransports must be false (builtin transports multicast on every interface)")
    return problems


def check_environment(env: MutableMapping[str, str] | None = None) -> list[str]:
    """Return what in ``env`` (default: os.environ) would let DDS leave loopback (empty list: fine)."""
    env = os.environ if env is None else env
    problems = []
    if env.get("ROS_AUTOMATIC_DISCOVERY_RANGE") != "LOCALHOST":
        problems.append(
            f"ROS_AUTOMATIC_DISCOVERY_RANGE is {env.get('ROS_AUTOMATIC_DISCOVERY_RANGE')!r}, expected 'LOCALHOST'"
        )
    profile = env.get("FASTDDS_DEFAULT_PROFILES_FILE")
    if not profile:
        problems.append("FASTDDS_DEFAULT_PROFILES_FILE is not set (Fast DDS would multicast discovery)")
    else:
        problems.extend(check_profile(Path(profile)))
    return problems


def shell_exports() -> str:
    """Return ``export`` lines that give a shell (and ros2 CLI tools) the same DDS settings."""
    env = loopback_env()
    keys = ("ROS_AUTOMATIC_DISCOVERY_RANGE", "FASTDDS_DEFAULT_PROFILES_FILE", "RMW_IMPLEMENTATION")
    return "\n".join(f"export {k}={env[k]}" for k in keys)
