"""Rubric rewards: DRACO dropout / counts / reward / step citations, CARE score and decisions."""

import doctest

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxrl_post.rewards import rubrics
from jaxrl_post.rewards.rubrics import (
    ADAPTIVE,
    CHASE,
    FAIL,
    MISSING,
    NONE,
    NOT_APPLICABLE,
    PASS,
    RUBRIC_REWARDS,
    best_rollout,
    cap_rubrics,
    care_decision,
    check_citations,
    citations_from_lists,
    discriminative_dropout,
    draco_reward,
    draco_rubric_reward,
    rubric_counts,
    step_verdict_counts,
    weighted_rubric_score,
)

# One prompt, three rollouts, four criteria (the last is padding):
#   c0: all pass                → dropped (nobody fails it)
#   c1: rollout 1 fails         → kept
#   c2: rollout 0 fails, 2 N/A  → kept
V = np.array([[[PASS, PASS, FAIL, MISSING],
               [PASS, FAIL, PASS, MISSING],
               [PASS, PASS, NOT_APPLICABLE, MISSING]]], np.int32)
MASK = np.array([[1, 1, 1, 0]])


def _random_verdicts(seed, b=8, g=4, k=5):
  rng = np.random.default_rng(seed)
  v = rng.choice([PASS, FAIL, NOT_APPLICABLE], size=(b, g, k), p=[0.5, 0.2, 0.3])
  num = rng.integers(1, k + 1, size=b)
  mask = (np.arange(k) < num[:, None]).astype(np.int32)
  v = np.where(mask[:, None, :] > 0, v, MISSING).astype(np.int32)
  return v, mask


def _np_dropout_counts(v, mask):
  b_size, g_size, k_size = v.shape
  kept = np.zeros((b_size, k_size), bool)
  for b in range(b_size):
    for c in range(k_size):
      kept[b, c] = bool(mask[b, c]) and any(v[b, g, c] == FAIL for g in range(g_size))
  p = np.zeros((b_size, g_size), int)
  f = np.zeros((b_size, g_size), int)
  for b in range(b_size):
    for g in range(g_size):
      for c in range(k_size):
        if kept[b, c]:
          p[b, g] += v[b, g, c] == PASS
          f[b, g] += v[b, g, c] == FAIL
  return kept, p, f


def test_verdict_codes_distinct():
  assert len({PASS, FAIL, NOT_APPLICABLE, MISSING}) == 4
  assert len({NONE, ADAPTIVE, CHASE}) == 3


def test_draco_golden():
  kept = jax.jit(discriminative_dropout)(V, MASK)
  np.testing.assert_array_equal(kept, [[False, True, True, False]])
  counts = jax.jit(rubric_counts)(V, kept)
  np.testing.assert_array_equal(counts.n_pass, [[1, 1, 1]])
  np.testing.assert_array_equal(counts.n_fail, [[1, 1, 0]])
  r = jax.jit(draco_reward)(counts.n_pass, counts.n_fail)
  np.testing.assert_allclose(r, [[0.0, 0.0, 1.0]])
  np.testing.assert_allclose(draco_rubric_reward(V, MASK), r)
  # Without dropout the all-pass criterion would lift every reward: (1/3, 1/3, 1), not (0, 0, 1).
  full = rubric_counts(V, MASK)
  np.testing.assert_allclose(draco_reward(*full), [[1 / 3, 1 / 3, 1.0]], rtol=1e-6)
  # A criterion that a rollout fails but which is masked out (padding) is not kept.
  np.testing.assert_array_equal(discriminative_dropout(V, [[1, 1, 0, 0]]), [[0, 1, 0, 0]])


def test_draco_reward_zero_when_nothing_counts():
  np.testing.assert_array_equal(draco_reward(jnp.zeros((2, 3)), jnp.zeros((2, 3))), 0.0)
  np.testing.assert_allclose(draco_reward(jnp.array([[3, 0]]), jnp.array([[1, 2]])),
                             [[0.5, -1.0]])


@pytest.mark.parametrize("seed", [0, 1])
def test_dropout_counts_random_match_loops(seed):
  v, mask = _random_verdicts(seed)
  kept, p, f = _np_dropout_counts(v, mask)
  np.testing.assert_array_equal(discriminative_dropout(v, mask), kept)
  counts = rubric_counts(v, kept)
  np.testing.assert_array_equal(counts.n_pass, p)
  np.testing.assert_array_equal(counts.n_fail, f)
  r = np.where(p + f > 0, (p - f) / np.maximum(p + f, 1), 0.0)
  np.testing.assert_allclose(jax.jit(draco_rubric_reward)(v, mask), r, rtol=1e-6)
  # Every kept criterion is failed by someone, so no group is all +1.
  assert (np.asarray(draco_rubric_reward(v, mask)).min(axis=1) < 1).all()


def test_step_verdict_counts_golden():
  # Rollout 0 has 3 steps, rollout 1 has 2 (S = 4); criteria as in V.
  lists = [[[[0], [1, 2], [2]],     # rollout 0: c0 PASS @0, c1 PASS @1,2, c2 FAIL @2
            [[0, 1], [1], [0]],     # rollout 1: c0 PASS @0,1, c1 FAIL @1, c2 PASS @0
            [[], [0], [1]]]]        # rollout 2: c1 PASS @0, c2 N/A (its citation ignored)
  num_steps = np.array([[3, 2, 2]])
  cites = citations_from_lists(lists, num_steps, 4, num_criteria=4)
  assert cites.shape == (1, 3, 4, 4)
  kept = discriminative_dropout(V, MASK)  # c0 dropped
  out = step_verdict_counts(V, cites, kept, num_steps)
  np.testing.assert_array_equal(out.step_pass, [[[0, 1, 1, 0], [1, 0, 0, 0], [1, 0, 0, 0]]])
  np.testing.assert_array_equal(out.step_fail, [[[0, 0, 1, 0], [0, 1, 0, 0], [0, 0, 0, 0]]])
  # All criteria kept: c0's PASS citations count too.
  out = step_verdict_counts(V, cites, MASK, num_steps)
  np.testing.assert_array_equal(out.step_pass, [[[1, 1, 1, 0], [2, 1, 0, 0], [1, 0, 0, 0]]])


def test_step_verdict_counts_random_under_jit():
  rng = np.random.default_rng(3)
  v, mask = _random_verdicts(3)
  b, g, k = v.shape
  s = 6
  num_steps = rng.integers(1, s + 1, size=(b, g))
  cites = (rng.random((b, g, k, s)) < 0.3) & (np.arange(s) < num_steps[..., None, None])
  kept = discriminative_dropout(v, mask)
  out = jax.jit(step_verdict_counts)(v, cites, kept, num_steps)  # tracers: no host check
  eager = step_verdict_counts(v, cites, kept, num_steps)
  sp = np.zeros((b, g, s), int)
  sf = np.zeros((b, g, s), int)
  for bi in range(b):
    for gi in range(g):
      for c in range(k):
        for j in range(s):
          if kept[bi, c] and cites[bi, gi, c, j]:
            sp[bi, gi, j] += v[bi, gi, c] == PASS
            sf[bi, gi, j] += v[bi, gi, c] == FAIL
  for got in (out, eager):
    np.testing.assert_array_equal(got.step_pass, sp)
    np.testing.assert_array_equal(got.step_fail, sf)


def test_citations_out_of_range_raise():
  v = np.array([[[PASS, FAIL]]], np.int32)
  kept = np.ones((1, 2))
  cites = np.zeros((1, 1, 2, 4), bool)
  cites[0, 0, 1, 3] = True  # step 3 of a 3-step rollout
  with pytest.raises(ValueError, match="citations cite step 3"):
    step_verdict_counts(v, cites, kept, np.array([[3]]))
  with pytest.raises(ValueError, match="citations"):
    check_citations(cites, np.array([[3]]))
  check_citations(cites, np.array([[4]]))  # fine with 4 steps
  with pytest.raises(ValueError, match="num_steps"):
    step_verdict_counts(v, cites, kept, np.array([[5]]))
  with pytest.raises(ValueError, match="citations"):
    citations_from_lists([[[[0], [3]]]], [[3]], 4)
  with pytest.raises(ValueError, match="citations"):
    citations_from_lists([[[[-1], []]]], [[3]], 4)
  with pytest.raises(ValueError, match="max_steps"):
    citations_from_lists([[[[0]]]], [[5]], 4)
  with pytest.raises(ValueError, match="lists"):
    citations_from_lists([[[[0]]], [[[0]]]], [[3]], 4)
  with pytest.raises(ValueError, match="num_criteria"):
    citations_from_lists([[[[0], [1]]]], [[3]], 4, num_criteria=1)
  # Inside a caller's jit the host check cannot run: out-of-range citations are dropped.
  out = jax.jit(step_verdict_counts)(v, cites, kept, np.array([[3]]))
  np.testing.assert_array_equal(out.step_fail, 0)


def test_shape_errors():
  with pytest.raises(ValueError, match="verdicts"):
    discriminative_dropout(V[0], MASK)
  with pytest.raises(ValueError, match="verdicts must be integer"):
    discriminative_dropout(V.astype(np.float32), MASK)
  with pytest.raises(ValueError, match="criterion_mask"):
    discriminative_dropout(V, MASK[:, :3])
  with pytest.raises(ValueError, match="kept"):
    rubric_counts(V, MASK[0])
  with pytest.raises(ValueError, match="n_fail"):
    draco_reward(jnp.zeros((1, 3)), jnp.zeros((1, 2)))
  cites = np.zeros((1, 3, 4, 2), bool)
  with pytest.raises(ValueError, match="citations"):
    step_verdict_counts(V, cites[:, :2], MASK, np.ones((1, 3), int))
  with pytest.raises(ValueError, match="num_steps"):
    step_verdict_counts(V, cites, MASK, np.ones((1, 2), int))
  with pytest.raises(ValueError, match="weights"):
    weighted_rubric_score(np.ones((1, 2, 3), bool), np.ones((1, 2)), np.ones((1, 3)))
  with pytest.raises(ValueError, match="criterion_mask"):
    weighted_rubric_score(np.ones((1, 2, 3), bool), np.ones((1, 3)), np.ones((2, 3)))
  with pytest.raises(ValueError, match="passed"):
    weighted_rubric_score(np.ones((2, 3), bool), np.ones((1, 3)), np.ones((1, 3)))
  with pytest.raises(ValueError, match="valid"):
    best_rollout(np.zeros((2, 3)), np.ones((2, 2), bool))
  with pytest.raises(ValueError, match="scores"):
    best_rollout(np.zeros(3))
  with pytest.raises(ValueError, match="anchor_score"):
    care_decision(np.zeros(3), np.zeros(2), np.zeros(3, bool))
  with pytest.raises(ValueError, match="prefers_anchor"):
    care_decision(np.zeros(3), np.zeros(3), np.zeros(2, bool))


# ---------------------------------------------------------------------------------------------
# CARE.
# ---------------------------------------------------------------------------------------------


def test_weighted_rubric_score():
  passed = np.array([[[1, 0, 1, 1], [0, 0, 0, 1], [1, 1, 0, 0]],
                     [[1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 0, 0]]], bool)
  weights = np.array([[2.0, 1.0, 1.0, 9.0], [1.0, 1.0, 1.0, 1.0]])
  mask = np.array([[1, 1, 1, 0], [0, 0, 0, 0]])  # prompt 1 has no criteria: score 0
  s = jax.jit(weighted_rubric_score)(passed, weights, mask)
  np.testing.assert_allclose(s, [[0.75, 0.0, 0.75], [0.0, 0.0, 0.0]], rtol=1e-6)
  rng = np.random.default_rng(5)
  passed = rng.random((8, 4, 6)) < 0.5
  weights = rng.random((8, 6))
  mask = rng.random((8, 6)) < 0.8
  expected = np.zeros((8, 4))
  for b in range(8):
    total = sum(weights[b, c] for c in range(6) if mask[b, c])
    for g in range(4):
      got = sum(weights[b, c] for c in range(6) if mask[b, c] and passed[b, g, c])
      expected[b, g] = got / total if total > 0 else 0.0
  np.testing.assert_allclose(weighted_rubric_score(passed, weights, mask), expected, rtol=1e-5)


def test_best_rollout_and_decision():
  scores = np.array([[0.1, 0.7, 0.7, 0.2], [0.9, 0.3, 0.5, 0.4], [0.5, 0.5, 0.5, 0.5]])
  valid = np.array([[1, 1, 1, 1], [0, 1, 1, 1], [0, 0, 0, 0]], bool)
  top = jax.jit(best_rollout)(scores, valid)
  np.testing.assert_array_equal(top, [1, 2, -1])  # tie → lowest index; invalid skipped
  np.testing.assert_array_equal(best_rollout(scores), [1, 0, 0])
  decide = jax.jit(care_decision)
  np.testing.assert_array_equal(
      decide(np.array([0.8, 0.8, 0.4, 0.9, 0.2]), np.array([0.6, 0.8, 0.6, 0.5, 0.6]),
             np.array([True, True, True, False, False])),
      [ADAPTIVE, ADAPTIVE, CHASE, NONE, NONE])


def test_cap_rubrics():
  crit = ["Cites sources.", "Is concise", "cites  SOURCES", "Uses tables", "Gives code",
          "is concise!", "Mentions risks", "Answers first"]
  w = [1, 2, 3, 4, 5, 6, 7, 8]
  # Default cap 2 × 2 = 4: both originals, then the two newest unique additions.
  out = cap_rubrics(crit, w, initial_count=2)
  assert out.criteria == ["Cites sources.", "Is concise", "Mentions risks", "Answers first"]
  assert out.weights == [1.0, 2.0, 7.0, 8.0]
  out = cap_rubrics(crit, initial_count=2, max_criteria=10)  # only dedup
  assert out.criteria == ["Cites sources.", "Is concise", "Uses tables", "Gives code",
                          "Mentions risks", "Answers first"]
  assert out.weights is None
  assert cap_rubrics(crit, initial_count=2, max_criteria=1).criteria == ["Cites sources."]
  assert cap_rubrics(crit, initial_count=0, max_criteria=2).criteria == ["Mentions risks",
                                                                          "Answers first"]
  for bad in (0, -3):
    with pytest.raises(ValueError, match="max_criteria"):
      cap_rubrics(crit, initial_count=2, max_criteria=bad)
  with pytest.raises(ValueError, match="initial_count"):
    cap_rubrics(crit, initial_count=9)
  with pytest.raises(ValueError, match="weights"):
    cap_rubrics(crit, w[:3], initial_count=2)


def test_registry():
  assert RUBRIC_REWARDS.names() == ["draco", "weighted_pass"]
  assert RUBRIC_REWARDS.get("draco") is draco_reward
  assert RUBRIC_REWARDS.get("weighted_pass") is weighted_rubric_score
  with pytest.raises(KeyError, match="unknown rubric reward 'checklist'; valid names"):
    RUBRIC_REWARDS.get("checklist")


def test_doctests():
  doctest.testmod(rubrics, raise_on_error=True)


def test_sharded_matches_single_device():
  assert jax.device_count() == 8, "tests/conftest.py should give 8 fake CPU devices"
  v, mask = _random_verdicts(7, b=16)
  rng = np.random.default_rng(7)
  weights = rng.random(mask.shape).astype(np.float32)
  mesh = Mesh(np.array(jax.devices()), ("data",))
  rows = NamedSharding(mesh, P("data"))

  @jax.jit
  def pipeline(v, mask, weights):
    kept = discriminative_dropout(v, mask)
    counts = rubric_counts(v, kept)
    reward = draco_reward(*counts)
    score = weighted_rubric_score(v == PASS, weights, mask)
    return kept, counts.n_pass, counts.n_fail, reward, score, best_rollout(score)

  args = (v, mask, weights)
  single = pipeline(*[jax.device_put(a, jax.devices()[0]) for a in args])
  sharded = [jax.device_put(a, rows) for a in args]
  assert len(sharded[0].sharding.device_set) == 8
  for got, want in zip(pipeline(*sharded), single):
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
