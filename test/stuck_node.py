"""Nodes whose stop hangs or misbehaves, on demand (test/test_shutdown.py), started as
``python test/stuck_node.py KIND``; each prints ``ready`` once it is where the test wants it:

- ``destroy``: before_shutdown runs, then destroy_node never returns (what a middleware deadlock
  while freeing readers and writers looks like from Python, eProsima/Fast-DDS#6193);
- ``callback``: a timer callback never returns, so the spin loop never sees the stop flag;
- ``gil``: destroy_node waits in C code that holds the GIL (a C++ destructor that never releases it);
- ``gil_bare``: the same in a node without before_shutdown (nothing lets the watchdog's thread run);
- ``slow_rest``: before_shutdown takes 5.5 s (a driver bringing a real arm to rest), then all is well;
- ``gil_rest``: the same 5.5 s in C code that holds the GIL (a vendor SDK's blocking stop call);
- ``raising_rest``: before_shutdown raises;
- ``usr1``: the node has a SIGUSR1 handler of its own (a driver's), which must not start a stop;
- ``free_hang``: freeing what reference cycles held (where the DDS participant goes) never returns, in C
  code holding the GIL, after every before_shutdown duty was done;
- ``atexit_hang``: the stop is done, then a driver's atexit handler never returns;
- ``exit_hang``: the stop is done, then the interpreter's own exit would hang in C code holding the GIL
  (a C++ static destructor that never returns); the driver registered an atexit handler, which must run;
- ``kept``: the node keeps itself in a module global, so it outlives its teardown;
- ``raising``: a timer callback raises, which ends the run (its traceback's frames hold the node).
"""
from __future__ import annotations

import atexit
import ctypes
import gc
import signal
import sys
import threading
import time

from rclpy.node import Node

from robot_wm.nodes.runner import main_for

_FOREVER = threading.Event()


class Quiet(Node):
    def __init__(self, context=None, name: str = "quiet") -> None:
        super().__init__(name, context=context)
        print("ready", flush=True)


class StuckDestroy(Quiet):
    def __init__(self, context=None) -> None:
        super().__init__(context, "stuck_destroy")

    def before_shutdown(self) -> None:
        print("before_shutdown ran", flush=True)

    def destroy_node(self):
        _FOREVER.wait()


class StuckCallback(Node):
    def __init__(self, context=None) -> None:
        super().__init__("stuck_callback", context=context)
        self.create_timer(0.01, self._tick)

    def _tick(self) -> None:
        print("ready", flush=True)
        _FOREVER.wait()


class StuckHoldingTheGil(StuckDestroy):
    def destroy_node(self):
        ctypes.PyDLL(None).sleep(60)  # PyDLL: the GIL stays held for the whole call


class BareHoldingTheGil(Quiet):
    def __init__(self, context=None) -> None:
        super().__init__(context, "bare")

    def destroy_node(self):
        ctypes.PyDLL(None).sleep(60)


class SlowRest(Quiet):
    def __init__(self, context=None) -> None:
        super().__init__(context, "slow_rest")

    def before_shutdown(self) -> None:
        time.sleep(5.5)
        print("before_shutdown ran", flush=True)


class SlowRestHoldingTheGil(SlowRest):
    def before_shutdown(self) -> None:
        ctypes.PyDLL(None).usleep(5_500_000)
        print("before_shutdown ran", flush=True)


class RaisingRest(Quiet):
    def __init__(self, context=None) -> None:
        super().__init__(context, "raising_rest")

    def before_shutdown(self) -> None:
        raise RuntimeError("brake controller not answering")


class OwnSignal(Quiet):
    def __init__(self, context=None) -> None:
        signal.signal(signal.SIGUSR1, lambda *_: print("SIGUSR1 handled", flush=True))
        super().__init__(context, "own_signal")


class _HangsWhenFreed:
    def __del__(self) -> None:
        ctypes.PyDLL(None).sleep(60)


class _HangsWhenCollected(_HangsWhenFreed):
    def __init__(self) -> None:
        self.cycle = self


class FreeHang(StuckDestroy):
    def __init__(self, context=None) -> None:
        gc.disable()  # the cycle lives until the runner's own collection, in its teardown
        _HangsWhenCollected()
        super().__init__(context)

    def destroy_node(self):
        return Node.destroy_node(self)


class AtexitHang(Quiet):
    def __init__(self, context=None) -> None:
        atexit.register(_FOREVER.wait)
        super().__init__(context, "atexit_hang")


class ExitHang(Quiet):
    def __init__(self, context=None) -> None:
        global _FREED_AT_EXIT
        _FREED_AT_EXIT = _HangsWhenFreed()  # freed, and so hangs, only when the interpreter finalizes
        atexit.register(lambda: print("atexit ran", flush=True))
        super().__init__(context, "exit_hang")


class Kept(Quiet):
    def __init__(self, context=None) -> None:
        global _KEPT
        _KEPT = self
        super().__init__(context, "kept")


class Raising(Quiet):
    def __init__(self, context=None) -> None:
        super().__init__(context, "raising")
        self.create_timer(0.5, self._tick)

    def _tick(self) -> None:
        raise RuntimeError("encoder read failed")


if __name__ == "__main__":
    kinds = {"destroy": StuckDestroy, "callback": StuckCallback, "gil": StuckHoldingTheGil, "gil_bare": BareHoldingTheGil,
             "slow_rest": SlowRest,
             "gil_rest": SlowRestHoldingTheGil, "raising_rest": RaisingRest, "usr1": OwnSignal,
             "free_hang": FreeHang, "atexit_hang": AtexitHang,
             "exit_hang": ExitHang, "kept": Kept, "raising": Raising}
    main_for(kinds[sys.argv.pop(1)], executor_kind="single")()
