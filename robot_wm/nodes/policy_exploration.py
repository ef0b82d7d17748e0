"""The policy node's exploration in the MIXED phase (``robot_wm.core.exploration``), for
``robot-wm train mixed`` on a running stack.

Parameters (changeable at run time; a change that breaks a range or ``low < high`` is refused with
the reason):

* ``exploration_std`` (fraction of the action limit in force, default 0 = off): the stationary
  std of the Ornstein-Uhlenbeck noise added to the policy's command (after the phase's and the
  trust level's speed scale, before the slew limit; clipped to the action limit times that scale,
  and shrunk so that the tool stays within ``TOOL_SPEED_BUDGET`` of the tool-speed limit in force);
* ``exploration_tau_s``: its correlation time; ``exploration_seed``: its seed;
* ``exploration_uncertainty_low_radps`` / ``_high_radps``: the rule's thresholds on the world
  model's epistemic std of the next joint velocities (max over joints).

The uncertainty is the one ``/robot_wm/prediction`` carries for the latest period (the world_model
node's prediction for the state and the command last applied: one period older than the library
loop's what-if query for this period's command). There is **no exploration** outside the MIXED
phase, before the first TrustState, at any level below CAUTIOUS, or without a prediction from the
last ``STALE_PERIODS`` periods. While ``exploration_std`` > 0 each period's ``[uncertainty (rad/s),
scale, trust level, phase]`` goes out on ``/robot_wm/exploration`` (std_msgs/Float64MultiArray;
NaN uncertainty when there was none): what the trainer records about each episode.
"""
from __future__ import annotations

import numpy as np
from rcl_interfaces.msg import SetParametersResult
from std_msgs.msg import Float64MultiArray

from robot_wm.core.exploration import OUNoise, check_settings, explore, exploration_scale
from robot_wm.core.safety.limits import Phase
from robot_wm.nodes.params import declare

EXPLORATION_TOPIC = "/robot_wm/exploration"
STALE_PERIODS = 5  # a prediction older than this many control periods says nothing about now
_NAMES = ("exploration_std", "exploration_tau_s", "exploration_uncertainty_low_radps",
          "exploration_uncertainty_high_radps")


class PolicyExploration:
    """Declared on the policy node; ``apply`` once per period."""

    def __init__(self, node, dt_s: float) -> None:
        self.node, self.dt_s = node, float(dt_s)
        self.std = declare(node, "exploration_std", 0.0, "exploration noise std, fraction of the action limit in force "
                           "(0: off; only in the MIXED phase, bounded by the world model's uncertainty)", range_=(0.0, 1.0))
        self.tau_s = declare(node, "exploration_tau_s", 0.2, "exploration noise correlation time (s)", range_=(0.01, 10.0))
        self.low = declare(node, "exploration_uncertainty_low_radps", 0.008, "epistemic std of the next joint "
                           "velocities (max joint) at or below which exploration is full (rad/s)", range_=(0.0, 10.0))
        self.high = declare(node, "exploration_uncertainty_high_radps", 0.02, "... at and above which it is off (rad/s)",
                            range_=(1e-6, 10.0))
        self.seed = declare(node, "exploration_seed", 0, "seed of the exploration noise", range_=(0, 2**31 - 1))
        try:
            check_settings(self.std, self.tau_s, self.low, self.high, names=_NAMES)
        except ValueError as exc:
            from robot_wm.nodes.runner import NodeConfigError

            raise NodeConfigError(f"{node.get_name()}: {exc}") from exc
        self.noise: OUNoise | None = None  # made for the command's size at the first period that explores
        self.uncertainty = float("nan")
        self.uncertainty_ns: int | None = None
        self._pub = node.create_publisher(Float64MultiArray, EXPLORATION_TOPIC, 10)
        self._sub = None  # /robot_wm/prediction, only while exploring: no cost to the node otherwise
        self._listen()
        node.add_on_set_parameters_callback(self._on_set)

    def _listen(self) -> None:
        from robot_wm.msg import WorldModelPrediction

        if self.std > 0 and self._sub is None:
            self._sub = self.node.create_subscription(WorldModelPrediction, "/robot_wm/prediction", self._on_prediction, 10)
        elif self.std <= 0 and self._sub is not None:
            self.node.destroy_subscription(self._sub)
            self._sub, self.uncertainty_ns = None, None

    def _on_set(self, params) -> SetParametersResult:
        mine = {p.name: p.value for p in params if p.name in _NAMES or p.name == "exploration_seed"}
        if not mine:
            return SetParametersResult(successful=True)
        try:
            std = float(mine.get("exploration_std", self.std))
            tau = float(mine.get("exploration_tau_s", self.tau_s))
            low = float(mine.get("exploration_uncertainty_low_radps", self.low))
            high = float(mine.get("exploration_uncertainty_high_radps", self.high))
            check_settings(std, tau, low, high, names=_NAMES)
            seed = int(mine.get("exploration_seed", self.seed))
        except (TypeError, ValueError) as exc:
            return SetParametersResult(successful=False, reason=str(exc))
        renew = tau != self.tau_s or seed != self.seed or (std > 0 and self.std == 0)
        changed = (std, tau, low, high, seed) != (self.std, self.tau_s, self.low, self.high, self.seed)
        self.std, self.tau_s, self.low, self.high, self.seed = std, tau, low, high, seed
        if renew:  # a new run of exploration starts from its seed
            self.noise = None
        self._listen()
        if changed:
            self.node.get_logger().info(f"exploration: std {std:g} of the action limit, tau {tau:g} s, uncertainty "
                                        f"{low:g}..{high:g} rad/s (MIXED phase only)")
        return SetParametersResult(successful=True)

    def _on_prediction(self, msg) -> None:
        n = len(msg.joint_names)
        v = np.asarray(msg.velocity_std_epistemic_radps, dtype=float)[:n]  # step 1 of the horizon
        self.uncertainty = float(np.max(v)) if n and v.size == n and np.all(np.isfinite(v)) else float("nan")
        self.uncertainty_ns = msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec

    def apply(self, action: np.ndarray, limit: np.ndarray, trust: tuple[int, int] | None, q: np.ndarray | None = None,
              kinematics=None, tool_speed_max_mps: float = float("inf")) -> np.ndarray:
        """``action`` with this period's exploration (unchanged when off; see the module docstring).
        ``limit``: the action limit in force; ``q``, ``kinematics``, ``tool_speed_max_mps``: the
        measured joint positions, the tool Jacobian's source and the tool-speed limit in force (the
        noise keeps the tool within ``TOOL_SPEED_BUDGET`` of it)."""
        if self.std <= 0.0:
            return action
        if self.noise is None or self.noise.value.shape != action.shape:
            self.noise = OUNoise(action.shape[0], self.dt_s, self.tau_s, self.seed)
        noise = self.noise.step()
        now_ns = self.node.get_clock().now().nanoseconds
        fresh = self.uncertainty_ns is not None and now_ns - self.uncertainty_ns <= STALE_PERIODS * self.node.period_s * 1e9
        u = self.uncertainty if fresh else float("nan")
        level, phase = trust if trust is not None else (-1, -1)
        scale = exploration_scale(u, self.low, self.high, level) if phase == int(Phase.MIXED) else 0.0
        self._pub.publish(Float64MultiArray(data=[u, scale, float(level), float(phase)]))
        jac = kinematics.tool_jacobian(q)[:3] if kinematics is not None and q is not None and scale > 0.0 else None
        return explore(action, noise, scale, self.std, limit, jac, tool_speed_max_mps)
