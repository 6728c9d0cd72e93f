"""The patch-encoder + CausalLM detector: shapes, causality, cached decoding = teacher forcing."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_post.models import get_model_config
from jaxrl_post.models.perception import Chain, PatchEncoder, PerceptionConfig, PerceptionDetector
from jaxrl_post.tasks import dense_scenes as ds


def _model(seed=0, image_size=16, fourier_features=0, pointer_head=False, conv_stem=False,
           **lm_overrides):
  lm = get_model_config("tiny", vocab_size=ds.VOCAB_SIZE, num_layers=1, **lm_overrides)
  cfg = PerceptionConfig(lm, image_size=image_size, patch_size=8, coord_bins=32, size_bins=8,
                         fourier_features=fourier_features, pointer_head=pointer_head,
                         conv_stem=conv_stem)
  return PerceptionDetector(cfg, rngs=nnx.Rngs(seed))


def _jit(model, fn):
  """`fn(model, *args)` as one compiled program (eager NNX calls are slow on a loaded CPU)."""
  graphdef, state = nnx.split(model)
  compiled = jax.jit(lambda st, *args: fn(nnx.merge(graphdef, st), *args))
  return lambda *args: compiled(state, *args)


def _chain(rng, b, t, cfg):
  tokens = rng.choice([ds.FOUND, ds.COORD, ds.SIZE, ds.END], size=(b, t)).astype(np.int32)
  return Chain(jnp.asarray(tokens), *(jnp.asarray(rng.integers(0, k, (b, t)), jnp.int32)
                                      for k in (cfg.coord_bins, cfg.coord_bins, cfg.size_bins,
                                                cfg.size_bins)))


def test_patch_encoder_order_and_shape_errors():
  model = _model()
  enc = model.encoder
  assert isinstance(enc, PatchEncoder)
  images = jnp.zeros((1, 16, 16, 3)).at[0, 8:, :8].set(1.0)  # Only patch (row 1, col 0) lit.
  base = enc(jnp.zeros((1, 16, 16, 3)))
  out = enc(images)
  changed = np.abs(np.asarray(out - base)).sum(-1)[0] > 1e-6
  assert changed.tolist() == [False, False, True, False]  # Row-major patch 2.
  with pytest.raises(ValueError, match="expected \\[b, 16, 16, 3\\]"):
    enc(jnp.zeros((1, 8, 8, 3)))
  with pytest.raises(ValueError, match="not a multiple of patch_size"):
    PerceptionConfig(get_model_config("tiny"), image_size=20, patch_size=8)


def test_every_parameter_is_built_in_the_configured_dtype():
  model = _model(fourier_features=8, pointer_head=True, conv_stem=True, param_dtype="bfloat16")
  dtypes = {jax.tree_util.keystr(path): leaf.dtype for path, leaf in
            jax.tree_util.tree_leaves_with_path(nnx.state(model, nnx.Param))}
  assert {"ptr_q", "ptr_k", "conv", "proj", "pos_x"} <= {k.split("'")[-2] for k in dtypes}
  assert set(dtypes.values()) == {jnp.dtype(jnp.bfloat16)}, dtypes


@pytest.mark.parametrize("fourier_features", [0, 16])
def test_bins_enter_only_their_tokens(fourier_features):
  model = _model(fourier_features=fourier_features)
  cfg = model.config
  rng = np.random.default_rng(0)
  chain = _chain(rng, 2, 6, cfg)
  emb = model.embed_actions(chain)
  # Changing x bins changes the embedding only at <coord> actions; w bins only at <size>.
  moved = chain._replace(x=(chain.x + 1) % cfg.coord_bins, w=(chain.w + 1) % cfg.size_bins)
  diff = np.abs(np.asarray(model.embed_actions(moved) - emb)).sum(-1) > 0
  tokens = np.asarray(chain.tokens)
  np.testing.assert_array_equal(diff, (tokens == ds.COORD) | (tokens == ds.SIZE))


def test_teacher_forcing_is_causal():
  model = _model()
  rng = np.random.default_rng(1)
  chain = _chain(rng, 1, 6, model.config)
  images = jnp.asarray(rng.uniform(size=(1, 16, 16, 3)), jnp.float32)
  q = jnp.asarray([[ds.COLOUR_QUERY["red"], ds.SHAPE_QUERY["any"]]])
  forward = _jit(model, lambda m, *a: m(*a))
  out = forward(images, q, chain)
  later = chain._replace(tokens=chain.tokens.at[0, 4].set(ds.END), x=chain.x.at[0, 4:].set(0))
  out2 = forward(images, q, later)
  # Logits of actions 0..4 do not see action 4 itself (they are predicted before it).
  for a, b in zip(out, out2):
    np.testing.assert_allclose(a[:, :5], b[:, :5], atol=1e-6)
    assert not np.allclose(a[:, 5], b[:, 5])


@pytest.mark.parametrize("fourier_features,pointer_head,conv_stem",
                         [(0, False, False), (16, False, False), (0, True, True)])
def test_cached_decoding_matches_teacher_forcing(fourier_features, pointer_head, conv_stem):
  model = _model(seed=3, fourier_features=fourier_features, pointer_head=pointer_head,
                 conv_stem=conv_stem)
  rng = np.random.default_rng(2)
  chain = _chain(rng, 2, 5, model.config)
  images = jnp.asarray(rng.uniform(size=(2, 16, 16, 3)), jnp.float32)
  q = jnp.asarray([[6, 11], [7, 12]], jnp.int32)
  full = _jit(model, lambda m, *a: m(*a))(images, q, chain)

  def decode(m, images, q, chain):
    heads, cache = m.prefill(images, q, m.init_cache(2, 5))
    steps = [heads]
    for t in range(4):
      heads, cache = m.decode_step(Chain(*(a[:, t:t + 1] for a in chain)), cache)
      steps.append(heads)
    return jax.tree.map(lambda *xs: jnp.concatenate(xs, axis=1), *steps)

  cached = _jit(model, decode)(images, q, chain)
  for a, b in zip(full, cached):
    np.testing.assert_allclose(a, b, atol=2e-5)


def test_pointer_logits_by_hand_and_validation():
  # 16 px image, 8 px patches: a 2×2 grid, 32 coordinate bins = 16 bins per patch side.
  model = _model(seed=7, pointer_head=True)
  cfg = model.config
  g, r = cfg.grid, cfg.coord_bins // cfg.grid
  rng = np.random.default_rng(3)
  hidden = jnp.asarray(rng.normal(size=(2, 3, cfg.lm.embed_dim)), jnp.float32)
  patches = jnp.asarray(rng.normal(size=(2, g * g, cfg.lm.embed_dim)), jnp.float32)
  px, py = model.pointer_logits(hidden, patches)
  assert px.shape == py.shape == (2, 3, cfg.coord_bins)
  h, v = np.asarray(hidden, np.float64), np.asarray(patches, np.float64)
  wq, wk = np.asarray(model.ptr_q[...]), np.asarray(model.ptr_k[...])
  off = v @ np.asarray(model.ptr_off[...])  # [b, P, 2R]
  for b in range(2):
    for t in range(3):
      score = (h[b, t] @ wq) @ (v[b] @ wk).T / np.sqrt(cfg.lm.embed_dim)  # [P], row-major.
      for k in range(cfg.coord_bins):
        j, u = divmod(k, r)  # x bin k lies in patch column j, offset u.
        ex = [score[i * g + j] + off[b, i * g + j, u] for i in range(g)]
        ey = [score[j * g + c] + off[b, j * g + c, r + u] for c in range(g)]  # y: row j.
        np.testing.assert_allclose(px[b, t, k], np.log(np.sum(np.exp(ex))), rtol=1e-4,
                                   atol=1e-5)
        np.testing.assert_allclose(py[b, t, k], np.log(np.sum(np.exp(ey))), rtol=1e-4,
                                   atol=1e-5)
  # The x/y heads stay normalised categoricals over coord_bins with the pointer term added.
  plain = _model(seed=7)
  images = jnp.asarray(rng.uniform(size=(2, 16, 16, 3)), jnp.float32)
  q = jnp.asarray([[6, 11], [7, 12]], jnp.int32)
  chain = _chain(rng, 2, 4, cfg)
  out, out_plain = model(images, q, chain), plain(images, q, chain)
  assert out.x.shape == out_plain.x.shape == (2, 4, cfg.coord_bins)
  assert not np.allclose(out.x, out_plain.x)  # Same seed, the pointer term is what differs.
  np.testing.assert_allclose(jnp.exp(jax.nn.log_softmax(out.y, -1)).sum(-1), 1.0, rtol=1e-5)
  with pytest.raises(ValueError, match="multiple of the patch grid"):
    PerceptionConfig(get_model_config("tiny", vocab_size=ds.VOCAB_SIZE), image_size=24,
                     patch_size=8, coord_bins=32, pointer_head=True)


def test_pointer_head_points_at_the_scored_patch():
  # A pointer whose score is large only for one patch puts (almost) all x/y mass in that patch's
  # column / row, whatever the linear head says.
  model = _model(seed=8, pointer_head=True)
  cfg = model.config
  d, g, r = cfg.lm.embed_dim, cfg.grid, cfg.coord_bins // cfg.grid
  model.coord_head[...] = jnp.zeros_like(model.coord_head[...])
  model.ptr_q[...] = jnp.eye(d)
  model.ptr_k[...] = jnp.eye(d)
  patches = jnp.zeros((1, g * g, d)).at[0, 2, 0].set(40.0)  # Patch 2 = row 1, column 0.
  hidden = jnp.zeros((1, 1, d)).at[0, 0, 0].set(40.0)
  logits = model.heads(jnp.zeros((1, 1, ds.VOCAB_SIZE)), hidden, patches)
  px = np.exp(np.asarray(jax.nn.log_softmax(logits.x[0, 0])))
  py = np.exp(np.asarray(jax.nn.log_softmax(logits.y[0, 0])))
  assert px[:r].sum() > 0.999 and py[r:2 * r].sum() > 0.999
  with pytest.raises(ValueError, match="needs the patch hidden states"):
    model.heads(jnp.zeros((1, 1, ds.VOCAB_SIZE)), hidden)


def test_conv_stem_mixes_neighbouring_patches():
  images = jnp.zeros((1, 16, 16, 3)).at[0, 8:, :8].set(1.0)  # Only patch (row 1, col 0) lit.
  for conv_stem, expected in ((False, [False, False, True, False]), (True, [True] * 4)):
    enc = _model(conv_stem=conv_stem).encoder
    changed = np.abs(np.asarray(enc(images) - enc(jnp.zeros((1, 16, 16, 3))))).sum(-1)[0] > 1e-6
    assert changed.tolist() == expected
