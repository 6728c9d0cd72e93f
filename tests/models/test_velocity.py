"""models/velocity.py: shapes, conditions, logical axes and sharded == single-device outputs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import Mesh

from jaxrl_post.models.velocity import VelocityMLP
from jaxrl_post.parallel.axes import axis_rules
from jaxrl_post.parallel.mesh import init_sharded


def _make():
  return VelocityMLP(6, hidden=16, depth=2, time_dim=8, num_conditions=3, rngs=nnx.Rngs(0))


def test_latent_shapes_conditions_and_axes():
  model = _make()
  x, t = jnp.ones((4, 2, 3)), jnp.linspace(0.0, 1.0, 4)
  v = model(x, t)
  assert v.shape == (4, 2, 3)
  assert not np.allclose(model(x, t, jnp.array([0, 1, 2, 0])), v)  # the condition enters
  names = {jax.tree_util.keystr(p): x.get_metadata().get("out_sharding")
           for p, x in jax.tree_util.tree_flatten_with_path(
             nnx.state(model, nnx.Param), is_leaf=lambda x: isinstance(x, nnx.Variable))[0]}
  assert names["['kernels'][1]"] == ("embed", "mlp")
  assert names["['out_kernel']"] == ("mlp", None)
  with pytest.raises(ValueError, match=r"VelocityMLP\(dim=6\) got a latent of shape \(5,\)"):
    model(jnp.ones((4, 5)), t)
  with pytest.raises(ValueError, match="time_dim=3 even"):
    VelocityMLP(2, time_dim=3, rngs=nnx.Rngs(0))


def test_sharded_params_give_the_single_device_output():
  mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("fsdp", "tensor"))
  sharded = init_sharded(_make, mesh)
  assert len(sharded.kernels[1][...].sharding.device_set) == 8
  x, t, c = jnp.ones((8, 6)), jnp.full((8,), 0.3), jnp.arange(8) % 3
  with axis_rules(mesh):
    got = jax.jit(lambda m: m(x, t, c))(sharded)
  np.testing.assert_allclose(got, _make()(x, t, c), rtol=1e-5, atol=1e-6)
