"""Reducing a `[batch, time]` per-token loss to a scalar: the loss-aggregation modes.

The four modes of the Dr.GRPO / DAPO axis (verl's `loss_agg_mode` names; GRPO arXiv 2402.03300,
DAPO 2503.14476, Dr.GRPO 2503.20783).
With `L[i,t]` the per-token loss, `m[i,t]` the mask and `n_i = Σ_t m[i,t]`:

  token-mean               Σ_i Σ_t m·L / N_tok                        (DAPO, TRL "dapo"/"bnpo")
  seq-mean-token-mean      Σ_i [Σ_t m·L / max(n_i, 1)] / N_seq        (GRPO, TRL "grpo")
  seq-mean-token-sum       Σ_i Σ_t m·L / N_seq
  seq-mean-token-sum-norm  Σ_i Σ_t m·L / (N_seq · L_max)              (Dr.GRPO, TRL "dr_grpo")

Every mode is a sum over tokens divided by a *global* normaliser (`N_tok` tokens, `N_seq`
sequences, `L_max` a fixed length budget). Computing the normaliser once over the whole batch and
passing it in makes the loss additive: the sum of the micro-batch losses, each computed with the
full-batch normalisers, equals the full-batch loss, and so do the gradients. `loss_normalizers`
computes them. When they are left out they are taken from the `mask` that is passed, which is
the full batch under `jax.jit`, also when that batch is sharded over devices.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from jaxrl_post.registry import Registry

ArrayLike = jax.Array | float | int

LOSS_AGG_MODES: Registry = Registry("loss_agg_mode")


class Normalizers(NamedTuple):
  """Global counts that every aggregation mode divides by."""

  num_tokens: jax.Array  # shape=(), float32: Σ_{i,t} m[i,t] over the whole batch.
  num_sequences: jax.Array  # shape=(), float32: rows with at least one valid token.


@jax.jit
def loss_normalizers(mask: jax.Array) -> Normalizers:
  """Counts valid tokens and non-empty sequences of a (full) batch.

  Call this once on the whole batch before splitting it into micro-batches, and pass the fields
  to `aggregate` / `policy_loss` as `num_tokens` and `num_sequences`. Inside `shard_map` `psum`
  the fields over the batch axes first.

  Args:
    mask: `[batch, time]` loss mask (bool or float weights).

  Returns:
    `Normalizers(num_tokens, num_sequences)`, float32 scalars.

  Examples:
    >>> import jax.numpy as jnp
    >>> n = loss_normalizers(jnp.array([[1, 1, 0], [0, 0, 0], [1, 0, 0]]))
    >>> int(n.num_tokens), int(n.num_sequences)
    (3, 2)
  """
  chex.assert_rank(mask, 2)
  mask = jnp.asarray(mask, jnp.float32)
  per_row = jnp.sum(mask, axis=-1)
  return Normalizers(jnp.sum(per_row), jnp.sum((per_row > 0).astype(jnp.float32)))


def _masked(values: jax.Array, mask: jax.Array) -> jax.Array:
  # `where` rather than a product: padding may hold inf/NaN, and inf·0 is NaN.
  return jnp.where(mask > 0, values * mask, 0.0)


def _safe(denominator: ArrayLike) -> jax.Array:
  return jnp.maximum(jnp.asarray(denominator, jnp.float32), 1.0)


@LOSS_AGG_MODES.register("token-mean")
def _token_mean(values, mask, num_tokens, num_sequences, max_tokens):
  del num_sequences, max_tokens
  return jnp.sum(_masked(values, mask)) / _safe(num_tokens)


@LOSS_AGG_MODES.register("seq-mean-token-mean")
def _seq_mean_token_mean(values, mask, num_tokens, num_sequences, max_tokens):
  del num_tokens, max_tokens
  per_seq = jnp.sum(_masked(values, mask), axis=-1) / _safe(jnp.sum(mask, axis=-1))
  return jnp.sum(per_seq) / _safe(num_sequences)


@LOSS_AGG_MODES.register("seq-mean-token-sum")
def _seq_mean_token_sum(values, mask, num_tokens, num_sequences, max_tokens):
  del num_tokens, max_tokens
  return jnp.sum(_masked(values, mask)) / _safe(num_sequences)


@LOSS_AGG_MODES.register("seq-mean-token-sum-norm")
def _seq_mean_token_sum_norm(values, mask, num_tokens, num_sequences, max_tokens):
  del num_tokens
  return jnp.sum(_masked(values, mask)) / (_safe(num_sequences) * max_tokens)


@functools.partial(jax.jit, static_argnames=("mode", "max_tokens"))
def aggregate(
    values: jax.Array,
    mask: jax.Array,
    *,
    mode: str,
    num_tokens: ArrayLike | None = None,
    num_sequences: ArrayLike | None = None,
    max_tokens: int | None = None,
) -> jax.Array:
  """Reduces a per-token quantity to a scalar with one of the loss-aggregation modes.

  token-mean: Σ m·L / N_tok;  seq-mean-token-mean: Σ_i [Σ_t m·L / max(n_i, 1)] / N_seq;
  seq-mean-token-sum: Σ m·L / N_seq;  seq-mean-token-sum-norm: Σ m·L / (N_seq · L_max).
  Each denominator is clamped below at 1 (and `L_max` must be positive), so an all-padding batch
  gives 0, not NaN.

  Args:
    values: `[batch, time]` per-token values (loss, KL, ...). Masked entries are ignored, even
      when they are not finite.
    mask: `[batch, time]` loss mask, bool or float weights.
    mode: one of `LOSS_AGG_MODES.names()`.
    num_tokens: N_tok, valid tokens in the *whole* batch; default `Σ mask`.
    num_sequences: N_seq, non-empty sequences in the whole batch; default: rows of `mask` with a
      valid token. (Rows that are all padding are not counted, so padding a batch with empty rows
      leaves the loss unchanged; this matches Tunix, and TRL whenever no row is empty.)
    max_tokens: L_max, the fixed length budget of "seq-mean-token-sum-norm"; default the padded
      width `time` (Tunix's default). TRL's Dr.GRPO uses `max_completion_length`.

  Returns:
    The aggregated scalar (float32).

  Examples:
    >>> import jax.numpy as jnp
    >>> loss = jnp.array([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    >>> mask = jnp.array([[1, 1, 1], [1, 0, 0]])
    >>> float(aggregate(loss, mask, mode="token-mean"))  # (1+2+3+4)/4
    2.5
    >>> float(aggregate(loss, mask, mode="seq-mean-token-mean"))  # (2 + 4)/2
    3.0

  References:
    Liu et al., Understanding R1-Zero-Like Training (Dr.GRPO), arXiv 2503.20783.
    Yu et al., DAPO, arXiv 2503.14476.
  """
  chex.assert_rank([values, mask], 2)
  chex.assert_equal_shape([values, mask])
  agg_fn = LOSS_AGG_MODES.get(mode)
  mask = jnp.asarray(mask, jnp.float32)
  values = jnp.asarray(values, jnp.float32)
  if num_tokens is None or num_sequences is None:
    local = loss_normalizers(mask)
    num_tokens = local.num_tokens if num_tokens is None else num_tokens
    num_sequences = local.num_sequences if num_sequences is None else num_sequences
  if max_tokens is None:
    max_tokens = values.shape[-1]
  if max_tokens <= 0:
    raise ValueError(f"max_tokens must be positive, got {max_tokens}")
  return agg_fn(values, mask, num_tokens, num_sequences, max_tokens)


def nll_loss(logp: jax.Array, mask: jax.Array, num_tokens: ArrayLike | None = None
             ) -> jax.Array:
  """Teacher-forced negative log-likelihood per token: −Σ_{i,t} m·log π(y_t) / N_tok.

  The SFT loss of every method. `logp`, `mask`: `[batch, time]` (the log-probs of the target
  tokens and which of them count); `num_tokens` the whole batch's count, so micro-batches add
  up (default: `mask.sum()`).
  """
  if num_tokens is None:
    num_tokens = jnp.sum(mask)
  return -jnp.sum(_masked(logp, mask)) / _safe(num_tokens)
