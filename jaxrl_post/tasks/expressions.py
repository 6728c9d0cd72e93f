"""A small, safe parser and exact evaluator for `+ - * /` expressions over integer literals.

Used by the countdown verifier on untrusted model output, hence no `eval`, bounded input
length and nesting, and exact rational arithmetic (`fractions.Fraction`), so that `7/2*2` is
exactly 7 and a division by zero is reported, never raised.

Grammar (spaces allowed between tokens; no unary minus, no implicit multiplication):

  expr   := term (("+" | "-") term)*
  term   := factor (("*" | "/") factor)*
  factor := integer | "(" expr ")"
"""

from __future__ import annotations

import dataclasses
import re
from fractions import Fraction

MAX_EXPRESSION_CHARS = 200
MAX_NESTING = 32
# Literals longer than this cannot be any task's number; the cap also bounds the arithmetic.
MAX_LITERAL_DIGITS = 12

_TOKEN_RE = re.compile(r"\s*(?:([0-9]+)|(.))", re.ASCII | re.DOTALL)


class ExpressionError(ValueError):
  """The text is not an expression of the grammar (or exceeds the size limits)."""


@dataclasses.dataclass(frozen=True)
class Evaluation:
  """The result of evaluating a well-formed expression.

  Attributes:
    value: the exact value, or `None` when the expression divides by zero.
    literals: the integer literals in the order they appear.
  """

  value: Fraction | None
  literals: tuple[int, ...]


def evaluate(text: str) -> Evaluation:
  """Parses and evaluates `text` exactly.

  Raises:
    ExpressionError: when `text` is not a well-formed expression, is longer than
      `MAX_EXPRESSION_CHARS`, nests parentheses deeper than `MAX_NESTING` or has a literal
      longer than `MAX_LITERAL_DIGITS` digits.
  """
  if not isinstance(text, str):
    raise ExpressionError(f"expected a string, got {type(text).__name__}")
  if len(text) > MAX_EXPRESSION_CHARS:
    raise ExpressionError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
  return _Parser(_tokenize(text)).parse()


def _tokenize(text: str) -> list[str]:
  tokens = []
  for number, symbol in _TOKEN_RE.findall(text.rstrip()):
    if number:
      if len(number) > MAX_LITERAL_DIGITS:
        raise ExpressionError(f"literal {number[:20]}... is too long")
      tokens.append(number)
    elif symbol in "+-*/()":
      tokens.append(symbol)
    else:
      raise ExpressionError(f"unexpected character {symbol!r}")
  return tokens


class _Parser:
  """Recursive descent over the token list; `None` values propagate a division by zero."""

  def __init__(self, tokens: list[str]):
    self._tokens = tokens
    self._pos = 0
    self._depth = 0
    self._literals: list[int] = []

  def parse(self) -> Evaluation:
    value = self._expr()
    if self._pos != len(self._tokens):
      raise ExpressionError(f"unexpected {self._tokens[self._pos]!r} after the expression")
    return Evaluation(value, tuple(self._literals))

  def _peek(self) -> str | None:
    return self._tokens[self._pos] if self._pos < len(self._tokens) else None

  def _expr(self) -> Fraction | None:
    value = self._term()
    while (op := self._peek()) in ("+", "-"):
      self._pos += 1
      rhs = self._term()
      if value is not None and rhs is not None:
        value = value + rhs if op == "+" else value - rhs
      else:
        value = None
    return value

  def _term(self) -> Fraction | None:
    value = self._factor()
    while (op := self._peek()) in ("*", "/"):
      self._pos += 1
      rhs = self._factor()
      if value is None or rhs is None or (op == "/" and rhs == 0):
        value = None
      else:
        value = value * rhs if op == "*" else value / rhs
    return value

  def _factor(self) -> Fraction | None:
    token = self._peek()
    if token is None:
      raise ExpressionError("expression ends where a number or '(' was expected")
    self._pos += 1
    if token.isdigit():
      self._literals.append(int(token))
      return Fraction(int(token))
    if token != "(":
      raise ExpressionError(f"expected a number or '(', got {token!r}")
    self._depth += 1
    if self._depth > MAX_NESTING:
      raise ExpressionError(f"parentheses nest deeper than {MAX_NESTING}")
    value = self._expr()
    if self._peek() != ")":
      raise ExpressionError("unbalanced '('")
    self._pos += 1
    self._depth -= 1
    return value
