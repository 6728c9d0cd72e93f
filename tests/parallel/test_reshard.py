"""Trainer → sampler weight transfer: same values, target shardings, no host gather."""

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax._src import array as jax_array

from jaxrl_post.models import CausalLM, get_model_config
from jaxrl_post.parallel import mesh as mesh_lib
from jaxrl_post.parallel import reshard as reshard_lib
from jaxrl_post.parallel.axes import state_shardings
from jaxrl_post.sampling import Sampler

_CONFIG = get_model_config("tiny")


@contextlib.contextmanager
def host_gathers():
  """Records the shapes of arrays fetched whole to the host (`ArrayImpl._value`).

  `jax.device_put` falls back to exactly this when it cannot match shards;
  the transfer guard does not see it (the fetch is internal), so spy on it.
  """
  fetched = []
  original = jax_array.ArrayImpl._value
  jax_array.ArrayImpl._value = property(lambda self: (fetched.append(self.shape),
                                                      original.fget(self))[1])
  try:
    yield fetched
  finally:
    jax_array.ArrayImpl._value = original


def _mesh(devices, **ici):
  return mesh_lib.make_mesh(mesh_lib.mesh_config(ici=ici), devices=devices)


@pytest.fixture(scope="module")
def trained():
  """A tiny model born sharded FSDP × tensor on devices 0-3 (the trainer), and its values."""
  mesh = _mesh(jax.devices()[:4], fsdp=2, tensor=2)
  model = mesh_lib.init_sharded(lambda: CausalLM(_CONFIG, rngs=nnx.Rngs(0)), mesh)
  state = nnx.state(model)
  return state, jax.tree.map(np.asarray, state)


def _check(moved, values, targets):
  for (path, a), b, s in zip(nnx.to_flat_state(moved), jax.tree.leaves(values),
                             jax.tree.leaves(targets)):
    assert a.get_value().sharding == s, path
    np.testing.assert_array_equal(np.asarray(a.get_value()), b)


def test_plain_device_put_would_gather_on_the_host(trained):
  # Why reshard exists: rows → columns across meshes goes through the host.
  state, _ = trained
  embed = state["embed"].get_value()
  target = state_shardings(state, _mesh(jax.devices()[4:], tensor=4),
                           mesh_lib.SAMPLE_RULES)["embed"].get_value()
  with host_gathers() as fetched:
    jax.device_put(embed, target).block_until_ready()
  assert fetched == [embed.shape]


@pytest.mark.parametrize("sample_devices, ici", [
  (slice(4, 8), dict(tensor=4)),  # disjoint, same size: the target grid copies across
  (slice(4, 8), dict(data=2, tensor=2)),
  (slice(6, 8), dict(tensor=2)),  # disjoint, fewer devices
  (slice(2, 8), dict(data=3, tensor=2)),  # overlapping devices, another order
], ids=["4to4_tensor", "4to4_data_tensor", "4to2", "overlap_6"])
def test_reshard_to_a_sampler_mesh(trained, sample_devices, ici):
  state, values = trained
  mesh = _mesh(jax.devices()[sample_devices], **ici)
  targets = state_shardings(state, mesh, mesh_lib.SAMPLE_RULES)
  with host_gathers() as fetched:
    moved, seconds = reshard_lib.reshard(state, targets)
  assert fetched == [] and seconds > 0
  _check(moved, values, targets)


def test_reshard_same_mesh_other_rules(trained):
  state, values = trained
  mesh = jax.tree.leaves(state)[0].sharding.mesh
  with host_gathers() as fetched:
    moved, _ = reshard_lib.reshard_state(state, mesh, mesh_lib.SAMPLE_RULES)
  assert fetched == []
  _check(moved, values, state_shardings(state, mesh, mesh_lib.SAMPLE_RULES))
  spec = moved["layers"][0]["mlp"]["gate_proj"].get_value().sharding.spec
  assert spec == jax.sharding.PartitionSpec(None, "tensor")


def test_reshard_to_a_finer_mesh_splits_on_the_target(trained):
  # 2 source devices cannot hold a 6-way grid: blocks cross at 2-way and are
  # split further on the target.
  state, values = trained
  two, _ = reshard_lib.reshard_state(state, _mesh(jax.devices()[:2], fsdp=2), mesh_lib.get_rules(
    "fsdp_tensor"))
  mesh = _mesh(jax.devices()[2:], fsdp=2, tensor=3)
  targets = state_shardings(two, mesh, mesh_lib.get_rules("fsdp_tensor"))
  with host_gathers() as fetched:
    moved, _ = reshard_lib.reshard(two, targets)
  assert fetched == []
  _check(moved, values, targets)


def test_host_and_single_device_leaves_are_placed_directly():
  mesh = _mesh(jax.devices()[4:], tensor=4)
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("tensor"))
  tree = {"host": np.arange(8.0), "one": jax.device_put(jnp.arange(8.0), jax.devices()[0])}
  moved, _ = reshard_lib.reshard(tree, {"host": sharding, "one": sharding})
  for x in moved.values():
    assert x.sharding == sharding
    np.testing.assert_array_equal(np.asarray(x), np.arange(8.0))


@pytest.mark.parametrize("target, source, target_devices, expected", [
  ((4, 2), 8, 8, (4, 2)),  # the source holds the target's grid as is
  ((4, 2), 2, 8, (2, 1)),
  ((1, 6), 4, 6, (1, 2)),
  ((3, 1), 4, 3, (1, 1)),  # nothing in common: whole arrays cross, split on the target
])
def test_transfer_grid(target, source, target_devices, expected):
  assert reshard_lib.transfer_grid(target, source, target_devices) == expected


def test_sampler_on_a_disjoint_mesh_generates_what_the_unsharded_model_does(trained):
  state, values = trained
  placement = mesh_lib.make_placement(mesh_lib.mesh_config(
    ici=dict(fsdp=2, tensor=2), sampler_devices=4, sampler_ici=dict(data=2, tensor=2)))
  moved, _ = reshard_lib.reshard_state(state, placement.sample_mesh, placement.sample_rules)
  model = nnx.merge(nnx.graphdef(CausalLM(_CONFIG, rngs=nnx.Rngs(0))), moved)
  prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10]]
  sharded = Sampler(model, max_prompt_len=16, mesh=placement.sample_mesh,
                    rules=placement.sample_rules)
  plain = Sampler(model, max_prompt_len=16)
  host_state = jax.tree.map(jnp.asarray, values)
  out = sharded.generate(moved, prompts, max_new_tokens=6, greedy=True)
  ref = plain.generate(host_state, prompts, max_new_tokens=6, greedy=True)
  np.testing.assert_array_equal(np.asarray(out.completion_tokens),
                                np.asarray(ref.completion_tokens))
  np.testing.assert_allclose(np.asarray(out.logp), np.asarray(ref.logp), atol=1e-5)
