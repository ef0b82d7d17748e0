"""command_watchdog: stop the ros2_control arm when the safety filter's command stream stops.

A thin rclpy adapter around :class:`robot_wm.core.command_watchdog.CommandWatchdog` (the states,
the latch and the rearm rules are documented there). It runs as its own process, so it survives
the safety filter it watches:

* subscribes to ``command_topic`` (std_msgs/Float64MultiArray, the filter's hardware command);
* when nothing arrives for ``timeout_s``, calls ``<controller_manager>/switch_controller``
  (controller_manager_msgs/srv/SwitchController) to deactivate ``velocity_controller``
  (JointGroupVelocityController writes 0.0 to every velocity command interface when deactivated)
  and to activate ``stop_controllers``; retried until the controller manager answers ok (the pause
  doubles from ``retry_interval_s`` up to ``retry_interval_max_s``), every attempt's result logged;
* latched: only ``~/rearm`` (std_srvs/Trigger, i.e. /command_watchdog/rearm) re-activates the
  velocity controller, and only while the stream is alive again and its newest
  ``rearm_zero_commands`` commands are exactly zero;
* status on /diagnostics (``robot_wm/command_watchdog``) every ``diagnostics_period_s`` and on
  every change.

No callback exception ends the process: each is caught, logged once with its traceback, counted
on /diagnostics, and the latch is kept.
"""
from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from typing import Any

from controller_manager_msgs.srv import SwitchController
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rclpy.context import Context
from rclpy.node import Node
from rclpy.qos import QoSProfile, ReliabilityPolicy
from std_msgs.msg import Float64MultiArray
from std_srvs.srv import Trigger

from robot_wm.core.command_watchdog import (
    CommandWatchdog,
    SwitchRequest,
    WatchdogConfig,
    WatchdogConfigError,
    WatchdogState,
)
from robot_wm.nodes.params import declare
from robot_wm.nodes.runner import NodeConfigError, main_for

_LEVELS = {
    WatchdogState.WAITING: DiagnosticStatus.OK,
    WatchdogState.ARMED: DiagnosticStatus.OK,
    WatchdogState.REARMING: DiagnosticStatus.WARN,
    WatchdogState.TRIPPED: DiagnosticStatus.ERROR,
}
_LATE_ANSWER_KEEP_S = 30.0  # futures of abandoned requests are watched this long for a late answer


class CommandWatchdogNode(Node):
    """Deactivate the velocity controller through the controller manager when commands stop."""

    def __init__(self, context: Context | None = None, node_name: str = "command_watchdog") -> None:
        super().__init__(node_name, context=context)
        self.command_topic = declare(
            self, "command_topic", "/forward_velocity_controller/commands",
            "watched hardware command topic (std_msgs/Float64MultiArray, rad/s)", read_only=True)
        cm = declare(self, "controller_manager", "/controller_manager",
                     "controller manager node whose switch_controller service stops the arm", read_only=True)
        velocity_controller = declare(
            self, "velocity_controller", "forward_velocity_controller",
            "controller deactivated on a trip and re-activated by rearm", read_only=True)
        stop_controllers = declare(
            self, "stop_controllers", [""],
            "controllers activated in the same switch as the deactivation ([] or ['']: none)", read_only=True)
        timeout_s = declare(self, "timeout_s", 0.05, "no command for longer than this trips the watchdog (s)",
                            range_=(0.005, 5.0), read_only=True)
        check_period_s = declare(self, "check_period_s", 0.005,
                                 "how often the silence is checked (s), at most timeout_s/2",
                                 range_=(0.001, 0.5), read_only=True)
        retry_interval_s = declare(self, "retry_interval_s", 0.1,
                                   "pause after a first failed stop attempt (s); doubles per failure",
                                   range_=(0.01, 10.0), read_only=True)
        retry_interval_max_s = declare(self, "retry_interval_max_s", 0.5,
                                       "longest pause between two stop attempts (s), >= retry_interval_s",
                                       range_=(0.01, 60.0), read_only=True)
        answer_timeout_s = declare(self, "answer_timeout_s", 1.0,
                                   "a switch_controller call unanswered this long counts as failed (s)",
                                   range_=(0.05, 60.0), read_only=True)
        switch_timeout_s = declare(self, "switch_timeout_s", 0.5,
                                   "SwitchController.timeout: how long the controller manager may wait for its "
                                   "update loop to switch (s; 0: the controller manager's default)",
                                   range_=(0.0, 30.0), read_only=True)
        strictness = declare(self, "strictness", 1,
                             "SwitchController.strictness: 1 BEST_EFFORT (default) or 2 STRICT (AUTO and FORCE_AUTO "
                             "are not implemented by the controller manager)", range_=(1, 2), read_only=True)
        activate_asap = declare(self, "activate_asap", False,
                                "SwitchController.activate_asap for the controllers a switch activates", read_only=True)
        rearm_zeros = declare(self, "rearm_zero_commands", 10,
                              "rearm needs this many newest commands to be exactly zero (count)",
                              range_=(1, 10000), read_only=True)
        diag_period_s = declare(self, "diagnostics_period_s", 1.0, "/diagnostics period (s)",
                                range_=(0.1, 60.0), read_only=True)
        stops = tuple(s for s in (stop_controllers or []) if s != "")
        try:
            config = WatchdogConfig(
                timeout_s=timeout_s, check_period_s=check_period_s, retry_interval_s=retry_interval_s,
                retry_interval_max_s=retry_interval_max_s,
                answer_timeout_s=answer_timeout_s, rearm_zero_commands=rearm_zeros,
                velocity_controller=velocity_controller, stop_controllers=stops, strictness=strictness,
                activate_asap=activate_asap, switch_timeout_s=switch_timeout_s)
        except WatchdogConfigError as exc:
            raise NodeConfigError(f"{node_name}: parameter {exc}") from exc
        if not cm.startswith("/") or cm.endswith("/") or any(c.isspace() for c in cm):
            raise NodeConfigError(f"{node_name}: parameter controller_manager={cm!r}: expected an absolute node name "
                                  "such as /controller_manager")
        self.watchdog = CommandWatchdog(config)
        self.service_name = f"{cm}/switch_controller"
        self._client = self.create_client(SwitchController, self.service_name)
        self._futures: dict[int, tuple[Any, float]] = {}  # request id -> (future, sent at, monotonic s)
        self._reported: set[str] = set()
        self._cm_reachable: bool | None = None  # None: not checked yet
        self.callback_errors = 0
        self._published_revision = -1
        self._diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        qos = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
        self.create_subscription(Float64MultiArray, self.command_topic, self._on_command, qos)
        self.create_service(Trigger, "~/rearm", self._on_rearm)
        self.create_timer(check_period_s, lambda: self._guarded("tick", self._tick))
        self.create_timer(diag_period_s, lambda: self._guarded("diagnostics", self._publish_diagnostics))
        self.create_timer(0.2, lambda: self._guarded("reachability", self._check_reachable))
        self.get_logger().info(
            f"command watchdog up: watching {self.command_topic}, timeout {timeout_s:g} s; on silence "
            f"{self.service_name} deactivates {velocity_controller}"
            + (f" and activates {', '.join(stops)}" if stops else "") + "; waiting for the first command")
        self._publish_diagnostics()

    # ---- callbacks (each guarded: an exception is logged once and the process keeps running)
    def _guarded(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception:  # noqa: BLE001 - a watchdog must outlive its own bugs; the latch is kept
            self.callback_errors += 1
            if name not in self._reported:
                self._reported.add(name)
                self.get_logger().error(
                    f"callback {name!r} raised; the watchdog keeps running with its state (and latch) unchanged; "
                    f"further errors of this callback are only counted on /diagnostics:\n{traceback.format_exc()}")
            return None

    def _on_command(self, msg: Float64MultiArray) -> None:
        # Arrival is judged by receipt time on the monotonic clock. (The publisher's source
        # timestamp would need a (msg, info) callback, which rclpy's EventsExecutor of the Kilted
        # wheels fails on with "SystemError: null argument to internal routine".)
        now = time.monotonic()
        self._guarded("command", self._command, now, msg)

    def _command(self, now: float, msg: Float64MultiArray) -> None:
        self.watchdog.command(now, msg.data)
        self._after_core(now)

    def _tick(self) -> None:
        now = time.monotonic()
        self._poll_answers(now)
        request = self.watchdog.tick(now)
        if request is not None:
            self._send(request, now)
        self._after_core(now)

    def _check_reachable(self) -> None:
        """Log each change of whether the controller manager's switch service is discovered: an
        operator must know when a trip could not stop the arm."""
        ready = bool(self._client.service_is_ready())
        if ready == self._cm_reachable:
            return
        self._cm_reachable = ready
        if ready:
            self.get_logger().info(f"controller manager reachable: {self.service_name} is available")
        else:
            self.get_logger().warning(
                f"controller manager NOT reachable: {self.service_name} is not available; a trip now would "
                "retry its stop until the service appears")
        self._publish_diagnostics()

    def _on_rearm(self, request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
        result = self._guarded("rearm", self._rearm)
        if result is None:
            response.success, response.message = False, "rearm failed inside the watchdog (see its log); still latched"
        else:
            response.success, response.message = result
        return response

    def _rearm(self) -> tuple[bool, str]:
        now = time.monotonic()
        result = self.watchdog.rearm(now)
        self._after_core(now)
        return result

    # ---- switch_controller calls
    def _send(self, request: SwitchRequest, now: float) -> None:
        if not self._client.service_is_ready():
            self.watchdog.switch_failed(request.request_id, f"service {self.service_name} is not available", now)
            return
        msg = SwitchController.Request()
        msg.activate_controllers = list(request.activate)
        msg.deactivate_controllers = list(request.deactivate)
        msg.strictness = int(request.strictness)
        msg.activate_asap = bool(request.activate_asap)
        sec = int(request.timeout_s)
        msg.timeout.sec, msg.timeout.nanosec = sec, int(round((request.timeout_s - sec) * 1e9))
        self._futures[request.request_id] = (self._client.call_async(msg), now)

    def _poll_answers(self, now: float) -> None:
        for request_id, (future, sent_s) in list(self._futures.items()):
            if future.done():
                del self._futures[request_id]
                exc = future.exception()
                if exc is not None:
                    self.watchdog.switch_failed(request_id, f"call failed: {exc!r}", now)
                else:
                    result = future.result()
                    self.watchdog.switch_answered(request_id, bool(result.ok), str(result.message), now)
            elif now - sent_s > _LATE_ANSWER_KEEP_S:
                del self._futures[request_id]
                self._client.remove_pending_request(future)

    # ---- output
    def _after_core(self, now: float) -> None:
        log = self.get_logger()
        for event in self.watchdog.drain_events():
            # one call site per severity: rclpy refuses a call site whose severity changes
            if event.level == "error":
                log.error(event.text)
            elif event.level == "warning":
                log.warning(event.text)
            else:
                log.info(event.text)
        if self.watchdog.revision != self._published_revision:
            self._publish_diagnostics(now)

    def _publish_diagnostics(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self._published_revision = self.watchdog.revision
        status = DiagnosticStatus(name="robot_wm/command_watchdog", hardware_id="ros2_control")
        status.level = _LEVELS[self.watchdog.state]
        status.message = self.watchdog.message()
        values = self.watchdog.summary(now)
        values["callback_errors"] = str(self.callback_errors)
        values["command_topic"] = self.command_topic
        values["switch_service"] = self.service_name
        values["switch_service_available"] = {None: "unknown", True: "true", False: "false"}[self._cm_reachable]
        status.values = [KeyValue(key=k, value=v) for k, v in values.items()]
        msg = DiagnosticArray(status=[status])
        msg.header.stamp = self.get_clock().now().to_msg()
        self._diag_pub.publish(msg)

    def before_shutdown(self) -> None:
        """Called by the runner before the node is destroyed: say in which state the watchdog stops."""
        self.get_logger().info(f"command watchdog shutting down in state {self.watchdog.state.name}")


main = main_for(CommandWatchdogNode)

if __name__ == "__main__":
    main()
