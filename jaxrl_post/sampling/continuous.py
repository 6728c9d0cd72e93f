"""Continuous batching: a fixed set of cache slots that finished rows hand to queued ones.

RL completions have long-tailed lengths. A static batch (`kernels.decode`)
runs every step for all its rows until the longest one ends, so its time is
batch × longest. Here `num_slots` rows decode together; when a row ends
(EOS, stop token or its budget), its slot is refilled with the next queued
row (prompt p's n samples are rows p·n … p·n + n − 1, queued in row order),
so the time follows the total of generated tokens instead:

  steps ≈ Σ_rows length / num_slots   (static: Σ_batches max_{rows in batch} length)

The whole generation is one jitted program (`generate`): a `lax.while_loop`
whose every step

  1. admits queued rows into free slots once `admit_size` slots are free (or
     as many as rows are left): their prompts are prefilled
     (`kernels.prefill`, one row per sample) and written into the slots'
     rows of the cache, which hold `prompt_len + max_new_tokens` slots per
     row, prompt first (`lax.cond`: most steps admit nothing);
  2. decodes one token in every slot.

Rows advance independently: the cache keeps one write index per row
(`KVCache.index` `int32[slots]`), and every row draws its step-s token with
the key `fold_in(fold_in(rng, s), row)` of its global row number, the key
`kernels.decode` uses for it: a row's tokens do not depend on the slot it got
or on when it entered, and equal those of a static batch up to float
rounding (different batch compositions and cache lengths sum in a different
order; tests compare tokens exactly).

Like the phases of `kernels.decode`, the steps run over the cache cut to the
shortest of a few lengths (`cache_lengths`) that holds every live row's
next write, so attention reads the slots the live rows can use: the longest
live row, not the cache length, sets the cost of a step. The loop over steps
sits inside an outer loop whose passes change the cut (a `lax.switch` over
the lengths; a pass ends when a row outgrows its cut or when the longest
rows have ended and a shorter one would do), so the cache is copied at a
change of length only, not at admissions. Each length compiles the model's
decode step once more; the number of queued rows never changes the program,
so draining a queue never recompiles.

With `prompt_class` / `class_caps` the queue is not first come, first served:
a free slot goes to the first queued row whose workload class holds fewer
slots than its cap (MISA-T's class caps, `sampling.admission`, turned into
slots by `RolloutScheduler.slot_caps`); rows of a class at its cap wait while
later rows of other classes pass them.

A row's samples are prefilled once per row (a group admitted together
computes its prompt n times), and its prompt slots are its own, not shared
with the group as in `kernels.prefill` (the group's rows may sit in any slots
and enter at different steps).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl_post.models.transformer import KVCache
from jaxrl_post.sampling.kernels import choose_tokens, decode_phases, prefill, resize_cache
from jaxrl_post.sampling.rollout import FINISH_EOS, FINISH_LENGTH, FINISH_STOP


class ContinuousOutput(NamedTuple):
  """Rows in queue order (row p·n + j: prompt p's sample j), as `kernels.DecodeOutput`."""

  tokens: jax.Array  # int32[rows, max_new_tokens], pad after the end
  mask: jax.Array  # bool[rows, max_new_tokens]
  logp: jax.Array  # float32[rows, max_new_tokens]
  finish_reason: jax.Array  # int32[rows]
  topk_ids: jax.Array | None  # int32[rows, max_new_tokens, K]
  topk_logp: jax.Array | None  # float32[rows, max_new_tokens, K]
  # int32[] (int32[devices] from `sampler.jitted_continuous` under data parallelism):
  steps: jax.Array  # decode steps run, each over all slots
  passes: jax.Array  # outer passes (changes of the cache length + 1)
  slot: jax.Array  # int32[rows], the slot each row decoded in
  start_step: jax.Array  # int32[rows], decode steps run before the row entered


class _Slots(NamedTuple):
  """The loop's state besides the cache: per slot, then the outputs per row."""

  logits: jax.Array  # float32[slots, vocab], next-token logits
  positions: jax.Array  # int32[slots], RoPE position of the next token
  step: jax.Array  # int32[slots], index of the next token within its row
  row: jax.Array  # int32[slots], local row number (meaningless where not alive)
  alive: jax.Array  # bool[slots]
  queued: jax.Array  # bool[rows], rows not yet admitted (False past `num_rows`)
  tokens: jax.Array
  mask: jax.Array
  logp: jax.Array
  topk_ids: jax.Array | None
  topk_logp: jax.Array | None
  finish: jax.Array
  steps: jax.Array
  passes: jax.Array
  slot: jax.Array
  start_step: jax.Array


def cache_lengths(prompt_len: int, max_new_tokens: int) -> list[int]:
  """The cache lengths a pass may decode over: those of `kernels.decode`'s phases.

  Example:
    >>> cache_lengths(64, 128)
    [82, 100, 118, 137, 155, 173, 192]
  """
  full = prompt_len + max_new_tokens
  return sorted({min(full, full - max_new_tokens + end) for end in decode_phases(max_new_tokens)})


def _write_prompt_rows(cache: KVCache, prompt: KVCache, slots: jax.Array) -> KVCache:
  """`cache` with rows `slots` holding `prompt`'s slots first and nothing after.

  `slots` `int32[admitted]`; an entry equal to the number of slots is
  dropped (no row to fill). The rows' old keys and values past the prompt
  stay but are masked out, and their write index restarts after the prompt.
  """
  p = prompt.max_len
  lead = (slice(None),) * cache.row_axis
  k_at = lead + (slots, slice(None), slice(None), slice(0, p))
  v_at = lead + (slots, slice(None), slice(0, p), slice(None))
  k = jax.tree.map(lambda c, x: c.at[k_at].set(x.astype(c.dtype), mode="drop"),
                   cache.k, prompt.k)
  v = jax.tree.map(lambda c, x: c.at[v_at].set(x.astype(c.dtype), mode="drop"),
                   cache.v, prompt.v)
  row_mask = jnp.pad(prompt.mask, ((0, 0), (0, cache.max_len - p)))
  return cache.replace(k=k, v=v, mask=cache.mask.at[slots].set(row_mask, mode="drop"),
                       index=cache.index.at[slots].set(p, mode="drop"))


def _put_back(full: KVCache, part: KVCache) -> KVCache:
  """`full` with its first `part.max_len` slots replaced by `part`'s (in place)."""
  if part.max_len == full.max_len:
    return part
  put = lambda f, x: jax.lax.dynamic_update_slice(f, x, (0,) * f.ndim)  # noqa: E731
  return full.replace(k=jax.tree.map(put, full.k, part.k), v=jax.tree.map(put, full.v, part.v),
                      mask=put(full.mask, part.mask), index=part.index)


def generate(graphdef, state, tokens, mask, rng, num_rows, *, num_samples: int, num_slots: int,
             admit_size: int, max_new_tokens: int, eos_ids, stop_ids, pad_id: int, temperature,
             top_p, top_k: int, greedy: bool, num_logprobs: int,
             first_row: jax.Array | int = 0, prompt_class: jax.Array | None = None,
             class_caps: jax.Array | None = None) -> ContinuousOutput:
  """Generates `num_rows` rows through `num_slots` cache slots (see the module docstring).

  Args:
    graphdef, state: `nnx.split(model)` of a `CausalLM`.
    tokens, mask: `[prompts, prompt_len]` left-padded prompts (a batch bucket;
      rows past `num_rows` are never generated).
    rng: PRNG key; row g draws its step-s token with
      `fold_in(fold_in(rng, s), first_row + g)`.
    num_rows: `int32[]`, rows to generate, ≤ prompts · n (the queue length;
      an array, so a different count within a bucket does not recompile).
    num_samples: n, rows per prompt. Static.
    num_slots: rows decoded together (the cache holds `num_slots ×
      (prompt_len + max_new_tokens)` slots). Static.
    admit_size: rows prefilled per admission (static), ≤ num_slots: rows
      are admitted once this many slots are free (or as many as rows are
      left in the queue). Small: slots stand idle for less time; large:
      fewer, larger prefills.
    max_new_tokens, eos_ids, stop_ids, pad_id, temperature, top_p, top_k,
    greedy, num_logprobs: as in `kernels.decode`.
    first_row: global row number of row 0 (a data shard's offset).
    prompt_class, class_caps: class-capped admission (MISA-T's per-class caps,
      `sampling.admission`, applied to slots): `int32[prompts]` each prompt's
      class in [0, C) and `int32[C]` the most slots rows of each class may hold
      at once (each ≥ 1, so an empty cache always admits). A free slot goes to
      the first queued row whose class is under its cap; rows of a class at
      its cap wait (HELD) while later rows of other classes pass them. None:
      first come, first served (the queue order).

  Returns:
    `ContinuousOutput` with `prompts · n` rows (those past `num_rows` empty).
  """
  model = nnx.merge(graphdef, state)
  num_prompts, prompt_len = tokens.shape
  rows, slots, t, k = num_prompts * num_samples, num_slots, max_new_tokens, num_logprobs
  if not 1 <= admit_size <= slots:
    raise ValueError(f"admit_size must be in [1, num_slots={slots}], got {admit_size}")
  full = prompt_len + t
  cache = model.init_cache(slots, full)
  cache = cache.replace(index=jnp.full((slots,), prompt_len, jnp.int32))
  num_rows = jnp.asarray(num_rows, jnp.int32)

  def need(c, cache):
    """Cache length the next step needs: every live row's next write, and a new prompt's."""
    return jnp.maximum(jnp.max(jnp.where(c.alive, cache.index, 0)), prompt_len) + 1

  row_class = None if class_caps is None else jnp.repeat(prompt_class, num_samples)

  def eligible(c: _Slots):
    """bool[rows]: queued rows a free slot may take now (in queue order)."""
    if class_caps is None:
      return c.queued
    num_classes = class_caps.shape[0]
    live = jnp.zeros((num_classes,), jnp.int32).at[row_class[c.row]].add(
      c.alive.astype(jnp.int32))
    # A queued row's rank among its class's queued rows: the first (cap − live) pass.
    onehot = (row_class[:, None] == jnp.arange(num_classes)[None, :]) & c.queued[:, None]
    rank = jnp.take_along_axis(jnp.cumsum(onehot, axis=0), row_class[:, None], axis=1)[:, 0] - 1
    return c.queued & (rank < (class_caps - live)[row_class])

  def more(loop):
    c, _ = loop
    return jnp.any(c.alive) | jnp.any(c.queued)

  def admit(c: _Slots, cache: KVCache):
    ready = eligible(c)
    count = jnp.minimum(jnp.minimum(admit_size, jnp.sum(ready, dtype=jnp.int32)),
                        slots - jnp.sum(c.alive, dtype=jnp.int32))
    new = jnp.arange(admit_size, dtype=jnp.int32)
    row = jnp.nonzero(ready, size=admit_size, fill_value=rows)[0].astype(jnp.int32)
    prompt = jnp.minimum(row // num_samples, num_prompts - 1)
    start = prefill(graphdef, state, tokens[prompt], mask[prompt], cache_len=prompt_len,
                    num_samples=1)
    free = jnp.nonzero(~c.alive, size=admit_size, fill_value=slots)[0].astype(jnp.int32)
    at = jnp.where(new < count, free, slots)  # `slots`: dropped
    put = lambda x, value: x.at[at].set(value, mode="drop")  # noqa: E731
    entered = jnp.where(new < count, row, rows)
    c = c._replace(logits=put(c.logits, start.logits), positions=put(c.positions, start.positions),
                   step=put(c.step, 0), row=put(c.row, row), alive=put(c.alive, True),
                   queued=c.queued.at[entered].set(False, mode="drop"),
                   slot=c.slot.at[entered].set(free, mode="drop"),
                   start_step=c.start_step.at[entered].set(c.steps, mode="drop"))
    return c, _write_prompt_rows(cache, start.cache, at)

  def decode_step(c: _Slots, cache: KVCache):
    choice = choose_tokens(c.logits, rng, temperature=temperature, top_k=top_k, top_p=top_p,
                           greedy=greedy, num_logprobs=k, row_ids=first_row + c.row,
                           step_ids=c.step)
    out = jnp.where(c.alive, c.row, rows)  # `rows`: dropped
    record = lambda x, value: x.at[out, c.step].set(value, mode="drop")  # noqa: E731
    is_eos = jnp.any(choice.token[:, None] == eos_ids[None, :], axis=-1)
    is_stop = jnp.any(choice.token[:, None] == stop_ids[None, :], axis=-1) & ~is_eos
    ended = jnp.where(is_eos | is_stop, out, rows)
    c = c._replace(
      tokens=record(c.tokens, choice.token), mask=record(c.mask, True),
      logp=record(c.logp, choice.logp),
      topk_ids=record(c.topk_ids, choice.topk_ids) if k else None,
      topk_logp=record(c.topk_logp, choice.topk_logp) if k else None,
      finish=c.finish.at[ended].set(jnp.where(is_eos, FINISH_EOS, FINISH_STOP), mode="drop"),
      alive=c.alive & ~is_eos & ~is_stop & (c.step + 1 < t))
    # Every slot runs the model (one batch); a slot that just ended writes
    # into its own row, which the next admission resets.
    logits, cache = model(choice.token[:, None], positions=c.positions[:, None], cache=cache)
    return c._replace(logits=logits[:, 0], positions=c.positions + 1, step=c.step + 1,
                      steps=c.steps + 1), cache

  lengths = cache_lengths(prompt_len, t)

  def admit_and_step(loop):
    c, cache = loop
    # Admit once admit_size slots are free (or as many as rows wait), if any waiting row may
    # enter: a class at its cap does not make the others admit in smaller batches.
    left = jnp.sum(c.queued, dtype=jnp.int32)
    free = slots - jnp.sum(c.alive, dtype=jnp.int32)
    ready = left > 0 if class_caps is None else jnp.any(eligible(c))
    c, cache = jax.lax.cond(ready & (free >= jnp.minimum(admit_size, left)), admit,
                            lambda c, cache: (c, cache), c, cache)
    return decode_step(c, cache)

  def decode_at(j):
    """Admits and decodes over the cache cut to `lengths[j]` while that is the right length."""
    length, shorter = lengths[j], lengths[j - 1] if j else 0

    def cond(loop):
      # Work is left, every live row's next write fits, and no shorter cut holds them all.
      length_needed = need(*loop)
      return more(loop) & (length_needed <= length) & (length_needed > shorter)

    def run(c, cache):
      c, part = jax.lax.while_loop(cond, admit_and_step, (c, resize_cache(cache, length)))
      return c, _put_back(cache, part)

    return run

  branches = [decode_at(j) for j in range(len(lengths))]

  def one_pass(loop):
    c, cache = loop
    branch = jnp.sum(jnp.asarray(lengths) < need(c, cache))  # the shortest length that fits
    c, cache = jax.lax.switch(branch, branches, c, cache)
    return c._replace(passes=c.passes + 1), cache

  vocab = model.config.vocab_size
  c = _Slots(
    logits=jnp.zeros((slots, vocab), jnp.float32), positions=jnp.zeros((slots,), jnp.int32),
    step=jnp.zeros((slots,), jnp.int32), row=jnp.zeros((slots,), jnp.int32),
    alive=jnp.zeros((slots,), jnp.bool_), queued=jnp.arange(rows) < num_rows,
    tokens=jnp.full((rows, t), pad_id, jnp.int32), mask=jnp.zeros((rows, t), jnp.bool_),
    logp=jnp.zeros((rows, t), jnp.float32),
    topk_ids=jnp.full((rows, t, k), pad_id, jnp.int32) if k else None,
    topk_logp=jnp.zeros((rows, t, k), jnp.float32) if k else None,
    finish=jnp.full((rows,), FINISH_LENGTH, jnp.int32), steps=jnp.int32(0), passes=jnp.int32(0),
    slot=jnp.full((rows,), -1, jnp.int32), start_step=jnp.full((rows,), -1, jnp.int32))
  c, _ = jax.lax.while_loop(more, one_pass, (c, cache))
  return ContinuousOutput(c.tokens, c.mask, c.logp, c.finish, c.topk_ids, c.topk_logp, c.steps,
                          c.passes, c.slot, c.start_step)
