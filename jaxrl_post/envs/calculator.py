"""Calculator: a chain of K operations on large numbers, one tool call each (`"calculator"`).

Episode and demonstration for horizon K = 3 (observations between the actions):

  Start at 4821, then *37 +902 -551.
  <tool>calc(4821*37)</tool>
  <obs>178377</obs>
  <tool>calc(178377+902)</tool>
  <obs>179279</obs>
  <tool>calc(179279-551)</tool>
  <obs>178728</obs>
  <answer>178728</answer>

The steps apply in order, each to the result of the previous one, and the tool does one
operation per call, so an optimal trajectory makes exactly K sequential calls: no call can be
written before the previous result is known, and the numbers are too long for a small model to
multiply in its head.

Tool: `calc(a op b)` with `op` one of `+ - * /` and `a`, `b` non-negative integer literals of at
most 12 digits (spaces allowed around them). It answers the exact value: `178377`, or `p/q`
for a quotient that is not an integer; malformed input or a division by zero gives an
`error: ...` observation.

The generator keeps every intermediate value a positive integer below
`10**max_value_digits`: subtractions never go to zero or below and products and sums that
would overflow are not drawn, so every step is a call the tool accepts.

Reward: 1 when the answer is exactly the final value as a plain integer (`173778`), else 0.

Stages (`stage_times`, Temporal GRPO's detector, arXiv 2608.13026): K + 1, step k computed (a
`calc` call returned the k-th intermediate value) for k = 1..K, then the correct answer.
"""

from __future__ import annotations

import dataclasses
import random
import re
from collections.abc import Callable, Mapping
from fractions import Fraction

from jaxrl_post.envs import base
from jaxrl_post.envs.tools import (
  ANSWER_CLOSE,
  ANSWER_OPEN,
  TOOL_CLOSE,
  TOOL_OPEN,
  ToolError,
  format_observation,
  parse_action,
)
from jaxrl_post.tasks import base as task_base

_OPERATIONS = "+-*"
# Literals of the calc tool; the bound keeps every product far from Python's slow big integers.
_MAX_LITERAL_DIGITS = 12
_OPERATION_RE = re.compile(
  rf"\s*([0-9]{{1,{_MAX_LITERAL_DIGITS}}})\s*([-+*/])\s*([0-9]{{1,{_MAX_LITERAL_DIGITS}}})\s*",
  re.ASCII,
)
# Draws per episode before giving up; a feasible setting needs one or two.
_MAX_ATTEMPTS = 1000


@base.ENVS.register("calculator")
@dataclasses.dataclass(kw_only=True)
class CalculatorEnv(base.Env):
  """Apply K operations to a start number with the `calc` tool, then answer the result.

  Attributes:
    seed: varies the whole stream of episodes.
    start_digits: digits of the start number.
    operand_digits: most digits of an operand; each operand's length is uniform from 1 up
      (within what keeps the value in range). A multiplier is at least 2.
    operations: the operators to draw from, a subset of `"+-*"`; repeating one (`"+**"`)
      makes it more likely.
    max_value_digits: every intermediate value has at most this many digits.
    instructions: end the prompt with a line stating the tool and answer format (for models
      that were not fine-tuned on demonstrations).
  """

  name = "calculator"

  seed: int = 0
  start_digits: int = 4
  operand_digits: int = 3
  operations: str = "+-*"
  max_value_digits: int = 9
  instructions: bool = False

  def __post_init__(self):
    super().__post_init__()
    if not 1 <= self.start_digits <= self.max_value_digits <= _MAX_LITERAL_DIGITS:
      raise ValueError(
        f"need 1 <= start_digits <= max_value_digits <= {_MAX_LITERAL_DIGITS} (the "
        f"calculator's literal limit), got {self.start_digits} and {self.max_value_digits}"
      )
    if self.operand_digits < 1:
      raise ValueError(f"operand_digits must be >= 1, got {self.operand_digits}")
    if not self.operations or set(self.operations) - set(_OPERATIONS):
      raise ValueError(
        f"operations must be a non-empty string over {_OPERATIONS!r}, got {self.operations!r}"
      )

  def make_episode(self, split: str, index: int) -> base.Episode:
    rng = base.example_rng(self.name, self.seed, split, index)
    for _ in range(_MAX_ATTEMPTS):
      start = _draw_integer(rng, 10 ** (self.start_digits - 1), 10**self.start_digits - 1)
      steps = self._draw_steps(rng, start)
      if steps is not None:
        break
    else:
      raise ValueError(
        f"found no chain of {self.horizon} steps with operations {self.operations!r} that stays "
        f"below 10**{self.max_value_digits} after {_MAX_ATTEMPTS} draws; allow more operations "
        "or larger values"
      )
    prompt = f"Start at {start}, then {' '.join(f'{op}{x}' for op, x in steps)}.\n"
    if self.instructions:
      prompt += (
        f"Use {TOOL_OPEN}calc(a*b){TOOL_CLOSE} per step; reply {ANSWER_OPEN}n{ANSWER_CLOSE}.\n"
      )
    demonstration, value = [], start
    for op, x in steps:
      demonstration.append(f"{TOOL_OPEN}calc({value}{op}{x}){TOOL_CLOSE}")
      value = _apply(value, op, x)
    demonstration.append(f"{ANSWER_OPEN}{value}{ANSWER_CLOSE}")
    return base.Episode(
      env=self.name,
      split=split,
      index=index,
      prompt=prompt,
      answer=str(value),
      max_turns=self.max_turns,
      demonstration=tuple(demonstration),
    )

  def tools(self, episode: base.Episode) -> Mapping[str, Callable[[str], object]]:
    del episode  # The calculator knows nothing about the problem.
    return {"calc": calc}

  def score(self, episode: base.Episode, answer: str) -> float:
    return float(task_base.parse_integer(answer) == int(episode.answer))

  def stage_detectors(self, episode: base.Episode) -> list[base.StageDetector]:
    """K + 1 stages: step k = a `calc` call that returned the k-th intermediate value v_k
    (k = 1..K, whatever expression produced it), then the correct answer.

    The values v_k are privileged state: the outputs of the demonstration's calls.
    """
    values = [calc(parse_action(action).argument) for action in episode.demonstration[:-1]]

    def step(value: str) -> base.StageDetector:
      reply = format_observation(value)
      return lambda action, observation: action.tool == "calc" and observation == reply

    return [*(step(value) for value in values), base.answer_stage(self, episode)]

  def _draw_steps(self, rng: random.Random, start: int) -> list[tuple[str, int]] | None:
    """K `(operator, operand)` steps from `start`; `None` when the value runs out of room."""
    cap = 10**self.max_value_digits - 1
    largest_operand = 10**self.operand_digits - 1
    value, steps = start, []
    for _ in range(self.horizon):
      # The operand range that keeps the result a positive integer <= cap, per operator.
      ranges = {
        "+": (1, min(largest_operand, cap - value)),
        "-": (1, min(largest_operand, value - 1)),
        "*": (2, min(largest_operand, cap // value)),
      }
      allowed = [op for op in self.operations if ranges[op][0] <= ranges[op][1]]
      if not allowed:
        return None
      op = rng.choice(allowed)
      x = _draw_integer(rng, *ranges[op])
      steps.append((op, x))
      value = _apply(value, op, x)
    return steps


def calc(expression: str) -> str:
  """The `calc` tool: the exact value of one operation `a op b`, an integer or a fraction `p/q`.

  >>> calc("4821*37"), calc(" 12 - 30 "), calc("14/4")
  ('178377', '-18', '7/2')

  Raises:
    ToolError: when `expression` is not one operation on two literals, or divides by zero.
  """
  match = _OPERATION_RE.fullmatch(expression)
  if match is None:
    raise ToolError(
      f"expected a op b with op in +-*/ and integers of <= {_MAX_LITERAL_DIGITS} digits"
    )
  a, op, b = int(match.group(1)), match.group(2), int(match.group(3))
  if op == "/":
    if b == 0:
      raise ToolError("division by zero")
    value = Fraction(a, b)
    return (
      str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"
    )
  return str(_apply(a, op, b))


def _apply(value: int, op: str, x: int) -> int:
  return {"+": value + x, "-": value - x, "*": value * x}[op]


def _draw_integer(rng: random.Random, low: int, high: int) -> int:
  """An integer in `[low, high]` whose digit count is uniform, then uniform within it.

  Uniform digit counts make short and long operands equally common, as in the arithmetic task,
  instead of nearly all operands having the maximal length.
  """
  digits = rng.randint(len(str(low)), len(str(high)))
  return rng.randint(max(low, 10 ** (digits - 1)), min(high, 10**digits - 1))
