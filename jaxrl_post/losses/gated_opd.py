"""Verifier-gated on-policy distillation: TGOPD, OPDVR and GRPD.

Plain sampled-token OPD trusts the teacher everywhere: the per-token advantage is
d_t = lp_T[t] − lp_old[t] (`distillation.sampled_token_opd_reward`). These methods let the
verifier decide where (or in which direction) the teacher is followed:

  name             gate                                   advantage [batch, time]
  "tgopd"          per prompt, g(x) = 1[q_T(x) ≥ τ],      g·d_t + (1 − g)·(R_i − mean_group R)
                   q_T = mean verifier reward of K_T
                   teacher probe rollouts
  "opdvr"          per rollout, c = 1[R > 0]              c ? max(d_t, 0) : min(d_t, 0)
  "opdvr_inverse"  the same, inverted (ablation)          c ? min(d_t, 0) : max(d_t, 0)
  "grpd"           OPDVR, then a group-relative scale     opdvr_t · (|a_i| + u),  a_i = GRPO
                                                          advantage of c within the group

Every entry of `GATED_OPD_ADVANTAGES` has the signature

  fn(teacher_logp, old_logp, mask=None, *, rewards=..., group_ids=..., probe_rewards=..., **knobs)

(the inputs a method does not use are not accepted), returns `[batch, time]` float32
stop-gradient advantages (0 on padding), and is meant for the ordinary PPO-clipped token loss
(`policy_loss`, token-mean: OPDVR's `loss_agg_mode=token-mean`) with no return sum and no
baseline. A method given no verifier reward, no probe rewards or no group ids where it needs
them raises ValueError naming the missing input; so do mismatched shapes. Rewards follow
`advantages.combine_rewards`: NaN means "missing" (that row gets advantage 0 from the verifier
branches).

Host-side orchestration (probe rollouts, verifier calls) lives in the method; these functions
only see arrays. Group statistics are segment sums with a static number of segments, so rows of
a group may sit on different devices of a sharded batch.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxrl_post.advantages import STD_MODES, group_advantages
from jaxrl_post.losses.distillation import sampled_token_opd_reward
from jaxrl_post.registry import Registry

ArrayLike = jax.Array | float | int

GATED_OPD_ADVANTAGES: Registry = Registry("gated opd advantage")

# TGOPD (arXiv 2609.02998): K_T = 3 probes, τ = 2/3 (2-of-3 majority).
TGOPD_TAU = 2.0 / 3.0
# Tolerance of the gate's comparison: a 2-of-3 pass rate computed in float32 must pass τ = 2/3.
GATE_TOL = 1e-6


def _shape_error(name: str, x, expected: tuple[int, ...], what: str) -> ValueError:
  return ValueError(f"{name} has shape {tuple(x.shape)}; expected {tuple(expected)} ({what})")


def _require(method: str, name: str, value, what: str):
  if value is None:
    raise ValueError(f"{method} needs {name} ({what}); got None")
  return jnp.asarray(value)


def _check_token_inputs(teacher_logp, old_logp, mask):
  teacher_logp = jnp.asarray(teacher_logp)
  old_logp = jnp.asarray(old_logp)
  if teacher_logp.ndim != 2:
    raise ValueError(f"teacher_logp must be [batch, time], got shape {tuple(teacher_logp.shape)}")
  if old_logp.shape != teacher_logp.shape:
    raise _shape_error("old_logp", old_logp, teacher_logp.shape, "teacher_logp's")
  if mask is not None and jnp.shape(mask) != teacher_logp.shape:
    raise _shape_error("mask", jnp.asarray(mask), teacher_logp.shape, "teacher_logp's")
  return teacher_logp, old_logp


def _check_rows(name: str, x: jax.Array, batch: int) -> None:
  if x.shape != (batch,):
    raise _shape_error(name, x, (batch,), "one value per rollout row")


def _check_group_ids(group_ids: jax.Array, batch: int) -> None:
  _check_rows("group_ids", group_ids, batch)
  if not jnp.issubdtype(group_ids.dtype, jnp.integer):
    raise ValueError(f"group_ids must be integers, got {group_ids.dtype}")


def _opd(teacher_logp, old_logp, mask):
  """Sampled-token OPD advantage d = lp_T − lp_old, 0 on padding (±inf there is fine)."""
  return sampled_token_opd_reward(old_logp, teacher_logp, mask)


# ---------------------------------------------------------------------------------------------
# TGOPD: prompt-level teacher gating (arXiv 2609.02998).
# ---------------------------------------------------------------------------------------------


class TeacherGate(NamedTuple):
  """Per-prompt teacher reliability and gate of TGOPD."""

  gate: jax.Array  # [prompts] bool: True = distil from the teacher, False = GRPO fallback.
  pass_rate: jax.Array  # [prompts] float32 q_T(x); NaN for a prompt with no probe reward.
  num_probes: jax.Array  # [prompts] float32 probes with a reward (K_T unless some are missing).


@functools.partial(jax.jit, static_argnames="tol")
def teacher_gate(
    probe_rewards: jax.Array, *, tau: ArrayLike = TGOPD_TAU, tol: float = GATE_TOL
) -> TeacherGate:
  """TGOPD's hard prompt gate from the verifier rewards of teacher probe rollouts.

  q_T(x) = (1/K_T) Σ_k r_k,   g(x) = 1[q_T(x) ≥ τ]   (compared as q_T ≥ τ − tol)

  q_T estimates the teacher's reliability R_T(x) = E_{y~π_T}[r(x, y)] on the prompt, with
  variance R_T(1 − R_T)/K_T. Missing probe rewards (NaN) are left out of the mean; a prompt with
  none closes its gate (falls back to GRPO) — our choice, the paper does not say.

  Args:
    probe_rewards: `[prompts, K_T]` verifier rewards of the teacher's probe rollouts (paper:
      K_T = 3, binary), NaN = missing.
    tau: threshold τ (paper: 2/3, a 2-of-3 majority; the ablation peaks near 3/5–2/3).
    tol: tolerance of the comparison, so that a float32 2/3 passes τ = 2/3 (static).

  Returns:
    `TeacherGate(gate, pass_rate, num_probes)`, each `[prompts]`.

  Examples:
    >>> import jax.numpy as jnp
    >>> out = teacher_gate(jnp.array([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0]]))
    >>> out.gate.tolist()
    [True, False, True]

  References:
    Zhang et al., Verify Before You Distill (TGOPD), arXiv 2609.02998.
  """
  probe_rewards = jnp.asarray(probe_rewards, jnp.float32)
  if probe_rewards.ndim != 2:
    raise ValueError(f"probe_rewards must be [prompts, K_T], got shape "
                     f"{tuple(probe_rewards.shape)}")
  present = ~jnp.isnan(probe_rewards)
  count = jnp.sum(present, axis=-1).astype(jnp.float32)
  total = jnp.sum(jnp.where(present, probe_rewards, 0.0), axis=-1)
  pass_rate = jnp.where(count > 0, total / jnp.maximum(count, 1.0), jnp.nan)
  gate = (count > 0) & (pass_rate >= jnp.asarray(tau, jnp.float32) - tol)
  return TeacherGate(gate, pass_rate, count)


@GATED_OPD_ADVANTAGES.register("tgopd")
@functools.partial(jax.jit, static_argnames=("grpo_std", "eps", "tol"))
def tgopd_advantages(
    teacher_logp: jax.Array,
    old_logp: jax.Array,
    mask: jax.Array | None = None,
    *,
    rewards: jax.Array | None = None,
    group_ids: jax.Array | None = None,
    probe_rewards: jax.Array | None = None,
    tau: ArrayLike = TGOPD_TAU,
    grpo_std: str = "none",
    eps: float = 1e-6,
    tol: float = GATE_TOL,
) -> jax.Array:
  """Teacher-gated OPD: per prompt, either the OPD advantage or the GRPO one, never a blend.

  Â_{i,t} = g(x_i)·(lp_T − lp_old)_{i,t} + (1 − g(x_i))·(R_i − mean_{j∈group(i)} R_j),
  g(x) = 1[q_T(x) ≥ τ] (`teacher_gate`)

  Both branches are computed for every prompt (fixed shapes); the gate selects. A closed-gate
  prompt whose group has no reward variance gets exactly zero update.

  PROPOSAL / not found: the GRPO fallback's normalisation is given by one secondary digest only
  (group-centred, no std); `grpo_std="none"` is that, "group" divides by the group std (GRPO)
  and "batch" by the batch std.

  Args:
    teacher_logp: `[batch, time]` teacher log-probs of the student's sampled tokens.
    old_logp: `[batch, time]` log-probs of the student that sampled them.
    mask: optional `[batch, time]` response mask.
    rewards: `[batch]` verifier rewards R_i of the student rollouts (required), NaN = missing.
    group_ids: `[batch]` int prompt index of each rollout, in `[0, prompts)` (required); it
      indexes both the GRPO groups and the rows of `probe_rewards`.
    probe_rewards: `[prompts, K_T]` verifier rewards of the teacher probes (required).
    tau: gate threshold τ (default 2/3).
    grpo_std: normalisation of the GRPO fallback (default "none", see above; static).
    eps: ε of a std normalisation (static).
    tol: tolerance of the gate comparison (static).

  Returns:
    `[batch, time]` float32 advantages, stop-gradient, 0 on padding.

  Raises:
    ValueError: a required input is None, or shapes / dtypes do not line up.

  Examples:
    >>> import jax.numpy as jnp
    >>> adv = tgopd_advantages(
    ...     jnp.log(jnp.array([[0.4], [0.4], [0.2], [0.2]])), jnp.log(jnp.full((4, 1), 0.2)),
    ...     rewards=jnp.array([1.0, 0.0, 1.0, 0.0]), group_ids=jnp.array([0, 0, 1, 1]),
    ...     probe_rewards=jnp.array([[1.0, 1.0, 0.0], [0.0, 0.0, 1.0]]))
    >>> [round(x, 4) for x in adv[:, 0].tolist()]  # prompt 0: OPD log 2; prompt 1: GRPO ±½
    [0.6931, 0.6931, 0.5, -0.5]

  References:
    Zhang et al., Verify Before You Distill (TGOPD), arXiv 2609.02998.
  """
  method = "tgopd"
  teacher_logp, old_logp = _check_token_inputs(teacher_logp, old_logp, mask)
  batch = teacher_logp.shape[0]
  rewards = _require(method, "rewards", rewards, "the verifier reward of each rollout, [batch]")
  group_ids = _require(method, "group_ids", group_ids, "the prompt index of each rollout")
  probe_rewards = _require(method, "probe_rewards", probe_rewards,
                           "verifier rewards of the teacher's probe rollouts, [prompts, K_T]")
  _check_rows("rewards", rewards, batch)
  _check_group_ids(group_ids, batch)
  if grpo_std not in STD_MODES:
    raise ValueError(f"unknown grpo_std {grpo_std!r}; valid: {', '.join(STD_MODES)}")
  gate = teacher_gate(probe_rewards, tau=tau, tol=tol).gate
  a_opd = _opd(teacher_logp, old_logp, mask)
  a_grpo = group_advantages(rewards, group_ids, num_groups=probe_rewards.shape[0], std=grpo_std,
                            eps=eps)
  valid = jnp.ones(teacher_logp.shape, bool) if mask is None else jnp.asarray(mask) > 0
  adv = jnp.where(gate[group_ids][:, None], a_opd, a_grpo[:, None])
  return jax.lax.stop_gradient(jnp.where(valid, adv, 0.0))


# ---------------------------------------------------------------------------------------------
# OPDVR and GRPD (arXiv 2608.24696).
# ---------------------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames="inverse")
def opdvr_gate(
    opd_reward: jax.Array,
    correct: jax.Array,
    mask: jax.Array | None = None,
    *,
    inverse: bool = False,
) -> jax.Array:
  """OPDVR's correctness gate on any OPD reward: keep only the sign the verifier allows.

  r̃ = max(r, 0) if c = 1 else min(r, 0)   (inverse ablation: min if c = 1, max if c = 0)

  Elementwise over the trailing axes, so it gates the sampled-token reward `[batch, time]` and
  the top-K candidate rewards `[batch, time, K]` alike (their weights are non-negative, so the
  sign logic is unchanged). The verifier fixes each token's direction; the teacher's log-ratio
  only sets its size; tokens whose teacher direction conflicts with the verifier get 0.

  Args:
    opd_reward: `[batch, ...]` OPD rewards (e.g. `lp_T − lp_old`).
    correct: `[batch]` bool (or 0/1) verifier outcome c of each rollout.
    mask: optional `[batch, time]` mask (0 on padding).
    inverse: the "inverse" ablation (static).

  Returns:
    float32 rewards of `opd_reward`'s shape, stop-gradient.

  Examples:
    >>> import jax.numpy as jnp
    >>> r = jnp.array([[0.5, -0.3], [0.5, -0.3]])
    >>> opdvr_gate(r, jnp.array([True, False])).tolist()
    [[0.5, 0.0], [0.0, -0.30000001192092896]]

  References:
    Lin et al., On-policy Distillation with Verifiable Reward, arXiv 2608.24696.
  """
  opd_reward = jnp.asarray(opd_reward, jnp.float32)
  correct = jnp.asarray(correct)
  if opd_reward.ndim < 1:
    raise ValueError("opd_reward must have a leading batch axis")
  _check_rows("correct", correct, opd_reward.shape[0])
  c = (correct > 0).reshape(correct.shape + (1,) * (opd_reward.ndim - 1))
  keep_pos = ~c if inverse else c
  gated = jnp.where(keep_pos, jnp.maximum(opd_reward, 0.0), jnp.minimum(opd_reward, 0.0))
  if mask is not None:
    mask = jnp.asarray(mask)
    if mask.shape != opd_reward.shape[:mask.ndim]:
      raise _shape_error("mask", mask, opd_reward.shape[:2], "opd_reward's leading axes")
    valid = (mask > 0).reshape(mask.shape + (1,) * (opd_reward.ndim - mask.ndim))
    gated = jnp.where(valid, gated, 0.0)
  return jax.lax.stop_gradient(gated)


def _correctness(method, rewards, batch, threshold):
  rewards = _require(method, "rewards", rewards,
                     "the verifier reward of each rollout, [batch]; correct = reward > threshold")
  _check_rows("rewards", rewards, batch)
  rewards = jnp.asarray(rewards, jnp.float32)
  present = ~jnp.isnan(rewards)
  return rewards > threshold, present


@functools.partial(jax.jit, static_argnames="inverse")
def opdvr_advantages(
    teacher_logp: jax.Array,
    old_logp: jax.Array,
    mask: jax.Array | None = None,
    *,
    rewards: jax.Array | None = None,
    threshold: ArrayLike = 0.0,
    inverse: bool = False,
) -> jax.Array:
  """OPDVR: the sampled-token OPD reward gated by the rollout's verifier outcome.

  d_t = lp_T[t] − lp_old[t],  c = 1[R > threshold],
  A_t = max(d_t, 0) if c else min(d_t, 0)         (correct: only non-negative rewards kept)

  No extra hyperparameters (threshold 0 as in the release). Used directly as the advantage
  (verl `token_reward_direct`), with PPO clip 0.2, token-mean, one rollout per prompt.

  Args:
    teacher_logp: `[batch, time]` teacher log-probs of the sampled tokens.
    old_logp: `[batch, time]` log-probs of the student that sampled them.
    mask: optional `[batch, time]` response mask.
    rewards: `[batch]` verifier scores (required); NaN = missing, that row gets 0.
    threshold: correct iff score > threshold (default 0).
    inverse: the "inverse" ablation (`ablation_inverse_gated.sh`; static).

  Returns:
    `[batch, time]` float32 advantages, stop-gradient, 0 on padding.

  Raises:
    ValueError: `rewards` is None, or shapes do not line up.

  Examples:
    >>> import jax.numpy as jnp
    >>> lp_t = jnp.log(jnp.array([[0.4, 0.1], [0.4, 0.1]]))
    >>> adv = opdvr_advantages(lp_t, jnp.log(jnp.full((2, 2), 0.2)), rewards=jnp.array([1., 0.]))
    >>> [[round(x, 4) for x in row] for row in adv.tolist()]  # d = (log 2, −log 2)
    [[0.6931, 0.0], [0.0, -0.6931]]

  References:
    Lin et al., On-policy Distillation with Verifiable Reward, arXiv 2608.24696.
  """
  teacher_logp, old_logp = _check_token_inputs(teacher_logp, old_logp, mask)
  correct, present = _correctness("opdvr", rewards, teacher_logp.shape[0], threshold)
  adv = opdvr_gate(_opd(teacher_logp, old_logp, mask), correct, mask, inverse=inverse)
  return jnp.where(present[:, None], adv, 0.0)


GATED_OPD_ADVANTAGES.add("opdvr", opdvr_advantages)


@GATED_OPD_ADVANTAGES.register("opdvr_inverse")
def opdvr_inverse_advantages(teacher_logp, old_logp, mask=None, **kwargs) -> jax.Array:
  """`opdvr_advantages` with `inverse=True`: correct → min(d, 0), wrong → max(d, 0) (ablation).

  Examples:
    >>> import jax.numpy as jnp
    >>> adv = opdvr_inverse_advantages(jnp.log(jnp.array([[0.4, 0.1]])),
    ...                                jnp.log(jnp.full((1, 2), 0.2)), rewards=jnp.array([1.0]))
    >>> [round(x, 4) for x in adv[0].tolist()]
    [0.0, -0.6931]
  """
  return opdvr_advantages(teacher_logp, old_logp, mask, inverse=True, **kwargs)


@functools.partial(jax.jit, static_argnames=("num_groups", "norm_std", "eps"))
def grpd_scale(
    rewards: jax.Array,
    group_ids: jax.Array,
    *,
    num_groups: int | None = None,
    norm_std: bool = True,
    scale_baseline: ArrayLike = 0.0,
    threshold: ArrayLike = 0.0,
    eps: float = 1e-6,
) -> jax.Array:
  """GRPD's per-rollout scale: |GRPO advantage of correctness within the group| + u.

  c_i = 1[R_i > threshold],  a_i = (c_i − μ_g)/(σ_g + ε) (norm_std) or c_i − μ_g (Dr.GRPO),
  scale_i = |a_i| + u

  σ_g is the unbiased (n−1) group std, ε = 1e-6 (verl `compute_grpo_outcome_advantage`).
  All-correct and all-wrong groups get scale u (default 0: no signal). A group with a single
  rollout also gets a = 0 (the library's `group_advantages`; verl would use a = c there). Rows
  with a missing (NaN) reward are left out of the group statistics and get scale u.

  Default `norm_std=True`: the release's `grpd.sh` default and the reference signature; the OPDVR
  README says the paper used the Dr.GRPO form (`norm_std=False`) — a conflict in the release
 , hence the keyword.

  Args:
    rewards: `[batch]` verifier scores, NaN = missing.
    group_ids: `[batch]` int group (prompt) ids in `[0, num_groups)`.
    num_groups: static number of groups (default: batch size).
    norm_std: divide by the group std (static).
    scale_baseline: u, `grpo_scale_baseline` (default 0).
    threshold: correct iff score > threshold.
    eps: ε of the std normalisation (static).

  Returns:
    `[batch]` float32 scales, stop-gradient.

  Examples:
    >>> import jax.numpy as jnp
    >>> s = grpd_scale(jnp.array([1.0, 0.0, 0.0, 0.0]), jnp.zeros(4, jnp.int32), eps=0.0)
    >>> s.tolist()  # μ = ¼, σ = ½: a = (1.5, −0.5, −0.5, −0.5)
    [1.5, 0.5, 0.5, 0.5]

  References:
    Lin et al., On-policy Distillation with Verifiable Reward (GRPD), arXiv 2608.24696.
  """
  rewards = jnp.asarray(rewards, jnp.float32)
  group_ids = jnp.asarray(group_ids)
  if rewards.ndim != 1:
    raise ValueError(f"rewards must be [batch], got shape {tuple(rewards.shape)}")
  _check_group_ids(group_ids, rewards.shape[0])
  correct = jnp.where(jnp.isnan(rewards), jnp.nan, (rewards > threshold).astype(jnp.float32))
  a = group_advantages(correct, group_ids, num_groups=num_groups,
                       std="group" if norm_std else "none", eps=eps, ddof=1)
  return jax.lax.stop_gradient(jnp.abs(a) + jnp.asarray(scale_baseline, jnp.float32))


@GATED_OPD_ADVANTAGES.register("grpd")
@functools.partial(jax.jit, static_argnames=("num_groups", "norm_std", "eps", "inverse"))
def grpd_advantages(
    teacher_logp: jax.Array,
    old_logp: jax.Array,
    mask: jax.Array | None = None,
    *,
    rewards: jax.Array | None = None,
    group_ids: jax.Array | None = None,
    num_groups: int | None = None,
    norm_std: bool = True,
    scale_baseline: ArrayLike = 0.0,
    threshold: ArrayLike = 0.0,
    eps: float = 1e-6,
    inverse: bool = False,
) -> jax.Array:
  """GRPD: OPDVR's gated reward times a group-relative scale (G > 1 rollouts per prompt).

  A_{i,t} = opdvr(d, c)_{i,t} · (|a_i| + u)   with `grpd_scale`'s a_i and u

  Args:
    teacher_logp, old_logp, mask: as in `opdvr_advantages`.
    rewards: `[batch]` verifier scores (required); NaN = missing, that row gets 0.
    group_ids: `[batch]` int group (prompt) ids (required).
    num_groups, norm_std, scale_baseline, threshold, eps: see `grpd_scale` (default
      `norm_std=True`, see the conflict noted there).
    inverse: gate with the "inverse" ablation.

  Returns:
    `[batch, time]` float32 advantages, stop-gradient, 0 on padding.

  Raises:
    ValueError: `rewards` or `group_ids` is None, or shapes do not line up.

  Examples:
    >>> import jax.numpy as jnp
    >>> lp_t = jnp.log(jnp.array([[0.4], [0.1], [0.4], [0.4]]))
    >>> adv = grpd_advantages(lp_t, jnp.log(jnp.full((4, 1), 0.2)),
    ...                       rewards=jnp.array([1.0, 0.0, 0.0, 0.0]),
    ...                       group_ids=jnp.zeros(4, jnp.int32), eps=0.0)
    >>> [round(x, 4) for x in adv[:, 0].tolist()]  # (log 2·1.5, −log 2·0.5, 0, 0)
    [1.0397, -0.3466, 0.0, 0.0]

  References:
    Lin et al., On-policy Distillation with Verifiable Reward (GRPD), arXiv 2608.24696.
  """
  method = "grpd"
  teacher_logp, old_logp = _check_token_inputs(teacher_logp, old_logp, mask)
  batch = teacher_logp.shape[0]
  correct, present = _correctness(method, rewards, batch, threshold)
  group_ids = _require(method, "group_ids", group_ids, "the group (prompt) id of each rollout")
  _check_group_ids(group_ids, batch)
  gated = opdvr_gate(_opd(teacher_logp, old_logp, mask), correct, mask, inverse=inverse)
  scale = grpd_scale(rewards, group_ids, num_groups=num_groups, norm_std=norm_std,
                     scale_baseline=scale_baseline, threshold=threshold, eps=eps)
  return jnp.where(present[:, None], gated * scale[:, None], 0.0)


def gated_opd_advantages(
    name: str,
    teacher_logp: jax.Array,
    old_logp: jax.Array,
    mask: jax.Array | None = None,
    **knobs,
) -> jax.Array:
  """The registered gated-OPD advantage `name` ("tgopd", "opdvr", "opdvr_inverse", "grpd").

  Raises:
    KeyError: an unknown name (the message lists the valid ones).
    ValueError: an input the method needs is missing, or shapes do not line up.
    TypeError: a knob the method does not take.

  Examples:
    >>> import jax.numpy as jnp
    >>> adv = gated_opd_advantages("opdvr", jnp.log(jnp.array([[0.4]])),
    ...                            jnp.log(jnp.array([[0.2]])), rewards=jnp.array([0.0]))
    >>> adv.tolist()
    [[0.0]]
  """
  return GATED_OPD_ADVANTAGES.get(name)(teacher_logp, old_logp, mask, **knobs)
