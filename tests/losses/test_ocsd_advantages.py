"""OCSD (arXiv 2608.04788): calibration, step selection and the modulated advantage against a
numpy reference written from the paper's equations; jit; sharded == single device."""

import doctest
import math

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxrl_post import losses
from jaxrl_post.losses import ocsd


def test_doctests():
  assert doctest.testmod(ocsd, raise_on_error=True).attempted >= 5


def _trajectories(seed=0, batch=8, time=24, max_steps=6):
  """Rows laid out as action | observation | action | ...; step ids −1 on observations/padding."""
  rng = np.random.default_rng(seed)
  step_ids = np.full((batch, time), -1, np.int32)
  for b in range(batch):
    t, k = 0, 0
    steps = rng.integers(1, max_steps + 1)
    while k < steps and t < time:
      action = rng.integers(1, 4)
      step_ids[b, t:t + action] = k
      t += action + rng.integers(0, 3)  # an observation span (maybe empty)
      k += 1
    if b == 0:
      step_ids[b] = -1  # a row with no action tokens at all
  old = np.log(rng.uniform(0.02, 0.99, size=(batch, time))).astype(np.float32)
  full = np.log(rng.uniform(0.02, 0.99, size=(batch, time))).astype(np.float32)
  abl = np.log(rng.uniform(0.02, 0.99, size=(batch, time))).astype(np.float32)
  seq_adv = rng.normal(size=batch).astype(np.float32)
  seq_adv[1] = 0.0
  return seq_adv, full, abl, old, step_ids


def _reference(seq_adv, full, abl, old, step_ids, *, rho, beta):
  """The paper's equations, one trajectory and one step at a time (float64)."""
  out = np.zeros(full.shape)
  for b in range(full.shape[0]):
    steps = sorted(set(step_ids[b][step_ids[b] >= 0].tolist()))
    if not steps:
      continue
    u = {k: -np.mean(old[b][step_ids[b] == k].astype(np.float64)) for k in steps}
    keep = max(1, math.floor(rho * len(steps) + 0.5)) if rho > 0 else 0
    chosen = sorted(steps, key=lambda k: (-u[k], k))[:keep]
    a = float(seq_adv[b])
    for t in np.flatnonzero(step_ids[b] >= 0):
      q = np.tanh((float(full[b, t]) - float(abl[b, t])) / 2.0)
      out[b, t] = a * (1 + beta * np.sign(a) * q) if step_ids[b, t] in chosen else a
  return out


@pytest.mark.parametrize("rho,beta", [(0.2, 0.5), (0.5, 1.0), (1.0, 0.25), (0.0, 0.5)])
def test_matches_reference(rho, beta):
  args = _trajectories()
  got = losses.ocsd_advantages(*args, num_steps=8, rho=rho, beta=beta)
  np.testing.assert_allclose(got, _reference(*args, rho=rho, beta=beta), rtol=1e-5, atol=1e-6)


def test_sign_preserved_and_bounded():
  seq_adv, full, abl, old, step_ids = _trajectories(seed=3)
  adv = np.asarray(losses.ocsd_advantages(seq_adv, full, abl, old, step_ids, num_steps=8,
                                          rho=1.0, beta=0.5))
  on = step_ids >= 0
  a = np.broadcast_to(seq_adv[:, None], adv.shape)
  assert np.all(np.sign(adv[on]) == np.sign(a[on]))
  ratio = adv[on & (a != 0)] / a[on & (a != 0)]
  assert ratio.min() >= 0.5 - 1e-6 and ratio.max() <= 1.5 + 1e-6
  assert np.all(adv[~on] == 0)


def test_uncertainty_and_selection_by_hand():
  # Row: steps 0 (2 tokens), 1 (1 token), 2 (3 tokens); NLLs chosen so step 2 is most uncertain.
  old = np.log(np.array([[0.5, 0.5, 0.9, 0.1, 0.1, 0.1, 1.0]], np.float32))
  ids = np.array([[0, 0, 1, 2, 2, 2, -1]])
  stats = losses.step_uncertainty(old, ids, num_steps=4)
  np.testing.assert_allclose(stats.uncertainty[0, :3], [math.log(2), -math.log(0.9),
                                                        -math.log(0.1)], rtol=1e-6)
  assert stats.tokens[0].tolist() == [2, 1, 3, 0]
  assert np.asarray(losses.select_uncertain_steps(stats, rho=0.2))[0].tolist() == [
    False, False, True, False]  # 3 steps: round(0.6) = 1 step
  assert np.asarray(losses.select_uncertain_steps(stats, rho=0.5))[0].tolist() == [
    True, False, True, False]  # round(1.5) = 2 steps: the two most uncertain


def test_rho_zero_is_grpo():
  seq_adv, full, abl, old, step_ids = _trajectories(seed=2)
  adv = losses.ocsd_advantages(seq_adv, full, abl, old, step_ids, num_steps=8, rho=0.0)
  np.testing.assert_array_equal(adv, np.where(step_ids >= 0, seq_adv[:, None], 0.0))


def test_mask_excludes_tokens():
  seq_adv, full, abl, old, step_ids = _trajectories(seed=5)
  mask = np.random.default_rng(0).random(step_ids.shape) < 0.7
  got = losses.ocsd_advantages(seq_adv, full, abl, old, step_ids, mask, num_steps=8)
  masked_ids = np.where(mask, step_ids, -1)
  want = _reference(seq_adv, full, abl, old, masked_ids, rho=0.2, beta=0.5)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_jit_and_sharded_equal_single_device():
  args = _trajectories(batch=16)
  fn = jax.jit(lambda *a: losses.ocsd_advantages(*a, num_steps=8))
  single = fn(*[jax.device_put(a, jax.devices()[0]) for a in args])
  mesh = Mesh(np.array(jax.devices()), ("data",))
  sharded = fn(*[jax.device_put(a, NamedSharding(mesh, P("data"))) for a in args])
  np.testing.assert_allclose(single, sharded, rtol=0, atol=0)
  np.testing.assert_allclose(single, _reference(*args, rho=0.2, beta=0.5), rtol=1e-5,
                             atol=1e-6)


def test_bad_input():
  seq_adv, full, abl, old, step_ids = _trajectories()
  with pytest.raises(ValueError, match="beta"):
    losses.ocsd_advantages(seq_adv, full, abl, old, step_ids, num_steps=8, beta=1.5)
  with pytest.raises(ValueError, match="rho"):
    losses.ocsd_advantages(seq_adv, full, abl, old, step_ids, num_steps=8, rho=-0.1)
  with pytest.raises(ValueError, match="seq_adv"):
    losses.ocsd_advantages(seq_adv[:3], full, abl, old, step_ids, num_steps=8)
  with pytest.raises(ValueError, match="step_ids"):
    losses.ocsd_advantages(seq_adv, full, abl, old, step_ids[:, :3], num_steps=8)
  with pytest.raises(ValueError, match="ablated_logp"):
    losses.observation_calibration(full, abl[:, :3])
