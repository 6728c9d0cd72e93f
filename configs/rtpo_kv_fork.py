r"""RTPO vs turn-level and flattened GRPO where the first call decides the episode (2608.18682).

The kv_fork env (`jaxrl_post.envs.kv_lookup.KVForkEnv`) is kv_lookup with two start keys in the
prompt: each heads a K-hop chain to a number, and only the first-named key's chain ends in the
answer. Nothing between the first call and the answer tells a wrong branch from the right one,
so turn 0's decision alone sets whether the episode can succeed and its consequence shows only
in the terminal reward K turns later: a test of credit assignment (the paper's issue (B)),
where kv_lookup's failures were copying slips. The cold start clones demonstrations of a teacher
that picks a start at random (`demo_branch="uniform"`), so it fails about half of its episodes
at every horizon however well it copies keys, and RL has to find the rule from rewards.

Training uses the paper's β = 0.02 (k3 KL to the cold start), T = 0.9 and ±10 log-ratio clamp
for all three methods (`paper=0` for β = 0, T = 1, no clamp); the rest is configs/rtpo_kv.py's.

One (K, seed) cell, a cold start (1600 SFT steps by default: 800 leave the student on the
copying plateau) then the three methods from it:

  python experiments/rtpo.py --config=configs/rtpo_kv_fork.py:method=sft,horizon=4 \
      --workdir=/tmp/rtpo_fork/sft
  for m in flat_grpo turn_grpo rtpo; do
    python experiments/rtpo.py --config=configs/rtpo_kv_fork.py:method=$m,horizon=4 \
        --workdir=/tmp/rtpo_fork/k4/s0/$m --config.init_from=/tmp/rtpo_fork/sft
  done

The grid from one shared cold start (see docs/results.md, "RTPO"), and the off-policy-
continuation ablation (`--config.continuation=off_policy`):

  python scripts/rtpo_horizon.py --config=configs/rtpo_kv_fork.py --root=/tmp/rtpo_fork/grid \
      --horizons=2,6 --init_from=/tmp/rtpo_fork/sft --jobs=2
  python scripts/rtpo_horizon.py --config=configs/rtpo_kv_fork.py --root=/tmp/rtpo_fork/offp \
      --horizons=6 --methods=rtpo --init_from=/tmp/rtpo_fork/sft \
      --extra='--config.continuation=off_policy'
  python scripts/rtpo_horizon.py --root=/tmp/rtpo_fork/grid --summarize

Variants (after the colon): `method=sft|flat_grpo|turn_grpo|rtpo`, `horizon=K`, `seed=<n>`,
`branches=<n>` (start keys, default 2), `paper=0`, `model=<preset>` (default `tiny`),
`steps=<n>`, `budget=<tokens>` (−1: the per-K default, 0: none), `runlocal` (a few steps, for
tests).
"""

from pathlib import Path

from jaxrl_post.config_args import load_module, parse_arg
from jaxrl_post.methods.rtpo import SFT

# configs/rtpo_common.py: the base config every rtpo_<env>.py adjusts.
rtpo_common = load_module(Path(__file__).resolve().with_name("rtpo_common.py"))
HORIZONS, SEEDS = rtpo_common.HORIZONS, rtpo_common.SEEDS


def get_config(arg=None):
  arg = parse_arg(arg, runlocal=False, method="rtpo", horizon=4, seed=0, model="tiny", steps=0,
                  budget=-1, paper=True, branches=2)
  config = rtpo_common.base_config(arg)
  config.env = "kv_fork"
  # kv_lookup's keys and values; 24 store entries hold two chains of up to K = 8 links plus
  # distractors. Demonstrations pick a start at random (the cold start does not know the rule).
  config.env_knobs.update(dict(num_keys=24, key_length=3, value_digits=4, seed=0,
                               num_branches=arg.branches, demo_branch="uniform"))
  rtpo_common.paper_settings(config, bool(arg.paper))
  if config.method == SFT and not arg.steps and not arg.runlocal:
    # 800 steps (kv_lookup's) leave the student on the copying plateau here (greedy success 0
    # at K = 2); 1600 give 0.15-0.50 over 3 seeds at K = 2, but at K = 4 two of three seeds
    # were still on it (0.000, 0.008) and needed `steps=3200` (0.570, 0.367), and at K = 6
    # seeds needed 3200, 4800 and 6400 (docs/results.md, "RTPO"): check the cold start's
    # greedy success before RL and resume with more steps while it is below 0.1.
    config.steps = 1600
  return config


sweep = rtpo_common.horizon_sweep
metrics = rtpo_common.grid_metrics
