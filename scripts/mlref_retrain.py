r"""MLREF's final step (arXiv 2608.18827): retrain each pipeline's R* with fresh seeds, and test.

"Best so far" in an experiments/mlref.py workdir is a maximum over many single-seed PPO runs,
so it is biased upwards against a single run of the environment reward. The paper's final
evaluation retrains the final reward with 5 new seeds; this script does that:

  python scripts/mlref_retrain.py --config=configs/mlref_gymnax.py:<same args as the run> \
      [--config.<same overrides>] --workdir=<the experiments/mlref.py workdir>

For every method and pipeline with a best reward R* (`<workdir>/<method>/p<k>/module_pool.json`)
PPO is trained from scratch on R* = Σ_k w_k m_k with `config.retrain_seeds` seeds
`config.retrain_seed_base + i` (disjoint from the evolution's seeds 1000 p + i), and once on the
environment's own reward with the same seeds (same PPO config and budget as one evolution
candidate). The score of one seed is its true episodic return averaged over the last
`config.score_window` updates, as in the evolution. Results go to `<workdir>/retrain.jsonl`
(one line per method and pipeline; rerunning skips what is there), and a markdown table with

* per method: mean ± std over all retrained runs (pipelines × seeds) and over pipeline means;
* Welch's t-test (unequal variances) and the Mann–Whitney U test, both two-sided, of the
  per-run scores of each method against the env reward and against MLREF
  (`scipy.stats.ttest_ind(equal_var=False)`, `scipy.stats.mannwhitneyu`).

The per-run test treats the pipelines × seeds runs of a method as independent draws of "PPO on
a reward this method evolved"; with few pipelines the pipeline-mean column shows how much of
the spread is between evolved rewards.
"""

from __future__ import annotations

import json
import os
import time

import jax
import numpy as np
from absl import app, flags, logging
from ml_collections import config_flags
from scipy import stats

from jaxrl_post.rewards import module_pool as mp
from jaxrl_post.rl_control import adapter, envs, ppo

# The flags are defined only when this file is the program (see the end): config_flags adds the
# `--config.<key>` override flags to the registry its flag is defined in, so they must live in
# absl's global one, which tests that import this module must not touch.
_CONFIG = _WORKDIR = _PLOT = None

ORDER = ("mlref", "monolithic", "no_pool", "llm_weights_only")
LABELS = {"mlref": "MLREF (pool + hybrid credit)", "monolithic": "monolithic",
          "no_pool": "no pool", "llm_weights_only": "LLM weights only",
          "env_reward": "PPO on the env reward"}


def retrain_seeds(config) -> list[int]:
  """The fresh PPO seeds: `retrain_seed_base + i`, i < `retrain_seeds`.

  Raises:
    ValueError: a seed collides with an evolution seed 1000 p + i (p < pipelines,
      i < ppo_seeds), so the retrain would not be fresh.
  """
  n, base = int(config.retrain_seeds), int(config.retrain_seed_base)
  if n < 2:
    raise ValueError(f"config.retrain_seeds must be ≥ 2 for a test, got {n}")
  seeds = [base + i for i in range(n)]
  used = {1000 * p + i for p in range(int(config.pipelines)) for i in range(int(config.ppo_seeds))}
  clash = sorted(used & set(seeds))
  if clash:
    raise ValueError(f"config.retrain_seed_base={base} reuses evolution seeds {clash}")
  return seeds


def compare(a, b) -> dict[str, float]:
  """Two-sided Welch's t-test and Mann–Whitney U test of samples `a` vs `b`.

  Welch: t = (ā − b̄) / sqrt(s_a²/n_a + s_b²/n_b) with sample variances s² (ddof 1), and
  Welch–Satterthwaite degrees of freedom.

  Returns:
    mean_a, mean_b, t, p_welch, u (U statistic of `a`), p_mwu.
  """
  a, b = np.asarray(a, float), np.asarray(b, float)
  if len(a) < 2 or len(b) < 2:
    raise ValueError(f"need ≥ 2 samples per side, got {len(a)} and {len(b)}")
  t = stats.ttest_ind(a, b, equal_var=False)
  u = stats.mannwhitneyu(a, b, alternative="two-sided")
  return {"mean_a": float(a.mean()), "mean_b": float(b.mean()), "t": float(t.statistic),
          "p_welch": float(t.pvalue), "u": float(u.statistic), "p_mwu": float(u.pvalue)}


def retrain(config, workdir: str, *, methods=None) -> list[dict]:
  """Retrains every R* of `workdir` and the env reward; returns (and appends) the records.

  Each record: method, pipeline, seeds, per_seed_score `[S]`, score (their mean), plus for
  evolved rewards the evolution's best-so-far score and R*'s iteration / modules / weights.
  """
  task = envs.make_task(config.env)
  ppo_cfg = ppo.PPOConfig(**config.ppo.to_dict())
  seeds = retrain_seeds(config)
  path = os.path.join(workdir, "retrain.jsonl")
  done = {}
  if os.path.exists(path):
    for line in open(path):
      if line.strip():
        r = json.loads(line)
        if r.get("seeds") == seeds:
          done[(r["method"], r["pipeline"])] = r
  methods = methods or [m.strip() for m in config.methods.split(",")
                        if m.strip() and m.strip() != "env_reward"]
  jobs = [("env_reward", -1, None)]
  for m in methods:
    for p in range(int(config.pipelines)):
      state = mp.load_state(os.path.join(workdir, m, f"p{p}"))
      if state is not None and state.best_reward:
        jobs.append((m, p, state))
  out = []
  for method, p, state in jobs:
    if (method, p) in done:
      out.append(done[(method, p)])
      continue
    t0 = time.time()
    if state is None:
      res = adapter.env_reward_baseline(task, ppo_cfg, seeds, score_window=config.score_window,
                                        fast_compile=config.fast_compile)
      rec = {"method": method, "pipeline": p, "seeds": seeds,
             "per_seed_score": [float(x) for x in res["per_seed_score"]]}
    else:
      best = state.best_reward
      modules = [mp.ModuleSpec.from_json(m) for m in best["modules"]]
      reward_fn = mp.build_reward_fn(modules, task.feature_spec, clip=config.module_clip)
      m = ppo.train_seeds(ppo_cfg, task, seeds, reward_fn=reward_fn,
                          weights=np.asarray(best["weights"], np.float32),
                          fast_compile=config.fast_compile)
      rec = {"method": method, "pipeline": p, "seeds": seeds,
             "per_seed_score": [float(x) for x in
                                adapter.per_seed_score(m["fitness"], config.score_window)],
             "evolution_best": float(best["score"]), "iteration": best["iteration"],
             "modules": [mm.uid for mm in modules],
             "weights": [float(w) for w in best["weights"]]}
    rec["score"] = float(np.mean(rec["per_seed_score"]))
    rec["seconds"] = round(time.time() - t0, 1)
    logging.info("retrain %s p%d: %.1f (%s) in %.0f s", method, p, rec["score"],
                 [round(x, 1) for x in rec["per_seed_score"]], rec["seconds"])
    with open(path, "a") as f:
      f.write(json.dumps(rec) + "\n")
    out.append(rec)
  return out


def table(records: list[dict]) -> str:
  """Markdown: retrained score per method, and the tests against env reward and MLREF."""
  runs, pipe, evo = {}, {}, {}
  for r in records:
    runs.setdefault(r["method"], []).extend(r["per_seed_score"])
    pipe.setdefault(r["method"], []).append(r["score"])
    if "evolution_best" in r:
      evo.setdefault(r["method"], []).append(r["evolution_best"])
  methods = [m for m in ORDER if m in runs] + sorted(set(runs) - set(ORDER) - {"env_reward"})
  if "env_reward" in runs:
    methods.append("env_reward")
  n_seeds = max(len(r["per_seed_score"]) for r in records)
  lines = [f"Retrained with {n_seeds} fresh seeds (mean ± std; runs = pipelines × seeds):", "",
           "| method | runs | retrained score (runs) | retrained, pipeline means "
           "| evolution best-so-far (same R*) |", "|---|---:|---:|---|---:|"]
  for m in methods:
    r, pm = np.asarray(runs[m]), np.asarray(pipe[m])
    e = (f"{np.mean(evo[m]):.1f} ± {np.std(evo[m]):.1f}" if m in evo else "–")
    lines.append(f"| {LABELS.get(m, m)} | {len(r)} | {r.mean():.1f} ± {r.std(ddof=1):.1f} | "
                 f"{', '.join(f'{x:.1f}' for x in pm)} | {e} |")
  lines += ["", "Two-sided tests on the per-run scores (Welch's t-test; Mann–Whitney U), and "
            "Welch's t-test on the pipeline means (one sample per evolved R*; method pairs "
            "only, the env reward is one reward):", "",
            "| comparison | mean A | mean B | Welch t | p (Welch) | U | p (MWU) "
            "| p (Welch, pipeline means) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|"]
  pairs = [(m, "env_reward") for m in methods if m != "env_reward" and "env_reward" in runs]
  pairs += [("mlref", m) for m in methods if m not in ("mlref", "env_reward") and "mlref" in runs]
  for a, b in pairs:
    c = compare(runs[a], runs[b])
    pp = ("–" if b == "env_reward" or min(len(pipe[a]), len(pipe[b])) < 2
          else f"{compare(pipe[a], pipe[b])['p_welch']:.3f}")
    lines.append(f"| {LABELS.get(a, a)} vs {LABELS.get(b, b)} | {c['mean_a']:.1f} | "
                 f"{c['mean_b']:.1f} | {c['t']:.2f} | {c['p_welch']:.3f} | {c['u']:.0f} | "
                 f"{c['p_mwu']:.3f} | {pp} |")
  return "\n".join(lines)


def plot(records: list[dict], path: str) -> None:
  """Strip plot of the retrained per-run scores per method (pipelines in colours), with the
  evolution's best-so-far of the same R* as crosses."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  methods = [m for m in ORDER if any(r["method"] == m for r in records)]
  methods += ["env_reward"] if any(r["method"] == "env_reward" for r in records) else []
  fig, ax = plt.subplots(figsize=(6.5, 3.6))
  for i, m in enumerate(methods):
    rs = [r for r in records if r["method"] == m]
    for j, r in enumerate(rs):
      x = i + (j - (len(rs) - 1) / 2) * 0.08
      ax.scatter([x] * len(r["per_seed_score"]), r["per_seed_score"], s=12, color=f"C{j}")
      if "evolution_best" in r:
        ax.scatter([x], [r["evolution_best"]], marker="x", s=30, color=f"C{j}")
    allr = [x for r in rs for x in r["per_seed_score"]]
    ax.hlines(np.mean(allr), i - 0.3, i + 0.3, color="k")
  ax.set_xticks(range(len(methods)), [LABELS.get(m, m).replace(" (", "\n(") for m in methods],
                fontsize=7)
  ax.set_ylabel("true episodic return")
  ax.set_title("R* retrained with fresh seeds (dots; bar: mean); x: evolution best-so-far",
               fontsize=8)
  ax.grid(alpha=0.3, axis="y")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def clip_shares(config, workdir: str, *, num_envs: int = 16, num_steps: int = 128,
                seed: int = 1) -> dict[str, list[list[float]]]:
  """How often `config.module_clip` binds on each R*: method → per pipeline, per module of R*,
  the share of transitions of a random-action rollout (`adapter.random_features`,
  num_envs × num_steps) with |m_k| > module_clip (m_k unclipped). Random actions drive the
  cart and pole further out than a trained policy does, so this is an upper-side estimate.
  """
  task = envs.make_task(config.env)
  feats = adapter.random_features(task, jax.random.PRNGKey(seed), num_envs=num_envs,
                                  num_steps=num_steps)
  flat = {k: v.reshape((num_envs * num_steps,) + v.shape[2:]) for k, v in feats.items()}
  out: dict[str, list[list[float]]] = {}
  for m in [m.strip() for m in config.methods.split(",") if m.strip() != "env_reward"]:
    for p in range(int(config.pipelines)):
      state = mp.load_state(os.path.join(workdir, m, f"p{p}"))
      if state is None or not state.best_reward:
        continue
      modules = [mp.ModuleSpec.from_json(x) for x in state.best_reward["modules"]]
      fn = mp.build_reward_fn(modules, task.feature_spec, clip=None)
      terms = np.asarray(fn(flat, np.ones(len(modules), np.float32)).terms)  # [K, N]
      out.setdefault(m, []).append(
          [float(x) for x in (np.abs(terms) > float(config.module_clip)).mean(1)])
  return out


def main(argv: list[str]) -> None:
  del argv
  if _CONFIG.value is None or _WORKDIR.value is None:
    raise flags.IllegalFlagValueError("--config and --workdir are required")
  records = retrain(_CONFIG.value, _WORKDIR.value)
  print(table(records))
  if _PLOT.value:
    plot(records, _PLOT.value)
    print(f"plot: {_PLOT.value}")
  print(f"\nShare of random-action transitions with |m_k| > module_clip="
        f"{_CONFIG.value.module_clip} (per R*: the largest over its modules; modules clipped on"
        " > 1% of transitions / all modules):")
  for m, shares in clip_shares(_CONFIG.value, _WORKDIR.value).items():
    top = [max(s) for s in shares]
    n_over = sum(x > 0.01 for s in shares for x in s)
    print(f"  {m}: {', '.join(f'{x:.3f}' for x in top)}; {n_over}/{sum(map(len, shares))}")


if __name__ == "__main__":
  _CONFIG = config_flags.DEFINE_config_file("config", None, "The run's config file.",
                                            lock_config=False)
  _WORKDIR = flags.DEFINE_string("workdir", None, "The experiments/mlref.py workdir.")
  _PLOT = flags.DEFINE_string("plot", None, "Optional PNG of the retrained scores.")
  app.run(main)
