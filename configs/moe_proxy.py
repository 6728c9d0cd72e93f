r"""GRPO on arithmetic with a Qwen3-MoE policy, for MoE-proxy fault studies (arXiv 2608.10823).

The policy is `qwen3_moe_tiny` (16 experts, top-2; `models.moe`) trained from scratch, with the
router load-balancing loss (`config.moe_aux_loss_coef`, `methods.fault_injection`) and an
optional injected fault (`config.fault`: "logp_precision" or "no_update", from
`fault.start_step`). Proxies are built with `models.moe_proxy.build_moe_proxy`.

Commands:

  python experiments/grpo.py --config=configs/moe_proxy.py --workdir=/tmp/moe_proxy/clean
  python experiments/grpo.py --config=configs/moe_proxy.py:fault=logp_precision \
      --workdir=/tmp/moe_proxy/logp
  python experiments/grpo.py --config=configs/moe_proxy.py:fault=no_update \
      --workdir=/tmp/moe_proxy/frozen

Variants: `runlocal` (4 steps of a 1-layer, top-2-of-4-expert MoE, 6 new tokens; for tests),
`fault=none|logp_precision|no_update`, `model=<preset>`, `steps=<n>`, `aux=<coef>` (0 disables
the load-balancing loss). Expected runtime and metrics of this config: not measured. The
fault-agreement study (scripts/moe_proxy_faults.py --part faults) runs the same injectors
(`methods.fault_injection.build_fault`) in a compact single-token GRPO driver instead, to fit
27+ runs in minutes of CPU.
"""

import ml_collections

from jaxrl_post.config_args import parse_arg
from jaxrl_post.training import base_configs

BINARY = "experiments/grpo.py"


def get_config(arg=None):
  arg = parse_arg(arg, runlocal=False, model="qwen3_moe_tiny", steps=30, fault="none",
                  aux=0.001)
  config = base_configs.grpo_base("grpo")
  config.task = "arith"
  config.task_knobs = dict(min_digits=1, max_digits=1, num_operands=2, operations="+",
                          demo_slip=0.0)
  config.model, config.steps = arg.model, arg.steps
  config.moe_aux_loss_coef = float(arg.aux)
  config.fault = ml_collections.ConfigDict(dict(
    name=arg.fault, dtype="bfloat16", target="logp", scale=1 / 0.7, start_step=0))
  if arg.runlocal:
    base_configs.shrink_grpo_for_runlocal(config)
    config.model = arg.model
    config.max_new_tokens = 6
    if arg.model == "qwen3_moe_tiny":  # the tiniest MoE that still routes: 1 layer, top-2 of 4
      config.model_overrides = ml_collections.ConfigDict(dict(
        num_layers=1, num_experts=4, embed_dim=32, num_heads=2, num_kv_heads=1, head_dim=16,
        mlp_dim=32, moe_mlp_dim=16))
  return config


def sweep(add, arg=None):
  del arg
  for seed in (0, 1, 2):
    add(seed=seed)


def metrics():
  return ["train/reward_correct", "train/moe_aux_loss", "eval/accuracy"]
