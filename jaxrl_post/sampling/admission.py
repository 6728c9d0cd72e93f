"""Mixed-workload rollout admission: session / class accounting and MISA-T caps.

MISA-T ("Scheduling Mixed RL Rollouts Beyond Prefix Locality", arXiv 2608.11152) sits in the
router of a shared inference pool that serves agentic (multi-turn, long growing prefix, tool
gaps), RLVR (short prompt, long decode) and RLHF (balanced) rollouts. Prefix-aware placement
decides *where* a request goes; admission decides *whether* a new session may start now, so
the resident KV set does not outgrow the cache (evicted continuation prefixes → cold prefill →
longer queues → more eviction) while the mixture the trainer released is still served.

Formulas (as reported in secondary write-ups of the paper):

  placement cost   ĉ_{r,w} = d_w + (L_r − H_{r,w}) / μ_w                 (`placement_cost`)
  MISA (space)     S_{w,b} = N_{w,b} k̄_b,  M^space_{w,b} = C_w S_{w,b} / Σ_b' S_{w,b'}
                   K^space_{w,b} = max(1, ⌊M^space_{w,b} / k̄_b⌋)   (`space_quotas`, `class_caps`)
  MISA-T (time)    R_{w,b} = N_{w,b} k̄_b T̂_b,  M^time_{w,b} = C_w R_{w,b} / Σ_b' R_{w,b'}
                   K^time_{w,b} = max(1, ⌊M^time_{w,b} / k̄_b⌋)    (`time_quotas`, `class_caps`)
  overload         G_w = max(0, h*_w − ĥ_w)                             (`overload_pressure`)
  mixture          TV(consumed, target) = ½ Σ_b |p_b − q_b|              (`mixture_tv`)

`N_{w,b}` is the unfinished session demand of class b (active + pending + held), `k̄_b` a
conservative per-session KV footprint (blocks), `T̂_b` the recent useful residency.

Decision procedure (§2.3), `AdmissionPolicy.admit`: a continuation of a session already
active or pending is always admitted; a new session needs global headroom (`K_w`) and
class headroom (`K_{w,b}`); otherwise the request is HELD and its demand stays in the ledger
(it counts in `N_b` and is re-evaluated next epoch).

PROPOSAL / "not found" parts (config values, named as such):
  * the estimators: `k̄_b` = the `footprint_quantile` (default 0.9) of the last
    `window` footprints of class b (conservative), `T̂_b` = the mean of the last `window`
    residencies of completed class-b sessions; both start from priors (`prior_footprint`,
    `prior_residency`) — PROPOSAL (the paper's estimators are not given);
  * the global cap `K_w(t)` ("exact update rule: not found"): `update_global_cap` follows a
    moving reference `C_w / mean completed footprint × headroom`, cut by `cut_factor` when the
    overload pressure stays above `pressure_threshold` for `confirm_epochs` epochs in a row
    (the "confirmed degradation" of the paper), clipped to `[min_cap, max_cap]` — PROPOSAL.

Policies (`ADMISSION_POLICIES`): `static` (a fixed cap on in-flight *requests*; continuations
compete with new sessions, as a router's concurrency limit does), `session` (global session
admission: a cap on live sessions, continuations exempt), `misa` (+ space class caps),
`misa_t` (+ block-time class caps). `RolloutScheduler` holds a ledger and a policy and turns a
stream of released sessions into admitted batches (the async rollout manager's hook,
`methods.group_source`); `sampling.serving_sim` drives the same policies in a simulator.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from jaxrl_post.registry import Registry

ADMISSION_POLICIES: Registry = Registry("admission policy")


# ---- The formulas (pure functions) ----


def placement_cost(prompt_len, hit_len, backlog_delay, prefill_rate):
  """Prefix-aware placement prefill cost `ĉ_{r,w} = d_w + (L_r − H_{r,w}) / μ_w` (2608.11152).

  Args:
    prompt_len: `L_r`, the request's prompt length (tokens or blocks); scalar or `[W]`.
    hit_len: `H_{r,w}`, its reusable cached prefix on each instance, `[W]`, `<= L_r`.
    backlog_delay: `d_w`, each instance's prefill backlog delay (time), `[W]`.
    prefill_rate: `μ_w`, each instance's measured prefill throughput (length / time), `[W]`.

  Returns:
    `[W]` float64 costs; the router places the request on the argmin.

  Example:
    >>> placement_cost(10, np.array([0, 8]), np.array([1.0, 2.0]), np.array([2.0, 2.0]))
    array([6., 3.])
  """
  prompt_len = np.asarray(prompt_len, np.float64)
  hit_len = np.asarray(hit_len, np.float64)
  rate = np.asarray(prefill_rate, np.float64)
  if np.any(rate <= 0):
    raise ValueError(f"prefill_rate must be > 0, got {prefill_rate!r}")
  if np.any(hit_len > prompt_len) or np.any(hit_len < 0):
    raise ValueError(f"hit_len must lie in [0, prompt_len={prompt_len}], got {hit_len!r}")
  return np.asarray(backlog_delay, np.float64) + (prompt_len - hit_len) / rate


def _shares(weights: np.ndarray, capacity: float) -> np.ndarray:
  total = weights.sum()
  if total <= 0:  # no demand anywhere: an equal split (still sums to C)
    return np.full(weights.shape, capacity / max(len(weights), 1))
  return capacity * weights / total


def _check(name: str, values, *, positive: bool = False) -> np.ndarray:
  values = np.asarray(values, np.float64)
  bad = values <= 0 if positive else values < 0
  if values.ndim != 1 or np.any(bad) or not np.all(np.isfinite(values)):
    raise ValueError(f"{name} must be a 1-D finite array of {'> 0' if positive else '>= 0'} "
                     f"values, got {values!r}")
  return values


def space_quotas(demand, footprint, capacity: float) -> np.ndarray:
  """MISA's space quotas `M^space_b = C · N_b k̄_b / Σ_b' N_b' k̄_b'` (arXiv 2608.11152).

  Args:
    demand: `[B]` unfinished session demand `N_b` per class (active + pending + held).
    footprint: `[B]` conservative per-session KV footprint `k̄_b` (blocks), > 0.
    capacity: `C_w`, the protected KV budget (blocks).

  Returns:
    `[B]` quotas in blocks, summing to `capacity` (an equal split when there is no demand).

  Example:
    >>> space_quotas([2, 1], [10, 40], 120)
    array([40., 80.])
  """
  if capacity <= 0:
    raise ValueError(f"capacity must be > 0, got {capacity}")
  demand = _check("demand", demand)
  footprint = _check("footprint", footprint, positive=True)
  return _shares(demand * footprint, float(capacity))


def time_quotas(demand, footprint, residency, capacity: float) -> np.ndarray:
  """MISA-T's block-time quotas `M^time_b = C · R_b / Σ R`, `R_b = N_b k̄_b T̂_b` (2608.11152).

  Equalises the drain times `τ_b ≈ N_b k̄_b T̂_b / M_b` across classes.

  Args:
    demand: `[B]` `N_b`; footprint: `[B]` `k̄_b` (> 0); residency: `[B]` `T̂_b` (> 0), the
      recent useful residency per session (tool gaps included); capacity: `C_w`.

  Returns:
    `[B]` quotas in blocks, summing to `capacity`.

  Example:
    >>> time_quotas([2, 1], [10, 40], [4, 1], 120)  # R = [80, 40]
    array([80., 40.])
  """
  if capacity <= 0:
    raise ValueError(f"capacity must be > 0, got {capacity}")
  demand = _check("demand", demand)
  footprint = _check("footprint", footprint, positive=True)
  residency = _check("residency", residency, positive=True)
  return _shares(demand * footprint * residency, float(capacity))


def class_caps(quotas, footprint) -> np.ndarray:
  """Session caps `K_b = max(1, ⌊M_b / k̄_b⌋)` (int64 `[B]`; every class can always run one).

  Example:
    >>> class_caps([40., 80.], [10, 40])
    array([4, 2])
  """
  quotas = _check("quotas", quotas)
  footprint = _check("footprint", footprint, positive=True)
  # The small epsilon keeps 3 × (40 / 3) from flooring to 2 by float rounding.
  return np.maximum(1, np.floor(quotas / footprint + 1e-9)).astype(np.int64)


def overload_pressure(reference_hit, observed_hit):
  """`G_w = max(0, h*_w − ĥ_w)`: how far the observed prefix-hit rate fell below the recent
  healthy reference (arXiv 2608.11152). Scalars or `[W]` arrays in [0, 1].

  Example:
    >>> float(overload_pressure(0.95, 0.7)), float(overload_pressure(0.9, 0.97))
    (0.25, 0.0)
  """
  return np.maximum(0.0, np.asarray(reference_hit, np.float64)
                    - np.asarray(observed_hit, np.float64))


def mixture_tv(consumed, target) -> float:
  """Total-variation deviation `½ Σ_b |p_b − q_b|` of the consumed class mixture `p`
  (counts or shares, normalised here) from the target `q` (arXiv 2608.11152's mixture metric,
  reported in percentage points there; a fraction in [0, 1] here). 0 when nothing was consumed.

  Example:
    >>> # The paper's consumed 45.9/33.3/20.8 vs target 48.6/33.1/18.2 (reported 2.71 pp from
    >>> # unrounded shares; the rounded ones give 2.75 pp).
    >>> round(mixture_tv([459, 333, 208], [0.486, 0.331, 0.182]), 4)
    0.0275
  """
  consumed = _check("consumed", consumed)
  target = _check("target", target)
  if consumed.shape != target.shape:
    raise ValueError(f"consumed {consumed.shape} and target {target.shape} differ in shape")
  if target.sum() <= 0:
    raise ValueError(f"target must have a positive total, got {target!r}")
  if consumed.sum() <= 0:
    return 0.0
  return float(0.5 * np.abs(consumed / consumed.sum() - target / target.sum()).sum())


@dataclasses.dataclass(frozen=True)
class CapRule:
  """The global cap's update rule `K_w(t)` — PROPOSAL (the paper's rule: "not found").

  Attributes:
    headroom: reference cap = `headroom × C / (mean footprint of completed sessions)`.
    min_cap, max_cap: clip range of the cap.
    pressure_threshold: overload pressure `G_w` counted as degradation.
    confirm_epochs: consecutive degraded epochs before a cut ("confirmed").
    cut_factor: the cap after a confirmed cut is `cut_factor × cap`.
    recover: fraction of the gap to the reference closed per healthy epoch.
  """

  headroom: float = 1.0
  min_cap: int = 1
  max_cap: int = 1 << 20
  pressure_threshold: float = 0.05
  confirm_epochs: int = 3
  cut_factor: float = 0.8
  recover: float = 0.25

  def __post_init__(self):
    if self.headroom <= 0 or not 0 < self.cut_factor <= 1 or not 0 < self.recover <= 1:
      raise ValueError(f"cap rule: need headroom > 0, cut_factor and recover in (0, 1], got "
                       f"{self}")
    if self.min_cap < 1 or self.max_cap < self.min_cap or self.confirm_epochs < 1:
      raise ValueError(f"cap rule: need 1 <= min_cap <= max_cap and confirm_epochs >= 1, got "
                       f"{self}")


def update_global_cap(cap: float, reference: float, pressure: float, degraded_epochs: int,
                      rule: CapRule) -> tuple[float, int]:
  """One epoch of the global cap `K_w` — PROPOSAL (`CapRule`).

  Degradation (`pressure > rule.pressure_threshold`) for `confirm_epochs` epochs in a row cuts
  the cap to `cut_factor × cap` (and restarts the count); otherwise the cap moves a fraction
  `recover` of the way to `reference`. Returns `(cap, degraded_epochs)`, the cap clipped to
  `[min_cap, max_cap]` (kept as a float; `int(cap)` sessions are admitted).

  Example:
    >>> update_global_cap(10.0, 20.0, 0.0, 0, CapRule())
    (12.5, 0)
    >>> update_global_cap(10.0, 20.0, 0.3, 2, CapRule())
    (8.0, 0)
  """
  if pressure > rule.pressure_threshold:
    degraded_epochs += 1
    if degraded_epochs >= rule.confirm_epochs:
      cap, degraded_epochs = cap * rule.cut_factor, 0
  else:
    degraded_epochs = 0
    cap = cap + rule.recover * (reference - cap)
  return float(np.clip(cap, rule.min_cap, rule.max_cap)), degraded_epochs


# ---- The ledger ----


class ClassEstimate(NamedTuple):
  """Per-class estimates: `k̄_b` (blocks) and `T̂_b` (time units of the caller)."""

  footprint: float
  residency: float


@dataclasses.dataclass
class Ledger:
  """Per-class / per-session accounting of one instance (or of a static-batch sampler).

  `active` / `pending`: session ids admitted (pending = admitted, not yet confirmed running);
  `held`: class → session ids whose new-session request was HELD (their demand is kept);
  `footprints` / `residencies`: recent observations per class, from which `estimate` derives
  `k̄_b` (the `footprint_quantile` of the window: conservative) and `T̂_b` (the window mean) —
  both PROPOSAL. Classes are fixed at construction (their order = the quota arrays' order).
  """

  classes: tuple[str, ...]
  prior_footprint: Mapping[str, float]
  prior_residency: Mapping[str, float]
  window: int = 64
  footprint_quantile: float = 0.9

  def __post_init__(self):
    if not self.classes or len(set(self.classes)) != len(self.classes):
      raise ValueError(f"classes must be distinct and non-empty, got {self.classes!r}")
    for name, prior in (("prior_footprint", self.prior_footprint),
                        ("prior_residency", self.prior_residency)):
      missing = [c for c in self.classes if c not in prior or not prior[c] > 0]
      if missing:
        raise ValueError(f"{name} needs a value > 0 for class(es) {missing}, got {dict(prior)}")
    if self.window < 1 or not 0 <= self.footprint_quantile <= 1:
      raise ValueError(f"window={self.window} must be >= 1 and footprint_quantile="
                       f"{self.footprint_quantile} in [0, 1]")
    self.classes = tuple(self.classes)
    self.active: dict[str, set] = {c: set() for c in self.classes}
    self.pending: dict[str, set] = {c: set() for c in self.classes}
    self.held: dict[str, list] = {c: [] for c in self.classes}
    self.footprints = {c: collections.deque(maxlen=self.window) for c in self.classes}
    self.residencies = {c: collections.deque(maxlen=self.window) for c in self.classes}
    self.completed = collections.Counter()

  def _class(self, cls: str) -> str:
    if cls not in self.active:
      raise ValueError(f"unknown workload class {cls!r}; known: {', '.join(self.classes)}")
    return cls

  def class_of(self, session) -> str | None:
    """The class of an active or pending session (None if neither)."""
    for c in self.classes:
      if session in self.active[c] or session in self.pending[c]:
        return c
    return None

  def hold(self, session, cls: str) -> None:
    held = self.held[self._class(cls)]
    if session not in held:
      held.append(session)

  def admit(self, session, cls: str, *, pending: bool = True) -> None:
    cls = self._class(cls)
    if session in self.held[cls]:
      self.held[cls].remove(session)
    (self.pending if pending else self.active)[cls].add(session)

  def confirm(self, session) -> None:
    """Pending → active (the session's KV is seen resident)."""
    cls = self.class_of(session)
    if cls is not None and session in self.pending[cls]:
      self.pending[cls].discard(session)
      self.active[cls].add(session)

  def observe_footprint(self, cls: str, blocks: float) -> None:
    self.footprints[self._class(cls)].append(float(blocks))

  def complete(self, session, *, footprint: float | None = None,
               residency: float | None = None) -> None:
    cls = self.class_of(session)
    if cls is None:
      raise ValueError(f"session {session!r} is neither active nor pending")
    self.active[cls].discard(session)
    self.pending[cls].discard(session)
    self.completed[cls] += 1
    if footprint is not None:
      self.footprints[cls].append(float(footprint))
    if residency is not None:
      self.residencies[cls].append(float(residency))

  def live(self, cls: str | None = None) -> int:
    """Active + pending sessions (of `cls`, or of all classes)."""
    names = self.classes if cls is None else (self._class(cls),)
    return sum(len(self.active[c]) + len(self.pending[c]) for c in names)

  def demand(self) -> np.ndarray:
    """`N_b` = active + pending + held, `[B]` float64."""
    return np.array([self.live(c) + len(self.held[c]) for c in self.classes], np.float64)

  def estimate(self, cls: str) -> ClassEstimate:
    """`(k̄_b, T̂_b)` — PROPOSAL estimators (class docstring); priors until observed."""
    cls = self._class(cls)
    fp = (float(np.quantile(self.footprints[cls], self.footprint_quantile))
          if self.footprints[cls] else float(self.prior_footprint[cls]))
    res = (float(np.mean(self.residencies[cls])) if self.residencies[cls]
           else float(self.prior_residency[cls]))
    return ClassEstimate(max(fp, 1e-9), max(res, 1e-9))

  def estimates(self) -> tuple[np.ndarray, np.ndarray]:
    """`(k̄, T̂)` as `[B]` arrays in class order."""
    est = [self.estimate(c) for c in self.classes]
    return (np.array([e.footprint for e in est]), np.array([e.residency for e in est]))

  def state_dict(self) -> dict[str, Any]:
    """JSON state (session ids must be JSON values: ints or strings)."""
    return {"active": {c: sorted(s) for c, s in self.active.items()},
            "pending": {c: sorted(s) for c, s in self.pending.items()},
            "held": {c: list(h) for c, h in self.held.items()},
            "footprints": {c: list(d) for c, d in self.footprints.items()},
            "residencies": {c: list(d) for c, d in self.residencies.items()},
            "completed": dict(self.completed)}

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    for c in self.classes:
      self.active[c] = set(state["active"][c])
      self.pending[c] = set(state["pending"][c])
      self.held[c] = list(state["held"][c])
      self.footprints[c] = collections.deque(state["footprints"][c], maxlen=self.window)
      self.residencies[c] = collections.deque(state["residencies"][c], maxlen=self.window)
    self.completed = collections.Counter(state["completed"])


# ---- Policies ----


class View(NamedTuple):
  """What a policy sees of one instance at a decision.

  ledger: the instance's `Ledger`; capacity: `C_w` (blocks); in_flight: requests queued or
  running on the instance; global_cap: `K_w` (sessions, or requests for `static`).
  """

  ledger: Ledger
  capacity: float
  in_flight: int
  global_cap: float


@dataclasses.dataclass(frozen=True)
class AdmissionPolicy:
  """Base: `caps(view)` (class caps or None) and `admit(view, cls, continuation)` (§2.3)."""

  uses_class_caps = False

  def caps(self, view: View) -> dict[str, int] | None:
    return None

  def admit(self, view: View, cls: str, continuation: bool,
            caps: Mapping[str, int] | None = None) -> bool:
    """ADMIT (True) or HOLD (False) one request of class `cls`.

    `caps`: the epoch's class caps (`caps(view)` is computed when not given).
    """
    if continuation:  # locality is protected: a live session's next turn always runs
      return True
    if view.ledger.live() >= int(view.global_cap):
      return False
    caps = self.caps(view) if caps is None else caps
    return caps is None or view.ledger.live(cls) < caps[cls]


@ADMISSION_POLICIES.register("static")
@dataclasses.dataclass(frozen=True)
class StaticConcurrency(AdmissionPolicy):
  """A fixed cap on in-flight *requests* (a router's concurrency limit, the vLLM Router
  baseline): continuations and new sessions compete for the same `global_cap` slots, and
  sessions between turns (tool gaps) hold no slot, so live sessions are not bounded."""

  def admit(self, view: View, cls: str, continuation: bool,
            caps: Mapping[str, int] | None = None) -> bool:
    return view.in_flight < int(view.global_cap)


@ADMISSION_POLICIES.register("session")
@dataclasses.dataclass(frozen=True)
class SessionAdmission(AdmissionPolicy):
  """Global session admission: at most `K_w` live sessions; continuations exempt."""


@ADMISSION_POLICIES.register("misa")
@dataclasses.dataclass(frozen=True)
class Misa(AdmissionPolicy):
  """Session admission + space class caps `K^space_b` (`space_quotas`, `class_caps`)."""

  uses_class_caps = True

  def caps(self, view: View) -> dict[str, int]:
    footprint, _ = view.ledger.estimates()
    quotas = space_quotas(view.ledger.demand(), footprint, view.capacity)
    return dict(zip(view.ledger.classes, class_caps(quotas, footprint).tolist()))


@ADMISSION_POLICIES.register("misa_t")
@dataclasses.dataclass(frozen=True)
class MisaT(AdmissionPolicy):
  """Session admission + block-time class caps `K^time_b` (`time_quotas`, `class_caps`)."""

  uses_class_caps = True

  def caps(self, view: View) -> dict[str, int]:
    footprint, residency = view.ledger.estimates()
    quotas = time_quotas(view.ledger.demand(), footprint, residency, view.capacity)
    return dict(zip(view.ledger.classes, class_caps(quotas, footprint).tolist()))


def get_policy(name: str) -> AdmissionPolicy:
  """The registered policy `name` (ValueError naming `config.rollout.admission` otherwise)."""
  try:
    return ADMISSION_POLICIES.get(name)()
  except KeyError as e:
    raise ValueError(f"config.rollout.admission={name!r}: {e.args[0]}") from None


# ---- The scheduler (a static-batch sampler's hook) ----


@dataclasses.dataclass
class Session:
  """A released session waiting in the backlog: its id, class, KV footprint and payload."""

  id: int
  cls: str
  footprint: float
  payload: Any


class RolloutScheduler:
  """Turns released sessions into admitted batches through a pluggable `AdmissionPolicy`.

  One scheduling epoch = one batch of `batch_size` sessions generated together (the sampler's
  static batch is the resident set). `next_batch(release)`:

    1. `release()` → payloads (one data batch), appended to the backlog in release order with
       their class (`classify`) and footprint (`footprint_of`, KV blocks);
    2. the epoch's class caps are computed once (`policy.caps`), the global cap is
       `min(batch_size, global_cap)`; the backlog is scanned oldest first and each session is
       admitted or HELD (`policy.admit`; held sessions keep their place and their demand);
    3. while fewer than `batch_size` are admitted, more data is released (at most
       `max_releases` times per epoch, the caps recomputed with the grown demand); then any
       remaining slots are filled oldest first regardless of the caps (`forced`: a static
       batch has a fixed shape). Since `Σ_b K_b ≈ C / k̄` and the floor rounds each class
       down, a `capacity` below `batch_size × k̄` forces slots every epoch: the caps then only
       decide which held sessions wait, oldest-first, for the forced slots.

  After generation, `complete(payloads, residencies)` closes the batch's sessions and feeds
  the estimators. `consume(payloads)` counts the classes the trainer took, for the
  consumed-vs-target TV (`metrics`). The whole state is JSON (`state_dict`), payloads included.
  """

  def __init__(self, policy: AdmissionPolicy | str, *, classes: Sequence[str],
               target: Mapping[str, float], batch_size: int, capacity: float,
               classify, footprint_of, prior_footprint: Mapping[str, float],
               prior_residency: Mapping[str, float], global_cap: float | None = None,
               max_releases: int = 4, window: int = 64, footprint_quantile: float = 0.9):
    self.policy = get_policy(policy) if isinstance(policy, str) else policy
    if batch_size < 1:
      raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if capacity <= 0:
      raise ValueError(f"config.admission.kv_blocks must be > 0, got {capacity}")
    if max_releases < 1:
      raise ValueError(f"config.admission.max_releases must be >= 1, got {max_releases}")
    self.classes = tuple(classes)
    missing = [c for c in self.classes if c not in target]
    if missing or any(target[c] < 0 for c in self.classes):
      raise ValueError(f"target mixture needs a weight >= 0 for every class {self.classes}, got "
                       f"{dict(target)}")
    self.target = np.array([float(target[c]) for c in self.classes])
    self.batch_size, self.capacity = int(batch_size), float(capacity)
    self.global_cap = float(batch_size if global_cap is None else min(global_cap, batch_size))
    self.classify, self.footprint_of, self.max_releases = classify, footprint_of, max_releases
    self.ledger = Ledger(self.classes, prior_footprint, prior_residency, window=window,
                         footprint_quantile=footprint_quantile)
    self.backlog: list[Session] = []
    self.next_id = 0
    self.epoch = 0
    self.consumed = np.zeros(len(self.classes), np.int64)
    self.held_total = np.zeros(len(self.classes), np.int64)
    self.forced_total = 0
    self.last: dict[str, float] = {}

  def _release(self, release) -> None:
    for payload in release():
      cls = self.classify(payload)
      footprint = float(self.footprint_of(payload))
      self.ledger.observe_footprint(cls, footprint)
      self.backlog.append(Session(self.next_id, cls, footprint, payload))
      self.ledger.hold(self.next_id, cls)  # released, not admitted: demand in the ledger
      self.next_id += 1

  def next_batch(self, release) -> list:
    """The next batch's payloads (class docstring); `release() -> payloads` draws new data."""
    self._release(release)
    view = View(self.ledger, self.capacity, 0, self.global_cap)
    caps = self.policy.caps(view)
    admitted: list[Session] = []
    releases = 1
    scanned = 0
    while True:
      for session in self.backlog[scanned:]:
        if len(admitted) == self.batch_size:
          break
        if self.policy.admit(view, session.cls, False, caps):
          self.ledger.admit(session.id, session.cls)
          admitted.append(session)
      scanned = len(self.backlog)
      if len(admitted) == self.batch_size or releases >= self.max_releases:
        break
      self._release(release)
      releases += 1
      caps = self.policy.caps(view)  # the demand grew
    forced = 0
    for session in self.backlog:
      if len(admitted) == self.batch_size:
        break
      if self.ledger.class_of(session.id) is None:
        self.ledger.admit(session.id, session.cls)
        admitted.append(session)
        forced += 1
    taken = {s.id for s in admitted}
    self.backlog = [s for s in self.backlog if s.id not in taken]
    held = np.array([len(self.ledger.held[c]) for c in self.classes], np.int64)
    self.held_total += held
    self.forced_total += forced
    self.epoch += 1
    self.last = {"admission/forced": float(forced), "admission/releases": float(releases),
                 "admission/backlog": float(len(self.backlog)),
                 **{f"admission/held_{c}": float(h) for c, h in zip(self.classes, held)},
                 **{f"admission/cap_{c}": float(caps[c]) for c in self.classes if caps}}
    # Batch order = admission order (oldest release first); ids travel with the payloads.
    self._batch_ids = [s.id for s in admitted]
    return [s.payload for s in admitted]

  def slot_caps(self, num_slots: int) -> list[int] | None:
    """The last epoch's class caps as caps on `num_slots` continuous-batching slots.

    Class b may hold the share K_b·k̄_b / C of the KV budget C (MISA / MISA-T's quota in
    blocks); in a sampler whose slots are alike that is ⌊num_slots · K_b·k̄_b / C⌋ slots, at
    least 1. None for a policy without class caps (static, session): first come, first served.
    """
    caps = self.policy.caps(View(self.ledger, self.capacity, 0, self.global_cap))
    if not caps:
      return None
    out = []
    for c in self.classes:
      blocks = caps[c] * self.ledger.estimate(c).footprint
      out.append(max(1, min(num_slots, int(num_slots * blocks / self.capacity))))
    return out

  def batch_ids(self) -> list[int]:
    """The session ids of the last batch, in batch order."""
    return list(self._batch_ids)

  def complete(self, ids: Sequence[int], *, residencies: Sequence[float] | None = None,
               footprints: Sequence[float] | None = None) -> None:
    """Closes sessions `ids` (their KV is released), feeding `T̂_b` / `k̄_b`."""
    for i, session in enumerate(ids):
      self.ledger.complete(session,
                           residency=None if residencies is None else residencies[i],
                           footprint=None if footprints is None else footprints[i])

  def consume(self, classes: Sequence[str]) -> None:
    """Counts the classes of the sessions the trainer consumed."""
    for cls in classes:
      self.consumed[self.classes.index(self.ledger._class(cls))] += 1

  def metrics(self) -> dict[str, float]:
    """`admission/tv_consumed_target`, per-class held counts and caps of the last epoch."""
    out = dict(self.last)
    out["admission/tv_consumed_target"] = mixture_tv(self.consumed, self.target)
    out["admission/forced_total"] = float(self.forced_total)
    for c, n in zip(self.classes, self.held_total):
      out[f"admission/held_total_{c}"] = float(n)
    return out

  def state_dict(self) -> dict[str, Any]:
    return {"ledger": self.ledger.state_dict(), "next_id": self.next_id, "epoch": self.epoch,
            "backlog": [[s.id, s.cls, s.footprint, s.payload] for s in self.backlog],
            "consumed": self.consumed.tolist(), "held_total": self.held_total.tolist(),
            "forced_total": self.forced_total, "global_cap": self.global_cap}

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    self.ledger.load_state_dict(state["ledger"])
    self.next_id, self.epoch = int(state["next_id"]), int(state["epoch"])
    self.backlog = [Session(int(i), c, float(f), p) for i, c, f, p in state["backlog"]]
    self.consumed = np.asarray(state["consumed"], np.int64)
    self.held_total = np.asarray(state["held_total"], np.int64)
    self.forced_total = int(state["forced_total"])
    self.global_cap = float(state["global_cap"])


def kv_blocks(tokens: int, block_tokens: int) -> int:
  """KV blocks holding `tokens` tokens: `⌈tokens / block_tokens⌉`."""
  if block_tokens < 1:
    raise ValueError(f"config.admission.block_tokens must be >= 1, got {block_tokens}")
  return max(1, math.ceil(tokens / block_tokens))
