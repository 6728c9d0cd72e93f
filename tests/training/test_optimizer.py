"""`setup.build_optimizer`: the schedule and the two update rules, checked against hand values."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from jaxrl_post.training import base_configs
from jaxrl_post.training import setup as run_setup


def _config(**kwargs):
  config = ml_collections.ConfigDict()
  config.optimizer = base_configs.optimizer_config(**kwargs)
  return config


def _first_update(config, grads, params):
  optimizer = run_setup.build_optimizer(config, total_steps=10)
  updates, _ = optimizer.update(grads, optimizer.init(params), params)
  return np.asarray(updates)


def test_adamw_first_step_is_lr_times_sign():
  # Adam's bias-corrected first step: m̂ = g, v̂ = g², so Δ = -lr · g / (|g| + ε) ≈ -lr · sign(g).
  grads = jnp.asarray([0.3, -0.02, 0.0])
  update = _first_update(_config(lr=0.1), grads, jnp.zeros(3))
  np.testing.assert_allclose(update, [-0.1, 0.1, 0.0], atol=1e-6)


def test_sgd_step_is_lr_times_gradient_after_clipping():
  # ‖g‖ = 5 > grad_clip = 1: the gradient is scaled to norm 1 first, then Δ = -lr · g.
  grads = jnp.asarray([3.0, 4.0])
  update = _first_update(_config(name="sgd", lr=0.5), grads, jnp.zeros(2))
  np.testing.assert_allclose(update, [-0.5 * 0.6, -0.5 * 0.8], rtol=1e-6)


def test_sgd_momentum_accumulates():
  optimizer = run_setup.build_optimizer(_config(name="sgd", lr=0.1, momentum=0.5,
                                                decay_steps=10**9), total_steps=10)
  params, grads = jnp.zeros(1), jnp.asarray([0.5])
  state = optimizer.init(params)
  first, state = optimizer.update(grads, state, params)
  second, _ = optimizer.update(grads, state, params)
  # Trace t₁ = g, t₂ = 0.5·t₁ + g = 1.5 g.
  np.testing.assert_allclose([first[0], second[0]], [-0.05, -0.075], rtol=1e-5)


def test_warmup_then_cosine_to_a_tenth():
  config = _config(lr=1.0, warmup_steps=2)
  schedule_probe = run_setup.build_optimizer(config, total_steps=6)
  params = jnp.zeros(1)
  state = schedule_probe.init(params)
  sizes = []
  for _ in range(6):
    update, state = schedule_probe.update(jnp.ones(1), state, params)
    sizes.append(-float(update[0]))
  # Warm-up 0 → 1 over 2 steps, then cosine from 1 to 0.1 over the remaining 4.
  cosine = [0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * k / 4)) for k in range(4)]
  np.testing.assert_allclose(sizes, [0.0, 0.5, *cosine], atol=1e-5)


def test_unknown_optimizer_names_the_config_key():
  with pytest.raises(ValueError, match="config.optimizer.name='adam'"):
    run_setup.build_optimizer(_config(lr=1e-3, name="adam"), total_steps=10)


def test_sgd_rejects_weight_decay():
  with pytest.raises(ValueError, match="weight_decay"):
    run_setup.build_optimizer(_config(lr=1e-3, name="sgd", weight_decay=0.1), total_steps=10)


def test_every_config_block_has_the_same_keys():
  from configs import grpo_arith, sft_arith
  for config in (grpo_arith.get_config(), sft_arith.get_config()):
    assert set(config.optimizer) == set(base_configs.optimizer_config(lr=1.0))
  assert isinstance(run_setup.build_optimizer(grpo_arith.get_config(), 10),
                    optax.GradientTransformation)


# ==== float32 optimizer state (config.optimizer.moments_dtype) ====


def _reference_adamw(config, total_steps):
  """The chain `build_optimizer` makes, built here from optax alone (float32 throughout)."""
  opt = config.optimizer
  schedule = optax.warmup_cosine_decay_schedule(
    init_value=0.0, peak_value=opt.lr, warmup_steps=opt.warmup_steps,
    decay_steps=total_steps, end_value=opt.lr * 0.1)
  return optax.chain(optax.clip_by_global_norm(opt.grad_clip),
                     optax.adamw(schedule, b1=opt.b1, b2=opt.b2, eps=opt.eps,
                                 weight_decay=opt.weight_decay))


def _trajectory(optimizer, params, grads_per_step):
  state = optimizer.init(params)
  updates = []
  for grads in grads_per_step:
    update, state = optimizer.update(grads, state, params)
    params = optax.apply_updates(params, update)
    updates.append(update)
  return params, state, updates


def _problem(dtype, steps=5, seed=0):
  rng = np.random.RandomState(seed)
  params = {"w": jnp.asarray(rng.randn(4, 3), dtype), "b": jnp.asarray(rng.randn(3), dtype)}
  grads = [{k: jnp.asarray(rng.randn(*v.shape) * 2.0, dtype) for k, v in params.items()}
           for _ in range(steps)]
  return params, grads


@pytest.mark.parametrize("moments_dtype", ["float32", "params"])
def test_adamw_equals_optax_adamw_in_float32(moments_dtype):
  """Warm-up, clipping (‖g‖ ≈ 7 > 1) and weight decay: both settings are optax's AdamW."""
  config = _config(lr=0.1, warmup_steps=2, weight_decay=0.05, moments_dtype=moments_dtype)
  params, grads = _problem(jnp.float32)
  ours, ours_state, _ = _trajectory(run_setup.build_optimizer(config, 10), params, grads)
  ref, ref_state, _ = _trajectory(_reference_adamw(config, 10), params, grads)
  for a, b in zip(jax.tree.leaves((ours, ours_state)), jax.tree.leaves((ref, ref_state))):
    np.testing.assert_array_equal(a, b)


def test_bf16_params_get_float32_moments_and_float32_arithmetic():
  """With bf16 parameters and moments_dtype=float32, the state is float32 and each update
  is the float32 AdamW update on the upcast gradients and parameters, rounded once."""
  config = _config(lr=0.1, warmup_steps=2, weight_decay=0.05)
  params, grads = _problem(jnp.bfloat16)
  optimizer = run_setup.build_optimizer(config, 10)
  state = optimizer.init(params)
  moments = [x for x in jax.tree.leaves(state) if x.ndim]
  assert len(moments) == 4 and all(m.dtype == jnp.float32 for m in moments)
  reference = _reference_adamw(config, 10)
  up = lambda tree: jax.tree.map(lambda x: x.astype(jnp.float32), tree)  # noqa: E731
  ref_state = reference.init(up(params))
  for g in grads:
    update, state = optimizer.update(g, state, params)
    ref_update, ref_state = reference.update(up(g), ref_state, up(params))
    assert all(u.dtype == jnp.bfloat16 for u in jax.tree.leaves(update))
    for a, b in zip(jax.tree.leaves(update), jax.tree.leaves(ref_update)):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b.astype(jnp.bfloat16)))
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(ref_state)):
      np.testing.assert_array_equal(a, b)
    params = optax.apply_updates(params, update)
  assert all(p.dtype == jnp.bfloat16 for p in jax.tree.leaves(params))


def test_params_moments_follow_bf16_params():
  params, _ = _problem(jnp.bfloat16)
  optimizer = run_setup.build_optimizer(_config(lr=0.1, moments_dtype="params"), 10)
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(optimizer.init(params)) if x.ndim)


def test_unknown_moments_dtype_names_the_config_key():
  with pytest.raises(ValueError, match=r"config\.optimizer\.moments_dtype='bf16': expected "
                                       r"'float32' or 'params'"):
    run_setup.build_optimizer(_config(lr=1e-3, moments_dtype="bf16"), total_steps=10)
