"""Set-level box matching: rewards and metrics for dense perception (Falcon Perception-HD).

A rollout of a dense-perception policy is a *set* of boxes; its reward compares that set with the
ground-truth set (Falcon Perception-HD, arXiv 2608.18881: the count reward of its GRPO recipe,
and its evaluation protocol, which follows the `eval/metrics.py` of Falcon Perception's code,
github.com/tiiuae/Falcon-Perception).

Boxes are `[n, 4]` arrays in normalised centre format `(cx, cy, w, h)`. The paper writes its
size token as `<size>(h, w)`: a decoder turning tokens into boxes must reorder it to `(w, h)`.

Host side (numpy, float64; the reward path of the trainer):

* `box_iou` — the `[P, G]` IoU matrix.
* `linear_assignment` — an exact min-cost (or max-weight) rectangular assignment, a
  shortest-augmenting-path Hungarian solver in numpy, so scipy is not needed at run time.
* `match` — the maximum-total-IoU one-to-one matching among pairs with IoU > τ → `MatchResult`.
* `count_reward`, `f1_reward`, `pq_reward` (named in `SET_REWARDS` as "count", "f1", "pq"),
  `reward_from_counts`, and over a batch of rollouts `batch_rewards` / `count_rewards`.
* Evaluation: `nms`, `redundancy_rate`, `threshold_counts`, `sample_f1`, `macro_f1`,
  `positive_micro_f1`, `presence_mcc` and `evaluate`, which computes them all in one pass.

Device side (jnp, jittable, vmappable over a padded batch of rollouts): `box_iou_jnp` and
`greedy_match_jnp`, a greedy approximation of `match` with fixed shapes and validity masks.

Conventions for empty sets (PROPOSAL; the paper does not say): a rollout that predicts nothing
for an image with no objects is perfect — count reward 0 (its maximum), F1 = 1, PQ = 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_post.registry import Registry

SET_REWARDS: Registry = Registry("set reward")

# PBench / SA-Co thresholds 0.50, 0.55, ..., 0.95. Rounded so that each is the double nearest
# its decimal value (np.arange accumulates error: its 0.75 would not be 0.75).
IOU_THRESHOLDS = np.round(0.5 + 0.05 * np.arange(10), 2)
IOU_THRESHOLDS.flags.writeable = False

REWARD_KINDS = ("count", "f1", "pq")


# ---------------------------------------------------------------------------------------------
# IoU
# ---------------------------------------------------------------------------------------------


def _as_boxes(boxes) -> np.ndarray:
  """`[n, 4]` float64 array; any empty input (`[]`, `np.zeros((0,))`) becomes `[0, 4]`."""
  arr = np.asarray(boxes, dtype=np.float64)
  if arr.size == 0:
    return arr.reshape(0, 4)
  if arr.ndim != 2 or arr.shape[1] != 4:
    raise ValueError(f"boxes must have shape [n, 4] (cx, cy, w, h), got {arr.shape}")
  return arr


def _iou(xp, a, b):
  """IoU of every box of `a` ([P, 4]) with every box of `b` ([G, 4]), in the array module `xp`."""

  def corners(x):
    # Negative sizes are treated as zero: such a box is empty and overlaps nothing.
    half = xp.maximum(x[:, 2:], 0.0) / 2
    return x[:, :2] - half, x[:, :2] + half

  a_lo, a_hi = corners(a)
  b_lo, b_hi = corners(b)
  lo = xp.maximum(a_lo[:, None], b_lo[None])
  hi = xp.minimum(a_hi[:, None], b_hi[None])
  inter = xp.prod(xp.maximum(hi - lo, 0.0), axis=-1)
  # Areas from the same corners as the intersection, so that a box's IoU with itself is exactly
  # 1 in floating point (w·h and the corner difference can differ in the last bit).
  area_a = xp.prod(a_hi - a_lo, axis=-1)
  area_b = xp.prod(b_hi - b_lo, axis=-1)
  union = area_a[:, None] + area_b[None, :] - inter
  # Two empty boxes have union 0; their IoU is 0, not NaN.
  return xp.where(union > 0, inter / xp.where(union > 0, union, 1.0), 0.0)


def box_iou(pred_boxes, gt_boxes) -> np.ndarray:
  """IoU matrix of two sets of `(cx, cy, w, h)` boxes (host, float64).

  IoU(a, b) = |a ∩ b| / (|a| + |b| − |a ∩ b|); 0 when both boxes are empty.

  Args:
    pred_boxes: `[P, 4]` boxes (an empty sequence counts as `[0, 4]`).
    gt_boxes: `[G, 4]` boxes.

  Returns:
    `[P, G]` float64 IoUs in [0, 1].

  Examples:
    >>> box_iou([[0.25, 0.5, 0.5, 0.5]], [[0.5, 0.5, 0.5, 0.5], [0.9, 0.9, 0.1, 0.1]]).tolist()
    [[0.3333333333333333, 0.0]]
  """
  return _iou(np, _as_boxes(pred_boxes), _as_boxes(gt_boxes))


@jax.jit
def box_iou_jnp(pred_boxes: jax.Array, gt_boxes: jax.Array) -> jax.Array:
  """Jittable `box_iou`: `[P, 4]`, `[G, 4]` boxes `(cx, cy, w, h)` → `[P, G]` IoUs (float32)."""
  a = jnp.asarray(pred_boxes, jnp.float32).reshape(-1, 4)
  b = jnp.asarray(gt_boxes, jnp.float32).reshape(-1, 4)
  return _iou(jnp, a, b)


# ---------------------------------------------------------------------------------------------
# Exact assignment (host)
# ---------------------------------------------------------------------------------------------


def _shortest_augmenting_path(cost: np.ndarray) -> np.ndarray:
  """Min-cost assignment of every row of `cost` ([n, m], n ≤ m, finite) to a distinct column.

  Keeps dual potentials u (rows), v (columns) with reduced costs c_ij − u_i − v_j ≥ 0, zero on
  assigned pairs, and v_j = 0 on free columns (the dual of the rectangular problem wants v ≤ 0).
  Each free row is matched by a Dijkstra search over reduced costs to the nearest free column,
  after which the potentials are shifted so that the search tree becomes tight, and the path is
  flipped. That is O(n²m) in the worst case; each Dijkstra step is one vectorised pass over the
  columns, so the Python loop runs once per scanned column, not once per entry.

  Returns:
    `[n]` int column assigned to each row.
  """
  n, m = cost.shape
  row4col = np.full(m, -1, np.intp)
  col4row = np.full(n, -1, np.intp)
  # Warm start: row reduction gives feasible potentials with v = 0; each row's cheapest column
  # is tight, so the first row that claims a column keeps it without any search. For sparse
  # IoU-derived costs this settles most rows before the first Dijkstra run.
  u = cost.min(axis=1)
  v = np.zeros(m)
  cheapest = cost.argmin(axis=1)
  cols, first_rows = np.unique(cheapest, return_index=True)
  row4col[cols] = first_rows
  col4row[first_rows] = cols

  for start in np.flatnonzero(col4row < 0):
    open_dist = np.full(m, np.inf)  # tentative distances of columns not yet scanned
    dist = np.zeros(m)  # final distances of scanned columns
    # v shifted to −inf on scanned columns, so their reduced cost reads +inf and never wins.
    v_open = v.copy()
    path = np.full(m, -1, np.intp)  # row from which each column was last reached
    scanned_rows = [start]
    min_val = 0.0
    i = start
    while True:
      reduced = cost[i] - v_open + (min_val - u[i])
      closer = reduced < open_dist
      open_dist[closer] = reduced[closer]
      path[closer] = i
      j = int(np.argmin(open_dist))
      min_val = open_dist[j]
      if row4col[j] >= 0:
        # Among equally near columns prefer a free one: the path ends one step sooner. This
        # matters for ties (many identical boxes), where it keeps each search O(1) steps.
        free_ties = np.flatnonzero((open_dist == min_val) & (row4col < 0))
        if free_ties.size:
          j = int(free_ties[0])
      dist[j] = min_val
      open_dist[j] = np.inf
      v_open[j] = -np.inf
      if row4col[j] < 0:
        sink = j
        break
      i = row4col[j]
      scanned_rows.append(i)

    # Shift the potentials: edges of the search tree become tight, the rest stay ≥ 0.
    scanned_cols = np.isneginf(v_open)
    rows = np.asarray(scanned_rows[1:], np.intp)
    u[start] += min_val
    u[rows] += min_val - dist[col4row[rows]]
    v[scanned_cols] -= min_val - dist[scanned_cols]
    # Flip the augmenting path back to the start row.
    j = sink
    while True:
      i = path[j]
      row4col[j] = i
      col4row[i], j = j, col4row[i]
      if i == start:
        break
  return col4row


def linear_assignment(cost, *, maximize: bool = False) -> tuple[np.ndarray, np.ndarray]:
  """Exact rectangular linear assignment (the Hungarian problem), host-side numpy.

  Finds distinct rows r_k and columns c_k, k < min(n, m), minimising (or, with `maximize`,
  maximising) Σ_k C[r_k, c_k]; every row (if n ≤ m) or every column (if n > m) is assigned.
  Same contract as `scipy.optimize.linear_sum_assignment` (scipy is only a test dependency here):
  rows come back in increasing order. Among several optimal assignments, which one is returned is
  deterministic but unspecified.

  Args:
    cost: `[n, m]` finite costs.
    maximize: maximise instead of minimise.

  Returns:
    `(rows, cols)`, two `[min(n, m)]` int arrays.

  Examples:
    >>> rows, cols = linear_assignment([[4.0, 1.0, 3.0], [2.0, 0.0, 5.0], [3.0, 2.0, 2.0]])
    >>> rows.tolist(), cols.tolist()
    ([0, 1, 2], [1, 0, 2])
  """
  c = np.asarray(cost, dtype=np.float64)
  if c.ndim != 2:
    raise ValueError(f"cost must be a matrix, got shape {c.shape}")
  if not np.all(np.isfinite(c)):
    raise ValueError("cost must be finite")
  if maximize:
    c = -c
  transposed = c.shape[0] > c.shape[1]
  if transposed:
    c = c.T
  if c.shape[0] == 0:
    return np.zeros(0, np.intp), np.zeros(0, np.intp)
  # Subtracting the minimum changes no optimum and keeps the potentials near zero.
  cols = _shortest_augmenting_path(c - c.min())
  rows = np.arange(c.shape[0])
  if transposed:
    order = np.argsort(cols)
    return cols[order], rows[order]
  return rows, cols


# ---------------------------------------------------------------------------------------------
# Matching and rewards (host)
# ---------------------------------------------------------------------------------------------


class MatchResult(NamedTuple):
  """A one-to-one matching of predicted to ground-truth boxes; pairs sorted by prediction index."""

  pred_indices: np.ndarray  # [TP] int, index of each matched prediction.
  gt_indices: np.ndarray  # [TP] int, the ground-truth box it is matched to.
  ious: np.ndarray  # [TP] float64 IoU of each matched pair (all > the threshold).
  num_tp: int  # Matched pairs.
  num_fp: int  # Unmatched predictions: P − TP (duplicates land here).
  num_fn: int  # Unmatched ground-truth boxes: G − TP.


def _match_iou(iou: np.ndarray, iou_threshold: float) -> MatchResult:
  num_pred, num_gt = iou.shape
  # Only pairs above the threshold may match. Zeroing the others makes "matched at weight 0" the
  # same as "unmatched", so a complete assignment of the weights is a maximum-weight matching.
  weight = np.where(iou > iou_threshold, iou, 0.0)
  # Boxes with no candidate partner are unmatched whatever happens: drop them before solving.
  # On dense scenes this leaves a much smaller (and usually nearly diagonal) problem.
  rows = np.flatnonzero(weight.any(axis=1))
  cols = np.flatnonzero(weight.any(axis=0))
  pred_idx = gt_idx = np.zeros(0, np.intp)
  if rows.size:
    sub = weight[np.ix_(rows, cols)]
    r, c = linear_assignment(sub, maximize=True)
    keep = sub[r, c] > 0
    pred_idx, gt_idx = rows[r[keep]], cols[c[keep]]
    order = np.argsort(pred_idx)
    pred_idx, gt_idx = pred_idx[order], gt_idx[order]
  tp = int(pred_idx.size)
  return MatchResult(pred_idx, gt_idx, iou[pred_idx, gt_idx], tp, num_pred - tp, num_gt - tp)


def match(pred_boxes, gt_boxes, *, iou_threshold: float = 0.5) -> MatchResult:
  """Exact set matching: the one-to-one matching of maximum total IoU among pairs with IoU > τ.

  max_M Σ_{(p,g)∈M} IoU(p, g)  over matchings M ⊆ {(p, g) : IoU(p, g) > τ};
  TP = |M|, FP = P − TP, FN = G − TP. A pair at exactly IoU = τ never matches.

  The paper runs the Hungarian algorithm on the raw IoU matrix and then drops the pairs at or
  below τ (arXiv 2608.18881, the count reward). Here the pairs at or below τ are removed *before*
  solving (PROPOSAL: this implementation's choice). Whenever the raw optimum uses no pair below τ
  the two agree; otherwise the raw optimum may spend a box on a sub-threshold pair that is then
  dropped, while this matching never does. Each ground-truth box matches once, so a duplicate
  prediction is a false positive: this is what lets the count reward stand in for NMS.

  Args:
    pred_boxes: `[P, 4]` predicted boxes `(cx, cy, w, h)`; may be empty.
    gt_boxes: `[G, 4]` ground-truth boxes; may be empty.
    iou_threshold: τ.

  Returns:
    `MatchResult`.

  Examples:
    >>> gt = [[0.25, 0.25, 0.2, 0.2], [0.75, 0.75, 0.2, 0.2]]
    >>> pred = [[0.25, 0.25, 0.2, 0.2], [0.25, 0.25, 0.2, 0.2]]  # a hit and its duplicate
    >>> m = match(pred, gt)
    >>> m.pred_indices.tolist(), m.gt_indices.tolist(), (m.num_tp, m.num_fp, m.num_fn)
    ([0], [0], (1, 1, 1))
  """
  return _match_iou(box_iou(pred_boxes, gt_boxes), iou_threshold)


def reward_from_counts(tp, fp, fn, iou_sum=0.0, *, kind: str = "count", fp_weight: float = 0.3):
  """A set reward from match counts; numpy or (jittable) jax inputs, scalars or arrays.

  count:  r = −(FN + α·FP)                          (FP-HD's reward; α = `fp_weight`)
  f1:     r = 2·TP / (2·TP + FP + FN)               (= 2PR / (P + R); 1 if the sum is 0)
  pq:     r = Σ_matched IoU / (TP + FP/2 + FN/2)    (panoptic quality; 1 if the sum is 0)

  The "1 if 0" cases are exactly "no predictions and no ground truth", which is a perfect answer
  (the count reward is then 0, its maximum).

  Args:
    tp, fp, fn: counts.
    iou_sum: Σ IoU over the matched pairs (only "pq" uses it).
    kind: "count", "f1" or "pq".
    fp_weight: α of the count reward.

  Returns:
    The reward, with the broadcast shape of the inputs.

  Examples:
    >>> reward_from_counts(2, 1, 1), reward_from_counts(2, 1, 1, kind="f1")
    (-1.3, 0.6666666666666666)
    >>> reward_from_counts(0, 0, 0, kind="pq")
    1.0
  """
  if kind not in REWARD_KINDS:
    raise ValueError(f"unknown set reward {kind!r}; valid: {', '.join(REWARD_KINDS)}")
  on_device = any(isinstance(x, jax.Array) for x in (tp, fp, fn, iou_sum))
  xp = jnp if on_device else np
  if kind == "count":
    out = -(fn + fp_weight * fp)
  else:
    if kind == "f1":
      num, den = 2 * tp, 2 * tp + fp + fn
    else:
      num, den = iou_sum, tp + 0.5 * (fp + fn)
    out = xp.where(den > 0, num / xp.where(den > 0, den, 1), 1.0)
  return out if on_device or np.ndim(out) else float(out)


@SET_REWARDS.register("count")
def count_reward(
  pred_boxes, gt_boxes, *, iou_threshold: float = 0.5, fp_weight: float = 0.3
) -> float:
  """Falcon Perception-HD's count reward r = −(FN + α·FP) after `match` (arXiv 2608.18881).

  It does not look at how good a match is above τ; α = 0.3 makes a missed object cost more than
  a spurious one. Both sets empty → 0 (the maximum).

  Args:
    pred_boxes: `[P, 4]` predicted boxes `(cx, cy, w, h)`.
    gt_boxes: `[G, 4]` ground-truth boxes.
    iou_threshold: τ of `match` (paper: 0.5).
    fp_weight: α (paper: 0.3).

  Returns:
    The reward, a float ≤ 0.

  Examples:
    >>> gt = [[0.25, 0.25, 0.2, 0.2], [0.75, 0.75, 0.2, 0.2]]
    >>> count_reward([[0.25, 0.25, 0.2, 0.2]] * 3, gt)  # 1 TP, 2 duplicates, 1 miss: −(1 + 0.6)
    -1.6
  """
  m = match(pred_boxes, gt_boxes, iou_threshold=iou_threshold)
  return reward_from_counts(m.num_tp, m.num_fp, m.num_fn, kind="count", fp_weight=fp_weight)


@SET_REWARDS.register("f1")
def f1_reward(pred_boxes, gt_boxes, *, iou_threshold: float = 0.5) -> float:
  """F1 of the matched sets, 2·TP / (2·TP + FP + FN); both sets empty → 1.

  One of the alternatives compared with the count reward in arXiv 2608.18881 (no consistent gain).

  Examples:
    >>> f1_reward([], [[0.5, 0.5, 0.1, 0.1]]), f1_reward([], [])
    (0.0, 1.0)
  """
  m = match(pred_boxes, gt_boxes, iou_threshold=iou_threshold)
  return reward_from_counts(m.num_tp, m.num_fp, m.num_fn, kind="f1")


@SET_REWARDS.register("pq")
def pq_reward(pred_boxes, gt_boxes, *, iou_threshold: float = 0.5) -> float:
  """Panoptic quality Σ_matched IoU / (TP + FP/2 + FN/2); both sets empty → 1.

  An IoU-weighted F1: the other alternative compared in arXiv 2608.18881 (same macro-F1 as the
  count reward in the paper's ablation).

  Examples:
    >>> pq_reward([[0.5, 0.5, 0.5, 0.375]], [[0.5, 0.5, 0.5, 0.5]])  # one match, IoU 0.75
    0.75
  """
  m = match(pred_boxes, gt_boxes, iou_threshold=iou_threshold)
  return reward_from_counts(m.num_tp, m.num_fp, m.num_fn, m.ious.sum(), kind="pq")


def batch_rewards(kind: str, preds: Sequence, gts: Sequence, **kwargs) -> np.ndarray:
  """`SET_REWARDS.get(kind)` applied to each (prediction set, ground-truth set) pair → `[batch]`."""
  if len(preds) != len(gts):
    raise ValueError(f"{len(preds)} prediction sets but {len(gts)} ground-truth sets")
  fn = SET_REWARDS.get(kind)
  return np.array([fn(p, g, **kwargs) for p, g in zip(preds, gts)], dtype=np.float64)


def count_rewards(preds: Sequence, gts: Sequence, *, kind: str = "count",
                  iou_threshold: float = 0.5, fp_weight: float = 0.3) -> np.ndarray:
  """`float32[batch]` set rewards of a batch of rollouts (exact Hungarian `match` at IoU > τ).

  `SET_REWARDS[kind]` per (prediction set, ground-truth set) pair, with the knobs of the RL
  config: τ = `iou_threshold` for every kind, α = `fp_weight` for "count" (r = −(FN + α·FP),
  Falcon Perception-HD, arXiv 2608.18881), which the other kinds do not take.

  Examples:
    >>> gt = [[[0.25, 0.25, 0.2, 0.2], [0.75, 0.75, 0.2, 0.2]]]
    >>> count_rewards([[[0.25, 0.25, 0.2, 0.2]] * 3], gt).tolist()  # −(1 + 0.3·2)
    [-1.600000023841858]
  """
  kwargs = dict(iou_threshold=iou_threshold)
  if kind == "count":
    kwargs["fp_weight"] = fp_weight
  fn = SET_REWARDS.get(kind)
  return np.array([fn(p, g, **kwargs) for p, g in zip(preds, gts)], np.float32)


# ---------------------------------------------------------------------------------------------
# Greedy matching (device)
# ---------------------------------------------------------------------------------------------


class GreedyMatch(NamedTuple):
  """Output of `greedy_match_jnp`; leading batch axes follow a `vmap`."""

  pred_to_gt: jax.Array  # [P] int32 matched ground-truth index, −1 if unmatched or padding.
  gt_to_pred: jax.Array  # [G] int32 matched prediction index, −1 if unmatched or padding.
  ious: jax.Array  # [P] float32 IoU of each prediction's match, 0 if unmatched.
  num_tp: jax.Array  # int32 scalars, counted over valid boxes only.
  num_fp: jax.Array
  num_fn: jax.Array
  iou_sum: jax.Array  # float32 Σ IoU over the matched pairs.


@jax.jit
def greedy_match_jnp(
  pred_boxes: jax.Array,
  gt_boxes: jax.Array,
  pred_valid: jax.Array | None = None,
  gt_valid: jax.Array | None = None,
  *,
  iou_threshold: float = 0.5,
) -> GreedyMatch:
  """Jittable approximation of `match`: repeatedly take the highest-IoU pair still free.

  Each step picks argmax IoU over free valid pairs with IoU > τ and retires its row and column;
  ties go to the lowest prediction index, then the lowest ground-truth index. The loop is a
  `lax.while_loop` that stops when no pair above τ is left, so it runs TP + 1 times (≤ min(P, G)
  + 1). Greedy is exact when every box has at most one partner above τ (well-separated scenes).
  In general it is a maximal matching on the pairs above τ, so its IoU sum is at least half of
  `match`'s and at most equal to it, and its TP count is within a factor 2 of `match`'s. Use it
  where the reward must stay on device; use `match` for parity with the paper.

  Args:
    pred_boxes: `[P, 4]` predicted boxes `(cx, cy, w, h)`, padded to a fixed P.
    gt_boxes: `[G, 4]` ground-truth boxes, padded to a fixed G.
    pred_valid: `[P]` bool, False on padding (default: all valid).
    gt_valid: `[G]` bool, False on padding (default: all valid).
    iou_threshold: τ (traced, not static).

  Returns:
    `GreedyMatch`. The rewards follow with `reward_from_counts(out.num_tp, out.num_fp,
    out.num_fn, out.iou_sum, kind=...)`.

  Examples:
    >>> import jax.numpy as jnp
    >>> gt = jnp.array([[0.25, 0.25, 0.2, 0.2], [0.75, 0.75, 0.2, 0.2]])
    >>> pred = jnp.array([[0.75, 0.75, 0.2, 0.2], [0.25, 0.25, 0.2, 0.2], [0.0, 0.0, 0.0, 0.0]])
    >>> out = greedy_match_jnp(pred, gt, jnp.array([True, True, False]))
    >>> out.pred_to_gt.tolist(), int(out.num_tp), int(out.num_fp), int(out.num_fn)
    ([1, 0, -1], 2, 0, 0)
  """
  iou = box_iou_jnp(pred_boxes, gt_boxes)
  num_pred, num_gt = iou.shape
  pred_valid = jnp.ones(num_pred, bool) if pred_valid is None else jnp.asarray(pred_valid, bool)
  gt_valid = jnp.ones(num_gt, bool) if gt_valid is None else jnp.asarray(gt_valid, bool)
  live = pred_valid[:, None] & gt_valid[None, :] & (iou > iou_threshold)

  def cond(state):
    return jnp.any(state[0])

  def body(state):
    live, pred_to_gt, gt_to_pred = state
    # argmax of a row-major flat array returns the first maximum: lowest pred, then lowest gt.
    flat = jnp.argmax(jnp.where(live, iou, -1.0))
    i, j = flat // num_gt, flat % num_gt
    live = live.at[i, :].set(False).at[:, j].set(False)
    return live, pred_to_gt.at[i].set(j), gt_to_pred.at[j].set(i)

  init = (live, jnp.full(num_pred, -1, jnp.int32), jnp.full(num_gt, -1, jnp.int32))
  if num_pred and num_gt:  # static: an empty side has nothing to match (and no argmax)
    _, pred_to_gt, gt_to_pred = jax.lax.while_loop(cond, body, init)
  else:
    _, pred_to_gt, gt_to_pred = init
  matched = pred_to_gt >= 0
  if num_gt:
    ious = jnp.where(matched, iou[jnp.arange(num_pred), jnp.maximum(pred_to_gt, 0)], 0.0)
  else:
    ious = jnp.zeros(num_pred, jnp.float32)
  tp = jnp.sum(matched, dtype=jnp.int32)
  return GreedyMatch(
    pred_to_gt=pred_to_gt,
    gt_to_pred=gt_to_pred,
    ious=ious,
    num_tp=tp,
    num_fp=jnp.sum(pred_valid, dtype=jnp.int32) - tp,
    num_fn=jnp.sum(gt_valid, dtype=jnp.int32) - tp,
    iou_sum=jnp.sum(ious),
  )


# ---------------------------------------------------------------------------------------------
# Evaluation (host)
# ---------------------------------------------------------------------------------------------


def nms(boxes, scores=None, iou_threshold: float = 0.5) -> np.ndarray:
  """Greedy non-maximum suppression; returns the kept indices, highest score first.

  Visit boxes by descending score; keep a box unless a box kept before it overlaps it with
  IoU > `iou_threshold` (only kept boxes suppress). Equal scores keep their input order.

  Args:
    boxes: `[n, 4]` boxes `(cx, cy, w, h)`.
    scores: `[n]` confidences. None: use the emission order as the score (the first box emitted
      ranks highest). An autoregressive model has no per-box score by default, and its first
      emission of an object is the natural one to keep.
    iou_threshold: suppression threshold.

  Returns:
    `[k]` int indices of the kept boxes, in visiting order.

  Examples:
    >>> nms([[0.5, 0.5, 0.2, 0.2], [0.5, 0.5, 0.2, 0.19], [0.1, 0.1, 0.1, 0.1]]).tolist()
    [0, 2]
    >>> nms([[0.5, 0.5, 0.2, 0.2], [0.5, 0.5, 0.2, 0.19]], scores=[0.1, 0.9]).tolist()
    [1]
  """
  boxes = _as_boxes(boxes)
  n = boxes.shape[0]
  if scores is None:
    order = np.arange(n)
  else:
    scores = np.asarray(scores, np.float64).reshape(-1)
    if scores.shape != (n,):
      raise ValueError(f"{scores.shape[0]} scores for {n} boxes")
    order = np.argsort(-scores, kind="stable")
  iou = box_iou(boxes, boxes)
  suppressed = np.zeros(n, bool)
  keep = []
  for idx in order:
    if suppressed[idx]:
      continue
    keep.append(idx)
    suppressed |= iou[idx] > iou_threshold
  return np.asarray(keep, np.intp)


def redundancy_rate(boxes, scores=None, *, iou_threshold: float = 0.5) -> float:
  """Share of predictions that greedy NMS would suppress, (n − kept) / n; 0 for no predictions.

  Falcon Perception-HD's mask redundancy rate (MRR, arXiv 2608.18881), here on boxes. Without
  scores the emission order ranks the boxes (see `nms`). The order matters only for chains: when
  every group of duplicates overlaps pairwise (and no more than that), any order suppresses all
  but one box per group.

  Examples:
    >>> redundancy_rate([[0.5, 0.5, 0.2, 0.2], [0.5, 0.5, 0.2, 0.2], [0.1, 0.1, 0.1, 0.1]])
    0.3333333333333333
  """
  n = _as_boxes(boxes).shape[0]
  if n == 0:
    return 0.0
  return (n - nms(boxes, scores, iou_threshold).size) / n


class ThresholdCounts(NamedTuple):
  """Per-threshold match counts of one sample; each `[T]` int64 over the thresholds."""

  tp: np.ndarray
  fp: np.ndarray
  fn: np.ndarray


def threshold_counts(pred_boxes, gt_boxes, thresholds=IOU_THRESHOLDS) -> ThresholdCounts:
  """TP / FP / FN at several IoU thresholds from one maximum-IoU matching (PBench protocol).

  Match once over all overlapping pairs (`match` with τ = 0), then for each threshold t:
  TP_t = #(matched IoU ≥ t), FP_t = P − TP_t, FN_t = G − TP_t. This follows the evaluation code
  of Falcon Perception (`eval/metrics.py`): the pairs are fixed before thresholding and a pair
  at exactly t counts. It differs from `match(…, iou_threshold=t)`, which re-matches above t.

  Args:
    pred_boxes: `[P, 4]` boxes; gt_boxes: `[G, 4]` boxes.
    thresholds: `[T]` IoU thresholds (default 0.50:0.05:0.95).

  Returns:
    `ThresholdCounts`.
  """
  m = match(pred_boxes, gt_boxes, iou_threshold=0.0)
  thresholds = np.atleast_1d(np.asarray(thresholds, np.float64))
  tp = np.sum(m.ious[None, :] >= thresholds[:, None], axis=1).astype(np.int64)
  num_pred, num_gt = m.num_tp + m.num_fp, m.num_tp + m.num_fn
  return ThresholdCounts(tp, num_pred - tp, num_gt - tp)


def _f1(tp, fp, fn):
  tp, fp, fn = (np.asarray(x, np.float64) for x in (tp, fp, fn))
  den = 2 * tp + fp + fn
  return np.where(den > 0, 2 * tp / np.where(den > 0, den, 1.0), 1.0)


def sample_f1(pred_boxes, gt_boxes, thresholds=IOU_THRESHOLDS) -> float:
  """Per-sample F1 averaged over IoU thresholds: mean_t 2·TP_t / (2·TP_t + FP_t + FN_t).

  Counts from `threshold_counts`. Both sets empty → 1 (not used by `macro_f1`, which skips
  samples without ground truth).

  Examples:
    >>> sample_f1([[0.5, 0.5, 0.5, 0.375]], [[0.5, 0.5, 0.5, 0.5]])  # IoU 0.75: 6 of 10 hit
    0.6
  """
  c = threshold_counts(pred_boxes, gt_boxes, thresholds)
  return float(np.mean(_f1(c.tp, c.fp, c.fn)))


class DatasetMetrics(NamedTuple):
  """Dataset-level metrics of `evaluate`."""

  macro_f1: float  # Mean per-sample F1 over samples with ground truth; NaN if there are none.
  positive_micro_f1: float  # pmF1: F1 of TP/FP/FN pooled over those samples, mean over t.
  presence_mcc: float  # Image-level presence MCC over all samples.
  redundancy_rate: float  # Suppressed predictions / all predictions, pooled over all samples.
  num_samples: int
  num_positive: int  # Samples with at least one ground-truth box.


def _check_pairs(preds, gts):
  if len(preds) != len(gts):
    raise ValueError(f"{len(preds)} prediction sets but {len(gts)} ground-truth sets")


def _positive_counts(preds, gts, thresholds):
  """`[S, T]` TP / FP / FN of the samples with ground truth."""
  counts = [threshold_counts(p, g, thresholds) for p, g in zip(preds, gts) if _as_boxes(g).shape[0]]
  t = np.atleast_1d(thresholds).shape[0]
  if not counts:
    empty = np.zeros((0, t), np.int64)
    return empty, empty, empty
  return tuple(np.stack(x) for x in zip(*counts))


def _macro(tp, fp, fn) -> float:
  return float(np.mean(_f1(tp, fp, fn))) if tp.shape[0] else float("nan")


def _micro(tp, fp, fn) -> float:
  return float(np.mean(_f1(tp.sum(0), fp.sum(0), fn.sum(0)))) if tp.shape[0] else float("nan")


def macro_f1(preds: Sequence, gts: Sequence, thresholds=IOU_THRESHOLDS) -> float:
  """Macro-F1: mean `sample_f1` over the samples whose ground truth is non-empty.

  Samples without ground truth (true negatives or false detections) do not enter; a positive
  sample with no prediction scores 0 (the PBench / SA-Co protocol of arXiv 2608.18881). NaN if
  no sample has ground truth.

  Args:
    preds: S prediction sets, each `[P_s, 4]`.
    gts: S ground-truth sets, each `[G_s, 4]`.
    thresholds: IoU thresholds (use `(0.5,)` for PBench's dense split).
  """
  _check_pairs(preds, gts)
  return _macro(*_positive_counts(preds, gts, thresholds))


def positive_micro_f1(preds: Sequence, gts: Sequence, thresholds=IOU_THRESHOLDS) -> float:
  """Positive micro-F1 (pmF1): F1 of TP_t, FP_t, FN_t summed over the positive samples.

  pmF1 = mean_t 2·ΣTP_t / (2·ΣTP_t + ΣFP_t + ΣFN_t), sums over samples with ground truth. The mean
  over thresholds mirrors `sample_f1` (PROPOSAL: SA-Co's pooling is not re-verified). NaN if no
  sample has ground truth.
  """
  _check_pairs(preds, gts)
  return _micro(*_positive_counts(preds, gts, thresholds))


def _mcc(pred_present: np.ndarray, gt_present: np.ndarray) -> float:
  tp = float(np.sum(pred_present & gt_present))
  tn = float(np.sum(~pred_present & ~gt_present))
  fp = float(np.sum(pred_present & ~gt_present))
  fn = float(np.sum(~pred_present & gt_present))
  den = (tp + fp) * (tp + fn) * (tn + fp) * (tn + fn)
  # A constant prediction or a constant truth leaves MCC undefined; report 0 (no correlation).
  return (tp * tn - fp * fn) / np.sqrt(den) if den > 0 else 0.0


def presence_mcc(preds: Sequence, gts: Sequence) -> float:
  """Image-level presence Matthews correlation (SA-Co's IL-MCC).

  Per sample: predicted present = at least one prediction, truly present = at least one
  ground-truth box. MCC = (TP·TN − FP·FN) / √((TP+FP)(TP+FN)(TN+FP)(TN+FN)) over samples; 0 when
  the denominator is 0.

  Examples:
    >>> box = [[0.5, 0.5, 0.1, 0.1]]
    >>> presence_mcc([box, box, [], box], [box, box, [], []])  # TP 2, TN 1, FP 1: 2/√12
    0.5773502691896258
  """
  _check_pairs(preds, gts)
  pred_present = np.array([_as_boxes(p).shape[0] > 0 for p in preds], bool)
  gt_present = np.array([_as_boxes(g).shape[0] > 0 for g in gts], bool)
  return float(_mcc(pred_present, gt_present))


def evaluate(
  preds: Sequence,
  gts: Sequence,
  scores: Sequence | None = None,
  *,
  thresholds=IOU_THRESHOLDS,
  nms_iou_threshold: float = 0.5,
) -> DatasetMetrics:
  """All dataset metrics in one pass: macro-F1, pmF1, presence MCC, redundancy rate.

  Args:
    preds: S prediction sets, each `[P_s, 4]` boxes `(cx, cy, w, h)` (raw, before any NMS).
    gts: S ground-truth sets, each `[G_s, 4]`.
    scores: S score arrays `[P_s]` (or None entries) for the redundancy rate's NMS; None ranks
      every sample's boxes by emission order.
    thresholds: IoU thresholds of the F1 metrics.
    nms_iou_threshold: NMS threshold of the redundancy rate (paper: 0.5).

  Returns:
    `DatasetMetrics`.
  """
  _check_pairs(preds, gts)
  if scores is None:
    scores = [None] * len(preds)
  if len(scores) != len(preds):
    raise ValueError(f"{len(scores)} score arrays for {len(preds)} samples")
  tp, fp, fn = _positive_counts(preds, gts, thresholds)
  pred_present = np.array([_as_boxes(p).shape[0] > 0 for p in preds], bool)
  gt_present = np.array([_as_boxes(g).shape[0] > 0 for g in gts], bool)
  num_boxes = sum(_as_boxes(p).shape[0] for p in preds)
  num_kept = sum(nms(p, s, nms_iou_threshold).size for p, s in zip(preds, scores))
  return DatasetMetrics(
    macro_f1=_macro(tp, fp, fn),
    positive_micro_f1=_micro(tp, fp, fn),
    presence_mcc=float(_mcc(pred_present, gt_present)),
    redundancy_rate=(num_boxes - num_kept) / num_boxes if num_boxes else 0.0,
    num_samples=len(preds),
    num_positive=int(gt_present.sum()),
  )
