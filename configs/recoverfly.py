r"""RecoverFly (arXiv 2608.09467): failure-aware token-level RL on synthetic aerial navigation
(`tasks.aerial_nav`; PROPOSAL; the method is `methods.recoverfly.RecoverFly`).

The policy reads a map code, its start cell and a goal descriptor with the goal's offset
(`H23B11 @04 tower@31 d+3-3`) and writes an action program `M<dir><dist> × 3 STOP` under a
token grammar; the verifier flies it in closed loop (collisions end the episode); reward =
success. GRPO on the action tokens plus:

  failure replay   `recoverfly.rho_fail` of each batch from the buffer of tasks whose group
                   success rate ≤ `tau`, drawn ∝ failures + `age_weight`·age, evicted after
                   `evict_after` solves (`capacity` slots)
  curriculum       scenes ∝ data frequency before `switch_step`, ∝ freq^`alpha` after
  reference KL     `loss.beta`·k3 KL to the frozen start on the last `kl_window` action tokens
                   (0: the whole trajectory)

Every constant here is a PROPOSAL: the paper's values are "not found".

Commands (BC pretraining on head-scene expert programs, then RL from it):

  python experiments/sft.py --config=configs/recoverfly.py:sft --workdir=/tmp/rf_sft
  python experiments/recoverfly.py --config=configs/recoverfly.py --workdir=/tmp/rf \
      --config.init_from=/tmp/rf_sft
  # ablation variants: variant=grpo | replay | curriculum | kl | all (default)
  python experiments/recoverfly.py --config=configs/recoverfly.py:variant=grpo ...

scripts/recoverfly_ablation.py runs the five variants over 3 seeds with a matched rollout
budget. `runlocal` shrinks either stage to a few steps of the `tiny` model (the tests).
"""

from jaxrl_post.config_args import parse_arg
from jaxrl_post.tasks import aerial_nav as aerial_nav  # registers "aerial_nav" for any binary
from jaxrl_post.training import base_configs

VARIANTS = ("grpo", "replay", "curriculum", "kl", "all")
PROMPT_LEN = 32  # "H35V21 @06 crane@52 d-3+4\n" is ≤ 26 characters
COMPLETION_LEN = 20  # "M21 M30 M00 STOP" + EOS = 17 tokens
HEAD_SCENES = 2  # the task's num_head_scenes
NEVER = 10**9  # a switch step no run reaches: stage 1 (∝ frequency) throughout


def recoverfly_section(variant: str, steps: int) -> dict:
  """`config.recoverfly` of an ablation variant (module docstring)."""
  replay = variant in ("replay", "all")
  curriculum = variant in ("curriculum", "all")
  return dict(capacity=256, tau=0.0, evict_after=1, age_weight=0.1,
              rho_fail=0.25 if replay else 0.0,
              switch_step=max(steps // 3, 1) if curriculum else NEVER, alpha=0.3,
              kl_window=3)


def get_config(arg=None):
  arg = parse_arg(arg, runlocal=False, sft=False, model="tiny", loss="recoverfly_window_kl",
                  variant="all", seed=0)
  if arg.variant not in VARIANTS:
    raise ValueError(f"config arg variant={arg.variant!r}; valid: {', '.join(VARIANTS)}")
  knobs = dict(seed=0, grid=5, max_moves=3, show_offset=True, num_train=8192)
  config = base_configs.task_config(arg, task="aerial_nav", task_knobs=knobs,
                                    prompt_len=PROMPT_LEN, completion_len=COMPLETION_LEN)
  config.seed = arg.seed
  config.num_train_examples = 1024
  if arg.sft:  # BC on expert programs of the head scenes only (the RL pool has them all)
    config.task_knobs = dict(knobs, train_scenes=HEAD_SCENES)
    base_configs.sft_stage(config, completion_len=COMPLETION_LEN, runlocal=arg.runlocal)
    return config
  config.constrained_decoding = True
  config.trim_completions_to = 0  # the grammar fixes the length
  config.reward_weights = dict(correct=1.0)
  config.loss.beta = 0.05 if arg.variant in ("kl", "all") else 0.0
  config.optimizer.lr = 1e-4
  config.eval_pass_k = 0
  config.max_new_tokens = COMPLETION_LEN
  if arg.runlocal:  # base_configs' shrink: 4 steps of 2 prompts × 4 samples
    config.num_train_examples = 64
  else:
    config.prompts_per_step = 16
    config.group_size = 8
    config.steps = 60
    config.eval_examples = 128
  config.recoverfly = recoverfly_section(arg.variant, config.steps)
  if arg.runlocal:
    config.recoverfly.update(dict(switch_step=2, rho_fail=0.5, capacity=8, tau=0.5))
  return config


def sweep(add, arg=None):
  """3 seeds × the five ablation variants."""
  del arg
  for seed in (0, 1, 2):
    for variant in VARIANTS:
      section = recoverfly_section(variant, 60)
      add(**{"seed": seed, "loss.beta": 0.05 if variant in ("kl", "all") else 0.0,
             **{f"recoverfly.{k}": v for k, v in section.items()}})
