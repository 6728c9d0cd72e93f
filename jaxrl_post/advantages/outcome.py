"""Outcome advantages from scalar rewards: GRPO, batch-std, mean-only (Dr.GRPO) and RLOO.

Rollouts are grouped by an integer `group_ids[b]` (the prompt a rollout answers). The rows of a
group need not be contiguous and a group may span shards of a sharded batch: group statistics are
segment sums with a static number of segments, so everything jits with fixed shapes.

Rewards may come from several reward functions, `[batch, num_funcs]`, combined by a weighted sum
that skips missing (NaN) entries (TRL's nansum convention). A row where every function is missing
has no reward at all: it is left out of the group statistics and its advantage is 0;
`combine_rewards(...).valid` reports such rows.

`ADVANTAGES` names the estimators: "grpo", "batch_std", "drgrpo", "rloo".
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from jaxrl_post.registry import Registry

ADVANTAGES: Registry = Registry("advantage")

STD_MODES = ("group", "batch", "none")


class CombinedRewards(NamedTuple):
  """Per-row rewards after combining the reward functions."""

  reward: jax.Array  # [batch] float32; NaN where every reward function is missing.
  valid: jax.Array  # [batch] bool; False where every reward function is missing.


@jax.jit
def combine_rewards(rewards: jax.Array, weights: jax.Array | None = None) -> CombinedRewards:
  """Weighted sum over reward functions that treats NaN as missing.

  reward_b = Σ_k w_k·R[b,k] over the k with R[b,k] not NaN; NaN (and valid_b = False) if none.

  Args:
    rewards: `[batch]` or `[batch, num_funcs]` rewards, NaN = missing.
    weights: `[num_funcs]` weights (default all 1).

  Returns:
    `CombinedRewards(reward [batch], valid [batch])`; `jnp.sum(~valid)` counts rows with no
    reward at all.

  Examples:
    >>> import jax.numpy as jnp
    >>> out = combine_rewards(jnp.array([[1.0, jnp.nan], [jnp.nan, jnp.nan], [1.0, 2.0]]),
    ...                       jnp.array([1.0, 0.5]))
    >>> out.reward.tolist(), out.valid.tolist()
    ([1.0, nan, 2.0], [True, False, True])
  """
  rewards = jnp.asarray(rewards, jnp.float32)
  chex.assert_rank(rewards, {1, 2})
  if rewards.ndim == 1:
    rewards = rewards[:, None]
  if weights is None:
    weights = jnp.ones(rewards.shape[-1], jnp.float32)
  weights = jnp.asarray(weights, jnp.float32)
  chex.assert_shape(weights, (rewards.shape[-1],))
  present = ~jnp.isnan(rewards)
  total = jnp.sum(jnp.where(present, rewards * weights, 0.0), axis=-1)
  valid = jnp.any(present, axis=-1)
  return CombinedRewards(jnp.where(valid, total, jnp.nan), valid)


def contiguous_group_ids(batch_size: int, group_size: int) -> jax.Array:
  """Group ids `[0]*G + [1]*G + ...` for a batch laid out prompt by prompt.

  Examples:
    >>> contiguous_group_ids(6, 3).tolist()
    [0, 0, 0, 1, 1, 1]
  """
  if batch_size % group_size:
    raise ValueError(f"batch_size {batch_size} is not a multiple of group_size {group_size}")
  return jnp.arange(batch_size, dtype=jnp.int32) // group_size


def _prepare(rewards, group_ids, reward_weights, num_groups):
  reward, valid = combine_rewards(rewards, reward_weights)
  group_ids = jnp.asarray(group_ids)
  chex.assert_shape(group_ids, reward.shape)
  chex.assert_type(group_ids, int)
  num_groups = reward.shape[0] if num_groups is None else num_groups
  return reward, valid, group_ids, num_groups


def _group_sum(x, group_ids, num_groups):
  """Σ over each row's group, returned per row (`[batch]`)."""
  return jax.ops.segment_sum(x, group_ids, num_segments=num_groups)[group_ids]


@functools.partial(jax.jit, static_argnames=("num_groups", "std", "eps", "ddof"))
def group_advantages(
    rewards: jax.Array,
    group_ids: jax.Array,
    *,
    num_groups: int | None = None,
    std: str = "group",
    eps: float = 1e-6,
    ddof: int = 1,
    reward_weights: jax.Array | None = None,
) -> jax.Array:
  """Group-relative advantages: reward minus its group mean, optionally divided by a std.

  A_i = (R_i − μ_g(i)) / (σ + ε),  μ_g = mean of R over the valid rows of group g,
  σ = σ_g(i) (std="group", GRPO), the std of R over all valid rows (std="batch"), or no division
  (std="none", Dr.GRPO, where A_i = R_i − μ_g(i)). Standard deviations use
  √(Σ (R − μ)² / max(n − ddof, 1)); a group whose rewards are all equal gets A = 0.

  Args:
    rewards: `[batch]` rewards or `[batch, num_funcs]` per reward function (see
      `combine_rewards`); NaN = missing. Rows with no reward get A = 0 and do not enter μ or σ.
    group_ids: `[batch]` int group id per row, in `[0, num_groups)`; rows of a group may be
      anywhere in the batch.
    num_groups: static number of segments (default: batch size, always enough for ids < batch).
    std: "group", "batch" or "none".
    eps: ε added to σ. Default 1e-6 (Tunix, Miles); TRL uses 1e-4.
    ddof: delta degrees of freedom of σ: 1 = Bessel (TRL, Tunix, Miles), 0 = population.
    reward_weights: `[num_funcs]` weights of the reward functions.

  Returns:
    `[batch]` float32 advantages.

  Examples:
    >>> import jax.numpy as jnp
    >>> adv = group_advantages(jnp.array([1.0, 0.0, 0.0, 5.0, 3.0, 3.0]),
    ...                        jnp.array([0, 0, 1, 0, 1, 1]), eps=0.0)
    >>> [round(x, 4) for x in adv.tolist()]  # group 0: μ=2, σ=√7; group 1: μ=2, σ=√3
    [-0.378, -0.7559, -1.1547, 1.1339, 0.5774, 0.5774]

  References:
    Shao et al., DeepSeekMath (GRPO), arXiv 2402.03300.
    Liu et al., Understanding R1-Zero-Like Training (Dr.GRPO), arXiv 2503.20783.
  """
  if std not in STD_MODES:
    raise ValueError(f"unknown std {std!r}; valid: {', '.join(STD_MODES)}")
  reward, valid, group_ids, num_groups = _prepare(rewards, group_ids, reward_weights, num_groups)
  count = _group_sum(valid.astype(jnp.float32), group_ids, num_groups)
  total = _group_sum(jnp.where(valid, reward, 0.0), group_ids, num_groups)
  centred = jnp.where(valid, reward - total / jnp.maximum(count, 1.0), 0.0)
  if std == "group":
    sq = _group_sum(jnp.square(centred), group_ids, num_groups)
    adv = centred / (jnp.sqrt(sq / jnp.maximum(count - ddof, 1.0)) + eps)
  elif std == "batch":
    n = jnp.sum(valid)
    x = jnp.where(valid, reward, 0.0)
    dev = jnp.where(valid, x - jnp.sum(x) / jnp.maximum(n, 1), 0.0)
    adv = centred / (jnp.sqrt(jnp.sum(jnp.square(dev)) / jnp.maximum(n - ddof, 1)) + eps)
  else:
    adv = centred
  return jnp.where(valid, adv, 0.0)


@functools.partial(jax.jit, static_argnames=("num_groups", "eps"))
def rloo_advantages(
    rewards: jax.Array,
    group_ids: jax.Array,
    *,
    num_groups: int | None = None,
    reward_weights: jax.Array | None = None,
    eps: float | None = None,
) -> jax.Array:
  """Leave-one-out (RLOO) advantages: reward minus the mean of the other rows of its group.

  A_i = R_i − (Σ_{j∈g(i)} R_j − R_i) / (n_g − 1);  0 when the group has one valid row.

  Args:
    rewards: `[batch]` or `[batch, num_funcs]` rewards, NaN = missing (A = 0, left out).
    group_ids: `[batch]` int group ids in `[0, num_groups)`.
    num_groups: static number of segments (default: batch size).
    reward_weights: `[num_funcs]` weights of the reward functions.
    eps: unused (RLOO divides by no standard deviation); accepted so that every
      `ADVANTAGES` entry takes the same keywords.

  Returns:
    `[batch]` float32 advantages.

  Examples:
    >>> import jax.numpy as jnp
    >>> rloo_advantages(jnp.array([1.0, 0.0, 2.0]), jnp.array([0, 0, 0])).tolist()
    [0.0, -1.5, 1.5]

  References:
    Ahmadian et al., Back to Basics: REINFORCE-style optimization (RLOO), arXiv 2402.14740.
    Kool et al., Buy 4 REINFORCE Samples, Get a Baseline for Free! (ICLR 2019 workshop).
  """
  del eps
  reward, valid, group_ids, num_groups = _prepare(rewards, group_ids, reward_weights, num_groups)
  x = jnp.where(valid, reward, 0.0)
  count = _group_sum(valid.astype(jnp.float32), group_ids, num_groups)
  total = _group_sum(x, group_ids, num_groups)
  adv = x - (total - x) / jnp.maximum(count - 1.0, 1.0)
  return jnp.where(valid & (count > 1), adv, 0.0)


ADVANTAGES.add("grpo", group_advantages)
ADVANTAGES.add("rloo", rloo_advantages)


@ADVANTAGES.register("batch_std")
def batch_std_advantages(rewards, group_ids, **kwargs) -> jax.Array:
  """`group_advantages` with std="batch": group mean, std of the whole batch (TRL "batch").

  Examples:
    >>> import jax.numpy as jnp
    >>> adv = batch_std_advantages(jnp.array([0.0, 2.0, 2.0, 4.0]), jnp.array([0, 0, 1, 1]),
    ...                            ddof=0, eps=0.0)
    >>> [round(x, 4) for x in adv.tolist()]  # group means 1 and 3; σ of the batch is √2
    [-0.7071, 0.7071, -0.7071, 0.7071]
  """
  return group_advantages(rewards, group_ids, std="batch", **kwargs)


@ADVANTAGES.register("drgrpo")
def drgrpo_advantages(rewards, group_ids, **kwargs) -> jax.Array:
  """`group_advantages` with std="none": A_i = R_i − group mean (Dr.GRPO, arXiv 2503.20783).

  Examples:
    >>> import jax.numpy as jnp
    >>> drgrpo_advantages(jnp.array([1.0, 0.0, 3.0, 3.0]), jnp.array([0, 0, 1, 1])).tolist()
    [0.5, -0.5, 0.0, 0.0]
  """
  return group_advantages(rewards, group_ids, std="none", **kwargs)
