"""REINFORCE++ / REINFORCE++-baseline: hand-computed values, a token-level numpy reference of
verl's whitening, NaN rows, one-row groups, jit, sharding and the registry."""

import doctest
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxrl_post.advantages import (
  ADVANTAGES,
  reinforce_pp,
  reinforce_pp_advantages,
  reinforce_pp_baseline_advantages,
)

# Two interleaved groups of 3: group 0 = rows 0, 1, 3 (R = 1, 0, 5; mean 2),
# group 1 = rows 2, 4, 5 (R = 0, 4, 4; mean 8/3).
REWARDS = np.array([1.0, 0.0, 0.0, 5.0, 4.0, 4.0], np.float32)
GIDS = np.array([0, 0, 1, 0, 1, 1], np.int32)
LENGTHS = np.array([3.0, 1.0, 2.0, 4.0, 1.0, 5.0], np.float32)


def verl_token_whiten(x_rows, lengths, eps=1e-8):
  """verl's masked_whiten of a per-row scalar broadcast to its `lengths[i]` tokens: token mean,
  Bessel-corrected token variance, (x − μ)·rsqrt(var + eps); returns each row's token value."""
  width = int(max(lengths))
  mask = (np.arange(width)[None, :] < np.asarray(lengths)[:, None]).astype(np.float64)
  values = np.asarray(x_rows, np.float64)[:, None] * mask
  n = mask.sum()
  mean = (values * mask).sum() / n
  var = (((values - mean) ** 2) * mask).sum() / n * n / (n - 1)
  whitened = (values - mean) / np.sqrt(var + eps) * mask
  return whitened[np.arange(len(x_rows)), 0]


def group_mean_baseline(rewards, gids):
  """verl's REINFORCE++-baseline group mean: unweighted over rows, 0 for a one-row group."""
  out = np.array(rewards, np.float64)
  for g in np.unique(gids):
    rows = gids == g
    out[rows] -= rewards[rows].mean() if rows.sum() > 1 else 0.0
  return out


def test_registry_names_and_method_keywords():
  assert {"reinforce_pp", "reinforce_pp_baseline"} <= set(ADVANTAGES.names())
  assert ADVANTAGES.get("reinforce_pp") is reinforce_pp_advantages
  assert ADVANTAGES.get("reinforce_pp_baseline") is reinforce_pp_baseline_advantages
  for name in ("reinforce_pp", "reinforce_pp_baseline"):
    # What `methods.grpo.verify_groups` passes to whichever estimator the config names.
    out = ADVANTAGES.get(name)(jnp.asarray(REWARDS[:, None]), jnp.asarray(GIDS), num_groups=2,
                               eps=1e-6, reward_weights=jnp.ones((1,), jnp.float32))
    assert out.shape == (6,) and out.dtype == jnp.float32 and np.all(np.isfinite(out))


def test_reinforce_pp_golden_by_hand():
  # μ = 14/6 = 7/3; deviations [−4, −7, −7, 8, 5, 5]/3; Σ dev² = 228/9; Bessel σ² = 228/45.
  dev = np.array([-4.0, -7.0, -7.0, 8.0, 5.0, 5.0]) / 3.0
  out = reinforce_pp_advantages(REWARDS, GIDS, eps=0.0)
  np.testing.assert_allclose(out, dev / np.sqrt(228 / 45), rtol=1e-6)
  # ε goes under the square root (0.5 is large enough that dropping it would fail).
  out = reinforce_pp_advantages(REWARDS, GIDS, eps=0.5, ddof=0)
  np.testing.assert_allclose(out, dev / np.sqrt(228 / 54 + 0.5), rtol=1e-6)


def test_reinforce_pp_baseline_golden_by_hand():
  # x = R − group mean: group 0 → [−1, −2, 3]; group 1 → [−8, 4, 4]/3. Σx = 0 so μ = 0;
  # Σ x² = 1 + 4 + 9 + (64 + 16 + 16)/9 = 14 + 32/3 = 74/3; Bessel σ² = 74/15.
  x = np.array([-1.0, -2.0, -8 / 3, 3.0, 4 / 3, 4 / 3])
  out = reinforce_pp_baseline_advantages(REWARDS, GIDS, num_groups=2, eps=0.0)
  np.testing.assert_allclose(out, x / np.sqrt(74 / 15), rtol=1e-6)


@pytest.mark.parametrize("name", ["reinforce_pp", "reinforce_pp_baseline"])
def test_token_counts_equal_verl_token_whitening(name):
  rng = np.random.default_rng(0)
  rewards = rng.integers(0, 3, size=12).astype(np.float32)
  gids = np.repeat(np.arange(3), 4).astype(np.int32)
  lengths = rng.integers(1, 9, size=12).astype(np.float32)
  x = rewards if name == "reinforce_pp" else group_mean_baseline(rewards, gids)
  ours = ADVANTAGES.get(name)(rewards, gids, num_groups=3, eps=1e-8, token_counts=lengths)
  np.testing.assert_allclose(ours, verl_token_whiten(x, lengths), rtol=1e-5, atol=1e-6)
  # Per-row weighting is the same whitening with every row one token long.
  ours = ADVANTAGES.get(name)(rewards, gids, num_groups=3, eps=1e-8)
  np.testing.assert_allclose(ours, verl_token_whiten(x, np.ones(12)), rtol=1e-5, atol=1e-6)


def test_token_weights_change_the_statistics():
  weighted = reinforce_pp_advantages(REWARDS, GIDS, eps=0.0, token_counts=LENGTHS)
  # Token-weighted μ = Σ L·R / Σ L = (3 + 20 + 4 + 20) / 16 = 47/16.
  mean = 47 / 16
  var = np.sum(LENGTHS * (REWARDS - mean) ** 2) / (LENGTHS.sum() - 1)
  np.testing.assert_allclose(weighted, (REWARDS - mean) / np.sqrt(var), rtol=1e-5)


def test_nan_rows_are_left_out():
  rewards = np.array([[1.0, np.nan], [np.nan, np.nan], [0.0, 1.0], [2.0, 0.0]], np.float32)
  weights = np.array([1.0, 0.5], np.float32)  # combined: [1, missing, 0.5, 2]
  out = reinforce_pp_advantages(rewards, np.zeros(4, np.int32), eps=0.0, reward_weights=weights)
  valid = np.array([1.0, 0.5, 2.0])
  expected = (valid - valid.mean()) / valid.std(ddof=1)
  np.testing.assert_allclose(out, [expected[0], 0.0, expected[1], expected[2]], rtol=1e-6)
  # Baseline: one group of the 3 valid rows; the missing row does not enter its mean.
  out = reinforce_pp_baseline_advantages(rewards, np.zeros(4, np.int32), eps=0.0,
                                         reward_weights=weights)
  np.testing.assert_allclose(out, [expected[0], 0.0, expected[1], expected[2]], rtol=1e-6)
  # The missing row's token count is ignored too.
  out = reinforce_pp_advantages(rewards, np.zeros(4, np.int32), eps=0.0, reward_weights=weights,
                                token_counts=np.array([1.0, 100.0, 1.0, 1.0], np.float32))
  np.testing.assert_allclose(out, [expected[0], 0.0, expected[1], expected[2]], rtol=1e-6)


def test_one_row_group_keeps_its_reward_and_degenerate_batches_are_zero():
  # Group 1 has one row: baseline 0 (verl), so its x is the raw reward 5.
  rewards = np.array([1.0, 3.0, 5.0], np.float32)
  out = reinforce_pp_baseline_advantages(rewards, np.array([0, 0, 1], np.int32), num_groups=2,
                                         eps=0.0)
  x = np.array([-1.0, 1.0, 5.0])
  np.testing.assert_allclose(out, (x - x.mean()) / x.std(ddof=1), rtol=1e-6)
  for fn in (reinforce_pp_advantages, reinforce_pp_baseline_advantages):
    # Every reward equal, a single row, or nothing valid: zeros, never NaN (also with ε = 0).
    for r in (np.full(4, 2.0, np.float32), np.array([3.0], np.float32),
              np.full(3, np.nan, np.float32)):
      out = fn(r, np.zeros(len(r), np.int32), eps=0.0)
      assert np.all(np.asarray(out) == 0.0), (fn.__name__, r, out)


def test_jit_and_no_recompilation():
  for fn in (reinforce_pp_advantages, reinforce_pp_baseline_advantages):
    jitted = jax.jit(functools.partial(fn, num_groups=2, eps=1e-6))
    for seed in (0, 1):
      r = np.random.default_rng(seed).normal(size=6).astype(np.float32)
      out = jitted(r, GIDS, token_counts=LENGTHS)
      np.testing.assert_allclose(out, fn(r, GIDS, num_groups=2, eps=1e-6, token_counts=LENGTHS),
                                 rtol=1e-6)
    assert jitted._cache_size() == 1


def test_sharded_batch_equals_single_device():
  rng = np.random.default_rng(2)
  rewards = rng.normal(size=16).astype(np.float32)
  gids = (np.arange(16) % 4).astype(np.int32)  # every group spread over devices
  lengths = rng.integers(1, 9, size=16).astype(np.float32)
  mesh = Mesh(np.array(jax.devices()), ("data",))
  rows = NamedSharding(mesh, P("data"))
  for name in ("reinforce_pp", "reinforce_pp_baseline"):
    fn = functools.partial(ADVANTAGES.get(name), num_groups=4)
    single = fn(rewards, gids, token_counts=lengths)
    sharded = fn(jax.device_put(rewards, rows), jax.device_put(gids, rows),
                 token_counts=jax.device_put(lengths, rows))
    np.testing.assert_allclose(sharded, single, rtol=1e-5, atol=1e-6)


def test_doctests():
  assert doctest.testmod(reinforce_pp).failed == 0


def test_token_weighting_is_a_config_switch_of_the_grpo_family():
  from pathlib import Path

  from jaxrl_post.config_args import load_module
  from jaxrl_post.methods.grpo import advantages_of, policy_objective

  root = Path(__file__).resolve().parents[1]
  config = load_module(root / "configs" / "grpo_arith.py").get_config("runlocal")
  config.advantage, config.advantage_token_weighted = "reinforce_pp_baseline", True
  objective = policy_objective(config)
  rewards = np.array([[1, 1], [0, 0], [1, 0], [0, 1]], np.float32)
  group_ids, lengths = np.array([0, 0, 1, 1]), np.array([3, 5, 2, 7])
  got = advantages_of(objective, rewards, group_ids, 2, config, lengths=lengths)
  want = reinforce_pp_baseline_advantages(
    jnp.asarray(rewards), jnp.asarray(group_ids), num_groups=2, eps=config.advantage_eps,
    reward_weights=objective.reward_weights, token_counts=jnp.asarray(lengths, jnp.float32))
  np.testing.assert_allclose(got, want, rtol=1e-6)
  unweighted = advantages_of(objective._replace(token_weighted=False), rewards, group_ids, 2,
                             config)
  assert not np.allclose(got, unweighted)
  with pytest.raises(ValueError, match="needs the completion lengths"):
    advantages_of(objective, rewards, group_ids, 2, config)
  config.advantage = "grpo"
  with pytest.raises(ValueError, match="config.advantage='grpo' takes no token_counts"):
    policy_objective(config)
