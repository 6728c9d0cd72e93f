"""Advantage estimators: golden values, NaN handling, TRL/Tunix parity, sharding, no recompile."""

import doctest
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxrl_post import advantages
from jaxrl_post.advantages import (
    ADVANTAGES,
    combine_rewards,
    contiguous_group_ids,
    group_advantages,
    rloo_advantages,
)

# Two interleaved groups of 3 (rows of a group are not contiguous):
#   group 0 = rows 0, 1, 3: R = [1, 0, 5], μ = 2, deviations [−1, −2, 3], Σ dev² = 14
#   group 1 = rows 2, 4, 5: R = [0, 3, 3], μ = 2, deviations [−2, 1, 1],  Σ dev² = 6
REWARDS = np.array([1.0, 0.0, 0.0, 5.0, 3.0, 3.0], np.float32)
GIDS = np.array([0, 0, 1, 0, 1, 1], np.int32)
DEV = np.array([-1.0, -2.0, -2.0, 3.0, 1.0, 1.0])


@functools.partial(jax.jit, static_argnames=("name", "num_groups", "std", "ddof", "eps"))
def _adv(rewards, gids, weights=None, *, name="grpo", **kw):
  return ADVANTAGES.get(name)(rewards, gids, reward_weights=weights, **kw)


def test_registry():
  assert {'batch_std', 'drgrpo', 'grpo', 'rloo'} <= set(ADVANTAGES.names())
  with pytest.raises(KeyError, match="unknown advantage 'gae'; valid names: .*batch_std"):
    ADVANTAGES.get("gae")


@pytest.mark.parametrize("name", ["grpo", "batch_std", "drgrpo", "rloo"])
def test_every_estimator_takes_the_methods_keywords(name):
  # What `methods.grpo.verify_groups` passes to whichever estimator the config names.
  out = ADVANTAGES.get(name)(REWARDS, GIDS, num_groups=4, eps=1e-6,
                             reward_weights=jnp.ones((1,), jnp.float32))
  assert out.shape == REWARDS.shape[:1] and np.all(np.isfinite(out))


@pytest.mark.parametrize("ddof, std", [
    (1, [np.sqrt(7.0)] * 2 + [np.sqrt(3.0)] + [np.sqrt(7.0)] + [np.sqrt(3.0)] * 2),  # 14/2, 6/2
    (0, [np.sqrt(14 / 3)] * 2 + [np.sqrt(2.0)] + [np.sqrt(14 / 3)] + [np.sqrt(2.0)] * 2),
])
def test_grpo_golden_bessel_and_population(ddof, std):
  # A = dev / (σ_g + ε); with ε = 0.1 the ε is visible (a bug dropping it would fail at 1e-6).
  out = _adv(REWARDS, GIDS, ddof=ddof, eps=0.1)
  np.testing.assert_allclose(out, DEV / (np.array(std) + 0.1), rtol=1e-6)


def test_batch_std_drgrpo_rloo_golden():
  # batch σ (ddof 1) of R: mean 2, Σ dev² = 1+4+4+9+1+1 = 20 → σ = √(20/5) = 2.
  np.testing.assert_allclose(_adv(REWARDS, GIDS, name="batch_std", eps=0.0), DEV / 2.0, rtol=1e-6)
  np.testing.assert_allclose(_adv(REWARDS, GIDS, name="drgrpo"), DEV, rtol=1e-6)
  # RLOO: A_i = R_i − (S_g − R_i)/(n−1) = n/(n−1)·dev_i = 1.5·dev.
  np.testing.assert_allclose(_adv(REWARDS, GIDS, name="rloo"), 1.5 * DEV, rtol=1e-6)


def test_degenerate_groups_give_zero():
  # All-equal group → σ = 0 → A = 0 (no 0/0); a singleton group → 0 for every estimator.
  rewards = np.array([2.0, 2.0, 2.0, 7.0], np.float32)
  gids = np.array([0, 0, 0, 1], np.int32)
  for name in ("grpo", "drgrpo", "rloo", "batch_std"):
    out = _adv(rewards, gids, name=name)
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out[:3], 0.0, atol=1e-6)
  for name in ("grpo", "drgrpo", "rloo"):
    assert float(_adv(rewards, gids, name=name)[3]) == 0.0


def test_nan_rewards_are_missing():
  # Two reward functions with weights [1, 0.5]; NaN = missing.
  per_func = np.array([[1.0, np.nan],     # → 1
                       [np.nan, 2.0],     # → 1
                       [np.nan, np.nan],  # → no reward: A = 0, reported, left out of μ/σ
                       [3.0, 2.0]],       # → 4
                      np.float32)
  weights = np.array([1.0, 0.5], np.float32)
  combined = jax.jit(combine_rewards)(per_func, weights)
  np.testing.assert_allclose(combined.reward, [1.0, 1.0, np.nan, 4.0])
  assert combined.valid.tolist() == [True, True, False, True]
  # One group: valid R = [1, 1, 4], μ = 2, dev [−1, −1, 2], σ (ddof 1) = √3.
  out = _adv(per_func, np.zeros(4, np.int32), weights, eps=0.0)
  np.testing.assert_allclose(out, np.array([-1, -1, 0, 2]) / np.sqrt(3.0), rtol=1e-6)
  # RLOO over the 3 valid rows: A = 1.5·dev.
  out = _adv(per_func, np.zeros(4, np.int32), weights, name="rloo")
  np.testing.assert_allclose(out, [-1.5, -1.5, 0.0, 3.0], rtol=1e-6)


def test_contiguous_group_ids():
  assert contiguous_group_ids(6, 2).tolist() == [0, 0, 1, 1, 2, 2]
  with pytest.raises(ValueError, match="not a multiple"):
    contiguous_group_ids(5, 2)


# ------------------------------------------------------------------------------------------------
# Independent numpy references of the anchors (anchor_frameworks.md §e.1–e.2).


def trl_advantages(per_func, weights, group_size, scale_rewards="group", eps=1e-4):
  """TRL sum_then_normalize: weighted nansum, group nanmean, nanstd (Bessel), NaN → 0."""
  rewards = np.nansum(per_func * weights, axis=1)
  grouped = rewards.reshape(-1, group_size)
  mean = np.repeat(np.nanmean(grouped, axis=1), group_size)
  adv = rewards - mean
  if scale_rewards == "group":
    adv = adv / (np.repeat(np.nanstd(grouped, axis=1, ddof=1), group_size) + eps)
  elif scale_rewards == "batch":
    adv = adv / (np.nanstd(rewards, ddof=1) + eps)
  return np.nan_to_num(adv, nan=0.0)


def tunix_advantages(rewards, group_size, estimator):
  """Tunix: grpo = (r − μ_g)/(σ_g(ddof=1) + 1e-6); drgrpo = r − μ_g; rloo = r − LOO mean."""
  g = rewards.reshape(-1, group_size)
  if estimator == "grpo":
    out = (g - g.mean(1, keepdims=True)) / (g.std(1, ddof=1, keepdims=True) + 1e-6)
  elif estimator == "drgrpo":
    out = g - g.mean(1, keepdims=True)
  else:
    out = g - (g.sum(1, keepdims=True) - g) / (group_size - 1)
  return out.reshape(-1)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_trl_parity(scale):
  rng = np.random.default_rng(0)
  per_func = rng.integers(0, 3, size=(12, 2)).astype(np.float32)
  per_func[[1, 5, 9], 0] = np.nan  # missing entries (never a whole row: TRL would count it as 0)
  weights = np.array([1.0, 0.3], np.float32)
  name = {"group": "grpo", "batch": "batch_std", "none": "drgrpo"}[scale]
  ours = _adv(per_func, contiguous_group_ids(12, 4), weights, name=name, eps=1e-4)
  np.testing.assert_allclose(ours, trl_advantages(per_func, weights, 4, scale), rtol=1e-5,
                             atol=1e-6)


@pytest.mark.parametrize("name", ["grpo", "drgrpo", "rloo"])
def test_tunix_parity(name):
  rewards = np.random.default_rng(1).normal(size=12).astype(np.float32)
  kw = {} if name == "rloo" else dict(eps=1e-6)
  ours = _adv(rewards, contiguous_group_ids(12, 3), name=name, **kw)
  np.testing.assert_allclose(ours, tunix_advantages(rewards.astype(np.float64), 3, name),
                             rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------------------
# Sharding and compilation.


def test_sharded_groups_split_across_devices():
  # 16 rows on 8 devices (2 per device); group g = rows {g, g+4, g+8, g+12}, so every group is
  # spread over 4 devices and its statistics need cross-device sums.
  rng = np.random.default_rng(2)
  rewards = rng.normal(size=(16, 2)).astype(np.float32)
  rewards[5, 0] = np.nan
  gids = (np.arange(16) % 4).astype(np.int32)
  mesh = Mesh(np.array(jax.devices()), ("data",))
  rows = NamedSharding(mesh, P("data"))
  for name in ("grpo", "batch_std", "rloo"):
    fn = jax.jit(functools.partial(ADVANTAGES.get(name), num_groups=4))
    single = fn(jax.device_put(rewards, jax.devices()[0]), jax.device_put(gids, jax.devices()[0]))
    sharded_rewards = jax.device_put(rewards, rows)
    assert len(sharded_rewards.addressable_shards) == 8
    sharded = fn(sharded_rewards, jax.device_put(gids, rows))
    np.testing.assert_allclose(sharded, single, rtol=1e-5, atol=1e-6)
    # Same numbers as the rows laid out group by group on one device.
    order = np.argsort(gids, kind="stable")
    contiguous = ADVANTAGES.get(name)(rewards[order], gids[order], num_groups=4)
    np.testing.assert_allclose(np.asarray(sharded)[order], contiguous, rtol=1e-5, atol=1e-6)


def test_no_recompilation():
  fn = jax.jit(functools.partial(group_advantages, num_groups=4))
  gids = contiguous_group_ids(8, 2)
  for seed in (0, 1):
    jax.block_until_ready(fn(jnp.asarray(np.random.default_rng(seed).normal(size=8)), gids))
  assert fn._cache_size() == 1
  loo = jax.jit(rloo_advantages)
  for seed in (0, 1):
    jax.block_until_ready(loo(jnp.asarray(np.random.default_rng(seed).normal(size=8)), gids))
  assert loo._cache_size() == 1


def test_doctests():
  assert doctest.testmod(advantages.outcome).failed == 0
