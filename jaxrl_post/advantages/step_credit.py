"""Step-level credit: advantages per step (turn, action, stage) instead of one per rollout.

Outcome advantages (`advantages.outcome`) give every token of a rollout the same A_i. The
step-credit estimators of the RL family (DRACO, Temporal GRPO, FACTOR's TD credit) return one
advantage per *step* of each rollout, `[B, G, S]` (prompts × group × padded steps), and
`steps_to_tokens` spreads them over the tokens of each step. A token's step comes from the
trajectory layout the multi-turn sampler already records: `step_ids[..., t]` is the step of
token t and −1 on tokens that belong to no step (observations, tool echoes, padding — DRACO's
"gap tokens"), which get advantage 0.

`STEP_CREDIT` names the estimators. They take different inputs (rubric verdict counts, stage
completion times, value estimates), so an entry is called with the keyword inputs its
docstring lists and always returns `[B, G, S]` float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl_post.registry import Registry

STEP_CREDIT: Registry = Registry("step credit")


@jax.jit
def steps_to_tokens(step_adv: jax.Array, step_ids: jax.Array) -> jax.Array:
  """Broadcasts per-step advantages to the tokens of each step.

  A[..., t] = step_adv[..., step_ids[..., t]] where 0 ≤ step_ids < S, else 0.

  Args:
    step_adv: `[..., S]` advantage of each step.
    step_ids: `[..., T]` int step index of each token; −1 (or any id outside `[0, S)`) on
      tokens outside every step. Leading dimensions equal `step_adv`'s.

  Returns:
    `[..., T]` float32 token advantages.

  Examples:
    >>> import jax.numpy as jnp
    >>> steps_to_tokens(jnp.array([1.5, 0.75]), jnp.array([0, 0, -1, 1, 1, 1, 1, -1])).tolist()
    [1.5, 1.5, 0.0, 0.75, 0.75, 0.75, 0.75, 0.0]
  """
  step_adv = jnp.asarray(step_adv, jnp.float32)
  step_ids = jnp.asarray(step_ids, jnp.int32)
  if step_adv.shape[:-1] != step_ids.shape[:-1]:
    raise ValueError(f"step_ids has leading shape {tuple(step_ids.shape[:-1])}; expected "
                     f"{tuple(step_adv.shape[:-1])} (step_adv's, without the step axis)")
  num_steps = step_adv.shape[-1]
  inside = (step_ids >= 0) & (step_ids < num_steps)
  picked = jnp.take_along_axis(step_adv, jnp.clip(step_ids, 0, num_steps - 1), axis=-1)
  return jnp.where(inside, picked, 0.0)
