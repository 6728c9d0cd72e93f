"""RecoverFly's failure buffer and two-stage curriculum: a Python reference of the buffer rule on
random streams, golden curriculum probabilities, the mixed batch, the loader's resumable draws."""

import doctest

import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from jaxrl_post.methods import failure_replay
from jaxrl_post.methods.failure_replay import (
  FailureReplay,
  curriculum_probs,
  failure_buffer_init,
  failure_buffer_update,
  failure_priorities,
  mixed_batch,
)
from jaxrl_post.tasks.aerial_nav import AerialNavTask


def test_doctests():
  assert doctest.testmod(failure_replay).failed == 0


def _reference_update(slots, tasks, rates, step, tau, n, lam):
  """The module docstring's rule, one observation at a time, on a list of dict slots."""
  for task, rate in zip(tasks, rates):
    if np.isnan(rate):
      continue
    failed = rate <= tau
    hit = [s for s in slots if s["valid"] and s["task"] == task]
    if hit:
      s = hit[0]
      if failed:
        s["failures"] += 1
      else:
        s["solves"] += 1
        if s["solves"] >= n:
          s["valid"] = False
      continue
    if not failed:
      continue
    free = [i for i, s in enumerate(slots) if not s["valid"]]
    if free:
      i = free[0]
    else:  # lowest priority, the oldest on ties
      i = min(range(len(slots)), key=lambda j: (
        slots[j]["failures"] + lam * (step - slots[j]["added"]), slots[j]["added"]))
    slots[i] = dict(task=task, failures=1, solves=0, added=step, valid=True)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_buffer_matches_the_python_reference(seed):
  rng = np.random.default_rng(seed)
  capacity, tau, n, lam = 4, 0.25, 2, 0.5
  buffer = failure_buffer_init(capacity)
  slots = [dict(task=-1, failures=0, solves=0, added=0, valid=False) for _ in range(capacity)]
  for step in range(1, 13):
    tasks = rng.integers(0, 9, 6)
    rates = rng.choice([0.0, 0.25, 0.5, 1.0, np.nan], 6, p=[0.4, 0.1, 0.2, 0.2, 0.1])
    buffer = failure_buffer_update(buffer, jnp.asarray(tasks), jnp.asarray(rates, jnp.float32),
                                   step, tau=tau, evict_after=n, age_weight=lam)
    _reference_update(slots, tasks, rates, step, tau, n, lam)
    valid = np.asarray(buffer.valid)
    assert valid.tolist() == [s["valid"] for s in slots], step
    for key in ("task", "failures", "solves", "added"):
      assert np.asarray(getattr(buffer, key))[valid].tolist() == [
        s[key] for s in slots if s["valid"]], (step, key)


def test_priorities_and_eviction_golden():
  b = failure_buffer_init(3)
  # Step 1: tasks 5 and 6 fail (rate 0); step 2: 5 fails again, 6 is solved once.
  b = failure_buffer_update(b, jnp.array([5, 6]), jnp.array([0.0, 0.0]), 1, evict_after=2)
  b = failure_buffer_update(b, jnp.array([5, 6]), jnp.array([0.0, 1.0]), 2, evict_after=2)
  assert b.task.tolist()[:2] == [5, 6] and b.failures.tolist()[:2] == [2, 1]
  assert b.solves.tolist()[:2] == [0, 1] and b.valid.tolist() == [True, True, False]
  # p = failures + 0.25·(4 − added): 2 + 0.75, 1 + 0.75, 0 (empty).
  assert failure_priorities(b, 4, age_weight=0.25).tolist() == [2.75, 1.75, 0.0]
  b = failure_buffer_update(b, jnp.array([6]), jnp.array([0.5]), 3, evict_after=2)
  assert b.valid.tolist() == [True, False, False]  # two solves: evicted


def test_curriculum_two_stages_golden():
  # Pool: scene 0 × 6, scene 1 × 3, scene 2 × 1 (f = 0.6, 0.3, 0.1).
  scenes = np.array([0] * 6 + [1] * 3 + [2])
  stage1 = curriculum_probs(scenes, 3, switch_step=4, alpha=0.5)
  np.testing.assert_allclose(stage1, np.full(10, 0.1))  # ∝ frequency: uniform over tasks
  stage2 = curriculum_probs(scenes, 4, switch_step=4, alpha=0.5)
  q = np.sqrt([0.6, 0.3, 0.1]) / np.sqrt([0.6, 0.3, 0.1]).sum()
  per_scene = [stage2[scenes == s].sum() for s in range(3)]
  np.testing.assert_allclose(per_scene, q)
  np.testing.assert_allclose(stage2[:6], q[0] / 6)
  assert per_scene[2] > 0.1  # the tail scene gains mass
  with pytest.raises(ValueError, match="alpha"):
    curriculum_probs(scenes, 1, switch_step=1, alpha=1.5)


def test_mixed_batch_draws_replay_first_without_duplicates():
  rng = np.random.default_rng(0)
  tasks = np.array([3, 7, 9, -1])
  prio = np.array([1.0, 2.0, 0.5, 0.0])
  idx, n = mixed_batch(rng, tasks, prio, np.full(20, 0.05), 8, rho=0.25)
  assert n == 2 and set(idx[:2]) <= {3, 7, 9} and len(set(idx.tolist())) == 8
  idx, n = mixed_batch(rng, tasks, prio, np.full(20, 0.05), 8, rho=1.0)
  assert n == 3  # capped by the live buffer entries
  assert mixed_batch(rng, tasks, np.zeros(4), np.full(20, 0.05), 8, rho=0.5)[1] == 0
  # Frequencies: task 7 (priority 2 of 3.5) is replayed most often.
  counts = np.zeros(10)
  for _ in range(400):
    idx, _ = mixed_batch(rng, tasks, prio, np.full(20, 0.05), 4, rho=0.25)
    counts[idx[0]] += 1
  np.testing.assert_allclose(counts[[3, 7, 9]] / 400, [1 / 3.5, 2 / 3.5, 0.5 / 3.5], atol=0.07)
  with pytest.raises(ValueError, match="rho_fail"):
    mixed_batch(rng, tasks, prio, np.full(20, 0.05), 4, rho=2.0)


def _config(**knobs):
  section = dict(capacity=8, tau=0.0, evict_after=1, age_weight=0.1, rho_fail=0.5,
                 switch_step=3, alpha=0.3)
  section.update(knobs)
  return ml_collections.ConfigDict(dict(num_train_examples=48, prompts_per_step=4, seed=0,
                                        recoverfly=section))


def test_part_loader_replays_failures_and_resumes_exactly():
  task = AerialNavTask(num_train=48)
  part = FailureReplay(_config(), task)
  first = next(part.loader)
  assert part.last_replayed == 0  # empty buffer
  # The first two prompts fail in every rollout, the other two succeed (group size 2).
  metrics = part.observe(first["index"], np.array([0, 0, 0, 0, 1, 1, 1, 1.0]), 2, 1)
  assert metrics["failure/buffer_size"] == 2.0
  saved, state = part.array_state(), part.loader.get_state()
  second = next(part.loader)
  assert part.last_replayed == 2 and set(second["index"][:2]) == set(first["index"][:2])
  # A fresh part restored from the saved arrays and loader state draws the same batch.
  again = FailureReplay(_config(), task)
  again.load_array_state(saved)
  again.loader.set_state(state)
  np.testing.assert_array_equal(next(again.loader)["index"], second["index"])
  # Solving a replayed task evicts it and counts it as recovered.
  metrics = part.observe(second["index"], np.ones(8), 2, 2)
  assert metrics["failure/recovered_total"] == 2.0 and metrics["failure/revisit_success"] == 1.0
  for key, value in [("tau", 1.0), ("rho_fail", -0.1), ("capacity", 0), ("alpha", 2.0)]:
    with pytest.raises(ValueError, match=f"config.recoverfly.{key}"):
      FailureReplay(_config(**{key: value}), task)
