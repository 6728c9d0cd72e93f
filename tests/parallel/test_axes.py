"""Logical-axis rules → PartitionSpecs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec

from jaxrl_post import parallel
from jaxrl_post.parallel import axes


def _mesh(shape=(2, 2, 2)):
  return Mesh(np.array(jax.devices()[:8]).reshape(shape), ("data", "fsdp", "tensor"))


def test_rules_map_names_to_mesh_axes():
  spec = parallel.logical_to_spec((axes.BATCH, axes.LENGTH, axes.EMBED), parallel.DEFAULT_RULES)
  # batch claims data and fsdp first, so embed (fsdp) is left unsharded.
  assert spec == PartitionSpec(("data", "fsdp"), None, None)
  spec = parallel.logical_to_spec((axes.EMBED, axes.HEADS, axes.HEAD_DIM), parallel.DEFAULT_RULES)
  assert spec == PartitionSpec("fsdp", "tensor", None)


def test_axes_of_size_one_and_missing_axes_are_dropped():
  mesh = Mesh(np.array(jax.devices()[:8]).reshape(8, 1, 1), ("data", "fsdp", "tensor"))
  spec = parallel.logical_to_spec((axes.BATCH, axes.VOCAB), parallel.DEFAULT_RULES, mesh)
  assert spec == PartitionSpec("data", None)
  mesh_data_only = Mesh(np.array(jax.devices()[:8]), ("data",))
  spec = parallel.logical_to_spec((axes.EMBED, axes.MLP), parallel.DEFAULT_RULES, mesh_data_only)
  assert spec == PartitionSpec(None, None)


def test_indivisible_dimensions_are_replicated():
  mesh = _mesh()
  spec = parallel.logical_to_spec((axes.VOCAB, axes.EMBED), parallel.DEFAULT_RULES, mesh,
                                  shape=(97, 64))
  assert spec == PartitionSpec(None, "fsdp")


def test_unknown_logical_axis_lists_known_ones():
  with pytest.raises(KeyError, match="'experts' has no sharding rule; known axes: .*'embed'"):
    parallel.logical_to_spec(("experts",), parallel.DEFAULT_RULES)


def test_constrain_is_a_no_op_without_rules_and_shards_with_them():
  x = jnp.ones((8, 4))
  assert parallel.constrain(x, (axes.BATCH, None)) is x
  mesh = _mesh()

  @jax.jit
  def f(x):
    with parallel.axis_rules(mesh):
      return parallel.constrain(x * 2, (axes.BATCH, None))

  assert f(x).sharding.spec[0] == ("data", "fsdp")
  with pytest.raises(ValueError, match="rank 2 constrained with 1"):
    with parallel.axis_rules(mesh):
      parallel.constrain(x, (axes.BATCH,))
