"""Multi-digit arithmetic with a column-by-column chain of thought (`"arith"`).

Prompt and demonstration for `12+345*26-7`:

  Q: 12+345*26-7=
  ---- demonstration ----
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
  8982-7=8975
  #### 8975

Operators follow the usual precedence: products first, then sums and differences from left to
right. Column work runs from the lowest digit up: `a+b+carry=s` for sums, `a-b-borrow=d` for
differences (written `1a-b-borrow=d` when the column borrows), `a*d+carry=p` for one digit of
a product; a multi-digit multiplier adds one shifted partial product per non-zero digit.
Differences that go negative are rewritten first (`58-347=-(347-58)`), so every column
operation is on non-negative numbers. Only ASCII `+ - *` appear, so all text fits the
`CharTokenizer` alphabet.

`demo_slip` > 0 makes the demonstrations those of a sloppy teacher: each carry, borrow or
product carry is dropped (written as 0) with that probability, and the rest of the worked
solution, its final answer included, follows from the slip. Prompts, answers and the verifier are
unchanged, so a model imitating the teacher inherits its slips and only the reward can remove
them: a test bed for "RL exceeds its demonstrations" (SFT numbers in docs/results.md).

`ArithmeticTask.golden_negative(record)` is this task's Golden Negative Trajectory (GNT,
ReflectRL, arXiv 2608.03972): the worked solution with exactly one carry or borrow dropped, so
a long valid prefix, one local error and a wrong final answer; None when the problem has no
carry or borrow whose loss changes the answer.

Reward: `correct` is 1 when the final line `#### <integer>` equals the value; `format` is 1 when
the completion ends with exactly one such line (see `base.final_answer`).
"""

from __future__ import annotations

import dataclasses
import random
import re
from collections.abc import Callable, Mapping
from typing import Any

from jaxrl_post.tasks import base

_OPERATIONS = "+-*"


@base.TASKS.register("arith")
@dataclasses.dataclass(frozen=True)
class ArithmeticTask(base.Task):
  """Integer expressions such as `347+58*12=` to evaluate, with worked steps.

  Attributes:
    seed: varies the whole stream of examples.
    min_digits: fewest digits of an operand (>= 1).
    max_digits: most digits of an operand; each operand's length is uniform in between.
    num_operands: operands per expression (>= 2).
    operations: the operators to draw from, each uniformly, a subset of `"+-*"`; repeating one
      (`"++*"`) makes it more likely.
    demo_slip: probability in [0, 1] that the demonstration drops each carry or borrow (see
      the module docstring); 0 gives correct demonstrations.
  """

  name = "arith"

  seed: int = 0
  min_digits: int = 1
  max_digits: int = 3
  num_operands: int = 2
  operations: str = "+-*"
  demo_slip: float = 0.0

  def __post_init__(self):
    if not 1 <= self.min_digits <= self.max_digits:
      raise ValueError(
        f"need 1 <= min_digits <= max_digits, got {self.min_digits} and {self.max_digits}"
      )
    if self.num_operands < 2:
      raise ValueError(f"num_operands must be >= 2, got {self.num_operands}")
    if not self.operations or set(self.operations) - set(_OPERATIONS):
      raise ValueError(f"operations must be a non-empty string over {_OPERATIONS!r}, got "
                       f"{self.operations!r}")
    if not 0.0 <= self.demo_slip <= 1.0:
      raise ValueError(f"demo_slip must be in [0, 1], got {self.demo_slip}")

  def make_example(self, split: str, index: int) -> dict[str, Any]:
    rng = base.example_rng(self.name, self.seed, split, index)
    operands = [self._draw_operand(rng) for _ in range(self.num_operands)]
    operators = [rng.choice(self.operations) for _ in range(self.num_operands - 1)]
    expression = _render(operands, operators)
    value, _ = _worked_solution(operands, operators)
    slip = None
    if self.demo_slip:
      # Its own stream: the knob changes demonstrations, never which problems are drawn.
      slip_rng = base.example_rng(f"{self.name}/demo_slip", self.seed, split, index)
      slip = lambda: slip_rng.random() < self.demo_slip  # noqa: E731
    shown, steps = _worked_solution(operands, operators, slip)
    demonstration = "\n".join([*steps, f"{base.FINAL_ANSWER_MARKER} {shown}"])
    return base.make_record(
      self.name, index, f"Q: {expression}=\n", str(value), demonstration,
      {"expression": expression},
    )

  def reward(self, record: Mapping[str, Any], completion: str) -> base.Reward:
    given = base.parse_integer(base.final_answer(completion))
    if given is None:
      return base.Reward(0.0, 0.0)
    return base.Reward(float(given == int(record["answer"])), 1.0)

  def exact_demonstration(self, record: Mapping[str, Any]) -> str:
    """The worked solution of `record` without slips, whatever `demo_slip` is: a careful
    teacher's demonstration (the record's own when `demo_slip` = 0).

    Examples:
      >>> task = ArithmeticTask(demo_slip=1.0)
      >>> print(task.exact_demonstration({"meta": '{"expression":"47+38"}'}))
      47+38: 7+8+0=15, 4+3+1=8
      47+38=85
      #### 85
    """
    operands, operators = _parse(base.parse_meta(record)["expression"])
    value, steps = _worked_solution(operands, operators)
    return "\n".join([*steps, f"{base.FINAL_ANSWER_MARKER} {value}"])

  def golden_negative(self, record: Mapping[str, Any], *, seed: int | None = None) -> str | None:
    """A golden negative trajectory o⁻ for `record` (ReflectRL, arXiv 2608.03972): the exact
    worked solution with exactly one carry / borrow / product carry dropped, in the format of
    `demonstration` (steps, then `#### <wrong answer>`).

    Its lines before the slip equal the correct solution's, the slipped column's line
    differs from that column on, and the rest follows correctly from the slip, so the final
    answer is wrong: the miniature of a strong model's answer-wrong trace with a local error.

    Args:
      record: a record of this task (its `meta` holds the expression); `demo_slip` and the
        record's own demonstration play no part.
      seed: None drops the first carry (in the order the solution meets them); an int drops
        one chosen by `random.Random(seed)`. Either way, a slip that leaves the final answer
        right (a wrong product later multiplied by 0, say) is passed over for the next one.

    Returns:
      The trajectory's text, or None when no single dropped carry makes the answer wrong (no
      carry or borrow at all: then the prompt has no golden negative).

    Examples:
      >>> task = ArithmeticTask()
      >>> record = {"meta": '{"expression":"47+38"}'}
      >>> print(task.golden_negative(record))
      47+38: 7+8+0=15, 4+3+0=7
      47+38=75
      #### 75
      >>> task.golden_negative({"meta": '{"expression":"12+34"}'}) is None
      True
    """
    operands, operators = _parse(base.parse_meta(record)["expression"])
    value, _ = _worked_solution(operands, operators)
    carries = _count_slip_points(operands, operators)
    order = list(range(carries))
    if seed is not None:
      random.Random(seed).shuffle(order)
    for k in order:
      shown, steps = _worked_solution(operands, operators, _slip_at(k))
      if shown != value:
        return "\n".join([*steps, f"{base.FINAL_ANSWER_MARKER} {shown}"])
    return None

  def _draw_operand(self, rng: random.Random) -> int:
    digits = rng.randint(self.min_digits, self.max_digits)
    # One-digit operands include 0; longer ones have no leading zero.
    low = 0 if digits == 1 else 10 ** (digits - 1)
    return rng.randint(low, 10**digits - 1)


def _render(operands: list[int], operators: list[str]) -> str:
  parts = [str(operands[0])]
  for op, x in zip(operators, operands[1:], strict=True):
    parts += [op, str(x)]
  return "".join(parts)


Slip = Callable[[], bool] | None  # True: drop this carry / borrow (a sloppy teacher)


def _parse(expression: str) -> tuple[list[int], list[str]]:
  """`"12+345*26"` → `([12, 345, 26], ["+", "*"])` (operands are non-negative: no unary minus)."""
  parts = re.split(r"([+\-*])", expression)
  return [int(x) for x in parts[0::2]], parts[1::2]


def _count_slip_points(operands: list[int], operators: list[str]) -> int:
  """How many non-zero carries / borrows the exact worked solution meets (each a possible slip)."""
  calls = 0

  def count() -> bool:
    nonlocal calls
    calls += 1
    return False

  _worked_solution(operands, operators, count)
  return calls


def _slip_at(k: int) -> Slip:
  """A slip that drops the k-th non-zero carry (0-based) and no other.

  Up to the k-th the slipping solution is the exact one, so its k-th carry is the exact
  solution's k-th; after the slip no carry is dropped.
  """
  calls = -1

  def slip() -> bool:
    nonlocal calls
    calls += 1
    return calls == k

  return slip


def _carry(carry: int, slip: Slip) -> int:
  return 0 if carry and slip is not None and slip() else carry


def _worked_solution(operands: list[int], operators: list[str],
                     slip: Slip = None) -> tuple[int, list[str]]:
  """The value of the expression and the lines of its worked solution.

  With `slip`, the value is the one the (slipping) worked solution arrives at.
  """
  operands, operators = list(operands), list(operators)
  lines = []
  while operators:
    # Leftmost product first; with none left, the leftmost sum or difference.
    i = operators.index("*") if "*" in operators else 0
    a, op, b = operands[i], operators[i], operands[i + 1]
    if op == "*":
      new_lines, value = _multiply(a, b, slip)
    else:
      new_lines, value = _add_or_subtract(a, op, b, slip)
    lines += new_lines
    operands[i : i + 2] = [value]
    del operators[i]
    if operators:
      lines.append(f"now: {_render(operands, operators)}")
  return operands[0], lines


def _multiply(a: int, b: int, slip: Slip = None) -> tuple[list[str], int]:
  """Lines for `a*b` (both >= 0): one digit product per non-zero digit of `b`, then their sum."""
  if b < 10:
    columns, product = _digit_product_columns(a, b, slip)
    return [f"{a}*{b}: {columns}", f"{a}*{b}={product}"], product
  lines = [f"{a}*{b}:"]
  partials = []
  for position, digit in enumerate(int(d) for d in reversed(str(b))):
    if digit == 0:
      continue
    shift = 10**position
    columns, product = _digit_product_columns(a, digit, slip)
    lines.append(f"{a}*{digit}: {columns}")
    lines.append(f"{a}*{digit * shift}={product * shift}")
    partials.append(product * shift)
  total = partials[0]
  for p in partials[1:]:
    columns, new_total = _addition_columns(total, p, slip)
    lines.append(f"{total}+{p}: {columns}")
    lines.append(f"{total}+{p}={new_total}")
    total = new_total
  if len(partials) > 1:  # With one partial product its line already reads `a*b=...`.
    lines.append(f"{a}*{b}={total}")
  return lines, total


def _add_or_subtract(r: int, op: str, t: int, slip: Slip = None) -> tuple[list[str], int]:
  """Lines for `r op t` (`t >= 0`, `r` any sign) via one column operation on magnitudes."""
  # -a+t = t-a, -a-t = -(a+t); a difference x-y with x < y becomes -(y-x).
  if r >= 0:
    x, y, subtract, negate = r, t, op == "-", False
  elif op == "+":
    x, y, subtract, negate = t, -r, True, False
  else:
    x, y, subtract, negate = -r, t, False, True
  if subtract and x < y:
    x, y, negate = y, x, not negate
  plain = f"{x}{'-' if subtract else '+'}{y}"
  columns, magnitude = (_subtraction_columns if subtract else _addition_columns)(x, y, slip)
  value = -magnitude if negate else magnitude
  expression = f"{r}{op}{t}"
  rewritten = f"-({plain})" if negate else plain
  lines = [] if rewritten == expression else [f"{expression}={rewritten}"]
  lines += [f"{plain}: {columns}", f"{plain}={magnitude}"]
  if rewritten != expression:
    lines.append(f"{expression}={value}")
  return lines, value


def _digits(n: int, width: int) -> list[int]:
  """The lowest `width` digits of `n >= 0`, lowest first, zero-padded."""
  return [int(d) for d in reversed(str(n).rjust(width, "0"))]


def _addition_columns(x: int, y: int, slip: Slip = None) -> tuple[str, int]:
  """`7+8+0=15, 4+5+1=10, 3+0+1=4` for 347+58: each column with its incoming carry; and the sum."""
  width = max(len(str(x)), len(str(y)))
  carry, columns, total = 0, [], 0
  for position, (dx, dy) in enumerate(zip(_digits(x, width), _digits(y, width), strict=True)):
    s = dx + dy + _carry(carry, slip)
    columns.append(f"{dx}+{dy}+{s - dx - dy}={s}")
    # The top column's sum is written whole (`9+5+0=14`).
    total += (s if position == width - 1 else s % 10) * 10**position
    carry = s // 10
  return ", ".join(columns), total


def _subtraction_columns(x: int, y: int, slip: Slip = None) -> tuple[str, int]:
  """`17-8-0=9, 14-5-1=8, 3-0-1=2` for 347-58 (x >= y): a leading 1 marks a borrow; and x-y."""
  width = len(str(x))
  borrow, columns, total = 0, [], 0
  for position, (dx, dy) in enumerate(zip(_digits(x, width), _digits(y, width), strict=True)):
    borrow = _carry(borrow, slip)
    d = dx - dy - borrow
    if d < 0:
      columns.append(f"1{dx}-{dy}-{borrow}={d + 10}")
      d, borrow = d + 10, 1
    else:
      columns.append(f"{dx}-{dy}-{borrow}={d}")
      borrow = 0
    total += d * 10**position
  return ", ".join(columns), total


def _digit_product_columns(a: int, digit: int, slip: Slip = None) -> tuple[str, int]:
  """`7*8+0=56, 4*8+5=37, 3*8+3=27` for 347*8: each digit with the incoming carry; and a*digit."""
  width = len(str(a))
  carry, columns, total = 0, [], 0
  for position, da in enumerate(_digits(a, width)):
    p = da * digit + _carry(carry, slip)
    columns.append(f"{da}*{digit}+{p - da * digit}={p}")
    total += (p if position == width - 1 else p % 10) * 10**position
    carry = p // 10
  return ", ".join(columns), total
