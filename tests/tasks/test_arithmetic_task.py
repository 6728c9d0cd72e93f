"""Arithmetic: worked-solution golden, every step true, knobs, verifier goldens."""

import re

import pytest

from jaxrl_post.tasks import arithmetic, get_task

# The module docstring's example, computed by hand: 345*26 = 2070 + 6900 = 8970, then
# 12 + 8970 = 8982, then 8982 - 7 = 8975.
GOLDEN_STEPS = """\
345*26:
345*6: 5*6+0=30, 4*6+3=27, 3*6+2=20
345*6=2070
345*2: 5*2+0=10, 4*2+1=9, 3*2+0=6
345*20=6900
2070+6900: 0+0+0=0, 7+0+0=7, 0+9+0=9, 2+6+0=8
2070+6900=8970
345*26=8970
now: 12+8970-7
12+8970: 2+0+0=2, 1+7+0=8, 0+9+0=9, 0+8+0=8
12+8970=8982
now: 8982-7
8982-7: 12-7-0=5, 8-0-1=7, 9-0-0=9, 8-0-0=8
8982-7=8975"""

_CLAUSE_RE = re.compile(r"[-+*()0-9]+=[-+*()0-9]+")


def _eval(expression):
  # Test-only reference evaluator; the regex above admits digits, + - * and parentheses only.
  return eval(expression, {"__builtins__": {}})  # noqa: S307


def test_worked_solution_golden():
  value, steps = arithmetic._worked_solution([12, 345, 26, 7], ["+", "*", "-"])
  assert value == 8975
  assert "\n".join(steps) == GOLDEN_STEPS
  assert GOLDEN_STEPS in arithmetic.__doc__.replace("\n  ", "\n")


def test_negative_differences_are_rewritten():
  # 58-347 = -(347-58) = -289; then -289+3 = -(289-3) = -286.
  value, steps = arithmetic._worked_solution([58, 347, 3], ["-", "+"])
  assert value == -286
  assert steps[0] == "58-347=-(347-58)"
  assert "-289+3=-(289-3)" in steps and steps[-1] == "-289+3=-286"


@pytest.mark.parametrize(
  "knobs",
  [
    {},
    {"min_digits": 2, "max_digits": 4, "num_operands": 4},
    {"operations": "-", "num_operands": 5},
    {"operations": "*", "min_digits": 3, "max_digits": 3, "num_operands": 3},
  ],
)
def test_every_step_is_true_and_the_answer_matches_python(knobs):
  task = get_task("arith", **knobs)
  for index in range(80):
    record = task.make_example("train", index)
    expression = record["prompt"].removeprefix("Q: ").removesuffix("=\n")
    assert int(record["answer"]) == _eval(expression)
    *steps, final = record["demonstration"].split("\n")
    assert final == f"#### {record['answer']}"
    for line in steps:
      if line.startswith("now: "):
        continue
      # `1a-b-c=d` marks a borrow: it reads as the true equation (10+a)-b-c=d.
      for clause in _CLAUSE_RE.findall(line.split(": ")[-1]):
        lhs, rhs = clause.split("=")
        assert _eval(lhs) == _eval(rhs), (line, record["prompt"])


def test_difficulty_knobs():
  task = get_task("arith", min_digits=2, max_digits=3, num_operands=4, operations="+*")
  lengths = set()
  for index in range(100):
    expression = task.make_example("train", index)["prompt"][3:-2]
    operands = re.split(r"[-+*]", expression)
    assert len(operands) == 4
    assert set(re.findall(r"[-+*]", expression)) <= {"+", "*"}
    lengths |= {len(x) for x in operands}
  assert lengths == {2, 3}

  def mean_length(**knobs):
    t = get_task("arith", **knobs)
    return sum(len(t.make_example("train", i)["demonstration"]) for i in range(50)) / 50

  # More digits and operands give longer worked solutions.
  assert mean_length(max_digits=1) < mean_length(max_digits=3) < mean_length(
    min_digits=4, max_digits=5, num_operands=3
  )


@pytest.mark.parametrize(
  "knobs, match",
  [
    ({"min_digits": 0}, "min_digits"),
    ({"min_digits": 3, "max_digits": 2}, "min_digits <= max_digits"),
    ({"num_operands": 1}, "num_operands"),
    ({"operations": "/"}, "operations"),
    ({"operations": ""}, "operations"),
  ],
)
def test_invalid_knobs(knobs, match):
  with pytest.raises(ValueError, match=match):
    get_task("arith", **knobs)


@pytest.mark.parametrize(
  "completion, expected",
  [
    ("7+8+0=15\n#### 405", (1.0, 1.0)),
    ("#### 405", (1.0, 1.0)),  # Steps are not required, only the answer line.
    ("#### 0405", (1.0, 1.0)),
    ("#### 406", (0.0, 1.0)),
    ("#### -405", (0.0, 1.0)),
    ("405", (0.0, 0.0)),
    ("The answer is 405.", (0.0, 0.0)),
    ("#### 405.0", (0.0, 0.0)),
    ("#### +405", (0.0, 0.0)),
    ("#### 4 05", (0.0, 0.0)),
    ("#### 405\n#### 405", (0.0, 0.0)),
    ("#### ４０５", (0.0, 0.0)),
    ("", (0.0, 0.0)),
  ],
)
def test_reward_goldens(completion, expected):
  record = {"answer": "405", "meta": '{"expression":"347+58"}'}
  assert get_task("arith").reward(record, completion) == expected


def test_negative_answers_verify():
  task = get_task("arith", operations="-", num_operands=3)
  records = [task.make_example("test", i) for i in range(40)]
  negatives = [r for r in records if r["answer"].startswith("-")]
  assert negatives
  for record in negatives:
    assert task.reward(record, f"#### {record['answer']}") == (1.0, 1.0)
    assert task.reward(record, f"#### {record['answer'][1:]}") == (0.0, 1.0)


# ---- demo_slip: a sloppy teacher ----

def _always(_=None):
  return lambda: True


def test_dropped_carries_golden():
  # 47+38 with the carry dropped: 7+8+0=15, 4+3+0=7 → 75 (true 85).
  assert arithmetic._addition_columns(47, 38, _always()) == ("7+8+0=15, 4+3+0=7", 75)
  # 52-38 with the borrow dropped: 12-8-0=4 borrows, the next column ignores it → 24 (true 14).
  assert arithmetic._subtraction_columns(52, 38, _always()) == ("12-8-0=4, 5-3-0=2", 24)
  # 47*3 with the product carry dropped: 7*3+0=21, 4*3+0=12 → 121 (true 141).
  assert arithmetic._digit_product_columns(47, 3, _always()) == ("7*3+0=21, 4*3+0=12", 121)
  # Without slips the same functions give the true values.
  assert arithmetic._addition_columns(47, 38)[1] == 85
  assert arithmetic._subtraction_columns(52, 38)[1] == 14
  assert arithmetic._digit_product_columns(47, 3)[1] == 141


def test_slipped_demonstration_is_consistent_and_wrong():
  value, lines = arithmetic._worked_solution([47, 38], ["+"], _always())
  assert (value, lines) == (75, ["47+38: 7+8+0=15, 4+3+0=7", "47+38=75"])
  # A slip inside a product propagates into the next operation.
  # 47*3 slips to 121; 121+9: 1+9+0=10, then the carry is dropped again → 120 (true 150).
  value, lines = arithmetic._worked_solution([47, 3, 9], ["*", "+"], _always())
  assert (value, lines) == (120, ["47*3: 7*3+0=21, 4*3+0=12", "47*3=121", "now: 121+9",
                                  "121+9: 1+9+0=10, 2+0+0=2, 1+0+0=1", "121+9=120"])


def test_demo_slip_changes_only_demonstrations():
  clean = get_task("arith", demo_slip=0.0)
  sloppy = get_task("arith", demo_slip=0.5)
  wrong, with_carry = 0, 0
  for i in range(400):
    a, b = clean.make_example("train", i), sloppy.make_example("train", i)
    assert (a["prompt"], a["answer"]) == (b["prompt"], b["answer"])
    assert clean.reward(a, a["demonstration"]).correct == 1.0
    has_carry = a["demonstration"] != b["demonstration"] or "+1=" in a["demonstration"] \
        or "-1=" in a["demonstration"]
    with_carry += has_carry
    wrong += sloppy.reward(b, b["demonstration"]).correct == 0.0
  # Slips only happen where there is a carry / borrow, and each is dropped half the time, so
  # between a quarter and all of those demonstrations end wrong; none of the others do.
  assert 0.25 * with_carry < wrong < with_carry


def test_demo_slip_out_of_range():
  with pytest.raises(ValueError, match="demo_slip"):
    get_task("arith", demo_slip=1.5)
