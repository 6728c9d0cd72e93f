"""Final answers of math completions, their comparison, and the verifier worker pool.

  gsm8k_reward("72", "... so she sold \\boxed{72} clips.")     # (1.0, 1.0)
  math_reward("\\frac{1}{2}", "... = \\boxed{0.5}")             # (1.0, 1.0)

Answers are read from the *last* `\\boxed{...}` (or `\\fbox{...}`) of a completion: braces are
matched, escaped braces `\\{ \\}` do not count, and an unclosed last box (`\\boxed{1`) gives no
answer at all, rather than an earlier box or a guess. `format` is 1 when that box is there.

GSM8K (`gsm8k_reward`): the completion's final answer is the content of the last box when the
completion has a `\\boxed` / `\\fbox`, else the last number in the text (so a model that never
learned the box is still graded on its last number). Inside a box, units and decorations
(`\\text{...}`, `\\mathrm{...}`, `\\$`, `\\%`, `\\,`) and a leading `x =` are dropped, and the rest
must be one number (`1,234.5`, `-3`, `$18`, `7/2`, `\\frac{7}{2}`); otherwise the answer is
wrong. Numbers compare exactly as fractions: `1,000` = `1000.0` = `$1000`.

MATH (`math_reward`): `math_verify` is the judge. The gold answer is parsed as the content of a
box; the completion with a LaTeX extraction that looks at boxes first and otherwise only at
anchored answers ("the final answer is $...$"), and `math_verify.verify` decides equivalence.
What it says, checked in the tests: `\\frac{1}{2}` = `1/2` = `0.5` = `\\dfrac12`;
`10\\text{ cm}` = `10`; `(1,2]` differs from `(1,2)` and `[1,2]`; `\\{1,2,3\\}` = `3,2,1`;
`\\sqrt{2}/2` = `\\frac{1}{\\sqrt2}`; `x=3` = `3` (either side); `50\\%` = `50`. Surprising: two
boxes (`\\boxed{2} ... \\boxed{1}`) are read as the set `{1, 2}`, which equals neither answer,
so hedging over boxes is wrong; `3.14159` is not `\\pi` (numbers compare to 6 digits); an
answer without a box still counts when anchored ("The final answer is $1$", format 0). One
rule is ours, not `math_verify`'s: when the last box is malformed (`... \\boxed{1} ... \\boxed{`)
the completion is wrong, where `math_verify` would take the earlier, closed box.

`math_verify` interrupts itself with SIGALRM after whole seconds (`timeout_s`); when it does,
`math_reward` raises `AnswerTimeout`. SIGALRM only exists in a process's main thread, so off it
the limit is skipped, and a sympy evaluation stuck inside C code ignores it. The worker pool
is the hard limit: `VerifierPool` runs verifiers in separate processes
(`pebble.ProcessPool`) with a per-sample time-out that kills a stuck worker and starts a fresh
one. Workers are started by `forkserver` (or `spawn`), never `fork`: the parent runs JAX's
threads, and a forked copy of a multi-threaded process can deadlock on a lock some other
thread held. `shared_pool()` is the one pool of the process, made on first use, closed at
exit.

This module imports neither JAX nor the task package, so workers start in well under a second.
"""

from __future__ import annotations

import atexit
import functools
import logging
import multiprocessing
import os
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from typing import Any, NamedTuple

# Longer answer strings are garbage; the cap also keeps `Fraction` below Python's 4300-digit
# int conversion limit.
MAX_ANSWER_CHARS = 1000
BOX_COMMANDS = ("\\boxed", "\\fbox")
# The default size of the pool: verification is CPU-bound, and the learner needs cores too.
MAX_DEFAULT_WORKERS = 4

_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
# A number as written in prose: optional sign (not after a letter or digit, so `5-3` gives 3),
# optional dollar, digits with optional thousands commas, optional decimals.
_TEXT_NUMBER_RE = re.compile(
  r"(?:(?<![0-9A-Za-z])-)?\$?(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]+)?(?![0-9])", re.ASCII)
_NUMBER_RE = re.compile(r"-?(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]+)?", re.ASCII)
# `\text{ cm}`, `\mathrm{kg}`, ...: units and words in a box, dropped for GSM8K.
_TEXT_GROUP_RE = re.compile(r"\\(?:text|textbf|textrm|mathrm|mbox|operatorname)\s*\{[^{}]*\}")
_DECORATION_RE = re.compile(r"\\[$%,;:!]|\\left|\\right|[$%\s]|\^\{?\\circ\}?")
_FRAC_RE = re.compile(r"\\[dt]?frac\{([^{}]+)\}\{([^{}]+)\}")
_LEADING_NAME_RE = re.compile(r"^[A-Za-z]\w*=")


class AnswerTimeout(Exception):
  """`math_verify` ran past its own time limit on one completion."""


# ----------------------------------------------------------------------------------------------
# Answer extraction.


def last_boxed(text: Any) -> str | None:
  """The content of the last `\\boxed{...}` / `\\fbox{...}` in `text`, or `None`.

  `None` when there is no box, when the last box is unclosed or empty, when its content is
  longer than `MAX_ANSWER_CHARS`, or when `text` is not a string. `\\boxed 5` (a box without
  braces, which MATH solutions use a few times) gives the token after the space.
  """
  if not isinstance(text, str):
    return None
  matches = list(_BOX_RE.finditer(text))
  if not matches:
    return None
  start = matches[-1].end()
  rest = text[start:]
  stripped = rest.lstrip()
  if not stripped.startswith("{"):
    # `\boxed 5`: the token up to the next space or math delimiter.
    token = re.match(r"[^\s$]+", stripped) if rest[:1].isspace() else None
    return token.group(0) if token and len(token.group(0)) <= MAX_ANSWER_CHARS else None
  begin = start + len(rest) - len(stripped) + 1
  depth, i = 1, begin
  while i < len(text):
    char = text[i]
    if char == "\\":
      i += 2  # An escaped character (`\{`, `\}`, `\\`) never opens or closes a group.
      continue
    if char == "{":
      depth += 1
    elif char == "}":
      depth -= 1
      if depth == 0:
        content = text[begin:i].strip()
        return content if content and len(content) <= MAX_ANSWER_CHARS else None
    i += 1
  return None  # Unclosed.


def has_box_command(text: Any) -> bool:
  """Whether `text` contains `\\boxed` or `\\fbox` at all (closed or not)."""
  return isinstance(text, str) and _BOX_RE.search(text) is not None


def parse_number(text: str | None) -> Fraction | None:
  """One number written GSM8K-style (`-$1,234.50`, `7/2`, `\\frac{7}{2}`), exactly, or `None`."""
  if text is None or len(text) > MAX_ANSWER_CHARS:
    return None
  text = text.strip().rstrip(".").replace("$", "")
  fraction = _FRAC_RE.fullmatch(text)
  if fraction:
    numerator, denominator = fraction.groups()
  else:
    numerator, _, denominator = text.partition("/")
  if not _NUMBER_RE.fullmatch(numerator) or (denominator and not _NUMBER_RE.fullmatch(denominator)):
    return None
  value = Fraction(numerator.replace(",", ""))
  if denominator:
    divisor = Fraction(denominator.replace(",", ""))
    return None if divisor == 0 else value / divisor
  return value


def box_number(content: str) -> Fraction | None:
  """A box's content as one number after dropping units and decorations (module docstring)."""
  text = _TEXT_GROUP_RE.sub("", content)
  text = _DECORATION_RE.sub("", text).replace("{,}", ",")
  text = _LEADING_NAME_RE.sub("", text)
  return parse_number(text)


def gsm8k_answer(completion: Any) -> Fraction | None:
  """The completion's final answer by GSM8K's rule (module docstring), or `None`."""
  if not isinstance(completion, str):
    return None
  if has_box_command(completion):
    content = last_boxed(completion)
    return None if content is None else box_number(content)
  numbers = _TEXT_NUMBER_RE.findall(completion)
  return parse_number(numbers[-1]) if numbers else None


def gsm8k_gold(answer: str) -> str:
  """GSM8K's gold final answer: the text after the last `####` of its worked `answer`."""
  return answer.rpartition("####")[2].strip()


# ----------------------------------------------------------------------------------------------
# Rewards. Plain `(correct, format)` float pairs, so that workers need not import the tasks.


def gsm8k_reward(gold: str, completion: Any) -> tuple[float, float]:
  """`(correct, format)` of a GSM8K completion against the gold final answer.

  correct = [final answer (module docstring) == gold, as exact numbers];
  format = [the completion has a closed, non-empty last box].
  """
  fmt = float(last_boxed(completion) is not None)
  given = gsm8k_answer(completion)
  gold_number = parse_number(str(gold))
  return float(given is not None and given == gold_number), fmt


def math_reward(gold: str, completion: Any, *, timeout_s: int | None = 5) -> tuple[float, float]:
  """`(correct, format)` of a MATH completion: `math_verify` equivalence with the gold answer.

  Args:
    gold: the gold final answer as LaTeX, without the box (`\\frac{1}{2}`).
    completion: the completion text; anything that is not a string is wrong.
    timeout_s: `math_verify`'s own limit in whole seconds for each of parsing the completion
      and comparing (`None`: none). Only enforced on a process's main thread.

  Returns:
    correct = [`math_verify.verify(gold, prediction)`]; format = [a closed last box].

  Raises:
    AnswerTimeout: when `math_verify` hit `timeout_s`.
  """
  if not isinstance(completion, str):
    return 0.0, 0.0
  boxed = last_boxed(completion)
  if boxed is None and has_box_command(completion):
    return 0.0, 0.0  # The last box is malformed: no answer, as for GSM8K (module docstring).
  fmt = float(boxed is not None)
  if threading.current_thread() is not threading.main_thread():
    timeout_s = None  # SIGALRM cannot be armed here; `math_verify` would refuse to run.
  gold_parsed = _parse_gold(str(gold), timeout_s)
  if not gold_parsed:
    return 0.0, fmt
  import math_verify  # Deferred: it imports sympy.
  from math_verify.errors import TimeoutException

  try:
    predicted = math_verify.parse(completion, extraction_config=_prediction_config(),
                                  extraction_mode="first_match", parsing_timeout=timeout_s,
                                  raise_on_error=True)
    if not predicted:
      return 0.0, fmt
    correct = math_verify.verify(gold_parsed, predicted, timeout_seconds=timeout_s,
                                 raise_on_error=True)
  except TimeoutException:
    raise AnswerTimeout(f"math_verify exceeded {timeout_s} s") from None
  except Exception:  # noqa: BLE001 - unparseable or incomparable means wrong, not a crash.
    return 0.0, fmt
  return float(bool(correct)), fmt


def math_record_reward(record: Mapping[str, Any], completion: Any, *,
                       timeout_s: int | None = 5) -> tuple[float, float]:
  """`math_reward` against `record["answer"]`; picklable, so the worker pool can run it."""
  return math_reward(str(record["answer"]), completion, timeout_s=timeout_s)


def gsm8k_record_reward(record: Mapping[str, Any], completion: Any) -> tuple[float, float]:
  """`gsm8k_reward` against `record["answer"]`; picklable, so the worker pool can run it."""
  return gsm8k_reward(str(record["answer"]), completion)


@functools.lru_cache(maxsize=1)
def _prediction_config() -> list[Any]:
  from math_verify import LatexExtractionConfig

  # Boxes first (priority 0), and no bare-expression fallback: a stray number in the working
  # must not count as the answer.
  return [LatexExtractionConfig(boxed_match_priority=0, try_extract_without_anchor=False)]


@functools.lru_cache(maxsize=4096)
def _parse_gold(gold: str, timeout_s: int | None) -> list[Any]:
  """The gold answer parsed as a box's content; cached, as each gold meets a group of samples."""
  import math_verify
  from math_verify.errors import TimeoutException

  try:
    return math_verify.parse("\\boxed{" + gold + "}", extraction_config=_prediction_config(),
                             extraction_mode="first_match", parsing_timeout=timeout_s,
                             raise_on_error=True)
  except TimeoutException:
    raise AnswerTimeout(f"math_verify exceeded {timeout_s} s on the gold answer") from None
  except Exception:  # noqa: BLE001 - an unparseable gold makes every answer wrong.
    return []


# ----------------------------------------------------------------------------------------------
# The worker pool.


class PoolOutcome(NamedTuple):
  """What one sample gave in the pool.

  Attributes:
    value: the function's return value (`None` unless it returned).
    timed_out: it ran past the per-sample limit (the worker was killed) or raised
      `AnswerTimeout`.
    error: `"<ExceptionType>: <message>"` when it raised anything else or its worker died.
  """

  value: Any = None
  timed_out: bool = False
  error: str | None = None


def default_num_workers() -> int:
  """min(`MAX_DEFAULT_WORKERS`, the CPUs this process may run on)."""
  try:
    cpus = len(os.sched_getaffinity(0))
  except AttributeError:  # Not on Linux.
    cpus = os.cpu_count() or 1
  return max(1, min(MAX_DEFAULT_WORKERS, cpus))


def warm_up_worker() -> None:
  """Worker initializer: imports `math_verify` and parses once, before any time limit starts."""
  logging.getLogger("math_verify").setLevel(logging.ERROR)  # Its time-out warnings are ours.
  math_reward("1", "\\boxed{1}", timeout_s=None)


class VerifierPool:
  """Worker processes that run picklable verifier functions with a per-sample time limit.

    pool = VerifierPool(num_workers=4)
    outcomes = pool.run(math_record_reward, [(record, text), ...], timeout_s=10.0)

  Args:
    num_workers: processes (default `default_num_workers()`).
    start_method: `"forkserver"` (default where available: fresh workers are forked from a
      small server that has `math_verify` imported, so a killed worker is replaced quickly) or
      `"spawn"`. `"fork"` is refused (module docstring).
  """

  def __init__(self, num_workers: int | None = None, *, start_method: str | None = None):
    import pebble  # Deferred: only the pool needs it.

    self.num_workers = default_num_workers() if num_workers is None else int(num_workers)
    if self.num_workers < 1:
      raise ValueError(f"num_workers must be >= 1, got {num_workers}")
    available = multiprocessing.get_all_start_methods()
    if start_method is None:
      start_method = "forkserver" if "forkserver" in available else "spawn"
    if start_method not in ("forkserver", "spawn") or start_method not in available:
      raise ValueError(
        f"start_method must be 'forkserver' or 'spawn' (available here: {available}), got "
        f"{start_method!r}; 'fork' would copy the parent's JAX threads' locks")
    context = multiprocessing.get_context(start_method)
    if start_method == "forkserver":
      # Takes effect when this process's fork server starts (here, unless something else
      # started it before); it replaces the default, which re-imports `__main__`.
      context.set_forkserver_preload(["math_verify", __name__])
    self.start_method = start_method
    self._pool = pebble.ProcessPool(max_workers=self.num_workers, initializer=warm_up_worker,
                                    context=context)

  def run(self, fn: Callable[..., Any], args: Sequence[Sequence[Any]], *,
          timeout_s: float | None) -> list[PoolOutcome]:
    """`fn(*a)` for each `a` in `args`, in parallel, each cut at `timeout_s` seconds of running.

    Returns one `PoolOutcome` per element of `args`, in order. Never raises for what `fn` does.
    """
    from concurrent.futures import TimeoutError as FutureTimeout  # builtin TimeoutError

    futures = [self._pool.schedule(fn, args=tuple(a), timeout=timeout_s) for a in args]
    outcomes = []
    for future in futures:
      try:
        outcomes.append(PoolOutcome(value=future.result()))
      except (FutureTimeout, AnswerTimeout):
        outcomes.append(PoolOutcome(timed_out=True))
      except Exception as e:  # noqa: BLE001 - a verifier bug or a dead worker costs one sample.
        outcomes.append(PoolOutcome(error=f"{type(e).__name__}: {e}"))
    return outcomes

  @property
  def active(self) -> bool:
    """Whether the pool still accepts work."""
    return self._pool.active

  def close(self) -> None:
    """Stops the workers (killing busy ones) and waits for them."""
    self._pool.stop()
    self._pool.join(timeout=10)


_shared: VerifierPool | None = None
_shared_lock = threading.Lock()


def shared_pool(num_workers: int | None = None) -> VerifierPool:
  """The process's verifier pool, made on first use and closed at exit.

  Args:
    num_workers: the pool's size; `None` keeps the current pool (or makes one of
      `default_num_workers()`), a different size replaces it. Set it once at start-up, e.g. from
      a config key, before the first reward.
  """
  global _shared
  with _shared_lock:
    size_changed = num_workers is not None and _shared is not None and (
      _shared.num_workers != num_workers)
    if _shared is not None and (size_changed or not _shared.active):
      _shared.close()
      _shared = None
    if _shared is None:
      _shared = VerifierPool(num_workers)
    return _shared


@atexit.register
def close_shared_pool() -> None:
  """Closes the shared pool, if one was made (registered to run at exit)."""
  global _shared
  with _shared_lock:
    if _shared is not None:
      _shared.close()
      _shared = None
