r"""GTN-R (arXiv 2608.08010) on synthetic regime series: pretrain, then TS-GRPO ± GTN-R.

  # NLL pretraining on the pretraining mix (~1 min on 2 CPU cores):
  python experiments/gtn_r.py --config=configs/gtn_r.py:stage=pretrain \
      --workdir=/tmp/gtn_r/seed_0/pretrain
  # TS-GRPO (variant none), GTN-R A (neighbourhood_nll) or B (anchored_group) from it:
  python experiments/gtn_r.py --config=configs/gtn_r.py:variant=neighbourhood_nll \
      --workdir=/tmp/gtn_r/seed_0/neighbourhood_nll \
      --config.init_from=/tmp/gtn_r/seed_0/pretrain
  # Smoke test (a few steps each):
  python experiments/gtn_r.py --config=configs/gtn_r.py:runlocal,stage=pretrain \
      --workdir=/tmp/gtn_r_smoke/pretrain

The whole comparison (3 seeds × pretrain + 3 variants, table and plot):
`python scripts/gtn_r_collapse.py` (docs/gtn_r_collapse.png).

Config arguments: `runlocal`, `stage=pretrain|grpo`, `variant=none|neighbourhood_nll|
anchored_group`, `seed=<n>`. Every GTN-R number (λ, δ, schedules, M, K) is our PROPOSAL
(the paper's values were not found). Expected metrics (grpo, 300 steps, mean of
seeds 0-2, scripts/gtn_r_collapse.py; pretrained: eval/mse 12.1, eval/mse_hard 37.6):
eval/mse 9.9 / 8.4 / 7.4 and eval/mse_hard 29.3 / 23.1 / 18.1 for none / neighbourhood_nll /
anchored_group; eval/pred_std_hard 0.20 / 1.0 / 2.3 (σ̂ units).
"""

import ml_collections

from jaxrl_post.config_args import parse_arg
from jaxrl_post.training.base_configs import loop_config, optimizer_config

# Not an LLM-training config (no task / tokenizer / model preset).
CONFIG_KIND = "forecasting"
VARIANTS = ("none", "neighbourhood_nll", "anchored_group")


def get_config(arg=None):
  arg = parse_arg(arg, runlocal=False, stage="grpo", variant="neighbourhood_nll", seed=0)
  c = loop_config(arg.seed)
  c.stage = arg.stage
  c.context_len = 32
  c.horizon = 8
  c.model = ml_collections.ConfigDict(dict(hidden=64, num_layers=2, num_components=2,
                                           min_scale=0.01))
  c.pretrain_mix = "pretrain"  # tasks.time_series.MIXES
  c.rl_mix = "rl"
  c.batch_size = 64  # series per pretraining step
  c.prompts_per_step = 16  # series per GRPO step
  c.num_samples = 16  # G forecasts per series
  c.epsilon = 0.2
  c.beta = 0.0  # KL to the start policy (off by default, as in DAPO-style TS-GRPO)
  c.kl_estimator = "k3"
  c.gtn_r = ml_collections.ConfigDict(dict(
    variant=arg.variant,
    reward="mse",  # losses.gtn_r.FORECAST_REWARDS: mse | mae | crps
    lam=0.5, lam_end=0.1,  # λ of variant A, annealed (PROPOSAL)
    delta=0.5, delta_end=0.25,  # δ (σ̂ units) of A's draws and B's anchors (PROPOSAL)
    schedule="linear", anneal_steps=300,
    num_neighbours=8,  # M draws ỹ per series (A)
    num_anchors=2,  # K anchors per group (B)
    anchor_weight=1.0,
    eval_delta=0.5,  # radius of the mass-near-truth diagnostic (fixed across variants)
    eval_radii=(1.0, 2.0, 4.0),  # wider balls, logged as eval/mass_within_<r> (hard regions)
  ))
  c.rng_impl = "threefry2x32"  # init / rollout / eval keys; runlocal: rbg (faster compiles)
  c.eval_size = 512
  c.eval_samples = 64
  c.pretrain_steps = 1500
  c.rl_steps = 300
  c.pretrain_optimizer = optimizer_config(lr=3e-3, warmup_steps=50)
  c.rl_optimizer = optimizer_config(lr=1e-3)
  c.log_every = 10
  c.eval_every = 25
  c.checkpoint_every = 100
  if arg.runlocal:
    c.pretrain_steps, c.rl_steps = 4, 4
    c.batch_size, c.prompts_per_step, c.num_samples = 16, 8, 4
    c.model.hidden = 16
    c.eval_size, c.eval_samples = 64, 8
    c.gtn_r.anneal_steps = 4
    c.rng_impl = "rbg"
    c.pretrain_optimizer.warmup_steps = 1
    c.log_every = c.eval_every = c.checkpoint_every = 1
  pretrain = arg.stage == "pretrain"
  c.steps = c.get_ref("pretrain_steps" if pretrain else "rl_steps")
  c.optimizer = c.pretrain_optimizer if pretrain else c.rl_optimizer
  if pretrain:
    c.eval_every = 0 if not arg.runlocal else 1  # evaluated at its end (and step 0)
  return c


def sweep(add, arg=None):
  """3 seeds × (pretrain, then each variant from that seed's pretrain run: `start`)."""
  del arg
  for seed in range(3):
    add(seed=seed, stage="pretrain")
    for variant in VARIANTS:
      add(seed=seed, stage="grpo", variant=variant, start="pretrain")


def metrics():
  return ["eval/mse", "eval/mse_hard", "eval/mse_easy", "eval/mass_near_truth_hard",
          "eval/mass_within_2_hard", "eval/pred_std_hard", "eval/distance_hard"]
