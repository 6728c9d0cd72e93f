"""`models.dense`: `x @ kernel` with a CPU-friendly kernel gradient, same values as autodiff."""

import jax
import jax.ad_checkpoint
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_post.models.dense import dense


def _grads(fn, x, w, cot):
  return jax.jit(jax.value_and_grad(lambda x, w: jnp.sum(fn(x, w) * cot), argnums=(0, 1)))(x, w)


@pytest.mark.parametrize("d,f", [(16, 48), (48, 16)])
def test_values_and_gradients_match_autodiff(d, f):
  k = jax.random.split(jax.random.key(0), 3)
  x = jax.random.normal(k[0], (3, 7, d))
  w = 0.1 * jax.random.normal(k[1], (d, f))
  cot = jax.random.normal(k[2], (3, 7, f))
  np.testing.assert_allclose(dense(x, w), x @ w, rtol=1e-6, atol=1e-6)
  (value, (dx, dw)), (ref_value, (ref_dx, ref_dw)) = (
    _grads(dense, x, w, cot), _grads(lambda x, w: x @ w, x, w, cot))
  np.testing.assert_allclose(value, ref_value, rtol=1e-5)
  np.testing.assert_allclose(dx, ref_dx, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(dw, ref_dw, rtol=1e-5, atol=1e-5)


def test_bfloat16_gradients_keep_their_dtypes():
  x = jnp.ones((2, 5, 8), jnp.bfloat16)
  w = jnp.ones((8, 4), jnp.bfloat16)
  dx, dw = jax.grad(lambda x, w: jnp.sum(dense(x, w).astype(jnp.float32)), argnums=(0, 1))(x, w)
  assert dx.dtype == dw.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(dw, np.float32), 10.0)


def test_dots_remat_policy_saves_its_output(capsys):
  # `remat_policy="dots"` must keep treating the MLP matmuls as saveable.
  x, w = jnp.ones((2, 3, 8)), jnp.ones((8, 8))
  policy = jax.checkpoint_policies.dots_with_no_batch_dims_saveable

  def saved(fn):
    f = jax.checkpoint(lambda x, w: jnp.sum(jnp.sin(fn(x, w))), policy=policy)
    jax.ad_checkpoint.print_saved_residuals(f, x, w)
    return [line.split(" from ")[0] for line in capsys.readouterr().out.splitlines()]

  ours = saved(dense)
  assert ours == saved(lambda x, w: x @ w)
  assert "f32[2,3,8]" in ours  # the matmul's output (sin' needs it)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="checks XLA:CPU's lowering")
def test_cpu_kernel_gradient_is_a_plain_matmul():
  # The point of `dense`: no dot with a transposed (token-major) left operand, which
  # XLA:CPU runs outside its fast matmul library.
  x, w, cot = jnp.ones((4, 64, 32)), jnp.ones((32, 96)), jnp.ones((4, 64, 96))
  grad = jax.jit(jax.grad(lambda x, w: jnp.sum(dense(x, w) * cot), argnums=1))
  hlo = grad.lower(x, w).compile().as_text()
  assert "lhs_contracting_dims={0}" not in hlo
