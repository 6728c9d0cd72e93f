"""MoE proxy: K-Medoids on hand-made distances, the views, selections and expert slicing."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_post.models import CausalLM, get_model_config
from jaxrl_post.models import moe_proxy as mp


def _two_clusters():
  # Experts {0, 1, 2} and {3, 4} far apart (distance 1); inside, 0.1 except 0–2 at 0.2:
  # expert 1 is the centre of the first cluster (summed 0.2 vs 0.3), 3 and 4 tie.
  d = np.ones((5, 5))
  d[np.ix_([0, 1, 2], [0, 1, 2])] = [[0, .1, .2], [.1, 0, .1], [.2, .1, 0]]
  d[np.ix_([3, 4], [3, 4])] = [[0, .1], [.1, 0]]
  return d


def test_kmedoids_golden_clusters_and_frequency_tie_break():
  d = _two_clusters()
  # Frequency init picks 0 and 2 (same cluster); the iteration moves to the centres {1, 4}:
  # 4 wins the 3–4 tie because it is more frequent.
  freq = np.array([.3, .1, .25, .05, .3])
  np.testing.assert_array_equal(mp.kmedoids(d, 2, freq), [1, 4])
  np.testing.assert_array_equal(mp.kmedoids(d, 2, np.array([.3, .1, .25, .3, .05])), [1, 3])
  np.testing.assert_array_equal(mp.kmedoids(d, 5, freq), [0, 1, 2, 3, 4])
  with pytest.raises(ValueError, match="k=6"):
    mp.kmedoids(d, 6, freq)


def test_views_golden():
  stats = dict(
    router_rows=np.array([[1.0, 0], [2.0, 0], [0, 1.0]]),  # 0 ∥ 1, 2 ⟂ both
    coact=np.array([[4.0, 2, 0], [2, 4, 0], [0, 0, 0]]),  # 2 never selected
    prototypes=np.array([[1.0, 1], [1.0, 1], [0, 0]]),
    freq=np.array([.5, .5, 0]))
  v = mp.distance_views(stats)
  np.testing.assert_allclose(v["router"], [[0, 0, 1], [0, 0, 1], [1, 1, 0]], atol=1e-12)
  # 1 − 2/√16 = 0.5, never-selected at 1; scaled by the max (1).
  np.testing.assert_allclose(v["coact"], [[0, .5, 1], [.5, 0, 1], [1, 1, 0]], atol=1e-12)
  np.testing.assert_allclose(v["context"], [[0, 0, 1], [0, 0, 1], [1, 1, 0]], atol=1e-12)
  np.testing.assert_allclose(mp.fused_distance(v, (1, 0, 0)), v["router"])
  with pytest.raises(ValueError, match="weights"):
    mp.fused_distance(v, (0, 0, 0))


@pytest.fixture(scope="module")
def model():
  return CausalLM(get_model_config("qwen3_moe_tiny", vocab_size=40, num_experts=8),
                  rngs=nnx.Rngs(0))


CALIB = jnp.asarray(np.random.default_rng(0).integers(0, 40, (4, 12)), jnp.int32)


def test_selections_and_slicing(model):
  proxy, keep = mp.build_moe_proxy(model, CALIB, 4, selection="first_k")
  assert proxy.config.num_experts == 4 and [list(k) for k in keep] == [[0, 1, 2, 3]] * 2
  np.testing.assert_array_equal(proxy.layers[1].mlp.router[...],
                                model.layers[1].mlp.router[...][:, :4])
  np.testing.assert_array_equal(proxy.layers[0].mlp.w_down[...],
                                model.layers[0].mlp.w_down[...][:4])
  np.testing.assert_array_equal(proxy.layers[0].attn.q_proj[...], model.layers[0].attn.q_proj[...])
  stats = mp.expert_statistics(model, CALIB)
  _, keep = mp.build_moe_proxy(model, CALIB, 3, selection="frequency")
  for s, k in zip(stats, keep):
    assert set(k) == set(np.argsort(-s["freq"], kind="stable")[:3])
    np.testing.assert_allclose(s["freq"].sum(), 1.0)
  _, keep = mp.build_moe_proxy(model, CALIB, 4, weights=(1, 1, 1), selection="kmedoids")
  assert all(len(set(k)) == 4 for k in keep)
  # Keeping every expert is the identity.
  full, _ = mp.build_moe_proxy(model, CALIB, 8, selection="random")
  forward = nnx.jit(lambda m, t: m(t))
  np.testing.assert_allclose(forward(full, CALIB), forward(model, CALIB), atol=1e-6)
