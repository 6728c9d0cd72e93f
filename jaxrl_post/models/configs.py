"""Model presets, chosen by name: `get_model_config("qwen3_0p6b")`.

The real sizes copy the public Hugging Face `config.json` of each checkpoint
(architecture fields only; weights are loaded with `models.hf.load_hf`).
`tiny` is for unit tests and `small` (~3.3M parameters, a character-level
vocabulary) trains from scratch on 2 CPU cores.

The real presets run their layers under `scan` (`scan_layers=True`): compile
time then does not grow with depth. They also rematerialise each layer in the
backward pass (`remat_policy="full"`) and score in logit chunks of 128
positions (`logit_chunk_size`), so that an update at a real batch fits.
`tiny` and `small` keep the unrolled layers, whose per-layer cache buffers
decode measurably faster on CPU (docs/benchmarks.md, Sampler); `get_model_config(name,
scan_layers=...)` flips either.
"""

from __future__ import annotations

from jaxrl_post.models.model_config import ModelConfig, RopeScaling
from jaxrl_post.registry import Registry

MODEL_PRESETS: Registry = Registry("model preset")

_LLAMA3_VOCAB = 128_256
_QWEN_VOCAB = 151_936


def _preset(name):
  return MODEL_PRESETS.register(name)


# Numerics of the real sizes (ModelConfig documents each): layers under scan,
# each layer recomputed in the backward pass, and logits formed 128 completion
# positions at a time (16 rows × 128 × 151,936 float32 logits = 1.2 GB per
# tensor; the whole 768-token completion would be 7.5 GB).
_REAL_SIZE = dict(scan_layers=True, remat_policy="full", logit_chunk_size=128)


# `tiny` and `small` keep scan_layers=False (the default): the unrolled layers
# with one cache buffer per layer are the faster decode path on CPU, where
# these two presets run (measured ≈ 7.2k vs 4.2k tok/s with a stacked cache).
@_preset("tiny")
def tiny() -> ModelConfig:
  return ModelConfig(family="llama", vocab_size=256, embed_dim=64, num_layers=2, num_heads=4,
                     num_kv_heads=2, head_dim=16, mlp_dim=128, rms_norm_eps=1e-6,
                     max_position_embeddings=512)


@_preset("small")
def small() -> ModelConfig:
  return ModelConfig(family="qwen3", vocab_size=256, embed_dim=256, num_layers=4, num_heads=8,
                     num_kv_heads=4, head_dim=32, mlp_dim=768, qk_norm=True, tie_embeddings=True,
                     rope_theta=10_000.0, max_position_embeddings=1024)


def _qwen3(**kw) -> ModelConfig:
  base = dict(family="qwen3", vocab_size=_QWEN_VOCAB, num_kv_heads=8, head_dim=128,
              rms_norm_eps=1e-6, rope_theta=1_000_000.0, max_position_embeddings=40_960,
              qk_norm=True, bos_token_id=151_643, eos_token_ids=(151_645,), **_REAL_SIZE)
  return ModelConfig(**(base | kw))


@_preset("qwen3_0p6b")
def qwen3_0p6b() -> ModelConfig:
  return _qwen3(embed_dim=1024, num_layers=28, num_heads=16, mlp_dim=3072, tie_embeddings=True)


@_preset("qwen3_1p7b")
def qwen3_1p7b() -> ModelConfig:
  return _qwen3(embed_dim=2048, num_layers=28, num_heads=16, mlp_dim=6144, tie_embeddings=True)


@_preset("qwen3_4b")
def qwen3_4b() -> ModelConfig:
  return _qwen3(embed_dim=2560, num_layers=36, num_heads=32, mlp_dim=9728, tie_embeddings=True)


@_preset("qwen3_8b")
def qwen3_8b() -> ModelConfig:
  return _qwen3(embed_dim=4096, num_layers=36, num_heads=32, mlp_dim=12_288, tie_embeddings=False)


@_preset("qwen2p5_1p5b")
def qwen2p5_1p5b() -> ModelConfig:
  # Qwen/Qwen2.5-1.5B (base). Qwen2 has q/k/v biases by construction.
  return ModelConfig(family="qwen2", vocab_size=_QWEN_VOCAB, embed_dim=1536, num_layers=28,
                     num_heads=12, num_kv_heads=2, head_dim=128, mlp_dim=8960, rms_norm_eps=1e-6,
                     rope_theta=1_000_000.0, max_position_embeddings=131_072,
                     tie_embeddings=True, qkv_bias=True, bos_token_id=151_643,
                     eos_token_ids=(151_643,), **_REAL_SIZE)


def _llama3_rope(factor: float) -> RopeScaling:
  return RopeScaling(rope_type="llama3", factor=factor, low_freq_factor=1.0,
                     high_freq_factor=4.0, original_max_position_embeddings=8192)


@_preset("llama3p2_1b")
def llama3p2_1b() -> ModelConfig:
  return ModelConfig(family="llama", vocab_size=_LLAMA3_VOCAB, embed_dim=2048, num_layers=16,
                     num_heads=32, num_kv_heads=8, head_dim=64, mlp_dim=8192, rms_norm_eps=1e-5,
                     rope_theta=500_000.0, rope_scaling=_llama3_rope(32.0),
                     max_position_embeddings=131_072, tie_embeddings=True,
                     bos_token_id=128_000, eos_token_ids=(128_001,), **_REAL_SIZE)


@_preset("llama3p1_8b")
def llama3p1_8b() -> ModelConfig:
  return ModelConfig(family="llama", vocab_size=_LLAMA3_VOCAB, embed_dim=4096, num_layers=32,
                     num_heads=32, num_kv_heads=8, head_dim=128, mlp_dim=14_336,
                     rms_norm_eps=1e-5, rope_theta=500_000.0, rope_scaling=_llama3_rope(8.0),
                     max_position_embeddings=131_072, tie_embeddings=False,
                     bos_token_id=128_000, eos_token_ids=(128_001,), **_REAL_SIZE)


@_preset("smollm3_3b")
def smollm3_3b() -> ModelConfig:
  # HF `no_rope_layers` is [1, 1, 1, 0] * 9 where 1 means "uses RoPE": every
  # fourth layer (3, 7, ..., 35) is NoPE.
  return ModelConfig(family="smollm3", vocab_size=_LLAMA3_VOCAB, embed_dim=2048, num_layers=36,
                     num_heads=16, num_kv_heads=4, head_dim=128, mlp_dim=11_008,
                     rms_norm_eps=1e-6, rope_theta=5_000_000.0, max_position_embeddings=65_536,
                     tie_embeddings=True, nope_layers=tuple(range(3, 36, 4)),
                     bos_token_id=128_000, eos_token_ids=(128_012,), pad_token_id=128_004,
                     **_REAL_SIZE)


@_preset("qwen3_moe_tiny")
def qwen3_moe_tiny() -> ModelConfig:
  # A random Qwen3-MoE for tests and the CPU proxy studies (configs/moe_proxy.py): 16 experts,
  # top-2, every layer sparse, character-level vocabulary like `small`.
  return ModelConfig(family="qwen3_moe", vocab_size=256, embed_dim=64, num_layers=2,
                     num_heads=4, num_kv_heads=2, head_dim=16, mlp_dim=128, qk_norm=True,
                     max_position_embeddings=512, num_experts=16, num_experts_per_tok=2,
                     moe_mlp_dim=32, norm_topk_prob=True, router_aux_loss_coef=0.001)


@_preset("qwen3_30b_a3b")
def qwen3_30b_a3b() -> ModelConfig:
  # Qwen/Qwen3-30B-A3B config.json: 48 layers, 128 experts, top-8, every layer sparse.
  return _qwen3(family="qwen3_moe", embed_dim=2048, num_layers=48, num_heads=32, num_kv_heads=4,
                mlp_dim=6144, tie_embeddings=False, max_position_embeddings=40_960,
                num_experts=128, num_experts_per_tok=8, moe_mlp_dim=768, norm_topk_prob=True,
                decoder_sparse_step=1, router_aux_loss_coef=0.001, moe_impl="ragged")


def get_model_config(name: str, **overrides) -> ModelConfig:
  """The preset `name`, with dataclass fields replaced by `overrides`.

  Example: `get_model_config("qwen3_0p6b", num_layers=2, dtype="bfloat16")`, or
  `get_model_config("qwen3_8b", scan_layers=False, remat_policy="dots")`.
  """
  config = MODEL_PRESETS.get(name)()
  if "num_layers" in overrides and "nope_layers" not in overrides:
    # A reduced-depth variant keeps the NoPE pattern of the layers it keeps.
    overrides["nope_layers"] = tuple(i for i in config.nope_layers if i < overrides["num_layers"])
  if "num_layers" in overrides and "mlp_only_layers" not in overrides:
    overrides["mlp_only_layers"] = tuple(i for i in config.mlp_only_layers
                                         if i < overrides["num_layers"])
  return config.replace(**overrides)
