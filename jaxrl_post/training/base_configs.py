"""Base `ConfigDict`s for the SFT and GRPO binaries; files in configs/ adjust them per task.

Keeping the defaults here means a new task's config states only what differs
(task, knobs, lengths), and every config has the same keys, so an override
that works for one works for all.
"""

from __future__ import annotations

import ml_collections

from jaxrl_post.parallel.mesh import mesh_config


def optimizer_config(*, lr: float, name: str = "adamw", warmup_steps: int = 0,
                     decay_steps: int = 0, weight_decay: float = 0.0, grad_clip: float = 1.0,
                     b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
                     momentum: float = 0.0,
                     moments_dtype: str = "float32", schedule: str = "cosine",
                     decay_fraction: float = 1.0, cautious_weight_decay: bool = False,
                     muon_beta: float = 0.95, muon_consistent_rms: float = 0.0,
                     lion_params: tuple[str, ...] = ("embed",),
                     head_params: tuple[str, ...] = ("lm_head",),
                     head_lr_scale: float = 1.0) -> ml_collections.ConfigDict:
  """The `config.optimizer` block `setup.build_optimizer` reads.

  `name` (`setup.OPTIMIZERS`; the update rules are in `training.optimizers`):
    "adamw" (`b1`, `b2`, `eps`, `weight_decay`); "sgd" (`momentum`);
    "lion" (`b1`, `b2`, `weight_decay`, `cautious_weight_decay`; arXiv 2302.06675);
    "muon" (`optax.contrib.muon`: `muon_beta`, `muon_consistent_rms` on ≥ 2-D weights,
    AdamW with `b1`, `b2`, `eps`, `weight_decay` on the rest);
    "muon_lion" (Falcon Perception-HD's split, arXiv 2608.18881: Muon on the ≥ 2-D hidden
    weights; Lion on 1-D parameters and on paths containing a `lion_params` substring (the
    embeddings); Lion at lr × `head_lr_scale` on paths containing a `head_params` substring).
  Every optimizer follows a linear warm-up over `warmup_steps`, then `schedule` ("cosine" or
  "linear") down to lr / 10 at `decay_fraction` of the decay horizon, constant after it.
  `decay_steps=0` makes the horizon the run's updates; a huge value keeps the rate constant.
  `cautious_weight_decay` decays only where the update already shrinks |θ| (arXiv 2510.12402).
  `muon_consistent_rms` r > 0 scales Muon's orthogonal update to RMS r (0: optax's
  √max(1, d_out/d_in)).
  `moments_dtype` is "float32" (the optimizer state — Adam's two moments,
  SGD's and Lion's momentum — and the update arithmetic in float32 whatever the
  parameter dtype: the usual recipe with bf16 parameters) or "params" (the
  state in the parameter dtype, optax's own behaviour; half the memory).
  """
  return ml_collections.ConfigDict(dict(
    name=name, lr=lr, warmup_steps=warmup_steps, decay_steps=decay_steps,
    weight_decay=weight_decay, grad_clip=grad_clip, b1=b1, b2=b2, eps=eps, momentum=momentum,
    moments_dtype=moments_dtype, schedule=schedule, decay_fraction=decay_fraction,
    cautious_weight_decay=cautious_weight_decay, muon_beta=muon_beta,
    muon_consistent_rms=muon_consistent_rms, lion_params=tuple(lion_params),
    head_params=tuple(head_params), head_lr_scale=head_lr_scale))


# `ModelConfig` fields that say how a model runs, not what it is; config keys of
# the same names (unset by default) override the preset or checkpoint.
MODEL_RUN_OPTIONS = {"scan_layers": bool, "remat_policy": str, "logit_chunk_size": int,
                     "attention_impl": str}


def precision_config(config: ml_collections.ConfigDict) -> None:
  """Adds the dtype and run-option keys `setup.build_model` reads (presets and HF loads alike).

  `param_dtype`: parameters as stored and updated; `dtype`: activations and
  matmuls (logits stay float32). Names: float32, bfloat16, float16. Real
  models: `--config.dtype=bfloat16` (bf16 compute), with `param_dtype`
  float32 or bfloat16 and `optimizer.moments_dtype=float32`.
  """
  config.param_dtype = "float32"
  config.dtype = "float32"
  # How the model runs (`ModelConfig` documents each); unset = the preset's (the
  # real presets scan, remat "full" and score in chunks of 128), for presets and
  # Hugging Face checkpoints alike: `--config.remat_policy=dots`.
  for key, kind in MODEL_RUN_OPTIONS.items():
    config[key] = ml_collections.config_dict.placeholder(kind)


def loop_config(seed: int = 0) -> ml_collections.ConfigDict:
  """The keys `training.loop.train` reads, with defaults; a method's config adds its own.

  `steps`, `optimizer`, `eval_every` and `checkpoint_every` have no default: each method's
  config sets them.
  """
  config = ml_collections.ConfigDict()
  config.seed = seed
  config.log_every = 10
  config.keep_checkpoints = 2
  config.resume = ""
  config.init_from = ""
  config.max_nonfinite_streak = 5
  config.eval_at_start = True
  # Compiled programs persist here across runs and restarts ('' = JAX's own setting);
  # `training.setup.enable_compilation_cache`.
  config.compilation_cache_dir = "~/.cache/jaxrl_post/jax_compilation_cache"
  # Devices and sharding rules, one override each (`--config.mesh.ici_tensor=2`,
  # `--config.mesh.sampler_devices=4`); by default every device is on `fsdp`.
  config.mesh = mesh_config()
  # Where metrics go besides metrics.jsonl (always written), comma-separated:
  # jsonl, tensorboard, wandb (`pip install wandb`; project `wandb_project`), clu
  # (`pip install clu`); `training.metrics`. `--config.metric_writers=jsonl,tensorboard,wandb`.
  config.metric_writers = "jsonl,tensorboard"
  config.wandb_project = "jaxrl_post"
  # Profiler trace of steps "first,last" into workdir/profile ('' = off), process 0 only
  # unless `profile_all_processes`; `training.profiling`. `--config.profile_steps=10,12`.
  config.profile_steps = ""
  config.profile_all_processes = False
  # Low-rank adapters (`models.lora`): rank 0 = off (full fine-tuning). With rank r > 0 only the
  # adapters train (scale alpha / r) on the `targets` projections; the base stays frozen and is
  # the reference model; checkpoints hold the adapters. For methods with `supports_lora`.
  # `--config.lora.rank=16 --config.lora.targets="('q_proj','v_proj')"`.
  config.lora = ml_collections.ConfigDict(dict(
    rank=0, alpha=16.0,
    targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")))
  return config


def _common(seed: int = 0) -> ml_collections.ConfigDict:
  config = loop_config(seed)
  # "char"; a Hugging Face tokenizer directory; a Hub repository "hf:<org>/<name>[@<revision>]";
  # or "init_from": the tokenizer files of the `init_from` checkpoint (`setup.build_tokenizer`).
  # `init_from` also takes "hf:<org>/<name>[@<revision>]" (fetched once into the Hub cache).
  config.tokenizer = "char"
  # Render each record's prompt with the tokenizer's chat template (`tasks.chat.ChatTask`): an
  # optional system turn, the task prompt as the user turn, then the assistant's header.
  config.chat_template = False
  config.system_prompt = ""  # "" = no system turn
  # Extra template variables, e.g. Qwen3's thinking switch (False: an empty <think> block).
  config.chat_template_kwargs = ml_collections.ConfigDict(dict(enable_thinking=False))
  config.model = "small"
  config.model_overrides = ml_collections.ConfigDict()
  precision_config(config)
  config.num_train_examples = 200_000
  # Logical data shards (tasks.data.ShardedLoader); 0 = one per process. The
  # data order depends on this number only, so fix it (e.g. to the largest
  # process count you will use) to compare or resume runs across process counts.
  config.data_shards = 0
  return config


def sft_base() -> ml_collections.ConfigDict:
  config = _common()
  config.prompt_len = 16
  config.completion_len = 72
  config.batch_size = 32
  config.num_micro_batches = 1
  config.steps = 400
  config.optimizer = optimizer_config(lr=3e-3, warmup_steps=50)
  config.eval_every = 100
  config.eval_examples = 128
  config.eval_max_new_tokens = 72
  config.eval_pass_k = 0
  config.checkpoint_every = 200
  # SFT usually starts from scratch: nothing to see at step 0.
  config.eval_at_start = False
  # > 0: stop early once a held-out evaluation reaches this greedy accuracy (methods/sft.py).
  config.stop_at_accuracy = 0.0
  # Prompt views (methods/sft_views.py): shares of rows shown with an instruction line (ICE)
  # or a golden negative to fix (ReflectRL), both learning the exact solution; 0: bare only.
  config.sft_views = ml_collections.ConfigDict(dict(
    hint_frac=0.0, hints=(), reflect_frac=0.0, reflect_slip="random",
    reflect_template="{prompt}A wrong solution:\n{negative}\nFind the error, then answer:\n"))
  return config


def grpo_base(loss: str = "grpo") -> ml_collections.ConfigDict:
  config = _common()
  config.prompt_len = 16
  # A dataset prompt longer than prompt_len: "error" at start-up, or "drop" it (methods.grpo).
  config.long_prompts = "error"
  config.max_new_tokens = 72
  # Score and update on completions cut to the step's longest, rounded up to a
  # multiple of this (0: the full `max_new_tokens`): a few compiled widths,
  # no padding work.
  config.trim_completions_to = 16
  config.prompts_per_step = 16
  config.group_size = 8
  config.temperature = 1.0
  config.top_k = 0
  config.top_p = 1.0
  config.steps = 30
  config.ppo_epochs = 1
  # Optimizer updates per epoch: the rollouts of a step are shuffled and split
  # into this many mini-batches (each of them then into `num_micro_batches`).
  config.ppo_mini_batches = 1
  # A verifier call that runs longer than this counts as a missing reward (in process) or a
  # wrong one (a task that verifies in the worker pool: MATH; `rewards.verifiers`).
  config.reward_timeout_s = 10.0
  # Worker processes of that pool (0: min(4, CPUs)); started only for such a task.
  config.reward_workers = 0
  config.num_micro_batches = 2
  # The frozen passes (old policy, reference) score the step's rollouts in this
  # many micro-batches, so their memory is one micro-batch's, not the step's.
  config.score_micro_batches = 1
  config.advantage = "grpo"
  config.advantage_eps = 1e-6
  # Rows weighted by their completion length in the advantage's batch statistics (estimators
  # that take `token_counts`: reinforce_pp / reinforce_pp_baseline, verl's token whitening).
  config.advantage_token_weighted = False
  config.reward_weights = dict(correct=1.0, format=0.1)
  # DAPO's overlong shaping, a reward column when reward_weights names "overlong": 0 up to
  # max_len − cache_len tokens, linear to −1 at max_len, −1 past it (rewards.overlong).
  # max_len 0 = max_new_tokens.
  config.overlong = dict(max_len=0, cache_len=0)
  # DAPO's dynamic sampling (methods.dynamic_sampling): regenerate until prompts_per_step groups
  # with unequal rewards are kept, at most max_rounds generation rounds a step (0 = off).
  config.dynamic_sampling = dict(max_rounds=0)
  # Where the step's groups are sampled (training.async_rollouts): "sync" (generate, then
  # update), "one_step_off" (step t+1's batch sampled with θ_{t−1} while step t updates) or
  # "async" (a producer keeps max_in_flight batches ahead); max_weight_staleness (unset: no
  # bound) drops or retries (`unused`) older batches; verify_sync compares the sampler's
  # weights with the trainer's after each sync; true_on_policy fails a step whose sampler
  # log-probs differ from the trainer's by more than true_on_policy_tol. Off-policy batches
  # want loss.sampler_correction="truncate" (TIS) or "mask" (IcePop), or old_logp="sampler"
  # (the ratio to the sampling policy itself, without the trainer's scoring pass);
  # old_logp="detached" skips that pass in a step of one update (ppo_epochs = ppo_mini_batches
  # = 1): the old policy is then the loss's own log-probs under stop_gradient.
  # num_slots > 0 decodes the step's rows by continuous batching through that many cache slots
  # (admit_size rows prefilled together; 0: num_slots // 8): generation time follows the
  # total of tokens, not rows × the longest; with an admission policy that has class caps
  # (misa, misa_t) the slots are shared between the workload classes by those caps.
  config.rollout = ml_collections.ConfigDict(dict(
    mode="sync", max_in_flight=1,
    max_weight_staleness=ml_collections.config_dict.placeholder(int), unused="drop",
    verify_sync=False, sync_bucket_mb=512.0, true_on_policy=False, true_on_policy_tol=0.0,
    old_logp="trainer", num_slots=0, admit_size=0))
  # sampler_correction: "none", or "truncate" (TIS) / "mask" (IcePop) of the ratio between the
  # policy that scored the batch and the sampler's recorded log-probs, per token or sequence
  # (`losses.sampler_importance_weights`): what an off-policy (asynchronous) batch wants.
  config.loss = ml_collections.ConfigDict(dict(
    name=loss, loss_agg_mode="token-mean", epsilon_low=0.2, epsilon_high=0.28, beta=0.0,
    kl_estimator="k3", sampler_correction="none", sampler_level="token",
    sampler_min=ml_collections.config_dict.placeholder(float), sampler_max=2.0))
  # 5e-4 collapsed the SFT arithmetic policy within 5 steps (reward 0.79 → 0.2); 5e-5
  # improved it (docs/results.md).
  config.optimizer = optimizer_config(lr=5e-5)
  config.eval_every = 10
  config.eval_examples = 128
  config.eval_pass_k = 4
  # pass@k reported for these k (each <= eval_pass_k, the samples per prompt; () = just that n).
  config.eval_pass_ks = ()
  # At most this many completions per sampler call in the evaluation (0: all at once); bounds
  # its KV cache when eval_examples × eval_pass_k is large.
  config.eval_rows_per_call = 0
  config.log_every = 1
  config.checkpoint_every = 10
  return config


def flow_stage(config: ml_collections.ConfigDict, *, pretrain: bool, steps: int,
               eval_every: int, checkpoint_every: int) -> None:
  """The schedule of a "pretrain, then GRPO" flow-policy config (configs/flow_grpo.py,
  configs/crystal_grpo.py): flow matching at 3e-3 with 50 warm-up steps, GRPO at a constant
  1e-3; one checkpoint kept, JSONL metrics every 10 steps."""
  config.steps = steps
  config.optimizer = optimizer_config(lr=3e-3 if pretrain else 1e-3,
                                      warmup_steps=50 if pretrain else 0)
  if not pretrain:
    config.optimizer.decay_steps = 10 ** 9  # a constant rate for GRPO
  config.log_every = 10
  config.eval_every = eval_every
  config.checkpoint_every = checkpoint_every
  config.keep_checkpoints = 1
  config.metric_writers = "jsonl"


def shrink_flow_for_runlocal(config: ml_collections.ConfigDict, *, pretrain: bool,
                             steps: int = 0) -> None:
  """A few steps of a small velocity MLP (`flow_stage` configs): what the tests run on CPU."""
  config.steps = steps or (3 if pretrain else 2)
  config.model.update(hidden=16, depth=2, time_dim=8)
  config.pretrain_batch = 32
  config.optimizer.warmup_steps = 0
  config.log_every = config.eval_every = config.checkpoint_every = 1
  config.compilation_cache_dir = ""


def shrink_sft_for_runlocal(config: ml_collections.ConfigDict) -> None:
  """A few steps of `tiny`: what the tests run on CPU."""
  config.model = "tiny"
  config.steps = 6
  config.batch_size = 8
  config.num_micro_batches = 2
  config.num_train_examples = 256
  config.eval_every = 3
  config.eval_examples = 4
  config.eval_max_new_tokens = 16
  config.checkpoint_every = 3
  config.log_every = 1
  config.optimizer.decay_steps = 8


def shrink_grpo_for_runlocal(config: ml_collections.ConfigDict) -> None:
  config.model = "tiny"
  config.steps = 4
  config.prompts_per_step = 2
  config.group_size = 4
  config.ppo_mini_batches = 2  # exercised by the tests: 8 rollouts → 2 updates of 2 × 2 rows
  config.max_new_tokens = 12
  config.num_train_examples = 64
  config.eval_every = 2
  config.eval_examples = 4
  config.eval_pass_k = 2
  config.checkpoint_every = 2
  config.optimizer.decay_steps = 8


def sft_stage(config: ml_collections.ConfigDict, *, completion_len: int, runlocal: bool,
              steps: int = 300, every: int = 100) -> None:
  """The SFT cold start of a grammar-constrained GRPO task config (configs/pertmind.py,
  configs/recoverfly.py): `steps` steps, evaluated and checkpointed every `every`, greedy
  evaluation over the whole `completion_len`; runlocal: 4 steps on 64 examples."""
  config.eval_max_new_tokens = completion_len
  config.steps, config.eval_every, config.checkpoint_every = steps, every, every
  if runlocal:
    config.num_train_examples = 64
    config.steps = 4
    config.eval_every = config.checkpoint_every = 2


def task_config(arg, *, task: str, task_knobs: dict, prompt_len: int,
                completion_len: int) -> ml_collections.ConfigDict:
  """GRPO config for `task` (or its SFT counterpart when `arg.sft`), shrunk by `arg.runlocal`.

  `arg` holds `sft`, `runlocal`, `model` and `loss` (see configs/grpo_countdown.py).
  """
  config = sft_base() if arg.sft else grpo_base(arg.loss)
  config.task = task
  config.task_knobs = dict(task_knobs)
  config.model = arg.model
  config.prompt_len = prompt_len
  if arg.sft:
    config.completion_len = completion_len
  else:
    config.max_new_tokens = completion_len
  if arg.runlocal:
    (shrink_sft_for_runlocal if arg.sft else shrink_grpo_for_runlocal)(config)
  return config
