"""Flow-GRPO (arXiv 2505.05470) with LeanGRPO's gradient schedules (arXiv 2609.03528) on a 2-D
Gaussian-mixture target: a flow policy's RL on the one loop.

A run is one `config.method`:

  pretrain  flow matching of the velocity MLP on the mixture (`tasks.flow_targets`):
            x_t = (1 − t)x_0 + tε, loss ‖v_θ(x_t, t) − (ε − x_0)‖², t ~ U(0, 1)
  grpo      Flow-GRPO from a pretrain run (`config.init_from`): per step, P prompt groups of
            G samples are rolled out with the SDE sampler (T steps, noise level a), rewarded
            with r(x) = −‖x − target‖², group z-scored (clipped at adv_clip_max), and the
            clipped per-step objective on the selected steps S (|S| = timestep_fraction·T) is
            followed by one optimizer update, its gradient computed by
            `config.flow.schedule` ∈ native | retain | reweight (`training.lean_grpo`).

On a mesh whose `data` axis has R > 1 devices, the gradient runs under `shard_map` with
LeanGRPO's shared-prompt layout (every rank takes all P groups and G/R samples of each; the
correction precedes the one psum).

Evaluation (`eval/…`): `eval_samples` samples from the ODE sampler with `eval_steps` steps
(Flow-GRPO's "denoising reduction": fewer SDE steps in training, more at evaluation) from fixed
noise: mean reward, mode coverage (modes with ≥ 5 % of the samples), the share of the target's
mode; and, from the SDE sampler with the training grid, the KL of the policy's path to the
pretrained one's, Σ_t E‖μ_θ − μ_ref‖²/(2 s_t²) (latent dims summed), `eval/kl_pretrained`.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxrl_post.models.velocity import VelocityMLP
from jaxrl_post.parallel.mesh import init_sharded
from jaxrl_post.sampling import flow_sde
from jaxrl_post.tasks import flow_targets as ft
from jaxrl_post.training import loop
from jaxrl_post.training import setup as run_setup
from jaxrl_post.training.lean_grpo import (
  GRADIENT_SCHEDULES,
  FlowGRPOSettings,
  Rollout,
  flow_grpo_gradient,
  select_steps,
  sharded_flow_grpo_gradient,
)
from jaxrl_post.training.train_state import TrainState, make_train_step

METHODS = ("pretrain", "grpo")
# One optimizer object per optimizer config (and decay horizon) in this process: it is a static
# argument of the jitted `grpo_update`, so runs of one process (tests, in-process sweeps) with
# the same settings share one compiled update instead of compiling it again per run.
_OPTIMIZERS: dict[tuple[str, int], Any] = {}


def _apply(graphdef, params, x, t, c=None):
  return nnx.merge(graphdef, params)(x, t, c)


def settings_of(flow) -> FlowGRPOSettings:
  """`FlowGRPOSettings` from the `config.flow` block."""
  return FlowGRPOSettings(a=float(flow.a), epsilon=float(flow.epsilon),
                          adv_clip_max=float(flow.adv_clip_max), beta=float(flow.beta),
                          reduction=flow.reduction)


def apply_gradients(state: TrainState, grads, optimizer) -> tuple[TrainState, dict]:
  """One optimizer update with the loop's non-finite guard (skip, count the streak)."""
  grad_norm = optax.tree.norm(grads)
  finite = jnp.isfinite(grad_norm)

  def apply(operand):
    params, opt_state = operand
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  params, opt_state = jax.lax.cond(finite, apply, lambda o: o, (state.params, state.opt_state))
  streak = jnp.where(finite, 0, state.nonfinite_streak + 1)
  new = state.replace(step=state.step + finite.astype(jnp.int32), params=params,
                      opt_state=opt_state, nonfinite_streak=streak,
                      nonfinite_total=state.nonfinite_total + (~finite))
  return new, {"grad_norm": grad_norm, "nonfinite_streak": streak}


@functools.partial(jax.jit, static_argnames=("graphdef", "optimizer", "schedule", "selected",
                                             "settings", "mesh"), donate_argnums=(0,))
def grpo_update(state: TrainState, reference, x_init, noise, grid, target, *, graphdef,
                optimizer, schedule: str, selected: tuple[int, ...],
                settings: FlowGRPOSettings, mesh=None):
  """Rollout → rewards → advantages → the schedule's gradient → one update (jitted, donated)."""
  apply = functools.partial(_apply, graphdef)

  def reward_fn(x, c):
    return ft.target_reward(x, target)

  if mesh is not None:
    out = sharded_flow_grpo_gradient(
      schedule, apply, state.params, reference if settings.beta else None,
      apply if settings.beta else None, Rollout(x_init, noise, None), reward_fn, mesh=mesh,
      grid=grid, selected=selected, settings=settings)
  else:
    ref_fn = None
    if settings.beta:
      def ref_fn(x, t, c):
        return jax.lax.stop_gradient(apply(reference, x, t, c))
    out = flow_grpo_gradient(schedule, apply, state.params, ref_fn,
                             Rollout(x_init, noise, None), reward_fn, grid=grid,
                             selected=selected, settings=settings)
  state, metrics = apply_gradients(state, out.grads, optimizer)
  metrics.update(loss=out.loss, kl=out.kl, reward=out.reward_mean,
                 reward_std_within=out.reward_std, forwards=out.forwards,
                 adv_abs=jnp.mean(jnp.abs(out.adv)))
  return state, metrics


@functools.partial(jax.jit, static_argnames=("graphdef", "settings", "num_eval_steps"))
def evaluate_policy(params, reference, x_eval, sde_x, sde_noise, grid, target,
                    centres, *, graphdef, settings: FlowGRPOSettings, num_eval_steps: int):
  """ODE samples' reward / modes, and the SDE path KL to `reference` (see the module doc)."""
  apply = functools.partial(_apply, graphdef)
  ode = flow_sde.sample_trajectory(lambda x, t: apply(params, x, t), x_eval,
                                   flow_sde.time_grid(num_eval_steps), 0.0,
                                   noise=jnp.zeros((num_eval_steps,) + x_eval.shape), sde=False)
  x = ode.x[-1]
  traj = flow_sde.sample_trajectory(lambda x, t: apply(params, x, t), sde_x, grid, settings.a,
                                    noise=sde_noise, reduction=settings.reduction)

  def step_kl(x_t, t, t_next, mean, std):
    v_ref = apply(reference, x_t, jnp.full((x_t.shape[0],), t))
    ref_mean, _ = flow_sde.sde_mean_std(v_ref, t, t_next, x_t, settings.a, t_cap=grid[1])
    return flow_sde.step_kl(mean, ref_mean, std, reduction="sum")

  kl = jax.vmap(step_kl)(traj.x[:-1], traj.t, traj.t_next, traj.mean, traj.std)
  shares = ft.mode_shares(x, centres)
  target_mode = ft.nearest_mode(target[None], centres)[0]
  return {"reward": jnp.mean(ft.target_reward(x, target)),
          "reward_sde": jnp.mean(ft.target_reward(traj.x[-1], target)),
          "mode_coverage": ft.mode_coverage(x, centres),
          "target_mode_share": shares[target_mode],
          "kl_pretrained": jnp.mean(jnp.sum(kl, axis=0))}


class FlowGRPO:
  """Flow-matching pretraining or Flow-GRPO (configs/flow_grpo.py); a `training.loop.Method`."""

  name = "flow_grpo"
  updates_per_step = 1

  def __init__(self, config):
    if config.method not in METHODS:
      raise ValueError(f"config.method={config.method!r}; valid: {', '.join(METHODS)}")
    flow = config.flow
    GRADIENT_SCHEDULES.get(flow.schedule)  # unknown names fail here, listing the valid ones
    if config.method == "grpo" and not (config.init_from or config.resume):
      raise ValueError("config.init_from: method 'grpo' starts from a pretrain run's workdir "
                       "(configs/flow_grpo.py's docstring gives the two commands)")
    if flow.num_steps < 1:
      raise ValueError(f"config.flow.num_steps={flow.num_steps} must be >= 1")
    if flow.group_size < 2:
      raise ValueError(f"config.flow.group_size={flow.group_size} must be >= 2 (a group "
                       "z-score needs two samples)")
    try:
      self.selected = select_steps(flow.num_steps, flow.timestep_fraction, flow.step_selection)
    except ValueError as e:
      raise ValueError(f"config.flow: {e}") from None
    self.settings = settings_of(flow)
    self.config = config
    self.mixture = ft.make_mixture(config.mixture)
    self.target = np.asarray(config.target, np.float32)
    if self.target.shape != (self.mixture.dim,):
      raise ValueError(f"config.target={tuple(config.target)} must have "
                       f"{self.mixture.dim} coordinates (config.mixture={config.mixture!r})")

  # ---- Set-up ----

  def build_model(self, run: loop.Run):
    m, dim = self.config.model, self.mixture.dim

    def make():
      return VelocityMLP(dim, hidden=m.hidden, depth=m.depth, time_dim=m.time_dim,
                         rngs=nnx.Rngs(self.config.seed))

    return init_sharded(make, run.train_mesh, run.train_rules)

  def start(self, run: loop.Run, state) -> None:
    config = self.config
    self.run = run
    self.graphdef = run.graphdef
    # π_ref: the starting (pretrained) policy, the same after a restart.
    self.reference = jax.tree.map(jnp.copy, state.params)
    self.grid = jnp.asarray(flow_sde.time_grid(config.flow.num_steps))
    mesh = run.train_mesh
    data = dict(mesh.shape).get("data", 1)
    self.mesh = mesh if data > 1 else None
    if self.mesh is not None:
      # The data axis is the shared-prompt axis alone: a 1-axis mesh of its devices.
      self.mesh = jax.sharding.Mesh(np.asarray(mesh.devices).reshape(-1)[:data], ("data",))
      if config.flow.group_size % data:
        raise ValueError(f"config.flow.group_size={config.flow.group_size} must be divisible "
                         f"by the {data} devices of config.mesh's data axis (shared prompts)")
    horizon = int(config.optimizer.get("decay_steps") or config.steps)
    self.optimizer = _OPTIMIZERS.setdefault((config.optimizer.to_json(), horizon),
                                            run.optimizer)
    if config.method == "pretrain":
      self.pretrain_step = make_train_step(run.graphdef, ft.flow_matching_objective, run.optimizer)
    key = jax.random.key(config.seed + 10_000)
    e = config.eval
    k1, k2, k3 = jax.random.split(key, 3)
    self.eval_inputs = (
      jax.random.normal(k1, (e.samples, self.mixture.dim)),
      jax.random.normal(k2, (e.kl_samples, self.mixture.dim)),
      jax.random.normal(k3, (config.flow.num_steps, e.kl_samples, self.mixture.dim)))
    self.started = time.perf_counter()

  def state_dict(self) -> dict[str, Any]:
    return {}  # every step's data and noise are functions of (seed, step)

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    del state

  # ---- One step ----

  def step(self, state, step: int):
    tic = time.perf_counter()
    key = jax.random.fold_in(jax.random.key(self.config.seed), step)
    if self.config.method == "pretrain":
      state, metrics = self._pretrain(state, key)
    else:
      state, metrics = self._grpo(state, key)
    record = {f"train/{k}": v for k, v in run_setup.host_metrics(metrics).items()}
    record["time/step"] = time.perf_counter() - tic
    return state, record

  def _pretrain(self, state, key):
    k0, k1, k2 = jax.random.split(key, 3)
    n = self.config.pretrain_batch
    batch = {"x0": ft.sample_mixture(self.mixture, k0, n),
             "eps": jax.random.normal(k1, (n, self.mixture.dim)),
             "t": jax.random.uniform(k2, (n,))}
    return self.pretrain_step(state, batch)

  def _grpo(self, state, key):
    flow = self.config.flow
    k0, k1 = jax.random.split(key)
    shape = (flow.prompts_per_step, flow.group_size, self.mixture.dim)
    x_init = jax.random.normal(k0, shape)
    noise = jax.random.normal(k1, (flow.num_steps,) + shape)
    return grpo_update(state, self.reference, x_init, noise, self.grid,
                       jnp.asarray(self.target), graphdef=self.graphdef,
                       optimizer=self.optimizer, schedule=flow.schedule,
                       selected=self.selected, settings=self.settings, mesh=self.mesh)

  # ---- Evaluation and report ----

  def evaluate(self, state, step: int) -> dict[str, Any]:
    x_eval, sde_x, sde_noise = self.eval_inputs
    result = evaluate_policy(state.params, self.reference, x_eval, sde_x, sde_noise,
                             self.grid, jnp.asarray(self.target),
                             jnp.asarray(self.mixture.centres), graphdef=self.graphdef,
                             settings=self.settings, num_eval_steps=self.config.eval.num_steps)
    return {f"eval/{k}": float(v) for k, v in jax.device_get(result).items()}

  def progress(self, record):
    if "train/reward" in record:
      return {"r": record["train/reward"]}
    return {"fm": record["train/loss"]}

  def summary(self, records: Sequence[Mapping[str, Any]]) -> str:
    return loop.eval_summary(records, "eval/reward", f"{self.config.method} eval reward")
