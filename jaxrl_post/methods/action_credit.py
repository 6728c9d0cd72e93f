r"""FACTOR on the multi-turn agent: TD action credit from restored checkpoints, hindsight tokens.

FACTOR (arXiv 2608.07118) splits a rollout's GRPO credit A_i in two. TAC decides *how much*
each action t gets: A*_t = r_t + Ṽ_{t+1} − Ṽ_t with Ṽ_0 = b_i (the group-mean return) and
Ṽ_{T_i} = 0, so Σ_t A*_t = G_i − b_i (`advantages.factor.factor_td_credit`). HTA and APM decide
*where* inside the action it goes: the same model shown the observation that followed the action
(hindsight) scores the realised tokens, Δ_{t,j} = log π_teacher − log π_θ, and
C_{t,j} = L_t ρ_{t,j} A*_t with ρ = (1 − η)/L_t + η softmax_j(sgn(A*_t) clip(Δ, −d, d)/τ)
keeps each action's token mean at A*_t (`losses.factor.factor_token_coef`). The loss reduces
per action first (`losses.factor.factor_loss`).

Here it is the `factor` mode of experiments/rtpo.py, a batch hook of turn-level GRPO
(`methods.rtpo.grpo_step`, like `methods.ocsd.Calibrator`), and each piece maps onto the host:

  actions       one action = one turn, whose row `c_k | a_k` holds exactly its tokens.
  TAC values    the paper fits a light value head V_φ on Monte-Carlo returns of frozen-policy
                continuations from a few checkpoints. We have no value head (PROPOSAL): the
                checkpoints' values ARE the Monte-Carlo means, and Ṽ between them is linear.
                Checkpoints: `checkpoints` turn snapshots S_t per rollout, evenly spaced over
                0 < t < T_i (the RTPO machinery: `Backend.rollout` from `turn.snapshot`), each
                continued `continuations` times with the rollout parameters (paper "2×4").
                Ṽ is interpolated through (0, b_i), (t_c, V̂_c), (T_i, G_i) and evaluated at
                0 < t < T_i: the cumulative value Ṽ_t + Σ_{u<t} r_u, which runs from b_i to G_i
                (rewards are terminal here, so that sum is 0 before the last action); with no
                checkpoint this is `advantages.factor.interpolated_values`, uniform credit.
                With `standardize` (PROPOSAL, default True) every A* is divided by the group's
                population std, so the credits sum to the (population-std) GRPO advantage; a
                group whose returns are all equal then gets no credit, as in GRPO, and needs
                no continuations. Without it such a group's residuals only sum to 0, and its
                rollouts are continued like the others.
  HTA           the teacher view is OCSD's Full replay view (`methods.ocsd.replay_turns`): the
                row's context, the hindsight line `[hindsight: <observation>]`, then the action;
                both views are scored with the rollout parameters (stop-gradient).
  loss          the host's "grpo" clipped surrogate with `loss_agg_mode="seq-mean-token-mean"`
                on per-token advantages C `[rows, La]`: each row (action) is a sequence, so this
                is `factor_loss` exactly (−(1/Σ T_i) Σ_actions (1/L_t) Σ_j min(qC, clip(q)C));
                `check_factor_protocol` checks that setting.
  η             `losses.factor.factor_eta`: linear 0.7 → 0.3 over `eta_steps` (PROPOSAL),
                or over the generated-token budget when the run has one (see `at_step`).

The continuations' generated tokens join the step's budget count (`factor/continuation_tokens`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_post.advantages.factor import factor_td_credit, group_return_stats
from jaxrl_post.envs import EnvState
from jaxrl_post.losses.factor import (
  ETA_END,
  ETA_START,
  action_mean_multiplier,
  factor_eta,
  factor_token_coef,
)
from jaxrl_post.methods.ocsd import (
  DEFAULT_TEMPLATE,
  DEFAULT_TERMINAL,
  OCSDConfig,
  replay_turns,
  step_layout,
)
from jaxrl_post.sampling.multiturn import SampledTrajectory, SampledTurn, TurnBatch
from jaxrl_post.tokenizers import Tokenizer

FACTOR = "factor"
FACTOR_LOSS_AGG = "seq-mean-token-mean"


@dataclasses.dataclass(frozen=True, kw_only=True)
class FactorConfig:
  """FACTOR's knobs (`config.factor.*`), validated.

  Attributes:
    checkpoints: restored checkpoints per rollout for TAC (paper "2×4": 2).
    continuations: Monte-Carlo continuations per checkpoint (paper: 4).
    tac: TD action credit (False: the uniform (G_i − b_i)/T_i of `interpolated_values`, the
      "no TAC" ablation).
    hta: hindsight token allocation (False: C = A* on every token, the "no HTA" ablation).
    eta_start, eta_end: the η anneal (paper 0.7; the end 0.3 is a PROPOSAL).
    eta_steps: the anneal's length in steps (0: `config.steps`). configs/factor.py fixes it when
      the config is built, so a run resumed with a larger `--config.steps` keeps its schedule.
      Unused when the run has a generated-token budget: a budgeted run stops at its budget,
      not at `config.steps`, so η then anneals over the fraction of the budget spent.
    tau, d: softmax temperature and gap clip of HTA (paper: 1 and 3).
    standardize: divide A* by the group's population std (PROPOSAL, True).
    eps: ε of that division.
    template: the hindsight line, `{observation}` once (PROPOSAL: OCSD's short form).
    terminal: the feedback after a final answer (empty reply), a format string of `reward`.
  """

  checkpoints: int = 2
  continuations: int = 4
  tac: bool = True
  hta: bool = True
  eta_start: float = ETA_START
  eta_end: float = ETA_END
  eta_steps: int = 0
  tau: float = 1.0
  d: float = 3.0
  standardize: bool = True
  eps: float = 1e-6
  template: str = DEFAULT_TEMPLATE
  terminal: str = DEFAULT_TERMINAL

  def __post_init__(self):
    for key in ("checkpoints", "continuations"):
      value = getattr(self, key)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"config.factor.{key}={value!r} must be an int >= 1")
    if isinstance(self.eta_steps, bool) or not isinstance(self.eta_steps, int) or (
        self.eta_steps < 0):
      raise ValueError(f"config.factor.eta_steps={self.eta_steps!r} must be an int >= 0")
    for key in ("eta_start", "eta_end"):
      if not 0.0 <= getattr(self, key) <= 1.0:
        raise ValueError(f"config.factor.{key}={getattr(self, key)!r} must be in [0, 1]")
    for key in ("tau", "d"):
      if not getattr(self, key) > 0:
        raise ValueError(f"config.factor.{key}={getattr(self, key)!r} must be > 0")
    if not self.eps >= 0:
      raise ValueError(f"config.factor.eps={self.eps!r} must be >= 0")
    try:
      self.hindsight
    except ValueError as e:
      raise ValueError(str(e).replace("config.ocsd.", "config.factor.")) from None

  @property
  def hindsight(self) -> OCSDConfig:
    """The replay-view knobs (the teacher's view is OCSD's Full view)."""
    return OCSDConfig(template=self.template, terminal=self.terminal)

  @classmethod
  def from_config(cls, config: Mapping[str, Any] | None) -> FactorConfig:
    """From `config.factor` (None: the defaults); an unknown key raises naming it."""
    config = dict(config or {})
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(config) - known)
    if unknown:
      raise ValueError(f"unknown config.factor keys {unknown}; valid: {', '.join(sorted(known))}")
    return cls(**config)


def check_factor_protocol(loss: Mapping[str, Any]) -> None:
  """Raises unless the host's loss is `factor_loss` on turn rows: the "grpo" clipped surrogate
  with the per-action (per-row) mean, `loss_agg_mode="seq-mean-token-mean"`."""
  if loss.get("name") != "grpo" or loss.get("objective", "clip") != "clip":
    raise ValueError(f"config.loss.name={loss.get('name')!r}: FACTOR's loss is the clipped "
                     "surrogate (name='grpo', the clip objective)")
  if loss.get("loss_agg_mode") != FACTOR_LOSS_AGG:
    raise ValueError(f"config.loss.loss_agg_mode={loss.get('loss_agg_mode')!r}: FACTOR reduces "
                     f"per action first; set it to {FACTOR_LOSS_AGG!r}")


def checkpoint_turns(num_turns: int, checkpoints: int) -> list[int]:
  """Evenly spaced interior turns 0 < t < T (at most `checkpoints`, distinct, increasing).

  Examples:
    >>> [checkpoint_turns(t, c) for t, c in ((6, 2), (3, 2), (2, 4), (1, 2))]
    [[2, 4], [1, 2], [1], []]
  """
  picks = {int(round((c + 1) * num_turns / (checkpoints + 1))) for c in range(checkpoints)}
  return sorted(t for t in picks if 0 < t < num_turns)


def checkpoint_values(baseline: float, final: float, num_turns: int, turns: Sequence[int],
                      values: Sequence[float], num_steps: int) -> np.ndarray:
  """Ṽ_t for t < `num_steps`: linear through (0, b), (t_c, V̂_c), (T, G); 0 from T on.

  Examples:
    >>> checkpoint_values(0.5, 1.0, 4, [2], [0.0], 6).tolist()
    [0.5, 0.25, 0.0, 0.5, 0.0, 0.0]
  """
  xs = [0, *turns, num_turns]
  ys = [baseline, *values, final]
  out = np.zeros(num_steps, np.float32)
  out[:num_turns] = np.interp(np.arange(num_turns), xs, ys)
  return out


class RolloutBackend(Protocol):
  """What `ActionCredit` needs of the model side (`methods.rtpo.Learner` has it)."""

  def rollout(self, params: Any, starts: Sequence[EnvState], rng: jax.Array, *,
              greedy: bool = False) -> list[SampledTrajectory]: ...

  def turn_batch(self, turns: Sequence[SampledTurn], adv, weight=None) -> TurnBatch: ...

  def score(self, params: Any, batch: TurnBatch) -> np.ndarray: ...


@dataclasses.dataclass(frozen=True, kw_only=True)
class ActionCredit:
  """FACTOR's batch hook of turn GRPO: TAC credit per turn row, HTA/APM coefficients per token.

  Returns the batch with `adv` `[rows, La]` = C. Use `at_step(step, progress)` for the step's η
  and continuation key. Metrics: `factor/eta`, `factor/continuations` (episodes played),
  `factor/continuation_tokens`, `factor/astar_abs_mean`, `factor/astar_sum_gap` (max over
  rollouts of |Σ_t A*_t − A_i|, 0 by construction), `factor/multiplier_dev` (max |action-mean
  multiplier − 1|), `factor/sign_agree` (share of tokens whose C has its action's sign),
  `factor/delta_mean` (mean Δ over action tokens).

  Attributes:
    backend: rollouts from snapshots and scoring (the learner).
    tokenizer: encodes the hindsight line.
    max_context_len: the replay contexts' bound.
    group_size: G, consecutive episodes of one prompt.
    total_steps: the η anneal's length (`config.steps`).
    config: `FactorConfig`.
    seed, step: the continuations' key and η come from them.
    progress: the fraction of the run's generated-token budget spent before this step, in
      [0, 1], or None for a run without a budget; when set, η anneals over it instead of
      `step / total_steps`.
  """

  backend: RolloutBackend
  tokenizer: Tokenizer
  max_context_len: int
  group_size: int
  total_steps: int
  config: FactorConfig = FactorConfig()
  seed: int = 0
  step: int = 0
  progress: float | None = None
  # TAC changes which rows are zero: the host's zero-advantage skip looks at ours.
  replaces_advantages = True

  def __post_init__(self):
    if self.group_size < 2:
      raise ValueError(f"group_size must be >= 2, got {self.group_size}")
    if self.total_steps < 1:
      raise ValueError(f"total_steps must be >= 1, got {self.total_steps}")

  def at_step(self, step: int, progress: float | None = None) -> ActionCredit:
    """The hook of `step`; `progress`: the budget fraction spent before it (None: no budget)."""
    if progress is not None and not 0.0 <= progress <= 1.0 + 1e-9:
      raise ValueError(f"progress={progress!r} must be in [0, 1] (the budget fraction spent)")
    return dataclasses.replace(self, step=int(step),
                               progress=None if progress is None else min(float(progress), 1.0))

  def eta(self) -> float:
    """η of this step: the linear anneal over steps, or over the budget fraction spent."""
    if not self.config.hta:
      return 0.0
    if self.progress is None:
      at, total = self.step, self.total_steps
    else:
      at, total = self.progress, 1
    return float(factor_eta(at, total_steps=total, eta_start=self.config.eta_start,
                            eta_end=self.config.eta_end))

  def values(self, params, trajectories: Sequence[SampledTrajectory], baseline: np.ndarray,
             live: np.ndarray, num_steps: int) -> tuple[np.ndarray, dict[str, float]]:
    """Ṽ `[E, num_steps]` from Monte-Carlo continuations at the checkpoints of `live` rollouts."""
    e = len(trajectories)
    returns = np.asarray([t.reward for t in trajectories], np.float32)
    picks = [checkpoint_turns(len(t.turns), self.config.checkpoints) if live[i] and
             self.config.tac else [] for i, t in enumerate(trajectories)]
    starts = [trajectories[i].turns[t].snapshot for i in range(e) for t in picks[i]
              for _ in range(self.config.continuations)]
    key = jax.random.fold_in(jax.random.key(self.seed + 4), self.step)
    played = []
    # In chunks of the step's own rollout count: shapes the sampler already compiled.
    for c, at in enumerate(range(0, len(starts), max(e, 1))):
      played += self.backend.rollout(params, starts[at:at + e], jax.random.fold_in(key, c))
    mc = np.asarray([p.reward for p in played], np.float32).reshape(-1, self.config.continuations)
    out = np.zeros((e, num_steps), np.float32)
    row = 0
    for i, traj in enumerate(trajectories):
      v = mc[row:row + len(picks[i])].mean(-1) if picks[i] else []
      row += len(picks[i])
      out[i] = checkpoint_values(float(baseline[i]), float(returns[i]), len(traj.turns),
                                 picks[i], list(v), num_steps)
    return out, {"factor/continuations": float(len(played)),
                 "factor/continuation_tokens": float(sum(p.num_generated_tokens
                                                         for p in played))}

  def __call__(self, params: Any, trajectories: Sequence[SampledTrajectory], batch: TurnBatch
               ) -> tuple[TurnBatch, dict[str, float]]:
    e, g = len(trajectories), self.group_size
    if e % g:
      raise ValueError(f"factor: {e} episodes do not form groups of group_size={g}")
    turns = [t for traj in trajectories for t in traj.turns]
    n = len(turns)
    if batch.num_rows != n or not np.array_equal(batch.turn[:n], [t.index for t in turns]):
      raise ValueError(f"factor needs the turn rows of `trajectories` in order (turn GRPO's "
                       f"batch); got {batch.num_rows} rows for {n} turns")
    layout = step_layout(trajectories)
    s = layout.num_steps
    returns = np.asarray([t.reward for t in trajectories], np.float32)
    stats = group_return_stats(jnp.asarray(returns.reshape(-1, g)))
    baseline = np.asarray(stats.baseline).reshape(e)
    std = np.asarray(stats.std).reshape(e)
    live = std > 0 if self.config.standardize else np.ones(e, bool)
    values, metrics = self.values(params, trajectories, baseline, live, s)
    lengths = np.asarray([len(t.turns) for t in trajectories])
    action_mask = np.arange(s) < lengths[:, None]
    step_rewards = np.zeros((e, s), np.float32)
    step_rewards[layout.episode, layout.step] = [t.turn.reward for t in turns]
    a_star = np.asarray(factor_td_credit(
      step_rewards, values, baseline, action_mask,
      std=std if self.config.standardize else None, eps=self.config.eps))
    row_star = a_star[layout.episode, layout.step]  # [N]
    mask = np.asarray(batch.loss_mask[:n], bool)
    eta = self.eta()
    delta = np.zeros(mask.shape, np.float32)
    if self.config.hta and n:
      full, _ = replay_turns(turns, tokenizer=self.tokenizer, config=self.config.hindsight,
                             max_len=self.max_context_len)
      zeros = np.zeros(n, np.float32)
      teacher = np.asarray(self.backend.score(params, self.backend.turn_batch(full, zeros)))
      student = np.asarray(self.backend.score(params, self.backend.turn_batch(turns, zeros)))
      delta = np.where(mask, teacher[:n] - student[:n], 0.0).astype(np.float32)
    coef = factor_token_coef(row_star[:, None], delta[:, None], mask[:, None], eta=eta,
                             tau=self.config.tau, d=self.config.d)
    adv = np.zeros(batch.loss_mask.shape, np.float32)
    adv[:n] = np.asarray(coef)[:, 0]
    expected = (returns - baseline) / ((std + self.config.eps) if self.config.standardize else 1)
    expected = np.where(std > 0, expected, 0.0) if self.config.standardize else expected
    dev = np.asarray(action_mean_multiplier(coef, mask[:, None], row_star[:, None]))
    signed = mask & (row_star[:, None] != 0)
    metrics.update({
      "factor/eta": float(eta),
      "factor/astar_abs_mean": float(np.abs(row_star).mean()) if n else 0.0,
      "factor/astar_sum_gap": float(np.abs(np.where(action_mask, a_star, 0).sum(-1)
                                           - expected).max(initial=0.0)),
      "factor/multiplier_dev": float(np.nanmax(np.abs(dev), initial=0.0)),
      "factor/sign_agree": float((np.sign(adv[:n]) == np.sign(row_star)[:, None])[signed].mean())
      if signed.any() else 1.0,
      "factor/delta_mean": float(delta[mask].mean()) if mask.any() else 0.0,
    })
    return batch._replace(adv=adv), metrics


__all__ = [
  "FACTOR",
  "FACTOR_LOSS_AGG",
  "ActionCredit",
  "FactorConfig",
  "RolloutBackend",
  "check_factor_protocol",
  "checkpoint_turns",
  "checkpoint_values",
]
