"""Operator commands without ROS tools: robot-wm estop | reset | status | trust status | trust acknowledge |
trust promote | trust demote | intervene take | intervene release.

They talk to the running safety filter over its services (/robot_wm/estop,
/robot_wm/reset_estop: std_srvs/Trigger) and its status topic (/robot_wm/safety_status), on
the same loopback-only DDS settings as every robot_wm process.
"""
from __future__ import annotations

import sys
import time


def _with_node(fn, timeout_s: float):
    import rclpy
    from rclpy.context import Context
    from rclpy.executors import SingleThreadedExecutor

    from robot_wm.rosenv import apply_loopback_dds

    apply_loopback_dds()
    context = Context()
    rclpy.init(context=context)
    node = rclpy.create_node("robot_wm_operator", context=context)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    try:
        return fn(node, executor, time.monotonic() + timeout_s)
    finally:
        executor.shutdown(timeout_sec=1.0)
        node.destroy_node()
        rclpy.shutdown(context=context)


def call_trigger(service: str, timeout_s: float = 5.0) -> int:
    """Call a std_srvs/Trigger service; print its answer; 0 on success, 1 refused, 2 unreachable."""
    from std_srvs.srv import Trigger

    def run(node, executor, deadline):
        client = node.create_client(Trigger, service)
        while not client.service_is_ready():
            if time.monotonic() > deadline:
                print(f"{service}: no safety filter answering (is the stack up? `robot-wm up`)", file=sys.stderr)
                return 2
            executor.spin_once(timeout_sec=0.05)
        future = client.call_async(Trigger.Request())
        while not future.done():
            if time.monotonic() > deadline:
                print(f"{service}: no answer within {timeout_s} s", file=sys.stderr)
                return 2
            executor.spin_once(timeout_sec=0.05)
        result = future.result()
        print(("OK: " if result.success else "REFUSED: ") + result.message)
        return 0 if result.success else 1

    return _with_node(run, timeout_s)


def _call(node, executor, srv_type, service: str, request, deadline: float, who: str):
    """Call a service; the response, or None after printing why there is none."""
    client = node.create_client(srv_type, service)
    while not client.service_is_ready():
        if time.monotonic() > deadline:
            print(f"{service}: no {who} answering (is the stack up? `robot-wm up`)", file=sys.stderr)
            return None
        executor.spin_once(timeout_sec=0.05)
    future = client.call_async(request)
    while not future.done():
        if time.monotonic() > deadline:
            print(f"{service}: no answer in time", file=sys.stderr)
            return None
        executor.spin_once(timeout_sec=0.05)
    return future.result()


def change_phase(promote: bool, reason: str, timeout_s: float = 5.0) -> int:
    """Ask the trust monitor for a promotion or a demotion; print its answer (and the unmet criteria).
    0 granted, 1 refused, 2 unreachable."""
    from robot_wm.core.safety.limits import Phase
    from robot_wm.srv import PhaseChange

    service = "/robot_wm/phase/promote" if promote else "/robot_wm/phase/demote"

    def run(node, executor, deadline):
        result = _call(node, executor, PhaseChange, service, PhaseChange.Request(reason=reason), deadline,
                       "trust monitor")
        if result is None:
            return 2
        phase = Phase(result.phase).name if result.phase in iter(Phase) else str(result.phase)
        print(("OK: " if result.success else "REFUSED: ") + f"{result.message} (phase now {phase})")
        for item in result.unmet:
            print(f"  unmet: {item}")
        return 0 if result.success else 1

    return _with_node(run, timeout_s)


def intervene(take: bool, reason: str, timeout_s: float = 5.0) -> int:
    """Take over from the policy (or hand back); print the answer. 0 done, 1 refused, 2 unreachable.

    Taking over when the filter is latched on the trust level (the monitor held the arm for a human)
    also releases that latch once the monitor publishes the operator's level: the operator's request
    is the explicit reset; the filter still refuses it while any other fault persists."""
    from std_srvs.srv import Trigger

    from robot_wm.msg import SafetyStatus, TrustState
    from robot_wm.srv import Intervention

    service = "/robot_wm/intervention/take" if take else "/robot_wm/intervention/release"

    def run(node, executor, deadline):
        status: list = []
        trust: list = []
        node.create_subscription(SafetyStatus, "/robot_wm/safety_status", status.append, 10)
        node.create_subscription(TrustState, "/robot_wm/trust", trust.append, 10)
        result = _call(node, executor, Intervention, service, Intervention.Request(reason=reason), deadline,
                       "policy node")
        if result is None:
            return 2
        print(("OK: " if result.success else "REFUSED: ") + result.message)
        if not (take and result.success):
            return 0 if result.success else 1
        # the monitor answers the take-over with SLOW (teleoperation); a trust latch of the filter is
        # then released by this explicit operator request
        t0 = time.monotonic()
        while time.monotonic() - t0 < 3.0 and not (trust and "operator in control" in trust[-1].reason):
            executor.spin_once(timeout_sec=0.05)
        while time.monotonic() - t0 < 3.0 and not status:
            executor.spin_once(timeout_sec=0.05)
        if status and any(x.lower().startswith("trust") for x in status[-1].latches):
            answer = _call(node, executor, Trigger, "/robot_wm/reset_estop", Trigger.Request(),
                           time.monotonic() + 5.0, "safety filter")
            if answer is not None:
                print(("filter latch released: " if answer.success else "filter latch NOT released: ")
                      + answer.message)
        print("teleoperate with `robot-wm teleop` (or /robot_wm/teleop/joint_velocity, /robot_wm/teleop/twist); "
              "hand back with `robot-wm intervene release` at rest")
        return 0

    return _with_node(run, timeout_s + 8.0)


def _watch(msg_type, topic: str, describe, missing: str, seconds: float, timeout_s: float, also=(),
           settle_s: float = 0.0) -> int:
    """Print ``describe(latest message)`` once, or every 0.5 s for ``seconds``; 2 if none arrives.
    ``also``: more (type, topic, callback) subscriptions that ``describe`` may read from, given
    ``settle_s`` after the first message to arrive before the first line."""

    def run(node, executor, deadline):
        latest: list = []
        node.create_subscription(msg_type, topic, latest.append, 10)
        for extra_type, extra_topic, callback in also:
            node.create_subscription(extra_type, extra_topic, callback, 10)
        end = None
        last_print = 0.0
        while True:
            executor.spin_once(timeout_sec=0.05)
            now = time.monotonic()
            if not latest:
                if now > deadline:
                    print(missing, file=sys.stderr)
                    return 2
                continue
            if end is None:
                first = now
            end = end or now + seconds + settle_s
            if now - first < settle_s:
                continue
            if now - last_print >= 0.5:
                print(describe(latest[-1]), flush=True)
                last_print = now
                latest[:] = latest[-1:]
            if now >= end:
                return 0

    return _with_node(run, timeout_s + seconds)


def show_status(seconds: float = 0.0, timeout_s: float = 5.0) -> int:
    """Print the safety filter's state (once, or every 0.5 s for ``seconds``); 2 if none arrives."""
    from robot_wm.msg import SafetyStatus

    def describe(s) -> str:
        active = ", ".join(s.active_constraints) or "-"
        reason = f"  reason: {s.fault_reason}" if s.fault_reason else ""
        latches = f"  latched: {', '.join(s.latches)} (robot-wm reset)" if s.latches else ""
        kind = f"  fault: {s.fault_kind}" if s.fault_kind else ""
        return (f"safety: {s.state_text:<9} active: {active}  intervention {s.intervention_norm:.3f} rad/s  "
                f"solve {s.solve_time_s * 1e6:.0f} us ({s.iterations} it){latches}{kind}{reason}")

    return _watch(SafetyStatus, "/robot_wm/safety_status", describe,
                  "no /robot_wm/safety_status: is the stack up? (`robot-wm up`)", seconds, timeout_s)


def show_trust(seconds: float = 0.0, timeout_s: float = 5.0) -> int:
    """Print the trust monitor's TrustState (once, or every 0.5 s for ``seconds``), with the phase's
    evidence from its /diagnostics when one has arrived; 2 if no TrustState arrives."""
    from diagnostic_msgs.msg import DiagnosticArray

    from robot_wm.core.safety.limits import Phase, TrustLevel
    from robot_wm.msg import TrustState

    diag: dict = {}

    def on_diag(msg) -> None:
        for st in msg.status:
            if st.name == "robot_wm/trust_monitor":
                diag.clear()
                diag.update({kv.key: kv.value for kv in st.values})

    def describe(s) -> str:
        level = TrustLevel(s.level).name if s.level in iter(TrustLevel) else str(s.level)
        phase = Phase(s.phase).name if s.phase in iter(Phase) else str(s.phase)
        line = (f"trust: {level:<8} phase {phase:<5} score {s.score:.2f}  error {s.normalized_error:.3g} "
                f"(threshold {s.threshold:.3g})  reason: {s.reason}")
        if "phase_minutes" in diag:
            rate = float(diag.get("phase_success_rate", "nan"))
            line += (f"\n  phase evidence: {float(diag['phase_minutes']):.1f} min operated, "
                     f"{diag.get('phase_episodes', '?')} episodes ({rate:.0%} success), mean score "
                     f"{float(diag.get('phase_mean_score', 'nan')):.2f}, {diag.get('phase_anomalies', '?')} anomalies "
                     f"({diag.get('phase_file', '')}); `robot-wm trust promote` says what is still missing")
        if "payload" in diag:  # the filter's tare as the effort model takes it (`robot-wm tare` declares a payload)
            line += f"\n  payload: {diag['payload']}"
        return line

    return _watch(TrustState, "/robot_wm/trust", describe,
                  "no /robot_wm/trust: is the stack up with its trust monitor? (`robot-wm up`)", seconds, timeout_s,
                  also=[(DiagnosticArray, "/diagnostics", on_diag)], settle_s=1.2)
