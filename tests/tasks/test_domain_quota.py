"""Domain-quota prompt sampler: largest-remainder quotas, determinism, cycling, resume, errors."""

import collections
import doctest
import json

import numpy as np
import pytest

from jaxrl_post.tasks import domain_quota
from jaxrl_post.tasks.domain_quota import DomainQuotaSampler, largest_remainder_quotas

MIX = {"math": 2, "code": 2, "if": 1}
POOLS = {"math": 50, "code": 40, "if": 3}


def test_doctests():
  assert doctest.testmod(domain_quota).failed == 0


@pytest.mark.parametrize(
  "weights, total, expected",
  [
    # Open-MOPD's 2:2:1. Batch 8: shares 3.2, 3.2, 1.6 → floors 3, 3, 1; the one left over
    # goes to the largest remainder (0.6, IF).
    ([2, 2, 1], 8, [3, 3, 2]),
    # Batch 1024: 409.6, 409.6, 204.8 → 409, 409, 204 + 2 left: IF (0.8), then the tie 0.6/0.6
    # goes to the earlier domain (math).
    ([2, 2, 1], 1024, [410, 409, 205]),
    # Batch 5: exact shares 2, 2, 1, nothing left.
    ([2, 2, 1], 5, [2, 2, 1]),
    # 10 over three equal weights: 3⅓ each → 3, 3, 3 + 1 to the first.
    ([1, 1, 1], 10, [4, 3, 3]),
    # 0.5 : 0.3 : 0.2 of 7 = 3.5, 2.1, 1.4 → 3, 2, 1 + 1 to the 0.5 remainder.
    ([0.5, 0.3, 0.2], 7, [4, 2, 1]),
    # The largest remainder wins, not the largest weight: 3/4, 9/4 → 0, 2 + 1 to the 0.75.
    ([1, 3], 3, [1, 2]),
    # 0.1 : 0.2 of 3 is exactly 1 : 2 (shares are computed in exact rationals).
    ([0.1, 0.2], 3, [1, 2]),
    # A zero weight gets nothing; total 0 gives zeros.
    ([0, 3, 1], 4, [0, 3, 1]),
    ([2, 2, 1], 0, [0, 0, 0]),
  ],
)
def test_largest_remainder_cases(weights, total, expected):
  assert largest_remainder_quotas(weights, total) == expected


def test_largest_remainder_properties():
  # Quotas sum to the total and each is within 1 of its exact share (the quota property).
  rng = np.random.default_rng(0)
  for _ in range(200):
    w = rng.uniform(0, 5, size=rng.integers(1, 7))
    w[rng.random(w.size) < 0.2] = 0.0
    if w.sum() == 0:
      w[0] = 1.0
    total = int(rng.integers(0, 2000))
    q = np.array(largest_remainder_quotas(w, total))
    share = w * total / w.sum()
    assert q.sum() == total
    assert np.all(np.floor(share) <= q + 1e-9) and np.all(q <= np.ceil(share) + 1e-9)


def test_ties_are_broken_by_weight_then_order():
  # Shares 1.5, 1.5 → one left over; same weight → the earlier domain.
  assert largest_remainder_quotas([1, 1], 3) == [2, 1]
  # Shares 2.5, 0.5 (remainders tie at 0.5) → the larger weight (5) gets it.
  assert largest_remainder_quotas([5, 1], 3) == [3, 0]


@pytest.mark.parametrize("weights", [[], [0, 0], [1, -1], [1, float("nan")]])
def test_largest_remainder_rejects_bad_weights(weights):
  with pytest.raises(ValueError):
    largest_remainder_quotas(weights, 4)


def test_every_batch_has_exact_quotas():
  sampler = DomainQuotaSampler(MIX, pool_sizes=POOLS, batch_size=8, seed=0)
  assert sampler.quotas == [3, 3, 2] and sampler.domains == ("math", "code", "if")
  for _ in range(6):
    batch = sampler.next_batch()
    assert collections.Counter(batch["domain"].tolist()) == {"math": 3, "code": 3, "if": 2}
    names = np.array(sampler.domains, dtype=object)[batch["domain_id"]]
    np.testing.assert_array_equal(names, batch["domain"])
    assert batch["domain_id"].dtype == np.int32 and batch["index"].dtype == np.int64
    for name in sampler.domains:
      idx = batch["index"][batch["domain"] == name]
      assert np.all((0 <= idx) & (idx < POOLS[name]))
  assert sampler.step == 6


def test_deterministic_from_seed():
  draw = lambda seed: DomainQuotaSampler(
    MIX, pool_sizes=POOLS, batch_size=8, seed=seed
  ).next_batch()
  a, b, c = draw(3), draw(3), draw(4)
  for key in ("domain", "domain_id", "index"):
    np.testing.assert_array_equal(a[key], b[key])
  assert not all(np.array_equal(a[k], c[k]) for k in ("domain_id", "index"))


def test_small_pools_are_cycled_without_repeats_within_an_epoch():
  # IF has 3 prompts and 2 per batch: 6 batches draw 12 = 4 full passes over its pool, each
  # pass a permutation (no repeat before the pool is used up).
  sampler = DomainQuotaSampler(MIX, pool_sizes=POOLS, batch_size=8, seed=1)
  drawn = {"math": [], "if": []}
  for _ in range(6):
    batch = sampler.next_batch()
    for name in drawn:
      drawn[name].extend(batch["index"][batch["domain"] == name].tolist())
  counts = collections.Counter(drawn["if"])
  assert counts == {0: 4, 1: 4, 2: 4}
  assert len(set(drawn["math"])) == len(drawn["math"]) == 18  # 18 < 50: no repeat yet


def test_pool_order_is_a_fresh_permutation_each_epoch():
  sampler = DomainQuotaSampler(
    MIX, pool_sizes=POOLS, batch_size=8, seed=2, shuffle_within_batch=False
  )
  ifs = []
  for _ in range(6):
    batch = sampler.next_batch()
    # Without the row shuffle, rows are grouped by domain in mixture order.
    assert batch["domain"].tolist() == ["math"] * 3 + ["code"] * 3 + ["if"] * 2
    ifs.extend(batch["index"][6:].tolist())
  epochs = [ifs[i : i + 3] for i in range(0, 12, 3)]
  assert all(sorted(e) == [0, 1, 2] for e in epochs)
  assert len({tuple(e) for e in epochs}) > 1  # reshuffled, not a fixed cycle


def test_checkpoint_resume_gives_the_same_batches():
  sampler = DomainQuotaSampler(MIX, pool_sizes=POOLS, batch_size=8, seed=5)
  for _ in range(5):
    sampler.next_batch()
  state = json.loads(json.dumps(sampler.get_state()))  # JSON round trip, as in a checkpoint
  expected = [sampler.next_batch() for _ in range(4)]
  resumed = DomainQuotaSampler(MIX, pool_sizes=POOLS, batch_size=8, seed=5)
  resumed.set_state(state)
  assert resumed.step == 5
  for want in expected:
    got = resumed.next_batch()
    for key in want:
      np.testing.assert_array_equal(got[key], want[key])
  assert resumed.get_state() == sampler.get_state()


def test_set_state_rejects_a_different_sampler():
  state = DomainQuotaSampler(MIX, pool_sizes=POOLS, batch_size=8, seed=5).get_state()
  for kwargs, what in [
    (dict(seed=6), "seed"),
    (dict(batch_size=10), "quotas"),
    (dict(pool_sizes={**POOLS, "if": 4}), "pool_sizes"),
  ]:
    args = dict(pool_sizes=POOLS, batch_size=8, seed=5) | kwargs
    with pytest.raises(ValueError, match=what):
      DomainQuotaSampler(MIX, **args).set_state(state)
  bad = dict(state, cursors={**state["cursors"], "if": {"epoch": 0, "position": 3}})
  with pytest.raises(ValueError, match="bad cursor for domain 'if'"):
    DomainQuotaSampler(MIX, pool_sizes=POOLS, batch_size=8, seed=5).set_state(bad)
  with pytest.raises(ValueError, match="version"):
    DomainQuotaSampler(MIX, pool_sizes=POOLS, batch_size=8, seed=5).set_state({})


def test_unknown_and_empty_domains_fail_clearly():
  with pytest.raises(ValueError, match=r"unknown domain\(s\) 'chem' in pool_sizes"):
    DomainQuotaSampler(MIX, pool_sizes={**POOLS, "chem": 5}, batch_size=8)
  with pytest.raises(ValueError, match=r"no pool for domain\(s\) 'if'"):
    DomainQuotaSampler(MIX, pool_sizes={"math": 5, "code": 5}, batch_size=8)
  with pytest.raises(ValueError, match=r"empty pool for domain\(s\) 'if'"):
    DomainQuotaSampler(MIX, pool_sizes={**POOLS, "if": 0}, batch_size=8)
  with pytest.raises(ValueError, match="names no domain"):
    DomainQuotaSampler({}, pool_sizes={}, batch_size=8)
  with pytest.raises(ValueError, match="batch_size must be positive"):
    DomainQuotaSampler(MIX, pool_sizes=POOLS, batch_size=0)
  with pytest.raises(ValueError, match="non-negative"):
    DomainQuotaSampler({"math": -1, "code": 2}, pool_sizes={"math": 1, "code": 1}, batch_size=2)
  sampler = DomainQuotaSampler(MIX, pool_sizes=POOLS, batch_size=8)
  assert sampler.domain_id("if") == 2
  with pytest.raises(ValueError, match="unknown domain 'poetry'; known domains: 'math'"):
    sampler.domain_id("poetry")


def test_zero_weight_domain_keeps_its_id_and_may_be_empty():
  sampler = DomainQuotaSampler(
    {"math": 1, "code": 0, "if": 1}, pool_sizes={"math": 4, "code": 0, "if": 4}, batch_size=4
  )
  assert sampler.quotas == [2, 0, 2]
  batch = sampler.next_batch()
  assert sorted(batch["domain_id"].tolist()) == [0, 0, 2, 2]
