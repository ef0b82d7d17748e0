"""Smoke test of bench/bench_control_path.py: the in-process part runs and reports sane numbers.

No ROS process is started and no timing is judged: only that every stage is there with finite,
positive, ordered statistics, and that the end-to-end bookkeeping (missed periods, in-chain
records) counts what it should on synthetic data.
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


def test_missed_periods_and_in_chain_records(bench):
    period = 0.01
    t = np.cumsum(np.r_[0, [10_000_000] * 8, 25_000_000, 10_000_000]).astype(np.int64)  # one 2.5-period gap
    gaps = bench._gaps(t, period)
    assert gaps["n"] == 11 and gaps["missed"] == 1 and gaps["interval"]["max_us"] == 25_000.0
    # records: (consumed stamp, state received, step start, publish call, filter state); -1 = waiting
    stamp = t - 3_000_000
    rec = np.stack([stamp, stamp + 500_000, t - 1_000_000, t, np.r_[-1, [1] * 10]], axis=1)
    ic = bench._in_chain(rec, int(t[0]), int(t[-1]) + 1, period)
    assert ic["latency"]["n"] == 10 and ic["latency"]["p50_us"] == pytest.approx(3000.0)
    assert ic["compute"]["p50_us"] == pytest.approx(1000.0)
    assert ic["state_delivery"]["p50_us"] == pytest.approx(500.0)
    assert ic["publishes"]["missed"] == 1 and ic["states"]["WAITING"] == 1


def test_presets_and_rates(bench):
    quick = bench.parse_args(["--quick"])
    assert quick.seconds == bench.PRESETS["quick"]["seconds"] and quick.rates == [100.0, 250.0, 500.0, 1000.0]
    assert "composed" in quick.modes and "separate" in quick.modes
    specs, arm_rate = bench._specs_for("composed", 1000.0)
    assert arm_rate == 1000.0  # arm_sim raised to the control rate
    composed = next(s for s in specs if s.composes)
    cmd = bench._command(composed, None)  # the plan override reaches every hosted node
    assert all(f"{n}:control_period_s:=0.001" in cmd for n in composed.composes)
    child = bench._command(composed, Path("rec.npy"))
    assert child[2:5] == ["--child", composed.module, "rec.npy"] and child[5] == "--ros-args"


def test_modes_plan_and_executor_env(bench):
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
    assert "ROBOT_WM_EXECUTOR" not in bench.mode_env("composed", env)  # the shipped default
    assert bench.mode_env("separate_single", env)["ROBOT_WM_EXECUTOR"] == "single"
    assert not any(s.composes for s in bench._specs_for("separate_single", 100.0)[0])
    assert any(s.composes for s in bench._specs_for("composed_single", 100.0)[0])
