"""GAE over completion tokens: hand-derived golden values, γ = λ = 1, padding and holes, jit."""

import doctest

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_post import advantages
from jaxrl_post.advantages import gae, gae_advantages, outcome_token_rewards, whiten


def _gae_loop(rewards, values, mask, gamma, lam):
  """Reference: the recursion of arXiv 1506.02438 written per row over the valid tokens only."""
  adv = np.zeros_like(rewards, np.float64)
  for i in range(rewards.shape[0]):
    steps = np.flatnonzero(mask[i])
    next_value = next_adv = 0.0
    for j in steps[::-1]:
      delta = rewards[i, j] + gamma * next_value - values[i, j]
      adv[i, j] = next_adv = delta + gamma * lam * next_adv
      next_value = values[i, j]
  return adv, np.where(mask > 0, adv + values, 0.0)


# Row 0: three tokens (then padding, whose value 9 must be ignored), reward 1 at the last one.
#   j=2: δ = 1 + 0.9·0 − 0.6 = 0.4                 A = 0.4
#   j=1: δ = 0 + 0.9·0.6 − 0.4 = 0.14              A = 0.14 + 0.72·0.4 = 0.428
#   j=0: δ = 0 + 0.9·0.4 − 0.5 = −0.14             A = −0.14 + 0.72·0.428 = 0.16816
# Row 1: four tokens, reward 2 at the end.
#   j=3: δ = 2 − 1 = 1                              A = 1
#   j=2: δ = 0.9·1 − 0 = 0.9                        A = 0.9 + 0.72 = 1.62
#   j=1: δ = 0.9·0 − 0.5 = −0.5                     A = −0.5 + 0.72·1.62 = 0.6664
#   j=0: δ = 0.9·0.5 − 1 = −0.55                    A = −0.55 + 0.72·0.6664 = −0.070192
# (A bug that bootstraps from the padding value 9 would give row 0 A_2 = 1 + 8.1 − 0.6 = 8.5.)
REWARDS = np.array([[0, 0, 1, 0], [0, 0, 0, 2]], np.float32)
VALUES = np.array([[0.5, 0.4, 0.6, 9.0], [1.0, 0.5, 0.0, 1.0]], np.float32)
MASK = np.array([[1, 1, 1, 0], [1, 1, 1, 1]], np.float32)
ADV = np.array([[0.16816, 0.428, 0.4, 0.0], [-0.070192, 0.6664, 1.62, 1.0]])
RETURNS = np.array([[0.66816, 0.828, 1.0, 0.0], [0.929808, 1.1664, 1.62, 2.0]])


def test_hand_computed_two_rows():
  out = gae_advantages(REWARDS, VALUES, MASK, gamma=0.9, lam=0.8)
  np.testing.assert_allclose(out.advantages, ADV, atol=1e-6)
  np.testing.assert_allclose(out.returns, RETURNS, atol=1e-6)


def test_matches_the_reference_loop_with_padding_holes_and_empty_rows():
  rng = np.random.default_rng(0)
  rewards = rng.standard_normal((6, 9)).astype(np.float32)
  values = rng.standard_normal((6, 9)).astype(np.float32)
  mask = (rng.uniform(size=(6, 9)) < 0.7).astype(np.float32)  # holes anywhere
  mask[2] = 0  # an empty row
  values_garbage = np.where(mask > 0, values, np.nan).astype(np.float32)
  for gamma, lam in ((0.9, 0.8), (1.0, 0.95), (0.0, 0.5), (1.0, 0.0)):
    want_adv, want_ret = _gae_loop(rewards, values, mask, gamma, lam)
    out = gae_advantages(rewards, values_garbage, mask, gamma=gamma, lam=lam)
    np.testing.assert_allclose(out.advantages, want_adv, atol=1e-5)
    np.testing.assert_allclose(out.returns, want_ret, atol=1e-5)
  assert not np.asarray(out.advantages[2]).any()


def test_hole_joins_the_turns_around_it():
  # A tool output (mask 0) between two policy turns is skipped: the row equals the row without it.
  holed = gae_advantages(jnp.array([[0.0, 5.0, 1.0]]), jnp.array([[0.3, 7.0, 0.2]]),
                         jnp.array([[1, 0, 1]]), gamma=0.9, lam=0.8)
  compact = gae_advantages(jnp.array([[0.0, 1.0]]), jnp.array([[0.3, 0.2]]),
                           jnp.array([[1, 1]]), gamma=0.9, lam=0.8)
  np.testing.assert_allclose(holed.advantages[:, [0, 2]], compact.advantages, atol=1e-6)
  assert float(holed.advantages[0, 1]) == 0.0


def test_gamma_lambda_one_is_reward_minus_value():
  rng = np.random.default_rng(1)
  values = rng.standard_normal((5, 7)).astype(np.float32)
  lengths = np.array([7, 3, 1, 0, 5])
  mask = np.arange(7)[None] < lengths[:, None]
  reward = rng.standard_normal(5).astype(np.float32)
  out = gae_advantages(outcome_token_rewards(reward, mask), values, mask, gamma=1.0, lam=1.0)
  np.testing.assert_allclose(out.advantages, np.where(mask, reward[:, None] - values, 0.0),
                             atol=1e-5)
  np.testing.assert_allclose(out.returns, np.where(mask, reward[:, None], 0.0), atol=1e-5)


def test_outcome_rewards_at_the_last_token_minus_kl():
  mask = np.array([[1, 1, 0, 0], [1, 0, 1, 0], [0, 0, 0, 0]], bool)
  kl = np.full((3, 4), 0.5, np.float32)
  r = outcome_token_rewards(jnp.array([1.0, 2.0, 3.0]), mask, kl, 0.1)
  np.testing.assert_allclose(r, [[-0.05, 0.95, 0, 0], [-0.05, 0, 1.95, 0], [0, 0, 0, 0]],
                             atol=1e-6)
  np.testing.assert_array_equal(outcome_token_rewards(jnp.array([1.0, 2.0, 3.0]), mask, kl),
                                outcome_token_rewards(jnp.array([1.0, 2.0, 3.0]), mask))


def test_whiten_uses_the_valid_tokens_of_the_whole_batch():
  rng = np.random.default_rng(2)
  x = rng.standard_normal((4, 6)).astype(np.float32)
  mask = rng.uniform(size=(4, 6)) < 0.6
  got = np.asarray(whiten(np.where(mask, x, np.inf), mask))
  valid = x[mask]
  np.testing.assert_allclose(got[mask], (valid - valid.mean()) / valid.std(), atol=1e-5)
  assert not got[~mask].any()
  assert not np.asarray(whiten(x, np.zeros_like(mask))).any()  # no valid token: zeros


def test_jit_traces_once_for_new_gamma_and_lambda():
  traces = []

  @jax.jit
  def run(rewards, values, mask, gamma, lam):
    traces.append(1)
    return gae_advantages(rewards, values, mask, gamma=gamma, lam=lam)

  a = run(REWARDS, VALUES, MASK, 0.9, 0.8)
  b = run(REWARDS, VALUES, MASK, 1.0, 1.0)
  assert len(traces) == 1
  np.testing.assert_allclose(a.advantages, ADV, atol=1e-6)
  np.testing.assert_allclose(b.advantages, _gae_loop(REWARDS, VALUES, MASK, 1.0, 1.0)[0],
                             atol=1e-6)
  vmapped = jax.vmap(lambda r, v, m: gae_advantages(r[None], v[None], m[None], gamma=0.9,
                                                    lam=0.8).advantages[0])
  np.testing.assert_allclose(vmapped(REWARDS, VALUES, MASK), ADV, atol=1e-6)


def test_exports_and_doctests():
  assert advantages.gae_advantages is gae_advantages and advantages.whiten is whiten
  assert doctest.testmod(gae).failed == 0
