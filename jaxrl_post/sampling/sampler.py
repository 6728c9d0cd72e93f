"""`Sampler`: the Python side of generation — bucketing, padding, jit, bookkeeping.

  sampler = Sampler(model, tokenizer)              # or Sampler(model) with token-id prompts
  rollout = sampler.generate(state, ["12+7=", "3*4="], n_samples_per_prompt=8,
                             max_new_tokens=64, temperature=1.0, rng=jax.random.key(0))
  scored = sampler.score(state, rollout.prompt_tokens, rollout.prompt_mask,
                         rollout.completion_tokens, rollout.completion_mask)

`generate` is three public phases, which a benchmark can time one by one:

  batch = sampler.prepare(prompts)                          # pad to buckets, put on device
  start = sampler.prefill(state, batch, max_new_tokens=64, n_samples_per_prompt=8)
  out = sampler.decode(state, start, rng=rng)      # donates start's cache
  rollout = sampler.make_rollout(batch, out, n_samples_per_prompt=8)

`generate_continuous` gives the same `Rollout` through a fixed number of cache
slots that finished rows hand to queued ones (`continuous.py`), for
long-tailed completion lengths.

Prompt lengths and prompt counts are padded up to a few static buckets
(powers of two by default), so a training run compiles the prefill and
decode kernels once per bucket it meets, not once per batch.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, PartitionSpec

from jaxrl_post.models.transformer import CausalLM
from jaxrl_post.parallel.axes import DEFAULT_RULES, Rules, axis_rules
from jaxrl_post.parallel.mesh import data_parallel_axes, put_batch
from jaxrl_post.parallel.multihost import to_host
from jaxrl_post.sampling import continuous, kernels, scoring
from jaxrl_post.sampling.grammar import TokenGrammar
from jaxrl_post.sampling.rollout import FINISH_NAMES, Rollout

_MAX_END_IDS = 8  # eos / stop ids are padded to this many, so changing them never recompiles


def _power_of_two_buckets(smallest: int, largest: int) -> tuple[int, ...]:
  buckets, size = [], smallest
  while size < largest:
    buckets.append(size)
    size *= 2
  return tuple(buckets) + (largest,)


def _bucket(size: int, buckets: Sequence[int]) -> int:
  for bucket in buckets:
    if size <= bucket:
      return bucket
  return buckets[-1]


def end_id_array(ids: Sequence[int], what: str) -> jax.Array:
  """`ids` as the fixed-size `int32[_MAX_END_IDS]` array the decode kernel takes (−1 padded)."""
  ids = list(ids)
  if len(ids) > _MAX_END_IDS:
    raise ValueError(f"at most {_MAX_END_IDS} {what} are supported, got {len(ids)}")
  return jnp.asarray(ids + [-1] * (_MAX_END_IDS - len(ids)), jnp.int32)


class PromptBatch(NamedTuple):
  """Prompts padded to their buckets and put on the device(s) (`Sampler.prepare`).

  Rows past `num_prompts` are filler (batch bucketing): one real token each,
  so that every row is well defined; their samples are dropped.
  """

  tokens: jax.Array  # int32[prompt bucket, length bucket], left-padded
  mask: jax.Array  # bool[prompt bucket, length bucket], False on padding
  num_prompts: int  # real prompts


class Prefilled(NamedTuple):
  """`Sampler.prefill`'s output: the kernel's, and the budget its cache was made for."""

  start: kernels.PrefillOutput  # next-token logits, positions and the cache
  max_new_tokens: int


class Sampler:
  """Generates completions from a `CausalLM` with jitted prefill + decode kernels.

  Args:
    model: the model whose graph the sampler runs; `generate` takes the
      parameters separately (`nnx.state(model)`), so a trainer passes fresh
      parameters each step without rebuilding the sampler.
    tokenizer: optional; needed for string prompts. Supplies pad / eos ids.
    max_prompt_len: the largest prompt bucket. Longer prompts raise, unless
      `truncate_prompts` keeps their last `max_prompt_len` tokens.
    prompt_len_buckets, batch_buckets: static sizes prompts and prompt counts
      are padded up to (default: powers of two, from 16 prompt tokens and 1
      prompt).
    eos_ids: ids that end a row (default: the tokenizer's `end_ids` — its eos
      plus a checkpoint's end-of-turn ids — else its eos, else the model
      config's `eos_token_ids`).
    pad_id: pad id (default: tokenizer's, else 0).
    mesh, rules: if given, the batch is sharded over the mesh axes that the
      `batch` logical axis maps to, and activations / cache follow `rules`.
      The parameters' placement is the caller's.
    grammar: optional `sampling.grammar.TokenGrammar` for legal-token decoding: `generate` /
      `decode` mask illegal tokens (rollout log-probs are the masked, renormalised ones) and
      `score` recomputes the same masked log-probs, so sampler and trainer agree. None (the
      default) runs exactly the unconstrained kernels. `generate_continuous` refuses it.
  """

  def __init__(self, model: CausalLM, tokenizer=None, *, max_prompt_len: int = 256,
               prompt_len_buckets: Sequence[int] | None = None,
               batch_buckets: Sequence[int] | None = None, max_batch: int = 4096,
               truncate_prompts: bool = False, eos_ids: Sequence[int] | None = None,
               pad_id: int | None = None, mesh: Mesh | None = None, rules: Rules = DEFAULT_RULES,
               grammar: TokenGrammar | None = None):
    self.graphdef, self._default_state = nnx.split(model)
    self.config = model.config
    self.tokenizer = tokenizer
    self.prompt_len_buckets = tuple(sorted(prompt_len_buckets or _power_of_two_buckets(
      min(16, max_prompt_len), max_prompt_len)))
    self.batch_buckets = tuple(sorted(batch_buckets or _power_of_two_buckets(1, max_batch)))
    self.truncate_prompts = truncate_prompts
    if eos_ids is None:
      # A chat checkpoint's tokenizer also ends on its end-of-turn ids (`Tokenizer.end_ids`).
      if tokenizer is not None and getattr(tokenizer, "end_ids", None):
        eos_ids = list(tokenizer.end_ids)
      elif tokenizer is not None and tokenizer.eos_id is not None:
        eos_ids = [tokenizer.eos_id]
      else:
        eos_ids = list(model.config.eos_token_ids)
    self.eos_ids = tuple(int(i) for i in eos_ids)
    if pad_id is None:
      pad_id = tokenizer.pad_id if tokenizer is not None else (model.config.pad_token_id or 0)
    self.pad_id = int(pad_id)
    self.mesh, self.rules = mesh, tuple(rules)
    if grammar is not None and grammar.vocab_size != self.config.vocab_size:
      raise ValueError(f"grammar: its vocabulary ({grammar.vocab_size} ids) differs from the "
                       f"model's vocab_size={self.config.vocab_size}")
    self.grammar = grammar
    # The jitted kernels are module-level functions with the graph and mesh as
    # static arguments, so samplers of the same model share compilations.
    self._static = dict(graphdef=self.graphdef, mesh=mesh, rules=self.rules)
  # ---- host side ----

  def _tokenize(self, prompts) -> list[list[int]]:
    if not len(prompts):
      raise ValueError("generate() got an empty prompt list")
    if isinstance(prompts[0], str):
      if self.tokenizer is None:
        raise ValueError("string prompts need a tokenizer; pass Sampler(model, tokenizer)")
      return [self.tokenizer.encode(p) for p in prompts]
    return [[int(t) for t in p] for p in prompts]

  def _pad_prompts(self, prompts: list[list[int]]) -> tuple[np.ndarray, np.ndarray, int]:
    largest = self.prompt_len_buckets[-1]
    for i, prompt in enumerate(prompts):
      if not prompt:
        raise ValueError(f"prompt {i} is empty")
      if len(prompt) > largest and not self.truncate_prompts:
        raise ValueError(
          f"prompt {i} has {len(prompt)} tokens, more than the largest prompt bucket "
          f"({largest}); raise max_prompt_len or set truncate_prompts=True")
    prompts = [p[-largest:] for p in prompts]  # left truncation keeps the question's end
    length = _bucket(max(map(len, prompts)), self.prompt_len_buckets)
    rows = _bucket(len(prompts), self.batch_buckets)
    if len(prompts) > rows:
      raise ValueError(f"{len(prompts)} prompts exceed the largest batch bucket ({rows})")
    tokens = np.full((rows, length), self.pad_id, np.int32)
    mask = np.zeros((rows, length), bool)
    for i, prompt in enumerate(prompts):
      tokens[i, length - len(prompt):] = prompt
      mask[i, length - len(prompt):] = True
    # Filler rows (batch bucketing) get one real token so every row is well defined.
    mask[len(prompts):, -1] = True
    return tokens, mask, len(prompts)

  def _put_batch(self, *arrays):
    if self.mesh is None:
      return tuple(jnp.asarray(a) for a in arrays)
    return tuple(put_batch(list(arrays), self.mesh, self.rules))

  def prepare(self, prompts) -> PromptBatch:
    """Tokenizes (string prompts), pads to the buckets and puts the prompts on the device(s).

    Prompts are left-padded to the smallest length bucket that holds the
    longest, and their count to the smallest batch bucket; with a mesh, the
    rows are split over its batch axes.
    """
    tokens, mask, num_prompts = self._pad_prompts(self._tokenize(prompts))
    tokens, mask = self._put_batch(tokens, mask)
    return PromptBatch(tokens, mask, num_prompts)

  def prefill(self, state, batch: PromptBatch, *, max_new_tokens: int,
              n_samples_per_prompt: int = 1) -> Prefilled:
    """Runs the prompts once into a fresh cache (`kernels.prefill`, jitted).

    Returns per row (prompt p's samples are rows p·n … p·n + n − 1) the
    next-token logits `[rows, vocab]`, positions `[rows]` and a cache with
    room for `max_new_tokens` more; with n > 1 a group's rows share its
    prompt's slots. Compiles once per (batch bucket, length bucket,
    max_new_tokens, n).
    """
    _check_positive(n_samples_per_prompt=n_samples_per_prompt, max_new_tokens=max_new_tokens)
    state = self._default_state if state is None else state
    start = jitted_prefill(state, batch.tokens, batch.mask,
                           cache_len=batch.tokens.shape[1] + max_new_tokens,
                           num_samples=n_samples_per_prompt, **self._static)
    return Prefilled(start, max_new_tokens)

  def decode(self, state, prefilled: Prefilled, *, temperature: float = 1.0, top_k: int = 0,
             top_p: float = 1.0, greedy: bool = False, stop_tokens: Sequence[int] = (),
             num_logprobs: int = 0, rng: jax.Array | None = None) -> kernels.DecodeOutput:
    """Samples up to `prefill`'s `max_new_tokens` per row (`kernels.decode`, jitted).

    The prefill's cache is donated: its buffer is reused, so `prefilled`
    must not be decoded again. The arguments are those of `generate`.
    Returns every row of the batch bucket (filler rows too; `make_rollout`
    drops them).
    """
    start, max_new_tokens = prefilled
    rng = self._check_sampling(max_new_tokens=max_new_tokens, temperature=temperature,
                               top_k=top_k, top_p=top_p, greedy=greedy, rng=rng)
    state = self._default_state if state is None else state
    return jitted_decode(state, start.cache, start.logits, start.positions, rng,
                         end_id_array(self.eos_ids, "eos ids"),
                         end_id_array(stop_tokens, "stop tokens"), jnp.float32(temperature),
                         jnp.float32(top_p), self.grammar, max_new_tokens=max_new_tokens,
                         top_k=top_k,
                         greedy=greedy, num_logprobs=num_logprobs, pad_id=self.pad_id,
                         **self._static)

  def make_rollout(self, batch: PromptBatch,
                   out: kernels.DecodeOutput | continuous.ContinuousOutput, *,
                   n_samples_per_prompt: int = 1) -> Rollout:
    """The `Rollout` of `batch`'s real prompts from a decode output (filler rows dropped)."""
    n, num_prompts = n_samples_per_prompt, batch.num_prompts
    rows = num_prompts * n
    return Rollout(
      prompt_tokens=jnp.repeat(batch.tokens[:num_prompts], n, axis=0),
      prompt_mask=jnp.repeat(batch.mask[:num_prompts], n, axis=0),
      completion_tokens=out.tokens[:rows], completion_mask=out.mask[:rows],
      logp=out.logp[:rows], finish_reason=out.finish_reason[:rows],
      group_ids=jnp.repeat(jnp.arange(num_prompts, dtype=jnp.int32), n),
      topk_ids=None if out.topk_ids is None else out.topk_ids[:rows],
      topk_logp=None if out.topk_logp is None else out.topk_logp[:rows])

  def _check_sampling(self, *, max_new_tokens, temperature, top_k, top_p, greedy, rng):
    """Validates the sampling arguments; returns the key (a fixed one when greedy)."""
    if not 0.0 < top_p <= 1.0:
      raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if temperature <= 0:
      raise ValueError(f"temperature must be > 0 (use greedy=True for argmax), got {temperature}")
    if top_k < 0 or top_k > self.config.vocab_size:
      raise ValueError(f"top_k must be in [0, vocab_size={self.config.vocab_size}], got {top_k}")
    _check_positive(max_new_tokens=max_new_tokens)
    if rng is None:
      if not greedy:
        raise ValueError("sampling needs an rng key (or greedy=True)")
      rng = jax.random.key(0)
    return rng

  def generate(self, state, prompts, *, n_samples_per_prompt: int = 1, max_new_tokens: int = 64,
               temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
               greedy: bool = False, stop_tokens: Sequence[int] = (), num_logprobs: int = 0,
               rng: jax.Array | None = None) -> Rollout:
    """Samples `n_samples_per_prompt` completions for each prompt.

    `prepare`, `prefill`, `decode` and `make_rollout` in a row.

    Args:
      state: model parameters (`nnx.state(model)`); None uses the model's own.
      prompts: strings (with a tokenizer) or token-id sequences.
      n_samples_per_prompt: n ≥ 1; the prompt is prefilled once and its n
        rows share its cached keys and values (`kernels.prefill`).
      max_new_tokens: generation budget (static: one compile per value).
      temperature: > 0; logits are divided by it before sampling and before
        the recorded log-probs.
      top_k: sample from the k most likely tokens (0 = all).
      top_p: nucleus sampling mass in (0, 1].
      greedy: argmax instead of sampling (log-probs still at `temperature`).
      stop_tokens: extra ids that end a row (finish reason "stop").
      num_logprobs: also record the top-K ids and log-probs per position.
      rng: PRNG key (required unless greedy).

    Returns:
      A `Rollout` with `len(prompts) * n_samples_per_prompt` rows.
    """
    sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p, greedy=greedy)
    # All arguments are checked before any work is dispatched.
    _check_positive(n_samples_per_prompt=n_samples_per_prompt)
    rng = self._check_sampling(max_new_tokens=max_new_tokens, **sampling, rng=rng)
    batch = self.prepare(prompts)
    start = self.prefill(state, batch, max_new_tokens=max_new_tokens,
                         n_samples_per_prompt=n_samples_per_prompt)
    out = self.decode(state, start, **sampling, stop_tokens=stop_tokens,
                      num_logprobs=num_logprobs, rng=rng)
    return self.make_rollout(batch, out, n_samples_per_prompt=n_samples_per_prompt)

  def generate_continuous(self, state, prompts, *, num_slots: int, admit_size: int | None = None,
                          n_samples_per_prompt: int = 1, max_new_tokens: int = 64,
                          temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                          greedy: bool = False, stop_tokens: Sequence[int] = (),
                          num_logprobs: int = 0, rng: jax.Array | None = None,
                          return_stats: bool = False,
                          prompt_classes: Sequence[int] | None = None,
                          class_caps: Sequence[int] | None = None):
    """`generate` through `num_slots` cache slots that finished rows hand to queued ones.

    The rows (prompt p's n samples are rows p·n … p·n + n − 1) queue in row
    order; `num_slots` of them decode together, and a row that ends frees
    its slot for the next (`continuous.generate`, one jitted program for the
    whole queue). The time then follows the total of generated tokens, not
    batch × longest row; the cache holds `num_slots × (prompt bucket +
    max_new_tokens)` slots whatever the number of prompts.

    Row g draws its step-s token with the key `fold_in(fold_in(rng, s), g)`
    as in `generate`, so the tokens equal `generate`'s with the same
    arguments (up to float rounding: the rows are batched differently), and
    the `Rollout` is the one `generate` returns: same rows, order, group ids,
    finish reasons, log-probs (within float rounding) and top-K.

    Args:
      num_slots: rows decoded together (static; ≥ 1).
      admit_size: queued rows prefilled together, in [1, num_slots] (static);
        default `max(1, num_slots // 8)`. Rows are admitted when this many
        slots are free (or as many as rows are left): small keeps fewer slots
        idle, large prefills in fewer, larger batches.
      return_stats: also return a dict with the decode `steps` (each over
        all slots) and the outer-loop `passes` (ints; the most of any
        device), and per row (in the rollout's order) its `slot` and
        `start_step` (decode steps run before it entered, on its device).
      prompt_classes, class_caps: class-capped admission (both or neither):
        each prompt's workload class in [0, C) and, per class, the most
        slots its rows may hold at once (≥ 1; e.g. MISA-T's caps,
        `sampling.admission`). A freed slot goes to the first queued row
        whose class is under its cap. Under data parallelism each device
        applies ⌈cap / devices⌉ to its own slots. The rows' tokens do not
        change (each row keeps its key), only when they are generated.
      Others as in `generate`.

    Meshes: under pure data parallelism (the batch axes cover the mesh and
    divide the prompt bucket; `parallel.mesh.data_parallel_axes`) every
    device runs its own queue, its prompts' rows, through its own
    `num_slots / devices` slots (`num_slots` must divide evenly, and
    `admit_size` fit in a device's slots); the rows keep their global keys,
    so the rollout is the same. Any other mesh runs the one program under
    the sharding rules, partitioned by XLA (correct; not tuned).
    """
    _check_positive(n_samples_per_prompt=n_samples_per_prompt, num_slots=num_slots)
    if self.grammar is not None:
      raise ValueError("generate_continuous does not support a grammar (Sampler(grammar=...));"
                       " use generate")
    admit_size = max(1, num_slots // 8) if admit_size is None else admit_size
    if not 1 <= admit_size <= num_slots:
      raise ValueError(f"admit_size must be in [1, num_slots={num_slots}], got {admit_size}")
    rng = self._check_sampling(max_new_tokens=max_new_tokens, temperature=temperature,
                               top_k=top_k, top_p=top_p, greedy=greedy, rng=rng)
    classes = _class_arrays(prompt_classes, class_caps, len(prompts))
    state = self._default_state if state is None else state
    batch = self.prepare(prompts)
    if classes is not None:
      bucket = batch.tokens.shape[0]
      classes = (jnp.zeros((bucket,), jnp.int32).at[:len(prompts)].set(classes[0]), classes[1])
    n = n_samples_per_prompt
    data = () if self.mesh is None else data_parallel_axes(self.mesh, self.rules,
                                                          batch.tokens.shape[0])
    if data:
      shards = math.prod(self.mesh.shape[name] for name in data)
      if num_slots % shards or admit_size > num_slots // shards:
        raise ValueError(
          f"under data parallelism over {shards} devices each device decodes num_slots / "
          f"{shards} slots: num_slots={num_slots} must be a multiple of {shards} and "
          f"admit_size={admit_size} at most num_slots / {shards}")
    out = jitted_continuous(
      state, batch.tokens, batch.mask, rng, jnp.int32(batch.num_prompts * n),
      end_id_array(self.eos_ids, "eos ids"), end_id_array(stop_tokens, "stop tokens"),
      jnp.float32(temperature), jnp.float32(top_p), classes, num_samples=n, num_slots=num_slots,
      admit_size=admit_size, max_new_tokens=max_new_tokens, top_k=top_k, greedy=greedy,
      num_logprobs=num_logprobs, pad_id=self.pad_id, **self._static)
    if data:
      # Every device's queue ends before anything else runs on the mesh: the
      # rollout's slicing may need collectives, where a device that ended
      # early would otherwise wait for the others (XLA:CPU aborts after 40 s).
      out = jax.block_until_ready(out)
    rollout = self.make_rollout(batch, out, n_samples_per_prompt=n)
    if return_stats:
      rows = batch.num_prompts * n
      # Per device under data parallelism: the longest queue's counts.
      return rollout, dict(steps=int(np.max(to_host(out.steps))),
                           passes=int(np.max(to_host(out.passes))),
                           slot=out.slot[:rows], start_step=out.start_step[:rows])
    return rollout

  def score(self, state, prompt_tokens, prompt_mask, completion_tokens, completion_mask, *,
            temperature: float = 1.0, top_k: int = 0, candidate_ids: jax.Array | None = None,
            num_micro_batches: int = 1) -> scoring.ScoreOutput:
    """Per-token log-probs (and entropy, top-K) of given completions; see `scoring.score`.

    `candidate_ids` `[batch, time, C]`: also the log-probs of these ids
    (`candidate_logp`), e.g. a teacher scoring the student's top-K.
    `num_micro_batches`: rows are scored in this many micro-batches inside
    one compiled call, so the pass's memory is one micro-batch's.
    With the sampler's grammar, the log-probs (and entropies, top-K) are those of the masked,
    renormalised distribution, the states recomputed from the completions.
    """
    state = self._default_state if state is None else state
    return _score(state, prompt_tokens, prompt_mask, completion_tokens, completion_mask,
                  jnp.float32(temperature), candidate_ids, self.grammar, top_k=top_k,
                  num_micro_batches=int(num_micro_batches), **self._static)

  def decode_text(self, rollout: Rollout) -> list[str]:
    """Completion texts (needs a tokenizer); masked positions are dropped."""
    tokens, mask = to_host((rollout.completion_tokens, rollout.completion_mask))
    ends = set(self.eos_ids)
    return [self.tokenizer.decode([int(t) for t, m in zip(row, keep) if m and t not in ends])
            for row, keep in zip(tokens, mask)]


def _check_positive(**values):
  for name, value in values.items():
    if value < 1:
      raise ValueError(f"{name} must be ≥ 1, got {value}")


def _context(mesh, rules):
  return axis_rules(mesh, rules) if mesh is not None else contextlib.nullcontext()


@functools.partial(jax.jit, static_argnames=("graphdef", "mesh", "rules", "cache_len",
                                             "num_samples"))
def jitted_prefill(state, tokens, mask, *, graphdef, mesh, rules, cache_len, num_samples):
  with _context(mesh, rules):
    return kernels.prefill(graphdef, state, tokens, mask, cache_len=cache_len,
                           num_samples=num_samples)


# The cache is donated: decode updates it in place and returns it aliased.
@functools.partial(jax.jit, donate_argnums=(1,), static_argnames=(
  "graphdef", "mesh", "rules", "max_new_tokens", "top_k", "greedy", "num_logprobs", "pad_id"))
def jitted_decode(state, cache, logits, positions, rng, eos_ids, stop_ids, temperature, top_p,
                  grammar=None, *, graphdef, mesh, rules, max_new_tokens, top_k, greedy,
                  num_logprobs, pad_id):
  """`kernels.decode`; under pure data parallelism, one loop per device.

  One global loop ends each step with a cross-device reduction (has every row
  finished?), which makes all devices wait for the slowest at every step. On a
  CPU host split into one device per core that cost 6–9 % of the decode time
  (docs/benchmarks.md). When each device holds its own rows and a full copy of
  the rest, `shard_map` runs `kernels.decode` on every device's rows instead:
  each loop exits when its own rows are done, and the only collectives are two
  maxima at the end. Rows draw with keys named by their global row number
  (`first_row`), so the samples are the same either way.
  """
  def run(cache, logits, positions, state, rng, eos_ids, stop_ids, temperature, top_p, grammar,
          first_row=0):
    return kernels.decode(graphdef, state, kernels.PrefillOutput(logits, positions, cache), rng,
                          max_new_tokens=max_new_tokens, eos_ids=eos_ids, stop_ids=stop_ids,
                          pad_id=pad_id, temperature=temperature, top_p=top_p, top_k=top_k,
                          greedy=greedy, num_logprobs=num_logprobs, first_row=first_row,
                          grammar=grammar)

  shared = (state, rng, eos_ids, stop_ids, temperature, top_p, grammar)
  prompts = () if cache.prefix_mask is None else (cache.prefix_mask.shape[0],)
  data = () if mesh is None else data_parallel_axes(mesh, rules, logits.shape[0], *prompts)
  if not data:
    with _context(mesh, rules):
      return run(cache, logits, positions, *shared)

  def local(cache, logits, positions, *shared):
    out = run(cache, logits, positions, *shared,
              first_row=jax.lax.axis_index(data) * logits.shape[0])
    # The loops may end at different steps: report the longest.
    cache = out.cache.replace(index=jax.lax.pmax(out.cache.index, data))
    return out._replace(steps=jax.lax.pmax(out.steps, data), cache=cache)

  rows = PartitionSpec(data)
  # Every buffer's row axis is rows or prompts, both split the same way: the
  # leading axis, after the `layers` axis of a stacked (scan_layers) cache.
  layer_rows = PartitionSpec(*(None,) * cache.row_axis, data)
  cache_spec = jax.tree.map(lambda _: rows, cache).replace(
    index=PartitionSpec(), k=jax.tree.map(lambda _: layer_rows, cache.k),
    v=jax.tree.map(lambda _: layer_rows, cache.v),
    prefix_k=jax.tree.map(lambda _: layer_rows, cache.prefix_k),
    prefix_v=jax.tree.map(lambda _: layer_rows, cache.prefix_v))
  top = rows if num_logprobs else None
  out_specs = kernels.DecodeOutput(rows, rows, rows, rows, top, top, PartitionSpec(), cache_spec)
  # check_vma=False: the loop carries mix per-device rows with replicated
  # counters, which the varying-axes checker would make us annotate by hand.
  return jax.shard_map(local, mesh=mesh, in_specs=(cache_spec, rows, rows) + (PartitionSpec(),) * 7,
                       out_specs=out_specs, check_vma=False)(cache, logits, positions, *shared)


def _class_arrays(prompt_classes, class_caps, num_prompts: int):
  """`(int32[prompts], int32[C])` for class-capped admission, or None; ValueErrors name the
  argument."""
  if prompt_classes is None and class_caps is None:
    return None
  if prompt_classes is None or class_caps is None:
    raise ValueError("prompt_classes and class_caps go together (class-capped admission); "
                     "give both or neither")
  classes = np.asarray(prompt_classes, np.int64)
  caps = np.asarray(class_caps, np.int64)
  if classes.shape != (num_prompts,):
    raise ValueError(f"prompt_classes has shape {classes.shape}; one class per prompt "
                     f"({num_prompts},)")
  if caps.ndim != 1 or not caps.size or np.any(caps < 1):
    raise ValueError(f"class_caps={caps.tolist()} must be one cap >= 1 per class (an empty "
                     "cache must always admit a row)")
  if np.any(classes < 0) or np.any(classes >= caps.size):
    raise ValueError(f"prompt_classes must be in [0, {caps.size}) (one cap per class), got "
                     f"{sorted(set(classes.tolist()))}")
  return jnp.asarray(classes, jnp.int32), jnp.asarray(caps, jnp.int32)


@functools.partial(jax.jit, static_argnames=(
  "graphdef", "mesh", "rules", "num_samples", "num_slots", "admit_size", "max_new_tokens", "top_k",
  "greedy", "num_logprobs", "pad_id"))
def jitted_continuous(state, tokens, mask, rng, num_rows, eos_ids, stop_ids, temperature, top_p,
                      classes=None, *, graphdef, mesh, rules, num_samples, num_slots, admit_size,
                      max_new_tokens, top_k, greedy, num_logprobs, pad_id):
  """`continuous.generate`: the whole queue in one compiled program.

  Under pure data parallelism (as in `jitted_decode`) each device runs
  `continuous.generate` on its own prompts' rows with `num_slots / devices`
  slots inside `shard_map`: its queue is its rows (global numbers from
  `first_row`, which name their keys). The program has no collective at
  all (the step counters come back per device, `int32[devices]`): the
  devices' queues may take seconds apart, and on CPU a device waiting at a
  collective for longer than XLA's rendezvous timeout (40 s) aborts the
  process.

  `classes`: None, or `(prompt_class int32[prompts], class_caps int32[C])`
  (`continuous.generate`); the caps are per device's slots there, ⌈cap / devices⌉.
  """
  def run(tokens, mask, prompt_class, state, rng, num_rows, eos_ids, stop_ids, temperature,
          top_p, class_caps, *, num_slots=num_slots, first_row=0):
    return continuous.generate(
      graphdef, state, tokens, mask, rng, num_rows, num_samples=num_samples, num_slots=num_slots,
      admit_size=admit_size, max_new_tokens=max_new_tokens, eos_ids=eos_ids, stop_ids=stop_ids,
      pad_id=pad_id, temperature=temperature, top_p=top_p, top_k=top_k, greedy=greedy,
      num_logprobs=num_logprobs, first_row=first_row, prompt_class=prompt_class,
      class_caps=class_caps)

  prompt_class, class_caps = (None, None) if classes is None else classes
  shared = (state, rng, num_rows, eos_ids, stop_ids, temperature, top_p)
  data = () if mesh is None else data_parallel_axes(mesh, rules, tokens.shape[0], num_slots)
  if not data:
    with _context(mesh, rules):
      return run(tokens, mask, prompt_class, *shared, class_caps)
  shards = math.prod(mesh.shape[name] for name in data)
  local_slots = num_slots // shards
  if class_caps is not None:
    class_caps = -(-class_caps // shards)  # ⌈cap / devices⌉ of each device's slots

  def local(tokens, mask, prompt_class, state, rng, num_rows, *rest):
    device = jax.lax.axis_index(data)
    rows = tokens.shape[0] * num_samples
    first_row = device * rows
    out = run(tokens, mask, prompt_class, state, rng, jnp.clip(num_rows - first_row, 0, rows),
              *rest, num_slots=local_slots, first_row=first_row)
    return out._replace(steps=out.steps[None], passes=out.passes[None],
                        slot=jnp.where(out.slot >= 0, out.slot + device * local_slots, -1))

  rows = PartitionSpec(data)
  top = rows if num_logprobs else None
  out_specs = continuous.ContinuousOutput(rows, rows, rows, rows, top, top, rows, rows, rows, rows)
  # check_vma=False: as in `jitted_decode`, the loop carries mix per-device and
  # replicated values.
  class_spec = None if prompt_class is None else rows
  return jax.shard_map(local, mesh=mesh,
                       in_specs=(rows, rows, class_spec) + (PartitionSpec(),) * 8,
                       out_specs=out_specs, check_vma=False)(tokens, mask, prompt_class, *shared,
                                                             class_caps)


@functools.partial(jax.jit, static_argnames=("graphdef", "mesh", "rules", "top_k",
                                             "num_micro_batches"))
def _score(state, prompt_tokens, prompt_mask, completion_tokens, completion_mask, temperature,
           candidate_ids, grammar=None, *, graphdef, mesh, rules, top_k, num_micro_batches):
  with _context(mesh, rules):
    return scoring.score(graphdef, state, prompt_tokens, prompt_mask, completion_tokens,
                         completion_mask, temperature=temperature, top_k=top_k,
                         candidate_ids=candidate_ids, num_micro_batches=num_micro_batches,
                         grammar=grammar)


def rollout_metrics(rollout: Rollout, trainer_logp: jax.Array | None = None) -> dict[str, float]:
  """Length, finish-reason and (optionally) sampler/trainer agreement statistics.

  Args:
    rollout: a `Rollout`.
    trainer_logp: `[batch, time']` log-probs of the same tokens recomputed by
      the trainer (`Sampler.score`), `time' <= time` when the trainer scored
      completions cut to their longest one (`training.ppo.trim_completions`). Adds
      `logp_abs_diff_{mean,max}` and
      `logp_mismatch_kl` = mean over tokens of exp(δ) − 1 − δ with
      δ = trainer − sampler (the k3 estimator of KL(sampler ‖ trainer)); all 0
      when the two agree, which is the sampler/trainer consistency check.
  """
  # `to_host`: with several processes, the rollout's rows live on all of them.
  mask, finish, sampler_logp, trainer_logp = to_host(
    (rollout.completion_mask, rollout.finish_reason, rollout.logp, trainer_logp))
  lengths = mask.sum(-1)
  metrics = {"completion_length_mean": float(lengths.mean()),
             "completion_length_max": float(lengths.max())}
  for code, name in enumerate(FINISH_NAMES):
    metrics[f"finish_{name}_fraction"] = float((finish == code).mean())
  if trainer_logp is not None:
    width = trainer_logp.shape[-1]
    if mask[:, width:].any():
      raise ValueError(f"trainer_logp covers {width} completion positions but the rollout has "
                       f"tokens up to {int(lengths.max())}")
    sampler_logp = np.asarray(sampler_logp, np.float64)[:, :width]
    delta = (np.asarray(trainer_logp, np.float64) - sampler_logp)[mask[:, :width]]
    if delta.size:
      metrics["logp_abs_diff_mean"] = float(np.abs(delta).mean())
      metrics["logp_abs_diff_max"] = float(np.abs(delta).max())
      metrics["logp_mismatch_kl"] = float(np.mean(np.expm1(delta) - delta))
  return metrics
