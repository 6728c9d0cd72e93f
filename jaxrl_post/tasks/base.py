"""The `Task` interface, the record format, the `TASKS` registry and shared answer parsing.

A task turns `(split, index)` into one *record*, a flat dict of plain values that is also the
row format of the task's tfds / ArrayRecord files and of the batches the grain loader yields:

  task           str  the registry name of the task that made the record
  index          int  position of the example in its split
  prompt         str  what the policy sees; always ends with a newline
  answer         str  the gold final answer the verifier compares against
  demonstration  str  a reference completion (worked steps + final answer line), for SFT
  meta           str  canonical JSON with whatever else the verifier needs

`Task.reward(record, completion)` returns `Reward(correct, format)`, both in [0, 1]. It accepts
any string, including garbage, and never raises for it.

Answer format shared by every task that has a final answer: the completion's last non-blank
line is `#### <answer>` and no other line starts with `####`. This is GSM8K's convention, so
one parser serves the synthetic tasks and GSM8K-style files.
"""

from __future__ import annotations

import abc
import dataclasses
import json
import random
import re
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any, ClassVar, NamedTuple

import numpy as np

from jaxrl_post.registry import Registry

RECORD_FIELDS = ("task", "index", "prompt", "answer", "demonstration", "meta")
FINAL_ANSWER_MARKER = "####"

# Longer answers are garbage for every task here; the cap also keeps `int()` below Python's
# 4300-digit conversion limit, which would otherwise raise on a huge run of digits.
MAX_ANSWER_CHARS = 1000

_INTEGER_RE = re.compile(r"-?[0-9]+", re.ASCII)
# GSM8K-style numbers: optional sign and currency, thousands commas, decimals.
_NUMBER_RE = re.compile(r"-?\$?(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]+)?", re.ASCII)


class Reward(NamedTuple):
  """A verifier's verdict on one completion.

  Attributes:
    correct: 1.0 when the answer is right, else 0.0 (tasks may grade in between).
    format: 1.0 when the completion respects the task's answer format, else 0.0.
  """

  correct: float
  format: float


class Task(abc.ABC):
  """A verifiable task: a seeded prompt generator, a demonstration and a verifier.

  Subclasses are frozen dataclasses whose fields are the task's knobs (difficulty and the
  seed), registered in `TASKS` under their `name`.
  """

  name: ClassVar[str]

  @abc.abstractmethod
  def make_example(self, split: str, index: int) -> dict[str, Any]:
    """Example `index` of `split`: a record (see the module docstring).

    The record is a pure function of the task's knobs, `split` and `index`.
    """

  @abc.abstractmethod
  def reward(self, record: Mapping[str, Any], completion: str) -> Reward:
    """Scores `completion` (the text after the prompt) against `record`; never raises on it."""

  @property
  def splits(self) -> list[str] | None:
    """The task's fixed splits (a file-backed task has one per file); `None`: any name works."""
    return None

  def num_examples(self, split: str) -> int | None:
    """The size of `split`, or `None` when the task can generate any number of examples."""
    del split
    return None

  def grammar_slots(self) -> list[list[str]] | None:
    """The completion grammar for legal-token decoding (`sampling.grammar.from_slots`: slots
    of alternative strings), or `None` (the default): the task's completions are free text.
    `config.constrained_decoding=True` in a GRPO-family run needs one."""
    return None

  def knobs(self) -> dict[str, Any]:
    """The constructor arguments that reproduce this task, as JSON-able values."""
    fields = dataclasses.fields(self)  # Subclasses are dataclasses; see the class docstring.
    return _jsonable({f.name: getattr(self, f.name) for f in fields if f.init})

  def fingerprint(self) -> dict[str, Any]:
    """What determines the examples: the knobs, plus e.g. the content of a source file.

    Stored datasets are keyed by it, so a changed knob or file never reuses stale records.
    """
    return {"task": self.name, **self.knobs()}

  def reward_batch(
    self, batch: Mapping[str, Sequence[Any]], completions: Sequence[str]
  ) -> tuple[np.ndarray, np.ndarray]:
    """Scores a batch as the grain loader yields it (columns) against its completions.

    Returns:
      `(correct, format)`, each `float32 [batch]`.
    """
    n = len(completions)
    if len(batch["prompt"]) != n:
      raise ValueError(f"batch has {len(batch['prompt'])} records but {n} completions")
    correct = np.zeros(n, np.float32)
    fmt = np.zeros(n, np.float32)
    for i, completion in enumerate(completions):
      record = {key: batch[key][i] for key in RECORD_FIELDS if key in batch}
      correct[i], fmt[i] = self.reward(record, completion)
    return correct, fmt


TASKS: Registry[type[Task]] = Registry("task")


def get_task(name: str, **knobs: Any) -> Task:
  """Builds the task registered as `name` with the given knobs (see `Registry.build`)."""
  return TASKS.build(name, **knobs)


def example_rng(task_name: str, seed: int, split: str, index: int) -> random.Random:
  """The random generator of one example.

  Seeding `random.Random` with a string hashes it with SHA-512, so the stream depends only on
  `(task_name, seed, split, index)`: not on the process, `PYTHONHASHSEED` or the examples made
  before it. The task name keeps two tasks with the same seed uncorrelated.
  """
  if not isinstance(index, int | np.integer) or index < 0:
    raise ValueError(f"example index must be a non-negative int, got {index!r}")
  if not isinstance(split, str) or not split:
    raise ValueError(f"split must be a non-empty string, got {split!r}")
  return random.Random(f"{task_name}/{int(seed)}/{split}/{int(index)}")


def make_record(
  task: str, index: int, prompt: str, answer: str, demonstration: str, meta: Mapping[str, Any]
) -> dict[str, Any]:
  """A record with `meta` serialised canonically, so equal examples give equal records."""
  return {
    "task": task,
    "index": int(index),
    "prompt": prompt,
    "answer": answer,
    "demonstration": demonstration,
    "meta": json.dumps(dict(meta), sort_keys=True, separators=(",", ":")),
  }


def parse_meta(record: Mapping[str, Any]) -> dict[str, Any]:
  """The record's `meta` as a dict (records carry it as JSON text; a dict is accepted too)."""
  meta = record.get("meta", "{}")
  if isinstance(meta, bytes):
    meta = meta.decode("utf-8")
  return dict(meta) if isinstance(meta, Mapping) else json.loads(meta)


def final_answer(completion: Any) -> str | None:
  """The text after `####` on the completion's last non-blank line, or `None`.

  `None` also when that line does not start with `####`, when an earlier line does too (a
  completion must commit to one answer, not hedge over several), when the answer is empty or
  longer than `MAX_ANSWER_CHARS`, or when `completion` is not a string.
  """
  if not isinstance(completion, str):
    return None
  body, _, last = completion.rstrip().rpartition("\n")
  last = last.strip()
  if not last.startswith(FINAL_ANSWER_MARKER):
    return None
  if any(line.lstrip().startswith(FINAL_ANSWER_MARKER) for line in body.split("\n")):
    return None
  answer = last[len(FINAL_ANSWER_MARKER) :].strip()
  if not answer or len(answer) > MAX_ANSWER_CHARS:
    return None
  return answer


def parse_integer(text: str | None) -> int | None:
  """`text` as an int when it is exactly an optionally signed run of ASCII digits."""
  if text is None or len(text) > MAX_ANSWER_CHARS or not _INTEGER_RE.fullmatch(text):
    return None
  return int(text)


def parse_number(text: str | None) -> Fraction | None:
  """A GSM8K-style number (`-$1,234.50`) as an exact fraction, or `None`."""
  if text is None or len(text) > MAX_ANSWER_CHARS:
    return None
  text = text.strip().rstrip(".")
  if not _NUMBER_RE.fullmatch(text):
    return None
  return Fraction(text.replace("$", "").replace(",", ""))


def _jsonable(value: Any) -> Any:
  """Tuples to lists and mappings to dicts, recursively, so knobs round-trip through JSON."""
  if isinstance(value, Mapping):
    return {str(k): _jsonable(v) for k, v in value.items()}
  if isinstance(value, list | tuple):
    return [_jsonable(v) for v in value]
  return value
