"""Cumulative-logit ordinal reward model with clipped, self-normalised IPS weights.

The reward model of "Progressive Alignment of Recommender Foundation Model through Multi-Phase
Post-Training" (arXiv 2608.06792) regresses the depth a user reaches in a K-level consumption
funnel (impression → click → … → paid completion; K = 6) and is debiased with inverse-propensity
weights from an exposure-propensity head. The paper's ordinal link, clip constant and
normalisation were not found; our PROPOSAL, implemented here:

  P(level > k | u, i) = σ(s(u, i) − b_k),  k = 0 … K−2,  b_0 < b_1 < … < b_{K−2}
  P(level = k) = P(level > k−1) − P(level > k)       (P(level > −1) = 1, P(level > K−1) = 0)
  r(u, i) = E[level] = Σ_k P(level > k)             (the reward, in [0, K−1])
  w = min(1 / p̂(i | u), c),  w̃ = w / mean_batch(w)
  L = Σ_n w̃_n · (−log P(level = y_n)) / Σ_n w̃_n    (self-normalised: Σ w̃ = n)

The thresholds are `ordered_thresholds(raw)`: b_0 = raw_0, b_k = b_{k−1} + softplus(raw_k)
(+ a small gap), so any real parameter vector gives ordered thresholds.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

_FAR = 1e6  # Stand-in for ±∞ thresholds at both ends of the funnel (finite gradients).
DEFAULT_IPS_CLIP = 10.0  # c: not found in the paper (PROPOSAL).


def ordered_thresholds(raw: jax.Array, min_gap: float = 1e-3) -> jax.Array:
  """`[K−1]` ordered thresholds from unconstrained `raw` `[K−1]`.

    b_0 = raw_0,  b_k = b_{k−1} + softplus(raw_k) + min_gap

  `min_gap` keeps neighbouring thresholds apart in float32 too (a tie would give its level
  probability 0 and an infinite NLL).

  Examples:
    >>> [round(b, 4) for b in ordered_thresholds(jnp.zeros(2)).tolist()]  # softplus(0) = log 2
    [0.0, 0.6941]
  """
  return jnp.concatenate([raw[:1], raw[:1] + jnp.cumsum(jax.nn.softplus(raw[1:]) + min_gap)])


def exceed_probs(score: jax.Array, thresholds: jax.Array) -> jax.Array:
  """`P(level > k) = σ(s − b_k)`: `[..., K−1]` for scores `[...]` and thresholds `[K−1]`."""
  return jax.nn.sigmoid(score[..., None] - thresholds)


def expected_level(score: jax.Array, thresholds: jax.Array) -> jax.Array:
  """The reward r = E[level] = Σ_k σ(s − b_k), `[...]`, in [0, K−1].

  Examples:
    >>> float(expected_level(jnp.array(0.0), jnp.zeros(5)))  # five σ(0) = 0.5
    2.5
  """
  return jnp.sum(exceed_probs(score, thresholds), axis=-1)


def level_log_probs(score: jax.Array, thresholds: jax.Array) -> jax.Array:
  """`log P(level = k)`, `[..., K]`, computed stably.

  With a = s − b_{k−1} and d = b_k − b_{k−1} > 0,
  σ(a) − σ(a − d) = σ(a)·σ(d − a)·(1 − e^{−d}), so
  log P(level = k) = log σ(s − b_{k−1}) + log σ(b_k − s) + log(1 − e^{−(b_k − b_{k−1})}),
  with b_{−1} = −∞ and b_{K−1} = +∞ (each missing term is 0).

  Examples:
    >>> p = jnp.exp(level_log_probs(jnp.array(0.3), jnp.array([-1.0, 0.0, 2.0])))
    >>> round(float(p.sum()), 6)
    1.0
  """
  far = jnp.full((1,), _FAR, thresholds.dtype)
  lower = jnp.concatenate([-far, thresholds])  # b_{k−1}, k = 0 … K−1
  upper = jnp.concatenate([thresholds, far])  # b_k
  s = score[..., None]
  return (jax.nn.log_sigmoid(s - lower) + jax.nn.log_sigmoid(upper - s)
          + jnp.log(-jnp.expm1(-(upper - lower))))


def ips_weights(propensity: jax.Array, mask: jax.Array | None = None, *,
                clip: float = DEFAULT_IPS_CLIP, eps: float = 1e-12) -> jax.Array:
  """Clipped, self-normalised inverse-propensity weights w̃ = w / mean(w), w = min(1/p̂, c).

  The mean runs over the valid (`mask`) entries of the whole array; masked entries get 0.

  Args:
    propensity: `[...]` estimated exposure propensities p̂ (in (0, 1]).
    mask: `[...]` valid entries (default all).
    clip: c, the largest raw weight (the paper's value: not found; 10 is a PROPOSAL).
    eps: floor of p̂ before the division.

  Examples:
    >>> w = ips_weights(jnp.array([0.5, 0.25, 0.01]), clip=10.0)  # (2, 4, 10) / (16 / 3)
    >>> [round(x, 4) for x in w.tolist()]
    [0.375, 0.75, 1.875]
  """
  if clip <= 0:
    raise ValueError(f"clip={clip}: the IPS clip constant must be > 0")
  mask = jnp.ones(propensity.shape, bool) if mask is None else mask.astype(bool)
  w = jnp.where(mask, jnp.minimum(1.0 / jnp.maximum(propensity, eps), clip), 0.0)
  return w / (jnp.sum(w) / jnp.maximum(jnp.sum(mask), 1))


class OrdinalAux(NamedTuple):
  nll: jax.Array  # unweighted mean NLL over valid entries
  accuracy: jax.Array  # share of valid entries whose most likely level is the observed one
  mean_weight: jax.Array  # mean of the weights over valid entries
  max_weight: jax.Array


def ordinal_nll(score: jax.Array, thresholds: jax.Array, level: jax.Array,
                weights: jax.Array | None = None, mask: jax.Array | None = None, *,
                total_weight: ArrayLike | None = None) -> tuple[jax.Array, OrdinalAux]:
  """IPS-weighted cumulative-logit NLL: Σ w·(−log P(level = y)) / Σ w.

  Args:
    score: `[...]` ordinal scores s(u, i).
    thresholds: `[K−1]` ordered thresholds (`ordered_thresholds`).
    level: `[...]` int observed levels in [0, K−1].
    weights: `[...]` per-entry weights (`ips_weights`; default 1).
    mask: `[...]` valid entries (default all).
    total_weight: Σ w over the whole batch (default: this call's), so that micro-batch
      losses sum to the full-batch one.

  Returns:
    `(loss, OrdinalAux)`.

  Examples:
    >>> loss, _ = ordinal_nll(jnp.zeros(2), jnp.array([0.0]), jnp.array([0, 1]))
    >>> round(float(loss), 4)  # both levels have probability σ(0) = 1/2
    0.6931
  """
  mask = jnp.ones(score.shape, bool) if mask is None else mask.astype(bool)
  weights = jnp.ones(score.shape, jnp.float32) if weights is None else weights
  weights = jnp.where(mask, weights, 0.0)
  logp = level_log_probs(score, thresholds)
  nll = -jnp.take_along_axis(logp, level[..., None].astype(jnp.int32), axis=-1)[..., 0]
  nll = jnp.where(mask, nll, 0.0)
  total = jnp.sum(weights) if total_weight is None else total_weight
  loss = jnp.sum(weights * nll) / jnp.maximum(total, 1e-12)
  count = jnp.maximum(jnp.sum(mask), 1)
  hit = jnp.where(mask, jnp.argmax(logp, axis=-1) == level, False)
  return loss, OrdinalAux(nll=jnp.sum(nll) / count, accuracy=jnp.sum(hit) / count,
                          mean_weight=jnp.sum(weights) / count,
                          max_weight=jnp.max(jnp.where(mask, weights, -jnp.inf)))
