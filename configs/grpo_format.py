r"""GRPO on the short format-following task ("[APPLE]"-style answers, very short responses).

Commands (not yet measured end to end):

  python experiments/sft.py --config=configs/grpo_format.py:sft --workdir=/tmp/sft_format
  python experiments/grpo.py --config=configs/grpo_format.py --workdir=/tmp/grpo_format \
      --config.init_from=/tmp/sft_format

`:sft` gives the matching SFT config; `runlocal` shrinks either.
"""

from jaxrl_post.config_args import parse_arg
from jaxrl_post.training import base_configs


def get_config(arg=None):
  arg = parse_arg(arg, runlocal=False, sft=False, model="small", loss="grpo")
  config = base_configs.sft_base() if arg.sft else base_configs.grpo_base(arg.loss)
  config.task = "format"
  config.task_knobs = dict()
  config.model = arg.model
  config.prompt_len = 80  # prompts are ≤ 71 characters
  if arg.sft:
    config.completion_len = 24
  else:
    config.max_new_tokens = 24
  if arg.runlocal:
    (base_configs.shrink_sft_for_runlocal if arg.sft else
     base_configs.shrink_grpo_for_runlocal)(config)
  return config


def sweep(add, arg=None):
  del arg
  for lr in (2e-5, 5e-5):
    add(**{"optimizer.lr": lr})
