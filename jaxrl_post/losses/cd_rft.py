"""CD-RFT (arXiv 2608.08224): a penalty on the shared control bottleneck of RL fine-tuning.

Multi-task RL post-training tends to route the reward gain of *every* task family through the
same few components (a "shared control bottleneck", SCB), even when the families activate
different components. CD-RFT measures which components *control* each family's reward gain, in
the spirit of Metabolic Control Analysis, and penalises control that is concentrated on the
same components across families.

All formulas below are PROPOSAL instantiations (the paper's exact equations were not available);
every choice is a keyword argument named as such.

  components      c = 1..M, parameter slices θ_c (PROPOSAL: per-layer attention and MLP blocks),
                  Δθ_c = θ_c − θ_c⁰ the displacement from the reference θ⁰
  control (PCC)   C_{c,f} ≈ (∇_{θ_c} R_f · Δθ_c)/ΔR_f, the first-order elasticity of family f's
                  reward gain to scaling component c's update
  control matrix  K[c, f] = Σ_{leaves ∈ c} Σ sg(g_f) ⊙ Δθ   `[M, F]`, g_f the gradient of family
                  f's policy-gradient surrogate (the 1/ΔR_f factor is dropped: SCB is invariant
                  to a column's scale)
  SCB             k̃_f = |K[:, f]| / Σ_c |K[c, f]|,
                  SCB = 2/(F(F−1)) Σ_{f<f'} cos(k̃_f, k̃_f')   (1 = identical control profiles,
                  0 = disjoint ones); ACB is the same statistic on activation magnitudes and
                  Gap = ACB − SCB
  loss            L = L_GRPO + γ · SCB(K(θ))

The exact ∇SCB needs ∇_θ(∇_θ R · Δθ), a Hessian-vector product that flash attention does not
support; the first-order proxy holds g_f fixed (stop-gradient), so the gradient flows only
through Δθ:  ∂SCB/∂θ_i = Σ_f ∂SCB/∂K[c(i), f] · g_f,i. Per-family gradients come for free when
the families are separate micro-batches of gradient accumulation.

Parameters are plain nested dicts (`nnx.to_pure_dict(nnx.state(model, nnx.Param))`).
`component_ids` maps every leaf to component indices once, on the host; layers stacked under
`scan_layers` (a leading `[L]` axis) get one component per layer slice.

References:
  arXiv 2608.08224, "Control-Diverse Reinforcement Fine-Tuning: Decoupling the Shared Control
  Bottleneck of RL Post-Training".
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_post.losses.regularizers import REGULARIZERS

# PROPOSAL: γ ∈ {0.01, 0.1} swept against matched GRPO; 0.01 is the default.
GAMMA = 0.01
# PROPOSAL: components are per-layer attention and MLP blocks.
BLOCK_NAMES = ("attn", "mlp")
GRANULARITIES = ("block", "leaf")
_EPS = 1e-12


def _key_name(entry) -> Any:
  for attr in ("key", "name", "idx"):
    if hasattr(entry, attr):
      return getattr(entry, attr)
  return entry


def _is_stacked(path: tuple) -> bool:
  # A `scan_layers` CausalLM keeps its layer parameters at ("layers", <name>, ...) with a
  # leading [L] axis; an unrolled one at ("layers", <int>, ...).
  return len(path) > 1 and path[0] == "layers" and isinstance(path[1], str)


def component_ids(
  params: Any,
  *,
  granularity: str = "block",
  block_names: tuple[str, ...] = BLOCK_NAMES,
  others: str = "exclude",
) -> tuple[Any, int, list[str]]:
  """Host helper: the component index of every parameter (slice), for `control_matrix`.

  Granularity (PROPOSAL "block"): "block" gives one component per layer and block — every leaf
  whose path contains a `block_names` entry belongs to the block named by the path up to that
  entry (e.g. "layers/3/attn": q/k/v/o kernels, biases and QK-norms of layer 3); "leaf" gives
  one component per leaf. A stacked (`scan_layers`) leaf `[L, ...]` gets one component per
  layer slice, named with the layer index. Attention heads as components are not implemented.

  Args:
    params: nested dict of arrays (or `jax.ShapeDtypeStruct`s).
    granularity: "block" or "leaf".
    block_names: the path entries that open a component in "block" mode.
    others: PROPOSAL "exclude": leaves outside every block (embeddings, norms between blocks,
      lm_head) get id −1 and do not enter K; "separate": each is a component of its own.

  Returns:
    `(ids, M, names)`: `ids` a pytree like `params` of int32 NumPy arrays broadcastable to each
    leaf (shape `()` or `[L, 1, ..., 1]`), `M` the number of components and `names[c]` the name
    of component c.

  Examples:
    >>> params = {"embed": np.zeros((5, 2)),
    ...           "layers": [{"attn": {"q": np.zeros((2, 2))}, "mlp": {"up": np.zeros((2, 3))}}]}
    >>> ids, m, names = component_ids(params)
    >>> m, names, int(ids["embed"]), int(ids["layers"][0]["mlp"]["up"])
    (2, ['layers/0/attn', 'layers/0/mlp'], -1, 1)
  """
  if granularity not in GRANULARITIES:
    raise ValueError(f"granularity must be one of {GRANULARITIES}; got {granularity!r}")
  if others not in ("exclude", "separate"):
    raise ValueError(f"others must be 'exclude' or 'separate'; got {others!r}")
  leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
  names: list[str] = []
  index: dict[str, int] = {}

  def component(name: str) -> int:
    if name not in index:
      index[name] = len(names)
      names.append(name)
    return index[name]

  out = []
  for keypath, leaf in leaves:
    path = tuple(_key_name(e) for e in keypath)
    shape = tuple(np.shape(leaf))
    cut = next((i for i, p in enumerate(path) if p in block_names), None)
    if granularity == "leaf":
      base = "/".join(map(str, path))
    elif cut is not None:
      base = "/".join(map(str, path[:cut + 1]))
    elif others == "separate":
      base = "/".join(map(str, path))
    else:
      out.append(np.full((), -1, np.int32))
      continue
    if _is_stacked(path) and len(shape) >= 1:
      layer_ids = [component(f"layers/{i}/{base.removeprefix('layers/')}")
                   for i in range(shape[0])]
      out.append(np.asarray(layer_ids, np.int32).reshape((shape[0],) + (1,) * (len(shape) - 1)))
    else:
      out.append(np.full((), component(base), np.int32))
  # Number components in natural path order (layer 2 before layer 10, and the same order for
  # stacked and unrolled layers), whatever the leaf order was.
  order = sorted(range(len(names)), key=lambda c: _natural_key(names[c]))
  remap = np.full(len(names) + 1, -1, np.int32)  # remap[-1] keeps the excluded id −1.
  remap[np.asarray(order, np.int64)] = np.arange(len(names), dtype=np.int32)
  out = [remap[i] for i in out]
  return treedef.unflatten(out), len(names), [names[c] for c in order]


def _natural_key(name: str) -> tuple:
  return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in name.split("/"))


def _stack_families(family_grads):
  if isinstance(family_grads, list):
    if not family_grads:
      raise ValueError("family_grads must hold at least one family; got an empty list")
    return jax.tree.map(lambda *g: jnp.stack(g), *family_grads)
  return family_grads


def control_matrix(
  family_grads: Any,
  delta: Any,
  ids: Any,
  num_components: int,
) -> jax.Array:
  """K[c, f] = Σ_{leaves ∈ c} Σ sg(g_f) ⊙ Δθ, the first-order control matrix `[M, F]`.

  The family gradients are stop-gradient'ed: K is differentiable in `delta` only (the
  first-order proxy of the Hessian-vector product of the exact gradient). Call it inside the
  caller's jitted loss with `ids` from `component_ids` (host constants: leaves whose ids are all
  −1 are skipped at trace time).

  Args:
    family_grads: a pytree like `delta` whose leaves carry a leading family axis `[F, *leaf]`,
      or a Python list of F pytrees like `delta`.
    delta: pytree of parameter displacements θ − θ⁰.
    ids: pytree like `delta` of int arrays broadcastable to each leaf (`component_ids`); ids
      outside [0, num_components) are dropped.
    num_components: M.

  Returns:
    K `[M, F]`, float32.

  Examples:
    >>> delta = {"a": jnp.array([1.0, 2.0]), "b": jnp.array([3.0])}
    >>> grads = [{"a": jnp.array([1.0, 1.0]), "b": jnp.array([0.0])},
    ...          {"a": jnp.array([0.0, 1.0]), "b": jnp.array([2.0])}]
    >>> ids = {"a": np.int32(0), "b": np.int32(1)}
    >>> control_matrix(grads, delta, ids, 2).tolist()
    [[3.0, 2.0], [0.0, 6.0]]
  """
  if not isinstance(num_components, (int, np.integer)) or num_components < 1:
    raise ValueError(f"num_components must be a positive integer; got {num_components!r}")
  grads = _stack_families(family_grads)
  g_leaves = jax.tree.leaves(grads)
  d_leaves, treedef = jax.tree.flatten(delta)
  i_leaves = treedef.flatten_up_to(ids)
  if jax.tree.structure(grads) != treedef:
    raise ValueError(f"family_grads must have the structure of delta (plus a leading family "
                     f"axis); got {jax.tree.structure(grads)} against {treedef}")
  if not g_leaves:
    raise ValueError("delta has no leaves")
  num_families = g_leaves[0].shape[0] if g_leaves[0].ndim else 0
  k = jnp.zeros((num_components, num_families), jnp.float32)
  for g, d, i in zip(g_leaves, d_leaves, i_leaves):
    if g.shape != (num_families, *d.shape):
      raise ValueError(f"family_grads leaves must be [F={num_families}, *leaf]; got "
                       f"{tuple(g.shape)} for a delta leaf of shape {tuple(d.shape)}")
    if isinstance(i, (np.ndarray, np.integer, int)) and np.all(np.asarray(i) < 0):
      continue  # An excluded leaf: nothing to add, and no work at run time.
    i = jnp.asarray(i)
    if i.ndim > d.ndim or any(s not in (1, t) for s, t in zip(i.shape[::-1], d.shape[::-1])):
      raise ValueError(f"ids leaf of shape {tuple(i.shape)} does not broadcast to its "
                       f"parameter of shape {tuple(d.shape)}")
    i = i.reshape((1,) * (d.ndim - i.ndim) + i.shape)
    prod = jax.lax.stop_gradient(g).astype(jnp.float32) * d.astype(jnp.float32)[None]
    # Sum the axes an id is constant along first, then scatter the per-id sums.
    summed = tuple(ax + 1 for ax in range(d.ndim) if i.shape[ax] == 1)
    prod = jnp.sum(prod, axis=summed, keepdims=True) if summed else prod
    seg = jnp.broadcast_to(i, prod.shape[1:]).reshape(-1)
    k = k + jax.ops.segment_sum(prod.reshape(num_families, -1).T, seg,
                                num_segments=num_components)
  return k


def controlled_displacement_norm(delta: Any, ids: Any) -> jax.Array:
  """‖Δθ_K‖₂, the norm of the displacement over the parameters that enter K (ids ≥ 0).

  SCB is of degree 0 in Δθ, so ∂SCB/∂Δθ is of degree −1: it grows as 1/‖Δθ‖ near θ⁰.
  `scale="displacement"` in `methods.control_regularizer.control_loss` multiplies the
  penalty by sg(‖Δθ_K‖), which makes its gradient of degree 0 (unchanged when Δθ is scaled).

  Args:
    delta: pytree of parameter displacements θ − θ⁰.
    ids: pytree like `delta` of int arrays broadcastable to each leaf (`component_ids`).

  Returns:
    `[]` float32.

  Examples:
    >>> delta = {"a": jnp.array([3.0, 0.0]), "b": jnp.array([4.0]), "e": jnp.array([9.0])}
    >>> float(controlled_displacement_norm(delta, {"a": 0, "b": 1, "e": -1}))
    5.0
  """
  d_leaves, treedef = jax.tree.flatten(delta)
  total = jnp.zeros((), jnp.float32)
  for d, i in zip(d_leaves, treedef.flatten_up_to(ids)):
    if isinstance(i, (np.ndarray, np.integer, int)) and np.all(np.asarray(i) < 0):
      continue
    sq = jnp.square(d.astype(jnp.float32))
    total = total + jnp.sum(jnp.where(jnp.asarray(i) >= 0, sq, 0.0))
  return jnp.sqrt(total)


def _concentration(x: jax.Array, name: str) -> jax.Array:
  x = jnp.asarray(x, jnp.float32)
  if x.ndim != 2:
    raise ValueError(f"{name} must be [M, F] (components × families); got {tuple(x.shape)}")
  m, f = x.shape
  if f < 2:
    raise ValueError(f"{name} needs F ≥ 2 task families on its family axis (axis 1); got "
                     f"shape {tuple(x.shape)}")
  a = jnp.abs(x)
  k = a / jnp.maximum(a.sum(0, keepdims=True), _EPS)  # k̃_f (L1 column normalisation).
  # A safe norm: an all-zero column has cosine 0 with every other column (and a finite
  # gradient), where k / ‖k‖ would be 0/0.
  norm = jnp.sqrt(jnp.maximum(jnp.sum(k * k, axis=0, keepdims=True), _EPS * _EPS))
  kn = k / norm
  s = kn.T @ kn
  return (s.sum() - jnp.trace(s)) / (f * (f - 1))


@jax.jit
def scb(control: jax.Array) -> jax.Array:
  """Shared control bottleneck: SCB = 2/(F(F−1)) Σ_{f<f'} cos(k̃_f, k̃_f'), k̃_f = |K_f|/‖K_f‖₁.

  1 when every family has the same control profile over components, 0 when their supports are
  disjoint. An all-zero column counts as cosine 0.

  Args:
    control: K `[M, F]` (components × task families), F ≥ 2.

  Returns:
    `[]` float32.

  Examples:
    >>> round(float(scb(jnp.array([[1.0, 2.0], [3.0, 6.0]]))), 6)
    1.0
    >>> float(scb(jnp.array([[1.0, 0.0], [0.0, -3.0]])))
    0.0

  References:
    arXiv 2608.08224, "Control-Diverse Reinforcement Fine-Tuning: Decoupling the Shared Control
    Bottleneck of RL Post-Training".
  """
  return _concentration(control, "control")


@jax.jit
def activation_concentration(activations: jax.Array) -> jax.Array:
  """ACB: the SCB statistic on activation magnitudes A `[M, F]` (mean |activation| of component c
  on family f's rollouts), F ≥ 2.

  Examples:
    >>> round(float(activation_concentration(jnp.array([[1.0, 1.0], [0.0, 1.0]]))), 4)
    0.7071
  """
  return _concentration(activations, "activations")


def control_gap(acb: jax.Array, scb_value: jax.Array) -> jax.Array:
  """Activation–control gap ACB − SCB (small: control collapsed onto shared components).

  Examples:
    >>> float(control_gap(jnp.float32(0.75), jnp.float32(0.5)))
    0.25
  """
  return jnp.asarray(acb) - jnp.asarray(scb_value)


@REGULARIZERS.register("cd_rft")
def cd_rft_penalty(
  params: Any,
  ref_params: Any,
  family_grads: Any,
  ids: Any,
  num_components: int,
  *,
  gamma: float = GAMMA,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """γ · SCB(K) with K = control_matrix(sg(g), θ − θ⁰): CD-RFT's first-order regulariser.

  Add `loss` to the GRPO loss; its gradient is ∂/∂θ_i = γ Σ_f ∂SCB/∂K[c(i), f] · g_f,i, and
  none flows into `family_grads`. `ref_params` enters only through Δθ = θ − θ⁰ (a constant in
  training: differentiate with respect to `params` only).

  Args:
    params: θ, nested dict of arrays.
    ref_params: θ⁰ (the fine-tuning start), same structure.
    family_grads: per-family gradients of the policy surrogate, a pytree like `params` with a
      leading `[F]` axis or a list of F such pytrees (F ≥ 2).
    ids, num_components: from `component_ids(params)`.
    gamma: PROPOSAL penalty weight γ (swept over {0.01, 0.1}); default 0.01.

  Returns:
    `(loss, aux)`: loss `[]` = γ·SCB; aux `{"scb": [], "control_matrix": [M, F]}`.

  Examples:
    >>> p, p0 = {"a": jnp.array([1.0, 2.0])}, {"a": jnp.zeros(2)}
    >>> g = {"a": jnp.array([[1.0, 0.0], [0.0, 1.0]])}  # F = 2 families, one component each
    >>> ids = {"a": np.array([0, 1], np.int32)}
    >>> loss, aux = cd_rft_penalty(p, p0, g, ids, 2, gamma=0.1)
    >>> float(loss), aux["control_matrix"].tolist()
    (0.0, [[1.0, 0.0], [0.0, 2.0]])

  References:
    arXiv 2608.08224, "Control-Diverse Reinforcement Fine-Tuning: Decoupling the Shared Control
    Bottleneck of RL Post-Training".
  """
  delta = jax.tree.map(lambda p, r: p - r, params, ref_params)
  k = control_matrix(family_grads, delta, ids, num_components)
  if k.shape[1] < 2:
    raise ValueError(f"family_grads needs F ≥ 2 task families on its leading family axis; got "
                     f"F = {k.shape[1]}")
  s = scb(k)
  return gamma * s, {"scb": s, "control_matrix": k}

