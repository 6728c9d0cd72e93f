"""Decoder LMs (Llama / Qwen2 / Qwen3 / SmolLM3), Hugging Face checkpoints, and the small
multimodal models built on them (a dense detector, a point-cloud quality rater), and PPO's
value model on the same trunk (`ValueModel`).

`subspace` (import it directly) holds GCPO's principal-subspace constraint on low-rank weight
updates (arXiv 2608.11674): bases, the projected update, overlap diagnostics,
`SUBSPACE_CONSTRAINTS`. `lora` holds low-rank adapters on the decoder's projections
(`add_lora`, `merge_lora`, `without_lora`, `LoraParam`)."""

from jaxrl_post.models.configs import MODEL_PRESETS, get_model_config
from jaxrl_post.models.lora import LoraParam, add_lora, merge_lora, without_lora
from jaxrl_post.models.model_config import REMAT_POLICIES, ModelConfig, RopeScaling
from jaxrl_post.models.perception import PerceptionConfig, PerceptionDetector
from jaxrl_post.models.point_cloud import PointCloudLM
from jaxrl_post.models.transformer import (
  CausalLM,
  KVCache,
  default_positions,
  stack_layer_params,
  unstack_layer_params,
)
from jaxrl_post.models.value import ValueModel, score_values

__all__ = [
  "MODEL_PRESETS",
  "CausalLM",
  "KVCache",
  "LoraParam",
  "ModelConfig",
  "PerceptionConfig",
  "PerceptionDetector",
  "PointCloudLM",
  "REMAT_POLICIES",
  "RopeScaling",
  "ValueModel",
  "add_lora",
  "default_positions",
  "get_model_config",
  "merge_lora",
  "score_values",
  "stack_layer_params",
  "unstack_layer_params",
  "without_lora",
]
