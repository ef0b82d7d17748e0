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
teardown), a backup that needs no GIL is armed one second after the deadline: faulthandler's C thread
writes ``Timeout (0:00:0...)!`` and the stacks, and a POSIX timer of the C library's own
(``timer_create`` with ``SIGEV_THREAD``) calls ``_exit`` with the same code as above a quarter second
later (:class:`NativeExit`, with a kernel-delivered SIGKILL half a second behind it should the C
library fail to start that thread; where there is no such timer, faulthandler exits 1 itself). The
backup is not armed during held stages, and :meth:`StopWatchdog.finish` re-arms it at ``2 * grace_s``
for what is left (the runner's atexit handlers, robot_wm.nodes.runner.exit_process), exiting 1 then:
a stop stuck after its teardown did not end cleanly.
"""
from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator

STOP_GRACE_S = 3.0  # from the first SIGINT/SIGTERM to a forced exit (ros2 launch escalates after 5 s)
_START = {0, int(signal.SIGINT), int(signal.SIGTERM)}  # wakeup-fd bytes that start the clock (0: begin())
_STDERR = 2  # by descriptor: no Python-level lock a stuck main thread might hold
_BACKUP_STACKS_S = 1.0  # after the deadline: faulthandler writes the stacks ...
_BACKUP_EXIT_S = 1.25  # ... and the native timer exits (launch escalates 5 s after its SIGINT)


class _SigEvent(ctypes.Structure):  # struct sigevent (Linux, 64 bytes): value, signo, notify, thread fn, attr
    _fields_ = [("value", ctypes.c_void_p), ("signo", ctypes.c_int), ("notify", ctypes.c_int),
                ("function", ctypes.c_void_p), ("attributes", ctypes.c_void_p), ("_pad", ctypes.c_int * 8)]


class _TimeSpec(ctypes.Structure):
    _fields_ = [("sec", ctypes.c_long), ("nsec", ctypes.c_long)]


class _ITimerSpec(ctypes.Structure):
    _fields_ = [("interval", _TimeSpec), ("value", _TimeSpec)]


class NativeExit:
    """``_exit(code)`` after a delay, called by a thread of the C library's own: a POSIX timer
    (``timer_create``, ``SIGEV_THREAD``) whose notify function is ``_exit`` and whose value is the
    code. No Python runs on the way, so it ends a process whose main thread waits in C code holding
    the GIL, with the code the watchdog chose (faulthandler's own exit can only say 1).

    That thread is started by the C library when the timer expires; should it fail to start one (a
    process out of threads or memory), nothing would call ``_exit``. So a second timer, delivered by
    the kernel itself (``SIGEV_SIGNAL`` with SIGKILL), ends the process ``kill_after_s`` later: no
    code of the process runs for that one, and the exit is "killed by SIGKILL" (-9 to a parent).
    ``available`` is False where the C library has no such timer; :meth:`arm` then returns False.
    """

    _CLOCK_MONOTONIC, _SIGEV_SIGNAL, _SIGEV_THREAD = 1, 0, 2

    def __init__(self, kill_after_s: float = 0.5) -> None:
        self._timer: ctypes.c_void_p | None = None
        self._code: int | None = None
        self._kill_timer: ctypes.c_void_p | None = None
        self.kill_after_s = float(kill_after_s)
        self.available = False
        if not sys.platform.startswith("linux") or ctypes.sizeof(ctypes.c_void_p) != 8:
            return  # the struct layout above is 64-bit Linux's
        for name in (None, "librt.so.1"):  # glibc >= 2.34 has the timers in libc itself
            try:
                lib = ctypes.CDLL(name, use_errno=True)
                create, settime, delete, exit_fn = lib.timer_create, lib.timer_settime, lib.timer_delete, lib._exit
            except (OSError, AttributeError):
                continue
            create.argtypes = [ctypes.c_int, ctypes.POINTER(_SigEvent), ctypes.POINTER(ctypes.c_void_p)]
            settime.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(_ITimerSpec), ctypes.c_void_p]
            delete.argtypes = [ctypes.c_void_p]
            self._create, self._settime, self._delete = create, settime, delete
            self._exit_fn = ctypes.cast(exit_fn, ctypes.c_void_p).value
            self.available = True
            return

    def arm(self, after_s: float, code: int) -> bool:
        """From now, ``_exit(code)`` in ``after_s`` seconds and SIGKILL ``kill_after_s`` after that
        (replacing what was armed); False if the ``_exit`` timer cannot be."""
        if not self.available:
            return False
        if self._timer is not None and self._code != code:
            self._delete(self._timer)
            self._timer = None
        if self._timer is None:
            event = _SigEvent(value=code, notify=self._SIGEV_THREAD, function=self._exit_fn)
            timer = ctypes.c_void_p()
            if self._create(self._CLOCK_MONOTONIC, ctypes.byref(event), ctypes.byref(timer)) != 0:
                self.cancel()  # no kill left armed for the old code's deadline: faulthandler exits instead
                return False
            self._timer, self._code = timer, code
        if self._kill_timer is None:
            event = _SigEvent(signo=int(signal.SIGKILL), notify=self._SIGEV_SIGNAL)
            timer = ctypes.c_void_p()
            if self._create(self._CLOCK_MONOTONIC, ctypes.byref(event), ctypes.byref(timer)) == 0:
                self._kill_timer = timer
        if self._kill_timer is not None:  # (without it the thread timer still works: not a reason to fail)
            self._settime(self._kill_timer, 0, ctypes.byref(_after(after_s + self.kill_after_s)), None)
        return self._settime(self._timer, 0, ctypes.byref(_after(after_s)), None) == 0

    def cancel(self) -> None:
        if self._kill_timer is not None:  # the kill first: it must never outlive the _exit it backs up
            self._delete(self._kill_timer)
            self._kill_timer = None
        if self._timer is not None:
            self._delete(self._timer)
            self._timer = self._code = None


def _after(seconds: float) -> _ITimerSpec:
    """A one-shot expiry ``seconds`` from now (at least 1 ns: 0 would disarm the timer)."""
    ns = max(int(seconds * 1e9), 1)
    return _ITimerSpec(value=_TimeSpec(ns // 1_000_000_000, ns % 1_000_000_000))


class _Outcome:
    """A StopWatchdog attribute that decides a forced exit's code, kept in ``_<name>``; setting it goes
    through ``_set_outcome`` (under the lock, re-arming an armed backup)."""

    def __init__(self, kind: type, doc: str) -> None:
        self.kind, self.__doc__ = kind, doc

    def __set_name__(self, owner: type, name: str) -> None:
        self.field = f"_{name}"

    def __get__(self, obj, owner=None):
        return self if obj is None else getattr(obj, self.field)

    def __set__(self, obj, value) -> None:
        obj._set_outcome(self.field, self.kind(value))


class StopWatchdog:
    """See the module docstring. Create it in the main thread; ``finish()`` when the teardown is done.

    Args:
        name: the process, as the messages name it.
        grace_s: the time a stop gets before a forced exit, from the signal or the end of a held stage.
    """

    def __init__(self, name: str, grace_s: float = STOP_GRACE_S) -> None:
        self.name, self.grace_s = name, float(grace_s)
        self.stage = "starting"
        self._code, self._failed, self._duties_done = 0, False, False
        self._held = False
        self._native = NativeExit()
        self._backup_armed = False
        self._t_stop: float | None = None
        self._deadline: float | None = None
        self._lock = threading.Lock()
        self._finished = threading.Event()
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)
        self._previous_fd = signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        self._thread = threading.Thread(target=self._watch, name="robot_wm-stop-watchdog", daemon=True)
        self._thread.start()

    # What a forced exit says (see _Outcome): setting one re-arms an armed backup with the new exit code.
    code = _Outcome(int, "What the runner will return; a forced exit keeps a nonzero one.")
    failed = _Outcome(bool, "An exception is on its way out, or a before_shutdown failed.")
    duties_done = _Outcome(bool, "Every before_shutdown ran and returned.")

    def _set_outcome(self, field: str, value) -> None:
        with self._lock:
            setattr(self, field, value)
            if self._backup_armed and not self._finished.is_set():
                self._arm_backup()

    def exit_code(self) -> int:
        """The code a forced exit uses now."""
        return self._code or (1 if self._failed or not self._duties_done else 0)

    @contextlib.contextmanager
    def held(self, stage: str) -> Iterator[None]:
        """A stage the clock never ends (creating the nodes, a before_shutdown); a stop under way
        gets ``grace_s`` from its end at least."""
        with self._lock:
            self.stage, self._held = stage, True
            self._cancel_backup()
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
            if self._deadline is not None:  # past the teardown only atexit handlers run: stuck there is a failure
                self._arm_backup(2 * self.grace_s, after_teardown=True)
            else:
                self._cancel_backup()
            self._finished.set()
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

    def _arm_backup(self, after_s: float | None = None, after_teardown: bool = False) -> None:  # with the lock held
        """Stacks at ``after_s`` (default: a second past the deadline), ``_exit`` a quarter second later
        (with at least 1 ``after_teardown``)."""
        if after_s is None:
            after_s = max(self._deadline - time.monotonic(), 0.0) + _BACKUP_STACKS_S
        code = max(self.exit_code(), 1) if after_teardown else self.exit_code()
        native = self._native.arm(after_s + _BACKUP_EXIT_S - _BACKUP_STACKS_S, code)
        faulthandler.dump_traceback_later(after_s, exit=not native, file=_STDERR)
        self._backup_armed = True

    def _cancel_backup(self) -> None:  # with the lock held
        faulthandler.cancel_dump_traceback_later()
        self._native.cancel()
        self._backup_armed = False

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
        code = self.exit_code()
        done = "done" if self._duties_done else "NOT done"
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


__all__ = ["STOP_GRACE_S", "NativeExit", "StopWatchdog"]
