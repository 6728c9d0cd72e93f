"""Calculator env: generated chains, demonstrations, the calc tool, the verifier, knobs."""

import doctest
import re

import pytest

from jaxrl_post.envs import ToolError, calculator, get_env, play


def test_doctests():
  assert doctest.testmod(calculator).failed == 0


def test_golden_episode():
  # Pins the example stream: the seed string is "env/calculator/0/train/0".
  episode = get_env("calculator", horizon=2).make_episode("train", 0)
  assert episode.prompt == "Start at 7543, then -517 *98.\n"
  assert episode.answer == str((7543 - 517) * 98) == "688548"
  assert episode.demonstration == (
    "<tool>calc(7543-517)</tool>",
    "<tool>calc(7026*98)</tool>",
    "<answer>688548</answer>",
  )
  assert episode.max_turns == 4 and episode.hidden == ()


@pytest.mark.parametrize("horizon", range(2, 9))
def test_demonstrations_reach_reward_one_in_exactly_k_calls(horizon):
  env = get_env("calculator", horizon=horizon)
  for index in range(20):
    trajectory = play(env, env.demonstration("train", index), index=index)
    assert trajectory.done and trajectory.reward == 1.0
    assert len(trajectory.turns) == horizon + 1
    assert trajectory.final_state.num_tool_calls == horizon
    assert trajectory.final_state.num_errors == 0
    # Each call's left operand is the previous observation; values stay positive and in range.
    previous = None
    for turn in trajectory.turns[:-1]:
      a, op, b = re.fullmatch(r"<tool>calc\((\d+)([-+*])(\d+)\)</tool>", turn.action).groups()
      if previous is not None:
        assert a == previous
      previous = re.fullmatch(r"\n<obs>(\d+)</obs>\n", turn.observation).group(1)
      assert 0 < int(previous) < 10**env.max_value_digits
      assert int(b) < 10**env.operand_digits and (op != "*" or int(b) >= 2)
    assert trajectory.turns[-1].action == f"<answer>{previous}</answer>"


def test_prompt_states_the_chain():
  env = get_env("calculator", horizon=6)
  for index in range(30):
    episode = env.make_episode("valid", index)
    start, steps = re.fullmatch(r"Start at (\d+), then (.*)\.\n", episode.prompt).groups()
    value = int(start)
    assert len(start) == env.start_digits
    for step in steps.split(" "):
      value = eval(f"{value}{step}")  # The test's own reference: plain Python arithmetic.
    assert str(value) == episode.answer
    assert len(steps.split(" ")) == 6


def test_deterministic_and_varied():
  env = get_env("calculator", horizon=4)
  assert env.make_episode("train", 7) == get_env("calculator", horizon=4).make_episode("train", 7)
  prompts = {env.make_episode(split, i).prompt for split in ("train", "test") for i in range(50)}
  assert len(prompts) == 100
  other_seed = get_env("calculator", horizon=4, seed=1).make_episode("train", 7)
  assert other_seed.prompt != env.make_episode("train", 7).prompt


def test_difficulty_knobs():
  env = get_env("calculator", horizon=8, operations="+", operand_digits=1, start_digits=2)
  for index in range(10):
    episode = env.make_episode("train", index)
    steps = episode.prompt.split("then ")[1].rstrip(".\n").split(" ")
    assert all(re.fullmatch(r"\+[1-9]", step) for step in steps)
  env = get_env("calculator", horizon=5, operations="*", max_value_digits=12, instructions=True)
  episode = env.make_episode("train", 0)
  assert episode.prompt.endswith(
    "\nUse <tool>calc(a*b)</tool> per step; reply <answer>n</answer>.\n"
  )
  assert len(episode.answer) <= 12


@pytest.mark.parametrize(
  "expression, output",
  [
    ("4821*37", "178377"),
    (" 178377 + 902 ", "179279"),
    ("12-30", "-18"),
    ("14/4", "7/2"),
    ("12/4", "3"),
    ("999999999999*999999999999", str(999999999999**2)),
  ],
)
def test_calc_goldens(expression, output):
  assert calculator.calc(expression) == output


@pytest.mark.parametrize(
  "expression", ["", "1", "1+2+3", "(1+2)", "-1+2", "1.5*2", "1e3*2", "1/0", "1234567890123*2"]
)
def test_calc_rejects(expression):
  with pytest.raises(ToolError):
    calculator.calc(expression)


def test_score():
  env = get_env("calculator", horizon=2)
  episode = env.make_episode("train", 0)  # Answer 688548.
  assert env.score(episode, "688548") == 1.0
  for wrong in ["688547", "688,548", "688548.0", "6.88548e5", "", "x"]:
    assert env.score(episode, wrong) == 0.0


def test_invalid_knobs():
  with pytest.raises(ValueError, match="operations"):
    get_env("calculator", operations="+/")
  with pytest.raises(ValueError, match="max_value_digits"):
    get_env("calculator", max_value_digits=13)
  with pytest.raises(ValueError, match="operand_digits"):
    get_env("calculator", operand_digits=0)
  # Doubling 1000 eight times passes 10**5: no chain of products fits.
  env = get_env("calculator", horizon=8, operations="*", max_value_digits=5)
  with pytest.raises(ValueError, match="found no chain"):
    env.make_episode("train", 0)
