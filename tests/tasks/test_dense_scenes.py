"""Synthetic dense scenes: determinism, geometry, densities up to 500, referring queries."""

import numpy as np
import pytest

from jaxrl_post.rewards import set_matching
from jaxrl_post.tasks import dense_scenes as ds


def test_deterministic_by_seed_split_index():
  a = ds.make_scene(3, "train", 7, num_targets=20, query=ds.Query("red"), num_distractors=5)
  b = ds.make_scene(3, "train", 7, num_targets=20, query=ds.Query("red"), num_distractors=5)
  c = ds.make_scene(3, "test", 7, num_targets=20, query=ds.Query("red"), num_distractors=5)
  np.testing.assert_array_equal(a.image, b.image)
  np.testing.assert_array_equal(a.boxes, b.boxes)
  assert not np.array_equal(a.image, c.image)
  task = ds.DenseSceneTask(seed=1)
  assert task.example("train", 5).query == task.example("train", 5).query
  np.testing.assert_array_equal(task.example("train", 5).image, task.example("train", 5).image)


def test_pixel_grid_boxes_and_visibility():
  scene = ds.make_scene(0, "train", 1, num_targets=30, query=ds.Query(), image_size=64)
  px = scene.all_boxes.astype(np.float64) * 64
  # Integer corners: centres on half pixels, sizes whole pixels, inside the image.
  np.testing.assert_allclose(px[:, :2] * 2, np.round(px[:, :2] * 2), atol=1e-4)
  np.testing.assert_allclose(px[:, 2:], np.round(px[:, 2:]), atol=1e-4)
  assert (px[:, 2:] >= 1).all() and (px[:, 2:] <= 24).all()
  lo = px[:, :2] - px[:, 2:] / 2
  hi = px[:, :2] + px[:, 2:] / 2
  assert (lo >= -1e-4).all() and (hi <= 64 + 1e-4).all()
  # "anything" selects every object; the image is not blank where objects are.
  assert scene.boxes.shape == scene.all_boxes.shape
  assert scene.image.dtype == np.float32 and scene.image.shape == (64, 64, 3)


@pytest.mark.parametrize("n", [0, 1, 10, 50, 200, 500])
def test_density_up_to_500_objects(n):
  scene = ds.make_scene(0, "test", n, num_targets=n, query=ds.Query())
  # The visibility filter may drop a few objects at the highest density, never many.
  assert 0.9 * n <= scene.boxes.shape[0] <= n
  assert scene.num_requested == n
  lo, hi = ds.object_size_range(n, 64, 24)
  assert 1 <= lo <= hi <= 24
  # No two ground-truth boxes are duplicates of each other (IoU ≤ 0.5 after the filter would
  # not hold in general, but identical boxes cannot both be ≥ 50 % visible).
  if n > 1:
    iou = set_matching.box_iou(scene.boxes, scene.boxes)
    np.fill_diagonal(iou, 0)
    assert iou.max() < 1.0


def test_referring_query_selects_subset_and_negatives():
  q = ds.Query("blue", "ellipse")
  scene = ds.make_scene(2, "train", 0, num_targets=6, query=q, num_distractors=10)
  assert scene.boxes.shape[0] <= 6 < scene.all_boxes.shape[0]
  sel = [q.matches(c, s) for c, s in zip(scene.colours, scene.shapes)]
  np.testing.assert_array_equal(scene.all_boxes[np.array(sel)], scene.boxes)
  neg = ds.make_scene(2, "train", 1, num_targets=0, query=ds.Query("red"), num_distractors=5)
  assert not neg.is_positive and neg.all_boxes.shape[0] > 0 and "red" not in neg.colours
  task = ds.DenseSceneTask(negative_prob=0.5)
  scenes = task.batch("train", range(200))
  neg_share = np.mean([not s.is_positive for s in scenes])
  assert 0.3 < neg_share < 0.7
  assert all(s.is_positive for s in task.batch("train", range(20), positive=True))
  assert ds.Query().text == "anything" and q.text == "blue ellipse"
  np.testing.assert_array_equal(q.tokens, [ds.COLOUR_QUERY["blue"], ds.SHAPE_QUERY["ellipse"]])


def test_canonical_order_is_raster():
  boxes = np.array([[0.8, 0.1, 0.1, 0.1], [0.2, 0.5, 0.1, 0.1], [0.1, 0.1, 0.1, 0.1]])
  assert ds.canonical_order(boxes, 128).tolist() == [2, 0, 1]


def test_count_eval_set_spans_buckets():
  scenes = ds.count_eval_set(0, 2, negatives=3)
  counts = [s.boxes.shape[0] for s in scenes]
  assert counts[:2] == [0, 0] and max(counts) >= 450
  assert sum(not s.is_positive for s in scenes) == 5


def test_bad_arguments_fail_loudly():
  with pytest.raises(ValueError, match="unknown colour 'purple'"):
    ds.Query("purple")
  with pytest.raises(ValueError, match="unknown split"):
    ds.make_scene(0, "val", 0, num_targets=1, query=ds.Query())
  with pytest.raises(ValueError, match="bucket_weights"):
    ds.DenseSceneTask(count_buckets=((1, 2),), bucket_weights=(1.0, 1.0))
