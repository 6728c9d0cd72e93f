"""Chunked scoring: log-probs, entropies, top-K and gradients as with full logits, less memory."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxrl_post.models import CausalLM, get_model_config
from jaxrl_post.sampling import score_hidden, score_logits, score_model, scoring

VOCAB, PROMPT, TIME = 97, 5, 12


def _model(**overrides):
  config = get_model_config("tiny", vocab_size=VOCAB, **overrides)
  return CausalLM(config, rngs=nnx.Rngs(0))


def _batch(rows=4, seed=0):
  rng = np.random.default_rng(seed)
  prompt = rng.integers(1, VOCAB, (rows, PROMPT)).astype(np.int32)
  prompt_mask = np.ones((rows, PROMPT), bool)
  prompt_mask[1, :2] = False  # a left-padded prompt
  completion = rng.integers(1, VOCAB, (rows, TIME)).astype(np.int32)
  completion_mask = np.arange(TIME)[None] < rng.integers(3, TIME + 1, (rows, 1))
  candidates = rng.integers(0, VOCAB, (rows, TIME, 3)).astype(np.int32)
  return (jnp.asarray(prompt), jnp.asarray(prompt_mask), jnp.asarray(completion),
          jnp.asarray(completion_mask), jnp.asarray(candidates))


def _full_logits_score(model, prompt, prompt_mask, completion, completion_mask, **kwargs):
  """The pre-chunking path: `[batch, time, vocab]` logits of the whole sequence, then sliced."""
  tokens = jnp.concatenate([prompt, completion], axis=1)
  mask = jnp.concatenate([prompt_mask, completion_mask], axis=1)
  logits = model(tokens, attention_mask=mask)[:, prompt.shape[1] - 1:-1]
  return score_logits(logits, completion, completion_mask, **kwargs)


def _numpy_score(logits, tokens, mask, temperature):
  z = np.asarray(logits, np.float64) / temperature
  z = z - z.max(-1, keepdims=True)
  logp_all = z - np.log(np.exp(z).sum(-1, keepdims=True))
  logp = np.take_along_axis(logp_all, np.asarray(tokens)[..., None], -1)[..., 0]
  entropy = -(np.exp(logp_all) * logp_all).sum(-1)
  return np.where(mask, logp, 0.0), np.where(mask, entropy, 0.0)


@pytest.mark.parametrize("chunk_size", [0, 3, 4, 5, 12, 64])
@pytest.mark.parametrize("tied", [True, False])
def test_chunked_scores_equal_full_logits(chunk_size, tied):
  model = _model(tie_embeddings=tied)
  prompt, prompt_mask, completion, completion_mask, candidates = _batch()
  kwargs = dict(temperature=0.7, top_k=5, candidate_ids=candidates)
  want = _full_logits_score(model, prompt, prompt_mask, completion, completion_mask, **kwargs)
  got = jax.jit(lambda m: score_model(m, prompt, prompt_mask, completion, completion_mask,
                                      chunk_size=chunk_size, **kwargs))(model)
  for name in ("logp", "entropy", "topk_logp", "candidate_logp"):
    np.testing.assert_allclose(getattr(got, name), getattr(want, name), atol=1e-5, err_msg=name)
  np.testing.assert_array_equal(got.topk_ids, want.topk_ids)
  # And both against float64 numpy on the full logits.
  tokens = jnp.concatenate([prompt, completion], axis=1)
  mask = jnp.concatenate([prompt_mask, completion_mask], axis=1)
  logits = model(tokens, attention_mask=mask)[:, PROMPT - 1:-1]
  logp, entropy = _numpy_score(logits, completion, completion_mask, 0.7)
  np.testing.assert_allclose(got.logp, logp, atol=1e-5)
  np.testing.assert_allclose(got.entropy, entropy, atol=1e-5)


@pytest.mark.parametrize("chunk_size", [0, 4, 5])
def test_chunked_gradients_equal_full_logits(chunk_size):
  """Gradients of a loss using logp, entropy, top-K and candidate log-probs, wrt every parameter."""
  model = _model()
  graphdef, params = nnx.split(model)
  prompt, prompt_mask, completion, completion_mask, candidates = _batch(seed=1)
  weights = jax.random.normal(jax.random.key(3), (4, TIME, 4))

  def loss(params, scorer):
    out = scorer(nnx.merge(graphdef, params))
    terms = (out.logp, out.entropy, out.topk_logp.sum(-1), out.candidate_logp.sum(-1))
    return sum(jnp.sum(w * t) for w, t in zip(jnp.moveaxis(weights, -1, 0), terms))

  kwargs = dict(temperature=1.3, top_k=4, candidate_ids=candidates)
  full = lambda m: _full_logits_score(m, prompt, prompt_mask, completion,  # noqa: E731
                                      completion_mask, **kwargs)
  chunked = lambda m: score_model(m, prompt, prompt_mask, completion, completion_mask,  # noqa: E731
                                  chunk_size=chunk_size, **kwargs)
  want = jax.jit(jax.grad(loss), static_argnums=1)(params, full)
  got = jax.jit(jax.grad(loss), static_argnums=1)(params, chunked)
  for (path, g), w in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(g, w, atol=1e-5, rtol=1e-5, err_msg=jax.tree_util.keystr(path))
  assert any(float(jnp.abs(w).max()) > 1e-3 for w in jax.tree.leaves(want))


def test_score_uses_the_models_chunk_size():
  model = _model(logit_chunk_size=4)
  prompt, prompt_mask, completion, completion_mask, _ = _batch()
  lowered = jax.jit(lambda m: score_model(m, prompt, prompt_mask, completion,
                                          completion_mask)).lower(model)
  # Three chunks of four positions: one scan over [3, batch, 4, vocab] chunk logits.
  text = lowered.as_text()
  assert "while" in text or "scan" in text
  with pytest.raises(ValueError, match="logit_chunk_size=-2 must be >= 0"):
    score_model(model, prompt, prompt_mask, completion, completion_mask, chunk_size=-2)
  with pytest.raises(ValueError, match="logit_chunk_size"):
    get_model_config("tiny", logit_chunk_size=-1)


def test_chunk_positions():
  assert scoring.chunk_positions(768, 128) == 128
  assert scoring.chunk_positions(64, 128) == 64
  assert scoring.chunk_positions(64, 0) == 64
  assert scoring.chunk_positions(10, 3) == 3  # chunks 3 + 3 + 3 + 1 (padded)


def test_return_logits_false_gives_the_hidden_states():
  model = _model()
  tokens = jnp.arange(12, dtype=jnp.int32).reshape(2, 6)
  logits, hidden = model(tokens, return_hidden=True)
  only_hidden = model(tokens, return_logits=False)
  np.testing.assert_allclose(only_hidden, hidden, atol=1e-6)
  np.testing.assert_allclose(model.output_logits(hidden), logits, atol=1e-6)


def _grad_temp_bytes(model, batch, chunked: bool) -> int:
  graphdef, params = nnx.split(model)
  prompt, prompt_mask, completion, completion_mask = batch

  def loss(params):
    m = nnx.merge(graphdef, params)
    if chunked:
      out = score_model(m, prompt, prompt_mask, completion, completion_mask)
    else:
      out = _full_logits_score(m, prompt, prompt_mask, completion, completion_mask)
    return jnp.sum(out.logp) + jnp.sum(out.entropy)

  compiled = jax.jit(jax.grad(loss)).lower(params).compile()
  return compiled.memory_analysis().temp_size_in_bytes


def test_chunks_bound_the_logit_memory_of_the_backward_pass():
  """At a vocabulary much wider than the model, logits dominate the temporaries of the gradient;
  with chunks of 16 of 256 positions, the compiled gradient needs several times fewer bytes."""
  vocab, rows, prompt_len, time = 8192, 4, 8, 256
  config = get_model_config("tiny", vocab_size=vocab, logit_chunk_size=16)
  model = CausalLM(config, rngs=nnx.Rngs(0))
  batch = (jnp.ones((rows, prompt_len), jnp.int32), jnp.ones((rows, prompt_len), bool),
           jnp.ones((rows, time), jnp.int32), jnp.ones((rows, time), bool))
  full = _grad_temp_bytes(model, batch, chunked=False)
  chunked = _grad_temp_bytes(model, batch, chunked=True)
  one_logits_tensor = rows * time * vocab * 4  # 32 MiB
  # Full logits: log-softmax, its exp and their cotangents, several 32 MiB tensors (172 MB
  # measured). Chunked: 2 MiB per chunk; what is left is the tiny model's attention (47 MB).
  assert full >= 4 * one_logits_tensor, full
  assert full - chunked >= 3 * one_logits_tensor, (chunked, full)


def test_chunked_scoring_on_a_sharded_batch():
  """Batch over `data`, vocabulary over `tensor`: the scan over chunks keeps both shardings."""
  devices = np.array(jax.devices()[:8]).reshape(4, 2)
  mesh = Mesh(devices, ("data", "tensor"))
  model = _model(logit_chunk_size=4)
  prompt, prompt_mask, completion, completion_mask, candidates = _batch(rows=8, seed=2)
  want = score_model(model, prompt, prompt_mask, completion, completion_mask, top_k=3,
                     candidate_ids=candidates, chunk_size=0)
  rows = NamedSharding(mesh, PartitionSpec("data"))
  args = jax.device_put((prompt, prompt_mask, completion, completion_mask, candidates), rows)
  got = jax.jit(lambda m, p, pm, c, cm, cand: score_model(m, p, pm, c, cm, top_k=3,
                                                          candidate_ids=cand))(model, *args)
  for name in ("logp", "entropy", "topk_logp", "candidate_logp"):
    np.testing.assert_allclose(getattr(got, name), getattr(want, name), atol=1e-5, err_msg=name)
  assert got.logp.sharding.spec[0] == "data"


def test_score_hidden_with_a_custom_head():
  """`score_hidden` is the chunked `score_logits` of any projection."""
  rng = np.random.default_rng(0)
  hidden = jnp.asarray(rng.normal(size=(2, 6, 5)), jnp.float32)
  kernel = jnp.asarray(rng.normal(size=(5, 11)), jnp.float32)
  tokens = jnp.asarray(rng.integers(0, 11, (2, 6)), jnp.int32)
  mask = jnp.ones((2, 6), bool)
  project = lambda h: h @ kernel  # noqa: E731
  want = score_logits(project(hidden), tokens, mask)
  got = score_hidden(project, hidden, tokens, mask, chunk_size=2)
  np.testing.assert_allclose(got.logp, want.logp, atol=1e-6)
  np.testing.assert_allclose(got.entropy, want.entropy, atol=1e-6)


@pytest.mark.parametrize("num_micro_batches", [2, 4])
def test_micro_batched_scoring_equals_one_call(num_micro_batches):
  model = _model(logit_chunk_size=4)
  graphdef, state = nnx.split(model)
  prompt, prompt_mask, completion, completion_mask, candidates = _batch(rows=8, seed=4)
  kwargs = dict(temperature=0.9, top_k=2, candidate_ids=candidates)
  want = scoring.score(graphdef, state, prompt, prompt_mask, completion, completion_mask, **kwargs)
  got = jax.jit(lambda s: scoring.score(graphdef, s, prompt, prompt_mask, completion,
                                        completion_mask, num_micro_batches=num_micro_batches,
                                        **kwargs))(state)
  for name in ("logp", "entropy", "topk_logp", "candidate_logp"):
    np.testing.assert_allclose(getattr(got, name), getattr(want, name), atol=1e-5, err_msg=name)
  np.testing.assert_array_equal(got.topk_ids, want.topk_ids)
  with pytest.raises(ValueError, match="score_micro_batches=3 must be >= 1 and divide the 8"):
    scoring.score(graphdef, state, prompt, prompt_mask, completion, completion_mask,
                  num_micro_batches=3)


def test_micro_batches_bound_the_scoring_memory():
  """Scoring 32 rows in 4 micro-batches keeps about a quarter of the activations alive."""
  config = get_model_config("tiny", vocab_size=4096)
  graphdef, state = nnx.split(CausalLM(config, rngs=nnx.Rngs(0)))
  rows, prompt_len, time = 32, 8, 128
  args = (jnp.ones((rows, prompt_len), jnp.int32), jnp.ones((rows, prompt_len), bool),
          jnp.ones((rows, time), jnp.int32), jnp.ones((rows, time), bool))

  def temp_bytes(m):
    fn = jax.jit(lambda s, *a: scoring.score(graphdef, s, *a, num_micro_batches=m).logp)
    return fn.lower(state, *args).compile().memory_analysis().temp_size_in_bytes

  one, four = temp_bytes(1), temp_bytes(4)
  assert four < one / 2.5, (four, one)
