"""Logical axis names and the rules that map them onto mesh axes.

Code names what an array dimension *means* (`embed`, `heads`, `vocab`, ...);
one rules table, owned by the config, says which mesh axis (`data`, `fsdp`,
`tensor`) each name is split over. This is MaxText's scheme, in a small form:

  rules = (("batch", ("data", "fsdp")), ("embed", "fsdp"), ("heads", "tensor"))
  logical_to_spec(("batch", "length", "embed"), rules)
  # -> PartitionSpec(('data', 'fsdp'), None, 'fsdp')

A rule whose mesh axis is missing from the mesh, or has size 1, is dropped, so
one table serves a laptop and a pod. A mesh axis is never used twice in one
spec: the first logical dimension that claims it wins.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

# Parameter axes.
VOCAB = "vocab"
EMBED = "embed"
HEADS = "heads"
KV_HEADS = "kv_heads"
HEAD_DIM = "head_dim"
MLP = "mlp"
LAYERS = "layers"
NORM = "norm"
# The stacked experts of a Mixture-of-Experts block (`models.moe`): expert parallelism is the
# rule `("expert", "expert")`, a no-op on meshes without an `expert` axis.
EXPERT = "expert"
# Activation axes.
BATCH = "batch"
LENGTH = "length"
CACHE_LENGTH = "cache_length"

Rules = Sequence[tuple[str, str | Sequence[str] | None]]

# Tensor parallelism over heads / mlp / vocab, FSDP over embed, batch over
# data (and fsdp, which is data parallel for activations). Sampling rules in
# the scale-out work drop `fsdp` from parameters.
DEFAULT_RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
  (BATCH, ("data", "fsdp")),
  (VOCAB, "tensor"),
  (EMBED, "fsdp"),
  (HEADS, "tensor"),
  (KV_HEADS, "tensor"),
  (MLP, "tensor"),
  (EXPERT, "expert"),
  (HEAD_DIM, None),
  (LAYERS, None),
  (NORM, None),
  (LENGTH, None),
  (CACHE_LENGTH, None),
)

_CONTEXT: contextvars.ContextVar[tuple[Mesh, Rules] | None] = contextvars.ContextVar(
  "jaxrl_post_axis_rules", default=None
)


def logical_to_spec(
  logical_axes: Sequence[str | None], rules: Rules, mesh: Mesh | None = None,
  shape: Sequence[int] | None = None,
) -> PartitionSpec:
  """Maps logical axis names to a `PartitionSpec` through `rules`.

  Args:
    logical_axes: one name (or None) per array dimension.
    rules: `(logical_name, mesh_axis | tuple of mesh axes | None)` pairs; the
      first rule for a name wins.
    mesh: if given, mesh axes that are absent or of size 1 are dropped.
    shape: if given (with `mesh`), a mesh axis that does not divide its
      dimension is dropped, so that dimension is replicated (e.g. a vocabulary
      of 151,655 over 4 tensor shards) instead of failing; except the `expert`
      axis, where that is a ValueError (see `Raises`).

  Returns:
    A `PartitionSpec` with one entry per dimension.

  Raises:
    KeyError: a logical name has no rule (the message lists the known names).
    ValueError: the mesh axes of `expert` do not divide the number of experts
      (naming `config.mesh.ici_*` / `dcn_*` and `num_experts`).
  """
  table: dict[str, tuple[str, ...]] = {}
  for name, target in rules:
    if name in table:
      continue
    if target is None:
      table[name] = ()
    elif isinstance(target, str):
      table[name] = (target,)
    else:
      table[name] = tuple(target)
  used: set[str] = set()
  spec = []
  for dim, name in enumerate(logical_axes):
    if name is None:
      spec.append(None)
      continue
    if name not in table:
      raise KeyError(
        f"logical axis {name!r} has no sharding rule; known axes: {sorted(table)}"
      )
    axes = []
    for axis in table[name]:
      if axis in used:
        continue
      if mesh is not None and mesh.shape.get(axis, 1) == 1:
        continue
      if mesh is not None and shape is not None:
        shards = mesh.shape[axis] * int(np.prod([mesh.shape[a] for a in axes]))
        if shape[dim] % shards:
          if name == EXPERT:
            # Replicating the experts would silently put all of them on every device.
            raise ValueError(
              f"num_experts={shape[dim]} is not divisible by the {shards} expert shards (mesh "
              f"axis {axis!r} = config.mesh.ici_{axis} × config.mesh.dcn_{axis}); choose an "
              "expert-parallel size that divides num_experts")
          continue
      axes.append(axis)
    used.update(axes)
    spec.append(None if not axes else axes[0] if len(axes) == 1 else tuple(axes))
  return PartitionSpec(*spec)


def logical_sharding(
  logical_axes: Sequence[str | None], mesh: Mesh, rules: Rules = DEFAULT_RULES,
  shape: Sequence[int] | None = None,
) -> NamedSharding:
  """`NamedSharding` for an array whose dimensions carry `logical_axes`."""
  return NamedSharding(mesh, logical_to_spec(logical_axes, rules, mesh, shape))


@contextlib.contextmanager
def axis_rules(mesh: Mesh, rules: Rules = DEFAULT_RULES):
  """Within this context `constrain` shards activations over `mesh`."""
  token = _CONTEXT.set((mesh, tuple(rules)))
  try:
    yield
  finally:
    _CONTEXT.reset(token)


def current_rules() -> tuple[Mesh, Rules] | None:
  """The `(mesh, rules)` set by the innermost `axis_rules`, or None."""
  return _CONTEXT.get()


def constrain(x: jax.Array, logical_axes: Sequence[str | None]) -> jax.Array:
  """Sharding constraint by logical names; a no-op outside `axis_rules`.

  Models call this on their main activations, so the same model code runs
  unsharded in tests and sharded under a mesh.
  """
  context = _CONTEXT.get()
  if context is None:
    return x
  mesh, rules = context
  if x.ndim != len(logical_axes):
    raise ValueError(f"array of rank {x.ndim} constrained with {len(logical_axes)} axis names")
  return jax.lax.with_sharding_constraint(x, logical_sharding(logical_axes, mesh, rules))


def state_shardings(state, mesh: Mesh, rules: Rules = DEFAULT_RULES):
  """`NamedSharding`s for an `nnx.State` whose variables carry `out_sharding` names.

  Use with `jax.device_put(state, state_shardings(state, mesh))`, or as the
  `out_shardings` of a jitted initialiser (the state may be abstract, from
  `nnx.eval_shape`). Dimensions a mesh axis does not divide are replicated.
  """
  from flax import nnx  # Local import: the axis-rule helpers need no Flax.

  def one(variable):
    names = variable.get_metadata().get("out_sharding") or (None,) * variable.get_value().ndim
    return variable.replace(logical_sharding(names, mesh, rules, variable.get_value().shape))

  return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))
