#!/usr/bin/env bash
# The Open-MOPD miniature (arXiv 2608.19098) end to end: mixed SFT → one GRPO teacher per domain
# → RouteRL / MixSFT references → the four methods × SEEDS → RouteOPD students → table and plots.
#
#   bash scripts/opd_reproduce.sh /tmp/mopd            # then: cat /tmp/mopd/table.md
#
# Knobs (environment): SEEDS (default "0 1 2"), STEPS (OPD steps per run, default 30),
# EVAL_EXAMPLES (held-out prompts per domain, default 128), SFT_STEPS (default 800),
# TEACHER_STEPS (GRPO steps per teacher, default 30). A stage that finished leaves
# <run>/DONE and is skipped when the script is rerun; an interrupted stage resumes from its
# checkpoint. Runtimes on 2 CPU cores are in docs/results.md.
set -euo pipefail
R=${1:?usage: scripts/opd_reproduce.sh <root dir>}
SEEDS=${SEEDS:-"0 1 2"}
STEPS=${STEPS:-30}
EVAL_EXAMPLES=${EVAL_EXAMPLES:-128}
SFT_STEPS=${SFT_STEPS:-800}
TEACHER_STEPS=${TEACHER_STEPS:-30}
CONFIG=configs/opd_mix.py
cd "$(dirname "$0")/.."
mkdir -p "$R"

# stage <run dir> <command...>: runs the command unless <run dir>/DONE exists; logs its time.
stage() {
  local dir=$1; shift
  if [[ -f $dir/DONE ]]; then echo "skip $dir (done)"; return; fi
  mkdir -p "$(dirname "$dir")"
  echo "$(date +%T) start $dir"
  local t0=$SECONDS
  "$@" --workdir="$dir" > "$dir.log" 2>&1 || { echo "FAILED $dir: see $dir.log"; exit 1; }
  echo "$((SECONDS - t0))" > "$dir/DONE"
  echo "$(date +%T) done $dir in $((SECONDS - t0)) s"
}

# 1. The mixed-SFT student (MixSFT), the start of every teacher and every OPD student.
stage "$R/sft" python experiments/sft.py --config=$CONFIG:sft --config.steps="$SFT_STEPS"

# 2. One GRPO teacher per domain from MixSFT (countdown with the settings of
#    configs/grpo_countdown.py's measured recipe).
stage "$R/teacher_arith" python experiments/grpo.py --config=configs/grpo_arith.py \
  --config.init_from="$R/sft" --config.steps="$TEACHER_STEPS"
stage "$R/teacher_countdown" python experiments/grpo.py --config=configs/grpo_countdown.py:numbers=2 \
  --config.init_from="$R/sft" --config.steps="$TEACHER_STEPS" --config.prompts_per_step=32 \
  --config.ppo_mini_batches=4 --config.num_micro_batches=1 \
  --config.optimizer.decay_steps=1000000000
stage "$R/teacher_format" python experiments/grpo.py --config=configs/grpo_format.py \
  --config.init_from="$R/sft" --config.steps="$TEACHER_STEPS"

# 3. References at step 0: RouteRL (each domain by its teacher) and MixSFT (the student).
stage "$R/route" python experiments/opd.py --config=$CONFIG:root=$R,steps=0 \
  --config.eval_examples="$EVAL_EXAMPLES"

# 4. RouteOPD: one single-teacher OPD student per domain (plain OPD, seed 0), each evaluated
#    on its own domain; the integration gap is Total(RouteOPD) − Total(method).
route_opd() {
  for domain in arith countdown format; do
    stage "$R/route_opd_$domain" python experiments/opd.py \
      --config=$CONFIG:root=$R,method=naive,only=$domain,steps=$STEPS \
      --config.eval_examples="$EVAL_EXAMPLES" --config.eval_every="$STEPS" \
      --config.eval_teachers=False
  done
}

# 5. The four methods, seed-major (RouteOPD after the first seed) so that a stopped pipeline
#    still has whole seeds. RouteRL is not re-evaluated: stage 3 has it.
first=1
for seed in $SEEDS; do
  for method in naive token_share gap open_mopd; do
    stage "$R/$method/seed$seed" python experiments/opd.py \
      --config=$CONFIG:root=$R,method=$method,steps=$STEPS --config.seed="$seed" \
      --config.eval_examples="$EVAL_EXAMPLES" --config.eval_every=$((STEPS / 2)) \
      --config.eval_teachers=False
  done
  if ((first)); then route_opd; first=0; fi
done

python scripts/opd_table.py "$R" --out="$R/table.md" --plots="$R"
