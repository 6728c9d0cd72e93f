r"""Multi-teacher on-policy distillation (Open-MOPD, arXiv 2608.19098) on a 2 : 2 : 1 task mixture.

The paper's three stages on synthetic tasks: arithmetic (≈ math: long worked answers),
countdown with two numbers (≈ code) and format following (≈ IF: replies of a few characters,
so it gets a tiny share of the gradient tokens, the imbalance the paper diagnoses). Model
`small` (3.2M parameters, character tokenizer). The whole pipeline (mixed SFT, one GRPO teacher
per domain, RouteRL / MixSFT references, the methods × 3 seeds, RouteOPD students, table and
plots) is one command; with the paper's four rows it took ≈ 90 min on 2 idle CPU cores
(JOBS=2), the two K = 4 controls add 6 runs of ≈ 6 min (docs/results.md has the measured table):

  JOBS=2 bash scripts/opd_reproduce.sh /tmp/mopd

Its stages, one by one (R=/tmp/mopd; the script's teachers run 30 GRPO steps):

  python experiments/sft.py --config=configs/opd_mix.py:sft --workdir=$R/sft        # 32 min
  python experiments/grpo.py --config=configs/grpo_arith.py --workdir=$R/teacher_arith \
      --config.init_from=$R/sft    # and grpo_countdown.py:numbers=2, grpo_format.py
  python experiments/opd.py --config=configs/opd_mix.py:root=$R,steps=0 --workdir=$R/route
  python experiments/opd.py --config=configs/opd_mix.py:root=$R,method=open_mopd,steps=30 \
      --workdir=$R/open_mopd/seed0 --config.seed=0 --config.eval_teachers=False

`steps=0` only runs the step-0 evaluations (route/<domain>/accuracy, route/total, and
eval/<domain>/accuracy, eval/total of the student = MixSFT).

`root=$R` points `init_from` at `$R/sft` and `teachers.<domain>` at `$R/teacher_<domain>`; set
them one by one with `--config.init_from=... --config.teachers.arith=...` instead. Every run
logs `eval/<domain>/accuracy`, `eval/total` (mean over domains, the paper's Total),
`eval/headroom_recovery` = (Total − Total(MixSFT)) / (Total(RouteRL) − Total(MixSFT)) and per
domain `domain/<d>/{token_share, budget_share, mean_abs_reward, weight, staleness_kl,
clip_frac}`.

Methods set `opd.{balance_shares, gap_alpha, refresh, inner_updates}` (see
jaxrl_post/methods/opd.py `METHODS`); any of them can be overridden. The paper's two matched
controls are methods of their own: `naive_k4` (naive M-OPD with K = 4 inner updates) and
`share_gap_k4` (token-share + gap-following with K = 4), both without refresh, so the K
updates reuse the rewards computed once at rollout time; with them Open-MOPD's row no longer
mixes the effect of refresh with 4× more optimizer updates.

Sampling DEVIATION from the paper: rollouts use top-p 1.0 (`config.top_p`), the paper 0.99
(with temperature 1.0 both). At 1.0 the rollouts are exact samples of the student π that the
reward and the PPO ratio (full-vocabulary log-softmax on the top-K ids) model; 0.99 samples from
a slightly truncated π. `--config.top_p=0.99` gives the paper's setting.

Variants (after the colon): `method=naive|token_share|gap|naive_k4|share_gap_k4|open_mopd`,
`root=<dir>`, `sft` (the mixed-SFT config for experiments/sft.py), `runlocal` (tiny model, a few
steps, for tests), `model=<preset>`, `steps=<n>`, `only=<domain>` (a RouteOPD student:
single-teacher OPD on that domain alone; RouteOPD's Total is the mean of the three students'
own-domain accuracies).

scripts/opd_reproduce.sh runs the whole pipeline (3 seeds, RouteOPD included) and
scripts/opd_table.py makes the table and plots of docs/results.md.
"""

import ml_collections
from ml_collections import config_dict

from jaxrl_post.config_args import parse_arg
from jaxrl_post.parallel.mesh import mesh_config
from jaxrl_post.tasks.mixture import DEFAULT_COMPONENTS
from jaxrl_post.training import base_configs

# Countdown with two numbers: with the default three, a 300-step single-task SFT of `small`
# stays at accuracy 0 (configs/grpo_countdown.py), so a countdown teacher would have no reward
# to learn from and the domain no headroom; with two it reaches 0.84 greedy.
COMPONENTS = {**DEFAULT_COMPONENTS,
              "countdown": {**DEFAULT_COMPONENTS["countdown"], "knobs": {"num_numbers": 2}}}
DOMAINS = tuple(sorted(COMPONENTS))
# In the order of the paper's ablation table (arXiv 2608.19098): K = 1 rows, then K = 4 rows.
METHOD_NAMES = ("naive", "token_share", "gap", "naive_k4", "share_gap_k4", "open_mopd")
# Prompts: countdown ≤ 90 characters, format ≤ 71, arithmetic ≤ 10. Answers: arithmetic
# demonstrations ≤ 67 characters, countdown ≤ 48, format ≤ 24 (+ EOS).
PROMPT_LEN = 96
COMPLETION_LEN = 72


def _mixture(config, only: str = "") -> None:
  """The 2 : 2 : 1 mixture, or (`only`) the single domain a RouteOPD student trains on."""
  if only and only not in COMPONENTS:
    raise ValueError(f"config arg only={only!r} is not a domain; valid: {', '.join(DOMAINS)}")
  config.task = "mixture"
  config.task_knobs = dict(components={only: COMPONENTS[only]} if only else COMPONENTS)
  config.prompt_len = PROMPT_LEN


def sft_config(arg) -> ml_collections.ConfigDict:
  config = base_configs.sft_base()
  _mixture(config)
  config.model = arg.model
  config.completion_len = COMPLETION_LEN
  config.eval_max_new_tokens = COMPLETION_LEN
  # Three domains to learn instead of one: more steps than configs/sft_arith.py's 400.
  config.steps = arg.steps if arg.steps >= 0 else 800
  if arg.runlocal:
    base_configs.shrink_sft_for_runlocal(config)
  return config


def get_config(arg=None):
  # steps=-1: the mode's default (steps=0 is meaningful: evaluations only).
  arg = parse_arg(arg, method="open_mopd", root="", sft=False, runlocal=False, model="small",
                  steps=-1, only="")
  if arg.sft:
    return sft_config(arg)
  if arg.method not in METHOD_NAMES:
    raise ValueError(f"unknown method {arg.method!r}; valid: {', '.join(METHOD_NAMES)}")
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.tokenizer = "char"
  c.model = arg.model
  c.model_overrides = ml_collections.ConfigDict()
  base_configs.precision_config(c)
  _mixture(c, arg.only)
  domains = (arg.only,) if arg.only else DOMAINS
  c.num_train_examples = 200_000

  # Student start (the mixed-SFT checkpoint) and one frozen teacher per domain.
  c.init_from = f"{arg.root}/sft" if arg.root else ""
  c.resume = ""
  c.teachers = ml_collections.ConfigDict(
    {d: f"{arg.root}/teacher_{d}" if arg.root else "" for d in domains})

  # Rollouts: exact 2 : 2 : 1 quotas per batch (16 / 16 / 8 of 40), one response per prompt.
  c.prompts_per_step = 40
  c.samples_per_prompt = 1
  c.max_new_tokens = COMPLETION_LEN
  c.temperature = 1.0
  # DEVIATION from the paper (top-p 0.99): sample from the full distribution the loss models.
  # docs/results.md's Open-MOPD tables were run at 1.0; `--config.top_p=0.99` is the paper's.
  c.top_p = 1.0
  c.topk = 16  # the student's top-K support per position (paper: 16)

  c.method = arg.method
  c.opd = ml_collections.ConfigDict()
  # None = the method's value (methods/opd.py METHODS); set to override one switch.
  c.opd.balance_shares = config_dict.placeholder(bool)
  c.opd.gap_alpha = config_dict.placeholder(float)
  c.opd.refresh = config_dict.placeholder(bool)
  c.opd.inner_updates = config_dict.placeholder(int)
  c.opd.target_shares = ml_collections.ConfigDict({d: 1.0 for d in domains})  # 1/3 each
  c.opd.gap_clip_min = 0.05
  c.opd.gap_clip_max = 20.0
  c.opd.gap_reference = "share_weighted"
  c.opd.epsilon_low = 0.2
  c.opd.epsilon_high = 0.28
  c.opd.dual_clip_c = 3.0
  c.opd.max_log_ratio = 20.0

  c.steps = arg.steps if arg.steps >= 0 else 50
  c.num_micro_batches = 1
  # The paper's schedule is constant; warmup-cosine with a far horizon is constant in practice.
  # 5e-5 is the GRPO learning rate of this model (docs/results.md), not tuned for OPD.
  c.optimizer = base_configs.optimizer_config(lr=5e-5, decay_steps=1_000_000_000)
  c.eval_every = 10
  c.eval_examples = 64  # per domain
  c.eval_teachers = True  # RouteRL reference at step 0 (each domain by its own teacher)
  c.reward_timeout_s = 10.0
  c.checkpoint_every = 10
  c.keep_checkpoints = 2
  c.log_every = 1
  c.max_nonfinite_streak = 5
  # Devices and sharding rules (`--config.mesh.ici_data=2`, ...), as base_configs._common: the
  # student and its teachers are sharded alike on the trainer's mesh.
  c.mesh = mesh_config()

  if arg.runlocal:
    c.model = "tiny"
    c.steps = arg.steps if arg.steps >= 0 else 4
    c.prompts_per_step = 8  # quotas 3 / 3 / 2
    c.num_micro_batches = 2  # with open_mopd's 4 inner updates: 4 × 2 rows, 1 row per micro
    c.max_new_tokens = 16
    c.topk = 8
    c.num_train_examples = 256
    c.eval_examples = 2
    c.eval_every = 2
    c.checkpoint_every = 2
  return c


def sweep(add, arg=None):
  del arg
  for method in METHOD_NAMES:
    for seed in (0, 1, 2):
      add(method=method, seed=seed)


def metrics():
  return ["eval/total", *(f"eval/{d}/accuracy" for d in DOMAINS), "eval/headroom_recovery",
          *(f"domain/{d}/token_share" for d in DOMAINS)]
