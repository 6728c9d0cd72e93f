"""Brax tasks behind the gymnax interface: features, auto-reset, fitness, PPO, proposer modules.

Each brax rollout is one XLA compile (~20 s on 2 busy CPU cores), so the fast tests use only
the reacher; the locomotion envs are checked by the same rollout under `slow`.
"""

import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_post.rewards import module_code
from jaxrl_post.rewards import module_pool as mp
from jaxrl_post.rewards.proposers import OfflineProposer, OfflineProposerConfig
from jaxrl_post.rl_control import brax_envs, envs, ppo

ROOT = Path(__file__).resolve().parents[2]
B = 2


def _rollout(task, steps: int, seed: int = 0):
  """Adapter rollout next to brax's own `env.step` from the same reset with the same actions.

  Returns numpy trees: the adapter's per-step `(obs, reward, terminated, truncated,
  final_obs, features)` `[T, B, ...]`, brax's `(obs, reward, done)` `[T, B, ...]` (no reset:
  only its first episode is comparable) and the reset observation `[T, B, O]` that `step`'s
  key draws (what the adapter must return after an episode ends).
  """
  env, brax_env = task.env, task.env.env

  def run(key):
    k_reset, k_act, k_step = jax.random.split(key, 3)
    obs, state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(k_reset, B), None)
    actions = jax.random.uniform(k_act, (steps, B, task.action_dim), minval=-1.0, maxval=1.0)
    keys = jax.random.split(k_step, steps * B).reshape(steps, B, -1)

    def step(carry, x):
      obs, state, raw = carry
      a, k = x
      nobs, state, r, term, trunc, info = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
          k, state, a, None)
      feats = task.features(obs, a, info["final_observation"], term)
      raw = jax.vmap(brax_env.step)(raw, a)
      reset_obs = jax.vmap(brax_env.reset)(k).obs
      return (nobs, state, raw), ((nobs, r, term, trunc, info["final_observation"].obs, feats),
                                  (raw.obs, raw.reward, raw.done), reset_obs)

    return jax.lax.scan(step, (obs, state, state.brax), (actions, keys))[1]

  key = jax.random.PRNGKey(seed)
  compiled = jax.jit(run).lower(key).compile(compiler_options=ppo.FAST_COMPILE)
  return jax.tree.map(np.asarray, compiled(key))


def _check_rollout(task, episode_length: int, steps: int):
  (obs, r, term, trunc, final_obs, feats), (raw_obs, raw_r, raw_done), reset_obs = _rollout(
      task, steps)
  # Features: the documented names and shapes, finite.
  assert set(feats) == set(task.feature_spec) == set(task.feature_docs)
  for k, shape in task.feature_spec.items():
    assert feats[k].shape == (steps, B) + tuple(shape), k
    assert np.all(np.isfinite(feats[k])), k
  done = term | trunc
  assert not np.any(term & trunc)
  for b in range(B):
    end = int(np.argmax(done[:, b]))  # First episode: steps 0..end.
    assert done[end, b], "no episode ended within the rollout"
    assert end + 1 == episode_length or term[end, b]
    # Fitness = brax's own reward summed over the episode, as PPO sums it.
    np.testing.assert_allclose(r[:end + 1, b].sum(), raw_r[:end + 1, b].sum(), rtol=1e-5)
    np.testing.assert_array_equal(term[:end + 1, b], raw_done[:end + 1, b] > 0.5)
    # Auto-reset: features see the terminal observation, PPO gets the fresh reset one.
    np.testing.assert_allclose(final_obs[end, b], raw_obs[end, b], rtol=1e-6)
    np.testing.assert_allclose(obs[end, b], reset_obs[end, b], rtol=1e-6)
    assert not np.allclose(obs[end, b], raw_obs[end, b])
    if "alive" in feats:
      assert feats["alive"][end, b] == (0.0 if term[end, b] else 1.0)
  return feats, term


def test_reacher_features_autoreset_and_fitness():
  task = envs.make_task("brax/reacher?episode_length=5")
  assert not task.discrete and task.action_scale == 1.0 and task.action_dim == 2
  feats, term = _check_rollout(task, episode_length=5, steps=7)
  assert not term.any()  # The reacher never terminates: truncated at 5 steps.
  np.testing.assert_allclose(feats["distance"], np.linalg.norm(feats["tip_to_target"], axis=-1),
                             atol=1e-3)  # The targets and the tip lie in one plane.
  assert np.all(feats["ctrl_cost"] <= task.action_dim)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["hopper", "halfcheetah", "ant", "pusher"])
def test_brax_env_features_autoreset_and_fitness(name):
  # Random actions make the hopper fall within ~20-60 steps (termination, alive = 0); the
  # others are truncated at 10 steps.
  length = 100 if name == "hopper" else 10
  task = envs.make_task(f"brax/{name}?episode_length={length}")
  feats, term = _check_rollout(task, episode_length=length, steps=length + 2)
  if name == "hopper":
    assert term.any()


def test_unknown_task_lists_valid_names():
  with pytest.raises(ValueError, match="brax/hopper.*brax/reacher"):
    envs.make_task("brax/nonexistent")
  with pytest.raises(ValueError, match="CartPole-v1.*brax/ant"):
    envs.make_task("Acrobot-v1")
  with pytest.raises(ValueError, match="episode_length"):
    envs.make_task("brax/ant?horizon=3")


def test_missing_brax_names_the_install_command(monkeypatch):
  monkeypatch.setitem(sys.modules, "brax", None)  # `import brax` now raises ImportError.
  with pytest.raises(ImportError, match="pip install brax"):
    envs.make_task("brax/reacher")


def test_gymnax_tasks_do_not_import_brax():
  code = ("import sys; from jaxrl_post.rl_control import envs, ppo, adapter; "
          "envs.make_task('CartPole-v1'); assert 'brax' not in sys.modules, 'brax imported'")
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, XLA_FLAGS=""), timeout=120, cwd=ROOT)
  assert result.returncode == 0, result.stderr[-2000:]


@pytest.mark.parametrize("name", brax_envs.VALID_NAMES)
def test_offline_proposer_modules_run_on_brax_features(name):
  info = envs.make_task(name).task_info()
  rng = np.random.default_rng(0)
  feats = {k: jnp.asarray(rng.normal(size=(3,) + tuple(s)), jnp.float32)
           for k, s in info.feature_spec.items()}
  prop = OfflineProposer(OfflineProposerConfig(seed=1, min_modules=8, max_modules=8))
  for it in range(3):
    plan = prop.init_pool(info, "", iteration=it + 1, variant=0, num_variants=1)
    mods = [mp.ModuleSpec(name=o.name, description=o.description, code=o.code) for o in plan.ops]
    for m in mods:
      module_code.validate_module_code(m.code, info.feature_spec.keys())
    out = mp.build_reward_fn(mods, info.feature_spec)(feats, jnp.ones(len(mods)) / len(mods))
    assert out.reward.shape == (3,) and np.all(np.isfinite(out.reward))


def test_ppo_on_reacher_with_shaped_reward():
  task = envs.make_task("brax/reacher?episode_length=8")
  near = mp.ModuleSpec(name="near", description="", code='def near(f):\n  return -f["distance"]\n')
  calm = mp.ModuleSpec(name="calm", description="",
                       code='def calm(f):\n  return -jnp.sum(jnp.square(f["tip_velocity"]), '
                            'axis=-1)\n')
  cfg = ppo.PPOConfig(num_envs=4, num_steps=16, total_timesteps=128, update_epochs=1,
                      num_minibatches=1)
  m = ppo.train_seeds(cfg, task, [0], reward_fn=mp.build_reward_fn([near, calm], task.feature_spec),
                      weights=np.array([1.0, 0.1], np.float32), fast_compile=True)
  fit = m["fitness"][0]
  assert fit.shape == (2,) and np.all(np.isfinite(fit))
  # 8-step episodes of -(distance + sum a^2): the arm is ~0.2 m long, |a|^2 <= 2.
  assert np.all((fit < 0) & (fit > -8 * 2.5))
  assert np.all(m["episodes"][0] == 4 * 16 // 8)
  assert m["module_terms"].shape == (1, 2, 2) and np.all(m["module_terms"][0, :, 0] < 0)
