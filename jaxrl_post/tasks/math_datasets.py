"""GSM8K and MATH as tasks (`"gsm8k"`, `"math"`, `"math500"`), from the Hub or local files.

  task = get_task("gsm8k")                                    # openai/gsm8k from the Hub
  task = get_task("math500", path="math500_test.jsonl")       # a local copy instead
  task = get_task("math", path={"train": "train.parquet", "test": "test.parquet"})

Defaults (each a knob: `repo_id`, `files` = split -> file in the repository, `revision`):

  gsm8k    openai/gsm8k                        main/{train,test}-00000-of-00001.parquet
           columns: question, answer
  math     DigitalLearningGmbH/MATH-lighteval  data/{train,test}-00000-of-00001.parquet
           columns: problem, solution, level, type
  math500  HuggingFaceH4/MATH-500              test.jsonl (test split only)
           columns: problem, solution, answer, subject, level, unique_id

Records (see `base`): prompt = the question / problem, a newline, the `instruction` knob
(default `DEFAULT_INSTRUCTION`, asking for a boxed answer) and a newline; answer = the gold
final answer; demonstration = the worked solution ending in a boxed answer; meta = level /
type / subject / unique_id where the dataset has them.

* GSM8K's `answer` column is a worked solution ending in `#### <number>`: the gold answer is
  the text after the last `####`, and the demonstration is the solution without its calculator
  annotations (`<<48/2=24>>`), closed by `The final answer is $\\boxed{<number>}$.`.
* MATH's gold answer is the content of the last `\\boxed{...}` of `solution` (`math_answers.
  last_boxed`); the solution is the demonstration. The few rows without a box are dropped (they
  have no gold answer), and `dropped_rows` counts them per split. MATH-500 has an `answer`
  column, which is the gold answer.

Rewards are `math_answers.gsm8k_reward` (numbers) and `math_answers.math_reward` (`math_verify`
equivalence): see that module for the extraction rules and what counts as equivalent. The MATH
tasks score in `rewards.verifiers`' worker pool (`pooled_verifier`), so a pathological
expression costs one sample its time limit, not the step. GSM8K's number comparison cannot
hang and stays in process.

Sources. Files are fetched with `huggingface_hub.hf_hub_download(repo_id, file,
repo_type="dataset", revision=...)` into the Hub cache (`cache_dir`, else `HF_HUB_CACHE`, else
`HF_HOME/hub`). The cache is tried first and the network only when the file is not there, so
a machine that fetched the files once works offline (and `HF_HUB_OFFLINE=1` forbids the
network). `path` replaces the Hub with local JSONL or parquet files (`files.read_records`),
with the same columns. Files are read when the task is built, so a missing file or column fails
at start-up. The fingerprint holds the source (repo id, revision and file, or the local path)
and the SHA-256 of every file read: `revision="main"` moves, the content hash does not.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from jaxrl_post import hub
from jaxrl_post.rewards import math_answers
from jaxrl_post.tasks import base, files

DEFAULT_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."

GSM8K_REPO = "openai/gsm8k"
GSM8K_FILES = {
  "train": "main/train-00000-of-00001.parquet",
  "test": "main/test-00000-of-00001.parquet",
}
MATH_REPO = "DigitalLearningGmbH/MATH-lighteval"
MATH_FILES = {
  "train": "data/train-00000-of-00001.parquet",
  "test": "data/test-00000-of-00001.parquet",
}
MATH500_REPO = "HuggingFaceH4/MATH-500"
MATH500_FILES = {"test": "test.jsonl"}

# GSM8K's calculator annotations, `<<48/2=24>>`, which are not part of the prose.
_CALCULATOR_RE = re.compile(r"<<[^<>]*>>")


def fetch_dataset_file(repo_id: str, filename: str, *, revision: str = "main",
                       cache_dir: str | os.PathLike[str] | None = None) -> str:
  """The local path of `filename` of the Hub dataset `repo_id`@`revision`: cache, then network.

  Raises:
    FileNotFoundError: naming the repository, file, revision and cache, and what to do, when the
      file is neither cached nor downloadable (offline, unknown repository or file).
  """
  import huggingface_hub  # Deferred: only Hub-backed tasks need it.
  from huggingface_hub import errors

  if cache_dir is None:
    cache_dir = os.environ.get("HF_HUB_CACHE") or None
  kwargs = dict(repo_id=repo_id, filename=filename, repo_type="dataset", revision=revision,
                cache_dir=cache_dir)
  where = (f"file {filename!r} of the Hub dataset {repo_id!r} (revision {revision!r}, cache "
           f"{hub.cache_location(cache_dir)})")
  try:
    return huggingface_hub.hf_hub_download(**kwargs, local_files_only=True)
  except errors.LocalEntryNotFoundError:
    pass
  if hub.offline():
    raise FileNotFoundError(
      f"{where} is not cached and HF_HUB_OFFLINE is set: go online once to download it, or "
      "pass the task's `path` knob with local JSONL / parquet files per split") from None
  try:
    return huggingface_hub.hf_hub_download(**kwargs)
  except (errors.RepositoryNotFoundError, errors.RevisionNotFoundError,
          errors.EntryNotFoundError, errors.LocalEntryNotFoundError,
          errors.HfHubHTTPError) as e:
    first_line = str(e).splitlines()[0] if str(e) else ""
    raise FileNotFoundError(
      f"could not download {where} ({type(e).__name__}: {first_line}): check the repo id, "
      "file name and revision knobs and the network (HF_ENDPOINT / HF_TOKEN), or pass `path` "
      "with local files") from None


@dataclasses.dataclass(frozen=True)
class HubMathTask(base.Task):
  """A math dataset from the Hub (or local files), one file per split.

  Subclasses set `name`, `split_names`, `columns` and `_convert`, and redeclare the defaults of
  `repo_id` and `files`.

  Attributes:
    repo_id: the Hub dataset.
    revision: a branch, tag or commit of it.
    files: split name to file in the repository; the task's splits are its keys.
    path: local files replacing the Hub: a mapping from split to a `.jsonl` / `.parquet` file,
      or one file for a task with a single split. The splits are then the mapping's keys.
    local_dir: a local copy of the repository, laid out as on the Hub (what
      `hf download --repo-type dataset <repo_id> --local-dir DIR` writes): each split is read
      from `local_dir/files[split]`. Used instead of the Hub; `path` wins over it.
    cache_dir: the Hub cache (default `HF_HUB_CACHE`, else huggingface_hub's default).
    instruction: appended to every question on its own line ("" for none).
    verify_timeout_s: `math_verify`'s own time limit, in whole seconds, when `reward` is called
      in the caller's process; the worker pool enforces `rewards_for`'s `timeout_s` on top.
  """

  split_names: ClassVar[tuple[str, ...]]
  columns: ClassVar[tuple[str, ...]]

  repo_id: str = ""
  revision: str = "main"
  files: Mapping[str, str] = dataclasses.field(default_factory=dict)
  path: str | os.PathLike[str] | Mapping[str, str | os.PathLike[str]] | None = None
  local_dir: str | None = None
  cache_dir: str | None = None
  instruction: str = DEFAULT_INSTRUCTION
  verify_timeout_s: int = 5
  _rows: dict[str, list[dict[str, Any]]] = dataclasses.field(
    init=False, repr=False, compare=False)
  _sources: dict[str, dict[str, str]] = dataclasses.field(init=False, repr=False, compare=False)
  dropped_rows: dict[str, int] = dataclasses.field(init=False, repr=False, compare=False)

  def __post_init__(self):
    object.__setattr__(self, "files", dict(self.files))
    if self.path is None and self.local_dir:
      object.__setattr__(self, "path", {split: os.path.join(os.fspath(self.local_dir), f)
                                        for split, f in self.files.items()})
    if self.path is not None:
      object.__setattr__(self, "path", self._local_paths(self.path))
    sources = self._locate()
    rows, dropped = {}, {}
    for split, source in sources.items():
      rows[split], dropped[split] = [], 0
      for where, row in files.read_records(source["file"], self.columns):
        record = self._convert(row, where)
        if record is None:
          dropped[split] += 1
        else:
          rows[split].append(record)
      source["sha256"] = files.file_sha256(source["file"])
    object.__setattr__(self, "_rows", rows)
    object.__setattr__(self, "_sources", sources)
    object.__setattr__(self, "dropped_rows", dropped)

  def _local_paths(self, path) -> dict[str, str]:
    if not isinstance(path, Mapping):
      if len(self.split_names) != 1:
        raise ValueError(
          f"task {self.name!r}: path must map splits ({', '.join(self.split_names)}) to files, "
          f"e.g. {{'train': 'train.parquet'}}; got the single file {os.fspath(path)!r}")
      path = {self.split_names[0]: path}
    if not path:
      raise ValueError(f"task {self.name!r}: path must map at least one split to a file")
    unknown = sorted(set(path) - set(self.split_names))
    if unknown:
      raise ValueError(f"task {self.name!r}: path has unknown split(s) {unknown}; expected "
                       f"{', '.join(self.split_names)}")
    # Plain strings keep the knobs JSON-able.
    return {split: os.fspath(p) for split, p in path.items()}

  def _locate(self) -> dict[str, dict[str, str]]:
    """Per split: the local file to read, and where it came from."""
    if self.path is not None:
      return {split: {"file": p, "path": p} for split, p in sorted(self.path.items())}
    unknown = sorted(set(self.files) - set(self.split_names))
    if unknown or not self.files:
      raise ValueError(f"task {self.name!r}: files must map split(s) among "
                       f"{', '.join(self.split_names)} to files of {self.repo_id!r}; got "
                       f"{self.files}")
    sources = {}
    for split, filename in sorted(self.files.items()):
      local = fetch_dataset_file(self.repo_id, filename, revision=self.revision,
                                 cache_dir=self.cache_dir)
      sources[split] = {"file": local, "repo_id": self.repo_id, "revision": self.revision,
                        "filename": filename}
    return sources

  def _convert(self, row: Mapping[str, Any], where: str) -> dict[str, Any] | None:
    """`{"question", "answer", "demonstration", "meta"}` from one row, or `None` to drop it."""
    raise NotImplementedError

  @property
  def splits(self) -> list[str]:
    return sorted(self._rows)

  def num_examples(self, split: str) -> int:
    return len(self._split_rows(split))

  def fingerprint(self) -> dict[str, Any]:
    # The source and content of every file, and what shapes the prompt; not the cache location
    # or the verifier's time limit, which do not change the examples.
    sources = {split: {k: v for k, v in source.items() if k != "file"}
               for split, source in sorted(self._sources.items())}
    return {"task": self.name, "instruction": self.instruction, "sources": sources}

  def make_example(self, split: str, index: int) -> dict[str, Any]:
    rows = self._split_rows(split)
    if not 0 <= index < len(rows):
      raise IndexError(f"example {index} of split {split!r} is out of range [0, {len(rows)})")
    row = rows[index]
    prompt = row["question"].rstrip() + "\n"
    if self.instruction:
      prompt += self.instruction + "\n"
    return base.make_record(self.name, index, prompt, row["answer"], row["demonstration"],
                            row["meta"])

  def _split_rows(self, split: str) -> list[dict[str, Any]]:
    try:
      return self._rows[split]
    except KeyError:
      raise ValueError(f"unknown split {split!r}; task {self.name!r} has "
                       f"{', '.join(self.splits)}") from None


def _text(row: Mapping[str, Any], column: str, where: str) -> str:
  value = row[column]
  if isinstance(value, bool) or not isinstance(value, str | int | float):
    raise ValueError(f"{where}: column {column!r} must be a string (or a number), got "
                     f"{type(value).__name__}")
  return str(value)


def _meta(row: Mapping[str, Any], columns: tuple[str, ...]) -> dict[str, Any]:
  return {c: row[c] for c in columns if row.get(c) is not None}


@base.TASKS.register("gsm8k")
@dataclasses.dataclass(frozen=True)
class GSM8KTask(HubMathTask):
  """Grade-school word problems (GSM8K); the answer is a number. See the module docstring."""

  name = "gsm8k"
  split_names = ("train", "test")
  columns = ("question", "answer")

  repo_id: str = GSM8K_REPO
  files: Mapping[str, str] = dataclasses.field(default_factory=lambda: dict(GSM8K_FILES))

  def _convert(self, row: Mapping[str, Any], where: str) -> dict[str, Any]:
    question, worked = _text(row, "question", where), _text(row, "answer", where)
    solution, marker, _ = worked.rpartition("####")
    answer = math_answers.gsm8k_gold(worked)
    if not marker or math_answers.parse_number(answer) is None:
      raise ValueError(f"{where}: column 'answer' must end in '#### <number>' (GSM8K's worked "
                       f"solution), got {worked[-80:]!r}")
    solution = _CALCULATOR_RE.sub("", solution).strip()
    final = f"The final answer is $\\boxed{{{answer}}}$."
    demonstration = f"{solution}\n{final}" if solution else final
    return {"question": question, "answer": answer, "demonstration": demonstration, "meta": {}}

  def reward(self, record: Mapping[str, Any], completion: str) -> base.Reward:
    return base.Reward(*math_answers.gsm8k_record_reward(record, completion))


@dataclasses.dataclass(frozen=True)
class MathVerifiedTask(HubMathTask):
  """A `HubMathTask` whose answers `math_verify` compares; scored in the worker pool."""

  def reward(self, record: Mapping[str, Any], completion: str) -> base.Reward:
    """Scores in this process; a `math_verify` time-out counts as wrong (0, 0)."""
    try:
      return base.Reward(*math_answers.math_record_reward(record, completion,
                                                          timeout_s=self.verify_timeout_s))
    except math_answers.AnswerTimeout:
      return base.Reward(0.0, 0.0)

  def pooled_verifier(self) -> Callable[[Mapping[str, Any], str], tuple[float, float]]:
    """`math_answers.math_record_reward`, for `rewards.verifiers.rewards_for`'s worker pool.

    `math_verify`'s own limit (`verify_timeout_s`) stays on inside the worker as a soft one:
    when it fires before the pool's, the worker survives and the sample is still a time-out.
    """
    return functools.partial(math_answers.math_record_reward, timeout_s=self.verify_timeout_s)


@base.TASKS.register("math")
@dataclasses.dataclass(frozen=True)
class MathTask(MathVerifiedTask):
  """Competition problems (MATH, the lighteval copy of the full set). See the module docstring."""

  name = "math"
  split_names = ("train", "test")
  columns = ("problem", "solution", "level", "type")

  repo_id: str = MATH_REPO
  files: Mapping[str, str] = dataclasses.field(default_factory=lambda: dict(MATH_FILES))

  def _convert(self, row: Mapping[str, Any], where: str) -> dict[str, Any] | None:
    solution = _text(row, "solution", where)
    answer = math_answers.last_boxed(solution)
    if answer is None:
      return None
    return {"question": _text(row, "problem", where), "answer": answer,
            "demonstration": solution.strip(), "meta": _meta(row, ("level", "type"))}


@base.TASKS.register("math500")
@dataclasses.dataclass(frozen=True)
class Math500Task(MathVerifiedTask):
  """The 500-problem MATH test subset of "Let's Verify Step by Step". See the module docstring."""

  name = "math500"
  split_names = ("test",)
  columns = ("problem", "solution", "answer", "subject", "level", "unique_id")

  repo_id: str = MATH500_REPO
  files: Mapping[str, str] = dataclasses.field(default_factory=lambda: dict(MATH500_FILES))

  def _convert(self, row: Mapping[str, Any], where: str) -> dict[str, Any]:
    return {"question": _text(row, "problem", where), "answer": _text(row, "answer", where),
            "demonstration": _text(row, "solution", where).strip(),
            "meta": _meta(row, ("level", "subject", "unique_id"))}
