"""advantages/coverage.py: leave-one-out coverage (max match, distinct basins), duplicate
down-weighting and the coverage-aware z-score, against brute force and hand examples; jit;
sharded == single device."""

import doctest

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxrl_post.advantages import coverage as cov
from jaxrl_post.advantages.outcome import group_advantages


def test_doctests():
  assert doctest.testmod(cov).failed == 0


def _brute_max(r, g, empty=0.0):
  out = np.zeros_like(r)
  for i in range(len(r)):
    members = [j for j in range(len(r)) if g[j] == g[i]]
    others = [r[j] for j in members if j != i]
    out[i] = max(r[j] for j in members) - (max(others) if others else empty)
  return out


def _brute_basins(b, g):
  out = np.zeros(len(b))
  for i in range(len(b)):
    members = [j for j in range(len(b)) if g[j] == g[i]]
    full = {b[j] for j in members if b[j] >= 0}
    without = {b[j] for j in members if j != i and b[j] >= 0}
    out[i] = len(full) - len(without)
  return out


def _batch(seed, n=24, groups=4):
  rng = np.random.default_rng(seed)
  g = rng.integers(0, groups, n).astype(np.int32)  # rows of a group scattered over the batch
  r = np.round(rng.uniform(0, 1, n) * 4) / 4  # ties on purpose
  basins = rng.integers(-1, 3, n).astype(np.int32)
  return r.astype(np.float32), g, basins


def test_only_the_unique_max_gets_credit_by_hand():
  g = jnp.array([0, 0, 0, 1, 1, 2])
  r = jnp.array([0.9, 0.4, 0.1, 0.6, 0.6, 0.3])
  out = cov.loo_max_coverage(r, g, num_groups=3)
  # group 0: 0.9 − 0.4; group 1: a tie (removing one keeps 0.6); group 2: alone, 0.3 − Cov(∅)
  np.testing.assert_allclose(out, [0.5, 0.0, 0.0, 0.0, 0.0, 0.3], atol=1e-7)
  # Σ_i R^cov_i over a group ≤ Cov(G) (zero-sum-like: credit only for the marginal part)
  assert float(out[:3].sum()) <= 0.9


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_max_and_basins_match_brute_force(seed):
  r, g, b = _batch(seed)
  np.testing.assert_allclose(cov.loo_max_coverage(r, g, num_groups=4), _brute_max(r, g),
                             atol=1e-6)
  np.testing.assert_allclose(cov.loo_basin_coverage(b, g, num_basins=3, num_groups=4),
                             _brute_basins(b, g))
  sizes = cov.cluster_sizes(b, g, num_clusters=3, num_groups=4)
  want = [1 if b[i] < 0 else np.sum((g == g[i]) & (b == b[i])) for i in range(len(b))]
  np.testing.assert_array_equal(sizes, want)
  # Σ over a group of the basin credits = its number of singleton basins
  for k in range(4):
    singles = sum(1 for v in set(b[g == k]) if v >= 0 and np.sum(b[g == k] == v) == 1)
    assert float(np.sum(np.asarray(cov.loo_basin_coverage(b, g, num_basins=3))[g == k])) == singles


def test_duplicates_get_no_coverage_and_are_down_weighted():
  g = jnp.zeros(4, jnp.int32)
  basins = jnp.array([0, 0, 0, 1])  # three duplicates of basin 0, one lone basin-1 sample
  assert cov.loo_basin_coverage(basins, g, num_basins=2).tolist() == [0, 0, 0, 1]
  sizes = cov.cluster_sizes(basins, g, num_clusters=2)
  assert sizes.tolist() == [3, 3, 3, 1]
  r = jnp.array([0.9, 0.9, 0.9, 0.4])
  plain = cov.coverage_advantages(r, jnp.zeros(4), g, eta=0.0)
  dedup = cov.coverage_advantages(r, jnp.zeros(4), g, eta=0.0, cluster_size=sizes)
  assert plain[3] < 0 < dedup[3]  # 0.4 beats 0.9 / 3 once duplicates share their reward


@pytest.mark.parametrize("seed", [3, 4])
def test_coverage_advantages_is_the_zscore_of_the_combined_reward(seed):
  r, g, b = _batch(seed)
  c = cov.loo_max_coverage(r, g, num_groups=4)
  sizes = cov.cluster_sizes(b, g, num_clusters=3, num_groups=4)
  adv = np.asarray(cov.coverage_advantages(r, c, g, eta=0.7, cluster_size=sizes, num_groups=4))
  u = r / np.asarray(sizes) + 0.7 * np.asarray(c)
  for k in range(4):
    rows = g == k
    if rows.sum():
      want = (u[rows] - u[rows].mean()) / (u[rows].std() + 1e-4)
      np.testing.assert_allclose(adv[rows], want, rtol=1e-5, atol=1e-5)
      assert abs(adv[rows].sum()) < 1e-4  # zero-sum per group
  # η = 0 without clusters: plain GRPO advantages
  np.testing.assert_allclose(
    cov.coverage_advantages(r, c, g, eta=0.0, num_groups=4),
    group_advantages(r, g, num_groups=4, eps=1e-4, ddof=0), atol=1e-6)


def test_registry_and_errors():
  r, g, b = _batch(5)
  for kind, want in (("max_match", _brute_max(r, g)), ("basins", _brute_basins(b, g))):
    np.testing.assert_allclose(cov.marginal_coverage(kind, r, b, g, num_basins=3), want,
                               atol=1e-6)
  with pytest.raises(KeyError, match="unknown coverage 'volume'; valid names: basins, max_match"):
    cov.marginal_coverage("volume", r, b, g, num_basins=3)
  with pytest.raises(ValueError, match="num_clusters=0 must be >= 1"):
    cov.cluster_sizes(b, g, num_clusters=0)


def test_sharded_matches_single_device():
  assert jax.device_count() == 8, "tests/conftest.py should give 8 fake CPU devices"
  r, g, b = _batch(6, n=32)
  mesh = Mesh(np.array(jax.devices()), ("data",))
  rows = NamedSharding(mesh, P("data"))

  @jax.jit
  def fn(r, g, b):
    c = cov.marginal_coverage("max_match", r, b, g, num_basins=3, num_groups=4)
    s = cov.cluster_sizes(b, g, num_clusters=3, num_groups=4)
    return cov.coverage_advantages(r, c + cov.loo_basin_coverage(b, g, num_basins=3,
                                                                 num_groups=4), g, eta=0.5,
                                   cluster_size=s, num_groups=4)

  one = jax.devices()[0]
  single = fn(*[jax.device_put(a, one) for a in (r, g, b)])
  sharded = [jax.device_put(a, rows) for a in (r, g, b)]
  assert len(sharded[0].sharding.device_set) == 8
  np.testing.assert_allclose(fn(*sharded), single, rtol=1e-6, atol=1e-6)
