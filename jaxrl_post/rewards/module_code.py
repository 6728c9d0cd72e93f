"""Static validation of proposed reward-module code against an allow-list (first sandbox gate).

A reward module (MLREF, arXiv 2608.18827) is one Python function of a feature dict:

    def forward_progress(f):
      \"\"\"Reward forward velocity, saturating at 2 m/s.\"\"\"
      v = f["x_velocity"]
      return jnp.tanh(v / 2.0)

It receives `f`, a mapping from feature name to array `[*batch, *feature_shape]`, and returns the
per-sample reward `[*batch]`. The allow-list admits only: one `def` with one positional argument;
assignments to plain local names; a final `return`; arithmetic / comparison operators; calls of
allow-listed `jnp` functions (and `jnp.linalg.norm`); `f["feature"]` look-ups of declared features;
constant indexing / slicing of arrays; numeric constants. Nothing else parses: no imports, no other
names or builtins, no attribute access besides `jnp.<allowed>`, no dunders, no loops,
comprehensions, lambdas, `if`, `with`, `try`, f-strings, starred arguments or keyword `**`.
Control flow is deliberately absent: under `jit` it must be `jnp.where` anyway. Without loops,
`if` and data-dependent Python, the Python-level work of a module is the same on every call, so
the separate-process test-run (`sandbox.vet_modules`) bounds it (e.g. an `9 ** 9 ** 9` int bomb
times out there and never reaches the trainer). Shape constructors (`zeros`, `tile`, `repeat`,
`outer`, `kron`, `einsum`, `broadcast_to`) and newaxis indexing are not allowed, but the allowed
ops still grow arrays: `jnp.concatenate` / `jnp.stack` of repeated operands, broadcasting of
stacked size-1 axes, and `jnp.dot` of two batched arrays, which keeps both batch axes
(`[B, d] . [B, d, k] -> [B, B, k]`). The allow-list bounds what code can *name*, not what it
costs; `sandbox.vet_modules` bounds the cost per sample at the trainer's batch.

This module never executes code except in `compile_module`, which only runs code that passed
`validate_module_code`, with no usable builtins.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import sys
from typing import Callable, Collection

MAX_CODE_CHARS = 4000
MAX_AST_NODES = 600
MAX_SEQUENCE_LITERAL = 16
NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")

# jnp functions a reward may call: elementwise maths, reductions over the feature axes, and
# selection. Array *constructors* that take a shape (zeros, ones, full, arange, tile, repeat,
# broadcast_to, outer, kron, ...) are excluded so that output size stays tied to input size.
ALLOWED_JNP = frozenset({
    "abs", "absolute", "all", "any", "arccos", "arcsin", "arctan", "arctan2", "clip", "cos",
    "cosh", "cross", "deg2rad", "exp", "expm1", "floor", "ceil", "heaviside", "hypot", "isfinite",
    "log", "log1p", "logical_and", "logical_not", "logical_or", "max", "maximum", "mean", "min",
    "minimum", "nan_to_num", "negative", "ones_like", "power", "prod", "rad2deg", "round",
    "sign", "sin", "sinh", "sqrt", "square", "stack", "std", "sum", "tan", "tanh", "var",
    "where", "zeros_like", "concatenate", "exp2", "log2", "log10", "reciprocal", "dot",
})
ALLOWED_JNP_CONSTANTS = frozenset({"pi", "e", "inf"})
ALLOWED_JNP_SUBMODULE_CALLS = frozenset({("linalg", "norm")})
ALLOWED_KEYWORDS = frozenset({"axis", "keepdims", "ord", "min", "max", "a_min", "a_max", "nan",
                              "posinf", "neginf"})

_BINOPS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.BitAnd,
           ast.BitOr)
_UNARYOPS = (ast.UAdd, ast.USub, ast.Invert)
_CMPOPS = (ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.Eq, ast.NotEq)


class ModuleCodeError(ValueError):
  """Proposed module code is outside the allow-list; the message says where and why."""


@dataclasses.dataclass(frozen=True)
class ModuleCodeInfo:
  """What validation learnt about a module.

  Attributes:
    function_name: name of the single `def`.
    features: feature names the code reads, in first-use order.
  """
  function_name: str
  features: tuple[str, ...]


def validate_name(name: str) -> str:
  """Checks a module name (lower-case identifier, ≤ 64 chars) and returns it."""
  if not isinstance(name, str) or not NAME_RE.match(name):
    raise ModuleCodeError(f"invalid module name {name!r}: need [a-z][a-z0-9_]{{0,63}}")
  return name


def validate_module_code(code: str,
                         feature_names: Collection[str] | None = None) -> ModuleCodeInfo:
  """Parses `code` and checks it against the allow-list (see the module docstring).

  Args:
    code: Python source of one reward module.
    feature_names: the environment's feature names; `f["x"]` with another key is rejected. None
      accepts any string key (then the test-run decides).

  Returns:
    `ModuleCodeInfo`.

  Raises:
    ModuleCodeError: with the reason, when the code is not allowed.
  """
  if not isinstance(code, str):
    raise ModuleCodeError("code must be a string")
  if len(code) > MAX_CODE_CHARS:
    raise ModuleCodeError(f"code too long ({len(code)} > {MAX_CODE_CHARS} chars)")
  if "\x00" in code:
    raise ModuleCodeError("code contains NUL bytes")
  try:
    tree = ast.parse(code, mode="exec")
  except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
    raise ModuleCodeError(f"does not parse: {type(e).__name__}: {e}") from None
  n_nodes = sum(1 for _ in ast.walk(tree))
  if n_nodes > MAX_AST_NODES:
    raise ModuleCodeError(f"code too large ({n_nodes} > {MAX_AST_NODES} AST nodes)")
  return _Validator(feature_names).module(tree)


class _Validator:
  """Recursive allow-list walk; every node type must be handled explicitly or it is rejected."""

  def __init__(self, feature_names):
    self.feature_names = None if feature_names is None else frozenset(feature_names)
    self.arg = None
    self.locals: set[str] = set()
    self.features: list[str] = []

  def fail(self, node, why):
    line = getattr(node, "lineno", "?")
    raise ModuleCodeError(f"line {line}: {why}")

  def module(self, tree: ast.Module) -> ModuleCodeInfo:
    body = list(tree.body)
    if body and _is_docstring(body[0]):
      body = body[1:]
    if len(body) != 1 or not isinstance(body[0], ast.FunctionDef):
      raise ModuleCodeError("code must be exactly one top-level `def name(f): ...` "
                            "(optionally preceded by a docstring); imports and other statements "
                            "are not allowed")
    fn = body[0]
    if fn.name.startswith("_"):
      self.fail(fn, f"function name {fn.name!r} may not start with '_'")
    if fn.decorator_list:
      self.fail(fn, "decorators are not allowed")
    if fn.returns is not None or getattr(fn, "type_params", None):
      self.fail(fn, "annotations / type parameters are not allowed")
    a = fn.args
    if (a.posonlyargs or a.vararg or a.kwonlyargs or a.kwarg or a.defaults or a.kw_defaults or
        len(a.args) != 1):
      self.fail(fn, "the function must take exactly one positional argument (the feature dict)")
    if a.args[0].annotation is not None:
      self.fail(fn, "annotations are not allowed")
    self.arg = self._check_new_name(a.args[0], a.args[0].arg)
    stmts = list(fn.body)
    if stmts and _is_docstring(stmts[0]):
      stmts = stmts[1:]
    if not stmts or not isinstance(stmts[-1], ast.Return) or stmts[-1].value is None:
      self.fail(fn, "the function must end with `return <expression>`")
    for st in stmts[:-1]:
      self.statement(st)
    self.expr(stmts[-1].value)
    return ModuleCodeInfo(fn.name, tuple(dict.fromkeys(self.features)))

  def _check_new_name(self, node, name):
    if name.startswith("_") or name == "jnp":
      self.fail(node, f"name {name!r} is not allowed")
    return name

  def statement(self, st):
    if isinstance(st, ast.Assign):
      self.expr(st.value)
      for target in st.targets:
        self.target(target)
    elif isinstance(st, ast.AugAssign):
      if not isinstance(st.op, _BINOPS):
        self.fail(st, f"operator {type(st.op).__name__} is not allowed")
      if not isinstance(st.target, ast.Name) or st.target.id not in self.locals:
        self.fail(st, "augmented assignment needs an existing local name")
      self.expr(st.value)
    elif isinstance(st, ast.AnnAssign):
      self.fail(st, "annotations are not allowed")
    elif isinstance(st, ast.Return):
      self.fail(st, "only one `return`, as the last statement, is allowed")
    else:
      self.fail(st, f"statement {type(st).__name__} is not allowed (no imports, loops, if, with, "
                    "try, def, class, global, del, assert)")

  def target(self, t):
    if isinstance(t, ast.Name):
      if t.id == self.arg:
        self.fail(t, "the feature argument may not be reassigned")
      self.locals.add(self._check_new_name(t, t.id))
    elif isinstance(t, ast.Tuple) and len(t.elts) <= MAX_SEQUENCE_LITERAL:
      for e in t.elts:
        self.target(e)
    else:
      self.fail(t, "assignment targets must be plain local names")

  def expr(self, e):
    if isinstance(e, ast.Constant):
      if isinstance(e.value, bool) or isinstance(e.value, (int, float)):
        return
      self.fail(e, f"constant {e.value!r} is not allowed here (numbers only)")
    elif isinstance(e, ast.Name):
      if e.id == self.arg:
        self.fail(e, f"the feature dict {self.arg!r} may only be used as {self.arg}[\"feature\"]")
      if e.id == "jnp":
        self.fail(e, "`jnp` may only be used as jnp.<allowed function>(...)")
      if e.id not in self.locals:
        self.fail(e, f"unknown name {e.id!r} (only locals, the feature dict and jnp.* exist)")
    elif isinstance(e, ast.BinOp):
      if not isinstance(e.op, _BINOPS):
        self.fail(e, f"operator {type(e.op).__name__} is not allowed")
      self.expr(e.left)
      self.expr(e.right)
    elif isinstance(e, ast.UnaryOp):
      if not isinstance(e.op, _UNARYOPS):
        self.fail(e, f"operator {type(e.op).__name__} is not allowed (use jnp.logical_not)")
      self.expr(e.operand)
    elif isinstance(e, ast.Compare):
      if len(e.ops) != 1 or not isinstance(e.ops[0], _CMPOPS):
        self.fail(e, "only single comparisons <, <=, >, >=, ==, != are allowed")
      self.expr(e.left)
      self.expr(e.comparators[0])
    elif isinstance(e, ast.Call):
      self.call(e)
    elif isinstance(e, ast.Attribute):
      path = _attribute_path(e)
      if path is None or len(path) != 2 or path[0] != "jnp" or path[1] not in ALLOWED_JNP_CONSTANTS:
        self.fail(e, "attribute access is not allowed (except jnp.pi, jnp.e, jnp.inf and calls of "
                     "allowed jnp functions)")
    elif isinstance(e, ast.Subscript):
      self.subscript(e)
    elif isinstance(e, (ast.Tuple, ast.List)):
      if len(e.elts) > MAX_SEQUENCE_LITERAL:
        self.fail(e, f"sequence literals are limited to {MAX_SEQUENCE_LITERAL} elements")
      for x in e.elts:
        if isinstance(x, ast.Starred):
          self.fail(x, "starred expressions are not allowed")
        self.expr(x)
    else:
      self.fail(e, f"expression {type(e).__name__} is not allowed")

  def call(self, c):
    path = _attribute_path(c.func)
    ok = path is not None and path[0] == "jnp" and (
        (len(path) == 2 and path[1] in ALLOWED_JNP) or
        (len(path) == 3 and tuple(path[1:]) in ALLOWED_JNP_SUBMODULE_CALLS))
    if not ok:
      shown = ".".join(path) if path else type(c.func).__name__
      self.fail(c, f"call of {shown!r} is not allowed (only allow-listed jnp functions)")
    for a in c.args:
      if isinstance(a, ast.Starred):
        self.fail(a, "starred arguments are not allowed")
      self.expr(a)
    for kw in c.keywords:
      if kw.arg is None or kw.arg not in ALLOWED_KEYWORDS:
        self.fail(c, f"keyword argument {kw.arg!r} is not allowed")
      self.expr(kw.value)

  def subscript(self, s):
    if isinstance(s.value, ast.Name) and s.value.id == self.arg:
      key = s.slice
      if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
        self.fail(s, f"features are read as {self.arg}[\"name\"] with a constant string")
      if self.feature_names is not None and key.value not in self.feature_names:
        self.fail(s, f"unknown feature {key.value!r}; available: {sorted(self.feature_names)}")
      self.features.append(key.value)
      return
    self.expr(s.value)
    self.index(s.slice)

  def index(self, i):
    # No `None` (newaxis): with it, x[:, None] * x[None, :] turns a [B] batch into [B, B].
    if isinstance(i, ast.Constant) and (i.value is Ellipsis or (isinstance(i.value, int) and
                                                                not isinstance(i.value, bool))):
      return
    if isinstance(i, ast.UnaryOp) and isinstance(i.op, ast.USub) and isinstance(
        i.operand, ast.Constant) and type(i.operand.value) is int:
      return
    if isinstance(i, ast.Slice):
      for part in (i.lower, i.upper, i.step):
        if part is not None:
          self.index(part)
      return
    if isinstance(i, ast.Tuple) and len(i.elts) <= MAX_SEQUENCE_LITERAL:
      for x in i.elts:
        self.index(x)
      return
    self.fail(i, "array indices must be constant ints, slices or ... (no None / newaxis)")


def _is_docstring(node) -> bool:
  return (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and
          isinstance(node.value.value, str))


def _attribute_path(node) -> list[str] | None:
  parts = []
  while isinstance(node, ast.Attribute):
    if node.attr.startswith("_"):
      return None
    parts.append(node.attr)
    node = node.value
  if not isinstance(node, ast.Name):
    return None
  parts.append(node.id)
  return parts[::-1]


def loaded_only_import(name, globals=None, locals=None, fromlist=(), level=0):  # noqa: A002
  """The only builtin of a module's namespace: hands out already-loaded modules, loads nothing.

  Library C code called from a module's frame (jaxlib's tracing path calls `PyImport_Import`)
  looks `__import__` up in that frame's builtins; with none there it fails with KeyError. The
  module code itself cannot reach this function: the allow-list admits no such name.
  """
  del globals, locals
  module = sys.modules.get(name) if level == 0 else None
  if module is None:
    raise ImportError(f"import of {name!r} is not allowed in reward modules")
  return module if fromlist else sys.modules[name.partition(".")[0]]


def compile_module(code: str, feature_names: Collection[str] | None = None) -> Callable:
  """Validates `code` and returns its function: `jnp` is the only global, no usable builtins.

  Only call this on code that also passed the sandboxed test-run (`sandbox.vet_modules`):
  validation bounds what the code can *name*, the test-run bounds what it *costs*.

  Args:
    code: module source.
    feature_names: as in `validate_module_code`.

  Returns:
    The module function `fn(features) -> [*batch]`.
  """
  info = validate_module_code(code, feature_names)
  import jax.numpy as jnp  # Deferred so that validation alone never imports JAX.

  namespace = {"__builtins__": {"__import__": loaded_only_import}, "jnp": jnp}
  exec(compile(code, f"<reward module {info.function_name}>", "exec"), namespace)  # noqa: S102
  return namespace[info.function_name]
