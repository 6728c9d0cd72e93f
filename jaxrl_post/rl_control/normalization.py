"""Running observation and reward normalisation for PPO (purejaxrl's brax wrappers, as functions).

Brax locomotion observations mix positions (~1 m) with joint velocities (~10 rad/s) and its
rewards are O(1) per step over hundreds of steps; without rescaling both, PPO's tanh MLP and its
value regression (L_V on returns of O(100)) hardly learn. Everything here is pure and lives in
`ppo.make_train`'s scan carry, one set of statistics per seed (vmap gives each seed its own).

Running mean / variance over every sample seen, merged batch by batch with the parallel
update of Chan et al. (1979): for stored (μ_a, σ²_a, n_a) and a batch with (μ_b, σ²_b, n_b)
(population variance, over the batch axis 0),

    δ = μ_b − μ_a,   n = n_a + n_b,   μ = μ_a + δ n_b / n,
    σ² = (σ²_a n_a + σ²_b n_b + δ² n_a n_b / n) / n.

The state starts at n = 0 (μ = 0, σ² = 1), so after the first batch it *is* that batch's
statistics and afterwards exactly the statistics of all samples seen (no 1e-4 prior count as in
purejaxrl / gym, which biases them slightly); σ² = 1 only matters before any update.

* observations: o' = clip((o − μ) / sqrt(σ² + 1e-8), −10, 10), per observation dimension;
* rewards: r' = clip(r / sqrt(σ²_G + 1e-8), −10, 10), with σ²_G the running variance of the
  discounted return G_t = γ G_{t−1} (1 − d_{t−1}) + r_t, d_t = 1 when step t ended an episode
  (the return restarts on a new episode; gym's `NormalizeReward`). Only the scale changes, not
  the sign or the mean, so the optimal policy of the discounted objective is unchanged.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

CLIP = 10.0
EPS = 1e-8


class RunningMeanStd(NamedTuple):
  """Statistics of all samples seen.

  Attributes:
    mean: μ, `[*shape]` float32.
    var: population variance σ², `[*shape]` float32.
    count: n, `()` float32 (float: 2^24 ≈ 1.7e7 samples stay exact, beyond that the merge
      weights n_b / n are rounded at a relative 6e-8, harmless).
  """
  mean: jax.Array
  var: jax.Array
  count: jax.Array


def init(shape=()) -> RunningMeanStd:
  """Empty statistics (n = 0) for samples of shape `shape`."""
  return RunningMeanStd(jnp.zeros(shape, jnp.float32), jnp.ones(shape, jnp.float32),
                        jnp.zeros((), jnp.float32))


def update(rms: RunningMeanStd, x: jax.Array) -> RunningMeanStd:
  """Merges the batch `x` `[N, *shape]` (N samples along axis 0) into `rms` (Chan et al.)."""
  x = x.astype(jnp.float32)
  n_b = jnp.float32(x.shape[0])
  mean_b, var_b = jnp.mean(x, axis=0), jnp.var(x, axis=0)
  delta = mean_b - rms.mean
  total = rms.count + n_b
  mean = rms.mean + delta * n_b / total
  m2 = rms.var * rms.count + var_b * n_b + jnp.square(delta) * rms.count * n_b / total
  return RunningMeanStd(mean, m2 / total, total)


def normalize(rms: RunningMeanStd, x: jax.Array, clip: float = CLIP) -> jax.Array:
  """clip((x − μ) / sqrt(σ² + 1e-8), −clip, clip), `x` `[..., *shape]`."""
  return jnp.clip((x - rms.mean) / jnp.sqrt(rms.var + EPS), -clip, clip)


class ObsNorm(NamedTuple):
  """Observation statistics, per observation dimension (`[O]` mean / var)."""
  rms: RunningMeanStd


def obs_init(obs: jax.Array) -> ObsNorm:
  """Statistics of the first batch of observations `obs` `[B, O]` (the reset ones)."""
  return ObsNorm(update(init(obs.shape[1:]), obs))


def obs_step(state: ObsNorm, obs: jax.Array) -> ObsNorm:
  """Merges newly received observations `[B, O]`; call before normalising them."""
  return ObsNorm(update(state.rms, obs))


def obs_normalize(state: ObsNorm, obs: jax.Array) -> jax.Array:
  """The policy's input: clip((o − μ) / sqrt(σ² + 1e-8), ±10), `[B, O]`."""
  return normalize(state.rms, obs)


class RewardNorm(NamedTuple):
  """Return statistics and the per-env discounted return.

  Attributes:
    rms: running mean / var of G_t over envs and steps (scalar).
    ret: G_t (1 − d_t) per env, `[B]`: the return the next step continues (0 after an episode
      ended).
  """
  rms: RunningMeanStd
  ret: jax.Array


def reward_init(num_envs: int) -> RewardNorm:
  return RewardNorm(init(), jnp.zeros((num_envs,), jnp.float32))


def reward_step(state: RewardNorm, reward: jax.Array, done: jax.Array, *,
                gamma: float) -> tuple[jax.Array, RewardNorm]:
  """Scales one step's rewards by the running std of the discounted return.

  Args:
    state: `RewardNorm` before this step.
    reward: r_t, `[B]`.
    done: d_t, `[B]` (bool or 0/1): step t ended the episode.
    gamma: γ of the return (PPO's discount).

  Returns:
    `(clip(r_t / sqrt(σ²_G + 1e-8), ±10) [B], new state)`, σ²_G including this step's G_t.
  """
  ret = gamma * state.ret + reward.astype(jnp.float32)
  rms = update(state.rms, ret)
  scaled = jnp.clip(reward / jnp.sqrt(rms.var + EPS), -CLIP, CLIP)
  return scaled, RewardNorm(rms, ret * (1.0 - done.astype(jnp.float32)))
