"""DRACO step credit: worked checks, conservation / sign on random inputs, fallbacks, sharding."""

import doctest

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxrl_post.advantages import contiguous_group_ids, group_advantages
from jaxrl_post.advantages import draco as draco_module
from jaxrl_post.advantages.draco import (
    draco_step_advantages,
    draco_step_stats,
    step_token_counts,
)
from jaxrl_post.advantages.step_credit import STEP_CREDIT, steps_to_tokens

# The paper's Appendix E example: Q = (1, 1, .5, .333, .5, .333, uncited) from these counts.
APPX_PASS = np.array([2, 1, 1, 1, 1, 1, 0])
APPX_FAIL = np.array([0, 0, 1, 2, 1, 2, 0])
APPX_TOKENS = np.array([40, 40, 30, 50, 30, 60, 60])


def _np_draco(adv, step_pass, step_fail, step_tokens, step_mask, eps=1e-8):
  """Independent loop implementation of DRACO's redistribution (float64)."""
  b_size, g_size, s_size = step_pass.shape
  out = np.zeros((b_size, g_size, s_size))
  for b in range(b_size):
    for g in range(g_size):
      a_i = float(adv[b, g])
      real = [j for j in range(s_size) if step_mask[b, g, j] and step_tokens[b, g, j] > 0]
      q = {}
      for j in real:
        votes = step_pass[b, g, j] + step_fail[b, g, j]
        if votes > 0:
          q[j] = step_pass[b, g, j] / votes
      if not q:
        for j in real:
          out[b, g, j] = a_i
        continue
      q_bar = sum(q.values()) / len(q)
      w = {}
      for j in real:
        qj = q.get(j, q_bar)
        w[j] = qj if a_i >= 0 else 1.0 - qj
      w_sum = sum(w.values())
      total = sum(step_tokens[b, g, j] for j in real)
      for j in real:
        if w_sum <= eps:
          out[b, g, j] = a_i
        else:
          out[b, g, j] = a_i * total * w[j] / (step_tokens[b, g, j] * w_sum)
  return out


def _random_inputs(seed, b=8, g=4, s=6):
  rng = np.random.default_rng(seed)
  adv = rng.normal(size=(b, g)).astype(np.float32)
  p = rng.integers(0, 3, size=(b, g, s)) * (rng.random((b, g, s)) < 0.6)
  f = rng.integers(0, 3, size=(b, g, s)) * (rng.random((b, g, s)) < 0.6)
  n = rng.integers(1, 50, size=(b, g, s))
  num = rng.integers(1, s + 1, size=(b, g))
  mask = (np.arange(s) < num[..., None]).astype(np.int32)
  # Some special rollouts: no citations at all, all-pass with A < 0, a masked-in empty step.
  p[0, 0], f[0, 0] = 0, 0
  p[0, 1], f[0, 1], adv[0, 1] = 2, 0, -abs(adv[0, 1]) - 0.1
  n[1, 0, 0], mask[1, 0, :2] = 0, 1
  return adv, p.astype(np.int32), f.astype(np.int32), n.astype(np.int32), mask


def test_worked_check_two_steps():
  # A = 1, w = (1, 1), n = (2, 4) → a = (1.5, 0.75), step totals 3 and 3.
  a = jax.jit(draco_step_advantages)(jnp.ones((1, 1)), jnp.array([[[1, 3]]]),
                                     jnp.zeros((1, 1, 2), jnp.int32), jnp.array([[[2, 4]]]),
                                     jnp.ones((1, 1, 2)))
  np.testing.assert_allclose(a[0, 0], [1.5, 0.75], rtol=1e-6)
  np.testing.assert_allclose(a[0, 0] * np.array([2, 4]), [3.0, 3.0], rtol=1e-6)


def test_appendix_e_example():
  stats = jax.jit(draco_step_stats)(jnp.ones((1, 1)), APPX_PASS[None, None],
                                    APPX_FAIL[None, None], APPX_TOKENS[None, None],
                                    jnp.ones((1, 1, 7)))
  np.testing.assert_allclose(stats.quality[0, 0, :6], [1, 1, 0.5, 1 / 3, 0.5, 1 / 3], rtol=1e-6)
  # The uncited step gets the mean Q of the cited ones: (2 + 1 + 2/3) / 6.
  np.testing.assert_allclose(stats.quality[0, 0, 6], (3 + 2 / 3) / 6, rtol=1e-6)
  totals = np.asarray(stats.advantages[0, 0]) * APPX_TOKENS
  ref = _np_draco(np.ones((1, 1)), APPX_PASS[None, None], APPX_FAIL[None, None],
                  APPX_TOKENS[None, None], np.ones((1, 1, 7)))[0, 0] * APPX_TOKENS
  np.testing.assert_allclose(totals, ref, rtol=1e-5)
  # Which steps carry the paper's totals: found by the numpy reference, asserted on JAX's.
  assert np.flatnonzero(np.round(ref, 2) == 72.47).tolist() == [0, 1]
  assert np.flatnonzero(np.round(ref, 2) == 24.16).tolist() == [3, 5]
  np.testing.assert_allclose(np.round(totals[[0, 1, 3, 5]], 2), [72.47, 72.47, 24.16, 24.16])
  # Push per step does not depend on verbosity: Q = 1/3 with 50 and 60 tokens, same total.
  assert not stats.fallback[0, 0]
  np.testing.assert_allclose(totals.sum(), 310.0, rtol=1e-6)  # = A·N


def test_negative_advantage_uses_one_minus_q():
  stats = draco_step_stats(-jnp.ones((1, 1)), APPX_PASS[None, None], APPX_FAIL[None, None],
                           APPX_TOKENS[None, None], jnp.ones((1, 1, 7)))
  q_bar = (3 + 2 / 3) / 6
  w = np.array([0, 0, 0.5, 2 / 3, 0.5, 2 / 3, 1 - q_bar])
  np.testing.assert_allclose(stats.weights[0, 0], w, rtol=1e-6, atol=1e-7)
  totals = np.asarray(stats.advantages[0, 0]) * APPX_TOKENS
  # Fully passed steps are not suppressed; the worst steps (Q = 1/3) carry the most push.
  np.testing.assert_allclose(totals, -310 * w / w.sum(), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(totals[3], -75.92, atol=5e-3)
  assert (totals <= 0).all()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_matches_reference_conserves_and_keeps_sign(seed):
  adv, p, f, n, mask = _random_inputs(seed)
  a = np.asarray(jax.jit(draco_step_advantages)(adv, p, f, n, mask))
  np.testing.assert_allclose(a, _np_draco(adv, p, f, n, mask), rtol=1e-5, atol=1e-5)
  real = (mask > 0) & (n > 0)
  tokens = np.where(real, n, 0)
  np.testing.assert_allclose((a * tokens).sum(-1), adv * tokens.sum(-1), rtol=1e-5, atol=1e-4)
  assert (a * adv[..., None] >= 0).all()  # never flips the sign of A_i
  np.testing.assert_array_equal(a[~real], 0.0)  # padding and empty steps get nothing


def test_fallbacks_and_empty_step():
  adv, p, f, n, mask = _random_inputs(0)
  stats = draco_step_stats(adv, p, f, n, mask)
  a = np.asarray(stats.advantages)
  # No citations: uniform A_i on the real steps.
  assert stats.fallback[0, 0]
  np.testing.assert_allclose(a[0, 0], np.where(mask[0, 0] > 0, adv[0, 0], 0.0), rtol=1e-6)
  # A_i < 0 and every step passed: Σw = 0, so uniform A_i rather than no push at all.
  assert stats.fallback[0, 1]
  np.testing.assert_allclose(a[0, 1], np.where(mask[0, 1] > 0, adv[0, 1], 0.0), rtol=1e-6)
  # A masked-in step with no tokens takes no part and its citations are not in the cited mean.
  assert not stats.real[1, 0, 0] and a[1, 0, 0] == 0.0
  p2, f2 = p.copy(), f.copy()
  p2[1, 0, 0], f2[1, 0, 0] = 0, 5
  np.testing.assert_array_equal(draco_step_advantages(adv, p2, f2, n, mask), a)
  # A padded step's counts are ignored too.
  pad = np.argwhere(mask == 0)[0]
  p2[tuple(pad)] = 7
  np.testing.assert_array_equal(draco_step_advantages(adv, p2, f2, n, mask), a)


def test_unanimous_group_gets_zero():
  # A unanimous group has zero GRPO advantage, so every step gets 0 in either branch.
  rewards = jnp.array([[0.5, 0.5, 0.5], [1.0, -1.0, 0.5]])
  adv = group_advantages(rewards.reshape(-1), contiguous_group_ids(6, 3), num_groups=2)
  adv = adv.reshape(2, 3)
  p = jnp.array([[[1, 0], [0, 0], [2, 1]], [[1, 0], [0, 0], [2, 1]]])
  a = draco_step_advantages(adv, p, jnp.ones_like(p), jnp.full(p.shape, 5), jnp.ones(p.shape))
  np.testing.assert_array_equal(a[0], 0.0)
  assert (np.abs(np.asarray(a[1])).sum(-1) > 0).all()  # the other group does get credit


def test_token_spreading_conserves_total_push():
  # Two rollouts: steps of 2 and 4 tokens with gaps (−1) between them and padding.
  step_ids = jnp.array([[0, 0, -1, 1, 1, 1, 1, -1, -1], [0, -1, 1, 1, 1, 2, 2, -1, -1]])
  token_mask = jnp.array([[1] * 7 + [0, 0], [1] * 8 + [0]])
  n = step_token_counts(step_ids, 3, token_mask)
  np.testing.assert_array_equal(n, [[2, 4, 0], [1, 3, 2]])
  adv = jnp.array([[1.0, -0.5]])
  p = jnp.array([[[1, 1, 0], [0, 1, 1]]])
  f = jnp.array([[[0, 1, 0], [1, 0, 1]]])
  a = draco_step_advantages(adv, p, f, n[None], jnp.array([[[1, 1, 0], [1, 1, 1]]]))
  tok = steps_to_tokens(a[0], step_ids) * token_mask
  np.testing.assert_allclose(tok.sum(-1), adv[0] * n.sum(-1), rtol=1e-6)
  np.testing.assert_array_equal(np.asarray(tok)[np.asarray(step_ids) < 0], 0.0)


def test_registry_and_errors():
  assert STEP_CREDIT.get("draco") is draco_step_advantages
  adv, p, f, n, mask = _random_inputs(3, b=2, g=2, s=3)
  np.testing.assert_array_equal(
      STEP_CREDIT.get("draco")(traj_adv=adv, step_pass=p, step_fail=f, step_tokens=n,
                               step_mask=mask),
      draco_step_advantages(adv, p, f, n, mask))
  with pytest.raises(KeyError, match="valid names: .*draco"):
    STEP_CREDIT.get("dracoo")
  with pytest.raises(ValueError, match="traj_adv"):
    draco_step_advantages(adv[0], p, f, n, mask)
  with pytest.raises(ValueError, match="step_pass"):
    draco_step_advantages(adv, p[:1], f, n, mask)
  with pytest.raises(ValueError, match="step_fail"):
    draco_step_advantages(adv, p, f[..., :2], n, mask)
  with pytest.raises(ValueError, match="step_tokens"):
    draco_step_advantages(adv, p, f, n[0], mask)
  with pytest.raises(ValueError, match="step_mask"):
    draco_step_advantages(adv, p, f, n, mask[:, :1])
  with pytest.raises(ValueError, match="num_steps"):
    step_token_counts(jnp.zeros(4, jnp.int32), 0)
  with pytest.raises(ValueError, match="mask"):
    step_token_counts(jnp.zeros(4, jnp.int32), 2, jnp.ones(3))


def test_doctests():
  doctest.testmod(draco_module, raise_on_error=True)


def test_sharded_matches_single_device():
  assert jax.device_count() == 8, "tests/conftest.py should give 8 fake CPU devices"
  args = _random_inputs(4, b=8)
  mesh = Mesh(np.array(jax.devices()), ("data",))
  rows = NamedSharding(mesh, P("data"))
  fn = jax.jit(draco_step_advantages)
  single = fn(*[jax.device_put(x, jax.devices()[0]) for x in args])
  sharded = [jax.device_put(x, rows) for x in args]
  assert len(sharded[0].sharding.device_set) == 8
  np.testing.assert_allclose(fn(*sharded), single, rtol=1e-6, atol=1e-7)
