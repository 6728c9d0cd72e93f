#!/usr/bin/env bash
# The RL-family comparison on the task mixture (configs/rl_family_common.py), end to end: the
# mixed SFT student, then every row × SEEDS from it with the same budget, optimizer and
# evaluation, then the table and plots.
#
#   bash scripts/rl_family_grid.sh /tmp/rlg            # then: cat /tmp/rlg/table.md
#
# Rows (config:variant):
#   grpo            plain GRPO: uniform prompts, no replay (the baseline of every row)
#   trajval         TrajVal's learnability prior (a probe run per seed first: probe<seed>)
#   headroom_drift  Headroom-Drift replay (K_rep = half the fresh groups, τ = 1e-3)
#   naive_replay    replay of the newest groups, no gate (the paper's naive replay)
#   matched         on-policy with as many fresh groups as a replay step updates on
# Retention rows (continual post-training: train on the mixture's arithmetic domain only, keep
# countdown and format — `eval/<domain>/accuracy`; RETAIN_STEPS steps, evaluated at 0 and end):
#   retain_grpo     plain GRPO on arithmetic
#   retain_gcpo     GCPO: updates outside the starting weights' principal subspaces (k = 8)
#   retain_cokl     CoKL: correctness-conditioned KL to cached reference answers
#   retain_rkl      full-policy reverse KL (k3, β = 0.04), CoKL's baseline
#   retain_rapo     RAPO's risk-aware per-prompt scale (R-Scale) on its RLOO backbone
# Reward-side rows on 1-3 digit arithmetic (SIDE_STEPS steps, evaluated at 0, half and end):
#   wmrl_env        GRPO on real rewards, through WMRL's advantage (configs/wmrl.py:mode=env)
#   wmrl_raw        the stand-in world model alone, uncorrected
#   wmrl            anchors + isotonic debiasing + inverse-variance weights
#   care            rubric rewards whose rubrics evolve (pool of 64 prompts, so they recur)
#   care_static     the initial (hackable) rubric throughout, same pool
# Rollout-intervention rows on the mixture's arithmetic (configs/rail.py; STEPS steps): RAIL's
# budget is extra rollouts for the groups its bandit picks, so compare rewards with the
# rail/extra_tokens it spent.
#   rail            the LinUCB bandit, shadow-to-live (arXiv 2608.05080's reconstruction)
#   rail_heuristic  extra rollouts for every all-0 / all-1 group (the heuristic baseline)
#   rail_none       plain GRPO with the RAIL config (no extra rollouts)
#   rail_live       the bandit acts from the first decision (no shadow phase; not in ROWS)
#   rail_share      LinUCB α = 0.1, live once it wins ≥ half of the last 50 decisions (not in ROWS)
# Shared-control rows on the mixture (configs/cd_rft.py; one micro-batch, one PPO mini-batch):
#   cd_rft          the SCB penalty at γ = 0.01 (the PROPOSAL default)
#   cd_rft_g0.1     γ = 0.1
#   cd_rft_g0       γ = 0: the matched GRPO step (SCB logged, no penalty)
#   cd_rft_d<γ>     this project's variant γ·sg(‖Δθ‖)·SCB (configs/cd_rft.py:scale=displacement),
#                   whose gradient does not grow near θ⁰; not in the default ROWS
# (SCB needs ≥ 2 families with a policy gradient: these rows need the mixed student, not an
# arithmetic-only one, which earns no countdown / format reward and logs SCB = 0 throughout.)
#
# Knobs (environment): SEEDS (default "0 1 2"), STEPS (default 20), PROMPTS (prompts per step,
# default 16; 8 rollouts each), EVAL_EXAMPLES (default 256), EVAL_EVERY (default 5), ROWS (a
# subset of the rows above), JOBS (seeds at once, default 1), STUDENT (an SFT run directory; by
# default $R/sft, trained here with configs/opd_mix.py:sft, ≈ 32 min), RETAIN_STEPS (default 12),
# RETAIN_LR (the retention rows' learning rate; default the configs' 5e-5), SIDE_STEPS
# (default 16), RAIL_TASK (the rail rows' task, configs/rail.py:task=; default arith,
# `quickstart` for the README quickstart's task and GRPO recipe). A finished stage leaves
# <run>/DONE and is skipped on a rerun; an interrupted one resumes. DRY_RUN=1 prints the commands.
set -euo pipefail
R=${1:?usage: scripts/rl_family_grid.sh <root dir>}
SEEDS=${SEEDS:-"0 1 2"}
STEPS=${STEPS:-20}
PROMPTS=${PROMPTS:-16}
EVAL_EXAMPLES=${EVAL_EXAMPLES:-256}
EVAL_EVERY=${EVAL_EVERY:-5}
JOBS=${JOBS:-1}
RETAIN_STEPS=${RETAIN_STEPS:-12}
SIDE_STEPS=${SIDE_STEPS:-16}
RETAIN_LR=${RETAIN_LR:-}  # the retention rows' learning rate (default: the configs' 5e-5)
RAIL_TASK=${RAIL_TASK:-arith}
ROWS=${ROWS:-"grpo trajval headroom_drift naive_replay matched retain_grpo retain_gcpo \
retain_cokl retain_rkl retain_rapo wmrl_env wmrl_raw wmrl care care_static rail rail_heuristic \
rail_none cd_rft_g0 cd_rft cd_rft_g0.1"}
cd "$(dirname "$0")/.."
mkdir -p "$R"

source scripts/grid_stage.sh  # stage <run dir> <command...>; lanes; DRY_RUN

STUDENT=${STUDENT:-$R/sft}
[[ $STUDENT == "$R/sft" ]] && stage "$R/sft" python experiments/sft.py \
  --config=configs/opd_mix.py:sft --workdir="$R/sft" --verbosity=-1

common() {  # the budget and evaluation every row shares
  echo --config.init_from="$STUDENT" --config.seed="$1" --config.steps="$STEPS" \
    --config.prompts_per_step="$PROMPTS" --config.eval_every="$EVAL_EVERY" \
    --config.checkpoint_every="$STEPS" --config.eval_examples="$EVAL_EXAMPLES" \
    --config.eval_pass_k=0 --verbosity=-1
}
row() {  # row <name> <seed>
  local name=$1 seed=$2 dir=$R/runs/$1/seed$2
  case $name in
    grpo) stage "$dir" python experiments/grpo.py --config=configs/headroom_drift.py:replay=none \
            --workdir="$dir" $(common "$seed") ;;
    trajval)
      stage "$R/runs/probe/seed$seed" python experiments/grpo.py \
        --config=configs/trajval.py:probe --workdir="$R/runs/probe/seed$seed" \
        $(common "$seed") --config.steps="$STEPS" --config.eval_every="$STEPS"
      stage "$dir" python experiments/grpo.py --config=configs/trajval.py --workdir="$dir" \
        $(common "$seed") --config.task_prior.probe="$R/runs/probe/seed$seed" ;;
    headroom_drift|naive_replay)
      local rule=${name/naive_replay/naive}
      stage "$dir" python experiments/grpo.py --config="configs/headroom_drift.py:replay=$rule" \
        --workdir="$dir" $(common "$seed") --config.replay.budget=$((PROMPTS / 2)) \
        --config.replay.max_candidates="$PROMPTS" --config.replay.capacity=$((PROMPTS * 2)) ;;
    matched) stage "$dir" python experiments/grpo.py \
               --config=configs/headroom_drift.py:replay=none --workdir="$dir" \
               $(common "$seed") --config.prompts_per_step=$((PROMPTS + PROMPTS / 2)) ;;
    retain_*)
      local variant
      case $name in
        retain_grpo) variant=configs/headroom_drift.py:replay=none,task=mixture/arith ;;
        retain_gcpo) variant=configs/gcpo.py ;;
        retain_cokl) variant=configs/cokl.py:task=mixture/arith ;;
        retain_rkl) variant=configs/cokl.py:kl=reverse,task=mixture/arith ;;
        retain_rapo) variant=configs/rapo.py:prior=uniform,task=mixture/arith ;;
      esac
      local extra=()
      [[ $name == retain_cokl || $name == retain_rkl ]] && extra+=(--config.ppo_mini_batches=1)
      [[ -n $RETAIN_LR ]] && extra+=(--config.optimizer.lr="$RETAIN_LR")
      stage "$dir" python experiments/grpo.py --config="$variant" --workdir="$dir" \
        $(common "$seed") --config.steps="$RETAIN_STEPS" --config.eval_every="$RETAIN_STEPS" \
        --config.checkpoint_every="$RETAIN_STEPS" "${extra[@]}" ;;
    wmrl*|care*)
      local variant extra=()
      case $name in
        wmrl_env) variant=configs/wmrl.py:mode=env ;;
        wmrl_raw) variant=configs/wmrl.py:mode=raw ;;
        wmrl) variant=configs/wmrl.py ;;
        care) variant=configs/care.py; extra+=(--config.num_train_examples=64) ;;
        care_static) variant=configs/care.py:mode=static
                     extra+=(--config.num_train_examples=64) ;;
      esac
      stage "$dir" python experiments/grpo.py --config="$variant" --workdir="$dir" \
        $(common "$seed") --config.steps="$SIDE_STEPS" --config.eval_every=$((SIDE_STEPS / 2)) \
        --config.checkpoint_every="$SIDE_STEPS" "${extra[@]}" ;;
    rail*)
      local variant
      case $name in
        rail) variant=mode=rail ;;
        rail_live) variant=mode=rail,switch=live ;;
        rail_share) variant=mode=rail,switch=share,alpha=0.1 ;;
        *) variant=mode=${name#rail_} ;;
      esac
      stage "$dir" python experiments/grpo.py --config="configs/rail.py:$variant,task=$RAIL_TASK" \
        --workdir="$dir" $(common "$seed") ;;
    cd_rft_d*)
      stage "$dir" python experiments/grpo.py \
        --config="configs/cd_rft.py:gamma=${name#cd_rft_d},scale=displacement" \
        --workdir="$dir" $(common "$seed") ;;
    cd_rft*)
      local gamma=${name#cd_rft_g}
      [[ $name == cd_rft ]] && gamma=0.01
      stage "$dir" python experiments/grpo.py --config="configs/cd_rft.py:gamma=$gamma" \
        --workdir="$dir" $(common "$seed") ;;
    *) echo "unknown row $name"; exit 1 ;;
  esac
}
seed_lane() {
  for name in $ROWS; do row "$name" "$1"; done
}
# shellcheck disable=SC2086  # SEEDS is a list
lanes seed_lane $SEEDS

((DRY_RUN)) || python scripts/rl_family_table.py --root="$R" --out="$R/table.md" --plots="$R"
