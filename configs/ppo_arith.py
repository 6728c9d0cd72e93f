r"""PPO with a learned critic (value model, GAE) on arithmetic, from the SFT checkpoint of
configs/sft_arith.py: the GRPO-family step with its `critic` part (jaxrl_post/methods/critic.py).

Commands (2 CPU cores):

  python experiments/sft.py --config=configs/sft_arith.py --workdir=/tmp/sft_arith
  python experiments/grpo.py --config=configs/ppo_arith.py --workdir=/tmp/ppo_arith \
      --config.init_from=/tmp/sft_arith

Expected: not yet measured (the runlocal mode is tested: tests/methods/test_critic.py); compare
`eval/accuracy` with configs/grpo_arith.py's 0.898 → 0.961 and watch
`critic/explained_variance` rise from ≤ 0 as the critic learns.

Settings: verl's LLM-PPO defaults, γ = λ = 1 (with an outcome reward A_j = R − V_j), value clip
ε_v = 0.2, advantages whitened over the step's tokens, no KL in the reward
(`--config.critic.kl_in_reward=0.01` adds InstructGPT's per-token penalty); the critic learns
5× faster than the policy (verl / OpenRLHF use 5-10×) and is initialised from the policy. PPO
needs no group of completions per prompt: 64 prompts × 2 completions (the 128 rollouts of
grpo_arith's 16 × 8, more prompts), the ratio clip symmetric (ε = 0.2, the "ppo" loss).

Variants: `runlocal`, `model=<preset>`, `steps=<n>`.
"""

import ml_collections

from jaxrl_post.config_args import parse_arg
from jaxrl_post.training import base_configs

# The GRPO-family binary: PPO is its step with the `critic` part.
BINARY = "experiments/grpo.py"
POLICY_LR = 5e-5


def get_config(arg=None):
  arg = parse_arg(arg, runlocal=False, model="small", steps=30)
  config = base_configs.grpo_base("ppo")
  config.task = "arith"
  config.task_knobs = dict(min_digits=1, max_digits=2, num_operands=2, operations="+-",
                          demo_slip=0.0)
  config.model, config.steps = arg.model, arg.steps
  config.prompts_per_step, config.group_size = 64, 2
  config.loss.epsilon_high = 0.2
  config.optimizer = base_configs.optimizer_config(lr=POLICY_LR)
  config.critic = ml_collections.ConfigDict(dict(
    enabled=True, gamma=1.0, lam=1.0, value_clip=0.2, kl_in_reward=0.0, whiten=True, epochs=1,
    optimizer=base_configs.optimizer_config(lr=5 * POLICY_LR)))
  if arg.runlocal:
    base_configs.shrink_grpo_for_runlocal(config)
    config.critic.optimizer.decay_steps = config.optimizer.decay_steps
  return config


def sweep(add, arg=None):
  del arg
  for lam in (1.0, 0.95):
    for critic_lr in (1e-4, 5e-4):
      add(**{"critic.lam": lam, "critic.optimizer.lr": critic_lr})


def metrics():
  return ["train/reward_correct", "eval/accuracy", "critic/explained_variance",
          "critic/value_loss"]
