"""The verifier worker pool: per-sample time-outs that kill a stuck worker, errors, no `fork`.

Workers unpickle the verifiers below by importing this module, so it imports nothing heavy at
the top (`verifiers` and the tasks pull in JAX): they come from fixtures.
"""

import json
import time

import numpy as np
import pytest

from jaxrl_post.rewards import math_answers

# Seconds a pooled call may take beyond its per-sample limit: killing a worker and the IPC
# (a replacement worker starts in the background). Generous: the CI machines are small.
OVERHEAD_S = 3.0
_PARENT_MARKER = None  # Set by a test in this process only; a worker must not see it.


def scripted_verifier(record, text):
  """Right for the record's answer, raises for "boom", never returns for "hang"."""
  if text == "boom":
    raise ZeroDivisionError("verifier bug")
  if text == "hang":
    while True:  # A stuck Python loop: only killing the worker ends it.
      pass
  return float(text == record["answer"]), 1.0


def sees_parent_marker(record, text):
  del record, text
  return float(_PARENT_MARKER is not None), 0.0


class ScriptedTask:
  """A task that opts in to the pool with `scripted_verifier`."""

  def reward(self, record, text):
    raise AssertionError("a pooled task is never scored in process")

  def pooled_verifier(self):
    return scripted_verifier


@pytest.fixture(scope="module")
def verifiers():
  from jaxrl_post.rewards import verifiers

  return verifiers


@pytest.fixture(scope="module")
def warm_pool():
  """The shared pool with every worker started and this module imported in it."""
  pool = math_answers.shared_pool()
  pool.run(scripted_verifier, [({"answer": "x"}, "x")] * 4 * pool.num_workers, timeout_s=None)
  return pool


@pytest.fixture(scope="module")
def math500_task(tmp_path_factory):
  from jaxrl_post.tasks import get_task

  path = tmp_path_factory.mktemp("math500") / "test.jsonl"
  rows = [{"problem": "What is 1?", "solution": "It is $\\boxed{1}$.", "answer": "1",
           "subject": "Prealgebra", "level": 1, "unique_id": "test/prealgebra/1.json"},
          {"problem": "Half of 1?", "solution": "$\\boxed{\\frac{1}{2}}$", "answer": "\\frac12",
           "subject": "Algebra", "level": 2, "unique_id": "test/algebra/2.json"}]
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return lambda **knobs: get_task("math500", path=str(path), **knobs)


def test_stuck_verifier_is_killed_and_scored_wrong(verifiers, warm_pool):
  del warm_pool
  records = [{"answer": "ok"}, {"answer": "ok"}]
  texts = ["ok", "boom", "hang", "no"]  # group_size 2: texts 0-1 record 0, 2-3 record 1
  tic = time.perf_counter()
  correct, fmt, failures = verifiers.rewards_for(ScriptedTask(), records, texts, 2, timeout_s=1.0)
  assert time.perf_counter() - tic < 1.0 + OVERHEAD_S
  # The time-out is wrong (0), not missing; the exception is missing (NaN).
  np.testing.assert_array_equal(correct, [1.0, np.nan, 0.0, 0.0])
  np.testing.assert_array_equal(fmt, [1.0, np.nan, 0.0, 1.0])
  assert failures == verifiers.RewardFailures(errors=1, timeouts=1)
  # The pool replaced the killed worker and keeps working.
  correct, _, failures = verifiers.rewards_for(ScriptedTask(), records, ["ok", "no"], 1,
                                               timeout_s=1.0)
  np.testing.assert_array_equal(correct, [1.0, 0.0])
  assert failures.total == 0


def test_pathological_math_expression_is_cut_at_the_limit(verifiers, warm_pool, math500_task):
  del warm_pool
  task = math500_task()
  records = [task.make_example("test", 0), task.make_example("test", 1)]  # gold 1 and 1/2
  texts = ["\\boxed{9^{9^{9^{9}}}}", "\\boxed{1}", "\\boxed{0.5}", "\\boxed{2}"]
  tic = time.perf_counter()
  correct, fmt, failures = verifiers.rewards_for(task, records, texts, 2, timeout_s=2.0)
  assert time.perf_counter() - tic < 2.0 + OVERHEAD_S
  np.testing.assert_array_equal(correct, [0.0, 1.0, 1.0, 0.0])
  np.testing.assert_array_equal(fmt, [0.0, 1.0, 1.0, 1.0])
  assert failures == verifiers.RewardFailures(errors=0, timeouts=1)


def test_math_verify_soft_limit_counts_as_a_timeout_too(verifiers, warm_pool, math500_task):
  # math_verify's own limit (1 s) fires before the pool's (30 s): the worker survives, and the
  # sample is still counted as a time-out.
  del warm_pool
  task = math500_task(verify_timeout_s=1)
  records = [task.make_example("test", 0)]
  tic = time.perf_counter()
  correct, _, failures = verifiers.rewards_for(task, records, ["\\boxed{9^{9^{9^{9}}}}"], 1,
                                               timeout_s=30.0)
  assert time.perf_counter() - tic < 1.0 + OVERHEAD_S
  np.testing.assert_array_equal(correct, [0.0])
  assert failures == verifiers.RewardFailures(errors=0, timeouts=1)


def test_workers_are_not_forked(warm_pool):
  global _PARENT_MARKER
  assert warm_pool.start_method in ("forkserver", "spawn")
  with pytest.raises(ValueError, match="'fork' would copy"):
    math_answers.VerifierPool(1, start_method="fork")
  # A forked worker would inherit this module's state as it is now; a fresh interpreter (spawn)
  # or a fork of the clean server (forkserver) imports the module anew and sees None.
  _PARENT_MARKER = "set in the parent"
  pool = math_answers.VerifierPool(1)
  try:
    (outcome,) = pool.run(sees_parent_marker, [({}, "")], timeout_s=None)
  finally:
    pool.close()
    _PARENT_MARKER = None
  assert outcome == math_answers.PoolOutcome(value=(0.0, 0.0))


def test_shared_pool_is_reused_and_sized_by_its_knob(warm_pool):
  assert math_answers.shared_pool() is warm_pool
  assert warm_pool.num_workers == math_answers.default_num_workers() <= 4
  with pytest.raises(ValueError, match="num_workers must be >= 1"):
    math_answers.VerifierPool(0)
  resized = math_answers.shared_pool(num_workers=1)
  try:
    assert resized is not warm_pool and resized.num_workers == 1 and not warm_pool.active
  finally:
    math_answers.close_shared_pool()
