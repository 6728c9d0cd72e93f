"""DRACO: per-step advantages from the step citations of rubric verdicts (arXiv 2609.04094).

GRPO gives every token of a long agent trajectory the same advantage A_i, so in a failed
100-turn episode the one good tool call is pushed down with the bad ones. DRACO has a judge
cite, for each rubric verdict, the steps (agent turns / code blocks) it rests on, and spreads
the trajectory's total push A_i·N over the steps by how well each step did:

  Q_j = p_j / (p_j + f_j)                  p_j, f_j: PASS / FAIL verdicts citing step j
  Q_j = mean_{k cited} Q_k                 for a real step no verdict cites
  w_j = Q_j        if A_i ≥ 0              reinforce the good steps of a good trajectory
  w_j = 1 − Q_j    if A_i < 0              suppress the bad steps of a bad one
  a_j = A_i · N · w_j / (n_j · Σ_k w_k)    n_j tokens of step j, N = Σ_k n_k

Every token of step j then uses a_j (`step_credit.steps_to_tokens`); gap tokens (tool-result
echoes, turn glue) belong to no step and get 0. The closed form keeps GRPO's total push,
Σ_j n_j a_j = A_i·N (conservation), never flips a sign (a_j·A_i ≥ 0), and the push of a step,
n_j a_j = A_i N w_j / Σw, does not grow with its verbosity. It falls back to uniform a_j = A_i
when Σ w = 0 (e.g. A_i < 0 and every cited step passed) or no step is cited; a unanimous group
has A_i = 0, so both branches give 0 there.

The verdict counts come from `rewards.rubrics.step_verdict_counts`, the trajectory advantage
from GRPO over `rewards.rubrics.draco_reward`. `draco_step_advantages` is registered in
`STEP_CREDIT` as "draco".
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxrl_post.advantages.step_credit import STEP_CREDIT


class DracoStepStats(NamedTuple):
  """The intermediate quantities of DRACO's redistribution, all `[B, G, S]` unless noted."""

  advantages: jax.Array  # float32 a_j per step; 0 on steps that are not real (see `real`).
  quality: jax.Array  # float32 Q_j after filling uncited steps with the cited mean; 0 off `real`.
  weights: jax.Array  # float32 direction-aware w_j; 0 off `real`.
  real: jax.Array  # bool: step_mask & (step_tokens > 0), the steps that take part.
  fallback: jax.Array  # [B, G] bool: the rollout got uniform a_j = A_i (Σw = 0 or no citation).


def _check_inputs(traj_adv, step_pass, step_fail, step_tokens, step_mask):
  traj_adv = jnp.asarray(traj_adv)
  if traj_adv.ndim != 2:
    raise ValueError(f"traj_adv must be [B, G] (one advantage per rollout), got shape "
                     f"{tuple(traj_adv.shape)}")
  step_pass = jnp.asarray(step_pass)
  if step_pass.ndim != 3 or step_pass.shape[:2] != traj_adv.shape:
    raise ValueError(f"step_pass has shape {tuple(step_pass.shape)}; expected "
                     f"{tuple(traj_adv.shape) + ('S',)} (traj_adv's [B, G] plus a step axis)")
  shape = step_pass.shape
  out = [step_pass]
  for name, x in (("step_fail", step_fail), ("step_tokens", step_tokens),
                  ("step_mask", step_mask)):
    x = jnp.asarray(x)
    if x.shape != shape:
      raise ValueError(f"{name} has shape {tuple(x.shape)}; expected {tuple(shape)} "
                       f"(step_pass's [B, G, S])")
    out.append(x)
  return (traj_adv, *out)


@functools.partial(jax.jit, static_argnames="eps")
def draco_step_stats(
    traj_adv: jax.Array,
    step_pass: jax.Array,
    step_fail: jax.Array,
    step_tokens: jax.Array,
    step_mask: jax.Array,
    *,
    eps: float = 1e-8,
) -> DracoStepStats:
  """DRACO's step quality, weights and closed-form step advantages, with the fallback flag.

  Q_j = p_j/(p_j + f_j) on cited steps, mean_{cited} Q on uncited real steps;
  w_j = Q_j (A_i ≥ 0) or 1 − Q_j (A_i < 0);  a_j = A_i · N · w_j / (n_j · Σ_k w_k),
  N = Σ_k n_k;  a_j = A_i on every real step when Σ_k w_k ≤ eps or no real step is cited.

  A step takes part ("real") when `step_mask` is set AND it has at least one token. Our choice
  for a masked-in step with n_j = 0 (the paper does not say): it is dropped like a padded step
  (a_j = 0, its citations do not enter the cited mean). Keeping it would either divide by zero
  or, with a `max(n_j, 1)` guard (a common sketch of this formula), hand it a share
  A_i N w_j/Σw of the push that no token can carry, so that Σ_j n_j a_j < A_i N
  (conservation broken). Counts on padded steps are ignored for the same reason (such a
  sketch would let them into the cited mean).

  `eps` is the threshold below which Σ w counts as zero (adding it to the
  denominator instead would bias the total push by a relative ~eps/Σw; thresholding keeps
  conservation exact up to float rounding).

  Args:
    traj_adv: `[B, G]` trajectory advantage A_i (GRPO over the rubric reward).
    step_pass: `[B, G, S]` number of PASS verdicts whose citations include step j.
    step_fail: `[B, G, S]` number of FAIL verdicts whose citations include step j.
    step_tokens: `[B, G, S]` int tokens n_j of each step (gap tokens excluded).
    step_mask: `[B, G, S]` 1 on real steps, 0 on padding.
    eps: Σw ≤ eps means "no weight": fall back to uniform (static).

  Returns:
    `DracoStepStats(advantages, quality, weights, real, fallback)`.

  Raises:
    ValueError: shapes do not line up (names the argument).

  References:
    Gandhi, Goyal, Kate, Rizk, DRACO: Fine-Grained Credit Assignment with Dynamic Rubrics for
    Long-Horizon Agent Training, arXiv 2609.04094.
  """
  traj_adv, step_pass, step_fail, step_tokens, step_mask = _check_inputs(
      traj_adv, step_pass, step_fail, step_tokens, step_mask)
  adv = traj_adv.astype(jnp.float32)[..., None]
  p = step_pass.astype(jnp.float32)
  f = step_fail.astype(jnp.float32)
  n = step_tokens.astype(jnp.float32)
  real = (step_mask > 0) & (n > 0)
  cited = real & (p + f > 0)
  q = jnp.where(cited, p / jnp.where(cited, p + f, 1.0), 0.0)
  num_cited = jnp.sum(cited, axis=-1, keepdims=True)
  q_bar = jnp.sum(q, axis=-1, keepdims=True) / jnp.maximum(num_cited, 1)
  q = jnp.where(cited, q, jnp.where(real, q_bar, 0.0))
  w = jnp.where(real, jnp.where(adv >= 0, q, 1.0 - q), 0.0)
  w_sum = jnp.sum(w, axis=-1, keepdims=True)
  total = jnp.sum(jnp.where(real, n, 0.0), axis=-1, keepdims=True)
  ok = (w_sum > eps) & (num_cited > 0)
  closed = adv * total * w / (jnp.where(real, n, 1.0) * jnp.where(ok, w_sum, 1.0))
  a = jnp.where(real, jnp.where(ok, closed, adv), 0.0)
  return DracoStepStats(jax.lax.stop_gradient(a), q, w, real, ~ok[..., 0])


@STEP_CREDIT.register("draco")
@functools.partial(jax.jit, static_argnames="eps")
def draco_step_advantages(
    traj_adv: jax.Array,
    step_pass: jax.Array,
    step_fail: jax.Array,
    step_tokens: jax.Array,
    step_mask: jax.Array,
    *,
    eps: float = 1e-8,
) -> jax.Array:
  """DRACO step advantages: the rollout's push A_i·N redistributed over its steps.

  a_j = A_i · N · w_j / (n_j · Σ_k w_k),  w_j = Q_j if A_i ≥ 0 else 1 − Q_j,
  Q_j = p_j / (p_j + f_j) (uncited real steps: the mean Q of the cited ones), N = Σ_k n_k;
  uniform a_j = A_i when Σ w = 0 or nothing is cited. Conserves Σ_j n_j a_j = A_i N and the sign
  of A_i. Steps with `step_mask` 0 or no tokens get 0 (see `draco_step_stats`, which also
  returns Q, w and the fallback flag). Spread over tokens with `steps_to_tokens`.

  Args:
    traj_adv: `[B, G]` trajectory advantage A_i.
    step_pass: `[B, G, S]` PASS verdicts citing each step.
    step_fail: `[B, G, S]` FAIL verdicts citing each step.
    step_tokens: `[B, G, S]` int tokens per step (gap tokens excluded).
    step_mask: `[B, G, S]` real steps.
    eps: Σw ≤ eps falls back to uniform (static).

  Returns:
    `[B, G, S]` float32 step advantages, stop-gradient.

  Raises:
    ValueError: shapes do not line up (names the argument).

  Examples:
    >>> import jax.numpy as jnp
    >>> # A = 1; both steps fully passed (w = 1, 1); 2 and 4 tokens: each step pushes N/2 = 3.
    >>> draco_step_advantages(jnp.ones((1, 1)), jnp.ones((1, 1, 2)), jnp.zeros((1, 1, 2)),
    ...                       jnp.array([[[2, 4]]]), jnp.ones((1, 1, 2))).tolist()
    [[[1.5, 0.75]]]

  References:
    Gandhi, Goyal, Kate, Rizk, DRACO: Fine-Grained Credit Assignment with Dynamic Rubrics for
    Long-Horizon Agent Training, arXiv 2609.04094.
  """
  return draco_step_stats(traj_adv, step_pass, step_fail, step_tokens, step_mask,
                          eps=eps).advantages


@functools.partial(jax.jit, static_argnames="num_steps")
def step_token_counts(step_ids: jax.Array, num_steps: int,
                      mask: jax.Array | None = None) -> jax.Array:
  """Tokens per step, n_j = Σ_t 1[step_ids_t = j] (· mask_t), from the token → step layout.

  The inverse companion of `steps_to_tokens`: gives DRACO's `step_tokens` from the same
  `step_ids` (−1 = gap token, counted nowhere).

  Args:
    step_ids: `[..., T]` int step of each token, −1 (or out of `[0, num_steps)`) = no step.
    num_steps: padded number of steps S (static).
    mask: optional `[..., T]` token mask (0 on padding).

  Returns:
    `[..., S]` int32 token counts.

  Examples:
    >>> import jax.numpy as jnp
    >>> step_token_counts(jnp.array([0, 0, -1, 1, 1, 1, 1, -1]), 3).tolist()
    [2, 4, 0]
  """
  step_ids = jnp.asarray(step_ids)
  if num_steps < 1:
    raise ValueError(f"num_steps must be ≥ 1, got {num_steps}")
  if mask is not None and jnp.shape(mask) != step_ids.shape:
    raise ValueError(f"mask has shape {tuple(jnp.shape(mask))}; expected "
                     f"{tuple(step_ids.shape)} (step_ids')")
  onehot = step_ids[..., None] == jnp.arange(num_steps)
  if mask is not None:
    onehot = onehot & (jnp.asarray(mask) > 0)[..., None]
  return jnp.sum(onehot, axis=-2, dtype=jnp.int32)
