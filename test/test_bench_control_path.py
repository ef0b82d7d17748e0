"""Smoke test of the benchmarks (bench/bench_control_path.py, robot-wm bench hotpath|e2e): the
in-process part runs and reports sane numbers.

No ROS process is started and no timing is judged: only that every stage is there with finite,
positive, ordered statistics, that the end-to-end bookkeeping (missed periods, in-chain records)
counts what it should on synthetic data, and that the commands are built as documented.
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH_DIR = Path(__file__).resolve().parent.parent / "bench"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCH_DIR))
    try:
        import bench_control_path

        yield bench_control_path
    finally:
        sys.path.remove(str(BENCH_DIR))


def _check(stats: dict, n: int) -> None:
    assert stats["n"] == n
    values = [stats[k] for k in ("p50_us", "p99_us", "max_us", "mean_us")]
    assert all(math.isfinite(v) and v > 0 for v in values), stats
    assert stats["p50_us"] <= stats["p99_us"] <= stats["max_us"], stats


def test_stage_timings_report_every_stage(bench):
    periods = 40
    res, samples = bench.stage_timings(periods=periods, keep_samples=True)
    assert set(res["stages"]) == set(bench.STAGE_LABELS)
    assert res["periods"] == periods and sum(res["states"].values()) == periods
    assert 0 < res["qp_periods"] <= periods  # the policy's first moves from home need the QP
    for key, stats in res["stages"].items():
        qp_only = key in ("qp.osqp_update_solve", "filter.controller_step_qp")
        _check(stats, res["qp_periods"] if qp_only else periods)
    # the whole filter step contains its parts
    st = res["stages"]
    assert st["node.safety_filter_step"]["mean_us"] > st["world_model.linearize"]["mean_us"]
    assert len(samples) == periods and sum(s["snap"] is not None for s in samples) == res["qp_periods"]
    json.dumps(bench._jsonable(res), allow_nan=False)  # what --json writes
    assert st["total"]["mean_us"] > st["node.period_total"]["mean_us"]  # + the world_model node's predict


def test_missed_periods_and_in_chain_records():
    from robot_wm.benchmarks import e2e

    period = 0.01
    t = np.cumsum(np.r_[0, [10_000_000] * 8, 25_000_000, 10_000_000]).astype(np.int64)  # one 2.5-period gap
    gaps = e2e._gaps(t, period)
    assert gaps["n"] == 11 and gaps["missed"] == 1 and gaps["interval"]["max_us"] == 25_000.0
    # records: (consumed stamp, state received, step start, publish call, filter state); -1 = waiting
    stamp = t - 3_000_000
    rec = np.stack([stamp, stamp + 500_000, t - 1_000_000, t, np.r_[-1, [1] * 10]], axis=1)
    ic = e2e._in_chain(rec, int(t[0]), int(t[-1]) + 1, period)
    assert ic["latency"]["n"] == 10 and ic["latency"]["p50_us"] == pytest.approx(3000.0)
    assert ic["compute"]["p50_us"] == pytest.approx(1000.0)
    assert ic["state_delivery"]["p50_us"] == pytest.approx(500.0)
    assert ic["publishes"]["missed"] == 1 and ic["states"]["WAITING"] == 1


def test_presets_and_rates(bench):
    quick = bench.parse_args(["--quick"])
    assert quick.seconds == bench.PRESETS["quick"]["seconds"] and quick.rates == [100.0, 250.0, 500.0, 1000.0]
    assert "composed" in quick.modes and "separate" in quick.modes
    from robot_wm.benchmarks import e2e

    specs, arm_rate = e2e._specs_for("composed", 1000.0)
    assert arm_rate == 1000.0  # arm_sim raised to the control rate
    composed = next(s for s in specs if s.composes)
    cmd = e2e._command(composed, None)  # the plan override reaches every hosted node
    assert all(f"{n}:control_period_s:=0.001" in cmd for n in composed.composes)
    child = e2e._command(composed, Path("rec.npy"))
    assert child[1].endswith("e2e.py") and child[2:5] == ["--child", composed.module, "rec.npy"]
    assert child[5] == "--ros-args"
    # the filter at its own rate: the arm publishes at least that fast, the filter's period comes last (it wins)
    specs, arm_rate = e2e._specs_for("composed", 100.0, 500.0)
    composed = next(s for s in specs if s.composes)
    cmd = e2e._command(composed, None, 500.0)
    assert arm_rate == 500.0 and "policy:control_period_s:=0.01" in cmd
    assert cmd[-2:] == ["-p", "safety_filter:control_period_s:=0.002"]


def test_modes_plan_and_executor_env(bench):
    from robot_wm.benchmarks import e2e

    default = bench.parse_args([])
    main = [(m, r) for r in (100.0, 250.0, 500.0, 1000.0) for m in ("separate", "composed")]
    baselines = [("separate_single", 100.0), ("composed_single", 100.0)]
    assert sorted(default.configs) == sorted(main + baselines)
    assert default.configs[:4] == [("separate", 100.0), ("composed", 100.0)] + baselines  # back to back
    assert len(bench.parse_args(["--full"]).configs) == len(bench.MODES) * 4
    given = bench.parse_args(["--modes", "composed_single", "--rates", "250,500"])
    assert given.configs == [("composed_single", 250.0), ("composed_single", 500.0)]
    with pytest.raises(SystemExit):
        bench.parse_args(["--modes", "composed_events"])
    env = {"ROBOT_WM_EXECUTOR": "single", "X": "1"}
    assert "ROBOT_WM_EXECUTOR" not in e2e.mode_env("composed", env)  # the shipped default
    assert e2e.mode_env("separate_single", env)["ROBOT_WM_EXECUTOR"] == "single"
    assert not any(s.composes for s in e2e._specs_for("separate_single", 100.0)[0])
    assert any(s.composes for s in e2e._specs_for("composed_single", 100.0)[0])


def test_bench_verbs_refuse_bad_arguments_and_the_baseline_tree_is_the_given_revision(tmp_path):
    """robot-wm bench hotpath|e2e say what is wrong (exit 2) before starting anything; --baseline
    REF checks out that revision's code (git archive) or takes a directory with a robot_wm package."""
    import subprocess

    from robot_wm.benchmarks.hotpath import checkout

    for argv, why in ((["hotpath", "--periods", "10"], "--periods must be >= 100"),
                      (["hotpath", "--baseline", "no-such-revision"], "not a directory and not a git revision"),
                      (["e2e", "--rate", "5000"], "--rate 5000 Hz: expected 10..1000 Hz"),
                      (["e2e", "--filter-rate", "2"], "--filter-rate 2 Hz"),
                      (["e2e", "--seconds", "0"], "--seconds must be > 0")):
        proc = subprocess.run([sys.executable, "-m", "robot_wm.cli", "bench", *argv], capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 2 and why in proc.stderr, (argv, proc.stderr)
    repo = Path(__file__).resolve().parent.parent
    tree = checkout("HEAD", repo, tmp_path)
    assert (tree / "robot_wm" / "core" / "safety" / "controller.py").is_file() and (tree / "models").is_dir()
    assert checkout(str(tree), repo, tmp_path) == tree.resolve()
    with pytest.raises(ValueError, match="no robot_wm package"):
        checkout(str(tmp_path / "tree" / "config"), repo, tmp_path)


@pytest.mark.ros
def test_the_benchmark_child_saves_the_filters_records_when_its_node_exits(spawn, tmp_path):
    """The e2e benchmark runs the filter's process through its --child wrapper, which saves the
    filter's period records when the node's entry point ends the process (exit_process, os._exit):
    records and the executor built are there after a SIGINT, the exit clean."""
    import signal

    from robot_wm.benchmarks import e2e

    from conftest import wait_for

    specs, _ = e2e._specs_for("separate", 100.0)
    record = tmp_path / "rec.npy"
    proc = spawn(e2e._command(next(s for s in specs if s.name == "safety_filter"), record))
    assert wait_for(lambda: "safety filter active" in proc.output() or proc.process.poll() is not None, 60.0), \
        proc.output()
    assert proc.process.poll() is None, proc.output()
    proc.process.send_signal(signal.SIGINT)
    assert proc.process.wait(timeout=30) == 0, proc.output()
    assert np.load(record).shape[1:] == (5,)  # (no arm in this test: no period has run yet, maybe)
    assert record.with_suffix(".executor").read_text() == "EventsExecutor"
