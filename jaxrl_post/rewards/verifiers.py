"""Task verifiers run safely: a verifier that raises or hangs costs one missing reward, not the run.

    correct, fmt, failures = rewards_for(task, records, texts, group_size, timeout_s=5.0)

`correct` / `fmt` are `[len(texts)]` float32 with NaN where the verifier failed; the advantage
estimators skip NaN rewards (`jaxrl_post.advantages`).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

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


def rewards_for(task: Task, records: Sequence[Mapping[str, Any]], texts: Sequence[str],
                group_size: int, *, timeout_s: float | None = None,
                ) -> tuple[np.ndarray, np.ndarray, RewardFailures]:
  """Scores `texts` (group_size per record) with the task's verifier.

  A verifier that raises, or runs past `timeout_s` seconds on a sample, gives
  NaN (a missing reward, which the advantages ignore) instead of stopping the
  run; the failures are counted by cause.
  """
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
