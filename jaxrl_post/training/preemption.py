"""Graceful stop on SIGTERM / SIGINT: finish the current step, checkpoint, exit.

  with PreemptionGuard() as guard:
    for step in ...:
      ...
      if guard.requested:
        checkpointer.save(step, state, ...)
        break

Schedulers (SLURM, Kubernetes, TPU maintenance events) send SIGTERM some
seconds before killing a job; turning it into a flag lets the loop save the
step it just finished instead of losing everything since the last periodic
checkpoint. A SIGKILL cannot be caught: then the last periodic checkpoint is
what survives (orbax never lists a half-written one).
"""

from __future__ import annotations

import signal
import threading


class PreemptionGuard:
  """Context manager recording whether SIGTERM or SIGINT arrived."""

  SIGNALS = (signal.SIGTERM, signal.SIGINT)

  def __init__(self):
    self.requested = False
    self.signal_name: str | None = None
    self._previous = {}

  def _handle(self, signum, frame):
    del frame
    self.requested = True
    self.signal_name = signal.Signals(signum).name

  def report_stop(self, step: int) -> None:
    """Tells the user the run stopped on a signal after `step`, with a checkpoint to resume from."""
    print(f"{self.signal_name}: stopped after step {step} with a checkpoint; "
          "rerun the same command to resume")

  def __enter__(self) -> PreemptionGuard:
    # Signal handlers can only be installed from the main thread (tests and
    # notebooks may run loops elsewhere; there the guard is inert).
    if threading.current_thread() is threading.main_thread():
      for sig in self.SIGNALS:
        self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def __exit__(self, *exc):
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
    return False
