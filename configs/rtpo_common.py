"""The base `ConfigDict` of experiments/rtpo.py; configs/rtpo_<env>.py adjust it per environment.

Not a config itself: configs/rtpo_<env>.py load it from this folder (`load_common()` there).

One config serves five modes, chosen in the config argument (`method=...`), because their
defaults differ (group size, loss aggregation, optimizer):

  sft         teacher-forced cold start on the env's demonstrations, turn by turn under ψ
  flat_grpo   flattened-trajectory GRPO (G = 8 episodes per prompt, token-mean PPO-clip)
  turn_grpo   turn-level GRPO (same episodes and advantages, rows c_k | a_k)
  rtpo        RTPO (2 trunks per prompt, G = 3 ⇒ 2 siblings per boundary, Eq. 6 aggregation)
  ocsd        OCSD (arXiv 2608.04788): turn_grpo's defaults plus `ocsd.*` (configs/ocsd.py)

Every method has the same keys, so an override that works for one works for all.
"""

from __future__ import annotations

import ml_collections

from jaxrl_post.methods import ocsd as ocsd_lib
from jaxrl_post.methods.rtpo import METHODS, MODES, SFT
from jaxrl_post.parallel.mesh import mesh_config
from jaxrl_post.training import base_configs

# The default RL budget is this many generated tokens per turn of an optimal episode (K + 1),
# so a longer horizon gets a proportionally larger budget and every K sees about as many
# episodes' worth of sampling.
TOKENS_PER_TURN_BUDGET = 20_000


def base_config(arg) -> ml_collections.ConfigDict:
  """The config of `arg.method` at horizon `arg.horizon`; `arg.runlocal` shrinks it for tests.

  `arg` holds `method`, `horizon`, `runlocal`, `model`, `seed`, `steps` (0: the method's
  default) and `budget`, the generated-token budget of an RL run: −1 (default) for
  `TOKENS_PER_TURN_BUDGET` × (K + 1), 0 for none.
  """
  if arg.method not in MODES:
    raise ValueError(f"unknown method {arg.method!r}; valid: {', '.join(MODES)}")
  config = ml_collections.ConfigDict()
  config.method = arg.method
  config.seed = arg.seed
  config.tokenizer = "char_tools"
  config.model = arg.model
  config.model_overrides = ml_collections.ConfigDict()
  base_configs.precision_config(config)
  config.resume = ""
  config.init_from = ""
  config.keep_checkpoints = 2
  config.max_nonfinite_streak = 5
  # Devices and sharding rules (`--config.mesh.ici_fsdp=4`, `--config.mesh.sampler_devices=2`);
  # by default every device is on `fsdp`. Rollouts run on the sampler's mesh, updates on the
  # trainer's.
  config.mesh = mesh_config()

  # ---- environment, context ψ, lengths ----
  config.env = ""
  config.env_knobs = ml_collections.ConfigDict(dict(horizon=arg.horizon, spare_turns=1))
  # Rollouts see ψ(S_k): the prompt plus the newest turns that fit (arXiv 2608.18682, §2.3). The
  # flat view trains on the whole history instead, which is where its context mismatch comes from.
  config.context = ml_collections.ConfigDict(dict(name="truncate", max_tokens=128,
                                                  keep_prompt=True))
  config.add_bos = False
  config.max_context_len = 128  # context columns; longer contexts keep their end
  config.max_turn_tokens = 32  # per-turn generation budget
  config.flat_len = 512  # completion columns of the flat view (actions + observations)
  config.num_train_episodes = 100_000
  config.eval_split = "test"
  config.eval_episodes = 128
  config.eval_sampled = True  # also evaluate sampling at `temperature` (eval/sampled_success)
  # Static shapes of the sampler (empty: powers of two) and power-of-two training widths.
  config.sampler_batch_buckets = ()
  config.sampler_len_buckets = ()
  config.bucket_widths = True

  # ---- method ----
  config.prompts_per_step = 8
  config.group_size = 3 if arg.method == "rtpo" else 8
  config.trunks_per_prompt = 2
  config.advantage = "grpo"
  config.advantage_eps = 1e-6
  config.continuation = "on_policy"
  config.rho_min = 0.5
  config.rho_max = 2.0
  config.skip_zero_advantage = True
  config.temperature = 1.0
  config.top_k = 0
  config.top_p = 1.0
  # RTPO's Eq. 6 averages per sibling then per token; the GRPO baselines use this codebase's
  # GRPO default (token-mean). ε = 0.2 for all (the paper gives none).
  config.loss = ml_collections.ConfigDict(dict(
    name="rtpo" if arg.method == "rtpo" else "grpo",
    loss_agg_mode="seq-mean-token-mean" if arg.method == "rtpo" else "token-mean",
    epsilon_low=0.2, epsilon_high=0.2, beta=0.0, kl_estimator="k3"))
  # OCSD's dual-view re-scoring (method=ocsd; unused otherwise): ρ and β are the paper's, the
  # hindsight template, placeholder and terminal feedback are our PROPOSAL (methods/ocsd.py).
  config.ocsd = ml_collections.ConfigDict(dict(
    rho=0.2, beta=0.5, template=ocsd_lib.DEFAULT_TEMPLATE,
    placeholder=ocsd_lib.DEFAULT_PLACEHOLDER, terminal=ocsd_lib.DEFAULT_TERMINAL))
  config.ppo_epochs = 1
  config.ppo_mini_batches = 1
  config.num_micro_batches = 1

  # ---- optimisation, budget, logging ----
  if arg.method == SFT:
    config.steps = arg.steps or 800
    config.episodes_per_step = 8  # SFT rows per step: episodes × (K + 1) turns
    config.optimizer = base_configs.optimizer_config(lr=3e-3, warmup_steps=30)
    config.eval_every = 100
    config.checkpoint_every = 100
  else:
    config.steps = arg.steps or 200
    config.episodes_per_step = 8
    # A constant rate: the cosine horizon is far beyond any run, so RTPO's variable number of
    # updates per step does not move the schedule (and SFT checkpoints restore into the same
    # optimizer structure).
    # 1e-3 collapsed `tiny` on kv_lookup within one RTPO step (sampled success 0.83 → 0) and
    # flat GRPO within five; 1e-4 did not (the GRPO binary saw the same with `small`).
    config.optimizer = base_configs.optimizer_config(lr=1e-4, decay_steps=10**9)
    config.eval_every = 5
    config.checkpoint_every = 5
  # Stop once this many tokens were generated for training (0: no budget); the comparison
  # of methods runs at equal budgets.
  config.max_generated_tokens = (
    TOKENS_PER_TURN_BUDGET * (arg.horizon + 1) if arg.budget < 0 else arg.budget)
  config.log_every = 1

  if arg.runlocal:
    shrink_for_runlocal(config)
    config.max_generated_tokens = max(arg.budget, 0)
  return config


def shrink_for_runlocal(config: ml_collections.ConfigDict) -> None:
  """A few steps of `tiny` with fixed shapes: what the tests run on CPU."""
  config.model = "tiny"
  config.steps = 3 if config.method == SFT else 2
  config.prompts_per_step = 2
  config.episodes_per_step = 2
  if config.method != "rtpo":
    config.group_size = 4
  config.max_turn_tokens = 24
  config.max_context_len = 96
  config.context.max_tokens = 96
  config.flat_len = 192
  config.num_train_episodes = 64
  config.eval_episodes = 4
  config.eval_every = 2
  config.checkpoint_every = 1
  # One shape per kernel: compiling dominates a run this short.
  config.sampler_batch_buckets = (16,)
  config.sampler_len_buckets = (96,)
  config.bucket_widths = False
  # A few steps of SFT leave `tiny` without a single success, so every advantage is 0; training
  # on those boundaries anyway (with zero gradients) makes the smoke run exercise the updates.
  config.skip_zero_advantage = False


# RTPO's training settings (arXiv 2608.18682, appendix D/E), shared by its baselines there.
PAPER_BETA = 0.02  # "initial KL coefficient 0.02" (k3, verl's low_var_kl), to the starting policy
PAPER_TEMPERATURE = 0.9  # train sampling temperature
PAPER_MAX_LOG_RATIO = 10.0  # "log-prob clip range [−10, 10]" on log π_θ − log π_θold


def paper_settings(config: ml_collections.ConfigDict, paper: bool = True) -> None:
  """RTPO's β = 0.02, T = 0.9 and ±10 log-ratio clamp, for every method of the grid.

  The paper trains RTPO and its GRPO baselines with the same settings, so the comparison here
  uses them for all three (`paper=False`: this codebase's earlier defaults, β = 0, T = 1, no
  clamp, which the first kv_lookup grid in docs/results.md used). The KL reference is the
  policy RL starts from (the SFT cold start). With β > 0 a zero-advantage row still has a KL
  gradient, so skipping zero-advantage boundaries would change the update: skipping is off.
  Held-out sampled success is then measured at T = 0.9 too (`eval_sampled` samples at
  `temperature`).
  """
  if not paper or config.method == SFT:
    return
  config.loss.max_log_ratio = PAPER_MAX_LOG_RATIO
  config.temperature = PAPER_TEMPERATURE
  config.loss.beta = PAPER_BETA
  config.loss.kl_estimator = "k3"
  config.skip_zero_advantage = False


# The success-vs-horizon grid shared by configs/rtpo_*.py.
HORIZONS = (2, 4, 6, 8)
SEEDS = (0, 1, 2)


def horizon_sweep(add, arg=None):
  """The success-vs-horizon grid; each entry also needs `init_from` its (K, seed) SFT run."""
  del arg
  for horizon in HORIZONS:
    for seed in SEEDS:
      for method in METHODS:
        add(method=method, horizon=horizon, seed=seed)


def grid_metrics():
  return ["eval/success", "eval/sampled_success", "rollout/success", "budget/generated_tokens",
          "time/wall", "train/consistency_ratio", "rtpo/zero_adv_rate"]
