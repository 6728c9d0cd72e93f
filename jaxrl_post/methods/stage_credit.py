r"""Credit hooks of turn GRPO: Temporal GRPO, Stage-Reward GRPO and CANOPY on the multi-turn agent.

The three are modes of experiments/rtpo.py hosted, like OCSD, by turn-level GRPO
(`methods.rtpo.grpo_step` with `method="turn_grpo"`): G episodes per start state, one row
`c_k | a_k` per turn with the context recorded at rollout, one PPO phase. Each is a batch hook
`(params, trajectories, batch) -> (batch, metrics)` that rewrites the turn rows' advantages
(rows in episode-major order, G consecutive episodes per prompt) before that phase; rollout,
batches, scoring, evaluation, budget and resume are the host's code.

temporal_grpo   Temporal GRPO (arXiv 2608.13026). Trajectory GRPO gives every turn of an episode
                its return's advantage, so a correct early hop of an episode that fails later is
                punished (credit aliasing). Here each episode's stage completion turns T_{i,k}
                come from the env's stage detector (`envs.Env.stage_times`), and the row of turn
                t gets the stage-aligned advantage of `advantages.temporal_grpo_advantages`:

                  V_{i,k} = 1 if k = 1 or m_{k−1} completed;  R_{i,k} = 1 if m_k completed
                  Â_{i,k} = (R_{i,k} − μ_k)/(σ_k + ε)   over the group's participants of stage k
                  Â_{i,t} = Σ_k 1[t ∈ B_{i,k}] Â_{i,k},  B_{i,k} = (T_{i,k−1}, T_{i,k}] (completed)
                                                                 or (T_{i,k−1}, T_i] (first failed)

                The paper's detector is a relation detector on privileged simulator state; the
                stand-in here is the environment itself reporting, from its privileged episode
                state (the hidden store, the gold intermediate values), the turn at which each
                stage was completed: for kv_lookup hop k resolved (`get(key_k)` returned the next
                link), for calculator step k computed (a `calc` call returned v_k), and the final
                stage = the correct answer, so K = horizon + 1 stages.
stage_reward    The paper's Stage-Reward GRPO baseline: reward = the fraction of the K stages
                completed (chain completion), then plain trajectory-level GRPO on it (the host's
                advantage estimator, every turn of the episode the same advantage). PROPOSAL
                definition: the paper names the baseline without its formula.
canopy          CANOPY (arXiv 2609.01245): the GRPO advantage with the population std over each
                group's valid rollouts (`losses.canopy_advantages`), after fault quarantine. The
                loss is the host's: a pooled token-mean over action tokens, k3 KL to the frozen
                starting policy on action tokens, one update per rollout batch (ratio 1, the clip
                inert); `check_canopy_protocol` checks that layout, `check_canopy_group_size`
                the signal-coverage rule on a pilot's success rate.

Why the host's loss is CANOPY's objective (checked against `losses.canopy_loss` in
tests/methods/test_stage_credit.py): turn rows hold exactly the action tokens (contexts and
observations are never in `loss_mask`), so the token-mean over all rows is the pooled
Σ m A log π / Σ m of the flattened episodes; with ppo_epochs = ppo_mini_batches = 1 the old
log-probs are the trainer's own, the ratio is 1 and the clipped surrogate's gradient is
−Σ m A ∇log π / Σ m; `policy_loss`'s KL term β · agg(k3(logp, ref_logp)) is the same pooled mean.
The only difference is the advantage: the host's GRPO uses the Bessel-corrected std, CANOPY's
(PROPOSAL) the population std over the surviving rollouts, so the hook replaces it.

Fault quarantine. Our envs have no infrastructure faults (no serving workers to lose); what
stands in: a rollout is faulted when one of its turns hit an error of a configured class
(`fault_errors`, default the tool time-out: the one env outcome that depends on the machine, not
on the agent), or when the caller passes it in the `quarantine` mask (tests inject faults that
way). Faulted rollouts leave their group's statistics and the batch (their rows are dropped, so
they leave the loss and its normaliser); agent-caused endings (turn limit, wrong answer) stay
with reward 0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from absl import logging

from jaxrl_post.advantages.temporal_grpo import check_stage_times, temporal_grpo_stages
from jaxrl_post.envs import Env
from jaxrl_post.envs.tools import ERROR_KINDS, ERROR_TIMEOUT
from jaxrl_post.losses import rtpo as rtpo_losses
from jaxrl_post.losses.canopy import canopy_advantages, group_coverage
from jaxrl_post.methods.ocsd import step_layout
from jaxrl_post.sampling.multiturn import SampledTrajectory, TurnBatch
from jaxrl_post.tasks.priors import CANOPY_TARGET, check_group_size, min_group_size

TEMPORAL_GRPO = "temporal_grpo"
STAGE_REWARD = "stage_reward"
STAGE_MODES = (TEMPORAL_GRPO, STAGE_REWARD)
CANOPY = "canopy"
DEFAULT_FAULT_ERRORS = (ERROR_TIMEOUT,)


def _check_rows(trajectories: Sequence[SampledTrajectory], batch: TurnBatch, group_size: int,
                who: str) -> list:
  """The batch's turns; raises unless it is turn GRPO's batch of `trajectories` in groups."""
  if group_size < 1 or len(trajectories) % group_size:
    raise ValueError(f"{who}: {len(trajectories)} episodes do not form groups of group_size="
                     f"{group_size}")
  turns = [t for traj in trajectories for t in traj.turns]
  n = len(turns)
  if batch.num_rows != n or not np.array_equal(batch.turn[:n], [t.index for t in turns]):
    raise ValueError(f"{who} needs the turn rows of `trajectories` in order (turn GRPO's "
                     f"batch); got {batch.num_rows} rows for {n} turns")
  return turns


def episode_stage_times(env: Env, trajectories: Sequence[SampledTrajectory]
                        ) -> tuple[np.ndarray, np.ndarray]:
  """Stage completion turns and lengths of episodes, from the env's detector.

  Args:
    env: the env that played them (`Env.stage_times`; envs without stages raise, naming it).
    trajectories: E episodes.

  Returns:
    `(stage_done int32 [E, K], rollout_len int32 [E])`: T_{i,k} as a 1-based turn (−1: not
    completed) and T_i, the episode's number of turns. Checked with `check_stage_times`.
  """
  done = np.asarray([env.stage_times(t) for t in trajectories], np.int32)
  done = done.reshape(len(trajectories), env.num_stages())
  length = np.asarray([t.final_state.turn for t in trajectories], np.int32)
  check_stage_times(done[None], length[None])
  return done, length


def stage_fraction(stage_done: np.ndarray) -> np.ndarray:
  """Stage-Reward GRPO's reward (PROPOSAL): the share of the K stages completed along the chain,
  `[..., K] -> [...]` (a stage after an uncompleted one does not count).

  Examples:
    >>> stage_fraction(np.array([[1, 2, -1, -1], [1, -1, 3, -1]])).tolist()
    [0.5, 0.25]
  """
  chain = np.cumprod(np.asarray(stage_done) >= 1, axis=-1)
  return chain.mean(-1).astype(np.float32)


@dataclasses.dataclass(frozen=True, kw_only=True)
class StageCredit:
  """Temporal GRPO's (or Stage-Reward GRPO's) batch hook of turn GRPO.

  Replaces each turn row's advantage: `temporal_grpo` the stage-aligned Â_{i,t} of its turn
  (`temporal_grpo_stages` over the G episodes of its prompt), `stage_reward` the trajectory GRPO
  advantage of the episode's stage fraction. Metrics: `stage/success_k` (k = 1..K, the share of
  the step's episodes that completed stage k; Pr(R_k | V_k) = success_k / success_{k−1}),
  `stage/participation` (mean V_{i,k}), `stage/adv_abs_mean` (mean |A| over the rows).

  Attributes:
    env: the env (its stage detector).
    group_size: G, consecutive episodes of one prompt.
    mode: "temporal_grpo" or "stage_reward".
    eps: ε of σ_k (temporal_grpo) or of the GRPO std (stage_reward).
    advantage: stage_reward's trajectory estimator (`losses.rtpo.advantage_fn`; the host's).
  """

  env: Env
  group_size: int
  mode: str = TEMPORAL_GRPO
  eps: float = 1e-6
  advantage: str = "grpo"
  # The host skips a step whose trajectory advantages are all 0 before calling a hook; stage
  # advantages can be non-zero there (all episodes fail, some complete early stages).
  replaces_advantages = True

  def __post_init__(self):
    if self.mode not in STAGE_MODES:
      raise ValueError(f"mode={self.mode!r}; valid: {', '.join(STAGE_MODES)}")
    if self.group_size < 2:
      raise ValueError(f"group_size must be >= 2, got {self.group_size}")
    if not self.eps >= 0:
      raise ValueError(f"eps must be >= 0, got {self.eps}")
    self.env.stage_detectors(self.env.make_episode("train", 0))  # fails early, naming the env
    rtpo_losses.advantage_fn(self.advantage)

  def __call__(self, params: Any, trajectories: Sequence[SampledTrajectory], batch: TurnBatch
               ) -> tuple[TurnBatch, dict[str, float]]:
    del params
    turns = _check_rows(trajectories, batch, self.group_size, self.mode)
    n, e, g = len(turns), len(trajectories), self.group_size
    done, length = episode_stage_times(self.env, trajectories)
    k = done.shape[1]
    layout = step_layout(trajectories)
    num_steps = max(layout.num_steps, int(length.max(initial=1)))
    out = temporal_grpo_stages(done.reshape(e // g, g, k), length.reshape(e // g, g),
                               num_steps=num_steps, eps=self.eps)
    if self.mode == TEMPORAL_GRPO:
      step_adv = np.asarray(out.step_adv).reshape(e, num_steps)
      # A row's turn index is 0-based: its step t = index + 1 sits at output index `index`.
      row_adv = step_adv[layout.episode, [t.index for t in turns]]
    else:
      reward = stage_fraction(done)
      ids = np.repeat(np.arange(e // g, dtype=np.int32), g)
      episode_adv = np.asarray(rtpo_losses.advantage_fn(self.advantage)(
        jnp.asarray(reward), jnp.asarray(ids), num_groups=e // g, eps=self.eps))
      row_adv = episode_adv[layout.episode]
    adv = np.zeros(batch.adv.shape[0], np.float32)
    adv[:n] = row_adv
    outcome = np.asarray(out.outcome).reshape(e, k)
    metrics = {f"stage/success_{i + 1}": float(outcome[:, i].mean()) for i in range(k)}
    metrics["stage/participation"] = float(np.asarray(out.participation).mean())
    metrics["stage/adv_abs_mean"] = float(np.abs(row_adv).mean()) if n else 0.0
    return batch._replace(adv=adv), metrics


# ---- CANOPY ----


@dataclasses.dataclass(frozen=True, kw_only=True)
class CanopyConfig:
  """CANOPY's knobs (`config.canopy.*`), validated.

  Attributes:
    coverage_target: τ_cov of the group-sizing rule (PROPOSAL default 0.8).
    enforce_group_size: raise (True) or only warn (False) when `config.group_size` is below the
      rule's minimum for the pilot's success rate.
    pilot_episodes: episodes of the pilot (sampled at the training temperature with the
      starting policy, train split) that estimates p̂_min.
    exact_coverage: the exact P_sig rule instead of the paper's first-order floor.
    fault_errors: turn error classes (`envs.tools.ERROR_KINDS`) that quarantine a rollout
      (PROPOSAL: the tool time-out, the machine's fault rather than the agent's).
    std: divide the advantage by the group's population std (PROPOSAL: True).
    eps: ε of that std.
  """

  coverage_target: float = CANOPY_TARGET
  enforce_group_size: bool = True
  pilot_episodes: int = 64
  exact_coverage: bool = False
  fault_errors: tuple[str, ...] = DEFAULT_FAULT_ERRORS
  std: bool = True
  eps: float = 1e-6

  def __post_init__(self):
    if not 0.0 < self.coverage_target < 1.0:
      raise ValueError(f"config.canopy.coverage_target={self.coverage_target!r} must be in "
                       "(0, 1)")
    if self.pilot_episodes < 1:
      raise ValueError(f"config.canopy.pilot_episodes={self.pilot_episodes!r} must be >= 1")
    object.__setattr__(self, "fault_errors", tuple(self.fault_errors))
    unknown = sorted(set(self.fault_errors) - set(ERROR_KINDS))
    if unknown:
      raise ValueError(f"config.canopy.fault_errors has unknown classes {unknown}; valid: "
                       f"{', '.join(ERROR_KINDS)}")
    if not self.eps >= 0:
      raise ValueError(f"config.canopy.eps={self.eps!r} must be >= 0")

  @classmethod
  def from_config(cls, config: Mapping[str, Any]) -> CanopyConfig:
    """From `config.canopy`; an unknown key raises a ValueError naming it."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(config) - known)
    if unknown:
      raise ValueError(f"unknown config.canopy keys {unknown}; valid: {', '.join(sorted(known))}")
    return cls(**dict(config))


def check_canopy_protocol(loss: Mapping[str, Any], *, ppo_epochs: int, ppo_mini_batches: int
                          ) -> None:
  """Raises unless the host's update is CANOPY's: one on-policy update of the GRPO loss.

  CANOPY takes one update per rollout batch (ratio exactly 1) with the clipped GRPO loss, whose
  gradient is then −Σ m A ∇log π / Σ m. β, the KL estimator and the aggregation stay free (the
  paper's "no KL" and "sequence-normalised" ablations); defaults: k3, token-mean.
  """
  if ppo_epochs != 1:
    raise ValueError(f"config.ppo_epochs={ppo_epochs}: CANOPY takes one update per rollout "
                     "batch (ratio exactly 1); set it to 1")
  if ppo_mini_batches != 1:
    raise ValueError(f"config.ppo_mini_batches={ppo_mini_batches}: CANOPY takes one update per "
                     "rollout batch (ratio exactly 1); set it to 1")
  if loss.get("name") != "grpo" or loss.get("objective", "clip") != "clip":
    raise ValueError(f"config.loss.name={loss.get('name')!r}: CANOPY's loss is the GRPO "
                     "surrogate (name='grpo', the clip objective)")


def check_canopy_group_size(group_size: int, pilot_success: float, *,
                            config: CanopyConfig = CanopyConfig()) -> dict[str, float]:
  """CANOPY's group-sizing rule on a pilot's success rate; raises or warns naming group_size.

  n ≥ log(1 − τ_cov)/log(1 − p̂_min) (`tasks.priors.min_group_size`). P_sig(p, n) is symmetric
  in p ↔ 1 − p and the first-order floor only holds for the small one, so p̂_min = min(p̂, 1 − p̂)
  (PROPOSAL). A pilot with no success (or no failure) certifies no group size.

  Args:
    group_size: `config.group_size`.
    pilot_success: p̂, the pilot's success rate in [0, 1].
    config: `coverage_target`, `enforce_group_size`, `exact_coverage`.

  Returns:
    Metrics: `canopy/pilot_success`, `canopy/min_group_size` (−1 when none exists),
    `canopy/pilot_coverage` (P_sig(p̂, group_size)).

  Raises:
    ValueError: naming config.group_size, when the rule fails and `enforce_group_size`.

  Examples:
    >>> check_canopy_group_size(32, 0.05)["canopy/min_group_size"]
    32.0
  """
  p = float(pilot_success)
  if not 0.0 <= p <= 1.0:
    raise ValueError(f"pilot_success={pilot_success!r} must be in [0, 1]")
  p_min = min(p, 1.0 - p)
  coverage = 1.0 - p**group_size - (1.0 - p) ** group_size
  metrics = {"canopy/pilot_success": p, "canopy/pilot_coverage": coverage,
             "canopy/min_group_size": -1.0}
  problem = None
  if p_min <= 0.0:
    problem = (f"config.group_size={group_size}: the pilot's success rate p̂ = {p:g} gives no "
               "signal coverage at any group size (every group would score the same); raise "
               "config.canopy.pilot_episodes, start from a stronger policy or pick easier tasks")
  else:
    n_min = min_group_size(p_min, target=config.coverage_target, exact=config.exact_coverage)
    metrics["canopy/min_group_size"] = float(n_min)
    try:
      check_group_size(group_size, p_min, target=config.coverage_target,
                       exact=config.exact_coverage)
    except ValueError as e:
      problem = f"config.{e} (pilot p̂ = {p:g}, p̂_min = min(p̂, 1 − p̂))"
  if problem is not None:
    if config.enforce_group_size:
      raise ValueError(problem)
    logging.warning("CANOPY group sizing: %s", problem)
  return metrics


def rollout_faults(trajectories: Sequence[SampledTrajectory],
                   fault_errors: Sequence[str] = DEFAULT_FAULT_ERRORS) -> np.ndarray:
  """`bool [E]` rollouts with a turn whose error class is in `fault_errors` (quarantined)."""
  errors = set(fault_errors)
  return np.asarray([any(t.turn.info.get("error") in errors for t in traj.turns)
                     for traj in trajectories], bool)


@dataclasses.dataclass(frozen=True, kw_only=True)
class CanopyCredit:
  """CANOPY's batch hook of turn GRPO: quarantine, then population-std GRPO advantages.

  Rollouts flagged by `rollout_faults` (or by the `quarantine` argument) leave their group:
  `canopy_advantages` over the survivors, and their rows are dropped from the batch (from the
  loss and its token normaliser). Metrics: `canopy/quarantined` (share of the step's episodes),
  `canopy/coverage` (share of groups with mixed outcomes among the survivors, the realised
  P_sig), `canopy/adv_abs_mean`.

  Attributes:
    group_size: G, consecutive episodes of one prompt.
    config: `fault_errors`, `std`, `eps`.
  """

  group_size: int
  config: CanopyConfig = CanopyConfig()
  # Quarantine changes which rows are zero; the host skips on the hook's advantages instead.
  replaces_advantages = True

  def __call__(self, params: Any, trajectories: Sequence[SampledTrajectory], batch: TurnBatch,
               quarantine: np.ndarray | None = None) -> tuple[TurnBatch, dict[str, float]]:
    del params
    _check_rows(trajectories, batch, self.group_size, CANOPY)
    e, g = len(trajectories), self.group_size
    faulted = rollout_faults(trajectories, self.config.fault_errors)
    if quarantine is not None:
      quarantine = np.asarray(quarantine, bool)
      if quarantine.shape != (e,):
        raise ValueError(f"quarantine has shape {quarantine.shape}; expected ({e},), one flag "
                         "per episode")
      faulted |= quarantine
    valid = ~faulted
    rewards = np.asarray([t.reward for t in trajectories], np.float32).reshape(e // g, g)
    adv = np.asarray(canopy_advantages(jnp.asarray(rewards), jnp.asarray(valid.reshape(-1, g)),
                                       std=self.config.std, eps=self.config.eps)).reshape(e)
    layout = step_layout(trajectories)
    keep = np.flatnonzero(valid[layout.episode])
    out = batch.take(keep)._replace(adv=adv[layout.episode[keep]].astype(np.float32))
    metrics = {
      "canopy/quarantined": float(faulted.mean()),
      "canopy/coverage": float(group_coverage(jnp.asarray(rewards),
                                              jnp.asarray(valid.reshape(-1, g)))),
      "canopy/adv_abs_mean": float(np.abs(out.adv).mean()) if len(keep) else 0.0,
    }
    return out, metrics


__all__ = [
  "CANOPY",
  "DEFAULT_FAULT_ERRORS",
  "STAGE_MODES",
  "STAGE_REWARD",
  "TEMPORAL_GRPO",
  "CanopyConfig",
  "CanopyCredit",
  "StageCredit",
  "check_canopy_group_size",
  "check_canopy_protocol",
  "episode_stage_times",
  "rollout_faults",
  "stage_fraction",
]
