"""A run's workdir, read back: its config, its policy at a checkpoint step, its tokenizer.

    run = load_run("/tmp/grpo_arith")              # the latest checkpoint
    run = load_run("/tmp/grpo_arith", step=200, mesh=mesh)   # parameters born sharded
    sampler = Sampler(run.model, run.tokenizer, max_prompt_len=run.config.prompt_len)

What evaluation (experiments/evaluate.py) and export (scripts/export_hf.py) start from. The
model is built exactly as the run built it (`training.setup.build_model` from where the run
first started: a preset, or the Hugging Face checkpoint of `config.init_from`), and then the
parameters of the checkpoint step replace its initial ones. Only the parameters are read, not
the optimizer state, so loading a run costs one model's memory. A run that is still training
can be read: orbax lists a step only once its save is complete.
"""

from __future__ import annotations

import json
import os
from typing import Any, NamedTuple

import jax
import ml_collections
from etils import epath
from flax import nnx
from jax.sharding import Mesh

from jaxrl_post.models import CausalLM
from jaxrl_post.models.lora import LoraParam, add_lora, merge_lora, without_lora
from jaxrl_post.parallel.axes import DEFAULT_RULES, Rules, state_shardings
from jaxrl_post.training import setup as run_setup
from jaxrl_post.training.checkpoint import Checkpointer, as_path
from jaxrl_post.training.metrics import CONFIG_FILE


class LoadedRun(NamedTuple):
  """A run's policy at one checkpoint step (`load_run`)."""

  workdir: epath.Path
  config: ml_collections.ConfigDict  # the run's config.json (unlocked: a copy to read)
  step: int  # the checkpoint step whose parameters `model` holds
  model: CausalLM
  tokenizer: Any


def read_config(workdir: str | os.PathLike) -> ml_collections.ConfigDict:
  """The config a run wrote to `workdir/config.json` at start-up, as a `ConfigDict`.

  Raises:
    FileNotFoundError: there is no config.json (not a run's `--workdir`, or a run that has
      not started yet).
  """
  path = as_path(workdir) / CONFIG_FILE
  if not path.is_file():
    raise FileNotFoundError(f"{path} not found: {workdir} is not the --workdir of a run (a "
                            f"run writes {CONFIG_FILE} there when it starts)")
  return ml_collections.ConfigDict(json.loads(path.read_text()))


def checkpoint_steps(workdir: str | os.PathLike) -> list[int]:
  """The steps with a complete checkpoint in `workdir/checkpoints`, ascending ([] when none)."""
  directory = run_setup.checkpoint_dir(str(workdir))
  if not directory.is_dir():
    return []
  return sorted(int(p.name) for p in directory.iterdir() if p.is_dir() and p.name.isdigit())


def resolve_step(workdir: str | os.PathLike, step: int | None = None) -> int:
  """`step` if `workdir` has a checkpoint of it, the latest one when `step` is None.

  Raises:
    FileNotFoundError: no checkpoint at all.
    ValueError: no checkpoint of `step`; the message lists the steps there are.
  """
  steps = checkpoint_steps(workdir)
  if not steps:
    raise FileNotFoundError(f"no checkpoint in {run_setup.checkpoint_dir(str(workdir))}: the "
                            "run has not saved one yet (config.checkpoint_every)")
  if step is None:
    return steps[-1]
  if int(step) not in steps:
    raise ValueError(f"step {step} has no checkpoint in "
                     f"{run_setup.checkpoint_dir(str(workdir))}; steps there: "
                     f"{', '.join(map(str, steps))}")
  return int(step)


def load_run(workdir: str | os.PathLike, *, step: int | None = None, mesh: Mesh | None = None,
             rules: Rules = DEFAULT_RULES, adapter: str | None = None) -> LoadedRun:
  """The run in `workdir` with the parameters of checkpoint `step` (default: the latest).

  Args:
    workdir: the run's `--workdir` (config.json + checkpoints/<step>/).
    step: a checkpoint step; None takes the latest.
    mesh, rules: with a mesh the parameters are born sharded by `rules` (the model as
      `setup.build_model` builds it on a mesh) and the checkpoint's arrays are read into
      those shardings, whatever mesh the run itself had.

  A LoRA run (`config.lora.rank` > 0) loads as one merged model with the base architecture:
  its base as the run built it, plus the checkpoint's adapters merged into the kernels. A
  multi-LoRA run (`methods.multi_lora`: one adapter per tenant) needs `adapter`, the tenant
  whose adapters are merged.

  Raises:
    FileNotFoundError: no config.json, or no checkpoint.
    ValueError: `step` has no checkpoint (the message lists those there are), the
      config no longer builds (naming its key), or `adapter` is missing for a multi-LoRA run,
      not one of its tenants, or given for another run (the message lists the tenants).
  """
  workdir = as_path(workdir)
  config = read_config(workdir)
  tenants = list((config.get("multi_lora") or {}).get("tenants") or {})
  if tenants and adapter not in tenants:
    raise ValueError(f"{workdir} is a multi-LoRA run: choose the adapter to merge with "
                     f"adapter= (--adapter); its tenants: {', '.join(tenants)}"
                     + (f" (got {adapter!r})" if adapter is not None else ""))
  if adapter is not None and not tenants:
    raise ValueError(f"adapter={adapter!r}: {workdir} is not a multi-LoRA run (no "
                     "config.multi_lora.tenants); leave adapter unset")
  step = resolve_step(workdir, step)
  tokenizer = run_setup.build_tokenizer(config)
  # The model as the run first built it: its architecture is the preset's, or that of the
  # Hugging Face checkpoint it was initialised from.
  first = run_setup.start_point(config, str(workdir), ignore_workdir=True)
  model = run_setup.build_model(config, tokenizer, first, mesh, rules)
  lora = config.get("lora") or {}
  if lora.get("rank", 0):
    model = _merged_lora_model(model, config, workdir, step, first, mesh, rules, adapter)
  else:
    nnx.update(model, _restore(run_setup.checkpoint_dir(str(workdir)), step,
                               nnx.state(model, nnx.Param)))
  return LoadedRun(workdir, config, step, model, tokenizer)


def _merged_lora_model(model, config, workdir, step, first, mesh, rules, adapter=None):
  """A LoRA run's policy as one merged model (the base graph, K ← K + s·a·b).

  The base is built as the run built it (`model`: a preset or `config.init_from`'s Hugging
  Face weights; for an `init_from` run directory, that checkpoint's full parameters, as
  `training.loop` restores them); adapters of `config.lora`'s rank and targets are attached
  and replaced by checkpoint `step`'s, then merged into the targeted kernels.
  """
  if first.kind == "init_from_checkpoint":
    nnx.update(model, _restore(first.path, first.step, nnx.state(model, nnx.Param)))
  # Initial adapter values do not matter (the checkpoint's replace them): only the shapes.
  lora = config.lora
  add_lora(model, rank=int(lora["rank"]), alpha=float(lora["alpha"]),
           targets=tuple(lora["targets"]), rngs=nnx.Rngs(0))
  adapters = nnx.state(model, LoraParam)
  if mesh is not None:
    adapters = jax.device_put(adapters, state_shardings(adapters, mesh, rules))
  directory = run_setup.checkpoint_dir(str(workdir))
  if adapter is None:
    nnx.update(model, _restore(directory, step, adapters))
  else:  # A multi-LoRA checkpoint: `params` is `{tenant: adapters}`; all restored, one kept.
    tenants = list(config.multi_lora.tenants)
    nnx.update(model, _restore(directory, step, {n: adapters for n in tenants})[adapter])
  merged = without_lora(model)
  nnx.update(merged, merge_lora(nnx.state(model)))
  return merged


def _restore(directory, step, like):
  checkpointer = Checkpointer(directory, async_save=False)
  try:
    return checkpointer.restore_params(step, like)
  finally:
    checkpointer.close()
