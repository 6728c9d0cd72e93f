"""PPO learns CartPole from the env reward; GAE matches a loop; Pendulum runs."""

import jax.numpy as jnp
import numpy as np

from jaxrl_post.rl_control import envs, ppo


def test_gae_matches_python_loop():
  rng = np.random.default_rng(0)
  t, b = 6, 3
  v, r = rng.normal(size=(t, b)), rng.normal(size=(t, b))
  d = (rng.random((t, b)) < 0.3).astype(np.float32)
  last = rng.normal(size=(b,))
  adv, ret = ppo.gae(jnp.asarray(v), jnp.asarray(r), jnp.asarray(d), jnp.asarray(last),
                     gamma=0.9, lam=0.8)
  want = np.zeros((t, b))
  a, nv = np.zeros(b), last
  for i in reversed(range(t)):
    delta = r[i] + 0.9 * nv * (1 - d[i]) - v[i]
    a = delta + 0.9 * 0.8 * (1 - d[i]) * a
    want[i], nv = a, v[i]
  np.testing.assert_allclose(adv, want, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(ret, want + v, rtol=1e-5, atol=1e-5)


def test_ppo_learns_cartpole():
  # 30 updates × 8 envs × 128 steps = 30,720 env steps, one seed, lr 1e-3: the true return
  # rises from ~25 (random policy) to ~250 (seed 0: 32 → 255 over the first / last 5 updates).
  cfg = ppo.PPOConfig(num_envs=8, num_steps=128, total_timesteps=30_720, lr=1e-3)
  m = ppo.train_seeds(cfg, envs.make_task("CartPole-v1"), [0], fast_compile=True)
  fit = m["fitness"][0]
  assert fit.shape == (30,)
  assert np.all(np.isfinite(fit))
  first, last = fit[:5].mean(), fit[-5:].mean()
  assert last > first + 100, (first, last)
  assert m["module_terms"].shape == (1, 30, 0)


def test_pendulum_runs_with_gaussian_policy():
  cfg = ppo.PPOConfig(num_envs=4, num_steps=64, total_timesteps=1024, update_epochs=1,
                      num_minibatches=1)
  m = ppo.train_seeds(cfg, envs.make_task("Pendulum-v1"), [0, 1], fast_compile=True)
  assert m["fitness"].shape == (2, 4)
  # 200-step episodes: the first completion is in update 4; earlier entries take its value.
  assert np.all(np.isfinite(m["fitness"])) and np.all(m["fitness"] < 0)
