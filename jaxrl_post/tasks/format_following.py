"""Short instruction following with one-line answers (`"format"`).

  Reply with the word apple in uppercase, inside square brackets.
  ---- demonstration ----
  [APPLE]

An instruction combines a word, a style (uppercase, lowercase, capitalized, spelled backwards),
a wrapper (square brackets, parentheses, curly braces, double quotes, asterisks) and a repeat
count (`apple 3 times, separated by spaces` gives `[APPLE APPLE APPLE]`). For the lowercase
style the prompt shows the word in uppercase, so that the instruction is never a no-op.

Reward (surrounding whitespace is ignored): `correct` is 1 when the reply equals the answer
exactly; `format` is 1 when it has the requested shape: one line, the requested wrapper, and
inside it the requested number of space-separated runs of ASCII letters.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from jaxrl_post.tasks import base

# Ordinary nouns of 3-7 letters.
DEFAULT_WORDS = (
  "apple", "river", "stone", "cloud", "tiger", "maple", "piano", "rocket", "garden", "silver",
  "candle", "forest", "orange", "window", "bridge", "pencil", "yellow", "market", "castle",
  "violet", "anchor", "butter", "copper", "dragon", "ember", "falcon", "glacier", "harbor",
  "island", "jungle", "kettle", "lemon", "meadow", "needle", "ocean", "pepper", "quartz",
  "rabbit", "saddle", "thunder", "velvet", "walnut", "zebra", "cactus", "dolphin", "feather",
  "lantern", "marble", "planet", "shadow", "tunnel", "basket", "cherry", "desert", "engine",
  "mirror", "puzzle", "rain", "sun", "owl", "fox", "oak", "map", "cup", "key", "box",
)

STYLES = {
  "upper": "in uppercase",
  "lower": "in lowercase",
  "title": "capitalized",
  "reverse": "spelled backwards",
}

# name -> (how the prompt says it, opening text, closing text)
WRAPPERS = {
  "brackets": ("square brackets", "[", "]"),
  "parentheses": ("parentheses", "(", ")"),
  "braces": ("curly braces", "{", "}"),
  "quotes": ("double quotes", '"', '"'),
  "asterisks": ("asterisks", "*", "*"),
}

# Any real answer is far shorter; longer replies are rejected before any work is done on them.
_MAX_REPLY_CHARS = 1000
_LETTERS_RE = re.compile(r"[A-Za-z]+", re.ASCII)


@base.TASKS.register("format")
@dataclasses.dataclass(frozen=True)
class FormatFollowingTask(base.Task):
  """Reply with a word in a requested style, wrapper and repeat count.

  Attributes:
    seed: varies the whole stream of examples.
    words: the vocabulary, lowercase ASCII words.
    styles: the styles to draw from, names of `STYLES`.
    wrappers: the wrappers to draw from, names of `WRAPPERS`.
    max_repeats: the repeat count is uniform in `[1, max_repeats]`.
  """

  name = "format"

  seed: int = 0
  words: tuple[str, ...] = DEFAULT_WORDS
  styles: tuple[str, ...] = tuple(STYLES)
  wrappers: tuple[str, ...] = tuple(WRAPPERS)
  max_repeats: int = 1

  def __post_init__(self):
    # Configs hand lists over; tuples keep the frozen dataclass hashable.
    for field in ("words", "styles", "wrappers"):
      value = getattr(self, field)
      if isinstance(value, str) or not value:
        raise ValueError(f"{field} must be a non-empty sequence of strings, got {value!r}")
      object.__setattr__(self, field, tuple(value))
    for word in self.words:
      if not (_LETTERS_RE.fullmatch(word) and word.islower()):
        raise ValueError(f"words must be lowercase ASCII letters, got {word!r}")
    for field, valid in (("styles", STYLES), ("wrappers", WRAPPERS)):
      unknown = sorted(set(getattr(self, field)) - set(valid))
      if unknown:
        raise ValueError(f"unknown {field} {unknown}; valid: {', '.join(valid)}")
    if self.max_repeats < 1:
      raise ValueError(f"max_repeats must be >= 1, got {self.max_repeats}")

  def make_example(self, split: str, index: int) -> dict[str, Any]:
    rng = base.example_rng(self.name, self.seed, split, index)
    word = rng.choice(self.words)
    style = rng.choice(self.styles)
    wrapper = rng.choice(self.wrappers)
    repeats = rng.randint(1, self.max_repeats)

    shown = word.upper() if style == "lower" else word
    count = "" if repeats == 1 else f" {repeats} times, separated by spaces,"
    spoken, opening, closing = WRAPPERS[wrapper]
    prompt = f"Reply with the word {shown}{count} {STYLES[style]}, inside {spoken}.\n"
    answer = opening + " ".join([_styled(word, style)] * repeats) + closing
    meta = {"word": word, "style": style, "wrapper": wrapper, "repeats": repeats}
    return base.make_record(self.name, index, prompt, answer, answer, meta)

  def reward(self, record: Mapping[str, Any], completion: str) -> base.Reward:
    if not isinstance(completion, str) or len(completion) > _MAX_REPLY_CHARS:
      return base.Reward(0.0, 0.0)
    reply = completion.strip()
    meta = base.parse_meta(record)
    _, opening, closing = WRAPPERS[meta["wrapper"]]
    shaped = (
      len(reply) >= len(opening) + len(closing)
      and reply.startswith(opening)
      and reply.endswith(closing)
    )
    if shaped:
      items = reply[len(opening) : len(reply) - len(closing)].split(" ")
      shaped = len(items) == meta["repeats"] and all(_LETTERS_RE.fullmatch(w) for w in items)
    return base.Reward(float(reply == record["answer"]), float(shaped))


def _styled(word: str, style: str) -> str:
  return {
    "upper": word.upper(),
    "lower": word,
    "title": word.capitalize(),
    "reverse": word[::-1],
  }[style]
