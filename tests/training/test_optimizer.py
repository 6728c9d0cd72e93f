"""`setup.build_optimizer`: the schedule and the two update rules, checked against hand values."""

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
