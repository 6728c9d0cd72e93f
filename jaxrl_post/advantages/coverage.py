"""Coverage-aware group advantages (CrystalGRPO's C mode, arXiv 2608.06582; PROPOSAL).

A group of G samples answers one prompt (a composition). Besides each sample's reward R_i, the
group as a whole *covers* the targets: finite-budget Top-N recovery needs some member to match,
not every member. CrystalGRPO credits a member with its marginal coverage (the paper's formula
was not found; this is our PROPOSAL), leave-one-out:

  R^cov_i = Cov(G) − Cov(G \\ {i})

with one of two coverage functions (`COVERAGES`):

  "max_match"  Cov(G) = max_j R_match_j (Cov(∅) = `empty`, 0): only a *unique* maximum gets
               credit, max − second max; tied maxima get 0 (removing one leaves the max).
  "basins"     Cov(G) = number of distinct basins (matched polymorphs, ids ≥ 0) in G: a member
               gets 1 when it is the only one of its group in its basin, else 0.

Duplicates are down-weighted by dividing a reward by its cluster size c_i, the number of group
members in i's cluster (i included; cluster −1 = unclustered, size 1). The advantage is the
group z-score (`advantages.outcome.group_advantages`)

  A_i = (u_i − mean_g u) / (std_g u + ε),   u_i = R_i / c_i + η·R^cov_i   (`coverage_advantages`)

All functions take `[B]` arrays and integer `group_ids` `[B]` in [0, num_groups) (rows of a group
anywhere in the batch; segment reductions with a static segment count, so they jit and give the
same result when the batch is sharded).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jaxrl_post.advantages.outcome import group_advantages
from jaxrl_post.registry import Registry

COVERAGES: Registry = Registry("coverage")


def _num(num_groups, batch):
  return batch if num_groups is None else int(num_groups)


@functools.partial(jax.jit, static_argnames=("num_groups", "empty"))
def loo_max_coverage(r_match: jax.Array, group_ids: jax.Array, *, num_groups: int | None = None,
                     empty: float = 0.0) -> jax.Array:
  """R^cov_i = max_{j∈g} R_j − max_{j∈g, j≠i} R_j (the max over ∅ is `empty`).

  Args:
    r_match: `[B]` match scores.
    group_ids: `[B]` int group of each row.
    num_groups: static segment count (default B).
    empty: Cov(∅), for a group of one.

  Returns:
    `[B]` float32, non-zero only at a group's unique maximum.

  Examples:
    >>> r = jnp.array([0.0, 0.7, 0.2, 0.5, 0.5, 0.1])
    >>> [round(x, 4) for x in loo_max_coverage(r, jnp.array([0, 0, 0, 1, 1, 1])).tolist()]
    [0.0, 0.5, 0.0, 0.0, 0.0, 0.0]
  """
  r = jnp.asarray(r_match, jnp.float32)
  ids = jnp.asarray(group_ids, jnp.int32)
  n = _num(num_groups, r.shape[0])
  top = jax.ops.segment_max(r, ids, n)[ids]
  is_top = r == top
  ties = jax.ops.segment_sum(is_top.astype(jnp.int32), ids, n)[ids]
  second = jax.ops.segment_max(jnp.where(is_top, -jnp.inf, r), ids, n)[ids]
  second = jnp.where(jnp.isfinite(second), second, empty)
  without = jnp.where(ties > 1, top, second)
  return jnp.where(is_top, top - without, 0.0)


@functools.partial(jax.jit, static_argnames=("num_clusters", "num_groups"))
def cluster_sizes(cluster_ids: jax.Array, group_ids: jax.Array, *, num_clusters: int,
                  num_groups: int | None = None) -> jax.Array:
  """c_i: members of i's group in i's cluster (i included); 1 where `cluster_ids` < 0.

  Examples:
    >>> cluster_sizes(jnp.array([2, 2, -1, 0, 2, 2]), jnp.array([0, 0, 0, 0, 1, 1]),
    ...               num_clusters=3).tolist()
    [2.0, 2.0, 1.0, 1.0, 2.0, 2.0]
  """
  if num_clusters < 1:
    raise ValueError(f"num_clusters={num_clusters} must be >= 1")
  c = jnp.asarray(cluster_ids, jnp.int32)
  ids = jnp.asarray(group_ids, jnp.int32)
  n = _num(num_groups, c.shape[0])
  valid = c >= 0
  seg = ids * num_clusters + jnp.clip(c, 0, num_clusters - 1)
  counts = jax.ops.segment_sum(valid.astype(jnp.float32), seg, n * num_clusters)
  return jnp.where(valid, counts[seg], 1.0)


@functools.partial(jax.jit, static_argnames=("num_basins", "num_groups"))
def loo_basin_coverage(basin_ids: jax.Array, group_ids: jax.Array, *, num_basins: int,
                       num_groups: int | None = None) -> jax.Array:
  """R^cov_i = |basins(g)| − |basins(g \\ {i})|: 1 when i is alone in its basin (id ≥ 0).

  Examples:
    >>> loo_basin_coverage(jnp.array([0, 0, 1, -1]), jnp.zeros(4, jnp.int32),
    ...                    num_basins=2).tolist()
    [0.0, 0.0, 1.0, 0.0]
  """
  size = cluster_sizes(basin_ids, group_ids, num_clusters=num_basins, num_groups=num_groups)
  return jnp.where((jnp.asarray(basin_ids) >= 0) & (size == 1.0), 1.0, 0.0)


@COVERAGES.register("max_match")
def _max_match(r_match, basin_ids, group_ids, *, num_basins, num_groups=None):
  del basin_ids, num_basins
  return loo_max_coverage(r_match, group_ids, num_groups=num_groups)


@COVERAGES.register("basins")
def _basins(r_match, basin_ids, group_ids, *, num_basins, num_groups=None):
  del r_match
  return loo_basin_coverage(basin_ids, group_ids, num_basins=num_basins, num_groups=num_groups)


def marginal_coverage(kind: str, r_match: jax.Array, basin_ids: jax.Array,
                      group_ids: jax.Array, *, num_basins: int,
                      num_groups: int | None = None) -> jax.Array:
  """`COVERAGES.get(kind)`: R^cov `[B]` from match scores `[B]` and basin ids `[B]`."""
  return COVERAGES.get(kind)(r_match, basin_ids, group_ids, num_basins=num_basins,
                             num_groups=num_groups)


@functools.partial(jax.jit, static_argnames=("num_groups", "eps", "ddof"))
def coverage_advantages(rewards: jax.Array, coverage: jax.Array, group_ids: jax.Array, *,
                        eta: float | jax.Array, cluster_size: jax.Array | None = None,
                        num_groups: int | None = None, eps: float = 1e-4,
                        ddof: int = 0) -> jax.Array:
  """A = group z-score of u = R / c + η·R^cov (module docstring).

  Args:
    rewards: `[B]` R_i.
    coverage: `[B]` R^cov_i (`loo_max_coverage`, `loo_basin_coverage`).
    group_ids: `[B]` ints.
    eta: η ≥ 0 (η = 0 and no cluster sizes: plain GRPO advantages).
    cluster_size: `[B]` c_i (`cluster_sizes`), or None (no down-weighting).
    num_groups, eps, ddof: as `group_advantages` (default ε 1e-4, population std: Flow-GRPO's).

  Examples:
    >>> adv = coverage_advantages(jnp.array([1.0, 1.0, 0.0]), jnp.array([0.0, 0.0, 1.0]),
    ...                           jnp.zeros(3, jnp.int32), eta=0.5,
    ...                           cluster_size=jnp.array([2.0, 2.0, 1.0]))
    >>> adv.tolist()  # u = (1/2, 1/2, 0 + 0.5·1): the duplicated pair and the lone sample tie
    [0.0, 0.0, 0.0]
  """
  u = jnp.asarray(rewards, jnp.float32)
  if cluster_size is not None:
    u = u / jnp.asarray(cluster_size, jnp.float32)
  u = u + jnp.asarray(eta, jnp.float32) * jnp.asarray(coverage, jnp.float32)
  return group_advantages(u, group_ids, num_groups=num_groups, eps=eps, ddof=ddof)
