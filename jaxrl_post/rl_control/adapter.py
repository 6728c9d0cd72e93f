"""Glue between the MLREF loop (`rewards.evolution.evolve`) and PPO, plus baseline proposers.

`make_train_fn(task, ppo_config, seeds)` returns the `train_fn(RewardCandidate) -> TrainResult`
that `evolve` calls once per pool variant: PPO learns from R = Σ_k w_k m_k (every module of the
variant is evaluated, unselected ones with w_k = 0, so each gets a reward curve), averaged over
`seeds` trained in one `vmap`. It reports

    performance[u] = mean over seeds of the true episodic return in update u       [U]
    module_curves[name][u] = mean over seeds of the batch mean of m_k in update u   [U]
    score = mean of performance over the last `score_window` updates

so the correlation credit compares each module's curve with the *fitness* curve, never with
the shaped reward. All candidates share the same seeds (common random numbers), so score
differences come from the rewards, not the seeds.

`loop_task_info(task)` is the `TaskInfo` the loop's proposer gets: the task's text and features
plus each feature's typical (mean, std) from a random-action rollout (`feature_statistics`).

Baselines (the ablations of MLREF, arXiv 2608.18827, §5), as proposer wrappers:

* `MonolithicProposer`: one module, the whole reward function (EUREKA-like; "No Pool" in the
  paper's ablation table). With `memory=True` (default) each iteration *edits* the best reward
  so far R* with the base proposer's own edit operators (ADD / MODIFY / REWRITE / DELETE of a
  term, same number of ops as MLREF's plans), so that it differs from MLREF only in what is
  evolved: one fused function, no per-module credit, selection or pool.
* `NoPoolProposer`: modules and hybrid credit within the round, but no persistent pool. With
  `memory=True` each iteration edits R*'s selected modules (credit reset, unselected modules
  and the merge union dropped); `memory=False` is the earlier fresh draw every iteration.

`memory=False` (random restarts: a fresh reward every iteration, no feedback) is the behaviour
of the results of 2026-12-03/05, kept for reproducing them (`baseline_memory=False` in
configs/mlref_gymnax.py).
* LLM-weights-only ("No Weight Opt.") needs no wrapper: `CreditConfig(w_llm=1, gamma=0)`.
"""

from __future__ import annotations

import ast
import dataclasses
import math
import re
from typing import Callable

import jax
import numpy as np

from jaxrl_post.rewards import module_pool as mp
from jaxrl_post.rewards.evolution import RewardCandidate, TrainResult
from jaxrl_post.rewards.proposers import Proposer, TaskInfo
from jaxrl_post.rl_control import ppo
from jaxrl_post.rl_control.task import ControlTask

MONOLITHIC_NAME = "reward"


def per_seed_score(fitness, score_window: int) -> np.ndarray:
  """S_v per seed: each seed's true return averaged over its last `score_window` updates.

  `fitness` is `[S, U]` (seeds × updates); a window longer than the run uses every update.
  """
  fitness = np.asarray(fitness)
  return fitness[:, -min(score_window, fitness.shape[1]):].mean(1)


def make_train_fn(task: ControlTask, config: ppo.PPOConfig, seeds, *, score_window: int = 10,
                  clip: float | None = 10.0,
                  on_result: Callable[[RewardCandidate, dict], None] | None = None,
                  fast_compile: bool = False):
  """The `train_fn` for `evolution.evolve`.

  Args:
    task: `ControlTask`.
    config: `PPOConfig` of each inner run.
    seeds: PPO seeds per candidate (trained together under `vmap`).
    score_window: S_v = mean fitness over the last this-many updates.
    clip: bound on |m_k| (keeps one wild module from swamping PPO's value targets).
    on_result: called with `(candidate, record)` after each run (for logging); `record` holds
      score, `performance [U]`, `per_seed_score [S]`, `module_curves`, `nonfinite [K]` and
      `dropped [K]` (seeds that dropped each module: it failed or went non-finite).
    fast_compile: see `ppo.train_seeds`.

  Returns:
    `train_fn(candidate) -> TrainResult`.
  """
  seeds = [int(s) for s in seeds]

  def train_fn(cand: RewardCandidate) -> TrainResult:
    m = ppo.train_seeds(config, task, seeds, reward_fn=cand.reward_fn(clip=clip),
                        weights=cand.weights, fast_compile=fast_compile)
    fitness = m["fitness"]                       # [S, U]
    perf = fitness.mean(0)                       # [U]
    terms = m["module_terms"].mean(0)            # [U, K]
    curves = {mod.name: terms[:, k] for k, mod in enumerate(cand.modules)}
    w = min(score_window, perf.shape[0])
    score = float(perf[-w:].mean())
    if on_result is not None:
      on_result(cand, {"score": score, "performance": perf,
                       "per_seed_score": per_seed_score(fitness, score_window),
                       "module_curves": curves,
                       "nonfinite": m["module_nonfinite"].sum((0, 1)),
                       # Per module: how many seeds dropped it (it failed or went non-finite).
                       "dropped": m["module_dropped"][:, -1].sum(0)})
    return TrainResult(score=score, performance=perf, module_curves=curves)

  return train_fn


def env_reward_baseline(task: ControlTask, config: ppo.PPOConfig, seeds, *,
                        score_window: int = 10, fast_compile: bool = False) -> dict:
  """PPO on the environment's own reward (the hand-designed reference): score and curves."""
  m = ppo.train_seeds(config, task, [int(s) for s in seeds], fast_compile=fast_compile)
  per_seed = per_seed_score(m["fitness"], score_window)
  return {"score": float(per_seed.mean()), "per_seed_score": per_seed,
          "performance": m["fitness"].mean(0)}


def random_features(task: ControlTask, rng, *, num_envs: int = 16, num_steps: int = 128,
                    env_params=None) -> dict[str, np.ndarray]:
  """Reward features of a uniformly-random-action rollout: name → `[num_steps, num_envs, ...]`.

  Steps `num_envs` environments for `num_steps` steps as PPO does (`ppo.batched_env`, auto-reset,
  features of the terminal next state) with actions uniform over the action space (discrete:
  each action equally likely; continuous: U[−action_scale, action_scale] per dimension).
  """
  env_params = task.env_params if env_params is None else env_params
  v_reset, v_step = ppo.batched_env(task)

  def rollout(rng):
    rng, k_reset = jax.random.split(rng)
    obs, env_state = v_reset(jax.random.split(k_reset, num_envs), env_params)

    def step(carry, _):
      obs, env_state, rng = carry
      rng, k_act, k_env = jax.random.split(rng, 3)
      if task.discrete:
        action = jax.random.randint(k_act, (num_envs,), 0, task.action_dim)
      else:
        action = jax.random.uniform(k_act, (num_envs, task.action_dim), minval=-task.action_scale,
                                    maxval=task.action_scale)
      act = ppo.env_action(task, action)
      next_obs, env_state, _, term, _, info = v_step(
          jax.random.split(k_env, num_envs), env_state, act, env_params)
      feats = ppo.transition_features(task, obs, act, info, term)
      return (next_obs, env_state, rng), {k: feats[k] for k in task.feature_spec}

    _, feats = jax.lax.scan(step, (obs, env_state, rng), None, num_steps)
    return feats

  return {k: np.asarray(v) for k, v in jax.device_get(jax.jit(rollout)(rng)).items()}


def feature_statistics(task: ControlTask, rng, *, num_envs: int = 16, num_steps: int = 128,
                       env_params=None) -> dict[str, tuple[float, float]]:
  """Typical value and spread of each reward feature under uniformly random actions.

  The rollout is `random_features`. This is the scale information a reader of the feature docs
  has ("theta is within ±0.21 rad"), measured instead of read, for `TaskInfo.feature_stats`.

  Args:
    task: `ControlTask`.
    rng: JAX PRNG key.
    num_envs / num_steps: size of the rollout (num_envs · num_steps transitions).
    env_params: gymnax parameters (default: `task.env_params`).

  Returns:
    feature name → (mean, std) over all transitions, as Python floats; for a vector feature
    the mean over components of the per-component mean and std. Features with non-finite
    statistics are left out.
  """
  feats = random_features(task, rng, num_envs=num_envs, num_steps=num_steps,
                          env_params=env_params)
  out = {}
  for name in task.feature_spec:
    x = np.asarray(feats[name], np.float64).reshape(num_steps * num_envs, -1)  # [N, d]
    mean, std = float(x.mean(0).mean()), float(x.std(0).mean())
    if math.isfinite(mean) and math.isfinite(std):
      out[name] = (mean, std)
  return out


def loop_task_info(task: ControlTask, *, seed: int = 0, num_envs: int = 16,
                   num_steps: int = 128) -> TaskInfo:
  """The `TaskInfo` the MLREF loop hands its proposer: `task.task_info()` with the features'
  typical scales (`feature_statistics`, PRNG seed `seed`); `num_steps=0` leaves them out."""
  if num_steps <= 0 or num_envs <= 0:
    return task.task_info()
  stats = feature_statistics(task, jax.random.PRNGKey(seed), num_envs=num_envs,
                             num_steps=num_steps)
  return task.task_info(feature_stats=stats)


# ---------------------------------------------------------------------------------------------
# Baseline proposers.
# ---------------------------------------------------------------------------------------------


class _Rename(ast.NodeTransformer):
  """Prefixes local names so that several module bodies can share one function."""

  def __init__(self, prefix: str, arg: str):
    self.prefix, self.arg = prefix, arg

  def visit_Name(self, node):
    if node.id == self.arg:
      return ast.copy_location(ast.Name("f", node.ctx), node)
    if node.id != "jnp":
      return ast.copy_location(ast.Name(self.prefix + node.id, node.ctx), node)
    return node


def combine_modules(codes, coefs, *, name: str = MONOLITHIC_NAME, doc: str = "") -> str:
  """Source of one function `Σ_i coef_i · body_i(f)` from several single-function modules.

  Each module's locals are renamed apart (`m{i}_...`) and its final `return e_i` becomes a term
  c_i·(e_i) of the single return, so the result is again allow-listed module code.
  """
  body, terms = [], []
  for i, (code, c) in enumerate(zip(codes, coefs)):
    fn = ast.parse(code).body[0]
    stmts = fn.body
    if stmts and isinstance(stmts[0], ast.Expr) and isinstance(stmts[0].value, ast.Constant):
      stmts = stmts[1:]  # Docstring.
    ren = _Rename(f"m{i}_", fn.args.args[0].arg)
    stmts = [ren.visit(s) for s in stmts]
    *assigns, ret = stmts
    body += assigns
    terms.append(f"{float(c):.4g} * ({ast.unparse(ret.value)})")
  src = [f"def {name}(f):", f"  \"\"\"{doc or 'monolithic reward'}\"\"\""]
  src += ["  " + ast.unparse(s) for s in body]
  src.append("  return " + " + ".join(terms or ["0.0 * f[\"placeholder\"]"]))
  return "\n".join(src) + "\n"


_TERM_RE = re.compile(r"([-+]?[0-9.]+(?:e[-+]?[0-9]+)?)\*([A-Za-z_][A-Za-z0-9_]*)")


def monolithic_description(names, coefs) -> str:
  """"c1*name1 + c2*name2": the term list of a fused reward (its docstring and description)."""
  return " + ".join(f"{float(c):.4g}*{n}" for n, c in zip(names, coefs))


def split_monolithic(code: str, description: str = "") -> list[tuple[str, float, str]]:
  """Inverse of `combine_modules`: the terms `(name, coef, module code)` of a fused reward.

  The single return `c_0 * (e_0) + c_1 * (e_1) + ...` is split at the top-level `+`; each term
  must be `constant * (expression)`. The locals `m{i}_...` that `combine_modules` prefixed are
  given back to term i (prefix removed). Names come from `description` (the
  `monolithic_description` format) when it lists as many terms, else `term{i}`.

  Raises:
    ValueError: the code is not in `combine_modules`' form (e.g. an LLM wrote it freely).
  """
  fn = ast.parse(code).body[0]
  if not isinstance(fn, ast.FunctionDef) or not fn.body or not isinstance(fn.body[-1], ast.Return):
    raise ValueError("not a single function ending in a return")
  arg = fn.args.args[0].arg
  terms, node = [], fn.body[-1].value
  while isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
    terms.append(node.right)
    node = node.left
  terms.append(node)
  terms.reverse()
  parsed = []
  for t in terms:
    if not (isinstance(t, ast.BinOp) and isinstance(t.op, ast.Mult)
            and isinstance(t.left, (ast.Constant, ast.UnaryOp))):
      raise ValueError(f"term {ast.unparse(t)!r} is not 'constant * (expression)'")
    coef = float(ast.literal_eval(t.left))
    parsed.append((coef, t.right))
  names = [m.group(2) for m in _TERM_RE.finditer(description)]
  if len(names) != len(parsed) or len(set(names)) != len(names):
    names = [f"term{i}" for i in range(len(parsed))]
  assigns = [s for s in fn.body[:-1]
             if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
  out = []
  for i, (name, (coef, expr)) in enumerate(zip(names, parsed)):
    prefix = f"m{i}_"
    own = [s for s in assigns if isinstance(s, ast.Assign) and all(
        isinstance(tg, ast.Name) and tg.id.startswith(prefix) for tg in s.targets)]
    body = "".join(f"  {ast.unparse(s)}\n" for s in own) + f"  return {ast.unparse(expr)}\n"
    body = re.sub(rf"\b{prefix}", "", body)  # combine_modules adds the prefix back.
    out.append((name, coef, f"def {name}({arg}):\n{body}"))
  return out


def _accept_all(code):
  del code
  return True, "", ""


def _edit_with(base: Proposer, info: TaskInfo, start: mp.Pool, reflection: str, state, *,
               iteration: int, variant: int, num_variants: int, max_modules: int) -> mp.Pool:
  """`start` edited by `base.improve_pool`'s plan, as MLREF's own pool would be; every edit is
  accepted here (the loop vets the plan this proposer returns). A plan that deletes every
  module leaves `start` as it was."""
  plan = base.improve_pool(info, start, reflection, state, iteration=iteration, variant=variant,
                           num_variants=num_variants)
  edited, _, _ = mp.apply_plan(start, plan, accept=_accept_all, iteration=iteration,
                               variant=variant, max_modules=max_modules)
  return edited if len(edited) else start


class MonolithicProposer:
  """Whole-reward-function evolution (EUREKA-like): one module `reward`, edited every iteration.

  Iteration 1 (and any round without a best reward yet): a fresh set of `base.init_pool`
  modules, fused with `base.propose_weights` weights as coefficients into the single module
  `reward` = Σ_i c_i · body_i(f) (`combine_modules`).

  Later iterations with `memory=True`: R* (the best reward so far, `state.best_reward`, which
  holds feedback of every earlier round) is split back into its terms, and `base.improve_pool`
  edits that term list exactly as it edits an MLREF pool (same operators, same number of ops,
  same seeds per (iteration, variant)); its DELETE drops the term with the smallest coefficient
  (the terms get `ema_llm = c_i`: a monolithic writer sees coefficients, not per-term credit).
  Kept and edited terms keep c_i; an ADDed term gets the mean coefficient of the others. The
  result is fused again and REWRITEs `reward`. With `memory=False` every iteration is a fresh
  draw (random restarts), the pre-2026-12-06 behaviour.

  There is nothing to select or credit, so `reward` always gets weight 1. A base proposer
  without term-level edits (`LLMProposer`) edits the whole code via `modify_code`.
  """

  def __init__(self, base: Proposer, *, memory: bool = True, max_terms: int = 12):
    self.base = base
    self.memory = memory
    self.max_terms = max_terms

  def reflect(self, info: TaskInfo, state: mp.PoolState, *, iteration: int) -> str:
    return self.base.reflect(info, state, iteration=iteration)

  def _fused(self, info, reflection, iteration, variant, num_variants):
    plan = self.base.init_pool(info, reflection, iteration=iteration, variant=variant,
                               num_variants=num_variants)
    ops = [o for o in plan.ops if o.op == "ADD" and o.code]
    pool = mp.Pool(tuple(mp.ModuleSpec(name=o.name, description=o.description, code=o.code)
                         for o in ops))
    w = self.base.propose_weights(info, pool, reflection, iteration=iteration, variant=variant,
                                  k=len(ops))
    coefs = [w.get(o.name, 0.0) for o in ops]
    if not any(coefs):
      coefs = [1.0 / max(len(ops), 1)] * len(ops)
    keep = [(o, c) for o, c in zip(ops, coefs) if c > 0]
    desc = monolithic_description([o.name for o, _ in keep], [c for _, c in keep])
    return combine_modules([o.code for o, _ in keep], [c for _, c in keep], doc=desc), desc

  def _edited(self, info, reflection, state, best, iteration, variant, num_variants):
    """R*'s `reward` module edited by the base proposer; None if it cannot be split."""
    try:
      terms = split_monolithic(best.code, best.description)
    except (ValueError, SyntaxError):
      terms = None
    if terms is None:
      modify = getattr(self.base, "modify_code", None)
      if modify is None:
        return None
      code = modify(info, reflection, name=MONOLITHIC_NAME, description=best.description,
                    code=best.code)
      return code, best.description
    pool = mp.Pool(tuple(mp.ModuleSpec(name=n, description=n, code=c) for n, _, c in terms),
                   {n: mp.ModuleStats(ema_llm=w) for n, w, _ in terms})
    coef = {n: w for n, w, _ in terms}
    edited = _edit_with(self.base, info, pool, reflection, state, iteration=iteration,
                        variant=variant, num_variants=num_variants, max_modules=self.max_terms)
    mean = float(np.mean(list(coef.values()))) if coef else 1.0
    coefs = [coef.get(n, mean) for n in edited.names]
    desc = monolithic_description(edited.names, coefs)
    return combine_modules([m.code for m in edited.modules], coefs, doc=desc), desc

  def init_pool(self, info, reflection, *, iteration, variant, num_variants) -> mp.ImprovePlan:
    code, desc = self._fused(info, reflection, iteration, variant, num_variants)
    return mp.ImprovePlan(rationale="monolithic reward", ops=(
        mp.PlanOp(op="ADD", name=MONOLITHIC_NAME, description=desc, code=code),))

  def improve_pool(self, info, pool, reflection, state, *, iteration, variant,
                   num_variants) -> mp.ImprovePlan:
    best = _best_modules(state)
    out = None
    if self.memory and best and MONOLITHIC_NAME in best:
      out = self._edited(info, reflection, state, best[MONOLITHIC_NAME], iteration, variant,
                         num_variants)
    rationale = "edit the best reward so far"
    if out is None:
      out = self._fused(info, reflection, iteration, variant, num_variants)
      rationale = "rewrite the whole reward"
    code, desc = out
    op = "REWRITE" if MONOLITHIC_NAME in pool else "ADD"
    return mp.ImprovePlan(rationale=rationale, ops=(
        mp.PlanOp(op=op, name=MONOLITHIC_NAME, description=desc, code=code),))

  def propose_weights(self, info, pool, reflection, *, iteration, variant, k) -> dict:
    return {n: 1.0 for n in pool.names}


def _best_modules(state: mp.PoolState | None) -> dict[str, mp.ModuleSpec]:
  """R*'s selected modules by name (empty before the first finite score)."""
  if state is None or not state.best_reward:
    return {}
  mods = [mp.ModuleSpec.from_json(m) for m in state.best_reward.get("modules", ())]
  return {m.name: m for m in mods}


class NoPoolProposer:
  """Modules and in-round credit, but no persistent pool.

  `memory=True` (default): iteration ≥ 2 starts from R*'s selected modules only (fresh credit;
  the pool's unselected modules, credit EMAs and merge union are dropped), with their R* weight
  as the credit the base proposer's DELETE reads; `base.improve_pool` edits that set exactly as
  it edits an MLREF pool. The plan DELETEs the global pool and ADDs the edited set.
  `memory=False`: DELETE every module, then ADD a new `base.init_pool` draw (random restarts).
  """

  def __init__(self, base: Proposer, *, memory: bool = True, max_modules: int = 12):
    self.base = base
    self.memory = memory
    self.max_modules = max_modules

  def reflect(self, info, state, *, iteration):
    return self.base.reflect(info, state, iteration=iteration)

  def init_pool(self, info, reflection, *, iteration, variant, num_variants):
    return self.base.init_pool(info, reflection, iteration=iteration, variant=variant,
                               num_variants=num_variants)

  def improve_pool(self, info, pool, reflection, state, *, iteration, variant, num_variants):
    deletes = tuple(mp.PlanOp(op="DELETE", name=n) for n in pool.names)
    best = _best_modules(state) if self.memory else {}
    if not best:
      fresh = self.base.init_pool(info, reflection, iteration=iteration, variant=variant,
                                  num_variants=num_variants)
      return mp.ImprovePlan(rationale="no pool: start over", ops=deletes + tuple(fresh.ops))
    weights = dict(zip((m["name"] for m in state.best_reward["modules"]),
                       state.best_reward.get("weights", ())))
    start = mp.Pool(tuple(mp.ModuleSpec(name=m.name, description=m.description, code=m.code)
                          for m in best.values()),
                    {n: mp.ModuleStats(ema_llm=float(weights.get(n, 0.0))) for n in best})
    edited = _edit_with(self.base, info, start, reflection, state, iteration=iteration,
                        variant=variant, num_variants=num_variants, max_modules=self.max_modules)
    adds = tuple(mp.PlanOp(op="ADD", name=m.name, description=m.description, code=m.code)
                 for m in edited.modules)
    return mp.ImprovePlan(rationale="no pool: edit the best reward so far",
                          ops=deletes + adds)

  def propose_weights(self, info, pool, reflection, *, iteration, variant, k):
    return self.base.propose_weights(info, pool, reflection, iteration=iteration,
                                     variant=variant, k=k)


def llm_weights_only(credit: mp.CreditConfig) -> mp.CreditConfig:
  """"No Weight Opt." ablation: weights and selection from the LLM credit alone."""
  return dataclasses.replace(credit, w_llm=1.0, gamma=0.0)


def curves_to_json(record: dict) -> dict:
  """numpy → lists for JSONL logging."""
  return {k: (v.tolist() if isinstance(v, np.ndarray) else
              {n: np.asarray(c).tolist() for n, c in v.items()} if isinstance(v, dict) else v)
          for k, v in record.items()}
