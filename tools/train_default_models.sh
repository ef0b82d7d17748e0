#!/usr/bin/env bash
# Rebuild the shipped default models (models/) from scratch with the robot-wm CLI, on CPU.
# These are the exact commands behind models/*.onnx; models/README.md lists what they reached.
# Usage: tools/train_default_models.sh   (after `make setup`; ~10 min on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
set -x
robot-wm collect --seed 0 --out data/sim_100k.npz
robot-wm train world-model --data data/sim_100k.npz --out runs/world_model --seed 0
robot-wm train policy --data data/sim_100k.npz --world-model runs/world_model/world_model.pt --out runs/policy --seed 0
robot-wm export --world-model runs/world_model/world_model.pt --policy runs/policy/policy.pt --out runs/models
robot-wm eval --policy runs/models/policy.onnx --profile nominal --episodes 200 --seed 0 --json > runs/eval_nominal.json
robot-wm eval --policy runs/models/policy.onnx --profile real_twin --episodes 200 --seed 0 --json > runs/eval_real_twin.json
python - <<'PY'
import json
metrics = {}
for profile in ("nominal", "real_twin"):
    report = json.load(open(f"runs/eval_{profile}.json"))
    metrics[f"eval_{profile}"] = {"episodes": report["episodes"], "seed": report["seed"], "policy": report["policy"], "baseline": report["baseline"]}
json.dump(metrics, open("runs/eval_metrics.json", "w"), indent=2)
PY
robot-wm export --world-model runs/world_model/world_model.pt --policy runs/policy/policy.pt \
  --eval-metrics runs/eval_metrics.json --out models
