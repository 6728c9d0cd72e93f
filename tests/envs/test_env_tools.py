"""The action format's parser and running tools under a time limit."""

import doctest
import signal
import threading
import time

import pytest

from jaxrl_post.envs import tools
from jaxrl_post.envs.tools import Action, ToolError, call_tool, parse_action


def test_doctests():
  assert doctest.testmod(tools).failed == 0


@pytest.mark.parametrize(
  "text, expected",
  [
    ("<tool>calc(12*34)</tool>", Action(tool="calc", argument="12*34")),
    # Reasoning before the block, whitespace around the call and after the closing tag.
    ("12*34 is big\n<tool> calc( 12*34 ) </tool>\n ", Action(tool="calc", argument="12*34")),
    # The argument runs to the last ')', so it may hold parentheses itself.
    ("<tool>calc((1+2)*3)</tool>", Action(tool="calc", argument="(1+2)*3")),
    ("<tool>get()</tool>", Action(tool="get", argument="")),
    ("<tool>_x9(a b)</tool>", Action(tool="_x9", argument="a b")),
    ("so <answer> 408 </answer>", Action(answer="408")),
    ("<answer></answer>", Action(answer="")),  # Valid, and wrong for every env here.
  ],
)
def test_parse_valid(text, expected):
  assert parse_action(text) == expected


@pytest.mark.parametrize(
  "text, message",
  [
    ("", "expected <tool>name(arg)</tool> or <answer>text</answer>"),
    ("calc(12*34)", "expected <tool>"),
    ("<tool>calc(1+2)</tool><tool>calc(3+4)</tool>", "one <tool> block per turn, found 2"),
    ("<answer>1</answer><answer>2</answer>", "one <answer> block per turn, found 2"),
    ("<tool>calc(1+2)</tool><answer>3</answer>", "either a tool call or an answer, not both"),
    ("<tool><answer>3</answer></tool>", "not both"),
    ("<tool>calc(1+2)", "unbalanced <tool>...</tool>"),
    ("calc(1+2)</tool>", "unbalanced"),
    ("</tool>calc(1+2)<tool>", "unbalanced"),
    ("<answer>3", "unbalanced <answer>...</answer>"),
    ("<tool>calc(1+2)</tool> and more", "text after </tool>"),
    ("<answer>3</answer>.", "text after </answer>"),
    ("<tool>calc 1+2</tool>", "malformed call 'calc 1+2'; expected name(arg)"),
    ("<tool>calc(1+2</tool>", "malformed call"),
    ("<tool>9calc(1)</tool>", "malformed call"),
    ("<tool>(1+2)</tool>", "malformed call"),
    ("<tool>calc(1)x</tool>", "malformed call"),
    ("<tool>" + "x" * 100 + "</tool>", "malformed call 'xxxxxxxxxxxxxxxxxxxxxxxx...'"),
    ("<tool>calc\u00e9(1)</tool>", r"malformed call 'calc\xe9(1)'"),  # Echoed as ASCII.
  ],
)
def test_parse_malformed(text, message):
  action = parse_action(text)
  assert action.tool is None and action.answer is None
  assert message in action.error


def test_parse_non_string():
  assert parse_action(None).error == "action must be text, got NoneType"


def _raise_value_error(arg):
  raise ValueError(arg)


def _reject(arg):
  raise ToolError(f"bad argument {arg}")


def _sleep(arg):
  time.sleep(10)


def _spin(arg):
  while True:
    pass


def _swallow_everything(arg):
  # A tool that catches `Exception` must still be stopped by the time limit.
  while True:
    try:
      time.sleep(10)
    except Exception:
      pass


@pytest.mark.parametrize("use_signal", [True, False])
def test_call_tool_outcomes(use_signal):
  call = lambda fn, arg="x": call_tool(fn, arg, timeout_s=1.0, use_signal=use_signal)
  assert call(str.upper) == ("X", None)
  assert call(len, "abc") == ("3", None)  # Outputs are converted to text.
  assert call(_reject) == ("error: bad argument x", tools.ERROR_TOOL)
  assert call(_raise_value_error) == ("error: tool failed: ValueError", tools.ERROR_EXCEPTION)
  long = call(lambda arg: "y" * 1000)
  assert long.error is None and len(long.output) == tools.MAX_OUTPUT_CHARS
  assert long.output.endswith("...")


# Spinning tools run only under the signal timer: the thread fallback abandons its thread, and
# a spinning one would keep a core busy for the rest of the test run.
@pytest.mark.parametrize(
  "fn, use_signal",
  [(_sleep, True), (_spin, True), (_swallow_everything, True), (_sleep, False)],
)
def test_call_tool_timeout(fn, use_signal):
  start = time.monotonic()
  result = call_tool(fn, "x", timeout_s=0.2, use_signal=use_signal)
  elapsed = time.monotonic() - start
  assert result == ("error: tool timed out after 0.2s", tools.ERROR_TIMEOUT)
  assert 0.15 < elapsed < 2.0


def test_alarm_restores_handler_and_outer_timer():
  fired = []
  previous = signal.signal(signal.SIGALRM, lambda signum, frame: fired.append(signum))
  try:
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    assert call_tool(str.upper, "a", timeout_s=5.0, use_signal=True).output == "A"
    assert call_tool(_sleep, "a", timeout_s=0.05, use_signal=True).error == tools.ERROR_TIMEOUT
    # The outer timer is still armed with what remained of its 0.5 s, and its handler is back.
    remaining, _ = signal.getitimer(signal.ITIMER_REAL)
    assert 0.0 < remaining <= 0.45
    time.sleep(0.6)
    assert fired == [signal.SIGALRM]
  finally:
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)


def test_default_off_main_thread_uses_a_watchdog_thread():
  results = []
  worker = threading.Thread(target=lambda: results.append(call_tool(_sleep, "", timeout_s=0.1)))
  worker.start()
  worker.join(5.0)
  assert results == [("error: tool timed out after 0.1s", tools.ERROR_TIMEOUT)]


def test_invalid_timeout():
  with pytest.raises(ValueError, match="timeout_s"):
    call_tool(str.upper, "a", timeout_s=0)
