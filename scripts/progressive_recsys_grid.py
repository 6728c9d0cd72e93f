r"""The progressive LP → FFT → RFT grid (arXiv 2608.06792, synthetic analogue), its table and plot.

Per seed, in this process, each run in `<workdir>/seed_<s>/<run>/` after the run it starts from
(configs/progressive_recsys.py's `sweep`; finished runs, with a `final.json`, are skipped):

  pretrain → sft1                         1-phase SFT
  pretrain → lp → fft                     LP → FFT
  fft → rft                               LP → FFT → RFT (GRPO with the frozen ordinal RM)
  fft → rft_beta<b> (per --extra_betas)   the same with another KL coefficient β

and RM-as-ranker is the fft run's reward model ranking the items (its `eval/rm/*`). Prints one
JSON line per run and per table row (mean ± std over seeds) and writes the plot:

  python scripts/progressive_recsys_grid.py --workdir=/tmp/progressive_recsys \
      --out=docs/progressive_recsys_grid.png
  python scripts/progressive_recsys_grid.py --workdir=/tmp/prs_smoke --arg=runlocal --seeds=1

`--arg` is the config argument (after the colon) shared by every run; `phase=` is added per run.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from absl import app, flags

from jaxrl_post.config_args import load_module

ROOT = Path(__file__).resolve().parents[1]
flags.DEFINE_string("workdir", None, "Root of the grid's run directories.", required=True)
flags.DEFINE_string("arg", "", "Config argument shared by every run (e.g. runlocal).")
flags.DEFINE_integer("seeds", 3, "Seeds 0 … n−1.")
flags.DEFINE_list("extra_betas", ["1.0"], "Extra RFT runs with these KL coefficients β.")
flags.DEFINE_string("out", "docs/progressive_recsys_grid.png", "The plot ('' = none).")
FLAGS = flags.FLAGS

METRICS = ("rank_ndcg", "funnel_ndcg", "deep_rate", "click_rate")


def run_one(module, arg: str, seed: int, phase: str, workdir: Path, start: Path | None,
            **overrides) -> dict:
  """Trains one phase (skipped when `final.json` exists) and returns its `final.json`."""
  from jaxrl_post.methods.progressive_recsys import ProgressiveRecsys
  from jaxrl_post.training import loop

  final = workdir / "final.json"
  if not final.exists():
    config = module.get_config(",".join(filter(None, [arg, f"phase={phase}"])))
    config.seed = seed
    config.metric_writers = "jsonl"
    config.init_from = str(start) if start else ""
    for key, value in overrides.items():
      section, name = key.split(".")
      config[section][name] = value
    tic = time.perf_counter()
    loop.train(config, workdir, ProgressiveRecsys(config))
    print(json.dumps({"run": workdir.name, "seed": seed, "seconds": round(
      time.perf_counter() - tic, 1)}), flush=True)
  return json.loads(final.read_text())


def grid(module, root: Path, arg: str, seeds: int, extra_betas) -> dict[str, list[dict]]:
  """`{row: [per-seed metrics]}` for the table's rows."""
  rows: dict[str, list[dict]] = {}
  for seed in range(seeds):
    d = root / f"seed_{seed}"
    runs = {}
    for phase in module.PHASE_NAMES:
      start = module.STARTS[phase]
      runs[phase] = run_one(module, arg, seed, phase, d / phase, d / start if start else None)
    for beta in extra_betas:
      runs[f"rft_beta{beta}"] = run_one(module, arg, seed, "rft", d / f"rft_beta{beta}",
                                        d / "fft", **{"rft.beta": float(beta)})
    beta = module.get_config(arg).rft.beta
    table = {"1-phase SFT": runs["sft1"], "LP only": runs["lp"], "LP→FFT": runs["fft"],
             f"LP→FFT→RFT (GRPO w/ RM, β={beta})": runs["rft"],
             "RM-as-ranker": {m: runs["fft"][f"rm/{m}"] for m in METRICS}}
    for beta in extra_betas:
      table[f"LP→FFT→RFT (β={beta})"] = runs[f"rft_beta{beta}"]
    for name, result in table.items():
      rows.setdefault(name, []).append({m: float(result[m]) for m in METRICS})
  return rows


def summarize(rows: dict[str, list[dict]]) -> list[dict]:
  import numpy as np

  out = []
  for name, per_seed in rows.items():
    line = {"method": name, "seeds": len(per_seed)}
    for m in METRICS:
      values = np.array([r[m] for r in per_seed])
      line[m] = round(float(values.mean()), 4)
      line[f"{m}_std"] = round(float(values.std()), 4)
    out.append(line)
  return out


def plot(summary: list[dict], path: Path) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  import numpy as np

  fig, axs = plt.subplots(1, 3, figsize=(13, 3.8))
  names = [s["method"] for s in summary]
  for ax, (metric, title) in zip(axs, (("rank_ndcg", "Rank NDCG@10 (click gains)"),
                                       ("funnel_ndcg", "Funnel NDCG@10 (level gains)"),
                                       ("deep_rate", "deep-engagement rate (top 5)"))):
    means = [s[metric] for s in summary]
    stds = [s[f"{metric}_std"] for s in summary]
    ax.bar(np.arange(len(names)), means, yerr=stds, capsize=3,
           color=[f"C{i}" for i in range(len(names))])
    ax.set_xticks(np.arange(len(names)), names, rotation=35, ha="right", fontsize=7)
    ax.set_title(title, fontsize=9)
    lo = min(m - s for m, s in zip(means, stds))
    ax.set_ylim(max(0.0, lo - 0.05), None)
  fig.suptitle(f"Progressive LP→FFT→RFT, synthetic recommender ({summary[0]['seeds']} seeds, "
               "mean ± std)", fontsize=10)
  fig.tight_layout()
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(path, dpi=120)


def main(argv):
  del argv
  module = load_module(ROOT / "configs" / "progressive_recsys.py")
  root = Path(FLAGS.workdir)
  tic = time.perf_counter()
  rows = grid(module, root, FLAGS.arg, FLAGS.seeds, FLAGS.extra_betas)
  summary = summarize(rows)
  for line in summary:
    print(json.dumps(line), flush=True)
  (root / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
  if FLAGS.out:
    plot(summary, ROOT / FLAGS.out if not Path(FLAGS.out).is_absolute() else Path(FLAGS.out))
  print(json.dumps({"grid_seconds": round(time.perf_counter() - tic, 1)}), flush=True)


if __name__ == "__main__":
  app.run(main)
