r"""Progressive LP → FFT → RFT for a recommender foundation model (arXiv 2608.06792), in miniature.

A simulated webtoon-like service (jaxrl_post/tasks/recommender_log.py): 3000 users with
20-item histories, 200 items, a logging policy with known propensities and a 6-level funnel
in which click appeal and depth are anti-correlated (corr −0.8), so deep levels are sparse and
ranking by the funnel is not ranking by clicks. A run is one phase (`phase=<name>`, the config
argument; jaxrl_post/methods/progressive_recsys.py); per seed, the grid is

  pretrain  the GRU foundation model, next-item prediction (from scratch)
  sft1      pretrain → 1-phase SFT, every module at lr              (lp + fft steps)
  lp        pretrain → linear probing: backbone frozen, new modules at lr
  fft       lp → full fine-tuning: backbone at 0.1·lr, new modules at lr
  rft       fft → GRPO with the frozen ordinal RM: reward / propensity heads frozen

(`sweep` below). scripts/progressive_recsys_grid.py runs it — `<workdir>/seed_<s>/<phase>/`,
each with `config.init_from` the run it starts from — and prints the table (RM-as-ranker is the
fft run's reward model ranking the items):

  python scripts/progressive_recsys_grid.py --workdir=/tmp/progressive_recsys

One run by hand:

  python experiments/progressive_recsys.py --config=configs/progressive_recsys.py:phase=pretrain \
    --workdir=/tmp/prs/seed_0/pretrain
  python experiments/progressive_recsys.py --config=configs/progressive_recsys.py:phase=lp \
    --workdir=/tmp/prs/seed_0/lp --config.init_from=/tmp/prs/seed_0/pretrain

Variants (after the colon): `phase=<name>` (default pretrain), `runlocal` (tiny world and
budget, for tests), `seeds=<n>` (the sweep's), `beta=<float>` (RFT's KL coefficient),
`rft_steps=<n>`, `logs=<n>` (the logged requests of the supervised phases; 0 = fresh logs
every step).

Runtime (shared 2-core CPU, idle): ≈ 4–7 s per run, 5–16 s with compilation; the 3-seed grid
≈ 2.5 min. Expected metrics (3 seeds, docs/results.md, progressive_recsys): Rank /
Funnel NDCG@10 — 1-phase SFT 0.834 / 0.402, LP→FFT 0.818 / 0.396, LP→FFT→RFT (β = 0.2) 0.687 /
0.432, (β = 1) 0.776 / 0.440, RM-as-ranker 0.596 / 0.442: RFT and the RM raise Funnel NDCG and
the deep-engagement rate, RFT lowers Rank NDCG (click appeal and depth are anti-correlated in
this world); LP→FFT > 1-phase does not reproduce with 2000 logged requests (it does on Rank NDCG
with `logs=500`).
"""

import ml_collections

from jaxrl_post.config_args import parse_arg
from jaxrl_post.training import base_configs
from jaxrl_post.training.phases import RECSYS_PHASES

PHASE_NAMES = ("pretrain", "sft1", "lp", "fft", "rft")
STARTS = {"pretrain": None, "sft1": "pretrain", "lp": "pretrain", "fft": "lp", "rft": "fft"}
_ARGS = dict(runlocal=False, phase="pretrain", seeds=3, beta=0.2, rft_steps=150, logs=2000)


def _steps(c: ml_collections.ConfigDict, phase: str):
  """`config.steps` of `phase` as a reference to the step keys (overrides move it)."""
  ref = c.get_ref
  return {"pretrain": ref("pretrain_steps"), "sft1": ref("lp_steps") + ref("fft_steps"),
          "lp": ref("lp_steps"), "fft": ref("fft_steps"), "rft": ref("rft_steps")}[phase]


def get_config(arg=None):
  arg = parse_arg(arg, **_ARGS)
  if arg.phase not in PHASE_NAMES:
    raise ValueError(f"unknown phase {arg.phase!r} in the config argument; valid: "
                     f"{', '.join(PHASE_NAMES)}")
  c = base_configs.loop_config(seed=0)
  c.phase = arg.phase
  # tasks.recommender_log.make_world keywords (the world is the same for every seed).
  c.world = ml_collections.ConfigDict(dict(
    seed=0, num_users=3000, num_eval_users=500, num_items=200, dim=8, history_len=20,
    history_temperature=0.5, depth_pop_corr=-0.8, click_scale=1.5, click_bias=-1.5,
    deep_scale=1.5, depth_weight=2.5, deep_thresholds=(0.5, 1.5, 2.5, 3.5), log_noise=1.0,
    log_temperature=1.0, slate=10))
  c.model = ml_collections.ConfigDict(dict(dim=32))
  c.batch_size = 64  # Requests per step (each a slate of world.slate logged impressions).
  # The supervised phases' logged data set: this many requests (slates) of training users,
  # drawn once per world (0: fresh logs every step). Pretraining and RFT read histories only.
  c.num_log_requests = arg.logs
  c.pretrain_steps = 400
  c.lp_steps = 100
  c.fft_steps = 200
  c.rft_steps = arg.rft_steps
  # Learning-rate multipliers of `optimizer.lr` per parameter group and phase (0 = frozen):
  # training/phases.py's RECSYS_PHASES, plus pretrain (the backbone alone).
  c.phases = ml_collections.ConfigDict(
    dict(pretrain=dict(backbone=1.0, heads=0.0, reward=0.0, propensity=0.0),
         **{k: dict(v) for k, v in RECSYS_PHASES.items()}))
  # SFT terms' weights and the IPS clip constant c (the paper's: not found; PROPOSAL).
  c.loss = ml_collections.ConfigDict(dict(policy=1.0, reward=1.0, propensity=1.0,
                                          ips_clip=50.0))
  # RFT (PROPOSAL: the paper gives top-32 candidates; τ, G, β, ε not found).
  c.rft = ml_collections.ConfigDict(dict(candidates=32, group_size=8, temperature=1.0,
                                         epsilon=0.2, beta=arg.beta, updates=2, adv_eps=1e-6))
  c.eval = ml_collections.ConfigDict(dict(ndcg_k=10, deep_top=5))
  lrs = {"pretrain": 3e-3, "sft1": 3e-3, "lp": 3e-3, "fft": 3e-3, "rft": 3e-4}
  c.optimizer = base_configs.optimizer_config(lr=lrs[arg.phase], warmup_steps=10)
  c.eval_every = 50
  c.log_every = 10
  c.checkpoint_every = 0  # the last step only
  c.keep_checkpoints = 1
  c.eval_at_start = False
  if arg.runlocal:
    c.world.update(dict(num_users=96, num_eval_users=32, num_items=44, history_len=6))
    c.model.dim = 16
    c.batch_size = 8
    c.num_log_requests = 16
    c.pretrain_steps, c.lp_steps, c.fft_steps, c.rft_steps = 2, 2, 2, 2
    c.rft.update(dict(candidates=8, group_size=4))
    c.optimizer.warmup_steps = 1
    c.eval_every, c.log_every, c.checkpoint_every = 1, 1, 1
  c.steps = _steps(c, arg.phase)
  return c


def sweep(add, arg=None):
  """Per seed: pretrain, then each phase after the run it starts from (`start`)."""
  arg = parse_arg(arg, **_ARGS)
  for seed in range(1 if arg.runlocal else arg.seeds):
    for phase in PHASE_NAMES:
      add(seed=seed, phase=phase, **({"start": STARTS[phase]} if STARTS[phase] else {}))


def metrics():
  return ["eval/rank_ndcg", "eval/funnel_ndcg", "eval/deep_rate", "eval/rm/rank_ndcg",
          "eval/rm/funnel_ndcg"]
