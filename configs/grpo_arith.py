r"""GRPO on arithmetic, starting from the SFT checkpoint of configs/sft_arith.py.

Command (2 CPU cores, ~6 minutes after SFT; held-out greedy accuracy rises):

  python experiments/sft.py --config=configs/sft_arith.py --workdir=/tmp/sft_arith
  python experiments/grpo.py --config=configs/grpo_arith.py --workdir=/tmp/grpo_arith \
      --config.init_from=/tmp/sft_arith

Variants: `runlocal`, `model=<preset>`, `steps=<n>`, `loss=<policy loss name>`.
"""

import ml_collections

from jaxrl_post.config_args import parse_arg


def get_config(arg=None):
  arg = parse_arg(arg, runlocal=False, model="small", steps=30, loss="grpo")
  config = ml_collections.ConfigDict()
  config.seed = 0
  config.task = "arith"
  config.task_knobs = dict(min_digits=1, max_digits=2, num_operands=2, operations="+-")
  config.tokenizer = "char"
  config.model = arg.model
  config.model_overrides = ml_collections.ConfigDict()
  config.prompt_len = 16
  config.max_new_tokens = 72
  config.prompts_per_step = 16
  config.group_size = 8
  config.temperature = 1.0
  config.top_k = 0
  config.top_p = 1.0
  config.num_train_examples = 200_000
  config.steps = arg.steps
  config.ppo_epochs = 1
  config.num_micro_batches = 2
  config.advantage = "grpo"
  config.advantage_eps = 1e-6
  config.reward_weights = dict(correct=1.0, format=0.1)
  config.loss = ml_collections.ConfigDict(dict(
    name=arg.loss, loss_agg_mode="token-mean", epsilon_low=0.2, epsilon_high=0.28, beta=0.0,
    kl_estimator="k3"))
  # 5e-4 collapsed the SFT policy within 5 steps (reward 0.79 → 0.2); 5e-5 improves it.
  config.optimizer = ml_collections.ConfigDict(dict(lr=5e-5, warmup_steps=0, weight_decay=0.0,
                                                    grad_clip=1.0, decay_steps=0))
  config.eval_every = 10
  config.eval_examples = 128
  config.eval_pass_k = 4
  config.log_every = 1
  config.checkpoint_every = 10
  config.keep_checkpoints = 2
  config.resume = ""
  config.init_from = ""
  config.max_nonfinite_streak = 5
  if arg.runlocal:
    config.optimizer.decay_steps = 8
    config.model = "tiny"
    config.steps = 4
    config.prompts_per_step = 2
    config.group_size = 4
    config.max_new_tokens = 12
    config.num_train_examples = 64
    config.eval_every = 2
    config.eval_examples = 4
    config.eval_pass_k = 2
    config.checkpoint_every = 2
  return config


def sweep(add, arg=None):
  del arg
  for loss in ("grpo", "gspo", "cispo"):
    for lr in (2e-5, 5e-5, 1e-4):
      add(**{"loss.name": loss, "optimizer.lr": lr})


def metrics():
  return ["train/reward_mean", "eval/accuracy", "eval/pass_at_4"]
