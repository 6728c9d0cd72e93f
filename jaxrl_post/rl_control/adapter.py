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

* `MonolithicProposer`: one module, the whole reward function, rewritten every iteration
  (EUREKA-like; "No Pool" in the paper's ablation table).
* `NoPoolProposer`: a fresh multi-module pool every iteration (nothing carried over), still
  weighted by the hybrid credit within the round.
* LLM-weights-only ("No Weight Opt.") needs no wrapper: `CreditConfig(w_llm=1, gamma=0)`.
"""

from __future__ import annotations

import ast
import dataclasses
import math
from typing import Callable

import jax
import numpy as np

from jaxrl_post.rewards import module_pool as mp
from jaxrl_post.rewards.evolution import RewardCandidate, TrainResult
from jaxrl_post.rewards.proposers import Proposer, TaskInfo
from jaxrl_post.rl_control import ppo
from jaxrl_post.rl_control.task import ControlTask

MONOLITHIC_NAME = "reward"


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
                       "per_seed_score": fitness[:, -w:].mean(1), "module_curves": curves,
                       "nonfinite": m["module_nonfinite"].sum((0, 1)),
                       # Per module: how many seeds dropped it (it failed or went non-finite).
                       "dropped": m["module_dropped"][:, -1].sum(0)})
    return TrainResult(score=score, performance=perf, module_curves=curves)

  return train_fn


def env_reward_baseline(task: ControlTask, config: ppo.PPOConfig, seeds, *,
                        score_window: int = 10, fast_compile: bool = False) -> dict:
  """PPO on the environment's own reward (the hand-designed reference): score and curves."""
  m = ppo.train_seeds(config, task, [int(s) for s in seeds], fast_compile=fast_compile)
  w = min(score_window, m["fitness"].shape[1])
  per_seed = m["fitness"][:, -w:].mean(1)
  return {"score": float(per_seed.mean()), "per_seed_score": per_seed,
          "performance": m["fitness"].mean(0)}


def feature_statistics(task: ControlTask, rng, *, num_envs: int = 16, num_steps: int = 128,
                       env_params=None) -> dict[str, tuple[float, float]]:
  """Typical value and spread of each reward feature under uniformly random actions.

  Steps `num_envs` environments for `num_steps` steps as PPO does (`ppo.batched_env`, auto-reset,
  features of the terminal next state) with actions uniform over the action space (discrete:
  each action equally likely; continuous: U[−action_scale, action_scale] per dimension). This is
  the scale information a reader of the feature docs has ("theta is within ±0.21 rad"), measured
  instead of read, for `TaskInfo.feature_stats`.

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

  feats = jax.device_get(jax.jit(rollout)(rng))
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


class MonolithicProposer:
  """Whole-reward-function evolution (EUREKA-like): one module, rewritten every iteration.

  Each proposal draws a fresh set of modules from `base.init_pool` and fuses them, with
  `base.propose_weights` weights as coefficients, into a single module `reward`; iteration ≥ 2
  REWRITEs it. There is nothing to select or credit, so the module always gets weight 1.
  """

  def __init__(self, base: Proposer):
    self.base = base

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
    desc = " + ".join(f"{c:.3g}*{o.name}" for o, c in keep)
    return combine_modules([o.code for o, _ in keep], [c for _, c in keep], doc=desc), desc

  def init_pool(self, info, reflection, *, iteration, variant, num_variants) -> mp.ImprovePlan:
    code, desc = self._fused(info, reflection, iteration, variant, num_variants)
    return mp.ImprovePlan(rationale="monolithic reward", ops=(
        mp.PlanOp(op="ADD", name=MONOLITHIC_NAME, description=desc, code=code),))

  def improve_pool(self, info, pool, reflection, state, *, iteration, variant,
                   num_variants) -> mp.ImprovePlan:
    code, desc = self._fused(info, reflection, iteration, variant, num_variants)
    op = "REWRITE" if MONOLITHIC_NAME in pool else "ADD"
    return mp.ImprovePlan(rationale="rewrite the whole reward", ops=(
        mp.PlanOp(op=op, name=MONOLITHIC_NAME, description=desc, code=code),))

  def propose_weights(self, info, pool, reflection, *, iteration, variant, k) -> dict:
    return {n: 1.0 for n in pool.names}


class NoPoolProposer:
  """A fresh pool per iteration: DELETE every module, then ADD a new `base.init_pool` draw."""

  def __init__(self, base: Proposer):
    self.base = base

  def reflect(self, info, state, *, iteration):
    return self.base.reflect(info, state, iteration=iteration)

  def init_pool(self, info, reflection, *, iteration, variant, num_variants):
    return self.base.init_pool(info, reflection, iteration=iteration, variant=variant,
                               num_variants=num_variants)

  def improve_pool(self, info, pool, reflection, state, *, iteration, variant, num_variants):
    fresh = self.base.init_pool(info, reflection, iteration=iteration, variant=variant,
                                num_variants=num_variants)
    deletes = tuple(mp.PlanOp(op="DELETE", name=n) for n in pool.names)
    return mp.ImprovePlan(rationale="no pool: start over", ops=deletes + tuple(fresh.ops))

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
