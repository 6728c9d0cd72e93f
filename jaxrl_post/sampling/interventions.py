"""RAIL: recoverability-aware rollout interventions chosen by a contextual bandit.

Critic-free group RL (GRPO) spends the same number of rollouts on every task and state. RAIL
(arXiv 2608.05080) instead decides, per task, *where* and *how* to spend extra rollouts, and
learns that choice online as a contextual bandit whose reward is the improvement the
intervention actually produced; the policy update afterwards is unchanged GRPO. The paper
states the rule a*(s) = argmax_a E[ΔR_recover(s, a) − λ·C(a)] and the shadow-to-live
procedure; everything else here is a PROPOSAL reconstruction, each choice a keyword:

  context z     bias, task features, turn position, entropy at the branch point, group success
                rate p̂, reward variance, rollouts spent / budget          (`context_features`)
  arms a        where ∈ {none, max_entropy_turn, first_failing_turn, restart}
                × extra rollouts m ∈ {2, 4, 8} × temperature T ∈ {0.7, 1.0, 1.2}
                ("none" once: 28 arms)                                       (`default_arms`)
  features      φ(z, a) = vec(a_feat ⊗ z), so every arm's utility is linear in the context
                                                                             (`joint_features`)
  gain g        coverage: 1[group mixed after] − 1[group mixed before]  (realised ΔP_sig)
                variance: Var_after − Var_before                            (`realised_gain`)
  utility u     g − λ·tokens / budget                                       (`utility`)
  controller    discounted LinUCB / linear TS on φ (`jaxrl_post.bandits`)
  shadow→live   a heuristic acts (with ε random arms for coverage) while the controller learns;
                go live once the controller's LCB beats the heuristic's utility W = 50
                decisions in a row ("streak"), or in a share ≥ s of the last W decisions
                ("share", this project's variant)                (`shadow_to_live_update`)

Arms are host-side data (`InterventionArm`); their encoding, the gains, the switch and the
choice are pure, fixed-shape functions that jit.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

ArrayLike = jax.Array | np.ndarray | float | int

# Where an intervention branches; the order fixes the one-hot encoding of `arm_features`.
WHERE_OPTIONS = ("none", "max_entropy_turn", "first_failing_turn", "restart")
# PROPOSAL (RAIL reconstruction) arm grid.
RAIL_EXTRA_ROLLOUTS = (2, 4, 8)
RAIL_TEMPERATURES = (0.7, 1.0, 1.2)
# PROPOSAL: shadow-to-live window, ε of random arms in shadow mode, and the cost weight λ.
RAIL_WINDOW = 50
RAIL_EPSILON = 0.1
# How the switch decides: W wins in a row (the spec's reading), or a share of wins among the
# last W counted decisions (PROPOSAL of this project, with share s = RAIL_MIN_SHARE).
SWITCH_RULES = ("streak", "share")
RAIL_MIN_SHARE = 0.5
RAIL_COST_WEIGHT = 0.1
GAIN_KINDS = ("coverage", "variance")
# one-hot where (4), m / rollout_scale, T − 1.
ARM_FEATURE_DIM = len(WHERE_OPTIONS) + 2
# bias, turn position, entropy, p̂, reward variance, rollouts spent / budget (+ task features).
CONTEXT_BASE_DIM = 6


class InterventionArm(NamedTuple):
  """One intervention: where to branch, how many extra rollouts, at which temperature."""

  where: str  # One of WHERE_OPTIONS.
  extra_rollouts: int  # m ≥ 0 extra rollouts (0 for "none").
  temperature: float  # Sampling temperature of the extra rollouts.


def default_arms(
    *,
    wheres: Sequence[str] = WHERE_OPTIONS[1:],
    extra_rollouts: Sequence[int] = RAIL_EXTRA_ROLLOUTS,
    temperatures: Sequence[float] = RAIL_TEMPERATURES,
    include_none: bool = True,
) -> tuple[InterventionArm, ...]:
  """The PROPOSAL arm grid: "none" once, then where × m × T.

  Args:
    wheres: branch points other than "none" (default: max_entropy_turn, first_failing_turn,
      restart).
    extra_rollouts: extra rollout counts m (default 2, 4, 8).
    temperatures: temperatures T (default 0.7, 1.0, 1.2).
    include_none: put the no-intervention arm `("none", 0, 1.0)` first.

  Returns:
    A tuple of `InterventionArm` (28 with the defaults), in a fixed order.

  Examples:
    >>> arms = default_arms()
    >>> len(arms)
    28
    >>> arms[0]
    InterventionArm(where='none', extra_rollouts=0, temperature=1.0)
    >>> arms[1]
    InterventionArm(where='max_entropy_turn', extra_rollouts=2, temperature=0.7)

  References:
    RAIL: Optimizing What Policies Learn From: Recoverability-aware Rollout Intervention
    Learning, arXiv 2608.05080.
  """
  for w in wheres:
    if w not in WHERE_OPTIONS or w == "none":
      raise ValueError(f"wheres has {w!r}; expected a subset of {WHERE_OPTIONS[1:]}")
  for m in extra_rollouts:
    if not isinstance(m, (int, np.integer)) or m < 1:
      raise ValueError(f"extra_rollouts must be positive ints, got {m!r}")
  for t in temperatures:
    if not float(t) > 0:
      raise ValueError(f"temperatures must be > 0, got {t!r}")
  arms = [InterventionArm("none", 0, 1.0)] if include_none else []
  arms += [InterventionArm(w, int(m), float(t))
           for w in wheres for m in extra_rollouts for t in temperatures]
  if not arms:
    raise ValueError("the arm grid is empty: give wheres, extra_rollouts and temperatures, or "
                     "include_none=True")
  return tuple(arms)


def arm_features(arms: Sequence[InterventionArm], *, rollout_scale: float = 8.0) -> jax.Array:
  """Encodes arms as `[n_arms, 6]` rows: one-hot where (4), m / rollout_scale, T − 1.

  Args:
    arms: a non-empty sequence of `InterventionArm`.
    rollout_scale: divisor of m, so the count feature is O(1) (default: the largest PROPOSAL m).

  Returns:
    `[n_arms, ARM_FEATURE_DIM]` float32.

  Examples:
    >>> [round(x, 3) for x in arm_features([InterventionArm("restart", 4, 1.2)])[0].tolist()]
    [0.0, 0.0, 0.0, 1.0, 0.5, 0.2]
  """
  arms = list(arms)
  if not arms:
    raise ValueError("arms is empty; the bandit needs at least one intervention arm")
  if not rollout_scale > 0:
    raise ValueError(f"rollout_scale must be > 0, got {rollout_scale!r}")
  rows = np.zeros((len(arms), ARM_FEATURE_DIM), np.float32)
  for i, arm in enumerate(arms):
    if arm.where not in WHERE_OPTIONS:
      raise ValueError(f"arms[{i}].where is {arm.where!r}; expected one of {WHERE_OPTIONS}")
    rows[i, WHERE_OPTIONS.index(arm.where)] = 1.0
    rows[i, len(WHERE_OPTIONS)] = arm.extra_rollouts / rollout_scale
    rows[i, len(WHERE_OPTIONS) + 1] = arm.temperature - 1.0
  return jnp.asarray(rows)


def context_features(
    task_features: ArrayLike | None = None,
    *,
    turn_position: ArrayLike,
    entropy: ArrayLike,
    success_rate: ArrayLike,
    reward_variance: ArrayLike,
    rollouts_spent: ArrayLike,
    rollout_budget: ArrayLike,
) -> jax.Array:
  """The decision context z of one task: `[1, task_features..., pos, H, p̂, Var, spent/budget]`.

  A leading constant 1 makes `joint_features` contain the arm features themselves (an
  arm-specific intercept). Jittable; vmap it for a batch of tasks.

  Args:
    task_features: `[k]` task embedding or ID features (None: k = 0).
    turn_position: normalised position of the candidate branch turn, in [0, 1].
    entropy: policy entropy at the candidate branch point.
    success_rate: the group's current success rate p̂.
    reward_variance: the group's reward variance.
    rollouts_spent: rollouts already spent on this task.
    rollout_budget: rollout budget per task (> 0), normalising `rollouts_spent`.

  Returns:
    `[CONTEXT_BASE_DIM + k]` float32.

  Examples:
    >>> context_features(turn_position=0.5, entropy=1.0, success_rate=0.25,
    ...                  reward_variance=0.1875, rollouts_spent=8, rollout_budget=32).tolist()
    [1.0, 0.5, 1.0, 0.25, 0.1875, 0.25]
  """
  scalars = dict(turn_position=turn_position, entropy=entropy, success_rate=success_rate,
                 reward_variance=reward_variance, rollouts_spent=rollouts_spent,
                 rollout_budget=rollout_budget)
  for name, value in scalars.items():
    if jnp.ndim(value) != 0:
      raise ValueError(f"{name} must be a scalar, got shape {jnp.shape(value)}")
  if not isinstance(rollout_budget, jax.core.Tracer) and not float(rollout_budget) > 0:
    raise ValueError(f"rollout_budget must be > 0, got {rollout_budget!r}")
  if task_features is None:
    task_features = jnp.zeros((0,), jnp.float32)
  task_features = jnp.asarray(task_features, jnp.float32)
  if task_features.ndim != 1:
    raise ValueError(f"task_features must be [k], got shape {tuple(task_features.shape)}")
  f = lambda v: jnp.asarray(v, jnp.float32)[None]
  return jnp.concatenate([
    jnp.ones((1,), jnp.float32), task_features, f(turn_position), f(entropy), f(success_rate),
    f(reward_variance), f(rollouts_spent) / f(rollout_budget)])


def joint_features(context: ArrayLike, arms: ArrayLike) -> jax.Array:
  """Bandit features φ(z, a) = vec(a_feat ⊗ z) for every arm.

  φ[i, j·d_c + k] = arms[i, j] · z[k]. With z[0] = 1 the arm features appear unchanged, and
  every other entry lets an arm's utility depend linearly on one context feature.

  Args:
    context: `[d_c]` context (see `context_features`).
    arms: `[n_arms, d_a]` arm encodings (see `arm_features`), n_arms ≥ 1.

  Returns:
    `[n_arms, d_a·d_c]` float32, the `features` of `bandits.linucb_select`.

  Examples:
    >>> import jax.numpy as jnp
    >>> joint_features(jnp.array([1.0, 2.0]), jnp.array([[1.0, 0.0], [0.0, 3.0]])).tolist()
    [[1.0, 2.0, 0.0, 0.0], [0.0, 0.0, 3.0, 6.0]]
  """
  context = jnp.asarray(context, jnp.float32)
  arms = jnp.asarray(arms, jnp.float32)
  if context.ndim != 1:
    raise ValueError(f"context must be [d_c], got shape {tuple(context.shape)}")
  if arms.ndim != 2:
    raise ValueError(f"arms must be [n_arms, d_a], got shape {tuple(arms.shape)}")
  if arms.shape[0] == 0:
    raise ValueError("arms is empty (n_arms = 0); the bandit needs at least one arm")
  return (arms[:, :, None] * context[None, None, :]).reshape(arms.shape[0], -1)


def _check_group(name: str, rewards, valid) -> tuple[jax.Array, jax.Array]:
  rewards = jnp.asarray(rewards, jnp.float32)
  if rewards.ndim < 1 or rewards.shape[-1] == 0:
    raise ValueError(f"{name} must be [..., G] with G ≥ 1 rollouts, got shape "
                     f"{tuple(rewards.shape)}")
  if valid is None:
    valid = jnp.ones(rewards.shape, bool)
  valid = jnp.asarray(valid, bool)
  if valid.shape != rewards.shape:
    raise ValueError(f"the valid mask of {name} has shape {tuple(valid.shape)}; expected "
                     f"{tuple(rewards.shape)}")
  return rewards, valid


def _mixed(r, valid, tol):
  hi = jnp.max(jnp.where(valid, r, -jnp.inf), axis=-1)
  lo = jnp.min(jnp.where(valid, r, jnp.inf), axis=-1)
  return (jnp.sum(valid, axis=-1) >= 2) & (hi - lo > tol)


def _variance(r, valid):
  n = jnp.sum(valid, axis=-1)
  mean = jnp.sum(jnp.where(valid, r, 0.0), axis=-1) / jnp.maximum(n, 1)
  sq = jnp.where(valid, (r - mean[..., None]) ** 2, 0.0)
  return jnp.sum(sq, axis=-1) / jnp.maximum(n, 1)


@functools.partial(jax.jit, static_argnames=("kind", "tol"))
def _realised_gain(before, after, valid_before, valid_after, kind, tol):
  if kind == "coverage":
    return (_mixed(after, valid_after, tol).astype(jnp.float32)
            - _mixed(before, valid_before, tol).astype(jnp.float32))
  return _variance(after, valid_after) - _variance(before, valid_before)


def realised_gain(
    rewards_before: ArrayLike,
    rewards_after: ArrayLike,
    *,
    kind: str = "coverage",
    valid_before: ArrayLike | None = None,
    valid_after: ArrayLike | None = None,
    tol: float = 1e-6,
) -> jax.Array:
  """The improvement an intervention realised on a task's group of rewards.

  coverage:  g = 1[after mixed] − 1[before mixed]   (mixed = max − min > tol over ≥ 2 valid
             rollouts: the realised change of P_sig; the group now gives GRPO a gradient)
  variance:  g = Var_after − Var_before              (population variance over valid rollouts)

  `rewards_after` is the group the update will see after the intervention (original plus
  extra rollouts, or the regenerated group); its size G' may differ from G.

  Args:
    rewards_before: `[..., G]` rewards before the intervention.
    rewards_after: `[..., G']` rewards after it (same leading shape).
    kind: "coverage" (binary rewards, the default) or "variance" (static).
    valid_before: `[..., G]` bool, False on padding (default all True).
    valid_after: `[..., G']` bool, False on padding (default all True).
    tol: minimum reward spread that counts as mixed (static).

  Returns:
    `[...]` float32 gains; coverage gains are in {−1, 0, 1}.

  Examples:
    >>> import jax.numpy as jnp
    >>> float(realised_gain(jnp.array([0.0, 0.0]), jnp.array([0.0, 0.0, 1.0, 0.0])))
    1.0
    >>> float(realised_gain(jnp.array([0.0, 0.0]), jnp.array([0.0, 0.0, 1.0, 1.0]),
    ...                     kind="variance"))
    0.25

  References:
    RAIL: Optimizing What Policies Learn From: Recoverability-aware Rollout Intervention
    Learning, arXiv 2608.05080.
  """
  if kind not in GAIN_KINDS:
    raise ValueError(f"kind must be one of {GAIN_KINDS}, got {kind!r}")
  before, valid_before = _check_group("rewards_before", rewards_before, valid_before)
  after, valid_after = _check_group("rewards_after", rewards_after, valid_after)
  if before.shape[:-1] != after.shape[:-1]:
    raise ValueError(f"rewards_after has leading shape {tuple(after.shape[:-1])}; expected "
                     f"{tuple(before.shape[:-1])} (rewards_before's)")
  return _realised_gain(before, after, valid_before, valid_after, kind, float(tol))


def utility(
    gain: ArrayLike,
    tokens: ArrayLike,
    *,
    budget: ArrayLike,
    cost_weight: ArrayLike = RAIL_COST_WEIGHT,
) -> jax.Array:
  """Cost-adjusted bandit reward of an intervention.

  u = g − λ · tokens / budget

  Args:
    gain: `[...]` realised gains (`realised_gain`).
    tokens: `[...]` tokens the intervention generated.
    budget: token budget (> 0) that normalises the cost, e.g. the per-step rollout budget.
    cost_weight: λ ≥ 0 (PROPOSAL default 0.1; the paper does not give it).

  Returns:
    `[...]` float32 utilities.

  Examples:
    >>> round(float(utility(1.0, 2048, budget=8192, cost_weight=0.4)), 6)
    0.9
  """
  for name, value, ok in (("budget", budget, lambda v: v > 0),
                          ("cost_weight", cost_weight, lambda v: v >= 0)):
    if not isinstance(value, jax.core.Tracer) and not np.all(ok(np.asarray(value))):
      raise ValueError(f"{name} must be {'> 0' if name == 'budget' else '>= 0'}, got {value!r}")
  gain = jnp.asarray(gain, jnp.float32)
  tokens = jnp.asarray(tokens, jnp.float32)
  return gain - jnp.asarray(cost_weight, jnp.float32) * tokens / jnp.asarray(budget, jnp.float32)


class ShadowToLiveState(NamedTuple):
  """Shadow-to-live switch: who acts, and the controller's record against the heuristic."""

  live: jax.Array  # [] bool: True once the controller acts.
  streak: jax.Array  # [] int32 consecutive decisions where the controller's LCB won.
  decisions: jax.Array  # [] int32 decisions seen.
  # [W] bool ring buffer of the last W counted decisions' outcomes (True: a win); decision c
  # (0-based, among counted ones) is at c mod W. Agreements held by `agree` are not counted.
  recent: jax.Array
  counted: jax.Array  # [] int32 counted decisions.


def shadow_to_live_init(window: int = RAIL_WINDOW, *, live: bool = False) -> ShadowToLiveState:
  """Shadow mode (the heuristic acts), no wins yet; `window` sizes the share rule's buffer.

  `live=True` starts with the controller acting (an ablation without the shadow phase).

  Examples:
    >>> s = shadow_to_live_init()
    >>> bool(s.live), int(s.streak), s.recent.shape
    (False, 0, (50,))
  """
  _check_window(window)
  zero = jnp.zeros((), jnp.int32)
  return ShadowToLiveState(jnp.asarray(live, bool), zero, zero, jnp.zeros((window,), bool), zero)


def _check_window(window):
  if not isinstance(window, (int, np.integer)) or isinstance(window, bool) or window < 1:
    raise ValueError(f"window must be a positive int, got {window!r}")


def win_share(state: ShadowToLiveState) -> jax.Array:
  """`[]` float32: the controller's share of wins among the last W counted decisions (fewer
  while fewer than W were counted; 0 before any).

  Examples:
    >>> s = shadow_to_live_init(4)
    >>> for lcb in (1.0, 0.0, 1.0):
    ...   s = shadow_to_live_update(s, lcb, 0.5, window=4)
    >>> round(float(win_share(s)), 4)
    0.6667
  """
  seen = jnp.minimum(state.counted, state.recent.shape[0])
  return jnp.where(seen > 0, state.recent.sum() / jnp.maximum(seen, 1), 0.0).astype(jnp.float32)


@functools.partial(jax.jit, static_argnames=("window", "rule"))
def _shadow_to_live_update(state, controller_lcb, heuristic_utility, agree, window, rule,
                           min_share):
  win = controller_lcb > heuristic_utility
  streak = jnp.where(win, state.streak + 1, 0).astype(jnp.int32)
  streak = jnp.where(agree, state.streak, streak)
  slot = state.counted % state.recent.shape[0]
  recent = jnp.where(agree, state.recent, state.recent.at[slot].set(win))
  counted = state.counted + (~agree).astype(jnp.int32)
  new = ShadowToLiveState(state.live, streak, state.decisions + 1, recent, counted)
  if rule == "streak":
    fires = streak >= window
  else:  # A full window of counted decisions, and enough of them won.
    fires = (counted >= window) & (win_share(new) >= min_share)
  # Going live is one-way: afterwards the controller keeps learning online and acting.
  return new._replace(live=state.live | fires)


def shadow_to_live_update(
    state: ShadowToLiveState,
    controller_lcb: ArrayLike,
    heuristic_utility: ArrayLike,
    *,
    window: int = RAIL_WINDOW,
    agree: ArrayLike = False,
    rule: str = "streak",
    min_share: float = RAIL_MIN_SHARE,
) -> ShadowToLiveState:
  """Scores one decision of the controller against the heuristic and goes live when the rule
  says so. With win_t = LCB_controller > û_heuristic:

    "streak": streak ← agree ? streak : (win_t ? streak + 1 : 0);  live ← live ∨ (streak ≥ W)
    "share":  live ← live ∨ (n ≥ W ∧ (1/W)·Σ_{last W counted t} win_t ≥ s)

  where n counts the decisions not held by `agree`. A win means the controller's pessimistic
  predicted utility (e.g. `ArmScores.lcb` of its chosen arm) exceeds the heuristic's
  (predicted or realised) utility on the same decision. The switch is one-way.

  "streak" is the spec's reading of the paper (W = 50 wins in a row). Since W wins in a row
  at a per-decision win rate q has probability q^W (≈ 0 for q < 0.9 at W = 50), "share" is
  this project's PROPOSAL: go live once the controller wins a share ≥ s (default 0.5, a
  majority) of the last W decisions.

  `agree` marks a decision where the controller picked the heuristic's arm. Its comparison
  would be the arm's LCB against the same arm's mean, which the LCB can never exceed (α > 0),
  so counting it as a loss resets the streak every time the two agree — and the bandit agrees
  with the heuristic on most groups (on every mixed group both say "none"). Such a decision
  leaves the streak and the share's buffer as they are (PROPOSAL; the caller may pass False to
  count it as a loss).

  Args:
    state: the switch state (`shadow_to_live_init(window)` for the "share" rule).
    controller_lcb: `[]` the controller's lower confidence bound on this decision.
    heuristic_utility: `[]` the heuristic's utility on this decision.
    window: W ≥ 1 (PROPOSAL: 50; static): wins in a row ("streak"), or the decisions whose
      share counts ("share", where it must equal the state's buffer length).
    agree: `[]` bool, the controller's arm is the heuristic's: the record is held.
    rule: "streak" or "share" (static).
    min_share: s in (0, 1], the "share" rule's threshold (PROPOSAL: 0.5).

  Returns:
    The updated `ShadowToLiveState`.

  Examples:
    >>> s = shadow_to_live_init()
    >>> for _ in range(3):
    ...   s = shadow_to_live_update(s, 1.0, 0.5, window=3)
    >>> bool(s.live), int(s.streak)
    (True, 3)
    >>> s = shadow_to_live_init(4)
    >>> for lcb in (1.0, 0.0, 1.0, 0.0):  # 2 wins of the last 4 (never 2 in a row)
    ...   s = shadow_to_live_update(s, lcb, 0.5, window=4, rule="share", min_share=0.5)
    >>> bool(s.live), int(s.streak)
    (True, 0)

  References:
    RAIL: Optimizing What Policies Learn From: Recoverability-aware Rollout Intervention
    Learning, arXiv 2608.05080.
  """
  _check_window(window)
  if rule not in SWITCH_RULES:
    raise ValueError(f"rule={rule!r}; valid: {', '.join(SWITCH_RULES)}")
  if rule == "share" and window != state.recent.shape[0]:
    raise ValueError(f"window={window} but the state's buffer holds {state.recent.shape[0]} "
                     f"decisions: build it with shadow_to_live_init(window={window})")
  if not 0.0 < min_share <= 1.0:
    raise ValueError(f"min_share must be in (0, 1], got {min_share!r}")
  for name, value in (("controller_lcb", controller_lcb),
                      ("heuristic_utility", heuristic_utility)):
    if jnp.ndim(value) != 0:
      raise ValueError(f"{name} must be a scalar, got shape {jnp.shape(value)}")
  return _shadow_to_live_update(state, jnp.asarray(controller_lcb, jnp.float32),
                                jnp.asarray(heuristic_utility, jnp.float32),
                                jnp.asarray(agree, bool), int(window), rule,
                                jnp.asarray(min_share, jnp.float32))


# Who picked the arm (`ArmChoice.source`).
SOURCE_HEURISTIC = 0
SOURCE_RANDOM = 1
SOURCE_CONTROLLER = 2


class ArmChoice(NamedTuple):
  """The executed arm and who chose it."""

  arm: jax.Array  # [] int32 arm index.
  source: jax.Array  # [] int32 SOURCE_HEURISTIC, SOURCE_RANDOM or SOURCE_CONTROLLER.


@functools.partial(jax.jit, static_argnames="num_arms")
def _choose_arm(state, rng, controller_arm, heuristic_arm, num_arms, epsilon):
  explore_key, arm_key = jax.random.split(rng)
  explore = jax.random.uniform(explore_key) < epsilon
  random_arm = jax.random.randint(arm_key, (), 0, num_arms, jnp.int32)
  shadow_arm = jnp.where(explore, random_arm, heuristic_arm)
  shadow_source = jnp.where(explore, SOURCE_RANDOM, SOURCE_HEURISTIC)
  arm = jnp.where(state.live, controller_arm, shadow_arm).astype(jnp.int32)
  source = jnp.where(state.live, SOURCE_CONTROLLER, shadow_source).astype(jnp.int32)
  return ArmChoice(arm, source)


def choose_arm(
    state: ShadowToLiveState,
    rng: jax.Array,
    *,
    controller_arm: ArrayLike,
    heuristic_arm: ArrayLike,
    num_arms: int,
    epsilon: ArrayLike = RAIL_EPSILON,
) -> ArmChoice:
  """The arm to execute: the controller's when live; in shadow the heuristic's, or with
  probability ε a uniformly random arm (coverage for the controller's training data).

  Args:
    state: the shadow-to-live switch.
    rng: a PRNG key (used in shadow mode).
    controller_arm: `[]` the bandit's pick (`bandits.linucb_select` / `lints_select`).
    heuristic_arm: `[]` the default heuristic's pick.
    num_arms: number of arms ≥ 1 (static).
    epsilon: exploration fraction ε in [0, 1] in shadow mode (PROPOSAL: 0.1).

  Returns:
    `ArmChoice(arm, source)`.

  Examples:
    >>> import jax
    >>> c = choose_arm(shadow_to_live_init(), jax.random.key(0), controller_arm=3,
    ...                heuristic_arm=1, num_arms=28, epsilon=0.0)
    >>> int(c.arm), int(c.source)
    (1, 0)

  References:
    RAIL: Optimizing What Policies Learn From: Recoverability-aware Rollout Intervention
    Learning, arXiv 2608.05080.
  """
  if not isinstance(num_arms, (int, np.integer)) or isinstance(num_arms, bool) or num_arms < 1:
    raise ValueError(f"num_arms must be a positive int (the arm list is empty?), got "
                     f"{num_arms!r}")
  if not isinstance(epsilon, jax.core.Tracer) and not 0.0 <= float(epsilon) <= 1.0:
    raise ValueError(f"epsilon must be in [0, 1], got {epsilon!r}")
  for name, value in (("controller_arm", controller_arm), ("heuristic_arm", heuristic_arm)):
    if jnp.ndim(value) != 0:
      raise ValueError(f"{name} must be a scalar arm index, got shape {jnp.shape(value)}")
    if not isinstance(value, jax.core.Tracer) and not 0 <= int(value) < num_arms:
      raise ValueError(f"{name}={int(value)} is outside [0, {num_arms})")
  return _choose_arm(state, rng, jnp.asarray(controller_arm, jnp.int32),
                     jnp.asarray(heuristic_arm, jnp.int32), int(num_arms),
                     jnp.asarray(epsilon, jnp.float32))
