r"""GRPO on countdown (reach a target from 3 numbers with + − × ÷).

Commands (not measured end to end: the SFT of `small` ran ≈ 4.9 s/step under load and had
held-out accuracy 0.0 at step 100 when it was stopped at step 165; docs/results.md):

  python experiments/sft.py --config=configs/grpo_countdown.py:sft --workdir=/tmp/sft_countdown
  python experiments/grpo.py --config=configs/grpo_countdown.py --workdir=/tmp/grpo_countdown \
      --config.init_from=/tmp/sft_countdown

`:sft` gives the matching SFT config (same task and lengths); `runlocal` shrinks either.
"""

from jaxrl_post.config_args import parse_arg
from jaxrl_post.training import base_configs


def get_config(arg=None):
  arg = parse_arg(arg, runlocal=False, sft=False, model="small", loss="grpo", numbers=3)
  # prompts are ≤ 90 characters
  return base_configs.task_config(arg, task="countdown", task_knobs=dict(num_numbers=arg.numbers),
                                  prompt_len=96, completion_len=48)


def sweep(add, arg=None):
  del arg
  for lr in (2e-5, 5e-5):
    add(**{"optimizer.lr": lr})
