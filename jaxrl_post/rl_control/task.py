"""`ControlTask`: one environment of the inner RL loop and what reward evolution knows of it.

The environment modules build it (`envs` for gymnax classic control, `brax_envs` for brax) and
`ppo` / `adapter` consume it; it lives here so that both builders import it from one place
and `envs` (which dispatches "brax/..." names to `brax_envs`) is the only module that imports
another builder.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import jax.numpy as jnp

from jaxrl_post.rewards.proposers import TaskInfo

FeatureFn = Callable[[jnp.ndarray, jnp.ndarray, jnp.ndarray, jnp.ndarray], dict]


@dataclasses.dataclass(frozen=True, eq=False)
class ControlTask:
  """A gymnax environment with everything the reward-evolution loop needs to know.

  Attributes:
    name: gymnax id, e.g. "CartPole-v1", or "brax/<env>" (see `brax_envs`).
    env: the gymnax environment (or a `brax_envs.GymnaxBrax` with the same interface).
    env_params: its default parameters.
    discrete: categorical actions (else a diagonal Gaussian policy).
    action_dim: number of actions (discrete) or action dimensions (continuous).
    action_scale: continuous actions are clipped to [−scale, scale] by the env.
    feature_spec: feature name → per-sample shape (`()` here; `(d,)` vectors for brax).
    feature_docs: feature name → meaning and units.
    features: `(obs [B, O], action [B] | [B, A], next_obs [B, O], terminated [B]) -> {name:
      [B] | [B, d]}` with `next_obs` the terminal observation on the last step of an episode
      (for brax, a `BraxObservation` pytree rather than an array).
    task: the task and its fitness, in words.
    environment: the dynamics and episode structure, in words.
  """
  name: str
  env: Any
  env_params: Any
  discrete: bool
  action_dim: int
  action_scale: float
  feature_spec: Mapping[str, tuple[int, ...]]
  feature_docs: Mapping[str, str]
  features: FeatureFn
  task: str
  environment: str

  def task_info(self, feature_stats: Mapping[str, tuple[float, float]] | None = None
                ) -> TaskInfo:
    """What the proposer sees; `feature_stats` e.g. from `adapter.feature_statistics`."""
    return TaskInfo(task=self.task, environment=self.environment,
                    feature_spec=dict(self.feature_spec), feature_docs=dict(self.feature_docs),
                    feature_stats=dict(feature_stats or {}))
