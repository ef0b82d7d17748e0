"""Benchmark: the trust monitor's settings compared on the same recorded runs (library mode).

``bench_trust.py`` measures one configuration, and every trial operates the arm again. Choosing a
setting (the response lag's window, the persistence, a signal's smoothing) means comparing many, on
the same motion. This records once per profile, as ``bench_trust.py`` does (the same calibration
run at the same ``--calibrate-seconds``, the same fault times and seeds): the calibration run and
every fault trial, with the monitor watching but never acting (thresholds at infinity: after its
start-up climb the filter is told FULL whatever happens, so the motion depends on no verdict). Then each variant of ``config/trust.yaml`` is calibrated on the calibration run and judges
every trial through a fresh ``TrustMonitor`` (``trust_eval.rejudge``): the detection latency per
fault class in periods (p50/p90, also from the first command change after the onset) and each
variant's thresholds. That is what the monitor would have said up to its first level drop, which is
what a detection latency is; a trial the variant does not see at FULL at the onset (a drop before
it) is counted as such, not as a detection. The settings that shape the start-up and the recovery
(``clean_hold_s``, ``stale_s``, ``stop_stale_s``, ``human_after_s``) cannot be judged on a recorded
motion and are refused. ``--normal-minutes`` also records that much held-out normal operation
(bench_trust.py's seed, the monitor watching) and counts each variant's false alarms on it: level
drops below FULL after its start-up, per hour, and the two-signal anomalies among them (exact up to
a variant's first drop; after one, the arm would have slowed, which a recording cannot show).

    python bench/bench_trust_variants.py [--profiles real_twin] [--faults latency payload push] [--trials 10]
        [--calibrate-seconds 600] [--normal-minutes 60]
        [--variant base: --variant lag_tau_s=0.05 --variant lag_tau_s=0.2,min_duration_s=0.02 --variant lag_min_power=1e-4 ...]

A variant is ``name=value[,name=value]`` over TrustConfig's fields (``tau_s`` as ``a/b/c/d/e``) and
``lag_min_power`` (the response lag's floor, ``signals.MIN_RESPONSE_POWER``); ``base`` is
config/trust.yaml as it is. The last line is one JSON object.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DEFAULT_VARIANTS = ("base", "lag_tau_s=0.05", "lag_tau_s=0.2", "min_duration_s=0.02", "lag_tau_s=0.05,min_duration_s=0.02")


def parse_variant(text: str, base):
    """``name=value[,name=value]`` -> (TrustConfig, the response lag's ``min_power``) (``base`` for
    "base"); a bad one names what was wrong."""
    from robot_wm.core.trust.signals import MIN_RESPONSE_POWER, ResponseLag

    if text.strip() == "base":
        return base, MIN_RESPONSE_POWER
    fields = {f.name: f for f in dataclasses.fields(base)}
    unjudgeable = ("clean_hold_s", "stale_s", "stop_stale_s", "human_after_s", "human_on_anomaly")
    changes, min_power = {}, MIN_RESPONSE_POWER
    for part in text.split(","):
        name, sep, value = part.partition("=")
        name = name.strip()
        if sep and name == "lag_min_power":  # the response lag's floor (signals.MIN_RESPONSE_POWER), not in trust.yaml
            try:
                min_power = ResponseLag(base.lag_tau_s, float(value)).min_power  # its own check of the floor
            except ValueError as exc:
                raise ValueError(f"variant {text!r}: lag_min_power={value!r}: {exc}") from exc
            continue
        if not sep or name not in fields:
            raise ValueError(f"variant {text!r}: {part!r} is not name=value over {sorted(fields)} or lag_min_power")
        if name in unjudgeable:
            raise ValueError(f"variant {text!r}: {name} shapes the start-up or the recovery, which a recorded motion "
                             "cannot show: measure it with bench_trust.py")
        try:
            changes[name] = tuple(float(v) for v in value.split("/")) if name == "tau_s" else float(value)
        except ValueError as exc:
            raise ValueError(f"variant {text!r}: {name}={value!r}: {exc}") from exc
    return dataclasses.replace(base, **changes), min_power  # TrustConfig checks the values itself


def record(profile: str, faults: list[str], trials: int, calibrate_s: float, seed: int, normal_minutes: float = 0.0):
    """(calibration run, {(fault, k): run}, model version, held-out normal run or None) with
    bench_trust.py's calibration seed, fault times and seeds; the held-out run (``normal_minutes``,
    bench_trust.py's seed) is recorded with the monitor watching, never acting, like the trials."""
    from robot_wm.core.trust import Calibration
    from robot_wm.core.trust.settings import load_trust_config
    from robot_wm.core.trust.signals import SIGNALS
    from robot_wm.core.world_model_runner import WorldModelRunner
    from robot_wm.learning import trust_eval as te
    from robot_wm.learning.stack_eval import build_stack

    config = load_trust_config()[0]
    stack = build_stack(0.01)
    version = WorldModelRunner(stack.world_model_path, tuple(stack.kinematics.joint_names), 0.01, analytic=False).version
    watching = Calibration({s.value: math.inf for s in SIGNALS}, 0.5, version, "never acts", 0)  # FULL after the climb
    normal = te.operate(profile, calibrate_s, seed, config=config, stack=stack)
    rng = np.random.default_rng(seed + 1)
    runs = {}
    for kind in te.FAULTS:  # every class draws its times, so that each trial is bench_trust.py's
        for k in range(trials):
            t_fault = float(rng.uniform(8.0, 12.0))
            if kind in faults:
                runs[(kind, k)] = te.operate(profile, t_fault + 3.0, seed + 100 + k, calibration=watching, config=config,
                                             stack=stack, fault=(kind, t_fault))
    held = (te.operate(profile, normal_minutes * 60.0, seed + 7, calibration=watching, config=config, stack=stack,
                       progress=True) if normal_minutes > 0 else None)
    return normal, runs, version, held


def false_alarms(judged) -> dict:
    """Level drops below FULL in a judged normal run after its start-up (its first FULL), per hour;
    the two-signal anomalies among them (STOP with two signals over their thresholds)."""
    from robot_wm.learning import trust_eval as te

    reached = np.flatnonzero(judged.level == 0)
    start = judged.t_s[reached[0]] if reached.size else judged.t_s[-1]
    hours = float(judged.t_s[-1] - start) / 3600.0
    drops = te.level_drops(judged, after_s=start)
    anomalies = [e for e in judged.events if e[0] >= start and e[1] == "STOP" and e[2].count(" > ") >= 2]
    return {"normal_hours": hours, "false_alarms": int(len(drops)), "false_anomalies": len(anomalies),
            "false_alarms_per_hour": len(drops) / hours if hours > 0 else None,
            "reasons": [e[2][:160] for e in judged.events if e[0] >= start and e[1] != "FULL"][:5]}


def judge(variant, normal, runs: dict, version: str, held=None) -> dict:
    """``variant``: (TrustConfig, the response lag's min_power), as ``parse_variant`` gives it."""
    from robot_wm.core.trust.settings import load_trust_config
    from robot_wm.learning import trust_eval as te

    variant, min_power = variant
    settings = load_trust_config()[1]
    cal = te.calibrate_run(te.with_lag_tau(normal, variant.lag_tau_s, min_power), settings.exceedance,
                           settings.floor_map(), variant, model_version=version, source="variant",
                           alarms_per_hour=settings.alarms_per_hour)
    by_kind: dict[str, dict] = {}
    for (kind, _), run in runs.items():
        judged = te.rejudge(run, cal, variant, lag_min_power=min_power)
        entry = by_kind.setdefault(kind, {"seen": [], "from_motion": [], "missed": 0, "not_full_at_onset": 0})
        before = judged.level[judged.t_s < judged.fault_t_s]
        if before.size == 0 or before[-1] != 0:  # dropped before the onset (a false alarm), or never FULL
            entry["not_full_at_onset"] += 1
            continue
        latency, excited = te.detection_latency_periods(judged), te.excitation_delay_periods(judged)
        if latency is None:
            entry["missed"] += 1
            continue
        entry["seen"].append(latency)
        if excited is not None:
            entry["from_motion"].append(max(latency - excited, 0.0))

    def pct(values, q):
        return float(np.percentile(values, q)) if values else None

    faults = {kind: {"detected": len(e["seen"]), "missed": e["missed"], "not_full_at_onset": e["not_full_at_onset"],
                     "within_100ms": sum(1 for x in e["seen"] if x <= 10),
                     "p50": pct(e["seen"], 50), "p90": pct(e["seen"], 90),
                     "from_motion_p50": pct(e["from_motion"], 50), "from_motion_p90": pct(e["from_motion"], 90),
                     "from_motion": e["from_motion"]}
              for kind, e in by_kind.items()}
    out = {"thresholds": cal.thresholds, "faults": faults}
    if held is not None:
        out["normal"] = false_alarms(te.rejudge(held, cal, variant, lag_min_power=min_power))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", nargs="+", default=["real_twin"])
    parser.add_argument("--faults", nargs="+", default=["latency", "payload", "push"])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--calibrate-seconds", type=float, default=600.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--variant", action="append", help="name=value[,name=value] over TrustConfig, or base (repeat)")
    parser.add_argument("--normal-minutes", type=float, default=0.0,
                        help="also record this much held-out normal operation and count each variant's false alarms")
    args = parser.parse_args()

    from robot_wm.core.trust.settings import load_trust_config
    from robot_wm.learning import trust_eval as te

    unknown = sorted(set(args.faults) - set(te.FAULTS))
    if unknown:
        parser.error(f"--faults: unknown {unknown}; the injector's classes are {sorted(te.FAULTS)}")
    base, settings = load_trust_config()
    need = 3.0 + 2.0 * (1.0 / settings.exceedance) * 0.01  # the settle, then two halves of 1/exceedance periods
    if args.calibrate_seconds < need:
        parser.error(f"--calibrate-seconds {args.calibrate_seconds:g} is too short for exceedance {settings.exceedance:g} "
                     f"(config/trust.yaml): {math.ceil(need)} or more")
    try:
        variants = {text: parse_variant(text, base) for text in (args.variant or DEFAULT_VARIANTS)}
    except ValueError as exc:
        parser.error(str(exc))
    results = {}
    for profile in args.profiles:
        t0 = time.perf_counter()
        normal, runs, version, held = record(profile, args.faults, args.trials, args.calibrate_seconds, args.seed,
                                             args.normal_minutes)
        print(f"[{profile}] recorded {args.calibrate_seconds:g} s of normal operation, {len(runs)} trials"
              + (f" and {args.normal_minutes:g} held-out minutes" if held is not None else "")
              + f" in {time.perf_counter() - t0:.0f} s", flush=True)
        results[profile] = {}
        for text, variant in variants.items():
            r = results[profile][text] = judge(variant, normal, runs, version, held)
            parts = [f"{kind} p90 {f['p90']} (from motion p90 {f['from_motion_p90']}, missed {f['missed']}, "
                     f"not FULL at the onset {f['not_full_at_onset']})"
                     for kind, f in r["faults"].items()]
            if "normal" in r:
                n = r["normal"]
                parts.append(f"normal {n['normal_hours'] * 60:.1f} min: {n['false_alarms']} false alarms "
                             f"({n['false_alarms_per_hour']:.2f}/h), {n['false_anomalies']} anomalies")
            print(f"[{profile}] {text:<40} lag threshold {r['thresholds'].get('response_lag', float('nan')):.3f}: "
                  + "; ".join(parts), flush=True)
    print(json.dumps({"profiles": results, "trials": args.trials, "calibrate_seconds": args.calibrate_seconds}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
