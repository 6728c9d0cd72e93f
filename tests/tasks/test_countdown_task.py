"""Countdown: solvability of generated examples, the verifier's rules, the expression parser."""

import json
from fractions import Fraction

import pytest

from jaxrl_post.tasks import expressions, get_task


def _record(numbers, target, *, use_all=True, operations="+-*/"):
  meta = {"numbers": numbers, "target": target, "use_all": use_all, "operations": operations}
  return {"answer": str(target), "meta": json.dumps(meta)}


@pytest.mark.parametrize(
  "knobs",
  [
    {},
    {"num_numbers": 2, "max_number": 10, "min_target": 1, "max_target": 100},
    {"num_numbers": 6, "max_number": 100, "min_target": 100, "max_target": 999},
    {"operations": "-/", "num_numbers": 3, "max_number": 100, "min_target": 1, "max_target": 50},
    {"use_all": False, "operations": "+*"},
  ],
)
def test_reference_solutions_verify(knobs):
  task = get_task("countdown", **knobs)
  for index in range(150):
    record = task.make_example("train", index)
    meta = json.loads(record["meta"])
    assert len(meta["numbers"]) == task.num_numbers
    assert all(task.min_number <= n <= task.max_number for n in meta["numbers"])
    assert task.min_target <= meta["target"] <= task.max_target
    assert record["answer"] == str(meta["target"])
    assert task.reward(record, record["demonstration"]) == (1.0, 1.0)
    # Each step combines two current numbers into a positive integer, as the prompt's game.
    *steps, final = record["demonstration"].split("\n")
    assert final == f"#### {meta['solution']}" and len(steps) == task.num_numbers - 1
    for step in steps:
      lhs, rhs = step.split("=")
      assert expressions.evaluate(lhs).value == int(rhs) > 0
    assert set(meta["solution"]) - set("0123456789()") <= set(task.operations)


def test_prompt_states_numbers_target_and_rule():
  record = get_task("countdown", use_all=False, operations="*+").make_example("train", 3)
  meta = json.loads(record["meta"])
  lines = record["prompt"].split("\n")
  assert lines[0] == "Numbers: " + " ".join(map(str, meta["numbers"]))
  assert lines[1] == f"Target: {meta['target']}"
  assert lines[2] == "Use each number at most once, with + * and parentheses."


GOLDEN = _record([7, 45, 11, 5], 107)


@pytest.mark.parametrize(
  "completion, expected",
  [
    ("#### 7+45+11*5", (1.0, 1.0)),
    ("7+45=52\n11*5=55\n52+55=107\n#### 11*5+45+7", (1.0, 1.0)),
    ("#### (7+45)+(11*5)", (1.0, 1.0)),
    ("####  7 + 45 + 11 * 5 ", (1.0, 1.0)),
    ("#### ((7+45)+((11)*5))", (1.0, 1.0)),
    ("#### 7+45+11+5", (0.0, 1.0)),  # 68, not 107.
    ("#### 45+45+11+5+1", (0.0, 1.0)),  # 45 twice, 7 unused, 1 not given.
    ("#### 45+11*5+7+0", (0.0, 1.0)),  # 0 is not a given number.
    ("#### 107", (0.0, 1.0)),  # The target itself is not a given number.
    ("#### 7/(5-5)+45", (0.0, 1.0)),  # Division by zero: well-formed, not correct.
    ("#### -7+45+11*5+14", (0.0, 0.0)),  # No unary minus.
    ("#### 7+45+11x5", (0.0, 0.0)),
    ("#### 7+45+11*5=107", (0.0, 0.0)),
    ("#### 7+45+(11*5", (0.0, 0.0)),
    ("#### 7.0+45+11*5", (0.0, 0.0)),
    ("#### 7+45+11*5\n#### 7+45+11*5", (0.0, 0.0)),
    ("7+45+11*5", (0.0, 0.0)),
    ("", (0.0, 0.0)),
  ],
)
def test_reward_goldens(completion, expected):
  assert get_task("countdown").reward(GOLDEN, completion) == expected


def test_exact_fractions_and_usage_rules():
  task = get_task("countdown")
  # 7/2*2 is exactly 7 with fractions (3.5 * 2), where integer division would give 6.
  assert task.reward(_record([7, 2, 2], 7), "#### 7/2*2") == (1.0, 1.0)
  # 1/3*3 = 1 exactly; floats would give 0.9999999999999999 for some orders.
  assert task.reward(_record([1, 3, 3], 1), "#### 1/3*3") == (1.0, 1.0)
  # A subset of the numbers: wrong with use_all, right without.
  assert task.reward(_record([7, 45, 11, 5], 52), "#### 7+45") == (0.0, 1.0)
  assert task.reward(_record([7, 45, 11, 5], 52, use_all=False), "#### 7+45") == (1.0, 1.0)
  # A repeated given number may be used as often as it is given, not more.
  assert task.reward(_record([3, 3, 4], 10), "#### 3+3+4") == (1.0, 1.0)
  assert task.reward(_record([3, 3, 4], 18, use_all=False), "#### 3*(3+4)-3") == (0.0, 1.0)
  # An operator the example does not allow.
  assert task.reward(_record([6, 4], 24, operations="+-"), "#### 6*4") == (0.0, 1.0)


def test_invalid_knobs_and_infeasible_targets():
  with pytest.raises(ValueError, match="num_numbers"):
    get_task("countdown", num_numbers=1)
  with pytest.raises(ValueError, match="min_target <= max_target"):
    get_task("countdown", min_target=10, max_target=5)
  with pytest.raises(ValueError, match="operations"):
    get_task("countdown", operations="+^")
  # Two numbers of at most 2 can never make 100.
  task = get_task("countdown", num_numbers=2, max_number=2, min_target=100, max_target=100)
  with pytest.raises(ValueError, match="widen the target range"):
    task.make_example("train", 0)


@pytest.mark.parametrize(
  "text, value, literals",
  [
    ("1+2*3", 7, (1, 2, 3)),
    ("(1+2)*3", 9, (1, 2, 3)),
    ("10-4-3", 3, (10, 4, 3)),  # Left-associative.
    ("8/4/2", 1, (8, 4, 2)),
    ("7/2", Fraction(7, 2), (7, 2)),
    ("2*(3-(4-5))", 8, (2, 3, 4, 5)),
    ("1/(2-2)", None, (1, 2, 2)),
    ("1/0*5+3", None, (1, 0, 5, 3)),
  ],
)
def test_expression_goldens(text, value, literals):
  evaluation = expressions.evaluate(text)
  assert evaluation.value == value and evaluation.literals == literals


@pytest.mark.parametrize(
  "text",
  ["", "()", "1+", "+1", "-1", "1 2", "2(3)", "(1", "1)", "1**2", "1.5", "1e3", "a",
   "1" * 13, "(" * 33 + "1" + ")" * 33, "1+" * 100 + "1", "１+1", None],
)
def test_malformed_expressions(text):
  with pytest.raises(expressions.ExpressionError):
    expressions.evaluate(text)
