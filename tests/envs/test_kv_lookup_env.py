"""Key-value lookup env: the hidden store, demonstrations, the get tool, determinism, knobs."""

import os
import re
import subprocess
import sys

import pytest

from jaxrl_post.envs import get_env, play


def _follow(store, key):
  """The number at the end of the chain from `key`, and the number of hops."""
  hops = 0
  while not store[key].isdigit():
    key, hops = store[key], hops + 1
  return store[key], hops + 1


@pytest.mark.parametrize("horizon", range(2, 9))
def test_demonstrations_reach_reward_one_in_exactly_k_calls(horizon):
  env = get_env("kv_lookup", horizon=horizon)
  for index in range(20):
    trajectory = play(env, env.demonstration("train", index), index=index)
    assert trajectory.done and trajectory.reward == 1.0
    assert len(trajectory.turns) == horizon + 1
    assert trajectory.final_state.num_tool_calls == horizon
    assert trajectory.final_state.num_errors == 0
    observations = [turn.observation for turn in trajectory.turns[:-1]]
    # Keys until the last hop, which reveals the number.
    assert all(re.fullmatch(r"\n<obs>[a-z]{3}</obs>\n", obs) for obs in observations[:-1])
    assert observations[-1] == f"\n<obs>{trajectory.episode.answer}</obs>\n"


@pytest.mark.parametrize("horizon", [2, 5, 8])
def test_store_holds_a_k_hop_chain_and_distractors(horizon):
  env = get_env("kv_lookup", horizon=horizon, num_keys=12, key_length=2, value_digits=3)
  for index in range(30):
    episode = env.make_episode("test", index)
    store = dict(episode.hidden)
    assert len(store) == 12 and list(store) == sorted(store)
    assert all(re.fullmatch(r"[a-z]{2}", key) for key in store)
    assert all(re.fullmatch(r"[a-z]{2}|[1-9][0-9]{2}", value) for value in store.values())
    start = re.fullmatch(r"Follow the keys from ([a-z]{2}) to a number\.\n", episode.prompt)[1]
    assert _follow(store, start) == (episode.answer, horizon)


def test_golden_episode():
  episode = get_env("kv_lookup", horizon=2).make_episode("train", 0)
  assert episode.prompt == "Follow the keys from suv to a number.\n"
  assert episode.demonstration == (
    "<tool>get(suv)</tool>",
    "<tool>get(atw)</tool>",
    "<answer>2198</answer>",
  )


def test_unknown_key_is_an_error_observation():
  env = get_env("kv_lookup", horizon=2)
  env.reset(0)
  result = env.step("<tool>get(zzzz)</tool>")
  assert result.observation == "\n<obs>error: no key 'zzzz'</obs>\n"
  assert result.info["error"] == "tool" and result.info["num_tool_calls"] == 1
  assert env.step("<tool>get(suv)</tool>").observation == "\n<obs>atw</obs>\n"


def test_score_is_exact():
  env = get_env("kv_lookup", horizon=2)
  episode = env.make_episode("train", 0)
  assert env.score(episode, "2198") == 1.0
  assert [env.score(episode, a) for a in ["2199", "02198", "atw", ""]] == [0.0] * 4


def test_episodes_do_not_depend_on_the_process():
  # Sets iterate in an order that changes with PYTHONHASHSEED; generation must not use them.
  code = (
    "from jaxrl_post.envs import get_env\n"
    "print(repr([get_env(n, horizon=4).make_episode('train', i) "
    "for n in ('calculator', 'kv_lookup') for i in range(3)]))"
  )
  outputs = set()
  for hash_seed in ("1", "2"):
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    outputs.add(
      subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
      ).stdout
    )
  local = [
    get_env(n, horizon=4).make_episode("train", i)
    for n in ("calculator", "kv_lookup")
    for i in range(3)
  ]
  assert outputs == {repr(local) + "\n"}


def test_invalid_knobs():
  with pytest.raises(ValueError, match="num_keys must be >= horizon"):
    get_env("kv_lookup", horizon=8, num_keys=4)
  with pytest.raises(ValueError, match="too few distinct keys"):
    get_env("kv_lookup", key_length=1, num_keys=16)
  with pytest.raises(ValueError, match="value_digits"):
    get_env("kv_lookup", value_digits=0)
