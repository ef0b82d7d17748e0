"""Benchmark: the trust monitor beside a fault that lasts (library mode).

``bench_trust.py`` measures how soon a fault is seen, in 3 s trials. A payload picked up stays: one
signal (the effort) stays over its threshold, the arm at SLOW, and what matters then is whether the
monitor goes on to STOP (the filter latches it: the arm is held until an operator resets it) and on
what. This operates the embedded arm under the whole stack with the shipped calibration and
config/trust.yaml for ``--seconds``, the fault injected at ``--fault-at``, once per seed and
profile, and reports every level change after the fault with its reason, and the STOPs.

    python bench/bench_trust_lasting.py [--profiles real_twin nominal] [--fault payload] [--seeds 4]
        [--seconds 100] [--fault-at 10] [--variant anomaly_window_s=0] [--retare-at 15]

``--retare-at`` has the operator re-tare then (e-stop, ``tare``, reset): the payload is declared to the
trust monitor's effort model (docs/trust.md, "A payload the operator declares"). Each run also reports
the levels' shares and the effort signal's median over the last half after the fault.

``--variant`` changes config/trust.yaml's values as bench_trust_variants.py's do
(``anomaly_window_s=0``: the rule before the window). The last line is one JSON object.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profiles", nargs="+", default=["real_twin", "nominal"])
    ap.add_argument("--fault", default="payload", help="a fault of trust_eval.FAULTS")
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=100.0)
    ap.add_argument("--fault-at", type=float, default=10.0)
    ap.add_argument("--variant", default="base", help="name=value[,name=value] over config/trust.yaml (base: as it is)")
    ap.add_argument("--retare-at", type=float, default=None,
                    help="an operator's re-tare then (e-stop, tare, reset): a payload declared to the trust monitor")
    args = ap.parse_args(argv)

    import numpy as np
    from bench_trust_variants import parse_variant
    from robot_wm.core.safety.limits import TrustLevel
    from robot_wm.core.trust import calibration as calib_io
    from robot_wm.core.trust.settings import load_trust_config
    from robot_wm.learning import trust_eval as te

    config, _ = parse_variant(args.variant, load_trust_config()[0])
    rows, t0 = [], time.time()
    for profile in args.profiles:
        cal = calib_io.load(te.default_calibration_path(profile))
        for seed in range(args.seeds):
            run = te.operate(profile, args.seconds, seed, calibration=cal, config=config, fault=(args.fault, args.fault_at),
                             retare_at_s=args.retare_at)
            events = [(round(t - args.fault_at, 2), level, reason) for t, level, reason in run.events if t > args.fault_at]
            stops = [e for e in events if e[1] in ("STOP", "HUMAN")]
            # the last half of the run after the fault (after the re-tare's reset, with --retare-at)
            late = run.t_s >= args.fault_at + 0.5 * (args.seconds - args.fault_at)
            share = {lv.name: round(float(np.mean(run.level[late] == int(lv))), 3) for lv in TrustLevel}
            effort = run.raw["effort_error"]
            rows.append({"profile": profile, "seed": seed, "events": events, "stops": len(stops),
                         "first_stop_s": stops[0][0] if stops else None, "late_share": share,
                         "effort_median_before": float(np.nanmedian(effort[run.t_s < args.fault_at])),
                         "effort_median_late": float(np.nanmedian(effort[late]))})
            print(f"{profile} seed {seed}: " + (f"STOP {stops[0][0]:+.1f} s after the {args.fault}: {stops[0][2]}"
                                                if stops else f"no STOP in {args.seconds - args.fault_at:g} s after the "
                                                f"{args.fault}; levels {[e[1] for e in events][:6]}")
                  + f"; last half: FULL {share['FULL']:.0%}, effort median {rows[-1]['effort_median_late']:.2f} "
                  f"(before the fault {rows[-1]['effort_median_before']:.2f}, threshold "
                  f"{cal.thresholds.get('effort_error', float('nan')):.2f})", flush=True)
    doc = {"benchmark": "trust_lasting", "fault": args.fault, "variant": args.variant, "seconds": args.seconds,
           "fault_at_s": args.fault_at, "wall_s": round(time.time() - t0, 1),
           "stopped": {p: sum(1 for r in rows if r["profile"] == p and r["stops"]) for p in args.profiles},
           "runs": rows}
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
