"""OPRD, On-Policy Reverse Distillation (arXiv 2609.08798): a logit-space gradient fix.

A weak RL-trained teacher π_T and its own pre-RL reference π_T^ref define, at every prefix s_t,
the direction in which RL moved the teacher. OPRD does not imitate the teacher: it keeps the
student's verifier-driven policy gradient and amplifies only its component along that direction.
Per position t, with logits z_t ∈ R^V and the ascent gradient g_t = ∂J/∂z_t:

  Δ_t  = C(log π_T(·|s_t) − log π_T^ref(·|s_t)),  C(v) = v − mean(v)      teacher shift (Eq. 2.4)
  d_t  = Δ_t / ‖Δ_t‖₂                 on the support S_t = {y_t} ∪ student top-10 (App. C, Tab. 5)
  u_t  = d_tᵀ g_t                     alignment
  g̃_t  = (I + λ_t d_t d_tᵀ) g_t = g_t + λ_t u_t d_t                              (Eq. 2.5)
  λ_t  = λ₊ if u_t ≥ 0 else λ₋,  λ₊ = λ,  λ₋ = λ·min(k / K_warm, 1)               (Eq. 2.8)

`I + λ d dᵀ` is positive definite, so g̃ = 0 ⇔ g = 0 (same stationary points) and
⟨g, g̃⟩ = ‖g‖² + λu² ≥ ‖g‖² (Eq. 2.6–2.7).

Pieces (all pure, jittable, any leading shape `[...]`, usually `[batch, time]` or a chunk of it):

  oprd_lambda(step)                         (λ₊, λ₋) of Eq. 2.8 at optimizer step k
  oprd_support(tokens, topk_ids)            support ids [..., K+1] and slot mask (dups masked)
  oprd_support_from_logits(logits, tokens)  the same from sg(logits) top-K
  oprd_direction(lp_T, lp_Tref, slot_mask)  unit direction d on the support [..., K+1]
  oprd_transform(logits, ids, d, ...)       identity forward; backward c̃ = (I + λ d dᵀ) c
  oprd_alignment(d, support_logp, ...)      u_t, cos(d_t, g_t) and λ_t at the rollout policy
  oprd_alignment_metrics(alignment, ...)    the step's aligned share and correction size

`oprd_transform` is an identity on the logits with a custom VJP. The cotangent of a loss to be
minimised is c = ∂L/∂z = −g (up to a positive normaliser, which changes neither u's sign nor
the linear map), and since I + λ d dᵀ is symmetric the backward pass returns

  c̃ = c + λ (dᵀc) d = c − λ u d,   u = −dᵀc,

scattered onto the support ids only. Everything between the logits and the loss (log-softmax,
gathers, PPO clipping, token-mean aggregation) is the unchanged student objective; the whole
of ∂L/∂z_t is corrected, so a KL or entropy term sharing these logits would be amplified too
(OPRD uses neither; App. C).

Composition with the chunked log-prob path (`sampling.score_hidden`). The correction at
position t reads only row t of the cotangent and row t of (ids, d, mask): it acts independently
per position, so it commutes with slicing the positions into chunks. Apply it to each chunk's
logits inside the checkpointed chunk function, with the chunk's slice of the per-position
inputs (they are chunked along time exactly like `candidate_ids`):

  @jax.checkpoint
  def one_chunk(h, tokens, mask, ids, d, slot_mask):         # [B, c, ...] slices
    z = oprd_transform(project(h), ids, d, slot_mask, lam_pos, lam_neg, mask)
    return score_logits(z, tokens, mask, temperature=...)

The backward of a chunk then corrects that chunk's `[B, c, V]` logit cotangent (which the
chunked backward forms anyway) with `[B, c, K+1]` gathers and a scatter-add; no `[B, T, V]`
tensor is stored or formed, and the result equals the unchunked transform exactly. The
residuals it keeps are the `[B, c, K+1]` ids and direction, not the logits. Dividing by the
sampling temperature after the transform is fine: the map is linear and u's sign is invariant
to the positive factor 1/τ.

Where the support comes from. The direction needs teacher and teacher-reference log-probs on
the support ids, scored before the student's loss runs, so in a trainer the "student top-10"
comes from the policy that scored the rollout (`score(..., top_k=10).topk_ids` of the old
policy), and the two frozen models score those ids as `candidate_ids`. On the first on-policy
mini-batch this equals a PROPOSAL, not in the paper (stop-gradient *current* logits); later
mini-batches of the same rollout reuse the rollout-time support (our choice; the paper does not
say which logits it uses). Centering runs over the valid support slots, not the whole
vocabulary (a PROPOSAL, not in the paper); on the support, logits and log-probs give the same d.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

ArrayLike = jax.Array | float | int

# App. C, Tables 4–5 (arXiv 2609.08798).
TOP_K = 10  # "sampled ∪ student top-10" support.
LAMBDA = 0.5  # λ₊ and the final λ₋.
WARMUP_STEPS_MATH = 30  # λ₋ ramp, DAPO-Math-17K.
WARMUP_STEPS_REASONING_GYM = 75  # λ₋ ramp, Reasoning Gym.


def _check_leading(name: str, x: jax.Array, shape: tuple[int, ...], what: str) -> None:
  if tuple(x.shape) != tuple(shape):
    raise ValueError(f"{name} has shape {tuple(x.shape)}; expected {tuple(shape)} ({what})")


class OPRDLambda(NamedTuple):
  """Branch coefficients of Eq. 2.8 (float32 scalars)."""

  lam_pos: jax.Array  # λ₊, for teacher-aligned tokens (u ≥ 0).
  lam_neg: jax.Array  # λ₋, for verifier-supported departures (u < 0).


def oprd_lambda(
    step: ArrayLike, *, lam: ArrayLike = LAMBDA, warmup_steps: int = WARMUP_STEPS_MATH
) -> OPRDLambda:
  """The asymmetric ramped λ schedule of OPRD (Eq. 2.8).

  λ₊ = λ (on from step 0);  λ₋ = λ·min(k / K_warm, 1)  (0 at step 0; λ₋ = λ if K_warm = 0)

  App. B: with λ₊ ≠ λ₋ the correction has a one-sided term ((λ₊−λ₋)/2)|u| d; scaling only the
  positive branch inflates response length and only the negative one collapses performance;
  ramping λ₋ from 0 fixes both. Ablations: `warmup_steps=0` is the symmetric fixed λ; λ = 0 is
  plain GRPO.

  Args:
    step: optimizer step k (0-based; may be a traced array).
    lam: λ (paper default 0.5).
    warmup_steps: K_warm, updates over which λ₋ ramps from 0 to λ (30 on math, 75 on Reasoning
      Gym). Static.

  Returns:
    `OPRDLambda(lam_pos, lam_neg)`.

  Examples:
    >>> out = oprd_lambda(15, lam=0.5, warmup_steps=30)
    >>> float(out.lam_pos), float(out.lam_neg)
    (0.5, 0.25)

  References:
    Park et al., On-Policy Reverse Distillation, arXiv 2609.08798, Eq. 2.8 and App. B–C.
  """
  if warmup_steps < 0:
    raise ValueError(f"warmup_steps={warmup_steps} must be >= 0")
  lam = jnp.asarray(lam, jnp.float32)
  if warmup_steps == 0:
    return OPRDLambda(lam, lam)
  ramp = jnp.clip(jnp.asarray(step, jnp.float32) / warmup_steps, 0.0, 1.0)
  return OPRDLambda(lam, lam * ramp)


def oprd_support(
    tokens: jax.Array, topk_ids: jax.Array, token_mask: jax.Array | None = None
) -> tuple[jax.Array, jax.Array]:
  """The OPRD support "sampled ∪ student top-K": K+1 slots, the duplicate slot masked.

  ids[..., 0] = y_t,  ids[..., 1:] = top-K ids;  slot k ≥ 1 is valid iff ids[..., k] ≠ y_t.
  Every slot of a masked position is invalid. Valid slots hold distinct ids (top-K ids are
  distinct), which `oprd_transform` relies on.

  Args:
    tokens: `[...]` int sampled token ids y_t.
    topk_ids: `[..., K]` int student top-K ids at the same positions (distinct per position).
    token_mask: optional `[...]` response mask.

  Returns:
    `(ids [..., K+1] int32, slot_mask [..., K+1] bool)`.

  Examples:
    >>> import jax.numpy as jnp
    >>> ids, ok = oprd_support(jnp.array([2]), jnp.array([[2, 0, 1]]))
    >>> ids.tolist(), ok.tolist()
    ([[2, 2, 0, 1]], [[True, False, True, True]])

  References:
    Park et al., arXiv 2609.08798, App. C Table 5 ("Sampled ∪ student top-10").
  """
  tokens = jnp.asarray(tokens)
  topk_ids = jnp.asarray(topk_ids)
  if topk_ids.ndim != tokens.ndim + 1:
    raise ValueError(f"topk_ids has shape {tuple(topk_ids.shape)}; expected tokens' shape "
                     f"{tuple(tokens.shape)} plus a trailing K axis")
  _check_leading("topk_ids", topk_ids, tokens.shape + topk_ids.shape[-1:], "tokens' shape + K")
  ids = jnp.concatenate([tokens[..., None], topk_ids], axis=-1).astype(jnp.int32)
  slot_mask = jnp.concatenate(
      [jnp.ones(tokens.shape + (1,), bool), topk_ids != tokens[..., None]], axis=-1)
  if token_mask is not None:
    token_mask = jnp.asarray(token_mask)
    _check_leading("token_mask", token_mask, tokens.shape, "tokens' shape")
    slot_mask = slot_mask & (token_mask[..., None] > 0)
  return ids, slot_mask


def oprd_support_from_logits(
    logits: jax.Array, tokens: jax.Array, *, k: int = TOP_K,
    token_mask: jax.Array | None = None
) -> tuple[jax.Array, jax.Array]:
  """`oprd_support` with the top-K of stop-gradient `logits` `[..., V]`).

  Examples:
    >>> import jax.numpy as jnp
    >>> ids, ok = oprd_support_from_logits(jnp.array([[0.0, 3.0, 1.0, 2.0]]), jnp.array([0]),
    ...                                    k=2)
    >>> ids.tolist(), ok.tolist()
    ([[0, 1, 3]], [[True, True, True]])
  """
  _, topk_ids = jax.lax.top_k(jax.lax.stop_gradient(logits), k)
  return oprd_support(tokens, topk_ids, token_mask)


def oprd_direction(
    teacher_logp: jax.Array,
    teacher_ref_logp: jax.Array,
    slot_mask: jax.Array,
    *,
    eps: float = 1e-8,
) -> jax.Array:
  """Unit teacher-shift direction on the support (Eq. 2.4, centred over the support).

  δ = (lp_T − lp_Tref)[valid],  Δ = δ − mean_valid(δ),  d = Δ / max(‖Δ‖₂, ε);  0 on invalid slots

  Centering over the valid support instead of the whole vocabulary is a PROPOSAL (not in the
  paper); it makes logits and log-probs interchangeable (each model's log-normaliser is a
  constant that centering removes). A position where the teacher did not move (Δ = 0) gets
  d = 0, i.e. no correction.

  Args:
    teacher_logp: `[..., S]` teacher log-probs (or logits) on the support ids.
    teacher_ref_logp: `[..., S]` teacher-reference log-probs on the same ids.
    slot_mask: `[..., S]` valid support slots (`oprd_support`).
    eps: ε in the normalisation.

  Returns:
    `[..., S]` float32 direction, stop-gradient; unit norm where Δ ≠ 0.

  Examples:
    >>> import jax.numpy as jnp
    >>> d = oprd_direction(jnp.array([[0.0, -5.0, -1.0]]), jnp.array([[-1.0, -9.0, 0.0]]),
    ...                    jnp.array([[True, False, True]]))
    >>> [round(float(x), 4) for x in d[0]]  # δ = (1, ·, −1): Δ = (1, 0, −1)/√2
    [0.7071, 0.0, -0.7071]

  References:
    Park et al., arXiv 2609.08798, Eq. 2.4.
  """
  teacher_logp = jnp.asarray(teacher_logp, jnp.float32)
  teacher_ref_logp = jnp.asarray(teacher_ref_logp, jnp.float32)
  slot_mask = jnp.asarray(slot_mask)
  _check_leading("teacher_ref_logp", teacher_ref_logp, teacher_logp.shape, "teacher_logp's")
  _check_leading("slot_mask", slot_mask, teacher_logp.shape, "teacher_logp's")
  valid = slot_mask > 0
  delta = jnp.where(valid, teacher_logp - teacher_ref_logp, 0.0)
  count = jnp.maximum(jnp.sum(valid, axis=-1, keepdims=True), 1)
  delta = jnp.where(valid, delta - jnp.sum(delta, axis=-1, keepdims=True) / count, 0.0)
  norm = jnp.sqrt(jnp.sum(jnp.square(delta), axis=-1, keepdims=True))
  return jax.lax.stop_gradient(delta / jnp.maximum(norm, eps))


def _over_leading(fn, ndim):
  """vmaps `fn` over `ndim` leading axes (keeps every leading axis's sharding)."""
  for _ in range(ndim):
    fn = jax.vmap(fn)
  return fn


@jax.custom_vjp
def _identity_with_correction(logits, ids, direction, lam_pos, lam_neg, token_mask):
  del ids, direction, lam_pos, lam_neg, token_mask
  return logits


def _fwd(logits, ids, direction, lam_pos, lam_neg, token_mask):
  return logits, (ids, direction, lam_pos, lam_neg, token_mask)


def _bwd(res, c):
  ids, d, lam_pos, lam_neg, token_mask = res
  c_support = jnp.take_along_axis(c, ids, axis=-1).astype(jnp.float32)  # [..., S]
  u = -jnp.sum(c_support * d, axis=-1)  # u = dᵀg with g = −c
  lam = jnp.where(u >= 0, lam_pos, lam_neg) * token_mask
  update = (-(lam * u)[..., None] * d).astype(c.dtype)  # c̃ = c − λ u d on the support
  scatter = _over_leading(lambda row, i, x: row.at[i].add(x), c.ndim - 1)
  return (scatter(c, ids, update), None, None, None, None, None)


_identity_with_correction.defvjp(_fwd, _bwd)


def oprd_transform(
    logits: jax.Array,
    support_ids: jax.Array,
    direction: jax.Array,
    support_mask: jax.Array,
    lam_pos: ArrayLike,
    lam_neg: ArrayLike,
    token_mask: jax.Array | None = None,
) -> jax.Array:
  """Identity on the logits whose backward pass applies OPRD's correction (Eq. 2.5, 2.8).

  forward:   z ↦ z
  backward:  c̃_t = c_t − λ_t u_t d_t (on the support ids),  u_t = −d_tᵀ c_t,
             λ_t = (lam_pos if u_t ≥ 0 else lam_neg)·m_t

  With c = ∂L/∂z = −g for the student's loss L = −J, this is c̃ = −(I + λ_t d_t d_tᵀ) g_t:
  the ascent gradient's component along the teacher-shift direction is amplified by 1 + λ_t
  and the orthogonal rest is untouched. Apply it to the logits right before the log-softmax
  of the loss (per chunk in the chunked scorer: see the module docstring); it works on any
  leading shape because every position is corrected independently. The dense `[..., V]`
  cotangent is corrected with a gather and a scatter-add of S = K+1 entries per position.

  Args:
    logits: `[..., V]` student logits (any float dtype; the cotangent keeps it).
    support_ids: `[..., S]` int support ids (`oprd_support`); valid slots must be distinct.
    direction: `[..., S]` unit direction on the support (`oprd_direction`), treated as a
      constant.
    support_mask: `[..., S]` valid slots; invalid slots neither read nor write the cotangent.
    lam_pos: λ₊ for teacher-aligned tokens (u ≥ 0); scalar or broadcastable to `[...]`.
    lam_neg: λ₋ for departures (u < 0); scalar or broadcastable to `[...]` (`oprd_lambda`).
    token_mask: optional `[...]` response mask; masked positions are not corrected.

  Returns:
    `logits`, unchanged.

  Raises:
    ValueError: when the shapes do not line up (the message names the argument).

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> loss = lambda z: -jax.nn.log_softmax(oprd_transform(
    ...     z, jnp.array([0, 1]), jnp.array([0.5, -0.5]) * jnp.sqrt(2.0),
    ...     jnp.array([True, True]), 0.5, 0.0))[0]
    >>> [round(float(x), 4) for x in jax.grad(loss)(jnp.zeros(4))]  # p − e_0, then −λud
    [-1.0, 0.5, 0.25, 0.25]

  References:
    Park et al., On-Policy Reverse Distillation, arXiv 2609.08798, Eq. 2.5 and 2.8.
  """
  logits = jnp.asarray(logits)
  support_ids = jnp.asarray(support_ids)
  if logits.ndim < 1:
    raise ValueError("logits must have a trailing vocabulary axis")
  lead = logits.shape[:-1]
  if support_ids.ndim != logits.ndim:
    raise ValueError(f"support_ids has shape {tuple(support_ids.shape)}; expected logits' "
                     f"leading shape {tuple(lead)} plus a support axis")
  _check_leading("support_ids", support_ids, lead + support_ids.shape[-1:], "logits' leading")
  if not jnp.issubdtype(support_ids.dtype, jnp.integer):
    raise ValueError(f"support_ids must be integer ids, got {support_ids.dtype}")
  direction = jnp.asarray(direction)
  support_mask = jnp.asarray(support_mask)
  _check_leading("direction", direction, support_ids.shape, "support_ids'")
  _check_leading("support_mask", support_mask, support_ids.shape, "support_ids'")
  if token_mask is None:
    token_mask = jnp.ones(lead, jnp.float32)
  token_mask = jnp.asarray(token_mask)
  _check_leading("token_mask", token_mask, lead, "logits' leading")
  lam_pos = jnp.asarray(lam_pos, jnp.float32)
  lam_neg = jnp.asarray(lam_neg, jnp.float32)
  for name, lam in (("lam_pos", lam_pos), ("lam_neg", lam_neg)):
    try:
      jnp.broadcast_shapes(lam.shape, lead)
    except ValueError:
      raise ValueError(f"{name} has shape {tuple(lam.shape)}, which does not broadcast to "
                       f"the positions {tuple(lead)}") from None
  valid = support_mask > 0
  ids = jnp.where(valid, support_ids, 0).astype(jnp.int32)  # in range for the gather/scatter
  d = jax.lax.stop_gradient(jnp.where(valid, jnp.asarray(direction, jnp.float32), 0.0))
  tok = jax.lax.stop_gradient((token_mask > 0).astype(jnp.float32))
  return _identity_with_correction(logits, ids, d, jax.lax.stop_gradient(lam_pos),
                                   jax.lax.stop_gradient(lam_neg), tok)


class OPRDAlignment(NamedTuple):
  """First-order OPRD diagnostics per position (`oprd_alignment`); float32 `[...]` each."""

  u: jax.Array  # u_t = d_tᵀ g_t.
  cos: jax.Array  # u_t / ‖g_t restricted to the support‖; 0 where that is 0.
  lam: jax.Array  # λ_t of Eq. 2.8 (λ₊ if u_t ≥ 0 else λ₋), 0 at masked positions.
  active: jax.Array  # 1 where the position is corrected at all (mask, A ≠ 0, d ≠ 0).


def oprd_alignment(
    direction: jax.Array,
    support_logp: jax.Array,
    slot_mask: jax.Array,
    adv: jax.Array,
    lam_pos: ArrayLike,
    lam_neg: ArrayLike,
    token_mask: jax.Array | None = None,
    *,
    eps: float = 1e-12,
) -> OPRDAlignment:
  """How the policy gradient lines up with the teacher shift, from the rollout's scores.

  OPRD's correction acts inside the backward pass, where nothing is logged. At the rollout
  policy (ratio 1, inside the clip range: the first update of an on-policy step) the ascent
  gradient of the token's policy-gradient term A_t log π(y_t|s_t) with respect to its logits is
  known in closed form, g_t = A_t (e_{y_t} − p_t), so its projection on the direction needs
  only the student's probabilities on the support (slot 0 = y_t, then top-K):

    g_t[s] = A_t (1[s = 0] − p_t[s]),   u_t = Σ_s d_t[s] g_t[s],   cos_t = u_t / ‖g_t|_S‖

  The correction adds λ_t u_t d_t, so ‖Δg_t‖ / ‖g_t‖ = λ_t |u_t| / ‖g_t‖ ≤ λ_t |cos_t| (the full
  gradient has mass outside the support too). Later mini-batches of the same rollout, PPO
  clipping and the positive token-mean normaliser change g's scale, not these first-order
  quantities' meaning; they are diagnostics, not part of the loss.

  Args:
    direction: `[..., S]` unit direction on the support (`oprd_direction`).
    support_logp: `[..., S]` the rollout policy's log-probs on the support ids (slot 0 the
      sampled token's), e.g. `concat(old.logp[..., None], old.topk_logp)`.
    slot_mask: `[..., S]` valid support slots (`oprd_support`).
    adv: the advantage per sequence `[B]` or per position `[...]` (broadcast on the right).
    lam_pos, lam_neg: λ₊ and λ₋ of the update (`oprd_lambda`).
    token_mask: optional `[...]` response mask.
    eps: below this ‖g_t|_S‖ counts as 0.

  Returns:
    `OPRDAlignment(u, cos, lam, active)`.

  Examples:
    >>> import jax.numpy as jnp
    >>> d = jnp.array([[2 ** -0.5, -(2 ** -0.5)]])  # p = (¼, ¼) on the support, A = 1
    >>> out = oprd_alignment(d, jnp.log(jnp.array([[0.25, 0.25]])), jnp.array([[True, True]]),
    ...                      jnp.array([1.0]), 0.5, 0.0)
    >>> round(float(out.u[0]), 4), round(float(out.cos[0]), 4), float(out.lam[0])
    (0.7071, 0.8944, 0.5)

  References:
    Park et al., On-Policy Reverse Distillation, arXiv 2609.08798, Eq. 2.5–2.8.
  """
  direction = jnp.asarray(direction, jnp.float32)
  support_logp = jnp.asarray(support_logp, jnp.float32)
  slot_mask = jnp.asarray(slot_mask)
  _check_leading("support_logp", support_logp, direction.shape, "direction's")
  _check_leading("slot_mask", slot_mask, direction.shape, "direction's")
  lead = direction.shape[:-1]
  adv = jnp.asarray(adv, jnp.float32)
  if adv.ndim > len(lead) or adv.shape != lead[:adv.ndim]:
    raise ValueError(f"adv has shape {tuple(adv.shape)}; expected a prefix of the positions "
                     f"{tuple(lead)} (per sequence or per position)")
  adv = adv.reshape(adv.shape + (1,) * (len(lead) - adv.ndim))
  mask = (jnp.ones(lead, bool) if token_mask is None else jnp.asarray(token_mask) > 0)
  _check_leading("token_mask", mask, lead, "the positions'")
  valid = (slot_mask > 0) & mask[..., None]
  first = jnp.arange(direction.shape[-1]) == 0
  g = jnp.where(valid, adv[..., None] * (first - jnp.exp(support_logp)), 0.0)
  d = jnp.where(valid, direction, 0.0)
  u = jnp.sum(d * g, axis=-1)
  norm = jnp.sqrt(jnp.sum(jnp.square(g), axis=-1))
  cos = jnp.where(norm > eps, u / jnp.maximum(norm, eps), 0.0)
  lam = jnp.where(u >= 0, jnp.asarray(lam_pos, jnp.float32), jnp.asarray(lam_neg, jnp.float32))
  active = mask & (norm > eps) & (jnp.sum(jnp.abs(d), axis=-1) > 0)
  lam = jnp.where(mask, lam, 0.0)
  return OPRDAlignment(u, cos, lam, active.astype(jnp.float32))


def oprd_alignment_metrics(alignment: OPRDAlignment,
                           token_mask: jax.Array | None = None) -> dict[str, float]:
  """The step's OPRD diagnostics, means over the corrected positions (`active`).

    oprd/aligned_frac          share with u_t ≥ 0 (teacher-aligned, λ₊ branch)
    oprd/cos_abs_mean          mean |cos(d_t, g_t)| on the support
    oprd/rel_correction_mean   mean λ_t |cos_t|: an upper bound on mean ‖Δg_t‖ / ‖g_t‖
    oprd/active_frac           share of the response positions (`token_mask`; default all)
                               corrected at all

  Examples:
    >>> import jax.numpy as jnp
    >>> a = OPRDAlignment(jnp.array([1.0, -1.0, 0.0]), jnp.array([0.5, -0.25, 0.0]),
    ...                   jnp.array([0.5, 0.1, 0.5]), jnp.array([1.0, 1.0, 0.0]))
    >>> {k: round(v, 4) for k, v in oprd_alignment_metrics(a).items()}
    {'oprd/aligned_frac': 0.5, 'oprd/cos_abs_mean': 0.375, 'oprd/rel_correction_mean': 0.1375, \
'oprd/active_frac': 0.6667}
  """
  active = jnp.asarray(alignment.active, jnp.float32)
  count = jnp.maximum(jnp.sum(active), 1.0)
  positions = (jnp.ones_like(active) if token_mask is None
               else (jnp.asarray(token_mask) > 0).astype(jnp.float32))
  mean = lambda x: float(jnp.sum(active * x) / count)
  return {
    "oprd/aligned_frac": mean(alignment.u >= 0),
    "oprd/cos_abs_mean": mean(jnp.abs(alignment.cos)),
    "oprd/rel_correction_mean": mean(alignment.lam * jnp.abs(alignment.cos)),
    "oprd/active_frac": float(jnp.sum(active) / jnp.maximum(jnp.sum(positions), 1.0)),
  }
