"""sampling/flow_sde.py: Flow-GRPO's SDE step, log-prob, KL and trajectory sampler (golden values
from scipy, numpy hand formulas, a Fokker–Planck identity and Monte Carlo)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from jaxrl_post.sampling import flow_sde


def test_logp_matches_scipy_per_element_then_reduced():
  rng = np.random.default_rng(0)
  x_next = rng.normal(size=(3, 2, 5)).astype(np.float32)
  mean = rng.normal(size=(3, 2, 5)).astype(np.float32)
  std = np.array([[0.3], [1.7]], np.float32)  # a per-block std (e.g. two noise levels)
  ref = stats.norm.logpdf(x_next, mean, np.broadcast_to(std, x_next.shape))
  for reduction, want in (("mean", ref.mean(axis=(1, 2))), ("sum", ref.sum(axis=(1, 2))),
                          ("none", ref)):
    got = jax.jit(flow_sde.gaussian_logp, static_argnames="reduction")(
      x_next, mean, std, reduction=reduction)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=reduction)


def test_sde_step_mean_std_and_logp_by_hand():
  # t = 0.6 → t_next = 0.4, a = 0.7: σ² = 0.49·0.6/0.4 = 0.735, Δt = −0.2.
  x, v = np.array([[0.5, -1.0]], np.float32), np.array([[2.0, 0.25]], np.float32)
  xi = np.array([[0.3, -1.2]], np.float32)
  t, tn, a, dt = 0.6, 0.4, 0.7, -0.2
  sig2 = a * a * t / (1 - t)
  mean = x * (1 + sig2 * dt / (2 * t)) + v * (1 + sig2 * (1 - t) / (2 * t)) * dt
  std = np.sqrt(sig2 * 0.2)
  out = flow_sde.sde_step_with_logprob(jnp.asarray(v), t, tn, jnp.asarray(x), a, None,
                                       noise=jnp.asarray(xi))
  np.testing.assert_allclose(out.mean, mean, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(out.std, std, rtol=1e-6)
  np.testing.assert_allclose(out.x_next, mean + std * xi, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(out.logp, stats.norm.logpdf(mean + std * xi, mean, std).mean(1),
                             rtol=1e-5)
  # Scoring the stored sample gives the same log-prob, and the gradient reaches v only via μ.
  again = flow_sde.sde_step_with_logprob(jnp.asarray(v), t, tn, jnp.asarray(x), a, None,
                                         x_next=out.x_next)
  np.testing.assert_allclose(again.logp, out.logp, rtol=1e-6)
  grad = jax.grad(lambda v: flow_sde.sde_step_with_logprob(
    v, t, tn, jnp.asarray(x), a, None, x_next=out.x_next).logp.sum())(jnp.asarray(v))
  # ∂ℓ/∂v = (x_next − μ)/s² · ∂μ/∂v / D,  ∂μ/∂v = (1 + σ²(1 − t)/(2t))·Δt.
  want = (std * xi) / std ** 2 * (1 + sig2 * (1 - t) / (2 * t)) * dt / 2
  np.testing.assert_allclose(grad, want, rtol=1e-5)


def test_sigma_at_t_one_uses_the_first_grid_step():
  grid = flow_sde.time_grid(10)
  np.testing.assert_allclose(flow_sde.sigma_t(1.0, 0.7, t_cap=grid[1]),
                             0.7 * np.sqrt(1.0 / (1.0 - 0.9)), rtol=1e-6)
  out = flow_sde.sde_step_with_logprob(jnp.ones((2, 3)), 1.0, grid[1], jnp.ones((2, 3)), 0.7,
                                       jax.random.key(0))
  assert np.all(np.isfinite(out.logp)) and np.all(np.isfinite(out.x_next))
  np.testing.assert_allclose(out.std, 0.7 * np.sqrt(1.0 / 0.1) * np.sqrt(0.1), rtol=1e-5)


def test_kl_closed_form_matches_monte_carlo():
  rng = np.random.default_rng(1)
  mean = rng.normal(size=(1, 4)).astype(np.float32)
  ref = mean + rng.normal(scale=0.3, size=(1, 4)).astype(np.float32)
  std = jnp.asarray(0.5)
  kl = float(flow_sde.step_kl(jnp.asarray(mean), jnp.asarray(ref), std, reduction="sum")[0])
  np.testing.assert_allclose(kl, np.sum((mean - ref) ** 2) / (2 * 0.25), rtol=1e-6)
  x = mean + 0.5 * rng.normal(size=(200_000, 4)).astype(np.float32)
  diff = (flow_sde.gaussian_logp(x, jnp.asarray(mean), std, reduction="sum")
          - flow_sde.gaussian_logp(x, jnp.asarray(ref), std, reduction="sum"))
  se = float(np.std(diff)) / np.sqrt(len(x))
  assert abs(float(np.mean(diff)) - kl) < 4 * se, (float(np.mean(diff)), kl, se)
  # "mean" reduction is the sum over the 4 dims / 4, as for the log-prob.
  np.testing.assert_allclose(
    flow_sde.step_kl(jnp.asarray(mean), jnp.asarray(ref), std)[0], kl / 4, rtol=1e-6)


# Gaussian data x_0 ~ N(m, s0²): x_t ~ N((1 − t)m, (1 − t)²s0² + t²), and the exact velocity
# E[ε − x_0 | x_t = x] = k(t)(x − μ_t) − m with k = (t − (1 − t)s0²)/V_t.
M0, S0 = 1.0, 0.5


def _marginal(t):
  return (1 - t) * M0, (1 - t) ** 2 * S0 ** 2 + t ** 2


def _v_exact(x, t):
  t = t.reshape(t.shape + (1,) * (x.ndim - 1))
  mu, var = _marginal(t)
  return (t - (1 - t) * S0 ** 2) / var * (x - mu) - M0


def test_sde_drift_preserves_the_gaussian_marginals_fokker_planck():
  # Linear drift f = αx + b and diffusion σ² give dμ/dt = αμ + b and dV/dt = 2αV − σ² for the
  # reverse-time SDE (|Δt| = −Δt); both must equal the true marginals' derivatives.
  h = 1e-3
  for t in (0.9, 0.6, 0.3, 0.1):
    x = jnp.array([[0.0], [1.0]], jnp.float32)
    v = _v_exact(x, jnp.full((2,), t))
    mean, std = flow_sde.sde_mean_std(v, t, t - h, x, 0.7, t_cap=0.99)
    f = (np.asarray(mean, np.float64) - np.asarray(x)) / -h
    alpha, b = f[1, 0] - f[0, 0], f[0, 0]
    sig2 = float(std) ** 2 / h
    mu, var = _marginal(t)
    np.testing.assert_allclose(alpha * mu + b, -M0, rtol=2e-3, atol=2e-3)
    np.testing.assert_allclose(2 * alpha * var - sig2, -2 * (1 - t) * S0 ** 2 + 2 * t,
                               rtol=2e-3, atol=2e-3)


def test_sde_samples_follow_the_true_marginals():
  # 20k samples, T = 100: means within 4 MC standard errors (+ a small Euler bias); variances
  # within var_tol. The tolerance grows with a: at t = 1 the reference code's σ uses 1 − t_1,
  # so σ²|Δt| = a² on the first step whatever T is; that O(a²) first-step error (a few % of
  # the variance at a = 0.7) is the reference sampler's, not Monte Carlo noise.
  n, num_steps = 20_000, 100
  grid = flow_sde.time_grid(num_steps)
  key = jax.random.key(0)
  sample = jax.jit(lambda k, a: flow_sde.sample_trajectory(  # a traced: one compile
    _v_exact, jax.random.normal(k, (n, 1)), grid, a, key=jax.random.fold_in(k, 1)))
  for a, var_tol in ((0.0, 0.03), (0.3, 0.03), (0.7, 0.07)):
    _check_marginals(sample(key, a), grid, n, a, var_tol)


def _check_marginals(traj, grid, n, a, var_tol):
  assert traj.x.shape == (len(grid), n, 1) and traj.logp.shape == (len(grid) - 1, n)
  for idx in (25, 50, 75, 100):
    t = float(grid[idx])
    mu, var = _marginal(t)
    x = np.asarray(traj.x[idx, :, 0], np.float64)
    assert abs(x.mean() - mu) < 4 * np.sqrt(var / n) + 0.005, (a, t, x.mean(), mu)
    assert abs(x.var() / var - 1) < var_tol, (a, t, x.var(), var)
  if a == 0.0:
    np.testing.assert_array_equal(traj.logp, np.full_like(traj.logp, traj.logp[0, 0]))


def test_ode_step_and_mixed_sde_mask_and_latent_shapes():
  x = jnp.ones((2, 3, 4))
  v = jnp.full((2, 3, 4), 2.0)
  np.testing.assert_allclose(flow_sde.ode_step(v, 0.5, 0.25, x), 0.5)
  grid = flow_sde.time_grid(4)
  noise = jax.random.normal(jax.random.key(0), (4, 2, 3, 4))
  traj = flow_sde.sample_trajectory(lambda x, t: -x, x, grid, 0.7, noise=noise,
                                    sde=jnp.array([True, False, True, False]))
  assert traj.x.shape == (5, 2, 3, 4) and traj.logp.shape == (4, 2)
  np.testing.assert_array_equal(traj.logp[1], 0.0)
  np.testing.assert_allclose(traj.x[2], flow_sde.ode_step(-traj.x[1], 0.75, 0.5, traj.x[1]),
                             rtol=1e-6)


def test_periodic_wrap_uses_the_minimum_image():
  wrap = flow_sde.periodic_wrap(jnp.array([1.0, 0.0]))  # first coordinate periodic
  mean = jnp.array([[0.98, 0.5]])
  x_next = jnp.array([[0.01, 0.52]])  # 0.03 across the boundary
  got = flow_sde.gaussian_logp(x_next, mean, jnp.asarray(0.05), reduction="none", wrap=wrap)
  np.testing.assert_allclose(got[0], stats.norm.logpdf([0.03, 0.02], 0.0, 0.05), rtol=1e-4)
  out = flow_sde.sde_step_with_logprob(jnp.zeros((1, 2)), 0.5, 0.4, mean, 0.7, None,
                                       noise=jnp.array([[1.0, 0.0]]), wrap=wrap)
  assert 0.0 <= float(out.x_next[0, 0]) < 1.0


def test_bad_inputs_raise_naming_the_argument():
  x = jnp.zeros((1, 2))
  with pytest.raises(ValueError, match=r"t=1.5 must lie in \[0, 1\]"):
    flow_sde.sde_step_with_logprob(x, 1.5, 0.5, x, 0.7, jax.random.key(0))
  with pytest.raises(ValueError, match="t_next=0.5 must be < t=0.5"):
    flow_sde.sde_step_with_logprob(x, 0.5, 0.5, x, 0.7, jax.random.key(0))
  with pytest.raises(ValueError, match="t_next"):
    flow_sde.ode_step(x, 0.2, 0.4, x)
  with pytest.raises(ValueError, match="must be < t"):
    flow_sde.sample_trajectory(lambda x, t: x, x, np.array([0.0, 0.5, 1.0]), 0.7,
                               key=jax.random.key(0))
  with pytest.raises(ValueError, match="reduction='max'"):
    flow_sde.reduce_latent(x, "max")
  with pytest.raises(ValueError, match="num_steps=0"):
    flow_sde.time_grid(0)
  with pytest.raises(ValueError, match="noise of shape"):
    flow_sde.sample_trajectory(lambda x, t: x, x, flow_sde.time_grid(2), 0.7,
                               noise=jnp.zeros((3, 1, 2)))
