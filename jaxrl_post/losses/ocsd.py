"""OCSD: observation-calibrated self-distillation for agentic RL (arXiv 2608.04788).

The policy re-scores its own action tokens in two *replay* views that differ only in the
environment's next observation: Full (the real observation o_{k+1}) and Observation-Ablated
(a fixed placeholder). Their difference isolates what the observation says about each token:

    e_{i,k,t} = log π_F(y_{i,k,t} | h, E^F) − log π_A(y_{i,k,t} | h, E^A)
    q_{i,k,t} = tanh(e_{i,k,t} / 2) = (π_F − π_A) / (π_F + π_A)  ∈ [−1, 1]

(the student's own log-prob cancels in e). Only the most uncertain interaction steps of each
trajectory are recalibrated; a step's uncertainty is the mean NLL of its tokens under the
rollout policy,

    u_{i,k} = −(1/T_{i,k}) Σ_t log π_θold(y_{i,k,t} | h)

and the top ρ = 20 % steps of every trajectory are kept. On a kept step the trajectory's GRPO
advantage Â_i is modulated without changing its sign (β = 0.5: a factor in [0.5, 1.5]):

    Â^OCSD_{i,k,t} = Â_i · (1 + β · sgn(Â_i) · q_{i,k,t})        (other steps: Â_i)

Tokens are laid out as a multi-turn trajectory row: `step_ids[b, t]` is the interaction step
k ≥ 0 of an action token and −1 on observation / padding tokens. "Top ρ" keeps
n_i = max(1, round_half_up(ρ · K_i)) of the K_i steps of row i (none for ρ = 0; ties: the
earlier step); the paper gives ρ but not the rounding, so this rule is our PROPOSAL, as is
scoring both replay views with the rollout (old) parameters right after the rollout.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

# The paper's values (arXiv 2608.04788): ρ = 20 % of steps, β = 0.5.
OCSD_RHO, OCSD_BETA = 0.2, 0.5


class StepStats(NamedTuple):
  """Per interaction step of each row: mean NLL u `[B, K]`, token count `[B, K]`."""

  uncertainty: jax.Array
  tokens: jax.Array


def observation_calibration(full_logp, ablated_logp, mask=None) -> jax.Array:
  """q = tanh((lp_F − lp_A) / 2), `[B, T]` float32, 0 where `mask` is False.

  Examples:
    >>> import numpy as np
    >>> q = observation_calibration(np.log([[0.6, 0.2]]), np.log([[0.2, 0.6]]))
    >>> np.round(np.asarray(q), 4).tolist()      # (π_F − π_A) / (π_F + π_A)
    [[0.5, -0.5]]
  """
  full_logp = jnp.asarray(full_logp, jnp.float32)
  ablated_logp = jnp.asarray(ablated_logp, jnp.float32)
  if full_logp.shape != ablated_logp.shape:
    raise ValueError(f"ablated_logp has shape {ablated_logp.shape}; full_logp has "
                     f"{full_logp.shape}")
  valid = jnp.ones(full_logp.shape, bool) if mask is None else jnp.asarray(mask, bool)
  diff = jnp.where(valid, full_logp - ablated_logp, 0.0)
  return jnp.where(valid, jnp.tanh(0.5 * diff), 0.0)


def _step_one_hot(step_ids, mask, num_steps: int) -> jax.Array:
  step_ids = jnp.asarray(step_ids, jnp.int32)
  valid = (step_ids >= 0) & (step_ids < num_steps)
  if mask is not None:
    valid &= jnp.asarray(mask, bool)
  return jax.nn.one_hot(jnp.where(valid, step_ids, num_steps), num_steps + 1,
                        dtype=jnp.float32)[..., :num_steps]


def step_uncertainty(old_logp, step_ids, mask=None, *, num_steps: int) -> StepStats:
  """u_{i,k} = mean over step k's action tokens of −lp_old; `num_steps` K is static.

  Args:
    old_logp: `[B, T]` rollout-policy log-probs of the sampled tokens.
    step_ids: `[B, T]` int, the interaction step of each action token, −1 elsewhere.
    mask: optional `[B, T]` bool, ANDed with `step_ids >= 0`.
    num_steps: K, an upper bound on the steps per row (ids ≥ K are ignored).

  Returns:
    `StepStats(uncertainty [B, K], tokens [B, K])`; a step with no tokens has u = −inf.

  Examples:
    >>> import numpy as np
    >>> s = step_uncertainty(np.log([[0.5, 0.5, 0.1, 1.0]]), [[0, 0, 1, -1]], num_steps=3)
    >>> np.round(np.asarray(s.uncertainty, np.float64), 3).tolist(), np.asarray(s.tokens).tolist()
    ([[0.693, 2.303, -inf]], [[2.0, 1.0, 0.0]])
  """
  old_logp = jnp.asarray(old_logp, jnp.float32)
  onehot = _step_one_hot(step_ids, mask, num_steps)  # [B, T, K]
  nll = jnp.where(onehot.sum(-1) > 0, -old_logp, 0.0)
  tokens = onehot.sum(1)
  total = jnp.einsum("bt,btk->bk", nll, onehot)
  u = jnp.where(tokens > 0, total / jnp.maximum(tokens, 1.0), -jnp.inf)
  return StepStats(u, tokens)


def select_uncertain_steps(stats: StepStats, *, rho: float = OCSD_RHO) -> jax.Array:
  """bool `[B, K]`: the n_i = max(1, round_half_up(ρ K_i)) most uncertain steps of each row
  (K_i = its steps with tokens; ties go to the earlier step). A row with no steps, or ρ = 0,
  keeps none.

  Examples:
    >>> import numpy as np
    >>> s = StepStats(np.array([[0.1, 0.9, 0.5, 0.2, 0.3, 0.8, 0.7, 0.4, 0.6, 0.0]]),
    ...               np.ones((1, 10)))
    >>> np.flatnonzero(np.asarray(select_uncertain_steps(s, rho=0.2))).tolist()
    [1, 5]
  """
  if not 0.0 <= rho <= 1.0:
    raise ValueError(f"rho={rho} must be in [0, 1]")
  u, tokens = jnp.asarray(stats.uncertainty, jnp.float32), jnp.asarray(stats.tokens)
  present = tokens > 0
  count = present.sum(-1)
  # ρ = 0 recalibrates nothing (plain GRPO); any ρ > 0 at least one step of each trajectory.
  keep = jnp.where((count > 0) & (rho > 0), jnp.maximum(1, jnp.floor(rho * count + 0.5)), 0)
  order = jnp.argsort(jnp.where(present, -u, jnp.inf), axis=-1, stable=True)
  rank = jnp.argsort(order, axis=-1, stable=True)
  return present & (rank < keep[:, None])


def ocsd_advantages(seq_adv, full_logp, ablated_logp, old_logp, step_ids, mask=None, *,
                    num_steps: int, rho: float = OCSD_RHO, beta: float = OCSD_BETA
                    ) -> jax.Array:
  """Â^OCSD `[B, T]` float32 (0 off action tokens): Â_i (1 + β sgn(Â_i) q) on the top-ρ steps.

  Args:
    seq_adv: `[B]` the trajectory's GRPO advantage Â_i.
    full_logp, ablated_logp: `[B, T]` the action tokens' log-probs under the Full and the
      Observation-Ablated replay contexts (the same policy, stop-gradient).
    old_logp: `[B, T]` the rollout policy's log-probs (the step uncertainty).
    step_ids: `[B, T]` int interaction step of each action token, −1 elsewhere.
    mask: optional `[B, T]` bool of loss tokens (ANDed with `step_ids >= 0`).
    num_steps: static upper bound K on the steps per row.
    rho, beta: the paper's ρ = 0.2 and β = 0.5.

  Every token's advantage has the sign of Â_i (|β| ≤ 1 keeps the factor ≥ 0).

  Examples:
    >>> import numpy as np
    >>> lp = np.log([[0.5, 0.5, 0.1, 0.9]])
    >>> adv = ocsd_advantages(np.array([2.0]), np.log([[0.6, 0.6, 0.6, 0.6]]),
    ...                       np.log([[0.2, 0.2, 0.2, 0.2]]), lp, [[0, 0, 1, 2]], num_steps=3,
    ...                       rho=0.2)
    >>> np.round(np.asarray(adv), 3).tolist()    # step 1 is the most uncertain: 2 (1 + 0.5·0.5)
    [[2.0, 2.0, 2.5, 2.0]]
  """
  if not 0.0 <= beta <= 1.0:
    raise ValueError(f"beta={beta} must be in [0, 1] (a larger β could flip an advantage's sign)")
  seq_adv = jnp.asarray(seq_adv, jnp.float32)
  full_logp = jnp.asarray(full_logp, jnp.float32)
  if seq_adv.shape != full_logp.shape[:1]:
    raise ValueError(f"seq_adv has shape {seq_adv.shape}; expected ({full_logp.shape[0]},) "
                     "(one advantage per trajectory row)")
  for name, x in (("old_logp", old_logp), ("step_ids", step_ids)):
    if np.shape(x) != full_logp.shape:
      raise ValueError(f"{name} has shape {jnp.shape(x)}; expected {full_logp.shape} "
                       "(full_logp's)")
  step_ids = jnp.asarray(step_ids, jnp.int32)
  onehot = _step_one_hot(step_ids, mask, num_steps)
  tokens = onehot.sum(-1) > 0
  q = observation_calibration(full_logp, ablated_logp, tokens)
  stats = step_uncertainty(old_logp, step_ids, mask, num_steps=num_steps)
  chosen = select_uncertain_steps(stats, rho=rho).astype(jnp.float32)
  on_chosen = jnp.einsum("btk,bk->bt", onehot, chosen) > 0
  a = seq_adv[:, None]
  modulated = a * (1.0 + beta * jnp.sign(a) * q)
  return jax.lax.stop_gradient(jnp.where(tokens, jnp.where(on_chosen, modulated, a), 0.0))
