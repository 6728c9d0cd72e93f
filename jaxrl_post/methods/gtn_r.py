"""GTN-R (arXiv 2608.08010) on synthetic regime series: NLL pretraining, then TS-GRPO ± GTN-R.

A run is one `config.stage`:

  pretrain  NLL of the true future under the forecaster, on the *pretraining* mix
            (`tasks.time_series.MIXES["pretrain"]`): −mean log π_θ(y* | x) / H.
  grpo      TS-GRPO on the *RL* mix from a pretrain run (`config.init_from`), with the GTN-R
            variant `config.gtn_r.variant` (`losses.gtn_r.GTN_R_VARIANTS`):
              none               plain TS-GRPO (G forecasts per series, R = −MSE / −MAE /
                                 −CRPS in σ̂ units, group z-score, clipped surrogate on the
                                 sequence log-density ratio, optional k3 KL to the start)
              neighbourhood_nll  A: + λ·(−mean log π_θ(ỹ | x)/H), ỹ = y* + δ·σ̂·ξ
              anchored_group     B: K extra members ỹ ~ N_δ(y*) per group, rewarded and
                                 z-scored with the G on-policy forecasts
            λ and δ anneal over `config.gtn_r.anneal_steps` RL steps (`losses.gtn_r.anneal`).

One GRPO step, top to bottom: `prompts_per_step` series of the RL mix (a pure function of
(seed, step): resuming needs no data state) → G draws per series from the current policy
(and variant B's anchors) → rewards → group advantages → behaviour and reference
log-densities (one jitted `rollout`) → one update of `losses.gtn_r.gtn_r_loss`.

Evaluation (`eval_size` held-out series of the RL mix, `eval_samples` draws each): MSE of the
predictive mean (σ̂² units) overall / in hard regions (cue + shifted future) / elsewhere, the
Monte-Carlo mass near the truth π_θ(RMS((y − y*)/σ̂) ≤ `eval_delta`) (and within each of
`gtn_r.eval_radii`: `mass_within_<r>`), the distance of the predictive mean to y*, the
predictive std, the NLL of y* per point and the sample CRPS.

The jitted rollout and evaluation are cached per (model graph, compile-time constants), so the
runs of one process (a sweep, a resumed run, the tests) compile each once; `config.rng_impl`
picks the PRNG of their keys (threefry by default, rbg for fast CPU compiles in runlocal).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_post.losses import gtn_r as gl
from jaxrl_post.models import forecaster as fc
from jaxrl_post.parallel.mesh import init_sharded, put_batch
from jaxrl_post.tasks import time_series as ts
from jaxrl_post.training import loop
from jaxrl_post.training import setup as run_setup
from jaxrl_post.training.train_state import make_train_step

STAGES = ("pretrain", "grpo")
# Data streams of `tasks.time_series.batch_rng`: each stage and the evaluation draw their own.
STREAM_PRETRAIN, STREAM_GRPO, STREAM_EVAL = 0, 1, 2
# PRNG implementations of the initialisation / rollout / evaluation keys (`config.rng_impl`):
# threefry (the default) gives the same values on any mesh; rbg compiles ~4x faster on CPU
# (smoke tests), but its values may depend on the mesh.
RNG_IMPLS = ("threefry2x32", "rbg", "unsafe_rbg")


def check_config(config) -> gl.Variant:
  """Validates the method's keys; returns the GTN-R variant. Errors name the key."""
  if config.stage not in STAGES:
    raise ValueError(f"config.stage={config.stage!r}; valid: {', '.join(STAGES)}")
  try:
    variant = gl.GTN_R_VARIANTS.get(config.gtn_r.variant)
  except KeyError as e:
    raise ValueError(f"config.gtn_r.variant={config.gtn_r.variant!r}: {e.args[0]}") from None
  for key in ("pretrain_mix", "rl_mix"):
    if config[key] not in ts.MIXES:
      raise ValueError(f"config.{key}={config[key]!r}; valid: {', '.join(ts.MIXES.names())}")
  if config.gtn_r.reward not in gl.FORECAST_REWARDS:
    raise ValueError(f"config.gtn_r.reward={config.gtn_r.reward!r}; valid: "
                     f"{', '.join(gl.FORECAST_REWARDS.names())}")
  if config.num_samples < 2:
    raise ValueError(f"config.num_samples={config.num_samples}: TS-GRPO groups need G >= 2")
  if config.get("rng_impl", RNG_IMPLS[0]) not in RNG_IMPLS:
    raise ValueError(f"config.rng_impl={config.rng_impl!r}; valid: {', '.join(RNG_IMPLS)}")
  g = config.gtn_r
  for key in ("delta", "delta_end", "eval_delta"):
    if not g[key] > 0:
      raise ValueError(f"config.gtn_r.{key}={g[key]} must be > 0")
  if not all(r > 0 for r in g.get("eval_radii", ())):
    raise ValueError(f"config.gtn_r.eval_radii={g.eval_radii} must all be > 0")
  for key in ("lam", "lam_end"):
    if g[key] < 0:
      raise ValueError(f"config.gtn_r.{key}={g[key]} must be >= 0")
  if g.schedule not in gl.SCHEDULES:
    raise ValueError(f"config.gtn_r.schedule={g.schedule!r}; valid: "
                     f"{', '.join(gl.SCHEDULES.names())}")
  for key in ("anneal_steps", "num_neighbours", "num_anchors"):
    if g[key] < 1:
      raise ValueError(f"config.gtn_r.{key}={g[key]} must be >= 1")
  if config.stage == "grpo" and not (config.init_from or config.resume):
    raise ValueError("config.init_from: stage 'grpo' starts from a pretrain run's workdir "
                     "(--config.init_from=<pretrain workdir>)")
  return variant


def forecaster_config(config) -> fc.ForecasterConfig:
  m = config.model
  return fc.ForecasterConfig(context_len=config.context_len, horizon=config.horizon,
                             hidden=m.hidden, num_layers=m.num_layers,
                             num_components=m.num_components, min_scale=m.min_scale)


def nll_loss(model, batch):
  """Pretraining: `(model, {context [B, C], target [B, H]}) -> (−mean log π(y*|x)/H, aux)`."""
  params = model(batch["context"])
  nll = -jnp.mean(fc.log_prob(params, batch["target"])) / batch["target"].shape[-1]
  return nll, {"nll": nll}


def make_grpo_loss(variant: gl.Variant, *, horizon: int, epsilon: float, beta: float,
                   kl_estimator: str):
  """`(model, batch) -> (loss, aux)`: `losses.gtn_r.gtn_r_loss` of the forecaster.

  The batch holds `context [B, C]`, `members [B, G', H]` (G' = G, or G + K with anchors),
  `old_logp`, `adv`, `weights` `[B, G']`, `ref_logp` when β > 0, `neighbours [B, M, H]` for
  variant A, and the scalar `lam`.
  """

  def loss(model, batch):
    params = model(batch["context"])
    nbr = fc.log_prob(params, batch["neighbours"]) if variant.regulariser else None
    value, aux = gl.gtn_r_loss(
      fc.log_prob(params, batch["members"]), batch["old_logp"], batch["adv"], nbr_logp=nbr,
      lam=batch["lam"], horizon=horizon, weights=batch["weights"], epsilon=epsilon,
      ref_logp=batch.get("ref_logp"), beta=beta, kl_estimator=kl_estimator)
    return value, aux._asdict()

  return loss


def _split_means(values: np.ndarray, hard: np.ndarray, name: str) -> dict[str, float]:
  out = {name: float(np.mean(values))}
  for part, mask in (("hard", hard), ("easy", ~hard)):
    out[f"{name}_{part}"] = float(np.mean(values[mask])) if mask.any() else float("nan")
  return out


class RolloutSpec(NamedTuple):
  """The compile-time constants of a GRPO rollout (hashable: the jitted rollout is shared)."""

  num_samples: int
  reward: str
  anchors: bool
  num_anchors: int
  anchor_weight: float
  regulariser: bool
  num_neighbours: int


# The jitted rollout / evaluation are cached per (graph, constants), so runs of one process
# (a sweep, a resumed run, the tests) compile each once.
@functools.lru_cache(maxsize=32)
def _rollout_fn(graphdef, spec: RolloutSpec):
  """`(params, ref_params, context, target, scale, key, delta) -> (batch, stats)`, jitted."""

  @jax.jit
  def rollout(params, ref_params, context, target, scale, key, delta):
    k_sample, k_anchor, k_nbr = jax.random.split(key, 3)
    mixture = nnx.merge(graphdef, params)(context)
    members = fc.sample(mixture, k_sample, spec.num_samples)
    on_policy = gl.forecast_rewards(members, target, scale, reward=spec.reward)
    is_anchor = jnp.zeros(members.shape[:2], bool)
    if spec.anchors:
      anchors = gl.neighbourhood_draws(k_anchor, target, scale, delta=delta,
                                       num=spec.num_anchors)
      members, is_anchor = gl.anchored_group(members, anchors)
    rewards = gl.forecast_rewards(members, target, scale, reward=spec.reward)
    out = dict(members=members, old_logp=fc.log_prob(mixture, members),
               adv=gl.ts_grpo_advantages(rewards),
               weights=jnp.where(is_anchor, spec.anchor_weight, 1.0))
    if ref_params is not None:
      out["ref_logp"] = fc.log_prob(nnx.merge(graphdef, ref_params)(context), members)
    if spec.regulariser:
      out["neighbours"] = gl.neighbourhood_draws(k_nbr, target, scale, delta=delta,
                                                 num=spec.num_neighbours)
    stats = dict(reward=jnp.mean(on_policy, axis=1), best=jnp.max(on_policy, axis=1),
                 anchor_reward=jnp.sum(jnp.where(is_anchor, rewards, 0.0), axis=1)
                 / jnp.maximum(jnp.sum(is_anchor, axis=1), 1))
    return out, stats

  return rollout


@functools.lru_cache(maxsize=32)
def _evaluate_fn(graphdef, eval_delta: float, horizon: int, radii: tuple[float, ...] = ()):
  """`(params, context, target, scale, key, num) -> per-series metrics`, jitted (`num` static).

  `radii`: extra radii r of the mass near the truth, logged as `mass_within_<r>`.
  """

  @functools.partial(jax.jit, static_argnames="num")
  def evaluate(params, context, target, scale, key, num):
    mixture = nnx.merge(graphdef, params)(context)
    draws = fc.sample(mixture, key, num)
    point = fc.mean(mixture)
    diag = gl.forecast_diagnostics(draws, point, target, scale, delta=eval_delta)
    crps = -gl.forecast_rewards(draws, target, scale, reward="crps").mean(axis=1)
    extra = {f"mass_within_{r:g}": gl.forecast_diagnostics(draws, point, target, scale,
                                                          delta=r).mass_near_truth
             for r in radii}
    return extra | dict(mse=jnp.mean(jnp.square((point - target) / scale[:, None]), axis=-1),
                mse_median=jnp.mean(jnp.square((fc.median(mixture) - target)
                                               / scale[:, None]), axis=-1),
                mass_near_truth=diag.mass_near_truth, distance=diag.distance,
                pred_std=diag.predictive_std, crps=crps,
                nll=-fc.log_prob(mixture, target) / horizon - jnp.log(scale))

  return evaluate


class GTNR:
  """NLL pretraining or TS-GRPO ± GTN-R of a `models.forecaster.Forecaster`; a loop `Method`."""

  name = "gtn_r"
  updates_per_step = 1

  def __init__(self, config):
    self.config = config
    self.variant = check_config(config)
    self.model_config = forecaster_config(config)

  def build_model(self, run: loop.Run):
    seed, cfg = self.config.seed, self.model_config
    # nnx.Rngs(key(seed)) is nnx.Rngs(seed) for threefry (the default).
    return init_sharded(lambda: fc.Forecaster(cfg, rngs=nnx.Rngs(self.key(seed))),
                        run.train_mesh, run.train_rules)

  def start(self, run: loop.Run, state) -> None:
    c, variant = self.config, self.variant
    self.run = run
    graphdef = run.graphdef
    # A copy: the train step donates the state, so the starting params must not alias it.
    self.ref_params = jax.tree.map(jnp.copy, state.params) if c.beta > 0 else None
    if c.stage == "pretrain":
      self.step_fn = make_train_step(graphdef, nll_loss, run.optimizer, mesh=run.train_mesh,
                                     rules=run.train_rules)
    else:
      loss = make_grpo_loss(variant, horizon=c.horizon, epsilon=c.epsilon, beta=c.beta,
                            kl_estimator=c.kl_estimator)
      self.step_fn = make_train_step(graphdef, loss, run.optimizer, mesh=run.train_mesh,
                                     rules=run.train_rules, shared=("lam",))
    g = c.gtn_r
    self.rollout_fn = _rollout_fn(graphdef, RolloutSpec(
      num_samples=c.num_samples, reward=g.reward, anchors=variant.anchors,
      num_anchors=g.num_anchors, anchor_weight=float(g.anchor_weight),
      regulariser=variant.regulariser, num_neighbours=g.num_neighbours))
    radii = tuple(float(r) for r in g.get("eval_radii", ()))
    self.eval_fn = _evaluate_fn(graphdef, float(g.eval_delta), c.horizon, radii)
    self.eval_set = ts.generate(ts.batch_rng(c.seed, STREAM_EVAL, 0), c.eval_size, c.rl_mix,
                                context_len=c.context_len, horizon=c.horizon)

  def key(self, seed: int) -> jax.Array:
    """A PRNG key of `config.rng_impl` (default threefry2x32)."""
    return jax.random.key(seed, impl=self.config.get("rng_impl", RNG_IMPLS[0]))

  def schedule(self, step: int) -> tuple[float, float]:
    """(λ, δ) at RL step `step` (`losses.gtn_r.anneal`)."""
    g = self.config.gtn_r
    lam = gl.anneal(step - 1, start=g.lam, end=g.lam_end, steps=g.anneal_steps, kind=g.schedule)
    delta = gl.anneal(step - 1, start=g.delta, end=g.delta_end, steps=g.anneal_steps,
                      kind=g.schedule)
    return lam, delta

  def state_dict(self) -> dict[str, Any]:
    # Batches, draws and schedules are functions of (seed, step): nothing else to carry.
    return {"stage": self.config.stage}

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    stage = state.get("stage", self.config.stage)
    if stage != self.config.stage:
      raise ValueError(f"config.stage={self.config.stage!r} but the workdir's checkpoint is "
                       f"of stage {stage!r}; start a new workdir (init_from it)")

  def step(self, state, step: int):
    c, run = self.config, self.run
    mix = c.pretrain_mix if c.stage == "pretrain" else c.rl_mix
    stream = STREAM_PRETRAIN if c.stage == "pretrain" else STREAM_GRPO
    size = c.batch_size if c.stage == "pretrain" else c.prompts_per_step
    data = ts.generate(ts.batch_rng(c.seed, stream, step), size, mix, context_len=c.context_len,
                       horizon=c.horizon)
    place = lambda tree: put_batch(tree, run.train_mesh, run.train_rules)
    if c.stage == "pretrain":
      state, metrics = self.step_fn(state, place(dict(context=data.context, target=data.target)))
      return state, {f"train/{k}": v for k, v in run_setup.host_metrics(metrics).items()}
    lam, delta = self.schedule(step)
    key = jax.random.fold_in(self.key(c.seed), step)
    arrays = place(dict(context=data.context, target=data.target, scale=data.scale))
    batch, stats = self.rollout_fn(state.params, self.ref_params, arrays["context"],
                                   arrays["target"], arrays["scale"], key,
                                   jnp.float32(delta))
    batch = dict(batch, context=arrays["context"], lam=np.float32(lam))
    state, metrics = self.step_fn(state, place(batch))
    record = {f"train/{k}": v for k, v in run_setup.host_metrics(metrics).items()}
    stats = jax.device_get(stats)
    record.update(_split_means(stats["reward"], data.hard, "rollout/reward"))
    record["rollout/best_reward"] = float(np.mean(stats["best"]))
    if self.variant.anchors:
      record["rollout/anchor_reward"] = float(np.mean(stats["anchor_reward"]))
    record.update({"gtn_r/lam": lam, "gtn_r/delta": delta})
    return state, record

  def evaluate(self, state, step: int) -> dict[str, float]:
    c, e = self.config, self.eval_set
    place = lambda x: put_batch(x, self.run.train_mesh, self.run.train_rules)
    out = jax.device_get(self.eval_fn(state.params, place(e.context), place(e.target),
                                      place(e.scale), self.key(c.seed + 1000),
                                      c.eval_samples))
    record = {}
    for name, values in out.items():
      record.update(_split_means(np.asarray(values), e.hard, f"eval/{name}"))
    return record

  def progress(self, record):
    keys = ("train/loss", "rollout/reward")
    return {k.split("/")[-1]: record[k] for k in keys if k in record}

  def summary(self, records: Sequence[Mapping[str, Any]]) -> str:
    parts = [loop.eval_summary(records, "eval/mse", "eval MSE"),
             loop.eval_summary(records, "eval/mass_near_truth_hard", "hard-region mass near y*")]
    return f"{self.name} {self.config.stage}: " + "; ".join(p for p in parts if p)
