r"""RTPO vs turn-level and flattened GRPO on the calculator: success vs horizon K (2608.18682).

The calculator env (jaxrl_post/envs/calculator.py) chains K operations on large numbers, one
`calc` call each, then an answer: K + 1 turns, reward 1 for the exact result, a stand-in for
the paper's math-with-a-Python-tool tasks. Rollouts see ψ = the prompt plus the newest turns
within 128 tokens; flat GRPO trains on the whole history. Each step needs the prompt's k-th
operation and the last result, which `tiny` did not learn in 800 SFT steps (nll 0.5, success
0): this config uses `small` (3.2M parameters), ≈ 10× the cost of configs/rtpo_kv.py.

One (K, seed) cell, a cold start then the three methods from it at the same generated-token
budget (20k tokens per turn of an optimal episode, 100k for K = 4):

  python experiments/rtpo.py --config=configs/rtpo_calculator.py:method=sft,horizon=4 \
      --workdir=/tmp/rtpo_calc/k4/s0/sft
  for m in flat_grpo turn_grpo rtpo; do
    python experiments/rtpo.py --config=configs/rtpo_calculator.py:method=$m,horizon=4 \
        --workdir=/tmp/rtpo_calc/k4/s0/$m --config.init_from=/tmp/rtpo_calc/k4/s0/sft
  done

The whole grid (3 methods × K ∈ {2, 4, 6, 8} × seeds 0-2, SFT per (K, seed)), then its table
and plot (`/tmp/rtpo_calc/success_vs_horizon.png`):

  python scripts/rtpo_horizon.py --config=configs/rtpo_calculator.py --root=/tmp/rtpo_calc
  python scripts/rtpo_horizon.py --root=/tmp/rtpo_calc --summarize

Expected cost on 2 CPU cores: not measured end to end. SFT of `small` took 10-20 s per step
while other jobs shared the cores (≈ 3-5 s alone, 800 steps ≈ 1 hour), and `small` samples
≈ 8× slower than `tiny`; estimate ≈ 1 hour per RL run and 2-3 days for the grid. Use
`model=tiny` for a smoke-sized version (it stays at 0 success).

Variants (after the colon): `method=sft|flat_grpo|turn_grpo|rtpo`, `horizon=K`, `seed=<n>`,
`paper=0` (β = 0, T = 1 and no log-ratio clamp instead of the paper's 0.02, 0.9
and ±10, as in the first grid), `model=<preset>` (default `small`), `steps=<n>`,
`budget=<tokens>` (−1: the per-K default, 0: none), `runlocal` (a few steps, for tests).
Any field: `--config.continuation=off_policy`.
"""

from pathlib import Path

from jaxrl_post.config_args import load_module, parse_arg

# configs/rtpo_common.py: the base config every rtpo_<env>.py adjusts.
rtpo_common = load_module(Path(__file__).resolve().with_name("rtpo_common.py"))
HORIZONS, SEEDS = rtpo_common.HORIZONS, rtpo_common.SEEDS


def get_config(arg=None):
  arg = parse_arg(arg, runlocal=False, method="rtpo", horizon=4, seed=0, model="small", steps=0,
                  budget=-1, paper=True)
  config = rtpo_common.base_config(arg)
  # The paper's β = 0.02, T = 0.9, ±10 log-ratio clamp (`paper=False`: β = 0, T = 1, none).
  rtpo_common.paper_settings(config, bool(arg.paper))
  config.env = "calculator"
  # 3-digit start, 1-2 digit operands, + − ×, values below 10^9: every call is one the tool
  # accepts, and the numbers are too long to multiply in a small model's head.
  config.env_knobs.update(dict(start_digits=3, operand_digits=2, operations="+-*",
                               max_value_digits=9, seed=0))
  return config


sweep = rtpo_common.horizon_sweep
metrics = rtpo_common.grid_metrics
