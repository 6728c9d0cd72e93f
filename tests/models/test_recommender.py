"""models.recommender (GRU against numpy, heads' shapes, sharded == single device) and the
simulator of tasks.recommender_log (funnel probabilities, logs, NDCG by hand)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_post import parallel
from jaxrl_post.methods import progressive_recsys as prs
from jaxrl_post.models.recommender import RecommenderFM
from jaxrl_post.parallel import axes
from jaxrl_post.parallel.mesh import init_sharded
from jaxrl_post.tasks import recommender_log as rl

NUM_ITEMS, DIM = 12, 8


@pytest.fixture(scope="module")
def world():
  return rl.make_world(num_users=40, num_eval_users=8, num_items=NUM_ITEMS, dim=4,
                       history_len=5, slate=4)


def _model():
  return RecommenderFM(NUM_ITEMS, dim=DIM, rngs=nnx.Rngs(0))


def _np_gru(model, history):
  """The GRU by hand: z, r gates, candidate n, h' = (1 − z) n + z h."""
  bb = model.backbone
  emb, w_x, w_h, b = (np.asarray(v[...], np.float64) for v in (bb.item_emb, bb.w_x, bb.w_h,
                                                                bb.b))
  sig = lambda x: 1 / (1 + np.exp(-x))  # noqa: E731
  h = np.zeros((history.shape[0], DIM))
  out = []
  for t in range(history.shape[1]):
    x = emb[history[:, t]] @ w_x + b
    hh = h @ w_h
    z = sig(x[:, :DIM] + hh[:, :DIM])
    r = sig(x[:, DIM:2 * DIM] + hh[:, DIM:2 * DIM])
    n = np.tanh(x[:, 2 * DIM:] + r * hh[:, 2 * DIM:])
    h = (1 - z) * n + z * h
    out.append(h)
  return np.stack(out, 1)


def test_gru_matches_numpy_and_heads_have_their_shapes(world):
  model = _model()
  history = world.histories[:3]
  states = jax.jit(lambda h: model.backbone.states(h))(jnp.asarray(history))
  np.testing.assert_allclose(states, _np_gru(model, history), atol=1e-5)
  logits = model.backbone.next_item_logits(jnp.asarray(history))
  assert logits.shape == (3, 5, NUM_ITEMS)
  z, table = model.features(jnp.asarray(history))
  items = jnp.asarray(np.array([[0, 3], [5, 5], [11, 1]]))
  f_all = model.policy_scores(z, table)
  np.testing.assert_allclose(model.policy_scores(z, table, items),
                             np.take_along_axis(np.asarray(f_all), np.asarray(items), 1),
                             atol=1e-6)
  assert model.reward_scores(z, table).shape == model.propensity_logits(z, table).shape == (
    3, NUM_ITEMS)
  b = np.asarray(model.thresholds())
  assert b.shape == (5,) and np.all(np.diff(b) > 0)


def test_sft_loss_sharded_over_eight_devices_equals_single_device(world):
  mesh = parallel.mesh.make_mesh(parallel.mesh.mesh_config())
  sharded = init_sharded(_model, mesh)
  assert sharded.backbone.w_x[...].sharding.spec[0] == "fsdp"
  model = _model()
  logs = rl.sample_logs(world, world.train_users[:8], np.random.default_rng(0))
  batch = {k: jnp.asarray(logs[k]) for k in ("history", "items", "level")}
  loss_fn = prs.make_sft_loss(stop_backbone=False, policy_weight=1.0, reward_weight=1.0,
                              propensity_weight=1.0, ips_clip=50.0, slate=world.slate)
  graphdef = nnx.graphdef(model)

  @jax.jit
  def run(state, batch):
    with axes.axis_rules(mesh):
      return loss_fn(nnx.merge(graphdef, state), batch)

  got, aux = run(nnx.state(sharded), parallel.mesh.put_batch(batch, mesh))
  want, want_aux = jax.jit(lambda b: loss_fn(model, b))(batch)
  np.testing.assert_allclose(got, want, rtol=1e-5)
  np.testing.assert_allclose(aux["reward_nll"], want_aux["reward_nll"], rtol=1e-5)


def test_world_funnel_logs_and_ndcg(world):
  users = world.eval_users[:3]
  p = rl.level_probs(world, users)
  assert p.shape == (3, NUM_ITEMS, rl.NUM_LEVELS)
  np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-12)
  assert np.all(p >= 0)
  gains = rl.expected_gains(world, users)
  np.testing.assert_allclose(gains["click"], 1 - p[..., 0])
  np.testing.assert_allclose(gains["level"], (p * np.arange(6)).sum(-1))
  # Continuation ratios by hand for one (user, item): P(≥2 | ≥1) = σ(d_a·a + γ·d_i − t_1).
  a = rl.affinity(world, users[:1])[0, 2]
  cont = 1 / (1 + np.exp(-(world.deep_scale * a + world.depth_weight * world.item_depth[2]
                           - world.deep_thresholds[0])))
  np.testing.assert_allclose(p[0, 2, 2:].sum() / p[0, 2, 1:].sum(), cont, rtol=1e-10)
  logs = rl.sample_logs(world, world.train_users[:5], np.random.default_rng(0))
  assert logs["items"].shape == logs["level"].shape == (5, world.slate)
  q = rl.logging_probs(world, world.train_users[:5])
  np.testing.assert_allclose(
    logs["propensity"], 1 - (1 - np.take_along_axis(q, logs["items"], 1)) ** world.slate,
    rtol=1e-6)
  # NDCG@2 by hand: order (0, 1, 2), gains (1, 0, 1): DCG = 1, ideal = 1 + 1/log2(3).
  got = rl.ndcg_at_k(np.array([[3.0, 2.0, 1.0]]), np.array([[1.0, 0.0, 1.0]]), k=2)
  np.testing.assert_allclose(got, 1 / (1 + 1 / np.log2(3)))
  with pytest.raises(ValueError, match="depth_pop_corr=2"):
    rl.make_world(depth_pop_corr=2)
