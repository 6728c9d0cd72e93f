r"""Teacher-forced SFT of `small` on arithmetic demonstrations: the warm start for GRPO.

Command (2 CPU cores, ≈ 10–16 minutes; held-out greedy accuracy 0.90 at step 400,
docs/results.md):

  python experiments/sft.py --config=configs/sft_arith.py --workdir=/tmp/sft_arith

Variants (after the colon): `runlocal` (a few steps of `tiny`, for tests),
`model=<preset>`, `steps=<n>`. Any field: `--config.optimizer.lr=1e-3`.
"""

from jaxrl_post.config_args import parse_arg
from jaxrl_post.training import base_configs


def get_config(arg=None):
  arg = parse_arg(arg, runlocal=False, model="small", steps=400)
  config = base_configs.sft_base()
  config.task = "arith"
  # Two-operand additions and subtractions of 1-2 digit numbers: short
  # chain-of-thought demonstrations (≤ 67 characters) a 3M-parameter model learns.
  config.task_knobs = dict(min_digits=1, max_digits=2, num_operands=2, operations="+-",
                          demo_slip=0.0)
  config.model, config.steps = arg.model, arg.steps
  if arg.runlocal:
    base_configs.shrink_sft_for_runlocal(config)
  return config


def sweep(add, arg=None):
  del arg
  for lr in (1e-3, 3e-3):
    add(**{"optimizer.lr": lr})


def metrics():
  return ["train/nll", "eval/accuracy"]
