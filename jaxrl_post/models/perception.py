"""A small autoregressive dense detector: patch encoder → `CausalLM` with coordinate and size heads.

The architecture of Falcon Perception's chain of perception (arXiv 2603.27365, used by Falcon
Perception-HD, arXiv 2608.18881), reduced to boxes: after the prompt
`[patch_1 … patch_P] <colour> <shape>` the decoder emits an existence token, then per instance
a `<coord>` step and a `<size>` step, then `<end>`. One hidden state h_t drives three heads:

  LM head     π_LM(w_t | h_t)                 over the token vocabulary (the `CausalLM` head)
  coord head  π_coord(x, y | h_t) = π_x(x | h_t)·π_y(y | h_t)   categorical over `coord_bins`
  size head   π_size(w, h | h_t)  = π_w(w | h_t)·π_h(h | h_t)   categorical over `size_bins`

(the factorisation over x/y and w/h is a PROPOSAL; the paper only says "categorical over
discretised bins"). The input embedding of a step is the token's embedding plus, for `<coord>`,
learned embeddings of its x and y bins, and for `<size>` of its w and h bins, so the next step
sees where the last object was and how big.

Shapes: images `float32[b, S, S, C]`; query tokens `int32[b, Q]`; a chain of T actions is five
`int32[b, T]` arrays (token, x, y, w, h; bins are ignored where the token does not use them).
The model knows only the ids of `<coord>` and `<size>` (from its config), not what a task means.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl_post.models.model_config import ModelConfig
from jaxrl_post.models.transformer import CausalLM, KVCache
from jaxrl_post.parallel import axes

_INIT_STD = 0.02


@dataclasses.dataclass(frozen=True)
class PerceptionConfig:
  """Sizes of the detector.

  Attributes:
    lm: the decoder's `ModelConfig` (its `vocab_size` is the token vocabulary).
    image_size: side S of the square input image, in pixels.
    patch_size: side of a square patch; S must be a multiple of it (P = (S / patch)² patches).
    channels: image channels.
    query_len: tokens of the referring query.
    coord_bins: bins per axis of the coordinate head.
    size_bins: bins per side of the size head.
    coord_token, size_token: ids of `<coord>` and `<size>` (whose inputs carry bin embeddings).
    fourier_features: F of the shared coordinate code (0: off; see `PerceptionDetector`).
    pointer_head: add pointer terms to the coordinate logits (localisation by attention over the
      patches; see `PerceptionDetector.heads`). Needs `coord_bins` to be a multiple of the patch
      grid side `image_size / patch_size`.
    conv_stem: add a residual 3×3 convolution over the patch grid to the encoder (each patch
      embedding sees its 8 neighbours, in both directions, before the causal decoder).
  """

  lm: ModelConfig
  image_size: int = 64
  patch_size: int = 8
  channels: int = 3
  query_len: int = 2
  coord_bins: int = 128
  size_bins: int = 32
  coord_token: int = 3
  size_token: int = 4
  fourier_features: int = 0
  pointer_head: bool = False
  conv_stem: bool = False

  def __post_init__(self):
    if self.image_size % self.patch_size:
      raise ValueError(f"image_size {self.image_size} is not a multiple of patch_size "
                       f"{self.patch_size}")
    for name in ("coord_token", "size_token"):
      if not 0 <= getattr(self, name) < self.lm.vocab_size:
        raise ValueError(f"{name}={getattr(self, name)} outside the vocabulary "
                         f"[0, {self.lm.vocab_size})")
    if self.pointer_head and self.coord_bins % self.grid:
      raise ValueError(f"pointer_head needs coord_bins ({self.coord_bins}) to be a multiple of "
                       f"the patch grid side {self.grid}")

  @property
  def grid(self) -> int:
    return self.image_size // self.patch_size

  @property
  def num_patches(self) -> int:
    return (self.image_size // self.patch_size) ** 2

  @property
  def prompt_len(self) -> int:
    return self.num_patches + self.query_len


class HeadLogits(NamedTuple):
  """Logits of the three heads at T positions (float32)."""

  lm: jax.Array  # [b, T, vocab]
  x: jax.Array  # [b, T, coord_bins]
  y: jax.Array  # [b, T, coord_bins]
  w: jax.Array  # [b, T, size_bins]
  h: jax.Array  # [b, T, size_bins]


class PointerMemory(NamedTuple):
  """The pointer head's per-patch terms, computed once per image (`PerceptionDetector.heads`)."""

  keys: jax.Array  # float32[b, P, d]: v_p W_k
  offsets: jax.Array  # float32[b, P, 2R]: v_p W_o (x offsets, then y offsets)


class DetectorCache(NamedTuple):
  """Decoding state: the LM's `KVCache` and, with the pointer head, the patches' pointer terms
  (written by `prefill`, so a decode step does not re-project the patches; None otherwise)."""

  kv: KVCache
  pointer: PointerMemory | None = None


class Chain(NamedTuple):
  """A batch of action chains: the token and its bins per step (`int32[b, T]` each)."""

  tokens: jax.Array
  x: jax.Array
  y: jax.Array
  w: jax.Array
  h: jax.Array


def _param(rngs, shape, logical_axes, dtype, fan_in=None):
  """Normal init in `dtype`: std `_INIT_STD`, or 1/√fan_in when `fan_in` is given."""
  std = _INIT_STD if fan_in is None else fan_in**-0.5
  value = (std * jax.random.normal(rngs.params(), shape, jnp.float32)).astype(dtype)
  return nnx.Param(value, out_sharding=logical_axes, eager_sharding=False)


def fourier_features(u: jax.Array, num_features: int) -> jax.Array:
  """`[..., F]` features [sin 2πfu, cos 2πfu], f = 1…F/2, of normalised coordinates u ∈ [0, 1]."""
  f = jnp.arange(1, num_features // 2 + 1, dtype=jnp.float32)
  angles = 2 * jnp.pi * u[..., None].astype(jnp.float32) * f
  return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)


class PatchEncoder(nnx.Module):
  """Image → `[b, P, d]` patch embeddings: a linear map of each flattened patch, plus learned
  row and column position embeddings, (with `conv_stem`) a residual GELU 3×3 convolution over the
  patch grid, then a GELU MLP with a residual (one non-linearity before the decoder so that
  colour and shape can be separated per patch)."""

  def __init__(self, config: PerceptionConfig, *, rngs: nnx.Rngs):
    c, d = config, config.lm.embed_dim
    dt = c.lm.param_dtype
    self.config = config
    patch_dim = c.patch_size * c.patch_size * c.channels
    grid = c.image_size // c.patch_size
    self.proj = _param(rngs, (patch_dim, d), (None, axes.EMBED), dt, fan_in=patch_dim)
    self.row = _param(rngs, (grid, d), (None, axes.EMBED), dt)
    self.col = _param(rngs, (grid, d), (None, axes.EMBED), dt)
    self.mlp_in = _param(rngs, (d, 2 * d), (axes.EMBED, axes.MLP), dt)
    self.mlp_out = _param(rngs, (2 * d, d), (axes.MLP, axes.EMBED), dt)
    if c.conv_stem:
      self.conv = _param(rngs, (3, 3, d, d), (None, None, None, axes.EMBED), dt, fan_in=9 * d)

  def __call__(self, images: jax.Array) -> jax.Array:
    c = self.config
    b = images.shape[0]
    g, p = c.image_size // c.patch_size, c.patch_size
    if images.shape[1:] != (c.image_size, c.image_size, c.channels):
      raise ValueError(f"images have shape {images.shape}; expected [b, {c.image_size}, "
                       f"{c.image_size}, {c.channels}]")
    # [b, g, p, g, p, C] → [b, g, g, p, p, C] → [b, g·g, p·p·C] (row-major patches).
    patches = images.reshape(b, g, p, g, p, c.channels).transpose(0, 1, 3, 2, 4, 5)
    patches = patches.reshape(b, g * g, p * p * c.channels)
    x = patches @ self.proj[...]
    pos = (self.row[...][:, None, :] + self.col[...][None, :, :]).reshape(g * g, -1)
    x = x + pos[None]
    if c.conv_stem:
      grid = x.reshape(b, g, g, -1)
      conv = jax.lax.conv_general_dilated(grid, self.conv[...].astype(grid.dtype), (1, 1), "SAME",
                                          dimension_numbers=("NHWC", "HWIO", "NHWC"))
      x = x + jax.nn.gelu(conv).reshape(b, g * g, -1)
    return x + jax.nn.gelu(x @ self.mlp_in[...]) @ self.mlp_out[...]


class PerceptionDetector(nnx.Module):
  """Patch encoder + decoder LM + coordinate and size heads (see the module docstring).

  Example:
    >>> from jaxrl_post.models import get_model_config
    >>> cfg = PerceptionConfig(get_model_config("tiny", vocab_size=14), image_size=16)
    >>> model = PerceptionDetector(cfg, rngs=nnx.Rngs(0))
    >>> chain = Chain(*[jnp.zeros((2, 5), jnp.int32)] * 5)
    >>> out = model(jnp.zeros((2, 16, 16, 3)), jnp.zeros((2, 2), jnp.int32), chain)
    >>> out.lm.shape, out.x.shape, out.w.shape
    ((2, 5, 14), (2, 5, 128), (2, 5, 32))
  """

  def __init__(self, config: PerceptionConfig, *, rngs: nnx.Rngs):
    c, d = config, config.lm.embed_dim
    dt = c.lm.param_dtype
    self.config = config
    self.encoder = PatchEncoder(config, rngs=rngs)
    self.lm = CausalLM(config.lm, rngs=rngs)
    self.coord_head = _param(rngs, (d, 2 * c.coord_bins), (axes.EMBED, None), dt)
    self.size_head = _param(rngs, (d, 2 * c.size_bins), (axes.EMBED, None), dt)
    self.x_embed = _param(rngs, (c.coord_bins, d), (None, axes.EMBED), dt)
    self.y_embed = _param(rngs, (c.coord_bins, d), (None, axes.EMBED), dt)
    self.w_embed = _param(rngs, (c.size_bins, d), (None, axes.EMBED), dt)
    self.h_embed = _param(rngs, (c.size_bins, d), (None, axes.EMBED), dt)
    if c.fourier_features:
      f = c.fourier_features
      # One coordinate code for "where in the image" and "where in the chain": patch centres,
      # input coordinate bins and output coordinate bins all go through the same Fourier
      # features and the same learned maps, so that attention can match a patch to the
      # previous instance, and the coordinate head can read a copied patch position, from the
      # first step (with independent tables SFT's coordinate NLL plateaued, see docs).
      self.pos_x = _param(rngs, (f, d), (None, axes.EMBED), dt, fan_in=f)
      self.pos_y = _param(rngs, (f, d), (None, axes.EMBED), dt, fan_in=f)
      self.read_x = _param(rngs, (d, d), (axes.EMBED, None), dt)
      self.read_y = _param(rngs, (d, d), (axes.EMBED, None), dt)
    if c.pointer_head:
      # Pointer: score(t, p) = (h_t W_q)·(v_p W_k)/√d over the patches' final hidden states v_p,
      # plus per-patch offset logits v_p W_ox (x bins inside the patch column), v_p W_oy.
      r = c.coord_bins // c.grid
      self.ptr_q = _param(rngs, (d, d), (axes.EMBED, None), dt, fan_in=d)
      self.ptr_k = _param(rngs, (d, d), (axes.EMBED, None), dt, fan_in=d)
      self.ptr_off = _param(rngs, (d, 2 * r), (axes.EMBED, None), dt)

  def _bin_codes(self) -> tuple[jax.Array, jax.Array]:
    """`[coord_bins, d]` shared-code embeddings of the x and y bins (bin k ↔ u = k / bins)."""
    c = self.config
    feats = fourier_features(jnp.arange(c.coord_bins) / c.coord_bins, c.fourier_features)
    return feats @ self.pos_x[...], feats @ self.pos_y[...]

  def _patch_codes(self) -> jax.Array:
    """`[P, d]` shared-code positions of the patch centres (row-major)."""
    c = self.config
    g = c.image_size // c.patch_size
    feats = fourier_features((jnp.arange(g) + 0.5) / g, c.fourier_features)
    col, row = feats @ self.pos_x[...], feats @ self.pos_y[...]
    return (row[:, None, :] + col[None, :, :]).reshape(g * g, -1)

  # ---- inputs ----

  def encode_prompt(self, images: jax.Array, query_tokens: jax.Array) -> jax.Array:
    """`[b, P + Q, d]`: patch embeddings followed by the query's token embeddings."""
    patches = self.encoder(images.astype(jnp.float32))
    if self.config.fourier_features:
      patches = patches + self._patch_codes()[None]
    patches = patches.astype(self.config.lm.dtype)
    return jnp.concatenate([patches, self.lm.embed_tokens(query_tokens)], axis=1)

  def embed_actions(self, chain: Chain) -> jax.Array:
    """`[b, T, d]` input embeddings of the actions: token (+ bins where the token uses them)."""
    c = self.config
    x = self.lm.embed_tokens(chain.tokens)
    is_coord = (chain.tokens == c.coord_token)[..., None]
    is_size = (chain.tokens == c.size_token)[..., None]
    x_table, y_table = self.x_embed[...], self.y_embed[...]
    if c.fourier_features:
      x_code, y_code = self._bin_codes()
      x_table, y_table = x_table + x_code, y_table + y_code
    coord = (jnp.take(x_table, jnp.clip(chain.x, 0, c.coord_bins - 1), axis=0)
             + jnp.take(y_table, jnp.clip(chain.y, 0, c.coord_bins - 1), axis=0))
    size = (jnp.take(self.w_embed[...], jnp.clip(chain.w, 0, c.size_bins - 1), axis=0)
            + jnp.take(self.h_embed[...], jnp.clip(chain.h, 0, c.size_bins - 1), axis=0))
    return x + jnp.where(is_coord, coord, 0.0) + jnp.where(is_size, size, 0.0)

  def pointer_logits(self, hidden: jax.Array, patches: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`[b, T, coord_bins]` pointer terms of the x and y logits.

    With s_{t,p} = (h_t W_q)·(v_p W_k)/√d the score of patch p = (row i, column j) and
    o^x_{p,u}, o^y_{p,u} its offset logits (u = bin inside the patch, R = coord_bins / grid bins
    per patch side), the pointer term of x bin k = R·j + u is the log-marginal
    log Σ_i exp(s_{t,(i,j)} + o^x_{(i,j),u}) (y alike, summing over columns j). It is added to
    the plain linear logits, so π_x, π_y stay categorical over `coord_bins`.
    """
    return self._pointer_terms(hidden, self.pointer_memory(patches))

  def pointer_memory(self, patches: jax.Array) -> PointerMemory:
    """Keys and offset logits of the patches' final hidden states `[b, P, d]`."""
    patches = patches.astype(jnp.float32)
    return PointerMemory(
      keys=jnp.einsum("bpd,de->bpe", patches, self.ptr_k[...].astype(jnp.float32)),
      offsets=jnp.einsum("bpd,dk->bpk", patches, self.ptr_off[...].astype(jnp.float32)))

  def _pointer_terms(self, hidden: jax.Array, memory: PointerMemory):
    c = self.config
    g, r = c.grid, c.coord_bins // c.grid
    q = jnp.einsum("btd,de->bte", hidden.astype(jnp.float32), self.ptr_q[...].astype(jnp.float32))
    score = jnp.einsum("bte,bpe->btp", q, memory.keys) / jnp.sqrt(jnp.float32(q.shape[-1]))
    off = memory.offsets
    b, t = score.shape[:2]
    score = score.reshape(b, t, g, g, 1)  # [b, T, row i, col j, 1]
    off_x = off[..., :r].reshape(b, 1, g, g, r)
    off_y = off[..., r:].reshape(b, 1, g, g, r)
    x = jax.nn.logsumexp(score + off_x, axis=2).reshape(b, t, g * r)  # Over rows: [b,T,j,u].
    y = jax.nn.logsumexp(score + off_y, axis=3).reshape(b, t, g * r)  # Over columns: [b,T,i,u].
    return x, y

  def heads(self, lm_logits: jax.Array, hidden: jax.Array, patches: jax.Array | None = None, *,
            pointer: PointerMemory | None = None) -> HeadLogits:
    """Splits the coordinate and size heads' logits off the hidden states. The pointer head
    needs `patches` (the patch positions' final hidden states) or their precomputed `pointer`
    memory (cached decoding)."""
    c = self.config
    coord = jnp.einsum("btd,dk->btk", hidden, self.coord_head[...],
                       preferred_element_type=jnp.float32)
    size = jnp.einsum("btd,dk->btk", hidden, self.size_head[...],
                      preferred_element_type=jnp.float32)
    if c.fourier_features:
      # Read-out through the shared code: logit_k += (W h) · code_k.
      x_code, y_code = self._bin_codes()
      coord = coord + jnp.concatenate([
        jnp.einsum("btd,de,ke->btk", hidden, self.read_x[...], x_code),
        jnp.einsum("btd,de,ke->btk", hidden, self.read_y[...], y_code)], axis=-1)
    if c.pointer_head:
      if pointer is None:
        if patches is None:
          raise ValueError("pointer_head needs the patch hidden states")
        pointer = self.pointer_memory(patches)
      px, py = self._pointer_terms(hidden, pointer)
      coord = coord + jnp.concatenate([px, py], axis=-1)
    return HeadLogits(lm=lm_logits, x=coord[..., :c.coord_bins], y=coord[..., c.coord_bins:],
                      w=size[..., :c.size_bins], h=size[..., c.size_bins:])

  # ---- teacher forcing ----

  def __call__(self, images: jax.Array, query_tokens: jax.Array, chain: Chain) -> HeadLogits:
    """Logits for every action of `chain` given the prompt and the actions before it.

    The decoder input is `[prompt (P+Q); actions 0..T−2]`; the hidden state at the prompt's last
    position predicts action 0 (the existence token), the one at action t−1 predicts action t.

    Returns:
      `HeadLogits` with T positions, aligned with `chain`.
    """
    prompt = self.encode_prompt(images, query_tokens)
    inputs = jnp.concatenate([prompt, self.embed_actions(chain)[:, :-1]], axis=1)
    dummy = jnp.zeros(inputs.shape[:2], jnp.int32)
    logits, hidden = self.lm(dummy, embeddings=inputs, return_hidden=True)
    start = prompt.shape[1] - 1
    patches = hidden[:, :self.config.num_patches]
    return self.heads(logits[:, start:], hidden[:, start:], patches)

  # ---- cached decoding ----

  def init_cache(self, batch: int, max_actions: int) -> DetectorCache:
    return DetectorCache(self.lm.init_cache(batch, self.config.prompt_len + max_actions))

  def prefill(self, images: jax.Array, query_tokens: jax.Array,
              cache: DetectorCache) -> tuple[HeadLogits, DetectorCache]:
    """Writes the prompt into `cache`; returns the heads at its last position (`[b, 1, …]`)."""
    prompt = self.encode_prompt(images, query_tokens)
    b, t = prompt.shape[:2]
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    logits, kv, hidden = self.lm(jnp.zeros((b, t), jnp.int32), embeddings=prompt,
                                 positions=positions, cache=cache.kv, return_hidden=True)
    pointer = None
    if self.config.pointer_head:
      pointer = self.pointer_memory(hidden[:, :self.config.num_patches])
    return (self.heads(logits[:, -1:], hidden[:, -1:], pointer=pointer),
            DetectorCache(kv, pointer))

  def decode_step(self, action: Chain,
                  cache: DetectorCache) -> tuple[HeadLogits, DetectorCache]:
    """Feeds one action per row (`[b, 1]` arrays) at slot `cache.kv.index`; heads `[b, 1, …]`."""
    x = self.embed_actions(action)
    b = x.shape[0]
    positions = jnp.full((b, 1), cache.kv.index, jnp.int32)
    logits, kv, hidden = self.lm(jnp.zeros((b, 1), jnp.int32), embeddings=x,
                                 positions=positions, cache=cache.kv, return_hidden=True)
    return self.heads(logits, hidden, pointer=cache.pointer), DetectorCache(kv, cache.pointer)
