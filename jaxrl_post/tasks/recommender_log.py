"""A simulated recommender: users, items, behaviour histories, a logging policy, funnel outcomes.

The synthetic analogue (PROPOSAL) of the NAVER WEBTOON setting of "Progressive
Alignment of Recommender Foundation Model through Multi-Phase Post-Training" (arXiv 2608.06792):

* Users u and items i have latent vectors (`dim`); affinity a(u, i) = x_u · y_i / √dim.
  Items also have a *click appeal* p_i (popularity) and a *depth* d_i (how far a reader goes
  once in), correlated `depth_pop_corr` (< 0: click-bait items are shallow).
* Histories: each user consumed `history_len` items drawn from softmax(β_h · a(u, ·) + p);
  the foundation model is pretrained to predict them in order (next-item prediction).
* The logging policy shows a slate of `slate` draws (with replacement) from
  q(i | u) = softmax((a(u, i) + ν_{u,i})·β_log + p_i) with fixed noise ν: the logging policy
  knows the users imperfectly; q is logged (known propensities). An item's exposure
  propensity is its inclusion probability 1 − (1 − q)^slate.
* Funnel outcome, K = 6 levels (impression, click, free episode, engaged, paid entry, paid
  completion), a continuation-ratio ordinal model:
    P(level ≥ 1) = σ(c_a·a + p_i + c_0)                     (click: affinity + click appeal)
    P(level ≥ k+1 | level ≥ k) = σ(d_a·a + γ·d_i − t_k)      k = 1 … 4 (affinity + depth)
  with increasing t_k, so deep levels are sparse.

Evaluation gains are the simulator's expectations (no sampling noise): click relevance
P(level ≥ 1) (Rank NDCG), expected level E[level] (Funnel NDCG), deep engagement
P(level ≥ `DEEP_LEVEL`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

NUM_LEVELS = 6
LEVEL_NAMES = ("impression", "click", "free_episode", "engaged", "paid_entry", "paid_completion")
DEEP_LEVEL = 3  # "deep engagement": the engaged level or deeper.


@dataclasses.dataclass(frozen=True)
class RecsysWorld:
  """The simulator's hidden state (numpy arrays) and its outcome parameters.

  Attributes:
    user_vec: `[U, dim]` latent user vectors; `log_noise` `[U, I]` the logging policy's error.
    item_vec: `[I, dim]`; `item_pop` `[I]` click appeal; `item_depth` `[I]` depth.
    histories: `[U, L]` int consumed items, in order.
    train_users / eval_users: disjoint user indices.
    click_scale, click_bias, deep_scale, depth_weight: c_a, c_0, d_a, γ.
    deep_thresholds: `[K−2]` t_1 … t_{K−2}.
    log_temperature: 1 / β_log of the logging policy; `slate` draws per request.
  """

  user_vec: np.ndarray
  item_vec: np.ndarray
  item_pop: np.ndarray
  item_depth: np.ndarray
  log_noise: np.ndarray
  histories: np.ndarray
  train_users: np.ndarray
  eval_users: np.ndarray
  click_scale: float
  click_bias: float
  deep_scale: float
  depth_weight: float
  deep_thresholds: np.ndarray
  log_temperature: float
  slate: int

  @property
  def num_items(self) -> int:
    return self.item_vec.shape[0]


def make_world(*, seed: int = 0, num_users: int = 3000, num_eval_users: int = 500,
               num_items: int = 200, dim: int = 8, history_len: int = 20,
               history_temperature: float = 0.5, depth_pop_corr: float = -0.8,
               click_scale: float = 1.5, click_bias: float = -1.5, deep_scale: float = 1.5,
               depth_weight: float = 2.5, deep_thresholds=(0.5, 1.5, 2.5, 3.5),
               log_noise: float = 1.0, log_temperature: float = 1.0,
               slate: int = 10) -> RecsysWorld:
  """A seeded world (module docstring); the last `num_eval_users` users are held out.

  Raises:
    ValueError: naming the argument (sizes, correlation, thresholds not increasing).
  """
  for name, value in (("num_users", num_users), ("num_items", num_items), ("dim", dim),
                      ("history_len", history_len), ("slate", slate)):
    if value < 1:
      raise ValueError(f"{name}={value} must be >= 1")
  if not 0 < num_eval_users < num_users:
    raise ValueError(f"num_eval_users={num_eval_users} must be in (0, num_users={num_users})")
  if not -1 <= depth_pop_corr <= 1:
    raise ValueError(f"depth_pop_corr={depth_pop_corr} must be in [-1, 1]")
  thresholds = np.asarray(deep_thresholds, np.float64)
  if thresholds.shape != (NUM_LEVELS - 2,) or np.any(np.diff(thresholds) <= 0):
    raise ValueError(f"deep_thresholds={tuple(deep_thresholds)}: need {NUM_LEVELS - 2} "
                     "increasing values")
  rng = np.random.default_rng(seed)
  user_vec = rng.normal(size=(num_users, dim))
  item_vec = rng.normal(size=(num_items, dim))
  pop = rng.normal(size=num_items)
  depth = depth_pop_corr * pop + np.sqrt(1 - depth_pop_corr ** 2) * rng.normal(size=num_items)
  noise = log_noise * rng.normal(size=(num_users, num_items))
  aff = user_vec @ item_vec.T / np.sqrt(dim)
  logits = aff / history_temperature + pop
  gumbel = rng.gumbel(size=(num_users, history_len, num_items))
  histories = np.argmax(logits[:, None, :] + gumbel, axis=-1).astype(np.int32)
  users = np.arange(num_users)
  return RecsysWorld(
    user_vec=user_vec, item_vec=item_vec, item_pop=pop, item_depth=depth, log_noise=noise,
    histories=histories, train_users=users[:-num_eval_users],
    eval_users=users[-num_eval_users:], click_scale=click_scale, click_bias=click_bias,
    deep_scale=deep_scale, depth_weight=depth_weight, deep_thresholds=thresholds,
    log_temperature=log_temperature, slate=slate)


def affinity(world: RecsysWorld, users: np.ndarray, items: np.ndarray | None = None
             ) -> np.ndarray:
  """a(u, i) = x_u · y_i / √dim: `[B, N]` for `users [B]`, `items [B, N]` (default: all)."""
  x = world.user_vec[users]
  if items is None:
    return x @ world.item_vec.T / np.sqrt(x.shape[-1])
  return np.einsum("bd,bnd->bn", x, world.item_vec[items]) / np.sqrt(x.shape[-1])


def level_probs(world: RecsysWorld, users: np.ndarray, items: np.ndarray | None = None
                ) -> np.ndarray:
  """P(level = k | u, i), `[B, N, K]` (the continuation-ratio funnel of the module docstring)."""
  items = np.broadcast_to(np.arange(world.num_items), (len(users), world.num_items)) \
    if items is None else items
  a = affinity(world, users, items)
  click = _sigmoid(world.click_scale * a + world.item_pop[items] + world.click_bias)
  cont = _sigmoid((world.deep_scale * a + world.depth_weight * world.item_depth[items])[..., None]
                  - world.deep_thresholds)  # [B, N, K−2]
  reach = np.concatenate([np.ones_like(click)[..., None], click[..., None],
                          click[..., None] * np.cumprod(cont, axis=-1)], axis=-1)  # P(≥ k)
  return reach - np.concatenate([reach[..., 1:], np.zeros_like(click)[..., None]], axis=-1)


def expected_gains(world: RecsysWorld, users: np.ndarray) -> dict[str, np.ndarray]:
  """`[B, I]` per item: click P(level ≥ 1), level E[level], deep P(level ≥ DEEP_LEVEL)."""
  p = level_probs(world, users)
  return {"click": 1.0 - p[..., 0], "level": p @ np.arange(NUM_LEVELS, dtype=np.float64),
          "deep": p[..., DEEP_LEVEL:].sum(-1)}


def logging_probs(world: RecsysWorld, users: np.ndarray) -> np.ndarray:
  """The logging policy's per-draw probabilities q(i | u), `[B, I]`."""
  logits = ((affinity(world, users) + world.log_noise[users]) / world.log_temperature
            + world.item_pop)
  logits = logits - logits.max(-1, keepdims=True)
  q = np.exp(logits)
  return q / q.sum(-1, keepdims=True)


def sample_logs(world: RecsysWorld, users: np.ndarray, rng: np.random.Generator
                ) -> dict[str, np.ndarray]:
  """Logged impressions of `users`: `slate` draws each from the logging policy, and outcomes.

  Returns:
    `history [B, L]` int32, `items [B, S]` int32, `propensity [B, S]` float32 (the true
    exposure propensity 1 − (1 − q)^S), `level [B, S]` int32.
  """
  q = logging_probs(world, users)
  cdf = np.cumsum(q, axis=-1)
  u = rng.uniform(size=(len(users), world.slate))
  items = np.minimum((u[..., None] > cdf[:, None, :]).sum(-1), world.num_items - 1)
  probs = level_probs(world, users, items)
  draw = rng.uniform(size=items.shape)[..., None]
  level = (draw > np.cumsum(probs, axis=-1)).sum(-1).clip(0, NUM_LEVELS - 1)
  prop = 1.0 - (1.0 - np.take_along_axis(q, items, axis=-1)) ** world.slate
  return {"history": world.histories[users], "items": items.astype(np.int32),
          "propensity": prop.astype(np.float32), "level": level.astype(np.int32)}


def ndcg_at_k(scores: np.ndarray, gains: np.ndarray, k: int = 10) -> np.ndarray:
  """NDCG@k per row: Σ_{r<k} g_{π(r)} / log2(r + 2) over the ideal order's DCG, `[B]`.

  `scores` `[B, N]` rank the items (descending); `gains` `[B, N]` ≥ 0 are their relevances.

  Examples:
    >>> ndcg_at_k(np.array([[3.0, 2.0, 1.0]]), np.array([[1.0, 0.0, 1.0]]), k=2).round(4)
    array([0.6131])
  """
  if k < 1:
    raise ValueError(f"k={k} must be >= 1")
  k = min(k, scores.shape[-1])
  discount = 1.0 / np.log2(np.arange(k) + 2.0)
  order = np.argsort(-scores, axis=-1, kind="stable")[:, :k]
  dcg = (np.take_along_axis(gains, order, axis=-1) * discount).sum(-1)
  ideal = (-np.sort(-gains, axis=-1)[:, :k] * discount).sum(-1)
  return np.where(ideal > 0, dcg / np.maximum(ideal, 1e-12), 0.0)


def top_k_mean(scores: np.ndarray, values: np.ndarray, k: int) -> np.ndarray:
  """Mean of `values` over each row's top-`k` items by `scores`, `[B]` (a simulated online
  rate: the share of the top-k recommendations that end in deep engagement, say)."""
  order = np.argsort(-scores, axis=-1, kind="stable")[:, :k]
  return np.take_along_axis(values, order, axis=-1).mean(-1)


def _sigmoid(x: np.ndarray) -> np.ndarray:
  return 1.0 / (1.0 + np.exp(-x))
