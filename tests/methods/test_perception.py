"""Perception (arXiv 2608.18881): chains and the decode loop (sampling.detection), multi-head
log-probs, SFT / GRPO losses (losses.perception), count rewards, the method's evaluation."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxrl_post.losses.perception import GRPOAux, HeadLogProbs, clip_cov_keep, detection_sft_loss
from jaxrl_post.methods import perception as method
from jaxrl_post.models import get_model_config
from jaxrl_post.models.perception import Chain, HeadLogits, PerceptionConfig, PerceptionDetector
from jaxrl_post.rewards.set_matching import count_rewards
from jaxrl_post.sampling import detection as perc
from jaxrl_post.tasks import dense_scenes as ds
from jaxrl_post.training.train_state import create_train_state, make_train_step

BINS = perc.BinSpec(coord_bins=32, size_bins=8, image_size=16)
F, N, C, S, E = ds.FOUND, ds.NONE, ds.COORD, ds.SIZE, ds.END


def _model(seed=0):
  lm = get_model_config("tiny", vocab_size=ds.VOCAB_SIZE, num_layers=1)
  cfg = PerceptionConfig(lm, image_size=16, patch_size=8, coord_bins=32, size_bins=8)
  return PerceptionDetector(cfg, rngs=nnx.Rngs(seed))


def _scenes(n, seed=0, positive=None):
  task = ds.DenseSceneTask(seed=seed, image_size=16, max_size=8, count_buckets=((1, 3),),
                           bucket_weights=(1.0,), max_distractors=2)
  return task.batch("train", range(n), positive=positive)


# ---- chains ----


def test_encode_chain_golden_and_roundtrip():
  # Two boxes in pixels (16 px image): centre (4, 2.5) size 2×3 and centre (1.5, 8) size 3×4.
  boxes = np.array([[4, 2.5, 2, 3], [1.5, 8, 3, 4]]) / 16
  chain, mask = perc.encode_chain(boxes, BINS, max_instances=3)
  assert chain[0].tolist() == [F, C, S, C, S, E, 0, 0]
  # x, y bins = centre·32/16 (half pixels); w, h bins = pixels − 1.
  assert chain[1:3, 1].tolist() == [8, 5] and chain[1:3, 3].tolist() == [3, 16]
  assert chain[3:, 2].tolist() == [1, 2] and chain[3:, 4].tolist() == [2, 3]
  assert mask.tolist() == [True] * 6 + [False] * 2
  decoded, stats = perc.decode_chain(*chain, BINS, mask.sum())
  np.testing.assert_allclose(decoded, boxes)
  assert stats == perc.DecodeStats()
  none, mask = perc.encode_chain(np.zeros((0, 4)), BINS, 3)
  assert none[0].tolist()[:2] == [N, 0] and mask.sum() == 1
  # Over the cap: truncated, no <end>.
  many, mask = perc.encode_chain(np.tile(boxes, (3, 1)), BINS, 2)
  assert many[0].tolist() == [F, C, S, C, S, 0] and mask.sum() == 5


def _decode(tokens, xs=None):
  t = len(tokens)
  xs = np.arange(t) if xs is None else xs
  return perc.decode_chain(np.array(tokens), xs, xs, np.ones(t, int), np.ones(t, int), BINS)


@pytest.mark.parametrize("tokens,n_boxes,expected", [
  ([F, C, S, E], 1, {}),
  ([N], 0, {}),
  ([N, C, S, E], 0, dict(contradiction=1)),
  ([C, S, E], 1, dict(missing_existence=1)),
  ([F, C, C, S, E], 1, dict(coord_without_size=1)),
  ([F, S, C, S, E], 1, dict(size_without_coord=1)),
  ([F, C, S, F, 9, 0, C, S, E], 2, dict(stray_tokens=3)),
  ([F, C, S, C], 1, dict(coord_without_size=1, truncated=1)),
  ([F, C, S, C, S], 2, dict(truncated=1)),
  ([], 0, dict(missing_existence=1, truncated=1)),
  ([E, E], 0, dict(missing_existence=1)),
  ([F, C, E, S], 0, dict(coord_without_size=1)),
])
def test_decode_malformed_chains_counts_never_raises(tokens, n_boxes, expected):
  boxes, stats = _decode(tokens)
  assert boxes.shape == (n_boxes, 4)
  assert stats._asdict() == {**perc.DecodeStats()._asdict(), **expected}
  assert stats.malformed == sum(v for k, v in expected.items() if k != "truncated")


def test_decode_random_garbage_never_raises():
  rng = np.random.default_rng(0)
  for _ in range(200):
    t = int(rng.integers(0, 30))
    arrays = [rng.integers(-3, 300, t) for _ in range(5)]
    boxes, stats = perc.decode_chain(*arrays, BINS)
    # Out-of-range bins still give finite boxes (the reward treats any box as a box).
    assert boxes.shape[1] == 4 and np.isfinite(boxes).all()
    assert isinstance(stats.malformed, int) and stats.malformed >= 0


# ---- multi-head log-probs ----


def _random_logits(rng, b, t):
  def z(k):
    return jnp.asarray(rng.normal(size=(b, t, k)), jnp.float32)
  return HeadLogits(lm=z(ds.VOCAB_SIZE), x=z(32), y=z(32), w=z(8), h=z(8))


def _log_softmax(z):
  z = np.asarray(z, np.float64)
  z = z - z.max(-1, keepdims=True)
  return z - np.log(np.exp(z).sum(-1, keepdims=True))


def test_chain_logprobs_composition_by_hand():
  rng = np.random.default_rng(0)
  logits = _random_logits(rng, 1, 5)
  chain = Chain(jnp.array([[F, C, S, E, 0]]), jnp.array([[3, 7, 1, 2, 0]]),
                jnp.array([[4, 9, 0, 5, 0]]), jnp.array([[1, 2, 6, 0, 0]]),
                jnp.array([[0, 5, 3, 1, 0]]))
  mask = jnp.array([[1, 1, 1, 1, 0]], bool)
  tau = 0.7
  lp = jax.jit(lambda lg: perc.chain_logprobs(lg, chain, mask, temperature=tau))(logits)
  lm = _log_softmax(np.asarray(logits.lm[0]) / tau)
  x = _log_softmax(np.asarray(logits.x[0]) / tau)
  y = _log_softmax(np.asarray(logits.y[0]) / tau)
  w = _log_softmax(np.asarray(logits.w[0]))
  h = _log_softmax(np.asarray(logits.h[0]))
  # log π(a_t) = log π_LM(w_t) + 1[<coord>]·(log π_x + log π_y) + 1[<size>]·(log π_w + log π_h).
  expected_lm = [lm[0, F], lm[1, C], lm[2, S], lm[3, E], 0.0]
  expected_coord = [0.0, x[1, 7] + y[1, 9], 0.0, 0.0, 0.0]
  expected_size = [0.0, 0.0, w[2, 6] + h[2, 3], 0.0, 0.0]
  np.testing.assert_allclose(lp.lm[0], expected_lm, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(lp.coord[0], expected_coord, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(lp.size[0], expected_size, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(lp.total[0], np.add(np.add(expected_lm, expected_coord),
                                                 expected_size), rtol=1e-5, atol=1e-6)
  assert lp.existence[0].tolist() == [True, False, False, False, False]


def test_detached_existence_tokens_get_zero_gradient():
  rng = np.random.default_rng(1)
  logits = _random_logits(rng, 1, 4)
  chain = Chain(jnp.array([[F, C, S, E]]), *[jnp.zeros((1, 4), jnp.int32)] * 4)
  mask = jnp.ones((1, 4), bool)

  def grad_lm(detach):
    f = lambda z: jnp.sum(perc.chain_logprobs(logits._replace(lm=z), chain, mask,  # noqa: E731
                                              detach_existence=detach).lm)
    return np.abs(np.asarray(jax.jit(jax.grad(f))(logits.lm))[0]).sum(-1)

  on, off = grad_lm(True), grad_lm(False)
  assert on[0] == 0.0 and off[0] > 0.1
  np.testing.assert_allclose(on[1:], off[1:])


# ---- Clip-Cov ----


def test_clip_cov_selects_only_inside_bounds():
  logp = jnp.array([[-1.0, -5.0, -9.0, -2.0, -4.0, -3.0]])
  adv = jnp.array([[1.0, -1.0, -2.0, 1.0, 2.0, 0.0]])
  active = jnp.array([[True, True, True, True, True, False]])
  # Means over active: logp −4.2, adv 0.2 → Cov = [2.56, 0.96, 10.56, 1.76, 0.36, ·].
  keep = clip_cov_keep(logp, adv, active, jax.random.key(0), ratio=0.5, low=1.0, high=5.0)
  dropped = np.flatnonzero(np.asarray(keep[0]) == 0)
  # ⌊0.5·5⌋ = 2 of the eligible tokens {0, 3}.
  assert sorted(dropped.tolist()) == [0, 3]
  keep = clip_cov_keep(logp, adv, active, jax.random.key(1), ratio=1e-4, low=1.0, high=5.0)
  dropped = np.flatnonzero(np.asarray(keep[0]) == 0)
  assert len(dropped) == 1 and dropped[0] in (0, 3)  # max(⌊ratio·N⌋, 1) = 1.
  keep = clip_cov_keep(logp, adv, active, jax.random.key(1), ratio=0.5, low=20.0, high=50.0)
  assert np.asarray(keep).min() == 1.0


# ---- losses on the model ----


def _grpo_batch(model, scenes, g=4, seed=0):
  sampler = perc.DetectionSampler(nnx.split(model)[0], perc.chain_length(3), temperature=1.0)
  images = np.repeat(np.stack([s.image for s in scenes]), g, axis=0)
  queries = np.repeat(np.stack([s.query.tokens for s in scenes]), g, axis=0)
  rollout = jax.device_get(sampler(nnx.state(model, nnx.Param), images, queries,
                                   jax.random.key(seed)))
  adv = np.linspace(-1.0, 1.0, images.shape[0]).astype(np.float32)
  return rollout, dict(images=images, queries=queries, chain=np.stack(rollout.chain, axis=1),
                       mask=rollout.mask, rollout_logp=rollout.logp, adv=adv,
                       num_sequences=np.float32(images.shape[0]),
                       clip_cov_step=np.int32(0))


def test_rollout_logp_matches_teacher_forcing_and_grpo_loss_by_hand():
  model = _model(seed=2)
  scenes = _scenes(2, positive=True)
  rollout, batch = _grpo_batch(model, scenes)
  mask = np.asarray(rollout.mask)
  # The mask covers actions up to the first <end>/<none>; padding after it.
  for row, m in zip(np.asarray(rollout.chain.tokens), mask):
    n = m.sum()
    assert not m[n:].any()
    if n < m.size:
      assert row[n - 1] in (ds.END, ds.NONE)
  max_tokens = perc.chain_length(3)
  loss_fn = jax.jit(lambda mdl, b: method.grpo_loss(mdl, b, max_tokens=max_tokens,
                                                    clip_cov=False))
  loss, aux = loss_fn(model, batch)
  # The sampler (cached decode) and the trainer (teacher forcing) agree up to float noise: IS ≈ 1.
  assert float(aux["logp_mismatch"]) < 1e-4
  np.testing.assert_allclose(float(aux["is_weight_mean"]), 1.0, atol=1e-3)
  # Loss by hand: −Σ A_i·(lm + coord) over valid non-existence... (existence detached only in the
  # gradient, its value stays) / (B·T_max).
  chain = Chain(*jnp.moveaxis(batch["chain"], 1, 0))
  lp = perc.chain_logprobs(model(batch["images"], batch["queries"], chain), chain, mask)
  expected = -np.sum(batch["adv"][:, None] * np.asarray(lp.lm + lp.coord)) / (8 * max_tokens)
  np.testing.assert_allclose(float(loss), expected, rtol=1e-4)


def test_grpo_step_has_nonzero_gradient_and_no_size_head_gradient():
  model = _model(seed=4)
  _, batch = _grpo_batch(model, _scenes(2, positive=True))

  def loss(params):
    m = nnx.merge(nnx.split(model)[0], params)
    return method.grpo_loss(m, batch, max_tokens=8)[0]

  grads = jax.jit(jax.grad(loss))(nnx.state(model, nnx.Param))
  assert float(optax.tree.norm(grads)) > 0
  assert float(jnp.abs(grads["coord_head"][...]).sum()) > 0
  # The size head is decoded greedily and carries no gradient (arXiv 2608.18881).
  assert float(jnp.abs(grads["size_head"][...]).sum()) == 0.0


def test_sft_step_lowers_loss_without_recompiling():
  model = _model(seed=5)
  optimizer = optax.adam(3e-3)
  state = create_train_state(model, optimizer, jax.random.key(0))
  step = make_train_step(nnx.split(model)[0], method.sft_loss, optimizer, shared=("num_tokens",))
  batch = method.sft_batch(_scenes(8), BINS, max_instances=3)
  losses = []
  for _ in range(6):
    state, metrics = step(state, batch)
    losses.append(float(metrics["loss"]))
  assert losses[-1] < losses[0] - 0.2, losses
  assert step._cache_size() == 1
  assert {"nll_lm", "nll_coord", "nll_size"} <= set(metrics)


def test_greedy_sampler_is_deterministic_and_predict_decodes():
  model = _model(seed=6)
  sampler = perc.DetectionSampler(nnx.split(model)[0], perc.chain_length(4), temperature=0.0)
  scenes = _scenes(5)
  params = nnx.state(model, nnx.Param)
  a, stats_a = method.predict(sampler, params, scenes, BINS, batch_size=4)
  b, _ = method.predict(sampler, params, scenes, BINS, batch_size=4, rng=jax.random.key(9))
  assert len(a) == 5 and len(stats_a) == 5
  for x, y in zip(a, b):
    np.testing.assert_array_equal(x, y)


# ---- evaluation ----


def test_evaluate_predictions_perfect_duplicates_and_negatives():
  scenes = ds.count_eval_set(0, 1, buckets=((0, 0), (1, 10), (11, 50)), negatives=2)
  gts = [s.boxes.astype(np.float64) for s in scenes]
  stats = [perc.DecodeStats()] * len(scenes)
  perfect = method.evaluate_predictions(gts, scenes, stats)
  assert perfect["f1@0.5"] == 1.0 and perfect["f1"] == 1.0 and perfect["redundancy"] == 0.0
  assert perfect["mcc"] == 1.0 and perfect["negative_accuracy"] == 1.0
  assert perfect["f1@0.5/1-10"] == 1.0 and perfect["count_ratio"] == 1.0
  doubled = [np.concatenate([g, g]) for g in gts]
  dup = method.evaluate_predictions(doubled, scenes, stats)
  # Every box twice: F1 = 2·1/(2·1 + 1) = 2/3 raw, 1 after NMS; half the boxes are redundant.
  np.testing.assert_allclose(dup["f1@0.5"], 2 / 3)
  assert dup["nms_f1@0.5"] == 1.0 and dup["redundancy"] == 0.5


def test_count_rewards_match_set_matching():
  gt = [np.array([[0.25, 0.25, 0.2, 0.2], [0.75, 0.75, 0.2, 0.2]])]
  pred = [np.array([[0.25, 0.25, 0.2, 0.2]] * 3)]
  np.testing.assert_allclose(count_rewards(pred, gt), [-1.6])  # −(1 + 0.3·2)
  np.testing.assert_allclose(count_rewards(pred, gt, kind="f1"), [0.4])  # 2/(2+2+1)
  with pytest.raises(KeyError):
    count_rewards(pred, gt, kind="nope")


# ---- the pure losses ----


def test_sft_loss_is_the_sum_of_the_head_nlls_and_grpo_aux_declares_its_additive_fields():
  rng = np.random.default_rng(3)
  lp = HeadLogProbs(*(jnp.asarray(-rng.random((2, 4)), jnp.float32) for _ in range(3)),
                    existence=jnp.zeros((2, 4), bool))
  mask = jnp.array([[1, 1, 1, 0], [1, 1, 0, 0]], bool)
  loss, aux = detection_sft_loss(lp, mask, jnp.float32(5.0))
  expected = -float(np.sum(np.where(mask, np.asarray(lp.total), 0.0))) / 5
  np.testing.assert_allclose(float(loss), expected, rtol=1e-6)
  np.testing.assert_allclose(float(sum(aux.values())), float(loss), rtol=1e-6)
  # Only the loss term adds up over micro-batches; the rest are the call's own means / maxima.
  assert GRPOAux.ADDITIVE == ("pg_loss",)
  aux = GRPOAux(*(jnp.float32(i) for i in range(len(GRPOAux._fields))))
  assert aux.additive() == {"pg_loss": 0.0}
