r"""CD-RFT (arXiv 2608.08224): GRPO on the task mixture with the shared-control-bottleneck
penalty γ·SCB(K) (jaxrl_post/methods/control_regularizer.py), and its matched GRPO baseline.

The task families are the mixture's domains (arith, countdown, format; configs/
rl_family_common.py); the components are the per-layer attention and MLP blocks; K[c, f] is
family f's policy gradient (one extra backward pass per family and update) dotted with the
update's displacement θ − θ⁰ on component c.

Commands (R = a directory with the mixed SFT student, configs/rl_family_common.py):

  python experiments/grpo.py --config=configs/cd_rft.py --workdir=/tmp/cdrft/g0.01 \
      --config.init_from=$R/sft
  python experiments/grpo.py --config=configs/cd_rft.py:gamma=0.1 --workdir=/tmp/cdrft/g0.1 \
      --config.init_from=$R/sft
  python experiments/grpo.py --config=configs/cd_rft.py:gamma=0 --workdir=/tmp/cdrft/grpo \
      --config.init_from=$R/sft       # matched GRPO: same step, SCB logged, no penalty

Variants (after the colon): `gamma=<γ>` (PROPOSAL default 0.01), `scale=displacement` (this
project's variant γ·sg(‖Δθ‖)·SCB, whose gradient does not grow as 1/‖Δθ‖ near θ⁰ and so does
not take over the update's direction there; default `none`, the spec's γ·SCB),
`task=mixture` (the only
valid task: SCB compares ≥ 2 families), `runlocal` (tiny model, 4 steps, for tests),
`steps=<n>`, `model=<preset>`. `sweep` declares γ ∈ {0, 0.01, 0.1} × seeds 0 1 2.

Settings (PROPOSAL: the paper's values were not available): γ = 0.01; components = per-layer
attention and MLP blocks (`control.granularity = "block"`; attention heads as components are
not implemented); embeddings, norms and lm_head outside K (`control.others = "exclude"`);
families without control in an update left out of SCB's pair mean (`control.inactive =
"skip"`). The step must be one micro-batch and one PPO mini-batch (SCB is not additive over
micro-batches; θ⁰ travels as a shared batch key): `num_micro_batches = ppo_mini_batches = 1`.
No KL term (the paper's best pass@1 variant); `loss.beta` adds the KL-penalised variant.

Runlocal runs on a mixture too (families need ≥ 2 domains), but of two arithmetic domains
(`RUNLOCAL_FAMILIES`: 1-digit and 3-digit operands): the tests' format-writing policy earns
rewards only in the arithmetic format, and the short prompts keep one compiled shape. The
penalty's gradient is checked against NumPy in tests/methods/test_control_regularizer.py.
"""

from pathlib import Path

import ml_collections

from jaxrl_post.config_args import load_module, parse_arg
from jaxrl_post.losses import cd_rft
from jaxrl_post.training import base_configs

COMMON = load_module(Path(__file__).resolve().with_name("rl_family_common.py"))

BINARY = "experiments/grpo.py"

# The tests' runlocal families: two arithmetic domains of the mixture (1-digit and 3-digit
# operands). The tests' format-writing policy earns its format reward on both, so both families
# have policy gradients, and the short prompts share one prompt bucket.
RUNLOCAL_FAMILIES = {
  f"arith{n}": {"task": "arith", "weight": 1.0,
                "knobs": {"min_digits": n, "max_digits": n, "num_operands": 2,
                          "operations": "+-"}}
  for n in (1, 3)
}


def get_config(arg=None):
  arg = parse_arg(arg, runlocal=False, task="mixture", gamma=cd_rft.GAMMA, model="small",
                  scale="none", steps=30)
  if arg.task != "mixture":
    raise ValueError(f"task={arg.task!r}: CD-RFT compares task families, so the task must be "
                     f"'mixture' (>= 2 domains)")
  config = base_configs.grpo_base("grpo")
  COMMON.set_task(config, arg.task, arg.runlocal)
  config.model, config.steps = arg.model, arg.steps
  config.num_train_examples = 1024
  config.control = ml_collections.ConfigDict(dict(
    name="cd_rft", gamma=float(arg.gamma), granularity="block", others="exclude",
    inactive="skip", scale=arg.scale))
  if arg.runlocal:
    base_configs.shrink_grpo_for_runlocal(config)
    config.num_train_examples = 16
    config.task_knobs = dict(components=RUNLOCAL_FAMILIES)
    config.prompt_len = 16  # one prompt bucket: no recompiles between steps
    # 4 prompts × 8 rollouts: enough groups with a reward spread that both families have a
    # policy gradient in most steps (the penalty is then non-zero from the second update on).
    config.prompts_per_step, config.group_size = 4, 8
  # SCB is not additive over micro-batches, and θ⁰ is a shared batch key (passed whole).
  config.num_micro_batches = 1
  config.ppo_mini_batches = 1
  return config


def sweep(add, arg=None):
  del arg
  for seed in (0, 1, 2):
    for gamma in (0.0, 0.01, 0.1):
      add(seed=seed, **{"control.gamma": gamma})


def metrics():
  return ["train/reward_correct", "eval/accuracy", "train/cd_rft_scb", "train/cd_rft_penalty",
          "train/cd_rft_families"]
