"""RAPO R-Scale (arXiv 2608.03660): reliability, sensitivity, risk, scale; grad, sharding."""

import doctest

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxrl_post.losses import rapo
from jaxrl_post.losses.rapo import (
  RISK_SENSITIVITIES,
  collision_sensitivity,
  rapo_reliability,
  rapo_risk,
  rapo_scale,
  sampled_token_sensitivity,
)


def test_doctests():
  assert doctest.testmod(rapo, raise_on_error=True).attempted >= 8


def test_registry():
  assert RISK_SENSITIVITIES.names() == ["collision", "sampled"]
  assert RISK_SENSITIVITIES.get("sampled") is sampled_token_sensitivity
  with pytest.raises(KeyError, match="unknown risk sensitivity 'hessian'; valid names: collision"):
    RISK_SENSITIVITIES.get("hessian")


# ---------------------------------------------------------------------------------------------
# Independent numpy references (loops).
# ---------------------------------------------------------------------------------------------


def _np_reliability(rewards, valid, binary, std_max=0.5):
  out = []
  for r, v in zip(rewards, valid):
    vals = [float(x) for x, ok in zip(r, v) if ok]
    if not vals:
      out.append(np.nan)
      continue
    p = sum(vals) / len(vals)
    if binary:
      rel = 1 - 4 * p * (1 - p)
    else:
      rel = 1 - np.sqrt(sum((x - p) ** 2 for x in vals) / len(vals)) / std_max
    out.append(min(max(rel, 0.0), 1.0))
  return np.array(out)


def _np_token_mean(values, mask):
  out = []
  for row, m in zip(values, mask):
    vals = [x for x, ok in zip(row, m) if ok]
    out.append(sum(vals) / len(vals) if vals else 0.0)
  return np.array(out)


def _np_rank(v):
  """Average 0-based ranks by counting."""
  return np.array([sum(u < x for u in v) + 0.5 * (sum(u == x for u in v) - 1) for x in v])


def _np_z(v):
  return (v - v.mean()) / (np.sqrt(np.mean((v - v.mean()) ** 2)) + 1e-6)


def _np_risk(rel, sens, valid, kappa, normalise):
  out = np.full(len(rel), 0.5)
  idx = [i for i in range(len(rel)) if valid[i] and np.isfinite(rel[i]) and np.isfinite(sens[i])]
  r = np.array([rel[i] for i in idx], np.float64)
  s = np.array([sens[i] for i in idx], np.float64)
  if normalise == "rank":
    r, s = _np_rank(r), _np_rank(s)
  z = _np_z(s) - _np_z(r)
  for i, zi in zip(idx, z):
    out[i] = 1 / (1 + np.exp(-kappa * zi))
  return out


def _batch(seed=0, n=32, g=8, t=12):
  rng = np.random.default_rng(seed)
  binary = rng.integers(0, 2, size=(n, g)).astype(np.float32)
  binary[0] = 1.0  # the group agrees: reliability 1
  cont = rng.uniform(0, 1, size=(n, g)).astype(np.float32)
  cont[1] = [0, 1] * (g // 2)  # std ½ = std_max: reliability 0
  valid = rng.uniform(size=(n, g)) < 0.85
  valid[2] = False  # no graded rollout: NaN reliability, left out of the risk statistics
  lengths = rng.integers(1, t + 1, size=n)
  lengths[3] = 0
  mask = np.arange(t)[None] < lengths[:, None]
  logp = np.log(rng.uniform(0.02, 1.0, size=(n, t))).astype(np.float32)
  logp = np.where(mask, logp, -np.inf).astype(np.float32)
  sum_p2 = rng.uniform(0.05, 1.0, size=(n, t)).astype(np.float32)
  sum_p2 = np.where(mask, sum_p2, np.nan).astype(np.float32)
  return dict(binary=binary, cont=cont, valid=valid, mask=mask, logp=logp, sum_p2=sum_p2)


# ---------------------------------------------------------------------------------------------
# Golden values.
# ---------------------------------------------------------------------------------------------


def test_reliability_matches_numpy():
  b = _batch()
  binary = np.where(b["valid"], b["binary"], np.nan)  # invalid entries may hold NaN
  got = np.asarray(rapo_reliability(binary, b["valid"]))
  want = _np_reliability(b["binary"], b["valid"], True)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=True)
  assert got[0] == 1.0 and np.isnan(got[2]) and np.isfinite(np.delete(got, 2)).all()
  got = np.asarray(rapo_reliability(b["cont"], b["valid"], binary=False))
  want = _np_reliability(b["cont"], b["valid"], False)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=True)
  full = np.asarray(rapo_reliability(b["cont"], binary=False))
  assert full[1] == pytest.approx(0.0, abs=1e-6)  # std = std_max
  assert ((full >= 0) & (full <= 1)).all()
  # std 1 > std_max: clipped at 0; a wider std_max makes it positive.
  wide = jnp.array([[0.0, 2.0]])
  assert float(rapo_reliability(wide, binary=False)[0]) == 0.0
  np.testing.assert_allclose(rapo_reliability(wide, binary=False, std_max=2.0), [0.5])


def test_sensitivities_match_numpy():
  b = _batch(seed=1)
  p = np.exp(b["logp"].astype(np.float64))
  got = np.asarray(sampled_token_sensitivity(b["logp"], b["mask"]))
  np.testing.assert_allclose(got, _np_token_mean(p * (1 - p), b["mask"]), rtol=1e-5, atol=1e-7)
  assert got[3] == 0.0 and (got <= 0.25).all()
  got = np.asarray(collision_sensitivity(b["sum_p2"], b["mask"]))
  want = _np_token_mean(1 - b["sum_p2"].astype(np.float64), b["mask"])
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
  assert np.isfinite(got).all()


def test_collision_sensitivity_is_the_softmax_fisher_trace():
  rng = np.random.default_rng(2)
  logits = rng.normal(0, 2, size=(3, 4, 7))
  probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
  # tr(diag(π) − ππᵀ) per position, built as a matrix.
  trace = np.array([[np.trace(np.diag(pt) - np.outer(pt, pt)) for pt in row] for row in probs])
  sum_p2 = (probs**2).sum(-1).astype(np.float32)
  np.testing.assert_allclose(collision_sensitivity(sum_p2), trace.mean(-1), rtol=1e-5)


@pytest.mark.parametrize("normalise", ["zscore", "rank"])
def test_risk_matches_numpy_and_excludes_invalid(normalise):
  rng = np.random.default_rng(3)
  n = 32
  rel = rng.uniform(0, 1, n).astype(np.float32)
  rel[:6] = 1.0  # ties
  sens = rng.uniform(0, 0.25, n).astype(np.float32)
  valid = rng.uniform(size=n) < 0.75
  rel[5] = np.nan  # a prompt with no graded rollout: left out even if marked valid
  valid[5] = True
  got = np.asarray(rapo_risk(rel, sens, valid, kappa=1.5, normalise=normalise))
  want = _np_risk(rel, sens, valid, 1.5, normalise)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  assert ((got > 0) & (got < 1)).all()
  out = ~valid
  out[5] = True
  assert (got[out] == 0.5).all()
  # Invalid rows do not enter the statistics: changing them changes nothing else.
  rel2, sens2 = rel.copy(), sens.copy()
  rel2[~valid] = 100.0  # (row 5 keeps its NaN reliability)
  sens2[out] = -50.0
  got2 = np.asarray(rapo_risk(rel2, sens2, valid, kappa=1.5, normalise=normalise))
  np.testing.assert_allclose(got2, got, rtol=1e-6)
  # ... whereas they would if they were valid.
  got3 = np.asarray(rapo_risk(rel2, sens2, None, kappa=1.5, normalise=normalise))
  assert not np.allclose(got3[~out], got[~out], atol=1e-3)


def test_risk_direction_and_default_kappa():
  # Reliable and insensitive → low risk; unreliable and sensitive → high risk.
  rel = jnp.array([1.0, 0.5, 0.0])
  sens = jnp.array([0.0, 0.5, 1.0])
  rho = np.asarray(rapo_risk(rel, sens))
  z = np.sqrt(1.5)  # z-scores ∓√1.5, 0 (population std √(1/6))
  want = 1 / (1 + np.exp(-2.0 * np.array([-2 * z, 0.0, 2 * z])))
  np.testing.assert_allclose(rho, want, rtol=1e-4)


def test_scale_range_and_golden():
  rho = jnp.array([0.0, 0.1, 0.5, 0.8, 0.95, 1.0])
  np.testing.assert_allclose(rapo_scale(rho), [1.0, 0.9, 0.5, 0.2, 0.2, 0.2], rtol=1e-6)
  np.testing.assert_allclose(rapo_scale(rho, lam_min=0.0), 1 - np.asarray(rho), atol=1e-7)
  lam = np.asarray(rapo_scale(rapo_risk(*np.random.default_rng(4).uniform(size=(2, 64)))))
  assert ((lam >= 0.2) & (lam <= 1.0)).all()


def test_no_gradient_through_lambda():
  rng = np.random.default_rng(5)
  rel = jnp.asarray(rng.uniform(0, 1, 16), jnp.float32)
  sens = jnp.asarray(rng.uniform(0, 0.25, 16), jnp.float32)
  per_sample = jnp.asarray(rng.normal(size=16), jnp.float32)

  def loss(rel, sens, per_sample):
    return jnp.sum(rapo_scale(rapo_risk(rel, sens)) * per_sample)

  g_rel, g_sens, g_loss = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(rel, sens, per_sample)
  np.testing.assert_array_equal(g_rel, 0.0)
  np.testing.assert_array_equal(g_sens, 0.0)
  # The gradient of the scaled loss w.r.t. the per-sample loss is λ itself (not zero).
  np.testing.assert_allclose(g_loss, rapo_scale(rapo_risk(rel, sens)), rtol=1e-6)
  # Without the stop-gradient the risk would have a gradient: the test can fail.
  g_raw = jax.grad(lambda r: jnp.sum((1 - rapo_risk(r, sens)) * per_sample))(rel)
  assert np.abs(np.asarray(g_raw)).max() > 1e-3


def test_sharded_matches_single_device():
  assert jax.device_count() == 8, "tests/conftest.py should give 8 fake CPU devices"
  b = _batch(seed=6)
  mesh = Mesh(np.array(jax.devices()), ("data",))
  rows = NamedSharding(mesh, P("data"))

  @jax.jit
  def pipeline(rewards, valid, logp, mask, sum_p2):
    rel = rapo_reliability(rewards, valid)
    out = []
    for sens in (sampled_token_sensitivity(logp, mask), collision_sensitivity(sum_p2, mask)):
      for normalise in ("zscore", "rank"):
        out.append(rapo_scale(rapo_risk(rel, sens, normalise=normalise)))
    return out

  args = [b[k] for k in ("binary", "valid", "logp", "mask", "sum_p2")]
  single = pipeline(*[jax.device_put(a, jax.devices()[0]) for a in args])
  sharded = [jax.device_put(a, rows) for a in args]
  assert len(sharded[0].sharding.device_set) == 8
  for got, want in zip(pipeline(*sharded), single):
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_errors():
  b = _batch()
  with pytest.raises(ValueError, match="rewards must be"):
    rapo_reliability(b["binary"][0])
  with pytest.raises(ValueError, match="valid"):
    rapo_reliability(b["binary"], b["valid"][:, :3])
  with pytest.raises(ValueError, match="std_max"):
    rapo_reliability(b["binary"], binary=False, std_max=0.0)
  with pytest.raises(ValueError, match="logp"):
    sampled_token_sensitivity(b["logp"][0])
  with pytest.raises(ValueError, match="mask"):
    collision_sensitivity(b["sum_p2"], b["mask"][:, :3])
  with pytest.raises(ValueError, match="sensitivity"):
    rapo_risk(jnp.ones(4), jnp.ones(3))
  with pytest.raises(ValueError, match="valid"):
    rapo_risk(jnp.ones(4), jnp.ones(4), jnp.ones(3, bool))
  with pytest.raises(ValueError, match="normalise"):
    rapo_risk(jnp.ones(4), jnp.ones(4), normalise="minmax")
  with pytest.raises(ValueError, match="lam_min"):
    rapo_scale(jnp.ones(4), lam_min=1.5)
