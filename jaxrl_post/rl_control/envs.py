"""Classic-control tasks for the inner RL loop: a gymnax env plus its reward features.

A reward module (MLREF, arXiv 2608.18827) sees a feature dict computed from one transition
(s_t, a_t, s_{t+1}); this module fixes, per environment, which features exist, their shapes and
their meaning. The features of a transition that ended an episode are computed from the
*terminal* next state (gymnax's `info["final_observation"]`), not from the auto-reset state.

The task's **fitness** is always the environment's own episodic return (sum of the gymnax
reward over an episode); the shaped reward R = Σ w_k m_k(features) is only what PPO learns from.

CartPole-v1 features (all scalars, `[*batch]`), next state unless said otherwise:

    x          cart position (m); the episode terminates at |x| > 2.4
    x_dot      cart velocity (m/s)
    theta      pole angle from upright (rad); terminates at |theta| > 0.2095 (12°)
    theta_dot  pole angular velocity (rad/s)
    push       the action as a force direction: −1 (left) or +1 (right)
    alive      1 if the transition did not terminate the episode, else 0

Pendulum-v1 features (scalars): theta (angle from upright, wrapped to [−π, π]), theta_dot
(rad/s, |·| ≤ 8), torque (applied torque, clipped to [−2, 2]), upright (cos theta).

Brax tasks ("brax/hopper", "brax/halfcheetah", "brax/ant", "brax/reacher", "brax/pusher") live
in `brax_envs`, which imports brax itself only when one of them is built; their `next_obs` is a
`brax_envs.BraxObservation` (terminal observation plus quantities of the full brax state).
"""

from __future__ import annotations

import gymnax
import jax.numpy as jnp

from jaxrl_post.rl_control import brax_envs
from jaxrl_post.rl_control.task import ControlTask


def _cartpole_features(obs, action, next_obs, terminated):
  del obs
  return {"x": next_obs[..., 0], "x_dot": next_obs[..., 1], "theta": next_obs[..., 2],
          "theta_dot": next_obs[..., 3], "push": 2.0 * action.astype(jnp.float32) - 1.0,
          "alive": 1.0 - terminated.astype(jnp.float32)}


def _pendulum_features(obs, action, next_obs, terminated):
  del obs, terminated  # Pendulum never terminates, it is only truncated at 200 steps.
  cos, sin, thdot = next_obs[..., 0], next_obs[..., 1], next_obs[..., 2]
  return {"theta": jnp.arctan2(sin, cos), "theta_dot": thdot,
          "torque": jnp.clip(action[..., 0], -2.0, 2.0), "upright": cos}


GYMNAX_NAMES = ("CartPole-v1", "Pendulum-v1")


def make_task(name: str) -> ControlTask:
  """The `ControlTask` for "CartPole-v1", "Pendulum-v1" or "brax/<env>[?options]"."""
  if name.startswith("brax/"):
    return brax_envs.make_task(name)  # Imports brax itself, only now.
  if name not in GYMNAX_NAMES:
    valid = GYMNAX_NAMES + brax_envs.VALID_NAMES
    raise ValueError(f"unsupported task {name!r}; valid: {', '.join(valid)}")
  env, params = gymnax.make(name)
  if name == "CartPole-v1":
    spec = {k: () for k in ("x", "x_dot", "theta", "theta_dot", "push", "alive")}
    docs = {"x": "cart position (m); the episode ends when |x| > 2.4",
            "x_dot": "cart velocity (m/s)",
            "theta": "pole angle from upright (rad); the episode ends when |theta| > 0.2095",
            "theta_dot": "pole angular velocity (rad/s)",
            "push": "action as push direction: -1 left, +1 right",
            "alive": "1.0 if this step did not end the episode (pole still up), else 0.0"}
    return ControlTask(
        name=name, env=env, env_params=params, discrete=True,
        action_dim=env.action_space(params).n, action_scale=1.0, feature_spec=spec,
        feature_docs=docs, features=_cartpole_features,
        task="Balance the pole on the cart for as long as possible. Fitness: the episodic "
             "return of CartPole-v1 = number of steps before the pole falls (|theta| > 12 deg) "
             "or the cart leaves the track (|x| > 2.4), at most 500.",
        environment="Cart-pole, Euler-integrated at 50 Hz; two actions push the cart left or "
                    "right with 10 N; episodes terminate on a fall and are truncated at 500 "
                    "steps. The agent maximises the discounted sum (gamma 0.99) of the reward "
                    "you design; a terminated episode earns nothing further.")
  if name == "Pendulum-v1":
    spec = {k: () for k in ("theta", "theta_dot", "torque", "upright")}
    docs = {"theta": "pendulum angle from upright (rad, wrapped to [-pi, pi]); 0 is upright",
            "theta_dot": "angular velocity (rad/s), |theta_dot| <= 8",
            "torque": "applied torque, clipped to [-2, 2]",
            "upright": "cos(theta): 1 upright, -1 hanging down"}
    return ControlTask(
        name=name, env=env, env_params=params, discrete=False,
        action_dim=env.action_space(params).shape[0], action_scale=2.0, feature_spec=spec,
        feature_docs=docs, features=_pendulum_features,
        task="Swing the pendulum up and keep it upright with little torque. Fitness: the "
             "episodic return of Pendulum-v1, -sum(theta^2 + 0.1 theta_dot^2 + 0.001 u^2) over "
             "200 steps (0 is best, about -1500 worst).",
        environment="Torque-limited pendulum (|u| <= 2) starting at a random angle, 200-step "
                    "episodes with no early termination.")
  raise AssertionError(name)  # Unreachable: GYMNAX_NAMES is checked above.
