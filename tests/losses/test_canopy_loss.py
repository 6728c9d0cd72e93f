"""CANOPY's loss (arXiv 2609.01245): numpy golden, quarantine, gradient, errors, sharding."""

import doctest
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxrl_post.losses import canopy
from jaxrl_post.losses.canopy import (
  GROUP_LOSSES,
  canopy_advantages,
  canopy_loss,
  group_coverage,
)


def test_doctests():
  assert doctest.testmod(canopy, raise_on_error=True).attempted >= 5


def test_registry():
  assert GROUP_LOSSES.get("canopy") is canopy_loss
  with pytest.raises(KeyError, match="canopy"):
    GROUP_LOSSES.get("grpo")


def _batch(seed=0, b=8, g=4, t=6):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(1, t + 1, size=(b, g))
  pad = np.arange(t) >= lengths[..., None]
  action = ((rng.random((b, g, t)) < 0.7) & ~pad).astype(np.float32)  # observation tokens: 0
  logp = np.log(rng.uniform(0.05, 0.95, size=(b, g, t))).astype(np.float32)
  base = (logp + 0.5 * rng.normal(size=logp.shape)).astype(np.float32)
  logp_padded = np.where(pad, -np.inf, logp).astype(np.float32)
  base = np.where(pad, np.nan, base).astype(np.float32)
  rewards = rng.integers(0, 2, size=(b, g)).astype(np.float32)
  rewards[1] = 1.0  # a group without signal
  valid = (rng.random((b, g)) < 0.8).astype(np.float32)
  valid[2] = [1, 0, 0, 0]  # a single survivor
  valid[3] = 0  # a whole group quarantined
  rewards[~(valid > 0)] = np.nan  # quarantined rows may have no reward at all
  return logp, logp_padded, base, rewards, action, valid


def _np_adv(rewards, valid, std=True, eps=1e-6):
  adv = np.zeros(rewards.shape)
  for b in range(rewards.shape[0]):
    rs = [float(rewards[b, i]) for i in range(rewards.shape[1]) if valid[b, i]]
    if not rs:
      continue
    mu = sum(rs) / len(rs)
    sd = math.sqrt(sum((r - mu) ** 2 for r in rs) / len(rs))
    for i in range(rewards.shape[1]):
      if valid[b, i]:
        adv[b, i] = (rewards[b, i] - mu) / (sd + eps) if std else rewards[b, i] - mu
  return adv


def _np_loss(logp, base, rewards, action, valid, beta, std=True):
  adv = _np_adv(rewards, valid, std)
  pg = kl = n = 0.0
  for b, i, t in np.ndindex(*logp.shape):
    if not (valid[b, i] and action[b, i, t]):
      continue
    n += 1
    pg -= adv[b, i] * float(logp[b, i, t])
    d = float(base[b, i, t]) - float(logp[b, i, t])
    kl += math.exp(d) - d - 1
  return (pg + beta * kl) / max(n, 1), pg / max(n, 1), kl / max(n, 1)


@pytest.mark.parametrize("std", [True, False])
def test_matches_numpy(std):
  logp, logp_padded, base, rewards, action, valid = _batch()
  loss, aux = jax.jit(lambda *a: canopy_loss(*a, beta=0.05, std=std))(
      logp_padded, base, rewards, action, valid)
  want, pg, kl = _np_loss(logp, base, rewards, action, valid, 0.05, std)
  np.testing.assert_allclose(float(loss), want, rtol=1e-5)
  np.testing.assert_allclose(float(aux.pg_loss), pg, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(float(aux.kl), kl, rtol=1e-5)
  assert float(aux.num_valid_rows) == valid.sum()
  assert float(aux.num_tokens) == (action * valid[..., None]).sum()
  np.testing.assert_allclose(canopy_advantages(rewards, valid, std=std),
                             _np_adv(rewards, valid, std), rtol=1e-5, atol=1e-6)


def test_coverage():
  logp, _, base, rewards, action, valid = _batch()
  mixed, alive = 0, 0
  for b in range(rewards.shape[0]):
    rs = rewards[b][valid[b] > 0]
    if len(rs):
      alive += 1
      mixed += int(rs.max() > rs.min())
  _, aux = canopy_loss(logp, base, rewards, action, valid, beta=0.0)
  assert 0 < mixed < alive < rewards.shape[0]
  np.testing.assert_allclose(float(aux.coverage), mixed / alive, rtol=1e-6)
  assert float(group_coverage(np.ones((2, 3)), np.zeros((2, 3)))) == 0.0


def test_quarantine_changes_group_mean():
  rewards = np.array([[1.0, 0.0, 0.0, 0.0]])
  all_in = canopy_advantages(rewards, np.ones((1, 4)), eps=0.0)
  # μ = 1/4, σ = √3/4: A = √3, −1/√3 ×3.
  np.testing.assert_allclose(all_in, [[math.sqrt(3)] + [-1 / math.sqrt(3)] * 3], rtol=1e-6)
  # The last two rollouts hit a serving fault: μ = 1/2, σ = 1/2 over the survivors.
  quarantined = canopy_advantages(rewards, np.array([[1, 1, 0, 0]]), eps=0.0)
  np.testing.assert_allclose(quarantined, [[1.0, -1.0, 0.0, 0.0]], rtol=1e-6)
  # Counting the faults as failures instead would be a different (wrong) group.
  assert not np.allclose(quarantined[0, :2], all_in[0, :2])
  # Quarantined rows also leave the loss: their tokens change nothing.
  logp, _, base, rewards, action, valid = _batch(1)
  loss, _ = canopy_loss(logp, base, rewards, action, valid, beta=0.1)
  logp2 = np.where(valid[..., None] > 0, logp, logp - 3.0)
  loss2, _ = canopy_loss(logp2, base, rewards, action, valid, beta=0.1)
  np.testing.assert_allclose(float(loss), float(loss2), rtol=1e-6)


def test_beta_zero_is_pure_pg_and_kl_uses_action_tokens():
  logp, logp_padded, base, rewards, action, valid = _batch(2)
  loss0, aux0 = canopy_loss(logp_padded, base, rewards, action, valid, beta=0.0)
  np.testing.assert_allclose(float(loss0), float(aux0.pg_loss), rtol=1e-7)
  assert float(aux0.kl) > 0
  loss1, aux1 = canopy_loss(logp_padded, base, rewards, action, valid, beta=1.0)
  np.testing.assert_allclose(float(loss1), float(aux0.pg_loss + aux0.kl), rtol=1e-6)
  # Changing the base model off the action tokens does not change the KL term.
  base2 = np.where(action > 0, base, base + 5.0)
  _, aux2 = canopy_loss(logp_padded, base2, rewards, action, valid, beta=1.0)
  np.testing.assert_allclose(float(aux2.kl), float(aux1.kl), rtol=1e-6)
  # k2 by name gives a different, still finite, term.
  _, aux_k2 = canopy_loss(logp_padded, base, rewards, action, valid, beta=1.0, kl="k2")
  assert np.isfinite(float(aux_k2.kl)) and float(aux_k2.kl) != float(aux1.kl)


def test_gradient():
  logp, _, base, rewards, action, valid = _batch(3)
  grad = jax.grad(lambda lp: canopy_loss(lp, base, rewards, action, valid, beta=0.0)[0])(logp)
  m = action * valid[..., None]
  adv = _np_adv(rewards, valid)
  want = -adv[..., None] * m / m.sum()  # −Σ m A ∇logp / Σ m
  np.testing.assert_allclose(grad, want, rtol=1e-5, atol=1e-7)
  # With β: d/dlogp of m·k3 = m·(1 − exp(base − logp)) / Σ m.
  beta = 0.3
  grad_b = jax.grad(lambda lp: canopy_loss(lp, base, rewards, action, valid, beta=beta)[0])(logp)
  d = np.where(m > 0, base.astype(np.float64) - logp, 0.0)  # base is NaN on padding
  want_b = want + beta * m * (1 - np.exp(d)) / m.sum()
  assert np.isfinite(np.asarray(grad_b)).all()
  np.testing.assert_allclose(grad_b, want_b, rtol=1e-4, atol=1e-6)


def test_micro_batches_add_up():
  logp, _, base, rewards, action, valid = _batch(4)
  full, _ = canopy_loss(logp, base, rewards, action, valid, beta=0.1)
  n = (action * valid[..., None]).sum()
  parts = [canopy_loss(logp[s], base[s], rewards[s], action[s], valid[s], beta=0.1,
                       num_tokens=n)[0] for s in (slice(0, 3), slice(3, 8))]
  np.testing.assert_allclose(float(sum(parts)), float(full), rtol=1e-5)


def test_bad_inputs_raise_naming_the_argument():
  logp, _, base, rewards, action, valid = _batch()
  with pytest.raises(ValueError, match="base_logp"):
    canopy_loss(logp, base[..., :3], rewards, action, valid, beta=0.1)
  with pytest.raises(ValueError, match="rewards"):
    canopy_loss(logp, base, rewards[:, :2], action, valid, beta=0.1)
  with pytest.raises(ValueError, match="group_valid"):
    canopy_loss(logp, base, rewards, action, valid[:4], beta=0.1)
  with pytest.raises(ValueError, match="logp"):
    canopy_loss(logp[0], base[0], rewards, action[0], valid, beta=0.1)
  with pytest.raises(ValueError, match="beta"):
    canopy_loss(logp, base, rewards, action, valid, beta=-1.0)
  with pytest.raises(ValueError, match="kl"):
    canopy_loss(logp, base, rewards, action, valid, beta=0.1, kl="k4")


def test_sharded_matches_single_device():
  assert jax.device_count() == 8, "tests/conftest.py should give 8 fake CPU devices"
  _, logp_padded, base, rewards, action, valid = _batch(5, b=16)
  mesh = Mesh(np.array(jax.devices()), ("data",))
  rows = NamedSharding(mesh, P("data"))

  @jax.jit
  def fn(*args):
    loss, aux = canopy_loss(*args, beta=0.1)
    return (loss,) + tuple(aux)

  args = (logp_padded, base, rewards, action, valid)
  single = fn(*[jax.device_put(a, jax.devices()[0]) for a in args])
  sharded = [jax.device_put(a, rows) for a in args]
  assert len(sharded[0].sharding.device_set) == 8
  got = fn(*sharded)
  for a, b in zip(got, single):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
  assert jnp.isfinite(single[0])
