"""The rollout producer, its buffer, staleness filter and resume position; weight sync."""

import threading
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from jaxrl_post.parallel.mesh import make_placement, mesh_config
from jaxrl_post.training import async_rollouts as ar


class FakeWeights:
  """`WeightSync`'s interface without arrays: versions only."""

  def __init__(self):
    self.lock, self.version = threading.Lock(), 0

  def publish(self, version):
    with self.lock:
      self.version = version

  def latest(self):
    with self.lock:
      return None, self.version


class Counter:
  """A data iterator over 0, 1, 2, ... with `get_state` / `set_state`, `size` records a draw."""

  def __init__(self, size=2):
    self.position, self.size = 0, size

  def draw(self):
    records = list(range(self.position, self.position + self.size))
    self.position += self.size
    return records

  def get_state(self):
    return {"position": self.position}


def _producer(options, data, weights, *, seed=0, first_index=1, fail_at=None):
  rng = np.random.default_rng(seed)

  def generate(params, records, index):
    if index == fail_at:
      raise ValueError("boom")
    time.sleep(float(rng.uniform(0, 0.004)))
    return {"records": np.asarray(records)}

  return ar.RolloutProducer(draw=data.draw, data_state=data.get_state, generate=generate,
                            weights=weights, options=options, first_index=first_index)


def _train(producer, weights, steps, *, sleep=0.0):
  """Takes a batch per step and publishes the next version; returns (versions, records)."""
  taken = []
  for step in range(1, steps + 1):
    batch, _ = producer.take(trainer_version=step - 1)
    taken.append((step, batch))
    time.sleep(sleep)
    weights.publish(step)
  return taken


def test_on_demand_batches_are_fresh_and_in_order():
  weights, data = FakeWeights(), Counter()
  producer = _producer(ar.RolloutOptions(mode="async", max_in_flight=0), data, weights)
  taken = _train(producer, weights, 5)
  producer.close()
  assert [b.version for _, b in taken] == [0, 1, 2, 3, 4]  # θ_{t-1}: synchronous
  assert [b.index for _, b in taken] == [1, 2, 3, 4, 5]
  assert [r for _, b in taken for r in b.records] == list(range(10))


def test_one_step_off_is_exactly_one_version_old_whatever_the_timing():
  for seed in range(3):
    weights, data = FakeWeights(), Counter()
    producer = _producer(ar.RolloutOptions(mode="one_step_off"), data, weights, seed=seed)
    taken = _train(producer, weights, 6, sleep=0.002 * seed)
    producer.close()
    assert [b.version for _, b in taken] == [0, 0, 1, 2, 3, 4]


@pytest.mark.parametrize("unused", ["drop", "retry"])
def test_no_batch_older_than_the_bound_is_handed_out(unused):
  for seed in range(4):
    weights, data = FakeWeights(), Counter()
    options = ar.RolloutOptions(mode="async", max_in_flight=3, max_weight_staleness=1,
                                unused=unused)
    producer = _producer(options, data, weights, seed=seed)
    taken = _train(producer, weights, 8, sleep=0.003)
    producer.close()
    counts, queued = dict(producer.counts), producer.retry_queued()
    assert all(step - 1 - b.version <= 1 for step, b in taken)
    used = [r for _, b in taken for r in b.records]
    assert len(used) == len(set(used))  # a prompt is never trained on twice
    drawn = set(range(data.position))
    buffered, retry = producer.waiting_records()
    waiting = set(buffered)
    if unused == "retry":  # a stale batch's prompts come back: none is lost
      assert counts.get("stale_drop", 0) == 0
      assert drawn == set(used) | waiting | set(retry)
      assert queued == len(retry) // 2
    else:  # dropped prompts are counted, whole batches of 2
      assert len(drawn - set(used) - waiting) == 2 * counts.get("stale_drop", 0)


def test_resume_position_is_before_the_oldest_unconsumed_batch():
  weights, data = FakeWeights(), Counter()
  producer = _producer(ar.RolloutOptions(mode="async", max_in_flight=2), data, weights)
  taken = _train(producer, weights, 3)
  deadline = time.time() + 30
  while producer.unconsumed() < 2 and time.time() < deadline:  # the producer refills 2 slots
    time.sleep(0.01)
  position = producer.resume_state()["position"]
  unconsumed = producer.unconsumed()
  producer.close()
  consumed = [r for _, b in taken for r in b.records]
  # Restoring `position` draws next exactly the first prompt not trained on.
  assert position == max(consumed) + 1 == 6
  assert unconsumed == 2


def test_a_producer_failure_reaches_the_trainer():
  weights, data = FakeWeights(), Counter()
  producer = _producer(ar.RolloutOptions(mode="one_step_off"), data, weights, fail_at=2)
  producer.take(trainer_version=0)
  with pytest.raises(RuntimeError, match="rollout producer failed"):
    producer.take(trainer_version=1)
  producer.close()


@pytest.mark.parametrize("section, match", [
  (dict(mode="fast"), "config.rollout.mode='fast'"),
  (dict(mode="async", max_weight_staleness=-1), "config.rollout.max_weight_staleness=-1"),
  (dict(mode="async", max_in_flight=-2), "config.rollout.max_in_flight=-2"),
  (dict(mode="async", unused="keep"), "config.rollout.unused='keep'"),
  (dict(mode="one_step_off", true_on_policy=True), "config.rollout.true_on_policy needs"),
  (dict(mode="one_step_off", max_weight_staleness=0), "drops every batch"),
  (dict(sync_bucket_mb=0), "config.rollout.sync_bucket_mb=0"),
  (dict(old_logp="engine"), "config.rollout.old_logp='engine'"),
  (dict(old_logp="sampler", true_on_policy=True), "needs config.rollout.old_logp='trainer'"),
  (dict(old_logp="sampler", loss=True), "config.loss.sampler_correction weights"),
  (dict(old_logp="detached", true_on_policy=True), "needs config.rollout.old_logp='trainer'"),
  (dict(sampler_process=True), "config.rollout.sampler_process=True samples in another"),
  (dict(mode="one_step_off", sampler_process=True, keep_versions=1),
   "config.rollout.keep_versions=1"),
  (dict(mode="async", sampler_process=True, sampler_env="CUDA_VISIBLE_DEVICES=1"),
   "config.rollout.sampler_env='CUDA_VISIBLE_DEVICES=1' must be a dict"),
])
def test_bad_options_name_the_key(section, match):
  loss = {"sampler_correction": "truncate"} if section.pop("loss", False) else {}
  config = ml_collections.ConfigDict({"rollout": section, "loss": loss})
  with pytest.raises(ValueError, match=match):
    ar.rollout_options(config)


def test_true_on_policy_check_is_bitwise_by_default():
  mask = np.array([[1, 1, 0]], bool)
  logp = np.array([[-1.0, -2.0, 0.0]], np.float32)
  assert ar.check_true_on_policy(logp, logp[:, :2], mask[:, :2], 0.0)[
    "on_policy_abs_diff_max"] == 0.0
  off = logp[:, :2] + np.float32(1e-6)
  with pytest.raises(RuntimeError, match="true_on_policy_tol=0.0"):
    ar.check_true_on_policy(logp, off, mask[:, :2], 0.0)
  assert ar.check_true_on_policy(logp, off, mask[:, :2], 1e-5)["on_policy_abs_diff_max"] > 0


def test_weight_sync_copies_in_buckets_and_verifies():
  placement = make_placement(mesh_config())
  params = nnx.state(nnx.Sequential(nnx.Linear(64, 64, use_bias=False, rngs=nnx.Rngs(0)),
                                    nnx.Linear(64, 8, rngs=nnx.Rngs(1))), nnx.Param)
  trainer = jax.tree.map(jnp.copy, params)
  sync = ar.WeightSync(placement.sample_mesh, placement.sample_rules, bucket_bytes=16 * 1024,
                       verify=True)
  metrics = sync.publish(trainer, version=3)
  assert metrics["sync/buckets"] == 2  # the 16 KiB kernel alone, then the 2 KiB one + bias
  copy, version = sync.latest()
  assert version == 3
  jax.tree.map(lambda x: x.delete(), jax.tree.leaves(trainer))  # what a donating update does
  for a, b in zip(jax.tree.leaves(copy), jax.tree.leaves(params)):
    np.testing.assert_array_equal(a, b)
  changed = jax.tree.map(lambda x: x + 1, params)
  with pytest.raises(RuntimeError, match="version 4: the sampler's .*layers.*0.*kernel.* differs"):
    ar.verify_equal(params, changed, 4)
