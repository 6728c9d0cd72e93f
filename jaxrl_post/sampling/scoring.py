"""Teacher-forced scoring: log-probs, entropies and top-K of given completions.

Every log-prob the system trains on (current policy, old policy, reference,
teachers) comes from `score_model`, so the sampler and the trainer agree.

Memory. With a real vocabulary the logits are the largest tensor of the
update: Qwen3's 151,936 ids at 16 rows × 1024 positions are 10 GB per
float32 `[batch, time, vocab]` tensor, and a plain log-softmax + entropy
keeps several of them alive for the backward pass. `score_model` therefore

  * projects only the completion positions (a prompt position predicts no
    token the loss uses, except the last one, which predicts the first
    completion token), and
  * walks the completion in chunks of `chunk_size` positions: each chunk's
    hidden → logits → log-softmax → gather / entropy / top-K runs under
    `jax.checkpoint`, so the backward pass recomputes that chunk's logits
    instead of storing them. Peak logit memory per device is then a few
    `rows × chunk_size × vocab` float32 tensors, whatever the completion
    length (the approach of Liger-Kernel's fused linear cross-entropy and
    of chunked log-prob computation in RL trainers).

The values are those of the full-vocabulary formulas, chunked or not:
  logp_t = z_t[y_t] − logsumexp(z_t),   z_t = h_t W / temperature,
  H_t = −Σ_v p_t(v) log p_t(v),
where `W` is the LM head (`CausalLM.output_logits`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl_post.sampling import grammar as grammar_lib

# `(logits [batch, c, vocab], mask [batch, c], inputs) -> logits`: see `score_hidden`.
LogitsTransform = Callable[[jax.Array, jax.Array, Any], jax.Array]


class ScoreOutput(NamedTuple):
  logp: jax.Array  # float32[batch, time], 0 where the completion mask is False
  entropy: jax.Array  # float32[batch, time], full-vocabulary entropy
  topk_ids: jax.Array | None  # int32[batch, time, K]
  topk_logp: jax.Array | None  # float32[batch, time, K]
  # float32[batch, time, C]: log-probs of caller-given candidate ids (e.g. a
  # teacher scoring the student's top-K), 0 where the completion mask is False.
  candidate_logp: jax.Array | None = None


def score_logits(logits: jax.Array, completion_tokens: jax.Array, completion_mask: jax.Array, *,
                 temperature=1.0, top_k: int = 0,
                 candidate_ids: jax.Array | None = None) -> ScoreOutput:
  """Log-probs, entropies and top-K of completions from the logits predicting them.

  Args:
    logits: `[batch, time, vocab]`, where `logits[:, t]` predicts
      `completion_tokens[:, t]`.
    completion_tokens, completion_mask: `[batch, time]`.
    temperature: divides the logits.
    top_k: also return the K most likely ids and their log-probs (static).
    candidate_ids: optional int32 `[batch, time, C]`; their full-vocabulary
      log-probs are returned as `candidate_logp` (multi-teacher distillation
      scores the student's top-K ids under each teacher this way).

  Example:
    >>> logits = jnp.log(jnp.array([[[0.5, 0.25, 0.25]]]))
    >>> out = score_logits(logits, jnp.array([[1]]), jnp.array([[True]]))
    >>> round(float(jnp.exp(out.logp)[0, 0]), 4), round(float(out.entropy[0, 0]), 4)
    (0.25, 1.0397)
  """
  logp_all = jax.nn.log_softmax(logits.astype(jnp.float32) / temperature, axis=-1)
  logp = jnp.take_along_axis(logp_all, completion_tokens[..., None], axis=-1)[..., 0]
  entropy = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)
  logp = jnp.where(completion_mask, logp, 0.0)
  entropy = jnp.where(completion_mask, entropy, 0.0)
  topk_ids = topk_logp = None
  if top_k:
    topk_logp, topk_ids = jax.lax.top_k(logp_all, top_k)
    topk_ids = topk_ids.astype(jnp.int32)
  candidate_logp = None
  if candidate_ids is not None:
    candidate_logp = jnp.take_along_axis(logp_all, candidate_ids, axis=-1)
    candidate_logp = jnp.where(completion_mask[..., None], candidate_logp, 0.0)
  return ScoreOutput(logp, entropy, topk_ids, topk_logp, candidate_logp)


def chunk_positions(time: int, chunk_size: int) -> int:
  """Positions per chunk for a completion of `time` positions (0 or ≥ time: one chunk).

  A `chunk_size` that does not divide `time` is fine: the last chunk is
  padded (completion widths change from step to step with
  `trim_completions_to`, so no fixed size could divide them all).

  Example:
    >>> chunk_positions(768, 128), chunk_positions(64, 128), chunk_positions(64, 0)
    (128, 64, 64)
  """
  if chunk_size < 0:
    raise ValueError(f"logit_chunk_size={chunk_size} must be >= 0 (0: one chunk)")
  if not chunk_size or chunk_size >= time:
    return time
  return chunk_size


def score_hidden(project, hidden: jax.Array, completion_tokens: jax.Array,
                 completion_mask: jax.Array, *, temperature=1.0, top_k: int = 0,
                 candidate_ids: jax.Array | None = None, chunk_size: int = 0,
                 logits_transform: LogitsTransform | None = None,
                 transform_inputs: Any = None) -> ScoreOutput:
  """`score_logits` of `project(hidden)`, chunk by chunk, recomputed in the backward pass.

  Args:
    project: `[batch, c, embed] -> float32[batch, c, vocab]` logits (the LM
      head). Gradients flow into whatever it closes over.
    hidden: `[batch, time, embed]`, where `hidden[:, t]` predicts
      `completion_tokens[:, t]`.
    completion_tokens, completion_mask, temperature, top_k, candidate_ids:
      as in `score_logits`.
    chunk_size: positions per chunk (0: the whole completion as one chunk).
      The last chunk is zero-padded when it does not divide `time`.
    logits_transform: optional `(logits, mask, inputs) -> logits`, applied to
      each chunk's `[batch, c, vocab]` logits (before the temperature) inside
      the checkpointed chunk, with `mask` the chunk's `[batch, c]` completion
      mask and `inputs` the chunk's slice of `transform_inputs`. For maps that
      act on each position independently (an identity with a custom VJP that
      corrects the logit cotangent, as OPRD's `losses.oprd_transform`), the
      chunked result equals the unchunked one and no `[batch, time, vocab]`
      cotangent is formed.
    transform_inputs: a pytree of `[batch, time, ...]` per-position arrays,
      split into chunks along time exactly like `candidate_ids` (padded
      positions are masked out).

  Returns:
    The same `ScoreOutput` as `score_logits(project(hidden), ...)`. No
    `[batch, time, vocab]` tensor is kept for the backward pass: each chunk's
    logits are recomputed from its hidden states (one more head matmul).
  """
  b, t, _ = hidden.shape
  c = chunk_positions(t, chunk_size)

  @jax.checkpoint
  def one_chunk(h, tokens, mask, candidates, extra):
    logits = project(h)
    if logits_transform is not None:
      logits = logits_transform(logits, mask, extra)
    return score_logits(logits, tokens, mask, temperature=temperature, top_k=top_k,
                        candidate_ids=candidates)

  if c == t:
    return one_chunk(hidden, completion_tokens, completion_mask, candidate_ids,
                     transform_inputs)
  n = -(-t // c)
  pad = n * c - t  # Padded positions are masked out and cut off again below.

  # Chunks along time, [n, batch, c, ...]: the batch axis keeps its sharding and
  # each scan step sees every row.
  def to_chunks(x):
    if x is None:
      return None
    x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
    return jnp.moveaxis(x.reshape(b, n, c, *x.shape[2:]), 1, 0)

  def from_chunks(y):
    return None if y is None else jnp.moveaxis(y, 0, 1).reshape(b, n * c, *y.shape[3:])[:, :t]

  xs = tuple(map(to_chunks, (hidden, completion_tokens, completion_mask, candidate_ids)))
  xs += (jax.tree.map(to_chunks, transform_inputs),)
  _, ys = jax.lax.scan(lambda carry, x: (carry, one_chunk(*x)), None, xs)
  return ScoreOutput(*map(from_chunks, ys))


def score_model(model, prompt_tokens, prompt_mask, completion_tokens, completion_mask, *,
                temperature=1.0, top_k: int = 0, candidate_ids: jax.Array | None = None,
                prompt_embeddings: jax.Array | None = None,
                chunk_size: int | None = None,
                logits_transform: LogitsTransform | None = None,
                transform_inputs: Any = None) -> ScoreOutput:
  """Teacher-forced log-probs of given completions: one forward over prompt + completion.

  The trainer (current and old policy), the reference model and teachers all
  use this function, so every log-prob in the system is computed one way.
  Logits are formed for the completion positions only, in chunks (module
  docstring).

  Args:
    model: a `CausalLM` (inside a loss, the model being differentiated).
    prompt_tokens, prompt_mask: `[batch, prompt_len]`, left-padded.
    completion_tokens, completion_mask: `[batch, time]`, right-padded.
    temperature: divides the logits (use the sampling temperature).
    top_k: also return the K most likely ids and log-probs per position.
    candidate_ids: optional `[batch, time, C]` ids whose log-probs to return.
    prompt_embeddings: optional `[batch, prompt_len, embed]` prompt inputs
      (multimodal prompts), as in `prefill`; gradients flow into them, so an
      encoder that produced them is trained through this function.
    chunk_size: completion positions per logit chunk; default
      `model.config.logit_chunk_size` (0: one chunk).
    logits_transform, transform_inputs: applied to each chunk's logits
      (`score_hidden`); e.g. OPRD's gradient correction in the policy loss.
  """
  prompt_len = prompt_tokens.shape[1]
  tokens = jnp.concatenate([prompt_tokens, completion_tokens], axis=1)
  mask = jnp.concatenate([prompt_mask, completion_mask], axis=1).astype(jnp.bool_)
  embeddings = None
  if prompt_embeddings is not None:
    text = model.embed_tokens(completion_tokens)
    embeddings = jnp.concatenate([prompt_embeddings.astype(text.dtype), text], axis=1)
  hidden = model(tokens, attention_mask=mask, embeddings=embeddings, return_logits=False)
  # Position prompt_len - 1 + t predicts completion token t.
  hidden = hidden[:, prompt_len - 1:-1]
  if chunk_size is None:
    chunk_size = model.config.logit_chunk_size
  return score_hidden(model.output_logits, hidden, completion_tokens, completion_mask,
                      temperature=temperature, top_k=top_k, candidate_ids=candidate_ids,
                      chunk_size=chunk_size, logits_transform=logits_transform,
                      transform_inputs=transform_inputs)


def score(graphdef, state, prompt_tokens, prompt_mask, completion_tokens, completion_mask, *,
          temperature=1.0, top_k: int = 0, candidate_ids: jax.Array | None = None,
          chunk_size: int | None = None, num_micro_batches: int = 1,
          grammar=None) -> ScoreOutput:
  """`score_model` for a split model (`graphdef`, `state`), in micro-batches of rows.

  A frozen model (old policy, reference, teacher) scores the whole step's
  rollouts; `num_micro_batches` bounds the activation memory of that pass to
  one micro-batch's, whatever the step's batch. Micro-batch j takes rows
  j, j + m, j + 2m, … (strided, so that each device's contiguous block of a
  batch-sharded array holds rows of every micro-batch: no rows move between
  devices), and the rows are put back in order afterwards.

  `grammar` (a `sampling.grammar.TokenGrammar`, optional): the log-probs are those of the
  masked, renormalised distribution (the sampler's under the same grammar); the states are
  recomputed per position by a scan over the completion (`grammar.completion_states`,
  `[batch, time]` ints) and each logit chunk gathers its `allowed[state]` rows
  (`grammar.logits_transform`), so no `[batch, time, vocab]` mask is formed.

  Raises:
    ValueError: `num_micro_batches` does not divide the rows.
  """
  model = nnx.merge(graphdef, state)
  kwargs = dict(temperature=temperature, top_k=top_k, chunk_size=chunk_size)
  states = None
  if grammar is not None:
    kwargs["logits_transform"] = grammar_lib.logits_transform(grammar)
    states = grammar_lib.completion_states(grammar, completion_tokens, completion_mask)
  m = int(num_micro_batches)
  rows = prompt_tokens.shape[0]
  if m < 1 or rows % m:
    raise ValueError(f"score_micro_batches={num_micro_batches} must be >= 1 and divide the "
                     f"{rows} rows scored together")
  if m == 1:
    return score_model(model, prompt_tokens, prompt_mask, completion_tokens, completion_mask,
                       candidate_ids=candidate_ids, transform_inputs=states, **kwargs)
  split = lambda x: None if x is None else jnp.moveaxis(  # noqa: E731
    x.reshape(rows // m, m, *x.shape[1:]), 1, 0)
  merge = lambda y: None if y is None else jnp.moveaxis(y, 0, 1).reshape(  # noqa: E731
    rows, *y.shape[2:])
  inputs = tuple(map(split, (prompt_tokens, prompt_mask, completion_tokens, completion_mask,
                             candidate_ids, states)))
  outputs = jax.lax.map(lambda x: score_model(model, *x[:4], candidate_ids=x[4],
                                              transform_inputs=x[5], **kwargs), inputs)
  return ScoreOutput(*map(merge, outputs))
