r"""How the toy crystals' polymorphs (jaxrl_post/tasks/toy_crystals.py) were found.

  python scripts/crystal_grpo_polymorphs.py --species=0,0,1,1 --starts=64

Relaxes `--starts` random cells (F uniform, a, b ∈ [1, 2.5], γ ∈ [57°, 120°]) of the given
species with Adam (lr 5e-3, `--iters` steps) on `toy_crystals.lj_energy` over (F, log a, log b, γ),
keeps the converged ones (gradient norm < 1e-3), groups them by energy (3 decimals) and prints
one JSON line per distinct minimum: its energy per atom, how many starts reached it, and one
representative with a ≤ b and γ ≤ 90° where one exists, shifted so atom 0 sits at (0.5, 0.5).
The module's constants are these representatives, shifted away from the cell border.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import flags

from jaxrl_post import script_flags
from jaxrl_post.tasks import toy_crystals as tc

FLAGS = flags.FlagValues()
_SPECIES = flags.DEFINE_string("species", "0,0,1,1", "Species per atom (0 = A, 1 = B).",
                               flag_values=FLAGS)
_STARTS = flags.DEFINE_integer("starts", 64, "Random starting cells.", flag_values=FLAGS)
_ITERS = flags.DEFINE_integer("iters", 6000, "Adam steps.", flag_values=FLAGS)
_SEED = flags.DEFINE_integer("seed", 1, "Seed of the starting cells.", flag_values=FLAGS)


def relax_all(species: tuple, frac: np.ndarray, lat: np.ndarray, iters: int):
  """`(frac [S, N, 2], lat [S, 3], energy [S], grad_norm [S])` after Adam on each start."""
  opt = optax.adam(5e-3)

  def energy(p):
    f, ll = p
    return tc.lj_energy(f, jnp.concatenate([jnp.exp(ll[:2]), ll[2:]]), species)

  def one(f, lat):
    p = (f, jnp.concatenate([jnp.log(lat[:2]), lat[2:]]))

    def body(_, carry):
      p, st = carry
      updates, st = opt.update(jax.grad(energy)(p), st, p)
      f, ll = optax.apply_updates(p, updates)
      return (jnp.mod(f, 1.0), ll.at[2].set(jnp.clip(ll[2], 0.6, np.pi - 0.6))), st

    p, _ = jax.lax.fori_loop(0, iters, body, (p, opt.init(p)))
    g = jax.grad(energy)(p)
    norm = jnp.sqrt(jnp.sum(jnp.square(g[0])) + jnp.sum(jnp.square(g[1])))
    return p[0], jnp.concatenate([jnp.exp(p[1][:2]), p[1][2:]]), energy(p), norm

  return jax.jit(jax.vmap(one))(frac, lat)


def main(argv) -> None:
  del argv
  species = tuple(int(s) for s in _SPECIES.value.split(","))
  rng = np.random.default_rng(_SEED.value)
  s, n = _STARTS.value, len(species)
  frac0 = rng.uniform(size=(s, n, 2)).astype(np.float32)
  lat0 = np.stack([rng.uniform(1.0, 2.5, s), rng.uniform(1.0, 2.5, s), rng.uniform(1.0, 2.1, s)],
                  1).astype(np.float32)
  frac, lat, e, g = map(np.asarray, relax_all(species, frac0, lat0, _ITERS.value))
  ok = g < 1e-3
  for level in sorted(set(np.round(e[ok], 3))):
    idx = np.flatnonzero(ok & (np.abs(e - level) < 2e-3))
    a, b, gamma = lat[idx, 0], lat[idx, 1], lat[idx, 2]
    badness = 10 * (a > b + 1e-3) + 5 * (gamma > np.pi / 2 + 1e-3) + np.abs(b * np.cos(gamma)) / a
    i = idx[int(np.argmin(badness))]
    f = np.mod(frac[i] - frac[i][0] + 0.5, 1.0)
    print(json.dumps({"energy_per_atom": round(float(e[i]), 4), "starts": int(len(idx)),
                      "a": round(float(lat[i, 0]), 5), "b": round(float(lat[i, 1]), 5),
                      "gamma_deg": round(float(np.rad2deg(lat[i, 2])), 4),
                      "frac": np.round(f, 4).tolist()}), flush=True)


if __name__ == "__main__":
  script_flags.run(main, FLAGS)
