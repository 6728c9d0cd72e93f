"""Tests for the contextual linear bandits (LinUCB, linear Thompson sampling)."""

import doctest

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_post import bandits
from jaxrl_post.bandits import (
  BANDITS,
  LinearBanditState,
  lints_select,
  linucb_init,
  linucb_scores,
  linucb_select,
  linucb_update,
)


def test_doctests():
  assert doctest.testmod(bandits, raise_on_error=True).attempted >= 10


def test_init_and_errors():
  s = linucb_init(3, reg=2.0)
  assert isinstance(s, LinearBanditState)
  np.testing.assert_allclose(s.A, 2.0 * np.eye(3))
  assert s.b.shape == (3,) and int(s.count) == 0
  for dim in (0, -1, 2.5):
    with pytest.raises(ValueError, match="dim"):
      linucb_init(dim)
  with pytest.raises(ValueError, match="reg"):
    linucb_init(2, reg=0.0)


def test_select_errors():
  s = linucb_init(3)
  with pytest.raises(ValueError, match="features.*arms"):
    linucb_select(s, jnp.zeros((0, 3)))
  with pytest.raises(ValueError, match="features.*arms"):
    lints_select(s, jnp.zeros((0, 3)), jax.random.key(0))
  with pytest.raises(ValueError, match="features"):
    linucb_select(s, jnp.zeros((2, 4)))
  with pytest.raises(ValueError, match="features"):
    linucb_scores(s, jnp.zeros(3))
  with pytest.raises(ValueError, match="rng"):
    lints_select(s, jnp.eye(3), None)
  with pytest.raises(ValueError, match="x has shape"):
    linucb_update(s, jnp.zeros(2), 1.0)
  with pytest.raises(ValueError, match="gamma"):
    linucb_update(s, jnp.zeros(3), 1.0, gamma=1.5)
  with pytest.raises(ValueError, match="u must"):
    linucb_update(s, jnp.zeros(3), jnp.ones(2))


def test_ucb_formula_by_hand():
  # reg = 1, one update x = (1, 0), u = 2 with γ = 1: A = diag(2, 1), b = (2, 0), θ̂ = (1, 0).
  s = linucb_update(linucb_init(2), jnp.array([1.0, 0.0]), 2.0, gamma=1.0)
  np.testing.assert_allclose(s.A, [[2.0, 0.0], [0.0, 1.0]])
  np.testing.assert_allclose(s.b, [2.0, 0.0])
  assert int(s.count) == 1
  feats = jnp.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
  out = linucb_scores(s, feats, alpha=0.5)
  # mean = xᵀθ̂: 1, 0, 1; width = sqrt(xᵀA⁻¹x): sqrt(1/2), 1, sqrt(3/2).
  width = np.sqrt([0.5, 1.0, 1.5])
  np.testing.assert_allclose(out.mean, [1.0, 0.0, 1.0], atol=1e-6)
  np.testing.assert_allclose(out.width, width, rtol=1e-6)
  np.testing.assert_allclose(out.ucb, np.array([1.0, 0.0, 1.0]) + 0.5 * width, rtol=1e-6)
  np.testing.assert_allclose(out.lcb, np.array([1.0, 0.0, 1.0]) - 0.5 * width, rtol=1e-6)
  assert int(linucb_select(s, feats, alpha=0.5)) == 2  # 1 + 0.61 beats 1 + 0.35.
  assert int(linucb_select(s, feats[:2], alpha=0.0)) == 0  # Greedy on the mean.
  assert int(linucb_select(s, feats, alpha=3.0)) == 2


def test_discounted_update_keeps_prior():
  x = jnp.array([1.0, 0.0])
  s = linucb_init(2, reg=1.0)
  for _ in range(3):
    s = linucb_update(s, x, 1.0, gamma=0.5)
  # Data part D: 1 → 1.5 → 1.75 on the (0, 0) entry; reg·I untouched. b: 1 → 1.5 → 1.75.
  np.testing.assert_allclose(s.A, [[2.75, 0.0], [0.0, 1.0]])
  np.testing.assert_allclose(s.b, [1.75, 0.0])
  # The sketch's update (discount_prior=True) lets the unobserved direction decay: 0.5^3.
  t = linucb_init(2, reg=1.0)
  for _ in range(3):
    t = linucb_update(t, x, 1.0, gamma=0.5, discount_prior=True)
  np.testing.assert_allclose(t.A, [[0.125 + 1.75, 0.0], [0.0, 0.125]])


def _env_reward(theta, arm_feats, arm, noise):
  return arm_feats[arm] @ theta + noise


def _run(select, theta_fn, steps, gamma, seed, noise_scale=0.1):
  """Plays a 3-arm linear problem with features = one-hot arms + a shared bias feature."""
  feats = jnp.array([[1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 0.0, 1.0], [0.0, 0.0, 1.0, 1.0]])

  def step(state, inp):
    t, key = inp
    k_sel, k_noise = jax.random.split(key)
    arm = select(state, feats, k_sel)
    u = feats[arm] @ theta_fn(t) + noise_scale * jax.random.normal(k_noise)
    return linucb_update(state, feats[arm], u, gamma=gamma), arm

  keys = jax.random.split(jax.random.key(seed), steps)
  _, arms = jax.jit(lambda s: jax.lax.scan(step, s, (jnp.arange(steps), keys)))(linucb_init(4))
  return np.asarray(arms)


THETA = jnp.array([0.2, 0.5, 0.8, 0.1])  # Arm 2 is best (0.9 vs 0.6 vs 0.3).


@pytest.mark.parametrize("name,knobs", [("linucb", {"alpha": 1.0}), ("lints", {"scale": 0.5})])
def test_stationary_converges_to_best_arm(name, knobs):
  select = lambda s, f, k: BANDITS.get(name)(s, f, k, **knobs)
  arms = _run(select, lambda t: THETA, steps=300, gamma=1.0, seed=0)
  assert np.mean(arms[-100:] == 2) >= 0.9
  assert set(arms[:30].tolist()) == {0, 1, 2}  # It had to explore first.


def test_discounting_tracks_switched_best_arm():
  # Arm 2 is best for 200 steps, then arm 0 (0.9) beats arm 2 (0.3).
  switched = jnp.array([0.8, 0.5, 0.2, 0.1])
  theta_fn = lambda t: jnp.where(t < 200, THETA, switched)
  select = lambda s, f, k: linucb_select(s, f, alpha=0.5)
  discounted = _run(select, theta_fn, steps=400, gamma=0.9, seed=1)
  assert np.mean(discounted[150:200] == 2) >= 0.8
  assert np.mean(discounted[-100:] == 0) >= 0.85
  # Without forgetting, 200 steps of stale evidence keep the old arm for much longer.
  stationary = _run(select, theta_fn, steps=400, gamma=1.0, seed=1)
  assert np.mean(stationary[200:260] == 0) < np.mean(discounted[200:260] == 0)


def test_lints_sample_distribution():
  # θ̂ = 0 and A = I: θ̃ ~ N(0, s²I), so each of 2 symmetric arms wins half the draws, and the
  # draw is a deterministic function of the key.
  s = linucb_init(2)
  keys = jax.random.split(jax.random.key(3), 1000)
  picks = jax.jit(jax.vmap(lambda k: lints_select(s, jnp.eye(2), k, scale=1.0)))(keys)
  assert 0.45 < float(jnp.mean(picks)) < 0.55
  assert int(lints_select(s, jnp.eye(2), keys[0])) == int(picks[0])


def test_under_jit():
  s = linucb_init(3)
  x = jnp.array([1.0, 2.0, 0.5])
  upd = jax.jit(lambda s, x, u, g: linucb_update(s, x, u, gamma=g))
  got = upd(s, x, 0.7, 0.9)
  want = linucb_update(s, x, 0.7, gamma=0.9)
  for a, b in zip(got, want):
    np.testing.assert_allclose(a, b, rtol=1e-6)
  np.testing.assert_allclose(got.A, np.eye(3) + np.outer(x, x), rtol=1e-6)
  feats = jnp.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
  sel = jax.jit(lambda s, f, a: linucb_select(s, f, alpha=a))
  assert int(sel(got, feats, 1.0)) == int(linucb_select(got, feats, alpha=1.0))


def test_registry():
  assert BANDITS.names() == ["lints", "linucb"]
  with pytest.raises(KeyError, match="linucb"):
    BANDITS.get("ucb")
