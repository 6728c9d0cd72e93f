"""A point-cloud quality LMM: multi-view patch encoder → projection → decoder LM.

PCQA-R1 (arXiv 2608.18627) feeds six rendered views of a point cloud into a multimodal LM that
writes a rationale and `<answer>score</answer>`. This is the same architecture in small:

  views [b, V, G, G, C] ──(patchify p×p)──► [b, V·(G/p)², p²·C]
        ──ViewEncoder (linear patch embed + learned view/patch positions + pre-norm MLP blocks)──►
        [b, T_v, width] ──proj──► [b, T_v, embed]   (T_v = V·(G/p)² visual tokens)
  prompt row = concat([proj(encoder(views)), lm.embed_tokens(text)])     [b, T_v + T_t, embed]

The row goes to `CausalLM(..., embeddings=row)`; `kernels.prefill(..., embeddings=row)` and
`scoring.score_model(lm, ..., prompt_embeddings=row)` sample and score it, and gradients of the
scores flow back through `proj` into the encoder.

`PointCloudLM.regress` is the absolute-regression baseline on the same trunk: the final hidden
state of the prompt row through a linear head gives a scalar score ŷ (trained with MSE on the
normalised MOS). Parameters carry logical axis names (`embed` on the projection's output, the
rest replicated) like the LM's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl_post.models.model_config import ModelConfig
from jaxrl_post.models.transformer import CausalLM
from jaxrl_post.parallel import axes

_INIT_STD = 0.02


def _param(value: jax.Array, logical_axes: tuple) -> nnx.Param:
  return nnx.Param(value, out_sharding=logical_axes, eager_sharding=False)


def _normal(rngs: nnx.Rngs, shape: tuple[int, ...], std: float) -> jax.Array:
  return std * jax.random.normal(rngs.params(), shape, jnp.float32)


def patchify(views: jax.Array, patch: int) -> jax.Array:
  """`[b, V, G, G, C]` → `[b, V·(G/p)², p·p·C]`, patches in row-major order per view.

  Examples:
    >>> patchify(jnp.zeros((2, 3, 12, 12, 7)), 4).shape
    (2, 27, 112)
  """
  b, v, g, g2, c = views.shape
  if g != g2 or g % patch:
    raise ValueError(f"views of {g}×{g2} cells do not split into {patch}×{patch} patches")
  n = g // patch
  x = views.reshape(b, v, n, patch, n, patch, c).transpose(0, 1, 2, 4, 3, 5, 6)
  return x.reshape(b, v * n * n, patch * patch * c)


class _Block(nnx.Module):
  """Pre-norm residual MLP block: x + W2·gelu(W1·LN(x))."""

  def __init__(self, width: int, *, rngs: nnx.Rngs):
    self.norm = nnx.LayerNorm(width, rngs=rngs)
    self.w1 = _param(_normal(rngs, (width, 2 * width), width ** -0.5), (None, None))
    self.w2 = _param(jnp.zeros((2 * width, width), jnp.float32), (None, None))

  def __call__(self, x):
    return x + jax.nn.gelu(self.norm(x) @ self.w1[...]) @ self.w2[...]


class ViewEncoder(nnx.Module):
  """Patch tokens of the rendered views: `[b, V, G, G, C]` → `[b, V·(G/p)², width]`.

  Each token is a linear embedding of one p×p patch of one view (cells × channels), plus a
  learned embedding of its (view, patch) slot; pre-norm MLP blocks then mix the channels of
  each token. Tokens do not attend to each other here: the decoder's attention does that.
  The input is standardised per channel by fixed statistics (`channel_scale`) so that density
  (≈ 1) and colour std (≈ 0.05) start on similar scales.
  """

  def __init__(self, *, num_views: int, grid: int, patch: int, channels: int, width: int,
               depth: int = 2, rngs: nnx.Rngs):
    if grid % patch:
      raise ValueError(f"grid={grid} is not a multiple of patch={patch}")
    self.patch = patch
    self.num_tokens = num_views * (grid // patch) ** 2
    fan_in = patch * patch * channels
    self.embed = _param(_normal(rngs, (fan_in, width), fan_in ** -0.5), (None, None))
    self.position = _param(_normal(rngs, (self.num_tokens, width), _INIT_STD), (None, None))
    self.blocks = nnx.List([_Block(width, rngs=rngs) for _ in range(depth)])
    self.norm = nnx.LayerNorm(width, rngs=rngs)

  def __call__(self, views: jax.Array) -> jax.Array:
    x = patchify(views.astype(jnp.float32), self.patch) @ self.embed[...] + self.position[...]
    for block in self.blocks:
      x = block(x)
    return self.norm(x)


class PointCloudLM(nnx.Module):
  """Encoder + projection + decoder LM (+ a scalar head for the regression baseline).

  Attributes:
    encoder: `ViewEncoder`.
    proj: `[width, embed]` projection into the LM's input space.
    lm: the `CausalLM`; sample with `nnx.split(model.lm)` and `embeddings=`.
    head: `[embed, 1]` + bias, read by `regress` only.
  """

  def __init__(self, lm_config: ModelConfig, *, num_views: int, grid: int, patch: int,
               channels: int, width: int = 64, depth: int = 2, rngs: nnx.Rngs):
    self.encoder = ViewEncoder(num_views=num_views, grid=grid, patch=patch, channels=channels,
                               width=width, depth=depth, rngs=rngs)
    self.proj = _param(_normal(rngs, (width, lm_config.embed_dim), width ** -0.5),
                       (None, axes.EMBED))
    self.lm = CausalLM(lm_config, rngs=rngs)
    self.head = _param(jnp.zeros((lm_config.embed_dim, 1), jnp.float32), (axes.EMBED, None))
    self.head_bias = _param(jnp.full((1,), 0.5, jnp.float32), (None,))

  @property
  def num_visual_tokens(self) -> int:
    return self.encoder.num_tokens

  def visual_embeddings(self, views: jax.Array) -> jax.Array:
    """`[b, V, G, G, C]` → `[b, T_v, embed]` in the LM's dtype."""
    return (self.encoder(views) @ self.proj[...]).astype(self.lm.config.dtype)

  def prompt_embeddings(self, views: jax.Array, text_tokens: jax.Array) -> jax.Array:
    """The multimodal prompt row `[b, T_v + T_t, embed]`: visual tokens, then the text."""
    visual = self.visual_embeddings(views)
    return jnp.concatenate([visual, self.lm.embed_tokens(text_tokens)], axis=1)

  def regress(self, views: jax.Array, text_tokens: jax.Array) -> jax.Array:
    """Scalar score `[b]` from the last prompt position's final hidden state."""
    row = self.prompt_embeddings(views, text_tokens)
    dummy = jnp.zeros(row.shape[:2], jnp.int32)
    _, hidden = self.lm(dummy, embeddings=row, return_hidden=True)
    return (hidden[:, -1].astype(jnp.float32) @ self.head[...])[:, 0] + self.head_bias[...][0]
