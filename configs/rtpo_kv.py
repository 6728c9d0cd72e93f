r"""RTPO vs turn-level and flattened GRPO on key-value lookup: success vs horizon K (2608.18682).

The kv_lookup env (jaxrl_post/envs/kv_lookup.py) hides a store behind a `get` tool; the answer
is the number at the end of a K-hop key chain: K + 1 turns, reward 1 for the exact number, a
stand-in for the paper's multi-hop search tasks. Rollouts see ψ = the prompt plus the newest
turns within 128 tokens (the paper's truncated context); flat GRPO trains on the whole history.

One (K, seed) cell, a cold start then the three methods from it at the same generated-token
budget (20k tokens per turn of an optimal episode, 100k for K = 4):

  python experiments/rtpo.py --config=configs/rtpo_kv.py:method=sft,horizon=4 \
      --workdir=/tmp/rtpo_kv/k4/s0/sft
  for m in flat_grpo turn_grpo rtpo; do
    python experiments/rtpo.py --config=configs/rtpo_kv.py:method=$m,horizon=4 \
        --workdir=/tmp/rtpo_kv/k4/s0/$m --config.init_from=/tmp/rtpo_kv/k4/s0/sft
  done

The whole grid (3 methods × K ∈ {2, 4, 6, 8} × seeds 0-2, SFT per (K, seed)), then its table
and plot (`/tmp/rtpo_kv/success_vs_horizon.png`):

  python scripts/rtpo_horizon.py --config=configs/rtpo_kv.py --root=/tmp/rtpo_kv
  python scripts/rtpo_horizon.py --root=/tmp/rtpo_kv --summarize

Expected cost on 2 CPU cores (measured pieces, not the whole grid): SFT of `tiny` ≈ 0.3-0.7 s
per step (800 steps ≈ 5-9 min; greedy success 0 → 1.0 at K = 4 by step 400); an RL run ≈ 5-10
min (RTPO at K = 8: ≈ 24k tokens and 30-50 s per step; GRPO: ≈ 8.5k tokens and 7-20 s per
step). Whole grid ≈ 4-6 hours of a quiet machine (≈ 2× that while other jobs share it).

Measured so far (one seed, K = 8, starting from an 800-step SFT at K = 4 — greedy success 1.0
at K = 2, 4 and 8, sampled success at T = 1 0.83 on 64 held-out episodes — ≈ 170k tokens each,
lr 1e-4): sampled success after RL flat GRPO 0.80, turn GRPO 0.81, RTPO 0.80, all within the
±0.05 noise of 64 episodes, so no method separated at this budget. The consistency ratio was
1.000 for turn GRPO and RTPO and 0.71-0.83 (mean 0.77) for flat GRPO, whose training re-reads
the history ψ cut from the rollout's contexts. With lr 1e-3 both RTPO and flat GRPO collapsed
to 0. The grid (shared cold start per seed, K = 2, 4, 6, 8, 3 seeds; `--init_from` of
scripts/rtpo_horizon.py) is in docs/results.md ("RTPO"): flat GRPO's consistency ratio falls
to 0.52 at K = 8 and its sampled success to half the cold start's; turn GRPO and RTPO stay at
ratio 1.000 and at the cold start's success.

Variants (after the colon): `method=sft|flat_grpo|turn_grpo|rtpo`, `horizon=K`, `seed=<n>`,
`paper=0` (β = 0, T = 1 and no log-ratio clamp instead of the paper's 0.02, 0.9
and ±10, as in the first grid), `model=<preset>` (default `tiny`), `steps=<n>`,
`budget=<tokens>` (−1: the per-K default, 0: none), `runlocal` (a few steps, for tests).
Any field: `--config.continuation=off_policy`.
"""

from pathlib import Path

from jaxrl_post.config_args import load_module, parse_arg

# configs/rtpo_common.py: the base config every rtpo_<env>.py adjusts.
rtpo_common = load_module(Path(__file__).resolve().with_name("rtpo_common.py"))
HORIZONS, SEEDS = rtpo_common.HORIZONS, rtpo_common.SEEDS


def get_config(arg=None):
  arg = parse_arg(arg, runlocal=False, method="rtpo", horizon=4, seed=0, model="tiny", steps=0,
                  budget=-1, paper=True)
  config = rtpo_common.base_config(arg)
  # The paper's β = 0.02, T = 0.9, ±10 log-ratio clamp (`paper=False`: β = 0, T = 1, none).
  rtpo_common.paper_settings(config, bool(arg.paper))
  config.env = "kv_lookup"
  # 16 keys (the chain and distractors that point to keys or numbers), 3-letter keys, 4-digit
  # values; the store is drawn from the env's own seed, the same for every run.
  config.env_knobs.update(dict(num_keys=16, key_length=3, value_digits=4, seed=0))
  return config


sweep = rtpo_common.horizon_sweep
metrics = rtpo_common.grid_metrics
