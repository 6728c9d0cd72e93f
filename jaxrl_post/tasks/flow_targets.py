"""Synthetic targets for flow-policy RL (LeanGRPO arXiv 2609.03528 / Flow-GRPO 2505.05470).

The smallest analogue of text-to-image flow RL (PROPOSAL): the data are a mixture of
isotropic Gaussians in 2-D (or 1-D), a tiny velocity MLP is pretrained on them by flow matching,
and GRPO then tilts the policy towards one mode with the reward

  r(x) = −‖x − target‖²            (`target_reward`; the preferred mode's centre)

Mode coverage (`mode_coverage`) is the share of modes that receive at least `min_share` of the
samples, where a sample belongs to its nearest centre; `mode_shares` gives the shares.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_post.registry import Registry

FLOW_REWARDS: Registry = Registry("flow_reward")


class GaussianMixture(NamedTuple):
  """`centres [K, D]`, `std` (isotropic, shared), `weights [K]` (sum 1)."""

  centres: np.ndarray
  std: float
  weights: np.ndarray

  @property
  def dim(self) -> int:
    return int(self.centres.shape[1])


def make_mixture(name: str = "two_modes_2d") -> GaussianMixture:
  """The named mixtures: "two_modes_2d" (±2 on the first axis, std 0.3), "two_modes_1d",
  "four_modes_2d" (the corners (±2, ±2)), "gaussian_1d" (one mode, N(1, 0.5²))."""
  mixtures = {
    "two_modes_2d": GaussianMixture(np.array([[-2.0, 0.0], [2.0, 0.0]], np.float32), 0.3,
                                    np.array([0.5, 0.5], np.float32)),
    "two_modes_1d": GaussianMixture(np.array([[-2.0], [2.0]], np.float32), 0.3,
                                    np.array([0.5, 0.5], np.float32)),
    "four_modes_2d": GaussianMixture(
      np.array([[-2.0, -2.0], [-2.0, 2.0], [2.0, -2.0], [2.0, 2.0]], np.float32), 0.3,
      np.full((4,), 0.25, np.float32)),
    "gaussian_1d": GaussianMixture(np.array([[1.0]], np.float32), 0.5,
                                   np.array([1.0], np.float32)),
  }
  if name not in mixtures:
    raise ValueError(f"unknown mixture {name!r}; valid: {', '.join(sorted(mixtures))}")
  return mixtures[name]


def sample_mixture(mixture: GaussianMixture, key: jax.Array, n: int) -> jax.Array:
  """`[n, D]` float32 samples."""
  k_mode, k_noise = jax.random.split(key)
  modes = jax.random.choice(k_mode, len(mixture.weights), (n,), p=jnp.asarray(mixture.weights))
  centres = jnp.asarray(mixture.centres)[modes]
  return centres + mixture.std * jax.random.normal(k_noise, centres.shape, jnp.float32)


def flow_matching_loss(v_pred: jax.Array, x0: jax.Array, eps: jax.Array) -> jax.Array:
  """Rectified-flow matching loss mean ‖v_θ(x_t, t) − (ε − x_0)‖² over batch and dims."""
  return jnp.mean(jnp.square(v_pred - (eps - x0)))


def interpolate(x0: jax.Array, eps: jax.Array, t: jax.Array) -> jax.Array:
  """x_t = (1 − t)·x_0 + t·ε, `t` `[batch]`."""
  t = t.reshape(t.shape + (1,) * (x0.ndim - 1))
  return (1.0 - t) * x0 + t * eps


def flow_matching_objective(model, batch) -> tuple[jax.Array, dict[str, jax.Array]]:
  """The pretraining objective as a `make_train_step` loss: `flow_matching_loss` of
  `model(x_t, t)` at `x_t = interpolate(x0, eps, t)`; `batch` holds `x0`, `eps` `[batch, d]`
  and `t` `[batch]`. Returns `(loss, {"fm_loss": loss})`."""
  x_t = interpolate(batch["x0"], batch["eps"], batch["t"])
  loss = flow_matching_loss(model(x_t, batch["t"]), batch["x0"], batch["eps"])
  return loss, {"fm_loss": loss}


def target_reward(x: jax.Array, target: jax.Array) -> jax.Array:
  """r(x) = −‖x − target‖², `[batch, D] → [batch]`.

  Examples:
    >>> target_reward(jnp.array([[2.0, 1.0]]), jnp.array([2.0, 0.0])).tolist()
    [-1.0]
  """
  return -jnp.sum(jnp.square(x - target), axis=-1)


FLOW_REWARDS.add("target_sq", target_reward)


def nearest_mode(x: jax.Array, centres: jax.Array) -> jax.Array:
  """`[batch]` index of the nearest centre."""
  d = jnp.sum(jnp.square(x[:, None, :] - jnp.asarray(centres)[None]), axis=-1)
  return jnp.argmin(d, axis=-1)


def mode_shares(x: jax.Array, centres: jax.Array) -> jax.Array:
  """`[K]` share of samples nearest to each centre."""
  k = jnp.shape(centres)[0]
  return jnp.mean(jax.nn.one_hot(nearest_mode(x, centres), k), axis=0)


def mode_coverage(x: jax.Array, centres: jax.Array, min_share: float = 0.05) -> jax.Array:
  """Share of modes holding at least `min_share` of the samples (1 = all modes covered)."""
  return jnp.mean((mode_shares(x, centres) >= min_share).astype(jnp.float32))
