#!/usr/bin/env bash
# Rebuild the shipped default models from scratch with the robot-wm CLI, on CPU: one world model
# and the reaching policy (models/). These are the exact commands behind models/*.onnx;
# models/README.md lists what they reached.
# Optional parts: `track` (a tracking policy -> models/track/, which the policy node, eval --task
# track and the demo then use) and `sim_only` (the same recipe on nominal-simulator data ->
# models/track_sim_only/, the sim-only row of `robot-wm report sim2real`). No tracking policy is
# shipped yet: the one this recipe trains tracks to ~12 mm RMS, the scripted tracker to 2 mm.
# Usage: tools/train_default_models.sh [reach] [track] [sim_only]   (after `make setup`; default: reach)
# Run ONE training at a time: two torch processes on 2 cores oversubscribe them (10x slower).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
parts=("${@:-reach}")
parts=(${parts[*]})
want() { [[ " ${parts[*]} " == *" $1 "* ]]; }
set -x
[ -f data/sim_100k.npz ] || robot-wm collect --seed 0 --out data/sim_100k.npz
[ -f runs/world_model/world_model.pt ] || \
  robot-wm train world-model --data data/sim_100k.npz --out runs/world_model --seed 0

ship() {  # task, world model checkpoint, data, run name, destination
  local task=$1 wm=$2 data=$3 name=$4 dest=$5
  robot-wm train policy --task "$task" --data "$data" --world-model "$wm" --out "runs/policy_$name" --seed 0
  robot-wm export --world-model "$wm" --policy "runs/policy_$name/policy.pt" --out "runs/models_$name"
  for profile in nominal real_twin; do
    robot-wm eval --task "$task" --policy "runs/models_$name/policy.onnx" --profile $profile --episodes 200 \
      --seed 0 --json > "runs/eval_${name}_$profile.json"
    robot-wm eval --task "$task" --stack --models "runs/models_$name" --profile $profile --episodes 64 \
      --seed 0 --json > "runs/stack_${name}_$profile.json"
  done
  python - "$name" <<'PY'
import json, sys
name = sys.argv[1]
metrics = {}
for profile in ("nominal", "real_twin"):
    for kind, stem in (("eval", "eval"), ("stack", "stack")):
        report = json.load(open(f"runs/{stem}_{name}_{profile}.json"))
        metrics[f"{kind}_{profile}"] = {k: report[k] for k in ("episodes", "seed", "policy", "baseline") if k in report}
json.dump(metrics, open(f"runs/eval_metrics_{name}.json", "w"), indent=2)
PY
  robot-wm export --world-model "$wm" --policy "runs/policy_$name/policy.pt" \
    --eval-metrics "runs/eval_metrics_$name.json" --out "$dest"
}

want reach && ship reach runs/world_model/world_model.pt data/sim_100k.npz reach models
want track && ship track runs/world_model/world_model.pt data/sim_100k.npz track models/track
if want sim_only; then
  [ -f data/sim_nominal_100k.npz ] || robot-wm collect --seed 0 --no-randomization --out data/sim_nominal_100k.npz
  [ -f runs/world_model_nominal/world_model.pt ] || \
    robot-wm train world-model --data data/sim_nominal_100k.npz --out runs/world_model_nominal --seed 0
  ship track runs/world_model_nominal/world_model.pt data/sim_nominal_100k.npz track_sim_only models/track_sim_only
fi
