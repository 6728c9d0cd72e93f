"""Task records on disk (a tfds builder writing ArrayRecord) and a resumable grain loader.

  task = get_task("countdown", num_numbers=4)
  builder = prepare_task_dataset(task, data_dir, num_examples={"train": 100_000, "test": 1000})
  loader = make_loader(builder.as_data_source("train"), batch_size=64, seed=0)
  it = iter(loader)
  batch = next(it)                # {"prompt": object array [64], ..., "index": int64 [64]}
  state = it.get_state()          # JSON-able; goes into the checkpoint
  it.set_state(state)             # on resume, on a fresh `iter(loader)`

`TaskRecords` is a `tfds.core.GeneratorBasedBuilder` with plain `Text` and `Scalar` features,
written with `file_format="array_record"`. Neither writing nor reading imports TensorFlow
(the tests check): tfds serialises these features without it, and `as_data_source` reads the
files back as a random-access source that decodes to numpy. The same builder stores
file-backed tasks (`"jsonl"`, `"parquet"`), so GSM8K-style data takes the same path. A
prepared directory can be reopened without the task object with `tfds.builder_from_directory`.

`make_loader` is a `grain.MapDataset` pipeline: shard by process, shuffle (reshuffled every
epoch), repeat, batch. Its iterator's state is the position in that index space, so restoring
it into a fresh iterator continues exactly where the saved one stopped.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

import grain
import numpy as np
import tensorflow_datasets as tfds

from jaxrl_post.tasks import base

_TEXT_FIELDS = ("task", "prompt", "answer", "demonstration", "meta")


class TaskRecords(tfds.core.GeneratorBasedBuilder):
  """Writes a task's examples as tfds splits of records (see `base` for the fields).

  One builder config per task fingerprint (knobs, source-file digests) and split sizes, named
  `<task>-<digest>`, so different knobs never share a directory and a prepared one is reused.
  """

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Records: task, index, prompt, answer, demonstration, meta."}

  def __init__(
    self,
    task: base.Task,
    *,
    num_examples: Mapping[str, int] | None = None,
    file_format: str = "array_record",
    **kwargs: Any,
  ):
    """Sets up the builder; `download_and_prepare()` writes the files.

    Args:
      task: the task whose examples to store.
      num_examples: examples per split, e.g. `{"train": 10_000, "test": 500}`: required for
        generated tasks, optional for file-backed ones (default: every row of every split).
      file_format: tfds file format; `"array_record"` gives random access without TensorFlow.
      **kwargs: for `tfds.core.GeneratorBasedBuilder`, e.g. `data_dir`.
    """
    self._task = task
    self._split_sizes = _split_sizes(task, num_examples)
    self._fingerprint = {**task.fingerprint(), "num_examples": self._split_sizes}
    text = json.dumps(self._fingerprint, sort_keys=True)
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
    config = tfds.core.BuilderConfig(name=f"{task.name}-{digest}", description=text)
    super().__init__(config=config, file_format=file_format, **kwargs)

  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls) -> None:
    # tfds looks for a checksums file next to the builder's module; there is none, as nothing
    # is downloaded. Saying so also skips tfds' lookup of that module through the
    # `importlib_resources` backport, which it imports but does not require.
    return None

  def _info(self) -> tfds.core.DatasetInfo:
    return _LocalDatasetInfo(
      builder=self,
      description=f"Records of the {self._task.name!r} task of jaxrl_post.tasks.",
      features=tfds.features.FeaturesDict({
        **{name: tfds.features.Text() for name in _TEXT_FIELDS},
        "index": tfds.features.Scalar(dtype=np.int64),
      }),
      metadata=tfds.core.MetadataDict(fingerprint=self._fingerprint),
    )

  def _split_generators(self, dl_manager: tfds.download.DownloadManager) -> dict[str, Any]:
    del dl_manager  # Everything is generated or read locally.
    return {split: self._generate_examples(split, n) for split, n in self._split_sizes.items()}

  def _generate_examples(self, split: str, num_examples: int):
    for index in range(num_examples):
      yield index, self._task.make_example(split, index)


class _LocalDatasetInfo(tfds.core.DatasetInfo):
  """Dataset info that never looks for published metadata of a locally generated dataset."""

  def initialize_from_bucket(self) -> None:
    # tfds would look up gs://tfds-data for precomputed info, which cannot exist for these
    # datasets, and leave an empty temporary directory behind on every new builder.
    pass


def prepare_task_dataset(
  task: base.Task,
  data_dir: str,
  *,
  num_examples: Mapping[str, int] | None = None,
) -> TaskRecords:
  """Writes the task's splits under `data_dir` unless already there, and returns the builder."""
  builder = TaskRecords(task, num_examples=num_examples, data_dir=data_dir)
  builder.download_and_prepare()
  return builder


class TaskSource:
  """A split generated on the fly, with the random-access interface of a stored one.

  For quick experiments without writing files; records equal the stored ones. `indices`
  (optional) keeps only those examples of the split, in that order (e.g. the prompts that fit
  the sampler), renumbered 0 … len − 1 for the loader; the records keep their own `index`.
  """

  def __init__(self, task: base.Task, split: str, num_examples: int,
               indices: Sequence[int] | None = None):
    self._task = task
    self._split = split
    self._indices = None if indices is None else np.asarray(indices, np.int64)
    self._num_examples = num_examples if indices is None else len(self._indices)

  def __len__(self) -> int:
    return self._num_examples

  def __getitem__(self, index: int) -> dict[str, Any]:
    if not 0 <= index < self._num_examples:
      raise IndexError(f"index {index} out of range [0, {self._num_examples})")
    example = int(index) if self._indices is None else int(self._indices[index])
    return self._task.make_example(self._split, example)


def make_loader(
  source: Sequence[Mapping[str, Any]],
  *,
  batch_size: int,
  seed: int = 0,
  shuffle: bool = True,
  num_epochs: int | None = None,
  shard_index: int | None = None,
  shard_count: int | None = None,
  even_shards: bool = True,
  drop_remainder: bool = True,
  read_options: grain.ReadOptions | None = None,
) -> grain.IterDataset:
  """A grain pipeline of record batches over a random-access source.

  Args:
    source: records by index: `builder.as_data_source(split)` or a `TaskSource`.
    batch_size: records per batch on this process.
    seed: shuffle seed in `[0, 2**32)`; epoch `e` is shuffled with `seed + e`.
    shuffle: shuffle globally (within this process's shard) every epoch.
    num_epochs: passes over the data; `None` repeats forever.
    shard_index: this process's shard; defaults to `jax.process_index()`.
    shard_count: the number of shards; defaults to `jax.process_count()`.
    even_shards: drop the last `len(source) % shard_count` records so all shards are the same
      size: a process with one batch more than the others would wait forever in a collective.
    drop_remainder: drop a last, smaller batch, so that jitted steps see one shape.
    read_options: grain's reading threads and prefetch buffer.

  Returns:
    A `grain.IterDataset`; `iter()` gives an iterator with `get_state` / `set_state`. Batches
    are dicts: `index` an `int64 [batch]` array, text fields `object [batch]` arrays of str.
  """
  if batch_size < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}")
  if shard_index is None or shard_count is None:
    import jax  # Deferred: only the default needs it.

    shard_index = jax.process_index() if shard_index is None else shard_index
    shard_count = jax.process_count() if shard_count is None else shard_count
  if not 0 <= shard_index < shard_count:
    raise ValueError(f"need 0 <= shard_index < shard_count, got {shard_index}, {shard_count}")

  dataset = grain.MapDataset.source(source)
  if even_shards:
    dataset = dataset[: len(dataset) - len(dataset) % shard_count]
  # Shard before shuffling, so the shards partition the data whatever the seed.
  dataset = dataset[shard_index::shard_count]
  if len(dataset) == 0:
    raise ValueError(f"shard {shard_index} of {shard_count} is empty ({len(source)} records)")
  if shuffle:
    dataset = dataset.shuffle(seed=seed)
  dataset = dataset.repeat(num_epochs)
  dataset = dataset.map(to_record)
  dataset = dataset.batch(batch_size, drop_remainder=drop_remainder, batch_fn=collate_records)
  return dataset.to_iter_dataset(read_options)


def to_record(raw: Mapping[str, Any]) -> dict[str, Any]:
  """A record with Python values, whether it comes from tfds (bytes, numpy) or a task."""
  record = {}
  for key, value in raw.items():
    if isinstance(value, bytes):
      value = value.decode("utf-8")
    elif isinstance(value, np.integer):
      value = int(value)
    record[key] = value
  return record


def collate_records(records: Sequence[Mapping[str, Any]]) -> dict[str, np.ndarray]:
  """Records to columns: `int64` arrays for ints, `object` arrays of str for text."""
  batch = {}
  for key in records[0]:
    values = [r[key] for r in records]
    dtype = np.int64 if isinstance(values[0], int) else object
    column = np.empty(len(values), dtype)
    column[:] = values  # Filled in place: `np.array` would try to nest sequences of str.
    batch[key] = column
  return batch


def _split_sizes(task: base.Task, num_examples: Mapping[str, int] | None) -> dict[str, int]:
  """Examples per split: given ones checked against the task's sizes, or all of a file task."""
  if num_examples is None:
    splits = task.splits
    if splits is None:
      raise ValueError(
        f"task {task.name!r} generates any number of examples; pass num_examples, e.g. "
        "{'train': 10000, 'test': 500}"
      )
    return {split: task.num_examples(split) for split in splits}
  sizes = {}
  for split, n in num_examples.items():
    available = task.num_examples(split)
    if n < 1 or (available is not None and n > available):
      bound = "" if available is None else f" (split {split!r} has {available})"
      raise ValueError(f"num_examples[{split!r}] = {n} must be >= 1 and fit the split{bound}")
    sizes[split] = int(n)
  return sizes


class ShardedLoader:
  """A global batch made of `num_shards` logical data shards; this process reads its own.

  The data order of a run depends on `num_shards`, not on how many processes
  read it: logical shard s (`make_loader(..., shard_index=s, shard_count=num_shards)`)
  yields `global_batch_size / num_shards` records per step, and the global
  batch is shard 0's records, then shard 1's, and so on. Process p reads the
  shards p·k ... p·k + k − 1 (k = num_shards / process_count), so
  concatenating the processes' batches in process order
  (`parallel.multihost.allgather_records`) gives the same global batch as one
  process reading every shard. That is what makes a 2-process run comparable
  with a 1-process run step for step.

  `iter()` gives an iterator with `get_state` / `set_state`; all shards
  advance together, so one shard's position is the state of all of them.
  """

  def __init__(self, source: Sequence[Mapping[str, Any]], *, global_batch_size: int,
               num_shards: int = 0, seed: int = 0, process_index: int | None = None,
               process_count: int | None = None):
    if process_index is None or process_count is None:
      import jax  # Deferred, as in make_loader.

      process_index = jax.process_index() if process_index is None else process_index
      process_count = jax.process_count() if process_count is None else process_count
    num_shards = num_shards or process_count
    if num_shards % process_count:
      raise ValueError(f"config.data_shards={num_shards} must be a multiple of the "
                       f"{process_count} processes")
    if global_batch_size % num_shards:
      raise ValueError(f"the global batch of {global_batch_size} records does not split into "
                       f"config.data_shards={num_shards} equal shards")
    per_process = num_shards // process_count
    self.num_shards = num_shards
    self.shards = tuple(range(process_index * per_process, (process_index + 1) * per_process))
    self._loaders = [
      make_loader(source, batch_size=global_batch_size // num_shards, seed=seed,
                  shard_index=s, shard_count=num_shards) for s in self.shards]

  def __iter__(self) -> _ShardedIterator:
    return _ShardedIterator([iter(loader) for loader in self._loaders])


class _ShardedIterator:

  def __init__(self, iterators):
    self._iterators = iterators

  def __next__(self) -> dict[str, np.ndarray]:
    batches = [next(it) for it in self._iterators]
    return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}

  def get_state(self) -> dict[str, Any]:
    return self._iterators[0].get_state()

  def set_state(self, state: Mapping[str, Any]) -> None:
    for iterator in self._iterators:
      iterator.set_state(dict(state))


class WeightedLoader:
  """Each step's global batch drawn from a probability vector over a pool of tasks.

  Task-sampling priors (TrajVal's learnability prior, arXiv 2608.09217; RAPO's risk buckets,
  arXiv 2608.03660) replace the shuffled pass over the data with a draw: step k's global batch
  is `global_batch_size` pool indices drawn without replacement (or with, `replace=True`) with
  probabilities `probs`, from a generator seeded by `(seed, k)`. Every process draws the same
  global batch and reads its own contiguous slice of it, so concatenating the processes' slices
  in process order (`parallel.multihost.allgather_records`) is the same batch at any process
  count, as with `ShardedLoader`.

  `set_probs` changes the prior between steps (a dynamic scheduler); the iterator state is the
  number of batches drawn (JSON), and the prior itself belongs to the method's checkpointed
  arrays.
  """

  def __init__(self, source: Sequence[Mapping[str, Any]], *, global_batch_size: int,
               probs: np.ndarray | None = None, seed: int = 0, replace: bool = False,
               process_index: int | None = None, process_count: int | None = None):
    if process_index is None or process_count is None:
      import jax  # Deferred, as in make_loader.

      process_index = jax.process_index() if process_index is None else process_index
      process_count = jax.process_count() if process_count is None else process_count
    if global_batch_size < 1 or global_batch_size % process_count:
      raise ValueError(f"the global batch of {global_batch_size} records does not split into "
                       f"{process_count} equal process slices")
    self.source, self.global_batch_size = source, global_batch_size
    self.seed, self.replace = seed, replace
    per_process = global_batch_size // process_count
    self._slice = slice(process_index * per_process, (process_index + 1) * per_process)
    self.draws = 0
    self.set_probs(np.full(len(source), 1.0 / len(source)) if probs is None else probs)

  def set_probs(self, probs, *, normalise: bool = True) -> None:
    """Replaces the prior: `probs [len(source)]`, non-negative, normalised here unless
    `normalise=False` (restoring a saved prior bit for bit: normalising again can move its last
    bits, and with them the draws)."""
    probs = np.asarray(probs, np.float64)
    if probs.shape != (len(self.source),):
      raise ValueError(f"probs has shape {probs.shape}; expected ({len(self.source)},), one "
                       "probability per task of the pool")
    if not np.all(np.isfinite(probs)) or np.any(probs < 0) or probs.sum() <= 0:
      raise ValueError("probs must be finite, non-negative and not all zero")
    if not self.replace and np.count_nonzero(probs) < self.global_batch_size:
      raise ValueError(f"probs gives {np.count_nonzero(probs)} tasks a non-zero probability; a "
                       f"batch of {self.global_batch_size} without replacement needs that many")
    if not normalise and abs(probs.sum() - 1.0) > 1e-9:
      raise ValueError(f"probs sums to {probs.sum()}, not 1, with normalise=False")
    self.probs = probs / probs.sum() if normalise else probs

  def global_indices(self, draw: int) -> np.ndarray:
    """The pool indices of the `draw`-th global batch (the same on every process)."""
    rng = np.random.default_rng([self.seed, draw])
    return rng.choice(len(self.source), size=self.global_batch_size, replace=self.replace,
                      p=self.probs)

  def __iter__(self) -> WeightedLoader:
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    indices = self.global_indices(self.draws)[self._slice]
    self.draws += 1
    return collate_records([to_record(self.source[int(i)]) for i in indices])

  def get_state(self) -> dict[str, Any]:
    return {"draws": self.draws}

  def set_state(self, state: Mapping[str, Any]) -> None:
    self.draws = int(state["draws"])
