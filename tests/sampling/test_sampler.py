"""Sampler: greedy = argmax of the full forward, distributions, masks, ends, agreement."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxrl_post import parallel
from jaxrl_post.models import CausalLM, get_model_config, stack_layer_params
from jaxrl_post.parallel import host
from jaxrl_post.parallel.mesh import REPLICATED_RULES, data_parallel_axes
from jaxrl_post.sampling import (
  FINISH_EOS,
  FINISH_LENGTH,
  FINISH_STOP,
  Sampler,
  filter_logits,
  kernels,
  rollout_metrics,
  scoring,
)
from jaxrl_post.sampling.sampler import end_id_array, jitted_decode, jitted_prefill
from jaxrl_post.tokenizers import CharTokenizer

VOCAB = 32


@pytest.fixture(scope="module")
def sampler(model):
  return Sampler(model, max_prompt_len=32, eos_ids=[])


PROMPTS = [[3, 4, 5], [7, 8, 9, 10, 11, 12, 13], [1]]


@nnx.jit
def _forward(model, tokens):
  return model(tokens)


def test_greedy_equals_stepwise_argmax_of_full_forward(model, sampler):
  rollout = sampler.generate(None, PROMPTS, max_new_tokens=8, greedy=True)
  for row, prompt in enumerate(PROMPTS):
    tokens = list(prompt)
    for _ in range(8):
      # No cache and no left padding: the most literal reference. Right padding
      # to a fixed 16 keeps one compile; causal attention never sees it.
      buffer = jnp.asarray([tokens + [0] * (16 - len(tokens))])
      tokens.append(int(jnp.argmax(_forward(model, buffer)[0, len(tokens) - 1])))
    np.testing.assert_array_equal(np.asarray(rollout.completion_tokens[row]), tokens[len(prompt):])
  assert bool(jnp.all(rollout.finish_reason == FINISH_LENGTH))


def test_sampler_logp_equals_score(sampler):
  rollout = sampler.generate(None, PROMPTS, n_samples_per_prompt=3, max_new_tokens=12,
                             temperature=0.7, top_k=10, rng=jax.random.key(0), num_logprobs=5)
  scored = sampler.score(None, rollout.prompt_tokens, rollout.prompt_mask,
                         rollout.completion_tokens, rollout.completion_mask, temperature=0.7,
                         top_k=5)
  mask = np.asarray(rollout.completion_mask)
  np.testing.assert_allclose(np.asarray(rollout.logp)[mask], np.asarray(scored.logp)[mask],
                             atol=1e-5)
  np.testing.assert_allclose(np.asarray(rollout.topk_logp)[mask],
                             np.asarray(scored.topk_logp)[mask], atol=1e-5)
  np.testing.assert_array_equal(np.asarray(rollout.topk_ids)[mask],
                                np.asarray(scored.topk_ids)[mask])
  metrics = rollout_metrics(rollout, scored.logp)
  assert metrics["logp_abs_diff_max"] < 1e-5 and abs(metrics["logp_mismatch_kl"]) < 1e-9
  # Scoring given candidate ids (how a teacher scores the student's top-K):
  # the student's own top-K ids give back its top-K log-probs; column 0 of
  # [sampled token, top-K] gives back the sampled token's log-prob.
  candidates = jnp.concatenate([rollout.completion_tokens[..., None], rollout.topk_ids], -1)
  again = sampler.score(None, rollout.prompt_tokens, rollout.prompt_mask,
                        rollout.completion_tokens, rollout.completion_mask, temperature=0.7,
                        candidate_ids=candidates)
  np.testing.assert_allclose(np.asarray(again.candidate_logp[..., 0]), np.asarray(scored.logp),
                             atol=1e-6)
  np.testing.assert_allclose(np.asarray(again.candidate_logp[..., 1:])[mask],
                             np.asarray(scored.topk_logp)[mask], atol=1e-5)
  assert float(jnp.abs(jnp.where(mask[..., None], 0.0, again.candidate_logp)).max()) == 0.0


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_first_token_distribution_is_softmax_at_temperature(model, sampler, temperature):
  n = 3000
  rollout = sampler.generate(None, [[3, 4, 5]], n_samples_per_prompt=n, max_new_tokens=1,
                             temperature=temperature, rng=jax.random.key(1))
  logits = np.asarray(_forward(model, jnp.asarray([[3, 4, 5]]))[0, -1], np.float64) / temperature
  probs = np.exp(logits - logits.max())
  probs /= probs.sum()
  counts = np.bincount(np.asarray(rollout.completion_tokens[:, 0]), minlength=VOCAB)
  # Pool the rare tokens so every expected count is ≥ 5 (chi-square validity).
  order = np.argsort(probs)
  rare = order[np.cumsum(probs[order]) * n < 5]
  keep = np.setdiff1d(np.arange(VOCAB), rare)
  observed, expected = counts[keep], probs[keep] * n
  if rare.size:
    observed = np.append(observed, counts[rare].sum())
    expected = np.append(expected, probs[rare].sum() * n)
  assert scipy.stats.chisquare(observed, expected).pvalue > 1e-3
  # The recorded log-prob of each draw is its softmax(logits / T) log-prob.
  drawn = np.asarray(rollout.completion_tokens[:, 0])
  np.testing.assert_allclose(np.asarray(rollout.logp[:, 0]), np.log(probs[drawn]), atol=1e-5)


def test_filter_logits_top_k_and_top_p():
  # probs 0.5, 0.3, 0.15, 0.05 (hand-made): top-p 0.75 keeps the first two
  # (mass before the third is 0.8 ≥ 0.75); top-p 0.8 keeps three (mass before
  # the third is exactly 0.8, not < 0.8 — so it drops it; 0.81 keeps it).
  logits = jnp.log(jnp.array([[0.15, 0.5, 0.05, 0.3]]))
  kept = lambda **kw: np.isfinite(np.asarray(filter_logits(logits, **kw)))[0].tolist()
  assert kept(top_p=0.75) == [False, True, False, True]
  assert kept(top_p=0.81) == [True, True, False, True]
  assert kept(top_p=0.1) == [False, True, False, False]  # the top token is always kept
  assert kept(top_p=1.0) == [True, True, True, True]
  assert kept(top_k=1) == [False, True, False, False]
  assert kept(top_k=3) == [True, True, False, True]
  assert kept(top_k=3, top_p=0.5) == [False, True, False, False]
  # Traced top_p (as the sampler passes it): `cond` skips the nucleus at 1.0 only.
  traced = jax.jit(lambda p: jnp.isfinite(filter_logits(logits, top_p=p))[0])
  assert traced(jnp.float32(1.0)).tolist() == [True, True, True, True]
  assert traced(jnp.float32(0.75)).tolist() == [False, True, False, True]


def test_samples_stay_inside_top_k_and_top_p(model, sampler):
  rollout = sampler.generate(None, [[3, 4, 5]], n_samples_per_prompt=500, max_new_tokens=1,
                             top_k=3, rng=jax.random.key(2))
  logits = np.asarray(_forward(model, jnp.asarray([[3, 4, 5]]))[0, -1])
  assert set(np.unique(rollout.completion_tokens)) <= set(np.argsort(logits)[-3:])
  rollout = sampler.generate(None, [[3, 4, 5]], n_samples_per_prompt=500, max_new_tokens=1,
                             top_p=0.5, rng=jax.random.key(3))
  probs = np.asarray(jax.nn.softmax(logits))
  order = np.argsort(-probs)
  nucleus = order[: np.searchsorted(np.cumsum(probs[order]), 0.5) + 1]
  assert set(np.unique(rollout.completion_tokens)) <= set(nucleus)


def test_eos_and_stop_tokens_end_rows_and_mask_the_rest(model):
  free = Sampler(model, max_prompt_len=32, eos_ids=[]).generate(
    None, PROMPTS, max_new_tokens=8, greedy=True)
  tokens = np.asarray(free.completion_tokens)
  eos, stop = int(tokens[0, 2]), int(tokens[1, 4])
  sampler = Sampler(model, max_prompt_len=32, eos_ids=[eos], pad_id=0)
  rollout = sampler.generate(None, PROMPTS, max_new_tokens=8, greedy=True, stop_tokens=[stop])
  for row in range(len(PROMPTS)):
    hits = [i for i, t in enumerate(tokens[row]) if t in (eos, stop)]
    end = hits[0] + 1 if hits else 8
    mask = np.asarray(rollout.completion_mask[row])
    assert mask[:end].all() and not mask[end:].any()
    np.testing.assert_array_equal(np.asarray(rollout.completion_tokens[row, :end]),
                                  tokens[row, :end])
    assert (np.asarray(rollout.completion_tokens[row, end:]) == 0).all()
    assert (np.asarray(rollout.logp[row, end:]) == 0).all()
    expected = (FINISH_LENGTH if not hits else
                FINISH_EOS if tokens[row, hits[0]] == eos else FINISH_STOP)
    assert int(rollout.finish_reason[row]) == expected
  assert int(rollout.finish_reason[0]) == FINISH_EOS
  assert rollout_metrics(rollout)["finish_eos_fraction"] > 0


def test_shared_prefill_matches_repeated_prompts(sampler):
  """n samples from one prefill = n copies of the prompt prefilled separately.

  Both paths draw with the same per-step keys over the same batch shape, so
  the samples are not just equal in distribution but identical.
  """
  n = 4
  shared = sampler.generate(None, PROMPTS[:2], n_samples_per_prompt=n, max_new_tokens=10,
                            rng=jax.random.key(4))
  repeated = sampler.generate(None, [p for p in PROMPTS[:2] for _ in range(n)],
                              max_new_tokens=10, rng=jax.random.key(4))
  np.testing.assert_array_equal(np.asarray(shared.completion_tokens),
                                np.asarray(repeated.completion_tokens))
  np.testing.assert_allclose(np.asarray(shared.logp), np.asarray(repeated.logp), atol=1e-5)
  np.testing.assert_array_equal(np.asarray(shared.group_ids), [0] * n + [1] * n)
  # And samples within a group differ (independent draws, not copies).
  assert len({tuple(r) for r in np.asarray(shared.completion_tokens[:n]).tolist()}) > 1


def test_group_rows_share_their_prompt_cache(model):
  # n > 1: the prompt's keys and values stay once per prompt, each row gets
  # only its own max_new_tokens slots (no n-fold copy of the prompt cache).
  graphdef, state = nnx.split(model)
  tokens = jnp.asarray([[0, 3, 4], [5, 6, 7]], jnp.int32)
  mask = tokens > 0
  shared = kernels.prefill(graphdef, state, tokens, mask, cache_len=3 + 10, num_samples=4)
  alone = kernels.prefill(graphdef, state, tokens, mask, cache_len=3 + 10, num_samples=1)
  c = model.config
  assert shared.cache.prefix_k[0].shape == (2, c.num_kv_heads, c.head_dim, 3)
  assert shared.cache.k[0].shape == (8, c.num_kv_heads, c.head_dim, 10)
  assert not shared.cache.mask.any() and int(shared.cache.index) == 0
  np.testing.assert_array_equal(np.asarray(shared.cache.prefix_mask), np.asarray(mask))
  visible = np.asarray(mask)[:, None, None, :]  # padding slots hold different filler
  np.testing.assert_allclose(np.asarray(shared.cache.prefix_k[1]) * visible,
                             np.asarray(alone.cache.k[1][..., :3]) * visible, atol=1e-6)
  assert alone.cache.prefix_mask is None and alone.cache.max_len == 13
  np.testing.assert_allclose(np.asarray(shared.logits), np.repeat(alone.logits, 4, axis=0))


def test_no_recompilation_within_a_bucket(model):
  sampler = Sampler(model, max_prompt_len=32, eos_ids=[])
  kw = dict(n_samples_per_prompt=2, max_new_tokens=6, rng=jax.random.key(5))
  sampler.generate(None, [[1, 2, 3], [4, 5]], **kw)
  sizes = (jitted_prefill._cache_size(), jitted_decode._cache_size())
  # Other lengths (≤ 16), other prompt count (2 → same bucket), other values.
  sampler.generate(None, [[6] * 11, [7] * 16], temperature=0.3, top_p=0.9, stop_tokens=[4], **kw)
  sampler.generate(None, [[9]], **kw)  # batch bucket 1: one new compile of each kernel
  assert (jitted_prefill._cache_size(), jitted_decode._cache_size()) == (
    sizes[0] + 1, sizes[1] + 1)


def test_string_prompts_with_a_tokenizer():
  tokenizer = CharTokenizer()
  config = get_model_config("tiny", vocab_size=tokenizer.vocab_size)
  sampler = Sampler(CausalLM(config, rngs=nnx.Rngs(0)), tokenizer, max_prompt_len=16)
  rollout = sampler.generate(None, ["12+7=", "3*4="], max_new_tokens=5, rng=jax.random.key(0))
  assert rollout.completion_tokens.shape == (2, 5)
  assert np.asarray(rollout.prompt_tokens[0, -5:]).tolist() == tokenizer.encode("12+7=")
  assert len(sampler.decode_text(rollout)) == 2


def test_bad_input_errors(sampler):
  with pytest.raises(ValueError, match="empty prompt list"):
    sampler.generate(None, [], greedy=True)
  with pytest.raises(ValueError, match="prompt 1 is empty"):
    sampler.generate(None, [[1], []], greedy=True)
  with pytest.raises(ValueError, match="prompt 1 has 40 tokens, more than the largest prompt "
                                       "bucket \\(32\\)"):
    sampler.generate(None, [[1], [2] * 40], greedy=True)
  with pytest.raises(ValueError, match="n_samples_per_prompt must be ≥ 1, got 0"):
    sampler.generate(None, [[1]], n_samples_per_prompt=0, greedy=True)
  for top_p in (0.0, 1.5):
    with pytest.raises(ValueError, match="top_p must be in \\(0, 1\\]"):
      sampler.generate(None, [[1]], top_p=top_p, rng=jax.random.key(0))
  with pytest.raises(ValueError, match="string prompts need a tokenizer"):
    sampler.generate(None, ["hi"], greedy=True)
  with pytest.raises(ValueError, match="needs an rng key"):
    sampler.generate(None, [[1]])


def test_truncation_keeps_the_end_of_long_prompts(model):
  sampler = Sampler(model, max_prompt_len=16, eos_ids=[], truncate_prompts=True)
  long_prompt = list(range(1, 31))
  a = sampler.generate(None, [long_prompt], max_new_tokens=4, greedy=True)
  b = sampler.generate(None, [long_prompt[-16:]], max_new_tokens=4, greedy=True)
  np.testing.assert_array_equal(np.asarray(a.completion_tokens), np.asarray(b.completion_tokens))


def test_early_exit_when_every_row_finished(model):
  free = Sampler(model, max_prompt_len=32, eos_ids=[]).generate(
    None, [[3, 4, 5]], max_new_tokens=4, greedy=True)
  first = int(free.completion_tokens[0, 0])
  sampler = Sampler(model, max_prompt_len=32, eos_ids=[first])
  graphdef, state = sampler.graphdef, nnx.state(model)
  tokens, mask = jnp.asarray([[3, 4, 5]]), jnp.ones((1, 3), bool)

  @jax.jit
  def run(state, tokens, mask):
    start = kernels.prefill(graphdef, state, tokens, mask, cache_len=3 + 50, num_samples=1)
    return kernels.decode(graphdef, state, start, jax.random.key(0), max_new_tokens=50,
                          eos_ids=jnp.asarray([first]), stop_ids=jnp.asarray([-1]), pad_id=0,
                          temperature=1.0, top_p=1.0, top_k=0, greedy=True, num_logprobs=0)

  out = run(state, tokens, mask)
  assert int(out.steps) == 1  # finished at the first token: no decode step ran


def test_sharded_parameters_and_batch_give_the_same_rollout(model):
  mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 2, 2), ("data", "fsdp", "tensor"))
  graphdef, state = nnx.split(model)
  sharded_state = jax.device_put(state, parallel.state_shardings(state, mesh))
  prompts = PROMPTS + [[2, 2], [5, 6, 7]]
  kw = dict(n_samples_per_prompt=2, max_new_tokens=6, temperature=0.8, rng=jax.random.key(6))
  reference = Sampler(model, max_prompt_len=32, eos_ids=[]).generate(None, prompts, **kw)
  sharded_sampler = Sampler(model, max_prompt_len=32, eos_ids=[], mesh=mesh)
  rollout = sharded_sampler.generate(sharded_state, prompts, **kw)
  np.testing.assert_array_equal(np.asarray(rollout.completion_tokens),
                                np.asarray(reference.completion_tokens))
  np.testing.assert_allclose(np.asarray(rollout.logp), np.asarray(reference.logp), atol=1e-5)


def test_prompt_embeddings_decode_and_score_agree(model):
  # Multimodal prompts (encoder outputs instead of token embeddings) go through
  # the same kernels: sampled log-probs equal teacher-forced scores, and
  # embeddings equal to the token lookup give the token-prompt rollout.
  graphdef, state = nnx.split(model)
  tokens = jnp.asarray([[0, 3, 4, 5], [7, 8, 9, 10]], jnp.int32)
  mask = jnp.asarray([[False, True, True, True], [True, True, True, True]])
  embeds = model.embed_tokens(tokens) + 0.3 * jax.random.normal(
      jax.random.key(1), (2, 4, model.config.embed_dim))
  kwargs = dict(max_new_tokens=6, eos_ids=jnp.zeros((0,), jnp.int32),
                stop_ids=jnp.zeros((0,), jnp.int32), pad_id=0, temperature=1.0, top_p=1.0,
                top_k=0, greedy=False, num_logprobs=0)

  @jax.jit
  def rollout(embeddings):
    # Jitted: an eager while_loop would compile every primitive on its own.
    start = kernels.prefill(graphdef, state, tokens, mask, cache_len=10, num_samples=2,
                            embeddings=embeddings)
    return kernels.decode(graphdef, state, start, jax.random.key(0), **kwargs)

  out = rollout(embeds)
  prompt_rows = lambda x: jnp.repeat(x, 2, axis=0)  # noqa: E731
  scored = scoring.score_model(model, prompt_rows(tokens), prompt_rows(mask), out.tokens,
                               out.mask, prompt_embeddings=prompt_rows(embeds))
  m = np.asarray(out.mask)
  np.testing.assert_allclose(np.asarray(out.logp)[m], np.asarray(scored.logp)[m], atol=1e-5)
  by_lookup = rollout(model.embed_tokens(tokens))
  by_tokens = rollout(None)
  np.testing.assert_array_equal(np.asarray(by_lookup.tokens), np.asarray(by_tokens.tokens))
  assert not np.array_equal(np.asarray(out.logp), np.asarray(by_tokens.logp))


def test_data_parallel_sampling_over_replicated_parameters_gives_the_same_rollout(model):
  # The CPU recipe of scripts/bench_sampler.py: every device holds the whole
  # model (REPLICATED_RULES), rows are split over a `data` mesh.
  mesh = host.data_mesh(jax.devices()[:4])
  state = jax.device_put(nnx.state(model), NamedSharding(mesh, PartitionSpec()))
  prompts = PROMPTS + [[2, 2], [5, 6, 7]]
  # 40 new tokens: two decode phases, so the sharded cache is also cut and padded.
  assert len(kernels.decode_phases(40)) == 2
  kw = dict(n_samples_per_prompt=2, max_new_tokens=40, temperature=0.8, rng=jax.random.key(6))
  reference = Sampler(model, max_prompt_len=32, eos_ids=[]).generate(None, prompts, **kw)
  sampler = Sampler(model, max_prompt_len=32, eos_ids=[], mesh=mesh, rules=REPLICATED_RULES)
  rows, = sampler._put_batch(np.zeros((8, 3), np.int32))
  assert {s.data.shape for s in rows.addressable_shards} == {(2, 3)}  # 2 rows per device
  rollout = sampler.generate(state, prompts, **kw)
  np.testing.assert_array_equal(np.asarray(rollout.completion_tokens),
                                np.asarray(reference.completion_tokens))
  np.testing.assert_allclose(np.asarray(rollout.logp), np.asarray(reference.logp), atol=1e-5)


def test_data_parallel_decode_runs_one_loop_per_device(model):
  # Pure data parallelism: every device decodes its own rows in its own loop,
  # so no reduction runs per step; samples, finish reasons and the reported
  # step count equal those of one global loop, also when the devices' loops
  # end at different steps.
  mesh = host.data_mesh(jax.devices()[:2])
  assert data_parallel_axes(mesh, REPLICATED_RULES, 4) == ("data",)
  assert data_parallel_axes(mesh, REPLICATED_RULES, 3) == ()  # rows do not divide: one global loop
  cube = Mesh(np.array(jax.devices()[:8]).reshape(2, 2, 2), ("data", "fsdp", "tensor"))
  assert data_parallel_axes(cube, parallel.DEFAULT_RULES, 8) == ()  # parameters are split too
  budget = 64  # 3 decode phases: one global loop would reduce in each
  free = Sampler(model, max_prompt_len=16, eos_ids=[]).generate(
    None, [[3, 4, 5]], max_new_tokens=budget, greedy=True)
  eos = int(free.completion_tokens[0, 2])  # a token the model likes: rows end at varied steps

  def run(mesh):
    sampler = Sampler(model, max_prompt_len=16, eos_ids=[eos], mesh=mesh, rules=REPLICATED_RULES)
    tokens, mask, _ = sampler._pad_prompts([[3, 4, 5], [7, 8], [3, 4, 5], [9]])
    tokens, mask = sampler._put_batch(tokens, mask)
    start = jitted_prefill(sampler._default_state, tokens, mask, cache_len=16 + budget,
                           num_samples=1, **sampler._static)
    args = (sampler._default_state, start.cache, start.logits, start.positions,
            jax.random.key(3), end_id_array([eos], "eos"), end_id_array([], "stop"),
            jnp.float32(0.7), jnp.float32(1.0))
    kw = dict(max_new_tokens=budget, top_k=0, greedy=False, num_logprobs=2, pad_id=0,
              **sampler._static)
    hlo = jitted_decode.lower(*args, **kw).compile().as_text()
    return jitted_decode(*args, **kw), len(re.findall(r"all-reduce(?:-start)?\(", hlo))

  reference, _ = run(None)
  local, reductions = run(mesh)
  assert reductions <= 2  # the two maxima at the end (steps, cache index), none per step
  for name in ("tokens", "mask", "finish_reason", "steps", "topk_ids"):
    np.testing.assert_array_equal(np.asarray(getattr(local, name)),
                                  np.asarray(getattr(reference, name)), err_msg=name)
  np.testing.assert_allclose(np.asarray(local.logp), np.asarray(reference.logp), atol=1e-5)
  lengths = np.asarray(local.mask).sum(-1)
  # Device 0 holds rows 0-1, device 1 rows 2-3: their loops end at different steps.
  assert lengths[:2].max() != lengths[2:].max(), lengths
  assert int(local.steps) == lengths.max()


@pytest.mark.parametrize("max_new_tokens", [1, 2, 16, 17, 40, 128, 129, 1000])
def test_decode_phases_cover_every_step_once(max_new_tokens):
  ends = kernels.decode_phases(max_new_tokens)
  assert ends[-1] == max_new_tokens and len(ends) <= kernels.MAX_PHASES
  sizes = np.diff([1, *ends])
  assert (sizes >= 0).all()
  if len(ends) > 1:
    assert (sizes >= kernels.MIN_PHASE_STEPS).all()


def test_resize_cache_cuts_and_pads_with_empty_slots(model):
  cache = model.init_cache(2, 8)
  cache = cache.replace(mask=cache.mask.at[:, :3].set(True))
  cut = kernels.resize_cache(cache, 5)
  assert cut.k[0].shape[-1] == 5 and cut.v[0].shape[2] == 5 and cut.mask.shape == (2, 5)
  grown = kernels.resize_cache(cut, 11)
  assert grown.k[0].shape[-1] == 11 and grown.v[0].shape[2] == 11
  np.testing.assert_array_equal(np.asarray(grown.mask[:, 3:]), False)
  np.testing.assert_array_equal(np.asarray(grown.k[0][..., 5:]), 0.0)


def test_phased_decode_matches_one_phase_and_score(model, monkeypatch):
  # 3-step phases: 24 new tokens run in 7 phases over caches of growing length.
  graphdef, state = nnx.split(model)
  tokens = jnp.asarray([[0, 0, 3, 4, 5], [7, 8, 9, 10, 11]], jnp.int32)
  mask = tokens > 0
  eos = 17  # ends some rows early: later phases must leave them finished

  def rollout(min_steps, max_phases):
    monkeypatch.setattr(kernels, "MIN_PHASE_STEPS", min_steps)
    monkeypatch.setattr(kernels, "MAX_PHASES", max_phases)

    @jax.jit  # a fresh function: the patched constants are read when it traces
    def run(state):
      start = kernels.prefill(graphdef, state, tokens, mask, cache_len=5 + 24, num_samples=3)
      return kernels.decode(graphdef, state, start, jax.random.key(3), max_new_tokens=24,
                            eos_ids=jnp.asarray([eos]), stop_ids=jnp.asarray([-1]), pad_id=0,
                            temperature=1.3, top_p=1.0, top_k=0, greedy=False, num_logprobs=0)
    return run(state)

  assert len(kernels.decode_phases(24)) == 1
  one = rollout(16, 8)
  monkeypatch.setattr(kernels, "MIN_PHASE_STEPS", 3)
  assert len(kernels.decode_phases(24)) == 7
  phased = rollout(3, 8)
  np.testing.assert_array_equal(np.asarray(phased.tokens), np.asarray(one.tokens))
  np.testing.assert_array_equal(np.asarray(phased.finish_reason), np.asarray(one.finish_reason))
  np.testing.assert_allclose(np.asarray(phased.logp), np.asarray(one.logp), atol=1e-6)
  assert int(phased.steps) == int(one.steps)
  assert phased.cache.k[0].shape == one.cache.k[0].shape  # back to the full length
  # Some rows ended at eos, some ran to the length.
  assert set(np.asarray(phased.finish_reason).tolist()) == {FINISH_EOS, FINISH_LENGTH}
  m = np.asarray(phased.mask)
  scored = scoring.score_model(model, jnp.repeat(tokens, 3, 0), jnp.repeat(mask, 3, 0),
                               phased.tokens, phased.mask, temperature=1.3)
  np.testing.assert_allclose(np.asarray(phased.logp)[m], np.asarray(scored.logp)[m], atol=1e-5)


# ---- Layers under scan: stacked parameters and a stacked KV cache ----


@pytest.fixture(scope="module")
def scanned_model(model):
  """`model`'s weights in a `scan_layers=True` model (one block, `[layers, ...]` params)."""
  config = model.config.replace(scan_layers=True)
  graphdef = nnx.split(nnx.eval_shape(lambda: CausalLM(config, rngs=nnx.Rngs(0))))[0]
  return nnx.merge(graphdef, stack_layer_params(nnx.state(model)))


@pytest.mark.parametrize("n", [1, 3])
def test_scanned_sampler_matches_unrolled(model, scanned_model, n):
  # 40 new tokens: two decode phases, so the stacked cache is also cut and padded;
  # n = 3 decodes over a shared prompt prefix (cascade attention).
  kw = dict(n_samples_per_prompt=n, max_new_tokens=40, rng=jax.random.key(8))
  for extra in (dict(greedy=True), dict(temperature=0.9, num_logprobs=3)):
    want = Sampler(model, max_prompt_len=32, eos_ids=[]).generate(None, PROMPTS, **kw, **extra)
    got = Sampler(scanned_model, max_prompt_len=32, eos_ids=[]).generate(None, PROMPTS, **kw,
                                                                         **extra)
    np.testing.assert_array_equal(np.asarray(got.completion_tokens),
                                  np.asarray(want.completion_tokens))
    np.testing.assert_allclose(np.asarray(got.logp), np.asarray(want.logp), atol=1e-5)


def test_scanned_model_prefills_stacked_caches(scanned_model):
  graphdef, state = nnx.split(scanned_model)
  tokens = jnp.asarray([[0, 3, 4], [5, 6, 7]], jnp.int32)
  c, layers = scanned_model.config, scanned_model.config.num_layers
  shared = kernels.prefill(graphdef, state, tokens, tokens > 0, cache_len=3 + 10, num_samples=4)
  assert shared.cache.stacked
  assert shared.cache.prefix_k.shape == (layers, 2, c.num_kv_heads, c.head_dim, 3)
  assert shared.cache.prefix_v.shape == (layers, 2, c.num_kv_heads, 3, c.head_dim)
  assert shared.cache.k.shape == (layers, 8, c.num_kv_heads, c.head_dim, 10)
  cut = kernels.resize_cache(shared.cache, 5)
  assert cut.k.shape[-1] == 5 and cut.v.shape[-2] == 5 and cut.prefix_k.shape[-1] == 3
  grown = kernels.resize_cache(cut, 11)
  assert grown.k.shape[-1] == 11 and grown.v.shape[-2] == 11 and grown.mask.shape == (8, 11)
  np.testing.assert_array_equal(np.asarray(grown.v[:, :, :, 5:]), 0.0)


@pytest.mark.parametrize("rules", ["fsdp_tensor", "replicated"])
def test_sharded_scanned_sampler_gives_the_same_rollout(model, scanned_model, rules):
  # fsdp_tensor: stacked parameters split over fsdp × tensor, one global loop;
  # replicated: pure data parallelism, one decode loop per device (shard_map),
  # whose stacked cache buffers are split along their row axis (axis 1).
  mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 2, 2), ("data", "fsdp", "tensor"))
  table = parallel.mesh.get_rules(rules)
  state = nnx.state(scanned_model)
  state = jax.device_put(state, parallel.state_shardings(state, mesh, table))
  prompts = PROMPTS + [[2, 2], [5, 6, 7], [1, 2], [9], [4, 4, 4]]
  kw = dict(n_samples_per_prompt=2, max_new_tokens=20, temperature=0.8, rng=jax.random.key(6))
  reference = Sampler(model, max_prompt_len=32, eos_ids=[]).generate(None, prompts, **kw)
  rollout = Sampler(scanned_model, max_prompt_len=32, eos_ids=[], mesh=mesh,
                    rules=table).generate(state, prompts, **kw)
  np.testing.assert_array_equal(np.asarray(rollout.completion_tokens),
                                np.asarray(reference.completion_tokens))
  np.testing.assert_allclose(np.asarray(rollout.logp), np.asarray(reference.logp), atol=1e-5)
