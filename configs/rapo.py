r"""RAPO (arXiv 2608.03660): RLOO with risk-aware per-prompt loss scaling (R-Scale) and a
risk-bucket task prior (R-Bucket) — jaxrl_post/methods/sample_scale.py and task_priors.py.

Commands (R = a directory with the mixed SFT student, configs/rl_family_common.py):

  python experiments/grpo.py --config=configs/rapo.py --workdir=/tmp/rapo/rapo \
      --config.init_from=$R/sft
  python experiments/grpo.py --config=configs/rapo.py:scale=none,prior=uniform \
      --workdir=/tmp/rapo/rloo --config.init_from=$R/sft          # the RLOO backbone alone

Variants (after the colon): `task=mixture|arith` (default mixture;
configs/rl_family_common.py), `scale=rapo|none` (R-Scale), `prior=rapo_bucket|uniform`
(R-Bucket), `runlocal` (tiny model, 4 steps, for tests), `steps=<n>`, `model=<preset>`.
`sweep` declares the backbone, each channel alone and both, seeds 0 1 2.

Every risk formula is a PROPOSAL (the paper's are not published): reliability
1 − 4 p̂(1 − p̂), sensitivity mean π(y)(1 − π(y)) of the sampled tokens, ρ = σ(κ(z(sens) −
z(rel))) with κ = 2, λ = clip(1 − ρ, 0.2, 1); buckets cut at the 1/3 and 2/3 quantiles of ρ,
drawn 0.80 / 0.15 / 0.05 with a uniform fraction 0.2, refreshed every 5 steps from the risks of
the tasks drawn so far (unseen tasks take the median).
"""

from pathlib import Path

import ml_collections

from jaxrl_post.config_args import load_module, parse_arg
from jaxrl_post.tasks import priors
from jaxrl_post.training import base_configs

COMMON = load_module(Path(__file__).resolve().with_name("rl_family_common.py"))

BINARY = "experiments/grpo.py"


def get_config(arg=None):
  arg = parse_arg(arg, runlocal=False, task="", scale="rapo", prior="rapo_bucket", model="small",
                  steps=30)
  config = base_configs.grpo_base("grpo")
  COMMON.set_task(config, arg.task, arg.runlocal)
  config.model, config.steps = arg.model, arg.steps
  config.advantage = "rloo"  # RAPO's backbone
  config.num_train_examples = 1024  # the pool the prior draws from
  config.sample_scale = ml_collections.ConfigDict(dict(
    name=arg.scale, kappa=2.0, lam_min=0.2, normalise="zscore", sensitivity="sampled",
    binary=True))
  config.task_prior = ml_collections.ConfigDict(dict(
    name=arg.prior, refresh_every=5, bucket_probs=priors.RAPO_BUCKET_PROBS,
    uniform_mix=priors.RAPO_UNIFORM_MIX))
  if arg.runlocal:
    base_configs.shrink_grpo_for_runlocal(config)
    config.num_train_examples = 16
    config.task_prior.refresh_every = 2
  return config


def sweep(add, arg=None):
  del arg
  for seed in (0, 1, 2):
    for scale, prior in (("none", "uniform"), ("rapo", "uniform"), ("none", "rapo_bucket"),
                         ("rapo", "rapo_bucket")):
      add(seed=seed, **{"sample_scale.name": scale, "task_prior.name": prior})


def metrics():
  return ["train/reward_correct", "eval/accuracy", "train/rapo_lambda_mean"]
