"""Windowed reference KL (RecoverFly, arXiv 2608.09467; PROPOSAL): the k3 KL to the
frozen initial policy on a window of action tokens only, next to the clipped surrogate.

RecoverFly regularises towards the reference policy so that updates do not erode acquired
skills; the paper's form is "not found". PROPOSAL: the per-token KL estimate (k3 by default,
`losses.kl`) averaged over a *window* W_i of each trajectory's action-choice tokens,

  KL_win = (1/N_seq) Σ_i (1/|W_i|) Σ_{t∈W_i} k(logp_{i,t}, ref_logp_{i,t})      (|W_i| > 0)
  loss   = L_policy(β = 0) + β · KL_win

with N_seq the non-empty sequences of the WHOLE batch (`num_sequences`), so micro-batches and
shards add up exactly. `action_window` picks W_i from a row's action-choice tokens (positions
whose grammar state allows more than one token): `window = 0` all of them (whole-trajectory
KL), `window = w > 0` the last w (the end of the action program, where compounding errors of
the earlier moves land; PROPOSAL choice, named in `configs/recoverfly.py`).

The window travels in the batch inside `ref_logp`: positions outside it hold NaN
(`mark_window`), so the registered policy loss `"recoverfly_window_kl"` needs no extra batch
key; it sanitises the NaN before any arithmetic, so gradients stay finite.
"""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_post.losses.kl import kl_estimate
from jaxrl_post.losses.policy import POLICY_LOSSES, PolicyLossAux, policy_loss


def action_window(choice: np.ndarray, window: int) -> np.ndarray:
  """The last `window` True positions of each row of `choice` (all of them when 0).

  Args:
    choice: `[batch, time]` bool, the action-choice tokens (inside the completion mask).
    window: w ≥ 0.

  Returns:
    `[batch, time]` bool window mask.

  >>> action_window(np.array([[1, 0, 1, 1], [1, 1, 0, 0]], bool), 2).astype(int).tolist()
  [[0, 0, 1, 1], [1, 1, 0, 0]]
  """
  choice = np.asarray(choice, bool)
  if window < 0:
    raise ValueError(f"window must be >= 0 (0: every action token), got {window}")
  if window == 0:
    return choice
  # Rank of each choice token counted from the row's end: 1 for the last one.
  from_end = np.cumsum(choice[:, ::-1], axis=1)[:, ::-1]
  return choice & (from_end <= window)


def mark_window(ref_logp: np.ndarray, window: np.ndarray) -> np.ndarray:
  """`ref_logp` with NaN outside `window` (both `[batch, time]`), the loss's window encoding."""
  return np.where(np.asarray(window, bool), np.asarray(ref_logp, np.float32),
                  np.nan).astype(np.float32)


@functools.partial(jax.jit, static_argnames="estimator")
def window_kl(logp: jax.Array, ref_logp: jax.Array, mask: jax.Array, *,
              estimator: str = "k3", num_sequences=None) -> tuple[jax.Array, jax.Array]:
  """KL_win of the module docstring: the window is `mask` and the finite entries of `ref_logp`.

  Args:
    logp: `[batch, time]` log π_θ of the sampled tokens (differentiated).
    ref_logp: `[batch, time]` reference log-probs, NaN outside the window.
    mask: `[batch, time]` completion mask.
    estimator: "k1", "k2" or "k3" (`losses.kl.KL_ESTIMATORS`).
    num_sequences: the whole batch's non-empty sequences (default: this batch's rows that
      have a window token).

  Returns:
    `(kl_win, window_tokens)`: the scalar and this batch's number of window tokens.

  >>> lp = jnp.log(jnp.array([[0.5, 0.5, 0.5]]))
  >>> ref = jnp.array([[jnp.nan, jnp.log(0.25), jnp.log(0.5)]])
  >>> round(float(window_kl(lp, ref, jnp.ones((1, 3)))[0]), 4)  # (0.5 − 1 + log 2 + 0) / 2
  0.0966
  """
  chex.assert_rank([logp, ref_logp, mask], 2)
  chex.assert_equal_shape([logp, ref_logp, mask])
  logp = jnp.asarray(logp, jnp.float32)
  inside = (jnp.asarray(mask) > 0) & jnp.isfinite(ref_logp)
  # Sanitised before any arithmetic: NaN must not reach a gradient through `where`.
  lp = jnp.where(inside, logp, 0.0)
  ref = jnp.where(inside, ref_logp, 0.0)
  per_token = jnp.where(inside, kl_estimate(lp, ref, estimator=estimator), 0.0)
  count = jnp.sum(inside, axis=1).astype(jnp.float32)
  per_row = jnp.sum(per_token, axis=1) / jnp.maximum(count, 1.0)
  if num_sequences is None:
    num_sequences = jnp.sum(count > 0)
  total = jnp.sum(per_row) / jnp.maximum(jnp.asarray(num_sequences, jnp.float32), 1.0)
  return total, jnp.sum(count)


@POLICY_LOSSES.register("recoverfly_window_kl")
def window_kl_policy_loss(logp, old_logp, adv, mask, *, ref_logp=None, beta=0.0,
                          kl_estimator: str = "k3", num_sequences=None,
                          **kwargs) -> tuple[jax.Array, PolicyLossAux]:
  """`policy_loss` (β = 0) + β·KL_win (module docstring); `ref_logp` carries the window as its
  finite entries. `aux.kl_loss` is KL_win; the other fields are `policy_loss`'s.

  >>> z = jnp.zeros((1, 2))
  >>> loss, aux = window_kl_policy_loss(z, z, jnp.ones(1), jnp.ones((1, 2)),
  ...                                   ref_logp=jnp.array([[jnp.nan, -1.0]]), beta=0.5)
  >>> round(float(loss), 4), round(float(aux.kl_loss), 4)  # −1 + 0.5·(e^{−1} − 1 + 1)
  (-0.8161, 0.3679)
  """
  loss, aux = policy_loss(logp, old_logp, adv, mask, beta=0.0, num_sequences=num_sequences,
                          **kwargs)
  if ref_logp is None:
    if not (isinstance(beta, (int, float)) and beta == 0):
      raise ValueError("recoverfly_window_kl: beta != 0 needs ref_logp (config.loss.beta > 0 "
                       "makes the method score the reference)")
    return loss, aux
  kl, _ = window_kl(logp, ref_logp, mask, estimator=kl_estimator, num_sequences=num_sequences)
  return loss + beta * kl, aux._replace(kl_loss=kl)
