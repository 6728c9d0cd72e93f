"""Synthetic point-cloud quality assessment data (the PCQA-R1 reproduction, arXiv 2608.18627).

PCQA-R1's claim is about *transfer*: a quality model trained on one subjective dataset is tested
on others whose MOS scales, distortion mixes and content differ. This module builds that setting
in miniature, deterministically from a seed:

* Content: coloured surface point clouds of five shape classes (`SHAPES`), `num_points` points
  each, randomly rotated and coloured (a base colour plus a smooth positional pattern).
* Distortions (`DISTORTIONS`) at severities 1…5 (0 = the clean reference):
  geometric Gaussian noise, downsampling (random subset, resampled back to `num_points` with
  repetition, so density drops), coordinate quantisation, colour noise. The continuous strength
  is the level's nominal value times U(0.85, 1.15), so samples of one level differ.
* Hidden perceptual quality q ∈ (0, 1]: q = exp(−I), with the impairment
    I = w_d · (a / a_max,d)^γ_d · c_shape
  for distortion d of strength a (a_max,d = the level-5 value), a per-distortion weight w_d and
  exponent γ_d, and a per-shape masking factor c_shape (noise hides better on a curved, textured
  torus than on a flat cube face). Nothing of this formula is visible to the models, which see
  only rendered views.
* Datasets (`DATASETS`): each has its own MOS range (1–5, 0–10, 0–100), its own monotone
  "subjective" curve h (how its panel used the scale), rater noise, distortion mix and shape
  classes:  MOS = lo + (hi − lo)·clip(h(q) + N(0, τ²), 0, 1).
  Training normalises a dataset's MOS to [0, 1] with its nominal range, as the paper does
  (`normalized_mos`); the ranking reward only reads the order, so it needs no normalisation.
  In syn_a/b/c the MOS is a monotone function of q (plus rater noise), so a model that ranks
  by q ranks every target too: SRCC, and PLCC after the 4-parameter logistic, absorb the shift.
* The non-monotone shift (`SHIFT_DATASETS`, `DATASETS_BY_SHIFT`): two target studies whose
  panels do NOT rank by q. Each has its own perceived quality q_p = exp(−I_p) from its own
  impairment rule (`DatasetSpec.panel`), and MOS = lo + (hi − lo)·clip(h(q_p) + N(0, τ²), 0, 1):
    syn_d: distortion types absent from the source (`SHIFT_DISTORTIONS`: outliers, colour
      shift) next to geometric and colour noise, and all five shapes; its panel weighs the
      distortions differently from q (outliers and colour noise much worse, a colour cast and
      geometric noise milder), so the order *across* distortion types differs from q's.
    syn_e: only the shapes absent from the source (cylinder, cone); quantisation with a
      non-monotone panel response (a tent over the severity: level 3 is rated worst, a coarse
      level-5 voxel grid is read as a deliberate style and rated near clean), downsampling only
      noticed below ≈ 40 % kept points, geometric noise as in q.
  q itself stays defined for the new distortion types (a training-style (w, γ) each, below), so
  `Sample.quality` is "the hidden quality of the source's panel" everywhere and the rank
  correlation of MOS with it measures how far a target departs from the source's notion of
  quality (tests/tasks/test_point_clouds.py checks it: ≈ 1 for syn_a/b/c, low for syn_d/e).
* Rendering (`render_views`): the models see a fixed "rendering protocol" shared by all
  datasets, as in the paper (six canonical views). Here: three orthographic projections along
  x, y, z onto a `grid × grid` raster; each cell holds order-free statistics of the points that
  fall in it (density, mean and std of depth, mean colour, colour std). The six canonical views
  pair up (front/back, …) into these three, since the statistics do not depend on the viewing
  direction along an axis.

Everything is numpy on the host and a pure function of (dataset, split, index): sample i of a
split draws from `np.random.default_rng([dataset seed, split id, i])`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from jaxrl_post.registry import Registry

SHAPES = ("sphere", "cube", "torus", "cylinder", "cone")
DISTORTIONS = ("noise", "downsample", "quantize", "colour_noise")
# Distortion types that only the non-monotone shift's targets contain (never in a source split):
# a share of the points replaced by uniform outliers in [−1, 1]³, and a global colour cast.
SHIFT_DISTORTIONS = ("outliers", "colour_shift")
NUM_SEVERITIES = 5
# Nominal strengths of severities 1…5: noise std (object units, the object fits in [−1, 1]³),
# kept fraction of points, quantisation step, colour noise std (colours in [0, 1]).
SEVERITY_STRENGTH = {
  "noise": (0.01, 0.02, 0.04, 0.07, 0.1),
  "downsample": (0.7, 0.5, 0.3, 0.2, 0.1),
  "quantize": (0.05, 0.1, 0.15, 0.2, 0.3),
  "colour_noise": (0.03, 0.06, 0.1, 0.15, 0.2),
  "outliers": (0.02, 0.05, 0.1, 0.15, 0.25),  # share of points replaced
  "colour_shift": (0.05, 0.1, 0.2, 0.3, 0.4),  # length of the RGB offset
}
# Words the templated rationales use for each distortion and severity (0 = clean).
DISTORTION_WORDS = {"noise": "noisy surface", "downsample": "sparse points",
                    "quantize": "blocky steps", "colour_noise": "colour speckle",
                    "outliers": "stray points", "colour_shift": "colour cast"}
SEVERITY_WORDS = ("clean", "slight", "mild", "clear", "strong", "severe")

# The hidden quality function: impairment weight w_d and exponent γ_d per distortion, masking
# factor per shape. Chosen so each distortion spans roughly q ∈ [0.95, 0.1] over its levels.
_IMPAIRMENT = {"noise": (2.2, 0.8), "downsample": (1.8, 1.3), "quantize": (2.0, 1.0),
               "colour_noise": (1.4, 0.7),
               # The unseen types under the source's rule (what q says of them).
               "outliers": (1.0, 1.0), "colour_shift": (2.2, 1.0)}
_SHAPE_MASKING = {"sphere": 1.0, "cube": 1.15, "torus": 0.85, "cylinder": 1.05, "cone": 0.95}

CHANNELS = ("density", "depth_mean", "depth_std", "red", "green", "blue", "colour_std")
NUM_VIEWS = 3
SPLITS = ("train", "test")


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
  """One synthetic subjective study.

  Attributes:
    name: registry name.
    mos_range: `(lo, hi)`, the nominal scale of its MOS.
    shapes: content classes it contains.
    distortion_weights: `{distortion: weight}`, the mix of distortions (normalised).
    clean_fraction: share of undistorted references.
    curve: h: [0, 1] → [0, 1], monotone, the panel's use of the scale.
    rater_noise: τ, std of the MOS noise in normalised units.
    sizes: `{split: number of samples}`.
    seed: base seed of the dataset.
    panel: the panel's perceived quality q_p = panel(shape, distortion, strength) (clean
      references get 1); None: q_p = q, the hidden quality (`hidden_quality`). The MOS
      follows h(q_p).
  """

  name: str
  mos_range: tuple[float, float]
  shapes: tuple[str, ...]
  distortion_weights: dict[str, float]
  clean_fraction: float
  curve: Callable[[np.ndarray], np.ndarray]
  rater_noise: float
  sizes: dict[str, int]
  seed: int
  panel: Callable[[str, str, float], float] | None = None


DATASETS: Registry = Registry("point-cloud dataset")


def _add_dataset(spec: DatasetSpec) -> None:
  DATASETS.add(spec.name, spec)


# Three studies in the spirit of SJTU-PCQA / WPC / LS-PCQA: different scales, panels and content.
_add_dataset(DatasetSpec(
  name="syn_a", mos_range=(1.0, 5.0), shapes=("sphere", "cube", "torus"),
  distortion_weights={"noise": 1.0, "downsample": 1.0, "quantize": 1.0, "colour_noise": 1.0},
  clean_fraction=0.05, curve=lambda q: q, rater_noise=0.03,
  sizes={"train": 400, "test": 160}, seed=101))
_add_dataset(DatasetSpec(
  name="syn_b", mos_range=(0.0, 10.0), shapes=("cylinder", "cone", "sphere"),
  distortion_weights={"noise": 2.0, "downsample": 0.5, "quantize": 1.0, "colour_noise": 2.0},
  clean_fraction=0.05, curve=lambda q: q ** 1.6, rater_noise=0.04,
  sizes={"train": 400, "test": 160}, seed=202))
_add_dataset(DatasetSpec(
  name="syn_c", mos_range=(0.0, 100.0), shapes=SHAPES,
  distortion_weights={"noise": 1.0, "downsample": 2.0, "quantize": 0.5, "colour_noise": 0.5},
  clean_fraction=0.1, curve=lambda q: 1.0 / (1.0 + np.exp(-8.0 * (q - 0.5))), rater_noise=0.05,
  sizes={"train": 400, "test": 160}, seed=303))


def _severity_fraction(distortion: str, strength: float) -> float:
  """x = a / a_max,d (downsampling: the dropped share (1 − a)/(1 − a_min)); 1 at level 5."""
  levels = SEVERITY_STRENGTH[distortion]
  if distortion == "downsample":
    return max((1.0 - strength) / (1.0 - levels[-1]), 0.0)
  return max(strength / levels[-1], 0.0)


def _panel_d(shape: str, distortion: str, strength: float) -> float:
  """syn_d's panel: q_p = exp(−w_p·x^γ_p·c_shape) with its own (w_p, γ_p) per distortion."""
  weight, gamma = {"noise": (1.4, 0.8), "colour_noise": (2.8, 0.7), "outliers": (3.0, 0.5),
                   "colour_shift": (0.5, 1.0)}[distortion]
  x = _severity_fraction(distortion, strength)
  return float(np.exp(-weight * x ** gamma * _SHAPE_MASKING[shape]))


def _panel_e(shape: str, distortion: str, strength: float) -> float:
  """syn_e's panel: q_p = exp(−w_d·τ_d(x)·c_shape), with a tent for quantisation
  (τ = 1 − |2x − 1|: level 3 worst, level 5 near clean), a threshold for downsampling
  (τ = max(0, (x − 0.6)/0.4)^1.3: unnoticed until ≈ 40 % of the points remain) and q's own
  rule for noise (τ = x^0.8)."""
  weight = _IMPAIRMENT[distortion][0]
  x = _severity_fraction(distortion, strength)
  if distortion == "quantize":
    tau = max(1.0 - abs(2.0 * x - 1.0), 0.0)
  elif distortion == "downsample":
    tau = max(0.0, (x - 0.6) / 0.4) ** 1.3
  elif distortion == "noise":
    tau = x ** _IMPAIRMENT["noise"][1]
  else:
    raise ValueError(f"syn_e's panel has no rule for {distortion!r}")
  return float(np.exp(-weight * tau * _SHAPE_MASKING[shape]))


# The non-monotone shift's targets (module docstring): registered, but only in the dataset list
# of `shift="non_monotone"` (`DATASETS_BY_SHIFT`).
_add_dataset(DatasetSpec(
  name="syn_d", mos_range=(0.0, 10.0), shapes=SHAPES,
  distortion_weights={"noise": 1.0, "colour_noise": 1.0, "outliers": 1.5, "colour_shift": 1.5},
  clean_fraction=0.05, curve=lambda q: q, rater_noise=0.04,
  sizes={"train": 400, "test": 160}, seed=404, panel=_panel_d))
_add_dataset(DatasetSpec(
  name="syn_e", mos_range=(0.0, 100.0), shapes=("cylinder", "cone"),
  distortion_weights={"quantize": 2.0, "downsample": 1.0, "noise": 1.0},
  clean_fraction=0.05, curve=lambda q: q, rater_noise=0.04,
  sizes={"train": 400, "test": 160}, seed=505, panel=_panel_e))

SHIFT_DATASETS = ("syn_d", "syn_e")
# The datasets a run trains on / evaluates (source first) for each `config.shift`.
DATASETS_BY_SHIFT = {"monotone": ("syn_a", "syn_b", "syn_c"),
                     "non_monotone": ("syn_a", *SHIFT_DATASETS)}


class PointCloud(NamedTuple):
  """One coloured point cloud."""

  xyz: np.ndarray  # [n, 3] float32 positions, the clean object inside [−1, 1]³.
  rgb: np.ndarray  # [n, 3] float32 colours in [0, 1]. n < num_points after downsampling.


class Sample(NamedTuple):
  """One rated sample of a dataset."""

  cloud: PointCloud
  shape: str
  distortion: str  # One of DISTORTIONS (+ SHIFT_DISTORTIONS in syn_d), or "none" (clean).
  severity: int  # 0 (clean) … 5.
  strength: float  # The distortion's continuous parameter (0 for clean).
  quality: float  # Hidden q ∈ (0, 1] (the source panel's rule, `hidden_quality`).
  mos: float  # On the dataset's `mos_range`.
  panel_quality: float = float("nan")  # q_p the MOS follows (= quality unless `spec.panel`).


def _surface(shape: str, n: int, rng: np.random.Generator) -> np.ndarray:
  """`n` points on the surface of `shape`, roughly uniform by area, inside [−1, 1]³."""
  if shape == "sphere":
    v = rng.normal(size=(n, 3))
    return 0.9 * v / np.linalg.norm(v, axis=1, keepdims=True)
  if shape == "cube":
    face = rng.integers(0, 6, n)
    uv = rng.uniform(-1, 1, (n, 2))
    axis, sign = face // 2, np.where(face % 2, 1.0, -1.0)
    p = np.zeros((n, 3))
    for a in range(3):
      rows = axis == a
      others = [b for b in range(3) if b != a]
      p[rows, a] = sign[rows]
      p[np.ix_(rows, others)] = uv[rows]
    return 0.7 * p
  if shape == "torus":
    big, small = 0.65, 0.28
    u, v = rng.uniform(0, 2 * np.pi, (2, n))
    return np.stack([(big + small * np.cos(v)) * np.cos(u), (big + small * np.cos(v)) * np.sin(u),
                     small * np.sin(v)], axis=1)
  if shape == "cylinder":
    radius, half = 0.6, 0.8
    # Side area 2πrh·2 vs caps 2πr²: pick the part by area.
    side = rng.uniform(size=n) < (2 * half) / (2 * half + radius)
    u = rng.uniform(0, 2 * np.pi, n)
    r = np.where(side, radius, radius * np.sqrt(rng.uniform(size=n)))
    cap = np.where(rng.uniform(size=n) < 0.5, -half, half)
    z = np.where(side, rng.uniform(-half, half, n), cap)
    return np.stack([r * np.cos(u), r * np.sin(u), z], axis=1)
  if shape == "cone":
    radius, height = 0.7, 1.6
    slant = np.hypot(radius, height)
    side = rng.uniform(size=n) < slant / (slant + radius)
    u = rng.uniform(0, 2 * np.pi, n)
    t = np.sqrt(rng.uniform(size=n))  # area grows linearly with the distance from the apex
    r = np.where(side, radius * t, radius * np.sqrt(rng.uniform(size=n)))
    z = np.where(side, height / 2 - height * t, -height / 2)
    return np.stack([r * np.cos(u), r * np.sin(u), z], axis=1)
  raise ValueError(f"unknown shape {shape!r}; valid: {', '.join(SHAPES)}")


def _random_rotation(rng: np.random.Generator) -> np.ndarray:
  q, r = np.linalg.qr(rng.normal(size=(3, 3)))
  q = q * np.sign(np.diag(r))
  if np.linalg.det(q) < 0:
    q[:, 0] = -q[:, 0]
  return q


def clean_cloud(shape: str, num_points: int, rng: np.random.Generator) -> PointCloud:
  """A randomly rotated, coloured surface of `shape` (base colour + smooth stripes)."""
  xyz = _surface(shape, num_points, rng) @ _random_rotation(rng).T
  base = rng.uniform(0.25, 0.75, 3)
  freq = rng.uniform(2.0, 5.0, 3)
  phase = rng.uniform(0, 2 * np.pi, 3)
  rgb = base + 0.2 * np.sin(freq * xyz[:, [0, 1, 2]] + phase)
  return PointCloud(xyz.astype(np.float32), np.clip(rgb, 0, 1).astype(np.float32))


def distort(cloud: PointCloud, distortion: str, strength: float,
            rng: np.random.Generator) -> PointCloud:
  """Applies `distortion` with continuous parameter `strength` (see `SEVERITY_STRENGTH`)."""
  xyz, rgb = cloud.xyz.astype(np.float64), cloud.rgb.astype(np.float64)
  n = xyz.shape[0]
  if distortion == "none":
    pass
  elif distortion == "noise":
    xyz = xyz + rng.normal(0, strength, xyz.shape)
  elif distortion == "downsample":
    # A random subset: the cloud has fewer points, so its rendered density drops.
    kept = np.sort(rng.choice(n, max(int(round(strength * n)), 4), replace=False))
    xyz, rgb = xyz[kept], rgb[kept]
  elif distortion == "quantize":
    xyz = np.round(xyz / strength) * strength
  elif distortion == "colour_noise":
    rgb = np.clip(rgb + rng.normal(0, strength, rgb.shape), 0, 1)
  elif distortion == "outliers":
    # A share `strength` of the points (at least one) moves to uniform positions in the box.
    moved = rng.choice(n, max(int(round(strength * n)), 1), replace=False)
    xyz[moved] = rng.uniform(-1.0, 1.0, (len(moved), 3))
  elif distortion == "colour_shift":
    # One global cast: every colour moves by `strength` along a random RGB direction.
    direction = rng.normal(size=3)
    rgb = np.clip(rgb + strength * direction / np.linalg.norm(direction), 0, 1)
  else:
    raise ValueError(f"unknown distortion {distortion!r}; valid: none, "
                     f"{', '.join(DISTORTIONS + SHIFT_DISTORTIONS)}")
  return PointCloud(xyz.astype(np.float32), rgb.astype(np.float32))


def hidden_quality(shape: str, distortion: str, strength: float) -> float:
  """q = exp(−w_d·(a/a_max,d)^γ_d·c_shape); 1 for a clean reference (see the module docstring).

  Downsampling's strength is the *kept* fraction, so its impairment reads the dropped share
  (1 − a) / (1 − a_min) instead.

  Examples:
    >>> hidden_quality("sphere", "none", 0.0)
    1.0
    >>> round(hidden_quality("sphere", "noise", 0.1), 4)  # exp(−2.2)
    0.1108
  """
  if distortion == "none":
    return 1.0
  weight, gamma = _IMPAIRMENT[distortion]
  x = _severity_fraction(distortion, strength)
  return float(np.exp(-weight * x ** gamma * _SHAPE_MASKING[shape]))


def _split_id(split: str) -> int:
  if split not in SPLITS:
    raise ValueError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")
  return SPLITS.index(split)


def make_sample(dataset: str | DatasetSpec, split: str, index: int, *,
                num_points: int = 512) -> Sample:
  """Sample `index` of `split` of `dataset`: a pure function of these arguments."""
  spec = DATASETS.get(dataset) if isinstance(dataset, str) else dataset
  rng = np.random.default_rng([spec.seed, _split_id(split), index])
  shape = spec.shapes[rng.integers(len(spec.shapes))]
  cloud = clean_cloud(shape, num_points, rng)
  if rng.uniform() < spec.clean_fraction:
    distortion, severity, strength = "none", 0, 0.0
  else:
    names = list(spec.distortion_weights)
    weights = np.asarray([spec.distortion_weights[d] for d in names], np.float64)
    distortion = names[rng.choice(len(names), p=weights / weights.sum())]
    severity = int(rng.integers(1, NUM_SEVERITIES + 1))
    nominal = SEVERITY_STRENGTH[distortion][severity - 1]
    strength = float(nominal * rng.uniform(0.85, 1.15))
    if distortion == "downsample":
      strength = min(strength, 1.0)
  cloud = distort(cloud, distortion, strength, rng)
  q = hidden_quality(shape, distortion, strength)
  # The panel's own quality (the non-monotone shift), else the hidden q.
  q_p = (1.0 if distortion == "none" else spec.panel(shape, distortion, strength)
         ) if spec.panel is not None else q
  lo, hi = spec.mos_range
  norm = float(np.clip(spec.curve(np.float64(q_p)) + rng.normal(0, spec.rater_noise), 0.0, 1.0))
  return Sample(cloud, shape, distortion, severity, strength, q, lo + (hi - lo) * norm, q_p)


def normalized_mos(mos: np.ndarray | float, dataset: str | DatasetSpec) -> np.ndarray:
  """(MOS − lo)/(hi − lo) with the dataset's nominal range: [0, 1] for every dataset."""
  spec = DATASETS.get(dataset) if isinstance(dataset, str) else dataset
  lo, hi = spec.mos_range
  return (np.asarray(mos, np.float64) - lo) / (hi - lo)


def render_views(cloud: PointCloud, *, grid: int = 12, num_points: int = 512) -> np.ndarray:
  """Three orthographic projections with per-cell point statistics.

  For the projection along axis a, point p falls in cell (u, v) of the other two coordinates
  (clipped to [−1, 1] and split into `grid` bins each); its depth is p_a. Per cell, with m the
  number of points in it and N = `num_points` the size of an undistorted cloud (the rendering
protocol is fixed, so a downsampled cloud renders thinner):
    density = m·grid² / N / 4 (≈ 1 for a cell of a well-sampled surface; 0 when empty),
    depth_mean, depth_std, mean red/green/blue, colour_std (mean of the three channel stds).
  Empty cells are all zero.

  Args:
    cloud: the point cloud.
    grid: raster size G.
    num_points: N, the size of a clean cloud.

  Returns:
    `[NUM_VIEWS, G, G, len(CHANNELS)]` float32.
  """
  xyz = np.clip(cloud.xyz.astype(np.float64), -1.0, 1.0 - 1e-9)
  rgb = cloud.rgb.astype(np.float64)
  n = num_points
  bins = np.floor((xyz + 1.0) * (grid / 2.0)).astype(np.int64)
  out = np.zeros((NUM_VIEWS, grid * grid, len(CHANNELS)), np.float64)
  for a in range(NUM_VIEWS):
    u, v = [b for b in range(3) if b != a]
    cell = bins[:, u] * grid + bins[:, v]
    count = np.bincount(cell, minlength=grid * grid).astype(np.float64)
    safe = np.maximum(count, 1.0)

    def mean(x, cell=cell, safe=safe):
      return np.bincount(cell, weights=x, minlength=grid * grid) / safe

    depth = xyz[:, a]
    d_mean = mean(depth)
    d_std = np.sqrt(np.maximum(mean(depth ** 2) - d_mean ** 2, 0.0))
    colours = [mean(rgb[:, c]) for c in range(3)]
    c_std = np.mean([np.sqrt(np.maximum(mean(rgb[:, c] ** 2) - colours[c] ** 2, 0.0))
                     for c in range(3)], axis=0)
    stats = np.stack([count * grid * grid / n / 4.0, d_mean, d_std, *colours, c_std], axis=1)
    out[a] = np.where(count[:, None] > 0, stats, 0.0)
  return out.reshape(NUM_VIEWS, grid, grid, len(CHANNELS)).astype(np.float32)


class DatasetArrays(NamedTuple):
  """A split of a dataset as arrays (what the trainer reads)."""

  views: np.ndarray  # [n, NUM_VIEWS, G, G, C] float32.
  mos: np.ndarray  # [n] float64 on the dataset's range.
  mos01: np.ndarray  # [n] float64 normalised to [0, 1].
  quality: np.ndarray  # [n] hidden q (diagnostics only).
  shape: list[str]
  distortion: list[str]
  severity: np.ndarray  # [n] int.
  panel_quality: np.ndarray  # [n] q_p the MOS follows (= quality unless the panel differs).


def load_split(dataset: str, split: str, *, size: int | None = None, num_points: int = 512,
               grid: int = 12) -> DatasetArrays:
  """Samples 0 … size − 1 of a split (default: the dataset's size), rendered."""
  spec = DATASETS.get(dataset)
  size = spec.sizes[split] if size is None else int(size)
  samples = [make_sample(spec, split, i, num_points=num_points) for i in range(size)]
  views = np.zeros((len(samples), NUM_VIEWS, grid, grid, len(CHANNELS)), np.float32)
  for i, s in enumerate(samples):
    views[i] = render_views(s.cloud, grid=grid, num_points=num_points)
  mos = np.asarray([s.mos for s in samples], np.float64)
  return DatasetArrays(views=views, mos=mos, mos01=normalized_mos(mos, spec),
                       quality=np.asarray([s.quality for s in samples], np.float64),
                       panel_quality=np.asarray([s.panel_quality for s in samples], np.float64),
                       shape=[s.shape for s in samples],
                       distortion=[s.distortion for s in samples],
                       severity=np.asarray([s.severity for s in samples], np.int64))


def dataset_names() -> Sequence[str]:
  return tuple(DATASETS.names())
