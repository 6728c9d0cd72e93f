"""Set matching, rewards and metrics of Falcon Perception-HD (arXiv 2608.18881).

The exact matcher is checked against scipy's `linear_sum_assignment` (a test-only dependency);
hand-made scenes carry their golden values, derived in the comments. Boxes are (cx, cy, w, h).
"""

import doctest

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize

from jaxrl_post.rewards import set_matching as sm


def _span(lo, hi):
  """A full-height box over x ∈ [lo, hi]: the IoU of two such boxes is their 1-D interval IoU."""
  return [(lo + hi) / 2, 0.5, hi - lo, 1.0]


def _loop_iou(a, b):
  """Independent IoU reference: corner format, one pair at a time."""
  out = np.zeros((len(a), len(b)))
  for i, (ax, ay, aw, ah) in enumerate(a):
    for j, (bx, by, bw, bh) in enumerate(b):
      ix = max(0.0, min(ax + aw / 2, bx + bw / 2) - max(ax - aw / 2, bx - bw / 2))
      iy = max(0.0, min(ay + ah / 2, by + bh / 2) - max(ay - ah / 2, by - bh / 2))
      union = aw * ah + bw * bh - ix * iy
      out[i, j] = ix * iy / union if union > 0 else 0.0
  return out


def _scene(rng, num_gt, *, size=(0.05, 0.2), jitter=0.01, miss=0.1, dup=0.2, extra=0.2):
  """Ground truth plus a noisy prediction set with misses, near-duplicates and stray boxes."""
  gt = np.concatenate([rng.random((num_gt, 2)), rng.uniform(*size, (num_gt, 2))], axis=1)
  hits = gt[rng.random(num_gt) > miss]
  hits = hits + rng.normal(0.0, jitter, hits.shape)
  dups = hits[rng.random(len(hits)) < dup]
  dups = dups + rng.normal(0.0, jitter, dups.shape)
  num_extra = rng.poisson(extra * num_gt)
  strays = np.concatenate([rng.random((num_extra, 2)), rng.uniform(*size, (num_extra, 2))], 1)
  pred = np.concatenate([hits, dups, strays])
  pred[:, 2:] = np.abs(pred[:, 2:])  # jitter must not flip a size negative
  return pred[rng.permutation(len(pred))], gt


def _scipy_match(pred, gt, tau):
  """Reference: scipy's Hungarian on the IoU matrix with sub-threshold pairs zeroed."""
  iou = _loop_iou(pred, gt)
  weight = np.where(iou > tau, iou, 0.0)
  rows, cols = scipy.optimize.linear_sum_assignment(weight, maximize=True)
  keep = weight[rows, cols] > 0
  return rows[keep], cols[keep], iou[rows[keep], cols[keep]]


# ---------------------------------------------------------------------------------------------
# IoU
# ---------------------------------------------------------------------------------------------


def test_box_iou_golden():
  a = [0.25, 0.5, 0.5, 0.5]  # x ∈ [0, 0.5], y ∈ [0.25, 0.75], area 0.25
  b = [0.5, 0.5, 0.5, 0.5]  # x ∈ [0.25, 0.75]: overlap 0.25 × 0.5 = 0.125, union 0.375
  c = [0.9, 0.9, 0.1, 0.1]  # far away
  d = [0.5, 0.5, 0.5, 0.375]  # inside b: IoU = 0.1875 / 0.25 = 0.75 (exact in binary)
  empty = [0.5, 0.5, 0.0, 0.3]  # zero area: IoU 0 with everything, itself included
  iou = sm.box_iou([a, b, d, empty], [b, c, empty])
  expected = [[1 / 3, 0, 0], [1, 0, 0], [0.75, 0, 0], [0, 0, 0]]
  np.testing.assert_allclose(iou, expected, rtol=0, atol=1e-15)
  assert iou[2, 0] == 0.75
  assert sm.box_iou([], [a]).shape == (0, 1)
  assert sm.box_iou([a], np.zeros((0, 4))).shape == (1, 0)
  with pytest.raises(ValueError, match="shape"):
    sm.box_iou([[0.5, 0.5, 0.1]], [a])


def test_box_iou_matches_loop_reference():
  rng = np.random.default_rng(0)
  a = np.concatenate([rng.random((13, 2)), rng.uniform(0, 0.4, (13, 2))], 1)
  b = np.concatenate([rng.random((9, 2)), rng.uniform(0, 0.4, (9, 2))], 1)
  b[0, 2] = 0.0  # a degenerate box
  np.testing.assert_allclose(sm.box_iou(a, b), _loop_iou(a, b), rtol=1e-12, atol=1e-15)


def test_box_iou_jnp_equals_numpy_under_jit():
  rng = np.random.default_rng(1)
  pred, gt = _scene(rng, 40)
  got = sm.box_iou_jnp(jnp.asarray(pred, jnp.float32), jnp.asarray(gt, jnp.float32))
  assert got.shape == (len(pred), len(gt)) and got.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(got), sm.box_iou(pred, gt), atol=1e-5)  # float32
  assert sm.box_iou_jnp(jnp.zeros((0, 4)), jnp.asarray(gt)).shape == (0, len(gt))
  # vmap over a batch of scenes padded to one shape.
  batch = jnp.stack([jnp.asarray(pred[:30]), jnp.asarray(pred[5:35])])
  out = jax.vmap(sm.box_iou_jnp, in_axes=(0, None))(batch, jnp.asarray(gt))
  np.testing.assert_allclose(np.asarray(out)[1], sm.box_iou(pred[5:35], gt), atol=1e-5)


# ---------------------------------------------------------------------------------------------
# Exact assignment
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(1, 1), (1, 6), (6, 1), (5, 5), (4, 9), (9, 4), (30, 30)])
@pytest.mark.parametrize("kind", ["uniform", "ties"])
@pytest.mark.parametrize("maximize", [False, True])
def test_linear_assignment_matches_scipy(shape, kind, maximize):
  rng = np.random.default_rng([*shape, len(kind), int(maximize)])
  for _ in range(10):
    if kind == "uniform":
      cost = rng.normal(size=shape)
    else:  # few distinct values: many optimal assignments, and ties inside the search
      cost = rng.integers(0, 3, size=shape).astype(float)
    rows, cols = sm.linear_assignment(cost, maximize=maximize)
    ref_rows, ref_cols = scipy.optimize.linear_sum_assignment(cost, maximize=maximize)
    assert len(rows) == min(shape)
    assert np.all(np.diff(rows) > 0) and len(set(cols.tolist())) == len(cols)
    np.testing.assert_allclose(cost[rows, cols].sum(), cost[ref_rows, ref_cols].sum(), atol=1e-9)
    if kind == "uniform":  # the optimum is unique with probability 1
      np.testing.assert_array_equal(rows, ref_rows)
      np.testing.assert_array_equal(cols, ref_cols)


def test_linear_assignment_edge_cases():
  rows, cols = sm.linear_assignment(np.zeros((0, 3)))
  assert rows.shape == cols.shape == (0,)
  rows, cols = sm.linear_assignment(np.zeros((3, 0)))
  assert rows.shape == cols.shape == (0,)
  with pytest.raises(ValueError, match="finite"):
    sm.linear_assignment([[0.0, np.inf]])
  with pytest.raises(ValueError, match="matrix"):
    sm.linear_assignment([1.0, 2.0])
  # Costs far from zero: the solver shifts them, the answer must not move.
  cost = np.array([[4.0, 1.0, 3.0], [2.0, 0.0, 5.0], [3.0, 2.0, 2.0]])
  for offset in (0.0, 1e6, -1e6):
    assert sm.linear_assignment(cost + offset)[1].tolist() == [1, 0, 2]


def test_linear_assignment_dense_500():
  # The worst case for the solver: a dense uniform 500×500 cost (no sparsity to exploit).
  cost = np.random.default_rng(2).random((500, 500))
  rows, cols = sm.linear_assignment(cost)
  ref_rows, ref_cols = scipy.optimize.linear_sum_assignment(cost)
  np.testing.assert_array_equal(cols, ref_cols)


# ---------------------------------------------------------------------------------------------
# match
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tau", [0.3, 0.5, 0.7])
def test_match_matches_scipy_on_random_scenes(tau):
  rng = np.random.default_rng(int(tau * 10))
  for num_gt in [1, 2, 5, 10, 20, 40, 60]:
    # Big boxes and large jitter make dense conflict graphs; small ones make easy scenes.
    for size, jitter in [((0.05, 0.15), 0.01), ((0.2, 0.5), 0.05)]:
      pred, gt = _scene(rng, num_gt, size=size, jitter=jitter)
      got = sm.match(pred, gt, iou_threshold=tau)
      rows, cols, ious = _scipy_match(pred, gt, tau)
      order = np.argsort(rows)
      # Continuous random boxes: the optimum is unique, so the pairs themselves must agree.
      np.testing.assert_array_equal(got.pred_indices, rows[order])
      np.testing.assert_array_equal(got.gt_indices, cols[order])
      np.testing.assert_allclose(got.ious, ious[order], rtol=1e-12)
      assert got.num_tp == len(rows)
      assert got.num_fp == len(pred) - len(rows) and got.num_fn == len(gt) - len(rows)
      assert np.all(got.ious > tau)


def test_match_dense_500_scene_matches_scipy():
  # 500 ground-truth boxes in one image and 500 predictions (PBench's dense split goes to 500).
  rng = np.random.default_rng(3)
  pred, gt = _scene(rng, 500, size=(0.02, 0.08), jitter=0.004)
  pred = pred[:500]
  got = sm.match(pred, gt)
  iou = sm.box_iou(pred, gt)
  weight = np.where(iou > 0.5, iou, 0.0)
  rows, cols = scipy.optimize.linear_sum_assignment(weight, maximize=True)
  assert got.num_tp == int(np.sum(weight[rows, cols] > 0)) > 300
  np.testing.assert_allclose(got.ious.sum(), weight[rows, cols].sum(), rtol=1e-12)


def test_duplicates_are_false_positives():
  gt = [[0.25, 0.25, 0.2, 0.2], [0.75, 0.75, 0.2, 0.2]]
  near = [0.26, 0.25, 0.2, 0.2]  # IoU with gt 0 = 0.19·0.2 / (0.08 − 0.038) = 0.905
  pred = [near, gt[1], gt[0], near]
  m = sm.match(pred, gt)
  # gt 0 has three candidates (IoU 0.905, 1, 0.905): the exact one wins, the two others are FP.
  assert m.pred_indices.tolist() == [1, 2] and m.gt_indices.tolist() == [1, 0]
  np.testing.assert_allclose(m.ious, [1.0, 1.0])
  assert (m.num_tp, m.num_fp, m.num_fn) == (2, 2, 0)


def test_empty_sets():
  gt = [[0.25, 0.25, 0.2, 0.2], [0.75, 0.75, 0.2, 0.2]]
  m = sm.match([], gt)
  assert (m.num_tp, m.num_fp, m.num_fn) == (0, 0, 2) and m.pred_indices.shape == (0,)
  m = sm.match(gt, np.zeros((0, 4)))
  assert (m.num_tp, m.num_fp, m.num_fn) == (0, 2, 0) and m.ious.shape == (0,)
  m = sm.match([], [])
  assert (m.num_tp, m.num_fp, m.num_fn) == (0, 0, 0)
  # Predictions that overlap nothing at all.
  m = sm.match([[0.5, 0.5, 0.1, 0.1]], gt)
  assert (m.num_tp, m.num_fp, m.num_fn) == (0, 1, 2)


def test_tie_between_identical_predictions():
  # Two identical predictions on one box: IoU 1 each, total IoU 1 either way. Exactly one is the
  # TP, the other the FP; which one is unspecified.
  gt = [[0.5, 0.5, 0.3, 0.3]]
  m = sm.match([gt[0], gt[0]], gt)
  assert (m.num_tp, m.num_fp, m.num_fn) == (1, 1, 0)
  assert m.pred_indices.tolist() in ([0], [1]) and m.ious.tolist() == [1.0]
  # A symmetric 2×2 tie: pred a overlaps both gts equally, so does pred b. Both assignments
  # have the same total; either way both are TPs.
  a, b = _span(0.3, 0.7), _span(0.3, 0.7)
  m = sm.match([a, b], [_span(0.25, 0.65), _span(0.35, 0.75)])  # IoU 0.35 / 0.45 = 0.778 each
  assert m.num_tp == 2 and sorted(m.gt_indices.tolist()) == [0, 1]


def test_iou_exactly_at_threshold():
  gt = [[0.5, 0.5, 0.5, 0.5]]  # x, y ∈ [0.25, 0.75], area 0.25
  pred = [[0.5, 0.5, 0.5, 0.25]]  # y ∈ [0.375, 0.625]: IoU = 0.125 / 0.25 = 0.5, exactly
  assert sm.box_iou(pred, gt)[0, 0] == 0.5
  m = sm.match(pred, gt, iou_threshold=0.5)  # strict IoU > τ: not a match
  assert (m.num_tp, m.num_fp, m.num_fn) == (0, 1, 1)
  assert sm.count_reward(pred, gt) == pytest.approx(-1.3)
  assert sm.match(pred, gt, iou_threshold=0.4999).num_tp == 1
  # The evaluation protocol counts matched IoU ≥ t: a hit at t = 0.50, a miss at 0.55.
  counts = sm.threshold_counts(pred, gt, thresholds=[0.5, 0.55])
  assert counts.tp.tolist() == [1, 0] and counts.fp.tolist() == [0, 1]


def test_identical_boxes():
  # Three copies of one box against two copies of it: 2 TPs at IoU 1, one FP.
  box = [0.4, 0.6, 0.2, 0.1]
  m = sm.match([box] * 3, [box] * 2)
  assert (m.num_tp, m.num_fp, m.num_fn) == (2, 1, 0)
  assert m.ious.tolist() == [1.0, 1.0] and sorted(m.gt_indices.tolist()) == [0, 1]
  m = sm.match([box] * 2, [box] * 3)
  assert (m.num_tp, m.num_fp, m.num_fn) == (2, 0, 1)
  # Hundreds of identical boxes: every search is a long chain of ties.
  m = sm.match([box] * 300, [box] * 250)
  assert (m.num_tp, m.num_fp, m.num_fn) == (250, 50, 0)


def _conflict_scene():
  """A scene where taking the best pair first loses a true positive.

  Intervals on x (full-height boxes, so IoU is 1-D):
    gt0 = [0, 0.4], gt1 = [0.1, 0.5], pred a = [0.04, 0.44], pred b = [0, 0.3].
    IoU(a, gt0) = 0.36 / 0.44 = 0.818   IoU(a, gt1) = 0.34 / 0.46 = 0.739
    IoU(b, gt0) = 0.30 / 0.40 = 0.750   IoU(b, gt1) = 0.20 / 0.50 = 0.400 (below τ = 0.5)
  Greedy takes (a, gt0) = 0.818, then b has no partner above τ: TP 1.
  Exact: (a, gt1) + (b, gt0) = 0.739 + 0.750 = 1.489 > 0.818: TP 2.
  """
  pred = np.array([_span(0.04, 0.44), _span(0.0, 0.3)])
  gt = np.array([_span(0.0, 0.4), _span(0.1, 0.5)])
  return pred, gt


def test_exact_match_beats_greedy_on_conflict():
  pred, gt = _conflict_scene()
  np.testing.assert_allclose(
    sm.box_iou(pred, gt), [[0.36 / 0.44, 0.34 / 0.46], [0.75, 0.4]], rtol=1e-12
  )
  m = sm.match(pred, gt)
  assert m.pred_indices.tolist() == [0, 1] and m.gt_indices.tolist() == [1, 0]
  np.testing.assert_allclose(m.ious.sum(), 0.34 / 0.46 + 0.75, rtol=1e-12)
  g = _greedy(pred, gt)
  assert g.pred_to_gt.tolist() == [0, -1] and int(g.num_tp) == 1
  assert (int(g.num_fp), int(g.num_fn)) == (1, 1)


# ---------------------------------------------------------------------------------------------
# Rewards
# ---------------------------------------------------------------------------------------------


def _reward_scene():
  """TP 2 (IoU 1 and 0.75), FP 1, FN 1."""
  gt = [[0.25, 0.25, 0.5, 0.5], [0.75, 0.75, 0.2, 0.2], [0.1, 0.9, 0.1, 0.1]]
  pred = [
    [0.25, 0.25, 0.5, 0.375],  # inside gt 0: IoU 0.1875 / 0.25 = 0.75
    [0.75, 0.75, 0.2, 0.2],  # exactly gt 1
    [0.75, 0.75, 0.2, 0.2],  # duplicate of the previous: FP
  ]  # gt 2 is missed: FN
  return pred, gt


def test_reward_golden_values():
  pred, gt = _reward_scene()
  # count: −(FN + 0.3·FP) = −(1 + 0.3) = −1.3
  assert sm.count_reward(pred, gt) == pytest.approx(-1.3, abs=1e-12)
  assert sm.count_reward(pred, gt, fp_weight=1.0) == pytest.approx(-2.0, abs=1e-12)
  # f1: 2·2 / (2·2 + 1 + 1) = 4/6
  assert sm.f1_reward(pred, gt) == pytest.approx(2 / 3, abs=1e-12)
  # pq: (1 + 0.75) / (2 + 0.5 + 0.5) = 1.75 / 3
  assert sm.pq_reward(pred, gt) == pytest.approx(1.75 / 3, abs=1e-12)
  # At τ = 0.8 the 0.75 pair no longer counts: TP 1, FP 2, FN 2.
  assert sm.count_reward(pred, gt, iou_threshold=0.8) == pytest.approx(-2.6, abs=1e-12)
  assert sm.f1_reward(pred, gt, iou_threshold=0.8) == pytest.approx(2 / 6, abs=1e-12)
  assert sm.pq_reward(pred, gt, iou_threshold=0.8) == pytest.approx(1 / 3, abs=1e-12)
  assert isinstance(sm.count_reward(pred, gt), float)


@pytest.mark.parametrize(
  "pred, gt, count, f1, pq",
  [
    ([], [], 0.0, 1.0, 1.0),  # nothing to find, nothing found: perfect
    ([], [[0.5, 0.5, 0.1, 0.1]] * 3, -3.0, 0.0, 0.0),  # 3 misses
    ([[0.5, 0.5, 0.1, 0.1]] * 2, [], -0.6, 0.0, 0.0),  # 2 false alarms: −0.3·2
  ],
)
def test_reward_empty_conventions(pred, gt, count, f1, pq):
  assert sm.count_reward(pred, gt) == pytest.approx(count)
  assert sm.f1_reward(pred, gt) == f1
  assert sm.pq_reward(pred, gt) == pq


def test_set_rewards_registry():
  assert {'count', 'f1', 'pq'} <= set(sm.SET_REWARDS.names())
  assert sm.SET_REWARDS.get("count") is sm.count_reward
  with pytest.raises(KeyError, match="valid names: .*count, f1, pq"):
    sm.SET_REWARDS.get("iou")
  pred, gt = _reward_scene()
  out = sm.batch_rewards("f1", [pred, [], pred], [gt, [], []])
  np.testing.assert_allclose(out, [2 / 3, 1.0, 0.0])
  assert sm.batch_rewards("count", [pred], [gt], fp_weight=0.5).tolist() == [-1.5]


def test_reward_from_counts_jittable():
  tp = jnp.array([2, 0, 0, 1])
  fp = jnp.array([1, 0, 2, 0])
  fn = jnp.array([1, 0, 0, 3])
  iou_sum = jnp.array([1.75, 0.0, 0.0, 0.5])
  for kind, expected in [
    ("count", [-1.3, 0.0, -0.6, -3.0]),
    ("f1", [2 / 3, 1.0, 0.0, 2 / 5]),  # last: 2 / (2 + 3)
    ("pq", [1.75 / 3, 1.0, 0.0, 0.5 / 2.5]),  # last: 0.5 / (1 + 1.5)
  ]:
    fn_jit = jax.jit(lambda *a, kind=kind: sm.reward_from_counts(*a, kind=kind))
    np.testing.assert_allclose(fn_jit(tp, fp, fn, iou_sum), expected, rtol=1e-6)
    host = [
      sm.reward_from_counts(*map(int, x[:3]), float(x[3]), kind=kind)
      for x in zip(tp, fp, fn, iou_sum)
    ]
    np.testing.assert_allclose(host, expected, rtol=1e-6)
  with pytest.raises(ValueError, match="valid: count, f1, pq"):
    sm.reward_from_counts(1, 0, 0, kind="map")


# ---------------------------------------------------------------------------------------------
# Greedy (device) vs exact
# ---------------------------------------------------------------------------------------------


def _pad(boxes, size, filler=(0.0, 0.0, 0.0, 0.0)):
  """Pads `[n, 4]` boxes to `[size, 4]` with `filler`; returns the boxes and the validity mask."""
  out = np.tile(np.asarray(filler, np.float32), (size, 1))
  out[: len(boxes)] = np.asarray(boxes).reshape(-1, 4)
  return out, np.arange(size) < len(boxes)


def _greedy(pred, gt, tau=0.5, size=128):
  """`greedy_match_jnp` on inputs padded to one fixed shape (one compilation for all scenes)."""
  (p, pv), (g, gv) = _pad(pred, size), _pad(gt, size)
  out = sm.greedy_match_jnp(p, g, pv, gv, iou_threshold=tau)
  # Slice on the host: slicing a device array compiles once per distinct length.
  return out._replace(
    pred_to_gt=np.asarray(out.pred_to_gt)[: len(pred)],
    gt_to_pred=np.asarray(out.gt_to_pred)[: len(gt)],
  )


def test_greedy_equals_exact_on_well_separated_scenes():
  rng = np.random.default_rng(4)
  for _ in range(10):
    # Ground truth on a 6×6 grid (cells 1/6 wide, boxes ≤ 0.1): boxes of different cells never
    # overlap, so each prediction has at most one partner and greedy has no choice to get wrong.
    cells = rng.choice(36, size=20, replace=False)
    centres = (np.stack([cells % 6, cells // 6], 1) + 0.5) / 6
    gt = np.concatenate([centres, rng.uniform(0.06, 0.1, (20, 2))], 1)
    pred = gt[rng.random(20) > 0.2] + rng.normal(0, 0.005, (1, 4))
    pred = np.concatenate([pred, [[0.0, 0.0, 0.02, 0.02]]])  # a stray box in a corner
    pred = pred[rng.permutation(len(pred))]
    m = sm.match(pred, gt)
    g = _greedy(pred, gt)
    expected = np.full(len(pred), -1)
    expected[m.pred_indices] = m.gt_indices
    np.testing.assert_array_equal(np.asarray(g.pred_to_gt), expected)
    assert (int(g.num_tp), int(g.num_fp), int(g.num_fn)) == (m.num_tp, m.num_fp, m.num_fn)
    np.testing.assert_allclose(float(g.iou_sum), m.ious.sum(), rtol=1e-5)


def test_greedy_vs_exact_on_dense_random_scenes():
  rng = np.random.default_rng(5)
  trials, agree, tp_exact, tp_greedy = 60, 0, 0, 0
  for _ in range(trials):
    pred, gt = _scene(rng, int(rng.integers(5, 40)), size=(0.15, 0.4), jitter=0.05, dup=0.5)
    m = sm.match(pred, gt)
    g = _greedy(pred, gt)
    tp = int(g.num_tp)
    # Both are maximal matchings of the pairs above τ, so each has at least half the TPs of the
    # other; exact maximises the IoU sum, greedy is a ½-approximation of that maximum.
    assert 2 * tp >= m.num_tp and 2 * m.num_tp >= tp
    assert m.ious.sum() / 2 - 1e-5 <= float(g.iou_sum) <= m.ious.sum() + 1e-5
    agree += tp == m.num_tp
    tp_exact += m.num_tp
    tp_greedy += tp
  # Measured on these crowded scenes (≈ 14 TPs each): equal TP counts in 43 of 60, exact ahead
  # by 1 in 13 and by 2 in 4; greedy finds ≈ 97 % of the exact TPs overall. The thresholds leave
  # room for float32 near-ties without letting a broken matcher through.
  assert agree >= 0.6 * trials
  assert tp_greedy >= 0.95 * tp_exact


def test_greedy_vmap_with_padding():
  rng = np.random.default_rng(6)
  scenes = [_scene(rng, n, size=(0.1, 0.3), jitter=0.03) for n in (3, 12, 0, 25)]
  # Padding boxes sit exactly on a real box: only the masks keep them out of the matching.
  filler = scenes[1][1][0]
  pred, pred_valid = map(np.stack, zip(*[_pad(p, 64, filler) for p, _ in scenes]))
  gt, gt_valid = map(np.stack, zip(*[_pad(g, 64, filler) for _, g in scenes]))
  out = jax.vmap(sm.greedy_match_jnp)(pred, gt, pred_valid, gt_valid)
  out = jax.tree.map(np.asarray, out)  # index on the host (device slicing compiles)
  for k, (pred, gt) in enumerate(scenes):
    ref = _greedy(pred, gt)  # one scene at a time, padded differently
    assert int(out.num_tp[k]) == int(ref.num_tp)
    assert int(out.num_fp[k]) == len(pred) - int(ref.num_tp)
    assert int(out.num_fn[k]) == len(gt) - int(ref.num_tp)
    np.testing.assert_array_equal(out.pred_to_gt[k, : len(pred)], ref.pred_to_gt)
    assert np.all(out.pred_to_gt[k, len(pred) :] == -1)
    assert np.all(out.gt_to_pred[k, len(gt) :] == -1)


def test_greedy_empty_shapes():
  box = jnp.array([[0.5, 0.5, 0.2, 0.2]])
  out = sm.greedy_match_jnp(jnp.zeros((0, 4)), box)
  assert (int(out.num_tp), int(out.num_fp), int(out.num_fn)) == (0, 0, 1)
  out = sm.greedy_match_jnp(box, jnp.zeros((0, 4)))
  assert out.pred_to_gt.tolist() == [-1] and (int(out.num_fp), int(out.num_fn)) == (1, 0)


# ---------------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------------


def _redundant_set():
  """Five predictions; greedy NMS at 0.5 in emission order suppresses two of them.

  a  = (0.20, 0.2, 0.1, 0.1)
  a2 = (0.21, 0.2, 0.1, 0.1)     IoU(a, a2) = 0.09·0.1 / (0.02 − 0.009) = 0.818 → suppressed by a
  a3 = a                        IoU 1 → suppressed by a
  c  = (0.5, 0.75, 0.25, 0.25)
  c2 = (0.5, 0.75, 0.25, 0.125)  IoU(c, c2) = 0.5 exactly → not suppressed (strict IoU > 0.5)
  Redundancy rate = 2 / 5 = 0.4.
  """
  a = [0.2, 0.2, 0.1, 0.1]
  return [a, [0.21, 0.2, 0.1, 0.1], a, [0.5, 0.75, 0.25, 0.25], [0.5, 0.75, 0.25, 0.125]]


def test_nms_and_redundancy_rate():
  boxes = _redundant_set()
  assert sm.nms(boxes).tolist() == [0, 3, 4]
  assert sm.redundancy_rate(boxes) == pytest.approx(0.4)
  # Scores put a2 first: it keeps itself and suppresses a and a3 (IoU(a2, a3) = 0.818 too).
  scores = [0.5, 0.9, 0.1, 0.3, 0.2]
  assert sm.nms(boxes, scores).tolist() == [1, 3, 4]
  assert sm.redundancy_rate(boxes, scores) == pytest.approx(0.4)
  # At threshold 0.45 the exact-0.5 pair is also suppressed: 3 / 5.
  assert sm.redundancy_rate(boxes, iou_threshold=0.45) == pytest.approx(0.6)
  assert sm.nms([]).tolist() == [] and sm.redundancy_rate([]) == 0.0
  with pytest.raises(ValueError, match="scores"):
    sm.nms(boxes, [1.0, 2.0])


def test_nms_only_kept_boxes_suppress():
  # A chain x — y — z where x overlaps y and y overlaps z, but x and z barely touch.
  x, y, z = _span(0.0, 0.4), _span(0.1, 0.5), _span(0.2, 0.6)  # IoU(x, y) = 0.6, IoU(x, z) = 1/3
  # y is suppressed by x, so z survives: a suppressed box suppresses nothing.
  assert sm.nms([x, y, z]).tolist() == [0, 2]


def test_presence_mcc_hand_computation():
  box = [[0.5, 0.5, 0.1, 0.1]]
  # Presence outcomes: 3 TP, 2 TN, 1 FP, 1 FN.
  preds = [box, box, box, [], [], box, []]
  gts = [box, box, box, [], [], [], box]
  # MCC = (3·2 − 1·1) / √((3+1)(3+1)(2+1)(2+1)) = 5 / √144 = 5/12.
  assert sm.presence_mcc(preds, gts) == pytest.approx(5 / 12)
  # Perfect presence: MCC 1; always predicting "present": denominator 0 → 0.
  assert sm.presence_mcc([box, []], [box, []]) == pytest.approx(1.0)
  assert sm.presence_mcc([box, box], [box, []]) == 0.0


def _dataset():
  """Five samples; derivations with the default thresholds t ∈ {0.50, 0.55, …, 0.95}.

  s1: one prediction at IoU 0.75 with its box → F1 = 1 for t ≤ 0.75 (6 of 10), else 0: 0.6.
  s2: one box, no prediction → F1 0.                       (positive, presence FN)
  s3: one prediction, no box → not in the F1 metrics.     (presence FP)
  s4: nothing, nothing → not in the F1 metrics.           (presence TN)
  s5: one prediction far from its one box → F1 0.         (positive, presence TP)
  macro-F1 = (0.6 + 0 + 0) / 3 = 0.2.
  pmF1, pooled over s1, s2, s5: t ≤ 0.75: TP 1, FP 1, FN 2 → 2 / (2 + 1 + 2) = 0.4;
    t > 0.75: TP 0 → 0. Mean over t: 0.6 · 0.4 = 0.24.
  MCC: TP 2 (s1, s5), FN 1, FP 1, TN 1 → (2·1 − 1·1) / √(3·3·2·2) = 1/6.
  Redundancy: no prediction overlaps another → 0.
  """
  gt_box = [0.5, 0.5, 0.5, 0.5]
  preds = [[[0.5, 0.5, 0.5, 0.375]], [], [[0.5, 0.5, 0.1, 0.1]], [], [[0.1, 0.1, 0.1, 0.1]]]
  gts = [[gt_box], [gt_box], [], [], [[0.9, 0.9, 0.1, 0.1]]]
  return preds, gts


def test_dataset_metrics_golden():
  preds, gts = _dataset()
  assert sm.sample_f1(preds[0], gts[0]) == pytest.approx(0.6)
  assert sm.sample_f1([], []) == 1.0
  assert sm.macro_f1(preds, gts) == pytest.approx(0.2)
  assert sm.positive_micro_f1(preds, gts) == pytest.approx(0.24)
  assert sm.presence_mcc(preds, gts) == pytest.approx(1 / 6)
  # PBench's dense split: τ = 0.5 only. s1 is a hit: macro (1 + 0 + 0) / 3; pm 2 / 5.
  assert sm.macro_f1(preds, gts, thresholds=(0.5,)) == pytest.approx(1 / 3)
  assert sm.positive_micro_f1(preds, gts, thresholds=(0.5,)) == pytest.approx(0.4)
  out = sm.evaluate(preds, gts)
  assert out.macro_f1 == pytest.approx(0.2)
  assert out.positive_micro_f1 == pytest.approx(0.24)
  assert out.presence_mcc == pytest.approx(1 / 6)
  assert out.redundancy_rate == 0.0
  assert (out.num_samples, out.num_positive) == (5, 3)
  # No positive sample: the F1 metrics are undefined.
  assert np.isnan(sm.macro_f1([[]], [[]])) and np.isnan(sm.positive_micro_f1([[]], [[]]))
  with pytest.raises(ValueError, match="ground-truth"):
    sm.macro_f1(preds, gts[:2])


def test_evaluate_pools_redundancy_and_agrees_with_the_parts():
  rng = np.random.default_rng(7)
  preds, gts, scores = [], [], []
  for n in [0, 3, 10, 0, 25]:
    pred, gt = _scene(rng, n, size=(0.05, 0.2), jitter=0.01, dup=0.5)
    preds.append(pred)
    gts.append(gt)
    scores.append(rng.random(len(pred)))
  preds.append(_redundant_set())
  gts.append([])
  scores.append(None)  # emission order for this sample
  out = sm.evaluate(preds, gts, scores)
  assert out.macro_f1 == pytest.approx(sm.macro_f1(preds, gts))
  assert out.positive_micro_f1 == pytest.approx(sm.positive_micro_f1(preds, gts))
  assert out.presence_mcc == pytest.approx(sm.presence_mcc(preds, gts))
  suppressed = sum(len(p) - len(sm.nms(p, s)) for p, s in zip(preds, scores))
  assert suppressed >= 2
  assert out.redundancy_rate == pytest.approx(suppressed / sum(len(p) for p in preds))
  # Macro-F1 is the plain mean of the positive samples' F1.
  f1s = [sm.sample_f1(p, g) for p, g in zip(preds, gts) if len(g)]
  assert out.macro_f1 == pytest.approx(np.mean(f1s))


def test_doctests():
  assert doctest.testmod(sm).failed == 0
