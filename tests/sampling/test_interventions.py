"""Tests for RAIL's intervention arms, gains, shadow-to-live switch and arm choice."""

import doctest

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxrl_post.bandits import linucb_init, linucb_select, linucb_update
from jaxrl_post.sampling import interventions
from jaxrl_post.sampling.interventions import (
  ARM_FEATURE_DIM,
  CONTEXT_BASE_DIM,
  SOURCE_CONTROLLER,
  SOURCE_HEURISTIC,
  SOURCE_RANDOM,
  InterventionArm,
  arm_features,
  choose_arm,
  context_features,
  default_arms,
  joint_features,
  realised_gain,
  shadow_to_live_init,
  shadow_to_live_update,
  utility,
  win_share,
)


def test_doctests():
  assert doctest.testmod(interventions, raise_on_error=True).attempted >= 12


def test_default_arms_grid():
  arms = default_arms()
  assert len(arms) == 1 + 3 * 3 * 3
  assert [a.where for a in arms].count("none") == 1
  assert arms[0] == InterventionArm("none", 0, 1.0)
  assert len(set(arms)) == len(arms)
  assert {a.extra_rollouts for a in arms[1:]} == {2, 4, 8}
  assert {a.temperature for a in arms[1:]} == {0.7, 1.0, 1.2}
  assert {a.where for a in arms[1:]} == {"max_entropy_turn", "first_failing_turn", "restart"}
  assert len(default_arms(extra_rollouts=(4,), temperatures=(1.0,), include_none=False)) == 3
  with pytest.raises(ValueError, match="wheres"):
    default_arms(wheres=("everywhere",))
  with pytest.raises(ValueError, match="extra_rollouts"):
    default_arms(extra_rollouts=(0,))
  with pytest.raises(ValueError, match="empty"):
    default_arms(wheres=(), include_none=False)


def test_feature_shapes_and_values():
  arms = default_arms()
  a = arm_features(arms)
  assert a.shape == (28, ARM_FEATURE_DIM) and a.dtype == jnp.float32
  np.testing.assert_allclose(a[0], [1, 0, 0, 0, 0, 0])
  # first_failing_turn, m = 8, T = 0.7.
  i = arms.index(InterventionArm("first_failing_turn", 8, 0.7))
  np.testing.assert_allclose(a[i], [0, 0, 1, 0, 1.0, -0.3], atol=1e-6)
  np.testing.assert_allclose(jnp.sum(a[:, :4], axis=1), 1.0)
  z = context_features(jnp.array([0.3, -0.2]), turn_position=0.25, entropy=2.0,
                       success_rate=0.5, reward_variance=0.25, rollouts_spent=4,
                       rollout_budget=16)
  assert z.shape == (CONTEXT_BASE_DIM + 2,)
  np.testing.assert_allclose(z, [1.0, 0.3, -0.2, 0.25, 2.0, 0.5, 0.25, 0.25], rtol=1e-6)
  phi = joint_features(z, a)
  assert phi.shape == (28, ARM_FEATURE_DIM * (CONTEXT_BASE_DIM + 2))
  # φ[i, j·d_c + k] = a[i, j]·z[k], checked with loops.
  want = np.zeros(phi.shape, np.float32)
  for r in range(a.shape[0]):
    for j in range(a.shape[1]):
      for k in range(z.shape[0]):
        want[r, j * z.shape[0] + k] = a[r, j] * z[k]
  np.testing.assert_allclose(phi, want, rtol=1e-6)
  # The bias column reproduces the arm features.
  np.testing.assert_allclose(phi[:, :: z.shape[0]], a)


def test_context_features_under_jit_and_vmap():
  f = jax.jit(jax.vmap(lambda p, v: context_features(
    turn_position=0.5, entropy=1.0, success_rate=p, reward_variance=v, rollouts_spent=2.0,
    rollout_budget=8.0)))
  out = f(jnp.array([0.0, 0.5]), jnp.array([0.0, 0.25]))
  np.testing.assert_allclose(out, [[1, 0.5, 1, 0, 0, 0.25], [1, 0.5, 1, 0.5, 0.25, 0.25]])


def test_feature_errors():
  with pytest.raises(ValueError, match="arms"):
    arm_features([])
  with pytest.raises(ValueError, match="arms"):
    arm_features([InterventionArm("somewhere", 2, 1.0)])
  with pytest.raises(ValueError, match="arms"):
    joint_features(jnp.ones(6), jnp.zeros((0, 6)))
  with pytest.raises(ValueError, match="context"):
    joint_features(jnp.ones((2, 6)), jnp.zeros((3, 6)))
  kw = dict(turn_position=0.5, entropy=1.0, success_rate=0.5, reward_variance=0.25,
            rollouts_spent=4)
  with pytest.raises(ValueError, match="rollout_budget"):
    context_features(rollout_budget=0, **kw)
  with pytest.raises(ValueError, match="task_features"):
    context_features(jnp.ones((2, 2)), rollout_budget=8, **kw)


def _np_var(x):
  m = sum(x) / len(x)
  return sum((v - m) ** 2 for v in x) / len(x)


def test_realised_gain_by_hand():
  # Coverage: all-fail → mixed is +1; mixed → all-pass is −1; mixed → mixed is 0.
  before = jnp.array([[0.0, 0.0, 0.0, 0.0], [1.0, 0.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
  after = jnp.array([[0.0, 1.0, 0.0, 0.0, 0.0, 0.0],
                     [1.0, 1.0, 1.0, 1.0, 1.0, 1.0],
                     [1.0, 0.0, 0.0, 0.0, 1.0, 1.0]])
  np.testing.assert_allclose(realised_gain(before, after), [1.0, -1.0, 0.0])
  # Variance: population variances by hand.
  want = [_np_var(a) - _np_var(b) for a, b in zip(after.tolist(), before.tolist())]
  np.testing.assert_allclose(realised_gain(before, after, kind="variance"), want, rtol=1e-6)
  assert want[0] == pytest.approx(5 / 36) and want[1] == pytest.approx(-3 / 16)
  assert want[2] == pytest.approx(0.25 - 3 / 16)


def test_realised_gain_masks():
  before = jnp.array([1.0, 0.0, 0.0])
  valid_before = jnp.array([False, True, True])  # Only the two failures count: not mixed.
  after = jnp.array([0.0, 1.0, 7.0])
  valid_after = jnp.array([True, True, False])
  g = realised_gain(before, after, valid_before=valid_before, valid_after=valid_after)
  assert float(g) == 1.0
  v = realised_gain(before, after, kind="variance", valid_before=valid_before,
                    valid_after=valid_after)
  assert float(v) == pytest.approx(0.25)
  # A single valid rollout is never mixed.
  assert float(realised_gain(jnp.array([0.0]), jnp.array([1.0, 0.0]),
                             valid_after=jnp.array([True, False]))) == 0.0


def test_realised_gain_under_jit():
  f = jax.jit(lambda b, a: realised_gain(b, a, kind="variance"))
  np.testing.assert_allclose(f(jnp.zeros(4), jnp.array([0.0, 1.0])), 0.25)


def test_realised_gain_errors():
  with pytest.raises(ValueError, match="rewards_before"):
    realised_gain(jnp.zeros((0,)), jnp.zeros(3))
  with pytest.raises(ValueError, match="rewards_after"):
    realised_gain(jnp.zeros((2, 3)), jnp.zeros((3, 3)))
  with pytest.raises(ValueError, match="kind"):
    realised_gain(jnp.zeros(3), jnp.zeros(3), kind="contrast")
  with pytest.raises(ValueError, match="rewards_after"):
    realised_gain(jnp.zeros(3), jnp.zeros(3), valid_after=jnp.ones(2, bool))


def test_utility():
  np.testing.assert_allclose(utility(jnp.array([1.0, 0.0]), jnp.array([1000.0, 500.0]),
                                     budget=10000.0, cost_weight=2.0), [0.8, -0.1], rtol=1e-6)
  assert float(utility(0.5, 0, budget=1.0)) == 0.5
  with pytest.raises(ValueError, match="budget"):
    utility(1.0, 10, budget=0.0)
  with pytest.raises(ValueError, match="cost_weight"):
    utility(1.0, 10, budget=1.0, cost_weight=-1.0)


def test_switch_after_exactly_window_wins():
  s = shadow_to_live_init()
  for i in range(4):
    s = shadow_to_live_update(s, 1.0, 0.0, window=5)
    assert not bool(s.live) and int(s.streak) == i + 1
  s = shadow_to_live_update(s, 1.0, 0.0, window=5)
  assert bool(s.live) and int(s.streak) == 5 and int(s.decisions) == 5


def test_switch_resets_on_a_loss_and_is_one_way():
  s = shadow_to_live_init()
  wins = [True] * 4 + [False] + [True] * 4  # Never 5 in a row.
  for w in wins:
    s = shadow_to_live_update(s, 1.0 if w else 0.0, 0.5, window=5)
  assert not bool(s.live) and int(s.streak) == 4
  s = shadow_to_live_update(s, 0.5, 0.5, window=5)  # A tie is a loss (LCB must exceed).
  assert int(s.streak) == 0 and not bool(s.live)
  for _ in range(5):
    s = shadow_to_live_update(s, 1.0, 0.5, window=5)
  assert bool(s.live)
  s = shadow_to_live_update(s, -1.0, 0.5, window=5)
  assert bool(s.live) and int(s.streak) == 0 and int(s.decisions) == 16


def test_agreement_holds_the_streak():
  # The controller picking the heuristic's arm: LCB < mean of the same arm, a loss unless
  # `agree` holds the streak.
  s = shadow_to_live_init()
  for _ in range(3):
    s = shadow_to_live_update(s, 1.0, 0.5, window=5)
  held = shadow_to_live_update(s, 0.4, 0.5, window=5, agree=True)
  assert int(held.streak) == 3 and int(held.decisions) == 4
  assert int(shadow_to_live_update(s, 0.4, 0.5, window=5).streak) == 0
  for _ in range(2):
    held = shadow_to_live_update(held, 1.0, 0.5, window=5)
  assert bool(held.live)


def test_switch_under_scan_default_window():
  def step(s, win):
    return shadow_to_live_update(s, jnp.where(win, 1.0, -1.0), 0.0), s.live

  wins = jnp.ones(60, bool).at[9].set(False)  # The streak restarts at decision 10.
  final, live_before = jax.jit(lambda w: jax.lax.scan(step, shadow_to_live_init(), w))(wins)
  # Wins 10..59 are the first 50 in a row: live only after the last decision.
  assert bool(final.live) and not bool(live_before[-1])


def test_switch_errors():
  with pytest.raises(ValueError, match="window"):
    shadow_to_live_update(shadow_to_live_init(), 1.0, 0.0, window=0)
  with pytest.raises(ValueError, match="controller_lcb"):
    shadow_to_live_update(shadow_to_live_init(), jnp.ones(2), 0.0)


def _share_rule_reference(wins, agrees, window, min_share):
  """The "share" rule in plain Python: the first decision index at which it goes live."""
  outcomes = []
  for t, (w, a) in enumerate(zip(wins, agrees)):
    if not a:
      outcomes.append(w)
    if len(outcomes) >= window and np.mean(outcomes[-window:]) >= min_share:
      return t
  return None


@pytest.mark.parametrize("seed, q, min_share", [(0, 0.45, 0.5), (1, 0.6, 0.5), (2, 0.3, 0.25),
                                                (3, 0.5, 0.7), (4, 0.2, 0.6)])
def test_share_rule_matches_a_python_reference(seed, q, min_share):
  rng = np.random.default_rng(seed)
  window, n = 12, 200
  wins, agrees = rng.random(n) < q, rng.random(n) < 0.3
  want = _share_rule_reference(wins, agrees, window, min_share)

  def step(s, x):
    win, agree = x
    s = shadow_to_live_update(s, jnp.where(win, 1.0, -1.0), 0.0, window=window, agree=agree,
                              rule="share", min_share=min_share)
    return s, (s.live, win_share(s))

  final, (live, share) = jax.jit(lambda w, a: jax.lax.scan(
    step, shadow_to_live_init(window), (w, a)))(jnp.asarray(wins), jnp.asarray(agrees))
  live = np.asarray(live)
  got = int(np.argmax(live)) if live.any() else None
  assert got == want, (got, want)
  counted = [w for w, a in zip(wins, agrees) if not a]
  assert int(final.counted) == len(counted) and int(final.decisions) == n
  np.testing.assert_allclose(float(share[-1]), np.mean(counted[-window:]), rtol=1e-6)


def test_share_rule_fires_without_a_streak_and_not_before_a_full_window():
  s = shadow_to_live_init(6)
  for lcb in (1.0, 1.0, 1.0, 1.0, 1.0):  # 5 wins: a 100 % share, but only 5 of 6 counted.
    s = shadow_to_live_update(s, lcb, 0.0, window=6, rule="share")
  assert not bool(s.live) and float(win_share(s)) == 1.0
  s = shadow_to_live_update(s, 0.4, 0.5, window=6, rule="share", agree=True)  # held
  assert not bool(s.live) and int(s.counted) == 5
  s = shadow_to_live_update(s, -1.0, 0.0, window=6, rule="share")  # 5 of 6
  assert bool(s.live) and int(s.streak) == 0
  # The streak rule on the same record stays in shadow mode.
  t = shadow_to_live_init(6)
  for lcb in (1.0, -1.0) * 6:
    t = shadow_to_live_update(t, lcb, 0.0, window=6)
  assert not bool(t.live) and float(win_share(t)) == 0.5


def test_share_rule_errors_and_live_start():
  with pytest.raises(ValueError, match=r"shadow_to_live_init\(window=5\)"):
    shadow_to_live_update(shadow_to_live_init(4), 1.0, 0.0, window=5, rule="share")
  with pytest.raises(ValueError, match="rule='window'"):
    shadow_to_live_update(shadow_to_live_init(), 1.0, 0.0, rule="window")
  with pytest.raises(ValueError, match="min_share"):
    shadow_to_live_update(shadow_to_live_init(), 1.0, 0.0, rule="share", min_share=0.0)
  with pytest.raises(ValueError, match="window"):
    shadow_to_live_init(0)
  assert float(win_share(shadow_to_live_init())) == 0.0
  s = shadow_to_live_init(live=True)
  assert bool(s.live)
  assert bool(shadow_to_live_update(s, -1.0, 0.0, window=50).live)  # one-way


def test_epsilon_exploration_frequency():
  state = shadow_to_live_init()
  keys = jax.random.split(jax.random.key(0), 4000)
  f = jax.jit(jax.vmap(lambda k: choose_arm(state, k, controller_arm=5, heuristic_arm=2,
                                            num_arms=28, epsilon=0.25)))
  out = f(keys)
  explored = np.asarray(out.source) == SOURCE_RANDOM
  assert 0.22 < explored.mean() < 0.28
  arms = np.asarray(out.arm)
  assert np.all(arms[~explored] == 2)
  assert np.all(np.asarray(out.source)[~explored] == SOURCE_HEURISTIC)
  # Random arms cover the grid (the controller needs data on every arm).
  assert set(arms[explored].tolist()) == set(range(28))
  # Deterministic for a fixed key.
  again = f(keys)
  np.testing.assert_array_equal(again.arm, out.arm)
  # ε = 0: always the heuristic.
  zero = jax.vmap(lambda k: choose_arm(state, k, controller_arm=5, heuristic_arm=2,
                                       num_arms=28, epsilon=0.0))(keys[:100])
  assert np.all(np.asarray(zero.arm) == 2)


def test_live_uses_controller():
  live = shadow_to_live_init()._replace(live=jnp.array(True))
  for k in jax.random.split(jax.random.key(1), 20):
    c = choose_arm(live, k, controller_arm=5, heuristic_arm=2, num_arms=28, epsilon=1.0)
    assert int(c.arm) == 5 and int(c.source) == SOURCE_CONTROLLER


def test_choose_arm_errors():
  s = shadow_to_live_init()
  with pytest.raises(ValueError, match="num_arms"):
    choose_arm(s, jax.random.key(0), controller_arm=0, heuristic_arm=0, num_arms=0)
  with pytest.raises(ValueError, match="heuristic_arm"):
    choose_arm(s, jax.random.key(0), controller_arm=0, heuristic_arm=3, num_arms=3)
  with pytest.raises(ValueError, match="epsilon"):
    choose_arm(s, jax.random.key(0), controller_arm=0, heuristic_arm=0, num_arms=3,
               epsilon=1.5)


def test_controller_learns_a_context_dependent_arm():
  # End to end: the best arm depends on the context (restart when the group is all-fail,
  # none when it is already mixed); LinUCB on joint features learns both.
  arms = default_arms(extra_rollouts=(4,), temperatures=(1.0,))  # none + 3 wheres.
  a = arm_features(arms)
  contexts = [context_features(turn_position=0.5, entropy=1.0, success_rate=p,
                               reward_variance=p * (1 - p), rollouts_spent=8,
                               rollout_budget=32) for p in (0.0, 0.5)]
  best = {0: 3, 1: 0}  # restart for p̂ = 0, none for p̂ = 0.5.
  phis = jnp.stack([joint_features(z, a) for z in contexts])
  state = linucb_init(phis.shape[-1], reg=1.0)
  for t in range(120):
    c = t % 2
    arm = int(linucb_select(state, phis[c], alpha=0.5))
    u = 1.0 if arm == best[c] else 0.0
    state = linucb_update(state, phis[c][arm], u, gamma=1.0)
  for c in (0, 1):
    assert int(linucb_select(state, phis[c], alpha=0.0)) == best[c]


def test_sharded_gain_matches_single_device():
  assert jax.device_count() == 8, "tests/conftest.py should give 8 fake CPU devices"
  rng = np.random.default_rng(0)
  before = jnp.asarray(rng.integers(0, 2, size=(16, 4)), jnp.float32)
  after = jnp.asarray(rng.integers(0, 2, size=(16, 8)), jnp.float32)
  f = jax.jit(lambda b, a: (realised_gain(b, a), realised_gain(b, a, kind="variance")))
  single = f(before, after)
  rows = NamedSharding(Mesh(np.array(jax.devices()), ("data",)), P("data"))
  sharded = f(jax.device_put(before, rows), jax.device_put(after, rows))
  for got, want in zip(sharded, single):
    np.testing.assert_allclose(got, want, rtol=1e-6)
