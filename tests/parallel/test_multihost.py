"""parallel.multihost in one process (the 2-process runs are in tests/experiments)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxrl_post.parallel import multihost
from jaxrl_post.parallel.mesh import distributed_kwargs


def test_one_process_is_not_multiprocess_and_to_host_is_device_get():
  assert not multihost.is_multiprocess()
  tree = {"a": jnp.arange(3), "b": None, "c": np.ones(2)}
  host = multihost.to_host(tree)
  assert isinstance(host["a"], np.ndarray) and host["b"] is None
  np.testing.assert_array_equal(host["a"], [0, 1, 2])


def test_put_global_places_the_slices_each_device_holds():
  mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("data", "tensor"))
  x = np.arange(32, dtype=np.float32).reshape(8, 4)
  placed = multihost.put_global(x, NamedSharding(mesh, PartitionSpec("data")))
  np.testing.assert_array_equal(np.asarray(placed), x)
  assert len(placed.addressable_shards) == 8
  assert placed.addressable_shards[2].data.shape == (2, 4)


def test_records_cross_as_json_with_numpy_scalars_as_python_values():
  records = [{"index": np.int64(3), "prompt": "1+2=", "answer": 3}]
  gathered = multihost.allgather_records(records)
  assert gathered == [{"index": 3, "prompt": "1+2=", "answer": 3}]
  assert type(gathered[0]["index"]) is int
  with pytest.raises(TypeError, match="cannot cross processes as JSON"):
    multihost.allgather_records([{"blob": object()}])


def test_allgather_bytes_in_one_process():
  assert multihost.allgather_bytes(b"abc") == [b"abc"]


def test_peer_failure_guard_reraises_in_one_process():
  # Only a multi-process run turns a runtime error into the peer-loss exit.
  with pytest.raises(jax.errors.JaxRuntimeError):
    with multihost.peer_failures_are_fatal():
      raise jax.errors.JaxRuntimeError("boom")


def test_heartbeat_timeout_from_the_environment():
  assert multihost.heartbeat_timeout_s({}) == 100
  assert multihost.heartbeat_timeout_s({"JAXRL_POST_HEARTBEAT_TIMEOUT_S": "7"}) == 7
  for bad in ("0", "-3", "ten"):
    with pytest.raises(ValueError, match="JAXRL_POST_HEARTBEAT_TIMEOUT_S"):
      multihost.heartbeat_timeout_s({"JAXRL_POST_HEARTBEAT_TIMEOUT_S": bad})
  assert distributed_kwargs({}) is None
