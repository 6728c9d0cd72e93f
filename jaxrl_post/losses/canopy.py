"""CANOPY's loss: outcome-only GRPO for long-horizon agents, with fault quarantine and a base KL.

CANOPY (arXiv 2609.01245) is a protocol rather than a new optimiser: make the group large enough
that most groups mix successes and failures (signal coverage), reward only full success, take
exactly one update per rollout batch (so the importance ratio is 1 and the PPO clip is inert),
and anchor the policy to the frozen base model with a KL on the action tokens. Its loss, for a
group layout `[B, G, T]` (tasks × rollouts × tokens) with action-token mask m:

  A_i = (r_i − μ_g) / (σ_g + ε)         over the surviving rollouts of the group
  L   = −Σ_{i,t} m_it A_i log π_θ(y_it) / Σ m  +  β · Σ_{i,t} m_it KL̂_it / Σ m

Both terms are pooled token means over the action tokens of the whole batch (observation and
environment tokens are masked out; the paper's ablation finds sequence-level normalisation
worse). Rollouts that hit an infrastructure fault (worker OOM, serving error) are *quarantined*:
`group_valid = 0` removes them from μ_g, σ_g, the loss and its normaliser, so the group shrinks.
Terminations the agent caused (turn limit) keep their reward 0 and stay.

PROPOSAL choices (the paper's are not known), as keyword arguments: `kl="k3"`, the estimator
exp(d) − d − 1 with d = log π_base − log π_θ (`losses.kl`); `std=True` with the population std
(ddof 0, unlike `group_advantages`'s default Bessel correction: quarantine makes groups small and
uneven, and the population std keeps |A| ≤ √(n − 1) bounded for tiny groups); ε = 1e-6.

The loss is the REINFORCE form of the ratio-1 surrogate: same gradient as the clipped PPO loss at
q = 1, −Σ m A ∇log π / Σ m, without needing `old_logp`. Group sizing (signal coverage
P_sig = 1 − p^n − (1 − p)^n and the minimum n) is a separate, data-side choice.

`GROUP_LOSSES` names full group-layout losses; "canopy" is `canopy_loss`.

Reference: Pu et al., Explore More, Drift Less: Outcome-Only Reinforcement Learning Can Suffice
for Long-Horizon Interactive Agents (CANOPY), arXiv 2609.01245.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxrl_post.advantages import group_advantages
from jaxrl_post.losses.kl import KL_ESTIMATORS, kl_estimate
from jaxrl_post.registry import Registry

ArrayLike = jax.Array | float | int

GROUP_LOSSES: Registry = Registry("group loss")


class CanopyAux(NamedTuple):
  """Metrics of `canopy_loss`; scalars (float32)."""

  pg_loss: jax.Array  # −Σ m A logp / Σ m.
  kl: jax.Array  # Σ m KL̂ / Σ m, before β (loss = pg_loss + β·kl).
  num_valid_rows: jax.Array  # Rollouts that survived quarantine.
  num_tokens: jax.Array  # Σ m, action tokens of the surviving rollouts.
  coverage: jax.Array  # Share of groups (with a surviving rollout) whose rewards are mixed.


def _check(logp, base_logp, rewards, action_mask, group_valid):
  if logp.ndim != 3:
    raise ValueError(f"logp must be [B, G, T], got shape {tuple(logp.shape)}")
  for name, x in (("base_logp", base_logp), ("action_mask", action_mask)):
    if x.shape != logp.shape:
      raise ValueError(f"{name} has shape {tuple(x.shape)}; expected {tuple(logp.shape)} "
                       "(logp's, [B, G, T])")
  for name, x in (("rewards", rewards), ("group_valid", group_valid)):
    if x.shape != logp.shape[:2]:
      raise ValueError(f"{name} has shape {tuple(x.shape)}; expected {tuple(logp.shape[:2])} "
                       "(one per rollout, [B, G])")


@functools.partial(jax.jit, static_argnames=("std", "eps"))
def canopy_advantages(rewards: jax.Array, group_valid: jax.Array, *, std: bool = True,
                      eps: float = 1e-6) -> jax.Array:
  """GRPO advantages over the rollouts that survived quarantine, `[B, G]`.

  A_i = (r_i − μ_g)/(σ_g + ε) with μ_g, σ_g (population std) over the rows with group_valid = 1;
  A_i = r_i − μ_g when `std` is False; A = 0 on quarantined rows and in groups without spread.

  Args:
    rewards: `[B, G]` outcome rewards (values on quarantined rows are ignored, NaN included;
      a NaN on a surviving row counts as quarantined).
    group_valid: `[B, G]` 1 = the rollout counts, 0 = quarantined (infrastructure fault).
    std: divide by σ_g + ε (PROPOSAL: True).
    eps: ε > 0.

  Returns:
    `[B, G]` float32 advantages (stop-gradient).

  Examples:
    >>> import jax.numpy as jnp
    >>> adv = canopy_advantages(jnp.array([[1.0, 0.0, 0.0, 1.0]]),
    ...                         jnp.array([[1, 1, 1, 0]]), eps=0.0)
    >>> [round(x, 4) for x in adv[0].tolist()]  # μ = 1/3, σ = √2/3 over the first three
    [1.4142, -0.7071, -0.7071, 0.0]

  References:
    Pu et al., CANOPY, arXiv 2609.01245.  Shao et al., GRPO, arXiv 2402.03300.
  """
  rewards = jnp.asarray(rewards, jnp.float32)
  group_valid = jnp.asarray(group_valid)
  if rewards.ndim != 2 or group_valid.shape != rewards.shape:
    raise ValueError(f"rewards and group_valid must both be [B, G], got "
                     f"{tuple(rewards.shape)} and {tuple(group_valid.shape)}")
  if eps < 0:
    raise ValueError(f"eps must be ≥ 0, got {eps}")
  b, g = rewards.shape
  # A NaN reward on a surviving row means "no score": it is treated like a quarantined row.
  valid = (group_valid > 0) & ~jnp.isnan(rewards)
  # `group_advantages` treats NaN as "missing": a quarantined row leaves μ and σ.
  flat = jnp.where(valid, rewards, jnp.nan).reshape(b * g)
  ids = jnp.repeat(jnp.arange(b, dtype=jnp.int32), g)
  if std:
    # Population std; a group without spread gets A = 0 also for ε = 0 (no 0/0).
    centred = group_advantages(flat, ids, num_groups=b, std="none")
    sq = jax.ops.segment_sum(jnp.square(centred), ids, num_segments=b)
    n = jax.ops.segment_sum(valid.reshape(-1).astype(jnp.float32), ids, num_segments=b)
    sd = (jnp.sqrt(sq / jnp.maximum(n, 1.0)) + eps)[ids]
    adv = jnp.where(sd > 0, centred / jnp.where(sd > 0, sd, 1.0), 0.0)
  else:
    adv = group_advantages(flat, ids, num_groups=b, std="none")
  return jax.lax.stop_gradient(jnp.where(valid.reshape(-1), adv, 0.0).reshape(b, g))


@jax.jit
def group_coverage(rewards: jax.Array, group_valid: jax.Array) -> jax.Array:
  """Realised signal coverage: share of groups whose surviving rollouts have unequal rewards.

  A group contributes a GRPO gradient only when its rewards are mixed (max > min over the
  surviving rows); groups with no surviving rollout are left out of the share (0 if none is
  left). Its expectation for success rate p and group size n is P_sig = 1 − p^n − (1 − p)^n.

  Args:
    rewards: `[B, G]` rewards.
    group_valid: `[B, G]` 1 = the rollout counts.

  Returns:
    Scalar float32 in [0, 1].

  Examples:
    >>> import jax.numpy as jnp
    >>> round(float(group_coverage(jnp.array([[1., 0.], [1., 1.], [0., 1.]]),
    ...                            jnp.array([[1, 1], [1, 1], [1, 0]]))), 4)  # only group 0
    0.3333
  """
  rewards = jnp.asarray(rewards, jnp.float32)
  valid = (jnp.asarray(group_valid) > 0) & ~jnp.isnan(rewards)
  hi = jnp.max(jnp.where(valid, rewards, -jnp.inf), axis=-1)
  lo = jnp.min(jnp.where(valid, rewards, jnp.inf), axis=-1)
  alive = jnp.any(valid, axis=-1)
  mixed = alive & (hi > lo)
  return jnp.sum(mixed) / jnp.maximum(jnp.sum(alive), 1).astype(jnp.float32)


@functools.partial(jax.jit, static_argnames=("kl", "std", "eps"))
def _canopy_loss(logp, base_logp, rewards, action_mask, group_valid, beta, num_tokens, *, kl,
                 std, eps):
  valid = (group_valid > 0) & ~jnp.isnan(rewards)
  adv = canopy_advantages(rewards, group_valid, std=std, eps=eps)
  m = jnp.where(valid[..., None] & (action_mask > 0), action_mask, 0).astype(jnp.float32)
  tokens = jnp.sum(m) if num_tokens is None else jnp.asarray(num_tokens, jnp.float32)
  denom = jnp.maximum(tokens, 1.0)
  on = m > 0
  # `where`, not a product: padding log-probs may be ±inf or NaN, and inf·0 is NaN.
  lp = jnp.where(on, logp, 0.0)
  pg = -jnp.sum(jnp.where(on, adv[..., None] * lp * m, 0.0)) / denom
  kl_tok = kl_estimate(lp, jnp.where(on, base_logp, 0.0), estimator=kl)
  kl_term = jnp.sum(jnp.where(on, kl_tok * m, 0.0)) / denom
  aux = CanopyAux(pg, kl_term, jnp.sum(valid).astype(jnp.float32), jnp.sum(m),
                  group_coverage(rewards, group_valid))
  return pg + beta * kl_term, aux


@GROUP_LOSSES.register("canopy")
def canopy_loss(
    logp: jax.Array,
    base_logp: jax.Array,
    rewards: jax.Array,
    action_mask: jax.Array,
    group_valid: jax.Array,
    *,
    beta: ArrayLike,
    kl: str = "k3",
    std: bool = True,
    eps: float = 1e-6,
    num_tokens: ArrayLike | None = None,
) -> tuple[jax.Array, CanopyAux]:
  """CANOPY's pooled token-mean GRPO loss with a KL anchor to the frozen base model.

  L = −Σ_{i,t} m_it A_i log π_θ(y_it) / Σ m + β Σ_{i,t} m_it KL̂(π_θ, π_base)_it / Σ m,
  m = action_mask · group_valid, A = `canopy_advantages` (GRPO over the surviving rollouts).
  ∇L at β = 0 is −Σ m A ∇log π / Σ m, the ratio-1 PPO gradient.

  Jittable: `kl`, `std`, `eps` are static, `beta` and `num_tokens` may be traced.

  Args:
    logp: `[B, G, T]` log π_θ of the sampled tokens (differentiated).
    base_logp: `[B, G, T]` log-probs of the frozen base model.
    rewards: `[B, G]` outcome rewards (paper: 1 = full success, else 0; SWE: −0.2 no patch).
    action_mask: `[B, G, T]` 1 on the agent's action tokens (0 on observations, padding).
    group_valid: `[B, G]` 0 for fault-quarantined rollouts, 1 otherwise (a NaN reward also
      quarantines its rollout).
    beta: KL coefficient β ≥ 0 (paper: 1e-4 AppWorld, 1e-2 SWE).
    kl: estimator name in `KL_ESTIMATORS` (PROPOSAL: "k3").
    std: divide the advantage by the group std (PROPOSAL: True, population std).
    eps: ε added to the std.
    num_tokens: Σ m over the whole batch, for exact micro-batching (default: this call's Σ m).

  Returns:
    `(loss, CanopyAux)`.

  Examples:
    >>> import jax.numpy as jnp
    >>> logp = jnp.log(jnp.full((1, 2, 2), 0.5))
    >>> loss, aux = canopy_loss(logp, logp, jnp.array([[1.0, 0.0]]), jnp.ones((1, 2, 2)),
    ...                         jnp.ones((1, 2)), beta=0.1)
    >>> round(float(loss), 6), float(aux.kl), float(aux.coverage)  # A = ±1: the pg terms cancel
    (0.0, 0.0, 1.0)

  References:
    Pu et al., Explore More, Drift Less: Outcome-Only Reinforcement Learning Can Suffice for
    Long-Horizon Interactive Agents (CANOPY), arXiv 2609.01245.
    Shao et al., GRPO, arXiv 2402.03300.
  """
  logp = jnp.asarray(logp)
  base_logp = jnp.asarray(base_logp)
  rewards = jnp.asarray(rewards)
  action_mask = jnp.asarray(action_mask)
  group_valid = jnp.asarray(group_valid)
  _check(logp, base_logp, rewards, action_mask, group_valid)
  if kl not in KL_ESTIMATORS:
    raise ValueError(f"unknown kl estimator {kl!r}; valid: {', '.join(KL_ESTIMATORS.names())}")
  if isinstance(beta, (int, float)) and beta < 0:
    raise ValueError(f"beta must be ≥ 0, got {beta}")
  return _canopy_loss(logp, base_logp, rewards, action_mask, group_valid,
                      jnp.asarray(beta, jnp.float32), num_tokens, kl=kl, std=bool(std),
                      eps=float(eps))
