"""CommandWatchdog: stop the ros2_control arm when the hardware command stream goes silent.

On the ros2_control path the safety filter publishes joint velocities on
/forward_velocity_controller/commands, and ``velocity_controllers/JointGroupVelocityController``
holds the last one it got for as long as it stays active: it has no command timeout
(ros-controls/ros2_controllers#95). If the safety filter dies mid-motion, the arm keeps moving.
This module is the pure logic of a small watchdog process (``robot_wm.nodes.command_watchdog``)
that, when no command has arrived for ``timeout_s``, asks the controller manager to DEACTIVATE the
velocity controller (its ``on_deactivate`` writes 0.0 to every velocity command interface) and,
if configured, to activate stopping controllers in the same switch.

States (``WatchdogState``)::

    WAITING  ──first command──────────────────►  ARMED
    ARMED    ──silence > timeout_s────────────►  TRIPPED (latched; the stop is sent and retried)
    TRIPPED  ──operator rearm (rules below)───►  REARMING (one activation request)
    REARMING ──controller manager ok──────────►  ARMED
    REARMING ──not ok, no answer or silence───►  TRIPPED (the stop is sent again)

* WAITING: no command has arrived since start. The watchdog does not trip: ros2_controllers'
  ForwardControllersBase::update() writes nothing to the hardware until the first message after
  activation arrives (its command buffer is reset in on_activate and on_deactivate), so the
  velocity interfaces keep the value they already had — what the hardware initialised them to at
  start-up (hardware-specific), or the 0.0 JointGroupVelocityController wrote at its last
  deactivation. Nothing of ours is being held; tripping would only stop a controller that never
  forwarded a command. (A driver that initialises velocity commands to something other than zero
  is unsafe with any controller; that is the driver's own start-up to fix.)
* ARMED: commands arrive; a gap of more than ``timeout_s`` (receipt times, monotonic clock) trips.
* TRIPPED: latched. The stop request (deactivate the velocity controller, activate the stopping
  controllers) is sent at once and retried until the controller manager answers ok, the pause
  doubling from ``retry_interval_s`` up to ``retry_interval_max_s``; every attempt's result is
  reported. The watchdog never re-activates on its own.
* REARMING: an operator's rearm was accepted: one activation request is in flight. ok → ARMED;
  ok=false, no answer, or silence again → TRIPPED, and the stop is sent again (an activation that
  the controller manager performed after we gave up on it is undone).

A rearm is refused unless the watchdog is TRIPPED, the stop has been confirmed, the stream is alive
again (a command within ``timeout_s``) and the newest ``rearm_zero_commands`` commands are all
exactly zero (a restarted safety filter starts latched and streams zeros).

Self-stall guard: on a loaded machine the watchdog's own process can stall for longer than
``timeout_s``; its check may then run before the executor has handed it the commands that arrived
meanwhile. A check that finds silence right after such a stall (the previous check more than
``stall_tolerance_s`` ago) defers the decision to the next check, once.

No rclpy here: time is passed in (seconds on a monotonic clock) and switch requests are returned
as plain objects that the node sends.
"""
from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Sequence

#: SwitchController strictness values (controller_manager_msgs/srv/SwitchController).
BEST_EFFORT = 1
STRICT = 2
STRICTNESS_NAMES = {BEST_EFFORT: "BEST_EFFORT", STRICT: "STRICT"}


class WatchdogConfigError(ValueError):
    """A watchdog setting is out of range or inconsistent; the message names the parameter."""


class WatchdogState(enum.IntEnum):
    """Where the watchdog stands (see the module docstring)."""

    WAITING = 0
    ARMED = 1
    TRIPPED = 2
    REARMING = 3


@dataclasses.dataclass(frozen=True)
class WatchdogConfig:
    """Settings of one watchdog (the node's parameters, in SI units).

    Args:
        timeout_s: silence longer than this trips the watchdog, s.
        check_period_s: how often the silence is checked, s (at most ``timeout_s`` / 2).
        retry_interval_s: pause after the first failed stop attempt, s; it doubles after each
            further failure up to ``retry_interval_max_s``.
        retry_interval_max_s: the longest pause between two stop attempts, s.
        answer_timeout_s: an attempt that got no answer within this counts as failed, s.
        rearm_zero_commands: a rearm needs this many newest commands to be exactly zero.
        velocity_controller: the controller that forwards the commands (deactivated on a trip).
        stop_controllers: controllers activated together with the deactivation (may be empty).
        strictness: BEST_EFFORT (1) or STRICT (2), as in SwitchController.
        activate_asap: SwitchController's activate_asap.
        switch_timeout_s: SwitchController's timeout: how long the controller manager may wait for
            its update loop to perform the switch, s.
        stall_tolerance_s: a check more than this after the previous one follows a stall of the
            watchdog itself and defers a trip once, s (None: ``timeout_s`` / 2, at least twice
            ``check_period_s``).
    """

    timeout_s: float = 0.05
    check_period_s: float = 0.005
    retry_interval_s: float = 0.1
    retry_interval_max_s: float = 0.5
    answer_timeout_s: float = 1.0
    rearm_zero_commands: int = 10
    velocity_controller: str = "forward_velocity_controller"
    stop_controllers: tuple[str, ...] = ()
    strictness: int = BEST_EFFORT
    activate_asap: bool = False
    switch_timeout_s: float = 0.5
    stall_tolerance_s: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop_controllers", tuple(self.stop_controllers))
        if self.stall_tolerance_s is None:
            object.__setattr__(self, "stall_tolerance_s", max(self.timeout_s / 2.0, 2.0 * self.check_period_s))
        self.validate()

    def validate(self) -> None:
        """Check every setting.

        Raises:
            WatchdogConfigError: naming the first bad setting, its value and what was expected.
        """
        def positive(name: str, lo: float, hi: float) -> None:
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and lo <= value <= hi):
                raise WatchdogConfigError(f"{name}={value!r}: expected a number of seconds in [{lo:g}, {hi:g}]")

        positive("timeout_s", 0.001, 60.0)
        positive("check_period_s", 0.0005, 1.0)
        positive("retry_interval_s", 0.001, 60.0)
        positive("retry_interval_max_s", 0.001, 60.0)
        if self.retry_interval_max_s < self.retry_interval_s:
            raise WatchdogConfigError(
                f"retry_interval_max_s={self.retry_interval_max_s:g} s is shorter than retry_interval_s="
                f"{self.retry_interval_s:g} s")
        positive("answer_timeout_s", 0.01, 600.0)
        positive("switch_timeout_s", 0.0, 600.0)
        positive("stall_tolerance_s", 0.0005, 60.0)
        if self.check_period_s > self.timeout_s / 2.0:
            raise WatchdogConfigError(
                f"check_period_s={self.check_period_s:g} s must be at most timeout_s / 2 = {self.timeout_s / 2.0:g} s "
                "(else a silence is noticed up to a whole check period late)")
        if not (isinstance(self.rearm_zero_commands, int) and 1 <= self.rearm_zero_commands <= 100_000):
            raise WatchdogConfigError(
                f"rearm_zero_commands={self.rearm_zero_commands!r}: expected an integer in [1, 100000]")
        if self.strictness not in STRICTNESS_NAMES:
            raise WatchdogConfigError(
                f"strictness={self.strictness!r}: expected {BEST_EFFORT} (BEST_EFFORT) or {STRICT} (STRICT); "
                "AUTO (3) and FORCE_AUTO (4) are declared by SwitchController but not implemented by the "
                "controller manager (ros-controls/ros2_control#2900)")
        names = (self.velocity_controller, *self.stop_controllers)
        for where, name in zip(("velocity_controller", *["stop_controllers"] * len(self.stop_controllers)), names):
            if not isinstance(name, str) or not name or any(c.isspace() or c == "/" for c in name):
                raise WatchdogConfigError(f"{where}: {name!r} is not a controller name (non-empty, no spaces or '/')")
        if self.velocity_controller in self.stop_controllers:
            raise WatchdogConfigError(
                f"stop_controllers contains velocity_controller {self.velocity_controller!r}: a trip cannot both "
                "deactivate and activate it")
        if len(set(self.stop_controllers)) != len(self.stop_controllers):
            raise WatchdogConfigError(f"stop_controllers {list(self.stop_controllers)} names a controller twice")


@dataclasses.dataclass(frozen=True)
class SwitchRequest:
    """One SwitchController call the node is to make.

    Args:
        request_id: identifies the answer (``switch_answered``).
        kind: "stop" (after a trip) or "rearm" (an operator's rearm).
        attempt: 1 for the first attempt of this kind since the trip or the rearm.
        activate: controllers to activate.
        deactivate: controllers to deactivate.
        strictness, activate_asap, timeout_s: SwitchController's fields.
    """

    request_id: int
    kind: str
    attempt: int
    activate: tuple[str, ...]
    deactivate: tuple[str, ...]
    strictness: int
    activate_asap: bool
    timeout_s: float

    def describe(self) -> str:
        """A one-line summary for logs."""
        parts = []
        if self.deactivate:
            parts.append("deactivate " + ", ".join(self.deactivate))
        if self.activate:
            parts.append("activate " + ", ".join(self.activate))
        return f"{self.kind} attempt {self.attempt}: " + "; ".join(parts) + f" ({STRICTNESS_NAMES[self.strictness]})"


@dataclasses.dataclass(frozen=True)
class WatchdogEvent:
    """Something the node should log: ``level`` is "info", "warning" or "error"."""

    level: str
    text: str


@dataclasses.dataclass
class _InFlight:
    request: SwitchRequest
    sent_s: float


class CommandWatchdog:
    """The watchdog's state machine; feed it commands, ticks, answers and rearm requests.

    Args:
        config: the settings (validated).
    """

    def __init__(self, config: WatchdogConfig) -> None:
        config.validate()
        self.config = config
        self.state = WatchdogState.WAITING
        self.revision = 0  # bumped on every change a status display should show at once
        self.commands = 0
        self.trips = 0
        self.stop_confirmed = False
        self.stop_attempts = 0
        self.last_result = ""
        self.last_trip_gap_s: float | None = None
        self._last_rx_s: float | None = None
        self._zero_run = 0
        self._last_tick_s: float | None = None
        self.longest_check_gap_s = 0.0  # the longest time between two checks: how stalled the watchdog itself was
        self._deferred = False
        self._next_id = 1
        self._in_flight: _InFlight | None = None
        self._next_attempt_s = 0.0
        self._rearm_due = False
        self._rearm_attempts = 0
        self._stop_confirmed_by = 0  # id of the stop request whose ok confirmed the stop
        self._given_up: set[int] = set()  # rearm requests abandoned before their answer
        self._events: list[WatchdogEvent] = []

    # ---- inputs
    def command(self, now_s: float, data: Sequence[float]) -> None:
        """Record one command as received.

        Args:
            now_s: receipt time, monotonic clock, s.
            data: the command's values (any length; only used to judge "all zero" for a rearm).
        """
        self.commands += 1
        self._last_rx_s = now_s
        zero = len(data) > 0 and all(v == 0.0 for v in data)  # NaN != 0.0: a NaN is not zero
        self._zero_run = self._zero_run + 1 if zero else 0
        if self.state is WatchdogState.WAITING:
            self._set_state(WatchdogState.ARMED)
            self._emit("info", "first command received: armed")

    def tick(self, now_s: float) -> SwitchRequest | None:
        """Check the silence and the pending request; return a request to send now, if any.

        Args:
            now_s: current time, monotonic clock, s.
        Returns:
            The SwitchRequest to send now, or None.
        """
        previous, self._last_tick_s = self._last_tick_s, now_s
        if previous is not None:
            self.longest_check_gap_s = max(self.longest_check_gap_s, now_s - previous)
        stalled = previous is not None and now_s - previous > self.config.stall_tolerance_s
        if self.state in (WatchdogState.ARMED, WatchdogState.REARMING) and self._silent(now_s):
            if stalled and not self._deferred:
                self._deferred = True  # let the executor hand over what arrived during our own stall
                self._emit("warning", f"watchdog itself stalled {now_s - previous:.3f} s; "
                                      "checking once more before tripping")
            else:
                self._trip(now_s)
        else:
            self._deferred = False
        if self._in_flight is not None and now_s - self._in_flight.sent_s > self.config.answer_timeout_s:
            request = self._in_flight.request
            self._in_flight = None
            self._failed(request, f"no answer within {self.config.answer_timeout_s:g} s", now_s)
        if self.state is WatchdogState.REARMING and self._rearm_due:
            self._rearm_due = False
            return self._send(self._rearm_request(), now_s)
        if self.state is WatchdogState.TRIPPED and not self.stop_confirmed and self._in_flight is None \
                and now_s >= self._next_attempt_s:
            self.stop_attempts += 1
            return self._send(self._stop_request(), now_s)
        return None

    def switch_answered(self, request_id: int, ok: bool, message: str, now_s: float) -> None:
        """Take the controller manager's answer (or a failure to call it) for one request.

        Args:
            request_id: the answered SwitchRequest's id.
            ok: SwitchController's ``ok``.
            message: SwitchController's ``message``.
            now_s: current time, monotonic clock, s.
        """
        if self._in_flight is None or self._in_flight.request.request_id != request_id:
            # an answer to a request we already gave up on: only an activation matters
            if ok and request_id in self._given_up:
                self._given_up.discard(request_id)
                self._late_activation(request_id, now_s)
            return
        request = self._in_flight.request
        self._in_flight = None
        if not ok:
            self._failed(request, f"controller manager answered not ok: {message!r}", now_s)
            return
        self.last_result = f"{request.describe()}: ok" + (f" ({message})" if message else "")
        if request.kind == "stop":
            self.stop_confirmed = True
            self._stop_confirmed_by = request.request_id
            self._emit("warning", f"{self.last_result}; arm stopped, latched until rearm")
            self._bump()
        elif self.state is WatchdogState.REARMING:
            self._set_state(WatchdogState.ARMED)
            self._emit("info", f"{self.last_result}; rearmed")

    def switch_failed(self, request_id: int, why: str, now_s: float) -> None:
        """The call for one request could not be made or failed without an answer.

        Args:
            request_id: the SwitchRequest's id.
            why: what went wrong (e.g. the service is not available).
            now_s: current time, monotonic clock, s.
        """
        if self._in_flight is None or self._in_flight.request.request_id != request_id:
            return
        request = self._in_flight.request
        self._in_flight = None
        self._failed(request, why, now_s)

    def rearm(self, now_s: float) -> tuple[bool, str]:
        """An operator asks to re-activate the velocity controller.

        Args:
            now_s: current time, monotonic clock, s.
        Returns:
            (accepted, message). Accepted: the next ``tick`` returns the activation request; the
            state becomes ARMED once the controller manager confirms it.
        """
        ok, why = self._rearm_refusal(now_s)
        if not ok:
            self._emit("warning", f"rearm refused: {why}")
            return False, f"rearm refused: {why}"
        self._rearm_attempts += 1
        self._rearm_due = True  # the next tick sends the activation
        self._set_state(WatchdogState.REARMING)
        text = (f"rearm accepted: activating {self.config.velocity_controller}"
                + (f", deactivating {', '.join(self.config.stop_controllers)}" if self.config.stop_controllers else "")
                + "; ARMED once the controller manager confirms")
        self._emit("warning", text)
        return True, text

    def drain_events(self) -> list[WatchdogEvent]:
        """Return and forget what happened since the last call (for the node's log)."""
        events, self._events = self._events, []
        return events

    # ---- status
    def last_command_age_s(self, now_s: float) -> float | None:
        """Seconds since the newest command was received (None before the first)."""
        return None if self._last_rx_s is None else now_s - self._last_rx_s

    @property
    def zero_run(self) -> int:
        """How many of the newest commands in a row are exactly zero."""
        return self._zero_run

    @property
    def in_flight(self) -> SwitchRequest | None:
        """The request waiting for its answer, if any."""
        return None if self._in_flight is None else self._in_flight.request

    def summary(self, now_s: float) -> dict[str, str]:
        """Key/values for /diagnostics."""
        age = self.last_command_age_s(now_s)
        return {
            "state": self.state.name,
            "stop_confirmed": str(self.stop_confirmed).lower(),
            "last_command_age_s": "none" if age is None else f"{age:.3f}",
            "commands_received": str(self.commands),
            "zero_commands_in_a_row": str(self._zero_run),
            "trips": str(self.trips),
            "stop_attempts": str(self.stop_attempts),
            "last_trip_gap_s": "none" if self.last_trip_gap_s is None else f"{self.last_trip_gap_s:.3f}",
            "last_switch_result": self.last_result or "none",
            "longest_check_gap_s": f"{self.longest_check_gap_s:.3f}",
            "timeout_s": f"{self.config.timeout_s:g}",
            "velocity_controller": self.config.velocity_controller,
            "stop_controllers": ",".join(self.config.stop_controllers),
            "strictness": STRICTNESS_NAMES[self.config.strictness],
        }

    def message(self) -> str:
        """One line saying where the watchdog stands, for /diagnostics."""
        if self.state is WatchdogState.WAITING:
            return "waiting for the first command"
        if self.state is WatchdogState.ARMED:
            return "armed: commands arriving"
        if self.state is WatchdogState.REARMING:
            return "rearming: waiting for the controller manager to activate the velocity controller"
        if self.stop_confirmed:
            return "TRIPPED: command stream stopped; velocity controller deactivated; latched until rearm"
        return (f"TRIPPED: command stream stopped; stopping the arm (attempt {self.stop_attempts} so far: "
                f"{self.last_result or 'none yet'})")

    # ---- internals
    def _silent(self, now_s: float) -> bool:
        return self._last_rx_s is not None and now_s - self._last_rx_s > self.config.timeout_s

    def _trip(self, now_s: float) -> None:
        gap = now_s - self._last_rx_s
        was = self.state
        self.trips += 1
        self.last_trip_gap_s = gap
        self._deferred = False
        self._abandon_in_flight()
        self.stop_confirmed = False
        self.stop_attempts = 0
        self._next_attempt_s = now_s  # the first stop attempt goes out in this very tick
        self._set_state(WatchdogState.TRIPPED)
        self._emit("error", f"TRIPPED ({'while rearming' if was is WatchdogState.REARMING else 'armed'}): "
                            f"no command for {gap:.3f} s (timeout {self.config.timeout_s:g} s); stopping the arm")

    def _restop(self, now_s: float) -> None:
        self._abandon_in_flight()
        self.stop_confirmed = False
        self.stop_attempts = 0
        self._next_attempt_s = now_s
        self._set_state(WatchdogState.TRIPPED)
        self._bump()

    def _failed(self, request: SwitchRequest, why: str, now_s: float) -> None:
        self.last_result = f"{request.describe()}: FAILED, {why}"
        if request.kind == "stop":
            delay = min(self.config.retry_interval_s * 2.0 ** (request.attempt - 1), self.config.retry_interval_max_s)
            self._next_attempt_s = now_s + delay
            self._emit("error", f"{self.last_result}; retrying in {delay:g} s")
            self._bump()
        else:
            self._given_up.add(request.request_id)
            self._emit("error", f"{self.last_result}; stays latched, stopping again to undo any partial activation")
            self._restop(now_s)

    def _late_activation(self, request_id: int, now_s: float) -> None:
        # Requests reach the controller manager in the order they were sent: a stop sent after this
        # activation (a higher id) undoes it, whether it is still in flight or already confirmed.
        undone_by_flight = (self._in_flight is not None and self._in_flight.request.kind == "stop"
                            and self._in_flight.request.request_id > request_id)
        undone_by_confirmed = self.stop_confirmed and self._stop_confirmed_by > request_id
        if self.state is WatchdogState.TRIPPED and (undone_by_flight or undone_by_confirmed):
            self._emit("warning", f"late ok for abandoned activation request {request_id}: "
                                  "already undone by a later stop")
            return
        self._emit("error", f"late ok for abandoned activation request {request_id}: the velocity controller was "
                            "activated after the watchdog gave up on it; stopping again")
        self._restop(now_s)

    def _abandon_in_flight(self) -> None:
        if self._in_flight is not None and self._in_flight.request.kind == "rearm":
            self._given_up.add(self._in_flight.request.request_id)
        self._in_flight = None
        self._rearm_due = False

    def _rearm_refusal(self, now_s: float) -> tuple[bool, str]:
        if self.state is WatchdogState.WAITING:
            return False, "nothing to rearm: no command has arrived yet and the watchdog never tripped"
        if self.state is WatchdogState.ARMED:
            return False, "nothing to rearm: the watchdog is armed (not tripped)"
        if self.state is WatchdogState.REARMING:
            return False, "a rearm is already in progress"
        if not self.stop_confirmed:
            return False, ("the controller manager has not confirmed the stop yet "
                           f"({self.stop_attempts} attempt(s); last: {self.last_result or 'none'})")
        age = self.last_command_age_s(now_s)
        if age is None or age > self.config.timeout_s:
            return False, ("the command stream is not alive: "
                           + ("no command yet" if age is None else f"the newest command is {age:.3f} s old")
                           + f" (must be within timeout_s={self.config.timeout_s:g} s)")
        n = self.config.rearm_zero_commands
        if self._zero_run < n:
            return False, (f"the newest commands are not all exactly zero: {self._zero_run} zero command(s) in a row, "
                           f"{n} needed (a restarted safety filter streams zeros until its own reset)")
        return True, ""

    def _stop_request(self) -> SwitchRequest:
        return SwitchRequest(
            self._take_id(), "stop", self.stop_attempts, activate=tuple(self.config.stop_controllers),
            deactivate=(self.config.velocity_controller,), strictness=self.config.strictness,
            activate_asap=self.config.activate_asap, timeout_s=self.config.switch_timeout_s)

    def _rearm_request(self) -> SwitchRequest:
        return SwitchRequest(
            self._take_id(), "rearm", self._rearm_attempts, activate=(self.config.velocity_controller,),
            deactivate=tuple(self.config.stop_controllers), strictness=self.config.strictness,
            activate_asap=self.config.activate_asap, timeout_s=self.config.switch_timeout_s)

    def _send(self, request: SwitchRequest, now_s: float) -> SwitchRequest:
        self._in_flight = _InFlight(request, now_s)  # its result is logged when it comes
        return request

    def _take_id(self) -> int:
        request_id, self._next_id = self._next_id, self._next_id + 1
        return request_id

    def _set_state(self, state: WatchdogState) -> None:
        if state is not self.state:
            self.state = state
            self._bump()

    def _bump(self) -> None:
        self.revision += 1

    def _emit(self, level: str, text: str) -> None:
        self._events.append(WatchdogEvent(level, text))
