# Sourced by the grid scripts (opd_family_grid.sh, rl_family_grid.sh, multiturn_grid.sh):
# `stage <run dir> <command...>` runs the command with its output in <run dir>.log, then marks
# <run dir>/DONE with its wall-clock seconds; a stage whose DONE exists is skipped (a rerun
# resumes the grid), and DRY_RUN=1 prints every command (prefixed "+ ") instead of running it.
# `lanes <function> <arg>...` runs `<function> <arg>` for every arg, at most JOBS at once.
DRY_RUN=${DRY_RUN:-0}
stage() {
  local dir=$1; shift
  if ((DRY_RUN)); then echo "+ $*"; return; fi
  if [[ -f $dir/DONE ]]; then echo "skip $dir (done)"; return; fi
  mkdir -p "$(dirname "$dir")"
  echo "$(date +%T) start $dir"
  local t0=$SECONDS
  "$@" > "$dir.log" 2>&1 || { echo "FAILED $dir: see $dir.log"; exit 1; }
  mkdir -p "$dir"
  echo "$((SECONDS - t0))" > "$dir/DONE"
  echo "$(date +%T) done $dir in $((SECONDS - t0)) s"
}

lanes() {
  local fn=$1 arg running=0; shift
  for arg in "$@"; do
    "$fn" "$arg" &
    running=$((running + 1))
    if ((running >= ${JOBS:-1})); then wait -n; running=$((running - 1)); fi
  done
  wait
}
