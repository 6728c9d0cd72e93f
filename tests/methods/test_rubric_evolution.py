"""CARE's host logic (jaxrl_post/methods/rubric_evolution.py): the arithmetic criterion library,
the choice of the criterion to add, the capped evolution of a rubric row, and one step of rubric
rewards and decisions, with hand-checked numbers."""

import doctest

import ml_collections
import numpy as np
import pytest

from jaxrl_post.methods import rubric_evolution as re_
from jaxrl_post.rewards.rubrics import ADAPTIVE, CHASE, NONE
from jaxrl_post.tasks import get_task

TASK = get_task("arith", min_digits=1, max_digits=3, num_operands=2, operations="+-",
                demo_slip=0.0)
R0, R1 = TASK.make_example("train", 0), TASK.make_example("train", 1)  # 83+62=145, 6+4=10
LIB = re_.arith_library()
NAMES = [c.name for c in LIB]


def _names(record, text):
  return [n for n, ok in zip(NAMES, re_.criterion_passes(LIB, record, text), strict=True) if ok]


def _config(mode="care", max_criteria=0, initial="final_line,worked_steps"):
  return ml_collections.ConfigDict(dict(
    rubric=dict(mode=mode, library="arith", initial=initial, max_criteria=max_criteria),
    group_size=3, advantage_eps=1e-6, num_train_examples=4))


def test_records_are_the_ones_the_numbers_assume():
  assert (R0["prompt"], R0["answer"]) == ("Q: 83+62=\n", "145")
  assert (R1["prompt"], R1["answer"]) == ("Q: 6+4=\n", "10")


def test_arith_library_by_hand():
  assert NAMES == ["final_line", "worked_steps", "restates_expression", "last_digit",
                   "num_digits", "exact"]
  assert _names(R0, R0["demonstration"]) == NAMES  # the anchor passes everything
  assert _names(R0, "#### 145") == ["final_line", "last_digit", "num_digits", "exact"]
  # Hackable criteria: steps, the restated expression and the last digit, yet wrong.
  assert _names(R0, "83+62=1\n#### 155") == NAMES[:5]
  assert _names(R0, "#### 1455") == ["final_line", "last_digit"]
  assert _names(R0, "3=3\n#### -45") == ["final_line", "worked_steps", "last_digit"]
  assert _names(R0, "garbage") == []
  assert _names(R0, "#### 145\n#### 145") == []  # two answer lines: no final answer
  assert _names(R0, "1=1\n#### -145") == ["final_line", "worked_steps", "last_digit"]
  with pytest.raises(ValueError, match=r"record\['answer'\]"):
    re_.criterion_passes(LIB, {"answer": "x", "meta": "{}"}, "#### 1")


def test_choose_criterion_by_hand():
  anchor = np.ones(6, bool)
  best = np.array([1, 1, 1, 1, 1, 0], bool)  # a hacked y*: everything but the exact answer
  assert re_.choose_criterion(ADAPTIVE, [0, 1], anchor, best) == 5
  best = np.array([1, 0, 0, 1, 1, 1], bool)  # right answer, no steps shown
  assert re_.choose_criterion(ADAPTIVE, [0], anchor, best) == 1  # loosest separating one
  assert re_.choose_criterion(CHASE, [0, 1], anchor, best) == 2  # sharper than id 1
  assert re_.choose_criterion(CHASE, [0, 5], anchor, best) == 1  # none sharper: loosest
  assert re_.choose_criterion(NONE, [0], anchor, best) == -1
  # The anchor must pass the criterion: nothing to add when it fails the separating ones.
  anchor = np.array([1, 1, 0, 1, 1, 1], bool)
  assert re_.choose_criterion(CHASE, [0, 1], anchor, best) == -1
  assert re_.choose_criterion(ADAPTIVE, [0, 1, -1], np.ones(6, bool), np.ones(6, bool)) == -1


def test_evolve_rubric_caps_originals_first_then_newest():
  ids, w = re_.evolve_rubric(np.array([0, 1, 3, 5]), np.array([1, 1, 1, 2], np.float32), 2, LIB,
                             initial_count=2, max_criteria=4)
  assert ids.tolist() == [0, 1, 5, 2] and w.tolist() == [1, 1, 2, 1]
  ids, w = re_.evolve_rubric(np.array([0, 1, -1, -1]), np.array([1, 1, 0, 0], np.float32), 5,
                             LIB, initial_count=2, max_criteria=4)
  assert ids.tolist() == [0, 1, 5, -1] and w.tolist() == [1, 1, 2, 0]
  same = re_.evolve_rubric(np.array([0, 1, -1]), np.ones(3), -1, LIB, initial_count=2,
                           max_criteria=3)
  assert same[0].tolist() == [0, 1, -1]


def _step(part, anchor_correct=(1.0, 1.0)):
  texts = ["83+62=0\n#### 155", "#### 145", "hello",  # prompt 0: a hacked top rollout
           "#### 10", "#### 7", "x"]  # prompt 1: right answer, no steps shown
  correct = np.array([TASK.reward(r, t).correct for r, t in
                      zip([R0] * 3 + [R1] * 3, texts, strict=True)], np.float32)
  return part.score([R0, R1], texts, correct, np.asarray(anchor_correct, np.float32))


def test_care_step_by_hand():
  part = re_.RubricEvolution(_config(), TASK)
  assert part.max_criteria == 4  # PROPOSAL: 2 × the 2 initial criteria
  out = _step(part)
  # Rubric [final_line, worked_steps], weights 1, 1: pass fractions.
  np.testing.assert_allclose(out.scores, [[1.0, 0.5, 0.0], [0.5, 0.5, 0.0]])
  # Prompt 0: y* (1.0) ties the anchor (1.0) and is wrong → ADAPTIVE, and only `exact` separates.
  # Prompt 1: y* = the first 0.5 ("#### 10", right); the anchor scores 1 and wins the tie →
  # CHASE; the loosest separating criterion sharper than worked_steps is restates_expression.
  assert out.decisions.tolist() == [ADAPTIVE, CHASE]
  assert out.added.tolist() == [5, 2]
  part.state = out.state
  assert part.state.ids[R0["index"]].tolist() == [0, 1, 5, -1]
  assert part.state.weights[R0["index"]].tolist() == [1, 1, 2, 0]
  assert part.state.ids[R1["index"]].tolist() == [0, 1, 2, -1]
  assert part.state.ids[2].tolist() == [0, 1, -1, -1]  # undrawn prompts keep their rubric
  # Next time: the hack is closed, the right answer now outscores it under prompt 0's rubric.
  again = _step(part)
  np.testing.assert_allclose(again.scores, [[2 / 4, 3 / 4, 0.0], [1 / 3, 1 / 3, 0.0]])
  # A wrong anchor: the judge prefers a right y* → NONE, nothing added.
  none = _step(part, anchor_correct=(0.0, 0.0))
  assert none.decisions.tolist() == [NONE, NONE] and none.added.tolist() == [-1, -1]


def test_weighted_scores_match_a_loop():
  part = re_.RubricEvolution(_config(initial="final_line,exact,last_digit"), TASK)
  texts = ["#### 145", "#### 155", "#### 7", "#### 10", "1=1\n#### 0", "nothing"]
  out = part.score([R0, R1], texts, np.zeros(6), np.ones(2))
  weights = {"final_line": 1.0, "exact": 2.0, "last_digit": 1.0}
  for i, text in enumerate(texts):
    record = (R0, R1)[i // 3]
    passed = _names(record, text)
    expected = sum(w for n, w in weights.items() if n in passed) / sum(weights.values())
    assert out.scores.reshape(-1)[i] == pytest.approx(expected), text


def test_static_mode_keeps_the_rubric_but_logs_decisions():
  part = re_.RubricEvolution(_config(mode="static"), TASK)
  before = part.state.ids.copy()
  out = _step(part)
  assert out.decisions.tolist() == [ADAPTIVE, CHASE] and out.added.tolist() == [-1, -1]
  np.testing.assert_array_equal(out.state.ids, before)


def test_cap_holds_over_many_steps():
  part = re_.RubricEvolution(_config(max_criteria=3), TASK)
  for _ in range(4):
    part.state = _step(part).state
  sizes = (part.state.ids >= 0).sum(axis=1)
  assert sizes.max() == 3
  assert (part.state.ids[:, :2] == [0, 1]).all()  # the originals are never dropped


def test_array_state_round_trip_and_errors():
  part = re_.RubricEvolution(_config(), TASK)
  part.state = _step(part).state
  other = re_.RubricEvolution(_config(), TASK)
  other.load_array_state(part.array_state())
  np.testing.assert_array_equal(other.state.ids, part.state.ids)
  with pytest.raises(ValueError, match="num_train_examples"):
    re_.RubricEvolution(_config(max_criteria=5), TASK).load_array_state(part.array_state())
  with pytest.raises(ValueError, match="num_prompts"):
    re_.rubric_init(0, [0], [1.0], 2)
  with pytest.raises(ValueError, match="max_criteria"):
    re_.rubric_init(2, [0, 1, 2], [1.0] * 3, 2)
  with pytest.raises(ValueError, match="group_size"):
    part.score([R0], ["#### 1"], np.zeros(1), np.ones(1))
  with pytest.raises(ValueError, match="rubric pool"):
    part.score([dict(R0, index=4)], ["a", "b", "c"], np.zeros(3), np.ones(1))
  with pytest.raises(ValueError, match="world_model"):
    config = _config()
    config.world_model = dict(name="verifier")
    re_.RubricEvolution(config, TASK)


def test_doctests():
  doctest.testmod(re_, raise_on_error=True)
