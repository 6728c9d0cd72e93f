r"""OCSD: observation-calibrated self-distillation (arXiv 2608.04788) on the multi-turn agent loop.

OCSD is the host GRPO agent loop plus one dual-view re-scoring pass.
After the rollout, each action a_k of every episode is re-scored by the SAME policy in two replay
contexts with identical scaffolding:

  Full      c_k ⊕ prefix ⊕ o_{k+1}      ⊕ suffix ⊕ a_k
  Ablated   c_k ⊕ prefix ⊕ placeholder  ⊕ suffix ⊕ a_k

c_k is the context a_k was sampled from (ψ(S_k), recorded at rollout), o_{k+1} the environment's
reply to a_k, and `prefix {observation} suffix` the hindsight template (`ocsd.template`). Then
`losses.ocsd_advantages` turns each episode's GRPO advantage Â_i into per-token advantages,

  q_{i,k,t} = tanh((log π_F(a_{k,t}) − log π_A(a_{k,t})) / 2)
  Â^OCSD_{i,k,t} = Â_i · (1 + β · sgn(Â_i) · q_{i,k,t})   on the top-ρ steps of episode i
                 = Â_i                                     on its other steps

(the top-ρ steps: highest mean NLL of their tokens under the rollout policy; ρ = 0.2, β = 0.5),
and the host's PPO phase trains on those `[rows, action tokens]` advantages.

Where it sits (why a mode and not a method of its own): OCSD is the `ocsd` mode of
experiments/rtpo.py and experiments/ocsd.py (`methods.rtpo.RTPO`). The host is turn-level GRPO,
`rtpo.grpo_step` with `method="turn_grpo"`, and `Calibrator` is the batch hook it calls on the
turn batch before the PPO phase. Turn rows are `c_k | a_k` with the rollout's own context, so
(1) each replay view is literally the trained row's context plus the hindsight line, (2) the
interaction step of a row's tokens is its turn, and (3) rollout, GRPO advantages, bucketed
batches, scoring, the PPO phase, evaluation, budget and resume are the host's code, unchanged.
The flat view re-reads a history ψ cut from the rollout's contexts, which would mix the context
mismatch RTPO measures into the calibration; it is not offered.

PROPOSAL choices (the paper gives none of them): both views are scored with the rollout
parameters θ_old right after the rollout (stop-gradient); the default template is a
short `[hindsight: {observation}]\n` because the tokenizer here is per-character and contexts
are ~100 tokens (the long form, `[Hindsight] After this action the environment returned:
{observation}. Re-evaluate the action:`, takes 94 characters with the placeholder: it needs
`--config.max_context_len=256`, as `OCSDConfig.check_lengths` says); the observation
is the env's reply stripped of surrounding whitespace; after a final answer, whose reply is empty,
it is the terminal feedback `ocsd.terminal` formatted with the episode's reward ("reward 1");
a context too long for `max_context_len` loses the same number of history tokens in both views
(the start of c_k), so the views differ only in the observation span; the step uncertainty uses
the rollout-time log-probs (θ_old's, recorded by the sampler: no extra pass).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_post import losses
from jaxrl_post.sampling.multiturn import SampledTrajectory, SampledTurn, TurnBatch
from jaxrl_post.tokenizers import Tokenizer

FIELD = "{observation}"  # where the template puts the observation (or the placeholder)
DEFAULT_TEMPLATE = "[hindsight: {observation}]\n"
DEFAULT_PLACEHOLDER = "not provided"
DEFAULT_TERMINAL = "reward {reward:g}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class OCSDConfig:
  r"""OCSD's knobs (`config.ocsd.*`), validated.

  Attributes:
    rho: ρ, the share of each episode's steps that are recalibrated (paper: 0.2).
    beta: β, the modulation strength; the factor 1 + β sgn(Â) q is in [1 − β, 1 + β] (paper: 0.5).
    template: the hindsight line between the history and the action, with `{observation}` once
      (literal text otherwise: no other `{...}` fields).
    placeholder: what the Observation-Ablated view shows instead of the observation.
    terminal: the observation of a step the env answered with nothing (a final answer), a
      `str.format` string of `reward` (the episode's reward).

  Examples:
    >>> config = OCSDConfig()
    >>> config.prefix, config.suffix, config.terminal.format(reward=1.0)
    ('[hindsight: ', ']\n', 'reward 1')
  """

  rho: float = losses.OCSD_RHO
  beta: float = losses.OCSD_BETA
  template: str = DEFAULT_TEMPLATE
  placeholder: str = DEFAULT_PLACEHOLDER
  terminal: str = DEFAULT_TERMINAL

  def __post_init__(self):
    for key in ("rho", "beta"):
      value = getattr(self, key)
      if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ValueError(f"config.ocsd.{key}={value!r} must be a number in [0, 1]")
    for key in ("template", "placeholder", "terminal"):
      if not isinstance(getattr(self, key), str):
        raise ValueError(f"config.ocsd.{key} must be a string, got {getattr(self, key)!r}")
    if self.template.count(FIELD) != 1:
      raise ValueError(f"config.ocsd.template={self.template!r} must contain {FIELD} exactly "
                       "once")
    if not self.placeholder.strip():
      raise ValueError("config.ocsd.placeholder must not be empty (the ablated view needs a "
                       "fixed stand-in for the observation)")
    try:
      self.terminal.format(reward=1.0)
    except (KeyError, IndexError, ValueError) as e:
      raise ValueError(f"config.ocsd.terminal={self.terminal!r} must be a format string of "
                       f"`reward` only: {e!r}") from None

  @classmethod
  def from_config(cls, config: Mapping[str, Any]) -> OCSDConfig:
    """From `config.ocsd`; an unknown key raises a ValueError naming it."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(config) - known)
    if unknown:
      raise ValueError(f"unknown config.ocsd keys {unknown}; valid: {', '.join(sorted(known))}")
    return cls(**dict(config))

  @property
  def prefix(self) -> str:
    return self.template.split(FIELD)[0]

  @property
  def suffix(self) -> str:
    return self.template.split(FIELD)[1]

  def check_lengths(self, tokenizer: Tokenizer, max_context_len: int) -> None:
    """The scaffolding with the placeholder takes at most half the context columns.

    Raises:
      ValueError: naming `config.ocsd.template` when it does not fit.
    """
    used = sum(len(tokenizer.encode(text)) for text in (self.prefix, self.suffix,
                                                        self.placeholder))
    if 2 * used > max_context_len:
      raise ValueError(f"config.ocsd.template and config.ocsd.placeholder take {used} tokens, "
                       f"more than half of config.max_context_len={max_context_len}: the replay "
                       "views would keep (almost) no history")


# ---- the two replay views ----


def observation_text(turn: SampledTurn, terminal: str = DEFAULT_TERMINAL) -> str:
  """What the env returned after this action (o_{k+1}), stripped; after a final answer (an
  empty reply) the terminal feedback `terminal.format(reward=r)` (PROPOSAL)."""
  text = turn.turn.observation.strip()
  return text if text else terminal.format(reward=turn.turn.reward)


class ReplayContexts(NamedTuple):
  """The two replay contexts of one action (the action's own ids follow each).

  Attributes:
    full: `int32 [n_F]` history ⊕ prefix ⊕ o_{k+1} ⊕ suffix.
    ablated: `int32 [n_A]` history ⊕ prefix ⊕ placeholder ⊕ suffix (the same history).
    observation: `(start, stop)` of the observation's ids in `full`.
    placeholder: `(start, stop)` of the placeholder's ids in `ablated`; both spans start at the
      same index, and `full[:start] == ablated[:start]`, `full[stop_F:] == ablated[stop_A:]`.
    cut: history tokens dropped so that the longer view fits `max_len`.
  """

  full: np.ndarray
  ablated: np.ndarray
  observation: tuple[int, int]
  placeholder: tuple[int, int]
  cut: int


def replay_contexts(turn: SampledTurn, *, tokenizer: Tokenizer, config: OCSDConfig,
                    max_len: int) -> ReplayContexts:
  """Full and Observation-Ablated contexts of `turn`'s action, each at most `max_len` ids.

  The history is the turn's recorded context ids c_k (what the rollout conditioned on). Each
  piece is encoded on its own, so the observation span is exact for any tokenizer. When a view
  is longer than `max_len`, both drop the same oldest history ids (the longer view's excess); an
  observation that alone does not fit keeps its first ids.
  """
  encode = lambda text: list(tokenizer.encode(text))  # noqa: E731
  prefix, suffix = encode(config.prefix), encode(config.suffix)
  room = max(max_len - len(prefix) - len(suffix), 0)
  obs = encode(observation_text(turn, config.terminal))[:room]
  placeholder = encode(config.placeholder)[:room]
  history = list(np.asarray(turn.context_ids).tolist())
  keep = max(max_len - len(prefix) - len(suffix) - max(len(obs), len(placeholder)), 0)
  cut = max(len(history) - keep, 0)
  history = history[cut:]
  start = len(history) + len(prefix)
  full = np.asarray(history + prefix + obs + suffix, np.int32)
  ablated = np.asarray(history + prefix + placeholder + suffix, np.int32)
  return ReplayContexts(full, ablated, (start, start + len(obs)),
                        (start, start + len(placeholder)), cut)


def replay_turns(turns: Sequence[SampledTurn], *, tokenizer: Tokenizer, config: OCSDConfig,
                 max_len: int) -> tuple[list[SampledTurn], list[SampledTurn]]:
  """`(full, ablated)`: each turn with its context replaced by its Full / Ablated replay view.

  Everything else (action ids, rollout log-probs, turn index) is the turn's own, so a batch of
  them (`Backend.turn_batch`) scores the very same action tokens at the same columns.
  """
  full, ablated = [], []
  for turn in turns:
    views = replay_contexts(turn, tokenizer=tokenizer, config=config, max_len=max_len)
    cut = turn.context_cut or views.cut > 0
    full.append(dataclasses.replace(turn, context_ids=views.full, context_cut=cut))
    ablated.append(dataclasses.replace(turn, context_ids=views.ablated, context_cut=cut))
  return full, ablated


# ---- advantages of the training rows ----


class StepLayout(NamedTuple):
  """Where each turn row of a batch sits in the per-episode layout `[episodes, K, La]`.

  Attributes:
    episode: `int32 [N]` the row's episode.
    step: `int32 [N]` the row's interaction step k (its position in the episode).
    first_row: `int32 [episodes]` each episode's first row (−1 for an episode with no turns).
    num_steps: K, the largest `max_turns` of the episodes (a static bound: one compiled shape).
  """

  episode: np.ndarray
  step: np.ndarray
  first_row: np.ndarray
  num_steps: int


def step_layout(trajectories: Sequence[SampledTrajectory]) -> StepLayout:
  """The rows `[t for traj in trajectories for t in traj.turns]` in episode-major order."""
  episode, step, first, row = [], [], [], 0
  for i, traj in enumerate(trajectories):
    first.append(row if traj.turns else -1)
    episode += [i] * len(traj.turns)
    step += list(range(len(traj.turns)))
    row += len(traj.turns)
  num_steps = max([traj.final_state.episode.max_turns for traj in trajectories]
                  + [len(traj.turns) for traj in trajectories] + [1])
  return StepLayout(np.asarray(episode, np.int32), np.asarray(step, np.int32),
                    np.asarray(first, np.int32), int(num_steps))


def to_episodes(rows: np.ndarray, layout: StepLayout, num_episodes: int) -> np.ndarray:
  """`[N, La]` per-row values → `[episodes, K·La]`, step k of an episode at columns k·La..."""
  width = rows.shape[1]
  out = np.zeros((num_episodes, layout.num_steps, width), rows.dtype)
  out[layout.episode, layout.step] = rows[:len(layout.episode)]
  return out.reshape(num_episodes, layout.num_steps * width)


def from_episodes(values: np.ndarray, layout: StepLayout, width: int) -> np.ndarray:
  """The inverse of `to_episodes`: `[episodes, K·La]` → `[N, La]` (rows in layout order)."""
  return values.reshape(values.shape[0], layout.num_steps, width)[layout.episode, layout.step]


class OCSDStats(NamedTuple):
  """The per-token advantages and their metrics (float32 scalars)."""

  adv: jax.Array  # [episodes, K·La]
  q_mean: jax.Array  # mean q over action tokens
  q_abs_mean: jax.Array  # mean |q| over action tokens
  selected_frac: jax.Array  # selected steps / steps with tokens
  adv_factor_mean: jax.Array  # mean Â^OCSD/Â over the selected steps' tokens (1 where Â = 0)


@partial(jax.jit, static_argnames=("num_steps", "rho", "beta"))
def episode_advantages(seq_adv, full_logp, ablated_logp, old_logp, step_ids, mask, *,
                       num_steps: int, rho: float, beta: float) -> OCSDStats:
  """`losses.ocsd_advantages` on the episode layout, with OCSD's metrics.

  Args:
    seq_adv: `[E]` the episodes' GRPO advantages Â_i.
    full_logp, ablated_logp, old_logp: `[E, K·La]` the action tokens' log-probs (Full view,
      Ablated view, rollout).
    step_ids: `[E, K·La]` int, the interaction step of each action token, −1 elsewhere.
    mask: `[E, K·La]` bool, the action tokens.
    num_steps, rho, beta: K (static), ρ, β.
  """
  adv = losses.ocsd_advantages(seq_adv, full_logp, ablated_logp, old_logp, step_ids, mask,
                               num_steps=num_steps, rho=rho, beta=beta)
  tokens = mask & (step_ids >= 0)
  count = jnp.maximum(tokens.sum(), 1)
  q = losses.observation_calibration(full_logp, ablated_logp, tokens)
  stats = losses.step_uncertainty(old_logp, step_ids, tokens, num_steps=num_steps)
  chosen = losses.select_uncertain_steps(stats, rho=rho)
  present = stats.tokens > 0
  # The chosen steps' tokens: one-hot of each token's step against the chosen steps.
  onehot = jax.nn.one_hot(jnp.where(tokens, step_ids, num_steps), num_steps + 1)[..., :-1]
  on_chosen = tokens & (jnp.einsum("btk,bk->bt", onehot, chosen.astype(jnp.float32)) > 0)
  a = jnp.broadcast_to(jnp.asarray(seq_adv, jnp.float32)[:, None], adv.shape)
  factor = jnp.where(a != 0, adv / jnp.where(a != 0, a, 1.0), 1.0)
  return OCSDStats(
    adv=adv, q_mean=q.sum() / count, q_abs_mean=jnp.abs(q).sum() / count,
    selected_frac=chosen.sum() / jnp.maximum(present.sum(), 1),
    adv_factor_mean=jnp.where(on_chosen, factor, 0.0).sum() / jnp.maximum(on_chosen.sum(), 1))


class ScoringBackend(Protocol):
  """What `Calibrator` needs of the model side (`methods.rtpo.Learner` has it)."""

  def turn_batch(self, turns: Sequence[SampledTurn], adv, weight=None) -> TurnBatch: ...

  def score(self, params: Any, batch: TurnBatch) -> np.ndarray: ...


@dataclasses.dataclass(frozen=True)
class Calibrator:
  """OCSD's batch hook of `rtpo.grpo_step` (turn rows): `(params, trajectories, batch) →
  (batch with [rows, La] OCSD advantages, metrics)`.

  `batch` holds one row per turn in episode-major order (what grpo_step builds for turn GRPO),
  each with its episode's GRPO advantage. The hook builds both replay views of every turn,
  scores them with `params` (the rollout parameters θ_old, before any update), lays the rows
  out per episode and replaces `adv` by `losses.ocsd_advantages`. Metrics: `ocsd/q_mean`,
  `ocsd/q_abs_mean` (over action tokens), `ocsd/selected_frac` (selected / all steps),
  `ocsd/adv_factor_mean` (Â^OCSD/Â on the selected steps' tokens), `time/ocsd_score` (seconds
  of the whole hook).

  Attributes:
    backend: scores batches (`turn_batch`, `score`).
    tokenizer: encodes the template, observations and placeholder.
    max_context_len: the replay contexts' bound (the backend's context columns).
    config: the knobs.
  """

  backend: ScoringBackend
  tokenizer: Tokenizer
  max_context_len: int
  config: OCSDConfig = OCSDConfig()

  def views(self, turns: Sequence[SampledTurn]) -> tuple[list[SampledTurn], list[SampledTurn]]:
    return replay_turns(turns, tokenizer=self.tokenizer, config=self.config,
                        max_len=self.max_context_len)

  def __call__(self, params: Any, trajectories: Sequence[SampledTrajectory], batch: TurnBatch
               ) -> tuple[TurnBatch, dict[str, float]]:
    tic = time.perf_counter()
    turns = [t for traj in trajectories for t in traj.turns]
    n = len(turns)
    layout = step_layout(trajectories)
    if batch.num_rows != n or not np.array_equal(batch.turn[:n], [t.index for t in turns]):
      raise ValueError("OCSD needs the turn rows of `trajectories` in order (turn GRPO's batch); "
                       f"got {batch.num_rows} rows for {n} turns")
    # One scoring call per view: each has the batch's row count, so it reuses the program that
    # scores θ_old for the PPO phase instead of compiling one for 2N rows.
    zeros = np.zeros(n, np.float32)
    logp = np.concatenate([
      np.asarray(self.backend.score(params, self.backend.turn_batch(view, zeros)),
                 np.float32)[:n] for view in self.views(turns)])
    width = batch.loss_mask.shape[1]
    if logp.shape[1] != width:
      raise ValueError(f"replay rows have {logp.shape[1]} action columns, the batch {width}")
    episodes = len(trajectories)
    mask = np.asarray(batch.loss_mask[:n], bool)
    step_ids = np.where(mask, layout.step[:, None], -1).astype(np.int32)
    first = np.maximum(layout.first_row, 0)
    seq_adv = np.where(layout.first_row >= 0, np.asarray(batch.adv, np.float32)[first], 0.0)
    put = lambda x: to_episodes(np.asarray(x), layout, episodes)  # noqa: E731
    out = episode_advantages(
      seq_adv.astype(np.float32), put(logp[:n]), put(logp[n:]), put(batch.rollout_logp[:n]),
      to_episodes(step_ids + 1, layout, episodes) - 1, put(mask), num_steps=layout.num_steps,
      rho=float(self.config.rho), beta=float(self.config.beta))
    adv = np.zeros(batch.loss_mask.shape, np.float32)
    adv[:n] = from_episodes(np.asarray(out.adv), layout, width)
    metrics = {f"ocsd/{k}": float(v) for k, v in out._asdict().items() if k != "adv"}
    metrics["time/ocsd_score"] = time.perf_counter() - tic
    return batch._replace(adv=adv), metrics


__all__ = [
  "DEFAULT_PLACEHOLDER",
  "DEFAULT_TEMPLATE",
  "DEFAULT_TERMINAL",
  "Calibrator",
  "OCSDConfig",
  "OCSDStats",
  "ReplayContexts",
  "ScoringBackend",
  "StepLayout",
  "episode_advantages",
  "from_episodes",
  "observation_text",
  "replay_contexts",
  "replay_turns",
  "step_layout",
  "to_episodes",
]
