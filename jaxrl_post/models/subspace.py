"""GCPO (arXiv 2608.11674): low-rank updates kept out of a weight's principal subspace.

RL post-training with a KL penalty still drifts the policy's weights, and the drift that hurts
(forgetting other tasks, sudden validation drops) is the part that lands in the *principal*
subspace of each pretrained weight: the span of its top singular vectors. GCPO measures that
share and removes it by construction.

For a reference weight W = Φ Σ Ψᵀ (paper layout W `[d_out, d_in]`) keep the top-k left and right
singular vectors Φ_k `[d_out, k]`, Ψ_k `[d_in, k]`; Π_Φ = Φ_kΦ_kᵀ, Π_Ψ = Ψ_kΨ_kᵀ, Π^⊥ = I − Π.

  four-block split   δW = Π_Φ δW Π_Ψ (PP) + Π_Φ δW Π_Ψ^⊥ (PO) + Π_Φ^⊥ δW Π_Ψ (OP)
                          + Π_Φ^⊥ δW Π_Ψ^⊥ (OO),   E_XY = ‖block‖_F²
  overlap            O = 1 − E_OO / ‖δW‖_F²,  O_null = 1 − (d_out − k)(d_in − k)/(d_out d_in)
                     (the expected O of an isotropic random update), O_excess = O − O_null,
                     O_normalised = (O − O_null)/(1 − O_null)
  parametrisation    W = W_ref + s · Π_Φ^⊥ L R Π_Ψ^⊥   (L `[d_out, r]`, R `[r, d_in]` LoRA factors)

so Φ_kᵀ δW = 0 and δW Ψ_k = 0 hold exactly: only the OO block can move. The projectors are
computed once from W_ref and frozen; they are never materialised (Π^⊥ M = M − Φ_k(Φ_kᵀ M)).

Layout used here. The project's models store *kernels* K = Wᵀ `[d_in, d_out]` (`y = x @ K`),
so every function takes K, not W:

  * `SubspaceBases(phi [..., d_out, k], psi [..., d_in, k])`: Φ_k (output side, the left
    singular vectors of W = the right ones of K) and Ψ_k (input side).
  * LoRA factors in kernel layout: `a` `[..., d_in, r]` (the input-side "down" factor, the
    paper's Rᵀ) and `b` `[..., r, d_out]` (the output-side "up" factor, the paper's Lᵀ);
    δK = s · (Π_Ψ^⊥ a)(b Π_Φ^⊥) = δWᵀ. The paper's "left" projection (Π_Φ^⊥, output side) acts
    on `b`, its "right" projection (Π_Ψ^⊥, input side) on `a`.
  * Leading axes `...` are stacked layers (a `scan_layers` model's `[L, d_in, d_out]`): every
    function broadcasts over them (SVD, products and energies are batched per layer).

Scale: s = α/r (PROPOSAL, the peft LoRA convention; the paper lists α = 16, r = 32 and writes α
alone; `rank_scaled=False` gives s = α). Constraint modes (the paper's ablations) are in
`SUBSPACE_CONSTRAINTS`: "bilateral" (the paper's), "left", "right", "principal" (project *into*
the principal subspace: all energy in PP) and "none" (plain LoRA).

Pytree level: `gcpo_init` computes bases and LoRA factors for the targeted leaves of a plain
nested dict of parameters (`nnx.to_pure_dict(nnx.state(model, nnx.Param))`), `gcpo_apply` merges
W + δW into those leaves (a merged forward), and `update_overlap` is the per-leaf diagnostic of
a realised update. Multi-axis kernels (q/k/v `[embed, heads, head_dim]`, o_proj `[heads,
head_dim, embed]`) are handled as their matrix view `[d_in, d_out]`.

References:
  arXiv 2608.11674, "GCPO: Diagnosing and Constraining Subspace Geometry in Rollout RL for LLMs".
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxrl_post.registry import Registry

# Hyperparameters of arXiv 2608.11674: protected rank k = 8, LoRA rank r = 32, α = 16.
K = 8
RANK = 32
ALPHA = 16.0
# PROPOSAL: the usual LoRA targets, every attention and MLP projection (the paper's exact target
# set was not found).
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

SUBSPACE_CONSTRAINTS: Registry = Registry("subspace constraint")


class SubspaceBases(NamedTuple):
  """Frozen top-k singular bases of one reference kernel K = W_refᵀ `[..., d_in, d_out]`."""

  phi: jax.Array  # [..., d_out, k] Φ_k, output side (left singular vectors of W).
  psi: jax.Array  # [..., d_in, k] Ψ_k, input side (right singular vectors of W).


class LoraFactors(NamedTuple):
  """LoRA factors in kernel layout: δK = s · a @ b (before projection)."""

  a: jax.Array  # [..., d_in, r] input-side ("down") factor, the paper's Rᵀ.
  b: jax.Array  # [..., r, d_out] output-side ("up") factor, the paper's Lᵀ; zero at init.


class BlockEnergies(NamedTuple):
  """Squared Frobenius norms of the four blocks (first letter: output side Φ; second: input Ψ)."""

  pp: jax.Array  # [...] ‖Π_Φ δW Π_Ψ‖².
  po: jax.Array  # [...] ‖Π_Φ δW Π_Ψ^⊥‖².
  op: jax.Array  # [...] ‖Π_Φ^⊥ δW Π_Ψ‖².
  oo: jax.Array  # [...] ‖Π_Φ^⊥ δW Π_Ψ^⊥‖².


class Overlap(NamedTuple):
  """Principal-subspace overlap of an update and its dimension-corrected forms."""

  overlap: jax.Array  # [...] O = 1 − E_OO / E_total (0 where δW = 0).
  excess: jax.Array  # [...] O − O_null.
  normalised: jax.Array  # [...] (O − O_null)/(1 − O_null) (PROPOSAL; 0 where O_null = 1).


# ---------------------------------------------------------------------------------------------
# Projections without d×d projectors.
# ---------------------------------------------------------------------------------------------


def _mT(x):
  return jnp.swapaxes(x, -1, -2)


def _in_perp(m, psi):
  """Π_Ψ^⊥ m for m `[..., d_in, n]`: m − Ψ(Ψᵀ m)."""
  return m - psi @ (_mT(psi) @ m)


def _in_par(m, psi):
  """Π_Ψ m for m `[..., d_in, n]`."""
  return psi @ (_mT(psi) @ m)


def _out_perp(m, phi):
  """m Π_Φ^⊥ for m `[..., n, d_out]`: m − (m Φ)Φᵀ."""
  return m - (m @ phi) @ _mT(phi)


def _out_par(m, phi):
  """m Π_Φ for m `[..., n, d_out]`."""
  return (m @ phi) @ _mT(phi)


def _check_bases(bases: SubspaceBases, d_in: int, d_out: int, what: str):
  phi, psi = bases
  if phi.ndim < 2 or psi.ndim < 2 or phi.shape[-2] != d_out or psi.shape[-2] != d_in \
      or phi.shape[-1] != psi.shape[-1]:
    raise ValueError(
      f"bases must be SubspaceBases(phi [..., d_out={d_out}, k], psi [..., d_in={d_in}, k]) for "
      f"{what}; got phi {tuple(phi.shape)}, psi {tuple(psi.shape)}")


@SUBSPACE_CONSTRAINTS.register("bilateral")
def bilateral(a: jax.Array, b: jax.Array, bases: SubspaceBases) -> tuple[jax.Array, jax.Array]:
  """The paper's constraint: (Π_Ψ^⊥ a, b Π_Φ^⊥), so Φ_kᵀ δW = 0 and δW Ψ_k = 0 (OO block only)."""
  return _in_perp(a, bases.psi), _out_perp(b, bases.phi)


@SUBSPACE_CONSTRAINTS.register("left")
def left_only(a: jax.Array, b: jax.Array, bases: SubspaceBases) -> tuple[jax.Array, jax.Array]:
  """Ablation: only Π_Φ^⊥ δW (the paper's left, output side): Φ_kᵀ δW = 0; blocks OP + OO."""
  return a, _out_perp(b, bases.phi)


@SUBSPACE_CONSTRAINTS.register("right")
def right_only(a: jax.Array, b: jax.Array, bases: SubspaceBases) -> tuple[jax.Array, jax.Array]:
  """Ablation: only δW Π_Ψ^⊥ (the paper's right, input side): δW Ψ_k = 0; blocks PO + OO."""
  return _in_perp(a, bases.psi), b


@SUBSPACE_CONSTRAINTS.register("principal")
def principal(a: jax.Array, b: jax.Array, bases: SubspaceBases) -> tuple[jax.Array, jax.Array]:
  """Ablation: project *into* the principal subspace, Π_Φ δW Π_Ψ (all energy in PP)."""
  return _in_par(a, bases.psi), _out_par(b, bases.phi)


@SUBSPACE_CONSTRAINTS.register("none")
def unconstrained(a: jax.Array, b: jax.Array, bases: SubspaceBases) -> tuple[jax.Array, jax.Array]:
  """Ablation: plain LoRA, no projection."""
  del bases
  return a, b


# ---------------------------------------------------------------------------------------------
# One kernel.
# ---------------------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames="k")
def principal_bases(kernel: jax.Array, k: int = K) -> SubspaceBases:
  """Top-k singular bases of a reference kernel K = W_refᵀ, computed once and then frozen.

  W_ref = Φ Σ Ψᵀ ⇔ K = Ψ Σ Φᵀ, so Ψ_k (input side) are the top-k left singular vectors of K
  and Φ_k (output side) its top-k right singular vectors. The SVD runs in float32.

  Args:
    kernel: `[..., d_in, d_out]` reference kernel; leading axes (stacked layers) are batched.
    k: protected rank, 1 ≤ k ≤ min(d_in, d_out) (paper: 8).

  Returns:
    `SubspaceBases(phi [..., d_out, k], psi [..., d_in, k])`, float32, orthonormal columns.

  Examples:
    >>> w = jnp.diag(jnp.array([3.0, 2.0, 1.0]))[:, :2]  # d_in = 3, d_out = 2
    >>> b = principal_bases(w, k=1)
    >>> jnp.abs(b.psi[:, 0]).tolist(), jnp.abs(b.phi[:, 0]).tolist()
    ([1.0, 0.0, 0.0], [1.0, 0.0])

  References:
    arXiv 2608.11674, "GCPO: Diagnosing and Constraining Subspace Geometry in Rollout RL for
    LLMs".
  """
  if kernel.ndim < 2:
    raise ValueError(f"kernel must be [..., d_in, d_out]; got shape {tuple(kernel.shape)}")
  d_in, d_out = kernel.shape[-2:]
  if not isinstance(k, (int, np.integer)) or not 1 <= k <= min(d_in, d_out):
    raise ValueError(f"k must be an integer in [1, min(d_in, d_out)] = [1, {min(d_in, d_out)}] "
                     f"for kernel {tuple(kernel.shape)}; got {k!r}")
  u, _, vt = jnp.linalg.svd(kernel.astype(jnp.float32), full_matrices=False)
  return SubspaceBases(phi=_mT(vt[..., :k, :]), psi=u[..., :, :k])


def _scale(a, b, alpha, rank, rank_scaled):
  if a.ndim < 2 or b.ndim < 2 or a.shape[-1] != b.shape[-2] or a.shape[:-2] != b.shape[:-2]:
    raise ValueError(f"LoRA factors must be a [..., d_in, r] and b [..., r, d_out] with the same "
                     f"leading axes; got a {tuple(a.shape)}, b {tuple(b.shape)}")
  r = a.shape[-1]
  if rank is not None and rank != r:
    raise ValueError(f"rank={rank} does not match the LoRA factors' inner dimension {r} "
                     f"(a {tuple(a.shape)}, b {tuple(b.shape)})")
  if r < 1:
    raise ValueError(f"rank must be ≥ 1; the LoRA factors have inner dimension {r}")
  return alpha / r if rank_scaled else alpha


def _projected(a, b, bases, mode):
  _check_bases(bases, a.shape[-2], b.shape[-1], "the LoRA factors")
  return SUBSPACE_CONSTRAINTS.get(mode)(a, b, bases)


@functools.partial(jax.jit, static_argnames=("rank", "mode", "rank_scaled"))
def gcpo_delta(
  a: jax.Array,
  b: jax.Array,
  bases: SubspaceBases,
  *,
  alpha: float = ALPHA,
  rank: int | None = None,
  mode: str = "bilateral",
  rank_scaled: bool = True,
) -> jax.Array:
  """The constrained update δK = s · (Π_Ψ^⊥ a)(b Π_Φ^⊥) (= δWᵀ of W_ref + s Π_Φ^⊥ L R Π_Ψ^⊥).

  With mode "bilateral", δK Φ_k = 0 and Ψ_kᵀ δK = 0 (Φ_kᵀ δW = 0, δW Ψ_k = 0) exactly, up to
  float rounding. Other modes: `SUBSPACE_CONSTRAINTS`.

  Args:
    a: `[..., d_in, r]` input-side LoRA factor (the paper's Rᵀ).
    b: `[..., r, d_out]` output-side LoRA factor (the paper's Lᵀ).
    bases: `SubspaceBases(phi [..., d_out, k], psi [..., d_in, k])` from `principal_bases`.
    alpha: LoRA α (paper: 16).
    rank: r; optional, checked against the factors' inner dimension (paper: 32).
    mode: a `SUBSPACE_CONSTRAINTS` name.
    rank_scaled: PROPOSAL (peft convention) True: s = α/r; False: s = α as the paper writes.

  Returns:
    δK `[..., d_in, d_out]` in the factors' dtype promotion with the bases (float32).

  Examples:
    >>> w = jax.random.normal(jax.random.key(0), (6, 5))
    >>> bases = principal_bases(w, k=2)
    >>> a, b = jnp.ones((6, 3)), jnp.ones((3, 5))
    >>> d = gcpo_delta(a, b, bases, alpha=3.0, rank=3)
    >>> bool(jnp.abs(d @ bases.phi).max() < 1e-5), bool(jnp.abs(bases.psi.T @ d).max() < 1e-5)
    (True, True)

  References:
    arXiv 2608.11674, "GCPO: Diagnosing and Constraining Subspace Geometry in Rollout RL for
    LLMs".
  """
  s = _scale(a, b, alpha, rank, rank_scaled)
  ap, bp = _projected(a, b, bases, mode)
  return s * (ap @ bp)


@functools.partial(jax.jit, static_argnames=("rank", "mode", "rank_scaled"))
def gcpo_linear(
  x: jax.Array,
  kernel: jax.Array,
  a: jax.Array,
  b: jax.Array,
  bases: SubspaceBases,
  *,
  alpha: float = ALPHA,
  rank: int | None = None,
  mode: str = "bilateral",
  rank_scaled: bool = True,
) -> jax.Array:
  """y = x (K + δK) = x K + s · ((x Π_Ψ^⊥ a)(b Π_Φ^⊥)), never forming δK or a d×d projector.

  The projections act on the factors, not on the activations: projecting a `[d_in, r]` and
  b `[r, d_out]` costs O(d·r·k) once per call, projecting x (the paper's sketch,
  x − (xΨ)Ψᵀ per token) costs O(tokens·d·k); both are exact.

  Args:
    x: `[..., d_in]` activations (any leading axes).
    kernel: `[d_in, d_out]` frozen reference kernel K = W_refᵀ.
    a, b, bases, alpha, rank, mode, rank_scaled: as in `gcpo_delta` (unbatched factors).

  Returns:
    `[..., d_out]`, equal to `x @ (kernel + gcpo_delta(a, b, bases, ...))`.

  Examples:
    >>> w = jax.random.normal(jax.random.key(0), (6, 5))
    >>> bases, a, b = principal_bases(w, k=2), jnp.ones((6, 3)), jnp.ones((3, 5))
    >>> x = jnp.ones((2, 4, 6))
    >>> y = gcpo_linear(x, w, a, b, bases, alpha=3.0)
    >>> bool(jnp.allclose(y, x @ (w + gcpo_delta(a, b, bases, alpha=3.0)), atol=1e-4))
    True

  References:
    arXiv 2608.11674, "GCPO: Diagnosing and Constraining Subspace Geometry in Rollout RL for
    LLMs".
  """
  if kernel.ndim != 2 or x.shape[-1] != kernel.shape[0]:
    raise ValueError(f"kernel must be [d_in, d_out] with d_in = x.shape[-1] = {x.shape[-1]}; "
                     f"got kernel {tuple(kernel.shape)}")
  if a.shape[-2:-1] != kernel.shape[:1] or b.shape[-1:] != kernel.shape[1:]:
    raise ValueError(f"LoRA factors must be a [d_in, r], b [r, d_out] for kernel "
                     f"{tuple(kernel.shape)}; got a {tuple(a.shape)}, b {tuple(b.shape)}")
  s = _scale(a, b, alpha, rank, rank_scaled)
  ap, bp = _projected(a, b, bases, mode)
  y = x @ kernel
  return y + (s * ((x @ ap.astype(x.dtype)) @ bp.astype(x.dtype))).astype(y.dtype)


@jax.jit
def four_block_energies(delta: jax.Array, bases: SubspaceBases) -> BlockEnergies:
  """Energies of the four-block split of a realised update δK = δWᵀ `[..., d_in, d_out]`.

  E_PP = ‖Π_Φ δW Π_Ψ‖², E_PO = ‖Π_Φ δW Π_Ψ^⊥‖², E_OP = ‖Π_Φ^⊥ δW Π_Ψ‖²,
  E_OO = ‖Π_Φ^⊥ δW Π_Ψ^⊥‖² (each block formed explicitly; they sum to ‖δW‖² because the blocks
  are mutually orthogonal). Computed in float32.

  Args:
    delta: `[..., d_in, d_out]` update in kernel layout (e.g. K_after − K_before).
    bases: `SubspaceBases(phi [..., d_out, k], psi [..., d_in, k])`.

  Returns:
    `BlockEnergies(pp, po, op, oo)`, each `[...]` (one value per stacked layer).

  Examples:
    >>> bases = principal_bases(jnp.diag(jnp.array([2.0, 1.0])), k=1)
    >>> e = four_block_energies(jnp.array([[1.0, 2.0], [3.0, 4.0]]), bases)
    >>> [float(v) for v in e]
    [1.0, 9.0, 4.0, 16.0]

  References:
    arXiv 2608.11674, "GCPO: Diagnosing and Constraining Subspace Geometry in Rollout RL for
    LLMs".
  """
  delta = jnp.asarray(delta, jnp.float32)
  if delta.ndim < 2:
    raise ValueError(f"delta must be [..., d_in, d_out]; got shape {tuple(delta.shape)}")
  _check_bases(bases, delta.shape[-2], delta.shape[-1], "delta")
  phi, psi = bases
  in_p, in_o = _in_par(delta, psi), _in_perp(delta, psi)  # Π_Ψ / Π_Ψ^⊥ applied (δWᵀ rows).

  def energy(m):
    return jnp.sum(jnp.square(m), axis=(-2, -1))

  return BlockEnergies(
    pp=energy(_out_par(in_p, phi)),
    po=energy(_out_par(in_o, phi)),
    op=energy(_out_perp(in_p, phi)),
    oo=energy(_out_perp(in_o, phi)),
  )


def overlap_null(d_in: int, d_out: int, k: int) -> float:
  """O_null = 1 − (d_out − k)(d_in − k)/(d_out d_in): E[O] of an isotropic random update.

  Examples:
    >>> overlap_null(4, 4, 2)
    0.75
  """
  return 1.0 - (d_out - k) * (d_in - k) / (d_out * d_in)


@jax.jit
def principal_overlap(delta: jax.Array, bases: SubspaceBases) -> Overlap:
  """Principal-subspace overlap O = (E_PP + E_PO + E_OP)/E_total = 1 − E_OO/E_total.

  O_excess = O − O_null with O_null = 1 − (d_out − k)(d_in − k)/(d_out d_in), and (PROPOSAL)
  O_normalised = O_excess/(1 − O_null), which is 0 for an isotropic update and 1 for an update
  entirely outside the OO block. An all-zero update has O = 0 (no update, no overlap), and its
  excess and normalised scores are then −O_null and −O_null/(1 − O_null).

  Args:
    delta: `[..., d_in, d_out]` update in kernel layout.
    bases: `SubspaceBases(phi [..., d_out, k], psi [..., d_in, k])`.

  Returns:
    `Overlap(overlap, excess, normalised)`, each `[...]`.

  Examples:
    >>> bases = principal_bases(jnp.diag(jnp.array([2.0, 1.0])), k=1)
    >>> o = principal_overlap(jnp.array([[1.0, 2.0], [3.0, 4.0]]), bases)
    >>> round(float(o.overlap), 4), round(float(o.excess), 4), round(float(o.normalised), 4)
    (0.4667, -0.2833, -1.1333)

  References:
    arXiv 2608.11674, "GCPO: Diagnosing and Constraining Subspace Geometry in Rollout RL for
    LLMs".
  """
  e = four_block_energies(delta, bases)
  total = e.pp + e.po + e.op + e.oo
  o = jnp.where(total > 0, 1.0 - e.oo / jnp.where(total > 0, total, 1.0), 0.0)
  d_in, d_out, k = delta.shape[-2], delta.shape[-1], bases.phi.shape[-1]
  null = overlap_null(d_in, d_out, k)
  excess = o - null
  normalised = excess / (1.0 - null) if null < 1.0 else jnp.zeros_like(o)
  return Overlap(overlap=o, excess=excess, normalised=normalised)


# ---------------------------------------------------------------------------------------------
# Parameter pytrees (plain nested dicts, e.g. `nnx.to_pure_dict(nnx.state(model, nnx.Param))`).
# ---------------------------------------------------------------------------------------------


def _key_name(entry) -> Any:
  for attr in ("key", "name", "idx"):
    if hasattr(entry, attr):
      return getattr(entry, attr)
  return entry


def _path(keypath) -> tuple:
  path = tuple(_key_name(e) for e in keypath)
  # An `nnx.State` leaf is a Variable: its array sits under a trailing "value" attribute.
  return path[:-1] if path and path[-1] == "value" else path


def default_layout(path: tuple, shape: tuple[int, ...]) -> tuple[int, int]:
  """(stacked_ndim, in_ndim) of a `CausalLM` kernel: how to view it as `[L..., d_in, d_out]`.

  Stacked layers (`("layers", "attn", ...)`, a `scan_layers` model) have one leading axis; an
  `o_proj` kernel `[heads, head_dim, embed]` has two input axes; every other kernel one
  (q/k/v `[embed, heads, head_dim]`, MLP `[d_in, d_out]`).
  """
  stacked = int(len(path) > 1 and path[0] == "layers" and isinstance(path[1], str))
  in_ndim = 2 if path and str(path[-1]).endswith("o_proj") else 1
  if len(shape) < stacked + in_ndim + 1:
    raise ValueError(f"{'/'.join(map(str, path))} of shape {shape} is not a kernel "
                     f"(stacked axes {stacked}, input axes {in_ndim})")
  return stacked, in_ndim


def _target_fn(targets) -> Callable[[tuple], bool]:
  if callable(targets):
    return targets
  if isinstance(targets, str) or not all(isinstance(t, str) for t in targets):
    raise ValueError(f"targets must be a predicate on the path tuple or a tuple of name "
                     f"substrings; got {targets!r}")
  names = tuple(targets)
  return lambda path: any(t in "/".join(map(str, path)) for t in names)


def _matrix_view(w, bases: SubspaceBases):
  """w `[L..., *in, *out]` -> `[L..., d_in, d_out]` using the bases' leading axes and d_in."""
  lead = bases.psi.shape[:-2]
  d_in, d_out = bases.psi.shape[-2], bases.phi.shape[-2]
  if tuple(w.shape[:len(lead)]) != tuple(lead) or math.prod(w.shape[len(lead):]) != d_in * d_out:
    raise ValueError(f"parameter of shape {tuple(w.shape)} does not match its bases "
                     f"(leading axes {lead}, d_in {d_in}, d_out {d_out})")
  return w.reshape(*lead, d_in, d_out)


def gcpo_init(
  params: Any,
  *,
  rng: jax.Array,
  targets: Callable[[tuple], bool] | tuple[str, ...] = DEFAULT_TARGETS,
  k: int = K,
  rank: int = RANK,
  layout: Callable[[tuple, tuple[int, ...]], tuple[int, int]] = default_layout,
  dtype: Any = jnp.float32,
  host_svd: bool = True,
) -> tuple[Any, Any]:
  """Frozen bases and trainable LoRA factors for the targeted kernels of a parameter pytree.

  For each targeted leaf, viewed as `[L..., d_in, d_out]` by `layout`, the bases are
  `principal_bases(view, k)` and the factors `LoraFactors(a, b)` with the peft LoRA init
  (PROPOSAL, "initialised as in LoRA"): a ~ U(−1/√d_in, 1/√d_in) (peft's Kaiming-uniform with
  a = √5), b = 0, so δW = 0 at the start and the first step's gradient reaches b.

  Args:
    params: nested dict of arrays (`nnx.to_pure_dict(nnx.state(model, nnx.Param))`).
    rng: PRNG key for the `a` factors.
    targets: a predicate on the path tuple (e.g. `("layers", 0, "attn", "q_proj")`) or a tuple
      of name substrings matched against the "/"-joined path (PROPOSAL default: every attention
      and MLP projection).
    k: protected rank (paper: 8); 1 ≤ k ≤ min(d_in, d_out) for every target.
    rank: LoRA rank r (paper: 32).
    layout: `(path, shape) -> (stacked_ndim, in_ndim)`; default: the project's `CausalLM`.
    dtype: dtype of the factors.
    host_svd: True: SVDs with NumPy on the host (`host_principal_bases`, no compilation);
      False: `principal_bases` on the default device (one compilation per kernel shape; faster
      for very large kernels on an accelerator).

  Returns:
    `(bases, adapters)`: pytrees with the structure of `params` holding `SubspaceBases` /
    `LoraFactors` at targeted leaves and None elsewhere (so `jax.tree.map(f, params, adapters,
    bases)` visits them together; optimizers skip the Nones).

  Examples:
    >>> params = {"mlp": {"up_proj": jnp.ones((4, 6)), "scale": jnp.ones(4)}}
    >>> bases, adapters = gcpo_init(params, rng=jax.random.key(0), k=2, rank=3)
    >>> adapters["mlp"]["up_proj"].a.shape, adapters["mlp"]["scale"] is None
    ((4, 3), True)

  References:
    arXiv 2608.11674, "GCPO: Diagnosing and Constraining Subspace Geometry in Rollout RL for
    LLMs".
  """
  if not isinstance(rank, (int, np.integer)) or rank < 1:
    raise ValueError(f"rank must be a positive integer; got {rank!r}")
  is_target = _target_fn(targets)
  leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
  views = {}  # leaf index -> (kernel, its matrix-view shape)
  for i, (keypath, w) in enumerate(leaves):
    path = _path(keypath)
    if not is_target(path):
      continue
    shape = tuple(w.shape)
    stacked, in_ndim = layout(path, shape)
    lead = shape[:stacked]
    d_in, d_out = math.prod(shape[stacked:stacked + in_ndim]), math.prod(shape[stacked + in_ndim:])
    if not 1 <= k <= min(d_in, d_out):
      raise ValueError(f"k must be in [1, min(d_in, d_out)] = [1, {min(d_in, d_out)}] for "
                       f"{'/'.join(map(str, path))} (matrix view [{d_in}, {d_out}]); got {k}")
    views[i] = (w, (*lead, d_in, d_out))
  bases_out, adapters_out = [None] * len(leaves), [None] * len(leaves)
  # One draw for all `a` factors, cut on the host (one small program, not one per shape).
  sizes = [math.prod(shape[:-1]) * rank for _, shape in views.values()]
  draws = np.asarray(jax.random.uniform(rng, (max(sum(sizes), 1),), jnp.float32, -1.0, 1.0))
  start = 0
  for (i, (w, shape)), size in zip(views.items(), sizes):
    *lead, d_in, d_out = shape
    if host_svd:
      bases_out[i] = host_principal_bases(np.reshape(np.asarray(w), shape), k)
    else:
      bases_out[i] = principal_bases(jnp.reshape(w, shape), k=k)
    a = draws[start:start + size].reshape(*lead, d_in, rank) / math.sqrt(d_in)
    start += size
    adapters_out[i] = LoraFactors(a=jnp.asarray(a, dtype),
                                  b=jnp.asarray(np.zeros((*lead, rank, d_out)), dtype))
  return treedef.unflatten(bases_out), treedef.unflatten(adapters_out)


def host_principal_bases(kernel: np.ndarray, k: int = K) -> SubspaceBases:
  """`principal_bases` on the host with NumPy (float64 SVD, float32 bases); no compilation.

  Examples:
    >>> b = host_principal_bases(np.diag([3.0, 2.0, 1.0])[:, :2], k=1)
    >>> np.abs(np.asarray(b.psi[:, 0])).tolist()
    [1.0, 0.0, 0.0]
  """
  kernel = np.asarray(kernel, np.float64)
  if kernel.ndim < 2:
    raise ValueError(f"kernel must be [..., d_in, d_out]; got shape {kernel.shape}")
  d_in, d_out = kernel.shape[-2:]
  if not isinstance(k, (int, np.integer)) or not 1 <= k <= min(d_in, d_out):
    raise ValueError(f"k must be an integer in [1, min(d_in, d_out)] = [1, {min(d_in, d_out)}] "
                     f"for kernel {kernel.shape}; got {k!r}")
  u, _, vt = np.linalg.svd(kernel, full_matrices=False)
  return SubspaceBases(phi=jnp.asarray(np.swapaxes(vt[..., :k, :], -1, -2), jnp.float32),
                       psi=jnp.asarray(u[..., :, :k], jnp.float32))


def _is_node(x) -> bool:
  return x is None or isinstance(x, (SubspaceBases, LoraFactors))


def gcpo_apply(
  params: Any,
  adapters: Any,
  bases: Any,
  *,
  alpha: float = ALPHA,
  rank: int | None = None,
  mode: str = "bilateral",
  rank_scaled: bool = True,
) -> Any:
  """params with W + δW on the adapted leaves (a merged forward; differentiable in `adapters`).

  Each adapted leaf becomes `w + reshape(gcpo_delta(a, b, bases, ...))` in `w`'s dtype; other
  leaves pass through. Jittable (wrap it in the caller's `jax.jit` / loss function).

  Args:
    params: nested dict of arrays (the frozen reference).
    adapters, bases: the pytrees from `gcpo_init` (None at untargeted leaves).
    alpha, rank, mode, rank_scaled: as in `gcpo_delta`.

  Returns:
    A pytree like `params`.

  Examples:
    >>> params = {"mlp": {"up_proj": jnp.ones((4, 6)), "scale": jnp.ones(4)}}
    >>> bases, adapters = gcpo_init(params, rng=jax.random.key(0), k=2, rank=3)
    >>> out = gcpo_apply(params, adapters, bases)  # b = 0 at init: unchanged
    >>> bool((out["mlp"]["up_proj"] == params["mlp"]["up_proj"]).all())
    True
  """

  def merge(w, ad, bs):
    if ad is None:
      return w
    if bs is None:
      raise ValueError("bases must hold SubspaceBases wherever adapters holds LoraFactors")
    view = _matrix_view(w, bs)
    d = gcpo_delta(ad.a, ad.b, bs, alpha=alpha, rank=rank, mode=mode, rank_scaled=rank_scaled)
    return (view + d.astype(w.dtype)).reshape(w.shape)

  return jax.tree.map(merge, params, adapters, bases, is_leaf=_is_node)


def update_overlap(params_before: Any, params_after: Any, bases: Any) -> Any:
  """Per-leaf `principal_overlap` of the realised update params_after − params_before.

  Args:
    params_before, params_after: nested dicts of arrays with the same structure.
    bases: the bases pytree from `gcpo_init` (None at unmonitored leaves).

  Returns:
    A pytree like `params` with an `Overlap` (each field `[L...]`, per stacked layer) at the
    leaves that have bases and None elsewhere.
  """

  def one(before, after, bs):
    if bs is None:
      return None
    delta = after.astype(jnp.float32) - before.astype(jnp.float32)
    return principal_overlap(_matrix_view(delta, bs), bs)

  return jax.tree.map(one, params_before, params_after, bases, is_leaf=_is_node)


# ---------------------------------------------------------------------------------------------
# The constraint as an optimizer transformation (full-rank updates).
# ---------------------------------------------------------------------------------------------


class ProjectionState(NamedTuple):
  """`gcpo_projection`'s state: the frozen bases of the reference kernels (None elsewhere)."""

  bases: Any


def project_update(u: jax.Array, bases: SubspaceBases, mode: str = "bilateral") -> jax.Array:
  """One kernel's update `[L..., d_in, d_out]` restricted as `mode` says, in kernel layout.

  bilateral  Π_Ψ^⊥ u Π_Φ^⊥ (the OO block: in W terms Φ_kᵀ δW = 0 and δW Ψ_k = 0)
  left       u Π_Φ^⊥ (output side only);  right  Π_Ψ^⊥ u (input side only)
  principal  Π_Ψ u Π_Φ (all of it inside the principal block; ablation)
  none       u
  """
  if mode == "bilateral":
    return _out_perp(_in_perp(u, bases.psi), bases.phi)
  if mode == "left":
    return _out_perp(u, bases.phi)
  if mode == "right":
    return _in_perp(u, bases.psi)
  if mode == "principal":
    return _out_par(_in_par(u, bases.psi), bases.phi)
  if mode == "none":
    return u
  raise ValueError(f"unknown mode {mode!r}; valid: {', '.join(SUBSPACE_CONSTRAINTS.names())}")


def gcpo_projection(
  *,
  k: int = K,
  targets: Callable[[tuple], bool] | tuple[str, ...] = DEFAULT_TARGETS,
  mode: str = "bilateral",
  layout: Callable[[tuple, tuple[int, ...]], tuple[int, int]] = default_layout,
) -> optax.GradientTransformation:
  """GCPO's constraint on every update of the targeted kernels, as the last optimizer stage.

  `init(params)` takes the SVD of each targeted kernel of the *starting* parameters (W_ref) and
  keeps its top-k bases (Φ_k, Ψ_k) in the optimizer state (frozen, checkpointed with it);
  `update` replaces each targeted update u by `project_update(u, bases, mode)`. With
  "bilateral", every update, and so the whole displacement W − W_ref, stays in the OO block:
  Φ_kᵀ (W − W_ref) = 0 and (W − W_ref) Ψ_k = 0 up to float rounding, the paper's constraint.

  Deviation from the paper (arXiv 2608.11674), which trains rank-r LoRA factors L, R with
  W = W_ref + α Π_Φ^⊥ L R Π_Ψ^⊥: here the update is full-rank inside the same subspace (the
  project has no LoRA path yet). The constraint, and so the geometry the paper argues about,
  is the same; the parameter count and the optimizer's memory are not.

  Args:
    k: protected rank (paper: 8).
    targets: which kernels (path predicate or name substrings; default every projection).
    mode: an entry of `SUBSPACE_CONSTRAINTS` (the paper's ablations).
    layout: how a kernel is viewed as `[L..., d_in, d_out]` (default: `CausalLM`'s).

  Returns:
    An `optax.GradientTransformation` (chain it after the optimizer).
  """
  if mode not in SUBSPACE_CONSTRAINTS:
    raise ValueError(f"unknown mode {mode!r}; valid: {', '.join(SUBSPACE_CONSTRAINTS.names())}")
  is_target = _target_fn(targets)

  def views(tree):
    out = []
    for keypath, w in jax.tree_util.tree_flatten_with_path(tree)[0]:
      path = _path(keypath)
      if not is_target(path):
        out.append(None)
        continue
      stacked, in_ndim = layout(path, tuple(w.shape))
      lead = tuple(w.shape[:stacked])
      d_in = math.prod(w.shape[stacked:stacked + in_ndim])
      out.append((*lead, d_in, math.prod(w.shape[stacked + in_ndim:])))
    return out

  def init(params):
    leaves, treedef = jax.tree_util.tree_flatten(params)
    bases = []
    for w, shape in zip(leaves, views(params), strict=True):
      if shape is None:
        bases.append(None)
        continue
      if not 1 <= k <= min(shape[-2:]):
        raise ValueError(f"k must be in [1, {min(shape[-2:])}] for a kernel viewed as "
                         f"{shape}; got {k}")
      bases.append(principal_bases(jnp.reshape(w, shape).astype(jnp.float32), k=k))
    return ProjectionState(treedef.unflatten(bases))

  def update(updates, state, params=None):
    del params
    leaves, treedef = jax.tree_util.tree_flatten(updates)
    bases = treedef.flatten_up_to(state.bases)
    out = []
    for u, bs in zip(leaves, bases, strict=True):
      if bs is None:
        out.append(u)
        continue
      view = _matrix_view(u, bs).astype(jnp.float32)
      out.append(project_update(view, bs, mode).reshape(u.shape).astype(u.dtype))
    return treedef.unflatten(out), state

  return optax.GradientTransformation(init, update)
