"""Reward-module pools (MLREF, "Module-Level Reward Evolution Framework", arXiv 2608.18827).

The reward is a weighted sum of small, named, versioned reward modules drawn from a persistent
pool (Eq. 1):

    R(s, a) = Σ_{k=1}^{K} w_k · m_k(s, a)

Each module m_k is a `ModuleSpec` whose code is one allow-listed function of a feature dict (see
`module_code`); `build_reward_fn` turns a list of them into one jittable function
`(features, weights) -> RewardOutput` that a PPO loop calls on `{name: [*batch, *shape]}` arrays
inside `jit`. Weights are an argument, so re-weighting does not recompile.

Which modules enter R and with which weights is the hybrid credit of Appendix A:

1. LLM credit c_LLM (the proposer's weights, normalised) and correlation credit c_corr
   (`correlation_credit` of each module's reward curve against the performance curve of the
   previous RL run), each smoothed by an EMA (init 0);
2. fusion s = w_LLM·s_llm + (1 − w_LLM)·softmax((c̃_corr − max c̃_corr)/τ) (`fuse_scores`);
3. UCB top-K (`ucb_select`); the selected modules' s_k are their weights w_k.

Per iteration S pool variants are proposed and trained; `merge_variants` keeps those within a
margin t of the historical best, unions their modules (best variant wins name collisions) or rolls
back when none survives. `PoolState` holds everything an interrupted run needs (pool, credits,
counts, best reward, failures for the next reflection, vetting cache) and is saved as JSON in the
workdir (`save_state` / `load_state`).

The pure maths lives in `credit.py` and is re-exported here.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tempfile
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_post.rewards import module_code
from jaxrl_post.rewards.credit import (  # noqa: F401 - re-exported public API.
    correlation_credit,
    correlation_credits,
    ema,
    fuse_scores,
    lagged_correlations,
    moving_average,
    normalize_llm_weights,
    pearson,
    slow_difference,
    ucb_scores,
    ucb_select,
)

STATE_FILENAME = "module_pool.json"
STATE_FORMAT = 1
PLAN_OPS = ("ADD", "DELETE", "MODIFY", "REWRITE")

# ---------------------------------------------------------------------------------------------
# Module specs and pools.
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModuleSpec:
  """One reward module: a named, versioned, allow-listed function of the features.

  Attributes:
    name: identifier, unique in a pool (`[a-z][a-z0-9_]{0,63}`).
    description: what the module rewards (shown to the proposer).
    code: Python source, one `def fn(f): ... return <[*batch] array>` (see `module_code`).
    version: 1 for a new module, +1 for each MODIFY / REWRITE.
    lineage: uids ("name@version") of the versions this one descends from, oldest first.
    origin: the operation that produced this version: INIT, ADD, MODIFY or REWRITE.
    iteration: the outer iteration that produced it (0 = given by the user).
  """
  name: str
  description: str
  code: str
  version: int = 1
  lineage: tuple[str, ...] = ()
  origin: str = "INIT"
  iteration: int = 0

  def __post_init__(self):
    module_code.validate_name(self.name)
    object.__setattr__(self, "lineage", tuple(self.lineage))

  @property
  def uid(self) -> str:
    return f"{self.name}@{self.version}"

  def to_json(self) -> dict:
    d = dataclasses.asdict(self)
    d["lineage"] = list(self.lineage)
    return d

  @classmethod
  def from_json(cls, d: Mapping) -> ModuleSpec:
    return cls(**{**d, "lineage": tuple(d.get("lineage", ()))})

  def derive(self, *, code: str, description: str | None, origin: str,
             iteration: int) -> ModuleSpec:
    """The next version of this module (MODIFY / REWRITE), with lineage extended."""
    return ModuleSpec(name=self.name, description=description or self.description, code=code,
                      version=self.version + 1, lineage=self.lineage + (self.uid,),
                      origin=origin, iteration=iteration)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModuleStats:
  """Per-module method state (keyed by module name, kept across versions — PROPOSAL).

  Attributes:
    ema_llm: c̃_LLM, EMA of the LLM credit.
    ema_corr: c̃_corr, EMA of the correlation credit.
    count: n_i, how often the module was selected into R.
  """
  ema_llm: float = 0.0
  ema_corr: float = 0.0
  count: int = 0


@dataclasses.dataclass(frozen=True)
class Pool:
  """An ordered set of modules with their credit state. Treat as immutable."""
  modules: tuple[ModuleSpec, ...] = ()
  stats: Mapping[str, ModuleStats] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    names = [m.name for m in self.modules]
    if len(set(names)) != len(names):
      raise ValueError(f"duplicate module names in pool: {names}")
    object.__setattr__(self, "modules", tuple(self.modules))
    object.__setattr__(self, "stats", {n: self.stats.get(n, ModuleStats()) for n in names})

  @property
  def names(self) -> tuple[str, ...]:
    return tuple(m.name for m in self.modules)

  def __len__(self) -> int:
    return len(self.modules)

  def __contains__(self, name: str) -> bool:
    return name in self.stats

  def get(self, name: str) -> ModuleSpec:
    for m in self.modules:
      if m.name == name:
        return m
    raise KeyError(f"no module {name!r}; pool has {list(self.names)}")

  def put(self, module: ModuleSpec, stats: ModuleStats | None = None) -> Pool:
    """Adds or replaces (same name, same position) a module; stats kept unless given."""
    mods = list(self.modules)
    names = self.names
    if module.name in names:
      mods[names.index(module.name)] = module
    else:
      mods.append(module)
    new_stats = dict(self.stats)
    if stats is not None:
      new_stats[module.name] = stats
    return Pool(tuple(mods), new_stats)

  def remove(self, name: str) -> Pool:
    return Pool(tuple(m for m in self.modules if m.name != name),
                {k: v for k, v in self.stats.items() if k != name})

  def with_stats(self, stats: Mapping[str, ModuleStats]) -> Pool:
    return Pool(self.modules, {**self.stats, **{k: v for k, v in stats.items() if k in self}})

  def to_json(self) -> dict:
    return {"modules": [m.to_json() for m in self.modules],
            "stats": {k: dataclasses.asdict(v) for k, v in self.stats.items()}}

  @classmethod
  def from_json(cls, d: Mapping) -> Pool:
    return cls(tuple(ModuleSpec.from_json(m) for m in d.get("modules", ())),
               {k: ModuleStats(**v) for k, v in d.get("stats", {}).items()})


# ---------------------------------------------------------------------------------------------
# The composed reward R = Σ w_k m_k.
# ---------------------------------------------------------------------------------------------


class RewardOutput(NamedTuple):
  """Output of a composed reward function.

  Attributes:
    reward: `[*batch]` R = Σ_k w_k m_k.
    terms: `[K, *batch]` the (neutralised) module outputs m_k; log their per-epoch means as the
      module reward curves for the correlation credit.
    nonfinite: `[K]` int32, how many entries of each m_k were NaN/inf and replaced by 0.
    failed: `[K]` int32, 1 where m_k raised when traced (or returned something that is not a
      floating array of the batch shape) and was replaced by zeros (see `build_reward_fn`).
  """
  reward: jax.Array
  terms: jax.Array
  nonfinite: jax.Array
  failed: jax.Array


def compose_reward(terms: jax.Array, weights: jax.Array) -> jax.Array:
  """R = Σ_k w_k · m_k (MLREF Eq. 1, arXiv 2608.18827).

  Args:
    terms: `[K, *batch]` module outputs m_k.
    weights: `[K]` weights w_k.

  Returns:
    `[*batch]`.

  Examples:
    >>> import jax.numpy as jnp
    >>> compose_reward(jnp.array([[1.0, 2.0], [3.0, 4.0]]), jnp.array([0.5, 0.25])).tolist()
    [1.25, 2.0]
  """
  terms = jnp.asarray(terms)
  weights = jnp.asarray(weights, terms.dtype)
  return jnp.tensordot(weights, terms, axes=1)


class PoolRewardFn:
  """The composed reward of `build_reward_fn`: `reward_fn(features, weights) -> RewardOutput`.

  Attributes:
    names: the K module names, in the order of `weights`.
    failures: module name → why it failed (filled at trace / compile time, in the trainer's
      process); such a module contributes zeros and `RewardOutput.failed` marks it.
  """

  def __init__(self, names: Sequence[str], fns: Sequence[Callable | None],
               feature_spec: Mapping[str, tuple[int, ...]], clip: float | None, guard: bool,
               failures: dict[str, str]):
    self.names = tuple(names)
    self.failures = failures
    self._fns, self._spec, self._clip, self._guard = list(fns), dict(feature_spec), clip, guard

  def _term(self, k: int, features, batch_shape, dtype):
    """m_k(features) as `[*batch]` `dtype`, or None if it fails (and `guard` is on)."""
    fn = self._fns[k]
    if fn is None:
      return None
    try:
      out = fn(features)
      if not jnp.issubdtype(jnp.result_type(out), jnp.floating):
        raise TypeError(f"output dtype {jnp.result_type(out)}; need a floating dtype")
      return jnp.broadcast_to(jnp.asarray(out, dtype), batch_shape)
    except Exception as e:  # noqa: BLE001 - any failure of proposed code drops that module.
      if not self._guard:
        raise
      self.failures.setdefault(self.names[k], f"{type(e).__name__}: {e}"[:300])
      return None

  def __call__(self, features: Mapping[str, jax.Array], weights: jax.Array) -> RewardOutput:
    name0, shape0 = next(iter(self._spec.items()))
    x0 = jnp.asarray(features[name0])
    batch_shape = x0.shape[:x0.ndim - len(shape0)]
    dtype = jnp.result_type(x0.dtype, jnp.float32)
    weights = jnp.asarray(weights, dtype)
    if weights.shape != (len(self._fns),):
      raise ValueError(f"weights shape {weights.shape} != ({len(self._fns)},)")
    if not self._fns:
      zero = jnp.zeros(batch_shape, dtype)
      empty = jnp.zeros((0,), jnp.int32)
      return RewardOutput(zero, jnp.zeros((0,) + batch_shape, dtype), empty, empty)
    terms, bad, failed = [], [], []
    for k in range(len(self._fns)):
      out = self._term(k, features, batch_shape, dtype)
      failed.append(out is None)
      out = jnp.zeros(batch_shape, dtype) if out is None else out
      finite = jnp.isfinite(out)
      bad.append(jnp.sum(~finite).astype(jnp.int32))
      out = jnp.where(finite, out, 0.0)
      if self._clip is not None:
        out = jnp.clip(out, -self._clip, self._clip)
      terms.append(out)
    terms = jnp.stack(terms)
    return RewardOutput(compose_reward(terms, weights), terms, jnp.stack(bad),
                        jnp.asarray(failed, jnp.int32))


def build_reward_fn(modules: Sequence[ModuleSpec], feature_spec: Mapping[str, Sequence[int]], *,
                    clip: float | None = None, guard: bool = True) -> PoolRewardFn:
  """Compiles modules into one jittable `reward_fn(features, weights) -> RewardOutput`.

  Only pass modules that passed `sandbox.vet_modules` (a `PoolState` only holds such modules):
  this executes their code in the calling process.

  Each m_k(features) is broadcast to the batch shape, non-finite entries are replaced by 0 and
  counted (neutralisation of NaN/inf at run time — PROPOSAL, the paper does not say), and, if
  `clip` is given, clipped to [−clip, clip]. Then R = Σ_k w_k m_k (`compose_reward`).

  With `guard` (default), a module that raises when compiled or traced at the trainer's shapes
  (e.g. shapes that worked at the vetting batch only), or returns a non-floating or
  non-broadcastable value, contributes zeros, is marked in `RewardOutput.failed` and its reason
  kept in `reward_fn.failures`, so one bad module does not end the run; the trainer drops it
  (`rl_control.ppo`, metric `pool/dropped_modules`). What no guard can catch is a process abort:
  an allocation beyond the machine's memory ends in `std::bad_alloc` inside XLA, which Python never
  sees. That is why `sandbox.vet_modules` bounds each module's size and cost per sample at the
  trainer's batch before it enters the pool.

  Args:
    modules: K modules, in the order of `weights`.
    feature_spec: feature name → per-sample shape; fixes the batch shape of the inputs.
    clip: optional bound on |m_k|.
    guard: replace failing modules by zeros (True) or let their exception through (False).

  Returns:
    A `PoolRewardFn` `reward_fn(features, weights)`, with `features` a dict of
    `[*batch, *shape]` arrays (extra keys are ignored) and `weights` `[K]`. Pure; use inside
    `jax.jit`.
  """
  feature_spec = {k: tuple(int(d) for d in v) for k, v in feature_spec.items()}
  if not feature_spec:
    raise ValueError("feature_spec must name at least one feature")
  fns, failures = [], {}
  for m in modules:
    try:
      fns.append(module_code.compile_module(m.code, feature_spec.keys()))
    except Exception as e:  # noqa: BLE001 - as in `PoolRewardFn._term`.
      if not guard:
        raise
      failures[m.name] = f"{type(e).__name__}: {e}"[:300]
      fns.append(None)
  return PoolRewardFn([m.name for m in modules], fns, feature_spec, clip, guard, failures)


# ---------------------------------------------------------------------------------------------
# Hybrid credit and selection.
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class CreditConfig:
  """Hybrid-credit hyperparameters; defaults are the paper's Table 4 (arXiv 2608.18827).

  Attributes:
    smooth_window: w_s.
    diff_window: w_d.
    max_lag: L.
    w_raw: weight of the raw vs differenced correlation.
    alpha: EMA α of both credits.
    tau: softmax temperature τ of the correlation scores.
    w_llm: w_LLM, weight of the LLM scores in the fusion.
    gamma: UCB γ.
    k: K, most modules in R.
    renormalize: rescale the selected s_k to sum 1 (the paper does not renormalise — default
      False; PROPOSAL knob).
  """
  smooth_window: int = 30
  diff_window: int = 30
  max_lag: int = 10
  w_raw: float = 0.5
  alpha: float = 0.7
  tau: float = 0.25
  w_llm: float = 0.5
  gamma: float = 0.2
  k: int = 5
  renormalize: bool = False

  def __post_init__(self):
    if min(self.smooth_window, self.diff_window) < 1 or self.max_lag < 0 or self.k < 1:
      raise ValueError(f"invalid windows / lag / k in {self}")
    if not (0 <= self.w_raw <= 1 and 0 < self.alpha <= 1 and 0 <= self.w_llm <= 1):
      raise ValueError(f"w_raw, alpha, w_llm must be in [0, 1] in {self}")
    if self.tau <= 0 or self.gamma < 0:
      raise ValueError(f"tau must be > 0 and gamma >= 0 in {self}")


def update_llm_credit(pool: Pool, llm_weights: Mapping[str, float], *, alpha: float) -> Pool:
  """c̃_LLM ← α·c_LLM + (1 − α)·c̃_LLM with c_LLM the normalised proposer weights.

  Modules the proposer did not select get c_LLM = 0 (arXiv 2608.18827); names not in the pool
  are ignored.

  Args:
    pool: the pool variant.
    llm_weights: module name → proposed weight.
    alpha: EMA α.

  Returns:
    The pool with updated `ema_llm`.
  """
  names = pool.names
  raw = np.array([max(float(llm_weights.get(n, 0.0)), 0.0) for n in names], np.float64)
  raw = np.where(np.isfinite(raw), raw, 0.0)
  c = raw / raw.sum() if raw.sum() > 0 else np.zeros_like(raw)
  stats = {n: dataclasses.replace(pool.stats[n],
                                  ema_llm=alpha * float(c[i]) +
                                  (1 - alpha) * pool.stats[n].ema_llm)
           for i, n in enumerate(names)}
  return pool.with_stats(stats)


def update_corr_credit(pool: Pool, performance: Sequence[float],
                       module_curves: Mapping[str, Sequence[float]], *,
                       config: CreditConfig) -> Pool:
  """c̃_corr ← α·c_corr + (1 − α)·c̃_corr for modules with a reward curve from the last run.

  c_corr is `correlation_credit(performance, curve)` (App. A of arXiv 2608.18827). Modules
  without a curve (new this iteration) keep their c̃_corr (PROPOSAL).

  Args:
    pool: the pool.
    performance: `[T]` performance curve of the run the curves come from.
    module_curves: module name → `[T]` mean module reward per epoch.
    config: `CreditConfig`.

  Returns:
    The pool with updated `ema_corr`.
  """
  names = [n for n in pool.names if n in module_curves]
  if not names or len(performance) == 0:
    return pool
  curves = np.stack([np.asarray(module_curves[n], np.float32) for n in names])
  # Pad the module axis to a multiple of 8 so that pools of similar size share one compile
  # (zero rows have zero variance and get credit 0; they are dropped below).
  pad = -len(names) % 8
  curves = np.concatenate([curves, np.zeros((pad, curves.shape[1]), np.float32)])
  c = np.asarray(correlation_credits(np.asarray(performance, np.float32), curves,
                                     smooth_window=config.smooth_window,
                                     diff_window=config.diff_window, max_lag=config.max_lag,
                                     w_raw=config.w_raw))
  c = np.where(np.isfinite(c), c, 0.0)
  stats = {n: dataclasses.replace(pool.stats[n],
                                  ema_corr=config.alpha * float(c[i]) +
                                  (1 - config.alpha) * pool.stats[n].ema_corr)
           for i, n in enumerate(names)}
  return pool.with_stats(stats)


class Selection(NamedTuple):
  """The modules chosen into R and their weights.

  Attributes:
    names: selected module names, by decreasing UCB.
    weights: `[len(names)]` their composite scores s_k (= w_k in Eq. 1).
    scores: name → s_i for every module of the variant.
    ucb: name → u_i for every module of the variant.
  """
  names: tuple[str, ...]
  weights: np.ndarray
  scores: dict[str, float]
  ucb: dict[str, float]


def select_modules(pool: Pool, *, config: CreditConfig) -> tuple[Selection, Pool]:
  """Fusion + UCB top-K over the pool's EMA credits; increments the selection counts.

  s = fuse_scores(c̃_LLM, c̃_corr), u_i = s_i + γ·sqrt(ln(U + 1))/(n_i + 1) with
  U = Σ_i n_i over this variant's modules, top-K by u, weights w_k = s_k (arXiv 2608.18827).

  Args:
    pool: a non-empty pool variant.
    config: `CreditConfig`.

  Returns:
    `(Selection, pool with n_i += 1 for the selected modules)`.
  """
  if not len(pool):
    raise ValueError("cannot select from an empty pool")
  names = pool.names
  llm = np.array([pool.stats[n].ema_llm for n in names], np.float32)
  corr = np.array([pool.stats[n].ema_corr for n in names], np.float32)
  counts = np.array([pool.stats[n].count for n in names], np.float32)
  s = np.asarray(fuse_scores(llm, corr, tau=config.tau, w_llm=config.w_llm), np.float64)
  total = float(counts.sum())
  u = np.asarray(ucb_scores(s, counts, total, gamma=config.gamma), np.float64)
  idx = [int(i) for i in np.asarray(ucb_select(s, counts, total, gamma=config.gamma,
                                                k=config.k))]
  chosen = tuple(names[i] for i in idx)
  weights = s[idx].astype(np.float32)
  if config.renormalize and weights.sum() > 0:
    weights = weights / weights.sum()
  stats = {n: dataclasses.replace(pool.stats[n], count=pool.stats[n].count + 1) for n in chosen}
  sel = Selection(chosen, weights, {n: float(s[i]) for i, n in enumerate(names)},
                  {n: float(u[i]) for i, n in enumerate(names)})
  return sel, pool.with_stats(stats)


# ---------------------------------------------------------------------------------------------
# Improvement plans and merging.
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlanOp:
  """One step of an improvement plan.

  Attributes:
    op: ADD (new module), DELETE (drop; the paper also says REMOVE), MODIFY (targeted edit of
      an existing module, new version), REWRITE (new implementation of an existing module from
      its name and description, new version). The MODIFY / REWRITE distinction is our reading
      of the paper's plan vocabulary.
    name: the module.
    description: new / updated description.
    code: the module source (None for DELETE).
    rationale: why (fed back to the proposer).
  """
  op: str
  name: str
  description: str = ""
  code: str | None = None
  rationale: str = ""

  def __post_init__(self):
    op = "DELETE" if self.op.upper() == "REMOVE" else self.op.upper()
    if op not in PLAN_OPS:
      raise ValueError(f"unknown plan op {self.op!r}; valid: {PLAN_OPS}")
    object.__setattr__(self, "op", op)

  def to_json(self) -> dict:
    return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ImprovePlan:
  """A proposer's plan for one pool variant: a rationale and ordered ops."""
  rationale: str = ""
  ops: tuple[PlanOp, ...] = ()

  def to_json(self) -> dict:
    return {"rationale": self.rationale, "ops": [o.to_json() for o in self.ops]}


@dataclasses.dataclass(frozen=True, kw_only=True)
class RejectedModule:
  """A proposed module (version) that did not enter the pool, with the reason."""
  iteration: int
  variant: int
  name: str
  op: str
  reason: str
  stage: str
  code: str = ""


def apply_plan(pool: Pool, plan: ImprovePlan, *, accept: Callable[[str], tuple[bool, str, str]],
               iteration: int, variant: int, max_modules: int | None = None
               ) -> tuple[Pool, list[PlanOp], list[RejectedModule]]:
  """Applies the vetted ops of `plan` to `pool`.

  Args:
    pool: the pool the plan was made for.
    plan: `ImprovePlan`.
    accept: code → (ok, reason, stage), normally a lookup of `sandbox.vet_modules` verdicts.
    iteration: outer iteration (recorded in versions / rejections).
    variant: variant index (recorded in rejections).
    max_modules: optional cap on the pool size (further ADDs are rejected) — PROPOSAL.

  Returns:
    `(new pool, applied ops, rejected modules)`. A rejected MODIFY / REWRITE keeps the old
    version; a rejected ADD adds nothing. New modules start with zero credit and count.
  """
  applied, rejected = [], []

  def reject(op, reason, stage="plan"):
    rejected.append(RejectedModule(iteration=iteration, variant=variant, name=op.name, op=op.op,
                                   reason=reason, stage=stage, code=op.code or ""))

  for op in plan.ops:
    try:
      module_code.validate_name(op.name)
    except module_code.ModuleCodeError as e:
      reject(op, str(e), "validate")
      continue
    if op.op == "DELETE":
      if op.name in pool:
        pool = pool.remove(op.name)
        applied.append(op)
      else:
        reject(op, f"DELETE of unknown module {op.name!r}")
      continue
    if op.op == "ADD" and op.name in pool:
      reject(op, f"ADD of existing module {op.name!r} (use MODIFY / REWRITE)")
      continue
    if op.op in ("MODIFY", "REWRITE") and op.name not in pool:
      reject(op, f"{op.op} of unknown module {op.name!r}")
      continue
    if op.op == "ADD" and max_modules is not None and len(pool) >= max_modules:
      reject(op, f"pool is full ({max_modules} modules)")
      continue
    if not op.code:
      reject(op, "no code")
      continue
    ok, reason, stage = accept(op.code)
    if not ok:
      reject(op, reason, stage)
      continue
    if op.op == "ADD":
      origin = "INIT" if iteration <= 1 else "ADD"
      pool = pool.put(ModuleSpec(name=op.name, description=op.description, code=op.code,
                                 origin=origin, iteration=iteration), ModuleStats())
    else:
      pool = pool.put(pool.get(op.name).derive(code=op.code, description=op.description,
                                               origin=op.op, iteration=iteration))
    applied.append(op)
  return pool, applied, rejected


class MergeResult(NamedTuple):
  """Outcome of `merge_variants`.

  Attributes:
    pool: the new global pool.
    survivors: indices of surviving variants, best score first.
    rolled_back: no variant survived; `pool` is the previous pool.
    discarded: (variant index, reason) of each discarded variant.
    owner: module name → index of the variant whose version (and credit state) was kept.
  """
  pool: Pool
  survivors: tuple[int, ...]
  rolled_back: bool
  discarded: tuple[tuple[int, str], ...]
  owner: dict[str, int]


def merge_variants(previous: Pool, variants: Sequence[Pool], scores: Sequence[float], *,
                   best_score: float | None, threshold: float,
                   relative: bool = False) -> MergeResult:
  """Merge with rollback (MLREF, arXiv 2608.18827).

  Variants with a non-finite score, or with score < S_best − t, are discarded (S_best is the
  historical best *before* this round, so in the first round every finite variant survives;
  t = `threshold`, or t = threshold·|S_best| when `relative` — the paper does not say which,
  default absolute). The survivors' modules are unioned, the best-scoring survivor's version
  (and credit state) winning name collisions, in that variant's module order. With no survivor
  the previous pool is kept (rollback).

  Args:
    previous: the global pool the variants were derived from.
    variants: S pool variants.
    scores: their RL performance.
    best_score: S_best so far, None if none.
    threshold: soft update threshold t (paper: 0.1).
    relative: margin relative to |S_best|.

  Returns:
    `MergeResult`.
  """
  if len(variants) != len(scores):
    raise ValueError(f"{len(variants)} variants but {len(scores)} scores")
  margin = threshold * abs(best_score) if (relative and best_score is not None) else threshold
  survivors, discarded = [], []
  for i, sc in enumerate(scores):
    if sc is None or not math.isfinite(sc):
      discarded.append((i, f"non-finite score {sc}"))
    elif best_score is not None and sc < best_score - margin:
      discarded.append((i, f"score {sc:.4g} below best {best_score:.4g} - {margin:.4g}"))
    else:
      survivors.append(i)
  survivors.sort(key=lambda i: -scores[i])  # Stable: ties keep the lower variant index.
  if not survivors:
    return MergeResult(previous, (), True, tuple(discarded), {})
  merged, owner = Pool(), {}
  for i in survivors:
    for m in variants[i].modules:
      if m.name not in owner:
        owner[m.name] = i
        merged = merged.put(m, variants[i].stats[m.name])
  return MergeResult(merged, tuple(survivors), False, tuple(discarded), owner)


# ---------------------------------------------------------------------------------------------
# Persistent state.
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class FailureRecord:
  """Something that went wrong in a round, for the next feedback reflection.

  Attributes:
    iteration: outer iteration.
    variant: variant index (-1: the whole round).
    kind: "below_threshold", "nonfinite_score", "train_error", "proposer_error", "rollback",
      "empty_pool".
    detail: human-readable reason.
    score: the variant's score, if any.
  """
  iteration: int
  variant: int
  kind: str
  detail: str
  score: float | None = None


@dataclasses.dataclass(kw_only=True)
class PoolState:
  """Everything the MLREF loop needs to resume (saved as JSON in the workdir).

  Attributes:
    iteration: completed outer iterations.
    pool: the global pool P_global (vetted modules only) with credit state.
    best_score: S_best, None before the first finite score.
    best_reward: R*: {"iteration", "variant", "modules": [ModuleSpec json], "weights": [...],
      "score"}.
    history: one dict per completed round (scores, selections, survivors, plans).
    failures: all `FailureRecord`s; the next reflection reads the last round's.
    rejected: all `RejectedModule`s.
    vet_cache: `sandbox.code_key` → verdict json, so identical code is vetted once.
    reflection: the last reflection text.
    extra: free-form JSON-able data of the caller (e.g. the proposer's state).
  """
  iteration: int = 0
  pool: Pool = dataclasses.field(default_factory=Pool)
  best_score: float | None = None
  best_reward: dict | None = None
  history: list[dict] = dataclasses.field(default_factory=list)
  failures: list[FailureRecord] = dataclasses.field(default_factory=list)
  rejected: list[RejectedModule] = dataclasses.field(default_factory=list)
  vet_cache: dict[str, dict] = dataclasses.field(default_factory=dict)
  reflection: str = ""
  extra: dict[str, Any] = dataclasses.field(default_factory=dict)

  def to_json(self) -> dict:
    return {
        "format": STATE_FORMAT,
        "iteration": self.iteration,
        "pool": self.pool.to_json(),
        "best_score": _finite_or_none(self.best_score),
        "best_reward": self.best_reward,
        "history": self.history,
        "failures": [dataclasses.asdict(f) for f in self.failures],
        "rejected": [dataclasses.asdict(r) for r in self.rejected],
        "vet_cache": self.vet_cache,
        "reflection": self.reflection,
        "extra": self.extra,
    }

  @classmethod
  def from_json(cls, d: Mapping) -> PoolState:
    if d.get("format") != STATE_FORMAT:
      raise ValueError(f"unsupported pool state format {d.get('format')!r}")
    return cls(
        iteration=int(d["iteration"]), pool=Pool.from_json(d["pool"]),
        best_score=d.get("best_score"), best_reward=d.get("best_reward"),
        history=list(d.get("history", [])),
        failures=[FailureRecord(**f) for f in d.get("failures", [])],
        rejected=[RejectedModule(**r) for r in d.get("rejected", [])],
        vet_cache=dict(d.get("vet_cache", {})), reflection=d.get("reflection", ""),
        extra=dict(d.get("extra", {})))

  def failures_of(self, iteration: int) -> list[FailureRecord]:
    return [f for f in self.failures if f.iteration == iteration]

  def rejected_of(self, iteration: int) -> list[RejectedModule]:
    return [r for r in self.rejected if r.iteration == iteration]


def _finite_or_none(x):
  return None if x is None or not math.isfinite(x) else float(x)


def state_path(workdir: str | os.PathLike) -> str:
  return os.path.join(os.fspath(workdir), STATE_FILENAME)


def save_state(workdir: str | os.PathLike, state: PoolState) -> str:
  """Atomically writes `state` to `<workdir>/module_pool.json` (write, fsync, rename)."""
  workdir = os.fspath(workdir)
  os.makedirs(workdir, exist_ok=True)
  path = state_path(workdir)
  fd, tmp = tempfile.mkstemp(prefix=".module_pool.", suffix=".tmp", dir=workdir)
  try:
    with os.fdopen(fd, "w") as f:
      json.dump(state.to_json(), f, indent=1, allow_nan=False, default=_json_default)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.unlink(tmp)
    raise
  return path


def _json_default(x):
  if isinstance(x, np.ndarray):
    return x.tolist()
  if isinstance(x, np.generic):
    return x.item()
  raise TypeError(f"not JSON serialisable: {type(x).__name__}")


def load_state(workdir: str | os.PathLike) -> PoolState | None:
  """The state saved in `workdir`, or None if there is none."""
  path = state_path(workdir)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return PoolState.from_json(json.load(f))


def iter_feature_names(modules: Iterable[ModuleSpec]) -> tuple[str, ...]:
  """Feature names the modules read, in first-use order (what a trainer must provide)."""
  names: dict[str, None] = {}
  for m in modules:
    for f in module_code.validate_module_code(m.code).features:
      names[f] = None
  return tuple(names)
