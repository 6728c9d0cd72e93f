r"""Teacher-forced SFT of `small` on arithmetic demonstrations: the warm start for GRPO.

Command (2 CPU cores, ~4 minutes, held-out greedy accuracy ≈ 0.3–0.5):

  python experiments/sft.py --config=configs/sft_arith.py --workdir=/tmp/sft_arith

Variants (after the colon): `runlocal` (a few steps of `tiny`, for tests),
`model=<preset>`, `steps=<n>`. Any field: `--config.optimizer.lr=1e-3`.
"""

import ml_collections

from jaxrl_post.config_args import parse_arg


def get_config(arg=None):
  arg = parse_arg(arg, runlocal=False, model="small", steps=400)
  config = ml_collections.ConfigDict()
  config.seed = 0
  config.task = "arith"
  # Two-operand additions and subtractions of 1-2 digit numbers: short
  # chain-of-thought demonstrations a 3M-parameter model learns in minutes.
  config.task_knobs = dict(min_digits=1, max_digits=2, num_operands=2, operations="+-")
  config.tokenizer = "char"
  config.model = arg.model
  config.model_overrides = ml_collections.ConfigDict()
  config.prompt_len = 16
  config.completion_len = 72  # the longest demonstration is 67 characters + EOS
  config.batch_size = 32
  config.num_micro_batches = 1
  config.num_train_examples = 200_000
  config.steps = arg.steps
  config.optimizer = ml_collections.ConfigDict(dict(lr=3e-3, warmup_steps=50, weight_decay=0.0,
                                                    grad_clip=1.0, decay_steps=0))
  config.eval_every = 100
  config.eval_examples = 128
  config.eval_max_new_tokens = 72
  config.eval_pass_k = 0
  config.log_every = 10
  config.checkpoint_every = 200
  config.keep_checkpoints = 2
  config.resume = ""
  config.init_from = ""
  config.max_nonfinite_streak = 5
  if arg.runlocal:
    config.optimizer.decay_steps = 8
    config.model = "tiny"
    config.steps = 6
    config.batch_size = 8
    config.num_micro_batches = 2
    config.num_train_examples = 256
    config.eval_every = 3
    config.eval_examples = 4
    config.eval_max_new_tokens = 16
    config.checkpoint_every = 3
    config.log_every = 1
  return config


def sweep(add, arg=None):
  del arg
  for lr in (1e-3, 3e-3):
    add(**{"optimizer.lr": lr})


def metrics():
  return ["train/nll", "eval/accuracy"]
