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
    keys = self._draw_keys(rng)
    chain, distractors = keys[: self.horizon], keys[self.horizon :]
    answer = self._draw_number(rng)
    store = dict(zip(chain, [*chain[1:], answer], strict=True))
    self._add_distractors(store, distractors, keys, rng)
    return self._episode(split, index, starts=chain[0], store=store, answer=answer,
                         shown_chain=chain, shown_answer=answer)

  def _draw_keys(self, rng) -> list[str]:
    """`num_keys` distinct random keys, in draw order."""
    keys: list[str] = []  # A list, not a set: set order varies with PYTHONHASHSEED.
    while len(keys) < self.num_keys:
      key = "".join(rng.choice(string.ascii_lowercase) for _ in range(self.key_length))
      if key not in keys:
        keys.append(key)
    return keys

  def _add_distractors(self, store: dict[str, str], distractors, keys, rng) -> None:
    """Each distractor key points at a random key or a random number (half and half)."""
    for key in distractors:
      store[key] = rng.choice(keys) if rng.random() < 0.5 else self._draw_number(rng)

  def _episode(self, split: str, index: int, *, starts: str, store: Mapping[str, str],
               answer: str, shown_chain, shown_answer: str) -> base.Episode:
    """The episode: prompt from `starts`, the demonstration following `shown_chain`."""
    prompt = f"Follow the keys from {starts} to a number.\n"
    if self.instructions:
      prompt += (
        f"Look up with {TOOL_OPEN}get(key){TOOL_CLOSE}; reply {ANSWER_OPEN}n{ANSWER_CLOSE}.\n"
      )
    demonstration = [f"{TOOL_OPEN}get({key}){TOOL_CLOSE}" for key in shown_chain]
    demonstration.append(f"{ANSWER_OPEN}{shown_answer}{ANSWER_CLOSE}")
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


DEMO_BRANCHES = ("correct", "uniform")


@base.ENVS.register("kv_fork")
@dataclasses.dataclass(kw_only=True)
class KVForkEnv(KVLookupEnv):
  """Key-value lookup where the first call decides the episode (`"kv_fork"`).

  A credit-assignment variant of `kv_lookup` (RTPO, arXiv 2608.18682, §2.2 (B)): the prompt
  names `num_branches` start keys (the same but for their last letter), each the head of its
  own K-hop chain that ends in a number;
  only the chain of the FIRST-named key ends in the answer, the others in decoy numbers. Every
  chain looks alike hop by hop (keys, then a number after exactly K calls), so nothing between
  turn 0 and the answer tells the agent whether its first call was right: the turn-0 decision
  alone sets whether the episode can succeed, and its consequence shows only in the terminal
  reward. Episode 0 of "train" for K = 2, two branches (the first-named `uby` is right):

    Follow the keys from uby or ube to a number.
    <tool>get(uby)</tool>  <obs>tnq</obs>  <tool>get(tnq)</tool>  <obs>2468</obs>
    <answer>2468</answer>                                        reward 1
    (from ube: get(ube) → kkk → get(kkk) → 2800, a decoy, reward 0)

  The rule "follow the first-named key" is never stated; an agent learns it from rewards. With
  `demo_branch="uniform"` the demonstrations follow a start drawn uniformly per episode (a
  teacher that does not know the rule), so a policy cloned from them picks a branch at random
  and fails ≈ (1 − 1/num_branches) of its episodes at every horizon however well it copies
  keys; `"correct"` demonstrates the optimal trajectory.

  Attributes:
    num_branches: start keys in the prompt (>= 2); the store needs num_branches × K chain keys.
    demo_branch: "correct" or "uniform" (see above).
  """

  name = "kv_fork"

  num_keys: int = 24
  num_branches: int = 2
  demo_branch: str = "correct"

  def __post_init__(self):
    if self.num_branches < 2:
      raise ValueError(f"num_branches must be >= 2, got {self.num_branches}")
    if self.demo_branch not in DEMO_BRANCHES:
      raise ValueError(f"demo_branch must be one of {DEMO_BRANCHES}, got {self.demo_branch!r}")
    if self.num_keys < self.num_branches * self.horizon:
      raise ValueError(f"num_keys must be >= num_branches × horizon = "
                       f"{self.num_branches * self.horizon}, got {self.num_keys}")
    super().__post_init__()

  def make_episode(self, split: str, index: int) -> base.Episode:
    rng = base.example_rng(self.name, self.seed, split, index)
    keys = self._draw_keys(rng)
    k = self.horizon
    chains = [keys[b * k:(b + 1) * k] for b in range(self.num_branches)]
    # The start keys differ only in their last letter, so the turn-0 decision is one character
    # (which of the named last letters to copy) and the rest of the call is plain copying: a
    # model cloned from demonstrations that pick either start does not blend the two keys.
    for chain in chains[1:]:
      while True:
        key = chains[0][0][:-1] + rng.choice(string.ascii_lowercase)
        if key not in keys:
          break
      keys[keys.index(chain[0])] = chain[0] = key
    distractors = keys[self.num_branches * k:]
    ends: list[str] = []  # the answer first, then distinct decoys
    while len(ends) < self.num_branches:
      number = self._draw_number(rng)
      if number not in ends:
        ends.append(number)
    store: dict[str, str] = {}
    for chain, end in zip(chains, ends, strict=True):
      store.update(zip(chain, [*chain[1:], end], strict=True))
    self._add_distractors(store, distractors, keys, rng)
    # Drawn after the store, so the store is the same for both kinds of demonstration.
    shown = rng.randrange(self.num_branches) if self.demo_branch == "uniform" else 0
    return self._episode(split, index, starts=" or ".join(chain[0] for chain in chains),
                         store=store, answer=ends[0], shown_chain=chains[shown],
                         shown_answer=ends[shown])

  def stage_detectors(self, episode: base.Episode) -> list[base.StageDetector]:
    """K + 1 stages along the correct chain (from the first-named key), whatever the
    demonstration shows: hop k resolved for k = 1..K, then the correct answer."""
    store = _store(episode.hidden)
    key = episode.prompt.split("from ", 1)[1].split(" ", 1)[0]
    chain = []
    while not store[key].isdigit():
      chain.append(key)
      key = store[key]
    chain.append(key)

    def hop(key: str) -> base.StageDetector:
      reply = format_observation(store[key])
      return lambda action, observation: (
        action.tool == "get" and action.argument == key and observation == reply)

    return [*(hop(key) for key in chain), base.answer_stage(self, episode)]
