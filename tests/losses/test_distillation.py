"""OPD rewards and losses, Open-MOPD domain weights: golden values, references, global stats."""

import doctest
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxrl_post import losses
from jaxrl_post.losses import distillation as opd

K = 16  # the paper's top-K width


def _log(x):
  return np.log(np.asarray(x, np.float64)).astype(np.float32)


def _random_topk(seed=0, batch=8, time=5, k=K, num_domains=3, absent=None):
  """A ragged OPD batch: student top-K log-probs s (rollout), current s_cur, teacher q."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(1, time + 1, size=batch)
  mask = (np.arange(time)[None] < lengths[:, None]).astype(np.float32)
  logits = rng.normal(0.0, 2.0, size=(batch, time, 4 * k))
  logp = logits - np.log(np.sum(np.exp(logits), -1, keepdims=True))
  s = -np.sort(-logp, axis=-1)[..., :k].astype(np.float32)  # top-K, descending
  q = (s + rng.normal(0.0, 0.7, size=s.shape)).astype(np.float32)
  s_cur = (s + rng.normal(0.0, 0.25, size=s.shape)).astype(np.float32)
  domains = rng.integers(0, num_domains, size=batch).astype(np.int32)
  if absent is not None:
    domains[domains == absent] = (absent + 1) % num_domains
  pad = mask[..., None] == 0
  s, q, s_cur = (np.where(pad, -np.inf, x).astype(np.float32) for x in (s, q, s_cur))
  return dict(s=s, q=q, s_cur=s_cur, mask=mask, domains=domains)


def _np_softmax(x):
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _np_topk_reward(s, q, mask):
  """Reference of spec §1.4 (b): r = (q − s)·softmax_K(s), 0 on padding."""
  valid = mask[..., None] > 0
  s0 = np.where(valid, s, 0.0).astype(np.float64)
  q0 = np.where(valid, q, 0.0).astype(np.float64)
  return np.where(valid, (q0 - s0) * _np_softmax(s0), 0.0)


def _np_topk_ppo(s_cur, s_old, q, mask, w, refresh, eps_lo=0.2, eps_hi=0.28, c=3.0):
  """Reference of spec §1.4 (f)+(g), written out literally in numpy."""
  r = _np_topk_reward(s_cur if refresh else s_old, q, mask)
  adv = r * mask[..., None] * w[:, None, None]
  valid = mask[..., None] > 0
  log_ratio = np.where(valid, s_cur, 0.0).astype(np.float64) - np.where(valid, s_old, 0.0)
  rho = np.exp(np.clip(log_ratio, -20, 20))
  l1, l2 = -adv * rho, -adv * np.clip(rho, 1 - eps_lo, 1 + eps_hi)
  lc = np.maximum(l1, l2)
  ell = np.where(adv < 0, np.minimum(-adv * c, lc), lc)
  tokloss = np.where(valid, ell, 0.0).sum(-1)
  return float((mask * tokloss).sum() / mask.sum())


def _np_domain_weights(mask, ids, rewards, target, alpha, lo=0.05, hi=20.0):
  """Reference of spec §1.4 (d)+(e), one domain at a time."""
  lengths = mask.sum(-1)
  abs_tok = np.abs(rewards.sum(-1) if rewards.ndim == 3 else rewards) * mask
  n = lengths.sum()
  present = [d for d in range(len(target)) if lengths[ids == d].sum() > 0]
  tgt = {d: target[d] for d in present}
  if sum(tgt.values()) == 0:
    tgt = {d: 1.0 for d in present}
  norm = sum(tgt.values())
  base = {d: (tgt[d] / norm) / (lengths[ids == d].sum() / n) for d in present}
  m = {d: abs_tok[ids == d].sum() / lengths[ids == d].sum() for d in present}
  ref = sum(base[d] * m[d] for d in present) / sum(base.values())
  w = {d: base[d] * np.clip((m[d] / ref) ** alpha, lo, hi) for d in present}
  seq = np.array([w.get(int(d), 0.0) for d in ids])
  return seq * n / (seq * lengths).sum()


# ---------------------------------------------------------------------------------------------
# Registry, rewards.
# ---------------------------------------------------------------------------------------------


def test_registry_names_and_unknown_name():
  assert {"full_vocab", "mopd", "mopd_topk", "sampled_token", "topk"} <= set(
    losses.OPD_REWARDS.names())
  assert losses.OPD_REWARDS.get("topk") is opd.topk_opd_reward
  with pytest.raises(KeyError, match="valid names: .*full_vocab, mopd"):
    losses.OPD_REWARDS.get("topK")


def test_doctests():
  result = doctest.testmod(opd, optionflags=doctest.ELLIPSIS)
  assert result.attempted >= 15 and result.failed == 0


def test_sampled_token_reward_golden_and_padding():
  # A = q − s: log(0.25/0.5) = −log 2; log(0.6/0.2) = log 3; the pad holds −inf − (−inf) = NaN.
  s = _log([[0.5, 0.2, 1.0]])
  s[0, 2] = -np.inf
  q = _log([[0.25, 0.6, 1.0]])
  q[0, 2] = -np.inf
  a = opd.sampled_token_opd_reward(s, q, np.array([[1, 1, 0]]))
  np.testing.assert_allclose(a, [[-np.log(2), np.log(3), 0.0]], rtol=1e-6)
  grad = jax.grad(lambda x: jnp.sum(opd.sampled_token_opd_reward(x, q[:, :2])))(s[:, :2])
  np.testing.assert_array_equal(grad, 0.0)  # a reward carries no gradient


def test_topk_reward_golden():
  # s = log[0.5, 0.3, 0.2] → p̃ = [0.5, 0.3, 0.2];  q = log[0.25, 0.3, 0.4]
  # r = (q − s)·p̃ = [0.5·log ½, 0, 0.2·log 2] = [−0.346574, 0, 0.138629].
  # A second position with s shifted by a constant has the same p̃: softmax_K renormalises.
  s = _log([[[0.5, 0.3, 0.2], [0.25, 0.15, 0.1]]])
  q = _log([[[0.25, 0.3, 0.4], [0.25, 0.3, 0.4]]])
  r = np.asarray(opd.topk_opd_reward(s, q))
  np.testing.assert_allclose(r[0, 0], [-0.346574, 0.0, 0.138629], atol=1e-6)
  # position 1: p̃ = [0.5, 0.3, 0.2]; q − s = [0, log 2, log 4] → [0, 0.207944, 0.277259].
  np.testing.assert_allclose(r[0, 1], [0.0, 0.207944, 0.277259], atol=1e-6)


def test_topk_reward_matches_numpy_reference_k16():
  b = _random_topk(seed=1)
  r = opd.topk_opd_reward(b["s"], b["q"], b["mask"])
  assert r.shape == b["s"].shape and b["s"].shape[-1] == K
  assert np.all(np.isfinite(r))
  np.testing.assert_allclose(r, _np_topk_reward(b["s"], b["q"], b["mask"]), rtol=2e-5, atol=1e-6)


def test_topk_reward_on_full_support_is_the_reverse_kl_gradient():
  # With K = V (full support), Σ_k sg(r_k)·∇_z log p_k = −∇_z KL(p ‖ p_T) exactly, because
  # Σ_k p_k ∇ log p_k = ∇ Σ_k p_k = 0 (spec §1.4 (b): top-K truncated reverse-KL estimator).
  rng = np.random.default_rng(2)
  z = rng.normal(size=(2, 3, K)).astype(np.float32)
  zt = rng.normal(size=(2, 3, K)).astype(np.float32)
  teacher = jax.nn.log_softmax(zt)

  @jax.jit
  def grads(z):
    surrogate = lambda z: jnp.sum(
      opd.topk_opd_reward(jax.nn.log_softmax(z), teacher) * jax.nn.log_softmax(z)
    )
    kl = lambda z: jnp.sum(opd.full_vocab_reverse_kl(z, zt))
    return jax.grad(surrogate)(z), jax.grad(kl)(z)

  g_surrogate, g_kl = grads(z)
  np.testing.assert_allclose(g_surrogate, -g_kl, rtol=1e-4, atol=1e-6)


def test_full_vocab_reverse_kl_reference_and_gradient():
  rng = np.random.default_rng(3)
  zs = rng.normal(size=(2, 4, 7)).astype(np.float32)
  zt = rng.normal(size=(2, 4, 7)).astype(np.float32)
  ps, pt = _np_softmax(zs.astype(np.float64)), _np_softmax(zt.astype(np.float64))
  ref = np.sum(ps * (np.log(ps) - np.log(pt)), -1)
  mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], np.float32)
  fn = jax.jit(jax.value_and_grad(lambda z: jnp.sum(opd.full_vocab_opd_reward(z, zt, mask))))
  value, grad = fn(zs)
  np.testing.assert_allclose(value, -np.sum(ref * mask), rtol=1e-5)
  # ∂KL/∂z_v = p_v·((log p_v − log q_v) − KL); the reward is −KL, 0 on padding.
  g_ref = -ps * ((np.log(ps) - np.log(pt)) - ref[..., None]) * mask[..., None]
  np.testing.assert_allclose(grad, g_ref, rtol=1e-4, atol=1e-6)
  loss, aux = opd.full_vocab_opd_loss(zs, zt, mask)
  np.testing.assert_allclose(loss, np.sum(ref * mask) / 5, rtol=1e-5)
  np.testing.assert_allclose(aux.kl_max, np.max(np.where(mask > 0, ref, -np.inf)), rtol=1e-5)


def test_mopd_reward_clip_and_orm():
  # Â = sg(q − s) + c·A_ORM, then clip to ±A_max:
  #   [log 0.1 + 0.5·1, log 2 + 0.5·1] = [−1.8026, 1.1931] → A_max = 1: [−1, 1].
  s, q = _log([[0.5, 0.25]]), _log([[0.05, 0.5]])
  a = opd.mopd_reward(s, q, orm_adv=np.array([1.0]), orm_coef=0.5)
  np.testing.assert_allclose(a, [[np.log(0.1) + 0.5, np.log(2) + 0.5]], rtol=1e-5)
  a = opd.mopd_reward(s, q, orm_adv=np.array([1.0]), orm_coef=0.5, adv_clip=1.0)
  np.testing.assert_allclose(a, [[-1.0, 1.0]])


def test_mopd_loss_golden_icepop_mask_and_gradient():
  # One sequence, 4 tokens + pad; π_θ(y) = 0.5 everywhere; rollout μ gives ratios
  #   π_θ/μ = [1, 0.25, 4, 5.5]  → IcePop [0.2, 5] keeps w = [1, 0.25, 4, 0].
  # teacher q = log[0.25, 1, 0.5, 0.9] → Â = q − log ½ = [−log 2, log 2, 0, log 1.8].
  # L_t = −w·Â·log π_θ: [−log²2, 0.25·log²2, 0, 0]; seq-mean-token-mean: /4 → −0.75·log²2/4.
  logp = _log([[0.5, 0.5, 0.5, 0.5, 0.5]])
  rollout = _log([[0.5, 2.0, 0.125, 0.5 / 5.5, 0.5]])
  rollout[0, 4] = -np.inf
  teacher = _log([[0.25, 1.0, 0.5, 0.9, 1.0]])
  mask = np.array([[1, 1, 1, 1, 0]], np.float32)
  fn = jax.jit(
    jax.value_and_grad(lambda lp: opd.mopd_loss(lp, rollout, teacher, mask), has_aux=True)
  )
  (loss, aux), grad = fn(logp)
  np.testing.assert_allclose(loss, -0.75 * np.log(2) ** 2 / 4, rtol=1e-5)
  np.testing.assert_allclose(aux.icepop_keep_frac, 0.75)
  np.testing.assert_allclose(aux.icepop_weight_mean, (1 + 0.25 + 4) / 4, rtol=1e-5)
  np.testing.assert_allclose([aux.ratio_min, aux.ratio_max], [0.25, 5.5], rtol=1e-5)
  # dL/dlogp_t = −w_t·Â_t / |y| (Â and w are stop-gradient).
  np.testing.assert_allclose(grad, [[np.log(2) / 4, -0.25 * np.log(2) / 4, 0, 0, 0]], atol=1e-6)


def test_mopd_topk_reward_zero_at_match_and_reference():
  rng = np.random.default_rng(4)
  t = np.log(rng.uniform(0.01, 0.3, size=(2, 3, 4))).astype(np.float32)
  fn = jax.jit(jax.value_and_grad(lambda s: jnp.sum(opd.mopd_topk_reward(s, t))))
  value, grad = fn(t)
  np.testing.assert_allclose(value, 0.0, atol=1e-6)
  np.testing.assert_allclose(grad, 0.0, atol=1e-6)  # p_S = p_T is the optimum on the support
  s = np.log(rng.uniform(0.01, 0.3, size=(2, 3, 4))).astype(np.float32)
  ps, pt = np.exp(s.astype(np.float64)), np.exp(t.astype(np.float64))
  ref = -np.sum(ps * (np.log(ps) - np.log(pt)) - ps + pt, -1)
  np.testing.assert_allclose(opd.mopd_topk_reward(s, t), ref, rtol=1e-5)
  assert np.all(ref <= 0)


# ---------------------------------------------------------------------------------------------
# Reward refresh and the top-K dual-clip PPO loss.
# ---------------------------------------------------------------------------------------------


def test_refresh_changes_only_the_student_part():
  b = _random_topk(seed=5)
  s, q, s_cur, mask = b["s"], b["q"], b["s_cur"], b["mask"]
  valid = mask[..., None] > 0
  # Unchanged student → unchanged reward.
  np.testing.assert_allclose(
    opd.refresh_topk_reward(s, q, mask), opd.topk_opd_reward(s, q, mask), rtol=1e-6
  )
  r_cur = np.asarray(opd.refresh_topk_reward(s_cur, q, mask), np.float64)
  p_cur = _np_softmax(np.where(valid, s_cur, 0.0).astype(np.float64))
  # r = q·p̃ − s·p̃: the teacher enters as the *cached* q, the student part is recomputed.
  teacher_part = np.where(valid, q * p_cur, 0.0)
  student_part = np.where(valid, s_cur * p_cur, 0.0)
  np.testing.assert_allclose(r_cur, teacher_part - student_part, rtol=1e-4, atol=1e-6)
  assert np.abs(r_cur - np.asarray(opd.topk_opd_reward(s, q, mask))).max() > 1e-2
  # Changing the teacher input changes r by Δq·p̃_cur only; no gradient reaches either input.
  dq = np.where(valid, 0.3, 0.0).astype(np.float32)
  np.testing.assert_allclose(
    opd.refresh_topk_reward(s_cur, q + dq, mask) - r_cur, dq * p_cur, rtol=1e-4, atol=1e-6
  )
  finite = lambda x: np.where(valid, x, -1.0).astype(np.float32)
  g = jax.grad(lambda a, c: jnp.sum(opd.refresh_topk_reward(a, c, mask)), argnums=(0, 1))(
    finite(s_cur), finite(q)
  )
  np.testing.assert_array_equal(g[0], 0.0)
  np.testing.assert_array_equal(g[1], 0.0)


# Hand-derived batch [B=1, T=3, K=2], the last position padding (−inf):
#   s_old = log[[0.4, 0.4/3], [0.2, 0.2]]   → p̃_old = [[0.75, 0.25], [0.5, 0.5]]
#   s_cur = log[[0.6, 0.2],   [0.2, 0.8]]   → ρ = [[1.5, 1.5], [1, 4]]
#                                             p̃_cur = [[.75, .25], [.2, .8]]
#   q     = log[[0.2, 0.8/3], [0.2, 0.1]]
GOLD_OLD = _log([[[0.4, 0.4 / 3], [0.2, 0.2], [1.0, 1.0]]])
GOLD_CUR = _log([[[0.6, 0.2], [0.2, 0.8], [1.0, 1.0]]])
GOLD_Q = _log([[[0.2, 0.8 / 3], [0.2, 0.1], [1.0, 1.0]]])
for _x in (GOLD_OLD, GOLD_CUR, GOLD_Q):
  _x[0, 2] = -np.inf
GOLD_MASK = np.array([[1, 1, 0]], np.float32)
ONE = np.ones(1, np.float32)


@functools.partial(jax.jit, static_argnames=("refresh",))
def _topk_loss_and_grad(cur, old, q, mask, w, refresh):
  fn = lambda lp: opd.opd_topk_ppo_loss(lp, old, q, mask, seq_weights=w, refresh=refresh)
  (loss, aux), grad = jax.value_and_grad(fn, has_aux=True)(cur)
  return loss, aux, grad


def test_topk_ppo_loss_golden_without_refresh():
  # r_old = (q − s_old)·p̃_old = [[0.75·log ½, 0.25·log 2], [0, 0.5·log ½]]
  #       = [[−0.519860, 0.173287], [0, −0.346574]];  A = r_old (w = 1).
  # pos 0: k0 A<0, ρ=1.5: max(0.779791, 0.665421) = 0.779791 < 3·0.519860 → 0.779791
  #        k1 A>0, ρ=1.5: max(−0.259930, −0.221807) = −0.221807 (clipped high)
  # pos 1: k0 A=0 → 0;  k1 A<0, ρ=4: max(1.386294, 0.443614) = 1.386294 > 3·0.346574 → 1.039721
  # token-mean over 2 positions: (0.557983 + 1.039721)/2 = 0.798852.
  loss, aux, grad = _topk_loss_and_grad(GOLD_CUR, GOLD_OLD, GOLD_Q, GOLD_MASK, ONE, False)
  np.testing.assert_allclose(loss, 0.798852, rtol=1e-5)
  # 4 (position, candidate) pairs: one high clip (pos 0 k1), one dual clip (pos 1 k1).
  np.testing.assert_allclose(
    [aux.clip_frac, aux.clip_frac_low, aux.clip_frac_high, aux.clip_frac_dual],
    [0.25, 0.0, 0.25, 0.25],
    atol=1e-6,
  )
  np.testing.assert_allclose([aux.ratio_mean, aux.ratio_min, aux.ratio_max], [2.0, 1.0, 4.0])
  np.testing.assert_allclose(aux.reward_mean, np.log(0.5) / 2 * 2 / 2, rtol=1e-5)  # (Σ_k r)/N
  # Staleness: pos 0 unchanged p̃; pos 1 KL([½,½] ‖ [0.2,0.8]) = 0.223144; mean over 2 → 0.111572.
  np.testing.assert_allclose(aux.staleness_kl, 0.111572, rtol=1e-5)
  # Gradient only where the unclipped branch is active: pos 0 k0, −A·ρ/N = 0.389895.
  np.testing.assert_allclose(grad, [[[0.389895, 0], [0, 0], [0, 0]]], atol=1e-6)


def test_topk_ppo_loss_golden_with_refresh():
  # r_cur = (q − s_cur)·p̃_cur = [[0.75·log ⅓, 0.25·log(4/3)], [0, 0.8·log ⅛]]
  #       = [[−0.823959, 0.071921], [0, −1.663553]]
  # pos 0: k0 max(1.235939, 1.054668) = 1.235939 (< 3·0.823959); k1 clipped: −0.092058
  # pos 1: k1 max(6.654213, 2.129348) = 6.654213 > 3·1.663553 → 4.990660
  # (1.143880 + 4.990660)/2 = 3.067270.
  loss, aux, _ = _topk_loss_and_grad(GOLD_CUR, GOLD_OLD, GOLD_Q, GOLD_MASK, ONE, True)
  np.testing.assert_allclose(loss, 3.067270, rtol=1e-5)
  np.testing.assert_allclose(aux.clip_frac_dual, 0.25)
  # Sequence weight 2 doubles every advantage: the loss is piecewise linear in A → doubles.
  loss2, _, _ = _topk_loss_and_grad(GOLD_CUR, GOLD_OLD, GOLD_Q, GOLD_MASK, np.array([2.0]), True)
  np.testing.assert_allclose(loss2, 2 * 3.067270, rtol=1e-5)


@pytest.mark.parametrize("refresh", [True, False])
def test_topk_ppo_loss_matches_numpy_reference(refresh):
  b = _random_topk(seed=6)
  w = np.random.default_rng(6).uniform(0.2, 3.0, size=8).astype(np.float32)
  loss, aux, grad = _topk_loss_and_grad(b["s_cur"], b["s"], b["q"], b["mask"], w, refresh)
  ref = _np_topk_ppo(b["s_cur"], b["s"], b["q"], b["mask"], w, refresh)
  np.testing.assert_allclose(loss, ref, rtol=1e-4)
  assert np.all(np.isfinite(grad)) and 0 < float(aux.clip_frac) < 1


def test_topk_ppo_loss_on_policy_gradient():
  # One on-policy step (old = sg(cur), ρ = 1, no clip): ∂loss/∂s_cur = −A·m·w / N_tok.
  b = _random_topk(seed=7)
  w = np.linspace(0.5, 2.0, 8).astype(np.float32)
  cur = np.where(b["mask"][..., None] > 0, b["s_cur"], 0.0).astype(np.float32)
  loss, aux, grad = _topk_loss_and_grad(cur, cur, b["q"], b["mask"], w, True)
  adv = _np_topk_reward(cur, b["q"], b["mask"]) * b["mask"][..., None] * w[:, None, None]
  np.testing.assert_allclose(grad, -adv / b["mask"].sum(), rtol=1e-4, atol=1e-7)
  np.testing.assert_allclose(loss, -adv.sum() / b["mask"].sum(), rtol=1e-4)
  assert float(aux.clip_frac) == 0.0 and abs(float(aux.staleness_kl)) < 1e-6


def test_topk_ppo_loss_no_recompile():
  ones = np.ones(8, np.float32)
  sizes = []
  for seed in (8, 9):
    b = _random_topk(seed=seed)
    jax.block_until_ready(_topk_loss_and_grad(b["s_cur"], b["s"], b["q"], b["mask"], ones, True))
    sizes.append(_topk_loss_and_grad._cache_size())
  assert sizes[0] == sizes[1]  # the second step reused the compiled program


# ---------------------------------------------------------------------------------------------
# Domain weights (M1 + M2).
# ---------------------------------------------------------------------------------------------

# Golden batch: 4 sequences, domains [0, 0, 1, 2] (math, code, if), lengths [4, 2, 3, 1], N = 10.
#   tokens = [6, 3, 1] → o = [0.6, 0.3, 0.1];  target ⅓ each → base = [5/9, 10/9, 10/3].
#   |r| per token: 0.2 (domain 0, signs alternate), 0.1 (domain 1), 0.8 (domain 2)
#   → m = [0.2, 0.1, 0.8];  ref = Σ base·m / Σ base = (1/9 + 1/9 + 8/3)/5 = 26/45
#   → factor = m/ref = [9/26, 9/52, 18/13] (inside [0.05, 20])
#   → w ∝ base·m ∝ [1, 1, 24]; Σ w·tokens ∝ 6 + 3 + 24 = 33 → w = 10/33·[1, 1, 24].
GOLD_DW_MASK = np.array(
  [[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 0, 0]],
  np.float32,
)
GOLD_DW_IDS = np.array([0, 0, 1, 2], np.int32)
GOLD_DW_R = np.array(
  [[0.2, -0.2, 0.2, -0.2], [-0.2, 0.2, 7.0, 7.0], [0.1, -0.1, 0.1, 9.0], [-0.8, 5.0, 5.0, 5.0]],
  np.float32,
)
THIRDS = (1 / 3, 1 / 3, 1 / 3)

domain_weights = opd.domain_weights  # jitted


def _token_mean_weight(w, mask):
  lengths = np.asarray(mask).sum(-1)
  return float(np.sum(np.asarray(w) * lengths) / lengths.sum())


def test_domain_weights_golden():
  w = domain_weights(GOLD_DW_MASK, GOLD_DW_IDS, GOLD_DW_R, target_shares=THIRDS, alpha=1.0)
  np.testing.assert_allclose(w, np.array([1, 1, 1, 24]) * 10 / 33, rtol=1e-5)
  assert abs(_token_mean_weight(w, GOLD_DW_MASK) - 1.0) < 1e-6
  parts = opd.domain_weighting(
    opd.domain_token_stats(GOLD_DW_MASK, GOLD_DW_IDS, GOLD_DW_R, 3), target_shares=THIRDS
  )
  np.testing.assert_allclose(parts.token_share, [0.6, 0.3, 0.1], rtol=1e-6)
  np.testing.assert_allclose(parts.share_weight, [5 / 9, 10 / 9, 10 / 3], rtol=1e-5)
  np.testing.assert_allclose(parts.mean_abs_reward, [0.2, 0.1, 0.8], rtol=1e-5)
  np.testing.assert_allclose(parts.gap_factor, [9 / 26, 9 / 52, 18 / 13], rtol=1e-5)


def test_domain_weights_share_only_and_clipped_factor():
  # α = 0 (M1 only): w = base = [5/9, 10/9, 10/3], already of token-mean 1:
  # 6·5/9 + 3·10/9 + 1·10/3 = 10 = N.
  w = domain_weights(GOLD_DW_MASK, GOLD_DW_IDS, GOLD_DW_R, target_shares=THIRDS, alpha=0.0)
  np.testing.assert_allclose(w, [5 / 9, 5 / 9, 10 / 9, 10 / 3], rtol=1e-5)
  # clip_max = 1.2 caps the IF factor 18/13 → 6/5: base·factor = [5/26, 5/26, 4];
  # Σ·tokens = 45/26 + 4 = 149/26 → w = 260/149·[5/26, 5/26, 4] = [50, 50, 1040]/149.
  w = domain_weights(
    GOLD_DW_MASK, GOLD_DW_IDS, GOLD_DW_R, target_shares=THIRDS, alpha=1.0, clip_max=1.2
  )
  np.testing.assert_allclose(w, np.array([50, 50, 50, 1040]) / 149, rtol=1e-5)
  # No M1, α = 0: every weight 1.
  w = domain_weights(
    GOLD_DW_MASK, GOLD_DW_IDS, GOLD_DW_R, target_shares=THIRDS, alpha=0.0, balance_shares=False
  )
  np.testing.assert_allclose(w, 1.0, rtol=1e-6)


def test_domain_weights_mean_reference():
  # Project-page reference ref = mean(m) = 1.1/3: factor = 3m/1.1 = [0.5455, 0.2727, 2.1818];
  # nothing clipped, so the normalised weights equal the share-weighted version's.
  w = domain_weights(
    GOLD_DW_MASK, GOLD_DW_IDS, GOLD_DW_R, target_shares=THIRDS, alpha=1.0, reference="mean"
  )
  np.testing.assert_allclose(w, np.array([1, 1, 1, 24]) * 10 / 33, rtol=1e-5)
  parts = opd.domain_weighting(
    opd.domain_token_stats(GOLD_DW_MASK, GOLD_DW_IDS, GOLD_DW_R, 3),
    target_shares=THIRDS,
    reference="mean",
  )
  np.testing.assert_allclose(parts.gap_factor, np.array([0.2, 0.1, 0.8]) * 3 / 1.1, rtol=1e-5)
  with pytest.raises(ValueError, match="unknown reference"):
    opd.domain_weighting(opd.DomainStats(*(np.ones(3),) * 3), target_shares=THIRDS, reference="x")


@pytest.mark.parametrize("alpha", [0.5, 1.0, 2.0])
def test_domain_weights_match_reference_and_renormalise(alpha):
  b = _random_topk(seed=10, batch=16, num_domains=4)
  r = _np_topk_reward(b["s"], b["q"], b["mask"]).astype(np.float32)
  target = (0.4, 0.3, 0.2, 0.1)
  w = domain_weights(b["mask"], b["domains"], r, target_shares=target, alpha=alpha)
  ref = _np_domain_weights(b["mask"], b["domains"], r, target, alpha)
  np.testing.assert_allclose(w, ref, rtol=1e-4)
  assert abs(_token_mean_weight(w, b["mask"]) - 1.0) < 1e-5


def test_domain_weights_gap_factor_clip_bounds():
  # m = [1e-4, 1, 1e4]: (m/ref)^α spans far outside [0.05, 20] → clipped to the bounds.
  mask = np.ones((3, 2), np.float32)
  r = np.array([[1e-4, 1e-4], [1.0, 1.0], [1e4, 1e4]], np.float32)
  ids = np.array([0, 1, 2], np.int32)
  stats = opd.domain_token_stats(mask, ids, r, 3)
  parts = opd.domain_weighting(stats, target_shares=THIRDS, alpha=1.0)
  factor = np.asarray(parts.gap_factor)
  assert factor.min() >= 0.05 - 1e-7 and factor.max() <= 20.0 + 1e-5
  np.testing.assert_allclose(factor[0], 0.05, rtol=1e-6)
  # ref = mean(m) (equal shares) ≈ 3333.7 → m_2/ref ≈ 3.0 < 20; the low end is clipped.
  np.testing.assert_allclose(factor[2], 1e4 / ((1e-4 + 1 + 1e4) / 3), rtol=1e-4)
  parts = opd.domain_weighting(stats, target_shares=THIRDS, alpha=3.0)
  np.testing.assert_allclose(parts.gap_factor, [0.05, 0.05, 20.0], rtol=1e-6)
  w = np.asarray(parts.weight)
  np.testing.assert_allclose(w / w[0], [1, 1, 400], rtol=1e-5)  # same base, factors 0.05 / 20
  np.testing.assert_allclose(np.sum(w * 2) / 6, 1.0, rtol=1e-6)


def test_absent_domain_gives_no_nan():
  # Domain 1 is absent: targets are renormalised over {0, 2} (½ each), weight[1] = 0.
  b = _random_topk(seed=11, num_domains=3, absent=1)
  r = _np_topk_reward(b["s"], b["q"], b["mask"]).astype(np.float32)
  parts = opd.domain_weighting(
    opd.domain_token_stats(b["mask"], b["domains"], r, 3), target_shares=THIRDS
  )
  for field in parts:
    assert np.all(np.isfinite(field)), parts
  np.testing.assert_allclose(parts.target_share, [0.5, 0.0, 0.5], rtol=1e-6)
  assert float(parts.weight[1]) == 0.0 and float(parts.token_share[1]) == 0.0
  w = domain_weights(b["mask"], b["domains"], r, target_shares=THIRDS, alpha=1.0)
  assert abs(_token_mean_weight(w, b["mask"]) - 1.0) < 1e-5
  metrics = opd.domain_metrics(
    b["mask"], b["domains"], r, num_domains=3, old_topk_logp=b["s"], topk_logp=b["s_cur"]
  )
  for field in metrics:
    assert np.all(np.isfinite(field)) and float(field[1]) == 0.0


def test_degenerate_batches_give_no_nan():
  mask = np.array([[1, 1], [1, 0]], np.float32)
  ids = np.array([0, 1], np.int32)
  # All rewards 0 → ref = 0: no gap-following (factor 1), M1 weights only.
  w = domain_weights(mask, ids, np.zeros((2, 2), np.float32), target_shares=(0.5, 0.5))
  np.testing.assert_allclose(w, [0.75, 1.5], rtol=1e-6)  # base = ½/o, o = [⅔, ⅓]
  # An all-padding batch: weights are finite (zero) and nothing divides by zero.
  w = domain_weights(np.zeros((2, 2)), ids, np.ones((2, 2)), target_shares=(0.5, 0.5))
  assert np.all(np.isfinite(w))
  # A present domain with target 0 gets weight 0; if every present target is 0, uniform.
  w = domain_weights(mask, ids, np.ones((2, 2)), target_shares=(1.0, 0.0), alpha=0.0)
  np.testing.assert_allclose(w, [1.5, 0.0], rtol=1e-6)  # all 3 tokens' mass on domain 0
  w = domain_weights(mask, ids, np.ones((2, 2)), target_shares=(0.0, 0.0, 1.0), alpha=0.0)
  np.testing.assert_allclose(w, [0.75, 1.5], rtol=1e-6)


def test_unknown_domain_errors():
  with pytest.raises(ValueError, match=r"unknown domain label\(s\) 'chem', 'poetry'.*'math'"):
    opd.encode_domain_labels(["math", "poetry", "chem"], ("math", "code", "if"))
  np.testing.assert_array_equal(
    opd.encode_domain_labels(["if", "math"], ("math", "code", "if")), [2, 0]
  )
  with pytest.raises(ValueError, match=r"unknown domain id\(s\) -1, 5"):
    opd.check_domain_ids(np.array([0, 5, -1]), 3)
  with pytest.raises(ValueError, match="must be integers"):
    opd.check_domain_ids(np.array([0.0, 1.0]), 3)
  opd.check_domain_ids(np.array([0, 2, 1]), 3)


def test_domain_metrics_golden():
  # Golden batch, weights w = 10/33·[1, 1, 1, 24], rewards summed over a trailing K = 1 axis.
  # tokens [6, 3, 1] → token share [0.6, 0.3, 0.1]; prompts [2, 1, 1] → [0.5, 0.25, 0.25].
  # Σ|r| = [1.2, 0.3, 0.8]; budget = w·Σ|r| ∝ [1.2, 0.3, 19.2] → / 20.7.
  w = 10 / 33 * np.array([1, 1, 1, 24], np.float32)
  r3 = GOLD_DW_R[..., None]
  m = opd.domain_metrics(GOLD_DW_MASK, GOLD_DW_IDS, r3, num_domains=4, seq_weights=w)
  np.testing.assert_allclose(m.token_share, [0.6, 0.3, 0.1, 0.0], rtol=1e-6)
  np.testing.assert_allclose(m.prompt_share, [0.5, 0.25, 0.25, 0.0], rtol=1e-6)
  np.testing.assert_allclose(m.budget_share, np.array([1.2, 0.3, 19.2, 0]) / 20.7, rtol=1e-5)
  np.testing.assert_allclose(m.mean_abs_reward, [0.2, 0.1, 0.8, 0.0], rtol=1e-5)
  assert m.staleness_kl is None and m.clip_frac is None
  # Staleness / clip fraction on the hand-made top-K batch (one domain): as the loss's aux.
  r_old = opd.topk_opd_reward(GOLD_OLD, GOLD_Q, GOLD_MASK)
  m = opd.domain_metrics(
    GOLD_MASK, np.array([1]), r_old, num_domains=2, old_topk_logp=GOLD_OLD, topk_logp=GOLD_CUR
  )
  np.testing.assert_allclose(m.staleness_kl, [0.0, 0.111572], rtol=1e-5)
  # clipped pairs: pos 0 k1 (ρ 1.5 > 1.28, r > 0); pos 1 k1 (ρ 4 with r < 0) is not a clip.
  np.testing.assert_allclose(m.clip_frac, [0.0, 0.25], rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# Global statistics: micro-batches and 8 sharded devices reproduce the full batch.
# ---------------------------------------------------------------------------------------------


def _mesh():
  assert jax.device_count() == 8, "tests/conftest.py should give 8 fake CPU devices"
  return Mesh(np.array(jax.devices()), ("data",))


@jax.jit
def _weights_and_loss(cur, old, q, mask, ids):
  r = opd.topk_opd_reward(old, q, mask)
  w = opd.domain_weights(mask, ids, r, target_shares=THIRDS, alpha=1.0)
  (loss, aux), grad = jax.value_and_grad(
    lambda c: opd.opd_topk_ppo_loss(c, old, q, mask, seq_weights=w), has_aux=True
  )(cur)
  metrics = opd.domain_metrics(
    mask, ids, r, num_domains=3, seq_weights=w, old_topk_logp=old, topk_logp=cur
  )
  return w, loss, aux, grad, metrics


def _batch16():
  """16 rows (numpy), one of them empty, and the full-batch outputs on one device."""
  b = _random_topk(seed=12, batch=16)
  b["mask"][3] = 0.0
  args = [b[k] for k in ("s_cur", "s", "q", "mask", "domains")]
  return args, _weights_and_loss(*[jax.device_put(a, jax.devices()[0]) for a in args])


def test_sharded_batch_matches_single_device():
  args, single = _batch16()
  rows = NamedSharding(_mesh(), P("data"))
  sharded = [jax.device_put(a, rows) for a in args]
  assert len(sharded[0].sharding.device_set) == 8
  out = _weights_and_loss(*sharded)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), out, single)


@jax.jit
def _micro_stats(old, q, mask, ids):
  return opd.domain_token_stats(mask, ids, opd.topk_opd_reward(old, q, mask), 3)


@jax.jit
def _micro_step(cur, old, q, mask, ids, stats, num_tokens):
  w = opd.domain_weights_from_stats(stats, ids, target_shares=THIRDS, alpha=1.0)
  (loss, aux), grad = jax.value_and_grad(
    lambda c: opd.opd_topk_ppo_loss(c, old, q, mask, seq_weights=w, num_tokens=num_tokens),
    has_aux=True,
  )(cur)
  return w, loss, aux, grad


def test_micro_batches_with_global_stats_match_full_batch():
  args, (w_full, loss_full, aux_full, grad_full, _) = _batch16()
  micro = [[a[i : i + 4] for a in args] for i in range(0, 16, 4)]
  # Pass 1: per-micro-batch sums, added up (as a psum over devices would).
  parts = [_micro_stats(*m[1:]) for m in micro]
  stats = jax.tree.map(lambda *xs: sum(xs), *parts)
  num_tokens = np.sum(args[3])
  # Pass 2: each micro-batch with the global statistics.
  outs = [_micro_step(*m, stats, num_tokens) for m in micro]
  np.testing.assert_allclose(np.concatenate([o[0] for o in outs]), w_full, rtol=1e-6)
  np.testing.assert_allclose(sum(o[1] for o in outs), loss_full, rtol=1e-5)
  np.testing.assert_allclose(np.concatenate([o[3] for o in outs]), grad_full, rtol=1e-5, atol=1e-7)
  for field in ("clip_frac", "clip_frac_dual", "ratio_mean", "reward_mean", "staleness_kl"):
    np.testing.assert_allclose(
      sum(getattr(o[2], field) for o in outs), getattr(aux_full, field), rtol=1e-5, atol=1e-7
    )
  # Local statistics would give different weights (the micro-batches' shares differ).
  local = _micro_step(*micro[0], _micro_stats(*micro[0][1:]), num_tokens)[0]
  assert np.abs(np.asarray(local) - np.asarray(w_full[:4])).max() > 1e-3


def test_shard_map_with_psum_stats():
  args, full = _batch16()

  def local(cur, old, q, mask, ids):
    stats = jax.lax.psum(
      opd.domain_token_stats(mask, ids, opd.topk_opd_reward(old, q, mask), 3), "data"
    )
    num_tokens = jax.lax.psum(jnp.sum(mask), "data")
    w = opd.domain_weights_from_stats(stats, ids, target_shares=THIRDS, alpha=1.0)
    loss, _ = opd.opd_topk_ppo_loss(cur, old, q, mask, seq_weights=w, num_tokens=num_tokens)
    return w, jax.lax.psum(loss, "data")

  fn = jax.jit(
    jax.shard_map(local, mesh=_mesh(), in_specs=(P("data"),) * 5, out_specs=(P("data"), P()))
  )
  w, loss = fn(*args)
  np.testing.assert_allclose(w, full[0], rtol=1e-6)
  np.testing.assert_allclose(loss, full[1], rtol=1e-5)
