r"""CANOPY on the multi-turn envs: outcome-only GRPO with coverage-sized groups (arXiv 2609.01245).

CANOPY is a protocol on top of turn-level GRPO (jaxrl_post/methods/stage_credit.py): sparse
{0, 1} reward; a group size checked at start against the signal-coverage rule
n ≥ log(1 − τ_cov)/log(1 − p̂_min), with p̂ from a pilot of `canopy.pilot_episodes` sampled
episodes of the starting policy; GRPO advantages with the population std over each group's
non-quarantined rollouts; a pooled token-mean over action tokens; one update per rollout batch
(ppo_epochs = ppo_mini_batches = 1: ratio 1, the clip inert); k3 KL to the frozen starting
policy on action tokens, β = 1e-4 (the paper's AppWorld value). Fault quarantine: a rollout with
a tool time-out (`canopy.fault_errors`) leaves its group (our envs have no serving faults).

One seed, by hand (kv_lookup at K = 4; a cold start first, as for RTPO):

  python experiments/rtpo.py --config=configs/canopy.py:method=sft --workdir=/tmp/canopy_kv/sft
  python experiments/rtpo.py --config=configs/canopy.py --workdir=/tmp/canopy_kv/s0/canopy \
      --config.init_from=/tmp/canopy_kv/sft

The sweep, CANOPY against its host and the paper's ablations, × seeds 0 1 2 (15 runs; `BINARY`
below names experiments/rtpo.py for scripts/sweep.py):

  python scripts/sweep.py --config=configs/canopy.py --workdir=/tmp/canopy_kv \
      -- --config.init_from=/tmp/canopy_kv/sft

  method=turn_grpo          the host: Bessel-std GRPO, no quarantine, no pilot (same β)
  method=canopy             the protocol, G = 8
  ablation=g4               G = 4 (the paper's n 32 → 8 ablation, scaled); the group-size
                            check only warns
  ablation=no_kl            β = 0
  ablation=seq_norm         loss_agg_mode = seq-mean-token-mean (per-turn-row normalisation)

or with scripts/multiturn_grid.sh (one cold start, the paired table; arms `label:variant`):

  CONFIG=configs/canopy.py ARMS="turn_grpo canopy g4:ablation=g4 no_kl:ablation=no_kl \
      seq_norm:ablation=seq_norm" bash scripts/multiturn_grid.sh /tmp/canopy_kv

The paper's "2 mini-batches" ablation is not offered: `check_canopy_protocol` rejects it (it
would no longer be CANOPY's ratio-1 objective). Not measured yet at full size; the runlocal smoke
run (tests/experiments/test_canopy_runlocal.py) takes ≈ 20-40 s on 2 CPU cores.

Variants (after the colon): `env=kv|calculator`, `method=canopy|turn_grpo|sft|...`,
`horizon=K` (default 4), `ablation=none|g4|no_kl|seq_norm`, `group=<G>` and `prompts=<n>`
(group size and prompts per step; 0: the env config's 8 and 8), `seed=<n>`, `model=<preset>`,
`steps=<n>`, `budget=<tokens>`, `runlocal` (a few steps, for tests; the pilot then has 4
episodes and only warns). Knobs:
`--config.canopy.coverage_target=0.8`, `--config.canopy.enforce_group_size=True`,
`--config.canopy.pilot_episodes=64`, `--config.canopy.exact_coverage=False`,
`--config.canopy.fault_errors="('timeout',)"`, `--config.canopy.std=True`,
`--config.canopy.eps=1e-6`, `--config.loss.beta=1e-4`.
"""

from pathlib import Path

import ml_collections

from jaxrl_post.config_args import load_module, parse_arg

_HERE = Path(__file__).resolve().parent
ENV_CONFIGS = {"kv": "rtpo_kv.py", "calculator": "rtpo_calculator.py"}
SEEDS = (0, 1, 2)
BETA = 1e-4  # the paper's AppWorld KL coefficient
# The paper's ablations (`ablation=`), each a change of the protocol's config.
ABLATIONS = {
  "none": {},
  "g4": {"group_size": 4},  # n 32 → 8 in the paper, scaled to our G = 8; only warns
  "no_kl": {"beta": 0.0},
  "seq_norm": {"loss_agg_mode": "seq-mean-token-mean"},
}
# The arms of the sweep: the host and CANOPY's ablations.
ARMS = (
  dict(method="turn_grpo"),
  dict(method="canopy"),
  dict(method="canopy", ablation="g4"),
  dict(method="canopy", ablation="no_kl"),
  dict(method="canopy", ablation="seq_norm"),
)

BINARY = "experiments/rtpo.py"


def get_config(arg=None):
  arg = parse_arg(arg, runlocal=False, env="kv", method="canopy", horizon=4, seed=0, model="",
                  steps=0, budget=-1, ablation="none", group=0, prompts=0)
  if arg.env not in ENV_CONFIGS:
    raise ValueError(f"unknown env {arg.env!r}; valid: {', '.join(ENV_CONFIGS)}")
  if arg.ablation not in ABLATIONS:
    raise ValueError(f"unknown ablation {arg.ablation!r}; valid: {', '.join(ABLATIONS)}")
  words = [f"method={arg.method}", f"horizon={arg.horizon}", f"seed={arg.seed}",
           f"steps={arg.steps}", f"budget={arg.budget}"]
  words += [f"model={arg.model}"] if arg.model else []
  words += ["runlocal"] if arg.runlocal else []
  config = load_module(_HERE / ENV_CONFIGS[arg.env]).get_config(",".join(words))
  if arg.method != "sft":
    config.loss.beta = BETA  # k3 (rtpo_common's estimator) to the starting policy
  # CANOPY's knobs (method=canopy; unused otherwise); see methods.stage_credit.CanopyConfig.
  config.canopy = ml_collections.ConfigDict(dict(
    coverage_target=0.8, enforce_group_size=not arg.runlocal,
    pilot_episodes=4 if arg.runlocal else 64, exact_coverage=False, fault_errors=("timeout",),
    std=True, eps=1e-6))
  ablation = ABLATIONS[arg.ablation]
  if "group_size" in ablation:
    config.group_size = ablation["group_size"]
    config.canopy.enforce_group_size = False  # the ablation is below the rule on purpose
  if "beta" in ablation and arg.method != "sft":
    config.loss.beta = ablation["beta"]
  if "loss_agg_mode" in ablation:
    config.loss.loss_agg_mode = ablation["loss_agg_mode"]
  # The group-size study at low success (docs/results.md, CANOPY): explicit sizes; a size
  # below the coverage rule fails at start unless --config.canopy.enforce_group_size=False.
  for word, key in (("group", "group_size"), ("prompts", "prompts_per_step")):
    value = int(arg[word])
    if value < 0:
      raise ValueError(f"{word}={value}: must be >= 1 (or 0 for the env config's value)")
    if value:
      config[key] = value
  return config


def sweep(add, arg=None):
  """The host and CANOPY's ablations × seeds 0 1 2."""
  del arg
  for seed in SEEDS:
    for arm in ARMS:
      add(**arm, seed=seed)


def metrics():
  return ["eval/success", "eval/sampled_success", "rollout/success", "budget/generated_tokens",
          "time/wall", "canopy/coverage", "canopy/quarantined", "canopy/pilot_success",
          "canopy/min_group_size", "train/kl"]
