"""LeanGRPO's gradient schedules for flow GRPO (arXiv 2609.03528, on Flow-GRPO 2505.05470).

One on-policy Flow-GRPO update (θ_upd = θ_roll, so ρ = 1 and the clip is inactive) has the
gradient

  G = −(1/N|S|) Σ_i Σ_{t∈S} Â_i ∇ℓ_{i,t} + (β/N|S|) Σ_i Σ_{t∈S} ∇KL_{i,t}

(N samples, S the selected steps, Â the clipped group advantages, ℓ the per-step Gaussian
log-prob of `sampling.flow_sde`). Three schedules compute it, behind one interface
(`GRADIENT_SCHEDULES`, `flow_grpo_gradient`):

  native    roll out under `stop_gradient` (T forwards per sample), then `jax.grad` of
            `losses.flow_grpo.flow_grpo_loss` over the stored transitions (x_t, x_next, t) of
            the selected steps: |S| *extra* forwards per sample, the recomputation LeanGRPO
            removes.
  retain    at each selected step of the rollout, `jax.vjp` of the step's (ℓ, KL) keeps the
            pullback (its residuals: the activations); the latent is detached; once the
            rewards give Â, each pullback is applied with cotangent (−Â_i/N|S|, β/N|S|).
  reweight  at each selected step, per-sample pullbacks are applied at once with the
            provisional unit advantage (cotangent −1) and accumulated per sample,
            G^prov `(Q, …)` stacked; the KL part (which does not depend on A) is summed at
            once. After the rewards: G = einsum('q,q...->...', Â/N|S|, G^prov) + G^KL.

Data-parallel layout (LeanGRPO §3 (a), "shared prompts"): arrays are `[G, M, …]` (G prompt
groups of M samples); under `shard_map` over a data axis of R ranks every rank takes all G
prompts and M/R = Q samples of each (`sharded_flow_grpo_gradient`; M not divisible by R is an
error). The M rewards of a group are all-gathered for the advantages; each rank then forms its
rank-local, *corrected* sum Σ_m Â_m G_m and one `psum` adds the ranks. Synchronising before
the correction would mix the provisional gradients (Σ_m G_m) and lose Σ_m Â_m G_m for good
(the paper's Appendix C; `combine_provisional(order="sync_then_correct")` shows it).

Selected steps are static (a tuple of step indices): the rollout of retain / reweight is
unrolled at them (`lax.scan` over the runs of other steps).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec

from jaxrl_post.advantages.outcome import group_advantages
from jaxrl_post.losses.flow_grpo import flow_grpo_loss
from jaxrl_post.registry import Registry
from jaxrl_post.sampling import flow_sde

GRADIENT_SCHEDULES: Registry = Registry("gradient_schedule")

# (params, x [n, *latent], t [n], c [n] | None) -> v [n, *latent]
ApplyFn = Callable[[Any, jax.Array, jax.Array, Any], jax.Array]
# (x_final [n, *latent], c [n] | None) -> rewards [n]
RewardFn = Callable[[jax.Array, Any], jax.Array]
# (x_final [G, Q, *latent], rewards [G, Q]) -> advantages [G, Q] (the default: `advantages`)
AdvantageFn = Callable[[jax.Array, jax.Array], jax.Array]


@dataclasses.dataclass(frozen=True)
class FlowGRPOSettings:
  """Static hyperparameters of one update (hashable: a jit static argument).

  a: SDE noise level (Flow-GRPO 0.7): a float, or a tuple broadcast against the latent's
  trailing dims (a noise level per coordinate block, CrystalGRPO's a_F / a_L).
  epsilon: clip range (1e-4). adv_clip_max: 5.
  beta: KL coefficient (0 skips the reference model). reduction: "mean" over latent dims
  (reference code) or "sum". adv_eps / adv_ddof: the group z-score's ε and ddof (Flow-GRPO's
  per-prompt stat tracking: np.std, ddof 0, ε 1e-4).
  """

  a: float | tuple[float, ...] = 0.7
  epsilon: float = 1e-4
  adv_clip_max: float = 5.0
  beta: float = 0.0
  reduction: str = "mean"
  adv_eps: float = 1e-4
  adv_ddof: int = 0
  # Periodic coordinates (`flow_sde.Wrap`, e.g. CrystalGRPO's fractional block): sampled
  # states wrapped, log-probs and KLs on minimum-image displacements. Keep one instance per
  # latent: it is hashed with the settings (a jit static argument).
  wrap: flow_sde.Wrap | None = None


class Rollout(NamedTuple):
  """What every schedule needs: `[G, Q, …]` local arrays."""

  x_init: jax.Array  # [G, Q, *latent]
  noise: jax.Array  # [T, G, Q, *latent]
  cond: jax.Array | None  # [G] int condition per prompt group, or None


class GradientOutput(NamedTuple):
  grads: Any  # the parameters' pytree, summed over ranks
  loss: jax.Array  # value of the Flow-GRPO loss at θ_roll
  reward_mean: jax.Array
  reward_std: jax.Array  # mean over groups of the within-group std
  kl: jax.Array  # mean KL_{i,t} over selected steps
  forwards: jax.Array  # policy forward rows on this rank (samples × steps)
  x_final: jax.Array  # [G, Q, *latent] the local final samples
  rewards: jax.Array  # [G, Q]
  adv: jax.Array  # [G, Q] clipped advantages


def check_selected(selected: Sequence[int], num_steps: int) -> tuple[int, ...]:
  """Sorted unique step indices in [0, num_steps); raises a ValueError naming `selected`."""
  sel = tuple(int(s) for s in selected)
  if not sel or len(set(sel)) != len(sel) or min(sel) < 0 or max(sel) >= num_steps:
    raise ValueError(f"selected={list(selected)} must be distinct step indices in "
                     f"[0, {num_steps}) (at least one)")
  return tuple(sorted(sel))


def select_steps(num_steps: int, fraction: float, how: str = "first") -> tuple[int, ...]:
  """|S| = max(1, round(fraction·T)) steps: the first ones (from the noise end) or spread.

  Examples:
    >>> select_steps(10, 0.5), select_steps(10, 0.2, "spread")
    ((0, 1, 2, 3, 4), (0, 9))
  """
  if not 0.0 < fraction <= 1.0:
    raise ValueError(f"timestep_fraction={fraction} must be in (0, 1]")
  k = max(1, int(round(fraction * num_steps)))
  if how == "first":
    return tuple(range(k))
  if how == "spread":
    return tuple(int(s) for s in np.unique(np.round(np.linspace(0, num_steps - 1, k))))
  raise ValueError(f"step selection {how!r}; valid: first, spread")


def _rows(x: jax.Array, lead: int) -> jax.Array:
  return x.reshape((-1,) + x.shape[lead:])


def _cond_rows(cond, groups: int, per_group: int):
  if cond is None:
    return None
  return jnp.repeat(jnp.asarray(cond), per_group, total_repeat_length=groups * per_group)


def advantages(rewards: jax.Array, settings: FlowGRPOSettings,
               axis_name: str | None = None) -> jax.Array:
  """`[G, Q]` local rewards → `[G, Q]` clipped group z-scores over the *global* M members.

  Under a data axis the M rewards of each group are all-gathered first (shared prompts).
  """
  full = rewards if axis_name is None else jax.lax.all_gather(rewards, axis_name, axis=1,
                                                              tiled=True)
  groups, members = full.shape
  ids = jnp.repeat(jnp.arange(groups), members)
  adv = group_advantages(full.reshape(-1), ids, num_groups=groups, eps=settings.adv_eps,
                         ddof=settings.adv_ddof).reshape(groups, members)
  adv = jnp.clip(adv, -settings.adv_clip_max, settings.adv_clip_max)
  if axis_name is not None:
    q = rewards.shape[1]
    adv = jax.lax.dynamic_slice_in_dim(adv, jax.lax.axis_index(axis_name) * q, q, axis=1)
  return adv


def _psum(tree, axis_name):
  return tree if axis_name is None else jax.lax.psum(tree, axis_name)


def _global_rows(n_local: int, axis_name) -> jax.Array:
  n = jnp.asarray(n_local, jnp.float32)
  return _psum(n, axis_name)


def _reward_stats(rewards, axis_name):
  """Mean reward and the mean over groups of the within-group (population) std, global."""
  members = _psum(jnp.asarray(rewards.shape[1], jnp.float32), axis_name)
  group_mean = _psum(jnp.sum(rewards, axis=1), axis_name) / members
  sq = _psum(jnp.sum(jnp.square(rewards - group_mean[:, None]), axis=1), axis_name)
  return jnp.mean(group_mean), jnp.mean(jnp.sqrt(sq / members))


def _step_fn(apply_fn: ApplyFn, settings: FlowGRPOSettings, t_cap):
  """`(params, x, t, t_next, xi, c, ref_mean) -> ((logp, kl), (x_next, mean))` for [n] rows."""

  def step(params, x, t, t_next, xi, c, ref_mean):
    tv = jnp.full((x.shape[0],), t)
    out = flow_sde.sde_step_with_logprob(apply_fn(params, x, tv, c), t, t_next, x, settings.a,
                                         None, t_cap=t_cap, reduction=settings.reduction,
                                         noise=xi, wrap=settings.wrap)
    kl = (flow_sde.step_kl(out.mean, ref_mean, out.std, reduction=settings.reduction,
                           wrap=settings.wrap)
          if ref_mean is not None else jnp.zeros_like(out.logp))
    return (out.logp, kl), (out.x_next, out.mean)

  return step


def _ref_mean(ref_fn, x, t, t_next, settings, t_cap, c):
  if ref_fn is None:
    return None
  v = ref_fn(x, jnp.full((x.shape[0],), t), c)
  mean, _ = flow_sde.sde_mean_std(v, t, t_next, x, settings.a, t_cap=t_cap)
  return jax.lax.stop_gradient(mean)


def _rollout(apply_fn, params, x, noise, grid, selected, settings, cond, on_selected):
  """Runs the T steps; non-selected runs under `lax.scan` (no gradient), selected steps through
  `on_selected(k, x, t, t_next, xi) -> x_next`. Returns the final x."""
  params_sg = jax.lax.stop_gradient(params)
  t_cap = grid[1]
  num_steps = noise.shape[0]
  step = _step_fn(apply_fn, settings, t_cap)

  def plain(x, inputs):
    t, t_next, xi = inputs
    _, (x_next, _) = step(params_sg, x, t, t_next, xi, cond, None)
    return x_next, None

  k = 0
  while k < num_steps:
    if k in selected:
      x = on_selected(k, x, grid[k], grid[k + 1], noise[k])
      k += 1
      continue
    end = k
    while end < num_steps and end not in selected:
      end += 1
    x, _ = jax.lax.scan(plain, x, (grid[k:end], grid[k + 1:end + 1], noise[k:end]))
    k = end
  return x


def _prepare(rollout: Rollout, grid):
  groups, q = rollout.x_init.shape[:2]
  x = _rows(rollout.x_init.astype(jnp.float32), 2)
  noise = rollout.noise.reshape((rollout.noise.shape[0], groups * q) + rollout.noise.shape[3:])
  cond = _cond_rows(rollout.cond, groups, q)
  return groups, q, x, noise.astype(jnp.float32), cond, jnp.asarray(grid, jnp.float32)


def _finish(reward_fn, x_final, cond, groups, q, settings, axis_name, advantage_fn=None):
  rewards = reward_fn(x_final, cond).reshape(groups, q)
  if advantage_fn is None:
    return rewards, advantages(rewards, settings, axis_name)
  return rewards, advantage_fn(x_final.reshape((groups, q) + x_final.shape[1:]), rewards)


@GRADIENT_SCHEDULES.register("native")
def native_gradient(apply_fn: ApplyFn, params, ref_fn, rollout: Rollout, reward_fn: RewardFn,
                    *, grid, selected: tuple[int, ...], settings: FlowGRPOSettings,
                    axis_name: str | None = None,
                    advantage_fn: AdvantageFn | None = None) -> GradientOutput:
  """Rollout without gradients, then `jax.grad` of the loss over the stored transitions."""
  groups, q, x, noise, cond, grid = _prepare(rollout, grid)
  n, num_steps, s = x.shape[0], noise.shape[0], len(selected)
  params_sg = jax.lax.stop_gradient(params)
  traj = flow_sde.sample_trajectory(
    lambda x, t: apply_fn(params_sg, x, t, cond), x, grid, settings.a, noise=noise,
    reduction=settings.reduction, wrap=settings.wrap)
  rewards, adv = _finish(reward_fn, traj.x[-1], cond, groups, q, settings, axis_name,
                         advantage_fn)
  sel = jnp.asarray(selected)
  x_t = _rows(traj.x[sel], 2)  # [S·n, *latent], step-major
  x_next = _rows(traj.x[sel + 1], 2)
  t = jnp.repeat(grid[sel], n)
  t_next = jnp.repeat(grid[sel + 1], n)
  c = None if cond is None else jnp.tile(cond, s)
  old_logp = traj.logp[sel].T  # [n, S]
  ref_mean = None
  if ref_fn is not None:
    v_ref = ref_fn(x_t, t, c)
    ref_mean = jax.lax.stop_gradient(
      flow_sde.sde_mean_std(v_ref, t, t_next, x_t, settings.a, t_cap=grid[1])[0])
  total = _global_rows(n * s, axis_name)

  def loss_fn(p):
    out = flow_sde.sde_step_with_logprob(apply_fn(p, x_t, t, c), t, t_next, x_t, settings.a,
                                         None, x_next=x_next, t_cap=grid[1],
                                         reduction=settings.reduction, wrap=settings.wrap)
    kl = None
    if ref_mean is not None:
      kl = flow_sde.step_kl(out.mean, ref_mean, out.std, reduction=settings.reduction,
                            wrap=settings.wrap)
      kl = kl.reshape(s, n).T
    loss, aux = flow_grpo_loss(out.logp.reshape(s, n).T, old_logp, adv.reshape(-1),
                               epsilon=settings.epsilon, adv_clip_max=None, kl=kl,
                               beta=settings.beta if kl is not None else 0.0,
                               num_steps_total=total)
    return loss, aux

  (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
  grads, loss, kl = _psum((grads, loss, aux.kl), axis_name)
  reward_mean, reward_std = _reward_stats(rewards, axis_name)
  return GradientOutput(grads, loss, reward_mean, reward_std, kl,
                        jnp.asarray(n * (num_steps + s), jnp.int32),
                        traj.x[-1].reshape(rollout.x_init.shape), rewards, adv)


@GRADIENT_SCHEDULES.register("retain")
def retain_gradient(apply_fn: ApplyFn, params, ref_fn, rollout: Rollout, reward_fn: RewardFn,
                    *, grid, selected: tuple[int, ...], settings: FlowGRPOSettings,
                    axis_name: str | None = None,
                    advantage_fn: AdvantageFn | None = None) -> GradientOutput:
  """`jax.vjp` at each selected step during the rollout; pullbacks applied with −Â_i later."""
  groups, q, x, noise, cond, grid = _prepare(rollout, grid)
  n, num_steps, s = x.shape[0], noise.shape[0], len(selected)
  step = _step_fn(apply_fn, settings, grid[1])
  kept = []  # (pullback, logp, kl) per selected step

  def on_selected(k, x, t, t_next, xi):
    ref_mean = _ref_mean(ref_fn, x, t, t_next, settings, grid[1], cond)
    (logp, kl), pull, (x_next, _) = jax.vjp(
      lambda p: step(p, x, t, t_next, xi, cond, ref_mean), params, has_aux=True)
    kept.append((pull, logp, kl))
    return jax.lax.stop_gradient(x_next)  # no graph across steps

  x_final = _rollout(apply_fn, params, x, noise, grid, selected, settings, cond, on_selected)
  rewards, adv = _finish(reward_fn, x_final, cond, groups, q, settings, axis_name,
                         advantage_fn)
  total = _global_rows(n * s, axis_name)
  ct_logp = -adv.reshape(-1) / total
  grads = None
  for pull, logp, kl in kept:
    # full_like: the cotangents carry the outputs' types (varying over a data axis).
    (g,) = pull((jnp.zeros_like(logp) + ct_logp, jnp.full_like(kl, settings.beta) / total))
    grads = g if grads is None else jax.tree.map(jnp.add, grads, g)
  kl = sum(jnp.sum(k) for _, _, k in kept) / total
  loss = -jnp.sum(adv) * s / total + settings.beta * kl
  grads, loss, kl = _psum((grads, loss, kl), axis_name)
  reward_mean, reward_std = _reward_stats(rewards, axis_name)
  return GradientOutput(grads, loss, reward_mean, reward_std, kl,
                        jnp.asarray(n * num_steps, jnp.int32),
                        x_final.reshape(rollout.x_init.shape), rewards, adv)


def reweight_provisional(apply_fn: ApplyFn, params, ref_fn, rollout: Rollout, *, grid,
                         selected: tuple[int, ...], settings: FlowGRPOSettings):
  """The rollout of reweight: `(x_final [n, …], G^prov (n, …) per sample, G^KL, Σ KL)`.

  G^prov_i = −Σ_{t∈S} ∇ℓ_{i,t} (provisional unit advantage), G^KL = Σ_i Σ_{t∈S} ∇KL_{i,t}
  (unscaled), both rank-local (no collective).
  """
  _, _, x, noise, cond, grid = _prepare(rollout, grid)
  step = _step_fn(apply_fn, settings, grid[1])
  zeros = jax.tree.map(lambda p: jnp.zeros((x.shape[0],) + p.shape, jnp.float32), params)
  acc = {"prov": zeros, "kl_grad": jax.tree.map(jnp.zeros_like, params),
         "kl": jnp.zeros((), jnp.float32)}

  def on_selected(k, x, t, t_next, xi):
    ref_mean = _ref_mean(ref_fn, x, t, t_next, settings, grid[1], cond)

    def per_sample(x_r, xi_r, c_r, ref_r):
      def f(p):
        (logp, kl), (x_next, _) = step(
          p, x_r[None], t, t_next, xi_r[None], None if c_r is None else c_r[None],
          None if ref_r is None else ref_r[None])
        return (logp[0], kl[0]), x_next[0]

      (logp, kl), pull, x_next = jax.vjp(f, params, has_aux=True)
      one, zero = jnp.ones_like(logp), jnp.zeros_like(kl)
      (g_prov,) = pull((-one, zero))  # provisional unit advantage
      g_kl = pull((jnp.zeros_like(logp), jnp.ones_like(kl)))[0] if ref_r is not None else None
      return x_next, kl, g_prov, g_kl

    x_next, kl, g_prov, g_kl = jax.vmap(per_sample)(x, xi, cond, ref_mean)
    acc["prov"] = jax.tree.map(jnp.add, acc["prov"], g_prov)
    if g_kl is not None:
      acc["kl_grad"] = jax.tree.map(lambda a, g: a + jnp.sum(g, axis=0), acc["kl_grad"], g_kl)
    acc["kl"] = acc["kl"] + jnp.sum(kl)
    return jax.lax.stop_gradient(x_next)

  x_final = _rollout(apply_fn, params, x, noise, grid, selected, settings, cond, on_selected)
  return x_final, acc["prov"], acc["kl_grad"], acc["kl"]


def combine_provisional(adv: jax.Array, prov, *, axis_name: str | None = None,
                        order: str = "correct_then_sync", scale: float | jax.Array = 1.0):
  """Σ_m Â_m G^prov_m summed over ranks; `adv` `[Q]`, `prov` a `(Q, …)` pytree.

  order "correct_then_sync" (LeanGRPO): rank-local `einsum('q,q...->...', Â, G)`, then psum.
  order "sync_then_correct" (wrong on purpose): psum the provisional sums Σ_m G_m first, then
  the best a scalar can do, mean(Â)·Σ G; it equals the right answer only when all Â are equal.
  """
  if order == "correct_then_sync":
    local = jax.tree.map(lambda g: jnp.einsum("q,q...->...", adv * scale, g), prov)
    return _psum(local, axis_name)
  if order == "sync_then_correct":
    mixed = _psum(jax.tree.map(lambda g: jnp.sum(g, axis=0), prov), axis_name)
    count = _psum(jnp.asarray(adv.shape[0], jnp.float32), axis_name)
    mean_adv = _psum(jnp.sum(adv), axis_name) / count
    return jax.tree.map(lambda g: mean_adv * scale * g, mixed)
  raise ValueError(f"order={order!r}; valid: correct_then_sync, sync_then_correct")


@GRADIENT_SCHEDULES.register("reweight")
def reweight_gradient(apply_fn: ApplyFn, params, ref_fn, rollout: Rollout,
                      reward_fn: RewardFn, *, grid, selected: tuple[int, ...],
                      settings: FlowGRPOSettings, axis_name: str | None = None,
                      advantage_fn: AdvantageFn | None = None
                      ) -> GradientOutput:
  """Per-sample provisional gradients during the rollout, Â-weighted before the one psum."""
  groups, q = rollout.x_init.shape[:2]
  num_steps, s = rollout.noise.shape[0], len(selected)
  n = groups * q
  cond = _cond_rows(rollout.cond, groups, q)
  x_final, prov, kl_grad, kl_sum = reweight_provisional(
    apply_fn, params, ref_fn, rollout, grid=grid, selected=selected, settings=settings)
  rewards, adv = _finish(reward_fn, x_final, cond, groups, q, settings, axis_name,
                         advantage_fn)
  total = _global_rows(n * s, axis_name)
  grads = combine_provisional(adv.reshape(-1) / total, prov, axis_name=axis_name)
  if ref_fn is not None:
    grads = jax.tree.map(lambda g, k: g + _psum(k, axis_name) * settings.beta / total, grads,
                         kl_grad)
  kl = _psum(kl_sum, axis_name) / total
  loss = -_psum(jnp.sum(adv), axis_name) * s / total + settings.beta * kl
  reward_mean, reward_std = _reward_stats(rewards, axis_name)
  return GradientOutput(grads, loss, reward_mean, reward_std, kl,
                        jnp.asarray(n * num_steps, jnp.int32),
                        x_final.reshape(rollout.x_init.shape), rewards, adv)


def flow_grpo_gradient(schedule: str, apply_fn: ApplyFn, params, ref_fn, rollout: Rollout,
                       reward_fn: RewardFn, *, grid, selected: Sequence[int],
                       settings: FlowGRPOSettings, axis_name: str | None = None,
                       advantage_fn: AdvantageFn | None = None) -> GradientOutput:
  """The one interface: `GRADIENT_SCHEDULES.get(schedule)(…)` after checking the inputs.

  Args:
    schedule: "native", "retain" or "reweight".
    apply_fn: `(params, x, t, c) -> v` the policy's velocity.
    params: the trained parameters (a pytree; differentiated).
    ref_fn: `(x, t, c) -> v` of the frozen reference policy, or None (β = 0).
    rollout: `Rollout(x_init [G, Q, …], noise [T, G, Q, …], cond [G] | None)`.
    reward_fn: `(x_final [n, …], c [n] | None) -> [n]`.
    grid: `[T + 1]` decreasing times (`flow_sde.time_grid`).
    selected: the trained steps S (indices into the T steps).
    settings: `FlowGRPOSettings`.
    axis_name: the data axis under `shard_map` (shared-prompt layout), or None.
    advantage_fn: `(x_final [G, Q, …], rewards [G, Q]) -> Â [G, Q]` replacing the clipped
      group z-score (e.g. CrystalGRPO's coverage advantages); single device only (it sees
      the local samples, not a group's other ranks).
  """
  fn = GRADIENT_SCHEDULES.get(schedule)
  if advantage_fn is not None and axis_name is not None:
    raise ValueError("advantage_fn sees only this rank's samples of a group; it is not "
                     f"supported under a data axis (axis_name={axis_name!r})")
  num_steps = rollout.noise.shape[0]
  if jnp.shape(grid) != (num_steps + 1,):
    raise ValueError(f"grid of shape {jnp.shape(grid)} must be [T + 1] = "
                     f"[{num_steps + 1}] for noise with T={num_steps} steps")
  if rollout.noise.shape[1:] != rollout.x_init.shape:
    raise ValueError(f"noise of shape {rollout.noise.shape} must be [T, *x_init.shape] with "
                     f"x_init {rollout.x_init.shape}")
  if (ref_fn is None) != (settings.beta == 0.0):
    raise ValueError(f"beta={settings.beta}: give ref_fn exactly when beta != 0")
  selected = check_selected(selected, num_steps)
  return fn(apply_fn, params, ref_fn, rollout, reward_fn, grid=grid, selected=selected,
            settings=settings, axis_name=axis_name, advantage_fn=advantage_fn)


def sharded_flow_grpo_gradient(schedule: str, apply_fn: ApplyFn, params, ref_params,
                               ref_apply: ApplyFn | None, rollout: Rollout,
                               reward_fn: RewardFn, *, mesh: Mesh, axis_name: str = "data",
                               grid, selected: Sequence[int], settings: FlowGRPOSettings
                               ) -> GradientOutput:
  """`flow_grpo_gradient` under `shard_map` with the shared-prompt layout over `axis_name`.

  All ranks take every prompt group; the M samples of a group are split, Q = M/R per rank
  (dimension 1 of `x_init`, 2 of `noise`). Parameters (and the reference's) are replicated;
  the returned gradient and scalars are replicated, the per-sample outputs `[G, M, …]`.

  Raises:
    ValueError: when M is not divisible by the axis size R (naming both).
  """
  ranks = mesh.shape[axis_name]
  members = rollout.x_init.shape[1]
  if members % ranks:
    raise ValueError(f"shared-prompt layout: the group's M={members} samples must split "
                     f"evenly over the {ranks} ranks of mesh axis {axis_name!r} (Q = M/R)")
  rep = PartitionSpec()
  split1, split2 = PartitionSpec(None, axis_name), PartitionSpec(None, None, axis_name)
  has_cond = rollout.cond is not None

  def local(params, ref_params, x_init, noise, cond):
    """One rank: its Q samples of every group; scalars and the gradient psum-ed inside."""
    # Varying over the data axis: each rank's gradient is its own until the one psum (and the
    # custom-VJP `dense` kernels then see matching manual-axis types).
    params = jax.lax.pcast(params, axis_name, to="varying")
    ref_fn = None
    if ref_apply is not None:
      def ref_fn(x, t, c):
        return jax.lax.stop_gradient(ref_apply(ref_params, x, t, c))
    out = flow_grpo_gradient(schedule, apply_fn, params, ref_fn,
                             Rollout(x_init, noise, cond if has_cond else None), reward_fn,
                             grid=grid, selected=selected, settings=settings,
                             axis_name=axis_name)
    return out._replace(forwards=out.forwards[None])  # this rank's count, summed below

  out_specs = GradientOutput(grads=rep, loss=rep, reward_mean=rep, reward_std=rep, kl=rep,
                             forwards=PartitionSpec(axis_name), x_final=split1, rewards=split1,
                             adv=split1)

  cond = rollout.cond if has_cond else jnp.zeros((rollout.x_init.shape[0],), jnp.int32)
  out = jax.shard_map(local, mesh=mesh,
                      in_specs=(rep, rep, split1, split2, rep), out_specs=out_specs,
                      )(params, ref_params, rollout.x_init, rollout.noise, cond)
  return out._replace(forwards=jnp.sum(out.forwards))


class CountingApply:
  """Wraps an `ApplyFn` and counts the forward rows it actually runs (under jit, scan, vmap,
  vjp: a `jax.debug.callback` per execution, per vmapped element).

    counted = CountingApply(apply_fn); ... ; counted.rows
  """

  def __init__(self, apply_fn: ApplyFn):
    self.apply_fn = apply_fn
    self._rows = 0
    # Callbacks can run on several runtime threads; `+=` on an attribute is a
    # read-modify-write that could lose counts without the lock.
    self._lock = threading.Lock()

  @property
  def rows(self) -> int:
    # Debug callbacks run asynchronously: a result can be ready before every callback of
    # its program has run, so wait for them all before reading the count.
    jax.effects_barrier()
    return self._rows

  def wait_for(self, expected: int, timeout_s: float = 60.0) -> int:
    """The count once it reaches `expected` (or after `timeout_s`, whatever it is then).

    `rows` can still be short after `effects_barrier`: one CI run on 2 loaded cores read 59
    of 64 rows there, and the rest arrived later. A count above `expected` returns at once.
    """
    deadline = time.monotonic() + timeout_s
    while self.rows < expected and time.monotonic() < deadline:
      time.sleep(0.01)
    return self.rows

  def _add(self, n):
    n = int(np.sum(np.asarray(n)))
    with self._lock:
      self._rows += n

  def __call__(self, params, x, t, c=None):
    # Depends on x, so vmap batches it (one call per element) instead of hoisting it.
    ones = jnp.where(jnp.isnan(x.reshape(x.shape[0], -1)[:, 0]), 1, 1)
    jax.debug.callback(self._add, jnp.sum(ones))
    return self.apply_fn(params, x, t, c)
