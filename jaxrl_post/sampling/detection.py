"""The detector's action chains: boxes ↔ tokens, multi-head log-probs, and its decode loop.

Falcon Perception-HD (arXiv 2608.18881) on the synthetic scenes of `jaxrl_post.tasks.dense_scenes`
with `jaxrl_post.models.perception.PerceptionDetector`.

Chain of one rollout (T actions, padded): `<found> (<coord>(x,y) <size>(w,h))* <end>` or
`<none>`. The box of an instance is `(cx, cy, w, h) = (x / coord_bins, y / coord_bins,
(w+1)·u, (h+1)·u)` with u = 1 / image_size (`BinSpec`): half-pixel centres and whole-pixel sizes,
so the synthetic ground truth is exactly representable. Note the paper writes `<size>(h, w)`;
here the bins are stored `(w, h)`, the order of `(cx, cy, w, h)` boxes.

Why a decode loop of its own (`DetectionSampler`) rather than `sampling.Sampler`: `Sampler` draws
one token per step from one `CausalLM` head over text prompts. An action of the detector is a
token *and* its bins from three heads (the LM token and the (x, y) coordinate bins are sampled,
the (w, h) size bins decoded greedily, arXiv 2608.18881), the next step's input embedding depends
on all five, the prompt is image patches plus query tokens, and the recorded log-prob is the
multi-head one of `chain_logprobs` (LM + coord). None of that fits `Sampler`'s kernels, and
folding it in would put a task's grammar into the text sampler.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from jaxrl_post.losses.perception import HeadLogProbs
from jaxrl_post.models.perception import Chain, HeadLogits
from jaxrl_post.parallel.axes import DEFAULT_RULES, Rules, axis_rules
from jaxrl_post.parallel.mesh import put_batch
from jaxrl_post.tasks import dense_scenes as ds

EXISTENCE_TOKENS = (ds.FOUND, ds.NONE)
STOP_TOKENS = (ds.END, ds.NONE)


# ---------------------------------------------------------------------------------------------
# Chains: boxes ↔ tokens
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BinSpec:
  """Quantisation of boxes: centres on `coord_bins` per axis, sizes in units of 1/image_size."""

  coord_bins: int = 128
  size_bins: int = 32
  image_size: int = 64

  def to_bins(self, boxes) -> np.ndarray:
    """`[n, 4]` (cx, cy, w, h) → `int32[n, 4]` bins (x, y, w, h), clipped to the valid range."""
    b = np.asarray(boxes, np.float64).reshape(-1, 4)
    xy = np.clip(np.round(b[:, :2] * self.coord_bins), 0, self.coord_bins - 1)
    wh = np.clip(np.round(b[:, 2:] * self.image_size) - 1, 0, self.size_bins - 1)
    return np.concatenate([xy, wh], axis=1).astype(np.int32)

  def to_boxes(self, bins) -> np.ndarray:
    """`[n, 4]` bins (x, y, w, h) → float64 boxes (cx, cy, w, h)."""
    q = np.asarray(bins, np.float64).reshape(-1, 4)
    return np.concatenate([q[:, :2] / self.coord_bins, (q[:, 2:] + 1) / self.image_size], axis=1)


def chain_length(max_instances: int) -> int:
  """T of a chain holding up to `max_instances`: existence + 2 per instance + `<end>`."""
  return 2 * max_instances + 2


def encode_chain(boxes, bins: BinSpec, max_instances: int) -> tuple[np.ndarray, np.ndarray]:
  """Teacher-forcing target of one scene: `(int32[5, T] token/x/y/w/h, bool[T] mask)`.

  Instances follow `dense_scenes.canonical_order` (raster order of centres). No boxes →
  `<none>`. More than `max_instances` boxes → the first `max_instances` and no `<end>` (a
  truncated chain teaches no stopping; training sets keep counts within the cap).
  """
  t = chain_length(max_instances)
  out = np.zeros((5, t), np.int32)
  mask = np.zeros(t, bool)
  boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
  if boxes.shape[0] == 0:
    out[0, 0], mask[0] = ds.NONE, True
    return out, mask
  q = bins.to_bins(boxes[ds.canonical_order(boxes, bins.coord_bins)])[:max_instances]
  out[0, 0] = ds.FOUND
  n = q.shape[0]
  out[0, 1:1 + 2 * n:2] = ds.COORD
  out[1, 1:1 + 2 * n:2], out[2, 1:1 + 2 * n:2] = q[:, 0], q[:, 1]
  out[0, 2:2 + 2 * n:2] = ds.SIZE
  out[3, 2:2 + 2 * n:2], out[4, 2:2 + 2 * n:2] = q[:, 2], q[:, 3]
  length = 1 + 2 * n
  if boxes.shape[0] <= max_instances:
    out[0, length] = ds.END
    length += 1
  mask[:length] = True
  return out, mask


class DecodeStats(NamedTuple):
  """Malformed-output counters of `decode_chain` (summable over rollouts)."""

  missing_existence: int = 0  # First token is not <found>/<none>.
  contradiction: int = 0  # <none> followed by instances (the instances are dropped).
  coord_without_size: int = 0  # A <coord> not followed by <size> (the instance is dropped).
  size_without_coord: int = 0  # A <size> with no pending <coord> (ignored).
  stray_tokens: int = 0  # Any other token inside the chain (ignored).
  truncated: int = 0  # 1 if the chain ran out before <end>/<none> (instances kept).

  @property
  def malformed(self) -> int:
    return int(sum(self[:-1]))  # Truncation is a budget limit, not a malformed chain.


def sum_stats(stats: Sequence[DecodeStats]) -> DecodeStats:
  return DecodeStats(*(int(sum(x)) for x in zip(*stats))) if stats else DecodeStats()


def decode_chain(tokens, x, y, w, h, bins: BinSpec, length: int | None = None
                 ) -> tuple[np.ndarray, DecodeStats]:
  """Boxes of one (possibly malformed) chain; never raises on model output.

  A state machine over the tokens: an optional leading existence token, then `<coord>`/`<size>`
  pairs until `<end>` (or `<none>`). Whatever does not fit the grammar is counted in
  `DecodeStats` and skipped: a `<coord>` whose next token is not `<size>` gives no box, a
  `<size>` without a `<coord>` is ignored, other tokens are ignored. A missing existence token is
  counted and the chain is read as if it said `<found>`; `<none>` ends the chain with no boxes.

  Args:
    tokens, x, y, w, h: `[T]` int arrays of one rollout.
    bins: the quantisation.
    length: valid prefix length (default T).

  Returns:
    `(float64[n, 4] boxes (cx, cy, w, h), DecodeStats)`.
  """
  tokens = np.asarray(tokens).reshape(-1)
  length = tokens.shape[0] if length is None else int(length)
  stats = dict.fromkeys(DecodeStats._fields, 0)
  found: list[tuple[int, int, int, int]] = []
  start = 0
  if length == 0 or tokens[0] not in EXISTENCE_TOKENS:
    stats["missing_existence"] = 1
  elif tokens[0] == ds.NONE:
    if length > 1 and np.any(np.isin(tokens[1:length], (ds.COORD, ds.SIZE))):
      stats["contradiction"] = 1
    return np.zeros((0, 4)), DecodeStats(**stats)
  else:
    start = 1
  pending = None
  ended = False
  for t in range(start, length):
    tok = int(tokens[t])
    if tok == ds.SIZE:
      if pending is None:
        stats["size_without_coord"] += 1
      else:
        found.append((pending[0], pending[1], int(w[t]), int(h[t])))
        pending = None
      continue
    if pending is not None:
      stats["coord_without_size"] += 1
      pending = None
    if tok == ds.COORD:
      pending = (int(x[t]), int(y[t]))
    elif tok in STOP_TOKENS:
      ended = True
      break
    else:
      stats["stray_tokens"] += 1
  if pending is not None:
    stats["coord_without_size"] += 1
  if not ended:
    stats["truncated"] = 1
  boxes = bins.to_boxes(found) if found else np.zeros((0, 4))
  return boxes, DecodeStats(**stats)


def decode_batch(chain, mask, bins: BinSpec) -> tuple[list[np.ndarray], list[DecodeStats]]:
  """`decode_chain` per row of a host batch (`Chain` of `[b, T]` arrays, `mask [b, T]`)."""
  chain = [np.asarray(a) for a in chain]
  lengths = np.asarray(mask).sum(-1)
  out = [decode_chain(*(a[i] for a in chain), bins, lengths[i]) for i in range(len(lengths))]
  return [o[0] for o in out], [o[1] for o in out]


# ---------------------------------------------------------------------------------------------
# Multi-head log-probs
# ---------------------------------------------------------------------------------------------


def head_logprob(logits: jax.Array, index: jax.Array, temperature: float) -> jax.Array:
  """log softmax(z/τ)[index] of one head: `[..., K]` logits, `[...]` int index → `[...]`."""
  logp = jax.nn.log_softmax(logits.astype(jnp.float32) / temperature, axis=-1)
  return jnp.take_along_axis(logp, index[..., None], axis=-1)[..., 0]


def chain_logprobs(logits: HeadLogits, chain: Chain, mask: jax.Array, *,
                   temperature: float = 1.0, detach_existence: bool = False,
                   size_temperature: float = 1.0) -> HeadLogProbs:
  """The three terms of the multi-head log-prob of every action (arXiv 2608.18881).

  lm_t = m_t·log softmax(z^LM_t/τ)[w_t];
  coord_t = m_t·1[w_t=<coord>]·(log softmax(z^x_t/τ)[x_t] + log softmax(z^y_t/τ)[y_t]);
  size_t = m_t·1[w_t=<size>]·(log softmax(z^w_t/τ_s)[w_t] + log softmax(z^h_t/τ_s)[h_t]).

  Args:
    logits: `HeadLogits` `[b, T, ·]` aligned with `chain`.
    chain: the actions, `int32[b, T]` each.
    mask: `[b, T]` valid actions.
    temperature: τ of the sampled heads (LM and coordinates).
    detach_existence: stop the gradient of lm_t at existence tokens (<found>/<none>).
    size_temperature: τ_s of the size head (it is decoded greedily; its log-prob is only used by
      SFT, at τ_s = 1).

  Returns:
    `losses.perception.HeadLogProbs`.
  """
  m = mask.astype(jnp.float32)
  lm = head_logprob(logits.lm, chain.tokens, temperature) * m
  existence = (mask > 0) & ((chain.tokens == ds.FOUND) | (chain.tokens == ds.NONE))
  if detach_existence:
    lm = jnp.where(existence, jax.lax.stop_gradient(lm), lm)
  is_coord = (chain.tokens == ds.COORD).astype(jnp.float32) * m
  is_size = (chain.tokens == ds.SIZE).astype(jnp.float32) * m
  coord = (head_logprob(logits.x, chain.x, temperature)
           + head_logprob(logits.y, chain.y, temperature))
  size = (head_logprob(logits.w, chain.w, size_temperature)
          + head_logprob(logits.h, chain.h, size_temperature))
  return HeadLogProbs(lm=lm, coord=coord * is_coord, size=size * is_size, existence=existence)


# ---------------------------------------------------------------------------------------------
# The detector's decode loop (jitted, cached)
# ---------------------------------------------------------------------------------------------


class DetectionRollout(NamedTuple):
  chain: Chain  # int32[b, T] each.
  mask: jax.Array  # bool[b, T]: actions up to and including the first <end>/<none>.
  logp: jax.Array  # float32[b, T]: sampler's LM + coord log-probs (at the sampling τ).


def detection_decode(graphdef, params, images, queries, rng, *, max_actions: int,
                     temperature: float) -> DetectionRollout:
  """The cached decode loop (traceable; `DetectionSampler` jits it).

  Prefill the prompt, then one decoder step per action inside a `lax.while_loop` that stops
  when every row has emitted `<end>`/`<none>` or after `max_actions`. Per step: the LM token and
  the (x, y) bins are sampled at `temperature` (greedy when 0); the size bins are always the
  argmax (arXiv 2608.18881: the size head decodes greedily). The step's rng is `fold_in(rng, t)`.
  Nothing constrains the grammar: malformed chains are possible and counted by `decode_chain`.

  Args:
    graphdef, params: the `PerceptionDetector` (`nnx.split`).
    images: `float32[b, S, S, C]`; queries: `int32[b, Q]`; rng: PRNG key.
    max_actions: the decode budget T.
    temperature: τ of the LM and coordinate heads (0: greedy; log-probs then at τ = 1).
  """
  greedy = temperature == 0.0
  tau = 1.0 if greedy else temperature

  def draw(key, z):
    if greedy:
      return jnp.argmax(z, axis=-1).astype(jnp.int32)
    return jax.random.categorical(key, z / tau, axis=-1).astype(jnp.int32)

  model = nnx.merge(graphdef, params)
  b = images.shape[0]
  cache = model.init_cache(b, max_actions)
  heads, cache = model.prefill(images, queries, cache)
  zeros = jnp.zeros((b, max_actions), jnp.int32)

  def cond(carry):
    t, done = carry[0], carry[3]
    return (t < max_actions) & ~jnp.all(done)

  def body(carry):
    t, heads, cache, done, arrays, logp, mask = carry
    keys = jax.random.split(jax.random.fold_in(rng, t), 3)
    z = jax.tree.map(lambda a: a[:, 0], heads)
    tok, x, y = draw(keys[0], z.lm), draw(keys[1], z.x), draw(keys[2], z.y)
    w = jnp.argmax(z.w, axis=-1).astype(jnp.int32)
    h = jnp.argmax(z.h, axis=-1).astype(jnp.int32)
    lp = head_logprob(z.lm, tok, tau) + jnp.where(
      tok == ds.COORD, head_logprob(z.x, x, tau) + head_logprob(z.y, y, tau), 0.0)
    live = ~done
    tok = jnp.where(live, tok, ds.PAD)
    new = (tok, x, y, w, h)
    arrays = tuple(jax.lax.dynamic_update_slice(a, v[:, None], (0, t))
                   for a, v in zip(arrays, new))
    logp = jax.lax.dynamic_update_slice(logp, jnp.where(live, lp, 0.0)[:, None], (0, t))
    mask = jax.lax.dynamic_update_slice(mask, live[:, None], (0, t))
    done = done | (tok == ds.END) | (tok == ds.NONE)
    heads, cache = model.decode_step(Chain(*(v[:, None] for v in new)), cache)
    return t + 1, heads, cache, done, arrays, logp, mask

  carry = (jnp.zeros((), jnp.int32), heads, cache, jnp.zeros((b,), bool), (zeros,) * 5,
           jnp.zeros((b, max_actions), jnp.float32), jnp.zeros((b, max_actions), bool))
  _, _, _, _, arrays, logp, mask = jax.lax.while_loop(cond, body, carry)
  return DetectionRollout(chain=Chain(*arrays), mask=mask, logp=logp)


class DetectionSampler:
  """`sampler(params, images, queries, rng) -> DetectionRollout`: the jitted decode loop.

  With a `mesh`, the images and queries are placed with their rows over the mesh's batch axes
  (`parallel.mesh.put_batch`; a batch those axes do not divide is replicated) and the loop is
  traced under the mesh's logical-axis rules, so the activations and the KV cache are sharded as
  in the trainer's forward pass and the parameters are read in place. The rollout stays on the
  devices: fetch it with `parallel.multihost.to_host` (with several processes its rows live on
  all of them).

  Args:
    graphdef: `nnx.split(detector)[0]`.
    max_actions: the decode budget T.
    temperature: τ of the LM and coordinate heads (0: greedy).
    mesh, rules: where it runs (None: wherever `jit` puts it).
  """

  def __init__(self, graphdef, max_actions: int, *, temperature: float, mesh: Mesh | None = None,
               rules: Rules = DEFAULT_RULES):
    self.mesh, self.rules = mesh, rules
    self._decode = jax.jit(lambda params, images, queries, rng: detection_decode(
      graphdef, params, images, queries, rng, max_actions=max_actions, temperature=temperature))

  def __call__(self, params, images, queries, rng) -> DetectionRollout:
    if self.mesh is None:
      return self._decode(params, images, queries, rng)
    images, queries = put_batch((images, queries), self.mesh, self.rules)
    with axis_rules(self.mesh, self.rules):
      return self._decode(params, images, queries, rng)
