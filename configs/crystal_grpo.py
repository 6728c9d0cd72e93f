r"""CrystalGRPO (arXiv 2608.06582) on toy crystals (jaxrl_post/methods/crystal_grpo.py).

One seed, by hand (pretrain the flow on the polymorphs, then GRPO in mode q, c or energy-only):

  python experiments/crystal_grpo.py --config=configs/crystal_grpo.py:method=pretrain \
      --workdir=/tmp/crystal_grpo/s0/pretrain
  python experiments/crystal_grpo.py --config=configs/crystal_grpo.py:method=grpo,mode=c \
      --workdir=/tmp/crystal_grpo/s0/c --config.init_from=/tmp/crystal_grpo/s0/pretrain

The reproduction (energy-only vs Q vs C, 3 seeds): scripts/crystal_grpo_modes.py.

Variants (after the colon): `method=pretrain|grpo`, `mode=q|c|energy` (energy: mode q with the
energy-only reward w_match = 0, w_E = 1), `steps=<n>`, `seed=<n>`, `runlocal` (tiny, for tests).
Knobs: `--config.crystal.a_frac=0.1`, `--config.crystal.a_lattice=0.5`,
`--config.crystal.eta=1.0`, `--config.crystal.beta_full=0.01`,
`--config.crystal.coverage=basins`, `--config.task.target=1`, `--config.task.w_energy=0.1`,
`--config.crystal.schedule=retain|reweight` (LeanGRPO's gradient schedules, arXiv 2609.03528:
the same gradient without recomputing the window's forwards; mode c needs beta_full = 0 there).

Settings (PROPOSAL; the paper's weights, schedules, η and β were not found): composition A2B2
(4 atoms, 3 Lennard-Jones polymorphs, E/atom −3.638, −3.384, −3.156), target polymorph 1 (not
the lowest-energy one); R = R_match + 0.1·R_E, τ_E = 1.0, matcher ltol 0.3 / stol 0.5 / 10°
(pymatgen's CSP defaults). Policy: an MLP (width 128, depth 3) on periodic features of F and
the standardised lattice, pretrained for 3000 flow-matching steps on the polymorphs jittered
by 0.01. SDE: T = 10 steps, a_F = 0.1 (step std ≤ 0.1 of the period: the wrapped
Gaussian is accurate), a_L = 0.5; window S = the first half of the steps (noise end). GRPO:
4 groups × G = 16 a step, 300 steps, ε = 1e-4, adv_clip_max 5, one update per rollout batch,
Adam 1e-3 constant. Mode c: coverage "max_match", η = 1, dedup on, β_full = 0.01 (KL summed
over all T steps). Evaluation: 16 trials × 20 ODE samples (40 steps).
"""

import ml_collections

from jaxrl_post.config_args import parse_arg
from jaxrl_post.parallel.mesh import mesh_config
from jaxrl_post.training import base_configs

CONFIG_KIND = "flow"  # Not an LLM-training config (no task / tokenizer / LM preset).
BINARY = "experiments/crystal_grpo.py"
METHODS = ("pretrain", "grpo")
MODES = ("q", "c", "energy")


def get_config(arg=None):
  arg = parse_arg(arg, runlocal=False, method="pretrain", mode="q", steps=0, seed=0)
  if arg.method not in METHODS:
    raise ValueError(f"unknown method {arg.method!r} in the config argument; valid: "
                     f"{', '.join(METHODS)}")
  if arg.mode not in MODES:
    raise ValueError(f"unknown mode {arg.mode!r} in the config argument; valid: "
                     f"{', '.join(MODES)}")
  c = base_configs.loop_config(seed=arg.seed)
  c.method = arg.method
  # The velocity MLP is tiny: replicated, the update runs as one jitted program.
  c.mesh = mesh_config(ici={"data": -1})
  c.task = ml_collections.ConfigDict(dict(
    composition="A2B2", target=1, ltol=0.3, stol=0.5, angle_tol=10.0, rms_max=None,
    w_match=1.0, w_energy=0.1, tau_energy=1.0, jitter_frac=0.01, jitter_lattice=0.01))
  c.task.rms_max = ml_collections.config_dict.placeholder(float)
  if arg.mode == "energy":
    c.task.update(w_match=0.0, w_energy=1.0)
  c.model = ml_collections.ConfigDict(dict(hidden=128, depth=3, time_dim=16))
  c.pretrain_batch = 256
  coverage_mode = arg.mode == "c"
  c.crystal = ml_collections.ConfigDict(dict(
    mode="c" if coverage_mode else "q", num_steps=10, timestep_fraction=0.5,
    step_selection="first", group_size=16, prompts_per_step=4, a_frac=0.1, a_lattice=0.5,
    epsilon=1e-4, adv_clip_max=5.0, beta=0.0, beta_full=0.01 if coverage_mode else 0.0,
    eta=1.0 if coverage_mode else 0.0, coverage="max_match", dedup=coverage_mode,
    reduction="sum", schedule="native"))
  c.eval = ml_collections.ConfigDict(dict(trials=16, top_n=20, num_steps=40, kl_samples=128))
  pretrain = arg.method == "pretrain"
  base_configs.flow_stage(c, pretrain=pretrain, steps=arg.steps or (3000 if pretrain else 300),
                          eval_every=3000 if pretrain else 50,
                          checkpoint_every=3000 if pretrain else 50)
  if arg.runlocal:
    base_configs.shrink_flow_for_runlocal(c, pretrain=pretrain, steps=arg.steps)
    c.crystal.update(num_steps=4, group_size=4, prompts_per_step=2)
    c.eval.update(trials=2, top_n=4, num_steps=4, kl_samples=8)
  return c


def sweep(add, arg=None):
  """Seeds 0 1 2 of the run the argument names (`python scripts/sweep.py
  --config=configs/crystal_grpo.py:method=grpo,mode=c --workdir=/tmp/crystal_sweep --
  --config.init_from=/tmp/crystal_grpo/s0/pretrain`); scripts/crystal_grpo_modes.py instead
  pretrains per seed and runs the three modes."""
  del arg
  for seed in (0, 1, 2):
    add(seed=seed)


def metrics():
  return ["eval/mr1", "eval/mr_top", "eval/rmse1", "eval/rmse_top", "eval/basins",
          "eval/share_p0", "eval/kl_pretrained", "train/reward", "train/match", "time/step"]
