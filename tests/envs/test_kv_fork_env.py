"""kv_fork: K-hop chains from several start keys, only the first-named one ends in the answer."""

import re

import pytest

from jaxrl_post.envs import get_env, play
from jaxrl_post.envs.tools import parse_action


def _follow(store, key):
  """The number at the end of the chain from `key`, and the number of hops."""
  hops = 0
  while not store[key].isdigit():
    key, hops = store[key], hops + 1
  return store[key], hops + 1


def _starts(prompt, branches):
  pattern = r"Follow the keys from " + " or ".join([r"([a-z]{3})"] * branches) + r" to a number\.\n"
  return list(re.fullmatch(pattern, prompt).groups())


@pytest.mark.parametrize(("horizon", "branches"), [(2, 2), (4, 3), (8, 2)])
def test_every_branch_is_a_k_hop_chain_and_only_the_first_ends_in_the_answer(horizon, branches):
  env = get_env("kv_fork", horizon=horizon, num_branches=branches)
  for index in range(20):
    episode = env.make_episode("train", index)
    store = dict(episode.hidden)
    assert len(store) == 24
    starts = _starts(episode.prompt, branches)
    # The starts differ in their last letter only: the turn-0 decision is one character.
    assert len({s[:-1] for s in starts}) == 1 and len(set(starts)) == branches
    ends = [_follow(store, start) for start in starts]
    # Every branch: exactly K calls to a number, so no hop tells a wrong branch from the right.
    assert all(hops == horizon for _, hops in ends)
    assert ends[0][0] == episode.answer
    assert len({number for number, _ in ends}) == branches  # decoys differ from the answer


@pytest.mark.parametrize("horizon", [2, 6])
def test_the_turn_0_choice_alone_decides_the_reward(horizon):
  env = get_env("kv_fork", horizon=horizon)
  for index in range(10):
    episode = env.make_episode("test", index)
    store = dict(episode.hidden)
    for b, start in enumerate(_starts(episode.prompt, 2)):
      # A flawless lookup of branch b: the same K + 1 turns whichever branch, reward iff b = 0.
      actions, key = [], start
      while not key.isdigit():
        actions.append(f"<tool>get({key})</tool>")
        key = store[key]
      actions.append(f"<answer>{key}</answer>")
      trajectory = play(env, actions, index=index, split="test")
      assert trajectory.done and len(trajectory.turns) == horizon + 1
      assert trajectory.final_state.num_errors == 0
      assert trajectory.reward == float(b == 0)
      # Stage detectors follow the correct chain: a wrong branch reaches none of its hops.
      stages = env.stage_times(trajectory)
      assert stages == (list(range(1, horizon + 2)) if b == 0 else [-1] * (horizon + 1))


def test_demonstrations_correct_and_uniform():
  correct = get_env("kv_fork", horizon=3)
  uniform = get_env("kv_fork", horizon=3, demo_branch="uniform")
  first = []
  for index in range(200):
    episode = correct.make_episode("train", index)
    assert play(correct, list(episode.demonstration), index=index).reward == 1.0
    assert len(episode.demonstration) == 4
    mixed = uniform.make_episode("train", index)
    assert mixed.prompt == episode.prompt and mixed.hidden == episode.hidden  # same store
    start = parse_action(mixed.demonstration[0]).argument
    branch = _starts(mixed.prompt, 2).index(start)
    reward = play(uniform, list(mixed.demonstration), index=index).reward
    assert reward == float(branch == 0)
    first.append(branch == 0)
  # A teacher that does not know the rule: about half its demonstrations take the decoy.
  assert 0.4 < sum(first) / len(first) < 0.6


def test_golden_episode_and_determinism():
  env = get_env("kv_fork", horizon=2)
  episode = env.make_episode("train", 0)
  assert episode.prompt == "Follow the keys from uby or ube to a number.\n"
  assert episode.demonstration == ("<tool>get(uby)</tool>", "<tool>get(tnq)</tool>",
                                   "<answer>2468</answer>")
  assert get_env("kv_fork", horizon=2).make_episode("train", 0) == episode
  assert env.make_episode("test", 0) != episode


def test_bad_knobs_name_the_knob():
  with pytest.raises(ValueError, match="num_branches"):
    get_env("kv_fork", horizon=2, num_branches=1)
  with pytest.raises(ValueError, match="demo_branch"):
    get_env("kv_fork", horizon=2, demo_branch="best")
  with pytest.raises(ValueError, match="num_keys"):
    get_env("kv_fork", horizon=8, num_branches=4, num_keys=24)
