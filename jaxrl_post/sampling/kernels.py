"""Pure, jittable sampling kernels: token selection, prefill, decode, scoring.

The Python `Sampler` (sampler.py) wraps these with bucketing and jit; they
are usable on their own with any `CausalLM` graphdef + state:

  prefill(graphdef, state, tokens, mask, cache_len, n) -> PrefillOutput
  decode(graphdef, state, prefill_output, rng, ...)    -> DecodeOutput

Teacher-forced scoring (`score`, `score_model`) is in `scoring.py`.

Log-probabilities everywhere are `log_softmax(logits / temperature)` over the
full vocabulary. Top-k / top-p change which tokens can be *drawn*, not the
recorded log-probs: the recorded value is what the trainer recomputes with
`scoring.score` at the same temperature, so sampler and trainer agree exactly; the
truncation is a (small, usually ignored) bias of the behaviour policy, the
convention of Tunix, vLLM and TRL. Under a token grammar (`decode(..., grammar=)`,
`sampling.grammar`) the vocabulary is the state's legal tokens: log-probs are those of the
masked, renormalised distribution, which `scoring.score(..., grammar=)` recomputes.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl_post.models.transformer import KVCache, default_positions
from jaxrl_post.sampling import grammar as grammar_lib
from jaxrl_post.sampling.rollout import FINISH_EOS, FINISH_LENGTH, FINISH_STOP


def filter_logits(logits: jax.Array, *, top_k: int = 0, top_p: jax.Array | float = 1.0):
  """Masks logits outside the top-k and the top-p nucleus to -inf.

  Args:
    logits: `[..., vocab]` (already divided by the temperature).
    top_k: keep the k largest logits; 0 keeps all. Static.
    top_p: keep the smallest set of most likely tokens whose probability sum
      reaches `top_p` (the most likely token is always kept); 1.0 keeps all.

  Returns:
    Logits of the same shape with dropped entries at -inf.

  Example:
    >>> logits = jnp.log(jnp.array([0.5, 0.3, 0.15, 0.05]))
    >>> jnp.isfinite(filter_logits(logits, top_p=0.75)).tolist()
    [True, True, False, False]
  """
  neg_inf = jnp.array(-jnp.inf, logits.dtype)
  if top_k:
    kth = jax.lax.top_k(logits, top_k)[0][..., -1:]
    logits = jnp.where(logits < kth, neg_inf, logits)
  if isinstance(top_p, (int, float)) and top_p >= 1.0:
    return logits
  # The nucleus needs a sort over the vocabulary, which costs more than the rest of a
  # decode step's sampling together on CPU; `cond` skips it at run time when top_p = 1.
  return jax.lax.cond(jnp.all(top_p >= 1.0), lambda x: x,
                      lambda x: _nucleus(x, top_p), logits)


def _nucleus(logits: jax.Array, top_p) -> jax.Array:
  """Masks logits outside the top-p nucleus: keep a token if the mass before it is < p."""
  neg_inf = jnp.array(-jnp.inf, logits.dtype)
  sorted_logits = jnp.sort(logits, axis=-1)[..., ::-1]
  probs = jax.nn.softmax(sorted_logits, axis=-1)
  mass_before = jnp.cumsum(probs, axis=-1) - probs
  keep_sorted = mass_before < top_p
  # The smallest kept logit is the threshold (ties at the threshold are kept).
  threshold = jnp.min(jnp.where(keep_sorted, sorted_logits, jnp.inf), axis=-1, keepdims=True)
  return jnp.where(logits < threshold, neg_inf, logits)


class TokenChoice(NamedTuple):
  token: jax.Array  # int32[batch]
  logp: jax.Array  # float32[batch], full-vocabulary log-prob at the temperature
  topk_ids: jax.Array | None  # int32[batch, K]
  topk_logp: jax.Array | None  # float32[batch, K]


def choose_tokens(logits: jax.Array, rng: jax.Array, *, temperature, top_k: int, top_p,
                  greedy: bool, num_logprobs: int, row_ids: jax.Array | None = None,
                  step_ids: jax.Array | None = None,
                  allowed: jax.Array | None = None) -> TokenChoice:
  """Draws one token per row from `logits` `[batch, vocab]`.

  Row r draws with the key `fold_in(rng, row_ids[r])` (default `row_ids =
  arange(batch)`): a row's draw depends on its global row number only, not on
  which device holds it or how many rows share the call, so data-parallel
  decoding with one loop per shard gives the same samples as one global loop.
  With `step_ids` `int32[batch]` (rows at different steps, continuous
  batching) the key is `fold_in(fold_in(rng, step_ids[r]), row_ids[r])`,
  the key `decode` gives row r at step `step_ids[r]` from the same `rng`.
  With `allowed` `bool[batch, vocab]` (a grammar's legal tokens, `sampling.grammar`) the
  illegal logits are masked before the temperature, top-k / top-p and the recorded log-probs,
  which are then those of the masked, renormalised distribution.
  """
  logits = logits.astype(jnp.float32)
  if allowed is not None:
    logits = grammar_lib.mask_logits(logits, allowed)
  scaled = logits / temperature
  logp_all = jax.nn.log_softmax(scaled, axis=-1)
  if greedy:
    token = jnp.argmax(scaled, axis=-1)
  else:
    if row_ids is None:
      row_ids = jnp.arange(logits.shape[0], dtype=jnp.int32)
    if step_ids is None:
      keys = jax.vmap(jax.random.fold_in, (None, 0))(rng, row_ids)
    else:
      keys = jax.vmap(lambda step, row: jax.random.fold_in(jax.random.fold_in(rng, step), row))(
        step_ids, row_ids)
    token = jax.vmap(jax.random.categorical)(keys, filter_logits(scaled, top_k=top_k, top_p=top_p))
  token = token.astype(jnp.int32)
  logp = jnp.take_along_axis(logp_all, token[:, None], axis=-1)[:, 0]
  topk_ids = topk_logp = None
  if num_logprobs:
    topk_logp, topk_ids = jax.lax.top_k(logp_all, num_logprobs)
    topk_ids = topk_ids.astype(jnp.int32)
  return TokenChoice(token, logp, topk_ids, topk_logp)


class PrefillOutput(NamedTuple):
  logits: jax.Array  # float32[batch * n, vocab], next-token logits after the prompt
  positions: jax.Array  # int32[batch * n], position of the first generated token
  cache: KVCache


def prefill(graphdef, state, tokens, mask, *, cache_len: int, num_samples: int,
            embeddings: jax.Array | None = None) -> PrefillOutput:
  """Runs the prompts once; with n > 1 samples per prompt, the rows share its cache.

  Args:
    graphdef, state: `nnx.split(model)` of a `CausalLM`.
    tokens: `int32[batch, prompt_len]` left-padded prompts; `mask` their mask.
    cache_len: cache slots, at least prompt_len + max_new_tokens.
    num_samples: n; rows of prompt p become rows p·n ... p·n + n − 1.
    embeddings: optional `[batch, prompt_len, embed]` prompt inputs used instead
      of the token lookup (multimodal prompts: encoder outputs then text).

  Returns:
    Next-token logits and positions per row, and the cache. With n = 1 the
    cache has `cache_len` slots per row, the prompt in the first prompt_len.
    With n > 1 the prompt slots stay once per prompt (`KVCache.prefix_*`) and
    each row gets `cache_len − prompt_len` empty slots of its own: decoding
    then reads a prompt's slots once per group, not n times
    (`cascade_attention`), and prefill copies no cache. The buffers are
    per layer, or stacked `[layers, ...]` for a `scan_layers` model
    (`KVCache.stacked`).
  """
  model = nnx.merge(graphdef, state)
  prompt_len = tokens.shape[1]
  cache = model.init_cache(tokens.shape[0], prompt_len if num_samples > 1 else cache_len)
  positions = default_positions(mask)
  logits, cache = model(tokens, positions=positions, attention_mask=mask, cache=cache,
                        embeddings=embeddings)
  next_positions = positions[:, -1] + 1
  last = logits[:, -1]
  if num_samples > 1:
    rows = model.init_cache(tokens.shape[0] * num_samples, cache_len - prompt_len)
    cache = rows.replace(prefix_k=cache.k, prefix_v=cache.v, prefix_mask=cache.mask)
    repeat = lambda x: jnp.repeat(x, num_samples, axis=0)  # noqa: E731
    last, next_positions = repeat(last), repeat(next_positions)
  return PrefillOutput(last, next_positions, cache)


# Phases of at least this many steps, and at most this many phases: each phase
# compiles the model's decode step once more (≈ 1 s for `small` on CPU).
MIN_PHASE_STEPS = 16
MAX_PHASES = 8


def decode_phases(max_new_tokens: int) -> list[int]:
  """Exclusive end steps of the decode phases; steps run from 1 to max_new_tokens − 1.

  Example:
    >>> decode_phases(128)
    [19, 37, 55, 74, 92, 110, 128]
  """
  steps = max_new_tokens - 1
  phases = max(1, min(MAX_PHASES, steps // MIN_PHASE_STEPS))
  return [1 + round(steps * (j + 1) / phases) for j in range(phases)]


def resize_cache(cache: KVCache, length: int) -> KVCache:
  """The rows' own slots cut or zero-padded (mask False) to `length`; a shared prefix stays.

  Per-layer buffers (tuples) and stacked `[layers, ...]` ones alike: the slot
  axis is the last of a key buffer and the second to last of a value buffer.
  """
  extra = length - cache.max_len
  if extra == 0:
    return cache
  if extra < 0:
    return cache.replace(k=jax.tree.map(lambda k: k[..., :length], cache.k),
                         v=jax.tree.map(lambda v: v[..., :length, :], cache.v),
                         mask=cache.mask[:, :length])
  pad = lambda x, axis: jnp.pad(x, [(0, extra if a == axis % x.ndim else 0)  # noqa: E731
                                    for a in range(x.ndim)])
  return cache.replace(k=jax.tree.map(lambda k: pad(k, -1), cache.k),
                       v=jax.tree.map(lambda v: pad(v, -2), cache.v), mask=pad(cache.mask, 1))


class DecodeOutput(NamedTuple):
  tokens: jax.Array  # int32[batch, max_new_tokens], pad after the end
  mask: jax.Array  # bool[batch, max_new_tokens]
  logp: jax.Array  # float32[batch, max_new_tokens]
  finish_reason: jax.Array  # int32[batch]
  topk_ids: jax.Array | None
  topk_logp: jax.Array | None
  steps: jax.Array  # int32[], decode steps actually run (early exit)
  cache: KVCache  # the final cache; returned so a donated input cache can alias it


def decode(graphdef, state, start: PrefillOutput, rng, *, max_new_tokens: int, eos_ids,
           stop_ids, pad_id: int, temperature, top_p, top_k: int, greedy: bool,
           num_logprobs: int, first_row: jax.Array | int = 0,
           grammar: grammar_lib.TokenGrammar | None = None) -> DecodeOutput:
  """Samples up to `max_new_tokens` per row with `lax.while_loop`s.

  The loop stops as soon as every row has finished. Step i draws row r with
  the key `fold_in(fold_in(rng, i), first_row + r)`, so results depend neither
  on how many steps ran before an early exit nor on how the rows are split
  over devices (`first_row` is the global number of this call's first row
  when each data shard runs its own loop, see `sampler.jitted_decode`).

  Decoding runs in phases (`decode_phases`): phase j carries a cache cut to
  the slots written by its last step, so the attention of early steps does
  not read the empty tail of the buffer. Reading the cache is a large part
  of a decode step; with 128 new tokens after a 64-token prompt, the 7 phases
  read 28 % fewer slots than attending over all 192 every step. Between phases the
  cache is padded (one copy); the last phase ends at the full length, so the
  returned cache has the input's shape. A stacked cache (`scan_layers`)
  goes through the layer scan each step, its `[layers, ...]` buffers in the
  scan's carry, so one layer's program serves all (the per-layer buffers of
  unrolled layers decode faster on CPU, docs/benchmarks.md).

  Args:
    graphdef, state: the model.
    start: `prefill` output. Donate its cache: XLA reuses its buffer (with
      one phase the returned cache aliases it).
    rng: PRNG key.
    max_new_tokens: static budget.
    eos_ids, stop_ids: `int32[k]` token ids that end a row (−1 entries are
      ignored), reported as FINISH_EOS / FINISH_STOP.
    pad_id: written after a row's end.
    temperature, top_p: scalars; top_k, greedy, num_logprobs: static.
    first_row: global row number of this call's row 0 (names the rows' keys).
    grammar: optional `sampling.grammar.TokenGrammar`: each row carries its state through
      the loop, illegal tokens are masked before sampling, the recorded log-probs are the
      masked, renormalised ones. None: the unconstrained loop, unchanged.
  """
  model = nnx.merge(graphdef, state)
  batch = start.logits.shape[0]
  k = num_logprobs
  row_ids = first_row + jnp.arange(batch, dtype=jnp.int32)
  def choose(logits, i, carry):
    allowed = None if grammar is None else grammar.allowed[carry[7]]
    return choose_tokens(
      logits, jax.random.fold_in(rng, i), temperature=temperature, top_k=top_k, top_p=top_p,
      greedy=greedy, num_logprobs=k, row_ids=row_ids, allowed=allowed)

  def record(carry, i, choice):
    tokens, mask, logp, topk_ids, topk_logp, done, finish = carry[:7]
    alive = ~done
    token = jnp.where(alive, choice.token, pad_id)
    tokens = tokens.at[:, i].set(token)
    mask = mask.at[:, i].set(alive)
    logp = logp.at[:, i].set(jnp.where(alive, choice.logp, 0.0))
    if k:
      topk_ids = topk_ids.at[:, i].set(jnp.where(alive[:, None], choice.topk_ids, pad_id))
      topk_logp = topk_logp.at[:, i].set(jnp.where(alive[:, None], choice.topk_logp, 0.0))
    is_eos = jnp.any(choice.token[:, None] == eos_ids[None, :], axis=-1) & alive
    is_stop = jnp.any(choice.token[:, None] == stop_ids[None, :], axis=-1) & alive & ~is_eos
    finish = jnp.where(is_eos, FINISH_EOS, jnp.where(is_stop, FINISH_STOP, finish))
    done = done | is_eos | is_stop
    if grammar is None:
      return tokens, mask, logp, topk_ids, topk_logp, done, finish
    state = jnp.where(alive, grammar.next_state[carry[7], choice.token], carry[7])
    return tokens, mask, logp, topk_ids, topk_logp, done, finish, state

  tokens = jnp.full((batch, max_new_tokens), pad_id, jnp.int32)
  mask = jnp.zeros((batch, max_new_tokens), jnp.bool_)
  logp = jnp.zeros((batch, max_new_tokens), jnp.float32)
  topk_ids = jnp.full((batch, max_new_tokens, k), pad_id, jnp.int32) if k else None
  topk_logp = jnp.zeros((batch, max_new_tokens, k), jnp.float32) if k else None
  done = jnp.zeros((batch,), jnp.bool_)
  finish = jnp.full((batch,), FINISH_LENGTH, jnp.int32)
  carry = (tokens, mask, logp, topk_ids, topk_logp, done, finish)
  if grammar is not None:
    carry += (jnp.broadcast_to(grammar.start, (batch,)).astype(jnp.int32),)
  carry = record(carry, 0, choose(start.logits, 0, carry))

  def cond(loop):
    i, carry, _, _ = loop
    return (i < max_new_tokens) & ~jnp.all(carry[5])

  def body(loop):
    i, carry, positions, cache = loop
    previous = carry[0][:, i - 1]
    logits, cache = model(previous[:, None], positions=positions[:, None], cache=cache)
    carry = record(carry, i, choose(logits[:, 0], i, carry))
    return i + 1, carry, positions + 1, cache

  loop = (jnp.int32(1), carry, start.positions, start.cache)
  full = start.cache.max_len
  for end in decode_phases(max_new_tokens):
    # Step i writes slot index + i − 1, and a cache that holds every step has
    # index <= full − max_new_tokens + 1: this phase's slots fit in `length`.
    length = min(full, full - max_new_tokens + end)
    i, carry, positions, cache = loop
    loop = jax.lax.while_loop(
      lambda loop, end=end: cond(loop) & (loop[0] < end), body,
      (i, carry, positions, resize_cache(cache, length)))
  steps, carry, _, cache = loop
  tokens, mask, logp, topk_ids, topk_logp, _, finish = carry[:7]
  return DecodeOutput(tokens, mask, logp, finish, topk_ids, topk_logp, steps, cache)
