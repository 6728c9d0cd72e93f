"""Mixture-of-Experts feed-forward block (Qwen3-MoE shaped) and its load-balancing loss.

A sparse decoder layer replaces the SwiGLU MLP by `E` SwiGLU experts and a router
(Qwen3-MoE, HF `Qwen3MoeSparseMoeBlock`; Switch / GShard routing, arXiv 2101.03961):

  logits = x · W_r                     W_r `[embed, E]`, no bias
  p      = softmax(logits)             float32
  (w, i) = top_k(p)                    w `[N, k]`, i `[N, k]`;  w /= Σ_k w  if norm_topk_prob
  y      = Σ_j w_j · down_{i_j}(silu(gate_{i_j}(x)) · up_{i_j}(x))

Expert weights are stacked on a leading `expert` axis (logical name `axes.EXPERT`):
`w_gate`, `w_up` `[E, embed, moe_mlp]`, `w_down` `[E, moe_mlp, embed]`, so expert parallelism
is a sharding rule (`expert` → the `expert` mesh axis), not code.

Two dispatches (`ModelConfig.moe_impl`), equal up to float rounding:

  * "dense": every expert runs on every token and the outputs are combined with the
    `[N, E]` combine tensor (zero off the top-k). Exact, no capacity or dropped tokens, and
    under GSPMD the `[E]` axis partitions with one reduction (each expert shard computes its
    experts, the combine sums over shards). Costs E/k × the active FLOPs: the right choice at
    proxy scale (E ≤ 16) and the reference path.
  * "ragged": token-slots are sorted by expert and run through `jax.lax.ragged_dot` (grouped
    matmul), then scattered back: FLOPs ∝ N·k, no `[N, E, F]` tensor; the path for real
    expert counts (128 in Qwen3-30B-A3B). Under an `expert`-sharded mesh XLA gathers the
    experts (correct, not yet a shard_map all-to-all).

Router statistics for the auxiliary loss are collected on request (`collect_router`): the
model then returns each sparse layer's router logits to `CausalLM.__call__`, which records them
(with the attention mask) in the active collector; nothing is stored on the module, so jitted
or scanned calls outside a collector are unchanged.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl_post.parallel import axes
from jaxrl_post.parallel.axes import constrain

MOE_IMPLS = ("dense", "ragged")
_INIT_STD = 0.02


def _param(value, logical_axes):
  return nnx.Param(value, out_sharding=logical_axes, eager_sharding=False)


def _normal(rngs, shape, dtype):
  return (_INIT_STD * jax.random.normal(rngs.params(), shape, jnp.float32)).astype(dtype)


def route(router_logits: jax.Array, *, top_k: int, norm_topk_prob: bool):
  """Softmax → top-k routing of HF `Qwen3MoeTopKRouter`.

  Args:
    router_logits: `[..., E]`.
    top_k: experts per token (`num_experts_per_tok`).
    norm_topk_prob: renormalise the k weights to sum to one.

  Returns:
    `(weights float32[..., k], indices int32[..., k], probs float32[..., E])`; ties pick the
    lower expert index (as `torch.topk` and `jax.lax.top_k`).
  """
  probs = jax.nn.softmax(router_logits.astype(jnp.float32), axis=-1)
  weights, indices = jax.lax.top_k(probs, top_k)
  if norm_topk_prob:
    weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
  return weights, indices.astype(jnp.int32), probs


def combine_tensor(weights: jax.Array, indices: jax.Array, num_experts: int) -> jax.Array:
  """`[..., E]` combine weights: `weights[..., j]` at expert `indices[..., j]`, zero elsewhere."""
  one_hot = jax.nn.one_hot(indices, num_experts, dtype=weights.dtype)  # [..., k, E]
  return jnp.einsum("...k,...ke->...e", weights, one_hot)


def experts_dense(x, combine, w_gate, w_up, w_down):
  """All experts on all tokens, combined: x `[N, d]`, combine `[N, E]` -> `[N, d]`."""
  gate = jnp.einsum("nd,edf->nef", x, w_gate)
  up = jnp.einsum("nd,edf->nef", x, w_up)
  hidden = constrain(jax.nn.silu(gate) * up, (axes.BATCH, axes.EXPERT, axes.MLP))
  out = jnp.einsum("nef,efd->ned", hidden, w_down)
  return jnp.einsum("ned,ne->nd", out, combine.astype(out.dtype))


def experts_ragged(x, weights, indices, w_gate, w_up, w_down):
  """Sorted grouped-matmul dispatch: x `[N, d]`, weights / indices `[N, k]` -> `[N, d]`."""
  n, k = indices.shape
  num_experts = w_gate.shape[0]
  flat = indices.reshape(-1)
  order = jnp.argsort(flat, stable=True)
  token = order // k
  sizes = jnp.bincount(flat, length=num_experts).astype(jnp.int32)
  xs = x[token]
  gate = jax.lax.ragged_dot(xs, w_gate, sizes)
  up = jax.lax.ragged_dot(xs, w_up, sizes)
  ys = jax.lax.ragged_dot(jax.nn.silu(gate) * up, w_down, sizes)
  ys = ys * weights.reshape(-1)[order][:, None].astype(ys.dtype)
  return jnp.zeros_like(x).at[token].add(ys)


class MoEBlock(nnx.Module):
  """Router + `num_experts` SwiGLU experts (`ModelConfig.num_experts` > 0).

  Parameters: `router` `[embed, E]` (HF `mlp.gate.weight` transposed), `w_gate` / `w_up`
  `[E, embed, moe_mlp]`, `w_down` `[E, moe_mlp, embed]`. `__call__(x, collect=False)` returns
  `(y [b, t, d], router_logits [b, t, E] or None)`.
  """

  def __init__(self, config, *, rngs: nnx.Rngs):
    c = config
    d, f, e, pdt = c.embed_dim, c.moe_mlp_dim, c.num_experts, c.param_dtype
    self.num_experts, self.top_k = e, c.num_experts_per_tok
    self.norm_topk_prob, self.impl = c.norm_topk_prob, c.moe_impl
    # The router stays whole on every expert shard: top-k needs all E logits of a token.
    self.router = _param(_normal(rngs, (d, e), pdt), (axes.EMBED, None))
    self.w_gate = _param(_normal(rngs, (e, d, f), pdt), (axes.EXPERT, axes.EMBED, axes.MLP))
    self.w_up = _param(_normal(rngs, (e, d, f), pdt), (axes.EXPERT, axes.EMBED, axes.MLP))
    self.w_down = _param(_normal(rngs, (e, f, d), pdt), (axes.EXPERT, axes.MLP, axes.EMBED))

  def __call__(self, x: jax.Array, collect: bool = False):
    b, t, d = x.shape
    dtype = x.dtype
    router_logits = jnp.einsum("btd,de->bte", x, self.router[...].astype(dtype))
    weights, indices, _ = route(router_logits, top_k=self.top_k,
                                norm_topk_prob=self.norm_topk_prob)
    weights = weights.astype(dtype)  # HF casts the routing weights to the logits' dtype.
    flat = x.reshape(b * t, d)
    kernels = (self.w_gate[...].astype(dtype), self.w_up[...].astype(dtype),
               self.w_down[...].astype(dtype))
    if self.impl == "ragged":
      y = experts_ragged(flat, weights.reshape(b * t, -1), indices.reshape(b * t, -1), *kernels)
    else:
      combine = combine_tensor(weights.reshape(b * t, -1), indices.reshape(b * t, -1),
                               self.num_experts)
      y = experts_dense(flat, combine, *kernels)
    y = y.reshape(b, t, d)
    return y, (router_logits.astype(jnp.float32) if collect else None)


# ==== router statistics and the load-balancing loss ====


@dataclasses.dataclass
class RouterRecords:
  """What `CausalLM` calls made while a `collect_router` context was open.

  `calls`: one dict per model call with `router_logits` `float32[L_moe, b, t, E]` (the sparse
  layers in order) and `attention_mask` `bool[b, t]`; with `inputs=True` also `inputs`
  `[L_moe, b, t, embed]`, the normalised hidden states each MoE block received.
  """

  inputs: bool = False
  calls: list[dict[str, Any]] = dataclasses.field(default_factory=list)


_COLLECTOR: contextvars.ContextVar[RouterRecords | None] = contextvars.ContextVar(
  "jaxrl_post_moe_router", default=None)


@contextlib.contextmanager
def collect_router(inputs: bool = False):
  """Within this context, MoE `CausalLM` calls record their router logits (`RouterRecords`).

  Trace-time: open it inside the function being traced (a loss), around the model call.
  """
  records = RouterRecords(inputs=inputs)
  token = _COLLECTOR.set(records)
  try:
    yield records
  finally:
    _COLLECTOR.reset(token)


def current_collector() -> RouterRecords | None:
  """The innermost `collect_router` records, or None."""
  return _COLLECTOR.get()


def load_balancing_loss(router_logits: jax.Array, *, num_experts: int, top_k: int,
                        attention_mask: jax.Array | None = None) -> jax.Array:
  """Switch-Transformer auxiliary loss, exactly as `transformers`' `load_balancing_loss_func`.

  Over all layers' tokens together (the HF concatenation), with valid-token mask m:

    f_e = Σ_{l,n} m_n · #{j : i_{l,n,j} = e} / Σ_{l,n} m_n      (top-k counts, no gradient)
    P_e = Σ_{l,n} m_n · softmax(logits_{l,n})_e / Σ_{l,n} m_n
    L   = E · Σ_e f_e · P_e

  (arXiv 2101.03961 eqs. 4–6; with top-k, f sums the k slots.) Perfect balance gives k.

  Args:
    router_logits: `[L, b, t, E]` (or `[L, N, E]`).
    num_experts, top_k: E and k.
    attention_mask: `[b, t]` (or `[N]`), True on real tokens; None counts every token.

  Returns:
    `float32[]`.
  """
  if router_logits.shape[-1] != num_experts:
    raise ValueError(f"router_logits last axis {router_logits.shape[-1]} != num_experts="
                     f"{num_experts}")
  probs = jax.nn.softmax(router_logits.astype(jnp.float32), axis=-1)
  _, selected = jax.lax.top_k(probs, top_k)
  counts = jnp.sum(jax.nn.one_hot(selected, num_experts, dtype=jnp.float32), axis=-2)
  if attention_mask is None:
    m = jnp.ones(router_logits.shape[:-1], jnp.float32)
  else:
    m = jnp.broadcast_to(attention_mask.astype(jnp.float32), router_logits.shape[:-1])
  total = jnp.maximum(jnp.sum(m), 1.0)
  lead = tuple(range(router_logits.ndim - 1))
  f = jnp.sum(jax.lax.stop_gradient(counts) * m[..., None], axis=lead) / total
  p = jnp.sum(probs * m[..., None], axis=lead) / total
  return num_experts * jnp.sum(f * p)


def records_aux_loss(records: RouterRecords, *, num_experts: int, top_k: int) -> jax.Array:
  """`load_balancing_loss` of every call in `records`, averaged over calls (0 without calls)."""
  if not records.calls:
    return jnp.zeros((), jnp.float32)
  losses = [load_balancing_loss(call["router_logits"], num_experts=num_experts, top_k=top_k,
                                attention_mask=call["attention_mask"]) for call in records.calls]
  return sum(losses) / len(losses)
