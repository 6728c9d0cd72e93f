#!/usr/bin/env bash
# Starts one JAX process per node or per GPU of a SLURM allocation, with the environment
# `jax.distributed.initialize` needs, and runs COMMAND in each.
#
# Usage (inside an allocation: an sbatch script, salloc, or a sweep's job-array task):
#   scripts/launch_slurm.sh [--per=node|gpu] [--port=PORT] [--dry-run] -- COMMAND [ARGS...]
#
#   --per=node   one process per node that sees all the node's GPUs (default). Fewer
#                processes; JAX treats the node's GPUs as one process's local devices.
#   --per=gpu    one process per GPU (srun --ntasks-per-node=<GPUs per node>); each process
#                drives the GPU JAX_LOCAL_DEVICE_IDS names, all GPUs stay visible (NCCL can
#                still use peer-to-peer paths between them).
#   --port=PORT  coordinator port on the first node (default: 12345 + job id % 1000).
#   --dry-run    print the srun command, or inside a task the environment and command.
#
# Example (2 nodes × 8 GPUs = 16 devices, FSDP within a node, data parallel across nodes):
#   sbatch --nodes=2 --gpus-per-node=8 --time=04:00:00 --wrap \
#     "scripts/launch_slurm.sh --per=gpu -- python experiments/grpo.py \
#        --config=configs/grpo_arith.py:model=qwen3_8b --workdir=/shared/runs/grpo_8b \
#        --config.mesh.num_slices=2 --config.mesh.dcn_data=2"
#
# How it works: run outside a job step, the script calls `srun` on itself with the task
# layout; each task (JAXRL_POST_SLURM_TASK=1) then exports
#   JAX_COORDINATOR_ADDRESS  first node of $SLURM_JOB_NODELIST, plus the port
#   JAX_NUM_PROCESSES        $SLURM_NTASKS
#   JAX_PROCESS_ID           $SLURM_PROCID
#   JAX_LOCAL_DEVICE_IDS     $SLURM_LOCALID (--per=gpu only)
# and execs COMMAND; `parallel.mesh.maybe_initialize_distributed()` reads them.
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }

per="node"
port=""
dry_run=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --per=*) per="${1#*=}" ;;
    --port=*) port="${1#*=}" ;;
    --dry-run) dry_run=1 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
if [[ $# -eq 0 ]]; then
  usage >&2
  exit 2
fi
if [[ "$per" != "node" && "$per" != "gpu" ]]; then
  echo "--per must be node or gpu, got $per" >&2
  exit 2
fi
if [[ -z "${SLURM_JOB_ID:-}" ]]; then
  echo "not inside a SLURM allocation (SLURM_JOB_ID is unset); use sbatch or salloc" >&2
  exit 2
fi
port="${port:-$((12345 + SLURM_JOB_ID % 1000))}"

# First host of a node list such as "gpu[07-08,11],cpu3" -> "gpu07", without scontrol
# when it is not on PATH (scontrol knows every syntax, so it is preferred).
first_host() {
  local list="$1"
  if command -v scontrol > /dev/null 2>&1; then
    scontrol show hostnames "$list" | head -n 1
    return
  fi
  local first="${list%%,*}"
  if [[ "$list" == *"["* ]]; then
    local prefix="${list%%\[*}"
    local range="${list#*\[}"
    range="${range%%\]*}"
    range="${range%%,*}"
    first="${prefix}${range%%-*}"
  fi
  echo "$first"
}

if [[ "${JAXRL_POST_SLURM_TASK:-0}" != "1" ]]; then
  # Outer call: start the tasks, each re-entering this script.
  nodes="${SLURM_JOB_NUM_NODES:-${SLURM_NNODES:-1}}"
  if [[ "$per" == "gpu" ]]; then
    gpus="${SLURM_GPUS_PER_NODE:-${SLURM_GPUS_ON_NODE:-}}"
    gpus="${gpus##*:}"  # "h100:8" -> "8"
    if [[ -z "$gpus" ]]; then
      echo "--per=gpu needs --gpus-per-node in the allocation (SLURM_GPUS_PER_NODE unset)" >&2
      exit 2
    fi
    layout=(--nodes="$nodes" --ntasks-per-node="$gpus")
  else
    layout=(--nodes="$nodes" --ntasks-per-node=1)
  fi
  self="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
  cmd=(srun "${layout[@]}" --kill-on-bad-exit=1 --export=ALL,JAXRL_POST_SLURM_TASK=1
       bash "$self" --per="$per" --port="$port" -- "$@")
  if [[ $dry_run -eq 1 ]]; then
    printf '%q ' "${cmd[@]}"
    echo
    exit 0
  fi
  exec "${cmd[@]}"
fi

# Inner call: one task.
coordinator="$(first_host "$SLURM_JOB_NODELIST")"
export JAX_COORDINATOR_ADDRESS="$coordinator:$port"
export JAX_NUM_PROCESSES="$SLURM_NTASKS"
export JAX_PROCESS_ID="$SLURM_PROCID"
if [[ "$per" == "gpu" ]]; then
  export JAX_LOCAL_DEVICE_IDS="$SLURM_LOCALID"
fi
if [[ $dry_run -eq 1 ]]; then
  env | grep -E '^JAX_(COORDINATOR_ADDRESS|NUM_PROCESSES|PROCESS_ID|LOCAL_DEVICE_IDS)=' | sort
  printf '%q ' "$@"
  echo
  exit 0
fi
exec "$@"
