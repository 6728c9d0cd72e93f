"""RecoverFly's synthetic aerial navigation (`"aerial_nav"`): grammar-constrained action programs.

RecoverFly (arXiv 2608.09467) post-trains a UAV vision-language-action policy that emits
grammar-constrained action tokens, executed in closed loop. This is our PROPOSAL
analogue, a text task on a `grid × grid` map of obstacle cells:

* scenes = map archetypes: `H<r><c>` a horizontal wall on row r with a gap at column c,
  `V<c><r>` a vertical wall on column c with a gap at row r, `B<x><y>` a 2×2 block; a scene is
  one or two of them (seeded). Scene s has the Zipf frequency `f_s ∝ (s + 1)^-zipf` (knob
  `zipf`); the train split draws its scenes ∝ f_s (head scenes dominate), the other splits
  uniformly, so that the tail is measured as well as the head;
* the prompt gives the layout code, the start cell and the goal descriptor: an object word and
  its cell, e.g. `H35B21 @06 tower@52` (the coordinates are `xy`, one digit each), and with
  the knob `show_offset` the goal relative to the start (` d+5-4`);
* the completion is an action program of exactly `max_moves` moves then STOP,
  `M<dir><dist> … STOP`, dir ∈ 0..7 (E, NE, N, NW, W, SW, S, SE; y grows "north"),
  dist ∈ 0..4 cells (0 = hover: a no-op, so shorter plans pad with `M00`); `grammar_slots`
  is that grammar, so `config.constrained_decoding` makes every sampled program parse;
* the verifier executes the program in closed loop, one cell at a time: each move starts where
  the last one ended (errors compound), and leaving the map or entering an obstacle ends the
  episode there (a collision). Success = no collision and the last cell is the goal.
  `correct = s + w·(1 − s)·progress` with s the success, progress = max(0, 1 − d_end / d_start)
  (Chebyshev distances) and w the knob `progress_weight` (default 0: success only);
* splits: "train" (seen scenes, seen object words; only the first `train_scenes` scenes when
  that knob is > 0, e.g. head-scene demonstrations for behaviour cloning), "test" (= seen:
  fresh start/goal pairs on the seen scenes), "unseen_map" (`num_unseen_scenes` new
  layouts), "unseen_object" (seen scenes, object words never in train). Every example has
  an expert program (the fewest-moves plan by breadth-first search over macro moves) of at
  most `max_moves` moves, its `demonstration`. `meta` holds the scene, its frequency,
  whether it is a head scene (`scene < num_head_scenes`), the obstacles, start and goal.

All of it (grid, archetypes, Zipf exponent, vocabularies, shaping) is PROPOSAL: the paper's
TravelUAV simulator, grammar and reward are "not found".
"""

from __future__ import annotations

import dataclasses
import functools
import random
import re
from collections import deque
from collections.abc import Mapping
from typing import Any

import numpy as np

from jaxrl_post.tasks import base

# dir d moves by DIRS[d] = (dx, dy): E, NE, N, NW, W, SW, S, SE.
DIRS = ((1, 0), (1, 1), (0, 1), (-1, 1), (-1, 0), (-1, -1), (0, -1), (1, -1))
MAX_DIST = 4  # dist ∈ 0..MAX_DIST: five values
SEEN_OBJECTS = ("tower", "tree", "car", "roof", "crane", "tent", "boat", "mast")
UNSEEN_OBJECTS = ("bell", "kite", "dome", "silo")
SPLITS = ("train", "test", "unseen_map", "unseen_object")
_PROGRAM_RE = re.compile(r"M([0-7])([0-4])")


def execute(program, start, goal, obstacles, grid: int) -> tuple[bool, bool, tuple[int, int]]:
  """Closed-loop execution of `program` [(dir, dist), …] from `start` on a `grid × grid` map.

  Each unit step goes to the next cell in the move's direction; leaving the map or entering an
  `obstacles` cell ends the episode in the last free cell (a collision).

  Returns:
    `(success, collided, end)`: success = not collided and end == goal.

  >>> execute([(0, 2), (2, 1)], (0, 0), (2, 1), set(), 4)
  (True, False, (2, 1))
  >>> execute([(0, 3)], (0, 0), (3, 0), {(2, 0)}, 4)  # the wall stops it at (1, 0)
  (False, True, (1, 0))
  """
  x, y = start
  for d, k in program:
    dx, dy = DIRS[d]
    for _ in range(k):
      nx, ny = x + dx, y + dy
      if not (0 <= nx < grid and 0 <= ny < grid) or (nx, ny) in obstacles:
        return False, True, (x, y)
      x, y = nx, ny
  return (x, y) == tuple(goal), False, (x, y)


def parse_program(completion: str, max_moves: int) -> list[tuple[int, int]] | None:
  """The moves of `M<d><k> × max_moves STOP`, or None when the completion does not parse."""
  if not isinstance(completion, str):
    return None
  text = completion.strip()
  parts = text.split(" ")
  if len(parts) != max_moves + 1 or parts[-1] != "STOP":
    return None
  moves = []
  for part in parts[:-1]:
    m = _PROGRAM_RE.fullmatch(part)
    if m is None:
      return None
    moves.append((int(m.group(1)), int(m.group(2))))
  return moves


def format_program(moves, max_moves: int) -> str:
  """`moves` padded with hover moves (`M00`) to `max_moves`, then STOP."""
  moves = list(moves) + [(0, 0)] * (max_moves - len(moves))
  return " ".join(f"M{d}{k}" for d, k in moves) + " STOP"


def expert_program(start, goal, obstacles, grid: int, max_moves: int):
  """The fewest-moves plan (breadth-first over macro moves (dir, dist 1..4), ties in dir /
  dist order) of at most `max_moves` moves, or None."""
  start, goal = tuple(start), tuple(goal)
  parent = {start: None}
  queue = deque([(start, 0)])
  while queue:
    cell, depth = queue.popleft()
    if cell == goal:
      moves = []
      while parent[cell] is not None:
        cell, move = parent[cell]
        moves.append(move)
      return moves[::-1]
    if depth == max_moves:
      continue
    for d, (dx, dy) in enumerate(DIRS):
      x, y = cell
      for k in range(1, MAX_DIST + 1):
        x, y = x + dx, y + dy
        if not (0 <= x < grid and 0 <= y < grid) or (x, y) in obstacles:
          break
        if (x, y) not in parent:
          parent[(x, y)] = (cell, (d, k))
          queue.append(((x, y), depth + 1))
  return None


def _layout(rng: random.Random, grid: int) -> tuple[str, frozenset]:
  """One scene: one or two archetype pieces, as (code, obstacle cells)."""
  code, cells = "", set()
  for _ in range(rng.choice((1, 2))):
    kind = rng.choice("HVB")
    if kind == "B":
      x, y = rng.randrange(1, grid - 2), rng.randrange(1, grid - 2)
      cells |= {(x, y), (x + 1, y), (x, y + 1), (x + 1, y + 1)}
      code += f"B{x}{y}"
    else:
      line, gap = rng.randrange(1, grid - 1), rng.randrange(grid)
      for i in range(grid):
        if i != gap:
          cells.add((i, line) if kind == "H" else (line, i))
      code += f"{kind}{line}{gap}"
  return code, frozenset(cells)


@functools.lru_cache(maxsize=16)
def build_scenes(seed: int, grid: int, count: int) -> tuple[tuple[str, frozenset], ...]:
  """`count` distinct scenes (code, obstacles), a pure function of `(seed, grid)`."""
  rng = random.Random(f"aerial_nav/scenes/{seed}/{grid}")
  scenes, codes = [], set()
  while len(scenes) < count:
    code, cells = _layout(rng, grid)
    free = grid * grid - len(cells)
    if code not in codes and free >= grid * grid // 2:
      codes.add(code)
      scenes.append((code, cells))
  return tuple(scenes)


def zipf_frequencies(num_scenes: int, exponent: float) -> np.ndarray:
  """`f_s = (s + 1)^-exponent / Σ_j (j + 1)^-exponent`, `[num_scenes]` float64.

  >>> [round(float(f), 3) for f in zipf_frequencies(3, 1.0)]  # 1, 1/2, 1/3 normalised by 11/6
  [0.545, 0.273, 0.182]
  """
  w = (np.arange(num_scenes, dtype=np.float64) + 1.0) ** -float(exponent)
  return w / w.sum()


@base.TASKS.register("aerial_nav")
@dataclasses.dataclass(frozen=True)
class AerialNavTask(base.Task):
  """The synthetic aerial navigation task of the module docstring (knobs are PROPOSAL)."""

  name = "aerial_nav"
  seed: int = 0
  grid: int = 7
  num_scenes: int = 8
  num_unseen_scenes: int = 3
  num_head_scenes: int = 2
  zipf: float = 1.2
  max_moves: int = 3
  progress_weight: float = 0.0
  num_train: int = 2000
  train_scenes: int = 0
  show_offset: bool = False

  def __post_init__(self):
    if not 3 <= self.grid <= 10:
      raise ValueError(f"task_knobs.grid={self.grid} must be in [3, 10] (one-digit coordinates)")
    if self.num_scenes < 1 or self.num_unseen_scenes < 1:
      raise ValueError(f"task_knobs.num_scenes={self.num_scenes} and num_unseen_scenes="
                       f"{self.num_unseen_scenes} must be >= 1")
    if not 0 <= self.num_head_scenes <= self.num_scenes:
      raise ValueError(f"task_knobs.num_head_scenes={self.num_head_scenes} must be in "
                       f"[0, num_scenes={self.num_scenes}]")
    if self.max_moves < 1:
      raise ValueError(f"task_knobs.max_moves={self.max_moves} must be >= 1")
    if not 0.0 <= self.progress_weight <= 1.0:
      raise ValueError(f"task_knobs.progress_weight={self.progress_weight} must be in [0, 1]")
    if not 0 <= self.train_scenes <= self.num_scenes:
      raise ValueError(f"task_knobs.train_scenes={self.train_scenes} must be in [0, num_scenes="
                       f"{self.num_scenes}] (0: all seen scenes)")
    if self.zipf < 0:
      raise ValueError(f"task_knobs.zipf={self.zipf} must be >= 0")

  @property
  def splits(self) -> list[str]:
    return list(SPLITS)

  def num_examples(self, split: str) -> int | None:
    return self.num_train if split == "train" else None

  @property
  def frequencies(self) -> np.ndarray:
    """The seen scenes' Zipf frequencies `[num_scenes]`."""
    return zipf_frequencies(self.num_scenes, self.zipf)

  def grammar_slots(self) -> list[list[str]]:
    """`M<dir><dist> ` × max_moves, then `STOP` (`sampling.grammar.from_slots`)."""
    moves = [[f"M{d}" for d in range(8)], [f"{k} " for k in range(MAX_DIST + 1)]]
    return moves * self.max_moves + [["STOP"]]

  def _scene(self, split: str, rng: random.Random) -> int:
    if split == "train":
      k = self.train_scenes or self.num_scenes
      return rng.choices(range(k), weights=self.frequencies[:k].tolist())[0]
    if split == "unseen_map":
      return self.num_scenes + rng.randrange(self.num_unseen_scenes)
    return rng.randrange(self.num_scenes)

  def make_example(self, split: str, index: int) -> dict[str, Any]:
    return dict(self._example(split, index))

  @functools.cache  # noqa: B019 (frozen dataclass: hashable, few instances)
  def _example(self, split: str, index: int) -> dict[str, Any]:
    if split not in SPLITS:
      raise ValueError(f"aerial_nav has splits {', '.join(SPLITS)}, got {split!r}")
    rng = base.example_rng(self.name, self.seed, split, index)
    scenes = build_scenes(self.seed, self.grid, self.num_scenes + self.num_unseen_scenes)
    scene = self._scene(split, rng)
    code, obstacles = scenes[scene]
    objects = UNSEEN_OBJECTS if split == "unseen_object" else SEEN_OBJECTS
    obj = rng.choice(objects)
    free = [(x, y) for x in range(self.grid) for y in range(self.grid)
            if (x, y) not in obstacles]
    while True:
      start, goal = rng.sample(free, 2)
      if max(abs(start[0] - goal[0]), abs(start[1] - goal[1])) < 2:
        continue
      plan = expert_program(start, goal, obstacles, self.grid, self.max_moves)
      if plan is not None:
        break
    prompt = f"{code} @{start[0]}{start[1]} {obj}@{goal[0]}{goal[1]}"
    if self.show_offset:  # the goal relative to the start, e.g. `d+3-2`
      prompt += f" d{goal[0] - start[0]:+d}{goal[1] - start[1]:+d}"
    prompt += "\n"
    freq = float(self.frequencies[scene]) if scene < self.num_scenes else 0.0
    meta = dict(scene=scene, freq=freq, head=bool(scene < self.num_head_scenes),
                obstacles=sorted(obstacles), start=start, goal=goal, object=obj,
                expert_moves=len(plan))
    return base.make_record(self.name, index, prompt, f"{goal[0]}{goal[1]}",
                            format_program(plan, self.max_moves), meta)

  def outcome(self, record: Mapping[str, Any], completion: str) -> dict[str, Any]:
    """`parsed`, `success`, `collided`, `progress` and `end` of one completion."""
    meta = base.parse_meta(record)
    moves = parse_program(completion, self.max_moves)
    if moves is None:
      return dict(parsed=False, success=False, collided=False, progress=0.0, end=None)
    start, goal = tuple(meta["start"]), tuple(meta["goal"])
    obstacles = {tuple(c) for c in meta["obstacles"]}
    success, collided, end = execute(moves, start, goal, obstacles, self.grid)

    def dist(a):
      return max(abs(a[0] - goal[0]), abs(a[1] - goal[1]))

    progress = max(0.0, 1.0 - dist(end) / max(dist(start), 1))
    return dict(parsed=True, success=success, collided=collided, progress=progress, end=end)

  def reward(self, record: Mapping[str, Any], completion: str) -> base.Reward:
    out = self.outcome(record, completion)
    if not out["parsed"]:
      return base.Reward(0.0, 0.0)
    s = float(out["success"])
    return base.Reward(s + self.progress_weight * (1.0 - s) * out["progress"], 1.0)
