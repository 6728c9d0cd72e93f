"""A sampler in a process of its own: rollouts generated apart from the trainer's process.

With `config.rollout.sampler_process = True` (and a producer mode, `config.rollout.mode`
"one_step_off" / "async"; `training.async_rollouts`) the producer thread of the trainer's
process does not decode: it sends each batch's prompts to a *sampler process*, a separate
Python process with its own JAX runtime and devices, and takes its rows back. The trainer
publishes each weight version to that process after its update. This is the layout of Miles
v0.1's disaggregated rollout engines (arXiv-less; `radixark/miles`), in miniature:

    trainer process                               sampler process (`_serve`)
    ───────────────                               ──────────────────────────
    update → θ_v → host copy ── weights pipe ──▶  receiver thread: versions {v: leaves}
    producer thread: prompts, key(index), v ───▶  generate with θ_v on its own devices
                     ◀── rows (host arrays) ────  (`group_source.generate_rollout`)

  * **Devices.** The process is started with `config.rollout.sampler_env` added to its
    environment (e.g. `{"CUDA_VISIBLE_DEVICES": "7"}` on a GPU node, with the trainer's own
    process restricted to the others; `{"XLA_FLAGS": "--xla_force_host_platform_device_count=1"}`
    on a CPU). It builds the in-process sampler mesh's shape from the devices it sees
    (`config.mesh.sampler_devices` of them with the `sampler_ici_*` axes, or the trainer's
    axes over all of them when the run colocates), so the rows are the in-process producer's
    (tested bitwise).
  * **Weights.** A version is sent as host arrays (the trainer's `policy_params`: a LoRA
    run's adapters merged into the base, the base graph) over a pipe; the sampler keeps the
    newest `keep_versions` versions, because the producer may ask for one older than the
    newest ("one_step_off" samples batch t + 1 with θ_{t−1} while θ_t is published). This is
    a host round trip (Miles' `disk-delta` mode moves bytes the same way); a device-to-device
    transfer between processes (NCCL / ICI) is not built. `time/weight_sync` times it.
  * **Failures.** An exception in the sampler process comes back to the trainer as a
    `RuntimeError` with the sampler's traceback; a sampler process that dies is reported with
    its exit code at the next call. `close()` stops it.

The sampler process rebuilds, from the run's config, exactly what the in-process producer
uses: the tokenizer, the task's decoding grammar, the mesh, and a `Sampler` of the model's
architecture (`model_config`, built abstractly, then given each version's arrays). Keys are
the trainer's (`fold_in(rng, index)`, sent as key data), so rows do not depend on where
they were sampled.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

# Rows a batch returns: `methods.group_source.ROW_KEYS` (kept in step by the tests).
_READY_TIMEOUT_S = 600.0


@contextlib.contextmanager
def _environment(extra: Mapping[str, str]):
  """`os.environ` with `extra` while a child process is spawned (it inherits the environment
  at start; the variables must be set before its JAX runtime starts)."""
  saved = {k: os.environ.get(k) for k in extra}
  os.environ.update({k: str(v) for k, v in extra.items()})
  try:
    yield
  finally:
    for key, value in saved.items():
      if value is None:
        os.environ.pop(key, None)
      else:
        os.environ[key] = value


class SamplerProcess:
  """The trainer's handle on a sampler process (module docstring).

  Args:
    config: the run's config (the sampler process rebuilds tokenizer, task grammar and mesh).
    model_config: the policy's `ModelConfig` in the base graph (`without_lora(model).config`).
    env: variables added to the sampler process's environment (its devices).
    keep_versions: weight versions the sampler process keeps (≥ 2 for "one_step_off").
    timeout_s: the longest the trainer waits for the process to start or for one batch.
  """

  def __init__(self, config, model_config, *, env: Mapping[str, str] | None = None,
               keep_versions: int = 3, timeout_s: float = _READY_TIMEOUT_S):
    if keep_versions < 1:
      raise ValueError(f"keep_versions={keep_versions} must be >= 1")
    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: its own JAX runtime
    self._weights, weights_end = ctx.Pipe()
    self._conn, conn_end = ctx.Pipe()
    self._lock = threading.Lock()
    self.timeout_s = float(timeout_s)
    with _environment(dict(env or {})):
      self._process = ctx.Process(
        target=_serve, args=(config.to_dict(), model_config, weights_end, conn_end,
                             int(keep_versions)),
        name="sampler-process", daemon=True)
      self._process.start()
    weights_end.close()
    conn_end.close()
    self.info = self._receive("starting")

  def _receive(self, what: str):
    if not self._conn.poll(self.timeout_s):
      self.close()
      raise RuntimeError(f"the sampler process did not answer within {self.timeout_s:.0f} s "
                         f"({what})")
    try:
      status, payload = self._conn.recv()
    except EOFError:
      self._process.join(5)
      raise RuntimeError(f"the sampler process exited (code {self._process.exitcode}) while "
                         f"{what}") from None
    if status == "error":
      raise RuntimeError(f"the sampler process failed while {what}:\n{payload}")
    return payload

  def publish(self, params, version: int) -> dict[str, float]:
    """Sends weight version `version` (`params`: the policy's state in the base graph, any
    layout); returns `time/weight_sync` (host copy + send) and `sync/mb`."""
    tic = time.perf_counter()
    leaves = [np.asarray(x) for x in jax.device_get(jax.tree.leaves(params))]
    try:
      self._weights.send((int(version), leaves))
    except (BrokenPipeError, OSError):
      raise RuntimeError(f"the sampler process exited (code {self._process.exitcode}); "
                         f"weight version {version} was not sent") from None
    return {"time/weight_sync": time.perf_counter() - tic,
            "sync/mb": sum(x.nbytes for x in leaves) / 2**20}

  def generate(self, version: int, prompts: Sequence[str], key, *,
               prompt_classes: Sequence[int] | None = None,
               class_caps: Sequence[int] | None = None) -> dict[str, np.ndarray]:
    """The rows (`group_source.ROW_KEYS`, host arrays) of `prompts` sampled with weight
    version `version` and PRNG `key`, as `group_source.generate_rollout` returns them."""
    request = ("generate", int(version), list(prompts), np.asarray(jax.random.key_data(key)),
               None if prompt_classes is None else list(prompt_classes),
               None if class_caps is None else list(class_caps))
    with self._lock:
      try:
        self._conn.send(request)
      except (BrokenPipeError, OSError):
        raise RuntimeError(f"the sampler process exited (code {self._process.exitcode})"
                           ) from None
      return self._receive(f"generating with weight version {version}")

  def close(self) -> None:
    """Stops the sampler process (idempotent)."""
    if self._process.is_alive():
      with contextlib.suppress(BrokenPipeError, OSError):
        self._weights.send(None)
      with contextlib.suppress(BrokenPipeError, OSError):
        self._conn.send(("stop",))
      self._process.join(30)
      if self._process.is_alive():
        self._process.terminate()
        self._process.join(5)
    self._weights.close()
    self._conn.close()


def _serve(config_dict, model_config, weights_conn, conn, keep_versions: int) -> None:
  """The sampler process's main function (module docstring)."""
  try:
    sampler, place, versions = _start(config_dict, model_config, weights_conn, keep_versions)
    conn.send(("ok", {"devices": jax.device_count(), "platform": jax.default_backend(),
                      "pid": os.getpid()}))
  except BaseException:  # noqa: BLE001 - reported to the trainer
    conn.send(("error", traceback.format_exc()))
    return
  placed: tuple[int, Any] | None = None
  while True:
    try:
      request = conn.recv()
    except EOFError:
      return
    if request[0] == "stop":
      return
    try:
      _, version, prompts, key_data, classes, caps = request
      leaves = versions.get(version)
      if placed is None or placed[0] != version:
        placed = (version, place(leaves))
      rows = sampler.generate(placed[1], prompts, jax.random.wrap_key_data(key_data),
                              prompt_classes=classes, class_caps=caps)
      conn.send(("ok", rows))
    except BaseException:  # noqa: BLE001 - reported to the trainer
      conn.send(("error", traceback.format_exc()))


class _Versions:
  """The sampler process's newest `keep` weight versions (host arrays), filled by the receiver
  thread, read by the generating one."""

  def __init__(self, keep: int):
    self.keep, self.by_version, self.newest, self.closed = keep, {}, -1, False
    self._cond = threading.Condition()

  def put(self, version: int, leaves) -> None:
    with self._cond:
      self.by_version[version] = leaves
      self.newest = max(self.newest, version)
      for old in sorted(self.by_version)[:-self.keep]:
        del self.by_version[old]
      self._cond.notify_all()

  def close(self) -> None:
    with self._cond:
      self.closed = True
      self._cond.notify_all()

  def get(self, version: int, timeout_s: float = _READY_TIMEOUT_S):
    """Version `version`'s arrays, once it (or a newer one) arrived; raises if it was evicted
    or never comes."""
    with self._cond:
      # Until it arrives, or a newer one did (then it was evicted, or skipped).
      if not self._cond.wait_for(lambda: self.closed or version <= self.newest, timeout_s):
        raise RuntimeError(f"weight version {version} never arrived")
      if version not in self.by_version:
        raise RuntimeError(f"weight version {version} was evicted or never sent; the sampler "
                           f"keeps {self.keep} versions: {sorted(self.by_version)}")
      return self.by_version[version]


class _RowSampler:
  """The sampler process's `Sampler` and config: prompts + key -> host rows."""

  def __init__(self, sampler, config):
    self.sampler, self.config = sampler, config

  def generate(self, params, prompts, key, *, prompt_classes=None, class_caps=None):
    from jaxrl_post.methods import group_source

    rollout = group_source.generate_rollout(self.sampler, params, prompts, self.config, key,
                                            prompt_classes=prompt_classes,
                                            class_caps=class_caps)
    return {k: np.asarray(jax.device_get(getattr(rollout, k))) for k in group_source.ROW_KEYS}


def _start(config_dict, model_config, weights_conn, keep_versions: int):
  """Builds the sampler process's sampler and starts its weight receiver thread."""
  import ml_collections
  from flax import nnx

  from jaxrl_post.methods.grpo import task_grammar
  from jaxrl_post.models import CausalLM
  from jaxrl_post.parallel.axes import state_shardings
  from jaxrl_post.parallel.mesh import get_rules, make_mesh
  from jaxrl_post.sampling.sampler import Sampler
  from jaxrl_post.training import setup as run_setup

  config = ml_collections.ConfigDict(config_dict)
  tokenizer = run_setup.build_tokenizer(config)
  task = run_setup.build_task(config, tokenizer)
  # The in-process sampler mesh's shape, over this process's devices: `sampler_devices` of them
  # with the `sampler_ici_*` axes when the run disaggregates, else the trainer's axes over all.
  n = int(config.mesh.get("sampler_devices", 0))
  mesh = (make_mesh(config.mesh, devices=jax.devices()[:n], prefix="sampler_ici") if n
          else make_mesh(config.mesh))
  rules = get_rules(config.mesh["sample_rules"], key="config.mesh.sample_rules")
  abstract = nnx.eval_shape(lambda: CausalLM(model_config, rngs=nnx.Rngs(0)))
  graphdef, abstract_state = nnx.split(abstract)
  treedef = jax.tree.structure(abstract_state)
  expected = [(x.shape, x.dtype) for x in jax.tree.leaves(abstract_state)]
  shardings = jax.tree.leaves(state_shardings(abstract_state, mesh, rules))
  sampler = Sampler(nnx.merge(graphdef, abstract_state), tokenizer,
                    max_prompt_len=config.prompt_len, mesh=mesh, rules=rules,
                    grammar=task_grammar(config, task, tokenizer))

  def place(leaves):
    got = [(x.shape, x.dtype) for x in leaves]
    if got != expected:
      bad = next(i for i, (a, b) in enumerate(zip(got, expected)) if a != b) if len(
        got) == len(expected) else None
      raise ValueError(f"weights of {len(got)} arrays do not fit the model's {len(expected)}"
                       + ("" if bad is None else f" (array {bad}: {got[bad]} vs "
                          f"{expected[bad]})"))
    return jax.tree.unflatten(treedef, [jax.device_put(x, s) for x, s in zip(leaves,
                                                                              shardings)])

  versions = _Versions(keep_versions)

  def receive():
    while True:
      try:
        message = weights_conn.recv()
      except EOFError:
        message = None
      if message is None:
        versions.close()
        return
      versions.put(*message)

  threading.Thread(target=receive, name="weights-receiver", daemon=True).start()
  return _RowSampler(sampler, config), place, versions
