r"""OCSD vs its host, turn-level GRPO, on the multi-turn envs (arXiv 2608.04788).

OCSD is turn GRPO plus one dual-view re-scoring pass: each action is re-scored by the rollout
policy after a hindsight line with the real next observation (Full) and with a placeholder
(Ablated); q = tanh((lp_F − lp_A)/2) scales the episode's advantage by 1 + β sgn(Â) q on the
top-ρ most uncertain steps of each episode (jaxrl_post/methods/ocsd.py). Everything else —
episodes, G = 8, token-mean PPO-clip, lr 1e-4, the generated-token budget, evaluation — is
configs/rtpo_<env>.py's turn_grpo, so the two arms differ only in `config.method`.

One seed, by hand (kv_lookup at K = 4; a cold start first, as for RTPO):

  python experiments/ocsd.py --config=configs/ocsd.py:method=sft --workdir=/tmp/ocsd_kv/sft
  for m in turn_grpo ocsd; do
    python experiments/ocsd.py --config=configs/ocsd.py:method=$m \
        --workdir=/tmp/ocsd_kv/s0/$m --config.init_from=/tmp/ocsd_kv/sft
  done

The sweep, GRPO vs OCSD × seeds 0 1 2 from that cold start (6 runs):

  python scripts/sweep.py --config=configs/ocsd.py --workdir=/tmp/ocsd_kv \
      -- --config.init_from=/tmp/ocsd_kv/sft

Measured on 2 shared CPU cores (load average 5-8; `tiny`, kv_lookup K = 4, 2026-12-05): the
cold start above with `--config.steps=400` took 145 s (greedy success 1.0, sampled 0.23 on
128 held-out episodes); each RL run stops at the 100k-token budget after 17-20 steps, ≈ 2 min:
turn GRPO ≈ 3.3 s per step, OCSD ≈ 4.1-4.7 s of which `time/ocsd_score` ≈ 1.0-1.1 s (the two
replay passes; the paper reports 1.4 % with a real LLM, whose sampling dominates). The sweep
(6 runs) ≈ 12 min. Held-out sampled success after RL, seeds 0 / 1 / 2 (from 0.23 / 0.15 / 0.21
at step 0, the same cold start): turn GRPO 0.27 / 0.18 / 0.25 (mean 0.23), OCSD 0.23 / 0.17 /
0.23 (mean 0.21): within the ±0.04 noise of 128 episodes, no separation at this budget. OCSD's
diagnostics over those runs: `ocsd/q_abs_mean` ≈ 0.41-0.43 (the hindsight line moves the
actions' scores a lot), `ocsd/q_mean` between −0.06 and +0.02, `ocsd/selected_frac` ≈ 0.18
(ρ = 0.2 of 5-6 turns, rounded), `ocsd/adv_factor_mean` ≈ 0.98-0.99.

Variants (after the colon): `env=kv|calculator`, `method=ocsd|turn_grpo|sft|flat_grpo|rtpo`,
`horizon=K` (default 4), `seed=<n>`, `model=<preset>` (default: the env config's), `steps=<n>`,
`budget=<tokens>` (−1: the per-K default, 0: none), `runlocal` (a few steps, for tests). OCSD's
knobs: `--config.ocsd.rho=0.2`, `--config.ocsd.beta=0.5`, `--config.ocsd.template='...'`
(with `{observation}` once), `--config.ocsd.placeholder='not provided'`,
`--config.ocsd.terminal='reward {reward:g}'` (the observation after a final answer).
"""

from pathlib import Path

from jaxrl_post.config_args import load_module, parse_arg

_HERE = Path(__file__).resolve().parent
# The env configs this one reuses (their env knobs, model and lengths).
ENV_CONFIGS = {"kv": "rtpo_kv.py", "calculator": "rtpo_calculator.py"}
ARMS = ("turn_grpo", "ocsd")  # GRPO (OCSD's host) vs OCSD
SEEDS = (0, 1, 2)


def get_config(arg=None):
  arg = parse_arg(arg, runlocal=False, env="kv", method="ocsd", horizon=4, seed=0, model="",
                  steps=0, budget=-1)
  if arg.env not in ENV_CONFIGS:
    raise ValueError(f"unknown env {arg.env!r}; valid: {', '.join(ENV_CONFIGS)}")
  words = [f"method={arg.method}", f"horizon={arg.horizon}", f"seed={arg.seed}",
           f"steps={arg.steps}", f"budget={arg.budget}"]
  words += [f"model={arg.model}"] if arg.model else []
  words += ["runlocal"] if arg.runlocal else []
  return load_module(_HERE / ENV_CONFIGS[arg.env]).get_config(",".join(words))


def sweep(add, arg=None):
  """GRPO vs OCSD × seeds 0 1 2; the two arms' configs differ only in `method`."""
  del arg
  for seed in SEEDS:
    for method in ARMS:
      add(method=method, seed=seed)


def metrics():
  return ["eval/success", "eval/sampled_success", "rollout/success", "budget/generated_tokens",
          "time/wall", "ocsd/q_mean", "ocsd/q_abs_mean", "ocsd/selected_frac",
          "ocsd/adv_factor_mean", "time/ocsd_score"]
