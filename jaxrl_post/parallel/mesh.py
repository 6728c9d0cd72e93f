"""Meshes from config, rule tables per role, born-sharded init, and batch collectives.

A run describes its devices in the config, MaxText style, and never by hand:

  config.mesh = mesh_config(ici=dict(fsdp=-1, tensor=2))
  placement = make_placement(config.mesh)       # trainer and sampler meshes + rules
  model = init_sharded(lambda: CausalLM(cfg, rngs=nnx.Rngs(0)),
                       placement.train_mesh, placement.train_rules)

Mesh sizes come in two layers. `ici_<axis>` sizes split the devices of one
slice (a TPU slice, or one GPU node), whose links are fast; `dcn_<axis>` sizes
split the slices, which talk over the slower data-centre network. The mesh
axis `a` has size `ici_a * dcn_a`, and one size per layer may be -1, filled
in from the device count. Putting `data` (or `fsdp`) on `dcn` keeps the heavy
collectives (tensor parallel all-reduces, FSDP all-gathers) inside a slice.

The trainer and the sampler use different rule tables for the same logical
axis names: training shards parameters over `fsdp` (they are all-gathered
once per layer per step, amortised over a large batch), sampling does not
(decoding would all-gather every weight for every token). Either colocate the
two on one mesh (`sampler_devices=0`) or give the sampler the last
`sampler_devices` devices as a disjoint mesh (disaggregated; weights move with
`jaxrl_post.parallel.reshard`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from jaxrl_post.parallel import axes, multihost
from jaxrl_post.parallel.axes import DEFAULT_RULES, Rules, state_shardings
from jaxrl_post.registry import Registry

DEFAULT_MESH_AXES = ("data", "fsdp", "tensor")

# ---- Rule tables ----

# Sampling: tensor parallelism only. Weights stay whole along `embed` on each
# tensor shard, because a decode step touches every weight for a handful of
# tokens and an FSDP all-gather per token would dominate; the batch (and with
# it the KV cache) is split over `data` and `fsdp` instead.
SAMPLE_RULES: tuple[tuple[str, Any], ...] = (
  (axes.BATCH, ("data", "fsdp")),
  (axes.VOCAB, "tensor"),
  (axes.EMBED, None),
  (axes.HEADS, "tensor"),
  (axes.KV_HEADS, "tensor"),
  (axes.MLP, "tensor"),
  (axes.EXPERT, "expert"),
  (axes.HEAD_DIM, None),
  (axes.LAYERS, None),
  (axes.NORM, None),
  (axes.LENGTH, None),
  (axes.CACHE_LENGTH, None),
)

# Pure data parallelism: every device holds the whole model, the batch is
# split over all mesh axes. The cheapest choice for models that fit.
REPLICATED_RULES: tuple[tuple[str, Any], ...] = (
  (axes.BATCH, ("data", "fsdp", "tensor")),
  *((name, None) for name in (axes.VOCAB, axes.EMBED, axes.HEADS, axes.KV_HEADS, axes.MLP,
                              axes.EXPERT, axes.HEAD_DIM, axes.LAYERS, axes.NORM, axes.LENGTH,
                              axes.CACHE_LENGTH)),
)

RULE_TABLES: Registry[tuple] = Registry("sharding rule table")
RULE_TABLES.add("fsdp_tensor", tuple(DEFAULT_RULES))  # training default: FSDP × tensor
RULE_TABLES.add("tensor", SAMPLE_RULES)  # sampling default
RULE_TABLES.add("replicated", REPLICATED_RULES)


def get_rules(rules: str | Rules, *, key: str = "rules") -> tuple[tuple[str, Any], ...]:
  """A rule table from its registered name or as given (a sequence of pairs).

  Args:
    rules: a name in `RULE_TABLES` ("fsdp_tensor", "tensor", "replicated") or
      `(logical_name, mesh_axis | tuple of mesh axes | None)` pairs.
    key: the config key the value came from, for error messages.

  Raises:
    ValueError: an unknown name (listing the valid ones) or a malformed pair.
  """
  if isinstance(rules, str):
    try:
      return RULE_TABLES.get(rules)
    except KeyError as e:
      raise ValueError(f"{key}: {e.args[0]}") from None
  table = []
  for pair in rules:
    if len(pair) != 2 or not isinstance(pair[0], str):
      raise ValueError(f"{key}: each rule is (logical_name, mesh axes), got {pair!r}")
    name, target = pair
    if target is not None and not isinstance(target, str):
      target = tuple(target)
    table.append((name, target))
  return tuple(table)


# ---- Config ----


def mesh_config(mesh_axes: Sequence[str] = DEFAULT_MESH_AXES, *,
                ici: Mapping[str, int] | None = None, dcn: Mapping[str, int] | None = None,
                num_slices: int = 0, train_rules: str | Rules = "fsdp_tensor",
                sample_rules: str | Rules = "tensor", sampler_devices: int = 0,
                sampler_ici: Mapping[str, int] | None = None,
                cpu_devices: int = 0) -> ml_collections.ConfigDict:
  """The `config.mesh` block of an experiment config.

  Args:
    mesh_axes: mesh axis names, outermost first.
    ici: sizes within a slice by axis name; unnamed axes get 1. Default: all
      devices on `fsdp` (or on the first axis when there is no `fsdp`).
    dcn: sizes across slices; default all slices on `data` (or the first axis).
    num_slices: how many slices (granules of devices joined by the slow
      network) the devices form; 0 detects TPU slices and otherwise uses 1.
      On GPU clusters set it to the number of nodes: each slice is then a
      contiguous block of `jax.devices()`, which JAX orders by process.
    train_rules, sample_rules: rule tables (names in `RULE_TABLES` or pairs).
    sampler_devices: 0 colocates the sampler on the trainer's mesh; n > 0
      gives it the last n devices as a separate mesh (and the trainer the rest).
    sampler_ici: sizes of that separate sampler mesh; default all on `data`.
    cpu_devices: on a CPU host, 0 keeps XLA's layout (one device whose thread pool spans
      the cores); -1 splits the host into one single-threaded device per core and n > 0
      into n (`parallel.host.configure_cpu_devices`, applied by the training loop before
      JAX starts), which the mesh then spans: with `ici_data=-1, ici_fsdp=1` each core
      runs its own rows (a GRPO step of `small` 18 % faster on 2 cores,
      docs/benchmarks.md). Other backends ignore it.

  Returns:
    A `ConfigDict` with `mesh_axes`, `ici_<axis>`, `dcn_<axis>`,
    `sampler_ici_<axis>` for every axis, and the other arguments as keys, so
    each size is one `--config.mesh.ici_tensor=4` override away.
  """
  mesh_axes = tuple(mesh_axes)
  if not mesh_axes or len(set(mesh_axes)) != len(mesh_axes):
    raise ValueError(f"mesh_axes must be distinct names, got {mesh_axes}")
  fill_ici = "fsdp" if "fsdp" in mesh_axes else mesh_axes[0]
  fill_outer = "data" if "data" in mesh_axes else mesh_axes[0]
  ici = {fill_ici: -1} if ici is None else dict(ici)
  dcn = {fill_outer: -1} if dcn is None else dict(dcn)
  sampler_ici = {fill_outer: -1} if sampler_ici is None else dict(sampler_ici)
  for what, sizes in (("ici", ici), ("dcn", dcn), ("sampler_ici", sampler_ici)):
    unknown = set(sizes) - set(mesh_axes)
    if unknown:
      raise ValueError(f"{what} names axes {sorted(unknown)} that are not in mesh_axes "
                       f"{mesh_axes}")
  config = ml_collections.ConfigDict()
  config.mesh_axes = mesh_axes
  for axis in mesh_axes:
    config[f"ici_{axis}"] = int(ici.get(axis, 1))
  for axis in mesh_axes:
    config[f"dcn_{axis}"] = int(dcn.get(axis, 1))
  config.num_slices = int(num_slices)
  config.train_rules = train_rules if isinstance(train_rules, str) else get_rules(train_rules)
  config.sample_rules = sample_rules if isinstance(sample_rules, str) else get_rules(sample_rules)
  config.sampler_devices = int(sampler_devices)
  config.cpu_devices = int(cpu_devices)
  for axis in mesh_axes:
    config[f"sampler_ici_{axis}"] = int(sampler_ici.get(axis, 1))
  return config


def _sizes(config, prefix: str, key: str) -> dict[str, int]:
  """Reads `<prefix>_<axis>` for every mesh axis; stray non-1 sizes are errors."""
  mesh_axes = tuple(config["mesh_axes"])
  sizes = {}
  for axis in mesh_axes:
    name = f"{prefix}_{axis}"
    if name not in config:
      raise ValueError(f"{key}.{name} is missing (mesh_axes = {mesh_axes})")
    sizes[axis] = int(config[name])
  # A size for an axis that was removed from mesh_axes would be silently
  # ignored; only the neutral 1 is allowed.
  for name in config.keys():
    if name.startswith(prefix + "_") and name[len(prefix) + 1:] not in mesh_axes:
      if int(config[name]) != 1:
        raise ValueError(f"{key}.{name}={config[name]} names an axis that is not in "
                         f"{key}.mesh_axes={mesh_axes}")
  return sizes


def resolve_sizes(sizes: Mapping[str, int], total: int, *, key: str, prefix: str,
                  what: str = "devices") -> tuple[int, ...]:
  """Fills the one -1 in `sizes` so that their product is `total`.

  Args:
    sizes: axis name → size (≥ 1, or -1 for "the rest").
    total: the number the sizes must multiply to.
    key, prefix: name the config keys in errors (`config.mesh`, `ici`).
    what: what `total` counts, for errors.

  Returns:
    The sizes in the mapping's order.

  Raises:
    ValueError: naming the offending config keys.
  """
  names = [f"{key}.{prefix}_{axis}" for axis in sizes]
  auto = [n for n, s in zip(names, sizes.values()) if s == -1]
  bad = [f"{n}={s}" for n, s in zip(names, sizes.values()) if s != -1 and s < 1]
  if bad:
    raise ValueError(f"{', '.join(bad)}: mesh sizes must be ≥ 1 or -1 (auto)")
  if len(auto) > 1:
    raise ValueError(f"only one of {', '.join(auto)} may be -1 (auto)")
  fixed = math.prod(s for s in sizes.values() if s != -1)
  listing = " × ".join(f"{n}={s}" for n, s in zip(names, sizes.values()))
  if auto:
    if total % fixed:
      raise ValueError(f"{listing}: the fixed sizes multiply to {fixed}, which does not "
                       f"divide the {total} {what}, so {auto[0]} cannot be filled in")
    return tuple(total // fixed if s == -1 else s for s in sizes.values())
  if fixed != total:
    raise ValueError(f"{listing} multiply to {fixed}, but there are {total} {what}; "
                     "change them or set one to -1")
  return tuple(sizes.values())


def _count_slices(devices: Sequence[Any], num_slices: int) -> int:
  if num_slices > 0:
    return num_slices
  slice_ids = {getattr(d, "slice_index", 0) for d in devices}
  return len(slice_ids)


def _granules(devices: Sequence[Any], num_slices: int) -> list[list[Any]]:
  """Devices grouped by slice: TPU `slice_index` when present, else contiguous blocks."""
  slice_ids = sorted({getattr(d, "slice_index", 0) for d in devices})
  if len(slice_ids) == num_slices and num_slices > 1:
    return [[d for d in devices if getattr(d, "slice_index", 0) == s] for s in slice_ids]
  per = len(devices) // num_slices
  return [list(devices[i * per:(i + 1) * per]) for i in range(num_slices)]


def make_mesh(config, *, devices: Sequence[Any] | None = None, prefix: str = "ici",
              key: str = "config.mesh") -> Mesh:
  """The mesh a `mesh_config()` block describes, over `devices` (default: all).

  Args:
    config: a `mesh_config()` ConfigDict (or any mapping with its keys).
    devices: the devices to use, e.g. a slice of `jax.devices()` for a
      disaggregated role.
    prefix: which per-slice sizes to read: "ici" (trainer) or "sampler_ici".
    key: the config path, for error messages.

  Returns:
    A `Mesh` with `Auto` axis types (sharding is propagated by XLA and
    constrained by `parallel.constrain`), axis `a` of size `ici_a * dcn_a`.

  Raises:
    ValueError: sizes that do not multiply to the device count, naming the keys.
  """
  devices = list(jax.devices() if devices is None else devices)
  mesh_axes = tuple(config["mesh_axes"])
  ici = _sizes(config, prefix, key)
  if prefix == "ici":
    dcn = _sizes(config, "dcn", key)
    num_slices = _count_slices(devices, int(config.get("num_slices", 0)))
  else:  # A disaggregated sampler lives inside one slice.
    dcn, num_slices = {a: 1 for a in mesh_axes}, 1
  if len(devices) % num_slices:
    raise ValueError(f"{key}.num_slices={num_slices} does not divide the {len(devices)} devices")
  ici_shape = resolve_sizes(ici, len(devices) // num_slices, key=key, prefix=prefix,
                            what="devices per slice")
  dcn_shape = resolve_sizes(dcn, num_slices, key=key, prefix="dcn", what="slices")
  axis_types = (AxisType.Auto,) * len(mesh_axes)
  if num_slices == 1:
    return jax.make_mesh(ici_shape, mesh_axes, axis_types=axis_types, devices=devices)
  granules = _granules(devices, num_slices)
  if all(hasattr(d, "slice_index") for d in devices) and devices[0].platform == "tpu":
    array = mesh_utils.create_hybrid_device_mesh(ici_shape, dcn_shape, devices)
  else:
    # The same layout `create_hybrid_device_mesh` builds: a dcn-shaped grid of
    # per-slice ici meshes, so mesh axis a is (dcn_a outer, ici_a inner).
    per_slice = [mesh_utils.create_device_mesh(ici_shape, g) for g in granules]
    grid = np.arange(num_slices).reshape(dcn_shape)
    blocks = np.vectorize(lambda i: per_slice[i], otypes=[object])(grid)
    array = np.block(blocks.tolist())
  return Mesh(array, mesh_axes, axis_types=axis_types)


class Placement(NamedTuple):
  """Where the trainer and the sampler run, and the rules each uses.

  `colocated` when both share one mesh (weights then only change layout, in
  place); otherwise the meshes are disjoint and weights are copied across.
  """

  train_mesh: Mesh
  train_rules: tuple
  sample_mesh: Mesh
  sample_rules: tuple

  @property
  def colocated(self) -> bool:
    return self.train_mesh is self.sample_mesh


def make_placement(config, *, devices: Sequence[Any] | None = None,
                   key: str = "config.mesh") -> Placement:
  """Trainer and sampler meshes and rule tables from a `mesh_config()` block."""
  devices = list(jax.devices() if devices is None else devices)
  train_rules = get_rules(config["train_rules"], key=f"{key}.train_rules")
  sample_rules = get_rules(config["sample_rules"], key=f"{key}.sample_rules")
  n = int(config.get("sampler_devices", 0))
  if n == 0:
    mesh = make_mesh(config, devices=devices, key=key)
    return Placement(mesh, train_rules, mesh, sample_rules)
  if not 0 < n < len(devices):
    raise ValueError(f"{key}.sampler_devices={n} must leave the trainer at least one of the "
                     f"{len(devices)} devices")
  if _count_slices(devices, int(config.get("num_slices", 0))) > 1:
    raise ValueError(f"{key}.sampler_devices > 0 (a disaggregated sampler) is supported on one "
                     "slice only; use num_slices=1 or colocate (sampler_devices=0)")
  train_mesh = make_mesh(config, devices=devices[:len(devices) - n], key=key)
  sample_mesh = make_mesh(config, devices=devices[len(devices) - n:], prefix="sampler_ici",
                          key=key)
  return Placement(train_mesh, train_rules, sample_mesh, sample_rules)


# ---- Born-sharded initialisation ----


def abstract_module(make_module: Callable[[], Any]):
  """`(graphdef, abstract_state)` of the module `make_module()` builds, without FLOPs or memory.

  The state's leaves are `jax.ShapeDtypeStruct`s: enough to derive
  shardings, restore a checkpoint into, or compile against.
  """
  from flax import nnx  # Local import: the mesh helpers themselves need no Flax.

  return nnx.split(nnx.eval_shape(make_module))


def sharded_initializer(make_module: Callable[[], Any], mesh: Mesh,
                        rules: Rules = DEFAULT_RULES) -> tuple[Any, Callable[[], Any]]:
  """`(graphdef, init)`: `init()` returns the module's state, every array born in its shards.

  Shapes first: `jax.eval_shape` gives the parameters' shapes and logical
  axis names, `state_shardings` turns those into `NamedSharding`s, and the
  initialiser is `jax.jit(..., out_shardings=...)`, so XLA partitions the
  random-number generation itself and each device only ever computes and
  stores its own shard. The whole model never exists on one device, which is
  what makes an 8B model initialisable on devices that hold 1/8 of it.
  `init.lower().compile().memory_analysis()` shows the per-device cost.
  """
  from flax import nnx

  graphdef, abstract = abstract_module(make_module)
  shardings = state_shardings(abstract, mesh, rules)

  def init():
    return nnx.split(make_module())[1]

  return graphdef, jax.jit(init, out_shardings=shardings)


def init_sharded(make_module: Callable[[], Any], mesh: Mesh, rules: Rules = DEFAULT_RULES):
  """Builds `make_module()` with every parameter created directly in its shards.

  See `sharded_initializer`. With JAX's partitionable threefry (the default)
  the values equal those of the same initialiser run unsharded under `jit`.

  Args:
    make_module: builds the module, with its RNG inside, e.g.
      `lambda: CausalLM(config, rngs=nnx.Rngs(0))`.
    mesh, rules: where the parameters go.

  Returns:
    The module, its parameters sharded by `rules` on `mesh`.
  """
  from flax import nnx

  graphdef, init = sharded_initializer(make_module, mesh, rules)
  return nnx.merge(graphdef, init())


# ---- shard_map helpers: explicit collectives over the batch ----


def batch_mesh_axes(mesh: Mesh, rules: Rules = DEFAULT_RULES) -> tuple[str, ...]:
  """The mesh axes (of size > 1) that the `batch` logical axis is split over."""
  spec = axes.logical_to_spec((axes.BATCH,), rules, mesh)
  entry = spec[0]
  if entry is None:
    return ()
  return (entry,) if isinstance(entry, str) else tuple(entry)


def data_parallel_axes(mesh: Mesh, rules: Rules, *batch_sizes: int) -> tuple[str, ...]:
  """The batch's mesh axes if every device holds only its own rows, else ().

  That is pure data parallelism: the batch axes cover the whole mesh (nothing
  else is split, so every device has a full copy of the rest) and divide every
  batch size given. Code under `shard_map` over these axes then needs no
  collective except its own reductions (e.g. the sampler's per-device loops).
  """
  names = batch_mesh_axes(mesh, rules)
  shards = math.prod(mesh.shape[name] for name in names)
  if shards < 2 or shards != mesh.size or any(size % shards for size in batch_sizes):
    return ()
  return names


def batch_sharding(mesh: Mesh, rules: Rules = DEFAULT_RULES, ndim: int = 1,
                   shape: Sequence[int] | None = None) -> NamedSharding:
  """`NamedSharding` for an array `[batch, ...]` of rank `ndim`, split over the batch axes.

  With `shape` (which then sets the rank), batch axes that do not divide the
  batch are dropped, as for parameters: a mini-batch of 4 rows on 8 devices is
  replicated rather than refused by `jax.device_put`.
  """
  if shape is not None:
    logical = (axes.BATCH,) + (None,) * (len(shape) - 1)
    return NamedSharding(mesh, axes.logical_to_spec(logical, rules, mesh, tuple(shape)))
  batch = batch_mesh_axes(mesh, rules)
  return NamedSharding(mesh, PartitionSpec(batch or None, *([None] * (ndim - 1))))


def put_batch(batch: Any, mesh: Mesh, rules: Rules = DEFAULT_RULES) -> Any:
  """Places a pytree of host or device arrays on `mesh`: rows over the batch axes.

  Scalars (global normalisers such as `num_tokens`) are replicated. Arrays
  may come from other devices (a disaggregated sampler's rollout). With
  several processes, host arrays must be the same global value on every
  process (`parallel.multihost`): each process places only its devices' rows.
  """
  multiprocess = jax.process_count() > 1

  def put(x):
    shape = np.shape(x)
    sharding = (batch_sharding(mesh, rules, shape=shape) if shape
                else NamedSharding(mesh, PartitionSpec()))
    if multiprocess and not isinstance(x, jax.Array):
      return multihost.put_global(x, sharding)
    return jax.device_put(x, sharding)

  return jax.tree.map(put, batch)


def batch_psum(fn: Callable, mesh: Mesh, rules: Rules = DEFAULT_RULES) -> Callable:
  """Turns a per-shard partial sum into the global sum with `shard_map` + `psum`.

  Args:
    fn: `(*arrays) -> pytree of partial sums`, where every array has a leading
      `[batch]` dimension and `fn` sums over it (per-shard, it sees
      `batch / shards` rows).
    mesh, rules: the batch is split over `batch_mesh_axes(mesh, rules)`; the
      batch size must be divisible by the product of their sizes.

  Returns:
    `(*arrays) -> pytree of global sums`, replicated on every device. Use it
    (inside or outside `jit`) where a loss needs a statistic of the whole
    batch, e.g. the token count of a token-mean.
  """
  batch = batch_mesh_axes(mesh, rules)
  if not batch:
    return fn

  def local(*arrays):
    return jax.tree.map(lambda s: jax.lax.psum(s, batch), fn(*arrays))

  def wrapped(*arrays):
    in_specs = tuple(PartitionSpec(batch, *([None] * (a.ndim - 1))) for a in arrays)
    return jax.shard_map(local, mesh=mesh, in_specs=in_specs, out_specs=PartitionSpec())(*arrays)

  return wrapped


def global_token_count(mask: jax.Array, mesh: Mesh, rules: Rules = DEFAULT_RULES) -> jax.Array:
  """`int32[]` number of True entries of `mask` `[batch, time]` over the whole sharded batch."""
  return batch_psum(lambda m: jnp.sum(m, dtype=jnp.int32), mesh, rules)(mask)


def token_mean(values: jax.Array, mask: jax.Array, mesh: Mesh,
               rules: Rules = DEFAULT_RULES) -> jax.Array:
  """Σ values·mask / Σ mask over the whole batch: `values`, `mask` are `[batch, time]`.

  Each shard sums its rows, one `psum` adds the shards: the result equals
  the single-device token-mean, while a mean of per-shard means
  would weight each shard equally whatever its token count.
  """
  def sums(v, m):
    m = m.astype(jnp.float32)
    return jnp.sum(v.astype(jnp.float32) * m), jnp.sum(m)

  total, count = batch_psum(sums, mesh, rules)(values, mask)
  return total / jnp.maximum(count, 1.0)


# ---- jax.distributed ----


def distributed_kwargs(environ: Mapping[str, str] | None = None) -> dict[str, Any] | None:
  """`jax.distributed.initialize` arguments from the launcher's environment, or None.

  `scripts/launch_slurm.sh` sets `JAX_COORDINATOR_ADDRESS`, `JAX_NUM_PROCESSES`
  and `JAX_PROCESS_ID` (and `JAX_LOCAL_DEVICE_IDS`, which JAX reads itself);
  `scripts/launch_tpu_pod.sh` sets `JAXRL_POST_DISTRIBUTED=1`, and on a TPU
  pod JAX finds the rest itself. Neither set: a single process, None.
  """
  environ = os.environ if environ is None else environ
  address = environ.get("JAX_COORDINATOR_ADDRESS")
  if address:
    missing = [k for k in ("JAX_NUM_PROCESSES", "JAX_PROCESS_ID") if k not in environ]
    if missing:
      raise ValueError(f"JAX_COORDINATOR_ADDRESS is set but {', '.join(missing)} is not")
    return dict(coordinator_address=address, num_processes=int(environ["JAX_NUM_PROCESSES"]),
                process_id=int(environ["JAX_PROCESS_ID"]))
  if environ.get("JAXRL_POST_DISTRIBUTED", "") not in ("", "0"):
    return {}
  return None


def maybe_initialize_distributed(environ: Mapping[str, str] | None = None) -> bool:
  """Calls `jax.distributed.initialize` when a launcher asked for it; True if it did.

  Call it first in `main()`, before anything touches a device: the same
  binary then runs as one process on a laptop and as one of many on a pod.
  CPU collectives across processes go over gloo (the CPU client has none
  otherwise); `JAXRL_POST_HEARTBEAT_TIMEOUT_S` bounds how long the others
  wait for a process that stopped answering.
  """
  kwargs = distributed_kwargs(environ)
  if kwargs is None:
    return False
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(**kwargs,
                             heartbeat_timeout_seconds=multihost.heartbeat_timeout_s(environ))
  return True
