"""Countdown: reach a target from given numbers with `+ - * /` (`"countdown"`).

Prompt and demonstration (each step combines two numbers; the last line is the expression):

  Numbers: 7 45 11 5
  Target: 107
  Use each number exactly once, with + - * / and parentheses.
  ---- demonstration ----
  7+45=52
  11*5=55
  52+55=107
  #### 7+45+11*5

Rules the verifier enforces: the final line is `#### <expression>` over integer literals,
`+ - * /` (only the task's operations) and parentheses, no unary minus; evaluated exactly with
fractions, it must equal the target; with `use_all=True` the literals are exactly the given
numbers (as a multiset), otherwise a sub-multiset of them. The rules travel in the record's
`meta`, so a stored record is scored the same whatever knobs the scoring task has.

The generator guarantees a solution by building one: it combines the numbers pairwise in a
random order with random operations, keeping every intermediate value a positive integer (the
classic game's rule), and redraws until the result lies in the target range. That expression
is the reference solution.

Reward: `correct` 1 when the expression follows the rules and hits the target; `format` 1 when
the completion ends with exactly one `####` line holding a well-formed expression.
"""

from __future__ import annotations

import collections
import dataclasses
import random
from collections.abc import Mapping
from fractions import Fraction
from typing import Any, NamedTuple

from jaxrl_post.tasks import base, expressions

_OPERATIONS = "+-*/"
_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}
_LITERAL_PRECEDENCE = 3
# Draws per example before giving up; a feasible setting needs a handful, so hitting this
# means the knobs leave (almost) no solvable target.
_MAX_ATTEMPTS = 10_000


class _Node(NamedTuple):
  value: int
  text: str
  precedence: int


@base.TASKS.register("countdown")
@dataclasses.dataclass(frozen=True)
class CountdownTask(base.Task):
  """Reach a target number from a few given numbers.

  Attributes:
    seed: varies the whole stream of examples.
    num_numbers: how many numbers are given (>= 2).
    min_number: smallest given number (>= 1).
    max_number: largest given number.
    min_target: smallest target.
    max_target: largest target.
    operations: the allowed operators, a subset of `"+-*/"`.
    use_all: each number must be used exactly once; if False, at most once.
  """

  name = "countdown"

  seed: int = 0
  num_numbers: int = 4
  min_number: int = 1
  max_number: int = 50
  min_target: int = 10
  max_target: int = 200
  operations: str = "+-*/"
  use_all: bool = True

  def __post_init__(self):
    if self.num_numbers < 2:
      raise ValueError(f"num_numbers must be >= 2, got {self.num_numbers}")
    if not 1 <= self.min_number <= self.max_number:
      raise ValueError(
        f"need 1 <= min_number <= max_number, got {self.min_number} and {self.max_number}"
      )
    if not 1 <= self.min_target <= self.max_target:
      raise ValueError(
        f"need 1 <= min_target <= max_target, got {self.min_target} and {self.max_target}"
      )
    if len(str(max(self.max_number, self.max_target))) > expressions.MAX_LITERAL_DIGITS:
      raise ValueError(f"numbers and targets must have <= {expressions.MAX_LITERAL_DIGITS} digits")
    if not self.operations or set(self.operations) - set(_OPERATIONS):
      raise ValueError(f"operations must be a non-empty string over {_OPERATIONS!r}, got "
                       f"{self.operations!r}")

  def make_example(self, split: str, index: int) -> dict[str, Any]:
    rng = base.example_rng(self.name, self.seed, split, index)
    for _ in range(_MAX_ATTEMPTS):
      numbers = [rng.randint(self.min_number, self.max_number) for _ in range(self.num_numbers)]
      solved = self._build_solution(numbers, rng)
      if solved is not None and self.min_target <= solved[0].value <= self.max_target:
        break
    else:
      raise ValueError(
        f"found no target in [{self.min_target}, {self.max_target}] after {_MAX_ATTEMPTS} draws "
        f"of {self.num_numbers} numbers in [{self.min_number}, {self.max_number}] with "
        f"operations {self.operations!r}; widen the target range"
      )
    solution, steps = solved
    rule = "exactly once" if self.use_all else "at most once"
    operators = " ".join(op for op in _OPERATIONS if op in self.operations)
    prompt = (
      f"Numbers: {' '.join(map(str, numbers))}\n"
      f"Target: {solution.value}\n"
      f"Use each number {rule}, with {operators} and parentheses.\n"
    )
    demonstration = "\n".join([*steps, f"{base.FINAL_ANSWER_MARKER} {solution.text}"])
    meta = {
      "numbers": numbers,
      "target": solution.value,
      "use_all": self.use_all,
      "operations": self.operations,
      "solution": solution.text,
    }
    return base.make_record(self.name, index, prompt, str(solution.value), demonstration, meta)

  def reward(self, record: Mapping[str, Any], completion: str) -> base.Reward:
    answer = base.final_answer(completion)
    if answer is None:
      return base.Reward(0.0, 0.0)
    try:
      evaluation = expressions.evaluate(answer)
    except expressions.ExpressionError:
      return base.Reward(0.0, 0.0)
    meta = base.parse_meta(record)
    used = collections.Counter(evaluation.literals)
    given = collections.Counter(meta["numbers"])
    numbers_ok = used == given if meta["use_all"] else used <= given
    operations_ok = set(answer) & set(_OPERATIONS) <= set(meta["operations"])
    correct = (
      numbers_ok
      and operations_ok
      and evaluation.value is not None
      and evaluation.value == Fraction(meta["target"])
    )
    return base.Reward(float(correct), 1.0)

  def _build_solution(
    self, numbers: list[int], rng: random.Random
  ) -> tuple[_Node, list[str]] | None:
    """Combines all `numbers` into one expression; `None` when a pair admits no operation."""
    nodes = [_Node(n, str(n), _LITERAL_PRECEDENCE) for n in numbers]
    steps = []
    while len(nodes) > 1:
      i, j = rng.sample(range(len(nodes)), 2)
      left, right = nodes[i], nodes[j]
      allowed = [op for op in self.operations if _keeps_positive_integer(left, op, right)]
      if not allowed:
        return None
      op = rng.choice(allowed)
      node = _combine(left, op, right)
      steps.append(f"{left.value}{op}{right.value}={node.value}")
      nodes = [n for k, n in enumerate(nodes) if k not in (i, j)] + [node]
    return nodes[0], steps


def _keeps_positive_integer(left: _Node, op: str, right: _Node) -> bool:
  if op == "-":
    return left.value > right.value
  if op == "/":
    return left.value % right.value == 0
  return True


def _combine(left: _Node, op: str, right: _Node) -> _Node:
  """The node for `left op right`, parenthesising operands only where precedence needs it."""
  precedence = _PRECEDENCE[op]
  left_text = left.text if left.precedence >= precedence else f"({left.text})"
  # `a-(b-c)` and `a/(b*c)` need their parentheses; `a+(b-c)` and `a*(b/c)` do not.
  right_bare = right.precedence > precedence or (right.precedence == precedence and op in "+*")
  right_text = right.text if right_bare else f"({right.text})"
  value = {
    "+": left.value + right.value,
    "-": left.value - right.value,
    "*": left.value * right.value,
    "/": left.value // right.value,
  }[op]
  return _Node(value, f"{left_text}{op}{right_text}", precedence)
