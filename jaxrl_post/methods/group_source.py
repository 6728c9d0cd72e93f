"""Where a GRPO-family step's groups come from when they are not simply "generate now".

`GRPO.step` samples `prompts_per_step` prompts × `group_size` completions with the current
policy. This module builds the two other ways, which share the step's remaining work (the
PPO phase, the hooks, the metrics):

  * **Asynchronous rollouts** (`config.rollout.mode` "one_step_off" / "async",
    `training.async_rollouts`): a producer thread generates batches ahead of the trainer
    with published weight versions; the step takes finished batches from its buffer.
  * **DAPO's dynamic sampling** (arXiv 2503.14476 §3.2; `config.dynamic_sampling.max_rounds`
    > 0): a group whose rewards are all equal has zero advantage under a group baseline and
    only dilutes the batch, so such groups are dropped and more batches are generated until
    `prompts_per_step` informative groups are kept (extra kept groups of the last batch are
    discarded, as verl does); after `max_rounds` batches without enough, the step fails.

`GroupSource.take` returns the step's records, rollout (host arrays, record-major), texts and
verifier outcome exactly as the synchronous step builds them, so everything after is shared.
With `mode="async"` and `max_in_flight=0` (each batch generated on demand, in the producer's
thread, with the newest weights) the run equals the synchronous one step for step (tested).

Batches are numbered (`index`, the key `fold_in(rng, index)` of their sampling): without
dynamic sampling batch t is step t's, the synchronous step's key.

**Rollout admission** (`config.rollout.admission` a policy of `sampling.admission`, MISA-T
arXiv 2608.11152; default "none" = the paths above, unchanged): each batch's prompts are
drawn through a `RolloutScheduler` on a mixture task (`tasks.mixture`), whose domains are
the workload classes. A prompt is a session whose KV footprint is its group's
`(prompt tokens + max_new_tokens) × group_size` in blocks of `config.admission.block_tokens`;
the scheduler releases one data batch per epoch into its backlog and admits
`prompts_per_step` sessions under the policy's caps for a KV budget of
`config.admission.kv_blocks` (0: `prompts_per_step ×` the largest footprint), holding the rest
(their demand kept) and filling slots the caps leave free oldest first (a batch has a fixed
shape). Residencies `T̂_b` are the groups' longest completions (decode steps). Metrics:
`admission/held_<domain>` (held after the epoch), `admission/cap_<domain>`,
`admission/forced`, `admission/backlog`, and `admission/tv_consumed_target` (TV of the
domains the trainer consumed from the mixture weights). The scheduler's state (backlog
records included) is checkpointed as of the data position a restart resumes from.

Honest scope: this sampler generates static batches and keeps no prefix cache across
batches, so admission here only changes *which* groups are generated *when* (the batch's
domain mix); the KV-pressure effects the policies exist for are measured in the simulator
(`sampling.serving_sim`, scripts/misa_t_sim.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

from jaxrl_post.methods import dynamic_sampling
from jaxrl_post.parallel import multihost
from jaxrl_post.sampling import Rollout, admission, sampler_process
from jaxrl_post.training import async_rollouts

# The rollout's per-row arrays a step uses (record-major, `group_size` rows per record).
ROW_KEYS = ("prompt_tokens", "prompt_mask", "completion_tokens", "completion_mask", "logp",
            "finish_reason")


def generate_rollout(sampler, params, prompts: Sequence[str], config, rng, *,
                     n_samples: int | None = None, prompt_classes: Sequence[int] | None = None,
                     class_caps: Sequence[int] | None = None) -> Rollout:
  """`n_samples` (default `config.group_size`) completions per prompt, the one place the loop's
  methods sample a step's groups: a static batch (`Sampler.generate`), or continuous batching
  through `config.rollout.num_slots` slots (`Sampler.generate_continuous`, with class caps on
  the slots when given). Both give the same rows, order and keys.

  Raises:
    ValueError: naming `config.rollout.num_slots` when the sampler constrains decoding with a
      grammar (continuous batching does not).
  """
  options = async_rollouts.rollout_options(config)
  kw = dict(n_samples_per_prompt=n_samples or config.group_size,
            max_new_tokens=config.max_new_tokens, temperature=config.temperature,
            top_k=config.top_k, top_p=config.top_p, rng=rng)
  if not options.num_slots:
    return sampler.generate(params, list(prompts), **kw)
  if sampler.grammar is not None:
    raise ValueError(f"config.rollout.num_slots={options.num_slots} (continuous batching) does "
                     "not support constrained decoding (a task grammar); set it to 0")
  return sampler.generate_continuous(
    params, list(prompts), num_slots=options.num_slots, admit_size=options.admit_size or None,
    prompt_classes=prompt_classes, class_caps=class_caps, **kw)


class StepGroups(NamedTuple):
  """One step's groups, as the synchronous step has them after verification."""

  records: list
  rollout: Rollout  # host arrays, `prompts_per_step × group_size` rows
  texts: list[str]
  verified: Any  # `methods.grpo.Verified`
  metrics: dict[str, float]


class GroupSource:
  """Asynchronous rollouts and/or dynamic sampling for a `GRPO` method (module docstring).

  Args:
    method: the running `GRPO` (its `config`, `task`, `sampler`, `runtime`, `objective`,
      `data_iter`, `rng` and `run.placement`).
    options: `training.async_rollouts.RolloutOptions`.
    dynamic: DAPO's dynamic-sampling buffer (`methods.dynamic_sampling`), or None (off).
    draw: `() -> records`, one batch of prompts (the method's `global_records`).
    verify: `(records, texts, group_ids, lengths) -> Verified` on a batch
      (`methods.grpo.verify_groups` with the method's objective and config).
    advantages: `(rewards, group_ids, num_groups, lengths) -> adv` of a reward matrix
      (`methods.grpo.advantages_of`).
  """

  def __init__(self, method, options: async_rollouts.RolloutOptions, *,
               dynamic: dynamic_sampling.DynamicSamplingBuffer | None,
               draw: Callable[[], list], verify: Callable[..., Any],
               advantages: Callable[..., Any]):
    async_rollouts.check_supported(options)
    self.method, self.options, self.dynamic = method, options, dynamic
    self.draw, self.verify, self.advantages = draw, verify, advantages
    self.producer: async_rollouts.RolloutProducer | None = None
    self.weights: async_rollouts.WeightSync | _ProcessWeights | None = None
    self.remote: sampler_process.SamplerProcess | None = None  # `config.rollout.sampler_process`
    self.next_index = 1  # the next batch's number (sync mode; the producer keeps its own)
    self.redrawn = 0  # batches in flight or buffered at the checkpoint a run resumed from
    self.lost_retries = 0  # prompts in the retry queue at that checkpoint
    self.scheduler = build_scheduler(method, options)
    if self.scheduler is not None:
      self._raw_draw, self.draw = draw, self._admitted_draw
      self._lock = threading.Lock()  # the producer's thread and the trainer's share it
      # id(records) -> (session ids, admission metrics, slot caps or None)
      self._batches: dict[int, tuple[list[int], dict[str, float], list[int] | None]] = {}
      self._snapshot: dict[str, Any] | None = None
      self.consumed = np.zeros(len(self.scheduler.classes), np.int64)

  # -- rollout admission --

  def _admitted_draw(self) -> list:
    """One batch through the `RolloutScheduler` (module docstring)."""
    with self._lock:
      records = self.scheduler.next_batch(lambda: [_plain(r) for r in self._raw_draw()])
      if len(self._batches) > 64:  # batches dropped as stale are never taken
        self._batches.pop(next(iter(self._batches)))
      metrics = self.scheduler.metrics()
      caps = (self.scheduler.slot_caps(self.options.num_slots) if self.options.num_slots
              else None)
      if caps is not None:
        metrics.update({f"admission/slot_cap_{c}": float(k)
                        for c, k in zip(self.scheduler.classes, caps)})
      self._batches[id(records)] = (self.scheduler.batch_ids(), metrics, caps)
    return records

  def _complete(self, records, rows: Mapping[str, np.ndarray]) -> None:
    """Closes the batch's sessions: residency = the group's longest completion."""
    info = self._batches.get(id(records))
    if info is None:
      return
    config, tokenizer = self.method.config, self.method.tokenizer
    lengths = np.asarray(rows["completion_mask"]).sum(axis=1).reshape(len(records), -1).max(1)
    block = config.admission.block_tokens
    with self._lock:
      live = [(i, s) for i, s in enumerate(info[0]) if self.scheduler.ledger.class_of(s)]
      self.scheduler.complete(
        [s for _, s in live], residencies=[float(lengths[i]) for i, _ in live],
        footprints=[admission.kv_blocks(
          (len(tokenizer.encode(records[i]["prompt"])) + int(lengths[i]))
          * config.group_size, block) for i, _ in live])

  def _position(self) -> Any:
    """The data iterator's state, with the scheduler's as of the same moment."""
    if self.scheduler is None:
      return self.method.data_iter.get_state()
    with self._lock:
      return {"data": self.method.data_iter.get_state(),
              "admission": self.scheduler.state_dict()}

  def _admission_metrics(self, records) -> dict[str, float]:
    _, metrics, _ = self._batches.pop(id(records), (None, {}, None))
    for record in records:
      self.consumed[self.scheduler.classes.index(self.method.task.domain_of(record))] += 1
    metrics = {k: v for k, v in metrics.items() if k != "admission/tv_consumed_target"}
    metrics["admission/tv_consumed_target"] = admission.mixture_tv(
      self.consumed, self.scheduler.target)
    return metrics

  # -- sampling one batch --

  def _generate(self, params, records: Sequence[Mapping[str, Any]], index: int
                ) -> dict[str, np.ndarray]:
    """`group_size` completions per record with `params` (sampler layout), on the host."""
    config = self.method.config
    classes = caps = None
    info = self._batches.get(id(records)) if self.scheduler is not None else None
    if info is not None and info[2] is not None:
      caps = info[2]
      classes = [self.scheduler.classes.index(self.method.task.domain_of(r)) for r in records]
    rollout = generate_rollout(self.method.sampler, params, [r["prompt"] for r in records],
                               config, jax.random.fold_in(self.method.rng, index),
                               prompt_classes=classes, class_caps=caps)
    rows = multihost.to_host({k: getattr(rollout, k) for k in ROW_KEYS})
    if self.scheduler is not None:
      self._complete(records, rows)
    return rows

  def _generate_remote(self, version: int, records: Sequence[Mapping[str, Any]], index: int
                       ) -> dict[str, np.ndarray]:
    """`_generate` in the sampler process, with weight version `version`."""
    classes = caps = None
    info = self._batches.get(id(records)) if self.scheduler is not None else None
    if info is not None and info[2] is not None:
      caps = info[2]
      classes = [self.scheduler.classes.index(self.method.task.domain_of(r)) for r in records]
    rows = self.remote.generate(version, [r["prompt"] for r in records],
                                jax.random.fold_in(self.method.rng, index),
                                prompt_classes=classes, class_caps=caps)
    if self.scheduler is not None:
      self._complete(records, rows)
    return rows

  def _start_producer(self, state, step: int) -> None:
    placement = self.method.run.placement
    generate = self._generate
    if self.options.sampler_process:
      self.remote = sampler_process.SamplerProcess(
        self.method.config, self.method.model.config, env=dict(self.options.sampler_env or {}),
        keep_versions=self.options.keep_versions)
      self.weights = _ProcessWeights(self.remote)
      generate = self._generate_remote
    else:
      self.weights = async_rollouts.WeightSync(
        placement.sample_mesh, placement.sample_rules,
        bucket_bytes=async_rollouts.bucket_bytes(self.options), verify=self.options.verify_sync)
    self.weights.publish(self.method.policy_params(state.params), version=step - 1)
    self.producer = async_rollouts.RolloutProducer(
      draw=self.draw, data_state=self._position, generate=generate,
      weights=self.weights, options=self.options, first_index=self.next_index)

  def _next_batch(self, state, step: int, timings: dict[str, float]):
    """`(records, rows, staleness)` of the next batch, from the producer or generated now."""
    if self.options.uses_producer:
      if self.producer is None:
        self._start_producer(state, step)
      batch, waited = self.producer.take(trainer_version=step - 1)
      timings["time/wait_rollout"] = timings.get("time/wait_rollout", 0.0) + waited
      # Not a `time/` key: the step's time is the sum of those, and this one overlapped.
      timings.setdefault("rollout/generate_seconds", 0.0)
      timings["rollout/generate_seconds"] += batch.seconds
      self.next_index = batch.index + 1
      return batch.records, batch.rows, step - 1 - batch.version
    records = self.draw()
    params, seconds = self.method.runtime.evaluator.sampler_params(state.params)
    tic = time.perf_counter()
    rows = self._generate(params, records, self.next_index)
    timings["time/reshard"] = timings.get("time/reshard", 0.0) + seconds
    timings["time/generate"] = timings.get("time/generate", 0.0) + time.perf_counter() - tic
    self.next_index += 1
    return records, rows, 0

  # -- the step's groups --

  def take(self, state, step: int, timings: dict[str, float]) -> StepGroups:
    """The step's `prompts_per_step` groups (module docstring).

    Each batch is verified once, as it arrives; with dynamic sampling its informative groups
    (`config.reward_weights`-weighted rewards not all equal) are kept, and the advantages
    are computed over the step's kept groups, as one batch (a batch-level estimator sees the
    step's batch).
    """
    config, method = self.method.config, self.method
    group_size = config.group_size
    rounds, stalenesses = [], []
    while True:
      records, rows, staleness = self._next_batch(state, step, timings)
      stalenesses.append(staleness)
      group_ids = np.repeat(np.arange(len(records), dtype=np.int32), group_size)
      rollout = Rollout(**rows, group_ids=group_ids)
      texts = method.sampler.decode_text(rollout)
      verified = self.verify(records, texts, group_ids, rows["completion_mask"].sum(axis=1))
      rounds.append(StepGroups(records, rollout, texts, verified, {}))
      if self.dynamic is None:
        break
      self.dynamic.add(verified.rewards @ np.asarray(method.objective.reward_weights))
      if self.dynamic.full():
        break
    metrics = async_rollouts.staleness_metrics(stalenesses)
    if self.scheduler is not None:
      metrics.update(self._admission_metrics(records))
    if self.producer is not None:
      metrics.update({f"rollout/{k}": float(v) for k, v in self.producer.counts.items()})
      metrics["rollout/redrawn_after_restart"] = float(self.redrawn)
      metrics["rollout/retry_lost_on_restart"] = float(self.lost_retries)
    if self.dynamic is None:
      return rounds[0]._replace(metrics=metrics)
    selection = self.dynamic.take()
    metrics.update(selection.stats.metrics())
    # The kept groups' rows of each round (prompts of different rounds may have different
    # padded widths: concatenated left-padded to the widest).
    kept = []
    for r, groups in zip(rounds, selection.round_groups):
      index = (groups[:, None] * group_size + np.arange(group_size)).reshape(-1)
      kept.append({k: np.asarray(getattr(r.rollout, k))[index] for k in ROW_KEYS})
    rows = async_rollouts.concat_rows(
      kept, left_padded=("prompt_tokens", "prompt_mask"),
      pad_values={"prompt_tokens": method.sampler.pad_id, "prompt_mask": False})
    records = selection.gather_groups([r.records for r in rounds])
    texts = [t for r in rounds for t in r.texts]
    pick = selection.gather  # kept rows of per-round `[rows_r]` arrays, in arrival order
    rewards = pick([r.verified.rewards for r in rounds])
    failures = [r.verified.failures for r in rounds]
    verified = rounds[0].verified._replace(
      correct=pick([r.verified.correct for r in rounds]),
      format=pick([r.verified.format for r in rounds]),
      failures=failures[0]._replace(errors=sum(f.errors for f in failures),
                                    timeouts=sum(f.timeouts for f in failures)),
      adv=self.advantages(rewards, selection.group_ids, len(records),
                          rows["completion_mask"].sum(axis=1)),
      rewards=rewards)
    rollout = Rollout(**rows, group_ids=selection.group_ids)
    return StepGroups(records, rollout, [texts[i] for i in selection.rows], verified, metrics)

  def after_update(self, state, step: int) -> dict[str, float]:
    """Publishes θ_step to the producer (`time/weight_sync`); nothing in sync mode."""
    if self.weights is None:
      return {}
    return self.weights.publish(self.method.policy_params(state.params), version=step)

  # -- checkpoints --

  def data_state(self) -> Any:
    """The data position a restart resumes from (before the oldest unconsumed batch); with
    admission, the scheduler's state of that moment is kept for `state_dict`."""
    state = self.producer.resume_state() if self.producer is not None else self._position()
    if self.scheduler is None:
      return state
    self._snapshot = state["admission"]
    return state["data"]

  def state_dict(self) -> dict[str, Any]:
    state = {"next_index": self.next_index}
    if self.producer is not None:
      state["retry_queued"] = self.producer.retry_queued()
      state["unconsumed"] = self.producer.unconsumed()
    if self.scheduler is not None:
      if self._snapshot is None:  # `data_state` was not asked first
        self.data_state()
      state["admission"] = self._snapshot
      state["consumed"] = self.consumed.tolist()
      self._snapshot = None
    return state

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    self.next_index = int(state.get("next_index", self.next_index))
    self.lost_retries = int(state.get("retry_queued", 0))
    self.redrawn = int(state.get("unconsumed", 0))
    if self.scheduler is not None and "admission" in state:
      self.scheduler.load_state_dict(state["admission"])
      self.consumed = np.asarray(state["consumed"], np.int64)

  def close(self) -> None:
    if self.producer is not None:
      self.producer.close()
      self.producer = None
    if self.remote is not None:
      self.remote.close()
      self.remote = None


class _ProcessWeights:
  """`WeightSync`'s interface for a sampler process: `publish` sends a version there, and
  `latest()` hands the producer the version number (the weights live in that process)."""

  def __init__(self, remote: sampler_process.SamplerProcess):
    self.remote = remote
    self._lock = threading.Lock()
    self._version: int | None = None

  def publish(self, params, version: int) -> dict[str, float]:
    metrics = self.remote.publish(params, version)
    with self._lock:
      self._version = version
    return metrics

  def latest(self) -> tuple[int, int]:
    with self._lock:
      if self._version is None:
        raise RuntimeError("no weights were published yet")
      return self._version, self._version


def build_group_source(method, options: async_rollouts.RolloutOptions, *,
                       draw: Callable[[], list], verify: Callable[..., Any],
                       advantages: Callable[..., Any]) -> GroupSource | None:
  """The method's `GroupSource`, or None when its step generates synchronously without
  dynamic sampling (the plain path).

  Raises:
    ValueError: naming `config.dynamic_sampling.max_rounds` when it is negative, or the
      `config.rollout.mode` / dynamic sampling of a method whose step is its own (only
      `GRPO.step` takes its groups from here).
  """
  dynamic = dynamic_sampling.DynamicSamplingBuffer.from_config(method.config)
  if not options.uses_producer and dynamic is None and options.admission == "none":
    return None
  if type(method).step.__qualname__ != "GRPO.step":
    raise ValueError(
      f"config.rollout.mode={options.mode!r} / config.dynamic_sampling / "
      f"config.rollout.admission: method {method.name!r} has a step of its own, which does not "
      "take its groups from `methods.group_source`; use mode 'sync', "
      "dynamic_sampling.max_rounds=0 and admission 'none'")
  return GroupSource(method, options, dynamic=dynamic, draw=draw, verify=verify,
                     advantages=advantages)


def true_on_policy_metrics(rollout: Rollout, old_logp, completion_mask, tol: float
                           ) -> dict[str, float]:
  """The true on-policy check (`config.rollout.true_on_policy`; Miles v0.1's
  `--true-on-policy-mode`, whose `train_rollout_logprob_abs_diff` must be exactly 0).

  The log-probs the sampler recorded while decoding (one token at a time, against its KV
  cache, with its copy of the weights) must equal the trainer's recomputation `old_logp`
  (one forward pass over the whole sequence, the update's kernels) within
  `config.rollout.true_on_policy_tol` (0: bitwise), or the step fails loudly. They agree
  bitwise only when both paths run the same kernels in the same precision and blocking:
  measured on CPU with the `tiny` runlocal policy, 0.0 on the 8-device test mesh (each device
  multiplies a few rows), but up to 1.4e-6 (float32) and 1e-5 (bfloat16) on one device, where
  the CPU matmul library blocks a one-token decode step `[rows, d] × [d, f]` differently from
  the full pass `[rows·T, d] × [d, f]` (docs/benchmarks.md). Where they differ, set the
  tolerance, or correct with TIS / IcePop (`config.loss.sampler_correction`).

  Args:
    rollout: the step's rollout (its `logp`, `[rows, T]`).
    old_logp: `[rows, T']` the trainer's log-probs of the same tokens (`T' <= T`, trimmed).
    completion_mask: `[rows, T']` the scored tokens.
    tol: the largest difference allowed.

  Returns:
    `rollout/on_policy_abs_diff_{max,mean}`.
  """
  metrics = async_rollouts.check_true_on_policy(
    multihost.to_host(rollout.logp), multihost.to_host(old_logp), completion_mask, tol)
  return {f"rollout/{k}": v for k, v in metrics.items()}


# `config.admission` keys and defaults (PROPOSAL values, `sampling.admission`).
ADMISSION_DEFAULTS = {"kv_blocks": 0, "block_tokens": 16, "max_releases": 4, "window": 64,
                      "footprint_quantile": 0.9}


def _plain(record: Mapping[str, Any]) -> dict[str, Any]:
  """A record with numpy scalars as Python values (the scheduler's state is JSON)."""
  return {k: v.item() if isinstance(v, np.generic) else v for k, v in record.items()}


def build_scheduler(method, options: async_rollouts.RolloutOptions
                    ) -> admission.RolloutScheduler | None:
  """The `RolloutScheduler` of `config.rollout.admission` (None for "none"; module docstring).

  Raises:
    ValueError: naming `config.rollout.admission` for a task without domains (not a
      mixture), or the `config.admission.*` key that is out of range.
  """
  if options.admission == "none":
    return None
  config, task = method.config, method.task
  if not hasattr(task, "domains") or not hasattr(task, "domain_of"):
    raise ValueError(f"config.rollout.admission={options.admission!r} needs a task with "
                     f"workload classes (config.task='mixture'), got {config.task!r}")
  section = config.get("admission") or {}
  unknown = sorted(set(section) - set(ADMISSION_DEFAULTS))
  if unknown:
    raise ValueError(f"config.admission has unknown key(s) {unknown}; valid: "
                     f"{sorted(ADMISSION_DEFAULTS)}")
  knobs = {k: section.get(k, v) for k, v in ADMISSION_DEFAULTS.items()}
  if knobs["kv_blocks"] < 0:
    raise ValueError(f"config.admission.kv_blocks={knobs['kv_blocks']} must be >= 0 (0: auto)")
  block = int(knobs["block_tokens"])
  weights = task.weights
  classes = tuple(d for d in task.domains if weights[d] > 0)
  tokenizer = method.tokenizer

  def footprint_of(record) -> int:
    prompt = len(tokenizer.encode(record["prompt"]))
    return admission.kv_blocks((prompt + config.max_new_tokens) * config.group_size, block)

  prior = admission.kv_blocks(
    (config.get("prompt_len", 0) + config.max_new_tokens) * config.group_size, block)
  capacity = knobs["kv_blocks"] or config.prompts_per_step * prior
  return admission.RolloutScheduler(
    options.admission, classes=classes, target={c: weights[c] for c in classes},
    batch_size=config.prompts_per_step, capacity=capacity, classify=task.domain_of,
    footprint_of=footprint_of, prior_footprint={c: prior for c in classes},
    prior_residency={c: float(config.max_new_tokens) for c in classes},
    max_releases=int(knobs["max_releases"]), window=int(knobs["window"]),
    footprint_quantile=float(knobs["footprint_quantile"]))
