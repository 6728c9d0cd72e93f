"""Rubric rewards as arrays: DRACO's verdict counts and step citations, CARE's weighted score.

An LLM judge grades each rollout against a list of criteria; this module holds the array side of
that (the judge calls are host-side, in the method). Verdicts are int codes `[B, G, K]`
(prompts × group × padded criteria): `PASS`, `FAIL`, `NOT_APPLICABLE`, and `MISSING` for
padding where a prompt has fewer than K criteria.

DRACO (arXiv 2609.04094) builds a shared rubric per group, then keeps only the
discriminative criteria — those some rollout of the group FAILs (`discriminative_dropout`) — and
rewards R_i = (p_i − f_i)/(p_i + f_i) over the applicable kept criteria (`rubric_counts`,
`draco_reward`). Each verdict also cites the steps it rests on; `step_verdict_counts` turns the
citations into the per-step PASS/FAIL counts of `advantages.draco.draco_step_advantages`.
Steps are 0-based here (the paper numbers them 1..S_i).

CARE (arXiv 2609.00892) scores a response by the weighted fraction of criteria it passes,
s = Σ_c w_c pass_c / Σ_c w_c (`weighted_rubric_score`), contrasts the group's best rollout
(`best_rollout`) with a frontier anchor response, and decides whether the rubric needs repair or
sharpening (`care_decision`); the evolved list is deduplicated and capped on the host
(`cap_rubrics`).

`RUBRIC_REWARDS` names the rubric rewards: "draco" (`draco_reward(n_pass, n_fail)`) and
"weighted_pass" (`weighted_rubric_score(passed, weights, criterion_mask)`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_post.registry import Registry

RUBRIC_REWARDS: Registry = Registry("rubric reward")

# Verdict codes of a (rollout, criterion) pair.
PASS = 1
FAIL = -1
NOT_APPLICABLE = 0
MISSING = -2  # padding: the prompt has fewer than K criteria.

# CARE's per-prompt decision after contrasting the best rollout with the anchor.
NONE = 0  # the best rollout beats (or ties) the anchor in the pair judge: rubric is fine.
ADAPTIVE = 1  # scores ≥ the anchor's yet loses to it: the rubric is hacked, repair it.
CHASE = 2  # loses to the anchor and scores below it: sharpen the rubric towards the anchor.


def _shape_error(name: str, x, expected, what: str) -> ValueError:
  return ValueError(f"{name} has shape {tuple(np.shape(x))}; expected {tuple(expected)} ({what})")


def _check_verdicts(verdicts) -> jax.Array:
  verdicts = jnp.asarray(verdicts)
  if verdicts.ndim != 3:
    raise ValueError(f"verdicts must be [B, G, K] (prompts × group × criteria), got shape "
                     f"{tuple(verdicts.shape)}")
  if not jnp.issubdtype(verdicts.dtype, jnp.integer):
    raise ValueError(f"verdicts must be integer codes (PASS/FAIL/NOT_APPLICABLE/MISSING), got "
                     f"{verdicts.dtype}")
  return verdicts


def _check_criteria_mask(name: str, mask, batch: int, num_criteria: int) -> jax.Array:
  mask = jnp.asarray(mask)
  if mask.shape != (batch, num_criteria):
    raise _shape_error(name, mask, (batch, num_criteria), "one flag per prompt and criterion")
  return mask > 0


# ---------------------------------------------------------------------------------------------
# DRACO: discriminative dropout, counts, reward (arXiv 2609.04094).
# ---------------------------------------------------------------------------------------------


@jax.jit
def discriminative_dropout(verdicts: jax.Array, criterion_mask: jax.Array) -> jax.Array:
  """DRACO's discriminative dropout: keep a criterion only if some rollout of the group FAILs it.

  kept[b, c] = mask[b, c] ∧ ∃ g: verdicts[b, g, c] = FAIL

  A criterion every rollout passes (or finds not applicable) cannot tell the rollouts apart; it
  only shifts all rewards together, so it is dropped before the reward is computed. Score all
  criteria first, then drop, then count (`rubric_counts`).

  Args:
    verdicts: `[B, G, K]` int verdict codes.
    criterion_mask: `[B, K]` real criteria of each prompt's rubric (0 on padding).

  Returns:
    `[B, K]` bool surviving criteria.

  Examples:
    >>> import jax.numpy as jnp
    >>> v = jnp.array([[[PASS, FAIL, PASS], [PASS, PASS, NOT_APPLICABLE]]])  # B=1, G=2, K=3
    >>> discriminative_dropout(v, jnp.ones((1, 3))).tolist()
    [[False, True, False]]

  References:
    Gandhi, Goyal, Kate, Rizk, DRACO: Fine-Grained Credit Assignment with Dynamic Rubrics for
    Long-Horizon Agent Training, arXiv 2609.04094.
  """
  verdicts = _check_verdicts(verdicts)
  mask = _check_criteria_mask("criterion_mask", criterion_mask, verdicts.shape[0],
                              verdicts.shape[2])
  return mask & jnp.any(verdicts == FAIL, axis=1)


class RubricCounts(NamedTuple):
  """Applicable kept criteria each rollout passes / fails."""

  n_pass: jax.Array  # [B, G] int32 p_i.
  n_fail: jax.Array  # [B, G] int32 f_i.


@jax.jit
def rubric_counts(verdicts: jax.Array, kept: jax.Array) -> RubricCounts:
  """PASS and FAIL counts per rollout over the kept criteria.

  p_i = Σ_c kept_c·1[v_ic = PASS],  f_i = Σ_c kept_c·1[v_ic = FAIL]
  (NOT_APPLICABLE and MISSING count in neither.)

  Args:
    verdicts: `[B, G, K]` int verdict codes.
    kept: `[B, K]` criteria that count (e.g. `discriminative_dropout`'s output).

  Returns:
    `RubricCounts(n_pass [B, G], n_fail [B, G])`, int32.

  Examples:
    >>> import jax.numpy as jnp
    >>> v = jnp.array([[[PASS, FAIL, NOT_APPLICABLE], [FAIL, FAIL, PASS]]])
    >>> out = rubric_counts(v, jnp.array([[True, True, True]]))
    >>> out.n_pass.tolist(), out.n_fail.tolist()
    ([[1, 1]], [[1, 2]])

  References:
    Gandhi, Goyal, Kate, Rizk, DRACO, arXiv 2609.04094.
  """
  verdicts = _check_verdicts(verdicts)
  kept = _check_criteria_mask("kept", kept, verdicts.shape[0], verdicts.shape[2])[:, None, :]
  n_pass = jnp.sum(kept & (verdicts == PASS), axis=-1, dtype=jnp.int32)
  n_fail = jnp.sum(kept & (verdicts == FAIL), axis=-1, dtype=jnp.int32)
  return RubricCounts(n_pass, n_fail)


@RUBRIC_REWARDS.register("draco")
@jax.jit
def draco_reward(n_pass: jax.Array, n_fail: jax.Array) -> jax.Array:
  """DRACO's trajectory reward from the pass / fail counts.

  R_i = (p_i − f_i) / (p_i + f_i),  R_i = 0 when p_i + f_i = 0.  R_i ∈ [−1, 1].

  Args:
    n_pass: `[B, G]` applicable kept criteria passed (`rubric_counts`).
    n_fail: `[B, G]` applicable kept criteria failed.

  Returns:
    `[B, G]` float32 rewards (GRPO-normalise them per group for A_i).

  Examples:
    >>> import jax.numpy as jnp
    >>> draco_reward(jnp.array([[3, 0, 1]]), jnp.array([[1, 0, 3]])).tolist()
    [[0.5, 0.0, -0.5]]

  References:
    Gandhi, Goyal, Kate, Rizk, DRACO, arXiv 2609.04094.
  """
  n_pass = jnp.asarray(n_pass, jnp.float32)
  n_fail = jnp.asarray(n_fail, jnp.float32)
  if n_pass.shape != n_fail.shape:
    raise _shape_error("n_fail", n_fail, n_pass.shape, "n_pass's")
  total = n_pass + n_fail
  return jnp.where(total > 0, (n_pass - n_fail) / jnp.where(total > 0, total, 1.0), 0.0)


@jax.jit
def draco_rubric_reward(verdicts: jax.Array, criterion_mask: jax.Array) -> jax.Array:
  """DRACO's whole reward path: dropout, counts over the kept criteria, (p − f)/(p + f).

  Args:
    verdicts: `[B, G, K]` int verdict codes.
    criterion_mask: `[B, K]` real criteria.

  Returns:
    `[B, G]` float32 rewards.

  References:
    Gandhi, Goyal, Kate, Rizk, DRACO, arXiv 2609.04094.
  """
  kept = discriminative_dropout(verdicts, criterion_mask)
  return draco_reward(*rubric_counts(verdicts, kept))


# ---------------------------------------------------------------------------------------------
# DRACO: step citations → per-step verdict counts.
# ---------------------------------------------------------------------------------------------


class StepVerdictCounts(NamedTuple):
  """Kept PASS / FAIL verdicts whose citations include each step."""

  step_pass: jax.Array  # [B, G, S] int32 p_j.
  step_fail: jax.Array  # [B, G, S] int32 f_j.


def _check_step_inputs(verdicts, citations, kept, num_steps):
  verdicts = _check_verdicts(verdicts)
  b, g, k = verdicts.shape
  citations = jnp.asarray(citations)
  if citations.ndim != 4 or citations.shape[:3] != (b, g, k):
    raise _shape_error("citations", citations, (b, g, k, "S"),
                       "verdicts' [B, G, K] plus a step axis")
  kept = _check_criteria_mask("kept", kept, b, k)
  num_steps = jnp.asarray(num_steps)
  if num_steps.shape != (b, g):
    raise _shape_error("num_steps", num_steps, (b, g), "steps of each rollout")
  return verdicts, citations > 0, kept, num_steps


def check_citations(citations, num_steps) -> None:
  """Host check that every cited step exists in its rollout: step < num_steps[b, g].

  Needs concrete arrays (call it outside `jit`; `step_verdict_counts` does so for you).

  Args:
    citations: `[B, G, K, S]` bool, citations[b, g, c, j] = verdict (g, c) cites step j.
    num_steps: `[B, G]` int number of steps S_i of each rollout, 0 ≤ S_i ≤ S.

  Raises:
    ValueError: `num_steps` is out of `[0, S]` (names num_steps), or a citation points at a step
      ≥ the rollout's number of steps (names citations and the first offending index).
  """
  citations = np.asarray(citations) > 0
  num_steps = np.asarray(num_steps)
  if citations.ndim != 4 or num_steps.shape != citations.shape[:2]:
    raise ValueError(f"citations has shape {citations.shape} and num_steps {num_steps.shape}; "
                     f"expected [B, G, K, S] and [B, G]")
  max_steps = citations.shape[-1]
  if (num_steps < 0).any() or (num_steps > max_steps).any():
    raise ValueError(f"num_steps must lie in [0, {max_steps}] (the padded step axis of "
                     f"citations), got values in [{num_steps.min()}, {num_steps.max()}]")
  beyond = citations & (np.arange(max_steps) >= num_steps[:, :, None, None])
  if beyond.any():
    b, g, c, j = (int(i) for i in np.argwhere(beyond)[0])
    raise ValueError(f"citations cite step {j} of rollout (b={b}, g={g}) for criterion {c}, "
                     f"but that rollout has only {int(num_steps[b, g])} steps (0-based steps "
                     f"< num_steps); {int(beyond.sum())} out-of-range citation(s) in all")


@jax.jit
def _step_verdict_counts(verdicts, citations, kept, num_steps) -> StepVerdictCounts:
  verdicts, citations, kept, num_steps = _check_step_inputs(verdicts, citations, kept, num_steps)
  in_range = jnp.arange(citations.shape[-1]) < num_steps[..., None, None]
  cites = citations & in_range  # inside jit: out-of-range citations are dropped, not counted.
  counted = kept[:, None, :, None] & cites
  step_pass = jnp.sum(counted & (verdicts == PASS)[..., None], axis=2, dtype=jnp.int32)
  step_fail = jnp.sum(counted & (verdicts == FAIL)[..., None], axis=2, dtype=jnp.int32)
  return StepVerdictCounts(step_pass, step_fail)


def step_verdict_counts(
    verdicts: jax.Array, citations: jax.Array, kept: jax.Array, num_steps: jax.Array
) -> StepVerdictCounts:
  """Per-step PASS / FAIL counts: kept verdicts whose citations include the step.

  p_j = Σ_c kept_c·1[v_c = PASS]·1[c cites j],  f_j likewise with FAIL   (per rollout)

  NOT_APPLICABLE verdicts and dropped criteria cite nothing. With concrete inputs the citations
  are first checked on the host (`check_citations`): a step ≥ the rollout's `num_steps` raises.
  Called on tracers (inside a caller's `jit`) the check cannot run; out-of-range citations are
  then silently ignored, so run `check_citations` (or `citations_from_lists`) on the host first.

  Args:
    verdicts: `[B, G, K]` int verdict codes.
    citations: `[B, G, K, S]` bool, the steps (0-based) each verdict cites.
    kept: `[B, K]` criteria that count (`discriminative_dropout`).
    num_steps: `[B, G]` int number of steps of each rollout (≤ S).

  Returns:
    `StepVerdictCounts(step_pass, step_fail)`, each `[B, G, S]` int32.

  Raises:
    ValueError: a citation of a step outside its rollout (names citations), `num_steps` outside
      `[0, S]`, or shapes that do not line up (names the argument).

  Examples:
    >>> import jax.numpy as jnp
    >>> v = jnp.array([[[PASS, FAIL]]])                          # one rollout, two criteria
    >>> cites = jnp.array([[[[1, 1, 0], [0, 1, 0]]]], bool)      # 3 padded steps
    >>> out = step_verdict_counts(v, cites, jnp.ones((1, 2)), jnp.array([[2]]))
    >>> out.step_pass.tolist(), out.step_fail.tolist()
    ([[[1, 1, 0]]], [[[0, 1, 0]]])

  References:
    Gandhi, Goyal, Kate, Rizk, DRACO, arXiv 2609.04094.
  """
  concrete = not any(isinstance(x, jax.core.Tracer) for x in (citations, num_steps))
  if concrete:
    _check_step_inputs(verdicts, citations, kept, num_steps)  # shape errors before values
    check_citations(citations, num_steps)
  return _step_verdict_counts(verdicts, citations, kept, num_steps)


def citations_from_lists(
    lists: Sequence[Sequence[Sequence[Sequence[int]]]],
    num_steps,
    max_steps: int,
    *,
    num_criteria: int | None = None,
) -> np.ndarray:
  """Host helper: the judge's `relevant_steps` lists → a padded `[B, G, K, S]` bool array.

  `lists[b][g][c]` holds the 0-based steps that verdict (rollout g of prompt b, criterion c)
  cites. Prompts may have different numbers of criteria; the criterion axis is padded to
  `num_criteria` (default: the longest) with no citations.

  Args:
    lists: nested `[B][G][K_b]` sequences of step indices.
    num_steps: `[B, G]` int number of steps of each rollout.
    max_steps: padded step axis S (≥ every num_steps).
    num_criteria: padded criterion axis K (default the largest K_b).

  Returns:
    `[B, G, K, S]` bool numpy array.

  Raises:
    ValueError: a cited step < 0 or ≥ the rollout's num_steps (names citations), num_steps above
      max_steps, max_steps < 1, or lists whose [B][G] layout does not match num_steps.

  Examples:
    >>> citations_from_lists([[[[0, 1], []]]], [[2]], 3).astype(int).tolist()
    [[[[1, 1, 0], [0, 0, 0]]]]

  References:
    Gandhi, Goyal, Kate, Rizk, DRACO, arXiv 2609.04094.
  """
  num_steps = np.asarray(num_steps)
  if num_steps.ndim != 2:
    raise ValueError(f"num_steps must be [B, G], got shape {num_steps.shape}")
  if max_steps < 1:
    raise ValueError(f"max_steps must be ≥ 1, got {max_steps}")
  if (num_steps > max_steps).any() or (num_steps < 0).any():
    raise ValueError(f"num_steps must lie in [0, max_steps={max_steps}], got values in "
                     f"[{num_steps.min()}, {num_steps.max()}]")
  b_size, g_size = num_steps.shape
  if len(lists) != b_size or any(len(row) != g_size for row in lists):
    raise ValueError(f"lists must be nested [B={b_size}][G={g_size}][K] (num_steps' shape), got "
                     f"{len(lists)} prompts with group sizes {[len(row) for row in lists]}")
  longest = max((len(rollout) for row in lists for rollout in row), default=0)
  k_size = longest if num_criteria is None else num_criteria
  if k_size < longest:
    raise ValueError(f"num_criteria={num_criteria} is below the {longest} criteria in lists")
  out = np.zeros((b_size, g_size, k_size, max_steps), bool)
  for b, row in enumerate(lists):
    for g, rollout in enumerate(row):
      for c, steps in enumerate(rollout):
        for j in steps:
          j = int(j)
          if not 0 <= j < num_steps[b, g]:
            raise ValueError(f"citations: criterion {c} of rollout (b={b}, g={g}) cites step "
                             f"{j}, outside the rollout's steps [0, {int(num_steps[b, g])})")
          out[b, g, c, j] = True
  return out


# ---------------------------------------------------------------------------------------------
# CARE: weighted pass score, best rollout, anchor decision, capped rubric (arXiv 2609.00892).
# ---------------------------------------------------------------------------------------------


@RUBRIC_REWARDS.register("weighted_pass")
@jax.jit
def weighted_rubric_score(passed: jax.Array, weights: jax.Array,
                          criterion_mask: jax.Array) -> jax.Array:
  """CARE's rubric score: the weighted fraction of the prompt's criteria a response passes.

  s_i = Σ_c m_c w_c pass_ic / Σ_c m_c w_c,   s_i = 0 when Σ_c m_c w_c = 0.

  Args:
    passed: `[B, G, K]` bool (or 0/1) criterion c passed by rollout i.
    weights: `[B, K]` non-negative criterion weights w_c.
    criterion_mask: `[B, K]` real criteria m_c (0 on padding).

  Returns:
    `[B, G]` float32 scores in [0, 1].

  Examples:
    >>> import jax.numpy as jnp
    >>> passed = jnp.array([[[1, 0, 1], [0, 1, 1]]], bool)
    >>> weighted_rubric_score(passed, jnp.array([[3., 1., 5.]]), jnp.array([[1, 1, 0]])).tolist()
    [[0.75, 0.25]]

  References:
    Li et al., CARE: Contrastive Anchor-based Rubric Evolution for Large Language Model
    Post-Training, arXiv 2609.00892.
  """
  passed = jnp.asarray(passed)
  if passed.ndim != 3:
    raise ValueError(f"passed must be [B, G, K], got shape {tuple(passed.shape)}")
  b, _, k = passed.shape
  weights = jnp.asarray(weights, jnp.float32)
  if weights.shape != (b, k):
    raise _shape_error("weights", weights, (b, k), "one weight per prompt and criterion")
  mask = _check_criteria_mask("criterion_mask", criterion_mask, b, k)
  w = jnp.where(mask, weights, 0.0)
  total = jnp.sum(w, axis=-1, keepdims=True)
  got = jnp.sum(jnp.where(passed > 0, w[:, None, :], 0.0), axis=-1)
  return jnp.where(total > 0, got / jnp.where(total > 0, total, 1.0), 0.0)


@jax.jit
def best_rollout(scores: jax.Array, valid: jax.Array | None = None) -> jax.Array:
  """Index of each group's highest-scoring valid rollout (CARE's y* = argmax_i s_i).

  Ties go to the lowest index; a group with no valid rollout gets −1.

  Args:
    scores: `[B, G]` rollout scores.
    valid: optional `[B, G]` bool rollouts that may be chosen (default all).

  Returns:
    `[B]` int32 index in `[0, G)`, or −1.

  Examples:
    >>> import jax.numpy as jnp
    >>> best_rollout(jnp.array([[0.2, 0.9, 0.9], [0.5, 0.1, 0.0]]),
    ...              jnp.array([[True, True, True], [False, False, False]])).tolist()
    [1, -1]

  References:
    Li et al., CARE, arXiv 2609.00892.
  """
  scores = jnp.asarray(scores, jnp.float32)
  if scores.ndim != 2:
    raise ValueError(f"scores must be [B, G], got shape {tuple(scores.shape)}")
  valid = jnp.ones(scores.shape, bool) if valid is None else jnp.asarray(valid)
  if valid.shape != scores.shape:
    raise _shape_error("valid", valid, scores.shape, "scores'")
  valid = valid > 0
  idx = jnp.argmax(jnp.where(valid, scores, -jnp.inf), axis=-1).astype(jnp.int32)
  return jnp.where(jnp.any(valid, axis=-1), idx, -1)


@jax.jit
def care_decision(top_score: jax.Array, anchor_score: jax.Array,
                  prefers_anchor: jax.Array) -> jax.Array:
  """CARE's branch after contrasting the best rollout y* with the anchor response.

  ADAPTIVE if prefers_anchor ∧ s* ≥ s_anchor   (rubric rewards a worse response: hacked)
  CHASE    if prefers_anchor ∧ s* < s_anchor   (anchor still ahead: sharpen the rubric)
  NONE     otherwise                           (y* wins the pair judgement)

  The paper names the two branches; the exact conditions are our reconstruction (PROPOSAL).

  Args:
    top_score: `[B]` rubric score s* of each prompt's best rollout.
    anchor_score: `[B]` rubric score of the anchor response under the same rubric.
    prefers_anchor: `[B]` bool, the pair judge prefers the anchor over y*.

  Returns:
    `[B]` int32 codes `NONE`, `ADAPTIVE` or `CHASE`.

  Examples:
    >>> import jax.numpy as jnp
    >>> care_decision(jnp.array([0.9, 0.4, 0.9]), jnp.array([0.8, 0.8, 0.5]),
    ...               jnp.array([True, True, False])).tolist() == [ADAPTIVE, CHASE, NONE]
    True

  References:
    Li et al., CARE, arXiv 2609.00892.
  """
  top = jnp.asarray(top_score, jnp.float32)
  anchor = jnp.asarray(anchor_score, jnp.float32)
  prefers = jnp.asarray(prefers_anchor)
  if anchor.shape != top.shape:
    raise _shape_error("anchor_score", anchor, top.shape, "top_score's")
  if prefers.shape != top.shape:
    raise _shape_error("prefers_anchor", prefers, top.shape, "top_score's")
  prefers = prefers > 0
  code = jnp.where(top >= anchor, ADAPTIVE, CHASE)
  return jnp.where(prefers, code, NONE).astype(jnp.int32)


class CappedRubrics(NamedTuple):
  """A deduplicated, capped rubric."""

  criteria: list[str]
  weights: list[float] | None  # aligned with criteria; None when no weights were given.


def normalize_criterion(text: str) -> str:
  """The dedup key of a criterion: lower case, single spaces, no surrounding punctuation.

  Examples:
    >>> normalize_criterion("  Cites the  SOURCE. ")
    'cites the source'
  """
  return re.sub(r"\s+", " ", text).strip().strip(".;:,!?").strip().lower()


def cap_rubrics(
    criteria: Sequence[str],
    weights: Sequence[float] | None = None,
    *,
    max_criteria: int | None = None,
    initial_count: int,
) -> CappedRubrics:
  """CARE's bound on rubric growth: dedup (normalised text), then cap the list (host side).

  `criteria[:initial_count]` are the prompt's original criteria; later entries were added by
  evolution, oldest first. Duplicates (same `normalize_criterion` key) keep their first
  occurrence and its weight. The cap keeps the originals first, then fills the remaining slots
  with the newest additions; the kept entries stay in list order.

  PROPOSAL (the paper only says growth is bounded): max_criteria = 2 × initial_count, originals
  first, then the newest.

  Args:
    criteria: the rubric after an evolution step.
    weights: optional weights aligned with `criteria`.
    max_criteria: cap K_max (default 2 × initial_count, at least 1).
    initial_count: how many leading entries are original criteria.

  Returns:
    `CappedRubrics(criteria, weights)`.

  Raises:
    ValueError: max_criteria < 1, initial_count outside `[0, len(criteria)]`, or weights of the
      wrong length (names the argument).

  Examples:
    >>> cap_rubrics(["a", "b", "c", "A.", "d", "e"], initial_count=2, max_criteria=3).criteria
    ['a', 'b', 'e']

  References:
    Li et al., CARE, arXiv 2609.00892.
  """
  criteria = list(criteria)
  if not 0 <= initial_count <= len(criteria):
    raise ValueError(f"initial_count must lie in [0, len(criteria)={len(criteria)}], got "
                     f"{initial_count}")
  if max_criteria is None:
    max_criteria = max(2 * initial_count, 1)
  if max_criteria < 1:
    raise ValueError(f"max_criteria must be ≥ 1, got {max_criteria}")
  if weights is not None:
    weights = [float(w) for w in weights]
    if len(weights) != len(criteria):
      raise ValueError(f"weights has {len(weights)} entries; expected {len(criteria)} (one per "
                       f"criterion)")
  seen = set()
  unique = []  # indices of first occurrences, in list order
  for i, text in enumerate(criteria):
    key = normalize_criterion(text)
    if key not in seen:
      seen.add(key)
      unique.append(i)
  originals = [i for i in unique if i < initial_count][:max_criteria]
  added = [i for i in unique if i >= initial_count]
  room = max_criteria - len(originals)
  keep = originals + (added[max(len(added) - room, 0):] if room > 0 else [])
  return CappedRubrics([criteria[i] for i in keep],
                       None if weights is None else [weights[i] for i in keep])
