"""Three ways to train a policy on multi-turn episodes: flat GRPO, turn-level GRPO and RTPO.

All three start from a batch of task prompts and end with policy updates; they differ in what is
sampled, which tokens are trained and against which baseline (RTPO, arXiv 2608.18682, §2.2):

  flat_grpo   G episodes per prompt; advantage = GRPO over the episode returns; each episode is
              ONE training sequence, prompt | a_0 | o_0 | a_1 | ..., observations masked out. The
              trainer re-reads the full history even when the rollout saw ψ(S_k): context
              mismatch (A) and trajectory-only credit (B).
  turn_grpo   the same episodes and advantages, but each turn is its own row `c_k | a_k` with
              the context recorded at rollout: fixes (A), keeps (B).
  rtpo        trunk episodes (no gradient), then a reverse sweep over turn boundaries
              k = K−1, ..., 0: restore S_k, fork G − 1 siblings of turn k with the CURRENT
              parameters and continue each on-policy to the end, A_j = R_j − mean_j R_j, one
              clipped-PPO phase on the siblings' turn-k tokens only; earlier boundaries then
              sample with parameters already updated on the later ones. Boundaries whose
              siblings all score the same are skipped (their gradient is exactly 0).

The maths is in `jaxrl_post.losses.rtpo` (sibling advantage, turn loss, off-policy weight) and
`jaxrl_post.training.multiturn` (rollouts, batches, consistency metric). Here:

  `MethodConfig`   the method and its knobs, validated.
  `Learner`        the model side: sampling policies, `rollout`, batches of fixed bucketed shapes,
                   training-time log-probs (`score`), PPO phases and SFT steps under `jit`.
  `grpo_step`, `rtpo_step`   one RL step of each method, written against the small `Backend`
                   protocol that `Learner` implements (tests drive them with scripted policies).
  `evaluate`       greedy success on held-out episodes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxrl_post.envs import Env, EnvState
from jaxrl_post.envs.context import ContextFn
from jaxrl_post.losses import loss_normalizers
from jaxrl_post.losses import rtpo as rtpo_losses
from jaxrl_post.sampling import Sampler, score_model
from jaxrl_post.training import multiturn
from jaxrl_post.training.multiturn import SampledTrajectory, SampledTurn, TurnBatch
from jaxrl_post.training.train_state import TrainState, make_train_step

METHODS = ("flat_grpo", "turn_grpo", "rtpo")
CONTINUATIONS = ("on_policy", "off_policy")

@dataclasses.dataclass(frozen=True, kw_only=True)
class MethodConfig:
  """The training method and its knobs.

  Attributes:
    method: "flat_grpo", "turn_grpo" or "rtpo".
    group_size: G. GRPO: episodes per prompt. RTPO: a boundary's group is the trunk's turn and
      G − 1 siblings (the paper's default G = 3, i.e. 2 siblings).
    trunks_per_prompt: RTPO trunk episodes per prompt (paper: 4 for math, 2 for search).
    advantage: GRPO's advantage estimator, by name (`losses.rtpo.advantage_fn`; "grpo": group
      mean and std).
    advantage_eps: ε of the GRPO std.
    continuation: RTPO "on_policy" (siblings continue with the current parameters, ω ≡ 1) or
      the "off_policy" ablation (every boundary's siblings sampled with θ_0 before the sweep,
      weighted by ω̄ = clamp(Π π_θ>k / π_θ0, ρ_min, ρ_max) over their continuation tokens).
    rho_min, rho_max: the clamp of ω̄ (not in the paper; PROPOSAL defaults).
    skip_zero_advantage: skip RTPO boundaries (and GRPO steps) whose advantages are all 0.
  """

  method: str
  group_size: int
  trunks_per_prompt: int = 2
  advantage: str = "grpo"
  advantage_eps: float = 1e-6
  continuation: str = "on_policy"
  rho_min: float = rtpo_losses.DEFAULT_RHO_MIN
  rho_max: float = rtpo_losses.DEFAULT_RHO_MAX
  skip_zero_advantage: bool = True

  def __post_init__(self):
    if self.method not in METHODS:
      raise ValueError(f"unknown method {self.method!r}; valid: {', '.join(METHODS)}")
    if self.continuation not in CONTINUATIONS:
      raise ValueError(f"unknown continuation {self.continuation!r}; valid: "
                       f"{', '.join(CONTINUATIONS)}")
    if self.method == "rtpo" and self.group_size < 3:
      raise ValueError(f"rtpo needs group_size >= 3 (G − 1 >= 2 siblings); with one sibling every "
                       f"advantage R_j − mean R is 0. Got {self.group_size}")
    if self.group_size < 2:
      raise ValueError(f"group_size must be >= 2, got {self.group_size}")
    if self.trunks_per_prompt < 1:
      raise ValueError(f"trunks_per_prompt must be >= 1, got {self.trunks_per_prompt}")
    if not 0.0 <= self.rho_min <= self.rho_max:
      raise ValueError(f"need 0 <= rho_min <= rho_max, got {self.rho_min}, {self.rho_max}")
    rtpo_losses.advantage_fn(self.advantage)  # fails early, listing the valid names


class Backend(Protocol):
  """What the method steps need from the model side (`Learner` implements it)."""

  def rollout(self, params: Any, starts: Sequence[EnvState], rng: jax.Array, *,
              greedy: bool = False) -> list[SampledTrajectory]: ...

  def turn_batch(self, turns: Sequence[SampledTurn], adv, weight=None) -> TurnBatch: ...

  def flat_batch(self, trajectories: Sequence[SampledTrajectory], adv) -> tuple[TurnBatch, int]:
    ...

  def score(self, params: Any, batch: TurnBatch) -> np.ndarray: ...

  def ppo(self, state: TrainState, batch: TurnBatch, *, rng: np.random.Generator
          ) -> tuple[TrainState, dict[str, float]]: ...


def _bucket(n: int, smallest: int, largest: int | None = None) -> int:
  """The smallest size ≥ n of the form s·2^i or 1.5·s·2^i (s = `smallest`), capped at `largest`.

  Two sizes per octave waste at most a third of a padded batch, and a run meets only a few.
  """
  size = smallest
  while True:
    for candidate in (size, size * 3 // 2):
      if candidate >= n:
        return candidate if largest is None else min(candidate, max(largest, n))
    size *= 2


class Learner:
  """The model side of the methods: sampling, fixed-shape batches, scoring and jitted updates.

  Batches are padded to bucketed row counts (2^i or 1.5·2^i, times `num_micro_batches`) and,
  with `bucket_widths`, their context and completion columns are cut to bucketed widths that
  hold every real token, so a run compiles a handful of update programs, not one per batch.

  Args:
    model: the policy (its graph; parameters come from the train state).
    tokenizer: with the stop strings of `envs.tools` (see `multiturn.build_tokenizer`).
    optimizer: optax transformation (the train state's).
    env, context: the environment and ψ.
    loss: a policy-loss name (`losses.rtpo.policy_loss_fn`: "rtpo" for RTPO, "grpo" for the
      GRPO methods).
    loss_kwargs: keywords of that loss (ε, aggregation, β, ...).
    max_turn_tokens: per-turn generation budget (the action columns).
    max_context_len: contexts keep their last this many tokens (the context columns).
    flat_len: completion columns of the flat view (actions and observations).
    temperature, top_k, top_p: rollout decoding; log-probs are scored at `temperature`.
    num_micro_batches, ppo_epochs, ppo_mini_batches: PPO phase layout.
    reference_params: the frozen reference for a KL term (needed when β > 0).
    add_bos: start contexts with bos.
    bucket_widths: cut batch columns to power-of-two widths (False: always the full widths).
    sampler_batch_buckets, sampler_len_buckets: the sampler's static shapes (default powers of
      two).
  """

  def __init__(self, model, tokenizer, optimizer: optax.GradientTransformation, *, env: Env,
               context: ContextFn, loss: str, loss_kwargs: Mapping[str, Any] | None = None,
               max_turn_tokens: int, max_context_len: int, flat_len: int,
               temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
               num_micro_batches: int = 1, ppo_epochs: int = 1, ppo_mini_batches: int = 1,
               reference_params: Any = None, add_bos: bool = False, bucket_widths: bool = True,
               sampler_batch_buckets: Sequence[int] | None = None,
               sampler_len_buckets: Sequence[int] | None = None):
    self.tokenizer, self.env, self.context = tokenizer, env, context
    self.loss_name = loss
    self.loss_kwargs = dict(loss_kwargs or {})
    rtpo_losses.policy_loss_fn(loss)  # fails early, listing the valid names
    if self.loss_kwargs.get("beta", 0.0) and reference_params is None:
      raise ValueError("a KL term (beta > 0) needs reference_params")
    self.reference_params = reference_params
    self.max_turn_tokens, self.max_context_len, self.flat_len = (
      max_turn_tokens, max_context_len, flat_len)
    self.temperature, self.top_k, self.top_p = temperature, top_k, top_p
    self.num_micro_batches = num_micro_batches
    self.ppo_epochs, self.ppo_mini_batches = ppo_epochs, ppo_mini_batches
    self.add_bos, self.bucket_widths = add_bos, bucket_widths
    self.sampler = Sampler(model, tokenizer, max_prompt_len=max_context_len,
                           batch_buckets=sampler_batch_buckets or None,
                           prompt_len_buckets=sampler_len_buckets or None)
    graphdef = nnx.split(model)[0]
    shared = ("num_tokens", "num_sequences")
    self._ppo_step = make_train_step(graphdef, self._policy_loss, optimizer,
                                     num_micro_batches=num_micro_batches, shared=shared)
    self._sft_step = make_train_step(graphdef, self._sft_loss, optimizer,
                                     num_micro_batches=num_micro_batches, shared=shared)

  # ---- sampling ----

  def policy(self, params, *, greedy: bool = False) -> multiturn.SamplerPolicy:
    return multiturn.SamplerPolicy(self.sampler, params, self.max_turn_tokens,
                                   temperature=self.temperature, top_k=self.top_k,
                                   top_p=self.top_p, greedy=greedy)

  def rollout(self, params, starts: Sequence[EnvState], rng: jax.Array, *,
              greedy: bool = False) -> list[SampledTrajectory]:
    return multiturn.rollout(self.env, starts, self.policy(params, greedy=greedy),
                             tokenizer=self.tokenizer, context=self.context,
                             max_context_len=self.max_context_len, rng=rng, add_bos=self.add_bos)

  # ---- batches ----

  def turn_batch(self, turns, adv, weight=None) -> TurnBatch:
    return multiturn.turn_batch(turns, adv, pad_id=self.tokenizer.pad_id,
                                context_len=self.max_context_len,
                                action_len=self.max_turn_tokens, weight=weight)

  def flat_batch(self, trajectories, adv) -> tuple[TurnBatch, int]:
    return multiturn.flat_batch(trajectories, adv, tokenizer=self.tokenizer,
                                prompt_len=self.max_context_len, completion_len=self.flat_len,
                                add_bos=self.add_bos)

  def _device_batch(self, batch: TurnBatch, extra: Mapping[str, np.ndarray] | None = None
                    ) -> tuple[dict[str, jax.Array], int]:
    """Pads rows to a bucket, cuts columns to buckets; returns arrays and the completion width."""
    arrays = dict(batch.arrays(), **(extra or {}))
    n = batch.num_rows
    micro = self.num_micro_batches
    rows = micro * _bucket(-(-n // micro), 1)
    context_width = batch.prompt_tokens.shape[1]
    completion_width = batch.completion_tokens.shape[1]
    if self.bucket_widths:
      used_context = int(batch.prompt_mask[:n].sum(1).max(initial=1))
      used_completion = int(batch.completion_mask[:n].sum(1).max(initial=1))
      context_width = _bucket(used_context, 16, context_width)
      completion_width = _bucket(used_completion, 16, completion_width)
    out = {}
    for key, value in arrays.items():
      value = np.asarray(value)[:n]
      if key in ("prompt_tokens", "prompt_mask"):
        value = value[:, -context_width:]
      elif value.ndim == 2:
        value = value[:, :completion_width]
      pad = np.zeros((rows - n, *value.shape[1:]), value.dtype)
      if key == "prompt_tokens":
        pad[:] = self.tokenizer.pad_id
      elif key == "prompt_mask":
        pad[:, -1] = True  # padding rows attend to one (pad) token
      elif key in ("turn_ids", "turn"):
        pad[:] = -1
      elif key == "weight":
        pad[:] = 1.0
      out[key] = jnp.asarray(np.concatenate([value, pad]))
    return out, completion_width

  def _loss_mask(self, arrays: Mapping[str, jax.Array]) -> jax.Array:
    if self.loss_name == "rtpo":
      return rtpo_losses.turn_token_mask(arrays["loss_mask"], arrays["turn_ids"], arrays["turn"])
    return arrays["loss_mask"]

  # ---- scoring and updates ----

  def score(self, params, batch: TurnBatch) -> np.ndarray:
    """`float32 [num_rows, La]` training-time log-probs of the completion tokens under `params`."""
    arrays, width = self._device_batch(batch)
    scored = self.sampler.score(params, arrays["prompt_tokens"], arrays["prompt_mask"],
                                arrays["completion_tokens"], arrays["completion_mask"],
                                temperature=self.temperature)
    logp = np.zeros(batch.completion_tokens.shape, np.float32)[:batch.num_rows]
    logp[:, :width] = np.asarray(scored.logp)[:batch.num_rows]
    return logp

  def _policy_loss(self, model, batch):
    scored = score_model(model, batch["prompt_tokens"], batch["prompt_mask"],
                         batch["completion_tokens"], batch["completion_mask"],
                         temperature=self.temperature)
    return batch_loss(scored.logp, batch, loss=self.loss_name, loss_kwargs=self.loss_kwargs,
                      entropy=jax.lax.stop_gradient(scored.entropy))

  def _sft_loss(self, model, batch):
    scored = score_model(model, batch["prompt_tokens"], batch["prompt_mask"],
                         batch["completion_tokens"], batch["completion_mask"])
    nll = -jnp.sum(jnp.where(batch["loss_mask"], scored.logp, 0.0)) / batch["num_tokens"]
    return nll, {"nll": nll}

  def _step(self, step_fn, state, batch: TurnBatch, extra=None):
    arrays, _ = self._device_batch(batch, extra)
    norm = loss_normalizers(self._loss_mask(arrays))
    arrays.update(num_tokens=norm.num_tokens, num_sequences=norm.num_sequences)
    return step_fn(state, arrays)

  def ppo(self, state: TrainState, batch: TurnBatch, *, rng: np.random.Generator
          ) -> tuple[TrainState, dict[str, float]]:
    """One PPO phase: score θ_old, then `ppo_epochs` × `ppo_mini_batches` clipped updates.

    θ_old is the current parameters, scored on the recorded contexts (`old_logp`); the phase's
    consistency metric compares them with the rollout-time log-probs. Each mini-batch is a
    shuffled subset of rows with its own normalisers (a separate update, as in PPO).

    Returns:
      The new state and the mean metrics of the updates, plus `consistency_*` and
      `num_updates`.
    """
    old_logp = self.score(state.params, batch)
    check = multiturn.consistency(old_logp, batch.rollout_logp[:batch.num_rows],
                                  batch.loss_mask[:batch.num_rows])
    extra = {"old_logp": old_logp}
    if self.reference_params is not None and self.loss_kwargs.get("beta", 0.0):
      extra["ref_logp"] = self.score(self.reference_params, batch)
    updates = []
    for _ in range(self.ppo_epochs):
      order = rng.permutation(batch.num_rows)
      for part in np.array_split(order, self.ppo_mini_batches):
        if not len(part):
          continue
        rows = np.sort(part)
        state, metrics = self._step(self._ppo_step, state, batch.take(rows),
                                    {k: v[rows] for k, v in extra.items()})
        updates.append(metrics)
    merged = _mean_metrics(updates)
    merged.update({f"consistency_{k}": float(v) for k, v in check._asdict().items()})
    return state, merged

  def sft(self, state: TrainState, batch: TurnBatch) -> tuple[TrainState, dict[str, float]]:
    """One teacher-forced step on the batch's action tokens (`loss_mask`)."""
    state, metrics = self._step(self._sft_step, state, batch)
    return state, _mean_metrics([metrics])


def batch_loss(logp: jax.Array, batch: Mapping[str, jax.Array], *, loss: str,
               loss_kwargs: Mapping[str, Any] | None = None, entropy: jax.Array | None = None
               ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """The policy loss of a (device) `TurnBatch` given the trainer's log-probs of its completions.

  Only `loss_mask` tokens enter (generated actions; never context, observation or padding
  tokens), and for the "rtpo" loss only those of each row's turn (`turn_ids == turn`), with the
  row's trajectory weight ω. Other losses get A·ω as the advantage.

  Args:
    logp: `[N, La]` log-probs of `completion_tokens` (differentiated).
    batch: the `TurnBatch` arrays plus `old_logp` `[N, La]`, the global `num_tokens` /
      `num_sequences`, and optionally `ref_logp`.
    loss: a policy-loss name (see `losses.rtpo.policy_loss_fn`).
    loss_kwargs: its keywords.
    entropy: optional `[N, La]` entropies (a metric only).

  Returns:
    `(loss, metrics)` with the additive `PolicyLossAux` fields.
  """
  kwargs = dict(loss_kwargs or {})
  if loss == "rtpo":
    kwargs.update(turn_ids=batch["turn_ids"], turn=batch["turn"], weight=batch["weight"])
    adv = batch["adv"]
  else:
    adv = batch["adv"] * batch["weight"]
  value, aux = rtpo_losses.policy_loss_fn(loss)(
    logp, batch["old_logp"], adv, batch["loss_mask"], ref_logp=batch.get("ref_logp"),
    entropy=entropy, num_tokens=batch["num_tokens"], num_sequences=batch["num_sequences"],
    **kwargs)
  return value, aux.additive()


def _mean_metrics(updates: Sequence[Mapping[str, Any]]) -> dict[str, float]:
  """Mean of per-update metrics; running counters take the last value, `skipped` adds up."""
  if not updates:
    return {"num_updates": 0.0}
  host = [{k: float(v) for k, v in jax.device_get(u).items()} for u in updates]
  merged = {k: float(np.mean([u[k] for u in host])) for k in host[0]}
  merged["nonfinite_streak"] = host[-1]["nonfinite_streak"]
  merged["skipped"] = float(sum(u["skipped"] for u in host))
  merged["num_updates"] = float(len(host))
  return merged


class StepOutput(NamedTuple):
  """One RL step of a method.

  Attributes:
    state: the updated train state.
    metrics: flat scalar metrics (`train/...`, `rollout/...`, `boundary/k{k}/...`).
    generated_tokens: tokens the step sampled (trunks, siblings or episodes), for budgets.
    boundaries: RTPO's per-boundary statistics in sweep order (empty for GRPO).
  """

  state: TrainState
  metrics: dict[str, float]
  generated_tokens: int
  boundaries: list[dict[str, float]]


def _prefixed(prefix: str, metrics: Mapping[str, float]) -> dict[str, float]:
  return {f"{prefix}/{k}": float(v) for k, v in metrics.items()}


def grpo_step(state: TrainState, backend: Backend, starts: Sequence[EnvState], *,
              config: MethodConfig, rng: jax.Array, shuffle: np.random.Generator) -> StepOutput:
  """One step of flattened-trajectory or turn-level GRPO.

  G episodes per start state; A_i = the GRPO advantage of episode i's return within its
  prompt's group; flat: one row per episode (observations masked), turn: one row `c_k | a_k` per
  turn, each with its episode's A_i. One PPO phase. A step where every advantage is 0 is skipped
  when `config.skip_zero_advantage` (its policy gradient is exactly 0).
  """
  g = config.group_size
  trajectories = backend.rollout(state.params, [s for s in starts for _ in range(g)], rng)
  rewards = np.array([t.reward for t in trajectories], np.float32)
  group_ids = np.repeat(np.arange(len(starts), dtype=np.int32), g)
  estimator = rtpo_losses.advantage_fn(config.advantage)
  adv = np.asarray(estimator(jnp.asarray(rewards), jnp.asarray(group_ids),
                             num_groups=len(starts), eps=config.advantage_eps))
  metrics = _prefixed("rollout", multiturn.rollout_stats(trajectories))
  tokens = sum(t.num_generated_tokens for t in trajectories)
  if config.skip_zero_advantage and not np.any(adv):
    metrics["train/num_updates"] = 0.0
    return StepOutput(state, metrics, tokens, [])
  if config.method == "flat_grpo":
    batch, num_cut = backend.flat_batch(trajectories, adv)
    metrics["train/flat_rows_cut"] = float(num_cut)
  else:
    turns = [t for traj in trajectories for t in traj.turns]
    turn_adv = [a for traj, a in zip(trajectories, adv, strict=True) for _ in traj.turns]
    batch = backend.turn_batch(turns, turn_adv)
  state, update = backend.ppo(state, batch, rng=shuffle)
  metrics.update(_prefixed("train", update))
  return StepOutput(state, metrics, tokens, [])


def rtpo_step(state: TrainState, backend: Backend, starts: Sequence[EnvState], *,
              config: MethodConfig, rng: jax.Array, shuffle: np.random.Generator) -> StepOutput:
  """One RTPO step (the paper's Algorithm 1): trunks, then the reverse sweep over boundaries.

  Phase 1: `trunks_per_prompt` trunk episodes per start with θ (never trained); turn k of a
  trunk records S_k (its snapshot) and c_k. Phase 2, for k from the deepest boundary any trunk
  reached down to 0: restore S_k of every trunk that reached it, fork G − 1 siblings and play
  them to the end with the current parameters (θ already updated on turns > k; key
  `fold_in(rng, 1 + k)`); A_j = R_j − mean over the boundary's siblings; drop boundaries with
  all-equal returns; one PPO phase of the turn loss on the siblings' turn-k tokens.

  With `continuation="off_policy"` all siblings are sampled with θ_0 before the sweep (same
  keys) and each gets the clamped continuation weight ω̄ (see `losses.rtpo`).
  """
  siblings_per_boundary = config.group_size - 1
  trunk_starts = [s for s in starts for _ in range(config.trunks_per_prompt)]
  trunks = backend.rollout(state.params, trunk_starts, jax.random.fold_in(rng, 0))
  tokens = sum(t.num_generated_tokens for t in trunks)
  metrics = _prefixed("rollout", multiturn.rollout_stats(trunks))
  depth = max((len(t.turns) for t in trunks), default=0)

  def fork(params, k):
    reached = [i for i, trunk in enumerate(trunks) if len(trunk.turns) > k]
    fork_starts = [trunks[i].turns[k].snapshot for i in reached
                   for _ in range(siblings_per_boundary)]
    return reached, backend.rollout(params, fork_starts, jax.random.fold_in(rng, 1 + k))

  off_policy = config.continuation == "off_policy"
  presampled = {k: fork(state.params, k) for k in range(depth)} if off_policy else {}
  boundaries, updates = [], []
  for k in reversed(range(depth)):
    reached, siblings = presampled[k] if off_policy else fork(state.params, k)
    tokens += sum(s.num_generated_tokens for s in siblings)
    rewards = np.array([s.reward for s in siblings], np.float32)
    group_ids = np.repeat(np.arange(len(reached), dtype=np.int32), siblings_per_boundary)
    adv = np.asarray(rtpo_losses.sibling_advantages(jnp.asarray(rewards), jnp.asarray(group_ids),
                                                    num_groups=len(reached)))
    signal = np.asarray(rtpo_losses.boundary_has_signal(
      jnp.asarray(rewards), jnp.asarray(group_ids), num_groups=len(reached)))
    keep = signal[group_ids] if config.skip_zero_advantage else np.ones(len(siblings), bool)
    stats = {"k": float(k), "boundaries": float(len(reached)),
             "trained": float(signal.sum() if config.skip_zero_advantage else len(reached)),
             "zero_adv_rate": float(1.0 - signal.mean()), "sibling_success": float(
               np.mean([s.success for s in siblings])),
             "generated_tokens": float(sum(s.num_generated_tokens for s in siblings))}
    rows = np.flatnonzero(keep)
    if len(rows):
      turns = [siblings[r].turns[0] for r in rows]
      weight = None
      if off_policy:
        weight = _continuation_weights(backend, state.params, [siblings[r] for r in rows],
                                       config)
        stats["weight_mean"] = float(np.mean(weight))
      batch = backend.turn_batch(turns, adv[rows], weight)
      state, update = backend.ppo(state, batch, rng=shuffle)
      updates.append(update)
      stats.update({key: update[key] for key in ("loss", "consistency_ratio", "clip_frac_low",
                                                 "clip_frac_high") if key in update})
    boundaries.append(stats)
  for stats in boundaries:
    k = int(stats["k"])
    metrics.update({f"boundary/k{k}/{key}": v for key, v in stats.items() if key != "k"})
  visited = max(len(boundaries), 1)
  metrics["rtpo/boundaries_visited"] = float(len(boundaries))
  metrics["rtpo/boundaries_trained"] = float(sum(b["trained"] > 0 for b in boundaries))
  metrics["rtpo/zero_adv_rate"] = float(
    sum(b["zero_adv_rate"] * b["boundaries"] for b in boundaries)
    / max(sum(b["boundaries"] for b in boundaries), 1.0))
  metrics["rtpo/sibling_success"] = float(
    sum(b["sibling_success"] for b in boundaries) / visited)
  merged = _mean_metrics(updates)
  merged["num_updates"] = float(sum(u["num_updates"] for u in updates))
  metrics.update(_prefixed("train", merged))
  return StepOutput(state, metrics, tokens, boundaries)


def _continuation_weights(backend: Backend, params, siblings: Sequence[SampledTrajectory],
                          config: MethodConfig) -> np.ndarray:
  """ω̄ per sibling: its continuation turns (after turn k) re-scored by `params` vs rollout θ_0."""
  pairs = [(j, t) for j, sib in enumerate(siblings) for t in sib.turns[1:]]
  width = max([sum(len(t.action_ids) for t in sib.turns[1:]) for sib in siblings] + [1])
  new = np.zeros((len(siblings), width), np.float32)
  old = np.zeros_like(new)
  mask = np.zeros(new.shape, bool)
  if pairs:
    logp = backend.score(params, backend.turn_batch([t for _, t in pairs], np.zeros(len(pairs))))
    fill = np.zeros(len(siblings), int)
    for row, (j, t) in enumerate(pairs):
      n, at = len(t.action_ids), fill[j]
      new[j, at:at + n] = logp[row, :n]
      old[j, at:at + n] = t.logp
      mask[j, at:at + n] = True
      fill[j] += n
  return np.asarray(rtpo_losses.off_policy_continuation_weight(
    jnp.asarray(new), jnp.asarray(old), jnp.asarray(mask), rho_min=config.rho_min,
    rho_max=config.rho_max))


def method_step(state: TrainState, backend: Backend, starts: Sequence[EnvState], *,
                config: MethodConfig, rng: jax.Array, shuffle: np.random.Generator) -> StepOutput:
  """`rtpo_step` or `grpo_step`, as `config.method` says."""
  step = rtpo_step if config.method == "rtpo" else grpo_step
  return step(state, backend, starts, config=config, rng=rng, shuffle=shuffle)


def evaluate(backend: Backend, params, env: Env, indices: Sequence[int], *,
             split: str = "test", greedy: bool = True, rng: jax.Array | None = None
             ) -> dict[str, float]:
  """Rollouts of episodes `indices` of `split`: success rate, turns, tool calls, errors.

  Greedy by default; `greedy=False` samples at the backend's temperature with `rng` (success
  then estimates the training policy's own pass@1).
  """
  starts = [env.initial_state(i, split) for i in indices]
  rng = jax.random.key(0) if rng is None else rng
  return multiturn.rollout_stats(backend.rollout(params, starts, rng, greedy=greedy))
