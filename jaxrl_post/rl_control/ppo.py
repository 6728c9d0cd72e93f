"""PPO in pure JAX, in the shape of purejaxrl, learning from a pluggable (shaped) reward.

`make_train(config, task, reward_fn=None)` returns `train(rng, weights=None)`, one jittable
function that runs the whole training (rollouts, GAE, clipped-surrogate epochs) under `lax.scan`;
`jax.jit(jax.vmap(train, in_axes=(0, None)))(rngs, weights)` trains several seeds at once.

Two rewards are kept apart on purpose:

* the **learning reward** r_t: the environment's reward when `reward_fn` is None, else
  `reward_fn(features_t, weights).reward` with `features_t = task.features(s_t, a_t, s_{t+1},
  terminated_t)` (see `envs`), i.e. R = Σ_k w_k m_k of MLREF (arXiv 2608.18827, Eq. 1);
* the **fitness**: the environment's own episodic return Σ_t r^env_t, which PPO never sees when
  it learns from a shaped reward. It is what reward evolution scores.

Per update u (U = total_timesteps / (num_envs · num_steps) updates), with B = num_envs:

    GAE:      δ_t = r_t + γ V(s_{t+1}) (1 − d_t) − V(s_t),   Â_t = δ_t + γ λ (1 − d_t) Â_{t+1}
    ratio:    ρ = exp(log π(a|s) − log π_old(a|s))
    actor:    L_π = −E[min(ρ Â_n, clip(ρ, 1 − ε, 1 + ε) Â_n)],  Â_n = (Â − mean) / (std + 1e-8)
    critic:   L_V = ½ E[max((V − R̂)², (V_old + clip(V − V_old, −ε, ε) − R̂)²)],  R̂ = Â + V_old
    total:    L = L_π + c_V L_V − c_H H[π]

d_t is 1 when the episode ended at step t (termination or truncation: truncated episodes are
not bootstrapped, as in purejaxrl).

Optional running normalisation (`normalize_obs` / `normalize_reward`, see `normalization`),
purejaxrl's continuous-control setting, which brax locomotion needs to learn at all: the policy
and critic see o' = clip((o − μ) / σ, ±10) with μ, σ the running statistics of every
observation received so far, and learn from r' = clip(r / σ_G, ±10) with σ_G the running std of
the discounted learning return. Both are only what PPO optimises: reward features always see the
raw observations, and the fitness is always summed from the raw environment reward.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Mapping, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxrl_post.rl_control import normalization
from jaxrl_post.rl_control.task import ControlTask

RewardFn = Callable[[Mapping[str, jax.Array], jax.Array], object]


@dataclasses.dataclass(frozen=True, kw_only=True)
class PPOConfig:
  """PPO hyperparameters (defaults: purejaxrl's CartPole settings, a smaller budget).

  Attributes:
    num_envs: B parallel environments.
    num_steps: rollout length per update.
    total_timesteps: environment steps per seed.
    update_epochs: passes over each rollout.
    num_minibatches: minibatches per pass.
    lr: Adam learning rate (linearly annealed to 0 if `anneal_lr`).
    gamma / gae_lambda: discount γ and GAE λ.
    clip_eps: ε of the clipped surrogate and the value clipping.
    ent_coef / vf_coef: c_H and c_V.
    max_grad_norm: global-norm gradient clipping.
    hidden / activation: two hidden layers of this width for the actor and for the critic.
    reward_scale: multiplies the learning reward (not the fitness), after `normalize_reward`.
    normalize_obs: feed the networks running-normalised observations (stats per seed, updated
      with every observation received, the reset ones included).
    normalize_reward: divide the learning reward by the running std of its discounted return
      (γ = `gamma`) and clip it to ±10. The fitness and the `learn_reward` metric stay raw.
  """
  num_envs: int = 8
  num_steps: int = 128
  total_timesteps: int = 100_000
  update_epochs: int = 4
  num_minibatches: int = 4
  lr: float = 2.5e-4
  anneal_lr: bool = True
  gamma: float = 0.99
  gae_lambda: float = 0.95
  clip_eps: float = 0.2
  ent_coef: float = 0.01
  vf_coef: float = 0.5
  max_grad_norm: float = 0.5
  hidden: int = 64
  activation: str = "tanh"
  reward_scale: float = 1.0
  normalize_obs: bool = False
  normalize_reward: bool = False

  @property
  def num_updates(self) -> int:
    return self.total_timesteps // (self.num_envs * self.num_steps)


class ActorCritic(nn.Module):
  """Separate MLP actor and critic; categorical logits or a Gaussian mean with free log-std."""
  action_dim: int
  discrete: bool
  hidden: int = 64
  activation: str = "tanh"

  @nn.compact
  def __call__(self, x):
    act = nn.tanh if self.activation == "tanh" else nn.relu
    ortho, zero = nn.initializers.orthogonal, nn.initializers.constant(0.0)

    def mlp(h, out, scale):
      for _ in range(2):
        h = act(nn.Dense(self.hidden, kernel_init=ortho(math.sqrt(2)), bias_init=zero)(h))
      return nn.Dense(out, kernel_init=ortho(scale), bias_init=zero)(h)

    # Small final actor scale: a near-uniform initial policy (purejaxrl / Andrychowicz et al.).
    pi = mlp(x, self.action_dim, 0.01)
    value = mlp(x, 1, 1.0)[..., 0]
    if self.discrete:
      return pi, value
    log_std = self.param("log_std", zero, (self.action_dim,))
    return (pi, jnp.broadcast_to(log_std, pi.shape)), value


def sample_action(rng, pi, discrete: bool):
  """a ~ π(·|s): `[B]` int for logits `[B, A]`; `[B, A]` float for (mean, log_std)."""
  if discrete:
    return jax.random.categorical(rng, pi)
  mean, log_std = pi
  return mean + jnp.exp(log_std) * jax.random.normal(rng, mean.shape)


def log_prob(pi, action, discrete: bool):
  """log π(a|s), `[B]`."""
  if discrete:
    logp = jax.nn.log_softmax(pi)
    return jnp.take_along_axis(logp, action[..., None].astype(jnp.int32), -1)[..., 0]
  mean, log_std = pi
  z = (action - mean) / jnp.exp(log_std)
  return jnp.sum(-0.5 * z**2 - log_std - 0.5 * jnp.log(2 * jnp.pi), -1)


def entropy(pi, discrete: bool):
  """H[π(·|s)], `[B]`."""
  if discrete:
    logp = jax.nn.log_softmax(pi)
    return -jnp.sum(jnp.exp(logp) * logp, -1)
  _, log_std = pi
  return jnp.sum(log_std + 0.5 * jnp.log(2 * jnp.pi * jnp.e), -1)


class Transition(NamedTuple):
  done: jax.Array      # [B]
  action: jax.Array    # [B] | [B, A]
  value: jax.Array     # [B]
  reward: jax.Array    # [B] learning reward
  log_prob: jax.Array  # [B]
  obs: jax.Array       # [B, O]


def gae(values, rewards, dones, last_value, *, gamma: float, lam: float):
  """Generalised advantage estimates over a `[T, B]` rollout.

  Returns:
    `(advantages [T, B], returns [T, B])` with returns = advantages + values.
  """
  def step(carry, x):
    adv, next_value = carry
    v, r, d = x
    delta = r + gamma * next_value * (1.0 - d) - v
    adv = delta + gamma * lam * (1.0 - d) * adv
    return (adv, v), adv

  _, adv = jax.lax.scan(step, (jnp.zeros_like(last_value), last_value),
                        (values, rewards, dones), reverse=True)
  return adv, adv + values


def batched_env(task: ControlTask):
  """`(reset, step)` of `task.env` vmapped over environments.

  `reset(keys [B], params) -> (obs [B, O], state)`; `step(keys [B], state, env_action, params)
  -> (next_obs, state, reward [B], terminated [B], truncated [B], info)` with gymnax's
  auto-reset (`info["final_observation"]` holds the terminal observation).
  """
  return (jax.vmap(task.env.reset, in_axes=(0, None)),
          jax.vmap(task.env.step, in_axes=(0, 0, 0, None)))


def env_action(task: ControlTask, action):
  """The action the environment receives: continuous actions clipped to ±`action_scale`."""
  return action if task.discrete else jnp.clip(action, -task.action_scale, task.action_scale)


def transition_features(task: ControlTask, obs, action, info, terminated) -> dict:
  """Reward features of a batch of transitions, from the *terminal* next state.

  Args:
    task: `ControlTask`.
    obs: `[B, O]` raw observations s_t.
    action: `[B]` | `[B, A]` env action (see `env_action`).
    info: the `info` of the vectorised step (its `final_observation` is s_{t+1} before any
      auto-reset).
    terminated: `[B]` bool.
  """
  return task.features(obs, action, info["final_observation"], terminated)


def _fill_leading_nan(x):
  """Replaces the NaNs before the first finite entry of `[U]` by that entry."""
  ok = jnp.isfinite(x)
  first = x[jnp.argmax(ok)]
  return jnp.where(ok, x, first)


def make_train(config: PPOConfig, task: ControlTask, env_params=None,
               reward_fn: RewardFn | None = None):
  """Builds `train(rng, weights=None) -> {"metrics": ..., "params": ...}`.

  Args:
    config: `PPOConfig`.
    task: `ControlTask` (gymnax env + feature function).
    env_params: gymnax parameters (default: `task.env_params`).
    reward_fn: `(features, weights) -> RewardOutput` (e.g. `module_pool.build_reward_fn`); None
      = learn from the environment's reward.

  Returns:
    `train(rng, weights)`, pure and jittable; `weights` is the `[K]` vector of `reward_fn`
    (ignored without one). `metrics` holds `[U]` arrays (`[U, K]` for the module ones):
      fitness: mean true episodic return of the episodes finished in update u (carried from the
        previous update when none finished; leading gaps take the first value).
      episodes: episodes finished in update u.
      learn_reward / env_reward: mean per-step learning reward (before `reward_scale` and
        `normalize_reward`) / environment reward.
      module_terms: `[U, K]` mean module output m_k (the curves of the correlation credit).
      module_nonfinite: `[U, K]` NaN/inf outputs of m_k neutralised to 0.
      module_dropped: `[U, K]` 1 once m_k is dropped for the rest of the run: it failed when
        traced (`RewardOutput.failed`) or produced a NaN/inf; its weight is 0 from the next step
        on, so one bad module does not end or poison the run. pool/dropped_modules: `[U]` their
        count.
      loss, actor_loss, value_loss, entropy: means over the update's minibatches.
    With `normalize_obs`, the result also holds `obs_norm`: the final
    `normalization.RunningMeanStd` (`[O]` mean / var), without which `params` cannot be
    evaluated (the policy's input is `normalization.normalize(obs_norm, obs)`).
  """
  env_params = task.env_params if env_params is None else env_params
  cfg = config
  num_updates = cfg.num_updates
  if num_updates < 1:
    raise ValueError(f"total_timesteps {cfg.total_timesteps} < one rollout")
  batch = cfg.num_envs * cfg.num_steps
  if batch % cfg.num_minibatches:
    raise ValueError("num_envs * num_steps must be divisible by num_minibatches")
  net = ActorCritic(task.action_dim, task.discrete, cfg.hidden, cfg.activation)
  v_reset, v_step = batched_env(task)

  def lr_schedule(count):
    frac = 1.0 - (count // (cfg.num_minibatches * cfg.update_epochs)) / num_updates
    return cfg.lr * frac

  def train(rng, weights=None):
    rng, k_init, k_reset = jax.random.split(rng, 3)
    obs, env_state = v_reset(jax.random.split(k_reset, cfg.num_envs), env_params)
    params = net.init(k_init, obs)
    tx = optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm),
                     optax.adam(lr_schedule if cfg.anneal_lr else cfg.lr, eps=1e-5))
    opt_state = tx.init(params)
    ep_ret = jnp.zeros((cfg.num_envs,), jnp.float32)
    # (obs stats, reward stats, live-module mask [K]); None (no leaves) when off, so the default
    # program is unchanged.
    # The carried `obs` stays raw: it is normalised where the networks read it, with the stats
    # that already include it (updated on receipt, as purejaxrl's wrapper does).
    norm = (normalization.obs_init(obs) if cfg.normalize_obs else None,
            normalization.reward_init(cfg.num_envs) if cfg.normalize_reward else None,
            None if reward_fn is None or weights is None else jnp.ones(jnp.shape(weights), bool))

    def policy_input(obs_norm, obs):
      return obs if obs_norm is None else normalization.obs_normalize(obs_norm, obs)

    def env_step(carry, _):
      params, env_state, obs, ep_ret, norm, rng = carry
      obs_norm, rew_norm, live = norm
      rng, k_act, k_env = jax.random.split(rng, 3)
      pi_obs = policy_input(obs_norm, obs)
      pi, value = net.apply(params, pi_obs)
      action = sample_action(k_act, pi, task.discrete)
      logp = log_prob(pi, action, task.discrete)
      act = env_action(task, action)
      next_obs, env_state, env_r, term, trunc, info = v_step(
          jax.random.split(k_env, cfg.num_envs), env_state, act, env_params)
      env_r = env_r.astype(jnp.float32)
      done = jnp.logical_or(term, trunc)
      if reward_fn is None:
        r = env_r
        terms = jnp.zeros((0,), jnp.float32)
        bad = jnp.zeros((0,), jnp.int32)
      else:
        # Features of the *terminal* next state, not of the auto-reset one.
        feats = transition_features(task, obs, act, info, term)  # Raw obs.
        out = reward_fn(feats, weights if live is None else jnp.where(live, weights, 0.0))
        r, terms, bad = out.reward, jnp.mean(out.terms, axis=-1), out.nonfinite
        failed = getattr(out, "failed", None)
        if live is not None:  # A module that failed or went non-finite is dropped for the run.
          live = live & (bad == 0) & (True if failed is None else failed == 0)
      # Fitness: the raw env reward of the policy being trained (it acts on normalised obs), so
      # the normalisation needs nothing more at evaluation; the env reward is never normalised.
      ep_ret = ep_ret + env_r
      finished = jnp.where(done, ep_ret, 0.0)
      ep_ret = jnp.where(done, 0.0, ep_ret)
      learn_r = r.astype(jnp.float32)
      if rew_norm is not None:
        learn_r, rew_norm = normalization.reward_step(rew_norm, learn_r, done, gamma=cfg.gamma)
      if obs_norm is not None:
        obs_norm = normalization.obs_step(obs_norm, next_obs)
      # The transition stores the normalised obs the action was drawn from: the loss re-runs the
      # networks on it, so old and new log-probs see the same input.
      tr = Transition(done.astype(jnp.float32), action, value, cfg.reward_scale * learn_r, logp,
                      pi_obs)
      stats = (finished.sum(), done.sum(), jnp.mean(r), jnp.mean(env_r), terms, bad)
      return (params, env_state, next_obs, ep_ret, (obs_norm, rew_norm, live), rng), (tr, stats)

    def loss_fn(params, mb: Transition, adv, targets):
      pi, value = net.apply(params, mb.obs)
      logp = log_prob(pi, mb.action, task.discrete)
      v_clip = mb.value + jnp.clip(value - mb.value, -cfg.clip_eps, cfg.clip_eps)
      v_loss = 0.5 * jnp.mean(jnp.maximum((value - targets)**2, (v_clip - targets)**2))
      ratio = jnp.exp(logp - mb.log_prob)
      adv = (adv - adv.mean()) / (adv.std() + 1e-8)
      a_loss = -jnp.mean(jnp.minimum(ratio * adv,
                                     jnp.clip(ratio, 1 - cfg.clip_eps, 1 + cfg.clip_eps) * adv))
      ent = jnp.mean(entropy(pi, task.discrete))
      total = a_loss + cfg.vf_coef * v_loss - cfg.ent_coef * ent
      return total, (a_loss, v_loss, ent)

    def update(carry, _):
      params, opt_state, env_state, obs, ep_ret, norm, last_fit, rng = carry
      (params, env_state, obs, ep_ret, norm, rng), (traj, stats) = jax.lax.scan(
          env_step, (params, env_state, obs, ep_ret, norm, rng), None, cfg.num_steps)
      _, last_value = net.apply(params, policy_input(norm[0], obs))
      adv, targets = gae(traj.value, traj.reward, traj.done, last_value, gamma=cfg.gamma,
                         lam=cfg.gae_lambda)

      def epoch(carry, _):
        params, opt_state, rng = carry
        rng, k = jax.random.split(rng)
        perm = jax.random.permutation(k, batch)
        flat = jax.tree.map(lambda x: x.reshape((batch,) + x.shape[2:]), (traj, adv, targets))
        mbs = jax.tree.map(
            lambda x: x[perm].reshape((cfg.num_minibatches, -1) + x.shape[1:]), flat)

        def minibatch(carry, mb):
          params, opt_state = carry
          (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, *mb)
          updates, opt_state = tx.update(grads, opt_state, params)
          return (optax.apply_updates(params, updates), opt_state), (loss,) + aux

        (params, opt_state), losses = jax.lax.scan(minibatch, (params, opt_state), mbs)
        return (params, opt_state, rng), losses

      (params, opt_state, rng), losses = jax.lax.scan(
          epoch, (params, opt_state, rng), None, cfg.update_epochs)
      ret_sum, n_done, learn_r, env_r, terms, bad = stats
      n = n_done.sum()
      fit = jnp.where(n > 0, ret_sum.sum() / jnp.maximum(n, 1), last_fit)
      loss, a_loss, v_loss, ent = (jnp.mean(x) for x in losses)
      dropped = (jnp.zeros(terms.shape[1:], jnp.int32) if norm[2] is None else
                 (~norm[2]).astype(jnp.int32))
      metrics = {"fitness": fit, "episodes": n, "learn_reward": learn_r.mean(),
                 "env_reward": env_r.mean(), "module_terms": terms.mean(0),
                 "module_nonfinite": bad.sum(0), "loss": loss, "actor_loss": a_loss,
                 "module_dropped": dropped, "pool/dropped_modules": dropped.sum(),
                 "value_loss": v_loss, "entropy": ent}
      return (params, opt_state, env_state, obs, ep_ret, norm, fit, rng), metrics

    carry = (params, opt_state, env_state, obs, ep_ret, norm, jnp.float32(jnp.nan), rng)
    carry, metrics = jax.lax.scan(update, carry, None, num_updates)
    metrics["fitness"] = _fill_leading_nan(metrics["fitness"])
    out = {"metrics": metrics, "params": carry[0]}
    if cfg.normalize_obs:
      out["obs_norm"] = carry[5][0].rms
    return out

  return train


# XLA options that halve CPU compile time of a PPO run (~15 s instead of ~30 s on 2 busy
# cores) at some cost in run time: for smoke tests and tiny budgets.
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def train_seeds(config: PPOConfig, task: ControlTask, seeds, *, reward_fn: RewardFn | None = None,
                weights=None, fast_compile: bool = False) -> dict:
  """Jits and runs `make_train` vmapped over `seeds` (ints); metrics as numpy `[S, U, ...]`.

  Every new `reward_fn` is a new program: one XLA compile per call (`fast_compile` trades run
  speed for compile speed).
  """
  train = make_train(config, task, reward_fn=reward_fn)
  rngs = jnp.stack([jax.random.PRNGKey(int(s)) for s in seeds])
  if weights is not None:
    weights = jnp.asarray(weights, jnp.float32)
  fn = jax.jit(jax.vmap(train, in_axes=(0, None))).lower(rngs, weights)
  out = fn.compile(compiler_options=FAST_COMPILE if fast_compile else None)(rngs, weights)
  return jax.tree.map(np.asarray, out["metrics"])
