r"""Multi-turn agentic RL: RTPO (arXiv 2608.18682), turn-level and flattened GRPO, SFT cold start.

All three RL methods start from a batch of task prompts and end with policy updates; they differ
in what is sampled, which tokens are trained and against which baseline (RTPO, arXiv 2608.18682,
§2.2):

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
              siblings all score the same are skipped (at β = 0 their gradient is exactly
              0); their siblings still count in the loss normalisers of the phase.
  sft         the cold start: teacher-forced NLL (`losses.nll_loss`) on the env's
              demonstrations, each turn a row `c_k | a_k` under the ψ the rollouts will use.
  ocsd        OCSD (arXiv 2608.04788): turn_grpo plus one dual-view re-scoring of every action
              (replay contexts with and without the next observation) that modulates the
              episode's advantage per token on its most uncertain steps (`methods.ocsd`).
  temporal_grpo, stage_reward
              Temporal GRPO (arXiv 2608.13026) and its Stage-Reward GRPO baseline: turn_grpo
              with each turn row's advantage replaced by the stage-aligned one (or the GRPO
              advantage of the fraction of stages completed), stages from the env's detector
              (`methods.stage_credit.StageCredit`, `envs.Env.stage_times`).
  canopy      CANOPY (arXiv 2609.01245): turn_grpo with fault quarantine and population-std
              advantages (`methods.stage_credit.CanopyCredit`), one update per batch, k3 KL to
              the starting policy, and a pilot that checks the group size against the signal-
              coverage rule before the first step.
  draco, draco_static
              DRACO (arXiv 2609.04094) and its "static rubric, no step credit" baseline:
              turn_grpo on a rubric judge's reward instead of the env's, each turn row's
              advantage spread by the judge's step citations (`methods.rubric_credit`).
  factor      FACTOR (arXiv 2608.07118): turn_grpo with TD action credit from Monte-Carlo
              continuations of turn snapshots and hindsight token allocation, per-token
              advantages under the per-action-mean loss (`methods.action_credit`).

An RL step reads top to bottom in `grpo_step` / `rtpo_step`: start states → rollouts
(`sampling.multiturn.rollout`) → returns → advantages (`losses.rtpo`) → (context, action) rows →
PPO phase (`training.ppo.ppo_phase`). The maths is in `jaxrl_post.losses.rtpo` (sibling
advantage, turn loss, off-policy weight); rollouts, batches and the consistency metric are in
`jaxrl_post.sampling.multiturn`. Here:

  `MethodConfig`   the RL method and its knobs, validated.
  `Learner`        the model side: sampling policies (on the sampler's mesh), `rollout`, batches
                   of bucketed shapes, training-time log-probs (`score`, on the trainer's mesh),
                   PPO phases and SFT steps under `jit`.
  `grpo_step`, `rtpo_step`   one RL step of each method, written against the small `Backend`
                   protocol that `Learner` implements (tests drive them with scripted policies);
                   grpo_step's `batch_hook` is where OCSD (`methods.ocsd.Calibrator`) plugs in.
  `evaluate`       greedy (or sampled) success on held-out episodes.
  `RTPO`           the `training.loop.Method` of experiments/rtpo.py: every mode above, the
                   generated-token budget (`config.max_generated_tokens`, through `done`), and
                   the tokens generated / wall-clock seconds so far in its checkpointed state.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import logging
from flax import nnx

from jaxrl_post import losses
from jaxrl_post.envs import Env, EnvState, get_env, make_context
from jaxrl_post.envs.context import ContextFn
from jaxrl_post.losses import rtpo as rtpo_losses
from jaxrl_post.methods import action_credit, rubric_credit, stage_credit
from jaxrl_post.methods import ocsd as ocsd_lib
from jaxrl_post.parallel import multihost
from jaxrl_post.parallel.axes import DEFAULT_RULES, Rules
from jaxrl_post.parallel.mesh import put_batch
from jaxrl_post.parallel.reshard import reshard_state
from jaxrl_post.sampling import Sampler, multiturn, score_model
from jaxrl_post.sampling.multiturn import SampledTrajectory, SampledTurn, TurnBatch
from jaxrl_post.training import loop, ppo
from jaxrl_post.training import setup as run_setup
from jaxrl_post.training.metrics import write_eval_outcomes
from jaxrl_post.training.train_state import TrainState, make_train_step

METHODS = ("flat_grpo", "turn_grpo", "rtpo")
CONTINUATIONS = ("on_policy", "off_policy")
SFT = "sft"
# OCSD is turn_grpo with a batch hook (`methods.ocsd`); it is a mode of the binary, not one of
# the `METHODS` of RTPO's horizon grid.
OCSD = "ocsd"
OCSD_HOST = "turn_grpo"
# Temporal GRPO, Stage-Reward GRPO and CANOPY: turn_grpo with a batch hook
# (`methods.stage_credit`), modes like OCSD.
TEMPORAL_GRPO, STAGE_REWARD, CANOPY = (stage_credit.TEMPORAL_GRPO, stage_credit.STAGE_REWARD,
                                       stage_credit.CANOPY)
# DRACO and its static-rubric baseline (`methods.rubric_credit`), also turn_grpo hooks.
DRACO, DRACO_STATIC = rubric_credit.DRACO, rubric_credit.DRACO_STATIC
# FACTOR (`methods.action_credit`), a turn_grpo hook too.
FACTOR = action_credit.FACTOR
HOOK_MODES = (OCSD, TEMPORAL_GRPO, STAGE_REWARD, CANOPY, DRACO, DRACO_STATIC, FACTOR)
MODES = (SFT, *METHODS, *HOOK_MODES)  # what `config.method` may be
# Fill values of padding rows (`Learner.put`) where 0 is not neutral.
_ROW_PADDING = {"turn_ids": -1, "turn": -1, "weight": 1.0}


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
    rho_min, rho_max: the clamp of ω̄ (not in the paper; defaults 0.5 and 2).
    skip_zero_advantage: skip RTPO boundaries (and GRPO steps) whose advantages are all 0.
      Their siblings stay in the loss normalisers (`Learner.ppo`'s `skipped`), so with β = 0
      the gradient is exactly the full batch's. With a KL term (β > 0) it is not: a
      zero-advantage row still has a KL gradient, which skipping drops (the RTPO configs at
      the paper's β = 0.02 therefore turn skipping off).
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

  def ppo(self, state: TrainState, batch: TurnBatch, *, rng: np.random.Generator,
          skipped: TurnBatch | None = None) -> tuple[TrainState, dict[str, float]]: ...


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
    mesh, rules: the trainer's mesh and rules (`run.train_mesh`): updates and scoring run there,
      on the train state's layout. None: no mesh (jit places everything).
    sample_mesh, sample_rules: the sampler's (`run.placement.sample_mesh`); rollouts reshard the
      parameters to it first (in place when colocated). None: the trainer's.
  """

  def __init__(self, model, tokenizer, optimizer: optax.GradientTransformation, *, env: Env,
               context: ContextFn, loss: str, loss_kwargs: Mapping[str, Any] | None = None,
               max_turn_tokens: int, max_context_len: int, flat_len: int,
               temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
               num_micro_batches: int = 1, ppo_epochs: int = 1, ppo_mini_batches: int = 1,
               reference_params: Any = None, add_bos: bool = False, bucket_widths: bool = True,
               sampler_batch_buckets: Sequence[int] | None = None,
               sampler_len_buckets: Sequence[int] | None = None, mesh=None,
               rules: Rules = DEFAULT_RULES, sample_mesh=None, sample_rules: Rules | None = None):
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
    self.mesh, self.rules = mesh, tuple(rules)
    if sample_mesh is None:
      sample_mesh, sample_rules = mesh, rules
    self.sample_mesh, self.sample_rules = sample_mesh, tuple(sample_rules or DEFAULT_RULES)
    buckets = dict(batch_buckets=sampler_batch_buckets or None,
                   prompt_len_buckets=sampler_len_buckets or None)
    self.sampler = Sampler(model, tokenizer, max_prompt_len=max_context_len,
                           mesh=self.sample_mesh, rules=self.sample_rules, **buckets)
    # Old-policy and reference log-probs are scored by the trainer, on its mesh and in its
    # layout: `old_logp` then comes from the parameters the update differentiates (the first
    # PPO ratio is 1 up to float noise), and the consistency metric measures the rollout /
    # trainer mismatch it is meant to.
    self.scorer = Sampler(model, tokenizer, max_prompt_len=max_context_len, mesh=mesh,
                          rules=self.rules, **buckets)
    graphdef = nnx.split(model)[0]
    shared = ("num_tokens", "num_sequences")
    self.ppo_step = make_train_step(graphdef, self._policy_loss, optimizer,
                                    num_micro_batches=num_micro_batches, mesh=mesh,
                                    rules=self.rules, shared=shared)
    self.sft_step = make_train_step(graphdef, self._sft_loss, optimizer,
                                    num_micro_batches=num_micro_batches, mesh=mesh,
                                    rules=self.rules, shared=shared)

  # ---- sampling ----

  def sampler_params(self, params):
    """`params` in the sampler's layout: a re-layout in place when colocated, a device-to-device
    copy when the sampler has devices of its own. It may alias `params`, which an update
    donates, so it is made afresh for every rollout."""
    if self.sample_mesh is None:
      return params
    return reshard_state(params, self.sample_mesh, self.sample_rules)[0]

  def policy(self, params, *, greedy: bool = False) -> multiturn.SamplerPolicy:
    """A turn policy sampling with `params` (the trainer's layout; resharded here)."""
    return multiturn.SamplerPolicy(self.sampler, self.sampler_params(params),
                                   self.max_turn_tokens,
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

  def put(self, rows: Mapping[str, Any]) -> dict[str, jax.Array]:
    """Device arrays of a batch of rows: rows padded to a bucket, columns cut to buckets.

    `rows` maps `TurnBatch` field names (and `old_logp`, `ref_logp`) to host arrays holding
    only real rows; scalars (`num_tokens`, `num_sequences`) pass as they are. Rows are padded
    to `num_micro_batches × bucket` (padding rows: no loss, one attended pad token) and, with
    `bucket_widths`, context and completion columns are cut to bucketed widths that hold every
    real token — so a run compiles a handful of programs, not one per batch. The arrays go to
    the trainer's mesh, rows split over its batch axes (`parallel.mesh.put_batch`).
    """
    n = len(rows["prompt_tokens"])
    micro = self.num_micro_batches
    padded = micro * _bucket(-(-n // micro), 1)
    context_width = rows["prompt_tokens"].shape[1]
    completion_width = rows["completion_tokens"].shape[1]
    if self.bucket_widths:
      used_context = int(np.asarray(rows["prompt_mask"]).sum(1).max(initial=1))
      used_completion = int(np.asarray(rows["completion_mask"]).sum(1).max(initial=1))
      context_width = _bucket(used_context, 16, context_width)
      completion_width = _bucket(used_completion, 16, completion_width)
    out = {}
    for key, value in rows.items():
      value = np.asarray(value)
      if value.ndim == 0:
        out[key] = value
        continue
      if key in ("prompt_tokens", "prompt_mask"):
        value = value[:, -context_width:]
      elif value.ndim == 2:
        value = value[:, :completion_width]
      pad = np.zeros((padded - n, *value.shape[1:]), value.dtype)
      if key == "prompt_tokens":
        pad[:] = self.tokenizer.pad_id
      elif key == "prompt_mask":
        pad[:, -1] = True  # padding rows attend to one (pad) token
      elif key in _ROW_PADDING:
        pad[:] = _ROW_PADDING[key]
      out[key] = np.concatenate([value, pad])
    if self.mesh is None:
      return {k: jnp.asarray(v) for k, v in out.items()}
    return put_batch(out, self.mesh, self.rules)

  def train_mask(self, rows: Mapping[str, np.ndarray]) -> np.ndarray:
    """`bool [N, La]` the tokens the loss counts (so its `num_tokens` / `num_sequences`): the
    action tokens, and for the "rtpo" loss only those of each row's own turn."""
    if self.loss_name == "rtpo":
      return np.asarray(rtpo_losses.turn_token_mask(rows["loss_mask"], rows["turn_ids"],
                                                    rows["turn"]))
    return np.asarray(rows["loss_mask"])

  # ---- scoring and updates ----

  def score(self, params, batch: TurnBatch) -> np.ndarray:
    """`float32 [num_rows, La]` training-time log-probs of the completion tokens under `params`
    (the trainer's layout), scored on the trainer's mesh."""
    arrays = self.put(_rows(batch))
    width = arrays["completion_tokens"].shape[1]
    scored = self.scorer.score(params, arrays["prompt_tokens"], arrays["prompt_mask"],
                               arrays["completion_tokens"], arrays["completion_mask"],
                               temperature=self.temperature)
    logp = np.zeros(batch.completion_tokens.shape, np.float32)[:batch.num_rows]
    logp[:, :width] = multihost.to_host(scored.logp)[:batch.num_rows]
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
    nll = losses.nll_loss(scored.logp, batch["loss_mask"], batch["num_tokens"])
    return nll, {"nll": nll}

  def _put_update(self, rows: Mapping[str, Any]) -> dict[str, jax.Array]:
    # The counted-token mask only sets the normalisers; the loss recomputes it on device.
    return self.put({k: v for k, v in rows.items() if k != "train_mask"})

  def ppo(self, state: TrainState, batch: TurnBatch, *, rng: np.random.Generator,
          skipped: TurnBatch | None = None) -> tuple[TrainState, dict[str, float]]:
    """One PPO phase: score θ_old, then `ppo_epochs` × `ppo_mini_batches` clipped updates.

    θ_old is the current parameters, scored on the recorded contexts (`old_logp`); the phase's
    consistency metric compares them with the rollout-time log-probs. The updates are
    `training.ppo.ppo_phase`'s: each mini-batch a shuffled subset of rows with its own
    normalisers over the loss's counted tokens (`train_mask`).

    `skipped` holds rows of the same phase left out because their advantage is 0 (RTPO's
    zero-advantage boundaries): they are neither scored nor updated on, but their counted
    tokens stay in the normalisers, so the update equals the full batch's (where those rows
    add exactly 0 at β = 0) instead of being scaled up by 1 / (1 − zero-advantage rate).

    Returns:
      The new state and the merged metrics of the updates (`ppo.merge_update_metrics`), plus
      `consistency_*` and `num_updates`.

    Raises:
      ValueError: naming `config.ppo_mini_batches` when it does not divide the batch's rows.
    """
    old_logp = self.score(state.params, batch)
    check = multiturn.consistency(old_logp, batch.rollout_logp[:batch.num_rows],
                                  batch.loss_mask[:batch.num_rows])
    rows = _rows(batch)
    rows["old_logp"] = old_logp
    if self.reference_params is not None and self.loss_kwargs.get("beta", 0.0):
      rows["ref_logp"] = self.score(self.reference_params, batch)
    rows["train_mask"] = self.train_mask(rows)
    extra = {}
    if skipped is not None and skipped.num_rows:
      norm = losses.loss_normalizers(jnp.asarray(self.train_mask(_rows(skipped))))
      extra = dict(extra_tokens=float(norm.num_tokens), extra_sequences=float(norm.num_sequences))
    state, updates = ppo.ppo_phase(self.ppo_step, state, rows, epochs=self.ppo_epochs,
                                   mini_batches=self.ppo_mini_batches, rng=rng,
                                   put=self._put_update, mask_key="train_mask", **extra)
    merged = ppo.merge_update_metrics(updates)
    merged.update({f"consistency_{k}": float(v) for k, v in check._asdict().items()})
    return state, merged

  def sft(self, state: TrainState, batch: TurnBatch) -> tuple[TrainState, dict[str, float]]:
    """One teacher-forced step on the batch's action tokens (`loss_mask`)."""
    rows = ppo.with_normalizers(_rows(batch), "loss_mask")
    state, metrics = self.sft_step(state, self.put(rows))
    return state, ppo.merge_update_metrics([jax.device_get(metrics)])


def _rows(batch: TurnBatch) -> dict[str, np.ndarray]:
  """The batch's arrays, real rows only."""
  return {k: v[:batch.num_rows] for k, v in batch.arrays().items()}


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
      `num_sequences`, and optionally `ref_logp`; `adv` is `[N]` or per token `[N, La]`.
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
    weight = batch["weight"]
    # Per-token advantages `[N, La]` (OCSD) take the row weight on every token.
    adv = batch["adv"] * (weight if batch["adv"].ndim == 1 else weight[:, None])
  value, aux = rtpo_losses.policy_loss_fn(loss)(
    logp, batch["old_logp"], adv, batch["loss_mask"], ref_logp=batch.get("ref_logp"),
    entropy=entropy, num_tokens=batch["num_tokens"], num_sequences=batch["num_sequences"],
    **kwargs)
  return value, aux.additive()


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


BatchHook = Callable[[Any, Sequence[SampledTrajectory], TurnBatch],
                     tuple[TurnBatch, dict[str, float]]]


def grpo_step(state: TrainState, backend: Backend, starts: Sequence[EnvState], *,
              config: MethodConfig, rng: jax.Array, shuffle: np.random.Generator,
              batch_hook: BatchHook | None = None) -> StepOutput:
  """One step of flattened-trajectory or turn-level GRPO.

  G episodes per start state; A_i = the GRPO advantage of episode i's return within its
  prompt's group; flat: one row per episode (observations masked), turn: one row `c_k | a_k` per
  turn, each with its episode's A_i. One PPO phase. A step where every advantage is 0 is skipped
  when `config.skip_zero_advantage` (its policy gradient is exactly 0).

  `batch_hook(params, trajectories, batch) -> (batch, metrics)`, when given, rewrites the batch
  before the PPO phase (called with the rollout parameters), e.g. OCSD's per-token advantages
  (`methods.ocsd.Calibrator`); its metrics join the step's. A hook with a true
  `replaces_advantages` attribute (`methods.stage_credit`) computes advantages of its own: the
  zero-advantage skip then looks at the batch it returns, and a batch it left without rows
  (every rollout quarantined) is skipped too.
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
  replaces = bool(getattr(batch_hook, "replaces_advantages", False))
  if config.skip_zero_advantage and not replaces and not np.any(adv):
    metrics["train/num_updates"] = 0.0
    return StepOutput(state, metrics, tokens, [])
  if config.method == "flat_grpo":
    batch, num_cut = backend.flat_batch(trajectories, adv)
    metrics["train/flat_rows_cut"] = float(num_cut)
  else:
    turns = [t for traj in trajectories for t in traj.turns]
    turn_adv = [a for traj, a in zip(trajectories, adv, strict=True) for _ in traj.turns]
    batch = backend.turn_batch(turns, turn_adv)
  if batch_hook is not None:
    batch, extra = batch_hook(state.params, trajectories, batch)
    metrics.update(extra)
    if replaces and (batch.num_rows == 0 or (
        config.skip_zero_advantage and not np.any(batch.adv[:batch.num_rows]))):
      metrics["train/num_updates"] = 0.0
      return StepOutput(state, metrics, tokens, [])
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
      # The loss normalises by the boundary's whole batch of siblings (arXiv 2608.18682,
      # Eq. 6's 1/(G−1) per boundary): skipped siblings still count, so skipping them leaves
      # the gradient unchanged rather than scaling it by 1 / (1 − zero-advantage rate).
      dropped = np.flatnonzero(~keep)
      skipped = (backend.turn_batch([siblings[r].turns[0] for r in dropped],
                                    np.zeros(len(dropped), np.float32))
                 if len(dropped) else None)
      state, update = backend.ppo(state, batch, rng=shuffle, skipped=skipped)
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
  merged = ppo.merge_update_metrics(updates)
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
                config: MethodConfig, rng: jax.Array, shuffle: np.random.Generator,
                batch_hook: BatchHook | None = None) -> StepOutput:
  """`rtpo_step` or `grpo_step` (with `batch_hook`), as `config.method` says."""
  if config.method == "rtpo":
    if batch_hook is not None:
      raise ValueError("a batch hook (OCSD) needs a GRPO host, not rtpo")
    return rtpo_step(state, backend, starts, config=config, rng=rng, shuffle=shuffle)
  return grpo_step(state, backend, starts, config=config, rng=rng, shuffle=shuffle,
                   batch_hook=batch_hook)


def evaluate(backend: Backend, params, env: Env, indices: Sequence[int], *,
             split: str = "test", greedy: bool = True, rng: jax.Array | None = None
             ) -> dict[str, float]:
  """Rollouts of episodes `indices` of `split`: success rate, turns, tool calls, errors.

  Greedy by default; `greedy=False` samples at the backend's temperature with `rng` (success
  then estimates the training policy's own pass@1).
  """
  return multiturn.rollout_stats(evaluation_rollouts(backend, params, env, indices, split=split,
                                                     greedy=greedy, rng=rng))


def evaluation_rollouts(backend: Backend, params, env: Env, indices: Sequence[int], *,
                        split: str = "test", greedy: bool = True, rng: jax.Array | None = None
                        ) -> list[SampledTrajectory]:
  """The episodes `evaluate` scores, one trajectory per index (for per-episode outcomes)."""
  starts = [env.initial_state(i, split) for i in indices]
  rng = jax.random.key(0) if rng is None else rng
  return list(backend.rollout(params, starts, rng, greedy=greedy))


class RTPO:
  """Every mode of experiments/rtpo.py (configs/rtpo_*.py); a `training.loop.Method`.

  `config.method` is `sft` (the cold start on the env's demonstrations), one of `METHODS`, or
  one of turn_grpo's hooked modes: `ocsd` (`methods.ocsd.Calibrator`, `config.ocsd.*`),
  `temporal_grpo` / `stage_reward` (`methods.stage_credit.StageCredit`,
  `config.temporal_grpo.*`) or `canopy` (`methods.stage_credit.CanopyCredit`, `config.canopy.*`;
  its group-size pilot runs in `start` of a fresh run, and its metrics join the first step's)
  or `draco` / `draco_static` (`methods.rubric_credit.RubricCredit`, `config.draco.*`; its
  leniency draws come from `(config.seed, step)`) or `factor`
  (`methods.action_credit.ActionCredit`, `config.factor.*`; its continuations' tokens count in
  the budget).
  Each step draws its episodes from `(config.seed, step)` only, so a resumed run sees the same
  ones; the tokens generated for training add up in `budget/generated_tokens`, and the run
  stops once they reach `config.max_generated_tokens` (0: no budget), so methods compare at
  equal sampling budgets.
  """

  # RTPO's number of updates per step varies with the boundaries it trains; the schedule's
  # horizon is `config.steps` (the RL configs fix `config.optimizer.decay_steps` anyway).
  updates_per_step = 1

  def __init__(self, config):
    if config.method not in MODES:
      raise ValueError(f"config.method={config.method!r}; valid: {', '.join(MODES)}")
    self.config = config
    self.name = config.method
    self.sft_mode = config.method == SFT
    self.generated_tokens = 0  # tokens sampled for training so far (the budget's count)
    self.wall_s = 0.0  # seconds spent in steps so far, across restarts

  def build_model(self, run: loop.Run):
    config = self.config
    self.tokenizer = multiturn.build_tokenizer(config.tokenizer)
    try:
      self.env = get_env(config.env, **dict(config.env_knobs))
    except (KeyError, TypeError, ValueError) as e:
      raise ValueError(f"config.env / config.env_knobs: {e}") from None
    self.context = make_context(config.context.to_dict(), tokenizer=self.tokenizer)
    self.method = None
    self.ocsd = None
    self.canopy = None
    self.draco = None
    self.factor = None
    # Hook knobs are validated here, before the model is built: a bad knob fails in seconds.
    if config.method == OCSD:
      self.ocsd = ocsd_lib.OCSDConfig.from_config(config.ocsd.to_dict())
      self.ocsd.check_lengths(self.tokenizer, config.max_context_len)
    if config.method in stage_credit.STAGE_MODES:
      self._stage_knobs()
      self.env.stage_detectors(self.env.make_episode("train", 0))  # names an env without stages
    if config.method == CANOPY:
      if "canopy" not in config:
        raise ValueError("method=canopy needs config.canopy (configs/canopy.py)")
      self.canopy = stage_credit.CanopyConfig.from_config(config.canopy.to_dict())
      stage_credit.check_canopy_protocol(config.loss.to_dict(), ppo_epochs=config.ppo_epochs,
                                         ppo_mini_batches=config.ppo_mini_batches)
    if config.method in rubric_credit.DRACO_MODES:
      self.draco = rubric_credit.RubricConfig.from_config(
        config.draco.to_dict() if "draco" in config else None)
      self.env.stage_detectors(self.env.make_episode("train", 0))  # the judge's stages
    if config.method == FACTOR:
      self.factor = action_credit.FactorConfig.from_config(
        config.factor.to_dict() if "factor" in config else None)
      action_credit.check_factor_protocol(config.loss.to_dict())
    if not self.sft_mode:
      self.method = MethodConfig(
        method=OCSD_HOST if config.method in HOOK_MODES else config.method,
        group_size=config.group_size,
        trunks_per_prompt=config.trunks_per_prompt, advantage=config.advantage,
        advantage_eps=config.advantage_eps, continuation=config.continuation,
        rho_min=config.rho_min, rho_max=config.rho_max,
        skip_zero_advantage=config.skip_zero_advantage)
      # Flat GRPO's rows are fixed; turn rows and RTPO's siblings vary per step, and
      # `ppo.ppo_mini_batches` names the key where a step's rows do not divide.
      rows = config.prompts_per_step * config.group_size
      if config.method == "flat_grpo" and rows % config.ppo_mini_batches:
        raise ValueError(f"config.ppo_mini_batches={config.ppo_mini_batches} must divide the "
                         f"{rows} episodes of a step (prompts_per_step × group_size)")
    # Built from where the run first started: a workdir restart of a run initialised from
    # Hugging Face weights must start (and copy its references) from those weights.
    first = run_setup.start_point(config, str(run.workdir), ignore_workdir=True)
    self.model = run_setup.build_model(config, self.tokenizer, first, run.train_mesh,
                                       run.train_rules)
    logging.info("%s on %s (K=%d)", config.method, config.env, self.env.horizon)
    return self.model

  def start(self, run: loop.Run, state) -> None:
    config, placement = self.config, run.placement
    self.run = run
    # The reference of a KL term is the starting policy (the SFT one), also after a restart.
    reference = jax.tree.map(jnp.copy, state.params) if config.loss.beta > 0 else None
    self.learner = Learner(
      self.model, self.tokenizer, run.optimizer, env=self.env, context=self.context,
      loss=config.loss.name, loss_kwargs={k: v for k, v in config.loss.items() if k != "name"},
      max_turn_tokens=config.max_turn_tokens, max_context_len=config.max_context_len,
      flat_len=config.flat_len, temperature=config.temperature, top_k=config.top_k,
      top_p=config.top_p, num_micro_batches=config.num_micro_batches,
      ppo_epochs=config.ppo_epochs, ppo_mini_batches=config.ppo_mini_batches,
      reference_params=reference, add_bos=config.add_bos, bucket_widths=config.bucket_widths,
      sampler_batch_buckets=tuple(config.sampler_batch_buckets),
      sampler_len_buckets=tuple(config.sampler_len_buckets), mesh=run.train_mesh,
      rules=run.train_rules, sample_mesh=placement.sample_mesh,
      sample_rules=placement.sample_rules)
    self.rng = jax.random.key(config.seed + 1)
    self.batch_hook = None
    self.pilot = {}
    if self.ocsd is not None:
      self.batch_hook = ocsd_lib.Calibrator(self.learner, self.tokenizer, config.max_context_len,
                                            self.ocsd)
    if config.method in stage_credit.STAGE_MODES:
      self.batch_hook = stage_credit.StageCredit(env=self.env, group_size=config.group_size,
                                                 mode=config.method, advantage=config.advantage,
                                                 **self._stage_knobs())
    if self.canopy is not None:
      self.batch_hook = stage_credit.CanopyCredit(group_size=config.group_size,
                                                  config=self.canopy)
      if run.start.kind not in ("workdir", "resume"):
        # CANOPY sizes groups once, on the starting policy (a resumed run was checked then):
        # p̂ from sampled pilot episodes of the train split, at the training temperature.
        pilot = evaluate(self.learner, state.params, self.env, range(self.canopy.pilot_episodes),
                         split="train", greedy=False, rng=jax.random.key(config.seed + 3))
        self.pilot = stage_credit.check_canopy_group_size(config.group_size, pilot["success"],
                                                          config=self.canopy)
    if self.draco is not None:
      self.batch_hook = rubric_credit.RubricCredit(
        env=self.env, group_size=config.group_size, mode=config.method, config=self.draco,
        advantage=config.advantage, advantage_eps=config.advantage_eps, seed=config.seed)
    if self.factor is not None:
      self.batch_hook = action_credit.ActionCredit(
        backend=self.learner, tokenizer=self.tokenizer, max_context_len=config.max_context_len,
        group_size=config.group_size, total_steps=self.factor.eta_steps or config.steps,
        config=self.factor,
        seed=config.seed)

  def _stage_knobs(self) -> dict[str, float]:
    """`config.temporal_grpo` (its `eps`), checked."""
    knobs = self.config.get("temporal_grpo")
    knobs = {} if knobs is None else knobs.to_dict()
    unknown = sorted(set(knobs) - {"eps"})
    if unknown:
      raise ValueError(f"unknown config.temporal_grpo keys {unknown}; valid: eps")
    return {"eps": float(knobs.get("eps", self.config.advantage_eps))}

  def state_dict(self) -> dict[str, Any]:
    return {"generated_tokens": self.generated_tokens, "wall_s": self.wall_s}

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    self.generated_tokens = int(state.get("generated_tokens", 0))
    self.wall_s = float(state.get("wall_s", 0.0))

  def done(self, step: int) -> bool:
    del step
    budget = self.config.max_generated_tokens
    return bool(budget) and self.generated_tokens >= budget

  def episodes(self, step: int) -> list[int]:
    """Training episode indices of `step`: a function of (seed, step) only."""
    config = self.config
    size = config.episodes_per_step if self.sft_mode else config.prompts_per_step
    draw = np.random.default_rng([config.seed, step])
    return [int(i) for i in draw.choice(config.num_train_episodes, size=size, replace=False)]

  def step(self, state, step: int):
    config, learner = self.config, self.learner
    tic = time.perf_counter()
    indices = self.episodes(step)
    if self.sft_mode:
      turns = multiturn.demonstration_turns(self.env, indices, tokenizer=self.tokenizer,
                                            context=self.context,
                                            max_context_len=config.max_context_len,
                                            add_bos=config.add_bos)
      state, update = learner.sft(state, learner.turn_batch(turns, np.zeros(len(turns))))
      record = {f"train/{k}": v for k, v in update.items()}
      step_tokens = 0
    else:
      hook = self.batch_hook
      if isinstance(hook, rubric_credit.RubricCredit):
        hook = hook.at_step(step)  # DRACO's leniency draws
      elif isinstance(hook, action_credit.ActionCredit):
        # FACTOR's continuations and η; a budgeted run anneals η over its budget, which ends
        # it long before `config.steps` (continuations take most of its tokens).
        budget = config.max_generated_tokens
        hook = hook.at_step(step, self.generated_tokens / budget if budget else None)
      out = method_step(
        state, learner, [self.env.initial_state(i, "train") for i in indices],
        config=self.method, rng=jax.random.fold_in(self.rng, step),
        shuffle=np.random.default_rng([config.seed, step, 1]), batch_hook=hook)
      state, record, step_tokens = out.state, out.metrics, out.generated_tokens
      # FACTOR's Monte-Carlo continuations are sampling for training too.
      step_tokens += int(record.get("factor/continuation_tokens", 0))
      # The CANOPY pilot's numbers, once per fresh run, with its first step.
      record.update(self.pilot)
      self.pilot = {}
    self.generated_tokens += step_tokens
    elapsed = time.perf_counter() - tic
    self.wall_s += elapsed
    record.update({"budget/generated_tokens": self.generated_tokens,
                   "budget/step_tokens": step_tokens, "time/step": elapsed,
                   "time/wall": self.wall_s})
    if self.done(step) and jax.process_index() == 0:
      print(f"generated-token budget reached: {self.generated_tokens} >= "
            f"{config.max_generated_tokens} after step {step}")
    return state, record

  def evaluate(self, state, step: int) -> dict[str, float]:
    config = self.config
    tic = time.perf_counter()
    indices = range(config.eval_episodes)
    greedy = evaluation_rollouts(self.learner, state.params, self.env, indices,
                                 split=config.eval_split)
    record = {f"eval/{k}": v for k, v in multiturn.rollout_stats(greedy).items()}
    # Per-episode success, so that two runs on the same held-out episodes compare paired.
    outcomes = {"greedy_success": [float(t.success) for t in greedy]}
    if config.eval_sampled:
      # The same key at every evaluation, so the curve is not noisier than the policy.
      sampled = evaluation_rollouts(self.learner, state.params, self.env, indices,
                                    split=config.eval_split, greedy=False,
                                    rng=jax.random.key(config.seed + 2))
      record.update({f"eval/sampled_{k}": v
                     for k, v in multiturn.rollout_stats(sampled).items()})
      outcomes["sampled_success"] = [float(t.success) for t in sampled]
    write_eval_outcomes(self.run.workdir, step, **outcomes)
    record["eval/time"] = time.perf_counter() - tic
    record["budget/generated_tokens"] = self.generated_tokens
    return record

  def progress(self, record):
    shown = {"success": record.get("rollout/success"), "nll": record.get("train/nll"),
             "tokens": self.generated_tokens}
    return {k: v for k, v in shown.items() if v is not None}

  def summary(self, records) -> str:
    line = loop.eval_summary(records, "eval/success", "held-out greedy success")
    if not line:
      return ""
    return (f"{self.config.method} K={self.env.horizon}: {line} ({self.generated_tokens} "
            f"generated tokens, {self.wall_s:.0f} s)")
