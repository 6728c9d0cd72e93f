"""Legal-token grammars: builder, masked log-probs (golden), sampler/trainer agreement, shards."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from jaxrl_post.parallel import host
from jaxrl_post.parallel.mesh import REPLICATED_RULES
from jaxrl_post.sampling import Sampler, grammar, rollout_metrics, scoring
from jaxrl_post.tokenizers import CharTokenizer

# 3 specials + 29 characters = the sampler tests' 32-token vocabulary (tests/sampling/conftest).
TOKENIZER = CharTokenizer("abcdefghijklmnopqrstuvwxyz[] ")
EOS = TOKENIZER.eos_id
# "no" is a prefix of "non": the state after "no" both continues the slot and starts the next.
SLOTS = [["[p "], ["up", "down", "no", "non"], ["] "], ["up", "down", "no"]]


@pytest.fixture(scope="module")
def gram():
  return grammar.from_slots(TOKENIZER, SLOTS)


def _legal_strings():
  return ["".join(parts) for parts in itertools.product(*SLOTS)]


def test_slots_grammar_accepts_exactly_the_product_of_the_slots(gram):
  assert grammar.GRAMMARS.get("slots") is grammar.from_slots
  for text in _legal_strings():
    assert grammar.accepts(gram, TOKENIZER.encode(text) + [EOS], [EOS]), text
  for text in ["[p upp] up", "[p nonn] up", "[p up]  up", "[p up] non", "[p up"]:
    assert not grammar.accepts(gram, TOKENIZER.encode(text) + [EOS], [EOS]), text
  # EOS is legal only in accepting states; the sink (last state) allows everything.
  accepting = np.asarray(gram.accepting)
  np.testing.assert_array_equal(np.asarray(gram.allowed)[:-1, EOS], accepting[:-1])
  assert np.asarray(gram.allowed)[gram.sink].all()


def test_bad_slots_raise_naming_the_slot_or_state():
  with pytest.raises(ValueError, match=r"slots\[1\]"):
    grammar.from_slots(TOKENIZER, [["a"], []])
  with pytest.raises(ValueError, match="at least one slot"):
    grammar.from_slots(TOKENIZER, [])
  # A hand-made automaton whose reachable state 1 allows nothing.
  allowed = np.zeros((3, 4), bool)
  allowed[0, 1] = allowed[2] = True
  nxt = np.full((3, 4), 2, np.int32)
  nxt[0, 1] = 1
  bad = grammar.TokenGrammar(jnp.asarray(allowed), jnp.asarray(nxt), jnp.int32(0),
                             jnp.zeros(3, bool))
  with pytest.raises(ValueError, match=r"state 1 \(slot 0 after 'x'\)"):
    grammar.check_grammar(bad, ["slot 0 start", "slot 0 after 'x'", "sink"])


def test_masked_log_probs_golden_against_numpy():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(5, 7)).astype(np.float32) * 3
  allowed = rng.random((5, 7)) < 0.5
  allowed[:, 0] = True
  for temperature in (1.0, 0.7):
    got = np.asarray(grammar.masked_log_probs(jnp.asarray(logits), jnp.asarray(allowed),
                                              temperature))
    z = logits.astype(np.float64) / temperature
    lse = np.log(np.sum(np.where(allowed, np.exp(z), 0.0), axis=-1, keepdims=True))
    np.testing.assert_allclose(got[allowed], (z - lse)[allowed], atol=1e-5)
    np.testing.assert_allclose(np.sum(np.exp(got) * allowed, -1), 1.0, atol=1e-6)
    assert np.all(np.exp(got)[~allowed] == 0.0)


def test_gradient_is_zero_for_illegal_logits():
  logits = jnp.asarray(np.random.default_rng(1).normal(size=(3, 6)), jnp.float32)
  allowed = jnp.asarray([[1, 1, 0, 0, 1, 0]] * 3, bool)
  targets = jnp.asarray([0, 1, 4])

  def loss(z):
    logp = grammar.masked_log_probs(z, allowed)
    entropy = -jnp.sum(jnp.exp(logp) * logp)
    return -jnp.take_along_axis(logp, targets[:, None], -1).sum() + entropy

  grad = np.asarray(jax.jit(jax.grad(loss))(logits))
  assert np.all(np.isfinite(grad))
  assert np.all(grad[:, ~np.asarray(allowed[0])] == 0.0)
  assert np.any(grad[:, np.asarray(allowed[0])] != 0.0)


def test_completion_states_match_a_python_walk(gram):
  rows = [TOKENIZER.encode(t) + [EOS] for t in ("[p non] up", "[p up] down", "[p up]x")]
  width = max(map(len, rows))
  tokens = np.zeros((3, width), np.int32)
  mask = np.zeros((3, width), bool)
  for i, row in enumerate(rows):
    tokens[i, :len(row)], mask[i, :len(row)] = row, True
  states = np.asarray(jax.jit(grammar.completion_states)(gram, tokens, mask))
  nxt = np.asarray(gram.next_state)
  for i, row in enumerate(rows):
    s = 0
    for t, token in enumerate(row):
      assert states[i, t] == s
      s = nxt[s, token]
  assert states[2, len(rows[2]) - 1] == gram.sink  # after the illegal "x"


def _prompts():
  return [[3, 4, 5], [7, 8, 9, 10], [1]]


def test_sampled_completions_parse_and_sampler_equals_trainer(model, gram):
  sampler = Sampler(model, max_prompt_len=16, eos_ids=[EOS], grammar=gram)
  rollout = sampler.generate(None, _prompts(), n_samples_per_prompt=8, max_new_tokens=16,
                             temperature=1.3, top_p=0.95, rng=jax.random.key(0))
  tokens = np.asarray(rollout.completion_tokens)
  mask = np.asarray(rollout.completion_mask)
  parsed = [grammar.accepts(gram, row[keep], [EOS]) for row, keep in zip(tokens, mask)]
  assert all(parsed)
  assert len({tuple(r[m]) for r, m in zip(tokens, mask)}) > 3  # real choices were sampled
  scored = sampler.score(None, rollout.prompt_tokens, rollout.prompt_mask,
                         rollout.completion_tokens, rollout.completion_mask, temperature=1.3)
  metrics = rollout_metrics(rollout, scored.logp)
  assert metrics["logp_abs_diff_max"] < 1e-4
  # Forced positions (one legal token) have log-prob 0 under the masked distribution.
  assert np.mean(np.asarray(rollout.logp)[mask] == 0.0) > 0.5
  # The chunked, micro-batched trainer path gives the same masked log-probs.
  graphdef, state = nnx.split(model)
  chunked = jax.jit(lambda s, *a: scoring.score(graphdef, s, *a, temperature=1.3, chunk_size=3,
                                                num_micro_batches=2, grammar=gram))(
    state, rollout.prompt_tokens, rollout.prompt_mask, rollout.completion_tokens,
    rollout.completion_mask)
  np.testing.assert_allclose(np.asarray(chunked.logp), np.asarray(scored.logp), atol=1e-5)
  # Without the grammar the same tokens score lower (mass leaks to illegal tokens).
  free = Sampler(model, max_prompt_len=16, eos_ids=[EOS]).score(
    None, rollout.prompt_tokens, rollout.prompt_mask, rollout.completion_tokens,
    rollout.completion_mask, temperature=1.3)
  assert float(np.asarray(free.logp).sum()) < float(np.asarray(scored.logp).sum()) - 1.0


def test_sharded_grammar_sampling_equals_single_device(model, gram):
  mesh = host.data_mesh(jax.devices()[:4])
  state = jax.device_put(nnx.state(model), NamedSharding(mesh, PartitionSpec()))
  prompts = _prompts() + [[2, 2]]
  kw = dict(n_samples_per_prompt=2, max_new_tokens=16, temperature=1.0, rng=jax.random.key(3))
  single = Sampler(model, max_prompt_len=16, eos_ids=[EOS], grammar=gram).generate(
    None, prompts, **kw)
  sharded = Sampler(model, max_prompt_len=16, eos_ids=[EOS], grammar=gram, mesh=mesh,
                    rules=REPLICATED_RULES).generate(state, prompts, **kw)
  np.testing.assert_array_equal(np.asarray(sharded.completion_tokens),
                                np.asarray(single.completion_tokens))
  np.testing.assert_allclose(np.asarray(sharded.logp), np.asarray(single.logp), atol=1e-5)


def test_sampler_rejects_a_grammar_of_another_vocabulary(model):
  other = grammar.from_slots(CharTokenizer("ab"), [["a"]])
  with pytest.raises(ValueError, match="grammar"):
    Sampler(model, grammar=other)
