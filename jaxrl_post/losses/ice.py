"""ICE: instruction-conditioned exploration with self-distillation to the unconditioned policy
(arXiv 2608.02087).

One set of weights plays both roles: the teacher is the policy conditioned on a behavioural
instruction I (π^T_θ = π_θ(·|x, I)), the student the same policy on the bare prompt
(π^S_θ = π_θ(·|x)). Every rollout of a group is sampled under one context c ∈ {none, I_1..I_N};
RL (DAPO) runs on those conditioned rollouts, and the student is pulled toward the teacher on
the *correct* ones only (the paper's "filtered" configuration, α = 1):

    J_filt(θ) = J^R_T(θ) − β_S · D_KL( sg[π^{T+}_θ] ‖ π^S_θ )

    D_KL = (1 / Σ w) Σ_{i,t} w_{i,t} Σ_v p^T_{i,t}(v) (log p^T_{i,t}(v) − log p^S_{i,t}(v)),
    p^T = softmax(sg z(x, I, y_<t)),  p^S = softmax(z(x, y_<t)),  w_{i,t} = m_{i,t} · 1[R_i = 1]

(token-level forward KL over the vocabulary, averaged over the correct rollouts' tokens; the
paper gives neither β_S nor the KL's form: our PROPOSAL is β_S = 0.1 and this form). On a
truncated support (the teacher's top-K) the same sum runs over the K candidates, renormalised
or not (`renormalize`). The cheaper gradient estimate is `ice_nll_surrogate`: the NLL of the
correct conditioned tokens under the bare prompt (the sampled-token estimate of the same
forward KL's gradient).

`assign_contexts` spreads each group's rollouts over the contexts (PROPOSAL: p(I) uniform over
{none, I_1..I_N}, every context at least once when G ≥ N + 1).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

# PROPOSAL (the paper gives no value): the KL coefficient β_S.
ICE_BETA = 0.1


class ICEKLAux(NamedTuple):
  """Diagnostics of `ice_filtered_forward_kl`: the KL's mean per kept token, the kept tokens."""

  kl_mean: jax.Array
  kept_tokens: jax.Array


def correct_token_weights(rewards, mask, *, correct_reward: float = 1.0) -> jax.Array:
  """w_{i,t} = m_{i,t} · 1[R_i ≥ correct_reward] `[B, T]` float32 (NaN reward: not correct).

  Examples:
    >>> import numpy as np
    >>> correct_token_weights(np.array([1.0, 0.0, np.nan]), np.ones((3, 2), bool)).tolist()
    [[1.0, 1.0], [0.0, 0.0], [0.0, 0.0]]
  """
  rewards = jnp.asarray(rewards, jnp.float32)
  mask = jnp.asarray(mask, bool)
  if rewards.shape != mask.shape[:1]:
    raise ValueError(f"rewards has shape {rewards.shape}; expected ({mask.shape[0]},) "
                     "(one verifier reward per rollout row)")
  correct = jnp.nan_to_num(rewards, nan=-jnp.inf) >= correct_reward
  return (mask & correct[:, None]).astype(jnp.float32)


def ice_filtered_forward_kl(teacher_logp, student_logp, rewards, mask, *,
                            correct_reward: float = 1.0, renormalize: bool = False
                            ) -> tuple[jax.Array, ICEKLAux]:
  """D_KL(sg[π^{T+}] ‖ π^S) averaged over the correct rollouts' tokens (scalar loss).

  Args:
    teacher_logp: `[B, T, V]` log-probs under the instruction-conditioned context (any
      support of V entries: the vocabulary or the teacher's top-K); stop-gradient here.
    student_logp: `[B, T, V]` the same positions and support under the bare prompt.
    rewards: `[B]` verifier rewards; rows with R ≥ `correct_reward` are kept.
    mask: `[B, T]` completion tokens.
    renormalize: renormalise both over the support first (for a truncated top-K support).

  Returns:
    `(loss, ICEKLAux)`; 0 when no token is kept.

  Examples:
    >>> import numpy as np
    >>> t = np.log([[[0.5, 0.5]], [[0.9, 0.1]]])
    >>> s = np.log([[[0.25, 0.75]], [[0.5, 0.5]]])
    >>> loss, aux = ice_filtered_forward_kl(t, s, np.array([1.0, 0.0]), np.ones((2, 1), bool))
    >>> round(float(loss), 4), float(aux.kept_tokens)     # 0.5 ln(0.5/0.25) + 0.5 ln(0.5/0.75)
    (0.1438, 1.0)
  """
  teacher_logp = jax.lax.stop_gradient(jnp.asarray(teacher_logp, jnp.float32))
  student_logp = jnp.asarray(student_logp, jnp.float32)
  if teacher_logp.ndim != 3 or student_logp.shape != teacher_logp.shape:
    raise ValueError(f"teacher_logp {teacher_logp.shape} and student_logp "
                     f"{student_logp.shape} must both be [batch, time, support]")
  if jnp.shape(mask) != teacher_logp.shape[:2]:
    raise ValueError(f"mask has shape {jnp.shape(mask)}; expected {teacher_logp.shape[:2]}")
  if renormalize:
    teacher_logp = jax.nn.log_softmax(teacher_logp, axis=-1)
    student_logp = jax.nn.log_softmax(student_logp, axis=-1)
  w = correct_token_weights(rewards, mask, correct_reward=correct_reward)
  p_t = jnp.exp(teacher_logp)
  # 0 · log 0 = 0: entries the teacher gives no mass contribute nothing (also −inf logits).
  terms = jnp.where(p_t > 0, p_t * (teacher_logp - student_logp), 0.0)
  kl = terms.sum(-1)
  kept = w.sum()
  loss = jnp.where(kept > 0, (jnp.where(w > 0, kl, 0.0) * w).sum() / jnp.maximum(kept, 1.0), 0.0)
  return loss, ICEKLAux(jax.lax.stop_gradient(loss), kept)


def ice_nll_surrogate(student_logp, rewards, mask, *, correct_reward: float = 1.0) -> jax.Array:
  """−mean over the correct rollouts' tokens of log π^S(y_t) (the sampled tokens under the bare
  prompt): the one-sample estimate of the filtered forward KL's gradient.

  Examples:
    >>> import numpy as np
    >>> round(float(ice_nll_surrogate(np.log([[0.5, 0.25], [0.1, 0.1]]), np.array([1.0, 0.0]),
    ...                               np.ones((2, 2), bool))), 4)      # (ln 2 + ln 4) / 2
    1.0397
  """
  student_logp = jnp.asarray(student_logp, jnp.float32)
  w = correct_token_weights(rewards, mask, correct_reward=correct_reward)
  kept = w.sum()
  return jnp.where(kept > 0, -(jnp.where(w > 0, student_logp, 0.0) * w).sum()
                   / jnp.maximum(kept, 1.0), 0.0)


def assign_contexts(num_groups: int, group_size: int, num_instructions: int, *,
                    rng: np.random.Generator | None = None) -> np.ndarray:
  """int `[num_groups · group_size]` context per rollout row (group-major): 0 = no instruction,
  j = instruction I_j. Rollout r of group g gets (r + offset_g) mod (N + 1), with a random
  offset per group (`rng`; 0 without): every context appears ⌊G/(N+1)⌋ or ⌈G/(N+1)⌉ times.

  Examples:
    >>> assign_contexts(2, 4, 2).tolist()
    [0, 1, 2, 0, 0, 1, 2, 0]
  """
  if num_instructions < 0 or group_size < 1 or num_groups < 0:
    raise ValueError(f"need num_instructions >= 0, group_size >= 1, num_groups >= 0; got "
                     f"{num_instructions}, {group_size}, {num_groups}")
  contexts = num_instructions + 1
  offsets = (rng.integers(0, contexts, size=num_groups) if rng is not None
             else np.zeros(num_groups, np.int64))
  rows = (np.arange(group_size)[None, :] + offsets[:, None]) % contexts
  return rows.reshape(-1).astype(np.int32)
