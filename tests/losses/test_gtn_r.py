"""TS-GRPO and GTN-R (losses/gtn_r.py): golden values, λ = 0 is TS-GRPO, the regulariser's
gradient moves the mixture toward y*, anchored groups, jit, 8-device sharding, bad input."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxrl_post.losses import gtn_r as gl
from jaxrl_post.models import forecaster as fc


def _key(seed):
  """An rbg key: its draws compile ~4x faster on CPU than threefry's (the tests check
  properties of the draws, not their bits)."""
  return jax.random.key(seed, impl="rbg")


def test_rewards_golden():
  samples = jnp.array([[[0.0], [1.0], [3.0]]])  # B = 1, G = 3, H = 1; y* = 1, σ̂ = 1
  target, scale = jnp.ones((1, 1)), jnp.ones(1)
  np.testing.assert_allclose(gl.forecast_rewards(samples, target, scale), [[-1, 0, -4]])
  np.testing.assert_allclose(gl.forecast_rewards(samples, target, scale, reward="mae"),
                             [[-1, 0, -2]])
  # |y − y*| = (1, 0, 2); (1/G) Σ_j |y_i − y_j| = (4/3, 1, 5/3) → R = −(1/3, −1/2, 7/6).
  crps = gl.forecast_rewards(samples, target, scale, reward="crps")
  np.testing.assert_allclose(crps, [[-1 / 3, 1 / 2, -7 / 6]], rtol=1e-6)
  # −mean R is the ensemble CRPS: mean|y − y*| − (1/2G²) Σ|y_i − y_j| = 1 − 12/18 = 1/3.
  np.testing.assert_allclose(-crps.mean(), 1 / 3, rtol=1e-6)
  # σ̂ units: scaling series and σ̂ together leaves the reward unchanged.
  np.testing.assert_allclose(gl.forecast_rewards(5 * samples, 5 * target, 5 * scale),
                             [[-1, 0, -4]], rtol=1e-6)
  with pytest.raises(KeyError, match="crps, mae, mse"):
    gl.forecast_rewards(samples, target, scale, reward="rmse")


def test_advantages_are_group_zscores():
  r = np.random.default_rng(0).normal(size=(3, 5)).astype(np.float32)
  want = (r - r.mean(1, keepdims=True)) / (r.std(1, ddof=1, keepdims=True) + 1e-6)
  np.testing.assert_allclose(gl.ts_grpo_advantages(jnp.asarray(r)), want, rtol=1e-5, atol=1e-6)


def test_ts_grpo_loss_golden():
  # Ratios 1.5 and 0.5, A = ±1, ε = 0.2: L₁ = max(−1.5, −1.2) = −1.2, L₂ = max(0.5, 0.8) = 0.8.
  logp, old = jnp.log(jnp.array([[1.5, 0.5]])), jnp.zeros((1, 2))
  adv = jnp.array([[1.0, -1.0]])
  loss, aux = gl.ts_grpo_loss(logp, old, adv)
  np.testing.assert_allclose(loss, -0.2, rtol=1e-6)
  np.testing.assert_allclose(aux.clip_frac, 1.0)
  np.testing.assert_allclose(gl.ts_grpo_loss(logp, old, adv, weights=jnp.array([[1.0, 0.0]]))[0],
                             -1.2, rtol=1e-6)
  # k3 KL to ref = 0: (1/1.5 − 1 + log 1.5 + 2 − 1 − log 2)/2 = 0.1894925.
  loss, aux = gl.ts_grpo_loss(logp, old, adv, ref_logp=jnp.zeros((1, 2)), beta=0.1)
  np.testing.assert_allclose(aux.kl, 0.1894925, rtol=1e-5)
  np.testing.assert_allclose(loss, -0.2 + 0.1 * 0.1894925, rtol=1e-5)


def test_anneal_schedules():
  assert gl.anneal(0, start=1.0, end=0.2, steps=4) == 1.0
  assert gl.anneal(2, start=1.0, end=0.2, steps=4) == pytest.approx(0.6)
  assert gl.anneal(9, start=1.0, end=0.2, steps=4) == pytest.approx(0.2)
  assert gl.anneal(1, start=1.0, end=0.0, steps=4, kind="cosine") == pytest.approx(
    0.5 * (1 + math.cos(math.pi / 4)))
  assert gl.anneal(3, start=0.7, end=0.0, steps=4, kind="constant") == 0.7
  with pytest.raises(KeyError, match="constant, cosine, linear"):
    gl.anneal(1, start=1.0, end=0.0, steps=4, kind="exp")
  assert gl.GTN_R_VARIANTS.names() == ["anchored_group", "neighbourhood_nll", "none"]
  assert gl.GTN_R_VARIANTS.get("neighbourhood_nll").regulariser
  assert gl.GTN_R_VARIANTS.get("anchored_group").anchors


def _problem(b=8, g=4, h=3, m=5, seed=0):
  """A mixture `[b, h, 2]` (the differentiated argument) and a rollout of it (one jit)."""
  rng = np.random.default_rng(seed)
  mix = fc.MixtureParams(jnp.asarray(rng.normal(size=(b, h, 2)), jnp.float32),
                         jnp.asarray(rng.normal(size=(b, h, 2)), jnp.float32),
                         jnp.asarray(rng.uniform(0.5, 1.5, (b, h, 2)), jnp.float32))
  target = jnp.asarray(rng.normal(size=(b, h)) + 2.0, jnp.float32)
  scale = jnp.asarray(rng.uniform(0.5, 2.0, b), jnp.float32)
  logp_noise = jnp.asarray(rng.normal(size=(b, g)), jnp.float32)
  weights = jnp.asarray(rng.uniform(0.5, 1.0, (b, g)), jnp.float32)

  @jax.jit
  def rollout(mix, target, scale, logp_noise, weights):
    members = fc.sample(mix, _key(seed), g)
    return dict(members=members, old_logp=fc.log_prob(mix, members) + 0.1 * logp_noise,
                ref_logp=fc.log_prob(mix, members) - 0.2,
                adv=gl.ts_grpo_advantages(gl.forecast_rewards(members, target, scale)),
                weights=weights,
                neighbours=gl.neighbourhood_draws(_key(1), target, scale, delta=0.3, num=m))

  return mix, rollout(mix, target, scale, logp_noise, weights)


@pytest.fixture(scope="module")
def problem():
  """`_problem()`, built once for the tests of this module that share it."""
  return _problem()


def _loss(mix, a, lam, with_nbr=True):
  nbr = fc.log_prob(mix, a["neighbours"]) if with_nbr else None
  return gl.gtn_r_loss(fc.log_prob(mix, a["members"]), a["old_logp"], a["adv"], nbr_logp=nbr,
                       lam=lam, horizon=a["members"].shape[-1], weights=a["weights"],
                       ref_logp=a["ref_logp"], beta=0.05)


def test_lambda_zero_is_exactly_ts_grpo(problem):
  mix, a = problem
  grad = jax.jit(jax.value_and_grad(lambda m, lam, nbr: _loss(m, a, lam, nbr)[0]),
                 static_argnums=2)
  plain_value, plain_grad = grad(mix, 0.0, False)
  value, g = grad(mix, 0.0, True)
  assert value == plain_value
  for x, y in zip(jax.tree.leaves(g), jax.tree.leaves(plain_grad)):
    np.testing.assert_array_equal(x, y)
  # With λ > 0 the loss moves by exactly λ·(−mean log π(ỹ)/H) (jitted: eager is checked in
  # test_jit_and_sharded_equal_single_device).
  value, aux = jax.jit(lambda m: _loss(m, a, 0.3))(mix)
  reg = jax.jit(lambda m: -jnp.mean(fc.log_prob(m, a["neighbours"])) / 3)(mix)
  np.testing.assert_allclose(aux.neighbourhood_nll, reg, rtol=1e-6)
  np.testing.assert_allclose(value, plain_value + 0.3 * reg, rtol=1e-5)


def test_regulariser_gradient_moves_mass_toward_truth():
  # One point: w = (0.9, 0.1), μ = (0, 2.5), σ = (1, 0.5); the truth y* = 3 is near the
  # low-weight component. −∂R/∂ raises its weight and moves both means up toward 3.
  mix = fc.MixtureParams(jnp.log(jnp.array([[[0.9, 0.1]]])), jnp.array([[[0.0, 2.5]]]),
                         jnp.array([[[1.0, 0.5]]]))
  target, scale = jnp.array([[3.0]]), jnp.ones(1)
  nbr = gl.neighbourhood_draws(_key(0), target, scale, delta=0.1, num=256)
  reg = lambda m: gl.neighbourhood_nll(fc.log_prob(m, nbr), 1)
  g = jax.jit(jax.grad(reg))(mix)
  assert g.logits[0, 0, 1] < 0 < g.logits[0, 0, 0]  # weight of the component near y* up
  assert g.loc[0, 0, 1] < 0 and g.loc[0, 0, 0] < 0  # means move up, toward 3
  stepped = jax.tree.map(lambda p, d: p - 0.1 * d, mix, g)
  before = abs(float(fc.mean(mix)[0, 0]) - 3.0)
  assert abs(float(fc.mean(stepped)[0, 0]) - 3.0) < before
  # One compiled diagnostic for both mixtures: (draws, mass near the truth).
  diag = jax.jit(lambda m: (lambda d: (d, gl.forecast_diagnostics(
    d, fc.mean(m), target, scale, delta=0.25).mass_near_truth[0]))(fc.sample(m, _key(1), 4000)))
  (draws, mass_after), (_, mass_before) = diag(stepped), diag(mix)
  assert draws.shape == (1, 4000, 1) and mass_after > mass_before


def test_anchored_group_rewards_anchors_and_pushes_them_up():
  samples = jnp.array([[[0.0, 0.0], [1.0, 0.5], [-1.0, 0.0]]])  # far from y* = (3, 3)
  target, scale = jnp.full((1, 2), 3.0), jnp.ones(1)
  anchors = gl.neighbourhood_draws(_key(0), target, scale, delta=0.05, num=2)
  members, is_anchor = gl.anchored_group(samples, anchors)
  assert members.shape == (1, 5, 2)
  assert is_anchor.tolist() == [[False, False, False, True, True]]
  adv = gl.ts_grpo_advantages(gl.forecast_rewards(members, target, scale))
  assert float(adv[0, 3:].min()) > 0.9 > float(adv[0, :3].max())  # anchors lead the group
  logp = jnp.zeros((1, 5))
  g = jax.grad(lambda lp: gl.ts_grpo_loss(lp, jnp.zeros((1, 5)), adv)[0])(logp)
  assert np.all(g[0, 3:] < 0)  # descent raises the anchors' log-densities
  with pytest.raises(ValueError, match="same B and H"):
    gl.anchored_group(samples, jnp.zeros((1, 2, 3)))


def test_diagnostics_golden():
  draws = jnp.array([[[3.1, 2.9], [5.0, 3.0], [3.0, 3.0], [0.0, 0.0]]])
  d = gl.forecast_diagnostics(draws, jnp.array([[4.0, 3.0]]), jnp.full((1, 2), 3.0),
                              jnp.array([2.0]), delta=0.1)
  # RMS errors in σ̂ = 2 units: 0.05, √(1/2)·1 = 0.707, 0, 1.5 → two of four inside δ = 0.1.
  np.testing.assert_allclose(d.mass_near_truth, [0.5])
  np.testing.assert_allclose(d.distance, [math.sqrt(0.5 * 0.25)], rtol=1e-6)
  want_std = np.mean(np.std(np.asarray(draws)[0], axis=0)) / 2
  np.testing.assert_allclose(d.predictive_std, [want_std], rtol=1e-6)


def test_jit_and_sharded_equal_single_device(problem):
  mix, a = problem
  fn = jax.jit(jax.value_and_grad(lambda m, a, lam: _loss(m, a, lam)[0]))
  value, grad = fn(mix, a, jnp.float32(0.3))
  eager = _loss(mix, a, 0.3)[0]
  np.testing.assert_allclose(value, eager, rtol=1e-6)
  mesh = Mesh(np.array(jax.devices()[:8]), ("data",))
  rows = lambda x: jax.device_put(x, NamedSharding(mesh, P("data")))
  s_value, s_grad = fn(jax.tree.map(rows, mix), jax.tree.map(rows, a), jnp.float32(0.3))
  assert len(s_value.sharding.device_set) == 8 or s_value.shape == ()
  np.testing.assert_allclose(s_value, value, rtol=1e-6, atol=1e-6)
  for x, y in zip(jax.tree.leaves(s_grad), jax.tree.leaves(grad)):
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7)


def test_bad_input_names_the_key():
  target, scale = jnp.zeros((2, 3)), jnp.ones(2)
  with pytest.raises(ValueError, match=r"delta=0.0 must be > 0 \(config.gtn_r.delta"):
    gl.neighbourhood_draws(_key(0), target, scale, delta=0.0, num=2)
  with pytest.raises(ValueError, match="config.gtn_r.delta"):
    gl.forecast_diagnostics(jnp.zeros((2, 4, 3)), target, target, scale, delta=-1.0)
  with pytest.raises(ValueError, match=r"G >= 2 \(config.num_samples\)"):
    gl.ts_grpo_advantages(jnp.zeros((2, 1)))
  with pytest.raises(ValueError, match=r"G >= 2 \(config.num_samples\)"):
    gl.ts_grpo_loss(jnp.zeros((2, 1)), jnp.zeros((2, 1)), jnp.zeros((2, 1)))
  with pytest.raises(ValueError, match=r"H=4 points, target has H=3 \(config.horizon\)"):
    gl.forecast_rewards(jnp.zeros((2, 4, 4)), target, scale)
  with pytest.raises(ValueError, match=r"lam=-0.1 must be >= 0 \(config.gtn_r.lam\)"):
    gl.gtn_r_loss(jnp.zeros((2, 2)), jnp.zeros((2, 2)), jnp.zeros((2, 2)), lam=-0.1)
  with pytest.raises(ValueError, match="config.gtn_r.num_neighbours"):
    gl.neighbourhood_draws(_key(0), target, scale, delta=0.1, num=0)
