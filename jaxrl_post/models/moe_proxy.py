"""Structure-preserving MoE proxies by clustering experts (arXiv 2608.10823, §3.2).

`build_moe_proxy(model, calib_tokens, k)` keeps `k` experts per sparse layer and slices the
expert axis of `w_gate` / `w_up` / `w_down` and the router's columns to them; attention,
norms, embeddings, the dense layers and the top-k routing path are unchanged (no merging, no
fine-tuning). Which experts are kept:

  1. On the calibration tokens, per sparse layer: activation frequency f_e (share of the
     top-k slots routed to e), co-activation counts C_ee' (tokens that select both), and the
     hidden states routed to each expert (the MoE block's input).
  2. Three distance views, each scaled to [0, 1] by its largest off-diagonal entry. The
     paper's exact definitions are "not found"; these are PROPOSAL choices:
       D_r(e, e') = 1 − cos(W_r[:, e], W_r[:, e'])               router-parameter view
       D_c(e, e') = 1 − C_ee' / sqrt(n_e · n_e')                 co-activation view
                    (n_e tokens selecting e; experts never selected are at distance 1)
       D_f(e, e') = 1 − cos(μ_e, μ_e')                           routed-context view
                    (μ_e the mean routed hidden state; 0 for never-selected experts)
  3. D = α_r D_r + α_c D_c + α_f D_f (`weights`; values "not found" in the paper: config).
  4. K-Medoids (alternating assignment / medoid update) with the K most frequent experts as
     initial medoids; a cluster's medoid minimises the summed distance to its members, ties
     (within 1e-9) going to the more frequent expert, so representatives prefer
     high-frequency experts.

Baselines (`selection`): "frequency" (the K most frequent), "random" (K uniformly at
random, `seed`), "first_k" (experts 0 … K − 1).
"""

from __future__ import annotations

import numpy as np
from flax import nnx

from jaxrl_post.models import moe
from jaxrl_post.registry import Registry

SELECTIONS: Registry = Registry("moe proxy selection")


def expert_statistics(model, calib_tokens, calib_mask=None) -> list[dict[str, np.ndarray]]:
  """Per sparse layer: `freq [E]`, `coact [E, E]`, `router_rows [E, d]`, `prototypes [E, d]`.

  Args:
    model: a `CausalLM` with `num_experts` > 0 (unrolled or scanned layers).
    calib_tokens: `int32[b, t]` calibration rows (disjoint from evaluation data).
    calib_mask: `bool[b, t]`, True on real tokens (default all).
  """
  c = model.config
  if not c.num_experts:
    raise ValueError(f"build_moe_proxy needs a MoE model; num_experts={c.num_experts}")
  tokens = np.asarray(calib_tokens)
  mask = np.ones(tokens.shape, bool) if calib_mask is None else np.asarray(calib_mask, bool)

  logits, inputs = map(np.asarray, _routed(model, tokens, mask))
  routers = _router_kernels(model)
  e, k = c.num_experts, c.num_experts_per_tok
  out = []
  for layer in range(logits.shape[0]):
    valid = mask.reshape(-1)
    lg = logits[layer].reshape(-1, e)[valid]
    h = inputs[layer].reshape(-1, inputs.shape[-1])[valid].astype(np.float64)
    top = np.argsort(-lg, axis=-1, kind="stable")[:, :k]
    onehot = np.zeros((len(lg), e))
    np.put_along_axis(onehot, top, 1.0, axis=-1)
    counts = onehot.sum(0)
    proto = (onehot.T @ h) / np.maximum(counts, 1)[:, None]
    out.append(dict(freq=counts / max(counts.sum(), 1.0), coact=onehot.T @ onehot,
                    router_rows=routers[layer].T.astype(np.float64), prototypes=proto))
  return out


@nnx.jit
def _routed(model, tokens, mask):
  """Router logits `[L_moe, b, t, E]` and MoE-block inputs `[L_moe, b, t, d]` of one call.

  At module level so that repeated proxies of one model reuse the compiled program.
  """
  with moe.collect_router(inputs=True) as records:
    model(tokens, attention_mask=mask)
  return records.calls[0]["router_logits"], records.calls[0]["inputs"]


def _router_kernels(model) -> list[np.ndarray]:
  c = model.config
  if c.scan_layers:
    return list(np.asarray(model.layers.mlp.router[...]))
  return [np.asarray(model.layers[i].mlp.router[...]) for i in c.moe_layers]


def _cosine_distance(x: np.ndarray) -> np.ndarray:
  norm = np.linalg.norm(x, axis=-1, keepdims=True)
  unit = np.divide(x, norm, out=np.zeros_like(x), where=norm > 0)
  return 1.0 - unit @ unit.T


def _scaled(d: np.ndarray) -> np.ndarray:
  d = np.array(d, dtype=np.float64)
  np.fill_diagonal(d, 0.0)
  top = d.max()
  return d / top if top > 0 else d


def distance_views(stats: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """The three `[E, E]` views `router`, `coact`, `context` of one layer (module docstring)."""
  n = np.diag(stats["coact"])
  denom = np.sqrt(np.outer(n, n))
  coact = 1.0 - np.divide(stats["coact"], denom, out=np.zeros_like(denom), where=denom > 0)
  return dict(router=_scaled(_cosine_distance(stats["router_rows"])), coact=_scaled(coact),
              context=_scaled(_cosine_distance(stats["prototypes"])))


def fused_distance(views: dict[str, np.ndarray], weights=(1.0, 1.0, 1.0)) -> np.ndarray:
  """D = α_r D_router + α_c D_coact + α_f D_context."""
  a_r, a_c, a_f = weights
  if min(weights) < 0 or sum(weights) <= 0:
    raise ValueError(f"weights={tuple(weights)} must be >= 0 with a positive sum")
  return a_r * views["router"] + a_c * views["coact"] + a_f * views["context"]


def kmedoids(distance: np.ndarray, k: int, freq: np.ndarray, max_iter: int = 100) -> np.ndarray:
  """K-Medoids on `distance [E, E]`; returns the `k` medoids, sorted.

  Initial medoids: the `k` most frequent experts (`freq [E]`, ties to the lower index).
  Iterates: assign every expert to its nearest medoid (ties to the more frequent medoid);
  each cluster's medoid becomes the member with the least summed distance to the cluster,
  ties (1e-9) to the more frequent member; stops when the medoids do not change.
  """
  d = np.asarray(distance, np.float64)
  e = d.shape[0]
  if not 1 <= k <= e:
    raise ValueError(f"k={k} must be in [1, num_experts={e}]")
  freq = np.asarray(freq, np.float64)
  by_freq = np.lexsort((np.arange(e), -freq))  # most frequent first, then lower index
  medoids = by_freq[:k]
  for _ in range(max_iter):
    # Nearest medoid; among equals the more frequent one (medoids are ordered by frequency).
    order = medoids[np.argsort(-freq[medoids], kind="stable")]
    assign = order[np.argmin(d[:, order], axis=1)]
    assign[order] = order
    new = []
    for m in order:
      members = np.flatnonzero(assign == m)
      cost = d[np.ix_(members, members)].sum(1)
      best = cost.min()
      near = members[cost <= best + 1e-9]
      new.append(near[np.argmax(freq[near])])
    new = np.asarray(new)
    if set(new.tolist()) == set(medoids.tolist()):
      break
    medoids = new
  return np.sort(medoids)


@SELECTIONS.register("kmedoids")
def _select_kmedoids(stats, k, *, weights, rng):
  del rng
  return kmedoids(fused_distance(distance_views(stats), weights), k, stats["freq"])


@SELECTIONS.register("frequency")
def _select_frequency(stats, k, *, weights, rng):
  del weights, rng
  e = len(stats["freq"])
  return np.sort(np.lexsort((np.arange(e), -stats["freq"]))[:k])


@SELECTIONS.register("random")
def _select_random(stats, k, *, weights, rng):
  del weights
  return np.sort(rng.choice(len(stats["freq"]), size=k, replace=False))


@SELECTIONS.register("first_k")
def _select_first_k(stats, k, *, weights, rng):
  del weights, rng
  return np.arange(k)


def slice_experts(model, keep: list[np.ndarray]):
  """A new `CausalLM` with each sparse layer's experts and router columns cut to `keep[i]`
  (`i` over `config.moe_layers`, each of the same length K); top-k becomes min(k, K)."""
  c = model.config
  sizes = {len(x) for x in keep}
  if len(keep) != len(c.moe_layers) or len(sizes) != 1:
    raise ValueError(f"keep needs one index array of one length per sparse layer "
                     f"({len(c.moe_layers)}); got lengths {[len(x) for x in keep]}")
  kk = sizes.pop()
  new_config = c.replace(num_experts=kk, num_experts_per_tok=min(c.num_experts_per_tok, kk))
  proxy = nnx.eval_shape(lambda: type(model)(new_config, rngs=nnx.Rngs(0)))
  flat = []
  keep_by_layer = dict(zip(c.moe_layers, keep))
  for path, leaf in nnx.to_flat_state(nnx.state(model)):
    value = leaf.get_value()
    if "mlp" in path and path[-1] in ("router", "w_gate", "w_up", "w_down"):
      axis = -1 if path[-1] == "router" else (1 if c.scan_layers else 0)
      if c.scan_layers:
        idx = np.stack(keep)  # [L, K]
        value = np.stack([np.take(np.asarray(value[i]), idx[i], axis=axis if axis < 0 else 0)
                          for i in range(len(idx))])
      else:
        value = np.take(np.asarray(value), keep_by_layer[path[1]], axis=axis)
    flat.append((path, leaf.replace(value)))
  graphdef, _ = nnx.split(proxy)
  return nnx.merge(graphdef, nnx.from_flat_state(flat))


def build_moe_proxy(model, calib_tokens, k: int, weights=(1.0, 1.0, 1.0),
                    selection: str = "kmedoids", *, calib_mask=None, seed: int = 0):
  """`(proxy, kept)`: `model` with `k` experts per sparse layer, and the kept indices per layer.

  Args:
    model: a MoE `CausalLM`.
    calib_tokens, calib_mask: calibration rows (`expert_statistics`).
    k: experts kept per layer (1 … num_experts).
    weights: (α_r, α_c, α_f) of the fused distance.
    selection: "kmedoids" | "frequency" | "random" | "first_k" (`SELECTIONS`).
    seed: for "random".
  """
  if not 1 <= k <= model.config.num_experts:
    raise ValueError(f"k={k} must be in [1, num_experts={model.config.num_experts}]")
  choose = SELECTIONS.get(selection)
  stats = expert_statistics(model, calib_tokens, calib_mask)
  rng = np.random.default_rng(seed)
  keep = [np.asarray(choose(s, k, weights=weights, rng=rng)) for s in stats]
  return slice_experts(model, keep), keep
