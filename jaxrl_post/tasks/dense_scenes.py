"""Synthetic dense scenes and referring queries for autoregressive detection (Falcon Perception-HD).

A stand-in for the paper's dense-scene data (arXiv 2608.18881: 2.5k curated images with ~200 to
several hundred instances, pseudo-labelled and human-corrected; not released): small RGB images
of rectangles and ellipses of varied sizes and colours on a noisy background, from 0 to several
hundred objects, and a referring query by attribute ("red", "ellipse", "blue rectangle",
"anything") that selects a subset of them. A query whose subset is empty is a
*negative* query: the right answer is the `<none>` existence token.

  scene = make_scene(seed=3, index=17, num_targets=40, query=Query("red", "any"))
  scene.image        # float32[S, S, 3] in [0, 1]
  scene.boxes        # float32[n, 4] (cx, cy, w, h) normalised, of the query's objects only
  scene.all_boxes    # every drawn object (targets and distractors)

Everything is a pure function of `(seed, split, index)`: the same arguments give the same
pixels on every machine (numpy's PCG64 on a `SeedSequence` of the integers).

Geometry. Boxes have integer pixel corners, so a centre is a multiple of half a pixel and a size
a whole number of pixels: the detector's coordinate bins (half a pixel) and size bins (one
pixel) represent every ground-truth box exactly, and a perfect prediction has IoU 1. Object
size shrinks with the number of objects, `s_max ≈ 0.8·S/√n` (clipped to [1, max_size] pixels),
so 500 objects fit a 64×64 image as 1–2 pixel specks; each object is placed at the best of a
few random positions (least overlap with what is already there). Objects are painted in order;
any object left less than `min_visible` visible under later ones is removed and the scene is
re-painted, so every object in the ground truth is visible (removing an occluder only uncovers
others, so one pass suffices). The number of ground-truth objects can therefore end a little
below the number asked for at high density; `Scene.num_requested` keeps the request.

Token vocabulary (`VOCAB`): the detector's prompt is `[patches…] <colour> <shape>` and its
output chain is `<found> (<coord>(x,y) <size>(w,h))* <end>` or `<none>`; the ids live here
because the task defines the language the model speaks.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

COLOURS = ("red", "green", "blue", "yellow")
SHAPES = ("rect", "ellipse")
_RGB = {"red": (0.9, 0.15, 0.1), "green": (0.1, 0.8, 0.2), "blue": (0.15, 0.3, 0.95),
        "yellow": (0.95, 0.9, 0.1)}

# Token ids. 0 is padding and never sampled as a target.
PAD, FOUND, NONE, COORD, SIZE, END = 0, 1, 2, 3, 4, 5
_QUERY_BASE = 6
COLOUR_QUERY = {name: _QUERY_BASE + i for i, name in enumerate(("any",) + COLOURS)}
SHAPE_QUERY = {name: _QUERY_BASE + len(COLOUR_QUERY) + i
               for i, name in enumerate(("any",) + SHAPES)}
VOCAB_SIZE = _QUERY_BASE + len(COLOUR_QUERY) + len(SHAPE_QUERY)  # 14
TOKEN_NAMES = {PAD: "<pad>", FOUND: "<found>", NONE: "<none>", COORD: "<coord>", SIZE: "<size>",
               END: "<end>", **{v: f"<c:{k}>" for k, v in COLOUR_QUERY.items()},
               **{v: f"<s:{k}>" for k, v in SHAPE_QUERY.items()}}

SPLITS = {"train": 0, "test": 1}
# Evaluation buckets of the ground-truth count (inclusive bounds), up to 500 as in PBench-dense.
COUNT_BUCKETS = ((0, 0), (1, 10), (11, 50), (51, 200), (201, 500))


@dataclasses.dataclass(frozen=True)
class Query:
  """A referring query: a colour and a shape, either of which may be "any"."""

  colour: str = "any"
  shape: str = "any"

  def __post_init__(self):
    if self.colour not in COLOUR_QUERY:
      raise ValueError(f"unknown colour {self.colour!r}; valid: {', '.join(COLOUR_QUERY)}")
    if self.shape not in SHAPE_QUERY:
      raise ValueError(f"unknown shape {self.shape!r}; valid: {', '.join(SHAPE_QUERY)}")

  def matches(self, colour: str, shape: str) -> bool:
    return self.colour in ("any", colour) and self.shape in ("any", shape)

  @property
  def tokens(self) -> np.ndarray:
    return np.array([COLOUR_QUERY[self.colour], SHAPE_QUERY[self.shape]], np.int32)

  @property
  def text(self) -> str:
    words = [w for w in (self.colour, self.shape) if w != "any"]
    return " ".join(words) or "anything"


class Scene(NamedTuple):
  image: np.ndarray  # float32[S, S, 3] in [0, 1].
  query: Query
  boxes: np.ndarray  # float32[n, 4] normalised (cx, cy, w, h) of the objects the query selects.
  all_boxes: np.ndarray  # float32[m, 4] every drawn object.
  colours: tuple[str, ...]  # Per drawn object.
  shapes: tuple[str, ...]
  num_requested: int  # Targets asked for (before the visibility filter).

  @property
  def is_positive(self) -> bool:
    return self.boxes.shape[0] > 0


def _rng(seed: int, split: str, index: int, salt: int = 0) -> np.random.Generator:
  if split not in SPLITS:
    raise ValueError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")
  return np.random.default_rng(np.random.SeedSequence([seed, SPLITS[split], index, salt]))


def object_size_range(num_objects: int, image_size: int, max_size: int) -> tuple[int, int]:
  """Pixel side range `[lo, hi]` for a scene of `num_objects` (density scaling, see module doc)."""
  hi = int(np.clip(np.floor(0.8 * image_size / np.sqrt(max(num_objects, 1))), 1, max_size))
  return max(1, hi // 2), hi


def _layout(rng, n, image_size, max_size, tries=8):
  """`[n, 4]` int corners (x0, y0, x1, y1), each the least-overlapping of `tries` positions."""
  lo, hi = object_size_range(n, image_size, max_size)
  sizes = rng.integers(lo, hi + 1, size=(n, 2))
  corners = np.zeros((n, 4), np.int64)
  cover = np.zeros((image_size, image_size), np.int32)  # How many placed objects cover a pixel.
  for i in range(n):
    w, h = sizes[i]
    x0 = rng.integers(0, image_size - w + 1, size=tries)
    y0 = rng.integers(0, image_size - h + 1, size=tries)
    # Overlap of each candidate with what is placed, from a summed-area table of `cover`.
    sat = np.pad(cover, ((1, 0), (1, 0))).cumsum(0).cumsum(1)
    overlap = sat[y0 + h, x0 + w] - sat[y0, x0 + w] - sat[y0 + h, x0] + sat[y0, x0]
    best = int(np.argmin(overlap))
    corners[i] = (x0[best], y0[best], x0[best] + w, y0[best] + h)
    cover[corners[i, 1]:corners[i, 3], corners[i, 0]:corners[i, 2]] += 1
  return corners


def _shape_mask(shape: str, w: int, h: int) -> np.ndarray:
  if shape == "rect" or min(w, h) <= 2:
    # An ellipse of one or two pixels is a rectangle; the shape attribute of such specks is
    # still what was drawn, which makes shape queries ambiguous at high density (documented).
    return np.ones((h, w), bool)
  yy, xx = np.mgrid[:h, :w]
  return ((xx + 0.5 - w / 2) / (w / 2)) ** 2 + ((yy + 0.5 - h / 2) / (h / 2)) ** 2 <= 1.0


def _paint(image_size, corners, masks, ids):
  """Label map: the id of the topmost object per pixel (−1: background)."""
  label = np.full((image_size, image_size), -1, np.int64)
  for i in ids:
    x0, y0, x1, y1 = corners[i]
    label[y0:y1, x0:x1][masks[i]] = i
  return label


def make_scene(seed: int, split: str, index: int, *, num_targets: int, query: Query,
               num_distractors: int = 0, image_size: int = 64, max_size: int = 24,
               min_visible: float = 0.5, noise: float = 0.04) -> Scene:
  """Renders one scene: `num_targets` objects the query selects plus distractors it does not.

  Targets take attributes the query allows (uniformly among them); distractors take attributes
  it excludes (none can exist for the "anything" query, which then has no distractors).

  Args:
    seed, split, index: determine every random choice.
    num_targets: objects matching `query` (0 gives a negative query when there are distractors,
      or an empty image).
    query: the referring query.
    num_distractors: non-matching objects.
    image_size: side S of the square image, in pixels.
    max_size: largest object side in pixels (a detector with `size_bins` ≥ max_size can
      represent every size).
    min_visible: objects less visible than this (fraction of their own pixels) are removed.
    noise: std of the Gaussian pixel noise (clutter).

  Returns:
    A `Scene`; boxes are float32 `(cx, cy, w, h)` / S.
  """
  if num_targets < 0 or num_distractors < 0:
    raise ValueError(f"counts must be ≥ 0, got {num_targets} targets, {num_distractors} "
                     "distractors")
  rng = _rng(seed, split, index, salt=1)
  match = [(c, s) for c in COLOURS for s in SHAPES if query.matches(c, s)]
  other = [(c, s) for c in COLOURS for s in SHAPES if not query.matches(c, s)]
  if not other:
    num_distractors = 0
  n = num_targets + num_distractors
  attrs = ([match[i] for i in rng.integers(0, len(match), num_targets)]
           + [other[i] for i in rng.integers(0, max(len(other), 1), num_distractors)])
  order = rng.permutation(n)  # Targets and distractors interleave in painting order.
  attrs = [attrs[i] for i in order]
  is_target = (order < num_targets)
  corners = _layout(rng, n, image_size, max_size)
  masks = [_shape_mask(s, int(x1 - x0), int(y1 - y0))
           for (_, s), (x0, y0, x1, y1) in zip(attrs, corners)]
  keep = np.arange(n)
  label = _paint(image_size, corners, masks, keep)
  visible = np.bincount(label[label >= 0], minlength=n)
  own = np.array([m.sum() for m in masks], np.int64)
  keep = np.flatnonzero(visible >= min_visible * np.maximum(own, 1))
  if keep.size < n:
    label = _paint(image_size, corners, masks, keep)

  background = rng.uniform(0.05, 0.3, size=3)
  image = np.broadcast_to(background, (image_size, image_size, 3)).copy()
  shade = rng.uniform(0.8, 1.0, size=n)
  for i in keep:
    image[label == i] = np.asarray(_RGB[attrs[i][0]]) * shade[i]
  image += noise * rng.standard_normal(image.shape)
  image = np.clip(image, 0.0, 1.0).astype(np.float32)

  c = corners[keep].astype(np.float64)
  boxes = np.stack([(c[:, 0] + c[:, 2]) / 2, (c[:, 1] + c[:, 3]) / 2, c[:, 2] - c[:, 0],
                    c[:, 3] - c[:, 1]], axis=1).reshape(-1, 4) / image_size
  boxes = boxes.astype(np.float32)
  return Scene(image=image, query=query, boxes=boxes[is_target[keep]], all_boxes=boxes,
               colours=tuple(attrs[i][0] for i in keep), shapes=tuple(attrs[i][1] for i in keep),
               num_requested=num_targets)


def canonical_order(boxes: np.ndarray, grid: int) -> np.ndarray:
  """Raster order of centres (row, then column, on the `grid`-bin lattice; ties by size).

  The teacher-forcing order of SFT: a fixed, learnable order, so that the model's next instance
  is determined by the image (top-left first) rather than arbitrary.
  """
  boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
  row = np.floor(boxes[:, 1] * grid)
  col = np.floor(boxes[:, 0] * grid)
  return np.lexsort((boxes[:, 2] * boxes[:, 3], col, row))


@dataclasses.dataclass(frozen=True)
class DenseSceneTask:
  """Samples referring-detection examples; `example(split, index)` is deterministic.

  Attributes:
    seed: base seed.
    image_size: S.
    max_size: largest object side (pixels).
    count_buckets: inclusive `(lo, hi)` ranges of the target count; an example first picks a
      bucket uniformly (`bucket_weights`), then a count uniformly inside it.
    bucket_weights: sampling weight per bucket (normalised).
    negative_prob: probability of a negative query (0 targets, some distractors).
    max_distractors: distractors per scene are uniform in [0, max_distractors] (capped by the
      total object budget `max_objects`).
    max_objects: cap on targets + distractors.
  """

  seed: int = 0
  image_size: int = 64
  max_size: int = 24
  count_buckets: tuple[tuple[int, int], ...] = ((1, 4), (5, 16), (17, 32))
  bucket_weights: tuple[float, ...] = (1.0, 1.0, 1.0)
  negative_prob: float = 0.2
  max_distractors: int = 16
  max_objects: int = 512

  def __post_init__(self):
    if len(self.count_buckets) != len(self.bucket_weights):
      raise ValueError(f"count_buckets ({len(self.count_buckets)}) and bucket_weights "
                       f"({len(self.bucket_weights)}) differ in length")
    if any(lo > hi or lo < 0 for lo, hi in self.count_buckets):
      raise ValueError(f"count_buckets must be (lo, hi) with 0 ≤ lo ≤ hi: {self.count_buckets}")

  def example(self, split: str, index: int, *, positive: bool | None = None) -> Scene:
    """One scene; `positive=True/False` forces the query's polarity (RL uses positives only)."""
    rng = _rng(self.seed, split, index, salt=0)
    colour = ("any",) + COLOURS
    shape = ("any",) + SHAPES
    negative = rng.random() < self.negative_prob if positive is None else not positive
    while True:
      query = Query(colour[rng.integers(len(colour))], shape[rng.integers(len(shape))])
      if not (negative and query == Query()):  # "anything" cannot be negative.
        break
    w = np.asarray(self.bucket_weights, np.float64)
    lo, hi = self.count_buckets[rng.choice(len(w), p=w / w.sum())]
    num_targets = 0 if negative else int(rng.integers(max(lo, 1), max(hi, 1) + 1))
    budget = max(self.max_objects - num_targets, 0)
    num_distractors = int(rng.integers(1 if negative else 0, self.max_distractors + 1))
    return make_scene(self.seed, split, index, num_targets=num_targets, query=query,
                      num_distractors=min(num_distractors, budget), image_size=self.image_size,
                      max_size=self.max_size)

  def batch(self, split: str, indices, *, positive: bool | None = None) -> list[Scene]:
    return [self.example(split, int(i), positive=positive) for i in indices]


def count_eval_set(seed: int, per_bucket: int, *, buckets=COUNT_BUCKETS, image_size: int = 64,
                   max_size: int = 24, negatives: int = 0) -> list[Scene]:
  """A fixed test set spanning `buckets` of the target count (up to 500), plus negatives.

  Each bucket gets `per_bucket` "anything" queries whose count is spread evenly over the bucket
  (so the 201–500 bucket really reaches 500), and `negatives` extra negative queries (a colour
  absent from the image) measure presence MCC.
  """
  scenes, index = [], 0
  for lo, hi in buckets:
    for n in np.linspace(lo, hi, per_bucket).round().astype(int):
      scenes.append(make_scene(seed, "test", 10_000 + index, num_targets=int(n), query=Query(),
                               image_size=image_size, max_size=max_size))
      index += 1
  for j in range(negatives):
    rng = _rng(seed, "test", 20_000 + j)
    colour = COLOURS[rng.integers(len(COLOURS))]
    scenes.append(make_scene(seed, "test", 20_000 + j, num_targets=0, query=Query(colour, "any"),
                             num_distractors=int(rng.integers(1, 17)), image_size=image_size,
                             max_size=max_size))
  return scenes
