"""WMRL (arXiv 2608.12564): isotonic calibrator, disagreement, IVD weight, advantages, order."""

import doctest

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxrl_post.advantages import wmrl
from jaxrl_post.advantages.wmrl import (
  REWARD_CALIBRATORS,
  IVDState,
  apply_calibration,
  calibrator_init,
  calibrator_update,
  group_disagreement,
  identity_calibration,
  ivd_init,
  ivd_update,
  ivd_weight,
  pav_fit,
  wmrl_advantages,
  wmrl_step,
)


def test_doctests():
  assert doctest.testmod(wmrl, raise_on_error=True).attempted >= 20


def test_registry():
  assert REWARD_CALIBRATORS.names() == ["identity", "isotonic"]
  assert REWARD_CALIBRATORS.get("isotonic") is apply_calibration
  assert REWARD_CALIBRATORS.get("identity") is identity_calibration
  with pytest.raises(KeyError, match="unknown reward calibrator 'platt'; valid names: identity"):
    REWARD_CALIBRATORS.get("platt")


# ---------------------------------------------------------------------------------------------
# Independent numpy references (loops).
# ---------------------------------------------------------------------------------------------


def _np_bins(x, y, bins):
  """Bin index by comparing with the edges one by one; per-bin (count, mean x, mean y)."""
  edges = [k / bins for k in range(1, bins)]
  out = []
  for k in range(bins):
    sel = []
    for xi, yi in zip(x, y):
      b = sum(xi >= e for e in edges)
      if b == k:
        sel.append((xi, yi))
    if sel:
      out.append((len(sel), np.mean([s[0] for s in sel]), np.mean([s[1] for s in sel])))
  return out


def _np_pav(values, weights):
  """Textbook pool-adjacent-violators with backtracking over blocks."""
  blocks = [[v, w, 1] for v, w in zip(values, weights)]
  i = 0
  while i < len(blocks) - 1:
    if blocks[i][0] > blocks[i + 1][0] + 1e-12:
      a, b = blocks[i], blocks.pop(i + 1)
      a[0] = (a[0] * a[1] + b[0] * b[1]) / (a[1] + b[1])
      a[1] += b[1]
      a[2] += b[2]
      i = max(i - 1, 0)
    else:
      i += 1
  return np.array([v for v, _, n in blocks for _ in range(n)])


def _np_fit(x, y, bins):
  stats = _np_bins(x, y, bins)
  counts = [s[0] for s in stats]
  return np.array([s[1] for s in stats]), _np_pav([s[2] for s in stats], counts), stats


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pav_fit_matches_numpy_textbook(seed):
  rng = np.random.default_rng(seed)
  x = rng.uniform(-0.05, 1.05, size=500).astype(np.float32)  # some outside [0, 1]
  # A wiggly, mostly increasing truth plus noise: bin means violate monotonicity somewhere.
  y = (x + 0.4 * np.sin(9 * x) + 0.2 * rng.standard_normal(500)).astype(np.float32)
  x[:40] = rng.uniform(0.3, 0.4, size=40)  # leave bins empty-free but uneven
  x[(x > 0.8) & (x < 0.9)] = 0.95  # bin 8 empty: padding and pooling across an empty bin
  fx, fy, _ = _np_fit(x.astype(np.float64), y.astype(np.float64), 10)
  bp = pav_fit(x, y, bins=10)
  num = int(bp.num)
  assert num == len(fx) < 10
  np.testing.assert_allclose(bp.fx[:num], fx, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(bp.fy[:num], fy, rtol=1e-5, atol=1e-5)
  assert np.all(np.diff(np.asarray(bp.fy)) >= 0) and np.all(np.diff(np.asarray(bp.fx)) >= 0)
  assert np.any(np.diff(fy) == 0)  # the data did need pooling
  np.testing.assert_array_equal(bp.fx[num:], bp.fx[num - 1])  # padding repeats the last knot
  np.testing.assert_array_equal(bp.fy[num:], bp.fy[num - 1])


def test_pav_fit_equals_bin_means_when_already_monotone():
  rng = np.random.default_rng(3)
  x = rng.uniform(0, 1, size=500).astype(np.float32)
  y = (x**2 + 0.01 * rng.standard_normal(500)).astype(np.float32)
  stats = _np_bins(x.astype(np.float64), y.astype(np.float64), 10)
  means_y = np.array([s[2] for s in stats])
  assert np.all(np.diff(means_y) > 0)
  bp = pav_fit(x, y)
  assert int(bp.num) == 10
  np.testing.assert_allclose(bp.fy, means_y, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(bp.fx, [s[1] for s in stats], rtol=1e-5, atol=1e-6)


def test_pav_fit_mask_and_nan():
  rng = np.random.default_rng(4)
  x = rng.uniform(0, 1, size=500).astype(np.float32)
  y = (x + 0.3 * rng.standard_normal(500)).astype(np.float32)
  keep = rng.uniform(size=500) < 0.2
  fx, fy, _ = _np_fit(x[keep].astype(np.float64), y[keep].astype(np.float64), 10)
  got = pav_fit(x, np.where(keep, y, np.nan), keep)
  assert int(got.num) == len(fx)
  np.testing.assert_allclose(got.fx[:len(fx)], fx, rtol=1e-5)
  np.testing.assert_allclose(got.fy[:len(fx)], fy, rtol=1e-5, atol=1e-6)
  assert not np.allclose(pav_fit(x, y).fy, got.fy, atol=1e-3)  # the mask mattered
  assert int(pav_fit(np.full(500, 0.42), np.arange(500.0)).num) == 1  # one bin: no map


# ---------------------------------------------------------------------------------------------
# The calibrator state.
# ---------------------------------------------------------------------------------------------

CHUNK = 16


def _push(state, x, y, **kw):
  """Pushes any number of pairs through fixed-size chunks (one compilation)."""
  x, y = np.asarray(x, np.float32), np.asarray(y, np.float32)
  for start in range(0, len(x), CHUNK):
    xs, ys = x[start:start + CHUNK], y[start:start + CHUNK]
    n = len(xs)
    pad = CHUNK - n
    state = calibrator_update(state, np.pad(xs, (0, pad)), np.pad(ys, (0, pad)),
                              np.arange(CHUNK) < n, **kw)
  return state


def _pairs(n, seed=0):
  rng = np.random.default_rng(seed)
  y = rng.uniform(0, 1, size=n).astype(np.float32)
  return (y**3).astype(np.float32), y


def test_identity_until_min_pairs_then_refit_every_64():
  x, y = _pairs(400)
  state = calibrator_init()
  assert state.pairs.shape == (5000, 2) and state.fx.shape == (10,)
  fits = []
  for n in range(400):  # one pair at a time: the reference `push`
    state = _push(state, x[n:n + 1], y[n:n + 1])
    fits.append(int(state.num_fits))
    if n == 198:
      assert not bool(state.fitted)
      probe = jnp.array([0.1, 0.5])
      np.testing.assert_array_equal(apply_calibration(state, probe), probe)
  fits = np.array(fits)
  # The first fit lands on pair 200, then every 64 pairs: 264, 328, (392).
  assert [int(np.argmax(fits >= k)) + 1 for k in (1, 2, 3, 4)] == [200, 264, 328, 392]
  assert int(state.count) == 400 and int(state.since_fit) == 8
  # Pushing the same pairs in chunks gives the very same state (fits land at the same pairs).
  chunked = _push(calibrator_init(), x, y)
  for a, b in zip(chunked, state):
    np.testing.assert_array_equal(a, b)
  # ... and the map is the fit of the buffer as it was at pair 392.
  fx, fy, _ = _np_fit(x[:392].astype(np.float64), y[:392].astype(np.float64), 10)
  np.testing.assert_allclose(state.fx, fx, rtol=1e-5)
  np.testing.assert_allclose(state.fy, fy, rtol=1e-5)


def test_fifo_eviction_at_capacity():
  fifo = dict(min_pairs=20, refit_every=1)
  state = _push(calibrator_init(capacity=20), np.arange(23.0), 100 + np.arange(23.0), **fifo)
  assert int(state.count) == 23
  # Slots are n % 20: pairs 20, 21, 22 overwrote the oldest, pairs 0, 1, 2.
  want = np.stack([np.arange(23.0), 100 + np.arange(23.0)], -1)
  np.testing.assert_array_equal(state.pairs[:3], want[20:])
  np.testing.assert_array_equal(state.pairs[3:], want[3:20])
  # The fit only sees the last `capacity` pairs: old pairs of another map age out.
  rng = np.random.default_rng(5)
  xa = rng.uniform(0, 1, 20).astype(np.float32)
  xb = rng.uniform(0, 1, 20).astype(np.float32)
  state = _push(calibrator_init(capacity=20), np.concatenate([xa, xb]),
                np.concatenate([1 - xa, xb**2]), **fifo)
  fx, fy, _ = _np_fit(xb.astype(np.float64), xb.astype(np.float64) ** 2, 10)
  num = int(state.num_breaks)
  assert num == len(fx)
  np.testing.assert_allclose(state.fy[:num], fy, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(state.fx[:num], fx, rtol=1e-5)


def test_masked_and_ungraded_pairs_are_not_pushed():
  x = np.zeros(CHUNK, np.float32)
  y = np.zeros(CHUNK, np.float32)
  x[:4] = [0.1, np.nan, 0.3, 0.4]
  y[:4] = [0.0, 1.0, np.inf, 0.5]
  state = calibrator_update(calibrator_init(), x, y, np.arange(CHUNK) < 3)
  assert int(state.count) == 1
  np.testing.assert_allclose(state.pairs[0], [0.1, 0.0])


def test_non_affine_distortion_is_undone():
  x, y = _pairs(3000, seed=6)  # the world model reports r_env³
  state = _push(calibrator_init(), x, y)
  assert bool(state.fitted)
  xt, yt = _pairs(2000, seed=7)
  cal = np.asarray(apply_calibration(state, xt))
  raw_err = np.mean(np.abs(xt - yt))
  cal_err = np.mean(np.abs(cal - yt))
  assert raw_err > 0.2 and cal_err < 0.25 * raw_err
  # What GRPO sees: within-group standardised rewards. An affine map could not change these.
  def std_adv(r):
    r = r.reshape(-1, 8)
    return (r - r.mean(1, keepdims=True)) / (r.std(1, keepdims=True) + 1e-4)
  raw_gap = np.mean(np.abs(std_adv(xt) - std_adv(yt)))
  cal_gap = np.mean(np.abs(std_adv(cal) - std_adv(yt)))
  assert cal_gap < 0.6 * raw_gap
  # Monotone: f̂ never reorders rollouts; NaN stays NaN; ends are clamped.
  grid = jnp.linspace(-0.5, 1.5, 41)
  out = np.asarray(apply_calibration(state, grid))
  assert np.all(np.diff(out) >= 0)
  assert out[0] == state.fy[0] and out[-1] == state.fy[-1]
  assert np.isnan(apply_calibration(state, jnp.array([jnp.nan]))[0])


def test_apply_under_jit_and_checkpoint_roundtrip():
  x, y = _pairs(260, seed=8)
  state = _push(calibrator_init(), x[:230], y[:230])
  # Checkpoint through host numpy and back: the same tree, shapes and dtypes.
  restored = jax.tree.map(lambda a: jnp.asarray(np.asarray(a)), state)
  assert jax.tree.structure(restored) == jax.tree.structure(state)
  a = _push(state, x[230:], y[230:])
  b = _push(restored, x[230:], y[230:])
  for u, v, w in zip(a, b, state):
    np.testing.assert_array_equal(u, v)
    assert u.shape == w.shape and u.dtype == w.dtype
  r = jnp.asarray(np.linspace(0, 1, 7), jnp.float32)
  jitted = jax.jit(apply_calibration)(a, r)
  np.testing.assert_allclose(jitted, np.interp(np.asarray(r), a.fx, a.fy), rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(jax.jit(identity_calibration)(a, r), r)


def test_calibrator_errors():
  with pytest.raises(ValueError, match="capacity"):
    calibrator_init(capacity=0)
  with pytest.raises(ValueError, match="bins"):
    calibrator_init(bins=1)
  state = calibrator_init(capacity=4)
  with pytest.raises(ValueError, match="min_pairs"):
    calibrator_update(state, jnp.zeros(2), jnp.zeros(2), min_pairs=0)
  with pytest.raises(ValueError, match="refit_every"):
    calibrator_update(state, jnp.zeros(2), jnp.zeros(2), refit_every=0)
  with pytest.raises(ValueError, match="min_pairs=5 exceeds the buffer capacity 4"):
    calibrator_update(state, jnp.zeros(2), jnp.zeros(2), min_pairs=5)
  with pytest.raises(ValueError, match="min_pairs=200 exceeds"):  # the default
    calibrator_update(state, jnp.zeros(2), jnp.zeros(2))
  state = calibrator_init(capacity=256)
  with pytest.raises(ValueError, match="r_env"):
    calibrator_update(state, jnp.zeros(2), jnp.zeros(3))
  with pytest.raises(ValueError, match="mask"):
    calibrator_update(state, jnp.zeros(2), jnp.zeros(2), jnp.ones(3, bool))
  with pytest.raises(ValueError, match="y has"):
    pav_fit(jnp.zeros(2), jnp.zeros(3))


# ---------------------------------------------------------------------------------------------
# Disagreement and the inverse-variance weight.
# ---------------------------------------------------------------------------------------------


def _np_disagreement(d, y, m):
  out = []
  for da, ya, ma in zip(d, y, m):
    da, ya = da[ma].astype(np.float64), ya[ma].astype(np.float64)
    if len(ya) == 0 or np.var(ya) <= 1e-9:
      out.append(np.nan)
      continue
    out.append(np.mean(((da - da.mean()) - (ya - ya.mean())) ** 2) / np.var(ya))
  return np.array(out)


def test_group_disagreement_matches_numpy():
  rng = np.random.default_rng(9)
  d = rng.uniform(0, 1, size=(6, 5)).astype(np.float32)
  y = rng.integers(0, 2, size=(6, 5)).astype(np.float32)
  m = rng.uniform(size=(6, 5)) < 0.8
  m[0] = False  # empty group
  m[1] = [True, False, False, False, False]  # a single rollout
  y[2] = 1.0  # degenerate: Var(y) = 0
  m[3] = True
  y[3] = [0, 1, 0, 1, 1]
  d_pad = np.where(m, d, np.nan)  # ungraded entries may hold NaN
  y_pad = np.where(m, y, np.inf)
  got = np.asarray(group_disagreement(d_pad, y_pad, m))
  want = _np_disagreement(d, y, m)
  np.testing.assert_allclose(got, want, rtol=1e-5, equal_nan=True)
  assert np.isnan(got[:3]).all() and np.isfinite(got[3])
  # d = y + constant or d = y: zero disagreement; d = 2y: s² = 1.
  np.testing.assert_allclose(group_disagreement(y[3:4] + 0.3, y[3:4]), [0.0], atol=1e-6)
  np.testing.assert_allclose(group_disagreement(2 * y[3:4], y[3:4]), [1.0], rtol=1e-6)
  with pytest.raises(ValueError, match="y has shape"):
    group_disagreement(d, y[:, :3], m)
  with pytest.raises(ValueError, match="mask"):
    group_disagreement(d, y, m[:, :3])


def _np_ivd(seq, half_life, warmup, target):
  """The reference weighter's loop: EMA from the first value, c fixed once after warmup."""
  alpha = 1 - 0.5 ** (1 / half_life)
  ema, n, c = None, 0, None
  for v in seq:
    if np.isnan(v):
      continue
    ema = v if ema is None else (1 - alpha) * ema + alpha * v
    n += 1
    if c is None and n >= warmup and ema > 1e-12:
      c = (target - 1) / ema
  return ema, n, c


def test_ivd_constant_disagreement_hits_target():
  s = ivd_init()
  s = ivd_update(s, jnp.full((31,), 0.25))
  assert int(s.count) == 31 and np.isnan(s.c)
  assert float(ivd_weight(s)) == 1.0  # exactly 1 before c is fixed
  s = ivd_update(s, jnp.array([0.25, jnp.nan]))
  np.testing.assert_allclose(s.c, (2.0 - 1.0) / 0.25, rtol=1e-6)  # c = (target − 1)/s²
  np.testing.assert_allclose(ivd_weight(s), 2.0, rtol=1e-6)  # w = target
  c = float(s.c)
  s = ivd_update(s, jnp.full((200,), 1.0))  # disagreement rises: c stays frozen, w clips at 4
  assert float(s.c) == c
  ema = 1.0 - 0.75 * 0.5 ** (200 / 64)  # from ¼ towards 1 over 200 groups
  np.testing.assert_allclose(s.ema, ema, rtol=1e-5)
  assert float(ivd_weight(s)) == 4.0  # 1 + 4·0.91 > 4
  assert float(ivd_weight(s, w_max=3.0)) == 3.0
  s = ivd_update(s, jnp.full((128,), 0.0))  # disagreement falls: two half-lives
  np.testing.assert_allclose(s.ema, ema / 4, rtol=1e-4)
  np.testing.assert_allclose(ivd_weight(s), 1 + c * ema / 4, rtol=1e-4)


def test_ivd_ema_by_hand_and_against_reference_loop():
  s = ivd_update(ivd_init(), jnp.array([1.0, jnp.nan, 3.0, 5.0]), half_life=1.0, warmup=3,
                 target=3.0)
  # β = ½: ema 1 → 2 → 3.5; c set at the third value: (3 − 1)/3.5.
  np.testing.assert_allclose([s.ema, s.c], [3.5, 2.0 / 3.5], rtol=1e-6)
  assert int(s.count) == 3
  np.testing.assert_allclose(ivd_weight(s), 3.0, rtol=1e-6)
  rng = np.random.default_rng(10)
  seq = rng.gamma(2.0, 0.3, size=90).astype(np.float32)
  seq[rng.uniform(size=90) < 0.2] = np.nan
  ema, n, c = _np_ivd(seq.astype(np.float64), 64.0, 32, 2.0)
  got = ivd_init()
  for chunk in np.split(seq, 3):  # in several calls: the same as one sequence
    got = ivd_update(got, chunk)
  np.testing.assert_allclose([got.ema, got.c], [ema, c], rtol=1e-5)
  assert int(got.count) == n
  np.testing.assert_allclose(ivd_weight(got), np.clip(1 + c * ema, 1, 4), rtol=1e-5)


def test_ivd_weight_by_hand():
  state = IVDState(jnp.float32(3.0), jnp.int32(40), jnp.float32(0.5))
  assert float(ivd_weight(state)) == 2.5  # 1 + 0.5·3
  assert float(ivd_weight(state._replace(c=jnp.float32(jnp.nan)))) == 1.0


def test_ivd_errors():
  s = ivd_init()
  with pytest.raises(ValueError, match="half_life"):
    ivd_update(s, jnp.ones(2), half_life=0.0)
  with pytest.raises(ValueError, match="warmup"):
    ivd_update(s, jnp.ones(2), warmup=0)
  with pytest.raises(ValueError, match="target"):
    ivd_update(s, jnp.ones(2), target=0.5)
  with pytest.raises(ValueError, match="s2"):
    ivd_update(s, jnp.ones((2, 2)))
  with pytest.raises(ValueError, match="w_max"):
    ivd_weight(s, w_max=0.5)


# ---------------------------------------------------------------------------------------------
# Advantages.
# ---------------------------------------------------------------------------------------------


def _np_wmrl_adv(r, graded, anchor, w, eps=1e-4):
  out = np.zeros(r.shape)
  for b in range(r.shape[0]):
    idx = [i for i in range(r.shape[1]) if graded[b, i]]
    if len(idx) < 2:
      continue
    vals = np.array([r[b, i] for i in idx], np.float64)
    sd = np.sqrt(np.mean((vals - vals.mean()) ** 2))
    for i, v in zip(idx, vals):
      out[b, i] = (v - vals.mean()) / (sd + eps) * (w if anchor[b] else 1.0)
  return out


def _adv_batch(seed=11, groups=16, size=6):
  rng = np.random.default_rng(seed)
  r = rng.uniform(0, 1, size=(groups, size)).astype(np.float32)
  graded = rng.uniform(size=(groups, size)) < 0.8
  graded[0] = [True] + [False] * (size - 1)  # one graded rollout: dropped
  graded[1] = False
  r = np.where(graded, r, np.nan).astype(np.float32)
  anchor = rng.uniform(size=groups) < 0.3
  anchor[2] = True
  return r, graded, anchor


def test_wmrl_advantages_matches_numpy():
  r, graded, anchor = _adv_batch()
  got = np.asarray(wmrl_advantages(r, graded, anchor, 2.5))
  np.testing.assert_allclose(got, _np_wmrl_adv(r, graded, anchor, 2.5), rtol=1e-5, atol=1e-6)
  assert (got[:2] == 0).all() and (got[~graded] == 0).all()
  # Ungraded rollouts are excluded, not scored 0: scoring them 0 changes the graded advantages.
  zeroed = np.asarray(wmrl_advantages(np.nan_to_num(r), np.ones_like(graded), anchor, 2.5))
  assert not np.allclose(zeroed[graded], got[graded], atol=1e-3)
  # min_graded = 3 also drops groups with exactly two graded rollouts.
  two = graded.copy()
  two[3] = [True, True, False, False, False, False]
  got3 = np.asarray(wmrl_advantages(r, two, anchor, 1.0, min_graded=3))
  assert (got3[3] == 0).all() and np.abs(got3[4:]).sum() > 0


def test_wmrl_advantages_errors():
  r, graded, anchor = _adv_batch()
  with pytest.raises(ValueError, match="graded"):
    wmrl_advantages(r, graded[:, :3], anchor, 1.0)
  with pytest.raises(ValueError, match="is_anchor"):
    wmrl_advantages(r, graded, anchor[:3], 1.0)
  with pytest.raises(ValueError, match="min_graded"):
    wmrl_advantages(r, graded, anchor, 1.0, min_graded=0)
  with pytest.raises(ValueError, match="w must be a scalar"):
    wmrl_advantages(r, graded, anchor, jnp.ones(2))


def test_sharded_matches_single_device():
  assert jax.device_count() == 8, "tests/conftest.py should give 8 fake CPU devices"
  r, graded, anchor = _adv_batch(seed=12)
  mesh = Mesh(np.array(jax.devices()), ("data",))
  rows = NamedSharding(mesh, P("data"))
  fn = jax.jit(wmrl_advantages)
  single = fn(*[jax.device_put(a, jax.devices()[0]) for a in (r, graded, anchor)], 1.7)
  sharded = [jax.device_put(a, rows) for a in (r, graded, anchor)]
  assert len(sharded[0].sharding.device_set) == 8
  np.testing.assert_allclose(fn(*sharded, 1.7), single, rtol=1e-6, atol=1e-7)


# ---------------------------------------------------------------------------------------------
# The per-step order.
# ---------------------------------------------------------------------------------------------

STEP = dict(min_pairs=8, refit_every=8, warmup=1, eps=0.0)


def test_wmrl_step_pushes_before_measuring_and_in_group_order():
  rng = np.random.default_rng(13)
  env = rng.uniform(0, 1, size=(4, 8)).astype(np.float32)
  wm = (env**3).astype(np.float32)
  anchor = np.array([False, True, False, False])
  env_in = np.where(anchor[:, None], env, np.nan).astype(np.float32)
  out = wmrl_step(calibrator_init(capacity=64), ivd_init(), wm, env_in, anchor, **STEP)
  fitted = _push(calibrator_init(capacity=64), wm[1], env[1], min_pairs=8, refit_every=8)
  assert bool(fitted.fitted)
  for a, b in zip(out.calibrator, fitted):
    np.testing.assert_array_equal(a, b)
  # s² of the anchor group is measured on f̂(r_wm) with the map fitted on its own pairs...
  s2_cal = float(group_disagreement(apply_calibration(fitted, wm[1:2]), env[1:2])[0])
  s2_raw = float(group_disagreement(wm[1:2], env[1:2])[0])
  assert abs(s2_cal - s2_raw) > 1e-2
  np.testing.assert_allclose(out.metrics.disagreement[1], s2_cal, rtol=1e-5)
  assert np.isnan(np.asarray(out.metrics.disagreement)[[0, 2, 3]]).all()
  # ... group 0 came before the anchor (identity), group 2 after it (calibrated).
  np.testing.assert_allclose(out.metrics.rewards[0], wm[0])
  np.testing.assert_allclose(out.metrics.rewards[1], env[1])
  np.testing.assert_allclose(out.metrics.rewards[2], apply_calibration(fitted, wm[2]), rtol=1e-6)
  # warmup = 1: c was fixed on this group, so w = target = 2 on the anchor group.
  np.testing.assert_allclose(out.metrics.weight, 2.0, rtol=1e-6)
  want = _np_wmrl_adv(np.asarray(out.metrics.rewards), np.isfinite(out.metrics.rewards),
                      anchor, 2.0, eps=0.0)
  np.testing.assert_allclose(out.advantages, want, rtol=1e-6)
  assert np.abs(out.advantages[1]).max() > np.abs(out.advantages[0]).max()


def test_wmrl_step_identity_calibrator_and_ungraded():
  rng = np.random.default_rng(14)
  wm = rng.uniform(0, 1, size=(4, 8)).astype(np.float32)
  env = rng.uniform(0, 1, size=(4, 8)).astype(np.float32)
  wm[0, :7] = np.nan  # a world-model group with one graded rollout: dropped
  env[1, 2] = np.nan  # an anchor rollout that timed out: excluded
  anchor = np.array([False, True, False, True])
  state = _push(calibrator_init(capacity=64), *_pairs(60, seed=15), min_pairs=8, refit_every=8)
  out = wmrl_step(state, ivd_init(), wm, env, anchor, calibrator="identity", **STEP)
  np.testing.assert_array_equal(out.metrics.rewards[2], wm[2])  # raw world model
  assert int(out.metrics.num_pairs) == 60 + 15  # anchor pairs still enter the buffer
  assert (out.advantages[0] == 0).all() and out.advantages[1, 2] == 0
  iso = wmrl_step(state, ivd_init(), wm, env, anchor, **STEP)
  assert not np.allclose(iso.metrics.rewards[2], wm[2])
  with pytest.raises(KeyError, match="unknown reward calibrator"):
    wmrl_step(state, ivd_init(), wm, env, anchor, calibrator="platt")
  with pytest.raises(ValueError, match="is_anchor"):
    wmrl_step(state, ivd_init(), wm, env, anchor[:2])
