r"""RecoverFly's component ablation on synthetic aerial navigation (arXiv 2608.09467;
PROPOSAL analogue): GRPO vs +failure replay vs +curriculum vs +window KL vs all, from one
behaviour-cloned policy, with a matched rollout budget.

Per seed: BC (SFT) on expert programs of the HEAD scenes only (configs/recoverfly.py:sft),
then grammar-constrained token-level GRPO (configs/recoverfly.py) in each arm on the full
long-tailed train pool, every arm with the same number of rollouts, capped at
`budget_frac` (0.3, the paper's "≈ 30% of the training-set size") × the pool size. Every policy
is scored by greedy constrained decoding:

  seen / unseen_map / unseen_object   success rate (SR) on the three splits
  head / tail                         SR on the seen split's head / tail scenes
  prev_failed                         SR on the pool tasks the BC policy failed (greedy)
  head_regression                     head SR − the BC policy's head SR

Prints one JSON line per (seed, arm), a summary line per arm (mean ± std over seeds), and plots
docs/recoverfly_ablation.png.

  python scripts/recoverfly_ablation.py --eval_examples=128   # 3 seeds (≈ 2 CPU-min, 2 cores)
  python scripts/recoverfly_ablation.py --eval_examples=128 --pool=8192 \
      --plot=docs/recoverfly_ablation_pool8192.png   # twice the budget (≈ 3 CPU-min)
  python scripts/recoverfly_ablation.py --seeds=0 --sft_steps=20 --eval_examples=16 \
      --pool=512 --plot=/tmp/rf.png   # a smoke run

Settings that are ours, not the paper's: the RL learning rate (`--rl_lr`, 5e-4 with the
config's cosine decay; at the config's 1e-4 the head scenes stay saturated and the KL arm has
nothing to protect), 8 prompts × 8 rollouts per step, the BC stage (`--sft_steps` of SFT at
batch 32), the `tiny` model.
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
from jaxrl_post.methods.recoverfly import RecoverFly
from jaxrl_post.methods.sft import SFT
from jaxrl_post.tasks.aerial_nav import AerialNavTask
from jaxrl_post.training import loop

ROOT = Path(__file__).resolve().parents[1]
CONFIG = load_module(ROOT / "configs" / "recoverfly.py")
ARMS = ("grpo", "replay", "curriculum", "kl", "all")
METRICS = ("seen", "unseen_map", "unseen_object", "head", "tail", "prev_failed",
           "head_regression")


def success(sampler, params, task, records) -> np.ndarray:
  """Greedy constrained decoding: `[records]` 0/1 successes."""
  out = sampler.generate(params, [r["prompt"] for r in records], greedy=True,
                         max_new_tokens=CONFIG.COMPLETION_LEN)
  return np.asarray([task.reward(r, t).correct >= 1.0
                     for r, t in zip(records, sampler.decode_text(out))], np.float64)


def evaluate(sampler, params, task, sets) -> dict:
  seen = success(sampler, params, task, sets["seen"])
  head = np.asarray([json.loads(r["meta"])["head"] for r in sets["seen"]])
  out = {"seen": seen.mean(), "head": seen[head].mean(), "tail": seen[~head].mean(),
         "unseen_map": success(sampler, params, task, sets["unseen_map"]).mean(),
         "unseen_object": success(sampler, params, task, sets["unseen_object"]).mean()}
  if sets.get("prev_failed"):
    out["prev_failed"] = success(sampler, params, task, sets["prev_failed"]).mean()
  return {k: float(v) for k, v in out.items()}


def run_seed(seed: int, args, root: Path) -> list[dict]:
  sft = CONFIG.get_config(f"sft,seed={seed}")
  sft.update(dict(steps=args.sft_steps, eval_every=10**6, checkpoint_every=args.sft_steps,
                  metric_writers="jsonl", batch_size=32, eval_at_start=False, eval_examples=4,
                  num_train_examples=args.pool))
  tic = time.perf_counter()
  sft_state = loop.train(sft, root / f"sft{seed}", SFT(sft))
  sft_s = time.perf_counter() - tic
  task = AerialNavTask(**CONFIG.get_config("").task_knobs)
  n = args.eval_examples
  sets = {"seen": [task.make_example("test", i) for i in range(n)],
          "unseen_map": [task.make_example("unseen_map", i) for i in range(n)],
          "unseen_object": [task.make_example("unseen_object", i) for i in range(n)]}
  pool_probe = [task.make_example("train", i) for i in range(n)]
  rollouts = args.prompts * args.group
  steps = max(int(args.budget_frac * args.pool) // rollouts, 1)
  rows, sampler, base = [], None, None
  for arm in args.arms.split(","):
    config = CONFIG.get_config(f"variant={arm},seed={seed}")
    config.update(dict(steps=steps, init_from=str(root / f"sft{seed}"), eval_every=10**6,
                       checkpoint_every=10**6, eval_at_start=False, metric_writers="jsonl",
                       prompts_per_step=args.prompts, group_size=args.group, eval_examples=4,
                       num_train_examples=args.pool))
    config.recoverfly.update(CONFIG.recoverfly_section(arm, steps))
    config.optimizer.lr = args.rl_lr
    method = RecoverFly(config)
    tic = time.perf_counter()
    state = loop.train(config, root / f"{arm}{seed}", method)
    rl_s = time.perf_counter() - tic
    if sampler is None:  # the BC policy, scored with the same constrained sampler
      sampler = method.sampler
      failed = success(sampler, sft_state.params, task, pool_probe) < 1
      sets["prev_failed"] = [r for r, f in zip(pool_probe, failed) if f]
      base = evaluate(sampler, sft_state.params, task, sets)
      rows.append(dict(seed=seed, arm="bc", seconds=sft_s, rollouts=0, **base,
                       head_regression=0.0))
      print(json.dumps(rows[-1]), flush=True)
    part = method.parts["recoverfly"]
    result = evaluate(sampler, state.params, task, sets)
    rows.append(dict(seed=seed, arm=arm, seconds=rl_s, rollouts=steps * rollouts, **result,
                     head_regression=result["head"] - base["head"],
                     recovered=part.recovered,
                     buffer=int(np.asarray(part.buffer.valid).sum())))
    print(json.dumps(rows[-1]), flush=True)
  return rows


def summarise(rows) -> dict:
  out = {}
  for arm in ("bc",) + ARMS:
    sel = [r for r in rows if r["arm"] == arm]
    if not sel:
      continue
    out[arm] = {k: (float(np.mean([r[k] for r in sel])), float(np.std([r[k] for r in sel])))
                for k in METRICS if all(k in r for r in sel)}
  return out


def plot(summary, path: Path) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  keys = ("seen", "unseen_map", "unseen_object", "tail", "prev_failed")
  arms = list(summary)
  fig, ax = plt.subplots(figsize=(9, 3.6))
  width = 0.8 / len(arms)
  for i, arm in enumerate(arms):
    means = [summary[arm].get(k, (np.nan, 0))[0] for k in keys]
    stds = [summary[arm].get(k, (np.nan, 0))[1] for k in keys]
    ax.bar(np.arange(len(keys)) + i * width, means, width, yerr=stds, label=arm, capsize=2)
  ax.set_xticks(np.arange(len(keys)) + 0.4 - width / 2, keys)
  ax.set_ylabel("greedy success rate")
  ax.set_title("RecoverFly ablation (synthetic aerial nav, mean ± std over seeds)")
  ax.legend(ncol=len(arms), fontsize=7)
  fig.tight_layout()
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(path, dpi=110)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--seeds", default="0,1,2")
  parser.add_argument("--arms", default=",".join(ARMS))
  parser.add_argument("--sft_steps", type=int, default=600)
  parser.add_argument("--pool", type=int, default=4096, help="train pool (num_train_examples)")
  parser.add_argument("--budget_frac", type=float, default=0.3)
  parser.add_argument("--rl_lr", type=float, default=5e-4)
  parser.add_argument("--prompts", type=int, default=8)
  parser.add_argument("--group", type=int, default=8)
  parser.add_argument("--eval_examples", type=int, default=128)
  parser.add_argument("--plot", default=str(ROOT / "docs" / "recoverfly_ablation.png"))
  parser.add_argument("--compile_cache", default="/tmp/recoverfly_jax_cache")
  args = parser.parse_args()
  if args.compile_cache:  # later runs of the same shapes skip XLA compilation
    jax.config.update("jax_compilation_cache_dir", args.compile_cache)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  tic = time.perf_counter()
  rows = []
  with tempfile.TemporaryDirectory() as tmp:
    for seed in (int(s) for s in args.seeds.split(",")):
      rows += run_seed(seed, args, Path(tmp))
  summary = summarise(rows)
  for arm, stats in summary.items():
    print(json.dumps({"arm": arm, **{k: f"{m:.3f} ± {s:.3f}" for k, (m, s) in stats.items()}}))
  print(json.dumps({"total_seconds": time.perf_counter() - tic, "args": vars(args)}))
  if args.plot:
    plot(summary, Path(args.plot))


if __name__ == "__main__":
  main()
