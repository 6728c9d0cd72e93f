"""RAPO's policy channel, Risk-Aware Policy Scaling (R-Scale): a per-sample loss coefficient.

Reinforcement fine-tuning carries an implicit reward-variance regularisation, but it does not
stop forgetting under large task shifts in continual multimodal post-training. RAPO scales each
sample's update by its risk: a sample whose rollouts disagree (low reliability) and whose token
distribution reacts strongly to a local perturbation (high Fisher-like sensitivity) gets a
smaller step. The RFT objective (an RLOO backbone, `advantages.rloo_advantages`) is unchanged;
only the per-sample loss is multiplied by sg(λ_x):

  reliability  rel_x = 1 − 4 p̂_x(1 − p̂_x)               binary rewards, p̂ = group pass rate
               rel_x = clip(1 − std_g(r)/std_max, 0, 1)   continuous rewards
  sensitivity  sens_x = mean_t (1 − Σ_v π_t(v)²)          "collision": the trace of the softmax
                                                          Fisher, from Σ_v π² per position
               sens_x = mean_t π(y_t)(1 − π(y_t))          "sampled": the sampled token only
  risk         ρ_x = σ(κ·(z(sens_x) − z(rel_x))) ∈ (0, 1), z = batch z-score (or of the ranks)
  R-Scale      λ_x = sg(clip(1 − ρ_x, λ_min, 1))

The paper gives only the qualitative recipe; every formula above is a PROPOSAL (an implementable
choice, not a reproduction), so each choice is a keyword argument with its PROPOSAL default
(κ = 2, λ_min = 0.2, std_max = 0.5, z-score normalisation). The data channel (R-Bucket sampling)
lives with the task samplers, not here.

The z-scores reduce over the whole batch of samples under `jax.jit`, so a batch sharded over
devices gives the same ρ as on one device. `RISK_SENSITIVITIES` names the sensitivity proxies
("sampled", "collision"); both take `(x [B, T], mask [B, T])` and return `[B]`.

References:
  Liu et al., Taming the Implicit: Dual-Channel Risk-Aware Reinforcement Fine-Tuning for
  Continual Multimodal Post-Training (RAPO), arXiv 2608.03660.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jaxrl_post.registry import Registry

ArrayLike = jax.Array | float | int

RISK_SENSITIVITIES: Registry = Registry("risk sensitivity")

NORMALISERS = ("zscore", "rank")
# ε of the z-score's denominator (PROPOSAL sketch: 1e-6).
ZSCORE_EPS = 1e-6


def _check_mask(name: str, mask, shape) -> jax.Array:
  if mask is None:
    return jnp.ones(shape, bool)
  mask = jnp.asarray(mask)
  if mask.shape != tuple(shape):
    raise ValueError(f"{name} has shape {mask.shape}; expected {tuple(shape)}")
  return mask > 0


@functools.partial(jax.jit, static_argnames=("binary", "std_max"))
def rapo_reliability(
    rewards: jax.Array,
    valid: jax.Array | None = None,
    *,
    binary: bool = True,
    std_max: float = 0.5,
) -> jax.Array:
  """Rollout reliability of each prompt: 1 when its group agrees, 0 at maximum disagreement.

  binary:     rel = 1 − 4 p̂(1 − p̂),  p̂ = mean of the group's rewards (0/1, or thresholded
              beforehand); equal to 1 − (std/0.5)² for 0/1 rewards.
  continuous: rel = clip(1 − std_g(r)/std_max, 0, 1), std_g the population std of the group.

  PROPOSAL (not in the paper): both formulas, and std_max = 0.5 (the largest population std of
  rewards in [0, 1]).

  Args:
    rewards: `[B, G]` rewards of each prompt's G rollouts (NaN allowed where not valid).
    valid: optional `[B, G]` bool, True = a graded rollout; others are left out.
    binary: use the binary formula (static; PROPOSAL default True).
    std_max: std at which continuous reliability reaches 0 (static; PROPOSAL default 0.5).

  Returns:
    `[B]` float32 reliabilities in [0, 1]; NaN for a prompt with no valid rollout (`rapo_risk`
    leaves such rows out).

  Raises:
    ValueError: `rewards` not `[B, G]`, `valid` of another shape, or `std_max` ≤ 0.

  Examples:
    >>> import jax.numpy as jnp
    >>> rapo_reliability(jnp.array([[1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 1.0, 0.0],
    ...                             [1.0, 0.0, 0.0, 0.0]])).tolist()
    [1.0, 0.0, 0.25]
    >>> [round(x, 4) for x in rapo_reliability(jnp.array([[0.2, 0.4]]), binary=False).tolist()]
    [0.8]

  References:
    Liu et al., Taming the Implicit (RAPO), arXiv 2608.03660.
  """
  if not std_max > 0:
    raise ValueError(f"std_max must be > 0, got {std_max!r}")
  rewards = jnp.asarray(rewards, jnp.float32)
  if rewards.ndim != 2:
    raise ValueError(f"rewards must be [B, G], got shape {rewards.shape}")
  m = _check_mask("valid", valid, rewards.shape)
  n = jnp.sum(m, axis=-1).astype(jnp.float32)
  r = jnp.where(m, rewards, 0.0)
  mean = jnp.sum(r, axis=-1) / jnp.maximum(n, 1.0)
  if binary:
    rel = 1.0 - 4.0 * mean * (1.0 - mean)
  else:
    var = jnp.sum(jnp.where(m, (r - mean[:, None]) ** 2, 0.0), axis=-1) / jnp.maximum(n, 1.0)
    rel = 1.0 - jnp.sqrt(var) / std_max
  return jnp.where(n > 0, jnp.clip(rel, 0.0, 1.0), jnp.nan)


def _token_mean(values: jax.Array, mask) -> jax.Array:
  m = _check_mask("mask", mask, values.shape)
  n = jnp.sum(m, axis=-1).astype(jnp.float32)
  # `where`, not a product: padding may hold −inf log-probs or NaN.
  return jnp.sum(jnp.where(m, values, 0.0), axis=-1) / jnp.maximum(n, 1.0)


@RISK_SENSITIVITIES.register("sampled")
@jax.jit
def sampled_token_sensitivity(logp: jax.Array, mask: jax.Array | None = None) -> jax.Array:
  """Cheap sensitivity proxy from the sampled tokens only: mean_t π(y_t)(1 − π(y_t)).

  π(y_t)(1 − π(y_t)) is the sampled token's own Bernoulli Fisher term; it is 0 for a certain
  token and peaks at ¼ for π = ½. PROPOSAL (the paper's alternative to the full Fisher trace).

  Args:
    logp: `[B, T]` log π of the sampled tokens.
    mask: optional `[B, T]` response mask.

  Returns:
    `[B]` float32 in [0, ¼]; 0 for a row with no token.

  Examples:
    >>> import jax.numpy as jnp
    >>> sampled_token_sensitivity(jnp.log(jnp.array([[0.5, 1.0, 0.3]])),
    ...                           jnp.array([[1, 1, 0]])).tolist()  # (¼ + 0)/2
    [0.125]

  References:
    Liu et al., Taming the Implicit (RAPO), arXiv 2608.03660.
  """
  logp = jnp.asarray(logp, jnp.float32)
  if logp.ndim != 2:
    raise ValueError(f"logp must be [B, T], got shape {logp.shape}")
  p = jnp.exp(logp)
  return _token_mean(p * (1.0 - p), mask)


@RISK_SENSITIVITIES.register("collision")
@jax.jit
def collision_sensitivity(sum_p2: jax.Array, mask: jax.Array | None = None) -> jax.Array:
  """Fisher-trace sensitivity mean_t (1 − Σ_v π_t(v)²), from Σ_v π_t(v)² per position.

  1 − Σ_v π² (one minus the collision probability) is the trace of the softmax Fisher
  diag(π) − ππᵀ: 0 for a one-hot distribution, 1 − 1/V for a uniform one. The caller computes
  Σ_v π² inside its forward pass (e.g. `jnp.sum(jnp.exp(2 * log_softmax(logits)), -1)` per
  chunk), so no `[B, T, V]` array is built here. PROPOSAL (the paper describes a Fisher-inspired
  local predictive sensitivity without a formula).

  Args:
    sum_p2: `[B, T]` Σ_v π_t(v)² per position.
    mask: optional `[B, T]` response mask.

  Returns:
    `[B]` float32 in [0, 1); 0 for a row with no token.

  Examples:
    >>> import jax.numpy as jnp
    >>> collision_sensitivity(jnp.array([[1.0, 0.5], [0.25, 0.25]])).tolist()
    [0.25, 0.75]

  References:
    Liu et al., Taming the Implicit (RAPO), arXiv 2608.03660.
  """
  sum_p2 = jnp.asarray(sum_p2, jnp.float32)
  if sum_p2.ndim != 2:
    raise ValueError(f"sum_p2 must be [B, T], got shape {sum_p2.shape}")
  return _token_mean(1.0 - sum_p2, mask)


def _zscore(v: jax.Array, m: jax.Array) -> jax.Array:
  n = jnp.maximum(jnp.sum(m), 1).astype(jnp.float32)
  x = jnp.where(m, v, 0.0)
  mean = jnp.sum(x) / n
  dev = jnp.where(m, x - mean, 0.0)
  std = jnp.sqrt(jnp.sum(dev**2) / n)  # population std, as the PROPOSAL sketch's `v.std()`
  return dev / (std + ZSCORE_EPS)


def _ranks(v: jax.Array, m: jax.Array) -> jax.Array:
  """0-based ranks among the valid entries, ties averaged; O(N²) compares, fine for a batch."""
  vi, vj = v[:, None], v[None, :]
  other = m[None, :] & ~jnp.eye(v.shape[0], dtype=bool)
  below = jnp.sum(other & (vj < vi), axis=-1)
  ties = jnp.sum(other & (vj == vi), axis=-1)
  return below.astype(jnp.float32) + 0.5 * ties.astype(jnp.float32)


@functools.partial(jax.jit, static_argnames="normalise")
def rapo_risk(
    reliability: jax.Array,
    sensitivity: jax.Array,
    valid: jax.Array | None = None,
    *,
    kappa: ArrayLike = 2.0,
    normalise: str = "zscore",
) -> jax.Array:
  """Per-sample risk ρ_x = σ(κ·(z(sens_x) − z(rel_x))) ∈ (0, 1).

  z(v) = (v − mean v)/(std v + 1e-6) over the valid samples of the batch (population std)
  for normalise="zscore"; for "rank" the same z-score of the samples' ranks (ties averaged),
  which ignores outliers. Invalid samples (valid False, or a NaN / inf input) enter neither the
  mean nor the std, and get ρ = σ(0) = ½ (a sample at the batch mean), never NaN.

  PROPOSAL (the paper gives no formula): the logistic combination, κ = 2 and the z-score.

  Args:
    reliability: `[N]` reliabilities (`rapo_reliability`).
    sensitivity: `[N]` sensitivities (an entry of `RISK_SENSITIVITIES`).
    valid: optional `[N]` bool, True = include the sample in the statistics.
    kappa: κ, the logistic temperature (PROPOSAL default 2.0).
    normalise: "zscore" (PROPOSAL default) or "rank" (static).

  Returns:
    `[N]` float32 risks in (0, 1).

  Raises:
    ValueError: shapes do not match or `normalise` is unknown.

  Examples:
    >>> import jax.numpy as jnp
    >>> rho = rapo_risk(jnp.array([1.0, 0.0]), jnp.array([0.0, 1.0]), kappa=1.0)
    >>> [round(x, 4) for x in rho.tolist()]  # z = ∓1: σ(−2), σ(2)
    [0.1192, 0.8808]

  References:
    Liu et al., Taming the Implicit (RAPO), arXiv 2608.03660.
  """
  if normalise not in NORMALISERS:
    raise ValueError(f"unknown normalise {normalise!r}; valid: {', '.join(NORMALISERS)}")
  reliability = jnp.asarray(reliability, jnp.float32)
  sensitivity = jnp.asarray(sensitivity, jnp.float32)
  if reliability.ndim != 1:
    raise ValueError(f"reliability must be [N], got shape {reliability.shape}")
  if sensitivity.shape != reliability.shape:
    raise ValueError(f"sensitivity has shape {sensitivity.shape}; expected reliability's "
                     f"{reliability.shape}")
  m = _check_mask("valid", valid, reliability.shape)
  m = m & jnp.isfinite(reliability) & jnp.isfinite(sensitivity)
  rel = jnp.where(m, reliability, 0.0)
  sens = jnp.where(m, sensitivity, 0.0)
  if normalise == "rank":
    rel, sens = _ranks(rel, m), _ranks(sens, m)
  z = _zscore(sens, m) - _zscore(rel, m)
  return jnp.where(m, jax.nn.sigmoid(jnp.asarray(kappa, jnp.float32) * z), 0.5)


@functools.partial(jax.jit, static_argnames="lam_min")
def rapo_scale(rho: jax.Array, *, lam_min: float = 0.2) -> jax.Array:
  """R-Scale coefficient λ = sg(clip(1 − ρ, λ_min, 1)): multiply each sample's loss by it.

  No gradient flows through λ: it only rescales the step of the sample (the RFT objective's
  gradient direction is unchanged). PROPOSAL default λ_min = 0.2.

  Args:
    rho: `[N]` risks (`rapo_risk`).
    lam_min: λ_min in [0, 1], the smallest coefficient (PROPOSAL default 0.2; static).

  Returns:
    `[N]` float32 coefficients in [λ_min, 1], stop-gradient.

  Raises:
    ValueError: `lam_min` outside [0, 1].

  Examples:
    >>> import jax.numpy as jnp
    >>> [round(x, 4) for x in rapo_scale(jnp.array([0.1, 0.5, 0.95])).tolist()]
    [0.9, 0.5, 0.2]

  References:
    Liu et al., Taming the Implicit (RAPO), arXiv 2608.03660.
  """
  if not 0.0 <= lam_min <= 1.0:
    raise ValueError(f"lam_min must be in [0, 1], got {lam_min!r}")
  rho = jnp.asarray(rho, jnp.float32)
  return jax.lax.stop_gradient(jnp.clip(1.0 - rho, lam_min, 1.0))
