r"""CoKL (arXiv 2608.01743): GRPO with the correctness-conditioned KL to cached reference answers
instead of a full-policy KL (jaxrl_post/methods/cokl_regularizer.py), and its KL baselines.

Commands (R = a directory with the mixed SFT student, configs/rl_family_common.py):

  python experiments/grpo.py --config=configs/cokl.py --workdir=/tmp/cokl/cokl \
      --config.init_from=$R/sft
  python experiments/grpo.py --config=configs/cokl.py:kl=reverse --workdir=/tmp/cokl/rkl \
      --config.init_from=$R/sft                  # full-policy reverse KL (k3), β = 0.04
  python experiments/grpo.py --config=configs/cokl.py:kl=none --workdir=/tmp/cokl/none \
      --config.init_from=$R/sft                  # no regulariser
  python experiments/grpo.py --config=configs/cokl.py:kl=replay --workdir=/tmp/cokl/replay \
      --config.init_from=$R/sft                  # CoKL without its normalisation term

Variants (after the colon): `task=mixture|arith` (default mixture;
configs/rl_family_common.py), `kl=cokl|reverse|none|replay` (`replay`: correct-only replay of
the reference answers, the ablation the paper warns about), `runlocal` (tiny model, 4 steps,
for tests), `steps=<n>`, `model=<preset>`.

Settings: β = 1e-3, ratio clip ε = 0.2, 2 reference answers per prompt (a third-party pilot's
values, not the paper's); 8 reference samples per prompt to find them (PROPOSAL); anchor prompts
are the training prompts (PROPOSAL). The reverse-KL baseline uses the pilot's β = 0.04.
"""

from pathlib import Path

import ml_collections

from jaxrl_post.config_args import load_module, parse_arg
from jaxrl_post.losses import COKL_EPS
from jaxrl_post.training import base_configs

COMMON = load_module(Path(__file__).resolve().with_name("rl_family_common.py"))

KLS = ("cokl", "reverse", "none", "replay")

BINARY = "experiments/grpo.py"


def get_config(arg=None):
  arg = parse_arg(arg, runlocal=False, task="", kl="cokl", model="small", steps=30)
  if arg.kl not in KLS:
    raise ValueError(f"kl={arg.kl!r}; valid: {', '.join(KLS)}")
  config = base_configs.grpo_base("grpo")
  COMMON.set_task(config, arg.task, arg.runlocal)
  config.model, config.steps = arg.model, arg.steps
  config.num_train_examples = 1024
  config.regularizer = ml_collections.ConfigDict(dict(
    name="cokl" if arg.kl in ("cokl", "replay") else "none", beta=1e-3, eps=COKL_EPS,
    per_prompt=2, ref_samples=8, prompt_mean="reference", normalise=arg.kl != "replay"))
  if arg.kl == "reverse":
    config.loss.beta = 0.04
  if arg.runlocal:
    base_configs.shrink_grpo_for_runlocal(config)
    config.ppo_mini_batches = 1  # CoKL's block is per prompt
    config.num_train_examples = 16
    config.regularizer.ref_samples = 2
    config.regularizer.beta = 0.1  # visible in a 4-step test
  return config


def sweep(add, arg=None):
  del arg
  for seed in (0, 1, 2):
    for name, beta, normalise in (("cokl", 0.0, True), ("none", 0.04, True),
                                  ("none", 0.0, True), ("cokl", 0.0, False)):
      add(seed=seed, **{"regularizer.name": name, "loss.beta": beta,
                        "regularizer.normalise": normalise})


def metrics():
  return ["train/reward_correct", "eval/accuracy", "train/cokl_loss", "cokl/ref_accuracy"]
