"""Policy-gradient objectives for LM post-training: PPO/GRPO clip, GSPO, GSPO-token, CISPO, SAPO.

Everything is a pure function of `[batch, time]` arrays, following GRPO (arXiv 2402.03300), DAPO
(2503.14476), Dr.GRPO (2503.20783) and GSPO (2507.18071), and the conventions of TRL's
`GRPOTrainer` and Tunix's GRPO loss (ratios and clipping of the sampled token's log-probs at the
sampling temperature, masks over completion tokens). One function, `policy_loss`, composes four
independent choices:

  importance-sampling level   token ρ_t = exp(ℓ_t), ℓ_t = logp_t − old_logp_t
                              sequence (GSPO) s_i = exp(Σ_t m ℓ_t / n_i), gradient through the mean
                              sequence_token (GSPO-token): value s_i, gradient per token
  objective                   "clip" (PPO / GRPO / DAPO clip-higher, optional dual clip),
                              "cispo", "sapo"
  sampler mismatch            truncated or masked IS weights exp(old_logp − sampler_logp),
                              token or sequence level, multiplying the per-token loss
  aggregation                 the modes of `aggregation.py`, with explicit global normalisers

plus an optional KL term β·KL(π_θ ‖ π_ref). `POLICY_LOSSES` names the standard combinations.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from jaxrl_post.losses.aggregation import aggregate, loss_normalizers
from jaxrl_post.losses.kl import kl_estimate
from jaxrl_post.registry import Registry

ArrayLike = jax.Array | float | int

IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence", "sequence_token")
OBJECTIVES = ("clip", "cispo", "sapo")
SAMPLER_CORRECTIONS = ("truncate", "mask")
SAMPLER_LEVELS = ("token", "sequence")

POLICY_LOSSES: Registry = Registry("policy_loss")


class PolicyLossAux(NamedTuple):
  """Metrics of one `policy_loss` call; all scalars (float32).

  Mean-type fields are token means normalised by the same `num_tokens` as the loss, so with the
  full-batch `num_tokens` they add up over micro-batches like the loss does; `*_min` / `*_max`
  combine with min / max. Fields whose input was not given are None.
  """

  pg_loss: jax.Array  # Aggregated policy-gradient part of the loss.
  kl_loss: jax.Array | None  # Aggregated KL estimate, before β (loss = pg_loss + β·kl_loss).
  kl: jax.Array | None  # Token-mean KL estimate.
  entropy: jax.Array | None  # Token-mean of the per-token entropies passed in.
  clip_frac_low: jax.Array  # Share of tokens with r < 1−ε_low and A < 0 (lower clip active).
  clip_frac_high: jax.Array  # r > 1+ε_high and A > 0; CISPO: share of capped IS weights.
  clip_frac_dual: jax.Array  # A < 0 and the dual-clip bound −c·A active.
  ratio_mean: jax.Array  # Importance ratio r over valid tokens (sequence levels: s_i per token).
  ratio_min: jax.Array
  ratio_max: jax.Array
  sampler_weight_mean: jax.Array | None  # Sampler-mismatch IS weight over valid tokens.
  sampler_weight_min: jax.Array | None
  sampler_weight_max: jax.Array | None

  # The fields that add up over micro-batches (means over the global `num_tokens`, like the
  # loss); the `*_min` / `*_max` fields would need min / max and are not summed.
  ADDITIVE = ("pg_loss", "kl_loss", "kl", "entropy", "clip_frac_low", "clip_frac_high",
              "clip_frac_dual", "ratio_mean", "sampler_weight_mean")

  def additive(self) -> dict[str, jax.Array]:
    """The additive fields that were computed, as a metrics dict for `make_train_step`."""
    return {k: getattr(self, k) for k in self.ADDITIVE if getattr(self, k) is not None}


def _check_choice(name: str, value: str, valid: tuple[str, ...]) -> None:
  if value not in valid:
    raise ValueError(f"unknown {name} {value!r}; valid: {', '.join(valid)}")


@functools.partial(jax.jit, static_argnames=("level", "correction", "min_weight", "max_weight"))
def sampler_importance_weights(
    old_logp: jax.Array,
    sampler_logp: jax.Array,
    mask: jax.Array,
    *,
    level: str = "token",
    correction: str = "truncate",
    min_weight: float | None = None,
    max_weight: float | None = 2.0,
) -> jax.Array:
  """Importance weights that correct for the sampler/trainer mismatch (TIS / masked IS).

  Δ_t = (old_logp_t − sampler_logp_t)·m_t;  token: w_t = exp(Δ_t);  sequence: w_i = exp(Σ_t Δ_t)
  (a sum, not a mean: the sequence likelihood ratio, as TRL does).
  truncate (TIS): w ← clip(w, min_weight, max_weight);
  mask (IcePop / MIS): w ← w if min_weight ≤ w ≤ max_weight else 0.

  `old_logp` are the trainer's log-probs of the policy that generated the data and
  `sampler_logp` what the inference engine reported for the same tokens. The weights multiply
  the per-token policy loss (not the KL term) and carry no gradient.

  Args:
    old_logp: `[batch, time]` trainer log-probs of the sampling policy.
    sampler_logp: `[batch, time]` inference-engine log-probs.
    mask: `[batch, time]` loss mask.
    level: "token" or "sequence".
    correction: "truncate" or "mask".
    min_weight: lower bound (None: no lower bound).
    max_weight: upper bound (None: no upper bound). The default 2.0 is Tunix's token TIS cap;
      TRL defaults to sequence-level masking with max 3.0. The spec gives no default (PROPOSAL).

  Returns:
    `[batch, time]` float32 weights, 0 on padding, stop-gradient.

  Examples:
    >>> import jax.numpy as jnp
    >>> w = sampler_importance_weights(jnp.log(jnp.array([[0.5, 0.9]])),
    ...                                jnp.log(jnp.array([[0.1, 0.9]])), jnp.ones((1, 2)))
    >>> [round(float(x), 3) for x in w[0]]  # exp(log 5) truncated at 2
    [2.0, 1.0]

  References:
    Truncated IS (TIS) and IcePop as in Miles (`vanilla_tis_function`, `icepop_function`);
    the TRL token/sequence truncate/mask modes (no arXiv paper).
  """
  chex.assert_rank([old_logp, sampler_logp, mask], 2)
  chex.assert_equal_shape([old_logp, sampler_logp, mask])
  _check_choice("sampler level", level, SAMPLER_LEVELS)
  _check_choice("sampler correction", correction, SAMPLER_CORRECTIONS)
  valid = jnp.asarray(mask) > 0
  delta = jnp.where(valid, old_logp - sampler_logp, 0.0)
  if level == "sequence":
    delta = jnp.broadcast_to(jnp.sum(delta, axis=-1, keepdims=True), delta.shape)
  weight = jnp.exp(delta)
  if correction == "truncate":
    if min_weight is not None or max_weight is not None:
      weight = jnp.clip(weight, min_weight, max_weight)
  else:
    inside = jnp.ones_like(valid)
    if min_weight is not None:
      inside &= weight >= min_weight
    if max_weight is not None:
      inside &= weight <= max_weight
    weight = jnp.where(inside, weight, 0.0)
  return jax.lax.stop_gradient(jnp.where(valid, weight, 0.0))


def _importance_log_ratio(logp, old_logp, valid, level, max_log_ratio):
  """log r per token at the requested level (see the module docstring)."""
  log_ratio = jnp.where(valid, logp - old_logp, 0.0)
  if max_log_ratio is not None:
    # A guard against exp overflow (Tunix clamps at ±20); the clamped region has no gradient.
    log_ratio = jnp.clip(log_ratio, -max_log_ratio, max_log_ratio)
  if level == "token":
    return log_ratio
  lengths = jnp.maximum(jnp.sum(valid, axis=-1, keepdims=True), 1)
  seq_log_ratio = jnp.sum(log_ratio, axis=-1, keepdims=True) / lengths
  if level == "sequence":
    return jnp.broadcast_to(seq_log_ratio, log_ratio.shape)
  # GSPO-token: the value is the sequence ratio, the gradient that of each token's own log-prob.
  token_grad = jnp.where(valid, logp - jax.lax.stop_gradient(logp), 0.0)
  return token_grad + jax.lax.stop_gradient(seq_log_ratio)


def _masked_stats(x, mask, num_tokens):
  """(token-mean, min, max) of `x` over the valid tokens; the mean weighs tokens like the loss."""
  valid = mask > 0
  mean = aggregate(x, mask, mode="token-mean", num_tokens=num_tokens)
  return mean, jnp.min(jnp.where(valid, x, jnp.inf)), jnp.max(jnp.where(valid, x, -jnp.inf))


def policy_loss(
    logp: jax.Array,
    old_logp: jax.Array,
    adv: jax.Array,
    mask: jax.Array,
    *,
    loss_agg_mode: str = "token-mean",
    objective: str = "clip",
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    dual_clip_c: float | None = None,
    importance_sampling_level: str = "token",
    max_log_ratio: float | None = None,
    cispo_max_weight: float = 5.0,
    sapo_tau_pos: float = 1.0,
    sapo_tau_neg: float = 1.05,
    ref_logp: jax.Array | None = None,
    beta: ArrayLike = 0.0,
    kl_estimator: str = "k3",
    sampler_logp: jax.Array | None = None,
    sampler_level: str = "token",
    sampler_correction: str = "truncate",
    sampler_min: float | None = None,
    sampler_max: float | None = 2.0,
    entropy: jax.Array | None = None,
    num_tokens: ArrayLike | None = None,
    num_sequences: ArrayLike | None = None,
    max_tokens: int | None = None,
) -> tuple[jax.Array, PolicyLossAux]:
  """Clipped / soft-gated policy-gradient loss with optional KL and sampler-mismatch correction.

  Per token, with ratio r (at `importance_sampling_level`) and advantage A (to be minimised):

    clip:   L = max(−A·r, −A·clip(r, 1−ε_low, 1+ε_high));  dual clip: if A < 0, L ← min(L, −c·A)
    cispo:  L = −sg(min(r, w_max))·A·logp
    sapo:   L = −σ(τ·(r − 1))·(4/τ)·A,  τ = τ_pos if A > 0 else τ_neg

  then L ← w_sampler·L when `sampler_logp` is given, and

    loss = agg(L) + β·agg(KL_k(logp, ref_logp))

  with `agg` the `loss_agg_mode` reduction and its global normalisers (`aggregation.aggregate`).
  Importance levels: "token" r_t = exp(logp_t − old_logp_t); "sequence" (GSPO)
  r_i = exp(Σ_t m(logp − old_logp) / n_i), broadcast over tokens, gradient through the mean;
  "sequence_token" (GSPO-token) r_{i,t} = sg(r_i)·exp(logp_t − sg(logp_t)), the same value as
  "sequence" with each token's own gradient (for per-token advantages).

  Exact micro-batching: compute `loss_normalizers(mask)` once over the whole batch and pass its
  fields as `num_tokens` / `num_sequences` to every micro-batch call; the micro-batch losses and
  gradients then sum to the full-batch ones (for `max_tokens`, pass the same value too). Under
  `jax.jit` on a sharded batch the defaults are already global; under `shard_map`, `psum` them.

  String, float and int hyperparameters are static under `jit` (a new value compiles a new
  program); `beta`, `num_tokens` and `num_sequences` may be traced arrays (a β schedule, a
  `vmap` over β).

  Args:
    logp: `[batch, time]` log π_θ of the sampled tokens (differentiated).
    old_logp: `[batch, time]` log-probs of the policy that generated the data (trainer side).
      Pass `stop_gradient(logp)` for a single on-policy step.
    adv: `[batch]` (broadcast over time) or `[batch, time]` advantages.
    mask: `[batch, time]` loss mask (bool, or float token weights).
    loss_agg_mode: "token-mean" (default; DAPO), "seq-mean-token-mean" (GRPO),
      "seq-mean-token-sum" or "seq-mean-token-sum-norm" (Dr.GRPO).
    objective: "clip", "cispo" or "sapo".
    epsilon_low: ε_low of the clip objective.
    epsilon_high: ε_high (clip-higher: DAPO uses 0.28).
    dual_clip_c: c > 1 for the dual clip on A < 0 (None: off). Equals TRL's `delta` and
      Tunix's `epsilon_c` whenever c ≥ 1+ε_high.
    importance_sampling_level: "token", "sequence" or "sequence_token".
    max_log_ratio: if set, clamp logp − old_logp to ±this before exp (Tunix uses 20).
    cispo_max_weight: absolute cap w_max on the CISPO IS weight (TRL's `epsilon_high` for cispo).
      The spec gives no default; 5.0 is a PROPOSAL.
    sapo_tau_pos: SAPO temperature for A > 0 (spec silent; 1.0 from the SAPO paper, PROPOSAL).
    sapo_tau_neg: SAPO temperature for A ≤ 0 (spec silent; 1.05 from the paper, PROPOSAL).
    ref_logp: `[batch, time]` reference log-probs; enables the KL term and metrics.
    beta: KL coefficient β; requires `ref_logp` when non-zero.
    kl_estimator: "k1", "k2" or "k3" (default, GRPO/TRL; Tunix's default is k1).
    sampler_logp: `[batch, time]` inference-engine log-probs; enables the mismatch correction.
    sampler_level: "token" or "sequence" (see `sampler_importance_weights`).
    sampler_correction: "truncate" (TIS) or "mask" (IcePop / MIS).
    sampler_min: lower bound of the sampler IS weight (None: none).
    sampler_max: upper bound of the sampler IS weight (None: none). Default 2.0, Tunix's token
      TIS cap (the papers give none: PROPOSAL).
    entropy: optional `[batch, time]` per-token entropies, for the `entropy` metric only.
    num_tokens: valid tokens in the whole batch (default: Σ mask).
    num_sequences: non-empty sequences in the whole batch (default: counted from mask).
    max_tokens: length budget of "seq-mean-token-sum-norm" (default: the padded width).

  Returns:
    `(loss, aux)`: the scalar loss (float32) and a `PolicyLossAux`.

  Examples:
    >>> import jax.numpy as jnp
    >>> logp = jnp.log(jnp.array([[0.5, 0.5]]))
    >>> old_logp = jnp.log(jnp.array([[0.25, 0.5]]))  # ratios 2 and 1
    >>> loss, aux = policy_loss(logp, old_logp, jnp.array([1.0]), jnp.ones((1, 2)))
    >>> round(float(loss), 4)  # −(1.2·1 + 1·1)/2: the first ratio is clipped at 1+ε_high
    -1.1
    >>> float(aux.clip_frac_high)
    0.5

  References:
    Schulman et al., PPO, arXiv 1707.06347.  Shao et al., GRPO, arXiv 2402.03300.
    Yu et al., DAPO (clip-higher), arXiv 2503.14476.  Ye et al., dual clip, arXiv 1912.09729.
    Zheng et al., GSPO, arXiv 2507.18071.  MiniMax-M1 (CISPO), arXiv 2506.13585.
    Qwen team, SAPO, arXiv 2511.20347.
  """
  kwargs = dict(locals())  # exactly the arguments: forwarded to the jitted implementation
  # Checked here, outside jit, where a Python β is still a number (β may also be an array).
  if ref_logp is None and not (isinstance(beta, (int, float)) and beta == 0):
    raise ValueError("beta != 0 needs ref_logp")
  return _policy_loss(**kwargs)


@functools.partial(jax.jit, static_argnames=(
    "loss_agg_mode", "objective", "epsilon_low", "epsilon_high", "dual_clip_c",
    "importance_sampling_level", "max_log_ratio", "cispo_max_weight", "sapo_tau_pos",
    "sapo_tau_neg", "kl_estimator", "sampler_level", "sampler_correction", "sampler_min",
    "sampler_max", "max_tokens"))
def _policy_loss(logp, old_logp, adv, mask, *, loss_agg_mode, objective, epsilon_low,
                 epsilon_high, dual_clip_c, importance_sampling_level, max_log_ratio,
                 cispo_max_weight, sapo_tau_pos, sapo_tau_neg, ref_logp, beta, kl_estimator,
                 sampler_logp, sampler_level, sampler_correction, sampler_min, sampler_max,
                 entropy, num_tokens, num_sequences, max_tokens):
  """`policy_loss` after the β check; jitted so that eager calls compile one program."""
  chex.assert_rank([logp, old_logp, mask], 2)
  chex.assert_equal_shape([logp, old_logp, mask])
  chex.assert_rank(adv, {1, 2})
  _check_choice("objective", objective, OBJECTIVES)
  _check_choice("importance_sampling_level", importance_sampling_level,
                IMPORTANCE_SAMPLING_LEVELS)
  if dual_clip_c is not None and dual_clip_c <= 1.0:
    raise ValueError(f"dual_clip_c must be > 1, got {dual_clip_c}")

  logp = jnp.asarray(logp, jnp.float32)
  old_logp = jnp.asarray(old_logp, jnp.float32)
  mask_f = jnp.asarray(mask, jnp.float32)
  valid = mask_f > 0
  adv = jnp.asarray(adv, jnp.float32)
  # Zeroed on padding: a NaN there would reach the sequence-level ratio through its gradient.
  adv = jnp.where(valid, jnp.broadcast_to(adv[:, None] if adv.ndim == 1 else adv, logp.shape), 0.0)
  if num_tokens is None or num_sequences is None:
    local = loss_normalizers(mask_f)
    num_tokens = local.num_tokens if num_tokens is None else num_tokens
    num_sequences = local.num_sequences if num_sequences is None else num_sequences
  num_tokens = jnp.asarray(num_tokens, jnp.float32)
  agg = dict(mode=loss_agg_mode, num_tokens=num_tokens, num_sequences=num_sequences,
             max_tokens=max_tokens)

  ratio = jnp.exp(_importance_log_ratio(logp, old_logp, valid, importance_sampling_level,
                                        max_log_ratio))
  zeros = jnp.zeros_like(ratio, dtype=bool)
  clip_low = clip_high = clip_dual = zeros
  if objective == "clip":
    unclipped = -adv * ratio
    clipped = -adv * jnp.clip(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high)
    per_token = jnp.maximum(unclipped, clipped)
    clip_low = (ratio < 1.0 - epsilon_low) & (adv < 0)
    clip_high = (ratio > 1.0 + epsilon_high) & (adv > 0)
    if dual_clip_c is not None:
      # For A < 0 the clipped loss grows without bound in r; cap it at −c·A (zero gradient there).
      bound = -dual_clip_c * adv
      clip_dual = (adv < 0) & (per_token > bound)
      per_token = jnp.where(adv < 0, jnp.minimum(per_token, bound), per_token)
  elif objective == "cispo":
    weight = jax.lax.stop_gradient(jnp.minimum(ratio, cispo_max_weight))
    per_token = -weight * adv * jnp.where(valid, logp, 0.0)
    # The cap applies whatever the sign of A, so count every capped token.
    clip_high = ratio > cispo_max_weight
  else:  # sapo
    tau = jnp.where(adv > 0, sapo_tau_pos, sapo_tau_neg)
    per_token = -jax.nn.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau) * adv

  sampler_stats = (None, None, None)
  if sampler_logp is not None:
    weight = sampler_importance_weights(
        old_logp, jnp.asarray(sampler_logp, jnp.float32), mask_f, level=sampler_level,
        correction=sampler_correction, min_weight=sampler_min, max_weight=sampler_max)
    per_token = per_token * weight
    sampler_stats = _masked_stats(weight, mask_f, num_tokens)

  pg_loss = aggregate(per_token, mask_f, **agg)
  loss = pg_loss
  kl_loss = kl_mean = None
  if ref_logp is not None:
    ref_logp = jnp.asarray(ref_logp, jnp.float32)
    chex.assert_equal_shape([logp, ref_logp])
    # Zero padding before the estimator so exp in k3 cannot overflow (and poison the gradient).
    kl = kl_estimate(jnp.where(valid, logp, 0.0), jnp.where(valid, ref_logp, 0.0),
                     estimator=kl_estimator)
    kl_loss = aggregate(kl, mask_f, **agg)
    kl_mean = aggregate(kl, mask_f, mode="token-mean", num_tokens=num_tokens)
    loss = pg_loss + beta * kl_loss

  def frac(flags):
    return aggregate(flags.astype(jnp.float32), mask_f, mode="token-mean", num_tokens=num_tokens)

  entropy_mean = None
  if entropy is not None:
    chex.assert_equal_shape([logp, entropy])
    entropy_mean = aggregate(jax.lax.stop_gradient(entropy), mask_f, mode="token-mean",
                             num_tokens=num_tokens)
  ratio_stats = _masked_stats(jax.lax.stop_gradient(ratio), mask_f, num_tokens)
  aux = PolicyLossAux(
      pg_loss=pg_loss, kl_loss=kl_loss, kl=kl_mean, entropy=entropy_mean,
      clip_frac_low=frac(clip_low), clip_frac_high=frac(clip_high),
      clip_frac_dual=frac(clip_dual), ratio_mean=ratio_stats[0], ratio_min=ratio_stats[1],
      ratio_max=ratio_stats[2], sampler_weight_mean=sampler_stats[0],
      sampler_weight_min=sampler_stats[1], sampler_weight_max=sampler_stats[2])
  return loss, aux


# GSPO's ε_l, ε_h (arXiv 2507.18071) and its (1/G) Σ_i average over sequences.
_GSPO_DEFAULTS = {"epsilon_low": 3e-4, "epsilon_high": 4e-4,
                  "loss_agg_mode": "seq-mean-token-mean"}


def _fixed(kwargs: dict, name: str, **fixed) -> dict:
  for key, value in fixed.items():
    if kwargs.get(key, value) != value:
      raise ValueError(f"{name} fixes {key}={value!r}; got {kwargs[key]!r} (use policy_loss)")
    kwargs[key] = value
  return kwargs


POLICY_LOSSES.add("ppo", policy_loss)
POLICY_LOSSES.add("grpo", policy_loss)


@POLICY_LOSSES.register("gspo")
def gspo_loss(logp, old_logp, adv, mask, **kwargs) -> tuple[jax.Array, PolicyLossAux]:
  """GSPO: the clip objective on the sequence-level ratio s_i = exp(mean_t(logp − old_logp)).

  J = (1/G) Σ_i min(s_i·A_i, clip(s_i, 1−ε_l, 1+ε_h)·A_i). `policy_loss` with
  `importance_sampling_level="sequence"`; defaults to the paper's ε_l = 3e-4, ε_h = 4e-4 and
  "seq-mean-token-mean" (the (1/G) Σ_i average; override either by keyword).

  Examples:
    >>> import jax.numpy as jnp
    >>> loss, _ = gspo_loss(jnp.zeros((1, 2)), jnp.zeros((1, 2)), jnp.ones(1), jnp.ones((1, 2)))
    >>> float(loss)
    -1.0

  References:
    Zheng et al., Group Sequence Policy Optimization, arXiv 2507.18071.
  """
  kwargs = {**_GSPO_DEFAULTS, **kwargs}
  kwargs = _fixed(kwargs, "gspo", importance_sampling_level="sequence", objective="clip")
  return policy_loss(logp, old_logp, adv, mask, **kwargs)


@POLICY_LOSSES.register("gspo_token")
def gspo_token_loss(logp, old_logp, adv, mask, **kwargs) -> tuple[jax.Array, PolicyLossAux]:
  """GSPO-token: GSPO's sequence ratio as the value, each token's own log-prob gradient.

  s_{i,t} = sg(s_i)·exp(logp_t − sg(logp_t)); same value as GSPO, and with per-token advantages
  each token's gradient carries its own A_{i,t}. Same defaults as `gspo_loss`.

  Examples:
    >>> import jax.numpy as jnp
    >>> loss, _ = gspo_token_loss(jnp.zeros((1, 2)), jnp.zeros((1, 2)), jnp.ones((1, 2)),
    ...                           jnp.ones((1, 2)))
    >>> float(loss)
    -1.0

  References:
    Zheng et al., Group Sequence Policy Optimization, arXiv 2507.18071.
  """
  kwargs = {**_GSPO_DEFAULTS, **kwargs}
  kwargs = _fixed(kwargs, "gspo_token", importance_sampling_level="sequence_token",
                  objective="clip")
  return policy_loss(logp, old_logp, adv, mask, **kwargs)


@POLICY_LOSSES.register("cispo")
def cispo_loss(logp, old_logp, adv, mask, **kwargs) -> tuple[jax.Array, PolicyLossAux]:
  """CISPO: REINFORCE on every token, weighted by a detached, capped IS ratio.

  L_t = −sg(min(r_t, w_max))·A·logp_t. `policy_loss` with `objective="cispo"`.

  Examples:
    >>> import jax.numpy as jnp
    >>> logp = jnp.log(jnp.array([[0.5]]))
    >>> loss, _ = cispo_loss(logp, logp, jnp.ones(1), jnp.ones((1, 1)))
    >>> round(float(loss), 4)  # −1·1·log 0.5
    0.6931

  References:
    MiniMax-M1, arXiv 2506.13585.
  """
  kwargs = _fixed(kwargs, "cispo", objective="cispo")
  return policy_loss(logp, old_logp, adv, mask, **kwargs)


@POLICY_LOSSES.register("sapo")
def sapo_loss(logp, old_logp, adv, mask, **kwargs) -> tuple[jax.Array, PolicyLossAux]:
  """SAPO: a sigmoid soft gate on the ratio instead of a hard clip.

  L_t = −σ(τ(r_t − 1))·(4/τ)·A, τ = τ_pos if A > 0 else τ_neg; at r = 1 its gradient equals the
  unclipped surrogate's. `policy_loss` with `objective="sapo"`.

  Examples:
    >>> import jax.numpy as jnp
    >>> loss, _ = sapo_loss(jnp.zeros((1, 1)), jnp.zeros((1, 1)), jnp.ones(1), jnp.ones((1, 1)))
    >>> float(loss)  # −σ(0)·4·1
    -2.0

  References:
    Qwen team, Soft Adaptive Policy Optimization, arXiv 2511.20347.
  """
  kwargs = _fixed(kwargs, "sapo", objective="sapo")
  return policy_loss(logp, old_logp, adv, mask, **kwargs)
