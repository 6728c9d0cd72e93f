#!/usr/bin/env bash
# Every GPU measurement the open issues still ask for, as one command that fits one lease of a
# single H100 / H200 (the device tool: 15 minutes of device time per session, 10 per command).
#
#   bash scripts/device_checks.sh OUT_DIR                 # on the GPU machine
#   bash scripts/device_checks.sh OUT_DIR tiny            # the same steps on CPU, `tiny` sizes
#   CHECK_ARGS=1 bash scripts/device_checks.sh OUT_DIR    # each step's flags parsed, nothing run
#
# Steps, most wanted first; each has its own time limit, cut to what is left of BUDGET_S (default
# 540 s; a step is skipped, and logged so, when less than 30 s are left):
#   update16      issue 22: the GRPO update of qwen3_0p6b, 16 × (256 + 768) tokens, bf16 (goal:
#                 ≥ 40 % MFU against 989 TFLOP/s) and its peak memory (`bench_update.py`)
#   sampler       issue 24: Sampler.generate, qwen3_0p6b bf16, 64 prompts × 1 and 8 × 8, prompt
#                 128, 256 new tokens, beside `transformers.generate`; decode as a fraction of the
#                 HBM roofline, first call (compile) seconds (`bench_sampler.py`)
#   sampler256    issue 24: the same at 256 rows (256 × 1, 32 × 8), ours only
#   long_tail     issue 24: continuous vs static batching, geometric lengths (mean 128, cap 1024)
#   sampler1p7b   issue 24: the deeper preset, 64 rows, ours only
#   update4       issue 22: the update at 4 × 1024 beside PyTorch eager (`--torch_reference`)
# Three files come back (the device tool returns at most 8): OUT_DIR/results.jsonl (every step's
# JSON lines, each with its "step"), OUT_DIR/logs.txt (the end of each step's log) and
# OUT_DIR/summary.txt (each step's exit status and seconds).
#
# On the device machine (python 3.12, jax / flax / optax / orbax / torch / transformers there;
# ml_collections carried as a wheel), from the repository root:
#   here, once:  echo /.whl/ >> .git/info/exclude; python3 -m pip download --no-deps \
#                  --only-binary=:all: --python-version 3.12 --implementation cp \
#                  --platform manylinux_2_17_x86_64 -d .whl ml_collections==1.1.0
#   device run (carry [".whl"], timeout_s 600):
#     python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#       --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
#     PYTHONUNBUFFERED=1 bash scripts/device_checks.sh $OUT
set -uo pipefail
OUT=${1:?usage: scripts/device_checks.sh OUT_DIR [tiny]}
SIZE=${2:-real}
BUDGET_S=${BUDGET_S:-540}
# CHECK_ARGS=1: each script only parses its flags (absl's --only_check_args), for the test.
CHECK=()
[[ ${CHECK_ARGS:-0} == 1 ]] && CHECK=(--only_check_args)
PY=${PYTHON:-python3}
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD"
START=$SECONDS

if [[ $SIZE == tiny ]]; then
  # A CPU dry run of the same steps (tests/scripts/test_bench_scripts.py): every flag as on the
  # GPU, sizes shrunk so that the whole script takes a minute or two.
  M=tiny; M2=tiny; DT=float32; PROMPT=8; NEW=8; ROWS=8; ROWS_BIG=16; GROUP=4
  CPU=(--cpu_devices=0)
  UPDATE=(--batch=2 --prompt_len=8 --completion_len=8 --peak_tflops=0 --matmul_n=64 --steps=1)
  TAIL=(--long_tail_rows=16 --long_tail_slots=4 --mean_length=4 --long_tail_cap=16)
  REPEATS=1; L_UPDATE=120; L_SAMPLE=120; L_TAIL=120
else
  M=qwen3_0p6b; M2=qwen3_1p7b; DT=bfloat16; PROMPT=128; NEW=256; ROWS=64; ROWS_BIG=256; GROUP=8
  CPU=()
  UPDATE=(--steps=5)
  TAIL=(--long_tail_rows=256 --long_tail_slots=64 --mean_length=128 --long_tail_cap=1024)
  REPEATS=3; L_UPDATE=150; L_SAMPLE=180; L_TAIL=180
fi
SAMPLE=(--model="$M" --dtype="$DT" --prompt_len="$PROMPT" --max_new_tokens="$NEW"
        --repeats="$REPEATS" "${CPU[@]}")

step() {  # step <name> <limit s> <memory fraction> <script> <flags...>
  local name=$1 limit=$2 fraction=$3 script=$4
  shift 4
  local left=$((BUDGET_S - (SECONDS - START)))
  if ((left < 30)); then
    echo "$name skipped (${left} s of BUDGET_S left)" | tee -a "$OUT/summary.txt"
    return
  fi
  ((limit > left)) && limit=$left
  local tic=$SECONDS
  XLA_PYTHON_CLIENT_MEM_FRACTION=$fraction timeout "$limit" "$PY" "scripts/$script" "$@" \
    "${CHECK[@]}" > "$WORK/$name.out" 2> "$WORK/$name.log"
  local rc=$?
  grep '^{' "$WORK/$name.out" | sed "s/^{/{\"step\": \"$name\", /" >> "$OUT/results.jsonl"
  { echo "==== $name (rc=$rc): $script $*"; tail -n 30 "$WORK/$name.log"; } >> "$OUT/logs.txt"
  echo "$name rc=$rc $((SECONDS - tic)) s" | tee -a "$OUT/summary.txt"
}

: > "$OUT/summary.txt"; : > "$OUT/results.jsonl"; : > "$OUT/logs.txt"
WORK=$(mktemp -d)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader >> "$OUT/summary.txt" 2>/dev/null
step update16 "$L_UPDATE" 0.9 bench_update.py --model="$M" "${UPDATE[@]}"
step sampler "$L_SAMPLE" 0.5 bench_sampler.py "${SAMPLE[@]}" --batch="$ROWS" --group="$GROUP"
step sampler256 "$L_SAMPLE" 0.9 bench_sampler.py "${SAMPLE[@]}" --batch="$ROWS_BIG" \
  --group="$GROUP" --skip_transformers
step long_tail "$L_TAIL" 0.9 bench_sampler.py --workload=long_tail --model="$M" --dtype="$DT" \
  --prompt_len="$PROMPT" --repeats="$REPEATS" "${TAIL[@]}" "${CPU[@]}"
step sampler1p7b "$L_SAMPLE" 0.9 bench_sampler.py "${SAMPLE[@]}" --model="$M2" --batch="$ROWS" \
  --group="$GROUP" --skip_transformers
step update4 "$L_UPDATE" 0.45 bench_update.py --model="$M" --batch=4 --torch_reference \
  "${UPDATE[@]}"
echo "total $((SECONDS - START)) s" | tee -a "$OUT/summary.txt"
