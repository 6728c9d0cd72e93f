"""OPD-then-RL (arXiv 2609.04108): the hard switch, the switch PROPOSAL, the Table 1 baselines."""

import doctest
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxrl_post.losses import joint_opd
from jaxrl_post.losses.joint_opd import (
  JOINT_OPD_BASELINES,
  annealed_beta,
  auto_switch_step,
  final_eos_mask,
  joint_opd_advantages,
  opd_then_rl_advantages,
)
from jaxrl_post.losses.policy import policy_loss

NAMES = ["hdpo", "kdrl", "kdrl_annealing", "kdrl_mask", "rlsd", "srpo", "trrd"]


def test_doctests():
  assert doctest.testmod(joint_opd, raise_on_error=False).failed == 0


# Two prompts × two rollouts, ragged, T = 3. Prompt 0: one correct (R = 1), one wrong;
# prompt 1: both wrong (Σ R = 0, Â = 0). Row 3 was cut at the length limit (no EOS).
ADV = np.array([0.7071, -0.7071, 0.0, 0.0], np.float32)
REWARDS = np.array([1.0, 0.0, 0.0, 0.0], np.float32)
GROUPS = np.array([0, 0, 1, 1], np.int32)
MASK = np.array([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]], np.float32)
ENDS_WITH_EOS = np.array([True, True, True, False])
TEACHER = np.array([[-0.5, -1.0, -9.0], [-2.0, -0.2, np.nan], [-1.0, -np.inf, 0.0],
                    [-0.3, -0.4, -0.5]], np.float32)
LOGP = np.array([[-1.0, -0.5, -0.1], [-1.0, -0.7, 0.0], [-0.5, np.nan, 0.0],
                 [-0.6, -0.4, -1.5]], np.float32)
# The final EOS (last token of rows 0–2) is masked out of d:
#   d = [[0.5, −0.5, 0], [−1.0, 0, 0], [0, 0, 0], [0.3, 0.0, 1.0]].
D = np.array([[0.5, -0.5, 0.0], [-1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.3, 0.0, 1.0]], np.float32)
EOS = np.array([[0, 0, 1], [0, 1, 0], [1, 0, 0], [0, 0, 0]], bool)


def _call(name, **knobs):
  data = dict(eos_mask=final_eos_mask(MASK, ENDS_WITH_EOS), group_ids=GROUPS, num_groups=2,
              step=1, total_steps=150)
  return joint_opd_advantages(name, ADV, TEACHER, LOGP, REWARDS, MASK, **{**data, **knobs})


def test_final_eos_mask_and_d():
  np.testing.assert_array_equal(final_eos_mask(MASK, ENDS_WITH_EOS), EOS)
  np.testing.assert_array_equal(final_eos_mask(MASK)[3], [False, False, True])
  d = _call("kdrl", beta=1.0).adv - np.where(MASK > 0, ADV[:, None], 0.0)
  np.testing.assert_allclose(d, D, atol=1e-6)


def test_registry_names():
  assert JOINT_OPD_BASELINES.names() == NAMES


def _expected(name, beta=0.2):
  """Table 1 (spec §4.3) with numpy, from ADV, REWARDS, GROUPS and the hand-derived D."""
  a = np.where(MASK > 0, ADV[:, None], 0.0)
  c = (REWARDS == 1.0).astype(np.float32)[:, None]  # [1, 0, 0, 0]
  hopeless = np.array([0, 0, 1, 1], np.float32)[:, None]  # C(x): Σ R = 1 for prompt 0, 0 for 1
  if name == "kdrl":
    return a + beta * D
  if name == "kdrl_mask":
    return a + (1 - c) * beta * D
  if name == "srpo":
    return c * a + (1 - c) * D
  if name == "hdpo":
    return a + hopeless * beta * D
  if name == "rlsd":
    return np.clip(np.exp(np.sign(a) * D), 0.8, 1.2) * a
  if name in ("trrd",):
    return a
  if name == "kdrl_annealing":  # step 1 of 150: β = 0.2
    return a + 0.2 * D
  raise AssertionError(name)


@pytest.mark.parametrize("name", NAMES)
def test_table1_golden(name):
  knobs = {"beta": 0.3} if name in ("kdrl", "kdrl_mask", "hdpo") else {}
  terms = jax.jit(functools.partial(_call, name, **knobs))()
  np.testing.assert_allclose(terms.adv, _expected(name, **knobs), rtol=1e-6, atol=1e-7)
  assert terms.adv.shape == MASK.shape and terms.adv.dtype == jnp.float32
  np.testing.assert_array_equal(np.asarray(terms.adv)[MASK == 0], 0.0)
  if name != "trrd":
    np.testing.assert_array_equal(terms.logp_scale, np.ones_like(MASK))
    np.testing.assert_array_equal(terms.old_logp, LOGP)


def test_table1_hand_values():
  # A few entries by hand (β = 0.2): row 1 is wrong in a prompt with a success.
  #   KDRL      t=0: −0.7071 + 0.2·(−1.0) = −0.9071
  #   KDRL-mask t=0 of row 0 (correct): Â = 0.7071 (no teacher term)
  #   SRPO      t=0 of row 1 (wrong): d = −1.0; t=1 is its EOS: d := 0
  #   HDPO      row 1: Â only (prompt 0 has a success) = −0.7071; row 3, t=2: 0 + 0.2·1.0 = 0.2
  #   RLSD      row 1, t=0: e^{sign(−)·(−1)} = e → clipped to 1.2: −0.7071·1.2 = −0.84852
  assert float(_call("kdrl").adv[1, 0]) == pytest.approx(-0.9071, abs=1e-6)
  assert float(_call("kdrl_mask").adv[0, 0]) == pytest.approx(0.7071, abs=1e-6)
  assert float(_call("srpo").adv[1, 0]) == pytest.approx(-1.0, abs=1e-6)
  assert float(_call("srpo").adv[1, 1]) == 0.0
  hdpo = _call("hdpo").adv
  assert float(hdpo[1, 0]) == pytest.approx(-0.7071, abs=1e-6)
  assert float(hdpo[3, 2]) == pytest.approx(0.2, abs=1e-6)
  assert float(_call("rlsd").adv[1, 0]) == pytest.approx(-0.84852, abs=1e-5)
  # RLSD with λ = 0 is GRPO; λ = ½ halves the modulation: (½ + ½·1.2)·(−0.7071).
  np.testing.assert_allclose(_call("rlsd", lam=0.0).adv, _expected("trrd"), atol=1e-7)
  assert float(_call("rlsd", lam=0.5).adv[1, 0]) == pytest.approx(-0.77781, abs=1e-5)


def _trrd_reference_loss(new, old, teacher, adv, mask, tmask, alpha, eps=0.2):
  """−token-mean of min(ρA, clip(ρ)A), ρ = r^α·e^{−(1−α) d}, d = (log π_T − log π_θ)·tmask."""
  valid = mask > 0
  d = jnp.where(tmask, teacher - new, 0.0)
  log_rho = jnp.where(valid, alpha * (new - old) - (1 - alpha) * d, 0.0)
  rho = jnp.exp(log_rho)
  a = adv[:, None] * mask
  obj = jnp.minimum(rho * a, jnp.clip(rho, 1 - eps, 1 + eps) * a)
  return -jnp.sum(jnp.where(valid, obj, 0.0)) / jnp.sum(mask)


def test_trrd_ratio_through_policy_loss_matches_the_paper():
  rng = np.random.default_rng(0)
  valid = MASK > 0
  old = np.where(valid, LOGP, 0.0).astype(np.float32)
  teacher = np.where(valid, TEACHER, 0.0).astype(np.float32)
  new = (old + 0.3 * rng.standard_normal(old.shape)).astype(np.float32)
  eos = final_eos_mask(MASK, ENDS_WITH_EOS)
  terms = joint_opd_advantages("trrd", ADV, TEACHER, LOGP, None, MASK, eos_mask=eos, alpha=0.5)

  def ours(lp):
    return policy_loss(terms.logp_scale * lp, terms.old_logp, terms.adv, MASK)[0]

  tmask = valid & ~np.asarray(eos)

  def reference(lp):
    return _trrd_reference_loss(lp, old, teacher, ADV, MASK, tmask, 0.5)

  loss, grad = jax.jit(jax.value_and_grad(ours))(new)
  ref_loss, ref_grad = jax.value_and_grad(reference)(new)
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
  np.testing.assert_allclose(grad, ref_grad, rtol=1e-5, atol=1e-7)
  # On-policy (new = old) the TRRD ratio is e^{−(1−α) d}, not 1: at row 1, t = 0 (d = −1)
  # ρ = e^{0.5}; at the masked EOS it is r^α = 1.
  rho = np.exp(terms.logp_scale * old - terms.old_logp)
  assert rho[1, 0] == pytest.approx(np.exp(0.5), rel=1e-5)
  assert rho[0, 2] == pytest.approx(1.0)


def test_plain_baselines_leave_the_ratio_alone():
  terms = _call("kdrl")
  new = jnp.asarray(np.where(MASK > 0, LOGP + 0.1, 0.0), jnp.float32)
  ours = policy_loss(terms.logp_scale * new, terms.old_logp, terms.adv, MASK)[0]
  plain = policy_loss(new, LOGP, terms.adv, MASK)[0]
  np.testing.assert_allclose(ours, plain, rtol=1e-6)


def test_advantages_carry_no_gradient():
  def f(teacher, logp):
    return sum(jnp.sum(joint_opd_advantages(n, ADV, teacher, logp, REWARDS, MASK,
                                            group_ids=GROUPS, step=3, total_steps=10).adv)
               for n in NAMES)

  gt, gl = jax.grad(f, argnums=(0, 1))(jnp.zeros((4, 3)), jnp.zeros((4, 3)))
  assert not np.any(gt) and not np.any(gl)


# ---- bad input ----


def test_unknown_name_names_it_and_the_known_ones():
  with pytest.raises(ValueError, match=r"unknown joint OPD baseline 'kdlr'; known: hdpo, kdrl, "
                                       r"kdrl_annealing, kdrl_mask, rlsd, srpo, trrd"):
    _call("kdlr")


def test_table_spelling_is_accepted():
  np.testing.assert_array_equal(_call("KDRL-mask").adv, _call("kdrl_mask").adv)
  np.testing.assert_array_equal(_call("KDRL-Annealing").adv, _call("kdrl_annealing").adv)


def test_unknown_setting_and_missing_inputs():
  with pytest.raises(TypeError, match=r"'kdrl' has no setting\(s\) \['alpha'\]; its settings: "
                                      r"beta"):
    _call("kdrl", alpha=0.5)
  with pytest.raises(ValueError, match="'hdpo' needs group_ids"):
    joint_opd_advantages("hdpo", ADV, TEACHER, LOGP, REWARDS, MASK)
  for name in ("hdpo", "srpo", "kdrl_mask"):
    with pytest.raises(ValueError, match=f"'{name}' needs verifier rewards"):
      joint_opd_advantages(name, ADV, TEACHER, LOGP, None, MASK, group_ids=GROUPS)
  with pytest.raises(ValueError, match="needs step= and total_steps="):
    joint_opd_advantages("kdrl_annealing", ADV, TEACHER, LOGP, None, MASK)


# ---- HDPO groups, annealing ----


def test_hdpo_groups_need_not_be_contiguous():
  order = np.array([2, 0, 3, 1])
  terms = joint_opd_advantages("hdpo", ADV[order], TEACHER[order], LOGP[order], REWARDS[order],
                               MASK[order], group_ids=GROUPS[order],
                               eos_mask=final_eos_mask(MASK[order], ENDS_WITH_EOS[order]))
  np.testing.assert_allclose(terms.adv, _expected("hdpo")[order], atol=1e-7)


def test_annealed_beta_is_linear_from_step_one_to_the_last():
  np.testing.assert_allclose([annealed_beta(k, 150) for k in (1, 75.5, 150, 151)],
                             [0.2, 0.101, 0.002, 0.002], rtol=1e-5)
  late = _call("kdrl_annealing", step=150).adv
  np.testing.assert_allclose(late, np.where(MASK > 0, ADV[:, None], 0.0) + 0.002 * D, atol=1e-7)
  fn = jax.jit(lambda s: _call("kdrl_annealing", step=s).adv)
  for s in (1, 2, 3):
    fn(jnp.int32(s))
  assert fn._cache_size() == 1


# ---- the method: hard switch and the PROPOSAL rule ----


def test_hard_switch_at_step_s():
  fn = jax.jit(opd_then_rl_advantages)
  eos = final_eos_mask(MASK, ENDS_WITH_EOS)
  for step in (1, 60):
    np.testing.assert_allclose(fn(step, ADV, TEACHER, LOGP, MASK, switch_step=60, eos_mask=eos),
                               D, atol=1e-7)
  np.testing.assert_allclose(fn(61, ADV, TEACHER, LOGP, MASK, switch_step=60, eos_mask=eos),
                             np.where(MASK > 0, ADV[:, None], 0.0), atol=1e-7)
  assert fn._cache_size() == 1  # step and S are traced: switching does not recompile


def test_auto_switch_rule():
  hist = [(0, 0.10), (10, 0.30), (20, 0.40), (30, 0.45), (40, 0.452), (50, 0.46)]
  # 0.452 − max(0.30, 0.40, 0.45) = 0.002 < 0.005 at step 40.
  assert auto_switch_step(hist, total_steps=150) == 40
  # Before the plateau only the budget cap 0.4·150 = 60 (the paper's S) applies; 0.4·120 = 48.
  for n in range(5):
    assert auto_switch_step(hist[:n], total_steps=150) == 60
  assert auto_switch_step([], total_steps=120) == 48
  # S never grows as the history grows, and evaluations after S do not move it.
  assert auto_switch_step(hist + [(70, 0.1), (80, 0.9)], total_steps=150) == 40
  # A plateau after the budget cap: the cap wins.
  slow = [(0, 0.1), (20, 0.2), (40, 0.3), (60, 0.4), (80, 0.4)]
  assert auto_switch_step(slow, total_steps=150) == 60
  # The knobs: a larger δ stops at the first eligible evaluation, a larger window later.
  assert auto_switch_step(hist, total_steps=150, delta=0.06) == 30
  assert auto_switch_step(hist, total_steps=150, window=1) == 40
  assert auto_switch_step(hist, total_steps=1000, budget_fraction=1.0, delta=0.0) == 1000
  # Exactly δ of improvement keeps OPD going (strict <).
  assert auto_switch_step([(0, 0.0), (1, 0.0), (2, 0.0), (3, 0.5)], total_steps=100,
                          delta=0.5) == 40
  with pytest.raises(ValueError, match="must increase"):
    auto_switch_step([(10, 0.1), (10, 0.2)], total_steps=150)


# ---- sharding ----


def _mesh():
  assert jax.device_count() == 8, "tests/conftest.py should give 8 fake CPU devices"
  return Mesh(np.array(jax.devices()), ("data",))


def _big_batch(make_rollout):
  r = make_rollout(batch=16, empty_row=True)
  rng = np.random.default_rng(5)
  rewards = rng.choice([0.0, 1.0], size=16, p=[0.7, 0.3]).astype(np.float32)
  groups = (np.arange(16) % 4).astype(np.int32)  # every group spans several devices
  rewards[groups == 2] = 0.0  # one hopeless prompt
  eos = np.asarray(final_eos_mask(r["mask"]))
  return r["adv"], r["logp_padded"], r["old_logp"], rewards, r["mask"], groups, eos


@pytest.mark.parametrize("name", NAMES)
def test_sharded_equals_single_device(make_rollout, name):
  adv, teacher, logp, rewards, mask, groups, eos = _big_batch(make_rollout)

  @jax.jit
  def fn(adv, teacher, logp, rewards, mask, groups, eos):
    return joint_opd_advantages(name, adv, teacher, logp, rewards, mask, group_ids=groups,
                                num_groups=4, eos_mask=eos, step=7, total_steps=20)

  args = (adv, teacher, logp, rewards, mask, groups, eos)
  single = fn(*[jax.device_put(a, jax.devices()[0]) for a in args])
  rows = NamedSharding(_mesh(), P("data"))
  sharded_args = [jax.device_put(jnp.asarray(a), rows) for a in args]
  assert len(sharded_args[0].sharding.device_set) == 8
  sharded = fn(*sharded_args)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), sharded,
               single)
  if name == "hdpo":  # the hopeless prompt is there and gets the teacher term
    assert np.any(np.asarray(single.adv)[groups == 2] != 0)


def test_hdpo_shard_map_with_axis_name_equals_single_device(make_rollout):
  adv, teacher, logp, rewards, mask, groups, eos = _big_batch(make_rollout)

  def local(adv, teacher, logp, rewards, mask, groups, eos):
    return joint_opd_advantages("hdpo", adv, teacher, logp, rewards, mask, group_ids=groups,
                                num_groups=4, axis_name="data", eos_mask=eos).adv

  fn = jax.jit(jax.shard_map(local, mesh=_mesh(), in_specs=(P("data"),) * 7,
                             out_specs=P("data")))
  got = fn(adv, teacher, logp, rewards, mask, groups, eos)
  ref = joint_opd_advantages("hdpo", adv, teacher, logp, rewards, mask, group_ids=groups,
                             num_groups=4, eos_mask=eos).adv
  np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-7)
  # Without the psum each device only sees its own rows of a group: a different answer.
  local_only = jax.jit(jax.shard_map(
    lambda *a: joint_opd_advantages("hdpo", *a[:5], group_ids=a[5], num_groups=4,
                                    eos_mask=a[6]).adv,
    mesh=_mesh(), in_specs=(P("data"),) * 7, out_specs=P("data")))
  assert not np.allclose(local_only(adv, teacher, logp, rewards, mask, groups, eos), ref)
