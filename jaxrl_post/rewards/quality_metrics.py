"""Correlation metrics of quality assessment: SRCC, KRCC, PLCC and RMSE after a logistic fit.

The PCQA-R1 evaluation protocol (arXiv 2608.18627): SRCC = Spearman(gt, pred) on the
raw predictions, KRCC = Kendall's τ-b, and PLCC / RMSE between the ground truth and the
predictions mapped through the 4-parameter logistic

  f(x) = β2 + (β1 − β2) / (1 + exp(−(x − β3) / |β4|))

fitted by least squares from (β1, β2, β3, β4) = (max gt, min gt, mean pred, 0.5); when the fit
fails the raw predictions are used. The fit is the usual VQEG-style correction of a monotone
non-linearity between the predicted and the subjective scale, so PLCC measures the rest.

Host-side numpy in float64, no scipy at run time: ranks by sorting, τ-b by counting discordant
pairs with a vectorised merge count (O(n log² n): ≈ 0.1 s for 30k samples), and the
logistic fitted by Levenberg–Marquardt with the analytic Jacobian. The tests compare everything
with scipy.stats and scipy.optimize.curve_fit.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

# |β4| is floored here inside the logistic, as the released evaluation does, so a collapsing
# slope cannot divide by zero.
_MIN_SLOPE = 1e-10


class LogisticFit(NamedTuple):
  """Result of `logistic_fit`."""

  fitted: np.ndarray  # [n] f(pred), or pred itself when the fit fell back.
  params: np.ndarray  # [4] (β1, β2, β3, β4); NaN when the fit fell back.
  converged: bool  # The optimiser met its tolerances (False also after a fall-back).
  fell_back: bool  # The fit failed and `fitted` holds the raw predictions.


class QualityMetrics(NamedTuple):
  """Correlation metrics of one set of predictions (Python floats; NaN where undefined)."""

  srcc: float  # Spearman rank correlation, raw predictions.
  krcc: float  # Kendall τ-b, raw predictions.
  plcc: float  # Pearson correlation after the logistic fit.
  rmse: float  # Root-mean-square error after the logistic fit (in MOS units).
  plcc_raw: float  # Pearson correlation of the raw predictions.
  fit_fell_back: bool  # The logistic fit failed and PLCC / RMSE use the raw predictions.
  fit_converged: bool  # The logistic fit met its tolerances (see `logistic_fit`).
  n: int  # Number of samples.


def _as_pair(gt, pred) -> tuple[np.ndarray, np.ndarray]:
  gt = np.asarray(gt, np.float64).reshape(-1)
  pred = np.asarray(pred, np.float64).reshape(-1)
  if gt.shape != pred.shape:
    raise ValueError(f"gt and pred differ in length: {gt.shape[0]} vs {pred.shape[0]}")
  if not (np.all(np.isfinite(gt)) and np.all(np.isfinite(pred))):
    # Unparseable predictions must be resolved by the caller (the released evaluation scores
    # them 3.0); silently dropping them would flatter the model.
    raise ValueError("gt and pred must be finite")
  return gt, pred


def pearson(x, y) -> float:
  """Pearson's r = Σ(x − x̄)(y − ȳ) / √(Σ(x − x̄)² Σ(y − ȳ)²); NaN if either side is constant.

  Examples:
    >>> round(pearson([1, 2, 3, 4], [1, 3, 2, 4]), 4)
    0.8
  """
  x, y = _as_pair(x, y)
  if x.size < 2:
    return float("nan")
  dx, dy = x - x.mean(), y - y.mean()
  denom = np.sqrt(np.sum(dx * dx) * np.sum(dy * dy))
  if denom == 0.0:
    return float("nan")
  return float(np.clip(np.sum(dx * dy) / denom, -1.0, 1.0))


def average_ranks(x) -> np.ndarray:
  """Ranks 1..n of `x`, tied values sharing the mean of their ranks (scipy's "average").

  Examples:
    >>> average_ranks([10.0, 30.0, 20.0, 20.0]).tolist()
    [1.0, 4.0, 2.5, 2.5]
  """
  x = np.asarray(x, np.float64).reshape(-1)
  _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
  # The tie group g occupies ranks end_g − count_g + 1 .. end_g; its mean rank is their midpoint.
  ends = np.cumsum(counts)
  return (ends - (counts - 1) / 2.0)[inverse]


def srcc(gt, pred) -> float:
  """Spearman's rank correlation: Pearson's r of the average ranks (ties handled as in scipy).

  Examples:
    >>> srcc([1.0, 2.0, 3.0, 4.0], [10.0, 30.0, 20.0, 40.0])
    0.8
  """
  gt, pred = _as_pair(gt, pred)
  return pearson(average_ranks(gt), average_ranks(pred))


def _tied_pairs(*keys: np.ndarray) -> int:
  """Number of pairs equal in every key: Σ over groups of equal rows of t(t − 1)/2."""
  _, counts = np.unique(np.stack(keys, axis=1), axis=0, return_counts=True)
  return int(np.sum(counts * (counts - 1) // 2))


def _count_inversions(values: np.ndarray) -> int:
  """Pairs i < j with values[i] > values[j] (strictly), for non-negative integer `values`.

  Bottom-up merge counting, vectorised over all blocks of a level: at block size w, for every
  pair of neighbouring sorted blocks (L, R) each element r of R is inverted with the elements of
  L greater than r, found by one `searchsorted` over all blocks at once (block b's values are
  shifted by b·M so the concatenation of sorted blocks stays sorted).
  """
  n = values.size
  if n < 2:
    return 0
  size = 1 << (n - 1).bit_length()
  big = int(values.max()) + 1
  # Padding on the right with the largest value adds no strict inversion.
  padded = np.full(size, big, np.int64)
  padded[:n] = values
  total = 0
  width = 1
  while width < size:
    blocks = np.sort(padded.reshape(-1, 2 * width).reshape(-1, 2, width), axis=-1)
    num_pairs = blocks.shape[0]
    shift = (np.arange(num_pairs, dtype=np.int64) * (big + 1))[:, None]
    left = (blocks[:, 0] + shift).reshape(-1)
    right = (blocks[:, 1] + shift).reshape(-1)
    not_greater = np.searchsorted(left, right, side="right")  # counts across earlier blocks too
    left_end = np.repeat((np.arange(num_pairs, dtype=np.int64) + 1) * width, width)
    total += int(np.sum(left_end - not_greater))
    width *= 2
  return total


def krcc(gt, pred) -> float:
  """Kendall's τ-b, the tie-corrected rank correlation (scipy.stats.kendalltau's default).

  τ_b = (C − D) / √((n0 − n1)(n0 − n2)),  n0 = n(n − 1)/2,
  n1, n2 = pairs tied in gt, in pred;  C − D = n0 − n1 − n2 + n3 − 2D,
  n3 = pairs tied in both, D = discordant pairs. NaN when every pair is tied on one side.

  Examples:
    >>> round(krcc([1, 2, 3, 4], [1, 3, 2, 4]), 4)  # C = 5, D = 1: (5 − 1)/6
    0.6667
  """
  gt, pred = _as_pair(gt, pred)
  n = gt.size
  if n < 2:
    return float("nan")
  n0 = n * (n - 1) // 2
  n1, n2, n3 = _tied_pairs(gt), _tied_pairs(pred), _tied_pairs(gt, pred)
  if n0 == n1 or n0 == n2:
    return float("nan")
  # Sorted by gt, ties broken by pred ascending, a pair i < j is discordant exactly when
  # pred_i > pred_j strictly: pairs tied in gt are ordered by pred and never counted.
  order = np.lexsort((pred, gt))
  pred_rank = np.unique(pred, return_inverse=True)[1].reshape(-1)[order]
  discordant = _count_inversions(pred_rank.astype(np.int64))
  s = n0 - n1 - n2 + n3 - 2 * discordant
  return float(np.clip(s / np.sqrt(float(n0 - n1) * float(n0 - n2)), -1.0, 1.0))


def logistic4(x, params) -> np.ndarray:
  """f(x) = β2 + (β1 − β2) / (1 + exp(−(x − β3) / |β4|)), |β4| floored at 1e-10.

  Examples:
    >>> logistic4([2.0], [5.0, 1.0, 2.0, 0.5]).tolist()  # the midpoint (β1 + β2)/2
    [3.0]
  """
  return _logistic_and_jacobian(np.asarray(x, np.float64), np.asarray(params, np.float64))[0]


def _sigmoid(u: np.ndarray) -> np.ndarray:
  e = np.exp(-np.abs(u))  # never overflows
  return np.where(u >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def _logistic_and_jacobian(x, params):
  b1, b2, b3, b4 = params
  slope = max(abs(b4), _MIN_SLOPE)
  u = (x - b3) / slope
  s = _sigmoid(u)
  f = b2 + (b1 - b2) * s
  ds = (b1 - b2) * s * (1.0 - s)  # ∂f/∂u
  # ∂u/∂β3 = −1/|β4|;  ∂u/∂β4 = −u·sign(β4)/|β4|  (0 below the floor, where |β4| is constant).
  du_db4 = -u * np.sign(b4) / slope if abs(b4) > _MIN_SLOPE else np.zeros_like(u)
  jac = np.stack([s, 1.0 - s, -ds / slope, ds * du_db4], axis=1)
  return f, jac


def _levenberg_marquardt(x, y, params, *, max_iter, ftol, xtol):
  """Minimises Σ (f(x; β) − y)² from `params`; returns (β, converged).

  Marquardt's scaled damping (JᵀJ + λ·diag(JᵀJ)) δ = −Jᵀr, so the step does not depend on the
  units of β (β1, β2 live on the MOS scale, β3, β4 on the prediction scale), with Nielsen's
  update of λ from the gain ratio ρ = actual / predicted reduction. It stops as MINPACK does
  (what scipy's curve_fit runs): when both the actual and the predicted relative reductions of
  an accepted step are ≤ `ftol`, or the step is ≤ `xtol` relative to |β|.
  """
  f, jac = _logistic_and_jacobian(x, params)
  resid = f - y
  cost = float(resid @ resid)
  damping, growth = 1e-3, 2.0
  for _ in range(max_iter):
    if cost == 0.0:
      return params, True
    grad = jac.T @ resid
    jtj = jac.T @ jac
    diag = np.diag(jtj)
    diag = np.maximum(diag, 1e-12 * max(float(np.max(diag)), 1e-300))
    try:
      step = np.linalg.solve(jtj + damping * np.diag(diag), -grad)
    except np.linalg.LinAlgError:
      step = None
    if step is not None and np.all(np.isfinite(step)):
      predicted = -float(2.0 * step @ grad + step @ jtj @ step)
      new_f, new_jac = _logistic_and_jacobian(x, params + step)
      new_resid = new_f - y
      new_cost = float(new_resid @ new_resid)
      actual = cost - new_cost
      if np.isfinite(new_cost) and actual > 0.0 and predicted > 0.0:
        rho = actual / predicted
        damping *= max(1.0 / 3.0, 1.0 - (2.0 * rho - 1.0) ** 3)
        growth = 2.0
        done = (actual <= ftol * cost and predicted <= ftol * cost) or (
          np.linalg.norm(step) <= xtol * (np.linalg.norm(params) + xtol)
        )
        params, jac, resid, cost = params + step, new_jac, new_resid, new_cost
        if done:
          return params, True
        continue
    # Rejected step: damp harder, faster each time in a row (Nielsen).
    damping *= growth
    growth *= 2.0
    if damping > 1e20:
      return params, True  # No damped step lowers the cost: a (numerical) minimum.
  return params, False


def logistic_fit(
  gt,
  pred,
  *,
  max_iter: int = 1000,
  ftol: float = 1e-10,
  xtol: float = 1e-10,
) -> LogisticFit:
  """Least-squares fit of `logistic4` mapping predictions onto the ground truth.

  Starts from (β1, β2, β3, β4) = (max gt, min gt, mean pred, 0.5) as the PCQA-R1 evaluation
  does, and runs Levenberg–Marquardt (Marquardt scaling, analytic Jacobian, Nielsen damping)
  until the actual and predicted relative cost reductions fall below `ftol` or the step below
  `xtol` relative to |β|. The fit *fails*, and the raw predictions are returned (`fell_back`),
  when there are fewer samples than parameters (4) or the result is not finite — where scipy's
  curve_fit would raise. After `max_iter` iterations without meeting the tolerances the best
  parameters so far are kept, with `converged=False`: this happens when the least-squares
  optimum lies at infinity (data that a logistic only fits in its exponential tail), where the
  cost keeps creeping down along a valley and curve_fit, too, stops at an arbitrary point of it;
  the fitted values, and PLCC, hardly change along that valley.

  Args:
    gt: `[n]` ground-truth MOS.
    pred: `[n]` predictions.
    max_iter: budget of iterations (accepted or rejected steps).
    ftol: relative cost-reduction tolerance.
    xtol: relative step tolerance.

  Returns:
    `LogisticFit(fitted, params, converged, fell_back)`.

  Examples:
    >>> import numpy as np
    >>> pred = np.linspace(1.0, 5.0, 9)
    >>> gt = logistic4(pred, [0.9, 0.1, 3.0, 0.7])
    >>> fit = logistic_fit(gt, pred)
    >>> np.round(fit.params, 6).tolist(), fit.fell_back
    ([0.9, 0.1, 3.0, 0.7], False)
  """
  gt, pred = _as_pair(gt, pred)
  fallback = LogisticFit(pred.copy(), np.full(4, np.nan), False, True)
  if gt.size < 4:
    return fallback
  init = np.array([gt.max(), gt.min(), pred.mean(), 0.5])
  with np.errstate(over="ignore", invalid="ignore"):
    params, converged = _levenberg_marquardt(
      pred, gt, init, max_iter=max_iter, ftol=ftol, xtol=xtol
    )
    fitted = logistic4(pred, params)
  if not (np.all(np.isfinite(params)) and np.all(np.isfinite(fitted))):
    return fallback
  return LogisticFit(fitted, params, bool(converged), False)


def quality_metrics(gt, pred) -> QualityMetrics:
  """SRCC, KRCC, PLCC and RMSE (after the logistic fit) of predictions against the MOS.

  Args:
    gt: `[n]` ground-truth MOS, finite.
    pred: `[n]` predicted scores, finite (resolve unparseable answers before calling).

  Returns:
    `QualityMetrics`.

  Examples:
    >>> m = quality_metrics([1.0, 2.0, 3.0, 4.0, 5.0], [1.2, 1.9, 3.4, 3.9, 4.6])
    >>> round(m.srcc, 4), round(m.krcc, 4), m.n
    (1.0, 1.0, 5)
  """
  gt, pred = _as_pair(gt, pred)
  fit = logistic_fit(gt, pred)
  return QualityMetrics(
    srcc=srcc(gt, pred),
    krcc=krcc(gt, pred),
    plcc=pearson(gt, fit.fitted),
    rmse=float(np.sqrt(np.mean(np.square(gt - fit.fitted)))) if gt.size else float("nan"),
    plcc_raw=pearson(gt, pred),
    fit_fell_back=fit.fell_back,
    fit_converged=fit.converged,
    n=int(gt.size),
  )
