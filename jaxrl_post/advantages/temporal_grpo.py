"""Temporal GRPO: stage-aligned advantages for long-horizon (VLA) rollouts, arXiv 2608.13026.

Trajectory GRPO gives every action of a rollout the same advantage A_i. In a long manipulation
task that aliases credit: the correct early actions of a rollout that fails at its last stage are
punished for the failure. Temporal GRPO splits the task into a linear chain of stages
m_1 → … → m_K (proposed by a VLM, compiled into detectable completion conditions; m_K is task
success) and runs GRPO *per stage* over the rollouts that entered it.

With T_{i,k} the step at which rollout i completed stage k (T_{i,0} = 0) and T_i its length:

  participation   V_{i,k} = 1 if k = 1 or rollout i completed m_{k−1}, else 0
  outcome         R_{i,k} = 1 if rollout i completed m_k, else 0
  stage stats     μ_k = Σ_i V R / Σ_i V,   σ_k = sqrt(Σ_i V (R − μ_k)² / Σ_i V)   (participants)
  stage adv.      Â_{i,k} = (R_{i,k} − μ_k) / (σ_k + ε)     (0 where V_{i,k} = 0)
  intervals       B_{i,k} = (T_{i,k−1}, T_{i,k}] for a completed stage,
                  B_{i,k} = (T_{i,k−1}, T_i]     for the first failed stage, none after it
  per step        Â_{i,t} = Σ_k 1[t ∈ B_{i,k}] Â_{i,k}

A rollout that never entered stage k is left out of that stage's statistics instead of being
counted as a failure there, and a stage with a single participant gives Â = 0 (σ_k = 0). The
sign of the rollout outcome is deliberately not preserved: the stages a failed rollout did
complete get positive advantages when their completion rate is below 1.

Conventions of this module:
  * Steps are 1-based, t = 1..T_i, as in the paper's half-open intervals. The step axis of the
    output is 0-based: index s holds step t = s + 1, and steps after T_i are padding (0).
  * `stage_done[b, g, k]` is the completion step T_{i,k} ≥ 1, or −1 if the stage was not
    completed. Completion follows the prerequisite chain: a stage whose predecessor was not
    completed counts as not completed (the detector may fire out of order; such an event cannot
    be a chain completion). This keeps the intervals disjoint. Deriving V_k from m_{k−1}'s raw
    detector flag instead would not: a rollout with m_{k−1} flagged but m_{k−2} not would get
    overlapping intervals for stages k−2 (its first failed stage) and k.
  * Completion steps must be non-decreasing along the chain and within the rollout
    (1 ≤ T_{i,k} ≤ T_i). Two stages may complete at the same step (the later one's interval is
    then empty). `check_stage_times` checks this on concrete arrays and raises ValueError naming
    `stage_done`; `temporal_grpo_advantages` calls it whenever its inputs are concrete (it cannot
    inside `jax.jit`, where only shapes are checked).
  * `stage_valid[b, k]` marks the stages task b really has (tasks have different K); padding
    stages get no participants. Steps after the last valid stage's completion get advantage 0.

The objective is the GRPO clipped surrogate with Â_{i,t} per action (`losses.policy_loss` with
`loss_agg_mode="seq-mean-token-mean"` gives the paper's per-rollout 1/|a_i| normalisation);
action chunks inherit the advantage of their step (`step_credit.steps_to_tokens`).

Reference: Zhou et al., Temporal GRPO: Beyond Trajectory-Level Credit in Vision-Language-Action
Reinforcement Learning, arXiv 2608.13026.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_post.advantages.step_credit import STEP_CREDIT


class TemporalGRPOAdvantages(NamedTuple):
  """Per-step advantages and the per-stage quantities behind them."""

  step_adv: jax.Array  # [B, G, S] float32 Â_{i,t}; index s is step t = s + 1.
  stage_adv: jax.Array  # [B, G, K] float32 Â_{i,k} (0 where V = 0).
  participation: jax.Array  # [B, G, K] bool V_{i,k}.
  outcome: jax.Array  # [B, G, K] bool R_{i,k} (chain completion; False where V = 0).


def _is_concrete(*xs) -> bool:
  return not any(isinstance(x, jax.core.Tracer) for x in xs)


def _check_shapes(stage_done, rollout_len, stage_valid, num_steps):
  if stage_done.ndim != 3:
    raise ValueError(f"stage_done must be [B, G, K], got shape {tuple(stage_done.shape)}")
  b, g, k = stage_done.shape
  if k < 1:
    raise ValueError("stage_done has no stages (K = 0); expected K ≥ 1")
  if rollout_len.shape != (b, g):
    raise ValueError(f"rollout_len has shape {tuple(rollout_len.shape)}; expected {(b, g)} "
                     "(one length per rollout)")
  if stage_valid.shape != (b, k):
    raise ValueError(f"stage_valid has shape {tuple(stage_valid.shape)}; expected {(b, k)} "
                     "(one flag per task and stage)")
  if not jnp.issubdtype(stage_done.dtype, jnp.integer):
    raise ValueError(f"stage_done must hold integer steps, got {stage_done.dtype}")
  if not isinstance(num_steps, (int, np.integer)) or num_steps < 1:
    raise ValueError(f"num_steps must be a positive int (the padded step axis S), "
                     f"got {num_steps!r}")


def check_stage_times(stage_done, rollout_len, stage_valid=None, *, num_steps=None) -> None:
  """Checks concrete stage completion times; raises ValueError naming the bad argument.

  Rules (1-based steps): every entry of `stage_done` on a valid stage is −1 or in
  [1, rollout_len]; completions are non-decreasing along the chain (T_{i,k} ≥ T_{i,k−1}); no
  stage is completed after a stage that was not; `rollout_len` is in [0, num_steps].

  Args:
    stage_done: `[B, G, K]` int completion step of each stage, −1 = not completed.
    rollout_len: `[B, G]` int number of steps T_i of each rollout.
    stage_valid: `[B, K]` bool, the task's real stages (default: all).
    num_steps: the padded step axis S, if known.

  Examples:
    >>> import numpy as np
    >>> check_stage_times(np.array([[[2, 5]]]), np.array([[6]]))  # fine
    >>> check_stage_times(np.array([[[2, 7]]]), np.array([[6]]))
    Traceback (most recent call last):
    ...
    ValueError: stage_done[0, 0, 1] = 7 is a step outside the trajectory [1, rollout_len = 6]
  """
  done = np.asarray(stage_done)
  length = np.asarray(rollout_len)
  valid = (np.ones((done.shape[0], done.shape[-1]), bool) if stage_valid is None
           else np.asarray(stage_valid).astype(bool))
  upper = np.inf if num_steps is None else num_steps
  bad_len = (length < 0) | (length > upper)
  if np.any(bad_len):
    idx = tuple(int(i) for i in np.argwhere(bad_len)[0])
    raise ValueError(f"rollout_len{list(idx)} = {int(length[idx])} is outside [0, "
                     f"num_steps = {num_steps}]")
  live = valid[:, None, :]
  bad = live & ((done < -1) | (done == 0) | (done > length[..., None]))
  if np.any(bad):
    b, g, k = (int(i) for i in np.argwhere(bad)[0])
    raise ValueError(f"stage_done[{b}, {g}, {k}] = {int(done[b, g, k])} is a step outside the "
                     f"trajectory [1, rollout_len = {int(length[b, g])}]")
  completed = live & (done >= 1)
  after_gap = completed[..., 1:] & ~completed[..., :-1]
  if np.any(after_gap):
    b, g, k = (int(i) for i in np.argwhere(after_gap)[0])
    raise ValueError(f"stage_done[{b}, {g}, {k + 1}] = {int(done[b, g, k + 1])} completes a "
                     f"stage whose prerequisite (stage {k}) was not completed")
  decreasing = completed[..., 1:] & completed[..., :-1] & (done[..., 1:] < done[..., :-1])
  if np.any(decreasing):
    b, g, k = (int(i) for i in np.argwhere(decreasing)[0])
    raise ValueError(f"stage_done[{b}, {g}, {k + 1}] = {int(done[b, g, k + 1])} is before the "
                     f"previous stage's completion step {int(done[b, g, k])}; completion steps "
                     "must be non-decreasing along the stage chain")


@functools.partial(jax.jit, static_argnames=("num_steps", "eps"))
def _temporal_grpo(stage_done, rollout_len, stage_valid, *, num_steps, eps):
  valid = stage_valid.astype(bool)[:, None, :]  # [B, 1, K]
  raw_done = (stage_done >= 1) & valid
  # Chain completion: stage k counts only if stages 1..k−1 did (see the module docstring).
  done = jnp.cumprod(raw_done.astype(jnp.int32), axis=-1).astype(bool)
  prev_done = jnp.concatenate([jnp.ones_like(done[..., :1]), done[..., :-1]], axis=-1)
  part = prev_done & valid  # V_{i,k}
  outcome = done & part  # R_{i,k}
  v = part.astype(jnp.float32)
  r = outcome.astype(jnp.float32)
  # Stage statistics over the participants of the group (axis 1), population std.
  n = jnp.sum(v, axis=1, keepdims=True)
  mu = jnp.sum(v * r, axis=1, keepdims=True) / jnp.maximum(n, 1.0)
  sd = jnp.sqrt(jnp.sum(v * jnp.square(r - mu), axis=1, keepdims=True) / jnp.maximum(n, 1.0))
  # σ_k + ε = 0 only for eps = 0 and a stage without spread: Â = 0 there, not 0/0.
  denom = sd + eps
  stage_adv = jnp.where(part & (denom > 0), (r - mu) / jnp.where(denom > 0, denom, 1.0), 0.0)
  # Intervals (start, end] in 1-based steps; only stages with V = 1 get one.
  times = jnp.where(done, stage_done, 0)
  start = jnp.concatenate([jnp.zeros_like(times[..., :1]), times[..., :-1]], axis=-1)
  end = jnp.where(done, times, rollout_len[..., None])
  t = jnp.arange(1, num_steps + 1, dtype=stage_done.dtype)  # step t at output index t − 1
  inside = ((t > start[..., None]) & (t <= end[..., None]) & part[..., None]
            & (t <= rollout_len[..., None, None]))  # [B, G, K, S]
  step_adv = jnp.sum(jnp.where(inside, stage_adv[..., None], 0.0), axis=2)
  return TemporalGRPOAdvantages(step_adv, stage_adv, part, outcome)


def temporal_grpo_stages(
    stage_done: jax.Array,
    rollout_len: jax.Array,
    stage_valid: jax.Array | None = None,
    *,
    num_steps: int,
    eps: float = 1e-6,
) -> TemporalGRPOAdvantages:
  """Temporal GRPO advantages with the per-stage diagnostics (Â_{i,k}, V_{i,k}, R_{i,k}).

  Â_{i,k} = (R_{i,k} − μ_k)/(σ_k + ε) over the participants V_{i,k} of each group, and
  Â_{i,t} = Σ_k 1[t ∈ B_{i,k}] Â_{i,k} with B_{i,k} = (T_{i,k−1}, T_{i,k}] for completed stages
  and (T_{i,k−1}, T_i] for the first failed one (see the module docstring for the conventions).

  Jittable (`num_steps` and `eps` are static). With concrete inputs the completion times are
  validated first (`check_stage_times`); under `jax.jit` only shapes are.

  Args:
    stage_done: `[B, G, K]` int completion step T_{i,k} ≥ 1 of each stage, −1 = not completed.
    rollout_len: `[B, G]` int length T_i (number of steps) of each rollout, ≤ num_steps.
    stage_valid: `[B, K]` bool, which stages task b has (default: all K).
    num_steps: S, the padded step axis of the output (static).
    eps: ε added to σ_k.

  Returns:
    `TemporalGRPOAdvantages(step_adv [B,G,S], stage_adv [B,G,K], participation [B,G,K],
    outcome [B,G,K])`.

  Examples:
    >>> import jax.numpy as jnp
    >>> out = temporal_grpo_stages(jnp.array([[[1, 3], [2, -1]]]), jnp.array([[3, 4]]),
    ...                            num_steps=4, eps=0.0)
    >>> out.stage_adv.tolist()  # stage 1: both completed (no spread); stage 2: 1 of 2
    [[[0.0, 1.0], [0.0, -1.0]]]
    >>> out.step_adv.tolist()  # rollout 1 fails stage 2: steps 3..4 get its −1
    [[[0.0, 1.0, 1.0, 0.0], [0.0, 0.0, -1.0, -1.0]]]
    >>> out.participation.tolist()
    [[[True, True], [True, True]]]

  References:
    Zhou et al., Temporal GRPO: Beyond Trajectory-Level Credit in Vision-Language-Action
    Reinforcement Learning, arXiv 2608.13026.
  """
  stage_done = jnp.asarray(stage_done)
  rollout_len = jnp.asarray(rollout_len)
  if stage_valid is None:
    stage_valid = jnp.ones((stage_done.shape[0], stage_done.shape[-1]), bool)
  stage_valid = jnp.asarray(stage_valid)
  _check_shapes(stage_done, rollout_len, stage_valid, num_steps)
  if not jnp.issubdtype(rollout_len.dtype, jnp.integer):
    raise ValueError(f"rollout_len must hold integer step counts, got {rollout_len.dtype}")
  if eps < 0:
    raise ValueError(f"eps must be ≥ 0, got {eps}")
  if _is_concrete(stage_done, rollout_len, stage_valid):
    check_stage_times(stage_done, rollout_len, stage_valid, num_steps=num_steps)
  return _temporal_grpo(stage_done.astype(jnp.int32), rollout_len.astype(jnp.int32),
                        stage_valid, num_steps=num_steps, eps=float(eps))


@STEP_CREDIT.register("temporal_grpo")
def temporal_grpo_advantages(
    stage_done: jax.Array,
    rollout_len: jax.Array,
    stage_valid: jax.Array | None = None,
    *,
    num_steps: int,
    eps: float = 1e-6,
) -> jax.Array:
  """Per-step Temporal GRPO advantages Â_{i,t} = Σ_k 1[t ∈ B_{i,k}] Â_{i,k}, `[B, G, S]`.

  The `step_adv` field of `temporal_grpo_stages`, which documents the formula and arguments.
  Output index s holds step t = s + 1; steps past T_i are 0.

  Examples:
    >>> import jax.numpy as jnp
    >>> adv = temporal_grpo_advantages(jnp.array([[[2], [-1]]]), jnp.array([[2, 3]]),
    ...                                num_steps=3, eps=0.0)
    >>> adv.tolist()  # one stage = task success: plain GRPO ±1 on every step of the rollout
    [[[1.0, 1.0, 0.0], [-1.0, -1.0, -1.0]]]

  References:
    Zhou et al., arXiv 2608.13026.
  """
  return temporal_grpo_stages(stage_done, rollout_len, stage_valid, num_steps=num_steps,
                              eps=eps).step_adv


@jax.jit
def stage_success_delta(r_new: jax.Array, v_new: jax.Array, r_old: jax.Array,
                        v_old: jax.Array) -> jax.Array:
  """Per-stage success change Δp_k = 100·[Pr_new(R_k = 1 | V_k = 1) − Pr_old(R_k = 1 | V_k = 1)].

  Pr(R_k = 1 | V_k = 1) = Σ V_k R_k / Σ V_k over every rollout of the batch (all leading axes),
  the stage's completion rate among the rollouts that entered it. A stage nobody entered in
  either batch gives NaN. The paper reports Δp_k at the first stage where two policies diverge.

  Args:
    r_new: `[..., K]` stage outcomes R of the new policy's rollouts (bool or 0/1).
    v_new: `[..., K]` their participation V.
    r_old: `[..., K]` outcomes of the old policy's rollouts (leading shape may differ from new).
    v_old: `[..., K]` their participation.

  Returns:
    `[K]` float32 Δp_k in percentage points.

  Examples:
    >>> import jax.numpy as jnp
    >>> v = jnp.array([[1, 1], [1, 0]])
    >>> stage_success_delta(jnp.array([[1, 1], [1, 0]]), v, jnp.array([[1, 0], [0, 0]]),
    ...                     v).tolist()
    [50.0, 100.0]

  References:
    Zhou et al., arXiv 2608.13026.
  """
  def rate(r, v, name):
    r = jnp.asarray(r, jnp.float32)
    v = jnp.asarray(v, jnp.float32)
    if r.shape != v.shape or r.ndim < 1:
      raise ValueError(f"{name}: outcome and participation must have the same shape [..., K], "
                       f"got {tuple(r.shape)} and {tuple(v.shape)}")
    axes = tuple(range(r.ndim - 1))
    n = jnp.sum(v, axis=axes)
    return jnp.where(n > 0, jnp.sum(v * r, axis=axes) / jnp.maximum(n, 1.0), jnp.nan)

  new = rate(r_new, v_new, "r_new/v_new")
  old = rate(r_old, v_old, "r_old/v_old")
  if new.shape != old.shape:
    raise ValueError(f"r_old has {old.shape[0]} stages; expected {new.shape[0]} (r_new's)")
  return 100.0 * (new - old)
