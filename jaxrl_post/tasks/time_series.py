"""Synthetic regime-mixture series for forecaster post-training (GTN-R; PROPOSAL).

A series of length C + H (context 32, horizon 8 by default) is one base regime plus level
changes, then an affine map to its own level and scale:

  sinusoid   a·sin(2π t / P + φ) + N(0, noise²),  a ~ U(0.5, 1.5), P ~ U(6, 20), φ ~ U(0, 2π)
  ar1        z_t = ϕ z_{t−1} + N(0, ar_noise²),   ϕ ~ U(0.5, 0.9)
  + an occasional level shift inside the context (probability `context_shift_prob`, size
    ±U(1, 2) at a uniform time)
  + the *cue*: with probability `cue_prob` the last `cue_len` context points carry an upward
    ramp of height `cue_height`; after a cue, the horizon starts a level shift of
    `+shift_size` with probability `shift_given_cue` (never without a cue)
  x ← level + scale·x,  level ~ N(0, 2²), scale ~ logU(0.5, 5).

Two mixes (`MIXES`) differ only in the regime weights and in `shift_given_cue`: the pretraining
mix rarely shifts after a cue (0.1), the RL mix always does (1.0). A forecaster pretrained by NLL
on the first mix puts a low-weight component near the shifted future of cue series; in the RL
mix those series are the *hard regions* (`Series.hard`): the truth is near the low-weight
component, as in the "suboptimal collapse" setting of GTN-R (arXiv 2608.08010).
Every number above is a PROPOSAL of this analogue (the paper's data are ETT, ECL, Weather, …).

The per-series scale `σ̂` is the context's population std (floored at `scale_floor`), the unit
of GTN-R's neighbourhood `ỹ = y* + δ·σ̂·ξ` and of the rewards.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

from jaxrl_post.registry import Registry

REGIMES = ("sinusoid", "ar1")


@dataclasses.dataclass(frozen=True)
class RegimeMix:
  """How series are drawn (see the module docstring for each knob)."""

  sinusoid_weight: float = 0.5  # P(sinusoid); the rest is AR(1)
  context_shift_prob: float = 0.2
  cue_prob: float = 0.3
  shift_given_cue: float = 1.0
  shift_size: float = 3.0
  cue_len: int = 3
  cue_height: float = 0.6
  noise: float = 0.1
  ar_noise: float = 0.3
  scale_floor: float = 1e-3

  def __post_init__(self):
    for key in ("sinusoid_weight", "context_shift_prob", "cue_prob", "shift_given_cue"):
      value = getattr(self, key)
      if not 0.0 <= value <= 1.0:
        raise ValueError(f"RegimeMix.{key}={value} must be in [0, 1]")


MIXES: Registry[RegimeMix] = Registry("time-series mix")
MIXES.add("pretrain", RegimeMix(sinusoid_weight=0.6, shift_given_cue=0.1))
MIXES.add("rl", RegimeMix(sinusoid_weight=0.4, shift_given_cue=1.0))


class Series(NamedTuple):
  """A batch of series (numpy)."""

  context: np.ndarray  # float32[n, C]
  target: np.ndarray  # float32[n, H], the true future y*
  scale: np.ndarray  # float32[n], σ̂ = context std (floored)
  regime: np.ndarray  # int32[n], index into REGIMES
  cue: np.ndarray  # bool[n], the cue is in the context
  hard: np.ndarray  # bool[n], cue and shifted horizon (a hard region)


def context_scale(context: np.ndarray, floor: float = 1e-3) -> np.ndarray:
  """σ̂ = population std of `context [..., C]` over C, floored at `floor` (float32)."""
  return np.maximum(np.std(np.asarray(context, np.float64), axis=-1), floor).astype(np.float32)


def generate(rng: np.random.Generator, n: int, mix: RegimeMix | str, *, context_len: int = 32,
             horizon: int = 8) -> Series:
  """`n` series of `mix` (a `RegimeMix` or a name in `MIXES`), a pure function of `rng`.

  Example:
    >>> s = generate(np.random.default_rng(0), 4, "rl", context_len=8, horizon=3)
    >>> s.context.shape, s.target.shape, s.scale.shape, s.hard.dtype
    ((4, 8), (4, 3), (4,), dtype('bool'))
  """
  mix = MIXES.get(mix) if isinstance(mix, str) else mix
  if n < 1 or context_len < 2 or horizon < 1:
    raise ValueError(f"n={n}, context_len={context_len}, horizon={horizon}: need n >= 1, "
                     "context_len >= 2, horizon >= 1")
  if mix.cue_len > context_len:
    raise ValueError(f"RegimeMix.cue_len={mix.cue_len} exceeds context_len={context_len}")
  length = context_len + horizon
  t = np.arange(length, dtype=np.float64)
  regime = (rng.uniform(size=n) >= mix.sinusoid_weight).astype(np.int32)
  # Every draw is made for every row (fixed consumption of `rng`), then selected.
  amp, period = rng.uniform(0.5, 1.5, (n, 1)), rng.uniform(6.0, 20.0, (n, 1))
  phase = rng.uniform(0, 2 * np.pi, (n, 1))
  sinus = amp * np.sin(2 * np.pi * t / period + phase) + mix.noise * rng.normal(size=(n, length))
  phi = rng.uniform(0.5, 0.9, n)
  eps = mix.ar_noise * rng.normal(size=(n, length))
  ar = np.zeros((n, length))
  ar[:, 0] = eps[:, 0] / np.sqrt(1 - phi**2)
  for i in range(1, length):
    ar[:, i] = phi * ar[:, i - 1] + eps[:, i]
  x = np.where(regime[:, None] == 0, sinus, ar)
  # A level shift inside the context.
  has_shift = rng.uniform(size=n) < mix.context_shift_prob
  at = rng.integers(1, context_len, n)
  size = rng.uniform(1.0, 2.0, n) * rng.choice([-1.0, 1.0], n)
  x += np.where(has_shift[:, None] & (t[None] >= at[:, None]), size[:, None], 0.0)
  # The cue (a ramp on the last context points) and the shift at the forecast origin.
  cue = rng.uniform(size=n) < mix.cue_prob
  ramp = np.zeros(length)
  ramp[context_len - mix.cue_len:context_len] = mix.cue_height * np.arange(
    1, mix.cue_len + 1) / mix.cue_len
  x += np.where(cue[:, None], ramp[None], 0.0)
  hard = cue & (rng.uniform(size=n) < mix.shift_given_cue)
  x += np.where(hard[:, None] & (t[None] >= context_len), mix.shift_size, 0.0)
  level, scale = rng.normal(0, 2.0, (n, 1)), np.exp(rng.uniform(np.log(0.5), np.log(5.0), (n, 1)))
  x = level + scale * x
  context = x[:, :context_len].astype(np.float32)
  return Series(context=context, target=x[:, context_len:].astype(np.float32),
                scale=context_scale(context, mix.scale_floor), regime=regime, cue=cue,
                hard=hard)


def batch_rng(seed: int, stream: int, index: int) -> np.random.Generator:
  """The generator of batch `index` of data stream `stream` of run seed `seed` (resume-safe)."""
  return np.random.default_rng([int(seed), int(stream), int(index)])
