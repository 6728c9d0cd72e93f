"""RTPO (Reverse-Turn Policy Optimization, arXiv 2608.18682): sibling advantages and the turn loss.

RTPO trains one turn boundary at a time, from the last turn to the first. At boundary k of a trunk
trajectory it restores the environment at state S_k, samples G − 1 siblings of turn k from the
current policy, continues each to the end of the episode, and scores sibling j by its terminal
reward R_j (the Monte-Carlo estimate of its turn-level value). Everything host-side (trunks,
snapshots, the sweep) lives in `jaxrl_post.methods.rtpo`; this module holds the array maths:

  sibling_advantages      A_j = R_j − (1/(G−1)) Σ_{j'} R_{j'}     per boundary, no std division
  boundary_has_signal     whether a boundary's siblings differ (else A ≡ 0 and it is skipped)
  turn_token_mask         mask ∧ (turn_id = k): the only tokens that receive gradient
  rtpo_turn_loss          −J_k, the clipped PPO objective of Eq. 6 on turn-k tokens
  off_policy_continuation_weight
                          ω̄_j = clamp(Π_h Π_t π_θ>k / π_θ0, ρ_min, ρ_max) for the ablation that
                          reuses continuations sampled by θ_0

By name: "rtpo" in `RTPO_ADVANTAGES` (`sibling_advantages`) and `RTPO_POLICY_LOSSES`
(`rtpo_turn_loss`); `advantage_fn(name)` / `policy_loss_fn(name)` look a name up there and in the
library-wide `advantages.ADVANTAGES` / `losses.POLICY_LOSSES`.
"""

from __future__ import annotations

import functools
import math

import chex
import jax
import jax.numpy as jnp

from jaxrl_post import advantages as advantages_lib
from jaxrl_post.losses.aggregation import loss_normalizers
from jaxrl_post.losses.policy import POLICY_LOSSES, PolicyLossAux, policy_loss
from jaxrl_post.registry import Registry

# The paper does not give the clamp bounds ρ_min / ρ_max of the off-policy weight.
# PROPOSAL: [0.5, 2], a band as wide as the usual truncated-IS cap of 2 on the upper side.
DEFAULT_RHO_MIN = 0.5
DEFAULT_RHO_MAX = 2.0


def sibling_advantages(
  rewards: jax.Array,
  group_ids: jax.Array,
  *,
  num_groups: int | None = None,
  eps: float | None = None,
  reward_weights: jax.Array | None = None,
) -> jax.Array:
  """RTPO's sibling advantage: each sibling's return minus the mean over its boundary's siblings.

    V̂_k = (1/(G−1)) Σ_{j=1}^{G−1} R_j,   A^H_{j,k} = R_j − V̂_k

  The baseline includes sibling j itself and there is no division by a standard deviation, so
  E[Â | S_k, l] = ((G−2)/(G−1))·A^π(S_k, l): G = 2 (one sibling) always gives A = 0, and G = 3
  (two siblings) is the smallest useful group.

  Args:
    rewards: `[N]` terminal returns R_j of the siblings (or `[N, num_funcs]`, combined as in
      `advantages.combine_rewards`); NaN = missing (A = 0, left out of the mean).
    group_ids: `[N]` int, the boundary each sibling was forked from, in `[0, num_groups)`.
    num_groups: static number of boundaries (default: N).
    eps: unused (there is no std); accepted so that callers of an advantage registry can pass
      the same keywords to every estimator.
    reward_weights: `[num_funcs]` weights of the reward functions.

  Returns:
    `[N]` float32 advantages.

  Examples:
    >>> import jax.numpy as jnp
    >>> sibling_advantages(jnp.array([1.0, 0.0, 1.0, 1.0]), jnp.array([0, 0, 1, 1])).tolist()
    [0.5, -0.5, 0.0, 0.0]

  References:
    Li et al., RTPO: Reverse-Turn Policy Optimization, arXiv 2608.18682, §3 (Eq. for V̂_k).
  """
  del eps
  return advantages_lib.group_advantages(
    rewards, group_ids, num_groups=num_groups, std="none", reward_weights=reward_weights
  )


@functools.partial(jax.jit, static_argnames="num_groups")
def boundary_has_signal(rewards: jax.Array, group_ids: jax.Array, *, num_groups: int) -> jax.Array:
  """Whether a boundary's siblings have different returns, i.e. some advantage is non-zero.

  Where all R_j of a boundary are equal every A_j is 0, so its clipped objective and gradient
  are exactly 0: RTPO skips such boundaries instead of paying for a forward/backward pass.
  Missing (NaN) rewards are ignored; a boundary with fewer than two valid siblings has none.

  Args:
    rewards: `[N]` sibling returns, NaN = missing.
    group_ids: `[N]` int boundary ids in `[0, num_groups)`.
    num_groups: static number of boundaries.

  Returns:
    `[num_groups]` bool.

  Examples:
    >>> import jax.numpy as jnp
    >>> boundary_has_signal(jnp.array([1.0, 1.0, 0.0, 1.0]), jnp.array([0, 0, 1, 1]),
    ...                     num_groups=2).tolist()
    [False, True]
  """
  rewards = jnp.asarray(rewards, jnp.float32)
  chex.assert_rank(rewards, 1)
  chex.assert_equal_shape([rewards, group_ids])
  valid = ~jnp.isnan(rewards)
  high = jax.ops.segment_max(jnp.where(valid, rewards, -jnp.inf), group_ids, num_groups)
  low = jax.ops.segment_min(jnp.where(valid, rewards, jnp.inf), group_ids, num_groups)
  return high > low


@jax.jit
def turn_token_mask(mask: jax.Array, turn_ids: jax.Array, turn: jax.Array | int) -> jax.Array:
  """The tokens of turn k: `mask[i, t] ∧ (turn_ids[i, t] = k_i)`.

  Args:
    mask: `[B, T]` bool (or float weights) loss mask, already False on prompt, observation and
      padding tokens.
    turn_ids: `[B, T]` int, the turn index of each action token, −1 elsewhere.
    turn: `[]` or `[B]` int, the turn k trained in each row.

  Returns:
    `[B, T]` float32 mask, zero outside turn k.

  Examples:
    >>> import jax.numpy as jnp
    >>> turn_token_mask(jnp.ones((1, 4)), jnp.array([[0, 1, -1, 1]]), 1).tolist()
    [[0.0, 1.0, 0.0, 1.0]]
  """
  chex.assert_rank([mask, turn_ids], 2)
  chex.assert_equal_shape([mask, turn_ids])
  turn = jnp.asarray(turn, jnp.int32)
  chex.assert_rank(turn, {0, 1})
  k = turn[:, None] if turn.ndim == 1 else turn
  return jnp.where(turn_ids == k, jnp.asarray(mask, jnp.float32), 0.0)


def rtpo_turn_loss(
  logp: jax.Array,
  old_logp: jax.Array,
  adv: jax.Array,
  mask: jax.Array,
  *,
  turn_ids: jax.Array | None = None,
  turn: jax.Array | int | None = None,
  weight: jax.Array | None = None,
  epsilon_low: float = 0.2,
  epsilon_high: float = 0.2,
  loss_agg_mode: str = "seq-mean-token-mean",
  num_tokens: jax.Array | float | None = None,
  num_sequences: jax.Array | float | None = None,
  **kwargs,
) -> tuple[jax.Array, PolicyLossAux]:
  """RTPO's per-turn clipped objective (Eq. 6), negated to a loss, on turn-k tokens only.

    J_k(θ) = (1/(G−1)) Σ_j ω_j (1/T_{j,k}) Σ_{t=1}^{T_{j,k}} min(ρ_{j,k,t} A_j, clip(ρ_{j,k,t}) A_j)
    clip(ρ) = min(max(ρ, 1 − ε_low), 1 + ε_high)
    ρ_{j,k,t} = π_θ(a_{j,k,t} | c_k, a_{j,k,<t}) / π_θold(a_{j,k,t} | c_k, a_{j,k,<t})

  with c_k the context recorded at rollout. Only tokens with `turn_ids == turn` (and `mask`) enter:
  the context, observations, other turns and padding get no gradient. `ω_j` is the trajectory
  weight: 1 for on-policy continuations (RTPO proper), `off_policy_continuation_weight` for the
  ablation. Because ω_j > 0 and min(ρ·ωA, clip(ρ)·ωA) = ω·min(ρA, clip(ρ)A), it is applied as
  A_j ← ω_j A_j (stop-gradient). The aggregation "seq-mean-token-mean" is Eq. 6's
  (1/(G−1)) Σ_j (1/T_j) Σ_t; with several boundaries in one batch it averages over all their
  siblings.

  For exact micro-batching pass `num_tokens` / `num_sequences` computed from the turn-k mask of
  the whole batch (`loss_normalizers(turn_token_mask(...))`); the defaults count this call's
  turn-k tokens.

  Args:
    logp: `[B, T]` log π_θ of the tokens (differentiated).
    old_logp: `[B, T]` log π_θold, the policy that sampled turn k at the start of its phase.
    adv: `[B]` sibling advantages A_j (or `[B, T]`).
    mask: `[B, T]` loss mask of action tokens.
    turn_ids: `[B, T]` int turn index per action token, −1 elsewhere (default: every masked
      token belongs to the trained turn, as in a `(c_k, a_k)` row).
    turn: `[]` or `[B]` int, the boundary k of each row (required with `turn_ids`).
    weight: optional `[B]` trajectory weights ω_j ≥ 0.
    epsilon_low: ε of the lower clip (the paper's ε is not given: 0.2 is a PROPOSAL).
    epsilon_high: ε of the upper clip (same).
    loss_agg_mode: default "seq-mean-token-mean" (Eq. 6).
    num_tokens: global turn-k token count (see above).
    num_sequences: global count of rows with turn-k tokens.
    **kwargs: further `policy_loss` keywords (`max_log_ratio`, `ref_logp`, `beta`, `entropy`…);
      the objective is always "clip".

  Returns:
    `(loss, aux)`: the scalar −J_k and a `PolicyLossAux`.

  Examples:
    >>> import jax.numpy as jnp
    >>> logp = jnp.log(jnp.array([[0.6, 0.5, 0.5]]))
    >>> old = jnp.log(jnp.array([[0.4, 0.5, 0.5]]))  # ratios 1.5, 1, 1
    >>> loss, _ = rtpo_turn_loss(logp, old, jnp.array([1.0]), jnp.ones((1, 3)),
    ...                          turn_ids=jnp.array([[2, 2, 3]]), turn=2)
    >>> round(float(loss), 4)  # turn 2 only: −(1.2 + 1)/2, the first ratio clipped at 1 + ε
    -1.1

  References:
    Li et al., RTPO: Reverse-Turn Policy Optimization, arXiv 2608.18682, Eq. 5–6.
    Schulman et al., PPO, arXiv 1707.06347.
  """
  if kwargs.get("objective", "clip") != "clip":
    raise ValueError(f"rtpo_turn_loss is a clip objective; got objective={kwargs['objective']!r}")
  kwargs.pop("objective", None)
  if turn_ids is not None:
    if turn is None:
      raise ValueError("rtpo_turn_loss: turn_ids needs turn, the boundary k of each row")
    mask = turn_token_mask(mask, turn_ids, turn)
  if weight is not None:
    weight = jax.lax.stop_gradient(jnp.asarray(weight, jnp.float32))
    chex.assert_rank(weight, 1)
    adv = jnp.asarray(adv, jnp.float32)
    adv = adv * (weight if adv.ndim == 1 else weight[:, None])
  if num_tokens is None or num_sequences is None:
    local = loss_normalizers(jnp.asarray(mask, jnp.float32))
    num_tokens = local.num_tokens if num_tokens is None else num_tokens
    num_sequences = local.num_sequences if num_sequences is None else num_sequences
  return policy_loss(
    logp,
    old_logp,
    adv,
    mask,
    loss_agg_mode=loss_agg_mode,
    objective="clip",
    epsilon_low=epsilon_low,
    epsilon_high=epsilon_high,
    num_tokens=num_tokens,
    num_sequences=num_sequences,
    **kwargs,
  )


@functools.partial(jax.jit, static_argnames=("rho_min", "rho_max"))
def off_policy_continuation_weight(
  logp: jax.Array,
  behaviour_logp: jax.Array,
  mask: jax.Array,
  *,
  rho_min: float = DEFAULT_RHO_MIN,
  rho_max: float = DEFAULT_RHO_MAX,
) -> jax.Array:
  """The trajectory weight of the off-policy-continuation ablation (arXiv 2608.18682, §4).

    ω̄_j = clamp( Π_{h>k} Π_t π_θ>k(a_{j,h,t} | c_h, a_{j,h,<t}) / π_θ0(a_{j,h,t} | c_h, a_{j,h,<t}),
                 ρ_min, ρ_max )

  over the tokens of sibling j's continuation turns h = k+1, k+2, … (sampled by θ_0 at the start
  of the sweep, re-scored by θ_>k, the parameters already updated on turns k+1..K−1). The product
  is taken in log space (a sum of log-ratios) and clamped there, so a long continuation cannot
  overflow; since exp is monotone this is exactly the clamp of the product. RTPO proper samples
  continuations with θ_>k, where ω ≡ 1. No gradient flows through ω̄.

  Args:
    logp: `[N, T]` log π_θ>k of the continuation tokens, all turns h > k of a sibling in one
      row (any layout: only the masked sum matters).
    behaviour_logp: `[N, T]` log π_θ0 recorded when they were sampled.
    mask: `[N, T]` True on continuation action tokens (never observations); a row without any
      (the sibling ended at turn k) gets ω̄ = clamp(1).
    rho_min: lower clamp ρ_min ≥ 0 (not given by the paper; 0.5 is a PROPOSAL).
    rho_max: upper clamp ρ_max ≥ ρ_min (not given; 2.0 is a PROPOSAL).

  Returns:
    `[N]` float32 weights, stop-gradient.

  Examples:
    >>> import jax.numpy as jnp
    >>> new = jnp.log(jnp.array([[0.6, 0.8], [0.1, 0.9]]))
    >>> old = jnp.log(jnp.array([[0.4, 0.8], [0.9, 0.9]]))  # products 1.5 and 1/9
    >>> [round(float(w), 4) for w in off_policy_continuation_weight(new, old, jnp.ones((2, 2)))]
    [1.5, 0.5]

  References:
    Li et al., RTPO: Reverse-Turn Policy Optimization, arXiv 2608.18682, §4 (on- vs off-policy
    continuation ablation).
  """
  chex.assert_rank([logp, behaviour_logp, mask], 2)
  chex.assert_equal_shape([logp, behaviour_logp, mask])
  if not 0.0 <= rho_min <= rho_max:
    raise ValueError(f"need 0 <= rho_min <= rho_max, got {rho_min} and {rho_max}")
  valid = jnp.asarray(mask) > 0
  log_weight = jnp.sum(jnp.where(valid, logp - behaviour_logp, 0.0), axis=-1)
  low = math.log(rho_min) if rho_min > 0 else -jnp.inf
  log_weight = jnp.clip(log_weight, low, math.log(rho_max))
  return jax.lax.stop_gradient(jnp.exp(log_weight).astype(jnp.float32))


# RTPO's registry entries. They live here instead of being added to `advantages.ADVANTAGES` and
# `losses.POLICY_LOSSES` when this module is imported: tests pin the names in those registries,
# and registries whose contents depend on which modules happen to be imported make such tests
# (and a config's validity) order-dependent. Moving them there is a change to
# `jaxrl_post/losses/__init__.py` and those tests.
RTPO_ADVANTAGES: Registry = Registry("advantage")
RTPO_ADVANTAGES.add("rtpo", sibling_advantages)
RTPO_POLICY_LOSSES: Registry = Registry("policy_loss")
RTPO_POLICY_LOSSES.add("rtpo", rtpo_turn_loss)


def _lookup(name: str, own: Registry, shared: Registry):
  if name in own:
    return own.get(name)
  if name in shared:
    return shared.get(name)
  valid = ", ".join(sorted({*own.names(), *shared.names()}))
  raise KeyError(f"unknown {shared.kind} {name!r}; valid names: {valid}")


def advantage_fn(name: str):
  """The advantage estimator `name`: "rtpo" or any name of `advantages.ADVANTAGES`.

  Raises:
    KeyError: for an unknown name, listing the valid ones.
  """
  return _lookup(name, RTPO_ADVANTAGES, advantages_lib.ADVANTAGES)


def policy_loss_fn(name: str):
  """The policy loss `name`: "rtpo" or any name of `losses.POLICY_LOSSES`.

  Raises:
    KeyError: for an unknown name, listing the valid ones.
  """
  return _lookup(name, RTPO_POLICY_LOSSES, POLICY_LOSSES)
