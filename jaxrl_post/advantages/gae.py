"""Generalised advantage estimation over completion tokens, for PPO with a learned critic.

A completion is an episode whose states are its prefixes: state j is the prompt plus completion
tokens 0…j−1, action j is token j. A value model scores every state, V_j = V_φ(s_j), and the
rewards are per token, r_j (the verifier's outcome at the last token, optionally minus a
per-token KL penalty: `outcome_token_rewards`). GAE (Schulman et al., arXiv 1506.02438, eq. 16)
then gives, from the end backwards,

  δ_j = r_j + γ·V_{j+1} − V_j,      A_j = δ_j + γλ·A_{j+1},      R_j = A_j + V_j

with V and A beyond a completion's last token equal to 0 (the episode ends there: nothing to
bootstrap). R_j is the λ-return the critic regresses onto. With γ = λ = 1 (verl's default for
LLM PPO) and an outcome reward R, A_j = R − V_j: each token's advantage is the reward minus what
the critic expected before it.

Masks. Positions where `mask` is 0 are not steps of the episode: they are skipped, carrying
V_{next} and A_{next} through unchanged, so right padding behaves as "after the end" and holes
inside a row (a multi-turn rollout's tool outputs, which the policy did not produce) join the
turns on either side as if the hole were not there. Advantages and returns are 0 there.

`whiten` standardises advantages over the valid tokens of the whole batch, the usual PPO step
before the clipped surrogate (InstructGPT, arXiv 2203.02155; PPO, arXiv 1707.06347).
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp


class GAEOutput(NamedTuple):
  """`gae_advantages`' result; both float32 `[batch, time]`, 0 where the mask is 0."""

  advantages: jax.Array  # A_j, not whitened
  returns: jax.Array  # R_j = A_j + V_j, the critic's regression targets


@jax.jit
def gae_advantages(rewards: jax.Array, values: jax.Array, mask: jax.Array, *,
                   gamma: float | jax.Array, lam: float | jax.Array) -> GAEOutput:
  """GAE(γ, λ) advantages and λ-returns of per-token rewards (module docstring).

  A reverse `lax.scan` over time; each step is

    δ_j = r_j + γ·V_next − V_j,   A_j = δ_j + γλ·A_next,
    (V_next, A_next) ← (V_j, A_j) where mask_j, else unchanged,

  starting from V_next = A_next = 0 after the last position.

  Args:
    rewards: `[batch, time]` per-token rewards r_j.
    values: `[batch, time]` V(s_j), the value of the state *before* token j.
    mask: `[batch, time]` 1 (or True) on the episode's tokens; 0 on padding and on tokens the
      policy did not produce.
    gamma: discount γ ∈ [0, 1].
    lam: GAE λ ∈ [0, 1]; λ = 0 is the one-step TD error, λ = 1 the Monte Carlo return minus V.

  Returns:
    `GAEOutput(advantages, returns)`, float32 `[batch, time]`, 0 where `mask` is 0.

  Examples:
    >>> out = gae_advantages(jnp.array([[0.0, 1.0, 0.0]]), jnp.array([[0.5, 0.25, 9.0]]),
    ...                      jnp.array([[1, 1, 0]]), gamma=1.0, lam=1.0)
    >>> out.advantages.tolist(), out.returns.tolist()   # A_j = R − V_j with R = 1
    ([[0.5, 0.75, 0.0]], [[1.0, 1.0, 0.0]])
  """
  chex.assert_rank([rewards, values, mask], 2)
  chex.assert_equal_shape([rewards, values, mask])
  valid = jnp.asarray(mask) > 0
  rewards = jnp.where(valid, jnp.asarray(rewards, jnp.float32), 0.0)
  values = jnp.where(valid, jnp.asarray(values, jnp.float32), 0.0)
  gamma = jnp.asarray(gamma, jnp.float32)
  lam = jnp.asarray(lam, jnp.float32)

  def step(carry, xs):
    next_value, next_adv = carry
    r_t, v_t, m_t = xs
    adv = r_t + gamma * next_value - v_t + gamma * lam * next_adv
    adv = jnp.where(m_t, adv, 0.0)
    carry = (jnp.where(m_t, v_t, next_value), jnp.where(m_t, adv, next_adv))
    return carry, adv

  zeros = jnp.zeros(rewards.shape[:1], jnp.float32)
  _, adv_t = jax.lax.scan(step, (zeros, zeros), (rewards.T, values.T, valid.T), reverse=True)
  advantages = adv_t.T
  returns = jnp.where(valid, advantages + values, 0.0)
  return GAEOutput(advantages, returns)


@jax.jit
def last_token_mask(mask: jax.Array) -> jax.Array:
  """`bool[batch, time]`: True at each row's last valid position (none for an empty row).

  Examples:
    >>> last_token_mask(jnp.array([[1, 1, 0], [0, 0, 0], [1, 0, 1]])).astype(int).tolist()
    [[0, 1, 0], [0, 0, 0], [0, 0, 1]]
  """
  chex.assert_rank(mask, 2)
  valid = jnp.asarray(mask) > 0
  t = valid.shape[1]
  # Index of the last True: t − 1 − (first True of the reversed row).
  last = t - 1 - jnp.argmax(valid[:, ::-1], axis=1)
  return (jnp.arange(t)[None, :] == last[:, None]) & jnp.any(valid, axis=1, keepdims=True)


@jax.jit
def outcome_token_rewards(reward: jax.Array, mask: jax.Array, kl: jax.Array | None = None,
                          kl_coef: float | jax.Array = 0.0) -> jax.Array:
  """Per-token rewards of an outcome-rewarded completion, with an optional KL penalty.

    r_j = R·[j is the row's last valid token] − β_kl·KL_j·mask_j

  the reward shaping of InstructGPT (arXiv 2203.02155, eq. 2): the verifier's outcome arrives at
  the end of the episode, the KL to the reference is paid token by token. `kl` is a per-token
  estimate of KL(π_old ‖ π_ref) (e.g. `losses.kl_estimate(old_logp, ref_logp, estimator="k1")`),
  detached: a reward carries no gradient.

  Args:
    reward: `[batch]` outcome rewards R (finite; map missing rewards to a value first).
    mask: `[batch, time]` completion mask (right-padded, or with holes).
    kl: optional `[batch, time]` per-token KL estimate.
    kl_coef: β_kl (0 ignores `kl`).

  Returns:
    float32 `[batch, time]`, 0 where `mask` is 0.

  Examples:
    >>> outcome_token_rewards(jnp.array([2.0, 1.0]), jnp.array([[1, 1, 0], [1, 1, 1]])).tolist()
    [[0.0, 2.0, 0.0], [0.0, 0.0, 1.0]]
  """
  chex.assert_rank(reward, 1)
  chex.assert_rank(mask, 2)
  valid = jnp.asarray(mask) > 0
  rewards = jnp.where(last_token_mask(valid), jnp.asarray(reward, jnp.float32)[:, None], 0.0)
  if kl is not None:
    chex.assert_equal_shape([kl, mask])
    penalty = jnp.asarray(kl_coef, jnp.float32) * jnp.asarray(kl, jnp.float32)
    rewards = rewards - jnp.where(valid, jax.lax.stop_gradient(penalty), 0.0)
  return rewards


@jax.jit
def whiten(x: jax.Array, mask: jax.Array, eps: float = 1e-8) -> jax.Array:
  """(x − μ) / sqrt(σ² + eps) with μ, σ² the mean and (population) variance over valid tokens.

  One pair of statistics for the whole `[batch, time]` array, computed before it is cut into
  mini-batches (as verl and Tunix do). The mean is removed too, so a batch's advantages sum to
  0 over its tokens. Where `mask` is 0 the result is 0; a batch without valid tokens gives 0.

  Examples:
    >>> whiten(jnp.array([[1.0, 3.0, 7.0]]), jnp.array([[1, 1, 0]])).round(4).tolist()
    [[-1.0, 1.0, 0.0]]
  """
  chex.assert_equal_shape([x, mask])
  valid = jnp.asarray(mask) > 0
  x = jnp.asarray(x, jnp.float32)
  count = jnp.maximum(jnp.sum(valid), 1)
  mean = jnp.sum(jnp.where(valid, x, 0.0)) / count
  var = jnp.sum(jnp.where(valid, jnp.square(x - mean), 0.0)) / count
  return jnp.where(valid, (x - mean) * jax.lax.rsqrt(var + eps), 0.0)
