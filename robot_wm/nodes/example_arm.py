"""The example driver of the driver kit: an imaginary arm in a few lines per method.

The "hardware" is a velocity-controlled arm whose joints follow the command with a first-order lag
(time constant ``lag_s``) and stop at the URDF's position limits. A real driver puts its arm's I/O
where this one integrates: read the encoders in :meth:`read_state`, send the velocity set-point in
:meth:`write_velocity`, stop the drives in :meth:`bring_to_rest`. Everything else of the topic
contract (rate, command checks, the command timeout, diagnostics, ``~/reset``, faults) is
robot_wm.driver.ArmDriver's.

Brought up in place of arm_sim by ``robot-wm up --hardware example`` (config/graph.yaml
``hardware.example``); docs/drivers.md walks through it.
"""
from __future__ import annotations

import numpy as np
from rclpy.context import Context

from robot_wm import description
from robot_wm.driver import ArmDriver
from robot_wm.nodes.params import declare
from robot_wm.nodes.runner import main_for


class ExampleArmNode(ArmDriver):
    """An imaginary velocity-controlled arm behind the topic contract."""

    def __init__(self, context: Context | None = None, node_name: str = "example_arm") -> None:
        super().__init__(node_name, context=context, hardware_id="example")
        self.lag_s = declare(self, "lag_s", 0.01, "velocity loop time constant of the imaginary drives (s)",
                             range_=(0.0, 1.0), read_only=True)
        self.reset()

    def write_velocity(self, command_radps: np.ndarray) -> None:
        self.target = command_radps.copy()  # a real driver: send the set-point to the drives

    def bring_to_rest(self) -> None:
        self.target = np.zeros(len(self.joint_names))  # a real driver: a controlled stop of every drive

    def step(self, dt_s: float) -> None:
        """The imaginary drives and joints (a real driver has nothing here)."""
        alpha = 1.0 if self.lag_s == 0.0 else 1.0 - np.exp(-dt_s / self.lag_s)
        self.v += alpha * (self.target - self.v)
        self.q = np.clip(self.q + self.v * dt_s, self.limits.lower_rad, self.limits.upper_rad)
        at_stop = ((self.q <= self.limits.lower_rad) & (self.v < 0)) | ((self.q >= self.limits.upper_rad) & (self.v > 0))
        self.v[at_stop] = 0.0

    def read_state(self) -> tuple[np.ndarray, np.ndarray, None]:
        return self.q.copy(), self.v.copy(), None  # a real driver: read the encoders (and the torques)

    def reset(self) -> str:
        self.q = description.initial_positions(self.joint_names)
        self.v = np.zeros(len(self.joint_names))
        self.bring_to_rest()
        return "imaginary arm back at its initial positions"


main = main_for(ExampleArmNode)

if __name__ == "__main__":
    main()
