"""Rollouts generated ahead of the trainer: a producer thread, a bounded buffer, weight versions.

Synchronous RL alternates: generate the step's groups with θ_{t−1}, then update to θ_t; the
sampler idles while the trainer updates and the other way round. Here a *producer* (a thread
of the trainer's process) generates batches of groups ahead of the trainer with the newest
weights it has been handed, and the trainer takes finished groups from a bounded buffer
(Miles v0.1's fully-async design, `--fully-async`; one-step-off as in AReaL, arXiv 2505.24298,
and verl's one-step-off policy):

  config.rollout.mode
    "sync"          generation, then update, in the trainer's thread (no producer; the
                    default, and exactly what the step did before this module existed).
    "one_step_off"  the batch of step t + 1 is generated with θ_{t−1} while step t updates:
                    the producer starts it when the trainer takes step t's batch, after
                    θ_{t−1} was published. Every batch from step 2 on is exactly one version
                    old (staleness 1), and the run is deterministic.
    "async"         the producer keeps up to `max_in_flight` batches generated ahead and
                    picks up the newest published weights when it starts each one; the
                    staleness of a batch lies in [0, max_in_flight] and depends on timing.
                    `max_in_flight = 0` generates each batch on demand with the newest
                    weights: step for step the synchronous run (tested), through this path.

Versions and staleness. Version v is the policy after v optimizer steps of the loop (θ_v;
`publish` after each step's update). A batch is tagged with the version it was sampled with;
when step t takes it, the trainer holds θ_{t−1}, so its staleness is t − 1 − v. With
`max_weight_staleness` set, a batch older than that is not used: "drop" discards it
(its prompts are skipped, counted), "retry" draws its prompts again for the next batch the
producer starts (regenerated with newer weights, counted).

What the trainer does with off-policy groups (`config.rollout.old_logp`): "trainer" (the
default) recomputes `old_logp` with θ_{t−1} (the proximal policy: the first PPO ratio is 1)
and, with `config.loss.sampler_correction` set, weights each token by the truncated (TIS) or
masked (IcePop) ratio exp(old_logp − logp_sampler) between that policy and the one that
sampled (`losses.sampler_importance_weights`), the decoupled objective of Hilton et al.,
arXiv 2110.00641. "sampler" takes the sampler's recorded log-probs as `old_logp` (Miles'
`--use-rollout-logprobs`): the clipped ratio is then to the policy that sampled, and the
trainer's scoring pass, a forward over the whole batch, is skipped. "detached" takes the
loss's own log-probs under `stop_gradient` as `old_logp` (TRL's GRPOTrainer with one update
per generation): exact only when the step makes one optimizer update (`ppo_epochs ×
ppo_mini_batches = 1`), where `old_logp` would be recomputed with the very parameters the
loss differentiates at, so the ratio is 1 and the gradient is the same; it also skips the
scoring pass.

Weight sync (`WeightSync`): after each update the trainer's parameters are copied into the
sampler's layout (`parallel.reshard`: a re-layout on the same devices, a device-to-device
copy onto a disaggregated sampler mesh), in buckets of at most `sync_bucket_mb` (the extra
memory a sync holds at once), always as a fresh buffer (the next update donates the
trainer's). `verify_sync` compares the sampler's copy with the trainer's parameters value
by value after every sync and raises on the first difference. `time/weight_sync` is logged.

Restarts. A checkpoint saves the data position *before* the oldest batch that the trainer
has not consumed, and the weight version; in-flight and buffered batches are not saved:
after a restart their prompts are drawn again and sampled with the restored weights (no
prompt is skipped or repeated; `rollout/redrawn_after_restart` counts them). Prompts waiting
in the retry queue at a checkpoint are not saved (counted as `rollout/retry_lost_on_restart`).

Admission (`config.rollout.admission`, default "none"): the producer's batches are drawn
through a `sampling.admission.RolloutScheduler` (`methods.group_source`), whose state is part
of the data position saved above.

Sampler process (`config.rollout.sampler_process`, `sampling.sampler_process`): the producer
sends each batch's prompts to a separate process with its own devices, and each published
version goes there as host arrays; rows and metrics are the same as in-process.

Scope. One trainer process: with several, every sampler call is a collective that all of
them must issue in the same order, which a free-running producer cannot promise
(`check_supported`). The sampler process is one process (no data-parallel fleet of them).
"""

from __future__ import annotations

import collections
import dataclasses
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding

from jaxrl_post.parallel.axes import Rules, state_shardings
from jaxrl_post.parallel.reshard import reshard
from jaxrl_post.sampling import admission

ROLLOUT_MODES = ("sync", "one_step_off", "async")
UNUSED_POLICIES = ("drop", "retry")
OLD_LOGP_SOURCES = ("trainer", "sampler", "detached")


@dataclasses.dataclass(frozen=True)
class RolloutOptions:
  """`config.rollout`, checked (`rollout_options`)."""

  mode: str = "sync"
  max_in_flight: int = 1  # batches generated ahead of the trainer ("async")
  max_weight_staleness: int | None = None  # None: no bound
  unused: str = "drop"  # what happens to a batch older than the bound
  verify_sync: bool = False  # compare the sampler's weights with the trainer's after a sync
  sync_bucket_mb: float = 512.0  # the most bytes one bucket of a weight sync moves at once
  true_on_policy: bool = False  # the sampler's log-probs must equal the trainer's
  true_on_policy_tol: float = 0.0  # largest |logp_sampler − logp_trainer| allowed
  # The PPO ratio's denominator: "trainer" (recomputed with θ_{t−1}, the proximal policy),
  # "sampler" (the recorded log-probs of the policy that sampled; no scoring pass) or
  # "detached" (stop_gradient of the loss's own log-probs; one update per step; no scoring).
  old_logp: str = "trainer"
  # Rollout admission (`sampling.admission`, MISA-T arXiv 2608.11152): "none" (every drawn
  # batch is generated as drawn) or a policy the batches are drawn through
  # (`methods.group_source`: static / session / misa / misa_t).
  admission: str = "none"
  # Continuous batching (`Sampler.generate_continuous`): the step's rows decode through
  # num_slots cache slots that finished rows hand to queued ones (0: one static batch);
  # admit_size rows are prefilled together (0: max(1, num_slots // 8)).
  num_slots: int = 0
  admit_size: int = 0
  # A sampler in a process of its own (`sampling.sampler_process`; producer modes only): the
  # producer sends prompts there and the trainer publishes weights to it. `sampler_env`:
  # variables added to that process's environment (its devices); `keep_versions`: weight
  # versions it keeps (the producer may ask for one older than the newest).
  sampler_process: bool = False
  sampler_env: Any = None
  keep_versions: int = 3

  @property
  def ahead(self) -> int:
    """Batches the producer may hold generated or in flight before the trainer takes them."""
    return {"sync": 0, "one_step_off": 1}.get(self.mode, self.max_in_flight)

  @property
  def uses_producer(self) -> bool:
    return self.mode != "sync"


def rollout_options(config) -> RolloutOptions:
  """`config.rollout` (absent: synchronous) as `RolloutOptions`.

  Raises:
    ValueError: naming the `config.rollout.*` key that is out of range.
  """
  section = config.get("rollout")
  if section is None:
    return RolloutOptions()
  values = {f.name: section.get(f.name, f.default) for f in dataclasses.fields(RolloutOptions)}
  options = RolloutOptions(**values)
  if options.mode not in ROLLOUT_MODES:
    raise ValueError(f"config.rollout.mode={options.mode!r}; valid: {', '.join(ROLLOUT_MODES)}")
  if options.max_in_flight < 0:
    raise ValueError(f"config.rollout.max_in_flight={options.max_in_flight} must be >= 0")
  if options.max_weight_staleness is not None and options.max_weight_staleness < 0:
    raise ValueError(f"config.rollout.max_weight_staleness={options.max_weight_staleness} must "
                     "be >= 0 (leave it unset for no bound)")
  if options.unused not in UNUSED_POLICIES:
    raise ValueError(f"config.rollout.unused={options.unused!r}; valid: "
                     f"{', '.join(UNUSED_POLICIES)}")
  if options.num_slots < 0 or not 0 <= options.admit_size <= max(options.num_slots, 0):
    raise ValueError(f"config.rollout.num_slots={options.num_slots} must be >= 0 (0: static "
                     f"batches) and config.rollout.admit_size={options.admit_size} in [0, "
                     "num_slots] (0: num_slots // 8)")
  if options.sampler_process and not options.uses_producer:
    raise ValueError("config.rollout.sampler_process=True samples in another process, which "
                     "needs a producer: set config.rollout.mode to 'one_step_off' or 'async'")
  if options.keep_versions < 2 and options.sampler_process and options.mode != "async":
    raise ValueError(f"config.rollout.keep_versions={options.keep_versions}: 'one_step_off' "
                     "samples with the version before the newest, so keep at least 2")
  if options.sampler_env is not None and not hasattr(options.sampler_env, "items"):
    raise ValueError(f"config.rollout.sampler_env={options.sampler_env!r} must be a dict of "
                     "environment variables, e.g. {'CUDA_VISIBLE_DEVICES': '7'}")
  if options.sync_bucket_mb <= 0:
    raise ValueError(f"config.rollout.sync_bucket_mb={options.sync_bucket_mb} must be > 0")
  if options.true_on_policy_tol < 0:
    raise ValueError(f"config.rollout.true_on_policy_tol={options.true_on_policy_tol} must be "
                     ">= 0")
  if options.old_logp not in OLD_LOGP_SOURCES:
    raise ValueError(f"config.rollout.old_logp={options.old_logp!r}; valid: "
                     f"{', '.join(OLD_LOGP_SOURCES)}")
  if options.old_logp != "trainer" and options.true_on_policy:
    raise ValueError("config.rollout.true_on_policy compares the sampler's log-probs with the "
                     "trainer's: it needs config.rollout.old_logp='trainer'")
  updates = config.get("ppo_epochs", 1) * config.get("ppo_mini_batches", 1)
  if options.old_logp == "detached" and updates != 1:
    raise ValueError(f"config.rollout.old_logp='detached' equals the recomputed old policy only "
                     f"when a step makes one update; config.ppo_epochs × "
                     f"config.ppo_mini_batches = {updates}: use old_logp='trainer'")
  if options.old_logp == "sampler" and config.get("loss", {}).get(
      "sampler_correction", "none") != "none":
    raise ValueError("config.loss.sampler_correction weights exp(old_logp − sampler_logp), "
                     "which is 1 with config.rollout.old_logp='sampler': set one of them")
  if options.admission != "none" and options.admission not in admission.ADMISSION_POLICIES:
    raise ValueError(f"config.rollout.admission={options.admission!r}; valid: none, "
                     f"{', '.join(admission.ADMISSION_POLICIES.names())}")
  if options.true_on_policy and options.uses_producer:
    raise ValueError(f"config.rollout.true_on_policy needs config.rollout.mode='sync' (got "
                     f"{options.mode!r}): a batch sampled with older weights cannot match the "
                     "trainer's log-probs")
  if (options.uses_producer and options.max_weight_staleness is not None
      and options.max_weight_staleness < min(options.ahead, 1)):
    raise ValueError(f"config.rollout.max_weight_staleness={options.max_weight_staleness} drops "
                     f"every batch of mode {options.mode!r} (staleness >= 1)")
  return options


def check_supported(options: RolloutOptions) -> None:
  """Raises when the run has several processes and a producer mode (module docstring)."""
  if options.uses_producer and jax.process_count() > 1:
    raise ValueError(f"config.rollout.mode={options.mode!r} runs on one process; this run has "
                     f"{jax.process_count()} (use 'sync')")


def check_true_on_policy(sampler_logp, trainer_logp, mask, tol: float) -> dict[str, float]:
  """`|logp_sampler − logp_trainer|` over the completion tokens; raises above `tol`.

  Args:
    sampler_logp: `[rows, T]` the log-probs the sampler recorded.
    trainer_logp: `[rows, T']` the trainer's recomputation, `T' <= T` (trimmed completions).
    mask: `[rows, T]` completion mask.
    tol: largest difference allowed (0: bitwise).

  Returns:
    `{"on_policy_abs_diff_max", "on_policy_abs_diff_mean"}`.
  """
  trainer_logp = np.asarray(trainer_logp, np.float32)
  width = trainer_logp.shape[1]
  sampler_logp = np.asarray(sampler_logp, np.float32)[:, :width]
  valid = np.asarray(mask, bool)[:, :width]
  diff = np.abs(sampler_logp - trainer_logp)[valid]
  worst = float(diff.max(initial=0.0))
  if worst > tol:
    raise RuntimeError(
      f"true on-policy check failed: max |logp_sampler - logp_trainer| = {worst:.3g} over "
      f"{int(valid.sum())} tokens (mean {float(diff.mean()):.3g}) > "
      f"config.rollout.true_on_policy_tol={tol}")
  return {"on_policy_abs_diff_max": worst,
          "on_policy_abs_diff_mean": float(diff.mean()) if diff.size else 0.0}


# ---- Weight sync ----


def buckets_by_size(sizes: Sequence[int], limit: int) -> list[list[int]]:
  """Consecutive leaf indices grouped so that each group's bytes stay within `limit`.

  A leaf larger than `limit` is a bucket of its own. Order is kept (the tree's flat order).

  Example:
    >>> buckets_by_size([4, 4, 4, 10, 1], limit=8)
    [[0, 1], [2], [3], [4]]
  """
  out, current, total = [], [], 0
  for i, size in enumerate(sizes):
    if current and total + size > limit:
      out.append(current)
      current, total = [], 0
    current.append(i)
    total += size
  if current:
    out.append(current)
  return out


class WeightSync:
  """Publishes the trainer's parameters, as versions, in the sampler's layout.

  `publish(params, version)` copies `params` (an `nnx.State` in the trainer's layout) into the
  sampler's (`mesh`, `rules`) bucket by bucket and keeps the copy as the newest version;
  `latest()` returns `(params, version)`. The copy never aliases the trainer's buffers (the
  next update donates them): a leaf whose layout does not change is copied on its devices.
  Thread-safe: the producer reads while the trainer publishes.
  """

  def __init__(self, mesh, rules: Rules, *, bucket_bytes: int, verify: bool = False):
    self.mesh, self.rules = mesh, rules
    self.bucket_bytes, self.verify = int(bucket_bytes), verify
    self._lock = threading.Lock()
    self._latest: tuple[Any, int] | None = None

  def publish(self, params, version: int) -> dict[str, float]:
    """Copies `params` as `version`; returns `time/weight_sync`, `sync/buckets`, `sync/mb`."""
    tic = time.perf_counter()
    targets = state_shardings(params, self.mesh, self.rules)
    leaves, treedef = jax.tree.flatten(params)
    target_leaves = jax.tree.leaves(targets, is_leaf=lambda x: isinstance(x, NamedSharding))
    sizes = [x.nbytes for x in leaves]
    out = [None] * len(leaves)
    groups = buckets_by_size(sizes, self.bucket_bytes)
    for group in groups:
      moved, _ = reshard([leaves[i] for i in group], [target_leaves[i] for i in group])
      for i, new in zip(group, moved):
        # `reshard` hands back a leaf already in its target layout on the same buffers: copy
        # it, or the trainer's next (donating) update would delete the sampler's weights.
        out[i] = (jax.device_put(new, target_leaves[i], may_alias=False)
                  if shares_buffers(new, leaves[i]) else new)
    copy = jax.tree.unflatten(treedef, out)
    jax.block_until_ready(copy)
    seconds = time.perf_counter() - tic
    if self.verify:
      verify_equal(params, copy, version)
    with self._lock:
      self._latest = (copy, version)
    return {"time/weight_sync": seconds, "sync/buckets": float(len(groups)),
            "sync/mb": sum(sizes) / 2**20}

  def latest(self) -> tuple[Any, int]:
    with self._lock:
      if self._latest is None:
        raise RuntimeError("no weights were published yet")
      return self._latest


def shares_buffers(a: jax.Array, b: jax.Array) -> bool:
  """Whether two arrays hold any device buffer in common (one aliases the other)."""
  pointers = {shard.data.unsafe_buffer_pointer() for shard in a.addressable_shards}
  return any(shard.data.unsafe_buffer_pointer() in pointers for shard in b.addressable_shards)


def verify_equal(expected, actual, version: int) -> None:
  """Raises naming the first parameter whose sampler copy differs from the trainer's."""
  paths = jax.tree_util.tree_flatten_with_path(expected)[0]
  for (path, a), b in zip(paths, jax.tree.leaves(actual)):
    if not np.array_equal(np.asarray(jax.device_get(a)), np.asarray(jax.device_get(b))):
      raise RuntimeError(f"weight sync of version {version}: the sampler's "
                         f"{jax.tree_util.keystr(path)} differs from the trainer's")


# ---- The producer and the buffer ----


@dataclasses.dataclass
class GeneratedBatch:
  """One producer call: `records` and their rollout, sampled with weights `version`.

  `rows` holds the rollout's per-row arrays on the host (`[rows, ...]`, record-major, the
  same number of rows per record); `data_state` is the data position before `records` were
  drawn (None for re-drawn prompts of the retry queue).
  """

  index: int
  version: int
  records: list
  rows: dict[str, np.ndarray]
  data_state: Any
  seconds: float


class RolloutProducer:
  """Generates batches ahead of the trainer into a bounded FIFO buffer (module docstring).

  Args:
    draw: `() -> records` of one batch (advances the data iterator).
    data_state: `() -> state` of the data iterator (called right before `draw`).
    generate: `(params, records, index) -> rows` (host arrays, record-major), in the
      producer's thread; `index` is the batch's sequence number (its PRNG stream).
    weights: the `WeightSync` whose newest version each batch is sampled with.
    options: `RolloutOptions` (`ahead`, the staleness bound and `unused`).
    first_index: the sequence number of the first batch (the resumed step).
  """

  def __init__(self, *, draw: Callable[[], list], data_state: Callable[[], Any],
               generate: Callable[[Any, list, int], dict[str, np.ndarray]],
               weights: WeightSync, options: RolloutOptions, first_index: int = 1):
    self.draw, self.data_state, self.generate = draw, data_state, generate
    self.weights, self.options = weights, options
    self._cond = threading.Condition()
    self._buffer: collections.deque[GeneratedBatch] = collections.deque()
    self._retry: collections.deque[list] = collections.deque()
    self._pending: dict[int, Any] = {}  # index → data state, for batches not yet consumed
    self._in_flight = 0
    self._requested = 0  # on-demand batches asked for by `take` (ahead = 0)
    self._next_index = first_index
    # The weights the next batch is sampled with, fixed when the trainer takes a batch (or asks
    # for one): "one_step_off" and on-demand batches are then sampled with the version the
    # trainer held at that moment, however late the producer's thread wakes up.
    self._snapshot: tuple[Any, int] | None = None
    self._error: BaseException | None = None
    self._stop = False
    self.counts = collections.Counter()
    self._thread = threading.Thread(target=self._run, name="rollout-producer", daemon=True)
    self._thread.start()

  # -- producer thread --

  def _room(self) -> bool:
    ahead = self.options.ahead
    held = len(self._buffer) + self._in_flight
    return held < ahead or (ahead == 0 and self._requested > 0 and self._in_flight == 0)

  def _run(self) -> None:
    try:
      while True:
        with self._cond:
          self._cond.wait_for(lambda: self._stop or self._room())
          if self._stop:
            return
          if self.options.ahead == 0:
            self._requested -= 1
          index, self._next_index = self._next_index, self._next_index + 1
          if self._retry:
            records, state = self._retry.popleft(), None
          else:
            state = self.data_state()
            records = self.draw()
            self._pending[index] = state
          self._in_flight += 1
          fixed = self.options.mode == "one_step_off" or self.options.ahead == 0
          params, version = (self._snapshot if fixed and self._snapshot is not None
                             else self.weights.latest())
        tic = time.perf_counter()
        rows = self.generate(params, records, index)
        batch = GeneratedBatch(index, version, records, rows, state, time.perf_counter() - tic)
        with self._cond:
          self._in_flight -= 1
          self._buffer.append(batch)
          self._cond.notify_all()
    except BaseException as e:  # noqa: BLE001 - handed to the trainer's thread by `take`
      with self._cond:
        self._error = e
        self._cond.notify_all()

  # -- trainer thread --

  def take(self, trainer_version: int) -> tuple[GeneratedBatch, float]:
    """The oldest finished batch within the staleness bound, and the seconds waited for it.

    `trainer_version`: the version the trainer holds now (the step's θ_{t−1}). Batches past
    `max_weight_staleness` are dropped or their prompts queued again (`unused`), counted.
    """
    bound = self.options.max_weight_staleness
    tic = time.perf_counter()
    while True:
      with self._cond:
        if self.options.ahead == 0 and not self._buffer and not self._in_flight:
          self._snapshot = self.weights.latest()
          self._requested += 1
          self._cond.notify_all()
        self._cond.wait_for(lambda: self._buffer or self._error is not None)
        if self._error is not None:
          raise RuntimeError("the rollout producer failed") from self._error
        batch = self._buffer.popleft()
        staleness = trainer_version - batch.version
        if bound is not None and staleness > bound:
          self.counts[f"stale_{self.options.unused}"] += 1
          self._pending.pop(batch.index, None)
          if self.options.unused == "retry":
            self._retry.append(batch.records)
          self._snapshot = self.weights.latest()
          self._cond.notify_all()
          continue
        self._pending.pop(batch.index, None)
        self._snapshot = self.weights.latest()
        self._cond.notify_all()
        return batch, time.perf_counter() - tic

  def resume_state(self) -> Any:
    """The data position to restore: before the oldest batch drawn and not consumed."""
    with self._cond:
      if self._pending:
        return self._pending[min(self._pending)]
      return self.data_state()

  def unconsumed(self) -> int:
    """Batches drawn from the data and not consumed (in flight or buffered)."""
    with self._cond:
      return len(self._pending)

  def waiting_records(self) -> tuple[list, list]:
    """`(buffered, retry)`: the records of finished batches not taken yet, and those queued to
    be sampled again."""
    with self._cond:
      return ([r for b in self._buffer for r in b.records],
              [r for records in self._retry for r in records])

  def retry_queued(self) -> int:
    with self._cond:
      return len(self._retry)

  def close(self) -> None:
    """Stops the producer after the batch it is generating (if any)."""
    with self._cond:
      self._stop = True
      self._cond.notify_all()
    self._thread.join()


def concat_rows(parts: Sequence[Mapping[str, np.ndarray]], *,
                left_padded: Sequence[str] = (), pad_values: Mapping[str, Any] | None = None
                ) -> dict[str, np.ndarray]:
  """Concatenates per-row arrays along rows; keys in `left_padded` are left-padded to the
  widest part first (prompts of different length buckets), with `pad_values[key]`."""
  pad_values = dict(pad_values or {})
  out = {}
  for key in parts[0]:
    arrays = [np.asarray(p[key]) for p in parts]
    if key in left_padded:
      width = max(a.shape[1] for a in arrays)
      arrays = [np.pad(a, [(0, 0), (width - a.shape[1], 0)] + [(0, 0)] * (a.ndim - 2),
                       constant_values=pad_values.get(key, 0)) for a in arrays]
    out[key] = np.concatenate(arrays, axis=0)
  return out


def staleness_metrics(stalenesses: Sequence[int]) -> dict[str, float]:
  """`rollout/staleness_{mean,max}` of the batches a step used."""
  values = np.asarray(stalenesses, np.float64)
  return {"rollout/staleness_mean": float(values.mean()) if values.size else 0.0,
          "rollout/staleness_max": float(values.max()) if values.size else 0.0}


def bucket_bytes(options: RolloutOptions) -> int:
  return max(1, math.ceil(options.sync_bucket_mb * 2**20))
