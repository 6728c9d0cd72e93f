"""`ModelConfig`: the frozen description of one decoder-only LM.

One dataclass covers the families users post-train today; the differences
between them are a handful of switches:

| family  | switch                                                            |
|---------|-------------------------------------------------------------------|
| llama   | optional llama3 RoPE scaling; optional q/k/v/o and MLP biases     |
| qwen2   | q/k/v bias (no o_proj bias)                                       |
| qwen3   | per-head RMSNorm on queries and keys (QK-norm) before RoPE         |
| smollm3 | no RoPE ("NoPE") on the layers listed in `nope_layers`            |
| qwen3_moe | qwen3 attention; sparse layers use a Mixture-of-Experts MLP (`num_experts` > 0) |
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp
import numpy as np

FAMILIES = ("llama", "qwen2", "qwen3", "smollm3", "qwen3_moe")
MOE_IMPLS = ("dense", "ragged")
ATTENTION_IMPLS = ("auto", "xla", "cudnn", "splash", "plain")
# Rematerialisation of a decoder layer in the backward pass (`jax.checkpoint`):
# "none" keeps every activation, "full" recomputes the whole layer from its
# input, "dots" keeps the outputs of the weight matmuls and recomputes the rest.
REMAT_POLICIES = ("none", "full", "dots")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RopeScaling:
  """RoPE frequency scaling (`rope_scaling` / `rope_parameters` in HF configs).

  Attributes:
    rope_type: "llama3" (Llama 3.1 / 3.2 wavelength-dependent scaling) or
      "linear" (all frequencies divided by `factor`).
    factor: the context-extension factor.
    low_freq_factor, high_freq_factor, original_max_position_embeddings:
      llama3 only; wavelengths longer than `original / low_freq_factor` are
      divided by `factor`, shorter than `original / high_freq_factor` are kept,
      and the band between is interpolated.
  """

  rope_type: str
  factor: float
  low_freq_factor: float = 1.0
  high_freq_factor: float = 4.0
  original_max_position_embeddings: int = 8192

  def __post_init__(self):
    if self.rope_type not in ("llama3", "linear"):
      raise ValueError(
        f"rope_scaling.rope_type={self.rope_type!r} is not supported; use 'llama3' or 'linear'"
      )
    if self.factor <= 0:
      raise ValueError(f"rope_scaling.factor must be positive, got {self.factor}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
  """Architecture and numerics of a decoder-only transformer LM.

  Attributes:
    family: one of `FAMILIES`; decides the Hugging Face `architectures` name.
    vocab_size: number of token ids.
    embed_dim: residual width (HF `hidden_size`).
    num_layers: decoder blocks.
    num_heads: query heads.
    num_kv_heads: key/value heads (grouped-query attention when smaller).
    head_dim: width of one head.
    mlp_dim: SwiGLU hidden width (HF `intermediate_size`).
    rms_norm_eps: epsilon inside every RMSNorm.
    rope_theta: RoPE base.
    rope_scaling: optional `RopeScaling`.
    max_position_embeddings: longest position the model was trained for.
    tie_embeddings: the output projection reuses the input embedding.
    qkv_bias: biases on the q/k/v projections (Qwen2).
    o_bias: bias on the output projection.
    mlp_bias: biases on the SwiGLU projections.
    qk_norm: RMSNorm over `head_dim` on queries and keys (Qwen3).
    nope_layers: indices of layers that skip RoPE (SmolLM3).
    param_dtype: storage dtype of the parameters.
    dtype: compute dtype of activations and matmuls (logits are float32).
    attention_impl: attention over whole sequences (training, scoring,
      prefill): "auto" (the default: "cudnn" on a GPU where cuDNN's fused
      kernel applies, otherwise "xla"; `transformer.attention_kernel`), "xla"
      (`jax.nn.dot_product_attention`'s XLA lowering, which materialises the
      `[batch, heads, time, time]` scores), "cudnn" (the same call on cuDNN's
      fused flash attention, GPU only), "splash" (JAX's Pallas splash
      flash-attention kernel for TPU, `transformer.splash_attention`, opt-in
      until it has run on a TPU under a mesh; it applies to no-cache
      self-attention over a multiple of 128 positions, and a prefill into the
      KV cache or another length falls back to "xla"; off a TPU it runs in
      Pallas interpret mode, for tests) or
      "plain" (explicit grouped matmuls + softmax; the reference path).
    logit_chunk_size: completion positions per chunk when scoring (log-probs,
      entropy, top-K; `sampling.scoring`): each chunk's logits exist only
      while it is processed and are recomputed in the backward pass. 0 scores
      the whole completion as one chunk; a size that does not divide the
      completion pads its last chunk. Peak logit memory per device is about
      3 × rows × chunk × vocab × 4 bytes.
    scan_layers: run the decoder layers under one `jax.lax.scan` with
      parameters stacked on a leading `layers` axis (and a stacked KV cache),
      so compile time does not grow with depth; False keeps one Python-unrolled
      layer per block and one cache buffer per layer (faster decode on CPU,
      measured in docs/benchmarks.md).
    remat_policy: one of `REMAT_POLICIES`, how each layer is rematerialised
      in the backward pass: "none" (no `jax.checkpoint`), "full"
      (`jax.checkpoint` saving nothing but the layer's input; the backward
      recomputes the layer's forward) or "dots"
      (`jax.checkpoint_policies.dots_with_no_batch_dims_saveable`: the outputs
      of the q/k/v/o and MLP projections are kept, the attention einsums, which
      have batch dimensions, norms and activations are recomputed).
    bos_token_id, eos_token_ids, pad_token_id: carried through HF round trips.
    num_experts: experts per sparse layer (HF `num_experts`); 0 is a dense model.
    num_experts_per_tok: experts each token is routed to (top-k).
    moe_mlp_dim: SwiGLU width of one expert (HF `moe_intermediate_size`).
    norm_topk_prob: renormalise the top-k routing weights to sum to one.
    decoder_sparse_step: layer i is sparse when (i + 1) % step == 0 (HF semantics) ...
    mlp_only_layers: ... and i is not listed here (those keep the dense `mlp_dim` MLP).
    router_aux_loss_coef: weight of the load-balancing loss (`models.moe`) in training
      objectives that add it (HF `router_aux_loss_coef`; 0 disables).
    moe_impl: expert dispatch, "dense" or "ragged" (`models.moe`).
  """

  family: str
  vocab_size: int
  embed_dim: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  mlp_dim: int
  rms_norm_eps: float = 1e-6
  rope_theta: float = 10_000.0
  rope_scaling: RopeScaling | None = None
  max_position_embeddings: int = 4096
  tie_embeddings: bool = False
  qkv_bias: bool = False
  o_bias: bool = False
  mlp_bias: bool = False
  qk_norm: bool = False
  nope_layers: tuple[int, ...] = ()
  param_dtype: Any = jnp.float32
  dtype: Any = jnp.float32
  attention_impl: str = "auto"
  logit_chunk_size: int = 0
  scan_layers: bool = False
  remat_policy: str = "none"
  bos_token_id: int | None = None
  eos_token_ids: tuple[int, ...] = ()
  pad_token_id: int | None = None
  num_experts: int = 0
  num_experts_per_tok: int = 0
  moe_mlp_dim: int = 0
  norm_topk_prob: bool = False
  decoder_sparse_step: int = 1
  mlp_only_layers: tuple[int, ...] = ()
  router_aux_loss_coef: float = 0.001
  moe_impl: str = "dense"

  def __post_init__(self):
    # Normalise dtypes given as strings ("bfloat16") so configs stay hashable
    # and comparable.
    object.__setattr__(self, "param_dtype", jnp.dtype(self.param_dtype))
    object.__setattr__(self, "dtype", jnp.dtype(self.dtype))
    object.__setattr__(self, "nope_layers", tuple(int(i) for i in self.nope_layers))
    object.__setattr__(self, "eos_token_ids", tuple(int(i) for i in self.eos_token_ids))
    object.__setattr__(self, "mlp_only_layers", tuple(int(i) for i in self.mlp_only_layers))
    if isinstance(self.rope_scaling, dict):
      object.__setattr__(self, "rope_scaling", RopeScaling(**self.rope_scaling))
    if self.family not in FAMILIES:
      raise ValueError(f"family={self.family!r} is not supported; valid: {FAMILIES}")
    if self.attention_impl not in ATTENTION_IMPLS:
      raise ValueError(
        f"attention_impl={self.attention_impl!r} is not supported; valid: {ATTENTION_IMPLS}"
      )
    if self.remat_policy not in REMAT_POLICIES:
      raise ValueError(
        f"remat_policy={self.remat_policy!r} is not supported; valid: {REMAT_POLICIES}"
      )
    for name in ("vocab_size", "embed_dim", "num_layers", "num_heads", "num_kv_heads",
                 "head_dim", "mlp_dim"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
        f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}"
      )
    if self.head_dim % 2:
      raise ValueError(f"head_dim={self.head_dim} must be even for RoPE")
    bad = [i for i in self.nope_layers if not 0 <= i < self.num_layers]
    if bad:
      raise ValueError(f"nope_layers {bad} are outside [0, num_layers={self.num_layers})")
    if self.logit_chunk_size < 0:
      raise ValueError(f"logit_chunk_size={self.logit_chunk_size} must be >= 0 (0: one chunk)")
    for name in ("param_dtype", "dtype"):
      if not jnp.issubdtype(getattr(self, name), jnp.floating):
        raise ValueError(f"{name} must be a floating dtype, got {getattr(self, name)}")
    self._check_moe()

  def _check_moe(self):
    if self.num_experts < 0:
      raise ValueError(f"num_experts={self.num_experts} must be >= 0 (0: dense)")
    if self.moe_impl not in MOE_IMPLS:
      raise ValueError(f"moe_impl={self.moe_impl!r} is not supported; valid: {MOE_IMPLS}")
    if self.num_experts and self.family != "qwen3_moe":
      raise ValueError(f"num_experts={self.num_experts} needs family='qwen3_moe', not "
                       f"{self.family!r}")
    if not self.num_experts:
      return
    if not 1 <= self.num_experts_per_tok <= self.num_experts:
      raise ValueError(f"num_experts_per_tok={self.num_experts_per_tok} must be in "
                       f"[1, num_experts={self.num_experts}]")
    if self.moe_mlp_dim < 1:
      raise ValueError(f"moe_mlp_dim must be positive, got {self.moe_mlp_dim}")
    if self.decoder_sparse_step < 1:
      raise ValueError(f"decoder_sparse_step={self.decoder_sparse_step} must be >= 1")
    bad = [i for i in self.mlp_only_layers if not 0 <= i < self.num_layers]
    if bad:
      raise ValueError(f"mlp_only_layers {bad} are outside [0, num_layers={self.num_layers})")
    if self.router_aux_loss_coef < 0:
      raise ValueError(f"router_aux_loss_coef={self.router_aux_loss_coef} must be >= 0")
    kinds = {self.is_moe_layer(i) for i in range(self.num_layers)}
    if self.scan_layers and len(kinds) > 1:
      raise ValueError(
        f"scan_layers=True needs every layer of one kind; decoder_sparse_step="
        f"{self.decoder_sparse_step} and mlp_only_layers={self.mlp_only_layers} mix dense and "
        "MoE layers (use scan_layers=False)")

  def is_moe_layer(self, layer: int) -> bool:
    """Whether layer `layer` has the Mixture-of-Experts MLP (HF `Qwen3MoeDecoderLayer`)."""
    return (self.num_experts > 0 and layer not in self.mlp_only_layers
            and (layer + 1) % self.decoder_sparse_step == 0)

  @property
  def moe_layers(self) -> tuple[int, ...]:
    """Indices of the sparse layers, in order."""
    return tuple(i for i in range(self.num_layers) if self.is_moe_layer(i))

  @property
  def num_groups(self) -> int:
    """Query heads per key/value head."""
    return self.num_heads // self.num_kv_heads

  def uses_rope(self, layer: int) -> bool:
    return layer not in self.nope_layers

  def replace(self, **changes) -> ModelConfig:
    return dataclasses.replace(self, **changes)

  def num_params(self) -> int:
    """Parameter count (embedding counted once when tied)."""
    d, n, k, h, f, v = (self.embed_dim, self.num_heads, self.num_kv_heads, self.head_dim,
                        self.mlp_dim, self.vocab_size)
    attn = d * n * h + 2 * d * k * h + n * h * d
    attn += (n * h + 2 * k * h) * self.qkv_bias + d * self.o_bias + 2 * h * self.qk_norm
    mlp = 3 * d * f + (2 * f + d) * self.mlp_bias
    moe = self.num_experts * 3 * d * self.moe_mlp_dim + d * self.num_experts
    sparse = len(self.moe_layers)
    per_layer = attn + 2 * d
    return (self.num_layers * per_layer + (self.num_layers - sparse) * mlp + sparse * moe
            + d + v * d * (1 if self.tie_embeddings else 2))

  def flops_per_token(self, context: int) -> float:
    """Forward FLOPs per token: 2 per matmul weight, plus attention over `context` keys.

    Norms, biases and the softmax are left out (they are not matmuls); the
    output projection counts once even when tied.
    """
    d, n, k, h, f = self.embed_dim, self.num_heads, self.num_kv_heads, self.head_dim, self.mlp_dim
    sparse = len(self.moe_layers)  # Active experts only: k SwiGLUs and the router.
    active_moe = 3 * d * self.moe_mlp_dim * self.num_experts_per_tok + d * self.num_experts
    matmul_weights = (self.num_layers * (2 * d * n * h + 2 * d * k * h)
                      + (self.num_layers - sparse) * 3 * d * f + sparse * active_moe)
    matmul_weights += self.vocab_size * d
    attention = 2 * 2 * self.num_layers * n * h * context  # q·k and p·v
    return 2.0 * matmul_weights + attention


def rope_inverse_frequencies(config: ModelConfig) -> np.ndarray:
  """The `head_dim // 2` RoPE inverse frequencies, with scaling applied.

  inv_freq_i = θ^(−2i/d); llama3 scaling (arXiv 2407.21783) divides low
  frequencies by `factor`, keeps high ones, and interpolates between them:
  s = (L_orig / λ − f_low) / (f_high − f_low),  ω' = (1 − s) ω / factor + s ω.
  Computed in float32, the precision `transformers` uses.
  """
  d = config.head_dim
  inv_freq = (1.0 / (config.rope_theta ** (np.arange(0, d, 2, dtype=np.int64).astype(np.float32)
                                           / d))).astype(np.float32)
  scaling = config.rope_scaling
  if scaling is None:
    return inv_freq
  if scaling.rope_type == "linear":
    return (inv_freq / scaling.factor).astype(np.float32)
  old_len = scaling.original_max_position_embeddings
  low_wavelen = old_len / scaling.low_freq_factor
  high_wavelen = old_len / scaling.high_freq_factor
  wavelen = 2 * np.pi / inv_freq
  scaled = np.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
  smooth = (old_len / wavelen - scaling.low_freq_factor) / (
    scaling.high_freq_factor - scaling.low_freq_factor)
  smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
  medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
  return np.where(medium, smoothed, scaled).astype(np.float32)
