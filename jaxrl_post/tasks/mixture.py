"""A mixture of registered tasks with domain labels (`"mixture"`), for multi-domain training.

Each *domain* is a registered task with its own knobs and a mixture weight:

  task = get_task("mixture", components={
      "arith": {"task": "arith", "weight": 2, "knobs": {"max_digits": 2, "operations": "+-"}},
      "countdown": {"task": "countdown", "weight": 2, "knobs": {"num_numbers": 3}},
      "format": {"task": "format", "weight": 1},
  })
  task.domains                          # ("arith", "countdown", "format"): sorted, = domain ids
  task.make_example("train", 7)         # a record of one domain; its meta names the domain
  task.make_domain_example("format", "test", 3)   # example 3 of the format domain's test split
  task.reward(record, completion)       # the record's own domain task scores it

Index space. Mixture indices interleave the domains in a fixed cycle whose slots are the
weights apportioned by largest remainder (`largest_remainder_quotas`): for 2 : 2 : 1 the cycle
is `arith countdown format arith countdown`, so any 5 consecutive indices hold 2 / 2 / 1
examples and the k-th example of a domain is that domain task's example k (`locate`,
`index_of`). A plain shuffled loader over the mixture (`TaskSource` + `make_loader`, as
experiments/sft.py uses) therefore sees the ratio on average; exact per-batch quotas come from
`DomainQuotaSampler` over the per-domain pools `pool_sizes(n)` (the domain examples among the
first n mixture indices), which is how experiments/opd.py draws its batches. Both read the same
examples: domain example k is the same record either way.

Records keep the common format (`base.RECORD_FIELDS`, so the tfds builder stores them too): the
domain task's prompt, answer and demonstration, `task = "mixture"`, `index` = the mixture
index, and `meta` = `{"domain": d, "index": k, "meta": <the domain task's meta>}`. `domain_of`
reads the label back. Domain ids follow the sorted domain names: ConfigDicts sort their keys,
so any other order would differ between a config file and Python code.

Reference: the mixed-domain setting of Open-MOPD, arXiv 2608.19098: prompts drawn with the
domain ratio math : code : IF = 2 : 2 : 1, exact per batch.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from collections.abc import Mapping
from typing import Any

from jaxrl_post.tasks import base
from jaxrl_post.tasks.domain_quota import largest_remainder_quotas

# The default mixture mirrors the paper's shape on synthetic tasks: two domains with long worked
# answers (arithmetic ≈ math, countdown ≈ code) and one with very short replies (format ≈ IF),
# in the ratio 2 : 2 : 1. Knobs match configs/grpo_arith.py, grpo_countdown.py, grpo_format.py,
# so the per-domain GRPO teachers train on the same prompts as the mixture's domains.
DEFAULT_COMPONENTS: dict[str, dict[str, Any]] = {
  "arith": {
    "task": "arith",
    "weight": 2.0,
    "knobs": {"min_digits": 1, "max_digits": 2, "num_operands": 2, "operations": "+-"},
  },
  "countdown": {"task": "countdown", "weight": 2.0, "knobs": {"num_numbers": 3}},
  "format": {"task": "format", "weight": 1.0, "knobs": {}},
}

_SPEC_KEYS = ("task", "weight", "knobs")
# Slots per interleaving cycle when the weights are not whole numbers.
_DEFAULT_FRACTIONAL_CYCLE = 100


def _plain(value: Any) -> Any:
  """ConfigDicts and other mappings to dicts, sequences to lists, recursively."""
  if isinstance(value, Mapping) or (hasattr(value, "items") and hasattr(value, "keys")):
    return {str(k): _plain(v) for k, v in value.items()}
  if isinstance(value, list | tuple):
    return [_plain(v) for v in value]
  return value


@base.TASKS.register("mixture")
@dataclasses.dataclass(frozen=True)
class MixtureTask(base.Task):
  """Examples drawn from several registered tasks ("domains"), each record labelled.

  Attributes:
    components: domain name → `{"task": registered task name, "weight": mixture weight
      (default 1), "knobs": that task's knobs (default none)}`. A weight of 0 keeps the domain
      (for evaluation) but never samples it.
    cycle: slots per interleaving cycle (see the module docstring); 0 picks the sum of the
      weights when they are whole numbers, else 100.
  """

  name = "mixture"

  components: Mapping[str, Mapping[str, Any]] = dataclasses.field(
    default_factory=lambda: copy.deepcopy(DEFAULT_COMPONENTS)
  )
  cycle: int = 0
  _tasks: dict[str, base.Task] = dataclasses.field(init=False, repr=False, compare=False)
  _slots: tuple[int, ...] = dataclasses.field(init=False, repr=False, compare=False)
  _slot_rank: tuple[int, ...] = dataclasses.field(init=False, repr=False, compare=False)
  _domain_slots: tuple[tuple[int, ...], ...] = dataclasses.field(
    init=False, repr=False, compare=False
  )

  def __post_init__(self):
    components = _plain(self.components)
    if not isinstance(components, dict) or not components:
      raise ValueError(f"components must map at least one domain to a task, got {components!r}")
    normalised, tasks = {}, {}
    for domain in sorted(components):
      spec = components[domain]
      if not domain:
        raise ValueError("domain names must be non-empty strings")
      if not isinstance(spec, dict) or "task" not in spec:
        raise ValueError(f"domain {domain!r}: need {{'task': <name>, 'weight': w, 'knobs': {{}}}}, "
                         f"got {spec!r}")
      unknown = sorted(set(spec) - set(_SPEC_KEYS))
      if unknown:
        raise ValueError(f"domain {domain!r}: unknown key(s) {unknown}; valid: {list(_SPEC_KEYS)}")
      if spec["task"] == self.name:
        raise ValueError(f"domain {domain!r}: a mixture cannot contain a mixture")
      weight = float(spec.get("weight", 1.0))
      if not math.isfinite(weight) or weight < 0:
        raise ValueError(f"domain {domain!r}: weight must be finite and >= 0, got {weight}")
      knobs = dict(spec.get("knobs") or {})
      try:
        tasks[domain] = base.get_task(spec["task"], **knobs)
      except (KeyError, TypeError, ValueError) as e:
        message = e.args[0] if isinstance(e, KeyError) else e  # str(KeyError) adds quotes
        raise ValueError(f"domain {domain!r}: {message}") from None
      normalised[domain] = {"task": spec["task"], "weight": weight, "knobs": knobs}
    weights = [normalised[d]["weight"] for d in normalised]
    if sum(weights) <= 0:
      raise ValueError(f"at least one domain needs a positive weight, got {weights}")
    cycle = int(self.cycle)
    if cycle < 0:
      raise ValueError(f"cycle must be >= 0, got {self.cycle}")
    if cycle == 0:
      whole = all(float(w).is_integer() for w in weights)
      cycle = int(sum(weights)) if whole else _DEFAULT_FRACTIONAL_CYCLE
    quotas = largest_remainder_quotas(weights, cycle)
    # Spread each domain's slots evenly over the cycle (slot k of a domain with quota q sits at
    # (k + ½)/q), so that a short window of consecutive indices is already close to the ratio.
    order = sorted(
      ((k + 0.5) / q, d, k) for d, q in enumerate(quotas) for k in range(q)
    )
    slots = tuple(d for _, d, _ in order)
    object.__setattr__(self, "components", normalised)
    object.__setattr__(self, "_tasks", tasks)
    object.__setattr__(self, "_slots", slots)
    object.__setattr__(self, "_slot_rank", tuple(k for _, _, k in order))
    object.__setattr__(
      self, "_domain_slots",
      tuple(tuple(s for s, d in enumerate(slots) if d == e) for e in range(len(quotas))),
    )

  def __hash__(self):
    # The generated hash would hash the components dict; the canonical knobs stand for it.
    return hash(json.dumps(self.knobs(), sort_keys=True))

  # ---- domains ----

  @property
  def domains(self) -> tuple[str, ...]:
    """Domain names in id order (sorted)."""
    return tuple(self.components)

  @property
  def weights(self) -> dict[str, float]:
    """Domain → mixture weight, in id order (the `DomainQuotaSampler` mixture)."""
    return {d: self.components[d]["weight"] for d in self.domains}

  def task_of(self, domain: str) -> base.Task:
    """The task behind `domain`; ValueError naming the known domains for any other name."""
    try:
      return self._tasks[domain]
    except KeyError:
      raise ValueError(
        f"unknown domain {domain!r}; known domains: {', '.join(map(repr, self.domains))}"
      ) from None

  def domain_of(self, record: Mapping[str, Any]) -> str:
    """The domain label a mixture record carries in its meta."""
    meta = base.parse_meta(record)
    if "domain" not in meta:
      raise ValueError(f"record has no domain label in its meta: {record.get('meta')!r}")
    return meta["domain"]

  # ---- index space ----

  def locate(self, index: int) -> tuple[str, int]:
    """Mixture index → (domain, index of the example within that domain's task).

    Examples:
      >>> [MixtureTask().locate(i) for i in range(4)]  # the 2 : 2 : 1 cycle
      [('arith', 0), ('countdown', 0), ('format', 0), ('arith', 1)]
    """
    if index < 0:
      raise ValueError(f"index must be >= 0, got {index}")
    cycles, slot = divmod(int(index), len(self._slots))
    domain = self._slots[slot]
    quota = len(self._domain_slots[domain])
    return self.domains[domain], cycles * quota + self._slot_rank[slot]

  def index_of(self, domain: str, local_index: int) -> int:
    """The inverse of `locate`: the mixture index of a domain's example `local_index`."""
    self.task_of(domain)
    slots = self._domain_slots[self.domains.index(domain)]
    if not slots:
      raise ValueError(f"domain {domain!r} has weight 0: it has no mixture index")
    cycles, rank = divmod(int(local_index), len(slots))
    return cycles * len(self._slots) + slots[rank]

  def pool_sizes(self, num_examples: int) -> dict[str, int]:
    """Per domain, how many of the first `num_examples` mixture indices belong to it.

    Examples:
      >>> MixtureTask().pool_sizes(12)  # 2 cycles of 5, then "arith countdown"
      {'arith': 5, 'countdown': 5, 'format': 2}
    """
    cycles, rest = divmod(int(num_examples), len(self._slots))
    head = self._slots[:rest]
    return {
      d: cycles * len(self._domain_slots[i]) + head.count(i) for i, d in enumerate(self.domains)
    }

  # ---- the Task interface ----

  def make_domain_example(self, domain: str, split: str, local_index: int) -> dict[str, Any]:
    """Example `local_index` of `domain`'s task, as a labelled mixture record."""
    inner = self.task_of(domain).make_example(split, local_index)
    # A weight-0 domain has no mixture index; its records keep the domain's own index.
    sampled = bool(self._domain_slots[self.domains.index(domain)])
    index = self.index_of(domain, local_index) if sampled else int(local_index)
    meta = {"domain": domain, "index": int(local_index), "meta": base.parse_meta(inner)}
    return base.make_record(
      self.name, index, inner["prompt"], inner["answer"], inner["demonstration"], meta
    )

  def make_example(self, split: str, index: int) -> dict[str, Any]:
    base.example_rng(self.name, 0, split, index)  # validates split and index
    domain, local = self.locate(index)
    return self.make_domain_example(domain, split, local)

  def reward(self, record: Mapping[str, Any], completion: str) -> base.Reward:
    meta = base.parse_meta(record)
    domain = meta.get("domain")
    if domain is None:
      raise ValueError(f"record has no domain label in its meta: {record.get('meta')!r}")
    inner = self.task_of(domain)
    inner_record = dict(record)
    inner_record.update(
      task=inner.name,
      index=int(meta.get("index", 0)),
      meta=json.dumps(meta.get("meta", {}), sort_keys=True, separators=(",", ":")),
    )
    return inner.reward(inner_record, completion)

  @property
  def splits(self) -> list[str] | None:
    fixed = [set(t.splits) for t in self._tasks.values() if t.splits is not None]
    return sorted(set.intersection(*fixed)) if fixed else None

  def num_examples(self, split: str) -> int | None:
    # With finite domain splits the mixture ends where the first sampled domain runs out.
    limits = []
    for i, domain in enumerate(self.domains):
      size = self._tasks[domain].num_examples(split)
      if size is not None and self._domain_slots[i]:
        limits.append(self.index_of(domain, size))
    return min(limits) if limits else None

  def fingerprint(self) -> dict[str, Any]:
    # The domain tasks' fingerprints, not just their knobs: a file-backed domain adds digests.
    return {
      "task": self.name,
      "cycle": len(self._slots),
      "components": {
        d: {"weight": spec["weight"], **self._tasks[d].fingerprint()}
        for d, spec in self.components.items()
      },
    }
