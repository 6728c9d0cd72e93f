"""OPRD (arXiv 2609.08798): identity forward, (I + λ d dᵀ) backward, chunking, sharding."""

import doctest
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxrl_post.losses import oprd, policy_loss
from jaxrl_post.losses.oprd import (
  oprd_alignment,
  oprd_alignment_metrics,
  oprd_direction,
  oprd_lambda,
  oprd_support,
  oprd_support_from_logits,
  oprd_transform,
)
from jaxrl_post.sampling.scoring import score_logits

V = 37  # vocabulary of the random tests (odd, so no shape coincides with another)
K = 4  # student top-K of the random tests (the paper's 10 is the default)


def test_doctests():
  assert doctest.testmod(oprd, raise_on_error=True).attempted >= 5


def _batch(seed=0, b=4, t=5, v=V, k=K):
  """Logits, a ragged mask, sampled tokens, old log-probs, advantages, OPRD support/direction."""
  rng = np.random.default_rng(seed)
  z = rng.normal(0.0, 1.5, size=(b, t, v)).astype(np.float32)
  lengths = rng.integers(1, t + 1, size=b)
  mask = (np.arange(t)[None] < lengths[:, None])
  logp_all = z - np.log(np.exp(z).sum(-1, keepdims=True))
  tokens = np.array([[rng.choice(v, p=np.exp(logp_all[i, j])) for j in range(t)]
                     for i in range(b)], np.int32)
  logp = np.take_along_axis(logp_all, tokens[..., None], -1)[..., 0]
  old_logp = (logp + rng.normal(0.0, 0.3, size=logp.shape)).astype(np.float32)
  adv = rng.normal(size=(b,)).astype(np.float32)
  teacher = rng.normal(0.0, 1.0, size=(b, t, v)).astype(np.float32)
  teacher_ref = (teacher + rng.normal(0.0, 0.5, size=(b, t, v))).astype(np.float32)
  ids, slot_mask = oprd_support_from_logits(jnp.asarray(z), jnp.asarray(tokens), k=k,
                                            token_mask=jnp.asarray(mask))
  gather = lambda x: jnp.take_along_axis(jnp.asarray(x), ids, axis=-1)
  d = oprd_direction(gather(teacher), gather(teacher_ref), slot_mask)
  return dict(z=z, mask=mask, tokens=tokens, old_logp=old_logp, adv=adv, ids=np.asarray(ids),
              slot_mask=np.asarray(slot_mask), d=np.asarray(d), teacher=teacher,
              teacher_ref=teacher_ref)


_KEYS = ("ids", "d", "slot_mask", "mask", "tokens", "old_logp", "adv")


def _ppo_loss(z, r, lam_pos, lam_neg, transform=True):
  return _jit_loss(z, {k: r[k] for k in _KEYS}, lam_pos, lam_neg, transform=transform)


def _ppo_grad(z, r, lam_pos, lam_neg, transform=True):
  return _jit_grad(z, {k: r[k] for k in _KEYS}, lam_pos, lam_neg, transform=transform)


def _loss_impl(z, r, lam_pos, lam_neg, transform=True):
  if transform:
    z = oprd_transform(z, r["ids"], r["d"], r["slot_mask"], lam_pos, lam_neg, r["mask"])
  logp = score_logits(z, r["tokens"], r["mask"]).logp
  loss, _ = policy_loss(logp, r["old_logp"], r["adv"], r["mask"], epsilon_low=0.2,
                        epsilon_high=0.28)
  return loss


_jit_loss = jax.jit(_loss_impl, static_argnames="transform")
_jit_grad = jax.jit(jax.grad(_loss_impl), static_argnames="transform")


def _np_corrected(c, ids, d, slot_mask, mask, lam_pos, lam_neg):
  """Reference: per position, c̃ = −(I + λ D Dᵀ) g with g = −c and D the dense direction."""
  c = np.asarray(c, np.float64)
  out = np.empty_like(c)
  for idx in np.ndindex(c.shape[:-1]):
    dense = np.zeros(c.shape[-1])
    for slot in range(ids.shape[-1]):
      if slot_mask[idx][slot]:
        dense[ids[idx][slot]] += d[idx][slot]
    g = -c[idx]
    u = dense @ g
    lam = (lam_pos if u >= 0 else lam_neg) * float(mask[idx])
    out[idx] = -(np.eye(c.shape[-1]) + lam * np.outer(dense, dense)) @ g
  return out


def test_hand_example_both_branches():
  # z = 0 (p = ¼), y = 0, support {0, 1}, δ = (1, −1) → d = (1, −1)/√2.
  # L = −A log p_0: c = −A(e_0 − p).
  # A = +1: c = (−¾, ¼, ¼, ¼), u = −dᵀc = 1/√2 ≥ 0 → λ₊ = 0.5, c̃ = c − 0.5·(1/√2)·d
  #         = c − (¼, −¼, 0, 0) = (−1, ½, ¼, ¼).
  # A = −1: c = (¾, −¼, −¼, −¼), u = −1/√2 < 0 → λ₋ = 0.2, c̃ = c + 0.2·(½, −½, 0, 0)
  #         = (0.85, −0.35, −0.25, −0.25).
  ids, ok = oprd_support(jnp.array(0), jnp.array([1, 0]))
  assert ids.tolist() == [0, 1, 0] and ok.tolist() == [True, True, False]
  d = oprd_direction(jnp.array([0.0, -2.0, 5.0]), jnp.array([-1.0, -1.0, -9.0]), ok)
  np.testing.assert_allclose(d, [2 ** -0.5, -(2 ** -0.5), 0.0], rtol=1e-6)

  grad = jax.jit(jax.grad(
      lambda z, adv: -adv * jax.nn.log_softmax(oprd_transform(z, ids, d, ok, 0.5, 0.2))[0]))
  grad = functools.partial(grad, jnp.zeros(4))

  np.testing.assert_allclose(grad(1.0), [-1.0, 0.5, 0.25, 0.25], atol=1e-6)
  np.testing.assert_allclose(grad(-1.0), [0.85, -0.35, -0.25, -0.25], atol=1e-6)


@pytest.mark.parametrize("lams", [(0.5, 0.0), (0.5, 0.25), (1.0, 1.0), (0.0, 0.5)])
def test_gradient_matches_explicit_matrix(lams):
  r = _batch(seed=1)
  z = jnp.asarray(r["z"])
  fwd = jax.jit(lambda z: oprd_transform(z, r["ids"], r["d"], r["slot_mask"], *lams,
                                         r["mask"]))
  np.testing.assert_array_equal(fwd(z), z)  # the forward value is untouched
  np.testing.assert_array_equal(_ppo_loss(z, r, *lams),
                                _ppo_loss(z, r, *lams, transform=False))
  c = _ppo_grad(z, r, *lams, transform=False)
  c_tilde = _ppo_grad(z, r, *lams)
  expected = _np_corrected(c, r["ids"], r["d"], r["slot_mask"], r["mask"], *lams)
  np.testing.assert_allclose(c_tilde, expected, rtol=1e-5, atol=1e-8)
  # Both branches fire somewhere in this batch, and the correction is not a no-op.
  u = -np.sum(np.take_along_axis(np.asarray(c), r["ids"], -1) * r["d"], -1)[r["mask"]]
  assert (u > 1e-6).any() and (u < -1e-6).any()
  if lams != (0.0, 0.0):
    assert np.abs(np.asarray(c_tilde) - np.asarray(c)).max() > 1e-4


def test_properties_same_zeros_and_ascent():
  # ⟨g, g̃⟩ = ‖g‖² + λu² per position (Eq. 2.7), and g = 0 ⇒ g̃ = 0 (Eq. 2.6).
  r = _batch(seed=2)
  z = jnp.asarray(r["z"])
  lam_pos, lam_neg = 0.5, 0.3
  g = -np.asarray(_ppo_grad(z, r, 0.0, 0.0, transform=False), np.float64)
  g_t = -np.asarray(_ppo_grad(z, r, lam_pos, lam_neg), np.float64)
  u = np.sum(np.take_along_axis(g, r["ids"], -1) * r["d"], -1)
  lam = np.where(u >= 0, lam_pos, lam_neg) * r["mask"]
  np.testing.assert_allclose(np.sum(g * g_t, -1), np.sum(g * g, -1) + lam * u ** 2,
                             rtol=1e-5, atol=1e-12)
  zero_adv = dict(r, adv=np.zeros_like(r["adv"]))
  g0 = _ppo_grad(z, zero_adv, lam_pos, lam_neg)
  np.testing.assert_array_equal(g0, 0.0)


def test_masked_positions_and_slots_untouched():
  r = _batch(seed=3)
  z = jnp.asarray(r["z"])
  cot = jnp.asarray(np.random.default_rng(0).normal(size=r["z"].shape), jnp.float32)
  vjp = jax.jit(lambda z, ids, cot: jax.vjp(
      lambda z: oprd_transform(z, ids, r["d"], r["slot_mask"], 0.5, 0.5, r["mask"]), z)[1](cot)[0])
  out = vjp(z, r["ids"], cot)
  np.testing.assert_array_equal(np.asarray(out)[~r["mask"]], np.asarray(cot)[~r["mask"]])
  # Ids outside the valid support (including garbage ids in masked slots) keep their cotangent.
  ids = np.where(r["slot_mask"], r["ids"], -5)
  np.testing.assert_array_equal(vjp(z, ids, cot), out)
  touched = np.zeros(r["z"].shape, bool)
  for idx in zip(*np.nonzero(r["slot_mask"])):
    touched[idx[:-1] + (r["ids"][idx],)] = True
  np.testing.assert_array_equal(np.asarray(out)[~touched], np.asarray(cot)[~touched])


def test_bfloat16_cotangent_keeps_dtype():
  r = _batch(seed=4)
  z = jnp.asarray(r["z"], jnp.bfloat16)
  f = lambda z: jnp.sum(oprd_transform(z, r["ids"], r["d"], r["slot_mask"], 0.5, 0.5,
                                       r["mask"]).astype(jnp.float32) ** 2)
  g = jax.jit(jax.grad(f))(z)
  assert g.dtype == jnp.bfloat16 and np.isfinite(np.asarray(g, np.float32)).all()


def test_lambda_schedule():
  sched = jax.jit(lambda k: oprd_lambda(k, lam=0.5, warmup_steps=30))
  got = [tuple(map(float, sched(k))) for k in (0, 15, 30, 100)]
  assert got == [(0.5, 0.0), (0.5, 0.25), (0.5, 0.5), (0.5, 0.5)]
  assert tuple(map(float, oprd_lambda(3, lam=1.0, warmup_steps=0))) == (1.0, 1.0)
  np.testing.assert_allclose(oprd_lambda(25, warmup_steps=75).lam_neg, 0.5 / 3, rtol=1e-6)
  with pytest.raises(ValueError, match="warmup_steps"):
    oprd_lambda(0, warmup_steps=-1)


def test_support_and_direction_golden():
  ids, ok = oprd_support(jnp.array([[3, 1]]), jnp.array([[[3, 0], [2, 0]]]),
                         jnp.array([[True, False]]))
  assert ids.tolist() == [[[3, 3, 0], [1, 2, 0]]]
  assert ok.tolist() == [[[True, False, True], [False, False, False]]]
  # δ on the valid slots (3, 0): (0.2 − (−1), −3 − (−1)) = (1.2, −2) → centred (1.6, −1.6).
  d = oprd_direction(jnp.array([[[0.2, 7.0, -3.0], [1.0, 2.0, 3.0]]]),
                     jnp.array([[[-1.0, 0.0, -1.0], [0.0, 0.0, 0.0]]]), ok)
  np.testing.assert_allclose(d[0, 0], [2 ** -0.5, 0.0, -(2 ** -0.5)], rtol=1e-6)
  np.testing.assert_array_equal(d[0, 1], 0.0)
  # The teacher did not move: no direction, no correction.
  np.testing.assert_array_equal(
      oprd_direction(jnp.ones((1, 3)), jnp.ones((1, 3)), jnp.ones((1, 3), bool)), 0.0)
  # Logits and log-probs give the same direction (centering removes the normaliser).
  rng = np.random.default_rng(0)
  zt, zr = rng.normal(size=(2, V)).astype(np.float32)
  sl = np.arange(5)
  ls = lambda x: x - np.log(np.exp(x).sum())
  np.testing.assert_allclose(oprd_direction(zt[sl], zr[sl], np.ones(5, bool)),
                             oprd_direction(ls(zt)[sl], ls(zr)[sl], np.ones(5, bool)),
                             rtol=1e-5, atol=1e-6)


def test_alignment_matches_the_real_cotangent_at_ratio_one():
  # At the rollout policy (old_logp = current, ratio 1 inside the clip range) the PPO loss's
  # logit cotangent is −(positive normaliser)·A(e_y − p); oprd_alignment's closed form must give
  # the same sign of u, the same cosine on the support and the λ branch the backward pass takes.
  r = _batch(seed=5)
  z = jnp.asarray(r["z"])
  logp_all = np.asarray(jax.nn.log_softmax(z), np.float64)
  r["old_logp"] = np.take_along_axis(logp_all, r["tokens"][..., None], -1)[..., 0].astype(
      np.float32)
  g = -np.asarray(_ppo_grad(z, r, 0.0, 0.0, transform=False), np.float64)
  g_support = np.where(r["slot_mask"], np.take_along_axis(g, r["ids"], -1), 0.0)
  u_real = np.sum(g_support * r["d"], -1)
  norm = np.linalg.norm(g_support, axis=-1)
  support_logp = np.take_along_axis(logp_all, r["ids"], -1)
  out = jax.jit(oprd_alignment)(r["d"], support_logp, r["slot_mask"], r["adv"], 0.5, 0.2,
                                r["mask"])
  active = np.asarray(out.active) > 0
  assert active.sum() >= 10 and not active[~r["mask"]].any()
  np.testing.assert_array_equal(np.sign(np.asarray(out.u))[active], np.sign(u_real)[active])
  np.testing.assert_allclose(np.asarray(out.cos)[active], (u_real / norm)[active], rtol=1e-4,
                             atol=1e-6)
  np.testing.assert_array_equal(np.asarray(out.lam)[active],
                                np.where(u_real >= 0, 0.5, 0.2).astype(np.float32)[active])
  # The correction's size per position: ‖g̃ − g‖ = λ|u| ≤ λ|cos|·‖g‖ on the whole vocabulary.
  g_tilde = -np.asarray(_ppo_grad(z, r, 0.5, 0.2), np.float64)
  rel = np.linalg.norm(g_tilde - g, axis=-1) / np.maximum(np.linalg.norm(g, axis=-1), 1e-30)
  bound = np.asarray(out.lam) * np.abs(np.asarray(out.cos))
  np.testing.assert_array_less(rel[active], bound[active] + 1e-6)
  metrics = oprd_alignment_metrics(out, r["mask"])
  np.testing.assert_allclose(metrics["oprd/aligned_frac"], np.mean(u_real[active] >= 0))
  np.testing.assert_allclose(metrics["oprd/active_frac"], active.sum() / r["mask"].sum())
  assert 0.0 < metrics["oprd/aligned_frac"] < 1.0
  # Per-position advantages broadcast the same way; a bad one names the argument.
  per_pos = np.broadcast_to(r["adv"][:, None], r["mask"].shape)
  np.testing.assert_allclose(oprd_alignment(r["d"], support_logp, r["slot_mask"], per_pos, 0.5,
                                            0.2, r["mask"]).u, out.u, rtol=1e-6)
  with pytest.raises(ValueError, match="adv"):
    oprd_alignment(r["d"], support_logp, r["slot_mask"], r["adv"][:2], 0.5, 0.2)


def test_bad_shapes_raise():
  z = jnp.zeros((2, 3, V))
  ids = jnp.zeros((2, 3, 5), jnp.int32)
  d = jnp.zeros((2, 3, 5))
  ok = jnp.ones((2, 3, 5), bool)
  with pytest.raises(ValueError, match="support_ids"):
    oprd_transform(z, ids[:, :2], d, ok, 0.5, 0.5)
  with pytest.raises(ValueError, match="direction"):
    oprd_transform(z, ids, d[..., :4], ok, 0.5, 0.5)
  with pytest.raises(ValueError, match="support_mask"):
    oprd_transform(z, ids, d, ok[0], 0.5, 0.5)
  with pytest.raises(ValueError, match="token_mask"):
    oprd_transform(z, ids, d, ok, 0.5, 0.5, jnp.ones((2, 4)))
  with pytest.raises(ValueError, match="lam_neg"):
    oprd_transform(z, ids, d, ok, 0.5, jnp.ones(4))
  with pytest.raises(ValueError, match="integer"):
    oprd_transform(z, d, d, ok, 0.5, 0.5)
  with pytest.raises(ValueError, match="topk_ids"):
    oprd_support(jnp.zeros((2, 3), jnp.int32), jnp.zeros((2, 4, 5), jnp.int32))
  with pytest.raises(ValueError, match="teacher_ref_logp"):
    oprd_direction(d, d[:1], ok)


# ---------------------------------------------------------------------------------------------
# Chunked scoring: the transform inside the checkpointed chunk function of a time scan.
# ---------------------------------------------------------------------------------------------

B, T, E, CHUNK = 2, 7, 8, 3


def _chunk_inputs(seed=5):
  rng = np.random.default_rng(seed)
  r = _batch(seed=seed, b=B, t=T)
  hidden = rng.normal(size=(B, T, E)).astype(np.float32)
  w = rng.normal(0.0, 0.7, size=(E, V)).astype(np.float32)
  return r, jnp.asarray(hidden), jnp.asarray(w)


def _chunked_loss(w, hidden, r, lam_pos, lam_neg, chunk):
  """A copy of `sampling.score_hidden`'s loop with `oprd_transform` in the chunk function."""
  b, t, _ = hidden.shape
  n = -(-t // chunk)
  pad = n * chunk - t

  def to_chunks(x):
    x = jnp.asarray(x)
    x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
    return jnp.moveaxis(x.reshape(b, n, chunk, *x.shape[2:]), 1, 0)

  @jax.checkpoint
  def one_chunk(h, tokens, mask, ids, d, ok):
    z = oprd_transform(h @ w, ids, d, ok, lam_pos, lam_neg, mask)
    return score_logits(z, tokens, mask).logp

  xs = tuple(map(to_chunks, (hidden, r["tokens"], r["mask"], r["ids"], r["d"], r["slot_mask"])))
  _, logp = jax.lax.scan(lambda carry, x: (carry, one_chunk(*x)), None, xs)
  logp = jnp.moveaxis(logp, 0, 1).reshape(b, n * chunk)[:, :t]
  loss, _ = policy_loss(logp, r["old_logp"], r["adv"], r["mask"], epsilon_high=0.28)
  return loss


def _unchunked_loss(w, hidden, r, lam_pos, lam_neg):
  return _ppo_loss(hidden @ w, r, lam_pos, lam_neg)


def _avals(jaxpr):
  """Every variable's aval in a jaxpr and its sub-jaxprs (scan, checkpoint, custom_vjp, pjit)."""
  jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
  for eqn in jaxpr.eqns:
    for var in eqn.outvars:
      yield var.aval
    for param in eqn.params.values():
      for sub in param if isinstance(param, (tuple, list)) else (param,):
        if hasattr(sub, "eqns") or hasattr(getattr(sub, "jaxpr", None), "eqns"):
          yield from _avals(sub)


def test_chunked_equals_unchunked_and_never_forms_full_logits():
  r, hidden, w = _chunk_inputs()
  lams = (0.5, 0.3)
  chunked = jax.jit(jax.value_and_grad(
      lambda w, h: _chunked_loss(w, h, r, *lams, CHUNK), argnums=(0, 1)))
  full = jax.jit(jax.value_and_grad(lambda w, h: _unchunked_loss(w, h, r, *lams),
                                    argnums=(0, 1)))
  plain = jax.jit(jax.value_and_grad(lambda w, h: _unchunked_loss(w, h, r, 0.0, 0.0),
                                     argnums=(0, 1)))
  (lc, (gw_c, gh_c)), (lf, (gw_f, gh_f)) = chunked(w, hidden), full(w, hidden)
  np.testing.assert_allclose(lc, lf, rtol=1e-6)
  np.testing.assert_allclose(gw_c, gw_f, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(gh_c, gh_f, rtol=1e-5, atol=1e-7)
  # The correction is active (it changes the parameter gradient) ...
  assert np.abs(np.asarray(gw_c) - np.asarray(plain(w, hidden)[1][0])).max() > 1e-4
  # ... and no tensor of B·T·V elements (logits, cotangent, or stacked chunk residuals) exists.
  limit = B * T * V
  sizes = [int(np.prod(a.shape)) for a in _avals(jax.make_jaxpr(chunked)(w, hidden))
           if hasattr(a, "shape")]
  assert max(sizes) < limit, max(sizes)
  full_sizes = [int(np.prod(a.shape)) for a in _avals(jax.make_jaxpr(full)(w, hidden))
                if hasattr(a, "shape")]
  assert max(full_sizes) >= limit  # the check would catch a materialised [B, T, V]


# ---------------------------------------------------------------------------------------------
# Sharding: batch-sharded (and batch × vocab sharded) logits give the single-device gradient.
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mesh_shape,spec", [((8,), P("data")),
                                             ((4, 2), P("data", None, "model"))],
                         ids=["data", "data_x_vocab"])
def test_sharded_matches_single_device(mesh_shape, spec):
  assert jax.device_count() == 8, "tests/conftest.py should give 8 fake CPU devices"
  r = _batch(seed=6, b=16, t=3, v=38)
  names = ("data",) if len(mesh_shape) == 1 else ("data", "model")
  mesh = Mesh(np.array(jax.devices()).reshape(mesh_shape), names)
  fn = jax.jit(jax.value_and_grad(
      lambda z, ids, d, ok, mask: _ppo_loss(z, dict(r, ids=ids, d=d, slot_mask=ok, mask=mask),
                                            0.5, 0.2)))
  args = [r["z"], r["ids"], r["d"], r["slot_mask"], r["mask"]]
  single = fn(*[jax.device_put(a, jax.devices()[0]) for a in args])
  rows = NamedSharding(mesh, P("data"))
  sharded_args = [jax.device_put(args[0], NamedSharding(mesh, spec))]
  sharded_args += [jax.device_put(a, rows) for a in args[1:]]
  loss, grad = fn(*sharded_args)
  assert len(sharded_args[0].sharding.device_set) == 8
  np.testing.assert_allclose(loss, single[0], rtol=1e-6)
  np.testing.assert_allclose(grad, single[1], rtol=1e-5, atol=1e-8)
