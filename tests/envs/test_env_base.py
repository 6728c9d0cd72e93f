"""The environment protocol: snapshots and deterministic replay, errors, limits, the registry."""

import copy
import dataclasses
import pickle
import time

import pytest

from jaxrl_post.envs import ENVS, Env, EnvState, Episode, Segment, get_env, tools

ENV_NAMES = ["calculator", "kv_lookup"]


def _mixed_actions(env, index):
  """The demonstration with mistakes of every kind mixed in (needs spare_turns >= 4)."""
  demo = env.demonstration("train", index)
  mistakes = [
    "no tags at all",
    "<tool>nope(1)</tool>",  # Unknown tool.
    demo[0].replace("(", "( zz ", 1),  # A known tool with an argument it rejects.
    "<tool>calc(1+2)</tool> trailing",
  ]
  return ["thinking... " + demo[0], mistakes[0], demo[1], *mistakes[1:], *demo[2:]]


def _replay(env, actions):
  return [env.step(action) for action in actions]


@pytest.mark.parametrize("name", ENV_NAMES)
@pytest.mark.parametrize("horizon", [2, 5])
def test_fork_at_every_boundary_and_replay(name, horizon):
  env = get_env(name, horizon=horizon, spare_turns=4)
  actions = _mixed_actions(env, 3)
  env.reset(3)
  snapshots, results = [], []
  for action in actions:
    snapshots.append(env.snapshot())
    results.append(env.step(action))
  final = env.snapshot()
  assert final.done and final.reward == 1.0 and final.num_errors == 4
  errors = [r.info["error"] for r in results]
  assert errors == [None, "format", None, "unknown_tool", "tool", "format"] + [None] * (
    len(actions) - 6
  )

  for k, snapshot in enumerate(snapshots):
    # Restore into this env, a fresh one, and from a pickled and a deep-copied snapshot.
    copies = [snapshot, pickle.loads(pickle.dumps(snapshot)), copy.deepcopy(snapshot)]
    for target, saved in zip([env, get_env(name, horizon=horizon, spare_turns=4), env], copies):
      target.restore(saved)
      assert target.segments == snapshot.segments
      assert _replay(target, actions[k:]) == results[k:]
      assert target.snapshot() == final
    # A sibling that goes elsewhere from the same snapshot changes neither the snapshot nor a
    # later replay from it.
    env.restore(snapshot)
    env.step("<answer>0</answer>")
    env.restore(snapshot)
    assert _replay(env, actions[k:]) == results[k:]


@pytest.mark.parametrize("name", ENV_NAMES)
def test_transcript_and_transition_purity(name):
  env = get_env(name, horizon=2)
  prompt = env.reset(0, split="test")
  assert env.segments == (Segment("prompt", prompt),) and prompt.endswith("\n")
  state = env.snapshot()
  action = env.demonstration("test", 0)[0]
  first = env.transition(state, action)
  assert env.transition(state, action) == first
  assert env.snapshot() is state  # `transition` leaves the env's own state alone.
  new_state, result = first
  assert new_state.segments == (
    Segment("prompt", prompt),
    Segment("action", action),
    Segment("observation", result.observation),
  )
  assert result.observation.startswith("\n<obs>") and result.observation.endswith("</obs>\n")
  assert result.info == {
    "turn": 0,
    "tool": "calc" if name == "calculator" else "get",
    "answer": None,
    "error": None,
    "num_tool_calls": 1,
    "num_errors": 0,
    "truncated": False,
  }


@pytest.mark.parametrize("name", ENV_NAMES)
def test_max_turns_ends_the_episode(name):
  env = get_env(name, horizon=2, spare_turns=2)
  assert env.max_turns == 5
  env.reset(1)
  results = _replay(env, ["<tool>oops</tool>"] * env.max_turns)
  assert [r.done for r in results] == [False] * 4 + [True]
  assert [r.info["truncated"] for r in results] == [False] * 4 + [True]
  assert all(r.reward == 0.0 for r in results)
  assert results[-1].info["num_errors"] == 5 and results[-1].info["num_tool_calls"] == 0
  assert results[0].observation == "\n<obs>error: malformed call 'oops'; expected name(arg)</obs>\n"
  with pytest.raises(RuntimeError, match="episode is over"):
    env.step("<answer>1</answer>")


@pytest.mark.parametrize("name", ENV_NAMES)
def test_wrong_answer_ends_with_zero(name):
  env = get_env(name, horizon=3)
  env.reset(0)
  result = env.step("<answer>-1</answer>")
  assert result == (
    "",
    0.0,
    True,
    {
      "turn": 0,
      "tool": None,
      "answer": "-1",
      "error": None,
      "num_tool_calls": 0,
      "num_errors": 0,
      "truncated": False,
    },
  )


def test_misuse_raises():
  env = get_env("calculator")
  with pytest.raises(RuntimeError, match="reset"):
    env.step("<answer>1</answer>")
  with pytest.raises(RuntimeError, match="reset"):
    env.snapshot()
  env.reset(0)
  with pytest.raises(TypeError, match="string"):
    env.step(None)
  with pytest.raises(TypeError, match="EnvState"):
    env.restore({"turn": 0})
  other = get_env("kv_lookup")
  other.reset(0)
  with pytest.raises(ValueError, match="snapshot of env 'kv_lookup'"):
    env.restore(other.snapshot())


def test_registry_and_knobs():
  assert {"calculator", "kv_lookup"} <= set(ENVS.names())
  with pytest.raises(KeyError, match="valid names: .*calculator.*kv_lookup"):
    get_env("calculater")
  with pytest.raises(TypeError, match="no knob"):
    get_env("kv_lookup", hops=3)
  env = get_env("kv_lookup", horizon=4, num_keys=8)
  assert get_env("kv_lookup", **env.knobs()) == env
  for bad in [{"horizon": 0}, {"spare_turns": -1}, {"tool_timeout_s": 0}]:
    with pytest.raises(ValueError):
      get_env("calculator", **bad)


# ---- an env whose tools misbehave ----


def _boom(arg):
  raise RuntimeError("tool bug")


def _hang(arg):
  time.sleep(30)


@dataclasses.dataclass(kw_only=True)
class _ToyEnv(Env):
  name = "toy"

  def make_episode(self, split, index):
    return Episode(
      env=self.name,
      split=split,
      index=index,
      prompt="Say ok.\n",
      answer="ok",
      max_turns=self.max_turns,
      demonstration=("<tool>echo(ok)</tool>", "<answer>ok</answer>"),
    )

  def tools(self, episode):
    return {"echo": lambda arg: arg, "boom": _boom, "hang": _hang}

  def score(self, episode, answer):
    return float(answer == episode.answer)


def test_failing_and_hanging_tools_become_error_observations():
  env = _ToyEnv(horizon=1, spare_turns=4, tool_timeout_s=0.2)
  env.reset(0)
  boom = env.step("<tool>boom(x)</tool>")
  assert boom.observation == "\n<obs>error: tool failed: RuntimeError</obs>\n"
  assert boom.info["error"] == tools.ERROR_EXCEPTION and not boom.done

  start = time.monotonic()
  hang = env.step("<tool>hang(x)</tool>")
  assert time.monotonic() - start < 2.0
  assert hang.observation == "\n<obs>error: tool timed out after 0.2s</obs>\n"
  assert hang.info["error"] == tools.ERROR_TIMEOUT and not hang.done

  unknown = env.step("<tool>ask(x)</tool>")
  assert unknown.observation == "\n<obs>error: unknown tool 'ask'; tools: boom, echo, hang</obs>\n"

  assert env.step("<tool>echo(ok)</tool>").observation == "\n<obs>ok</obs>\n"
  last = env.step("<answer>ok</answer>")
  assert last.reward == 1.0 and last.done
  assert last.info["num_errors"] == 3 and last.info["num_tool_calls"] == 4
  state = env.snapshot()
  assert isinstance(state, EnvState) and state.reward == 1.0 and state.turn == 5
