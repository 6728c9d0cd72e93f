"""The task interface: answer parsing, registry, determinism, alphabet, robustness to garbage."""

import json
import os
import random
import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest

from jaxrl_post.tasks import TASKS, base, get_task
from jaxrl_post.tokenizers import CharTokenizer

SYNTHETIC = ("arith", "countdown", "format")

# Knob settings per synthetic task: the defaults and a harder / different one.
KNOB_SETTINGS = [
  ("arith", {}),
  ("arith", {"min_digits": 3, "max_digits": 5, "num_operands": 4}),
  ("arith", {"operations": "-", "num_operands": 3}),
  ("countdown", {}),
  ("countdown", {"num_numbers": 6, "max_number": 100, "min_target": 100, "max_target": 999}),
  ("countdown", {"num_numbers": 3, "operations": "+-", "use_all": False}),
  ("format", {}),
  ("format", {"max_repeats": 4, "styles": ["reverse", "lower"]}),
]

GARBAGE = [
  "",
  " ",
  "\n\n\n",
  "####",
  "#### ",
  "####\n",
  "#### \x00\x01",
  "#### ٤٠٥",  # Arabic-Indic digits: `int()` would accept them.
  "#### ４０５",  # Fullwidth digits, likewise.
  "#### 405\n#### 406",
  "#### 405\n  #### 406",
  "  #### 405\nmore text",
  "🙂" * 1000,
  "Ünïcödé ✓ —\n#### ½",
  "#### " + "9" * 100_000,  # Past Python's 4300-digit int() limit.
  "#### " + "(" * 100_000,
  "#### " + "(" * 40 + "1" + ")" * 40,
  "#### " + "1+" * 5000 + "1",
  "[" * 50_000 + "]" * 50_000,
  "\n".join(["#### 12"] * 10_000),
  "".join(chr(c) for c in range(0, 2000)),
  "#### 1/0",
  "#### 2**99999999",
  "#### __import__('os').system('true')",
  None,
  12,
  b"#### 405",
]


def _encodable(text):
  CharTokenizer().encode(text)  # Raises on a character outside the alphabet.
  return True


@pytest.mark.parametrize(
  "completion, expected",
  [
    ("7+8=15\n#### 405", "405"),
    ("#### 405  \n\n", "405"),
    ("work\n   ####   -12 ", "-12"),
    ("#### (1+2)*3", "(1+2)*3"),
    ("no answer line", None),
    ("#### 405\nthen more", None),  # The answer line must be the last.
    ("#### 405\n#### 406", None),  # Hedging over two answers.
    ("#### 1\n  #### 2", None),
    ("####", None),
    ("#### ", None),
    ("#### " + "1" * 1001, None),  # Longer than MAX_ANSWER_CHARS.
    ("", None),
    (None, None),
    (405, None),
  ],
)
def test_final_answer(completion, expected):
  assert base.final_answer(completion) == expected


def test_parse_integer_and_number():
  assert base.parse_integer("405") == 405
  assert base.parse_integer("-12") == -12
  assert base.parse_integer("0405") == 405
  for bad in ("4 05", "+4", "4.0", "４０５", "٤٠٥", "", None, "9" * 5000):
    assert base.parse_integer(bad) is None, bad
  assert base.parse_number("1,000") == 1000
  assert base.parse_number("$1,000.50") == Fraction(200_100, 200)
  assert base.parse_number("72.") == 72  # A sentence's full stop.
  assert base.parse_number("-0.5") == Fraction(-1, 2)
  for bad in ("1,00", "abc", "1e3", "", None, "1" * 2000):
    assert base.parse_number(bad) is None, bad


def test_registry_and_get_task_errors():
  assert {'arith', 'countdown', 'format', 'jsonl', 'mixture', 'parquet'} <= set(TASKS.names())
  with pytest.raises(KeyError,
                     match="valid names: .*arith, countdown, format, .*jsonl, .*parquet"):
    get_task("arithmetic")
  with pytest.raises(TypeError, match=r"no knob\(s\) \['digits'\]; valid knobs: seed, min_digits"):
    get_task("arith", digits=3)
  assert get_task("arith", max_digits=5).max_digits == 5


@pytest.mark.parametrize("name, knobs", KNOB_SETTINGS)
def test_records_are_well_formed_and_within_the_alphabet(name, knobs):
  task = get_task(name, **knobs)
  for index in range(60):
    record = task.make_example("train", index)
    assert list(record) == list(base.RECORD_FIELDS)
    assert record["task"] == name and record["index"] == index
    assert record["prompt"].endswith("\n")
    json.loads(record["meta"])
    for field in ("prompt", "answer", "demonstration", "meta"):
      assert _encodable(record[field])
    # The reference completion earns full reward: the demonstrations are valid SFT targets.
    assert task.reward(record, record["demonstration"]) == (1.0, 1.0)


@pytest.mark.parametrize("name", SYNTHETIC)
def test_examples_are_a_pure_function_of_seed_split_and_index(name):
  task = get_task(name)
  forward = [task.make_example("train", i) for i in range(20)]
  backward = [task.make_example("train", i) for i in reversed(range(20))][::-1]
  assert forward == backward  # Independent of what was generated before.
  assert forward == [get_task(name).make_example("train", i) for i in range(20)]
  prompts = [r["prompt"] for r in forward]
  assert len(set(prompts)) > 15  # Indices give different examples...
  # ...and so do seeds and splits.
  assert [get_task(name, seed=1).make_example("train", i)["prompt"] for i in range(20)] != prompts
  assert [task.make_example("test", i)["prompt"] for i in range(20)] != prompts


def test_examples_do_not_depend_on_the_process():
  # PYTHONHASHSEED changes `hash(str)`; the examples must not change with it.
  code = (
    "import json; from jaxrl_post.tasks import get_task; "
    "print(json.dumps([get_task(n).make_example('train', i) "
    "for n in ('arith', 'countdown', 'format') for i in range(10)]))"
  )
  env = {**os.environ, "PYTHONHASHSEED": "12345"}
  out = subprocess.run(
    [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
  ).stdout
  here = [get_task(n).make_example("train", i) for n in SYNTHETIC for i in range(10)]
  assert json.loads(out) == here


def test_invalid_split_or_index():
  task = get_task("arith")
  with pytest.raises(ValueError, match="non-negative int"):
    task.make_example("train", -1)
  with pytest.raises(ValueError, match="split must be a non-empty string"):
    task.make_example("", 0)


@pytest.mark.parametrize("name", SYNTHETIC)
def test_garbage_never_raises(name):
  task = get_task(name)
  record = task.make_example("train", 0)
  for completion in GARBAGE:
    reward = task.reward(record, completion)
    assert reward == (0.0, 0.0) or completion == "#### 1/0", repr(completion)[:80]


@pytest.mark.parametrize("name", SYNTHETIC)
def test_random_noise_never_raises(name):
  task = get_task(name)
  rng = random.Random(0)
  pieces = list("0123456789+-*/() #\n[]{}\"*") + ["####", "APPLE", "é", "\u200b", "🙂"]
  for i in range(300):
    record = task.make_example("train", i % 7)
    completion = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 60)))
    if i % 2:
      completion += "\n#### " + completion
    correct, fmt = task.reward(record, completion)
    assert correct in (0.0, 1.0) and fmt in (0.0, 1.0)
    assert correct <= fmt  # A right answer is always well-formed.


def test_reward_batch_scores_columns():
  task = get_task("arith")
  records = [task.make_example("train", i) for i in range(4)]
  batch = {key: np.array([r[key] for r in records], dtype=object) for key in base.RECORD_FIELDS}
  completions = [records[0]["demonstration"], "#### 0", "", records[3]["demonstration"]]
  correct, fmt = task.reward_batch(batch, completions)
  assert correct.dtype == np.float32 and fmt.dtype == np.float32
  # Example 1 is 6+4=10, so "#### 0" is well-formed but wrong.
  np.testing.assert_array_equal(correct, [1, 0, 0, 1])
  np.testing.assert_array_equal(fmt, [1, 1, 0, 1])
  with pytest.raises(ValueError, match="4 records but 3 completions"):
    task.reward_batch(batch, completions[:3])
