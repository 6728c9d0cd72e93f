r"""RAIL (arXiv 2608.05080, PROPOSAL reconstruction): GRPO whose extra rollouts per group are chosen
by a contextual bandit trained on the improvement they realise
(jaxrl_post/methods/interventions.py), and its heuristic baseline.

Commands (R = a directory with an SFT student, configs/sft_arith.py):

  python experiments/grpo.py --config=configs/rail.py --workdir=/tmp/rail/rail \
      --config.init_from=$R/sft                  # bandit, shadow-to-live
  python experiments/grpo.py --config=configs/rail.py:mode=heuristic \
      --workdir=/tmp/rail/heuristic --config.init_from=$R/sft   # extra rollouts for all-0/1 groups
  python experiments/grpo.py --config=configs/rail.py:mode=none --workdir=/tmp/rail/grpo \
      --config.init_from=$R/sft                  # plain GRPO (no extra rollouts)

Variants (after the colon): `mode=rail|heuristic|none`, `bandit=linucb|lints`,
`gain=coverage|variance`, `on_agreement=hold|reset` (a decision where the bandit picks the
heuristic's arm holds the switch's streak, or resets it as the first runs did),
`switch=streak|share|live` (W wins in a row; a share ≥ `min_share` of the last W decisions; the
bandit acts from the start), `alpha=<LinUCB α>`, `runlocal`
(tiny model, 4 steps, for tests), `steps=<n>`, `model=<preset>`, `task=arith|quickstart`
(`quickstart`: the README quickstart's task and GRPO recipe, where its SFT student improves
within 40 steps — 1-2 digit operands, 32 prompts a step in 4 PPO mini-batches, constant AdamW
2e-5 — with `max_groups` scaled to 8 of the 32 groups). `sweep` declares rail /
heuristic / none × seeds 0 1 2; compare `eval/accuracy` against `rail/extra_tokens` (the
cost) and `rail/mixed_after` (groups with a GRPO signal).

PROPOSAL settings (the paper gives none): restart arms m ∈ {2, 4, 8} × T ∈ {0.7, 1.0, 1.2} plus
"none"; at most 4 of the 16 groups intervened per step (32 extra rows, padded); coverage gain;
λ = 0.1 per G·max_new_tokens tokens; LinUCB α = 1, ridge 1, discount γ = 0.99; shadow ε = 0.1
and W = 50 winning decisions in a row to go live, agreements with the heuristic holding the
streak (`switch=share`: a share ≥ 0.5 of wins among the last 50, this project's PROPOSAL);
rollout budget 64 per prompt for the context feature.
"""

from pathlib import Path

import ml_collections

from jaxrl_post.config_args import load_module, parse_arg
from jaxrl_post.methods.interventions import MODES, ON_AGREEMENT, SWITCHES
from jaxrl_post.sampling import interventions as iv
from jaxrl_post.training import base_configs

COMMON = load_module(Path(__file__).resolve().with_name("rl_family_common.py"))

BINARY = "experiments/grpo.py"
TASKS = ("arith", "quickstart")


def intervention_config(arg) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(dict(
    mode=arg.mode, bandit=arg.bandit, gain=arg.gain,
    extra_rollouts=tuple(iv.RAIL_EXTRA_ROLLOUTS), temperatures=tuple(iv.RAIL_TEMPERATURES),
    max_groups=4, alpha=float(arg.alpha), reg=1.0, gamma=0.99, cost_weight=iv.RAIL_COST_WEIGHT,
    epsilon=iv.RAIL_EPSILON, window=iv.RAIL_WINDOW, on_agreement=arg.on_agreement,
    switch=arg.switch, min_share=iv.RAIL_MIN_SHARE, rollout_budget=64))


def get_config(arg=None):
  arg = parse_arg(arg, runlocal=False, mode="rail", bandit="linucb", gain="coverage",
                  on_agreement=ON_AGREEMENT, switch="streak", alpha=1.0, model="small",
                  steps=30, task="arith")
  if arg.mode not in (*MODES, "none"):
    raise ValueError(f"mode={arg.mode!r}; valid: {', '.join(MODES)}, none")
  if arg.switch not in SWITCHES:
    raise ValueError(f"switch={arg.switch!r}; valid: {', '.join(SWITCHES)}")
  if arg.task not in TASKS:
    raise ValueError(f"task={arg.task!r}; valid: {', '.join(TASKS)}")
  config = base_configs.grpo_base("grpo")
  COMMON.set_task(config, "arith", arg.runlocal)
  config.model, config.steps = arg.model, arg.steps
  config.num_train_examples = 1024
  config.intervention = intervention_config(arg)
  if arg.task == "quickstart":
    # experiments/quickstart.py's GRPO stage (its SFT student gains ≈ 11 points in 40 steps).
    config.task_knobs.max_digits = 2
    config.num_train_examples = 200_000
    config.prompts_per_step, config.ppo_mini_batches, config.num_micro_batches = 32, 4, 1
    config.optimizer.lr, config.optimizer.decay_steps = 2e-5, 10**9
    config.intervention.max_groups = 8  # the PROPOSAL's 4 of 16 groups, at 32
  if arg.runlocal:
    base_configs.shrink_grpo_for_runlocal(config)
    config.num_train_examples = 16
    rail = config.intervention
    # Two temperatures (two padded `generate` shapes), 8 extra rows; ε = 0.5 and W = 2 so that
    # random arms are drawn and the switch can go live within 4 steps.
    rail.extra_rollouts, rail.temperatures = (2, 4), (1.0, 1.2)
    rail.max_groups, rail.epsilon, rail.window, rail.rollout_budget = 2, 0.5, 2, 16
  return config


def sweep(add, arg=None):
  del arg
  for seed in (0, 1, 2):
    for mode in (*MODES, "none"):
      add(seed=seed, **{"intervention.mode": mode})


def metrics():
  return ["train/reward_correct", "eval/accuracy", "rail/interventions", "rail/extra_tokens",
          "rail/gain", "rail/utility", "rail/mixed_before", "rail/mixed_after", "rail/live",
          "rail/controller_share", "rail/agree_share", "rail/win_share", "rail/window_share",
          "rail/margin"]
