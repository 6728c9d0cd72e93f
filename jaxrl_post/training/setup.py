"""Construction helpers shared by the experiment binaries (config → objects).

Each function validates what it reads and fails before any compilation, with a
message naming the config key: a typo in a preset, task or loss name, or a
tokenizer whose vocabulary does not fit the model.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import jax
import optax
from flax import nnx
from jax.sharding import Mesh

from jaxrl_post import tokenizers
from jaxrl_post.models import CausalLM, get_model_config
from jaxrl_post.models.hf import load_hf
from jaxrl_post.parallel.axes import DEFAULT_RULES, Rules
from jaxrl_post.parallel.mesh import init_sharded
from jaxrl_post.tasks.base import get_task
from jaxrl_post.training.checkpoint import Checkpointer, StartPoint, resolve_start
from jaxrl_post.training.train_state import TrainState

log = logging.getLogger(__name__)


def build_task(config):
  try:
    return get_task(config.task, **dict(config.get("task_knobs", {})))
  except (KeyError, TypeError) as e:
    raise ValueError(f"config.task / config.task_knobs: {e}") from None


def build_tokenizer(config):
  try:
    return tokenizers.get_tokenizer(config.tokenizer)
  except (KeyError, ValueError) as e:
    raise ValueError(f"config.tokenizer={config.tokenizer!r}: {e}") from None


def build_model(config, tokenizer, start: StartPoint, mesh: Mesh | None = None,
                rules: Rules = DEFAULT_RULES) -> CausalLM:
  """The policy: a preset with the tokenizer's vocabulary, or HF weights for `init_from`.

  With a `mesh`, a preset's parameters are born sharded (`parallel.mesh.init_sharded`):
  no device ever holds the whole model, which is what lets a model larger than
  one chip (or one host, with several processes) start at all.
  """
  if start.kind == "init_from_hf":
    model = load_hf(start.path)
  else:
    overrides = dict(config.get("model_overrides", {}))
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


def build_optimizer(config, total_steps: int) -> optax.GradientTransformation:
  """AdamW or SGD with linear warm-up then cosine decay, after global-norm clipping.

  `config.optimizer` is a `base_configs.optimizer_config()` block.
  """
  opt = config.optimizer
  # An explicit decay horizon keeps the schedule of a run independent of where
  # it is stopped (a shorter `steps` then gives a prefix of the same run).
  total_steps = int(opt.get("decay_steps") or total_steps)
  warmup = min(int(opt.warmup_steps), max(total_steps - 1, 0))
  schedule = optax.warmup_cosine_decay_schedule(
    init_value=0.0 if warmup else opt.lr, peak_value=opt.lr, warmup_steps=warmup,
    decay_steps=max(total_steps, warmup + 1), end_value=opt.lr * 0.1)
  if opt.name == "adamw":
    update = optax.adamw(schedule, b1=opt.b1, b2=opt.b2, eps=opt.eps,
                         weight_decay=opt.weight_decay)
  elif opt.name == "sgd":
    if opt.weight_decay:
      raise ValueError("config.optimizer.weight_decay is AdamW's decoupled decay; set it to 0 "
                       "with name='sgd'")
    update = optax.sgd(schedule, momentum=opt.momentum or None)
  else:
    raise ValueError(f"config.optimizer.name={opt.name!r}: expected 'adamw' or 'sgd'")
  return optax.chain(optax.clip_by_global_norm(opt.grad_clip), update)


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


def checkpoint_dir(workdir: str) -> Path:
  return Path(workdir) / "checkpoints"


def start_point(config, workdir: str, *, ignore_workdir: bool = False) -> StartPoint:
  """The resume policy for this run; `ignore_workdir` gives where the run first started."""
  own = Path("/nonexistent") if ignore_workdir else checkpoint_dir(workdir)
  return resolve_start(own, resume=config.get("resume") or None,
                       init_from=config.get("init_from") or None)


def host_metrics(metrics) -> dict[str, float]:
  return {k: float(v) for k, v in jax.device_get(metrics).items()}


def build_run(config, workdir: str, mesh: Mesh | None = None, rules: Rules = DEFAULT_RULES):
  """`(task, tokenizer, start point, model)` of a run, all validated before compiling;
  the model's parameters are born sharded on `mesh` when one is given."""
  task = build_task(config)
  tokenizer = build_tokenizer(config)
  start = start_point(config, workdir)
  return task, tokenizer, start, build_model(config, tokenizer, start, mesh, rules)
