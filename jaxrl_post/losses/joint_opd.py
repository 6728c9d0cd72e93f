"""OPD-then-RL (arXiv 2609.04108, "Sequential Beats Joint"): the switch and the joint baselines.

Every method of the paper is one PPO-clipped surrogate min(ρ^alg A, clip(ρ^alg, 1±ε) A) with a
method-specific token advantage A^alg and ratio ρ^alg, built from

  Â^(i)     the GRPO advantage of rollout i (`advantages.group_advantages`, std="group")
  d_t^(i)   = log π_T(y_t|h_t) − log π_θ(y_t|h_t), the sampled-token OPD signal
  c^(i)     = 1[R^(i) = 1]        (rollout i is correct)
  C(x)      = 1[Σ_j R^(j) = 0]    (every rollout of prompt x failed)

The method itself is a hard switch, `opd_then_rl_advantages`: A = d_t for training steps
1..S, Â afterwards. `auto_switch_step` is a PROPOSAL (not in the paper) for choosing S from
the evaluation history. The joint baselines of Table 1 are in `JOINT_OPD_BASELINES` and run through
`joint_opd_advantages(name, ...)`:

  name              ratio ρ^alg                   advantage A^alg
  "kdrl"            r                             Â + β d
  "kdrl_mask"       r                             Â + (1 − c) β d
  "srpo"            r                             c Â + (1 − c) d
  "hdpo"            r                             Â + C(x) β d
  "trrd"            r^α · e^{−(1−α) d}            Â
  "rlsd"            r                             ((1 − λ) + λ clip(e^{sign(Â) d}, 1 ± ε)) Â
  "kdrl_annealing"  r                             KDRL with β linear 0.2 → 0.002 over training

They return `JointOPDTerms(adv, old_logp, logp_scale)`, which plug into the ordinary loss as

  policy_loss(terms.logp_scale * logp, terms.old_logp, terms.adv, mask, ...)

so that the loss's log-ratio is log ρ^alg (for every method but TRRD `logp_scale` = 1 and
`old_logp` is the rollout log-prob, i.e. the plain ratio r).

Conventions:
  * `logp` passed to these functions is the rollout (old) student log-prob, detached. In the
    advantages d_t is evaluated there (the value of log π_θ when the batch was sampled, as a
    detached reward, like sampled-token OPD); in TRRD's ratio d_t uses the current log-prob
    through `logp_scale * logp`, so its gradient is that of the paper's ρ^alg.
  * Groups are given as `group_ids[b]` (the prompt of row b), as in `advantages.outcome`: rows of a
    group need not be contiguous; `num_groups` is the static number of segments. Only HDPO needs
    them.
  * The teacher and the base student may have different EOS tokens, so the final EOS position
    is masked out of every teacher-derived term (d_t := 0 there, App. A): build the mask with
    `final_eos_mask` and pass it as `eos_mask`.
  * Training steps count from 1 (the loop's steps); step 0 is the evaluation before training.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Sequence
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from jaxrl_post.registry import Registry

JOINT_OPD_BASELINES: Registry = Registry("joint OPD baseline")

# Table 1 settings: β = 0.2 on K&K / Zebra, 0.02 on Countdown, on DeepMath 0.01
# (HDPO) and 0.002 (KDRL, KDRL-mask); TRRD α = 0.5; RLSD λ = 1.0, ε = 0.2.
BETA = 0.2
TRRD_ALPHA = 0.5
RLSD_LAMBDA = 1.0
RLSD_EPSILON = 0.2
ANNEAL_BETA_START = 0.2
ANNEAL_BETA_END = 0.002

# The PROPOSAL switch rule (not in the paper; `auto_switch_step`).
SWITCH_WINDOW = 3
SWITCH_DELTA = 0.005  # 0.5 points of pass@1 when scores are fractions in [0, 1].
SWITCH_BUDGET_FRACTION = 0.4

# Data-dependent keywords that `joint_opd_advantages` accepts for every baseline and forwards
# only to the baselines that use them, so one call site can run any of them by name.
DATA_KNOBS = ("eos_mask", "group_ids", "num_groups", "axis_name", "step", "total_steps")


class JointOPDTerms(NamedTuple):
  """What a joint method feeds the PPO-clipped loss; all `[batch, time]` float32, detached.

  log ρ^alg = logp_scale · logp − old_logp with `logp` the current (differentiable) log-prob:
  `policy_loss(terms.logp_scale * logp, terms.old_logp, terms.adv, mask, ...)`.
  """

  adv: jax.Array  # A^alg, 0 on padding.
  old_logp: jax.Array  # The log-prob the ratio is taken against (rollout log-prob but in TRRD).
  logp_scale: jax.Array  # Multiplies the current log-prob in the ratio (1 but in TRRD).


# ---------------------------------------------------------------------------------------------
# Shared pieces.
# ---------------------------------------------------------------------------------------------


@jax.jit
def final_eos_mask(mask: jax.Array, ends_with_eos: jax.Array | None = None) -> jax.Array:
  """The last active position of each row: where the student's EOS token sits.

  The teacher of arXiv 2609.04108 (App. A) has a different EOS token from the base student, so
  its log-prob of the student's EOS is meaningless; every teacher-derived term is set to 0 there.
  Rows cut at the length limit end without an EOS: pass `ends_with_eos` to leave them alone.

  Args:
    mask: `[batch, time]` response mask (> 0 = response token); need not be left-aligned.
    ends_with_eos: optional `[batch]` bool, whether the row's last token is an EOS (default:
      every non-empty row).

  Returns:
    `[batch, time]` bool, True at most once per row.

  Examples:
    >>> import jax.numpy as jnp
    >>> final_eos_mask(jnp.array([[1, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]]),
    ...                jnp.array([True, False, True])).astype(int).tolist()
    [[0, 0, 1, 0], [0, 0, 0, 0], [0, 0, 0, 0]]
  """
  chex.assert_rank(mask, 2)
  valid = jnp.asarray(mask) > 0
  t = jnp.arange(valid.shape[1])
  last = jnp.max(jnp.where(valid, t, -1), axis=-1)
  out = valid & (t[None, :] == last[:, None])
  if ends_with_eos is not None:
    ends_with_eos = jnp.asarray(ends_with_eos, bool)
    chex.assert_shape(ends_with_eos, valid.shape[:1])
    out &= ends_with_eos[:, None]
  return out


def _prepare(adv, teacher_logp, logp, mask, eos_mask):
  """(Â [B,T], d [B,T], valid [B,T], teacher-term mask [B,T]); d and Â are 0 where not used."""
  chex.assert_rank([teacher_logp, logp, mask], 2)
  chex.assert_equal_shape([teacher_logp, logp, mask])
  valid = jnp.asarray(mask) > 0
  teacher_valid = valid
  if eos_mask is not None:
    chex.assert_equal_shape([eos_mask, mask])
    teacher_valid = valid & ~(jnp.asarray(eos_mask) > 0)
  diff = jnp.asarray(teacher_logp, jnp.float32) - jnp.asarray(logp, jnp.float32)
  d = jax.lax.stop_gradient(jnp.where(teacher_valid, diff, 0.0))
  adv = jnp.asarray(adv, jnp.float32)
  chex.assert_rank(adv, {1, 2})
  if adv.ndim == 1:
    chex.assert_shape(adv, valid.shape[:1])
    adv = adv[:, None]
  adv = jax.lax.stop_gradient(jnp.where(valid, jnp.broadcast_to(adv, valid.shape), 0.0))
  return adv, d, valid, teacher_valid


def _terms(adv, logp, valid):
  """Terms with the plain ratio r (every baseline but TRRD)."""
  return JointOPDTerms(
    adv=jnp.where(valid, adv, 0.0),
    old_logp=jnp.asarray(logp, jnp.float32),
    logp_scale=jnp.ones(valid.shape, jnp.float32),
  )


def _rewards(rewards, batch, name):
  if rewards is None:
    raise ValueError(f"joint OPD baseline {name!r} needs verifier rewards (rewards=[batch]); "
                     "got None")
  rewards = jnp.asarray(rewards, jnp.float32)
  chex.assert_shape(rewards, (batch,))
  return rewards


def _correct(rewards, correct_reward):
  """c^(i) = 1[R^(i) = 1] as a `[batch, 1]` float (the reward of a correct answer is a knob)."""
  return (rewards == correct_reward).astype(jnp.float32)[:, None]


# ---------------------------------------------------------------------------------------------
# The method: OPD for steps 1..S, then GRPO.
# ---------------------------------------------------------------------------------------------


@jax.jit
def opd_then_rl_advantages(
  step: jax.Array | int,
  adv: jax.Array,
  teacher_logp: jax.Array,
  logp: jax.Array,
  mask: jax.Array,
  *,
  switch_step: jax.Array | int,
  eos_mask: jax.Array | None = None,
) -> jax.Array:
  """OPD-then-RL token advantages: a hard switch from OPD to GRPO after step S.

    A_t^(i) = d_t^(i) = log π_T − log π_θ   if step ≤ S      (sampled-token OPD)
            = Â^(i)                          otherwise         (GRPO, std-normalised)

  No blending. The loss is the usual PPO-clipped surrogate averaged as
  (1/G) Σ_i (1/|y_i|) Σ_t (Eq. 1; `loss_agg_mode="seq-mean-token-mean"`). The paper's default is
  S = 60 of 150 steps; `auto_switch_step` proposes S from the evaluation history. `step` and
  `switch_step` may be traced, so the switch does not recompile.

  Args:
    step: the training step, counted from 1.
    adv: `[batch]` (or `[batch, time]`) GRPO advantages Â.
    teacher_logp: `[batch, time]` teacher log-probs of the sampled tokens.
    logp: `[batch, time]` rollout student log-probs of the same tokens.
    mask: `[batch, time]` loss mask.
    switch_step: S, the last OPD step.
    eos_mask: optional `[batch, time]` positions where d_t := 0 (`final_eos_mask`).

  Returns:
    `[batch, time]` float32 advantages, stop-gradient, 0 on padding.

  Examples:
    >>> import jax.numpy as jnp
    >>> args = (jnp.array([2.0]), jnp.log(jnp.array([[0.5, 0.25]])),
    ...         jnp.log(jnp.array([[0.25, 0.25]])), jnp.ones((1, 2)))
    >>> [round(x, 4) for x in opd_then_rl_advantages(60, *args, switch_step=60)[0].tolist()]
    [0.6931, 0.0]
    >>> opd_then_rl_advantages(61, *args, switch_step=60).tolist()
    [[2.0, 2.0]]

  References:
    Li et al., Sequential Beats Joint: On the Interplay between On-Policy Distillation and
    RLVR, arXiv 2609.04108.
  """
  a, d, _, _ = _prepare(adv, teacher_logp, logp, mask, eos_mask)
  return jnp.where(jnp.asarray(step) <= jnp.asarray(switch_step), d, a)


def auto_switch_step(
  history: Sequence[tuple[int, float]],
  *,
  total_steps: int,
  window: int = SWITCH_WINDOW,
  delta: float = SWITCH_DELTA,
  budget_fraction: float = SWITCH_BUDGET_FRACTION,
) -> int:
  """The switch step S proposed by the evaluation history (PROPOSAL: not in the paper).

  The paper gives no automatic criterion, only that switching before OPD's validation score
  saturates caps the final accuracy. PROPOSAL (ours): evaluate pass@1 every E steps
  during OPD and switch at the first evaluation whose score improves on the best of the
  previous `window` evaluations by less than `delta`, or once `budget_fraction` of the step
  budget is spent, whichever comes first:

    S = min(first step s_j with score_j − max(score_{j−window..j−1}) < δ,  ⌊budget_fraction·K⌋)

  An evaluation needs `window` earlier ones before it can stop OPD (the step-0 evaluation
  counts). With K = 150 the budget cap is S = 60, the paper's default. The result never grows
  as the history grows and later entries cannot move an S that has already passed, so the
  caller may recompute it after every evaluation and train with A = d while step ≤ S.

  Args:
    history: `(step, score)` of every evaluation so far, in order (pass@1 in [0, 1]).
    total_steps: K, the step budget of the whole run.
    window: how many earlier evaluations the newest one is compared with (3).
    delta: the smallest improvement that keeps OPD going (0.005 = 0.5 pass@1 points).
    budget_fraction: the largest share of the budget spent on OPD (0.4).

  Returns:
    S (int): OPD for steps 1..S, RL afterwards.

  Raises:
    ValueError: if the history's steps are not increasing.

  Examples:
    >>> auto_switch_step([(0, 0.10), (10, 0.30), (20, 0.40), (30, 0.45), (40, 0.452)],
    ...                  total_steps=150)
    40
    >>> auto_switch_step([(0, 0.10), (10, 0.30)], total_steps=150)
    60
  """
  steps = [int(s) for s, _ in history]
  if any(b <= a for a, b in zip(steps, steps[1:])):
    raise ValueError(f"evaluation history steps must increase; got {steps}")
  budget = int(math.floor(budget_fraction * total_steps + 1e-9))  # 0.29·100 is 28.99…
  scores = [float(v) for _, v in history]
  for j in range(window, len(scores)):
    if scores[j] - max(scores[j - window:j]) < delta:
      return min(steps[j], budget)
  return budget


# ---------------------------------------------------------------------------------------------
# The joint baselines of Table 1.
# ---------------------------------------------------------------------------------------------


@JOINT_OPD_BASELINES.register("kdrl")
@jax.jit
def kdrl_advantages(
  adv: jax.Array,
  teacher_logp: jax.Array,
  logp: jax.Array,
  rewards: jax.Array | None,
  mask: jax.Array,
  *,
  beta: float = BETA,
  eos_mask: jax.Array | None = None,
) -> JointOPDTerms:
  """KDRL (additive): A = Â + β d_t, plain ratio r.

  Args:
    adv: `[batch]` (or `[batch, time]`) GRPO advantages Â.
    teacher_logp: `[batch, time]` teacher log-probs of the sampled tokens.
    logp: `[batch, time]` rollout student log-probs of the same tokens.
    rewards: unused (may be None).
    mask: `[batch, time]` loss mask.
    beta: β (0.2 on K&K / Zebra; 0.02 Countdown; 0.002 DeepMath).
    eos_mask: optional `[batch, time]` positions where d_t := 0.

  Returns:
    `JointOPDTerms`.

  Examples:
    >>> import jax.numpy as jnp
    >>> t = kdrl_advantages(jnp.array([1.0]), jnp.array([[-1.0, -2.0]]),
    ...                     jnp.array([[-2.0, -1.0]]), None, jnp.ones((1, 2)), beta=0.5)
    >>> t.adv.tolist()  # 1 ± ½
    [[1.5, 0.5]]

  References:
    arXiv 2609.04108, Table 1 (KDRL).
  """
  del rewards
  a, d, valid, _ = _prepare(adv, teacher_logp, logp, mask, eos_mask)
  return _terms(a + beta * d, logp, valid)


@JOINT_OPD_BASELINES.register("kdrl_mask")
@jax.jit
def kdrl_mask_advantages(
  adv: jax.Array,
  teacher_logp: jax.Array,
  logp: jax.Array,
  rewards: jax.Array,
  mask: jax.Array,
  *,
  beta: float = BETA,
  correct_reward: float = 1.0,
  eos_mask: jax.Array | None = None,
) -> JointOPDTerms:
  """KDRL-mask (additive): A = Â + (1 − c) β d_t, c = 1[R = 1]; distil only failed rollouts.

  Args:
    adv, teacher_logp, logp, mask, eos_mask: as in `kdrl_advantages`.
    rewards: `[batch]` verifier rewards R.
    beta: β (0.2 on K&K / Zebra; 0.02 Countdown; 0.002 DeepMath).
    correct_reward: the reward of a correct rollout (c = 1[R = correct_reward]; 1 in the paper).

  Returns:
    `JointOPDTerms`.

  Examples:
    >>> import jax.numpy as jnp
    >>> t = kdrl_mask_advantages(jnp.array([1.0, -1.0]), jnp.full((2, 1), -1.0),
    ...                          jnp.full((2, 1), -2.0), jnp.array([1.0, 0.0]), jnp.ones((2, 1)))
    >>> [round(x, 4) for x in t.adv[:, 0].tolist()]  # correct: Â; wrong: Â + 0.2·1
    [1.0, -0.8]

  References:
    arXiv 2609.04108, Table 1 (KDRL-mask).
  """
  a, d, valid, _ = _prepare(adv, teacher_logp, logp, mask, eos_mask)
  c = _correct(_rewards(rewards, valid.shape[0], "kdrl_mask"), correct_reward)
  return _terms(a + (1.0 - c) * beta * d, logp, valid)


@JOINT_OPD_BASELINES.register("srpo")
@jax.jit
def srpo_advantages(
  adv: jax.Array,
  teacher_logp: jax.Array,
  logp: jax.Array,
  rewards: jax.Array,
  mask: jax.Array,
  *,
  correct_reward: float = 1.0,
  eos_mask: jax.Array | None = None,
) -> JointOPDTerms:
  """SRPO (additive): A = c Â + (1 − c) d_t — GRPO on correct rollouts, OPD on the others.

  Args:
    adv, teacher_logp, logp, mask, eos_mask: as in `kdrl_advantages`.
    rewards: `[batch]` verifier rewards R.
    correct_reward: the reward of a correct rollout (1 in the paper).

  Returns:
    `JointOPDTerms`.

  Examples:
    >>> import jax.numpy as jnp
    >>> t = srpo_advantages(jnp.array([1.0, -1.0]), jnp.full((2, 1), -1.0),
    ...                     jnp.full((2, 1), -2.0), jnp.array([1.0, 0.0]), jnp.ones((2, 1)))
    >>> t.adv.tolist()  # correct: Â = 1; wrong: d = 1 (no Â)
    [[1.0], [1.0]]

  References:
    arXiv 2609.04108, Table 1 (SRPO).
  """
  a, d, valid, _ = _prepare(adv, teacher_logp, logp, mask, eos_mask)
  c = _correct(_rewards(rewards, valid.shape[0], "srpo"), correct_reward)
  return _terms(c * a + (1.0 - c) * d, logp, valid)


@JOINT_OPD_BASELINES.register("hdpo")
@functools.partial(jax.jit, static_argnames=("num_groups", "axis_name"))
def hdpo_advantages(
  adv: jax.Array,
  teacher_logp: jax.Array,
  logp: jax.Array,
  rewards: jax.Array,
  mask: jax.Array,
  *,
  group_ids: jax.Array | None = None,
  num_groups: int | None = None,
  axis_name: str | None = None,
  beta: float = BETA,
  eos_mask: jax.Array | None = None,
) -> JointOPDTerms:
  """HDPO (additive): A = Â + C(x) β d_t, C(x) = 1[Σ_j R^(j) = 0]; distil only hopeless prompts.

  On a prompt where every rollout failed Â ≡ 0 and GRPO has no signal; HDPO puts the teacher's
  signal there instead.

  Args:
    adv, teacher_logp, logp, mask, eos_mask: as in `kdrl_advantages`.
    rewards: `[batch]` verifier rewards R.
    group_ids: `[batch]` int prompt (group) id of each row, in `[0, num_groups)` (required).
    num_groups: static number of groups (default: batch size; give the global number inside
      `shard_map`).
    axis_name: inside `shard_map`, the mesh axis to psum the group reward sums over (a group may
      span devices).
    beta: β (0.2 on K&K / Zebra; 0.02 Countdown; 0.01 DeepMath).

  Returns:
    `JointOPDTerms`.

  Raises:
    ValueError: without `group_ids` or rewards.

  Examples:
    >>> import jax.numpy as jnp
    >>> t = hdpo_advantages(jnp.zeros(4), jnp.full((4, 1), -1.0), jnp.full((4, 1), -2.0),
    ...                     jnp.array([0.0, 0.0, 1.0, 0.0]), jnp.ones((4, 1)),
    ...                     group_ids=jnp.array([0, 0, 1, 1]))
    >>> [round(x, 4) for x in t.adv[:, 0].tolist()]  # group 0 all wrong: β·d; group 1 not
    [0.2, 0.2, 0.0, 0.0]

  References:
    arXiv 2609.04108, Table 1 (HDPO).
  """
  a, d, valid, _ = _prepare(adv, teacher_logp, logp, mask, eos_mask)
  r = _rewards(rewards, valid.shape[0], "hdpo")
  if group_ids is None:
    raise ValueError("joint OPD baseline 'hdpo' needs group_ids=[batch] (the prompt of each row) "
                     "for C(x) = 1[Σ_j R_j = 0]; got None")
  group_ids = jnp.asarray(group_ids)
  chex.assert_shape(group_ids, r.shape)
  num_groups = r.shape[0] if num_groups is None else num_groups
  totals = jax.ops.segment_sum(r, group_ids, num_segments=num_groups)
  if axis_name is not None:
    totals = jax.lax.psum(totals, axis_name)
  hopeless = (totals[group_ids] == 0.0).astype(jnp.float32)[:, None]
  return _terms(a + hopeless * beta * d, logp, valid)


@JOINT_OPD_BASELINES.register("trrd")
@jax.jit
def trrd_advantages(
  adv: jax.Array,
  teacher_logp: jax.Array,
  logp: jax.Array,
  rewards: jax.Array | None,
  mask: jax.Array,
  *,
  alpha: float = TRRD_ALPHA,
  eos_mask: jax.Array | None = None,
) -> JointOPDTerms:
  """TRRD (modulated ratio): ρ^alg = r^α · e^{−(1−α) d_t}, A = Â.

  With r = π_θ/π_old and d_t = log π_T − log π_θ (current policy),
  log ρ^alg = α(log π_θ − log π_old) − (1−α)(log π_T − log π_θ) = log π_θ − [α log π_old +
  (1−α) log π_T]: the ratio against a geometric mixture of the old policy and the teacher, so
  clipping keeps the update in a trust region around it. Returned as `old_logp` = α log π_old +
  (1−α) log π_T and `logp_scale` = 1. Where d_t := 0 (the masked final EOS) ρ^alg = r^α:
  `old_logp` = α log π_old and `logp_scale` = α.

  Args:
    adv, teacher_logp, logp, mask, eos_mask: as in `kdrl_advantages` (`logp` = log π_old).
    rewards: unused (may be None).
    alpha: α (0.5).

  Returns:
    `JointOPDTerms`; use `policy_loss(terms.logp_scale * logp, terms.old_logp, terms.adv, ...)`.

  Examples:
    >>> import jax.numpy as jnp
    >>> t = trrd_advantages(jnp.array([1.0]), jnp.array([[-1.0, -3.0]]),
    ...                     jnp.array([[-2.0, -2.0]]), None, jnp.ones((1, 2)))
    >>> t.old_logp.tolist(), t.logp_scale.tolist()  # ½(−2) + ½(−1), ½(−2) + ½(−3)
    ([[-1.5, -2.5]], [[1.0, 1.0]])

  References:
    arXiv 2609.04108, Table 1 (TRRD).
  """
  del rewards
  a, _, valid, teacher_valid = _prepare(adv, teacher_logp, logp, mask, eos_mask)
  old = jnp.asarray(logp, jnp.float32)
  teacher = jnp.where(teacher_valid, jnp.asarray(teacher_logp, jnp.float32), 0.0)
  w = teacher_valid.astype(jnp.float32)
  scale = alpha + (1.0 - alpha) * w
  mixed = alpha * old + (1.0 - alpha) * w * teacher
  return JointOPDTerms(
    adv=jnp.where(valid, a, 0.0),
    old_logp=jax.lax.stop_gradient(jnp.where(valid, mixed, old)),
    logp_scale=jnp.where(valid, scale, 1.0),
  )


@JOINT_OPD_BASELINES.register("rlsd")
@jax.jit
def rlsd_advantages(
  adv: jax.Array,
  teacher_logp: jax.Array,
  logp: jax.Array,
  rewards: jax.Array | None,
  mask: jax.Array,
  *,
  lam: float = RLSD_LAMBDA,
  epsilon: float = RLSD_EPSILON,
  eos_mask: jax.Array | None = None,
) -> JointOPDTerms:
  """RLSD (modulated advantage): A = ((1 − λ) + λ·clip(e^{sign(Â) d_t}, 1−ε, 1+ε))·Â.

  The teacher re-weights the GRPO advantage token by token: a token the teacher likes more than
  the student (d > 0) gets a larger credit in a correct rollout (Â > 0) and a smaller blame in a
  wrong one, within [1−ε, 1+ε].

  Args:
    adv, teacher_logp, logp, mask, eos_mask: as in `kdrl_advantages`.
    rewards: unused (may be None).
    lam: λ (1.0).
    epsilon: ε of the weight's clip (0.2).

  Returns:
    `JointOPDTerms`.

  Examples:
    >>> import jax.numpy as jnp
    >>> t = rlsd_advantages(jnp.array([2.0, -2.0]), jnp.full((2, 1), -1.0),
    ...                     jnp.full((2, 1), -1.1), None, jnp.ones((2, 1)))
    >>> [round(x, 4) for x in t.adv[:, 0].tolist()]  # 2·e^{0.1}, −2·e^{−0.1}
    [2.2103, -1.8097]

  References:
    arXiv 2609.04108, Table 1 (RLSD).
  """
  del rewards
  a, d, valid, _ = _prepare(adv, teacher_logp, logp, mask, eos_mask)
  weight = jnp.clip(jnp.exp(jnp.sign(a) * d), 1.0 - epsilon, 1.0 + epsilon)
  return _terms(((1.0 - lam) + lam * weight) * a, logp, valid)


def annealed_beta(
  step: jax.Array | int,
  total_steps: jax.Array | int,
  beta_start: float = ANNEAL_BETA_START,
  beta_end: float = ANNEAL_BETA_END,
) -> jax.Array:
  """KDRL-annealing's β: linear from `beta_start` at step 1 to `beta_end` at the last step.

    β_k = β_start + (β_end − β_start)·clip((k − 1)/max(K − 1, 1), 0, 1)

  The paper says only "β linearly 0.2 → 0.002"; the end points at steps 1 and K are our reading
  (PROPOSAL).

  Examples:
    >>> [round(float(annealed_beta(k, 101)), 4) for k in (1, 51, 101, 200)]
    [0.2, 0.101, 0.002, 0.002]
  """
  frac = (jnp.asarray(step, jnp.float32) - 1.0) / jnp.maximum(
    jnp.asarray(total_steps, jnp.float32) - 1.0, 1.0)
  return beta_start + (beta_end - beta_start) * jnp.clip(frac, 0.0, 1.0)


@JOINT_OPD_BASELINES.register("kdrl_annealing")
@jax.jit
def kdrl_annealing_advantages(
  adv: jax.Array,
  teacher_logp: jax.Array,
  logp: jax.Array,
  rewards: jax.Array | None,
  mask: jax.Array,
  *,
  step: jax.Array | int | None = None,
  total_steps: jax.Array | int | None = None,
  beta_start: float = ANNEAL_BETA_START,
  beta_end: float = ANNEAL_BETA_END,
  eos_mask: jax.Array | None = None,
) -> JointOPDTerms:
  """KDRL-annealing (schedule): KDRL with β = `annealed_beta(step, total_steps)`, 0.2 → 0.002.

  Args:
    adv, teacher_logp, logp, mask, eos_mask: as in `kdrl_advantages`.
    rewards: unused (may be None).
    step: the training step, from 1 (required; may be traced).
    total_steps: the step budget K (required).
    beta_start, beta_end: the end points of the linear schedule (0.2, 0.002).

  Returns:
    `JointOPDTerms`.

  Raises:
    ValueError: without `step` or `total_steps`.

  Examples:
    >>> import jax.numpy as jnp
    >>> t = kdrl_annealing_advantages(jnp.array([1.0]), jnp.array([[-1.0]]),
    ...                               jnp.array([[-2.0]]), None, jnp.ones((1, 1)),
    ...                               step=1, total_steps=150)
    >>> round(float(t.adv[0, 0]), 4)  # 1 + 0.2·1
    1.2

  References:
    arXiv 2609.04108, Table 1 (KDRL-Annealing).
  """
  if step is None or total_steps is None:
    raise ValueError("joint OPD baseline 'kdrl_annealing' needs step= and total_steps= for its "
                     "β schedule")
  beta = annealed_beta(step, total_steps, beta_start, beta_end)
  return kdrl_advantages(adv, teacher_logp, logp, rewards, mask, beta=beta, eos_mask=eos_mask)


def _knobs(fn) -> tuple[str, ...]:
  params = inspect.signature(fn).parameters.values()
  return tuple(p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY)


def joint_opd_advantages(
  name: str,
  adv: jax.Array,
  teacher_logp: jax.Array,
  logp: jax.Array,
  rewards: jax.Array | None,
  mask: jax.Array,
  **knobs,
) -> JointOPDTerms:
  """The token advantage and ratio of a joint OPD + RL baseline of Table 1, chosen by name.

  Names (case and '-' / '_' do not matter, so "KDRL-mask" works): "kdrl", "kdrl_mask", "srpo",
  "hdpo", "trrd", "rlsd", "kdrl_annealing"; see the module docstring for the formulas.

  Args:
    name: the baseline.
    adv: `[batch]` (or `[batch, time]`) GRPO advantages Â.
    teacher_logp: `[batch, time]` teacher log-probs of the sampled tokens.
    logp: `[batch, time]` rollout (old) student log-probs of the same tokens.
    rewards: `[batch]` verifier rewards R (needed by kdrl_mask, srpo, hdpo; else may be None).
    mask: `[batch, time]` loss mask.
    **knobs: the baseline's settings (beta, alpha, lam, epsilon, correct_reward, beta_start,
      beta_end) and data: `eos_mask`, `group_ids`, `num_groups`, `axis_name`, `step`,
      `total_steps`. Data knobs a baseline does not use are ignored, so one call site can run
      every baseline; an unknown setting is an error.

  Returns:
    `JointOPDTerms(adv, old_logp, logp_scale)`; the loss is
    `policy_loss(terms.logp_scale * logp_new, terms.old_logp, terms.adv, mask, ...)`.

  Raises:
    ValueError: for an unknown name (naming the known ones) or missing inputs of a baseline.
    TypeError: for a setting the baseline does not have (naming the ones it has).

  Examples:
    >>> import jax.numpy as jnp
    >>> t = joint_opd_advantages("KDRL-mask", jnp.array([1.0, -1.0]), jnp.full((2, 1), -1.0),
    ...                          jnp.full((2, 1), -2.0), jnp.array([1.0, 0.0]),
    ...                          jnp.ones((2, 1)), beta=0.5, group_ids=jnp.array([0, 0]))
    >>> t.adv.tolist()
    [[1.0], [-0.5]]

  References:
    Li et al., Sequential Beats Joint: On the Interplay between On-Policy Distillation and
    RLVR, arXiv 2609.04108, Table 1.
  """
  key = str(name).strip().lower().replace("-", "_")
  if key not in JOINT_OPD_BASELINES:
    raise ValueError(f"unknown joint OPD baseline {name!r}; known: "
                     f"{', '.join(JOINT_OPD_BASELINES.names())}")
  fn = JOINT_OPD_BASELINES.get(key)
  accepted = _knobs(fn)
  unknown = sorted(set(knobs) - set(accepted) - set(DATA_KNOBS))
  if unknown:
    settings = [k for k in accepted if k not in DATA_KNOBS]
    raise TypeError(f"joint OPD baseline {key!r} has no setting(s) {unknown}; its settings: "
                    f"{', '.join(settings) or 'none'}")
  return fn(adv, teacher_logp, logp, rewards, mask,
            **{k: v for k, v in knobs.items() if k in accepted})
