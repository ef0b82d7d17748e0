"""Several ``bench_mixed.py`` runs (seeds, with and without a joint calibration) in one figure.

    python bench/plot_mixed_runs.py RUN_DIR_OR_JSON[=LABEL] ... --out docs/FIGURE.png
                                    [--profile worn_heavy] [--reference-success 0.91 --reference-rms-mm 3.82]

Each argument is a ``bench_mixed.py`` output directory (its ``learning_curve.json``) or the JSON
itself, optionally ``=label``. Plots the stack's success and tracking-error median against the
real episodes for ``--profile``, with the reference (default: the shipped set on the nominal
simulator) as a dashed line.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--profile", default="worn_heavy")
    ap.add_argument("--reference-success", type=float, default=0.90625)
    ap.add_argument("--reference-rms-mm", type=float, default=3.819)
    ap.add_argument("--reference-label", default="shipped set on nominal")
    args = ap.parse_args()

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for spec in args.runs:
        path, _, label = spec.partition("=")
        path = Path(path)
        doc = json.loads((path / "learning_curve.json" if path.is_dir() else path).read_text())
        curve = doc["profiles"][args.profile]["curve"]
        label = label or f"{path.name} (seed {doc.get('seed', 0)})"
        x = [r["real_episodes"] for r in curve]
        axes[0].plot(x, [100 * r["success_rate"] for r in curve], "o-", label=label)
        axes[1].plot(x, [1e3 * r["tracking_rms_m_median"] for r in curve], "o-", label=label)
    axes[0].axhline(100 * args.reference_success, color="g", ls="--", lw=1, label=args.reference_label)
    axes[1].axhline(args.reference_rms_mm, color="g", ls="--", lw=1, label=args.reference_label)
    axes[0].set(xlabel="real episodes (MIXED)", ylabel="stack success (%)", ylim=(0, 105), title="success")
    axes[1].set(xlabel="real episodes (MIXED)", ylabel="tracking RMS median (mm)", title="tracking error")
    for ax in axes:
        ax.legend(fontsize=8)
    fig.suptitle(f"train mixed on {args.profile}: the stack on 32 new paths after N real episodes")
    fig.tight_layout()
    fig.savefig(args.out, dpi=90)
    plt.close(fig)
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
