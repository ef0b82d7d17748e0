"""Drivers that break the contract on demand (test/test_driver_kit.py), started as
``python test/faulty_driver.py KIND --ros-args ...``:

- ``faulty``: write_velocity raises when a joint is commanded above 0.25 rad/s (a drive bus error);
  read_state raises while the elbow is commanded (an encoder error; the base's stop ends it);
- ``no_timeout``: the command timeout does nothing, the arm keeps its last command (what
  ``robot-wm doctor --driver`` must catch);
- ``lossy_link``: while the elbow is commanded the middleware refuses every other joint state and
  every wrench (rclpy's RCLError "cannot publish data", as Fast DDS raises on a loaded machine).
"""
from __future__ import annotations

import itertools
import sys

from geometry_msgs.msg import WrenchStamped
from robot_wm.driver import RCLError  # what rclpy raises when rcl_publish fails

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


class RefusingPublisher:
    """A publisher whose middleware refuses to publish while ``refusing()`` is true."""

    def __init__(self, publisher, refusing) -> None:
        self.publisher, self.refusing = publisher, refusing
        self.topic_name = publisher.topic_name

    def publish(self, msg) -> None:
        if self.refusing():
            raise RCLError("Failed to publish: cannot publish data, at ./src/rmw_publish.cpp:68, "
                           "at ./src/rcl/publisher.c:284")
        self.publisher.publish(msg)


class LossyLinkArm(ExampleArmNode):
    def __init__(self, context=None) -> None:
        super().__init__(context=context, node_name="lossy_arm")
        every_other = itertools.cycle([True, False])
        self._state_pub = RefusingPublisher(self._state_pub, lambda: self.target[2] != 0.0 and next(every_other))
        self._wrench_pub = RefusingPublisher(self.create_publisher(WrenchStamped, "~/wrench", 10),
                                             lambda: self.target[2] != 0.0)

    def publish_extras(self, stamp) -> None:
        wrench = WrenchStamped()
        wrench.header.stamp = stamp
        self.publish_measurement(self._wrench_pub, wrench)


if __name__ == "__main__":
    kind = sys.argv.pop(1)
    main_for({"faulty": FaultyArm, "no_timeout": NoTimeoutArm, "lossy_link": LossyLinkArm}[kind])()
