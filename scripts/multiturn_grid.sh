#!/usr/bin/env bash
# A multi-turn comparison (experiments/rtpo.py's modes) from one cold start: the SFT run, then
# every arm × SEEDS from it at the config's generated-token budget, then the paired table.
#
#   CONFIG=configs/temporal_grpo.py ARMS="turn_grpo stage_reward temporal_grpo" \
#       bash scripts/multiturn_grid.sh /tmp/tgrpo_kv      # then: cat /tmp/tgrpo_kv/table.md
#
# Each arm is a `method=` of CONFIG, or `<label>:<variant>` for an arm that is other config
# words (e.g. `no_kl:ablation=no_kl`, run in runs/no_kl); `<root>/sft` is the cold start
# (`method=sft`, SFT_STEPS steps), `<root>/runs/<arm>/seed<s>` the RL runs. The table
# (scripts/multiturn_table.py) compares every arm with BASELINE (default: the first arm) seed
# by seed on the same held-out episodes.
#
# Knobs (environment): CONFIG, ARMS, SEEDS (default "0 1 2"), SFT_STEPS (default 400: sampled
# success ≈ 0.2 at K = 4, room to improve; 800 steps saturate it), VARIANT (more config args,
# e.g. "horizon=6"), EXTRA (flags for every RL run), JOBS (seed lanes at once, default 1: each
# lane runs every arm of one seed in turn, so JOBS=3 runs the three seeds side by side),
# BASELINE (an arm's label), METRICS (comma-separated training metrics the table averages over
# steps), PLOT_X (the plot's x axis: step, the default, or tokens, for arms that spend different
# rollouts per step). A finished stage leaves <run>/DONE and is skipped on a rerun; DRY_RUN=1
# prints the commands.
set -euo pipefail
R=${1:?usage: scripts/multiturn_grid.sh <root dir>}
CONFIG=${CONFIG:?set CONFIG, e.g. configs/temporal_grpo.py}
ARMS=${ARMS:?set ARMS, the config methods to compare}
SEEDS=${SEEDS:-"0 1 2"}
SFT_STEPS=${SFT_STEPS:-400}
VARIANT=${VARIANT:+,$VARIANT}
EXTRA=${EXTRA:-}
JOBS=${JOBS:-1}
FIRST_ARM=${ARMS%% *}
BASELINE=${BASELINE:-${FIRST_ARM%%:*}}
cd "$(dirname "$0")/.."
mkdir -p "$R"

source scripts/grid_stage.sh  # stage <run dir> <command...>; DRY_RUN

stage "$R/sft" python experiments/rtpo.py --config="$CONFIG:method=sft$VARIANT" \
  --workdir="$R/sft" --config.steps="$SFT_STEPS" --verbosity=-1

seed_lane() {
  local arm label words
  for arm in $ARMS; do
    label=${arm%%:*} words="method=$arm"
    [[ $arm == *:* ]] && words=${arm#*:}
    # shellcheck disable=SC2086  # EXTRA is a list of flags
    stage "$R/runs/$label/seed$1" python experiments/rtpo.py \
      --config="$CONFIG:$words,seed=$1$VARIANT" --workdir="$R/runs/$label/seed$1" \
      --config.init_from="$R/sft" $EXTRA --verbosity=-1
  done
}
# shellcheck disable=SC2086  # SEEDS is a list
lanes seed_lane $SEEDS

((DRY_RUN)) || python scripts/multiturn_table.py --root="$R" --baseline="$BASELINE" \
  --metrics="${METRICS:-}" --out="$R/table.md" --plot="$R/sampled_success.png" \
  --plot_x="${PLOT_X:-step}"
