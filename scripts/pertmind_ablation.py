r"""PertMind's reward ablation on the synthetic atlas: gene-only vs gene + pathway reward vs
shuffled pathway labels (arXiv 2608.16419 §4.3 "Ablations"; PROPOSAL analogue).

Per seed: one SFT stage on the structured traces (the shared RL init and frozen KL reference),
then grammar-constrained GRPO (configs/pertmind.py) with each reward. Every policy is scored
by greedy constrained decoding on queries of the HELD-OUT cell lines: accuracy and macro-F1 of
the gene label (Up / Down / No). Prints one JSON line per (seed, arm) and a summary line, and
plots docs/pertmind_ablation.png.

  python scripts/pertmind_ablation.py                       # 3 seeds (≈ 10 min on 2 cores)
  python scripts/pertmind_ablation.py --seeds=0 --sft_steps=20 --rl_steps=2 --eval_examples=24
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

from jaxrl_post.config_args import load_module
from jaxrl_post.methods.grpo import GRPO
from jaxrl_post.methods.sft import SFT
from jaxrl_post.rewards.pertmind import LABELS, parse
from jaxrl_post.training import loop

ROOT = Path(__file__).resolve().parents[1]
CONFIG = load_module(ROOT / "configs" / "pertmind.py")
ARMS = ("sft", "gene", "pathway", "shuffled")


def macro_f1(gold, pred) -> float:
  """Mean over the three labels of F1 (an unparsed prediction counts as wrong)."""
  scores = []
  for label in LABELS:
    tp = sum(g == label and p == label for g, p in zip(gold, pred))
    fp = sum(g != label and p == label for g, p in zip(gold, pred))
    fn = sum(g == label and p != label for g, p in zip(gold, pred))
    scores.append(0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn))
  return float(np.mean(scores))


def evaluate(sampler, params, task, n: int) -> dict[str, float]:
  records = [task.make_example("test", i) for i in range(n)]
  rollout = sampler.generate(params, [r["prompt"] for r in records], greedy=True,
                             max_new_tokens=CONFIG.COMPLETION_LEN)
  pred = [parse(t)[1] for t in sampler.decode_text(rollout)]
  gold = [r["answer"] for r in records]
  return {"accuracy": float(np.mean([g == p for g, p in zip(gold, pred)])),
          "macro_f1": macro_f1(gold, pred),
          "parsed": float(np.mean([p is not None for p in pred]))}


def run_seed(seed: int, args, root: Path) -> list[dict]:
  sft = CONFIG.get_config(f"sft,seed={seed}")
  sft.update(dict(steps=args.sft_steps, eval_every=10**6, checkpoint_every=args.sft_steps,
                  metric_writers="jsonl", batch_size=32, eval_at_start=False,
                  eval_examples=4))
  tic = time.perf_counter()
  sft_state = loop.train(sft, root / f"sft{seed}", SFT(sft))
  sft_s = time.perf_counter() - tic
  rows, sampler = [], None
  for arm in ARMS[1:]:
    config = CONFIG.get_config(f"reward={arm},seed={seed}")
    config.update(dict(steps=args.rl_steps, init_from=str(root / f"sft{seed}"),
                       eval_every=10**6, checkpoint_every=10**6, eval_at_start=False,
                       metric_writers="jsonl", prompts_per_step=args.prompts,
                       group_size=args.group, eval_examples=4))
    method = GRPO(config)
    tic = time.perf_counter()
    state = loop.train(config, root / f"{arm}{seed}", method)
    rl_s = time.perf_counter() - tic
    if sampler is None:  # the SFT policy, scored with the same constrained sampler
      sampler = method.sampler
      rows.append(dict(seed=seed, arm="sft", seconds=sft_s,
                       **evaluate(sampler, sft_state.params, method.task, args.eval_examples)))
      print(json.dumps(rows[-1]), flush=True)
    rows.append(dict(seed=seed, arm=arm, seconds=rl_s,
                     **evaluate(sampler, state.params, method.task, args.eval_examples)))
    print(json.dumps(rows[-1]), flush=True)
  return rows


def plot(rows, path: Path) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, 2, figsize=(8, 3.2))
  for ax, key in zip(axes, ("accuracy", "macro_f1")):
    values = [[r[key] for r in rows if r["arm"] == arm] for arm in ARMS]
    ax.bar(ARMS, [np.mean(v) for v in values], yerr=[np.std(v) for v in values], capsize=4,
           color=["grey", "tab:blue", "tab:green", "tab:red"])
    for i, v in enumerate(values):
      ax.scatter([i] * len(v), v, color="k", s=10, zorder=3)
    ax.axhline(1 / 3, ls=":", color="k", lw=0.8)
    ax.set_title(f"held-out cell lines: {key}")
  fig.tight_layout()
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(path, dpi=120)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seeds", default="0,1,2")
  parser.add_argument("--sft_steps", type=int, default=150)
  parser.add_argument("--rl_steps", type=int, default=25)
  parser.add_argument("--prompts", type=int, default=8)
  parser.add_argument("--group", type=int, default=8)
  parser.add_argument("--eval_examples", type=int, default=150)
  parser.add_argument("--plot", default=str(ROOT / "docs" / "pertmind_ablation.png"))
  args = parser.parse_args()
  jax.config.update("jax_platforms", "cpu")
  rows = []
  with tempfile.TemporaryDirectory() as tmp:
    for seed in map(int, args.seeds.split(",")):
      rows += run_seed(seed, args, Path(tmp))
  summary = {arm: {key: (float(np.mean([r[key] for r in rows if r["arm"] == arm])),
                         float(np.std([r[key] for r in rows if r["arm"] == arm])))
                   for key in ("accuracy", "macro_f1")} for arm in ARMS}
  print(json.dumps({"summary": summary, "args": vars(args)}), flush=True)
  plot(rows, Path(args.plot))


if __name__ == "__main__":
  main()
