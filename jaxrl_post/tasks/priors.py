"""Task-sampling priors over a pool of N tasks, and the group size that gives a task a signal.

Group RL (GRPO, RLOO) learns nothing from a group whose rollouts all get the same reward, so
which tasks are drawn, and how many rollouts each gets, decides how much of the compute turns
into gradient. This module holds the data-side pieces that act before a rollout is sampled:

TrajVal (arXiv 2608.09217) — a *static* learnability prior. Each task is scored from an
endpoint pair of pass rates, r_e under the initial policy and r_l under a short probe run:

  v_i = (1 − r_e,i) · max(0, r_l,i − r_e,i)          headroom × improvement
  w_i = max((v_i / max_j v_j)^γ, floor)              power compression, γ = 0.3, floor = 0.05
  p_i = w_i / Σ_j w_j

and, on top of an online scheduler (BOTS, GRESO), p_i ∝ p_i^online · w_i.

CANOPY (arXiv 2609.01245) — group sizing by signal coverage. A task with success rate p gives a
non-zero GRPO gradient only when its n rollouts are mixed, with probability

  P_sig(p, n) = 1 − p^n − (1 − p)^n            (p = 0.05: 34% at n = 8, 81% at n = 32)

so the group size is chosen as n ≥ log(1 − τ) / log(1 − p_min) for the hardest retained tier.

RAPO's R-Bucket (arXiv 2608.03660) — a *dynamic* risk prior. The pool is cut at the 1/3 and
2/3 quantiles of a per-task risk ρ into low / medium / high buckets that get 0.80 / 0.15 / 0.05
of the mass (spread evenly inside a bucket), mixed with a uniform fraction u = 0.2.

`TASK_PRIORS` names the priors: "uniform", "trajval", "rapo_bucket"; each returns a
probability vector `[N]` over the pool, which `sample_tasks` draws from. Priors compose
multiplicatively (`combine_with_online`).

Value checks (rates in [0, 1], positive knobs) run when the inputs are concrete; under an outer
`jax.jit` only the shape checks run.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_post.registry import Registry

ArrayLike = jax.Array | np.ndarray | float | int

TASK_PRIORS: Registry = Registry("task prior")

# TrajVal (arXiv 2608.09217): exponent and floor of the weights.
TRAJVAL_GAMMA = 0.3
TRAJVAL_FLOOR = 0.05
# PROPOSAL (TrajVal): samples per task for each endpoint pass rate.
TRAJVAL_ENDPOINT_SAMPLES = 16
# CANOPY (arXiv 2609.01245): a target signal coverage τ (PROPOSAL default; the paper's n = 32 at
# p ≈ 0.05 reaches 0.81).
CANOPY_TARGET = 0.8
# RAPO (arXiv 2608.03660): bucket masses (low, medium, high risk) and the uniform fraction.
RAPO_BUCKET_PROBS = (0.80, 0.15, 0.05)
RAPO_UNIFORM_MIX = 0.2


def _concrete(x) -> np.ndarray | None:
  """The value of `x` as numpy, or None when it is traced (value checks are then skipped)."""
  if isinstance(x, jax.core.Tracer):
    return None
  return np.asarray(x)


def _check_pool(name: str, x, n: int | None = None) -> jax.Array:
  x = jnp.asarray(x, jnp.float32)
  if x.ndim != 1:
    raise ValueError(f"{name} must be [N] (one value per pool task), got shape {tuple(x.shape)}")
  if x.shape[0] == 0:
    raise ValueError(f"{name} is empty; the pool needs at least one task")
  if n is not None and x.shape[0] != n:
    raise ValueError(f"{name} has shape {tuple(x.shape)}; expected ({n},) (one value per task)")
  return x


def _check_unit_interval(name: str, x) -> None:
  value = _concrete(x)
  if value is None:
    return
  bad = ~((value >= 0.0) & (value <= 1.0))  # Also catches NaN.
  if np.any(bad):
    i = int(np.argmax(bad))
    raise ValueError(f"{name} must hold rates in [0, 1]; entry {i} is {float(value.flat[i])!r}")


def _check_scalar(name: str, x, *, low: float, high: float, low_open: bool, high_open: bool):
  value = _concrete(x)
  if value is None:
    return
  if value.ndim != 0:
    raise ValueError(f"{name} must be a scalar, got shape {value.shape}")
  v = float(value)
  ok_low = v > low if low_open else v >= low
  ok_high = v < high if high_open else v <= high
  if not (ok_low and ok_high):
    lb = "(" if low_open else "["
    rb = ")" if high_open else "]"
    raise ValueError(f"{name} must be in {lb}{low}, {high}{rb}, got {v!r}")


# ---------------------------------------------------------------------------------------------
# TrajVal (arXiv 2608.09217).
# ---------------------------------------------------------------------------------------------


@jax.jit
def _endpoint_rewards(rewards: jax.Array, valid: jax.Array) -> jax.Array:
  count = jnp.sum(valid, axis=-1)
  total = jnp.sum(jnp.where(valid, rewards, 0.0), axis=-1)
  return jnp.where(count > 0, total / jnp.maximum(count, 1), jnp.nan)


def endpoint_rewards(rewards: ArrayLike, valid: ArrayLike | None = None) -> jax.Array:
  """Mean pass rate per task, one endpoint (r_e or r_l) of TrajVal.

  r_i = Σ_s valid[i, s]·R[i, s] / Σ_s valid[i, s]

  PROPOSAL (not in the paper): `TRAJVAL_ENDPOINT_SAMPLES` = 16 samples per task, scored by the
  initial policy (r_e) and by the probe-trained policy at the probe's last epoch (r_l).

  Args:
    rewards: `[N, samples]` rewards in [0, 1] of each task's sampled responses.
    valid: `[N, samples]` bool, False on padding or missing samples (default all True).

  Returns:
    `[N]` float32 pass rates; NaN for a task with no valid sample (`trajval_weights` rejects
    those, so drop or re-score them first).

  Examples:
    >>> import jax.numpy as jnp
    >>> endpoint_rewards(jnp.array([[1.0, 0.0, 1.0, 1.0], [0.0, 0.0, 1.0, 0.0]])).tolist()
    [0.75, 0.25]

  References:
    Zhou et al., Beyond Solvability: Task Learnability as a Static Prior for LLM RL
    Post-Training (TrajVal), arXiv 2608.09217.
  """
  rewards = jnp.asarray(rewards, jnp.float32)
  if rewards.ndim != 2:
    raise ValueError(f"rewards must be [N, samples], got shape {tuple(rewards.shape)}")
  if valid is None:
    valid = jnp.ones(rewards.shape, bool)
  valid = jnp.asarray(valid, bool)
  if valid.shape != rewards.shape:
    raise ValueError(f"valid has shape {tuple(valid.shape)}; expected {tuple(rewards.shape)} "
                     "(rewards')")
  value, mask = _concrete(rewards), _concrete(valid)
  if value is not None and mask is not None:
    _check_unit_interval("rewards", value[mask])
  return _endpoint_rewards(rewards, valid)


@jax.jit
def _trajval_scores(r_early: jax.Array, r_late: jax.Array) -> jax.Array:
  return (1.0 - r_early) * jnp.maximum(r_late - r_early, 0.0)


def _check_endpoints(r_early, r_late) -> tuple[jax.Array, jax.Array]:
  r_early = _check_pool("r_early", r_early)
  r_late = _check_pool("r_late", r_late, r_early.shape[0])
  _check_unit_interval("r_early", r_early)
  _check_unit_interval("r_late", r_late)
  return r_early, r_late


def trajval_scores(r_early: ArrayLike, r_late: ArrayLike) -> jax.Array:
  """TrajVal learnability score: headroom × directional improvement.

  v_i = (1 − r_e,i) · max(0, r_l,i − r_e,i)

  Args:
    r_early: `[N]` pass rates in [0, 1] under the initial policy.
    r_late: `[N]` pass rates in [0, 1] under the probe-trained policy.

  Returns:
    `[N]` float32 scores in [0, 1]; 0 for tasks that did not improve (or are already solved).

  Examples:
    >>> import jax.numpy as jnp
    >>> trajval_scores(jnp.array([0.0, 0.5, 1.0]), jnp.array([0.5, 0.25, 1.0])).tolist()
    [0.5, 0.0, 0.0]

  References:
    Zhou et al., Beyond Solvability: Task Learnability as a Static Prior for LLM RL
    Post-Training (TrajVal), arXiv 2608.09217.
  """
  r_early, r_late = _check_endpoints(r_early, r_late)
  return _trajval_scores(r_early, r_late)


@jax.jit
def _trajval_weights(r_early, r_late, gamma, floor):
  v = _trajval_scores(r_early, r_late)
  # All-zero scores give v / 1e-12 = 0, so every weight is the floor: the uniform prior.
  ratio = v / jnp.maximum(jnp.max(v), 1e-12)
  # 0^γ is 0 for γ > 0, but guard the power so that a zero ratio never meets a log.
  compressed = jnp.where(ratio > 0, jnp.power(jnp.where(ratio > 0, ratio, 1.0), gamma), 0.0)
  w = jnp.maximum(compressed, floor)
  return w / jnp.sum(w)


@TASK_PRIORS.register("trajval")
def trajval_weights(
    r_early: ArrayLike,
    r_late: ArrayLike,
    *,
    gamma: ArrayLike = TRAJVAL_GAMMA,
    floor: ArrayLike = TRAJVAL_FLOOR,
) -> jax.Array:
  """TrajVal's sampling prior over the pool from endpoint pass rates.

  v_i = (1 − r_e,i) · max(0, r_l,i − r_e,i)
  w_i = max((v_i / max_j v_j)^γ, floor),   p_i = w_i / Σ_j w_j

  The paper gives the exponent 0.3 and the floor 0.05; the exact form above (normalising by the
  pool maximum before the power, the floor on the compressed weight) is a PROPOSAL. If no task
  improved (every v_i = 0) every weight is the floor and the prior is uniform. The floor keeps
  every task drawable: p_i ≥ floor / N.

  Args:
    r_early: `[N]` pass rates in [0, 1] under the initial policy (see `endpoint_rewards`).
    r_late: `[N]` pass rates in [0, 1] under the probe-trained policy.
    gamma: compression exponent γ > 0 (paper: 0.3; smaller flattens the prior).
    floor: minimum weight, in (0, 1] (paper: 0.05).

  Returns:
    `[N]` float32 probabilities summing to 1.

  Examples:
    >>> import jax.numpy as jnp
    >>> p = trajval_weights(jnp.array([0.0, 0.5, 0.2, 1.0]), jnp.array([1.0, 0.75, 0.1, 1.0]),
    ...                     gamma=1.0, floor=0.1)   # v = [1, 0.125, 0, 0]
    >>> [round(x, 4) for x in p.tolist()]
    [0.7547, 0.0943, 0.0755, 0.0755]

  References:
    Zhou et al., Beyond Solvability: Task Learnability as a Static Prior for LLM RL
    Post-Training (TrajVal), arXiv 2608.09217.
  """
  r_early, r_late = _check_endpoints(r_early, r_late)
  _check_scalar("gamma", gamma, low=0.0, high=math.inf, low_open=True, high_open=True)
  _check_scalar("floor", floor, low=0.0, high=1.0, low_open=True, high_open=False)
  return _trajval_weights(r_early, r_late, jnp.asarray(gamma, jnp.float32),
                          jnp.asarray(floor, jnp.float32))


@jax.jit
def _combine_with_online(p_online, w):
  q = p_online * w
  total = jnp.sum(q)
  # An online scheduler that zeroes every task leaves only the prior to sample from.
  return jnp.where(total > 0, q / jnp.where(total > 0, total, 1.0), w / jnp.sum(w))


def combine_with_online(p_online: ArrayLike, w: ArrayLike) -> jax.Array:
  """A static prior as a multiplicative factor on an online scheduler's probabilities.

  p_i = p_i^online · w_i / Σ_j p_j^online · w_j

  Args:
    p_online: `[N]` non-negative probabilities (or weights) of the online scheduler (BOTS,
      GRESO, ...).
    w: `[N]` positive prior weights, e.g. `trajval_weights` (any scale).

  Returns:
    `[N]` float32 probabilities summing to 1; if every p_i^online · w_i is 0, w normalised.

  Examples:
    >>> import jax.numpy as jnp
    >>> combine_with_online(jnp.array([0.5, 0.5, 0.0]), jnp.array([0.6, 0.2, 0.2])).tolist()
    [0.75, 0.25, 0.0]

  References:
    Zhou et al., Beyond Solvability: Task Learnability as a Static Prior for LLM RL
    Post-Training (TrajVal), arXiv 2608.09217.
  """
  p_online = _check_pool("p_online", p_online)
  w = _check_pool("w", w, p_online.shape[0])
  for name, x in (("p_online", p_online), ("w", w)):
    value = _concrete(x)
    if value is not None and not np.all(value >= 0):
      raise ValueError(f"{name} must be non-negative, got min {float(np.min(value))!r}")
  value = _concrete(w)
  if value is not None and not np.sum(value) > 0:
    raise ValueError("w must have a positive sum")
  return _combine_with_online(p_online, w)


@TASK_PRIORS.register("uniform")
def uniform_prior(num_tasks: int) -> jax.Array:
  """The uniform prior p_i = 1/N, the baseline every other prior is compared against.

  Args:
    num_tasks: pool size N ≥ 1.

  Returns:
    `[N]` float32 probabilities 1/N.

  Examples:
    >>> uniform_prior(4).tolist()
    [0.25, 0.25, 0.25, 0.25]
  """
  if not isinstance(num_tasks, (int, np.integer)) or num_tasks < 1:
    raise ValueError(f"num_tasks must be a positive int, got {num_tasks!r}")
  return jnp.full((int(num_tasks),), 1.0 / num_tasks, jnp.float32)


# ---------------------------------------------------------------------------------------------
# CANOPY group sizing (arXiv 2609.01245).
# ---------------------------------------------------------------------------------------------


def signal_coverage(p: ArrayLike, n: ArrayLike) -> jax.Array:
  """Signal coverage: the probability that a group of n rollouts mixes successes and failures.

  P_sig(p, n) = 1 − p^n − (1 − p)^n

  Only a mixed group gives GRPO a non-zero advantage, so this is the chance that a task with
  success rate p contributes gradient at group size n. Broadcasts over p and n; jittable.

  Args:
    p: success rate(s) in [0, 1].
    n: group size(s) ≥ 1.

  Returns:
    float32 coverage with the broadcast shape of p and n.

  Examples:
    >>> [round(float(signal_coverage(0.05, n)), 3) for n in (8, 32)]
    [0.337, 0.806]

  References:
    Pu et al., Explore More, Drift Less: Outcome-Only Reinforcement Learning Can Suffice for
    Long-Horizon Interactive Agents (CANOPY), arXiv 2609.01245.
  """
  _check_unit_interval("p", p)
  n_value = _concrete(n)
  if n_value is not None and np.any(n_value < 1):
    raise ValueError(f"n must be a group size >= 1, got {n_value.tolist()!r}")
  p = jnp.asarray(p, jnp.float32)
  n = jnp.asarray(n, jnp.float32)
  return 1.0 - p**n - (1.0 - p) ** n


def _coverage(p: float, n: int) -> float:
  return 1.0 - p**n - (1.0 - p) ** n


def min_group_size(p_min: float, *, target: float = CANOPY_TARGET, exact: bool = False) -> int:
  """Smallest group size whose signal coverage reaches `target` on the hardest tier.

  n_min = ⌈log(1 − τ) / log(1 − p_min)⌉      (CANOPY's first-order floor, `exact=False`)

  The floor drops the p^n term of P_sig, which is negligible for small p_min (p_min = 0.05,
  τ = 0.8 gives 32, where P_sig = 0.806) but not for large ones (p_min = 0.5 gives 3, where
  P_sig = 0.75 < 0.8). `exact=True` (our addition) instead returns the smallest n with
  P_sig(p_min, n) ≥ τ. A host-side helper: group size is a static config value.

  Args:
    p_min: estimated success rate of the hardest retained tier, in (0, 1) (a pilot run's p̂_min).
    target: coverage target τ in (0, 1) (PROPOSAL default 0.8).
    exact: search the exact P_sig instead of using the first-order floor.

  Returns:
    The minimum group size, an int ≥ 1.

  Examples:
    >>> min_group_size(0.05), min_group_size(0.5), min_group_size(0.5, exact=True)
    (32, 3, 4)

  References:
    Pu et al., Explore More, Drift Less: Outcome-Only Reinforcement Learning Can Suffice for
    Long-Horizon Interactive Agents (CANOPY), arXiv 2609.01245.
  """
  _check_scalar("p_min", p_min, low=0.0, high=1.0, low_open=True, high_open=True)
  _check_scalar("target", target, low=0.0, high=1.0, low_open=True, high_open=True)
  p_min, target = float(p_min), float(target)
  n = max(1, math.ceil(math.log1p(-target) / math.log1p(-p_min) - 1e-9))
  if exact:
    # P_sig(p, n) increases with n for p in (0, 1), and starts below τ or at n = 1.
    n = 1
    while _coverage(p_min, n) < target:
      n += 1
  return n


def check_group_size(
    group_size: int, p_min: float, *, target: float = CANOPY_TARGET, exact: bool = False
) -> float:
  """Raises unless `group_size` reaches the signal-coverage target on the hardest tier.

  Valid when group_size ≥ `min_group_size(p_min, target=target, exact=exact)`.

  Args:
    group_size: rollouts per prompt, G ≥ 1.
    p_min: estimated success rate of the hardest retained tier, in (0, 1).
    target: coverage target τ in (0, 1) (PROPOSAL default 0.8).
    exact: use the exact P_sig rule instead of the first-order floor.

  Returns:
    The coverage P_sig(p_min, group_size) the group size reaches.

  Raises:
    ValueError: naming group_size, with the minimum and the coverage at both sizes, when it is
      too small; or naming the invalid argument.

  Examples:
    >>> round(check_group_size(32, 0.05), 3)
    0.806

  References:
    Pu et al., Explore More, Drift Less: Outcome-Only Reinforcement Learning Can Suffice for
    Long-Horizon Interactive Agents (CANOPY), arXiv 2609.01245.
  """
  is_int = isinstance(group_size, (int, np.integer)) and not isinstance(group_size, bool)
  if not is_int or group_size < 1:
    raise ValueError(f"group_size must be a positive int, got {group_size!r}")
  n_min = min_group_size(p_min, target=target, exact=exact)
  coverage = _coverage(float(p_min), int(group_size))
  if group_size < n_min:
    raise ValueError(
      f"group_size={group_size} is too small for signal coverage {target} at p_min={p_min}: "
      f"it reaches P_sig = {coverage:.3f}; the coverage rule needs group_size >= {n_min} "
      f"(P_sig = {_coverage(float(p_min), n_min):.3f})")
  return coverage


# ---------------------------------------------------------------------------------------------
# RAPO R-Bucket (arXiv 2608.03660).
# ---------------------------------------------------------------------------------------------


@jax.jit
def _risk_buckets(rho: jax.Array) -> jax.Array:
  q1, q2 = jnp.quantile(rho, jnp.array([1.0 / 3.0, 2.0 / 3.0], jnp.float32))
  return (rho > q1).astype(jnp.int32) + (rho > q2).astype(jnp.int32)


def risk_buckets(rho: ArrayLike) -> jax.Array:
  """RAPO's risk strata: cut the pool at the 1/3 and 2/3 quantiles of the risk ρ.

  b_i = 1[ρ_i > q_{1/3}] + 1[ρ_i > q_{2/3}]   ∈ {0 (low), 1 (medium), 2 (high)}

  Quantiles interpolate linearly (`jnp.quantile`). Ties sit in the lower bucket, so a pool
  of equal risks is all "low" and the other buckets are empty.

  Args:
    rho: `[N]` per-task risk (any real scale; RAPO's ρ is in (0, 1)).

  Returns:
    `[N]` int32 buckets in {0, 1, 2}.

  Examples:
    >>> import jax.numpy as jnp
    >>> risk_buckets(jnp.array([0.9, 0.1, 0.5, 0.2, 0.7, 0.4])).tolist()
    [2, 0, 1, 0, 2, 1]

  References:
    Liu et al., Taming the Implicit: Dual-Channel Risk-Aware Reinforcement Fine-Tuning for
    Continual Multimodal Post-Training (RAPO), arXiv 2608.03660.
  """
  return _risk_buckets(_check_pool("rho", rho))


@jax.jit
def _bucket_probs(rho, probs, uniform_mix):
  b = _risk_buckets(rho)
  count = jnp.bincount(b, length=3).astype(jnp.float32)
  # The sketch this follows, p_i = probs[b_i] / count[b_i], never divides by a zero count (only
  # non-empty buckets are indexed) but leaves the mass of empty buckets unassigned, so the
  # result sums to less than 1 on ties. Renormalise the bucket masses over non-empty buckets.
  mass = jnp.where(count > 0, probs, 0.0)
  mass = mass / jnp.sum(mass)
  p = mass[b] / count[b]
  return (1.0 - uniform_mix) * p + uniform_mix / rho.shape[0]


@TASK_PRIORS.register("rapo_bucket")
def bucket_probs(
    rho: ArrayLike,
    *,
    probs: Sequence[float] | ArrayLike = RAPO_BUCKET_PROBS,
    uniform_mix: ArrayLike = RAPO_UNIFORM_MIX,
) -> jax.Array:
  """RAPO's R-Bucket sampling probabilities over the pool.

  p_i = (1 − u) · π̃_{b_i} / |bucket b_i| + u / N,    π̃_k = π_k / Σ_{k' non-empty} π_{k'}

  with b_i from `risk_buckets`. The bucket masses π = (0.80, 0.15, 0.05) for low / medium /
  high risk are the paper's; the uniform fraction u = 0.2 and the renormalisation over
  non-empty buckets (ties can empty a bucket) are PROPOSAL choices. Refresh ρ over the
  current-stage pool every few steps (the prior is dynamic).

  Args:
    rho: `[N]` per-task risk.
    probs: the three bucket masses (low, medium, high), non-negative with a positive sum on
      the non-empty buckets; they need not sum to 1 (they are renormalised).
    uniform_mix: fraction u in [0, 1] drawn uniformly over the pool.

  Returns:
    `[N]` float32 probabilities summing to 1.

  Examples:
    >>> import jax.numpy as jnp
    >>> p = bucket_probs(jnp.array([0.1, 0.5, 0.9]))
    >>> [round(x, 4) for x in p.tolist()]
    [0.7067, 0.1867, 0.1067]

  References:
    Liu et al., Taming the Implicit: Dual-Channel Risk-Aware Reinforcement Fine-Tuning for
    Continual Multimodal Post-Training (RAPO), arXiv 2608.03660.
  """
  rho = _check_pool("rho", rho)
  probs = jnp.asarray(probs, jnp.float32)
  if probs.shape != (3,):
    raise ValueError(f"probs must hold 3 bucket masses (low, medium, high), got shape "
                     f"{tuple(probs.shape)}")
  value = _concrete(probs)
  if value is not None and not (np.all(value >= 0) and np.sum(value) > 0):
    raise ValueError(f"probs must be non-negative with a positive sum, got {value.tolist()}")
  _check_scalar("uniform_mix", uniform_mix, low=0.0, high=1.0, low_open=False, high_open=False)
  return _bucket_probs(rho, probs, jnp.asarray(uniform_mix, jnp.float32))


# ---------------------------------------------------------------------------------------------
# Drawing tasks from a prior.
# ---------------------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("num", "replace"))
def _sample_tasks(rng, probs, num, replace):
  return jax.random.choice(rng, probs.shape[0], (num,), replace=replace, p=probs)


def sample_tasks(rng: jax.Array, probs: ArrayLike, num: int, *, replace: bool = True) -> jax.Array:
  """Draws `num` task indices from a prior over the pool.

  i_1..i_num ~ Categorical(p)        (with replacement; without: sequential draws, Gumbel top-k)

  Args:
    rng: a PRNG key.
    probs: `[N]` probabilities (e.g. from a `TASK_PRIORS` entry); need not be normalised.
    num: number of tasks to draw (static).
    replace: draw with replacement (default) or without; without needs num ≤ N (and at most
      the number of tasks with positive probability, or zero-probability tasks fill the rest).

  Returns:
    `[num]` int32 task indices.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> sample_tasks(jax.random.key(0), jnp.array([0.0, 1.0, 0.0]), 3).tolist()
    [1, 1, 1]
  """
  probs = _check_pool("probs", probs)
  if not isinstance(num, (int, np.integer)) or isinstance(num, bool) or num < 0:
    raise ValueError(f"num must be a non-negative int, got {num!r}")
  if not replace and num > probs.shape[0]:
    raise ValueError(f"num={num} tasks cannot be drawn without replacement from a pool of "
                     f"{probs.shape[0]}")
  value = _concrete(probs)
  if value is not None and not (np.all(value >= 0) and np.sum(value) > 0):
    raise ValueError("probs must be non-negative with a positive sum")
  return _sample_tasks(rng, probs, int(num), bool(replace)).astype(jnp.int32)
