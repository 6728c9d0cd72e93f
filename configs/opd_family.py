r"""The on-policy distillation family (jaxrl_post/methods/opd_family.py) on arithmetic.

One student, one frozen teacher (a checkpoint directory), the same budget and evaluation for
every method; `method=` picks the row:

  grpo                      GRPO baseline on the same loop (no teacher)
  opd                       sampled-token OPD
  tv_opd                    TV-OPD (arXiv 2609.08341); ablations: tv_variant=raw|sign|
                            group_constant|permuted
  opd_then_rl               OPD for steps ≤ S, then GRPO (arXiv 2609.04108); switch=<S>|auto
  joint:<baseline>          kdrl, kdrl_mask, srpo, hdpo, trrd, rlsd, kdrl_annealing (Table 1)
  tgopd                     teacher-gated OPD (arXiv 2609.02998), 3 teacher probes per prompt
  opdvr, opdvr_inverse      OPD gated by the verifier (arXiv 2608.24696)
  grpd                      OPDVR × group-relative scale (arXiv 2608.24696)
  oprd                      on-policy reverse distillation (arXiv 2609.08798); needs
                            teacher_ref (the teacher's pre-RL checkpoint)

Commands (R = a directory with an SFT student and GRPO teachers, configs/sft_arith.py and
configs/grpo_arith.py):

  python experiments/opd_family.py --config=configs/opd_family.py:method=opd \
      --workdir=/tmp/opd_family/opd --config.init_from=$R/sft \
      --config.distill.teacher=$R/grpo
  python experiments/opd_family.py --config=configs/opd_family.py:method=oprd \
      --workdir=/tmp/opd_family/oprd --config.init_from=$R/sft \
      --config.distill.teacher=$R/grpo --config.distill.teacher_ref=$R/sft
  python experiments/opd_family.py \
      --config=configs/opd_family.py:method=joint:kdrl_mask,runlocal \
      --workdir=/tmp/opd_family_smoke --config.distill.teacher=<checkpoint dir>

Variants (after the colon): `method=<name>`, `tv_variant=<name>`, `switch=<S>|auto`,
`teacher=<dir>`, `teacher_ref=<dir>`, `runlocal` (tiny model, 3 steps, for tests),
`model=<preset>`, `steps=<n>`. Method settings (β of KDRL, τ of TGOPD, ...) go in
`--config.distill.knobs.<name>=<value>`.
"""

import ml_collections

from jaxrl_post.config_args import parse_arg
from jaxrl_post.training import base_configs

# The grid's rows (scripts and sweeps); every name of `opd_family.method_names()` is valid.
METHODS = ("grpo", "opd", "tv_opd", "opd_then_rl", "joint:kdrl", "joint:kdrl_mask",
           "joint:srpo", "joint:hdpo", "joint:trrd", "joint:rlsd", "joint:kdrl_annealing",
           "tgopd", "opdvr", "grpd", "oprd")


def distill_config(arg) -> ml_collections.ConfigDict:
  d = ml_collections.ConfigDict()
  d.method = arg.method
  d.teacher = arg.teacher
  d.teacher_ref = arg.teacher_ref
  # TV-OPD: "tv" is the method (c_k · sign Δ); the others are the Eq. 7 ablations.
  d.tv_variant = arg.tv_variant
  d.tv = ml_collections.ConfigDict(dict(alpha=0.5, beta=0.95, c_min=0.1, eps=1e-8))
  # OPD-then-RL: the last OPD step S, or "auto" (`losses.auto_switch_step`; our PROPOSAL).
  d.switch_step = arg.switch
  d.switch = ml_collections.ConfigDict(dict(window=3, delta=0.005, budget_fraction=0.4))
  # Teacher-derived terms are 0 at the final EOS (teacher / student EOS differ in the paper;
  # here they share a tokenizer, so off by default).
  d.mask_final_eos = False
  # TGOPD: K_T probe rollouts of the teacher per prompt, at this temperature (PROPOSAL 1.0).
  d.probes = 3
  d.probe_temperature = 1.0
  # OPRD (App. C): support "sampled ∪ student top-10", λ = 0.5, λ₋ ramp over K_warm updates.
  d.oprd_top_k = 10
  d.oprd_lambda = 0.5
  d.oprd_warmup_steps = 30
  # The method's settings, passed by name (joint: beta, alpha, lam, epsilon, ...; gated: tau,
  # grpo_std, threshold, norm_std, scale_baseline, ...). Empty: the papers' defaults.
  d.knobs = ml_collections.ConfigDict()
  return d


def get_config(arg=None):
  arg = parse_arg(arg, method="opd", tv_variant="tv", switch="auto", teacher="",
                  teacher_ref="", runlocal=False, model="small", steps=30)
  config = base_configs.grpo_base("grpo")
  config.task = "arith"
  config.task_knobs = dict(min_digits=1, max_digits=2, num_operands=2, operations="+-",
                          demo_slip=0.0)
  config.model, config.steps = arg.model, arg.steps
  config.distill = distill_config(arg)
  method = arg.method.strip().lower()
  if method == "opd_then_rl":
    # Eq. 1 of arXiv 2609.04108: (1/G) Σ_i (1/|y_i|) Σ_t.
    config.loss.loss_agg_mode = "seq-mean-token-mean"
  if method in ("oprd", "tgopd"):
    # OPRD (App. C) and TGOPD's fallback: group-centred advantages, no std normalisation.
    config.advantage = "drgrpo"
  if arg.runlocal:
    base_configs.shrink_grpo_for_runlocal(config)
    config.steps = 3 if arg.steps == 30 else arg.steps
    # 4 prompts × 4 rollouts: with a format-writer student some groups have reward variance.
    config.prompts_per_step = 4
    config.eval_every = 1
    config.checkpoint_every = 1
    config.eval_examples = 2
    config.eval_pass_k = 0
    config.distill.probes = 2
    config.distill.oprd_top_k = 4
    config.distill.oprd_warmup_steps = 2
    if arg.switch == "auto":
      config.distill.switch.window = 1  # 3 steps: the rule can act after one evaluation
  return config


def sweep(add, arg=None):
  del arg
  for method in METHODS:
    for seed in (0, 1, 2):
      add(**{"distill.method": method, "seed": seed})


def metrics():
  return ["eval/accuracy", "train/reward_correct", "distill/teacher_gap_mean",
          "distill/tv_coef", "distill/tv_estimate"]
