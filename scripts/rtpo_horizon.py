r"""RTPO's success-vs-horizon grid (arXiv 2608.18682): run it, then tabulate and plot it.

  python scripts/rtpo_horizon.py --config=configs/rtpo_kv.py --root=/tmp/rtpo_kv             # run
  python scripts/rtpo_horizon.py --config=configs/rtpo_kv.py --root=/tmp/rtpo_kv --dry_run   # print
  python scripts/rtpo_horizon.py --root=/tmp/rtpo_kv --summarize      # table + PNG

For every horizon K and seed: a cold-start SFT run (`method=sft`) in `<root>/k<K>/s<seed>/sft`,
then each method from it in `<root>/k<K>/s<seed>/<method>`, all at the config's generated-token
budget for that K. Runs go one after the other; each resumes from its checkpoint, so the
script can be stopped and started again (a finished run only re-prints its summary).

`--summarize` reads the final held-out greedy success (`eval/success`) of every run and prints a
markdown table (mean ± std over seeds, and the generated tokens and wall clock per run), then
writes `<root>/success_vs_horizon.png`.
"""

import shlex
import subprocess
import sys
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")  # files only, no display needed

import matplotlib.pyplot as plt  # noqa: E402
from absl import app, flags  # noqa: E402

from jaxrl_post.training.metrics import read_metrics  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("flat_grpo", "turn_grpo", "rtpo")

_CONFIG = flags.DEFINE_string("config", "configs/rtpo_kv.py", "The env's rtpo config file.")
_ROOT = flags.DEFINE_string("root", None, "Directory of the grid's workdirs.")
_HORIZONS = flags.DEFINE_list("horizons", ["2", "4", "6", "8"], "Horizons K.")
_SEEDS = flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds.")
_METHODS = flags.DEFINE_list("methods", list(METHODS), "RL methods.")
_EXTRA = flags.DEFINE_string("extra", "", "Further flags for every run, e.g. '--config.x=1'.")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Print the commands without running them.")
_SUMMARIZE = flags.DEFINE_bool("summarize", False, "Tabulate and plot instead of running.")
flags.mark_flag_as_required("root")


def commands(config: str, root: Path, horizons, seeds, methods, extra: str) -> list[list[str]]:
  """The grid's command lines, SFT before the methods that start from it."""
  out = []
  binary = [sys.executable, str(ROOT / "experiments" / "rtpo.py")]
  for k in horizons:
    for seed in seeds:
      base = root / f"k{k}" / f"s{seed}"
      for method in ("sft", *methods):
        command = [*binary, f"--config={config}:method={method},horizon={k},seed={seed}",
                   f"--workdir={base / method}"]
        if method != "sft":
          command.append(f"--config.init_from={base / 'sft'}")
        out.append(command + shlex.split(extra))
  return out


def _final(workdir: Path) -> dict | None:
  records = read_metrics(workdir)
  evals = [r for r in records if "eval/success" in r]
  if not evals:
    return None
  last = evals[-1]
  return {"success": last["eval/success"], "step": last["step"],
          "tokens": last.get("budget/generated_tokens", 0),
          "wall": max((r.get("time/wall", 0.0) for r in records), default=0.0)}


def summarize(root: Path) -> str:
  """A markdown table of final greedy success per (K, method), and the plot next to it."""
  results: dict[tuple[int, str], list[dict]] = {}
  for run in sorted(root.glob("k*/s*/*")):
    final = _final(run) if (run / "metrics.jsonl").exists() else None
    if final is not None:
      results.setdefault((int(run.parent.parent.name[1:]), run.name), []).append(final)
  if not results:
    raise ValueError(f"no finished runs under {root}")
  horizons = sorted({k for k, _ in results})
  methods = [m for m in ("sft", *METHODS) if any((k, m) in results for k in horizons)]
  lines = ["| K | " + " | ".join(methods) + " |", "|---|" + "---:|" * len(methods)]
  for k in horizons:
    cells = []
    for m in methods:
      runs = results.get((k, m), [])
      if not runs:
        cells.append("–")
        continue
      success = np.array([r["success"] for r in runs])
      tokens = np.mean([r["tokens"] for r in runs])
      wall = np.mean([r["wall"] for r in runs]) / 60
      cell = f"{success.mean():.3f} ± {success.std():.3f} (n={len(runs)})"
      if m != "sft":
        cell += f", {tokens / 1e3:.0f}k tok, {wall:.0f} min"
      cells.append(cell)
    lines.append(f"| {k} | " + " | ".join(cells) + " |")
  fig, ax = plt.subplots(figsize=(5, 3.5))
  for m in methods:
    ks = [k for k in horizons if (k, m) in results]
    means = [np.mean([r["success"] for r in results[(k, m)]]) for k in ks]
    stds = [np.std([r["success"] for r in results[(k, m)]]) for k in ks]
    ax.errorbar(ks, means, yerr=stds, marker="o", capsize=3,
                label="SFT start" if m == "sft" else m, linestyle="--" if m == "sft" else "-")
  ax.set_xlabel("horizon K (tool calls)")
  ax.set_ylabel("held-out greedy success")
  ax.set_xticks(horizons)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(root / "success_vs_horizon.png", dpi=110)
  plt.close(fig)
  return "\n".join(lines)


def main(argv):
  del argv
  root = Path(_ROOT.value)
  if _SUMMARIZE.value:
    print(summarize(root))
    print(f"plot: {root / 'success_vs_horizon.png'}")
    return
  grid = commands(_CONFIG.value, root, _HORIZONS.value, _SEEDS.value, _METHODS.value,
                  _EXTRA.value)
  for command in grid:
    print(shlex.join(command), flush=True)
    if not _DRY_RUN.value:
      subprocess.run(command, check=True, cwd=ROOT)


if __name__ == "__main__":
  app.run(main)
