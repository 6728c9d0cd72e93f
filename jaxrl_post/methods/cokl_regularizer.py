"""CoKL (arXiv 2608.01743) in a GRPO-family step: the correctness-conditioned KL regulariser.

`config.regularizer.name = "cokl"` adds to the GRPO loss (which then has no other KL term)

  L_CoKL = β · mean_x [ −(1/|𝓡_x|) Σ_{y∈𝓡_x} log π_θ(y|x) + Σ_{y∈𝒞_x} w_y log π_θ(y|x) ]

(`losses.cokl_loss`): 𝓡_x are verified-correct answers of the frozen *reference* (the starting
policy), sampled once per prompt and cached; 𝒞_x are the verified-correct rollouts of this step's
group on x, w_y their self-normalised clipped sequence ratios. The first term keeps the
reference's correct answers likely; the second removes the pull on the *total* mass of correct
answers, so only their relative allocation is constrained (plasticity is kept).

Anchor prompts are the step's own training prompts (PROPOSAL: the paper also allows prompts of a
prior capability). The first time a pool prompt is drawn, `ref_samples` completions of the
reference are sampled (padded to a fixed number of prompts, so one shape compiles) and the
first `per_prompt` correct ones are cached; a prompt whose reference samples were all wrong is
not sampled again and contributes nothing. The cache, and which prompts were tried, are the
method's checkpointed arrays.

In the update the loss scores a second block, `cokl_*` keys with the step's prompts on the
leading axis: for each prompt its `per_prompt` cached answers, then its `group_size` rollouts.
Micro-batches split that block by prompts (`prompts_per_step` must divide by
`num_micro_batches`), and each micro-batch's CoKL term is rescaled by its share of the step's
active prompts (`cokl_num_active`, a shared key), so micro-batches add up to the whole step's
term. The PPO phase must be one mini-batch (`ppo_mini_batches = 1`): the block is per prompt,
not per rollout row.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_post import losses
from jaxrl_post.rewards.verifiers import rewards_for
from jaxrl_post.sampling import score_model

REGULARIZER_NAMES = ("none", "cokl")


def _fit_width(x: np.ndarray, width: int, fill) -> np.ndarray:
  if x.shape[-1] >= width:
    return x[..., :width]
  pad = [(0, 0)] * (x.ndim - 1) + [(0, width - x.shape[-1])]
  return np.pad(x, pad, constant_values=fill)


class CoKLRegularizer:
  """CoKL's reference-answer cache, its batch block and its loss term; see the module docstring."""

  # The block's keys; `cokl_num_active` is one number for the whole step (not split).
  shared_keys = ("cokl_num_active",)

  def __init__(self, config):
    knobs = config.regularizer
    if config.loss.beta > 0:
      raise ValueError("config.regularizer.name='cokl' replaces the reference KL: set "
                       "config.loss.beta = 0")
    if config.ppo_mini_batches != 1:
      raise ValueError(f"config.regularizer.name='cokl' needs config.ppo_mini_batches = 1, got "
                       f"{config.ppo_mini_batches} (its block is per prompt, not per row)")
    if config.prompts_per_step % config.num_micro_batches:
      raise ValueError(f"config.num_micro_batches ({config.num_micro_batches}) must divide "
                       f"config.prompts_per_step ({config.prompts_per_step}) with CoKL")
    for key in ("per_prompt", "ref_samples"):
      if knobs[key] < 1:
        raise ValueError(f"config.regularizer.{key} must be >= 1, got {knobs[key]}")
    if knobs.prompt_mean not in losses.cokl.PROMPT_MEANS:
      raise ValueError(f"config.regularizer.prompt_mean={knobs.prompt_mean!r}; valid: "
                       f"{', '.join(losses.cokl.PROMPT_MEANS)}")
    self.config, self.knobs = config, knobs
    self.cache = losses.reference_answers_init(
      num_prompts=config.num_train_examples, per_prompt=knobs.per_prompt,
      length=config.max_new_tokens)
    self.tried = np.zeros(config.num_train_examples, bool)
    self.reference = None

  # ---- the loss ----

  def wrap_loss(self, policy_loss):
    """`policy_loss` plus the CoKL term over the batch's `cokl_*` block."""
    knobs, temperature, nr = self.knobs, self.config.temperature, self.knobs.per_prompt

    def loss(model, batch):
      value, aux = policy_loss(model, batch)
      b, n, t = batch["cokl_tokens"].shape
      mask = batch["cokl_mask"]
      scored = score_model(model, jnp.repeat(batch["cokl_prompt_tokens"], n, axis=0),
                           jnp.repeat(batch["cokl_prompt_mask"], n, axis=0),
                           batch["cokl_tokens"].reshape(b * n, t), mask.reshape(b * n, t),
                           temperature=temperature)
      seq = losses.sequence_logp(scored.logp, mask.reshape(b * n, t)).reshape(b, n)
      reg, reg_aux = losses.cokl_loss(
        seq[:, :nr], batch["cokl_ref_mask"], seq[:, nr:], batch["cokl_old_logp"],
        batch["cokl_correct"], beta=knobs.beta, eps=knobs.eps, normalise=knobs.normalise,
        prompt_mean=knobs.prompt_mean)
      # This micro-batch's share of the step's mean over active prompts: micro-batches add up.
      reg = reg * reg_aux.num_active / jnp.maximum(batch["cokl_num_active"], 1.0)
      return value + reg, dict(aux, cokl_loss=reg)

    return loss

  # ---- the reference answers ----

  def start(self, method, state) -> None:
    """Keeps the starting policy as the frozen reference (its answers are sampled lazily)."""
    del method
    self.reference = jax.tree.map(jnp.copy, state.params)

  def transform(self, method, state, batch, ctx):
    """The `step_parts` hook: caches new prompts' reference answers, adds the `cokl_*` block."""
    del state
    metrics = self.prepare(method, ctx.records, ctx.step)
    return batch | self.block(ctx.fresh, ctx.records, ctx.verified.correct), metrics

  def prepare(self, method, records, step: int) -> dict[str, float]:
    """Samples and caches the reference answers of the step's prompts not tried before."""
    pool = np.asarray([int(r["index"]) for r in records])
    new = [i for i, p in enumerate(pool) if not self.tried[p]]
    if not new:
      return {"cokl/ref_prompts_sampled": 0.0}
    tic = time.perf_counter()
    k, config = self.knobs.ref_samples, self.config
    # Padded with repeats to the step's prompt count: one compiled shape for every call.
    chosen = [records[i] for i in new] + [records[new[-1]]] * (len(records) - len(new))
    params = method.evaluator.sampler_params(self.reference)[0]
    out = method.sampler.generate(
      params, [r["prompt"] for r in chosen], n_samples_per_prompt=k,
      max_new_tokens=config.max_new_tokens, temperature=config.temperature,
      rng=jax.random.fold_in(jax.random.key(config.seed + 11), step))
    correct, _, _ = rewards_for(method.task, chosen, method.sampler.decode_text(out), k,
                                timeout_s=config.reward_timeout_s)
    tokens = _fit_width(np.asarray(jax.device_get(out.completion_tokens)),
                        config.max_new_tokens, 0)
    mask = _fit_width(np.asarray(jax.device_get(out.completion_mask)),
                      config.max_new_tokens, False)
    for j, i in enumerate(new):
      rows = slice(j * k, (j + 1) * k)
      self.cache = losses.reference_answers_put(
        self.cache, int(pool[i]), tokens[rows], mask[rows], np.nan_to_num(correct[rows]) > 0.5)
      self.tried[pool[i]] = True
    return {"cokl/ref_prompts_sampled": float(len(new)),
            "cokl/ref_accuracy": float(np.nanmean(correct[:len(new) * k])),
            "time/cokl_reference": time.perf_counter() - tic}

  # ---- the batch block ----

  def block(self, fresh: Mapping[str, Any], records, correct: np.ndarray) -> dict[str, Any]:
    """The `cokl_*` keys of the step: cached answers then rollouts per prompt."""
    g, b = self.config.group_size, len(records)
    pool = np.asarray([int(r["index"]) for r in records])
    ref = losses.reference_answers_get(self.cache, pool)
    width = max(np.shape(fresh["completion_tokens"])[1], 1)
    ref_mask = np.asarray(ref.mask)
    longest = int(ref_mask.any(axis=(0, 1)).nonzero()[0].max(initial=-1)) + 1
    multiple = self.config.trim_completions_to or 1
    width = min(max(width, -(-longest // multiple) * multiple), self.config.max_new_tokens)
    rollout_tokens = _fit_width(np.asarray(fresh["completion_tokens"]), width, 0)
    rollout_mask = _fit_width(np.asarray(fresh["completion_mask"]), width, False)
    tokens = np.concatenate([_fit_width(np.asarray(ref.tokens), width, 0),
                             rollout_tokens.reshape(b, g, width)], axis=1)
    mask = np.concatenate([_fit_width(ref_mask, width, False),
                           rollout_mask.reshape(b, g, width)], axis=1)
    old = np.where(np.asarray(fresh["completion_mask"]), np.asarray(fresh["old_logp"]), 0.0)
    correct = np.nan_to_num(np.asarray(correct, np.float32)).reshape(b, g) > 0.5
    answer_mask = np.asarray(ref.answer_mask)
    if self.knobs.prompt_mean == "reference":
      active = answer_mask.any(axis=1)
    elif self.knobs.prompt_mean == "any":
      active = answer_mask.any(axis=1) | correct.any(axis=1)
    else:
      active = np.ones(b, bool)
    return {"cokl_prompt_tokens": np.asarray(fresh["prompt_tokens"])[::g],
            "cokl_prompt_mask": np.asarray(fresh["prompt_mask"])[::g],
            "cokl_tokens": tokens.astype(np.int32), "cokl_mask": mask,
            "cokl_ref_mask": answer_mask, "cokl_correct": correct,
            "cokl_old_logp": old.sum(axis=1).reshape(b, g).astype(np.float32),
            "cokl_num_active": np.float32(active.sum())}

  def array_state(self) -> dict[str, Any]:
    return {"tokens": np.asarray(self.cache.tokens), "mask": np.asarray(self.cache.mask),
            "count": np.asarray(self.cache.count), "tried": self.tried}

  def load_array_state(self, arrays: Mapping[str, Any]) -> None:
    self.cache = losses.ReferenceAnswers(jnp.asarray(arrays["tokens"]),
                                         jnp.asarray(arrays["mask"]),
                                         jnp.asarray(arrays["count"]))
    self.tried = np.asarray(arrays["tried"], bool)


def build_regularizer(config):
  """The configured regulariser (`config.regularizer.name`), or None ("none")."""
  knobs = config.get("regularizer")
  name = "none" if knobs is None else knobs.name
  if name not in REGULARIZER_NAMES:
    raise ValueError(f"config.regularizer.name={name!r}; valid: {', '.join(REGULARIZER_NAMES)}")
  return CoKLRegularizer(config) if name == "cokl" else None
