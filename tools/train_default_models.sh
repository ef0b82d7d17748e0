#!/usr/bin/env bash
# Rebuild the shipped models from scratch with the robot-wm CLI, on CPU. These are the exact
# commands behind models/**/*.onnx; models/README.md lists what they reached.
# Parts: `reach` (models/: the world model and the reaching policy), `track` (models/track/: the
# tracking policy, which the policy node, eval --task track and the demo use), `reach_sim_only`
# and `track_sim_only` (the same recipes on nominal-simulator data without randomization ->
# models/<task>_sim_only/: the sim-only rows of `robot-wm report sim2real`); `sim_only` = both.
# Usage: tools/train_default_models.sh [PART ...]   (after `make setup`; default: reach track)
# Each policy trains on ONE torch thread (bit-reproducible for that thread count), so parts can
# run side by side, one per core, once the datasets and world models exist (the first run makes
# them): e.g. `tools/train_default_models.sh reach & tools/train_default_models.sh track & wait`.
# Never run two trainings with 2 threads each on 2 cores: they oversubscribe them (10x slower).
# Every step whose output exists (data/, runs/) is skipped: delete runs/ and data/ for a rebuild
# from scratch; keep them to re-evaluate and re-export after a change of the stack.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
parts=("${@:-reach track}")
parts=(${parts[*]})
want() { [[ " ${parts[*]} " == *" $1 "* ]]; }
set -x
[ -f data/sim_100k.npz ] || robot-wm collect --seed 0 --out data/sim_100k.npz
[ -f runs/world_model/world_model.pt ] || \
  robot-wm train world-model --data data/sim_100k.npz --out runs/world_model --seed 0

ship() {  # task, world model checkpoint, data, run name, destination
  local task=$1 wm=$2 data=$3 name=$4 dest=$5
  [ -f "runs/policy_$name/policy.pt" ] || \
    robot-wm train policy --task "$task" --data "$data" --world-model "$wm" --out "runs/policy_$name" --seed 0 \
      --threads 1
  robot-wm export --world-model "$wm" --policy "runs/policy_$name/policy.pt" --out "runs/models_$name"
  for profile in nominal real_twin; do
    robot-wm eval --task "$task" --policy "runs/models_$name/policy.onnx" --profile $profile --episodes 200 \
      --seed 0 --json > "runs/eval_${name}_$profile.json"
  done
  for profile in nominal real_twin worn_heavy; do
    robot-wm eval --task "$task" --stack --models "runs/models_$name" --profile $profile --episodes 64 \
      --seed 0 --json > "runs/stack_${name}_$profile.json"
  done
  python - "$name" <<'PY'
import json, sys
name = sys.argv[1]
metrics = {}
for kind, profiles in (("eval", ("nominal", "real_twin")), ("stack", ("nominal", "real_twin", "worn_heavy"))):
    for profile in profiles:
        report = json.load(open(f"runs/{kind}_{name}_{profile}.json"))
        metrics[f"{kind}_{profile}"] = {k: report[k] for k in ("episodes", "seed", "policy", "baseline") if k in report}
json.dump(metrics, open(f"runs/eval_metrics_{name}.json", "w"), indent=2)
PY
  robot-wm export --world-model "$wm" --policy "runs/policy_$name/policy.pt" \
    --eval-metrics "runs/eval_metrics_$name.json" --out "$dest"
}

want reach && ship reach runs/world_model/world_model.pt data/sim_100k.npz reach models
want track && ship track runs/world_model/world_model.pt data/sim_100k.npz track models/track
if want sim_only || want reach_sim_only || want track_sim_only; then
  [ -f data/sim_nominal_100k.npz ] || robot-wm collect --seed 0 --no-randomization --out data/sim_nominal_100k.npz
  [ -f runs/world_model_nominal/world_model.pt ] || \
    robot-wm train world-model --data data/sim_nominal_100k.npz --out runs/world_model_nominal --seed 0
  for task in reach track; do
    if want sim_only || want ${task}_sim_only; then
      ship $task runs/world_model_nominal/world_model.pt data/sim_nominal_100k.npz ${task}_sim_only models/${task}_sim_only
    fi
  done
fi
