r"""MLREF (arXiv 2608.18827) reward evolution with PPO on a gymnax classic-control task.

Commands (2 CPU cores):

  # Offline proposer (no network), MLREF and the baselines, 3 independent pipelines:
  python experiments/mlref.py --config=configs/mlref_gymnax.py --workdir=/tmp/mlref_cartpole

  # Smoke test (MLREF only, 2 iterations, ~1 minute):
  python experiments/mlref.py --config=configs/mlref_gymnax.py:runlocal --workdir=/tmp/mlref_rl

  # A real LLM behind an OpenAI-compatible endpoint (key never logged):
  JAXRL_POST_LLM_BASE_URL=https://api.deepseek.com/v1 JAXRL_POST_LLM_MODEL=deepseek-chat \
  JAXRL_POST_LLM_API_KEY=... JAXRL_POST_LLM_TOKEN_BUDGET=2000000 \
  python experiments/mlref.py --config=configs/mlref_gymnax.py:proposer=llm \
      --workdir=/tmp/mlref_cartpole_llm

Methods (`methods=` comma list): mlref (full method), monolithic (one whole reward function,
each iteration an edit of the best one so far), no_pool (no persistent pool: each iteration an
edit of the best reward's modules, credit reset), llm_weights_only (hybrid credit off:
w_LLM = 1, γ = 0), env_reward (PPO on the environment's own reward, reference).
`--config.baseline_memory=False`: the baselines draw a fresh reward every iteration instead
(random restarts, the results before 2026-12-06).

Final step (the paper's retrain of R* with 5 fresh seeds, Welch's t / Mann–Whitney U tests):

  python scripts/mlref_retrain.py --config=configs/mlref_gymnax.py --workdir=/tmp/mlref_cartpole

Variants: `runlocal`, `env=CartPole-v1|Pendulum-v1`, `proposer=offline|llm`, `iterations=<n>`,
`pipelines=<n>`, `methods=<a;b>` (';'-separated here, since ',' separates variant args).
"""

import ml_collections

from jaxrl_post.config_args import parse_arg

# Not an LLM-training config (no task / tokenizer / model): tests that check those should skip it.
CONFIG_KIND = "rl_control"
ALL_METHODS = "mlref,monolithic,no_pool,llm_weights_only,env_reward"


def get_config(arg=None):
  arg = parse_arg(arg, runlocal=False, env="CartPole-v1", proposer="offline", iterations=4,
                  pipelines=3, methods=ALL_METHODS.replace(",", ";"))
  c = ml_collections.ConfigDict()
  c.env = arg.env
  c.proposer = arg.proposer
  c.methods = arg.methods.replace(";", ",")
  c.pipelines = arg.pipelines     # Independent MLREF runs (proposer seed p, PPO seeds 1000 p + i).
  c.ppo_seeds = 2                 # PPO seeds averaged per candidate reward.
  c.score_window = 5              # S_v = mean fitness over the last updates.
  c.module_clip = 10.0            # |m_k| bound inside R.
  # monolithic / no_pool edit the best reward so far with the proposer's edit operators (the
  # same memory and feedback as MLREF); False: a fresh random reward every iteration (the
  # results before 2026-12-06).
  c.baseline_memory = True
  # Final step (scripts/mlref_retrain.py): each pipeline's R* retrained with these PPO seeds,
  # disjoint from the evolution's (1000 p + i), and the env reward with the same seeds.
  c.retrain_seeds = 5
  c.retrain_seed_base = 900_000
  c.fast_compile = False          # XLA -O0: half the compile time, slower runs (runlocal).
  # Typical (mean, std) of each feature from a random-action rollout, given to the proposer
  # (TaskInfo.feature_stats: scale-aware offline templates, listed in the LLM prompts).
  # num_steps=0 turns it off (the scale-blind offline draws of earlier results).
  c.feature_stats = ml_collections.ConfigDict(dict(num_envs=16, num_steps=128, seed=0))
  c.ppo = ml_collections.ConfigDict(dict(
      num_envs=8, num_steps=128, total_timesteps=40_960, update_epochs=4, num_minibatches=4,
      lr=2.5e-4, gamma=0.99, gae_lambda=0.95, clip_eps=0.2, ent_coef=0.01, vf_coef=0.5,
      max_grad_norm=0.5, hidden=64))
  c.evolution = ml_collections.ConfigDict(dict(
      iterations=arg.iterations, num_variants=3, merge_threshold=0.1, merge_relative=True,
      max_pool_size=12))
  # Table 4 values except the windows: an inner run logs U = 40 updates, not 3000 epochs, so
  # w_s, w_d, L are scaled down (PROPOSAL).
  c.credit = ml_collections.ConfigDict(dict(
      smooth_window=5, diff_window=5, max_lag=3, w_raw=0.5, alpha=0.7, tau=0.25, w_llm=0.5,
      gamma=0.2, k=5))
  if arg.runlocal:
    c.methods = "mlref"
    c.fast_compile = True
    c.pipelines, c.ppo_seeds = 1, 1
    c.ppo.update(num_envs=4, num_steps=32, total_timesteps=512, update_epochs=1,
                 num_minibatches=1)
    c.evolution.update(iterations=2, num_variants=1)
    c.credit.update(smooth_window=1, diff_window=1, max_lag=1)
    c.score_window = 2
  return c


def sweep(add, arg=None):
  del arg
  for w_llm in (0.0, 0.5, 1.0):
    add(**{"credit.w_llm": w_llm})


def metrics():
  return ["fitness/best_so_far", "fitness/round_best"]
