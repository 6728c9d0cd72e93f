"""Decoder-only transformer LM in Flax NNX (Llama / Qwen2 / Qwen3 / SmolLM3).

Parameters carry logical axis names (`jaxrl_post.parallel.axes`) in their
`out_sharding` metadata; activations are constrained by name, which is a no-op
unless the caller opens `parallel.axis_rules(mesh, rules)`.

Layout choices (measured on XLA:CPU, see docs/benchmarks.md):
  * q/k/v kernels are `[embed, heads, head_dim]`, so projections are single
    dot_generals and checkpoints map onto them with a reshape.
  * The KV cache is one key and one value buffer per layer, written in place
    with `dynamic_update_slice`. Keys are stored `[batch, kv_heads, head_dim,
    length]` and values `[batch, kv_heads, length, head_dim]`: both attention
    contractions then run over a non-minor axis with the minor axis contiguous
    (q·K is a multiply-add along `length`, p·V along `head_dim`), which made a
    decode step's attention 2× faster than the `[.., length, head_dim]` key
    layout and 5× faster than `jax.nn.dot_product_attention` on XLA:CPU.
  * Layers are unrolled Python loops by default, which keeps per-layer cache
    buffers separate during decoding (the faster decode on CPU). With
    `config.scan_layers` the layers are one `DecoderLayer` whose parameters
    carry a leading `layers` axis, run under `jax.lax.scan`, with the cache
    stacked `[layers, ...]` in the scan's carry (each layer writes its new
    slots in place): the program holds one layer, so compile time does not
    grow with depth (real presets).
  * `config.remat_policy` wraps each layer call in `jax.checkpoint` in both
    paths (`REMAT_POLICIES`).
  * Every projection adds its low-rank adapters when `models.lora.add_lora`
    attached some (`with_lora`: x·K + s·(x·a)·b, unmerged); without adapters
    the model runs exactly as before.
"""

from __future__ import annotations

import functools

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_post.models import moe
from jaxrl_post.models.dense import dense
from jaxrl_post.models.lora import with_lora
from jaxrl_post.models.model_config import ModelConfig, rope_inverse_frequencies
from jaxrl_post.parallel import axes
from jaxrl_post.parallel.axes import constrain

# Finite "minus infinity": a row with no visible key gets a uniform softmax
# instead of NaN (left-padding rows are later masked out anyway).
_MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)
_INIT_STD = 0.02  # HF `initializer_range` for all four families.


def _param(value: jax.Array, logical_axes: tuple[str, ...]) -> nnx.Param:
  # eager_sharding=False: the names are metadata for `parallel`, so a model can
  # be built without a mesh (tests, CPU) and placed later.
  return nnx.Param(value, out_sharding=logical_axes, eager_sharding=False)


def _normal(rngs: nnx.Rngs, shape: tuple[int, ...], dtype) -> jax.Array:
  return (_INIT_STD * jax.random.normal(rngs.params(), shape, jnp.float32)).astype(dtype)


@flax.struct.dataclass
class KVCache:
  """Per-layer key/value buffers for incremental decoding.

  Attributes:
    k: one `[batch, kv_heads, head_dim, max_len]` array per layer (keys stored
      transposed; see the module docstring), or, for a model with
      `scan_layers`, one stacked `[layers, batch, kv_heads, head_dim, max_len]`
      array (`stacked`).
    v: one `[batch, kv_heads, max_len, head_dim]` array per layer, or one
      `[layers, batch, kv_heads, max_len, head_dim]` array when stacked.
    mask: `bool[batch, max_len]`, True where a slot holds a real token (left
      padding and unwritten slots are False).
    index: `int32[]`, the next slot to write. All rows write the same slot;
      per-row positions come from the caller, which is what makes left-padded
      batches work. Or `int32[batch]`, each row's own next slot: rows then
      advance independently (continuous batching refills a finished row's
      slots with a new prompt while the others keep decoding).
    prefix_k, prefix_v, prefix_mask: optional prompt slots shared by groups of
      rows (n samples per prompt): per layer `[groups, kv_heads, head_dim,
      prefix_len]` and `[groups, kv_heads, prefix_len, head_dim]` (stacked
      like `k` / `v` with a leading `layers` axis when `stacked`), and
      `bool[groups, prefix_len]`; rows g·n … g·n + n − 1 attend to group g's
      prefix before their own slots (`cascade_attention`). Empty without.
  """

  k: tuple[jax.Array, ...]
  v: tuple[jax.Array, ...]
  mask: jax.Array
  index: jax.Array
  prefix_k: tuple[jax.Array, ...] = ()
  prefix_v: tuple[jax.Array, ...] = ()
  prefix_mask: jax.Array | None = None

  # Logical axis names of one layer's buffers (sharding rules map them to mesh
  # axes); a stacked cache has `axes.LAYERS` in front (`k_axes` / `v_axes`).
  K_AXES = (axes.BATCH, axes.KV_HEADS, axes.HEAD_DIM, axes.CACHE_LENGTH)
  V_AXES = (axes.BATCH, axes.KV_HEADS, axes.CACHE_LENGTH, axes.HEAD_DIM)

  @property
  def max_len(self) -> int:
    return self.mask.shape[1]

  @property
  def stacked(self) -> bool:
    """True when `k` / `v` are single `[layers, ...]` arrays (a `scan_layers` model)."""
    return not isinstance(self.k, (tuple, list))

  @property
  def k_axes(self) -> tuple[str, ...]:
    """Logical axes of each array in `k` (and `prefix_k`)."""
    return ((axes.LAYERS,) if self.stacked else ()) + self.K_AXES

  @property
  def v_axes(self) -> tuple[str, ...]:
    """Logical axes of each array in `v` (and `prefix_v`)."""
    return ((axes.LAYERS,) if self.stacked else ()) + self.V_AXES

  @property
  def row_axis(self) -> int:
    """The axis of `k` / `v` arrays that holds the rows (the `batch` axis)."""
    return 1 if self.stacked else 0

  def shardings(self, mesh, rules=axes.DEFAULT_RULES) -> KVCache:
    """`NamedSharding`s of every buffer (a `KVCache` of shardings), from the logical axes.

    Works on a cache of arrays or of `jax.ShapeDtypeStruct`s (`jax.eval_shape`).
    """
    def named(names):
      return lambda x: axes.logical_sharding(names, mesh, rules, x.shape)

    k, v = named(self.k_axes), named(self.v_axes)
    return self.replace(
      k=jax.tree.map(k, self.k), v=jax.tree.map(v, self.v),
      prefix_k=jax.tree.map(k, self.prefix_k), prefix_v=jax.tree.map(v, self.prefix_v),
      mask=named((axes.BATCH, axes.CACHE_LENGTH))(self.mask),
      index=named((axes.BATCH,) if len(jnp.shape(self.index)) else ())(self.index),
      prefix_mask=jax.tree.map(named((axes.BATCH, axes.CACHE_LENGTH)), self.prefix_mask))


def update_slots(buffer: jax.Array, update: jax.Array, index: jax.Array, *, slot_axis: int,
                 row_axis: int = 0, start: tuple | None = None) -> jax.Array:
  """`buffer` with `update` written from slot `index` on along `slot_axis`.

  `index` is `int32[]` (every row writes the same slots: one
  `dynamic_update_slice`) or `int32[batch]` (row r writes from `index[r]`:
  the rows of `buffer` and `update` lie on `row_axis`, and the update is a
  scatter, still in place). `start`: the other axes' offsets (default 0).
  Out-of-range slots are clamped, as `dynamic_update_slice` does.
  """
  start = [0] * buffer.ndim if start is None else list(start)
  if jnp.ndim(index) == 0:
    start[slot_axis] = index
    return jax.lax.dynamic_update_slice(buffer, update, start)
  del start[row_axis]
  slot = slot_axis - (slot_axis > row_axis)

  def one_row(buffer, update, i):
    return jax.lax.dynamic_update_slice(buffer, update, start[:slot] + [i] + start[slot + 1:])

  return jax.vmap(one_row, in_axes=(row_axis, row_axis, 0), out_axes=row_axis)(
    buffer, update, index)


def slice_slots(buffer: jax.Array, index: jax.Array, size: int, *, slot_axis: int,
                row_axis: int = 0) -> jax.Array:
  """The `size` slots from `index` on along `slot_axis`; `index` as in `update_slots`."""
  if jnp.ndim(index) == 0:
    return jax.lax.dynamic_slice_in_dim(buffer, index, size, axis=slot_axis)
  slot = slot_axis - (slot_axis > row_axis)
  return jax.vmap(lambda b, i: jax.lax.dynamic_slice_in_dim(b, i, size, axis=slot),
                  in_axes=(row_axis, 0), out_axes=row_axis)(buffer, index)


class RMSNorm(nnx.Module):
  """y = x / sqrt(mean(x²) + ε) · scale, normalised in float32."""

  def __init__(self, dim: int, *, eps: float, param_dtype, logical_axis: str = axes.NORM):
    self.scale = _param(jnp.ones((dim,), param_dtype), (logical_axis,))
    self.eps = eps

  def __call__(self, x: jax.Array) -> jax.Array:
    dtype = x.dtype
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return self.scale[...].astype(dtype) * y.astype(dtype)


def apply_rope(x: jax.Array, sin: jax.Array, cos: jax.Array) -> jax.Array:
  """Rotary embedding, half-split convention of `transformers` (rotate_half).

  Args:
    x: `[batch, time, heads, head_dim]`.
    sin, cos: `[batch, time, head_dim // 2]` float32.
  """
  half = x.shape[-1] // 2
  x1, x2 = x[..., :half], x[..., half:]
  sin = sin[:, :, None, :].astype(x.dtype)
  cos = cos[:, :, None, :].astype(x.dtype)
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def cached_attention(q, k_t, v, mask, scale):
  """Grouped-query attention over a KV cache whose keys are stored transposed.

  Args:
    q: `[batch, time, heads, head_dim]`.
    k_t: `[batch, kv_heads, head_dim, length]` (the cache's key layout).
    v: `[batch, kv_heads, length, head_dim]`.
    mask: `bool[batch, time, length]`.
    scale: logit scale, head_dim^-1/2.

  Returns:
    `[batch, time, heads, head_dim]`. Query head n uses kv head n // groups,
    the order of `transformers`' `repeat_kv`.
  """
  b, t, n, h = q.shape
  kv, s = k_t.shape[1], k_t.shape[3]
  g = n // kv
  # Query groups and time fold into rows, [b, kv, g·t, h], so that both products are
  # `[rows, h] × [h, s]` and `[rows, s] × [s, h]` per (batch, kv head): XLA:CPU then
  # streams the cache once per step. (An einsum keeping `t` as its own axis was
  # lowered with the operands swapped and ran 5–9× slower at t = 1.)
  q = q.reshape(b, t, kv, g, h).transpose(0, 2, 3, 1, 4).reshape(b, kv, g * t, h)
  logits = jnp.einsum("bkqh,bkhs->bkqs", q, k_t, preferred_element_type=jnp.float32) * scale
  logits = jnp.where(mask[:, None, None], logits.reshape(b, kv, g, t, s), _MASK_VALUE)
  probs = jax.nn.softmax(logits, axis=-1).astype(v.dtype).reshape(b, kv, g * t, s)
  out = jnp.einsum("bkqs,bksh->bkqh", probs, v)
  return out.reshape(b, kv, g, t, h).transpose(0, 3, 1, 2, 4).reshape(b, t, n, h)


def cascade_attention(q, prefix_k_t, prefix_v, prefix_mask, k_t, v, mask, scale):
  """One decode step of attention over a prompt cache shared by groups of rows.

  With n samples per prompt, rows g·n … g·n + n − 1 share their prompt's keys
  and values. Keeping those once per group (`prefix_*`) and only the
  generated tokens per row (`k_t`, `v`) reads each prompt slot once per group
  instead of once per row: the "cascade" / shared-prefix attention of
  Hydragen (arXiv:2402.05099) and FlashInfer. The softmax runs over prefix and
  row slots together, so the result equals attention over the concatenation
  `[prefix, row]` up to float rounding.

  Args:
    q: `[batch, 1, heads, head_dim]`, batch = groups · n.
    prefix_k_t: `[groups, kv_heads, head_dim, prefix_len]`; prefix_v
      `[groups, kv_heads, prefix_len, head_dim]`; prefix_mask
      `bool[groups, prefix_len]`.
    k_t, v, mask: the rows' own slots, as in `cached_attention` (`mask`
      `bool[batch, 1, length]`).
    scale: logit scale, head_dim^-1/2.

  Returns:
    `[batch, 1, heads, head_dim]`.
  """
  b, t, n, h = q.shape
  groups, kv, _, p = prefix_k_t.shape
  r, g = b // groups, n // kv
  if t != 1 or groups * r != b:
    raise ValueError(f"cascade attention decodes one token for groups of rows; got q {q.shape} "
                     f"and a prefix for {groups} groups")
  # Prefix: the group's rows and query heads fold into one [r·g, h] block per
  # (group, kv head), so the prefix is streamed once per group.
  q_groups = q.reshape(groups, r, kv, g, h).transpose(0, 2, 1, 3, 4).reshape(groups, kv, r * g, h)
  prefix_logits = jnp.einsum("Gkqh,Gkhs->Gkqs", q_groups, prefix_k_t,
                             preferred_element_type=jnp.float32) * scale
  prefix_logits = jnp.where(prefix_mask[:, None, None], prefix_logits, _MASK_VALUE)
  prefix_logits = prefix_logits.reshape(groups, kv, r, g, p).transpose(0, 2, 1, 3, 4)
  q_rows = q.reshape(b, kv, g, h)
  row_logits = jnp.einsum("bkqh,bkhs->bkqs", q_rows, k_t, preferred_element_type=jnp.float32)
  row_logits = jnp.where(mask[:, :, None], row_logits * scale, _MASK_VALUE)
  probs = jax.nn.softmax(jnp.concatenate(
    [prefix_logits.reshape(b, kv, g, p), row_logits], axis=-1), axis=-1)
  prefix_probs = probs[..., :p].reshape(groups, r, kv, g, p).transpose(0, 2, 1, 3, 4)
  prefix_out = jnp.einsum("Gkqs,Gksh->Gkqh", prefix_probs.reshape(groups, kv, r * g, p)
                          .astype(prefix_v.dtype), prefix_v)
  prefix_out = prefix_out.reshape(groups, kv, r, g, h).transpose(0, 2, 1, 3, 4).reshape(b, kv, g, h)
  out = prefix_out + jnp.einsum("bkqs,bksh->bkqh", probs[..., p:].astype(v.dtype), v)
  return out.reshape(b, 1, n, h)


def plain_attention(q, k, v, mask, scale):
  """Grouped-query attention with explicit matmuls (`attention_impl="plain"`).

  Args:
    q: `[batch, time, heads, head_dim]`.
    k, v: `[batch, kv_heads, length, head_dim]`.
    mask: `bool[batch, time, length]`.
    scale: logit scale, head_dim^-1/2.

  Returns:
    `[batch, time, heads, head_dim]`. Query head n uses kv head n // groups,
    the order of `transformers`' `repeat_kv`.
  """
  # XLA folds the swap into the dot's dimension numbers.
  return cached_attention(q, k.swapaxes(2, 3), v, mask, scale)


def library_attention(q, k, v, mask, scale, implementation=None):
  """`jax.nn.dot_product_attention` on `implementation` ("xla" or "cudnn")."""
  return jax.nn.dot_product_attention(
    q, k.swapaxes(1, 2), v.swapaxes(1, 2), mask=mask[:, None], scale=scale,
    implementation=implementation)


# Splash attention (JAX's Pallas TPU flash-attention kernel) tiles q and kv in
# blocks of this many positions (its lane width); it takes sequence lengths in
# multiples of it, and `attention_kernel` picks it for head dims up to 256 in
# multiples of 64 (the Llama / Qwen / SmolLM sizes).
SPLASH_BLOCK = 128


@functools.lru_cache(maxsize=64)
def _splash_kernel(length: int, groups: int, interpret: bool):
  """The MQA splash kernel for `groups` query heads over one kv head, causal
  over `length` positions (the mask's block structure is built once per shape
  in numpy, hence the cache)."""
  from jax.experimental.pallas.ops.tpu.splash_attention import (
    splash_attention_kernel as splash,
  )
  from jax.experimental.pallas.ops.tpu.splash_attention import (
    splash_attention_mask as splash_mask,
  )

  mask = splash_mask.MultiHeadMask([splash_mask.CausalMask((length, length))] * groups)
  blocks = splash.BlockSizes(
    block_q=SPLASH_BLOCK, block_kv=SPLASH_BLOCK, block_kv_compute=SPLASH_BLOCK,
    block_q_dkv=SPLASH_BLOCK, block_kv_dkv=SPLASH_BLOCK, block_kv_dkv_compute=SPLASH_BLOCK,
    block_q_dq=SPLASH_BLOCK, block_kv_dq=SPLASH_BLOCK)
  # Built eagerly even when first called inside a trace: the cached kernel's
  # mask-info arrays must be constants, not one trace's tracers.
  with jax.ensure_compile_time_eval():
    return splash.make_splash_mqa(mask, block_sizes=blocks, head_shards=1, q_seq_shards=1,
                                  mask_value=_MASK_VALUE, interpret=interpret)


def splash_attention(q, k, v, key_mask, scale, interpret=False):
  """Causal grouped-query self-attention with the Pallas splash kernel
  (`attention_impl="splash"`, TPU).

  Args:
    q: `[batch, time, heads, head_dim]`.
    k, v: `[batch, kv_heads, time, head_dim]` (self-attention: as many keys as
      queries, `time` a multiple of `SPLASH_BLOCK`).
    key_mask: `bool[batch, time]`, True on real tokens. The kernel's mask is
      causal ∧ same segment, with padding in segment 0 and real tokens in
      segment 1: a real query sees exactly the real keys at or before it (what
      `plain_attention` does with `key_mask[:, None, :] & causal`); a padding
      query sees the padding keys at or before it, itself included, so its
      output (which callers ignore) stays finite.
    scale: logit scale, applied to q before the kernel.
    interpret: run the kernel in Pallas interpret mode (any backend; slow:
      tests on CPU).

  Returns:
    `[batch, time, heads, head_dim]` in q's dtype. Query head n uses kv head
    n // groups, as in `plain_attention`.
  """
  from jax.experimental.pallas.ops.tpu.splash_attention import (
    splash_attention_kernel as splash,
  )

  b, t, n, h = q.shape
  kv, s = k.shape[1], k.shape[2]
  if s != t or t % SPLASH_BLOCK:
    raise ValueError(f"splash attention needs self-attention over a multiple of {SPLASH_BLOCK} "
                     f"positions; got {t} queries and {s} keys")
  g = n // kv
  kernel = _splash_kernel(t, g, bool(interpret))
  q = (q * jnp.asarray(scale, q.dtype)).reshape(b, t, kv, g, h).transpose(0, 2, 3, 1, 4)
  segments = key_mask.astype(jnp.int32)

  def row(q, k, v, segments):  # q [kv, g, t, h], k / v [kv, t, h]
    ids = splash.SegmentIds(q=segments, kv=segments)
    return jax.vmap(lambda q, k, v: kernel(q, k, v, segment_ids=ids))(q, k, v)

  out = jax.vmap(row)(q, k.astype(q.dtype), v.astype(q.dtype), segments)  # [b, kv, g, t, h]
  return out.transpose(0, 3, 1, 2, 4).reshape(b, t, n, h)


# cuDNN's fused attention (flash attention with a dense mask, as JAX calls it)
# takes 16-bit inputs and head dims up to 128 in multiples of 8.
_CUDNN_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def splash_applies(*, head_dim: int, q_len: int | None, kv_len: int | None,
                   cached: bool) -> bool:
  """Whether `splash_attention` takes this call: causal self-attention with no
  KV cache (t == s), a length in multiples of `SPLASH_BLOCK` and a head_dim up
  to 256 in multiples of 64."""
  return (not cached and q_len is not None and q_len == kv_len and q_len % SPLASH_BLOCK == 0
          and head_dim % 64 == 0 and head_dim <= 256)


def attention_kernel(attention_impl: str, *, platform: str, dtype, head_dim: int,
                     q_len: int | None = None, kv_len: int | None = None,
                     cached: bool = False) -> str:
  """The kernel that `attention_impl` runs on `platform`: "xla", "cudnn",
  "splash" or "plain".

  "auto" picks cuDNN's fused attention on a GPU when it applies (bf16 / fp16
  compute, head_dim ≤ 128 and a multiple of 8): it never materialises the
  `[batch, heads, time, time]` scores, which XLA's lowering does (1 GB per
  layer for 16 × 1024 tokens and 16 heads in float32). Elsewhere, and on GPU
  in float32, "auto" is XLA's lowering. (`jax.nn.dot_product_attention` with
  no implementation named also means XLA's lowering today, so a default that
  names none never reaches cuDNN.)

  On a TPU, the Pallas splash kernel (`splash_attention`, flash attention) is
  opt-in with "splash" for now, not picked by "auto": it has run only in
  interpret mode on CPU, and as a Pallas call GSPMD cannot partition it, so a
  batch- or head-sharded mesh needs a `shard_map` around it, which is not
  written yet. It applies where `splash_applies` says (no-cache causal
  self-attention of `q_len` == `kv_len` positions, a multiple of
  `SPLASH_BLOCK`; head_dim ≤ 256 in multiples of 64); a named "splash" on a
  call it does not apply to (a prefill into the KV cache, a length off the
  block size) falls back to "xla". Other named implementations are taken as
  they are.

  Example:
    >>> attention_kernel("auto", platform="gpu", dtype=jnp.bfloat16, head_dim=128)
    'cudnn'
    >>> attention_kernel("auto", platform="cpu", dtype=jnp.bfloat16, head_dim=128)
    'xla'
    >>> attention_kernel("splash", platform="tpu", dtype=jnp.bfloat16, head_dim=128,
    ...                  q_len=1024, kv_len=1024)
    'splash'
  """
  splash_ok = splash_applies(head_dim=head_dim, q_len=q_len, kv_len=kv_len, cached=cached)
  if attention_impl == "splash":
    return "splash" if splash_ok else "xla"
  if attention_impl != "auto":
    return attention_impl
  fits = jnp.dtype(dtype) in _CUDNN_DTYPES and head_dim <= 128 and head_dim % 8 == 0
  return "cudnn" if platform == "gpu" and fits else "xla"


class Attention(nnx.Module):
  """Grouped-query self-attention with optional QK-norm, biases and RoPE.

  `layer` is the block's index (it decides RoPE vs NoPE); None for the one
  stacked block of a `scan_layers` model, whose caller passes `use_rope`.
  """

  def __init__(self, config: ModelConfig, layer: int | None, *, rngs: nnx.Rngs):
    c = config
    d, n, k, h, pdt = c.embed_dim, c.num_heads, c.num_kv_heads, c.head_dim, c.param_dtype
    self.config = c
    self.use_rope = None if layer is None else c.uses_rope(layer)
    self.q_proj = _param(_normal(rngs, (d, n, h), pdt), (axes.EMBED, axes.HEADS, axes.HEAD_DIM))
    self.k_proj = _param(_normal(rngs, (d, k, h), pdt), (axes.EMBED, axes.KV_HEADS, axes.HEAD_DIM))
    self.v_proj = _param(_normal(rngs, (d, k, h), pdt), (axes.EMBED, axes.KV_HEADS, axes.HEAD_DIM))
    self.o_proj = _param(_normal(rngs, (n, h, d), pdt), (axes.HEADS, axes.HEAD_DIM, axes.EMBED))
    if c.qkv_bias:
      self.q_bias = _param(jnp.zeros((n, h), pdt), (axes.HEADS, axes.HEAD_DIM))
      self.k_bias = _param(jnp.zeros((k, h), pdt), (axes.KV_HEADS, axes.HEAD_DIM))
      self.v_bias = _param(jnp.zeros((k, h), pdt), (axes.KV_HEADS, axes.HEAD_DIM))
    else:
      self.q_bias = self.k_bias = self.v_bias = None
    self.o_bias = _param(jnp.zeros((d,), pdt), (axes.EMBED,)) if c.o_bias else None
    if c.qk_norm:
      self.q_norm = RMSNorm(h, eps=c.rms_norm_eps, param_dtype=pdt, logical_axis=axes.HEAD_DIM)
      self.k_norm = RMSNorm(h, eps=c.rms_norm_eps, param_dtype=pdt, logical_axis=axes.HEAD_DIM)
    else:
      self.q_norm = self.k_norm = None

  def _project(self, x, name, bias):
    """x `[b, t, d]` through kernel `name` (`[d, heads, head_dim]`), its adapters if any, bias."""
    y = jnp.einsum("btd,dnh->btnh", x, getattr(self, name)[...].astype(x.dtype))
    y = with_lora(self, name, x, y)
    return y if bias is None else y + bias[...].astype(x.dtype)

  def _attend(self, q, k, v, mask, scale, cached=False):
    """`attention_impl`'s kernel; k, v `[b, kv, s, h]`; `cached`: k / v are the
    KV cache's buffers (a prefill), not this call's own keys."""
    c = self.config
    # The default backend decides: it is where a jitted call runs unless told otherwise.
    platform = jax.default_backend()
    impl = attention_kernel(c.attention_impl, platform=platform, dtype=q.dtype,
                            head_dim=c.head_dim, q_len=q.shape[1], kv_len=k.shape[2],
                            cached=cached)
    if impl == "plain":
      return plain_attention(q, k, v, mask, scale)
    if impl == "splash":
      # Splash is only taken without a cache, where `mask` is
      # `attention_mask[:, None, :] & causal` (`CausalLM.__call__`): its last
      # query row is then the key-valid mask itself, whatever the padding.
      # Off a TPU the kernel runs in interpret mode (tests).
      return splash_attention(q, k, v, mask[:, -1, :], scale, interpret=platform != "tpu")
    return library_attention(q, k, v, mask, scale, implementation=impl)

  def __call__(self, x, *, sin, cos, mask, cache_kv=None, cache_index=None, prefix=None,
               use_rope=None):
    """Args: x `[b, t, d]`; sin/cos `[b, t, h/2]`; mask `bool[b, t, s]`;
    cache_kv: optional `(k, v)` cache buffers (`KVCache` layouts) written at
    `cache_index` (`int32[]`, or `int32[b]` per row); the queries then attend
    over the whole buffer, with `cached_attention` when decoding one token
    (whatever `attention_impl` says: it is the fast path on CPU and
    bandwidth-bound on GPU);
    prefix: optional `(k, v, mask)` prompt slots shared by groups of rows
    (`KVCache.prefix_*`), attended first (`cascade_attention`, t = 1 only);
    use_rope: overrides the layer's own RoPE switch; a Python bool, or a
    `bool[]` array (a scanned layer's flag), which selects between the rotated
    and the plain q/k with `jnp.where` (both are computed: a NoPE layer in a
    scan shares its program with RoPE layers).
    Returns `(out [b, t, d], (k, v) or None)`."""
    c = self.config
    q = self._project(x, "q_proj", self.q_bias)
    k = self._project(x, "k_proj", self.k_bias)
    v = self._project(x, "v_proj", self.v_bias)
    if self.q_norm is not None:
      q, k = self.q_norm(q), self.k_norm(k)
    use_rope = self.use_rope if use_rope is None else use_rope
    if use_rope is None:
      raise ValueError("a stacked (scan_layers) attention block needs use_rope at call time")
    if isinstance(use_rope, (bool, np.bool_)):
      if use_rope:
        q, k = apply_rope(q, sin, cos), apply_rope(k, sin, cos)
    else:
      q = jnp.where(use_rope, apply_rope(q, sin, cos), q)
      k = jnp.where(use_rope, apply_rope(k, sin, cos), k)
    q = constrain(q, (axes.BATCH, axes.LENGTH, axes.HEADS, axes.HEAD_DIM))
    scale = c.head_dim**-0.5
    if cache_kv is not None:
      # Decoding or prefilling into the cache: keys go in as [b, kv, h, t] at
      # slot `cache_index`, values as [b, kv, t, h].
      cache_k, cache_v = cache_kv
      k = update_slots(cache_k, k.transpose(0, 2, 3, 1).astype(cache_k.dtype), cache_index,
                       slot_axis=3)
      v = update_slots(cache_v, v.transpose(0, 2, 1, 3).astype(cache_v.dtype), cache_index,
                       slot_axis=2)
      k, v = constrain(k, KVCache.K_AXES), constrain(v, KVCache.V_AXES)
      new_kv = (k, v)
      k, v = k.astype(x.dtype), v.astype(x.dtype)
      if prefix is not None:  # One decode step of rows that share their prompt's slots.
        prefix_k, prefix_v, prefix_mask = prefix
        out = cascade_attention(q, prefix_k.astype(x.dtype), prefix_v.astype(x.dtype),
                                prefix_mask, k, v, mask, scale)
      elif x.shape[1] == 1:  # One decode step: the transposed-key fast path.
        out = cached_attention(q, k, v, mask, scale)
      else:  # Prefill: the configured kernel (flash attention on GPU) on [b, kv, s, h] keys.
        out = self._attend(q, k.swapaxes(2, 3), v, mask, scale, cached=True)
    else:
      new_kv = None
      out = self._attend(q, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), mask, scale)
    out = with_lora(self, "o_proj", out,
                    jnp.einsum("btnh,nhd->btd", out, self.o_proj[...].astype(x.dtype)))
    if self.o_bias is not None:
      out = out + self.o_bias[...].astype(x.dtype)
    return out, new_kv


class MLP(nnx.Module):
  """SwiGLU: down(silu(gate(x)) · up(x))."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    d, f, pdt = config.embed_dim, config.mlp_dim, config.param_dtype
    self.gate_proj = _param(_normal(rngs, (d, f), pdt), (axes.EMBED, axes.MLP))
    self.up_proj = _param(_normal(rngs, (d, f), pdt), (axes.EMBED, axes.MLP))
    self.down_proj = _param(_normal(rngs, (f, d), pdt), (axes.MLP, axes.EMBED))
    if config.mlp_bias:
      self.gate_bias = _param(jnp.zeros((f,), pdt), (axes.MLP,))
      self.up_bias = _param(jnp.zeros((f,), pdt), (axes.MLP,))
      self.down_bias = _param(jnp.zeros((d,), pdt), (axes.EMBED,))
    else:
      self.gate_bias = self.up_bias = self.down_bias = None

  def _dense(self, x, name, bias):
    """x through kernel `name` (`[d_in, d_out]`), its adapters if any, and the bias."""
    y = with_lora(self, name, x, dense(x, getattr(self, name)[...].astype(x.dtype)))
    return y if bias is None else y + bias[...].astype(x.dtype)

  def __call__(self, x):
    gate = self._dense(x, "gate_proj", self.gate_bias)
    up = self._dense(x, "up_proj", self.up_bias)
    hidden = constrain(jax.nn.silu(gate) * up, (axes.BATCH, axes.LENGTH, axes.MLP))
    return self._dense(hidden, "down_proj", self.down_bias)


class DecoderLayer(nnx.Module):
  """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x)).

  `layer`: the block's index, or None for the stacked block of a
  `scan_layers` model (see `Attention`; its layers are all of one kind). A
  sparse layer (`config.is_moe_layer`) has a `moe.MoEBlock` as its `mlp`.
  """

  def __init__(self, config: ModelConfig, layer: int | None, *, rngs: nnx.Rngs):
    kw = dict(eps=config.rms_norm_eps, param_dtype=config.param_dtype)
    self.input_norm = RMSNorm(config.embed_dim, **kw)
    self.attn = Attention(config, layer, rngs=rngs)
    self.post_attn_norm = RMSNorm(config.embed_dim, **kw)
    self.sparse = config.is_moe_layer(0 if layer is None else layer)
    self.mlp = moe.MoEBlock(config, rngs=rngs) if self.sparse else MLP(config, rngs=rngs)

  def __call__(self, x, collect=None, **attn_kwargs):
    """Returns `(x, new_kv, aux)`; `aux` is None, or for a sparse layer with `collect`
    ("router" or "inputs") a dict with its `router_logits` `[b, t, E]` (and with "inputs" the
    MoE block's input `inputs` `[b, t, embed]`)."""
    h, new_kv = self.attn(self.input_norm(x), **attn_kwargs)
    x = x + h
    h = self.post_attn_norm(x)
    aux = None
    if self.sparse:
      y, logits = self.mlp(h, collect=collect is not None)
      if collect is not None:
        aux = dict(router_logits=logits)
        if collect == "inputs":
          aux["inputs"] = h
    else:
      y = self.mlp(h)
    x = x + y
    return constrain(x, (axes.BATCH, axes.LENGTH, axes.EMBED)), new_kv, aux


@functools.lru_cache(maxsize=64)
def _inverse_frequencies(config: ModelConfig) -> np.ndarray:
  return rope_inverse_frequencies(config)


def default_positions(attention_mask: jax.Array) -> jax.Array:
  """Positions of a left-padded batch: 0 at each row's first real token."""
  return jnp.maximum(jnp.cumsum(attention_mask.astype(jnp.int32), axis=-1) - 1, 0)


def remat_policy(name: str):
  """The `jax.checkpoint` policy of `ModelConfig.remat_policy` `name` ("none": no checkpoint).

  "full" is `jax.checkpoint`'s default (nothing saveable: only the layer's
  inputs are kept and the backward pass reruns the layer's forward); "dots" is
  `jax.checkpoint_policies.dots_with_no_batch_dims_saveable`, which keeps
  the outputs of dot_generals without batch dimensions, i.e. the weight
  projections `[b, t, d] × [d, ...]`, and recomputes the attention einsums
  (batched over batch × kv head), norms, RoPE and activations.
  """
  if name == "full":
    return None
  if name == "dots":
    return jax.checkpoint_policies.dots_with_no_batch_dims_saveable
  raise ValueError(f"remat_policy={name!r} has no checkpoint policy; valid: 'full', 'dots'")


def _rematted(fn, name: str, *, prevent_cse: bool):
  """`fn` under `jax.checkpoint` with policy `name`, or `fn` itself for "none".

  prevent_cse=False inside a scan: the loop already keeps XLA from merging the
  recomputation into the forward, and the extra barriers only cost speed.
  """
  if name == "none":
    return fn
  return jax.checkpoint(fn, policy=remat_policy(name), prevent_cse=prevent_cse)


def _is_unrolled_layer(path) -> bool:
  return len(path) > 2 and path[0] == "layers" and isinstance(path[1], int)


def _is_stacked_layer(path) -> bool:
  return len(path) > 1 and path[0] == "layers" and isinstance(path[1], str)


def _with_value(leaf, value, out_sharding):
  """`leaf` (an `nnx.Variable` or a bare array) holding `value`, with new axis names."""
  if not isinstance(leaf, nnx.Variable):
    return value
  if out_sharding is None:
    return leaf.replace(value)
  return leaf.replace(value, out_sharding=tuple(out_sharding))


def stack_layer_params(state):
  """An unrolled `CausalLM` state -> the state of the same model with `scan_layers=True`.

  Every leaf at `("layers", i, *rest)`, i = 0 … L − 1, becomes one leaf at
  `("layers", *rest)` of shape `[L, *shape]` (`stack` along a new axis 0), and
  its `out_sharding` names gain a leading `axes.LAYERS`; other leaves are kept.
  Leaves may be `nnx.Variable`s or bare arrays, and values arrays or
  `jax.ShapeDtypeStruct`s.

  Usage (`unrolled` a `CausalLM` of `config`):

    scanned = CausalLM(config.replace(scan_layers=True), rngs=nnx.Rngs(0))
    nnx.update(scanned, stack_layer_params(nnx.state(unrolled)))
  """
  kept, groups = [], {}
  for path, leaf in nnx.to_flat_state(state):
    if _is_unrolled_layer(path):
      groups.setdefault(tuple(path[2:]), {})[path[1]] = leaf
    else:
      kept.append((tuple(path), leaf))
  for rest, by_layer in groups.items():
    if sorted(by_layer) != list(range(len(by_layer))):
      raise ValueError(f"layers {sorted(by_layer)} of {'.'.join(map(str, rest))} are not "
                       f"0 … {len(by_layer) - 1}")
    leaves = [by_layer[i] for i in range(len(by_layer))]
    values = [x.get_value() if isinstance(x, nnx.Variable) else x for x in leaves]
    if all(isinstance(x, jax.ShapeDtypeStruct) for x in values):
      value = jax.ShapeDtypeStruct((len(values),) + tuple(values[0].shape), values[0].dtype)
    else:
      value = jnp.stack(values)
    names = (leaves[0].get_metadata().get("out_sharding")
             if isinstance(leaves[0], nnx.Variable) else None)
    kept.append((("layers",) + rest, _with_value(
      leaves[0], value, None if names is None else (axes.LAYERS,) + tuple(names))))
  return nnx.from_flat_state(kept)


def unstack_layer_params(state):
  """The inverse of `stack_layer_params`: a `scan_layers` state -> the unrolled one.

  Every leaf at `("layers", *rest)` of shape `[L, *shape]` becomes L leaves
  at `("layers", i, *rest)` of shape `shape`, with the leading `axes.LAYERS`
  dropped from their `out_sharding` names.
  """
  out = []
  for path, leaf in nnx.to_flat_state(state):
    if not _is_stacked_layer(path):
      out.append((tuple(path), leaf))
      continue
    value = leaf.get_value() if isinstance(leaf, nnx.Variable) else leaf
    names = leaf.get_metadata().get("out_sharding") if isinstance(leaf, nnx.Variable) else None
    if names is not None and (not names or names[0] != axes.LAYERS):
      raise ValueError(f"{'.'.join(map(str, path))} has axes {names}; a stacked layer "
                       f"parameter starts with {axes.LAYERS!r}")
    for i in range(value.shape[0]):
      piece = (jax.ShapeDtypeStruct(tuple(value.shape[1:]), value.dtype)
               if isinstance(value, jax.ShapeDtypeStruct) else value[i])
      out.append((("layers", i) + tuple(path[1:]),
                  _with_value(leaf, piece, None if names is None else names[1:])))
  return nnx.from_flat_state(out)


class CausalLM(nnx.Module):
  """Decoder-only LM: `model(tokens) -> logits` and cached incremental decoding.

  With `config.scan_layers`, `self.layers` is one `DecoderLayer` whose
  parameters have a leading `[num_layers]` axis named `axes.LAYERS` (state
  paths `("layers", "attn", "q_proj")`, shape `[L, embed, heads, head_dim]`),
  run under `jax.lax.scan`; otherwise an `nnx.List` of L layers (paths
  `("layers", i, "attn", "q_proj")`). `stack_layer_params` /
  `unstack_layer_params` convert one state into the other.

  Example:
    >>> from jaxrl_post.models import CausalLM, get_model_config
    >>> model = CausalLM(get_model_config("tiny"), rngs=nnx.Rngs(0))
    >>> model(jnp.zeros((2, 5), jnp.int32)).shape
    (2, 5, 256)
  """

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    self.config = config
    c = config
    self.embed = _param(_normal(rngs, (c.vocab_size, c.embed_dim), c.param_dtype),
                        (axes.VOCAB, axes.EMBED))
    if c.scan_layers:
      # One block built L times under vmap, each with its own split of the
      # params key; `transform_metadata` prepends the `layers` axis name to
      # every parameter's `out_sharding`, so sharding rules see it.
      @nnx.split_rngs(splits=c.num_layers)
      @nnx.vmap(in_axes=0, out_axes=0, transform_metadata={nnx.PARTITION_NAME: axes.LAYERS})
      def stacked(rngs):
        return DecoderLayer(c, None, rngs=rngs)

      self.layers = stacked(rngs)
    else:
      self.layers = nnx.List([DecoderLayer(c, i, rngs=rngs) for i in range(c.num_layers)])
    self.final_norm = RMSNorm(c.embed_dim, eps=c.rms_norm_eps, param_dtype=c.param_dtype)
    if c.tie_embeddings:
      self.lm_head = None
    else:
      self.lm_head = _param(_normal(rngs, (c.embed_dim, c.vocab_size), c.param_dtype),
                            (axes.EMBED, axes.VOCAB))

  def init_cache(self, batch: int, max_len: int, dtype=None) -> KVCache:
    """An empty cache for `batch` rows of up to `max_len` tokens (prompt included).

    Stacked (`[layers, batch, ...]` arrays) for a `scan_layers` model, else one
    buffer per layer.
    """
    c = self.config
    dtype = c.dtype if dtype is None else dtype
    k_shape = (batch, c.num_kv_heads, c.head_dim, max_len)
    v_shape = (batch, c.num_kv_heads, max_len, c.head_dim)
    if c.scan_layers:
      return KVCache(k=jnp.zeros((c.num_layers,) + k_shape, dtype),
                     v=jnp.zeros((c.num_layers,) + v_shape, dtype),
                     mask=jnp.zeros((batch, max_len), jnp.bool_), index=jnp.zeros((), jnp.int32))
    return KVCache(k=tuple(jnp.zeros(k_shape, dtype) for _ in range(c.num_layers)),
                   v=tuple(jnp.zeros(v_shape, dtype) for _ in range(c.num_layers)),
                   mask=jnp.zeros((batch, max_len), jnp.bool_), index=jnp.zeros((), jnp.int32))

  def _unrolled_layers(self, x, *, sin, cos, mask, cache, collect=None):
    """The Python loop over `self.layers`; returns `(x, new_k, new_v, aux)` (tuples, or None;
    `aux`: the sparse layers' collected router outputs, see `DecoderLayer`)."""
    policy = self.config.remat_policy
    new_k, new_v, auxes = [], [], []
    for i, layer in enumerate(self.layers):
      kwargs = dict(sin=sin, cos=cos, mask=mask, collect=collect)
      if cache is not None:
        kwargs.update(cache_kv=(cache.k[i], cache.v[i]), cache_index=cache.index)
        if cache.prefix_mask is not None:
          kwargs.update(prefix=(cache.prefix_k[i], cache.prefix_v[i], cache.prefix_mask))
      if policy == "none":
        x, kv, aux = layer(x, **kwargs)
      else:
        # Functional form, so that `jax.checkpoint` sees the layer's parameters
        # as arguments (saved for the backward pass, never recomputed).
        graphdef, params = nnx.split(layer)
        call = lambda params, x, kwargs, graphdef=graphdef, static=None: nnx.merge(  # noqa: E731
          graphdef, params)(x, **kwargs, **(static or {}))
        static = dict(collect=kwargs.pop("collect"))
        call = functools.partial(call, static=static)
        x, kv, aux = _rematted(call, policy, prevent_cse=True)(params, x, kwargs)
      if aux is not None:
        auxes.append(aux)
      if kv is not None:
        new_k.append(kv[0])
        new_v.append(kv[1])
    aux = jax.tree.map(lambda *a: jnp.stack(a), *auxes) if auxes else None
    if cache is None:
      return x, None, None, aux
    return x, tuple(new_k), tuple(new_v), aux

  def _scanned_layers(self, x, *, sin, cos, mask, cache, collect=None):
    """`jax.lax.scan` of the stacked block over its `[L, ...]` parameters.

    xs per step: the layer's parameter slice, its index, its RoPE flag (when
    the config mixes RoPE and NoPE layers) and its shared-prefix slices
    (read only). The carry is the residual stream x `[batch, time, embed]`
    and, with a cache, the whole stacked `k` / `v` buffers: layer i reads its
    slice and writes back only the `time` new slots with one
    `dynamic_update_slice` into `[L, batch, ...]`, which XLA does in place on
    the (donated) loop carry. Scanning the buffers as xs and the updated
    layer buffers as ys instead re-stacks the whole cache each step: for
    `qwen3_0p6b` decoding 64 rows × 384 slots on XLA:CPU that held 11.2 GB
    of temporaries (a second and third cache) and compiled in 9.1 s, against
    5.2 GB and ≈ 4 s this way (unrolled: 4.1 GB, 36.7 s).
    Returns `(x, new_k, new_v, aux)` (arrays, or None; `aux` the stacked per-layer router
    outputs when `collect` is set on a sparse model, as the scan's ys).
    """
    c = self.config
    graphdef, params = nnx.split(self.layers)
    xs = dict(params=params, layer=jnp.arange(c.num_layers, dtype=jnp.int32))
    rope = [c.uses_rope(i) for i in range(c.num_layers)]
    static = {"collect": collect}
    if all(rope) or not any(rope):
      static["use_rope"] = bool(rope[0])  # one program for every layer: no select needed
    else:
      xs["use_rope"] = jnp.asarray(rope)
    if cache is not None and cache.prefix_mask is not None:
      xs.update(prefix_k=cache.prefix_k, prefix_v=cache.prefix_v)

    def call(params, x, kwargs):
      return nnx.merge(graphdef, params)(x, **kwargs, **static)

    call = _rematted(call, c.remat_policy, prevent_cse=False)

    def kwargs_of(xs):
      kwargs = dict(sin=sin, cos=cos, mask=mask)
      if "use_rope" in xs:
        kwargs["use_rope"] = xs["use_rope"]
      return kwargs

    if cache is None:
      def plain(x, xs):
        x, _, aux = call(xs["params"], x, kwargs_of(xs))
        return x, aux

      x, aux = jax.lax.scan(plain, x, xs)
      return x, None, None, aux

    t, index = x.shape[1], cache.index

    def body(carry, xs):
      x, cache_k, cache_v = carry
      i = xs["layer"]
      kwargs = kwargs_of(xs)
      kwargs.update(cache_kv=(jax.lax.dynamic_index_in_dim(cache_k, i, keepdims=False),
                              jax.lax.dynamic_index_in_dim(cache_v, i, keepdims=False)),
                    cache_index=index)
      if cache.prefix_mask is not None:
        kwargs.update(prefix=(xs["prefix_k"], xs["prefix_v"], cache.prefix_mask))
      x, (k, v), aux = call(xs["params"], x, kwargs)
      # Only the t slots this call wrote go back into the stacked buffers.
      k_new = slice_slots(k, index, t, slot_axis=3)
      v_new = slice_slots(v, index, t, slot_axis=2)
      cache_k = update_slots(cache_k, k_new[None], index, slot_axis=4, row_axis=1,
                             start=(i, 0, 0, 0, 0))
      cache_v = update_slots(cache_v, v_new[None], index, slot_axis=3, row_axis=1,
                             start=(i, 0, 0, 0, 0))
      return (x, cache_k, cache_v), aux

    (x, new_k, new_v), aux = jax.lax.scan(body, (x, cache.k, cache.v), xs)
    return (x, constrain(new_k, (axes.LAYERS,) + KVCache.K_AXES),
            constrain(new_v, (axes.LAYERS,) + KVCache.V_AXES), aux)

  def embed_tokens(self, tokens: jax.Array) -> jax.Array:
    """`int32[batch, time]` -> `[batch, time, embed]` input embeddings (model dtype)."""
    return jnp.take(self.embed[...], tokens, axis=0).astype(self.config.dtype)

  def __call__(self, tokens: jax.Array, *, positions: jax.Array | None = None,
               attention_mask: jax.Array | None = None, cache: KVCache | None = None,
               return_hidden: bool = False, embeddings: jax.Array | None = None,
               return_logits: bool = True):
    """Runs the LM.

    Args:
      tokens: `int32[batch, time]`.
      positions: `int32[batch, time]` RoPE positions; by default counted from
        each row's first unmasked token (left padding). Required with `cache`.
      attention_mask: `bool[batch, time]`, False on padding; default all True.
      cache: if given, the new keys/values are written at `cache.index` (one
        slot for all rows, or each row's own, `KVCache.index`) and the
        queries attend to everything the cache holds up to their own slot.
      return_hidden: also return the final normalised hidden states.
      return_logits: False skips the LM head and returns only the hidden
        states (`sampling.scoring` projects the positions it needs, in chunks).
      embeddings: optional `[batch, time, embed]` inputs used instead of the
        token-embedding lookup (`tokens` then only gives the shape). This is how
        multimodal models feed encoder outputs (image patches, point-cloud
        views) into the decoder: they build the row as
        `concat([encoder(x), lm.embed_tokens(text)])`.

    Returns:
      `float32[batch, time, vocab]` logits; with a cache, `(logits, new_cache)`;
      with `return_hidden`, the hidden states `[batch, time, embed]` are
      appended to the returned tuple; with `return_logits=False`, only the
      hidden states.
    """
    c = self.config
    b, t = tokens.shape
    if attention_mask is None:
      attention_mask = jnp.ones((b, t), jnp.bool_)
    attention_mask = attention_mask.astype(jnp.bool_)
    if positions is None:
      if cache is not None:
        raise ValueError("positions are required when decoding with a cache")
      positions = default_positions(attention_mask)

    if embeddings is None:
      x = self.embed_tokens(tokens)
    elif embeddings.shape != (b, t, c.embed_dim):
      raise ValueError(f"embeddings have shape {embeddings.shape}; expected {(b, t, c.embed_dim)} "
                       "(batch, time of `tokens`, model embed_dim)")
    else:
      x = embeddings.astype(c.dtype)
    x = constrain(x, (axes.BATCH, axes.LENGTH, axes.EMBED))
    angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(_inverse_frequencies(c))
    sin, cos = jnp.sin(angles), jnp.cos(angles)

    if cache is None:
      causal = jnp.tril(jnp.ones((t, t), jnp.bool_))
      mask = attention_mask[:, None, :] & causal[None]
      kv_mask = None
    else:
      kv_mask = update_slots(cache.mask, attention_mask, cache.index, slot_axis=1)
      key_slots = jnp.arange(cache.max_len)
      query_slots = jnp.reshape(cache.index, (-1, 1)) + jnp.arange(t)  # [1 or batch, t]
      mask = kv_mask[:, None, :] & (key_slots[None, None, :] <= query_slots[:, :, None])

    run = self._scanned_layers if c.scan_layers else self._unrolled_layers
    # A MoE model inside `moe.collect_router` returns its router logits (trace-time switch).
    collector = moe.current_collector() if c.num_experts else None
    collect = None if collector is None else ("inputs" if collector.inputs else "router")
    x, new_k, new_v, aux = run(x, sin=sin, cos=cos, mask=mask, cache=cache, collect=collect)
    if collector is not None and aux is not None:
      collector.calls.append(dict(aux, attention_mask=attention_mask))

    hidden = self.final_norm(x)
    if not return_logits:
      if cache is not None:
        raise ValueError("return_logits=False is for teacher-forced scoring, not cached decoding")
      return hidden
    outputs = (self.output_logits(hidden),)
    if cache is not None:
      outputs += (cache.replace(k=new_k, v=new_v, mask=kv_mask,
                                index=cache.index + t),)
    if return_hidden:
      outputs += (hidden,)
    return outputs[0] if len(outputs) == 1 else outputs

  def output_logits(self, hidden: jax.Array) -> jax.Array:
    """The LM head: `[batch, time, embed]` final hidden states -> `float32[batch, time, vocab]`.

    The tied head multiplies by the input embedding `[vocab, embed]`; products
    accumulate in float32 whatever the compute dtype.
    """
    if self.lm_head is None:
      logits = jnp.einsum("btd,vd->btv", hidden, self.embed[...].astype(hidden.dtype),
                          preferred_element_type=jnp.float32)
    else:
      logits = jnp.einsum("btd,dv->btv", hidden, self.lm_head[...].astype(hidden.dtype),
                          preferred_element_type=jnp.float32)
    return constrain(logits.astype(jnp.float32), (axes.BATCH, axes.LENGTH, axes.VOCAB))
