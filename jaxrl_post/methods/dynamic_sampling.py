"""DAPO's dynamic sampling (arXiv 2503.14476): keep only groups whose rewards differ, regenerate
until the step has `prompts_per_step` of them.

A group whose `group_size` rewards are all equal (all correct or all wrong) has zero
group-relative advantage: it costs a PPO pass and dilutes the token mean without moving the
policy. DAPO over-samples and drops such groups until the batch is full of informative ones.

Host-side numpy, no JAX: the step loop generates a round, verifies it, hands the round's rewards
to a `DynamicSamplingBuffer`, and repeats until `full()`; `take()` then says which rows and
groups of the rounds, concatenated in arrival order, form the step's batch:

  buffer = DynamicSamplingBuffer.from_config(config)       # None when max_rounds = 0 (off)
  while True:
    ... generate and verify one round (records, rollout, rewards [rows]) ...
    buffer.add(rewards)                                    # raises after max_rounds rounds
    if buffer.full():
      break
  selection = buffer.take()                                # prompts_per_step groups, in order
  rows = selection.gather([round_a_array, round_b_array])  # per-row arrays, concatenated
  records = selection.gather_groups([round_a_records, round_b_records])
  selection.round_groups                                   # or round by round (padded widths)

Which reward to hand in is the caller's choice: the verifier's correctness (DAPO's accuracy,
verl's default `filter_groups.metric="acc"`), or the combined reward of `config.reward_weights`,
which drops exactly the groups GRPO gives zero advantage. Surplus informative groups of the last
round are dropped (counted in `groups_surplus`), not carried to the next step, where they would
be off-policy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np


def informative_groups(rewards: np.ndarray, group_size: int, *, tol: float = 0.0) -> np.ndarray:
  """Which groups of a record-major batch have rewards that are not all equal.

  Group g = rows `[g·group_size, (g+1)·group_size)`. It is informative when
  max − min of its rewards exceeds `tol`. NaN rewards (a verifier that failed) are left out:
  the advantage estimators treat them as missing, so only the rows with a reward can carry
  a learning signal. A group is informative only if its non-NaN rewards differ, so a group with
  fewer than two rewards (in particular every group when `group_size` is 1) never is.

  Args:
    rewards: `[rows]` float rewards, rows = groups × group_size.
    group_size: rows per group.
    tol: the spread up to which rewards count as equal (0: exact equality).

  Returns:
    `bool[groups]`.

  Raises:
    ValueError: when rewards is not 1-D, rows is not a multiple of group_size, or tol < 0.

  Examples:
    >>> informative_groups(np.array([1.0, 0.0, 1.0, 1.0, 0.0, np.nan]), 2).tolist()
    [True, False, False]
  """
  rewards = np.asarray(rewards, np.float64)
  if rewards.ndim != 1:
    raise ValueError(f"informative_groups: rewards must be [rows], got shape {rewards.shape}")
  if group_size < 1 or rewards.shape[0] % group_size:
    raise ValueError(f"informative_groups: {rewards.shape[0]} rewards are not whole groups of "
                     f"config.group_size={group_size}")
  if tol < 0:
    raise ValueError(f"informative_groups: tol={tol} must be >= 0")
  groups = rewards.reshape(-1, group_size)
  present = ~np.isnan(groups)
  if groups.size == 0:
    return np.zeros(groups.shape[0], bool)
  high = np.where(present, groups, -np.inf).max(axis=1)
  low = np.where(present, groups, np.inf).min(axis=1)
  return (present.sum(axis=1) >= 2) & (high - low > tol)


class DynamicSamplingStats(NamedTuple):
  """What one step's dynamic sampling did (`DynamicSamplingBuffer.stats`)."""

  rounds: int  # generation rounds handed to `add`
  groups_seen: int  # groups in those rounds
  groups_dropped: int  # of them, uninformative (all rewards equal)
  groups_surplus: int  # informative, but beyond prompts_per_step: not used

  def metrics(self) -> dict[str, float]:
    """The step record's `dynamic_sampling/*` entries."""
    return {f"dynamic_sampling/{k}": float(v) for k, v in self._asdict().items()}


class Selection(NamedTuple):
  """The groups `DynamicSamplingBuffer.take` keeps, as indices into the step's rounds
  concatenated in arrival order."""

  rows: np.ndarray  # int64[prompts_per_step × group_size] row indices, record-major
  groups: np.ndarray  # int64[prompts_per_step] group indices
  group_ids: np.ndarray  # int32[prompts_per_step × group_size] 0,0,…,1,1,… of the kept rows
  round_groups: tuple[np.ndarray, ...]  # per round, its kept groups' indices within the round
  stats: DynamicSamplingStats

  def gather(self, per_round: Sequence[Any]) -> np.ndarray:
    """The kept rows of per-row arrays, one `[rows_r, ...]` array per round (same trailing
    shape in every round; for rounds padded to different widths slice each round with
    `round_groups` and pad them yourself)."""
    return np.concatenate([np.asarray(a) for a in per_round], axis=0)[self.rows]

  def gather_groups(self, per_round: Sequence[Sequence[Any]]) -> list[Any]:
    """The kept entries of per-group sequences (e.g. the records), one sequence per round."""
    flat = [item for seq in per_round for item in seq]
    return [flat[g] for g in self.groups]


class DynamicSamplingBuffer:
  """Collects verified rounds of groups until `prompts_per_step` informative ones are kept.

  `add(rewards)` takes one round's rewards `[rows_r]` (record-major, `group_size` rows a group)
  and keeps its informative groups (`informative_groups`); `full()` says whether enough are
  kept; `take()` returns the first `prompts_per_step` of them in arrival order and resets the
  buffer for the next step. A step that has not filled after `max_rounds` rounds raises, as
  verl does: the data are too hard (or too easy) for the policy, and training on fewer groups
  would change the batch size silently.
  """

  def __init__(self, *, group_size: int, prompts_per_step: int, max_rounds: int,
               tol: float = 0.0):
    if group_size < 2:
      raise ValueError(f"dynamic sampling needs config.group_size >= 2 (got {group_size}): a "
                       "one-row group never has unequal rewards")
    if prompts_per_step < 1:
      raise ValueError(f"config.prompts_per_step={prompts_per_step} must be >= 1")
    if max_rounds < 1:
      raise ValueError(f"config.dynamic_sampling.max_rounds={max_rounds} must be >= 1 here "
                       "(0 turns dynamic sampling off: use from_config)")
    self.group_size, self.prompts_per_step = group_size, prompts_per_step
    self.max_rounds, self.tol = max_rounds, tol
    self.reset()

  @classmethod
  def from_config(cls, config) -> DynamicSamplingBuffer | None:
    """The buffer `config.dynamic_sampling` asks for, or None when it is off (max_rounds 0 or
    no section)."""
    section = config.get("dynamic_sampling")
    max_rounds = 0 if section is None else int(section.get("max_rounds", 0))
    if max_rounds < 0:
      raise ValueError(f"config.dynamic_sampling.max_rounds={max_rounds} must be >= 0 "
                       "(0 = off)")
    if max_rounds == 0:
      return None
    return cls(group_size=config.group_size, prompts_per_step=config.prompts_per_step,
               max_rounds=max_rounds)

  def reset(self) -> None:
    """Forgets every round (`take` calls it)."""
    self._kept: list[int] = []  # global group indices of informative groups, in arrival order
    self._round_sizes: list[int] = []  # groups per round
    self._rounds = self._seen = 0

  @property
  def kept(self) -> int:
    """Informative groups collected so far (may exceed prompts_per_step)."""
    return len(self._kept)

  def needed(self) -> int:
    """Informative groups still missing (0 once full)."""
    return max(self.prompts_per_step - len(self._kept), 0)

  def full(self) -> bool:
    return len(self._kept) >= self.prompts_per_step

  def add(self, rewards: np.ndarray) -> int:
    """Adds one round's rewards `[rows_r]`; returns how many of its groups are informative.

    Raises:
      ValueError: for rewards that are not whole groups (`informative_groups`).
      RuntimeError: naming `config.dynamic_sampling.max_rounds` when this round is the last
        one allowed and the buffer is still not full.
    """
    mask = informative_groups(rewards, self.group_size, tol=self.tol)
    self._kept.extend(int(g) for g in self._seen + np.flatnonzero(mask))
    self._seen += mask.shape[0]
    self._round_sizes.append(mask.shape[0])
    self._rounds += 1
    if not self.full() and self._rounds >= self.max_rounds:
      raise RuntimeError(
        f"dynamic sampling: {self._rounds} generation rounds "
        f"(config.dynamic_sampling.max_rounds={self.max_rounds}) found {len(self._kept)} "
        f"informative groups of the {self.prompts_per_step} needed (config.prompts_per_step), "
        f"out of {self._seen} groups seen: the policy solves all or none of almost every "
        "prompt; raise max_rounds, or change the data or group_size")
    return int(mask.sum())

  @property
  def stats(self) -> DynamicSamplingStats:
    used = min(len(self._kept), self.prompts_per_step)
    return DynamicSamplingStats(rounds=self._rounds, groups_seen=self._seen,
                                groups_dropped=self._seen - len(self._kept),
                                groups_surplus=len(self._kept) - used)

  def take(self) -> Selection:
    """The first `prompts_per_step` informative groups, in arrival order; resets the buffer.

    Raises:
      RuntimeError: when the buffer is not `full()`.
    """
    if not self.full():
      raise RuntimeError(f"dynamic sampling: take() with {len(self._kept)} informative groups "
                         f"of the {self.prompts_per_step} needed; call add() until full()")
    stats = self.stats
    groups = np.asarray(self._kept[:self.prompts_per_step], np.int64)
    g = self.group_size
    rows = (groups[:, None] * g + np.arange(g)[None, :]).reshape(-1)
    group_ids = np.repeat(np.arange(self.prompts_per_step, dtype=np.int32), g)
    starts = np.cumsum([0, *self._round_sizes])
    round_groups = tuple(groups[(groups >= lo) & (groups < hi)] - lo
                         for lo, hi in zip(starts[:-1], starts[1:]))
    self.reset()
    return Selection(rows, groups, group_ids, round_groups, stats)
