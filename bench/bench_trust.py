"""Benchmark: the trust monitor in library mode (the embedded arm, the shipped policy through the
safety filter, the world model and the TrustTracker: the objects the nodes run).

Per profile: a calibration from normal operation (config/trust.yaml's exceedance and floors), then
for each fault class of the injector ``--trials`` runs with the fault at a random time: the
detection latency in control periods (the first period below FULL; p50/p90; also counted from the
first command change after the onset, the first moment a command-path fault can show), how many
were seen within 100 ms and which level they reached; then ``--normal-minutes`` of held-out normal operation:
false alarms (level drops below FULL after the start-up) per hour; and the monitor's compute per
period (p50/p99 µs). Numbers, not pass/fail; the last line is one JSON object.

    python bench/bench_trust.py [--profiles nominal real_twin] [--trials 10] [--normal-minutes 20]
                                [--calibrate-seconds 300]      (about 12 min per profile on 2 cores)
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np


def bench_profile(profile: str, trials: int, normal_minutes: float, calibrate_s: float, seed: int) -> dict:
    from robot_wm.core.trust.settings import load_trust_config
    from robot_wm.core.world_model_runner import WorldModelRunner
    from robot_wm.learning import trust_eval as te
    from robot_wm.learning.stack_eval import build_stack

    config, settings = load_trust_config()
    stack = build_stack(0.01)
    version = WorldModelRunner(stack.world_model_path, tuple(stack.kinematics.joint_names), 0.01, analytic=False).version
    t0 = time.perf_counter()
    normal = te.operate(profile, calibrate_s, seed, config=config, stack=stack)
    cal = te.calibrate_run(normal, settings.exceedance, settings.floor_map(), config, model_version=version,
                           source=f"bench:{profile}", alarms_per_hour=settings.alarms_per_hour)
    print(f"[{profile}] calibrated on {calibrate_s:g} s in {time.perf_counter() - t0:.0f} s: "
          + ", ".join(f"{k} {v:.3g}" for k, v in cal.thresholds.items()), flush=True)
    rng = np.random.default_rng(seed + 1)
    faults = {}
    compute: list[float] = []
    for kind in (te.FAULTS if trials > 0 else ()):
        latencies, levels, from_motion = [], [], []
        for k in range(trials):
            t_fault = float(rng.uniform(8.0, 12.0))  # after the start-up's climb to FULL (6 s)
            run = te.operate(profile, t_fault + 3.0, seed + 100 + k, calibration=cal, config=config, stack=stack,
                             fault=(kind, t_fault))
            compute += run.monitor_us
            latencies.append(te.detection_latency_periods(run))
            excited = te.excitation_delay_periods(run)
            if latencies[-1] is not None and excited is not None:  # the clock from the first command change
                from_motion.append(max(latencies[-1] - excited, 0.0))
            after = run.level[run.t_s >= t_fault]
            levels.append(int(after.max()) if after.size else 0)
        seen = [x for x in latencies if x is not None]
        faults[kind] = {
            "trials": trials, "detected": len(seen),
            "within_100ms": sum(1 for x in seen if x <= 10),
            "latency_periods_p50": float(np.percentile(seen, 50)) if seen else None,
            "latency_periods_p90": float(np.percentile(seen, 90)) if seen else None,
            "worst_level": {name: levels.count(v) for v, name in enumerate(("FULL", "CAUTIOUS", "SLOW", "STOP", "HUMAN"))
                            if levels.count(v)},
            "dynamic": kind in te.DYNAMIC_FAULTS,
            "from_motion_p50": float(np.percentile(from_motion, 50)) if from_motion else None,
            "from_motion_p90": float(np.percentile(from_motion, 90)) if from_motion else None,
        }
        f = faults[kind]
        print(f"[{profile}] {kind:<13} detected {f['detected']}/{trials}, within 100 ms {f['within_100ms']}, "
              f"latency p50 {f['latency_periods_p50']} p90 {f['latency_periods_p90']} periods (from the first command "
              f"change after the onset: p50 {f['from_motion_p50']} p90 {f['from_motion_p90']}), levels {f['worst_level']}",
              flush=True)
    seconds = normal_minutes * 60.0
    held = te.operate(profile, seconds, seed + 7, calibration=cal, config=config, stack=stack)
    compute += held.monitor_us
    reached = np.flatnonzero(held.level == 0)
    start = held.t_s[reached[0]] if reached.size else held.t_s[-1]
    drops = te.level_drops(held, after_s=start)
    hours = (held.t_s[-1] - start) / 3600.0
    # an anomaly: two signals at once (STOP by evidence), as opposed to one signal's caution
    anomalies = [e for e in held.events if e[0] >= start and e[1] == "STOP" and e[2].count(" > ") >= 2]
    by_signal: dict[str, int] = {}
    for e in held.events:
        if e[0] >= start and e[1] != "FULL":
            for name in ("prediction_error", "disagreement", "intervention", "effort_error"):
                if f"{name} " in e[2] and e[2].split(f"{name} ")[1].split(";")[0].find(" > ") >= 0:
                    by_signal[name] = by_signal.get(name, 0) + 1
    result = {
        "profile": profile, "thresholds": cal.thresholds, "faults": faults,
        "normal_hours": hours, "false_alarms": int(len(drops)),
        "false_alarms_per_hour": len(drops) / hours if hours > 0 else None,
        "false_anomalies": len(anomalies), "false_anomalies_per_hour": len(anomalies) / hours if hours > 0 else None,
        "false_alarm_signals": by_signal,
        "false_alarm_reasons": [e[2][:160] for e in held.events if e[0] >= start and e[1] != "FULL"][:5],
        "monitor_us_p50": float(np.percentile(compute, 50)), "monitor_us_p99": float(np.percentile(compute, 99)),
    }
    print(f"[{profile}] normal operation {hours * 60:.1f} min: {len(drops)} false alarms "
          f"({result['false_alarms_per_hour']:.2f}/h; by signal {by_signal}), {len(anomalies)} of them two-signal "
          f"anomalies ({result['false_anomalies_per_hour']:.2f}/h); monitor compute p50 {result['monitor_us_p50']:.0f} us, "
          f"p99 {result['monitor_us_p99']:.0f} us", flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", nargs="+", default=["nominal", "real_twin"])
    parser.add_argument("--trials", type=int, default=10, help="runs per fault class (0: false alarms only)")
    parser.add_argument("--normal-minutes", type=float, default=20.0, help="held-out normal operation (minutes)")
    parser.add_argument("--calibrate-seconds", type=float, default=300.0,
                        help="normal operation to calibrate on (s; at exceedance 1e-4 at least ~210 s)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    calibrate_s = args.calibrate_seconds
    results = [bench_profile(p, args.trials, args.normal_minutes, calibrate_s, args.seed) for p in args.profiles]
    print(json.dumps({"bench": "trust", "results": results}, default=float))


if __name__ == "__main__":
    sys.exit(main())
