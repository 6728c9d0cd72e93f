"""DAPO dynamic sampling: the informative-group test, the buffer's order and counts, its errors,
and a randomised check that it never hands out an all-equal group."""

import doctest

import numpy as np
import pytest

from configs import grpo_arith
from jaxrl_post.methods import dynamic_sampling
from jaxrl_post.methods.dynamic_sampling import (
  DynamicSamplingBuffer,
  DynamicSamplingStats,
  informative_groups,
)


def test_informative_groups():
  rewards = np.array([1, 1, 1,  0, 0, 0,  1, 0, 1,  np.nan, 1, 0,  np.nan, 1, 1,
                      np.nan, np.nan, np.nan,  np.nan, np.nan, 0.5], np.float32)
  np.testing.assert_array_equal(informative_groups(rewards, 3),
                                [False, False, True, True, False, False, False])
  # Float rewards: a spread up to tol counts as equal.
  close = np.array([0.5, 0.5 + 1e-7, 0.2, 0.3])
  np.testing.assert_array_equal(informative_groups(close, 2), [True, True])
  np.testing.assert_array_equal(informative_groups(close, 2, tol=1e-6), [False, True])
  assert informative_groups(np.array([1.0, 0.0]), 1).tolist() == [False, False]
  assert informative_groups(np.zeros(0), 4).shape == (0,)


@pytest.mark.parametrize("rewards, group_size, tol, match", [
    (np.zeros(5), 2, 0.0, r"5 rewards are not whole groups of config\.group_size=2"),
    (np.zeros((2, 2)), 2, 0.0, r"must be \[rows\]"),
    (np.zeros(4), 2, -1.0, "tol=-1.0"),
])
def test_informative_groups_bad_input(rewards, group_size, tol, match):
  with pytest.raises(ValueError, match=match):
    informative_groups(rewards, group_size, tol=tol)


def test_take_keeps_arrival_order_and_counts():
  buffer = DynamicSamplingBuffer(group_size=2, prompts_per_step=3, max_rounds=5)
  # Round 0: groups 0..3 → informative 1 and 3.
  assert buffer.add(np.array([1, 1,  0, 1,  0, 0,  1, 0], np.float32)) == 2
  assert not buffer.full() and buffer.needed() == 1 and buffer.kept == 2
  # Round 1 (3 groups, 4..6): 4 is all-equal, 5 and 6 informative; 6 is surplus.
  assert buffer.add(np.array([0, 0,  1, 0,  0, 1], np.float32)) == 2
  assert buffer.full() and buffer.needed() == 0
  selection = buffer.take()
  np.testing.assert_array_equal(selection.groups, [1, 3, 5])
  np.testing.assert_array_equal(selection.rows, [2, 3, 6, 7, 10, 11])
  np.testing.assert_array_equal(selection.group_ids, [0, 0, 1, 1, 2, 2])
  assert [r.tolist() for r in selection.round_groups] == [[1, 3], [1]]
  assert selection.stats == DynamicSamplingStats(rounds=2, groups_seen=7, groups_dropped=3,
                                                 groups_surplus=1)
  assert selection.stats.metrics()["dynamic_sampling/groups_dropped"] == 3.0
  # The per-round arrays and records the step loop keeps, gathered into the batch.
  texts = [np.array(["a0", "a1", "b0", "b1", "c0", "c1", "d0", "d1"]),
           np.array(["e0", "e1", "f0", "f1", "g0", "g1"])]
  assert selection.gather(texts).tolist() == ["b0", "b1", "d0", "d1", "f0", "f1"]
  records = [["A", "B", "C", "D"], ["E", "F", "G"]]
  assert selection.gather_groups(records) == ["B", "D", "F"]
  tokens = [np.arange(16).reshape(8, 2), 100 + np.arange(12).reshape(6, 2)]
  assert selection.gather(tokens).shape == (6, 2)
  # take() reset the buffer for the next step.
  assert buffer.kept == 0 and buffer.stats.rounds == 0


def test_max_rounds_error_and_early_take():
  buffer = DynamicSamplingBuffer(group_size=2, prompts_per_step=2, max_rounds=2)
  buffer.add(np.array([1, 0, 1, 1], np.float32))
  with pytest.raises(RuntimeError, match=r"take\(\) with 1 informative groups of the 2"):
    buffer.take()
  with pytest.raises(RuntimeError, match=r"2 generation rounds \(config\.dynamic_sampling\."
                                         r"max_rounds=2\) found 1 informative groups of the 2 "
                                         r"needed .* out of 4 groups seen"):
    buffer.add(np.array([0, 0, 1, 1], np.float32))


def test_from_config_and_bad_settings():
  config = grpo_arith.get_config("runlocal")
  assert config.dynamic_sampling.max_rounds == 0
  assert DynamicSamplingBuffer.from_config(config) is None  # off by default
  config.dynamic_sampling.max_rounds = 3
  buffer = DynamicSamplingBuffer.from_config(config)
  assert (buffer.group_size, buffer.prompts_per_step, buffer.max_rounds) == (
    config.group_size, config.prompts_per_step, 3)
  config.dynamic_sampling.max_rounds = -1
  with pytest.raises(ValueError, match=r"config\.dynamic_sampling\.max_rounds=-1"):
    DynamicSamplingBuffer.from_config(config)
  del config["dynamic_sampling"]
  assert DynamicSamplingBuffer.from_config(config) is None
  with pytest.raises(ValueError, match=r"config\.group_size >= 2"):
    DynamicSamplingBuffer(group_size=1, prompts_per_step=2, max_rounds=3)
  with pytest.raises(ValueError, match=r"config\.dynamic_sampling\.max_rounds=0"):
    DynamicSamplingBuffer(group_size=2, prompts_per_step=2, max_rounds=0)


def test_never_hands_out_an_all_equal_group():
  # Many random steps: binary, float and NaN-laced rewards, rounds of varying size. Every kept
  # group has two distinct non-NaN rewards, the selection is exactly prompts_per_step groups
  # in arrival order, and the counts add up.
  for seed in range(200):
    rng = np.random.default_rng(seed)
    g, p = int(rng.integers(2, 6)), int(rng.integers(1, 6))
    buffer = DynamicSamplingBuffer(group_size=g, prompts_per_step=p, max_rounds=1000)
    rounds = []
    p_correct = rng.uniform(0.02, 0.98)
    while not buffer.full():
      n = int(rng.integers(1, 2 * p + 1))
      r = (rng.random(n * g) < p_correct).astype(np.float32)
      if seed % 3 == 1:
        r = np.round(rng.random(n * g), 1).astype(np.float32)
      if seed % 3 == 2:
        r[rng.random(n * g) < 0.3] = np.nan
      rounds.append(r)
      buffer.add(r)
    selection = buffer.take()
    kept = selection.gather(rounds).reshape(p, g)
    assert len(selection.groups) == p
    assert np.all(np.diff(selection.groups) > 0)  # arrival order
    for row in kept:
      present = row[~np.isnan(row)]
      assert present.size >= 2 and present.max() > present.min(), (seed, row)
    everything = np.concatenate(rounds).reshape(-1, g)
    mask = informative_groups(np.concatenate(rounds), g)
    np.testing.assert_array_equal(selection.groups, np.flatnonzero(mask)[:p])
    np.testing.assert_array_equal(kept, everything[selection.groups])
    by_round = np.concatenate([r.reshape(-1, g)[i] for r, i in
                               zip(rounds, selection.round_groups)])
    np.testing.assert_array_equal(by_round, kept)
    stats = selection.stats
    assert stats.rounds == len(rounds) and stats.groups_seen == everything.shape[0]
    assert stats.groups_seen - stats.groups_dropped - stats.groups_surplus == p


def test_doctests():
  assert doctest.testmod(dynamic_sampling).failed == 0
