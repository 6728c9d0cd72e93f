"""The point-cloud LMM: patch layout, prompt rows, gradients into the encoder, regression head."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_post.models import get_model_config
from jaxrl_post.models.point_cloud import PointCloudLM, patchify
from jaxrl_post.sampling import scoring

GRID, PATCH, CHANNELS, VIEWS = 8, 4, 3, 2


@pytest.fixture(scope="module")
def model():
  config = get_model_config("tiny", vocab_size=32, num_layers=1)
  return PointCloudLM(config, num_views=VIEWS, grid=GRID, patch=PATCH, channels=CHANNELS,
                      width=16, depth=1, rngs=nnx.Rngs(0))


def _views(seed, batch=2):
  return jax.random.uniform(jax.random.key(seed), (batch, VIEWS, GRID, GRID, CHANNELS))


def test_patchify_golden_layout():
  # Cell (r, c) of view v holds 100·v + 10·r + c in channel 0; patch (i, j) of view v is token
  # v·4 + i·2 + j and lists its cells row-major.
  v, r, c = np.meshgrid(np.arange(VIEWS), np.arange(GRID), np.arange(GRID), indexing="ij")
  views = np.zeros((1, VIEWS, GRID, GRID, CHANNELS), np.float32)
  views[0, ..., 0] = 100 * v + 10 * r + c
  tokens = np.asarray(patchify(jnp.asarray(views), PATCH))
  assert tokens.shape == (1, VIEWS * 4, PATCH * PATCH * CHANNELS)
  token = tokens[0, 1 * 4 + 1 * 2 + 0].reshape(PATCH, PATCH, CHANNELS)[..., 0]  # view 1, (1, 0)
  expected = 100 + 10 * np.arange(4, 8)[:, None] + np.arange(0, 4)[None, :]
  np.testing.assert_array_equal(token, expected)
  with pytest.raises(ValueError, match="do not split into 3×3"):
    patchify(jnp.asarray(views), 3)


def test_prompt_row_is_visual_tokens_then_text(model):
  text = jnp.asarray([[3, 4, 5], [6, 7, 8]], jnp.int32)
  row = model.prompt_embeddings(_views(0), text)
  t_v = model.num_visual_tokens
  assert t_v == VIEWS * (GRID // PATCH) ** 2 and row.shape == (2, t_v + 3, 64)
  np.testing.assert_array_equal(np.asarray(row[:, t_v:]), np.asarray(model.lm.embed_tokens(text)))
  other = model.prompt_embeddings(_views(1), text)
  assert not np.allclose(np.asarray(row[:, :t_v]), np.asarray(other[:, :t_v]))
  # Rows are independent: the first row does not depend on the second row's views.
  mixed = jnp.concatenate([_views(0)[:1], _views(1)[1:]])
  np.testing.assert_allclose(np.asarray(model.prompt_embeddings(mixed, text)[0]),
                             np.asarray(row[0]), atol=1e-6)


def test_completion_logp_gradients_reach_the_encoder(model):
  graphdef, params = nnx.split(model, nnx.Param)
  text = jnp.asarray([[3, 4]], jnp.int32)
  completion = jnp.asarray([[5, 6, 7]], jnp.int32)
  mask = jnp.ones((1, 3), jnp.bool_)
  views = _views(2, batch=1)

  def logp(params):
    m = nnx.merge(graphdef, params)
    row = m.prompt_embeddings(views, text)
    tokens = jnp.zeros(row.shape[:2], jnp.int32)
    out = scoring.score_model(m.lm, tokens, jnp.ones(row.shape[:2], jnp.bool_), completion, mask,
                              prompt_embeddings=row)
    return jnp.sum(out.logp)

  grads = jax.jit(jax.grad(logp))(params)
  assert float(jnp.linalg.norm(grads["encoder"]["embed"][...])) > 0
  assert float(jnp.linalg.norm(grads["proj"][...])) > 0
  # The regression head is not on this path.
  assert float(jnp.abs(grads["head"][...]).max()) == 0.0


def test_regression_head_starts_at_half_and_trains(model):
  text = jnp.asarray([[3, 4], [3, 4]], jnp.int32)
  pred = model.regress(_views(0), text)
  # The head's weights start at zero and its bias at 0.5 (the middle of the normalised MOS).
  np.testing.assert_allclose(np.asarray(pred), [0.5, 0.5])
  graphdef, params = nnx.split(model, nnx.Param)

  def loss(params):
    pred = nnx.merge(graphdef, params).regress(_views(0), text)
    return jnp.sum((pred - jnp.asarray([0.0, 1.0])) ** 2)

  grads = jax.jit(jax.grad(loss))(params)
  # Zero head weights: at the first step only the head receives gradient; it must be non-zero.
  assert float(jnp.linalg.norm(grads["head"][...])) > 0
