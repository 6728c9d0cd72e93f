r"""Multi-LoRA GRPO on arithmetic: two tenants, one adapter each, on one frozen SFT base.

Tenants (`config.multi_lora.tenants`, overrides of this config): `plus` trains on sums only,
`minus` on differences only (`task_knobs.operations`), each with its own seed; both start
from the same base (`--config.init_from=<an SFT run of configs/sft_arith.py>`), whose held-out
accuracy each tenant's evaluation reports on its own operation.

  python experiments/sft.py --config=configs/sft_arith.py --workdir=/tmp/sft_arith
  python experiments/multi_lora.py --config=configs/multi_lora.py --workdir=/tmp/multi_lora \
      --config.init_from=/tmp/sft_arith
  python scripts/export_hf.py --run_dir=/tmp/multi_lora --adapter=minus --out=/tmp/minus_hf

A tenant's settings are overridden per tenant on the command line, e.g.
`--config.multi_lora.tenants.minus.optimizer.lr=1e-3`; keys that the base model or the loop
fix (model, lora, mesh, steps, cadence: `methods.multi_lora.SHARED_KEYS`) are rejected there.

Variants (after the colon): `runlocal` (tiny model, 4 steps, for tests), `model=<preset>`,
`steps=<n>`, `rank=<r>`.
"""

import ml_collections

from jaxrl_post.config_args import parse_arg
from jaxrl_post.training import base_configs

BINARY = "experiments/multi_lora.py"


def get_config(arg=None):
  arg = parse_arg(arg, runlocal=False, model="small", steps=30, rank=16)
  config = base_configs.grpo_base("grpo")
  config.task = "arith"
  config.task_knobs = dict(min_digits=1, max_digits=2, num_operands=2, operations="+-",
                          demo_slip=0.0)
  config.model, config.steps = arg.model, arg.steps
  config.lora.update(dict(rank=arg.rank, alpha=2.0 * arg.rank))
  # 10× full fine-tuning's rate, as in the LoRA vs full comparison of docs/benchmarks.md.
  config.optimizer.lr = 5e-4
  if arg.runlocal:
    base_configs.shrink_grpo_for_runlocal(config)
  config.multi_lora = ml_collections.ConfigDict(dict(tenants=dict(
    plus=dict(seed=0, task_knobs=dict(operations="+")),
    minus=dict(seed=1, task_knobs=dict(operations="-")),
  )))
  return config


def metrics():
  return ["train/plus/reward_correct", "train/minus/reward_correct", "eval/plus/accuracy",
          "eval/minus/accuracy"]
