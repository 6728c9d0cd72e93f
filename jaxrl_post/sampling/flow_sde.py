"""Rectified-flow ODE → SDE sampling with per-step Gaussian log-probs (Flow-GRPO, arXiv 2505.05470).

Convention (Flow-GRPO's code): `x_t = (1 − t)·x_0 + t·ε`, `t ∈ [0, 1]`, `t = 1` is noise, the
model predicts the velocity `v_θ(x_t, t, c) ≈ ε − x_0`, and sampling runs `t: 1 → 0` on a grid
`1 = t_0 > t_1 > … > t_T = 0`. The marginal-preserving SDE

  dx = [v + σ_t²/(2t)·(x + (1 − t)·v)] dt + σ_t dw,      σ_t = a·sqrt(t / (1 − t))

(`a` the noise level, 0.7 in Flow-GRPO's configs) discretised by Euler–Maruyama with
`Δt = t_next − t < 0` gives a Gaussian policy per step

  μ_θ = x + [v + σ_t²/(2t)·(x + (1 − t)·v)]·Δt,    s_t = σ_t·sqrt(|Δt|),
  x_next = μ_θ + s_t·ξ,  ξ ~ N(0, I),
  log π_θ(x_next | x) = −(x_next − μ_θ)²/(2 s_t²) − log s_t − ½ log 2π     (per element)

reduced over the latent dims by a mean (the reference code) or a sum (`reduction`). At `t = 1`
the `1 − t` of σ_t is replaced by `1 − t_1` (`t_cap`, the reference's `sigma_max = sigmas[1]`).
Only μ depends on θ, so the KL between two policies at the same `x_t` is closed form,
`‖μ_θ − μ_ref‖²/(2 s_t²)` (`step_kl`), reduced like the log-prob.

Everything is array-generic: `x` is `[batch, *latent]` with any latent shape; `t`, `t_next`
are scalars or `[batch]`; `a` is a scalar or an array broadcastable to `x` (a noise level per
block of coordinates, e.g. CrystalGRPO's `a_F`, `a_L`, arXiv 2608.06582). Periodic coordinates
(fractional atom positions) go through a `Wrap`: the sample is wrapped back into the cell and
the log-prob uses the minimum-image displacement (wrapped-Gaussian approximation, valid when
`s_t` is much smaller than the period); `periodic_wrap(period)` builds one.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

REDUCTIONS = ("mean", "sum", "none")
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


class Wrap(NamedTuple):
  """Hooks for coordinates on a torus (CrystalGRPO's fractional coordinates).

  position: maps a sampled `x_next` back into the cell (e.g. `x mod 1`).
  displacement: the minimum-image difference `x_next − μ` entering the log-prob.
  """

  position: Callable[[jax.Array], jax.Array]
  displacement: Callable[[jax.Array], jax.Array]


def periodic_wrap(period: Any) -> Wrap:
  """A `Wrap` for coordinates periodic with `period` (broadcastable to `x`; 0 = not periodic).

  Examples:
    >>> w = periodic_wrap(1.0)
    >>> [round(float(v), 2) for v in w.position(jnp.array([1.25, -0.25]))]
    [0.25, 0.75]
    >>> [round(float(v), 2) for v in w.displacement(jnp.array([0.9, -0.6]))]
    [-0.1, 0.4]
  """
  period = jnp.asarray(period, jnp.float32)
  periodic = period > 0
  safe = jnp.where(periodic, period, 1.0)

  def position(x):
    return jnp.where(periodic, jnp.mod(x, safe), x)

  def displacement(d):
    return jnp.where(periodic, d - safe * jnp.round(d / safe), d)

  return Wrap(position, displacement)


class StepOutput(NamedTuple):
  """One SDE step: the sample, its log-prob (reduced over latent dims), and the policy."""

  x_next: jax.Array  # [batch, *latent]
  logp: jax.Array  # [batch] (reduction "mean" / "sum") or [batch, *latent] ("none")
  mean: jax.Array  # [batch, *latent] μ_θ (differentiable)
  std: jax.Array  # s_t, broadcastable to x (θ-free)


class Trajectory(NamedTuple):
  """A sampled trajectory; step k goes from `t[k]` to `t_next[k]`.

  x: `[T + 1, batch, *latent]` the states x_{t_0} … x_{t_T} (x[T] the final sample).
  t, t_next: `[T]` the grid's start and end times of each step.
  logp: `[T, batch]` the rollout log-probs ℓ^{roll} (zeros for ODE steps).
  mean, std: `[T, batch, *latent]` μ and s_t of each step.
  """

  x: jax.Array
  t: jax.Array
  t_next: jax.Array
  logp: jax.Array
  mean: jax.Array
  std: jax.Array


def _is_concrete(*xs) -> bool:
  return not any(isinstance(x, jax.core.Tracer) for x in xs)


def check_step_times(t: Any, t_next: Any) -> None:
  """Raises a ValueError naming `t` / `t_next` when t ∉ [0, 1], t_next ∉ [0, 1] or t_next ≥ t.

  Checked only on concrete values (Python / numpy / committed arrays); traced values pass.
  """
  if not _is_concrete(t, t_next):
    return
  t_np, tn_np = np.asarray(t, np.float64), np.asarray(t_next, np.float64)
  for name, v in (("t", t_np), ("t_next", tn_np)):
    if np.any(~np.isfinite(v)) or np.any(v < 0.0) or np.any(v > 1.0):
      raise ValueError(f"flow step {name}={v.tolist()} must lie in [0, 1]")
  if np.any(tn_np >= t_np):
    raise ValueError(f"flow step t_next={tn_np.tolist()} must be < t={t_np.tolist()} "
                     "(sampling runs from t = 1, noise, to t = 0, data)")


def time_grid(num_steps: int, *, t_start: float = 1.0, t_end: float = 0.0) -> np.ndarray:
  """`[num_steps + 1]` float32 grid `t_start = t_0 > … > t_T = t_end` (uniform, as SD3's
  flow-matching scheduler without shift).

  Examples:
    >>> time_grid(4).tolist()
    [1.0, 0.75, 0.5, 0.25, 0.0]
  """
  if not isinstance(num_steps, (int, np.integer)) or num_steps < 1:
    raise ValueError(f"num_steps={num_steps!r} must be an int >= 1")
  check_step_times(t_start, t_end)
  return np.linspace(t_start, t_end, num_steps + 1).astype(np.float32)


def sigma_t(t: Any, a: Any, *, t_cap: Any) -> jax.Array:
  """σ_t = a·sqrt(t / (1 − t)), with 1 − t replaced by 1 − `t_cap` where t = 1.

  `t_cap` is the grid's first step below 1 (t_1, the reference's `sigma_max = sigmas[1]`).

  Examples:
    >>> round(float(sigma_t(0.5, 0.7, t_cap=0.9)), 4)  # 0.7·sqrt(0.5/0.5)
    0.7
    >>> round(float(sigma_t(1.0, 0.7, t_cap=0.9)), 4)  # 0.7·sqrt(1/(1 − 0.9))
    2.2136
  """
  t = jnp.asarray(t, jnp.float32)
  denom = 1.0 - jnp.where(t >= 1.0, jnp.asarray(t_cap, jnp.float32), t)
  return jnp.asarray(a, jnp.float32) * jnp.sqrt(t / denom)


def _bcast(s: Any, x: jax.Array) -> jax.Array:
  """A scalar or `[batch]` time → broadcastable against `x` `[batch, *latent]`."""
  s = jnp.asarray(s, jnp.float32)
  if s.ndim == 0:
    return s
  return s.reshape(s.shape + (1,) * (x.ndim - s.ndim))


def reduce_latent(values: jax.Array, reduction: str = "mean") -> jax.Array:
  """Mean / sum over all axes but the first (`[batch, *latent] → [batch]`), or "none"."""
  if reduction not in REDUCTIONS:
    raise ValueError(f"reduction={reduction!r}; valid: {', '.join(REDUCTIONS)}")
  if reduction == "none" or values.ndim <= 1:
    return values
  axes = tuple(range(1, values.ndim))
  return jnp.mean(values, axis=axes) if reduction == "mean" else jnp.sum(values, axis=axes)


def sde_mean_std(v: jax.Array, t: Any, t_next: Any, x: jax.Array, a: Any, *,
                 t_cap: Any) -> tuple[jax.Array, jax.Array]:
  """μ_θ and s_t of one Euler–Maruyama step (formulas in the module docstring)."""
  check_step_times(t, t_next)
  tb, tnb = _bcast(t, x), _bcast(t_next, x)
  dt = tnb - tb
  sigma = sigma_t(tb, a, t_cap=t_cap)
  x32, v32 = x.astype(jnp.float32), v.astype(jnp.float32)
  mean = (x32 * (1.0 + sigma ** 2 / (2.0 * tb) * dt)
          + v32 * (1.0 + sigma ** 2 * (1.0 - tb) / (2.0 * tb)) * dt)
  std = sigma * jnp.sqrt(-dt)
  return mean, std


def gaussian_logp(x_next: jax.Array, mean: jax.Array, std: jax.Array, *,
                  reduction: str = "mean", wrap: Wrap | None = None) -> jax.Array:
  """−(x_next − μ)²/(2 s²) − log s − ½ log 2π per element, reduced over latent dims.

  `x_next` is a sample (no gradient flows through it: the reference detaches it); the gradient
  reaches θ through `mean` only.
  """
  diff = jax.lax.stop_gradient(x_next) - mean
  if wrap is not None:
    diff = wrap.displacement(diff)
  std = jnp.broadcast_to(std, diff.shape)
  per = -jnp.square(diff) / (2.0 * jnp.square(std)) - jnp.log(std) - _HALF_LOG_2PI
  return reduce_latent(per, reduction)


def sde_step_with_logprob(v: jax.Array, t: Any, t_next: Any, x: jax.Array, a: Any,
                          key: jax.Array | None, x_next: jax.Array | None = None, *,
                          t_cap: Any = None, reduction: str = "mean",
                          wrap: Wrap | None = None, noise: jax.Array | None = None
                          ) -> StepOutput:
  """One Flow-GRPO SDE step and the log-prob of its (given or sampled) transition.

  Args:
    v: `[batch, *latent]` the velocity v_θ(x, t, c) (differentiable).
    t, t_next: scalars or `[batch]`, 0 ≤ t_next < t ≤ 1 (checked when concrete).
    x: `[batch, *latent]` the current state x_t.
    a: the noise level, a scalar or broadcastable to `x` (per block of coordinates).
    key: PRNG key for ξ (unused when `x_next` or `noise` is given).
    x_next: a stored transition to score (the update stage); None samples one.
    t_cap: the grid's t_1, replacing t in 1 − t where t = 1 (default: `t_next`, right for the
      first step of a grid).
    reduction: "mean" (reference code), "sum" or "none" over latent dims.
    wrap: periodic-coordinate hooks (`Wrap`), or None.
    noise: ξ `[batch, *latent]` to use instead of drawing from `key` (fixed-noise comparisons).

  Returns:
    `StepOutput(x_next, logp, mean, std)`.

  Examples:
    >>> x, v = jnp.zeros((1, 2)), jnp.ones((1, 2))
    >>> out = sde_step_with_logprob(v, 0.5, 0.25, x, 0.0, None, noise=jnp.zeros((1, 2)))
    >>> out.mean.tolist()  # a = 0: the ODE step x + v·Δt
    [[-0.25, -0.25]]

  References:
    Liu et al., Flow-GRPO, arXiv 2505.05470 (`sde_step_with_logprob`).
  """
  if t_cap is None:
    t_cap = t_next
  mean, std = sde_mean_std(v, t, t_next, x, a, t_cap=t_cap)
  if x_next is None:
    if noise is None:
      if key is None:
        raise ValueError("sde_step_with_logprob: key=None needs x_next or noise")
      noise = jax.random.normal(key, x.shape, jnp.float32)
    x_next = jax.lax.stop_gradient(mean) + std * noise.astype(jnp.float32)
    if wrap is not None:
      x_next = wrap.position(x_next)
  logp = gaussian_logp(x_next, mean, std, reduction=reduction, wrap=wrap)
  return StepOutput(x_next, logp, mean, std)


def step_kl(mean: jax.Array, ref_mean: jax.Array, std: jax.Array, *,
            reduction: str = "mean", wrap: Wrap | None = None) -> jax.Array:
  """KL(N(μ_θ, s²) ‖ N(μ_ref, s²)) = ‖μ_θ − μ_ref‖²/(2 s²), per element, reduced like logp.

  Examples:
    >>> float(step_kl(jnp.ones((1, 2)), jnp.zeros((1, 2)), jnp.asarray(0.5))[0])  # 1/(2·0.25)
    2.0
  """
  diff = mean - ref_mean
  if wrap is not None:
    diff = wrap.displacement(diff)
  per = jnp.square(diff) / (2.0 * jnp.square(jnp.broadcast_to(std, diff.shape)))
  return reduce_latent(per, reduction)


def ode_step(v: jax.Array, t: Any, t_next: Any, x: jax.Array) -> jax.Array:
  """Deterministic Euler step of dx = v dt: x + v·(t_next − t)."""
  check_step_times(t, t_next)
  return x + v * (_bcast(t_next, x) - _bcast(t, x))


VelocityFn = Callable[[jax.Array, jax.Array], jax.Array]  # (x [b, ...], t [b]) -> v


def sample_trajectory(velocity_fn: VelocityFn, x_init: jax.Array, grid: Any, a: Any, *,
                      key: jax.Array | None = None, noise: jax.Array | None = None,
                      sde: Any = True, reduction: str = "mean", wrap: Wrap | None = None
                      ) -> Trajectory:
  """Runs the sampler over `grid` (`[T + 1]`, decreasing) with `lax.scan`, recording each step.

  Args:
    velocity_fn: `(x, t) -> v` with `t` `[batch]` (close over params and conditions).
    x_init: `[batch, *latent]` the noise x_{t_0}.
    grid: `[T + 1]` times, `grid[0] > … > grid[T]`, in [0, 1] (checked when concrete).
    a: noise level (scalar or broadcastable to x).
    key / noise: the SDE noise, `noise` `[T, batch, *latent]` fixed, else drawn from `key`.
    sde: True, False (the ODE sampler), or a bool `[T]` mask of SDE steps (ODE elsewhere;
      logp is 0 on ODE steps).
    reduction, wrap: as in `sde_step_with_logprob`.

  Returns:
    A `Trajectory` (log-probs of the rollout policy, no gradient intended).
  """
  grid = jnp.asarray(grid, jnp.float32)
  if _is_concrete(grid):
    g = np.asarray(grid)
    if g.ndim != 1 or g.shape[0] < 2:
      raise ValueError(f"grid of shape {g.shape} must be [T + 1] with T >= 1")
    check_step_times(g[:-1], g[1:])
  num_steps = grid.shape[0] - 1
  if noise is None:
    if key is None:
      raise ValueError("sample_trajectory: give key or noise")
    noise = jax.random.normal(key, (num_steps,) + x_init.shape, jnp.float32)
  if noise.shape != (num_steps,) + x_init.shape:
    raise ValueError(f"noise of shape {noise.shape} must be {(num_steps,) + x_init.shape}")
  sde_mask = jnp.broadcast_to(jnp.asarray(sde, bool), (num_steps,))
  t_cap = grid[1]
  batch = x_init.shape[0]

  def body(x, inputs):
    t, t_next, xi, is_sde = inputs
    v = velocity_fn(x, jnp.full((batch,), t))
    out = sde_step_with_logprob(v, t, t_next, x, a, None, t_cap=t_cap, reduction=reduction,
                                wrap=wrap, noise=xi)
    x_ode = ode_step(v, t, t_next, x)
    if wrap is not None:
      x_ode = wrap.position(x_ode)
    x_next = jnp.where(is_sde, out.x_next, x_ode)
    logp = jnp.where(is_sde, out.logp, 0.0)
    return x_next, (x, logp, out.mean, jnp.broadcast_to(out.std, x.shape))

  x_last, (xs, logp, mean, std) = jax.lax.scan(
    body, x_init.astype(jnp.float32), (grid[:-1], grid[1:], noise, sde_mask))
  xs = jnp.concatenate([xs, x_last[None]], axis=0)
  return Trajectory(xs, grid[:-1], grid[1:], logp, mean, std)
