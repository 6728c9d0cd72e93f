"""A time-stepped simulator of a shared rollout-serving pool (MISA-T's synthetic analogue).

PROPOSAL (not the paper's simulator, which is not public): numpy only, deterministic
given a seed. Units: time in ticks, KV and token lengths in blocks.

  * `W` instances, each with `capacity` KV blocks: running requests pin their context;
    sessions between turns (tool gaps) keep their prefix in an LRU prefix cache, evicted
    (oldest first) when the resident KV would exceed the capacity; a running request that
    cannot grow is preempted (its KV dropped, re-prefilled cold later).
  * Sessions (`SessionGenerator`): **agent** (`agent_turns` turns, the prefix grows by a tool
    output each turn, short outputs, exponential tool gaps), **rlvr** (short prompt, long
    decode), **rlhf** (medium prompt and decode); lengths lognormal around the medians.
  * Cost model per tick (budget 1): prefill costs `uncached blocks / prefill_rate`, then the
    rest of the tick decodes, each of the `n` decoding requests advancing
    `decode_rate / (1 + n / decode_half_batch)` blocks (the batch factor).
  * The trainer releases `batch` sessions per iteration in the `target` mixture (largest
    remainder, shuffled), keeps at most `outstanding` iterations released and unconsumed, and
    consumes the first `batch` complete sessions in completion order as one iteration.
  * The router places new sessions on the instance with the lowest placement cost
    (`admission.placement_cost`: backlog delay + cold prefill), continuations on their own
    instance, and asks the policy (`admission.ADMISSION_POLICIES`) whether a request runs now
    or is HELD. `static` caps in-flight requests per instance (`cap`); the others cap live
    sessions per instance (`cap` initially, then `admission.update_global_cap`, PROPOSAL).

`simulate(config, policy, seed)` returns `SimResult`: complete samples per tick, the
prefix-hit rate (cached / requested context blocks), the mean per-iteration TV deviation of the
consumed mixture from the target, and the ledger of every released session (conservation:
released = completed + live + held).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import NamedTuple

import numpy as np

from jaxrl_post.sampling import admission

CLASSES = ("agent", "rlhf", "rlvr")


@dataclasses.dataclass(frozen=True)
class SimConfig:
  """The pool, the workload and the trainer (PROPOSAL values; see the module docstring)."""

  instances: int = 4
  capacity: float = 384.0  # KV blocks per instance
  prefill_rate: float = 60.0  # blocks per tick
  decode_rate: float = 0.5  # blocks per tick for a lone decoding request
  decode_half_batch: float = 32.0  # batch size at which per-request decode speed halves
  ticks: int = 1500
  # Workload (medians, blocks; lognormal spread `sigma`).
  agent_prompt: float = 8.0
  agent_tool_output: float = 2.5
  agent_output: float = 0.15
  agent_turns: tuple[int, int] = (4, 14)
  agent_gap: float = 1.0  # mean tool gap (ticks)
  rlvr_prompt: float = 0.2
  rlvr_output: float = 30.0
  rlhf_prompt: float = 1.0
  rlhf_output: float = 7.0
  sigma: float = 0.5
  # Trainer.
  target: tuple[float, float, float] = (0.486, 0.182, 0.331)  # agent, rlhf, rlvr (the paper's)
  batch: int = 64
  outstanding: int = 4
  # Policy knobs: the initial cap (`static`: in-flight requests per instance; others: live
  # sessions per instance) and the global-cap rule (PROPOSAL).
  cap: int = 32
  # The protected KV budget of the class quotas, as a multiple of the capacity (PROPOSAL: the
  # quotas reserve peak footprints k̄_b, which sessions reach only at their end).
  protected: float = 1.0
  adaptive_cap: bool = True
  cap_rule: admission.CapRule = admission.CapRule(headroom=1.5, min_cap=2, max_cap=256)
  # Overload signal (PROPOSAL): ĥ = EMA (factor `hit_window`) of the continuations' per-tick
  # prefix-hit rate; h* = a slower EMA of ĥ (`reference_window`), the recent healthy level.
  hit_window: float = 0.8
  reference_window: float = 0.98

  def __post_init__(self):
    if self.instances < 1 or self.capacity <= 0 or self.ticks < 1 or self.batch < 1:
      raise ValueError(f"SimConfig: instances, capacity, ticks, batch must be positive: {self}")
    if len(self.target) != len(CLASSES) or min(self.target) < 0 or sum(self.target) <= 0:
      raise ValueError(f"SimConfig.target needs {len(CLASSES)} weights >= 0, got {self.target}")


class Turn(NamedTuple):
  prompt: float  # new prompt blocks appended this turn
  output: float  # blocks generated
  gap: float  # tool gap after the turn (ticks; 0 for the last)


@dataclasses.dataclass
class SimSession:
  id: int
  cls: str
  turns: list[Turn]
  turn: int = 0
  context: float = 0.0  # blocks of the context before the current turn's prompt
  instance: int = -1
  released: float = 0.0
  admitted: float = -1.0
  peak: float = 0.0


def make_session(cls: str, sid: int, rng: np.random.Generator, config: SimConfig) -> SimSession:
  """One session of class `cls` (agent / rlvr / rlhf), lengths drawn from `rng`."""

  def draw(median):
    return float(median * np.exp(config.sigma * rng.standard_normal()))

  if cls == "agent":
    n = int(rng.integers(config.agent_turns[0], config.agent_turns[1] + 1))
    turns = [Turn(draw(config.agent_prompt) if i == 0 else draw(config.agent_tool_output),
                  draw(config.agent_output),
                  float(rng.exponential(config.agent_gap)) if i < n - 1 else 0.0)
             for i in range(n)]
  elif cls == "rlvr":
    turns = [Turn(draw(config.rlvr_prompt), min(draw(config.rlvr_output),
                                                4 * config.rlvr_output), 0.0)]
  elif cls == "rlhf":
    turns = [Turn(draw(config.rlhf_prompt), draw(config.rlhf_output), 0.0)]
  else:
    raise ValueError(f"unknown session class {cls!r}; known: {', '.join(CLASSES)}")
  return SimSession(sid, cls, turns)


class _Request:
  __slots__ = ("session", "prefill", "decode", "kv", "started")

  def __init__(self, session: SimSession):
    self.session = session
    self.prefill = 0.0
    self.decode = session.turns[session.turn].output
    self.kv = 0.0
    self.started = False


class _Instance:
  """One server: a FIFO waiting queue, running requests, an LRU prefix cache."""

  def __init__(self, index: int, config: SimConfig, ledger: admission.Ledger):
    self.index, self.config, self.ledger = index, config, ledger
    self.queue: collections.deque[_Request] = collections.deque()
    self.running: list[_Request] = []
    self.cache: collections.OrderedDict[int, float] = collections.OrderedDict()
    self.hit_ema, self.reference = 1.0, 1.0
    self.cap, self.degraded = float(config.cap), 0
    self.hit_blocks = self.requested_blocks = 0.0
    self.tick_hit = self.tick_requested = 0.0

  def resident(self) -> float:
    return sum(r.kv for r in self.running) + sum(self.cache.values())

  def in_flight(self) -> int:
    return len(self.queue) + len(self.running)

  def backlog_delay(self) -> float:
    return (sum(r.prefill for r in self.running) + sum(
      r.session.context + r.session.turns[r.session.turn].prompt for r in self.queue)
            ) / self.config.prefill_rate

  def _evict(self, need: float, keep: int | None = None) -> None:
    """Evicts LRU cached prefixes until `need` blocks are free (or the cache is empty)."""
    free = self.config.capacity - self.resident()
    for sid in list(self.cache):
      if free >= need:
        return
      if sid == keep:
        continue
      free += self.cache.pop(sid)

  def start_waiting(self) -> None:
    """Starts queued requests, oldest first, while their context fits."""
    while self.queue:
      request = self.queue[0]
      session = request.session
      context = session.context + session.turns[session.turn].prompt
      hit = min(self.cache.get(session.id, 0.0), session.context)
      self._evict(context - self.cache.get(session.id, 0.0), keep=session.id)
      free = self.config.capacity - self.resident() + self.cache.get(session.id, 0.0)
      if context > free and self.running:
        return  # head of line waits for room
      self.cache.pop(session.id, None)
      self.queue.popleft()
      request.prefill, request.kv, request.started = context - hit, context, True
      self.hit_blocks += hit
      self.requested_blocks += context
      if session.turn > 0:  # the overload signal watches continuations' prefixes
        self.tick_hit += hit
        self.tick_requested += session.context
      self.running.append(request)

  def update_hit_rates(self) -> None:
    """ĥ (fast EMA of this tick's continuation hit rate) and h* (slow EMA): PROPOSAL."""
    if self.tick_requested > 0:
      rate = self.tick_hit / self.tick_requested
      a, b = self.config.hit_window, self.config.reference_window
      self.hit_ema = a * self.hit_ema + (1 - a) * rate
      self.reference = b * self.reference + (1 - b) * self.hit_ema
    self.tick_hit = self.tick_requested = 0.0

  def step(self) -> list[_Request]:
    """One tick of compute; returns the requests whose turn finished."""
    budget = 1.0
    for request in self.running:
      if request.prefill > 0 and budget > 0:
        done = min(request.prefill, budget * self.config.prefill_rate)
        request.prefill -= done
        budget -= done / self.config.prefill_rate
    decoding = [r for r in self.running if r.prefill <= 1e-12]
    finished = []
    if decoding and budget > 0:
      speed = budget * self.config.decode_rate / (1 + len(decoding) / self.config.decode_half_batch)
      for request in decoding:
        step = min(request.decode, speed)
        request.decode -= step
        request.kv += step
        request.session.peak = max(request.session.peak, request.kv)
        if request.decode <= 1e-12:
          finished.append(request)
    self.running = [r for r in self.running if r not in finished]
    # Growth past the capacity: evict cached prefixes, then preempt the newest requests.
    if self.resident() > self.config.capacity:
      self._evict(0.0)
    while self.resident() > self.config.capacity and len(self.running) > 1:
      victim = self.running.pop()
      session = victim.session
      generated = session.turns[session.turn].output - victim.decode
      # Recomputed from scratch later: the generated part joins the context.
      session.turns[session.turn] = session.turns[session.turn]._replace(
        prompt=session.turns[session.turn].prompt + generated, output=victim.decode)
      self.queue.appendleft(_Request(session))
    return finished


class SimResult(NamedTuple):
  samples_per_tick: float
  hit_rate: float
  tv: float  # mean per-iteration TV of the consumed mixture from the target
  completed: int
  released: int
  live: int
  held: int
  iterations: int
  mean_cap: float


def _mixture_order(config: SimConfig, rng: np.random.Generator) -> list[str]:
  counts = np.floor(np.asarray(config.target) / sum(config.target) * config.batch).astype(int)
  rest = np.asarray(config.target) / sum(config.target) * config.batch - counts
  for i in np.argsort(-rest, kind="stable")[:config.batch - counts.sum()]:
    counts[i] += 1
  order = [c for c, n in zip(CLASSES, counts) for _ in range(n)]
  return [order[i] for i in rng.permutation(len(order))]


def simulate(config: SimConfig, policy: str, seed: int) -> SimResult:
  """Runs the pool for `config.ticks` ticks under `policy` (module docstring).

  The workload's random numbers come from a stream of their own (`seed`), so every policy sees
  the same sessions in the same release order.
  """
  pol = admission.get_policy(policy)
  work_rng = np.random.default_rng([seed, 0])
  target = np.asarray(config.target, np.float64)
  priors_fp = {"agent": config.agent_prompt + 8 * config.agent_tool_output,
               "rlvr": config.rlvr_prompt + config.rlvr_output,
               "rlhf": config.rlhf_prompt + config.rlhf_output}
  priors_res = {"agent": 10.0, "rlvr": 60.0, "rlhf": 15.0}
  instances = [_Instance(w, config, admission.Ledger(CLASSES, priors_fp, priors_res))
               for w in range(config.instances)]
  backlog: list[SimSession] = []  # released, not admitted (held)
  router_queue: list[SimSession] = []  # continuations waiting for a slot (static only)
  gaps: list[tuple[float, int, SimSession]] = []  # (ready time, id, session) in tool gaps
  completed: list[SimSession] = []
  unconsumed = 0
  released = 0
  iterations, tvs, caps = 0, [], []
  next_id = 0

  def release(now: float) -> None:
    nonlocal released, next_id
    for cls in _mixture_order(config, work_rng):
      session = make_session(cls, next_id, work_rng, config)
      session.released = now
      backlog.append(session)
      instances[next_id % config.instances].ledger.hold(session.id, cls)
      next_id += 1
      released += 1

  for _ in range(config.outstanding):
    release(0.0)
  for tick in range(config.ticks):
    now = float(tick)
    # Sessions whose tool gap ended: their next turn asks to run (continuations).
    ready = [s for t, _, s in gaps if t <= now]
    gaps = [g for g in gaps if g[0] > now]
    router_queue.extend(ready)
    still = []
    for session in router_queue:
      inst = instances[session.instance]
      view = admission.View(inst.ledger, config.capacity, inst.in_flight(), inst.cap)
      if pol.admit(view, session.cls, True):
        inst.queue.append(_Request(session))
      else:
        still.append(session)
    router_queue = still
    # New sessions: one scheduling epoch per tick, caps computed once per instance.
    protected = config.protected * config.capacity
    views = [admission.View(i.ledger, protected, i.in_flight(), i.cap) for i in instances]
    epoch_caps = [pol.caps(v) for v in views]
    kept = []
    delays = np.array([i.backlog_delay() for i in instances])
    rates = np.full(config.instances, config.prefill_rate)
    blocked: set[str] = set()  # classes held everywhere this epoch (admitting more only
    for session in backlog:     # raises the counts the policies compare, so they stay held)
      if session.cls in blocked:
        kept.append(session)
        continue
      first = session.turns[0].prompt
      costs = admission.placement_cost(first, np.zeros(config.instances), delays, rates)
      placed = False
      for w in np.argsort(costs, kind="stable"):
        inst = instances[int(w)]
        view = admission.View(inst.ledger, protected, inst.in_flight(), inst.cap)
        if pol.admit(view, session.cls, False, epoch_caps[int(w)]):
          # The demand moves from the ledger it was held in to the placing instance's.
          instances[session.id % config.instances].ledger.held[session.cls].remove(session.id)
          inst.ledger.admit(session.id, session.cls, pending=False)
          session.instance, session.admitted = int(w), now
          inst.queue.append(_Request(session))
          delays[int(w)] += first / config.prefill_rate
          placed = True
          break
      if not placed:
        kept.append(session)
        blocked.add(session.cls)
    backlog = kept
    # Compute.
    for inst in instances:
      inst.start_waiting()
      for request in inst.step():
        session = request.session
        session.context += session.turns[session.turn].prompt + session.turns[session.turn].output
        gap = session.turns[session.turn].gap
        session.turn += 1
        if session.turn < len(session.turns):
          inst.cache[session.id] = request.kv  # the prefix stays cached through the gap
          inst.cache.move_to_end(session.id)
          gaps.append((now + 1 + gap, session.id, session))
        else:
          inst.ledger.complete(session.id, footprint=session.peak,
                               residency=now + 1 - session.admitted)
          completed.append(session)
          unconsumed += 1
      # The global cap (PROPOSAL): a moving reference, cut on confirmed hit degradation.
      inst.update_hit_rates()
      if policy != "static" and config.adaptive_cap:
        fp = inst.ledger.footprints
        seen = [x for c in CLASSES for x in fp[c]]
        mean_fp = float(np.mean(seen)) if seen else float(np.mean(list(priors_fp.values())))
        reference = config.cap_rule.headroom * config.capacity / mean_fp
        inst.cap, inst.degraded = admission.update_global_cap(
          inst.cap, reference, float(admission.overload_pressure(inst.reference, inst.hit_ema)),
          inst.degraded, config.cap_rule)
      caps.append(inst.cap)
    # The trainer: consume complete iterations in completion order, then release more.
    while unconsumed >= config.batch:
      batch = completed[len(completed) - unconsumed:len(completed) - unconsumed + config.batch]
      counts = [sum(s.cls == c for s in batch) for c in CLASSES]
      tvs.append(admission.mixture_tv(counts, target))
      unconsumed -= config.batch
      iterations += 1
      release(now + 1)
  live = sum(i.ledger.live() for i in instances)
  held = sum(len(i.ledger.held[c]) for i in instances for c in CLASSES)
  hit = sum(i.hit_blocks for i in instances)
  requested = sum(i.requested_blocks for i in instances)
  return SimResult(samples_per_tick=len(completed) / config.ticks,
                   hit_rate=hit / requested if requested else 1.0,
                   tv=float(np.mean(tvs)) if tvs else 0.0, completed=len(completed),
                   released=released, live=live, held=held, iterations=iterations,
                   mean_cap=float(np.mean(caps)))
