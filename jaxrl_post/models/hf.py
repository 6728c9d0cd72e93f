"""Hugging Face checkpoints: `load_hf(path) -> CausalLM` and `save_hf(model, path)`.

One table (`tensor_specs`) lists every parameter: its Hugging Face name and
shape, its place in the NNX module, and the reshape between the two. Loading,
saving and the error checks all read that table, so they cannot disagree.

HF linear weights are `[out, in]`; ours are `[in, out]` with heads split out:
q_proj `[heads·head_dim, embed]` ↔ `[embed, heads, head_dim]`,
o_proj `[embed, heads·head_dim]` ↔ `[heads, head_dim, embed]`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
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
                   attention_impl: str = "xla") -> ModelConfig:
  """Builds a `ModelConfig` from a parsed HF `config.json`."""
  model_type = hf.get("model_type")
  architectures = hf.get("architectures") or []
  if model_type not in ARCHITECTURES or any(a != ARCHITECTURES[model_type]
                                            for a in architectures):
    raise CheckpointError(
      f"config.json: unsupported architectures={architectures} / model_type={model_type!r}; "
      f"supported: {', '.join(f'{a} ({t})' for t, a in ARCHITECTURES.items())}")
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
    qk_norm=model_type == "qwen3",
    nope_layers=nope_layers,
    param_dtype=param_dtype,
    dtype=param_dtype if dtype is None else dtype,
    attention_impl=attention_impl,
    bos_token_id=hf.get("bos_token_id"),
    eos_token_ids=eos,
    pad_token_id=hf.get("pad_token_id"),
  )


def config_to_hf(config: ModelConfig, *, torch_dtype: str = "float32") -> dict[str, Any]:
  """The `config.json` dict that `transformers` reads back as the same model."""
  c = config
  if c.family == "qwen2" and (not c.qkv_bias or c.o_bias):
    raise ValueError("qwen2 always has q/k/v biases and no o_proj bias")
  if c.family != "qwen2" and c.qkv_bias != c.o_bias:
    raise ValueError(f"{c.family} has one attention_bias flag for q/k/v/o; got "
                     f"qkv_bias={c.qkv_bias}, o_bias={c.o_bias}")
  if c.qk_norm != (c.family == "qwen3"):
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
  return hf


# ==== the tensor table ====


@dataclasses.dataclass(frozen=True)
class TensorSpec:
  """One parameter: HF name and shape, NNX path, and the conversions."""

  hf_name: str
  hf_shape: tuple[int, ...]
  path: tuple[str | int, ...]
  to_ours: Callable[[np.ndarray], np.ndarray]
  to_hf: Callable[[np.ndarray], np.ndarray]


def _identity(x):
  return x


def _linear(out_shape: tuple[int, ...] = ()):
  """HF `[out, in]` ↔ ours `[in, *out_shape]` (`[in, out]` when out_shape is empty)."""
  return (lambda w: w.T.reshape(w.shape[1], *(out_shape or (w.shape[0],))),
          lambda w: w.reshape(w.shape[0], -1).T)


def _linear_in(in_shape: tuple[int, ...]):
  """HF `[out, prod(in_shape)]` ↔ ours `[*in_shape, out]` (o_proj)."""
  return (lambda w: w.T.reshape(*in_shape, w.shape[0]),
          lambda w: w.reshape(-1, w.shape[-1]).T)


def _reshape(shape: tuple[int, ...]):
  return (lambda b: b.reshape(shape), lambda b: b.reshape(-1))


def tensor_specs(config: ModelConfig) -> list[TensorSpec]:
  """Every parameter of `CausalLM(config)` with its Hugging Face counterpart."""
  c = config
  d, n, k, h, f, v = (c.embed_dim, c.num_heads, c.num_kv_heads, c.head_dim, c.mlp_dim,
                      c.vocab_size)
  specs = [TensorSpec("model.embed_tokens.weight", (v, d), ("embed",), _identity, _identity)]
  for i in range(c.num_layers):
    hf_attn, hf_mlp = f"model.layers.{i}.self_attn", f"model.layers.{i}.mlp"
    attn, mlp = ("layers", i, "attn"), ("layers", i, "mlp")
    specs += [
      TensorSpec(f"model.layers.{i}.input_layernorm.weight", (d,),
                 ("layers", i, "input_norm", "scale"), _identity, _identity),
      TensorSpec(f"model.layers.{i}.post_attention_layernorm.weight", (d,),
                 ("layers", i, "post_attn_norm", "scale"), _identity, _identity),
      TensorSpec(f"{hf_attn}.q_proj.weight", (n * h, d), (*attn, "q_proj"), *_linear((n, h))),
      TensorSpec(f"{hf_attn}.k_proj.weight", (k * h, d), (*attn, "k_proj"), *_linear((k, h))),
      TensorSpec(f"{hf_attn}.v_proj.weight", (k * h, d), (*attn, "v_proj"), *_linear((k, h))),
      TensorSpec(f"{hf_attn}.o_proj.weight", (d, n * h), (*attn, "o_proj"), *_linear_in((n, h))),
      TensorSpec(f"{hf_mlp}.gate_proj.weight", (f, d), (*mlp, "gate_proj"), *_linear()),
      TensorSpec(f"{hf_mlp}.up_proj.weight", (f, d), (*mlp, "up_proj"), *_linear()),
      TensorSpec(f"{hf_mlp}.down_proj.weight", (d, f), (*mlp, "down_proj"), *_linear()),
    ]
    if c.qkv_bias:
      specs += [
        TensorSpec(f"{hf_attn}.q_proj.bias", (n * h,), (*attn, "q_bias"), *_reshape((n, h))),
        TensorSpec(f"{hf_attn}.k_proj.bias", (k * h,), (*attn, "k_bias"), *_reshape((k, h))),
        TensorSpec(f"{hf_attn}.v_proj.bias", (k * h,), (*attn, "v_bias"), *_reshape((k, h))),
      ]
    if c.o_bias:
      specs.append(TensorSpec(f"{hf_attn}.o_proj.bias", (d,), (*attn, "o_bias"), _identity,
                              _identity))
    if c.qk_norm:
      specs += [
        TensorSpec(f"{hf_attn}.q_norm.weight", (h,), (*attn, "q_norm", "scale"), _identity,
                   _identity),
        TensorSpec(f"{hf_attn}.k_norm.weight", (h,), (*attn, "k_norm", "scale"), _identity,
                   _identity),
      ]
    if c.mlp_bias:
      specs += [
        TensorSpec(f"{hf_mlp}.{name}_proj.bias", (size,), (*mlp, f"{name}_bias"), _identity,
                   _identity)
        for name, size in (("gate", f), ("up", f), ("down", d))
      ]
  specs.append(TensorSpec("model.norm.weight", (d,), ("final_norm", "scale"), _identity,
                          _identity))
  if not c.tie_embeddings:
    specs.append(TensorSpec("lm_head.weight", (v, d), ("lm_head",), *_linear()))
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


def load_hf(path: str | os.PathLike, *, dtype=jnp.float32, compute_dtype=None,
            mesh: Mesh | None = None, rules: Rules = DEFAULT_RULES,
            attention_impl: str = "xla") -> CausalLM:
  """Loads a Hugging Face checkpoint directory as a `CausalLM`.

  Reads `config.json`, then the weights from `model.safetensors` or the shards
  of `model.safetensors.index.json`, one tensor at a time: each is memory
  mapped, converted, cast to `dtype` and placed on its device(s) before the
  next is read.

  Args:
    path: directory with `config.json` and safetensors weights.
    dtype: parameter dtype.
    compute_dtype: activation dtype (default: `dtype`).
    mesh: if given, each parameter is placed with the `NamedSharding` that its
      logical axes map to under `rules`.
    rules: logical-axis rules (see `jaxrl_post.parallel.axes`).
    attention_impl: see `ModelConfig.attention_impl`.

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
  config = config_from_hf(json.loads(config_path.read_text()), param_dtype=dtype,
                          dtype=compute_dtype, attention_impl=attention_impl)
  reader = CheckpointReader(path)
  specs = tensor_specs(config)
  _check_names(reader, specs, config)

  abstract = nnx.eval_shape(lambda: CausalLM(config, rngs=nnx.Rngs(0)))
  graphdef, abstract_state = nnx.split(abstract)
  variables = dict(nnx.to_flat_state(abstract_state))
  loaded = []
  for spec in specs:
    dtype_name, shape = reader.dtype_and_shape(spec.hf_name)
    if shape != spec.hf_shape:
      raise CheckpointError(f"tensor {spec.hf_name}: shape {list(shape)} in the checkpoint, "
                            f"{list(spec.hf_shape)} expected from config.json")
    if dtype_name not in FLOAT_DTYPES:
      raise CheckpointError(f"tensor {spec.hf_name}: dtype {dtype_name} in the checkpoint, "
                            f"a floating-point dtype expected")
    variable = variables[spec.path]
    value = spec.to_ours(reader.read(spec.hf_name)).astype(config.param_dtype)
    if mesh is not None:
      sharding = logical_sharding(variable.get_metadata()["out_sharding"], mesh, rules,
                                  shape=value.shape)
      array = jax.device_put(value, sharding)
    else:
      array = jnp.asarray(value)
    loaded.append((spec.path, variable.replace(array)))
    del value  # The host copy goes before the next tensor is read.
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
    value = np.asarray(jax.device_get(variables[spec.path].get_value()))
    tensors[spec.hf_name] = np.ascontiguousarray(spec.to_hf(value).astype(dtype))
  path = Path(path)
  write_checkpoint(path, tensors, max_shard_bytes=max_shard_bytes)
  hf_config = config_to_hf(config, torch_dtype=_TORCH_DTYPE_NAMES[dtype.name])
  (path / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
