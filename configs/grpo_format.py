r"""GRPO on the short format-following task ("[APPLE]"-style answers, very short responses).

Commands (measured on 2 CPU cores under load: SFT 14.6 min, held-out greedy accuracy 1.0 at
step 400; GRPO 4.5 min, greedy stays 1.0, sample accuracy at T = 1 0.959 → 0.979;
docs/results.md):

  python experiments/sft.py --config=configs/grpo_format.py:sft --workdir=/tmp/sft_format
  python experiments/grpo.py --config=configs/grpo_format.py --workdir=/tmp/grpo_format \
      --config.init_from=/tmp/sft_format

`:sft` gives the matching SFT config; `runlocal` shrinks either.
"""

from jaxrl_post.config_args import parse_arg
from jaxrl_post.training import base_configs


def get_config(arg=None):
  arg = parse_arg(arg, runlocal=False, sft=False, model="small", loss="grpo")
  # prompts are ≤ 71 characters
  return base_configs.task_config(arg, task="format", task_knobs={}, prompt_len=80,
                                  completion_len=24)


def sweep(add, arg=None):
  del arg
  for lr in (2e-5, 5e-5):
    add(**{"optimizer.lr": lr})
