"""CARE (arXiv 2609.00892) in a GRPO-family step: rubric rewards whose rubrics evolve per prompt.

`config.rubric.mode` = "care" (evolving rubrics) or "static" (the baseline: the initial rubric
forever); "none" turns the part off. Rubric RL rewards a rollout by the weighted fraction of its
prompt's rubric criteria it passes (`rewards.rubrics.weighted_rubric_score`), NOT by the
verifier. A static rubric gets hacked: the policy learns to satisfy the criteria without being
right (rubric reward up, true accuracy flat). CARE contrasts, per prompt and step, the group's
best rollout y* (`best_rollout`) with an *anchor* response and lets a *pair judge* say which is
actually better (`care_decision`):

  ADAPTIVE  s(y*) ≥ s(anchor) but the judge prefers the anchor: the rubric rewards a worse
            response (it is hacked) → add a criterion that closes the loophole;
  CHASE     s(y*) < s(anchor) and the judge prefers the anchor: the anchor is still ahead →
            add a *sharper* criterion that targets the gap;
  NONE      the judge prefers y*: the rubric is fine.

An added criterion is one the anchor passes and y* fails (it separates the two); the rubric is
then deduplicated and capped (`cap_rubrics`: originals first, then the newest additions).

The miniature (what stands in for what). The paper's rubrics are LLM-written checklists graded by
an LLM judge, the anchor comes from a frontier model and the pair judge is Gemini. Here:

  criteria     programmatic checks over the completion text, from a per-task *library*
               (`CRITERION_LIBRARIES`, "arith" for integer-answer tasks), ordered from loose
               (hackable: satisfiable without the right answer) to sharp (the exact answer):
                 final_line           ends with a '#### <integer>' line
                 worked_steps         a line before the final one shows a computation ('=')
                 restates_expression  the prompt's expression followed by '=' appears
                 last_digit           the final integer's last digit is the reference's
                 num_digits           the final integer has the reference's sign and length
                 exact                the final integer is the reference answer
  rubric       per pool prompt, a weighted list of library criteria; it starts as
               `config.rubric.initial` (PROPOSAL "final_line,worked_steps": format-only,
               hackable) with each criterion's library weight (PROPOSAL: 1, exact 2);
  anchor       the task's demonstration (its reference solution) stands in for the frontier
               model's anchor response;
  pair judge   the task's verifier: it prefers y* only when y* is correct and the anchor is not
               (the anchor on ties), standing in for the LLM pair judge.
  repair       ADAPTIVE adds the loosest library criterion not in the rubric that the anchor
  / sharpen    passes and y* fails (the smallest fix of the loophole); CHASE adds the loosest
               such criterion sharper (later in the library) than the rubric's sharpest, and
               falls back to the loosest such criterion at all (PROPOSAL: the paper's judge
               writes or edits criteria freely). Nothing is added when no criterion separates
               the two (e.g. both are correct).
  cap          K_max = `config.rubric.max_criteria` (0: PROPOSAL 2 × the initial size).

The step trains on the rubric rewards under the prompt's *current* rubric (the part's `rewards`
hook replaces the verifier's advantages by the objective's advantage estimator over the rubric
reward), then evolves the rubrics of the step's prompts for the next time they are drawn. The
rubric state is fixed-size arrays over the pool (`RubricState`: criterion ids and weights per
prompt, −1 / 0 on padding), checkpointed with the run, so a resumed run repeats the
uninterrupted one.

Metrics: `care/true_accuracy` (the verifier's accuracy of the rollouts, which the reward no
longer sees), `care/rubric_reward`, `care/hack_gap` (their difference; hacking shows as rubric
reward up and true accuracy flat), `care/adaptive`, `care/chase` and `care/added` (counts this
step), `care/rubric_size` (mean size over the step's prompts after evolution) and
`care/pool_rubric_size` (mean over the pool).

References:
  Li et al., CARE: Contrastive Anchor-based Rubric Evolution for Large Language Model
  Post-Training, arXiv 2609.00892.
  Shao et al., DeepSeekMath (GRPO), arXiv 2402.03300.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np

from jaxrl_post.registry import Registry
from jaxrl_post.rewards.rubrics import (
  ADAPTIVE,
  CHASE,
  best_rollout,
  cap_rubrics,
  care_decision,
  weighted_rubric_score,
)
from jaxrl_post.tasks import base

MODES = ("care", "static")
DEFAULT_INITIAL = "final_line,worked_steps"


class Criterion(NamedTuple):
  """A programmatic rubric criterion: `check(record, completion) -> bool` and its weight."""

  name: str
  check: Callable[[Mapping[str, Any], str], bool]
  weight: float


CRITERION_LIBRARIES: Registry = Registry("criterion library")


def _final_integer(completion: str) -> int | None:
  return base.parse_integer(base.final_answer(completion))


def _reference(record: Mapping[str, Any]) -> int:
  value = base.parse_integer(str(record["answer"]).strip())
  if value is None:
    raise ValueError(f"record['answer']={record['answer']!r} is not an integer: the 'arith' "
                     "criterion library needs an integer-answer task")
  return value


def _worked_steps(record, completion: str) -> bool:
  del record
  body = completion.rstrip().rpartition("\n")[0]
  return any("=" in line for line in body.split("\n"))


def _restates_expression(record, completion: str) -> bool:
  expression = base.parse_meta(record).get("expression")
  return bool(expression) and f"{expression}=" in completion


def _last_digit(record, completion: str) -> bool:
  given = _final_integer(completion)
  return given is not None and abs(given) % 10 == abs(_reference(record)) % 10


def _num_digits(record, completion: str) -> bool:
  given, reference = _final_integer(completion), _reference(record)
  return (given is not None and (given < 0) == (reference < 0)
          and len(str(abs(given))) == len(str(abs(reference))))


def _exact(record, completion: str) -> bool:
  return _final_integer(completion) == _reference(record)


@CRITERION_LIBRARIES.register("arith")
def arith_library() -> tuple[Criterion, ...]:
  """Criteria for integer-answer tasks, loose (hackable) to sharp; weights PROPOSAL.

  Examples:
    >>> record = {"answer": "145", "meta": '{"expression":"83+62"}'}
    >>> [c.name for c in arith_library() if c.check(record, "83+62=154\\n#### 155")]
    ['final_line', 'worked_steps', 'restates_expression', 'last_digit', 'num_digits']
  """
  return (
    Criterion("final_line", lambda record, text: _final_integer(text) is not None, 1.0),
    Criterion("worked_steps", _worked_steps, 1.0),
    Criterion("restates_expression", _restates_expression, 1.0),
    Criterion("last_digit", _last_digit, 1.0),
    Criterion("num_digits", _num_digits, 1.0),
    Criterion("exact", _exact, 2.0),
  )


def criterion_passes(library: Sequence[Criterion], record: Mapping[str, Any],
                     completion: str) -> np.ndarray:
  """`bool [L]`: which library criteria `completion` passes (a criterion that raises fails)."""
  out = np.zeros(len(library), bool)
  for j, criterion in enumerate(library):
    try:
      out[j] = bool(criterion.check(record, completion))
    except ValueError:
      raise
    except Exception:  # noqa: BLE001 - garbage text fails the criterion, it does not stop the run
      out[j] = False
  return out


class RubricState(NamedTuple):
  """Every pool prompt's rubric, fixed size: K_max slots of (library id, weight)."""

  ids: np.ndarray  # int32 [N, K_max], library ids in rubric order, −1 on padding
  weights: np.ndarray  # float32 [N, K_max], 0 on padding


def rubric_init(num_prompts: int, initial_ids: Sequence[int], initial_weights: Sequence[float],
                max_criteria: int) -> RubricState:
  """Every prompt starts with the same initial rubric.

  Examples:
    >>> s = rubric_init(2, [0, 1], [1.0, 1.0], 4)
    >>> s.ids.tolist()
    [[0, 1, -1, -1], [0, 1, -1, -1]]
  """
  if num_prompts < 1:
    raise ValueError(f"num_prompts must be >= 1, got {num_prompts}")
  if not 1 <= len(initial_ids) <= max_criteria:
    raise ValueError(f"the initial rubric has {len(initial_ids)} criteria; expected 1 to "
                     f"max_criteria={max_criteria}")
  ids = np.full((num_prompts, max_criteria), -1, np.int32)
  weights = np.zeros((num_prompts, max_criteria), np.float32)
  ids[:, :len(initial_ids)] = initial_ids
  weights[:, :len(initial_ids)] = initial_weights
  return RubricState(ids, weights)


def choose_criterion(decision: int, rubric_ids: Sequence[int], anchor_passes: np.ndarray,
                     best_passes: np.ndarray) -> int:
  """The library id CARE adds for one prompt, or −1 (PROPOSAL, see the module docstring).

  Candidates: not in the rubric, passed by the anchor, failed by y*. ADAPTIVE takes the loosest
  (lowest id); CHASE the loosest sharper than the rubric's sharpest (highest id), else the
  loosest; NONE adds nothing.

  Examples:
    >>> anchor = np.ones(6, bool)
    >>> best = np.array([1, 1, 0, 0, 1, 0], bool)            # y* passes ids 0, 1, 4
    >>> choose_criterion(ADAPTIVE, [0, 1], anchor, best)      # the loosest separating one
    2
    >>> choose_criterion(CHASE, [0, 3], anchor, best)         # sharper than id 3
    5
  """
  rubric = {int(i) for i in rubric_ids if i >= 0}
  candidates = [j for j in range(len(anchor_passes))
                if j not in rubric and anchor_passes[j] and not best_passes[j]]
  if decision == ADAPTIVE:
    return candidates[0] if candidates else -1
  if decision == CHASE:
    sharpest = max(rubric, default=-1)
    sharper = [j for j in candidates if j > sharpest]
    return (sharper or candidates or [-1])[0]
  return -1


def evolve_rubric(ids: np.ndarray, weights: np.ndarray, added: int, library: Sequence[Criterion],
                  *, initial_count: int, max_criteria: int) -> tuple[np.ndarray, np.ndarray]:
  """One prompt's rubric row after adding library criterion `added` (−1: unchanged), deduped
  and capped by `cap_rubrics` (originals first, then the newest additions).

  Examples:
    >>> lib = arith_library()
    >>> ids, w = evolve_rubric(np.array([0, 1, 2, 3]), np.ones(4), 5, lib, initial_count=2,
    ...                        max_criteria=4)
    >>> ids.tolist(), w.tolist()
    ([0, 1, 3, 5], [1.0, 1.0, 1.0, 2.0])
  """
  keep = ids >= 0
  current = [int(i) for i in ids[keep]]
  current_w = [float(x) for x in weights[keep]]
  if added < 0:
    return ids, weights
  names = [library[i].name for i in current] + [library[added].name]
  capped = cap_rubrics(names, current_w + [library[added].weight], initial_count=initial_count,
                       max_criteria=max_criteria)
  by_name = {c.name: j for j, c in enumerate(library)}
  new_ids = np.full_like(ids, -1)
  new_w = np.zeros_like(weights)
  new_ids[:len(capped.criteria)] = [by_name[n] for n in capped.criteria]
  new_w[:len(capped.criteria)] = capped.weights
  return new_ids, new_w


class StepOutcome(NamedTuple):
  """`RubricEvolution.score`'s result on one step's groups."""

  scores: np.ndarray  # float32 [B, G] rubric rewards
  decisions: np.ndarray  # int32 [B] NONE / ADAPTIVE / CHASE
  added: np.ndarray  # int32 [B] library id added (−1: none)
  state: RubricState  # the rubrics after evolution


class RubricEvolution:
  """CARE's rubric rewards and rubric evolution for a GRPO-family step; see the module docstring.
  """

  def __init__(self, config, task):
    knobs = config.rubric
    if knobs.mode not in MODES:
      raise ValueError(f"config.rubric.mode={knobs.mode!r}; valid: none, {', '.join(MODES)}")
    if knobs.library not in CRITERION_LIBRARIES:
      raise ValueError(f"config.rubric.library={knobs.library!r}; valid: "
                       f"{', '.join(CRITERION_LIBRARIES.names())}")
    for section, key in (("world_model", "name"), ("intervention", "mode")):
      other = config.get(section)
      if other is not None and other[key] != "none":
        raise ValueError(f"config.rubric and config.{section} both set the step's advantages; "
                         f"set config.{section}.{key} = 'none'")
    self.library = CRITERION_LIBRARIES.get(knobs.library)()
    by_name = {c.name: j for j, c in enumerate(self.library)}
    names = [n.strip() for n in str(knobs.initial).split(",") if n.strip()]
    unknown = [n for n in names if n not in by_name]
    if not names or unknown or len(set(names)) != len(names):
      raise ValueError(f"config.rubric.initial={knobs.initial!r} must name distinct criteria "
                       f"of the library; valid: {', '.join(by_name)}")
    self.initial_ids = [by_name[n] for n in names]
    self.max_criteria = knobs.max_criteria or 2 * len(names)
    if self.max_criteria < len(names):
      raise ValueError(f"config.rubric.max_criteria={knobs.max_criteria} is below the "
                       f"{len(names)} criteria of config.rubric.initial (0 = 2 × initial)")
    if config.num_train_examples < 1:
      raise ValueError("config.num_train_examples must be >= 1 (the rubric pool)")
    # Every criterion must be able to grade this task: try the library on a demonstration.
    example = task.make_example("train", 0)
    criterion_passes(self.library, example, example["demonstration"])
    self.mode, self.group_size = knobs.mode, config.group_size
    self.eps = config.advantage_eps
    self.state = rubric_init(config.num_train_examples, self.initial_ids,
                             [self.library[i].weight for i in self.initial_ids],
                             self.max_criteria)

  def passes(self, records: Sequence[Mapping[str, Any]], texts: Sequence[str]) -> np.ndarray:
    """`bool [B, G, L]`: library criteria passed by every rollout (record-major texts)."""
    g = self.group_size
    if len(texts) != len(records) * g:
      raise ValueError(f"texts has {len(texts)} rows; expected len(records) × group_size = "
                       f"{len(records) * g}")
    out = np.stack([criterion_passes(self.library, records[i // g], t)
                    for i, t in enumerate(texts)])
    return out.reshape(len(records), g, len(self.library))

  def score(self, records: Sequence[Mapping[str, Any]], texts: Sequence[str],
            correct: np.ndarray, anchor_correct: np.ndarray) -> StepOutcome:
    """Rubric rewards of the step's rollouts, then (mode "care") the evolved rubrics.

    Args:
      records: `[B]` the step's records (their `index` is the pool prompt).
      texts: `[B·G]` completions, record-major.
      correct: `[B·G]` verifier correctness of the rollouts (NaN: ungraded, counts as wrong).
      anchor_correct: `[B]` verifier correctness of each prompt's anchor.
    """
    b, g, lib = len(records), self.group_size, self.library
    pool = np.asarray([int(r["index"]) for r in records])
    if (pool < 0).any() or (pool >= len(self.state.ids)).any():
      raise ValueError(f"record index outside the rubric pool [0, {len(self.state.ids)})")
    passes = self.passes(records, texts)  # [B, G, L]
    ids, weights = self.state.ids[pool], self.state.weights[pool]  # [B, K]
    mask = ids >= 0
    gather = np.where(mask, ids, 0)
    rows = np.take_along_axis(passes, np.broadcast_to(gather[:, None, :], (b, g, ids.shape[1])),
                              axis=2)
    scores = np.asarray(weighted_rubric_score(jnp.asarray(rows), jnp.asarray(weights),
                                              jnp.asarray(mask)))
    anchors = np.stack([criterion_passes(lib, r, r["demonstration"]) for r in records])
    anchor_rows = np.take_along_axis(anchors, gather, axis=1)[:, None, :]
    anchor_scores = np.asarray(weighted_rubric_score(jnp.asarray(anchor_rows),
                                                     jnp.asarray(weights),
                                                     jnp.asarray(mask)))[:, 0]
    best = np.asarray(best_rollout(jnp.asarray(scores)))  # a group always has G ≥ 1 rollouts
    top = scores[np.arange(b), best]
    best_correct = np.nan_to_num(np.asarray(correct, np.float32).reshape(b, g)
                                 [np.arange(b), best]) > 0.5
    # The pair judge: y* wins only when it is right and the anchor is not; anchor on ties.
    prefers_anchor = ~(best_correct & ~(np.asarray(anchor_correct) > 0.5))
    decisions = np.asarray(care_decision(jnp.asarray(top), jnp.asarray(anchor_scores),
                                         jnp.asarray(prefers_anchor)))
    # The baseline ("static") logs the decisions too: how often CARE would have acted.
    added = np.full(b, -1, np.int32)
    new_ids, new_w = self.state.ids.copy(), self.state.weights.copy()
    if self.mode == "care":
      for i, p in enumerate(pool):
        added[i] = choose_criterion(int(decisions[i]), new_ids[p], anchors[i],
                                    passes[i, best[i]])
        new_ids[p], new_w[p] = evolve_rubric(new_ids[p], new_w[p], int(added[i]), lib,
                                             initial_count=len(self.initial_ids),
                                             max_criteria=self.max_criteria)
    return StepOutcome(scores.astype(np.float32), decisions, added, RubricState(new_ids, new_w))

  def rewards(self, method, ctx):
    """The `step_parts` hook: advantages of the rubric rewards, then the rubrics evolve."""
    tic = time.perf_counter()
    records = ctx.records
    texts = method.sampler.decode_text(ctx.rollout)
    correct = np.asarray(ctx.verified.correct, np.float32)
    anchor_correct = np.asarray([method.task.reward(r, r["demonstration"]).correct
                                 for r in records], np.float32)
    out = self.score(records, texts, correct, anchor_correct)
    self.state = out.state
    b = len(records)
    adv = method.objective.advantage_fn(
      jnp.asarray(out.scores.reshape(-1, 1)), jnp.asarray(ctx.rollout.group_ids), num_groups=b,
      eps=method.config.advantage_eps, reward_weights=jnp.ones((1,), jnp.float32))
    pool = np.asarray([int(r["index"]) for r in records])
    true_accuracy = float(np.nanmean(correct)) if np.isfinite(correct).any() else 0.0
    reward = float(out.scores.mean())
    metrics = {
      "care/true_accuracy": true_accuracy,
      "care/rubric_reward": reward,
      "care/hack_gap": reward - true_accuracy,
      "care/adaptive": float((out.decisions == ADAPTIVE).sum()),
      "care/chase": float((out.decisions == CHASE).sum()),
      "care/added": float((out.added >= 0).sum()),
      "care/rubric_size": float((self.state.ids[pool] >= 0).sum(axis=1).mean()),
      "care/pool_rubric_size": float((self.state.ids >= 0).sum(axis=1).mean()),
      "time/rubric": time.perf_counter() - tic,
    }
    return ctx.verified._replace(adv=jnp.asarray(adv, jnp.float32)), metrics

  def array_state(self) -> dict[str, Any]:
    return {"ids": np.asarray(self.state.ids), "weights": np.asarray(self.state.weights)}

  def load_array_state(self, arrays: Mapping[str, Any]) -> None:
    ids, weights = np.asarray(arrays["ids"], np.int32), np.asarray(arrays["weights"], np.float32)
    if ids.shape != self.state.ids.shape:
      raise ValueError(f"checkpointed rubric ids have shape {ids.shape}; this config's pool "
                       f"gives {self.state.ids.shape} (config.num_train_examples × max_criteria)")
    self.state = RubricState(ids, weights)


def build_rubric_evolution(config, task):
  """The configured CARE part (`config.rubric.mode`), or None (no section, or "none")."""
  knobs = config.get("rubric")
  if knobs is None or knobs.mode == "none":
    return None
  return RubricEvolution(config, task)
