"""Graceful stop on SIGTERM / SIGINT: finish the current step, checkpoint, exit.

  with PreemptionGuard() as guard:
    for step in ...:
      ...
      if guard.stop_agreed(step):          # the same answer on every process
        checkpointer.save(step, state, ...)
        break

Schedulers (SLURM, Kubernetes, TPU maintenance events) send SIGTERM some
seconds before killing a job; turning it into a flag lets the loop save the
step it just finished instead of losing everything since the last periodic
checkpoint. A SIGKILL cannot be caught: then the last periodic checkpoint is
what survives (orbax never lists a half-written one).

Several processes: the signal often reaches one process only (one host of a pod is
preempted; a user interrupts one launcher). The checkpoint save is collective, so every
process must decide to stop after the *same* step: `stop_agreed(step)` all-gathers the
processes' flags (one collective of one int32 per process per step, the same cost as the
loop's other per-step exchanges) and stops all of them when any got the signal. It also asks
JAX's preemption sync point (`multihost_utils.reached_preemption_sync_point`), which is how
a preemption notice that JAX's runtime receives on its own route stops the run. (JAX's
service listens for SIGTERM too, from C++, but the Python handler installed here replaces
it; that is why the flags are all-gathered, which also covers SIGINT.)
"""

from __future__ import annotations

import signal
import threading

import jax
import numpy as np
from absl import logging
from jax.experimental import multihost_utils


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

  def stop_agreed(self, step: int) -> bool:
    """Whether the run stops after `step`; the same answer on every process.

    One process: whether a signal arrived. Several: whether any process got one, or JAX's
    preemption sync point says `step` is the step to save (every process must call this at
    every step, with the same `step`; both answers are collective).
    """
    if jax.process_count() == 1:
      return self.requested
    flags = np.asarray(multihost_utils.process_allgather(np.int32(self.requested)))
    stop = bool(flags.any())
    if jax_preemption_sync_point(step):
      stop = True
      self.signal_name = self.signal_name or "preemption notice (JAX preemption service)"
    if stop and not self.requested:
      senders = [int(i) for i in np.flatnonzero(flags.reshape(-1))]
      self.signal_name = self.signal_name or f"a signal to process(es) {senders}"
    return stop

  def report_stop(self, step: int) -> None:
    """Tells the user the run stopped on a signal after `step`, with a checkpoint to resume from."""
    where = (f"process {jax.process_index()} of {jax.process_count()}: "
             if jax.process_count() > 1 else "")
    print(f"{where}{self.signal_name}: stopped after step {step} with a checkpoint; "
          "rerun the same command to resume", flush=True)

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


def jax_preemption_sync_point(step: int) -> bool:
  """`multihost_utils.reached_preemption_sync_point(step)`; False where JAX runs without its
  preemption service (`jax_enable_preemption_service=False`, or no `jax.distributed`)."""
  try:
    return multihost_utils.reached_preemption_sync_point(step)
  except RuntimeError as e:  # the service is off: the all-gathered flags still agree
    logging.log_first_n(logging.INFO, "no JAX preemption sync point: %s", 1, e)
    return False
