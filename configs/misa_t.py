r"""GRPO with asynchronous rollouts drawn through MISA-T rollout admission (arXiv 2608.11152)
on the task mixture, whose domains are the workload classes (`methods.group_source`,
`sampling.admission`).

Commands:

  python experiments/grpo.py --config=configs/misa_t.py --workdir=/tmp/misa_t
  python experiments/grpo.py --config=configs/misa_t.py:policy=misa --workdir=/tmp/misa
  python experiments/grpo.py --config=configs/misa_t.py:runlocal --workdir=/tmp/misa_t_local
  python experiments/grpo.py --config=configs/misa_t.py:slots=32 --workdir=/tmp/misa_t_slots

Variants (after the colon): `policy=none|static|session|misa|misa_t` (`config.rollout.admission`;
`none` = batches generated as drawn), `runlocal` (tiny model, 4 steps, two arithmetic domains
2 : 1), `steps=<n>`, `model=<preset>`, `slots=<n>` (`config.rollout.num_slots`: the batch's rows
decode by continuous batching through n cache slots, and the policy's class caps become caps
on the slots each class may hold at once, `admission/slot_cap_<domain>`; 0 = static batches).

What to expect. The sampler keeps no prefix cache across batches, so admission changes which
groups are generated when (and, with `slots`, which rows share the slots at a time): the
metrics to read are `admission/held_<domain>`, `admission/cap_<domain>`, `admission/forced` and
`admission/tv_consumed_target` (consumed-vs-target mixture TV), not throughput. The paper's
throughput / prefix-hit claims are tested in the simulator: scripts/misa_t_sim.py.

PROPOSAL values: `admission.kv_blocks` (the batch's KV budget; 0 = prompts_per_step × the
largest footprint), `block_tokens` 16, the conservative footprint quantile 0.9 over the last 64
sessions, `max_releases` 4 (data batches released per epoch at most).
"""

from pathlib import Path

import ml_collections

from jaxrl_post.config_args import load_module, parse_arg
from jaxrl_post.training import base_configs

COMMON = load_module(Path(__file__).resolve().with_name("rl_family_common.py"))

BINARY = "experiments/grpo.py"
POLICIES = ("none", "static", "session", "misa", "misa_t")

# Runlocal classes: two arithmetic domains (1- and 3-digit operands) 2 : 1, so the target
# mixture is not uniform and the tests' format-writing policy earns a reward on both.
RUNLOCAL_DOMAINS = {
  f"arith{n}": {"task": "arith", "weight": w,
                "knobs": {"min_digits": n, "max_digits": n, "num_operands": 2,
                          "operations": "+-"}}
  for n, w in ((1, 2.0), (3, 1.0))
}


def get_config(arg=None):
  arg = parse_arg(arg, runlocal=False, policy="misa_t", model="small", steps=30, slots=0)
  if arg.policy not in POLICIES:
    raise ValueError(f"policy={arg.policy!r}; valid: {', '.join(POLICIES)}")
  config = base_configs.grpo_base("grpo")
  COMMON.set_task(config, "mixture", False)
  config.model, config.steps = arg.model, arg.steps
  config.num_train_examples = 1024
  config.rollout.mode = "async"
  config.rollout.max_in_flight = 1
  config.rollout.admission = arg.policy
  config.rollout.num_slots = arg.slots
  config.admission = ml_collections.ConfigDict(dict(
    kv_blocks=0, block_tokens=16, max_releases=4, window=64, footprint_quantile=0.9))
  if arg.runlocal:
    base_configs.shrink_grpo_for_runlocal(config)
    config.task_knobs = dict(components=RUNLOCAL_DOMAINS)
    config.prompt_len = 16  # one prompt bucket: no recompiles between steps
    config.prompts_per_step, config.group_size = 4, 4
    config.num_train_examples = 64
    # A budget below the batch's: the caps bind and hold sessions every epoch.
    config.admission.kv_blocks = 16
  return config


def sweep(add, arg=None):
  del arg
  for seed in (0, 1, 2):
    for policy in POLICIES:
      add(seed=seed, **{"rollout.admission": policy})


def metrics():
  return ["train/reward_correct", "admission/tv_consumed_target", "admission/forced",
          "rollout/staleness_mean"]
