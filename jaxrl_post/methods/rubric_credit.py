r"""DRACO on the multi-turn agent: a rubric judge, its trajectory reward and step credit.

DRACO (arXiv 2609.04094) trains long-horizon tool agents without a verifier: a judge writes a
rubric for each group of G rollouts, grades every rollout against it (PASS / FAIL /
NOT_APPLICABLE, each verdict citing the steps it rests on), and the rollout's reward is
R_i = (p_i − f_i)/(p_i + f_i) over the criteria that survive discriminative dropout (some rollout
of the group FAILs them). GRPO over R_i gives A_i, and the citations spread A_i over the steps:
a cited step's quality Q_j = p_j/(p_j + f_j) weighs it (w_j = Q_j when A_i ≥ 0, 1 − Q_j when
A_i < 0) in a_j = A_i · N · w_j / (n_j Σ_k w_k), which keeps GRPO's total push Σ_j n_j a_j = A_i N
(`advantages.draco.draco_step_advantages`; the array side of the rubric is in
`rewards.rubrics`).

Here it is a batch hook of turn-level GRPO (`methods.rtpo.grpo_step`, like
`methods.stage_credit`): one step = one turn, whose row holds exactly that turn's action tokens,
so every token of step j gets a_j by giving its row the advantage a_j (gap tokens, the
observations, are never in a row's loss mask). Two modes of experiments/rtpo.py:

  draco         the dynamic rubric (instruction- plus execution-derived criteria, dropout) and
                DRACO's step credit.
  draco_static  the paper's ablation baseline "static rubric, no step credit": only the
                instruction-derived criteria, no dropout (a fixed rubric is written before any
                rollout is seen), every turn of a rollout gets its A_i (PROPOSAL reading).

The outcome-reward baseline is turn_grpo itself (the env's verifier reward).

The judge (a STAND-IN). The paper's judge is a frozen LLM (GPT-5.4) reading the instruction and
each trajectory. Ours is programmatic and reads the env's privileged episode state, the same
detector Temporal GRPO uses (`envs.Env.stage_times`: kv_lookup's hops, calculator's intermediate
values, then the correct answer):

  instruction-derived   one criterion per stage of the chain, `stage_k` ("hop k resolved", ...,
                        the last "final answer correct"): PASS citing the turn that completed
                        it; FAIL citing the turns that worked on it without completing it (after
                        the previous stage's turn, to the end); NOT_APPLICABLE once an earlier
                        stage failed (the rollout never got there).
  execution-derived     proposed by reading the rollouts: `no_failed_action` when some rollout
                        of the group has an action that got an error observation,
                        `no_repeated_call` when some rollout repeats an identical tool call.
                        Graded on every rollout of the group: FAIL citing the offending turns;
                        PASS (citing nothing: no single turn earned it) otherwise;
                        `no_repeated_call` is NOT_APPLICABLE to a rollout without tool calls.

The criteria are disjoint by construction (each error counts once in the execution criteria; a
stage failure is one criterion), which is what the paper's MECE instruction asks for. Success is
a stage criterion, so the judge is not outcome-blind in the strict sense: like the paper's
judge, it may recognise a correct answer; what it does not do is read the env's reward. The
env's success enters only the evaluation metrics.

Leniency (PROPOSAL knob `leniency`, default 0): each FAIL verdict is judged PASS with this
probability (its citations kept), imitating the paper's lenient self-judge (it passed 30.4% of
the criteria the frozen judge failed). The draws come from `(seed, step)` only, in a fixed order
over (episode, criterion), so a resumed run draws the same ones.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np

from jaxrl_post.advantages.draco import draco_step_stats
from jaxrl_post.envs import Env
from jaxrl_post.envs.tools import parse_action
from jaxrl_post.losses import rtpo as rtpo_losses
from jaxrl_post.methods.ocsd import step_layout
from jaxrl_post.rewards.rubrics import (
  FAIL,
  MISSING,
  NOT_APPLICABLE,
  PASS,
  citations_from_lists,
  discriminative_dropout,
  draco_reward,
  rubric_counts,
  step_verdict_counts,
)
from jaxrl_post.sampling.multiturn import SampledTrajectory, TurnBatch

DRACO = "draco"
DRACO_STATIC = "draco_static"
DRACO_MODES = (DRACO, DRACO_STATIC)
NO_FAILED_ACTION = "no_failed_action"
NO_REPEATED_CALL = "no_repeated_call"
EXECUTION_CRITERIA = (NO_FAILED_ACTION, NO_REPEATED_CALL)


class Verdict(NamedTuple):
  """One (rollout, criterion) grade: a `rewards.rubrics` code and the cited 0-based steps."""

  code: int
  steps: tuple[int, ...] = ()


def stage_criteria(num_stages: int) -> list[str]:
  """The instruction-derived criteria of a chain of `num_stages` stages: `stage_1`, ...."""
  return [f"stage_{k + 1}" for k in range(num_stages)]


def judge_episode(env: Env, trajectory: SampledTrajectory) -> dict[str, Verdict]:
  """The stand-in judge's verdicts on every criterion it knows (see the module docstring).

  Steps are positions in `trajectory.turns` (0-based; one step = one turn).

  Args:
    env: the env that played it (its stage detector; an env without stages raises, naming it).
    trajectory: one episode.

  Returns:
    `{criterion: Verdict}` for `stage_1..stage_K`, `no_failed_action` and `no_repeated_call`.
  """
  turns = trajectory.turns
  n = len(turns)
  offset = turns[0].index if turns else 0  # a continuation from S_k: turn k is step 0
  out = {}
  previous, reached = 0, True  # previous: steps before this index belong to earlier stages
  for name, time in zip(stage_criteria(env.num_stages()), env.stage_times(trajectory),
                        strict=True):
    step = time - 1 - offset
    if not reached:
      out[name] = Verdict(NOT_APPLICABLE)
    elif time >= 1 and step >= 0:
      out[name] = Verdict(PASS, (step,))
      previous = step + 1
    elif time >= 1:  # completed before the continuation started: not this rollout's doing
      out[name] = Verdict(NOT_APPLICABLE)
    else:
      out[name] = Verdict(FAIL, tuple(range(previous, n)))
      reached = False
  errors = tuple(j for j, t in enumerate(turns) if t.turn.info.get("error") is not None)
  out[NO_FAILED_ACTION] = Verdict(FAIL, errors) if errors else Verdict(PASS)
  seen, repeats = set(), []
  for j, t in enumerate(turns):
    action = parse_action(t.turn.action)
    if action.tool is None:
      continue
    call = (action.tool, action.argument)
    if call in seen:
      repeats.append(j)
    seen.add(call)
  if not seen:
    out[NO_REPEATED_CALL] = Verdict(NOT_APPLICABLE)
  else:
    out[NO_REPEATED_CALL] = Verdict(FAIL, tuple(repeats)) if repeats else Verdict(PASS)
  return out


def group_rubric(judgements: Sequence[Mapping[str, Verdict]], num_stages: int, *,
                 dynamic: bool = True) -> list[str]:
  """The rubric of one group: the stage criteria, plus (dynamic) the execution-derived ones some
  rollout's transcript calls for (the judge proposes "no repeated call" only after seeing one).

  Examples:
    >>> group_rubric([{NO_REPEATED_CALL: Verdict(FAIL, (2,)), NO_FAILED_ACTION: Verdict(PASS)}],
    ...              2)
    ['stage_1', 'stage_2', 'no_repeated_call']
  """
  names = stage_criteria(num_stages)
  if dynamic:
    names += [c for c in EXECUTION_CRITERIA
              if any(j.get(c, Verdict(PASS)).code == FAIL for j in judgements)]
  return names


def lenient(judgements: Sequence[dict[str, Verdict]], names: Sequence[str], leniency: float,
            rng: np.random.Generator) -> tuple[list[dict[str, Verdict]], int]:
  """Each FAIL verdict becomes PASS with probability `leniency` (citations kept).

  One uniform draw per (episode, criterion of `names`), in that order, whatever the verdicts,
  so the stream does not depend on the policy's behaviour. Returns the verdicts and the number
  flipped.
  """
  draws = rng.random((len(judgements), len(names)))
  out, flipped = [], 0
  for judged, row in zip(judgements, draws, strict=True):
    judged = dict(judged)
    for name, u in zip(names, row, strict=True):
      if judged[name].code == FAIL and u < leniency:
        judged[name] = judged[name]._replace(code=PASS)
        flipped += 1
    out.append(judged)
  return out, flipped


@dataclasses.dataclass(frozen=True, kw_only=True)
class RubricConfig:
  """DRACO's knobs (`config.draco.*`), validated.

  Attributes:
    leniency: probability that the judge passes a criterion it would fail (PROPOSAL, default 0:
      the frozen judge; the paper's self-judge passed 30.4% of the frozen judge's FAILs).
    eps: Σw at or below which a rollout's step credit falls back to uniform a_j = A_i.
  """

  leniency: float = 0.0
  eps: float = 1e-8

  def __post_init__(self):
    if not 0.0 <= self.leniency <= 1.0:
      raise ValueError(f"config.draco.leniency={self.leniency!r} must be a probability in "
                       "[0, 1]")
    if not self.eps >= 0:
      raise ValueError(f"config.draco.eps={self.eps!r} must be >= 0")

  @classmethod
  def from_config(cls, config: Mapping[str, Any] | None) -> RubricConfig:
    """From `config.draco` (None: the defaults); an unknown key raises naming it."""
    config = dict(config or {})
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(config) - known)
    if unknown:
      raise ValueError(f"unknown config.draco keys {unknown}; valid: {', '.join(sorted(known))}")
    return cls(**config)


class RubricArrays(NamedTuple):
  """A step's rubric as padded arrays (B prompts, G rollouts, K criteria, S steps)."""

  verdicts: np.ndarray  # [B, G, K] int codes, MISSING on padding criteria.
  criterion_mask: np.ndarray  # [B, K] bool real criteria of each group's rubric.
  citations: np.ndarray  # [B, G, K, S] bool.
  num_steps: np.ndarray  # [B, G] int turns of each rollout.
  step_tokens: np.ndarray  # [B, G, S] int action tokens of each turn.


def rubric_arrays(judgements: Sequence[Mapping[str, Verdict]], rubrics: Sequence[Sequence[str]],
                  trajectories: Sequence[SampledTrajectory], group_size: int, max_steps: int
                  ) -> RubricArrays:
  """The verdicts of consecutive groups of `group_size` episodes on their groups' rubrics."""
  e, g = len(trajectories), group_size
  b = e // g
  k = max((len(r) for r in rubrics), default=1)
  verdicts = np.full((b, g, k), MISSING, np.int32)
  mask = np.zeros((b, k), bool)
  lists = []
  for i in range(b):
    mask[i, :len(rubrics[i])] = True
    row = []
    for j in range(g):
      judged = judgements[i * g + j]
      verdicts[i, j, :len(rubrics[i])] = [judged[c].code for c in rubrics[i]]
      row.append([judged[c].steps if judged[c].code != NOT_APPLICABLE else ()
                  for c in rubrics[i]])
    lists.append(row)
  num_steps = np.asarray([len(t.turns) for t in trajectories], np.int32).reshape(b, g)
  tokens = np.zeros((e, max_steps), np.int32)
  for i, traj in enumerate(trajectories):
    tokens[i, :len(traj.turns)] = [len(t.action_ids) for t in traj.turns]
  citations = citations_from_lists(lists, num_steps, max_steps, num_criteria=k)
  return RubricArrays(verdicts, mask, citations, num_steps, tokens.reshape(b, g, max_steps))


@dataclasses.dataclass(frozen=True, kw_only=True)
class RubricCredit:
  """DRACO's batch hook of turn GRPO (`mode` "draco" or "draco_static").

  Judges every episode (`judge_episode`), builds each group's rubric (`group_rubric`), applies
  leniency, discriminative dropout (dynamic only), R_i = `draco_reward`, A_i = the host's GRPO
  estimator over R, and sets each turn row's advantage to DRACO's a_j of its turn (`draco`) or
  to A_i (`draco_static`). Use `at_step(step)` for the step's leniency draws.

  Metrics: `draco/criteria` and `draco/kept` (mean rubric size per group, before and after
  dropout), `draco/reward_mean`, `draco/lenient_flips` (share of FAIL verdicts judged PASS),
  `draco/fallback` (share of rollouts whose step credit fell back to uniform), and
  `draco/adv_abs_mean` (mean |advantage| over the rows).

  Attributes:
    env: the env (its stage detector).
    group_size: G, consecutive episodes of one prompt.
    mode: "draco" or "draco_static".
    config: `RubricConfig` (leniency, eps).
    advantage: the trajectory estimator over R (`losses.rtpo.advantage_fn`; the host's).
    advantage_eps: its ε.
    seed, step: the leniency draws come from `(seed, step)`.
  """

  env: Env
  group_size: int
  mode: str = DRACO
  config: RubricConfig = RubricConfig()
  advantage: str = "grpo"
  advantage_eps: float = 1e-6
  seed: int = 0
  step: int = 0
  # The rubric reward differs from the env's: the host's zero-advantage skip must look at ours.
  replaces_advantages = True

  def __post_init__(self):
    if self.mode not in DRACO_MODES:
      raise ValueError(f"mode={self.mode!r}; valid: {', '.join(DRACO_MODES)}")
    if self.group_size < 2:
      raise ValueError(f"group_size must be >= 2, got {self.group_size}")
    self.env.stage_detectors(self.env.make_episode("train", 0))  # fails early, naming the env
    rtpo_losses.advantage_fn(self.advantage)

  def at_step(self, step: int) -> RubricCredit:
    """The hook for training step `step` (its leniency draws)."""
    return dataclasses.replace(self, step=int(step))

  def __call__(self, params: Any, trajectories: Sequence[SampledTrajectory], batch: TurnBatch
               ) -> tuple[TurnBatch, dict[str, float]]:
    del params
    e, g = len(trajectories), self.group_size
    if e % g:
      raise ValueError(f"{self.mode}: {e} episodes do not form groups of group_size={g}")
    turns = [t for traj in trajectories for t in traj.turns]
    n = len(turns)
    if batch.num_rows != n or not np.array_equal(batch.turn[:n], [t.index for t in turns]):
      raise ValueError(f"{self.mode} needs the turn rows of `trajectories` in order (turn "
                       f"GRPO's batch); got {batch.num_rows} rows for {n} turns")
    dynamic = self.mode == DRACO
    judged = [judge_episode(self.env, traj) for traj in trajectories]
    rubrics = [group_rubric(judged[i:i + g], self.env.num_stages(), dynamic=dynamic)
               for i in range(0, e, g)]
    # One canonical criterion order for the draws: stages, then the execution criteria.
    names = stage_criteria(self.env.num_stages()) + list(EXECUTION_CRITERIA)
    strict = judged
    judged, _ = lenient(strict, names, self.config.leniency,
                        np.random.default_rng([self.seed, self.step]))
    # Flips among the criteria that are in the groups' rubrics (the metric's denominator).
    flipped = sum(strict[i][c].code == FAIL and judged[i][c].code == PASS
                  for i in range(e) for c in rubrics[i // g])
    layout = step_layout(trajectories)
    arrays = rubric_arrays(judged, rubrics, trajectories, g, layout.num_steps)
    verdicts = jnp.asarray(arrays.verdicts)
    mask = jnp.asarray(arrays.criterion_mask)
    kept = discriminative_dropout(verdicts, mask) if dynamic else mask
    reward = np.asarray(draco_reward(*rubric_counts(verdicts, kept)))  # [B, G]
    ids = np.repeat(np.arange(e // g, dtype=np.int32), g)
    traj_adv = np.asarray(rtpo_losses.advantage_fn(self.advantage)(
      jnp.asarray(reward.reshape(-1)), jnp.asarray(ids), num_groups=e // g,
      eps=self.advantage_eps))
    metrics = {"draco/criteria": float(arrays.criterion_mask.sum(1).mean()),
               "draco/kept": float(np.asarray(kept).sum(1).mean()),
               "draco/reward_mean": float(reward.mean()),
               "draco/lenient_flips": float(flipped / max(
                 flipped + int((arrays.verdicts == FAIL).sum()), 1))}
    if dynamic:
      counts = step_verdict_counts(verdicts, arrays.citations, kept, arrays.num_steps)
      step_mask = np.arange(layout.num_steps) < arrays.num_steps[..., None]
      stats = draco_step_stats(jnp.asarray(traj_adv.reshape(e // g, g)), counts.step_pass,
                               counts.step_fail, jnp.asarray(arrays.step_tokens),
                               jnp.asarray(step_mask), eps=self.config.eps)
      step_adv = np.asarray(stats.advantages).reshape(e, layout.num_steps)
      row_adv = step_adv[layout.episode, layout.step]
      metrics["draco/fallback"] = float(np.asarray(stats.fallback).mean())
    else:
      row_adv = traj_adv[layout.episode]
    adv = np.zeros(batch.adv.shape[0], np.float32)
    adv[:n] = row_adv
    metrics["draco/adv_abs_mean"] = float(np.abs(row_adv).mean()) if n else 0.0
    return batch._replace(adv=adv), metrics


__all__ = [
  "DRACO",
  "DRACO_MODES",
  "DRACO_STATIC",
  "EXECUTION_CRITERIA",
  "NO_FAILED_ACTION",
  "NO_REPEATED_CALL",
  "RubricArrays",
  "RubricConfig",
  "RubricCredit",
  "Verdict",
  "group_rubric",
  "judge_episode",
  "lenient",
  "rubric_arrays",
  "stage_criteria",
]
