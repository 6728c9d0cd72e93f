"""Task verifiers run safely: a verifier that raises or hangs costs one missing reward, not the run.

    correct, fmt, failures = rewards_for(task, records, texts, group_size, timeout_s=5.0)

`correct` / `fmt` are `[len(texts)]` float32 with NaN where the verifier failed; the advantage
estimators skip NaN rewards (`jaxrl_post.advantages`).

Two paths, chosen by the task:

* In process (the synthetic tasks): `task.reward` runs here, each sample under a SIGALRM limit
  (`time_limit`); a time-out or an exception gives NaN.
* In the worker pool (a task whose `pooled_verifier()` returns a function, e.g. the MATH
  tasks, whose `math_verify` comparison can blow up on a pathological expression): samples run
  in `math_answers.shared_pool()`'s worker processes, each cut at `timeout_s` by killing its
  worker. A time-out there is a *wrong* answer (correct = format = 0, counted in
  `RewardFailures.timeouts`): an expression too costly to check within the limit is not a
  verifier bug, and scoring it 0 keeps the model from learning to stall the verifier. An
  exception (or a dead worker) is still a missing reward, counted in `errors`.

A task opts in with a method `pooled_verifier(self) -> fn`, where `fn(record, completion)`
returns `(correct, format)` and is picklable (a module-level function, or a `functools.partial`
of one with small arguments): the workers receive `fn` and one record per sample, never the
task, which may hold a whole dataset.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from jaxrl_post.rewards import math_answers
from jaxrl_post.tasks.base import Task


class VerifierTimeout(Exception):
  """A verifier ran past its time limit on one sample."""


@contextlib.contextmanager
def time_limit(seconds: float | None):
  """Raises `VerifierTimeout` in the body after `seconds` of wall clock.

  Uses SIGALRM (a real interrupt, so a verifier stuck in a Python loop or a
  sleep is stopped); off the main thread, or on platforms without it, the
  body runs without a limit.
  """
  usable = (seconds and hasattr(signal, "setitimer")
            and threading.current_thread() is threading.main_thread())
  if not usable:
    yield
    return

  def on_alarm(signum, frame):
    raise VerifierTimeout(f"verifier exceeded {seconds} s")

  previous = signal.signal(signal.SIGALRM, on_alarm)
  signal.setitimer(signal.ITIMER_REAL, seconds)
  try:
    yield
  finally:
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)


class RewardFailures(NamedTuple):
  """How many samples got no reward, by cause."""

  errors: int = 0
  timeouts: int = 0

  @property
  def total(self) -> int:
    return self.errors + self.timeouts


def pooled_verifier(task: Any) -> Callable[[Mapping[str, Any], str], Any] | None:
  """The task's picklable verifier for the worker pool, or `None` when it scores in process."""
  hook = getattr(task, "pooled_verifier", None)
  return hook() if callable(hook) else None


def rewards_for(task: Task, records: Sequence[Mapping[str, Any]], texts: Sequence[str],
                group_size: int, *, timeout_s: float | None = None,
                ) -> tuple[np.ndarray, np.ndarray, RewardFailures]:
  """Scores `texts` (group_size per record) with the task's verifier.

  Text `i` belongs to record `i // group_size`. In process, a verifier that raises or runs past
  `timeout_s` seconds on a sample gives NaN (a missing reward, which the advantages ignore)
  instead of stopping the run. In the worker pool (module docstring), a time-out scores 0 and an
  exception NaN. Failures are counted by cause.

  Returns:
    `(correct, fmt, failures)`: `float32 [len(texts)]` twice, and the `RewardFailures`.
  """
  verifier = pooled_verifier(task)
  if verifier is not None:
    return _rewards_in_pool(verifier, records, texts, group_size, timeout_s)
  correct = np.zeros(len(texts), np.float32)
  fmt = np.zeros(len(texts), np.float32)
  errors = timeouts = 0
  for i, text in enumerate(texts):
    try:
      with time_limit(timeout_s):
        correct[i], fmt[i] = task.reward(records[i // group_size], text)
    except VerifierTimeout:
      correct[i] = fmt[i] = np.nan
      timeouts += 1
    except Exception:  # noqa: BLE001 - any verifier bug must not kill training
      correct[i] = fmt[i] = np.nan
      errors += 1
  return correct, fmt, RewardFailures(errors, timeouts)


def _rewards_in_pool(verifier, records, texts, group_size, timeout_s):
  # Plain dicts: a record may be a row view of a batch; only its values need to travel.
  rows = [dict(record) for record in records]
  args = [(rows[i // group_size], text) for i, text in enumerate(texts)]
  outcomes = math_answers.shared_pool().run(verifier, args, timeout_s=timeout_s)
  correct = np.zeros(len(texts), np.float32)
  fmt = np.zeros(len(texts), np.float32)
  errors = timeouts = 0
  for i, outcome in enumerate(outcomes):
    if outcome.timed_out:
      timeouts += 1  # Wrong, not missing: correct = format = 0 (module docstring).
    elif outcome.error is not None:
      correct[i] = fmt[i] = np.nan
      errors += 1
    else:
      try:
        correct[i], fmt[i] = outcome.value
      except (TypeError, ValueError):  # Not a pair of numbers: a verifier bug.
        correct[i] = fmt[i] = np.nan
        errors += 1
  return correct, fmt, RewardFailures(errors, timeouts)
