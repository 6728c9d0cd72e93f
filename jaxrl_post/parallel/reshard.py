"""Moving weights between meshes and layouts: trainer → sampler, without a gather.

  params, seconds = reshard(train_params, state_shardings(train_params, sample_mesh, rules))

RL moves the policy's weights from the trainer's layout (FSDP × tensor on the
trainer mesh) to the sampler's (tensor only, on the same mesh or on a
disjoint set of devices) after every update. The obvious
`jax.device_put(x, target)` is correct, but when the target splits an array
into blocks the source does not hold (say rows → columns), JAX falls back to
fetching the whole array to the host and scattering it again; for Qwen3-8B
that sends its 2.5 GB float32 embedding through host memory on every sync.
`reshard` avoids that fallback:

  1. same devices, same order: one jitted identity with the target
     `out_shardings`; XLA moves only the blocks that change hands
     (all-to-all / all-gather over the fast interconnect).
  2. different devices: the array is first re-laid on its own devices
     (as in 1) into a *block grid* that the target devices can hold too, then
     `jax.device_put` copies those blocks device to device (each target shard
     is exactly one source shard, so no host gather), and, if the target is
     finer than that grid, a last jitted identity on the target devices
     splits the blocks further.

The grid is the target's own split (rows × columns per dimension) when the
source has enough devices for it, and otherwise a coarsening of it that the
source's device count divides. Peak memory: the source devices briefly hold
a second, re-laid copy of their shards.

Scope: one process (any devices it addresses). Across hosts, disjoint
meshes need JAX's cross-host transfers (`jax.device_put` supports them for
some runtimes only); colocated re-layouts (case 1) work on any pod.
"""

from __future__ import annotations

import functools
import math
import time
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from jaxrl_post.parallel.axes import DEFAULT_RULES, Rules, state_shardings


def _device_list(sharding) -> tuple:
  """The sharding's devices in its flat mesh order (what jit compares)."""
  if isinstance(sharding, NamedSharding):
    return tuple(sharding.mesh.devices.flat)
  return tuple(sharding._device_assignment)


def split_counts(sharding: NamedSharding, shape: tuple[int, ...]) -> tuple[int, ...]:
  """How many blocks `sharding` cuts each dimension of an array of `shape` into."""
  shard = sharding.shard_shape(shape)
  return tuple(s // b if b else 1 for s, b in zip(shape, shard))


def transfer_grid(target_counts: tuple[int, ...], num_source: int,
                  num_target: int) -> tuple[int, ...]:
  """The block grid to copy across: the target's split, coarsened until both sides hold it.

  Args:
    target_counts: blocks per dimension of the target sharding; their
      product divides `num_target` (a valid sharding).
    num_source, num_target: device counts of the two sides.

  Returns:
    Per-dimension counts `c` with `c_d | target_counts_d` and
    `prod(c) | num_source`: the source can hold the grid (with replication),
    and the target can split it further to its own layout without
    communication across meshes. Each dimension, most-split first, keeps the
    largest factor the remaining source budget allows (a gcd), so the grid
    stays as fine as the two device counts permit.

  Example:
    >>> transfer_grid((1, 6), num_source=4, num_target=6)
    (1, 2)
  """
  counts = [1] * len(target_counts)
  budget = num_source
  for dim in sorted(range(len(counts)), key=lambda d: -target_counts[d]):
    counts[dim] = math.gcd(target_counts[dim], budget)
    budget //= counts[dim]
  assert num_target % math.prod(counts) == 0
  return tuple(counts)


def _grid_sharding(devices: tuple, counts: tuple[int, ...]) -> NamedSharding:
  """A sharding over `devices` (kept in this order) that cuts dimension d into counts[d]."""
  blocks = math.prod(counts)
  names = ("_copies",) + tuple(f"_dim{d}" for d in range(len(counts)))
  grid = np.array(devices, dtype=object).reshape((len(devices) // blocks,) + tuple(counts))
  mesh = Mesh(grid, names, axis_types=(AxisType.Auto,) * len(names))
  return NamedSharding(mesh, PartitionSpec(*(f"_dim{d}" if c > 1 else None
                                             for d, c in enumerate(counts))))


def _identity(xs):
  return xs


@functools.lru_cache(maxsize=64)
def _relayout(out_shardings: tuple):
  # One jitted identity per set of output shardings: XLA inserts the
  # collectives that turn the inputs' layouts into these.
  return jax.jit(_identity, out_shardings=out_shardings)


def _run_relayouts(values: list, shardings: list) -> list:
  """Applies `_relayout` to the values, one jit per device list (jit needs one)."""
  out = list(values)
  groups: dict[tuple, list[int]] = {}
  for i, (x, s) in enumerate(zip(values, shardings)):
    if x.sharding == s:
      continue
    if x.sharding.is_equivalent_to(s, x.ndim) and _device_list(x.sharding) == _device_list(s):
      # Same blocks on the same devices under another mesh's names: a relabel.
      out[i] = jax.device_put(x, s)
    else:
      groups.setdefault(_device_list(s), []).append(i)
  for indices in groups.values():
    results = _relayout(tuple(shardings[i] for i in indices))(tuple(values[i] for i in indices))
    for i, y in zip(indices, results):
      out[i] = y
  return out


def reshard(tree: Any, shardings: Any) -> tuple[Any, float]:
  """Moves every array of `tree` to its target sharding, block by block.

  Args:
    tree: a pytree of `jax.Array`s (e.g. an `nnx.State` of parameters),
      committed to any sharding. Host arrays are simply `device_put`.
    shardings: the same pytree with a `NamedSharding` per array (e.g.
      `state_shardings(tree, sample_mesh, sample_rules)`), on the same mesh,
      a mesh over the same devices in another shape, or disjoint devices.

  Returns:
    `(moved tree, seconds)`: the arrays with exactly the target shardings and
    unchanged values, and the wall time until they were ready. A leaf that
    already has its target sharding is returned as is, not copied: after a
    train step that donates the parameters, sync again (or copy first, as a
    frozen reference model must).
  """
  tic = time.perf_counter()
  leaves, treedef = jax.tree.flatten(tree)
  targets = treedef.flatten_up_to(shardings)
  out: list[Any] = [None] * len(leaves)
  direct, crossing = [], []
  for i, (x, target) in enumerate(zip(leaves, targets)):
    if not isinstance(x, jax.Array) or len(x.sharding.device_set) == 1:
      # Host data, or a single-device array whose shards are cut on device.
      out[i] = jax.device_put(x, target)
    elif _device_list(x.sharding) == _device_list(target):
      direct.append(i)
    else:
      crossing.append(i)

  # 1. Same devices in the same order: one collective re-layout.
  for i, y in zip(direct, _run_relayouts([leaves[i] for i in direct],
                                         [targets[i] for i in direct])):
    out[i] = y

  # 2. Other devices: re-lay on the source into a grid both sides hold, copy
  #    the blocks across, then split them further on the target if needed.
  source_grids, target_grids = [], []
  for i in crossing:
    x, target = leaves[i], targets[i]
    src, dst = _device_list(x.sharding), _device_list(target)
    counts = transfer_grid(split_counts(target, x.shape), len(src), len(dst))
    source_grids.append(_grid_sharding(src, counts))
    target_grids.append(_grid_sharding(dst, counts))
  on_source = _run_relayouts([leaves[i] for i in crossing], source_grids)
  copied = jax.device_put(on_source, target_grids)
  for i, y in zip(crossing, _run_relayouts(copied, [targets[i] for i in crossing])):
    out[i] = y

  out = jax.block_until_ready(jax.tree.unflatten(treedef, out))
  return out, time.perf_counter() - tic


def reshard_state(state: Any, mesh: Mesh, rules: Rules = DEFAULT_RULES) -> tuple[Any, float]:
  """`reshard` an `nnx.State` to the layout `rules` give on `mesh`; `(state, seconds)`."""
  return reshard(state, state_shardings(state, mesh, rules))
