"""REINFORCE++ and REINFORCE++-baseline outcome advantages (arXiv 2501.03262).

Both whiten over the *global batch*, not within a group as GRPO does:

  reinforce_pp:           x_i = R_i
  reinforce_pp_baseline:  x_i = R_i − mean_{j∈g(i)} R_j   (0 baseline for a one-row group)
  A_i = (x_i − μ) / √(σ² + ε),  μ = Σ w_i x_i / Σ w_i,  σ² = Σ w_i (x_i − μ)² / (Σ w_i − ddof)

The weight `w_i` is the row's completion length when `token_counts` is given and 1 otherwise.
verl (`reinforce_plus_plus(_baseline)` with an outcome reward, γ = 1, no KL in the reward)
broadcasts x_i to every valid token and whitens over tokens (`masked_whiten`: Bessel-corrected
token variance, rsqrt(var + 1e-8)), so a long response counts once per token: that is
`token_counts=completion lengths, ddof=1, eps=1e-8`. Without `token_counts` each response counts
once (sequence-level whitening: long responses do not dominate μ and σ).
The group mean of the baseline variant is an unweighted mean over rows in both cases, as in verl.
Why the batch instead of the group: one prompt's few samples give a noisy std (and a zero one when
the group agrees), which rescales that prompt's gradient arbitrarily; the batch std is one
well-estimated scale for everything.

KL in the reward: REINFORCE++ puts −β·KL_t into every token's reward, so its return, and its
advantage, varies along the response. A per-row estimator returns one number per row and cannot
express that; here the KL term lives in the loss instead (`config.loss.beta`,
`config.loss.kl_estimator`), the "KL loss" form that verl (`use_kl_loss`) also offers.

Rewards may be `[rows, num_funcs]` combined by `outcome.combine_rewards` (NaN = missing); a row
with no reward gets A = 0 and enters neither the baseline nor μ, σ.
"""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp

from jaxrl_post.advantages.outcome import ADVANTAGES, combine_rewards


def _whiten(x: jax.Array, valid: jax.Array, token_counts: jax.Array | None, eps: float,
            ddof: int) -> jax.Array:
  """(x − μ_w) / √(σ_w² + eps) over the valid rows, weights = token counts or 1; 0 elsewhere."""
  if token_counts is None:
    weight = valid.astype(jnp.float32)
  else:
    token_counts = jnp.asarray(token_counts, jnp.float32)
    chex.assert_shape(token_counts, x.shape)
    weight = jnp.where(valid, token_counts, 0.0)
  n = jnp.sum(weight)
  mean = jnp.sum(weight * x) / jnp.maximum(n, 1e-12)
  dev = jnp.where(valid, x - mean, 0.0)
  var = jnp.sum(weight * jnp.square(dev)) / jnp.maximum(n - ddof, 1.0)
  scale = jnp.sqrt(var + eps)
  adv = jnp.where(scale > 0, dev / jnp.where(scale > 0, scale, 1.0), 0.0)
  return jnp.where(valid & (n > 0), adv, 0.0)


@functools.partial(jax.jit, static_argnames=("num_groups", "eps", "ddof"))
def reinforce_pp_advantages(
    rewards: jax.Array,
    group_ids: jax.Array,
    *,
    num_groups: int | None = None,
    eps: float = 1e-8,
    ddof: int = 1,
    reward_weights: jax.Array | None = None,
    token_counts: jax.Array | None = None,
) -> jax.Array:
  """REINFORCE++: the reward whitened over the whole batch, no group baseline.

  A_i = (R_i − μ) / √(σ² + ε), μ and σ² weighted by `token_counts` (see the module docstring).

  Args:
    rewards: `[rows]` or `[rows, num_funcs]` rewards, NaN = missing (A = 0, left out).
    group_ids: `[rows]` int group ids; unused (no group baseline), accepted so that every
      `ADVANTAGES` entry takes the same arguments.
    num_groups: unused, as `group_ids`.
    eps: ε added to the *variance* (verl's rsqrt(var + 1e-8)), not to σ as in
      `group_advantages`.
    ddof: delta degrees of freedom of σ²: 1 = Bessel (verl), 0 = population.
    reward_weights: `[num_funcs]` weights of the reward functions.
    token_counts: `[rows]` float completion lengths; each row then weighs its length in μ and
      σ² (equals verl's token-level whitening). None: one weight per row.

  Returns:
    `[rows]` float32 advantages.

  Examples:
    >>> import jax.numpy as jnp
    >>> adv = reinforce_pp_advantages(jnp.array([1.0, 0.0, 0.0, 1.0]), jnp.zeros(4, jnp.int32),
    ...                               eps=0.0, ddof=0)
    >>> adv.tolist()  # μ = 0.5, σ = 0.5
    [1.0, -1.0, -1.0, 1.0]

  References:
    Hu et al., REINFORCE++: Stabilizing Critic-Free Policy Optimization with Global Advantage
    Normalization, arXiv 2501.03262.
  """
  del group_ids, num_groups
  reward, valid = combine_rewards(rewards, reward_weights)
  return _whiten(jnp.where(valid, reward, 0.0), valid, token_counts, eps, ddof)


@functools.partial(jax.jit, static_argnames=("num_groups", "eps", "ddof"))
def reinforce_pp_baseline_advantages(
    rewards: jax.Array,
    group_ids: jax.Array,
    *,
    num_groups: int | None = None,
    eps: float = 1e-8,
    ddof: int = 1,
    reward_weights: jax.Array | None = None,
    token_counts: jax.Array | None = None,
) -> jax.Array:
  """REINFORCE++-baseline: the reward minus its group mean, then whitened over the whole batch.

  x_i = R_i − mean_{j∈g(i)} R_j (baseline 0 when the group has one valid row, as verl: such a
  row keeps its raw reward), A_i = (x_i − μ) / √(σ² + ε) over the batch, weighted by
  `token_counts` (see the module docstring).

  Args:
    rewards: `[rows]` or `[rows, num_funcs]` rewards, NaN = missing (A = 0, left out).
    group_ids: `[rows]` int group id per row, in `[0, num_groups)`; rows of a group may be
      anywhere in the batch.
    num_groups: static number of segments (default: the number of rows).
    eps: ε added to the variance (verl's rsqrt(var + 1e-8)).
    ddof: delta degrees of freedom of σ²: 1 = Bessel (verl), 0 = population.
    reward_weights: `[num_funcs]` weights of the reward functions.
    token_counts: `[rows]` float completion lengths (verl's token-level whitening); None: one
      weight per row.

  Returns:
    `[rows]` float32 advantages.

  Examples:
    >>> import jax.numpy as jnp
    >>> adv = reinforce_pp_baseline_advantages(
    ...   jnp.array([1.0, 0.0, 3.0, 3.0]), jnp.array([0, 0, 1, 1]), eps=0.0, ddof=0)
    >>> [round(a, 4) for a in adv.tolist()]  # x = [0.5, −0.5, 0, 0]: μ = 0, σ = √0.125
    [1.4142, -1.4142, 0.0, 0.0]

  References:
    Hu et al., REINFORCE++, arXiv 2501.03262 (the "-baseline" variant of its v2+).
  """
  reward, valid = combine_rewards(rewards, reward_weights)
  group_ids = jnp.asarray(group_ids)
  chex.assert_shape(group_ids, reward.shape)
  chex.assert_type(group_ids, int)
  num_groups = reward.shape[0] if num_groups is None else num_groups
  x = jnp.where(valid, reward, 0.0)
  count = jax.ops.segment_sum(valid.astype(jnp.float32), group_ids, num_segments=num_groups)
  total = jax.ops.segment_sum(x, group_ids, num_segments=num_groups)
  baseline = jnp.where(count > 1, total / jnp.maximum(count, 1.0), 0.0)[group_ids]
  return _whiten(jnp.where(valid, x - baseline, 0.0), valid, token_counts, eps, ddof)


ADVANTAGES.add("reinforce_pp", reinforce_pp_advantages)
ADVANTAGES.add("reinforce_pp_baseline", reinforce_pp_baseline_advantages)
