"""LoRA training: the step trains the adapters only, against a frozen base; adapter gradients
follow the chain rule through the merged kernel; the loop refuses LoRA for methods without it."""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from flax import nnx

from jaxrl_post.benchmarking import compile_sizes
from jaxrl_post.config_args import load_module
from jaxrl_post.models import CausalLM, LoraParam, add_lora, get_model_config
from jaxrl_post.models.lora import DEFAULT_TARGETS, merge_adapters, without_lora
from jaxrl_post.training import loop
from jaxrl_post.training.train_state import create_train_state, make_train_step

ROOT = Path(__file__).resolve().parents[2]


def _loss(model, batch):
  """Token cross-entropy (sum over the batch / its token count)."""
  logits = model(batch["tokens"][:, :-1])
  logp = jax.nn.log_softmax(logits)
  nll = -jnp.take_along_axis(logp, batch["tokens"][:, 1:, None], -1)[..., 0]
  return jnp.sum(nll) / batch["num_tokens"], {}


def _batch():
  tokens = jnp.asarray(np.random.RandomState(0).randint(0, 64, (4, 10)), jnp.int32)
  return {"tokens": tokens, "num_tokens": jnp.float32(4 * 9)}


@pytest.fixture(scope="module")
def lora_model():
  """`tiny` (float32) with rank-4 adapters on every projection and non-zero b."""
  config = get_model_config("tiny", vocab_size=64)
  model = CausalLM(config, rngs=nnx.Rngs(0))
  add_lora(model, rank=4, alpha=8.0, targets=DEFAULT_TARGETS, rngs=nnx.Rngs(1))
  rng = np.random.RandomState(2)
  nnx.update(model, jax.tree.map(
    lambda x: x + 0.05 * rng.standard_normal(x.shape).astype(np.float32),
    nnx.state(model, LoraParam)))
  return model


def test_step_trains_adapters_only(lora_model):
  model = nnx.clone(lora_model)
  optimizer = optax.adam(1e-2)
  state = create_train_state(model, optimizer, jax.random.key(0), trainable=LoraParam)
  graphdef, adapters, frozen = nnx.split(model, LoraParam, ...)
  # The state and every optimizer moment are adapter-shaped: no moment of a frozen kernel.
  adapter_shapes = sorted(x.shape for x in jax.tree.leaves(adapters))
  assert sorted(x.shape for x in jax.tree.leaves(state.params)) == adapter_shapes
  mu, nu = state.opt_state[0].mu, state.opt_state[0].nu
  assert sorted(x.shape for x in jax.tree.leaves(mu)) == adapter_shapes
  assert sorted(x.shape for x in jax.tree.leaves(nu)) == adapter_shapes
  base_before = jax.tree.map(np.array, frozen)
  adapters_before = jax.tree.map(np.array, state.params)

  step = make_train_step(graphdef, _loss, optimizer, shared=("num_tokens",), frozen=frozen)
  for _ in range(2):
    state, metrics = step(state, _batch())
  assert int(state.step) == 2 and metrics["grad_norm"] > 0
  # The base is bit-identical (not donated, not updated); every adapter moved.
  for before, after in zip(jax.tree.leaves(base_before), jax.tree.leaves(frozen)):
    np.testing.assert_array_equal(before, after)
  for before, after in zip(jax.tree.leaves(adapters_before), jax.tree.leaves(state.params)):
    assert np.abs(before - np.asarray(after)).max() > 0
  # `lower` works on the closure (what scripts/aot_compile.py compiles).
  assert step.lower(state, _batch()) is not None


def test_adapter_gradients_follow_the_chain_rule(lora_model):
  """With K' = K + s·a·b and G = ∂L/∂K' (the merged model's kernel gradient):
  ∂L/∂a = s·G·bᵀ and ∂L/∂b = s·aᵀ·G (kernels flattened to [d_in, d_out])."""
  graphdef, adapters, frozen = nnx.split(lora_model, LoraParam, ...)
  batch = _batch()

  def lora_loss(adapters):
    return _loss(nnx.merge(graphdef, adapters, frozen), batch)[0]

  grads = jax.jit(jax.grad(lora_loss))(adapters)
  base_graph, merged = nnx.split(without_lora(lora_model))
  merged = merge_adapters(adapters, frozen)
  merged_grads = jax.jit(jax.grad(lambda p: _loss(nnx.merge(base_graph, p), batch)[0]))(merged)
  s = 8.0 / 4
  for layer in range(2):
    for module, name, n_in in (("attn", "q_proj", 1), ("attn", "o_proj", 2),
                               ("mlp", "down_proj", 1)):
      ours, theirs = grads["layers"][layer][module], adapters["layers"][layer][module]
      a, b = theirs[name + "_lora_a"][...], theirs[name + "_lora_b"][...]
      g = merged_grads["layers"][layer][module][name][...]
      g2 = g.reshape(int(np.prod(g.shape[:n_in])), -1)
      a2, b2 = a.reshape(-1, 4), b.reshape(4, -1)
      np.testing.assert_allclose(ours[name + "_lora_a"][...].reshape(a2.shape), s * g2 @ b2.T,
                                 rtol=1e-4, atol=1e-7)
      np.testing.assert_allclose(ours[name + "_lora_b"][...].reshape(b2.shape), s * a2.T @ g2,
                                 rtol=1e-4, atol=1e-7)


class _NoLora:
  name = "plain"


def test_loop_checks_lora_options():
  config = ml_collections.ConfigDict(dict(lora=dict(rank=4, alpha=16.0, targets=("q_proj",))))
  with pytest.raises(ValueError, match=r"config.lora.rank=4: method 'plain' does not support"):
    loop.lora_rank(config, _NoLora())
  supported = type("Supported", (), {"name": "grpo", "supports_lora": True})()
  assert loop.lora_rank(config, supported) == 4
  config.lora.rank = -2
  with pytest.raises(ValueError, match=r"config.lora.rank=-2 must be an int >= 0"):
    loop.lora_rank(config, supported)
  config.lora.rank = 2
  config.lora.targets = ("q_proj", "qkv")
  with pytest.raises(ValueError, match=r"config.lora.targets.*\['qkv'\]"):
    loop.lora_rank(config, supported)
  config.lora.rank = 0  # off: nothing is checked, any method runs
  assert loop.lora_rank(config, _NoLora()) == 0
  assert loop.lora_rank(ml_collections.ConfigDict(), _NoLora()) == 0


def test_aot_compile_reports_the_lora_step():
  config = load_module(ROOT / "configs" / "grpo_gsm8k.py").get_config("model=qwen3_0p6b")
  assert "lora_rank" not in compile_sizes(config)
  config.lora.rank = 8
  sizes = compile_sizes(config)
  assert (sizes["lora_rank"], sizes["lora_alpha"]) == (8, 16.0)
  assert sizes["lora_targets"] == list(DEFAULT_TARGETS)

  result = subprocess.run(
    [sys.executable, "scripts/aot_compile.py", "--model=tiny", "--ici=fsdp=2",
     "--num_cpu_devices=2", "--batch=4", "--prompt_len=8", "--completion_len=8",
     "--lora_rank=4", "--lora_targets=q_proj,down_proj", "--skip=prefill,decode_step"],
    capture_output=True, text=True, timeout=600, check=False, cwd=ROOT,
    env=dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu"))
  assert result.returncode == 0, result.stderr[-3000:]
  report = json.loads([line for line in result.stdout.splitlines() if line.startswith("{")][0])
  c = get_model_config("tiny")
  # float32 adapters sharded like their kernels (fsdp = 2 splits `embed`; `heads` and `mlp`
  # map to `tensor`, size 1 here): q's a `[embed, 4]` and down's b `[4, embed]` are halved,
  # q's b `[4, heads, head_dim]` and down's a `[mlp, 4]` replicated.
  q = c.embed_dim * 4 // 2 + 4 * c.num_heads * c.head_dim
  down = c.mlp_dim * 4 + 4 * c.embed_dim // 2
  assert report["params_bytes"] == c.num_layers * (q + down) * 4
  assert 0 <= report["opt_state_bytes"] - 2 * report["params_bytes"] < 1024
  assert report["lora_rank"] == 4 and report["frozen_bytes"] > 10 * report["params_bytes"]
