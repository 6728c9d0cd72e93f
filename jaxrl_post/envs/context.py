"""Context functions ψ, trajectory records, and their token arrays with per-token masks.

RTPO (arXiv 2608.18682) conditions turn k on `c_k = ψ(S_k)`, where the transcript
`S_k = (q, l_0, f_0, ..., l_{k-1}, f_{k-1})` is the prompt followed by the earlier actions
(turns) and observations (feedback). `c_k` is recorded at rollout and reused verbatim in
training, so that the importance ratio's numerator and denominator see the same context.

Context functions map a transcript, a sequence of `Segment(role, text)`, to the segments the
model sees; the model's input is their concatenation (`render`). Three are registered in
`CONTEXTS`:

  identity         the whole transcript
  truncate         its last `max_tokens` tokens (per a tokenizer), optionally always keeping
                   the prompt; the oldest kept segment may be cut mid-way
  drop_reasoning   earlier actions reduced to their `<tool>...</tool>` / `<answer>...</answer>`
                   blocks (as Qwen3's chat template drops earlier `<think>` blocks)

Each is a `ContextFn` that knows its name and parameters (`spec()`), so a trajectory records
which ψ made its contexts, and `make_context(spec, tokenizer=...)` builds the same ψ again.

A `Trajectory` holds one `Turn` per action: the context it was sampled under, the env snapshot
before it (where RTPO restarts siblings), the action, the observation, the reward and `info`.
`play` produces one from a policy or a fixed list of actions (e.g. a demonstration), and
`to_tokens` / `turn_to_tokens` turn it into arrays for training:

  full history (SFT, flat GRPO)    prompt | a_0 | o_0 | a_1 | o_1 | ...
  one turn (RTPO)                  c_k | a_k
  action_mask                      True on the a_j tokens being trained, False elsewhere

Segments are encoded one at a time and concatenated, so every token belongs to exactly one
segment and the masks are exact; a sampler that encodes contexts the same way produces the
same ids. (For a character tokenizer this equals encoding the concatenated text.)
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from jaxrl_post.envs import tools
from jaxrl_post.envs.base import ACTION, PROMPT, ROLES, Env, EnvState, Episode, Segment
from jaxrl_post.registry import Registry
from jaxrl_post.tokenizers import Tokenizer

_BLOCK_RE = re.compile(
  rf"{re.escape(tools.TOOL_OPEN)}.*?{re.escape(tools.TOOL_CLOSE)}"
  rf"|{re.escape(tools.ANSWER_OPEN)}.*?{re.escape(tools.ANSWER_CLOSE)}",
  re.DOTALL,
)


def render(segments: Iterable[Segment]) -> str:
  """The model's input text: the segments' texts concatenated."""
  return "".join(segment.text for segment in segments)


# ---- context functions ----


@dataclasses.dataclass(frozen=True)
class ContextFn:
  """A context function ψ with the name and parameters that rebuild it.

  Attributes:
    name: its name in `CONTEXTS`.
    params: its JSON-able parameters (a tokenizer, if it needs one, is not among them).
    fn: the function itself, transcript segments to context segments.
  """

  name: str
  params: Mapping[str, Any]
  fn: Callable[[tuple[Segment, ...]], tuple[Segment, ...]] = dataclasses.field(
    repr=False, compare=False
  )

  def __call__(self, segments: Iterable[Segment | tuple[str, str]]) -> tuple[Segment, ...]:
    """ψ of a transcript; `(role, text)` pairs are accepted for segments.

    Raises:
      ValueError: for a role other than `"prompt"`, `"action"` and `"observation"`.
    """
    checked = []
    for role, text in segments:
      if role not in ROLES:
        raise ValueError(f"segment role must be one of {ROLES}, got {role!r}")
      checked.append(Segment(role, text))
    return self.fn(tuple(checked))

  def text(self, segments: Iterable[Segment | tuple[str, str]]) -> str:
    """The model's input text for a transcript: `render(self(segments))`."""
    return render(self(segments))

  def spec(self) -> dict[str, Any]:
    """`{"name": ..., **params}`, the record `make_context` rebuilds this function from."""
    return {"name": self.name, **self.params}


CONTEXTS: Registry[Callable[..., ContextFn]] = Registry("context")


@CONTEXTS.register("identity")
def identity() -> ContextFn:
  """ψ(S) = S: the model sees the whole transcript."""
  return ContextFn("identity", {}, lambda segments: segments)


@CONTEXTS.register("truncate")
def truncate(max_tokens: int, *, tokenizer: Tokenizer, keep_prompt: bool = False) -> ContextFn:
  """The last `max_tokens` tokens of the transcript.

  Whole segments are kept from the newest back while they fit; the next one is cut to the
  tokens that still fit (its last ones) and older ones are dropped. Text is measured with
  `tokenizer.encode` per segment, without bos.

  >>> from jaxrl_post.tokenizers import CharTokenizer
  >>> psi = truncate(6, tokenizer=CharTokenizer())
  >>> [text for _, text in psi([("prompt", "Q: 1+2="), ("action", "<a>"), ("observation", "3;")])]
  ['=', '<a>', '3;']

  Args:
    max_tokens: the budget (>= 1).
    tokenizer: measures segments; with a subword tokenizer, a cut segment is decoded from its
      last tokens and re-measured, dropping tokens until it fits.
    keep_prompt: always keep the whole prompt and spend the rest of the budget on the newest
      segments; when the prompt alone exceeds the budget, it is cut like any other segment.
  """
  if max_tokens < 1:
    raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")

  def fn(segments: tuple[Segment, ...]) -> tuple[Segment, ...]:
    head, body, budget = (), segments, max_tokens
    if keep_prompt and segments and segments[0].role == PROMPT:
      prompt_len = len(tokenizer.encode(segments[0].text))
      if prompt_len <= max_tokens:
        head, body, budget = segments[:1], segments[1:], max_tokens - prompt_len
    kept = []
    for segment in reversed(body):
      ids = tokenizer.encode(segment.text)
      if len(ids) <= budget:
        kept.append(segment)
        budget -= len(ids)
        continue
      if budget > 0:
        kept.append(Segment(segment.role, _last_tokens_text(tokenizer, ids, budget)))
      break
    return head + tuple(reversed(kept))

  return ContextFn("truncate", {"max_tokens": max_tokens, "keep_prompt": keep_prompt}, fn)


@CONTEXTS.register("drop_reasoning")
def drop_reasoning() -> ContextFn:
  """Earlier actions keep only their tool-call / answer blocks; other segments are unchanged.

  A context holds only turns before the one being sampled, so every action in it is earlier.
  An action without a complete block becomes empty (its error observation stays).

  >>> drop_reasoning()([("action", "12*3 is hard <tool>calc(12*3)</tool>")])
  (Segment(role='action', text='<tool>calc(12*3)</tool>'),)
  """

  def fn(segments: tuple[Segment, ...]) -> tuple[Segment, ...]:
    return tuple(
      Segment(ACTION, "".join(_BLOCK_RE.findall(s.text))) if s.role == ACTION else s
      for s in segments
    )

  return ContextFn("drop_reasoning", {}, fn)


def make_context(spec: str | Mapping[str, Any], *, tokenizer: Tokenizer | None = None) -> ContextFn:
  """The context function a spec names: `"identity"` or `{"name": ..., **params}`.

  `make_context(psi.spec(), tokenizer=tok)` rebuilds `psi`.

  Raises:
    KeyError: for an unknown name, listing the valid ones.
    ValueError: when the function needs a tokenizer and none is given.
  """
  if isinstance(spec, str):
    name, params = spec, {}
  else:
    params = dict(spec)
    name = params.pop("name")
  factory = CONTEXTS.get(name)
  if "tokenizer" in inspect.signature(factory).parameters:
    if tokenizer is None:
      raise ValueError(f"context {name!r} needs a tokenizer")
    params["tokenizer"] = tokenizer
  return factory(**params)


def _last_tokens_text(tokenizer: Tokenizer, ids: Sequence[int], n: int) -> str:
  """The text of the last `n` of `ids`, shortened until it encodes to at most `n` tokens."""
  while n > 0:
    # Special tokens are kept as text: they are part of the segment (e.g. tags registered as
    # special tokens), and re-encoding turns them back into their ids.
    text = tokenizer.decode(ids[-n:], skip_special=False)
    if len(tokenizer.encode(text)) <= n:
      return text
    n -= 1
  return ""


# ---- trajectories ----


@dataclasses.dataclass(frozen=True)
class Turn:
  """One action of an episode, with everything needed to train on it or restart from it.

  Attributes:
    index: k, the turn's position in the episode (0-based).
    context: `c_k = ψ(S_k)`, the segments the action was sampled under, verbatim.
    action: the model's text.
    observation: the env's reply (`""` after an answer).
    reward: the env's reward for the turn.
    done: whether the episode ended with this turn.
    info: the step's `info` (see `StepResult`).
    snapshot: the env state before the action (`S_k`); `Env.restore` it to resample turn k.
  """

  index: int
  context: tuple[Segment, ...]
  action: str
  observation: str
  reward: float
  done: bool
  info: dict[str, Any]
  snapshot: EnvState

  @property
  def context_text(self) -> str:
    return render(self.context)


@dataclasses.dataclass(frozen=True)
class Trajectory:
  """An episode, or its continuation from a snapshot, as played by `play`.

  Attributes:
    turns: the turns played, in order; `turns[0].index` is 0 unless play started from a
      snapshot.
    final_state: the env state after the last turn.
    context_spec: the spec of the ψ that made the turns' contexts (see `make_context`).
  """

  turns: tuple[Turn, ...]
  final_state: EnvState
  context_spec: dict[str, Any]

  @property
  def episode(self) -> Episode:
    return self.final_state.episode

  @property
  def segments(self) -> tuple[Segment, ...]:
    """The whole transcript, from the prompt (also the turns before a starting snapshot)."""
    return self.final_state.segments

  @property
  def done(self) -> bool:
    return self.final_state.done

  @property
  def reward(self) -> float:
    """The reward collected by the turns played (the episode's return when played from 0)."""
    return float(sum(turn.reward for turn in self.turns))

  @property
  def actions(self) -> list[str]:
    return [turn.action for turn in self.turns]


def play(
  env: Env,
  policy: Callable[[str], str] | Iterable[str],
  *,
  index: int | None = None,
  split: str = "train",
  snapshot: EnvState | None = None,
  context: ContextFn | None = None,
) -> Trajectory:
  """Plays an episode from its start (`index`) or from `snapshot` until it ends.

  Args:
    env: the environment; it is reset or restored, then stepped.
    policy: a function from the context text to an action, or the actions themselves (a
      demonstration, or a recorded trajectory to replay); with too few actions the trajectory
      stops early, not done.
    index: the episode of `split` to start; exactly one of `index` and `snapshot` is given.
    split: the split of `index`.
    snapshot: a state to continue from, e.g. `turn.snapshot` to resample turn k.
    context: ψ, `identity()` by default.

  Returns:
    The trajectory of the turns played.

  Raises:
    ValueError: unless exactly one of `index` and `snapshot` is given.
    TypeError: when `policy` is one string (a list of one action is meant).
  """
  if (index is None) == (snapshot is None):
    raise ValueError("give exactly one of index and snapshot")
  if isinstance(policy, str):
    raise TypeError("policy is a single string; pass a list of actions or a function")
  context = identity() if context is None else context
  if snapshot is None:
    env.reset(index, split=split)
  else:
    env.restore(snapshot)
  actions = None if callable(policy) else iter(policy)
  turns = []
  while not env.done:
    before = env.snapshot()
    segments = context(before.segments)
    if actions is None:
      action = policy(render(segments))
    else:
      action = next(actions, None)
      if action is None:
        break
    result = env.step(action)
    turns.append(
      Turn(
        before.turn,
        segments,
        action,
        result.observation,
        result.reward,
        result.done,
        result.info,
        before,
      )
    )
  return Trajectory(tuple(turns), env.snapshot(), context.spec())


# ---- token arrays ----


class TurnTokens(NamedTuple):
  """Token ids of a transcript with per-token masks, right-padded to `max_len`.

  Attributes:
    tokens: `int32 [T]` ids, pad after the end.
    mask: `bool [T]`, True on real tokens.
    action_mask: `bool [T]`, True exactly on the tokens of the actions being trained; never
      on prompt, observation (tool output) or padding tokens.
    turn_ids: `int32 [T]`, the turn index k on those action tokens, -1 elsewhere.
    boundaries: `int32 [num_turns]`, the position of each trained turn's first action token
      (where the model started generating it), -1 when that lies beyond `max_len`.
    truncated: whether the transcript was longer than `max_len` and its end was cut.
  """

  tokens: np.ndarray
  mask: np.ndarray
  action_mask: np.ndarray
  turn_ids: np.ndarray
  boundaries: np.ndarray
  truncated: bool


def to_tokens(
  trajectory: Trajectory, tokenizer: Tokenizer, max_len: int | None, *, add_bos: bool = False
) -> TurnTokens:
  """The full transcript `prompt | a_0 | o_0 | a_1 | ...` as tokens, training the played turns.

  This is the flat history view (SFT on demonstrations; flattened multi-turn GRPO with the
  identity ψ). With another ψ the model saw different contexts; use `turn_to_tokens`.
  Actions from before a starting snapshot are context, not trained.

  >>> from jaxrl_post.tokenizers import CharTokenizer
  >>> from jaxrl_post.envs import get_env
  >>> env, tok = get_env("kv_lookup", horizon=2), CharTokenizer()
  >>> arrays = to_tokens(play(env, env.demonstration("train", 0), index=0), tok, 160)
  >>> arrays.boundaries.tolist(), arrays.truncated
  ([38, 75, 113], False)
  >>> tok.decode(arrays.tokens[arrays.action_mask])
  '<tool>get(suv)</tool><tool>get(atw)</tool><answer>2198</answer>'

  Args:
    trajectory: from `play`.
    tokenizer: encodes each segment separately.
    max_len: the width T; a longer transcript is cut at the end. `None`: its exact length.
    add_bos: start with the tokenizer's bos token (not part of any segment).
  """
  first = trajectory.turns[0].index if trajectory.turns else len(trajectory.segments)
  turn_of = []
  k = 0
  for segment in trajectory.segments:
    trained = segment.role == ACTION and k >= first
    turn_of.append(k if trained else None)
    k += segment.role == ACTION
  return _tokenize(trajectory.segments, turn_of, tokenizer, max_len, add_bos)


def turn_to_tokens(
  turn: Turn, tokenizer: Tokenizer, max_len: int | None, *, add_bos: bool = False
) -> TurnTokens:
  """One turn as the model generated it: `c_k | a_k`, training only `a_k` (RTPO's view).

  Actions inside the recorded context `c_k` are context, never trained. Arguments as in
  `to_tokens`; `boundaries` has one entry.
  """
  segments = (*turn.context, Segment(ACTION, turn.action))
  turn_of = [None] * len(turn.context) + [turn.index]
  return _tokenize(segments, turn_of, tokenizer, max_len, add_bos)


def _tokenize(
  segments: Sequence[Segment],
  turn_of: Sequence[int | None],
  tokenizer: Tokenizer,
  max_len: int | None,
  add_bos: bool,
) -> TurnTokens:
  """Encodes segments one by one; `turn_of[i]` is segment i's turn if it is trained, else None."""
  ids, turn_ids, boundaries = [], [], []
  if add_bos:
    if tokenizer.bos_id is None:
      raise ValueError("add_bos=True, but the tokenizer has no bos token")
    ids.append(tokenizer.bos_id)
    turn_ids.append(-1)
  for segment, turn in zip(segments, turn_of, strict=True):
    segment_ids = tokenizer.encode(segment.text)
    if turn is not None:
      boundaries.append(len(ids))
    ids += segment_ids
    turn_ids += [-1 if turn is None else turn] * len(segment_ids)
  width = len(ids) if max_len is None else max_len
  n = min(len(ids), width)
  tokens = np.full(width, tokenizer.pad_id, np.int32)
  tokens[:n] = ids[:n]
  mask = np.arange(width) < n
  turn_array = np.full(width, -1, np.int32)
  turn_array[:n] = turn_ids[:n]
  return TurnTokens(
    tokens=tokens,
    mask=mask,
    action_mask=turn_array >= 0,
    turn_ids=turn_array,
    boundaries=np.array([b if b < width else -1 for b in boundaries], np.int32),
    truncated=len(ids) > width,
  )
