r"""Table and plots of the Falcon Perception-HD reproduction (configs/perception_dense.py).

  python scripts/perception_table.py /tmp/perc --plots docs
  python scripts/perception_table.py /tmp/perc2 --plots docs --prefix perception_pointer

Reads `<root>/s<seed>/<run>/metrics.jsonl` for the runs `sft`, `rl`, `rl_nodetach`, `sft_more`
(plus the single-seed probes `rl_lr1e-5`, `rl_f1`, and the paper's optimizer `rl_paper`,
`rl_paper_main`, `rl_paper_lr1e-4`)
(and the wall-clock seconds in `<run>/done`, written by the reproduction loop), prints a Markdown
table of the final evaluation (mean ± std over seeds, and every seed), and writes
`<prefix>_f1_by_count.png`, `<prefix>_nms.png`, `<prefix>_rl_curves.png` and (when a `rl_paper`
run exists) `<prefix>_optimizer.png` to `--plots` (`--prefix` defaults to `perception`).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from absl import app, flags

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from jaxrl_post import script_flags  # noqa: E402
from jaxrl_post.training.metrics import read_metrics  # noqa: E402

FLAGS = flags.FlagValues()  # This script's own (see `script_flags`): tests import it.
_PLOTS = flags.DEFINE_string("plots", None, "directory of the plots (none without it)",
                             flag_values=FLAGS)
_PREFIX = flags.DEFINE_string("prefix", "perception", "file-name prefix of the plots",
                              flag_values=FLAGS)

RUNS = (("sft", "SFT (400 steps)"), ("sft_more", "SFT + 60 more steps (control)"),
        ("rl", "SFT → RL 60 steps (existence detached)"),
        ("rl_nodetach", "SFT → RL 60 steps (no detach)"),
        # Single-seed probes of the collapse (docs/results.md).
        ("rl_lr1e-5", "SFT → RL, lr 1e-5"), ("rl_f1", "SFT → RL, F1 reward"),
        # The paper's optimizer (`optimizer=paper` / `paper_main`, configs/perception_dense.py).
        ("rl_paper", "SFT → RL 60, paper's Muon + Lion (peak 5e-6)"),
        ("rl_paper_main", "SFT → RL 60, Muon + Lion 1e-5 → 1e-6"),
        ("rl_paper_lr1e-4", "SFT → RL 60, Muon + Lion at peak 1e-4 (paper's schedule)"))
MAIN_RUNS = RUNS[:4]  # The plots show the 3-seed grid only.
# The optimizer comparison plot: AdamW (the reported runs) against the paper's optimizer.
OPTIMIZER_RUNS = (("rl", "AdamW 1e-4 (reported)", "C2"),
                  ("rl_paper", "Muon + Lion, peak 5e-6 (paper)", "C6"),
                  ("rl_paper_main", "Muon + Lion, 1e-5 → 1e-6", "C7"),
                  ("rl_paper_lr1e-4", "Muon + Lion, peak 1e-4", "C8"))
BUCKETS = ("1-10", "11-50", "51-200", "201-500")
COLUMNS = (("eval/dense/f1@0.5", "dense F1@0.5"), ("eval/dense/nms_f1@0.5", "+NMS"),
           ("eval/dense/redundancy", "redundancy"), ("eval/dense/count_ratio", "pred/GT"),
           ("eval/ref/f1@0.5", "ref F1@0.5"), ("eval/ref/nms_f1@0.5", "ref +NMS"),
           ("eval/ref/mcc", "ref MCC"), ("eval/ref/count_ratio", "ref pred/GT"),
           ("eval/ref/malformed_rate", "malformed"))


def final_eval(workdir: Path) -> dict | None:
  evals = [r for r in read_metrics(workdir) if "eval/dense/f1@0.5" in r] if workdir.exists() else []
  return evals[-1] if evals else None


def collect(root: Path):
  seeds = sorted(int(p.name[1:]) for p in root.glob("s[0-9]*") if p.is_dir())
  table = {}
  for run, _ in RUNS:
    rows = {s: final_eval(root / f"s{s}" / run) for s in seeds}
    table[run] = {s: r for s, r in rows.items() if r is not None}
  return seeds, table


def fmt(values):
  values = [v for v in values if v is not None and np.isfinite(v)]
  if not values:
    return "–"
  return f"{np.mean(values):.3f} ± {np.std(values):.3f}" if len(values) > 1 else f"{values[0]:.3f}"


def runtime(root, run, seeds):
  """Mean seconds per run from the `done` markers that hold them (an empty marker: unknown)."""
  texts = [(root / f"s{s}" / run / "done").read_text().strip() for s in seeds
           if (root / f"s{s}" / run / "done").exists()]
  secs = [float(t) for t in texts if t]
  return f"{np.mean(secs):.0f}" if secs else "–"


def main(argv: list[str]) -> None:
  """`argv`: the program name and the root."""
  if len(argv) != 2:
    raise app.UsageError(f"expected one root, got {argv[1:]}")
  root = Path(argv[1])
  seeds, table = collect(root)
  print(f"seeds: {seeds}\n")
  print("| run | " + " | ".join(c[1] for c in COLUMNS) + " | s/run |")
  print("|---|" + "---|" * (len(COLUMNS) + 1))
  for run, label in RUNS:
    rows = table[run]
    cells = [fmt([rows[s].get(k) for s in rows]) for k, _ in COLUMNS]
    print(f"| {label} (n={len(rows)}) | " + " | ".join(cells)
          + f" | {runtime(root, run, seeds)} |")
  print("\nDense F1@0.5 by ground-truth count (raw / after NMS):\n")
  print("| run | " + " | ".join(BUCKETS) + " |")
  print("|---|" + "---|" * len(BUCKETS))
  for run, label in RUNS:
    rows = table[run]
    cells = [fmt([rows[s].get(f"eval/dense/f1@0.5/{b}") for s in rows]) + " / "
             + fmt([rows[s].get(f"eval/dense/nms_f1@0.5/{b}") for s in rows]) for b in BUCKETS]
    print(f"| {label} | " + " | ".join(cells) + " |")
  print("\nPer seed (dense F1@0.5, ref MCC):")
  for run, label in RUNS:
    print(f"  {run}: " + ", ".join(
      f"s{s} {r['eval/dense/f1@0.5']:.3f}/{r['eval/ref/mcc']:.3f}" for s, r in table[run].items()))
  if _PLOTS.value:
    plot(root, seeds, table, Path(_PLOTS.value), _PREFIX.value)


def plot(root, seeds, table, out: Path, prefix: str = "perception"):
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  out.mkdir(parents=True, exist_ok=True)
  fig, ax = plt.subplots(figsize=(7, 4))
  x = np.arange(len(BUCKETS))
  width = 0.2
  for i, (run, label) in enumerate(MAIN_RUNS):
    rows = table[run]
    vals = np.array([[rows[s].get(f"eval/dense/f1@0.5/{b}", np.nan) for b in BUCKETS]
                     for s in rows], np.float64).reshape(-1, len(BUCKETS))
    if not len(vals):
      continue
    ax.bar(x + (i - 1.5) * width, np.nanmean(vals, 0), width, yerr=np.nanstd(vals, 0),
           label=label, capsize=2)
  ax.set_xticks(x, BUCKETS)
  ax.set_xlabel("ground-truth objects per image")
  ax.set_ylabel("macro F1 @ IoU 0.5 (greedy, no NMS)")
  ax.set_title(f"Dense scenes, F1 by count bucket ({len(seeds)} seeds)")
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(out / f"{prefix}_f1_by_count.png", dpi=120)
  plt.close(fig)

  fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
  labels = ["SFT", "SFT+60", "RL (detach)", "RL (no detach)"]
  for ax, (raw, nmsed, title) in zip(axes, (("eval/dense/f1@0.5", "eval/dense/nms_f1@0.5",
                                             "dense F1@0.5"),
                                            ("eval/ref/f1@0.5", "eval/ref/nms_f1@0.5",
                                             "referring F1@0.5"))):
    for j, (key, name) in enumerate(((raw, "raw"), (nmsed, "with NMS"))):
      means = [np.mean([r[key] for r in table[run].values()]) if table[run] else np.nan
               for run, _ in MAIN_RUNS]
      ax.bar(np.arange(len(MAIN_RUNS)) + (j - 0.5) * 0.35, means, 0.35, label=name)
    ax.set_xticks(np.arange(len(MAIN_RUNS)), labels, rotation=20, fontsize=7)
    ax.set_title(title)
    ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(out / f"{prefix}_nms.png", dpi=120)
  plt.close(fig)

  fig, axes = plt.subplots(1, 3, figsize=(11, 3.2))
  for run, color in (("rl", "C2"), ("rl_nodetach", "C3"), ("rl_lr1e-5", "C4"), ("rl_f1", "C5")):
    for s in seeds:
      records = [r for r in read_metrics(root / f"s{s}" / run) if "train/reward" in r] \
        if (root / f"s{s}" / run).exists() else []
      if not records:
        continue
      steps = [r["step"] for r in records]
      for ax, key in zip(axes, ("train/reward", "train/pred_per_gt", "train/entropy_coord")):
        ax.plot(steps, [r[key] for r in records], color=color, alpha=0.7,
                label=run if s == seeds[0] else None)
  for ax, key in zip(axes, ("reward −(FN + 0.3·FP)", "predicted / GT objects",
                            "coord-head entropy (nats)")):
    ax.set_title(key, fontsize=9)
    ax.set_xlabel("RL step")
  axes[0].legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(out / f"{prefix}_rl_curves.png", dpi=120)
  plt.close(fig)
  if any(table[run] for run, _, _ in OPTIMIZER_RUNS[1:]):
    plot_optimizers(root, seeds, out / f"{prefix}_optimizer.png")


def plot_optimizers(root, seeds, path: Path):
  """RL curves per optimizer: reward, boxes per GT, and the size of each update ‖Δθ‖."""
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, 3, figsize=(11, 3.2))
  keys = (("train/reward", "reward −(FN + 0.3·FP)"), ("train/pred_per_gt", "predicted / GT"),
          ("train/update_norm", "‖Δθ‖ per step (log)"))
  for run, label, color in OPTIMIZER_RUNS:
    first = True
    for s in seeds:
      workdir = root / f"s{s}" / run
      records = [r for r in read_metrics(workdir) if "train/reward" in r] \
        if workdir.exists() else []
      if not records:
        continue
      steps = [r["step"] for r in records]
      for ax, (key, _) in zip(axes, keys):
        ax.plot(steps, [r.get(key, np.nan) for r in records], color=color, alpha=0.7,
                label=label if first else None)
      first = False
  for ax, (_, title) in zip(axes, keys):
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("RL step")
  axes[2].set_yscale("log")
  axes[0].legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


if __name__ == "__main__":
  script_flags.run(main, FLAGS)
