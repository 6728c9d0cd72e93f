"""Generation for RL: a Python `Sampler` around pure jitted prefill / decode kernels.

Also the flow / diffusion policy's SDE step with per-step Gaussian log-probs and closed-form
KL (`flow_sde`, Flow-GRPO arXiv 2505.05470), token grammars with masked, renormalised
log-probs (`grammar`, PertMind 2608.16419), and mixed-workload rollout admission in front of
the sampler (`admission`, MISA-T 2608.11152; its simulator in `serving_sim`)."""

from jaxrl_post.sampling.admission import ADMISSION_POLICIES, RolloutScheduler
from jaxrl_post.sampling.flow_sde import (
  StepOutput,
  Trajectory,
  Wrap,
  ode_step,
  periodic_wrap,
  sample_trajectory,
  sde_step_with_logprob,
  sigma_t,
  step_kl,
  time_grid,
)
from jaxrl_post.sampling.grammar import GRAMMARS, TokenGrammar, masked_log_probs
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
  "ADMISSION_POLICIES",
  "FINISH_EOS",
  "FINISH_LENGTH",
  "FINISH_NAMES",
  "FINISH_STOP",
  "GRAMMARS",
  "Rollout",
  "RolloutScheduler",
  "Sampler",
  "ScoreOutput",
  "StepOutput",
  "TokenGrammar",
  "Trajectory",
  "Wrap",
  "filter_logits",
  "masked_log_probs",
  "ode_step",
  "periodic_wrap",
  "rollout_metrics",
  "sample_trajectory",
  "score",
  "score_hidden",
  "score_logits",
  "score_model",
  "sde_step_with_logprob",
  "sigma_t",
  "step_kl",
  "time_grid",
]
