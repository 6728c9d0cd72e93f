"""Running obs / reward normalisation: exact running statistics, a hand-computed reward scaling,
an unchanged PPO program with the switches off, and a raw fitness with them on."""

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_post.rl_control import envs, normalization, ppo


def test_running_stats_equal_numpy_over_all_samples():
  rng = np.random.default_rng(0)
  batches = [rng.normal(5.0, 3.0, size=(n, 3)).astype(np.float32) for n in (1, 7, 2, 16, 5)]
  rms = normalization.init((3,))
  update = jax.jit(normalization.update)
  for i, b in enumerate(batches):
    rms = update(rms, jnp.asarray(b))
    seen = np.concatenate(batches[:i + 1])
    assert float(rms.count) == len(seen)
    np.testing.assert_allclose(rms.mean, seen.mean(0), rtol=1e-5)
    np.testing.assert_allclose(rms.var, seen.var(0), rtol=1e-4)
  x = jnp.asarray([[5.0, 5.0, 1e6]])
  z = normalization.normalize(rms, x)
  np.testing.assert_allclose(z[0, :2], (5.0 - rms.mean[:2]) / np.sqrt(rms.var[:2] + 1e-8),
                             rtol=1e-5)
  assert float(z[0, 2]) == 10.0  # Clipped at +10.


def test_reward_scaling_matches_a_hand_computed_example():
  # Two envs, γ = 0.5; G_t = γ G_{t-1} (1 - d_{t-1}) + r_t, r'_t = r_t / sqrt(var(all G) + 1e-8).
  # Step 0: r = [1, 3], d = [0, 1]: G = [1, 3]; seen {1, 3}: mean 2, var 1 → r' = [1, 3].
  #   Env 1 ended its episode: its return restarts, carried G = [1, 0].
  # Step 1: r = [2, 2]: G = [0.5·1 + 2, 0 + 2] = [2.5, 2]; seen {1, 3, 2.5, 2}: mean 2.125,
  #   var = (1.125² + 0.875² + 0.375² + 0.125²) / 4 = 2.1875 / 4 = 0.546875
  #   → r' = 2 / sqrt(0.546875) = 2.70449 for both envs.
  state = normalization.reward_init(2)
  r0, state = normalization.reward_step(state, jnp.array([1.0, 3.0]), jnp.array([False, True]),
                                        gamma=0.5)
  np.testing.assert_allclose(r0, [1.0, 3.0], rtol=1e-6)
  np.testing.assert_allclose(state.ret, [1.0, 0.0])
  r1, state = normalization.reward_step(state, jnp.array([2.0, 2.0]), jnp.array([0.0, 0.0]),
                                        gamma=0.5)
  np.testing.assert_allclose(state.rms.mean, 2.125, rtol=1e-6)
  np.testing.assert_allclose(state.rms.var, 0.546875, rtol=1e-6)
  np.testing.assert_allclose(r1, [2 / np.sqrt(0.546875)] * 2, rtol=1e-6)
  np.testing.assert_allclose(state.ret, [2.5, 2.0])
  # Clipping at ±10: one env of 400 gets -1e4, the others 0. The statistics include it, so
  # σ_G = 1e4 sqrt(p (1 - p)) with p = 1/400, ≈ 499 and -1e4 / σ_G ≈ -20 → -10.
  r = jnp.zeros((400,)).at[0].set(-1e4)
  r2, _ = normalization.reward_step(normalization.reward_init(400), r, jnp.zeros((400,)),
                                    gamma=0.5)
  assert float(r2[0]) == -10.0 and float(r2[1]) == 0.0


def _lowered_text(cfg, task):
  rng = jax.random.PRNGKey(0)
  return jax.jit(ppo.make_train(cfg, task)).lower(rng).as_text()


def test_switches_off_give_the_unchanged_program():
  # Identical lowered programs ⇒ bit-identical outputs, without paying for the compiles.
  for name in ("CartPole-v1", "Pendulum-v1"):
    task = envs.make_task(name)
    sizes = dict(num_envs=4, num_steps=16, total_timesteps=128, update_epochs=1,
                 num_minibatches=2)
    omitted = _lowered_text(ppo.PPOConfig(**sizes), task)
    off = _lowered_text(ppo.PPOConfig(**sizes, normalize_obs=False, normalize_reward=False),
                        task)
    assert omitted == off, name
    on = _lowered_text(ppo.PPOConfig(**sizes, normalize_obs=True, normalize_reward=True), task)
    assert on != off, name


def test_normalised_pendulum_is_finite_and_its_fitness_stays_raw():
  task = envs.make_task("Pendulum-v1")
  base = dict(num_envs=4, num_steps=64, total_timesteps=2048, update_epochs=1,
              num_minibatches=1)
  off = ppo.train_seeds(ppo.PPOConfig(**base), task, [0], fast_compile=True)
  on = ppo.train_seeds(ppo.PPOConfig(**base, normalize_obs=True, normalize_reward=True), task,
                       [0], fast_compile=True)
  for m in (off, on):
    assert all(np.all(np.isfinite(v)) for v in m.values())
    # The raw Pendulum return of 200 steps: in [-1700, 0] (-16.3 per step at worst).
    assert np.all((m["fitness"] < 0) & (m["fitness"] > -1700))
  # Same scale with and without normalisation: a near-random policy scores ~-1200 either way.
  ratio = on["fitness"].mean() / off["fitness"].mean()
  assert 0.5 < ratio < 2.0, (on["fitness"], off["fitness"])
  # The learning reward (and so the value targets) is rescaled: returns of O(100) vs O(1).
  assert on["value_loss"].mean() < off["value_loss"].mean() / 10, (
      on["value_loss"], off["value_loss"])


def test_make_train_returns_the_obs_statistics():
  cfg = ppo.PPOConfig(num_envs=2, num_steps=8, total_timesteps=32, update_epochs=1,
                      num_minibatches=1, normalize_obs=True)
  out = jax.jit(ppo.make_train(cfg, envs.make_task("CartPole-v1")))(jax.random.PRNGKey(0))
  rms = out["obs_norm"]
  assert rms.mean.shape == (4,) and float(rms.count) == 2 + 32  # Resets + every step.
  assert np.all(np.isfinite(rms.var)) and np.all(np.asarray(rms.var) > 0)
