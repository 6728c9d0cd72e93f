"""tasks/toy_crystals.py (CrystalGRPO's toy crystals, arXiv 2608.06582): Lennard-Jones energy
against a numpy loop, the polymorphs (distinct local minima), the matcher's invariances and
tolerances, the reward, the latent; the joint coordinate–lattice SDE on the torus (marginal at
small noise, wrapped log-prob against a direct computation, per-block noise levels)."""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_post.sampling import flow_sde
from jaxrl_post.tasks import toy_crystals as tc

TASK = tc.CrystalTask()  # A2B2, target polymorph 1
ENERGY = jax.jit(tc.lj_energy, static_argnums=2)


def _lj(r, s, e):
  return 4 * e * ((s / r) ** 12 - (s / r) ** 6)


def _numpy_energy(frac, lattice, species):
  a, b, g = lattice
  m = np.array([[a, 0.0], [b * math.cos(g), b * math.sin(g)]])
  n, total = len(species), 0.0
  for i, j in itertools.product(range(n), repeat=2):
    s, e = tc.SIGMA[species[i], species[j]], tc.EPSILON[species[i], species[j]]
    for k in itertools.product(range(-3, 4), repeat=2):
      if i == j and k == (0, 0):
        continue
      r = np.linalg.norm((frac[j] - frac[i] + np.array(k)) @ m)
      if r >= 2.5 * s:
        continue
      shift = _lj(2.5 * s, s, e)
      rs = 0.85 * s
      if r < rs:
        d = 4 * e * (-12 * (s / rs) ** 12 + 6 * (s / rs) ** 6) / rs
        total += _lj(rs, s, e) + d * (r - rs) - shift
      else:
        total += _lj(r, s, e) - shift
  return 0.5 * total / n


def test_energy_matches_numpy_loop_and_is_invariant():
  rng = np.random.default_rng(0)
  species = TASK.comp.species
  for _ in range(3):
    frac = rng.uniform(size=(4, 2)).astype(np.float32)
    lat = np.array([rng.uniform(1.3, 2.2), rng.uniform(1.3, 2.2), rng.uniform(1.1, 1.9)],
                   np.float32)
    want = _numpy_energy(frac.astype(np.float64), lat.astype(np.float64), species)
    got = float(ENERGY(jnp.asarray(frac), jnp.asarray(lat), species))
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)
    moved = np.mod(frac[[1, 0, 3, 2]] + [0.3, 0.7], 1.0)  # same-species swap + origin shift
    np.testing.assert_allclose(float(ENERGY(jnp.asarray(moved), jnp.asarray(lat), species)),
                               got, rtol=1e-4, atol=1e-4)


def test_polymorphs_are_distinct_local_minima():
  e = tc.polymorph_energies("A2B2")
  np.testing.assert_allclose(e, [-3.6377, -3.3837, -3.1565], atol=2e-3)
  assert np.all(np.diff(e) > 0.1)
  assert TASK.target != int(np.argmin(e))  # the default target is not the lowest-energy one
  frac, lat = tc.polymorph_arrays(TASK.comp)
  grad = jax.jit(jax.grad(tc.lj_energy, argnums=(0, 1)), static_argnums=2)
  for f, l in zip(frac, lat):
    g_f, g_l = grad(jnp.asarray(f), jnp.asarray(l), TASK.comp.species)
    assert float(jnp.linalg.norm(g_f)) < 0.1 and float(jnp.linalg.norm(g_l)) < 0.01
  s = tc.score(TASK, jnp.asarray(frac), jnp.asarray(lat))
  np.testing.assert_array_equal(s.matched, np.eye(3, dtype=bool))  # each only matches itself
  assert s.basin.tolist() == [0, 1, 2]
  np.testing.assert_allclose(np.diag(np.asarray(s.rms)), 0.0, atol=1e-5)


def test_matcher_invariances_and_tolerances():
  frac, lat = tc.polymorph_arrays(TASK.comp)
  f, l = frac[1], lat[1]
  perms = tc.species_permutations(TASK.comp.species)
  assert perms.tolist() == [[0, 1, 2, 3], [0, 1, 3, 2], [1, 0, 2, 3], [1, 0, 3, 2]]
  moved = np.mod(f[[1, 0, 3, 2]] + [0.41, -0.27], 1.0)  # permuted, shifted, wrapped
  rms_fn = jax.jit(lambda a, b, c: tc.site_rms(a, b, c, perms))
  assert float(rms_fn(jnp.asarray(moved), jnp.asarray(f), jnp.asarray(l))) < 1e-5
  # a displacement δ of one atom (of four), cartesian: rms = |δ|·sqrt(3/4)/2 / sqrt(V/N)
  # (the least-squares shift takes δ/4 off every atom)
  shifted = f.copy()
  shifted[2, 0] += 0.05
  rms = float(rms_fn(jnp.asarray(shifted), jnp.asarray(f), jnp.asarray(l)))
  want = 0.05 * l[0] * math.sqrt(3 / 16) / math.sqrt(l[0] * l[1] * math.sin(l[2]) / 4)
  np.testing.assert_allclose(rms, want, rtol=1e-4)
  ok = tc.lattice_close(jnp.asarray([l * [1.25, 0.8, 1.0], l * [1.35, 1.0, 1.0],
                                     l + [0.0, 0.0, math.radians(11.0)]]), jnp.asarray(l),
                        ltol=0.3, angle_tol=10.0)
  assert ok.tolist() == [True, False, False]


def test_reward_terms():
  frac, lat = tc.polymorph_arrays(TASK.comp)
  s = tc.score(TASK, jnp.asarray(frac), jnp.asarray(lat))
  e = tc.polymorph_energies("A2B2")
  np.testing.assert_allclose(s.r_match, [0.0, 1.0, 0.0], atol=1e-4)
  want_e = -np.clip((e - e[1]) / TASK.tau_energy, -1, 1)
  np.testing.assert_allclose(s.r_energy, want_e, atol=1e-5)
  np.testing.assert_allclose(s.reward, s.r_match + TASK.w_energy * want_e, atol=1e-5)
  energy_only = tc.CrystalTask(w_match=0.0, w_energy=1.0)
  assert int(np.argmax(tc.score(energy_only, jnp.asarray(frac), jnp.asarray(lat)).reward)) == 0
  with pytest.raises(ValueError, match="target=5 must be a polymorph index in"):
    tc.CrystalTask(target=5)
  with pytest.raises(KeyError, match="unknown toy_composition 'NaCl'"):
    tc.CrystalTask(composition="NaCl")
  with pytest.raises(ValueError, match="stol=0.0 must be > 0"):
    tc.CrystalTask(stol=0.0)


def test_latent_roundtrip_and_pretraining_samples():
  frac, lat = tc.polymorph_arrays(TASK.comp)
  x = tc.encode(TASK, jnp.asarray(frac), jnp.asarray(lat))
  assert x.shape == (3, TASK.dim) == (3, 11)
  f2, l2 = tc.decode(TASK, x)
  np.testing.assert_allclose(f2, frac, atol=1e-5)
  np.testing.assert_allclose(l2, lat, rtol=1e-5)
  x0, ids = tc.sample_polymorphs(TASK, jax.random.key(0), 512)
  assert float(jnp.min(x0[:, :8])) >= 0 and float(jnp.max(x0[:, :8])) < 1
  assert set(np.asarray(ids).tolist()) == {0, 1, 2}
  dev = np.array(x0 - x[ids])
  dev[:, :8] -= np.round(dev[:, :8])  # minimum image on the torus
  np.testing.assert_allclose(dev[:, :8].std(), TASK.jitter_frac, rtol=0.1)
  np.testing.assert_allclose(dev[:, 8:].std() * tc.LATTICE_SCALE, TASK.jitter_lattice, rtol=0.1)


# ---- The joint coordinate–lattice SDE on the torus --------------------------------------------


def test_wrapped_step_logprob_matches_direct_computation():
  """One SDE step with a_F on the torus block, a_L on the lattice block: the sample is wrapped
  into the cell, and the log-prob equals log Σ_k N(x' + k; μ, s²) (the wrapped Gaussian,
  computed directly over images) on F plus the plain Gaussian on the lattice block."""
  task = TASK
  rng = np.random.default_rng(1)
  x = jnp.asarray(np.concatenate([[0.995, 0.002] * 4, [0.3, -0.2, 0.1]])[None], jnp.float32)
  v = jnp.asarray(rng.normal(size=(1, task.dim)), jnp.float32)
  a = tc.noise_levels(task, 0.1, 0.5)
  out = flow_sde.sde_step_with_logprob(v, 0.5, 0.45, x, a, jax.random.key(3), t_cap=0.9,
                                       reduction="none", wrap=tc.crystal_wrap(task))
  xn, mu, std = map(np.asarray, (out.x_next, out.mean, jnp.broadcast_to(out.std, x.shape)))
  assert np.all((xn[0, :8] >= 0) & (xn[0, :8] < 1))
  sigma = lambda a_: a_ * math.sqrt(0.5 / 0.5) * math.sqrt(0.05)  # noqa: E731
  np.testing.assert_allclose(std[0, :8], sigma(0.1), rtol=1e-5)
  np.testing.assert_allclose(std[0, 8:], sigma(0.5), rtol=1e-5)
  direct = []
  for d in range(task.dim):
    images = range(-3, 4) if d < 8 else [0]
    dens = sum(math.exp(-(xn[0, d] + k - mu[0, d]) ** 2 / (2 * std[0, d] ** 2))
               for k in images) / (std[0, d] * math.sqrt(2 * math.pi))
    direct.append(math.log(dens))
  np.testing.assert_allclose(np.asarray(out.logp)[0], direct, atol=1e-4)
  summed = flow_sde.sde_step_with_logprob(v, 0.5, 0.45, x, a, None, x_next=out.x_next,
                                          t_cap=0.9, reduction="sum",
                                          wrap=tc.crystal_wrap(task))
  np.testing.assert_allclose(float(summed.logp[0]), sum(direct), rtol=1e-5)  # log π_F + log π_L


def _torus_velocity(c, s0):
  """E[ε − x_0 | x_t mod 1 = y] for x_0 ~ N(c, s0²), ε ~ N(0, 1) per coordinate: the Gaussian
  case's linear field averaged over the lifts y + k, weighted by the marginal density there."""
  ks = jnp.arange(-4.0, 5.0)

  def v(y, t):
    t = t[:, None, None]
    z = y[..., None] + ks
    mean = (1 - t) * c
    var = (1 - t) ** 2 * s0 ** 2 + t ** 2
    w = jax.nn.softmax(-(z - mean) ** 2 / (2 * var), axis=-1)
    vel = -c + (t - (1 - t) * s0 ** 2) / var * (z - mean)
    return jnp.sum(w * vel, -1)

  return v


def test_sde_marginal_on_the_torus_small_noise():
  """With a small noise level the SDE keeps the ODE's marginal on the torus: both end at the
  wrapped N(c, s0²) (circular mean c, first trigonometric moment exp(−2π²s0²))."""
  c, s0, n, steps = 0.9, 0.05, 4096, 60
  v = _torus_velocity(c, s0)
  wrap = flow_sde.periodic_wrap(1.0)
  x_init = jax.random.normal(jax.random.key(0), (n, 2))
  grid = flow_sde.time_grid(steps)
  want = math.exp(-2 * math.pi ** 2 * s0 ** 2)
  for a in (0.0, 0.05):
    traj = flow_sde.sample_trajectory(v, x_init, grid, a, key=jax.random.key(1), wrap=wrap,
                                      sde=a > 0)
    x = np.asarray(traj.x[-1])
    assert np.all((x >= 0) & (x < 1))
    z = np.exp(2j * np.pi * (x - c))
    np.testing.assert_allclose(np.abs(z.mean(0)), want, atol=0.02)
    np.testing.assert_allclose(np.angle(z.mean(0)), 0.0, atol=0.02)


def test_doctests():
  import doctest

  assert doctest.testmod(tc).failed == 0
