"""A tiny sequential-behaviour recommender foundation model (GRU) with post-training heads.

The model of the synthetic analogue of "Progressive Alignment of Recommender Foundation Model
through Multi-Phase Post-Training" (arXiv 2608.06792, sizes PROPOSAL):

  backbone         item embeddings E `[I, d]` and a GRU over the user's history:
                   h_t = GRU(h_{t−1}, E[x_t]); the user state is h_L. Pretrained on next-item
                   prediction: logits_t = (W_o h_t) · Eᵀ (tied embeddings).
  encoder          the downstream encoder: z = h + MLP(LN(h))    (new module)
  policy_head      ranking policy f_θ(u, i) = (W_f z) · E[i] + b_f[i]
  reward_head      ordinal score s(u, i) = (W_r z) · E[i] + b_r[i] and K − 1 raw thresholds
                   (`losses.ordinal.ordered_thresholds`)
  propensity_head  exposure logits over all items: (W_p z) · Eᵀ + b_p

The attribute names are the parameter groups of `training.phases.GROUP_RULES["recommender"]`
(backbone / heads = encoder + policy_head / reward / propensity). `stop_backbone=True` cuts the
gradient into the backbone (linear probing: its gradients are exactly zero, and the backward
pass skips the GRU). Parameters carry logical axis names (`embed` on d).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl_post.losses.ordinal import ordered_thresholds
from jaxrl_post.parallel import axes


def _param(value: jax.Array, logical_axes: tuple) -> nnx.Param:
  return nnx.Param(value, out_sharding=logical_axes, eager_sharding=False)


def _normal(rngs: nnx.Rngs, shape: tuple[int, ...], std: float) -> jax.Array:
  return std * jax.random.normal(rngs.params(), shape, jnp.float32)


class Backbone(nnx.Module):
  """Item embeddings + a GRU over the history (the "foundation model")."""

  def __init__(self, num_items: int, dim: int, *, rngs: nnx.Rngs):
    std = dim ** -0.5
    self.item_emb = _param(_normal(rngs, (num_items, dim), 1.0), (None, axes.EMBED))
    # GRU gates (update z, reset r, candidate n), input and recurrent kernels.
    self.w_x = _param(_normal(rngs, (dim, 3 * dim), std), (axes.EMBED, None))
    self.w_h = _param(_normal(rngs, (dim, 3 * dim), std), (axes.EMBED, None))
    # Sharded like the GRU state (XLA shards the update so; born so, the step compiles once).
    self.b = _param(jnp.zeros((3 * dim,), jnp.float32), (axes.EMBED,))
    self.w_out = _param(_normal(rngs, (dim, dim), std), (axes.EMBED, None))

  def states(self, history: jax.Array) -> jax.Array:
    """GRU states after each history item, `[B, L, d]`, for int `history` `[B, L]`.

      z, r = σ(x W_xz + h W_hz + b_z), σ(x W_xr + h W_hr + b_r)
      n = tanh(x W_xn + b_n + r ⊙ (h W_hn)),  h' = (1 − z) ⊙ n + z ⊙ h
    """
    x = self.item_emb[...][history] @ self.w_x[...] + self.b[...]  # [B, L, 3d]
    w_h = self.w_h[...]
    d = w_h.shape[0]

    def cell(h, x_t):
      hh = h @ w_h
      z = jax.nn.sigmoid(x_t[:, :d] + hh[:, :d])
      r = jax.nn.sigmoid(x_t[:, d:2 * d] + hh[:, d:2 * d])
      n = jnp.tanh(x_t[:, 2 * d:] + r * hh[:, 2 * d:])
      h = (1.0 - z) * n + z * h
      return h, h

    h0 = jnp.zeros((history.shape[0], d), x.dtype)
    _, hs = jax.lax.scan(cell, h0, jnp.swapaxes(x, 0, 1))
    return jnp.swapaxes(hs, 0, 1)

  def next_item_logits(self, history: jax.Array) -> jax.Array:
    """`[B, L, I]`: position t scores the item at t + 1 (tied embeddings)."""
    return (self.states(history) @ self.w_out[...]) @ self.item_emb[...].T


class Encoder(nnx.Module):
  """z = h + W_2 gelu(W_1 LN(h)): the downstream encoder (a new module)."""

  def __init__(self, dim: int, *, rngs: nnx.Rngs):
    self.scale = _param(jnp.ones((dim,), jnp.float32), (axes.EMBED,))
    self.w1 = _param(_normal(rngs, (dim, 2 * dim), dim ** -0.5), (axes.EMBED, None))
    self.w2 = _param(jnp.zeros((2 * dim, dim), jnp.float32), (None, axes.EMBED))

  def __call__(self, h: jax.Array) -> jax.Array:
    mu = h.mean(-1, keepdims=True)
    var = jnp.square(h - mu).mean(-1, keepdims=True)
    x = (h - mu) * jax.lax.rsqrt(var + 1e-5) * self.scale[...]
    return h + jax.nn.gelu(x @ self.w1[...]) @ self.w2[...]


class ItemScorer(nnx.Module):
  """score(u, i) = (W z) · e_i + b[i]: a bilinear head over the backbone's item embeddings."""

  def __init__(self, dim: int, num_items: int, *, rngs: nnx.Rngs):
    self.w = _param(_normal(rngs, (dim, dim), dim ** -0.5), (axes.EMBED, None))
    self.bias = _param(jnp.zeros((num_items,), jnp.float32), (None,))

  def __call__(self, z: jax.Array, item_vecs: jax.Array, items: jax.Array | None) -> jax.Array:
    """`[B, N]` for `z` `[B, d]` and `item_vecs` `[B, N, d]` (items `[B, N]`), or all items
    (`item_vecs` `[I, d]`, `items` None)."""
    q = z @ self.w[...]
    if items is None:
      return q @ item_vecs.T + self.bias[...]
    return jnp.einsum("bd,bnd->bn", q, item_vecs) + self.bias[...][items]


class OrdinalHead(ItemScorer):
  """An `ItemScorer` plus K − 1 raw ordinal thresholds (initially b_k ≈ k − 1/2).

  The initial thresholds encode a funnel prior (PROPOSAL): with s ≈ 0 about 38 % of
  impressions stop at level 0 and each deeper level is rarer (P(level > k) = σ(1/2 − k)).
  """

  def __init__(self, dim: int, num_items: int, num_levels: int, *, rngs: nnx.Rngs):
    super().__init__(dim, num_items, rngs=rngs)
    # raw_0 = −1/2, then softplus(raw_k) = 1: thresholds (about) 1 apart.
    raw = jnp.concatenate([jnp.array([-0.5]),
                           jnp.full((num_levels - 2,), jnp.log(jnp.e - 1.0))])
    self.raw_thresholds = _param(raw.astype(jnp.float32), (None,))


class RecommenderFM(nnx.Module):
  """The backbone and its four post-training modules (module docstring)."""

  def __init__(self, num_items: int, *, dim: int = 32, num_levels: int = 6, rngs: nnx.Rngs):
    if num_levels < 2:
      raise ValueError(f"num_levels={num_levels} must be >= 2")
    self.num_items, self.num_levels = num_items, num_levels
    self.backbone = Backbone(num_items, dim, rngs=rngs)
    self.encoder = Encoder(dim, rngs=rngs)
    self.policy_head = ItemScorer(dim, num_items, rngs=rngs)
    self.reward_head = OrdinalHead(dim, num_items, num_levels, rngs=rngs)
    self.propensity_head = ItemScorer(dim, num_items, rngs=rngs)

  def features(self, history: jax.Array, *, stop_backbone: bool = False
               ) -> tuple[jax.Array, jax.Array]:
    """`(z [B, d], E [I, d])`: the encoded user state and the item embeddings."""
    h = self.backbone.states(history)[:, -1]
    table = self.backbone.item_emb[...]
    if stop_backbone:
      h, table = jax.lax.stop_gradient(h), jax.lax.stop_gradient(table)
    return self.encoder(h), table

  def policy_scores(self, z, table, items=None) -> jax.Array:
    """f_θ(u, i), `[B, N]` for int `items` `[B, N]`, or `[B, I]` for all items."""
    return self.policy_head(z, table if items is None else table[items], items)

  def reward_scores(self, z, table, items=None) -> jax.Array:
    """The ordinal score s(u, i) (`[B, N]` or `[B, I]`)."""
    return self.reward_head(z, table if items is None else table[items], items)

  def thresholds(self) -> jax.Array:
    return ordered_thresholds(self.reward_head.raw_thresholds[...])

  def propensity_logits(self, z, table) -> jax.Array:
    """Exposure logits over all items, `[B, I]` (log-softmax: the per-draw log-propensity)."""
    return self.propensity_head(z, table, None)
