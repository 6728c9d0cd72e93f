r"""GCPO (arXiv 2608.11674): GRPO whose updates stay out of the principal subspaces of the
starting weights (`config.update_constraint`, models/subspace.py `gcpo_projection`), trained on
one domain of the task mixture while the other domains are evaluated (retention).

Commands (R = a directory with the mixed SFT student, configs/rl_family_common.py):

  python experiments/grpo.py --config=configs/gcpo.py --workdir=/tmp/gcpo/gcpo \
      --config.init_from=$R/sft
  python experiments/grpo.py --config=configs/gcpo.py:mode=none --workdir=/tmp/gcpo/grpo \
      --config.init_from=$R/sft                        # unconstrained GRPO, same everything

Variants (after the colon): `mode=bilateral|left|right|principal|none` (the paper's ablations:
one-sided, projecting into the principal block, unconstrained), `k=<protected rank>` (paper 8),
`domain=arith|countdown|format` (the domain trained on; the others are `eval/<d>/accuracy`),
`runlocal` (tiny model, 4 steps, for tests), `steps=<n>`, `model=<preset>`.

Deviation from the paper: the update is full-rank inside the allowed subspace (an optimizer
stage projecting AdamW's update), not rank-32 LoRA factors (the project has no LoRA path yet);
the constraint Φ_kᵀ δW = 0, δW Ψ_k = 0 is the same. Targets: every attention and MLP
projection (PROPOSAL; the paper's set is not given). Base objective: GRPO without KL (the paper:
GRPO with KL).
"""

from pathlib import Path

import ml_collections

from jaxrl_post.config_args import load_module, parse_arg
from jaxrl_post.models import subspace
from jaxrl_post.training import base_configs

COMMON = load_module(Path(__file__).resolve().with_name("rl_family_common.py"))

BINARY = "experiments/grpo.py"


def get_config(arg=None):
  arg = parse_arg(arg, runlocal=False, mode="bilateral", k=subspace.K, domain="arith",
                  model="small", steps=30)
  config = base_configs.grpo_base("grpo")
  COMMON.set_task(config, f"mixture/{arg.domain}", arg.runlocal)  # + eval_tasks: the others
  config.model, config.steps = arg.model, arg.steps
  config.update_constraint = ml_collections.ConfigDict(dict(
    name="gcpo", k=arg.k, mode=arg.mode, targets=subspace.DEFAULT_TARGETS))
  if arg.runlocal:
    base_configs.shrink_grpo_for_runlocal(config)
    config.update_constraint.k = 2
  return config


def sweep(add, arg=None):
  del arg
  for seed in (0, 1, 2):
    for mode in ("bilateral", "none"):
      add(seed=seed, **{"update_constraint.mode": mode})


def metrics():
  return ["train/reward_correct", "eval/accuracy", "eval/countdown/accuracy",
          "eval/format/accuracy"]
