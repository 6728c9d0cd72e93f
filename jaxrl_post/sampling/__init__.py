"""Generation for RL: a Python `Sampler` around pure jitted prefill / decode kernels."""

from jaxrl_post.sampling.kernels import filter_logits
from jaxrl_post.sampling.rollout import (
  FINISH_EOS,
  FINISH_LENGTH,
  FINISH_NAMES,
  FINISH_STOP,
  Rollout,
)
from jaxrl_post.sampling.sampler import Sampler, rollout_metrics
from jaxrl_post.sampling.scoring import (
  ScoreOutput,
  score,
  score_hidden,
  score_logits,
  score_model,
)

__all__ = [
  "FINISH_EOS",
  "FINISH_LENGTH",
  "FINISH_NAMES",
  "FINISH_STOP",
  "Rollout",
  "Sampler",
  "ScoreOutput",
  "filter_logits",
  "rollout_metrics",
  "score",
  "score_hidden",
  "score_logits",
  "score_model",
]
