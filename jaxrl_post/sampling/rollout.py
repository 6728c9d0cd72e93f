"""`Rollout`: what one call of `Sampler.generate` hands to rewards and training."""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

# Finish reasons, one int per row.
FINISH_EOS = 0  # the row sampled one of the model's end-of-sequence tokens
FINISH_LENGTH = 1  # the row reached max_new_tokens
FINISH_STOP = 2  # the row sampled one of the caller's stop tokens
FINISH_NAMES = ("eos", "length", "stop")


@flax.struct.dataclass
class Rollout:
  """Sampled completions of a batch of prompts, n per prompt.

  Rows are grouped by prompt: prompt p owns rows `p * n ... p * n + n - 1`.

  Attributes:
    prompt_tokens: `int32[batch, prompt_len]`, left-padded.
    prompt_mask: `bool[batch, prompt_len]`, False on padding.
    completion_tokens: `int32[batch, max_new_tokens]`, right-padded with pad.
    completion_mask: `bool[batch, max_new_tokens]`, True on generated tokens,
      including the final EOS / stop token (the policy must learn to stop).
    logp: `float32[batch, max_new_tokens]`, log-probability of each sampled
      token under the full-vocabulary softmax of logits / temperature, i.e.
      before top-k / top-p truncation (0 where the mask is False).
    finish_reason: `int32[batch]`, one of FINISH_EOS / FINISH_LENGTH / FINISH_STOP.
    group_ids: `int32[batch]`, the prompt index of each row.
    topk_ids: optional `int32[batch, max_new_tokens, K]`, the K most likely
      token ids at each position (same distribution as `logp`).
    topk_logp: optional `float32[batch, max_new_tokens, K]`, their log-probs.
  """

  prompt_tokens: jax.Array
  prompt_mask: jax.Array
  completion_tokens: jax.Array
  completion_mask: jax.Array
  logp: jax.Array
  finish_reason: jax.Array
  group_ids: jax.Array
  topk_ids: jax.Array | None = None
  topk_logp: jax.Array | None = None

  @property
  def lengths(self) -> jax.Array:
    """`int32[batch]` completion lengths (final EOS / stop token included)."""
    return jnp.sum(self.completion_mask, axis=-1, dtype=jnp.int32)

  @property
  def batch_size(self) -> int:
    return self.completion_tokens.shape[0]
