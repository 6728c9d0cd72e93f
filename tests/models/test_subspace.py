"""GCPO (arXiv 2608.11674): subspace bases, constrained LoRA deltas, block energies, overlap."""

import doctest

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxrl_post.models import CausalLM, get_model_config, subspace
from jaxrl_post.models.subspace import (
  SUBSPACE_CONSTRAINTS,
  LoraFactors,
  SubspaceBases,
  four_block_energies,
  gcpo_apply,
  gcpo_delta,
  gcpo_init,
  gcpo_linear,
  overlap_null,
  principal_bases,
  principal_overlap,
  update_overlap,
)

MODES = ("bilateral", "left", "right", "principal", "none")


def test_doctests():
  assert doctest.testmod(subspace, raise_on_error=True).attempted >= 15


def test_registry_has_the_ablation_modes():
  assert SUBSPACE_CONSTRAINTS.names() == sorted(MODES)
  with pytest.raises(KeyError, match="bilateral"):
    SUBSPACE_CONSTRAINTS.get("both")


def _problem(seed=0, d_in=9, d_out=7, k=3, r=4, lead=()):
  rng = np.random.default_rng(seed)
  kernel = rng.normal(size=(*lead, d_in, d_out)).astype(np.float32)
  a = rng.normal(size=(*lead, d_in, r)).astype(np.float32)
  b = rng.normal(size=(*lead, r, d_out)).astype(np.float32)
  return kernel, a, b


def _np_projectors(kernel, k):
  """Paper layout: W = Kᵀ = Φ Σ Ψᵀ; returns (Π_Φ [d_out, d_out], Π_Ψ [d_in, d_in]) in float64."""
  u, _, vt = np.linalg.svd(np.asarray(kernel, np.float64).T)
  phi, psi = u[:, :k], vt[:k].T
  return phi @ phi.T, psi @ psi.T


def _np_delta_w(a, b, kernel, k, scale, mode):
  """δW (paper layout [d_out, d_in]) = s · P_L L R P_R, L = bᵀ, R = aᵀ, explicit projectors."""
  pphi, ppsi = _np_projectors(kernel, k)
  eye_o, eye_i = np.eye(pphi.shape[0]), np.eye(ppsi.shape[0])
  left = {"bilateral": eye_o - pphi, "left": eye_o - pphi, "right": eye_o, "principal": pphi,
          "none": eye_o}[mode]
  right = {"bilateral": eye_i - ppsi, "left": eye_i, "right": eye_i - ppsi, "principal": ppsi,
           "none": eye_i}[mode]
  lf, rf = np.asarray(b, np.float64).T, np.asarray(a, np.float64).T
  return scale * left @ lf @ rf @ right


def test_principal_bases_match_numpy_svd_projectors():
  kernel, _, _ = _problem()
  bases = principal_bases(jnp.asarray(kernel), k=3)
  assert bases.phi.shape == (7, 3) and bases.psi.shape == (9, 3)
  np.testing.assert_allclose(bases.phi.T @ bases.phi, np.eye(3), atol=1e-5)
  np.testing.assert_allclose(bases.psi.T @ bases.psi, np.eye(3), atol=1e-5)
  pphi, ppsi = _np_projectors(kernel, 3)
  np.testing.assert_allclose(bases.phi @ bases.phi.T, pphi, atol=1e-5)
  np.testing.assert_allclose(bases.psi @ bases.psi.T, ppsi, atol=1e-5)


def test_host_bases_match_device_bases():
  kernel, _, _ = _problem(lead=(2,))
  dev, host = principal_bases(jnp.asarray(kernel), k=3), subspace.host_principal_bases(kernel, 3)
  assert host.phi.shape == (2, 7, 3) and host.psi.shape == (2, 9, 3)
  for d, h in zip(dev, host):
    np.testing.assert_allclose(h @ jnp.swapaxes(h, -1, -2), d @ jnp.swapaxes(d, -1, -2),
                               atol=1e-5)


@pytest.mark.parametrize("k", [0, 8, -1, 2.0])
def test_principal_bases_k_errors(k):
  kernel, _, _ = _problem(d_in=9, d_out=7)
  with pytest.raises(ValueError, match="k must be"):
    principal_bases(jnp.asarray(kernel), k=k)
  with pytest.raises(ValueError, match="k must be"):
    subspace.host_principal_bases(kernel, k)


@pytest.mark.parametrize("mode", MODES)
def test_delta_matches_explicit_projector_formula(mode):
  kernel, a, b = _problem()
  bases = principal_bases(jnp.asarray(kernel), k=3)
  got = gcpo_delta(jnp.asarray(a), jnp.asarray(b), bases, alpha=16.0, rank=4, mode=mode)
  want = _np_delta_w(a, b, kernel, 3, 16.0 / 4, mode).T  # δK = δWᵀ.
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_bilateral_constraints_hold_and_one_sided_modes_only_protect_one_side():
  kernel, a, b = _problem(d_in=32, d_out=24, k=4, r=8)
  bases = principal_bases(jnp.asarray(kernel), k=4)
  phi, psi = bases
  # LoRA-sized factors (δW entries O(0.1)): float32 rounding then stays far below 1e-5.
  a, b = 0.1 * jnp.asarray(a), 0.1 * jnp.asarray(b)

  def sides(mode):
    d = gcpo_delta(a, b, bases, alpha=16.0, rank=8, mode=mode)
    assert float(jnp.abs(d).max()) > 0.05
    # Φᵀ δW = (δK Φ)ᵀ, δW Ψ = (Ψᵀ δK)ᵀ.
    return float(jnp.abs(d @ phi).max()), float(jnp.abs(psi.T @ d).max())

  out_side, in_side = sides("bilateral")
  assert out_side < 1e-5 and in_side < 1e-5
  out_side, in_side = sides("left")
  assert out_side < 1e-5 and in_side > 1e-3
  out_side, in_side = sides("right")
  assert out_side > 1e-3 and in_side < 1e-5
  out_side, in_side = sides("none")
  assert out_side > 1e-3 and in_side > 1e-3


def test_alpha_over_rank_scaling():
  kernel, a, b = _problem(r=4)
  bases = principal_bases(jnp.asarray(kernel), k=3)
  a, b = jnp.asarray(a), jnp.asarray(b)
  base = gcpo_delta(a, b, bases, alpha=1.0, rank_scaled=False)  # s = 1.
  np.testing.assert_allclose(gcpo_delta(a, b, bases, alpha=16.0, rank=4), 4.0 * base, rtol=1e-5,
                             atol=1e-5)
  np.testing.assert_allclose(gcpo_delta(a, b, bases, alpha=16.0, rank_scaled=False), 16.0 * base,
                             rtol=1e-5, atol=1e-5)
  # Doubling r with the same α halves s: duplicate the factors' columns/rows (a b doubles).
  a2, b2 = jnp.concatenate([a, a], -1), jnp.concatenate([b, b], -2)
  np.testing.assert_allclose(gcpo_delta(a2, b2, bases, alpha=16.0),
                             gcpo_delta(a, b, bases, alpha=16.0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["bilateral", "left", "principal"])
def test_gcpo_linear_equals_dense_product(mode):
  kernel, a, b = _problem()
  bases = principal_bases(jnp.asarray(kernel), k=3)
  x = jnp.asarray(np.random.default_rng(1).normal(size=(2, 5, 9)), jnp.float32)
  y = gcpo_linear(x, jnp.asarray(kernel), jnp.asarray(a), jnp.asarray(b), bases, alpha=16.0,
                  mode=mode)
  want = np.asarray(x, np.float64) @ (kernel + _np_delta_w(a, b, kernel, 3, 4.0, mode).T)
  assert y.shape == (2, 5, 7)
  np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)


def test_energies_golden_and_sum_to_total():
  kernel, a, b = _problem(seed=3)
  bases = principal_bases(jnp.asarray(kernel), k=3)
  delta = np.random.default_rng(4).normal(size=(9, 7)).astype(np.float32)
  e = four_block_energies(jnp.asarray(delta), bases)
  pphi, ppsi = _np_projectors(kernel, 3)
  dw = delta.T.astype(np.float64)
  qphi, qpsi = np.eye(7) - pphi, np.eye(9) - ppsi
  want = [np.sum((lp @ dw @ rp) ** 2) for lp, rp in
          [(pphi, ppsi), (pphi, qpsi), (qphi, ppsi), (qphi, qpsi)]]
  np.testing.assert_allclose([float(v) for v in e], want, rtol=1e-4)
  assert all(v > 0.1 for v in want)  # every block is populated: the split is not trivial.
  np.testing.assert_allclose(sum(float(v) for v in e), np.sum(delta.astype(np.float64) ** 2),
                             rtol=1e-5)
  o = principal_overlap(jnp.asarray(delta), bases)
  np.testing.assert_allclose(o.overlap, 1 - want[3] / sum(want), rtol=1e-4)
  np.testing.assert_allclose(o.excess, 1 - want[3] / sum(want) - (1 - 6 * 4 / 63), rtol=1e-4)


def test_mode_energy_placement():
  kernel, a, b = _problem()
  bases = principal_bases(jnp.asarray(kernel), k=3)
  a, b = jnp.asarray(a), jnp.asarray(b)
  e = four_block_energies(gcpo_delta(a, b, bases, mode="principal"), bases)
  total = sum(float(v) for v in e)
  assert total > 1.0 and abs(float(e.pp) - total) < 1e-4 * total
  e = four_block_energies(gcpo_delta(a, b, bases, mode="bilateral"), bases)
  total = sum(float(v) for v in e)
  assert abs(float(e.oo) - total) < 1e-4 * total
  assert float(principal_overlap(gcpo_delta(a, b, bases), bases).overlap) < 1e-5
  e = four_block_energies(gcpo_delta(a, b, bases, mode="left"), bases)  # Π_Φ^⊥: OP + OO only.
  assert float(e.pp) < 1e-6 and float(e.po) < 1e-6 and float(e.op) > 1e-2


def test_overlap_null_matches_isotropic_monte_carlo():
  d_in, d_out, k, n = 12, 10, 3, 1000
  kernel, _, _ = _problem(d_in=d_in, d_out=d_out)
  bases = principal_bases(jnp.asarray(kernel), k=k)
  deltas = jax.random.normal(jax.random.key(0), (n, d_in, d_out))
  o = principal_overlap(deltas, bases)  # broadcasts over the leading sample axis.
  assert o.overlap.shape == (n,)
  null = overlap_null(d_in, d_out, k)
  np.testing.assert_allclose(null, 1 - 7 * 9 / 120)
  assert abs(float(o.overlap.mean()) - null) < 0.01
  assert abs(float(o.normalised.mean())) < 0.03
  assert float(principal_overlap(jnp.zeros((d_in, d_out)), bases).overlap) == 0.0


def test_stacked_layers_equal_vmap():
  kernel, a, b = _problem(lead=(3,))
  stacked = principal_bases(jnp.asarray(kernel), k=3)
  assert stacked.phi.shape == (3, 7, 3)
  for layer in range(3):
    one = principal_bases(jnp.asarray(kernel[layer]), k=3)
    np.testing.assert_allclose(stacked.phi[layer] @ stacked.phi[layer].T, one.phi @ one.phi.T,
                               atol=1e-5)
  got = gcpo_delta(jnp.asarray(a), jnp.asarray(b), stacked, alpha=16.0)
  want = jax.vmap(lambda a, b, s: gcpo_delta(a, b, s, alpha=16.0))(jnp.asarray(a),
                                                                   jnp.asarray(b), stacked)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  e = four_block_energies(got, stacked)
  assert e.oo.shape == (3,)
  np.testing.assert_allclose(e.oo, jnp.sum(got ** 2, axis=(1, 2)), rtol=1e-4)


def test_under_jit_and_gradients_flow_to_the_factors():
  kernel, a, b = _problem()
  bases = principal_bases(jnp.asarray(kernel), k=3)
  x = jnp.ones((4, 9))

  @jax.jit
  def loss(a, b, bases):
    return jnp.sum(gcpo_linear(x, jnp.asarray(kernel), a, b, bases, alpha=16.0) ** 2)

  ga, gb = jax.grad(loss, argnums=(0, 1))(jnp.asarray(a), jnp.asarray(b), bases)
  # The gradient of a projected factor lives in the complement too: Ψᵀ ∂a = 0, ∂b Φ = 0.
  assert float(jnp.abs(bases.psi.T @ ga).max()) < 1e-3 * float(jnp.abs(ga).max())
  assert float(jnp.abs(gb @ bases.phi).max()) < 1e-3 * float(jnp.abs(gb).max())
  assert float(jnp.abs(gb).max()) > 0


def test_argument_errors():
  kernel, a, b = _problem()
  bases = principal_bases(jnp.asarray(kernel), k=3)
  a, b = jnp.asarray(a), jnp.asarray(b)
  with pytest.raises(ValueError, match="rank"):
    gcpo_delta(a, b, bases, rank=5)
  with pytest.raises(ValueError, match="bases"):
    gcpo_delta(a, b, SubspaceBases(bases.psi, bases.phi))
  with pytest.raises(ValueError, match="LoRA factors"):
    gcpo_delta(a, b.T, bases)
  with pytest.raises(KeyError, match="subspace constraint"):
    gcpo_delta(a, b, bases, mode="both")
  with pytest.raises(ValueError, match="kernel"):
    gcpo_linear(jnp.ones((2, 9)), jnp.asarray(kernel).T, a, b, bases)
  with pytest.raises(ValueError, match="delta"):
    four_block_energies(jnp.ones((7, 9)), bases)


# ---------------------------------------------------------------------------------------------
# Parameter pytrees of the project's tiny model.
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_params():
  """The `tiny` preset's parameter dict (structure and shapes from `nnx.eval_shape`, so no init
  program is compiled), filled with Gaussian values."""
  model = nnx.eval_shape(lambda: CausalLM(get_model_config("tiny"), rngs=nnx.Rngs(0)))
  shapes = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  rng = np.random.default_rng(0)
  return jax.tree.map(lambda s: jnp.asarray(rng.normal(size=s.shape), jnp.float32), shapes)


def _random_b(adapters, seed):
  keys = iter(jax.random.split(jax.random.key(seed), 64))
  return jax.tree.map(lambda ad: LoraFactors(ad.a, jax.random.normal(next(keys), ad.b.shape)),
                      adapters, is_leaf=lambda x: isinstance(x, LoraFactors))


def test_tiny_model_init_apply_overlap(tiny_params):
  params = tiny_params
  bases, adapters = gcpo_init(params, rng=jax.random.key(0), k=4, rank=8)
  targeted = [p for p, v in jax.tree_util.tree_flatten_with_path(
    adapters, is_leaf=lambda x: isinstance(x, LoraFactors))[0] if v is not None]
  assert len(targeted) == 14  # 7 projections × 2 layers; embeddings and norms untouched.
  q = adapters["layers"][0]["attn"]["q_proj"]
  assert q.a.shape == (64, 8) and q.b.shape == (8, 64) and not q.b.any()  # b = 0 at init.
  assert adapters["layers"][0]["attn"]["o_proj"].a.shape == (64, 8)  # [heads·head_dim, r].
  assert adapters["embed"] is None and bases["layers"][0]["input_norm"]["scale"] is None
  apply = jax.jit(gcpo_apply, static_argnames="mode")
  same = apply(params, adapters, bases, alpha=16.0)
  assert all(jax.tree.leaves(jax.tree.map(lambda x, y: bool((x == y).all()), params, same)))

  adapters = _random_b(adapters, 1)
  merged = apply(params, adapters, bases, alpha=16.0)
  over = jax.jit(update_overlap)(params, merged, bases)
  o = over["layers"][1]["mlp"]["down_proj"]
  null = overlap_null(128, 64, 4)
  assert float(o.overlap) < 1e-4
  np.testing.assert_allclose(o.normalised, -null / (1 - null), rtol=1e-3)
  assert max(float(v.overlap) for v in jax.tree.leaves(
    over, is_leaf=lambda x: isinstance(x, subspace.Overlap)) if v is not None) < 1e-4
  np.testing.assert_array_equal(merged["embed"], params["embed"])
  # The merged q kernel is the kernel gcpo_linear applies.
  x = jax.random.normal(jax.random.key(2), (3, 64))
  w = params["layers"][0]["attn"]["q_proj"]
  ad, bs = adapters["layers"][0]["attn"]["q_proj"], bases["layers"][0]["attn"]["q_proj"]
  np.testing.assert_allclose(
    jnp.einsum("td,dnh->tnh", x, merged["layers"][0]["attn"]["q_proj"]).reshape(3, 64),
    gcpo_linear(x, w.reshape(64, 64), ad.a, ad.b, bs, alpha=16.0), rtol=1e-4, atol=1e-4)
  # "none" is plain LoRA: its update does enter the principal subspace.
  merged = apply(params, adapters, bases, mode="none")
  o = principal_overlap((merged["layers"][1]["mlp"]["down_proj"]
                         - params["layers"][1]["mlp"]["down_proj"]),
                        bases["layers"][1]["mlp"]["down_proj"])
  assert float(o.overlap) > 0.05


def test_tiny_model_stacked_layers(tiny_params):
  layers = tiny_params["layers"]
  o_proj = jnp.stack([layers[i]["attn"]["o_proj"] for i in (0, 1)])
  up_proj = jnp.stack([layers[i]["mlp"]["up_proj"] for i in (0, 1)])
  stacked = {"layers": {"attn": {"o_proj": o_proj}, "mlp": {"up_proj": up_proj}}}
  bases, adapters = gcpo_init(stacked, rng=jax.random.key(0), k=4, rank=8)
  unrolled, _ = gcpo_init(tiny_params, rng=jax.random.key(0), k=4, rank=8, host_svd=False,
                          targets=lambda path: path[-1] == "o_proj")
  sb = bases["layers"]["attn"]["o_proj"]
  assert sb.psi.shape == (2, 64, 4) and sb.phi.shape == (2, 64, 4)
  for i in (0, 1):
    ub = unrolled["layers"][i]["attn"]["o_proj"]
    np.testing.assert_allclose(sb.psi[i] @ sb.psi[i].T, ub.psi @ ub.psi.T, atol=1e-5)
  adapters = _random_b(adapters, 3)
  merged = jax.jit(gcpo_apply)(stacked, adapters, bases)
  assert merged["layers"]["attn"]["o_proj"].shape == (2, 4, 16, 64)
  o = jax.jit(update_overlap)(stacked, merged, bases)["layers"]["mlp"]["up_proj"]
  assert o.overlap.shape == (2,) and float(o.overlap.max()) < 1e-4


def test_pytree_argument_errors(tiny_params):
  with pytest.raises(ValueError, match="k must be"):
    gcpo_init(tiny_params, rng=jax.random.key(0), k=65, rank=8)
  with pytest.raises(ValueError, match="rank"):
    gcpo_init(tiny_params, rng=jax.random.key(0), k=4, rank=0)
  with pytest.raises(ValueError, match="targets"):
    gcpo_init(tiny_params, rng=jax.random.key(0), targets="q_proj")
  bases, adapters = gcpo_init(tiny_params, rng=jax.random.key(0), k=4, rank=8,
                              targets=lambda path: path[-1] == "lm_head")
  assert adapters["lm_head"].a.shape == (64, 8)
  assert adapters["layers"][0]["attn"]["q_proj"] is None


def test_sharded_matches_single_device():
  """Energies and the projections reduce over d_in: FSDP-style sharding of d_in changes nothing."""
  assert jax.device_count() == 8, "tests/conftest.py should give 8 fake CPU devices"
  mesh = Mesh(np.array(jax.devices()), ("data",))
  kernel, a, b = _problem(d_in=16, d_out=12, r=4, seed=5)
  bases = principal_bases(jnp.asarray(kernel), k=3)
  delta = np.random.default_rng(6).normal(size=(16, 12)).astype(np.float32)

  @jax.jit
  def run(a, b, bases, delta):
    return gcpo_delta(a, b, bases), four_block_energies(delta, bases), principal_overlap(delta,
                                                                                         bases)

  dev0 = jax.devices()[0]
  single = run(*jax.device_put((a, b, bases, delta), dev0))
  rows, rep = NamedSharding(mesh, P("data", None)), NamedSharding(mesh, P())
  sharded = (jax.device_put(a, rows), jax.device_put(b, rep),
             SubspaceBases(jax.device_put(bases.phi, rep), jax.device_put(bases.psi, rows)),
             jax.device_put(delta, rows))
  assert len(sharded[0].sharding.device_set) == 8
  for got, want in zip(jax.tree.leaves(run(*sharded)), jax.tree.leaves(single)):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


# ---- gcpo_projection: the constraint as the optimizer's last stage ----


def _tiny_params():
  from flax import nnx

  from jaxrl_post.models import CausalLM, get_model_config

  model = CausalLM(get_model_config("tiny", vocab_size=64), rngs=nnx.Rngs(0))
  return nnx.state(model, nnx.Param)


@pytest.mark.parametrize("mode", ["bilateral", "left", "right", "principal", "none"])
def test_gcpo_projection_keeps_the_displacement_in_its_block(mode):
  import optax

  from jaxrl_post.models.subspace import gcpo_projection

  params = _tiny_params()
  opt = optax.chain(optax.adam(1e-2), gcpo_projection(k=3, mode=mode))
  state = jax.jit(opt.init)(params)
  start = params
  rng = np.random.default_rng(0)
  for _ in range(3):
    grads = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), p.dtype), params)
    updates, state = jax.jit(opt.update)(grads, state, params)
    params = optax.apply_updates(params, updates)
  bases = state[1].bases
  w0 = start["layers"][0]["mlp"]["up_proj"].get_value()  # kernel [d_in, d_out] = W_refᵀ
  delta = np.asarray(params["layers"][0]["mlp"]["up_proj"].get_value() - w0, np.float64)
  bs = bases["layers"][0]["mlp"]["up_proj"].get_value()
  phi, psi = np.asarray(bs.phi, np.float64), np.asarray(bs.psi, np.float64)
  # Φ, Ψ are W_ref's own top-3 singular vectors (kernel = W_refᵀ: Ψ on inputs, Φ on outputs).
  u, _, vt = np.linalg.svd(np.asarray(w0, np.float64), full_matrices=False)
  np.testing.assert_allclose(np.abs(psi.T @ u[:, :3]), np.eye(3), atol=1e-4)
  np.testing.assert_allclose(np.abs(phi.T @ vt[:3].T), np.eye(3), atol=1e-4)
  out_side = np.abs(delta @ phi).max()  # δW Ψ... in kernel terms: δK Φ (output side)
  in_side = np.abs(psi.T @ delta).max()  # Ψᵀ δK (input side)
  scale = np.abs(delta).max()
  assert scale > 1e-3
  assert (out_side < 1e-5 * max(scale, 1)) == (mode in ("bilateral", "left"))
  assert (in_side < 1e-5 * max(scale, 1)) == (mode in ("bilateral", "right"))
  if mode == "principal":  # all of it inside: removing the principal block leaves nothing
    oo = delta - psi @ (psi.T @ delta)
    oo = oo - (oo @ phi) @ phi.T
    assert np.abs(oo).max() < 1e-5
  # Untargeted leaves (norms, embeddings) move freely.
  assert np.abs(np.asarray(params["embed"].get_value() - start["embed"].get_value())).max() > 1e-3
  # o_proj [heads, head_dim, embed] is viewed as [heads·head_dim, embed].
  assert bases["layers"][0]["attn"]["o_proj"].get_value().psi.shape == (64, 3)


def test_update_constraint_config_errors_name_the_key():
  import ml_collections

  from jaxrl_post.training.setup import update_constraint

  good = dict(name="gcpo", k=8, mode="bilateral", targets=("q_proj",))
  for key, value, match in (("name", "lora", "config.update_constraint.name='lora'"),
                            ("mode", "sideways", "config.update_constraint.mode='sideways'"),
                            ("k", 0, "config.update_constraint.k must be >= 1")):
    with pytest.raises(ValueError, match=match):
      update_constraint(ml_collections.ConfigDict(dict(good, **{key: value})))
