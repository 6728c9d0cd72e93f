r"""Turns a workdir's `metrics.jsonl` into PNG curves.

  python scripts/plot_metrics.py --workdir=/tmp/grpo_arith            # all numeric metrics
  python scripts/plot_metrics.py --workdir=/tmp/grpo_arith \
      --metrics=train/reward_correct,eval/accuracy --out=/tmp/grpo.png

Several `--workdir`s (comma-separated) are drawn on the same axes, one line each.
"""

import math
import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display needed

import matplotlib.pyplot as plt  # noqa: E402
from absl import app, flags  # noqa: E402

from jaxrl_post.training.metrics import read_metrics  # noqa: E402

_WORKDIRS = flags.DEFINE_list("workdir", None, "Workdir(s) holding metrics.jsonl.")
_METRICS = flags.DEFINE_list("metrics", [], "Metric names (default: all numeric ones).")
_OUT = flags.DEFINE_string("out", None, "Output PNG (default: <first workdir>/metrics.png).")
flags.mark_flag_as_required("workdir")


def run_labels(workdirs) -> dict[str, str]:
  """Each workdir's legend label: its path below the workdirs' common parent, so that runs
  named alike (`rows/a/seed0`, `rows/b/seed0`) stay apart; the folder name for one run.

  Examples:
    >>> run_labels(["/r/grpo/seed0", "/r/rail/seed0"])
    {'/r/grpo/seed0': 'grpo/seed0', '/r/rail/seed0': 'rail/seed0'}
  """
  paths = [Path(w).resolve() for w in workdirs]
  if len(paths) < 2:
    return {w: p.name for w, p in zip(workdirs, paths)}
  parent = Path(os.path.commonpath(paths))
  return {w: str(p.relative_to(parent)) if p != parent else p.name
          for w, p in zip(workdirs, paths)}


def plot(workdirs, metrics, out) -> Path:
  runs = {w: read_metrics(w) for w in workdirs}
  labels = run_labels(workdirs)
  if not metrics:
    names = {k for records in runs.values() for r in records for k, v in r.items()
             if k != "step" and isinstance(v, (int, float))}
    metrics = sorted(names)
  if not metrics:
    raise ValueError(f"no numeric metrics in {workdirs}")
  cols = min(3, len(metrics))
  rows = math.ceil(len(metrics) / cols)
  fig, axes = plt.subplots(rows, cols, figsize=(4.5 * cols, 3.2 * rows), squeeze=False)
  # One colour per run in every panel, also where a run lacks a metric.
  colors = {w: f"C{i % 10}" for i, w in enumerate(runs)}
  for ax, name in zip(axes.flat, metrics):
    for workdir, records in runs.items():
      points = [(r["step"], r[name]) for r in records if isinstance(r.get(name), (int, float))]
      if points:
        ax.plot(*zip(*points), marker="." if len(points) < 30 else None,
                label=labels[workdir], color=colors[workdir])
    ax.set_title(name, fontsize=9)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
  for ax in list(axes.flat)[len(metrics):]:
    ax.axis("off")
  if len(runs) > 1:
    axes.flat[0].legend(fontsize=8)
  fig.tight_layout()
  out = Path(out or Path(workdirs[0]) / "metrics.png")
  fig.savefig(out, dpi=110)
  plt.close(fig)
  return out


def main(argv):
  del argv
  print(plot(_WORKDIRS.value, _METRICS.value, _OUT.value))


if __name__ == "__main__":
  app.run(main)
