#!/usr/bin/env bash
# The OPD-family comparison grid (configs/opd_family.py) on arithmetic, end to end: the quickstart's
# SFT student and GRPO teacher (the strong teacher), a weak teacher (GRPO from an earlier SFT
# checkpoint of the same run, weaker than the student), then every row × SEEDS from the same
# student with the same budget and evaluation, then the table and plots.
#
#   bash scripts/opd_family_grid.sh /tmp/ofg            # then: cat /tmp/ofg/table.md
#
# Rows (method[teacher]; S = strong, W = weak):
#   grpo                          the RL baseline (no teacher)
#   opd[S] tv_opd[S] tv_sign[S]   raw OPD, TV-OPD (c_k · sign Δ), the sign-only ablation
#   opd_then_rl[S]                OPD for the first half of the budget, then GRPO
#   joint:<b>[S]                  OPD-then-RL's seven joint baselines (its Table 1) at the same
#                                 budget: kdrl, kdrl_mask, srpo, hdpo, trrd, rlsd, kdrl_annealing
#   opd[W] oprd[W] opdvr[W]       OPRD's weak-to-strong setting; OPDVR with an often-wrong teacher
#   oprd_lambda0[W]               OPRD with λ = 0 (its paper's ablation: the same PPO loss and
#                                 group-centred advantage, no correction)
#   joint:kdrl[W]                 OPRD's strongest baseline in its paper
#   tgopd[W] grpd[W]              the other verifier-gated methods with the often-wrong teacher
#
# Knobs (environment): SEEDS (default "0 1 2"), STEPS (steps per run, default 40), PROMPTS
# (prompts per step, default 16; 8 rollouts each), EVAL_EXAMPLES (held-out prompts, default 256),
# WEAK_FROM (the SFT step the weak teacher starts from, default 200), WEAK_STEPS (its GRPO steps,
# default 20), ROWS (a subset of the rows above, space-separated), JOBS (runs at once, default 1).
# A stage that finished leaves <run>/DONE and is skipped on a rerun; an interrupted one resumes.
# DRY_RUN=1 prints every command (prefixed "+ ") and runs none.
set -euo pipefail
R=${1:?usage: scripts/opd_family_grid.sh <root dir>}
SEEDS=${SEEDS:-"0 1 2"}
STEPS=${STEPS:-40}
PROMPTS=${PROMPTS:-16}
EVAL_EXAMPLES=${EVAL_EXAMPLES:-256}
WEAK_FROM=${WEAK_FROM:-200}
WEAK_STEPS=${WEAK_STEPS:-20}
JOBS=${JOBS:-1}
JOINT_ROWS="joint:kdrl:S joint:kdrl_mask:S joint:srpo:S joint:hdpo:S joint:trrd:S joint:rlsd:S \
joint:kdrl_annealing:S"
ALL_ROWS="grpo opd:S tv_opd:S tv_sign:S opd_then_rl:S $JOINT_ROWS opd:W oprd:W opdvr:W \
joint:kdrl:W oprd_lambda0:W tgopd:W grpd:W"
ROWS=${ROWS:-$ALL_ROWS}
cd "$(dirname "$0")/.."
mkdir -p "$R"

source scripts/grid_stage.sh  # stage <run dir> <command...>; lanes; DRY_RUN

# 1. Student (quickstart SFT, greedy ≈ 0.73) and strong teacher (its 40 GRPO steps, ≈ 0.87).
stage "$R/quickstart" python experiments/quickstart.py --seed=0 --workdir="$R/quickstart"
STUDENT=$R/quickstart/sft
STRONG=$R/quickstart/grpo

# 2. Weak teacher: the same SFT run's checkpoint at step WEAK_FROM (greedy ≈ 0.33) is its pre-RL
#    reference; WEAK_STEPS of GRPO from there. Both stay below the student.
WEAK_REF=$R/weak_ref
if ((!DRY_RUN)) && [[ ! -d $WEAK_REF/checkpoints/$WEAK_FROM ]]; then
  mkdir -p "$WEAK_REF/checkpoints"
  cp -r "$STUDENT/checkpoints/$WEAK_FROM" "$WEAK_REF/checkpoints/"
  cp "$STUDENT/config.json" "$WEAK_REF/"
fi
stage "$R/weak" python experiments/grpo.py --config=configs/grpo_arith.py --workdir="$R/weak" \
  --config.init_from="$WEAK_REF" --config.steps="$WEAK_STEPS" --config.seed=0 \
  --config.prompts_per_step="$PROMPTS" --config.ppo_mini_batches=2 --config.num_micro_batches=1 \
  --config.optimizer.lr=2e-5 --config.eval_every="$WEAK_STEPS" \
  --config.eval_examples="$EVAL_EXAMPLES" --config.eval_pass_k=0 --verbosity=-1

# 3. The rows. Same student, budget, optimizer and evaluation everywhere; only the method and
#    its teacher change. opd_then_rl switches at half the budget.
row() {  # row <method:teacher> <seed>
  local spec=$1 seed=$2 method teacher extra=()
  teacher=${spec##*:}
  method=${spec%:*}
  [[ $spec == grpo ]] && { method=grpo; teacher=none; }
  case $teacher in
    S) extra+=(--config.distill.teacher="$STRONG") ;;
    W) extra+=(--config.distill.teacher="$R/weak" --config.distill.teacher_ref="$WEAK_REF") ;;
  esac
  local variant="method=$method"
  [[ $method == tv_sign ]] && variant="method=tv_opd,tv_variant=sign"
  [[ $method == oprd_lambda0 ]] && { variant="method=oprd"; extra+=(--config.distill.oprd_lambda=0); }
  [[ $method == opd_then_rl ]] && variant+=",switch=$((STEPS / 2))"
  local name=${method/:/_}_$teacher
  stage "$R/runs/$name/seed$seed" python experiments/opd_family.py \
    --config="configs/opd_family.py:$variant" --workdir="$R/runs/$name/seed$seed" \
    --config.init_from="$STUDENT" --config.seed="$seed" --config.steps="$STEPS" \
    --config.prompts_per_step="$PROMPTS" --config.ppo_mini_batches=2 \
    --config.num_micro_batches=1 --config.optimizer.lr=2e-5 \
    --config.eval_every=$((STEPS / 2)) --config.checkpoint_every="$STEPS" \
    --config.eval_examples="$EVAL_EXAMPLES" --config.eval_pass_k=0 "${extra[@]}" --verbosity=-1
}
seed_lane() {
  for spec in $ROWS; do row "$spec" "$1"; done
}
# shellcheck disable=SC2086  # SEEDS is a list
lanes seed_lane $SEEDS

((DRY_RUN)) || python scripts/opd_family_table.py --root="$R" --out="$R/table.md" --plots="$R"
