"""Tests for the task-sampling priors (TrajVal, CANOPY group sizing, RAPO R-Bucket)."""

import doctest
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxrl_post.tasks import priors
from jaxrl_post.tasks.priors import (
  TASK_PRIORS,
  bucket_probs,
  check_group_size,
  combine_with_online,
  endpoint_rewards,
  min_group_size,
  risk_buckets,
  sample_tasks,
  signal_coverage,
  trajval_scores,
  trajval_weights,
  uniform_prior,
)


def test_doctests():
  assert doctest.testmod(priors, raise_on_error=True).attempted >= 15


# ----------------------------------------------------------------------------- TrajVal


def _np_trajval(r_e, r_l, gamma, floor):
  """Loop reference of the TrajVal prior."""
  v = [(1 - e) * max(0.0, l - e) for e, l in zip(r_e, r_l)]
  vmax = max(v)
  w = []
  for vi in v:
    c = (vi / vmax) ** gamma if vmax > 0 else 0.0
    w.append(max(c, floor))
  total = sum(w)
  return np.array([x / total for x in w])


def test_trajval_scores_by_hand():
  r_e = jnp.array([0.0, 0.25, 0.5, 0.75, 1.0])
  r_l = jnp.array([0.5, 0.75, 0.25, 1.0, 1.0])
  # (1 − r_e)·max(0, r_l − r_e): 1·0.5, 0.75·0.5, 0.5·0, 0.25·0.25, 0.
  np.testing.assert_allclose(trajval_scores(r_e, r_l), [0.5, 0.375, 0.0, 0.0625, 0.0])


def test_trajval_weights_by_hand_default_gamma_floor():
  r_e = jnp.array([0.0, 0.5, 0.5, 1.0])
  r_l = jnp.array([1.0, 0.75, 0.5, 1.0])
  # v = [1, 0.125, 0, 0]; w = [1, 0.125^0.3, 0.05, 0.05].
  w = np.array([1.0, 0.125**0.3, 0.05, 0.05])
  np.testing.assert_allclose(trajval_weights(r_e, r_l), w / w.sum(), rtol=1e-6)
  assert 0.125**0.3 == pytest.approx(0.5359, abs=1e-4)


def test_trajval_weights_floor_and_gamma():
  r_e = jnp.array([0.0, 0.0, 0.0])
  r_l = jnp.array([1.0, 0.01, 0.0])  # v = [1, 0.01, 0]
  # γ = 1: 0.01 is under the floor 0.05, so tasks 1 and 2 share the floor.
  p1 = trajval_weights(r_e, r_l, gamma=1.0)
  np.testing.assert_allclose(p1, np.array([1.0, 0.05, 0.05]) / 1.1, rtol=1e-6)
  # γ = 0.3: 0.01^0.3 ≈ 0.251 lifts task 1 above the floor (compression flattens the prior).
  p03 = trajval_weights(r_e, r_l)
  np.testing.assert_allclose(p03, np.array([1.0, 0.01**0.3, 0.05]) / (1.05 + 0.01**0.3),
                             rtol=1e-6)
  assert p03[1] > p1[1]
  # The floored task keeps floor × the top task's probability.
  assert float(p03[2] / p03[0]) == pytest.approx(0.05, rel=1e-6)


def test_trajval_weights_matches_loop_reference_and_sums_to_one():
  rng = np.random.default_rng(0)
  r_e = rng.uniform(size=64)
  r_l = np.clip(r_e + rng.normal(scale=0.3, size=64), 0, 1)
  for gamma, floor in ((0.3, 0.05), (1.0, 0.1), (0.5, 0.2)):
    p = trajval_weights(r_e, r_l, gamma=gamma, floor=floor)
    np.testing.assert_allclose(p, _np_trajval(r_e, r_l, gamma, floor), rtol=1e-5, atol=1e-7)
    assert float(jnp.sum(p)) == pytest.approx(1.0, abs=1e-6)


def test_trajval_all_zero_scores_is_uniform():
  # No task improved (or every task was already solved): the prior is uniform, not NaN.
  p = trajval_weights(jnp.array([0.5, 1.0, 0.2, 0.9]), jnp.array([0.5, 1.0, 0.1, 0.3]))
  np.testing.assert_allclose(p, np.full(4, 0.25), rtol=1e-6)


def test_trajval_under_jit():
  r_e = jnp.array([0.0, 0.5, 0.5, 1.0])
  r_l = jnp.array([1.0, 0.75, 0.5, 1.0])
  f = jax.jit(lambda a, b, g: trajval_weights(a, b, gamma=g, floor=0.05))
  np.testing.assert_allclose(f(r_e, r_l, 0.3), trajval_weights(r_e, r_l), rtol=1e-6)
  np.testing.assert_allclose(f(r_e, r_l, 1.0), _np_trajval(r_e, r_l, 1.0, 0.05), rtol=1e-6)


def test_trajval_errors():
  with pytest.raises(ValueError, match="r_early"):
    trajval_weights(jnp.array([0.0, 1.5]), jnp.array([0.0, 1.0]))
  with pytest.raises(ValueError, match="r_late"):
    trajval_weights(jnp.array([0.0, 0.5]), jnp.array([-0.1, 1.0]))
  with pytest.raises(ValueError, match="r_late"):
    trajval_weights(jnp.array([0.0, 0.5]), jnp.array([0.0, jnp.nan]))
  with pytest.raises(ValueError, match="r_late"):
    trajval_weights(jnp.array([0.0, 0.5]), jnp.array([0.0, 0.5, 1.0]))
  with pytest.raises(ValueError, match="r_early"):
    trajval_weights(jnp.zeros((2, 2)), jnp.zeros((2, 2)))
  with pytest.raises(ValueError, match="r_early"):
    trajval_scores(jnp.zeros((0,)), jnp.zeros((0,)))
  with pytest.raises(ValueError, match="gamma"):
    trajval_weights(jnp.zeros(2), jnp.ones(2), gamma=0.0)
  with pytest.raises(ValueError, match="floor"):
    trajval_weights(jnp.zeros(2), jnp.ones(2), floor=0.0)
  with pytest.raises(TypeError):
    trajval_weights(jnp.zeros(2), jnp.ones(2), 0.3)  # gamma is keyword-only.


def test_endpoint_rewards():
  rewards = jnp.array([[1.0, 0.0, 1.0, 1.0], [0.0, 0.0, 0.0, 1.0], [1.0, 1.0, 0.0, 0.0]])
  valid = jnp.array([[True] * 4, [True, True, False, False], [False] * 4])
  out = endpoint_rewards(rewards, valid)
  np.testing.assert_allclose(out[:2], [0.75, 0.0])
  assert np.isnan(out[2])
  np.testing.assert_allclose(endpoint_rewards(rewards), [0.75, 0.25, 0.5])
  with pytest.raises(ValueError, match="rewards"):
    endpoint_rewards(jnp.array([[2.0, 0.0]]))
  with pytest.raises(ValueError, match="valid"):
    endpoint_rewards(rewards, valid[:, :2])
  with pytest.raises(ValueError, match="rewards"):
    endpoint_rewards(jnp.ones(4))


def test_combine_with_online():
  p = combine_with_online(jnp.array([0.2, 0.3, 0.5, 0.0]), jnp.array([2.0, 1.0, 1.0, 5.0]))
  np.testing.assert_allclose(p, np.array([0.4, 0.3, 0.5, 0.0]) / 1.2, rtol=1e-6)
  # An online scheduler that gives every task 0 leaves the prior alone.
  p = combine_with_online(jnp.zeros(3), jnp.array([1.0, 1.0, 2.0]))
  np.testing.assert_allclose(p, [0.25, 0.25, 0.5])
  with pytest.raises(ValueError, match="w has shape"):
    combine_with_online(jnp.ones(3), jnp.ones(2))
  with pytest.raises(ValueError, match="p_online"):
    combine_with_online(-jnp.ones(3), jnp.ones(3))


# ----------------------------------------------------------------------------- CANOPY


def test_signal_coverage_spec_examples():
  # p = 0.05 gives 34% at n = 8 and 81% at n = 32.
  assert round(float(signal_coverage(0.05, 8)) * 100) == 34
  assert round(float(signal_coverage(0.05, 32)) * 100) == 81
  assert float(signal_coverage(0.05, 8)) == pytest.approx(1 - 0.05**8 - 0.95**8, rel=1e-6)
  # p = 0.5, n = 2: half the groups are mixed. Degenerate p gives no signal.
  np.testing.assert_allclose(signal_coverage(jnp.array([0.5, 0.0, 1.0]), 2), [0.5, 0.0, 0.0])
  np.testing.assert_allclose(jax.jit(signal_coverage)(0.05, jnp.array([8.0, 32.0])),
                             [1 - 0.05**8 - 0.95**8, 1 - 0.05**32 - 0.95**32], atol=1e-6)
  with pytest.raises(ValueError, match="p must"):
    signal_coverage(1.2, 8)
  with pytest.raises(ValueError, match="n must"):
    signal_coverage(0.5, 0)


def test_min_group_size():
  # log(0.2)/log(0.95) = 31.38 → 32 (CANOPY's n = 32 at p ≈ 0.05).
  assert min_group_size(0.05) == 32
  assert min_group_size(0.05, target=0.34) == 9  # log(0.66)/log(0.95) = 8.10
  assert min_group_size(0.5) == 3  # First-order floor: ⌈2.32⌉.
  assert min_group_size(0.5, exact=True) == 4  # P_sig(0.5, 3) = 0.75 < 0.8 ≤ 0.875.
  for p in (0.01, 0.05, 0.2, 0.5, 0.9):
    for tau in (0.5, 0.8, 0.95):
      n = min_group_size(p, target=tau, exact=True)
      assert 1 - p**n - (1 - p) ** n >= tau
      assert n == 1 or 1 - p ** (n - 1) - (1 - p) ** (n - 1) < tau
      floor = min_group_size(p, target=tau)
      assert 1 - (1 - p) ** floor >= tau - 1e-12 and 1 - (1 - p) ** (floor - 1) < tau
  with pytest.raises(ValueError, match="p_min"):
    min_group_size(0.0)
  with pytest.raises(ValueError, match="p_min"):
    min_group_size(1.0)
  with pytest.raises(ValueError, match="target"):
    min_group_size(0.05, target=1.0)


def test_check_group_size():
  assert check_group_size(32, 0.05) == pytest.approx(0.806, abs=1e-3)
  assert check_group_size(64, 0.05) > 0.96
  with pytest.raises(ValueError, match=r"group_size=8 .*0\.337.*group_size >= 32.*0\.806"):
    check_group_size(8, 0.05)
  with pytest.raises(ValueError, match="group_size"):
    check_group_size(3, 0.5, exact=True)
  assert check_group_size(3, 0.5) == pytest.approx(0.75)  # The first-order floor allows it.
  with pytest.raises(ValueError, match="group_size"):
    check_group_size(0, 0.05)
  with pytest.raises(ValueError, match="p_min"):
    check_group_size(8, 0.0)


# ----------------------------------------------------------------------------- RAPO


def _np_bucket_probs(rho, probs, u):
  """Loop reference: quantile cuts, per-bucket mass over non-empty buckets, uniform mix."""
  n = len(rho)
  q1, q2 = np.quantile(rho, [1 / 3, 2 / 3])
  b = [int(r > q1) + int(r > q2) for r in rho]
  count = [b.count(k) for k in range(3)]
  mass = [probs[k] if count[k] else 0.0 for k in range(3)]
  total = sum(mass)
  return np.array([(1 - u) * mass[bi] / total / count[bi] + u / n for bi in b]), b


def test_risk_buckets_and_probs_by_hand():
  rho = jnp.array([0.9, 0.1, 0.5, 0.2, 0.7, 0.4])
  assert risk_buckets(rho).tolist() == [2, 0, 1, 0, 2, 1]
  p = bucket_probs(rho)
  # Two tasks per bucket: 0.8·(0.80/2) + 0.2/6 etc.
  low, mid, high = 0.8 * 0.4 + 0.2 / 6, 0.8 * 0.075 + 0.2 / 6, 0.8 * 0.025 + 0.2 / 6
  np.testing.assert_allclose(p, [high, low, mid, low, high, mid], rtol=1e-6)
  assert float(p.sum()) == pytest.approx(1.0, abs=1e-6)


def test_buckets_on_ties():
  # All equal: one (low) bucket, which must carry all the non-uniform mass.
  rho = jnp.full((5,), 0.3)
  assert risk_buckets(rho).tolist() == [0] * 5
  np.testing.assert_allclose(bucket_probs(rho), np.full(5, 0.2), rtol=1e-6)
  # Ties at the top: q1 = q2 = 0.9 and ties go to the lower bucket, so all are "low".
  rho = jnp.array([0.1, 0.9, 0.9, 0.9, 0.9])
  assert risk_buckets(rho).tolist() == [0] * 5
  # Ties in the middle empty the medium bucket: low and high share the mass 0.80 : 0.05.
  rho = jnp.array([0.0, 0.5, 0.5, 0.5, 0.5, 1.0])
  b = risk_buckets(rho).tolist()
  assert b == [0, 0, 0, 0, 0, 2]
  p = bucket_probs(rho)
  want, want_b = _np_bucket_probs(np.asarray(rho), (0.8, 0.15, 0.05), 0.2)
  assert want_b == b
  np.testing.assert_allclose(p, want, rtol=1e-6)
  assert float(p.sum()) == pytest.approx(1.0, abs=1e-6)
  np.testing.assert_allclose(p[:5], 0.8 * (0.8 / 0.85) / 5 + 0.2 / 6, rtol=1e-6)


def test_bucket_probs_matches_loop_reference_and_knobs():
  rng = np.random.default_rng(1)
  rho = rng.uniform(size=40)
  for probs, u in (((0.8, 0.15, 0.05), 0.2), ((0.5, 0.3, 0.2), 0.0), ((1.0, 0.0, 0.0), 1.0)):
    want, _ = _np_bucket_probs(rho, probs, u)
    got = bucket_probs(rho, probs=probs, uniform_mix=u)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert float(got.sum()) == pytest.approx(1.0, abs=1e-5)
  f = jax.jit(lambda r, u: bucket_probs(r, uniform_mix=u))
  np.testing.assert_allclose(f(rho, 0.2), _np_bucket_probs(rho, (0.8, 0.15, 0.05), 0.2)[0],
                             rtol=1e-5)


def test_bucket_errors():
  with pytest.raises(ValueError, match="probs"):
    bucket_probs(jnp.ones(3), probs=(0.5, 0.5))
  with pytest.raises(ValueError, match="probs"):
    bucket_probs(jnp.ones(3), probs=(0.5, -0.5, 1.0))
  with pytest.raises(ValueError, match="uniform_mix"):
    bucket_probs(jnp.ones(3), uniform_mix=1.5)
  with pytest.raises(ValueError, match="rho"):
    risk_buckets(jnp.zeros((0,)))


# ----------------------------------------------------------------------------- registry, sampling


def test_registry():
  assert TASK_PRIORS.names() == ["rapo_bucket", "trajval", "uniform"]
  assert TASK_PRIORS.get("trajval") is trajval_weights
  np.testing.assert_allclose(TASK_PRIORS.get("uniform")(4), [0.25] * 4)
  with pytest.raises(KeyError, match="trajval"):
    TASK_PRIORS.get("trajvall")
  with pytest.raises(ValueError, match="num_tasks"):
    uniform_prior(0)


def test_sample_tasks():
  probs = jnp.array([0.7, 0.2, 0.1, 0.0])
  draws = sample_tasks(jax.random.key(0), probs, 20000)
  assert draws.dtype == jnp.int32 and draws.shape == (20000,)
  freq = np.bincount(np.asarray(draws), minlength=4) / 20000
  np.testing.assert_allclose(freq, [0.7, 0.2, 0.1, 0.0], atol=0.015)
  no_rep = sample_tasks(jax.random.key(1), probs, 3, replace=False)
  assert sorted(no_rep.tolist()) == [0, 1, 2]
  with pytest.raises(ValueError, match="num"):
    sample_tasks(jax.random.key(0), probs, 5, replace=False)
  with pytest.raises(ValueError, match="probs"):
    sample_tasks(jax.random.key(0), jnp.zeros(3), 2)


def test_sharded_matches_single_device():
  assert jax.device_count() == 8, "tests/conftest.py should give 8 fake CPU devices"
  rng = np.random.default_rng(2)
  r_e = jnp.asarray(rng.uniform(size=64), jnp.float32)
  r_l = jnp.asarray(np.clip(np.asarray(r_e) + rng.normal(scale=0.3, size=64), 0, 1), jnp.float32)
  rho = jnp.asarray(rng.uniform(size=64), jnp.float32)

  @jax.jit
  def both(a, b, r):
    return trajval_weights(a, b), bucket_probs(r)

  single = both(r_e, r_l, rho)
  mesh = Mesh(np.array(jax.devices()), ("data",))
  rows = NamedSharding(mesh, P("data"))
  sharded = [jax.device_put(x, rows) for x in (r_e, r_l, rho)]
  assert len(sharded[0].sharding.device_set) == 8
  for got, want in zip(both(*sharded), single):
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-8)
  assert math.isclose(float(single[0].sum()), 1.0, abs_tol=1e-5)
