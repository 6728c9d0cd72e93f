"""The tool-call format, its strict parser, and running a tool under a time limit.

Every action (one model turn) ends in exactly one block, optionally preceded by free text
(reasoning, which context functions may later drop):

  <tool>name(argument)</tool>     call tool `name` with the string `argument`
  <answer>text</answer>           commit to a final answer and end the episode

Rules `parse_action` enforces, each failure being a message and never an exception:

* exactly one `<tool>` or one `<answer>` block per action, opened once and closed once, with no
  other tag of the format inside or around it;
* nothing but whitespace after the closing tag (a sampler stops at `STOP_STRINGS`, so anything
  after it was not produced by a stopped turn);
* inside `<tool>`: a name of ASCII letters, digits and `_` (not starting with a digit), then
  `(`, the argument, and `)` as the last character. The argument is everything in between,
  stripped of surrounding whitespace, and may itself contain parentheses: `calc((1+2)*3)`.
  Tools take one string argument and parse it themselves;
* inside `<answer>`: any text, stripped. An empty answer is a valid (and wrong) answer.

Observations are wrapped as `\\n<obs>body</obs>\\n` (see `format_observation`), so a transcript
is the plain concatenation prompt + action + observation + action + ... and the model can tell
where the environment spoke. Errors have a body starting with `error: `.

`call_tool` runs a tool function: its return value becomes the observation body (cut to
`MAX_OUTPUT_CHARS`), an exception becomes an error, and so does exceeding the time limit. On
the main thread the limit is a `SIGALRM` interval timer, which interrupts sleeping and pure
Python loops; elsewhere the tool runs in a daemon thread that is abandoned when it times out.
Neither can stop C code that holds the GIL (a huge `pow`), so tools must bound their own inputs;
untrusted code belongs in a sandboxed subprocess, not here.
"""

from __future__ import annotations

import re
import signal
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

TOOL_OPEN, TOOL_CLOSE = "<tool>", "</tool>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
OBS_OPEN, OBS_CLOSE = "\n<obs>", "</obs>\n"
# Where a sampler should stop a turn: the end of either block.
STOP_STRINGS = (TOOL_CLOSE, ANSWER_CLOSE)
ERROR_PREFIX = "error: "

# A tool's output longer than this is cut: contexts of small models are short, and an output
# that long is a bug in the tool rather than information.
MAX_OUTPUT_CHARS = 200
# Text echoed back in an error message is cut to this, so garbage does not flood the context.
_QUOTE_CHARS = 24

_CALL_RE = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\((.*)\)\s*", re.ASCII | re.DOTALL)
_TAGS = (TOOL_OPEN, TOOL_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)

# Error kinds, as recorded in a step's `info["error"]`.
ERROR_FORMAT = "format"  # the action breaks the format above
ERROR_UNKNOWN_TOOL = "unknown_tool"  # a well-formed call to a tool the env does not have
ERROR_TOOL = "tool"  # the tool rejected its argument (raised `ToolError`)
ERROR_EXCEPTION = "exception"  # the tool raised anything else: a bug in the tool
ERROR_TIMEOUT = "timeout"  # the tool ran past its time limit
ERROR_KINDS = (ERROR_FORMAT, ERROR_UNKNOWN_TOOL, ERROR_TOOL, ERROR_EXCEPTION, ERROR_TIMEOUT)


class ToolError(Exception):
  """Raised by a tool to reject its argument; the message becomes the observation."""


class Action(NamedTuple):
  """A parsed action: exactly one of `tool`, `answer` or `error` is set.

  Attributes:
    tool: the called tool's name.
    argument: the call's argument (`""` unless `tool` is set).
    answer: the final answer's text.
    error: why the action is malformed, without the `error: ` prefix.
  """

  tool: str | None = None
  argument: str = ""
  answer: str | None = None
  error: str | None = None


class ToolResult(NamedTuple):
  """The outcome of one tool call.

  Attributes:
    output: the observation body: the tool's output, or `error: <message>`.
    error: `None` on success, else one of `ERROR_TOOL`, `ERROR_EXCEPTION`, `ERROR_TIMEOUT`.
  """

  output: str
  error: str | None = None


def parse_action(text: str) -> Action:
  """Parses one action in the format of the module docstring; never raises on its content.

  >>> parse_action("first x*y <tool>calc(12*34)</tool>")
  Action(tool='calc', argument='12*34', answer=None, error=None)
  >>> parse_action("<answer> 408 </answer>").answer
  '408'
  >>> parse_action("calc(12*34)").error
  'expected <tool>name(arg)</tool> or <answer>text</answer>'
  """
  if not isinstance(text, str):
    return Action(error=f"action must be text, got {type(text).__name__}")
  counts = {tag: text.count(tag) for tag in _TAGS}
  tool_tags = counts[TOOL_OPEN] + counts[TOOL_CLOSE]
  answer_tags = counts[ANSWER_OPEN] + counts[ANSWER_CLOSE]
  if tool_tags == 0 and answer_tags == 0:
    return Action(
      error=f"expected {TOOL_OPEN}name(arg){TOOL_CLOSE} or {ANSWER_OPEN}text{ANSWER_CLOSE}"
    )
  if tool_tags and answer_tags:
    return Action(error="one block per turn: either a tool call or an answer, not both")
  opener, closer = (TOOL_OPEN, TOOL_CLOSE) if tool_tags else (ANSWER_OPEN, ANSWER_CLOSE)
  if counts[opener] > 1 or counts[closer] > 1:
    return Action(error=f"one {opener} block per turn, found {max(counts[opener], counts[closer])}")
  start, end = text.find(opener), text.find(closer)
  if start < 0 or end < 0 or end < start:
    return Action(error=f"unbalanced {opener}...{closer}")
  if text[end + len(closer) :].strip():
    return Action(error=f"text after {closer}")
  body = text[start + len(opener) : end]
  if opener == ANSWER_OPEN:
    return Action(answer=body.strip())
  match = _CALL_RE.fullmatch(body)
  if match is None:
    return Action(error=f"malformed call {quote(body)}; expected name(arg)")
  return Action(tool=match.group(1), argument=match.group(2).strip())


def format_observation(body: str) -> str:
  """The observation text for `body`: `\\n<obs>body</obs>\\n`."""
  return f"{OBS_OPEN}{body}{OBS_CLOSE}"


def quote(text: str) -> str:
  """`text` quoted for an error message: ASCII-escaped, cut to a few characters.

  Error observations go back into the model's context, so echoing the model's text must
  neither flood it nor add characters outside a character tokenizer's ASCII alphabet.
  """
  if len(text) > _QUOTE_CHARS:
    text = text[:_QUOTE_CHARS] + "..."
  return ascii(text)


def call_tool(
  fn: Callable[[str], object],
  argument: str,
  *,
  timeout_s: float,
  use_signal: bool | None = None,
) -> ToolResult:
  """Runs `fn(argument)` with a time limit; never raises for what the tool does.

  Args:
    fn: the tool; returns its output (anything, converted with `str` within the time limit)
      or raises `ToolError` to reject the argument.
    argument: the call's argument.
    timeout_s: the time limit in seconds (> 0).
    use_signal: `True` for the `SIGALRM` timer, `False` for a watchdog thread, `None` for the
      timer when possible (main thread, on a platform with `setitimer`).

  Returns:
    The output (cut to `MAX_OUTPUT_CHARS`) or an error; see `ToolResult`.

  Raises:
    ValueError: for `timeout_s <= 0`, or `use_signal=True` off the main thread.
    KeyboardInterrupt: the tool's, on the main thread: a user's interrupt is not the tool's.
  """
  if timeout_s <= 0:
    raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
  if use_signal is None:
    use_signal = _signal_available()
  run = _run_with_alarm if use_signal else _run_in_thread
  outcome = run(fn, argument, timeout_s)
  if outcome is _TIMEOUT:
    return ToolResult(f"{ERROR_PREFIX}tool timed out after {timeout_s:g}s", ERROR_TIMEOUT)
  if isinstance(outcome, ToolError):
    return ToolResult(f"{ERROR_PREFIX}{_cut(str(outcome))}", ERROR_TOOL)
  if isinstance(outcome, BaseException):
    return ToolResult(f"{ERROR_PREFIX}tool failed: {type(outcome).__name__}", ERROR_EXCEPTION)
  return ToolResult(_cut(outcome))


# The outcome of a call that ran past its limit.
_TIMEOUT = object()


class _Alarm(BaseException):
  # A BaseException, so that a tool's own `except Exception:` cannot swallow the time limit.
  pass


def _signal_available() -> bool:
  return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


def _run_with_alarm(fn, argument, timeout_s):
  """Runs the tool on this (main) thread, interrupted by `SIGALRM` after `timeout_s`."""

  def on_alarm(signum, frame):
    del signum, frame
    raise _Alarm()

  start = time.monotonic()
  previous_handler = signal.signal(signal.SIGALRM, on_alarm)
  previous_delay, previous_interval = signal.setitimer(signal.ITIMER_REAL, timeout_s)
  try:
    try:
      return str(fn(argument))
    finally:
      # Disarm before anything else, so the alarm cannot fire in the handlers below.
      signal.setitimer(signal.ITIMER_REAL, 0)
  except _Alarm:
    return _TIMEOUT
  except Exception as e:  # Any failure of the tool is an observation, not our failure.
    return e
  finally:
    # `None` means a handler installed outside Python, which cannot be reinstalled from here.
    signal.signal(signal.SIGALRM, signal.SIG_DFL if previous_handler is None else previous_handler)
    if previous_delay > 0:
      # Someone else's timer was running: give it back what remains (at least a tick).
      remaining = max(previous_delay - (time.monotonic() - start), 1e-3)
      signal.setitimer(signal.ITIMER_REAL, remaining, previous_interval)


def _run_in_thread(fn, argument, timeout_s):
  """Runs the tool in a daemon thread; a thread still running after `timeout_s` is abandoned."""
  box = []

  def target():
    try:
      box.append(str(fn(argument)))
    except BaseException as e:  # Even `SystemExit`: it would only end this helper thread.
      box.append(e)

  thread = threading.Thread(target=target, name="tool-call", daemon=True)
  thread.start()
  thread.join(timeout_s)
  if thread.is_alive():
    return _TIMEOUT
  return box[0]


def _cut(text: str) -> str:
  return text if len(text) <= MAX_OUTPUT_CHARS else text[: MAX_OUTPUT_CHARS - 3] + "..."
