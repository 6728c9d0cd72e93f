"""WMRL (arXiv 2608.12564) in a GRPO-family step: world-model rewards debiased by real anchors.

`config.world_model.name` picks the world model from `WORLD_MODELS` (default "none": off).
WMRL replaces most of the environment's reward calls with a world model's prediction and keeps
a thin stream of *anchor* groups that are scored by both; the anchors correct the world model
twice (`advantages.wmrl`):

  Online Debiasing   the anchor pairs (r_wm, r_env) fit a monotone map f̂ (bucketed isotonic
                     regression); non-anchor groups are rewarded with f̂(r_wm);
  Inverse-Variance   anchor-group advantages × w = clip(1 + c·s̄², 1, w_max), s̄² an EMA of the
  Denoising          within-group disagreement of f̂(r_wm) with r_env.

Per step, in the paper's order (`advantages.wmrl_step`): choose the anchor groups; push their
pairs into the calibrator *before* measuring their disagreement; reward the other groups with
f̂(r_wm); GRPO advantages over each group's graded rollouts (population std), anchor groups × w.
The part's `rewards` hook replaces the step's advantages with these before the old policy is
scored. r_env is the scalar reward the step's GRPO would standardise, Σ_k w_k·reward_k over
`config.reward_weights` (`advantages.combine_rewards`; correct + 0.1·format by default).

The world model. The paper's world model is the policy backbone prompted to predict the outcome
and score of executing the agent's code: cheap (it batches with generation) but biased and noisy.
We have no such model, so a `WORLD_MODELS` entry stands in for it: a cheap *scorer* of the
completion whose score is biased and non-affinely related to the verifier's reward, plus
Gaussian noise of std `noise_std` (drawn from (seed, step), so a resumed run draws the same),
clipped to [0, 1]:

  "digit_overlap"  partial credit: the fraction of aligned characters (from the right, the sign
                   included) on which the completion's final integer answer and the reference
                   answer agree, over the longer of the two; 1 exactly for the right answer, 0
                   with no parseable answer. Near misses earn much, so it is biased upwards in a
                   way no affine map undoes (the debiasing has something to fix).
  "verifier"       the task's own `correct` reward: an unbiased world model (a control, where
                   only the noise is left to correct).

A binary world model would be useless here: on {0, 1} any map is affine, and GRPO's
standardisation cancels affine maps, so debiasing could not matter; noise keeps it continuous.
The verifier still runs on every row in this step (the library's step always verifies), but a
non-anchor row's verifier reward is only *logged* (`train/reward_correct`, `wmrl/rwm_corr`,
`wmrl/reward_mae`), never used for an advantage: `wmrl/env_rows` counts the rows whose real
reward was used, the environment calls WMRL pays for.

Modes (`config.world_model.mode`), the ablations of the paper's table:

  "wmrl"  anchors + world model, with `calibrator` = "isotonic" (Online Debiasing) or
          "identity" (no debiasing; the buffer still fills) and `ivd` = True / False (w = 1);
  "raw"   the world model everywhere, no anchors (env_rows = 0): the uncorrected world model;
  "env"   real rewards everywhere (env_rows = all rows): the GRPO baseline, through the same
          advantage formula (population std, `eps`) so that only the reward source differs.

Anchor choice (PROPOSAL: the paper names a floor of 2 groups, a cap of 24 and "about 10%"):
k = clip(⌈anchor_fraction · B⌉, min_anchors, max_anchors), at most B, groups drawn without
replacement by `numpy.random.default_rng((seed, step, ANCHOR_STREAM))`.

The calibrator (`CalibratorState`) and the IVD state (`IVDState`) are the part's checkpointed
arrays, and the anchors and noise are functions of (seed, step), so a resumed run repeats the
uninterrupted one exactly.

References:
  Yang et al., Scaling Automatic Research Agents via World Models (WMRL), arXiv 2608.12564.
  Shao et al., DeepSeekMath (GRPO), arXiv 2402.03300.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from jaxrl_post.advantages.outcome import combine_rewards
from jaxrl_post.advantages.wmrl import (
  REWARD_CALIBRATORS,
  CalibratorState,
  IVDState,
  calibrator_init,
  ivd_init,
  wmrl_step,
)
from jaxrl_post.registry import Registry
from jaxrl_post.tasks import base

WORLD_MODELS: Registry = Registry("world model")
MODES = ("wmrl", "raw", "env")
# Independent random streams of one (seed, step): which groups are anchors, the world model's
# noise. Fixed constants, so a resumed run draws the same.
ANCHOR_STREAM = 0x574D
NOISE_STREAM = 0x4E53


# ---------------------------------------------------------------------------------------------
# World models: (task, record, completion) -> score in [0, 1].
# ---------------------------------------------------------------------------------------------


@WORLD_MODELS.register("digit_overlap")
def digit_overlap(task, record: Mapping[str, Any], completion: str) -> float:
  """Partial credit for an integer answer: aligned-character agreement with the reference.

  With a = str(int(final answer)) and r = str(int(record["answer"])) (the sign is a character),
  right-aligned: score = #{j : a[-j] = r[-j]} / max(|a|, |r|); 0 when the completion has no
  parseable final answer (`tasks.base.final_answer`). The score is 1 exactly for the right
  answer; a wrong answer with the right last digits scores high (biased upwards).

  Args:
    task: unused (world models get the task for its verifier, see "verifier").
    record: a record whose `answer` is an integer.
    completion: the completion text.

  Returns:
    The score in [0, 1].

  Raises:
    ValueError: `record["answer"]` is not an integer (the world model needs an integer-answer
      task such as "arith").

  Examples:
    >>> digit_overlap(None, {"answer": "8975"}, "work\\n#### 8975")
    1.0
    >>> digit_overlap(None, {"answer": "8975"}, "#### 1975"), digit_overlap(None, {"answer": "57"},
    ...                                                                    "#### 157")
    (0.75, 0.6666666666666666)
    >>> digit_overlap(None, {"answer": "-57"}, "#### 57"), digit_overlap(None, {"answer": "5"},
    ...                                                                  "no answer")
    (0.6666666666666666, 0.0)

  References:
    Yang et al., Scaling Automatic Research Agents via World Models (WMRL), arXiv 2608.12564
    (what it stands in for: a world model's predicted score).
  """
  del task
  reference = base.parse_integer(str(record["answer"]).strip())
  if reference is None:
    raise ValueError(f"record['answer']={record['answer']!r} is not an integer: the "
                     "'digit_overlap' world model needs an integer-answer task such as 'arith'")
  given = base.parse_integer(base.final_answer(completion))
  if given is None:
    return 0.0
  a, r = str(given), str(reference)
  width = max(len(a), len(r))
  a, r = a.rjust(width, " "), r.rjust(width, " ")
  return sum(x == y != " " for x, y in zip(a, r, strict=True)) / width


@WORLD_MODELS.register("verifier")
def verifier_score(task, record: Mapping[str, Any], completion: str) -> float:
  """The task's own `correct` reward: an unbiased world model (a control; only noise is left).

  Examples:
    >>> from jaxrl_post.tasks import get_task
    >>> verifier_score(get_task("arith"), {"answer": "12"}, "#### 12")
    1.0
  """
  return float(task.reward(record, completion).correct)


def world_model_scores(name: str, task, records: Sequence[Mapping[str, Any]],
                       texts: Sequence[str], group_size: int, *, noise_std: float = 0.0,
                       seed: int = 0, step: int = 0) -> tuple[np.ndarray, int]:
  """r_wm of every row: the world model `name`'s score plus noise, clipped to [0, 1].

  r_wm[i] = clip(s(records[i // group_size], texts[i]) + σ·ε_i, 0, 1),  ε ~ N(0, 1) from
  `default_rng((seed, step, NOISE_STREAM))`, one draw per row whether or not it is scored. A
  scorer that raises on a row gives NaN there (ungraded, as the verifiers' failures).

  Args:
    name: a `WORLD_MODELS` entry.
    task: the task (for "verifier").
    records: `[B]` records; rows are record-major, `group_size` per record.
    texts: `[B·G]` completion texts.
    group_size: G.
    noise_std: σ ≥ 0.
    seed, step: the noise stream.

  Returns:
    `(r_wm float32 [B·G] (NaN = ungraded), failures)`.

  Examples:
    >>> r, fails = world_model_scores("digit_overlap", None, [{"answer": "12"}],
    ...                               ["#### 12", "#### 13"], 2)
    >>> r.tolist(), fails
    ([1.0, 0.5], 0)
  """
  scorer = WORLD_MODELS.get(name)
  if len(texts) != len(records) * group_size:
    raise ValueError(f"texts has {len(texts)} rows; expected len(records) × group_size = "
                     f"{len(records) * group_size}")
  scores = np.full(len(texts), np.nan, np.float32)
  failures = 0
  for i, text in enumerate(texts):
    try:
      scores[i] = scorer(task, records[i // group_size], text)
    except Exception:  # noqa: BLE001 - a world-model failure costs one reward, not the run
      failures += 1
  if noise_std > 0:
    noise = np.random.default_rng((seed, step, NOISE_STREAM)).normal(size=len(texts))
    scores = np.clip(scores + np.float32(noise_std) * noise.astype(np.float32), 0.0, 1.0)
  return scores.astype(np.float32), failures


def num_anchors(num_groups: int, *, fraction: float, min_anchors: int, max_anchors: int) -> int:
  """k = min(B, clip(⌈fraction·B⌉, min_anchors, max_anchors)) anchor groups of B (PROPOSAL).

  Examples:
    >>> num_anchors(8, fraction=0.1, min_anchors=2, max_anchors=24)  # ⌈0.8⌉ = 1, floor 2
    2
    >>> num_anchors(300, fraction=0.1, min_anchors=2, max_anchors=24)  # capped
    24
  """
  # The tolerance keeps 0.1 × 30 = 3.0000000000000004 at 3.
  k = math.ceil(fraction * num_groups - 1e-9)
  return min(num_groups, max(min_anchors, min(k, max_anchors)))


def choose_anchors(num_groups: int, k: int, *, seed: int, step: int) -> np.ndarray:
  """`bool [B]`, True for the k groups drawn without replacement from (seed, step).

  Examples:
    >>> a = choose_anchors(8, 2, seed=0, step=3)
    >>> int(a.sum()), bool((a == choose_anchors(8, 2, seed=0, step=3)).all())
    (2, True)
  """
  if not 0 <= k <= num_groups:
    raise ValueError(f"k={k} anchor groups; expected 0 <= k <= num_groups={num_groups}")
  chosen = np.random.default_rng((seed, step, ANCHOR_STREAM)).choice(num_groups, k,
                                                                       replace=False)
  anchors = np.zeros(num_groups, bool)
  anchors[chosen] = True
  return anchors


def true_rewards(verified, reward_names: Sequence[str], reward_weights) -> np.ndarray:
  """The scalar reward of each row that the step's GRPO standardises: Σ_k w_k·reward_k over
  `config.reward_weights` (NaN-skipping, `combine_rewards`), NaN where the verifier failed."""
  if getattr(verified, "rewards", None) is not None:  # the step's reward matrix, all columns
    rewards = np.asarray(verified.rewards, np.float32)
  else:
    columns = {"correct": verified.correct, "format": verified.format}
    rewards = np.stack([np.asarray(columns[k], np.float32) for k in reward_names], axis=1)
  return np.asarray(combine_rewards(jnp.asarray(rewards), jnp.asarray(reward_weights)).reward)


def _nan_mean(x: np.ndarray) -> float:
  x = np.asarray(x, np.float64)
  x = x[np.isfinite(x)]
  return float(x.mean()) if x.size else float("nan")


def _correlation(x: np.ndarray, y: np.ndarray) -> float:
  """Pearson correlation over the rows where both are finite; NaN when either is constant."""
  keep = np.isfinite(x) & np.isfinite(y)
  x, y = np.asarray(x, np.float64)[keep], np.asarray(y, np.float64)[keep]
  if x.size < 2:
    return float("nan")
  x, y = x - x.mean(), y - y.mean()
  denominator = math.sqrt(float((x * x).sum() * (y * y).sum()))
  return float((x * y).sum() / denominator) if denominator > 1e-12 else float("nan")


# ---------------------------------------------------------------------------------------------
# The part.
# ---------------------------------------------------------------------------------------------


class WorldModelRewards:
  """WMRL's rewards and advantages for a GRPO-family step; see the module docstring."""

  def __init__(self, config, task):
    knobs = config.world_model
    if knobs.name not in WORLD_MODELS:
      raise ValueError(f"config.world_model.name={knobs.name!r}; valid: none, "
                       f"{', '.join(WORLD_MODELS.names())}")
    if knobs.mode not in MODES:
      raise ValueError(f"config.world_model.mode={knobs.mode!r}; valid: {', '.join(MODES)}")
    if knobs.calibrator not in REWARD_CALIBRATORS:
      raise ValueError(f"config.world_model.calibrator={knobs.calibrator!r}; valid: "
                       f"{', '.join(REWARD_CALIBRATORS.names())}")
    if not isinstance(knobs.ivd, bool):
      raise ValueError(f"config.world_model.ivd must be True or False, got {knobs.ivd!r}")
    if not 0.0 <= knobs.anchor_fraction <= 1.0:
      raise ValueError(f"config.world_model.anchor_fraction must be in [0, 1], got "
                       f"{knobs.anchor_fraction}")
    for key, low in (("min_anchors", 0), ("max_anchors", 0), ("capacity", 1), ("bins", 2),
                     ("min_pairs", 1), ("refit_every", 1), ("warmup", 1)):
      if knobs[key] < low:
        raise ValueError(f"config.world_model.{key} must be >= {low}, got {knobs[key]}")
    if knobs.max_anchors < knobs.min_anchors:
      raise ValueError(f"config.world_model.max_anchors ({knobs.max_anchors}) must be >= "
                       f"config.world_model.min_anchors ({knobs.min_anchors})")
    if knobs.min_pairs > knobs.capacity:
      raise ValueError(f"config.world_model.min_pairs ({knobs.min_pairs}) exceeds "
                       f"config.world_model.capacity ({knobs.capacity}): f̂ would never fit")
    for key, low in (("noise_std", 0.0), ("eps", 0.0)):
      if not knobs[key] >= low:
        raise ValueError(f"config.world_model.{key} must be >= {low}, got {knobs[key]}")
    if not knobs.half_life > 0:
      raise ValueError(f"config.world_model.half_life must be > 0, got {knobs.half_life}")
    for key in ("target", "w_max"):
      if not knobs[key] >= 1.0:
        raise ValueError(f"config.world_model.{key} must be >= 1 (a weight), got {knobs[key]}")
    self.num_groups, self.group_size = config.prompts_per_step, config.group_size
    if knobs.mode == "wmrl":
      self.k = num_anchors(self.num_groups, fraction=knobs.anchor_fraction,
                           min_anchors=knobs.min_anchors, max_anchors=knobs.max_anchors)
    else:
      self.k = self.num_groups if knobs.mode == "env" else 0
    if knobs.mode == "wmrl" and not 0 < self.k < self.num_groups:
      raise ValueError(
        f"config.world_model.anchor_fraction / min_anchors / max_anchors give {self.k} anchor "
        f"groups of config.prompts_per_step={self.num_groups} in mode 'wmrl'; it needs some "
        "anchor and some world-model groups (mode 'raw' has none, 'env' all)")
    # The world model must be able to score this task: try it on a demonstration, whose score
    # must be defined (a non-integer task fails here, not at the first step).
    example = task.make_example("train", 0)
    WORLD_MODELS.get(knobs.name)(task, example, example["demonstration"])
    self.knobs, self.seed = knobs, config.seed
    self.calibrator = calibrator_init(capacity=knobs.capacity, bins=knobs.bins)
    self.ivd = ivd_init()

  def anchors(self, step: int) -> np.ndarray:
    """`bool [B]`: the step's anchor groups (all in mode "env", none in "raw")."""
    return choose_anchors(self.num_groups, self.k, seed=self.seed, step=step)

  def score(self, is_anchor: np.ndarray, r_wm: np.ndarray, r_true: np.ndarray):
    """One WMRL step on host arrays `[B·G]`: `(advantages [B·G], wmrl_step's output)`.

    Only the anchor rows of `r_true` reach the advantages (the rest are set to NaN first).
    """
    knobs, g = self.knobs, self.group_size
    b = len(is_anchor)
    if r_wm.shape != (b * g,) or r_true.shape != (b * g,):
      raise ValueError(f"r_wm / r_true have shapes {r_wm.shape} / {r_true.shape}; expected "
                       f"({b * g},) (num_groups × group_size rows)")
    r_env = np.where(np.repeat(is_anchor, g), r_true, np.nan).astype(np.float32)
    # IVD fuses two streams; without it (or with one stream, "env") the anchor weight is 1,
    # which `ivd_weight`'s clip to [1, w_max = 1] gives exactly.
    w_max = knobs.w_max if knobs.ivd and knobs.mode == "wmrl" else 1.0
    out = wmrl_step(
      self.calibrator, self.ivd, jnp.asarray(r_wm.reshape(b, g)), jnp.asarray(r_env.reshape(b, g)),
      jnp.asarray(is_anchor), calibrator=knobs.calibrator, min_pairs=knobs.min_pairs,
      refit_every=knobs.refit_every, half_life=float(knobs.half_life), warmup=knobs.warmup,
      target=float(knobs.target), w_max=float(w_max), eps=float(knobs.eps))
    self.calibrator, self.ivd = out.calibrator, out.ivd
    return np.asarray(out.advantages).reshape(-1), out

  def rewards(self, method, ctx):
    """The `step_parts` hook: the step's advantages from WMRL's rewards, and its metrics."""
    tic = time.perf_counter()
    g = self.group_size
    if len(ctx.records) != self.num_groups:
      raise ValueError(f"the step has {len(ctx.records)} groups; config.prompts_per_step is "
                       f"{self.num_groups}")
    texts = method.sampler.decode_text(ctx.rollout)
    r_wm, failures = world_model_scores(
      self.knobs.name, method.task, ctx.records, texts, g, noise_std=self.knobs.noise_std,
      seed=self.seed, step=ctx.step)
    r_true = true_rewards(ctx.verified, method.objective.reward_names,
                          method.objective.reward_weights)
    is_anchor = self.anchors(ctx.step)
    adv, out = self.score(is_anchor, r_wm, r_true)
    used = np.asarray(out.metrics.rewards).reshape(-1)
    world = ~np.repeat(is_anchor, g)
    metrics = {
      "wmrl/env_rows": float(is_anchor.sum() * g),
      "wmrl/ivd_weight": float(out.metrics.weight),
      "wmrl/calibrator_fitted": float(out.metrics.fitted),
      "wmrl/pairs": float(out.metrics.num_pairs),
      "wmrl/disagreement": _nan_mean(np.asarray(out.metrics.disagreement)),
      "wmrl/rwm_corr": _correlation(r_wm, r_true),
      # How far the rewards the world-model groups were trained on are from the truth.
      "wmrl/reward_mae": _nan_mean(np.abs(used - r_true)[world]) if world.any() else 0.0,
      "wmrl/wm_failures": float(failures),
      "time/world_model": time.perf_counter() - tic,
    }
    return ctx.verified._replace(adv=jnp.asarray(adv, jnp.float32)), metrics

  def array_state(self) -> dict[str, Any]:
    return {"calibrator": {k: np.asarray(v) for k, v in self.calibrator._asdict().items()},
            "ivd": {k: np.asarray(v) for k, v in self.ivd._asdict().items()}}

  def load_array_state(self, arrays: Mapping[str, Any]) -> None:
    self.calibrator = CalibratorState(**{k: jnp.asarray(arrays["calibrator"][k])
                                         for k in CalibratorState._fields})
    self.ivd = IVDState(**{k: jnp.asarray(arrays["ivd"][k]) for k in IVDState._fields})


def build_world_model(config, task):
  """The configured WMRL part (`config.world_model.name`), or None ("none")."""
  knobs = config.get("world_model")
  if knobs is None or knobs.name == "none":
    return None
  return WorldModelRewards(config, task)
