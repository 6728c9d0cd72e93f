r"""MLREF reward evolution around PPO on gymnax, with its baselines.

See configs/mlref_gymnax.py for the commands. Writes to --workdir:

  fitness.jsonl     one line per (method, pipeline, iteration): round-best and best-so-far
                    fitness (true episodic return), variant scores, feedback kind
  candidates.jsonl  one line per inner PPO run: score, per-seed scores, fitness curve
  summary.json      per method and iteration: mean and std over pipelines of best-so-far
  <method>/p<k>/module_pool.json   the resumable MLREF state of each pipeline

The monolithic and no_pool baselines edit the best reward so far with the proposer's edit
operators (`config.baseline_memory`, see `rl_control.adapter`). The final step, each
pipeline's R* retrained with fresh seeds and tested against the env reward, is
scripts/mlref_retrain.py on the same workdir.
"""

import json
import os
import time

import numpy as np
from absl import app, flags, logging
from ml_collections import config_flags

from jaxrl_post.rewards import evolution
from jaxrl_post.rewards import module_pool as mp
from jaxrl_post.rewards import proposers as props
from jaxrl_post.rl_control import adapter, envs, ppo

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Where results go.")
flags.mark_flags_as_required(["config", "workdir"])

METHODS = ("mlref", "monolithic", "no_pool", "llm_weights_only", "env_reward")


def make_proposer(config, method: str, seed: int):
  if config.proposer == "llm":
    from jaxrl_post.rewards.llm_client import ChatClient, ChatConfig
    base = props.LLMProposer(ChatClient(ChatConfig.from_env()))
  elif config.proposer == "offline":
    base = props.OfflineProposer(props.OfflineProposerConfig(seed=seed))
  else:
    raise ValueError(f"unknown proposer {config.proposer!r}")
  # The baselines edit the best reward so far with the same operators (config.baseline_memory);
  # False gives the earlier random restarts (a fresh reward every iteration, no feedback).
  memory = bool(config.get("baseline_memory", True))
  cap = int(config.evolution.max_pool_size)
  if method == "monolithic":
    return adapter.MonolithicProposer(base, memory=memory, max_terms=cap)
  if method == "no_pool":
    return adapter.NoPoolProposer(base, memory=memory, max_modules=cap)
  return base


def history_records(method: str, pipeline: int, state: mp.PoolState) -> list[dict]:
  out, best = [], -np.inf
  for h in state.history:
    rb = h.get("round_best")
    if rb is not None and h["kind"] == "new_best":  # S_best as evolve keeps it (no rollbacks).
      best = max(best, rb)
    out.append({"method": method, "pipeline": pipeline, "iteration": h["iteration"],
                "round_best": rb, "best_so_far": None if best == -np.inf else float(best),
                "variant_scores": [v.get("score") for v in h["variants"]],
                "kind": h["kind"]})
  return out


def summarize(records: list[dict]) -> dict:
  """method → iteration → mean / std over pipelines of the best-so-far fitness."""
  out: dict = {}
  for r in records:
    if r["best_so_far"] is not None:
      out.setdefault(r["method"], {}).setdefault(r["iteration"], []).append(r["best_so_far"])
  return {m: {str(i): {"mean": float(np.mean(v)), "std": float(np.std(v)), "n": len(v)}
              for i, v in sorted(its.items())} for m, its in out.items()}


def _write_json(path, obj, lines=False):
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    if lines:
      f.writelines(json.dumps(r) + "\n" for r in obj)
    else:
      json.dump(obj, f, indent=1)
  os.replace(tmp, path)


def main(argv):
  del argv
  config, workdir = _CONFIG.value, _WORKDIR.value
  os.makedirs(workdir, exist_ok=True)
  task = envs.make_task(config.env)
  # The features' typical scales (random-action rollout), as the proposer's docs: the offline
  # proposer sizes its constants by them, the LLM prompts list them.
  info = adapter.loop_task_info(task, seed=config.feature_stats.seed,
                                num_envs=config.feature_stats.num_envs,
                                num_steps=config.feature_stats.num_steps)
  logging.info("feature stats (mean, std): %s", {k: tuple(round(x, 4) for x in v)
                                                 for k, v in info.feature_stats.items()})
  ppo_cfg = ppo.PPOConfig(**config.ppo.to_dict())
  credit = mp.CreditConfig(**config.credit.to_dict())
  methods = [m.strip() for m in config.methods.split(",") if m.strip()]
  unknown = set(methods) - set(METHODS)
  if unknown:
    raise ValueError(f"unknown methods {sorted(unknown)}; valid: {METHODS}")
  vet_cache: dict = {}
  records: list[dict] = []
  cand_path = os.path.join(workdir, "candidates.jsonl")
  for method in methods:
    for p in range(config.pipelines):
      t0 = time.time()
      seeds = [1000 * p + i for i in range(config.ppo_seeds)]
      if method == "env_reward":
        res = adapter.env_reward_baseline(task, ppo_cfg, seeds, score_window=config.score_window,
                                          fast_compile=config.fast_compile)
        # Constant across iterations: the same budget per iteration as one candidate run.
        records += [{"method": method, "pipeline": p, "iteration": i + 1,
                     "round_best": res["score"], "best_so_far": res["score"],
                     "variant_scores": [res["score"]], "kind": "reference"}
                    for i in range(config.evolution.iterations)]
      else:
        def log_result(cand, rec, method=method, p=p):
          line = {"method": method, "pipeline": p, "iteration": cand.iteration,
                  "variant": cand.variant, "selected": list(cand.selected),
                  "weights": [float(w) for w in cand.weights if w]}
          line.update(adapter.curves_to_json({k: rec[k] for k in
                                              ("score", "per_seed_score", "performance")}))
          line["dropped_modules"] = int(rec["dropped"].sum())  # failed or non-finite in PPO
          with open(cand_path, "a") as f:
            f.write(json.dumps(line) + "\n")

        evo_cfg = evolution.EvolutionConfig(
            credit=adapter.llm_weights_only(credit) if method == "llm_weights_only" else credit,
            **config.evolution.to_dict())
        train_fn = adapter.make_train_fn(task, ppo_cfg, seeds, score_window=config.score_window,
                                         clip=config.module_clip, on_result=log_result,
                                         fast_compile=config.fast_compile)
        state = evolution.evolve(info, make_proposer(config, method, p), train_fn,
                                 workdir=os.path.join(workdir, method, f"p{p}"), config=evo_cfg,
                                 vet_cache=vet_cache)
        records += history_records(method, p, state)
      logging.info("%s pipeline %d done in %.0f s: %s", method, p, time.time() - t0,
                   [r["best_so_far"] for r in records if r["method"] == method
                    and r["pipeline"] == p])
      _write_json(os.path.join(workdir, "fitness.jsonl"), records, lines=True)
  summary = summarize(records)
  _write_json(os.path.join(workdir, "summary.json"), summary)
  for m, its in summary.items():
    logging.info("%-17s %s", m, "  ".join(f"it{i}: {v['mean']:.1f}±{v['std']:.1f}"
                                          for i, v in its.items()))


if __name__ == "__main__":
  app.run(main)
