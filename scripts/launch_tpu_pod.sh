#!/usr/bin/env bash
# Runs one command on every worker of a TPU VM pod slice, the way JAX's multi-controller
# runtime wants it: the same program, started at the same time on each host.
#
# Usage:
#   scripts/launch_tpu_pod.sh [options] TPU_NAME -- COMMAND [ARGS...]
#
# Options:
#   --zone=ZONE          TPU zone (default: $TPU_ZONE, else gcloud's configured zone)
#   --project=PROJECT    GCP project (default: gcloud's configured project)
#   --repo_dir=DIR       directory of this repository on the workers (default: ~/jaxrl_post)
#   --setup="CMD"        run first on every worker (e.g. "pip install -e .[tpu]")
#   --copy               copy the local working tree to --repo_dir on every worker first
#   --dry-run            print the gcloud commands instead of running them
#
# Example (a v5p-32 slice, 4 workers × 4 chips, one GRPO run over all 16 chips):
#   scripts/launch_tpu_pod.sh --zone=us-east5-a my-v5p-32 -- \
#       python experiments/grpo.py --config=configs/grpo_arith.py:model=qwen3_8b \
#       --workdir=gs://my-bucket/grpo_arith --config.mesh.ici_tensor=4
#
# Every worker gets JAXRL_POST_DISTRIBUTED=1; `parallel.mesh.maybe_initialize_distributed()`
# then calls `jax.distributed.initialize()`, which on TPU VMs finds the coordinator, the
# process count and this worker's id by itself. Use a workdir every worker can reach
# (a gs:// bucket or shared disk): process 0 writes metrics, all processes write checkpoints.
# To stop a run on every worker: gcloud compute tpus tpu-vm ssh TPU --worker=all \
#   --command="pkill -f experiments/"   (gcloud runs it once per worker).
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }

zone="${TPU_ZONE:-}"
project=""
repo_dir="~/jaxrl_post"
setup=""
copy=0
dry_run=0
tpu=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --zone=*) zone="${1#*=}" ;;
    --project=*) project="${1#*=}" ;;
    --repo_dir=*) repo_dir="${1#*=}" ;;
    --setup=*) setup="${1#*=}" ;;
    --copy) copy=1 ;;
    --dry-run) dry_run=1 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    -*) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
    *) if [[ -z "$tpu" ]]; then tpu="$1"; else echo "unexpected argument $1" >&2; exit 2; fi ;;
  esac
  shift
done
if [[ -z "$tpu" || $# -eq 0 ]]; then
  usage >&2
  exit 2
fi

gcloud_args=(compute tpus tpu-vm)
target=("$tpu" --worker=all)
[[ -n "$zone" ]] && target+=("--zone=$zone")
[[ -n "$project" ]] && target+=("--project=$project")

# The command, quoted once so that it survives the remote shell intact.
printf -v command '%q ' "$@"
remote="set -e; cd $repo_dir"
[[ -n "$setup" ]] && remote+="; $setup"
remote+="; JAXRL_POST_DISTRIBUTED=1 exec $command"

run() {
  if [[ $dry_run -eq 1 ]]; then
    printf '%q ' "$@"
    echo
  else
    "$@"
  fi
}

if [[ $copy -eq 1 ]]; then
  here="$(cd "$(dirname "$0")/.." && pwd)"
  run gcloud "${gcloud_args[@]}" ssh "${target[@]}" --command="mkdir -p $repo_dir"
  run gcloud "${gcloud_args[@]}" scp --recurse "$here/." "$tpu:$repo_dir" \
    "${target[@]:1}"
fi
run gcloud "${gcloud_args[@]}" ssh "${target[@]}" --command="$remote"
