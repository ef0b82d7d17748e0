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


# How long after the command timeout an arm may take to come to rest: its deceleration (the
# embedded arm: 10 rad/s^2, 20 ms from the probe's speed) and the stamps' jitter on a loaded machine.
REST_MARGIN_S = 0.25
_PROBE_S = 0.5  # how long the probe commands one joint (s)
_FOLLOW_WAIT_S = 2.0  # how long the probe waits for the joint to follow its first commands (s)


class _DriverProbe:
    """A node that records /joint_states and /diagnostics and can command the arm (doctor --driver)."""

    def __init__(self, context, command_topic: str, states_topic: str) -> None:
        import rclpy
        from diagnostic_msgs.msg import DiagnosticArray
        from rclpy.qos import QoSProfile, ReliabilityPolicy
        from sensor_msgs.msg import JointState

        self.node = rclpy.create_node("robot_wm_doctor_driver", context=context)
        # 2 s of a 500 Hz arm: on a loaded machine this executor may fall behind the stream, and a shallow
        # queue then drops the very states the probe judges (depth 50 kept 0.1 s)
        qos = QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE)
        self.states: list[tuple[float, list[str], list[float], list[float], list[float]]] = []
        self.statuses: list = []
        self.node.create_subscription(JointState, states_topic, self._on_state, qos)
        self.node.create_subscription(DiagnosticArray, "/diagnostics", lambda m: self.statuses.extend(m.status), 50)
        self.command_topic = command_topic
        self.executor = rclpy.executors.SingleThreadedExecutor(context=context)
        self.executor.add_node(self.node)

    def _on_state(self, msg) -> None:
        stamp = msg.header.stamp.sec + 1e-9 * msg.header.stamp.nanosec
        self.states.append((stamp, list(msg.name), list(msg.position), list(msg.velocity), list(msg.effort)))

    def spin_until(self, done, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not done() and time.monotonic() < deadline:
            self.executor.spin_once(timeout_sec=0.01)
        return bool(done())

    def command(self, pub, velocity, duration_s: float, rate_hz: float = 100.0, until=None) -> float:
        """Publish ``velocity`` at ``rate_hz`` for ``duration_s`` (or until ``until()`` is true);
        return the wall time of the last one."""
        from std_msgs.msg import Float64MultiArray

        msg = Float64MultiArray(data=[float(v) for v in velocity])
        end = time.monotonic() + duration_s
        last = time.time()
        while time.monotonic() < end and not (until is not None and until()):
            pub.publish(msg)
            last = time.time()
            self.spin_until(lambda: False, 1.0 / rate_hz)
        return last

    def driver_status(self):
        """The driver's latest DiagnosticStatus: an ArmDriver's (it carries command_timeout_s) or the
        command watchdog's (the ros2_control route); None when neither was seen."""
        mine = [s for s in self.statuses if s.name == "robot_wm/command_watchdog"
                or any(kv.key == "command_timeout_s" for kv in s.values)]
        return mine[-1] if mine else None


_LEVELS = {0: "OK", 1: "WARN", 2: "ERROR", 3: "STALE"}


def _level(status) -> int:
    """A DiagnosticStatus level as an int (rclpy gives the byte field as bytes)."""
    return status.level[0] if isinstance(status.level, bytes) else int(status.level)


def _value(status, key: str) -> float | None:
    """A numeric value of a DiagnosticStatus, or None (no status, no such key, not a number)."""
    for kv in getattr(status, "values", []):
        if kv.key == key:
            try:
                return float(kv.value)
            except ValueError:
                return None
    return None


def check_driver(move: bool = True, wait_s: float = 10.0, rest_margin_s: float = REST_MARGIN_S) -> list[Check]:
    """Check a running arm driver against the topic contract (docs/drivers.md), measured on /joint_states.

    Joint states: every URDF joint in URDF order, finite positions and velocities, stamps that
    advance and agree with this machine's clock, at the driver's ``publish_rate_hz`` (its
    /diagnostics say it; at least the 100 Hz control rate otherwise); the driver's /diagnostics. With
    ``move`` and no other publisher of commands: the last joint is commanded slowly (10 % of its
    URDF limit, at most 0.2 rad/s) for 0.5 s, then nothing: it must have followed, and be at rest
    within the command timeout plus ``rest_margin_s`` by the states' stamps; then back the same way.

    Args:
        move: run the commanded-motion and timeout check (the arm moves a few degrees and back).
        wait_s: how long to wait for the first joint states.
        rest_margin_s: how long after the timeout the arm may take to be at rest.
    """
    import numpy as np
    import rclpy
    from rclpy.context import Context

    from robot_wm import description
    from robot_wm.core.driver_contract import rate_hz
    from robot_wm.rosenv import apply_loopback_dds

    limits = description.joint_limits(description.expand())
    names = list(limits.names)
    apply_loopback_dds()
    context = Context()
    rclpy.init(context=context)
    checks: list[Check] = []
    try:
        probe = _DriverProbe(context, "/forward_velocity_controller/commands", "/joint_states")
        if not probe.spin_until(lambda: len(probe.states) > 0, wait_s):
            return [Check("FAIL", "driver: joint states", f"no /joint_states within {wait_s:g} s. Fix: start the driver "
                          "(robot-wm up --hardware <yours>, ros2 run <pkg> <driver>, or ros2 launch ... hardware:=<plugin>)")]
        probe.spin_until(lambda: len(probe.states) > 0 and probe.states[-1][0] - probe.states[0][0] >= 1.0
                         and probe.driver_status() is not None, 2.5)
        states = list(probe.states)
        status = probe.driver_status()

        got = states[-1][1]
        checks.append(Check("OK", "driver: joint names", f"the URDF's {len(names)} joints in URDF order") if got == names
                      else Check("FAIL", "driver: joint names", f"got {got}, expected the URDF's order {names}. Fix: publish "
                                 "every joint, in joint_names order (config/robot.yaml)"))
        _, _, position, velocity, effort = states[-1]
        bad = []
        for what, values in (("position", position), ("velocity", velocity)):
            if len(values) != len(names):
                bad.append(f"{what} has {len(values)} values, expected {len(names)}")
            elif not np.all(np.isfinite(values)):
                bad.append(f"{what} not finite: {values}")
        checks.append(Check("FAIL", "driver: state values", "; ".join(bad) + ". Fix: rad and rad/s for every joint")
                      if bad else Check("OK", "driver: state values", "positions and velocities finite"
                                        + ("" if effort else "; no efforts (allowed)")))

        stamps = [s[0] for s in states]
        expected_hz = _value(status, "publish_rate_hz")
        measured_hz = rate_hz(stamps)
        age_s = time.time() - stamps[-1]
        if any(b < a for a, b in zip(stamps, stamps[1:])) or stamps[-1] == 0.0:
            checks.append(Check("FAIL", "driver: stamps", "stamps are zero or go backwards. Fix: stamp each state with "
                                "the time it was measured"))
        elif abs(age_s) > 0.5:
            checks.append(Check("WARN", "driver: stamps", f"the latest stamp is {age_s:+.3f} s from this machine's clock "
                                "(sim time, or clocks not synchronized?): the stack judges staleness by stamps"))
        else:
            checks.append(Check("OK", "driver: stamps", "advancing, on this machine's clock"))
        low = 100.0 if expected_hz is None else 0.8 * expected_hz
        high = None if expected_hz is None else 1.2 * expected_hz
        wanted = "at least 100 Hz (the control rate)" if expected_hz is None else f"{expected_hz:g} Hz (publish_rate_hz)"
        checks.append(Check("OK" if measured_hz >= low and (high is None or measured_hz <= high) else "FAIL",
                            "driver: rate", f"{measured_hz:.0f} Hz by the stamps over {len(stamps)} states; expected {wanted}"))
        if status is None:
            checks.append(Check("FAIL", "driver: diagnostics", "no driver status on /diagnostics (an ArmDriver publishes "
                                "robot_wm/<node> with command_timeout_s; the ros2_control route, robot_wm/command_watchdog)"))
        else:
            checks.append(Check("OK", "driver: diagnostics", f"{status.name} ({status.hardware_id}): "
                                f"{_LEVELS.get(_level(status), '?')} {status.message!r}"))
        if move:
            timeout_s = _value(status, "command_timeout_s") or _value(status, "timeout_s")
            checks += _check_timeout(probe, limits, timeout_s, rest_margin_s)
        probe.node.destroy_node()
    finally:
        rclpy.shutdown(context=context)
    return checks


def _check_timeout(probe: _DriverProbe, limits, timeout_s: float | None, rest_margin_s: float) -> list[Check]:
    """Command the last joint slowly, then stop; the arm must follow, then rest within the timeout."""
    import numpy as np
    from std_msgs.msg import Float64MultiArray

    from robot_wm.core.driver_contract import rest_after_s

    def rest_s(t0_s: float) -> float | None:
        states = list(probe.states)
        return rest_after_s([s[0] for s in states], [max(map(abs, s[3]), default=0.0) for s in states], t0_s)

    n = len(limits.names)
    others = probe.node.count_publishers(probe.command_topic)
    if others:
        return [Check("WARN", "driver: command timeout", f"not tested: {others} other publisher(s) of "
                      f"{probe.command_topic} (the safety filter?). Run the driver alone to test it (ros2 run <pkg> "
                      "<driver>, or python -m robot_wm.nodes.example_arm)")]
    timeout_s = 0.05 if timeout_s is None else timeout_s
    pub = probe.node.create_publisher(Float64MultiArray, probe.command_topic, 10)
    probe.spin_until(lambda: pub.get_subscription_count() > 0, 3.0)
    j = n - 1
    speed = min(0.2, 0.1 * float(limits.velocity_radps[j]))
    rest_times, followed = [], []
    limit_s = timeout_s + rest_margin_s
    stopped_by_doctor = False
    q_start = probe.states[-1][2][j]
    duration_s, coast = _PROBE_S, 0.0
    for sign in (1.0, -1.0):  # there and back: the arm ends near where it was
        command = np.zeros(n)
        command[j] = sign * speed
        # the driver may match this publisher after it matched the driver (discovery on a loaded machine):
        # command until the joint follows, for up to _FOLLOW_WAIT_S, then judge the next duration_s
        probe.command(pub, command, _FOLLOW_WAIT_S,
                      until=lambda: len(probe.states[-1][3]) == n and sign * probe.states[-1][3][j] > 0.5 * speed)
        if sign < 0:  # back: for what is left of the way from here, less the coasting after the last command
            duration_s = min(max(abs(probe.states[-1][2][j] - q_start) - coast, 0.0) / speed, 2 * _PROBE_S)
        t_start = time.time()
        t_last = probe.command(pub, command, duration_s)
        probe.spin_until(lambda: rest_s(t_last) is not None, limit_s + 1.0)
        steady = [s[3][j] for s in probe.states if t_start + 0.5 * _PROBE_S <= s[0] <= t_last and len(s[3]) == n]
        followed.append(float(np.mean(steady)) * sign if steady else 0.0)
        rest_times.append(rest_s(t_last))
        if rest_times[-1] is None or rest_times[-1] > limit_s:
            probe.command(pub, np.zeros(n), 0.2)  # the arm's timeout failed: stop it with zero commands
            stopped_by_doctor = True
            break
        at_last = [s[2][j] for s in probe.states if s[0] <= t_last and len(s[2]) == n]
        coast = abs(probe.states[-1][2][j] - at_last[-1]) if at_last else 0.0  # the timeout, then the deceleration
    checks = []
    if min(followed) < 0.5 * speed:
        checks.append(Check("FAIL", "driver: commands", f"commanded {limits.names[j]} at {speed:.3f} rad/s, it moved at "
                            f"{min(followed):.3f} rad/s. Fix: write the command to the drives (write_velocity)"))
    else:
        checks.append(Check("OK", "driver: commands", f"{limits.names[j]} followed {speed:.3f} rad/s (measured "
                            f"{min(followed):.3f})"))
    worst = None if None in rest_times else max(rest_times)
    if stopped_by_doctor:
        said = "still moving" if worst is None else f"at rest only {worst * 1e3:.0f} ms"
        checks.append(Check("FAIL", "driver: command timeout", f"{said} after the last command (the doctor then sent "
                            f"zero commands); expected at rest within {limit_s * 1e3:.0f} ms (timeout "
                            f"{timeout_s * 1e3:.0f} ms + {rest_margin_s * 1e3:.0f} ms). Fix: no command for "
                            "command_timeout_s must bring the arm to rest (docs/drivers.md); on a loaded machine "
                            "allow more with --rest-margin"))
    else:
        checks.append(Check("OK", "driver: command timeout", f"at rest {worst * 1e3:.0f} ms after the last command "
                            f"(timeout {timeout_s * 1e3:.0f} ms + {rest_margin_s * 1e3:.0f} ms allowed), by the stamps"))
    return checks


def run_doctor(live: bool = True, driver: bool = False, move: bool = True, rest_margin_s: float = REST_MARGIN_S) -> int:
    """Print every check; return 1 if any failed.

    Args:
        live: the ROS 2 round trip on loopback.
        driver: check the running arm driver against the topic contract (:func:`check_driver`).
        move: with ``driver``, the commanded-motion and command-timeout check (the arm moves).
        rest_margin_s: with ``move``, how long after the command timeout the arm may take to rest.
    """
    checks = check_imports() + check_dds()
    if not any(c.level == "FAIL" for c in checks):
        checks += check_description() + check_models()
        if live:
            checks += check_ros_roundtrip()
        if driver:
            checks += check_driver(move=move, rest_margin_s=rest_margin_s)
    for c in checks:
        print(f"[{c.level:<4}] {c.what}: {c.detail}")
    failed = [c for c in checks if c.level == "FAIL"]
    print(f"{len(checks) - len(failed)} ok/warn, {len(failed)} failed" + (" - see the Fix hints above" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(run_doctor())
