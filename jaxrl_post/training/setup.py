"""Construction helpers shared by the experiment binaries (config → objects).

Each function validates what it reads and fails before any compilation, with a
message naming the config key: a typo in a preset, task or loss name, or a
tokenizer whose vocabulary does not fit the model.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import optax
from etils import epath
from flax import nnx
from jax.sharding import Mesh

from jaxrl_post import hub, tokenizers
from jaxrl_post.models import CausalLM, get_model_config, subspace
from jaxrl_post.models.hf import load_hf
from jaxrl_post.parallel.axes import DEFAULT_RULES, Rules
from jaxrl_post.parallel.mesh import init_sharded
from jaxrl_post.rewards.math_answers import shared_pool
from jaxrl_post.rewards.verifiers import pooled_verifier
from jaxrl_post.tasks.base import get_task
from jaxrl_post.tasks.chat import ChatTask
from jaxrl_post.training import optimizers
from jaxrl_post.training.checkpoint import Checkpointer, StartPoint, as_path, resolve_start
from jaxrl_post.training.train_state import TrainState

log = logging.getLogger(__name__)


# Bounded so a machine that runs many sweeps does not fill its disk; the least recently used
# programs go first.
COMPILATION_CACHE_MAX_BYTES = 8 << 30


def enable_compilation_cache(path: str, max_bytes: int = COMPILATION_CACHE_MAX_BYTES) -> None:
  """Keeps compiled XLA programs in `path` across processes (JAX's persistent cache).

  A restarted, resumed or repeated run with the same shapes, model and mesh loads its
  programs from the cache instead of compiling them again (docs/benchmarks.md has the
  timings). The cache key covers the program, the compile options, the devices and the
  jax / jaxlib versions, so one directory can serve every run on a machine. Only programs
  whose compilation took ≥ `jax_persistent_cache_min_compile_time_secs` (1 s by default)
  are written.

  Args:
    path: the cache directory (`~` is expanded; created if missing). "" leaves JAX's own
      setting alone (e.g. `JAX_COMPILATION_CACHE_DIR`, or no cache).
    max_bytes: the cache's size bound; older entries are evicted past it.
  """
  if not path:
    return
  path = Path(path).expanduser()
  try:
    path.mkdir(parents=True, exist_ok=True)
  except OSError as e:
    raise ValueError(f"config.compilation_cache_dir={str(path)!r} cannot be created: {e}; "
                     "set another directory, or '' to run without the cache") from e
  jax.config.update("jax_compilation_cache_dir", str(path))
  jax.config.update("jax_compilation_cache_max_size", int(max_bytes))


def build_task(config, tokenizer=None):
  """`config.task` with `config.task_knobs`; with `config.chat_template` its prompts rendered
  by the tokenizer's chat template (`tasks.chat.ChatTask`, with `config.system_prompt` and
  `config.chat_template_kwargs`).

  `tokenizer` is the run's tokenizer; None builds it from `config.tokenizer` when the template
  needs it (callers that already have one pass it).

  Raises:
    ValueError: naming `config.task` / `config.task_knobs`, or `config.chat_template` and the
      tokenizer's directory when there is no template or it does not render.
  """
  try:
    task = get_task(config.task, **dict(config.get("task_knobs", {})))
  except (KeyError, TypeError) as e:
    raise ValueError(f"config.task / config.task_knobs: {e}") from None
  return chat_prompts(config, task, tokenizer)


def chat_prompts(config, task, tokenizer=None):
  """`task` with its prompts rendered by the chat template when `config.chat_template` is set
  (`build_task`'s wrapping, also for the tasks a run only evaluates on); else `task` itself."""
  if not config.get("chat_template", False):
    return task
  if tokenizer is None:
    tokenizer = build_tokenizer(config)
  kwargs = config.get("chat_template_kwargs") or {}
  kwargs = kwargs.to_dict() if hasattr(kwargs, "to_dict") else dict(kwargs)
  try:
    return ChatTask(task, tokenizer, system_prompt=config.get("system_prompt", ""),
                    template_kwargs=kwargs)
  except ValueError as e:
    raise ValueError(f"config.chat_template=True with config.tokenizer={config.tokenizer!r}: "
                     f"{e}") from None


# The `config.tokenizer` value that means "the tokenizer files of the `config.init_from`
# checkpoint" (a Hub repository or a Hugging Face directory), so a run names its model once.
TOKENIZER_OF_INIT_FROM = "init_from"


def build_tokenizer(config):
  """The tokenizer `config.tokenizer` names (see `tokenizers.get_tokenizer`), or for
  `TOKENIZER_OF_INIT_FROM` the one of the `config.init_from` checkpoint.

  Raises:
    ValueError / FileNotFoundError: naming `config.tokenizer` (and `config.init_from`), e.g. an
      `init_from` checkpoint without `tokenizer.json`, listing the files expected.
  """
  name = config.tokenizer
  try:
    if name == TOKENIZER_OF_INIT_FROM:
      return tokenizers.HFTokenizer.from_dir(init_from_tokenizer_dir(config))
    return tokenizers.get_tokenizer(name)
  except (KeyError, ValueError) as e:
    raise ValueError(f"config.tokenizer={name!r}: {e}") from None
  except FileNotFoundError as e:
    raise FileNotFoundError(f"config.tokenizer={name!r}: {e}") from None


def init_from_tokenizer_dir(config) -> Path:
  """The directory of `config.init_from`'s tokenizer files (a Hub spec is resolved first).

  Raises:
    ValueError: `config.init_from` is empty.
    FileNotFoundError: it cannot be resolved, or lacks `tokenizer.json` (naming the directory
      and the tokenizer files expected).
  """
  init_from = config.get("init_from") or ""
  if not init_from:
    raise ValueError(
      f"{TOKENIZER_OF_INIT_FROM!r} means the tokenizer of config.init_from, which is empty: set "
      "config.init_from to a Hugging Face checkpoint ('hf:<org>/<name>' or a directory) or "
      "config.tokenizer to 'char', a tokenizer directory or 'hf:<org>/<name>'")
  source = f"config.init_from={init_from!r}"
  try:
    path = hub.resolve_model_dir(init_from, weights=False)
  except (ValueError, FileNotFoundError) as e:
    raise type(e)(f"{source}: {e}") from None
  return hub.require_tokenizer_files(path, source=source)


# The dtype names `config.param_dtype` / `config.dtype` accept.
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
# `model_overrides` keys that also apply to Hugging Face loads (the checkpoint
# decides the architecture, not how it runs).
_HF_RUN_OPTIONS = ("attention_impl", "scan_layers", "remat_policy", "logit_chunk_size")


def config_dtype(config, key: str):
  """The dtype that `config.<key>` names ("float32" when the config has no such key).

  Raises:
    ValueError: naming the key and the valid names.
  """
  name = config.get(key, "float32")
  if name not in DTYPES:
    raise ValueError(f"config.{key}={name!r} is not a dtype name; valid: {', '.join(DTYPES)}")
  return DTYPES[name]


def build_model(config, tokenizer, start: StartPoint, mesh: Mesh | None = None,
                rules: Rules = DEFAULT_RULES) -> CausalLM:
  """The policy: a preset with the tokenizer's vocabulary, or HF weights for `init_from`.

  Parameters are in `config.param_dtype`, activations in `config.dtype` (both
  default float32), for presets and Hugging Face checkpoints alike. With a
  `mesh` the parameters are born sharded: a preset's through
  `parallel.mesh.init_sharded`, a checkpoint's through `load_hf(mesh=...)`,
  which reads per device only its shard's slices. No device ever holds the
  whole model, which is what lets a model larger than one chip (or one host,
  with several processes) start at all.
  """
  param_dtype, dtype = config_dtype(config, "param_dtype"), config_dtype(config, "dtype")
  overrides = dict(config.get("model_overrides", {}))
  for key in ("param_dtype", "dtype"):
    if key in overrides:
      raise ValueError(f"config.model_overrides.{key}: set config.{key} instead (it applies "
                       "to presets and Hugging Face checkpoints alike)")
  for key in _HF_RUN_OPTIONS:
    if config.get(key) is not None:
      if key in overrides:
        raise ValueError(f"config.{key} and config.model_overrides.{key} are both set; "
                         f"keep config.{key}")
      overrides[key] = config.get(key)
  if start.kind == "init_from_hf":
    options = {k: overrides[k] for k in _HF_RUN_OPTIONS if k in overrides}
    model = load_hf(start.path, dtype=param_dtype, compute_dtype=dtype, mesh=mesh, rules=rules,
                    **options)
  else:
    overrides.update(param_dtype=param_dtype, dtype=dtype)
    overrides.setdefault("vocab_size", tokenizer.vocab_size)
    try:
      model_config = get_model_config(config.model, **overrides)
    except KeyError as e:
      raise ValueError(f"config.model: {e}") from None
    make = lambda: CausalLM(model_config, rngs=nnx.Rngs(config.seed))  # noqa: E731
    model = make() if mesh is None else init_sharded(make, mesh, rules)
  if tokenizer.vocab_size > model.config.vocab_size:
    raise ValueError(
      f"tokenizer {config.tokenizer!r} has {tokenizer.vocab_size} tokens but the model's "
      f"vocab_size is {model.config.vocab_size}")
  return model


# `config.optimizer.name` values.
OPTIMIZERS = ("adamw", "sgd", "lion", "muon", "muon_lion")


def build_optimizer(config, total_steps: int) -> optax.GradientTransformation:
  """The optimizer of `config.optimizer`, with warm-up then decay, after global-norm clipping.

  `config.optimizer` is a `base_configs.optimizer_config()` block; `name` is one of
  `OPTIMIZERS` (AdamW, SGD, Lion, Muon, or the Muon + Lion split of arXiv 2608.18881:
  `training.optimizers`), the schedule `optimizers.schedule_fn`. With
  `moments_dtype="float32"` (default) the whole chain runs in float32
  (`with_float32_state`), so bf16 parameters get float32 moments.
  """
  opt = config.optimizer
  # An explicit decay horizon keeps the schedule of a run independent of where
  # it is stopped (a shorter `steps` then gives a prefix of the same run).
  total_steps = int(opt.get("decay_steps") or total_steps)
  schedule = optimizers.schedule_fn(opt, total_steps)
  if opt.name not in OPTIMIZERS:
    raise ValueError(f"config.optimizer.name={opt.name!r}: expected one of "
                     f"{', '.join(repr(n) for n in OPTIMIZERS)}")
  if opt.get("cautious_weight_decay") and opt.name in ("adamw", "sgd"):
    raise ValueError(f"config.optimizer.cautious_weight_decay is for 'lion' and 'muon_lion', "
                     f"not name={opt.name!r}")
  if opt.name == "adamw":
    update = optax.adamw(schedule, b1=opt.b1, b2=opt.b2, eps=opt.eps,
                         weight_decay=opt.weight_decay)
  elif opt.name == "sgd":
    if opt.weight_decay:
      raise ValueError("config.optimizer.weight_decay is AdamW's decoupled decay; set it to 0 "
                       "with name='sgd'")
    update = optax.sgd(schedule, momentum=opt.momentum or None)
  elif opt.name == "lion":
    update = optimizers.lion(schedule, opt)
  elif opt.name == "muon":
    update = optimizers.muon(schedule, opt)
  else:
    update = optimizers.muon_lion(schedule, opt)
  stages = [optax.clip_by_global_norm(opt.grad_clip), update]
  constraint = getattr(config, "update_constraint", None)  # absent: a plain optimizer
  if constraint is not None and constraint.name != "none":
    stages.append(update_constraint(constraint))
  chain = optax.chain(*stages)
  moments = opt.get("moments_dtype", "float32")
  if moments == "float32":
    return with_float32_state(chain)
  if moments == "params":
    return chain
  raise ValueError(f"config.optimizer.moments_dtype={moments!r}: expected 'float32' or 'params'")


UPDATE_CONSTRAINTS = ("none", "gcpo")


def update_constraint(knobs) -> optax.GradientTransformation:
  """`config.update_constraint` as the optimizer's last stage: "gcpo" restricts every update of
  the targeted kernels to the complement of their starting principal subspaces
  (`models.subspace.gcpo_projection`, arXiv 2608.11674)."""
  if knobs.name not in UPDATE_CONSTRAINTS:
    raise ValueError(f"config.update_constraint.name={knobs.name!r}; valid: "
                     f"{', '.join(UPDATE_CONSTRAINTS)}")
  if knobs.mode not in subspace.SUBSPACE_CONSTRAINTS:
    raise ValueError(f"config.update_constraint.mode={knobs.mode!r}; valid: "
                     f"{', '.join(subspace.SUBSPACE_CONSTRAINTS.names())}")
  if knobs.k < 1:
    raise ValueError(f"config.update_constraint.k must be >= 1, got {knobs.k}")
  return subspace.gcpo_projection(k=knobs.k, targets=tuple(knobs.targets), mode=knobs.mode)


def with_float32_state(inner: optax.GradientTransformation) -> optax.GradientTransformation:
  """`inner` computed in float32 whatever the parameter dtype.

  Gradients and parameters are upcast before `inner` sees them, so its state
  (Adam's mu and nu, SGD's momentum) is created and updated in float32, and
  so are the global norm of clipping and the decoupled weight decay; the
  updates are cast back to each gradient's dtype. With float32 parameters
  this is `inner` unchanged. (`optax.adamw(mu_dtype=...)` covers only mu: nu
  follows the gradients, and in bfloat16 `b2 = 0.999` rounds to 1, so nu
  would stop averaging.)
  """
  def up(tree):
    return jax.tree.map(
      lambda x: x.astype(jnp.float32) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)

  def update(updates, state, params=None):
    new, state = inner.update(up(updates), state, None if params is None else up(params))
    return jax.tree.map(lambda u, g: u.astype(g.dtype), new, updates), state

  return optax.GradientTransformation(lambda params: inner.init(up(params)), update)


def restore(start: StartPoint, checkpointer: Checkpointer, state: TrainState
            ) -> tuple[TrainState, dict[str, Any]]:
  """Applies the resume policy to a freshly initialised `state`.

  "workdir" / "resume": the full state and the extra JSON (data iterator,
  method state). "init_from_checkpoint": parameters only. "init_from_hf" was
  handled when the model was built. "scratch": unchanged.
  """
  if start.kind in ("workdir", "resume"):
    source = checkpointer if start.kind == "workdir" else Checkpointer(start.path)
    restored, extra = source.restore(start.step, state)
    log.info("restored step %d from %s", start.step, start.path)
    return restored, extra
  if start.kind == "init_from_checkpoint":
    params = Checkpointer(start.path).restore_params(start.step, state.params)
    log.info("initialised parameters from %s step %d", start.path, start.step)
    return state.replace(params=params), {}
  return state, {}


def restore_method_arrays(start: StartPoint, checkpointer: Checkpointer, like):
  """A resumed method's `array_state()` ("workdir" / "resume" starts), in `like`'s structure;
  None for other starts or a checkpoint that saved none."""
  if start.kind not in ("workdir", "resume"):
    return None
  source = checkpointer if start.kind == "workdir" else Checkpointer(start.path)
  return source.restore_arrays(start.step, like)


def restore_method_sharded(start: StartPoint, checkpointer: Checkpointer, like):
  """A resumed method's `sharded_state()` ("workdir" / "resume" starts) in `like`'s structure
  and shardings; None for other starts or a checkpoint that saved none."""
  if start.kind not in ("workdir", "resume"):
    return None
  source = checkpointer if start.kind == "workdir" else Checkpointer(start.path)
  return source.restore_sharded(start.step, like)


# Where a run keeps its orbax checkpoints, under its workdir.
CHECKPOINT_DIR = "checkpoints"


def checkpoint_dir(workdir: str | os.PathLike) -> epath.Path:
  """`workdir/checkpoints` as an `epath.Path`: a `gs://` workdir keeps its scheme
  (`pathlib.Path("gs://b/run")` would read as the local "gs:/b/run")."""
  return as_path(workdir) / CHECKPOINT_DIR


def start_point(config, workdir: str | os.PathLike, *,
                ignore_workdir: bool = False) -> StartPoint:
  """The resume policy for this run; `ignore_workdir` gives where the run first started.

  A Hub `config.init_from` ("hf:<org>/<name>[@<revision>]") is resolved to its snapshot in the
  Hub cache first (`hub.resolve_model_dir`: downloaded once, then read from the cache, so a
  resumed run needs no network and gets the same weights).
  """
  own = epath.Path("/nonexistent") if ignore_workdir else checkpoint_dir(workdir)
  init_from = config.get("init_from") or None
  if init_from is not None and hub.is_hub_spec(init_from):
    try:
      init_from = str(hub.resolve_model_dir(init_from))
    except (ValueError, FileNotFoundError) as e:
      raise type(e)(f"config.init_from={config.init_from!r}: {e}") from None
  return resolve_start(own, resume=config.get("resume") or None, init_from=init_from)


# The keys that make a run what it is, saved with every checkpoint: resuming a workdir's
# checkpoint under other values would continue another trajectory under this run's name (e.g.
# a grid rerun into a workdir that a stale process of an earlier grid had written, or an SFT
# stage of another config whose workdir held this one's student: it resumed the student on
# another task's data and wrote over it).
RUN_IDENTITY_KEYS = ("init_from", "model", "seed", "task")


def run_identity(config) -> dict[str, str]:
  """`RUN_IDENTITY_KEYS` of `config` as strings (unset: ""), for a checkpoint's extra JSON."""
  values = {key: config.get(key) for key in RUN_IDENTITY_KEYS}
  return {key: "" if value is None else str(value) for key, value in values.items()}


def check_resume_identity(config, workdir: str | os.PathLike,
                          saved: Mapping[str, str] | None) -> None:
  """Raises if a run resuming its own workdir has other `RUN_IDENTITY_KEYS` than the run that
  wrote the checkpoint (`saved`: its `run_identity`; None for checkpoints older than the check).

  Other keys may change on resume (`steps`, evaluation and logging cadence, ...).

  Raises:
    ValueError: naming each `config.<key>`, both values, and what to do.
  """
  if not saved:
    return
  ours = run_identity(config)
  changed = [f"config.{key}={ours[key]!r} (the checkpoint's run: {saved[key]!r})"
             for key in RUN_IDENTITY_KEYS if key in saved and saved[key] != ours[key]]
  if changed:
    raise ValueError(f"{workdir} holds checkpoints of another run: {'; '.join(changed)}. Resume "
                     "with the same values, or give this run a new --workdir")


def host_metrics(metrics) -> dict[str, float]:
  return {k: float(v) for k, v in jax.device_get(metrics).items()}


def build_run(config, workdir: str, mesh: Mesh | None = None, rules: Rules = DEFAULT_RULES):
  """`(task, tokenizer, start point, model)` of a run, all validated before compiling;
  the model's parameters are born sharded on `mesh` when one is given.

  The model is built from where the run *first* started (`start_point(ignore_workdir=True)`),
  also when it resumes from its own workdir: a run initialised from Hugging Face weights must
  hand the loop those weights as its starting policy (what `Method.start` copies into frozen
  references), not a random initialisation that the workdir's checkpoint then overwrites.
  The returned start point is the one the run resumes from.
  """
  tokenizer = build_tokenizer(config)
  task = build_task(config, tokenizer)
  if pooled_verifier(task) is not None:  # Start the verifier workers now, at their set size.
    shared_pool(config.get("reward_workers") or None)
  start = start_point(config, workdir)
  first = start_point(config, workdir, ignore_workdir=True)
  return task, tokenizer, start, build_model(config, tokenizer, first, mesh, rules)
