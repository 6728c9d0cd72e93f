r"""TrajVal (arXiv 2608.09217): GRPO whose prompts are drawn from a static learnability prior,
and the probe run that prior is measured with (jaxrl_post/methods/task_priors.py).

A pool of `num_train_examples` problems of uneven difficulty (the task mixture, or 1-3 digit
arithmetic). Two runs:

  1. the probe: plain GRPO on a small uniform subset of the pool (the first 64
     problems of the pool; the paper: 512 of ≈ 17k, about 3 %);
  2. the main run: at its first step every pool problem is scored with `samples` sampled
     completions under the starting policy (r_e) and the probe's final policy (r_l), and the
     prompts of every step are drawn with p_i ∝ max((v_i / max v)^0.3, 0.05),
     v_i = (1 − r_e,i) · max(0, r_l,i − r_e,i).

Commands (R = a directory with the mixed SFT student, configs/rl_family_common.py):

  python experiments/grpo.py --config=configs/trajval.py:probe --workdir=/tmp/tv/probe \
      --config.init_from=$R/sft
  python experiments/grpo.py --config=configs/trajval.py --workdir=/tmp/tv/trajval \
      --config.init_from=$R/sft --config.task_prior.probe=/tmp/tv/probe
  python experiments/grpo.py --config=configs/trajval.py:prior=uniform \
      --workdir=/tmp/tv/uniform --config.init_from=$R/sft           # the uniform baseline

Variants (after the colon): `task=mixture|arith` (default mixture;
configs/rl_family_common.py), `probe` (the probe run), `prior=trajval|uniform`, `runlocal`
(tiny model, 4 steps, for tests), `steps=<n>`, `model=<preset>`. `sweep` declares the
comparison: uniform vs TrajVal, seeds 0 1 2 (the probe is run once per seed first).

Deviations from the paper (miniature): the pool is 1,024 generated problems, not DAPO-Math
or GURU; the probe (`:probe`) trains 20 steps on 64 of them instead of 20 epochs on 512; 8
samples per endpoint instead of 16 (PROPOSAL values, all config keys below).
"""

from pathlib import Path

import ml_collections

from jaxrl_post.config_args import load_module, parse_arg
from jaxrl_post.tasks import priors
from jaxrl_post.training import base_configs

COMMON = load_module(Path(__file__).resolve().with_name("rl_family_common.py"))


def task_prior_config(arg) -> ml_collections.ConfigDict:
  prior = ml_collections.ConfigDict()
  prior.name = arg.prior
  # The probe run's workdir (its latest checkpoint is the "late" policy).
  prior.probe = ""
  prior.samples = 8  # PROPOSAL (paper's endpoint estimate: 16)
  prior.prompts_per_call = 64
  prior.gamma = priors.TRAJVAL_GAMMA
  prior.floor = priors.TRAJVAL_FLOOR
  return prior

BINARY = "experiments/grpo.py"


def get_config(arg=None):
  arg = parse_arg(arg, runlocal=False, task="", probe=False, prior="trajval", model="small",
                  steps=30)
  config = base_configs.grpo_base("grpo")
  COMMON.set_task(config, arg.task, arg.runlocal)
  config.model, config.steps = arg.model, arg.steps
  config.num_train_examples = 1024  # the pool
  config.task_prior = task_prior_config(arg)
  if arg.runlocal:
    base_configs.shrink_grpo_for_runlocal(config)
    config.num_train_examples = 16
    config.task_prior.samples = 2
    config.task_prior.prompts_per_call = 8
  if arg.probe:
    config.task_prior.name = "uniform"
    config.num_train_examples = 4 if arg.runlocal else 64  # the probe's subset of the pool
    config.steps = 2 if arg.runlocal else 20
  return config


def sweep(add, arg=None):
  del arg
  for seed in (0, 1, 2):
    add(seed=seed, **{"task_prior.name": "uniform"})
    add(seed=seed, **{"task_prior.name": "trajval"})


def metrics():
  return ["train/reward_correct", "eval/accuracy", "eval/sample_accuracy",
          "prior/learnable_fraction"]
