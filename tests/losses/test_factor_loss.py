"""FACTOR's token allocation (HTA + APM) and action-mean loss (arXiv 2608.07118)."""

import doctest
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxrl_post.losses import factor
from jaxrl_post.losses.factor import (
  TOKEN_ALLOCATIONS,
  action_mean_multiplier,
  actions_to_tokens,
  factor_eta,
  factor_loss,
  factor_token_coef,
  tokens_to_actions,
  uniform_token_coef,
)


def test_doctests():
  assert doctest.testmod(factor, raise_on_error=True).attempted >= 10


def test_registry():
  assert TOKEN_ALLOCATIONS.get("factor_apm") is factor_token_coef
  assert TOKEN_ALLOCATIONS.get("uniform") is uniform_token_coef
  with pytest.raises(KeyError, match="factor_apm"):
    TOKEN_ALLOCATIONS.get("apm")


def _actions(seed=0, lead=(4,), s=5, width=6):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(0, width + 1, size=lead + (s,))
  lengths.flat[0] = width
  lengths.flat[1] = 1
  tok = (np.arange(width) < lengths[..., None]).astype(np.float32)
  a_star = rng.normal(size=lead + (s,)).astype(np.float32)
  delta = (4.0 * rng.normal(size=lead + (s, width))).astype(np.float32)  # some beyond d = 3
  delta = np.where(tok > 0, delta, np.nan).astype(np.float32)  # padding junk must be ignored
  act = (lengths > 0).astype(np.float32)
  return a_star, delta, tok, act


def _np_coef(a_star, delta, tok, eta, tau=1.0, d=3.0):
  out = np.zeros(tok.shape)
  for idx in np.ndindex(*a_star.shape):
    n = int(tok[idx].sum())
    if n == 0:
      continue
    s = [math.copysign(1.0, a_star[idx]) * min(max(float(delta[idx][j]), -d), d) / tau
         if a_star[idx] != 0 else 0.0 for j in range(n)]
    z = sum(math.exp(v) for v in s)
    for j in range(n):
      rho = (1 - eta) / n + eta * math.exp(s[j]) / z
      out[idx][j] = n * rho * a_star[idx]
  return out


@pytest.mark.parametrize("eta", [0.0, 0.3, 0.7, 1.0])
def test_coef_matches_numpy_preserves_mean_and_sign(eta):
  a_star, delta, tok, _ = _actions()
  c = np.asarray(jax.jit(lambda a, dl, m, e: factor_token_coef(a, dl, m, eta=e))(
      a_star, delta, tok, eta))
  np.testing.assert_allclose(c, _np_coef(a_star, delta, tok, eta), rtol=1e-5, atol=1e-6)
  n = tok.sum(-1)
  mean = c.sum(-1) / np.maximum(n, 1)
  np.testing.assert_allclose(mean[n > 0], a_star[n > 0], rtol=0, atol=1e-6)  # APM
  valid = tok > 0
  assert (np.sign(c)[valid] == np.broadcast_to(np.sign(a_star)[..., None], c.shape)[valid]).all()
  np.testing.assert_array_equal(c[~valid], 0.0)
  dev = np.asarray(action_mean_multiplier(c, tok, a_star))
  assert np.nanmax(np.abs(dev)) < 1e-5
  assert np.isnan(dev[n == 0]).all()


def test_eta_zero_is_uniform_and_eta_one_is_softmax():
  a_star, delta, tok, _ = _actions(1)
  c0 = factor_token_coef(a_star, delta, tok, eta=0.0)
  np.testing.assert_allclose(c0, uniform_token_coef(a_star, delta, tok), rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(c0, np.where(tok > 0, a_star[..., None], 0.0), rtol=1e-6)
  c1 = np.asarray(factor_token_coef(a_star, delta, tok, eta=1.0))
  n = int(tok[0, 0].sum())
  s = np.sign(a_star[0, 0]) * np.clip(delta[0, 0, :n], -3, 3)
  soft = np.exp(s) / np.exp(s).sum()
  np.testing.assert_allclose(c1[0, 0, :n], n * soft * a_star[0, 0], rtol=1e-5)


def test_golden_by_hand_and_clip_at_d():
  tok = np.ones((1, 2, 2))
  delta = np.array([[[math.log(3.0), 0.0], [math.log(3.0), 0.0]]])
  c = factor_token_coef(np.array([[1.0, -2.0]]), delta, tok, eta=0.5)
  # A* = 1: softmax (3/4, 1/4), ρ = 1/4 + ½(3/4, 1/4) = (5/8, 3/8), C = 2ρ.
  # A* = −2: scores flip, softmax (1/4, 3/4), ρ = (3/8, 5/8), C = 2ρ·(−2).
  np.testing.assert_allclose(c, [[[1.25, 0.75], [-1.5, -2.5]]], rtol=1e-6)
  # Gaps beyond ±d are clipped to ±d: Δ = 10 allocates exactly like Δ = d = 3.
  big = factor_token_coef(np.array([[1.0]]), np.array([[[10.0, -10.0]]]), np.ones((1, 1, 2)),
                          eta=1.0)
  at_d = factor_token_coef(np.array([[1.0]]), np.array([[[3.0, -3.0]]]), np.ones((1, 1, 2)),
                           eta=1.0)
  np.testing.assert_allclose(big, at_d, rtol=1e-6)
  e6 = math.exp(6.0)
  np.testing.assert_allclose(big[0, 0], [2 * e6 / (e6 + 1), 2 / (e6 + 1)], rtol=1e-5)
  wider = factor_token_coef(np.array([[1.0]]), np.array([[[10.0, -10.0]]]), np.ones((1, 1, 2)),
                            eta=1.0, d=5.0)
  assert float(wider[0, 0, 0]) > float(big[0, 0, 0])


def test_group_layout_and_gradient_is_stopped():
  a_star, delta, tok, _ = _actions(2, lead=(2, 3))  # [B, G, S, L]
  c = factor_token_coef(a_star, delta, tok, eta=0.7)
  assert c.shape == tok.shape
  flat = factor_token_coef(a_star.reshape(6, 5), delta.reshape(6, 5, 6), tok.reshape(6, 5, 6),
                           eta=0.7)
  np.testing.assert_allclose(np.asarray(c).reshape(6, 5, 6), flat, rtol=1e-6)
  g = jax.grad(lambda dl: factor_token_coef(a_star, dl, tok, eta=0.7).sum())(
      np.nan_to_num(delta))
  np.testing.assert_array_equal(g, 0.0)


def test_eta_schedule():
  assert float(factor_eta(0, total_steps=10)) == pytest.approx(0.7)
  assert float(factor_eta(5, total_steps=10)) == pytest.approx(0.5)
  assert float(factor_eta(10, total_steps=10)) == pytest.approx(0.3)
  assert float(factor_eta(50, total_steps=10)) == pytest.approx(0.3)
  assert float(factor_eta(2, total_steps=4, eta_start=1.0, eta_end=0.0)) == pytest.approx(0.5)
  # A traced η from the schedule feeds the coefficient under jit.
  a_star, delta, tok, _ = _actions(3)
  fn = jax.jit(lambda k: factor_token_coef(a_star, delta, tok, eta=factor_eta(k, total_steps=4)))
  np.testing.assert_allclose(fn(2), _np_coef(a_star, delta, tok, 0.5), rtol=1e-5, atol=1e-6)


def _np_loss(logp, old, c, tok, act, eps):
  # float64 throughout (a float32 C would make Python-float products float32 too).
  logp, old, c = (np.asarray(a, np.float64) for a in (logp, old, c))
  total, count = 0.0, 0
  for idx in np.ndindex(*act.shape):
    if act[idx] == 0:
      continue
    count += 1
    n = int(tok[idx].sum())
    acc = 0.0
    for j in range(tok.shape[-1]):
      if tok[idx][j] == 0:
        continue
      q = math.exp(logp[idx][j] - old[idx][j])
      acc += min(q * c[idx][j], min(max(q, 1 - eps), 1 + eps) * c[idx][j])
    total += acc / max(n, 1)
  return -total / max(count, 1)


def _loss_batch(seed=4, lead=(4,)):
  a_star, delta, tok, act = _actions(seed, lead=lead)
  rng = np.random.default_rng(seed + 100)
  c = np.asarray(factor_token_coef(a_star, delta, tok, eta=0.7))
  old = np.log(rng.uniform(0.05, 0.95, size=tok.shape))
  logp = old + 0.4 * rng.normal(size=tok.shape)
  return logp, old, c, tok, act, a_star


def test_loss_matches_numpy_and_q_one_gives_mean_credit():
  logp, old, c, tok, act, a_star = _loss_batch()
  act[0, 2] = 0.0  # a masked-out action does not count
  loss, aux = jax.jit(factor_loss)(logp.astype(np.float32), old.astype(np.float32), c, tok, act)
  np.testing.assert_allclose(float(loss), _np_loss(logp, old, c, tok, act, 0.2), rtol=1e-5)
  assert float(aux.num_actions) == act.sum()
  assert 0 < float(aux.clip_frac_low) + float(aux.clip_frac_high) < 1
  at_one, _ = factor_loss(old, old, c, tok, act)
  np.testing.assert_allclose(float(at_one), -(a_star * act).sum() / act.sum(), rtol=1e-5)
  # Asymmetric clip: a larger ε_high changes the loss only through q > 1 + ε tokens with C > 0.
  wide, _ = factor_loss(logp, old, c, tok, act, eps_high=0.28)
  np.testing.assert_allclose(float(wide), _np_loss_asym(logp, old, c, tok, act), rtol=1e-5)


def _np_loss_asym(logp, old, c, tok, act):
  clipped = np.clip(np.exp(logp - old), 0.8, 1.28)
  obj = np.minimum(np.exp(logp - old) * c, clipped * c) * tok
  per = obj.sum(-1) / np.maximum(tok.sum(-1), 1)
  return -(per * act).sum() / act.sum()


def test_gradient_matches_finite_differences():
  logp, old, c, tok, act, _ = _loss_batch(5, lead=(2,))
  grad = np.asarray(jax.grad(lambda lp: factor_loss(lp, old, c, tok, act)[0])(
      logp.astype(np.float32)))
  h = 1e-6
  fd = np.zeros_like(logp)
  for idx in np.ndindex(*logp.shape):
    up, dn = logp.copy(), logp.copy()
    up[idx] += h
    dn[idx] -= h
    fd[idx] = (_np_loss(up, old, c, tok, act, 0.2) - _np_loss(dn, old, c, tok, act, 0.2)) / (2 * h)
  np.testing.assert_allclose(grad, fd, rtol=1e-3, atol=1e-5)
  assert np.abs(fd).max() > 0.01


def test_tokens_to_actions_round_trip():
  ids = np.array([[0, 0, -1, 1, 1, 1, -1, 2],
                  [-1, 1, 0, 1, 0, -1, -1, -1]], np.int32)  # row 1: interleaved actions
  x = np.arange(16, dtype=np.float32).reshape(2, 8) + 1
  out = tokens_to_actions(x, ids, num_steps=3, max_action_len=3)
  np.testing.assert_array_equal(out.values, [[[1, 2, 0], [4, 5, 6], [8, 0, 0]],
                                             [[11, 13, 0], [10, 12, 0], [0, 0, 0]]])
  assert out.tok_mask.sum() == 10
  back = actions_to_tokens(out.values, out.position, ids)
  np.testing.assert_array_equal(back, np.where(ids >= 0, x, 0.0))
  with pytest.raises(ValueError, match="max_action_len"):
    tokens_to_actions(x, ids, num_steps=3, max_action_len=2)
  with pytest.raises(ValueError, match="step_ids"):
    tokens_to_actions(x, ids[:, :4], num_steps=3, max_action_len=3)


def test_bad_inputs_raise_naming_the_argument():
  a_star, delta, tok, act = _actions()
  with pytest.raises(ValueError, match="A_star"):
    factor_token_coef(a_star[:, :3], delta, tok, eta=0.5)
  with pytest.raises(ValueError, match="delta"):
    factor_token_coef(a_star, delta[..., :3], tok, eta=0.5)
  with pytest.raises(ValueError, match="eta"):
    factor_token_coef(a_star, delta, tok, eta=1.5)
  with pytest.raises(ValueError, match="tau"):
    factor_token_coef(a_star, delta, tok, eta=0.5, tau=0.0)
  with pytest.raises(ValueError, match="total_steps"):
    factor_eta(1, total_steps=0)
  with pytest.raises(ValueError, match="act_mask"):
    factor_loss(tok, tok, tok, tok, act[:, :2])
  with pytest.raises(ValueError, match="old_logp"):
    factor_loss(tok, tok[..., :2], tok, tok, act)


def test_sharded_matches_single_device():
  logp, old, c, tok, act, _ = _loss_batch(6, lead=(8,))
  mesh = Mesh(np.array(jax.devices()), ("data",))
  rows = NamedSharding(mesh, P("data"))

  @jax.jit
  def fn(lp, o, cc, t, a):
    loss, aux = factor_loss(lp, o, cc, t, a)
    return loss, aux.num_actions, aux.ratio_mean

  args = [np.asarray(a, np.float32) for a in (logp, old, c, tok, act)]
  single = fn(*[jax.device_put(a, jax.devices()[0]) for a in args])
  sharded = [jax.device_put(a, rows) for a in args]
  assert len(sharded[0].sharding.device_set) == 8
  for got, want in zip(fn(*sharded), single):
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
  assert jnp.isfinite(single[0])
