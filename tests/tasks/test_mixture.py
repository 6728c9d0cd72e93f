"""The "mixture" task: index space, labels, reward delegation, loaders and the quota sampler."""

import collections
import doctest

import ml_collections
import numpy as np
import pytest

from jaxrl_post.tasks import base, get_task, mixture
from jaxrl_post.tasks import data as task_data
from jaxrl_post.tasks.domain_quota import DomainQuotaSampler
from jaxrl_post.tasks.mixture import DEFAULT_COMPONENTS, MixtureTask


def test_doctests():
  result = doctest.testmod(mixture)
  assert result.attempted >= 2 and result.failed == 0


def test_cycle_interleaves_the_ratio_and_locate_inverts_index_of():
  task = get_task("mixture")
  assert isinstance(task, MixtureTask)
  assert task.domains == ("arith", "countdown", "format")
  assert task.weights == {"arith": 2.0, "countdown": 2.0, "format": 1.0}
  # 2 : 2 : 1 → cycle "arith countdown format arith countdown".
  assert [task.locate(i) for i in range(6)] == [
    ("arith", 0), ("countdown", 0), ("format", 0), ("arith", 1), ("countdown", 1), ("arith", 2)]
  seen = collections.defaultdict(list)
  for i in range(1003):
    domain, local = task.locate(i)
    assert task.index_of(domain, local) == i
    seen[domain].append(local)
  # Each domain's examples are its task's examples 0, 1, 2, ... in order: no gaps, no repeats.
  assert all(v == list(range(len(v))) for v in seen.values())
  assert task.pool_sizes(1003) == {d: len(v) for d, v in seen.items()} == {
    "arith": 401, "countdown": 401, "format": 201}  # 200 cycles + "arith countdown format"


def test_records_carry_the_domain_and_rewards_delegate_to_it():
  task = get_task("mixture")
  for i in range(10):
    record = task.make_example("train", i)
    assert tuple(record) == base.RECORD_FIELDS  # the stored row format: tfds can write it
    domain, local = task.locate(i)
    assert task.domain_of(record) == domain and record["index"] == i
    inner = task.task_of(domain).make_example("train", local)
    assert (record["prompt"], record["answer"]) == (inner["prompt"], inner["answer"])
    assert record == task.make_domain_example(domain, "train", local)
    assert task.reward(record, record["demonstration"]) == (1.0, 1.0)
    assert task.reward(record, "garbage") == task.task_of(domain).reward(inner, "garbage")
  with pytest.raises(ValueError, match="unknown domain 'math'; known domains: 'arith'"):
    task.make_domain_example("math", "train", 0)
  with pytest.raises(ValueError, match="no domain label"):
    task.reward(get_task("arith").make_example("train", 0), "#### 1")


def test_knobs_from_a_config_dict_and_validation():
  knobs = ml_collections.ConfigDict(dict(components=dict(
    format=dict(task="format", weight=0.5, knobs=dict(max_repeats=2)),
    arith=dict(task="arith", weight=1.5))))
  task = get_task("mixture", **dict(knobs))
  assert task.domains == ("arith", "format")
  assert task.knobs()["components"]["format"]["knobs"] == {"max_repeats": 2}
  assert get_task("mixture", **task.knobs()) == task
  assert hash(task) == hash(get_task("mixture", **task.knobs()))
  # Fractional weights: a cycle of 100 slots, 75 : 25, spread evenly.
  assert task.pool_sizes(100) == {"arith": 75, "format": 25}
  assert task.pool_sizes(4) == {"arith": 3, "format": 1}
  for bad, match in [
    ({"a": {"task": "nope"}}, "domain 'a': unknown task 'nope'"),
    ({"a": {"task": "mixture"}}, "cannot contain a mixture"),
    ({"a": {"task": "arith", "weight": -1}}, "weight must be finite and >= 0"),
    ({"a": {"task": "arith", "knobs": {"digits": 3}}}, "domain 'a': task 'arith' has no knob"),
    ({"a": {"task": "arith", "wieght": 1}}, "unknown key"),
    ({"a": {"task": "arith", "weight": 0}}, "at least one domain needs a positive weight"),
  ]:
    with pytest.raises(ValueError, match=match):
      get_task("mixture", components=bad)


def test_sft_loader_and_quota_sampler_read_the_same_examples():
  task = get_task("mixture", components=DEFAULT_COMPONENTS)
  # experiments/sft.py's path: a TaskSource over the mixture with a shuffled grain loader.
  source = task_data.TaskSource(task, "train", 200)
  batch = next(iter(task_data.make_loader(source, batch_size=50, seed=0)))
  domains = [task.domain_of({"meta": m}) for m in batch["meta"]]
  assert set(domains) == set(task.domains)
  # experiments/opd.py's path: exact quotas per batch over the same per-domain pools.
  sampler = DomainQuotaSampler(task.weights, pool_sizes=task.pool_sizes(200), batch_size=10,
                               seed=0)
  drawn = sampler.next_batch()
  assert collections.Counter(drawn["domain"]) == {"arith": 4, "countdown": 4, "format": 2}
  for d, j in zip(drawn["domain"], drawn["index"]):
    record = task.make_domain_example(d, "train", int(j))
    assert record == source[record["index"]]  # the same example through either path
    assert record["index"] < 200


def test_tfds_builder_stores_mixture_records(tmp_path):
  task = get_task("mixture")
  builder = task_data.prepare_task_dataset(task, str(tmp_path), num_examples={"test": 7})
  stored = builder.as_data_source("test")
  records = [task_data.to_record(stored[i]) for i in range(7)]
  assert sorted(r["index"] for r in records) == list(range(7))  # tfds shuffles on write
  for record in records:
    assert record == task.make_example("test", record["index"])
  assert np.isclose(task.reward(record, record["demonstration"]).correct, 1.0)
