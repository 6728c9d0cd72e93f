"""`x @ kernel` whose kernel gradient XLA:CPU runs as a fast matmul.

The kernel gradient of `y = x @ kernel` is `xᵀ · dy`, a contraction over the
token axes, which are the *major* axes of both operands. Plain autodiff hands
XLA that dot with a transposed left operand; XLA:CPU's fast matmul library
(YNNPACK) does not take that form, so the dot falls back to Eigen, and layout
assignment transposes the larger operand, fusing the transposition into the
elementwise producer of `dy` (the SiLU gate's derivative) as a strided loop.
In a GRPO update of the `small` preset (32 × 80 tokens, d = 256, mlp = 768)
the twelve MLP kernel gradients took ~30 % of the backward pass that way
(docs/benchmarks.md, 2026-12-04).

`dense` computes the same values with a custom VJP whose kernel gradient, on
CPU, transposes the *smaller* of `x` and `dy` explicitly and hides the
transposition from XLA's transpose folding (`optimization_barrier`), so the
product is a canonical `[m, k] × [k, n]` matmul. Other platforms get autodiff's
own expression (their matmul units take transposed operands natively).
"""

from __future__ import annotations

import jax


@jax.custom_vjp
def dense(x: jax.Array, kernel: jax.Array) -> jax.Array:
  """`x @ kernel` for `x` `[..., d]` and `kernel` `[d, f]` (same dtype), with a CPU-friendly VJP.

  Example:
    >>> import jax.numpy as jnp
    >>> x, w = jnp.ones((2, 3, 4)), jnp.ones((4, 5))
    >>> dense(x, w).shape
    (2, 3, 5)
  """
  return x @ kernel


def _dense_fwd(x, kernel):
  return x @ kernel, (x, kernel)


def _kernel_grad_plain(x2, dy2):
  return x2.T @ dy2


def _kernel_grad_cpu(x2, dy2):
  barrier = jax.lax.optimization_barrier
  if x2.shape[1] <= dy2.shape[1]:
    return barrier(x2.T) @ dy2
  # Transposing dy (the narrower operand) and the small [f, d] product is cheaper.
  return barrier(barrier(dy2.T) @ x2).T


def _dense_bwd(residuals, dy):
  x, kernel = residuals
  d, f = kernel.shape
  x2, dy2 = x.reshape(-1, d), dy.reshape(-1, f)
  dx = dy @ kernel.T
  dkernel = jax.lax.platform_dependent(x2, dy2, cpu=_kernel_grad_cpu, default=_kernel_grad_plain)
  return dx.astype(x.dtype), dkernel.astype(kernel.dtype)


dense.defvjp(_dense_fwd, _dense_bwd)
