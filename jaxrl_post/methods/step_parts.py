"""Optional parts of a GRPO-family step, chosen by config sections (`GRPO` runs them in order).

A part is an object with any of these hooks (all optional; `method` is the running `GRPO`,
which exposes `task`, `sampler`, `scorer`, `evaluator`, `config` and the other parts):

  start(method, state)                         after the runtime is built (the starting policy)
  loader                                       attribute: replaces the shuffled data pass
  begin_step(method, state, step) -> metrics   before the step's prompts are drawn
  rewards(method, ctx) -> (verified, metrics)  replaces the verifier outcome / advantages
  transform(method, state, batch, ctx) -> (batch, metrics)   rewrites the actor batch
  after_update(method, ctx) -> metrics         after the PPO phase
  wrap_loss(loss_fn) -> loss_fn; shared_keys   adds a loss term (and its global batch scalars)
  array_state() / load_array_state(tree)       host state checkpointed with the run
  sharded_state() / load_sharded_state(tree)   device state checkpointed sharded (a critic)

`StepContext` carries what the step has produced so far. Config sections and their parts, in
the order they run:

  world_model    methods.world_model       WMRL's world-model rewards, debiased by anchors
  rubric         methods.rubric_evolution  CARE's evolving rubric rewards (replace the verifier's)
  intervention   methods.interventions     RAIL's bandit-chosen extra rollouts (enlarged groups)
  task_prior     methods.task_priors       TrajVal's learnability prior, RAPO's risk buckets
  critic         methods.critic            PPO's value model: per-token GAE advantages, its updates
  sample_scale   methods.sample_scale      RAPO's per-prompt loss scale
  replay         methods.group_replay      Headroom-Drift replay and its baselines
  regularizer    methods.cokl_regularizer  CoKL's correctness-conditioned KL
  control        methods.control_regularizer  CD-RFT's shared-control-bottleneck penalty
  moe_aux_loss_coef, fault  methods.fault_injection  MoE load-balancing loss; fault injectors
"""

from __future__ import annotations

from typing import Any, NamedTuple

from jaxrl_post.methods import (
  cokl_regularizer,
  control_regularizer,
  critic,
  fault_injection,
  group_replay,
  interventions,
  rubric_evolution,
  sample_scale,
  task_priors,
  world_model,
)


class StepContext(NamedTuple):
  """What a GRPO step has produced when a part's hook runs."""

  step: int
  records: list[dict[str, Any]]  # the step's prompts (global batch, record-major)
  rollout: Any  # `sampling.Rollout`: `group_size` completions per record
  verified: Any  # `methods.grpo.Verified`: rewards and advantages
  fresh: dict[str, Any]  # the step's own rows of the actor batch (host arrays)
  put: Any  # places a host batch on the trainer's mesh


def build_step_parts(config, task) -> dict[str, Any]:
  """The configured parts, by config section, in run order (sections set to "none" are left
  out). Each builder validates its section and raises a ValueError naming the key."""
  parts = {
    # First: its `rewards` hook sets the advantages that the later parts' transforms rescale.
    "world_model": world_model.build_world_model(config, task),
    "rubric": rubric_evolution.build_rubric_evolution(config, task),
    "intervention": interventions.build_interventions(config),
    "task_prior": task_priors.build_task_prior(config, task),
    # Before the scale: RAPO's per-prompt λ then rescales the critic's per-token advantages.
    "critic": critic.build_critic(config),
    "sample_scale": sample_scale.build_sample_scale(config),
    "replay": group_replay.build_group_replay(config),
    "regularizer": cokl_regularizer.build_regularizer(config),
    "control": control_regularizer.build_control_regularizer(config, task),
    "moe": fault_injection.build_moe_step_part(config),
  }
  parts = {name: part for name, part in parts.items() if part is not None}
  own = [name for name, part in parts.items() if hasattr(part, "rewards")]
  if own and config.get("advantage_token_weighted", False):
    # These parts compute the step's advantages themselves, without the completion lengths.
    raise ValueError(f"config.advantage_token_weighted=True with config.{own[0]}: that part "
                     "computes the step's advantages itself, unweighted; drop one of them")
  return parts
