"""Drivers that break the contract on demand (test/test_driver_kit.py), started as
``python test/faulty_driver.py KIND --ros-args ...``:

- ``faulty``: write_velocity raises when a joint is commanded above 0.25 rad/s (a drive bus error);
  read_state raises while the elbow is commanded (an encoder error; the base's stop ends it);
- ``no_timeout``: the command timeout does nothing, the arm keeps its last command (what
  ``robot-wm doctor --driver`` must catch).
"""
from __future__ import annotations

import sys

from robot_wm.nodes.example_arm import ExampleArmNode
from robot_wm.nodes.runner import main_for


class FaultyArm(ExampleArmNode):
    def __init__(self, context=None) -> None:
        super().__init__(context=context, node_name="faulty_arm")

    def write_velocity(self, command_radps) -> None:
        if abs(command_radps).max() > 0.25:
            raise RuntimeError("drive bus timeout")
        super().write_velocity(command_radps)

    def read_state(self):
        if self.target[2] != 0.0:
            raise OSError("encoder read failed")
        return super().read_state()


class NoTimeoutArm(ExampleArmNode):
    def __init__(self, context=None) -> None:
        super().__init__(context=context, node_name="no_timeout_arm")

    def on_command_timeout(self) -> None:
        """Broken on purpose: keeps moving on the last command."""


if __name__ == "__main__":
    kind = sys.argv.pop(1)
    main_for({"faulty": FaultyArm, "no_timeout": NoTimeoutArm}[kind])()
