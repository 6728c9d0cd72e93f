"""Hybrid-credit maths of MLREF (arXiv 2608.18827, App. A): golden values, lags, guards, jit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

from jaxrl_post.rewards import module_pool as mp
from jaxrl_post.rewards.credit import (
    correlation_credits,
    ema,
    fuse_scores,
    lagged_correlations,
    moving_average,
    normalize_llm_weights,
    pearson,
    slow_difference,
    ucb_scores,
)


def _reference_credit(p, r, ws, wd, lag_max, w_raw):
  """Independent float64 reference: np.convolve + scipy.stats.pearsonr, straight from the spec."""
  p, r = np.asarray(p, np.float64), np.asarray(r, np.float64)

  def smooth(x):
    return np.convolve(x, np.ones(ws) / ws, mode="valid") if len(x) >= ws else x[:0]

  def best(x, y):
    vals = []
    for lag in range(lag_max + 1):
      n = len(x) - lag
      if n < 2:
        continue
      a, b = x[lag:], y[:n]
      vals.append(0.0 if a.std() == 0 or b.std() == 0 else scipy.stats.pearsonr(a, b)[0])
    return max(vals) if vals else 0.0

  ps, rs = smooth(p), smooth(r)
  dp, dr = ps[wd:] - ps[:-wd], rs[wd:] - rs[:-wd]
  return w_raw * best(ps, rs) + (1 - w_raw) * best(dp, dr)


def test_smoothing_and_difference_golden():
  x = jnp.array([1.0, 2.0, 4.0, 7.0, 11.0])  # [T=5]
  # (1+2)/2, (2+4)/2, (4+7)/2, (7+11)/2
  np.testing.assert_allclose(moving_average(x, 2), [1.5, 3.0, 5.5, 9.0])
  # P^s_{t+2} - P^s_t on [1.5, 3, 5.5, 9]: 5.5-1.5, 9-3
  np.testing.assert_allclose(slow_difference(moving_average(x, 2), 2), [4.0, 6.0])
  assert moving_average(x, 6).shape == (0,)
  assert slow_difference(x, 5).shape == (0,)
  # Batched over modules: [2, T] -> [2, T - w + 1].
  np.testing.assert_allclose(moving_average(jnp.stack([x, 2 * x]), 5), [[5.0], [10.0]])


def test_pearson_matches_scipy_and_mask():
  rng = np.random.default_rng(0)
  x, y = rng.normal(size=40), rng.normal(size=40)
  np.testing.assert_allclose(pearson(x, y), scipy.stats.pearsonr(x, y)[0], rtol=1e-5)
  mask = np.arange(40) < 25
  np.testing.assert_allclose(pearson(x, y, mask), scipy.stats.pearsonr(x[:25], y[:25])[0],
                             rtol=1e-5)


@pytest.mark.parametrize("const", [0.0, 0.1, 1234.5])
def test_pearson_zero_variance_guard(const):
  # A constant series has no correlation: 0, not the ±1 that float32 round-off noise would give
  # after centring 0.1 or 1234.5.
  y = np.linspace(0.0, 1.0, 50)
  assert float(pearson(np.full(50, const, np.float32), y)) == 0.0
  assert float(pearson(y, np.full(50, const, np.float32))) == 0.0
  assert float(pearson(np.ones(1), np.ones(1))) == 0.0  # n < 2


def test_lag_direction_golden():
  # Indicator series, n = 6: corr of two one-hot vectors at different positions is
  # (0 - 1/n) / (1 - 1/n) = -0.2; at the same position it is 1.
  perf = np.array([0, 0, 1, 0, 0, 0], np.float32)
  lead = np.array([0, 1, 0, 0, 0, 0], np.float32)  # module reward one epoch *before* perf
  corr, valid = lagged_correlations(perf, lead, max_lag=1)
  # lag 0: -0.2; lag 1 pairs perf[1:] = [0,1,0,0,0] with lead[:5] = [0,1,0,0,0] -> 1.
  np.testing.assert_allclose(corr, [-0.2, 1.0], atol=1e-6)
  assert valid.tolist() == [True, True]
  # Reward *lagging* performance gets no help from positive lags: lag 1 pairs
  # perf'[1:] = [1,0,0,0,0] with lag'[:5] = [0,0,1,0,0] -> (0 - 1/5)/(1 - 1/5) = -0.25.
  corr, _ = lagged_correlations(lead, perf, max_lag=1)
  np.testing.assert_allclose(corr, [-0.2, -0.25], atol=1e-6)
  c = mp.correlation_credit(lead, perf, smooth_window=1, diff_window=1, max_lag=1, w_raw=1.0)
  assert c == pytest.approx(-0.2, abs=1e-6)
  # Lags without two overlapping points are ignored, not counted as 0.
  _, valid = lagged_correlations(perf[:3], lead[:3], max_lag=4)
  assert valid.tolist() == [True, True, False, False, False]


def test_correlation_credit_golden_by_hand():
  # P = squares, R = linear, w_s = w_d = 1, L = 0.
  # raw: x = [0..5] (mean 2.5, Sxx = 17.5), y = [0,1,4,9,16,25] (mean 55/6, Syy = 979 - 6(55/6)^2
  # = 474.8333), Sxy = 225 - 6*2.5*55/6 = 87.5 -> corr = 87.5 / sqrt(17.5 * 474.8333) = 0.959875.
  # diff: ΔP = [1,3,5,7,9], ΔR = [1,1,1,1,1] is constant -> guarded to 0.
  # c_corr = 0.5 * 0.959875 + 0.5 * 0 = 0.4799375.
  p = [0.0, 1.0, 4.0, 9.0, 16.0, 25.0]
  r = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
  c = mp.correlation_credit(p, r, smooth_window=1, diff_window=1, max_lag=0, w_raw=0.5)
  assert isinstance(c, float)
  assert c == pytest.approx(0.4799375, abs=1e-5)
  # Linear vs linear: raw 1, diff constant -> 0.5 (the docstring example).
  assert mp.correlation_credit(r, [2 * x for x in r], smooth_window=1, diff_window=1, max_lag=0,
                               w_raw=0.5) == pytest.approx(0.5, abs=1e-6)


@pytest.mark.parametrize("t", [200, 45, 20])
def test_correlation_credit_matches_reference_paper_windows(t):
  # Paper windows (w_s = w_d = 30, L = 10); T = 45 / 20 exercise the short-curve guards
  # (T < w_s + w_d + 1 -> no c_diff; T < w_s -> nothing).
  rng = np.random.default_rng(t)
  perf = np.cumsum(rng.normal(size=t)) + np.linspace(0, 5, t)
  mods = np.cumsum(rng.normal(size=(3, t)), axis=1)
  mods[1] = np.roll(perf, 4) + 0.1 * rng.normal(size=t)  # leads performance by 4 epochs
  got = correlation_credits(perf, mods, smooth_window=30, diff_window=30, max_lag=10, w_raw=0.5)
  want = [_reference_credit(perf, m, 30, 30, 10, 0.5) for m in mods]
  np.testing.assert_allclose(got, want, atol=2e-4)


def test_correlation_credits_jit_vmap_consistent():
  rng = np.random.default_rng(1)
  perf = rng.normal(size=64).cumsum().astype(np.float32)
  mods = rng.normal(size=(4, 64)).cumsum(axis=1).astype(np.float32)
  kw = dict(smooth_window=5, diff_window=3, max_lag=2, w_raw=0.3)
  batched = correlation_credits(perf, mods, **kw)
  vmapped = jax.vmap(lambda m: correlation_credits(perf, m, **kw))(mods)
  np.testing.assert_allclose(batched, vmapped, atol=1e-6)
  assert mp.correlation_credit(perf, mods[2], **kw) == pytest.approx(float(batched[2]), abs=1e-6)


def test_ema_and_llm_normalisation_golden():
  # c~ <- 0.7 c + 0.3 c~: 0.7*1 + 0.3*0.5 = 0.85; 0.7*0 + 0.3*0.2 = 0.06
  np.testing.assert_allclose(ema(jnp.array([0.5, 0.2]), jnp.array([1.0, 0.0]), alpha=0.7),
                             [0.85, 0.06], rtol=1e-6)
  np.testing.assert_allclose(normalize_llm_weights(jnp.array([2.0, -1.0, 6.0])),
                             [0.25, 0.0, 0.75])
  np.testing.assert_allclose(normalize_llm_weights(jnp.zeros(3)), [0.0, 0.0, 0.0])


def test_fuse_scores_golden():
  # s_corr = softmax([0.2, 0, -0.2] - 0.2) / 0.25) = softmax([0, -0.8, -1.6])
  #        = [1, 0.449329, 0.201897] / 1.651226 = [0.605610, 0.272116, 0.122274]
  # s = 0.5 * [0.5, 0.5, 0] + 0.5 * s_corr = [0.552805, 0.386058, 0.061137]
  s = fuse_scores(jnp.array([0.5, 0.5, 0.0]), jnp.array([0.2, 0.0, -0.2]), tau=0.25, w_llm=0.5)
  np.testing.assert_allclose(s, [0.552805, 0.386058, 0.061137], atol=2e-6)
  assert float(s.sum()) == pytest.approx(1.0, abs=1e-6)
  # All-zero LLM credit -> uniform s_llm = 1/3; equal corr -> uniform s_corr.
  np.testing.assert_allclose(fuse_scores(jnp.zeros(3), jnp.ones(3), tau=0.25, w_llm=0.5),
                             [1 / 3] * 3, atol=1e-6)


def test_ucb_golden_and_selection():
  # bonus = 0.2 * sqrt(ln(7 + 1)) / (n + 1) = 0.288404 / (n + 1), n = [2, 0, 5]
  # u = [0.3 + 0.096135, 0.3 + 0.288404, 0.4 + 0.048067] = [0.396135, 0.588404, 0.448067]
  s, n = jnp.array([0.3, 0.3, 0.4]), jnp.array([2.0, 0.0, 5.0])
  np.testing.assert_allclose(ucb_scores(s, n, 7, gamma=0.2), [0.396135, 0.588404, 0.448067],
                             atol=2e-6)
  assert mp.ucb_select(s, n, 7, gamma=0.2, k=2).tolist() == [1, 2]
  # U = 0: no exploration bonus; ties go to the lower index; k > N returns N.
  assert mp.ucb_select(jnp.array([0.2, 0.5, 0.5]), jnp.zeros(3), 0, gamma=0.2,
                       k=5).tolist() == [1, 2, 0]
  # Under jit with k static.
  f = jax.jit(lambda s, n, u: mp.ucb_select(s, n, u, gamma=0.2, k=1))
  assert f(s, n, 7.0).tolist() == [1]
