"""A tiny probabilistic time-series forecaster with a Gaussian-mixture head per horizon point.

The policy of GTN-R / TS-GRPO (arXiv 2608.08010) in miniature: a context window
`x ∈ R^C` maps to a predictive distribution over the horizon `y ∈ R^H`,

  π_θ(y | x) = Π_h Σ_k w_hk(x) · N(y_h; μ_hk(x), σ_hk(x)²),   Σ_k w_hk = 1,

K components per horizon point, independent across points given `x` (Moirai / Toto style
per-point mixtures). The network sees the context after instance normalisation
(`x̃ = (x − m) / s`, `m` the context mean, `s` the context std floored at `scale_floor`),
an MLP of `num_layers` GELU layers maps `x̃` to `[H, K, 3]` raw outputs (mixture logits,
normalised means, raw scales), and the head maps back to the series' units:

  μ_hk = m + s·μ̃_hk,   σ_hk = s·(softplus(ρ_hk) + min_scale).

Everything the losses need is a pure function of a `MixtureParams` (arrays `[b, H, K]`):
`point_log_prob` / `log_prob` (the sequence log-density, the sum over points),
`sample` (draws, not reparameterised), `mean`, `variance`, `cdf`, `median` (bisection on the
CDF). Parameters carry logical axis names (`mlp` on the hidden width; see `parallel.axes`),
so `parallel.mesh.init_sharded` builds them on a mesh.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl_post.parallel import axes


@dataclasses.dataclass(frozen=True)
class ForecasterConfig:
  """Sizes of `Forecaster`.

  Attributes:
    context_len: C, the context window.
    horizon: H, the forecast horizon.
    hidden: width of the MLP.
    num_layers: GELU layers of the MLP (≥ 1).
    num_components: K mixture components per horizon point (K = 2).
    min_scale: floor of σ_hk in units of the context scale `s`.
    scale_floor: floor of the context scale `s` itself (a flat context).
    param_dtype: parameter dtype name.
  """

  context_len: int = 32
  horizon: int = 8
  hidden: int = 64
  num_layers: int = 2
  num_components: int = 2
  min_scale: float = 1e-2
  scale_floor: float = 1e-3
  param_dtype: str = "float32"

  def __post_init__(self):
    for key in ("context_len", "horizon", "hidden", "num_layers", "num_components"):
      value = getattr(self, key)
      if not isinstance(value, int) or value < 1:
        raise ValueError(f"ForecasterConfig.{key}={value!r} must be an int >= 1")
    if self.context_len < 2:
      raise ValueError(f"ForecasterConfig.context_len={self.context_len} must be >= 2 (the "
                       "context std is the scale)")
    if self.min_scale <= 0 or self.scale_floor <= 0:
      raise ValueError(f"ForecasterConfig.min_scale={self.min_scale} and scale_floor="
                       f"{self.scale_floor} must be > 0")


class MixtureParams(NamedTuple):
  """A per-point Gaussian mixture over the horizon; every field `[..., H, K]` (series units)."""

  logits: jax.Array  # mixture logits (weights w = softmax over K)
  loc: jax.Array  # μ
  scale: jax.Array  # σ > 0

  @property
  def weights(self) -> jax.Array:
    return jax.nn.softmax(self.logits, axis=-1)


def context_stats(context: jax.Array, floor: float) -> tuple[jax.Array, jax.Array]:
  """`(m, s)`: mean and population std of `context [..., C]` over C, `s` floored at `floor`."""
  m = jnp.mean(context, axis=-1)
  s = jnp.maximum(jnp.std(context, axis=-1), floor)
  return m, s


def _param(rngs: nnx.Rngs, shape, logical_axes, dtype, fan_in: int) -> nnx.Param:
  value = (fan_in**-0.5 * jax.random.normal(rngs.params(), shape, jnp.float32)).astype(dtype)
  return nnx.Param(value, out_sharding=logical_axes, eager_sharding=False)


class Forecaster(nnx.Module):
  """Context `[b, C]` → `MixtureParams` `[b, H, K]` (see the module docstring).

  Example:
    >>> model = Forecaster(ForecasterConfig(context_len=8, horizon=3), rngs=nnx.Rngs(0))
    >>> out = model(jnp.arange(16.0).reshape(2, 8))
    >>> out.loc.shape, out.scale.shape
    ((2, 3, 2), (2, 3, 2))
  """

  def __init__(self, config: ForecasterConfig, *, rngs: nnx.Rngs):
    c = config
    self.config = c
    dt = jnp.dtype(c.param_dtype)
    widths = [c.context_len] + [c.hidden] * c.num_layers
    self.kernels = nnx.List([
      _param(rngs, (i, o), (None, axes.MLP), dt, fan_in=i)
      for i, o in zip(widths[:-1], widths[1:])])
    self.biases = nnx.List([nnx.Param(jnp.zeros((o,), dt), out_sharding=(axes.MLP,),
                                      eager_sharding=False) for o in widths[1:]])
    out = c.horizon * c.num_components * 3
    # A small head: the untrained mixture starts near N(m, s²) for every component.
    head = 0.1 * c.hidden**-0.5 * jax.random.normal(rngs.params(), (c.hidden, out))
    self.head = nnx.Param(head.astype(dt), out_sharding=(axes.MLP, None), eager_sharding=False)
    # Component means spread over ±1 context std at init, so the K components differ.
    spread = jnp.linspace(-1.0, 1.0, c.num_components) if c.num_components > 1 else jnp.zeros(1)
    bias = jnp.zeros((c.horizon, c.num_components, 3)).at[..., 1].set(spread)
    self.head_bias = nnx.Param(bias.reshape(out).astype(dt), out_sharding=(None,),
                               eager_sharding=False)

  def __call__(self, context: jax.Array) -> MixtureParams:
    c = self.config
    if context.shape[-1] != c.context_len:
      raise ValueError(f"context has length {context.shape[-1]}; the forecaster's "
                       f"context_len is {c.context_len}")
    m, s = context_stats(context.astype(jnp.float32), c.scale_floor)
    h = (context - m[..., None]) / s[..., None]
    for kernel, bias in zip(self.kernels, self.biases):
      h = jax.nn.gelu(h @ kernel[...] + bias[...])
    raw = (h @ self.head[...] + self.head_bias[...]).astype(jnp.float32)
    raw = raw.reshape(*raw.shape[:-1], c.horizon, c.num_components, 3)
    m, s = m[..., None, None], s[..., None, None]
    return MixtureParams(logits=raw[..., 0], loc=m + s * raw[..., 1],
                         scale=s * (jax.nn.softplus(raw[..., 2]) + c.min_scale))


def _expand(params: MixtureParams, y: jax.Array) -> MixtureParams:
  """Inserts sample axes after the batch axis so `params` broadcasts against `y [b, S.., H]`."""
  extra = y.ndim - (params.loc.ndim - 1)
  if extra < 0 or y.shape[-1] != params.loc.shape[-2]:
    raise ValueError(f"y has shape {y.shape}; expected [b, ..., H] with H = "
                     f"{params.loc.shape[-2]} (the mixture's horizon)")
  if extra == 0:
    return params
  return jax.tree.map(lambda a: jnp.expand_dims(a, tuple(range(1, 1 + extra))), params)


def point_log_prob(params: MixtureParams, y: jax.Array) -> jax.Array:
  """Per-point log-densities `log Σ_k w_hk N(y_h; μ_hk, σ_hk²)`.

  Args:
    params: `[b, H, K]` mixture.
    y: `[b, H]` or `[b, S, H]` (S draws per series).

  Returns:
    `[b, H]` or `[b, S, H]` float32.
  """
  p = _expand(params, y)
  z = (y[..., None] - p.loc) / p.scale
  comp = -0.5 * jnp.square(z) - jnp.log(p.scale) - 0.5 * jnp.log(2 * jnp.pi)
  return jax.nn.logsumexp(comp + jax.nn.log_softmax(p.logits, axis=-1), axis=-1)


def log_prob(params: MixtureParams, y: jax.Array) -> jax.Array:
  """The sequence log-density `log π_θ(y | x) = Σ_h point_log_prob`: `[b]` or `[b, S]`.

  Example (one point, K = 2: ½N(0, 1) + ½N(2, 1) at y = 1):
    >>> p = MixtureParams(jnp.zeros((1, 1, 2)), jnp.array([[[0.0, 2.0]]]), jnp.ones((1, 1, 2)))
    >>> round(float(log_prob(p, jnp.ones((1, 1)))[0]), 4)  # log N(1; 0, 1)
    -1.4189
  """
  return jnp.sum(point_log_prob(params, y), axis=-1)


def sample(params: MixtureParams, key: jax.Array, num: int) -> jax.Array:
  """`num` independent draws per series, `[b, num, H]` (component per point, then a Gaussian).

  Not reparameterised: no gradient flows through the draws (score-function methods only).
  """
  k_comp, k_noise = jax.random.split(key)
  b, h, k = params.loc.shape
  comp = jax.random.categorical(k_comp, params.logits[:, None], axis=-1, shape=(b, num, h))
  pick = lambda a: jnp.take_along_axis(jnp.broadcast_to(a[:, None], (b, num, h, k)),
                                       comp[..., None], axis=-1)[..., 0]
  eps = jax.random.normal(k_noise, (b, num, h), jnp.float32)
  return jax.lax.stop_gradient(pick(params.loc) + pick(params.scale) * eps)


def mean(params: MixtureParams) -> jax.Array:
  """Predictive mean `Σ_k w_hk μ_hk`, `[b, H]`."""
  return jnp.sum(params.weights * params.loc, axis=-1)


def variance(params: MixtureParams) -> jax.Array:
  """Predictive variance `Σ_k w_hk (σ_hk² + μ_hk²) − mean²`, `[b, H]`."""
  w = params.weights
  second = jnp.sum(w * (jnp.square(params.scale) + jnp.square(params.loc)), axis=-1)
  return jnp.maximum(second - jnp.square(mean(params)), 0.0)


def cdf(params: MixtureParams, y: jax.Array) -> jax.Array:
  """Per-point CDF `Σ_k w_hk Φ((y_h − μ_hk)/σ_hk)`, shaped like `y` (`[b, H]` or `[b, S, H]`)."""
  p = _expand(params, y)
  return jnp.sum(p.weights * jax.scipy.stats.norm.cdf((y[..., None] - p.loc) / p.scale), axis=-1)


def median(params: MixtureParams, iters: int = 60) -> jax.Array:
  """Per-point predictive median, `[b, H]`: bisection of `cdf = ½` on [min μ−8σ, max μ+8σ]."""
  lo = jnp.min(params.loc - 8 * params.scale, axis=-1)
  hi = jnp.max(params.loc + 8 * params.scale, axis=-1)

  def body(_, bounds):
    lo, hi = bounds
    mid = 0.5 * (lo + hi)
    below = cdf(params, mid) < 0.5
    return jnp.where(below, mid, lo), jnp.where(below, hi, mid)

  lo, hi = jax.lax.fori_loop(0, iters, body, (lo, hi))
  return 0.5 * (lo + hi)
