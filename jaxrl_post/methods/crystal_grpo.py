"""CrystalGRPO (arXiv 2608.06582): flow GRPO on toy crystals, Q and C modes.

A run is one `config.method`:

  pretrain  flow matching of a velocity model on the composition's polymorphs (jittered,
            `tasks.toy_crystals.sample_polymorphs`): x_t = (1 − t)x_0 + tε, loss
            ‖v_θ(x_t, t) − (ε − x_0)‖², the fractional block read through periodic features.
  grpo      GRPO from a pretrain run (`config.init_from`). Per step, P groups of G samples are
            drawn with the joint coordinate–lattice SDE (`sampling.flow_sde`, T steps, noise
            level a_F on the fractional coordinates, a_L on the lattice block, coordinates
            wrapped mod 1 and scored with the minimum-image Gaussian), rewarded with
            R = w_match·R_match + w_E·R_E (`tasks.toy_crystals.score`), and one optimizer update
            follows the per-step clipped objective (`losses.flow_grpo.flow_grpo_loss`) on the
            selected window S (|S| = timestep_fraction·T, from the noise end).

`config.crystal.mode`:

  q  plain GRPO: A = group z-score of R; optional KL to the pretrained policy on the window
     (β = `beta`). Prioritises single-draw (Top-1) recovery.
  c  coverage-preserving: A = z-score(R / c_i + η·R^cov_i) (`advantages.coverage`:
     leave-one-out coverage `coverage` ∈ max_match | basins, duplicates down-weighted when
     `dedup`), plus β_full·mean_i Σ_{t<T} KL_{i,t}, the closed-form KL to the frozen
     pretrained policy summed over *all* T denoising steps of the rollout (not only the window).

The energy-only baseline is mode q with `task.w_match = 0`, `task.w_energy = 1`.

Evaluation (`eval/…`): `eval.trials` trials of `eval.top_n` ODE samples from fixed noise:
`mr1` (share of single samples matching the target), `mr_top` (share of trials with a match among
their top_n: MR@N), `rmse1` / `rmse_top` (mean normalised RMS of the matched samples / of each
trial's best match), `basins` (distinct polymorphs matched per trial), `share_p<k>` (samples
matching polymorph k), `energy_median` (per atom; a mean would be ruled by atom clashes); and
`kl_pretrained`, the SDE path KL Σ_t E‖μ_θ − μ_ref‖²/(2s_t²) to the pretrained policy from
fixed noise.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_post.advantages.coverage import (
  COVERAGES,
  cluster_sizes,
  coverage_advantages,
  marginal_coverage,
)
from jaxrl_post.advantages.outcome import group_advantages
from jaxrl_post.losses.flow_grpo import flow_grpo_loss
from jaxrl_post.methods.flow_grpo import apply_gradients
from jaxrl_post.models.velocity import VelocityMLP
from jaxrl_post.parallel.mesh import init_sharded
from jaxrl_post.sampling import flow_sde
from jaxrl_post.tasks import flow_targets as ft
from jaxrl_post.tasks import toy_crystals as tc
from jaxrl_post.training import lean_grpo, loop
from jaxrl_post.training import setup as run_setup
from jaxrl_post.training.lean_grpo import select_steps
from jaxrl_post.training.train_state import make_train_step

METHODS = ("pretrain", "grpo")
MODES = ("q", "c")
_OPTIMIZERS: dict[tuple[str, int], Any] = {}  # one per optimizer config (a static jit arg)


class CrystalVelocity(nnx.Module):
  """v_θ(x, t) on the toy-crystal latent `[B, 2N + 3]`.

  The fractional block enters through periodic features (sin 2πF, cos 2πF), so v is a function
  on the torus; a `VelocityMLP` of width 4N + 3 maps `[sin 2πF, cos 2πF, L]` to the same width,
  and its sine slots are v^F, its last 3 slots v^L (the cosine slots are unused).
  """

  def __init__(self, num_atoms: int, *, hidden: int, depth: int, time_dim: int,
               rngs: nnx.Rngs):
    self.num_atoms = num_atoms
    self.mlp = VelocityMLP(4 * num_atoms + 3, hidden=hidden, depth=depth, time_dim=time_dim,
                           rngs=rngs)

  def __call__(self, x: jax.Array, t: jax.Array, c: jax.Array | None = None) -> jax.Array:
    del c
    n2 = 2 * self.num_atoms
    angle = 2.0 * math.pi * x[:, :n2]
    out = self.mlp(jnp.concatenate([jnp.sin(angle), jnp.cos(angle), x[:, n2:]], -1), t)
    return jnp.concatenate([out[:, :n2], out[:, 2 * n2:]], -1)


@dataclasses.dataclass(frozen=True)
class CrystalSettings:
  """Static hyperparameters of one GRPO update (`config.crystal`, hashable)."""

  mode: str = "q"
  group_size: int = 16
  a_frac: float = 0.1
  a_lattice: float = 0.5
  epsilon: float = 1e-4
  adv_clip_max: float = 5.0
  beta: float = 0.0
  beta_full: float = 0.0
  eta: float = 0.0
  coverage: str = "max_match"
  dedup: bool = False
  reduction: str = "sum"
  selected: tuple[int, ...] = (0,)
  schedule: str = "native"


def settings_of(c) -> CrystalSettings:
  """`CrystalSettings` from `config.crystal`; raises ValueErrors naming the key."""
  if c.mode not in MODES:
    raise ValueError(f"config.crystal.mode={c.mode!r}; valid: {', '.join(MODES)}")
  COVERAGES.get(c.coverage)
  if c.mode == "q":
    for key in ("eta", "beta_full"):
      if c[key]:
        raise ValueError(f"config.crystal.{key}={c[key]} applies in mode 'c' only (mode 'q' is "
                         "plain GRPO on the window; set it to 0)")
    if c.dedup:
      raise ValueError("config.crystal.dedup=True applies in mode 'c' only")
  if c.num_steps < 1:
    raise ValueError(f"config.crystal.num_steps={c.num_steps} must be >= 1")
  if c.group_size < 2:
    raise ValueError(f"config.crystal.group_size={c.group_size} must be >= 2")
  for key in ("a_frac", "a_lattice"):
    if not c[key] > 0:
      raise ValueError(f"config.crystal.{key}={c[key]} must be > 0")
  for key in ("beta", "beta_full", "eta"):
    if c[key] < 0:
      raise ValueError(f"config.crystal.{key}={c[key]} must be >= 0")
  schedule = c.get("schedule", "native")
  if schedule not in lean_grpo.GRADIENT_SCHEDULES:
    raise ValueError(f"config.crystal.schedule={schedule!r}; valid: "
                     f"{', '.join(lean_grpo.GRADIENT_SCHEDULES)}")
  if schedule != "native" and c.mode == "c" and c.beta_full:
    raise ValueError(f"config.crystal.beta_full={c.beta_full}: the full-path KL needs every "
                     f"step's forward, which config.crystal.schedule={schedule!r} skips; set it "
                     "to 0 or use schedule 'native'")
  try:
    selected = select_steps(c.num_steps, c.timestep_fraction, c.step_selection)
  except ValueError as e:
    raise ValueError(f"config.crystal: {e}") from None
  return CrystalSettings(mode=c.mode, group_size=int(c.group_size), a_frac=float(c.a_frac),
                         a_lattice=float(c.a_lattice), epsilon=float(c.epsilon),
                         adv_clip_max=float(c.adv_clip_max), beta=float(c.beta),
                         beta_full=float(c.beta_full), eta=float(c.eta), coverage=c.coverage,
                         dedup=bool(c.dedup), reduction=c.reduction, selected=selected,
                         schedule=schedule)


def task_of(config) -> tc.CrystalTask:
  """`tasks.toy_crystals.CrystalTask` from `config.task` (errors name `config.task`)."""
  try:
    return tc.CrystalTask(**config.task.to_dict())
  except (ValueError, TypeError) as e:
    raise ValueError(f"config.task: {e}") from None
  except KeyError as e:
    raise ValueError(f"config.task.composition: {e.args[0]}") from None


def _apply(graphdef, params, x, t, c=None):
  return nnx.merge(graphdef, params)(x, t, c)


def crystal_advantages(scores: tc.Scores, group_ids: jax.Array, *, num_groups: int,
                       task: tc.CrystalTask, hp: CrystalSettings) -> jax.Array:
  """Mode q: group z-score of R. Mode c: z-score of R / c_i + η·R^cov_i (`advantages.coverage`).
  Clipped at ±adv_clip_max."""
  if hp.mode == "q":
    adv = group_advantages(scores.reward, group_ids, num_groups=num_groups, eps=1e-4, ddof=0)
  else:
    cov = marginal_coverage(hp.coverage, scores.r_match, scores.basin, group_ids,
                            num_basins=task.num_polymorphs, num_groups=num_groups)
    size = (cluster_sizes(scores.basin, group_ids, num_clusters=task.num_polymorphs,
                          num_groups=num_groups) if hp.dedup else None)
    adv = coverage_advantages(scores.reward, cov, group_ids, eta=hp.eta, cluster_size=size,
                              num_groups=num_groups)
  return jnp.clip(adv, -hp.adv_clip_max, hp.adv_clip_max)


def policy_steps(apply, params, reference, traj: flow_sde.Trajectory, steps, grid, a, wrap,
                  hp: CrystalSettings):
  """Per-step `(logp [k, B], kl [k, B])` of `params` on the rollout's transitions `steps`."""
  steps = jnp.asarray(steps)
  k, b = steps.shape[0], traj.x.shape[1]
  x_t = traj.x[steps].reshape((k * b,) + traj.x.shape[2:])
  x_next = traj.x[steps + 1].reshape(x_t.shape)
  t = jnp.repeat(grid[steps], b)
  t_next = jnp.repeat(grid[steps + 1], b)
  mean, std = flow_sde.sde_mean_std(apply(params, x_t, t), t, t_next, x_t, a, t_cap=grid[1])
  logp = flow_sde.gaussian_logp(x_next, mean, std, reduction=hp.reduction, wrap=wrap)
  kl = jnp.zeros_like(logp)
  if reference is not None:
    v_ref = jax.lax.stop_gradient(apply(reference, x_t, t))
    ref_mean, _ = flow_sde.sde_mean_std(v_ref, t, t_next, x_t, a, t_cap=grid[1])
    kl = flow_sde.step_kl(mean, ref_mean, std, reduction=hp.reduction, wrap=wrap)
  return logp.reshape(k, b), kl.reshape(k, b)


class CrystalGradient(NamedTuple):
  """One update's gradient and what the metrics need (`crystal_gradient`)."""

  grads: Any
  loss: jax.Array
  pg_loss: jax.Array
  kl: jax.Array  # mean window KL_{i,t}
  kl_sum: jax.Array  # mean_i Σ_t KL_{i,t} over the window (all T steps with beta_full)
  adv: jax.Array  # [B]
  x_final: jax.Array  # [B, D]


def _native_gradient(params, reference, x_init, noise, grid, apply, a, wrap, task, hp):
  """Rollout without gradients, then `jax.grad` over the stored transitions (the full-path KL
  of mode c included)."""
  batch, num_steps = x_init.shape[0], noise.shape[0]
  a = jnp.asarray(a)
  params_sg = jax.lax.stop_gradient(params)
  traj = flow_sde.sample_trajectory(lambda x, t: apply(params_sg, x, t), x_init, grid, a,
                                    noise=noise, reduction=hp.reduction, wrap=wrap)
  scores = tc.score(task, *tc.decode(task, traj.x[-1]))
  num_groups = batch // hp.group_size
  group_ids = jnp.arange(batch) // hp.group_size
  adv = crystal_advantages(scores, group_ids, num_groups=num_groups, task=task, hp=hp)
  full = hp.mode == "c" and hp.beta_full > 0
  steps = tuple(range(num_steps)) if full else hp.selected
  window = np.searchsorted(np.asarray(steps), np.asarray(hp.selected))
  needs_ref = hp.beta > 0 or full
  old_logp = traj.logp[jnp.asarray(hp.selected)].T  # [B, |S|]

  def loss_fn(params):
    logp, kl = policy_steps(apply, params, reference if needs_ref else None, traj, steps,
                             grid, a, wrap, hp)
    win_kl = kl[window].T if hp.beta > 0 else None
    loss, aux = flow_grpo_loss(logp[window].T, old_logp, adv, epsilon=hp.epsilon,
                               adv_clip_max=None, kl=win_kl, beta=hp.beta)
    kl_full = jnp.mean(jnp.sum(kl, axis=0))  # mean_i Σ_t KL_{i,t} (all T steps when `full`)
    if full:
      loss = loss + hp.beta_full * kl_full
    return loss, (aux, kl_full)

  (loss, (aux, kl_full)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
  return CrystalGradient(grads, loss, aux.pg_loss, aux.kl, kl_full, adv, traj.x[-1])


def _lean_gradient(params, reference, x_init, noise, grid, apply, a, wrap, task, hp):
  """`training.lean_grpo`'s retain / reweight schedules (no recomputation of the window's
  forwards), with the crystal's wrap and (coverage) advantages as hooks."""
  batch, dim = x_init.shape
  groups, members = batch // hp.group_size, hp.group_size
  settings = lean_grpo.FlowGRPOSettings(
    a=tuple(float(v) for v in np.asarray(a)), epsilon=hp.epsilon, adv_clip_max=hp.adv_clip_max,
    beta=hp.beta, reduction=hp.reduction, wrap=wrap)
  group_ids = jnp.arange(batch) // hp.group_size

  def advantage_fn(x_final, rewards):
    del rewards
    scores = tc.score(task, *tc.decode(task, x_final.reshape(batch, dim)))
    adv = crystal_advantages(scores, group_ids, num_groups=groups, task=task, hp=hp)
    return adv.reshape(groups, members)

  ref_fn = (lambda x, t, c: apply(reference, x, t)) if hp.beta > 0 else None
  out = lean_grpo.flow_grpo_gradient(
    hp.schedule, lambda p, x, t, c: apply(p, x, t), params, ref_fn,
    lean_grpo.Rollout(x_init.reshape(groups, members, dim),
                      noise.reshape(noise.shape[0], groups, members, dim), None),
    lambda x, c: tc.score(task, *tc.decode(task, x)).reward, grid=grid, selected=hp.selected,
    settings=settings, advantage_fn=advantage_fn)
  return CrystalGradient(out.grads, out.loss, out.loss - hp.beta * out.kl, out.kl,
                         out.kl * len(hp.selected), out.adv.reshape(-1),
                         out.x_final.reshape(batch, dim))


def crystal_gradient(params, reference, x_init, noise, grid, *, graphdef,
                     task: tc.CrystalTask, hp: CrystalSettings) -> CrystalGradient:
  """SDE rollout → scores → (coverage) advantages → gradient of the loss on the window (+ the
  full-path KL in mode c), by `hp.schedule`: "native" (recompute the window's forwards) or
  LeanGRPO's "retain" / "reweight" (arXiv 2609.03528; equal gradients, |S| fewer forwards per
  sample). `x_init` `[B, D]` (B = P·G, groups contiguous), `noise` `[T, B, D]`."""
  apply = functools.partial(_apply, graphdef)
  a = tc.noise_levels(task, hp.a_frac, hp.a_lattice)  # numpy: static in both paths
  wrap = tc.crystal_wrap(task)
  fn = _native_gradient if hp.schedule == "native" else _lean_gradient
  return fn(params, reference, x_init, noise, grid, apply, a, wrap, task, hp)


@functools.partial(jax.jit, static_argnames=("graphdef", "optimizer", "task", "hp"),
                   donate_argnums=(0,))
def crystal_update(state, reference, x_init, noise, grid, *, graphdef, optimizer,
                   task: tc.CrystalTask, hp: CrystalSettings):
  """`crystal_gradient`, then one optimizer update; metrics of the rollout's scores."""
  out = crystal_gradient(state.params, reference, x_init, noise, grid, graphdef=graphdef,
                         task=task, hp=hp)
  state, metrics = apply_gradients(state, out.grads, optimizer)
  scores = tc.score(task, *tc.decode(task, out.x_final))
  batch = x_init.shape[0]
  num_groups = batch // hp.group_size
  group_ids = jnp.arange(batch) // hp.group_size
  hit = scores.matched[:, task.target]
  groups_hit = jax.ops.segment_max(hit.astype(jnp.float32), group_ids, num_groups)
  basins = jnp.sum(jax.ops.segment_max(
    (scores.basin[:, None] == jnp.arange(task.num_polymorphs)).astype(jnp.float32), group_ids,
    num_groups), axis=1)
  metrics.update(loss=out.loss, pg_loss=out.pg_loss, kl=out.kl, kl_sum=out.kl_sum,
                 reward=jnp.mean(scores.reward), r_match=jnp.mean(scores.r_match),
                 r_energy=jnp.mean(scores.r_energy), energy=jnp.mean(scores.energy),
                 match=jnp.mean(hit.astype(jnp.float32)), group_match=jnp.mean(groups_hit),
                 group_basins=jnp.mean(basins), adv_abs=jnp.mean(jnp.abs(out.adv)))
  return state, metrics


def eval_metrics(task: tc.CrystalTask, scores: tc.Scores, trials: int) -> dict[str, jax.Array]:
  """MR@1, MR@N, RMSEs, basins per trial, polymorph shares, energy for `trials` × N samples."""
  hit = scores.matched[:, task.target].reshape(trials, -1)
  rms = scores.rms[:, task.target].reshape(trials, -1)
  hit_f = hit.astype(jnp.float32)
  rms_hit = jnp.where(hit, rms, 0.0)
  trial_hit = jnp.any(hit, axis=1)
  best = jnp.min(jnp.where(hit, rms, jnp.inf), axis=1)
  onehot = (scores.basin[:, None] == jnp.arange(task.num_polymorphs)).astype(jnp.float32)
  per_trial = jnp.max(onehot.reshape(trials, -1, task.num_polymorphs), axis=1)
  out = {"mr1": jnp.mean(hit_f), "mr_top": jnp.mean(trial_hit.astype(jnp.float32)),
         "rmse1": jnp.sum(rms_hit) / jnp.maximum(jnp.sum(hit_f), 1.0),
         "rmse_top": jnp.sum(jnp.where(trial_hit, best, 0.0)) / jnp.maximum(jnp.sum(trial_hit),
                                                                           1),
         "basins": jnp.mean(jnp.sum(per_trial, axis=1)),
         "unmatched": jnp.mean((scores.basin < 0).astype(jnp.float32)),
         "energy_median": jnp.median(scores.energy), "reward": jnp.mean(scores.reward)}
  for k in range(task.num_polymorphs):
    out[f"share_p{k}"] = jnp.mean(onehot[:, k])
  return out


@functools.partial(jax.jit, static_argnames=("graphdef", "task", "hp", "num_eval_steps",
                                             "trials"))
def evaluate_policy(params, reference, x_eval, sde_x, sde_noise, grid, *, graphdef,
                    task: tc.CrystalTask, hp: CrystalSettings, num_eval_steps: int,
                    trials: int):
  """ODE samples' recovery metrics and the SDE path KL to `reference` (module docstring)."""
  apply = functools.partial(_apply, graphdef)
  wrap = tc.crystal_wrap(task)
  a = jnp.asarray(tc.noise_levels(task, hp.a_frac, hp.a_lattice))
  ode = flow_sde.sample_trajectory(lambda x, t: apply(params, x, t), x_eval,
                                   flow_sde.time_grid(num_eval_steps), 0.0,
                                   noise=jnp.zeros((num_eval_steps,) + x_eval.shape), sde=False,
                                   wrap=wrap)
  frac, lat = tc.decode(task, ode.x[-1])
  out = eval_metrics(task, tc.score(task, frac, lat), trials)
  traj = flow_sde.sample_trajectory(lambda x, t: apply(params, x, t), sde_x, grid, a,
                                    noise=sde_noise, reduction="sum", wrap=wrap)
  _, kl = policy_steps(apply, params, reference, traj, tuple(range(sde_noise.shape[0])), grid,
                        a, wrap, dataclasses.replace(hp, reduction="sum"))
  out["kl_pretrained"] = jnp.mean(jnp.sum(kl, axis=0))
  return out


class CrystalGRPO:
  """Toy-crystal flow pretraining or CrystalGRPO Q / C (configs/crystal_grpo.py); a
  `training.loop.Method`."""

  name = "crystal_grpo"
  updates_per_step = 1

  def __init__(self, config):
    if config.method not in METHODS:
      raise ValueError(f"config.method={config.method!r}; valid: {', '.join(METHODS)}")
    if config.method == "grpo" and not (config.init_from or config.resume):
      raise ValueError("config.init_from: method 'grpo' starts from a pretrain run's workdir "
                       "(configs/crystal_grpo.py's docstring gives the commands)")
    self.config = config
    self.task = task_of(config)
    self.hp = settings_of(config.crystal)
    c = config.crystal
    if c.prompts_per_step < 1:
      raise ValueError(f"config.crystal.prompts_per_step={c.prompts_per_step} must be >= 1")
    if config.eval.trials < 1 or config.eval.top_n < 1:
      raise ValueError(f"config.eval.trials={config.eval.trials} and config.eval.top_n="
                       f"{config.eval.top_n} must be >= 1")

  # ---- Set-up ----

  def build_model(self, run: loop.Run):
    m = self.config.model

    def make():
      return CrystalVelocity(self.task.num_atoms, hidden=m.hidden, depth=m.depth,
                             time_dim=m.time_dim, rngs=nnx.Rngs(self.config.seed))

    return init_sharded(make, run.train_mesh, run.train_rules)

  def start(self, run: loop.Run, state) -> None:
    config = self.config
    self.graphdef = run.graphdef
    self.reference = jax.tree.map(jnp.copy, state.params)  # π_ref: the starting policy
    self.grid = jnp.asarray(flow_sde.time_grid(config.crystal.num_steps))
    horizon = int(config.optimizer.get("decay_steps") or config.steps)
    self.optimizer = _OPTIMIZERS.setdefault((config.optimizer.to_json(), horizon),
                                            run.optimizer)
    if config.method == "pretrain":
      self.pretrain_step = make_train_step(run.graphdef, ft.flow_matching_objective, run.optimizer)
    e, d = config.eval, self.task.dim
    k1, k2, k3 = jax.random.split(jax.random.key(config.seed + 10_000), 3)
    self.eval_inputs = (jax.random.normal(k1, (e.trials * e.top_n, d)),
                        jax.random.normal(k2, (e.kl_samples, d)),
                        jax.random.normal(k3, (config.crystal.num_steps, e.kl_samples, d)))

  def state_dict(self) -> dict[str, Any]:
    return {}  # every step's data and noise are functions of (seed, step)

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    del state

  # ---- One step ----

  def step(self, state, step: int):
    tic = time.perf_counter()
    key = jax.random.fold_in(jax.random.key(self.config.seed), step)
    if self.config.method == "pretrain":
      k0, k1, k2 = jax.random.split(key, 3)
      n = self.config.pretrain_batch
      x0, _ = tc.sample_polymorphs(self.task, k0, n)
      batch = {"x0": x0, "eps": jax.random.normal(k1, x0.shape),
               "t": jax.random.uniform(k2, (n,))}
      state, metrics = self.pretrain_step(state, batch)
    else:
      c = self.config.crystal
      k0, k1 = jax.random.split(key)
      b = c.prompts_per_step * c.group_size
      x_init = jax.random.normal(k0, (b, self.task.dim))
      noise = jax.random.normal(k1, (c.num_steps, b, self.task.dim))
      state, metrics = crystal_update(state, self.reference, x_init, noise, self.grid,
                                      graphdef=self.graphdef, optimizer=self.optimizer,
                                      task=self.task, hp=self.hp)
    record = {f"train/{k}": v for k, v in run_setup.host_metrics(metrics).items()}
    record["time/step"] = time.perf_counter() - tic
    return state, record

  # ---- Evaluation and report ----

  def evaluate(self, state, step: int) -> dict[str, Any]:
    e = self.config.eval
    result = evaluate_policy(state.params, self.reference, *self.eval_inputs, self.grid,
                             graphdef=self.graphdef, task=self.task, hp=self.hp,
                             num_eval_steps=e.num_steps, trials=e.trials)
    return {f"eval/{k}": float(v) for k, v in jax.device_get(result).items()}

  def progress(self, record):
    if "train/match" in record:
      return {"match": record["train/match"]}
    return {"fm": record.get("train/loss", float("nan"))}

  def summary(self, records: Sequence[Mapping[str, Any]]) -> str:
    return loop.eval_summary(records, "eval/mr1", f"{self.config.method} MR@1")
