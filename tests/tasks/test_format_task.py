"""Format following: prompts, answers for every style and wrapper, verifier goldens, knobs."""

import json

import pytest

from jaxrl_post.tasks import format_following, get_task


def _record(word="apple", style="upper", wrapper="brackets", repeats=1, answer="[APPLE]"):
  meta = {"word": word, "style": style, "wrapper": wrapper, "repeats": repeats}
  return {"answer": answer, "meta": json.dumps(meta)}


@pytest.mark.parametrize(
  "style, wrapper, repeats, prompt, answer",
  [
    ("upper", "brackets", 1,
     "Reply with the word apple in uppercase, inside square brackets.\n", "[APPLE]"),
    ("lower", "parentheses", 1,
     "Reply with the word APPLE in lowercase, inside parentheses.\n", "(apple)"),
    ("title", "braces", 2,
     "Reply with the word apple 2 times, separated by spaces, capitalized, inside curly "
     "braces.\n", "{Apple Apple}"),
    ("reverse", "quotes", 1,
     "Reply with the word apple spelled backwards, inside double quotes.\n", '"elppa"'),
    ("upper", "asterisks", 3,
     "Reply with the word apple 3 times, separated by spaces, in uppercase, inside "
     "asterisks.\n", "*APPLE APPLE APPLE*"),
  ],
)
def test_prompt_and_answer_goldens(style, wrapper, repeats, prompt, answer):
  # A one-word vocabulary and one style / wrapper pins the example; the repeat count is found
  # by scanning indices.
  task = get_task("format", words=["apple"], styles=[style], wrappers=[wrapper],
                  max_repeats=repeats)
  record = next(
    r for r in (task.make_example("train", i) for i in range(50))
    if json.loads(r["meta"])["repeats"] == repeats
  )
  assert record["prompt"] == prompt
  assert record["answer"] == record["demonstration"] == answer
  assert task.reward(record, answer) == (1.0, 1.0)


def test_all_combinations_verify_and_stay_short():
  task = get_task("format", max_repeats=3)
  seen = set()
  for index in range(400):
    record = task.make_example("train", index)
    meta = json.loads(record["meta"])
    seen.add((meta["style"], meta["wrapper"], meta["repeats"]))
    assert task.reward(record, record["answer"]) == (1.0, 1.0)
    assert task.reward(record, f"  {record['answer']}\n") == (1.0, 1.0)
    assert len(record["answer"]) <= 3 * 8 + 4  # Very short replies: three words at most.
  assert len(seen) == len(format_following.STYLES) * len(format_following.WRAPPERS) * 3


@pytest.mark.parametrize(
  "completion, expected",
  [
    ("[APPLE]", (1.0, 1.0)),
    ("\n [APPLE] \n", (1.0, 1.0)),
    ("[apple]", (0.0, 1.0)),
    ("[BANANA]", (0.0, 1.0)),
    ("[ELPPA]", (0.0, 1.0)),
    ("APPLE", (0.0, 0.0)),
    ("(APPLE)", (0.0, 0.0)),
    ("[APPLE", (0.0, 0.0)),
    ("[APPLE]]", (0.0, 0.0)),
    ("[APPLE APPLE]", (0.0, 0.0)),  # Two words where one was asked for.
    ("[AP-PLE]", (0.0, 0.0)),
    ("[ÄPPLE]", (0.0, 0.0)),
    ("[]", (0.0, 0.0)),
    ("Sure! [APPLE]", (0.0, 0.0)),
    ("[APPLE]\n[APPLE]", (0.0, 0.0)),
    ("[" + "A" * 5000 + "]", (0.0, 0.0)),
    ("", (0.0, 0.0)),
  ],
)
def test_reward_goldens(completion, expected):
  assert get_task("format").reward(_record(), completion) == expected


def test_repeats_and_same_character_wrappers():
  record = _record(wrapper="quotes", repeats=2, answer='"APPLE APPLE"')
  task = get_task("format")
  assert task.reward(record, '"APPLE APPLE"') == (1.0, 1.0)
  assert task.reward(record, '"APPLE  APPLE"') == (0.0, 0.0)  # Two spaces: an empty item.
  assert task.reward(record, '"APPLE"') == (0.0, 0.0)
  assert task.reward(record, '"') == (0.0, 0.0)  # One quote is not an opening and a closing.


@pytest.mark.parametrize(
  "knobs, match",
  [
    ({"words": []}, "words"),
    ({"words": "apple"}, "words"),
    ({"words": ["Apple"]}, "lowercase ASCII"),
    ({"words": ["café"]}, "lowercase ASCII"),
    ({"styles": ["shout"]}, "unknown styles"),
    ({"wrappers": ["angle"]}, "unknown wrappers"),
    ({"max_repeats": 0}, "max_repeats"),
  ],
)
def test_invalid_knobs(knobs, match):
  with pytest.raises(ValueError, match=match):
    get_task("format", **knobs)


def test_default_words_are_distinct_lowercase_letters():
  words = format_following.DEFAULT_WORDS
  assert len(set(words)) == len(words)
  assert all(w.isascii() and w.isalpha() and w.islower() for w in words)
