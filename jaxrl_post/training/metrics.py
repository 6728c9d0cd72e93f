"""Metric writing from process 0: JSONL, TensorBoard, optionally W&B and CLU; `config.json`.

  writer = MetricWriter.from_config(config, workdir)   # config.metric_writers picks the sinks
  writer.write_config(config)              # workdir/config.json
  writer.write(step, {"reward_mean": 0.4, "loss": 1.2})
  writer.flush()                           # before a checkpoint: the workdir holds every step
  writer.close()

`metrics.jsonl` holds one `{"step": ..., **metrics}` object per line; resuming
appends, after dropping lines with a step beyond the restored one, so the file
of an interrupted-and-resumed run equals that of an uninterrupted one.
Other processes of a multi-host run write nothing.

The workdir is an `etils.epath` path. A local one is written in place, line by line. A remote
one (`gs://bucket/run`: object stores cannot append) is written through a local staging
directory: metrics.jsonl and the TensorBoard event files are appended there and copied whole
to the workdir at most every `sync_every_s` seconds, at every `flush()` (the loop flushes
before each checkpoint, so every step up to a checkpoint is in the workdir) and at `close()`.

Writers (`config.metric_writers`, a comma-separated string or a sequence of names):
  jsonl        always on: the loop's summary, resume and scripts/plot_metrics.py read it;
  tensorboard  tensorboardX event files in `workdir/tensorboard`;
  wandb        Weights & Biases (`pip install wandb`), project `config.wandb_project`, one
               W&B run per workdir (`wandb_run_id`), resumed when the workdir resumes;
  clu          `clu.metric_writers.create_default_writer` (`pip install clu`) in `workdir/clu`.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from etils import epath

from jaxrl_post.training.checkpoint import as_path, is_local

METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "config.json"
TENSORBOARD_DIR = "tensorboard"
CLU_DIR = "clu"
# Name → (module imported when the writer starts, the pip package that provides it).
METRIC_WRITERS = {"jsonl": (None, None), "tensorboard": ("tensorboardX", "tensorboardX"),
                  "wandb": ("wandb", "wandb"), "clu": ("clu.metric_writers", "clu")}
DEFAULT_METRIC_WRITERS = ("jsonl", "tensorboard")


def _to_python(value):
  if isinstance(value, (np.ndarray, jax.Array)):
    value = np.asarray(value)
    return value.item() if value.ndim == 0 else value.tolist()
  if isinstance(value, np.generic):
    return value.item()
  return value


def _json_safe(value):
  # JSON has no NaN / inf; write them as strings so the line stays parseable.
  if isinstance(value, float) and not math.isfinite(value):
    return str(value)
  return value


def read_metrics(workdir: str | os.PathLike) -> list[dict[str, Any]]:
  """All records of `workdir/metrics.jsonl`, in order.

  A process killed mid-write (SIGKILL) can leave a truncated last line; it is
  skipped, since its step is redone after the resume anyway.
  """
  path = epath.Path(workdir) / METRICS_FILE
  if not path.exists():
    return []
  lines = [line for line in path.read_text().splitlines() if line.strip()]
  records = []
  for i, line in enumerate(lines):
    try:
      records.append(json.loads(line))
    except json.JSONDecodeError:
      if i != len(lines) - 1:
        raise ValueError(f"{path}: line {i + 1} is not JSON: {line[:80]!r}") from None
  return records


def metric_writer_names(value: str | Sequence[str] = DEFAULT_METRIC_WRITERS) -> tuple[str, ...]:
  """`config.metric_writers` ("jsonl,tensorboard,wandb" or a sequence) as validated names.

  Checked on every process before anything is built, so a typo or a missing package fails
  in seconds instead of after the model compiled (and on process 0 only).

  Raises:
    ValueError: an unknown name, or no "jsonl" (the loop's summary, resume and plots read
      metrics.jsonl).
    ImportError: a writer's package is not installed; names the config key and the package.
  """
  names = [n.strip() for n in value.split(",")] if isinstance(value, str) else list(value)
  names = tuple(dict.fromkeys(n for n in names if n))
  unknown = [n for n in names if n not in METRIC_WRITERS]
  if unknown:
    raise ValueError(f"config.metric_writers={value!r}: unknown writer(s) {unknown}; valid: "
                     f"{', '.join(METRIC_WRITERS)}")
  if "jsonl" not in names:
    raise ValueError(f"config.metric_writers={value!r} must include 'jsonl': the run's summary, "
                     "resume and scripts/plot_metrics.py read metrics.jsonl")
  for name in names:
    module, package = METRIC_WRITERS[name]
    if module is not None and not _installed(module.split(".")[0]):
      raise ImportError(f"config.metric_writers includes {name!r}, which needs the {package!r} "
                        f"package: pip install {package}, or drop {name!r} from "
                        "config.metric_writers")
  return names


def _installed(top_level: str) -> bool:
  """Whether `import top_level` can work, without importing it (W&B takes seconds)."""
  if top_level in sys.modules:
    return sys.modules[top_level] is not None  # None: imports of it are blocked
  return importlib.util.find_spec(top_level) is not None


def wandb_run_id(workdir: str | os.PathLike) -> str:
  """A W&B run id that is a function of the workdir only (16 hex digits of its SHA-256).

  The same workdir — a restart after preemption, on any host — continues the same W&B run;
  another workdir starts another one.
  """
  return hashlib.sha256(os.fspath(as_path(workdir)).encode()).hexdigest()[:16]


def _import_writer(name: str):
  module, package = METRIC_WRITERS[name]
  try:
    return importlib.import_module(module)
  except ImportError as e:
    raise ImportError(f"config.metric_writers includes {name!r}, which needs the {package!r} "
                      f"package: pip install {package}, or drop {name!r} from "
                      "config.metric_writers") from e


class _TensorBoardSink:
  """tensorboardX event files in `directory` (local: the staging copy of a remote workdir)."""

  def __init__(self, directory: epath.Path, resume_step: int | None):
    tensorboardx = _import_writer("tensorboard")
    # purge_step: TensorBoard hides the events of steps after it from the earlier run.
    self._writer = tensorboardx.SummaryWriter(os.fspath(directory), purge_step=resume_step)

  def write(self, step: int, scalars: Mapping[str, float]) -> None:
    for key, value in scalars.items():
      self._writer.add_scalar(key, value, step)

  def flush(self) -> None:
    self._writer.flush()

  def close(self) -> None:
    self._writer.close()


class _WandbSink:
  """One W&B run per workdir (`wandb_run_id`), resumed with the workdir.

  W&B keeps a run's steps increasing: after a resume, steps up to the last one it logged
  before the stop are dropped by W&B (with a warning), so it shows the first run's values
  there; metrics.jsonl is the exact record.
  """

  def __init__(self, workdir: epath.Path, local_dir: epath.Path, project: str,
               run_config: Mapping[str, Any] | None):
    wandb = _import_writer("wandb")
    self._run = wandb.init(project=project or None, dir=os.fspath(local_dir),
                           config=dict(run_config or {}), resume="allow",
                           id=wandb_run_id(workdir), name=workdir.name)

  def write(self, step: int, scalars: Mapping[str, float]) -> None:
    self._run.log(dict(scalars), step=step)

  def flush(self) -> None:
    pass  # W&B streams in the background.

  def close(self) -> None:
    self._run.finish()


class _CluSink:
  """`clu.metric_writers.create_default_writer` in `workdir/clu` (CLU writes gs:// itself)."""

  def __init__(self, workdir: epath.Path):
    metric_writers = _import_writer("clu")
    self._writer = metric_writers.create_default_writer(os.fspath(workdir / CLU_DIR),
                                                        asynchronous=True)

  def write(self, step: int, scalars: Mapping[str, float]) -> None:
    self._writer.write_scalars(step, dict(scalars))

  def flush(self) -> None:
    self._writer.flush()

  def close(self) -> None:
    self._writer.close()


class MetricWriter:
  """Writes scalar metrics to `metrics.jsonl` and the writers `writers` names (process 0)."""

  def __init__(self, workdir: str | os.PathLike, *, resume_step: int | None = None,
               tensorboard: bool = True, writers: str | Sequence[str] | None = None,
               wandb_project: str = "", run_config: Mapping[str, Any] | None = None,
               sync_every_s: float = 60.0):
    """Opens the writers; on process 0 only (elsewhere every method does nothing).

    Args:
      workdir: the run's workdir, local or remote (`gs://…`).
      resume_step: the restored step (None: a fresh run, which starts a fresh metrics file).
      tensorboard: False drops "tensorboard" from `writers` (tests, tools).
      writers: `metric_writer_names`' input; None = `DEFAULT_METRIC_WRITERS`.
      wandb_project: the W&B project ("wandb" only).
      run_config: the run's config as a dict, shown by W&B ("wandb" only).
      sync_every_s: a remote workdir gets the staged files at most this often (and at
        `flush` / `close`).
    """
    self.workdir = as_path(workdir)
    self.active = jax.process_index() == 0
    names = metric_writer_names(DEFAULT_METRIC_WRITERS if writers is None else writers)
    self.writers = tuple(n for n in names if tensorboard or n != "tensorboard")
    self._sinks = []
    if not self.active:
      return
    self.workdir.mkdir(parents=True, exist_ok=True)
    self._remote = not is_local(self.workdir)
    # Where files are appended: the workdir itself, or a local copy of it that `flush` uploads.
    self._local_dir = (epath.Path(tempfile.mkdtemp(prefix="jaxrl_post_metrics_"))
                       if self._remote else self.workdir)
    self._sync_every_s = sync_every_s
    self._last_sync = time.monotonic()
    self._start_metrics_file(resume_step)
    self._file = open(self._local_dir / METRICS_FILE, "a")  # noqa: SIM115 - kept open for the run
    if "tensorboard" in self.writers:
      self._sinks.append(_TensorBoardSink(self._local_dir / TENSORBOARD_DIR, resume_step))
    if "wandb" in self.writers:
      self._sinks.append(_WandbSink(self.workdir, self._local_dir, wandb_project, run_config))
    if "clu" in self.writers:
      self._sinks.append(_CluSink(self.workdir))
    if self._remote:
      self._upload()  # a fresh run's empty file replaces an earlier run's at once

  @classmethod
  def from_config(cls, config, workdir: str | os.PathLike, *,
                  resume_step: int | None = None) -> MetricWriter:
    """The writers `config.metric_writers` names (default jsonl + TensorBoard), W&B project
    `config.wandb_project`."""
    run_config = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    return cls(workdir, resume_step=resume_step,
               writers=config.get("metric_writers", DEFAULT_METRIC_WRITERS),
               wandb_project=config.get("wandb_project", ""), run_config=run_config)

  def _start_metrics_file(self, resume_step: int | None) -> None:
    """A resumed run keeps the records up to `resume_step`; a fresh run starts empty."""
    path = self._local_dir / METRICS_FILE
    if resume_step is not None:
      kept = [r for r in read_metrics(self.workdir) if r.get("step", 0) <= resume_step]
      # Write-then-rename: a kill during the rewrite must not lose the history.
      tmp = path.with_suffix(".jsonl.tmp")
      tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
      tmp.replace(path)
    elif path.exists():
      path.unlink()  # a fresh run in a reused workdir starts a fresh file

  def write_config(self, config: Mapping[str, Any] | Any) -> None:
    if not self.active:
      return
    as_dict = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    (self.workdir / CONFIG_FILE).write_text(json.dumps(as_dict, indent=2, default=str) + "\n")

  def write(self, step: int, metrics: Mapping[str, Any]) -> None:
    if not self.active:
      return
    record, scalars = {"step": int(step)}, {}
    for key, value in metrics.items():
      value = _to_python(value)
      record[key] = _json_safe(value)
      if isinstance(value, (int, float)) and not isinstance(value, bool):
        scalars[key] = value
    self._file.write(json.dumps(record) + "\n")
    self._file.flush()
    for sink in self._sinks:
      sink.write(int(step), scalars)
    if self._remote and time.monotonic() - self._last_sync >= self._sync_every_s:
      self.flush()

  def flush(self) -> None:
    """Everything written so far reaches the workdir (a remote one gets the staged files)."""
    if not self.active:
      return
    self._file.flush()
    for sink in self._sinks:
      sink.flush()
    if self._remote:
      self._upload()

  def _upload(self) -> None:
    """Copies the staged metrics.jsonl and event files whole to the remote workdir."""
    staged = [self._local_dir / METRICS_FILE]
    if (self._local_dir / TENSORBOARD_DIR).is_dir():
      staged += sorted((self._local_dir / TENSORBOARD_DIR).iterdir())
    for path in staged:
      target = self.workdir / path.relative_to(self._local_dir)
      target.parent.mkdir(parents=True, exist_ok=True)
      # Bytes, not epath's copy: that would run the remote backend's copy on a local source.
      target.write_bytes(path.read_bytes())
    self._last_sync = time.monotonic()

  def close(self) -> None:
    if not self.active:
      return
    self._file.close()
    for sink in self._sinks:
      sink.close()
    if self._remote:
      self._upload()
      shutil.rmtree(self._local_dir, ignore_errors=True)


EVAL_OUTCOMES_DIR = "eval_outcomes"


def _nan_to_none(value):
  if isinstance(value, list):
    return [_nan_to_none(v) for v in value]
  return None if not math.isfinite(value) else value


def write_eval_outcomes(workdir: str | os.PathLike, step: int, **outcomes: Any) -> None:
  """Per-prompt evaluation outcomes of `step` (arrays, NaN as null) as one JSON file.

  One file per step, rewritten whole (write-then-rename), so a resumed run that
  evaluates a step again leaves one consistent copy. Process 0 only.
  """
  if jax.process_index() != 0:
    return
  directory = epath.Path(workdir) / EVAL_OUTCOMES_DIR
  directory.mkdir(parents=True, exist_ok=True)
  record = {"step": int(step)}
  record.update({k: _nan_to_none(np.asarray(v, np.float64).tolist())
                 for k, v in outcomes.items()})
  path = directory / f"step_{int(step):08d}.json"
  tmp = path.with_suffix(".json.tmp")
  tmp.write_text(json.dumps(record) + "\n")
  tmp.replace(path)


def read_eval_outcomes(workdir: str | os.PathLike) -> dict[int, dict[str, np.ndarray]]:
  """`{step: {name: float array}}` of everything `write_eval_outcomes` wrote (null → NaN)."""
  out = {}
  for path in sorted((epath.Path(workdir) / EVAL_OUTCOMES_DIR).glob("step_*.json")):
    record = json.loads(path.read_text())
    step = record.pop("step")
    out[step] = {k: np.array(v, dtype=np.float64) for k, v in record.items()}
  return out

