r"""WMRL (arXiv 2608.12564): GRPO on world-model rewards, debiased by a thin stream of real-reward
anchor groups (jaxrl_post/methods/world_model.py, jaxrl_post/advantages/wmrl.py), and its
ablations.

Commands (R = a directory with an SFT student, configs/sft_arith.py):

  python experiments/grpo.py --config=configs/wmrl.py --workdir=/tmp/wmrl/wmrl \
      --config.init_from=$R/sft                  # both corrections
  python experiments/grpo.py --config=configs/wmrl.py:mode=env --workdir=/tmp/wmrl/env \
      --config.init_from=$R/sft                  # GRPO on real rewards (every row verified)
  python experiments/grpo.py --config=configs/wmrl.py:mode=raw --workdir=/tmp/wmrl/raw \
      --config.init_from=$R/sft                  # the world model alone, uncorrected
  python experiments/grpo.py --config=configs/wmrl.py:calibrator=identity,ivd=False \
      --workdir=/tmp/wmrl/mix --config.init_from=$R/sft   # anchors mixed in, no correction

Variants (after the colon): `mode=wmrl|raw|env`, `calibrator=isotonic|identity` (Online
Debiasing on / off), `ivd=True|False` (Inverse-Variance Denoising on / off),
`world_model=digit_overlap|verifier` (the stand-in world model; "verifier" is the unbiased
control), `runlocal` (tiny model, 4 steps, for tests), `steps=<n>`, `model=<preset>`. `sweep`
declares the paper's ablation table (env, raw, mix, +IVD, +OD, both) × seeds 0 1 2; compare
`eval/accuracy` against `wmrl/env_rows` (the environment calls paid).

The task is 1-3 digit arithmetic (+, −): the stand-in world model grades integer answers. The
world model is "digit_overlap" (partial credit for aligned digits) with Gaussian noise of std
0.1 (PROPOSAL: the paper's world model is the policy backbone; see the part's docstring).
Anchors: ⌈10 %⌉ of the groups, at least 2, at most 24 (the reference code's floor and cap; 2 of
16 groups here). Calibration: 10 bins on [0, 1], FIFO of 5000 pairs (reference). Miniature
counts (PROPOSAL, the reference's are for runs of thousands of groups): f̂ first fits at 64 pairs
(reference 200) and refits every 16 (64); IVD's EMA half-life is 16 groups (64) and c is fixed
after 8 (32); target 2 and w_max 4 are the reference's.
"""

import ml_collections

from jaxrl_post.config_args import parse_arg
from jaxrl_post.methods.world_model import MODES
from jaxrl_post.training import base_configs


def world_model_config(arg) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(dict(
    name=arg.world_model, mode=arg.mode, calibrator=arg.calibrator, ivd=arg.ivd,
    noise_std=0.1, anchor_fraction=0.1, min_anchors=2, max_anchors=24,
    capacity=5000, bins=10, min_pairs=64, refit_every=16,
    half_life=16.0, warmup=8, target=2.0, w_max=4.0, eps=1e-4))

BINARY = "experiments/grpo.py"


def get_config(arg=None):
  arg = parse_arg(arg, runlocal=False, mode="wmrl", calibrator="isotonic", ivd=True,
                  world_model="digit_overlap", model="small", steps=30)
  if arg.mode not in MODES:
    raise ValueError(f"mode={arg.mode!r}; valid: {', '.join(MODES)}")
  config = base_configs.grpo_base("grpo")
  config.task = "arith"
  config.task_knobs = dict(min_digits=1, max_digits=3, num_operands=2, operations="+-",
                           demo_slip=0.0)
  config.model, config.steps = arg.model, arg.steps
  config.num_train_examples = 1024
  config.world_model = world_model_config(arg)
  if arg.runlocal:
    base_configs.shrink_grpo_for_runlocal(config)
    config.num_train_examples = 16
    wm = config.world_model
    # 2 groups a step: 1 anchor, 1 world-model group; f̂ fits within the 4 steps (4 pairs a
    # step), and the noise spreads r_wm over several bins so that a fit exists.
    wm.min_anchors, wm.noise_std = 1, 0.2
    wm.min_pairs, wm.refit_every, wm.half_life, wm.warmup = 4, 4, 2.0, 2
  return config


# (mode, calibrator, ivd): the paper's 4B ablation rows.
ABLATIONS = (
  ("env", "isotonic", False),  # GRPO on real rewards
  ("raw", "isotonic", False),  # the world model alone (no anchors, so nothing to calibrate)
  ("wmrl", "identity", False),  # both signals mixed, no correction
  ("wmrl", "identity", True),  # + IVD
  ("wmrl", "isotonic", False),  # + OD
  ("wmrl", "isotonic", True),  # both corrections (WMRL)
)


def sweep(add, arg=None):
  del arg
  for seed in (0, 1, 2):
    for mode, calibrator, ivd in ABLATIONS:
      add(seed=seed, **{"world_model.mode": mode, "world_model.calibrator": calibrator,
                        "world_model.ivd": ivd})


def metrics():
  return ["train/reward_correct", "eval/accuracy", "wmrl/env_rows", "wmrl/rwm_corr",
          "wmrl/reward_mae", "wmrl/ivd_weight", "wmrl/calibrator_fitted",
          "wmrl/disagreement"]
