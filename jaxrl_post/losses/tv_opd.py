"""TV-OPD (arXiv 2609.08341): sign-only on-policy distillation with a TV-driven global coefficient.

Sampled-token OPD scores every student token by Δ = log p(a|s) − log q_θ̄(a|s) (teacher p,
student q at the rollout parameters θ̄). TV-OPD keeps only the sign of Δ and multiplies it by
one *global* coefficient c_k that shrinks as an estimate of the total variation between teacher
and student shrinks:

  tv_estimate         d̂ = [1 − e^Δ]_+ = −expm1(min(Δ, 0)), returned as (Σ_active d̂, N_active)
  tv_opd_advantages   A = c_k·sign(Δ)·m, and the scheduler state advanced with the step's D̂_k
  tv_opd_advance      the scheduler update alone (EMA D̄_k, frozen D_ref, next coefficient)
  tv_opd_commit       keep the old state where the step turned out non-finite

The step statistic is token-pooled: D̂_k = Σ d̂ / max(N, 1) with the numerator and the count
summed over all micro-batches and devices *before* dividing (not a mean of micro-batch means).
`tv_estimate` returns a `TVStats(sum, count)` pytree for that reason: add them over
micro-batches (`jax.tree.map(jnp.add, a, b)`), `jax.lax.psum` them inside `shard_map` (or pass
`axis_name`), or just call it under `jax.jit` on the global (sharded) batch.

Scheduler (Eq. 11):

  D̄_k = β D̄_{k−1} + (1−β) D̂_k,     c_k = clip(((D̄_{k−1} + ε)/(D_ref + ε))^α, c_min, 1),
  c_1 = 1; the first valid step sets D_ref = D̄ = D̂ (D_ref is then frozen).

c_k depends only on statistics up to step k−1 (predictable): `tv_opd_advantages` multiplies by
the coefficient stored in the incoming state and stores the *next* coefficient in the new state.

Skipping a step. A step whose gradient norm is non-finite must not advance the scheduler. The
gradient is only known after the advantages were used, so the caller does:

  adv, proposed = tv_opd_advantages(teacher_logp, old_logp, mask, state)
  ... loss, grads ...
  state = tv_opd_commit(state, proposed, finite=jnp.isfinite(grad_norm))

(or passes `finite=` directly to `tv_opd_advantages` / `tv_opd_advance` when it is known up
front). The update is also skipped on its own when the pooled statistic is not usable: no active
token (N = 0) or a non-finite D̂. `TVOPDState` is a NamedTuple of arrays: keep it in the
method's checkpointed state.

`c_k` multiplies the whole policy-gradient loss. Because c_k > 0, scaling the advantage by c_k
is the same thing, also for the PPO-clipped surrogate (min(ρA, clip(ρ)A) is positively
homogeneous in A). The loss is then the usual one, e.g.
`policy_loss(logp, old_logp, adv, mask, loss_agg_mode="token-mean")`.

The ablation family of Eq. 7 is in `TV_OPD_ADVANTAGES` ("raw", "sign", "group_constant",
"permuted"); every entry takes `(teacher_logp, old_logp, mask, *, key=None, axis_name=None)`.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from jaxrl_post.registry import Registry

# Hyperparameters of arXiv 2609.08341. The paper does not give ε: PROPOSAL 1e-8.
ALPHA = 0.5
BETA = 0.95
C_MIN = 0.1
EPS = 1e-8

TV_OPD_ADVANTAGES: Registry = Registry("TV-OPD advantage")


class TVStats(NamedTuple):
  """Additive statistics of the sampled-token TV estimator (sum and count of active tokens)."""

  sum: jax.Array  # [] float32, Σ_active d̂.
  count: jax.Array  # [] float32, N_active.

  def mean(self) -> jax.Array:
    """D̂ = sum / max(count, 1)."""
    return self.sum / jnp.maximum(self.count, 1.0)


class TVOPDState(NamedTuple):
  """Scheduler state of TV-OPD; all scalars. Checkpoint it with the method's state."""

  D_bar: jax.Array  # [] float32, EMA D̄ of the pooled step statistic D̂.
  D_ref: jax.Array  # [] float32, D̂ of the first valid step (then frozen).
  c: jax.Array  # [] float32, the coefficient for the *next* step's advantages.
  initialized: jax.Array  # [] bool, False until the first valid step.


def init_tv_opd_state() -> TVOPDState:
  """The state before the first step: c_1 = 1, not initialised (D_ref is set by step 1).

  Examples:
    >>> s = init_tv_opd_state()
    >>> float(s.c), bool(s.initialized)
    (1.0, False)
  """
  return TVOPDState(
    D_bar=jnp.zeros((), jnp.float32),
    D_ref=jnp.zeros((), jnp.float32),
    c=jnp.ones((), jnp.float32),
    initialized=jnp.zeros((), bool),
  )


def _delta(teacher_logp, old_logp, mask):
  chex.assert_rank([teacher_logp, old_logp, mask], 2)
  chex.assert_equal_shape([teacher_logp, old_logp, mask])
  valid = jnp.asarray(mask) > 0
  delta = jnp.asarray(teacher_logp, jnp.float32) - jnp.asarray(old_logp, jnp.float32)
  # Padding may hold −inf / NaN log-probs: it must not reach any sum.
  return jax.lax.stop_gradient(jnp.where(valid, delta, 0.0)), valid


@functools.partial(jax.jit, static_argnames="axis_name")
def tv_estimate(
  teacher_logp: jax.Array,
  logp: jax.Array,
  mask: jax.Array,
  *,
  axis_name: str | None = None,
) -> TVStats:
  """Sampled-token total-variation estimator, as a (sum, count) pair to pool before dividing.

    d̂(s,a) = [1 − p(a|s)/q(a|s)]_+ = [1 − e^Δ]_+ = −expm1(min(Δ, 0)),  Δ = log p − log q

  With a ~ q, E[d̂] = Σ_a (q(a) − p(a))_+ = D_TV(p, q); d̂ ∈ [0, 1], so its variance is at most
  1/4 (Eq. 9–10). Pass the log-probs of the student that sampled the tokens (`old_logp`).

  Args:
    teacher_logp: `[batch, time]` teacher log-probs log p of the sampled tokens.
    logp: `[batch, time]` student log-probs log q of the same tokens (rollout parameters).
    mask: `[batch, time]` loss mask; tokens with mask > 0 are active. Padding may hold ±inf/NaN.
    axis_name: inside `shard_map`, the mesh axis to `psum` the sums over (None: local sums;
      under `jax.jit` on a sharded global batch the sums are already global).

  Returns:
    `TVStats(sum, count)`: float32 Σ_active d̂ and the number of active tokens, stop-gradient.
    `stats.mean()` is the step statistic D̂.

  Examples:
    >>> import jax.numpy as jnp
    >>> s = tv_estimate(jnp.log(jnp.array([[0.25, 0.5, 0.1]])),
    ...                 jnp.log(jnp.array([[0.5, 0.25, 0.9]])), jnp.array([[1, 1, 0]]))
    >>> float(s.sum), float(s.count)  # [1 − ½]_+ + [1 − 2]_+ ; the third token is padding
    (0.5, 2.0)

  References:
    Xiao et al., TV-Regulated OPD: Direction Matters in On-Policy Distillation, arXiv 2609.08341,
    Eq. 9–10 and its token-pooled step statistic.
  """
  delta, valid = _delta(teacher_logp, logp, mask)
  d_hat = jnp.where(valid, -jnp.expm1(jnp.minimum(delta, 0.0)), 0.0)
  stats = TVStats(jnp.sum(d_hat), jnp.sum(valid, dtype=jnp.float32))
  if axis_name is not None:
    stats = jax.lax.psum(stats, axis_name)
  return stats


@jax.jit
def tv_opd_commit(state: TVOPDState, new_state: TVOPDState, finite: jax.Array | bool) -> TVOPDState:
  """`new_state` where `finite`, else `state`: a non-finite step leaves the scheduler as it was.

  Examples:
    >>> s = init_tv_opd_state()
    >>> t = s._replace(c=jnp.float32(0.5), initialized=jnp.bool_(True))
    >>> float(tv_opd_commit(s, t, False).c), float(tv_opd_commit(s, t, True).c)
    (1.0, 0.5)
  """
  finite = jnp.asarray(finite, bool)
  return jax.tree.map(lambda new, old: jnp.where(finite, new, old), new_state, state)


@jax.jit
def tv_opd_advance(
  state: TVOPDState,
  stats: TVStats,
  *,
  alpha: float = ALPHA,
  beta: float = BETA,
  c_min: float = C_MIN,
  eps: float = EPS,
  finite: jax.Array | bool = True,
) -> TVOPDState:
  """One scheduler step of TV-OPD from the token-pooled statistic of step k (Eq. 11).

    D̂_k = stats.sum / max(stats.count, 1)
    first valid step:  D_ref = D̄_k = D̂_k          later:  D̄_k = β D̄_{k−1} + (1−β) D̂_k
    c_{k+1} = clip(((D̄_k + ε)/(D_ref + ε))^α, c_min, 1)

  The step is skipped (state returned unchanged) when `finite` is False, when no token was
  active (count = 0) or when D̂_k is not finite.

  Args:
    state: the scheduler state after step k−1.
    stats: `TVStats` of step k, summed over all micro-batches and devices.
    alpha: exponent α (paper 0.5; sweep {0.5, 1, 2, 4}).
    beta: EMA factor β (paper 0.95).
    c_min: lower clip of the coefficient (paper 0.1).
    eps: ε in the ratio. Not given by the paper: PROPOSAL 1e-8.
    finite: False skips the update (the step's gradient norm was not finite).

  Returns:
    The state after step k; its `c` is the coefficient of step k+1.

  Examples:
    >>> import jax.numpy as jnp
    >>> s = tv_opd_advance(init_tv_opd_state(), TVStats(jnp.float32(4.0), jnp.float32(10.0)))
    >>> round(float(s.D_ref), 4), round(float(s.D_bar), 4), float(s.c)  # step 1: D_ref = D̂
    (0.4, 0.4, 1.0)
    >>> s = tv_opd_advance(s, TVStats(jnp.float32(0.0), jnp.float32(10.0)))
    >>> round(float(s.D_bar), 4), round(float(s.c), 4)  # 0.95·0.4; √(0.38/0.4)
    (0.38, 0.9747)

  References:
    Xiao et al., arXiv 2609.08341, Eq. 11.
  """
  stats = TVStats(*(jnp.asarray(x, jnp.float32) for x in stats))
  d_hat = stats.mean()
  valid = jnp.asarray(finite, bool) & (stats.count > 0) & jnp.isfinite(d_hat)
  d_ref = jnp.where(state.initialized, state.D_ref, d_hat)
  d_bar = jnp.where(state.initialized, beta * state.D_bar + (1.0 - beta) * d_hat, d_hat)
  c = jnp.clip(((d_bar + eps) / (d_ref + eps)) ** alpha, c_min, 1.0)
  proposed = TVOPDState(
    D_bar=d_bar.astype(jnp.float32),
    D_ref=d_ref.astype(jnp.float32),
    c=c.astype(jnp.float32),
    initialized=jnp.ones((), bool),
  )
  return tv_opd_commit(state, proposed, valid)


@functools.partial(jax.jit, static_argnames="axis_name")
def tv_opd_advantages(
  teacher_logp: jax.Array,
  old_logp: jax.Array,
  mask: jax.Array,
  state: TVOPDState,
  *,
  alpha: float = ALPHA,
  beta: float = BETA,
  c_min: float = C_MIN,
  eps: float = EPS,
  stats: TVStats | None = None,
  axis_name: str | None = None,
  finite: jax.Array | bool = True,
) -> tuple[jax.Array, TVOPDState]:
  """TV-OPD token advantages of step k and the scheduler state after step k.

    Δ = log p − log q_θ̄,   A^TVR[i,t] = c_k · sign(Δ[i,t]) · m[i,t]   (sign(0) = 0)

  with c_k = `state.c` (fixed before the step: predictable) and the new state from
  `tv_opd_advance(state, stats)` where `stats` defaults to `tv_estimate` of this batch.

  Micro-batches: the advantages of every micro-batch use the same `state`; pass the pooled
  `stats` (summed over all micro-batches of the step) so that each call returns the same new
  state, or call `tv_opd_advance` once per step. Inside `shard_map` pass `axis_name` to psum the
  local statistic over devices. See the module docstring for skipping a non-finite step.

  Args:
    teacher_logp: `[batch, time]` teacher log-probs of the sampled tokens.
    old_logp: `[batch, time]` log-probs of the student that sampled them (rollout parameters).
    mask: `[batch, time]` loss mask (> 0 = active); padding may hold ±inf / NaN.
    state: `TVOPDState` after step k−1 (`init_tv_opd_state()` before step 1).
    alpha: α (0.5). beta: β (0.95). c_min: lower clip of c (0.1). eps: ε (PROPOSAL 1e-8).
    stats: the step's pooled `TVStats`; default: this batch's (psummed over `axis_name`).
    axis_name: mesh axis to psum the default statistic over inside `shard_map`.
    finite: False returns `state` unchanged (a skipped step).

  Returns:
    `(adv, new_state)`: `[batch, time]` float32 advantages (stop-gradient, 0 on padding) and
    the state whose `c` is step k+1's coefficient.

  Examples:
    >>> import jax.numpy as jnp
    >>> s = init_tv_opd_state()._replace(c=jnp.float32(0.5), initialized=jnp.bool_(True))
    >>> adv, _ = tv_opd_advantages(jnp.log(jnp.array([[0.25, 0.5, 0.3]])),
    ...                            jnp.log(jnp.array([[0.5, 0.25, 0.3]])), jnp.ones((1, 3)), s)
    >>> adv.tolist()
    [[-0.5, 0.5, 0.0]]

  References:
    Xiao et al., TV-Regulated OPD: Direction Matters in On-Policy Distillation, arXiv 2609.08341,
    Eq. 11 and Algorithm.
  """
  delta, valid = _delta(teacher_logp, old_logp, mask)
  if stats is None:
    stats = tv_estimate(teacher_logp, old_logp, mask, axis_name=axis_name)
  adv = jnp.where(valid, state.c * jnp.sign(delta), 0.0)
  new_state = tv_opd_advance(state, stats, alpha=alpha, beta=beta, c_min=c_min, eps=eps,
                             finite=finite)
  return jax.lax.stop_gradient(adv), new_state


# ---------------------------------------------------------------------------------------------
# The ablation family of Eq. 7: z = sign(Δ), m = |Δ|.
# ---------------------------------------------------------------------------------------------


@TV_OPD_ADVANTAGES.register("raw")
@functools.partial(jax.jit, static_argnames="axis_name")
def raw_opd_advantages(
  teacher_logp: jax.Array,
  old_logp: jax.Array,
  mask: jax.Array,
  *,
  key: jax.Array | None = None,
  axis_name: str | None = None,
) -> jax.Array:
  """Raw OPD coefficient (Eq. 1): A = z·m = Δ = log p − log q_θ̄ on active tokens.

  Args:
    teacher_logp: `[batch, time]` teacher log-probs of the sampled tokens.
    old_logp: `[batch, time]` rollout student log-probs of the same tokens.
    mask: `[batch, time]` loss mask.
    key: unused (the registry's common signature).
    axis_name: unused (nothing is pooled).

  Returns:
    `[batch, time]` float32, stop-gradient, 0 on padding.

  Examples:
    >>> import jax.numpy as jnp
    >>> a = raw_opd_advantages(jnp.log(jnp.array([[0.25, 0.5]])),
    ...                        jnp.log(jnp.array([[0.5, 0.25]])), jnp.ones((1, 2)))
    >>> [round(x, 4) for x in a[0].tolist()]
    [-0.6931, 0.6931]

  References:
    Xiao et al., arXiv 2609.08341, Eq. 1 and Eq. 7 ("Raw").
  """
  del key, axis_name
  return _delta(teacher_logp, old_logp, mask)[0]


@TV_OPD_ADVANTAGES.register("sign")
@functools.partial(jax.jit, static_argnames="axis_name")
def sign_opd_advantages(
  teacher_logp: jax.Array,
  old_logp: jax.Array,
  mask: jax.Array,
  *,
  key: jax.Array | None = None,
  axis_name: str | None = None,
) -> jax.Array:
  """Sign-only OPD ("Sign-TV", Eq. 7): A = z = sign(Δ), sign(0) = 0.

  E_{a~q}[sign(Δ) ∇log q(a)] = −2 ∇D_TV(p, q) (Eq. 8): sign-only OPD is conditional TV descent.
  TV-OPD is this times the global coefficient c_k (`tv_opd_advantages`).

  Args:
    teacher_logp, old_logp, mask: as in `raw_opd_advantages`.
    key, axis_name: unused (the registry's common signature).

  Returns:
    `[batch, time]` float32 in {−1, 0, 1}, 0 on padding.

  Examples:
    >>> import jax.numpy as jnp
    >>> sign_opd_advantages(jnp.log(jnp.array([[0.25, 0.5, 0.3]])),
    ...                     jnp.log(jnp.array([[0.5, 0.25, 0.3]])), jnp.ones((1, 3))).tolist()
    [[-1.0, 1.0, 0.0]]

  References:
    Xiao et al., arXiv 2609.08341, Eq. 7 ("Sign") and Eq. 8.
  """
  del key, axis_name
  return jnp.sign(_delta(teacher_logp, old_logp, mask)[0])


@TV_OPD_ADVANTAGES.register("group_constant")
@functools.partial(jax.jit, static_argnames="axis_name")
def group_constant_opd_advantages(
  teacher_logp: jax.Array,
  old_logp: jax.Array,
  mask: jax.Array,
  *,
  key: jax.Array | None = None,
  axis_name: str | None = None,
) -> jax.Array:
  """Group-constant ablation (Eq. 7): A = z·κ_z, κ_z the mean |Δ| of the tokens with sign z.

    κ_+ = Σ_{Δ>0} |Δ| / #{Δ>0},  κ_− = Σ_{Δ<0} |Δ| / #{Δ<0}   over the active tokens

  Keeps the sign and the average magnitude of each sign group, drops the token-wise magnitude.
  The paper does not say over which set κ is averaged; here (PROPOSAL) it is token-pooled over
  the whole step batch like D̂: under `jax.jit` on the global batch, or psummed over
  `axis_name` inside `shard_map`.

  Args:
    teacher_logp, old_logp, mask: as in `raw_opd_advantages`.
    key: unused (the registry's common signature).
    axis_name: mesh axis to psum the sign-group sums and counts over inside `shard_map`.

  Returns:
    `[batch, time]` float32, stop-gradient, 0 on padding and where Δ = 0.

  Examples:
    >>> import jax.numpy as jnp
    >>> a = group_constant_opd_advantages(jnp.array([[-1.0, -3.0, 2.0, 4.0, 0.0]]),
    ...                                   jnp.zeros((1, 5)), jnp.ones((1, 5)))
    >>> a.tolist()  # κ_− = (1 + 3)/2, κ_+ = (2 + 4)/2
    [[-2.0, -2.0, 3.0, 3.0, 0.0]]

  References:
    Xiao et al., arXiv 2609.08341, Eq. 7 ("Group-Constant").
  """
  del key
  delta, valid = _delta(teacher_logp, old_logp, mask)
  pos, neg = valid & (delta > 0), valid & (delta < 0)
  sums = jnp.stack([jnp.sum(jnp.where(pos, delta, 0.0)), jnp.sum(jnp.where(neg, -delta, 0.0)),
                    jnp.sum(pos, dtype=jnp.float32), jnp.sum(neg, dtype=jnp.float32)])
  if axis_name is not None:
    sums = jax.lax.psum(sums, axis_name)
  kappa_pos = sums[0] / jnp.maximum(sums[2], 1.0)
  kappa_neg = sums[1] / jnp.maximum(sums[3], 1.0)
  return jnp.where(pos, kappa_pos, jnp.where(neg, -kappa_neg, 0.0))


@TV_OPD_ADVANTAGES.register("permuted")
@functools.partial(jax.jit, static_argnames="axis_name")
def permuted_opd_advantages(
  teacher_logp: jax.Array,
  old_logp: jax.Array,
  mask: jax.Array,
  *,
  key: jax.Array | None = None,
  axis_name: str | None = None,
) -> jax.Array:
  """Permuted ablation (Eq. 7): A_i = z_i·m_σ(i), σ a uniform shuffle within each sign group.

  Keeps the sign of every token and the multiset of magnitudes of each sign group, but assigns
  the magnitudes to tokens at random (breaks the token ↔ magnitude link). The shuffle runs over
  all active tokens of the batch (PROPOSAL, as for "group_constant": the whole step batch), so
  call it under `jax.jit` on the global batch; it does not run inside `shard_map`.

  Implementation with fixed shapes: stable-sort the tokens by sign group (original order) and by
  (sign group, uniform noise) (random order); the k-th token of a group in original order gets
  the magnitude of the k-th token of the same group in random order.

  Args:
    teacher_logp, old_logp, mask: as in `raw_opd_advantages`.
    key: a PRNG key (required).
    axis_name: must be None.

  Returns:
    `[batch, time]` float32, stop-gradient, 0 on padding and where Δ = 0.

  Raises:
    ValueError: without a key, or with an `axis_name`.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> a = permuted_opd_advantages(jnp.array([[-1.0, 2.0, -3.0, 4.0]]), jnp.zeros((1, 4)),
    ...                             jnp.ones((1, 4)), key=jax.random.key(0))
    >>> sorted(abs(x) for x in a[0, ::2].tolist()), sorted(a[0, 1::2].tolist())
    ([1.0, 3.0], [2.0, 4.0])

  References:
    Xiao et al., arXiv 2609.08341, Eq. 7 ("Permuted").
  """
  if key is None:
    raise ValueError("the 'permuted' TV-OPD ablation needs a PRNG key (key=...)")
  if axis_name is not None:
    raise ValueError("the 'permuted' TV-OPD ablation shuffles over the whole batch: call it "
                     "under jax.jit on the global batch, not inside shard_map (axis_name)")
  delta, valid = _delta(teacher_logp, old_logp, mask)
  flat = delta.reshape(-1)
  ok = valid.reshape(-1)
  # Sign groups: 0 = negative, 1 = zero or inactive, 2 = positive.
  group = jnp.where(ok & (flat < 0), 0, jnp.where(ok & (flat > 0), 2, 1)).astype(jnp.int32)
  noise = jax.random.uniform(key, flat.shape)
  original = jnp.argsort(group, stable=True)
  shuffled = jnp.lexsort((noise, group))
  magnitude = jnp.zeros_like(flat).at[original].set(jnp.abs(flat)[shuffled])
  out = jnp.sign(flat) * jnp.where(group == 1, 0.0, magnitude)
  return out.reshape(delta.shape)
