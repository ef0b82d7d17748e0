"""The live recorder on the whole graph (embedded arm, task track): bags of what DDS delivered."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from conftest import wait_for


@pytest.mark.ros
@pytest.mark.slow
def test_recorder_writes_one_bag_per_episode_of_the_running_stack(spawn, ros_context, tmp_path):
    from rclpy.executors import SingleThreadedExecutor

    from robot_wm import bags, graph
    from robot_wm.learning import demos
    from robot_wm.nodes.recorder import DemoRecorder
    from robot_wm.process_group import command_for

    specs = [s for s in graph.plan("mujoco", overrides={"profile": "nominal"}, enable=True, task="track")
             if not s.needs_ros_install]
    procs = {s.name: spawn(command_for(s)) for s in specs}
    out = tmp_path / "demos"
    recorder = DemoRecorder(out, 2, task="track", robot="nominal", context=ros_context)
    executor = SingleThreadedExecutor(context=ros_context)
    executor.add_node(recorder)
    spinner = threading.Thread(target=executor.spin, daemon=True)
    spinner.start()

    def logs():
        return "\n".join(f"--- {n}\n{p.output()[-2000:]}" for n, p in procs.items())

    try:
        # the first path may have begun before the recorder listened (skipped, said so); two whole ones follow
        assert wait_for(recorder.done.is_set, 60.0, 0.1), f"written {recorder.written}, skipped {recorder.skipped}\n{logs()}"
    finally:
        executor.shutdown(timeout_sec=2.0)
        spinner.join(timeout=3.0)
        recorder.destroy_node()
    report = demos.inspect_demos(out)
    assert report["usable"] == 2 and not report["problems"], report
    data, metas, _ = demos.load_demos(out)
    for m in metas:
        assert (m.task, m.robot, m.source, m.library) == ("track", "nominal", "policy", False)
        assert m.models["policy"].startswith("policy-") and m.models["world_model"].startswith("wm-")
        assert m.duration_s == pytest.approx(6.0)
    ep = bags.read_episode(recorder.written[0])
    inside = (ep.state_t_ns >= ep.meta.start_ns) & (ep.state_t_ns <= ep.meta.end_ns)
    rate = inside.sum() / ep.meta.duration_s
    assert 400 < rate < 560, f"/joint_states at {rate:.0f} Hz in the bag (the arm publishes 500 Hz)"
    cmds = ((ep.command_t_ns >= ep.meta.start_ns) & (ep.command_t_ns <= ep.meta.end_ns)).sum() / ep.meta.duration_s
    assert 90 < cmds < 110, f"commands at {cmds:.0f} Hz in the bag (the filter runs at 100 Hz)"
    assert {"/robot_wm/safety_status", "/robot_wm/trust", "/robot_wm/reference", "/robot_wm/action_nominal",
            "/robot_wm/wrench", "/robot_wm/episodes"} <= set(ep.topics)
    # the arm moved along the path in the data the loader gives the trainer
    assert np.ptp(data.tool_m[0], axis=0).max() > 0.03
    assert np.abs(data.action_radps).max() > 0.05
