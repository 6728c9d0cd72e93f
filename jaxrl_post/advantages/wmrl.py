"""WMRL: GRPO on world-model rewards, corrected by a thin stream of real-execution anchors.

Executing an agent's rollout needs an exclusive sandbox; WMRL lets a world model that shares the
policy backbone predict the outcome and score instead. Its reward carries a bias (a permanent
O(b) error floor in the convergence bound) and noise (O(σ)). About 10% of groups, the anchors,
are scored by both the world model (r_wm) and real execution (r_env); two corrections use them:

  Online Debiasing   fit a monotone map f̂ on the anchor pairs (r_wm, r_env) and score every
                     non-anchor rollout with f̂(r_wm). Bucketed isotonic regression: 10
                     equal-width bins on [0, 1], bin means of r_wm and r_env over the non-empty
                     bins, pool-adjacent-violators on the r_env means (weighted by bin counts);
                     applied by piecewise-linear interpolation, clamped at the ends. The map must
                     be non-affine: GRPO's standardisation cancels any affine one. Identity until
                     `min_pairs` = 200 pairs, then a refit every `refit_every` = 64 new pairs, on
                     a FIFO buffer of `capacity` = 5000 pairs.
  Inverse-Variance   fuse the clean anchor stream and the noisy world-model stream with
  Denoising          inverse-variance weights: anchor-group advantages × w,
                       s² = mean_i[((d_i − d̄) − (y_i − ȳ))²] / Var(y)  per anchor group,
                       d = f̂(r_wm), y = r_env (groups with Var(y) = 0 are skipped),
                       s̄² = EMA of s² (half-life 64),
                       c = (w_target − 1)/s̄² fixed once after 32 groups (w_target = 2),
                       w = clip(1 + c·s̄², 1, w_max = 4), exactly 1 before c is set.

Per step the order matters (`wmrl_step`): push an anchor group's pairs into the calibrator
*before* measuring its disagreement, so s² is measured on the calibrated residual; score the
other groups with f̂(r_wm); then GRPO advantages with anchor groups × w. Ungraded rollouts
(timeouts; NaN here) are excluded, not scored 0, and a group with fewer than 2 graded rollouts
gets advantage 0.

Everything is jittable and every stateful part is a NamedTuple pytree of fixed-shape arrays
(`CalibratorState`, `IVDState`), so it checkpoints and restores exactly. The reference code fits
on the host in numpy; here the fit is a fixed-shape JAX computation with the same result (the
isotonic fit uses the max–min formula, which equals pool-adjacent-violators, over ≤ `bins`
values).

`REWARD_CALIBRATORS` names the calibration applied to world-model rewards: "isotonic" (Online
Debiasing) and "identity" (calibration disabled: the "raw world model" ablation).

References:
  Yang et al., Scaling Automatic Research Agents via World Models (WMRL), arXiv 2608.12564.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxrl_post.advantages.outcome import group_advantages
from jaxrl_post.registry import Registry

ArrayLike = jax.Array | float | int

REWARD_CALIBRATORS: Registry = Registry("reward calibrator")

# A group whose true rewards vary by less than this (population variance) carries no ranking
# information; its disagreement is undefined (NaN) and it does not enter the EMA (reference code).
DEGENERATE_VAR = 1e-9
# c is only fixed when the EMA is above this, so that c = (target − 1)/s̄² stays finite.
MIN_EMA_FOR_C = 1e-12


def _positive_int(name: str, value, minimum: int = 1) -> int:
  if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
    raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
  return value


# ---------------------------------------------------------------------------------------------
# Online Debiasing: bucketed isotonic calibration.
# ---------------------------------------------------------------------------------------------


class Breakpoints(NamedTuple):
  """A monotone piecewise-linear map, padded to a fixed number of breakpoints."""

  fx: jax.Array  # [bins] float32 knots (bin means of r_wm), increasing over the first `num`;
  #                the rest repeat the last knot, which `jnp.interp` treats as a flat end.
  fy: jax.Array  # [bins] float32 values at the knots (isotonic bin means of r_env).
  num: jax.Array  # [] int32 number of non-empty bins (real knots); < 2 means "no fit".


@functools.partial(jax.jit, static_argnames="bins")
def pav_fit(
    x: jax.Array, y: jax.Array, mask: jax.Array | None = None, *, bins: int = 10
) -> Breakpoints:
  """Bucketed isotonic regression of y on x: bin means, then pool-adjacent-violators.

  k(x) = bin of x among `bins` equal-width bins on [0, 1] (values outside go to the end bins;
  a value on an edge goes to the upper bin, as `np.digitize`);
  n_k, x̄_k, ȳ_k = count and means over bin k;
  fy = argmin_{z non-decreasing} Σ_k n_k (z_k − ȳ_k)² over the non-empty bins
     = max_{j ≤ k} min_{l ≥ k} (Σ_{j..l} n ȳ)/(Σ_{j..l} n),
  which is what pool-adjacent-violators computes (the max–min form keeps shapes fixed).
  Breakpoints are (x̄_k, fy_k) for the non-empty bins, in bin order, then padding.

  Args:
    x: `[N]` (any shape, flattened) world-model scores r_wm.
    y: `[N]` execution scores r_env.
    mask: optional `[N]` bool, True = use this pair.
    bins: number of equal-width bins on [0, 1] (static; paper: 10).

  Returns:
    `Breakpoints(fx [bins], fy [bins], num [])`; `num < 2` means too few non-empty bins for a
    map (the reference returns None then and the caller stays at identity).

  Examples:
    >>> import jax.numpy as jnp
    >>> bp = pav_fit(jnp.array([0.05, 0.15, 0.55, 0.56]), jnp.array([0.2, 0.0, 0.5, 0.7]),
    ...              bins=10)
    >>> int(bp.num), [round(v, 3) for v in bp.fx[:3].tolist()], bp.fy[:3].tolist()
    (3, [0.05, 0.15, 0.555], [0.10000000149011612, 0.10000000149011612, 0.6000000238418579])

  References:
    Yang et al., Scaling Automatic Research Agents via World Models (WMRL), arXiv 2608.12564.
    Robertson, Wright & Dykstra, Order Restricted Statistical Inference (1988), the max–min
    formula of isotonic regression.
  """
  _positive_int("bins", bins)
  x = jnp.asarray(x, jnp.float32).reshape(-1)
  y = jnp.asarray(y, jnp.float32).reshape(-1)
  if y.shape != x.shape:
    raise ValueError(f"y has {y.size} values; expected {x.size} (one per x)")
  m = jnp.ones(x.shape, bool) if mask is None else jnp.asarray(mask).reshape(-1).astype(bool)
  if m.shape != x.shape:
    raise ValueError(f"mask has {m.size} values; expected {x.size} (one per x)")
  m = m & jnp.isfinite(x) & jnp.isfinite(y)
  edges = jnp.linspace(0.0, 1.0, bins + 1, dtype=jnp.float32)
  idx = jnp.clip(jnp.searchsorted(edges[1:-1], x, side="right", method="compare_all"), 0,
                 bins - 1)
  w = jax.ops.segment_sum(m.astype(jnp.float32), idx, num_segments=bins)
  sx = jax.ops.segment_sum(jnp.where(m, x, 0.0), idx, num_segments=bins)
  sy = jax.ops.segment_sum(jnp.where(m, y, 0.0), idx, num_segments=bins)
  nonempty = w > 0
  mean_x = sx / jnp.maximum(w, 1.0)
  # Weighted means of y over every bin range [j, l]; a range is never empty when it contains a
  # non-empty bin k, which is the only case used below.
  k = jnp.arange(bins)
  in_range = (k[:, None, None] <= k[None, None, :]) & (k[None, None, :] <= k[None, :, None])
  range_w = jnp.sum(jnp.where(in_range, w, 0.0), axis=-1)  # [j, l]
  range_y = jnp.sum(jnp.where(in_range, sy, 0.0), axis=-1)
  avg = range_y / jnp.maximum(range_w, 1e-30)
  j_le_l = k[:, None] <= k[None, :]
  # fy_k = max_{j≤k} min_{l≥k} avg[j, l].
  inner = jnp.where((k[None, None, :] >= k[None, :, None]) & j_le_l[:, None, :],
                    avg[:, None, :], jnp.inf)  # [j, k, l]
  inner_min = jnp.min(inner, axis=-1)  # [j, k]
  fy = jnp.max(jnp.where(k[:, None] <= k[None, :], inner_min, -jnp.inf), axis=0)
  # Move the non-empty bins to the front (stable, so knots stay increasing), pad with the last.
  order = jnp.argsort(~nonempty, stable=True)
  num = jnp.sum(nonempty).astype(jnp.int32)
  last = jnp.maximum(num - 1, 0)
  fx = mean_x[order]
  fy = jnp.where(nonempty, fy, 0.0)[order]
  keep = k < num
  return Breakpoints(jnp.where(keep, fx, fx[last]), jnp.where(keep, fy, fy[last]), num)


class CalibratorState(NamedTuple):
  """Online Debiasing state: a FIFO ring buffer of anchor pairs and the fitted monotone map.

  Fixed shapes (`capacity` and `bins` are read from them), so the state checkpoints exactly.
  """

  pairs: jax.Array  # [capacity, 2] float32 (r_wm, r_env); slot of pair n is n % capacity.
  count: jax.Array  # [] int32 pairs pushed so far (the buffer holds min(count, capacity)).
  since_fit: jax.Array  # [] int32 pairs pushed since the last successful fit.
  fx: jax.Array  # [bins] float32 breakpoints of f̂ (see `Breakpoints`).
  fy: jax.Array  # [bins] float32
  num_breaks: jax.Array  # [] int32 real breakpoints.
  fitted: jax.Array  # [] bool; False = f̂ is the identity.
  num_fits: jax.Array  # [] int32 successful fits so far (a diagnostic).


def calibrator_init(*, capacity: int = 5000, bins: int = 10) -> CalibratorState:
  """An empty calibrator: f̂ = identity until the first fit.

  Args:
    capacity: FIFO buffer size in pairs (reference code: 5000).
    bins: equal-width bins on [0, 1] of the isotonic fit (paper: 10).

  Returns:
    A `CalibratorState` with `[capacity, 2]` pairs and `[bins]` breakpoints.

  Raises:
    ValueError: `capacity` < 1, or `bins` < 2 (a map needs two non-empty bins).

  Examples:
    >>> s = calibrator_init(capacity=8, bins=4)
    >>> s.pairs.shape, s.fx.shape, bool(s.fitted)
    ((8, 2), (4,), False)
  """
  _positive_int("capacity", capacity)
  _positive_int("bins", bins, minimum=2)
  zero = jnp.zeros((), jnp.int32)
  return CalibratorState(
      pairs=jnp.zeros((capacity, 2), jnp.float32), count=zero, since_fit=zero,
      fx=jnp.zeros((bins,), jnp.float32), fy=jnp.zeros((bins,), jnp.float32),
      num_breaks=zero, fitted=jnp.zeros((), bool), num_fits=zero)


def _refit(state: CalibratorState) -> CalibratorState:
  capacity, bins = state.pairs.shape[0], state.fx.shape[0]
  valid = jnp.arange(capacity) < jnp.minimum(state.count, capacity)
  bp = pav_fit(state.pairs[:, 0], state.pairs[:, 1], valid, bins=bins)
  new = state._replace(fx=bp.fx, fy=bp.fy, num_breaks=bp.num, fitted=jnp.ones((), bool),
                       since_fit=jnp.zeros((), jnp.int32), num_fits=state.num_fits + 1)
  # Fewer than two non-empty bins: keep the old map and keep counting (reference behaviour).
  return jax.tree.map(lambda a, b: jnp.where(bp.num >= 2, a, b), new, state)


@functools.partial(jax.jit, static_argnames=("min_pairs", "refit_every"))
def calibrator_update(
    state: CalibratorState,
    r_wm: jax.Array,
    r_env: jax.Array,
    mask: jax.Array | None = None,
    *,
    min_pairs: int = 200,
    refit_every: int = 64,
) -> CalibratorState:
  """Pushes anchor pairs one by one (FIFO) and refits f̂ whenever it is due.

  After each push: refit iff min(count, capacity) ≥ min_pairs and since_fit ≥ refit_every.
  Pairs are pushed in row-major order, so the result is the same as pushing them one at a time
  (the reference `OnlineDebiaser.push`): first fit at pair `min_pairs`, then every
  `refit_every` pairs. Pairs with a NaN / inf score (ungraded) or mask False are skipped.

  Args:
    state: `CalibratorState`.
    r_wm: `[...]` world-model scores of anchor rollouts (any shape, flattened).
    r_env: execution scores, same shape.
    mask: optional bool, same shape; True = push this pair.
    min_pairs: pairs needed before the first fit (reference: 200; static).
    refit_every: new pairs between fits (reference: 64; static).

  Returns:
    The new `CalibratorState` (same shapes).

  Raises:
    ValueError: mismatched shapes, `min_pairs` / `refit_every` < 1, or `min_pairs` above the
      buffer's capacity (the calibrator could never fit).

  Examples:
    >>> import jax.numpy as jnp
    >>> s = calibrator_init(capacity=8, bins=2)
    >>> s = calibrator_update(s, jnp.array([0.1, 0.3, 0.6, 0.9]), jnp.array([0.0, 0.1, 0.2, 1.0]),
    ...                       min_pairs=4, refit_every=4)
    >>> int(s.count), bool(s.fitted), int(s.num_breaks)
    (4, True, 2)
  """
  _positive_int("min_pairs", min_pairs)
  _positive_int("refit_every", refit_every)
  capacity = state.pairs.shape[0]
  if min_pairs > capacity:
    raise ValueError(f"min_pairs={min_pairs} exceeds the buffer capacity {capacity}: the "
                     "calibrator would stay at identity forever")
  r_wm = jnp.asarray(r_wm, jnp.float32)
  r_env = jnp.asarray(r_env, jnp.float32)
  if r_env.shape != r_wm.shape:
    raise ValueError(f"r_env has shape {r_env.shape}; expected r_wm's {r_wm.shape}")
  ok = jnp.ones(r_wm.shape, bool) if mask is None else jnp.asarray(mask).astype(bool)
  if ok.shape != r_wm.shape:
    raise ValueError(f"mask has shape {ok.shape}; expected r_wm's {r_wm.shape}")
  ok = ok & jnp.isfinite(r_wm) & jnp.isfinite(r_env)

  def push(s, item):
    x, y, use = item
    pushed = s._replace(pairs=s.pairs.at[s.count % capacity].set(jnp.stack([x, y])),
                        count=s.count + 1, since_fit=s.since_fit + 1)
    due = (jnp.minimum(pushed.count, capacity) >= min_pairs) & (pushed.since_fit >= refit_every)
    pushed = jax.lax.cond(due, _refit, lambda t: t, pushed)
    return jax.tree.map(lambda a, b: jnp.where(use, a, b), pushed, s), None

  state, _ = jax.lax.scan(push, state, (r_wm.reshape(-1), r_env.reshape(-1), ok.reshape(-1)))
  return state


@REWARD_CALIBRATORS.register("isotonic")
@jax.jit
def apply_calibration(state: CalibratorState, r: jax.Array) -> jax.Array:
  """f̂(r): the fitted monotone map, identity before the first fit.

  f̂(r) = piecewise-linear interpolation through (fx_k, fy_k), clamped to fy at both ends
  (`jnp.interp`); NaN stays NaN (an ungraded rollout stays ungraded).

  Args:
    state: `CalibratorState`.
    r: `[...]` world-model scores.

  Returns:
    float32 calibrated scores, shape of `r`.

  Examples:
    >>> import jax.numpy as jnp
    >>> s = calibrator_init(capacity=8, bins=2)
    >>> apply_calibration(s, jnp.array([0.3])).tolist()  # not fitted yet: identity
    [0.30000001192092896]
    >>> s = calibrator_update(s, jnp.array([0.2, 0.4, 0.6, 0.8]), jnp.array([0.0, 0.0, 1.0, 1.0]),
    ...                       min_pairs=4, refit_every=4)  # knots (0.3, 0) and (0.7, 1)
    >>> [round(v, 4) for v in apply_calibration(s, jnp.array([0.0, 0.5, 1.0])).tolist()]
    [0.0, 0.5, 1.0]
  """
  r = jnp.asarray(r, jnp.float32)
  mapped = jnp.interp(r, state.fx, state.fy)
  return jnp.where(state.fitted & ~jnp.isnan(r), mapped, r)


@REWARD_CALIBRATORS.register("identity")
@jax.jit
def identity_calibration(state: CalibratorState, r: jax.Array) -> jax.Array:
  """No calibration, r ↦ r: the "raw world model" ablation (the state is ignored).

  Examples:
    >>> import jax.numpy as jnp
    >>> identity_calibration(calibrator_init(capacity=2), jnp.array([0.25])).tolist()
    [0.25]
  """
  del state
  return jnp.asarray(r, jnp.float32)


# ---------------------------------------------------------------------------------------------
# Inverse-Variance Denoising.
# ---------------------------------------------------------------------------------------------


@jax.jit
def group_disagreement(d: jax.Array, y: jax.Array, mask: jax.Array | None = None) -> jax.Array:
  """Normalised within-group disagreement of calibrated world-model scores with the truth.

  s²_a = mean_i[((d_i − d̄) − (y_i − ȳ))²] / Var(y)   over the masked rollouts i of group a,

  with population means and variance. Centred because GRPO only sees within-group differences;
  divided by Var(y) so that groups of different difficulty are comparable. NaN for a degenerate
  group (Var(y) ≤ 1e-9, which includes groups with fewer than 2 rollouts): such a group must not
  enter the EMA. Masked entries may hold NaN / inf (ungraded rollouts).

  Args:
    d: `[A, G]` calibrated world-model scores f̂(r_wm) of the anchor groups.
    y: `[A, G]` execution scores r_env.
    mask: optional `[A, G]` bool, True = a rollout graded by both scorers.

  Returns:
    `[A]` float32 s² (NaN for degenerate groups).

  Examples:
    >>> import jax.numpy as jnp
    >>> s2 = group_disagreement(jnp.array([[0.0, 2.0], [1.0, 1.0]]),
    ...                         jnp.array([[0.0, 1.0], [0.5, 0.5]]))
    >>> s2.tolist()  # group 0: residuals ∓½, mean ¼, Var(y) ¼; group 1: Var(y) = 0
    [1.0, nan]

  References:
    Yang et al., Scaling Automatic Research Agents via World Models (WMRL), arXiv 2608.12564.
  """
  # The sketch divides by n with no guard and multiplies masked entries by 0, which turns an
  # ungraded NaN score into a NaN group; `where` keeps padding out and n is floored at 1.
  d = jnp.asarray(d, jnp.float32)
  y = jnp.asarray(y, jnp.float32)
  if d.ndim != 2:
    raise ValueError(f"d must be [A, G], got shape {d.shape}")
  if y.shape != d.shape:
    raise ValueError(f"y has shape {y.shape}; expected d's {d.shape}")
  m = jnp.ones(d.shape, bool) if mask is None else jnp.asarray(mask).astype(bool)
  if m.shape != d.shape:
    raise ValueError(f"mask has shape {m.shape}; expected d's {d.shape}")
  n = jnp.maximum(jnp.sum(m, axis=-1), 1).astype(jnp.float32)
  d = jnp.where(m, d, 0.0)
  y = jnp.where(m, y, 0.0)
  dc = jnp.where(m, d - (jnp.sum(d, -1) / n)[:, None], 0.0)
  yc = jnp.where(m, y - (jnp.sum(y, -1) / n)[:, None], 0.0)
  var_y = jnp.sum(yc**2, -1) / n
  resid = jnp.sum((dc - yc) ** 2, -1) / n
  return jnp.where(var_y > DEGENERATE_VAR, resid / jnp.where(var_y > DEGENERATE_VAR, var_y, 1.0),
                   jnp.nan)


class IVDState(NamedTuple):
  """Inverse-variance weighting state: EMA of the disagreement and the frozen scale c."""

  ema: jax.Array  # [] float32 s̄², EMA of the non-degenerate s² (0 before the first).
  count: jax.Array  # [] int32 non-degenerate groups folded in.
  c: jax.Array  # [] float32 scale, NaN until fixed (then frozen for the run).


def ivd_init() -> IVDState:
  """An empty weighter: no disagreement seen, c unset (weight 1).

  Examples:
    >>> s = ivd_init()
    >>> float(s.ema), int(s.count), bool(jnp.isnan(s.c))
    (0.0, 0, True)
  """
  return IVDState(jnp.zeros((), jnp.float32), jnp.zeros((), jnp.int32),
                  jnp.full((), jnp.nan, jnp.float32))


@functools.partial(jax.jit, static_argnames=("half_life", "warmup", "target"))
def ivd_update(
    state: IVDState,
    s2: jax.Array,
    *,
    half_life: float = 64.0,
    warmup: int = 32,
    target: float = 2.0,
) -> IVDState:
  """Folds the groups' disagreements into the EMA, in order, and fixes c once.

  For each non-NaN s² (NaN = degenerate group, skipped):
    s̄² ← s² for the first value (the EMA starts at the first observation, not at 0, so it is
         not biased towards 0 during warmup — the reference code's choice),
    s̄² ← β·s̄² + (1 − β)·s²,  β = 0.5^(1/half_life), afterwards;
    count ← count + 1;
    c ← (target − 1)/s̄² the first time count ≥ warmup (and s̄² > 1e-12); then frozen.

  Args:
    state: `IVDState`.
    s2: `[A]` disagreements (`group_disagreement`), NaN = skip.
    half_life: EMA half-life in groups (reference: 64; static).
    warmup: groups before c is fixed (reference: 32; static).
    target: weight at the moment c is fixed (reference: 2.0; static).

  Returns:
    The new `IVDState`.

  Raises:
    ValueError: `s2` is not 1-D, `half_life` ≤ 0, `warmup` < 1 or `target` < 1.

  Examples:
    >>> import jax.numpy as jnp
    >>> s = ivd_update(ivd_init(), jnp.array([0.5, jnp.nan, 0.5]), warmup=2)
    >>> float(s.ema), int(s.count), float(s.c)  # c = (2 − 1)/0.5
    (0.5, 2, 2.0)

  References:
    Yang et al., Scaling Automatic Research Agents via World Models (WMRL), arXiv 2608.12564.
  """
  if not half_life > 0:
    raise ValueError(f"half_life must be > 0, got {half_life!r}")
  _positive_int("warmup", warmup)
  if not target >= 1:
    raise ValueError(f"target must be >= 1 (a weight), got {target!r}")
  s2 = jnp.asarray(s2, jnp.float32)
  if s2.ndim != 1:
    raise ValueError(f"s2 must be [A] (one value per anchor group), got shape {s2.shape}")
  beta = 0.5 ** (1.0 / half_life)

  def fold(s, v):
    use = ~jnp.isnan(v)
    ema = jnp.where(s.count == 0, v, beta * s.ema + (1.0 - beta) * v)
    count = s.count + 1
    fix = jnp.isnan(s.c) & (count >= warmup) & (ema > MIN_EMA_FOR_C)
    c = jnp.where(fix, (target - 1.0) / jnp.where(fix, ema, 1.0), s.c)
    new = IVDState(ema.astype(jnp.float32), count, c.astype(jnp.float32))
    return jax.tree.map(lambda a, b: jnp.where(use, a, b), new, s), None

  state, _ = jax.lax.scan(fold, state, s2)
  return state


@functools.partial(jax.jit, static_argnames="w_max")
def ivd_weight(state: IVDState, *, w_max: float = 4.0) -> jax.Array:
  """Anchor-group weight w = clip(1 + c·s̄², 1, w_max); exactly 1 while c is unset.

  Args:
    state: `IVDState`.
    w_max: upper clip of the weight (reference: 4.0; static).

  Returns:
    `[]` float32 weight.

  Raises:
    ValueError: `w_max` < 1.

  Examples:
    >>> import jax.numpy as jnp
    >>> float(ivd_weight(ivd_init()))
    1.0
    >>> float(ivd_weight(IVDState(jnp.float32(3.0), jnp.int32(40), jnp.float32(2.0))))  # 1 + 6
    4.0
  """
  if not w_max >= 1:
    raise ValueError(f"w_max must be >= 1, got {w_max!r}")
  w = jnp.clip(1.0 + state.c * state.ema, 1.0, w_max)
  return jnp.where(jnp.isnan(state.c), 1.0, w).astype(jnp.float32)


# ---------------------------------------------------------------------------------------------
# Advantages and the per-step order.
# ---------------------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("eps", "min_graded"))
def wmrl_advantages(
    r: jax.Array,
    graded: jax.Array,
    is_anchor: jax.Array,
    w: ArrayLike,
    *,
    eps: float = 1e-4,
    min_graded: int = 2,
) -> jax.Array:
  """GRPO over the graded rollouts of each group, with anchor groups up-weighted by w.

  A_{b,i} = (r_{b,i} − μ_b)/(σ_b + ε) · (w if anchor b else 1)   for graded i,
  μ_b, σ_b = mean and *population* std (ddof 0, as the reference code's `np.std`) over the
  graded rollouts of group b. Ungraded rollouts are excluded from μ_b, σ_b (not scored 0) and get
  0; a group with fewer than `min_graded` graded rollouts gets 0 everywhere.

  Args:
    r: `[B, G]` rewards: r_env for anchor groups, f̂(r_wm) for the others (ungraded may be NaN).
    graded: `[B, G]` bool, True = the rollout has a reward.
    is_anchor: `[B]` bool, True = the group was scored by real execution.
    w: `[]` anchor weight (`ivd_weight`).
    eps: ε added to σ (reference: 1e-4; static).
    min_graded: fewest graded rollouts for a group to count (reference: 2; static).

  Returns:
    `[B, G]` float32 advantages.

  Raises:
    ValueError: mismatched shapes, or `min_graded` < 1.

  Examples:
    >>> import jax.numpy as jnp
    >>> adv = wmrl_advantages(jnp.array([[1.0, 0.0, jnp.nan], [1.0, 0.0, 0.5]]),
    ...                       jnp.array([[True, True, False], [True, True, False]]),
    ...                       jnp.array([True, False]), 2.0, eps=0.0)
    >>> adv.tolist()  # μ = ½, σ = ½ in both groups; the anchor group × 2
    [[2.0, -2.0, 0.0], [1.0, -1.0, 0.0]]

  References:
    Yang et al., Scaling Automatic Research Agents via World Models (WMRL), arXiv 2608.12564.
    Shao et al., DeepSeekMath (GRPO), arXiv 2402.03300.
  """
  _positive_int("min_graded", min_graded)
  r = jnp.asarray(r, jnp.float32)
  if r.ndim != 2:
    raise ValueError(f"r must be [B, G], got shape {r.shape}")
  graded = jnp.asarray(graded).astype(bool)
  if graded.shape != r.shape:
    raise ValueError(f"graded has shape {graded.shape}; expected r's {r.shape}")
  is_anchor = jnp.asarray(is_anchor).astype(bool)
  if is_anchor.shape != r.shape[:1]:
    raise ValueError(f"is_anchor has shape {is_anchor.shape}; expected ({r.shape[0]},) "
                     "(one flag per group)")
  w = jnp.asarray(w, jnp.float32)
  if w.ndim != 0:
    raise ValueError(f"w must be a scalar weight, got shape {w.shape}")
  num_groups, group_size = r.shape
  gid = jnp.repeat(jnp.arange(num_groups, dtype=jnp.int32), group_size)
  flat = jnp.where(graded, r, jnp.nan).reshape(-1)
  adv = group_advantages(flat, gid, num_groups=num_groups, std="group", eps=eps, ddof=0)
  adv = adv.reshape(r.shape)
  enough = jnp.sum(graded, axis=-1, keepdims=True) >= min_graded
  scale = jnp.where(is_anchor, w, 1.0)[:, None]
  return jnp.where(graded & enough, adv * scale, 0.0)


class WMRLMetrics(NamedTuple):
  """What one `wmrl_step` measured."""

  weight: jax.Array  # [] anchor weight w used for the advantages.
  disagreement: jax.Array  # [B] s² per group (NaN for non-anchor and degenerate groups).
  rewards: jax.Array  # [B, G] rewards the advantages were formed on (NaN = ungraded).
  fitted: jax.Array  # [] bool, whether f̂ is fitted after the step.
  num_pairs: jax.Array  # [] int32 pairs pushed so far.


class WMRLStep(NamedTuple):
  calibrator: CalibratorState
  ivd: IVDState
  advantages: jax.Array  # [B, G]
  metrics: WMRLMetrics


@functools.partial(jax.jit, static_argnames=(
    "calibrator", "min_pairs", "refit_every", "half_life", "warmup", "target", "w_max", "eps",
    "min_graded"))
def wmrl_step(
    calibrator_state: CalibratorState,
    ivd_state: IVDState,
    r_wm: jax.Array,
    r_env: jax.Array,
    is_anchor: jax.Array,
    *,
    calibrator: str = "isotonic",
    min_pairs: int = 200,
    refit_every: int = 64,
    half_life: float = 64.0,
    warmup: int = 32,
    target: float = 2.0,
    w_max: float = 4.0,
    eps: float = 1e-4,
    min_graded: int = 2,
) -> WMRLStep:
  """One WMRL step, in the reference order, as a pure function of (states, scores).

  Groups are visited in order b = 0..B−1 (as the reference `CorrectionLoop.step`):
    anchor b:     push its pairs (r_wm, r_env) graded by both into the calibrator, then
                  s²_b = group_disagreement(f̂(r_wm_b), r_env_b) with the *updated* f̂, folded
                  into the IVD state; its rewards are r_env_b;
    non-anchor b: rewards f̂(r_wm_b) with the calibrator as it stands at that point.
  Then w = ivd_weight(...) and A = wmrl_advantages(rewards, graded, is_anchor, w).
  Graded means a finite r_env in an anchor group and a finite r_wm elsewhere.

  Args:
    calibrator_state: `CalibratorState`.
    ivd_state: `IVDState`.
    r_wm: `[B, G]` world-model scores (NaN = ungraded; anchors need them for the pairs).
    r_env: `[B, G]` execution scores of anchor groups (NaN = ungraded or not executed; ignored
      in non-anchor groups).
    is_anchor: `[B]` bool.
    calibrator: name in `REWARD_CALIBRATORS` ("isotonic" or "identity" for the raw-world-model
      ablation; the buffer is filled either way; static).
    min_pairs, refit_every: see `calibrator_update`.
    half_life, warmup, target: see `ivd_update`.
    w_max: see `ivd_weight`.
    eps, min_graded: see `wmrl_advantages`.

  Returns:
    `WMRLStep(calibrator, ivd, advantages [B, G], metrics)`.

  Examples:
    >>> import jax.numpy as jnp
    >>> out = wmrl_step(calibrator_init(capacity=8), ivd_init(),
    ...                 jnp.array([[0.9, 0.1], [0.8, 0.2]]), jnp.array([[1.0, 0.0], [0.0, 0.0]]),
    ...                 jnp.array([True, False]), min_pairs=4, refit_every=4, eps=0.0)
    >>> out.advantages.tolist(), int(out.metrics.num_pairs)  # w = 1 before calibration
    ([[1.0, -1.0], [1.0, -1.0]], 2)

  References:
    Yang et al., Scaling Automatic Research Agents via World Models (WMRL), arXiv 2608.12564.
  """
  apply = REWARD_CALIBRATORS.get(calibrator)
  r_wm = jnp.asarray(r_wm, jnp.float32)
  r_env = jnp.asarray(r_env, jnp.float32)
  if r_wm.ndim != 2:
    raise ValueError(f"r_wm must be [B, G], got shape {r_wm.shape}")
  if r_env.shape != r_wm.shape:
    raise ValueError(f"r_env has shape {r_env.shape}; expected r_wm's {r_wm.shape}")
  is_anchor = jnp.asarray(is_anchor).astype(bool)
  if is_anchor.shape != r_wm.shape[:1]:
    raise ValueError(f"is_anchor has shape {is_anchor.shape}; expected ({r_wm.shape[0]},)")

  def visit(carry, row):
    cal, ivd = carry
    wm, env, anchor = row
    both = anchor & jnp.isfinite(wm) & jnp.isfinite(env)
    cal = calibrator_update(cal, wm, env, both, min_pairs=min_pairs, refit_every=refit_every)
    d = apply(cal, wm)
    s2 = jnp.where(anchor, group_disagreement(d[None], env[None], both[None])[0], jnp.nan)
    ivd = ivd_update(ivd, s2[None], half_life=half_life, warmup=warmup, target=target)
    reward = jnp.where(anchor, env, d)
    return (cal, ivd), (reward, s2)

  (cal, ivd), (rewards, s2) = jax.lax.scan(
      visit, (calibrator_state, ivd_state), (r_wm, r_env, is_anchor))
  w = ivd_weight(ivd, w_max=w_max)
  graded = jnp.isfinite(rewards)
  adv = wmrl_advantages(rewards, graded, is_anchor, w, eps=eps, min_graded=min_graded)
  metrics = WMRLMetrics(w, s2, jnp.where(graded, rewards, jnp.nan), cal.fitted, cal.count)
  return WMRLStep(cal, ivd, adv, metrics)
