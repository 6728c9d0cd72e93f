"""Metric writing: JSONL + TensorBoard from process 0, and `config.json` in the workdir.

  writer = MetricWriter(workdir)
  writer.write_config(config)              # workdir/config.json
  writer.write(step, {"reward_mean": 0.4, "loss": 1.2})
  writer.close()

`metrics.jsonl` holds one `{"step": ..., **metrics}` object per line; resuming
appends, after dropping lines with a step beyond the restored one, so the file
of an interrupted-and-resumed run equals that of an uninterrupted one.
Other processes of a multi-host run write nothing.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np

METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "config.json"


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
  path = Path(workdir) / METRICS_FILE
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


class MetricWriter:
  """Writes scalar metrics to `metrics.jsonl` and TensorBoard event files."""

  def __init__(self, workdir: str | os.PathLike, *, resume_step: int | None = None,
               tensorboard: bool = True):
    self.workdir = Path(workdir)
    self.active = jax.process_index() == 0
    self._tb = None
    if not self.active:
      return
    self.workdir.mkdir(parents=True, exist_ok=True)
    path = self.workdir / METRICS_FILE
    if resume_step is not None and path.exists():
      kept = [r for r in read_metrics(self.workdir) if r.get("step", 0) <= resume_step]
      # Write-then-rename: a kill during the rewrite must not lose the history.
      tmp = path.with_suffix(".jsonl.tmp")
      tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
      os.replace(tmp, path)
    elif resume_step is None and path.exists():
      path.unlink()  # a fresh run in a reused workdir starts a fresh file
    self._file = open(path, "a")  # noqa: SIM115 - kept open for the run
    if tensorboard:
      from tensorboardX import SummaryWriter

      self._tb = SummaryWriter(str(self.workdir / "tensorboard"), purge_step=resume_step)

  def write_config(self, config: Mapping[str, Any] | Any) -> None:
    if not self.active:
      return
    as_dict = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    (self.workdir / CONFIG_FILE).write_text(json.dumps(as_dict, indent=2, default=str) + "\n")

  def write(self, step: int, metrics: Mapping[str, Any]) -> None:
    if not self.active:
      return
    record = {"step": int(step)}
    for key, value in metrics.items():
      value = _to_python(value)
      record[key] = _json_safe(value)
      if self._tb is not None and isinstance(value, (int, float)) and not isinstance(value, bool):
        self._tb.add_scalar(key, value, int(step))
    self._file.write(json.dumps(record) + "\n")
    self._file.flush()

  def close(self) -> None:
    if not self.active:
      return
    self._file.close()
    if self._tb is not None:
      self._tb.close()


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
  directory = Path(workdir) / EVAL_OUTCOMES_DIR
  directory.mkdir(parents=True, exist_ok=True)
  record = {"step": int(step)}
  record.update({k: _nan_to_none(np.asarray(v, np.float64).tolist())
                 for k, v in outcomes.items()})
  path = directory / f"step_{int(step):08d}.json"
  tmp = path.with_suffix(".json.tmp")
  tmp.write_text(json.dumps(record) + "\n")
  os.replace(tmp, path)


def read_eval_outcomes(workdir: str | os.PathLike) -> dict[int, dict[str, np.ndarray]]:
  """`{step: {name: float array}}` of everything `write_eval_outcomes` wrote (null → NaN)."""
  out = {}
  for path in sorted((Path(workdir) / EVAL_OUTCOMES_DIR).glob("step_*.json")):
    record = json.loads(path.read_text())
    step = record.pop("step")
    out[step] = {k: np.array(v, dtype=np.float64) for k, v in record.items()}
  return out

