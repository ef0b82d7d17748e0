"""`robot-wm doctor`: check that this machine can run robot_wm, and say how to fix what cannot."""
from __future__ import annotations

import importlib
import os
import sys
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Check:
    """One finding: level is OK, WARN or FAIL."""

    level: str
    what: str
    detail: str = ""


def _import(name: str, fix: str) -> Check:
    try:
        module = importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 - any import failure is a finding, shown to the user
        return Check("FAIL", f"import {name}", f"{type(exc).__name__}: {exc}. Fix: {fix}")
    return Check("OK", f"import {name}", getattr(module, "__version__", "") or getattr(module, "__file__", ""))


def check_imports() -> list[Check]:
    """Python dependencies and the generated interfaces."""
    setup = "run `make demo` or `make test` (they create .venv and install everything)"
    checks = [_import(n, setup) for n in ("numpy", "yaml", "xacro", "pinocchio", "mujoco", "rclpy")]
    for name in ("robot_wm.msg", "robot_wm.srv"):
        checks.append(_import(name, "build the interfaces: `make interfaces` (pip path) or `colcon build` (ROS install)"))
    return checks


def check_dds() -> list[Check]:
    """The loopback-only DDS profile robot_wm applies to every process it starts."""
    from robot_wm import rosenv

    if os.environ.get(rosenv.OPT_OUT_ENV) == "system":
        return [Check("WARN", "DDS", f"{rosenv.OPT_OUT_ENV}=system: robot_wm leaves DDS settings to you (traffic may leave loopback)")]
    path = rosenv.profile_path()
    problems = rosenv.check_profile(path)
    if problems:
        return [Check("FAIL", "DDS profile", "; ".join(problems)
                      + f". Fix: restore config/fastdds_loopback.xml or point {rosenv.PROFILE_ENV} at a loopback-only profile")]
    checks = [Check("OK", "DDS profile", f"{path} (loopback only)")]
    shell = rosenv.check_environment()
    if shell:
        checks.append(Check("WARN", "DDS in this shell",
                            "; ".join(shell) + ". robot-wm applies the profile to its own processes; for ros2 CLI tools run "
                            "`eval \"$(robot-wm env)\"` first"))
    else:
        checks.append(Check("OK", "DDS in this shell", "loopback-only settings exported"))
    return checks


def check_description() -> list[Check]:
    """The URDF expands and loads in pinocchio and MuJoCo with the same joints."""
    try:
        from robot_wm import description

        urdf = description.expand()
        limits = description.joint_limits(urdf)
    except Exception as exc:  # noqa: BLE001
        return [Check("FAIL", "URDF", f"xacro expansion failed: {exc}")]
    checks = [Check("OK", "URDF", f"{len(limits.names)} joints: {', '.join(limits.names)}")]
    try:
        from robot_wm.core.kinematics import Kinematics

        Kinematics(urdf, limits.names)
        checks.append(Check("OK", "pinocchio", "description loads"))
    except Exception as exc:  # noqa: BLE001
        checks.append(Check("FAIL", "pinocchio", str(exc)))
    try:
        from robot_wm.sim import ArmSim

        sim = ArmSim()
        if tuple(sim.joint_names) != tuple(limits.names):
            checks.append(Check("FAIL", "MuJoCo", f"joint order {sim.joint_names} differs from the URDF's"))
        else:
            checks.append(Check("OK", "MuJoCo", "embedded arm builds from the same URDF"))
    except Exception as exc:  # noqa: BLE001
        checks.append(Check("FAIL", "MuJoCo", str(exc)))
    return checks


def check_models() -> list[Check]:
    """Shipped ONNX models (the learning issue adds them)."""
    from robot_wm.paths import data_path

    models = data_path("models", must_exist=False)
    found = sorted(models.glob("*.onnx")) if models.is_dir() else []
    if not found:
        return [Check("WARN", "models", f"no ONNX models in {models} yet: the arm runs, the learned stack cannot")]
    return [Check("OK", "models", ", ".join(p.name for p in found))]


def check_ros_roundtrip(timeout_s: float = 10.0) -> list[Check]:
    """Publish and receive one message on loopback in this process."""
    try:
        import rclpy
        from rclpy.context import Context
        from std_msgs.msg import String

        from robot_wm.rosenv import apply_loopback_dds
    except Exception as exc:  # noqa: BLE001
        return [Check("FAIL", "ROS 2 round trip", f"cannot import rclpy: {exc}")]
    apply_loopback_dds()
    context = Context()
    rclpy.init(context=context)
    try:
        node = rclpy.create_node("robot_wm_doctor", context=context)
        got: list[str] = []
        node.create_subscription(String, "/robot_wm/doctor_ping", lambda m: got.append(m.data), 10)
        pub = node.create_publisher(String, "/robot_wm/doctor_ping", 10)
        executor = rclpy.executors.SingleThreadedExecutor(context=context)
        executor.add_node(node)
        deadline = time.monotonic() + timeout_s
        while not got and time.monotonic() < deadline:
            pub.publish(String(data="ping"))
            executor.spin_once(timeout_sec=0.05)
        node.destroy_node()
        if not got:
            return [Check("FAIL", "ROS 2 round trip", f"no message within {timeout_s} s on loopback")]
        return [Check("OK", "ROS 2 round trip", f"domain {os.environ.get('ROS_DOMAIN_ID', '0')}, loopback")]
    finally:
        rclpy.shutdown(context=context)


def run_doctor(live: bool = True) -> int:
    """Print every check; return 1 if any failed."""
    checks = check_imports() + check_dds()
    if not any(c.level == "FAIL" for c in checks):
        checks += check_description() + check_models()
        if live:
            checks += check_ros_roundtrip()
    for c in checks:
        print(f"[{c.level:<4}] {c.what}: {c.detail}")
    failed = [c for c in checks if c.level == "FAIL"]
    print(f"{len(checks) - len(failed)} ok/warn, {len(failed)} failed" + (" - see the Fix hints above" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(run_doctor())
