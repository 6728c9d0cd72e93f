"""ICE: instruction-conditioned exploration with self-distillation to the unconditioned policy
(arXiv 2608.02087), a `training.loop.Method` on the DAPO backbone (configs/ice.py).

One set of weights plays teacher and student: the teacher is the policy conditioned on a
behavioural instruction, π^T_θ = π_θ(·|x, I), the student the same policy on the bare prompt,
π^S_θ = π_θ(·|x) (what is deployed and evaluated). The paper's headline "filtered"
configuration (α = 1):

    J_filt(θ) = J^R_T(θ) − β_S · D_KL( sg[π^{T+}] ‖ π^S_θ )

    J^R_T: DAPO (token-mean, ε_low 0.2, ε_high 0.28) on the conditioned rollouts, the GRPO
           advantage over each prompt's group, log-probs under each row's OWN prompt x ⊕ I_c;
    D_KL = (1 / Σ w) Σ_{i,t} w_{i,t} Σ_{v ∈ S_{i,t}} p^T(v) (log p^T(v) − log p^S(v)),
           p^T = π_old(·|x, I_{c_i}, y_<t),  p^S = π_θ(·|x, y_<t),
           w_{i,t} = m_{i,t} · 1[R_i = 1] · 1[c_i > 0]

(`losses.ice_filtered_forward_kl`; `config.ice.kl="nll"` takes `losses.ice_nll_surrogate`
instead: −log π^S_θ(y_t|x, y_<t) on the same kept tokens, the one-sample estimate of the same
gradient, no teacher distribution needed).

One step (`ICE.step`), read top to bottom:

  1. `prompts_per_step` prompts; each gets `group_size` rows, row r of group g under context
     c = `losses.assign_contexts(...)` (0: the bare prompt x; j: "I_j\\nx", instruction j of
     `config.ice.instructions` on its own line before the question, so the prompt still ends
     where the answer starts);
  2. one completion per row from the sampler (the rows' prompts differ, so each row is its
     own prompt: `n_samples_per_prompt=1`; `group_ids` = the prompt, not the row);
  3. verifier rewards; the GRPO advantage over each prompt's `group_size` rows, whatever their
     contexts (one group, as in the paper's DAPO groups);
  4. the trainer scores the conditioned rows once: `old_logp` and, for `kl="forward"`, the
     teacher's top-K ids and log-probs `[B, T, K]` (K = `config.ice.top_k`, 0 = the whole
     vocabulary); the bare prompts are re-tokenised left-padded to the conditioned width;
  5. `ppo_epochs × ppo_mini_batches` updates of `make_ice_loss`: the PPO loss on the
     conditioned layout plus β_S times the KL term, whose student side is a second forward
     pass of the SAME completion tokens under the bare prompt.

Design choices (PROPOSAL unless the paper says):

  * Teacher = the ROLLOUT (old) parameters' conditioned distribution, precomputed by the
    scorer after rollout. The paper's teacher is sg[π_θ(·|x, I)]: the same on the first
    update of a step, at most `updates_per_step − 1` updates stale afterwards (the policy's
    own PPO ratio has the same lag); it costs no third forward pass in the update, and the
    conditioned pass of the loss stays the plain PPO one.
  * Support: the full vocabulary for small vocabularies (`top_k=0`; the char tokenizer's
    ~100 ids, renormalize=False) and the teacher's top-K for real ones (`top_k=K`,
    renormalize=True over those K ids for both sides). The student's log-probs of the K ids
    come from `sampling.score_model(candidate_ids=...)`, chunked over time and recomputed in
    the backward pass: memory is the policy loss's (rows × chunk × V per chunk) plus
    `[B, T, K]` arrays; no `[B, T, V]` tensor exists unless K = V, which is refused above
    `FULL_VOCAB_LIMIT` ids (set `top_k`, or `kl="nll"`).
  * Rows without an instruction (c = 0) are not distilled: under the paper's same-weights
    teacher their KL is exactly 0, and with the old-parameters teacher they would only add a
    trust-region pull toward π_old; they are also left out of the normaliser Σ w.
  * Normaliser: Σ w over the whole mini-batch (`ice_kept_total`, shared by its
    micro-batches), so accumulated micro-batches equal the single-batch loss.
  * The correctness filter reads `config.ice.filter_reward` ("correct", the binary verifier
    reward of the paper; "format" exists for smoke tests whose policies are never correct)
    at `config.ice.correct_reward` = 1; `correct_reward=0` keeps every conditioned row (the
    paper's "unfiltered" ablation). Bare rows carry a NaN filter reward (`distill_rewards`),
    so no threshold keeps them.
  * Sampling: each row is its own prompt (no prompt prefix shared by a group in the KV
    cache), so prefill costs G× a GRPO step's; the decode is the same.
  * Not implemented: DAPO's dynamic sampling (groups with equal rewards have Â = 0 and only
    dilute the token mean; no resampling) and overlong shaping (the arithmetic budget cuts a
    completion before its answer line, which already earns 0).

Evaluation: the bare prompts (`eval/accuracy`, `eval/pass_at_k`, ...: the deployed student),
and with `config.ice.eval_with_instructions` the greedy accuracy under each instruction
(`eval/accuracy_instruction/<j>`, mean `eval/accuracy_with_instructions`).

Metrics: `ice/kl` (forward: the term's value; nll: the sampled-token estimate
mean(old_logp − logp^S) of the same forward KL), `ice/kept_tokens`, `ice/correct_frac`,
`ice/distilled_frac`, `ice/reward_by_context/<j>`, `ice/reward_with_instruction`,
`ice/reward_without_instruction`. Method state: the data position (contexts are drawn from
(seed, step), so a resumed run draws the same).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from jaxrl_post import losses
from jaxrl_post.methods.grpo import (
  ROLLOUT_KEYS,
  global_records,
  policy_objective,
  policy_runtime,
  sample_groups,
  step_record,
  task_loader,
  verify_groups,
)
from jaxrl_post.parallel import multihost
from jaxrl_post.parallel.mesh import put_batch
from jaxrl_post.sampling import score_model
from jaxrl_post.tokenizers import pad_batch
from jaxrl_post.training import loop, ppo
from jaxrl_post.training import setup as run_setup
from jaxrl_post.training.evaluation import evaluate

KL_MODES = ("forward", "nll")
FILTER_REWARDS = ("correct", "format")
INSTRUCTION_SEPARATOR = "\n"
# The whole mini-batch's kept-token count Σ w: a global normaliser like `num_tokens`.
KEPT_TOTAL = "ice_kept_total"
# Above this many ids the teacher's support must be a top-K (`config.ice.top_k`): the whole
# vocabulary would be a `[rows, time, vocab]` array on the host and in every mini-batch.
FULL_VOCAB_LIMIT = 4096


def active_instructions(config) -> tuple[str, ...]:
  """The instructions in use: the first `config.ice.num_instructions` (−1: all)."""
  instructions = tuple(config.ice.instructions or ())
  n = int(config.ice.num_instructions)
  return instructions if n < 0 else instructions[:n]


def validate_ice(config) -> tuple[str, ...]:
  """Checks `config.ice` before anything is built; returns the active instructions.

  Raises:
    ValueError: naming the key: an unknown `kl` or `filter_reward`, β_S < 0, `top_k` < 0,
      `num_instructions` beyond the list, an empty or non-string instruction, or β_S > 0 with
      no instruction (the KL has no teacher: use β_S = 0 for the DAPO baseline).

  Examples:
    >>> import ml_collections
    >>> c = ml_collections.ConfigDict(dict(ice=dict(kl="forward", beta=0.1, top_k=0,
    ...     instructions=("Check carries.",), num_instructions=-1, filter_reward="correct",
    ...     correct_reward=1.0)))
    >>> validate_ice(c)
    ('Check carries.',)
  """
  ice = config.ice
  if ice.kl not in KL_MODES:
    raise ValueError(f"config.ice.kl={ice.kl!r} is unknown; known: {', '.join(KL_MODES)}")
  if ice.filter_reward not in FILTER_REWARDS:
    raise ValueError(f"config.ice.filter_reward={ice.filter_reward!r} is unknown; known: "
                     f"{', '.join(FILTER_REWARDS)}")
  if not float(ice.beta) >= 0.0:
    raise ValueError(f"config.ice.beta={ice.beta} must be >= 0 (0: no distillation)")
  if int(ice.top_k) < 0:
    raise ValueError(f"config.ice.top_k={ice.top_k} must be >= 0 (0: the whole vocabulary)")
  instructions = tuple(ice.instructions or ())
  for j, text in enumerate(instructions, start=1):
    if not isinstance(text, str) or not text.strip():
      raise ValueError(f"config.ice.instructions[{j - 1}]={text!r} must be a non-empty string")
  n = int(ice.num_instructions)
  if n > len(instructions):
    raise ValueError(f"config.ice.num_instructions={n} but config.ice.instructions has only "
                     f"{len(instructions)}")
  active = active_instructions(config)
  if float(ice.beta) > 0 and not active:
    raise ValueError(f"config.ice.beta={ice.beta} distils instruction-conditioned rollouts, "
                     "but no instruction is active: config.ice.instructions is empty (or "
                     "config.ice.num_instructions=0); add instructions, or set "
                     "config.ice.beta=0 for the DAPO baseline")
  return active


def conditioned_prompt(prompt: str, instruction: str | None) -> str:
  """x ⊕ I: the instruction on its own line before the prompt (which ends where the answer
  starts); the bare prompt for no instruction.

  Examples:
    >>> conditioned_prompt("Q: 1+2=\\n", "Check carries."), conditioned_prompt("Q: 1+2=\\n", None)
    ('Check carries.\\nQ: 1+2=\\n', 'Q: 1+2=\\n')
  """
  return prompt if not instruction else f"{instruction}{INSTRUCTION_SEPARATOR}{prompt}"


def context_prompts(prompts: Sequence[str], contexts: np.ndarray,
                    instructions: Sequence[str]) -> list[str]:
  """One prompt per rollout row (group-major): prompt g ⊕ I_{c} for row g·G + r.

  `contexts` is `losses.assign_contexts`' `int[groups · G]` (0 = no instruction).

  Examples:
    >>> context_prompts(["a", "b"], np.array([0, 1, 1, 0]), ["I"])
    ['a', 'I\\na', 'I\\nb', 'b']
  """
  contexts = np.asarray(contexts)
  if len(contexts) % max(len(prompts), 1):
    raise ValueError(f"{len(contexts)} contexts for {len(prompts)} prompts: need G per prompt")
  group_size = len(contexts) // max(len(prompts), 1)
  if contexts.size and (contexts.min() < 0 or contexts.max() > len(instructions)):
    raise ValueError(f"contexts must be in [0, {len(instructions)}]")
  return [conditioned_prompt(prompts[i // group_size],
                             instructions[c - 1] if c > 0 else None)
          for i, c in enumerate(contexts.tolist())]


def distill_rewards(filter_reward: np.ndarray, contexts: np.ndarray) -> np.ndarray:
  """`float32[B]` the reward the KL's filter reads: R_i on conditioned rows (c_i > 0), NaN on
  bare rows (never distilled, whatever the threshold: `losses.correct_token_weights` keeps no
  NaN row) and where the verifier failed.

  Examples:
    >>> distill_rewards(np.array([1.0, 0.0, np.nan]), np.array([0, 2, 1])).tolist()
    [nan, 0.0, nan]
  """
  r = np.asarray(filter_reward, np.float32)
  return np.where(np.asarray(contexts) > 0, r, np.nan).astype(np.float32)


def kept_total(batch: Mapping[str, Any], correct_reward: float) -> np.float32:
  """Σ w = the kept (correct, conditioned) completion tokens of `batch`."""
  w = losses.correct_token_weights(batch["ice_rewards"], batch["completion_mask"],
                                   correct_reward=correct_reward)
  return np.float32(np.asarray(w).sum())


def make_ice_loss(rl_loss, *, beta: float, kl: str = "forward", temperature: float = 1.0,
                  correct_reward: float = 1.0, renormalize: bool = False):
  """`(model, batch) -> (loss, aux)`: the PPO loss plus β_S times the filtered distillation term.

    loss = rl_loss(model, batch) + β_S · (Σ_micro w / Σ_batch w) · D   (D as in the module
    docstring; the share makes micro-batches add up to the mini-batch's term)

  Args:
    rl_loss: the DAPO objective on the conditioned layout
      (`training.objectives.make_policy_loss`, e.g. `methods.grpo.policy_objective`'s).
    beta: β_S; 0 returns `rl_loss` itself (no second forward pass).
    kl: "forward" (`losses.ice_filtered_forward_kl` over the batch's teacher support) or
      "nll" (`losses.ice_nll_surrogate`).
    temperature: the sampling temperature (divides the student's logits, as the teacher's).
    correct_reward: the filter's threshold R ≥ correct_reward.
    renormalize: renormalise both distributions over a truncated (top-K) support.

  Batch keys (besides `rl_loss`'s): `uncond_prompt_tokens` / `uncond_prompt_mask`
  `[B, P']` (the bare prompts, left-padded: completion position t of both layouts predicts the
  same token), `ice_rewards` `[B]` (`distill_rewards`), `ice_kept_total` (shared scalar);
  forward KL: `ice_teacher_ids` int32 `[B, T, K]`, `ice_teacher_logp` `[B, T, K]`.

  Aux (summed over micro-batches like the loss): `ice_term` (the D above, this micro-batch's
  share), `ice_kl` (forward: = `ice_term`; nll: the sampled-token estimate of the forward KL,
  Σ w (old_logp − logp^S) / Σ w), `ice_kept_tokens`.
  """
  if kl not in KL_MODES:
    raise ValueError(f"kl={kl!r} is unknown; known: {', '.join(KL_MODES)}")
  if beta == 0:
    return rl_loss

  def loss(model, batch):
    value, aux = rl_loss(model, batch)
    mask, rewards = batch["completion_mask"], batch["ice_rewards"]
    forward = kl == "forward"
    # The extra pass: the SAME completion tokens after the bare prompt. Gradients reach the
    # parameters only through it; the teacher is data (and stop-gradient in the pure loss).
    student = score_model(model, batch["uncond_prompt_tokens"], batch["uncond_prompt_mask"],
                          batch["completion_tokens"], mask, temperature=temperature,
                          candidate_ids=batch["ice_teacher_ids"] if forward else None)
    w = losses.correct_token_weights(rewards, mask, correct_reward=correct_reward)
    kept = w.sum()
    share = kept / jnp.maximum(batch[KEPT_TOTAL], 1.0)
    if forward:
      term, _ = losses.ice_filtered_forward_kl(
        batch["ice_teacher_logp"], student.candidate_logp, rewards, mask,
        correct_reward=correct_reward, renormalize=renormalize)
      estimate = term
    else:
      term = losses.ice_nll_surrogate(student.logp, rewards, mask,
                                      correct_reward=correct_reward)
      gap = jnp.where(w > 0, batch["old_logp"] - student.logp, 0.0)
      estimate = (gap * w).sum() / jnp.maximum(kept, 1.0)
    term = term * share
    aux = dict(aux, ice_term=jax.lax.stop_gradient(term),
               ice_kl=jax.lax.stop_gradient(estimate * share), ice_kept_tokens=kept)
    return value + beta * term, aux

  return loss


class ICE:
  """ICE on `config.task` (configs/ice.py); a `training.loop.Method`."""

  name = "ice"

  def __init__(self, config):
    self.config = config
    self.instructions = validate_ice(config)
    ice = config.ice
    self.beta, self.kl = float(ice.beta), str(ice.kl)
    self.correct_reward = float(ice.correct_reward)
    self.updates_per_step = config.ppo_epochs * config.ppo_mini_batches
    self.data_iter = None
    if self.instructions and config.group_size < len(self.instructions) + 1:
      logging.warning("ice: group_size %d < %d contexts: a group does not see every context",
                      config.group_size, len(self.instructions) + 1)

  # ---- set-up ----

  def build_model(self, run: loop.Run):
    config = self.config
    self.task, self.tokenizer, _, model = run_setup.build_run(
      config, str(run.workdir), run.train_mesh, run.train_rules)
    for j, text in enumerate(self.instructions):
      try:
        ids = self.tokenizer.encode(conditioned_prompt("", text))
      except (KeyError, ValueError) as e:
        raise ValueError(f"config.ice.instructions[{j}]={text!r}: the tokenizer cannot encode "
                         f"it: {e}") from None
      if len(ids) >= config.prompt_len:
        raise ValueError(f"config.ice.instructions[{j}] is {len(ids)} tokens; with the "
                         f"question it must fit config.prompt_len={config.prompt_len}")
    vocab = model.config.vocab_size
    k = int(config.ice.top_k)
    if self.beta > 0 and self.kl == "forward" and k == 0 and vocab > FULL_VOCAB_LIMIT:
      raise ValueError(f"config.ice.top_k=0 (the whole vocabulary) with {vocab} ids would hold "
                       "[rows, time, vocab] teacher arrays; set config.ice.top_k (e.g. 64) or "
                       "config.ice.kl='nll'")
    self.teacher_k = vocab if k == 0 or k >= vocab else k
    self.objective = policy_objective(config)
    self.loss_fn = make_ice_loss(self.objective.loss_fn, beta=self.beta, kl=self.kl,
                                 temperature=config.temperature,
                                 correct_reward=self.correct_reward,
                                 renormalize=self.teacher_k < vocab)
    self.model = model
    return model

  def start(self, run: loop.Run, state) -> None:
    config = self.config
    self.run = run
    # The scorer gives the old policy's log-probs (= the KL's teacher) on the trainer's mesh.
    self.runtime = policy_runtime(run, config, self.model, self.tokenizer, self.task,
                                  self.loss_fn, shared=(KEPT_TOTAL,) if self.beta > 0 else ())
    self.step_fn, self.sampler, self.scorer, self.evaluator = self.runtime
    self.data_iter = iter(task_loader(config, self.task, config.prompts_per_step))
    self.rng = jax.random.key(config.seed + 1)

  # ---- the method's own state ----

  def state_dict(self) -> dict[str, Any]:
    return {"data": self.data_iter.get_state()}

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    if "data" in state and self.data_iter is not None:
      self.data_iter.set_state(state["data"])

  # ---- one step ----

  def put(self, tree):
    return put_batch(tree, self.run.train_mesh, self.run.train_rules)

  def contexts(self, num_groups: int, step: int) -> np.ndarray:
    """The step's context per row, drawn from (seed, step): a resumed step draws the same."""
    rng = np.random.default_rng([self.config.seed, step, 7])
    return losses.assign_contexts(num_groups, self.config.group_size, len(self.instructions),
                                  rng=rng)

  def bare_prompts(self, prompts: Sequence[str], width: int) -> tuple[np.ndarray, np.ndarray]:
    """The bare prompts, one per row, left-padded to `width` (the conditioned layout's, so one
    compiled shape serves both passes)."""
    ids = [self.tokenizer.encode(p) for p in prompts]
    width = max(width, max(map(len, ids)))
    tokens, mask = pad_batch(ids, pad_id=self.tokenizer.pad_id, max_len=width)
    return np.asarray(tokens, np.int32), np.asarray(mask, bool)

  def update(self, state, mini_batch):
    """One optimizer update; adds the mini-batch's Σ w (`ppo_phase`'s `step_fn`)."""
    if self.beta > 0:
      mini_batch = dict(mini_batch, **{KEPT_TOTAL: kept_total(mini_batch, self.correct_reward)})
    return self.step_fn(state, self.put(mini_batch))

  def step(self, state, step: int):
    config, group = self.config, self.config.group_size
    timings: dict[str, float] = {}
    records = global_records(self.data_iter)
    # 1. Contexts and the rows' prompts.
    contexts = self.contexts(len(records), step)
    bare = [r["prompt"] for r in records for _ in range(group)]
    prompts = context_prompts([r["prompt"] for r in records], contexts, self.instructions)

    # 2. One completion per row (each row its own prompt), then the group ids of the prompts.
    rollout = sample_groups(self.runtime, state.params, prompts, config,
                            jax.random.fold_in(self.rng, step), timings, n_samples=1)
    group_ids = np.repeat(np.arange(len(records), dtype=np.int32), group)
    rollout = rollout.replace(group_ids=jnp.asarray(group_ids))

    # 3. Rewards and the GRPO advantage over each prompt's rows.
    verified = verify_groups(self.objective, self.task, records,
                             self.sampler.decode_text(rollout), group_ids, config)
    by_name = {"correct": verified.correct, "format": verified.format}

    # 4. The trainer scores the conditioned layout: old log-probs and the teacher's support.
    tic = time.perf_counter()
    batch = ppo.trim_completions(multihost.to_host(dict(
      {k: getattr(rollout, k) for k in ROLLOUT_KEYS}, adv=verified.adv)),
      config.trim_completions_to)
    forward = self.beta > 0 and self.kl == "forward"
    scored = self.scorer.score(state.params, *self.put([batch[k] for k in ROLLOUT_KEYS]),
                               temperature=config.temperature,
                               top_k=self.teacher_k if forward else 0,
                               num_micro_batches=config.score_micro_batches)
    batch["old_logp"] = np.asarray(multihost.to_host(scored.logp), np.float32)
    ice_rewards = distill_rewards(by_name[config.ice.filter_reward], contexts)
    if self.beta > 0:
      tokens, mask = self.bare_prompts(bare, batch["prompt_tokens"].shape[1])
      batch.update(uncond_prompt_tokens=tokens, uncond_prompt_mask=mask,
                   ice_rewards=ice_rewards)
    if forward:
      ids, logp = multihost.to_host((scored.topk_ids, scored.topk_logp))
      batch.update(ice_teacher_ids=np.asarray(ids, np.int32),
                   ice_teacher_logp=np.asarray(logp, np.float32))
    timings["time/score"] = time.perf_counter() - tic

    # 5. The PPO phase (each mini-batch's Σ w added by `update`).
    tic = time.perf_counter()
    state, updates = ppo.ppo_phase(
      self.update, state, batch, epochs=config.ppo_epochs, mini_batches=config.ppo_mini_batches,
      rng=np.random.default_rng([config.seed, step]))
    timings["time/update"] = time.perf_counter() - tic

    record = step_record(updates, rollout, scored.logp, verified, batch["completion_mask"],
                         timings)
    record.update(self.ice_metrics(record, batch["completion_mask"], contexts,
                                   by_name[config.ice.filter_reward], verified.correct,
                                   ice_rewards))
    return state, record

  def ice_metrics(self, record, mask, contexts, filter_reward, correct,
                  ice_rewards) -> dict[str, float]:
    """`ice/*`: the KL (the updates' mean), kept tokens, correctness and reward by context."""
    passed = np.nan_to_num(np.asarray(filter_reward, np.float64), nan=0.0) >= self.correct_reward
    kept = np.asarray(mask, bool) & (ice_rewards >= self.correct_reward)[:, None]
    out = {"ice/kl": float(record.get("train/ice_kl", 0.0)),
           "ice/kept_tokens": float(kept.sum()),
           "ice/correct_frac": float(passed.mean()),
           "ice/distilled_frac": float((passed & (contexts > 0)).mean())}
    if self.kl == "nll" and "train/ice_term" in record:
      out["ice/nll"] = float(record["train/ice_term"])
    correct = np.asarray(correct, np.float64)
    for j in range(len(self.instructions) + 1):
      rows = (contexts == j) & np.isfinite(correct)
      if rows.any():  # a context absent this step has no value (never written as NaN)
        out[f"ice/reward_by_context/{j}"] = float(correct[rows].mean())
    for name, rows in (("with", contexts > 0), ("without", contexts == 0)):
      rows = rows & np.isfinite(correct)
      if rows.any():
        out[f"ice/reward_{name}_instruction"] = float(correct[rows].mean())
    return out

  # ---- evaluation and report ----

  def evaluate(self, state, step: int) -> dict[str, float]:
    """The bare prompts (the deployed student); then greedy accuracy under each instruction."""
    record = self.evaluator(state.params, step)
    if self.instructions and self.config.ice.eval_with_instructions:
      # Every (instruction, prompt) pair in one greedy batch: one call, one compiled shape.
      records = [dict(r, prompt=conditioned_prompt(r["prompt"], text))
                 for text in self.instructions for r in self.evaluator.records]
      result = evaluate(self.sampler, self.evaluator.sampler_params(state.params)[0], self.task,
                        records, max_new_tokens=self.config.max_new_tokens, k=0,
                        timeout_s=self.config.reward_timeout_s)
      by_instruction = result.greedy_correct.reshape(len(self.instructions), -1)
      for j, correct in enumerate(by_instruction, start=1):
        record[f"eval/accuracy_instruction/{j}"] = float(np.nanmean(correct))
      record["eval/accuracy_with_instructions"] = float(np.nanmean(by_instruction))
    return record

  def progress(self, record):
    return {"reward": record["train/reward_correct"], "kl": record["ice/kl"],
            "tok_s": record["train/tokens_per_s"]}

  def summary(self, records: Sequence[Mapping[str, Any]]) -> str:
    label = f"ice (β_S={self.beta:g}, {len(self.instructions)} instructions): held-out accuracy"
    return loop.eval_summary(records, "eval/accuracy", label)
