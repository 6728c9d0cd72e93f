"""TV-OPD (arXiv 2609.08341): TV estimator, pooled statistic, scheduler, skip, Eq. 7 ablations."""

import doctest

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxrl_post.losses import tv_opd
from jaxrl_post.losses.tv_opd import (
  TV_OPD_ADVANTAGES,
  TVOPDState,
  TVStats,
  init_tv_opd_state,
  tv_estimate,
  tv_opd_advance,
  tv_opd_advantages,
  tv_opd_commit,
)


def test_doctests():
  assert doctest.testmod(tv_opd, raise_on_error=False).failed == 0


def _batch(make_rollout, **kw):
  """Teacher = the rollout's `logp_padded` (−inf on padding), student = `old_logp`."""
  r = make_rollout(**kw)
  return r["logp_padded"], r["old_logp"], r["mask"]


def _np_d_hat(teacher, student, mask):
  delta = np.where(mask > 0, teacher.astype(np.float64) - student, 0.0)
  return np.where(mask > 0, np.maximum(1.0 - np.exp(delta), 0.0), 0.0)


# ---- the estimator ----


def test_tv_estimate_golden_by_hand():
  # p/q = [1/2, 2, 1, 1/10]: d̂ = [1/2, 0, 0, 9/10]; the last token is padding (NaN teacher).
  teacher = jnp.log(jnp.array([[0.25, 0.5, 0.3, 0.1], [0.05, 0.2, jnp.nan, 0.0]]))
  student = jnp.log(jnp.array([[0.5, 0.25, 0.3, 0.2], [0.5, 0.2, 0.4, 0.3]]))
  mask = jnp.array([[1, 1, 1, 0], [1, 1, 0, 0]])
  s = tv_estimate(teacher, student, mask)
  np.testing.assert_allclose(s.sum, 0.5 + 0.0 + 0.0 + 0.9 + 0.0, rtol=1e-6)
  assert float(s.count) == 5.0
  np.testing.assert_allclose(s.mean(), 1.4 / 5, rtol=1e-6)


def test_tv_estimate_matches_numpy(make_rollout):
  teacher, student, mask = _batch(make_rollout, batch=8, empty_row=True)
  s = jax.jit(tv_estimate)(teacher, student, mask)
  d = _np_d_hat(teacher, student, mask)
  np.testing.assert_allclose(s.sum, d.sum(), rtol=1e-5)
  assert float(s.count) == mask.sum()
  assert np.all((d >= 0) & (d <= 1))


def test_tv_estimate_is_unbiased_for_total_variation():
  # E_{a~q}[d̂(a)] = Σ_a q(a)[1 − p(a)/q(a)]_+ = Σ_a (q − p)_+ = ½ Σ_a |p − q|, by enumeration.
  p = np.array([0.5, 0.3, 0.15, 0.05])
  q = np.array([0.2, 0.2, 0.4, 0.2])
  per_token = _np_d_hat(np.log(p)[None], np.log(q)[None], np.ones((1, 4)))[0]
  d = np.array([float(tv_estimate(jnp.log(jnp.array([[p[a]]])), jnp.log(jnp.array([[q[a]]])),
                                  jnp.ones((1, 1))).sum) for a in range(4)])
  np.testing.assert_allclose(d, per_token, rtol=1e-5)
  np.testing.assert_allclose(np.sum(q * d), 0.5 * np.abs(p - q).sum(), rtol=1e-5)  # = 0.35


def test_pooled_statistic_two_halves_equal_one_batch(make_rollout):
  teacher, student, mask = _batch(make_rollout, batch=8, time=6)
  full = tv_estimate(teacher, student, mask)
  halves = [tv_estimate(teacher[i:i + 4], student[i:i + 4], mask[i:i + 4]) for i in (0, 4)]
  pooled = jax.tree.map(jnp.add, *halves)
  np.testing.assert_allclose(pooled.sum, full.sum, rtol=1e-6)
  np.testing.assert_allclose(pooled.count, full.count)
  np.testing.assert_allclose(pooled.mean(), full.mean(), rtol=1e-6)
  # The mean of the two micro-batch means is a different (wrong) number on a ragged batch.
  assert abs(float((halves[0].mean() + halves[1].mean()) / 2 - full.mean())) > 1e-4
  # …and so is the scheduler state: pooled stats give exactly the one-batch state.
  one = tv_opd_advantages(teacher, student, mask, init_tv_opd_state())[1]
  two = tv_opd_advantages(teacher[:4], student[:4], mask[:4], init_tv_opd_state(),
                          stats=pooled)[1]
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), one, two)


# ---- scheduler ----


def _np_schedule(d_hats, alpha, beta, c_min, eps, finite):
  """Eq. 11 written out step by step (float64): the coefficient used at each step."""
  used, init, d_bar, d_ref, c = [], False, 0.0, 0.0, 1.0
  for d, ok in zip(d_hats, finite):
    used.append(c)
    if not ok:
      continue
    if not init:
      d_ref = d_bar = d
      init = True
    else:
      d_bar = beta * d_bar + (1 - beta) * d
    c = min(max(((d_bar + eps) / (d_ref + eps)) ** alpha, c_min), 1.0)
  return used, (d_bar, d_ref, c)


def test_scheduler_golden_first_steps_by_hand():
  # Step 1: D̂ = 0.4 → D_ref = D̄ = 0.4, c_2 = 1. Step 2: D̂ = 0.2 → D̄ = 0.95·0.4 + 0.05·0.2
  # = 0.39, c_3 = (0.39/0.4)^0.5 = 0.98742. Step 3: D̂ = 0 → D̄ = 0.3705, c_4 = 0.96244.
  s = init_tv_opd_state()
  cs = []
  for d in (0.4, 0.2, 0.0):
    s = tv_opd_advance(s, TVStats(jnp.float32(d * 10), jnp.float32(10)))
    cs.append(float(s.c))
  np.testing.assert_allclose(cs, [1.0, 0.9874209, 0.9624188], rtol=1e-5)
  np.testing.assert_allclose([s.D_bar, s.D_ref], [0.3705, 0.4], rtol=1e-6)


@pytest.mark.parametrize("alpha,beta", [(0.5, 0.95), (4.0, 0.5)])
def test_scheduler_matches_eq11_over_a_trajectory(alpha, beta):
  # A shrinking TV with a skipped (non-finite) step; α = 4, β = ½ reaches c_min = 0.1.
  d_hats = [0.5, 0.45, 0.4, 0.3, 0.9, 0.2, 0.1, 0.05, 0.02, 0.01, 0.0, 0.0]
  finite = [True] * 4 + [False] + [True] * 7
  used, (d_bar, d_ref, c) = _np_schedule(d_hats, alpha, beta, 0.1, 1e-8, finite)

  @jax.jit
  def run(d_hat, ok):
    def step(state, x):
      d, f = x
      new = tv_opd_advance(state, TVStats(d * 8.0, jnp.float32(8.0)), alpha=alpha, beta=beta,
                             finite=f)
      return new, state.c

    return jax.lax.scan(step, init_tv_opd_state(), (d_hat, ok))

  final, got = run(jnp.array(d_hats, jnp.float32), jnp.array(finite))
  np.testing.assert_allclose(got, used, rtol=1e-5)
  np.testing.assert_allclose([final.D_bar, final.D_ref, final.c], [d_bar, d_ref, c], rtol=1e-5)
  if alpha == 4.0:
    assert float(final.c) == pytest.approx(0.1)


def test_advantages_use_the_coefficient_fixed_before_the_step(make_rollout):
  teacher, student, mask = _batch(make_rollout)
  sign = np.where(mask > 0, np.sign(np.where(mask > 0, teacher - student, 0.0)), 0.0)
  state = TVOPDState(jnp.float32(0.3), jnp.float32(0.6), jnp.float32(0.7), jnp.bool_(True))
  adv, new = jax.jit(tv_opd_advantages)(teacher, student, mask, state)
  np.testing.assert_array_equal(adv, 0.7 * sign.astype(np.float32))  # c_k = state.c, not new.c
  d_hat = _np_d_hat(teacher, student, mask).sum() / mask.sum()
  d_bar = 0.95 * 0.3 + 0.05 * d_hat
  np.testing.assert_allclose(new.D_bar, d_bar, rtol=1e-5)
  np.testing.assert_allclose(new.c, np.clip(np.sqrt((d_bar + 1e-8) / (0.6 + 1e-8)), 0.1, 1),
                             rtol=1e-5)
  # First step: c_1 = 1 and D_ref = D̄ = D̂.
  adv1, s1 = tv_opd_advantages(teacher, student, mask, init_tv_opd_state())
  np.testing.assert_array_equal(adv1, sign)
  np.testing.assert_allclose([s1.D_ref, s1.D_bar, s1.c], [d_hat, d_hat, 1.0], rtol=1e-5)
  assert bool(s1.initialized)


def test_advantages_carry_no_gradient(make_rollout):
  teacher, student, mask = _batch(make_rollout)
  teacher = np.where(mask > 0, teacher, 0.0)

  def f(t, s):
    return jnp.sum(tv_opd_advantages(t, s, mask, init_tv_opd_state())[0])

  gt, gs = jax.grad(f, argnums=(0, 1))(jnp.asarray(teacher), jnp.asarray(student))
  assert not np.any(gt) and not np.any(gs)


# ---- skipping a step ----


def _same(a, b):
  jax.tree.map(lambda x, y: np.testing.assert_array_equal(x, y), a, b)


def test_non_finite_step_does_not_advance_the_state(make_rollout):
  teacher, student, mask = _batch(make_rollout)
  state = TVOPDState(jnp.float32(0.3), jnp.float32(0.6), jnp.float32(0.7), jnp.bool_(True))
  adv, skipped = tv_opd_advantages(teacher, student, mask, state, finite=False)
  _same(skipped, state)
  np.testing.assert_allclose(np.abs(adv).max(), 0.7)  # the step's advantages are unaffected
  # The usual order: propose, then commit once the gradient norm is known.
  _, proposed = tv_opd_advantages(teacher, student, mask, state)
  assert float(proposed.D_bar) != 0.3
  _same(jax.jit(tv_opd_commit)(state, proposed, jnp.isfinite(jnp.float32(jnp.nan))), state)
  _same(tv_opd_commit(state, proposed, jnp.isfinite(jnp.float32(1.0))), proposed)
  # Traced flag, no recompilation between a finite and a non-finite step.
  advance = jax.jit(tv_opd_advance)
  stats = tv_estimate(teacher, student, mask)
  _same(advance(state, stats, finite=jnp.bool_(False)), state)
  advance(state, stats, finite=jnp.bool_(True))
  assert advance._cache_size() == 1


def test_skipped_first_step_leaves_d_ref_to_the_first_valid_one():
  s0 = init_tv_opd_state()
  s = tv_opd_advance(s0, TVStats(jnp.float32(3.0), jnp.float32(10.0)), finite=False)
  _same(s, s0)
  s = tv_opd_advance(s, TVStats(jnp.float32(0.0), jnp.float32(0.0)))  # no active token
  _same(s, s0)
  s = tv_opd_advance(s, TVStats(jnp.float32(jnp.nan), jnp.float32(4.0)))  # NaN teacher
  _same(s, s0)
  s = tv_opd_advance(s, TVStats(jnp.float32(1.0), jnp.float32(4.0)))
  np.testing.assert_allclose([s.D_ref, s.D_bar, s.c], [0.25, 0.25, 1.0])
  assert bool(s.initialized)


def test_nan_teacher_on_an_active_token_skips_the_update():
  teacher = jnp.array([[jnp.nan, -1.0]])
  state = TVOPDState(jnp.float32(0.3), jnp.float32(0.6), jnp.float32(0.7), jnp.bool_(True))
  _, new = tv_opd_advantages(teacher, jnp.zeros((1, 2)), jnp.ones((1, 2)), state)
  _same(new, state)


# ---- sharding ----


def _mesh():
  assert jax.device_count() == 8, "tests/conftest.py should give 8 fake CPU devices"
  return Mesh(np.array(jax.devices()), ("data",))


def test_sharded_equals_single_device(make_rollout):
  teacher, student, mask = _batch(make_rollout, batch=16, empty_row=True)
  state = TVOPDState(jnp.float32(0.3), jnp.float32(0.6), jnp.float32(0.7), jnp.bool_(True))
  fn = jax.jit(tv_opd_advantages)
  dev0 = jax.devices()[0]
  single = fn(*[jax.device_put(a, dev0) for a in (teacher, student, mask)], state)
  rows = NamedSharding(_mesh(), P("data"))
  args = [jax.device_put(jnp.asarray(a), rows) for a in (teacher, student, mask)]
  assert len(args[0].sharding.device_set) == 8
  sharded = fn(*args, state)
  np.testing.assert_array_equal(sharded[0], single[0])
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), sharded[1], single[1])
  for name in ("group_constant", "permuted"):  # the two that look across rows
    f = jax.jit(TV_OPD_ADVANTAGES.get(name))
    key = jax.random.key(3)
    np.testing.assert_allclose(f(*args, key=key), f(teacher, student, mask, key=key),
                               rtol=1e-6, err_msg=name)


def test_shard_map_with_axis_name_equals_single_device(make_rollout):
  teacher, student, mask = _batch(make_rollout, batch=16)
  state = init_tv_opd_state()

  def local(t, s, m):
    adv, new = tv_opd_advantages(t, s, m, state, axis_name="data")
    gc = TV_OPD_ADVANTAGES.get("group_constant")(t, s, m, axis_name="data")
    return adv, new, gc

  fn = jax.jit(jax.shard_map(local, mesh=_mesh(), in_specs=(P("data"),) * 3,
                             out_specs=(P("data"), P(), P("data"))))
  adv, new, gc = fn(teacher, student, mask)
  ref_adv, ref_new = tv_opd_advantages(teacher, student, mask, state)
  np.testing.assert_array_equal(adv, ref_adv)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), new, ref_new)
  np.testing.assert_allclose(gc, TV_OPD_ADVANTAGES.get("group_constant")(teacher, student, mask),
                             rtol=1e-6)


# ---- Eq. 7 ablations ----


def test_ablation_registry_names():
  assert TV_OPD_ADVANTAGES.names() == ["group_constant", "permuted", "raw", "sign"]
  with pytest.raises(KeyError, match="valid names"):
    TV_OPD_ADVANTAGES.get("magnitude")


def test_raw_sign_group_constant_match_numpy(make_rollout):
  teacher, student, mask = _batch(make_rollout, batch=8, empty_row=True)
  delta = np.where(mask > 0, teacher.astype(np.float64) - student, 0.0)
  raw = jax.jit(TV_OPD_ADVANTAGES.get("raw"))(teacher, student, mask)
  np.testing.assert_allclose(raw, delta, rtol=1e-6, atol=1e-6)
  np.testing.assert_array_equal(TV_OPD_ADVANTAGES.get("sign")(teacher, student, mask),
                                np.sign(delta))
  pos, neg = (mask > 0) & (delta > 0), (mask > 0) & (delta < 0)
  expected = np.where(pos, delta[pos].mean(), np.where(neg, delta[neg].mean(), 0.0))
  got = TV_OPD_ADVANTAGES.get("group_constant")(teacher, student, mask)
  np.testing.assert_allclose(got, expected, rtol=1e-5)
  # Group-constant keeps each sign group's total magnitude.
  np.testing.assert_allclose(np.abs(got)[pos].sum(), np.abs(delta)[pos].sum(), rtol=1e-5)


def test_permuted_shuffles_magnitudes_within_each_sign_group(make_rollout):
  teacher, student, mask = _batch(make_rollout, batch=8, empty_row=True)
  delta = np.where(mask > 0, teacher.astype(np.float64) - student, 0.0)
  fn = jax.jit(TV_OPD_ADVANTAGES.get("permuted"))
  a = np.asarray(fn(teacher, student, mask, key=jax.random.key(0)))
  b = np.asarray(fn(teacher, student, mask, key=jax.random.key(1)))
  np.testing.assert_array_equal(a, fn(teacher, student, mask, key=jax.random.key(0)))
  np.testing.assert_array_equal(np.sign(a), np.sign(delta))
  np.testing.assert_array_equal(a[mask == 0], 0.0)
  for group in (delta > 0, delta < 0):
    np.testing.assert_allclose(np.sort(np.abs(a[group])), np.sort(np.abs(delta[group])),
                               rtol=1e-6)
  assert not np.allclose(a, delta) and not np.allclose(a, b)  # the link is actually broken
  with pytest.raises(ValueError, match="PRNG key"):
    fn(teacher, student, mask)


def test_permuted_is_a_uniform_shuffle():
  # Three positive magnitudes: each of the 3! assignments should appear about 1/6 of the time.
  delta = jnp.array([[1.0, 2.0, 3.0, -5.0]])
  fn = jax.jit(jax.vmap(lambda k: TV_OPD_ADVANTAGES.get("permuted")(
    delta, jnp.zeros((1, 4)), jnp.ones((1, 4)), key=k)))
  out = np.asarray(fn(jax.random.split(jax.random.key(0), 1200)))[:, 0]
  np.testing.assert_array_equal(out[:, 3], -5.0)
  _, counts = np.unique(out[:, :3], axis=0, return_counts=True)
  assert len(counts) == 6 and counts.min() > 150 and counts.max() < 250


def test_sign_update_is_total_variation_descent():
  # Eq. 8: E_{a~q}[sign(Δ_a) ∇_z log q(a)] = −2 ∇_z D_TV(p, softmax(z)), by enumeration.
  p = jnp.array([0.5, 0.3, 0.15, 0.05])

  @jax.jit
  def both_sides(z):
    q = jax.nn.softmax(z)
    sign = TV_OPD_ADVANTAGES.get("sign")(jnp.log(p)[None], jnp.log(q)[None], jnp.ones((1, 4)))
    score = jnp.eye(4) - q[None, :]  # row a: ∇_z log q(a) = e_a − q
    lhs = jnp.sum(q[:, None] * sign[0][:, None] * score, axis=0)
    rhs = -2 * jax.grad(lambda z: 0.5 * jnp.sum(jnp.abs(p - jax.nn.softmax(z))))(z)
    return lhs, rhs

  lhs, rhs = both_sides(jnp.array([0.1, -0.4, 0.9, 0.0]))
  np.testing.assert_allclose(lhs, rhs, rtol=1e-5, atol=1e-6)
