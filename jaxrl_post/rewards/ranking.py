"""Ranking rewards for score-predicting policies (PCQA-R1, arXiv 2608.18627).

The policy reads a point cloud (six rendered views) and writes a reasoning block followed by a
quality score in `<answer>…</answer>`. Each of the `num_prompts` prompts of a batch gets K
rollouts; their parsed scores form `scores[num_prompts, K]` and the ground-truth mean opinion
scores `mos[num_prompts]`. The reward of rollout k of prompt i is

  r = r_rk + w_fmt(t)·r_fmt + α·r_gs

* r_rk, the fidelity ranking reward: how well ŷ_i^(k) orders prompt i against the *other* prompts
  of the batch, through a Thurstone model conditioned on the rollouts. It only reads the order of
  the MOS, so it is invariant to any strictly increasing transform of the MOS and transfers
  across datasets whose score scales differ (the paper's point).
* r_gs, a Gaussian proximity reward that anchors scores to the source MOS scale.
* r_fmt ∈ {0, 1}, a format bonus whose weight decays during training.

Host side, `parse_score` / `format_reward` / `parse_completions` turn completions into arrays;
an unparseable completion becomes NaN in `scores`. The array functions are pure, jittable and
batched over `[num_prompts, K]`; a NaN score marks an invalid rollout, which gets every reward
term 0 (spec PROPOSAL) and is counted (`RewardTerms.valid`, `ParsedCompletions.num_unparseable`).

Choices where the spec is silent or ambiguous (all PROPOSALs, documented at each function):

* Ties in the MOS count g_ij = 0.5. σ_i is the population std (ddof 0) over the valid rollouts.
* Repeated prompts: rows with the same `prompt_ids` never compare with each other, and each
  *unique* other prompt weighs 1 in the average (its copies share that weight).
* A prompt with no other comparable prompt in the batch gets r_rk = 0.
* Units of the Gaussian: by default the MOS (normalised to [0, 1] as in the paper) is mapped
  affinely onto the model's output scale [1, 5] and σ = 0.5 is read in those units
  (`gaussian_units="score"`); `gaussian_units="mos"` maps the scores onto the MOS range instead,
  the literal reading, where σ = 0.5 is a very loose anchor (≈ 2 points on the 1–5 scale).
* `parse_score` reads the first number of the first `<answer>` block and clamps it to [1, 5];
  non-finite numbers are unparseable.

`RANKING_REWARDS` names the ranking terms `total_reward` can use: "thurstone_fidelity". An entry
is called as `fn(scores, mos, *, gamma, prompt_ids)` and returns `[num_prompts, K]` rewards.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Sequence
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_post.advantages import group_advantages
from jaxrl_post.registry import Registry

ArrayLike = jax.Array | np.ndarray | float | int

RANKING_REWARDS: Registry = Registry("ranking reward")

GAUSSIAN_UNITS = ("score", "mos")

# The output scale of the released PCQA-R1 prompt ("a continuous scale from 1.00 to 5.00") and the
# MOS scale of its training data (normalised to [0, 1] per dataset).
SCORE_RANGE = (1.0, 5.0)
MOS_RANGE = (0.0, 1.0)

_SQRT_HALF = 0.7071067811865476


class PromptStats(NamedTuple):
  """Per-prompt statistics of the valid rollout scores."""

  mean: jax.Array  # [num_prompts] μ_i; 0 where the prompt has no valid rollout.
  var: jax.Array  # [num_prompts] σ_i² (population, ddof 0); 0 where n_i ≤ 1.
  count: jax.Array  # [num_prompts] float32 n_i, the number of valid rollouts.


class RewardTerms(NamedTuple):
  """The terms of `total_reward`; `[num_prompts, K]` float32 unless noted."""

  total: jax.Array  # r = r_rk + w_fmt·r_fmt + α·r_gs; 0 where not valid.
  ranking: jax.Array  # r_rk.
  proximity: jax.Array  # r_gs before α.
  format: jax.Array  # r_fmt ∈ {0, 1}, forced to 0 where the score is unparseable.
  format_weight: jax.Array  # scalar w_fmt(t).
  valid: jax.Array  # bool: the score parsed to a finite number; jnp.sum(~valid) counts failures.


def _check_scores(scores: jax.Array, mos: jax.Array) -> None:
  chex.assert_rank(scores, 2)
  chex.assert_shape(mos, scores.shape[:1])


@jax.jit
def prompt_statistics(scores: jax.Array) -> PromptStats:
  """Mean and population variance of each prompt's valid (finite) rollout scores.

  μ_i = (1/n_i) Σ_k ŷ_i^(k),  σ_i² = (1/n_i) Σ_k (ŷ_i^(k) − μ_i)²  over the n_i finite scores.
  The spec does not give the ddof of σ_i; ddof 0 (population) is its PROPOSAL and also keeps σ_i
  defined for a prompt with a single valid rollout.

  Args:
    scores: `[num_prompts, K]` parsed scores, NaN = unparseable.

  Returns:
    `PromptStats(mean, var, count)`, each `[num_prompts]` float32.

  Examples:
    >>> import jax.numpy as jnp
    >>> stats = prompt_statistics(jnp.array([[2.0, 4.0], [3.0, jnp.nan]]))
    >>> stats.mean.tolist(), stats.var.tolist(), stats.count.tolist()
    ([3.0, 3.0], [1.0, 0.0], [2.0, 1.0])
  """
  scores = jnp.asarray(scores, jnp.float32)
  chex.assert_rank(scores, 2)
  valid = jnp.isfinite(scores)
  x = jnp.where(valid, scores, 0.0)
  count = jnp.sum(valid, axis=-1).astype(jnp.float32)
  mean = jnp.sum(x, axis=-1) / jnp.maximum(count, 1.0)
  dev = jnp.where(valid, x - mean[:, None], 0.0)
  var = jnp.sum(jnp.square(dev), axis=-1) / jnp.maximum(count, 1.0)
  return PromptStats(mean, var, count)


@jax.jit
def thurstone_probability(scores: jax.Array, *, gamma: ArrayLike = 1e-6) -> jax.Array:
  """Rollout-conditioned Thurstone probability that prompt i's rollout k outranks prompt j.

  p_k(x_i, x_j) = Φ((ŷ_i^(k) − μ_j) / √(σ_i² + σ_j² + γ))   (PCQA-R1, arXiv 2608.18627)

  with μ_j, σ_j² the mean and population variance of prompt j's rollout scores
  (`prompt_statistics`) and Φ the standard normal CDF. Comparing one rollout with the other
  prompt's *distribution* of rollouts gives each rollout its own reward while the spread of both
  prompts' predictions sets how sharp the comparison is; γ keeps the denominator positive when
  all rollouts agree.

  Args:
    scores: `[num_prompts, K]` parsed scores, NaN = unparseable.
    gamma: γ ≥ 0 (paper: 1e-6). With γ = 0 two prompts whose rollouts all agree compare by
      the limit z = ±∞ (or 0 when the score equals the other mean).

  Returns:
    `[num_prompts, K, num_prompts]` float32: entry `[i, k, j]` is p_k(x_i, x_j). Entries of an
    unparseable rollout k, or of a prompt j with no valid rollout, are meaningless (masked by
    the callers).

  Examples:
    >>> import jax.numpy as jnp
    >>> p = thurstone_probability(jnp.array([[2.0, 4.0], [3.0, 3.0]]), gamma=0.0)
    >>> [round(x, 4) for x in p[0, :, 1].tolist()]  # Φ((2 − 3)/1), Φ((4 − 3)/1)
    [0.1587, 0.8413]
  """
  return _thurstone_cdf(scores, gamma)[0]


def _thurstone_cdf(scores, gamma):
  """(p, 1 − p, stats) with p[i, k, j] = p_k(x_i, x_j)."""
  scores = jnp.asarray(scores, jnp.float32)
  stats = prompt_statistics(scores)
  x = jnp.where(jnp.isfinite(scores), scores, 0.0)
  denom = jnp.sqrt(stats.var[:, None] + stats.var[None, :] + gamma)[:, None, :]  # [i, 1, j]
  diff = x[:, :, None] - stats.mean[None, None, :]  # [i, k, j]
  # γ = 0 with two unanimous prompts: take the limit of z as the spread vanishes (±∞, or 0 when
  # the score equals the mean), not 0/0.
  positive = denom > 0
  limit = jnp.where(diff == 0, 0.0, jnp.sign(diff) * jnp.inf)
  z = jnp.where(positive, diff / jnp.where(positive, denom, 1.0), limit)
  # Φ(z) = erfc(−z/√2)/2: one primitive, and accurate in both tails (no 1 − Φ cancellation).
  return 0.5 * jax.lax.erfc(-z * _SQRT_HALF), 0.5 * jax.lax.erfc(z * _SQRT_HALF), stats


def _comparison_weights(count: jax.Array, prompt_ids: jax.Array) -> jax.Array:
  """w[i, j]: weight of prompt row j in row i's average over Z_i (see the reward's docstring)."""
  has_rollouts = count > 0
  same = prompt_ids[:, None] == prompt_ids[None, :]
  # Copies of one prompt (with a valid rollout) share a single unit of weight.
  copies = jnp.sum(same & has_rollouts[None, :], axis=-1).astype(jnp.float32)
  weight = jnp.where(has_rollouts, 1.0 / jnp.maximum(copies, 1.0), 0.0)
  return jnp.where(same, 0.0, weight[None, :])


@jax.jit
def thurstone_fidelity_reward(
  scores: jax.Array,
  mos: jax.Array,
  *,
  gamma: ArrayLike = 1e-6,
  prompt_ids: jax.Array | None = None,
) -> jax.Array:
  """Fidelity ranking reward of each rollout against the other prompts of the batch.

  r_rk^(k)(x_i) = (1/|Z_i|) Σ_{j∈Z_i} [ √(p_k·g_ij) + √((1 − p_k)(1 − g_ij)) ]
  g_ij = 1 if y_i > y_j, 0 if y_i < y_j, 0.5 if y_i = y_j     (PCQA-R1, arXiv 2608.18627)

  with p_k = p_k(x_i, x_j) from `thurstone_probability` and y the MOS. The fidelity
  √(p g) + √((1−p)(1−g)) is the Bhattacharyya overlap of the predicted and true pairwise
  outcomes: 1 when they agree with certainty, and for a tie (g = 0.5, spec silent: PROPOSAL) it
  peaks at 1 when p = 0.5. Only the order of the MOS enters, so r_rk is unchanged by any strictly
  increasing transform of `mos`.

  Z_i holds the rows j whose prompt differs from row i's (`prompt_ids`) and that have at least
  one valid rollout. The paper averages over the other *unique* prompts, so the copies of a
  prompt that appears several times in the batch share one unit of weight: each unique prompt
  counts once in |Z_i|, and copies never compare with each other (a prompt cannot be ranked
  against itself). A row with Z_i empty (the batch holds a single prompt) gets r_rk = 0, as does
  every unparseable rollout (NaN score).

  Args:
    scores: `[num_prompts, K]` parsed scores, NaN = unparseable.
    mos: `[num_prompts]` ground-truth MOS (any monotone scale; only comparisons are used).
    gamma: γ of the Thurstone denominator (paper: 1e-6).
    prompt_ids: optional `[num_prompts]` int ids; rows with equal ids are the same prompt (and
      carry the same MOS). Default: every row is a distinct prompt.

  Returns:
    `[num_prompts, K]` float32 rewards in [0, 1].

  Examples:
    >>> import jax.numpy as jnp
    >>> r = thurstone_fidelity_reward(jnp.array([[2.0, 4.0], [3.0, 3.0]]), jnp.array([0.8, 0.2]),
    ...                               gamma=0.0)
    >>> [[round(x, 4) for x in row] for row in r.tolist()]  # √Φ(−1), √Φ(1); √(1 − Φ(0))
    [[0.3983, 0.9172], [0.7071, 0.7071]]

  References:
    PCQA-R1, arXiv 2608.18627 (rollout-conditioned Thurstone fidelity reward).
    Thurstone, A law of comparative judgment (1927); Tsai et al., FRank (fidelity loss), SIGIR 2007.
  """
  scores = jnp.asarray(scores, jnp.float32)
  mos = jnp.asarray(mos)
  _check_scores(scores, mos)
  num_prompts = scores.shape[0]
  if prompt_ids is None:
    prompt_ids = jnp.arange(num_prompts, dtype=jnp.int32)
  prompt_ids = jnp.asarray(prompt_ids)
  chex.assert_shape(prompt_ids, (num_prompts,))

  p, q, stats = _thurstone_cdf(scores, gamma)
  g = jnp.where(mos[:, None] > mos[None, :], 1.0, jnp.where(mos[:, None] < mos[None, :], 0.0, 0.5))
  fidelity = jnp.sqrt(p * g[:, None, :]) + jnp.sqrt(q * (1.0 - g[:, None, :]))  # [i, k, j]
  weight = _comparison_weights(stats.count, prompt_ids)  # [i, j]
  total_weight = jnp.sum(weight, axis=-1)
  # Masked entries (j = i, empty prompts) may hold garbage; 0·NaN would still be NaN.
  fidelity = jnp.where(weight[:, None, :] > 0, fidelity, 0.0)
  reward = (
    jnp.sum(fidelity * weight[:, None, :], axis=-1) / jnp.maximum(total_weight, 1e-12)[:, None]
  )
  keep = jnp.isfinite(scores) & (total_weight > 0)[:, None]
  return jnp.where(keep, reward, 0.0)


RANKING_REWARDS.add("thurstone_fidelity", thurstone_fidelity_reward)


@jax.jit
def gaussian_proximity(
  scores: jax.Array, mos: jax.Array, *, sigma: ArrayLike = 0.5, scale: ArrayLike = 1.0
) -> jax.Array:
  """Gaussian proximity of each rollout's score to its prompt's MOS.

  r_gs^(k) = s·exp(−(ŷ_i^(k) − y_i)² / (2σ²))   (PCQA-R1, arXiv 2608.18627; σ = 0.5, s = 1.0)

  `scores` and `mos` must be in the same units, and σ is read in those units. The paper gives
  σ = 0.5 with MOS normalised to [0, 1] while its prompt asks for scores in [1, 5]; which units
  σ refers to is ambiguous. `total_reward` converts between the two scales (`gaussian_units`);
  here the caller chooses. An unparseable rollout (NaN) gets 0.

  Args:
    scores: `[num_prompts, K]` parsed scores, NaN = unparseable.
    mos: `[num_prompts]` MOS in the units of `scores`.
    sigma: σ > 0.
    scale: s.

  Returns:
    `[num_prompts, K]` float32 rewards in [0, s].

  Examples:
    >>> import jax.numpy as jnp
    >>> r = gaussian_proximity(jnp.array([[3.0, 3.5, 4.0]]), jnp.array([3.0]), sigma=0.5)
    >>> [round(x, 4) for x in r[0].tolist()]  # exp(0), exp(−1/2), exp(−2)
    [1.0, 0.6065, 0.1353]
  """
  scores = jnp.asarray(scores, jnp.float32)
  mos = jnp.asarray(mos, jnp.float32)
  _check_scores(scores, mos)
  valid = jnp.isfinite(scores)
  diff = jnp.where(valid, scores - mos[:, None], 0.0)
  return jnp.where(valid, scale * jnp.exp(-jnp.square(diff) / (2.0 * jnp.square(sigma))), 0.0)


def rescale_range(
  x: ArrayLike, *, from_range: tuple[float, float], to_range: tuple[float, float]
) -> jax.Array:
  """Affine map sending `from_range` onto `to_range`: a + (x − a')·(b − a)/(b' − a').

  Examples:
    >>> rescale_range(0.5, from_range=(0.0, 1.0), to_range=(1.0, 5.0)).tolist()
    3.0
  """
  (lo, hi), (new_lo, new_hi) = from_range, to_range
  if hi == lo:
    raise ValueError(f"empty range {from_range}")
  return new_lo + (jnp.asarray(x, jnp.float32) - lo) * ((new_hi - new_lo) / (hi - lo))


@functools.partial(jax.jit, static_argnames=("hold_fraction", "final_weight", "initial_weight"))
def format_weight(
  step: ArrayLike,
  total_steps: ArrayLike,
  *,
  hold_fraction: float = 0.2,
  final_weight: float = 0.3,
  initial_weight: float = 1.0,
) -> jax.Array:
  """Weight of the format bonus: constant, then a linear decay to `final_weight`.

  With progress u = clip(t / T, 0, 1):
    w_fmt(t) = w_0                                        if u ≤ h
               w_0 + (w_end − w_0)·(u − h) / (1 − h)     otherwise
  PCQA-R1 (arXiv 2608.18627): w_0 = 1 for the first h = 20 % of the GRPO steps, then linear to
  w_end = 0.3 at the end. As in optax's schedules the end value is reached at t = T; with 0-based
  steps the last update, t = T − 1, gets w_end + (w_0 − w_end)/((1 − h)·T), the difference being
  one step of the decay.

  `step` and `total_steps` may be traced; the three weights are static.

  Args:
    step: t, the current GRPO step (counted from 0).
    total_steps: T > 0, the number of GRPO steps of the run.
    hold_fraction: h ∈ [0, 1), the share of the steps at w_0.
    final_weight: w_end.
    initial_weight: w_0.

  Returns:
    Scalar float32 w_fmt(t).

  Examples:
    >>> [round(float(format_weight(t, 100)), 4) for t in (0, 20, 60, 100)]
    [1.0, 1.0, 0.65, 0.3]
  """
  if not 0.0 <= hold_fraction < 1.0:
    raise ValueError(f"hold_fraction must be in [0, 1), got {hold_fraction}")
  u = jnp.clip(jnp.asarray(step, jnp.float32) / jnp.asarray(total_steps, jnp.float32), 0.0, 1.0)
  decay = jnp.maximum(u - hold_fraction, 0.0) / (1.0 - hold_fraction)
  return jnp.asarray(initial_weight + (final_weight - initial_weight) * decay, jnp.float32)


@functools.partial(
  jax.jit,
  static_argnames=(
    "hold_fraction",
    "final_weight",
    "ranking",
    "gaussian_units",
    "mos_range",
    "score_range",
  ),
)
def total_reward(
  scores: jax.Array,
  mos: jax.Array,
  format_ok: jax.Array,
  *,
  step: ArrayLike,
  total_steps: ArrayLike,
  prompt_ids: jax.Array | None = None,
  gamma: ArrayLike = 1e-6,
  sigma: ArrayLike = 0.5,
  scale: ArrayLike = 1.0,
  alpha: ArrayLike = 1.0,
  hold_fraction: float = 0.2,
  final_weight: float = 0.3,
  ranking: str = "thurstone_fidelity",
  gaussian_units: str = "score",
  mos_range: tuple[float, float] = MOS_RANGE,
  score_range: tuple[float, float] = SCORE_RANGE,
) -> RewardTerms:
  """The PCQA-R1 reward of every rollout: ranking + decaying format bonus + Gaussian anchor.

  r^(k) = r_rk^(k) + w_fmt(t)·r_fmt + α·r_gs^(k)   (PCQA-R1, arXiv 2608.18627; α = 1 in the full
  model, α = 0 for the "ranking-only" ablation)

  The format term is an additive bonus, not a gate. An unparseable rollout (NaN score) gets
  r = 0: r_rk = r_gs = 0 and its format bonus is dropped too (spec PROPOSAL), so a well-formed
  completion without a number earns nothing.

  Units of the Gaussian (spec ambiguity, PROPOSAL): `mos` is given on `mos_range` (the paper
  normalises every dataset to [0, 1]) and scores on `score_range` (the prompt's 1–5 scale).
  "score" (default) maps the MOS onto the score range and reads σ in score units, so σ = 0.5 is
  half a point on the 1–5 scale; "mos" maps the scores onto the MOS range, the literal reading,
  where σ = 0.5 spans half the whole range. When both ranges are equal the two agree. The ranking
  term reads the MOS order only and needs no conversion.

  Args:
    scores: `[num_prompts, K]` parsed scores on `score_range`, NaN = unparseable.
    mos: `[num_prompts]` MOS on `mos_range`.
    format_ok: `[num_prompts, K]` r_fmt ∈ {0, 1} (bool or float), e.g. from `parse_completions`.
    step: the current GRPO step t (may be traced).
    total_steps: the number of GRPO steps T (may be traced).
    prompt_ids: optional `[num_prompts]` ids of repeated prompts (see
      `thurstone_fidelity_reward`).
    gamma: Thurstone γ (paper: 1e-6).
    sigma: Gaussian σ, in `gaussian_units` (paper: 0.5).
    scale: Gaussian scale s (paper: 1.0).
    alpha: α, the weight of the Gaussian term (paper: 1).
    hold_fraction: share of steps at the full format weight (paper: 0.2; static).
    final_weight: format weight at the end of training (paper: 0.3; static).
    ranking: name in `RANKING_REWARDS` (static).
    gaussian_units: "score" or "mos" (static).
    mos_range: `(lo, hi)` of the MOS scale (static).
    score_range: `(lo, hi)` of the score scale (static).

  Returns:
    `RewardTerms` with `[num_prompts, K]` float32 terms (and the scalar `format_weight`).

  Examples:
    >>> import jax.numpy as jnp
    >>> out = total_reward(jnp.array([[3.0, jnp.nan], [2.0, 2.0]]), jnp.array([0.5, 0.25]),
    ...                    jnp.array([[1.0, 1.0], [0.0, 1.0]]), step=0, total_steps=10)
    >>> [[round(x, 4) for x in row] for row in out.total.tolist()]  # 1 + 1 + 1; NaN → 0; ...
    [[3.0, 0.0], [2.0, 3.0]]
    >>> int(jnp.sum(~out.valid))
    1
  """
  if gaussian_units not in GAUSSIAN_UNITS:
    raise ValueError(
      f"unknown gaussian_units {gaussian_units!r}; valid: {', '.join(GAUSSIAN_UNITS)}"
    )
  scores = jnp.asarray(scores, jnp.float32)
  mos = jnp.asarray(mos, jnp.float32)
  format_ok = jnp.asarray(format_ok, jnp.float32)
  _check_scores(scores, mos)
  chex.assert_equal_shape([scores, format_ok])
  valid = jnp.isfinite(scores)

  r_rk = RANKING_REWARDS.get(ranking)(scores, mos, gamma=gamma, prompt_ids=prompt_ids)
  if gaussian_units == "score":
    r_gs = gaussian_proximity(
      scores,
      rescale_range(mos, from_range=mos_range, to_range=score_range),
      sigma=sigma,
      scale=scale,
    )
  else:
    r_gs = gaussian_proximity(
      rescale_range(scores, from_range=score_range, to_range=mos_range),
      mos,
      sigma=sigma,
      scale=scale,
    )
  r_fmt = jnp.where(valid, format_ok, 0.0)
  w_fmt = format_weight(step, total_steps, hold_fraction=hold_fraction, final_weight=final_weight)
  total = jnp.where(valid, r_rk + w_fmt * r_fmt + alpha * r_gs, 0.0)
  return RewardTerms(total, r_rk, r_gs, r_fmt, w_fmt, valid)


# ---------------------------------------------------------------------------------------------
# Host side: completions → arrays.
# ---------------------------------------------------------------------------------------------

REASONING_TAG = "pcqa_reasoning"

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
# A decimal number with optional sign, fraction and exponent; "nan" / "inf" never match.
_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")
# Chat-template debris that a decoder may leave at the end of a completion.
_SPECIAL_TAIL = re.compile(r"(?:<\|(?:im_end|im_start|endoftext|pad)\|>|\s)+\Z")
# Qwen chat templates with thinking disabled open the completion with an empty think block.
_EMPTY_THINK = re.compile(r"\A(?:\s*<(think|thinking)>\s*</\1>)+")


def parse_score(
  text: Any, *, score_range: tuple[float, float] | None = SCORE_RANGE
) -> float | None:
  """The score a completion gives: the first number of its first `<answer>…</answer>` block.

  Rules (the released PCQA-R1 evaluation parser also takes the first answer block and clamps to
  [1, 5]; the choices below where it differs are ours):
  * A closed `<answer>` block is required: a number elsewhere in the text does not count (the
    released parser falls back to the whole text; a training reward should not pay for scores
    outside the answer).
  * Several blocks: the first one is read (and `format_reward` is 0 for such completions).
    Nested tags: the block ends at the first `</answer>`, so `<answer><answer>4</answer>` reads 4.
  * Inside the block, the first number in reading order (the released parser prefers the first
    number with a decimal point anywhere in the block).
  * Numbers that are not finite (`nan`, `inf`, `1e999`) and blocks without a number are
    unparseable; so is anything that is not a `str`.
  * Finite numbers are clamped to `score_range` (None: no clamping).

  Args:
    text: the decoded completion.
    score_range: `(lo, hi)` to clamp to (default [1, 5]).

  Returns:
    The score as a float, or None when the completion has no readable score.

  Examples:
    >>> parse_score("<pcqa_reasoning>Sharp.</pcqa_reasoning><answer> 3.75 </answer>")
    3.75
    >>> parse_score("<answer>7</answer>"), parse_score("<answer>great</answer>")
    (5.0, None)
  """
  if not isinstance(text, str):
    return None
  block = _ANSWER.search(text)
  if block is None:
    return None
  number = _NUMBER.search(block.group(1))
  if number is None:
    return None
  value = float(number.group())
  if not math.isfinite(value):
    return None
  if score_range is not None:
    value = min(max(value, score_range[0]), score_range[1])
  return value


def format_reward(text: Any, *, reasoning_tag: str = REASONING_TAG) -> float:
  """r_fmt ∈ {0, 1}: a non-trivial reasoning block followed by exactly one answer block.

  The completion, after removing trailing chat special tokens / whitespace and leading empty
  `<think></think>` blocks, must read

    <tag> R </tag> <answer> A </answer>      (whitespace allowed between and around the blocks)

  where R contains no `<` and at least one letter (`str.isalpha`, which covers CJK; "non-trivial
  alphabetic/CJK content" in the paper) and A contains no `<`. Nothing may follow the answer.
  Whether A holds a number is `parse_score`'s business, not this check's.

  Args:
    text: the decoded completion.
    reasoning_tag: the name of the reasoning tag.

  Returns:
    1.0 or 0.0.

  Examples:
    >>> format_reward("<pcqa_reasoning>Clean surface.</pcqa_reasoning>\\n<answer>4.1</answer>")
    1.0
    >>> format_reward("<pcqa_reasoning>...</pcqa_reasoning><answer>4.1</answer>")  # no letter
    0.0
  """
  if not isinstance(text, str):
    return 0.0
  text = _EMPTY_THINK.sub("", _SPECIAL_TAIL.sub("", text))
  tag = re.escape(reasoning_tag)
  match = re.fullmatch(rf"\s*<{tag}>([^<]*)</{tag}>\s*<answer>[^<]*</answer>", text)
  if match is None or not any(c.isalpha() for c in match.group(1)):
    return 0.0
  return 1.0


class ParsedCompletions(NamedTuple):
  """Completions of a batch turned into the arrays of `total_reward`."""

  scores: np.ndarray  # [num_prompts, K] float32; NaN where unparseable.
  format_ok: np.ndarray  # [num_prompts, K] float32 r_fmt ∈ {0, 1}.
  num_unparseable: int  # Number of NaN entries of `scores`.


def parse_completions(
  texts: Sequence[Sequence[Any]],
  *,
  score_range: tuple[float, float] | None = SCORE_RANGE,
  reasoning_tag: str = REASONING_TAG,
) -> ParsedCompletions:
  """`parse_score` and `format_reward` over the K completions of each prompt.

  Args:
    texts: `num_prompts` sequences of K completions each.
    score_range: passed to `parse_score`.
    reasoning_tag: passed to `format_reward`.

  Returns:
    `ParsedCompletions`.

  Examples:
    >>> out = parse_completions([["<answer>2</answer>", "no answer"]])
    >>> out.scores.tolist(), out.num_unparseable
    ([[2.0, nan]], 1)
  """
  sizes = {len(row) for row in texts}
  if len(sizes) > 1:
    raise ValueError(f"every prompt needs the same number of completions, got sizes {sizes}")
  num_rollouts = sizes.pop() if sizes else 0
  scores = np.full((len(texts), num_rollouts), np.nan, np.float32)
  format_ok = np.zeros((len(texts), num_rollouts), np.float32)
  for i, row in enumerate(texts):
    for k, text in enumerate(row):
      score = parse_score(text, score_range=score_range)
      if score is not None:
        scores[i, k] = score
      format_ok[i, k] = format_reward(text, reasoning_tag=reasoning_tag)
  return ParsedCompletions(scores, format_ok, int(np.sum(np.isnan(scores))))


class RolloutRewards(NamedTuple):
  """Rewards of one GRPO step's rollouts (`rollout_rewards`)."""

  terms: RewardTerms  # [B, K] terms of `total_reward`.
  adv: np.ndarray  # [B·K] float32 group-normalised advantages (row p·K + k).
  scores: np.ndarray  # [B, K] parsed scores, NaN = unparseable.
  num_unparseable: int


def rollout_rewards(texts: Sequence[str], mos01: np.ndarray, *, num_samples: int, step: int,
                    total_steps: int, alpha: float, sigma: float = 0.5, scale: float = 1.0,
                    gamma: float = 1e-6, hold_fraction: float = 0.2, final_weight: float = 0.3,
                    gaussian_units: str = "score", adv_eps: float = 1e-6,
                    score_range: tuple[float, float] = SCORE_RANGE,
                    mos_range: tuple[float, float] = MOS_RANGE) -> RolloutRewards:
  """Completions (prompt-major, K per prompt) → PCQA-R1 rewards and GRPO advantages.

  r_i^(k) = r_rk + w_fmt(t)·r_fmt + α·r_gs (`total_reward`; PCQA-R1, arXiv 2608.18627) and

    A_i^(k) = (r_i^(k) − mean_k r_i) / (std_k r_i + ε)

  over the K rollouts of prompt i (`advantages.group_advantages`, GRPO's estimator). An
  unparseable rollout gets r = 0 (every term), so the advantage pushes it down.

  Args:
    texts: `B·K` completions, the K of prompt i at rows `i·K … i·K + K − 1`.
    mos01: `[B]` the prompts' MOS normalised to `mos_range`.
    num_samples: K.
    step, total_steps: where training is (0-based step), for the format weight's decay.
    alpha: weight of the Gaussian proximity term (0: the ranking-only ablation).
    sigma, scale, gamma, hold_fraction, final_weight, gaussian_units: `total_reward`'s.
    adv_eps: ε of the advantage.

  Returns:
    `RolloutRewards`.
  """
  b = len(mos01)
  if len(texts) != b * num_samples:
    raise ValueError(f"{len(texts)} completions for {b} prompts × K={num_samples}")
  parsed = parse_completions(
    [texts[i * num_samples:(i + 1) * num_samples] for i in range(b)], score_range=score_range)
  terms = total_reward(
    parsed.scores, jnp.asarray(mos01, jnp.float32), parsed.format_ok, step=step,
    total_steps=total_steps, gamma=gamma, sigma=sigma, scale=scale, alpha=alpha,
    hold_fraction=hold_fraction, final_weight=final_weight, gaussian_units=gaussian_units,
    mos_range=mos_range, score_range=score_range)
  groups = jnp.repeat(jnp.arange(b, dtype=jnp.int32), num_samples)
  adv = group_advantages(terms.total.reshape(-1), groups, num_groups=b, eps=adv_eps)
  return RolloutRewards(terms, np.asarray(adv, np.float32), parsed.scores,
                        parsed.num_unparseable)
