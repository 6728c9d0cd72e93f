"""FACTOR's token allocation and action-mean loss: "how much" per action, then "where" per token.

FACTOR (arXiv 2608.07118) splits credit assignment for multi-turn agents in two. TAC
(`advantages.factor.factor_td_credit`) decides *how much* credit A*_t each action t gets. HTA
(hindsight token allocation) then decides *where* inside the action it goes, without changing
the action's total:

  gap          Δ_{t,j} = log π_teacher(y_{t,j} | ctx, feedback) − log π_θ(y_{t,j} | ctx)
               (the same model, shown the observation that followed the action)
  score        s_{t,j} = sgn(A*_t) · clip(Δ_{t,j}, −d, d)
  APM          ρ_{t,j} = (1 − η)/L_t + η · softmax_j(s_{t,j}/τ)   (ρ ≥ 0, Σ_j ρ_{t,j} = 1)
  coefficient  C_{t,j} = L_t · ρ_{t,j} · A*_t

so the action mean (1/L_t) Σ_j C_{t,j} is exactly A*_t (per-action mean preservation) and no
token's sign differs from its action's. The loss reduces per action first:

  L_RL = −(1/Σ_i T_i) Σ_{i,t} (1/L_{i,t}) Σ_j min(q C, clip(q, 1−ε, 1+ε) C),  q = π_θ/π_old

and at q = 1 each action contributes exactly A*_t, whatever its length L_t.

Layout: per-action arrays are `[B, S, L]` (rollouts × actions × tokens of an action); any leading
shape works (`[B, G, S, L]` too). The sampler stores rollouts as token rows `[B, T]` with a step
(turn) id per token, −1 off the action tokens; `tokens_to_actions` / `actions_to_tokens` convert.

`TOKEN_ALLOCATIONS` names the coefficient rules, each `fn(A_star, delta, tok_mask, **knobs) ->
C [..., S, L]`: "factor_apm" (HTA + APM) and "uniform" (C = A*, the η = 0 / no-HTA ablation).

PROPOSAL choices: η is annealed linearly from 0.7 to 0.3 (`factor_eta`; the paper anneals from
0.7 but its schedule is not known); the loss clip is symmetric ε = 0.2 unless `eps_high` is given.

Reference: Ma et al., How Much, Then Where: Credit-Conserving Action-to-Token Allocation for
Multi-Turn Agent Reinforcement Learning (FACTOR), arXiv 2608.07118.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_post.losses.policy import policy_loss
from jaxrl_post.registry import Registry

ArrayLike = jax.Array | float | int

TOKEN_ALLOCATIONS: Registry = Registry("token allocation")

# Paper: η starts at 0.7; τ = 1; d = 3. The end value 0.3 of the anneal is a PROPOSAL.
ETA_START = 0.7
ETA_END = 0.3


def _is_concrete(*xs) -> bool:
  return not any(isinstance(x, jax.core.Tracer) for x in xs)


def _check_coef_inputs(A_star, delta, tok_mask):
  if tok_mask.ndim < 2:
    raise ValueError(f"tok_mask must be [..., S, L], got shape {tuple(tok_mask.shape)}")
  if A_star.shape != tok_mask.shape[:-1]:
    raise ValueError(f"A_star has shape {tuple(A_star.shape)}; expected "
                     f"{tuple(tok_mask.shape[:-1])} (tok_mask's without the token axis)")
  if delta is not None and delta.shape != tok_mask.shape:
    raise ValueError(f"delta has shape {tuple(delta.shape)}; expected {tuple(tok_mask.shape)} "
                     "(tok_mask's)")


@functools.partial(jax.jit, static_argnames=("tau", "d"))
def _apm(A_star, delta, tok_mask, eta, *, tau, d):
  valid = tok_mask > 0
  s = jnp.sign(A_star)[..., None] * jnp.clip(jnp.where(valid, delta, 0.0), -d, d) / tau
  # Filling masked scores with −inf (the usual masked softmax) makes an action with no tokens
  # 0/0 = NaN; a finite fill keeps it finite, and its ρ is masked to 0 anyway.
  s = jnp.where(valid, s, jnp.finfo(jnp.float32).min)
  soft = jax.nn.softmax(s, axis=-1)
  n = jnp.sum(valid, axis=-1, keepdims=True).astype(jnp.float32)
  rho = jnp.where(valid, (1.0 - eta) / jnp.maximum(n, 1.0) + eta * soft, 0.0)
  # C is an advantage: no gradient flows into the teacher gap or the policy through it.
  return jax.lax.stop_gradient(n * rho * A_star[..., None])


@TOKEN_ALLOCATIONS.register("factor_apm")
def factor_token_coef(
    A_star: jax.Array,
    delta: jax.Array,
    tok_mask: jax.Array,
    *,
    eta: ArrayLike,
    tau: float = 1.0,
    d: float = 3.0,
) -> jax.Array:
  """HTA token coefficients with per-action mean preservation (APM).

  s_{t,j} = sgn(A*_t)·clip(Δ_{t,j}, −d, d);  ρ_{t,j} = (1 − η)/L_t + η·softmax_j(s_{t,j}/τ);
  C_{t,j} = L_t ρ_{t,j} A*_t, so (1/L_t) Σ_j C_{t,j} = A*_t and sgn C_{t,j} = sgn A*_t.

  Jittable; `eta` may be a traced scalar (a schedule, `factor_eta`), `tau` and `d` are static.
  The result is wrapped in `stop_gradient`.

  Args:
    A_star: `[B, S]` (any `[..., S]`) per-action credit A*_t.
    delta: `[..., S, L]` hindsight teacher–student log-prob gap Δ_{t,j} of each action token
      (padding may hold anything, also inf/NaN).
    tok_mask: `[..., S, L]` 1 on the tokens of each action (L_t = Σ_j tok_mask).
    eta: η ∈ [0, 1], the weight of the hindsight allocation (paper: 0.7, annealed). η = 0 gives
      the uniform C = A*; η = 1 gives C = L_t·softmax·A*.
    tau: softmax temperature τ > 0 (paper: 1).
    d: clip bound d > 0 of the gap (paper: 3).

  Returns:
    `[..., S, L]` float32 C, 0 off the tokens.

  Examples:
    >>> import jax.numpy as jnp
    >>> c = factor_token_coef(jnp.array([[2.0]]), jnp.array([[[jnp.log(3.0), 0.0]]]),
    ...                       jnp.ones((1, 1, 2)), eta=1.0)
    >>> [round(x, 4) for x in c[0, 0].tolist()]  # 2·softmax(log 3, 0)·2 = 2·(3/4, 1/4)·2
    [3.0, 1.0]

  References:
    Ma et al., How Much, Then Where: Credit-Conserving Action-to-Token Allocation for Multi-Turn
    Agent Reinforcement Learning (FACTOR), arXiv 2608.07118.
  """
  A_star = jnp.asarray(A_star, jnp.float32)
  delta = jnp.asarray(delta, jnp.float32)
  tok_mask = jnp.asarray(tok_mask)
  _check_coef_inputs(A_star, delta, tok_mask)
  if not tau > 0:
    raise ValueError(f"tau must be > 0, got {tau}")
  if not d > 0:
    raise ValueError(f"d must be > 0, got {d}")
  if _is_concrete(eta) and not 0.0 <= float(eta) <= 1.0:
    raise ValueError(f"eta must be in [0, 1], got {float(eta)}")
  return _apm(A_star, delta, tok_mask, jnp.asarray(eta, jnp.float32), tau=float(tau),
              d=float(d))


@TOKEN_ALLOCATIONS.register("uniform")
@jax.jit
def uniform_token_coef(A_star: jax.Array, delta: jax.Array | None, tok_mask: jax.Array
                       ) -> jax.Array:
  """Uniform allocation C_{t,j} = A*_t on every token of the action (`delta` is ignored).

  The no-HTA ablation, equal to `factor_token_coef` with η = 0.

  Args:
    A_star: `[..., S]` per-action credit.
    delta: unused (may be None); accepted so every `TOKEN_ALLOCATIONS` entry takes the same
      arguments.
    tok_mask: `[..., S, L]` token mask.

  Returns:
    `[..., S, L]` float32 C (stop-gradient), 0 off the tokens.

  Examples:
    >>> import jax.numpy as jnp
    >>> uniform_token_coef(jnp.array([[-1.0]]), None, jnp.array([[[1, 1, 0]]])).tolist()
    [[[-1.0, -1.0, 0.0]]]
  """
  A_star = jnp.asarray(A_star, jnp.float32)
  tok_mask = jnp.asarray(tok_mask)
  _check_coef_inputs(A_star, None if delta is None else jnp.asarray(delta), tok_mask)
  return jax.lax.stop_gradient(jnp.where(tok_mask > 0, A_star[..., None], 0.0))


@functools.partial(jax.jit, static_argnames="total_steps")
def factor_eta(step: ArrayLike, *, total_steps: int, eta_start: ArrayLike = ETA_START,
               eta_end: ArrayLike = ETA_END) -> jax.Array:
  """PROPOSAL η schedule: linear anneal η(k) = η_0 + (η_1 − η_0)·min(k/K, 1).

  The paper starts at η = 0.7 and anneals without giving the schedule; 0.7 → 0.3 linearly over
  the run is our choice. Steps past `total_steps` keep η_1.

  Args:
    step: the training step k ≥ 0 (may be traced).
    total_steps: K > 0, the length of the anneal (static).
    eta_start: η_0 (paper: 0.7).
    eta_end: η_1 (PROPOSAL: 0.3).

  Returns:
    Scalar float32 η.

  Examples:
    >>> [round(float(factor_eta(k, total_steps=4)), 4) for k in (0, 2, 4, 9)]
    [0.7, 0.5, 0.3, 0.3]
  """
  if not isinstance(total_steps, (int, np.integer)) or total_steps <= 0:
    raise ValueError(f"total_steps must be a positive int, got {total_steps!r}")
  frac = jnp.clip(jnp.asarray(step, jnp.float32) / total_steps, 0.0, 1.0)
  start = jnp.asarray(eta_start, jnp.float32)
  return start + (jnp.asarray(eta_end, jnp.float32) - start) * frac


@jax.jit
def action_mean_multiplier(C: jax.Array, tok_mask: jax.Array, A_star: jax.Array
                           ) -> jax.Array:
  """Diagnostic: deviation of the action-mean multiplier from 1, (1/L_t) Σ_j C_{t,j} / A*_t − 1.

  FACTOR's APM keeps it at 0 up to rounding (the paper reports ≤ 4e−7); a token reweighting
  without mean preservation does not. NaN where undefined (A*_t = 0 or an action with no
  tokens), so that `jnp.nanmedian` etc. skip those actions.

  Args:
    C: `[..., S, L]` token coefficients.
    tok_mask: `[..., S, L]` token mask.
    A_star: `[..., S]` per-action credit.

  Returns:
    `[..., S]` float32 deviation.

  Examples:
    >>> import jax.numpy as jnp
    >>> action_mean_multiplier(jnp.array([[[3.0, 1.0], [1.0, 1.0]]]), jnp.ones((1, 2, 2)),
    ...                        jnp.array([[2.0, 0.5]])).tolist()
    [[0.0, 1.0]]
  """
  C = jnp.asarray(C, jnp.float32)
  A_star = jnp.asarray(A_star, jnp.float32)
  tok_mask = jnp.asarray(tok_mask)
  _check_coef_inputs(A_star, C, tok_mask)
  valid = tok_mask > 0
  n = jnp.sum(valid, axis=-1)
  mean = jnp.sum(jnp.where(valid, C, 0.0), axis=-1) / jnp.maximum(n, 1)
  ok = (n > 0) & (A_star != 0)
  return jnp.where(ok, mean / jnp.where(ok, A_star, 1.0) - 1.0, jnp.nan)


class FactorLossAux(NamedTuple):
  """Metrics of `factor_loss`; scalars (float32)."""

  num_actions: jax.Array  # Σ act_mask, the Σ_i T_i the loss divides by.
  clip_frac_low: jax.Array  # Token share with q < 1−ε and C < 0 (token-mean over action tokens).
  clip_frac_high: jax.Array  # Token share with q > 1+ε and C > 0.
  ratio_mean: jax.Array  # Mean importance ratio over action tokens.
  ratio_min: jax.Array
  ratio_max: jax.Array


def factor_loss(
    logp: jax.Array,
    old_logp: jax.Array,
    C: jax.Array,
    tok_mask: jax.Array,
    act_mask: jax.Array,
    *,
    eps: float = 0.2,
    eps_high: float | None = None,
    num_actions: ArrayLike | None = None,
) -> tuple[jax.Array, FactorLossAux]:
  """FACTOR's clipped surrogate with action-mean reduction.

  L = −(1/Σ_i T_i) Σ_{i,t} m_{i,t} (1/L_{i,t}) Σ_j min(q C, clip(q, 1−ε, 1+ε_high) C),
  q = exp(logp − old_logp), m = act_mask, L_{i,t} = Σ_j tok_mask.

  Reuses `policy_loss`'s clip objective on the actions as rows (`[..., S, L]` → `[N·S, L]`,
  "seq-mean-token-mean" with Σ act_mask as the number of sequences). At q = 1 the loss is
  −mean over actions of A*_t when C comes from `factor_token_coef`, independent of L_t. An action
  with act_mask 1 and no tokens counts in Σ_i T_i and contributes 0.

  Args:
    logp: `[B, S, L]` (any `[..., S, L]`) log π_θ of the action tokens (differentiated).
    old_logp: same shape, behaviour-policy log-probs.
    C: same shape, token coefficients (`factor_token_coef`).
    tok_mask: same shape, 1 on the tokens of each action.
    act_mask: `[..., S]` 1 on real actions.
    eps: ε (low side of the clip; also the high side unless `eps_high` is given).
    eps_high: ε_high for an asymmetric clip (default: ε).
    num_actions: Σ_i T_i of the whole batch, for exact micro-batching (default: Σ act_mask).

  Returns:
    `(loss, FactorLossAux)`.

  Examples:
    >>> import jax.numpy as jnp
    >>> c = jnp.array([[[3.0, 1.0, 0.0], [-1.0, 0.0, 0.0]]])  # A* = 2 (2 tokens), −1 (1 token)
    >>> m = jnp.array([[[1, 1, 0], [1, 0, 0]]])
    >>> loss, aux = factor_loss(jnp.zeros((1, 2, 3)), jnp.zeros((1, 2, 3)), c, m,
    ...                         jnp.array([[1, 1]]))
    >>> float(loss), float(aux.num_actions)  # −(2 + (−1))/2
    (-0.5, 2.0)

  References:
    Ma et al., FACTOR, arXiv 2608.07118.  Schulman et al., PPO, arXiv 1707.06347.
  """
  logp = jnp.asarray(logp)
  tok_mask = jnp.asarray(tok_mask)
  act_mask = jnp.asarray(act_mask)
  for name, x in (("logp", logp), ("old_logp", old_logp), ("C", C)):
    if jnp.shape(x) != tok_mask.shape:
      raise ValueError(f"{name} has shape {tuple(jnp.shape(x))}; expected "
                       f"{tuple(tok_mask.shape)} (tok_mask's)")
  if tok_mask.ndim < 2 or act_mask.shape != tok_mask.shape[:-1]:
    raise ValueError(f"act_mask has shape {tuple(act_mask.shape)}; expected "
                     f"{tuple(tok_mask.shape[:-1])} (tok_mask's without the token axis)")
  if not 0 <= eps < 1 or (eps_high is not None and eps_high < 0):
    raise ValueError(f"eps must be in [0, 1) and eps_high ≥ 0, got {eps}, {eps_high}")
  width = tok_mask.shape[-1]
  act = act_mask.astype(jnp.float32)
  mask = jnp.where(tok_mask > 0, 1.0, 0.0) * act[..., None]
  if num_actions is None:
    num_actions = jnp.sum(act)

  def rows(x):
    return jnp.reshape(jnp.asarray(x, jnp.float32), (-1, width))

  loss, aux = policy_loss(rows(logp), rows(old_logp), rows(C), rows(mask),
                          loss_agg_mode="seq-mean-token-mean", epsilon_low=float(eps),
                          epsilon_high=float(eps if eps_high is None else eps_high),
                          num_sequences=num_actions)
  return loss, FactorLossAux(jnp.asarray(num_actions, jnp.float32), aux.clip_frac_low,
                             aux.clip_frac_high, aux.ratio_mean, aux.ratio_min, aux.ratio_max)


class ActionTokens(NamedTuple):
  """Token rows regrouped per action."""

  values: jax.Array  # [B, S, L] the token values of each action, in order; 0 on padding.
  tok_mask: jax.Array  # [B, S, L] bool, which slots hold a token.
  position: jax.Array  # [B, T] int32 slot j of each token in its action (−1 off the actions).


@functools.partial(jax.jit, static_argnames=("num_steps", "max_action_len"))
def _tokens_to_actions(x, step_ids, *, num_steps, max_action_len):
  inside = (step_ids >= 0) & (step_ids < num_steps)
  onehot = inside[..., None] & (step_ids[..., None] == jnp.arange(num_steps))  # [B, T, S]
  # j = number of earlier tokens of the same action (cost O(B·T·S), fine for turn counts).
  before = jnp.cumsum(onehot, axis=1) - onehot
  pos = jnp.sum(jnp.where(onehot, before, 0), axis=-1)
  keep = inside & (pos < max_action_len)
  b = jnp.broadcast_to(jnp.arange(x.shape[0])[:, None], x.shape)
  s = jnp.where(keep, step_ids, num_steps)  # out-of-range index: dropped by the scatter
  j = jnp.where(keep, pos, max_action_len)
  shape = (x.shape[0], num_steps, max_action_len)
  values = jnp.zeros(shape, x.dtype).at[b, s, j].set(jnp.where(keep, x, 0), mode="drop")
  mask = jnp.zeros(shape, bool).at[b, s, j].set(keep, mode="drop")
  return ActionTokens(values, mask, jnp.where(keep, pos, -1).astype(jnp.int32))


def tokens_to_actions(x: jax.Array, step_ids: jax.Array, *, num_steps: int,
                      max_action_len: int) -> ActionTokens:
  """Regroups token rows `[B, T]` into per-action slots `[B, S, L]` (the loss layout).

  values[b, s, j] = x[b, t] for the j-th token t (in order) with step_ids[b, t] = s.
  Tokens with step id −1 (observations, padding) or outside [0, S) are left out. Tokens past the
  first L of an action would be dropped: with concrete inputs that raises ValueError naming
  `max_action_len`; under `jax.jit` they are silently dropped, so size L from the data.

  Args:
    x: `[B, T]` per-token values (log-probs, teacher gaps, ...).
    step_ids: `[B, T]` int action index of each token, −1 off the actions.
    num_steps: S (static).
    max_action_len: L (static).

  Returns:
    `ActionTokens(values [B,S,L], tok_mask [B,S,L], position [B,T])`.

  Examples:
    >>> import jax.numpy as jnp
    >>> out = tokens_to_actions(jnp.array([[1., 2., 9., 3., 4., 5.]]),
    ...                         jnp.array([[0, 0, -1, 1, 1, 1]]), num_steps=2, max_action_len=3)
    >>> out.values.tolist()
    [[[1.0, 2.0, 0.0], [3.0, 4.0, 5.0]]]
  """
  x = jnp.asarray(x)
  step_ids = jnp.asarray(step_ids, jnp.int32)
  if x.ndim != 2 or step_ids.shape != x.shape:
    raise ValueError(f"step_ids has shape {tuple(step_ids.shape)}; expected "
                     f"{tuple(x.shape)} (x's, [B, T])")
  if not isinstance(num_steps, (int, np.integer)) or num_steps < 1:
    raise ValueError(f"num_steps must be a positive int, got {num_steps!r}")
  if not isinstance(max_action_len, (int, np.integer)) or max_action_len < 1:
    raise ValueError(f"max_action_len must be a positive int, got {max_action_len!r}")
  if _is_concrete(step_ids):
    ids = np.asarray(step_ids)
    for s in range(num_steps):
      longest = int((ids == s).sum(-1).max(initial=0))
      if longest > max_action_len:
        raise ValueError(f"max_action_len = {max_action_len} is shorter than action {s}, "
                         f"which has {longest} tokens")
  return _tokens_to_actions(x, step_ids, num_steps=int(num_steps),
                            max_action_len=int(max_action_len))


@jax.jit
def actions_to_tokens(y: jax.Array, position: jax.Array, step_ids: jax.Array) -> jax.Array:
  """Inverse of `tokens_to_actions`: x[b, t] = y[b, step_ids[b, t], position[b, t]], else 0.

  Args:
    y: `[B, S, L]` per-action-token values (e.g. `factor_token_coef`'s C).
    position: `[B, T]` slot of each token (`ActionTokens.position`), −1 off the actions.
    step_ids: `[B, T]` action index of each token, −1 off the actions.

  Returns:
    `[B, T]` values, 0 on tokens outside every action.

  Examples:
    >>> import jax.numpy as jnp
    >>> ids = jnp.array([[0, 0, -1, 1]])
    >>> out = tokens_to_actions(jnp.zeros((1, 4)), ids, num_steps=2, max_action_len=2)
    >>> actions_to_tokens(jnp.array([[[1., 2.], [3., 0.]]]), out.position, ids).tolist()
    [[1.0, 2.0, 0.0, 3.0]]
  """
  y = jnp.asarray(y)
  position = jnp.asarray(position, jnp.int32)
  step_ids = jnp.asarray(step_ids, jnp.int32)
  if y.ndim != 3 or position.shape != step_ids.shape or position.shape[0] != y.shape[0]:
    raise ValueError(f"y must be [B, S, L] and position, step_ids [B, T] with the same B; got "
                     f"{tuple(y.shape)}, {tuple(position.shape)}, {tuple(step_ids.shape)}")
  _, num_steps, width = y.shape
  ok = (step_ids >= 0) & (step_ids < num_steps) & (position >= 0) & (position < width)
  b = jnp.arange(y.shape[0])[:, None]
  picked = y[b, jnp.clip(step_ids, 0, num_steps - 1), jnp.clip(position, 0, width - 1)]
  return jnp.where(ok, picked, 0)
