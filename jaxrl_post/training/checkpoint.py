"""Orbax checkpoints with one resume policy (workdir, then resume, then init_from, then scratch).

  ckpt = Checkpointer(workdir / "checkpoints", max_to_keep=3)
  ckpt.save(step, {"params": ..., "opt_state": ..., "rng": ...}, extra={"data": it_state},
            arrays={"replay": {...}})                # arrays: optional, host numpy
  state, extra = ckpt.restore(step, abstract_state)
  arrays = ckpt.restore_arrays(step, like)           # None when that step saved none

Where a run starts (`resolve_start`), first match wins:
  1. the latest checkpoint in this run's own workdir (pre-emption, restarts);
  2. `config.resume`: a checkpoint directory of another run (full state);
  3. `config.init_from`: parameters only — an SFT checkpoint directory or a
     Hugging Face checkpoint directory;
  4. from scratch.

Orbax writes each step into a temporary directory and renames it when the
save is complete, so a checkpoint interrupted mid-write (a kill during an
async save) is never listed as the latest one.

Paths are `etils.epath.Path`s (`as_path`): a workdir may be local or any URI epath knows
(`gs://bucket/run` on a pod; epath needs `gcsfs` or TensorFlow for it), and orbax reads and
writes either natively (its arrays through TensorStore's own GCS driver).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath


def is_local(path: str | os.PathLike) -> bool:
  """Whether `path` is on this machine's file system (not `gs://…`, `s3://…`, …)."""
  return "://" not in os.fspath(path)


def as_path(path: str | os.PathLike) -> epath.Path:
  """`path` as an `epath.Path`: a URI (`gs://bucket/run`) as is, a local path made absolute.

  Absolute because orbax wants absolute directories, and a relative workdir would otherwise
  move with the working directory. (`epath.Path("gs://b").absolute()` would prefix the
  working directory, hence the two cases.)
  """
  path = epath.Path(path)
  return path.absolute() if is_local(path) else path


class Checkpointer:
  """A keep-N, optionally asynchronous orbax `CheckpointManager` for one pytree + JSON.

  A third, optional item holds a method's own arrays (`arrays`: replay buffers, calibrators,
  bandit statistics, sampling priors): host numpy pytrees too large or too exact for JSON. A
  fourth (`sharded`) holds a method's own device arrays, saved and restored sharded like the
  state (a second model's `TrainState`: PPO's critic).
  """

  def __init__(self, directory: str | os.PathLike, *, max_to_keep: int = 3,
               async_save: bool = True):
    self.directory = as_path(directory)
    options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep,
                                           enable_async_checkpointing=async_save, create=True)
    self._manager = ocp.CheckpointManager(self.directory, options=options,
                                          item_names=("state", "extra", "arrays", "sharded"))

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def save(self, step: int, state: Any, extra: dict[str, Any] | None = None, *,
           arrays: Any = None, sharded: Any = None, force: bool = True) -> bool:
    """Saves `state` (a pytree of arrays), `extra` (JSON-serialisable) and, when given and not
    empty, `arrays` (a pytree of numpy arrays, the same on every process) and `sharded` (a
    pytree of global jax arrays, each process writing its shards) at `step`."""
    items = {"state": ocp.args.StandardSave(state), "extra": ocp.args.JsonSave(extra or {})}
    if arrays is not None and jax.tree.leaves(arrays):
      items["arrays"] = ocp.args.PyTreeSave(arrays)
    if sharded is not None and jax.tree.leaves(sharded):
      items["sharded"] = ocp.args.StandardSave(sharded)
    return self._manager.save(int(step), args=ocp.args.Composite(**items), force=force)

  def restore(self, step: int | None, abstract_state: Any) -> tuple[Any, dict[str, Any]]:
    """Restores `step` (default latest) into the structure / shardings of `abstract_state`.

    `abstract_state` is a pytree of `jax.ShapeDtypeStruct` (with `.sharding`)
    or arrays, e.g. from `jax.eval_shape`; restored arrays take its shardings.
    """
    step = self.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"no checkpoint in {self.directory}")
    abstract_state = jax.tree.map(ocp.utils.to_shape_dtype_struct, abstract_state)
    restored = self._manager.restore(
      step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state),
                                    extra=ocp.args.JsonRestore()))
    return restored.state, dict(restored.extra or {})

  def restore_arrays(self, step: int | None, like: Any) -> Any:
    """The `arrays` item of `step` (default latest) as numpy, in the structure of `like`.

    Returns None when that step saved no arrays (a checkpoint from before the method kept
    any). Raises ValueError naming the mismatch when the saved arrays' shapes differ from
    `like`'s (a config that changed a buffer's capacity between runs, say).
    """
    step = self.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"no checkpoint in {self.directory}")
    if not (self.directory / str(step) / "arrays").is_dir() or not jax.tree.leaves(like):
      return None
    item = jax.tree.map(lambda x: np.zeros(np.shape(x), np.asarray(x).dtype), like)
    restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), item)
    restored = self._manager.restore(step, args=ocp.args.Composite(
      arrays=ocp.args.PyTreeRestore(item, restore_args=restore_args))).arrays
    for (path, got), want in zip(jax.tree_util.tree_flatten_with_path(restored)[0],
                                 jax.tree.leaves(item)):
      if np.shape(got) != want.shape:
        raise ValueError(f"checkpoint step {step}: method array {jax.tree_util.keystr(path)} "
                         f"has shape {np.shape(got)}; the method now expects {want.shape}")
    return jax.tree.map(np.asarray, restored)

  def restore_sharded(self, step: int | None, like: Any) -> Any:
    """The `sharded` item of `step` (default latest) in the structure and shardings of `like`
    (arrays or `jax.ShapeDtypeStruct`s); None when that step saved none."""
    step = self.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"no checkpoint in {self.directory}")
    if not (self.directory / str(step) / "sharded").is_dir() or not jax.tree.leaves(like):
      return None
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
    return self._manager.restore(step, args=ocp.args.Composite(
      sharded=ocp.args.StandardRestore(abstract))).sharded

  def restore_params(self, step: int | None, params: Any) -> Any:
    """Restores only the `params` field of a saved train state, into `params`' structure.

    What `init_from` needs: the optimizer state on disk (of another run, maybe
    another optimizer) is neither read nor required to match.
    """
    step = self.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"no checkpoint in {self.directory}")
    item = {"params": jax.tree.map(ocp.utils.to_shape_dtype_struct, params)}
    restored = self._manager.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
      item, restore_args=ocp.checkpoint_utils.construct_restore_args(item),
      partial_restore=True)))
    leaves = jax.tree.leaves(restored.state["params"])
    return jax.tree.unflatten(jax.tree.structure(params), leaves)

  def wait(self) -> None:
    """Blocks until an asynchronous save has been committed."""
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()


@dataclasses.dataclass(frozen=True)
class StartPoint:
  """Where a run starts: `kind` is "workdir", "resume", "init_from_checkpoint",
  "init_from_hf" or "scratch"; `path` and `step` say which checkpoint."""

  kind: str
  path: epath.Path | None = None
  step: int | None = None


def _latest(directory: epath.Path) -> int | None:
  if not directory.is_dir():
    return None
  steps = [int(p.name) for p in directory.iterdir() if p.is_dir() and p.name.isdigit()]
  return max(steps) if steps else None


def resolve_start(checkpoint_dir: str | os.PathLike, *, resume: str | None = None,
                  init_from: str | None = None) -> StartPoint:
  """Applies the resume policy; see the module docstring.

  Raises:
    FileNotFoundError: `resume` or `init_from` is set but holds nothing loadable.
  """
  own = epath.Path(checkpoint_dir)
  step = _latest(own)
  if step is not None:
    return StartPoint("workdir", own, step)
  if resume:
    path = epath.Path(resume)
    step = _latest(path) if _latest(path) is not None else _latest(path / "checkpoints")
    if step is None:
      raise FileNotFoundError(f"config.resume={resume!r}: no orbax checkpoint steps there")
    path = path if _latest(path) is not None else path / "checkpoints"
    return StartPoint("resume", path, step)
  if init_from:
    path = epath.Path(init_from)
    if (path / "config.json").exists() and any(path.glob("*.safetensors*")):
      return StartPoint("init_from_hf", path)
    for candidate in (path, path / "checkpoints"):
      step = _latest(candidate)
      if step is not None:
        return StartPoint("init_from_checkpoint", candidate, step)
    raise FileNotFoundError(
      f"config.init_from={init_from!r} is neither a Hugging Face checkpoint directory "
      "(config.json + safetensors) nor an orbax checkpoint directory")
  return StartPoint("scratch")
