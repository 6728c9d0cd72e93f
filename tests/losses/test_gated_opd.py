"""TGOPD (arXiv 2609.02998), OPDVR and GRPD (arXiv 2608.24696): golden values, errors, sharding."""

import doctest

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxrl_post.losses import gated_opd
from jaxrl_post.losses.gated_opd import (
  GATED_OPD_ADVANTAGES,
  gated_opd_advantages,
  grpd_advantages,
  grpd_scale,
  opdvr_advantages,
  opdvr_gate,
  teacher_gate,
  tgopd_advantages,
)


def test_doctests():
  assert doctest.testmod(gated_opd, raise_on_error=True).attempted >= 8


def _batch(seed=0, batch=16, time=6, prompts=4, k_probe=3):
  """Rollouts of `prompts` prompts in shuffled order (groups are not contiguous), ±inf padding."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(1, time + 1, size=batch)
  mask = np.arange(time)[None] < lengths[:, None]
  old = np.log(rng.uniform(0.05, 0.95, size=(batch, time))).astype(np.float32)
  teacher = (old + rng.normal(0.0, 0.8, size=old.shape)).astype(np.float32)
  old = np.where(mask, old, -np.inf).astype(np.float32)
  teacher = np.where(mask, teacher, np.nan).astype(np.float32)
  gid = rng.permutation(np.arange(batch) % prompts).astype(np.int32)
  rewards = rng.integers(0, 2, size=batch).astype(np.float32)
  rewards[gid == 1] = 1.0  # one group without reward variance
  probes = rng.integers(0, 2, size=(prompts, k_probe)).astype(np.float32)
  probes[0] = [1, 1, 0]  # 2 of 3: the gate opens exactly at τ = 2/3
  probes[1] = [1, 0, 0]
  probes[2] = [0, 0, 0]
  return dict(teacher=teacher, old=old, mask=mask, gid=gid, rewards=rewards, probes=probes)


def _np_d(r):
  return np.where(r["mask"], r["teacher"].astype(np.float64) - r["old"], 0.0)


def _np_group_adv(x, gid, std):
  out = np.zeros_like(x, np.float64)
  for g in np.unique(gid):
    sel = gid == g
    centred = x[sel] - x[sel].mean()
    if std:
      centred = centred / (np.std(x[sel], ddof=1) + 1e-6) if sel.sum() > 1 else 0 * centred
    out[sel] = centred
  return out


# ---------------------------------------------------------------------------------------------
# TGOPD.
# ---------------------------------------------------------------------------------------------


def test_teacher_gate_golden():
  out = teacher_gate(jnp.array([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0],
                                [1.0, jnp.nan, jnp.nan], [jnp.nan, jnp.nan, jnp.nan]]))
  assert out.gate.tolist() == [True, False, True, True, False]
  np.testing.assert_allclose(out.pass_rate, [2 / 3, 1 / 3, 1.0, 1.0, np.nan], rtol=1e-6)
  assert out.num_probes.tolist() == [3, 3, 3, 1, 0]
  five = jnp.array([[1.0, 1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0, 0.0]])
  assert teacher_gate(five, tau=0.6).gate.tolist() == [True, True]  # 3/5 passes τ = 3/5
  assert teacher_gate(five, tau=1.0).gate.tolist() == [False, False]  # τ = 5/5 is strict
  with pytest.raises(ValueError, match="probe_rewards"):
    teacher_gate(jnp.ones(3))


@pytest.mark.parametrize("grpo_std", ["none", "group"])
def test_tgopd_matches_numpy(grpo_std):
  r = _batch()
  adv = jax.jit(lambda t, o, m, tau: tgopd_advantages(
      t, o, m, rewards=r["rewards"], group_ids=r["gid"], probe_rewards=r["probes"], tau=tau,
      grpo_std=grpo_std))(r["teacher"], r["old"], r["mask"], 2 / 3)
  gate = r["probes"].mean(-1) >= 2 / 3 - 1e-6
  assert gate[0] and not gate[1] and not gate[2]
  grpo = _np_group_adv(r["rewards"].astype(np.float64), r["gid"], grpo_std == "group")
  expected = np.where(gate[r["gid"]][:, None], _np_d(r), grpo[:, None]) * r["mask"]
  np.testing.assert_allclose(adv, expected, rtol=1e-5, atol=1e-6)
  # Closed gate + no reward variance (prompt 1): exactly zero update.
  np.testing.assert_array_equal(np.asarray(adv)[r["gid"] == 1], 0.0)
  assert np.isfinite(np.asarray(adv)).all()


def test_tgopd_gate_open_everywhere_is_opd_and_closed_is_grpo():
  r = _batch(seed=1)
  kw = dict(rewards=r["rewards"], group_ids=r["gid"])
  opd = tgopd_advantages(r["teacher"], r["old"], r["mask"], probe_rewards=np.ones((4, 3)), **kw)
  np.testing.assert_allclose(opd, _np_d(r), rtol=1e-6, atol=1e-7)
  grpo = tgopd_advantages(r["teacher"], r["old"], r["mask"], probe_rewards=np.zeros((4, 3)),
                          **kw)
  expected = _np_group_adv(r["rewards"].astype(np.float64), r["gid"], False)[:, None] * r["mask"]
  np.testing.assert_allclose(grpo, expected, rtol=1e-6, atol=1e-7)


# ---------------------------------------------------------------------------------------------
# OPDVR and GRPD.
# ---------------------------------------------------------------------------------------------


def test_opdvr_matches_numpy_and_inverse():
  r = _batch(seed=2)
  rewards = r["rewards"].copy()
  rewards[3] = np.nan  # no verifier reward for this row: no update
  fn = jax.jit(lambda t, o, m, rw, th: opdvr_advantages(t, o, m, rewards=rw, threshold=th))
  adv = np.asarray(fn(r["teacher"], r["old"], r["mask"], rewards, 0.0))
  d = _np_d(r)
  c = (rewards > 0)[:, None]
  expected = np.where(c, np.maximum(d, 0), np.minimum(d, 0))
  expected[3] = 0.0
  np.testing.assert_allclose(adv, expected, rtol=1e-6, atol=1e-7)
  inv = gated_opd_advantages("opdvr_inverse", r["teacher"], r["old"], r["mask"], rewards=rewards)
  expected_inv = np.where(c, np.minimum(d, 0), np.maximum(d, 0))
  expected_inv[3] = 0.0
  np.testing.assert_allclose(inv, expected_inv, rtol=1e-6, atol=1e-7)
  # Gated and inverse split plain OPD between them (rows with a reward).
  np.testing.assert_allclose((adv + inv)[~np.isnan(rewards)], d[~np.isnan(rewards)], rtol=1e-6,
                             atol=1e-7)
  # The threshold is a traced knob: 0.5 gives the same correctness on 0/1 rewards, 1.0 none.
  np.testing.assert_array_equal(fn(r["teacher"], r["old"], r["mask"], rewards, 0.5), adv)
  none_correct = np.asarray(fn(r["teacher"], r["old"], r["mask"], rewards, 1.0))
  assert (none_correct <= 0).all()


def test_opdvr_gate_topk():
  # Top-K candidate rewards [B, T, K]: the same clamp, elementwise (spec §6.1).
  rng = np.random.default_rng(0)
  r = rng.normal(size=(3, 2, 4)).astype(np.float32)
  mask = np.array([[1, 1], [1, 0], [0, 0]], bool)
  out = np.asarray(opdvr_gate(r, np.array([1, 0, 1]), mask))
  np.testing.assert_array_equal(out[0], np.maximum(r[0], 0))
  np.testing.assert_array_equal(out[1, 0], np.minimum(r[1, 0], 0))
  np.testing.assert_array_equal(out[1, 1], 0.0)
  np.testing.assert_array_equal(out[2], 0.0)


@pytest.mark.parametrize("norm_std", [True, False])
def test_grpd_matches_numpy(norm_std):
  r = _batch(seed=3)
  u = 0.1
  adv = grpd_advantages(r["teacher"], r["old"], r["mask"], rewards=r["rewards"],
                        group_ids=r["gid"], norm_std=norm_std, scale_baseline=u)
  c = r["rewards"] > 0
  d = _np_d(r)
  gated = np.where(c[:, None], np.maximum(d, 0), np.minimum(d, 0))
  scale = np.abs(_np_group_adv(c.astype(np.float64), r["gid"], norm_std)) + u
  np.testing.assert_allclose(adv, gated * scale[:, None], rtol=1e-5, atol=1e-7)
  # The all-correct group gets scale u exactly.
  np.testing.assert_allclose(np.asarray(adv)[r["gid"] == 1], u * gated[r["gid"] == 1],
                             rtol=1e-6, atol=1e-8)


def test_grpd_scale_golden():
  rewards = jnp.array([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0])
  gid = jnp.array([0, 0, 0, 0, 1, 1, 1, 1])
  # Group 0: c = (1,0,0,0), μ = ¼, σ = ½ → |a| = (1.5, .5, .5, .5); Dr.GRPO (.75, .25, .25, .25).
  # Group 1: c = (1,1,0,1), μ = ¾, σ = ½ → |a| = (.5, .5, 1.5, .5); Dr.GRPO (.25, .25, .75, .25).
  np.testing.assert_allclose(grpd_scale(rewards, gid, eps=0.0),
                             [1.5, 0.5, 0.5, 0.5, 0.5, 0.5, 1.5, 0.5], rtol=1e-6)
  np.testing.assert_allclose(grpd_scale(rewards, gid, norm_std=False, scale_baseline=1.0),
                             [1.75, 1.25, 1.25, 1.25, 1.25, 1.25, 1.75, 1.25], rtol=1e-6)
  # All-correct / all-wrong groups: scale u (0 by default: no signal).
  np.testing.assert_array_equal(grpd_scale(jnp.ones(4), jnp.zeros(4, jnp.int32)), 0.0)


# ---------------------------------------------------------------------------------------------
# Registry and bad input.
# ---------------------------------------------------------------------------------------------


def test_registry_and_errors():
  assert GATED_OPD_ADVANTAGES.names() == ["grpd", "opdvr", "opdvr_inverse", "tgopd"]
  t = jnp.zeros((4, 3))
  rw = jnp.ones(4)
  gid = jnp.zeros(4, jnp.int32)
  probes = jnp.ones((1, 3))
  with pytest.raises(KeyError, match="valid names"):
    gated_opd_advantages("opdvr_soft", t, t, rewards=rw)
  for name, kw, missing in [
      ("opdvr", {}, "rewards"),
      ("opdvr_inverse", {}, "rewards"),
      ("grpd", dict(group_ids=gid), "rewards"),
      ("grpd", dict(rewards=rw), "group_ids"),
      ("tgopd", dict(group_ids=gid, probe_rewards=probes), "rewards"),
      ("tgopd", dict(rewards=rw, probe_rewards=probes), "group_ids"),
      ("tgopd", dict(rewards=rw, group_ids=gid), "probe_rewards"),
  ]:
    with pytest.raises(ValueError, match=f"{name.split('_')[0]} needs {missing}"):
      gated_opd_advantages(name, t, t, **kw)
  with pytest.raises(ValueError, match="old_logp"):
    opdvr_advantages(t, t[:, :2], rewards=rw)
  with pytest.raises(ValueError, match="mask"):
    opdvr_advantages(t, t, jnp.ones((4, 2)), rewards=rw)
  with pytest.raises(ValueError, match="rewards"):
    opdvr_advantages(t, t, rewards=jnp.ones((4, 1)))
  with pytest.raises(ValueError, match="group_ids"):
    grpd_advantages(t, t, rewards=rw, group_ids=jnp.zeros(3, jnp.int32))
  with pytest.raises(ValueError, match="group_ids must be integers"):
    tgopd_advantages(t, t, rewards=rw, group_ids=jnp.zeros(4), probe_rewards=probes)
  with pytest.raises(ValueError, match="probe_rewards"):
    tgopd_advantages(t, t, rewards=rw, group_ids=gid, probe_rewards=jnp.ones(3))
  with pytest.raises(ValueError, match="grpo_std"):
    tgopd_advantages(t, t, rewards=rw, group_ids=gid, probe_rewards=probes, grpo_std="mad")
  with pytest.raises(ValueError, match="teacher_logp"):
    opdvr_advantages(jnp.zeros(4), jnp.zeros(4), rewards=rw)
  with pytest.raises(TypeError):
    gated_opd_advantages("opdvr", t, t, rewards=rw, tau=0.5)


# ---------------------------------------------------------------------------------------------
# Sharding: rows on 8 devices, groups spanning devices.
# ---------------------------------------------------------------------------------------------


def test_sharded_matches_single_device():
  assert jax.device_count() == 8, "tests/conftest.py should give 8 fake CPU devices"
  r = _batch(seed=4)
  mesh = Mesh(np.array(jax.devices()), ("data",))
  rows = NamedSharding(mesh, P("data"))

  @jax.jit
  def all_methods(teacher, old, mask, rewards, gid, probes):
    return (tgopd_advantages(teacher, old, mask, rewards=rewards, group_ids=gid,
                             probe_rewards=probes),
            opdvr_advantages(teacher, old, mask, rewards=rewards),
            grpd_advantages(teacher, old, mask, rewards=rewards, group_ids=gid, num_groups=4))

  args = [r[k] for k in ("teacher", "old", "mask", "rewards", "gid")]
  single = all_methods(*[jax.device_put(a, jax.devices()[0]) for a in args], r["probes"])
  sharded = [jax.device_put(a, rows) for a in args]
  out = all_methods(*sharded, jax.device_put(r["probes"], NamedSharding(mesh, P())))
  assert len(sharded[0].sharding.device_set) == 8
  for got, want in zip(out, single):
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
