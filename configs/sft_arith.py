r"""Teacher-forced SFT of `small` on arithmetic demonstrations: the warm start for GRPO.

Command (2 CPU cores, ≈ 10–16 minutes; held-out greedy accuracy 0.90 at step 400,
docs/results.md):

  python experiments/sft.py --config=configs/sft_arith.py --workdir=/tmp/sft_arith

Variants (after the colon): `runlocal` (a few steps of `tiny`, for tests),
`model=<preset>`, `steps=<n>`, `slip=<p>` (the task's `demo_slip`: a sloppy teacher on bare
prompts), `views=none|ice|reflect|both` (methods/sft_views.py: a third of the rows carry one of
configs/ice.py's hint lines, and/or a third a golden negative in configs/reflect_rl.py's
template; those rows learn the exact solution). Any field: `--config.optimizer.lr=1e-3`.

The cold start for ICE / ReflectRL (docs/results.md, "ReflectRL and ICE"):

  python experiments/sft.py --config=configs/sft_arith.py:views=both,slip=0.3 \
      --workdir=/tmp/views/sft
"""

from pathlib import Path

from jaxrl_post.config_args import load_module, parse_arg
from jaxrl_post.training import base_configs

_HERE = Path(__file__).resolve().parent
VIEW_FRAC = 1.0 / 3.0  # share of rows per non-bare view: bare prompts stay the majority


def get_config(arg=None):
  arg = parse_arg(arg, runlocal=False, model="small", steps=400, slip=0.0, views="none")
  config = base_configs.sft_base()
  config.task = "arith"
  # Two-operand additions and subtractions of 1-2 digit numbers: short
  # chain-of-thought demonstrations (≤ 67 characters) a 3M-parameter model learns.
  config.task_knobs = dict(min_digits=1, max_digits=2, num_operands=2, operations="+-",
                          demo_slip=float(arg.slip))
  config.model, config.steps = arg.model, arg.steps
  if arg.views not in ("none", "ice", "reflect", "both"):
    raise ValueError(f"views={arg.views!r} in the config argument; valid: none, ice, reflect, "
                     "both")
  views = config.sft_views
  if arg.views in ("ice", "both"):
    views.hint_frac = VIEW_FRAC
    views.hints = load_module(_HERE / "ice.py").ARITH_INSTRUCTIONS
    config.prompt_len = max(config.prompt_len, 64)  # configs/ice.py's prompt length
  if arg.views in ("reflect", "both"):
    reflect = load_module(_HERE / "reflect_rl.py").get_config()
    views.reflect_frac = VIEW_FRAC
    views.reflect_template = reflect.reflect.template
    config.prompt_len = max(config.prompt_len, reflect.prompt_len)
  if arg.runlocal:
    base_configs.shrink_sft_for_runlocal(config)
  return config


def sweep(add, arg=None):
  del arg
  for lr in (1e-3, 3e-3):
    add(**{"optimizer.lr": lr})


def metrics():
  return ["train/nll", "eval/accuracy"]
