"""Model-level objectives for `make_train_step`: `(model, batch) -> (loss, metrics)`.

They score the batch with the policy (`sampling.score_model`, chunked over time, completion
positions only) and hand the log-probs to the pure losses of `jaxrl_post.losses`. Every loss
here is normalised by the *whole* batch's `num_tokens` / `num_sequences`
(`training.ppo.with_normalizers`), so its micro-batches add up to the batch's loss.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np

from jaxrl_post import losses
from jaxrl_post.sampling import score_model
from jaxrl_post.sampling.scoring import LogitsTransform


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


def sft_loss(model, batch):
  """Teacher-forced negative log-likelihood of the completion tokens, per token.

  Normalised by the whole batch's `num_tokens`, so micro-batches add up.
  """
  scored = score_model(model, batch["prompt_tokens"], batch["prompt_mask"],
                       batch["completion_tokens"], batch["completion_mask"])
  nll = losses.nll_loss(scored.logp, batch["completion_mask"], batch["num_tokens"])
  return nll, {"nll": nll}


def make_policy_loss(*, policy_loss: str = "grpo", temperature: float = 1.0,
                     logits_transform: LogitsTransform | None = None,
                     transform_keys: Sequence[str] = (), **loss_kwargs):
  """`(model, batch) -> (loss, aux)` for a policy-gradient update.

  The batch holds a rollout (`prompt_*`, `completion_*`), `old_logp` (the
  policy that sampled, recomputed by `score`; absent: `stop_gradient` of the loss's own
  log-probs, the old policy of a step that makes one update, whose ratio is then exactly 1:
  `config.rollout.old_logp="detached"`), `adv` `[batch]` or
  `[batch, time]`, optional `ref_logp`, and the global `num_tokens` /
  `num_sequences`. `loss_kwargs` go to the registered policy loss
  (`jaxrl_post.losses`).

  Optional: `sampler_logp` `[batch, time]` in the batch (the log-probs the sampler recorded)
  goes to the loss, whose `sampler_correction` then weights tokens by the truncated / masked
  ratio to the sampling policy (`losses.sampler_importance_weights`); `logp_scale`
  `[batch, time]` in the batch multiplies the current log-probs before the ratio (a modulated
  ratio, e.g. TRRD's `losses.JointOPDTerms`); `logits_transform` is applied to each logit chunk
  of the scoring pass with the batch's `transform_keys` arrays as its inputs
  (`sampling.score_hidden`; OPRD's `losses.oprd_transform`).
  """
  loss_fn = losses.POLICY_LOSSES.get(policy_loss)
  transform_keys = tuple(transform_keys)

  def loss(model, batch):
    inputs = {k: batch[k] for k in transform_keys} if logits_transform is not None else None
    scored = score_model(model, batch["prompt_tokens"], batch["prompt_mask"],
                         batch["completion_tokens"], batch["completion_mask"],
                         temperature=temperature, logits_transform=logits_transform,
                         transform_inputs=inputs)
    logp = scored.logp if "logp_scale" not in batch else batch["logp_scale"] * scored.logp
    # The sampler's log-probs, when the batch has them, for the TIS / IcePop correction.
    sampler = {"sampler_logp": batch["sampler_logp"]} if "sampler_logp" in batch else {}
    # Without `old_logp` the old policy is the current one (`config.rollout.old_logp=
    # "detached"`): the unscaled log-probs, as `score` would have given them.
    old_logp = batch.get("old_logp", jax.lax.stop_gradient(scored.logp))
    value, aux = loss_fn(
      logp, old_logp, batch["adv"], batch["completion_mask"],
      ref_logp=batch.get("ref_logp"), entropy=jax.lax.stop_gradient(scored.entropy),
      num_tokens=batch["num_tokens"], num_sequences=batch["num_sequences"], **sampler,
      **loss_kwargs)
    return value, aux.additive()

  return loss
