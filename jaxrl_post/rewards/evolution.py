"""The MLREF outer loop (arXiv 2608.18827, Algorithm 1) around a caller-supplied RL trainer.

    for iteration in 1..I:
      reflection ← task + environment reflection (iteration 1) | feedback reflection
      for each of S variants: P_v ← init_pool (iteration 1) | improve_pool(P_global)
        (all new module code is vetted: allow-list + sandboxed test-run; rejects are recorded)
      for each variant: LLM weights → c̃_LLM; fuse with c̃_corr; UCB top-K → R_v = Σ w_k m_k
        S_v, curves ← train_fn(R_v);  c̃_corr ← EMA(correlation credit of each module's curve)
      P_global ← merge_variants({P_v}, {S_v}) with rollback; failures → next reflection
      if max_v S_v > S_best: S_best, R* ← that variant
      save the state to <workdir>/module_pool.json

`evolve` resumes from that file: a run that is stopped and restarted proposes, vets, trains and
merges exactly what an uninterrupted run would (given a deterministic proposer and trainer).

Choices where the paper is silent (PROPOSAL): the correlation credit of a module is computed from
the run of the variant it was trained in, right after that run, and travels with the module's
version through the merge (a rollback discards it with the round); `train_fn` receives every
module of the variant (unselected ones with weight 0) so that each gets a reward curve.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import math
from typing import Callable, Mapping, MutableMapping, NamedTuple, Sequence

import numpy as np

from jaxrl_post.rewards import module_pool as mp
from jaxrl_post.rewards import sandbox
from jaxrl_post.rewards.proposers import Proposer, ProposerError, TaskInfo, format_feedback

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvolutionConfig:
  """Outer-loop settings; defaults are the paper's Table 4 where it gives one.

  Attributes:
    iterations: I (paper: 9).
    num_variants: S parallel pool variants per iteration (paper: 3).
    credit: hybrid-credit hyperparameters (w_s, w_d, L, w_raw, α, τ, w_LLM, γ, K).
    merge_threshold: soft update threshold t (paper: 0.1).
    merge_relative: t relative to |S_best| instead of absolute (the paper does not say).
    max_pool_size: cap on modules per pool (PROPOSAL; the paper gives none).
    vet: how proposed modules are test-run.
    proposer_workers: threads for the S variants' proposer calls (LLM calls are I/O-bound).
  """
  iterations: int = 9
  num_variants: int = 3
  credit: mp.CreditConfig = mp.CreditConfig()
  merge_threshold: float = 0.1
  merge_relative: bool = False
  max_pool_size: int = 12
  vet: sandbox.VetConfig = sandbox.VetConfig()
  proposer_workers: int = 1


class RewardCandidate(NamedTuple):
  """One variant's reward, handed to `train_fn`.

  Attributes:
    iteration: outer iteration.
    variant: variant index.
    modules: every module of the variant (vetted), in pool order.
    weights: `[len(modules)]` float32; w_k = s_k for the selected modules, 0 for the others.
    selected: names of the selected modules.
    feature_spec: feature name → per-sample shape.
  """
  iteration: int
  variant: int
  modules: tuple[mp.ModuleSpec, ...]
  weights: np.ndarray
  selected: tuple[str, ...]
  feature_spec: Mapping[str, tuple[int, ...]]

  def reward_fn(self, *, clip: float | None = None):
    """`build_reward_fn(modules, feature_spec)`: jittable `(features, weights) -> RewardOutput`."""
    return mp.build_reward_fn(self.modules, self.feature_spec, clip=clip)


class TrainResult(NamedTuple):
  """What `train_fn` reports back.

  Attributes:
    score: final task performance S_v (higher is better; NaN/inf = failed run).
    performance: `[T]` task performance per logged epoch.
    module_curves: module name → `[T]` mean module output m_k per logged epoch (the
      `RewardOutput.terms` means); modules without a curve get no correlation update.
  """
  score: float
  performance: np.ndarray
  module_curves: Mapping[str, np.ndarray]


TrainFn = Callable[[RewardCandidate], TrainResult]
VetFn = Callable[..., list]


def evolve(info: TaskInfo, proposer: Proposer, train_fn: TrainFn, *, workdir: str,
           config: EvolutionConfig = EvolutionConfig(), initial_pool: mp.Pool | None = None,
           vet_cache: MutableMapping[str, sandbox.Verdict] | None = None) -> mp.PoolState:
  """Runs (or resumes) the MLREF loop until `config.iterations` rounds are done.

  Args:
    info: task, environment and feature description.
    proposer: `LLMProposer`, `OfflineProposer` or any `Proposer`.
    train_fn: trains an RL policy on a `RewardCandidate`, returns a `TrainResult`.
    workdir: where `module_pool.json` lives; an existing one is resumed.
    config: `EvolutionConfig`.
    initial_pool: modules to start from instead of an empty pool (fresh runs only). They are
      vetted like proposed ones.
    vet_cache: an extra verdict cache shared across runs (the state keeps its own as well).

  Returns:
    The final `PoolState` (also saved in `workdir`).
  """
  state = mp.load_state(workdir)
  if state is None:
    state = mp.PoolState()
    if initial_pool is not None and len(initial_pool):
      plan = mp.ImprovePlan(rationale="user pool", ops=tuple(
          mp.PlanOp(op="ADD", name=m.name, description=m.description, code=m.code)
          for m in initial_pool.modules))
      verdicts = _vet([plan], info, state, config, vet_cache)
      pool, _, rejected = mp.apply_plan(mp.Pool(), plan, accept=_acceptor(verdicts, info),
                                        iteration=0, variant=-1)
      state.pool, state.rejected = pool, list(rejected)
    mp.save_state(workdir, state)
  else:
    log.info("resuming MLREF from %s at iteration %d", workdir, state.iteration + 1)
  while state.iteration < config.iterations:
    state = run_iteration(state, info, proposer, train_fn, config=config, vet_cache=vet_cache)
    mp.save_state(workdir, state)
  return state


def run_iteration(state: mp.PoolState, info: TaskInfo, proposer: Proposer, train_fn: TrainFn, *,
                  config: EvolutionConfig,
                  vet_cache: MutableMapping[str, sandbox.Verdict] | None = None) -> mp.PoolState:
  """One round of Algorithm 1; returns the new state (the input is not modified)."""
  state = dataclasses.replace(state, failures=list(state.failures), rejected=list(state.rejected),
                              history=list(state.history), vet_cache=dict(state.vet_cache))
  it = state.iteration + 1
  num_v = config.num_variants
  feature_spec = {k: tuple(v) for k, v in info.feature_spec.items()}
  failures: list[mp.FailureRecord] = []

  # 1. Reflection (no code).
  try:
    reflection = proposer.reflect(info, state, iteration=it)
  except ProposerError as e:
    failures.append(mp.FailureRecord(iteration=it, variant=-1, kind="proposer_error",
                                     detail=f"reflection: {e}"))
    reflection = format_feedback(state)

  # 2. Proposals for the S variants (in threads: LLM calls wait on the network).
  base = state.pool
  initial = it == 1 or not len(base)

  def propose(v):
    try:
      if initial:
        return proposer.init_pool(info, reflection, iteration=it, variant=v, num_variants=num_v)
      return proposer.improve_pool(info, base, reflection, state, iteration=it, variant=v,
                                   num_variants=num_v)
    except ProposerError as e:
      return e

  with concurrent.futures.ThreadPoolExecutor(max(1, config.proposer_workers)) as ex:
    plans = list(ex.map(propose, range(num_v)))

  # 3. Vet all new code at once (one sandbox start-up), then apply the accepted ops.
  verdicts = _vet([p for p in plans if isinstance(p, mp.ImprovePlan)], info, state, config,
                  vet_cache)
  accept = _acceptor(verdicts, info)
  start_pool = mp.Pool() if initial else base
  variants: list[mp.Pool | None] = []
  records: list[dict] = []
  for v, plan in enumerate(plans):
    rec = {"variant": v, "score": None, "survived": False, "selected": [], "weights": []}
    records.append(rec)
    if isinstance(plan, ProposerError):
      failures.append(mp.FailureRecord(iteration=it, variant=v, kind="proposer_error",
                                       detail=str(plan)))
      variants.append(None)
      continue
    pool_v, applied, rejected = mp.apply_plan(start_pool, plan, accept=accept, iteration=it,
                                              variant=v, max_modules=config.max_pool_size)
    state.rejected.extend(rejected)
    rec["plan_summary"] = "; ".join(f"{o.op} {o.name}" for o in applied) or "no accepted ops"
    rec["plan"] = plan.rationale
    if not len(pool_v):
      failures.append(mp.FailureRecord(iteration=it, variant=v, kind="empty_pool",
                                       detail="no module passed the checks"))
      variants.append(None)
      continue
    variants.append(pool_v)

  # 4. Credit, selection and training per variant.
  scores: list[float | None] = []
  for v, pool_v in enumerate(variants):
    if pool_v is None:
      scores.append(None)
      continue
    try:
      llm_w = proposer.propose_weights(info, pool_v, reflection, iteration=it, variant=v,
                                       k=config.credit.k)
    except ProposerError as e:
      failures.append(mp.FailureRecord(iteration=it, variant=v, kind="proposer_error",
                                       detail=f"weights: {e}"))
      llm_w = {}
    pool_v = mp.update_llm_credit(pool_v, llm_w, alpha=config.credit.alpha)
    sel, pool_v = mp.select_modules(pool_v, config=config.credit)
    weights = np.zeros(len(pool_v), np.float32)
    for name, w in zip(sel.names, sel.weights):
      weights[pool_v.names.index(name)] = w
    cand = RewardCandidate(it, v, pool_v.modules, weights, sel.names, feature_spec)
    records[v].update(selected=list(sel.names), weights=[float(w) for w in sel.weights],
                      llm_weights={k: float(x) for k, x in llm_w.items()},
                      modules=[m.uid for m in pool_v.modules])
    score = None
    try:
      result = train_fn(cand)
      score = float(result.score)
      if not math.isfinite(score):
        failures.append(mp.FailureRecord(iteration=it, variant=v, kind="nonfinite_score",
                                         detail=f"training returned score {score}"))
        score = None
      else:
        pool_v = mp.update_corr_credit(pool_v, result.performance, result.module_curves,
                                       config=config.credit)
    except Exception as e:  # noqa: BLE001 - a failed run is a failure record, not a crash.
      failures.append(mp.FailureRecord(iteration=it, variant=v, kind="train_error",
                                       detail=f"{type(e).__name__}: {e}"[:500]))
    variants[v] = pool_v
    scores.append(score)
    records[v]["score"] = score

  # 5. Merge with rollback.
  merged = mp.merge_variants(base, [p if p is not None else base for p in variants],
                             [s if s is not None else math.nan for s in scores],
                             best_score=state.best_score, threshold=config.merge_threshold,
                             relative=config.merge_relative)
  for v, reason in merged.discarded:
    if scores[v] is not None:
      failures.append(mp.FailureRecord(iteration=it, variant=v, kind="below_threshold",
                                       detail=reason, score=scores[v]))
  for v in merged.survivors:
    records[v]["survived"] = True
  if merged.rolled_back:
    failures.append(mp.FailureRecord(iteration=it, variant=-1, kind="rollback",
                                     detail="no variant within the threshold; pool rolled back"))

  # 6. Best of the round; feedback kind for the next reflection.
  finite = [(s, v) for v, s in enumerate(scores) if s is not None]
  round_best = max(finite, key=lambda t: (t[0], -t[1])) if finite else None
  if merged.rolled_back:
    kind = "failed"
  elif round_best and (state.best_score is None or round_best[0] > state.best_score):
    kind = "new_best"
    s_best, v_best = round_best
    by_name = {m.name: m for m in variants[v_best].modules}
    rec = records[v_best]
    state.best_score = s_best
    state.best_reward = {"iteration": it, "variant": v_best, "score": s_best,
                         "modules": [by_name[n].to_json() for n in rec["selected"]],
                         "weights": rec["weights"]}
  else:
    kind = "regressed"
  state.history.append({"iteration": it, "kind": kind, "rolled_back": merged.rolled_back,
                        "survivors": list(merged.survivors), "variants": records,
                        "round_best": None if round_best is None else round_best[0],
                        "pool": [m.uid for m in merged.pool.modules]})
  state.failures.extend(failures)
  state.pool = merged.pool
  state.reflection = reflection
  state.iteration = it
  log.info("MLREF iteration %d: scores %s, %s, pool %s", it, scores, kind,
           [m.uid for m in merged.pool.modules])
  return state


def _vet(plans: Sequence[mp.ImprovePlan], info: TaskInfo, state: mp.PoolState,
         config: EvolutionConfig, extra_cache) -> dict[str, sandbox.Verdict]:
  """Vets every distinct code of `plans`; verdicts keyed by code (caches consulted/updated)."""
  codes = list(dict.fromkeys(op.code for p in plans for op in p.ops if op.code))
  if not codes:
    return {}
  cache: dict[str, sandbox.Verdict] = {k: sandbox.Verdict.from_json(v)
                                       for k, v in state.vet_cache.items()}
  if extra_cache is not None:
    cache.update(extra_cache)
  verdicts = sandbox.vet_modules(codes, info.feature_spec, config=config.vet, cache=cache)
  for code, verdict in zip(codes, verdicts):
    key = sandbox.code_key(code, info.feature_spec)
    state.vet_cache[key] = verdict.to_json()  # Only this run's codes: the state stays its own.
    if extra_cache is not None:
      extra_cache[key] = verdict
  return dict(zip(codes, verdicts))


def _acceptor(verdicts: Mapping[str, sandbox.Verdict], info: TaskInfo):
  def accept(code):
    v = verdicts.get(code)
    if v is None:
      return False, "not vetted", "vet"
    return v.ok, v.reason, v.stage
  return accept


def best_reward_fn(state: mp.PoolState, feature_spec: Mapping[str, Sequence[int]]):
  """R* of a finished run as `(reward_fn, weights)` for the final training (None if no best)."""
  if not state.best_reward:
    return None
  modules = [mp.ModuleSpec.from_json(m) for m in state.best_reward["modules"]]
  return (mp.build_reward_fn(modules, feature_spec),
          np.asarray(state.best_reward["weights"], np.float32))
