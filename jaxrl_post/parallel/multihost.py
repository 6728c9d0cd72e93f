"""Multi-controller runs: one Python process per host, all driving one global mesh.

JAX's multi-controller runtime runs the same program in every process; each
process owns its local devices and a `jax.Array` may span all of them. The
trainer keeps that model simple by making every host-side value *global and
identical* on all processes:

  1. Each process reads only its own data shard (`tasks.data.ShardedLoader`)
     and the records are exchanged once per step (`allgather_records`), so
     every process then holds the step's global prompt list, in
     process-major order.
  2. Host arrays become global arrays with `put_global` (each process hands
     over the slices its devices hold; `parallel.mesh.put_batch` does this).
  3. Device results come back whole with `to_host` (an all-gather across
     processes; a plain `device_get` in a single process).

Verifiers then run on every process over the whole batch: rewards and
advantages are bit-identical everywhere without another collective. That
repeats the verifier work per process; split it first if verifiers ever cost
as much as generation.

A process that dies makes the others' next collective fail at once (gloo on
CPU: "connection closed by peer"); `peer_failures_are_fatal` turns that into
one clear message and a prompt exit, and the coordination service's
heartbeat (`JAXRL_POST_HEARTBEAT_TIMEOUT_S`, default 100 s) catches a peer
that hangs instead. Restarting every process with the same command resumes
from the last checkpoint.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from absl import logging
from jax.experimental import multihost_utils
from jax.sharding import Sharding


def is_multiprocess() -> bool:
  return jax.process_count() > 1


def to_host(tree: Any) -> Any:
  """A pytree of (possibly multi-process) arrays as numpy, whole on every process.

  Single process: `jax.device_get`. Several: arrays that span other
  processes are all-gathered (`process_allgather`, tiled, so shapes keep
  their global size); every process must call this with the same structure.
  """
  if not is_multiprocess():
    return jax.device_get(tree)

  def get(x):
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
      return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(jax.device_get(x)) if isinstance(x, jax.Array) else x

  return jax.tree.map(get, tree)


def put_global(x: Any, sharding: Sharding) -> jax.Array:
  """A host value that every process holds identically, placed with `sharding`.

  Each process copies only the slices of `x` that its own devices hold
  (`jax.make_array_from_callback`), so nothing crosses the network.
  """
  x = np.asarray(x)
  return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])


def allgather_bytes(payload: bytes) -> list[bytes]:
  """Every process's `payload`, in process order, on every process."""
  if not is_multiprocess():
    return [payload]
  lengths = multihost_utils.process_allgather(np.asarray([len(payload)], np.int64))
  lengths = np.asarray(lengths).reshape(-1)
  padded = np.zeros(int(lengths.max()), np.uint8)
  padded[:len(payload)] = np.frombuffer(payload, np.uint8)
  gathered = np.asarray(multihost_utils.process_allgather(padded)).reshape(len(lengths), -1)
  return [gathered[i, :n].tobytes() for i, n in enumerate(lengths)]


def allgather_records(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
  """Concatenates the processes' record lists (JSON values), process 0's first.

  Records cross as JSON, never pickle: what another process sends is data,
  not code.
  """
  payload = json.dumps([dict(r) for r in records], default=_json_value).encode("utf-8")
  gathered = []
  for chunk in allgather_bytes(payload):
    gathered.extend(json.loads(chunk.decode("utf-8")))
  return gathered


def _json_value(value: Any) -> Any:
  if isinstance(value, np.generic):
    return value.item()  # numpy scalars from a collated batch column
  raise TypeError(f"a record value of type {type(value).__name__} cannot cross processes as JSON")


def sync(name: str) -> None:
  """A barrier across processes (no-op in one process)."""
  if is_multiprocess():
    multihost_utils.sync_global_devices(name)


@contextlib.contextmanager
def peer_failures_are_fatal(what: str = "training"):
  """Turns a collective that failed because a peer process died into a clear exit.

  In one process this does nothing. In several, a `JaxRuntimeError` is
  reported with the process index and the advice to restart every process
  with the same command (the run resumes from its last checkpoint), and the
  process exits with status 1 at once: waiting for the coordination
  service's shutdown barrier would only add the heartbeat time-out.
  """
  try:
    yield
  except jax.errors.JaxRuntimeError as e:
    if not is_multiprocess():
      raise
    message = (f"process {jax.process_index()} of {jax.process_count()}: a collective failed "
               f"during {what}, most likely because another process died or lost its network. "
               "Restart every process with the same command; the run resumes from its last "
               f"checkpoint. Cause: {str(e).splitlines()[0]}")
    logging.error(message)
    print(message, file=sys.stderr, flush=True)
    logging.flush()
    os._exit(1)


def heartbeat_timeout_s(environ: Mapping[str, str] | None = None) -> int:
  """Seconds without a heartbeat after which the coordinator declares a process dead."""
  environ = os.environ if environ is None else environ
  value = environ.get("JAXRL_POST_HEARTBEAT_TIMEOUT_S", "100")
  try:
    seconds = int(value)
  except ValueError:
    seconds = 0
  if seconds < 1:
    raise ValueError(f"JAXRL_POST_HEARTBEAT_TIMEOUT_S must be a positive integer, got {value!r}")
  return seconds
