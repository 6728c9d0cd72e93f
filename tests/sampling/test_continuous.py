"""Continuous batching: the rows of static `generate`, whatever slot and moment they got."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxrl_post import parallel
from jaxrl_post.models import CausalLM, stack_layer_params
from jaxrl_post.models.transformer import slice_slots, update_slots
from jaxrl_post.parallel import host
from jaxrl_post.parallel.mesh import REPLICATED_RULES
from jaxrl_post.sampling import FINISH_EOS, FINISH_LENGTH, FINISH_STOP, Sampler, continuous
from jaxrl_post.sampling.sampler import jitted_continuous

VOCAB = 32
EOS, STOP = 2, 7


@pytest.fixture(scope="module")
def sampler(model):
  # One batch bucket: every prompt count below shares one compiled program.
  return Sampler(model, max_prompt_len=32, eos_ids=[EOS], batch_buckets=(8,))


# 6 prompts × 3 samples = 18 queued rows for 4 slots.
PROMPTS = [[3, 4, 5], [7, 8, 9, 10, 11, 12, 13], [1], [5, 6], [9, 9, 9, 9], [20, 21]]
# One set of static arguments for most tests, so that they share compilations.
KW = dict(n_samples_per_prompt=3, max_new_tokens=20, stop_tokens=[STOP], temperature=0.8,
          top_k=20, num_logprobs=3)
SLOTS = dict(num_slots=4, admit_size=2)


def _assert_same_rollout(got, want):
  for name in ("prompt_tokens", "prompt_mask", "completion_tokens", "completion_mask",
               "finish_reason", "group_ids", "topk_ids"):
    a, b = getattr(got, name), getattr(want, name)
    assert (a is None) == (b is None), name
    if a is not None:
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=name)
  np.testing.assert_allclose(np.asarray(got.logp), np.asarray(want.logp), atol=1e-5)
  if want.topk_logp is not None:
    np.testing.assert_allclose(np.asarray(got.topk_logp), np.asarray(want.topk_logp), atol=1e-5)


@pytest.mark.parametrize("greedy", [False, True], ids=["sampled", "greedy"])
def test_rows_equal_static_generate_whatever_slot_they_got(sampler, greedy):
  kw = dict(KW, greedy=greedy, rng=jax.random.key(3))
  want = sampler.generate(None, PROMPTS, **kw)
  got, stats = sampler.generate_continuous(None, PROMPTS, **SLOTS, return_stats=True, **kw)
  _assert_same_rollout(got, want)
  # The rows ended in every way, at many lengths: the queue really moved.
  assert set(np.asarray(want.finish_reason).tolist()) == {FINISH_EOS, FINISH_LENGTH, FINISH_STOP}
  assert len(set(np.asarray(want.lengths).tolist())) >= 4
  slot, start = np.asarray(stats["slot"]), np.asarray(stats["start_step"])
  assert set(slot.tolist()) == {0, 1, 2, 3}  # 18 rows went through 4 slots
  # Rows entered after others had ended, into the slots those freed.
  assert (start > 0).sum() >= 10
  # A group whose samples decoded in different slots and entered at different steps.
  groups = np.asarray(got.group_ids)
  assert any(len(set(slot[groups == g])) > 1 and len(set(start[groups == g])) > 1
             for g in range(len(PROMPTS)))
  # Steps follow the tokens: the slots were mostly busy.
  tokens = int(np.asarray(got.lengths).sum())
  assert tokens <= 4 * int(stats["steps"]) < 2 * tokens
  # The recorded log-probs (and top-K) are the trainer's.
  scored = sampler.score(None, got.prompt_tokens, got.prompt_mask, got.completion_tokens,
                         got.completion_mask, temperature=0.8, top_k=3)
  mask = np.asarray(got.completion_mask)
  np.testing.assert_allclose(np.asarray(got.logp)[mask], np.asarray(scored.logp)[mask], atol=1e-5)
  np.testing.assert_allclose(np.asarray(got.topk_logp)[mask],
                             np.asarray(scored.topk_logp)[mask], atol=1e-5)


def test_fewer_rows_than_slots(sampler):
  kw = dict(KW, rng=jax.random.key(5))
  got = sampler.generate_continuous(None, PROMPTS[:1], **SLOTS, **kw)  # 3 rows, 4 slots
  _assert_same_rollout(got, sampler.generate(None, PROMPTS[:1], **kw))


def test_no_recompilation_while_the_queue_drains(sampler):
  sampler.generate_continuous(None, PROMPTS[:2], **SLOTS, **KW, rng=jax.random.key(0))
  compiled = jitted_continuous._cache_size()
  # Longer queues (up to 24 rows for 4 slots), other values of the traced arguments.
  longer = PROMPTS + [[4, 4], [6]]
  rollout = sampler.generate_continuous(None, longer, **SLOTS, **dict(KW, temperature=0.5),
                                        top_p=0.9, rng=jax.random.key(1))
  sampler.generate_continuous(None, PROMPTS[:5], **SLOTS, **dict(KW, stop_tokens=[]),
                              rng=jax.random.key(2))
  assert jitted_continuous._cache_size() == compiled
  assert rollout.batch_size == 3 * len(longer)


def test_scanned_model_stacked_cache(model):
  config = model.config.replace(scan_layers=True)
  graphdef = nnx.split(nnx.eval_shape(lambda: CausalLM(config, rngs=nnx.Rngs(0))))[0]
  scanned = nnx.merge(graphdef, stack_layer_params(nnx.state(model)))
  kw = dict(KW, rng=jax.random.key(6))
  want = Sampler(model, max_prompt_len=32, eos_ids=[EOS]).generate(None, PROMPTS, **kw)
  got = Sampler(scanned, max_prompt_len=32, eos_ids=[EOS]).generate_continuous(
    None, PROMPTS, **SLOTS, **kw)
  _assert_same_rollout(got, want)


def test_bad_arguments(model, sampler):
  with pytest.raises(ValueError, match="num_slots must be ≥ 1, got 0"):
    sampler.generate_continuous(None, PROMPTS, num_slots=0, greedy=True)
  for admit_size in (0, 5):
    with pytest.raises(ValueError, match=r"admit_size must be in \[1, num_slots=4\]"):
      sampler.generate_continuous(None, PROMPTS, num_slots=4, admit_size=admit_size, greedy=True)
  with pytest.raises(ValueError, match="n_samples_per_prompt must be ≥ 1"):
    sampler.generate_continuous(None, PROMPTS, num_slots=4, n_samples_per_prompt=0, greedy=True)
  with pytest.raises(ValueError, match="max_new_tokens must be ≥ 1"):
    sampler.generate_continuous(None, PROMPTS, num_slots=4, max_new_tokens=0, greedy=True)
  with pytest.raises(ValueError, match="needs an rng key"):
    sampler.generate_continuous(None, PROMPTS, num_slots=4)
  with pytest.raises(ValueError, match="empty prompt list"):
    sampler.generate_continuous(None, [], num_slots=4, greedy=True)
  data_parallel = Sampler(model, max_prompt_len=32, mesh=host.data_mesh(jax.devices()[:2]),
                          rules=REPLICATED_RULES)
  for slots in (dict(num_slots=3), dict(num_slots=4, admit_size=3)):
    with pytest.raises(ValueError, match="over 2 devices each device decodes num_slots / 2"):
      data_parallel.generate_continuous(None, PROMPTS, **slots, greedy=True)


def test_data_parallel_mesh_runs_one_queue_per_device_with_the_same_rollout(model, sampler):
  mesh = host.data_mesh(jax.devices()[:2])
  state = jax.device_put(nnx.state(model), NamedSharding(mesh, PartitionSpec()))
  kw = dict(KW, rng=jax.random.key(9))
  want = sampler.generate(None, PROMPTS, **kw)
  data_parallel = Sampler(model, max_prompt_len=32, eos_ids=[EOS], batch_buckets=(8,),
                          mesh=mesh, rules=REPLICATED_RULES)
  got, stats = data_parallel.generate_continuous(state, PROMPTS, **SLOTS, **kw,
                                                 return_stats=True)
  _assert_same_rollout(got, want)
  # Device 0 holds prompts 0-3 (rows 0-11) and slots 0-1, device 1 the rest.
  slot = np.asarray(stats["slot"])
  assert set(slot[:12].tolist()) == {0, 1} and set(slot[12:].tolist()) == {2, 3}


def test_other_meshes_run_one_partitioned_program(model, sampler):
  mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 2, 2), ("data", "fsdp", "tensor"))
  state = jax.device_put(nnx.state(model), parallel.state_shardings(nnx.state(model), mesh))
  kw = dict(KW, rng=jax.random.key(10))
  sharded = Sampler(model, max_prompt_len=32, eos_ids=[EOS], batch_buckets=(8,), mesh=mesh)
  _assert_same_rollout(sharded.generate_continuous(state, PROMPTS, **SLOTS, **kw),
                       sampler.generate(None, PROMPTS, **kw))


def _live_per_class(stats, rollout, row_class, num_classes):
  """The most rows of each class that decoded at once (from each row's entry step and length)."""
  start = np.asarray(stats["start_step"])
  end = start + np.asarray(rollout.lengths)
  live = np.zeros((int(end.max()) + 1, num_classes), np.int64)
  for s, e, c in zip(start, end, row_class):
    live[s:e, c] += 1
  return live.max(axis=0)


def test_class_caps_hold_a_class_to_its_slots_and_keep_every_row(sampler):
  # Prompts 0-2 are class 0 (9 rows), 3-5 class 1: at most 1 slot for class 0, 3 for class 1.
  classes, caps = [0, 0, 0, 1, 1, 1], [1, 3]
  kw = dict(KW, rng=jax.random.key(3))
  want, fifo = sampler.generate_continuous(None, PROMPTS, **SLOTS, return_stats=True, **kw)
  got, stats = sampler.generate_continuous(None, PROMPTS, **SLOTS, return_stats=True, **kw,
                                           prompt_classes=classes, class_caps=caps)
  _assert_same_rollout(got, want)  # each row keeps its key: same tokens, other moments
  row_class = np.repeat(classes, 3)
  assert _live_per_class(stats, got, row_class, 2).tolist() == [1, 3]
  assert _live_per_class(fifo, want, row_class, 2)[0] > 1  # without caps class 0 took more
  # Held class-0 rows were passed by class-1 rows queued after them.
  start = np.asarray(stats["start_step"])
  assert start[row_class == 1].mean() < start[row_class == 0].mean()
  # Caps at the slot count are first come, first served: the same schedule as no caps.
  _, loose = sampler.generate_continuous(None, PROMPTS, **SLOTS, return_stats=True, **kw,
                                         prompt_classes=classes, class_caps=[4, 4])
  for key in ("slot", "start_step"):
    np.testing.assert_array_equal(np.asarray(loose[key]), np.asarray(fifo[key]), err_msg=key)


def test_class_caps_bad_arguments(sampler):
  kw = dict(num_slots=4, greedy=True)
  with pytest.raises(ValueError, match="prompt_classes and class_caps go together"):
    sampler.generate_continuous(None, PROMPTS, prompt_classes=[0] * 6, **kw)
  with pytest.raises(ValueError, match="one cap >= 1 per class"):
    sampler.generate_continuous(None, PROMPTS, prompt_classes=[0] * 6, class_caps=[0], **kw)
  with pytest.raises(ValueError, match=r"one class per prompt \(6,\)"):
    sampler.generate_continuous(None, PROMPTS, prompt_classes=[0] * 5, class_caps=[1], **kw)
  with pytest.raises(ValueError, match=r"prompt_classes must be in \[0, 2\)"):
    sampler.generate_continuous(None, PROMPTS, prompt_classes=[0, 1, 2, 0, 0, 0],
                                class_caps=[1, 1], **kw)


def test_class_caps_per_device_under_data_parallelism(model, sampler):
  mesh = host.data_mesh(jax.devices()[:2])
  state = jax.device_put(nnx.state(model), NamedSharding(mesh, PartitionSpec()))
  kw = dict(KW, rng=jax.random.key(9))
  data_parallel = Sampler(model, max_prompt_len=32, eos_ids=[EOS], batch_buckets=(8,),
                          mesh=mesh, rules=REPLICATED_RULES)
  classes = [0, 1, 0, 1, 0, 1]
  got, stats = data_parallel.generate_continuous(state, PROMPTS, **SLOTS, **kw,
                                                 return_stats=True, prompt_classes=classes,
                                                 class_caps=[2, 2])
  _assert_same_rollout(got, sampler.generate(None, PROMPTS, **kw))
  # Each device has 2 slots and applies ⌈2 / 2⌉ = 1 per class: one row of each at a time.
  row_class = np.repeat(classes, 3)
  for rows in (slice(0, 12), slice(12, 18)):
    sub = {k: np.asarray(stats[k])[rows] for k in ("start_step",)}
    lengths = np.asarray(got.lengths)[rows]
    start, end = sub["start_step"], sub["start_step"] + lengths
    for c in (0, 1):
      steps = [(s, e) for s, e, k in zip(start, end, row_class[rows]) if k == c]
      assert all(not (a[0] < b[1] and b[0] < a[1]) for i, a in enumerate(steps)
                 for b in steps[i + 1:]), c  # never two rows of a class at once


def test_cache_lengths_end_at_the_full_cache():
  assert continuous.cache_lengths(16, 1) == [17]
  lengths = continuous.cache_lengths(64, 1024)
  assert lengths[-1] == 64 + 1024 and lengths == sorted(lengths) and len(lengths) == 8


# ---- The public phases of `generate` ----


def test_public_phases_compose_to_generate(sampler):
  kw = dict(KW, rng=jax.random.key(7))
  n, t = kw.pop("n_samples_per_prompt"), kw.pop("max_new_tokens")
  want = sampler.generate(None, PROMPTS, n_samples_per_prompt=n, max_new_tokens=t, **kw)
  batch = sampler.prepare(PROMPTS)
  assert batch.num_prompts == len(PROMPTS) and batch.tokens.shape == (8, 16)
  start = sampler.prefill(None, batch, max_new_tokens=t, n_samples_per_prompt=n)
  assert start.max_new_tokens == t
  out = sampler.decode(None, start, **kw)
  assert out.tokens.shape == (8 * n, t)  # the whole batch bucket, filler rows too
  _assert_same_rollout(sampler.make_rollout(batch, out, n_samples_per_prompt=n), want)


# ---- Per-row write indices of the KV cache ----


def test_per_row_cache_index_decodes_rows_at_their_own_slots(model):
  # Row 0 holds a 5-token prompt, row 1 a 3-token one, both from slot 0: with
  # one write index per row each decodes its next token at its own slot, as
  # it would alone.
  run = nnx.jit(lambda model, tokens, **kw: model(tokens, **kw))  # eager ops compile one by one
  prompts = [[3, 4, 5, 6, 8], [9, 10, 11]]
  cache = model.init_cache(2, 8)
  alone = []
  for r, prompt in enumerate(prompts):
    tokens = jnp.asarray([prompt + [0] * (5 - len(prompt))])
    mask = jnp.asarray([[True] * len(prompt) + [False] * (5 - len(prompt))])
    _, one = run(model, tokens, positions=jnp.arange(5)[None], attention_mask=mask,
                 cache=model.init_cache(1, 8))
    cache = cache.replace(k=jax.tree.map(lambda c, x, r=r: c.at[r].set(x[0]), cache.k, one.k),
                          v=jax.tree.map(lambda c, x, r=r: c.at[r].set(x[0]), cache.v, one.v),
                          mask=cache.mask.at[r].set(one.mask[0]))
    step, _ = run(model, jnp.asarray([[12]]), positions=jnp.asarray([[len(prompt)]]),
                  cache=one.replace(index=jnp.int32(len(prompt))))
    alone.append(step[0, 0])
  cache = cache.replace(index=jnp.asarray([5, 3], jnp.int32))
  logits, cache = run(model, jnp.asarray([[12], [12]]), positions=jnp.asarray([[5], [3]]),
                      cache=cache)
  np.testing.assert_allclose(np.asarray(logits[:, 0]), np.asarray(jnp.stack(alone)), atol=1e-5)
  np.testing.assert_array_equal(np.asarray(cache.index), [6, 4])
  np.testing.assert_array_equal(np.asarray(cache.mask),
                                [[1, 1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 0, 0, 0, 0]])


def test_update_and_slice_slots_per_row():
  buffer = jnp.zeros((2, 3, 6))
  update = jnp.ones((2, 3, 2))
  out = update_slots(buffer, update, jnp.asarray([1, 4]), slot_axis=2)
  assert out[0, :, 1:3].sum() == 6 and out[1, :, 4:6].sum() == 6 and out.sum() == 12
  np.testing.assert_array_equal(slice_slots(out, jnp.asarray([1, 4]), 2, slot_axis=2), update)
  # Stacked layout: rows on axis 1, a layer offset on axis 0.
  stacked = update_slots(jnp.zeros((2, 2, 3, 6)), update[None], jnp.asarray([0, 3]), slot_axis=3,
                         row_axis=1, start=(1, 0, 0, 0))
  assert stacked[0].sum() == 0 and stacked[1, 0, :, 0:2].sum() == 6
  assert stacked[1, 1, :, 3:5].sum() == 6
