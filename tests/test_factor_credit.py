"""FACTOR's TD action credit (arXiv 2608.07118): telescoping, numpy loops, fallback, errors."""

import doctest

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxrl_post.advantages import factor
from jaxrl_post.advantages.factor import (
  factor_td_credit,
  group_return_stats,
  interpolated_values,
)
from jaxrl_post.advantages.step_credit import STEP_CREDIT


def test_doctests():
  assert doctest.testmod(factor, raise_on_error=True).attempted >= 4


def test_registered():
  assert STEP_CREDIT.get("factor_td") is factor_td_credit


def _batch(seed, b=3, g=4, s=7, terminal_only=True):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(0, s + 1, size=(b, g))
  lengths[0, 0] = s
  lengths[0, 1] = 1
  mask = (np.arange(s) < lengths[..., None]).astype(np.float32)
  if terminal_only:
    ret = rng.integers(0, 2, size=(b, g)).astype(np.float32)
    rewards = np.where(np.arange(s) == lengths[..., None] - 1, ret[..., None], 0.0)
  else:
    rewards = rng.normal(size=(b, g, s)) * mask
  rewards = rewards.astype(np.float32)
  values = rng.uniform(0, 1, size=(b, g, s)).astype(np.float32)
  values = np.where(mask > 0, values, np.nan).astype(np.float32)  # padding junk is ignored
  baseline = rng.uniform(0, 1, size=(b, g)).astype(np.float32)
  return rewards, values, baseline, mask


def _np_td(rewards, values, baseline, mask):
  out = np.zeros(rewards.shape)
  for idx in np.ndindex(*rewards.shape[:-1]):
    n = int(mask[idx].sum())
    vt = [float(baseline[idx])] + [float(values[idx][t]) for t in range(1, n)] + [0.0]
    for t in range(n):
      out[idx][t] = rewards[idx][t] + vt[t + 1] - vt[t]
  return out


@pytest.mark.parametrize("terminal_only", [True, False])
def test_matches_numpy_and_telescopes(terminal_only):
  rewards, values, baseline, mask = _batch(0, terminal_only=terminal_only)
  got = np.asarray(jax.jit(factor_td_credit)(rewards, values, baseline, mask))
  np.testing.assert_allclose(got, _np_td(rewards, values, baseline, mask), rtol=1e-5, atol=1e-6)
  n = mask.sum(-1)
  total = rewards.sum(-1)
  # Σ_t A*_t = G_i − b_i for every rollout with at least one action.
  np.testing.assert_allclose(got.sum(-1)[n > 0], (total - baseline)[n > 0], rtol=1e-5,
                             atol=1e-6)
  np.testing.assert_array_equal(got[mask == 0], 0.0)
  assert np.isfinite(got).all()


def test_golden_one_rollout():
  # b = 0.5, V(x1) = 0.9, V(x2) = 0.2, reward 1 at the last of 3 actions.
  a = factor_td_credit(np.array([[0.0, 0.0, 1.0]]), np.array([[7.0, 0.9, 0.2]]),
                       np.array([0.5]), np.array([[1, 1, 1]]))
  np.testing.assert_allclose(a, [[0.4, -0.7, 0.8]], rtol=1e-6)


def test_std_gives_grpo_advantage():
  rewards, values, _, mask = _batch(1)
  returns = rewards.sum(-1)
  stats = group_return_stats(returns)
  np.testing.assert_allclose(stats.baseline, returns.mean(-1, keepdims=True) + 0 * returns,
                             rtol=1e-6)
  np.testing.assert_allclose(stats.std, returns.std(-1, keepdims=True) + 0 * returns, rtol=1e-6)
  got = np.asarray(factor_td_credit(rewards, values, stats.baseline, mask, std=stats.std))
  grpo = (returns - returns.mean(-1, keepdims=True)) / (returns.std(-1, keepdims=True) + 1e-6)
  n = mask.sum(-1)
  np.testing.assert_allclose(got.sum(-1)[n > 0], grpo[n > 0], rtol=1e-4, atol=1e-5)
  # A group with equal returns (σ = 0) gets no credit at all, not residuals divided by ε.
  flat = stats.std[:, 0] == 0
  assert flat.any() and (~flat).any()
  np.testing.assert_array_equal(got[flat], 0.0)
  assert np.abs(got[~flat]).max() < 10
  # A std of shape [B, 1] broadcasts over the group.
  got_b1 = factor_td_credit(rewards, values, stats.baseline, mask, std=stats.std[:, :1])
  np.testing.assert_allclose(got_b1, got, rtol=1e-6)


@pytest.mark.parametrize("terminal_only", [True, False])
def test_interpolated_values_give_uniform_credit(terminal_only):
  rewards, _, baseline, mask = _batch(2, terminal_only=terminal_only)
  returns = rewards.sum(-1)
  vals = interpolated_values(baseline, returns, mask,
                             None if terminal_only else rewards)
  a = np.asarray(factor_td_credit(rewards, vals, baseline, mask))
  n = mask.sum(-1)
  per_action = np.where(n > 0, (returns - baseline) / np.maximum(n, 1), 0.0)
  np.testing.assert_allclose(a, per_action[..., None] * mask, rtol=1e-5, atol=1e-6)


def test_bad_inputs_raise_naming_the_argument():
  r = np.zeros((2, 3))
  m = np.ones((2, 3))
  with pytest.raises(ValueError, match="values"):
    factor_td_credit(r, np.zeros((2, 4)), np.zeros(2), m)
  with pytest.raises(ValueError, match="baseline"):
    factor_td_credit(r, r, np.zeros(3), m)
  with pytest.raises(ValueError, match="action_mask"):
    factor_td_credit(r, r, np.zeros(2), np.ones((2, 2)))
  with pytest.raises(ValueError, match="action_mask.*prefix"):
    factor_td_credit(r, r, np.zeros(2), np.array([[1, 0, 1], [1, 1, 1]]))
  with pytest.raises(ValueError, match="std"):
    factor_td_credit(r, r, np.zeros(2), m, std=np.ones(3))
  with pytest.raises(ValueError, match="returns"):
    interpolated_values(np.zeros(2), np.zeros(3), m)
  with pytest.raises(ValueError, match="group_valid"):
    group_return_stats(np.zeros((2, 3)), np.ones((2, 2)))


def test_quarantined_rows_leave_group_stats():
  stats = group_return_stats(np.array([[1.0, 0.0, 5.0]]), np.array([[1, 1, 0]]))
  np.testing.assert_allclose(stats.baseline, [[0.5] * 3])
  np.testing.assert_allclose(stats.std, [[0.5] * 3])


def test_sharded_matches_single_device():
  rewards, values, baseline, mask = _batch(3, b=8)
  mesh = Mesh(np.array(jax.devices()), ("data",))
  rows = NamedSharding(mesh, P("data"))

  @jax.jit
  def fn(r, v, b, m):
    stats = group_return_stats(r.sum(-1))
    return factor_td_credit(r, v, b, m, std=stats.std)

  args = (rewards, values, baseline, mask)
  single = fn(*[jax.device_put(a, jax.devices()[0]) for a in args])
  sharded = [jax.device_put(a, rows) for a in args]
  assert len(sharded[0].sharding.device_set) == 8
  np.testing.assert_allclose(fn(*sharded), single, rtol=1e-6, atol=1e-7)
