"""ICE (arXiv 2608.02087): the correctness-filtered forward KL, its NLL surrogate and the context
assignment, against numpy / hand values; gradients; jit; sharded == single device."""

import doctest

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxrl_post import losses
from jaxrl_post.losses import ice


def test_doctests():
  assert doctest.testmod(ice, raise_on_error=True).attempted >= 4


def _batch(seed=0, batch=8, time=5, vocab=7):
  rng = np.random.default_rng(seed)
  t_logits = rng.normal(size=(batch, time, vocab)).astype(np.float32)
  s_logits = rng.normal(size=(batch, time, vocab)).astype(np.float32)
  lengths = rng.integers(1, time + 1, size=batch)
  mask = np.arange(time)[None] < lengths[:, None]
  rewards = rng.integers(0, 2, size=batch).astype(np.float32)
  rewards[0], rewards[1] = 1.0, np.nan
  return t_logits, s_logits, rewards, mask


def _log_softmax(x):
  x = x.astype(np.float64)
  return x - np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True)) - x.max(
    -1, keepdims=True)


def _reference(t_logits, s_logits, rewards, mask):
  lt, ls = _log_softmax(t_logits), _log_softmax(s_logits)
  kl = (np.exp(lt) * (lt - ls)).sum(-1)
  w = mask & (np.nan_to_num(rewards, nan=-1.0) >= 1.0)[:, None]
  return (kl * w).sum() / max(w.sum(), 1)


def test_matches_reference():
  t, s, r, m = _batch()
  lt, ls = jax.nn.log_softmax(t), jax.nn.log_softmax(s)
  loss, aux = losses.ice_filtered_forward_kl(lt, ls, r, m)
  np.testing.assert_allclose(loss, _reference(t, s, r, m), rtol=1e-5)
  assert float(aux.kept_tokens) == float((m & (np.nan_to_num(r) >= 1)[:, None]).sum())


def test_no_correct_rollout_gives_zero():
  t, s, r, m = _batch()
  loss, aux = losses.ice_filtered_forward_kl(jax.nn.log_softmax(t), jax.nn.log_softmax(s),
                                             np.zeros_like(r), m)
  assert float(loss) == 0.0 and float(aux.kept_tokens) == 0.0


def test_gradient_flows_to_student_only_and_matches_formula():
  t, s, r, m = _batch(seed=1)

  def f(t_logits, s_logits):
    return losses.ice_filtered_forward_kl(jax.nn.log_softmax(t_logits),
                                          jax.nn.log_softmax(s_logits), r, m)[0]

  g_t, g_s = jax.grad(f, argnums=(0, 1))(jnp.asarray(t), jnp.asarray(s))
  np.testing.assert_array_equal(g_t, 0.0)  # the teacher is stop-gradient
  # d/dz_S of Σ_v p_T (log p_T − log p_S) = p_S − p_T per kept token, / kept.
  w = (m & (np.nan_to_num(r, nan=-1.0) >= 1)[:, None]).astype(np.float64)
  want = (np.exp(_log_softmax(s)) - np.exp(_log_softmax(t))) * w[..., None] / w.sum()
  np.testing.assert_allclose(g_s, want, rtol=1e-4, atol=1e-7)


def test_truncated_support_renormalised():
  # On a top-K support, `renormalize=True` equals the KL between the renormalised distributions.
  t, s, r, m = _batch(seed=2, vocab=9)
  support = np.argsort(-t, axis=-1)[..., :4]
  lt = np.take_along_axis(np.asarray(jax.nn.log_softmax(t)), support, -1)
  ls = np.take_along_axis(np.asarray(jax.nn.log_softmax(s)), support, -1)
  loss, _ = losses.ice_filtered_forward_kl(lt, ls, r, m, renormalize=True)
  np.testing.assert_allclose(loss, _reference(lt, ls, r, m), rtol=1e-5)


def test_nll_surrogate_gradient_is_one_sample_estimate():
  # E_{y ~ p_T}[∇ −log p_S(y)] = ∇ KL(p_T ‖ p_S): check the surrogate's value by hand.
  lp = np.log(np.array([[0.5, 0.25, 0.2], [0.1, 0.1, 0.1]], np.float32))
  mask = np.array([[True, True, False], [True, True, True]])
  got = losses.ice_nll_surrogate(lp, np.array([1.0, 0.0]), mask)
  np.testing.assert_allclose(got, (np.log(2) + np.log(4)) / 2, rtol=1e-6)


def test_jit_and_sharded_equal_single_device():
  t, s, r, m = _batch(batch=16)
  lt, ls = np.asarray(jax.nn.log_softmax(t)), np.asarray(jax.nn.log_softmax(s))
  fn = jax.jit(lambda *a: losses.ice_filtered_forward_kl(*a)[0])
  single = fn(*[jax.device_put(a, jax.devices()[0]) for a in (lt, ls, r, m)])
  mesh = Mesh(np.array(jax.devices()), ("data",))
  sharded = fn(*[jax.device_put(a, NamedSharding(mesh, P("data"))) for a in (lt, ls, r, m)])
  np.testing.assert_allclose(single, sharded, rtol=1e-6)
  np.testing.assert_allclose(single, _reference(t, s, r, m), rtol=1e-5)


def test_assign_contexts():
  rows = losses.assign_contexts(5, 8, 5, rng=np.random.default_rng(0)).reshape(5, 8)
  for group in rows:  # 8 rollouts over 6 contexts: each context once or twice
    counts = np.bincount(group, minlength=6)
    assert counts.min() >= 1 and counts.max() <= 2
  assert losses.assign_contexts(1, 3, 0).tolist() == [0, 0, 0]  # no instructions: all bare
  with pytest.raises(ValueError, match="group_size"):
    losses.assign_contexts(1, 0, 2)


def test_bad_input():
  t, s, r, m = _batch()
  with pytest.raises(ValueError, match="student_logp"):
    losses.ice_filtered_forward_kl(t, s[..., :3], r, m)
  with pytest.raises(ValueError, match="mask"):
    losses.ice_filtered_forward_kl(t, s, r, m[:, :2])
  with pytest.raises(ValueError, match="rewards"):
    losses.ice_filtered_forward_kl(t, s, r[:3], m)
