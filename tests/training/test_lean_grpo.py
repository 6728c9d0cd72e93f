"""training/lean_grpo.py: the native / retain / reweight schedules give the same Flow-GRPO
gradient for the same noise, with |S| fewer forwards per sample; the correction must come before
the collective (LeanGRPO arXiv 2609.03528, §3 and Appendix C); sharded == single device."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import Mesh

from jaxrl_post.losses.flow_grpo import flow_grpo_loss
from jaxrl_post.models.velocity import VelocityMLP
from jaxrl_post.sampling import flow_sde
from jaxrl_post.tasks.flow_targets import target_reward
from jaxrl_post.training import lean_grpo as lg

G, M, T, SELECTED = 2, 8, 4, (0, 2)
TARGET = jnp.array([2.0, 0.0])
BETA = 0.04  # the KL term on: the schedules must carry it too


@functools.lru_cache(maxsize=1)
def _setup():
  model = VelocityMLP(2, hidden=16, depth=2, num_conditions=2, rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(model, nnx.Param)

  def apply(p, x, t, c):
    return nnx.merge(graphdef, p)(x, t, c)

  rollout = lg.Rollout(jax.random.normal(jax.random.key(0), (G, M, 2)),
                       jax.random.normal(jax.random.key(1), (T, G, M, 2)), jnp.array([0, 1]))
  ref_params = jax.tree.map(lambda x: 1.1 * x, params)
  return apply, params, ref_params, rollout


def _reward(x, c):
  return target_reward(x, TARGET)


def _flat(tree):
  return np.concatenate([np.ravel(np.asarray(x)) for x in jax.tree.leaves(tree)])


@functools.lru_cache(maxsize=None)
def _gradient(schedule, beta):
  """The schedule's output and its `CountingApply` (the forward rows its model ran)."""
  apply, params, ref_params, rollout = _setup()
  counted = lg.CountingApply(apply)
  ref_fn = None if beta == 0 else (lambda x, t, c: apply(ref_params, x, t, c))
  settings = lg.FlowGRPOSettings(beta=beta)
  out = jax.jit(lambda p: lg.flow_grpo_gradient(
    schedule, counted, p, ref_fn, rollout, _reward, grid=flow_sde.time_grid(T),
    selected=SELECTED, settings=settings))(params)
  jax.block_until_ready(out)
  return out, counted


def _close(a, b, rtol=1e-5):
  a, b = _flat(a), _flat(b)
  np.testing.assert_allclose(b, a, rtol=rtol, atol=rtol * np.max(np.abs(a)))


def test_three_schedules_give_the_same_gradient(beta=BETA):
  native, _ = _gradient("native", beta)
  assert np.linalg.norm(_flat(native.grads)) > 1e-3  # a real signal, not zeros
  for schedule in ("retain", "reweight"):
    out, _ = _gradient(schedule, beta)
    _close(native.grads, out.grads)
    np.testing.assert_allclose(out.rewards, native.rewards, rtol=1e-5)  # same noise
    np.testing.assert_allclose(out.loss, native.loss, atol=1e-6)
    np.testing.assert_allclose(out.kl, native.kl, rtol=1e-5, atol=1e-9)
  assert float(native.kl) > 0


def test_model_forward_counts_native_pays_s_extra_per_sample():
  n = G * M
  counts = {}
  for schedule in ("native", "retain", "reweight"):
    out, counted = _gradient(schedule, BETA)
    counts[schedule] = counted.wait_for(int(out.forwards))
    assert int(out.forwards) == counts[schedule], schedule
  assert counts["retain"] == counts["reweight"] == n * T
  assert counts["native"] == n * (T + len(SELECTED))


def _ranks_gradients(ranks=4):
  """Reweight with R simulated ranks (vmap with an axis name), combined in both orders."""
  apply, params, _, rollout = _setup()
  q = M // ranks
  split = lambda x, axis: jnp.moveaxis(  # noqa: E731
    x.reshape(x.shape[:axis] + (ranks, q) + x.shape[axis + 1:]), axis, 0)
  settings = lg.FlowGRPOSettings()
  total = G * M * len(SELECTED)

  def rank(x_init, noise):
    local = lg.Rollout(x_init, noise, rollout.cond)
    x_final, prov, _, _ = lg.reweight_provisional(
      apply, params, None, local, grid=flow_sde.time_grid(T), selected=SELECTED,
      settings=settings)
    adv = lg.advantages(_reward(x_final, None).reshape(G, q), settings, "r")
    return [lg.combine_provisional(adv.reshape(-1) / total, prov, axis_name="r", order=order)
            for order in ("correct_then_sync", "sync_then_correct")]

  out = jax.jit(jax.vmap(rank, axis_name="r"))(split(rollout.x_init, 1), split(rollout.noise, 2))
  return jax.tree.map(lambda g: g[0], out)


def test_correct_before_sync_equals_native_and_sync_before_correct_does_not():
  native = _gradient("native", 0.0)[0].grads
  right, mixed = _ranks_gradients()
  _close(native, right)
  mixed = _flat(mixed)
  err = np.linalg.norm(mixed - _flat(native)) / np.linalg.norm(_flat(native))
  assert err > 0.5, err
  # Non-identifiable by any scalar: the best least-squares scalar multiple of the synced
  # provisional sum still misses the native gradient.
  a, b = _flat(native), mixed
  c = a @ b / (b @ b)
  assert np.linalg.norm(a - c * b) / np.linalg.norm(a) > 0.5


def test_sync_before_correct_is_right_only_when_all_advantages_are_equal():
  prov = {"w": jax.random.normal(jax.random.key(2), (3, 4, 5))}
  for adv, same in ((jnp.full((3,), 0.7), True), (jnp.array([1.0, -0.5, 0.2]), False)):
    right = lg.combine_provisional(adv, prov)
    mixed = lg.combine_provisional(adv, prov, order="sync_then_correct")
    assert np.allclose(right["w"], mixed["w"], rtol=1e-5) == same
  np.testing.assert_allclose(
    lg.combine_provisional(jnp.array([1.0, -0.5, 0.2]), prov)["w"],
    np.einsum("q,q...->...", np.array([1.0, -0.5, 0.2]), prov["w"]), rtol=1e-5)


@pytest.mark.parametrize("schedule", ["native", "reweight"])
def test_sharded_over_eight_devices_matches_one_device(schedule):
  apply, params, ref_params, rollout = _setup()
  mesh = Mesh(np.array(jax.devices()[:8]), ("data",))
  settings = lg.FlowGRPOSettings(beta=BETA)
  single, _ = _gradient(schedule, BETA)
  sharded = jax.jit(lambda p, rp: lg.sharded_flow_grpo_gradient(
    schedule, apply, p, rp, apply, rollout, _reward, mesh=mesh, grid=flow_sde.time_grid(T),
    selected=SELECTED, settings=settings))(params, ref_params)
  _close(single.grads, sharded.grads)
  np.testing.assert_allclose(sharded.rewards, single.rewards, rtol=1e-6)
  np.testing.assert_allclose(sharded.adv, single.adv, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(sharded.reward_mean, single.reward_mean, rtol=1e-6)
  assert int(sharded.forwards) == int(single.forwards)
  with pytest.raises(ValueError, match="M=6 samples must split evenly over the 8 ranks"):
    lg.sharded_flow_grpo_gradient(
      schedule, apply, params, None, None, lg.Rollout(rollout.x_init[:, :6],
                                                      rollout.noise[:, :, :6], None),
      _reward, mesh=mesh, grid=flow_sde.time_grid(T), selected=SELECTED,
      settings=lg.FlowGRPOSettings())


def test_flow_grpo_loss_clips_ratios_and_advantages():
  logp = jnp.array([[0.0, 0.1]])
  old = jnp.zeros((1, 2))
  # ρ = (1, e^0.1): with ε = 0.01 the second step's ratio is clipped (A > 0), advantage 7 → 5.
  loss, aux = flow_grpo_loss(logp, old, jnp.array([7.0]), epsilon=0.01, adv_clip_max=5.0)
  np.testing.assert_allclose(loss, -(5.0 * 1.0 + 5.0 * 1.01) / 2, rtol=1e-6)
  assert float(aux.clip_frac) == 0.5 and float(aux.adv_clipped_frac) == 1.0
  grad = jax.grad(lambda lp: flow_grpo_loss(lp, old, jnp.array([7.0]), epsilon=0.01)[0])(logp)
  np.testing.assert_allclose(grad, [[-2.5, 0.0]], rtol=1e-6)  # clipped step: no gradient
  loss, aux = flow_grpo_loss(old, old, jnp.array([1.0]), kl=jnp.array([[0.2, 0.4]]), beta=0.5)
  np.testing.assert_allclose(loss, -1.0 + 0.5 * 0.3, rtol=1e-6)
  with pytest.raises(ValueError, match="beta=0.5 needs kl"):
    flow_grpo_loss(old, old, jnp.array([1.0]), beta=0.5)


def test_bad_inputs_raise():
  apply, params, _, rollout = _setup()
  kw = dict(grid=flow_sde.time_grid(T), settings=lg.FlowGRPOSettings())
  with pytest.raises(ValueError, match=r"selected=\[0, 4\] must be distinct step indices"):
    lg.flow_grpo_gradient("native", apply, params, None, rollout, _reward, selected=(0, 4),
                          **kw)
  with pytest.raises(KeyError, match="unknown gradient_schedule 'lazy'"):
    lg.flow_grpo_gradient("lazy", apply, params, None, rollout, _reward, selected=(0,), **kw)
  with pytest.raises(ValueError, match="beta=0.1: give ref_fn"):
    lg.flow_grpo_gradient("native", apply, params, None, rollout, _reward, selected=(0,),
                          grid=flow_sde.time_grid(T), settings=lg.FlowGRPOSettings(beta=0.1))
  with pytest.raises(ValueError, match="grid of shape"):
    lg.flow_grpo_gradient("native", apply, params, None, rollout, _reward, selected=(0,),
                          grid=flow_sde.time_grid(T + 1), settings=lg.FlowGRPOSettings())
  with pytest.raises(ValueError, match="timestep_fraction=0"):
    lg.select_steps(10, 0.0)
