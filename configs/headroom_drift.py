r"""Headroom-Drift Replay (arXiv 2609.03941): GRPO whose update also replays stored groups that
still have headroom and whose generating policy has not drifted (jaxrl_post/methods/
group_replay.py), and the paper's baselines.

Commands (R = a directory with the mixed SFT student, configs/rl_family_common.py):

  python experiments/grpo.py --config=configs/headroom_drift.py --workdir=/tmp/hd/hd \
      --config.init_from=$R/sft
  python experiments/grpo.py --config=configs/headroom_drift.py:replay=naive \
      --workdir=/tmp/hd/naive --config.init_from=$R/sft          # naive replay (newest groups)
  python experiments/grpo.py --config=configs/headroom_drift.py:replay=none \
      --workdir=/tmp/hd/onpolicy --config.init_from=$R/sft        # on-policy, same fresh batch
  python experiments/grpo.py --config=configs/headroom_drift.py:replay=matched \
      --workdir=/tmp/hd/matched --config.init_from=$R/sft         # on-policy, matched update size

Variants (after the colon): `task=mixture|arith` (default mixture;
configs/rl_family_common.py), `replay=headroom_drift|headroom_only|naive|none|matched`
(`matched`: no replay, `prompts_per_step + budget` fresh prompts, the paper's "on-policy
matched"), `runlocal` (tiny model, 4 steps, for tests), `steps=<n>`, `model=<preset>`.

Paper (math, Qwen2.5-Math-1.5B): fresh batch b = 256 groups, K_rep = 128, τ = 1e-3, buffer
C = 512 groups. Miniature (ratios kept): b = 16, K_rep = 8, C = 32, τ = 1e-3; the candidates
scored teacher-forced each step are the 16 with the largest cached headroom (the paper walks
the whole ranking until K_rep are accepted).
"""

from pathlib import Path

import ml_collections

from jaxrl_post.config_args import load_module, parse_arg
from jaxrl_post.training import base_configs

COMMON = load_module(Path(__file__).resolve().with_name("rl_family_common.py"))

REPLAYS = ("headroom_drift", "headroom_only", "naive", "none", "matched")

BINARY = "experiments/grpo.py"


def get_config(arg=None):
  arg = parse_arg(arg, runlocal=False, task="", replay="headroom_drift", model="small", steps=30)
  if arg.replay not in REPLAYS:
    raise ValueError(f"replay={arg.replay!r}; valid: {', '.join(REPLAYS)}")
  config = base_configs.grpo_base("grpo")
  COMMON.set_task(config, arg.task, arg.runlocal)
  config.model, config.steps = arg.model, arg.steps
  config.replay = ml_collections.ConfigDict(dict(
    name=arg.replay, capacity=32, budget=8, tau=1e-3, max_candidates=16))
  if arg.runlocal:
    base_configs.shrink_grpo_for_runlocal(config)
    config.prompts_per_step = 4
    config.replay.update(capacity=4, budget=2, max_candidates=3, tau=1.0)
  if arg.replay == "matched":
    config.prompts_per_step += config.replay.budget
  if arg.replay in ("none", "matched"):
    config.replay.name = "none"
  return config


def sweep(add, arg=None):
  del arg
  for seed in (0, 1, 2):
    for replay in ("headroom_drift", "naive", "none"):
      add(seed=seed, **{"replay.name": replay})


def metrics():
  return ["train/reward_correct", "eval/accuracy", "replay/accepted", "replay/drift_accepted"]
