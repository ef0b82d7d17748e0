"""`robot-wm teleop`: keyboard jog of the joints or of the tool (base frame), with a deadman.

    robot-wm intervene take --reason "..."   # first: the operator takes over from the policy
    robot-wm teleop                          # then jog; Ctrl-C / Esc / x ends (the arm stops)
    robot-wm intervene release --reason "..."

Keys (hold them; the terminal's key repeat keeps the command alive)::

    joint mode (default)            tool mode (m toggles)
    q/a  shoulder_pan   + / -       w/s  +x / -x   (base frame, m/s)
    w/s  shoulder_lift  + / -       a/d  +y / -y
    e/d  elbow          + / -       r/f  +z / -z
    r/f  wrist_1        + / -       i/k  roll  + / -   (about base x)
    t/g  wrist_2        + / -       j/l  pitch + / -   (about base y)
    y/h  wrist_3        + / -       u/o  yaw   + / -   (about base z)
    + / -  speed up / down          space  stop at once        m  mode        x / Esc  quit

The command goes out on /robot_wm/teleop/joint_velocity (Float64MultiArray) or
/robot_wm/teleop/twist (TwistStamped, frame base_link) at ``rate_hz`` while a key is held: the
last key event less than ``hold_s`` ago (longer than the terminal's initial repeat delay), else
nothing, so the policy node's deadman (no message for 0.2 s -> zero) stops the arm when the key is
released, the terminal dies or this process is killed. The policy node clips the jog to the limits in
force and the safety filter guards it like any command. The status line shows the filter's state,
the trust level and who is in command.
"""
from __future__ import annotations

import math
import select
import sys
import time
from dataclasses import dataclass

JOINT_KEYS = {"q": (0, 1), "a": (0, -1), "w": (1, 1), "s": (1, -1), "e": (2, 1), "d": (2, -1),
              "r": (3, 1), "f": (3, -1), "t": (4, 1), "g": (4, -1), "y": (5, 1), "h": (5, -1)}
TOOL_KEYS = {"w": (0, 1), "s": (0, -1), "a": (1, 1), "d": (1, -1), "r": (2, 1), "f": (2, -1),
             "i": (3, 1), "k": (3, -1), "j": (4, 1), "l": (4, -1), "u": (5, 1), "o": (5, -1)}
QUIT_KEYS = {"x", "\x1b", "\x03"}  # x, Esc, Ctrl-C


@dataclass
class KeyTeleop:
    """Keys -> jog commands (no I/O: the terminal loop and the tests drive it).

    Attributes:
        joint_speed_radps: jog speed of a joint key.
        linear_mps / angular_radps: jog speed of a tool key.
        hold_s: a key counts as held this long after its last event.
    """

    n_joints: int = 6
    joint_speed_radps: float = 0.2
    linear_mps: float = 0.03
    angular_radps: float = 0.2
    hold_s: float = 0.6
    mode: str = "joint"
    _key: str | None = None
    _key_t: float = -math.inf
    quit: bool = False

    def press(self, key: str, t_s: float) -> None:
        if key in QUIT_KEYS:
            self.quit, self._key = True, None
        elif key == "m":
            self.mode, self._key = ("tool" if self.mode == "joint" else "joint"), None
        elif key == " ":
            self._key = None
        elif key in "+=":
            self._scale(1.5)
        elif key in "-_":
            self._scale(1 / 1.5)
        elif key in (JOINT_KEYS if self.mode == "joint" else TOOL_KEYS):
            self._key, self._key_t = key, t_s

    def _scale(self, f: float) -> None:
        self.joint_speed_radps = min(max(self.joint_speed_radps * f, 0.01), 1.0)
        self.linear_mps = min(max(self.linear_mps * f, 0.002), 0.2)
        self.angular_radps = min(max(self.angular_radps * f, 0.01), 1.0)

    def held(self, t_s: float) -> bool:
        return self._key is not None and t_s - self._key_t <= self.hold_s

    def command(self, t_s: float) -> tuple[str, list[float]] | None:
        """("joint", n velocities) or ("tool", [vx, vy, vz, wx, wy, wz]) while a key is held, else None."""
        if not self.held(t_s):
            return None
        if self.mode == "joint":
            i, sign = JOINT_KEYS[self._key]
            v = [0.0] * self.n_joints
            v[i] = sign * self.joint_speed_radps
            return "joint", v
        i, sign = TOOL_KEYS[self._key]
        w = [0.0] * 6
        w[i] = sign * (self.linear_mps if i < 3 else self.angular_radps)
        return "tool", w

    def describe(self) -> str:
        if self.mode == "joint":
            return f"joint mode, {self.joint_speed_radps:.2f} rad/s"
        return f"tool mode, {self.linear_mps * 1e3:.0f} mm/s, {self.angular_radps:.2f} rad/s"


def run(rate_hz: float = 30.0, hold_s: float = 0.6, speed_radps: float = 0.2, linear_mps: float = 0.03,
        timeout_s: float = 5.0, keys=None) -> int:
    """The terminal loop. ``keys``: an iterator of (delay_s, key) instead of the keyboard (scripts)."""
    import rclpy
    from geometry_msgs.msg import TwistStamped
    from rclpy.context import Context
    from rclpy.executors import SingleThreadedExecutor
    from std_msgs.msg import Float64MultiArray

    from robot_wm.msg import InterventionState, SafetyStatus, TrustState
    from robot_wm.rosenv import apply_loopback_dds

    apply_loopback_dds()
    teleop = KeyTeleop(hold_s=hold_s, joint_speed_radps=speed_radps, linear_mps=linear_mps)
    context = Context()
    rclpy.init(context=context)
    node = rclpy.create_node("robot_wm_teleop", context=context)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    latest: dict = {}
    from rclpy.qos import DurabilityPolicy, QoSProfile

    node.create_subscription(SafetyStatus, "/robot_wm/safety_status", lambda m: latest.__setitem__("safety", m), 10)
    node.create_subscription(TrustState, "/robot_wm/trust", lambda m: latest.__setitem__("trust", m), 10)
    node.create_subscription(InterventionState, "/robot_wm/intervention/state",
                             lambda m: latest.__setitem__("who", m),
                             QoSProfile(depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL))
    joint_pub = node.create_publisher(Float64MultiArray, "/robot_wm/teleop/joint_velocity", 10)
    twist_pub = node.create_publisher(TwistStamped, "/robot_wm/teleop/twist", 10)
    source = _script(keys) if keys is not None else _Terminal()
    print(__doc__.split("Keys")[1].split("The command")[0].rstrip(), flush=True)
    # the stack first: its status, and the policy node listening to the jog topics
    deadline = time.monotonic() + timeout_s
    while not ("safety" in latest and joint_pub.get_subscription_count() > 0 and twist_pub.get_subscription_count() > 0):
        executor.spin_once(timeout_sec=0.05)
        if time.monotonic() > deadline:
            print("no safety filter status or no policy node listening on /robot_wm/teleop/*: is the stack up? "
                  "(`robot-wm up`)", file=sys.stderr)
            executor.shutdown(timeout_sec=1.0)
            node.destroy_node()
            rclpy.shutdown(context=context)
            return 2
    try:
        with source:
            t0 = time.monotonic()
            last_line = 0.0
            while not teleop.quit:
                for key in source.read(1.0 / rate_hz):
                    teleop.press(key, time.monotonic())
                executor.spin_once(timeout_sec=0)
                now = time.monotonic()
                cmd = teleop.command(now)
                if cmd is not None and cmd[0] == "joint":
                    joint_pub.publish(Float64MultiArray(data=cmd[1]))
                elif cmd is not None:
                    msg = TwistStamped()
                    msg.header.stamp = node.get_clock().now().to_msg()
                    msg.header.frame_id = "base_link"
                    (msg.twist.linear.x, msg.twist.linear.y, msg.twist.linear.z,
                     msg.twist.angular.x, msg.twist.angular.y, msg.twist.angular.z) = cmd[1]
                    twist_pub.publish(msg)
                if now - last_line >= 0.25:
                    last_line = now
                    source.status(_status_line(teleop, cmd, latest))
                if "safety" not in latest and now - t0 > timeout_s:
                    source.status("no /robot_wm/safety_status: is the stack up? (`robot-wm up`)\n")
                    return 2
                if source.done:
                    break
    finally:
        executor.shutdown(timeout_sec=1.0)
        node.destroy_node()
        rclpy.shutdown(context=context)
    print("\nteleop ended: no more jog messages, the policy node's deadman holds the arm at zero")
    return 0


def _status_line(teleop: KeyTeleop, cmd, latest: dict) -> str:
    from robot_wm.core.safety.limits import TrustLevel

    safety = latest.get("safety")
    trust = latest.get("trust")
    who = latest.get("who")
    filt = "filter ?" if safety is None else f"filter {safety.state_text}" + (
        f" [{', '.join(safety.active_constraints)}]" if safety.active_constraints else "") + (
        f" latched {','.join(safety.latches)}" if safety.latches else "")
    lvl = "trust ?" if trust is None else f"trust {TrustLevel(trust.level).name if trust.level <= 4 else trust.level}"
    owner = "?" if who is None else ("OPERATOR" if who.active else "POLICY (take over first: robot-wm intervene take)")
    jog = "idle (deadman)" if cmd is None else f"{cmd[0]} " + " ".join(f"{v:+.2f}" for v in cmd[1])
    return f"\r{teleop.describe()} | {jog} | {filt} | {lvl} | command: {owner}\x1b[K"


class _Terminal:
    """Raw single-key input from the controlling terminal (restored on exit)."""

    done = False

    def __enter__(self):
        import termios
        import tty

        if not sys.stdin.isatty():
            raise SystemExit("robot-wm teleop needs a terminal (keyboard); publish /robot_wm/teleop/* from a "
                             "program instead")
        self._fd = sys.stdin.fileno()
        self._saved = termios.tcgetattr(self._fd)
        tty.setcbreak(self._fd)
        return self

    def __exit__(self, *exc):
        import termios

        termios.tcsetattr(self._fd, termios.TCSADRAIN, self._saved)
        return False

    def read(self, timeout_s: float) -> list[str]:
        ready, _, _ = select.select([sys.stdin], [], [], timeout_s)
        if not ready:
            return []
        import os

        return list(os.read(self._fd, 64).decode(errors="ignore"))

    def status(self, line: str) -> None:
        sys.stdout.write(line)
        sys.stdout.flush()


class _script:
    """Keys from a script of (delay_s, key) steps; the same loop as the keyboard."""

    def __init__(self, steps) -> None:
        self._steps = list(steps)
        self._next = None
        self.done = False
        self.lines: list[str] = []

    def __enter__(self):
        self._t = time.monotonic()
        return self

    def __exit__(self, *exc):
        return False

    def read(self, timeout_s: float) -> list[str]:
        time.sleep(timeout_s)
        out = []
        while self._steps and time.monotonic() - self._t >= self._steps[0][0]:
            delay, key = self._steps.pop(0)
            self._t += delay
            out.append(key)
        if not self._steps and self._next is None:
            self._next = time.monotonic() + 1.0  # let the last command run out, then end
        if self._next is not None and time.monotonic() >= self._next:
            self.done = True
        return out

    def status(self, line: str) -> None:
        self.lines.append(line)
        print(line.strip("\r\x1b[K"), flush=True)


def parse_script(text: str) -> list[tuple[float, str]]:
    """``"0.5:q,0.1:q,1:space"`` -> [(0.5, "q"), (0.1, "q"), (1.0, " ")] (delay before each key, s)."""
    steps = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        delay, _, key = part.partition(":")
        key = {"space": " ", "esc": "\x1b", "plus": "+", "minus": "-"}.get(key, key)
        try:
            d = float(delay)
        except ValueError:
            raise ValueError(f"teleop script step {part!r}: expected DELAY_S:KEY, e.g. 0.1:q") from None
        if len(key) != 1 or not (math.isfinite(d) and d >= 0):
            raise ValueError(f"teleop script step {part!r}: expected DELAY_S:KEY with one key and a delay >= 0")
        steps.append((d, key))
    return steps


__all__ = ["KeyTeleop", "parse_script", "run"]
