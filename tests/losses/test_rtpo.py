"""RTPO losses (arXiv 2608.18682): sibling advantages, the turn-k loss, the off-policy weight."""

import doctest

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_post import advantages, losses
from jaxrl_post.losses import rtpo


def test_doctests():
  assert doctest.testmod(rtpo, raise_on_error=False).failed == 0


def test_found_by_name_next_to_the_library_registries():
  assert rtpo.advantage_fn("rtpo") is rtpo.sibling_advantages
  assert rtpo.policy_loss_fn("rtpo") is rtpo.rtpo_turn_loss
  assert rtpo.advantage_fn("grpo") is advantages.ADVANTAGES.get("grpo")
  assert rtpo.policy_loss_fn("grpo") is losses.POLICY_LOSSES.get("grpo")
  # The library-wide registries are left as they are (their names are pinned elsewhere).
  assert "rtpo" not in advantages.ADVANTAGES and "rtpo" not in losses.POLICY_LOSSES
  with pytest.raises(KeyError, match="valid names: .*grpo.*rtpo"):
    rtpo.policy_loss_fn("rtp0")
  with pytest.raises(KeyError, match="unknown advantage 'x'"):
    rtpo.advantage_fn("x")


# ---- sibling advantages ----

# Two boundaries with G − 1 = 3 siblings each, rows interleaved.
REWARDS = np.array([1.0, 1.0, 0.0, 1.0, 0.0, 1.0], np.float32)
GROUPS = np.array([0, 1, 0, 1, 0, 1], np.int32)


def test_sibling_advantage_golden():
  # Boundary 0: R = [1, 0, 0], V̂ = 1/3 → A = [2/3, −1/3, −1/3]. Boundary 1: R = [1, 1, 1] → 0.
  # Bug checks: GRPO's std would give [1.155, −0.577, −0.577]; leave-one-out (RLOO)
  # [1, −0.5, −0.5].
  adv = jax.jit(rtpo.sibling_advantages, static_argnames="num_groups")(
    REWARDS, GROUPS, num_groups=2)
  np.testing.assert_allclose(adv, [2 / 3, 0, -1 / 3, 0, -1 / 3, 0], atol=1e-6)


def test_sibling_advantage_vmap_and_two_siblings():
  # With two siblings A = ±(R_1 − R_2)/2; each row of the vmapped batch is one sweep.
  rewards = jnp.array([[1.0, 0.0], [0.0, 0.0], [0.25, 0.75]])
  adv = jax.vmap(lambda r: rtpo.sibling_advantages(r, jnp.array([0, 0]), num_groups=1))(rewards)
  np.testing.assert_allclose(adv, [[0.5, -0.5], [0.0, 0.0], [-0.25, 0.25]], atol=1e-6)


def test_sibling_advantage_expectation_is_shrunk_by_g_minus_2_over_g_minus_1():
  # E[Â_j | R_j] = R_j − (R_j + (G−2)·E[R]) / (G−1) = ((G−2)/(G−1))·(R_j − E[R]) (spec §2.3).
  # Exact over all outcomes of G−1 = 3 Bernoulli(p) siblings: condition on R_0 = 1.
  p, g = 0.3, 4
  expected = 0.0
  for r1 in (0.0, 1.0):
    for r2 in (0.0, 1.0):
      prob = (p if r1 else 1 - p) * (p if r2 else 1 - p)
      adv = rtpo.sibling_advantages(jnp.array([1.0, r1, r2]), jnp.zeros(3, jnp.int32))
      expected += prob * float(adv[0])
  np.testing.assert_allclose(expected, (g - 2) / (g - 1) * (1.0 - p), atol=1e-6)


def test_boundary_signal_and_missing_rewards():
  signal = rtpo.boundary_has_signal(REWARDS, GROUPS, num_groups=2)
  assert signal.tolist() == [True, False]
  # A NaN (missing) reward is ignored; a boundary with one valid sibling has no signal.
  rewards = jnp.array([1.0, jnp.nan, 0.0, jnp.nan, 1.0, 1.0])
  groups = jnp.array([0, 0, 1, 1, 2, 2])
  assert rtpo.boundary_has_signal(rewards, groups, num_groups=3).tolist() == [False, False, False]


# ---- the turn-k loss ----

# Batch [B=3, T=4]; old_logp = log 0.5, logp = log(0.5·r); the trained turn is k = 2.
#   row 0: turn_ids [2, 2, 2, −1 (pad)],  r = [1.5, 1.0, 0.5, 1],   A = +1
#   row 1: turn_ids [1, 1, 2, 2],         r = [3.0, 3.0, 1.1, 0.7], A = −1  (turn-1 tokens!)
#   row 2: turn_ids [2, −1, −1, −1],      r = [1.1, 1, 1, 1],       A = +0.5
RATIO = np.array([[1.5, 1.0, 0.5, 1.0], [3.0, 3.0, 1.1, 0.7], [1.1, 1.0, 1.0, 1.0]], np.float32)
OLD = np.full((3, 4), np.log(0.5), np.float32)
LOGP = (OLD + np.log(RATIO)).astype(np.float32)
ADV = np.array([1.0, -1.0, 0.5], np.float32)
MASK = np.array([[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]], bool)
TURN_IDS = np.array([[2, 2, 2, -1], [1, 1, 2, 2], [2, -1, -1, -1]], np.int32)


@jax.jit
def _loss_and_grad(logp, old_logp, adv, mask, turn_ids, turn, weight):
  fn = lambda lp: rtpo.rtpo_turn_loss(lp, old_logp, adv, mask, turn_ids=turn_ids, turn=turn,
                                      weight=weight)
  (loss, aux), grad = jax.value_and_grad(fn, has_aux=True)(logp)
  return loss, aux, grad


def test_turn_loss_golden_and_gradient_mask():
  # Per token L = −min(r·A, clip(r, 0.8, 1.2)·A), turn-2 tokens only:
  #   row 0: −1.2 (clipped), −1.0, −0.5 → mean −0.9
  #   row 1: 1.1, 0.8 (clipped; r = 0.7 < 0.8 with A < 0) → mean 0.95   (its turn-1 tokens out)
  #   row 2: −0.55 → mean −0.55
  # seq-mean-token-mean (Eq. 6): (−0.9 + 0.95 − 0.55) / 3 = −1/6.
  # Bug check: training row 1's turn-1 tokens too gives row 1 (3 + 3 + 1.1 + 0.8)/4 = 1.975.
  loss, aux, grad = _loss_and_grad(LOGP, OLD, ADV, MASK, TURN_IDS, jnp.int32(2), None)
  np.testing.assert_allclose(loss, -1 / 6, rtol=1e-5)
  # dL/dlogp = −A·r / (N_seq·T_i) on unclipped turn-2 tokens, exactly 0 elsewhere:
  #   row 0: [0 (clipped), −1/9, −0.5/9, 0];  row 1: [0, 0, 1.1/6, 0 (clipped)];
  #   row 2: [−0.5·1.1/3, 0, 0, 0].
  expected = [[0.0, -1 / 9, -0.5 / 9, 0.0], [0.0, 0.0, 1.1 / 6, 0.0], [-0.55 / 3, 0.0, 0.0, 0.0]]
  np.testing.assert_allclose(grad, expected, atol=1e-6)
  assert np.all(np.asarray(grad)[TURN_IDS != 2] == 0.0)  # not one other token gets gradient
  # Clip fractions are token means over the 6 turn-2 tokens: one clipped low, one high.
  np.testing.assert_allclose([aux.clip_frac_low, aux.clip_frac_high], [1 / 6, 1 / 6], atol=1e-6)


def test_turn_loss_per_row_turn_weights_and_registry_call():
  # A per-row turn equal to 2 everywhere is the same loss; weights ω = [1, 2, 0.5] scale each
  # row's term: (−0.9 + 2·0.95 − 0.5·0.55) / 3 = 0.725 / 3.
  turn = jnp.array([2, 2, 2])
  loss, _, _ = _loss_and_grad(LOGP, OLD, ADV, MASK, TURN_IDS, turn, None)
  np.testing.assert_allclose(loss, -1 / 6, rtol=1e-5)
  weight = jnp.array([1.0, 2.0, 0.5])
  loss, _, grad = _loss_and_grad(LOGP, OLD, ADV, MASK, TURN_IDS, turn, weight)
  np.testing.assert_allclose(loss, 0.725 / 3, rtol=1e-5)
  np.testing.assert_allclose(grad[1, 2], 2 * 1.1 / 6, rtol=1e-5)
  # Training turn 1 in row 1 instead: its tokens have r = 3 and A < 0, where PPO's clip does
  # not bind (max(3, 1.2) = 3): row 1 = (3 + 3)/2 → (−0.9 + 3 − 0.55)/3.
  loss, _, grad = _loss_and_grad(LOGP, OLD, ADV, MASK, TURN_IDS, jnp.array([2, 1, 2]), None)
  np.testing.assert_allclose(loss, 1.55 / 3, rtol=1e-5)
  assert np.all(np.asarray(grad)[1, 2:] == 0.0)
  # Through the registry, with the keywords the trainer passes.
  fn = rtpo.policy_loss_fn("rtpo")
  loss, _ = fn(LOGP, OLD, ADV, MASK, turn_ids=TURN_IDS, turn=2, epsilon_low=0.2,
               epsilon_high=0.2, beta=0.0, kl_estimator="k3", ref_logp=None, entropy=None)
  np.testing.assert_allclose(loss, -1 / 6, rtol=1e-5)
  with pytest.raises(ValueError, match="turn_ids needs turn"):
    rtpo.rtpo_turn_loss(LOGP, OLD, ADV, MASK, turn_ids=TURN_IDS)
  with pytest.raises(ValueError, match="clip objective"):
    rtpo.rtpo_turn_loss(LOGP, OLD, ADV, MASK, objective="cispo")


def test_turn_loss_micro_batches_add_up_with_global_normalisers():
  # DESIGN §2.3: normalisers of the whole batch's turn-k mask make micro-batches additive.
  turn_mask = rtpo.turn_token_mask(MASK, TURN_IDS, 2)
  norm = losses.loss_normalizers(turn_mask)
  full, _, full_grad = _loss_and_grad(LOGP, OLD, ADV, MASK, TURN_IDS, jnp.int32(2), None)
  total, grads = 0.0, []
  for rows in ([0], [1, 2]):
    fn = lambda lp, rows=rows: rtpo.rtpo_turn_loss(
      lp, OLD[rows], ADV[rows], MASK[rows], turn_ids=TURN_IDS[rows], turn=2,
      num_tokens=norm.num_tokens, num_sequences=norm.num_sequences)[0]
    value, grad = jax.jit(jax.value_and_grad(fn))(LOGP[rows])
    total += float(value)
    grads.append(grad)
  np.testing.assert_allclose(total, full, rtol=1e-5)
  np.testing.assert_allclose(np.concatenate(grads), full_grad, atol=1e-7)


def test_turn_loss_paper_log_ratio_clamp_and_kl():
  # RTPO's settings (arXiv 2608.18682, appendix): log-ratio clamped to [−10, 10], β = 0.02 k3 KL.
  # One turn-0 token with A = −1 and log r = 12: for A < 0 PPO takes max(r, clip r)·|A|, so the
  # upper clip does not bind and the loss is r = e^12 unclamped, e^10 clamped (no gradient there).
  logp, old = jnp.array([[12.0 - 1.0]]), jnp.array([[-1.0]])
  adv, mask = jnp.array([-1.0]), jnp.ones((1, 1))

  def loss_and_grad(**kw):
    fn = lambda lp: rtpo.rtpo_turn_loss(lp, old, adv, mask, **kw)[0]
    return jax.value_and_grad(fn)(logp)

  value, grad = loss_and_grad()
  np.testing.assert_allclose(value, np.exp(12.0), rtol=1e-5)
  value, grad = loss_and_grad(max_log_ratio=10.0)
  np.testing.assert_allclose(value, np.exp(10.0), rtol=1e-5)
  assert float(grad[0, 0]) == 0.0
  # Inside the band the clamp changes nothing: the golden loss of the batch above.
  clamped, _, _ = _loss_and_grad(LOGP, OLD, ADV, MASK, TURN_IDS, jnp.int32(2), None)
  value = rtpo.rtpo_turn_loss(LOGP, OLD, ADV, MASK, turn_ids=TURN_IDS, turn=2,
                              max_log_ratio=10.0)[0]
  np.testing.assert_allclose(value, clamped, rtol=1e-6)
  # KL: + β·mean k3, k3 = e^(ref − logp) − (ref − logp) − 1 on the same turn-k tokens
  # (seq-mean-token-mean). With ref = logp − 0.5 on every token: k3 = e^−0.5 + 0.5 − 1.
  ref = LOGP - 0.5
  k3 = np.exp(-0.5) + 0.5 - 1.0
  value, aux = rtpo.rtpo_turn_loss(LOGP, OLD, ADV, MASK, turn_ids=TURN_IDS, turn=2,
                                   ref_logp=ref, beta=0.02, kl_estimator="k3")
  np.testing.assert_allclose(value, -1 / 6 + 0.02 * k3, rtol=1e-5)
  np.testing.assert_allclose(aux.kl, k3, rtol=1e-5)


def test_skipping_zero_advantage_rows_keeps_the_gradient_with_full_normalisers():
  # Skipping zero-advantage siblings leaves the gradient unchanged only when the
  # kept rows are normalised by the FULL batch's counts. Append two zero-advantage rows.
  logp = jnp.concatenate([LOGP, LOGP[:2] - 0.3])
  old = jnp.concatenate([OLD, OLD[:2]])
  adv = jnp.concatenate([ADV, jnp.zeros(2)])
  mask = jnp.concatenate([MASK, MASK[:2]])
  turn_ids = jnp.concatenate([TURN_IDS, TURN_IDS[:2]])
  norm = losses.loss_normalizers(rtpo.turn_token_mask(mask, turn_ids, 2))

  def grad(rows, **kw):
    fn = lambda lp: rtpo.rtpo_turn_loss(lp, old[rows], adv[rows], mask[rows],
                                        turn_ids=turn_ids[rows], turn=2, **kw)[0]
    return np.asarray(jax.grad(fn)(logp[rows]))

  full = grad(np.arange(5))
  np.testing.assert_array_equal(full[3:], 0.0)  # zero-advantage rows: exactly no gradient
  kept = grad(np.arange(3), num_tokens=norm.num_tokens, num_sequences=norm.num_sequences)
  np.testing.assert_allclose(kept, full[:3], atol=1e-7)
  # Normalised by the kept rows only, the gradient is scaled by 5 / 3 = 1 / (1 − 2/5).
  np.testing.assert_allclose(grad(np.arange(3)), full[:3] * 5 / 3, rtol=1e-5, atol=1e-7)


def test_turn_loss_vmap_over_stacked_batches():
  # Two independent batches (the second with flipped advantages) in one vmapped call.
  fn = lambda lp, adv: rtpo.rtpo_turn_loss(lp, OLD, adv, MASK, turn_ids=TURN_IDS, turn=2)[0]
  loss = jax.jit(jax.vmap(fn))(jnp.stack([LOGP, LOGP]), jnp.stack([ADV, -ADV]))
  # Flipped, row 0 (A = −1): max(r, clip r) = 1.5, 1.0, 0.8 → 1.1; row 1 (A = +1):
  # −min(r, clip r) = −1.1, −0.7 → −0.9; row 2 (A = −0.5): 0.5·1.1 = 0.55.
  np.testing.assert_allclose(loss, [-1 / 6, (1.1 - 0.9 + 0.55) / 3], rtol=1e-5)


# ---- the off-policy continuation weight ----


def test_off_policy_weight_golden_clamp_and_mask():
  # Sibling rows hold their continuation turns' tokens; observations / padding are masked out.
  #   row 0: ratios 1.2 · 1.1 (a masked token with ratio 9 ignored) → 1.32
  #   row 1: ratios 3 · 2 → 6 → clamped to ρ_max = 2
  #   row 2: ratio 0.25 → clamped to ρ_min = 0.5
  #   row 3: no continuation (ended at turn k) → clamp(1) = 1
  behaviour = np.full((4, 3), np.log(0.1), np.float32)
  ratios = np.array([[1.2, 1.1, 9.0], [3.0, 2.0, 1.0], [0.25, 1.0, 1.0], [5.0, 5.0, 5.0]])
  logp = (behaviour + np.log(ratios)).astype(np.float32)
  mask = np.array([[1, 1, 0], [1, 1, 0], [1, 0, 0], [0, 0, 0]], bool)
  weight = rtpo.off_policy_continuation_weight(logp, behaviour, mask)
  np.testing.assert_allclose(weight, [1.32, 2.0, 0.5, 1.0], rtol=1e-5)
  # Wider bounds leave the product itself.
  wide = rtpo.off_policy_continuation_weight(logp, behaviour, mask, rho_min=0.0, rho_max=10.0)
  np.testing.assert_allclose(wide, [1.32, 6.0, 0.25, 1.0], rtol=1e-5)
  # No gradient flows through the weight.
  grad = jax.grad(lambda lp: jnp.sum(rtpo.off_policy_continuation_weight(lp, behaviour, mask,
                                                                         rho_max=10.0)))(logp)
  assert np.all(np.asarray(grad) == 0.0)
  with pytest.raises(ValueError, match="rho_min <= rho_max"):
    rtpo.off_policy_continuation_weight(logp, behaviour, mask, rho_min=2.0, rho_max=1.0)


def test_off_policy_weight_long_continuation_does_not_overflow():
  # 2000 tokens with log-ratio 1 each: the product e^2000 overflows float32, its clamp does not.
  logp, behaviour, mask = jnp.ones((2, 2000)), jnp.zeros((2, 2000)), jnp.ones((2, 2000))
  one_row = lambda a, b, m: rtpo.off_policy_continuation_weight(a[None], b[None], m[None])[0]
  weight = jax.vmap(one_row)(logp, behaviour, mask)
  np.testing.assert_allclose(weight, [2.0, 2.0])
  weight = rtpo.off_policy_continuation_weight(-logp, behaviour, mask, rho_min=0.0)
  np.testing.assert_allclose(weight, [0.0, 0.0])
