"""A prompt sampler with exact per-batch domain quotas (Open-MOPD's domain-weighted sampler).

Every batch holds exactly the same number of prompts per domain: the quotas are the mixture
weights apportioned to the batch size by the largest-remainder (Hamilton) method, e.g. math :
code : IF = 2 : 2 : 1 in a batch of 8 gives 3 / 3 / 2, in a batch of 1024 gives 410 / 409 / 205.
Within a domain the pool is walked in a seeded random order, reshuffled each time it is used up
(small pools are cycled), so a domain with a short pool repeats its prompts before a long one
does. Rows of a batch are then shuffled, so micro-batches mix domains.

  sampler = DomainQuotaSampler({"math": 2, "code": 2, "if": 1},
                               pool_sizes={"math": 17_000, "code": 24_000, "if": 46_000},
                               batch_size=1024, seed=0)
  batch = sampler.next_batch()     # {"domain": str [B], "domain_id": int32 [B], "index": int64 [B]}
  state = sampler.get_state()      # JSON-able dict: goes into the checkpoint
  sampler.set_state(state)         # on resume: the following batches are identical

Everything is a function of the seed and the state, so resuming gives the same batches as
never stopping. The sampler returns indices into each domain's pool; the caller maps them to
records (for example with `TaskSource` or a tfds data source per domain).

Reference: Gao et al., Open-MOPD, arXiv 2608.19098: each batch of 1024 prompts is drawn with
exact domain quotas math : code : IF = 2 : 2 : 1 (Hamilton apportionment per batch, small pools
cycled); in the official code (github.com/BytedTsinghua-SIA/Open-MOPD),
`verl/utils/dataset/domain_weighted_sampler.py`: `DomainWeightedSampler`, `weighted_quotas`.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

import numpy as np

_STATE_VERSION = 1


def largest_remainder_quotas(weights: Sequence[float], total: int) -> list[int]:
  """Apportions `total` items to weights by the largest-remainder (Hamilton) method.

  Each share is w_d·total / Σw; every domain first gets the floor of its share, and the items
  left over go one each to the largest fractional remainders. Ties go to the larger weight,
  then to the earlier domain. The quotas sum to `total` exactly and each is within 1 of its
  share.

  Args:
    weights: non-negative weights, at least one positive.
    total: number of items to apportion (≥ 0).

  Returns:
    One int quota per weight.

  Raises:
    ValueError: on a negative or non-finite weight, all-zero weights or a negative total.

  Examples:
    >>> largest_remainder_quotas([2, 2, 1], 8)  # shares 3.2, 3.2, 1.6
    [3, 3, 2]
    >>> largest_remainder_quotas([2, 2, 1], 1024)  # 409.6, 409.6, 204.8
    [410, 409, 205]
  """
  w = np.asarray(weights, np.float64)
  if w.ndim != 1 or w.size == 0:
    raise ValueError(f"weights must be a non-empty list, got {weights!r}")
  if not np.all(np.isfinite(w)) or np.any(w < 0):
    raise ValueError(f"weights must be finite and non-negative, got {list(weights)}")
  if w.sum() <= 0:
    raise ValueError(f"at least one weight must be positive, got {list(weights)}")
  if total < 0:
    raise ValueError(f"total must be non-negative, got {total}")
  # Exact rationals (each float weight is a dyadic fraction): a share that is an integer is
  # never rounded to just below it, and equal remainders compare equal.
  fractions = [Fraction(float(x)) for x in w]
  shares = [f * total / sum(fractions) for f in fractions]
  quotas = [math.floor(share) for share in shares]
  remainders = [share - q for share, q in zip(shares, quotas)]
  order = sorted(range(len(w)), key=lambda d: (-remainders[d], -fractions[d], d))
  for d in order[: total - sum(quotas)]:
    quotas[d] += 1
  return quotas


def _domain_key(name: str) -> int:
  # A stable per-domain key (Python's hash() is salted per process), so adding a domain does not
  # change the order in which another domain's pool is visited.
  return zlib.crc32(name.encode("utf-8"))


class DomainQuotaSampler:
  """Draws prompt batches with exact per-domain quotas; deterministic and checkpointable."""

  def __init__(
    self,
    mixture: Mapping[str, float],
    *,
    pool_sizes: Mapping[str, int],
    batch_size: int,
    seed: int = 0,
    shuffle_within_batch: bool = True,
  ):
    """Sets up the sampler.

    Args:
      mixture: domain → weight (any positive scale: `{"math": 2, "code": 2, "if": 1}`). The
        order of the keys is the order of the domain ids. A weight of 0 keeps the domain's id
        but never samples it.
      pool_sizes: domain → number of prompts in its pool; every mixture domain needs one, and
        no other domain may appear.
      batch_size: prompts per batch.
      seed: the seed of every random choice.
      shuffle_within_batch: shuffle the rows of each batch (default) rather than grouping them
        by domain.

    Raises:
      ValueError: for an unknown domain (in `pool_sizes` but not the mixture), a mixture domain
        with no pool, an empty pool with a positive weight, bad weights or batch size.
    """
    if not mixture:
      raise ValueError("the mixture names no domain")
    self.domains: tuple[str, ...] = tuple(mixture)
    unknown = [d for d in pool_sizes if d not in mixture]
    if unknown:
      raise ValueError(
        f"unknown domain(s) {', '.join(map(repr, unknown))} in pool_sizes; mixture domains: "
        f"{', '.join(map(repr, self.domains))}"
      )
    missing = [d for d in self.domains if d not in pool_sizes]
    if missing:
      raise ValueError(f"no pool for domain(s) {', '.join(map(repr, missing))}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)):
      raise ValueError(f"batch_size must be an int, got {batch_size!r}")
    if batch_size <= 0:
      raise ValueError(f"batch_size must be positive, got {batch_size}")
    self.weights = [float(mixture[d]) for d in self.domains]
    self.quotas = largest_remainder_quotas(self.weights, int(batch_size))
    self.pool_sizes = {d: int(pool_sizes[d]) for d in self.domains}
    for d, size in self.pool_sizes.items():
      if size < 0:
        raise ValueError(f"pool size of domain {d!r} is negative: {size}")
    empty = [d for d, q in zip(self.domains, self.quotas) if q > 0 and self.pool_sizes[d] == 0]
    if empty:
      raise ValueError(
        f"empty pool for domain(s) {', '.join(map(repr, empty))}, which the mixture samples"
      )
    self.batch_size = int(batch_size)
    self.seed = int(seed)
    self.shuffle_within_batch = bool(shuffle_within_batch)
    self._step = 0
    self._cursors = {d: {"epoch": 0, "position": 0} for d in self.domains}
    self._orders: dict[str, tuple[int, np.ndarray]] = {}  # cache: domain → (epoch, permutation)

  @property
  def step(self) -> int:
    """Batches drawn so far."""
    return self._step

  def domain_id(self, name: str) -> int:
    """The id of a domain (its position in the mixture); ValueError naming an unknown one."""
    try:
      return self.domains.index(name)
    except ValueError:
      raise ValueError(
        f"unknown domain {name!r}; known domains: {', '.join(map(repr, self.domains))}"
      ) from None

  def _order(self, domain: str, epoch: int) -> np.ndarray:
    cached = self._orders.get(domain)
    if cached is None or cached[0] != epoch:
      rng = np.random.default_rng([self.seed, _domain_key(domain), epoch])
      cached = (epoch, rng.permutation(self.pool_sizes[domain]))
      self._orders[domain] = cached
    return cached[1]

  def _take(self, domain: str, count: int) -> list[int]:
    cursor = self._cursors[domain]
    taken: list[int] = []
    while len(taken) < count:
      order = self._order(domain, cursor["epoch"])
      n = min(count - len(taken), len(order) - cursor["position"])
      taken.extend(int(i) for i in order[cursor["position"] : cursor["position"] + n])
      cursor["position"] += n
      if cursor["position"] == len(order):
        cursor["epoch"] += 1
        cursor["position"] = 0
    return taken

  def next_batch(self) -> dict[str, np.ndarray]:
    """Draws the next batch.

    Returns:
      `{"domain": object [B] names, "domain_id": int32 [B], "index": int64 [B]}` where `index`
      is the position in that domain's pool; exactly `quotas[d]` rows of each domain d.
    """
    names: list[str] = []
    ids: list[int] = []
    indices: list[int] = []
    for d, (domain, quota) in enumerate(zip(self.domains, self.quotas)):
      if quota == 0:
        continue
      indices.extend(self._take(domain, quota))
      names.extend([domain] * quota)
      ids.extend([d] * quota)
    perm = np.arange(self.batch_size)
    if self.shuffle_within_batch:
      perm = np.random.default_rng([self.seed, 0x6261_7463, self._step]).permutation(perm)
    self._step += 1
    return {
      "domain": np.asarray(names, dtype=object)[perm],
      "domain_id": np.asarray(ids, np.int32)[perm],
      "index": np.asarray(indices, np.int64)[perm],
    }

  def __iter__(self):
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    return self.next_batch()

  def get_state(self) -> dict[str, Any]:
    """The sampler's position as a JSON-able dict (plus the settings it must be resumed with)."""
    return {
      "version": _STATE_VERSION,
      "seed": self.seed,
      "step": self._step,
      "domains": list(self.domains),
      "pool_sizes": dict(self.pool_sizes),
      "quotas": list(self.quotas),
      "cursors": {d: dict(c) for d, c in self._cursors.items()},
    }

  def set_state(self, state: Mapping[str, Any]) -> None:
    """Restores a `get_state()` dict; the next batches equal those after the saved point.

    Raises:
      ValueError: if the state was saved by a sampler with other domains, pool sizes, quotas
        or seed (resuming it would silently change the data), or is malformed.
    """
    if state.get("version") != _STATE_VERSION:
      raise ValueError(f"unsupported sampler state version {state.get('version')!r}")
    expected = {
      "seed": self.seed,
      "domains": list(self.domains),
      "pool_sizes": dict(self.pool_sizes),
      "quotas": list(self.quotas),
    }
    for key, value in expected.items():
      saved = state.get(key)
      if key == "domains" or key == "quotas":
        saved = list(saved) if saved is not None else None
      elif key == "pool_sizes":
        saved = {k: int(v) for k, v in saved.items()} if saved is not None else None
      if saved != value:
        raise ValueError(f"sampler state has {key}={saved!r}, this sampler has {value!r}")
    cursors = state.get("cursors", {})
    if set(cursors) != set(self.domains):
      raise ValueError(f"sampler state has cursors for {sorted(cursors)}, need {self.domains}")
    new = {}
    for d in self.domains:
      epoch, position = int(cursors[d]["epoch"]), int(cursors[d]["position"])
      if epoch < 0 or not 0 <= position < max(self.pool_sizes[d], 1):
        raise ValueError(f"bad cursor for domain {d!r}: {cursors[d]!r}")
      new[d] = {"epoch": epoch, "position": position}
    step = int(state["step"])
    if step < 0:
      raise ValueError(f"bad step {step}")
    self._cursors = new
    self._step = step
