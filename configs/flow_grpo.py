r"""Flow-GRPO (arXiv 2505.05470) + LeanGRPO's gradient schedules (arXiv 2609.03528) on a 2-D
two-mode Gaussian mixture (jaxrl_post/methods/flow_grpo.py).

One seed, by hand (pretrain the flow policy, then GRPO from it):

  python experiments/flow_grpo.py --config=configs/flow_grpo.py:method=pretrain \
      --workdir=/tmp/flow_grpo/s0/pretrain
  python experiments/flow_grpo.py --config=configs/flow_grpo.py:method=grpo,schedule=reweight \
      --workdir=/tmp/flow_grpo/s0/grpo --config.init_from=/tmp/flow_grpo/s0/pretrain

The reproduction (3 seeds, reward curve, schedule timings): scripts/flow_grpo_schedules.py.

Variants (after the colon): `method=pretrain|grpo`, `schedule=native|retain|reweight`,
`steps=<n>` (the run's length; default 1500 pretrain / 200 grpo), `fraction=<|S|/T>`,
`seed=<n>`, `runlocal` (tiny, a few steps, for tests). Knobs: `--config.flow.a=0.7`,
`--config.flow.beta=0.01`, `--config.flow.epsilon=1e-4`, `--config.flow.group_size=8`,
`--config.flow.num_steps=10`, `--config.target="(2.0, 0.0)"`.

Settings: the policy is a 3-layer SiLU MLP (width 64, sinusoidal time features); the data are
two Gaussians at (±2, 0), std 0.3; the reward r(x) = −‖x − (2, 0)‖² prefers the right mode
(PROPOSAL). GRPO: G = 8 samples per group (Flow-GRPO's official configs: 24), 4
groups a step, T = 10 SDE steps (the configs' training count), a = 0.7, ε = 1e-4, adv_clip_max
= 5, β = 0.01, |S| = T·timestep_fraction with fraction 0.5 here (the configs: 0.99; LeanGRPO's
independent variable), one update per rollout batch (the on-policy setting LeanGRPO's exactness
needs). Adam lr 1e-3 (the configs' 1e-4 is for LoRA on SD3.5; PROPOSAL for a 10k-parameter MLP).
Evaluation: 1024 ODE samples with 40 steps (Flow-GRPO evaluates with 40). Expected (3 seeds,
CPU): the pretrain run splits its samples ~50/50 over the two modes (eval reward ≈ −8.1); GRPO
moves most of the mass to the target mode within 200 steps (docs/flow_grpo_reward.png).
"""

import ml_collections

from jaxrl_post.config_args import parse_arg
from jaxrl_post.parallel.mesh import mesh_config
from jaxrl_post.training import base_configs

CONFIG_KIND = "flow"  # Not an LLM-training config (no task / tokenizer / LM preset).
BINARY = "experiments/flow_grpo.py"
METHODS = ("pretrain", "grpo")


def get_config(arg=None):
  arg = parse_arg(arg, runlocal=False, method="pretrain", schedule="reweight", steps=0,
                  fraction=0.5, seed=0)
  if arg.method not in METHODS:
    raise ValueError(f"unknown method {arg.method!r} in the config argument; valid: "
                     f"{', '.join(METHODS)}")
  c = base_configs.loop_config(seed=arg.seed)
  c.method = arg.method
  # Every device on `data`: GRPO's gradient then runs with LeanGRPO's shared-prompt layout
  # (group_size divisible by the device count); the 10k-parameter MLP is replicated.
  c.mesh = mesh_config(ici={"data": -1})
  c.mixture = "two_modes_2d"
  c.target = (2.0, 0.0)
  c.model = ml_collections.ConfigDict(dict(hidden=64, depth=3, time_dim=16))
  c.pretrain_batch = 256
  c.flow = ml_collections.ConfigDict(dict(
    schedule=arg.schedule, num_steps=10, timestep_fraction=arg.fraction, step_selection="first",
    group_size=8, prompts_per_step=4, a=0.7, epsilon=1e-4, adv_clip_max=5.0, beta=0.01,
    reduction="mean"))
  c.eval = ml_collections.ConfigDict(dict(samples=1024, num_steps=40, kl_samples=256))
  pretrain = arg.method == "pretrain"
  base_configs.flow_stage(c, pretrain=pretrain, steps=arg.steps or (1500 if pretrain else 200),
                          eval_every=500 if pretrain else 20,
                          checkpoint_every=500 if pretrain else 100)
  if arg.runlocal:
    base_configs.shrink_flow_for_runlocal(c, pretrain=pretrain, steps=arg.steps)
    # G = 8: on the tests' fake 8-device host, one sample of each group per device.
    c.flow.update(num_steps=4, group_size=8, prompts_per_step=1)
    c.eval.update(samples=64, num_steps=4, kl_samples=16)
  return c


def sweep(add, arg=None):
  """Seeds 0 1 2 × the three schedules, for `configs/flow_grpo.py:method=grpo` runs from one
  pretrain run (`python scripts/sweep.py --config=configs/flow_grpo.py:method=grpo
  --workdir=/tmp/flow_sweep -- --config.init_from=/tmp/flow_grpo/s0/pretrain`);
  scripts/flow_grpo_schedules.py instead pretrains per seed."""
  del arg
  for seed in (0, 1, 2):
    for schedule in ("native", "retain", "reweight"):
      add(seed=seed, **{"flow.schedule": schedule})


def metrics():
  return ["eval/reward", "eval/mode_coverage", "eval/target_mode_share", "eval/kl_pretrained",
          "train/reward", "time/step"]
