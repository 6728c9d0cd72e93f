"""Profiler traces of chosen training steps (`config.profile_steps`).

  profiler = StepProfiler.from_config(config, workdir)   # "" = off; "5,7" = steps 5 to 7
  for step in ...:
    profiler.before_step(step)
    state, record = method.step(state, step)
    profiler.after_step(step, state)
  profiler.close()

The trace goes to `workdir/profile` (`jax.profiler.start_trace`; TensorBoard's profile plugin
or XProf reads it: `plugins/profile/<run>/<host>.xplane.pb`). Steps 1…N compile; profile a
few steps after them (e.g. "10,12") to see the steady state. JAX dispatches asynchronously,
so before the trace stops the last step's outputs are waited for: otherwise the trace would
end while its device work is still queued. Only process 0 traces unless
`config.profile_all_processes` (each host then writes its own `<host>.xplane.pb`).
"""

from __future__ import annotations

import os
from typing import Any

import jax
from absl import logging
from etils import epath

PROFILE_DIR = "profile"


def parse_profile_steps(value: Any) -> tuple[int, int] | None:
  """`config.profile_steps` as `(first, last)` steps to trace (inclusive), or None (off).

  Accepts "" / None / () (off), "5" (step 5 only), "5,7" or "5:7" (steps 5, 6, 7), or a pair of
  ints. Steps count from 1 (step 0 is the evaluation before training).

  Raises:
    ValueError: naming `config.profile_steps`, the value, and what is expected.
  """
  if value is None or (isinstance(value, str) and not value.strip()):
    return None
  expected = ('expected "" (off), "first,last" or "first" with 1 <= first <= last '
              '(e.g. "10,12"), or a pair of ints')
  if isinstance(value, str):
    parts = value.replace(":", ",").split(",")
  elif isinstance(value, (tuple, list)):
    parts = list(value)
  else:
    parts = [value]
  if not parts:
    return None
  try:
    steps = [int(str(p).strip()) for p in parts]
  except ValueError:
    raise ValueError(f"config.profile_steps={value!r}: {expected}") from None
  if len(steps) == 1:
    steps *= 2
  if len(steps) != 2 or not 1 <= steps[0] <= steps[1]:
    raise ValueError(f"config.profile_steps={value!r}: {expected}")
  return steps[0], steps[1]


class StepProfiler:
  """Starts a JAX profiler trace before step `first` and stops it after step `last`."""

  def __init__(self, steps: tuple[int, int] | None, logdir: str | os.PathLike, *,
               all_processes: bool = False):
    self.steps = steps
    self.logdir = epath.Path(logdir)
    self.enabled = steps is not None and (all_processes or jax.process_index() == 0)
    self.tracing = False

  @classmethod
  def from_config(cls, config, workdir: str | os.PathLike) -> StepProfiler:
    """`config.profile_steps` (default off) into `workdir/profile`; validated here, before
    anything compiles."""
    return cls(parse_profile_steps(config.get("profile_steps", "")),
               epath.Path(workdir) / PROFILE_DIR,
               all_processes=bool(config.get("profile_all_processes", False)))

  def before_step(self, step: int) -> None:
    """Starts the trace at the first step inside the window (also a resumed run's first)."""
    if self.enabled and not self.tracing and self.steps[0] <= step <= self.steps[1]:
      logging.info("profiling steps %d-%d into %s", step, self.steps[1], self.logdir)
      jax.profiler.start_trace(os.fspath(self.logdir))
      self.tracing = True

  def after_step(self, step: int, outputs: Any) -> None:
    """Stops the trace after step `last`, once `outputs` (the step's results) are computed."""
    if self.tracing and step >= self.steps[1]:
      jax.block_until_ready(outputs)
      self.stop()

  def stop(self) -> None:
    if self.tracing:
      jax.profiler.stop_trace()
      self.tracing = False

  def close(self) -> None:
    """Ends a trace that is still open (the run stopped inside the window)."""
    self.stop()
