r"""GTN-R (arXiv 2608.08010): does TS-GRPO "collapse" in hard regions, and does GTN-R prevent it?

  python scripts/gtn_r_collapse.py [--seeds 0,1,2] [--pretrain_steps 1500] [--rl_steps 300] \
      [--workdir /tmp/gtn_r_collapse] [--plot docs/gtn_r_collapse.png]

Per seed: NLL pretraining on the pretraining mix (configs/gtn_r.py:stage=pretrain), then from
that checkpoint three GRPO runs on the RL mix, each the `GTNR` method on the one loop:
  none               TS-GRPO
  neighbourhood_nll  GTN-R A (λ·neighbourhood NLL)
  anchored_group     GTN-R B (K anchors ỹ ~ N_δ(y*) in each group)
Budgets are matched: every variant draws the same G policy forecasts for the same series per
step and makes one update per step for the same number of steps. The neighbourhood draws of A
(M per series) and the anchors of B (K per group) come from y*, not from the policy; they are
extra, free members (B's groups have G + K members).

Prints one JSON line per (seed, variant, evaluation step) with the held-out metrics (MSE of the
predictive mean overall / hard / easy, mass near the truth π(RMS((y − y*)/σ̂) ≤ δ_eval), the
predictive std, the distance of the mean to y*) and the hard-region rollout reward, then one
`summary` line per variant (final values, mean ± std over seeds). Plots the curves to --plot.
All GTN-R numbers are the PROPOSAL defaults of configs/gtn_r.py.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import numpy as np

from jaxrl_post.config_args import load_module
from jaxrl_post.methods.gtn_r import GTNR
from jaxrl_post.training import loop
from jaxrl_post.training.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[1]
CONFIG = load_module(ROOT / "configs" / "gtn_r.py")
VARIANTS = ("none", "neighbourhood_nll", "anchored_group")
LABELS = {"none": "TS-GRPO", "neighbourhood_nll": "GTN-R A (nbhd NLL)",
          "anchored_group": "GTN-R B (anchored group)"}
EVAL_KEYS = ("mse", "mse_hard", "mse_easy", "mass_near_truth", "mass_near_truth_hard",
             "mass_near_truth_easy", "pred_std", "pred_std_hard", "distance_hard", "nll_hard",
             "crps_hard", "mass_within_1_hard", "mass_within_2_hard", "mass_within_4_hard")


def _config(arg: str, args, **overrides):
  config = CONFIG.get_config(arg)
  config.pretrain_steps, config.rl_steps = args.pretrain_steps, args.rl_steps
  config.update(overrides)
  return config


def _train(config, workdir: Path) -> list[dict]:
  loop.train(config, workdir, GTNR(config))
  return read_metrics(workdir)


def _eval_rows(records, seed, variant):
  """One row per evaluation, with the hard-region rollout reward of the last 25 steps."""
  rewards = [(r["step"], float(r["rollout/reward_hard"])) for r in records
             if "rollout/reward_hard" in r]
  rewards = [(s, v) for s, v in rewards if np.isfinite(v)]
  rows = []
  for r in records:
    if "eval/mse" not in r:
      continue
    recent = [v for s, v in rewards if r["step"] - 25 < s <= r["step"]]
    rows.append({"seed": seed, "variant": variant, "step": r["step"],
                 **{k: float(r[f"eval/{k}"]) for k in EVAL_KEYS},
                 "reward_hard": float(np.mean(recent)) if recent else None})
  return rows


def _plot(rows, path: str):
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  panels = (("mse_hard", "test MSE, hard regions (σ̂² units)"),
            ("mse_easy", "test MSE, other series"),
            ("pred_std_hard", "hard: predictive std (σ̂ units)"),
            ("mass_within_2_hard", "hard: π(RMS err ≤ 2σ̂)"),
            ("mass_near_truth_easy", "other series: π(RMS err ≤ 0.5σ̂)"),
            ("reward_hard", "hard: rollout reward (−MSE/σ̂², 25-step mean)"))
  fig, axes = plt.subplots(2, 3, figsize=(13, 7))
  axes = axes.reshape(-1)
  for ax, (key, title) in zip(axes, panels):
    for variant in VARIANTS:
      steps = sorted({r["step"] for r in rows if r["variant"] == variant})
      vals = np.array([[r[key] if r[key] is not None else np.nan for r in rows
                        if r["variant"] == variant and r["step"] == s] for s in steps], float)
      m, sd = np.nanmean(vals, 1), np.nanstd(vals, 1)
      ax.plot(steps, m, label=LABELS[variant])
      ax.fill_between(steps, m - sd, m + sd, alpha=0.2)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("RL step")
  axes[0].legend(fontsize=8)
  fig.suptitle("GTN-R miniature: TS-GRPO vs GTN-R from one NLL-pretrained forecaster "
               "(mean ± std, 3 seeds)", fontsize=10)
  fig.tight_layout()
  fig.savefig(path, dpi=100)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seeds", default="0,1,2")
  parser.add_argument("--pretrain_steps", type=int, default=1500)
  parser.add_argument("--rl_steps", type=int, default=300)
  parser.add_argument("--workdir", default="/tmp/gtn_r_collapse")
  parser.add_argument("--plot", default=str(ROOT / "docs" / "gtn_r_collapse.png"))
  args = parser.parse_args()
  seeds = [int(s) for s in args.seeds.split(",")]
  root = Path(args.workdir)
  shutil.rmtree(root, ignore_errors=True)
  rows, start = [], time.process_time()
  for seed in seeds:
    pre = root / f"seed_{seed}" / "pretrain"
    records = _train(_config(f"stage=pretrain,seed={seed}", args), pre)
    final = [r for r in records if "eval/mse" in r][-1]
    print(json.dumps({"seed": seed, "variant": "pretrain", "step": final["step"],
                      **{k: float(final[f"eval/{k}"]) for k in EVAL_KEYS}}), flush=True)
    for variant in VARIANTS:
      config = _config(f"variant={variant},seed={seed}", args, init_from=str(pre))
      new = _eval_rows(_train(config, root / f"seed_{seed}" / variant), seed, variant)
      for row in new:
        print(json.dumps(row), flush=True)
      rows += new
  last = max(r["step"] for r in rows)
  for variant in VARIANTS:
    final = [r for r in rows if r["variant"] == variant and r["step"] == last]
    first = [r for r in rows if r["variant"] == variant and r["step"] == 0]
    out = {"summary": variant, "step": last, "seeds": len(final)}
    for key in EVAL_KEYS + ("reward_hard",):
      vals = np.array([r[key] for r in final], float)
      out[key] = [float(np.mean(vals)), float(np.std(vals))]
    vals = np.array([f[k] for f in first for k in ("mass_near_truth_hard",)], float)
    out["mass_near_truth_hard_step0"] = [float(np.mean(vals)), float(np.std(vals))]
    print(json.dumps(out), flush=True)
  _plot(rows, args.plot)
  print(json.dumps({"cpu_seconds": round(time.process_time() - start, 1), "plot": args.plot}))


if __name__ == "__main__":
  main()
