"""losses.ordinal against numpy: cumulative-logit level probabilities, the expected-level reward,
clipped self-normalised IPS weights, the weighted NLL (and its gradient), under jit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import expit

from jaxrl_post.losses import ordinal


def _np_level_probs(s, b):
  """P(level = k) as differences of the cumulative probabilities σ(s − b_k)."""
  exceed = expit(s[..., None] - b)  # P(level > k)
  upper = np.concatenate([np.ones_like(s)[..., None], exceed], -1)
  lower = np.concatenate([exceed, np.zeros_like(s)[..., None]], -1)
  return upper - lower


def test_thresholds_stay_ordered_for_any_parameters():
  raw = jnp.array([0.3, -5.0, 2.0, -30.0, 0.0])
  b = np.asarray(ordinal.ordered_thresholds(raw))
  np.testing.assert_allclose(b, 0.3 + np.concatenate([[0], np.cumsum(np.log1p(np.exp(
    np.asarray(raw[1:], np.float64))) + 1e-3)]), rtol=1e-6)
  assert np.all(np.diff(b) > 0)


def test_level_probs_reward_and_nll_match_numpy_under_jit():
  rng = np.random.default_rng(0)
  s = rng.normal(size=(3, 4)).astype(np.float32) * 2
  b = np.array([-1.5, -0.2, 0.4, 1.0, 2.5], np.float32)
  logp = jax.jit(ordinal.level_log_probs)(jnp.asarray(s), jnp.asarray(b))
  expected = _np_level_probs(s.astype(np.float64), b.astype(np.float64))
  np.testing.assert_allclose(np.exp(logp), expected, atol=1e-6)
  # E[level] = Σ_k k P(level = k) = Σ_k P(level > k).
  reward = jax.jit(ordinal.expected_level)(jnp.asarray(s), jnp.asarray(b))
  np.testing.assert_allclose(reward, expected @ np.arange(6), rtol=1e-5)
  # Golden value by hand: s = 0, b = (−1, 1): P = (σ(−1), σ(1) − σ(−1), σ(−1)).
  p = np.exp(ordinal.level_log_probs(jnp.array(0.0), jnp.array([-1.0, 1.0])))
  np.testing.assert_allclose(p, [0.268941, 0.462117, 0.268941], atol=1e-6)
  # Far scores stay finite (no log 0 or 0 · inf).
  far = ordinal.level_log_probs(jnp.array([-60.0, 60.0]), jnp.asarray(b))
  assert np.all(np.isfinite(far))
  level = rng.integers(0, 6, size=s.shape)
  w = rng.uniform(0.2, 3.0, size=s.shape).astype(np.float32)
  loss, aux = jax.jit(ordinal.ordinal_nll)(jnp.asarray(s), jnp.asarray(b), jnp.asarray(level),
                                           jnp.asarray(w))
  nll = -np.log(np.take_along_axis(expected, level[..., None], -1)[..., 0])
  np.testing.assert_allclose(loss, (w * nll).sum() / w.sum(), rtol=1e-5)
  np.testing.assert_allclose(aux.nll, nll.mean(), rtol=1e-5)


def test_nll_gradient_matches_finite_differences_and_micro_batches_add_up():
  rng = np.random.default_rng(1)
  s = jnp.asarray(rng.normal(size=8), jnp.float32)
  raw = jnp.array([-1.0, 0.2, 0.5], jnp.float32)
  level = jnp.asarray(rng.integers(0, 4, size=8))
  w = jnp.asarray(rng.uniform(0.5, 2.0, size=8), jnp.float32)

  def f(s, raw):
    return ordinal.ordinal_nll(s, ordinal.ordered_thresholds(raw), level, w)[0]

  gs, graw = jax.grad(f, argnums=(0, 1))(s, raw)
  for i in (0, 3):
    e = jnp.zeros(8).at[i].set(1e-3)
    np.testing.assert_allclose(gs[i], (f(s + e, raw) - f(s - e, raw)) / 2e-3, rtol=2e-2)
  e = jnp.zeros(3).at[1].set(1e-3)
  np.testing.assert_allclose(graw[1], (f(s, raw + e) - f(s, raw - e)) / 2e-3, rtol=2e-2)
  # Two halves with the whole batch's Σ w sum to the full loss.
  b = ordinal.ordered_thresholds(raw)
  halves = sum(ordinal.ordinal_nll(s[h], b, level[h], w[h], total_weight=w.sum())[0]
               for h in (slice(0, 4), slice(4, 8)))
  np.testing.assert_allclose(halves, f(s, raw), rtol=1e-6)


def test_ips_weights_clip_then_self_normalise():
  p = jnp.array([0.5, 0.25, 0.01, 0.001])
  mask = jnp.array([True, True, True, False])
  w = jax.jit(lambda p, m: ordinal.ips_weights(p, m, clip=10.0))(p, mask)
  raw = np.array([2.0, 4.0, 10.0])  # 1/0.01 = 100 clipped to c = 10; the masked entry is out
  np.testing.assert_allclose(w, np.append(raw / raw.mean(), 0.0), rtol=1e-6)
  assert float(w[:3].mean()) == pytest.approx(1.0)
  with pytest.raises(ValueError, match="clip=0"):
    ordinal.ips_weights(p, clip=0.0)
