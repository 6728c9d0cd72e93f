"""Brax locomotion / manipulation tasks behind the gymnax interface that `ppo` uses.

`make_task("brax/<env>")` returns a `ControlTask` whose `env` is a `GymnaxBrax` adapter, so
`ppo.make_train` runs unchanged. Brax is imported only here, and only when a brax task is built.

The adapter gives brax the three things `ppo` relies on from gymnax:

* `reset(key, params) -> (obs [O], state)` and `step(key, state, action, params) -> (obs, state,
  reward, terminated, truncated, info)` on one environment (`ppo` vmaps them);
* auto-reset: when an episode ends the returned `obs`/`state` are a fresh random reset drawn
  with `key` (as gymnax does, not brax's `AutoResetWrapper`, which replays the first state);
* truncation after `episode_length` steps (brax's own envs never truncate), reported as
  `truncated` and never as `terminated`.

`info["final_observation"]` is a `BraxObservation`, not an array: the terminal policy
observation *and* the `extras` (velocities, heights, costs, distances) read from the terminal
brax state before the auto-reset. Brax's reward terms depend on quantities the policy
observation omits (the torso's x displacement, the metrics), so reward features must be taken
from the full state; this keeps the "features of the terminal next state" rule of `envs`
without changing `ppo`.

Name syntax: `brax/<env>` or `brax/<env>?episode_length=200&backend=generalized`
(defaults: 1000 steps, the `positional` pipeline, the fastest of brax's backends on CPU).
The fitness of every task is brax's own reward summed over an episode (at most
`episode_length` steps); features are per transition and are all computed with `action`
clipped to brax's control range [-1, 1].
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from gymnax.environments import spaces

from jaxrl_post.rl_control.task import ControlTask

DEFAULT_EPISODE_LENGTH = 1000
DEFAULT_BACKEND = "positional"


class BraxObservation(NamedTuple):
  """What `info["final_observation"]` holds: the next state as the features see it.

  Attributes:
    obs: policy observation of the next (terminal, on the last step) state, `[O]`.
    extras: name → scalar `()` or vector `[d]` quantity of that state (see `_SPECS`).
  """
  obs: jax.Array
  extras: dict


class BraxEnvState(NamedTuple):
  """Adapter state: brax's `State` plus the step count within the episode (int32 `()`)."""
  brax: Any
  time: jax.Array


class GymnaxBrax:
  """A brax `Env` with gymnax's reset/step signatures, auto-reset and truncation.

  Args:
    env: a brax environment (`brax.envs.get_environment(...)`).
    episode_length: truncate episodes after this many steps.
    extras_fn: `(next brax State, action [A]) -> {name: () | [d]}`, the quantities copied
      into `BraxObservation.extras` (one unbatched environment, before any auto-reset).
  """

  def __init__(self, env, episode_length: int, extras_fn: Callable[..., dict]):
    if episode_length < 1:
      raise ValueError(f"episode_length must be >= 1, got {episode_length}")
    self.env = env
    self.episode_length = int(episode_length)
    self.extras_fn = extras_fn

  @property
  def default_params(self):
    return None  # Everything is fixed at construction; `params` is accepted and ignored.

  @property
  def num_actions(self) -> int:
    return self.env.action_size

  def observation_space(self, params=None) -> spaces.Box:
    del params
    return spaces.Box(-jnp.inf, jnp.inf, (self.env.observation_size,), jnp.float32)

  def action_space(self, params=None) -> spaces.Box:
    del params
    return spaces.Box(-1.0, 1.0, (self.env.action_size,), jnp.float32)

  def reset(self, key, params=None):
    del params
    s = self.env.reset(key)
    return s.obs, BraxEnvState(s, jnp.zeros((), jnp.int32))

  def step(self, key, state: BraxEnvState, action, params=None):
    """One step; on `terminated | truncated` the returned obs/state come from `reset(key)`.

    Returns:
      `(obs [O], state, reward (), terminated bool (), truncated bool (), info)` with
      `info = {"final_observation": BraxObservation, "truncated", "discount"}`.
    """
    nxt = self.env.step(state.brax, action)
    time = state.time + 1
    terminated = nxt.done > 0.5
    truncated = jnp.logical_and(time >= self.episode_length, jnp.logical_not(terminated))
    done = jnp.logical_or(terminated, truncated)
    final = BraxObservation(nxt.obs, self.extras_fn(nxt, action))
    reset_obs, reset_state = self.reset(key)
    stepped = BraxEnvState(nxt, time)
    new_state = jax.tree.map(lambda r, s: jnp.where(done, r, s), reset_state, stepped)
    obs = jnp.where(done, reset_obs, nxt.obs)
    info = {"final_observation": final, "truncated": truncated,
            "discount": 1.0 - terminated.astype(jnp.float32)}
    return obs, new_state, nxt.reward, terminated, truncated, info


# ---------------------------------------------------------------------------------------------
# Per-environment features. `ps` is brax's pipeline state: `x.pos[i]` the world position (m) of
# link i (0 = torso / root), `q` / `qd` generalized positions / velocities.
# ---------------------------------------------------------------------------------------------


def _sq(action):
  return jnp.sum(jnp.square(jnp.clip(action, -1.0, 1.0)), -1)


def _planar_extras(nxt, action):
  """Hopper and halfcheetah: root joints (x, z, pitch) then the leg joints."""
  ps = nxt.pipeline_state
  return {"forward_velocity": nxt.metrics["x_velocity"], "torso_height": ps.x.pos[0, 2],
          "torso_angle": ps.q[2], "ctrl_cost": _sq(action), "joint_velocity": ps.qd[3:]}


def _ant_extras(nxt, action):
  ps = nxt.pipeline_state
  return {"forward_velocity": nxt.metrics["x_velocity"],
          "lateral_velocity": nxt.metrics["y_velocity"], "torso_height": ps.x.pos[0, 2],
          "ctrl_cost": _sq(action), "joint_velocity": ps.qd[6:]}


def _reacher_extras(nxt, action):
  return {"distance": -nxt.metrics["reward_dist"], "tip_to_target": nxt.obs[-3:-1],
          "tip_velocity": nxt.obs[6:8], "ctrl_cost": _sq(action)}


def _pusher_extras(nxt, action):
  del action  # Brax rescales it to torques; its metric holds the cost of those.
  return {"tip_to_object": -nxt.metrics["reward_near"],
          "object_to_goal": -nxt.metrics["reward_dist"], "ctrl_cost": -nxt.metrics["reward_ctrl"],
          "joint_velocity": nxt.pipeline_state.qd[:7]}


def _features(obs, action, next_obs: BraxObservation, terminated, *, alive: bool):
  """`ControlTask.features`: the extras of the next state, plus `alive` for tasks that fall."""
  del obs, action  # Already in the extras (ctrl_cost).
  out = dict(next_obs.extras)
  if alive:
    out["alive"] = 1.0 - terminated.astype(jnp.float32)
  return out


_VEL = "forward velocity of the torso (m/s): its x displacement over the step / dt"
_CTRL = "sum of squared actions sum_i a_i^2 over the {n} actuators, a_i in [-1, 1]"
_ALIVE = "1.0 if this step did not end the episode by a fall ({why}), else 0.0"


@dataclasses.dataclass(frozen=True)
class _Spec:
  brax_name: str
  extras_fn: Callable[..., dict]
  alive: bool                       # Terminates on a fall: add the `alive` feature.
  docs: Callable[[Any], dict]       # env → feature name → meaning and units.
  shapes: Callable[[Any], dict]     # env → vector feature name → shape.
  task: str
  environment: str                  # Formatted with dt, episode_length, backend.


_SPECS = {
    "hopper": _Spec(
        "hopper", _planar_extras, True,
        lambda env: {
            "forward_velocity": _VEL, "torso_height": "torso height z (m); a fall if <= 0.7",
            "torso_angle": "torso pitch (rad); a fall if |angle| >= 0.2",
            "ctrl_cost": _CTRL.format(n=env.action_size),
            "joint_velocity": "angular velocities of thigh, leg, foot joints (rad/s), [3]",
            "alive": _ALIVE.format(why="height <= 0.7, |pitch| >= 0.2 or |state| >= 100")},
        lambda env: {"joint_velocity": (env.sys.qd_size() - 3,)},
        task="Make the one-legged hopper hop forward (+x) as fast as possible without falling. "
             "Fitness: the episodic return of brax's hopper, sum over steps of "
             "forward_velocity + 1 (while not fallen) - 0.001 * ctrl_cost.",
        environment="Brax hopper (planar, 3 torque-controlled joints, actions in [-1, 1]), "
                    "{backend} physics, dt = {dt:.3g} s per step. An episode terminates when the "
                    "hopper falls and is truncated after {episode_length} steps."),
    "halfcheetah": _Spec(
        "halfcheetah", _planar_extras, False,
        lambda env: {
            "forward_velocity": _VEL, "torso_height": "torso height z (m)",
            "torso_angle": "torso pitch (rad); the cheetah can flip over (no termination)",
            "ctrl_cost": _CTRL.format(n=env.action_size),
            "joint_velocity": "angular velocities of the 6 leg joints (rad/s), [6]"},
        lambda env: {"joint_velocity": (env.sys.qd_size() - 3,)},
        task="Make the half-cheetah run forward (+x) as fast as possible. Fitness: the "
             "episodic return of brax's halfcheetah, sum over steps of forward_velocity - "
             "0.1 * ctrl_cost.",
        environment="Brax halfcheetah (planar, 6 torque-controlled joints, actions in [-1, 1]), "
                    "{backend} physics, dt = {dt:.3g} s per step. No early termination; episodes "
                    "are truncated after {episode_length} steps."),
    "ant": _Spec(
        "ant", _ant_extras, True,
        lambda env: {
            "forward_velocity": _VEL,
            "lateral_velocity": "sideways (y) velocity of the torso (m/s)",
            "torso_height": "torso height z (m); a fall if < 0.2 or > 1.0",
            "ctrl_cost": _CTRL.format(n=env.action_size),
            "joint_velocity": "angular velocities of the 8 hip/ankle joints (rad/s), [8]",
            "alive": _ALIVE.format(why="torso height outside [0.2, 1.0]")},
        lambda env: {"joint_velocity": (env.sys.qd_size() - 6,)},
        task="Make the four-legged ant walk forward (+x) as fast as possible without falling. "
             "Fitness: the episodic return of brax's ant, sum over steps of forward_velocity "
             "+ 1 (while not fallen) - 0.5 * ctrl_cost (brax's contact cost is always 0).",
        environment="Brax ant (3D quadruped, 8 torque-controlled joints, actions in [-1, 1]), "
                    "{backend} physics, dt = {dt:.3g} s per step. An episode terminates when the "
                    "torso height leaves [0.2, 1.0] m and is truncated after {episode_length} "
                    "steps."),
    "reacher": _Spec(
        "reacher", _reacher_extras, False,
        lambda env: {
            "distance": "distance fingertip -> target (m), >= 0; the arm reaches about 0.21",
            "tip_to_target": "fingertip minus target position in the plane (m), [2]",
            "tip_velocity": "fingertip velocity in the plane (m/s), [2]",
            "ctrl_cost": _CTRL.format(n=env.action_size)},
        lambda env: {"tip_to_target": (2,), "tip_velocity": (2,)},
        task="Move the fingertip of the two-link arm to the randomly placed target and keep it "
             "there with little effort. Fitness: the episodic return of brax's reacher, sum "
             "over steps of -distance - ctrl_cost (0 is the unreachable best).",
        environment="Brax reacher (planar 2-link arm, 2 torque-controlled joints, actions in "
                     "[-1, 1]), {backend} physics, dt = {dt:.3g} s per step; a new target each "
                     "episode. No early termination; episodes are truncated after "
                     "{episode_length} steps."),
    "pusher": _Spec(
        "pusher", _pusher_extras, False,
        lambda env: {
            "tip_to_object": "distance gripper -> object (m), measured before the step",
            "object_to_goal": "distance object -> goal (m), measured before the step",
            "ctrl_cost": "sum of squared joint torques sum_i u_i^2 (u_i = 2 a_i, a_i in [-1, 1])",
            "joint_velocity": "angular velocities of the 7 arm joints (rad/s), [7]"},
        lambda env: {"joint_velocity": (7,)},
        task="Push the cylinder on the table to the goal with the 7-joint arm. Fitness: the "
             "episodic return of brax's pusher, sum over steps of -object_to_goal - 0.5 * "
             "tip_to_object - 0.1 * ctrl_cost.",
        environment="Brax pusher (7-DoF arm, object and goal on a table, actions in [-1, 1] "
                    "scaled to torques in [-2, 2]), {backend} physics, dt = {dt:.3g} s per step "
                    "(50 physics substeps: slow on CPU). No early termination; episodes are "
                    "truncated after {episode_length} steps."),
}
VALID_NAMES = tuple(f"brax/{k}" for k in _SPECS)


def _import_brax_envs():
  try:
    from brax import envs as brax_envs
  except ImportError as e:
    raise ImportError(
        "brax tasks need brax: `pip install brax` (or `pip install -e .`, which lists it)"
    ) from e
  return brax_envs


def parse_name(name: str) -> tuple[str, dict]:
  """"brax/ant?episode_length=200&backend=generalized" → ("ant", {"episode_length": 200, ...})."""
  base, _, query = name.partition("?")
  if not base.startswith("brax/") or base[len("brax/"):] not in _SPECS:
    raise ValueError(f"unknown brax task {name!r}; valid: {', '.join(VALID_NAMES)} (optionally "
                     "with ?episode_length=<int>&backend=<positional|generalized|spring|mjx>)")
  opts: dict = {}
  for part in filter(None, query.split("&")):
    key, eq, value = part.partition("=")
    if not eq or key not in ("episode_length", "backend"):
      raise ValueError(f"bad option {part!r} in {name!r}; allowed: episode_length=, backend=")
    opts[key] = int(value) if key == "episode_length" else value
  return base[len("brax/"):], opts


def make_task(name: str) -> ControlTask:
  """The `ControlTask` of a brax environment (see the module docstring for `name`)."""
  short, opts = parse_name(name)
  spec = _SPECS[short]
  episode_length = opts.get("episode_length", DEFAULT_EPISODE_LENGTH)
  backend = opts.get("backend", DEFAULT_BACKEND)
  env = _import_brax_envs().get_environment(spec.brax_name, backend=backend)
  adapter = GymnaxBrax(env, episode_length, spec.extras_fn)
  docs = spec.docs(env)
  shapes = spec.shapes(env)
  feature_spec = {k: tuple(shapes.get(k, ())) for k in docs}
  features = functools.partial(_features, alive=spec.alive)
  return ControlTask(
      name=name, env=adapter, env_params=adapter.default_params, discrete=False,
      action_dim=env.action_size, action_scale=1.0, feature_spec=feature_spec,
      feature_docs=docs, features=features, task=spec.task,
      environment=spec.environment.format(backend=backend, dt=float(env.dt),
                                          episode_length=episode_length))

