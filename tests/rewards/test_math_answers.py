"""Answer extraction and comparison for GSM8K (numbers) and MATH (`math_verify` is the judge).

The MATH table asserts what `math_verify` 0.9 itself says for each pair (checked by hand when
the table was written); a change of verdict in a new `math_verify` shows up here first.
"""

import time
from fractions import Fraction

import pytest

from jaxrl_post.rewards import math_answers


@pytest.mark.parametrize("text, expected", [
  ("so \\boxed{72}.", "72"),
  ("\\boxed{1} then \\boxed{2}", "2"),                 # the last box
  ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),            # nested braces
  ("\\boxed{ \\{1,2\\} }", "\\{1,2\\}"),                # escaped braces do not close the box
  ("\\fbox{3}", "3"),
  ("\\boxed 5$ done", "5"),                            # MATH's brace-less box
  ("\\boxed{7} and then \\boxed{1", None),             # the last box is unclosed: no answer
  ("\\boxed{}", None),
  ("\\boxedx{3}", None),                               # not a box command
  ("no box", None),
  (None, None),
])
def test_last_boxed(text, expected):
  assert math_answers.last_boxed(text) == expected


# GSM8K: the last box if there is a box command, else the last number in the text.
@pytest.mark.parametrize("completion, gold, correct, fmt", [
  ("She sold 48 + 24 = 72 clips.", "72", 1.0, 0.0),        # no box: the last number
  ("48/2 = 24, so 72. Check: 3 steps.", "72", 0.0, 0.0),   # ... which is 3 here
  ("Total: \\boxed{72}", "72", 1.0, 1.0),
  ("\\boxed{72} ... or maybe 5", "72", 1.0, 1.0),          # a box wins over later numbers
  ("It costs $1,234.50 in all.", "1234.5", 1.0, 0.0),      # thousands commas, dollar
  ("\\boxed{1,000}", "1000", 1.0, 1.0),
  ("\\boxed{1{,}000}", "1000", 1.0, 1.0),                  # LaTeX's comma grouping
  ("\\boxed{\\$18}", "18", 1.0, 1.0),
  ("\\boxed{18 \\text{ dollars}}", "18", 1.0, 1.0),         # units are dropped
  ("\\boxed{x = 3}", "3", 1.0, 1.0),
  ("\\boxed{3.0}", "3", 1.0, 1.0),                         # trailing .0
  ("the change is -5.", "-5", 1.0, 0.0),                   # negative numbers
  ("from 5-3 we get", "-3", 0.0, 0.0),                     # a hyphen between numbers is no sign
  ("\\boxed{5}", "-5", 0.0, 1.0),
  ("\\boxed{\\frac{7}{2}}", "3.5", 1.0, 1.0),
  ("so 12 \\boxed{12", "12", 0.0, 0.0),                    # malformed box: wrong, no fallback
  ("\\boxed{twelve}", "12", 0.0, 1.0),
  ("no answer at all", "12", 0.0, 0.0),
])
def test_gsm8k_reward(completion, gold, correct, fmt):
  assert math_answers.gsm8k_reward(gold, completion) == (correct, fmt)


def test_gsm8k_gold_and_numbers():
  assert math_answers.gsm8k_gold("Half is <<48/2=24>>24.\n#### 1,024") == "1,024"
  assert math_answers.parse_number("-$1,234.50") == Fraction(-2469, 2)
  assert math_answers.parse_number("7/0") is None
  assert math_answers.parse_number("1" * 2000) is None  # over MAX_ANSWER_CHARS, no int() limit
  assert math_answers.gsm8k_reward("3", 42) == (0.0, 0.0)  # not a string: wrong, no exception


# MATH: (gold, completion, what math_verify says).
MATH_CASES = [
  ("\\frac{1}{2}", "The answer is \\boxed{1/2}.", True),
  ("\\frac{1}{2}", "\\boxed{0.5}", True),
  ("\\frac{1}{2}", "\\boxed{\\dfrac{1}{2}}", True),
  ("\\frac12", "\\boxed{\\frac{1}{2}}", True),
  ("10", "\\boxed{10\\text{ cm}}", True),                   # units are dropped
  ("10\\text{ cm}", "\\boxed{10}", True),
  ("(1,2]", "\\boxed{(1,2]}", True),
  ("(1,2]", "\\boxed{(1,2)}", False),                        # interval ends matter
  ("(1,2]", "\\boxed{[1,2]}", False),
  ("\\{1,2,3\\}", "\\boxed{\\{3,2,1\\}}", True),             # sets are unordered
  ("\\{1,2,3\\}", "\\boxed{3,2,1}", True),
  ("\\frac{\\sqrt{2}}{2}", "\\boxed{\\sqrt{2}/2}", True),
  ("\\frac{\\sqrt2}{2}", "\\boxed{\\frac{1}{\\sqrt{2}}}", True),
  ("3", "\\boxed{x=3}", True),
  ("x=3", "\\boxed{3}", True),
  ("-5", "\\boxed{-5}", True),
  ("-5", "\\boxed{5}", False),
  ("1000", "\\boxed{1,000}", True),
  ("50\\%", "\\boxed{50}", True),
  ("\\infty", "\\boxed{\\infty}", True),
  ("\\pi", "\\boxed{3.14159}", False),        # surprising? numbers compare to 6 digits
  ("1", "\\boxed{2} then \\boxed{1}", False),  # surprising: two boxes read as the set {1, 2}
  ("1", "The final answer is $1$", True),     # an anchored answer without a box counts
  ("1", "no box here, the answer is 1", False),  # a bare number without an anchor does not
]


@pytest.mark.parametrize("gold, completion, expected", MATH_CASES)
def test_math_reward_follows_math_verify(gold, completion, expected):
  correct, fmt = math_answers.math_reward(gold, completion)
  assert correct == float(expected)
  assert fmt == float(math_answers.last_boxed(completion) is not None)


def test_math_reward_malformed_inputs_are_wrong_without_exceptions():
  assert math_answers.math_reward("1", "\\boxed{1") == (0.0, 0.0)          # unclosed box
  assert math_answers.math_reward("1", "so \\boxed{1} and \\boxed{") == (0.0, 0.0)
  assert math_answers.math_reward("1", "\\boxed{\\frac{}{}}")[0] == 0.0    # unparseable
  assert math_answers.math_reward("\\frac{", "\\boxed{1}") == (0.0, 1.0)   # unparseable gold
  assert math_answers.math_reward("1", None) == (0.0, 0.0)


def test_math_verify_time_limit_raises_answer_timeout_in_process():
  # 9^(9^(9^9)) is cheap to parse and endless to compare: math_verify's own SIGALRM limit
  # (whole seconds, main thread only) stops it.
  tic = time.perf_counter()
  with pytest.raises(math_answers.AnswerTimeout):
    math_answers.math_reward("1", "\\boxed{9^{9^{9^{9}}}}", timeout_s=1)
  assert time.perf_counter() - tic < 3
