"""Toy crystals: CrystalGRPO's synthetic analogue (arXiv 2608.06582; PROPOSAL).

A structure is a 2-D periodic cell with lattice `(a, b, γ)` (lattice vectors `a₁ = (a, 0)`,
`a₂ = (b cos γ, b sin γ)`, area `V = a·b·sin γ`) and N atoms of two species A, B at fractional
coordinates `F ∈ [0, 1)^{N×2}` (a torus). Atom types are fixed by the composition
(`COMPOSITIONS`; species sorted, A first). One composition is registered, "A2B2" (N = 4): the
code takes any N, but with these potentials the 3-atom cells' minima (A2B1: E/atom −3.319,
−3.158, −3.039) match each other within the default tolerances, so they are not distinct
polymorphs under the matcher, and AB has a single minimum.

Energy (per atom): pairwise Lennard-Jones over periodic images,

  E = 1/(2N) Σ_{i,j} Σ_{n ∈ {−K..K}²} φ_ij(|(F_j − F_i + n)·M|),   (i, j, n) ≠ (i, i, 0)
  φ(r) = 4ε[(σ/r)¹² − (σ/r)⁶] − φ_c   for r ≥ r_s, shifted to 0 at r_c = 2.5σ (0 beyond),
  φ(r) = φ(r_s) + φ'(r_s)(r − r_s)     for r < r_s = 0.85σ (soft core: finite, still repulsive)

with `M` the lattice matrix (rows a₁, a₂), σ, ε per species pair (`SIGMA`, `EPSILON`: A larger,
A–B bonds strongest) and K = 3 image shells. These are config-free task constants (PROPOSAL: the
paper scores energies with MACE; a closed-form potential stands in).

Polymorphs: per composition, three local minima of E over (F, a, b, γ) (found by relaxing 64
random cells with Adam, scripts/crystal_grpo_polymorphs.py; the three distinct minima, cells
with a ≤ b and γ ≤ 90°, shifted away from the cell border), listed in increasing energy. A
run's *target* (`target` index) need not be the lowest-energy one.

Matcher (a StructureMatcher analogue; PROPOSAL): a sample matches a reference when the lattices
agree (|a'/a − 1| ≤ ltol, |b'/b − 1| ≤ ltol, |γ' − γ| ≤ angle_tol) and the site RMS

  rms = min_{π, s} sqrt(mean_i |wrap(F'_{π(i)} − F_i − s)·M|²) / sqrt(V/N)

over species-preserving permutations π and origin shifts s (the shift aligning one atom, then
one least-squares refinement), normalised by (V/N)^{1/2} (2-D; pymatgen's (V/N)^{1/3} in 3-D),
is ≤ stol. Defaults are pymatgen's CSP-benchmark settings: ltol 0.3, stol 0.5, angle_tol 10°.
Not modelled: lattice re-reduction of the sample, rotations / reflections (the toy's cells are
generated in one orientation).

Reward (§8.2): R = w_match·R_match + w_E·R_E,
  R_match = 1[match target]·(1 − rms/rms_max),   R_E = −clip((E − E_ref)/τ_E, −1, 1),
E_ref the target polymorph's energy per atom; w_match, w_E, τ_E, rms_max (default stol) config
values (PROPOSAL: the paper's weights were not found). `w_match = 0, w_E = 1` is the energy-only
reward.

Flow latent: `x = [F (2N values), (log a, log b, γ) standardised]` `[batch, 2N + 3]`; the F
block is periodic with period 1 (`crystal_wrap`), the lattice block is not.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_post.registry import Registry
from jaxrl_post.sampling import flow_sde

SIGMA = np.array([[1.0, 0.85], [0.85, 0.7]], np.float32)  # σ_AA, σ_AB; σ_BA, σ_BB
EPSILON = np.array([[1.0, 1.3], [1.3, 0.6]], np.float32)
CUTOFF = 2.5  # r_c / σ
SOFT_CORE = 0.85  # r_s / σ
IMAGE_SHELLS = 3  # K
_IMAGES = np.array(list(itertools.product(range(-IMAGE_SHELLS, IMAGE_SHELLS + 1), repeat=2)),
                   np.float32)


class Polymorph(NamedTuple):
  frac: tuple  # N × (f1, f2)
  lattice: tuple  # (a, b, γ in degrees)


class Composition(NamedTuple):
  """`species` `[N]` (0 = A, 1 = B) and three polymorphs in increasing energy."""

  name: str
  species: tuple
  polymorphs: tuple


COMPOSITIONS: Registry = Registry("toy_composition")
COMPOSITIONS.add("A2B2", Composition("A2B2", (0, 0, 1, 1), (
  Polymorph(((0.2, 0.2), (0.7993, 0.7993), (0.6693, 0.3299), (0.3299, 0.6693)),
            (1.82757, 1.82757, 75.3417)),
  Polymorph(((0.62, 0.62), (0.62, 0.12), (0.12, 0.37), (0.12, 0.87)), (1.53058, 2.21722, 90.0)),
  Polymorph(((0.68, 0.82), (0.18, 0.1706), (0.18, 0.56), (0.68, 0.4306)),
            (1.38249, 2.45053, 90.0)),
)))


# ---- Lattice and energy ----------------------------------------------------------------------


def lattice_matrix(lattice: jax.Array) -> jax.Array:
  """`[..., 3]` (a, b, γ radians) → `[..., 2, 2]` rows a₁ = (a, 0), a₂ = (b cos γ, b sin γ)."""
  a, b, g = lattice[..., 0], lattice[..., 1], lattice[..., 2]
  zero = jnp.zeros_like(a)
  return jnp.stack([jnp.stack([a, zero], -1), jnp.stack([b * jnp.cos(g), b * jnp.sin(g)], -1)],
                   -2)


def cell_area(lattice: jax.Array) -> jax.Array:
  """V = a·b·sin γ, `[..., 3] → [...]`."""
  return lattice[..., 0] * lattice[..., 1] * jnp.sin(lattice[..., 2])


def _pair_energy(r: jax.Array, sigma: jax.Array, eps: jax.Array) -> jax.Array:
  def lj(r):
    x6 = (sigma / r) ** 6
    return 4.0 * eps * (x6 * x6 - x6)

  def dlj(r):
    x6 = (sigma / r) ** 6
    return 4.0 * eps * (-12.0 * x6 * x6 + 6.0 * x6) / r

  rs = SOFT_CORE * sigma
  xc = CUTOFF ** -6.0
  shift = 4.0 * eps * (xc * xc - xc)
  val = jnp.where(r < rs, lj(rs) + dlj(rs) * (r - rs), lj(jnp.maximum(r, rs))) - shift
  return jnp.where(r < CUTOFF * sigma, val, 0.0)


def lj_energy(frac: jax.Array, lattice: jax.Array, species) -> jax.Array:
  """Energy per atom of one structure (module docstring): `frac` `[N, 2]`, `lattice` `[3]`
  (a, b, γ radians), `species` `[N]` static ints. Returns a scalar.

  Examples:
    >>> comp = COMPOSITIONS.get("A2B2")
    >>> f, l = polymorph_arrays(comp)
    >>> round(float(lj_energy(f[0], l[0], comp.species)), 2)
    -3.64
  """
  species = np.asarray(species)
  n = species.shape[0]
  m = lattice_matrix(lattice)
  d = frac[None, :, None, :] - frac[:, None, None, :] + _IMAGES[None, None]  # [N, N, I, 2]
  r2 = jnp.sum(jnp.square(d @ m), axis=-1)
  is_self = np.eye(n, dtype=bool)[:, :, None] & np.all(_IMAGES == 0, -1)[None, None]
  sigma = SIGMA[species][:, species][:, :, None]
  eps = EPSILON[species][:, species][:, :, None]
  r = jnp.sqrt(jnp.where(is_self, 100.0, r2))
  pair = jnp.where(is_self, 0.0, _pair_energy(r, sigma, eps))
  return 0.5 * jnp.sum(pair) / n


@functools.partial(jax.jit, static_argnums=2)
def energies(frac: jax.Array, lattice: jax.Array, species: tuple) -> jax.Array:
  """`[B, N, 2]`, `[B, 3]` → `[B]` energies per atom (`species` a tuple: static)."""
  return jax.vmap(lambda f, l: lj_energy(f, l, species))(frac, lattice)


def polymorph_arrays(comp: Composition) -> tuple[np.ndarray, np.ndarray]:
  """`(frac [K, N, 2], lattice [K, 3] with γ in radians)` of the composition's polymorphs."""
  frac = np.array([p.frac for p in comp.polymorphs], np.float32)
  lat = np.array([p.lattice for p in comp.polymorphs], np.float32)
  lat[:, 2] = np.deg2rad(lat[:, 2])
  return frac, lat


@functools.cache
def polymorph_energies(name: str) -> np.ndarray:
  """`[K]` energies per atom of the composition's polymorphs (increasing)."""
  comp = COMPOSITIONS.get(name)
  frac, lat = polymorph_arrays(comp)
  with jax.ensure_compile_time_eval():  # concrete also when first called inside a jit trace
    return np.asarray(energies(jnp.asarray(frac), jnp.asarray(lat), comp.species), np.float32)


# ---- Matcher and reward ----------------------------------------------------------------------


def species_permutations(species) -> np.ndarray:
  """`[P, N]` all permutations of atom indices that keep every atom's species.

  Examples:
    >>> species_permutations((0, 0, 1)).tolist()
    [[0, 1, 2], [1, 0, 2]]
  """
  species = tuple(int(s) for s in species)
  perms = [p for p in itertools.permutations(range(len(species)))
           if all(species[i] == species[j] for i, j in zip(p, range(len(species))))]
  return np.array(perms, np.int32)


def _wrap(d):
  return d - jnp.round(d)


def site_rms(frac: jax.Array, ref_frac: jax.Array, ref_lattice: jax.Array,
             perms: np.ndarray) -> jax.Array:
  """Normalised periodic site RMS of one structure to one reference (module docstring).

  `frac`, `ref_frac` `[N, 2]`, `ref_lattice` `[3]` (distances in the reference's metric),
  `perms` `[P, N]`. Returns the min over permutations and origin shifts, a scalar.
  """
  n = frac.shape[0]
  m = lattice_matrix(ref_lattice)
  norm = jnp.sqrt(cell_area(ref_lattice) / n)

  def one(perm, anchor):
    delta = _wrap(frac[perm] - ref_frac)  # [N, 2]
    shift = delta[anchor]
    shift = shift + jnp.mean(_wrap(delta - shift), axis=0)  # least-squares refinement
    res = _wrap(delta - shift) @ m
    return jnp.sqrt(jnp.mean(jnp.sum(jnp.square(res), -1)))

  perm_idx = jnp.repeat(jnp.asarray(perms), n, axis=0)
  anchors = jnp.tile(jnp.arange(n), perms.shape[0])
  return jnp.min(jax.vmap(one)(perm_idx, anchors)) / norm


def lattice_close(lattice: jax.Array, ref_lattice: jax.Array, *, ltol: float,
                  angle_tol: float) -> jax.Array:
  """|a'/a − 1| ≤ ltol, |b'/b − 1| ≤ ltol and |γ' − γ| ≤ angle_tol (degrees); `[..., 3]`."""
  rel = jnp.abs(lattice[..., :2] / ref_lattice[..., :2] - 1.0)
  ang = jnp.abs(jnp.rad2deg(lattice[..., 2] - ref_lattice[..., 2]))
  return jnp.all(rel <= ltol, axis=-1) & (ang <= angle_tol)


@dataclasses.dataclass(frozen=True)
class CrystalTask:
  """A composition, its target polymorph and the reward's config values (hashable: static).

  composition: a `COMPOSITIONS` name. target: index of the target polymorph.
  ltol, stol, angle_tol: the matcher's tolerances (pymatgen's 0.3, 0.5, 10°).
  rms_max: R_match's normaliser (default stol). w_match, w_energy, tau_energy: R's weights and
  τ_E (PROPOSAL). jitter_frac, jitter_lattice: std of the thermal noise of the pretraining
  samples (fractional units; log-length / radians).
  """

  composition: str = "A2B2"
  target: int = 1
  ltol: float = 0.3
  stol: float = 0.5
  angle_tol: float = 10.0
  rms_max: float | None = None
  w_match: float = 1.0
  w_energy: float = 0.1
  tau_energy: float = 1.0
  jitter_frac: float = 0.01
  jitter_lattice: float = 0.01

  def __post_init__(self):
    comp = COMPOSITIONS.get(self.composition)  # unknown names list the valid ones
    k = len(comp.polymorphs)
    if not 0 <= self.target < k:
      raise ValueError(f"target={self.target} must be a polymorph index in [0, {k}) for "
                       f"composition {self.composition!r}")
    for name in ("ltol", "stol", "angle_tol", "tau_energy"):
      if not getattr(self, name) > 0:
        raise ValueError(f"{name}={getattr(self, name)} must be > 0")
    if self.rms_max is not None and not self.rms_max > 0:
      raise ValueError(f"rms_max={self.rms_max} must be > 0")

  @property
  def comp(self) -> Composition:
    return COMPOSITIONS.get(self.composition)

  @property
  def num_atoms(self) -> int:
    return len(self.comp.species)

  @property
  def num_polymorphs(self) -> int:
    return len(self.comp.polymorphs)

  @property
  def dim(self) -> int:
    return 2 * self.num_atoms + 3


class Scores(NamedTuple):
  """Per-sample scores of `score`; `[B]` unless noted."""

  reward: jax.Array  # R = w_match·R_match + w_E·R_E
  r_match: jax.Array
  r_energy: jax.Array
  energy: jax.Array  # per atom
  matched: jax.Array  # [B, K] bool: matches polymorph k
  rms: jax.Array  # [B, K] normalised site RMS to polymorph k (inf where the lattice fails)
  basin: jax.Array  # int: the matched polymorph of least RMS, −1 when none


@functools.partial(jax.jit, static_argnums=0)
def score(task: CrystalTask, frac: jax.Array, lattice: jax.Array) -> Scores:
  """Matches `[B, N, 2]`, `[B, 3]` (γ radians) samples to every polymorph and rewards them."""
  comp = task.comp
  ref_frac, ref_lat = polymorph_arrays(comp)
  perms = species_permutations(comp.species)

  def per_sample(f, lat):
    rms = jax.vmap(lambda rf, rl: site_rms(f, rf, rl, perms))(jnp.asarray(ref_frac),
                                                               jnp.asarray(ref_lat))
    close = lattice_close(lat[None], jnp.asarray(ref_lat), ltol=task.ltol,
                          angle_tol=task.angle_tol)
    rms = jnp.where(close, rms, jnp.inf)
    return rms <= task.stol, rms

  matched, rms = jax.vmap(per_sample)(frac, lattice)
  rms_max = task.rms_max if task.rms_max is not None else task.stol
  hit = matched[:, task.target]
  r_match = jnp.where(hit, 1.0 - jnp.where(hit, rms[:, task.target], 0.0) / rms_max, 0.0)
  energy = energies(frac, lattice, comp.species)
  e_ref = polymorph_energies(task.composition)[task.target]
  r_energy = -jnp.clip((energy - e_ref) / task.tau_energy, -1.0, 1.0)
  best = jnp.argmin(jnp.where(matched, rms, jnp.inf), axis=1)
  basin = jnp.where(jnp.any(matched, axis=1), best, -1).astype(jnp.int32)
  reward = task.w_match * r_match + task.w_energy * r_energy
  return Scores(reward, r_match, r_energy, energy, matched, rms, basin)


# ---- Flow latent -----------------------------------------------------------------------------

GAMMA_RANGE = (math.radians(30.0), math.radians(150.0))  # decoded γ is clipped into this
LOG_LENGTH_RANGE = (math.log(0.5), math.log(5.0))
LATTICE_SCALE = 0.2  # std of the standardised lattice block (log-lengths, radians)


def lattice_center(task: CrystalTask) -> np.ndarray:
  """`[3]` mean of (log a, log b, γ) over the polymorphs: the lattice block's origin."""
  _, lat = polymorph_arrays(task.comp)
  return np.mean(np.stack([np.log(lat[:, 0]), np.log(lat[:, 1]), lat[:, 2]], -1), 0)


def encode(task: CrystalTask, frac: jax.Array, lattice: jax.Array) -> jax.Array:
  """`[B, N, 2]`, `[B, 3]` → latent `[B, 2N + 3]` (F, then standardised (log a, log b, γ))."""
  lat = jnp.stack([jnp.log(lattice[:, 0]), jnp.log(lattice[:, 1]), lattice[:, 2]], -1)
  lat = (lat - lattice_center(task)) / LATTICE_SCALE
  return jnp.concatenate([frac.reshape(frac.shape[0], -1), lat], axis=-1)


def decode(task: CrystalTask, x: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Latent `[B, 2N + 3]` → `(frac [B, N, 2] in [0, 1), lattice [B, 3])`, lengths and γ clipped
  into `LOG_LENGTH_RANGE` / `GAMMA_RANGE` (finite energies for any sample)."""
  n = task.num_atoms
  frac = jnp.mod(x[:, :2 * n], 1.0).reshape(x.shape[0], n, 2)
  lat = x[:, 2 * n:] * LATTICE_SCALE + lattice_center(task)
  lengths = jnp.exp(jnp.clip(lat[:, :2], *LOG_LENGTH_RANGE))
  gamma = jnp.clip(lat[:, 2:], *GAMMA_RANGE)
  return frac, jnp.concatenate([lengths, gamma], -1)


def periods(task: CrystalTask) -> np.ndarray:
  """`[2N + 3]`: 1 on the fractional coordinates (torus), 0 on the lattice block."""
  return np.concatenate([np.ones(2 * task.num_atoms), np.zeros(3)]).astype(np.float32)


def crystal_wrap(task: CrystalTask) -> flow_sde.Wrap:
  """The latent's `flow_sde.Wrap` (F mod 1, minimum-image displacements; lattice untouched)."""
  return flow_sde.periodic_wrap(periods(task))


def noise_levels(task: CrystalTask, a_frac: float, a_lattice: float) -> np.ndarray:
  """`[2N + 3]` per-coordinate SDE noise level: a_F on F, a_L on the lattice block."""
  p = periods(task)
  return np.where(p > 0, a_frac, a_lattice).astype(np.float32)


@functools.partial(jax.jit, static_argnums=(0, 2))
def sample_polymorphs(task: CrystalTask, key: jax.Array, n: int,
                      weights: np.ndarray | None = None) -> tuple[jax.Array, jax.Array]:
  """`n` pretraining latents `[n, 2N + 3]` and their polymorph ids `[n]`: a polymorph drawn with
  `weights` (default uniform), plus Gaussian jitter (`jitter_frac` on F, wrapped;
  `jitter_lattice` on the standardised-lattice block's log-lengths / γ)."""
  frac, lat = polymorph_arrays(task.comp)
  x_ref = encode(task, jnp.asarray(frac), jnp.asarray(lat))  # [K, D]
  k1, k2 = jax.random.split(key)
  k = x_ref.shape[0]
  logits = jnp.log(jnp.full((k,), 1.0 / k) if weights is None else jnp.asarray(weights))
  ids = jax.random.categorical(k1, logits, shape=(n,))
  scale = jnp.where(periods(task) > 0, task.jitter_frac, task.jitter_lattice / LATTICE_SCALE)
  x = x_ref[ids] + scale * jax.random.normal(k2, (n, task.dim))
  return crystal_wrap(task).position(x), ids
