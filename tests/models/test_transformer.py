"""CausalLM: KV-cache equivalence, attention paths, dtypes, sharding, configs."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import Mesh

from jaxrl_post import parallel
from jaxrl_post.models import (
  CausalLM,
  ModelConfig,
  default_positions,
  get_model_config,
  transformer,
)
from jaxrl_post.models.configs import MODEL_PRESETS

FAMILY_OVERRIDES = {
  "llama": dict(family="llama", o_bias=True, qkv_bias=True, mlp_bias=True,
                rope_scaling=dict(rope_type="llama3", factor=8.0,
                                  original_max_position_embeddings=16)),
  "qwen2": dict(family="qwen2", qkv_bias=True, tie_embeddings=True),
  "qwen3": dict(family="qwen3", qk_norm=True, head_dim=24),
  "smollm3": dict(family="smollm3", nope_layers=(1,), tie_embeddings=True),
}


def _randomize(model: CausalLM, seed: int = 0) -> CausalLM:
  """Perturbs every parameter (norm scales and biases too), so that a wrong
  mapping of any tensor shows up in the logits."""
  graphdef, state = nnx.split(model)
  leaves, treedef = jax.tree.flatten(state)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  leaves = [x + 0.05 * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)]
  return nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves))


@nnx.jit
def _forward(model, tokens, mask=None, positions=None):
  # Jitted: eager mode would compile every primitive separately (much slower).
  return model(tokens, attention_mask=mask, positions=positions)


def _model(family: str, **kw) -> CausalLM:
  config = get_model_config("tiny", **(FAMILY_OVERRIDES[family] | kw))
  return _randomize(CausalLM(config, rngs=nnx.Rngs(1)))


def _left_padded_batch(rng, batch=3, length=12, vocab=256):
  tokens = rng.randint(0, vocab, (batch, length)).astype(np.int32)
  mask = np.ones((batch, length), bool)
  mask[1, :4] = False  # row 1 has 4 pad tokens, row 2 has 7
  mask[2, :7] = False
  tokens[~mask] = 0
  return jnp.asarray(tokens), jnp.asarray(mask)


@pytest.mark.parametrize("scan_layers", [False, True], ids=["unrolled", "scanned"])
@pytest.mark.parametrize("family", sorted(FAMILY_OVERRIDES))
def test_prefill_plus_decode_equals_full_forward(family, scan_layers):
  model = _model(family, scan_layers=scan_layers)
  prompt_len, steps = 8, 6
  tokens, mask = _left_padded_batch(np.random.RandomState(0), length=prompt_len + steps)
  mask = mask.at[:, prompt_len:].set(True)
  positions = default_positions(mask)
  full = _forward(model, tokens, mask)

  graphdef, state = nnx.split(model)

  @jax.jit
  def step(state, cache, tokens, positions, mask):
    return nnx.merge(graphdef, state)(tokens, positions=positions, attention_mask=mask,
                                      cache=cache)

  cache = model.init_cache(tokens.shape[0], prompt_len + steps + 2)
  logits, cache = step(state, cache, tokens[:, :prompt_len], positions[:, :prompt_len],
                       mask[:, :prompt_len])
  pieces = [logits]
  for i in range(prompt_len, prompt_len + steps):
    logits, cache = step(state, cache, tokens[:, i:i + 1], positions[:, i:i + 1],
                         mask[:, i:i + 1])
    pieces.append(logits)
  cached = jnp.concatenate(pieces, axis=1)
  valid = np.asarray(mask)
  np.testing.assert_allclose(np.asarray(cached)[valid], np.asarray(full)[valid], atol=1e-5)
  assert int(cache.index) == prompt_len + steps
  # One compile for the prefill shape and one for the decode shape, no more.
  assert step._cache_size() == 2


def test_left_padding_does_not_change_real_tokens():
  """A left-padded row gives the logits of the same row without padding."""
  model = _model("qwen3")
  tokens, mask = _left_padded_batch(np.random.RandomState(1))
  padded = _forward(model, tokens, mask)
  unpadded = _forward(model, tokens[2:, 7:])
  np.testing.assert_allclose(padded[2, 7:], unpadded[0], atol=1e-5)


@pytest.mark.parametrize("family", sorted(FAMILY_OVERRIDES))
def test_attention_paths_agree(family):
  """jax.nn.dot_product_attention (xla) and the plain reference path."""
  tokens, mask = _left_padded_batch(np.random.RandomState(2))
  xla = _forward(_model(family, attention_impl="xla"), tokens, mask)
  plain = _forward(_model(family, attention_impl="plain"), tokens, mask)
  valid = np.asarray(mask)
  np.testing.assert_allclose(np.asarray(xla)[valid], np.asarray(plain)[valid], atol=1e-5)


@pytest.mark.parametrize("time", [1, 5])
def test_cached_attention_on_transposed_keys_matches_numpy(time):
  """The decode kernel (keys stored [b, kv, h, s]) against a numpy softmax attention, with GQA."""
  rng = np.random.RandomState(time)
  b, n, kv, h, s = 3, 6, 2, 8, 11
  q, k, v = (rng.randn(*shape).astype(np.float32)
             for shape in ((b, time, n, h), (b, kv, s, h), (b, kv, s, h)))
  mask = rng.rand(b, time, s) < 0.7
  mask[:, :, 0] = True
  # transformers' repeat_kv order: query head i uses kv head i // (n // kv).
  k_rep, v_rep = (np.repeat(x, n // kv, axis=1) for x in (k, v))  # [b, n, s, h]
  logits = np.einsum("btnh,bnsh->bnts", q, k_rep) * h**-0.5
  logits = np.where(mask[:, None], logits, -np.inf)
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  want = np.einsum("bnts,bnsh->btnh", probs, v_rep)
  got = transformer.cached_attention(jnp.asarray(q), jnp.asarray(k).swapaxes(2, 3),
                                     jnp.asarray(v), jnp.asarray(mask), h**-0.5)
  np.testing.assert_allclose(np.asarray(got), want, atol=1e-5)
  plain = transformer.plain_attention(q, k, v, jnp.asarray(mask), h**-0.5)
  np.testing.assert_allclose(np.asarray(plain), want, atol=1e-5)


def test_cascade_attention_equals_attention_over_the_repeated_prefix():
  """Shared-prefix decode attention against numpy softmax attention over [prefix, own slots]."""
  rng = np.random.RandomState(0)
  groups, r, n, kv, h, p, s = 2, 3, 6, 2, 8, 5, 4
  b = groups * r
  q = rng.randn(b, 1, n, h).astype(np.float32)
  prefix_k, prefix_v = (rng.randn(groups, kv, p, h).astype(np.float32) for _ in range(2))
  k, v = (rng.randn(b, kv, s, h).astype(np.float32) for _ in range(2))
  prefix_mask = np.ones((groups, p), bool)
  prefix_mask[1, :2] = False  # group 1's prompt is left-padded
  mask = rng.rand(b, 1, s) < 0.6
  mask[0] = False  # row 0 has written nothing yet: only its prompt is visible
  whole_k = np.concatenate([np.repeat(prefix_k, r, axis=0), k], axis=2)
  whole_v = np.concatenate([np.repeat(prefix_v, r, axis=0), v], axis=2)
  whole_mask = np.concatenate([np.repeat(prefix_mask, r, axis=0)[:, None], mask], axis=2)
  k_rep, v_rep = (np.repeat(x, n // kv, axis=1) for x in (whole_k, whole_v))
  logits = np.einsum("btnh,bnsh->bnts", q, k_rep) * h**-0.5
  logits = np.where(whole_mask[:, None], logits, -np.inf)
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  want = np.einsum("bnts,bnsh->btnh", probs, v_rep)
  got = transformer.cascade_attention(
    jnp.asarray(q), jnp.asarray(prefix_k).swapaxes(2, 3), jnp.asarray(prefix_v),
    jnp.asarray(prefix_mask), jnp.asarray(k).swapaxes(2, 3), jnp.asarray(v), jnp.asarray(mask),
    h**-0.5)
  np.testing.assert_allclose(np.asarray(got), want, atol=1e-5)
  with pytest.raises(ValueError, match="one token for groups of rows"):
    transformer.cascade_attention(jnp.asarray(q[:5]), prefix_k.swapaxes(2, 3), prefix_v,
                                  prefix_mask, k[:5].swapaxes(2, 3), v[:5], mask[:5], 1.0)


def test_cache_layout_keys_transposed():
  model = _model("qwen3")  # head_dim 24
  cache = model.init_cache(3, 10)
  c = model.config
  assert cache.k[0].shape == (3, c.num_kv_heads, c.head_dim, 10)
  assert cache.v[0].shape == (3, c.num_kv_heads, 10, c.head_dim)
  assert cache.K_AXES[2:] == ("head_dim", "cache_length")


def test_nope_layers_ignore_positions():
  """NoPE layers see no positions at all; RoPE layers do."""
  config = get_model_config("tiny", family="smollm3", num_layers=1, nope_layers=(0,))
  model = _randomize(CausalLM(config, rngs=nnx.Rngs(0)))
  tokens = jnp.arange(6, dtype=jnp.int32)[None]
  a = _forward(model, tokens, positions=jnp.arange(6)[None])
  b = _forward(model, tokens, positions=jnp.array([[0, 5, 9, 11, 40, 41]]))
  np.testing.assert_allclose(a, b, atol=1e-6)
  rope_model = _randomize(CausalLM(config.replace(nope_layers=()), rngs=nnx.Rngs(0)))
  c = _forward(rope_model, tokens, positions=jnp.arange(6)[None])
  d = _forward(rope_model, tokens, positions=jnp.array([[0, 5, 9, 11, 40, 41]]))
  assert np.abs(np.asarray(c - d)).max() > 1e-3


def test_bfloat16_compute_tracks_float32():
  model32 = _model("llama")
  config16 = model32.config.replace(param_dtype="bfloat16", dtype="bfloat16")
  graphdef, state = nnx.split(model32)
  model16 = nnx.merge(nnx.split(CausalLM(config16, rngs=nnx.Rngs(0)))[0],
                      jax.tree.map(lambda x: x.astype(jnp.bfloat16), state))
  tokens, mask = _left_padded_batch(np.random.RandomState(3))
  logits16 = _forward(model16, tokens, mask)
  assert logits16.dtype == jnp.float32  # logits are always float32
  assert model16.layers[0].attn.q_proj[...].dtype == jnp.bfloat16
  logits32 = _forward(model32, tokens, mask)
  valid = np.asarray(mask)
  err = np.abs(np.asarray(logits16 - logits32))[valid].max()
  assert err < 0.1, err


def test_gradients_are_finite_and_nonzero():
  model = _model("qwen3")
  tokens, mask = _left_padded_batch(np.random.RandomState(4))

  def loss_fn(model):
    logp = jax.nn.log_softmax(model(tokens, attention_mask=mask))
    return -jnp.mean(jnp.take_along_axis(logp[:, :-1], tokens[:, 1:, None], -1))

  grads = nnx.jit(nnx.grad(loss_fn))(model)
  leaves = jax.tree.leaves(grads)
  assert all(bool(jnp.all(jnp.isfinite(g))) for g in leaves)
  assert all(float(jnp.abs(g).max()) > 0 for g in leaves)


def test_every_parameter_has_logical_axes():
  for family in FAMILY_OVERRIDES:
    model = _model(family)
    for path, variable in nnx.to_flat_state(nnx.state(model, nnx.Param)):
      names = variable.get_metadata().get("out_sharding")
      assert names is not None and len(names) == variable.get_value().ndim, path


def test_sharded_forward_matches_single_device():
  """Parameters sharded by their logical axes over data × fsdp × tensor."""
  chex.assert_trees_all_equal(len(jax.devices()) >= 8, True)
  mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 2, 2), ("data", "fsdp", "tensor"))
  model = _model("qwen3")
  tokens, mask = _left_padded_batch(np.random.RandomState(5), batch=4)
  expected = _forward(model, tokens, mask)
  graphdef, state = nnx.split(model)
  state = jax.device_put(state, parallel.state_shardings(state, mesh))
  q_proj = state["layers"][0]["attn"]["q_proj"].get_value()
  assert q_proj.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor", None)

  @jax.jit
  def forward(state, tokens, mask):
    with parallel.axis_rules(mesh):
      return nnx.merge(graphdef, state)(tokens, attention_mask=mask)

  logits = forward(state, tokens, mask)
  assert logits.sharding.spec[0] == ("data", "fsdp")
  np.testing.assert_allclose(np.asarray(logits), np.asarray(expected), atol=1e-5)


def test_presets_build_and_count_parameters():
  # Published sizes: Qwen3-0.6B ≈ 0.60B, Llama-3.1-8B ≈ 8.03B, SmolLM3-3B ≈ 3.08B.
  assert get_model_config("qwen3_0p6b").num_params() == 596_049_920
  assert get_model_config("llama3p1_8b").num_params() == 8_030_261_248
  assert round(get_model_config("smollm3_3b").num_params() / 1e9, 2) == 3.08
  assert 1e6 < get_model_config("small").num_params() < 1e7
  for name in MODEL_PRESETS:
    config = get_model_config(name, num_layers=1, vocab_size=64)
    abstract = nnx.eval_shape(lambda c=config: CausalLM(c, rngs=nnx.Rngs(0)))
    assert abstract.config.family in ("llama", "qwen2", "qwen3", "smollm3", "qwen3_moe")


@pytest.mark.parametrize("bad, message", [
  (dict(num_heads=6, num_kv_heads=4), "not a multiple of num_kv_heads"),
  (dict(family="gpt2"), "family='gpt2' is not supported"),
  (dict(attention_impl="flash"), "attention_impl='flash'"),
  (dict(nope_layers=(7,)), r"nope_layers \[7\]"),
  (dict(head_dim=15), "must be even"),
  (dict(dtype="int32"), "floating dtype"),
  (dict(rope_scaling=dict(rope_type="yarn", factor=2.0)), "rope_type='yarn'"),
  (dict(remat_policy="minimal"), r"remat_policy='minimal'.*'none', 'full', 'dots'"),
])
def test_config_errors_name_the_field(bad, message):
  with pytest.raises(ValueError, match=message):
    get_model_config("tiny", **bad)


def test_unknown_preset_lists_valid_names():
  with pytest.raises(KeyError, match="qwen3_0p6b"):
    get_model_config("qwen4_tiny")


def test_model_config_is_hashable_and_frozen():
  config = get_model_config("small")
  assert hash(config) == hash(get_model_config("small"))
  with pytest.raises(Exception):
    config.num_layers = 3  # type: ignore[misc]
  assert isinstance(config, ModelConfig)


def test_input_embeddings_replace_the_token_lookup():
  # A multimodal row is `concat([encoder(x), embed_tokens(text)])`; feeding the
  # token embeddings themselves must reproduce the token path exactly, and a
  # perturbed prefix must change only the logits at and after it.
  model = _model("qwen3")
  tokens, mask = _left_padded_batch(np.random.RandomState(3))
  by_tokens = _forward(model, tokens, mask)
  embeds = model.embed_tokens(tokens)
  by_embeds = nnx.jit(lambda m, t, e, k: m(t, attention_mask=k, embeddings=e))(
      model, tokens, embeds, mask)
  np.testing.assert_array_equal(np.asarray(by_tokens), np.asarray(by_embeds))

  shifted = embeds.at[:, -3].add(1.0)
  changed = model(tokens, attention_mask=mask, embeddings=shifted)
  # Only real tokens: padding rows have no key to attend to, so their (unused)
  # logits depend on everything.
  before = np.asarray(mask[:, :-3])
  np.testing.assert_allclose(np.asarray(changed[:, :-3])[before],
                             np.asarray(by_tokens[:, :-3])[before], atol=1e-5)
  assert not np.allclose(np.asarray(changed[:, -3:]), np.asarray(by_tokens[:, -3:]))


def test_input_embeddings_with_the_wrong_shape_are_named():
  model = _model("llama")
  tokens = jnp.zeros((2, 4), jnp.int32)
  with pytest.raises(ValueError, match="embeddings have shape"):
    model(tokens, embeddings=jnp.zeros((2, 5, model.config.embed_dim)))


# ---- Layers under scan (`scan_layers`) and rematerialisation (`remat_policy`) ----

SCAN_FAMILIES = ["qwen3", "qwen2", "smollm3"]  # QK-norm, q/k/v biases, NoPE layers


def _scanned_twin(model: CausalLM, **config_changes) -> CausalLM:
  """The same weights as `model` (unrolled), in a model with `scan_layers=True`."""
  config = model.config.replace(scan_layers=True, **config_changes)
  twin = nnx.eval_shape(lambda: CausalLM(config, rngs=nnx.Rngs(0)))
  graphdef = nnx.split(twin)[0]
  return nnx.merge(graphdef, transformer.stack_layer_params(nnx.state(model)))


def _family_3_layers(family: str, **kw) -> CausalLM:
  # 3 layers, so a NoPE layer (smollm3: layer 1) sits between RoPE layers.
  return _model(family, num_layers=3, **kw)


def _loss(model, tokens, mask):
  logp = jax.nn.log_softmax(model(tokens, attention_mask=mask))
  return -jnp.mean(jnp.take_along_axis(logp[:, :-1], tokens[:, 1:, None], -1))


def test_scanned_parameters_are_stacked_with_a_layers_axis():
  config = get_model_config("tiny", **FAMILY_OVERRIDES["qwen2"], scan_layers=True, num_layers=3)
  model = CausalLM(config, rngs=nnx.Rngs(0))
  flat = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
  q_proj = flat[("layers", "attn", "q_proj")]
  assert q_proj.get_value().shape == (3, config.embed_dim, config.num_heads, config.head_dim)
  assert q_proj.get_metadata()["out_sharding"] == ("layers", "embed", "heads", "head_dim")
  assert flat[("layers", "attn", "k_bias")].get_value().shape == (3, config.num_kv_heads,
                                                                  config.head_dim)
  for path, variable in flat.items():
    if path[0] == "layers":
      assert variable.get_metadata()["out_sharding"][0] == "layers", path
      assert variable.get_value().shape[0] == 3, path
  # Layers are initialised independently (split keys), not copies of one draw.
  q = np.asarray(q_proj.get_value())
  assert not np.allclose(q[0], q[1])


def test_stack_and_unstack_layer_params_round_trip():
  model = _family_3_layers("qwen3")
  state = nnx.state(model)
  stacked = transformer.stack_layer_params(state)
  assert stacked["layers"]["attn"]["q_proj"].get_value().shape[0] == 3
  back = transformer.unstack_layer_params(stacked)
  chex.assert_trees_all_equal(back, state)
  for (path, a), (_, b) in zip(nnx.to_flat_state(back), nnx.to_flat_state(state)):
    assert a.get_metadata()["out_sharding"] == b.get_metadata()["out_sharding"], path
  # Shapes only (abstract states, e.g. from nnx.eval_shape) go through too.
  abstract = nnx.state(nnx.eval_shape(lambda: CausalLM(model.config, rngs=nnx.Rngs(0))))
  shapes = transformer.stack_layer_params(abstract)
  assert shapes["layers"]["mlp"]["up_proj"].get_value().shape == (3, 64, 128)


@pytest.mark.parametrize("family", SCAN_FAMILIES)
def test_scanned_layers_match_unrolled_logits_and_gradients(family):
  model = _family_3_layers(family)
  scanned = _scanned_twin(model)
  tokens, mask = _left_padded_batch(np.random.RandomState(6))
  valid = np.asarray(mask)
  np.testing.assert_allclose(np.asarray(_forward(scanned, tokens, mask))[valid],
                             np.asarray(_forward(model, tokens, mask))[valid], atol=1e-5)
  grad = nnx.jit(nnx.grad(_loss))
  expected = nnx.to_flat_state(grad(model, tokens, mask))
  got = nnx.to_flat_state(transformer.unstack_layer_params(grad(scanned, tokens, mask)))
  assert [p for p, _ in got] == [p for p, _ in expected]
  for (path, a), (_, b) in zip(got, expected):
    np.testing.assert_allclose(np.asarray(a.get_value()), np.asarray(b.get_value()),
                               atol=1e-6, rtol=1e-5, err_msg=str(path))


@pytest.mark.parametrize("scan_layers", [False, True], ids=["unrolled", "scanned"])
@pytest.mark.parametrize("policy", ["full", "dots"])
def test_remat_policies_keep_values_and_gradients(policy, scan_layers):
  base = _family_3_layers("smollm3", scan_layers=scan_layers)
  rematted = nnx.merge(nnx.split(CausalLM(base.config.replace(remat_policy=policy),
                                          rngs=nnx.Rngs(0)))[0], nnx.state(base))
  tokens, mask = _left_padded_batch(np.random.RandomState(7))
  value_and_grad = nnx.jit(nnx.value_and_grad(_loss))
  loss, grads = value_and_grad(base, tokens, mask)
  remat_loss, remat_grads = value_and_grad(rematted, tokens, mask)
  np.testing.assert_allclose(float(remat_loss), float(loss), rtol=1e-6)
  chex.assert_trees_all_close(remat_grads, grads, atol=1e-6, rtol=1e-6)
  # The policy is really applied: the backward pass holds a checkpoint.
  jaxpr = str(jax.make_jaxpr(lambda m: nnx.grad(_loss)(m, tokens, mask))(rematted))
  assert "checkpoint" in jaxpr or "remat" in jaxpr


def test_remat_policy_names():
  assert transformer.remat_policy("full") is None  # jax.checkpoint's default: save nothing
  assert (transformer.remat_policy("dots")
          is jax.checkpoint_policies.dots_with_no_batch_dims_saveable)
  with pytest.raises(ValueError, match="remat_policy='none'"):
    transformer.remat_policy("none")


@pytest.mark.parametrize("family", SCAN_FAMILIES)
def test_scanned_cache_decode_matches_unrolled(family):
  """Prefill + decode with stacked caches, n = 1 and a shared prefix (n > 1, cascade)."""
  model = _family_3_layers(family)
  scanned = _scanned_twin(model)
  tokens, mask = _left_padded_batch(np.random.RandomState(8), length=6)
  positions = default_positions(mask)
  n = 2

  def run(model):
    @jax.jit
    def go(state):
      m = nnx.merge(graphdef, state)
      logits, cache = m(tokens, positions=positions, attention_mask=mask,
                        cache=m.init_cache(tokens.shape[0], 6 + 3))
      outs = [logits[:, -1]]
      rows = m.init_cache(tokens.shape[0] * n, 3)
      shared = rows.replace(prefix_k=cache.k, prefix_v=cache.v, prefix_mask=cache.mask)
      nxt = jnp.argmax(logits[:, -1], -1)[:, None]
      pos = positions[:, -1:] + 1
      for _ in range(3):  # n = 1 rows and the n = 2 groups decode the same tokens
        logits, cache = m(nxt, positions=pos, cache=cache)
        group_logits, shared = m(jnp.repeat(nxt, n, 0), positions=jnp.repeat(pos, n, 0),
                                 cache=shared)
        outs += [logits[:, 0], group_logits[::n, 0], group_logits[1::n, 0]]
        nxt, pos = jnp.argmax(logits[:, 0], -1)[:, None], pos + 1
      return jnp.stack(outs), cache, shared

    graphdef, state = nnx.split(model)
    return go(state)

  want, want_cache, want_shared = run(model)
  got, cache, shared = run(scanned)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5)
  L, c = 3, model.config
  assert cache.stacked and not want_cache.stacked
  assert cache.k.shape == (L, 3, c.num_kv_heads, c.head_dim, 9)
  assert shared.prefix_v.shape == (L, 3, c.num_kv_heads, 9, c.head_dim)
  assert shared.v.shape == (L, 3 * n, c.num_kv_heads, 3, c.head_dim)
  np.testing.assert_allclose(np.asarray(cache.k), np.stack(want_cache.k), atol=1e-5)
  np.testing.assert_allclose(np.asarray(shared.v), np.stack(want_shared.v), atol=1e-5)
  assert cache.k_axes == ("layers",) + transformer.KVCache.K_AXES
  assert want_cache.v_axes == transformer.KVCache.V_AXES


def _program_size(config, scan_layers: bool) -> int:
  """Characters of the lowered (StableHLO) forward + backward of `config`."""
  config = config.replace(scan_layers=scan_layers)
  graphdef, state = nnx.split(nnx.eval_shape(lambda: CausalLM(config, rngs=nnx.Rngs(0))))
  tokens = jax.ShapeDtypeStruct((2, 8), jnp.int32)

  def loss(state, tokens):
    return nnx.merge(graphdef, state)(tokens).sum()

  return len(jax.jit(jax.grad(loss)).lower(state, tokens).as_text())


def test_scanned_program_does_not_grow_with_depth():
  config = get_model_config("tiny", **FAMILY_OVERRIDES["smollm3"], remat_policy="full")
  shallow, deep = config.replace(num_layers=2), config.replace(num_layers=8, nope_layers=(1, 5))
  scanned = _program_size(shallow, True), _program_size(deep, True)
  unrolled = _program_size(shallow, False), _program_size(deep, False)
  assert scanned[1] < 1.05 * scanned[0], scanned
  assert unrolled[1] > 2.5 * unrolled[0], unrolled


def test_sharded_scanned_model_with_fsdp_rules():
  """Stacked parameters sharded by their logical axes (layers unsplit, embed over fsdp)."""
  mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 2, 2), ("data", "fsdp", "tensor"))
  rules = parallel.DEFAULT_RULES  # the "fsdp_tensor" training table
  model = _family_3_layers("qwen3")
  scanned = _scanned_twin(model)
  tokens, mask = _left_padded_batch(np.random.RandomState(9), batch=4)
  expected = _forward(model, tokens, mask)
  expected_grads = nnx.jit(nnx.grad(_loss))(model, tokens, mask)
  graphdef, state = nnx.split(scanned)
  state = jax.device_put(state, parallel.state_shardings(state, mesh, rules))
  spec = state["layers"]["attn"]["q_proj"].get_value().sharding.spec
  assert spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor", None)

  @jax.jit
  def forward_and_grad(state, tokens, mask):
    with parallel.axis_rules(mesh, rules):
      logits = nnx.merge(graphdef, state)(tokens, attention_mask=mask)
      grads = jax.grad(lambda s: _loss(nnx.merge(graphdef, s), tokens, mask))(state)
      return logits, grads

  logits, grads = forward_and_grad(state, tokens, mask)
  assert logits.sharding.spec[0] == ("data", "fsdp")
  np.testing.assert_allclose(np.asarray(logits), np.asarray(expected), atol=1e-5)
  chex.assert_trees_all_close(transformer.unstack_layer_params(grads),
                              nnx.state(expected_grads), atol=1e-6, rtol=1e-5)


def test_presets_scan_their_layers_except_tiny_and_small():
  for name in MODEL_PRESETS:
    assert get_model_config(name).scan_layers == (
      name not in ("tiny", "small", "qwen3_moe_tiny")), name
  config = get_model_config("qwen3_0p6b", scan_layers=False, remat_policy="dots")
  assert not config.scan_layers and config.remat_policy == "dots"
  assert get_model_config("tiny", scan_layers=True).scan_layers


@pytest.mark.parametrize("platform, dtype, head_dim, want", [
  ("gpu", "bfloat16", 128, "cudnn"),
  ("gpu", "float16", 64, "cudnn"),
  ("gpu", "float32", 128, "xla"),  # cuDNN's fused kernel takes 16-bit inputs only
  ("gpu", "bfloat16", 256, "xla"),  # head_dim above what the kernel supports
  ("gpu", "bfloat16", 20, "xla"),  # not a multiple of 8
  ("cpu", "bfloat16", 128, "xla"),
  ("tpu", "bfloat16", 128, "xla"),
])
def test_auto_attention_picks_cudnn_on_gpu_where_it_applies(platform, dtype, head_dim, want):
  from jaxrl_post.models.transformer import attention_kernel

  assert attention_kernel("auto", platform=platform, dtype=dtype, head_dim=head_dim) == want
  # A named implementation is taken as it is.
  assert attention_kernel("plain", platform=platform, dtype=dtype, head_dim=head_dim) == "plain"


@pytest.mark.parametrize("kw, want", [
  (dict(head_dim=128, q_len=1024, kv_len=1024), "splash"),
  (dict(head_dim=64, q_len=256, kv_len=256), "splash"),
  (dict(head_dim=128), "xla"),  # lengths unknown
  (dict(head_dim=128, q_len=1000, kv_len=1000), "xla"),  # not a multiple of the block
  (dict(head_dim=128, q_len=256, kv_len=512), "xla"),  # not self-attention
  (dict(head_dim=128, q_len=256, kv_len=256, cached=True), "xla"),  # prefill into a cache
  (dict(head_dim=96, q_len=256, kv_len=256), "xla"),  # head_dim not a multiple of 64
  (dict(head_dim=512, q_len=256, kv_len=256), "xla"),  # head_dim above 256
])
def test_named_splash_applies_where_it_can(kw, want):
  from jaxrl_post.models.transformer import attention_kernel

  # Named "splash" falls back to XLA where the kernel does not apply, on any platform.
  assert attention_kernel("splash", platform="tpu", dtype="bfloat16", **kw) == want
  assert attention_kernel("splash", platform="cpu", dtype="float32", **kw) == want
  # "auto" does not pick it (opt-in until it has run on a TPU under a mesh).
  assert attention_kernel("auto", platform="tpu", dtype="bfloat16", **kw) == "xla"
  assert attention_kernel("auto", platform="cpu", dtype="bfloat16", **kw) == "xla"


def _splash_inputs(dtype, t, h, pads, seed=0):
  b, n, kv = len(pads), 4, 2
  kq, kk, kv_, kc = jax.random.split(jax.random.key(seed), 4)
  q = jax.random.normal(kq, (b, t, n, h), jnp.float32).astype(dtype)
  k = jax.random.normal(kk, (b, kv, t, h), jnp.float32).astype(dtype)
  v = jax.random.normal(kv_, (b, kv, t, h), jnp.float32).astype(dtype)
  key_mask = jnp.arange(t)[None] >= jnp.asarray(pads)[:, None]
  mask = key_mask[:, None, :] & jnp.tril(jnp.ones((t, t), bool))[None]
  cotangent = jax.random.normal(kc, (b, t, n, h), jnp.float32).astype(dtype)
  return q, k, v, key_mask, mask, cotangent


@pytest.mark.parametrize("dtype, t, h, atol", [
  ("float32", 256, 64, 1e-5),
  ("bfloat16", 128, 128, 2e-2),
])
def test_splash_attention_interpreted_equals_plain(dtype, t, h, atol):
  # GQA (4 heads over 2 kv heads), left padding: none, within the first block,
  # and across a block boundary (pad > 128 where t = 256).
  pads = [0, 5, t // 2 + 3]
  q, k, v, key_mask, mask, cotangent = _splash_inputs(dtype, t, h, pads)
  scale = h**-0.5
  real = key_mask[:, :, None, None]

  def loss(fn, q, k, v):  # pad query rows do not count, as in the model's losses
    out = fn(q, k, v)
    return jnp.sum(jnp.where(real, out * cotangent, 0).astype(jnp.float32)), out

  def splash(q, k, v):
    return transformer.splash_attention(q, k, v, key_mask, scale, interpret=True)

  def plain(q, k, v):
    return transformer.plain_attention(q, k, v, mask, scale)

  grad = lambda fn: jax.jit(jax.grad(lambda *a: loss(fn, *a), argnums=(0, 1, 2), has_aux=True))
  (dq, dk, dv), out = grad(splash)(q, k, v)
  (eq, ek, ev), expected = grad(plain)(q, k, v)
  assert out.dtype == q.dtype
  assert bool(jnp.isfinite(out.astype(jnp.float32)).all())  # pad rows too
  f32 = lambda x: np.asarray(x.astype(jnp.float32))
  rows = np.asarray(key_mask)
  np.testing.assert_allclose(f32(out)[rows], f32(expected)[rows], atol=atol, rtol=atol)
  grad_tol = 10 * atol if dtype == "bfloat16" else 1e-4
  for got, want in ((dq, eq), (dk, ek), (dv, ev)):
    np.testing.assert_allclose(f32(got), f32(want), atol=grad_tol, rtol=grad_tol)


def test_splash_attention_rejects_what_it_does_not_apply_to():
  q, k, v, key_mask, _, _ = _splash_inputs("float32", 64, 64, [0])
  with pytest.raises(ValueError, match="multiple of 128"):
    transformer.splash_attention(q, k, v, key_mask, 0.125, interpret=True)


def test_splash_model_equals_plain_and_falls_back_with_a_cache(monkeypatch):
  # Named "splash" runs the kernel interpreted on CPU (head_dim 64, 128 tokens,
  # inside the layer scan); a prefill into the KV cache falls back to XLA.
  calls = []
  kernel = transformer.splash_attention
  monkeypatch.setattr(transformer, "splash_attention",
                      lambda *a, **kw: calls.append(a[0].shape) or kernel(*a, **kw))
  config = get_model_config("tiny", head_dim=64, scan_layers=True, attention_impl="splash")
  tokens = jnp.arange(256, dtype=jnp.int32).reshape(2, 128) % config.vocab_size
  mask = jnp.ones((2, 128), bool).at[0, :7].set(False)
  splash = CausalLM(config, rngs=nnx.Rngs(0))
  plain = CausalLM(config.replace(attention_impl="plain"), rngs=nnx.Rngs(0))
  got = nnx.jit(_forward)(splash, tokens, mask)
  want = nnx.jit(_forward)(plain, tokens, mask)
  assert calls == [(2, 128, 4, 64)]  # one scanned layer body, traced once
  np.testing.assert_allclose(got[1], want[1], atol=1e-5)
  np.testing.assert_allclose(got[0, 7:], want[0, 7:], atol=1e-5)
  prefill = lambda m: m(tokens, attention_mask=mask, positions=default_positions(mask),
                        cache=m.init_cache(2, 128))[0]
  got = nnx.jit(prefill)(splash)
  assert len(calls) == 1
  np.testing.assert_allclose(got[1], want[1], atol=1e-5)
  np.testing.assert_allclose(got[0, 7:], want[0, 7:], atol=1e-5)


def test_auto_attention_is_the_default_and_equals_plain_on_cpu():
  config = get_model_config("tiny")
  assert config.attention_impl == "auto"
  tokens = jnp.arange(14, dtype=jnp.int32).reshape(2, 7) % config.vocab_size
  mask = jnp.ones((2, 7), bool).at[0, :2].set(False)
  auto = CausalLM(config, rngs=nnx.Rngs(0))(tokens, attention_mask=mask)
  plain = CausalLM(config.replace(attention_impl="plain"), rngs=nnx.Rngs(0))(
    tokens, attention_mask=mask)
  np.testing.assert_allclose(auto[1], plain[1], atol=1e-5)
  np.testing.assert_allclose(auto[0, 2:], plain[0, 2:], atol=1e-5)
