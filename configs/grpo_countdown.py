r"""GRPO on countdown (reach a target from 3 numbers with + − × ÷).

Commands (not yet measured end to end; the arithmetic pair in docs/results.md is):

  python experiments/sft.py --config=configs/grpo_countdown.py:sft --workdir=/tmp/sft_countdown
  python experiments/grpo.py --config=configs/grpo_countdown.py --workdir=/tmp/grpo_countdown \
      --config.init_from=/tmp/sft_countdown

`:sft` gives the matching SFT config (same task and lengths); `runlocal` shrinks either.
"""

from jaxrl_post.config_args import parse_arg
from jaxrl_post.training import base_configs


def get_config(arg=None):
  arg = parse_arg(arg, runlocal=False, sft=False, model="small", loss="grpo")
  config = base_configs.sft_base() if arg.sft else base_configs.grpo_base(arg.loss)
  config.task = "countdown"
  config.task_knobs = dict(num_numbers=3)
  config.model = arg.model
  config.prompt_len = 96  # prompts are ≤ 90 characters
  if arg.sft:
    config.completion_len = 48
  else:
    config.max_new_tokens = 48
  if arg.runlocal:
    (base_configs.shrink_sft_for_runlocal if arg.sft else
     base_configs.shrink_grpo_for_runlocal)(config)
  return config


def sweep(add, arg=None):
  del arg
  for lr in (2e-5, 5e-5):
    add(**{"optimizer.lr": lr})
