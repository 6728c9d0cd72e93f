"""Key-value lookup: follow a chain of K keys through a hidden store (`"kv_lookup"`).

A small stand-in for multi-hop search: the facts the answer needs are not in the prompt but in
a store only a tool can read, and each fact names where to look next. Episode and
demonstration for horizon K = 3:

  Follow the keys from qxv to a number.
  <tool>get(qxv)</tool>
  <obs>bmd</obs>
  <tool>get(bmd)</tool>
  <obs>tca</obs>
  <tool>get(tca)</tool>
  <obs>4172</obs>
  <answer>4172</answer>

Keys are lowercase letters and the final value is a number, so the model can tell when the
chain ends. The store holds `num_keys` entries: the K links of the chain plus distractors that
point to other keys (chain keys included) or to numbers, so the answer cannot be guessed from
the store's shape and every hop needs a call.

Tool: `get(key)` returns the key's value; an unknown key gives an `error: no key ...`
observation.

Reward: 1 when the answer is exactly the chain's final number, else 0.

Stages (`stage_times`, Temporal GRPO's detector, arXiv 2608.13026): K + 1, hop k resolved (the
k-th chain key looked up, its value returned) for k = 1..K, then the correct answer.
"""

from __future__ import annotations

import dataclasses
import functools
import random
import string
from collections.abc import Callable, Mapping

from jaxrl_post.envs import base
from jaxrl_post.envs.tools import (
  ANSWER_CLOSE,
  ANSWER_OPEN,
  TOOL_CLOSE,
  TOOL_OPEN,
  ToolError,
  format_observation,
  parse_action,
  quote,
)


@base.ENVS.register("kv_lookup")
@dataclasses.dataclass(kw_only=True)
class KVLookupEnv(base.Env):
  """Find the number at the end of a K-hop key chain with the `get` tool.

  Attributes:
    seed: varies the whole stream of episodes.
    num_keys: entries in the store, chain links included (>= horizon).
    key_length: letters per key.
    value_digits: digits of the numbers in the store.
    instructions: end the prompt with a line stating the tool and answer format (for models
      that were not fine-tuned on demonstrations).
  """

  name = "kv_lookup"

  seed: int = 0
  num_keys: int = 16
  key_length: int = 3
  value_digits: int = 4
  instructions: bool = False

  def __post_init__(self):
    super().__post_init__()
    if self.num_keys < self.horizon:
      raise ValueError(f"num_keys must be >= horizon = {self.horizon}, got {self.num_keys}")
    if self.key_length < 1 or 26**self.key_length < 2 * self.num_keys:
      # Half the key space at most, so drawing distinct keys stays quick.
      raise ValueError(
        f"key_length {self.key_length} leaves too few distinct keys for num_keys={self.num_keys}"
      )
    if self.value_digits < 1:
      raise ValueError(f"value_digits must be >= 1, got {self.value_digits}")

  def make_episode(self, split: str, index: int) -> base.Episode:
    rng = base.example_rng(self.name, self.seed, split, index)
    keys: list[str] = []  # A list, not a set: set order varies with PYTHONHASHSEED.
    while len(keys) < self.num_keys:
      key = "".join(rng.choice(string.ascii_lowercase) for _ in range(self.key_length))
      if key not in keys:
        keys.append(key)
    chain, distractors = keys[: self.horizon], keys[self.horizon :]
    answer = self._draw_number(rng)
    store = dict(zip(chain, [*chain[1:], answer], strict=True))
    for key in distractors:
      store[key] = rng.choice(keys) if rng.random() < 0.5 else self._draw_number(rng)
    prompt = f"Follow the keys from {chain[0]} to a number.\n"
    if self.instructions:
      prompt += (
        f"Look up with {TOOL_OPEN}get(key){TOOL_CLOSE}; reply {ANSWER_OPEN}n{ANSWER_CLOSE}.\n"
      )
    demonstration = [f"{TOOL_OPEN}get({key}){TOOL_CLOSE}" for key in chain]
    demonstration.append(f"{ANSWER_OPEN}{answer}{ANSWER_CLOSE}")
    return base.Episode(
      env=self.name,
      split=split,
      index=index,
      prompt=prompt,
      answer=answer,
      max_turns=self.max_turns,
      hidden=tuple(sorted(store.items())),
      demonstration=tuple(demonstration),
    )

  def tools(self, episode: base.Episode) -> Mapping[str, Callable[[str], object]]:
    return {"get": functools.partial(_get, _store(episode.hidden))}

  def score(self, episode: base.Episode, answer: str) -> float:
    return float(answer == episode.answer)

  def stage_detectors(self, episode: base.Episode) -> list[base.StageDetector]:
    """K + 1 stages: hop k = `get(key_k)` answered with the next link (k = 1..K), then the
    correct answer (the task-success condition).

    The chain is privileged state: the demonstration's calls, in order, and the store.
    """
    store = _store(episode.hidden)
    chain = [parse_action(action).argument for action in episode.demonstration[:-1]]

    def hop(key: str) -> base.StageDetector:
      reply = format_observation(store[key])
      return lambda action, observation: (
        action.tool == "get" and action.argument == key and observation == reply)

    return [*(hop(key) for key in chain), base.answer_stage(self, episode)]

  def _draw_number(self, rng: random.Random) -> str:
    return str(rng.randint(10 ** (self.value_digits - 1), 10**self.value_digits - 1))


@functools.lru_cache(maxsize=64)
def _store(hidden: tuple[tuple[str, str], ...]) -> dict[str, str]:
  # Cached: an episode's tools are rebuilt on every call, its store need not be.
  return dict(hidden)


def _get(store: Mapping[str, str], key: str) -> str:
  """The `get` tool over `store`."""
  if key not in store:
    raise ToolError(f"no key {quote(key)}")
  return store[key]
