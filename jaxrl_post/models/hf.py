"""Hugging Face checkpoints: `load_hf(path) -> CausalLM` and `save_hf(model, path)`.

One table (`tensor_specs`) lists every parameter: its Hugging Face name and
shape, its place in the NNX module, and the reshape between the two. Loading,
saving and the error checks all read that table, so they cannot disagree.

HF linear weights are `[out, in]`; ours are `[in, out]` with heads split out:
q_proj `[heads·head_dim, embed]` ↔ `[embed, heads, head_dim]`,
o_proj `[embed, heads·head_dim]` ↔ `[heads, head_dim, embed]`. With
`scan_layers` the layers' leaves are stacked `[num_layers, ...]` and layer i's
tensor fills index i.

Qwen3-MoE (`Qwen3MoeForCausalLM`): the Hub checkpoints (Qwen/Qwen3-30B-A3B) and what
`transformers` 5.x `save_pretrained` writes both hold one tensor per expert,
`model.layers.{i}.mlp.experts.{e}.{gate,up,down}_proj.weight`, and the router
`model.layers.{i}.mlp.gate.weight` `[E, embed]` (transformers fuses the experts into
`gate_up_proj` `[E, 2·moe_mlp, embed]` only in memory, converting on load and save). Expert e's
tensor fills index e of our stacked `[E, ...]` leaf (after the layer index when scanned).

Loading onto a mesh reads per device only the slice of each tensor that its
shard holds (`TensorSpec.read_block`), so a model larger than one host's
memory loads, each process reading only what its own devices need.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from jaxrl_post.models.model_config import ModelConfig, RopeScaling
from jaxrl_post.models.safetensors_io import (
  FLOAT_DTYPES,
  CheckpointError,
  CheckpointReader,
  write_checkpoint,
)
from jaxrl_post.models.transformer import CausalLM
from jaxrl_post.parallel.axes import DEFAULT_RULES, Rules, logical_sharding

__all__ = ["CheckpointError", "config_from_hf", "config_to_hf", "load_hf", "save_hf",
           "tensor_specs"]

ARCHITECTURES = {
  "llama": "LlamaForCausalLM",
  "qwen2": "Qwen2ForCausalLM",
  "qwen3": "Qwen3ForCausalLM",
  "smollm3": "SmolLM3ForCausalLM",
  "qwen3_moe": "Qwen3MoeForCausalLM",
}
# Tensors some exporters write that carry no learned state.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


# ==== config.json ↔ ModelConfig ====


def _rope_from_hf(hf: dict[str, Any]) -> tuple[float, RopeScaling | None]:
  # transformers ≥ 5 writes `rope_parameters` (theta inside); hub files and
  # older versions write `rope_theta` + `rope_scaling`.
  params = dict(hf.get("rope_parameters") or {})
  theta = params.pop("rope_theta", hf.get("rope_theta", 10_000.0))
  scaling = dict(hf.get("rope_scaling") or params)
  rope_type = scaling.pop("rope_type", scaling.pop("type", "default"))
  if rope_type == "default" or not scaling:
    return float(theta), None
  if rope_type not in ("llama3", "linear"):
    raise CheckpointError(
      f"config.json: rope_scaling type {rope_type!r} is not supported (llama3, linear)")
  known = {f.name for f in dataclasses.fields(RopeScaling)}
  return float(theta), RopeScaling(rope_type=rope_type,
                                   **{k: v for k, v in scaling.items() if k in known})


def config_from_hf(hf: dict[str, Any], *, param_dtype=jnp.float32, dtype=None,
                   attention_impl: str = "auto", **options) -> ModelConfig:
  """Builds a `ModelConfig` from a parsed HF `config.json`.

  `options` are further `ModelConfig` fields that a checkpoint does not decide
  (`scan_layers`, `remat_policy`).
  """
  model_type = hf.get("model_type")
  architectures = hf.get("architectures") or []
  if model_type not in ARCHITECTURES or any(a != ARCHITECTURES[model_type]
                                            for a in architectures):
    raise CheckpointError(
      f"config.json: unsupported architectures={architectures} / model_type={model_type!r}; "
      f"supported: {', '.join(f'{a} ({t})' for t, a in ARCHITECTURES.items())}")
  moe = _moe_from_hf(hf) if model_type == "qwen3_moe" else {}
  if hf.get("hidden_act", "silu") != "silu":
    raise CheckpointError(f"config.json: hidden_act={hf['hidden_act']!r}; only 'silu' is supported")
  if hf.get("use_sliding_window"):
    raise CheckpointError("config.json: use_sliding_window=true is not supported")
  if "sliding_attention" in (hf.get("layer_types") or []):
    raise CheckpointError("config.json: layer_types with 'sliding_attention' are not supported")
  for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
              "intermediate_size"):
    if key not in hf:
      raise CheckpointError(f"config.json: missing required key {key!r}")

  num_heads = hf["num_attention_heads"]
  num_layers = hf["num_hidden_layers"]
  theta, scaling = _rope_from_hf(hf)
  attention_bias = bool(hf.get("attention_bias", False))
  eos = hf.get("eos_token_id")
  eos = () if eos is None else (eos,) if isinstance(eos, int) else tuple(eos)
  # Class defaults of transformers when the key is absent.
  tie_default = model_type == "smollm3"
  nope_layers: tuple[int, ...] = ()
  if model_type == "smollm3":
    # `no_rope_layers[i] == 1` means layer i *uses* RoPE (transformers'
    # naming); the default is every `no_rope_layer_interval`-th layer NoPE.
    flags = hf.get("no_rope_layers")
    if flags is None:
      interval = hf.get("no_rope_layer_interval", 4)
      flags = [int((i + 1) % interval != 0) for i in range(num_layers)]
    if len(flags) != num_layers:
      raise CheckpointError(
        f"config.json: no_rope_layers has {len(flags)} entries for {num_layers} layers")
    nope_layers = tuple(i for i, uses_rope in enumerate(flags) if not uses_rope)
  return ModelConfig(
    family=model_type,
    vocab_size=hf["vocab_size"],
    embed_dim=hf["hidden_size"],
    num_layers=num_layers,
    num_heads=num_heads,
    num_kv_heads=hf.get("num_key_value_heads") or num_heads,
    head_dim=hf.get("head_dim") or hf["hidden_size"] // num_heads,
    mlp_dim=hf["intermediate_size"],
    rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
    rope_theta=theta,
    rope_scaling=scaling,
    max_position_embeddings=hf.get("max_position_embeddings", 4096),
    tie_embeddings=bool(hf.get("tie_word_embeddings", tie_default)),
    qkv_bias=True if model_type == "qwen2" else attention_bias,
    o_bias=False if model_type == "qwen2" else attention_bias,
    mlp_bias=bool(hf.get("mlp_bias", False)),
    qk_norm=model_type in ("qwen3", "qwen3_moe"),
    nope_layers=nope_layers,
    param_dtype=param_dtype,
    dtype=param_dtype if dtype is None else dtype,
    attention_impl=attention_impl,
    bos_token_id=hf.get("bos_token_id"),
    eos_token_ids=eos,
    pad_token_id=hf.get("pad_token_id"),
    **moe,
    **options,
  )


def _moe_from_hf(hf: dict[str, Any]) -> dict[str, Any]:
  """The `ModelConfig` MoE fields of a Qwen3-MoE `config.json` (HF class defaults when absent;
  transformers 5.x writes `num_local_experts`, the Hub files `num_experts`)."""
  experts = hf.get("num_experts", hf.get("num_local_experts", 128))
  if "moe_intermediate_size" not in hf:
    raise CheckpointError("config.json: missing required key 'moe_intermediate_size'")
  return dict(num_experts=int(experts), num_experts_per_tok=int(hf.get("num_experts_per_tok", 8)),
              moe_mlp_dim=int(hf["moe_intermediate_size"]),
              norm_topk_prob=bool(hf.get("norm_topk_prob", False)),
              decoder_sparse_step=int(hf.get("decoder_sparse_step", 1)),
              mlp_only_layers=tuple(hf.get("mlp_only_layers") or ()),
              router_aux_loss_coef=float(hf.get("router_aux_loss_coef", 0.001)))


def config_to_hf(config: ModelConfig, *, torch_dtype: str = "float32") -> dict[str, Any]:
  """The `config.json` dict that `transformers` reads back as the same model."""
  c = config
  if c.family == "qwen2" and (not c.qkv_bias or c.o_bias):
    raise ValueError("qwen2 always has q/k/v biases and no o_proj bias")
  if c.family != "qwen2" and c.qkv_bias != c.o_bias:
    raise ValueError(f"{c.family} has one attention_bias flag for q/k/v/o; got "
                     f"qkv_bias={c.qkv_bias}, o_bias={c.o_bias}")
  if c.qk_norm != (c.family in ("qwen3", "qwen3_moe")):
    raise ValueError(f"qk_norm={c.qk_norm} cannot be expressed for family {c.family}")
  if c.nope_layers and c.family != "smollm3":
    raise ValueError(f"nope_layers need the smollm3 family, not {c.family}")
  eos = list(c.eos_token_ids)
  hf: dict[str, Any] = {
    "architectures": [ARCHITECTURES[c.family]],
    "model_type": c.family,
    "vocab_size": c.vocab_size,
    "hidden_size": c.embed_dim,
    "num_hidden_layers": c.num_layers,
    "num_attention_heads": c.num_heads,
    "num_key_value_heads": c.num_kv_heads,
    "head_dim": c.head_dim,
    "intermediate_size": c.mlp_dim,
    "hidden_act": "silu",
    "rms_norm_eps": c.rms_norm_eps,
    "rope_theta": c.rope_theta,
    "rope_scaling": None if c.rope_scaling is None else dataclasses.asdict(c.rope_scaling),
    "max_position_embeddings": c.max_position_embeddings,
    "tie_word_embeddings": c.tie_embeddings,
    "attention_bias": c.qkv_bias if c.family != "qwen2" else False,
    "mlp_bias": c.mlp_bias,
    "bos_token_id": c.bos_token_id,
    "eos_token_id": eos[0] if len(eos) == 1 else (eos or None),
    "pad_token_id": c.pad_token_id,
    "torch_dtype": torch_dtype,
    "use_sliding_window": False,
  }
  if c.family == "smollm3":
    hf["no_rope_layers"] = [int(c.uses_rope(i)) for i in range(c.num_layers)]
  if c.family == "qwen3_moe":
    hf.update(num_experts=c.num_experts, num_experts_per_tok=c.num_experts_per_tok,
              moe_intermediate_size=c.moe_mlp_dim, norm_topk_prob=c.norm_topk_prob,
              decoder_sparse_step=c.decoder_sparse_step, mlp_only_layers=list(c.mlp_only_layers),
              router_aux_loss_coef=c.router_aux_loss_coef, output_router_logits=False)
  return hf


# ==== the tensor table ====


@dataclasses.dataclass(frozen=True)
class TensorSpec:
  """One Hugging Face tensor: its name and shape, its NNX leaf, and the layout change.

  Ours is `hf.transpose(perm).reshape(shape)`, where the reshape only splits
  axes (`[heads·head_dim]` → `[heads, head_dim]`). Stated as data rather than
  as a function, the change can also be run on a block: `read_block` maps a
  block of our layout to the HF block that bounds it, so sharded loading reads
  only what a device holds.

  Attributes:
    hf_name, hf_shape: the tensor in the checkpoint.
    path: the flat NNX state path of the leaf it fills.
    shape: our shape of this tensor (one layer's, for a stacked leaf).
    perm: HF axes in the order of ours, before the split.
    layer: with `scan_layers`, the index along the leaf's leading `layers`
      axis that this tensor fills; None for a leaf of its own.
    expert: for one expert's tensor, its index along the leaf's `[E]` axis (after
      `layers` when scanned); None otherwise.
  """

  hf_name: str
  hf_shape: tuple[int, ...]
  path: tuple[str | int, ...]
  shape: tuple[int, ...]
  perm: tuple[int, ...]
  layer: int | None = None
  expert: int | None = None

  @property
  def lead(self) -> tuple[int, ...]:
    """The indices along the leaf's stacked leading axes (layers, experts) this tensor fills."""
    return tuple(i for i in (self.layer, self.expert) if i is not None)

  def __post_init__(self):
    if sorted(self.perm) != list(range(len(self.hf_shape))):
      raise ValueError(f"{self.hf_name}: perm {self.perm} is not a permutation of "
                       f"{len(self.hf_shape)} axes")
    object.__setattr__(self, "_groups", _split_groups(
      tuple(self.hf_shape[p] for p in self.perm), self.shape, self.hf_name))

  def to_ours(self, x: np.ndarray) -> np.ndarray:
    """HF `hf_shape` → ours `shape`."""
    return x.transpose(self.perm).reshape(self.shape)

  def to_hf(self, x: np.ndarray) -> np.ndarray:
    """Ours `shape` → HF `hf_shape`."""
    return x.reshape([self.hf_shape[p] for p in self.perm]).transpose(np.argsort(self.perm))

  def read_block(self, reader: CheckpointReader, index: tuple[slice, ...]) -> np.ndarray:
    """The block `index` (unit-step slices over `shape`) of our layout, read as a slice.

    Each HF axis is read over the flat range that bounds the block's part of the
    axes it splits into (exact when the inner ones are whole, e.g. heads split,
    head_dim whole); the block is then transformed and cut to `index`.
    """
    ranges = [s.indices(n)[:2] for s, n in zip(index, self.shape)]
    hf_index = [slice(None)] * len(self.hf_shape)
    block_shape, cut = [], []
    for axis, group in zip(self.perm, self._groups):
      start, stop, shape, group_cut = _bounding_flat_range(
        [ranges[g] for g in group], [self.shape[g] for g in group])
      hf_index[axis] = slice(start, stop)
      block_shape += shape
      cut += group_cut
    block = reader.read_slice(self.hf_name, tuple(hf_index))
    return block.transpose(self.perm).reshape(block_shape)[tuple(cut)]


def _split_groups(transposed: tuple[int, ...], shape: tuple[int, ...], name: str
                  ) -> tuple[tuple[int, ...], ...]:
  """Which of our axes each transposed HF axis splits into (row-major reshape)."""
  groups, axis = [], 0
  for size in transposed:
    group, product = [], 1
    while axis < len(shape) and (not group or product < size):
      group.append(axis)
      product *= shape[axis]
      axis += 1
    if product != size:
      raise ValueError(f"{name}: shape {list(shape)} does not split the axes {list(transposed)}")
    groups.append(group)
  if any(shape[a] != 1 for a in range(axis, len(shape))):
    raise ValueError(f"{name}: shape {list(shape)} does not split the axes {list(transposed)}")
  if groups:  # Trailing size-1 axes of ours belong to the last group.
    groups[-1] += list(range(axis, len(shape)))
  return tuple(tuple(g) for g in groups)


def _bounding_flat_range(ranges, sizes):
  """The flat range of one HF axis that bounds a block of the axes it splits into.

  Args:
    ranges: `(start, stop)` per axis of the group, in order.
    sizes: the group's axis sizes (the HF axis has their product).

  Returns:
    `(start, stop, block_shape, cut)`: reading `[start, stop)` and reshaping it
    to `block_shape` gives a block that `cut` (slices per axis) trims to `ranges`.
    Leading axes of extent 1 move the range; the first wider axis bounds it and
    the axes after it are read whole.
  """
  strides = [int(np.prod(sizes[k + 1:], dtype=np.int64)) for k in range(len(sizes))]
  start, block_shape, cut = 0, [], []
  for k, (a, b) in enumerate(ranges):
    start += a * strides[k]
    if b - a == 1 and k < len(ranges) - 1:
      block_shape.append(1)
      cut.append(slice(0, 1))
      continue
    block_shape.append(b - a)
    cut.append(slice(0, b - a))
    for (a2, b2), size in zip(ranges[k + 1:], sizes[k + 1:]):
      block_shape.append(size)
      cut.append(slice(a2, b2))
    return start, start + (b - a) * strides[k], block_shape, cut
  return 0, 1, [], []  # A scalar.


def _identity(hf_shape: tuple[int, ...]) -> dict[str, Any]:
  return dict(hf_shape=hf_shape, shape=hf_shape, perm=tuple(range(len(hf_shape))))


def _linear(out_dim: int, in_dim: int, out_shape: tuple[int, ...] = ()) -> dict[str, Any]:
  """HF `[out, in]` → ours `[in, *out_shape]` (`[in, out]` when out_shape is empty)."""
  return dict(hf_shape=(out_dim, in_dim), shape=(in_dim, *(out_shape or (out_dim,))),
              perm=(1, 0))


def _linear_in(out_dim: int, in_shape: tuple[int, ...]) -> dict[str, Any]:
  """HF `[out, prod(in_shape)]` → ours `[*in_shape, out]` (o_proj)."""
  return dict(hf_shape=(out_dim, int(np.prod(in_shape))), shape=(*in_shape, out_dim), perm=(1, 0))


def _reshape(shape: tuple[int, ...]) -> dict[str, Any]:
  """HF `[prod(shape)]` → ours `shape` (per-head biases)."""
  return dict(hf_shape=(int(np.prod(shape)),), shape=shape, perm=(0,))


def tensor_specs(config: ModelConfig) -> list[TensorSpec]:
  """Every tensor of the Hugging Face checkpoint of `CausalLM(config)`, with its NNX leaf.

  Unrolled layers: layer i's weights are the leaves `("layers", i, ...)`. With
  `config.scan_layers` the layers are one stacked module, so every layer's
  tensor names the same leaf `("layers", ...)` (shape `[num_layers, ...]`)
  and fills index `layer` of its leading axis.
  """
  c = config
  d, n, k, h, f, v = (c.embed_dim, c.num_heads, c.num_kv_heads, c.head_dim, c.mlp_dim,
                      c.vocab_size)
  scanned = bool(getattr(c, "scan_layers", False))
  specs = [TensorSpec("model.embed_tokens.weight", path=("embed",), **_identity((v, d)))]
  for i in range(c.num_layers):
    hf = f"model.layers.{i}"
    leaf = ("layers",) if scanned else ("layers", i)
    layer = i if scanned else None

    def spec(name, path, layout, hf=hf, leaf=leaf, layer=layer):
      return TensorSpec(f"{hf}.{name}", path=(*leaf, *path), layer=layer, **layout)

    specs += [
      spec("input_layernorm.weight", ("input_norm", "scale"), _identity((d,))),
      spec("post_attention_layernorm.weight", ("post_attn_norm", "scale"), _identity((d,))),
      spec("self_attn.q_proj.weight", ("attn", "q_proj"), _linear(n * h, d, (n, h))),
      spec("self_attn.k_proj.weight", ("attn", "k_proj"), _linear(k * h, d, (k, h))),
      spec("self_attn.v_proj.weight", ("attn", "v_proj"), _linear(k * h, d, (k, h))),
      spec("self_attn.o_proj.weight", ("attn", "o_proj"), _linear_in(d, (n, h))),
    ]
    if c.is_moe_layer(i):
      fe = c.moe_mlp_dim
      specs.append(spec("mlp.gate.weight", ("mlp", "router"), _linear(c.num_experts, d)))
      for e in range(c.num_experts):
        for name, leaf_name, layout in (("gate_proj", "w_gate", _linear(fe, d)),
                                        ("up_proj", "w_up", _linear(fe, d)),
                                        ("down_proj", "w_down", _linear(d, fe))):
          specs.append(TensorSpec(f"{hf}.mlp.experts.{e}.{name}.weight",
                                  path=(*leaf, "mlp", leaf_name), layer=layer, expert=e,
                                  **layout))
    else:
      specs += [
        spec("mlp.gate_proj.weight", ("mlp", "gate_proj"), _linear(f, d)),
        spec("mlp.up_proj.weight", ("mlp", "up_proj"), _linear(f, d)),
        spec("mlp.down_proj.weight", ("mlp", "down_proj"), _linear(d, f)),
      ]
    if c.qkv_bias:
      specs += [
        spec("self_attn.q_proj.bias", ("attn", "q_bias"), _reshape((n, h))),
        spec("self_attn.k_proj.bias", ("attn", "k_bias"), _reshape((k, h))),
        spec("self_attn.v_proj.bias", ("attn", "v_bias"), _reshape((k, h))),
      ]
    if c.o_bias:
      specs.append(spec("self_attn.o_proj.bias", ("attn", "o_bias"), _identity((d,))))
    if c.qk_norm:
      specs += [
        spec("self_attn.q_norm.weight", ("attn", "q_norm", "scale"), _identity((h,))),
        spec("self_attn.k_norm.weight", ("attn", "k_norm", "scale"), _identity((h,))),
      ]
    if c.mlp_bias:
      specs += [spec(f"mlp.{name}_proj.bias", ("mlp", f"{name}_bias"), _identity((size,)))
                for name, size in (("gate", f), ("up", f), ("down", d))]
  specs.append(TensorSpec("model.norm.weight", path=("final_norm", "scale"), **_identity((d,))))
  if not c.tie_embeddings:
    specs.append(TensorSpec("lm_head.weight", path=("lm_head",), **_linear(v, d)))
  return specs


# ==== load / save ====


def _check_names(reader: CheckpointReader, specs: list[TensorSpec], config: ModelConfig):
  expected = {s.hf_name for s in specs}
  present = set(reader.names())
  missing = sorted(expected - present)
  if missing:
    raise CheckpointError(
      f"{reader.directory}: missing {len(missing)} tensor(s) that the {config.family} "
      f"config.json requires, e.g. {missing[:5]}")
  ignorable = {n for n in present if n.endswith(_IGNORED_SUFFIXES)}
  if config.tie_embeddings:
    ignorable.add("lm_head.weight")  # Some exporters write the tied copy.
  unexpected = sorted(present - expected - ignorable)
  if unexpected:
    raise CheckpointError(
      f"{reader.directory}: {len(unexpected)} unexpected tensor(s) that the "
      f"{config.family} config.json does not use, e.g. {unexpected[:5]}")


def _check_tensor(reader: CheckpointReader, spec: TensorSpec):
  dtype_name, shape = reader.dtype_and_shape(spec.hf_name)
  if shape != spec.hf_shape:
    raise CheckpointError(f"tensor {spec.hf_name}: shape {list(shape)} in the checkpoint, "
                          f"{list(spec.hf_shape)} expected from config.json")
  if dtype_name not in FLOAT_DTYPES:
    raise CheckpointError(f"tensor {spec.hf_name}: dtype {dtype_name} in the checkpoint, "
                          f"a floating-point dtype expected")


def _lead_shape(specs: list[TensorSpec]) -> tuple[int, ...]:
  """Sizes of a leaf's stacked leading axes (layers and/or experts) filled by `specs`."""
  n = len(specs[0].lead)
  return tuple(max(s.lead[a] for s in specs) + 1 for a in range(n))


def _leaf_reader(reader: CheckpointReader, specs: list[TensorSpec], dtype: np.dtype):
  """`index -> block` of one leaf in `dtype`, for `jax.make_array_from_callback`.

  `specs` fill the leaf: one tensor, or one per layer and/or expert of a stacked leaf (then the
  index's first slices pick the layers / experts, and only those are read). Devices that hold
  the same block (replicas over a mesh axis) share one read.
  """
  lead_shape = _lead_shape(specs)
  by_lead = {s.lead: s for s in specs}
  blocks: dict[tuple[tuple[int, int], ...], np.ndarray] = {}

  def read(index: tuple[slice, ...]) -> np.ndarray:
    shape = (*lead_shape, *specs[0].shape)
    key = tuple(s.indices(n)[:2] for s, n in zip(index, shape))
    if key in blocks:
      return blocks[key]
    if not lead_shape:
      block = np.asarray(specs[0].read_block(reader, index), dtype=dtype)
    else:
      ranges, inner = key[:len(lead_shape)], index[len(lead_shape):]
      block = None
      for lead in np.ndindex(*[stop - start for start, stop in ranges]):
        part = by_lead[tuple(start + i for (start, _), i in zip(ranges, lead))].read_block(
          reader, inner)
        if block is None:
          block = np.empty((*[stop - start for start, stop in ranges], *part.shape), dtype)
        block[lead] = part  # Cast on assignment: no second copy of the tensor's block.
    blocks[key] = block
    return block

  return read


def load_hf(path: str | os.PathLike, *, dtype=jnp.float32, compute_dtype=None,
            mesh: Mesh | None = None, rules: Rules = DEFAULT_RULES,
            attention_impl: str = "auto", scan_layers: bool = False,
            remat_policy: str | None = None, logit_chunk_size: int | None = None) -> CausalLM:
  """Loads a Hugging Face checkpoint directory as a `CausalLM`.

  Reads `config.json`, then the weights from `model.safetensors` or the shards
  of `model.safetensors.index.json` (memory-mapped), checking every tensor's
  name, shape and dtype before any is read.

  Without a mesh, each tensor is read whole, converted, cast to `dtype` and put
  on the default device before the next is read. With a mesh, each parameter is
  made by `jax.make_array_from_callback` with the `NamedSharding` its logical
  axes map to: the callback reads, for each device this process addresses,
  only the slice of the checkpoint tensor(s) that device's shard holds. No host
  ever copies a whole sharded tensor, and each device receives only its shard.

  Args:
    path: directory with `config.json` and safetensors weights.
    dtype: parameter dtype (e.g. `jnp.bfloat16`; the checkpoint's own dtype is
      cast).
    compute_dtype: activation dtype (default: `dtype`).
    mesh: if given, parameters are created sharded on it (see above).
    rules: logical-axis rules (see `jaxrl_post.parallel.axes`).
    attention_impl: see `ModelConfig.attention_impl`.
    scan_layers: stack the layers' parameters (`ModelConfig.scan_layers`);
      layer i's tensors fill index i of each leaf's leading axis.
    remat_policy: `ModelConfig.remat_policy` (default: the config's).
    logit_chunk_size: `ModelConfig.logit_chunk_size` (default: the config's).

  Returns:
    The model; `model(tokens)` gives `float32[batch, time, vocab]` logits.

  Raises:
    CheckpointError: missing `config.json` or weights, unsupported
      architecture, missing or unexpected tensors, shape or dtype mismatch.
  """
  path = Path(path)
  config_path = path / "config.json"
  if not config_path.exists():
    raise CheckpointError(f"{path}: no config.json (is this a Hugging Face checkpoint directory?)")
  options = {}
  if scan_layers:  # Only when asked: keeps working with configs that lack the field.
    options["scan_layers"] = True
  if remat_policy is not None:
    options["remat_policy"] = remat_policy
  if logit_chunk_size is not None:
    options["logit_chunk_size"] = logit_chunk_size
  config = config_from_hf(json.loads(config_path.read_text()), param_dtype=dtype,
                          dtype=compute_dtype, attention_impl=attention_impl, **options)
  reader = CheckpointReader(path)
  specs = tensor_specs(config)
  _check_names(reader, specs, config)
  for spec in specs:
    _check_tensor(reader, spec)

  abstract = nnx.eval_shape(lambda: CausalLM(config, rngs=nnx.Rngs(0)))
  graphdef, abstract_state = nnx.split(abstract)
  variables = dict(nnx.to_flat_state(abstract_state))
  leaves: dict[tuple, list[TensorSpec]] = {}
  for spec in specs:
    leaves.setdefault(spec.path, []).append(spec)
  unfilled = sorted(map(str, set(variables) - set(leaves)))
  if unfilled:
    raise ValueError(f"CausalLM leaves {unfilled[:5]} have no Hugging Face tensor in "
                     "tensor_specs")
  param_dtype = np.dtype(config.param_dtype)
  loaded = []
  for leaf_path, leaf_specs in leaves.items():
    variable = variables[leaf_path]
    shape = tuple(variable.get_value().shape)
    lead_shape = _lead_shape(leaf_specs)
    expected = (*lead_shape, *leaf_specs[0].shape)
    if shape != expected or sorted(s.lead for s in leaf_specs) != list(np.ndindex(*lead_shape)):
      raise ValueError(f"leaf {leaf_path}: model shape {list(shape)}, the tensor table gives "
                       f"{list(expected)} ({leaf_specs[0].hf_name}, ...)")
    if mesh is not None:
      sharding = logical_sharding(variable.get_metadata()["out_sharding"], mesh, rules,
                                  shape=shape)
      array = jax.make_array_from_callback(
        shape, sharding, _leaf_reader(reader, leaf_specs, param_dtype), dtype=param_dtype)
    else:
      value = np.empty(expected, param_dtype)
      for s in leaf_specs:
        value[s.lead] = s.to_ours(reader.read(s.hf_name))
      array = jnp.asarray(value)
      del value  # The host copy goes before the next tensor is read.
    loaded.append((leaf_path, variable.replace(array)))
  return nnx.merge(graphdef, nnx.from_flat_state(loaded))


_TORCH_DTYPE_NAMES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


def save_hf(model: CausalLM, path: str | os.PathLike, *, dtype=None,
            max_shard_bytes: int | None = None) -> None:
  """Writes `model` as a Hugging Face checkpoint directory.

  `transformers.AutoModelForCausalLM.from_pretrained(path)` loads the result.

  Args:
    model: the model.
    path: output directory (created).
    dtype: dtype of the saved tensors (default: the parameter dtype).
    max_shard_bytes: split into shards with an index above this size.
  """
  config = model.config
  dtype = np.dtype(config.param_dtype if dtype is None else dtype)
  if dtype.name not in _TORCH_DTYPE_NAMES:
    raise ValueError(f"cannot save dtype {dtype}; use one of {sorted(_TORCH_DTYPE_NAMES)}")
  variables = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
  tensors = {}
  for spec in tensor_specs(config):
    value = variables[spec.path].get_value()
    if spec.lead:  # A stacked leaf: only this layer / expert comes to the host.
      value = value[spec.lead]
    value = np.asarray(jax.device_get(value))
    tensors[spec.hf_name] = np.ascontiguousarray(spec.to_hf(value).astype(dtype))
  path = Path(path)
  write_checkpoint(path, tensors, max_shard_bytes=max_shard_bytes)
  hf_config = config_to_hf(config, torch_dtype=_TORCH_DTYPE_NAMES[dtype.name])
  (path / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
