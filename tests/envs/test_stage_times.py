"""The envs' stage detector for Temporal GRPO (arXiv 2608.13026): `Env.stage_times`."""

import dataclasses

import numpy as np
import pytest

from jaxrl_post.advantages.temporal_grpo import check_stage_times
from jaxrl_post.envs import base, get_env, play
from jaxrl_post.envs.tools import parse_action


def _play(env, actions, index=0):
  """Steps `actions` from episode `index` (until the episode ends); the final state."""
  state = env.initial_state(index)
  for action in actions:
    if state.done:
      break
    state, _ = env.transition(state, action)
  return state


def _kv_chain(env, index=0):
  """The chain keys and the answer, read back from the demonstration."""
  demo = env.demonstration("train", index)
  return [parse_action(a).argument for a in demo[:-1]], parse_action(demo[-1]).answer


@pytest.mark.parametrize("name", ["kv_lookup", "calculator"])
@pytest.mark.parametrize("horizon", [1, 3])
def test_the_demonstration_completes_one_stage_per_turn(name, horizon):
  env = get_env(name, horizon=horizon)
  assert env.num_stages() == horizon + 1
  for index in range(3):
    state = _play(env, env.demonstration("train", index), index)
    assert env.stage_times(state) == list(range(1, horizon + 2))


def test_kv_hops_count_in_chain_order_only():
  env = get_env("kv_lookup", horizon=3, spare_turns=4)
  (k1, k2, k3), answer = _kv_chain(env)
  distractor = next(k for k, _ in env.make_episode("train", 0).hidden if k not in (k1, k2, k3))
  get = "<tool>get({})</tool>".format
  # Turn 1 looks up hop 2 early (not a chain completion), turn 2 a distractor, turn 3 a
  # malformed action; then the chain from hop 1 and the answer.
  actions = [get(k2), get(distractor), "get(x)", get(k1), get(k2), get(k3),
             f"<answer>{answer}</answer>"]
  state = _play(env, actions)
  assert state.turn == 7 and state.reward == 1.0
  assert env.stage_times(state) == [4, 5, 6, 7]


def test_kv_failures_leave_the_later_stages_uncompleted():
  env = get_env("kv_lookup", horizon=3)
  (k1, k2, _), answer = _kv_chain(env)
  get = "<tool>get({})</tool>".format
  # A wrong answer after two hops: stages 1-2 completed, hop 3 and the answer not.
  assert env.stage_times(_play(env, [get(k1), get(k2), "<answer>1</answer>"])) == [1, 2, -1, -1]
  # The right number without the last hop does not complete the chain's final stage.
  state = _play(env, [get(k1), get(k2), f"<answer>{answer}</answer>"])
  assert state.reward == 1.0 and env.stage_times(state) == [1, 2, -1, -1]
  # An unknown key: an error observation, no stage.
  assert env.stage_times(_play(env, [get("zzzz"), get(k1)])) == [2, -1, -1, -1]
  # Truncated after max_turns without an answer.
  state = _play(env, [get(k1)] * 10)
  assert state.done and state.turn == env.max_turns
  times = env.stage_times(state)
  assert times == [1, -1, -1, -1]
  check_stage_times(np.array([[times]]), np.array([[state.turn]]))


def test_calculator_stage_k_is_the_kth_value_however_computed():
  env = get_env("calculator", horizon=3, operations="+")
  demo = env.demonstration("train", 0)
  first = parse_action(demo[0]).argument  # "a+b"
  a, b = first.split("+")
  swapped = f"<tool>calc({b}+{a})</tool>"  # the same value v_1 by another expression
  state = _play(env, ["<tool>calc(1+1)</tool>", swapped, *demo[1:]])
  assert env.stage_times(state) == [2, 3, 4, 5]
  # Skipping step 1 (calling step 2's expression first) completes nothing until v_1 appears.
  state = _play(env, [demo[1], demo[0], demo[1], "<answer>0</answer>"])
  assert env.stage_times(state) == [2, 3, -1, -1]


def test_stage_times_reads_trajectories_and_states_alike():
  env = get_env("kv_lookup", horizon=2)
  demo = env.demonstration("train", 1)
  trajectory = play(env, demo, index=1)
  assert env.stage_times(trajectory) == env.stage_times(trajectory.final_state) == [1, 2, 3]
  # A continuation from a snapshot still sees the turns before it (the whole transcript).
  snapshot = _play(env, demo[:1], 1)
  rest = play(env, demo[1:], snapshot=snapshot)
  assert len(rest.turns) == 2 and env.stage_times(rest) == [1, 2, 3]
  with pytest.raises(TypeError, match="stage_times"):
    env.stage_times("not a trajectory")


@dataclasses.dataclass(kw_only=True)
class _NoStages(base.Env):
  name = "no_stages"

  def make_episode(self, split, index):
    return base.Episode(env=self.name, split=split, index=index, prompt="p\n", answer="1",
                        max_turns=self.max_turns, demonstration=("<answer>1</answer>",))

  def tools(self, episode):
    return {}

  def score(self, episode, answer):
    return float(answer == "1")


def test_an_env_without_stages_raises_naming_it():
  env = _NoStages(horizon=1)
  with pytest.raises(ValueError, match="env 'no_stages' has no stage detector.*kv_lookup"):
    env.stage_times(env.initial_state(0))
