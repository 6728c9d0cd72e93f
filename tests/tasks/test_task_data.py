"""The tfds builder (ArrayRecord, no TensorFlow) and the grain loader: determinism, sharding,
exact resume, and files taking the same path."""

import json
import pathlib
import sys
import tempfile

import grain
import numpy as np
import pytest
import tensorflow_datasets as tfds

from jaxrl_post.tasks import RECORD_FIELDS, get_task
from jaxrl_post.tasks import data as task_data

SIZES = {"train": 48, "test": 8}
# Few threads: the CI machines have two cores.
READ = grain.ReadOptions(num_threads=2, prefetch_buffer_size=8)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  tfds.disable_progress_bar()
  return str(tmp_path_factory.mktemp("tfds"))


@pytest.fixture(scope="module")
def builder(data_dir):
  return task_data.prepare_task_dataset(get_task("countdown"), data_dir, num_examples=SIZES)


def _loader(source, **kwargs):
  kwargs = {"batch_size": 4, "seed": 7, "shard_index": 0, "shard_count": 1, **kwargs}
  return task_data.make_loader(source, read_options=READ, **kwargs)


def _take(iterator, n):
  return [next(iterator) for _ in range(n)]


def _modification_times(directory):
  return {p.name: p.stat().st_mtime_ns for p in pathlib.Path(str(directory)).iterdir()}


def _assert_same_batches(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    assert list(x) == list(y)
    for key in x:
      np.testing.assert_array_equal(x[key], y[key])


def test_builder_writes_array_record_without_tensorflow(builder, data_dir):
  assert builder.info.splits["train"].num_examples == SIZES["train"]
  assert builder.info.splits["test"].num_examples == SIZES["test"]
  files = sorted(p.name for p in builder.data_path.iterdir())
  assert any(".array_record-" in name and "-train." in name for name in files), files
  assert builder.info.metadata["fingerprint"]["task"] == "countdown"
  assert builder.data_path.is_relative_to(data_dir)
  source = builder.as_data_source("train")
  assert len(source) == SIZES["train"]
  source[0]
  # Writing and reading went through tfds' own serialisation, never TensorFlow.
  assert "tensorflow" not in sys.modules


def test_stored_records_equal_the_generated_ones(builder):
  task = get_task("countdown")
  for split, size in SIZES.items():
    source = builder.as_data_source(split)
    stored = [task_data.to_record(source[i]) for i in range(size)]
    assert sorted(r["index"] for r in stored) == list(range(size))
    for record in stored:
      assert record == task.make_example(split, record["index"])


def test_prepared_dataset_is_reused_and_keyed_by_knobs(builder, data_dir):
  files = _modification_times(builder.data_path)
  again = task_data.prepare_task_dataset(get_task("countdown"), data_dir, num_examples=SIZES)
  assert again.data_path == builder.data_path
  assert _modification_times(again.data_path) == files
  other = task_data.TaskRecords(get_task("countdown", seed=1), num_examples=SIZES,
                                data_dir=data_dir)
  assert other.data_path != builder.data_path
  # A prepared directory opens without the task object.
  reopened = tfds.builder_from_directory(str(builder.data_path))
  assert len(reopened.as_data_source("test")) == SIZES["test"]


def test_building_leaves_no_temporary_files(data_dir, tmp_path, monkeypatch):
  # tfds' default DatasetInfo makes an (empty) temporary directory for every new builder.
  monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
  task_data.prepare_task_dataset(get_task("format", seed=5), data_dir, num_examples={"a": 2})
  assert list(tmp_path.iterdir()) == []


def test_split_sizes_are_required_and_checked(data_dir, tmp_path):
  with pytest.raises(ValueError, match="generates any number of examples; pass num_examples"):
    task_data.TaskRecords(get_task("arith"), data_dir=data_dir)
  path = tmp_path / "two.jsonl"
  path.write_text('{"question": "a", "answer": "1"}\n{"question": "b", "answer": "2"}\n')
  with pytest.raises(ValueError, match=r"num_examples\['train'\] = 3 .* has 2"):
    task_data.TaskRecords(get_task("jsonl", path=str(path)), num_examples={"train": 3},
                          data_dir=data_dir)


def test_batches_are_columns(builder):
  batch = next(iter(_loader(builder.as_data_source("train"))))
  assert set(batch) == set(RECORD_FIELDS)
  assert batch["index"].dtype == np.int64 and batch["index"].shape == (4,)
  assert batch["prompt"].dtype == object and isinstance(batch["prompt"][0], str)
  task = get_task("countdown")
  correct, fmt = task.reward_batch(batch, list(batch["demonstration"]))
  np.testing.assert_array_equal(correct, 1.0)
  np.testing.assert_array_equal(fmt, 1.0)


def test_loader_is_deterministic_and_shuffles_each_epoch(builder):
  source = builder.as_data_source("train")
  first = _take(iter(_loader(source)), 24)  # Two epochs of 12 batches.
  _assert_same_batches(first, _take(iter(_loader(source)), 24))
  epochs = [np.concatenate([b["index"] for b in first[e * 12 : (e + 1) * 12]]) for e in (0, 1)]
  for order in epochs:
    assert sorted(order) == list(range(SIZES["train"]))  # Each epoch: every record once.
  assert not np.array_equal(epochs[0], epochs[1])  # Reshuffled.
  other_seed = np.concatenate([b["index"] for b in _take(iter(_loader(source, seed=8)), 12)])
  assert not np.array_equal(other_seed, epochs[0])
  stored_order = np.concatenate(
    [b["index"] for b in _take(iter(_loader(source, shuffle=False)), 12)]
  )
  assert [int(source[i]["index"]) for i in range(SIZES["train"])] == list(stored_order)


def test_finite_epochs_and_remainders(builder):
  source = builder.as_data_source("test")  # 8 records.
  batches = list(_loader(source, batch_size=3, num_epochs=1, drop_remainder=False))
  assert [len(b["index"]) for b in batches] == [3, 3, 2]
  assert [len(b["index"]) for b in _loader(source, batch_size=3, num_epochs=2)] == [3] * 5


def test_process_shards_partition_the_data(builder):
  source = builder.as_data_source("train")
  shards = [
    np.concatenate([b["index"] for b in _loader(source, shard_index=k, shard_count=2,
                                                 num_epochs=1)])
    for k in (0, 1)
  ]
  assert len(shards[0]) == len(shards[1]) == SIZES["train"] // 2
  assert not set(shards[0]) & set(shards[1])
  assert sorted(np.concatenate(shards)) == list(range(SIZES["train"]))


def test_uneven_shards():
  source = task_data.TaskSource(get_task("format"), "train", 11)
  for even_shards, sizes in ((True, [3, 3, 3]), (False, [4, 4, 3])):
    shards = [
      np.concatenate([b["index"] for b in _loader(source, batch_size=1, num_epochs=1,
                                                   shard_index=k, shard_count=3,
                                                   even_shards=even_shards)])
      for k in range(3)
    ]
    assert [len(s) for s in shards] == sizes
    everything = np.concatenate(shards)
    assert len(set(everything)) == len(everything)  # Disjoint.
    # Evening out drops the last records: a remainder of 11 % 3 = 2.
    assert set(everything) == set(range(9 if even_shards else 11))


def test_default_shard_is_this_process(builder):
  import jax

  source = builder.as_data_source("train")
  expected = _take(iter(_loader(source, shard_index=jax.process_index(),
                                shard_count=jax.process_count())), 3)
  loader = task_data.make_loader(source, batch_size=4, seed=7, read_options=READ)
  _assert_same_batches(_take(iter(loader), 3), expected)


@pytest.mark.parametrize("consumed", [1, 5, 14])  # 14 batches cross an epoch boundary.
def test_state_restore_continues_exactly(builder, consumed):
  source = builder.as_data_source("train")
  iterator = iter(_loader(source, shard_index=1, shard_count=2))
  _take(iterator, consumed)
  state = iterator.get_state()
  saved = json.loads(json.dumps(state))  # A checkpoint stores it as JSON.
  expected = _take(iterator, 9)

  resumed = iter(_loader(source, shard_index=1, shard_count=2))
  resumed.set_state(saved)
  _assert_same_batches(_take(resumed, 9), expected)


def test_task_source_matches_generation_and_feeds_the_loader():
  task = get_task("arith", max_digits=2)
  source = task_data.TaskSource(task, "train", 10)
  assert len(source) == 10 and source[3] == task.make_example("train", 3)
  with pytest.raises(IndexError):
    source[10]
  batches = list(_loader(source, batch_size=5, num_epochs=1))
  assert sorted(np.concatenate([b["index"] for b in batches])) == list(range(10))


def test_a_jsonl_file_takes_the_same_path(data_dir, tmp_path):
  rows = [{"question": f"What is {i}+{i}?", "answer": f"{i}+{i}={2 * i}\n#### {2 * i}"}
          for i in range(6)]
  path = tmp_path / "qa.jsonl"
  path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
  task = get_task("jsonl", path={"train": str(path)})
  builder = task_data.prepare_task_dataset(task, data_dir)
  assert builder.info.splits["train"].num_examples == 6
  batches = list(_loader(builder.as_data_source("train"), batch_size=3, num_epochs=1))
  prompts = sorted(p for b in batches for p in b["prompt"])
  assert prompts == sorted(f"Q: {r['question']}\n" for r in rows)
  for batch in batches:
    correct, _ = task.reward_batch(batch, [f"#### {a}" for a in batch["answer"]])
    np.testing.assert_array_equal(correct, 1.0)


@pytest.mark.parametrize(
  "kwargs, match",
  [
    ({"batch_size": 0}, "batch_size"),
    ({"shard_index": 2, "shard_count": 2}, "shard_index < shard_count"),
    ({"shard_index": 0, "shard_count": 100}, "shard 0 of 100 is empty"),
  ],
)
def test_loader_argument_errors(builder, kwargs, match):
  with pytest.raises(ValueError, match=match):
    _loader(builder.as_data_source("test"), **kwargs)


def _indices(batch):
  return [int(i) for i in batch["index"]]


def test_sharded_loader_global_batch_does_not_depend_on_the_process_count():
  # 4 logical shards: one process reading all four gives the same global
  # batches, in the same order, as two processes reading two each and
  # concatenating in process order (what allgather_records does).
  source = [{"index": i, "prompt": str(i)} for i in range(64)]
  one = iter(task_data.ShardedLoader(source, global_batch_size=8, num_shards=4, seed=3,
                                     process_index=0, process_count=1))
  two = [iter(task_data.ShardedLoader(source, global_batch_size=8, num_shards=4, seed=3,
                                      process_index=p, process_count=2)) for p in range(2)]
  seen = []
  for _ in range(5):
    whole = _indices(next(one))
    assert whole == sum((_indices(next(it)) for it in two), [])
    seen += whole
  assert len(set(seen[:64])) == len(seen[:64])  # no record twice within an epoch
  # Shard s holds records s, s + 4, ...: 2 rows per shard per step.
  assert sorted(i % 4 for i in whole) == [0, 0, 1, 1, 2, 2, 3, 3]
  # One shard's position is the state of all of them; a restore continues exactly.
  state = one.get_state()
  expected = _indices(next(one))
  again = iter(task_data.ShardedLoader(source, global_batch_size=8, num_shards=4, seed=3,
                                       process_index=0, process_count=1))
  again.set_state(state)
  assert _indices(next(again)) == expected


@pytest.mark.parametrize("kwargs, match", [
  (dict(num_shards=3, process_count=2, process_index=0), "multiple of the 2 processes"),
  (dict(num_shards=4, global_batch_size=6), "does not split into config.data_shards=4"),
])
def test_sharded_loader_errors_name_the_config_key(kwargs, match):
  source = [{"index": i, "prompt": str(i)} for i in range(64)]
  kwargs = dict(dict(global_batch_size=8, seed=0, process_index=0, process_count=1), **kwargs)
  with pytest.raises(ValueError, match=match):
    task_data.ShardedLoader(source, **kwargs)


def test_weighted_loader_follows_the_prior_resumes_and_splits_over_processes():
  source = task_data.TaskSource(get_task("countdown"), "train", 20)
  probs = np.zeros(20)
  probs[[2, 5, 7, 11]] = [4.0, 3.0, 2.0, 1.0]
  loader = task_data.WeightedLoader(source, global_batch_size=2, probs=probs, seed=3,
                                    process_index=0, process_count=1)
  batches = [next(loader) for _ in range(400)]
  drawn = np.concatenate([b["index"] for b in batches])
  assert set(drawn) <= {2, 5, 7, 11}
  assert all(len(set(b["index"])) == 2 for b in batches)  # without replacement in a batch
  freq = np.bincount(drawn, minlength=20)[[2, 5, 7, 11]] / len(drawn)
  assert freq[0] > freq[1] > freq[2] > freq[3] > 0  # the prior's order
  # Records are the pool's own, with every field.
  assert batches[0]["prompt"][0] == source[int(batches[0]["index"][0])]["prompt"]
  # Resume: a fresh loader set to the saved state continues exactly.
  state = loader.get_state()
  follow = [next(loader)["index"].tolist() for _ in range(3)]
  again = task_data.WeightedLoader(source, global_batch_size=2, probs=probs, seed=3,
                                   process_index=0, process_count=1)
  again.set_state(state)
  assert [next(again)["index"].tolist() for _ in range(3)] == follow
  # Two processes read the two halves of the one-process global batch.
  whole = task_data.WeightedLoader(source, global_batch_size=4, seed=1, process_index=0,
                                   process_count=1)
  halves = [task_data.WeightedLoader(source, global_batch_size=4, seed=1, process_index=p,
                                     process_count=2) for p in (0, 1)]
  for _ in range(3):
    assert next(whole)["index"].tolist() == sum((next(h)["index"].tolist() for h in halves), [])
  # A new prior takes effect at the next draw.
  loader.set_probs(np.eye(20)[0] + np.eye(20)[1])
  assert sorted(next(loader)["index"].tolist()) == [0, 1]


@pytest.mark.parametrize("kwargs, match", [
  ({"probs": np.ones(3)}, r"probs has shape \(3,\)"),
  ({"probs": -np.ones(20)}, "non-negative"),
  ({"probs": np.eye(20)[0]}, "needs that many"),
  ({"global_batch_size": 3, "process_count": 2}, "3 records does not split into 2"),
])
def test_weighted_loader_errors(kwargs, match):
  source = task_data.TaskSource(get_task("countdown"), "train", 20)
  kwargs = {"global_batch_size": 2, "process_index": 0, "process_count": 1, **kwargs}
  with pytest.raises(ValueError, match=match):
    task_data.WeightedLoader(source, **kwargs)
