#!/usr/bin/env bash
# The Open-MOPD miniature (arXiv 2608.19098) end to end: mixed SFT → one GRPO teacher per domain
# → RouteRL / MixSFT references → the methods × SEEDS → RouteOPD students → table and plots.
#
#   bash scripts/opd_reproduce.sh /tmp/mopd            # then: cat /tmp/mopd/table.md
#
# Knobs (environment): SEEDS (default "0 1 2"), METHODS (default: the paper's ablation rows
# "naive token_share gap naive_k4 share_gap_k4 open_mopd"; naive_k4 and share_gap_k4 are its
# matched controls, K = 4 inner updates without refresh), ROUTE_OPD (1: train the RouteOPD
# students after the first seed; 0: skip them), STEPS (OPD steps per run, default 30),
# EVAL_EXAMPLES (held-out prompts per domain, default 128), SFT_STEPS (default 800),
# TEACHER_STEPS (GRPO steps per teacher, default 30), JOBS (runs at once, default 1; `small`
# keeps about one core busy, so JOBS=2 on 2 cores finishes sooner), FORMAT_SFT_STEPS (default 0;
# n > 0 gives the format domain a specialist teacher: n steps of format-only SFT from MixSFT,
# then the same GRPO, which opens a large headroom in the short-answer domain). A stage that finished leaves
# <run>/DONE and is skipped when the script is rerun; an interrupted stage resumes from its
# checkpoint. DRY_RUN=1 prints every command. Runtimes on 2 CPU cores are in docs/results.md.
set -euo pipefail
R=${1:?usage: scripts/opd_reproduce.sh <root dir>}
SEEDS=${SEEDS:-"0 1 2"}
METHODS=${METHODS:-"naive token_share gap naive_k4 share_gap_k4 open_mopd"}
ROUTE_OPD=${ROUTE_OPD:-1}
STEPS=${STEPS:-30}
EVAL_EXAMPLES=${EVAL_EXAMPLES:-128}
SFT_STEPS=${SFT_STEPS:-800}
TEACHER_STEPS=${TEACHER_STEPS:-30}
JOBS=${JOBS:-1}
FORMAT_SFT_STEPS=${FORMAT_SFT_STEPS:-0}
CONFIG=configs/opd_mix.py
cd "$(dirname "$0")/.."
mkdir -p "$R"

source scripts/grid_stage.sh  # stage <run dir> <command...>; lanes; DRY_RUN

# 1. The mixed-SFT student (MixSFT), the start of every teacher and every OPD student.
stage "$R/sft" python experiments/sft.py --config=$CONFIG:sft --workdir="$R/sft" \
  --config.steps="$SFT_STEPS"

# 2. One GRPO teacher per domain from MixSFT (the task configs' default GRPO settings).
teacher() {
  local config=configs/grpo_$1.py start=$R/sft
  [[ $1 == countdown ]] && config=configs/grpo_countdown.py:numbers=2
  if [[ $1 == format ]] && ((FORMAT_SFT_STEPS > 0)); then
    start=$R/teacher_format_sft
    stage "$start" python experiments/sft.py --config=configs/grpo_format.py:sft \
      --workdir="$start" --config.init_from="$R/sft" --config.steps="$FORMAT_SFT_STEPS"
  fi
  stage "$R/teacher_$1" python experiments/grpo.py --config=$config --workdir="$R/teacher_$1" \
    --config.init_from="$start" --config.steps="$TEACHER_STEPS"
}
lanes teacher arith countdown format

# 3. References at step 0: RouteRL (each domain by its teacher) and MixSFT (the student).
stage "$R/route" python experiments/opd.py --config=$CONFIG:root=$R,steps=0 --workdir="$R/route" \
  --config.eval_examples="$EVAL_EXAMPLES"

# 4. RouteOPD: one single-teacher OPD student per domain (plain OPD, seed 0), each evaluated
#    on its own domain; the integration gap is Total(RouteOPD) − Total(method).
route_opd() {
  for domain in arith countdown format; do
    stage "$R/route_opd_$domain" python experiments/opd.py --workdir="$R/route_opd_$domain" \
      --config=$CONFIG:root=$R,method=naive,only=$domain,steps=$STEPS \
      --config.eval_examples="$EVAL_EXAMPLES" --config.eval_every="$STEPS" \
      --config.eval_teachers=False
  done
}

# 5. The methods, one lane per seed; RouteOPD is a lane of its own after the first seed.
#    RouteRL is not re-evaluated: stage 3 has it.
methods_of_seed() {
  if [[ $1 == route_opd ]]; then
    if ((ROUTE_OPD)); then route_opd; fi
    return 0
  fi
  for method in $METHODS; do
    stage "$R/$method/seed$1" python experiments/opd.py --workdir="$R/$method/seed$1" \
      --config=$CONFIG:root=$R,method=$method,steps=$STEPS --config.seed="$1" \
      --config.eval_examples="$EVAL_EXAMPLES" --config.eval_every=$((STEPS / 2)) \
      --config.eval_teachers=False
  done
}
read -ra seeds <<< "$SEEDS"
lanes methods_of_seed "${seeds[0]}" route_opd "${seeds[@]:1}"

((DRY_RUN)) || python scripts/opd_table.py "$R" --out="$R/table.md" --plots="$R"
