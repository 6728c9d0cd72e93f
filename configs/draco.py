r"""DRACO vs outcome-reward GRPO and a static rubric on multi-turn envs (arXiv 2609.04094).

DRACO trains without a verifier: a judge grades each group of rollouts on a rubric (criteria
from the instruction and from reading the rollouts, the undiscriminating ones dropped), the
reward is R_i = (p_i − f_i)/(p_i + f_i), and the verdicts' step citations spread the GRPO
advantage over the turns (jaxrl_post/methods/rubric_credit.py). The judge here is a stand-in:
a program reading the env's privileged episode state (kv_lookup's hops and answer), see that
module. Three arms, sharing everything else (configs/rtpo_<env>.py's turn_grpo: G = 8, token-
mean PPO-clip, lr 1e-4, the generated-token budget, evaluation on the env's success):

  turn_grpo      outcome-reward GRPO (the env's verifier reward, the paper's reference)
  draco_static   "static rubric, no step credit": the stage criteria only, no dropout, every
                 turn its rollout's A_i (PROPOSAL reading of the paper's ablation)
  draco          the dynamic rubric and DRACO's step credit

One seed, by hand (kv_lookup at K = 4; a cold start first, as for RTPO):

  python experiments/rtpo.py --config=configs/draco.py:method=sft --workdir=/tmp/draco_kv/sft
  for m in turn_grpo draco_static draco; do
    python experiments/rtpo.py --config=configs/draco.py:method=$m \
        --workdir=/tmp/draco_kv/s0/$m --config.init_from=/tmp/draco_kv/sft
  done

The sweep, the three arms × seeds 0 1 2 from that cold start (`BINARY` names experiments/rtpo.py
for scripts/sweep.py):

  python scripts/sweep.py --config=configs/draco.py --workdir=/tmp/draco_kv \
      -- --config.init_from=/tmp/draco_kv/sft

Not measured yet at full size; the runlocal smoke run (tests/experiments/test_draco_runlocal.py)
takes about half a minute per run on 2 CPU cores.

Variants (after the colon): `env=kv|calculator`, `method=draco|draco_static|turn_grpo|sft|...`,
`horizon=K` (default 4), `seed=<n>`, `model=<preset>`, `steps=<n>`, `budget=<tokens>` (−1: the
per-K default, 0: none), `leniency=<p>`, `runlocal`. Knobs `config.draco.*`:

  leniency   PROPOSAL (default 0, the frozen judge): the probability that the judge passes a
             criterion it would fail, drawn from (seed, step); 0.304 imitates the paper's
             lenient self-judge
  eps        Σw at or below which a rollout's step credit falls back to uniform (1e-8)
"""

from pathlib import Path

import ml_collections

from jaxrl_post.config_args import load_module, parse_arg

_HERE = Path(__file__).resolve().parent
# The env configs this one reuses (their env knobs, model and lengths).
ENV_CONFIGS = {"kv": "rtpo_kv.py", "calculator": "rtpo_calculator.py"}
# Outcome-reward GRPO (the host), the static-rubric baseline, DRACO.
ARMS = ("turn_grpo", "draco_static", "draco")
SEEDS = (0, 1, 2)
LENIENCY = 0.0  # PROPOSAL: the frozen judge; the paper's self-judge ≈ 0.304
SELF_JUDGE_LENIENCY = 0.304  # the share of the frozen judge's FAILs the self-judge passed

BINARY = "experiments/rtpo.py"


def get_config(arg=None):
  arg = parse_arg(arg, runlocal=False, env="kv", method="draco", horizon=4, seed=0, model="",
                  steps=0, budget=-1, leniency=LENIENCY)
  if arg.env not in ENV_CONFIGS:
    raise ValueError(f"unknown env {arg.env!r}; valid: {', '.join(ENV_CONFIGS)}")
  words = [f"method={arg.method}", f"horizon={arg.horizon}", f"seed={arg.seed}",
           f"steps={arg.steps}", f"budget={arg.budget}"]
  words += [f"model={arg.model}"] if arg.model else []
  words += ["runlocal"] if arg.runlocal else []
  config = load_module(_HERE / ENV_CONFIGS[arg.env]).get_config(",".join(words))
  # DRACO's knobs (method=draco / draco_static; unused otherwise).
  config.draco = ml_collections.ConfigDict(dict(leniency=float(arg.leniency), eps=1e-8))
  return config


def sweep(add, arg=None):
  """The three reward / credit rules × seeds 0 1 2; the arms' configs differ only in `method`."""
  del arg
  for seed in SEEDS:
    for method in ARMS:
      add(method=method, seed=seed)


def metrics():
  return ["eval/success", "eval/sampled_success", "rollout/success", "budget/generated_tokens",
          "time/wall", "draco/reward_mean", "draco/criteria", "draco/kept", "draco/fallback",
          "draco/adv_abs_mean", "draco/lenient_flips"]
