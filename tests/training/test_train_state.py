"""Train step: micro-batch equivalence, sharded equivalence, non-finite guard, no recompiles."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import Mesh

from jaxrl_post.models import CausalLM, get_model_config
from jaxrl_post.training.train_state import create_train_state, make_train_step


def _model():
  return CausalLM(get_model_config("tiny", vocab_size=64), rngs=nnx.Rngs(0))


def _sft_loss(model, batch):
  # Token cross-entropy normalised by the *whole* batch's token count, so the
  # loss is additive over micro-batches.
  logits = model(batch["tokens"][:, :-1])
  logp = jax.nn.log_softmax(logits)
  nll = -jnp.take_along_axis(logp, batch["tokens"][:, 1:, None], -1)[..., 0]
  mask = batch["mask"][:, 1:]
  loss = jnp.sum(nll * mask) / batch["num_tokens"]
  return loss, {"tokens": jnp.sum(mask).astype(jnp.float32)}


def _batch(rows=8, length=12, seed=0):
  rng = np.random.RandomState(seed)
  tokens = jnp.asarray(rng.randint(0, 64, (rows, length)), jnp.int32)
  mask = jnp.asarray(rng.rand(rows, length) < 0.8)
  return {"tokens": tokens, "mask": mask,
          "num_tokens": jnp.sum(mask[:, 1:]).astype(jnp.float32)}


def _run(num_micro_batches, mesh=None, batch=None, steps=2):
  model = _model()
  graphdef = nnx.split(model)[0]
  # SGD: parameters are linear in the gradients, so summation-order noise in
  # the gradients stays at float32 rounding (Adam divides it by √v ≈ |g|).
  optimizer = optax.sgd(0.1)
  state = create_train_state(model, optimizer, jax.random.key(0), mesh=mesh)
  step = make_train_step(graphdef, _sft_loss, optimizer, num_micro_batches=num_micro_batches,
                         mesh=mesh, shared=("num_tokens",))
  metrics = []
  for i in range(steps):
    state, m = step(state, batch or _batch(seed=i))
    metrics.append(jax.device_get(m))
  return state, metrics, step


def test_micro_batches_equal_full_batch():
  full_state, full, _ = _run(1)
  micro_state, micro, _ = _run(4)
  for a, b in zip(full, micro):
    np.testing.assert_allclose(a["loss"], b["loss"], rtol=1e-5)
    np.testing.assert_allclose(a["grad_norm"], b["grad_norm"], rtol=1e-4)
    assert a["tokens"] == b["tokens"]
  for a, b in zip(jax.tree.leaves(full_state.params), jax.tree.leaves(micro_state.params)):
    np.testing.assert_allclose(a, b, atol=1e-5)


def test_sharded_step_equals_single_device():
  mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 2, 2), ("data", "fsdp", "tensor"))
  single_state, single, _ = _run(1)
  sharded_state, sharded, _ = _run(2, mesh=mesh)
  for a, b in zip(single, sharded):
    np.testing.assert_allclose(a["loss"], b["loss"], rtol=1e-5)
  q = sharded_state.params["layers"][0]["attn"]["q_proj"].get_value()
  assert tuple(q.sharding.spec)[:2] == ("fsdp", "tensor")
  for a, b in zip(jax.tree.leaves(single_state.params), jax.tree.leaves(sharded_state.params)):
    np.testing.assert_allclose(a, np.asarray(b), atol=1e-5)


def test_non_finite_update_is_skipped_and_counted():
  model = _model()
  graphdef = nnx.split(model)[0]
  optimizer = optax.adam(1e-2)
  state = create_train_state(model, optimizer, jax.random.key(0))
  before = jax.device_get(state.params)
  step = make_train_step(graphdef, _sft_loss, optimizer, shared=("num_tokens",))
  bad = _batch() | {"num_tokens": jnp.float32(0.0)}  # 0/0 → NaN loss
  state, metrics = step(state, bad)
  assert int(metrics["skipped"]) == 1 and int(state.nonfinite_streak) == 1
  assert int(state.step) == 0
  for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(state.params)):
    np.testing.assert_array_equal(a, b)
  state, metrics = step(state, bad)
  assert int(state.nonfinite_streak) == 2 and int(state.nonfinite_total) == 2
  state, metrics = step(state, _batch())
  assert int(metrics["skipped"]) == 0 and int(state.nonfinite_streak) == 0
  assert int(state.step) == 1 and int(state.nonfinite_total) == 2
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(jax.device_get(state.opt_state)))


def test_step_compiles_once():
  _, _, step = _run(2, steps=3)
  assert step._cache_size() == 1


def test_sharded_step_compiles_once():
  """A state born sharded comes back from the step with the same shardings: no second compile
  (specs with trailing Nones, `P('fsdp', 'tensor', None)`, made the second update compile again)."""
  mesh = Mesh(np.array(jax.devices()[:8]).reshape(1, 4, 2), ("data", "fsdp", "tensor"))
  state, _, step = _run(1, mesh=mesh, steps=3)
  assert step._cache_size() == 1
  q = state.params["layers"][0]["attn"]["q_proj"].get_value()
  assert tuple(q.sharding.spec) == ("fsdp", "tensor")


def test_micro_batch_count_that_does_not_divide_names_the_key():
  model = _model()
  optimizer = optax.sgd(0.1)
  state = create_train_state(model, optimizer, jax.random.key(0))
  step = make_train_step(nnx.split(model)[0], _sft_loss, optimizer, num_micro_batches=3,
                         shared=("num_tokens",))
  with pytest.raises(ValueError, match=r"num_micro_batches=3 does not divide the batch of 8 "
                                       r"rows; valid values: \[1, 2, 4, 8\]"):
    step(state, _batch())
