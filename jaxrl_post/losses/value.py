"""PPO's clipped value loss for a per-token critic, and the explained variance of its fit.

With the critic's predictions V_j, the values V_old,j it gave when the rollout was scored, and
the λ-returns R_j of GAE (`advantages.gae_advantages`),

  L_V = ½ · Σ_j m_j · max((V_j − R_j)², (clip(V_j, V_old,j − ε_v, V_old,j + ε_v) − R_j)²) / N_tok

(PPO, arXiv 1707.06347, as implemented in OpenAI's baselines and used for LLMs by verl and
Tunix): the pessimistic maximum keeps one update from moving a value further than ε_v from
where it started unless that also increases the loss, as the ratio clip does for the policy.
N_tok is the valid-token count of the *whole* mini-batch, so the loss and every metric add up
over micro-batches (`training.train_state.make_train_step`).

The explained variance 1 − Var(R − V) / Var(R) (1: perfect, 0: no better than a constant,
negative: worse) needs variances of the whole batch, which do not add up; the aux therefore
carries additive first and second moments, and `explained_variance` combines them once summed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike


class ValueLossAux(NamedTuple):
  """Metrics of one `value_loss` call: float32 scalars, each a token sum over the global
  `num_tokens`, so all of them add up over micro-batches."""

  value_loss: jax.Array  # L_V itself.
  clip_frac: jax.Array  # share of tokens where the clipped term is the larger one.
  value_mean: jax.Array  # mean V_j.
  return_mean: jax.Array  # mean R_j                \
  return_sq_mean: jax.Array  # mean R_j²              | the explained variance's moments
  error_mean: jax.Array  # mean (R_j − V_j)          |
  error_sq_mean: jax.Array  # mean (R_j − V_j)²      /

  def additive(self) -> dict[str, jax.Array]:
    """All fields, as the metrics dict of a `make_train_step` loss."""
    return self._asdict()

  @property
  def explained_variance(self) -> jax.Array:
    """`explained_variance` of these moments (valid once they are whole-batch sums)."""
    return explained_variance(self._asdict())


def explained_variance(moments: Mapping[str, ArrayLike], eps: float = 1e-8) -> jax.Array:
  """1 − Var(R − V) / Var(R) from `ValueLossAux` moments summed over a batch's micro-batches.

  Var(x) = E[x²] − E[x]² over the batch's valid tokens. A batch whose returns do not vary
  (Var(R) ≈ 0) gives 0: no variance to explain.

  Examples:
    >>> ev = explained_variance(dict(return_mean=1.0, return_sq_mean=2.0, error_mean=0.0,
    ...                              error_sq_mean=0.25))
    >>> float(ev)   # 1 − 0.25 / (2 − 1)
    0.75
  """
  var_r = jnp.asarray(moments["return_sq_mean"]) - jnp.square(moments["return_mean"])
  var_e = jnp.asarray(moments["error_sq_mean"]) - jnp.square(moments["error_mean"])
  return jnp.where(var_r > eps, 1.0 - var_e / jnp.maximum(var_r, eps), 0.0).astype(jnp.float32)


@jax.jit
def value_loss(values: jax.Array, old_values: jax.Array, returns: jax.Array, mask: jax.Array, *,
               clip: float | jax.Array | None, num_tokens: ArrayLike | None = None,
               ) -> tuple[jax.Array, ValueLossAux]:
  """PPO's clipped value loss, token-mean over the global `num_tokens` (module docstring).

  Args:
    values: `[batch, time]` the critic's current predictions V (differentiated).
    old_values: `[batch, time]` its predictions when the rollout was scored (no gradient).
    returns: `[batch, time]` regression targets R (no gradient).
    mask: `[batch, time]` tokens that count (bool or 0/1).
    clip: ε_v ≥ 0, how far V may move from V_old before the clipped term takes over; None
      for the plain ½(V − R)².
    num_tokens: valid tokens of the whole (mini-)batch; default `Σ mask` (one micro-batch).

  Returns:
    `(loss, ValueLossAux)`.

  Examples:
    >>> loss, aux = value_loss(jnp.array([[1.0, 0.0]]), jnp.array([[0.0, 0.0]]),
    ...                        jnp.array([[2.0, 0.0]]), jnp.array([[1, 0]]), clip=0.5)
    >>> float(loss), float(aux.clip_frac)   # ½·max((1−2)², (0.5−2)²) = 1.125, clipped
    (1.125, 1.0)
  """
  chex.assert_rank([values, old_values, returns, mask], 2)
  chex.assert_equal_shape([values, old_values, returns, mask])
  valid = jnp.asarray(mask) > 0
  weight = valid.astype(jnp.float32)
  if num_tokens is None:
    num_tokens = jnp.sum(weight)
  denominator = jnp.maximum(jnp.asarray(num_tokens, jnp.float32), 1.0)
  # Padding may hold anything: zero it before it enters a square.
  v = jnp.where(valid, jnp.asarray(values, jnp.float32), 0.0)
  v_old = jax.lax.stop_gradient(jnp.where(valid, jnp.asarray(old_values, jnp.float32), 0.0))
  r = jax.lax.stop_gradient(jnp.where(valid, jnp.asarray(returns, jnp.float32), 0.0))
  unclipped = jnp.square(v - r)
  if clip is None:
    per_token, clipped_frac = unclipped, jnp.zeros_like(unclipped)
  else:
    v_clipped = v_old + jnp.clip(v - v_old, -clip, clip)
    clipped = jnp.square(v_clipped - r)
    per_token = jnp.maximum(unclipped, clipped)
    clipped_frac = (clipped > unclipped).astype(jnp.float32)

  def mean(x):
    return jnp.sum(weight * x) / denominator

  loss = 0.5 * mean(per_token)
  v_sg, error = jax.lax.stop_gradient(v), jax.lax.stop_gradient(r - v)
  aux = ValueLossAux(value_loss=loss, clip_frac=mean(clipped_frac), value_mean=mean(v_sg),
                     return_mean=mean(r), return_sq_mean=mean(jnp.square(r)),
                     error_mean=mean(error), error_sq_mean=mean(jnp.square(error)))
  return loss, jax.tree.map(jax.lax.stop_gradient, aux._replace(value_loss=loss))
