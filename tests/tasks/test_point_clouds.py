"""Synthetic point-cloud quality datasets: determinism, distortions, hidden MOS, rendering."""

import math

import numpy as np
import pytest

from jaxrl_post.tasks import point_clouds as pc


def test_samples_are_a_pure_function_of_dataset_split_index():
  a = pc.make_sample("syn_a", "train", 7)
  b = pc.make_sample("syn_a", "train", 7)
  np.testing.assert_array_equal(a.cloud.xyz, b.cloud.xyz)
  np.testing.assert_array_equal(a.cloud.rgb, b.cloud.rgb)
  assert (a.mos, a.distortion, a.severity, a.shape) == (b.mos, b.distortion, b.severity, b.shape)
  c = pc.make_sample("syn_a", "test", 7)
  d = pc.make_sample("syn_a", "train", 8)
  assert not np.array_equal(a.cloud.xyz, c.cloud.xyz)
  assert not np.array_equal(a.cloud.xyz, d.cloud.xyz)


def test_hidden_quality_golden_values_and_monotone_in_severity():
  assert pc.hidden_quality("cube", "none", 0.0) == 1.0
  # exp(−w·x^γ·c): noise at the level-5 strength on a sphere (c = 1): exp(−2.2).
  assert math.isclose(pc.hidden_quality("sphere", "noise", 0.1), math.exp(-2.2), rel_tol=1e-12)
  # Downsampling keeps 10 % (the level-5 value): dropped share x = 1, on a cube c = 1.15.
  assert math.isclose(pc.hidden_quality("cube", "downsample", 0.1), math.exp(-1.8 * 1.15),
                      rel_tol=1e-12)
  # Quantisation at half the level-5 step on a torus: exp(−2.0·0.5·0.85).
  assert math.isclose(pc.hidden_quality("torus", "quantize", 0.15), math.exp(-0.85),
                      rel_tol=1e-12)
  for d in pc.DISTORTIONS:
    q = [pc.hidden_quality("sphere", d, s) for s in pc.SEVERITY_STRENGTH[d]]
    assert all(x > y for x, y in zip(q, q[1:])), (d, q)
    assert 0.0 < q[-1] < q[0] < 1.0


def test_distortions_touch_what_they_should():
  rng = np.random.default_rng(0)
  clean = pc.clean_cloud("sphere", 200, rng)
  assert clean.xyz.shape == clean.rgb.shape == (200, 3)
  assert np.all(np.abs(clean.xyz) <= 1.0) and np.all((clean.rgb >= 0) & (clean.rgb <= 1))
  noisy = pc.distort(clean, "noise", 0.05, np.random.default_rng(1))
  np.testing.assert_array_equal(noisy.rgb, clean.rgb)
  assert 0.03 < np.std(noisy.xyz - clean.xyz) < 0.07
  speckled = pc.distort(clean, "colour_noise", 0.1, np.random.default_rng(1))
  np.testing.assert_array_equal(speckled.xyz, clean.xyz)
  assert not np.array_equal(speckled.rgb, clean.rgb)
  quantized = pc.distort(clean, "quantize", 0.25, np.random.default_rng(1))
  np.testing.assert_allclose(quantized.xyz / 0.25, np.round(quantized.xyz / 0.25), atol=1e-5)
  sparse = pc.distort(clean, "downsample", 0.3, np.random.default_rng(1))
  assert sparse.xyz.shape == (60, 3)
  # A subset: every kept point is one of the clean points, with its colour.
  match = np.all(np.isclose(sparse.xyz[:, None], clean.xyz[None]), axis=-1)
  assert np.all(match.sum(1) == 1)
  np.testing.assert_array_equal(sparse.rgb, clean.rgb[np.argmax(match, axis=1)])
  with pytest.raises(ValueError, match="unknown distortion 'blur'.*noise"):
    pc.distort(clean, "blur", 0.1, rng)
  with pytest.raises(ValueError, match="unknown shape 'pyramid'.*torus"):
    pc.clean_cloud("pyramid", 10, rng)


def test_datasets_differ_in_range_content_and_curve():
  ranges = {name: pc.DATASETS.get(name).mos_range for name in pc.dataset_names()}
  assert ranges == {"syn_a": (1.0, 5.0), "syn_b": (0.0, 10.0), "syn_c": (0.0, 100.0)}
  for name in pc.dataset_names():
    spec = pc.DATASETS.get(name)
    split = pc.load_split(name, "train", size=40, num_points=128, grid=8)
    lo, hi = spec.mos_range
    assert np.all((split.mos >= lo) & (split.mos <= hi))
    np.testing.assert_allclose(split.mos01, (split.mos - lo) / (hi - lo))
    assert set(split.shape) <= set(spec.shapes)
    assert split.views.shape == (40, pc.NUM_VIEWS, 8, 8, len(pc.CHANNELS))
    # The MOS follows the hidden quality through a monotone curve plus rater noise.
    rank_q, rank_m = np.argsort(np.argsort(split.quality)), np.argsort(np.argsort(split.mos))
    assert np.corrcoef(rank_q, rank_m)[0, 1] > 0.9, name
  with pytest.raises(KeyError, match="syn_a"):
    pc.load_split("sjtu", "train")
  with pytest.raises(ValueError, match="unknown split 'val'"):
    pc.make_sample("syn_a", "val", 0)


def test_render_views_golden_cell_statistics_and_point_order_invariance():
  # Two points in one cell of the z-projection: depths 0.1 and 0.3, colours (0, 0.2, 0.4) and
  # (1, 0.2, 0.0). Grid 4 over [−1, 1]: x = y = 0.1 lies in cell (2, 2).
  cloud = pc.PointCloud(np.asarray([[0.1, 0.1, 0.1], [0.1, 0.1, 0.3]], np.float32),
                        np.asarray([[0.0, 0.2, 0.4], [1.0, 0.2, 0.0]], np.float32))
  views = pc.render_views(cloud, grid=4, num_points=2)
  assert views.shape == (3, 4, 4, 7)
  cell = views[2, 2, 2]
  # density = m·G²/N/4 = 2·16/2/4; depth mean 0.2, std 0.1; colour means; colour std
  # = mean(0.5, 0, 0.2).
  np.testing.assert_allclose(cell, [4.0, 0.2, 0.1, 0.5, 0.2, 0.2, 0.7 / 3], atol=1e-6)
  assert np.count_nonzero(views[2, ..., 0]) == 1  # every other cell is empty (all zeros)
  assert np.all(views[2][views[2, ..., 0] == 0] == 0)
  rng = np.random.default_rng(3)
  sample = pc.make_sample("syn_c", "test", 3)
  perm = rng.permutation(sample.cloud.xyz.shape[0])
  shuffled = pc.PointCloud(sample.cloud.xyz[perm], sample.cloud.rgb[perm])
  np.testing.assert_allclose(pc.render_views(shuffled), pc.render_views(sample.cloud),
                             atol=1e-5)


def test_downsampling_renders_thinner():
  rng = np.random.default_rng(0)
  clean = pc.clean_cloud("cube", 512, rng)
  sparse = pc.distort(clean, "downsample", 0.2, rng)
  dense_views, sparse_views = pc.render_views(clean), pc.render_views(sparse)
  assert sparse_views[..., 0].sum() == pytest.approx(0.2 * dense_views[..., 0].sum(), rel=0.01)
