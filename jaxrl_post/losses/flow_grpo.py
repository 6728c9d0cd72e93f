"""Flow-GRPO's per-step clipped objective for SDE flow policies (arXiv 2505.05470, 2609.03528).

Over samples i and selected denoising steps t ∈ S (to be minimised):

  L = −mean_i mean_{t∈S} [ min(ρ_{i,t} Â_i, clip(ρ_{i,t}, 1 − ε, 1 + ε) Â_i) ]
      + β·mean_i mean_{t∈S} KL_{i,t}

  ρ_{i,t} = exp(ℓ^{upd}_{i,t} − ℓ^{roll}_{i,t}),   Â_i = clip(A_i, −adv_clip_max, adv_clip_max),
  KL_{i,t} = ‖μ_θ − μ_ref‖² / (2 s_t²)    (closed form, `sampling.flow_sde.step_kl`)

with ℓ the per-step Gaussian log-probs of `sampling.flow_sde.sde_step_with_logprob`. The
clipped part is `losses.policy.policy_loss` (objective "clip", token-mean aggregation, the
steps playing the tokens' role). Flow-GRPO's public configs: ε = `clip_range` = 1e-4,
`adv_clip_max` = 5, β ∈ {0, 0.01, 0.04}.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxrl_post.losses.policy import policy_loss


class FlowGRPOAux(NamedTuple):
  """Scalars (float32), means over the global count of (sample, step) pairs."""

  pg_loss: jax.Array
  kl: jax.Array  # mean KL_{i,t} (0 when no KL was given)
  clip_frac: jax.Array  # share of (i, t) with the clip active
  ratio_mean: jax.Array
  adv_clipped_frac: jax.Array  # share of samples whose |A| exceeded adv_clip_max


def flow_grpo_loss(logp: jax.Array, old_logp: jax.Array, adv: jax.Array, *,
                   mask: jax.Array | None = None, epsilon: float = 1e-4,
                   adv_clip_max: float = 5.0, kl: jax.Array | None = None, beta: float = 0.0,
                   num_steps_total: jax.Array | float | None = None
                   ) -> tuple[jax.Array, FlowGRPOAux]:
  """The Flow-GRPO loss above, `(loss, aux)`.

  Args:
    logp: `[batch, |S|]` ℓ^{upd} (differentiated).
    old_logp: `[batch, |S|]` ℓ^{roll} of the rollout policy.
    adv: `[batch]` group-normalised advantages A_i.
    mask: optional `[batch, |S|]` valid (sample, step) pairs (default all).
    epsilon: clip range ε.
    adv_clip_max: advantage clip (None: off).
    kl: optional `[batch, |S|]` closed-form KL to the reference policy.
    beta: KL coefficient β (needs `kl` when non-zero).
    num_steps_total: global count of valid (i, t) pairs (sharded / micro-batched calls:
      pass the whole batch's; default Σ mask).

  Returns:
    `(loss, FlowGRPOAux)`.

  Examples:
    >>> logp = jnp.zeros((2, 3)); adv = jnp.array([1.0, -1.0])
    >>> loss, aux = flow_grpo_loss(logp, logp, adv)   # ρ = 1: L = −mean(A) = 0
    >>> float(loss), float(aux.ratio_mean)
    (0.0, 1.0)
  """
  if kl is None and beta != 0.0:
    raise ValueError(f"flow_grpo_loss: beta={beta} needs kl")
  if mask is None:
    mask = jnp.ones(logp.shape, jnp.float32)
  mask = jnp.asarray(mask, jnp.float32)
  adv = jnp.asarray(adv, jnp.float32)
  if adv_clip_max is not None:
    clipped_adv = jnp.clip(adv, -adv_clip_max, adv_clip_max)
    adv_frac = jnp.mean((jnp.abs(adv) > adv_clip_max).astype(jnp.float32))
  else:
    clipped_adv, adv_frac = adv, jnp.zeros((), jnp.float32)
  if num_steps_total is None:
    num_steps_total = jnp.sum(mask)
  pg, aux = policy_loss(logp, old_logp, clipped_adv, mask, loss_agg_mode="token-mean",
                        objective="clip", epsilon_low=epsilon, epsilon_high=epsilon,
                        num_tokens=num_steps_total)
  loss = pg
  kl_mean = jnp.zeros((), jnp.float32)
  if kl is not None:
    kl_mean = jnp.sum(jnp.asarray(kl, jnp.float32) * mask) / num_steps_total
    loss = loss + beta * kl_mean
  return loss, FlowGRPOAux(pg_loss=pg, kl=kl_mean,
                           clip_frac=aux.clip_frac_low + aux.clip_frac_high,
                           ratio_mean=aux.ratio_mean, adv_clipped_frac=adv_frac)
