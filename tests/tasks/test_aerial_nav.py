"""The synthetic aerial navigation task (RecoverFly's §5.3 analogue): closed-loop execution with
compounding errors, the action grammar (every legal completion parses), splits, Zipf scenes."""

import doctest
import json

import numpy as np
import pytest

from jaxrl_post.sampling import grammar as grammar_lib
from jaxrl_post.tasks import aerial_nav, base, get_task
from jaxrl_post.tasks.aerial_nav import (
  SEEN_OBJECTS,
  UNSEEN_OBJECTS,
  AerialNavTask,
  execute,
  expert_program,
  format_program,
  parse_program,
)
from jaxrl_post.tokenizers import CharTokenizer


def test_doctests():
  assert doctest.testmod(aerial_nav).failed == 0


def test_execution_compounds_and_collisions_end_the_episode():
  # 5×5 map, a wall on row 2 except its gap at x = 4.
  wall = {(x, 2) for x in range(4)}
  # Right plan: E 4 to (4, 0), N 4 through the gap to (4, 4), W 2 to (2, 4).
  plan = [(0, 4), (2, 4), (4, 2)]
  assert execute(plan, (0, 0), (2, 4), wall, 5) == (True, False, (2, 4))
  # One cell short on the first move: the error carries over, N hits the wall at (3, 2).
  short = [(0, 3), (2, 4), (4, 2)]
  assert execute(short, (0, 0), (2, 4), wall, 5) == (False, True, (3, 1))
  # Leaving the map is a collision too; a hover (dist 0) does nothing.
  assert execute([(4, 1)], (0, 0), (0, 0), set(), 5) == (False, True, (0, 0))
  assert execute([(3, 0), (0, 0)], (1, 1), (1, 1), set(), 5) == (True, False, (1, 1))
  # Diagonal steps move both coordinates: NE 2 from (0, 0).
  assert execute([(1, 2)], (0, 0), (2, 2), set(), 5)[0]


def test_parse_format_and_expert():
  assert parse_program("M04 M21 M00 STOP", 3) == [(0, 4), (2, 1), (0, 0)]
  for bad in ("M04 M21 STOP", "M04 M21 M00", "M84 M21 M00 STOP", "M05 M21 M00 STOP", None, ""):
    assert parse_program(bad, 3) is None
  assert format_program([(1, 2)], 3) == "M12 M00 M00 STOP"
  wall = {(x, 2) for x in range(4)}
  plan = expert_program((0, 0), (2, 4), wall, 5, 3)  # E 2, NE 2 through the gap, NW 2
  assert plan == [(0, 2), (1, 2), (3, 2)] and execute(plan, (0, 0), (2, 4), wall, 5)[0]
  assert expert_program((0, 0), (2, 4), wall, 5, 2) is None  # needs three moves
  assert expert_program((0, 0), (4, 4), set(), 5, 1) == [(1, 4)]


def test_grammar_makes_every_completion_parse():
  task = AerialNavTask(max_moves=3)
  tokenizer = CharTokenizer()
  grammar = grammar_lib.from_slots(tokenizer, task.grammar_slots())
  allowed, nxt = np.asarray(grammar.allowed), np.asarray(grammar.next_state)
  eos = list(tokenizer.end_ids)
  rng = np.random.default_rng(0)
  record = task.make_example("train", 0)
  for _ in range(200):  # random walks through the automaton = sampled constrained completions
    state, tokens = int(grammar.start), []
    while True:
      token = int(rng.choice(np.flatnonzero(allowed[state])))
      tokens.append(token)
      if token in eos:
        break
      state = int(nxt[state, token])
    assert grammar_lib.accepts(grammar, tokens, eos)
    text = tokenizer.decode(tokens[:-1])
    assert parse_program(text, 3) is not None, text
    assert task.reward(record, text).format == 1.0
  # Choice states: 8 directions, 5 distances; every other state forces one token (or EOS).
  legal = allowed[:-1].sum(1)
  assert sorted(set(legal.tolist())) == [1, 5, 8]


def test_splits_scenes_and_rewards():
  task = get_task("aerial_nav", max_moves=3, progress_weight=0.5)
  metas = {}
  for split in ("train", "test", "unseen_map", "unseen_object"):
    rows = [task.make_example(split, i) for i in range(60)]
    metas[split] = [json.loads(r["meta"]) for r in rows]
    for r in rows:
      assert task.reward(r, r["demonstration"]) == (1.0, 1.0)  # the expert succeeds
      assert task.reward(r, "garbage") == (0.0, 0.0)
  assert all(m["scene"] < task.num_scenes for m in metas["train"] + metas["test"])
  assert all(m["scene"] >= task.num_scenes for m in metas["unseen_map"])
  assert all(m["object"] in UNSEEN_OBJECTS for m in metas["unseen_object"])
  assert all(m["object"] in SEEN_OBJECTS for m in metas["train"])
  # The train split's scenes follow the Zipf frequencies (head scenes dominate).
  counts = np.bincount([json.loads(task.make_example("train", i)["meta"])["scene"]
                        for i in range(400)], minlength=task.num_scenes)
  assert counts[0] > counts[-1] and counts[0] / 400 == pytest.approx(task.frequencies[0], abs=0.08)
  # Progress shaping: hovering in place scores 0, half-way scores w·0.5.
  record = task.make_example("test", 1)
  assert task.reward(record, "M00 M00 M00 STOP").correct == 0.0
  hand = base.make_record("aerial_nav", 0, "x\n", "44", "",
                          dict(start=(0, 0), goal=(4, 4), obstacles=[[3, 3]]))
  # NE 2 to (2, 2): Chebyshev distance 4 → 2, progress 0.5, correct = 0.5·(1 − 0)·0.5.
  assert task.reward(hand, "M12 M00 M00 STOP") == (0.25, 1.0)
  # NE 4 hits (3, 3) after (2, 2): the same progress, still no success.
  assert task.reward(hand, "M14 M00 M00 STOP") == (0.25, 1.0)
  assert task.make_example("train", 5) == task.make_example("train", 5)  # pure


@pytest.mark.parametrize("knob,value", [("grid", 2), ("max_moves", 0), ("progress_weight", 2.0),
                                        ("num_head_scenes", 99), ("zipf", -1.0)])
def test_bad_knobs_name_the_key(knob, value):
  with pytest.raises(ValueError, match=f"task_knobs.{knob}"):
    AerialNavTask(**{knob: value})
  with pytest.raises(ValueError, match="splits"):
    AerialNavTask().make_example("valid", 0)
