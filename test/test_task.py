"""The reaching task (robot_wm.core.task): validation, goals, reward and success semantics."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from robot_wm.contracts import OBS_DIM, OBS_LAYOUT
from robot_wm.core.task import SuccessTracker, TaskConfigError, TaskSpec, load_task


def test_layout_covers_the_observation_once():
    covered = sorted(i for s in OBS_LAYOUT.values() for i in range(s.start, s.stop))
    assert covered == list(range(OBS_DIM)) == list(range(18))
    assert list(OBS_LAYOUT) == ["q_rad", "qdot_radps", "tool_m", "goal_m"]


def test_load_task_reads_config():
    task = load_task()
    assert task.control_dt_s == 0.01 and task.episode_s == 4.0
    assert task.episode_steps == 400
    assert task.hold_steps == 30  # 0.3 s at 10 ms
    assert len(task.action_limit_radps) == 6


@pytest.mark.parametrize(
    "field, value",
    [
        ("control_dt_s", 0.0),
        ("episode_s", -1.0),
        ("success_radius_m", float("nan")),
        ("success_hold_s", "long"),
        ("start_noise_rad", -0.1),
        ("goal_box_min_m", (-0.6, -0.3)),
        ("action_limit_radps", (1.0, 1.0, 1.0)),
        ("action_limit_radps", (1.0, 1.0, 1.0, 1.5, 1.5, 0.0)),
        ("success_hold_s", 4.0),  # not shorter than the episode
        ("goal_bonus", -1.0),
        ("goal_bonus_radius_m", 0.0),
        ("action_cost", float("nan")),
    ],
)
def test_invalid_field_is_named(field, value):
    with pytest.raises(TaskConfigError, match=field):
        dataclasses.replace(TaskSpec(), **{field: value})


def test_goal_box_must_be_ordered_and_above_the_table():
    with pytest.raises(TaskConfigError, match="goal_box_min_m"):
        TaskSpec(goal_box_min_m=(-0.3, -0.3, 0.15), goal_box_max_m=(-0.6, 0.2, 0.5))
    with pytest.raises(TaskConfigError, match="z"):
        TaskSpec(goal_box_min_m=(-0.6, -0.3, 0.0))


def test_from_mapping_names_unknown_fields():
    with pytest.raises(TaskConfigError, match="episode_len"):
        TaskSpec.from_mapping({"episode_len": 3.0}, source="my.yaml")
    assert TaskSpec.from_mapping({"goal_box_min_m": [-0.6, -0.3, 0.2]}).goal_box_min_m == (-0.6, -0.3, 0.2)


def test_load_task_names_a_bad_file(tmp_path):
    bad = tmp_path / "task.yaml"
    bad.write_text("task: {episode_s: 4.0}\n")
    with pytest.raises(TaskConfigError, match=str(bad)):
        load_task(bad)
    with pytest.raises(TaskConfigError, match="missing.yaml"):
        load_task(tmp_path / "missing.yaml")


def test_sample_goals_in_box_and_seeded():
    task = TaskSpec()
    goals = task.sample_goals(np.random.default_rng(1), 500)
    assert goals.shape == (500, 3)
    assert np.all(goals >= task.goal_box_min_m) and np.all(goals <= task.goal_box_max_m)
    np.testing.assert_array_equal(goals, task.sample_goals(np.random.default_rng(1), 500))


def test_reward_higher_nearer_the_goal_with_a_bonus_near_it_and_a_cost_on_the_command():
    task = TaskSpec()
    goal = np.zeros(3)
    tools = np.array([[0.5, 0, 0], [0.1, 0, 0], [0.03, 0, 0], [0.01, 0, 0], [0.0, 0, 0]])
    still = np.zeros((len(tools), 6))
    r = task.reward(tools, goal, still)
    assert np.all(np.diff(r) > 0)
    np.testing.assert_allclose(r, -tools[:, 0] + task.goal_bonus * np.exp(-(tools[:, 0] / task.goal_bonus_radius_m) ** 2))
    assert r[-1] == pytest.approx(task.goal_bonus)  # at the goal: the whole bonus
    assert r[3] - r[1] > 0.5 * task.goal_bonus  # most of the bonus is earned near the goal
    moving = task.reward(tools, goal, np.ones((len(tools), 6)))
    np.testing.assert_allclose(r - moving, 6 * task.action_cost)


def test_reward_is_one_definition_for_numpy_and_torch():
    """The trainer evaluates the task's reward on torch tensors: same numbers, and differentiable."""
    torch = pytest.importorskip("torch")
    task = TaskSpec()
    rng = np.random.default_rng(0)
    tool, goal, action = rng.normal(size=(16, 3)) * 0.05, rng.normal(size=(16, 3)) * 0.05, rng.normal(size=(16, 6))
    tool_t = torch.tensor(tool, requires_grad=True)
    r_t = task.reward(tool_t, torch.tensor(goal), torch.tensor(action), xp=torch)
    np.testing.assert_allclose(r_t.detach().numpy(), task.reward(tool, goal, action), rtol=1e-12)
    r_t.sum().backward()
    assert torch.isfinite(tool_t.grad).all() and tool_t.grad.abs().sum() > 0



def _run(task: TaskSpec, inside: list[bool]) -> SuccessTracker:
    tracker = SuccessTracker(task, 1)
    goal = np.zeros((1, 3))
    for step, ins in enumerate(inside):
        d = 0.5 * task.success_radius_m if ins else 2 * task.success_radius_m
        tracker.update(step, np.array([[d, 0.0, 0.0]]), goal)
    return tracker


def test_success_needs_hold_steps_consecutive_periods():
    task = TaskSpec()
    n = task.hold_steps
    assert not _run(task, [True] * (n - 1)).success[0]
    t = _run(task, [False] * 5 + [True] * n)
    assert t.success[0] and t.success_step[0] == 5 + n - 1 and t.first_inside_step[0] == 5


def test_leaving_the_radius_resets_the_count():
    task = TaskSpec()
    n = task.hold_steps
    t = _run(task, [True] * (n - 1) + [False] + [True] * (n - 1))
    assert not t.success[0] and t.inside_steps[0] == n - 1
    t = _run(task, [True] * (n - 1) + [False] + [True] * n)
    assert t.success[0] and t.first_inside_step[0] == n  # the entry of the hold that counted


def test_success_latches_after_leaving():
    task = TaskSpec()
    t = _run(task, [True] * task.hold_steps + [False] * 10)
    assert t.success[0] and t.success_step[0] == task.hold_steps - 1


@settings(max_examples=60, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=40), st.integers(1, 6))
def test_success_iff_a_long_enough_run(inside, hold):
    task = TaskSpec(control_dt_s=0.1, success_hold_s=hold * 0.1, episode_s=10.0)
    assert task.hold_steps == hold
    t = _run(task, inside)
    run, first_end = 0, -1
    for i, ins in enumerate(inside):
        run = run + 1 if ins else 0
        if run >= hold and first_end < 0:
            first_end = i
    assert bool(t.success[0]) == (first_end >= 0)
    assert t.success_step[0] == first_end
    if first_end >= 0:
        assert t.first_inside_step[0] == first_end - hold + 1


def test_tracker_is_per_episode():
    task = TaskSpec()
    tracker = SuccessTracker(task, 2)
    goal = np.zeros((2, 3))
    tool = np.array([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    for step in range(task.hold_steps):
        dist = tracker.update(step, tool, goal)
    np.testing.assert_allclose(dist, [0.0, 1.0])
    assert tracker.success.tolist() == [True, False]
