"""Run rclpy nodes with a clean, fast shutdown on SIGINT and SIGTERM.

rclpy's default signal handling raises inside ``spin`` (a traceback on Ctrl-C) and ignores
SIGTERM; a node killed that way can linger and leave Fast DDS shared-memory segments behind.
Here both signals set a flag, the executor loop notices it within ``_POLL_S`` and every node and
the context are destroyed in order, so the process exits 0 with no traceback.

A stop is bounded: from the first signal the process has ``STOP_GRACE_S`` (3 s) to finish, less than
the 5 s after which ``ros2 launch`` escalates to SIGTERM and SIGKILL (robot_wm.stop_watchdog). The
teardown ends by freeing the DDS participant itself, and the entry points then leave by
:func:`exit_process`, without the interpreter's finalization (where a finished stop was seen to hang).

Executor: rclpy's EventsExecutor (``rclpy.experimental``; its dispatch loop is C++) by default —
it spends about a third of the SingleThreadedExecutor's CPU per callback (bench/bench_control_path.py),
which on a loaded 2-core machine decides whether a 100 Hz control period is on time. Set
``ROBOT_WM_EXECUTOR=single`` to run with the SingleThreadedExecutor instead.
"""
from __future__ import annotations

import atexit
import contextlib
import gc
import inspect
import os
import signal
import sys
import threading
import traceback
import weakref
from collections.abc import Callable, Sequence
from typing import NoReturn

import rclpy
from rclpy.context import Context
from rclpy.executors import Executor, ExternalShutdownException, SingleThreadedExecutor
from rclpy.experimental import EventsExecutor
from rclpy.node import Node
from rclpy.signals import SignalHandlerOptions

from robot_wm.realtime import apply_realtime
from robot_wm.rosenv import apply_loopback_dds
from robot_wm.stop_watchdog import StopWatchdog

_POLL_S = 0.05  # how often the spin loop checks the stop flag (bounds shutdown latency)


class NodeConfigError(ValueError):
    """A node was started with a bad parameter, file or model; the message says which and why."""


EXECUTORS = ("events", "single")


def make_executor(context: Context, kind: str | None = None) -> Executor:
    """The executor of a robot_wm process: ``kind`` or $ROBOT_WM_EXECUTOR, "events" (default) or "single"."""
    kind = kind or os.environ.get("ROBOT_WM_EXECUTOR", "events")
    if kind not in EXECUTORS:
        raise NodeConfigError(f"ROBOT_WM_EXECUTOR={kind!r}: expected one of {EXECUTORS}")
    return EventsExecutor(context=context) if kind == "events" else SingleThreadedExecutor(context=context)


class SpinThread:
    """Spin ``executor`` on a daemon thread until :meth:`stop`: the observers and fakes that tests,
    benchmarks and tools run next to the graph (a robot_wm process spins in :func:`run_nodes`).

    ``start=False`` lets the caller create its subscriptions first; ``timeout_s`` bounds how long
    :meth:`stop` waits for the spin loop to notice."""

    def __init__(self, executor: Executor, timeout_s: float = 0.05, start: bool = True) -> None:
        self.executor, self.timeout_s = executor, float(timeout_s)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._spin, daemon=True)
        if start:
            self.start()

    def start(self) -> None:
        self._thread.start()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def _spin(self) -> None:
        while not self._stop.is_set():
            self.executor.spin_once(timeout_sec=self.timeout_s)

    def stop(self, join_s: float = 2.0) -> None:
        """Stop spinning and wait up to ``join_s`` for the thread (a no-op if it never started)."""
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(timeout=join_s)


NodeFactory = Callable[[Context], Node]


def run_nodes(factories: Sequence[NodeFactory], args: list[str] | None = None, executor_kind: str | None = None,
              shared_memory: bool = True) -> int:
    """Create the nodes, spin them in one executor until SIGINT/SIGTERM, then tear down cleanly.

    Args:
        factories: callables taking the rclpy Context and returning a Node.
        args: command-line arguments (``--ros-args ...``); None uses sys.argv.
        executor_kind: "events" or "single" for this process whatever $ROBOT_WM_EXECUTOR says (a node
            whose callbacks take ``MessageInfo``: rclpy's EventsExecutor cannot hand it over).
        shared_memory: False keeps this process off Fast DDS's shared memory (UDP on loopback alone,
            ``rosenv``): for a process whose death must not hold up the others.
    Returns:
        Process exit code: 0 on a clean stop, 2 on a configuration error. The caller ends the process
        with it (:func:`exit_process`): from here the stop's backup ends it ``2 * STOP_GRACE_S`` later
        in any case, so this is for a process's entry point, not for running nodes inside another program.
    """
    apply_loopback_dds(shared_memory=shared_memory)
    context = Context()
    rclpy.init(args=args, context=context, signal_handler_options=SignalHandlerOptions.NO)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    nodes: list[Node] = []
    code = 0
    try:
        executor = make_executor(context, executor_kind)
    except NodeConfigError as exc:
        print(f"[robot_wm] configuration error: {exc}", file=sys.stderr)
        rclpy.shutdown(context=context)
        return 2
    watchdog = StopWatchdog(os.path.basename(sys.argv[0]) or "robot_wm")
    try:
        with watchdog.held("creating the nodes"):
            for factory in factories:
                node = factory(context)
                nodes.append(node)
                executor.add_node(node)
            _realtime(nodes)
        watchdog.enter("spinning")
        while not stop.is_set() and context.ok():
            executor.spin_once(timeout_sec=_POLL_S)
    except NodeConfigError as exc:
        print(f"[robot_wm] configuration error: {exc}", file=sys.stderr)
        code = watchdog.code = 2
    except ExternalShutdownException:
        pass
    except BaseException:
        watchdog.failed = True  # the exception goes on out; a forced exit must not say 0
        raise
    finally:
        watchdog.begin()
        try:
            if not _before_shutdown(nodes, watchdog):
                code = watchdog.code = code or 1
            refs = _weak_refs(nodes)  # (their names: a destroyed node cannot say its own)
            for node in reversed(nodes):
                watchdog.enter(f"destroying node {node.get_name()}")
                executor.remove_node(node)
                node.destroy_node()
            watchdog.enter("shutting down the executor and the rclpy context")
            executor.shutdown(timeout_sec=1.0)
            if context.ok():
                rclpy.shutdown(context=context)
            # Handles in reference cycles keep an rcl node, and with it the DDS participant and its shared
            # memory, until a collection: free them here, where the watchdog bounds it (exit_process skips
            # the interpreter's finalization, which would otherwise do it).
            watchdog.enter("freeing the DDS participant")
            nodes.clear()
            node = executor = None
            gc.collect()
            context.destroy()
            # (an exception on its way out holds, through its traceback and the executor's task, the node
            # whose callback raised: the run failed anyway, and its traceback says where)
            if sys.exc_info()[1] is None:
                with contextlib.suppress(OSError, ValueError):  # a closed stderr must not fail a finished stop
                    _warn_kept(refs)
        except BaseException:
            watchdog.failed = True
            raise
        finally:
            watchdog.finish()
            # The process is stopping: ignore further SIGINT/SIGTERM until it has exited. On Ctrl-C under
            # `ros2 launch` a node gets SIGINT twice (from the terminal's process group, then forwarded by
            # launch), and the interpreter's finalization puts the default handlers back in place of
            # Python ones, so a second signal then would kill the process (exit -2, "process has died").
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, signal.SIG_IGN)
    return code


def _weak_refs(nodes: list[Node]) -> list[tuple[str, weakref.ref]]:
    """(name, weak reference) of each node, for :func:`_warn_kept`."""
    refs = []
    for n in nodes:
        with contextlib.suppress(TypeError):  # a class with __slots__ and no __weakref__: not checked
            refs.append((n.get_name(), weakref.ref(n)))
    return refs


def _warn_kept(refs: list[tuple[str, weakref.ref]]) -> None:
    """Say which nodes survived the teardown's collection, and what holds them: such a node, and what
    it holds (its publishers, timers, a driver's device), is never freed by this process, whose exit
    skips the interpreter's finalization. The usual causes: a module global, or a thread still
    running one of its methods."""
    here = inspect.currentframe()
    for name, ref in refs:
        node = ref()
        if node is None:
            continue
        holders = sorted({_holder(r) for r in gc.get_referrers(node) if r is not here})
        del node
        print(f"[robot_wm] node {name!r} is still referenced after the teardown (by {', '.join(holders) or 'C code'}): "
              "it and what it holds are never freed", file=sys.stderr)


def _holder(referrer) -> str:
    """A referrer as a person can find it: a module by name, a frame by function and line."""
    if inspect.isframe(referrer):
        code = referrer.f_code
        return f"frame of {code.co_name} ({os.path.basename(code.co_filename)}:{referrer.f_lineno})"
    if isinstance(referrer, dict) and "__builtins__" in referrer and "__name__" in referrer:
        return f"module {referrer['__name__']}"
    return type(referrer).__name__


def _before_shutdown(nodes: list[Node], watchdog: StopWatchdog) -> bool:
    """Run every node's ``before_shutdown`` (last created first); False if one failed (each is said)."""
    ok = True
    for node in reversed(nodes):
        hook = getattr(node, "before_shutdown", None)
        if hook is None:
            continue
        try:
            with watchdog.held(f"running {node.get_name()}'s before_shutdown"):
                hook()
        except BaseException:  # noqa: BLE001 - said; the other nodes' duties and the teardown still run
            ok, watchdog.failed = False, True
            print(f"[robot_wm] {node.get_name()}: before_shutdown failed:", file=sys.stderr)
            traceback.print_exc()
    watchdog.duties_done = ok
    return ok


def _realtime(nodes: list[Node]) -> None:
    """SCHED_FIFO for the whole process when a node asks for it (``realtime_priority``, the highest wins)."""
    priority = max((int(getattr(n, "realtime_priority", 0) or 0) for n in nodes), default=0)
    if priority > 0 and nodes:
        applied, text = apply_realtime(priority)
        log = nodes[0].get_logger()
        (log.info if applied else log.warning)(text)


def exit_process(code: int) -> NoReturn:
    """End a node process with ``code`` once :func:`run_nodes` has returned (its teardown is done).

    What a normal interpreter exit still does after the teardown is free memory and run C++ static
    destructors (Fast DDS's factories, its threads), and that is where a finished stop was seen to hang
    until SIGKILL (CI: trust_monitor, faulthandler's ``Timeout (0:00:06)!`` with no Python frame left,
    the family of eProsima/Fast-DDS#6193). Nothing there is the robot's: the teardown destroyed the
    nodes and then freed the DDS participant with its shared memory (the last rmw node's destruction
    deletes it; run_nodes' last stage collects the cycles that kept one alive). So the atexit handlers
    run (a driver may close its device in one), stdout and stderr are flushed, and the process leaves
    by ``os._exit``. Not done, unlike a normal exit: waiting for non-daemon threads (a driver stops
    its threads in ``before_shutdown``) and flushing other open Python files (close them there too).
    The stop's backup bounds the atexit handlers (exit 1 after ``2 * STOP_GRACE_S``).
    """
    try:
        atexit._run_exitfuncs()  # each handler's exception is printed by atexit itself
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed pipe or stream: nothing more can be said on it
                pass
        os._exit(code)


def main_for(node_cls: type[Node], executor_kind: str | None = None,
             shared_memory: bool = True) -> Callable[[list[str] | None], None]:
    """Return a ``main(args=None)`` entry point that runs ``node_cls`` alone (``executor_kind``,
    ``shared_memory``: see run_nodes)."""

    def main(args: list[str] | None = None) -> None:
        exit_process(run_nodes([lambda ctx: node_cls(context=ctx)], args, executor_kind, shared_memory))

    main.shared_memory = shared_memory  # type: ignore[attr-defined]  (what the tests check)
    return main
