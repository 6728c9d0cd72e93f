"""Qwen3-MoE decoder: routing, dispatches, load-balancing loss, scan / remat / cache / sampler,
Hugging Face parity and round trip, expert parallelism."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from jax.sharding import Mesh

from jaxrl_post import parallel
from jaxrl_post.models import CausalLM, default_positions, get_model_config, moe
from jaxrl_post.models.hf import load_hf, save_hf
from jaxrl_post.models.model_config import ModelConfig
from jaxrl_post.models.transformer import stack_layer_params
from jaxrl_post.parallel import axes
from jaxrl_post.parallel.mesh import init_sharded
from jaxrl_post.sampling import Sampler


def _config(**kw):
  base = dict(family="qwen3_moe", vocab_size=61, embed_dim=32, num_layers=3, num_heads=4,
              num_kv_heads=2, head_dim=8, mlp_dim=40, qk_norm=True, num_experts=8,
              num_experts_per_tok=2, moe_mlp_dim=12, norm_topk_prob=True, mlp_only_layers=(1,))
  return ModelConfig(**(base | kw))


@pytest.fixture(scope="module")
def model():
  return CausalLM(_config(), rngs=nnx.Rngs(0))


@nnx.jit
def _forward(m, tokens, mask):
  return m(tokens, attention_mask=mask)


TOKENS = jnp.asarray([[3, 7, 1, 9, 22, 5], [0, 0, 4, 8, 15, 16]], jnp.int32)
MASK = jnp.asarray([[1] * 6, [0, 0, 1, 1, 1, 1]], bool)


def test_route_golden_top2_renormalised():
  # p = softmax([0, ln 2, ln 3, ln 4]) = [1, 2, 3, 4] / 10; top-2 = experts 3, 2 with
  # weights 0.4, 0.3, renormalised 4/7, 3/7.
  logits = jnp.log(jnp.asarray([[1.0, 2.0, 3.0, 4.0]]))
  w, i, p = moe.route(logits, top_k=2, norm_topk_prob=True)
  np.testing.assert_allclose(p, [[0.1, 0.2, 0.3, 0.4]], rtol=1e-6)
  np.testing.assert_array_equal(i, [[3, 2]])
  np.testing.assert_allclose(w, [[4 / 7, 3 / 7]], rtol=1e-6)
  w, _, _ = moe.route(logits, top_k=2, norm_topk_prob=False)
  np.testing.assert_allclose(w, [[0.4, 0.3]], rtol=1e-6)
  np.testing.assert_allclose(moe.combine_tensor(w, i, 4), [[0, 0, 0.3, 0.4]], rtol=1e-6)


def test_load_balancing_loss_matches_transformers_and_golden():
  # Uniform router: f_e = k / E, P_e = 1 / E, L = E · Σ k / E² = k.
  flat = jnp.zeros((3, 10, 4))
  assert float(moe.load_balancing_loss(flat, num_experts=4, top_k=2)) == pytest.approx(2.0)
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(3, 2, 5, 6)).astype(np.float32)  # [L, b, t, E]
  mask = np.array([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]], bool)
  from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

  gate = tuple(torch.from_numpy(x.reshape(10, 6)) for x in logits)
  for m in (None, mask):
    want = load_balancing_loss_func(gate, 6, 2, None if m is None else torch.from_numpy(m))
    got = jax.jit(lambda x, m: moe.load_balancing_loss(x, num_experts=6, top_k=2,
                                                       attention_mask=m))(logits, m)
    np.testing.assert_allclose(got, float(want), rtol=1e-5)


def test_dense_and_ragged_dispatch_agree_with_gradients(model):
  ragged = nnx.eval_shape(lambda: CausalLM(model.config.replace(moe_impl="ragged"),
                                            rngs=nnx.Rngs(0)))
  nnx.update(ragged, nnx.state(model))

  def loss(m):
    return jnp.mean(m(TOKENS, attention_mask=MASK) ** 2)

  a, ga = nnx.jit(nnx.value_and_grad(loss))(model)
  b, gb = nnx.jit(nnx.value_and_grad(loss))(ragged)
  np.testing.assert_allclose(a, b, rtol=1e-5)
  for x, y in zip(jax.tree.leaves(ga), jax.tree.leaves(gb)):
    np.testing.assert_allclose(x, y, atol=1e-6)


def test_scan_and_remat_match_unrolled():
  config = _config(mlp_only_layers=(), num_layers=2)  # scan needs one layer kind
  unrolled = CausalLM(config, rngs=nnx.Rngs(1))
  # The variants take the unrolled weights: shapes only, no second random initialisation.
  scanned = nnx.eval_shape(lambda: CausalLM(config.replace(scan_layers=True, remat_policy="full"),
                                            rngs=nnx.Rngs(2)))
  nnx.update(scanned, stack_layer_params(nnx.state(unrolled)))
  rematted = nnx.eval_shape(lambda: CausalLM(config.replace(remat_policy="dots"),
                                             rngs=nnx.Rngs(1)))
  nnx.update(rematted, nnx.state(unrolled))

  @nnx.jit
  def logits_and_router(m):
    with moe.collect_router() as records:
      out = m(TOKENS, attention_mask=MASK)
    return out, records.calls[0]["router_logits"]

  want, want_router = logits_and_router(unrolled)
  for other in (scanned, rematted):
    got, router = logits_and_router(other)
    np.testing.assert_allclose(got, want, atol=1e-5)
    np.testing.assert_allclose(router, want_router, atol=1e-5)


def test_config_errors_name_the_field():
  with pytest.raises(ValueError, match="num_experts_per_tok=9"):
    _config(num_experts_per_tok=9)
  with pytest.raises(ValueError, match="scan_layers=True needs every layer of one kind"):
    _config(scan_layers=True)
  with pytest.raises(ValueError, match="needs family='qwen3_moe'"):
    _config(family="qwen3")
  with pytest.raises(ValueError, match="moe_impl='sparse'"):
    _config(moe_impl="sparse")
  assert _config().moe_layers == (0, 2)


def test_cached_decode_and_sampler_match_full_forward(model):
  full = _forward(model, TOKENS, MASK)
  positions = default_positions(MASK)
  cache = model.init_cache(2, 8)
  decode = nnx.jit(lambda m, t, p, a, c: m(t, positions=p, attention_mask=a, cache=c))
  _, cache = decode(model, TOKENS[:, :4], positions[:, :4], MASK[:, :4], cache)
  for t in (4, 5):
    step, cache = decode(model, TOKENS[:, t:t + 1], positions[:, t:t + 1], MASK[:, t:t + 1],
                         cache)
    np.testing.assert_allclose(step[:, 0], full[:, t], atol=1e-5)
  rollout = Sampler(model, max_prompt_len=8, eos_ids=[]).generate(
    None, [[3, 7, 1]], max_new_tokens=3, greedy=True)
  tokens = [3, 7, 1]
  for _ in range(3):  # Right-padded to 8: one compile; causal attention never sees the pad.
    buffer = jnp.asarray([tokens + [0] * (8 - len(tokens))])
    logits = _forward(model, buffer, jnp.ones((1, 8), bool))
    tokens.append(int(jnp.argmax(logits[0, len(tokens) - 1])))
  np.testing.assert_array_equal(np.asarray(rollout.completion_tokens[0]), tokens[3:])


def test_aux_loss_gradient_reaches_the_router(model):
  def aux(m):
    with moe.collect_router() as records:
      m(TOKENS, attention_mask=MASK)
    return moe.records_aux_loss(records, num_experts=8, top_k=2)

  grads = nnx.jit(nnx.grad(aux))(model)
  router = grads["layers"][0]["mlp"]["router"][...]
  assert float(jnp.abs(router).sum()) > 0
  # f carries no gradient and the last sparse layer's experts reach no router: zero.
  assert float(jnp.abs(grads["layers"][2]["mlp"]["w_gate"][...]).sum()) == 0.0


# ---- Hugging Face ----


def _hf_model(tmp_path, scan=False):
  hf_config = transformers.Qwen3MoeConfig(
    vocab_size=61, hidden_size=32, intermediate_size=40, moe_intermediate_size=12,
    num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
    num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
    mlp_only_layers=[1], rope_theta=1_000_000.0, tie_word_embeddings=False)
  torch.manual_seed(0)
  ref = transformers.Qwen3MoeForCausalLM(hf_config).eval()
  with torch.no_grad():  # HF's init leaves the router at zero: make routing non-trivial.
    for layer in (0, 2):
      ref.model.layers[layer].mlp.gate.weight.normal_(0, 0.5)
  ref.save_pretrained(tmp_path / "hf")
  return ref


def test_hf_logits_match_transformers_and_round_trip(tmp_path):
  ref = _hf_model(tmp_path)
  tokens = np.asarray([[5, 9, 2, 33, 60, 1, 17]])
  with torch.no_grad():
    want = ref(torch.from_numpy(tokens)).logits.numpy()
  model = load_hf(tmp_path / "hf")
  assert model.config.num_experts == 8 and model.config.moe_layers == (0, 2)
  np.testing.assert_allclose(_forward(model, jnp.asarray(tokens), jnp.ones(tokens.shape, bool)),
                             want, atol=1e-4)
  save_hf(model, tmp_path / "ours")
  again = transformers.Qwen3MoeForCausalLM.from_pretrained(tmp_path / "ours").eval()
  with torch.no_grad():
    np.testing.assert_allclose(again(torch.from_numpy(tokens)).logits.numpy(), want, atol=1e-5)
  hf_json = json.loads((tmp_path / "ours" / "config.json").read_text())
  assert hf_json["architectures"] == ["Qwen3MoeForCausalLM"] and hf_json["num_experts"] == 8
  # Sharded load over an expert axis reads each device's experts only.
  mesh = Mesh(np.asarray(jax.devices()[:8]).reshape(2, 4), ("fsdp", "expert"))
  sharded = load_hf(tmp_path / "hf", mesh=mesh)
  spec = sharded.layers[0].mlp.w_gate[...].sharding.spec
  assert spec[0] == "expert"
  np.testing.assert_allclose(jax.jit(lambda m, t: m(t))(sharded, jnp.asarray(tokens)), want,
                             atol=1e-4)


# ---- expert parallelism ----


def test_expert_sharded_logits_equal_single_device(model):
  mesh = parallel.mesh.make_mesh(parallel.mesh.mesh_config(
    ("data", "fsdp", "expert", "tensor"), ici=dict(data=2, expert=4)))
  sharded = init_sharded(lambda: CausalLM(model.config, rngs=nnx.Rngs(0)), mesh)
  assert sharded.layers[0].mlp.w_down[...].sharding.spec[0] == "expert"

  @jax.jit
  def run(state, tokens, mask):
    with axes.axis_rules(mesh):
      return nnx.merge(nnx.graphdef(model), state)(tokens, attention_mask=mask)

  got = run(nnx.state(sharded), TOKENS, MASK)
  np.testing.assert_allclose(got, _forward(model, TOKENS, MASK), atol=1e-5)


def test_expert_axis_that_does_not_divide_num_experts_raises():
  mesh = parallel.mesh.make_mesh(parallel.mesh.mesh_config(
    ("data", "expert"), ici=dict(data=-1, expert=8)))
  config = get_model_config("qwen3_moe_tiny", num_experts=12)
  with pytest.raises(ValueError, match=r"num_experts=12 .*config\.mesh\.ici_expert"):
    init_sharded(lambda: CausalLM(config, rngs=nnx.Rngs(0)), mesh)
