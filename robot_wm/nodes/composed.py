"""control_stack: safety filter, world model and policy composed in ONE process and executor.

The lowest-latency arrangement of the hot path (no process hop between the nodes' executors);
each node is the same class that also runs alone (`ros2 run robot_wm policy`, ...).
"""
from __future__ import annotations

from robot_wm.nodes.policy_node import PolicyNode
from robot_wm.nodes.runner import exit_process, run_nodes
from robot_wm.nodes.safety_filter_node import SafetyFilterNode
from robot_wm.nodes.world_model_node import WorldModelNode


def main(args: list[str] | None = None) -> None:
    """Run the three control-path nodes in one executor until SIGINT/SIGTERM."""
    exit_process(run_nodes([
        lambda ctx: SafetyFilterNode(context=ctx),
        lambda ctx: WorldModelNode(context=ctx),
        lambda ctx: PolicyNode(context=ctx),
    ], args))


if __name__ == "__main__":
    main()
