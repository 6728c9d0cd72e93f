r"""GRPO on countdown (reach a target from the given numbers with + − × ÷).

Measured (docs/results.md, one seed, 2 cores shared with two other jobs): with two numbers,
SFT of `small` for 300 steps (24 min) reaches held-out greedy accuracy 0.84; GRPO for 40 steps
(30 min, quickstart settings) then raises sampled accuracy 0.71 → 0.81 (+10.2 ± 2.3 points,
paired) and greedy 0.84 → 0.87 (within noise):

  python experiments/sft.py --config=configs/grpo_countdown.py:sft,numbers=2 \
      --workdir=/tmp/sft_countdown --config.steps=300
  python experiments/grpo.py --config=configs/grpo_countdown.py:numbers=2 \
      --workdir=/tmp/grpo_countdown --config.init_from=/tmp/sft_countdown --config.steps=40 \
      --config.prompts_per_step=32 --config.ppo_mini_batches=4 --config.num_micro_batches=1 \
      --config.optimizer.decay_steps=1000000000 --config.eval_pass_k=8

The default, three numbers, did not learn from scratch: held-out accuracy 0.0 at SFT step 100,
stopped at 165 (≈ 4.9 s/step under load); expect it to need a much longer SFT.

Variants (after the colon): `sft` (the matching SFT config: same task and lengths), `numbers=n`
(how many numbers, default 3), `runlocal` (shrinks either), `model=<preset>`, `loss=<name>`.
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
