"""RAIL's host logic (jaxrl_post/methods/interventions.py): group statistics, the heuristic, the
per-step decisions and slot budget, the realised gains / utilities that update the bandit, and
the fixed block of extra rows, with hand-checked numbers."""

import doctest

import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from jaxrl_post import bandits
from jaxrl_post.methods import interventions as rail
from jaxrl_post.sampling import interventions as iv


def _config(**knobs):
  section = dict(mode="heuristic", bandit="linucb", gain="coverage", extra_rollouts=(2, 4),
                 temperatures=(1.0, 1.2), max_groups=2, alpha=1.0, reg=1.0, gamma=1.0,
                 cost_weight=0.1, epsilon=0.0, window=2, rollout_budget=16)
  section.update(knobs)
  return ml_collections.ConfigDict(dict(
    intervention=section, loss=dict(beta=0.0), prompts_per_step=3, group_size=2,
    ppo_mini_batches=1, num_micro_batches=1, score_micro_batches=1, num_train_examples=8,
    temperature=1.0, max_new_tokens=4, seed=0))


def test_group_stats_by_hand():
  reward = np.array([1.0, 0.0, 1.0, np.nan, 0.0, 0.0])
  logp = -np.array([[1.0, 3.0], [2.0, 9.0], [0.5, 0.5], [0.0, 0.0], [1.0, 1.0], [2.0, 2.0]])
  mask = np.array([[1, 1], [1, 0], [1, 1], [0, 0], [1, 0], [1, 0]], bool)
  s = rail.group_stats(reward, logp, mask, 2)
  assert s.success.tolist() == [0.5, 1.0, 0.0]  # the NaN row is skipped
  assert s.variance.tolist() == [0.25, 0.0, 0.0]
  assert s.uniform.tolist() == [False, True, True]
  np.testing.assert_allclose(s.entropy, [(1 + 3 + 2) / 3, 0.5, 1.5])


def test_heuristic_arm_by_hand():
  arms = iv.default_arms(wheres=("restart",), extra_rollouts=(2, 4), temperatures=(0.7, 1.2))
  # arms: none, (2, 0.7), (2, 1.2), (4, 0.7), (4, 1.2)
  assert rail.heuristic_arm(arms, False, 1.0) == 0
  assert rail.heuristic_arm(arms, True, 1.0) == 4  # 4 rollouts; |1.2 − 1| < |0.7 − 1|
  assert rail.heuristic_arm(arms, True, 0.8) == 3


def test_decide_heuristic_and_slot_budget():
  part = rail.Interventions(_config(max_groups=1))
  stats = rail.GroupStats(np.array([0.0, 0.5, 1.0], np.float32), np.zeros(3, np.float32),
                          np.array([True, False, True]), np.ones(3, np.float32))
  d = part.decide(stats, np.array([3, 4, 5]), seed=0, step=1)
  # Arms: none, (2, 1.0), (2, 1.2), (4, 1.0), (4, 1.2); uniform groups → (4, 1.0) = 3. One slot:
  # the second uniform group is executed as "none".
  assert d.arm.tolist() == [3, 0, 0] and d.slot.tolist() == [0, -1, -1]
  assert d.source.tolist() == [iv.SOURCE_HEURISTIC] * 3
  assert d.features.shape == (3, 5, iv.ARM_FEATURE_DIM * iv.CONTEXT_BASE_DIM)
  # The shadow switch's test: a fresh bandit (A = I, b = 0) has mean 0 and UCB = α‖φ_a‖ for
  # every arm, so the controller picks the longest φ and its margin is −‖φ_controller‖.
  norms = np.linalg.norm(d.features, axis=-1)
  controller = norms.argmax(-1)
  assert d.agree.tolist() == (controller == np.array([3, 0, 3])).tolist()
  np.testing.assert_allclose(d.margin, -norms.max(-1), rtol=1e-5)
  # φ(z, a) = vec(a ⊗ z): for arm 3 the count feature 4/4 = 1 times the context (bias 1,
  # position 0, entropy 1, p̂ 0, var 0, spent 0 / 16).
  count = len(iv.WHERE_OPTIONS)
  z = d.features[0, 3].reshape(iv.ARM_FEATURE_DIM, iv.CONTEXT_BASE_DIM)[count]
  assert z.tolist() == [1.0, 0.0, 1.0, 0.0, 0.0, 0.0]


def test_rail_mode_explores_with_epsilon_one_and_repeats_per_seed_step():
  part = rail.Interventions(_config(mode="rail", epsilon=1.0, max_groups=3))
  stats = rail.GroupStats(np.zeros(3, np.float32), np.zeros(3, np.float32),
                          np.ones(3, bool), np.zeros(3, np.float32))
  a = part.decide(stats, np.arange(3), seed=0, step=2)
  assert a.source.tolist() == [iv.SOURCE_RANDOM] * 3
  again = rail.Interventions(_config(mode="rail", epsilon=1.0, max_groups=3))
  assert again.decide(stats, np.arange(3), seed=0, step=2).arm.tolist() == a.arm.tolist()
  assert int(part.switch.decisions) == 3


@pytest.mark.parametrize("rule, streak", [("hold", 3), ("reset", 0)])
def test_agreeing_with_the_heuristic_holds_or_resets_the_streak(rule, streak):
  # α = 0 on a fresh bandit: every arm's UCB is 0, so the controller picks arm 0, "none" —
  # the heuristic's arm on mixed groups. Its LCB (0) never exceeds the same arm's mean (0).
  part = rail.Interventions(_config(mode="rail", alpha=0.0, on_agreement=rule))
  part.switch = part.switch._replace(streak=jnp.int32(3))
  stats = rail.GroupStats(np.full(3, 0.5, np.float32), np.full(3, 0.25, np.float32),
                          np.zeros(3, bool), np.ones(3, np.float32))
  d = part.decide(stats, np.arange(3), seed=0, step=1)
  assert d.arm.tolist() == [0, 0, 0]
  assert d.agree.all() and np.all(d.margin == 0.0)
  assert int(part.switch.streak) == streak and int(part.switch.decisions) == 3
  with pytest.raises(ValueError, match="config.intervention.on_agreement='keep'"):
    rail.Interventions(_config(on_agreement="keep"))


def test_update_gain_utility_and_bandit_by_hand():
  part = rail.Interventions(_config())
  b = 3
  stats = rail.GroupStats(np.zeros(b, np.float32), np.zeros(b, np.float32),
                          np.array([True, False, True]), np.zeros(b, np.float32))
  d = part.decide(stats, np.array([0, 1, 2]), seed=0, step=0)
  assert d.arm.tolist() == [3, 0, 3] and d.slot.tolist() == [0, -1, 1]
  reward = np.array([0.0, 0.0, 1.0, 0.0, 1.0, 1.0], np.float32)
  # 2 slots × 4 rows: slot 0 (group 0) got [1, 0, 0, 0]; slot 1 (group 2) got [1, 1, 1, 1].
  extra_reward = np.array([1, 0, 0, 0, 1, 1, 1, 1], np.float32)
  owner = np.array([0, 0, 0, 0, 2, 2, 2, 2], np.int32)
  extra_mask = np.zeros((8, 4), bool)
  extra_mask[:4, :2] = True  # 8 tokens for group 0
  extra_mask[4:, :1] = True  # 4 tokens for group 2
  m = part.update(d, reward, extra_reward, owner, extra_mask, np.array([0, 1, 2]))
  # Coverage gains: group 0 becomes mixed (+1); group 1 was mixed, no rows (0); group 2 stays
  # all-1 (0). Utilities u = g − 0.1·tokens / (G·max_new_tokens = 8).
  u = np.array([1 - 0.1 * 8 / 8, 0.0, 0 - 0.1 * 4 / 8])
  assert m["rail/gain"] == pytest.approx(0.5)  # mean over the 2 intervened groups
  assert m["rail/utility"] == pytest.approx(u.mean())
  assert m["rail/extra_rows"] == 8 and m["rail/extra_tokens"] == 12
  assert m["rail/mixed_before"] == pytest.approx(1 / 3)
  assert m["rail/mixed_after"] == pytest.approx(2 / 3)
  # The bandit (γ = 1): A = I + Σ x xᵀ, b = Σ u x over the executed arms' features.
  xs = [d.features[i, d.arm[i]].astype(np.float64) for i in range(b)]
  a_ref = np.eye(part.dim) + sum(np.outer(x, x) for x in xs)
  b_ref = sum(ui * x for ui, x in zip(u, xs, strict=True))
  np.testing.assert_allclose(np.asarray(part.bandit.A), a_ref, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(part.bandit.b), b_ref, rtol=1e-5, atol=1e-5)
  assert part.spent[:3].tolist() == [2 + 4, 2, 2 + 4]


def test_variance_gain():
  part = rail.Interventions(_config(gain="variance"))
  stats = rail.GroupStats(np.zeros(1, np.float32), np.zeros(1, np.float32), np.ones(1, bool),
                          np.zeros(1, np.float32))
  d = part.decide(stats, np.array([0]), seed=0, step=0)
  m = part.update(d, np.array([0.0, 0.0], np.float32), np.array([1, 1, 0, 0, 0, 0, 0, 0.0]),
                  np.array([0, 0, 0, 0, 1, 1, 1, 1]), np.zeros((8, 4), bool), np.array([0]))
  # [0, 0, 1, 1, 0, 0]: Var = 2/6 − (2/6)² = 2/9 (owner 1 = the dummy group: not this group's).
  assert m["rail/gain"] == pytest.approx(2 / 9)


def test_fit_prompts_aligns_left_padding_and_fills_unused_rows():
  batch = {"prompt_tokens": np.array([[0, 7, 8], [0, 0, 9]]),
           "prompt_mask": np.array([[0, 1, 1], [0, 0, 1]], bool)}
  extra = {"completion_tokens": np.zeros((3, 2)),
           "prompt_tokens": np.array([[0, 0, 0, 5], [0, 0, 0, 0], [0, 0, 6, 6]]),
           "prompt_mask": np.array([[0, 0, 0, 1], [0, 0, 0, 0], [0, 0, 1, 1]], bool)}
  out = rail._fit_prompts(extra, batch)
  assert out["prompt_tokens"].tolist() == [[0, 0, 5], [0, 7, 8], [0, 6, 6]]
  assert out["prompt_mask"].astype(int).tolist() == [[0, 0, 1], [0, 1, 1], [0, 1, 1]]
  none = rail._fit_prompts(dict(extra, prompt_tokens=None, prompt_mask=None), batch)
  assert none["prompt_tokens"].tolist() == [[0, 7, 8]] * 3


def test_array_state_round_trip_and_hook_order_errors():
  part = rail.Interventions(_config())
  x = jnp.ones(part.dim)
  part.bandit = bandits.linucb_update(part.bandit, x, 0.5)
  part.spent[3] = 7
  other = rail.Interventions(_config())
  other.load_array_state(part.array_state())
  np.testing.assert_array_equal(np.asarray(other.bandit.A), np.asarray(part.bandit.A))
  assert other.spent[3] == 7
  with pytest.raises(ValueError, match="before its rewards hook"):
    part.transform(None, None, {}, None)


def test_doctests():
  doctest.testmod(rail, raise_on_error=True)
