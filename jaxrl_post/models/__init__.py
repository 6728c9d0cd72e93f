"""Decoder LMs (Llama / Qwen2 / Qwen3 / SmolLM3), Hugging Face checkpoints, and the small
multimodal models built on them (a dense detector, a point-cloud quality rater), and PPO's
value model on the same trunk (`ValueModel`).

`subspace` (import it directly) holds GCPO's principal-subspace constraint on low-rank weight
updates (arXiv 2608.11674): bases, the projected update, overlap diagnostics,
`SUBSPACE_CONSTRAINTS`. `lora` holds low-rank adapters on the decoder's projections
(`add_lora`, `merge_lora`, `without_lora`, `LoraParam`).

Beyond text (issue 30): Qwen3-MoE layers (`moe`: router, top-k experts, load-balancing loss)
and the MoE proxy builder (`moe_proxy`, arXiv 2608.10823); a flow-matching velocity MLP
(`velocity`, Flow-GRPO / LeanGRPO / CrystalGRPO); a Gaussian-mixture time-series forecaster
(`forecaster`, GTN-R); a recommender foundation model with an ordinal reward head
(`recommender`, arXiv 2608.06792)."""

from jaxrl_post.models.configs import MODEL_PRESETS, get_model_config
from jaxrl_post.models.forecaster import Forecaster, ForecasterConfig
from jaxrl_post.models.lora import LoraParam, add_lora, merge_lora, without_lora
from jaxrl_post.models.model_config import REMAT_POLICIES, ModelConfig, RopeScaling
from jaxrl_post.models.moe import MoEBlock, load_balancing_loss
from jaxrl_post.models.moe_proxy import build_moe_proxy
from jaxrl_post.models.perception import PerceptionConfig, PerceptionDetector
from jaxrl_post.models.point_cloud import PointCloudLM
from jaxrl_post.models.recommender import RecommenderFM
from jaxrl_post.models.transformer import (
  CausalLM,
  KVCache,
  default_positions,
  stack_layer_params,
  unstack_layer_params,
)
from jaxrl_post.models.value import ValueModel, score_values
from jaxrl_post.models.velocity import VelocityMLP

__all__ = [
  "CausalLM",
  "Forecaster",
  "ForecasterConfig",
  "KVCache",
  "LoraParam",
  "MODEL_PRESETS",
  "MoEBlock",
  "ModelConfig",
  "PerceptionConfig",
  "PerceptionDetector",
  "PointCloudLM",
  "REMAT_POLICIES",
  "RecommenderFM",
  "RopeScaling",
  "ValueModel",
  "VelocityMLP",
  "add_lora",
  "build_moe_proxy",
  "default_positions",
  "get_model_config",
  "load_balancing_loss",
  "merge_lora",
  "score_values",
  "stack_layer_params",
  "unstack_layer_params",
  "without_lora",
]
