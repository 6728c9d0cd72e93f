"""RecoverFly's data side (arXiv 2608.09467; PROPOSAL): a failure-revisiting buffer
and a two-stage long-tail scene curriculum, as one GRPO step part.

The paper names the components ("revisiting unresolved failure cases", "two-stage long-tail
scene curriculum"); their rules are "not found". PROPOSAL rules, every constant a config value
(`config.recoverfly`, configs/recoverfly.py):

Failure buffer (a `FailureBuffer` pytree of `[capacity]` arrays, pure state-in / state-out):
  * after a step, a drawn pool task with group success rate r ≤ τ (`tau`) enters the buffer
    (failures = 1, solves = 0, added = step); a full buffer replaces its lowest-priority entry;
  * a task already in it counts one more failure (r ≤ τ) or one more solve (r > τ); it is
    evicted once solves ≥ n (`evict_after`);
  * priority p_j = failures_j + λ_age·(step − added_j) (`age_weight`); replayed tasks are drawn
    ∝ p_j without replacement.
  `failure_buffer_update` applies a batch of observations in order (a `lax.fori_loop`).

Two-stage curriculum over the pool of N train tasks, each of scene s_i with n_s pool tasks
(empirical scene frequency f_s = n_s / N); the scene distribution q_s ∝ f_s^a with
  a = 1   before `switch_step` (stage 1: ∝ data frequency, consolidates the head)
  a = α   from `switch_step` on (stage 2: α < 1 flattens towards the tail)
spread evenly over the scene's tasks: p_i = q_{s_i} / n_{s_i} (`curriculum_probs`; stage 1 is
then exactly uniform over the pool).

Each step's batch of B prompts (`mixed_batch`): round(ρ·B) (`rho_fail`) tasks from the buffer
(fewer when it holds fewer), the rest from the curriculum without replacement and without the
replayed tasks. The draws come from a generator seeded by `(seed, draw)` (as
`tasks.data.WeightedLoader`), so a resumed run repeats them; the buffer is the part's
checkpointed arrays. Synchronous rollouts only (the buffer must hold the previous step's
outcomes when the next batch is drawn).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_post.tasks import base as task_base
from jaxrl_post.tasks import data as task_data


class FailureBuffer(NamedTuple):
  """Unresolved tasks (pool indices) and their counters, all `[capacity]`."""

  task: jax.Array  # int32, -1 in empty slots
  failures: jax.Array  # int32
  solves: jax.Array  # int32
  added: jax.Array  # int32, the step the task entered
  valid: jax.Array  # bool


def failure_buffer_init(capacity: int) -> FailureBuffer:
  """An empty buffer of `capacity` slots."""
  if capacity < 1:
    raise ValueError(f"capacity must be >= 1, got {capacity}")
  zeros = jnp.zeros(capacity, jnp.int32)
  return FailureBuffer(jnp.full(capacity, -1, jnp.int32), zeros, zeros, zeros,
                       jnp.zeros(capacity, bool))


def failure_priorities(buffer: FailureBuffer, step, *, age_weight: float = 0.0) -> jax.Array:
  """p_j = failures_j + λ_age·(step − added_j) on valid slots, 0 elsewhere; `[capacity]`.

  >>> b = failure_buffer_init(2)._replace(failures=jnp.array([2, 1]), added=jnp.array([1, 3]),
  ...                                     valid=jnp.array([True, True]))
  >>> failure_priorities(b, 5, age_weight=0.5).tolist()  # 2 + 0.5·4, 1 + 0.5·2
  [4.0, 2.0]
  """
  age = (jnp.asarray(step, jnp.int32) - buffer.added).astype(jnp.float32)
  p = buffer.failures.astype(jnp.float32) + age_weight * age
  return jnp.where(buffer.valid, p, 0.0)


@functools.partial(jax.jit, static_argnames=("evict_after",))
def failure_buffer_update(buffer: FailureBuffer, tasks: jax.Array, success_rate: jax.Array,
                          step, *, tau: float = 0.0, evict_after: int = 1,
                          age_weight: float = 0.0) -> FailureBuffer:
  """The buffer after observing `success_rate[b]` (group success rate, NaN: skipped) of pool
  task `tasks[b]` at `step`, in batch order (module docstring).

  Args:
    buffer: the state.
    tasks: `[B]` int pool indices.
    success_rate: `[B]` float in [0, 1] (NaN: the verifier failed; the row is ignored).
    step: the step of the observations.
    tau: the failure threshold τ (r ≤ τ fails).
    evict_after: n, the solves that evict a task.
    age_weight: λ_age of the priority that picks the entry a full buffer replaces.

  >>> b = failure_buffer_init(2)
  >>> b = failure_buffer_update(b, jnp.array([7, 3, 7]), jnp.array([0.0, 0.5, 0.0]), 1)
  >>> b.task.tolist(), b.failures.tolist(), b.valid.tolist()  # 3 solved: not added
  ([7, -1], [2, 0], [True, False])
  >>> b = failure_buffer_update(b, jnp.array([7]), jnp.array([1.0]), 2)  # n = 1 solve: out
  >>> b.valid.tolist()
  [False, False]
  """
  tasks = jnp.asarray(tasks, jnp.int32)
  rates = jnp.asarray(success_rate, jnp.float32)
  step = jnp.asarray(step, jnp.int32)
  if tasks.shape != rates.shape or tasks.ndim != 1:
    raise ValueError(f"tasks {tasks.shape} and success_rate {rates.shape} must both be [B]")

  def one(b, buf: FailureBuffer) -> FailureBuffer:
    task, rate = tasks[b], rates[b]
    observed = ~jnp.isnan(rate)
    failed = observed & (rate <= tau)
    hit = buf.valid & (buf.task == task)
    present = jnp.any(hit)
    # Present: count a failure or a solve; evict after `evict_after` solves.
    failures = buf.failures + (hit & failed).astype(jnp.int32)
    solves = buf.solves + (hit & observed & ~failed).astype(jnp.int32)
    valid = buf.valid & ~(hit & (solves >= evict_after))
    # Absent and failed: the first free slot, else the lowest-priority one (oldest on ties).
    prio = failure_priorities(buf._replace(valid=valid), step, age_weight=age_weight)
    score = jnp.where(valid, prio, -jnp.inf)
    slot = jnp.where(jnp.any(~valid), jnp.argmax(~valid),
                     jnp.argmin(score - 1e-6 * (step - buf.added)))
    insert = (jnp.arange(buf.task.shape[0]) == slot) & failed & ~present
    return FailureBuffer(jnp.where(insert, task, buf.task), jnp.where(insert, 1, failures),
                         jnp.where(insert, 0, solves), jnp.where(insert, step, buf.added),
                         valid | insert)

  return jax.lax.fori_loop(0, tasks.shape[0], one, buffer)


def curriculum_probs(scene_of_task, step: int, *, switch_step: int, alpha: float,
                     num_scenes: int | None = None) -> np.ndarray:
  """p_i = q_{s_i} / n_{s_i} with q_s ∝ f_s^a, a = 1 before `switch_step`, α after (module
  docstring); `scene_of_task [N]` int scene ids of the pool. Returns `[N]` float64.

  >>> curriculum_probs(np.array([0, 0, 0, 1]), 1, switch_step=5, alpha=0.0).tolist()
  [0.25, 0.25, 0.25, 0.25]
  >>> curriculum_probs(np.array([0, 0, 0, 1]), 5, switch_step=5,
  ...                  alpha=0.0).round(4).tolist()  # α = 0: scenes uniform
  [0.1667, 0.1667, 0.1667, 0.5]
  """
  scenes = np.asarray(scene_of_task, np.int64)
  if scenes.ndim != 1 or scenes.size == 0 or scenes.min() < 0:
    raise ValueError("scene_of_task must be a non-empty [N] array of scene ids >= 0")
  if not 0.0 <= alpha <= 1.0:
    raise ValueError(f"config.recoverfly.alpha={alpha} must be in [0, 1]")
  counts = np.bincount(scenes, minlength=num_scenes or 0).astype(np.float64)
  exponent = 1.0 if step < switch_step else float(alpha)
  q = np.where(counts > 0, (counts / counts.sum()) ** exponent, 0.0)
  q /= q.sum()
  return q[scenes] / counts[scenes]


def mixed_batch(rng: np.random.Generator, buffer_tasks: np.ndarray, priorities: np.ndarray,
                probs: np.ndarray, batch_size: int, *, rho: float) -> tuple[np.ndarray, int]:
  """`batch_size` pool indices: round(ρ·B) replayed ∝ priority (capped by the buffer's
  non-zero entries), then the rest ∝ `probs` without replacement and without the replayed ones.

  Returns `(indices [B], number replayed)`; the replayed come first.
  """
  if not 0.0 <= rho <= 1.0:
    raise ValueError(f"config.recoverfly.rho_fail={rho} must be in [0, 1]")
  priorities = np.asarray(priorities, np.float64)
  live = np.flatnonzero(priorities > 0)
  n_fail = min(int(np.floor(rho * batch_size + 0.5)), len(live))
  replayed = np.zeros(0, np.int64)
  if n_fail:
    weights = priorities[live] / priorities[live].sum()
    slots = rng.choice(live, size=n_fail, replace=False, p=weights)
    replayed = np.asarray(buffer_tasks, np.int64)[slots]
  rest = np.asarray(probs, np.float64).copy()
  rest[replayed] = 0.0
  if np.count_nonzero(rest) < batch_size - n_fail:
    raise ValueError(f"the pool has {np.count_nonzero(rest)} drawable tasks besides the "
                     f"replayed ones; a batch needs {batch_size - n_fail}")
  fresh = rng.choice(len(rest), size=batch_size - n_fail, replace=False, p=rest / rest.sum())
  return np.concatenate([replayed, fresh]).astype(np.int64), n_fail


class FailureCurriculumLoader(task_data.WeightedLoader):
  """`WeightedLoader` whose draw `k` (step k + 1) is `mixed_batch` of the owner's buffer and
  the curriculum's `probs` at that step."""

  def __init__(self, source, *, owner, **kwargs):
    self.owner = owner
    super().__init__(source, **kwargs)

  def global_indices(self, draw: int) -> np.ndarray:
    owner = self.owner
    self.set_probs(owner.probs(draw + 1))
    rng = np.random.default_rng([self.seed, draw])
    indices, n_fail = mixed_batch(rng, np.asarray(owner.buffer.task),
                                  np.asarray(owner.priorities(draw + 1)), self.probs,
                                  self.global_batch_size, rho=owner.knobs.rho_fail)
    owner.last_replayed = n_fail
    return indices


class FailureReplay:
  """The `step_parts` part: a `loader` (curriculum + replay) and an `after_update` hook that
  feeds the step's group success rates to the buffer; see the module docstring."""

  KEYS = ("capacity", "tau", "evict_after", "age_weight", "rho_fail", "switch_step", "alpha")

  def __init__(self, config, task):
    knobs = config.recoverfly
    for key in self.KEYS:
      if key not in knobs:
        raise ValueError(f"config.recoverfly.{key} is missing")
    if knobs.capacity < 1 or knobs.evict_after < 1:
      raise ValueError(f"config.recoverfly.capacity={knobs.capacity} and evict_after="
                       f"{knobs.evict_after} must be >= 1")
    if not 0.0 <= knobs.tau < 1.0:
      raise ValueError(f"config.recoverfly.tau={knobs.tau} must be in [0, 1)")
    if not 0.0 <= knobs.rho_fail <= 1.0:
      raise ValueError(f"config.recoverfly.rho_fail={knobs.rho_fail} must be in [0, 1]")
    if not 0.0 <= knobs.alpha <= 1.0:
      raise ValueError(f"config.recoverfly.alpha={knobs.alpha} must be in [0, 1]")
    self.config, self.knobs = config, knobs
    self.pool = task_data.TaskSource(task, "train", config.num_train_examples)
    self.scene = np.asarray([int(task_base.parse_meta(self.pool[i]).get("scene", 0))
                             for i in range(len(self.pool))], np.int64)
    self.buffer = failure_buffer_init(knobs.capacity)
    self.last_replayed = 0
    self.recovered = 0  # tasks evicted as solved, cumulative
    self.loader = FailureCurriculumLoader(self.pool, owner=self,
                                          global_batch_size=config.prompts_per_step,
                                          seed=config.seed)

  def probs(self, step: int) -> np.ndarray:
    return curriculum_probs(self.scene, step, switch_step=self.knobs.switch_step,
                            alpha=self.knobs.alpha)

  def priorities(self, step: int) -> np.ndarray:
    if self.knobs.rho_fail == 0:
      return np.zeros(self.knobs.capacity)
    return np.asarray(failure_priorities(self.buffer, step, age_weight=self.knobs.age_weight))

  def observe(self, tasks, correct, group_size: int, step: int) -> dict[str, float]:
    """Feeds `[B·G]` rewards (record-major) of pool `tasks [B]` to the buffer; success is
    reward ≥ 1 (a shaped reward below 1 is not a success)."""
    success = np.asarray(correct, np.float32).reshape(len(tasks), group_size) >= 1.0 - 1e-6
    nan = np.isnan(np.asarray(correct, np.float32)).reshape(len(tasks), group_size).any(1)
    rates = np.where(nan, np.nan, success.mean(1)).astype(np.float32)
    before = np.asarray(self.buffer.valid).sum()
    was_in = np.isin(tasks, np.asarray(self.buffer.task)[np.asarray(self.buffer.valid)])
    self.buffer = failure_buffer_update(
      self.buffer, jnp.asarray(tasks, jnp.int32), jnp.asarray(rates), step,
      tau=self.knobs.tau, evict_after=self.knobs.evict_after, age_weight=self.knobs.age_weight)
    still = np.isin(tasks, np.asarray(self.buffer.task)[np.asarray(self.buffer.valid)])
    self.recovered += int(np.sum(was_in & ~still))
    metrics = {"failure/buffer_size": float(np.asarray(self.buffer.valid).sum()),
               "failure/buffer_growth": float(np.asarray(self.buffer.valid).sum() - before),
               "failure/replayed": float(self.last_replayed),
               "failure/recovered_total": float(self.recovered)}
    if was_in.any():
      metrics["failure/revisit_success"] = float(np.nanmean(rates[was_in]))
    return metrics

  def after_update(self, method, ctx) -> dict[str, float]:
    tasks = np.asarray([int(r["index"]) for r in ctx.records], np.int64)
    return self.observe(tasks, ctx.verified.correct, method.config.group_size, ctx.step)

  def array_state(self) -> dict[str, Any]:
    return {**{k: np.asarray(v) for k, v in self.buffer._asdict().items()},
            "recovered": np.int64(self.recovered)}

  def load_array_state(self, arrays: Mapping[str, Any]) -> None:
    self.buffer = FailureBuffer(**{k: jnp.asarray(arrays[k]) for k in FailureBuffer._fields})
    self.recovered = int(arrays["recovered"])
