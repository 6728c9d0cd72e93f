"""Absolute-score regression: the baseline that PCQA-R1 (arXiv 2608.18627) compares against.

A scalar head on the policy's trunk predicts a quality score ŷ per sample and is regressed on
the normalised mean opinion score y ∈ [0, 1] with the squared error.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike


def mse_loss(pred: jax.Array, target: jax.Array, num_sequences: ArrayLike | None = None
             ) -> jax.Array:
  """Squared error summed over rows, over the whole batch's row count: Σ_i (ŷ_i − y_i)² / N.

  Args:
    pred: `[batch]` predictions ŷ.
    target: `[batch]` targets y (the normalised MOS).
    num_sequences: N, the global batch's row count, so that micro-batches add up to the mean
      of the whole batch (default: `batch`).

  Returns:
    A scalar.

  Examples:
    >>> float(mse_loss(jnp.array([0.5, 1.0]), jnp.array([0.0, 1.0]), 4))
    0.0625
  """
  if num_sequences is None:
    num_sequences = pred.shape[0]
  return jnp.sum(jnp.square(pred - target)) / num_sequences
