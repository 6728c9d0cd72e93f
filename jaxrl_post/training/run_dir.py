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

import ml_collections
from etils import epath
from flax import nnx
from jax.sharding import Mesh

from jaxrl_post.models import CausalLM
from jaxrl_post.parallel.axes import DEFAULT_RULES, Rules
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
             rules: Rules = DEFAULT_RULES) -> LoadedRun:
  """The run in `workdir` with the parameters of checkpoint `step` (default: the latest).

  Args:
    workdir: the run's `--workdir` (config.json + checkpoints/<step>/).
    step: a checkpoint step; None takes the latest.
    mesh, rules: with a mesh the parameters are born sharded by `rules` (the model as
      `setup.build_model` builds it on a mesh) and the checkpoint's arrays are read into
      those shardings, whatever mesh the run itself had.

  Raises:
    FileNotFoundError: no config.json, or no checkpoint.
    ValueError: `step` has no checkpoint (the message lists those there are), or the
      config no longer builds (naming its key).
  """
  workdir = as_path(workdir)
  config = read_config(workdir)
  step = resolve_step(workdir, step)
  tokenizer = run_setup.build_tokenizer(config)
  # The model as the run first built it: its architecture is the preset's, or that of the
  # Hugging Face checkpoint it was initialised from.
  first = run_setup.start_point(config, str(workdir), ignore_workdir=True)
  model = run_setup.build_model(config, tokenizer, first, mesh, rules)
  checkpointer = Checkpointer(run_setup.checkpoint_dir(str(workdir)), async_save=False)
  try:
    params = checkpointer.restore_params(step, nnx.state(model, nnx.Param))
  finally:
    checkpointer.close()
  nnx.update(model, params)
  return LoadedRun(workdir, config, step, model, tokenizer)
