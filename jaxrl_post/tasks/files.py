"""Question / answer datasets from local files, GSM8K-style (`"jsonl"`, `"parquet"`).

Each row holds a question and an answer. An answer in GSM8K's form (worked solution, then a
final `#### 72` line) gives the demonstration (the whole solution) and the gold answer (after
the last `####`); any other answer is the gold answer itself, with `#### <answer>` as its
demonstration. Records are the same as the synthetic tasks' (see `base`), so the tfds builder
and the grain loader in `data` treat a file exactly like a generated task.

  task = get_task("jsonl", path={"train": "gsm8k_train.jsonl", "test": "gsm8k_test.jsonl"})

Reward: the completion's final `#### <answer>` line (see `base.final_answer`) against the gold
answer: numbers compare exactly as numbers (`1,000` = `1000.0` = `$1000`), other answers as
text up to case and runs of whitespace. `format` is 1 when such a line is there.

Files are read once, when the task is built, so a missing file or field fails at start-up.
The readers are public for other file-backed tasks (`math_datasets`): `read_records` (JSONL or
parquet by extension, with the fields checked), `read_jsonl`, `read_parquet`, `file_sha256`.
Text is kept as the file has it; characters outside the `CharTokenizer` alphabet (GSM8K has a
few) need a tokenizer that covers them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from jaxrl_post.tasks import base

QUESTION_PLACEHOLDER = "{question}"
# File name extensions `read_records` knows, and the format of each.
FILE_FORMATS = {".json": "jsonl", ".jsonl": "jsonl", ".parquet": "parquet"}


@dataclasses.dataclass(frozen=True)
class FileQATask(base.Task):
  """Question / answer rows from one local file per split.

  Attributes:
    path: the file of the single split `"train"`, or a mapping from split name to file.
    question_field: the name of the question field (a JSONL key or a parquet column).
    answer_field: the name of the answer field.
    prompt_template: the prompt, with `{question}` where the question goes.
  """

  file_format: ClassVar[str]

  path: str | os.PathLike[str] | Mapping[str, str | os.PathLike[str]]
  question_field: str = "question"
  answer_field: str = "answer"
  prompt_template: str = "Q: " + QUESTION_PLACEHOLDER + "\n"
  _rows: dict[str, list[tuple[str, str]]] = dataclasses.field(
    init=False, repr=False, compare=False
  )

  def __post_init__(self):
    if QUESTION_PLACEHOLDER not in self.prompt_template:
      raise ValueError(f"prompt_template must contain {QUESTION_PLACEHOLDER}, got "
                       f"{self.prompt_template!r}")
    if isinstance(self.path, Mapping):
      if not self.path:
        raise ValueError("path must map at least one split to a file")
      # Plain strings keep the knobs JSON-able (they key the stored dataset).
      object.__setattr__(self, "path", {s: os.fspath(p) for s, p in self.path.items()})
    else:
      object.__setattr__(self, "path", os.fspath(self.path))
    rows = {split: self._read(split, path) for split, path in self._paths.items()}
    object.__setattr__(self, "_rows", rows)

  @property
  def _paths(self) -> dict[str, str]:
    return dict(self.path) if isinstance(self.path, Mapping) else {"train": self.path}

  @property
  def splits(self) -> list[str]:
    return sorted(self._rows)

  def num_examples(self, split: str) -> int:
    return len(self._split_rows(split))

  def fingerprint(self) -> dict[str, Any]:
    digests = {split: file_sha256(path) for split, path in sorted(self._paths.items())}
    return {**super().fingerprint(), "file_sha256": digests}

  def make_example(self, split: str, index: int) -> dict[str, Any]:
    rows = self._split_rows(split)
    if not 0 <= index < len(rows):
      raise IndexError(f"example {index} of split {split!r} is out of range [0, {len(rows)})")
    question, answer_text = rows[index]
    answer, demonstration = _answer_and_demonstration(answer_text)
    prompt = self.prompt_template.replace(QUESTION_PLACEHOLDER, question)
    meta = {"source": os.path.basename(self._paths[split])}
    return base.make_record(self.name, index, prompt, answer, demonstration, meta)

  def reward(self, record: Mapping[str, Any], completion: str) -> base.Reward:
    given = base.final_answer(completion)
    if given is None:
      return base.Reward(0.0, 0.0)
    gold = str(record["answer"])
    given_number, gold_number = base.parse_number(given), base.parse_number(gold)
    if gold_number is not None:
      correct = given_number == gold_number
    else:
      correct = _normalize_text(given) == _normalize_text(gold)
    return base.Reward(float(correct), 1.0)

  def _split_rows(self, split: str) -> list[tuple[str, str]]:
    try:
      return self._rows[split]
    except KeyError:
      raise ValueError(f"unknown split {split!r}; this task has {', '.join(self.splits)}") from None

  def _read(self, split: str, path: str) -> list[tuple[str, str]]:
    if not os.path.isfile(path):
      raise FileNotFoundError(f"{self.file_format} file for split {split!r} not found: {path}")
    records = self._read_records(path)
    fields = (self.question_field, self.answer_field)
    rows = []
    for where, record in records:
      require_fields(where, record, fields)
      question, answer = record[self.question_field], record[self.answer_field]
      if not isinstance(question, str):
        raise ValueError(f"{where}: field {self.question_field!r} must be a string, got "
                         f"{type(question).__name__}")
      # Some datasets store numeric answers as numbers.
      if isinstance(answer, bool) or not isinstance(answer, str | int | float):
        raise ValueError(f"{where}: field {self.answer_field!r} must be a string or a number, "
                         f"got {type(answer).__name__}")
      rows.append((question, str(answer)))
    return rows

  def _read_records(self, path: str) -> list[tuple[str, Any]]:
    """`(where, record)` pairs, `where` locating the record for error messages."""
    raise NotImplementedError


@base.TASKS.register("jsonl")
@dataclasses.dataclass(frozen=True)
class JsonlTask(FileQATask):
  """Rows from JSON-lines files: one JSON object per line; blank lines are skipped."""

  name = "jsonl"
  file_format = "jsonl"

  def _read_records(self, path: str) -> list[tuple[str, Any]]:
    return read_jsonl(path)


@base.TASKS.register("parquet")
@dataclasses.dataclass(frozen=True)
class ParquetTask(FileQATask):
  """Rows from parquet files with a question and an answer column."""

  name = "parquet"
  file_format = "parquet"

  def _read_records(self, path: str) -> list[tuple[str, Any]]:
    return read_parquet(path, [self.question_field, self.answer_field])


def _answer_and_demonstration(answer_text: str) -> tuple[str, str]:
  """GSM8K's `solution ... #### 72` splits into `72` and the whole solution."""
  solution, marker, answer = answer_text.rpartition(base.FINAL_ANSWER_MARKER)
  if not marker:
    solution, answer = "", answer_text
  answer = answer.strip()
  # Rebuilt rather than copied, so that the demonstration always ends in an answer line the
  # verifier accepts, also when a file puts `####` mid-line.
  final_line = f"{base.FINAL_ANSWER_MARKER} {answer}"
  solution = solution.strip()
  return answer, f"{solution}\n{final_line}" if solution else final_line


def _normalize_text(text: str) -> str:
  return " ".join(text.split()).casefold()


def read_jsonl(path: str) -> list[tuple[str, Any]]:
  """The objects of a JSON-lines file as `(where, object)` pairs; blank lines are skipped.

  `where` (`"<path> line <n>"`) locates the object for error messages.
  """
  records = []
  with open(path, encoding="utf-8") as f:
    for line_number, line in enumerate(f, start=1):
      if not line.strip():
        continue
      where = f"{path} line {line_number}"
      try:
        records.append((where, json.loads(line)))
      except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not valid JSON ({e})") from None
  return records


def read_parquet(path: str, columns: Sequence[str]) -> list[tuple[str, dict[str, Any]]]:
  """The rows of a parquet file, restricted to `columns`, as `(where, row)` pairs.

  Raises:
    ValueError: naming the file and the first missing column, and listing the columns present.
  """
  import pyarrow.parquet as pq  # Deferred: only parquet users need pyarrow.

  present = pq.read_schema(path).names
  for column in columns:
    if column not in present:
      raise ValueError(f"{path}: missing column {column!r}; columns present: {sorted(present)}")
  table = pq.read_table(path, columns=list(columns))
  return [(f"{path} row {i}", row) for i, row in enumerate(table.to_pylist())]


def file_format_of(path: str) -> str:
  """`"jsonl"` or `"parquet"`, from the file name's extension (`.jsonl` / `.json`, `.parquet`)."""
  extension = os.path.splitext(os.fspath(path))[1].lower()
  try:
    return FILE_FORMATS[extension]
  except KeyError:
    raise ValueError(f"{path}: unknown file type {extension!r}; expected one of "
                     f"{', '.join(sorted(FILE_FORMATS))}") from None


def read_records(path: str, fields: Sequence[str]) -> list[tuple[str, dict[str, Any]]]:
  """The records of a JSONL or parquet file (by extension), each checked to hold `fields`.

  Returns `(where, record)` pairs; parquet rows hold only `fields`, JSONL objects all theirs.

  Raises:
    FileNotFoundError: naming the file.
    ValueError: naming the file (and line) and the missing field, listing those present.
  """
  file_format = file_format_of(path)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{file_format} file not found: {path}")
  if file_format == "parquet":
    return read_parquet(path, fields)
  records = read_jsonl(path)
  for where, record in records:
    require_fields(where, record, fields)
  return records


def require_fields(where: str, record: Any, fields: Sequence[str]) -> None:
  """Raises a `ValueError` at `where` unless `record` is a mapping holding every one of `fields`."""
  if not isinstance(record, Mapping):
    raise ValueError(f"{where}: expected an object with fields {list(fields)}, got "
                     f"{type(record).__name__}")
  for field in fields:
    if field not in record:
      raise ValueError(f"{where}: missing field {field!r}; fields present: {sorted(record)}")


def file_sha256(path: str) -> str:
  """The SHA-256 of a file's bytes, as hex: what keys stored datasets to a file's content."""
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
      digest.update(chunk)
  return digest.hexdigest()
