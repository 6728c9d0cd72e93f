r"""FACTOR vs turn-level GRPO on multi-turn envs (arXiv 2608.07118).

FACTOR gives each action (turn) a TD credit A*_t from Monte-Carlo continuations of a few turn
snapshots (TAC, values pinned to the group-mean return at t = 0 and 0 at the end, linear between
the checkpoints: no learned value head), spreads it over the action's tokens by a hindsight
teacher's log-prob gap while keeping its mean (HTA + APM), and averages the loss per action
(jaxrl_post/methods/action_credit.py). Arms, sharing everything else (configs/rtpo_<env>.py's
turn_grpo: G = 8, PPO-clip ε = 0.2, lr 1e-4, the generated-token budget, which FACTOR's
continuations count against, evaluation):

  turn_grpo   GRPO: A_i on every token
  factor      TAC + HTA + APM

Both use the per-action mean (`loss.loss_agg_mode="seq-mean-token-mean"`: each turn row is one
action), FACTOR's reduction, so the arms differ only in the credit (PROPOSAL for the baseline).
Ablations by knob: `--config.factor.tac=False` (uniform credit), `--config.factor.hta=False`.

One seed, by hand (kv_lookup at K = 4; a cold start first, as for RTPO):

  python experiments/rtpo.py --config=configs/factor.py:method=sft --workdir=/tmp/factor_kv/sft
  for m in turn_grpo factor; do
    python experiments/rtpo.py --config=configs/factor.py:method=$m \
        --workdir=/tmp/factor_kv/s0/$m --config.init_from=/tmp/factor_kv/sft
  done

The sweep, both arms × seeds 0 1 2 (`BINARY` names experiments/rtpo.py for scripts/sweep.py):

  python scripts/sweep.py --config=configs/factor.py --workdir=/tmp/factor_kv \
      -- --config.init_from=/tmp/factor_kv/sft

Not measured yet at full size.

Variants (after the colon): `env=kv|calculator`, `method=factor|turn_grpo|sft|...`,
`horizon=K` (default 4), `seed=<n>`, `model=<preset>`, `steps=<n>`, `budget=<tokens>`,
`runlocal` (1 checkpoint × 2 continuations). Knobs `config.factor.*`: `checkpoints` and
`continuations` (paper "2×4"), `tac`, `hta`, `eta_start` (0.7) and `eta_end` (PROPOSAL 0.3) of
the linear η anneal over `eta_steps` (the config's `steps` when built; with a token budget,
over the fraction of it spent instead), `tau` (1), `d` (3),
`standardize` (PROPOSAL: divide A* by the group's population std), `eps`, `template` and
`terminal` (the hindsight line, PROPOSAL: OCSD's short form).
"""

from pathlib import Path

import ml_collections

from jaxrl_post.config_args import load_module, parse_arg
from jaxrl_post.methods.action_credit import FACTOR_LOSS_AGG, FactorConfig

_HERE = Path(__file__).resolve().parent
ENV_CONFIGS = {"kv": "rtpo_kv.py", "calculator": "rtpo_calculator.py"}
ARMS = ("turn_grpo", "factor")
SEEDS = (0, 1, 2)

BINARY = "experiments/rtpo.py"


def get_config(arg=None):
  arg = parse_arg(arg, runlocal=False, env="kv", method="factor", horizon=4, seed=0, model="",
                  steps=0, budget=-1)
  if arg.env not in ENV_CONFIGS:
    raise ValueError(f"unknown env {arg.env!r}; valid: {', '.join(ENV_CONFIGS)}")
  words = [f"method={arg.method}", f"horizon={arg.horizon}", f"seed={arg.seed}",
           f"steps={arg.steps}", f"budget={arg.budget}"]
  words += [f"model={arg.model}"] if arg.model else []
  words += ["runlocal"] if arg.runlocal else []
  config = load_module(_HERE / ENV_CONFIGS[arg.env]).get_config(",".join(words))
  config.loss.loss_agg_mode = FACTOR_LOSS_AGG  # the per-action mean, for every arm
  knobs = {f: getattr(FactorConfig(), f) for f in FactorConfig.__dataclass_fields__}
  # η anneals over the run's step count as built here: a resumed run with a larger
  # `--config.steps` keeps its schedule.
  knobs.update(eta_steps=config.steps)
  if arg.runlocal:
    knobs.update(checkpoints=1, continuations=2)
  config.factor = ml_collections.ConfigDict(knobs)
  return config


def sweep(add, arg=None):
  """GRPO and FACTOR × seeds 0 1 2; the arms' configs differ only in `method`."""
  del arg
  for seed in SEEDS:
    for method in ARMS:
      add(method=method, seed=seed)


def metrics():
  return ["eval/success", "eval/sampled_success", "rollout/success", "budget/generated_tokens",
          "time/wall", "factor/eta", "factor/astar_abs_mean", "factor/multiplier_dev",
          "factor/sign_agree", "factor/continuation_tokens"]
