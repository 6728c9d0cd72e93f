r"""PCQA-R1 (arXiv 2608.18627) in miniature: ranking + Gaussian GRPO for point-cloud quality.

Train on one synthetic subjective study (`source`, default syn_a: MOS 1–5), evaluate PLCC / SRCC
on the test splits of all three (syn_a 1–5, syn_b 0–10, syn_c 0–100; different panels,
distortion mixes and shape classes: jaxrl_post/tasks/point_clouds.py). A run is one stage or
method (`method=<name>`, the config argument; jaxrl_post/methods/pcqa.py); per seed, the grid is

  base        the "base" format stage (from scratch); every other run starts from a run's workdir
  sft         base → SFT on templated rationales for the whole budget (cold_start + rl steps)
  rank        base → GRPO with the Thurstone fidelity reward only (α = 0)
  rank_gauss  base → GRPO with ranking + Gaussian proximity (α = 1)
  cold_start  base → cold-start SFT (cold_start_steps)
  full        cold_start → GRPO ranking + Gaussian (PCQA-R1)
  regression  base trunk + scalar head, MSE on the normalised MOS, same budget as sft

in this order (`sweep` below). scripts/pcqa_grid.py runs it — each run in its own process,
`<workdir>/seed_<s>/<method>/`, `--config.init_from` the run it starts from — then the table:

  python scripts/pcqa_grid.py --config=configs/pcqa_synthetic.py --workdir=/tmp/pcqa
  python scripts/pcqa_table.py --workdir=/tmp/pcqa --out=docs/pcqa

One run by hand (what the grid does):

  python experiments/pcqa.py --config=configs/pcqa_synthetic.py:method=base \
    --workdir=/tmp/pcqa/seed_0/base
  python experiments/pcqa.py --config=configs/pcqa_synthetic.py:method=rank \
    --workdir=/tmp/pcqa/seed_0/rank --config.init_from=/tmp/pcqa/seed_0/base

scripts/sweep.py cannot run this sweep: a run's start is another run's workdir, which it does
not name; its `start` entries are read by scripts/pcqa_grid.py.

Runtime at 7 GRPO epochs (`rl_epochs=7`, 175 steps; the default is now the paper's 14, which
doubles every GRPO, SFT and regression run) on the shared 2-core CPU machine, measured with the
one-process grid before the one-loop port, which compiled each kernel once for all runs:
53 min for 3 seeds, ≈ 18 min per seed — base
75 s, SFT 1 min, regression 0.5 min, each GRPO run 4.5–5 min (≈ 1.5 s per step of 16 prompts ×
4 rollouts; 4 evaluations of 480 greedy answers included); a run now also compiles its own
kernels (tens of seconds). Expected metrics (3 seeds, docs/results.md): the regression baseline
0.52 ± 0.21 in-domain / 0.49 ± 0.17 OOD-average SRCC; SFT 0.25 / 0.23; the three GRPO variants
collapse to one greedy score for every test cloud within 175 steps (correlation undefined,
counted 0) — the paper's ranking > regression result does NOT reproduce at this scale. From a
capable start (`capable=1000`, below) GRPO no longer collapses but gains nothing, and with
held-out RL prompts (`holdout=0.5`) it adds ≈ +0.03 OOD SRCC, less than SFT on the same clouds;
regression stays ahead (docs/results.md). On the non-monotone shift (`shift=non_monotone`)
at 14 epochs, seed 0's GRPO from base is constant again (≈ 20 min per seed); from the capable,
held-out start GRPO leaves OOD SRCC where it started (0.23 → 0.22) and regression stays ahead
(0.39; 3 seeds, 43 min). Killed and restarted, a run resumes from its last
checkpoint (every `checkpoint_every` steps); the grid skips runs with a `final.json`.

Variants (after the colon): `method=<name>` (the run; default base), `runlocal` (tiny budget,
1 seed, for tests), `source=<dataset>`, `seeds=<n>` and `methods=<a;b>` (';'-separated; the
sweep's), `rl_epochs=<n>` (GRPO epochs over its prompts; default 14, the paper's: 350 steps,
175 with `holdout=0.5`), `rl_steps=<n>` (> 0: GRPO steps, overrides the epochs),
`capable=<n>`, `rl_lr=<float>`, `holdout=<f>`,
`shift=<monotone|non_monotone>` (the targets: syn_b, syn_c, whose MOS is monotone in the
source's hidden quality; or syn_d, syn_e, with distortion types / shapes unseen in the source
and panels that are not monotone in it; jaxrl_post/tasks/point_clouds.py).

  python scripts/pcqa_grid.py --workdir=/tmp/pcqa_nm \
    "--config=configs/pcqa_synthetic.py:shift=non_monotone,methods=rank;rank_gauss;regression"

`capable=<n>` (default 0: the chain above) tests the paper's premise that RL only *re-ranks* a
backbone that already sees the views: per seed, a `capable` run after `base` (n SFT steps on the
templated rationales, the SFT optimizer with its warm-up + cosine over the n steps), and the LM
methods start from it: sft continues SFT for cold_start + rl steps, rank / rank_gauss run GRPO
from it, cold_start (then full) starts from it (the KL reference is the policy GRPO starts
from). The regression baseline keeps the base trunk and trains n + cold_start + rl steps: the
same total budget after base as capable + sft (not capable + regression, whose trunk would have
seen the rationale SFT the others get). Every run numbers its steps from 1.
`rl_lr=<float>` is the GRPO learning rate (default 3e-4; a capable policy wants less, e.g. 3e-5).
`holdout=<f>` (with `capable`): the capable run trains on the first 1 − f of the source train
split only and the LM methods after it (SFT, cold start, GRPO) on the held-out rest; base and
the regression baseline use the whole split.

  python scripts/pcqa_grid.py --config=configs/pcqa_synthetic.py:capable=1000,rl_lr=3e-5 \
    --workdir=/tmp/pcqa_cap

Runtime with `capable=n` (same machine): + ≈ 0.25 s per capable SFT step (≈ 4 min for
n = 1000, plus an evaluation every `eval_every` steps) and ≈ 0.08 s per extra regression step
per seed; the GRPO runs cost what they cost without it.
"""

import ml_collections

from jaxrl_post.config_args import parse_arg
from jaxrl_post.tasks import point_clouds
from jaxrl_post.training import base_configs

CONFIG_KIND = "pcqa"
# The grid's methods (a row of the table each) and every run's `method` (stages included).
METHOD_NAMES = ("sft", "rank", "rank_gauss", "full", "regression")
RUN_NAMES = ("base", "capable", "cold_start", *METHOD_NAMES)
# Which optimizer block a run trains with.
OPTIMIZERS = {"base": "sft_optimizer", "capable": "sft_optimizer", "cold_start": "sft_optimizer",
              "sft": "sft_optimizer", "rank": "rl_optimizer", "rank_gauss": "rl_optimizer",
              "full": "rl_optimizer", "regression": "regression_optimizer"}
_ARGS = dict(runlocal=False, method="base", source="syn_a", seeds=3,
             methods=";".join(METHOD_NAMES), rl_steps=0, rl_epochs=14, capable=0, rl_lr=3e-4,
             holdout=0.0, shift="monotone")



def _steps(c: ml_collections.ConfigDict, method: str):
  """`config.steps` of `method` as a reference to the step keys, so that overriding them
  (`--config.rl_steps=10`) moves it (methods/pcqa.py's `method_steps` checks it)."""
  ref = c.get_ref
  budget = ref("cold_start_steps") + ref("rl_steps")
  return {"base": ref("base_steps"), "capable": ref("capable_steps"),
          "cold_start": ref("cold_start_steps"), "sft": budget, "rank": ref("rl_steps"),
          "rank_gauss": ref("rl_steps"), "full": ref("rl_steps"),
          "regression": ref("capable_steps") + budget}[method]


def get_config(arg=None):
  arg = parse_arg(arg, **_ARGS)
  if arg.method not in RUN_NAMES:
    raise ValueError(f"unknown method {arg.method!r} in the config argument; valid: "
                     f"{', '.join(RUN_NAMES)}")
  c = base_configs.loop_config(seed=0)  # seed, init_from, resume, mesh, cadence defaults
  c.method = arg.method  # Every run but base has `init_from`: the workdir of the run it continues.
  c.source = arg.source
  # The dataset shift the targets make (jaxrl_post/tasks/point_clouds.py): "monotone" (syn_b,
  # syn_c: MOS a monotone function of the source's hidden quality, other scales / panels /
  # mixes) or "non_monotone" (syn_d, syn_e: distortion types and shapes unseen in the source,
  # panels whose MOS is not monotone in that quality).
  c.shift = arg.shift
  if c.shift not in point_clouds.DATASETS_BY_SHIFT:
    raise ValueError(f"unknown shift={c.shift!r} in the config argument; valid: "
                     f"{', '.join(point_clouds.DATASETS_BY_SHIFT)}")
  if c.shift == "non_monotone" and c.source != "syn_a":
    # syn_d / syn_e are "unseen" relative to syn_a's shapes and distortion types only.
    raise ValueError(f"shift=non_monotone needs source=syn_a (got source={c.source!r}): its "
                     "targets' shapes and distortion types are unseen relative to syn_a")
  c.datasets = ",".join(point_clouds.DATASETS_BY_SHIFT[c.shift])
  c.train_size = 0  # 0: the dataset's own size (400).
  c.test_size = 0  # 0: the dataset's own size (160).
  c.num_points = 512
  c.tokenizer = "char"
  c.model = "tiny"
  c.model_overrides = ml_collections.ConfigDict()
  c.encoder = ml_collections.ConfigDict(dict(grid=12, patch=4, width=64, depth=2))
  # "<pcqa_reasoning>cylinder, severe speckle, excellent.</pcqa_reasoning><answer>4.9</answer>"
  # is 89 characters; + EOS.
  c.completion_len = 96
  c.batch_size = 16  # Prompts per step in every stage (SFT rows, GRPO prompts, regression rows).
  c.base_steps = 300  # Format stage: random rationale words and scores.
  c.cold_start_steps = 25  # ≈ 1 epoch of the 400 source samples (the paper: 1 SFT epoch).
  # GRPO epochs over GRPO's prompts: the paper's 14 (1 SFT epoch + 14 GRPO epochs, a 15-epoch
  # budget); the results before issue 28 used 7 (175 steps over 400 clouds). rl_steps =
  # ceil(epochs · pool / batch_size), the pool being the source train split (400: 350 steps)
  # or, with capable + holdout, its held-out part that GRPO draws from (200: 175 steps).
  # `rl_steps=<n>` > 0 overrides the epochs. The SFT-only and regression runs get cold + rl.
  c.rl_epochs = arg.rl_epochs
  if c.rl_epochs <= 0 and arg.rl_steps <= 0:
    raise ValueError(f"rl_epochs={c.rl_epochs} must be > 0 (or set rl_steps=<n> > 0)")
  pool = c.train_size or point_clouds.DATASETS.get(c.source).sizes["train"]
  if arg.capable and arg.holdout:
    pool = int(round(arg.holdout * pool))  # as methods.pcqa.holdout_pools splits it
  c.rl_steps = arg.rl_steps if arg.rl_steps > 0 else -(-c.rl_epochs * pool // c.batch_size)
  # > 0: a "capable" SFT run of this many steps after base, the LM methods' start point
  # (module docstring); the regression baseline then trains capable + cold + rl steps from base.
  c.capable_steps = arg.capable
  if c.capable_steps < 0:
    raise ValueError(f"capable={c.capable_steps} must be >= 0")
  if arg.method == "capable" and not c.capable_steps:
    raise ValueError("method=capable needs capable=<n> > 0 steps")
  # With capable > 0: the share of the source train split kept away from the capable run and
  # given to the methods after it (their prompts are then clouds the start has not memorised).
  c.capable_holdout = arg.holdout
  if not 0.0 <= c.capable_holdout < 1.0:
    raise ValueError(f"holdout={c.capable_holdout} must be in [0, 1)")
  # Rollout temperature (the paper's: not given): at 1.0 the tiny character-level base policy
  # broke its own tags in 80 % of the rollouts; at 0.7 6 % are unparseable and the K scores of
  # a prompt still spread by ≈ 1 point (measured on the seed-0 base checkpoint).
  c.grpo = ml_collections.ConfigDict(dict(
    num_samples=4, epsilon=0.2, beta=0.04, kl_estimator="k3", temperature=0.7, gamma=1e-6,
    sigma=0.5, scale=1.0, gaussian_units="score", hold_fraction=0.2, final_weight=0.3,
    adv_eps=1e-6))
  # Warm-up then cosine decay to lr / 10 over each run's own length (decay_steps = 0): a
  # constant rate left the SFT policy oscillating (ID SRCC 0.52 → −0.36 in 25 steps).
  c.sft_optimizer = base_configs.optimizer_config(lr=2e-3, warmup_steps=10)
  c.rl_optimizer = base_configs.optimizer_config(lr=arg.rl_lr, warmup_steps=5)
  c.regression_optimizer = base_configs.optimizer_config(lr=1e-3, warmup_steps=10)
  c.eval_batch = 80
  c.eval_every = 50  # Steps between evaluations (learning curves); 0: only at the end.
  c.log_every = 5
  c.checkpoint_every = 50
  c.keep_checkpoints = 1
  c.max_nonfinite_streak = 5
  c.eval_at_start = False
  if arg.runlocal:
    c.train_size, c.test_size = 32, 16
    c.base_steps, c.cold_start_steps, c.rl_steps = 2, 1, 2
    for optimizer in (c.sft_optimizer, c.rl_optimizer, c.regression_optimizer):
      optimizer.warmup_steps = 1
    c.batch_size = 4
    c.eval_batch = 16
    c.eval_every = 1
    c.log_every = 1
    c.checkpoint_every = 1
  # The run's own keys for the loop: its length and optimizer. The stages inside another
  # method's chain (base, cold start) are evaluated at their end only.
  c.steps = _steps(c, arg.method)
  c.optimizer = c[OPTIMIZERS[arg.method]]
  if arg.method in ("base", "cold_start"):
    c.eval_every = 0
  return c


def sweep(add, arg=None):
  """The grid in order: per seed base, (capable,) then each method after the run it starts from.

  Each entry names `seed`, `method` (the config argument of its run) and `start`, the run of
  the same seed whose workdir is its `init_from` (none for base); scripts/pcqa_grid.py runs
  them.
  """
  arg = parse_arg(arg, **_ARGS)
  methods = arg.methods.split(";")
  unknown = set(methods) - set(METHOD_NAMES)
  if unknown:
    raise ValueError(f"unknown method(s) {sorted(unknown)} in methods=; valid: "
                     f"{', '.join(METHOD_NAMES)}")
  seeds = 1 if arg.runlocal else arg.seeds
  start = "capable" if arg.capable else "base"
  for seed in range(seeds):
    add(seed=seed, method="base")
    if arg.capable:
      add(seed=seed, method="capable", start="base")
    for method in methods:
      if method == "full":
        add(seed=seed, method="cold_start", start=start)
        add(seed=seed, method="full", start="cold_start")
      else:
        add(seed=seed, method=method, start="base" if method == "regression" else start)


def metrics():
  return ["eval/ood_avg/plcc", "eval/ood_avg/srcc", "eval/avg/plcc", "eval/avg/srcc"]
