"""Every node and `robot-wm up` stop by themselves on SIGINT and SIGTERM, before the stop watchdog
would end them (STOP_GRACE_S, 3 s; ros2 launch escalates after 5 s; unloaded it takes well under
2 s): exit 0, no traceback, no leftover processes, no leftover Fast DDS shared-memory segments."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from robot_wm import graph
from robot_wm.process_group import command_for
from robot_wm.stop_watchdog import STOP_GRACE_S

from conftest import PYTHON, wait_for

pytestmark = pytest.mark.ros
SHM = Path("/dev/shm")


def _fastdds_segments() -> set[str]:
    return {p.name for p in SHM.iterdir() if "fastdds" in p.name} if SHM.is_dir() else set()


def _mapped_shm() -> set[str]:
    """/dev/shm files some live process has mapped (other test runs may hold segments of their own)."""
    mapped = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            text = maps.read_text()
        except OSError:  # the process ended meanwhile, or is not ours to read
            continue
        mapped.update(line.rsplit("/", 1)[-1] for line in text.splitlines() if "/dev/shm/" in line)
    return mapped


def _is_port_mutex(name: str) -> bool:
    """A Fast DDS port's named semaphore: shared by every participant that writes to the port (the
    readiness probe below writes to the program's ports), owned by none of them, and left by Fast
    DDS for the port's next user; the program's own segments are what this test checks."""
    return name.startswith("sem.fastdds_port") and name.endswith("_mutex")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purposes
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


def _children_of(pid: int) -> list[int]:
    kids = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        children = task / "children"
        if children.exists():
            kids += [int(x) for x in children.read_text().split()]
    return kids


SPECS = {s.name: s for s in graph.plan("mujoco", enable=True) + graph.plan("mujoco", composed=True, enable=True)
         if not s.needs_ros_install}
ARM = SPECS["arm_sim"]
# What each program publishes once it runs: readiness is judged by messages arriving, not by log
# lines (a lifecycle node with no input yet publishes nothing: its lifecycle state is asked instead).
JOINTS = ("topic", "/joint_states", "sensor_msgs.msg", "JointState")
STATUS = ("topic", "/robot_wm/safety_status", "robot_wm.msg", "SafetyStatus")
GOAL = ("topic", "/robot_wm/goal", "geometry_msgs.msg", "PointStamped")
PROGRAMS = {
    "arm_sim node": (command_for(ARM), JOINTS),
    "safety_filter node": (command_for(SPECS["safety_filter"]), STATUS),
    "policy node": (command_for(SPECS["policy"]), ("lifecycle", "policy")),
    "world_model node": (command_for(SPECS["world_model"]), ("lifecycle", "world_model")),
    "goal_sequencer node": (command_for(SPECS["goal_sequencer"]), GOAL),
    "control_stack (composed)": (command_for(SPECS["control_stack"]), STATUS),
    "robot-wm sim": ([PYTHON, "-m", "robot_wm.cli", "sim"], JOINTS),
    "robot-wm up": ([PYTHON, "-m", "robot_wm.cli", "up"], STATUS),
    "robot-wm up --composed": ([PYTHON, "-m", "robot_wm.cli", "up", "--composed"], STATUS),
}


class Ready:
    """Waits until a program runs: N messages on its topic, or its lifecycle node is active."""

    def __init__(self, how) -> None:
        import importlib

        import rclpy
        from rclpy.context import Context
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.node import Node

        # a context of its own, shut down before the program is signalled: its DDS participant and
        # shared-memory segments are gone when the test looks for segments the program left behind
        self.context = Context()
        rclpy.init(context=self.context)
        context = self.context
        self.node = Node("shutdown_probe", context=context)
        self.executor = SingleThreadedExecutor(context=context)
        self.executor.add_node(self.node)
        self.count = 0
        self.how = how
        if how[0] == "topic":
            msg_type = getattr(importlib.import_module(how[2]), how[3])
            self.node.create_subscription(msg_type, how[1], self._on_msg, 10)
        else:
            from lifecycle_msgs.srv import GetState

            self.client = self.node.create_client(GetState, f"/{how[1]}/get_state")

    def _on_msg(self, _msg) -> None:
        self.count += 1

    def _active(self) -> bool:
        from lifecycle_msgs.srv import GetState

        if not self.client.service_is_ready():
            return False
        future = self.client.call_async(GetState.Request())
        self.executor.spin_until_future_complete(future, timeout_sec=1.0)
        return future.done() and future.result().current_state.label == "active"

    def wait(self, proc, messages: int, timeout_s: float) -> bool:
        """True once the program runs (``messages`` received, or active for ``messages`` polls)."""
        deadline = time.monotonic() + timeout_s
        polls = 0
        while time.monotonic() < deadline and proc.process.poll() is None:
            self.executor.spin_once(timeout_sec=0.05)
            if self.how[0] == "lifecycle":
                polls += self._active()
                if polls >= 3:
                    return True
            elif self.count >= messages:
                return True
        return False

    def close(self) -> None:
        import rclpy

        self.executor.remove_node(self.node)
        self.node.destroy_node()
        self.executor.shutdown(timeout_sec=1.0)
        rclpy.shutdown(context=self.context)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("program", list(PROGRAMS))
def test_clean_exit_on_signal(spawn, program, sig):
    cmd, how = PROGRAMS[program]
    # the probe first: the segments of its own DDS participant exist before the snapshot, so none of
    # them (e.g. its port's semaphore, which Fast DDS leaves for the next user) counts as the program's
    ready = Ready(how)
    before = _fastdds_segments()
    proc = spawn(cmd)
    try:
        # running: timers firing, participants discovered (20 messages of its own, or active)
        assert ready.wait(proc, 20, 60.0), f"{program} never ran (or exited early):\n{proc.output()}"
    finally:
        ready.close()
    descendants = _children_of(proc.pid)
    t0 = time.monotonic()
    proc.process.send_signal(sig)
    # by itself, before the watchdog would end it (its backup 1.25 s later still counts as stuck): a loaded CI
    # machine once took more than 2 s to tear an arm_sim down after SIGINT
    try:
        code = proc.process.wait(timeout=STOP_GRACE_S + 2.0)
    except Exception:  # noqa: BLE001 - report what is still running, then let the fixture kill it
        pytest.fail(f"{program} still running {STOP_GRACE_S + 2.0:g} s after {sig.name}:\n{proc.output()}")
    took = time.monotonic() - t0
    out = proc.output()
    assert "stop stuck" not in out, f"{program}: the stop watchdog ended it {took:.1f} s after {sig.name}:\n{out}"
    assert code == 0, f"{program} exited {code} after {sig.name}:\n{out}"
    assert "Traceback" not in out and "RCLError" not in out, out
    assert "still referenced" not in out, out  # every node was freed by the teardown's collection
    assert took < STOP_GRACE_S, f"{program} took {took:.1f} s after {sig.name}"
    assert wait_for(lambda: not any(_alive(p) for p in descendants), 1.0), f"left running: {descendants}"
    # orphans: segments that appeared during the run and that no live process still maps
    leftover = {s for s in (_fastdds_segments() - before) - _mapped_shm() if not _is_port_mutex(s)}
    assert not leftover, f"shared-memory segments left behind: {sorted(leftover)}"


def test_up_stops_the_graph_when_a_node_dies(spawn):
    proc = spawn([PYTHON, "-m", "robot_wm.cli", "up"])
    assert wait_for(lambda: len(_children_of(proc.pid)) >= 4 or proc.process.poll() is not None, 60.0, 0.05)
    children = _children_of(proc.pid)
    assert children
    os.kill(children[0], signal.SIGKILL)
    assert wait_for(lambda: proc.process.poll() is not None, 5.0), proc.output()
    assert proc.process.returncode == 1
    assert "exited" in proc.output()


def test_up_refuses_ros2_control_hardware_without_ros_install(spawn):
    proc = spawn([PYTHON, "-m", "robot_wm.cli", "up", "--hardware", "mock"])
    assert wait_for(lambda: proc.process.poll() is not None, 30.0)
    assert proc.process.returncode == 2
    assert "ros2 launch robot_wm bringup.launch.py hardware:=mock" in proc.output()


def test_bad_profile_is_a_clear_configuration_error(spawn, tmp_path):
    proc = spawn([PYTHON, "-m", "robot_wm.cli", "sim", "--profile", str(tmp_path / "missing.yaml")])
    assert wait_for(lambda: proc.process.poll() is not None, 30.0)
    out = proc.output()
    assert proc.process.returncode == 2, out
    assert "configuration error" in out and "missing.yaml" in out
    assert "Traceback" not in out



def _stuck(spawn, kind: str):
    proc = spawn([PYTHON, str(Path(__file__).with_name("stuck_node.py")), kind])
    assert wait_for(lambda: "ready" in proc.output() or proc.process.poll() is not None, 60.0), proc.output()
    assert proc.process.poll() is None, proc.output()
    return proc


def _stopped(proc, sig=signal.SIGINT, timeout_s: float = 30.0) -> tuple[int, float, str]:
    """(exit code, seconds from the signal, output); the test fails if the process is still running."""
    t0 = time.monotonic()
    proc.process.send_signal(sig)
    try:
        code = proc.process.wait(timeout=timeout_s)  # without the watchdog, a stuck stop: never
    except Exception:  # noqa: BLE001 - report, then let the fixture kill it
        pytest.fail(f"still running {timeout_s:g} s after {sig.name}:\n{proc.output()}")
    return code, time.monotonic() - t0, proc.output()


@pytest.mark.parametrize("kind, code, says", [
    ("destroy", 0, "while destroying node stuck_destroy; exiting 0 (before_shutdown duties done)"),
    ("callback", 1, "while spinning; exiting 1 (before_shutdown duties NOT done)"),
    ("gil", 0, "Timeout (0:00:0"),
    ("gil_bare", 0, "Timeout (0:00:0"),
    ("free_hang", 0, "Timeout (0:00:0"),
])
def test_a_stop_that_hangs_still_ends_before_launch_escalates(spawn, kind, code, says):
    """A node stuck in its teardown (a DDS deadlock, a callback that never returns, C code holding
    the GIL) exits by itself after the stop grace period, printing where it was stuck and every
    thread's stack: exit 0 only when its before_shutdown duties were done."""
    got, took, out = _stopped(_stuck(spawn, kind))
    assert got == code, out
    assert says in out, out
    assert "most recent call first" in out and "stuck_node.py" in out, out  # the stacks say where
    assert took >= 3.0, out  # the grace period is given in full
    if kind in ("destroy", "gil", "free_hang"):
        assert "before_shutdown ran" in out, out


@pytest.mark.parametrize("kind", ["slow_rest", "gil_rest"])
def test_a_slow_before_shutdown_is_waited_for_not_cut_short(spawn, kind):
    """A driver's controlled stop may outlast the grace period, in Python or in C code that holds
    the GIL: it runs to its end, and the teardown after it gets the full grace period."""
    got, took, out = _stopped(_stuck(spawn, kind))
    assert got == 0 and "before_shutdown ran" in out, out
    assert took >= 5.5, out
    assert "stop stuck" not in out and "Timeout" not in out and "most recent call first" not in out, out
    assert "still referenced" not in out, out  # nothing keeps an ordinary node past its teardown
    if kind == "slow_rest":  # (the watchdog's thread cannot say it while C code holds the GIL)
        assert "still running slow_rest's before_shutdown" in out and "waiting for it" in out, out


def test_a_failing_before_shutdown_is_reported_and_the_stop_still_completes(spawn):
    got, took, out = _stopped(_stuck(spawn, "raising_rest"))
    assert got == 1, out
    assert "raising_rest: before_shutdown failed" in out and "brake controller not answering" in out, out
    assert "stop stuck" not in out and "waiting for it" not in out, out


def test_an_exit_that_would_hang_after_a_finished_stop_leaves_at_once_with_0(spawn):
    """The teardown is done, then the interpreter's own exit would hang in C code holding the GIL (what a
    Fast DDS static destructor did in CI, ``Timeout (0:00:06)!``, exit 1): the process leaves with 0 right
    after its atexit handlers ran, and never reaches that code."""
    got, _, out = _stopped(_stuck(spawn, "exit_hang"))
    assert got == 0, out
    assert "atexit ran" in out, out
    assert "Timeout" not in out and "most recent call first" not in out and "stop stuck" not in out, out


_NATIVE = """
import ctypes, sys, time
from robot_wm.stop_watchdog import NativeExit
n = NativeExit()
assert n.available
def deadlock():  # a plain mutex locked twice, holding the GIL: no signal or Python thread ends this wait
    lock, m = ctypes.PyDLL(None).pthread_mutex_lock, ctypes.create_string_buffer(64)
    lock(m); lock(m)
"""


@pytest.mark.parametrize("script, code", [
    ("n.arm(0.3, 7); deadlock()", 7),
    ("n.arm(0.3, 7); n.arm(0.3, 5); deadlock()", 5),  # re-armed with another code: the last one counts
    ("n.arm(0.3, 7); n.cancel(); time.sleep(1.2); print('alive')", 0),  # past the kill's 0.8 s too
], ids=["fires", "rearmed", "cancelled"])
def test_the_native_exit_ends_a_process_holding_the_gil_with_the_code_it_was_given(script, code):
    done = subprocess.run([PYTHON, "-c", _NATIVE + script], capture_output=True, text=True, timeout=60)
    assert done.returncode == code, done
    assert ("alive" in done.stdout) == (code == 0), done


def test_a_node_kept_alive_past_its_teardown_is_named_with_what_holds_it(spawn):
    """A node that a module global keeps survives the teardown's collection, so nothing ever frees it
    (the process leaves without the interpreter's finalization): the stop says so, naming the holder."""
    got, _, out = _stopped(_stuck(spawn, "kept"))
    assert got == 0, out
    assert "node 'kept' is still referenced after the teardown (by module __main__)" in out, out
    assert "stop stuck" not in out, out


def test_a_run_ended_by_a_callbacks_exception_exits_1_with_its_traceback_and_no_kept_node_warning(spawn):
    proc = _stuck(spawn, "raising")
    assert wait_for(lambda: proc.process.poll() is not None, 30.0), proc.output()
    out = proc.output()
    assert proc.process.returncode == 1, out
    assert "RuntimeError: encoder read failed" in out, out
    assert "still referenced" not in out and "stop stuck" not in out, out


def test_the_kernels_sigkill_ends_the_process_when_the_native_exit_thread_does_not():
    """Should the C library fail to start the timer's thread (a process out of threads), the second
    timer, delivered by the kernel, still ends the process: here the thread's function is a harmless
    ``getpid`` instead of ``_exit``, and SIGKILL comes ``kill_after_s`` later."""
    script = ("n._exit_fn = ctypes.cast(ctypes.CDLL(None).getpid, ctypes.c_void_p).value\n"
              "print('armed at', time.monotonic(), flush=True); n.arm(0.3, 7); deadlock()")
    done = subprocess.run([PYTHON, "-c", _NATIVE + script], capture_output=True, text=True, timeout=60)
    ended = time.monotonic()  # CLOCK_MONOTONIC: the same clock in both processes
    assert done.returncode == -signal.SIGKILL, done
    armed = float(done.stdout.split("armed at")[1].split()[0])
    assert ended - armed >= 0.8, done  # 0.3 s, then the kill 0.5 s behind the _exit that never came


def test_an_atexit_handler_that_never_returns_ends_the_process_with_1(spawn):
    """Past the teardown only the atexit handlers run; one stuck there is bounded at 2 x the grace
    period, and the exit says the stop did not end cleanly."""
    got, took, out = _stopped(_stuck(spawn, "atexit_hang"))
    assert got == 1, out
    assert "Timeout (0:00:06" in out and "most recent call first" in out, out
    assert took >= 6.0, out


def test_a_drivers_own_signal_handler_does_not_start_a_stop(spawn):
    proc = _stuck(spawn, "usr1")
    proc.process.send_signal(signal.SIGUSR1)
    assert wait_for(lambda: "SIGUSR1 handled" in proc.output(), 10.0), proc.output()
    time.sleep(4.5)  # past the grace period: a stop clock started by SIGUSR1 would have ended it
    assert proc.process.poll() is None, proc.output()
    got, _, out = _stopped(proc)
    assert got == 0 and "stop stuck" not in out, out
