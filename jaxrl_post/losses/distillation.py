"""On-policy distillation (OPD): dense teacher rewards, multi-teacher domain weighting, losses.

The student samples its own responses; a frozen teacher (in multi-teacher OPD, the teacher routed
by the prompt's domain) scores them token by token. Every reward in `OPD_REWARDS` is a per-token
estimate of −KL(π_S ‖ π_T) at that position (higher is better, student first, teacher second):

  name             inputs                                   reward                        grad
  "sampled_token"  log-probs of the sampled token [b,t]     q − s                         none
  "topk"           student top-K log-probs s, teacher       (q − s)·softmax_K(s)  [b,t,K] none
                   log-probs q on the same K ids [b,t,K]
  "full_vocab"     full logits [b,t,V]                      −Σ_v p_S (log p_S − log p_T)  student
  "mopd"           sampled-token log-probs [b,t]            sg(q − s) (+ c·A_ORM)         none
  "mopd_topk"      student log-probs on the teacher's       −Σ_v [p_S log(p_S/p_T)        student
                   top-k ids, teacher top-k log-probs          − p_S + p_T]

Detached rewards are advantages for a policy-gradient loss (`opd_topk_ppo_loss` for "topk",
`mopd_loss` for "mopd", `policy_loss` for "sampled_token"); the differentiable ones are losses
in their own right (minimise −reward, e.g. `full_vocab_opd_loss`).

Open-MOPD (arXiv 2608.19098) adds, per rollout batch:

  M1 token-share balancing   base_d = g*_d / o_d  (target share over observed token share)
  M2 gap-following           factor_d = clip((m_d / ref)^α, 0.05, 20),  m_d = mean |Σ_k r| of d
                             w_d = base_d·factor_d, rescaled to token-weighted mean 1
  M4 reward refresh          before each inner update r ← (q − sg(s_cur))·softmax_K(sg(s_cur))
  loss                       per-candidate dual-clip PPO, summed over K, token-mean

Global statistics are global: `domain_token_stats` returns sums that add over micro-batches and
devices (`jax.lax.psum` them inside `shard_map`); `domain_weights_from_stats` turns the summed
statistics into weights, so a split or sharded batch gets exactly the full-batch weights. The
losses take the full-batch `num_tokens` / `num_sequences` for the same reason.

Host-side helpers (not jittable) validate domain labels and ids: `encode_domain_labels`,
`check_domain_ids`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_post.losses.aggregation import aggregate, loss_normalizers
from jaxrl_post.losses.policy import sampler_importance_weights
from jaxrl_post.registry import Registry

ArrayLike = jax.Array | float | int

OPD_REWARDS: Registry = Registry("opd reward")

GAP_REFERENCES = ("share_weighted", "mean")

# Open-MOPD defaults (arXiv 2608.19098).
TOPK = 16
GAP_CLIP_MIN = 0.05
GAP_CLIP_MAX = 20.0


def _valid(mask: jax.Array | None, shape) -> jax.Array:
  if mask is None:
    return jnp.ones(shape, bool)
  chex.assert_shape(mask, shape)
  return jnp.asarray(mask) > 0


# ---------------------------------------------------------------------------------------------
# Dense OPD rewards.
# ---------------------------------------------------------------------------------------------


@OPD_REWARDS.register("sampled_token")
@jax.jit
def sampled_token_opd_reward(
  student_logp: jax.Array, teacher_logp: jax.Array, mask: jax.Array | None = None
) -> jax.Array:
  """Sampled-token OPD advantage: the teacher-minus-student log-prob of each sampled token.

  A[i,t] = sg(teacher_logp[i,t] − student_logp[i,t])·m[i,t]  (= −k1 with π_ref = π_T)

  A one-sample estimate of −KL(π_S ‖ π_T) at position t; used as a per-token advantage with no
  baseline and no discounting (verl's `token_reward_direct`). Pass the log-probs of the student
  that sampled the tokens (`old_logp`).

  Args:
    student_logp: `[batch, time]` student log-probs of the sampled tokens.
    teacher_logp: `[batch, time]` teacher log-probs of the same tokens.
    mask: optional `[batch, time]` loss mask; padding gets 0 even if it holds ±inf.

  Returns:
    `[batch, time]` float32 advantages, stop-gradient.

  Examples:
    >>> import jax.numpy as jnp
    >>> a = sampled_token_opd_reward(jnp.log(jnp.array([[0.5, 0.2]])),
    ...                              jnp.log(jnp.array([[0.25, 0.2]])))
    >>> [round(float(x), 4) for x in a[0]]  # log(0.25/0.5), log 1
    [-0.6931, 0.0]

  References:
    Thinking Machines, "On-Policy Distillation" (blog, 2025).
  """
  chex.assert_equal_shape([student_logp, teacher_logp])
  valid = _valid(mask, student_logp.shape)
  diff = jnp.asarray(teacher_logp, jnp.float32) - jnp.asarray(student_logp, jnp.float32)
  return jax.lax.stop_gradient(jnp.where(valid, diff, 0.0))


@OPD_REWARDS.register("topk")
@jax.jit
def topk_opd_reward(
  student_topk_logp: jax.Array,
  teacher_topk_logp: jax.Array,
  mask: jax.Array | None = None,
) -> jax.Array:
  """Open-MOPD dense reward on the student's top-K support (`only_stu` + `student_p`).

  r[i,t,k] = (q[i,t,k] − s[i,t,k])·p̃[i,t,k],  p̃ = softmax_k(s[i,t,:])

  `s` are the student's full-vocabulary log-probs gathered at its own K highest-logit ids and
  `q` the teacher's full-vocabulary log-probs at the same ids (the teacher is not
  renormalised). Σ_k r·∇log π(v_k) is a top-K truncated estimate of −∇KL(π_S ‖ π_T). The paper
  uses K = 16; any K works.

  Args:
    student_topk_logp: `[batch, time, K]` student log-probs s on its top-K ids.
    teacher_topk_logp: `[batch, time, K]` teacher log-probs q on the same ids.
    mask: optional `[batch, time]` mask; padding positions get 0 (even with ±inf inputs).

  Returns:
    `[batch, time, K]` float32 rewards, stop-gradient.

  Examples:
    >>> import jax.numpy as jnp
    >>> s = jnp.log(jnp.array([[[0.6, 0.2]]]))  # p̃ = [0.75, 0.25]
    >>> q = jnp.log(jnp.array([[[0.3, 0.2]]]))
    >>> [round(float(x), 4) for x in topk_opd_reward(s, q)[0, 0]]  # 0.75·log ½, 0
    [-0.5199, 0.0]

  References:
    Gao et al., Open-MOPD, arXiv 2608.19098.
  """
  chex.assert_rank([student_topk_logp, teacher_topk_logp], 3)
  chex.assert_equal_shape([student_topk_logp, teacher_topk_logp])
  s = jnp.asarray(student_topk_logp, jnp.float32)
  q = jnp.asarray(teacher_topk_logp, jnp.float32)
  valid = _valid(mask, s.shape[:2])[..., None]
  s_safe = jnp.where(valid, s, 0.0)  # padding may be −inf: softmax of a −inf row is NaN
  reward = (jnp.where(valid, q, 0.0) - s_safe) * jax.nn.softmax(s_safe, axis=-1)
  return jax.lax.stop_gradient(jnp.where(valid, reward, 0.0))


@jax.jit
def refresh_topk_reward(
  current_topk_logp: jax.Array,
  teacher_topk_logp: jax.Array,
  mask: jax.Array | None = None,
) -> jax.Array:
  """Reward refresh (Open-MOPD M4): the top-K reward with the *current* student, same teacher.

  r_cur[i,t,k] = (q[i,t,k] − sg(s_cur[i,t,k]))·softmax_k(sg(s_cur[i,t,:]))[k]

  Before each inner (mini-batch) update, only the student-dependent terms are recomputed from
  the current student's log-probs on the cached rollout-time ids V (they come free with the
  forward pass that the gradient needs); the teacher log-probs `q` were cached at rollout time
  and never go stale. Importance sampling corrects a stale sampling distribution, not a stale
  reward; this corrects the reward. Multiply by the domain weight *after* the refresh.

  Args:
    current_topk_logp: `[batch, time, K]` current student log-probs on the rollout-time ids.
    teacher_topk_logp: `[batch, time, K]` cached teacher log-probs on the same ids.
    mask: optional `[batch, time]` mask.

  Returns:
    `[batch, time, K]` float32 refreshed rewards, stop-gradient.

  Examples:
    >>> import jax.numpy as jnp
    >>> q = jnp.log(jnp.array([[[0.3, 0.2]]]))
    >>> s_cur = jnp.log(jnp.array([[[0.3, 0.3]]]))  # the student moved: p̃ = [½, ½]
    >>> [round(float(x), 4) for x in refresh_topk_reward(s_cur, q)[0, 0]]  # 0, ½·log(2/3)
    [0.0, -0.2027]

  References:
    Gao et al., Open-MOPD, arXiv 2608.19098.
  """
  return topk_opd_reward(jax.lax.stop_gradient(current_topk_logp), teacher_topk_logp, mask)


def full_vocab_reverse_kl(student_logits: jax.Array, teacher_logits: jax.Array) -> jax.Array:
  """Per-position reverse KL over the full vocabulary, KL(π_S ‖ sg(π_T)).

  KL[i,t] = Σ_v p_S(v)·(log p_S(v) − log p_T(v)),  p = softmax(logits[i,t,:]) in float32

  Differentiable in the student logits; the teacher is stop-gradient.

  Args:
    student_logits: `[..., vocab]` student logits.
    teacher_logits: `[..., vocab]` teacher logits.

  Returns:
    `[...]` float32 KL per position.

  Examples:
    >>> import jax.numpy as jnp
    >>> kl = full_vocab_reverse_kl(jnp.log(jnp.array([[0.5, 0.5]])),
    ...                            jnp.log(jnp.array([[0.25, 0.75]])))
    >>> round(float(kl[0]), 4)  # ½ log 2 + ½ log(2/3)
    0.1438
  """
  chex.assert_equal_shape([student_logits, teacher_logits])
  s = jax.nn.log_softmax(jnp.asarray(student_logits, jnp.float32), axis=-1)
  t = jax.nn.log_softmax(jax.lax.stop_gradient(jnp.asarray(teacher_logits, jnp.float32)), axis=-1)
  return jnp.sum(jnp.exp(s) * (s - t), axis=-1)


@OPD_REWARDS.register("full_vocab")
@jax.jit
def full_vocab_opd_reward(
  student_logits: jax.Array, teacher_logits: jax.Array, mask: jax.Array | None = None
) -> jax.Array:
  """Full-vocabulary OPD signal: −KL(π_S ‖ π_T) at every position, differentiable.

  reward[i,t] = −Σ_v p_S(v)(log p_S(v) − log p_T(v))·m[i,t]

  Unlike the sampled rewards this is exact per position and is meant to be *maximised
  directly* (gradient through the student logits), not used as a detached advantage: its value
  does not depend on the token sampled at t. `full_vocab_opd_loss` aggregates it.

  Args:
    student_logits: `[batch, time, vocab]` student logits.
    teacher_logits: `[batch, time, vocab]` teacher logits (stop-gradient).
    mask: optional `[batch, time]` mask.

  Returns:
    `[batch, time]` float32.

  Examples:
    >>> import jax.numpy as jnp
    >>> r = full_vocab_opd_reward(jnp.log(jnp.array([[[0.5, 0.5]]])),
    ...                           jnp.log(jnp.array([[[0.25, 0.75]]])))
    >>> round(float(r[0, 0]), 4)  # −(½ log 2 + ½ log(2/3))
    -0.1438
  """
  chex.assert_rank([student_logits, teacher_logits], 3)
  kl = full_vocab_reverse_kl(student_logits, teacher_logits)
  return jnp.where(_valid(mask, kl.shape), -kl, 0.0)


class FullVocabOPDAux(NamedTuple):
  """Metrics of `full_vocab_opd_loss` (float32 scalars)."""

  kl: jax.Array  # Token-mean reverse KL (global num_tokens: additive over micro-batches).
  kl_max: jax.Array  # Largest per-position KL over valid positions.


@functools.partial(jax.jit, static_argnames=("loss_agg_mode", "max_tokens"))
def full_vocab_opd_loss(
  student_logits: jax.Array,
  teacher_logits: jax.Array,
  mask: jax.Array,
  *,
  loss_agg_mode: str = "token-mean",
  num_tokens: ArrayLike | None = None,
  num_sequences: ArrayLike | None = None,
  max_tokens: int | None = None,
) -> tuple[jax.Array, FullVocabOPDAux]:
  """Full-vocabulary OPD loss: the aggregated per-position reverse KL.

  loss = agg_{i,t}( Σ_v p_S (log p_S − log p_T) )  with `agg` a `LOSS_AGG_MODES` reduction.

  Args:
    student_logits: `[batch, time, vocab]` student logits (differentiated).
    teacher_logits: `[batch, time, vocab]` teacher logits (stop-gradient).
    mask: `[batch, time]` loss mask.
    loss_agg_mode: aggregation mode (default "token-mean"; MOPD's full-vocab form normalises
      by sequence length, then averages over the batch: "seq-mean-token-mean").
    num_tokens: valid tokens in the whole batch (default Σ mask).
    num_sequences: non-empty sequences in the whole batch (default from mask).
    max_tokens: length budget of "seq-mean-token-sum-norm".

  Returns:
    `(loss, FullVocabOPDAux)`.

  Examples:
    >>> import jax.numpy as jnp
    >>> s = jnp.log(jnp.array([[[0.5, 0.5], [0.9, 0.1]]]))
    >>> t = jnp.log(jnp.array([[[0.25, 0.75], [0.9, 0.1]]]))
    >>> loss, aux = full_vocab_opd_loss(s, t, jnp.ones((1, 2)))
    >>> round(float(loss), 4)  # (0.1438 + 0)/2
    0.0719

  References:
    Agarwal et al., On-Policy Distillation of Language Models (GKD), arXiv 2306.13649.
  """
  kl = full_vocab_reverse_kl(student_logits, teacher_logits)
  chex.assert_equal_shape([kl, mask])
  mask_f = jnp.asarray(mask, jnp.float32)
  if num_tokens is None:
    num_tokens = jnp.sum(mask_f)
  loss = aggregate(
    kl,
    mask_f,
    mode=loss_agg_mode,
    num_tokens=num_tokens,
    num_sequences=num_sequences,
    max_tokens=max_tokens,
  )
  sg_kl = jax.lax.stop_gradient(kl)
  aux = FullVocabOPDAux(
    kl=aggregate(sg_kl, mask_f, mode="token-mean", num_tokens=num_tokens),
    kl_max=jnp.max(jnp.where(mask_f > 0, sg_kl, -jnp.inf)),
  )
  return loss, aux


@OPD_REWARDS.register("mopd")
@functools.partial(jax.jit, static_argnames=("adv_clip",))
def mopd_reward(
  student_logp: jax.Array,
  teacher_logp: jax.Array,
  mask: jax.Array | None = None,
  *,
  orm_adv: jax.Array | None = None,
  orm_coef: ArrayLike = 0.0,
  adv_clip: float | None = None,
) -> jax.Array:
  """MOPD (Xiaomi) token advantage: routed-teacher log-ratio plus an optional outcome advantage.

  Â[i,t] = sg(log π_T(y_t) − log π_θ(y_t)) + c·Â_ORM[i],  then optionally clip(Â, −A_max, A_max)

  `teacher_logp` comes from the teacher routed by the prompt's domain (one teacher per
  prompt; no probability averaging).

  Args:
    student_logp: `[batch, time]` student log-probs of the sampled tokens.
    teacher_logp: `[batch, time]` routed-teacher log-probs of the same tokens.
    mask: optional `[batch, time]` mask.
    orm_adv: optional `[batch]` or `[batch, time]` outcome-reward advantage.
    orm_coef: its coefficient c (the spec's α; default 0: pure distillation).
    adv_clip: A_max of the two-sided clip (None: off; the paper's value is not known).

  Returns:
    `[batch, time]` float32 advantages, stop-gradient.

  Examples:
    >>> import jax.numpy as jnp
    >>> a = mopd_reward(jnp.log(jnp.array([[0.5, 0.5]])), jnp.log(jnp.array([[0.05, 0.5]])),
    ...                 orm_adv=jnp.array([1.0]), orm_coef=0.5, adv_clip=2.0)
    >>> [round(float(x), 4) for x in a[0]]  # log 0.1 + 0.5 = −1.80; 0 + 0.5
    [-1.8026, 0.5]

  References:
    Ma et al., MOPD: Multi-Teacher On-Policy Distillation, arXiv 2606.30406.
  """
  adv = sampled_token_opd_reward(student_logp, teacher_logp, mask)
  if orm_adv is not None:
    orm = jnp.asarray(orm_adv, jnp.float32)
    chex.assert_rank(orm, {1, 2})
    orm = orm[:, None] if orm.ndim == 1 else orm
    adv = adv + orm_coef * jnp.broadcast_to(orm, adv.shape)
  if adv_clip is not None:
    adv = jnp.clip(adv, -adv_clip, adv_clip)
  return jax.lax.stop_gradient(jnp.where(_valid(mask, adv.shape), adv, 0.0))


@OPD_REWARDS.register("mopd_topk")
@jax.jit
def mopd_topk_reward(
  student_logp: jax.Array, teacher_topk_logp: jax.Array, mask: jax.Array | None = None
) -> jax.Array:
  """MOPD top-k variant: −(generalised KL) on the routed teacher's top-k set 𝒯, differentiable.

  reward[i,t] = −Σ_{v∈𝒯} [p_S(v)·(log p_S(v) − log p_T(v)) − p_S(v) + p_T(v)]

  with un-renormalised probabilities p = exp(logp). The extra −p_S + p_T keeps the optimum at
  p_S = p_T on the truncated support (each bracket is ≥ 0, zero iff p_S(v) = p_T(v)). Minimise
  the aggregated negative reward; the gradient flows through `student_logp`.

  Args:
    student_logp: `[batch, time, k]` student full-vocab log-probs at the teacher's top-k ids.
    teacher_topk_logp: `[batch, time, k]` teacher log-probs at its top-k ids (stop-gradient).
    mask: optional `[batch, time]` mask.

  Returns:
    `[batch, time]` float32.

  Examples:
    >>> import jax.numpy as jnp
    >>> r = mopd_topk_reward(jnp.log(jnp.array([[[0.5, 0.1]]])),
    ...                      jnp.log(jnp.array([[[0.25, 0.1]]])))
    >>> round(float(r[0, 0]), 4)  # −(0.5·log 2 − 0.5 + 0.25)
    -0.0966

  References:
    Ma et al., MOPD, arXiv 2606.30406 (its top-k form).
  """
  chex.assert_rank([student_logp, teacher_topk_logp], 3)
  chex.assert_equal_shape([student_logp, teacher_topk_logp])
  valid = _valid(mask, student_logp.shape[:2])
  s = jnp.where(valid[..., None], jnp.asarray(student_logp, jnp.float32), 0.0)
  t = jnp.where(valid[..., None], jnp.asarray(teacher_topk_logp, jnp.float32), 0.0)
  t = jax.lax.stop_gradient(t)
  p_s, p_t = jnp.exp(s), jnp.exp(t)
  divergence = jnp.sum(p_s * (s - t) - p_s + p_t, axis=-1)
  return jnp.where(valid, -divergence, 0.0)


class MOPDAux(NamedTuple):
  """Metrics of `mopd_loss` (float32 scalars; means use the loss's global `num_tokens`)."""

  pg_loss: jax.Array
  adv_mean: jax.Array  # Token-mean advantage Â.
  icepop_keep_frac: jax.Array  # Share of tokens whose IcePop weight is non-zero.
  icepop_weight_mean: jax.Array  # Token-mean of w_t (0 for masked tokens).
  ratio_min: jax.Array  # Smallest π_θ/μ over valid tokens (before masking).
  ratio_max: jax.Array


@functools.partial(
  jax.jit, static_argnames=("icepop_low", "icepop_high", "adv_clip", "loss_agg_mode", "max_tokens")
)
def mopd_loss(
  logp: jax.Array,
  rollout_logp: jax.Array,
  teacher_logp: jax.Array,
  mask: jax.Array,
  *,
  orm_adv: jax.Array | None = None,
  orm_coef: ArrayLike = 0.0,
  adv_clip: float | None = None,
  icepop_low: float = 0.2,
  icepop_high: float = 5.0,
  loss_agg_mode: str = "seq-mean-token-mean",
  num_tokens: ArrayLike | None = None,
  num_sequences: ArrayLike | None = None,
  max_tokens: int | None = None,
) -> tuple[jax.Array, MOPDAux]:
  """MOPD policy-gradient loss with the IcePop-style train/rollout mismatch mask.

  Â_t = sg(log π_T(y_t) − log π_θ(y_t)) (+ c·Â_ORM)          (`mopd_reward`)
  w_t = sg(π_θ(y_t)/μ(y_t)) if icepop_low ≤ π_θ/μ ≤ icepop_high else 0
  L   = −E_{x,y∼μ}[ (1/|y|) Σ_t w_t·Â_t·log π_θ(y_t) ]     (seq-mean-token-mean by default)

  μ is the inference engine that sampled the tokens (`rollout_logp`). Â and w use the current
  log-probs `logp` (stop-gradient); the gradient flows only through log π_θ in the last factor.

  Args:
    logp: `[batch, time]` current student log-probs of the sampled tokens (differentiated).
    rollout_logp: `[batch, time]` log-probs the rollout engine reported for them.
    teacher_logp: `[batch, time]` routed-teacher log-probs.
    mask: `[batch, time]` loss mask.
    orm_adv: optional `[batch]` / `[batch, time]` outcome advantage, added with `orm_coef`.
    orm_coef: coefficient of the outcome advantage (default 0).
    adv_clip: optional two-sided clip A_max of Â (value not found in the sources).
    icepop_low: lower bound of the kept ratio π_θ/μ. The paper's value is NOT FOUND; 0.2 (and
      5.0 above) are a community slime implementation's defaults (PROPOSAL).
    icepop_high: upper bound of the kept ratio.
    loss_agg_mode: aggregation (default "seq-mean-token-mean": the 1/|y| then batch mean).
    num_tokens: global valid-token count (default Σ mask).
    num_sequences: global non-empty sequence count (default from mask).
    max_tokens: length budget of "seq-mean-token-sum-norm".

  Returns:
    `(loss, MOPDAux)`.

  Examples:
    >>> import jax.numpy as jnp
    >>> logp = jnp.log(jnp.array([[0.5, 0.5]]))
    >>> rollout = jnp.log(jnp.array([[0.5, 0.05]]))  # 2nd token: π_θ/μ = 10 → masked
    >>> teacher = jnp.log(jnp.array([[0.25, 0.9]]))
    >>> loss, aux = mopd_loss(logp, rollout, teacher, jnp.ones((1, 2)))
    >>> round(float(loss), 4)  # −(1·log ½·log ½ + 0)/2
    -0.2402
    >>> float(aux.icepop_keep_frac)
    0.5

  References:
    Ma et al., MOPD, arXiv 2606.30406; IcePop as in Miles/slime `icepop_function`.
  """
  chex.assert_rank([logp, rollout_logp, teacher_logp, mask], 2)
  chex.assert_equal_shape([logp, rollout_logp, teacher_logp, mask])
  if not 0.0 <= icepop_low <= icepop_high:
    raise ValueError(f"need 0 <= icepop_low <= icepop_high, got {icepop_low}, {icepop_high}")
  mask_f = jnp.asarray(mask, jnp.float32)
  valid = mask_f > 0
  logp = jnp.asarray(logp, jnp.float32)
  current = jax.lax.stop_gradient(logp)
  adv = mopd_reward(
    current, teacher_logp, mask_f, orm_adv=orm_adv, orm_coef=orm_coef, adv_clip=adv_clip
  )
  weight = sampler_importance_weights(
    current,
    jnp.asarray(rollout_logp, jnp.float32),
    mask_f,
    level="token",
    correction="mask",
    min_weight=icepop_low,
    max_weight=icepop_high,
  )
  if num_tokens is None or num_sequences is None:
    local = loss_normalizers(mask_f)
    num_tokens = local.num_tokens if num_tokens is None else num_tokens
    num_sequences = local.num_sequences if num_sequences is None else num_sequences
  per_token = -weight * adv * jnp.where(valid, logp, 0.0)
  pg_loss = aggregate(
    per_token,
    mask_f,
    mode=loss_agg_mode,
    num_tokens=num_tokens,
    num_sequences=num_sequences,
    max_tokens=max_tokens,
  )
  tok_mean = functools.partial(aggregate, mask=mask_f, mode="token-mean", num_tokens=num_tokens)
  ratio = jnp.exp(jnp.where(valid, current - rollout_logp, 0.0))
  aux = MOPDAux(
    pg_loss=pg_loss,
    adv_mean=tok_mean(adv),
    icepop_keep_frac=tok_mean((weight > 0).astype(jnp.float32)),
    icepop_weight_mean=tok_mean(weight),
    ratio_min=jnp.min(jnp.where(valid, ratio, jnp.inf)),
    ratio_max=jnp.max(jnp.where(valid, ratio, -jnp.inf)),
  )
  return pg_loss, aux


# ---------------------------------------------------------------------------------------------
# Open-MOPD: per-candidate dual-clip PPO on the top-K support.
# ---------------------------------------------------------------------------------------------


@jax.jit
def topk_staleness_kl(
  old_topk_logp: jax.Array, topk_logp: jax.Array, mask: jax.Array | None = None
) -> jax.Array:
  """Reward staleness: KL between the rollout-time and current student top-K distributions.

  KL[i,t] = Σ_k p̃_old(k)·(log p̃_old(k) − log p̃_cur(k)),  p̃ = softmax_k(logp[i,t,:])

  both renormalised over the same rollout-time ids. Zero when the student has not moved on
  the support (or moved by a constant shift of its top-K log-probs).

  Args:
    old_topk_logp: `[batch, time, K]` rollout-time student log-probs s.
    topk_logp: `[batch, time, K]` current student log-probs on the same ids.
    mask: optional `[batch, time]` mask.

  Returns:
    `[batch, time]` float32, stop-gradient, 0 on padding.

  Examples:
    >>> import jax.numpy as jnp
    >>> old = jnp.log(jnp.array([[[0.5, 0.5]]]))
    >>> cur = jnp.log(jnp.array([[[0.75, 0.25]]]))
    >>> round(float(topk_staleness_kl(old, cur)[0, 0]), 4)  # ½ log(2/3) + ½ log 2
    0.1438
  """
  chex.assert_rank([old_topk_logp, topk_logp], 3)
  chex.assert_equal_shape([old_topk_logp, topk_logp])
  valid = _valid(mask, old_topk_logp.shape[:2])
  old = jax.nn.log_softmax(jnp.where(valid[..., None], old_topk_logp, 0.0), axis=-1)
  cur = jax.nn.log_softmax(jnp.where(valid[..., None], topk_logp, 0.0), axis=-1)
  kl = jnp.sum(jnp.exp(old) * (old - cur), axis=-1)
  return jax.lax.stop_gradient(jnp.where(valid, kl, 0.0))


class OPDTopKAux(NamedTuple):
  """Metrics of `opd_topk_ppo_loss`; float32 scalars.

  Mean fields are normalised by the loss's (global) `num_tokens`, and per-candidate fractions
  additionally by K, so with the full-batch `num_tokens` they add up over micro-batches like
  the loss. `ratio_min` / `ratio_max` combine with min / max. The domain weight enters the
  advantage only, never these fractions (as in the official code).
  """

  pg_loss: jax.Array
  clip_frac: jax.Array  # Share of (token, candidate) pairs where the PPO clip is active.
  clip_frac_low: jax.Array  # ρ < 1 − ε_low and A < 0.
  clip_frac_high: jax.Array  # ρ > 1 + ε_high and A > 0.
  clip_frac_dual: jax.Array  # A < 0 and the dual-clip bound −c·A active.
  ratio_mean: jax.Array  # Mean per-candidate ratio.
  ratio_min: jax.Array
  ratio_max: jax.Array
  reward_mean: jax.Array  # Token-mean of Σ_k r (the reward used, before domain weights).
  adv_abs_mean: jax.Array  # Token-mean of |Σ_k A| (after domain weights).
  staleness_kl: jax.Array  # Token-mean KL(p̃_old ‖ p̃_cur) on the top-K support.

  # The fields that add up over micro-batches (normalised by the global `num_tokens`).
  ADDITIVE = ("pg_loss", "clip_frac", "clip_frac_low", "clip_frac_high", "clip_frac_dual",
              "ratio_mean", "reward_mean", "adv_abs_mean", "staleness_kl")

  def additive(self) -> dict[str, jax.Array]:
    """The additive fields, as a metrics dict for `make_train_step`."""
    return {k: getattr(self, k) for k in self.ADDITIVE}


@functools.partial(
  jax.jit,
  static_argnames=(
    "refresh",
    "epsilon_low",
    "epsilon_high",
    "dual_clip_c",
    "max_log_ratio",
  ),
)
def opd_topk_ppo_loss(
  topk_logp: jax.Array,
  old_topk_logp: jax.Array,
  teacher_topk_logp: jax.Array,
  mask: jax.Array,
  *,
  seq_weights: jax.Array | None = None,
  refresh: bool = True,
  epsilon_low: float = 0.2,
  epsilon_high: float = 0.28,
  dual_clip_c: float | None = 3.0,
  max_log_ratio: float | None = 20.0,
  num_tokens: ArrayLike | None = None,
) -> tuple[jax.Array, OPDTopKAux]:
  """Open-MOPD loss: per-candidate dual-clip PPO on the top-K support, summed over K, token-mean.

  r    = (q − sg(s_cur))·softmax_K(sg(s_cur))  if refresh (M4)  else (q − s_old)·softmax_K(s_old)
  A    = r·m·w_i                                   (w_i: domain weight, applied after refresh)
  ρ    = exp(clip(s_cur − s_old, −20, 20))
  ℓ    = max(−A·ρ, −A·clip(ρ, 1−ε_low, 1+ε_high));  if A < 0: ℓ ← min(ℓ, −c·A)
  loss = Σ_{i,t} m·Σ_k ℓ[i,t,k] / N_tok

  `s_cur = topk_logp` are the current student's log-probs on the rollout-time top-K ids V
  (full-vocab log-softmax gathered at V; differentiated), `s_old` the rollout-time ones, `q`
  the cached teacher log-probs on V. For a single on-policy update pass
  `old_topk_logp = stop_gradient(topk_logp)`.

  Per candidate this is `policy_loss`'s token-level clip objective with dual clip; the sum over
  K comes before the token mean, whose denominator counts positions, not candidates.

  Args:
    topk_logp: `[batch, time, K]` current student log-probs on V (differentiated).
    old_topk_logp: `[batch, time, K]` rollout-time student log-probs s on V.
    teacher_topk_logp: `[batch, time, K]` teacher log-probs q on V.
    mask: `[batch, time]` loss mask.
    seq_weights: optional `[batch]` per-sequence domain weights (`domain_weights`).
    refresh: recompute the reward with the current student (default True, the paper).
    epsilon_low: PPO ε_low (0.2).
    epsilon_high: PPO ε_high (0.28).
    dual_clip_c: dual-clip constant c (3.0, verl's default); None disables it.
    max_log_ratio: clamp of s_cur − s_old before exp (20, as verl); None disables it.
    num_tokens: valid positions in the whole batch (default Σ mask); pass the full-batch value
      to every micro-batch so that their losses sum to the full-batch loss.

  Returns:
    `(loss, OPDTopKAux)`.

  Examples:
    >>> import jax.numpy as jnp
    >>> s = jnp.log(jnp.array([[[0.6, 0.2]]]))
    >>> q = jnp.log(jnp.array([[[0.3, 0.2]]]))
    >>> loss, aux = opd_topk_ppo_loss(s, s, q, jnp.ones((1, 1)))
    >>> round(float(loss), 4)  # ρ = 1: −Σ_k A_k = −0.75·log ½
    0.5199

  References:
    Gao et al., Open-MOPD, arXiv 2608.19098.
    Ye et al., dual clip, arXiv 1912.09729.  Yu et al., DAPO (clip-higher), arXiv 2503.14476.
  """
  chex.assert_rank([topk_logp, old_topk_logp, teacher_topk_logp], 3)
  chex.assert_equal_shape([topk_logp, old_topk_logp, teacher_topk_logp])
  chex.assert_rank(mask, 2)
  if dual_clip_c is not None and dual_clip_c <= 1.0:
    raise ValueError(f"dual_clip_c must be > 1, got {dual_clip_c}")
  batch, time, k = topk_logp.shape
  mask_f = jnp.asarray(mask, jnp.float32)
  chex.assert_shape(mask_f, (batch, time))
  if num_tokens is None:
    num_tokens = jnp.sum(mask_f)
  num_tokens = jnp.asarray(num_tokens, jnp.float32)

  topk_logp = jnp.asarray(topk_logp, jnp.float32)
  old = jnp.asarray(old_topk_logp, jnp.float32)
  student = jax.lax.stop_gradient(topk_logp) if refresh else old
  reward = topk_opd_reward(student, teacher_topk_logp, mask_f)
  adv = reward * mask_f[..., None]
  if seq_weights is not None:
    seq_weights = jnp.asarray(seq_weights, jnp.float32)
    chex.assert_shape(seq_weights, (batch,))
    adv = adv * seq_weights[:, None, None]

  valid = (mask_f > 0)[..., None]
  log_ratio = jnp.where(valid, topk_logp - jnp.where(valid, old, 0.0), 0.0)
  if max_log_ratio is not None:
    log_ratio = jnp.clip(log_ratio, -max_log_ratio, max_log_ratio)
  ratio = jnp.exp(log_ratio)
  per_candidate = jnp.maximum(
    -adv * ratio, -adv * jnp.clip(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high)
  )
  clip_dual = jnp.zeros(adv.shape, bool)
  if dual_clip_c is not None:
    # For A < 0 the clipped loss grows without bound in ρ; cap it at −c·A (no gradient there).
    bound = -dual_clip_c * adv
    clip_dual = (adv < 0) & (per_candidate > bound)
    per_candidate = jnp.where(adv < 0, jnp.minimum(per_candidate, bound), per_candidate)
  loss = aggregate(
    jnp.sum(jnp.where(valid, per_candidate, 0.0), axis=-1),
    mask_f,
    mode="token-mean",
    num_tokens=num_tokens,
  )

  tok_mean = functools.partial(aggregate, mask=mask_f, mode="token-mean", num_tokens=num_tokens)
  sg_ratio = jax.lax.stop_gradient(ratio)

  def cand_mean(x):  # mean over (position, candidate) pairs, additive over micro-batches
    return tok_mean(jnp.sum(jnp.where(valid, x.astype(jnp.float32), 0.0), axis=-1)) / k

  clip_low = (sg_ratio < 1.0 - epsilon_low) & (adv < 0)
  clip_high = (sg_ratio > 1.0 + epsilon_high) & (adv > 0)
  aux = OPDTopKAux(
    pg_loss=loss,
    clip_frac=cand_mean(clip_low | clip_high),
    clip_frac_low=cand_mean(clip_low),
    clip_frac_high=cand_mean(clip_high),
    clip_frac_dual=cand_mean(clip_dual),
    ratio_mean=cand_mean(sg_ratio),
    ratio_min=jnp.min(jnp.where(valid, sg_ratio, jnp.inf)),
    ratio_max=jnp.max(jnp.where(valid, sg_ratio, -jnp.inf)),
    reward_mean=tok_mean(jnp.sum(reward, axis=-1)),
    adv_abs_mean=tok_mean(jnp.abs(jnp.sum(adv, axis=-1))),
    staleness_kl=tok_mean(topk_staleness_kl(old, topk_logp, mask_f)),
  )
  return loss, aux


# ---------------------------------------------------------------------------------------------
# Open-MOPD: domain statistics and weights (M1 token-share balancing + M2 gap-following).
# ---------------------------------------------------------------------------------------------


class DomainStats(NamedTuple):
  """Per-domain sums of one (micro-)batch; add them over micro-batches / devices (`psum`)."""

  num_tokens: jax.Array  # [D] Σ_{i∈d} Σ_t m[i,t]  (token count L summed over the domain).
  abs_reward: jax.Array  # [D] Σ_{i∈d} Σ_t m[i,t]·|Σ_k r[i,t,k]|.
  num_sequences: jax.Array  # [D] sequences of domain d (with or without valid tokens).


def _token_abs_reward(mask_f, token_rewards):
  r = jnp.asarray(token_rewards, jnp.float32)
  chex.assert_rank(r, {2, 3})
  if r.ndim == 3:
    r = jnp.sum(r, axis=-1)  # Σ over K *before* the absolute value (official code)
  chex.assert_equal_shape([r, mask_f])
  return jnp.where(mask_f > 0, jnp.abs(r) * mask_f, 0.0)


@functools.partial(jax.jit, static_argnames=("num_domains",))
def domain_token_stats(
  mask: jax.Array, domain_ids: jax.Array, token_rewards: jax.Array, num_domains: int
) -> DomainStats:
  """Per-domain token counts and |reward| sums: additive statistics for `domain_weights`.

  tokens_d = Σ_{i∈d} L_i,  L_i = Σ_t m[i,t];   abs_d = Σ_{i∈d} Σ_t m[i,t]·|Σ_k r[i,t,k]|

  Computed with `segment_sum`, so a batch sharded over a mesh under `jax.jit` gives the global
  sums; for micro-batches add the results (`jax.tree.map(jnp.add, a, b)`), inside `shard_map`
  `jax.lax.psum` them. Ids outside `[0, num_domains)` are dropped: validate them host-side
  with `check_domain_ids`.

  Args:
    mask: `[batch, time]` response mask.
    domain_ids: `[batch]` int domain id per sequence.
    token_rewards: `[batch, time, K]` (summed over K) or `[batch, time]` rollout-time rewards.
    num_domains: static number of domains D.

  Returns:
    `DomainStats` of `[D]` float32 arrays.

  Examples:
    >>> import jax.numpy as jnp
    >>> st = domain_token_stats(jnp.array([[1, 1], [1, 0]]), jnp.array([1, 1]),
    ...                         jnp.array([[0.5, -1.0], [2.0, 9.0]]), 3)
    >>> st.num_tokens.tolist(), st.abs_reward.tolist()
    ([0.0, 3.0, 0.0], [0.0, 3.5, 0.0])
  """
  chex.assert_rank([mask, domain_ids], [2, 1])
  mask_f = jnp.asarray(mask, jnp.float32)
  domain_ids = jnp.asarray(domain_ids)
  chex.assert_shape(domain_ids, mask_f.shape[:1])
  chex.assert_type(domain_ids, int)
  per_seq_tokens = jnp.sum(mask_f, axis=-1)
  per_seq_abs = jnp.sum(_token_abs_reward(mask_f, token_rewards), axis=-1)
  seg = functools.partial(jax.ops.segment_sum, segment_ids=domain_ids, num_segments=num_domains)
  return DomainStats(
    num_tokens=seg(per_seq_tokens),
    abs_reward=seg(per_seq_abs),
    num_sequences=seg(jnp.ones_like(per_seq_tokens)),
  )


class DomainWeighting(NamedTuple):
  """The per-domain pieces of Open-MOPD's weights, all `[D]` float32 (absent domains: 0 / 1)."""

  token_share: jax.Array  # o_d = tokens_d / N.
  target_share: jax.Array  # g*_d, renormalised over the present domains.
  share_weight: jax.Array  # base_d = g*_d / o_d (M1); 1 per present domain when M1 is off.
  mean_abs_reward: jax.Array  # m_d = abs_d / tokens_d.
  gap_factor: jax.Array  # clip((m_d / ref)^α, clip_min, clip_max) (M2); 1 when absent.
  weight: jax.Array  # w_d = base_d·factor_d·N / Σ_d base_d·factor_d·tokens_d.


@functools.partial(jax.jit, static_argnames=("balance_shares", "reference"))
def domain_weighting(
  stats: DomainStats,
  *,
  target_shares: jax.Array | Sequence[float],
  alpha: ArrayLike = 1.0,
  clip_min: ArrayLike = GAP_CLIP_MIN,
  clip_max: ArrayLike = GAP_CLIP_MAX,
  balance_shares: bool = True,
  reference: str = "share_weighted",
) -> DomainWeighting:
  """Open-MOPD per-domain weights (M1 + M2) from global `DomainStats`.

  With N = Σ_d tokens_d and P the domains present in the batch (tokens_d > 0):

    o_d      = tokens_d / N
    g*_d     = target_d / Σ_{e∈P} target_e   on P (uniform on P if every target there is 0)
    base_d   = g*_d / o_d                    (M1; 1 on P when `balance_shares=False`)
    m_d      = abs_d / tokens_d
    ref      = Σ_d base_d·m_d / Σ_d base_d   ("share_weighted", the code)  or  mean_{d∈P} m_d
               ("mean", the project page)
    factor_d = clip((m_d / ref)^α, clip_min, clip_max)      (1 if ref = 0)
    w_d      = base_d·factor_d·N / Σ_e base_e·factor_e·tokens_e

  so the token-weighted mean weight Σ_d w_d·tokens_d / N is 1 (loss scale unchanged). Absent
  domains get weight 0 and no NaN. α = 0 turns gap-following off (factor 1).

  Args:
    stats: `DomainStats` of the *whole* rollout batch (summed over micro-batches / devices).
    target_shares: `[D]` target token shares (1/3 each in the paper); 0 = no target.
    alpha: gap-following exponent α (1.0 in the paper; "multiply" direction).
    clip_min: lower clip of the factor (0.05).
    clip_max: upper clip of the factor (20).
    balance_shares: apply M1 token-share balancing (default True).
    reference: "share_weighted" (default, the official code) or "mean" (the project page).

  Returns:
    `DomainWeighting` of `[D]` arrays; `.weight` is the per-domain weight.
  """
  if reference not in GAP_REFERENCES:
    raise ValueError(f"unknown reference {reference!r}; valid: {', '.join(GAP_REFERENCES)}")
  tokens = jnp.asarray(stats.num_tokens, jnp.float32)
  abs_reward = jnp.asarray(stats.abs_reward, jnp.float32)
  target = jnp.asarray(target_shares, jnp.float32)
  chex.assert_rank(target, 1)
  chex.assert_equal_shape([tokens, abs_reward, target])
  present = tokens > 0
  total = jnp.sum(tokens)
  safe_tokens = jnp.maximum(tokens, 1e-30)

  token_share = tokens / jnp.maximum(total, 1e-30)
  target = jnp.where(present, jnp.maximum(target, 0.0), 0.0)
  uniform = present.astype(jnp.float32)
  target_sum = jnp.sum(target)
  target = jnp.where(target_sum > 0, target, uniform)
  target_share = target / jnp.maximum(jnp.sum(target), 1e-30)
  if balance_shares:
    base = jnp.where(present, target_share / jnp.where(present, token_share, 1.0), 0.0)
  else:
    base = uniform

  mean_abs = jnp.where(present, abs_reward / safe_tokens, 0.0)
  if reference == "share_weighted":
    ref = jnp.sum(base * mean_abs) / jnp.maximum(jnp.sum(base), 1e-30)
  else:
    ref = jnp.sum(mean_abs) / jnp.maximum(jnp.sum(uniform), 1.0)
  ratio = mean_abs / jnp.where(ref > 0, ref, 1.0)
  factor = jnp.clip(jnp.power(ratio, alpha), clip_min, clip_max)
  factor = jnp.where(present & (ref > 0), factor, 1.0)

  raw = base * factor
  scale = total / jnp.sum(raw * tokens)
  weight = jnp.where(jnp.isfinite(scale) & (scale > 0), raw * scale, raw)
  return DomainWeighting(
    token_share=token_share,
    target_share=target_share,
    share_weight=base,
    mean_abs_reward=mean_abs,
    gap_factor=factor,
    weight=weight,
  )


@functools.partial(jax.jit, static_argnames=("balance_shares", "reference"))
def domain_weights_from_stats(
  stats: DomainStats,
  domain_ids: jax.Array,
  *,
  target_shares: jax.Array | Sequence[float],
  alpha: ArrayLike = 1.0,
  clip_min: ArrayLike = GAP_CLIP_MIN,
  clip_max: ArrayLike = GAP_CLIP_MAX,
  balance_shares: bool = True,
  reference: str = "share_weighted",
) -> jax.Array:
  """Per-sequence weights w_i = w_{d(i)} from global `DomainStats` (see `domain_weighting`).

  The micro-batch / device path: sum `domain_token_stats` over the whole batch, then call this
  on each micro-batch's `domain_ids`; the weights equal the full-batch ones exactly.

  Args:
    stats: `DomainStats` of the whole batch.
    domain_ids: `[batch]` int domain ids of the rows to weight (any subset of the batch).
    target_shares: `[D]` target token shares.
    alpha: gap-following exponent α.
    clip_min: lower clip of the gap factor.
    clip_max: upper clip of the gap factor.
    balance_shares: apply M1.
    reference: "share_weighted" or "mean" (see `domain_weighting`).

  Returns:
    `[batch]` float32 weights, stop-gradient.

  Examples:
    >>> import jax.numpy as jnp
    >>> ids = jnp.array([0, 1])
    >>> st = domain_token_stats(jnp.array([[1, 1, 1], [1, 0, 0]]), ids, jnp.ones((2, 3)), 2)
    >>> w = domain_weights_from_stats(st, ids, target_shares=[0.5, 0.5], alpha=0.0)
    >>> [round(float(x), 4) for x in w]  # o = [¾, ¼]: base = ½/o
    [0.6667, 2.0]
  """
  table = domain_weighting(
    stats,
    target_shares=target_shares,
    alpha=alpha,
    clip_min=clip_min,
    clip_max=clip_max,
    balance_shares=balance_shares,
    reference=reference,
  ).weight
  return jax.lax.stop_gradient(table[jnp.asarray(domain_ids)])


@functools.partial(jax.jit, static_argnames=("balance_shares", "reference"))
def domain_weights(
  mask: jax.Array,
  domain_ids: jax.Array,
  token_rewards: jax.Array,
  *,
  target_shares: jax.Array | Sequence[float],
  alpha: ArrayLike = 1.0,
  clip_min: ArrayLike = GAP_CLIP_MIN,
  clip_max: ArrayLike = GAP_CLIP_MAX,
  balance_shares: bool = True,
  reference: str = "share_weighted",
) -> jax.Array:
  """Open-MOPD per-sequence loss weights: token-share balancing × gap-following, mean 1.

  Computes `domain_token_stats` over the given (whole) batch and `domain_weighting` from them
  (formulas there; arXiv 2608.19098), returning w_i = w_{d(i)} with
  Σ_i w_i·L_i / Σ_i L_i = 1. Compute once per rollout batch from rollout-time rewards and
  keep fixed over the inner updates; apply to the advantage after the reward refresh.

  Args:
    mask: `[batch, time]` response mask.
    domain_ids: `[batch]` int domain ids in `[0, D)`.
    token_rewards: `[batch, time, K]` or `[batch, time]` rollout-time rewards.
    target_shares: `[D]` target token shares (D = number of domains).
    alpha: gap-following exponent α (paper 1.0; 0 disables M2).
    clip_min: lower clip of the gap factor (0.05).
    clip_max: upper clip of the gap factor (20).
    balance_shares: apply M1 (default True).
    reference: "share_weighted" (code, default) or "mean" (project page).

  Returns:
    `[batch]` float32 weights, stop-gradient.

  Examples:
    >>> import jax.numpy as jnp
    >>> mask = jnp.array([[1, 1, 1], [1, 0, 0]])
    >>> r = jnp.array([[0.1, 0.1, 0.1], [0.4, 0.0, 0.0]])
    >>> w = domain_weights(mask, jnp.array([0, 1]), r, target_shares=[0.5, 0.5], alpha=1.0)
    >>> [round(float(x), 4) for x in w]  # base·m ∝ [⅔·0.1, 2·0.4] = [1, 12]; 3w₀ + w₁ = 4
    [0.2667, 3.2]
  """
  target = jnp.asarray(target_shares, jnp.float32)
  chex.assert_rank(target, 1)
  stats = domain_token_stats(mask, domain_ids, token_rewards, target.shape[0])
  return domain_weights_from_stats(
    stats,
    domain_ids,
    target_shares=target,
    alpha=alpha,
    clip_min=clip_min,
    clip_max=clip_max,
    balance_shares=balance_shares,
    reference=reference,
  )


def rollout_domain_weights(
  mask: jax.Array,
  domain_ids: jax.Array,
  rewards: jax.Array,
  *,
  target_shares: jax.Array | Sequence[float],
  alpha: ArrayLike = 1.0,
  balance_shares: bool = True,
  clip_min: ArrayLike = GAP_CLIP_MIN,
  clip_max: ArrayLike = GAP_CLIP_MAX,
  reference: str = "share_weighted",
  num_chunks: int = 1,
) -> tuple[jax.Array, DomainWeighting]:
  """Per-row Open-MOPD weights and the per-domain table, from the *whole* rollout batch.

  tokens_d, abs_d = Σ over chunks of `domain_token_stats(chunk)`    (additive sums)
  w_d             = `domain_weighting(tokens, abs; M1 if balance_shares, α)`
  w_i             = w_{d(i)},   Σ_i w_i L_i / Σ_i L_i = 1

  Open-MOPD (arXiv 2608.19098) computes these once per rollout batch from the rollout-time
  rewards, before the split into inner updates, and holds them fixed over the updates.
  `num_chunks` > 1 sums the statistics chunk by chunk, as a batch too large for one call (or
  sharded) would: the weights are the same. Unlike `domain_weights`, this also returns the
  `DomainWeighting` table (share weights, gap factors) for the per-domain metrics.

  Args:
    mask: `[B, T]` response mask.
    domain_ids: `[B]` int domain ids in `[0, D)`.
    rewards: `[B, T, K]` (or `[B, T]`) rollout-time rewards r.
    target_shares: `[D]` target token shares (D = number of domains).
    alpha: gap-following exponent α (0 turns M2 off).
    balance_shares: apply M1 token-share balancing.
    clip_min, clip_max: clip of the gap factor (0.05, 20).
    reference: "share_weighted" (official code) or "mean" (project page).
    num_chunks: rows are summed in this many consecutive chunks (must divide B).

  Returns:
    `(weights [B] float32 stop-gradient, DomainWeighting of [D] arrays)`.

  Examples:
    >>> import jax.numpy as jnp
    >>> mask = jnp.array([[1, 1, 1], [1, 0, 0]])
    >>> r = jnp.array([[0.1, 0.1, 0.1], [0.4, 0.0, 0.0]])
    >>> w, table = rollout_domain_weights(mask, jnp.array([0, 1]), r, target_shares=[0.5, 0.5])
    >>> [round(float(x), 4) for x in w]  # as `domain_weights`
    [0.2667, 3.2]
  """
  mask = jnp.asarray(mask, jnp.float32)
  domain_ids = jnp.asarray(domain_ids, jnp.int32)
  target = jnp.asarray(target_shares, jnp.float32)
  chex.assert_rank(target, 1)
  rows = mask.shape[0]
  if num_chunks < 1 or rows % num_chunks:
    raise ValueError(f"num_chunks={num_chunks} must divide the {rows} rows")
  size = rows // num_chunks
  stats = None
  for c in range(num_chunks):
    part = slice(c * size, (c + 1) * size)
    chunk = domain_token_stats(mask[part], domain_ids[part], rewards[part], target.shape[0])
    stats = chunk if stats is None else jax.tree.map(jnp.add, stats, chunk)
  table = domain_weighting(stats, target_shares=target, alpha=alpha, clip_min=clip_min,
                           clip_max=clip_max, balance_shares=balance_shares, reference=reference)
  return jax.lax.stop_gradient(table.weight[domain_ids]), table


# ---------------------------------------------------------------------------------------------
# Per-domain metrics.
# ---------------------------------------------------------------------------------------------


class DomainMetrics(NamedTuple):
  """Per-domain diagnostics, each `[D]` float32; 0 for a domain absent from the batch."""

  token_share: jax.Array  # tokens_d / N.
  prompt_share: jax.Array  # sequences_d / B.
  budget_share: jax.Array  # Σ_{i∈d} w_i Σ_t m|Σ_k r| / Σ over all domains.
  mean_abs_reward: jax.Array  # Σ_{i∈d} Σ_t m|Σ_k r| / tokens_d.
  staleness_kl: jax.Array | None  # Token mean over d of KL(p̃_old ‖ p̃_cur); None if not given.
  clip_frac: jax.Array | None  # Share of d's (token, candidate) pairs with the PPO clip active.


@functools.partial(
  jax.jit, static_argnames=("num_domains", "epsilon_low", "epsilon_high", "max_log_ratio")
)
def domain_metrics(
  mask: jax.Array,
  domain_ids: jax.Array,
  token_rewards: jax.Array,
  *,
  num_domains: int,
  seq_weights: jax.Array | None = None,
  old_topk_logp: jax.Array | None = None,
  topk_logp: jax.Array | None = None,
  epsilon_low: float = 0.2,
  epsilon_high: float = 0.28,
  max_log_ratio: float | None = 20.0,
) -> DomainMetrics:
  """Per-domain token share, gradient-budget share, mean |reward|, staleness and clip fraction.

  budget_d = Σ_{i∈d} w_i·Σ_t m[i,t]·|Σ_k r[i,t,k]|  (the paper's "tokens × mean |reward|",
  times the domain weight when given); staleness and clip fraction need the rollout-time and
  current top-K log-probs. A candidate counts as clipped when ρ > 1+ε_high with r > 0 or
  ρ < 1−ε_low with r < 0 (the sign of r is the sign of the advantage: weights are positive).
  Pass the whole batch (sharded under `jit` is fine) so that shares are global.

  Args:
    mask: `[batch, time]` response mask.
    domain_ids: `[batch]` int domain ids.
    token_rewards: `[batch, time, K]` or `[batch, time]` rewards (the ones the update uses).
    num_domains: static D.
    seq_weights: optional `[batch]` domain weights (default 1).
    old_topk_logp: optional `[batch, time, K]` rollout-time student top-K log-probs.
    topk_logp: optional `[batch, time, K]` current student log-probs on the same ids.
    epsilon_low: PPO ε_low for the clip fraction.
    epsilon_high: PPO ε_high for the clip fraction.
    max_log_ratio: clamp of the log-ratio before exp (as the loss).

  Returns:
    `DomainMetrics`.

  Examples:
    >>> import jax.numpy as jnp
    >>> m = domain_metrics(jnp.array([[1, 1], [1, 0]]), jnp.array([0, 2]),
    ...                    jnp.array([[0.5, 0.5], [2.0, 0.0]]), num_domains=3)
    >>> [round(float(x), 4) for x in m.token_share]  # 2 and 1 tokens; domain 1 absent
    [0.6667, 0.0, 0.3333]
    >>> [round(float(x), 4) for x in m.budget_share]  # |r| sums 1.0 and 2.0
    [0.3333, 0.0, 0.6667]
    >>> m.mean_abs_reward.tolist()
    [0.5, 0.0, 2.0]
  """
  mask_f = jnp.asarray(mask, jnp.float32)
  domain_ids = jnp.asarray(domain_ids)
  stats = domain_token_stats(mask_f, domain_ids, token_rewards, num_domains)
  seg = functools.partial(jax.ops.segment_sum, segment_ids=domain_ids, num_segments=num_domains)
  safe = lambda x: jnp.maximum(x, 1e-30)
  present = stats.num_tokens > 0
  per_seq_abs = jnp.sum(_token_abs_reward(mask_f, token_rewards), axis=-1)
  if seq_weights is not None:
    per_seq_abs = per_seq_abs * jnp.asarray(seq_weights, jnp.float32)
  budget = seg(per_seq_abs)

  staleness = clip_frac = None
  if (old_topk_logp is None) != (topk_logp is None):
    raise ValueError("pass both old_topk_logp and topk_logp, or neither")
  if old_topk_logp is not None:
    kl = topk_staleness_kl(old_topk_logp, topk_logp, mask_f)
    staleness = jnp.where(present, seg(jnp.sum(kl, axis=-1)) / safe(stats.num_tokens), 0.0)
    r = jnp.asarray(token_rewards, jnp.float32)
    chex.assert_equal_shape([r, topk_logp])
    log_ratio = jnp.asarray(topk_logp, jnp.float32) - jnp.asarray(old_topk_logp, jnp.float32)
    valid = mask_f[..., None] > 0
    log_ratio = jnp.where(valid, log_ratio, 0.0)
    if max_log_ratio is not None:
      log_ratio = jnp.clip(log_ratio, -max_log_ratio, max_log_ratio)
    ratio = jnp.exp(log_ratio)
    clipped = ((ratio > 1.0 + epsilon_high) & (r > 0)) | ((ratio < 1.0 - epsilon_low) & (r < 0))
    clipped = jnp.where(valid, clipped, False).astype(jnp.float32)
    k = r.shape[-1]
    clip_frac = jnp.where(
      present, seg(jnp.sum(clipped, axis=(1, 2))) / safe(k * stats.num_tokens), 0.0
    )

  return DomainMetrics(
    token_share=stats.num_tokens / safe(jnp.sum(stats.num_tokens)),
    prompt_share=stats.num_sequences / safe(jnp.sum(stats.num_sequences)),
    budget_share=budget / safe(jnp.sum(budget)),
    mean_abs_reward=jnp.where(present, stats.abs_reward / safe(stats.num_tokens), 0.0),
    staleness_kl=staleness,
    clip_frac=clip_frac,
  )


# ---------------------------------------------------------------------------------------------
# Host-side helpers.
# ---------------------------------------------------------------------------------------------


def encode_domain_labels(labels: Sequence[str], domains: Sequence[str]) -> np.ndarray:
  """Maps domain labels to int32 ids (the position in `domains`); host-side, not jittable.

  Args:
    labels: one domain label per sequence.
    domains: the known domains, in id order (e.g. `("math", "code", "if")`).

  Returns:
    `[len(labels)]` int32 ids.

  Raises:
    ValueError: naming every unknown label and listing the known domains.

  Examples:
    >>> encode_domain_labels(["code", "math", "code"], ("math", "code", "if")).tolist()
    [1, 0, 1]
  """
  index = {name: i for i, name in enumerate(domains)}
  if len(index) != len(domains):
    raise ValueError(f"duplicate domain names in {list(domains)}")
  unknown = sorted({str(label) for label in labels if label not in index})
  if unknown:
    raise ValueError(
      f"unknown domain label(s) {', '.join(map(repr, unknown))}; known domains: "
      f"{', '.join(map(repr, domains))}"
    )
  return np.asarray([index[label] for label in labels], np.int32)


def check_domain_ids(domain_ids, num_domains: int, domains: Sequence[str] | None = None) -> None:
  """Raises a ValueError naming any id outside `[0, num_domains)`; host-side.

  `segment_sum` silently drops such ids and indexing clamps them, so check before jitting.

  Examples:
    >>> check_domain_ids([0, 2, 1], 3)
    >>> check_domain_ids([0, 3], 3, ("math", "code", "if"))
    Traceback (most recent call last):
    ...
    ValueError: unknown domain id(s) 3; valid ids are 0..2 ('math', 'code', 'if')
  """
  ids = np.asarray(domain_ids)
  if ids.size and not np.issubdtype(ids.dtype, np.integer):
    raise ValueError(f"domain ids must be integers, got dtype {ids.dtype}")
  bad = sorted({int(i) for i in ids.reshape(-1) if not 0 <= int(i) < num_domains})
  if bad:
    names = f" ({', '.join(map(repr, domains))})" if domains is not None else ""
    raise ValueError(
      f"unknown domain id(s) {', '.join(map(str, bad))}; valid ids are 0..{num_domains - 1}{names}"
    )
