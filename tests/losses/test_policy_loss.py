"""policy_loss: golden values derived by hand, gradients, variants, sampler correction, metrics."""

import doctest
import functools

import jax
import jax.numpy as jnp
import jax.test_util
import numpy as np
import pytest

from jaxrl_post import losses
from jaxrl_post.losses import policy as policy_lib
from jaxrl_post.losses import policy_loss

# Golden batch [B=2, T=3]; old_logp = log 0.5 everywhere, logp = log(0.5·r):
#   row 0: r = [1.5, 0.5, 1.0], A = +1;   row 1: r = [1.1, 0.7, pad], A = −1.
RATIO = np.array([[1.5, 0.5, 1.0], [1.1, 0.7, 1.0]], np.float32)
OLD = np.full((2, 3), np.log(0.5), np.float32)
LOGP = (OLD + np.log(RATIO)).astype(np.float32)
ADV = np.array([1.0, -1.0], np.float32)
MASK = np.array([[1, 1, 1], [1, 1, 0]], np.float32)


@functools.partial(jax.jit, static_argnames=("kw",))
def _loss_and_grad(logp, old_logp, adv, mask, kw=(), **arrays):
  """value_and_grad w.r.t. logp of policy_loss; `kw` holds the static keyword settings."""
  fn = lambda lp: policy_loss(lp, old_logp, adv, mask, **dict(kw), **arrays)
  (loss, aux), grad = jax.value_and_grad(fn, has_aux=True)(logp)
  return loss, aux, grad


def run(logp=LOGP, old=OLD, adv=ADV, mask=MASK, **kw):
  arrays = {k: kw.pop(k) for k in list(kw) if k in ("ref_logp", "sampler_logp", "entropy")}
  return _loss_and_grad(logp, old, adv, mask, kw=tuple(sorted(kw.items())), **arrays)


def test_clip_golden_token_mean():
  # ε = 0.2. Row 0 (A=+1): L = −min(r, clip r) = [−1.2, −0.5, −1.0] (token 0 clipped high).
  # Row 1 (A=−1): L = max(r, clip r) = [1.1, 0.8] (token 1 clipped low).
  # token-mean: (−2.7 + 1.9) / 5 = −0.16.  (Bug check: no clip gives (−3 + 1.8)/5 = −0.24.)
  loss, aux, grad = run(loss_agg_mode="token-mean")
  np.testing.assert_allclose(loss, -0.16, rtol=1e-5)
  np.testing.assert_allclose(aux.pg_loss, -0.16, rtol=1e-5)
  # dL/dlogp = −A·r/N where not clipped, 0 where clipped; padding 0.
  np.testing.assert_allclose(grad, [[0.0, -0.1, -0.2], [0.22, 0.0, 0.0]], atol=1e-6)
  np.testing.assert_allclose([aux.clip_frac_low, aux.clip_frac_high, aux.clip_frac_dual],
                             [0.2, 0.2, 0.0], atol=1e-6)
  # Ratio stats over the 5 valid tokens: mean 4.8/5, min 0.5, max 1.5 (the pad's r=1 excluded).
  np.testing.assert_allclose([aux.ratio_mean, aux.ratio_min, aux.ratio_max], [0.96, 0.5, 1.5],
                             rtol=1e-5)
  assert aux.kl is None and aux.entropy is None and aux.sampler_weight_mean is None


def test_clip_golden_other_modes_and_clip_higher():
  # seq-mean-token-mean: (−2.7/3 + 1.9/2) / 2 = 0.025.
  np.testing.assert_allclose(run(loss_agg_mode="seq-mean-token-mean")[0], 0.025, atol=1e-6)
  # Dr.GRPO fixed denominator, L_max = 4: (−2.7 + 1.9) / (2·4) = −0.1.
  np.testing.assert_allclose(
      run(loss_agg_mode="seq-mean-token-sum-norm", max_tokens=4)[0], -0.1, rtol=1e-5)
  # Clip-higher ε_high = 0.28: token (0,0) becomes −1.28 → (−2.78 + 1.9) / 5 = −0.176.
  np.testing.assert_allclose(run(epsilon_high=0.28)[0], -0.176, rtol=1e-5)


def test_dual_clip():
  # One row, A = −1, r = [4, 2]: clip gives L = max(r, clip r) = [4, 2]; dual c = 3 caps the
  # first at −c·A = 3 → token-mean 2.5; gradient r·(−A)/N = [0 (capped), 2/2 = 1].
  logp = np.log(np.array([[0.4, 0.2]], np.float32))
  old = np.log(np.array([[0.1, 0.1]], np.float32))
  loss, aux, grad = run(logp, old, np.array([-1.0], np.float32), np.ones((1, 2), np.float32),
                        dual_clip_c=3.0)
  np.testing.assert_allclose(loss, 2.5, rtol=1e-5)
  np.testing.assert_allclose(grad, [[0.0, 1.0]], atol=1e-5)
  np.testing.assert_allclose(aux.clip_frac_dual, 0.5)
  with pytest.raises(ValueError, match="dual_clip_c must be > 1"):
    policy_loss(LOGP, OLD, ADV, MASK, dual_clip_c=0.5)


def test_gspo_sequence_ratio_golden():
  # s_0 = exp(mean(log[1.5, .5, 1])) = 0.75^(1/3) = 0.908560; s_1 = exp(mean(log[1.1, .7])) =
  # 0.77^(1/2) = 0.877496; both inside [0.8, 1.2] → L_i = −A_i·s_i on every token.
  # seq-mean-token-mean: (−0.908560 + 0.877496) / 2 = −0.015532.
  s0, s1 = 0.75 ** (1 / 3), 0.77**0.5
  loss, aux, grad = run(importance_sampling_level="sequence", loss_agg_mode="seq-mean-token-mean")
  np.testing.assert_allclose(loss, (-s0 + s1) / 2, rtol=1e-5)
  np.testing.assert_allclose(aux.ratio_min, s1, rtol=1e-5)
  # ∂/∂logp_{i,t} = (1/2)·(−A_i·s_i)/n_i: the gradient flows through the sequence mean.
  np.testing.assert_allclose(grad, [[-s0 / 6] * 3, [s1 / 4, s1 / 4, 0.0]], rtol=1e-5)
  # The registry's "gspo" entry uses the paper's ε = 3e-4 / 4e-4: row 0 (A > 0, s < 1) keeps the
  # unclipped −s_0; row 1 (A < 0) is clipped up to 1 − 3e-4 → (−0.908560 + 0.9997) / 2.
  gspo = jax.jit(lambda lp: losses.gspo_loss(lp, OLD, ADV, MASK)[0])
  np.testing.assert_allclose(gspo(LOGP), (-s0 + (1 - 3e-4)) / 2, rtol=1e-5)


def test_gspo_token_same_value_per_token_gradient():
  # Sequence-level advantages: GSPO and GSPO-token agree in value and gradient.
  kw = dict(loss_agg_mode="seq-mean-token-mean")
  seq = run(importance_sampling_level="sequence", **kw)
  tok = run(importance_sampling_level="sequence_token", **kw)
  np.testing.assert_allclose(seq[0], tok[0], rtol=1e-6)
  np.testing.assert_allclose(seq[2], tok[2], rtol=1e-5)
  # Per-token advantages A_t: GSPO-token's gradient on token t is −s_i·A_t/(n_i·B) (its own A),
  # GSPO's is −s_i·mean_t(A)/(n_i·B), the same on every token of the row.
  adv_t = np.array([[1.0, -2.0, 0.5], [0.3, 1.0, 9.0]], np.float32)
  s = np.array([0.75 ** (1 / 3), 0.77**0.5])[:, None]
  n = MASK.sum(1, keepdims=True)
  wide = dict(epsilon_low=0.5, epsilon_high=0.5, **kw)  # keep every s_i unclipped
  seq = run(adv=adv_t, importance_sampling_level="sequence", **wide)
  tok = run(adv=adv_t, importance_sampling_level="sequence_token", **wide)
  np.testing.assert_allclose(seq[0], tok[0], rtol=1e-6)
  np.testing.assert_allclose(tok[2], -s * adv_t * MASK / (n * 2), rtol=1e-5, atol=1e-7)
  mean_adv = (adv_t * MASK).sum(1, keepdims=True) / n
  np.testing.assert_allclose(seq[2], -s * mean_adv * MASK / (n * 2), rtol=1e-5, atol=1e-7)


def test_cispo_golden_and_gradient_survives_the_cap():
  # w = sg(min(r, 1.2)) = [[1.2, .5, 1], [1.1, .7]];  L = −w·A·logp with logp = log(0.5·r):
  #   row 0: −[1.2·log .75, .5·log .25, log .5] = [0.345221, 0.693147, 0.693147]
  #   row 1: +[1.1·log .55, .7·log .35]         = [−0.657625, −0.734875]
  # token-mean: 0.339015 / 5 = 0.067803.
  loss, aux, grad = run(objective="cispo", cispo_max_weight=1.2)
  np.testing.assert_allclose(loss, 0.067803, rtol=1e-4)
  # ∂L/∂logp = −w·A/N: even the capped token (0,0) keeps a gradient (unlike the clip objective).
  np.testing.assert_allclose(grad, [[-0.24, -0.1, -0.2], [0.22, 0.14, 0.0]], atol=1e-6)
  np.testing.assert_allclose(aux.clip_frac_high, 0.2)


def test_sapo_golden_and_unit_slope_at_ratio_one():
  # L = −σ(τ(r−1))·(4/τ)·A. Token (0,0): τ=1, r=1.5 → −4σ(0.5) = −2.489837.
  # Token (1,1): τ=1.05, r=0.7, A=−1 → σ(−0.315)·4/1.05 = 0.421895·3.809524 = 1.607219.
  loss, _, _ = run(objective="sapo")
  sig = lambda x: 1 / (1 + np.exp(-x))
  tau = np.where(ADV[:, None] > 0, 1.0, 1.05)
  per_token = -sig(tau * (RATIO - 1)) * 4 / tau * ADV[:, None]
  np.testing.assert_allclose(per_token[0, 0], -2.489837, rtol=1e-6)
  np.testing.assert_allclose(per_token[1, 1], 1.607219, rtol=1e-6)
  np.testing.assert_allclose(loss, (per_token * MASK).sum() / 5, rtol=1e-5)
  # At r = 1: σ'(0)·τ·(4/τ) = 1, so the gradient is the plain policy gradient −A/N for any τ.
  _, _, grad = run(logp=OLD, objective="sapo", sapo_tau_pos=3.0, sapo_tau_neg=7.0)
  np.testing.assert_allclose(grad, -ADV[:, None] * MASK / 5, rtol=1e-5)


def test_kl_term_and_metrics():
  # ref_logp = logp − 0.1 on every token, so log r = −0.1: k1 = 0.1, k2 = 0.005,
  # k3 = e^{−0.1} − 1 + 0.1 = 0.0048374; loss = pg + β·kl_loss with pg = −0.16 from above.
  ref = LOGP - np.float32(0.1)
  entropy = np.arange(6, dtype=np.float32).reshape(2, 3)
  for est, value in (("k1", 0.1), ("k2", 0.005), ("k3", np.exp(-0.1) - 0.9)):
    loss, aux, grad = run(ref_logp=ref, beta=0.5, kl_estimator=est, entropy=entropy)
    np.testing.assert_allclose(aux.kl_loss, value, rtol=1e-3)
    np.testing.assert_allclose(aux.kl, value, rtol=1e-3)
    np.testing.assert_allclose(loss, -0.16 + 0.5 * value, rtol=1e-4)
  # Entropy metric: token-mean of [0, 1, 2, 3, 4] = 2.
  np.testing.assert_allclose(aux.entropy, 2.0)
  # k3's gradient adds β·(1 − r_ref)/N with r_ref = e^{−0.1}.
  np.testing.assert_allclose(grad - run()[2], 0.5 * (1 - np.exp(-0.1)) / 5 * MASK, atol=1e-6)
  with pytest.raises(ValueError, match="beta != 0 needs ref_logp"):
    policy_loss(LOGP, OLD, ADV, MASK, beta=0.1)


def test_sampler_weights_golden():
  # Δ = old − sampler per token: row 0 [log 3, log .25, 0], row 1 [log 1.5, 0, pad].
  old = jnp.zeros((2, 3))
  sampler = -jnp.log(jnp.array([[3.0, 0.25, 1.0], [1.5, 1.0, 7.0]]))
  w = functools.partial(policy_lib.sampler_importance_weights, old, sampler, MASK)
  # token truncate at [0.5, 2]: [2, .5, 1], [1.5, 1, 0 (pad)].
  np.testing.assert_allclose(w(min_weight=0.5, max_weight=2.0),
                             [[2, 0.5, 1], [1.5, 1, 0]], rtol=1e-6)
  # token mask at [0.5, 2]: out-of-range → 0: [0, 0, 1], [1.5, 1, 0].
  np.testing.assert_allclose(w(correction="mask", min_weight=0.5, max_weight=2.0),
                             [[0, 0, 1], [1.5, 1, 0]], rtol=1e-6)
  # sequence level: ρ_i = exp(Σ_t Δ) = [3·.25·1 = .75, 1.5]; truncate at 1.2 → [.75, 1.2].
  np.testing.assert_allclose(w(level="sequence", max_weight=1.2),
                             [[0.75] * 3, [1.2, 1.2, 0]], rtol=1e-6)
  # sequence mask at max 1.2: row 1 dropped entirely.
  np.testing.assert_allclose(w(level="sequence", correction="mask", max_weight=1.2),
                             [[0.75] * 3, [0, 0, 0]], rtol=1e-6)


def test_sampler_correction_scales_pg_not_kl():
  sampler = OLD - np.log(np.array([[3.0, 0.25, 1.0], [1.5, 1.0, 1.0]], np.float32))
  ref = LOGP - np.float32(0.1)
  plain, plain_aux, _ = run(ref_logp=ref, beta=1.0, kl_estimator="k1")
  loss, aux, _ = run(ref_logp=ref, beta=1.0, kl_estimator="k1", sampler_logp=sampler,
                     sampler_max=2.0)
  # Per-token PG [[−1.2, −.5, −1], [1.1, .8]] × w [[2, .25, 1], [1.5, 1]] = −2.4 −.125 −1 +1.65
  # +.8 = −1.075 → /5 = −0.215; the KL part (0.1) is not reweighted.
  np.testing.assert_allclose(aux.pg_loss, -0.215, rtol=1e-5)
  np.testing.assert_allclose(aux.kl_loss, plain_aux.kl_loss, rtol=1e-6)
  np.testing.assert_allclose(loss - aux.pg_loss, plain - plain_aux.pg_loss, rtol=1e-5)
  np.testing.assert_allclose([aux.sampler_weight_min, aux.sampler_weight_max], [0.25, 2.0])


def test_vmap_over_beta():
  # β is an array argument (not static), so a KL-coefficient sweep vmaps in one program.
  betas = jnp.array([0.0, 0.1, 1.0])
  ref = LOGP - np.float32(0.1)
  fn = jax.jit(jax.vmap(lambda b: policy_loss(LOGP, OLD, ADV, MASK, ref_logp=ref, beta=b,
                                              kl_estimator="k1")[0]))
  np.testing.assert_allclose(fn(betas), -0.16 + 0.1 * betas, rtol=1e-5)


@pytest.mark.parametrize("kw", [
    dict(dual_clip_c=2.0, epsilon_high=0.28, beta=0.3, kl_estimator="k3"),
    dict(importance_sampling_level="sequence", loss_agg_mode="seq-mean-token-mean"),
    dict(objective="sapo", loss_agg_mode="seq-mean-token-sum-norm", beta=0.3, kl_estimator="k2"),
], ids=["clip_dual_k3", "gspo", "sapo_k2"])
def test_check_grads(rollout, kw):
  # Finite differences vs autodiff (float32, so loose tolerances); away from clip kinks the
  # piecewise-smooth losses are differentiable.
  r = rollout
  fn = jax.jit(lambda lp: policy_loss(lp, r["old_logp"], r["adv"], r["mask"],
                                      ref_logp=r["ref_logp"], **kw)[0])
  jax.test_util.check_grads(fn, (jnp.asarray(r["logp"]),), order=1, modes=["rev"], eps=1e-3,
                            atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("name", ["grpo", "gspo", "gspo_token", "cispo", "sapo"])
def test_padding_garbage_is_harmless(rollout, name):
  # −inf log-probs, NaN references and NaN advantages on padding leave loss and gradient finite
  # and equal to the clean batch's.
  r = rollout
  pad = r["mask"] == 0
  fn = losses.POLICY_LOSSES.get(name)

  @jax.jit
  def value_and_grad(logp, ref, adv_t):
    return jax.value_and_grad(lambda lp: fn(lp, r["old_logp"], adv_t, r["mask"], ref_logp=ref,
                                            beta=0.1, sampler_logp=r["sampler_logp"])[0])(logp)

  clean = value_and_grad(r["logp"], r["ref_logp"], r["adv_t"])
  dirty = value_and_grad(r["logp_padded"], np.where(pad, np.nan, r["ref_logp"]),
                         np.where(pad, np.nan, r["adv_t"]))
  np.testing.assert_allclose(dirty[0], clean[0], rtol=1e-6)
  np.testing.assert_allclose(dirty[1], clean[1], rtol=1e-6)
  assert np.all(dirty[1][pad] == 0)


def test_registry_and_fixed_settings():
  assert {'cispo', 'grpo', 'gspo', 'gspo_token', 'ppo', 'sapo'} <= set(losses.POLICY_LOSSES.names())
  assert losses.POLICY_LOSSES.get("ppo") is policy_loss
  with pytest.raises(KeyError, match="valid names: .*cispo, grpo, gspo"):
    losses.POLICY_LOSSES.get("vespo")
  with pytest.raises(ValueError, match="gspo fixes importance_sampling_level"):
    losses.gspo_loss(LOGP, OLD, ADV, MASK, importance_sampling_level="token")
  with pytest.raises(ValueError, match="unknown objective 'dpo'"):
    policy_loss(LOGP, OLD, ADV, MASK, objective="dpo")
  with pytest.raises(ValueError, match="unknown importance_sampling_level"):
    policy_loss(LOGP, OLD, ADV, MASK, importance_sampling_level="seq")


def test_doctests():
  assert doctest.testmod(policy_lib).failed == 0
