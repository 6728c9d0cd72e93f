"""LoRA adapters: unmerged forward = merged forward, b = 0 = the base, shapes / axes, errors."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_post.models import (
  CausalLM,
  LoraParam,
  add_lora,
  get_model_config,
  merge_lora,
  without_lora,
)
from jaxrl_post.models.lora import DEFAULT_TARGETS, merge_adapters
from jaxrl_post.parallel import axes


@functools.cache
def _base_model(scan_layers):
  config = get_model_config("tiny", vocab_size=64, scan_layers=scan_layers,
                            param_dtype=jnp.float32, dtype=jnp.float32)
  return CausalLM(config, rngs=nnx.Rngs(0))


def _model(scan_layers=False):
  """A fresh copy of one random `tiny` model (building one draws every parameter eagerly)."""
  return nnx.clone(_base_model(scan_layers))


def _tokens():
  return jax.random.randint(jax.random.key(1), (2, 9), 0, 64)


@functools.partial(jax.jit, static_argnums=2)
def _logits(state, tokens, graphdef):
  return nnx.merge(graphdef, state)(tokens)


def _forward(model, tokens):
  """Jitted (an eager forward dispatches op by op: seconds per call)."""
  graphdef, state = nnx.split(model)
  return _logits(state, tokens, graphdef)


def _randomise_b(model):
  """Non-zero b (a fresh model's are zeros), so the adapters change the outputs."""
  rng = np.random.RandomState(7)  # host draws: no random kernel to compile per shape
  nnx.update(model, jax.tree.map(
    lambda x: x + 0.1 * rng.standard_normal(x.shape).astype(np.float32),
    nnx.state(model, LoraParam)))


@pytest.mark.parametrize("scan_layers", [False, True])
def test_zero_b_is_the_base_and_unmerged_equals_merged(scan_layers):
  model = _model(scan_layers)
  tokens = _tokens()
  base = _forward(model, tokens)
  add_lora(model, rank=4, alpha=8.0, targets=DEFAULT_TARGETS, rngs=nnx.Rngs(3))
  # b = 0: s·(x·a)·0 adds exact zeros, whatever a is.
  np.testing.assert_array_equal(_forward(model, tokens), base)

  _randomise_b(model)
  adapted = _forward(model, tokens)
  assert np.abs(adapted - base).max() > 1e-2  # the adapters do something
  # The sampler's form: the base graph with merged kernels (jitted `merge_lora`).
  merged_model = without_lora(model)
  _, adapters, frozen = nnx.split(model, LoraParam, ...)
  nnx.update(merged_model, merge_adapters(adapters, frozen))
  np.testing.assert_allclose(_forward(merged_model, tokens), adapted, atol=2e-5, rtol=1e-5)


def test_adapter_shapes_axes_and_scale():
  model = _model(scan_layers=True)
  add_lora(model, rank=3, alpha=6.0, targets=("q_proj", "o_proj", "down_proj"),
           rngs=nnx.Rngs(0))
  attn, mlp = model.layers.attn, model.layers.mlp
  c = model.config
  layers = c.num_layers
  assert attn.q_proj_lora_a.shape == (layers, c.embed_dim, 3)
  assert attn.q_proj_lora_b.shape == (layers, 3, c.num_heads, c.head_dim)
  assert attn.o_proj_lora_a.shape == (layers, c.num_heads, c.head_dim, 3)
  assert attn.o_proj_lora_b.shape == (layers, 3, c.embed_dim)
  assert mlp.down_proj_lora_b.shape == (layers, 3, c.embed_dim)
  # The kernel's axes, the rank axis unnamed (replicated under every rule table).
  assert attn.q_proj_lora_a.get_metadata()["out_sharding"] == (axes.LAYERS, axes.EMBED, None)
  assert attn.q_proj_lora_b.get_metadata()["out_sharding"] == (
    axes.LAYERS, None, axes.HEADS, axes.HEAD_DIM)
  assert attn.q_proj_lora_a.get_metadata()["lora_scale"] == 2.0
  assert not hasattr(attn, "k_proj_lora_a")
  # peft's init of a: U(±1/√d_in); b starts at zero.
  bound = 1 / np.sqrt(c.embed_dim)
  assert 0.5 * bound < np.abs(attn.q_proj_lora_a[...]).max() <= bound
  assert not np.any(attn.q_proj_lora_b[...])
  # Filters: the adapters are Params too, and LoraParam selects them alone.
  all_params = nnx.state(model, nnx.Param)
  adapters = nnx.state(model, LoraParam)
  assert len(jax.tree.leaves(adapters)) == 6
  assert len(jax.tree.leaves(all_params)) == len(jax.tree.leaves(nnx.state(_model(True)))) + 6


def test_merge_lora_is_base_shaped_and_exact():
  model = _model()
  add_lora(model, rank=2, alpha=3.0, targets=("v_proj",), rngs=nnx.Rngs(0))
  _randomise_b(model)
  attn = model.layers[1].attn
  merged = merge_lora(nnx.state(model))
  assert jax.tree.structure(merged) == jax.tree.structure(nnx.state(_model()))
  # K + s·a·b with s = α / r = 1.5, by hand for one layer's [64, 2, 16] kernel.
  expected = attn.v_proj[...] + 1.5 * np.einsum("dr,rnh->dnh", attn.v_proj_lora_a[...],
                                                attn.v_proj_lora_b[...])
  np.testing.assert_allclose(merged["layers"][1]["attn"]["v_proj"][...], expected, atol=1e-6)


def test_without_lora_shares_the_base_arrays():
  model = _model()
  add_lora(model, rank=2, alpha=2.0, targets=("v_proj",), rngs=nnx.Rngs(0))
  base = without_lora(model)
  assert not jax.tree.leaves(nnx.state(base, LoraParam))
  assert base.embed.get_value() is model.embed.get_value()  # no copy
  assert hasattr(model.layers[0].attn, "v_proj_lora_a")  # the original keeps its adapters


def test_rank_zero_leaves_the_model_alone():
  model = _model()
  add_lora(model, rank=0, alpha=16.0, targets=DEFAULT_TARGETS, rngs=nnx.Rngs(0))
  assert not jax.tree.leaves(nnx.state(model, LoraParam))


class _OnlyUp(nnx.Module):
  def __init__(self):
    self.up_proj = nnx.Param(jnp.ones((4, 6)))


def test_errors_name_what_is_wrong():
  with pytest.raises(ValueError, match=r"config.lora.rank=-1 must be an int >= 0"):
    add_lora(_model(), rank=-1, alpha=1.0, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"\['lm_head'\].*valid names: q_proj, k_proj"):
    add_lora(_model(), rank=2, alpha=1.0, targets=("q_proj", "lm_head"), rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"\['q_proj'\] match no parameter.*projections: up_proj"):
    add_lora(_OnlyUp(), rank=2, alpha=1.0, targets=("q_proj",), rngs=nnx.Rngs(0))
  # tiny: k_proj is 64 × (2 kv heads × 16) = 64 × 32.
  with pytest.raises(ValueError, match=r"rank=33 is larger than k_proj's matrix \(64 × 32"):
    add_lora(_model(), rank=33, alpha=1.0, targets=("q_proj", "k_proj"), rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="config.lora.alpha"):
    add_lora(_model(), rank=2, alpha=0.0, rngs=nnx.Rngs(0))
  model = _model()
  add_lora(model, rank=2, alpha=1.0, targets=("q_proj",), rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="already has LoRA adapters"):
    add_lora(model, rank=2, alpha=1.0, targets=("q_proj",), rngs=nnx.Rngs(0))
