"""Parity with the TRL and Tunix GRPO losses (anchor_frameworks.md §e).

Each anchor's loss is re-implemented below in plain numpy from the spec text (§e.1 TRL, §e.2
Tunix), independently of jaxrl_post, and compared with `policy_loss` under the settings that
§e.3 maps it to:

  TRL loss_type / option            jaxrl_post settings
  grpo                              loss_agg_mode="seq-mean-token-mean"
  bnpo (no grad. accumulation)      "token-mean"
  dapo (num_items_in_batch)         "token-mean", num_tokens=num_items_in_batch
  dr_grpo                           "seq-mean-token-sum-norm", max_tokens=max_completion_length
  cispo                             objective="cispo", cispo_max_weight=epsilon_high, token-mean
  sapo                              objective="sapo", "seq-mean-token-mean"
  delta=δ (δ ≥ 1+ε_high)            dual_clip_c=δ
  importance_sampling_level=seq     importance_sampling_level="sequence"
  vLLM IS {token,sequence}_{truncate,mask}, C_min/C_max
                                    sampler_level / sampler_correction / sampler_min / sampler_max
  beta (always k3)                  beta, kl_estimator="k3"

  Tunix                             jaxrl_post settings
  token-mean                        "token-mean"
  sequence-mean-token-mean          "seq-mean-token-mean" (default N_seq = non-empty rows)
  sequence-mean-token-scale         "seq-mean-token-sum-norm" (default L_max = padded width)
  seq-mean-token-sum                "seq-mean-token-sum"
  sequence-mean-token-sum-norm      "seq-mean-token-sum", num_sequences=batch size
  loss_algo="gspo-token"            importance_sampling_level="sequence_token"
  epsilon_c                         dual_clip_c
  sampler_is="token" (cap 2.0)      sampler_level="token", "truncate", sampler_max=2.0
  kl_loss_mode kl/mse_kl/low_var_kl kl_estimator k1/k2/k3
  ±20 log-ratio clamp               max_log_ratio=20
  gradient accumulation (Σ numerators / Σ denominators)
                                    Σ of micro-batch losses with the global normalisers
"""

import functools

import jax
import numpy as np
import pytest

from jaxrl_post.losses import loss_normalizers, policy_loss

# ------------------------------------------------------------------------------------------------
# Independent numpy references.


def _sigmoid(x):
  return 1.0 / (1.0 + np.exp(-x))


def trl_loss(lp, lp_old, lp_ref, adv, m, *, loss_type, eps_low=0.2, eps_high=0.2, delta=None,
             level="token", beta=0.0, max_completion_length=None, num_items_in_batch=None,
             num_processes=1, ga=1, lp_sampler=None, is_mode=None, is_min=None, is_max=3.0,
             tau_pos=1.0, tau_neg=1.05):
  """TRL `_compute_loss` for one micro-batch, as described in anchor_frameworks.md §e.1."""
  lp, lp_old, m = (np.asarray(x, np.float64) for x in (lp, lp_old, m))
  a = np.asarray(adv, np.float64)[:, None]
  ell = lp - lp_old
  if level == "token":
    w = ell
  else:
    w = (m * ell).sum(-1, keepdims=True) / np.maximum(m.sum(-1, keepdims=True), 1.0)
  r = np.exp(w)
  if loss_type in ("grpo", "bnpo", "dr_grpo", "dapo"):
    r_clip = np.clip(r, 1 - eps_low, 1 + eps_high)
    r1 = np.minimum(r, delta) if delta is not None else r
    per_token = -np.minimum(r1 * a, r_clip * a)
  elif loss_type == "cispo":
    per_token = -np.minimum(r, eps_high) * a * lp
  elif loss_type == "sapo":
    tau = np.where(a > 0, tau_pos, tau_neg)
    per_token = -_sigmoid(tau * (r - 1)) * (4 / tau) * a
  if is_mode is not None:  # vLLM importance sampling, e.g. "sequence_mask"
    d = (lp_old - np.asarray(lp_sampler, np.float64)) * m
    rho = np.exp(d) if is_mode.startswith("token") else np.exp(d.sum(-1, keepdims=True))
    lo = -np.inf if is_min is None else is_min
    if is_mode.endswith("truncate"):
      rho = np.clip(rho, lo, is_max)
    else:
      rho = np.where((rho < lo) | (rho > is_max), 0.0, rho)
    per_token = per_token * rho
  if beta != 0.0:
    x = np.asarray(lp_ref, np.float64) - lp
    per_token = per_token + beta * (np.exp(x) - x - 1)
  if loss_type in ("grpo", "sapo"):
    return ((per_token * m).sum(-1) / np.maximum(m.sum(-1), 1.0)).mean() / ga
  if loss_type == "bnpo":
    return (per_token * m).sum() / max(m.sum(), 1.0) / ga
  if loss_type == "dr_grpo":
    return (per_token * m).sum() / (per_token.shape[0] * max_completion_length) / ga
  return (per_token * m).sum() / (num_items_in_batch / num_processes)  # dapo, cispo


def tunix_loss_parts(lp, lp_old, lp_ref, adv, m, *, loss_agg_mode, eps=0.2, eps_high=None,
                     eps_c=None, loss_algo="grpo", beta=0.0, kl_loss_mode="kl",
                     lp_sampler=None, norm=None):
  """Tunix `grpo_loss_fn` as (numerator, denominator), as in anchor_frameworks.md §e.2."""
  lp, lp_old, m = (np.asarray(x, np.float64) for x in (lp, lp_old, m))
  a = np.asarray(adv, np.float64)[:, None]
  ell = np.clip(lp - lp_old, -20, 20)
  if loss_algo == "gspo-token":  # value = per-sequence masked mean (gradient aside)
    s = (ell * m).sum(-1, keepdims=True) / np.maximum(m.sum(-1, keepdims=True), 1.0)
    ell = np.minimum(np.broadcast_to(s, ell.shape), 10.0)
  r = np.exp(ell)
  eps_high = eps if eps_high is None else eps_high
  per_token = np.maximum(-a * r, -a * np.clip(r, 1 - eps, 1 + eps_high))
  if eps_c is not None:
    per_token = np.where(a < 0, np.minimum(per_token, -eps_c * a), per_token)
  if lp_sampler is not None:
    d = np.clip(lp_old - np.asarray(lp_sampler, np.float64), -20, 20)
    per_token = per_token * np.minimum(np.exp(d), 2.0) * m

  def agg(x):
    n_i = m.sum(-1)
    non_empty = float((n_i > 0).sum())
    if loss_agg_mode == "token-mean":
      return (x * m).sum(), m.sum()
    if loss_agg_mode == "sequence-mean-token-mean":
      return ((x * m).sum(-1) / np.maximum(n_i, 1.0)).sum(), non_empty
    if loss_agg_mode == "sequence-mean-token-scale":
      return ((x * m).sum(-1) / (m.shape[1] if norm is None else norm)).sum(), non_empty
    if loss_agg_mode == "seq-mean-token-sum":
      return (x * m).sum(), non_empty
    if loss_agg_mode == "sequence-mean-token-sum-norm":
      return (x * m).sum(), float(m.shape[0] if norm is None else norm)
    raise ValueError(loss_agg_mode)

  num, den = agg(per_token)
  if lp_ref is not None and beta != 0.0:
    diff = lp - np.asarray(lp_ref, np.float64)
    kl = {"kl": diff, "mse_kl": 0.5 * diff**2, "low_var_kl": np.exp(-diff) + diff - 1}
    num = num + beta * agg(kl[kl_loss_mode])[0]
  return num, den


# ------------------------------------------------------------------------------------------------
# jaxrl_post side (jitted; `kw` static).


@functools.partial(jax.jit, static_argnames=("kw",))
def _ours(logp, old_logp, adv, mask, ref_logp, sampler_logp, num_tokens, num_sequences, kw):
  kw = dict(kw)
  if not kw.pop("use_sampler", False):
    sampler_logp = None
  loss, _ = policy_loss(logp, old_logp, adv, mask, ref_logp=ref_logp, sampler_logp=sampler_logp,
                        num_tokens=num_tokens, num_sequences=num_sequences, **kw)
  return loss


def ours(r, sl=slice(None), num_tokens=None, num_sequences=None, **kw):
  return float(_ours(r["logp"][sl], r["old_logp"][sl], r["adv"][sl], r["mask"][sl],
                     r["ref_logp"][sl], r["sampler_logp"][sl], num_tokens, num_sequences,
                     tuple(sorted(kw.items()))))


def trl(r, sl=slice(None), **kw):
  return trl_loss(r["logp"][sl], r["old_logp"][sl], r["ref_logp"][sl], r["adv"][sl],
                  r["mask"][sl], lp_sampler=r["sampler_logp"][sl], **kw)


def tunix(r, sl=slice(None), **kw):
  return tunix_loss_parts(r["logp"][sl], r["old_logp"][sl], r["ref_logp"][sl], r["adv"][sl],
                          r["mask"][sl], lp_sampler=r["sampler_logp"][sl] if kw.pop(
                              "use_sampler", False) else None, **kw)


RTOL = 2e-5  # float32 (ours) against float64 (references)


def test_fixture_exercises_every_branch(rollout):
  # The comparisons below only mean something if the batch hits each clip / cap / mask branch.
  r, m = rollout, rollout["mask"] > 0
  ratio = np.exp(r["logp"] - r["old_logp"])[m]
  adv = np.broadcast_to(r["adv"][:, None], m.shape)[m]
  sampler = np.exp(r["old_logp"] - r["sampler_logp"])[m]
  assert ((ratio > 1.28) & (adv > 0)).any() and ((ratio < 0.8) & (adv < 0)).any()
  assert ((ratio > 3.0) & (adv < 0)).any() and (ratio > 1.3).any()
  assert (sampler < 0.8).any() and (sampler > 2.0).any()


# ------------------------------------------------------------------------------------------------
# TRL.


@pytest.mark.parametrize("trl_kw, our_kw", [
    (dict(loss_type="grpo"), dict(loss_agg_mode="seq-mean-token-mean")),
    (dict(loss_type="bnpo"), dict(loss_agg_mode="token-mean")),
    (dict(loss_type="dr_grpo", max_completion_length=16),
     dict(loss_agg_mode="seq-mean-token-sum-norm", max_tokens=16)),
    (dict(loss_type="grpo", eps_high=0.28, delta=2.0, beta=0.04),
     dict(loss_agg_mode="seq-mean-token-mean", epsilon_high=0.28, dual_clip_c=2.0, beta=0.04,
          kl_estimator="k3")),
    (dict(loss_type="grpo", level="sequence"),
     dict(loss_agg_mode="seq-mean-token-mean", importance_sampling_level="sequence")),
    (dict(loss_type="sapo"), dict(loss_agg_mode="seq-mean-token-mean", objective="sapo")),
    (dict(loss_type="bnpo", is_mode="token_truncate", is_min=0.8, is_max=1.5),
     dict(loss_agg_mode="token-mean", use_sampler=True, sampler_min=0.8, sampler_max=1.5)),
    (dict(loss_type="bnpo", is_mode="token_mask", is_max=1.3),
     dict(loss_agg_mode="token-mean", use_sampler=True, sampler_correction="mask",
          sampler_max=1.3)),
    (dict(loss_type="grpo", is_mode="sequence_mask", is_max=1.3),
     dict(loss_agg_mode="seq-mean-token-mean", use_sampler=True, sampler_level="sequence",
          sampler_correction="mask", sampler_max=1.3)),
    (dict(loss_type="grpo", is_mode="sequence_truncate", is_max=1.2),
     dict(loss_agg_mode="seq-mean-token-mean", use_sampler=True, sampler_level="sequence",
          sampler_max=1.2)),
], ids=["grpo", "bnpo", "dr_grpo", "clip_higher_delta_k3", "gspo", "sapo", "tis_token",
        "mis_token", "mis_sequence", "tis_sequence"])
def test_trl_single_batch(rollout, trl_kw, our_kw):
  np.testing.assert_allclose(ours(rollout, **our_kw), trl(rollout, **trl_kw), rtol=RTOL)


@pytest.mark.parametrize("trl_kw, our_kw", [
    (dict(loss_type="dapo", eps_high=0.28), dict(loss_agg_mode="token-mean", epsilon_high=0.28)),
    (dict(loss_type="cispo", eps_high=1.3),
     dict(loss_agg_mode="token-mean", objective="cispo", cispo_max_weight=1.3)),
], ids=["dapo", "cispo"])
def test_trl_token_mean_over_generation_batch(rollout, trl_kw, our_kw):
  # TRL divides each micro-batch by num_items_in_batch (tokens of the whole generation batch):
  # summed over GA = 4 micro-batches of 2 rows it is the global token mean; ours, the same with
  # num_tokens passed explicitly.
  n = float(rollout["mask"].sum())
  ref = sum(trl(rollout, slice(i, i + 2), num_items_in_batch=n, **trl_kw) for i in range(0, 8, 2))
  mine = sum(ours(rollout, slice(i, i + 2), num_tokens=n, **our_kw) for i in range(0, 8, 2))
  np.testing.assert_allclose(mine, ref, rtol=RTOL)
  np.testing.assert_allclose(ours(rollout, **our_kw), ref, rtol=RTOL)


def test_trl_grpo_gradient_accumulation_equal_micro_batches(rollout):
  # TRL "grpo" averages sequences per micro-batch and divides by GA: with equal micro-batch
  # sizes this is the full-batch sequence mean, i.e. ours with the global N_seq (§e.3 caveat).
  ref = sum(trl(rollout, slice(i, i + 2), loss_type="grpo", ga=4) for i in range(0, 8, 2))
  mine = sum(ours(rollout, slice(i, i + 2), num_sequences=8.0,
                  loss_agg_mode="seq-mean-token-mean") for i in range(0, 8, 2))
  np.testing.assert_allclose(mine, ref, rtol=RTOL)


# ------------------------------------------------------------------------------------------------
# Tunix.


@pytest.mark.parametrize("tunix_kw, our_kw", [
    (dict(loss_agg_mode="token-mean"), dict(loss_agg_mode="token-mean")),
    (dict(loss_agg_mode="sequence-mean-token-mean"), dict(loss_agg_mode="seq-mean-token-mean")),
    (dict(loss_agg_mode="sequence-mean-token-scale"),
     dict(loss_agg_mode="seq-mean-token-sum-norm")),
    (dict(loss_agg_mode="seq-mean-token-sum"), dict(loss_agg_mode="seq-mean-token-sum")),
    (dict(loss_agg_mode="sequence-mean-token-sum-norm"),
     dict(loss_agg_mode="seq-mean-token-sum", num_sequences=8.0)),
    (dict(loss_agg_mode="token-mean", eps_high=0.28, eps_c=3.0, beta=0.04),
     dict(loss_agg_mode="token-mean", epsilon_high=0.28, dual_clip_c=3.0, beta=0.04,
          kl_estimator="k1", max_log_ratio=20.0)),
    (dict(loss_agg_mode="sequence-mean-token-mean", beta=0.1, kl_loss_mode="mse_kl"),
     dict(loss_agg_mode="seq-mean-token-mean", beta=0.1, kl_estimator="k2")),
    (dict(loss_agg_mode="sequence-mean-token-mean", beta=0.1, kl_loss_mode="low_var_kl"),
     dict(loss_agg_mode="seq-mean-token-mean", beta=0.1, kl_estimator="k3")),
    (dict(loss_agg_mode="sequence-mean-token-mean", loss_algo="gspo-token"),
     dict(loss_agg_mode="seq-mean-token-mean", importance_sampling_level="sequence_token")),
    (dict(loss_agg_mode="token-mean", use_sampler=True),
     dict(loss_agg_mode="token-mean", use_sampler=True, sampler_max=2.0)),
], ids=["token_mean", "seq_mean_token_mean", "token_scale", "seq_mean_token_sum",
        "token_sum_norm", "dapo_dual_k1", "mse_kl", "low_var_kl", "gspo_token", "sampler_is"])
@pytest.mark.parametrize("empty_row", [False, True])
def test_tunix(make_rollout, tunix_kw, our_kw, empty_row):
  r = make_rollout(empty_row=empty_row)
  num, den = tunix(r, **tunix_kw)
  np.testing.assert_allclose(ours(r, **our_kw), num / den, rtol=RTOL)


def test_tunix_gradient_accumulation_is_a_global_weighted_mean(rollout):
  # Tunix sums numerators and denominators over micro-batches (GradientAccumulator); summing our
  # micro-batch losses, each with the full-batch normalisers, gives the same number.
  norm = loss_normalizers(rollout["mask"])
  for tunix_mode, our_mode in (("token-mean", "token-mean"),
                               ("sequence-mean-token-mean", "seq-mean-token-mean")):
    parts = [tunix(rollout, slice(i, i + 3), loss_agg_mode=tunix_mode) for i in (0, 3, 6)]
    ref = sum(p[0] for p in parts) / sum(p[1] for p in parts)
    mine = sum(ours(rollout, slice(i, i + 3), num_tokens=norm.num_tokens,
                    num_sequences=norm.num_sequences, loss_agg_mode=our_mode) for i in (0, 3, 6))
    np.testing.assert_allclose(mine, ref, rtol=RTOL)
