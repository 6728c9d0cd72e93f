"""The multi-turn environment protocol, its snapshot-able state and the `ENVS` registry.

An environment poses one problem per `(split, index)` and answers the model's turns:

  env = get_env("calculator", horizon=3)
  prompt = env.reset(0)                              # the first observation
  result = env.step("<tool>calc(7543-517)</tool>")   # StepResult(observation, reward, done, info)
  saved = env.snapshot()                             # an immutable, picklable value
  ...
  env.restore(saved)                                 # the same actions now give the same results

Turns. The episode is a transcript of segments, prompt, action, observation, action,
observation, ... . Each action is one model turn in the format of `tools` (one tool call or one
final answer, optionally after free text); each observation is the environment's reply. An
episode ends at the first final answer or after `max_turns` actions, whichever comes first.

Horizon. `horizon` (K) is the number of tool calls an optimal trajectory makes; it then answers,
so it takes K + 1 turns. `max_turns = horizon + 1 + spare_turns` leaves room for mistakes.

Reward. Sparse and terminal: the turn that answers gets the env's score of the answer, in [0, 1];
every other turn gets 0, including the last one of an episode cut off by `max_turns`.

Determinism. Everything the environment knows lives in an `EnvState`: the generated episode
(a pure function of the knobs, `split` and `index`), the transcript and the counters. Tools
are pure functions of the episode and their argument, so `transition(state, action)` is a pure
function too, and `restore(snapshot)` followed by the same actions reproduces observations,
rewards and `info` exactly. (A tool's time limit is the one exception: it depends on the
machine. Tools of the registered envs finish in microseconds.)

Stages. `stage_times(trajectory)` reports, from the env's privileged episode state, the turn at
which each stage of a linear sub-goal chain was completed (Temporal GRPO's detector, arXiv
2608.13026); envs with such a chain implement `stage_detectors` (kv_lookup: the hops, then the
answer; calculator: the intermediate values, then the answer).

Errors. Whatever the action text is, `step` does not raise: a malformed action or a failing
tool becomes an observation `error: ...` and is counted in `info["num_errors"]`. Programming
errors (stepping before `reset` or after the end, a non-string action) do raise.
"""

from __future__ import annotations

import abc
import dataclasses
import random
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, NamedTuple

from jaxrl_post.envs import tools as tools_lib
from jaxrl_post.registry import Registry
from jaxrl_post.tasks import base as task_base

# Segment roles.
PROMPT = "prompt"
ACTION = "action"
OBSERVATION = "observation"
ROLES = (PROMPT, ACTION, OBSERVATION)


class Segment(NamedTuple):
  """One piece of a transcript: who wrote `text` (`PROMPT`, `ACTION` or `OBSERVATION`)."""

  role: str
  text: str


class StepResult(NamedTuple):
  """What `Env.step` returns for one action.

  Attributes:
    observation: the environment's reply, appended to the transcript; `""` after an answer.
    reward: the answer's score in [0, 1] on the answering turn, else 0.
    done: whether the episode is over (answered, or `max_turns` reached).
    info: plain values about the turn: `turn` (its 0-based index), `tool` (the called tool or
      `None`), `answer` (the answer text or `None`), `error` (`None` or one of
      `envs.tools.ERROR_KINDS`), `num_tool_calls` and `num_errors` (episode totals so far; a tool
      call counts when it is well formed, whether or not it succeeds) and `truncated` (the
      episode ended at `max_turns` without an answer).
  """

  observation: str
  reward: float
  done: bool
  info: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Episode:
  """One generated problem, fixed for the whole episode.

  Attributes:
    env: the registry name of the env that made it.
    split: the split it comes from.
    index: its position in the split.
    prompt: the first observation; ends with a newline.
    answer: the gold final answer.
    max_turns: the episode's turn limit.
    hidden: what the env's tools know and the model does not, as sorted `(key, value)` pairs
      (for `kv_lookup`, the store).
    demonstration: an optimal sequence of actions, for SFT and tests.
  """

  env: str
  split: str
  index: int
  prompt: str
  answer: str
  max_turns: int
  hidden: tuple[tuple[str, str], ...] = ()
  demonstration: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class EnvState:
  """Everything an environment knows mid-episode; a snapshot is one of these.

  Immutable and made of plain values, so a snapshot can be kept, copied, pickled and restored
  into any env of the same name, any number of times.

  Attributes:
    episode: the problem.
    segments: the transcript so far, starting with the prompt.
    turn: actions taken so far.
    done: whether the episode is over.
    reward: the sum of the rewards so far.
    num_tool_calls: well-formed tool calls so far.
    num_errors: error observations so far.
  """

  episode: Episode
  segments: tuple[Segment, ...]
  turn: int = 0
  done: bool = False
  reward: float = 0.0
  num_tool_calls: int = 0
  num_errors: int = 0


@dataclasses.dataclass(kw_only=True)
class Env(abc.ABC):
  """A multi-turn environment with tools; see the module docstring for the protocol.

  Subclasses are dataclasses whose fields are the knobs (difficulty and seed), registered in
  `ENVS` under their `name`. They implement `make_episode`, `tools` and `score`; the turn
  logic, snapshots and error handling live here.

  Attributes:
    horizon: K, the tool calls an optimal trajectory makes (>= 1).
    spare_turns: turns allowed beyond the optimal K + 1 (>= 0).
    tool_timeout_s: a tool call's time limit in seconds.
  """

  name: ClassVar[str]

  horizon: int = 3
  spare_turns: int = 1
  tool_timeout_s: float = 1.0
  _state: EnvState | None = dataclasses.field(default=None, init=False, repr=False, compare=False)

  def __post_init__(self):
    if self.horizon < 1:
      raise ValueError(f"horizon must be >= 1, got {self.horizon}")
    if self.spare_turns < 0:
      raise ValueError(f"spare_turns must be >= 0, got {self.spare_turns}")
    if not self.tool_timeout_s > 0:
      raise ValueError(f"tool_timeout_s must be > 0, got {self.tool_timeout_s}")

  # ---- what a subclass provides ----

  @abc.abstractmethod
  def make_episode(self, split: str, index: int) -> Episode:
    """Episode `index` of `split`, a pure function of the knobs, `split` and `index`."""

  @abc.abstractmethod
  def tools(self, episode: Episode) -> Mapping[str, Callable[[str], object]]:
    """The tools of `episode` by name; each maps its argument to an output or raises."""

  @abc.abstractmethod
  def score(self, episode: Episode, answer: str) -> float:
    """The reward in [0, 1] for final answer `answer`; never raises on it."""

  # ---- derived ----

  @property
  def max_turns(self) -> int:
    return self.horizon + 1 + self.spare_turns

  def demonstration(self, split: str, index: int) -> list[str]:
    """An optimal trajectory of episode `index` of `split`: K tool calls, then the answer."""
    return list(self.make_episode(split, index).demonstration)

  def knobs(self) -> dict[str, Any]:
    """The constructor arguments that reproduce this env, as JSON-able values."""
    return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}

  # ---- the pure protocol ----

  def initial_state(self, index: int, split: str = "train") -> EnvState:
    """The state right after `reset(index, split=split)`."""
    episode = self.make_episode(split, index)
    return EnvState(episode=episode, segments=(Segment(PROMPT, episode.prompt),))

  def transition(self, state: EnvState, action: str) -> tuple[EnvState, StepResult]:
    """The state after `action` and the step's result; does not touch `self`'s state.

    Raises:
      RuntimeError: when `state` is already done.
      TypeError: when `action` is not a string.
    """
    if state.done:
      raise RuntimeError("the episode is over: reset() or restore() a snapshot first")
    if not isinstance(action, str):
      raise TypeError(f"an action is a string, got {type(action).__name__}")
    episode = state.episode
    parsed = tools_lib.parse_action(action)
    reward, done, error, num_tool_calls = 0.0, False, None, state.num_tool_calls
    if parsed.error is not None:
      observation = tools_lib.format_observation(tools_lib.ERROR_PREFIX + parsed.error)
      error = tools_lib.ERROR_FORMAT
    elif parsed.answer is not None:
      reward = float(self.score(episode, parsed.answer))
      if not 0.0 <= reward <= 1.0:
        raise ValueError(f"{self.name}.score returned {reward}, outside [0, 1]")
      observation, done = "", True
    else:
      num_tool_calls += 1
      available = self.tools(episode)
      fn = available.get(parsed.tool)
      if fn is None:
        names = ", ".join(sorted(available))
        body = (
          f"{tools_lib.ERROR_PREFIX}unknown tool {tools_lib.quote(parsed.tool)}; tools: {names}"
        )
        error = tools_lib.ERROR_UNKNOWN_TOOL
      else:
        body, error = tools_lib.call_tool(fn, parsed.argument, timeout_s=self.tool_timeout_s)
      observation = tools_lib.format_observation(body)
    turn = state.turn + 1
    truncated = not done and turn >= episode.max_turns
    new_state = dataclasses.replace(
      state,
      segments=(*state.segments, Segment(ACTION, action), Segment(OBSERVATION, observation)),
      turn=turn,
      done=done or truncated,
      reward=state.reward + reward,
      num_tool_calls=num_tool_calls,
      num_errors=state.num_errors + (error is not None),
    )
    info = {
      "turn": state.turn,
      "tool": parsed.tool,
      "answer": parsed.answer,
      "error": error,
      "num_tool_calls": new_state.num_tool_calls,
      "num_errors": new_state.num_errors,
      "truncated": truncated,
    }
    return new_state, StepResult(observation, reward, new_state.done, info)

  # ---- stages (Temporal GRPO's detector, arXiv 2608.13026) ----

  def stage_detectors(self, episode: Episode) -> list[StageDetector]:
    """The completion conditions of `episode`'s stages m_1 → … → m_K, in chain order.

    Each is `detector(action, observation) -> bool` on one turn: the parsed action
    (`envs.tools.parse_action`) and the env's reply to it. The last stage is the task-success
    condition. Envs with a natural sub-goal chain override this; the default has none.

    Raises:
      ValueError: naming the env, which has no stage structure.
    """
    del episode
    raise ValueError(f"env {self.name!r} has no stage detector (Temporal GRPO's stages); envs "
                     f"with one: {', '.join(sorted(n for n in ENVS.names() if _has_stages(n)))}")

  def stage_times(self, trajectory: Any) -> list[int]:
    """T_k per stage: the 1-based turn at which stage k was completed, −1 if it was not.

    The stand-in for Temporal GRPO's relation detector on privileged simulator state (arXiv
    2608.13026): the env reads its own episode state (the hidden store, the gold values) and
    the whole transcript, and reports when each stage of `stage_detectors` was completed.
    Stages complete in chain order: stage k is looked for only in turns after stage k − 1's
    (a later turn may complete several stages; none of the registered envs' turns does), so
    the times are non-decreasing and a stage after an uncompleted one is −1
    (`advantages.temporal_grpo.check_stage_times` holds).

    Args:
      trajectory: an `envs.Trajectory`, a `sampling.multiturn.SampledTrajectory` (anything
        with a `final_state`), or an `EnvState`. The whole transcript of its final state is
        read, also the turns played before a starting snapshot.

    Returns:
      K ints, K = `num_stages`.
    """
    state = getattr(trajectory, "final_state", trajectory)
    if not isinstance(state, EnvState):
      raise TypeError(f"stage_times needs a trajectory or an EnvState, got "
                      f"{type(trajectory).__name__}")
    detectors = self.stage_detectors(state.episode)
    times = [-1] * len(detectors)
    segments = state.segments
    stage = 0
    turn = 0
    for i, segment in enumerate(segments):
      if segment.role != ACTION:
        continue
      turn += 1
      observation = segments[i + 1].text if i + 1 < len(segments) else ""
      action = tools_lib.parse_action(segment.text)
      while stage < len(detectors) and detectors[stage](action, observation):
        times[stage] = turn
        stage += 1
    return times

  def num_stages(self) -> int:
    """K of `stage_times` for this env's episodes: `horizon` tool stages plus the answer."""
    return self.horizon + 1

  # ---- the stateful protocol (gym style) ----

  def reset(self, index: int, *, split: str = "train") -> str:
    """Starts episode `index` of `split`; returns its prompt."""
    self._state = self.initial_state(index, split)
    return self._state.episode.prompt

  def step(self, action: str) -> StepResult:
    """Plays one turn; see `transition`."""
    self._state, result = self.transition(self._require_state(), action)
    return result

  def snapshot(self) -> EnvState:
    """The current state, an immutable value that later steps never change."""
    return self._require_state()

  def restore(self, snapshot: EnvState) -> None:
    """Continues from `snapshot`, taken from this env or another env of the same name.

    Raises:
      TypeError: when `snapshot` is not an `EnvState`.
      ValueError: when it comes from a different env.
    """
    if not isinstance(snapshot, EnvState):
      raise TypeError(f"expected an EnvState snapshot, got {type(snapshot).__name__}")
    if snapshot.episode.env != self.name:
      raise ValueError(f"snapshot of env {snapshot.episode.env!r} cannot restore {self.name!r}")
    self._state = snapshot

  @property
  def segments(self) -> tuple[Segment, ...]:
    """The transcript so far (the input of a context function)."""
    return self._require_state().segments

  @property
  def done(self) -> bool:
    return self._require_state().done

  def _require_state(self) -> EnvState:
    if self._state is None:
      raise RuntimeError("call reset() before using the environment")
    return self._state


# One stage condition on a turn: `(parsed action, observation) -> completed`.
StageDetector = Callable[[tools_lib.Action, str], bool]

ENVS: Registry[type[Env]] = Registry("env")


def _has_stages(name: str) -> bool:
  return ENVS.get(name).stage_detectors is not Env.stage_detectors


def answer_stage(env: Env, episode: Episode) -> StageDetector:
  """The final stage m_K: a turn whose answer the env scores as a full success."""
  return lambda action, observation: (
    action.answer is not None and env.score(episode, action.answer) >= 1.0)


def get_env(name: str, **knobs: Any) -> Env:
  """Builds the env registered as `name` with the given knobs (see `Registry.build`)."""
  return ENVS.build(name, **knobs)


def example_rng(env_name: str, seed: int, split: str, index: int) -> random.Random:
  """The random generator of one episode; see `jaxrl_post.tasks.base.example_rng`."""
  return task_base.example_rng(f"env/{env_name}", seed, split, index)
