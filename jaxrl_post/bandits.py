"""Contextual linear bandits (LinUCB, linear Thompson sampling) as pytree state.

RAIL (arXiv 2608.05080) picks rollout interventions with an online contextual bandit whose
reward is the realised gain of the chosen intervention. The policy keeps changing, so the
bandit must forget: the design matrix is discounted by γ per update (γ = 0.99 in the PROPOSAL
reconstruction), which weights an observation k updates old by γ^k.

Model: the utility of an arm with joint features x = φ(z, a) ∈ R^d is u ≈ xᵀθ. With the
regularised, discounted least-squares statistics

  A = reg·I + Σ_k γ^{t−k} x_k x_kᵀ,    b = Σ_k γ^{t−k} u_k x_k,    θ̂ = A⁻¹ b

  LinUCB:  score_a = x_aᵀθ̂ + α·sqrt(x_aᵀ A⁻¹ x_a),   pick argmax_a
  LinTS:   θ̃ ~ N(θ̂, s²·A⁻¹),                         pick argmax_a x_aᵀθ̃

Both selectors share `linucb_init` and `linucb_update`. `LinearBanditState` is a NamedTuple
(a pytree), fixed shape, so init / update / select all jit and scan. Solves use
`jnp.linalg.solve` / Cholesky, never an explicit inverse.

`BANDITS` names the selectors: "linucb", "lints"; both are called as
`select(state, features, rng, **knobs)` (LinUCB ignores `rng`).

References:
  Li et al., A Contextual-Bandit Approach to Personalized News Article Recommendation (LinUCB),
  arXiv 1003.0146. Agrawal & Goyal, Thompson Sampling for Contextual Bandits with Linear
  Payoffs, arXiv 1209.3352. Russac et al., Weighted Linear Bandits for Non-Stationary
  Environments (discounted LinUCB), arXiv 1909.09146. RAIL: Optimizing What Policies Learn
  From: Recoverability-aware Rollout Intervention Learning, arXiv 2608.05080.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import jax.scipy.linalg

from jaxrl_post.registry import Registry

ArrayLike = jax.Array | float | int

BANDITS: Registry = Registry("bandit")

# RAIL (arXiv 2608.05080) PROPOSAL reconstruction: discount per update.
RAIL_DISCOUNT = 0.99


class LinearBanditState(NamedTuple):
  """Sufficient statistics of a (discounted) ridge-regression bandit."""

  A: jax.Array  # [d, d] float32 design matrix reg·I + Σ γ^k x xᵀ (symmetric positive definite).
  b: jax.Array  # [d] float32 Σ γ^k u x.
  count: jax.Array  # [] int32 number of updates so far.
  reg: jax.Array  # [] float32 ridge prior strength (kept so updates can keep reg·I undiscounted).


class ArmScores(NamedTuple):
  """Per-arm LinUCB quantities."""

  ucb: jax.Array  # [n_arms] mean + α·width: the LinUCB selection score.
  lcb: jax.Array  # [n_arms] mean − α·width: a pessimistic utility (RAIL's shadow-to-live test).
  mean: jax.Array  # [n_arms] xᵀθ̂, the predicted utility.
  width: jax.Array  # [n_arms] sqrt(xᵀA⁻¹x), the confidence width before α.


def linucb_init(dim: int, *, reg: float = 1.0) -> LinearBanditState:
  """Empty bandit statistics: A = reg·I, b = 0.

  Args:
    dim: feature dimension d ≥ 1 (of `joint_features`).
    reg: ridge prior strength > 0 (keeps A invertible before any data).

  Returns:
    `LinearBanditState(A [d, d], b [d], count = 0, reg)`.

  Examples:
    >>> s = linucb_init(2, reg=0.5)
    >>> s.A.tolist(), s.b.tolist(), int(s.count)
    ([[0.5, 0.0], [0.0, 0.5]], [0.0, 0.0], 0)
  """
  if not isinstance(dim, int) or isinstance(dim, bool) or dim < 1:
    raise ValueError(f"dim must be a positive int (the feature dimension), got {dim!r}")
  if not isinstance(reg, jax.core.Tracer) and not float(reg) > 0:
    raise ValueError(f"reg must be > 0 (it keeps A invertible), got {reg!r}")
  reg = jnp.asarray(reg, jnp.float32)
  return LinearBanditState(
    A=reg * jnp.eye(dim, dtype=jnp.float32),
    b=jnp.zeros((dim,), jnp.float32),
    count=jnp.zeros((), jnp.int32),
    reg=reg,
  )


def _check_features(state: LinearBanditState, features) -> jax.Array:
  features = jnp.asarray(features, jnp.float32)
  d = state.b.shape[0]
  if features.ndim != 2:
    raise ValueError(f"features must be [n_arms, d] = [n_arms, {d}], got shape "
                     f"{tuple(features.shape)}")
  if features.shape[0] == 0:
    raise ValueError("features has no arms (n_arms = 0); a bandit needs at least one arm")
  if features.shape[1] != d:
    raise ValueError(f"features has shape {tuple(features.shape)}; expected [n_arms, {d}] "
                     "(the state's feature dimension)")
  return features


def _theta(state: LinearBanditState) -> jax.Array:
  return jnp.linalg.solve(state.A, state.b)


@jax.jit
def _linucb_scores(state, features, alpha):
  mean = features @ _theta(state)
  # x_aᵀ A⁻¹ x_a for every arm via one solve against all arms' features.
  a_inv_x = jnp.linalg.solve(state.A, features.T)  # [d, n_arms]
  width = jnp.sqrt(jnp.maximum(jnp.sum(features.T * a_inv_x, axis=0), 0.0))
  return ArmScores(mean + alpha * width, mean - alpha * width, mean, width)


def linucb_scores(
    state: LinearBanditState, features: jax.Array, *, alpha: ArrayLike = 1.0
) -> ArmScores:
  """LinUCB's per-arm optimistic and pessimistic utilities.

  θ̂ = A⁻¹b,  mean_a = x_aᵀθ̂,  width_a = sqrt(x_aᵀA⁻¹x_a),  ucb / lcb = mean ± α·width

  Args:
    state: bandit statistics with feature dimension d.
    features: `[n_arms, d]` joint features x_a = φ(z, a), one row per arm.
    alpha: exploration weight α ≥ 0.

  Returns:
    `ArmScores(ucb, lcb, mean, width)`, each `[n_arms]` float32.

  Examples:
    >>> import jax.numpy as jnp
    >>> s = linucb_init(2)
    >>> linucb_scores(s, jnp.array([[3.0, 4.0]]), alpha=2.0).ucb.tolist()
    [10.0]

  References:
    Li et al., A Contextual-Bandit Approach to Personalized News Article Recommendation,
    arXiv 1003.0146.
  """
  features = _check_features(state, features)
  return _linucb_scores(state, features, jnp.asarray(alpha, jnp.float32))


@BANDITS.register("linucb")
def linucb_select(
    state: LinearBanditState,
    features: jax.Array,
    rng: jax.Array | None = None,
    *,
    alpha: ArrayLike = 1.0,
) -> jax.Array:
  """LinUCB arm choice: argmax_a x_aᵀθ̂ + α·sqrt(x_aᵀA⁻¹x_a) (first index on ties).

  Args:
    state: bandit statistics with feature dimension d.
    features: `[n_arms, d]` joint features, n_arms ≥ 1.
    rng: unused (LinUCB is deterministic); accepted so every `BANDITS` entry is called alike.
    alpha: exploration weight α ≥ 0.

  Returns:
    `[]` int32 arm index.

  Examples:
    >>> import jax.numpy as jnp
    >>> s = linucb_update(linucb_init(2), jnp.array([1.0, 0.0]), 1.0)
    >>> int(linucb_select(s, jnp.array([[1.0, 0.0], [0.0, 1.0]]), alpha=0.0))
    0

  References:
    Li et al., A Contextual-Bandit Approach to Personalized News Article Recommendation,
    arXiv 1003.0146.
  """
  del rng
  return jnp.argmax(linucb_scores(state, features, alpha=alpha).ucb).astype(jnp.int32)


@functools.partial(jax.jit, static_argnames="discount_prior")
def _linucb_update(state, x, u, gamma, discount_prior):
  eye = jnp.eye(x.shape[0], dtype=jnp.float32)
  if discount_prior:
    a = gamma * state.A
  else:
    # γ(reg·I + D) + (1 − γ)·reg·I = reg·I + γD: only the data part is forgotten.
    a = gamma * state.A + (1.0 - gamma) * state.reg * eye
  a = a + jnp.outer(x, x)
  b = gamma * state.b + u * x
  return LinearBanditState(a, b, state.count + 1, state.reg)


def linucb_update(
    state: LinearBanditState,
    x: jax.Array,
    u: ArrayLike,
    *,
    gamma: ArrayLike = RAIL_DISCOUNT,
    discount_prior: bool = False,
) -> LinearBanditState:
  """Discounted ridge update with one observed (features, utility) pair.

  A ← reg·I + γ(A − reg·I) + x xᵀ,   b ← γ b + u x

  PROPOSAL: the reconstruction's A ← γA + x xᵀ also discounts the prior, so a direction that
  stops receiving data decays as γ^t·reg and A drifts towards singular (θ̂ and the widths blow
  up). By default (`discount_prior=False`) only the data part is discounted and reg·I is kept,
  so A ⪰ reg·I stays invertible; `discount_prior=True` gives the sketch's update. γ = 1 is the
  ordinary (stationary) LinUCB update.

  Args:
    state: bandit statistics with feature dimension d.
    x: `[d]` joint features of the executed arm.
    u: `[]` realised utility (RAIL: gain − cost, see `sampling.interventions.utility`).
    gamma: discount γ in (0, 1] (PROPOSAL: 0.99 per update).
    discount_prior: also discount reg·I (static; see above).

  Returns:
    The updated `LinearBanditState` (count + 1).

  Examples:
    >>> import jax.numpy as jnp
    >>> s = linucb_update(linucb_init(2), jnp.array([1.0, 2.0]), 0.5, gamma=0.5)
    >>> s.A.tolist(), s.b.tolist()
    ([[2.0, 2.0], [2.0, 5.0]], [0.5, 1.0])
  """
  x = jnp.asarray(x, jnp.float32)
  d = state.b.shape[0]
  if x.shape != (d,):
    raise ValueError(f"x has shape {tuple(x.shape)}; expected ({d},) (the state's dimension)")
  if jnp.ndim(u) != 0:
    raise ValueError(f"u must be a scalar utility, got shape {jnp.shape(u)}")
  if not isinstance(gamma, jax.core.Tracer) and not 0.0 < float(gamma) <= 1.0:
    raise ValueError(f"gamma must be in (0, 1], got {gamma!r}")
  return _linucb_update(state, x, jnp.asarray(u, jnp.float32), jnp.asarray(gamma, jnp.float32),
                        bool(discount_prior))


@jax.jit
def _lints_select(state, features, rng, scale):
  theta = _theta(state)
  # θ̃ = θ̂ + s·L⁻ᵀz with A = L Lᵀ has covariance s²·L⁻ᵀL⁻¹ = s²·A⁻¹.
  chol = jnp.linalg.cholesky(state.A)
  z = jax.random.normal(rng, theta.shape, jnp.float32)
  theta_sample = theta + scale * jax.scipy.linalg.solve_triangular(chol.T, z, lower=False)
  return jnp.argmax(features @ theta_sample).astype(jnp.int32)


@BANDITS.register("lints")
def lints_select(
    state: LinearBanditState, features: jax.Array, rng: jax.Array, *, scale: ArrayLike = 1.0
) -> jax.Array:
  """Linear Thompson sampling: draw θ̃ ~ N(θ̂, s²·A⁻¹), pick argmax_a x_aᵀθ̃.

  Args:
    state: bandit statistics with feature dimension d.
    features: `[n_arms, d]` joint features, n_arms ≥ 1.
    rng: a PRNG key for the posterior draw.
    scale: posterior scale s ≥ 0 (s = 0 is greedy on θ̂).

  Returns:
    `[]` int32 arm index.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> s = linucb_update(linucb_init(2), jnp.array([0.0, 1.0]), 1.0)
    >>> int(lints_select(s, jnp.eye(2), jax.random.key(0), scale=0.0))
    1

  References:
    Agrawal & Goyal, Thompson Sampling for Contextual Bandits with Linear Payoffs,
    arXiv 1209.3352.
  """
  features = _check_features(state, features)
  if rng is None:
    raise ValueError("rng is required for lints (Thompson sampling draws θ̃); got None")
  return _lints_select(state, features, rng, jnp.asarray(scale, jnp.float32))
