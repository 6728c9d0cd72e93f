"""CoKL (arXiv 2608.01743): loss value and gradient, weights, ablation, reference cache."""

import doctest

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxrl_post.losses import cokl
from jaxrl_post.losses.cokl import (
  cokl_loss,
  reference_answers_get,
  reference_answers_init,
  reference_answers_put,
  sequence_logp,
)
from jaxrl_post.losses.regularizers import REGULARIZERS

EPS = 0.2


def test_doctests():
  assert doctest.testmod(cokl, raise_on_error=True).attempted >= 10


def test_registered():
  assert REGULARIZERS.get("cokl") is cokl_loss


def _np_weights(cur, old, correct, eps=EPS):
  w = np.zeros_like(cur, np.float64)
  for b in range(cur.shape[0]):
    rho = {i: np.exp(np.clip(cur[b, i] - old[b, i], np.log(1 - eps), np.log(1 + eps)))
           for i in range(cur.shape[1]) if correct[b, i]}
    total = sum(rho.values())
    for i, r in rho.items():
      w[b, i] = r / total
  return w


def _batch(seed=0, b=5, nr=3, g=4):
  rng = np.random.default_rng(seed)
  ref_mask = rng.uniform(size=(b, nr)) < 0.7
  ref_mask[0] = True
  ref_mask[1] = False  # no reference answer
  correct = rng.uniform(size=(b, g)) < 0.6
  correct[0, :2] = True
  correct[2] = False  # empty current correct set
  correct[1, 0] = True
  cur = rng.normal(-5.0, 2.0, size=(b, g)).astype(np.float32)
  old = (cur + rng.normal(0.0, 0.3, size=(b, g))).astype(np.float32)
  old[0, 0] = cur[0, 0] + 1.0  # ratio e^-1 < 0.8: clipped from below
  old[0, 1] = cur[0, 1] - 1.0  # ratio e^1 > 1.2: clipped from above
  ref = rng.normal(-6.0, 2.0, size=(b, nr)).astype(np.float32)
  ref = np.where(ref_mask, ref, np.nan).astype(np.float32)  # garbage where no answer
  cur_pad = np.where(correct, cur, -np.inf).astype(np.float32)  # garbage off the correct set
  return dict(ref=ref, ref_mask=ref_mask, cur=cur, cur_pad=cur_pad, old=old, correct=correct)


# ---------------------------------------------------------------------------------------------
# Value, weights, clipping.
# ---------------------------------------------------------------------------------------------


def _np_loss(r, beta, prompt_mean="reference", normalise=True):
  w = _np_weights(r["cur"], r["old"], r["correct"])
  terms, active = [], []
  for b in range(r["ref"].shape[0]):
    refs = [float(r["ref"][b, k]) for k in range(r["ref"].shape[1]) if r["ref_mask"][b, k]]
    t1 = -np.mean(refs) if refs else 0.0
    t2 = sum(w[b, i] * r["cur"][b, i] for i in range(r["cur"].shape[1]) if r["correct"][b, i])
    terms.append(t1 + (t2 if normalise else 0.0))
    active.append({"reference": bool(refs), "any": bool(refs) or r["correct"][b].any(),
                   "all": True}[prompt_mean])
  active = np.array(active)
  return beta * np.sum(np.array(terms)[active]) / max(active.sum(), 1)


@pytest.mark.parametrize("prompt_mean", ["reference", "any", "all"])
@pytest.mark.parametrize("normalise", [True, False])
def test_loss_matches_numpy_under_jit(prompt_mean, normalise):
  r = _batch()
  fn = jax.jit(lambda *a, beta: cokl_loss(*a, beta=beta, prompt_mean=prompt_mean,
                                          normalise=normalise))
  loss, aux = fn(r["ref"], r["ref_mask"], r["cur_pad"], r["old"], r["correct"], beta=0.3)
  np.testing.assert_allclose(loss, _np_loss(r, 0.3, prompt_mean, normalise), rtol=1e-5)
  assert np.isfinite(float(loss))
  if prompt_mean == "reference":
    assert np.asarray(aux.active).tolist() == r["ref_mask"].any(-1).tolist()


def test_loss_by_hand():
  # Prompt 0: refs −2, −4 (mean −3); correct current −1 (ratio 1), −3 (ratio 1.2 after clip).
  # Prompt 1: no reference answer (inactive); prompt 2: refs −1; no correct current sample.
  ref = np.array([[-2.0, -4.0], [np.nan, np.nan], [-1.0, 0.0]], np.float32)
  ref_mask = np.array([[1, 1], [0, 0], [1, 0]], bool)
  cur = np.array([[-1.0, -3.0, -9.0], [-2.0, -2.0, -2.0], [-1.0, -1.0, -1.0]], np.float32)
  old = np.array([[-1.0, -3.5, -9.0], [-2.0, -2.0, -2.0], [-1.0, -1.0, -1.0]], np.float32)
  correct = np.array([[1, 1, 0], [1, 0, 0], [0, 0, 0]], bool)
  loss, aux = cokl_loss(ref, ref_mask, cur, old, correct, beta=0.5)
  w0 = np.array([1.0, 1.2]) / 2.2
  np.testing.assert_allclose(aux.weights[0, :2], w0, rtol=1e-6)
  t0 = 3.0 + w0 @ np.array([-1.0, -3.0])
  np.testing.assert_allclose(loss, 0.5 * (t0 + 1.0) / 2, rtol=1e-6)
  assert aux.active.tolist() == [True, False, True]
  assert float(aux.num_active) == 2.0
  np.testing.assert_allclose(aux.ref_term, [3.0, 0.0, 1.0])
  np.testing.assert_allclose(aux.clip_frac, 1 / 3, rtol=1e-6)  # 1 of 3 correct rows clipped
  # "any" includes prompt 1 through its correction term alone: w = 1, term −2.
  loss_any, _ = cokl_loss(ref, ref_mask, cur, old, correct, beta=0.5, prompt_mean="any")
  np.testing.assert_allclose(loss_any, 0.5 * (t0 + 1.0 - 2.0) / 3, rtol=1e-5)


def test_weights_sum_to_one_and_clip():
  r = _batch(seed=1)
  _, aux = cokl_loss(r["ref"], r["ref_mask"], r["cur_pad"], r["old"], r["correct"], beta=1.0)
  w = np.asarray(aux.weights)
  has = r["correct"].any(-1)
  np.testing.assert_allclose(w.sum(-1)[has], 1.0, rtol=1e-6)
  np.testing.assert_array_equal(w.sum(-1)[~has], 0.0)
  np.testing.assert_array_equal(w[~r["correct"]], 0.0)
  np.testing.assert_allclose(w, _np_weights(r["cur"], r["old"], r["correct"]), rtol=1e-5,
                             atol=1e-7)
  # Row 0: the two forced ratios are clipped to 0.8 and 1.2 exactly.
  c0 = np.flatnonzero(r["correct"][0])
  ratios = w[0, c0] / w[0, c0].min()
  np.testing.assert_allclose(w[0, 0] / w[0, 1], 0.8 / 1.2, rtol=1e-5)
  assert ratios.max() <= 1.2 / 0.8 + 1e-5
  # Without clipping the weights would differ (the test can fail).
  unclipped = np.exp(r["cur"][0, :2] - r["old"][0, :2])
  assert abs(unclipped[0] / unclipped[1] - 0.8 / 1.2) > 0.1


def test_empty_correct_set_uses_only_the_first_term():
  r = _batch(seed=2)
  none = np.zeros_like(r["correct"])
  loss, aux = cokl_loss(r["ref"], r["ref_mask"], r["cur_pad"], r["old"], none, beta=0.7)
  ref_only, _ = cokl_loss(r["ref"], r["ref_mask"], r["cur_pad"], r["old"], r["correct"],
                          beta=0.7, normalise=False)
  np.testing.assert_allclose(loss, ref_only, rtol=1e-6)
  np.testing.assert_array_equal(aux.weights, 0.0)
  np.testing.assert_array_equal(aux.correction, 0.0)
  assert np.isfinite(float(loss))


def test_beta_scales_value_and_gradient():
  r = _batch(seed=3)

  def f(ref, cur, beta):
    return cokl_loss(ref, r["ref_mask"], cur, r["old"], r["correct"], beta=beta)[0]

  ref = np.where(r["ref_mask"], r["ref"], 0.0)
  g1 = jax.grad(f, argnums=(0, 1))(ref, r["cur"], 1.0)
  g3 = jax.grad(f, argnums=(0, 1))(ref, r["cur"], 3.0)
  np.testing.assert_allclose(f(ref, r["cur"], 3.0), 3 * f(ref, r["cur"], 1.0), rtol=1e-6)
  for a, b in zip(g1, g3):
    np.testing.assert_allclose(b, 3 * np.asarray(a), rtol=1e-6, atol=1e-9)
  assert np.abs(np.asarray(g1[1])).sum() > 0


# ---------------------------------------------------------------------------------------------
# Gradient through a tiny linear policy.
# ---------------------------------------------------------------------------------------------


def _np_log_softmax(z):
  z = z - z.max(-1, keepdims=True)
  return z - np.log(np.exp(z).sum(-1, keepdims=True))


def test_gradient_equals_the_formula_on_a_linear_policy():
  """∇L = β/N Σ_x [−mean_{r∈𝓡_x} ∇log π(y_r) + Σ_{i∈𝒞_x} w_i ∇log π(y_i)] with w held fixed."""
  rng = np.random.default_rng(4)
  b, nr, g, t, d, v = 3, 2, 3, 4, 5, 6
  theta = rng.normal(0, 0.5, size=(d, v)).astype(np.float32)
  feats_ref = rng.normal(size=(b, nr, t, d)).astype(np.float32)
  feats_cur = rng.normal(size=(b, g, t, d)).astype(np.float32)
  y_ref = rng.integers(0, v, size=(b, nr, t))
  y_cur = rng.integers(0, v, size=(b, g, t))
  m_ref = np.arange(t) < rng.integers(1, t + 1, size=(b, nr, 1))
  m_cur = np.arange(t) < rng.integers(1, t + 1, size=(b, g, 1))
  ref_mask = np.array([[1, 1], [1, 0], [0, 0]], bool)
  correct = np.array([[1, 1, 0], [0, 0, 0], [1, 0, 1]], bool)
  beta = 0.25

  def seq_logp(theta, feats, y, m):
    logp = jax.nn.log_softmax(feats @ theta, axis=-1)
    tok = jnp.take_along_axis(logp, y[..., None], axis=-1)[..., 0]
    return sequence_logp(tok, m)

  cur0 = np.asarray(seq_logp(theta, feats_cur, y_cur, m_cur))
  old = (cur0 + rng.normal(0, 0.3, size=cur0.shape)).astype(np.float32)

  def loss_fn(theta):
    ref = seq_logp(theta, feats_ref, y_ref, m_ref)
    cur = seq_logp(theta, feats_cur, y_cur, m_cur)
    return cokl_loss(ref, ref_mask, cur, old, correct, beta=beta)[0]

  grad = np.asarray(jax.jit(jax.grad(loss_fn))(theta))

  def np_grad_logp(feats, y, m):
    # ∇_θ Σ_t log softmax(x_t θ)[y_t] = Σ_t x_t (onehot(y_t) − p_t)ᵀ
    out = np.zeros((d, v))
    for s in range(t):
      if m[s]:
        x = feats[s].astype(np.float64)
        p = np.exp(_np_log_softmax(x @ theta.astype(np.float64)))
        out += np.outer(x, np.eye(v)[y[s]] - p)
    return out

  w = _np_weights(cur0, old, correct)
  want, n_active = np.zeros((d, v)), 0
  for x in range(b):
    refs = [r for r in range(nr) if ref_mask[x, r]]
    if not refs:  # a prompt without reference answers contributes nothing
      continue
    n_active += 1
    for r in refs:
      want -= np_grad_logp(feats_ref[x, r], y_ref[x, r], m_ref[x, r]) / len(refs)
    for i in range(g):
      if correct[x, i]:
        want += w[x, i] * np_grad_logp(feats_cur[x, i], y_cur[x, i], m_cur[x, i])
  want *= beta / n_active
  np.testing.assert_allclose(grad, want, rtol=2e-4, atol=1e-6)


def test_normalisation_frees_the_total_correct_mass():
  """Raising every correct answer's log-prob by c leaves CoKL unchanged (plasticity), while the
  correct-only replay ablation (normalise=False) keeps rewarding it: d loss / dc = −β."""
  r = _batch(seed=5)
  # Prompts with reference answers and a correct current sample (otherwise there is no
  # normalisation term to cancel the shift).
  keep = r["ref_mask"].any(-1) & r["correct"].any(-1)

  def f(c, normalise):
    ref = jnp.where(r["ref_mask"], r["ref"], 0.0) + c
    cur = jnp.asarray(r["cur"]) + c
    old = jnp.asarray(r["old"]) + c  # the same shift under π_old: the weights do not move
    return cokl_loss(ref[keep], r["ref_mask"][keep], cur[keep], old[keep],
                     r["correct"][keep], beta=0.5, normalise=normalise)[0]

  assert keep.sum() >= 2
  value_and_grad = jax.jit(jax.value_and_grad(f), static_argnums=1)
  value, grad = value_and_grad(0.0, True)
  np.testing.assert_allclose(grad, 0.0, atol=1e-6)
  np.testing.assert_allclose(value_and_grad(1.7, True)[0], value, rtol=1e-5)
  value_off, grad_off = value_and_grad(0.0, False)
  np.testing.assert_allclose(grad_off, -0.5, rtol=1e-6)
  np.testing.assert_allclose(value_and_grad(1.7, False)[0], value_off - 0.5 * 1.7, rtol=1e-5)


def test_gradient_with_respect_to_current_logp_is_the_weights():
  r = _batch(seed=6)
  g_cur = jax.grad(lambda cur: cokl_loss(r["ref"], r["ref_mask"], cur, r["old"], r["correct"],
                                         beta=2.0)[0])(r["cur"])
  _, aux = cokl_loss(r["ref"], r["ref_mask"], r["cur"], r["old"], r["correct"], beta=2.0)
  n = float(aux.num_active)
  expected = 2.0 * np.asarray(aux.weights) * np.asarray(aux.active)[:, None] / n
  np.testing.assert_allclose(g_cur, expected, rtol=1e-6, atol=1e-9)
  g_off = jax.grad(lambda cur: cokl_loss(r["ref"], r["ref_mask"], cur, r["old"], r["correct"],
                                         beta=2.0, normalise=False)[0])(r["cur"])
  np.testing.assert_array_equal(g_off, 0.0)


# ---------------------------------------------------------------------------------------------
# Errors, sharding.
# ---------------------------------------------------------------------------------------------


def test_errors_name_the_argument():
  r = _batch()
  args = [r["ref"], r["ref_mask"], r["cur"], r["old"], r["correct"]]
  for i, name in enumerate(["ref_logp", "ref_mask", "cur_logp", "old_cur_logp", "cur_correct"]):
    bad = list(args)
    bad[i] = bad[i][:, :1] if i in (1, 3, 4) else bad[i][0]
    with pytest.raises(ValueError, match=name):
      cokl_loss(*bad, beta=1.0)
  with pytest.raises(ValueError, match="eps"):
    cokl_loss(*args, beta=1.0, eps=1.0)
  with pytest.raises(ValueError, match="prompt_mean"):
    cokl_loss(*args, beta=1.0, prompt_mean="batch")
  with pytest.raises(ValueError, match="mask"):
    sequence_logp(np.zeros((2, 3)), np.zeros((2, 4)))


def test_sharded_matches_single_device():
  assert jax.device_count() == 8, "tests/conftest.py should give 8 fake CPU devices"
  r = _batch(seed=7, b=16)
  mesh = Mesh(np.array(jax.devices()), ("data",))
  rows = NamedSharding(mesh, P("data"))
  fn = jax.jit(lambda *a: cokl_loss(*a, beta=0.1))
  keys = ("ref", "ref_mask", "cur_pad", "old", "correct")
  single = fn(*[jax.device_put(r[k], jax.devices()[0]) for k in keys])
  sharded = [jax.device_put(r[k], rows) for k in keys]
  assert len(sharded[0].sharding.device_set) == 8
  out = fn(*sharded)
  for got, want in zip(jax.tree.leaves(out), jax.tree.leaves(single)):
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


# ---------------------------------------------------------------------------------------------
# Reference answers.
# ---------------------------------------------------------------------------------------------


def test_sequence_logp():
  tok = np.array([[-1.0, -0.5, -np.inf], [np.nan, 0.0, 0.0]], np.float32)
  mask = np.array([[1, 1, 0], [0, 0, 0]], bool)
  np.testing.assert_array_equal(sequence_logp(tok, mask), [-1.5, 0.0])


def test_reference_answers_keep_correct_up_to_per_prompt():
  cache = reference_answers_init(num_prompts=3, per_prompt=3, length=2)
  put = jax.jit(reference_answers_put)  # traced prompt index
  toks = np.arange(8, dtype=np.int32).reshape(4, 2)
  mask = np.array([[1, 1], [1, 0], [1, 1], [1, 0]], bool)
  cache = put(cache, 2, toks, mask, np.array([True, False, True, False]))
  assert np.asarray(cache.count).tolist() == [0, 0, 2]
  np.testing.assert_array_equal(np.asarray(cache.tokens)[2, :2], toks[[0, 2]])
  cache = put(cache, 2, toks + 10, mask, np.array([False, True, True, True]))
  assert np.asarray(cache.count).tolist() == [0, 0, 3]  # 5 correct, room for 3
  tokens, masks = np.asarray(cache.tokens), np.asarray(cache.mask)
  np.testing.assert_array_equal(tokens[2], np.stack([toks[0], toks[2], toks[1] + 10]))
  np.testing.assert_array_equal(masks[2], mask[[0, 2, 1]])
  assert not tokens[:2].any() and not masks[:2].any()
  got = reference_answers_get(cache, np.array([2, 0]))
  assert np.asarray(got.answer_mask).tolist() == [[True, True, True], [False, False, False]]
  assert got.tokens.shape == (2, 3, 2)
  np.testing.assert_array_equal(got.tokens, tokens[[2, 0]])
  one = reference_answers_get(cache, 2)
  assert one.answer_mask.tolist() == [True, True, True]
  leaves = jax.tree.leaves(cache)
  assert len(leaves) == 3 and all(isinstance(x, jax.Array) for x in leaves)


def test_reference_answer_errors():
  for bad in (0, -2):
    with pytest.raises(ValueError, match="per_prompt"):
      reference_answers_init(num_prompts=2, per_prompt=bad, length=3)
  with pytest.raises(ValueError, match="num_prompts"):
    reference_answers_init(num_prompts=0, per_prompt=2, length=3)
  cache = reference_answers_init(num_prompts=2, per_prompt=2, length=3)
  toks, mask, ok = np.zeros((2, 3), np.int32), np.ones((2, 3), bool), np.ones(2, bool)
  with pytest.raises(ValueError, match="prompt_index"):
    reference_answers_put(cache, 2, toks, mask, ok)
  with pytest.raises(ValueError, match="prompt_index"):
    reference_answers_get(cache, np.array([0, -1]))
  with pytest.raises(ValueError, match="tokens"):
    reference_answers_put(cache, 0, np.zeros((2, 4), np.int32), mask, ok)
  with pytest.raises(ValueError, match="correct"):
    reference_answers_put(cache, 0, toks, mask, np.ones(3, bool))
