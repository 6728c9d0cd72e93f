"""PPO's clipped value loss: golden values, gradients, micro-batch sums, explained variance."""

import doctest

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_post import losses
from jaxrl_post.losses import explained_variance, value_loss
from jaxrl_post.losses import value as value_module

# Three valid tokens (ε_v = 0.2), the fourth is padding with garbage:
#   V = 1.0, V_old = 0.5, R = 2.0: unclipped (1−2)² = 1, clipped (0.7−2)² = 1.69 → 1.69, clipped
#   V = 0.1, V_old = 0.0, R = 0.0: unclipped 0.01,       clipped (0.1−0)² = 0.01 → 0.01, not
#   V = 0.0, V_old = 1.0, R = 0.5: unclipped 0.25,       clipped (0.8−0.5)² = 0.09 → 0.25, not
# L = ½ · (1.69 + 0.01 + 0.25) / 3 = 0.325; clip_frac = 1/3.
# (A bug that takes the min instead of the max would give ½·(1 + 0.01 + 0.09)/3 = 0.18333.)
V = np.array([[1.0, 0.1], [0.0, np.nan]], np.float32)
V_OLD = np.array([[0.5, 0.0], [1.0, np.inf]], np.float32)
R = np.array([[2.0, 0.0], [0.5, np.nan]], np.float32)
M = np.array([[1, 1], [1, 0]], np.float32)


def test_golden_clipped_loss_and_clip_fraction():
  loss, aux = value_loss(V, V_OLD, R, M, clip=0.2)
  np.testing.assert_allclose(loss, 0.325, rtol=1e-6)
  np.testing.assert_allclose(aux.clip_frac, 1 / 3, rtol=1e-6)
  np.testing.assert_allclose(aux.value_mean, 1.1 / 3, rtol=1e-6)
  plain, aux_plain = value_loss(V, V_OLD, R, M, clip=None)
  np.testing.assert_allclose(plain, 0.5 * (1 + 0.01 + 0.25) / 3, rtol=1e-6)
  assert float(aux_plain.clip_frac) == 0.0


def test_gradient_flows_only_through_the_larger_term():
  # dL/dV: token 0 is clipped (its V is outside V_old ± ε and the clipped term wins): 0;
  # tokens 1, 2: (V − R) / N.
  grad = jax.grad(lambda v: value_loss(v, V_OLD, R, M, clip=0.2)[0])(jnp.asarray(V))
  np.testing.assert_allclose(grad, [[0.0, 0.1 / 3], [-0.5 / 3, 0.0]], atol=1e-6)


def test_micro_batches_add_up_to_the_batch():
  rng = np.random.default_rng(0)
  values, old, returns = (rng.standard_normal((8, 5)).astype(np.float32) for _ in range(3))
  mask = (rng.uniform(size=(8, 5)) < 0.7).astype(np.float32)
  n = mask.sum()
  loss, aux = value_loss(values, old, returns, mask, clip=0.2)
  parts = [value_loss(values[s], old[s], returns[s], mask[s], clip=0.2, num_tokens=n)
           for s in (slice(0, 3), slice(3, 8))]
  np.testing.assert_allclose(sum(p[0] for p in parts), loss, rtol=1e-5)
  summed = {k: sum(p[1].additive()[k] for p in parts) for k in aux.additive()}
  for k, v in aux.additive().items():
    np.testing.assert_allclose(summed[k], v, rtol=1e-5, atol=1e-6, err_msg=k)
  # Explained variance from summed moments equals numpy's over the valid tokens.
  valid = mask > 0
  want = 1 - np.var(returns[valid] - values[valid]) / np.var(returns[valid])
  np.testing.assert_allclose(explained_variance(summed), want, rtol=1e-4)
  np.testing.assert_allclose(aux.explained_variance, want, rtol=1e-4)


def test_explained_variance_edges():
  r = np.array([[1.0, 2.0, 3.0]], np.float32)
  m = np.ones_like(r)
  assert float(value_loss(r, r, r, m, clip=0.2)[1].explained_variance) == 1.0  # perfect fit
  const = value_loss(np.full_like(r, 2.0), r, r, m, clip=0.2)[1]
  np.testing.assert_allclose(const.explained_variance, 0.0, atol=1e-6)  # the mean: explains 0
  flat = value_loss(r, r, np.ones_like(r), m, clip=0.2)[1]
  assert float(flat.explained_variance) == 0.0  # returns do not vary


def test_exports_and_doctests():
  assert losses.value_loss is value_loss
  assert doctest.testmod(value_module).failed == 0
