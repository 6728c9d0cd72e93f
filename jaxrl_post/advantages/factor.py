"""FACTOR's TD action credit (TAC): per-action advantages that sum to the rollout advantage.

A multi-turn agent rollout takes actions t = 0..T_i−1 (turns, tool calls) from states x_0..x_{T_i}.
GRPO hands every action the same A_i = G_i − b_i. FACTOR's TAC replaces it by TD residuals of a
checkpoint-calibrated value estimate Ṽ whose endpoints are pinned:

  Ṽ_0 = b_i (the trajectory baseline),  Ṽ_t = V_φ(x_t) for 0 < t < T_i,  Ṽ_{T_i} = 0
  A*_{i,t} = r_{i,t} + Ṽ_{t+1} − Ṽ_t

The residuals telescope, Σ_t A*_{i,t} = Σ_t r_{i,t} − b_i = G_i − b_i = A_i^seq, so the rollout's
total credit is conserved and only its placement over actions changes. V_φ is a light value head
fitted (on the host, in the method) to Monte Carlo returns of short frozen-policy continuations
from a few restored checkpoints; here it is an input.

Layout: `[B, G, S]` like the other step-credit estimators (`step_credit.STEP_CREDIT`), though any
leading shape `[..., S]` works. Actions occupy a prefix of the step axis: `action_mask[..., t]`
is 1 for t < T_i and 0 after (checked on concrete inputs).

PROPOSAL choices (the paper's are not known), as keyword arguments:
  * `std`: if the backbone standardises advantages, divide every A* by the group std (+ eps) so
    that with b_i = the group-mean return the credits sum to the GRPO advantage. Default None
    (no division). `group_return_stats` gives b_i and σ (population std, PROPOSAL). A group
    with σ = 0 gets no credit (its GRPO advantage is 0; the residuals would be blown up by 1/ε).
  * `interpolated_values`: when states cannot be restored, Ṽ is interpolated linearly between
    b_i and G_i, which makes the credit uniform, A*_t = (G_i − b_i)/T_i.
  * Rewards are terminal only in the paper's setting; any step rewards are accepted.

Reference: Ma et al., How Much, Then Where: Credit-Conserving Action-to-Token Allocation for
Multi-Turn Agent Reinforcement Learning (FACTOR), arXiv 2608.07118.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_post.advantages.step_credit import STEP_CREDIT


class GroupReturnStats(NamedTuple):
  """Per-rollout group baseline and spread of the returns."""

  baseline: jax.Array  # [B, G] float32 group-mean return b_i (broadcast to every rollout).
  std: jax.Array  # [B, G] float32 population std of the group's returns.


def _is_concrete(*xs) -> bool:
  return not any(isinstance(x, jax.core.Tracer) for x in xs)


def _check_prefix(action_mask) -> None:
  m = np.asarray(action_mask) > 0
  later = np.cumsum(~m, axis=-1) > 0
  if np.any(m & later):
    idx = tuple(int(i) for i in np.argwhere(m & later)[0])
    raise ValueError(f"action_mask{list(idx)} is 1 after a 0: actions must fill a prefix of the "
                     "step axis (steps 0..T_i−1)")


def _lengths(action_mask):
  return jnp.sum(jnp.asarray(action_mask) > 0, axis=-1)


@jax.jit
def group_return_stats(returns: jax.Array, group_valid: jax.Array | None = None
                       ) -> GroupReturnStats:
  """PROPOSAL baseline of TAC: b_i = mean_g G, σ = sqrt(mean_g (G − b)²) over a group.

  Args:
    returns: `[B, G]` rollout returns G_i.
    group_valid: `[B, G]` bool, rollouts that count (default: all).

  Returns:
    `GroupReturnStats(baseline [B, G], std [B, G])`.

  Examples:
    >>> import jax.numpy as jnp
    >>> stats = group_return_stats(jnp.array([[1.0, 0.0, 0.0, 1.0]]))
    >>> stats.baseline.tolist(), stats.std.tolist()
    ([[0.5, 0.5, 0.5, 0.5]], [[0.5, 0.5, 0.5, 0.5]])
  """
  returns = jnp.asarray(returns, jnp.float32)
  if returns.ndim != 2:
    raise ValueError(f"returns must be [B, G], got shape {tuple(returns.shape)}")
  v = (jnp.ones_like(returns) if group_valid is None
       else jnp.asarray(group_valid).astype(jnp.float32))
  if v.shape != returns.shape:
    raise ValueError(f"group_valid has shape {tuple(v.shape)}; expected {tuple(returns.shape)}")
  n = jnp.maximum(jnp.sum(v, axis=-1, keepdims=True), 1.0)
  mu = jnp.sum(v * jnp.where(v > 0, returns, 0.0), axis=-1, keepdims=True) / n
  sd = jnp.sqrt(jnp.sum(v * jnp.square(jnp.where(v > 0, returns, 0.0) - mu), axis=-1,
                        keepdims=True) / n)
  return GroupReturnStats(jnp.broadcast_to(mu, returns.shape), jnp.broadcast_to(sd, returns.shape))


@functools.partial(jax.jit, static_argnames="eps")
def _td_credit(step_rewards, values, baseline, action_mask, std, *, eps):
  valid = action_mask > 0
  n = jnp.sum(valid, axis=-1)  # T_i
  s = step_rewards.shape[-1]
  t = jnp.arange(s)
  # Ṽ_t for t = 0..S−1 (index t is the state before action t); Ṽ_S is the terminal 0.
  v_now = jnp.where(t == 0, baseline[..., None], jnp.where(valid, values, 0.0))
  v_now = jnp.where(t < n[..., None], v_now, 0.0)
  v_next = jnp.concatenate([v_now[..., 1:], jnp.zeros_like(v_now[..., :1])], axis=-1)
  # The state after the last action is terminal: Ṽ_{T_i} = 0 (already 0 since t ≥ T_i there).
  credit = jnp.where(valid, jnp.where(valid, step_rewards, 0.0) + v_next - v_now, 0.0)
  if std is not None:
    # A group without return spread has GRPO advantage 0. Its residuals need not be 0 (they
    # only sum to 0), and dividing them by ε would blow them up to ~1/ε: give such rollouts no
    # credit, as GRPO does.
    credit = jnp.where(std[..., None] > 0, credit / (std[..., None] + eps), 0.0)
  return credit


@STEP_CREDIT.register("factor_td")
def factor_td_credit(
    step_rewards: jax.Array,
    values: jax.Array,
    baseline: jax.Array,
    action_mask: jax.Array,
    *,
    std: jax.Array | None = None,
    eps: float = 1e-6,
) -> jax.Array:
  """FACTOR's TD action credit A*_t = r_t + Ṽ_{t+1} − Ṽ_t with pinned endpoints.

  Ṽ_0 = b_i, Ṽ_t = values[..., t] for 0 < t < T_i, Ṽ_{T_i} = 0, with T_i = Σ_t action_mask, so
  Σ_t A*_t = G_i − b_i (G_i = Σ_t r_t) exactly up to float rounding. With `std` (PROPOSAL) every
  A* is divided by std + eps, so the sum is (G_i − b_i)/(σ + ε), the GRPO advantage when b_i is
  the group mean and σ the group std (`group_return_stats`). A rollout whose σ is 0 (a group
  with equal returns, GRPO advantage 0) then gets A* = 0 on every action rather than residuals
  blown up by 1/ε.

  Jittable. With concrete inputs, `action_mask` is checked to be a prefix mask.

  Args:
    step_rewards: `[B, G, S]` (any `[..., S]`) reward r_t of each action (terminal-only in the
      paper: G_i at the last action, 0 elsewhere).
    values: `[..., S]` V_φ(x_t), the value of the state *before* action t; index 0 and indices
      ≥ T_i are ignored (the pinned endpoints replace them).
    baseline: `[...]` b_i.
    action_mask: `[..., S]` 1 on the actions t < T_i, 0 after.
    std: optional `[...]` (or broadcastable, e.g. `[B, 1]`) group std σ; default None (no
      division). PROPOSAL; σ = 0 zeroes the rollout's credit.
    eps: ε added to σ.

  Returns:
    `[..., S]` float32 A*_t, 0 off the actions.

  Examples:
    >>> import jax.numpy as jnp
    >>> a = factor_td_credit(jnp.array([[0.0, 0.0, 1.0, 0.0]]),
    ...                      jnp.array([[9.0, 0.8, 0.6, 9.0]]), jnp.array([0.5]),
    ...                      jnp.array([[1, 1, 1, 0]]))
    >>> [round(x, 4) for x in a[0].tolist()]  # 0.8−0.5, 0.6−0.8, 1−0.6; sums to 1 − 0.5
    [0.3, -0.2, 0.4, 0.0]

  References:
    Ma et al., How Much, Then Where: Credit-Conserving Action-to-Token Allocation for Multi-Turn
    Agent Reinforcement Learning (FACTOR), arXiv 2608.07118.
  """
  step_rewards = jnp.asarray(step_rewards, jnp.float32)
  values = jnp.asarray(values, jnp.float32)
  baseline = jnp.asarray(baseline, jnp.float32)
  action_mask = jnp.asarray(action_mask)
  if step_rewards.ndim < 1 or step_rewards.shape[-1] < 1:
    raise ValueError(f"step_rewards must be [..., S] with S ≥ 1, got shape "
                     f"{tuple(step_rewards.shape)}")
  if values.shape != step_rewards.shape:
    raise ValueError(f"values has shape {tuple(values.shape)}; expected "
                     f"{tuple(step_rewards.shape)} (step_rewards')")
  if action_mask.shape != step_rewards.shape:
    raise ValueError(f"action_mask has shape {tuple(action_mask.shape)}; expected "
                     f"{tuple(step_rewards.shape)} (step_rewards')")
  if baseline.shape != step_rewards.shape[:-1]:
    raise ValueError(f"baseline has shape {tuple(baseline.shape)}; expected "
                     f"{tuple(step_rewards.shape[:-1])} (one per rollout)")
  if std is not None:
    std = jnp.asarray(std, jnp.float32)
    try:
      std = jnp.broadcast_to(std, baseline.shape)
    except ValueError:
      raise ValueError(f"std has shape {tuple(std.shape)}; expected one broadcastable to "
                       f"{tuple(baseline.shape)} (baseline's)") from None
  if eps < 0:
    raise ValueError(f"eps must be ≥ 0, got {eps}")
  if _is_concrete(action_mask):
    _check_prefix(action_mask)
  return _td_credit(step_rewards, values, baseline, action_mask, std, eps=float(eps))


@jax.jit
def interpolated_values(baseline: jax.Array, returns: jax.Array, action_mask: jax.Array,
                        step_rewards: jax.Array | None = None) -> jax.Array:
  """PROPOSAL fallback value estimate when states cannot be restored: a straight line b_i → G_i.

  Ṽ_t = b_i + (t/T_i)(G_i − b_i) − Σ_{u<t} r_u  for t < T_i (0 after).

  The cumulative value Ṽ_t + Σ_{u<t} r_u runs linearly from b_i to G_i, so with `factor_td_credit`
  every action gets A*_t = (G_i − b_i)/T_i: uniform credit, FACTOR without TAC. With terminal-only
  rewards (`step_rewards` None) the correction term is 0 for every t < T_i and Ṽ_t is the plain
  interpolation between b_i and G_i.

  Args:
    baseline: `[...]` b_i.
    returns: `[...]` G_i.
    action_mask: `[..., S]` prefix mask of the actions.
    step_rewards: optional `[..., S]` rewards, for non-terminal rewards.

  Returns:
    `[..., S]` float32 Ṽ_t, to pass as `values`.

  Examples:
    >>> import jax.numpy as jnp
    >>> interpolated_values(jnp.array([0.0]), jnp.array([1.0]), jnp.array([[1, 1, 1, 1, 0]])
    ...                     ).tolist()
    [[0.0, 0.25, 0.5, 0.75, 0.0]]
  """
  baseline = jnp.asarray(baseline, jnp.float32)
  returns = jnp.asarray(returns, jnp.float32)
  action_mask = jnp.asarray(action_mask)
  if returns.shape != baseline.shape:
    raise ValueError(f"returns has shape {tuple(returns.shape)}; expected "
                     f"{tuple(baseline.shape)} (baseline's)")
  if action_mask.shape[:-1] != baseline.shape:
    raise ValueError(f"action_mask has leading shape {tuple(action_mask.shape[:-1])}; expected "
                     f"{tuple(baseline.shape)} (baseline's)")
  n = _lengths(action_mask).astype(jnp.float32)[..., None]
  t = jnp.arange(action_mask.shape[-1], dtype=jnp.float32)
  line = baseline[..., None] + t / jnp.maximum(n, 1.0) * (returns - baseline)[..., None]
  if step_rewards is not None:
    step_rewards = jnp.asarray(step_rewards, jnp.float32)
    if step_rewards.shape != action_mask.shape:
      raise ValueError(f"step_rewards has shape {tuple(step_rewards.shape)}; expected "
                       f"{tuple(action_mask.shape)} (action_mask's)")
    r = jnp.where(action_mask > 0, step_rewards, 0.0)
    line = line - (jnp.cumsum(r, axis=-1) - r)  # Σ_{u<t} r_u
  return jnp.where(t < n, line, 0.0)
