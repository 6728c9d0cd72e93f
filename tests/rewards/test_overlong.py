"""DAPO overlong shaping: the three regimes and their boundaries, bad windows, and the
"overlong" column of `methods.grpo.verify_groups`."""

import doctest

import jax.numpy as jnp
import numpy as np
import pytest

from configs import grpo_arith
from jaxrl_post import advantages as advantages_lib
from jaxrl_post.methods import grpo
from jaxrl_post.rewards import overlong
from jaxrl_post.rewards.overlong import overlong_penalty, overlong_window


def test_three_regimes_and_boundaries():
  # L_max = 20, L_cache = 4: 0 up to 16, linear over (16, 20], −1 past 20.
  lengths = np.array([0, 15, 16, 17, 18, 19, 20, 21, 500])
  out = overlong_penalty(lengths, max_len=20, cache_len=4)
  assert out.dtype == np.float32 and out.shape == (9,)
  np.testing.assert_array_equal(out, [0.0, 0.0, 0.0, -0.25, -0.5, -0.75, -1.0, -1.0, -1.0])
  # Float lengths on the ramp, and the paper's OPRD numbers (no penalty to 16,384, −1 at 20,480).
  np.testing.assert_allclose(overlong_penalty([16.5], max_len=20, cache_len=4), [-0.125])
  oprd = overlong_penalty([16384, 16385, 18432, 20480, 20481], max_len=20480, cache_len=4096)
  np.testing.assert_allclose(oprd, [0.0, -1 / 4096, -0.5, -1.0, -1.0], rtol=1e-6)


def test_cache_len_edge_cases():
  # No ramp: a hard −1 past max_len.
  np.testing.assert_array_equal(overlong_penalty([9, 10, 11], max_len=10, cache_len=0),
                                [0.0, 0.0, -1.0])
  # The ramp is the whole range: 0 only at length 0.
  np.testing.assert_allclose(overlong_penalty([0, 5, 10, 11], max_len=10, cache_len=10),
                             [0.0, -0.5, -1.0, -1.0])


@pytest.mark.parametrize("max_len, cache_len, match", [
    (10, -1, r"config\.overlong\.cache_len=-1"),
    (10, 11, r"config\.overlong\.cache_len=11 .*config\.overlong\.max_len=10"),
    (0, 0, r"config\.overlong\.max_len=0"),
])
def test_bad_window_names_the_config_keys(max_len, cache_len, match):
  with pytest.raises(ValueError, match=match):
    overlong_penalty([1, 2], max_len=max_len, cache_len=cache_len)


def test_window_from_config():
  config = grpo_arith.get_config("runlocal")
  assert config.overlong.max_len == 0 and config.dynamic_sampling.max_rounds == 0
  config.overlong.cache_len = 4
  assert overlong_window(config) == (config.max_new_tokens, 4)  # max_len 0 = max_new_tokens
  config.overlong.max_len = 30
  assert overlong_window(config) == (30, 4)
  del config["overlong"]
  with pytest.raises(ValueError, match=r"config\.overlong is missing"):
    overlong_window(config)


class _Task:
  """A verifier stand-in: "right…" is correct, "boom…" makes the verifier raise."""

  def reward(self, record, text):
    if text.startswith("boom"):
      raise RuntimeError("verifier bug")
    return float(text.startswith("right")), 1.0


def _config(**weights):
  config = grpo_arith.get_config("runlocal")  # group_size 4, max_new_tokens 12
  config.reward_weights = weights
  config.overlong = dict(max_len=0, cache_len=4)
  return config


def test_verify_groups_overlong_column():
  config = _config(correct=1.0, overlong=0.5)
  objective = grpo.policy_objective(config)
  assert objective.reward_names == ["correct", "overlong"]
  texts = ["right", "wrong", "right", "boom", "wrong", "wrong", "right", "wrong"]
  lengths = np.array([3, 12, 10, 12, 8, 9, 11, 12])  # budget 12, ramp over (8, 12]
  gids = np.repeat(np.arange(2), 4)
  verified = grpo.verify_groups(objective, _Task(), [{}, {}], texts, gids, config,
                                lengths=lengths)
  penalty = np.array([0.0, -1.0, -0.5, np.nan, 0.0, -0.25, -0.75, -1.0], np.float32)
  correct = np.array([1, 0, 1, np.nan, 0, 0, 1, 0], np.float32)
  np.testing.assert_array_equal(verified.correct, correct)
  expected = advantages_lib.ADVANTAGES.get("grpo")(
    jnp.stack([jnp.asarray(correct), jnp.asarray(penalty)], 1), jnp.asarray(gids), num_groups=2,
    eps=config.advantage_eps, reward_weights=jnp.array([1.0, 0.5]))
  np.testing.assert_allclose(verified.adv, expected, rtol=1e-6)
  # By hand, group 0 = rows 0, 1, 2 (row 3 failed its verifier: no reward, A = 0):
  # r = [1, −0.5, 0.75], mean 5/12.
  r = np.array([1.0, -0.5, 0.75])
  np.testing.assert_allclose(verified.adv[:3], (r - r.mean()) / (r.std(ddof=1) + 1e-6),
                             rtol=1e-5)
  assert float(verified.adv[3]) == 0.0
  # Without the column, lengths are optional and change nothing.
  plain = grpo.policy_objective(_config(correct=1.0))
  a = grpo.verify_groups(plain, _Task(), [{}, {}], texts, gids, config)
  b = grpo.verify_groups(plain, _Task(), [{}, {}], texts, gids, config, lengths=lengths)
  np.testing.assert_array_equal(a.adv, b.adv)


def test_verify_groups_needs_lengths_and_a_section():
  config = _config(correct=1.0, format=0.1, overlong=1.0)
  objective = grpo.policy_objective(config)
  texts = ["right"] * 4
  with pytest.raises(ValueError, match="needs the completion lengths"):
    grpo.verify_groups(objective, _Task(), [{}], texts, np.zeros(4, np.int32), config)
  with pytest.raises(ValueError, match=r"lengths has shape \(3,\), expected \(4,\)"):
    grpo.verify_groups(objective, _Task(), [{}], texts, np.zeros(4, np.int32), config,
                       lengths=[1, 2, 3])
  del config["overlong"]
  with pytest.raises(ValueError, match=r"config\.overlong is missing"):
    grpo.policy_objective(config)


def test_policy_objective_rejects_unknown_reward_names():
  with pytest.raises(ValueError, match=r"config\.reward_weights=.*\['length'\].*correct, format, "
                                       r"overlong"):
    grpo.policy_objective(_config(correct=1.0, length=0.1))
  bad = _config(correct=1.0, overlong=1.0)
  bad.overlong.cache_len = 99
  with pytest.raises(ValueError, match=r"config\.overlong\.cache_len=99"):
    grpo.policy_objective(bad)


def test_doctests():
  assert doctest.testmod(overlong).failed == 0
