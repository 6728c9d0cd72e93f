"""Autoregressive dense detection: chains, multi-head log-probs, SFT/GRPO losses, sampling, eval.

Falcon Perception-HD (arXiv 2608.18881; spec §4.3–4.7) on the synthetic scenes of
`jaxrl_post.tasks.dense_scenes` with `jaxrl_post.models.perception.PerceptionDetector`.

Chain of one rollout (T actions, padded): `<found> (<coord>(x,y) <size>(w,h))* <end>` or
`<none>`. The box of an instance is `(cx, cy, w, h) = (x / coord_bins, y / coord_bins,
(w+1)·u, (h+1)·u)` with u = 1 / image_size (`BinSpec`): half-pixel centres and whole-pixel sizes,
so the synthetic ground truth is exactly representable. Note the paper writes `<size>(h, w)`;
here the bins are stored `(w, h)`, the order of `(cx, cy, w, h)` boxes.

Multi-head log-prob of action t (spec §4.3):

  log π(a_t|s_t) = log π_LM(w_t|h_t) + 1[w_t=<coord>]·log π_coord(x_t,y_t|h_t)
                                     + 1[w_t=<size>]·log π_size(w_t,h_t|h_t)

`chain_logprobs` returns the three terms separately. In RL the size head decodes greedily and its
term is dropped (it carries no gradient), the existence token's LM term is detached
(`stop_gradient`; RL uses positive queries only, and without the detach the model learns to
always say `<found>`), and LM and coordinate terms get Clip-Cov masks of their own.

GRPO loss (`grpo_loss`), one update per group of G rollouts (on-policy):

  Â_i = (r_i − μ_G) / (σ_G + ε)                    population std (`advantages.group_advantages`,
                                                     ddof=0)
  w_t = sg(π_θ(a_t|s_t) / π_rollout(a_t|s_t))       engine-mismatch IS weight (LM + coord terms),
                                                     optionally truncated
  ℓ_t = −w_t·Â_i·(k^LM_t·log π_LM,t + k^coord_t·log π_coord,t)     k = Clip-Cov keep masks
  L   = Σ_{i,t} ℓ_t / (B·T_max)                      Dr.GRPO fixed denominator (B rollouts in the
                                                     step, T_max the decode budget)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_post.losses.policy import sampler_importance_weights
from jaxrl_post.models.perception import Chain, HeadLogits, PerceptionDetector
from jaxrl_post.rewards import set_matching
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


class HeadLogProbs(NamedTuple):
  """Per-action log-prob terms, `float32[b, T]`, 0 where the head is not used or masked."""

  lm: jax.Array  # log π_LM(w_t) (existence tokens detached if asked).
  coord: jax.Array  # 1[w=<coord>]·(log π_x + log π_y).
  size: jax.Array  # 1[w=<size>]·(log π_w + log π_h).
  existence: jax.Array  # bool: the action is an existence token.

  @property
  def total(self) -> jax.Array:
    return self.lm + self.coord + self.size


def _pick(logits, index, temperature):
  logp = jax.nn.log_softmax(logits.astype(jnp.float32) / temperature, axis=-1)
  return jnp.take_along_axis(logp, index[..., None], axis=-1)[..., 0]


def chain_logprobs(logits: HeadLogits, chain: Chain, mask: jax.Array, *,
                   temperature: float = 1.0, detach_existence: bool = False,
                   size_temperature: float = 1.0) -> HeadLogProbs:
  """The three terms of the multi-head log-prob of every action (spec §4.3).

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
    `HeadLogProbs`.
  """
  m = mask.astype(jnp.float32)
  lm = _pick(logits.lm, chain.tokens, temperature) * m
  existence = (mask > 0) & ((chain.tokens == ds.FOUND) | (chain.tokens == ds.NONE))
  if detach_existence:
    lm = jnp.where(existence, jax.lax.stop_gradient(lm), lm)
  is_coord = (chain.tokens == ds.COORD).astype(jnp.float32) * m
  is_size = (chain.tokens == ds.SIZE).astype(jnp.float32) * m
  coord = (_pick(logits.x, chain.x, temperature) + _pick(logits.y, chain.y, temperature))
  size = (_pick(logits.w, chain.w, size_temperature)
          + _pick(logits.h, chain.h, size_temperature))
  return HeadLogProbs(lm=lm, coord=coord * is_coord, size=size * is_size, existence=existence)


# ---------------------------------------------------------------------------------------------
# SFT
# ---------------------------------------------------------------------------------------------


def sft_loss(model: PerceptionDetector, batch) -> tuple[jax.Array, dict]:
  """Teacher-forcing cross-entropy of all three heads, summed over the global token count.

  L = −Σ_{i,t} m_{i,t}·(lm + coord + size)_{i,t} / N,  N = `batch["num_tokens"]` (the whole
  batch's valid actions, so that micro-batches add up exactly).

  `batch`: `images [b,S,S,C]`, `queries [b,Q]`, `chain [b,5,T]` (token, x, y, w, h), `mask [b,T]`,
  `num_tokens []`.
  """
  chain = Chain(*jnp.moveaxis(batch["chain"], 1, 0))
  logits = model(batch["images"], batch["queries"], chain)
  lp = chain_logprobs(logits, chain, batch["mask"])
  n = jnp.maximum(batch["num_tokens"], 1.0)
  loss = -jnp.sum(lp.total) / n
  aux = dict(nll_lm=-jnp.sum(lp.lm) / n, nll_coord=-jnp.sum(lp.coord) / n,
             nll_size=-jnp.sum(lp.size) / n)
  return loss, aux


def sft_batch(scenes: Sequence[ds.Scene], bins: BinSpec, max_instances: int) -> dict:
  """Host batch for `sft_loss`."""
  enc = [encode_chain(s.boxes, bins, max_instances) for s in scenes]
  mask = np.stack([e[1] for e in enc])
  return dict(images=np.stack([s.image for s in scenes]),
              queries=np.stack([s.query.tokens for s in scenes]),
              chain=np.stack([e[0] for e in enc]), mask=mask,
              num_tokens=np.float32(mask.sum()))


# ---------------------------------------------------------------------------------------------
# GRPO with Clip-Cov per head
# ---------------------------------------------------------------------------------------------


def clip_cov_keep(logp: jax.Array, adv: jax.Array, active: jax.Array, key: jax.Array, *,
                  ratio: float, low: float, high: float) -> jax.Array:
  """Clip-Cov keep mask (Cui et al. 2025, arXiv 2505.22617; verl's `compute_policy_loss_clip_cov`).

  Cov_t = (log π_t − mean(log π)) · (A_t − mean(A)), means over the active tokens; among the
  tokens with low < Cov_t < high, `max(⌊ratio·N⌋, 1)` (N active tokens) are picked uniformly at
  random and their policy-gradient term is detached (keep = 0).

  Args:
    logp: `[b, T]` log-probs of one head (values only are used).
    adv: `[b, T]` advantages.
    active: `[b, T]` bool, tokens where this head acts.
    key: PRNG key of the random pick.
    ratio, low, high: selection ratio and covariance bounds (paper: 2e-4; LM [1, 5], coord
      [10, 50]).

  Returns:
    `float32[b, T]` 1 = keep, 0 = detached.
  """
  logp = jax.lax.stop_gradient(logp)
  a = active.astype(jnp.float32)
  n = jnp.sum(a)
  mean_lp = jnp.sum(logp * a) / jnp.maximum(n, 1.0)
  mean_adv = jnp.sum(adv * a) / jnp.maximum(n, 1.0)
  cov = (logp - mean_lp) * (adv - mean_adv)
  eligible = active & (cov > low) & (cov < high)
  clip_num = jnp.maximum(jnp.floor(ratio * n), 1.0)
  score = jnp.where(eligible, jax.random.uniform(key, logp.shape), jnp.inf).reshape(-1)
  rank = jnp.argsort(jnp.argsort(score)).reshape(logp.shape)
  drop = eligible & (rank < clip_num)
  return 1.0 - drop.astype(jnp.float32)


class GRPOAux(NamedTuple):
  pg_loss: jax.Array
  is_weight_mean: jax.Array
  is_weight_max: jax.Array
  clipcov_lm_frac: jax.Array  # Detached share of active LM tokens.
  clipcov_coord_frac: jax.Array
  entropy_coord: jax.Array  # Mean entropy of the x and y distributions at <coord> actions.
  logp_mismatch: jax.Array  # Mean |log π_train − log π_rollout| over valid actions.


def grpo_loss(model: PerceptionDetector, batch, *, temperature: float = 1.0,
              max_tokens: int, detach_existence: bool = True, clip_cov: bool = True,
              clip_cov_ratio: float = 2e-4, clip_cov_lm: tuple[float, float] = (1.0, 5.0),
              clip_cov_coord: tuple[float, float] = (10.0, 50.0),
              is_max: float | None = None) -> tuple[jax.Array, dict]:
  """Falcon Perception-HD's policy-gradient loss (module docstring), `(loss, aux dict)`.

  `batch`: `images`, `queries`, `chain [b,5,T]`, `mask [b,T]`, `adv [b]`, `rollout_logp [b,T]`
  (the sampler's LM + coord log-probs of the actions, at `temperature`), `num_sequences []`
  (B, rollouts in the whole step), `key` (raw PRNG key data for Clip-Cov).

  Args:
    max_tokens: T_max of the Dr.GRPO denominator (the decode budget).
    detach_existence: stop the gradient through existence tokens (paper: on).
    clip_cov: apply Clip-Cov masks per head.
    clip_cov_ratio, clip_cov_lm, clip_cov_coord: its ratio and per-head bounds.
    is_max: truncate the IS weight at this value (None: untruncated, as in the paper).
  """
  chain = Chain(*jnp.moveaxis(batch["chain"], 1, 0))
  mask = batch["mask"]
  logits = model(batch["images"], batch["queries"], chain)
  lp = chain_logprobs(logits, chain, mask, temperature=temperature,
                      detach_existence=detach_existence)
  valid = mask > 0
  acted = lp.lm + lp.coord  # The size head is greedy: no term, no gradient.
  weight = sampler_importance_weights(jax.lax.stop_gradient(acted), batch["rollout_logp"],
                                      mask.astype(jnp.float32), min_weight=None,
                                      max_weight=is_max)
  adv = jnp.broadcast_to(batch["adv"][:, None], mask.shape).astype(jnp.float32)
  is_coord = valid & (chain.tokens == ds.COORD)
  lm_active = valid & ~lp.existence
  if clip_cov:
    k_lm, k_coord = jax.random.split(jax.random.wrap_key_data(batch["key"]))
    keep_lm = clip_cov_keep(lp.lm, adv, lm_active, k_lm, ratio=clip_cov_ratio, low=clip_cov_lm[0],
                            high=clip_cov_lm[1])
    keep_coord = clip_cov_keep(lp.coord, adv, is_coord, k_coord, ratio=clip_cov_ratio,
                               low=clip_cov_coord[0], high=clip_cov_coord[1])
  else:
    keep_lm = keep_coord = jnp.ones_like(adv)
  per_token = -weight * adv * (keep_lm * lp.lm + keep_coord * lp.coord)
  loss = jnp.sum(jnp.where(valid, per_token, 0.0)) / (batch["num_sequences"] * max_tokens)

  def frac(keep, active):
    return jnp.sum((1 - keep) * active) / jnp.maximum(jnp.sum(active), 1)

  def entropy(z):
    p = jax.nn.log_softmax(z / temperature, axis=-1)
    return -jnp.sum(jnp.exp(p) * p, axis=-1)

  n_coord = jnp.maximum(jnp.sum(is_coord), 1)
  ent = jnp.sum(jnp.where(is_coord, entropy(logits.x) + entropy(logits.y), 0.0)) / n_coord / 2
  n_valid = jnp.maximum(jnp.sum(valid), 1)
  aux = GRPOAux(
    pg_loss=loss, is_weight_mean=jnp.sum(jnp.where(valid, weight, 0.0)) / n_valid,
    is_weight_max=jnp.max(jnp.where(valid, weight, 0.0)),
    clipcov_lm_frac=frac(keep_lm, lm_active), clipcov_coord_frac=frac(keep_coord, is_coord),
    entropy_coord=ent,
    logp_mismatch=jnp.sum(jnp.where(valid, jnp.abs(jax.lax.stop_gradient(acted)
                                                    - batch["rollout_logp"]), 0.0)) / n_valid)
  return loss, aux._asdict()


def count_rewards(preds: Sequence[np.ndarray], gts: Sequence[np.ndarray], *, kind: str = "count",
                  iou_threshold: float = 0.5, fp_weight: float = 0.3) -> np.ndarray:
  """Set-level rewards of rollouts (host, exact Hungarian): `set_matching.SET_REWARDS[kind]`."""
  fn = set_matching.SET_REWARDS.get(kind)
  kwargs = dict(iou_threshold=iou_threshold)
  if kind == "count":
    kwargs["fp_weight"] = fp_weight
  return np.array([fn(p, g, **kwargs) for p, g in zip(preds, gts)], np.float32)


# ---------------------------------------------------------------------------------------------
# Sampling (jitted cached decode loop)
# ---------------------------------------------------------------------------------------------


class Rollout(NamedTuple):
  chain: Chain  # int32[b, T] each.
  mask: jax.Array  # bool[b, T]: actions up to and including the first <end>/<none>.
  logp: jax.Array  # float32[b, T]: sampler's LM + coord log-probs (at the sampling τ).


def make_sampler(graphdef, max_actions: int, *, temperature: float):
  """A jitted `(params, images, queries, rng) -> Rollout` cached decode loop.

  Prefill the prompt, then one decoder step per action inside a `lax.while_loop` that stops
  when every row has emitted `<end>`/`<none>` or after `max_actions`. Per step: the LM token and
  the (x, y) bins are sampled at `temperature` (greedy when 0); the size bins are always the
  argmax (spec §4.3: the size head decodes greedily). The step's rng is `fold_in(rng, t)`.
  Nothing constrains the grammar: malformed chains are possible and counted by `decode_chain`.
  """
  greedy = temperature == 0.0
  tau = 1.0 if greedy else temperature

  def draw(key, z):
    if greedy:
      return jnp.argmax(z, axis=-1).astype(jnp.int32)
    return jax.random.categorical(key, z / tau, axis=-1).astype(jnp.int32)

  @jax.jit
  def sample(params, images, queries, rng):
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
      lp = _pick(z.lm, tok, tau) + jnp.where(tok == ds.COORD,
                                             _pick(z.x, x, tau) + _pick(z.y, y, tau), 0.0)
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
    return Rollout(chain=Chain(*arrays), mask=mask, logp=logp)

  return sample


# ---------------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------------


def bucket_name(lo: int, hi: int) -> str:
  return f"{lo}" if lo == hi else f"{lo}-{hi}"


def evaluate_predictions(preds: Sequence[np.ndarray], scenes: Sequence[ds.Scene],
                         stats: Sequence[DecodeStats], *,
                         buckets=ds.COUNT_BUCKETS) -> dict[str, float]:
  """Dense-perception metrics of decoded predictions (spec §4.7), raw and after NMS.

  * `f1@0.5` (PBench-dense protocol) and `f1` (mean over IoU 0.50:0.05:0.95): macro over the
    positive samples, overall and per count bucket (`f1@0.5/<bucket>`); `nms_*` the same after
    greedy NMS at IoU 0.5 in emission order.
  * `redundancy`: share of predictions NMS removes (MRR on boxes); `mcc`: presence MCC over all
    samples (positive and negative queries); `count_ratio`: Σ predicted / Σ ground truth;
    `malformed_rate`: malformed chains / samples; `truncated_rate`.
  """
  gts = [s.boxes for s in scenes]
  kept = [p[set_matching.nms(p)] if len(p) else p for p in preds]
  out = {}
  for name, ps in (("", preds), ("nms_", kept)):
    out[f"{name}f1@0.5"] = set_matching.macro_f1(ps, gts, thresholds=(0.5,))
    out[f"{name}f1"] = set_matching.macro_f1(ps, gts)
    counts = np.array([len(g) for g in gts])
    for lo, hi in buckets:
      idx = np.flatnonzero((counts >= lo) & (counts <= hi))
      if lo == 0 or idx.size == 0:
        continue
      out[f"{name}f1@0.5/{bucket_name(lo, hi)}"] = set_matching.macro_f1(
        [ps[i] for i in idx], [gts[i] for i in idx], thresholds=(0.5,))
  n_pred = sum(len(p) for p in preds)
  out["redundancy"] = (n_pred - sum(len(k) for k in kept)) / n_pred if n_pred else 0.0
  out["mcc"] = set_matching.presence_mcc(preds, gts)
  out["count_ratio"] = n_pred / max(sum(len(g) for g in gts), 1)
  total = sum_stats(stats)
  out["malformed_rate"] = sum(s.malformed > 0 for s in stats) / max(len(stats), 1)
  out["truncated_rate"] = total.truncated / max(len(stats), 1)
  empty = [i for i, g in enumerate(gts) if len(g) == 0]
  if empty:
    out["negative_accuracy"] = float(np.mean([len(preds[i]) == 0 for i in empty]))
  return out


def predict(sample_fn, params, scenes: Sequence[ds.Scene], bins: BinSpec, *, batch_size: int,
            rng=None) -> tuple[list[np.ndarray], list[DecodeStats]]:
  """Runs `sample_fn` over `scenes` in fixed-size batches (the last padded) and decodes."""
  rng = jax.random.key(0) if rng is None else rng
  preds, stats = [], []
  for start in range(0, len(scenes), batch_size):
    chunk = list(scenes[start:start + batch_size])
    pad = batch_size - len(chunk)
    chunk_p = chunk + [chunk[-1]] * pad  # Fixed shapes: one compiled program.
    images = np.stack([s.image for s in chunk_p])
    queries = np.stack([s.query.tokens for s in chunk_p])
    rollout = jax.device_get(sample_fn(params, images, queries, jax.random.fold_in(rng, start)))
    p, st = decode_batch(rollout.chain, rollout.mask, bins)
    preds += p[:len(chunk)]
    stats += st[:len(chunk)]
  return preds, stats

