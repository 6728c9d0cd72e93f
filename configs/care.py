r"""CARE (arXiv 2609.00892): GRPO on per-prompt rubric rewards whose rubrics evolve by contrasting
the best rollout with an anchor (jaxrl_post/methods/rubric_evolution.py), and its static-rubric
baseline.

Commands (R = a directory with an SFT student, configs/sft_arith.py):

  python experiments/grpo.py --config=configs/care.py --workdir=/tmp/care/care \
      --config.init_from=$R/sft                  # evolving rubrics (CARE)
  python experiments/grpo.py --config=configs/care.py:mode=static --workdir=/tmp/care/static \
      --config.init_from=$R/sft                  # the initial rubric forever (gets hacked)

Variants (after the colon): `mode=care|static`, `initial=<criteria>` (comma-free: use `+`
between names, e.g. `initial=final_line+worked_steps`), `max_criteria=<n>` (0: 2 × initial),
`runlocal` (tiny model, 4 steps, for tests), `steps=<n>`, `model=<preset>`. `sweep` declares
care vs static × seeds 0 1 2; compare `care/true_accuracy` and `eval/accuracy` (the verifier,
which the reward never sees) against `care/rubric_reward`: hacking is the reward rising while
true accuracy stays flat (`care/hack_gap`).

The task is 1-3 digit arithmetic (+, −) with correct demonstrations: the demonstration is the
anchor and the verifier is the pair judge (the miniature's stand-ins; see the part's
docstring). PROPOSAL settings: the initial rubric "final_line,worked_steps" (format only,
hackable), library weights 1 (exact answer 2), cap 2 × initial = 4 criteria.
"""

from pathlib import Path

import ml_collections

from jaxrl_post.config_args import load_module, parse_arg
from jaxrl_post.methods.rubric_evolution import DEFAULT_INITIAL, MODES
from jaxrl_post.training import base_configs

COMMON = load_module(Path(__file__).resolve().with_name("rl_family_common.py"))

BINARY = "experiments/grpo.py"


def rubric_config(arg) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(dict(
    mode=arg.mode, library="arith", initial=arg.initial.replace("+", ","),
    max_criteria=arg.max_criteria))


def get_config(arg=None):
  arg = parse_arg(arg, runlocal=False, mode="care", initial=DEFAULT_INITIAL.replace(",", "+"),
                  max_criteria=0, model="small", steps=30)
  if arg.mode not in MODES:
    raise ValueError(f"mode={arg.mode!r}; valid: {', '.join(MODES)}")
  config = base_configs.grpo_base("grpo")
  COMMON.set_task(config, "arith", arg.runlocal)
  config.model, config.steps = arg.model, arg.steps
  config.num_train_examples = 1024
  config.rubric = rubric_config(arg)
  if arg.runlocal:
    base_configs.shrink_grpo_for_runlocal(config)
    # A small pool, so that prompts recur within 4 steps and their evolved rubrics are used.
    config.num_train_examples = 4
  return config


def sweep(add, arg=None):
  del arg
  for seed in (0, 1, 2):
    for mode in MODES:
      add(seed=seed, **{"rubric.mode": mode})


def metrics():
  return ["care/true_accuracy", "care/rubric_reward", "care/hack_gap", "eval/accuracy",
          "care/adaptive", "care/chase", "care/added", "care/rubric_size",
          "care/pool_rubric_size"]
