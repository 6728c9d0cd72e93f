"""Per-token estimators of KL(π_θ ‖ π_ref) from sampled-token log-probs (Schulman's k1/k2/k3).

With samples y ~ π_θ and log r = log π_ref(y) − log π_θ(y):

  k1 = −log r              unbiased, can be negative
  k2 = ½ (log r)²          biased, low variance, ≥ 0
  k3 = (r − 1) − log r     unbiased, ≥ 0

Two ways to use them: as a loss term β·KL aggregated like the policy loss (`policy_loss(...,
ref_logp=, beta=, kl_estimator=)`), or folded into the reward (`kl_reward_penalty`, detached).
Which gradient each estimator gives as a loss term, differentiated through log q = log π_θ on
on-policy samples (p = π_ref): ∇k1 = ∇log q has expectation 0, ∇k2 = (log q − log p) ∇log q
that of ∇KL(q‖p), ∇k3 = (1 − r) ∇log q that of ∇KL(p‖q). k1 is the usual choice as a detached
reward penalty; k3 the usual loss term (GRPO, TRL).

Reference: J. Schulman, "Approximating KL Divergence" (blog, 2020); DeepSeekMath GRPO uses k3 in
the loss, arXiv 2402.03300.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import chex
import jax
import jax.numpy as jnp

from jaxrl_post.registry import Registry

KL_ESTIMATORS: Registry[Callable[[jax.Array, jax.Array], jax.Array]] = Registry("kl")


@KL_ESTIMATORS.register("k1")
def k1(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
  """k1 = log π_θ(y) − log π_ref(y), elementwise.

  Examples:
    >>> import jax.numpy as jnp
    >>> round(float(k1(jnp.log(0.5), jnp.log(0.25))), 4)  # log 2
    0.6931
  """
  return logp - ref_logp


@KL_ESTIMATORS.register("k2")
def k2(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
  """k2 = ½ (log π_θ(y) − log π_ref(y))², elementwise.

  Examples:
    >>> import jax.numpy as jnp
    >>> float(k2(jnp.array(0.0), jnp.array(-2.0)))
    2.0
  """
  return 0.5 * jnp.square(logp - ref_logp)


@KL_ESTIMATORS.register("k3")
def k3(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
  """k3 = exp(log r) − 1 − log r with log r = log π_ref(y) − log π_θ(y), elementwise.

  Computed as expm1(log r) − log r, which keeps the small-|log r| values (the usual case) exact
  instead of cancelling 1 against exp(log r).

  Examples:
    >>> import jax.numpy as jnp
    >>> round(float(k3(jnp.log(0.5), jnp.log(0.25))), 4)  # 0.5 − 1 + log 2
    0.1931
  """
  log_r = ref_logp - logp
  return jnp.expm1(log_r) - log_r


@functools.partial(jax.jit, static_argnames="estimator")
def kl_estimate(logp: jax.Array, ref_logp: jax.Array, *, estimator: str = "k3") -> jax.Array:
  """Per-token KL estimate by estimator name ("k1", "k2" or "k3").

  Args:
    logp: `[...]` log π_θ of the sampled tokens.
    ref_logp: same shape, log π_ref of the same tokens.
    estimator: a name in `KL_ESTIMATORS`.

  Returns:
    The per-token estimate, same shape as `logp`.

  Examples:
    >>> import jax.numpy as jnp
    >>> float(kl_estimate(jnp.array(0.0), jnp.array(-1.0), estimator="k2"))
    0.5
  """
  chex.assert_equal_shape([logp, ref_logp])
  return KL_ESTIMATORS.get(estimator)(logp, ref_logp)


@functools.partial(jax.jit, static_argnames="estimator")
def kl_reward_penalty(
    logp: jax.Array,
    ref_logp: jax.Array,
    mask: jax.Array,
    *,
    estimator: str = "k1",
    coef: float | jax.Array = 1.0,
) -> jax.Array:
  """Per-token KL penalty to subtract from rewards (KL folded into the reward, detached).

  penalty[i,t] = coef · k(logp[i,t], ref_logp[i,t]) · m[i,t],  reward'[i,t] = reward[i,t] − penalty

  The result is wrapped in `stop_gradient`: a reward carries no gradient. Pass the log-probs of
  the policy that sampled the tokens (`old_logp`).

  Args:
    logp: `[batch, time]` log-probs of the sampling policy.
    ref_logp: `[batch, time]` reference log-probs.
    mask: `[batch, time]` loss mask; the penalty is 0 where it is 0.
    estimator: "k1" (default, the standard reward-shaping choice), "k2" or "k3".
    coef: the KL coefficient β.

  Returns:
    `[batch, time]` float32 penalty.

  Examples:
    >>> import jax.numpy as jnp
    >>> p = kl_reward_penalty(jnp.array([[-1.0, -2.0]]), jnp.array([[-1.5, -2.0]]),
    ...                       jnp.array([[1, 0]]), coef=0.1)
    >>> [round(float(x), 3) for x in p[0]]
    [0.05, 0.0]
  """
  chex.assert_rank([logp, ref_logp, mask], 2)
  chex.assert_equal_shape([logp, ref_logp, mask])
  valid = jnp.asarray(mask) > 0
  # Padding log-probs may be anything; zero them before exp so k3 cannot overflow there.
  kl = kl_estimate(jnp.where(valid, logp, 0.0), jnp.where(valid, ref_logp, 0.0),
                   estimator=estimator)
  return jax.lax.stop_gradient(coef * kl * jnp.asarray(mask, jnp.float32))
