"""Loss-aggregation modes: golden values, normaliser handling, padding robustness."""

import doctest
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_post.losses import aggregation
from jaxrl_post.losses.aggregation import LOSS_AGG_MODES, aggregate, loss_normalizers

# [B=2, T=3]; row 0 has 2 valid tokens, row 1 has 1.
VALUES = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], np.float32)
MASK = np.array([[1, 1, 0], [1, 0, 0]], np.float32)

# Hand derivations (Σ m·L = 1 + 2 + 4 = 7, N_tok = 3, N_seq = 2, T = 3):
#   token-mean               7 / 3                      (bug: counting padding gives 21/6 = 3.5)
#   seq-mean-token-mean      (3/2 + 4/1) / 2 = 2.75     (bug: token-mean of rows (3+4)/3)
#   seq-mean-token-sum       7 / 2 = 3.5
#   seq-mean-token-sum-norm  7 / (2·3) = 7/6
GOLDEN = {
    "token-mean": 7 / 3,
    "seq-mean-token-mean": 2.75,
    "seq-mean-token-sum": 3.5,
    "seq-mean-token-sum-norm": 7 / 6,
}


@functools.partial(jax.jit, static_argnames=("mode", "max_tokens"))
def _agg(values, mask, mode, num_tokens=None, num_sequences=None, max_tokens=None):
  return aggregate(values, mask, mode=mode, num_tokens=num_tokens, num_sequences=num_sequences,
                   max_tokens=max_tokens)


def test_registry_lists_the_four_modes():
  assert set(GOLDEN) <= set(LOSS_AGG_MODES.names())
  with pytest.raises(KeyError, match="valid names: seq-mean-token-mean"):
    aggregate(VALUES, MASK, mode="sequence-mean")


@pytest.mark.parametrize("mode", sorted(GOLDEN))
def test_golden_values(mode):
  np.testing.assert_allclose(_agg(VALUES, MASK, mode), GOLDEN[mode], rtol=1e-6)


@pytest.mark.parametrize("mode", sorted(GOLDEN))
def test_padding_garbage_and_empty_rows_are_ignored(mode):
  # Non-finite values under the mask and an all-padding row change nothing (and give no NaN grad).
  values = np.concatenate([np.where(MASK > 0, VALUES, np.nan), np.full((1, 3), np.inf)], 0)
  mask = np.concatenate([MASK, np.zeros((1, 3), np.float32)], 0)
  np.testing.assert_allclose(_agg(values, mask, mode), GOLDEN[mode], rtol=1e-6)
  grad = jax.jit(jax.grad(lambda v: aggregate(v, mask, mode=mode)))(jnp.asarray(values))
  assert np.all(np.isfinite(grad)) and np.all(grad[mask == 0] == 0)


def test_explicit_normalizers_and_max_tokens():
  # Σ m·L = 7: with N_tok = 14 → 0.5; N_seq = 7 → 1.0; Dr.GRPO with L_max = 7, N_seq = 2 → 0.5.
  np.testing.assert_allclose(_agg(VALUES, MASK, "token-mean", num_tokens=14.0), 0.5)
  np.testing.assert_allclose(_agg(VALUES, MASK, "seq-mean-token-sum", 0.0, 7.0), 1.0)
  np.testing.assert_allclose(_agg(VALUES, MASK, "seq-mean-token-mean", 0.0, 4.0), 5.5 / 4)
  np.testing.assert_allclose(_agg(VALUES, MASK, "seq-mean-token-sum-norm", max_tokens=7), 0.5)
  with pytest.raises(ValueError, match="max_tokens must be positive"):
    aggregate(VALUES, MASK, mode="seq-mean-token-sum-norm", max_tokens=0)


def test_all_padding_batch_gives_zero():
  assert float(_agg(VALUES, np.zeros_like(MASK), "token-mean")) == 0.0
  assert float(_agg(VALUES, np.zeros_like(MASK), "seq-mean-token-mean")) == 0.0


def test_float_mask_weights_tokens():
  # A weight-½ token counts half in numerator and in N_tok: (1 + ½·2 + 4) / 2.5 = 2.4.
  mask = np.array([[1, 0.5, 0], [1, 0, 0]], np.float32)
  np.testing.assert_allclose(_agg(VALUES, mask, "token-mean"), 2.4, rtol=1e-6)


def test_loss_normalizers_and_vmap():
  n = jax.jit(loss_normalizers)(MASK)
  assert (float(n.num_tokens), float(n.num_sequences)) == (3.0, 2.0)
  # Several batches at once (e.g. a sweep): vmap over a leading axis.
  stacked = jnp.stack([VALUES, 2 * VALUES])
  out = jax.jit(jax.vmap(lambda v: aggregate(v, MASK, mode="token-mean")))(stacked)
  np.testing.assert_allclose(out, [7 / 3, 14 / 3], rtol=1e-6)


def test_doctests():
  assert doctest.testmod(aggregation).failed == 0
