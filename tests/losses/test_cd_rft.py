"""CD-RFT (arXiv 2608.08224): component ids, control matrix, SCB, and the first-order penalty."""

import doctest
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxrl_post.losses import cd_rft
from jaxrl_post.losses.cd_rft import (
  activation_concentration,
  cd_rft_penalty,
  component_ids,
  control_gap,
  control_matrix,
  scb,
)
from jaxrl_post.losses.regularizers import REGULARIZERS
from jaxrl_post.models import CausalLM, get_model_config


def test_doctests():
  assert doctest.testmod(cd_rft, raise_on_error=True).attempted >= 10


def test_registered():
  assert REGULARIZERS.get("cd_rft") is cd_rft_penalty


def _np_scb(k):
  """Mean pairwise cosine over f ≠ f' of the columns of |K| (loops; zero columns give 0)."""
  k = np.abs(np.asarray(k, np.float64))
  m, f = k.shape
  total = 0.0
  for a, b in itertools.permutations(range(f), 2):
    na, nb = np.linalg.norm(k[:, a]), np.linalg.norm(k[:, b])
    total += 0.0 if na == 0 or nb == 0 else float(k[:, a] @ k[:, b]) / (na * nb)
  return total / (f * (f - 1))


def test_scb_identical_columns_is_one_and_disjoint_support_is_zero():
  col = np.array([0.5, -2.0, 0.0, 1.0], np.float32)
  same = np.stack([col, -3.0 * col, 0.1 * col], axis=1)  # scale and sign do not matter.
  np.testing.assert_allclose(scb(same), 1.0, rtol=1e-6)
  disjoint = np.array([[1.0, 0.0, 0.0], [2.0, 0.0, 0.0], [0.0, -1.0, 0.0], [0.0, 0.0, 4.0]])
  assert float(scb(disjoint)) == 0.0


def test_scb_golden_by_hand():
  k = jnp.array([[1.0, -2.0, 0.0], [2.0, 0.0, 0.0], [-2.0, 1.0, 1.0]])
  # |columns| (1,2,2), (2,0,1), (0,0,1): cosines 4/(3√5), 2/3, 1/√5.
  want = (4 / (3 * np.sqrt(5)) + 2 / 3 + 1 / np.sqrt(5)) / 3
  np.testing.assert_allclose(scb(k), want, rtol=1e-6)
  np.testing.assert_allclose(scb(k[:, :2]), 4 / (3 * np.sqrt(5)), rtol=1e-6)
  rng = np.random.default_rng(0)
  for _ in range(3):
    k = rng.normal(size=(6, 4)) * (rng.random((6, 4)) < 0.6)
    k[:, 3] = 0.0  # an all-zero column is finite, with cosine 0.
    np.testing.assert_allclose(scb(jnp.asarray(k, jnp.float32)), _np_scb(k), rtol=1e-5)


def test_activation_concentration_and_gap():
  a = jnp.array([[1.0, 1.0], [0.0, 1.0]])
  np.testing.assert_allclose(activation_concentration(a), 1 / np.sqrt(2), rtol=1e-6)
  np.testing.assert_allclose(control_gap(activation_concentration(a), scb(jnp.eye(2))),
                             1 / np.sqrt(2), rtol=1e-6)


def test_family_axis_errors():
  with pytest.raises(ValueError, match="family axis"):
    scb(jnp.ones((4, 1)))
  with pytest.raises(ValueError, match="family axis"):
    activation_concentration(jnp.ones((4, 1)))
  with pytest.raises(ValueError, match=r"\[M, F\]"):
    scb(jnp.ones(4))
  params = {"a": jnp.ones(3)}
  ids = {"a": np.int32(0)}
  with pytest.raises(ValueError, match="family_grads"):
    cd_rft_penalty(params, params, [{"a": jnp.ones(3)}], ids, 1)
  with pytest.raises(ValueError, match="family_grads"):
    control_matrix({"a": jnp.ones((2, 4))}, params, ids, 1)
  with pytest.raises(ValueError, match="family_grads"):
    control_matrix({"b": jnp.ones((2, 3))}, params, ids, 1)
  with pytest.raises(ValueError, match="family_grads"):
    control_matrix([], params, ids, 1)
  with pytest.raises(ValueError, match="num_components"):
    control_matrix({"a": jnp.ones((2, 3))}, params, ids, 0)
  with pytest.raises(ValueError, match="ids"):
    control_matrix({"a": jnp.ones((2, 3))}, params, {"a": np.zeros(2, np.int32)}, 1)


# ---------------------------------------------------------------------------------------------
# A tiny parameter tree: two unrolled layers, plus excluded leaves.
# ---------------------------------------------------------------------------------------------


def _tree(rng, lead=()):
  def arr(*shape):
    return jnp.asarray(rng.normal(size=(*lead, *shape)), jnp.float32)

  return {"embed": arr(5, 3),
          "layers": [{"attn": {"q": arr(3, 2), "norm": arr(2)}, "mlp": {"up": arr(3, 4)},
                      "input_norm": arr(3)} for _ in range(2)]}


def _np_control(grads, delta, ids, m):
  """K[c, f] by loops over flat parameter entries."""
  flat_d = [np.asarray(x, np.float64).ravel() for x in jax.tree.leaves(delta)]
  flat_i = [np.broadcast_to(i, np.shape(d)).ravel()
            for i, d in zip(jax.tree.leaves(ids), jax.tree.leaves(delta))]
  k = np.zeros((m, len(grads)))
  for f, g in enumerate(grads):
    for gl, dl, il in zip(jax.tree.leaves(g), flat_d, flat_i):
      for gv, dv, c in zip(np.asarray(gl, np.float64).ravel(), dl, il):
        if 0 <= c < m:
          k[c, f] += gv * dv
  return k


def _np_dscb_dk(k):
  """∂SCB/∂K by hand: SCB = Σ_{f≠f'} u_f·u_f' / (F(F−1)), u_f = |K_f|/‖K_f‖."""
  m, f = k.shape
  a = np.abs(k)
  norms = np.linalg.norm(a, axis=0)
  u = a / norms
  out = np.zeros_like(k)
  for j in range(f):
    others = sum(u[:, o] for o in range(f) if o != j)
    du = 2.0 / (f * (f - 1)) * others  # ∂SCB/∂u_j.
    dk = (du - u[:, j] * (u[:, j] @ du)) / norms[j]  # through u = a/‖a‖.
    out[:, j] = np.sign(k[:, j]) * dk
  return out


def test_control_matrix_golden_and_jit():
  rng = np.random.default_rng(1)
  params, ref = _tree(rng), _tree(rng)
  delta = jax.tree.map(lambda p, r: p - r, params, ref)
  grads = [_tree(rng) for _ in range(3)]
  ids, m, names = component_ids(params)
  assert m == 4 and names == ["layers/0/attn", "layers/0/mlp", "layers/1/attn", "layers/1/mlp"]
  assert int(ids["embed"]) == -1 and int(ids["layers"][1]["input_norm"]) == -1
  assert int(ids["layers"][1]["attn"]["norm"]) == 2
  want = _np_control(grads, delta, ids, m)
  np.testing.assert_allclose(control_matrix(grads, delta, ids, m), want, rtol=1e-5, atol=1e-5)
  stacked = jax.tree.map(lambda *g: jnp.stack(g), *grads)
  jitted = jax.jit(control_matrix, static_argnames="num_components")
  np.testing.assert_allclose(jitted(stacked, delta, ids, m), want, rtol=1e-5, atol=1e-5)


def test_penalty_gradient_is_the_first_order_proxy():
  rng = np.random.default_rng(2)
  params, ref = _tree(rng), _tree(rng)
  grads = [_tree(rng) for _ in range(3)]
  ids, m, _ = component_ids(params)
  gamma = 0.1

  def loss(p, g):
    return cd_rft_penalty(p, ref, g, ids, m, gamma=gamma)[0]

  value, (dparams, dgrads) = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(params, grads)
  delta = jax.tree.map(lambda p, r: np.asarray(p, np.float64) - np.asarray(r, np.float64),
                       params, ref)
  k = _np_control(grads, delta, ids, m)
  np.testing.assert_allclose(value, gamma * _np_scb(k), rtol=1e-5)
  dk = _np_dscb_dk(k)
  # ∂/∂θ_i = γ Σ_f ∂SCB/∂K[c(i), f] g_f,i; zero on excluded leaves.
  for path, dp in jax.tree_util.tree_flatten_with_path(dparams)[0]:
    i = np.broadcast_to(_at(ids, path), dp.shape)
    want = np.zeros(dp.shape)
    for f, g in enumerate(grads):
      gv = np.asarray(_at(g, path), np.float64)
      want += np.where(i >= 0, dk[np.maximum(i, 0), f], 0.0) * gv
    np.testing.assert_allclose(dp, gamma * want, rtol=1e-4, atol=1e-6)
  assert float(jnp.abs(dparams["layers"][0]["mlp"]["up"]).max()) > 1e-4
  assert not dparams["embed"].any()
  # No gradient reaches the family gradients (stop-gradient: a first-order proxy).
  assert all(not x.any() for x in jax.tree.leaves(dgrads))


def _at(tree, path):
  for entry in path:
    tree = tree[entry.key if hasattr(entry, "key") else entry.idx]
  return tree


def test_ids_as_traced_arguments_under_jit():
  rng = np.random.default_rng(3)
  params, ref = _tree(rng), _tree(rng)
  grads = jax.tree.map(lambda *g: jnp.stack(g), *[_tree(rng) for _ in range(2)])
  ids, m, _ = component_ids(params)
  eager = cd_rft_penalty(params, ref, grads, ids, m)
  jitted = jax.jit(cd_rft_penalty, static_argnames=("num_components",))(params, ref, grads, ids,
                                                                        m)
  np.testing.assert_allclose(jitted[0], eager[0], rtol=1e-6)
  np.testing.assert_allclose(jitted[1]["control_matrix"], eager[1]["control_matrix"], rtol=1e-6)
  assert eager[1]["control_matrix"].shape == (4, 2)
  np.testing.assert_allclose(eager[0], 0.01 * eager[1]["scb"], rtol=1e-6)


def test_component_ids_granularities_and_errors():
  params = _tree(np.random.default_rng(0))
  ids, m, names = component_ids(params, others="separate")
  assert m == 7 and names[0] == "embed" and "layers/1/input_norm" in names
  ids, m, names = component_ids(params, granularity="leaf")
  assert m == len(jax.tree.leaves(params)) and len(set(names)) == m
  assert sorted(int(i) for i in jax.tree.leaves(ids)) == list(range(m))
  with pytest.raises(ValueError, match="granularity"):
    component_ids(params, granularity="head")
  with pytest.raises(ValueError, match="others"):
    component_ids(params, others="drop")


def test_tiny_model_stacked_matches_unrolled():
  def shapes(scan):
    model = nnx.eval_shape(
      lambda: CausalLM(get_model_config("tiny", scan_layers=scan), rngs=nnx.Rngs(0)))
    return nnx.to_pure_dict(nnx.state(model, nnx.Param))

  unrolled, stacked_shapes = shapes(False), shapes(True)
  ids_u, m_u, names_u = component_ids(unrolled)
  ids_s, m_s, names_s = component_ids(stacked_shapes)
  assert m_u == m_s == 4 and names_u == names_s
  assert ids_s["layers"]["attn"]["q_proj"].shape == (2, 1, 1, 1)
  assert ids_s["layers"]["attn"]["q_proj"].ravel().tolist() == [0, 2]
  assert int(ids_s["layers"]["input_norm"]["scale"]) == -1
  rng = np.random.default_rng(4)

  def fill(tree):
    return jax.tree.map(lambda s: jnp.asarray(rng.normal(size=s.shape), jnp.float32), tree)

  delta_u, grads_u = fill(unrolled), [fill(unrolled) for _ in range(2)]

  def stack(tree):
    layers = tree["layers"]
    return {**tree, "layers": jax.tree.map(lambda *x: jnp.stack(x), *[layers[i] for i in (0, 1)])}

  k_u = control_matrix(grads_u, delta_u, ids_u, m_u)
  k_s = control_matrix([stack(g) for g in grads_u], stack(delta_u), ids_s, m_s)
  np.testing.assert_allclose(k_s, k_u, rtol=1e-5, atol=1e-4)
  assert float(jnp.abs(k_u).min()) > 0


def test_sharded_parameters_match_single_device():
  """K sums over parameter entries: FSDP-style sharded leaves give the single-device K."""
  assert jax.device_count() == 8, "tests/conftest.py should give 8 fake CPU devices"
  mesh = Mesh(np.array(jax.devices()), ("data",))
  rng = np.random.default_rng(5)
  delta = {"layers": {"attn": {"q": rng.normal(size=(2, 4, 8))},
                      "mlp": {"up": rng.normal(size=(2, 16))}},
           "embed": rng.normal(size=(3, 8))}
  delta = jax.tree.map(lambda x: np.asarray(x, np.float32), delta)
  grads = jax.tree.map(lambda x: np.asarray(rng.normal(size=(3, *x.shape)), np.float32), delta)
  ids, m, _ = component_ids(delta)
  fn = jax.jit(lambda g, d: cd_rft_penalty(d, jax.tree.map(jnp.zeros_like, d), g, ids, m))
  single = fn(*jax.device_put((grads, delta), jax.devices()[0]))

  def last_axis(x):  # shard every leaf's last axis (size 8 or 16) across the 8 devices.
    return NamedSharding(mesh, P(*([None] * (x.ndim - 1)), "data"))

  shard_d, shard_g = jax.tree.map(last_axis, delta), jax.tree.map(last_axis, grads)
  d_sh, g_sh = jax.device_put(delta, shard_d), jax.device_put(grads, shard_g)
  assert len(d_sh["embed"].sharding.device_set) == 8
  out = fn(g_sh, d_sh)
  np.testing.assert_allclose(out[1]["control_matrix"], single[1]["control_matrix"], rtol=1e-5)
  np.testing.assert_allclose(out[0], single[0], rtol=1e-5)
