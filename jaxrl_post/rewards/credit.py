"""Hybrid credit and UCB selection for reward-module pools (MLREF, arXiv 2608.18827, App. A).

Pure functions over arrays. Curves are `[..., T]` (time last, any leading batch of modules);
credits and scores are `[N]` over the N modules of one pool variant. Everything here is jittable
(window sizes, lags and `k` are static Python ints) and the curve functions `vmap`.

Paper symbols: performance curve P = [p_1..p_T] (task fitness over training epochs), module
reward curve R = [r_1..r_T]; w_s, w_d, L, w_raw, α, τ, w_LLM, γ, K as in Table 4 of the paper
(defaults 30 / 30 / 10 / 0.5 / 0.7 / 0.25 / 0.5 / 0.2 / 5).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

# A series whose standard deviation is below this many machine epsilons of its RMS is "constant":
# in float32 a truly constant series still shows round-off noise of ~eps·|mean| after centring,
# and its Pearson correlation with anything would be noise. (Zero-variance guard: PROPOSAL.)
_STD_RTOL_EPS = 100.0


@functools.partial(jax.jit, static_argnames=("window",))
def moving_average(x: jax.Array, window: int) -> jax.Array:
  """Trailing-window ('valid') moving average along the last axis.

  X^s_t = (1/w_s) Σ_{i=0}^{w_s−1} x_{t+i},  t = 1..T−w_s+1   (MLREF, arXiv 2608.18827, App. A)

  Args:
    x: `[..., T]` curve(s).
    window: w_s ≥ 1 (static).

  Returns:
    `[..., max(T − w_s + 1, 0)]` smoothed curve(s).
  """
  x = jnp.asarray(x)
  if window < 1:
    raise ValueError(f"window must be >= 1, got {window}")
  t = x.shape[-1]
  if t < window:
    return jnp.zeros(x.shape[:-1] + (0,), x.dtype)
  dims = (1,) * (x.ndim - 1) + (window,)
  # reduce_window sums each window directly (no cumsum cancellation) and works for any rank.
  total = jax.lax.reduce_window(x, jnp.zeros((), x.dtype), jax.lax.add, dims, (1,) * x.ndim,
                                "VALID")
  return total / window


@functools.partial(jax.jit, static_argnames=("window",))
def slow_difference(x: jax.Array, window: int) -> jax.Array:
  """Difference over `window` steps along the last axis.

  ΔX_t = X_{t+w_d} − X_t,  t = 1..T'−w_d   (MLREF, arXiv 2608.18827, App. A)

  Args:
    x: `[..., T']` (smoothed) curve(s).
    window: w_d ≥ 1 (static).

  Returns:
    `[..., max(T' − w_d, 0)]`.
  """
  x = jnp.asarray(x)
  if window < 1:
    raise ValueError(f"window must be >= 1, got {window}")
  if x.shape[-1] <= window:
    return jnp.zeros(x.shape[:-1] + (0,), x.dtype)
  return x[..., window:] - x[..., :-window]


@jax.jit
def pearson(x: jax.Array, y: jax.Array, mask: jax.Array | None = None) -> jax.Array:
  """Pearson correlation along the last axis, 0 where either side has (near-)zero variance.

  corr(X, Y) = Cov(X, Y) / (σ(X)·σ(Y)) over the entries where `mask` is true; the zero-variance
  guard (return 0) is this implementation's choice (the paper has none); "zero" means
  σ ≤ 100·eps·RMS (see `_STD_RTOL_EPS`).

  Args:
    x: `[..., n]`.
    y: `[..., n]` (broadcastable against `x`).
    mask: optional `[..., n]` bool (broadcastable); False entries are left out.

  Returns:
    `[...]` correlations in [−1, 1]; 0 with fewer than two entries.
  """
  x, y = jnp.broadcast_arrays(jnp.asarray(x), jnp.asarray(y))
  if not jnp.issubdtype(x.dtype, jnp.floating):
    x = x.astype(jnp.float32)
    y = y.astype(jnp.float32)
  m = jnp.ones(x.shape, x.dtype) if mask is None else jnp.broadcast_to(mask, x.shape).astype(
      x.dtype)
  n = jnp.sum(m, axis=-1)
  safe_n = jnp.maximum(n, 1.0)

  def mean(v):
    return jnp.sum(v * m, axis=-1) / safe_n

  xc = (x - mean(x)[..., None]) * m
  yc = (y - mean(y)[..., None]) * m
  sxx = mean(xc * xc)
  syy = mean(yc * yc)
  sxy = mean(xc * yc)
  rtol = _STD_RTOL_EPS * jnp.finfo(x.dtype).eps
  ok = (sxx > (rtol**2) * mean(x * x)) & (syy > (rtol**2) * mean(y * y)) & (n >= 2)
  # Double-where keeps the discarded branch finite (and its gradient NaN-free).
  denom = jnp.sqrt(jnp.where(ok, sxx * syy, 1.0))
  return jnp.where(ok, jnp.clip(sxy / denom, -1.0, 1.0), 0.0)


def lagged_correlations(x: jax.Array, y: jax.Array, *,
                        max_lag: int) -> tuple[jax.Array, np.ndarray]:
  """Pearson correlations of `x` against `y` delayed by ℓ = 0..L.

  corr_ℓ(X, Y) = Cov(X_{ℓ+1:T'}, Y_{1:T'−ℓ}) / (σ(X_{ℓ+1:T'})·σ(Y_{1:T'−ℓ}))
  (MLREF, arXiv 2608.18827, App. A; X = performance, Y = module reward, so a positive lag means
  the module reward *leads* performance by ℓ epochs.) All lags are one masked Pearson over a
  static `[L+1, T']` gather (pad + mask), which compiles far faster than L+1 separate slices.

  Args:
    x: `[..., T']` performance curve(s).
    y: `[..., T']` module reward curve(s) (broadcastable against `x`).
    max_lag: L ≥ 0 (static).

  Returns:
    `(corr, valid)`: `[..., L+1]` correlations and the static `[L+1]` numpy bool mask of lags
    with at least two overlapping points (invalid lags hold 0; the paper is silent on them —
    PROPOSAL: ignore them).
  """
  x, y = jnp.broadcast_arrays(jnp.asarray(x), jnp.asarray(y))
  if max_lag < 0:
    raise ValueError(f"max_lag must be >= 0, got {max_lag}")
  t = x.shape[-1]
  # Pair j of lag ℓ is (x[ℓ + j], y[j]), j < T' − ℓ.
  valid = (t - np.arange(max_lag + 1)) >= 2
  if t == 0:
    dtype = x.dtype if jnp.issubdtype(x.dtype, jnp.floating) else jnp.float32
    return jnp.zeros(x.shape[:-1] + (max_lag + 1,), dtype), valid
  return _lagged_pearson(x, y, max_lag=max_lag), valid


@functools.partial(jax.jit, static_argnames=("max_lag",))
def _lagged_pearson(x, y, *, max_lag):
  t = x.shape[-1]
  lags = np.arange(max_lag + 1)[:, None]
  j = np.arange(t)[None, :]
  x_idx = np.minimum(lags + j, t - 1)
  xl = x[..., x_idx]  # [..., L+1, T']
  yl = jnp.broadcast_to(y[..., None, :], xl.shape)
  return pearson(xl, yl, j < t - lags)


def max_lagged_correlation(x: jax.Array, y: jax.Array, *, max_lag: int) -> jax.Array:
  """max_ℓ corr_ℓ(X, Y) over the valid lags ℓ = 0..L; 0 when no lag is valid (PROPOSAL).

  Args:
    x: `[..., T']`.
    y: `[..., T']`.
    max_lag: L (static).

  Returns:
    `[...]`.
  """
  corr, valid = lagged_correlations(x, y, max_lag=max_lag)
  if not bool(valid.any()):
    return jnp.zeros(corr.shape[:-1], corr.dtype)
  return jnp.max(jnp.where(valid, corr, -jnp.inf), axis=-1)


# Jitted: the host-side loop calls this once per run; op-by-op dispatch would compile ~300 ops.
@functools.partial(jax.jit, static_argnames=("smooth_window", "diff_window", "max_lag"))
def correlation_credits(performance: jax.Array, module_rewards: jax.Array, *, smooth_window: int,
                        diff_window: int, max_lag: int, w_raw: float) -> jax.Array:
  """Correlation credit of each module reward curve against the performance curve.

  With P^s, R^s the `moving_average`s (window w_s) and ΔP, ΔR their `slow_difference`s
  (window w_d):

    c_raw  = max_ℓ corr_ℓ(P^s, R^s),   c_diff = max_ℓ corr_ℓ(ΔP, ΔR),   ℓ = 0..L
    c_corr = w_raw·c_raw + (1 − w_raw)·c_diff

  (MLREF, arXiv 2608.18827, App. A.) Curves too short for any lag (T < w_s + 1, or
  T < w_s + w_d + 1 for c_diff) give that term 0 (PROPOSAL; the paper is silent).

  Args:
    performance: `[T]` task performance per epoch.
    module_rewards: `[..., T]` each module's mean reward per epoch.
    smooth_window: w_s (static).
    diff_window: w_d (static).
    max_lag: L (static).
    w_raw: weight of the raw (smoothed) correlation.

  Returns:
    `[...]` credits c_corr in [−1, 1].

  Examples:
    >>> import jax.numpy as jnp
    >>> p = jnp.arange(6.0); r = 2.0 * jnp.arange(6.0)
    >>> float(correlation_credits(p, r, smooth_window=1, diff_window=1, max_lag=0, w_raw=0.5))
    0.5
  """
  performance = jnp.asarray(performance)
  module_rewards = jnp.asarray(module_rewards)
  dtype = jnp.result_type(performance.dtype, module_rewards.dtype, jnp.float32)
  performance = performance.astype(dtype)
  module_rewards = module_rewards.astype(dtype)
  if performance.ndim != 1 or module_rewards.shape[-1] != performance.shape[0]:
    raise ValueError(f"need performance [T] and module_rewards [..., T], got "
                     f"{performance.shape} and {module_rewards.shape}")
  p_s = moving_average(performance, smooth_window)
  r_s = moving_average(module_rewards, smooth_window)
  c_raw = max_lagged_correlation(p_s, r_s, max_lag=max_lag)
  dp = slow_difference(p_s, diff_window)
  dr = slow_difference(r_s, diff_window)
  c_diff = max_lagged_correlation(dp, dr, max_lag=max_lag)
  c_raw = jnp.broadcast_to(c_raw, module_rewards.shape[:-1])
  c_diff = jnp.broadcast_to(c_diff, module_rewards.shape[:-1])
  return w_raw * c_raw + (1.0 - w_raw) * c_diff


def correlation_credit(performance, module_reward, *, smooth_window: int = 30,
                       diff_window: int = 30, max_lag: int = 10, w_raw: float = 0.5) -> float:
  """Host-side correlation credit c_corr of one module as a Python float.

  c_corr = w_raw·max_ℓ corr_ℓ(P^s, R^s) + (1 − w_raw)·max_ℓ corr_ℓ(ΔP, ΔR)
  (MLREF, arXiv 2608.18827, App. A; see `correlation_credits` for the definitions and the
  jittable, batched version). Defaults are the paper's Table 4 values.

  Args:
    performance: `[T]` task performance per epoch.
    module_reward: `[T]` the module's mean reward per epoch.
    smooth_window: w_s.
    diff_window: w_d.
    max_lag: L.
    w_raw: weight of the raw correlation.

  Returns:
    c_corr as a float in [−1, 1].
  """
  return float(correlation_credits(performance, module_reward, smooth_window=smooth_window,
                                   diff_window=diff_window, max_lag=max_lag, w_raw=w_raw))


def ema(previous: jax.Array, value: jax.Array, *, alpha: float) -> jax.Array:
  """Exponential moving average of a credit: c̃ ← α·c + (1 − α)·c̃ (init 0; arXiv 2608.18827).

  Args:
    previous: `[N]` c̃.
    value: `[N]` new credit c.
    alpha: α (paper: 0.7).

  Returns:
    `[N]` updated c̃.
  """
  return alpha * jnp.asarray(value) + (1.0 - alpha) * jnp.asarray(previous)


def normalize_llm_weights(weights: jax.Array) -> jax.Array:
  """LLM credit: proposed weights (negatives clipped to 0) normalised to sum 1; all-zero → 0.

  c_LLM_i = max(w_i, 0) / Σ_j max(w_j, 0)  (unselected modules have w_i = 0; arXiv 2608.18827).

  Args:
    weights: `[N]`.

  Returns:
    `[N]`.
  """
  w = jnp.maximum(jnp.asarray(weights, jnp.float32), 0.0)
  total = jnp.sum(w)
  return jnp.where(total > 0, w / jnp.where(total > 0, total, 1.0), 0.0)


@jax.jit
def fuse_scores(llm_credit: jax.Array, corr_credit: jax.Array, *, tau: float,
                w_llm: float) -> jax.Array:
  """Composite scores from the EMA'd LLM and correlation credits.

    s_llm_i  = c̃_LLM_i / Σ_j c̃_LLM_j          (uniform 1/N if all zero)
    s_corr_i = softmax_i((c̃_corr_i − max_j c̃_corr_j) / τ)
    s_i      = w_LLM·s_llm_i + (1 − w_LLM)·s_corr_i

  (MLREF, arXiv 2608.18827, App. A.) Both parts sum to 1, so s sums to 1.

  Args:
    llm_credit: `[N]` c̃_LLM (non-negative).
    corr_credit: `[N]` c̃_corr.
    tau: softmax temperature τ (paper: 0.25).
    w_llm: w_LLM (paper: 0.5).

  Returns:
    `[N]` scores s.

  Examples:
    >>> import jax.numpy as jnp
    >>> fuse_scores(jnp.zeros(2), jnp.zeros(2), tau=0.25, w_llm=0.5).tolist()
    [0.5, 0.5]
  """
  c_llm = jnp.asarray(llm_credit, jnp.float32)
  c_corr = jnp.asarray(corr_credit, jnp.float32)
  n = c_llm.shape[-1]
  total = jnp.sum(c_llm, axis=-1, keepdims=True)
  s_llm = jnp.where(total > 0, c_llm / jnp.where(total > 0, total, 1.0), 1.0 / n)
  s_corr = jax.nn.softmax((c_corr - jnp.max(c_corr, axis=-1, keepdims=True)) / tau, axis=-1)
  return w_llm * s_llm + (1.0 - w_llm) * s_corr


@jax.jit
def ucb_scores(scores: jax.Array, counts: jax.Array, total, *, gamma: float) -> jax.Array:
  """Upper confidence bounds u_i = s_i + γ·sqrt(ln(U + 1)) / (n_i + 1)  (arXiv 2608.18827).

  Implemented exactly as the paper writes it: the bonus divides by (n_i + 1), not by
  sqrt(n_i + 1) as in UCB1.

  Args:
    scores: `[N]` composite scores s.
    counts: `[N]` n_i, times module i has been selected.
    total: U, times any module of the current pool variant has been selected (usually Σ n_i).
    gamma: γ (paper: 0.2).

  Returns:
    `[N]` u.
  """
  s = jnp.asarray(scores, jnp.float32)
  n = jnp.asarray(counts, jnp.float32)
  bonus = gamma * jnp.sqrt(jnp.log(jnp.asarray(total, jnp.float32) + 1.0)) / (n + 1.0)
  return s + bonus


@functools.partial(jax.jit, static_argnames=("k",))
def ucb_select(scores: jax.Array, counts: jax.Array, total, *, gamma: float, k: int) -> jax.Array:
  """Indices of the top-K modules by UCB u_i = s_i + γ·sqrt(ln(U + 1)) / (n_i + 1).

  (MLREF, arXiv 2608.18827.) Ties go to the lower index. The weights of the selected modules in
  R = Σ w_k m_k are their composite scores s_k, not u_k (see `module_pool.select_modules`).

  Args:
    scores: `[N]` composite scores s.
    counts: `[N]` selection counts n_i.
    total: U.
    gamma: γ.
    k: K (static); at most N indices are returned.

  Returns:
    `[min(K, N)]` int32 indices, by decreasing u.

  Examples:
    >>> import jax.numpy as jnp
    >>> ucb_select(jnp.array([0.2, 0.5, 0.3]), jnp.zeros(3), 0, gamma=0.2, k=2).tolist()
    [1, 2]
  """
  u = ucb_scores(scores, counts, total, gamma=gamma)
  k = min(int(k), u.shape[-1])
  _, idx = jax.lax.top_k(u, k)  # top_k is stable: equal values keep index order.
  return idx
