"""Losses of an autoregressive dense detector: three-head SFT and count-reward GRPO with Clip-Cov.

Falcon Perception-HD (arXiv 2608.18881). A rollout is a chain of T actions (padded); action t
has a multi-head log-prob whose terms `HeadLogProbs` holds separately, `float32[b, T]` each
(`sampling.detection.chain_logprobs` computes them from the detector's logits):

  log π(a_t|s_t) = log π_LM(w_t|h_t) + 1[w_t=<coord>]·log π_coord(x_t,y_t|h_t)
                                     + 1[w_t=<size>]·log π_size(w_t,h_t|h_t)

SFT (`detection_sft_loss`) is the teacher-forced NLL of all three terms over the batch's valid
actions. GRPO (`detection_grpo_loss`), one update per group of G rollouts (on-policy):

  Â_i = (r_i − μ_G) / (σ_G + ε)                    population std (`advantages.group_advantages`,
                                                     ddof=0; computed by the caller)
  w_t = sg(π_θ(a_t|s_t) / π_rollout(a_t|s_t))       engine-mismatch IS weight (LM + coord terms),
                                                     optionally truncated
  ℓ_t = −w_t·Â_i·(k^LM_t·log π_LM,t + k^coord_t·log π_coord,t)     k = Clip-Cov keep masks
  L   = Σ_{i,t} ℓ_t / (B·T_max)                      Dr.GRPO fixed denominator (B rollouts in the
                                                     step, T_max the decode budget)

The size head decodes greedily in RL, so its term is absent (no gradient); the existence token's
LM term is detached by the caller (`chain_logprobs(detach_existence=True)`) and excluded from
the LM Clip-Cov population. Arrays in, `(loss, aux)` out; the model forward is the method's.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxrl_post.losses.aggregation import nll_loss
from jaxrl_post.losses.policy import sampler_importance_weights


class HeadLogProbs(NamedTuple):
  """Per-action log-prob terms, `float32[b, T]`, 0 where the head is not used or masked."""

  lm: jax.Array  # log π_LM(w_t) (existence tokens detached if asked).
  coord: jax.Array  # 1[w=<coord>]·(log π_x + log π_y).
  size: jax.Array  # 1[w=<size>]·(log π_w + log π_h).
  existence: jax.Array  # bool: the action is an existence token (<found> / <none>).

  @property
  def total(self) -> jax.Array:
    return self.lm + self.coord + self.size


def detection_sft_loss(lp: HeadLogProbs, mask: jax.Array, num_tokens: jax.Array
                       ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Teacher-forcing NLL of all three heads: L = −Σ_{i,t} m_{i,t}·(lm + coord + size)_{i,t} / N.

  Args:
    lp: the chain's `HeadLogProbs` `[b, T]`.
    mask: `[b, T]` valid actions.
    num_tokens: N, the whole batch's valid actions (so micro-batches add up exactly).

  Returns:
    `(loss, aux)` with the per-head parts `nll_lm`, `nll_coord`, `nll_size` (each additive over
    micro-batches, like the loss; they sum to it).
  """
  aux = dict(nll_lm=nll_loss(lp.lm, mask, num_tokens),
             nll_coord=nll_loss(lp.coord, mask, num_tokens),
             nll_size=nll_loss(lp.size, mask, num_tokens))
  return nll_loss(lp.total, mask, num_tokens), aux


def clip_cov_keep(logp: jax.Array, adv: jax.Array, active: jax.Array, key: jax.Array, *,
                  ratio: float, low: float, high: float) -> jax.Array:
  """Clip-Cov keep mask (Cui et al. 2025, arXiv 2505.22617; verl's `compute_policy_loss_clip_cov`).

  Cov_t = (log π_t − mean(log π)) · (A_t − mean(A)), means over the active tokens; among the
  tokens with low < Cov_t < high, `max(⌊ratio·N⌋, 1)` (N active tokens) are picked uniformly at
  random and their policy-gradient term is detached (keep = 0).

  Args:
    logp: `[b, T]` log-probs of one head (values only are used).
    adv: `[b, T]` advantages.
    active: `[b, T]` bool, tokens where this head acts.
    key: PRNG key of the random pick.
    ratio, low, high: selection ratio and covariance bounds (arXiv 2608.18881: 2e-4; LM [1, 5],
      coord [10, 50]).

  Returns:
    `float32[b, T]` 1 = keep, 0 = detached.
  """
  logp = jax.lax.stop_gradient(logp)
  a = active.astype(jnp.float32)
  n = jnp.sum(a)
  mean_lp = jnp.sum(logp * a) / jnp.maximum(n, 1.0)
  mean_adv = jnp.sum(adv * a) / jnp.maximum(n, 1.0)
  cov = (logp - mean_lp) * (adv - mean_adv)
  eligible = active & (cov > low) & (cov < high)
  clip_num = jnp.maximum(jnp.floor(ratio * n), 1.0)
  score = jnp.where(eligible, jax.random.uniform(key, logp.shape), jnp.inf).reshape(-1)
  rank = jnp.argsort(jnp.argsort(score)).reshape(logp.shape)
  drop = eligible & (rank < clip_num)
  return 1.0 - drop.astype(jnp.float32)


def categorical_entropy(logits: jax.Array, temperature: float = 1.0) -> jax.Array:
  """H = −Σ_k p_k log p_k of softmax(z/τ) over the last axis: `[..., K]` → `[...]`."""
  logp = jax.nn.log_softmax(logits / temperature, axis=-1)
  return -jnp.sum(jnp.exp(logp) * logp, axis=-1)


class GRPOAux(NamedTuple):
  """Metrics of one `detection_grpo_loss` call; all float32 scalars.

  Only `pg_loss` is a sum over the global normaliser B·T_max and adds up over micro-batches; the
  others are means or maxima over the call's own tokens (and Clip-Cov picks its tokens among the
  call's own), so the method runs the update as one micro-batch.
  """

  pg_loss: jax.Array
  is_weight_mean: jax.Array
  is_weight_max: jax.Array
  clipcov_lm_frac: jax.Array  # Detached share of active LM tokens.
  clipcov_coord_frac: jax.Array
  entropy_coord: jax.Array  # Mean entropy of the x and y distributions at <coord> actions.
  logp_mismatch: jax.Array  # Mean |log π_train − log π_rollout| over valid actions.

  # The fields that add up over micro-batches (`make_train_step` sums the aux it is given).
  ADDITIVE = ("pg_loss",)

  def additive(self) -> dict[str, jax.Array]:
    """The additive fields, as a metrics dict for `make_train_step`."""
    return {k: getattr(self, k) for k in self.ADDITIVE}


def detection_grpo_loss(lp: HeadLogProbs, *, mask: jax.Array, coord_actions: jax.Array,
                        adv: jax.Array, rollout_logp: jax.Array, num_sequences: jax.Array,
                        max_tokens: int, key: jax.Array | None = None,
                        coord_entropy: jax.Array | None = None, clip_cov: bool = True,
                        clip_cov_ratio: float = 2e-4,
                        clip_cov_lm: tuple[float, float] = (1.0, 5.0),
                        clip_cov_coord: tuple[float, float] = (10.0, 50.0),
                        is_max: float | None = None) -> tuple[jax.Array, GRPOAux]:
  """Falcon Perception-HD's policy-gradient loss (module docstring), `(loss, GRPOAux)`.

  Args:
    lp: the trainer's `HeadLogProbs` `[B, T]` of the rollouts' actions, at the sampling τ (the
      existence tokens' LM term detached by the caller if asked).
    mask: `[B, T]` valid actions.
    coord_actions: `[B, T]` bool, valid `<coord>` actions (where the coordinate head acts).
    adv: `[B]` group advantages Â_i.
    rollout_logp: `[B, T]` the sampler's LM + coord log-probs of the actions.
    num_sequences: B, the rollouts in the whole step.
    max_tokens: T_max of the Dr.GRPO denominator (the decode budget).
    key: PRNG key of Clip-Cov's random pick (needed when `clip_cov`).
    coord_entropy: `[B, T]` entropy of π_x plus that of π_y per action (for the
      `entropy_coord` metric, their mean at `<coord>` actions; 0 when None).
    clip_cov: apply Clip-Cov masks per head (LM over the non-existence actions, coord over
      `coord_actions`).
    clip_cov_ratio, clip_cov_lm, clip_cov_coord: its ratio and per-head bounds.
    is_max: truncate the IS weight at this value (None: untruncated, as in the paper).
  """
  valid = mask > 0
  acted = lp.lm + lp.coord  # The size head is greedy: no term, no gradient.
  weight = sampler_importance_weights(jax.lax.stop_gradient(acted), rollout_logp,
                                      mask.astype(jnp.float32), min_weight=None,
                                      max_weight=is_max)
  adv = jnp.broadcast_to(adv[:, None], mask.shape).astype(jnp.float32)
  lm_active = valid & ~lp.existence
  if clip_cov:
    k_lm, k_coord = jax.random.split(key)
    keep_lm = clip_cov_keep(lp.lm, adv, lm_active, k_lm, ratio=clip_cov_ratio, low=clip_cov_lm[0],
                            high=clip_cov_lm[1])
    keep_coord = clip_cov_keep(lp.coord, adv, coord_actions, k_coord, ratio=clip_cov_ratio,
                               low=clip_cov_coord[0], high=clip_cov_coord[1])
  else:
    keep_lm = keep_coord = jnp.ones_like(adv)
  per_token = -weight * adv * (keep_lm * lp.lm + keep_coord * lp.coord)
  loss = jnp.sum(jnp.where(valid, per_token, 0.0)) / (num_sequences * max_tokens)

  def frac(keep, active):
    return jnp.sum((1 - keep) * active) / jnp.maximum(jnp.sum(active), 1)

  n_coord = jnp.maximum(jnp.sum(coord_actions), 1)
  entropy = (jnp.zeros(()) if coord_entropy is None else
             jnp.sum(jnp.where(coord_actions, coord_entropy, 0.0)) / n_coord / 2)
  n_valid = jnp.maximum(jnp.sum(valid), 1)
  mismatch = jnp.abs(jax.lax.stop_gradient(acted) - rollout_logp)
  aux = GRPOAux(
    pg_loss=loss, is_weight_mean=jnp.sum(jnp.where(valid, weight, 0.0)) / n_valid,
    is_weight_max=jnp.max(jnp.where(valid, weight, 0.0)),
    clipcov_lm_frac=frac(keep_lm, lm_active), clipcov_coord_frac=frac(keep_coord, coord_actions),
    entropy_coord=entropy,
    logp_mismatch=jnp.sum(jnp.where(valid, mismatch, 0.0)) / n_valid)
  return loss, aux
