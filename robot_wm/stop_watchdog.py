"""StopWatchdog: a process's stop ends in bounded time, and says where it was stuck when it would not.

Why: Fast DDS can deadlock while a process destroys its readers and writers as its peers stop at
the same moment (eProsima/Fast-DDS#6193: "about 1 in 10 start/stop cycles", the main thread waiting
in ``ResourceEvent::unregister_timer``). Such a process ignores SIGINT and SIGTERM until ``ros2
launch`` sends SIGKILL 15 s later; CI saw it once in ``state_publisher``.

How: a Python signal handler runs only once the main thread is back in the interpreter, so the
signal is also taken from ``signal.set_wakeup_fd`` by a daemon thread. That thread starts the clock
even while the main thread waits in C++. Only SIGINT, SIGTERM and :meth:`StopWatchdog.begin` start
it; a driver's own SIGUSR1 or SIGALRM handler does not. When ``grace_s`` has passed, the stage the
stop is in and every thread's stack go to stderr and the process exits:

- with the code the runner would have returned when that is not 0 (a configuration error: 2);
- 1 when an exception was on its way out, or a ``before_shutdown`` failed or never ran;
- 0 when every ``before_shutdown`` duty was done (the filter's zero command, the driver's
  ``bring_to_rest``): what was left was freeing middleware resources, and the message says so.

Held stages are never cut short: creating the nodes (a model still loading) and each
``before_shutdown`` (a driver's controlled stop of a real arm takes what it takes; launch's SIGKILL
still bounds it). The watchdog says it is waiting, and the next stage gets a full ``grace_s``.

A main thread that waits in C++ *holding* the GIL starves the watchdog thread. So whenever the
clock runs (started by that thread, or by :meth:`StopWatchdog.begin` in the main thread before any
teardown), faulthandler's C thread backs it up one second after the deadline (its ``Timeout
(0:00:0...)!``, the stacks, exit 1). It is not armed during held stages, and
:meth:`StopWatchdog.finish` re-arms it to bound the interpreter's own exit at ``2 * grace_s``.
"""
from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import threading
import time
from collections.abc import Iterator

STOP_GRACE_S = 3.0  # from the first SIGINT/SIGTERM to a forced exit (ros2 launch escalates after 5 s)
_START = {0, int(signal.SIGINT), int(signal.SIGTERM)}  # wakeup-fd bytes that start the clock (0: begin())
_STDERR = 2  # by descriptor: no Python-level lock a stuck main thread might hold


class StopWatchdog:
    """See the module docstring. Create it in the main thread; ``finish()`` when the teardown is done.

    Args:
        name: the process, as the messages name it.
        grace_s: the time a stop gets before a forced exit, from the signal or the end of a held stage.
    """

    def __init__(self, name: str, grace_s: float = STOP_GRACE_S) -> None:
        self.name, self.grace_s = name, float(grace_s)
        self.stage = "starting"
        self.code = 0  # what the runner will return; a forced exit keeps a nonzero one
        self.failed = False  # an exception is on its way out, or a before_shutdown failed
        self.duties_done = False  # every before_shutdown ran and returned
        self._held = False
        self._t_stop: float | None = None
        self._deadline: float | None = None
        self._lock = threading.Lock()
        self._finished = threading.Event()
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)
        self._previous_fd = signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        self._thread = threading.Thread(target=self._watch, name="robot_wm-stop-watchdog", daemon=True)
        self._thread.start()

    @contextlib.contextmanager
    def held(self, stage: str) -> Iterator[None]:
        """A stage the clock never ends (creating the nodes, a before_shutdown); a stop under way
        gets ``grace_s`` from its end at least."""
        with self._lock:
            self.stage, self._held = stage, True
            faulthandler.cancel_dump_traceback_later()
        try:
            yield
        finally:
            with self._lock:
                self._held = False
                if self._deadline is not None:
                    self._deadline = max(self._deadline, time.monotonic() + self.grace_s)
                    self._arm_backup()

    def enter(self, stage: str) -> None:
        """The stop (or the run) goes on in ``stage``, which the clock bounds."""
        with self._lock:
            self.stage = stage

    def begin(self) -> None:
        """The stop has begun, signal or not (a configuration error, an external shutdown, an
        exception): the clock starts here unless the signal started it already."""
        with self._lock:
            self._start_clock()
        if self._write_fd >= 0:
            try:
                os.write(self._write_fd, b"\0")
            except OSError:  # full of signal bytes: the watchdog is awake already
                pass

    def finish(self) -> None:
        """The teardown is done; bound what is left of a stop (the interpreter's own exit) at ``2 * grace_s``."""
        with self._lock:
            self._finished.set()
            if self._deadline is not None:
                faulthandler.dump_traceback_later(2 * self.grace_s, exit=True, file=_STDERR)
            else:
                faulthandler.cancel_dump_traceback_later()
        signal.set_wakeup_fd(self._previous_fd)
        if self._write_fd >= 0:
            os.close(self._write_fd)  # a watchdog still waiting for a stop reads the end of the pipe
            self._write_fd = -1

    def _start_clock(self) -> None:  # with the lock held
        if self._deadline is None and not self._finished.is_set():
            self._t_stop = time.monotonic()
            self._deadline = self._t_stop + self.grace_s
            if not self._held:
                self._arm_backup()

    def _arm_backup(self) -> None:  # with the lock held
        faulthandler.dump_traceback_later(max(self._deadline - time.monotonic(), 0.0) + 1.0, exit=True, file=_STDERR)

    def _watch(self) -> None:
        while True:
            byte = os.read(self._read_fd, 1)
            if not byte:  # finish() without a stop under way (after a stop the process is ending: left open)
                os.close(self._read_fd)
                return
            if byte[0] in _START:
                break
        with self._lock:
            if self._finished.is_set():
                return
            self._start_clock()
        while True:
            with self._lock:
                held, remaining = self._held, self._deadline - time.monotonic()
                if not held and remaining <= 0:
                    self._forced_exit()
            if self._finished.wait(self.grace_s if held else remaining):
                return
            if self._held:
                _say(f"[robot_wm] {self.name}: still {self.stage} {self._since():.1f} s after the stop began; "
                     "waiting for it\n")

    def _since(self) -> float:
        return time.monotonic() - (self._t_stop or time.monotonic())

    def _forced_exit(self) -> None:  # with the lock held: no stage change from here on
        if self._finished.is_set():
            return
        code = self.code or (1 if self.failed or not self.duties_done else 0)
        done = "done" if self.duties_done else "NOT done"
        _say(f"[robot_wm] {self.name}: stop stuck {self._since():.1f} s after it began, while {self.stage}; "
             f"exiting {code} (before_shutdown duties {done}). Thread stacks:\n")
        try:
            faulthandler.dump_traceback(file=_STDERR, all_threads=True)
        except (OSError, RuntimeError):  # stderr gone: exit all the same
            pass
        os._exit(code)


def _say(text: str) -> None:
    """To stderr by descriptor, never raising (a reader that is gone must not stop the watchdog)."""
    try:
        os.write(_STDERR, text.encode())
    except OSError:
        pass


__all__ = ["STOP_GRACE_S", "StopWatchdog"]
