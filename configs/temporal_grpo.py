r"""Temporal GRPO vs Trajectory-GRPO and Stage-Reward GRPO on multi-turn envs (arXiv 2608.13026).

Temporal GRPO splits an episode into a chain of stages and runs GRPO per stage over the episodes
that entered it; each turn gets the advantage of the stage it worked on
(jaxrl_post/methods/stage_credit.py). Stages come from the env's detector on its privileged
episode state (`envs.Env.stage_times`): kv_lookup's hop k resolved (k = 1..K) and the correct
answer, K + 1 stages. The paper's three arms share everything but the credit rule:

  turn_grpo      Trajectory-GRPO: the episode's return advantage on every turn (the host)
  stage_reward   Stage-Reward GRPO: trajectory GRPO on the fraction of stages completed
                 (PROPOSAL definition)
  temporal_grpo  stage-aligned per-turn advantages

Shared (configs/rtpo_<env>.py's turn_grpo): G = 8 episodes per prompt, token-mean PPO-clip, lr
1e-4, the generated-token budget, evaluation. PROPOSAL (the paper gives none; SimpleVLA-RL's):
the asymmetric clip ε_L = 0.2, ε_H = 0.28, for all three arms. The paper's per-rollout 1/|a_i|
normalisation is not used: turn rows are trained with the host's token-mean, so the arms differ
only in `config.method`.

One seed, by hand (kv_lookup at K = 4; a cold start first, as for RTPO):

  python experiments/rtpo.py --config=configs/temporal_grpo.py:method=sft \
      --workdir=/tmp/tgrpo_kv/sft
  for m in turn_grpo stage_reward temporal_grpo; do
    python experiments/rtpo.py --config=configs/temporal_grpo.py:method=$m \
        --workdir=/tmp/tgrpo_kv/s0/$m --config.init_from=/tmp/tgrpo_kv/sft
  done

The sweep, the three arms × seeds 0 1 2 from that cold start (9 runs; `BINARY` below names
experiments/rtpo.py for scripts/sweep.py):

  python scripts/sweep.py --config=configs/temporal_grpo.py --workdir=/tmp/tgrpo_kv \
      -- --config.init_from=/tmp/tgrpo_kv/sft

Not measured yet at full size; the runlocal smoke runs (tests/experiments/
test_temporal_grpo_runlocal.py) take ≈ 20-40 s each on 2 CPU cores.

Variants (after the colon): `env=kv|calculator`, `method=temporal_grpo|stage_reward|turn_grpo|
sft|...`, `horizon=K` (default 4), `seed=<n>`, `model=<preset>`, `steps=<n>`, `budget=<tokens>`
(−1: the per-K default, 0: none), `runlocal` (a few steps, for tests). Knob: ε of σ_k,
`--config.temporal_grpo.eps=1e-6`.
"""

from pathlib import Path

import ml_collections

from jaxrl_post.config_args import load_module, parse_arg

_HERE = Path(__file__).resolve().parent
# The env configs this one reuses (their env knobs, model and lengths).
ENV_CONFIGS = {"kv": "rtpo_kv.py", "calculator": "rtpo_calculator.py"}
# Trajectory-GRPO (the host), Stage-Reward GRPO, Temporal GRPO.
ARMS = ("turn_grpo", "stage_reward", "temporal_grpo")
SEEDS = (0, 1, 2)
EPSILON_HIGH = 0.28  # PROPOSAL: SimpleVLA-RL's clip-higher, shared by every arm

BINARY = "experiments/rtpo.py"


def get_config(arg=None):
  arg = parse_arg(arg, runlocal=False, env="kv", method="temporal_grpo", horizon=4, seed=0,
                  model="", steps=0, budget=-1)
  if arg.env not in ENV_CONFIGS:
    raise ValueError(f"unknown env {arg.env!r}; valid: {', '.join(ENV_CONFIGS)}")
  words = [f"method={arg.method}", f"horizon={arg.horizon}", f"seed={arg.seed}",
           f"steps={arg.steps}", f"budget={arg.budget}"]
  words += [f"model={arg.model}"] if arg.model else []
  words += ["runlocal"] if arg.runlocal else []
  config = load_module(_HERE / ENV_CONFIGS[arg.env]).get_config(",".join(words))
  config.loss.epsilon_high = EPSILON_HIGH
  # Temporal GRPO's knob (method=temporal_grpo / stage_reward; unused otherwise).
  config.temporal_grpo = ml_collections.ConfigDict(dict(eps=1e-6))
  return config


def sweep(add, arg=None):
  """The paper's credit rules × seeds 0 1 2; the arms' configs differ only in `method`."""
  del arg
  for seed in SEEDS:
    for method in ARMS:
      add(method=method, seed=seed)


def metrics():
  return ["eval/success", "eval/sampled_success", "rollout/success", "budget/generated_tokens",
          "time/wall", "stage/success_1", "stage/success_2", "stage/participation",
          "stage/adv_abs_mean"]
