"""TS-GRPO for continuous forecasts and GTN-R (arXiv 2608.08010; PROPOSAL).

GTN-R ("Ground-Truth Neighborhood Regularization for RL post-training of time-series
foundation models") reports *suboptimal collapse*: where good forecasts are initially hard to
sample, group-relative RL keeps reinforcing the best of poor samples and moves the predictive
distribution away from the truth. Its fix uses the ground truth to push mass into the truth's
neighbourhood. The paper's loss, neighbourhood and λ were not found; everything
below is our PROPOSAL, with its free numbers as arguments.

Notation: `B` series per batch, `G` forecasts per series (the group), `H` horizon points,
`σ̂_b` the series' scale (context std), `y*_b` the true future.

* Rewards (`FORECAST_REWARDS`, `[B, G]`), in σ̂ units so that series of any scale weigh alike:
    mse   R_i = −(1/H) Σ_h ((y_ih − y*_h)/σ̂)²
    mae   R_i = −(1/H) Σ_h |y_ih − y*_h|/σ̂
    crps  R_i = −(1/H) Σ_h (|y_ih − y*_h| − (1/2G) Σ_j |y_ih − y_jh|)/σ̂, member i's share of
          the group's ensemble CRPS (their mean over i is the sample CRPS).
* TS-GRPO (`ts_grpo_loss`): A_i = group z-score of R (`advantages.group_advantages`), the
  sequence log-density ratio ρ_i = exp(log π_θ(y_i|x) − log π_old(y_i|x)) in the clipped
  surrogate, optional k-estimator KL to the initial policy:
    L = Σ_i w_i max(−A_i ρ_i, −A_i clip(ρ_i, 1−ε, 1+ε)) / Σ_i w_i + β·KL
  (`losses.policy_loss` with each forecast as one "token"; `w` row weights, default 1).
* GTN-R variant A (`neighbourhood_nll`): ỹ = y* + δ·σ̂·ξ, ξ ~ N(0, I_H) (`neighbourhood_draws`),
    L_A = L_TS-GRPO + λ · (−1/(B·M·H)) Σ_{b,m} log π_θ(ỹ_bm | x_b)
  (per point: λ does not scale with H; δ → 0 is the NLL of the truth). λ and δ follow
  `anneal` schedules (`SCHEDULES`).
* GTN-R variant B (`anchored_group`): K members ỹ ~ N_δ(y*) join each group of G on-policy
  forecasts; they are rewarded and z-scored with the group and enter the same clipped
  surrogate, their ratio taken against the behaviour policy's log-density of ỹ (computed when
  the batch is built), so the clip bounds how far one step moves toward them.
* Diagnostics (`forecast_diagnostics`): Monte-Carlo π_θ(‖y − y*‖ ≤ δ) with the ball
  RMS_h((y − y*)/σ̂) ≤ δ, the RMS distance (σ̂ units) of a point forecast to y*, and the
  predictive std (σ̂ units) of the draws.

All functions are pure functions of arrays, jittable, and take the whole (possibly sharded)
batch: their means are global.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxrl_post.advantages.outcome import contiguous_group_ids, group_advantages
from jaxrl_post.losses.policy import policy_loss
from jaxrl_post.registry import Registry

# ---- Rewards ----

FORECAST_REWARDS: Registry = Registry("forecast reward")


def _check_forecasts(samples: jax.Array, target: jax.Array, scale: jax.Array) -> None:
  if samples.ndim != 3 or target.ndim != 2 or scale.ndim != 1:
    raise ValueError(f"samples {samples.shape}, target {target.shape}, scale {scale.shape}: "
                     "expected [B, G, H], [B, H], [B]")
  if samples.shape[-1] != target.shape[-1]:
    raise ValueError(f"horizon mismatch: samples have H={samples.shape[-1]} points, target "
                     f"has H={target.shape[-1]} (config.horizon)")
  if not samples.shape[0] == target.shape[0] == scale.shape[0]:
    raise ValueError(f"batch mismatch: samples {samples.shape[0]}, target {target.shape[0]}, "
                     f"scale {scale.shape[0]} series")


def _errors(samples, target, scale):
  return (samples - target[:, None]) / scale[:, None, None]


@FORECAST_REWARDS.register("mse")
def mse_reward(samples: jax.Array, target: jax.Array, scale: jax.Array) -> jax.Array:
  """R_i = −mean_h ((y_ih − y*_h)/σ̂)², `[B, G]`."""
  return -jnp.mean(jnp.square(_errors(samples, target, scale)), axis=-1)


@FORECAST_REWARDS.register("mae")
def mae_reward(samples: jax.Array, target: jax.Array, scale: jax.Array) -> jax.Array:
  """R_i = −mean_h |y_ih − y*_h|/σ̂, `[B, G]`."""
  return -jnp.mean(jnp.abs(_errors(samples, target, scale)), axis=-1)


@FORECAST_REWARDS.register("crps")
def crps_reward(samples: jax.Array, target: jax.Array, scale: jax.Array) -> jax.Array:
  """R_i = −mean_h (|y_ih − y*_h| − (1/2G) Σ_j |y_ih − y_jh|)/σ̂, `[B, G]`.

  The member's share of the ensemble CRPS `mean_i |y_i − y*| − (1/2G²) Σ_ij |y_i − y_j|`:
  −mean_i R_i is the group's sample CRPS (σ̂ units, averaged over the horizon).
  """
  spread = jnp.mean(jnp.abs(samples[:, :, None] - samples[:, None]), axis=2)  # [B, G, H]
  return -jnp.mean((jnp.abs(samples - target[:, None]) - 0.5 * spread)
                   / scale[:, None, None], axis=-1)


def forecast_rewards(samples: jax.Array, target: jax.Array, scale: jax.Array, *,
                     reward: str = "mse") -> jax.Array:
  """Rewards of G forecasts per series against the truth, `[B, G]` float32.

  Args:
    samples: `[B, G, H]` forecasts.
    target: `[B, H]` true futures y*.
    scale: `[B]` per-series scales σ̂ (> 0).
    reward: a name in `FORECAST_REWARDS` ("mse", "mae", "crps"; config.gtn_r.reward).

  Example (one series, σ̂ = 2, errors 2 and 0 on H = 2):
    >>> forecast_rewards(jnp.array([[[3.0, 1.0]]]), jnp.ones((1, 2)), jnp.array([2.0])).tolist()
    [[-0.5]]
  """
  _check_forecasts(samples, target, scale)
  return FORECAST_REWARDS.get(reward)(samples.astype(jnp.float32), target.astype(jnp.float32),
                                      scale.astype(jnp.float32))


def ts_grpo_advantages(rewards: jax.Array, *, eps: float = 1e-6) -> jax.Array:
  """Group z-scores of `rewards [B, G]` within each row (GRPO, Bessel std): `[B, G]`.

  Raises:
    ValueError: G < 2 (config.num_samples), where a group has no spread.
  """
  if rewards.ndim != 2 or rewards.shape[1] < 2:
    raise ValueError(f"rewards have shape {rewards.shape}; TS-GRPO needs groups [B, G] with "
                     f"G >= 2 (config.num_samples)")
  b, g = rewards.shape
  adv = group_advantages(rewards.reshape(-1), contiguous_group_ids(b * g, g), num_groups=b,
                         eps=eps)
  return adv.reshape(b, g)


# ---- GTN-R neighbourhood, schedules and variants ----


def _check_delta(delta) -> None:
  if isinstance(delta, (int, float)) and not delta > 0:
    raise ValueError(f"delta={delta} must be > 0 (config.gtn_r.delta: the neighbourhood "
                     "radius in σ̂ units)")


def neighbourhood_draws(key: jax.Array, target: jax.Array, scale: jax.Array, *, delta,
                        num: int) -> jax.Array:
  """`num` draws ỹ = y* + δ·σ̂·ξ, ξ ~ N(0, I_H), per series: `[B, num, H]`.

  Args:
    key: PRNG key.
    target: `[B, H]` true futures.
    scale: `[B]` σ̂.
    delta: δ > 0 (a Python float is checked; an array, e.g. an annealed δ, is not).
    num: M draws per series (≥ 1).
  """
  _check_delta(delta)
  if num < 1:
    raise ValueError(f"num={num} neighbourhood draws must be >= 1 (config.gtn_r.num_neighbours)")
  xi = jax.random.normal(key, (target.shape[0], num, target.shape[1]), jnp.float32)
  return jax.lax.stop_gradient(target[:, None] + delta * scale[:, None, None] * xi)


SCHEDULES: Registry = Registry("schedule")


@SCHEDULES.register("constant")
def _constant(frac, start, end):
  del frac, end
  return start


@SCHEDULES.register("linear")
def _linear(frac, start, end):
  return start + (end - start) * frac


@SCHEDULES.register("cosine")
def _cosine(frac, start, end):
  return end + (start - end) * 0.5 * (1.0 + math.cos(math.pi * frac))


def anneal(step: int, *, start: float, end: float, steps: int, kind: str = "linear") -> float:
  """A hyperparameter at RL step `step`: `start` → `end` over `steps` steps, then `end`.

  linear: start + (end − start)·f; cosine: end + (start − end)·½(1 + cos πf); constant: start;
  f = min(step / steps, 1). Host-side (a Python float, fed to the jitted step as an array).

  Example:
    >>> anneal(5, start=1.0, end=0.0, steps=10), anneal(5, start=1.0, end=0.0, steps=10,
    ...                                                  kind="cosine")
    (0.5, 0.5)
  """
  if steps < 1:
    raise ValueError(f"steps={steps} of an anneal schedule must be >= 1")
  frac = min(max(step, 0) / steps, 1.0)
  return float(SCHEDULES.get(kind)(frac, start, end))


@dataclasses.dataclass(frozen=True)
class Variant:
  """A GTN-R variant: whether it adds the neighbourhood NLL (A) and anchors to groups (B)."""

  regulariser: bool
  anchors: bool


GTN_R_VARIANTS: Registry[Variant] = Registry("gtn_r variant")
GTN_R_VARIANTS.add("none", Variant(regulariser=False, anchors=False))  # plain TS-GRPO
GTN_R_VARIANTS.add("neighbourhood_nll", Variant(regulariser=True, anchors=False))  # A
GTN_R_VARIANTS.add("anchored_group", Variant(regulariser=False, anchors=True))  # B


def anchored_group(samples: jax.Array, anchors: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Variant B's groups: `[B, G + K, H]` members (on-policy first) and `is_anchor [B, G + K]`."""
  if samples.ndim != 3 or anchors.ndim != 3 or samples.shape[::2] != anchors.shape[::2]:
    raise ValueError(f"samples {samples.shape} and anchors {anchors.shape} must be [B, G, H] "
                     "and [B, K, H] with the same B and H (config.horizon)")
  b, g, _ = samples.shape
  is_anchor = jnp.concatenate([jnp.zeros((b, g), bool), jnp.ones((b, anchors.shape[1]), bool)],
                              axis=1)
  return jnp.concatenate([samples, anchors.astype(samples.dtype)], axis=1), is_anchor


# ---- Losses ----


class TSGRPOAux(NamedTuple):
  """Metrics of `ts_grpo_loss` / `gtn_r_loss` (scalars)."""

  pg_loss: jax.Array
  kl: jax.Array
  clip_frac: jax.Array
  ratio_mean: jax.Array
  neighbourhood_nll: jax.Array  # −mean log π_θ(ỹ)/H (0 without the regulariser)


def ts_grpo_loss(logp: jax.Array, old_logp: jax.Array, adv: jax.Array, *,
                 weights: jax.Array | None = None, epsilon: float = 0.2,
                 ref_logp: jax.Array | None = None, beta=0.0, kl_estimator: str = "k3",
                 max_log_ratio: float | None = None) -> tuple[jax.Array, TSGRPOAux]:
  """TS-GRPO's clipped surrogate on sequence log-density ratios (see the module docstring).

  Args:
    logp: `[B, G]` log π_θ(y_i | x) (differentiated), sums over the horizon.
    old_logp: `[B, G]` the behaviour policy's log-densities of the same forecasts.
    adv: `[B, G]` advantages (`ts_grpo_advantages`).
    weights: `[B, G]` row weights (default 1; 0 drops a row).
    epsilon: clip ε.
    ref_logp: `[B, G]` the initial policy's log-densities (the KL term; needed when β ≠ 0).
    beta: KL coefficient β.
    kl_estimator: "k1", "k2" or "k3" (`losses.kl`).
    max_log_ratio: optional clamp of log ρ before exp.

  Returns:
    `(loss, TSGRPOAux)`.

  Example (one on-policy group, A = ±1: the loss is −mean A = 0):
    >>> lp = jnp.zeros((1, 2))
    >>> float(ts_grpo_loss(lp, lp, jnp.array([[1.0, -1.0]]))[0])
    0.0
  """
  if logp.ndim != 2 or logp.shape[1] < 2:
    raise ValueError(f"logp has shape {logp.shape}; expected [B, G] groups with G >= 2 "
                     "(config.num_samples)")
  n = logp.shape[0] * logp.shape[1]
  col = lambda x: None if x is None else x.reshape(n, 1).astype(jnp.float32)
  mask = jnp.ones((n, 1), jnp.float32) if weights is None else col(weights)
  loss, aux = policy_loss(col(logp), col(old_logp), col(adv), mask, loss_agg_mode="token-mean",
                          epsilon_low=epsilon, epsilon_high=epsilon, ref_logp=col(ref_logp),
                          beta=beta, kl_estimator=kl_estimator, max_log_ratio=max_log_ratio)
  zero = jnp.zeros((), jnp.float32)
  return loss, TSGRPOAux(pg_loss=aux.pg_loss, kl=zero if aux.kl is None else aux.kl,
                         clip_frac=aux.clip_frac_low + aux.clip_frac_high,
                         ratio_mean=aux.ratio_mean, neighbourhood_nll=zero)


def neighbourhood_nll(nbr_logp: jax.Array, horizon: int) -> jax.Array:
  """GTN-R A's regulariser −(1/(B·M·H)) Σ log π_θ(ỹ_bm | x_b) from `nbr_logp [B, M]`."""
  if nbr_logp.ndim != 2:
    raise ValueError(f"nbr_logp has shape {nbr_logp.shape}; expected [B, M]")
  return -jnp.mean(nbr_logp.astype(jnp.float32)) / horizon


def gtn_r_loss(logp: jax.Array, old_logp: jax.Array, adv: jax.Array, *,
               nbr_logp: jax.Array | None = None, lam=0.0, horizon: int = 1,
               **grpo_kwargs) -> tuple[jax.Array, TSGRPOAux]:
  """GTN-R variant A: `ts_grpo_loss + λ · neighbourhood_nll(nbr_logp, horizon)`.

  Variant B needs no extra term: its anchors are rows of `logp` (see `anchored_group`).
  With λ = 0 (or no `nbr_logp`) the value and gradients are exactly TS-GRPO's.

  Args:
    logp, old_logp, adv: `[B, G]` as in `ts_grpo_loss`; `grpo_kwargs` are its keywords.
    nbr_logp: `[B, M]` log π_θ(ỹ_bm | x_b) of neighbourhood draws (differentiated).
    lam: λ ≥ 0 (a Python float or a traced array: an annealed λ does not recompile).
    horizon: H, the per-point normaliser.
  """
  if isinstance(lam, (int, float)) and lam < 0:
    raise ValueError(f"lam={lam} must be >= 0 (config.gtn_r.lam)")
  loss, aux = ts_grpo_loss(logp, old_logp, adv, **grpo_kwargs)
  if nbr_logp is None:
    return loss, aux
  reg = neighbourhood_nll(nbr_logp, horizon)
  return loss + lam * reg, aux._replace(neighbourhood_nll=reg)


# ---- Diagnostics ----


class ForecastDiagnostics(NamedTuple):
  """Per-series diagnostics, `[B]` each (σ̂ units)."""

  mass_near_truth: jax.Array  # Monte-Carlo π_θ(RMS_h((y − y*)/σ̂) ≤ δ)
  distance: jax.Array  # RMS_h((ŷ − y*)/σ̂) of the point forecast ŷ
  predictive_std: jax.Array  # mean over h of the draws' std / σ̂


def forecast_diagnostics(samples: jax.Array, point: jax.Array, target: jax.Array,
                         scale: jax.Array, *, delta) -> ForecastDiagnostics:
  """Mass near the truth, distance of a point forecast, predictive spread (per series).

  Args:
    samples: `[B, S, H]` draws from π_θ(· | x).
    point: `[B, H]` a point forecast (predictive mean or median).
    target: `[B, H]`; scale: `[B]`; delta: the ball's radius δ > 0 (σ̂ units, RMS over h).

  Example (two draws, one inside the ball of radius 0.5):
    >>> d = forecast_diagnostics(jnp.array([[[0.1, 0.1], [2.0, 2.0]]]), jnp.zeros((1, 2)),
    ...                          jnp.zeros((1, 2)), jnp.ones(1), delta=0.5)
    >>> float(d.mass_near_truth[0]), float(d.distance[0])
    (0.5, 0.0)
  """
  _check_delta(delta)
  _check_forecasts(samples, target, scale)
  err = _errors(samples, target, scale)
  rms = jnp.sqrt(jnp.mean(jnp.square(err), axis=-1))
  dist = jnp.sqrt(jnp.mean(jnp.square((point - target) / scale[:, None]), axis=-1))
  spread = jnp.mean(jnp.std(samples, axis=1), axis=-1) / scale
  return ForecastDiagnostics(mass_near_truth=jnp.mean((rms <= delta).astype(jnp.float32), -1),
                             distance=dist, predictive_std=spread)
