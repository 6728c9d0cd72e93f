"""MoE step parts: the load-balancing loss reaches the GRPO objective and the router."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from jaxrl_post.methods import fault_injection
from jaxrl_post.models import CausalLM, get_model_config, moe

TOKENS = jnp.asarray([[3, 7, 1, 9], [0, 4, 8, 15]], jnp.int32)
MASK = jnp.asarray([[1, 1, 1, 1], [0, 1, 1, 1]], bool)


def _policy_loss(model, batch):
  logits = model(batch["tokens"], attention_mask=batch["mask"])
  value = jnp.mean(logits[..., 0])
  return value, dict(policy=value)


def _config(**kw):
  return ml_collections.ConfigDict(dict(num_micro_batches=2) | kw)


def test_builder_disables_and_validates():
  assert fault_injection.build_moe_aux_loss(_config()) is None
  assert fault_injection.build_moe_aux_loss(_config(moe_aux_loss_coef=0.0)) is None
  with pytest.raises(ValueError, match="config.moe_aux_loss_coef=-1"):
    fault_injection.build_moe_aux_loss(_config(moe_aux_loss_coef=-1.0))


@pytest.fixture(scope="module")
def model():
  return CausalLM(get_model_config("qwen3_moe_tiny", vocab_size=32, num_layers=1),
                  rngs=nnx.Rngs(0))


def test_aux_loss_is_added_and_its_gradient_reaches_the_router(model):
  part = fault_injection.build_moe_aux_loss(_config(moe_aux_loss_coef=0.5))
  wrapped = part.wrap_loss(_policy_loss)
  batch = dict(tokens=TOKENS, mask=MASK)

  @nnx.jit
  def both(m):
    (v0, _), g0 = nnx.value_and_grad(_policy_loss, has_aux=True)(m, batch)
    (v1, aux), g1 = nnx.value_and_grad(wrapped, has_aux=True)(m, batch)
    with moe.collect_router() as records:
      m(TOKENS, attention_mask=MASK)
    lb = moe.records_aux_loss(records, num_experts=16, top_k=2)
    return v0, v1, aux["moe_aux_loss"], lb, g0, g1

  v0, v1, term, lb, g0, g1 = both(model)
  # Golden: the term is coef · L_aux / num_micro_batches = 0.5 · L / 2.
  np.testing.assert_allclose(v1 - v0, 0.25 * lb, rtol=1e-5)
  np.testing.assert_allclose(term, lb / 2, rtol=1e-6)
  router = g1["layers"][0]["mlp"]["router"][...] - g0["layers"][0]["mlp"]["router"][...]
  assert float(jnp.abs(router).max()) > 0


def test_dense_policy_is_refused():
  # Shapes only: the refusal comes at trace time, so nothing needs to be initialised or run.
  model = nnx.eval_shape(lambda: CausalLM(get_model_config("tiny", num_layers=1),
                                          rngs=nnx.Rngs(0)))
  wrapped = fault_injection.build_moe_aux_loss(_config(moe_aux_loss_coef=0.1)).wrap_loss(
    _policy_loss)
  with pytest.raises(ValueError, match="needs a Mixture-of-Experts policy"):
    nnx.eval_shape(wrapped, model, dict(tokens=TOKENS, mask=MASK))


# ---- fault injectors ----


def _fault(**kw):
  return fault_injection.build_fault(_config(fault=ml_collections.ConfigDict(kw)))


def test_fault_builder_validates():
  assert fault_injection.build_fault(_config()) is None
  assert _fault(name="none") is None
  with pytest.raises(ValueError, match="config.fault.name='nan'"):
    _fault(name="nan")
  with pytest.raises(ValueError, match="config.fault.dtype='int8'"):
    _fault(name="logp_precision", dtype="int8")


def test_logp_precision_fault_rounds_from_start_step():
  fault = _fault(name="logp_precision", dtype="bfloat16", start_step=2)
  # bf16 keeps 8 significant bits: -1.001 -> -1.0 (gap 0.001), -3.3 -> -3.296875.
  batch = dict(old_logp=np.array([[-1.001, -3.3]], np.float32),
               completion_mask=np.array([[1, 1]], bool))
  assert fault.begin_step(None, None, 1) == {"fault/active": 0.0}
  assert fault.transform(None, None, batch, None)[0] is batch
  fault.begin_step(None, None, 2)
  out, metrics = fault.transform(None, None, batch, None)
  np.testing.assert_allclose(out["old_logp"], [[-1.0, -3.296875]])
  np.testing.assert_allclose(metrics["fault/logp_gap"], (0.001 + 0.003125) / 2, rtol=1e-3)
  scale = _fault(name="logp_precision", dtype="float8_e4m3fn", target="scale", scale=1 / 0.7)
  scale.begin_step(None, None, 0)
  out, _ = scale.transform(None, None, batch, None)
  # 1/0.7 = 1.428571 -> e4m3 (3 mantissa bits) 1.375: log-probs scaled by 1.375 · 0.7.
  np.testing.assert_allclose(out["old_logp"], batch["old_logp"] * 1.375 * 0.7, rtol=1e-6)


def test_update_omission_keeps_parameters_and_reports_metrics(model):
  import types

  import optax

  from jaxrl_post.training.train_state import create_train_state, make_train_step

  optimizer = optax.adam(1e-2)
  state = create_train_state(model, optimizer, jax.random.key(0))
  method = types.SimpleNamespace(step_fn=make_train_step(nnx.graphdef(model), _policy_loss,
                                                         optimizer))
  part = fault_injection.build_moe_step_part(_config(fault=ml_collections.ConfigDict(
    dict(name="no_update", start_step=1))))
  part.start(method, state)
  batch = dict(tokens=TOKENS, mask=MASK)
  part.begin_step(method, state, 0)
  moved, _ = method.step_fn(state, batch)  # before start_step: a normal update
  before = jax.tree.map(np.asarray, moved.params)
  part.begin_step(method, moved, 1)
  kept, metrics = method.step_fn(moved, batch)
  assert int(metrics["omitted"]) == 1 and float(metrics["grad_norm"]) > 0
  for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(kept.params)):
    np.testing.assert_array_equal(a, b)
