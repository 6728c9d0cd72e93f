"""Low-rank adapters (LoRA, arXiv 2106.09685) on the decoder's projections.

A targeted kernel `K` (`[*in, *out]`, e.g. q `[embed, heads, head_dim]`, o `[heads, head_dim,
embed]`, gate `[embed, mlp]`) gets two adapter parameters next to it:

  a `[*in, r]`   random, U(−1/√d_in, 1/√d_in): peft's default for `nn.Linear`
                 (Kaiming-uniform with a = √5 on a `[r, d_in]` weight), d_in = prod(in);
  b `[r, *out]`  zeros, so the adapted model starts *equal* to its base;

and the projection becomes

  y = x·K + s · (x·a)·b,   s = α / r,

computed unmerged: the product is two thin matmuls, and when only `a` and `b` are
differentiated the `[d_in, d_out]` gradient of `K` is never formed. A `scan_layers` model keeps
its leading `[L]` axis (`axes.LAYERS`) on the adapters too, so the scan slices them per layer.

The adapters are `LoraParam`s, a subclass of `nnx.Param`: `nnx.state(model, nnx.Param)` still
sees every parameter, `nnx.state(model, LoraParam)` only the adapters, and
`nnx.split(model, LoraParam, ...)` separates the trainable adapters from the frozen base. Their
logical axes are the kernel's input / output axes with the rank axis unnamed (replicated), so
the sharding rules shard them like their kernel. The scale s rides along as the adapters'
`lora_scale` metadata (static: part of the graph, not of the arrays).

    add_lora(model, rank=8, alpha=16.0, targets=("q_proj", "v_proj"), rngs=nnx.Rngs(0))
    graphdef, adapters, base = nnx.split(model, LoraParam, ...)
    merged = merge_lora(nnx.state(model))   # base-shaped: K + s·a·b, no adapters left
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl_post.models.dense import dense

# The projections adapters can attach to: name -> (input axes, output axes) of the kernel
# (without a `scan_layers` model's leading layer axis).
LORA_TARGETS: dict[str, tuple[int, int]] = {
  "q_proj": (1, 2), "k_proj": (1, 2), "v_proj": (1, 2), "o_proj": (2, 1),
  "gate_proj": (1, 1), "up_proj": (1, 1), "down_proj": (1, 1),
}
# Every linear projection of a decoder layer ("all-linear" in peft's words).
DEFAULT_TARGETS = tuple(LORA_TARGETS)
# Attribute suffixes of the two adapter parameters next to kernel `<name>`.
A_SUFFIX, B_SUFFIX = "_lora_a", "_lora_b"


class LoraParam(nnx.Param):
  """A low-rank adapter parameter (`a` or `b` of one projection); an `nnx.Param`, so filters
  on `nnx.Param` keep seeing it, while `LoraParam` alone selects the adapters."""


def check_lora_options(rank: int, alpha: float, targets: Sequence[str]) -> None:
  """Validates `config.lora`'s values before a model is touched.

  Raises:
    ValueError: naming `config.lora.rank` (negative, not an int), `config.lora.alpha` (not
      positive with rank > 0) or `config.lora.targets` (unknown names, listing the valid ones).
  """
  if isinstance(rank, bool) or not isinstance(rank, numbers.Integral) or rank < 0:
    raise ValueError(f"config.lora.rank={rank!r} must be an int >= 0 (0 turns LoRA off)")
  if rank and not alpha > 0:
    raise ValueError(f"config.lora.alpha={alpha!r} must be > 0 (scale = alpha / rank)")
  if isinstance(targets, str):
    raise ValueError(f"config.lora.targets={targets!r} must be a sequence of projection names, "
                     f"e.g. {DEFAULT_TARGETS}")
  unknown = [t for t in targets if t not in LORA_TARGETS]
  if unknown or (rank and not targets):
    raise ValueError(f"config.lora.targets={tuple(targets)}: {unknown or 'empty'} is not a "
                     f"projection adapters can attach to; valid names: {', '.join(LORA_TARGETS)}")


def add_lora(model: nnx.Module, *, rank: int, alpha: float,
             targets: Sequence[str] = DEFAULT_TARGETS, rngs: nnx.Rngs) -> nnx.Module:
  """Attaches adapters of rank `rank` to every kernel named in `targets`; returns `model`.

  In place: each module holding a targeted kernel `<name>` gains `LoraParam`s `<name>_lora_a`
  `[..., *in, rank]` and `<name>_lora_b` `[..., rank, *out]` (`...`: a `scan_layers` model's
  layer axis), with scale `alpha / rank`. `b` is zero, so the model's outputs do not change.
  `rank=0` leaves the model alone.

  Raises:
    ValueError: rank < 0; a target no module of `model` holds (naming it and listing the
      projections the model has); rank > min(d_in, d_out) of a target (naming it and its
      sizes); a model that already has adapters.
  """
  check_lora_options(rank, alpha, targets)
  if rank == 0:
    return model
  if jax.tree.leaves(nnx.state(model, LoraParam)):
    raise ValueError("the model already has LoRA adapters; add_lora attaches them once")
  scale = float(alpha) / rank
  found, sites = set(), []
  for _, module in nnx.iter_modules(model):
    for name in LORA_TARGETS:
      kernel = getattr(module, name, None)
      if isinstance(kernel, nnx.Param):
        found.add(name)
        if name in targets:
          sites.append((module, name, kernel))
  missing = [t for t in targets if t not in found]
  if missing:
    raise ValueError(f"config.lora.targets {missing} match no parameter of the model; its "
                     f"projections: {', '.join(n for n in LORA_TARGETS if n in found) or 'none'}")
  for module, name, kernel in sites:
    n_in, n_out = LORA_TARGETS[name]
    shape = kernel.get_value().shape
    lead = len(shape) - n_in - n_out
    d_in, d_out = math.prod(shape[lead:lead + n_in]), math.prod(shape[lead + n_in:])
    if rank > min(d_in, d_out):
      raise ValueError(f"config.lora.rank={rank} is larger than {name}'s matrix "
                       f"({d_in} × {d_out}: rank at most {min(d_in, d_out)})")
    names = kernel.get_metadata().get("out_sharding") or (None,) * len(shape)
    dtype = kernel.get_value().dtype
    bound = 1.0 / math.sqrt(d_in)
    a = jax.random.uniform(rngs.params(), shape[:lead + n_in] + (rank,), jnp.float32,
                           -bound, bound).astype(dtype)
    b = jnp.zeros(shape[:lead] + (rank,) + shape[lead + n_in:], dtype)
    meta = dict(eager_sharding=False, lora_scale=scale)
    setattr(module, name + A_SUFFIX, LoraParam(
      a, out_sharding=tuple(names[:lead + n_in]) + (None,), **meta))
    setattr(module, name + B_SUFFIX, LoraParam(
      b, out_sharding=tuple(names[:lead]) + (None,) + tuple(names[lead + n_in:]), **meta))
  return model


def lora_delta(x: jax.Array, a: jax.Array, b: jax.Array, scale: float) -> jax.Array:
  """s · (x·a)·b for `x` `[..., *in]`, `a` `[*in, r]`, `b` `[r, *out]` -> `[..., *out]`.

  Two thin matmuls through the rank axis, in `x`'s dtype (`dense`: CPU-friendly gradients).
  """
  r = a.shape[-1]
  n_in = a.ndim - 1
  batch = x.shape[:x.ndim - n_in]
  h = dense(x.reshape(batch + (-1,)), a.reshape(-1, r).astype(x.dtype))
  y = dense(h, b.reshape(r, -1).astype(x.dtype))
  return (jnp.asarray(scale, x.dtype) * y).reshape(batch + b.shape[1:])


def with_lora(module: nnx.Module, name: str, x: jax.Array, y: jax.Array) -> jax.Array:
  """`y` (= x·K of `module.<name>`) plus the adapters' s·(x·a)·b when `module` has them."""
  a = getattr(module, name + A_SUFFIX, None)
  if a is None:
    return y
  b = getattr(module, name + B_SUFFIX)
  return y + lora_delta(x, a[...], b[...], a.get_metadata()["lora_scale"]).astype(y.dtype)


def _value(leaf):
  return leaf.get_value() if isinstance(leaf, nnx.Variable) else leaf


def merge_lora(state) -> nnx.State:
  """A state with adapters -> the base-shaped state: K ← K + s·a·b, adapters dropped.

  `state` holds the base kernels and their `LoraParam`s (e.g. `nnx.state(model)`, or
  `nnx.merge_state(adapters, base)`); the merged kernel keeps its dtype and metadata. Under
  `jit` this is one fused update per kernel. States without adapters come back unchanged.
  The scale comes from the adapters' `lora_scale` metadata, so leaves must be `nnx.Variable`s.
  """
  flat = dict(nnx.to_flat_state(state))
  out = []
  for path, leaf in flat.items():
    name = path[-1]
    if isinstance(name, str) and name.endswith((A_SUFFIX, B_SUFFIX)):
      continue
    a = flat.get(path[:-1] + (f"{name}{A_SUFFIX}",))
    if a is not None:
      b = flat[path[:-1] + (f"{name}{B_SUFFIX}",)]
      kernel = _value(leaf)
      av, bv = _value(a), _value(b)
      delta = _low_rank_product(av, bv, lead=av.ndim + bv.ndim - 2 - kernel.ndim)
      merged = (kernel.astype(jnp.float32)
                + a.get_metadata()["lora_scale"] * delta.reshape(kernel.shape))
      leaf = leaf.replace(merged.astype(kernel.dtype))
    out.append((path, leaf))
  return nnx.from_flat_state(out)


def _low_rank_product(a, b, *, lead: int) -> jax.Array:
  """a `[*L, *in, r]` · b `[*L, r, *out]` over the rank axis, in float32: `[*L, d_in, d_out]`.

  `lead` = len(L), the layer axes all three arrays share: ndim(a) + ndim(b) − 2 − ndim(K).
  """
  r, lead_shape = a.shape[-1], a.shape[:lead]
  a2 = a.astype(jnp.float32).reshape(lead_shape + (-1, r))
  b2 = b.astype(jnp.float32).reshape(lead_shape + (r, -1))
  return jnp.matmul(a2, b2, precision=jax.lax.Precision.HIGHEST)


def without_lora(model: nnx.Module) -> nnx.Module:
  """A module of `model`'s base graph (no adapters) sharing `model`'s base arrays (no copy).

  What a sampler of merged parameters is built from: its graph is the base model's, so it
  decodes at the base model's speed, and `merge_lora`'s output is its state.
  """
  graphdef, _, base = nnx.split(model, LoraParam, ...)
  clone = nnx.merge(graphdef, nnx.state(model, LoraParam), base)
  for _, module in nnx.iter_modules(clone):
    for name in LORA_TARGETS:
      for suffix in (A_SUFFIX, B_SUFFIX):
        if hasattr(module, name + suffix):
          delattr(module, name + suffix)
  return clone


@jax.jit
def merge_adapters(adapters, base) -> nnx.State:
  """`merge_lora` of adapters and the frozen base given apart (a LoRA run's train state and
  `run.frozen`), jitted: the base-shaped state a sampler of `without_lora(model)` decodes with.
  Untargeted base parameters pass through unchanged."""
  return merge_lora(nnx.merge_state(adapters, base))
