"""KL estimators k1/k2/k3: golden values, exact expectations, gradient facts, reward penalty."""

import doctest

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_post.losses import kl as kl_lib
from jaxrl_post.losses.kl import KL_ESTIMATORS, kl_estimate, kl_reward_penalty

LOG2 = np.log(2.0)


def test_registry_names():
  assert {'k1', 'k2', 'k3'} <= set(KL_ESTIMATORS.names())
  with pytest.raises(KeyError, match="unknown kl 'k4'; valid names: k1, k2, k3"):
    kl_estimate(jnp.zeros(2), jnp.zeros(2), estimator="k4")


@pytest.mark.parametrize("estimator, expected", [
    # logp = log[.5, .25], ref = log[.25, .5] → log r = ref − logp = [−log 2, log 2], r = [.5, 2].
    ("k1", [LOG2, -LOG2]),                      # −log r
    ("k2", [0.5 * LOG2**2, 0.5 * LOG2**2]),     # ½ (log r)² = 0.2402
    ("k3", [0.5 - 1 + LOG2, 2 - 1 - LOG2]),     # r − 1 − log r = 0.1931, 0.3069
])
def test_golden(estimator, expected):
  logp, ref = jnp.log(jnp.array([0.5, 0.25])), jnp.log(jnp.array([0.25, 0.5]))
  out = jax.jit(kl_estimate, static_argnames="estimator")(logp, ref, estimator=estimator)
  np.testing.assert_allclose(out, expected, rtol=1e-5)


def _categoricals():
  q = jax.nn.softmax(jnp.array([0.3, -1.0, 2.0, 0.5]))
  p = jax.nn.softmax(jnp.array([1.0, 0.0, -0.5, 0.2]))
  return q, p


def test_k1_and_k3_are_unbiased_k2_is_not():
  # E_{y~q}[k] computed exactly over a 4-token vocabulary, against KL(q‖p) = Σ q log(q/p).
  q, p = _categoricals()
  true_kl = float(jnp.sum(q * (jnp.log(q) - jnp.log(p))))
  expect = {name: float(jnp.sum(q * KL_ESTIMATORS.get(name)(jnp.log(q), jnp.log(p))))
            for name in ("k1", "k2", "k3")}
  np.testing.assert_allclose([expect["k1"], expect["k3"]], [true_kl, true_kl], rtol=1e-5)
  assert abs(expect["k2"] - true_kl) > 1e-3


def test_gradient_facts_of_the_spec():
  # opd_family.md §1.6: differentiating the estimator through log q(y) at fixed samples,
  #   E_q[∇k1] = 0,  E_q[∇k2] = ∇KL(q‖p),  E_q[∇k3] = ∇KL(p‖q).
  theta = jnp.array([0.3, -1.0, 2.0, 0.5])
  log_p = jnp.log(_categoricals()[1])

  @jax.jit
  def grads(th):
    def expected(name):
      def surrogate(t):
        log_q = jax.nn.log_softmax(t)
        weights = jax.lax.stop_gradient(jnp.exp(log_q))  # the sampling distribution is fixed
        return jnp.sum(weights * KL_ESTIMATORS.get(name)(log_q, log_p))
      return jax.grad(surrogate)(th)

    reverse = jax.grad(lambda t: jnp.sum(jax.nn.softmax(t) * (jax.nn.log_softmax(t) - log_p)))
    forward = jax.grad(lambda t: jnp.sum(jnp.exp(log_p) * (log_p - jax.nn.log_softmax(t))))
    return expected("k1"), expected("k2"), expected("k3"), reverse(th), forward(th)

  g1, g2, g3, reverse, forward = grads(theta)
  np.testing.assert_allclose(g1, 0.0, atol=1e-6)
  np.testing.assert_allclose(g2, reverse, atol=1e-6)
  np.testing.assert_allclose(g3, forward, atol=1e-6)


def test_reward_penalty_is_masked_detached_and_padding_safe():
  logp = jnp.array([[-1.0, -2.0, -jnp.inf], [-0.5, jnp.nan, 0.0]])
  ref = jnp.array([[-1.5, -2.0, 0.0], [-0.5, 0.0, 0.0]])
  mask = jnp.array([[1, 1, 0], [1, 0, 0]])
  fn = jax.jit(lambda lp: kl_reward_penalty(lp, ref, mask, estimator="k1", coef=0.1))
  # 0.1·k1 = 0.1·(logp − ref) on valid tokens: [0.05, 0, ·], [0, ·, ·]; padding → exactly 0.
  np.testing.assert_allclose(fn(logp), [[0.05, 0.0, 0.0], [0.0, 0.0, 0.0]], atol=1e-7)
  assert np.all(jax.grad(lambda lp: jnp.sum(fn(lp)))(logp) == 0.0)
  k3_pen = kl_reward_penalty(logp, ref, mask, estimator="k3")
  assert np.all(np.isfinite(k3_pen)) and float(k3_pen[0, 0]) == pytest.approx(
      np.exp(-0.5) - 1 + 0.5, rel=1e-5)


def test_doctests():
  assert doctest.testmod(kl_lib).failed == 0
