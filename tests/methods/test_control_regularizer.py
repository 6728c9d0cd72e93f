"""CD-RFT's step part (jaxrl_post/methods/control_regularizer.py): family ids, the active-family
SCB, and the wrapped loss's value and gradient against an independent NumPy computation on a toy
model (per-family gradients by hand, K by loops, ∂SCB/∂K by finite differences)."""

import doctest

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxrl_post.methods import control_regularizer as cr
from jaxrl_post.tasks.mixture import MixtureTask

D, B, T = 3, 8, 2


class Toy(nnx.Module):
  """Two components ("attn", "mlp") and an excluded leaf ("embed")."""

  def __init__(self, attn, mlp, embed):
    self.attn = nnx.Param(jnp.asarray(attn, jnp.float32))
    self.mlp = nnx.Param(jnp.asarray(mlp, jnp.float32))
    self.embed = nnx.Param(jnp.asarray(embed, jnp.float32))


def toy_policy_loss(model, batch):
  # logp_b = x·attn + ½(x·mlp)² + x·embed, the same at every token; rows weighted by the mask.
  x = batch["x"]
  logp = x @ model.attn[...] + 0.5 * (x @ model.mlp[...]) ** 2 + x @ model.embed[...]
  m = batch["completion_mask"].astype(jnp.float32)
  value = -jnp.sum(m * (batch["adv"] * logp)[:, None]) / batch["num_tokens"]
  return value, {"pg": value}


def _setup(seed=0):
  rng = np.random.default_rng(seed)
  theta0 = {k: rng.normal(size=D) for k in ("attn", "embed", "mlp")}
  theta = {k: v + rng.normal(size=D) for k, v in theta0.items()}
  mask = np.ones((B, T), bool)
  mask[1, 1] = mask[6, 0] = False
  batch = {"x": rng.normal(size=(B, D)).astype(np.float32),
           "adv": rng.normal(size=B).astype(np.float32),
           "completion_mask": mask,
           "num_tokens": np.float32(mask.sum()),
           cr.FAMILY_KEY: np.array([0, 0, 1, 1, 2, 2, 0, 1], np.int32),
           cr.REF_KEY: {k: jnp.asarray(v, jnp.float32) for k, v in theta0.items()}}
  return theta, theta0, batch


def _np_grads(theta, batch, rows):
  """∇ of the toy loss restricted to `rows`, by hand: d logp/d attn = x, d/d mlp = (x·mlp) x."""
  x, adv = batch["x"].astype(np.float64), batch["adv"].astype(np.float64)
  m = batch["completion_mask"].sum(1)
  n = float(batch["num_tokens"])
  g = {k: np.zeros(D) for k in theta}
  for b in rows:
    w = -m[b] * adv[b] / n
    g["attn"] += w * x[b]
    g["embed"] += w * x[b]
    g["mlp"] += w * (x[b] @ theta["mlp"]) * x[b]
  return g


def _np_scb(k, skip=True):
  m, f = k.shape
  cols = []
  for j in range(f):
    a = np.abs(k[:, j])
    s = a.sum()
    cols.append(a / s if s > 0 else None)
  total, pairs = 0.0, 0
  for i in range(f):
    for j in range(i + 1, f):
      if cols[i] is None or cols[j] is None:
        pairs += 0 if skip else 1
        continue
      total += cols[i] @ cols[j] / (np.linalg.norm(cols[i]) * np.linalg.norm(cols[j]))
      pairs += 1
  return total / pairs if pairs else 0.0


def _expected(theta, theta0, batch, gamma, skip=True, scale="none"):
  fam = batch[cr.FAMILY_KEY]
  grads = [_np_grads(theta, batch, [b for b in range(B) if fam[b] == f]) for f in range(3)]
  k = np.zeros((2, 3))
  for f, g in enumerate(grads):
    for c, name in enumerate(("attn", "mlp")):  # embed is outside every block: excluded
      k[c, f] = g[name] @ (theta[name] - theta0[name])
  full = _np_grads(theta, batch, range(B))
  x, adv, m = batch["x"], batch["adv"], batch["completion_mask"].sum(1)
  logp = x @ theta["attn"] + 0.5 * (x @ theta["mlp"]) ** 2 + x @ theta["embed"]
  pg = -np.sum(m * adv * logp) / float(batch["num_tokens"])
  s = _np_scb(k, skip)
  if scale == "displacement":  # γ·sg(‖Δθ_K‖)·SCB: the norm over attn and mlp (embed is outside K)
    gamma = gamma * np.sqrt(sum(np.sum((theta[n] - theta0[n]) ** 2) for n in ("attn", "mlp")))
  # ∂SCB/∂K by central differences, then the first-order chain rule through Δθ only.
  dk = np.zeros_like(k)
  for c in range(2):
    for f in range(3):
      e = np.zeros_like(k)
      e[c, f] = 1e-6
      dk[c, f] = (_np_scb(k + e, skip) - _np_scb(k - e, skip)) / 2e-6
  grad = {name: full[name].copy() for name in full}
  for c, name in enumerate(("attn", "mlp")):
    for f in range(3):
      grad[name] += gamma * dk[c, f] * grads[f][name]
  return pg + gamma * s, s, k, grad


def _wrapped(gamma=0.1, inactive="skip", scale="none"):
  config = _config(gamma=gamma, inactive=inactive, scale=scale)
  part = cr.ControlRegularizer(config, MixtureTask())
  return part, part.wrap_loss(toy_policy_loss)


def _config(**control):
  config = ml_collections.ConfigDict(dict(
    task="mixture", num_micro_batches=1, ppo_mini_batches=1, group_size=2,
    control=dict(name="cd_rft", gamma=0.01, granularity="block", others="exclude",
                 inactive="skip")))
  config.control.update(control)
  return config


def _value_and_grad(loss, theta, batch):
  model = Toy(theta["attn"], theta["mlp"], theta["embed"])
  graphdef, params = nnx.split(model)

  @jax.jit
  def run(params, batch):
    def f(p):
      return loss(nnx.merge(graphdef, p), batch)
    (value, aux), grads = jax.value_and_grad(f, has_aux=True)(params)
    return value, aux, nnx.to_pure_dict(grads)

  return run(params, batch)


@pytest.mark.parametrize("inactive", ["skip", "zero"])
def test_loss_and_first_order_gradient_match_numpy(inactive):
  theta, theta0, batch = _setup()
  if inactive == "zero":
    batch[cr.FAMILY_KEY] = np.array([0, 0, 1, 1, 0, 0, 0, 1], np.int32)  # family 2 absent
  _, loss = _wrapped(gamma=0.1, inactive=inactive)
  value, aux, grads = _value_and_grad(loss, theta, batch)
  want, s, _, grad = _expected(theta, theta0, batch, 0.1, skip=inactive == "skip")
  assert 0.0 < s < 1.0
  np.testing.assert_allclose(float(aux["cd_rft_scb"]), s, rtol=1e-5)
  np.testing.assert_allclose(float(aux["cd_rft_penalty"]), 0.1 * s, rtol=1e-5)
  np.testing.assert_allclose(float(value), want, rtol=1e-5)
  assert float(aux["cd_rft_families"]) == (3.0 if inactive == "skip" else 2.0)
  for name in ("attn", "mlp", "embed"):
    np.testing.assert_allclose(np.asarray(grads[name]), grad[name], rtol=2e-4, atol=1e-6)
  # The penalty does move the gradient (this test could fail on a dropped term).
  plain = _np_grads(theta, batch, range(B))
  assert not np.allclose(grad["mlp"], plain["mlp"], atol=1e-4)


def test_displacement_scaled_penalty_matches_numpy():
  theta, theta0, batch = _setup(2)
  _, loss = _wrapped(gamma=0.1, scale="displacement")
  value, aux, grads = _value_and_grad(loss, theta, batch)
  want, s, _, grad = _expected(theta, theta0, batch, 0.1, scale="displacement")
  norm = np.sqrt(sum(np.sum((theta[n] - theta0[n]) ** 2) for n in ("attn", "mlp")))
  np.testing.assert_allclose(float(aux["cd_rft_penalty"]), 0.1 * norm * s, rtol=1e-5)
  np.testing.assert_allclose(float(value), want, rtol=1e-5)
  for name in ("attn", "mlp", "embed"):
    np.testing.assert_allclose(np.asarray(grads[name]), grad[name], rtol=2e-4, atol=1e-6)
  plain = _expected(theta, theta0, batch, 0.1)[3]
  assert not np.allclose(grad["mlp"], plain["mlp"], atol=1e-4)  # the scale changes the step


@pytest.mark.parametrize("scale, degree", [("none", -1), ("displacement", 0)])
def test_penalty_gradient_degree_in_the_displacement(scale, degree):
  # With the family gradients held fixed, scaling Δθ by 10 scales the plain penalty's gradient
  # by 1/10 (SCB is of degree 0 in Δθ) and leaves the displacement-scaled one unchanged.
  from jaxrl_post.losses import cd_rft

  rng = np.random.default_rng(3)
  ids = {"a": np.int32(0), "b": np.int32(1), "c": np.int32(2), "e": np.int32(-1)}
  delta = {k: jnp.asarray(rng.normal(size=4), jnp.float32) for k in ids}
  grads = [{k: jnp.asarray(rng.normal(size=4), jnp.float32) for k in ids} for _ in range(3)]

  def penalty(d):
    s, _ = cr.active_scb(cd_rft.control_matrix(grads, d, ids, 3))
    if scale == "displacement":
      s = s * jax.lax.stop_gradient(cd_rft.controlled_displacement_norm(d, ids))
    return s

  g1 = jax.grad(penalty)(delta)
  g10 = jax.grad(penalty)(jax.tree.map(lambda x: 10.0 * x, delta))
  assert float(jnp.linalg.norm(g1["a"])) > 1e-3
  for k in ("a", "b", "c"):
    np.testing.assert_allclose(np.asarray(g10[k]), np.asarray(g1[k]) * 10.0 ** degree,
                               rtol=1e-4, atol=1e-7)


def test_skip_rescales_to_active_pairs_by_hand():
  # Columns (1, 0), (1, 1), 0: k̃ = (1, 0), (½, ½) → cos = 1/√2 over one active pair; the plain
  # mean over 3 pairs is (1/√2) / 3.
  k = jnp.array([[1.0, 1.0, 0.0], [0.0, 1.0, 0.0]])
  s, n = cr.active_scb(k)
  assert float(n) == 2.0
  np.testing.assert_allclose(float(s), 1 / np.sqrt(2), rtol=1e-6)
  np.testing.assert_allclose(float(cr.active_scb(k, inactive="zero")[0]), 1 / np.sqrt(2) / 3,
                             rtol=1e-6)
  assert float(cr.active_scb(jnp.array([[1.0, 0.0], [2.0, 0.0]]))[0]) == 0.0  # one active
  with pytest.raises(ValueError, match="inactive"):
    cr.active_scb(k, inactive="mean")


def test_gamma_zero_keeps_the_policy_gradient_and_logs_scb():
  theta, theta0, batch = _setup(1)
  _, loss = _wrapped(gamma=0.0)
  value, aux, grads = _value_and_grad(loss, theta, batch)
  want, s, _, _ = _expected(theta, theta0, batch, 0.0)
  plain = _np_grads(theta, batch, range(B))
  np.testing.assert_allclose(float(value), want, rtol=1e-5)
  np.testing.assert_allclose(float(aux["cd_rft_scb"]), s, rtol=1e-5)
  for name in plain:
    np.testing.assert_allclose(np.asarray(grads[name]), plain[name], rtol=1e-4, atol=1e-6)


def test_at_the_start_the_penalty_is_zero():
  theta, _, batch = _setup()
  batch[cr.REF_KEY] = {k: jnp.asarray(v, jnp.float32) for k, v in theta.items()}  # Δθ = 0
  _, loss = _wrapped(gamma=0.1)
  value, aux, grads = _value_and_grad(loss, theta, batch)
  assert float(aux["cd_rft_scb"]) == 0.0 and float(aux["cd_rft_families"]) == 0.0
  plain = _np_grads(theta, batch, range(B))
  np.testing.assert_allclose(np.asarray(grads["mlp"]), plain["mlp"], rtol=1e-4, atol=1e-6)


def test_reference_is_an_input_not_a_compiled_constant():
  theta, theta0, batch = _setup()
  _, loss = _wrapped(gamma=0.1)
  model = Toy(theta["attn"], theta["mlp"], theta["embed"])
  graphdef, params = nnx.split(model)
  traces = []

  @jax.jit
  def value(params, batch):
    traces.append(1)
    return loss(nnx.merge(graphdef, params), batch)[1]["cd_rft_scb"]

  first = float(value(params, batch))
  moved = dict(batch, **{cr.REF_KEY: {k: v + 0.5 for k, v in batch[cr.REF_KEY].items()}})
  second = float(value(params, moved))
  assert len(traces) == 1 and first != second
  theta_moved = {k: v + 0.5 for k, v in theta0.items()}
  np.testing.assert_allclose(second, _expected(theta, theta_moved, batch, 0.1)[1], rtol=1e-5)


def test_sharded_matches_single_device():
  theta, _, batch = _setup(2)
  _, loss = _wrapped(gamma=0.1)
  single = _value_and_grad(loss, theta, batch)
  mesh = Mesh(np.array(jax.devices()), ("data",))
  rows = NamedSharding(mesh, P("data"))
  sharded = {k: (jax.device_put(v, rows) if k in ("x", "adv", "completion_mask", cr.FAMILY_KEY)
                 else v) for k, v in batch.items()}
  multi = _value_and_grad(loss, theta, sharded)
  np.testing.assert_allclose(float(multi[0]), float(single[0]), rtol=1e-5)
  for name in ("attn", "mlp", "embed"):
    np.testing.assert_allclose(np.asarray(multi[2][name]), np.asarray(single[2][name]),
                               rtol=1e-5, atol=1e-7)


def test_family_ids_follow_the_records_domains():
  task = MixtureTask()
  # Mixture indices cycle arith, countdown, format, arith, countdown (2 : 2 : 1).
  records = [task.make_example("train", i) for i in (4, 2, 0)]
  assert cr.family_ids(task, records, 3).tolist() == [1, 1, 1, 2, 2, 2, 0, 0, 0]
  with pytest.raises(ValueError, match="group_size"):
    cr.family_ids(task, records, 0)


def test_transform_adds_families_and_reference():
  task = MixtureTask()
  part = cr.ControlRegularizer(_config(), task)
  part.reference = {"w": np.zeros(2)}
  records = [task.make_example("train", i) for i in (0, 1)]
  ctx = type("Ctx", (), {"records": records})()
  batch, metrics = part.transform(None, None, {"completion_mask": np.ones((4, 3), bool)}, ctx)
  assert batch[cr.FAMILY_KEY].tolist() == [0, 0, 1, 1] and batch[cr.REF_KEY] is part.reference
  assert metrics == {"cd_rft/rows_arith": 2.0, "cd_rft/rows_countdown": 2.0,
                     "cd_rft/rows_format": 0.0}
  with pytest.raises(ValueError, match="one batch row per rollout"):
    part.transform(None, None, {"completion_mask": np.ones((6, 3), bool)}, ctx)


def test_start_keeps_the_starting_policy_and_nothing_is_checkpointed():
  part = cr.ControlRegularizer(_config(), MixtureTask())
  state = type("State", (), {"params": nnx.state(Toy([1.0, 2.0, 3.0], [4.0, 5.0, 6.0],
                                                     [7.0, 8.0, 9.0]), nnx.Param)})()
  part.start(None, state)
  assert np.asarray(part.reference["mlp"]).tolist() == [4.0, 5.0, 6.0]
  # θ⁰ is the starting policy `start` receives (also after a restart: training.setup.build_run
  # builds it from where the run first started), not a second copy of the weights on disk.
  assert not hasattr(part, "array_state")


@pytest.mark.parametrize("overrides, match", [
  ({"num_micro_batches": 2}, "config.num_micro_batches = 1"),
  ({"ppo_mini_batches": 2}, "config.ppo_mini_batches = 1"),
  ({"control.gamma": -0.1}, "config.control.gamma must be >= 0"),
  ({"control.granularity": "head"}, "config.control.granularity='head'"),
  ({"control.others": "all"}, "config.control.others='all'"),
  ({"control.inactive": "drop"}, "config.control.inactive='drop'"),
  ({"control.scale": "norm"}, "config.control.scale='norm'"),
  ({"control.name": "scb"}, "config.control.name='scb'"),
])
def test_config_errors_name_the_key(overrides, match):
  config = _config()
  for key, value in overrides.items():
    if "." in key:
      section, name = key.split(".")
      config[section][name] = value
    else:
      config[key] = value
  with pytest.raises(ValueError, match=match):
    cr.build_control_regularizer(config, MixtureTask())


def test_needs_two_families():
  one = MixtureTask(components={"arith": {"task": "arith", "weight": 1.0}})
  with pytest.raises(ValueError, match="config.task must be 'mixture' with >= 2 domains"):
    cr.build_control_regularizer(_config(), one)
  with pytest.raises(ValueError, match="num_families"):
    cr.control_loss(toy_policy_loss, {}, 1, 1)
  assert cr.build_control_regularizer(_config(name="none"), one) is None


def test_doctests():
  doctest.testmod(cr, raise_on_error=True)
