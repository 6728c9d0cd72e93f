"""A small velocity model v_θ(x, t, c) for rectified-flow policies (Flow-GRPO, arXiv 2505.05470).

An MLP on `[x, φ(t)]` (+ a learned embedding of a discrete condition `c`, added to the first
hidden layer), with sinusoidal time features

  φ(t) = [sin(2π·f_k·t), cos(2π·f_k·t)]_{k < K},   f_k = 2^k / 2   (K = `time_features` / 2)

and SiLU activations. Latents of any trailing shape are flattened to `dim` features and the
output is reshaped back. Parameters carry logical axis names (`mlp` for the hidden width, so
the hidden layers split over the `tensor` mesh axis under the default rules; the input and
output widths are replicated), like the decoder's.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl_post.models.dense import dense
from jaxrl_post.parallel import axes


def _param(value: jax.Array, logical_axes: tuple) -> nnx.Param:
  return nnx.Param(value, out_sharding=logical_axes, eager_sharding=False)


def time_features(t: jax.Array, num: int) -> jax.Array:
  """`[batch] → [batch, num]` sinusoidal features of t ∈ [0, 1] (num even).

  Examples:
    >>> time_features(jnp.zeros((3,)), 4).tolist()[0]
    [0.0, 0.0, 1.0, 1.0]
  """
  freqs = 0.5 * 2.0 ** jnp.arange(num // 2, dtype=jnp.float32)
  angle = 2.0 * math.pi * t.astype(jnp.float32)[:, None] * freqs
  return jnp.concatenate([jnp.sin(angle), jnp.cos(angle)], axis=-1)


class VelocityMLP(nnx.Module):
  """`model(x [batch, *latent], t [batch], c [batch] int | None) -> v [batch, *latent]`.

  Attributes:
    dim: flattened latent size.
    kernels / biases: `depth` hidden layers of width `hidden`, then a linear output layer.
    cond_embed: `[num_conditions, hidden]` (None when `num_conditions` = 0).

  Example:
    >>> model = VelocityMLP(2, hidden=8, depth=2, rngs=nnx.Rngs(0))
    >>> model(jnp.zeros((3, 2)), jnp.full((3,), 0.5)).shape
    (3, 2)
  """

  def __init__(self, dim: int, *, hidden: int = 64, depth: int = 3, time_dim: int = 16,
               num_conditions: int = 0, rngs: nnx.Rngs):
    if dim < 1 or hidden < 1 or depth < 1 or time_dim < 2 or time_dim % 2:
      raise ValueError(f"VelocityMLP: dim={dim}, hidden={hidden}, depth={depth} must be >= 1 "
                       f"and time_dim={time_dim} even and >= 2")
    self.dim, self.time_dim, self.num_conditions = dim, time_dim, num_conditions
    init = nnx.initializers.lecun_normal()
    widths = [dim + time_dim] + [hidden] * depth
    self.kernels = nnx.List([
      _param(init(rngs.params(), (i, o), jnp.float32),
             (None, axes.MLP) if n == 0 else (axes.EMBED, axes.MLP))
      for n, (i, o) in enumerate(zip(widths[:-1], widths[1:]))])
    self.biases = nnx.List([_param(jnp.zeros((hidden,), jnp.float32), (axes.MLP,))
                            for _ in range(depth)])
    # A small output layer: a new model predicts v ≈ 0, with gradients reaching every layer.
    self.out_kernel = _param(0.1 * init(rngs.params(), (hidden, dim), jnp.float32),
                             (axes.MLP, None))
    self.out_bias = _param(jnp.zeros((dim,), jnp.float32), (None,))
    self.cond_embed = (
      _param(0.1 * jax.random.normal(rngs.params(), (num_conditions, hidden), jnp.float32),
             (None, axes.MLP)) if num_conditions else None)

  def __call__(self, x: jax.Array, t: jax.Array, c: jax.Array | None = None) -> jax.Array:
    shape = x.shape
    h = x.reshape(shape[0], -1).astype(jnp.float32)
    if h.shape[1] != self.dim:
      raise ValueError(f"VelocityMLP(dim={self.dim}) got a latent of shape {shape[1:]}")
    t = jnp.broadcast_to(jnp.asarray(t, jnp.float32), (shape[0],))
    h = jnp.concatenate([h, time_features(t, self.time_dim)], axis=-1)
    for n, (kernel, bias) in enumerate(zip(self.kernels, self.biases)):
      h = dense(h, kernel[...]) + bias[...]
      if n == 0 and self.cond_embed is not None and c is not None:
        h = h + self.cond_embed[...][c]
      h = axes.constrain(nnx.silu(h), (axes.BATCH, axes.MLP))
    out = dense(h, self.out_kernel[...]) + self.out_bias[...]
    return out.reshape(shape)
