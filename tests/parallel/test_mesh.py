"""Meshes from config, rule tables, born-sharded init, batch collectives, distributed env."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import AxisType, PartitionSpec

from jaxrl_post.models import CausalLM, get_model_config
from jaxrl_post.parallel import DEFAULT_RULES, axes
from jaxrl_post.parallel import mesh as mesh_lib
from jaxrl_post.parallel.axes import state_shardings


def _ids(mesh):
  return np.vectorize(lambda d: d.id)(mesh.devices)


# ---- config → mesh ----


def test_mesh_config_has_one_key_per_axis_and_layer():
  config = mesh_lib.mesh_config(ici=dict(tensor=2, fsdp=-1))
  assert tuple(config.mesh_axes) == ("data", "fsdp", "tensor")
  assert (config.ici_data, config.ici_fsdp, config.ici_tensor) == (1, -1, 2)
  assert (config.dcn_data, config.dcn_fsdp, config.dcn_tensor) == (-1, 1, 1)
  assert (config.train_rules, config.sample_rules, config.sampler_devices) == (
    "fsdp_tensor", "tensor", 0)
  with pytest.raises(ValueError, match=r"ici names axes \['model'\]"):
    mesh_lib.mesh_config(ici=dict(model=2))


def test_auto_size_fills_the_devices_and_axes_are_auto():
  mesh = mesh_lib.make_mesh(mesh_lib.mesh_config())
  assert dict(mesh.shape) == {"data": 1, "fsdp": 8, "tensor": 1}
  assert mesh.axis_types == (AxisType.Auto,) * 3
  mesh = mesh_lib.make_mesh(mesh_lib.mesh_config(ici=dict(data=2, fsdp=-1, tensor=2)))
  assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
  assert sorted(_ids(mesh).ravel()) == list(range(8))


@pytest.mark.parametrize("ici, message", [
  (dict(fsdp=3), r"config\.mesh\.ici_fsdp=3 .* multiply to 3, but there are 8 devices"),
  (dict(fsdp=3, tensor=-1), r"do(es)? not divide the 8 devices .* config\.mesh\.ici_tensor"),
  (dict(fsdp=-1, tensor=-1), r"only one of config\.mesh\.ici_fsdp, config\.mesh\.ici_tensor"),
  (dict(fsdp=0), r"config\.mesh\.ici_fsdp=0: mesh sizes must be ≥ 1 or -1"),
])
def test_bad_sizes_name_the_config_key(ici, message):
  with pytest.raises(ValueError, match=message):
    mesh_lib.make_mesh(mesh_lib.mesh_config(ici=ici))


def test_a_size_for_an_axis_outside_mesh_axes_is_an_error():
  config = mesh_lib.mesh_config(ici=dict(fsdp=2, tensor=-1))
  config.mesh_axes = ("data", "tensor")  # as `--config.mesh.mesh_axes` would
  with pytest.raises(ValueError, match=r"config\.mesh\.ici_fsdp=2 names an axis"):
    mesh_lib.make_mesh(config)


def test_dcn_axes_are_outer_and_keep_each_slice_contiguous():
  # Two "slices" of four devices: data across slices, fsdp × tensor inside.
  config = mesh_lib.mesh_config(ici=dict(fsdp=2, tensor=2), dcn=dict(data=-1), num_slices=2)
  mesh = mesh_lib.make_mesh(config)
  assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
  ids = _ids(mesh)
  assert sorted(ids[0].ravel()) == [0, 1, 2, 3] and sorted(ids[1].ravel()) == [4, 5, 6, 7]
  # fsdp split across slices instead: fsdp = dcn 2 × ici 2, slice-major.
  config = mesh_lib.mesh_config(ici=dict(fsdp=2, tensor=2), dcn=dict(fsdp=2), num_slices=2)
  ids = _ids(mesh_lib.make_mesh(config))
  assert sorted(ids[0, :2].ravel()) == [0, 1, 2, 3]
  with pytest.raises(ValueError, match=r"config\.mesh\.dcn_data=1 .* multiply to 1, but there "
                                       r"are 2 slices"):
    mesh_lib.make_mesh(mesh_lib.mesh_config(dcn=dict(data=1), num_slices=2))


def test_placement_colocated_and_disaggregated():
  placement = mesh_lib.make_placement(mesh_lib.mesh_config(ici=dict(fsdp=-1, tensor=2)))
  assert placement.colocated and placement.train_rules == tuple(DEFAULT_RULES)
  assert placement.sample_rules == mesh_lib.SAMPLE_RULES
  config = mesh_lib.mesh_config(sampler_devices=2, sampler_ici=dict(tensor=-1),
                                train_rules="replicated")
  placement = mesh_lib.make_placement(config)
  assert not placement.colocated
  assert sorted(_ids(placement.train_mesh).ravel()) == [0, 1, 2, 3, 4, 5]
  assert sorted(_ids(placement.sample_mesh).ravel()) == [6, 7]
  assert dict(placement.sample_mesh.shape) == {"data": 1, "fsdp": 1, "tensor": 2}
  assert placement.train_rules == mesh_lib.REPLICATED_RULES
  config.sampler_devices = 8
  with pytest.raises(ValueError, match=r"config\.mesh\.sampler_devices=8 must leave"):
    mesh_lib.make_placement(config)


def test_rule_tables_by_name_or_as_pairs():
  assert mesh_lib.get_rules("tensor") == mesh_lib.SAMPLE_RULES
  with pytest.raises(ValueError, match=r"config\.mesh\.train_rules: unknown sharding rule "
                                       r"table 'fsdp'; valid names: fsdp_tensor, replicated"):
    mesh_lib.get_rules("fsdp", key="config.mesh.train_rules")
  custom = mesh_lib.get_rules([("batch", ["data"]), ("embed", "fsdp"), ("vocab", None)])
  assert custom == (("batch", ("data",)), ("embed", "fsdp"), ("vocab", None))
  config = mesh_lib.mesh_config(train_rules=custom)
  assert mesh_lib.get_rules(config.train_rules) == custom
  with pytest.raises(ValueError, match="each rule is"):
    mesh_lib.get_rules([("batch",)])


def test_sampling_rules_keep_weights_whole_along_embed():
  mesh = mesh_lib.make_mesh(mesh_lib.mesh_config(ici=dict(fsdp=2, tensor=4)))
  shape = (64, 8, 16)
  names = (axes.EMBED, axes.HEADS, axes.HEAD_DIM)
  assert axes.logical_to_spec(names, DEFAULT_RULES, mesh, shape) == PartitionSpec(
    "fsdp", "tensor", None)
  assert axes.logical_to_spec(names, mesh_lib.SAMPLE_RULES, mesh, shape) == PartitionSpec(
    None, "tensor", None)
  assert axes.logical_to_spec(names, mesh_lib.REPLICATED_RULES, mesh, shape) == PartitionSpec(
    None, None, None)


# ---- born-sharded init ----


def _make_tiny(**overrides):
  config = get_model_config("tiny", **overrides)
  return lambda: CausalLM(config, rngs=nnx.Rngs(0))


def test_init_sharded_places_every_parameter_and_matches_unsharded_init():
  make = _make_tiny()
  mesh = mesh_lib.make_mesh(mesh_lib.mesh_config(ici=dict(fsdp=4, tensor=2)))
  model = mesh_lib.init_sharded(make, mesh)
  state = nnx.state(model)
  expected = state_shardings(state, mesh)
  for (path, variable), (_, sharding) in zip(nnx.to_flat_state(state),
                                            nnx.to_flat_state(expected)):
    assert variable.get_value().sharding == sharding.get_value(), path
  assert model.layers[0].mlp.gate_proj.get_value().sharding.spec == PartitionSpec("fsdp",
                                                                                  "tensor")
  # Same numbers as the unsharded initialiser (partitionable threefry).
  reference = jax.jit(lambda: nnx.split(make())[1])()
  for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(reference)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_born_sharded_init_never_holds_the_whole_model_on_a_device():
  # vocab 4096 × embed 256 dominates: 4 MiB of float32 embedding + lm_head.
  make = _make_tiny(vocab_size=4096, embed_dim=256, num_heads=8, num_kv_heads=8, head_dim=32,
                    mlp_dim=512)
  mesh = mesh_lib.make_mesh(mesh_lib.mesh_config())  # fsdp = 8
  _, abstract = mesh_lib.abstract_module(make)
  total = sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(abstract))
  _, init = mesh_lib.sharded_initializer(make, mesh, DEFAULT_RULES)
  stats = init.lower().compile().memory_analysis()
  # Outputs are the shards: 1/8 of the model, plus the replicated norm scales.
  assert stats.output_size_in_bytes < total / 8 * 1.05
  # Shards plus every temporary stay under half the model (measured: 1.7 MB of
  # outputs + 3.0 MB of temporaries against 13.6 MB; unsharded, 23.9 MB of
  # temporaries).
  used = stats.output_size_in_bytes + stats.temp_size_in_bytes
  assert used < total / 2, (stats.output_size_in_bytes, stats.temp_size_in_bytes, total)


# ---- shard_map collectives ----


def test_batch_axes_follow_the_rules():
  mesh = mesh_lib.make_mesh(mesh_lib.mesh_config(ici=dict(data=2, fsdp=2, tensor=2)))
  assert mesh_lib.batch_mesh_axes(mesh, DEFAULT_RULES) == ("data", "fsdp")
  assert mesh_lib.batch_mesh_axes(mesh, mesh_lib.REPLICATED_RULES) == ("data", "fsdp", "tensor")
  tensor_only = mesh_lib.make_mesh(mesh_lib.mesh_config(ici=dict(tensor=-1)))
  assert mesh_lib.batch_mesh_axes(tensor_only, DEFAULT_RULES) == ()
  assert mesh_lib.batch_sharding(mesh, DEFAULT_RULES, 2).spec == PartitionSpec(("data", "fsdp"),
                                                                               None)


def test_put_batch_splits_rows_it_divides_and_replicates_the_rest():
  mesh = mesh_lib.make_mesh(mesh_lib.mesh_config(ici=dict(data=2, fsdp=4)))
  batch = {"tokens": np.arange(16).reshape(8, 2), "adv": np.ones(4, np.float32),
           "odd": np.zeros((3, 5)), "num_tokens": np.float32(12)}
  placed = mesh_lib.put_batch(batch, mesh)
  assert placed["tokens"].sharding.spec == PartitionSpec(("data", "fsdp"), None)
  # 4 rows: `data` divides them, `data` × `fsdp` does not; 3 rows: neither.
  assert placed["adv"].sharding.spec == PartitionSpec("data")
  assert placed["odd"].sharding.spec == PartitionSpec(None, None)
  assert placed["num_tokens"].sharding.spec == PartitionSpec()
  for key, value in batch.items():
    np.testing.assert_array_equal(np.asarray(placed[key]), value)
  # From other devices (a disaggregated sampler's rollout) onto this mesh.
  other = mesh_lib.make_mesh(mesh_lib.mesh_config(ici=dict(data=4)), devices=jax.devices()[4:])
  moved = mesh_lib.put_batch(mesh_lib.put_batch(batch, other), mesh)
  assert moved["tokens"].sharding == placed["tokens"].sharding
  np.testing.assert_array_equal(np.asarray(moved["tokens"]), batch["tokens"])


def _uneven_batch():
  # Row r keeps r + 1 tokens: shards hold very different token counts, so a
  # mean of per-shard means would differ from the global token-mean.
  rng = np.random.default_rng(0)
  values = rng.normal(size=(8, 8)).astype(np.float32)
  mask = np.arange(8)[None, :] <= np.arange(8)[:, None]
  return values, mask


@pytest.mark.parametrize("ici", [dict(data=2, fsdp=2, tensor=2), dict(fsdp=8), dict(tensor=8)])
def test_token_mean_and_count_are_global_under_sharding(ici):
  mesh = mesh_lib.make_mesh(mesh_lib.mesh_config(ici=ici))
  values, mask = _uneven_batch()
  expected = (values * mask).sum() / mask.sum()  # the single-device token-mean
  sharding = mesh_lib.batch_sharding(mesh, DEFAULT_RULES, 2)
  v, m = jax.device_put(values, sharding), jax.device_put(mask, sharding)
  count = mesh_lib.global_token_count(m, mesh)
  assert int(count) == mask.sum() == 36
  mean = jax.jit(lambda v, m: mesh_lib.token_mean(v, m, mesh))(v, m)
  np.testing.assert_allclose(float(mean), expected, rtol=1e-5, atol=1e-7)
  shards = int(np.prod([mesh.shape[a] for a in mesh_lib.batch_mesh_axes(mesh)]))
  if shards > 1:  # the naive mean of per-shard means really is different
    rows = np.split(np.arange(8), shards)
    per_shard = [(values[r] * mask[r]).sum() / mask[r].sum() for r in rows]
    assert abs(np.mean(per_shard) - expected) > 1e-3


def test_batch_psum_works_on_pytrees_inside_grad():
  mesh = mesh_lib.make_mesh(mesh_lib.mesh_config(ici=dict(data=2, fsdp=4)))
  values, mask = _uneven_batch()

  def loss(v):
    return mesh_lib.token_mean(v * v, jnp.asarray(mask), mesh)

  sharding = mesh_lib.batch_sharding(mesh, DEFAULT_RULES, 2)
  grad = jax.jit(jax.grad(loss))(jax.device_put(values, sharding))
  np.testing.assert_allclose(np.asarray(grad), 2 * values * mask / mask.sum(), rtol=1e-6)
  sums = mesh_lib.batch_psum(lambda v, m: {"n": m.sum(), "s": (v * m).sum()}, mesh)(
    jnp.asarray(values), jnp.asarray(mask, jnp.float32))
  np.testing.assert_allclose(float(sums["s"]), (values * mask).sum(), rtol=1e-5)


# ---- jax.distributed ----


def test_distributed_kwargs_from_the_launchers_environment():
  assert mesh_lib.distributed_kwargs({}) is None
  assert mesh_lib.maybe_initialize_distributed({}) is False
  assert mesh_lib.distributed_kwargs({"JAXRL_POST_DISTRIBUTED": "1"}) == {}
  env = {"JAX_COORDINATOR_ADDRESS": "node7:1234", "JAX_NUM_PROCESSES": "4",
         "JAX_PROCESS_ID": "2"}
  assert mesh_lib.distributed_kwargs(env) == dict(coordinator_address="node7:1234",
                                                  num_processes=4, process_id=2)
  with pytest.raises(ValueError, match="JAX_PROCESS_ID is not"):
    mesh_lib.distributed_kwargs({"JAX_COORDINATOR_ADDRESS": "a:1", "JAX_NUM_PROCESSES": "2"})
