"""Decoder LMs (Llama / Qwen2 / Qwen3 / SmolLM3) and Hugging Face checkpoints."""

from jaxrl_post.models.configs import MODEL_PRESETS, get_model_config
from jaxrl_post.models.model_config import ModelConfig, RopeScaling
from jaxrl_post.models.transformer import CausalLM, KVCache, default_positions

__all__ = [
  "MODEL_PRESETS",
  "CausalLM",
  "KVCache",
  "ModelConfig",
  "RopeScaling",
  "default_positions",
  "get_model_config",
]
