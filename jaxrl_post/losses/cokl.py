"""CoKL (arXiv 2608.01743): correctness-conditioned KL regularisation.

A KL penalty to the reference policy is meant to retain prior capabilities, but the full-policy
KL (forward or reverse) to an imperfect reference also keeps probability on the reference's
*wrong* answers: its regularised optimum has a strictly positive optimal-correctness gap, so it
fights the very improvement RL is after (lost plasticity). CoKL constrains only the
correctness-conditioned distributions

  π^C(y|x) = π(y|x)·1[y ∈ C_x] / π(C_x|x)

so the *total* mass on correct answers, π(C_x|x), is left free (plasticity), while the *relative
allocation* among reference-supported correct answers is kept (retention). In forward-KL form

  KL(π_ref^C ‖ π_θ^C) = E_{y∼π_ref^C}[log π_ref^C(y) − log π_θ(y|x)] + log π_θ(C_x|x),
  ∇_θ KL = −E_{y∼π_ref^C}[∇ log π_θ(y|x)] + E_{y∼π_θ^C}[∇ log π_θ(y|x)],

using ∇ log π_θ(C_x|x) = E_{π_θ^C}[∇ log π_θ]. The second term is the normalisation correction:
without it the regulariser is correct-only replay (SFT on the reference's correct answers),
which pushes π(C_x|x) up without limit instead of only shaping the allocation inside C_x.

Finite-group surrogate (Eq. 15–17), per anchor prompt x, with 𝓡_x the verified-correct answers
sampled once from the frozen reference model and cached (`ReferenceAnswers`), and 𝒞_x the
verified-correct responses among the current rollouts:

  L_x = −(1/|𝓡_x|) Σ_{y∈𝓡_x} log π_θ(y|x) + Σ_{y∈𝒞_x} w_y log π_θ(y|x)
  ρ_y = exp(clip(sg(log π_θ(y|x)) − log π_old(y|x), log(1−ε), log(1+ε))),
  w_y = sg(ρ_y / Σ_{y'∈𝒞_x} ρ_y')

The weights are a self-normalised, clipped importance estimate of E_{π_θ^C} from samples of
π_old. Log-probs are SEQUENCE log-probs (sums over the response tokens, `sequence_logp`). If 𝒞_x
is empty only the first term is used. The total loss is GRPO's + L_CoKL with no other KL term;
`cokl_loss` is registered in `losses.regularizers.REGULARIZERS` as "cokl".

Hyperparameters (a third-party pilot, not the paper): β = 0.001, ε = 0.2, 2 reference answers per
anchor prompt, 4 current samples. PROPOSAL: 8 reference samples per anchor, keep only anchors
with at least one correct reference answer.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_post.losses.regularizers import REGULARIZERS

ArrayLike = jax.Array | float | int

# Ratio clip of Eq. 15 (third-party pilot value).
COKL_EPS = 0.2

# Which prompts the loss averages over (`cokl_loss(prompt_mean=...)`).
PROMPT_MEANS = ("reference", "any", "all")


def _shape_error(name: str, x, expected: tuple[int, ...], what: str) -> ValueError:
  return ValueError(f"{name} has shape {tuple(jnp.shape(x))}; expected {tuple(expected)} ({what})")


def _positive_int(name: str, value) -> int:
  if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
    raise ValueError(f"{name} must be a positive int, got {value!r}")
  return value


@jax.jit
def sequence_logp(token_logp: jax.Array, mask: jax.Array) -> jax.Array:
  """Sequence log-prob log π(y|x) = Σ_t m_t·log π(y_t|x, y_<t) over the last (time) axis.

  Padding may hold anything (−inf, NaN): it is selected away. An empty row gives 0.

  Args:
    token_logp: `[N, T]` (or `[..., T]`) token log-probs.
    mask: same shape, response-token mask.

  Returns:
    `[N]` (or `[...]`) float32 sequence log-probs.

  Examples:
    >>> import jax.numpy as jnp
    >>> sequence_logp(jnp.array([[-1.0, -0.5, -jnp.inf]]), jnp.array([[1, 1, 0]])).tolist()
    [-1.5]
  """
  token_logp = jnp.asarray(token_logp, jnp.float32)
  if token_logp.ndim < 1:
    raise ValueError("token_logp must have a time axis, got a scalar")
  if jnp.shape(mask) != token_logp.shape:
    raise _shape_error("mask", mask, token_logp.shape, "token_logp's")
  return jnp.sum(jnp.where(jnp.asarray(mask) > 0, token_logp, 0.0), axis=-1)


class CoKLAux(NamedTuple):
  """Diagnostics of `cokl_loss` (all stop-gradient)."""

  ref_term: jax.Array  # [B] −mean_{y∈𝓡_x} log π_θ(y); 0 without reference answers.
  correction: jax.Array  # [B] Σ_{y∈𝒞_x} w_y log π_θ(y); 0 if 𝒞_x is empty or normalise=False.
  weights: jax.Array  # [B, G] w_y, 0 off the correct set; each row sums to 1 or 0.
  active: jax.Array  # [B] bool, prompts in the mean.
  num_active: jax.Array  # () float32.
  clip_frac: jax.Array  # () fraction of correct current samples whose ratio was clipped.


@REGULARIZERS.register("cokl")
@functools.partial(jax.jit, static_argnames=("eps", "normalise", "prompt_mean"))
def cokl_loss(
    ref_logp: jax.Array,
    ref_mask: jax.Array,
    cur_logp: jax.Array,
    old_cur_logp: jax.Array,
    cur_correct: jax.Array,
    *,
    beta: ArrayLike,
    eps: float = COKL_EPS,
    normalise: bool = True,
    prompt_mean: str = "reference",
) -> tuple[jax.Array, CoKLAux]:
  """CoKL's finite-group correctness-conditioned forward-KL surrogate (Eq. 17).

  L_x = −(1/|𝓡_x|) Σ_{r∈𝓡_x} logp_ref[x, r] + Σ_{i∈𝒞_x} w_xi · cur_logp[x, i]
  ρ_xi = exp(clip(sg(cur_logp) − old_cur_logp, log(1−ε), log(1+ε))),  w_xi = sg(ρ_xi / Σ_{𝒞_x} ρ)
  loss = β · Σ_x active_x L_x / max(Σ_x active_x, 1)

  ∇loss = β/N · Σ_x [−mean_r ∇logp_ref + Σ_i w_i ∇cur_logp]: the first term pulls up the
  cached reference-correct answers, the second pushes down the current correct answers by
  their self-normalised weights, so the total mass on correct answers is not constrained.

  Which prompts enter the mean (`prompt_mean`, PROPOSAL; the paper's surrogate is per prompt):
    "reference" (default): prompts with ≥ 1 cached reference answer; a prompt without one
      contributes nothing. Without a reference sample the conditional KL cannot be estimated,
      and its correction term alone would only push the current correct answers down.
    "any": prompts with ≥ 1 reference answer or ≥ 1 correct current sample (the correction of
      a prompt without reference answers is kept).
    "all": every row of the batch (a plain mean over B, rows with nothing contribute 0).

  Args:
    ref_logp: `[B, Nr]` current-policy SEQUENCE log-probs of the cached reference answers
      (`sequence_logp` of a teacher-forced pass); differentiable.
    ref_mask: `[B, Nr]` which reference slots hold an answer (`ReferenceBatch.answer_mask`).
    cur_logp: `[B, G]` current-policy sequence log-probs of the current rollouts;
      differentiable.
    old_cur_logp: `[B, G]` their sequence log-probs under the sampling policy π_old.
    cur_correct: `[B, G]` bool, verified-correct current rollouts 𝒞_x.
    beta: β, the regulariser's weight (pilot: 0.001).
    eps: ratio clip ε in (0, 1) (static; pilot 0.2).
    normalise: keep the correction term (static). False is the "correct-only replay" ablation:
      the loss is then −β·mean log π_θ of the reference answers alone.
    prompt_mean: which prompts the mean runs over (static; see above).

  Returns:
    `(loss, CoKLAux)`; `loss` is a float32 scalar.

  Raises:
    ValueError: mismatched shapes (naming the argument), `eps` outside (0, 1), or an unknown
      `prompt_mean`.

  Examples:
    >>> import jax.numpy as jnp
    >>> loss, aux = cokl_loss(jnp.array([[-2.0, -4.0]]), jnp.array([[1, 1]]),
    ...                       jnp.array([[-1.0, -3.0, -5.0]]), jnp.array([[-1.0, -3.0, -5.0]]),
    ...                       jnp.array([[True, True, False]]), beta=1.0)
    >>> float(loss), aux.weights.tolist()  # 3 + (½·(−1) + ½·(−3))
    (1.0, [[0.5, 0.5, 0.0]])

  References:
    Wang et al., Toward Plasticity-Preserving KL Regularization for Capability Retention in LLM
    Reinforcement Learning (CoKL), arXiv 2608.01743.
  """
  ref_logp = jnp.asarray(ref_logp, jnp.float32)
  cur_logp = jnp.asarray(cur_logp, jnp.float32)
  if ref_logp.ndim != 2:
    raise ValueError(f"ref_logp must be [B, Nr], got shape {tuple(ref_logp.shape)}")
  if cur_logp.ndim != 2:
    raise ValueError(f"cur_logp must be [B, G], got shape {tuple(cur_logp.shape)}")
  b = ref_logp.shape[0]
  if cur_logp.shape[0] != b:
    raise _shape_error("cur_logp", cur_logp, (b, cur_logp.shape[1]), "ref_logp's batch")
  if jnp.shape(ref_mask) != ref_logp.shape:
    raise _shape_error("ref_mask", ref_mask, ref_logp.shape, "ref_logp's")
  for name, x in (("old_cur_logp", old_cur_logp), ("cur_correct", cur_correct)):
    if jnp.shape(x) != cur_logp.shape:
      raise _shape_error(name, x, cur_logp.shape, "cur_logp's")
  if not 0.0 < eps < 1.0:
    raise ValueError(f"eps must be in (0, 1), got {eps!r}")
  if prompt_mean not in PROMPT_MEANS:
    raise ValueError(f"unknown prompt_mean {prompt_mean!r}; valid: {', '.join(PROMPT_MEANS)}")

  has_ref = jnp.asarray(ref_mask) > 0
  correct = jnp.asarray(cur_correct).astype(bool)
  n_ref = jnp.sum(has_ref, axis=-1).astype(jnp.float32)
  ref_term = -jnp.sum(jnp.where(has_ref, ref_logp, 0.0), axis=-1) / jnp.maximum(n_ref, 1.0)

  # Padding (incorrect samples) may hold −inf / NaN: select, never multiply.
  log_ratio = jax.lax.stop_gradient(cur_logp) - jnp.asarray(old_cur_logp, jnp.float32)
  lo, hi = jnp.log1p(-eps), jnp.log1p(eps)
  clipped = jnp.clip(log_ratio, lo, hi)
  rho = jnp.where(correct, jnp.exp(jnp.where(correct, clipped, 0.0)), 0.0)
  total = jnp.sum(rho, axis=-1, keepdims=True)
  weights = jax.lax.stop_gradient(jnp.where(total > 0, rho / jnp.where(total > 0, total, 1.0),
                                            0.0))
  correction = jnp.sum(jnp.where(correct, weights * cur_logp, 0.0), axis=-1)
  if not normalise:
    correction = jnp.zeros_like(correction)

  any_ref = n_ref > 0
  if prompt_mean == "reference":
    active = any_ref
  elif prompt_mean == "any":
    active = any_ref | jnp.any(correct, axis=-1)
  else:
    active = jnp.ones((b,), bool)
  num_active = jnp.sum(active).astype(jnp.float32)
  per_prompt = jnp.where(active, ref_term + correction, 0.0)
  loss = jnp.asarray(beta, jnp.float32) * jnp.sum(per_prompt) / jnp.maximum(num_active, 1.0)

  n_correct = jnp.sum(correct).astype(jnp.float32)
  was_clipped = correct & ((log_ratio < lo) | (log_ratio > hi))
  clip_frac = jnp.sum(was_clipped).astype(jnp.float32) / jnp.maximum(n_correct, 1.0)
  aux = CoKLAux(
    ref_term=jax.lax.stop_gradient(jnp.where(any_ref, ref_term, 0.0)),
    correction=jax.lax.stop_gradient(correction),
    weights=weights,
    active=active,
    num_active=num_active,
    clip_frac=clip_frac,
  )
  return loss, aux


# ---------------------------------------------------------------------------------------------
# The reference-answer cache.
# ---------------------------------------------------------------------------------------------


class ReferenceAnswers(NamedTuple):
  """Verified-correct reference answers of P anchor prompts (a pytree of fixed-shape arrays).

  Sampled once from the frozen reference model and kept for the whole run; the anchor prompts
  themselves are the caller's (indexed by `prompt_index`). Slots `[:count[p]]` of prompt p hold
  answers, right-padded completions in `score_model`'s layout.
  """

  tokens: jax.Array  # [P, Nr, T] int32
  mask: jax.Array  # [P, Nr, T] bool, response tokens.
  count: jax.Array  # [P] int32, answers stored per prompt (≤ Nr).


class ReferenceBatch(NamedTuple):
  """The cached answers of some prompts, for the teacher-forced pass and `cokl_loss`."""

  tokens: jax.Array  # [..., Nr, T] int32
  mask: jax.Array  # [..., Nr, T] bool
  answer_mask: jax.Array  # [..., Nr] bool: the slot holds an answer (`cokl_loss`'s ref_mask).


def reference_answers_init(*, num_prompts: int, per_prompt: int, length: int
                           ) -> ReferenceAnswers:
  """An empty cache of up to `per_prompt` answers of `length` tokens for `num_prompts` prompts.

  Raises:
    ValueError: naming the argument, if a size is not a positive int.

  Examples:
    >>> cache = reference_answers_init(num_prompts=3, per_prompt=2, length=4)
    >>> cache.tokens.shape, cache.count.tolist()
    ((3, 2, 4), [0, 0, 0])

  References:
    Wang et al., CoKL, arXiv 2608.01743.
  """
  p = _positive_int("num_prompts", num_prompts)
  n = _positive_int("per_prompt", per_prompt)
  t = _positive_int("length", length)
  return ReferenceAnswers(tokens=jnp.zeros((p, n, t), jnp.int32),
                          mask=jnp.zeros((p, n, t), bool),
                          count=jnp.zeros((p,), jnp.int32))


def _check_prompt_index(cache: ReferenceAnswers, prompt_index) -> jax.Array:
  num_prompts = cache.count.shape[0]
  # A concrete index out of range is a caller error; a traced one (under jit) cannot be checked.
  if not isinstance(prompt_index, jax.core.Tracer):
    idx = np.asarray(prompt_index)
    if not np.issubdtype(idx.dtype, np.integer):
      raise ValueError(f"prompt_index must be int, got {idx.dtype}")
    if idx.size and (idx.min() < 0 or idx.max() >= num_prompts):
      raise ValueError(f"prompt_index {idx.tolist()} is outside [0, {num_prompts})")
  return jnp.asarray(prompt_index, jnp.int32)


def reference_answers_put(
    cache: ReferenceAnswers,
    prompt_index: ArrayLike,
    tokens: jax.Array,
    mask: jax.Array,
    correct: jax.Array,
) -> ReferenceAnswers:
  """Appends the verified-correct answers among K samples of one prompt, up to `per_prompt`.

  Correct answers fill the free slots `count[p], count[p]+1, ...` in sample order; once the
  prompt's `Nr` slots are full the rest are dropped (the reference model is frozen, so the
  first correct answers are as good as any). Jittable (fixed shapes; a traced `prompt_index` is
  not range-checked).

  Args:
    cache: the `ReferenceAnswers`.
    prompt_index: int anchor-prompt index p in `[0, P)`.
    tokens, mask: `[K, T]` sampled reference answers and their response mask.
    correct: `[K]` bool verifier outcome.

  Returns:
    The updated cache.

  Raises:
    ValueError: shapes that do not match the cache, or a concrete `prompt_index` out of range.

  Examples:
    >>> import jax.numpy as jnp
    >>> cache = reference_answers_init(num_prompts=2, per_prompt=2, length=1)
    >>> cache = reference_answers_put(cache, 1, jnp.array([[5], [6], [7]]), jnp.ones((3, 1)),
    ...                               jnp.array([False, True, True]))
    >>> cache.tokens[1, :, 0].tolist(), cache.count.tolist()
    ([6, 7], [0, 2])

  References:
    Wang et al., CoKL, arXiv 2608.01743.
  """
  _, nr, t = cache.tokens.shape
  tokens = jnp.asarray(tokens)
  if tokens.ndim != 2 or tokens.shape[1] != t:
    raise ValueError(f"tokens has shape {tuple(tokens.shape)}; expected [K, {t}]")
  k = tokens.shape[0]
  if jnp.shape(mask) != (k, t):
    raise _shape_error("mask", mask, (k, t), "tokens'")
  if jnp.shape(correct) != (k,):
    raise _shape_error("correct", correct, (k,), "one verifier outcome per answer")
  if jnp.ndim(prompt_index) != 0:
    raise ValueError(f"prompt_index must be a scalar int, got shape {jnp.shape(prompt_index)}")
  p = _check_prompt_index(cache, prompt_index)
  return _put(cache, p, tokens, jnp.asarray(mask), jnp.asarray(correct))


@jax.jit
def _put(cache, p, tokens, mask, correct):
  nr = cache.tokens.shape[1]
  correct = correct.astype(bool)
  slot = cache.count[p] + jnp.cumsum(correct.astype(jnp.int32)) - 1
  slot = jnp.where(correct & (slot < nr), slot, nr)  # Out of range: dropped by the scatter.
  row_tokens = cache.tokens[p].at[slot].set(tokens.astype(jnp.int32), mode="drop")
  row_mask = cache.mask[p].at[slot].set(mask > 0, mode="drop")
  count = jnp.minimum(cache.count[p] + jnp.sum(correct.astype(jnp.int32)), nr)
  return ReferenceAnswers(tokens=cache.tokens.at[p].set(row_tokens),
                          mask=cache.mask.at[p].set(row_mask),
                          count=cache.count.at[p].set(count.astype(jnp.int32)))


def reference_answers_get(cache: ReferenceAnswers, prompt_index: ArrayLike) -> ReferenceBatch:
  """The cached answers of prompt(s) `prompt_index` (a scalar or `[B]` ints).

  Score `tokens` (flattened to `[B·Nr, T]`, each with its anchor prompt) with the current
  policy, take `sequence_logp`, reshape to `[B, Nr]` and pass it with `answer_mask` as
  `cokl_loss(ref_logp, ref_mask, ...)`.

  References:
    Wang et al., CoKL, arXiv 2608.01743.
  """
  p = _check_prompt_index(cache, prompt_index)
  nr = cache.tokens.shape[1]
  answer_mask = jnp.arange(nr) < cache.count[p][..., None]
  return ReferenceBatch(cache.tokens[p], cache.mask[p] & answer_mask[..., None], answer_mask)
