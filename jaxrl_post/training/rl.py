"""Glue between tasks, the sampler and the losses: batches, SFT / GRPO losses, evaluation.

Everything here is a plain function the experiment binaries call; the maths
lives in `jaxrl_post.losses` and `jaxrl_post.advantages`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_post import losses
from jaxrl_post.sampling import Sampler, score_model
from jaxrl_post.tasks.base import Task

# PolicyLossAux fields that add up over micro-batches (they are normalised by
# the global token count); min / max fields do not and are left out.
_ADDITIVE_AUX = ("pg_loss", "kl_loss", "kl", "entropy", "clip_frac_low", "clip_frac_high",
                 "clip_frac_dual", "ratio_mean", "sampler_weight_mean")


def encode_pairs(tokenizer, prompts: Sequence[str], completions: Sequence[str], *,
                 prompt_len: int, completion_len: int,
                 add_eos: bool = True) -> dict[str, np.ndarray]:
  """Tokenizes (prompt, completion) pairs: prompts left-padded, completions right-padded.

  Completions longer than `completion_len` (EOS included) are cut; prompts
  longer than `prompt_len` raise, naming the prompt.
  """
  prompt_tokens, prompt_mask = tokenizer.encode_batch(list(prompts), max_len=prompt_len)
  rows = len(completions)
  completion_tokens = np.full((rows, completion_len), tokenizer.pad_id, np.int32)
  completion_mask = np.zeros((rows, completion_len), bool)
  for i, text in enumerate(completions):
    ids = tokenizer.encode(text) + ([tokenizer.eos_id] if add_eos else [])
    ids = ids[:completion_len]
    completion_tokens[i, :len(ids)] = ids
    completion_mask[i, :len(ids)] = True
  return dict(prompt_tokens=np.asarray(prompt_tokens, np.int32),
              prompt_mask=np.asarray(prompt_mask, bool), completion_tokens=completion_tokens,
              completion_mask=completion_mask)


def with_normalizers(batch: Mapping[str, Any]) -> dict[str, Any]:
  """Adds the whole batch's `num_tokens` / `num_sequences` (shared by micro-batches)."""
  norm = losses.loss_normalizers(jnp.asarray(batch["completion_mask"]))
  return dict(batch, num_tokens=norm.num_tokens, num_sequences=norm.num_sequences)


def sft_loss(model, batch):
  """Teacher-forced negative log-likelihood of the completion tokens, per token.

  Normalised by the whole batch's `num_tokens`, so micro-batches add up.
  """
  scored = score_model(model, batch["prompt_tokens"], batch["prompt_mask"],
                       batch["completion_tokens"], batch["completion_mask"])
  nll = -jnp.sum(scored.logp) / batch["num_tokens"]
  return nll, {"nll": nll}


def make_policy_loss(*, policy_loss: str = "grpo", temperature: float = 1.0, **loss_kwargs):
  """`(model, batch) -> (loss, aux)` for a policy-gradient update.

  The batch holds a rollout (`prompt_*`, `completion_*`), `old_logp` (the
  policy that sampled, recomputed by `score`), `adv` `[batch]`, optional
  `ref_logp`, and the global `num_tokens` / `num_sequences`.
  `loss_kwargs` go to the registered policy loss (`jaxrl_post.losses`).
  """
  loss_fn = losses.POLICY_LOSSES.get(policy_loss)

  def loss(model, batch):
    scored = score_model(model, batch["prompt_tokens"], batch["prompt_mask"],
                         batch["completion_tokens"], batch["completion_mask"],
                         temperature=temperature)
    value, aux = loss_fn(
      scored.logp, batch["old_logp"], batch["adv"], batch["completion_mask"],
      ref_logp=batch.get("ref_logp"), entropy=jax.lax.stop_gradient(scored.entropy),
      num_tokens=batch["num_tokens"], num_sequences=batch["num_sequences"], **loss_kwargs)
    metrics = {k: getattr(aux, k) for k in _ADDITIVE_AUX if getattr(aux, k, None) is not None}
    return value, metrics

  return loss


def rewards_for(task: Task, records: Sequence[Mapping[str, Any]], texts: Sequence[str],
                group_size: int) -> tuple[np.ndarray, np.ndarray, int]:
  """Scores `texts` (group_size per record) with the task's verifier.

  A verifier that raises gives NaN (a missing reward, which the advantages
  ignore) instead of stopping the run; the count of such failures is returned.
  """
  correct = np.zeros(len(texts), np.float32)
  fmt = np.zeros(len(texts), np.float32)
  failures = 0
  for i, text in enumerate(texts):
    try:
      correct[i], fmt[i] = task.reward(records[i // group_size], text)
    except Exception:  # noqa: BLE001 - any verifier bug must not kill training
      correct[i] = fmt[i] = np.nan
      failures += 1
  return correct, fmt, failures


def evaluate(sampler: Sampler, state, task: Task, records: Sequence[Mapping[str, Any]], *,
             max_new_tokens: int, k: int = 4, temperature: float = 1.0,
             rng: jax.Array | None = None) -> dict[str, float]:
  """Held-out greedy accuracy and format rate, and pass@k at `temperature`."""
  prompts = [r["prompt"] for r in records]
  greedy = sampler.generate(state, prompts, max_new_tokens=max_new_tokens, greedy=True)
  correct, fmt, _ = rewards_for(task, records, sampler.decode_text(greedy), 1)
  metrics = {"accuracy": float(np.nanmean(correct)), "format": float(np.nanmean(fmt))}
  if k:
    rng = jax.random.key(0) if rng is None else rng
    sampled = sampler.generate(state, prompts, n_samples_per_prompt=k,
                               max_new_tokens=max_new_tokens, temperature=temperature, rng=rng)
    correct_k, _, _ = rewards_for(task, records, sampler.decode_text(sampled), k)
    metrics[f"pass_at_{k}"] = float(np.mean(np.nanmax(correct_k.reshape(-1, k), axis=1) > 0.5))
  return metrics
