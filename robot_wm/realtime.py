"""Real-time scheduling of a control process: SCHED_FIFO for every thread, where the OS allows it.

On a 2-core machine shared with the simulator, the trust monitor and everything else, a 100 Hz
control period of the composed stack was late in 4 % of the periods under the default scheduler
and in 0.3 % with its threads at SCHED_FIFO 50 (``robot-wm bench e2e --composed``, README). This is
what ros2_control does for its own loop (its ``thread_priority``): a real-time policy for the
process that must not miss periods, while the rest of the machine keeps the time the kernel's
real-time throttling leaves it (``/proc/sys/kernel/sched_rt_runtime_us``, 95 % by default).

It needs the right to raise priorities (root, CAP_SYS_NICE, or an ``rtprio`` limit in
``/etc/security/limits.conf``: ``@robot - rtprio 98``); without it the process keeps the normal
scheduler and says so. Every thread of the process is moved, the middleware's receive threads
included (they deliver the joint states the period waits for), so call it after the nodes exist.
The garbage collector's existing objects are frozen too (``gc.freeze``): later collections then
walk only what the control loop allocates, which keeps their pauses short.
"""
from __future__ import annotations

import gc
import os
from pathlib import Path

#: The range of SCHED_FIFO priorities a robot_wm process may ask for (1..98; 99 is the kernel's own).
PRIORITY_RANGE = (0, 98)


def apply_realtime(priority: int) -> tuple[bool, str]:
    """Put every thread of this process on SCHED_FIFO at ``priority`` (0: leave the scheduler alone).

    Returns:
        (applied, a line for the log: what was done, or why it was not).
    """
    lo, hi = PRIORITY_RANGE
    if isinstance(priority, bool) or not isinstance(priority, int) or not lo <= priority <= hi:
        return False, f"realtime_priority {priority!r}: expected an integer in [{lo}, {hi}] (0: off)"
    if priority == 0:
        return False, "real-time scheduling off (realtime_priority 0)"
    if not hasattr(os, "sched_setscheduler"):
        return False, f"realtime_priority {priority}: this OS has no SCHED_FIFO (os.sched_setscheduler); normal scheduling"
    gc.collect()
    gc.freeze()
    param = os.sched_param(priority)
    moved, refused = 0, ""
    for task in sorted(Path("/proc/self/task").iterdir()) if Path("/proc/self/task").is_dir() else [Path("0")]:
        try:
            os.sched_setscheduler(int(task.name), os.SCHED_FIFO, param)
            moved += 1
        except ProcessLookupError:  # the thread ended meanwhile
            continue
        except PermissionError as exc:
            refused = str(exc)
            break
    if refused:
        return False, (f"realtime_priority {priority}: not permitted ({refused}); normal scheduling: give the "
                       "process CAP_SYS_NICE or an rtprio limit (/etc/security/limits.conf) to use it")
    return True, f"SCHED_FIFO priority {priority} for the {moved} threads of this process (gc frozen)"
