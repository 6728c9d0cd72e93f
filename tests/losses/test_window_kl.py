"""RecoverFly's windowed reference KL: the window, numpy golden values, finite gradients with the
NaN window encoding, micro-batches adding up, sharded == single device, the policy-loss entry."""

import doctest

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxrl_post.losses import POLICY_LOSSES, policy_loss, window_kl
from jaxrl_post.losses.window_kl import (
  action_window,
  mark_window,
  window_kl_policy_loss,
)


def test_doctests():
  assert doctest.testmod(window_kl).failed == 0


def _batch(seed, b=8, t=6):
  rng = np.random.default_rng(seed)
  mask = np.arange(t)[None] < rng.integers(1, t + 1, b)[:, None]
  choice = mask & (rng.random((b, t)) < 0.7)
  logp = np.log(rng.uniform(0.05, 1.0, (b, t))).astype(np.float32)
  ref = np.log(rng.uniform(0.05, 1.0, (b, t))).astype(np.float32)
  return logp, ref, mask, choice


def _numpy_window_kl(logp, ref, window):
  rows = []
  for i in range(len(logp)):
    w = window[i]
    if w.any():
      log_r = ref[i, w] - logp[i, w]
      rows.append(np.mean(np.exp(log_r) - 1 - log_r))
  return np.sum(rows) / max(len(rows), 1)


def test_action_window_takes_the_last_w_choice_tokens():
  choice = np.array([[1, 1, 0, 1, 1, 0], [0, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]], bool)
  assert action_window(choice, 2).astype(int).tolist() == [
    [0, 0, 0, 1, 1, 0], [0, 1, 0, 0, 0, 0], [0] * 6]
  assert (action_window(choice, 0) == choice).all()
  assert (action_window(choice, 10) == choice).all()
  with pytest.raises(ValueError, match="window"):
    action_window(choice, -1)


@pytest.mark.parametrize("w", [0, 2])
def test_matches_numpy_and_gradients_are_finite(w):
  logp, ref, mask, choice = _batch(0)
  win = action_window(choice, w)
  marked = mark_window(ref, win)
  value, count = window_kl.window_kl(logp, marked, mask)
  np.testing.assert_allclose(value, _numpy_window_kl(logp, ref, win), rtol=1e-5)
  assert int(count) == win.sum()
  grad = jax.grad(lambda lp: window_kl.window_kl(lp, marked, mask)[0])(jnp.asarray(logp))
  assert np.isfinite(grad).all()
  assert (np.asarray(grad)[~win] == 0).all() and (np.asarray(grad)[win] != 0).any()
  # The whole-trajectory window on every token is the sequence mean of token-mean k3.
  full, _ = window_kl.window_kl(logp, mark_window(ref, mask), mask)
  np.testing.assert_allclose(full, _numpy_window_kl(logp, ref, mask), rtol=1e-5)


def test_micro_batches_add_up_with_global_num_sequences():
  logp, ref, mask, choice = _batch(1, b=8)
  marked = mark_window(ref, action_window(choice, 3))
  n_seq = float((mask.sum(1) > 0).sum())
  whole, _ = window_kl.window_kl(logp, marked, mask, num_sequences=n_seq)
  parts = sum(window_kl.window_kl(logp[s], marked[s], mask[s], num_sequences=n_seq)[0]
              for s in (slice(0, 3), slice(3, 8)))
  np.testing.assert_allclose(parts, whole, rtol=1e-6)


def test_sharded_matches_single_device():
  assert jax.device_count() == 8, "tests/conftest.py should give 8 fake CPU devices"
  logp, ref, mask, choice = _batch(2, b=16)
  marked = mark_window(ref, action_window(choice, 2))
  rows = NamedSharding(Mesh(np.array(jax.devices()), ("data",)), P("data"))
  fn = jax.jit(lambda *a: window_kl.window_kl(*a)[0])
  single = fn(*[jax.device_put(a, jax.devices()[0]) for a in (logp, marked, mask)])
  sharded = fn(*[jax.device_put(a, rows) for a in (logp, marked, mask)])
  np.testing.assert_allclose(sharded, single, rtol=1e-6)


def test_policy_loss_entry_adds_beta_times_window_kl():
  assert POLICY_LOSSES.get("recoverfly_window_kl") is window_kl_policy_loss
  logp, ref, mask, choice = _batch(3)
  old = logp + 0.1
  adv = np.linspace(-1, 1, len(logp)).astype(np.float32)
  marked = mark_window(ref, action_window(choice, 2))
  base, _ = policy_loss(logp, old, adv, mask)
  loss, aux = jax.jit(lambda lp: window_kl_policy_loss(lp, old, adv, mask, ref_logp=marked,
                                                       beta=0.3))(logp)
  kl, _ = window_kl.window_kl(logp, marked, mask)
  np.testing.assert_allclose(loss, base + 0.3 * kl, rtol=1e-5)
  np.testing.assert_allclose(aux.kl_loss, kl, rtol=1e-6)
  grad = jax.grad(lambda lp: window_kl_policy_loss(lp, old, adv, mask, ref_logp=marked,
                                                   beta=0.3)[0])(jnp.asarray(logp))
  assert np.isfinite(grad).all()
  with pytest.raises(ValueError, match="ref_logp"):
    window_kl_policy_loss(logp, old, adv, mask, beta=0.1)
