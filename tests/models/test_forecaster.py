"""The Gaussian-mixture forecaster: densities and CDF against scipy, draws, moments, median,
shape errors, and the model on an 8-device mesh equal to one device."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from scipy import stats

from jaxrl_post.models import forecaster as fc
from jaxrl_post.parallel.axes import DEFAULT_RULES
from jaxrl_post.parallel.mesh import init_sharded


def _key(seed):
  """An rbg key: its draws compile ~4x faster on CPU than threefry's (the tests check
  properties of the draws, not their bits)."""
  return jax.random.key(seed, impl="rbg")


def _mixture(b=3, h=4, k=2, seed=0):
  rng = np.random.default_rng(seed)
  return fc.MixtureParams(logits=jnp.asarray(rng.normal(size=(b, h, k)), jnp.float32),
                          loc=jnp.asarray(rng.normal(size=(b, h, k)) * 2, jnp.float32),
                          scale=jnp.asarray(rng.uniform(0.3, 2.0, (b, h, k)), jnp.float32))


def _scipy_point_logpdf(p, y):
  """log Σ_k w N(y; μ, σ²) per point, float64; y [b, H] or [b, S, H]."""
  logits = np.asarray(p.logits, np.float64)
  w = np.exp(logits - logits.max(-1, keepdims=True))
  w /= w.sum(-1, keepdims=True)
  loc, scale = np.asarray(p.loc, np.float64), np.asarray(p.scale, np.float64)
  if y.ndim == 3:
    w, loc, scale = w[:, None], loc[:, None], scale[:, None]
  return np.log(np.sum(w * stats.norm.pdf(y[..., None], loc, scale), axis=-1))


def test_log_prob_and_cdf_match_scipy():
  p = _mixture()
  rng = np.random.default_rng(1)
  for shape in ((3, 4), (3, 5, 4)):
    y = rng.normal(size=shape) * 2
    want = _scipy_point_logpdf(p, y)
    np.testing.assert_allclose(fc.point_log_prob(p, jnp.asarray(y, jnp.float32)), want,
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(jax.jit(fc.log_prob)(p, jnp.asarray(y, jnp.float32)),
                               want.sum(-1), rtol=1e-5, atol=1e-4)
  y = rng.normal(size=(3, 4))
  w = np.asarray(p.weights, np.float64)
  want = np.sum(w * stats.norm.cdf(y[..., None], np.asarray(p.loc), np.asarray(p.scale)), -1)
  np.testing.assert_allclose(fc.cdf(p, jnp.asarray(y, jnp.float32)), want, atol=1e-6)
  with pytest.raises(ValueError, match="H = 4"):
    fc.log_prob(p, jnp.zeros((3, 5)))


def test_moments_median_and_draws():
  p = _mixture(b=2, h=3)
  w, loc, scale = (np.asarray(a, np.float64) for a in (p.weights, p.loc, p.scale))
  m = np.sum(w * loc, -1)
  var = np.sum(w * (scale**2 + loc**2), -1) - m**2
  np.testing.assert_allclose(fc.mean(p), m, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(fc.variance(p), var, rtol=1e-5, atol=1e-5)
  med = jax.jit(fc.median)(p)
  np.testing.assert_allclose(fc.cdf(p, med), 0.5, atol=1e-5)
  draws = jax.jit(fc.sample, static_argnums=2)(p, _key(0), 20000)
  assert draws.shape == (2, 20000, 3)
  # Monte-Carlo moments: 20k draws, σ of the mean estimate ≲ 0.02 here.
  np.testing.assert_allclose(draws.mean(1), m, atol=0.08)
  np.testing.assert_allclose(draws.var(1), var, rtol=0.06)
  # The draws' component frequencies follow the weights: the share below the median is ½.
  np.testing.assert_allclose(np.mean(np.asarray(draws) < np.asarray(med)[:, None], 1), 0.5,
                             atol=0.02)
  # No gradient flows through the draws (score-function estimators only).
  grad = jax.grad(lambda loc: fc.sample(p._replace(loc=loc), _key(1), 3).sum())(p.loc)
  assert not np.any(grad)


def test_forecaster_shapes_units_and_errors():
  cfg = fc.ForecasterConfig(context_len=8, horizon=3, hidden=16)
  model = fc.Forecaster(cfg, rngs=nnx.Rngs(_key(0)))
  x = jnp.asarray(np.random.default_rng(0).normal(size=(4, 8)), jnp.float32)
  out = jax.jit(lambda m, x: m(x))(model, x)
  assert out.loc.shape == out.scale.shape == out.logits.shape == (4, 3, 2)
  assert np.all(np.asarray(out.scale) > 0)
  # Instance normalisation: an affine map of the context maps the mixture the same way.
  moved = model(3.0 + 5.0 * x)
  np.testing.assert_allclose(moved.loc, 3.0 + 5.0 * out.loc, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(moved.scale, 5.0 * out.scale, rtol=1e-4)
  np.testing.assert_allclose(moved.logits, out.logits, atol=1e-4)
  with pytest.raises(ValueError, match="context_len is 8"):
    model(jnp.zeros((2, 7)))
  with pytest.raises(ValueError, match="num_components=0"):
    fc.ForecasterConfig(num_components=0)


def test_sharded_model_equals_single_device():
  cfg = fc.ForecasterConfig(context_len=8, horizon=3, hidden=16)
  mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 2, 2), ("data", "fsdp", "tensor"))
  make = lambda: fc.Forecaster(cfg, rngs=nnx.Rngs(0))
  # Under jit the initialiser gives the same values on any mesh (partitionable threefry).
  single = init_sharded(make, Mesh(np.array(jax.devices()[:1]), ("data",)), DEFAULT_RULES)
  sharded = init_sharded(make, mesh, DEFAULT_RULES)
  for a, b in zip(jax.tree.leaves(nnx.state(single)), jax.tree.leaves(nnx.state(sharded))):
    np.testing.assert_array_equal(a, b)
  x = jnp.asarray(np.random.default_rng(0).normal(size=(8, 8)), jnp.float32)
  y = jnp.asarray(np.random.default_rng(1).normal(size=(8, 3)), jnp.float32)
  xs = jax.device_put(x, NamedSharding(mesh, P(("data", "fsdp"))))
  ys = jax.device_put(y, NamedSharding(mesh, P(("data", "fsdp"))))
  f = jax.jit(lambda m, x, y: fc.log_prob(m(x), y))
  np.testing.assert_allclose(f(sharded, xs, ys), f(single, x, y), rtol=1e-6, atol=1e-5)
