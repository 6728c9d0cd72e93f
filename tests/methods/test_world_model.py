"""methods/world_model.py: WMRL as a part of the GRPO step — the stand-in world models, the
anchor choice, the `rewards` hook on a stub method (hand-checked numbers, every mode), the
checkpointed state, and config errors naming the key."""

import doctest
import types

import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from jaxrl_post.methods import step_parts, world_model
from jaxrl_post.methods.grpo import Verified
from jaxrl_post.rewards.verifiers import rewards_for
from jaxrl_post.tasks import get_task

G = 4
TASK = get_task("arith")
RECORDS = [{"index": 0, "prompt": "Q: 50+7=\n", "answer": "57"},
           {"index": 1, "prompt": "Q: 6+6=\n", "answer": "12"}]
TEXTS = ["#### 57", "#### 17", "#### 99", "nothing",  # r_wm 1, 1/2, 0, 0
         "#### 12", "#### 42", "#### 112", "#### 0"]  # r_wm 1, 1/2, 2/3, 0
R_WM = np.array([1, 0.5, 0, 0, 1, 0.5, 2 / 3, 0])
# correct + 0.1·format: "nothing" has no answer line (format 0), the rest are well formed.
R_TRUE = np.array([1.1, 0.1, 0.1, 0.0, 1.1, 0.1, 0.1, 0.1])


def _config(**knobs):
  config = ml_collections.ConfigDict(dict(prompts_per_step=2, group_size=G, seed=0))
  config.world_model = ml_collections.ConfigDict(dict(
    name="digit_overlap", mode="wmrl", calibrator="isotonic", ivd=True, noise_std=0.0,
    anchor_fraction=0.0, min_anchors=1, max_anchors=24, capacity=16, bins=2, min_pairs=4,
    refit_every=4, half_life=64.0, warmup=1, target=2.0, w_max=4.0, eps=0.0))
  config.world_model.update(knobs)
  return config


def _method():
  return types.SimpleNamespace(
    task=TASK, sampler=types.SimpleNamespace(decode_text=lambda rollout: list(rollout)),
    objective=types.SimpleNamespace(reward_names=["correct", "format"],
                                    reward_weights=np.array([1.0, 0.1], np.float32)))


def _ctx(step, texts=TEXTS, records=RECORDS):
  correct, fmt, failures = rewards_for(TASK, records, texts, G)
  verified = Verified(correct, fmt, failures, jnp.full(len(texts), 7.0))
  return step_parts.StepContext(step, records, texts, verified, {}, None)


def _step_with_anchor(part, group):
  """A step whose one anchor is `group` (the anchors are drawn from (seed, step))."""
  for step in range(1, 50):
    if part.anchors(step).nonzero()[0].tolist() == [group]:
      return step
  raise AssertionError("no such step")


def _grpo(r, eps=0.0):
  """Population-std GRPO of one group, by loops."""
  n = len(r)
  mu = sum(r) / n
  sd = (sum((x - mu) ** 2 for x in r) / n) ** 0.5
  return [(x - mu) / (sd + eps) for x in r]


def _interp(x, knots):
  """Piecewise-linear through `knots` [(x, y), ...], flat outside."""
  (x0, y0), (x1, y1) = knots[0], knots[-1]
  if x <= x0:
    return y0
  if x >= x1:
    return y1
  for (a, fa), (b, fb) in zip(knots, knots[1:]):
    if a <= x <= b:
      return fa + (x - a) / (b - a) * (fb - fa)
  raise AssertionError


# ---- world models ----


@pytest.mark.parametrize("answer, completion, want", [
  ("57", "steps\n#### 57", 1.0),
  ("57", "#### 17", 0.5),
  ("57", "#### 157", 2 / 3),  # an extra digit costs a position
  ("8975", "#### 8", 0.0),  # right-aligned: 5 ≠ 8
  ("-57", "#### 57", 2 / 3),  # the sign is a character
  ("-57", "#### -57", 1.0),
  ("57", "#### fifty", 0.0),  # no parseable integer
  ("57", "#### 57\n#### 57", 0.0),  # two answer lines: no final answer
  ("0", "#### 0", 1.0),
])
def test_digit_overlap(answer, completion, want):
  assert world_model.digit_overlap(TASK, {"answer": answer}, completion) == pytest.approx(want)


def test_digit_overlap_needs_an_integer_answer_and_verifier_is_the_task():
  with pytest.raises(ValueError, match=r"record\['answer'\]='1.5'"):
    world_model.digit_overlap(TASK, {"answer": "1.5"}, "#### 1")
  assert world_model.verifier_score(TASK, {"answer": "57"}, "#### 57") == 1.0
  assert world_model.verifier_score(TASK, {"answer": "57"}, "#### 17") == 0.0
  with pytest.raises(KeyError, match="bogus"):
    world_model.world_model_scores("bogus", TASK, RECORDS, TEXTS, G)


def test_world_model_scores_noise_is_seeded_clipped_and_failures_are_nan():
  clean, failures = world_model.world_model_scores("digit_overlap", TASK, RECORDS, TEXTS, G)
  np.testing.assert_allclose(clean, R_WM, rtol=1e-6)
  assert failures == 0 and clean.dtype == np.float32
  noisy, _ = world_model.world_model_scores("digit_overlap", TASK, RECORDS, TEXTS, G,
                                            noise_std=0.3, seed=1, step=5)
  again, _ = world_model.world_model_scores("digit_overlap", TASK, RECORDS, TEXTS, G,
                                            noise_std=0.3, seed=1, step=5)
  other, _ = world_model.world_model_scores("digit_overlap", TASK, RECORDS, TEXTS, G,
                                            noise_std=0.3, seed=1, step=6)
  np.testing.assert_array_equal(noisy, again)  # a resumed run draws the same
  assert not np.array_equal(noisy, other) and not np.array_equal(noisy, clean)
  assert noisy.min() >= 0.0 and noisy.max() <= 1.0
  eps = np.random.default_rng((1, 5, world_model.NOISE_STREAM)).normal(size=8)
  np.testing.assert_allclose(noisy, np.clip(R_WM + 0.3 * eps, 0, 1), atol=1e-6)
  bad = [RECORDS[0], dict(RECORDS[1], answer="x")]  # the scorer raises on group 1
  scores, failures = world_model.world_model_scores("digit_overlap", TASK, bad, TEXTS, G,
                                                    noise_std=0.3)
  assert failures == G and np.isnan(scores[G:]).all() and np.isfinite(scores[:G]).all()
  with pytest.raises(ValueError, match="texts has 7 rows"):
    world_model.world_model_scores("digit_overlap", TASK, RECORDS, TEXTS[:7], G)


# ---- anchors ----


@pytest.mark.parametrize("groups, fraction, lo, hi, want", [
  (8, 0.1, 2, 24, 2), (16, 0.1, 2, 24, 2), (30, 0.1, 2, 24, 3), (31, 0.1, 2, 24, 4),
  (300, 0.1, 2, 24, 24), (3, 0.1, 5, 24, 3), (8, 0.0, 0, 24, 0), (8, 1.0, 0, 24, 8),
])
def test_num_anchors(groups, fraction, lo, hi, want):
  assert world_model.num_anchors(groups, fraction=fraction, min_anchors=lo,
                                 max_anchors=hi) == want


def test_choose_anchors_is_seeded_by_seed_and_step():
  picks = [world_model.choose_anchors(8, 3, seed=0, step=s) for s in range(1, 11)]
  assert all(p.sum() == 3 and p.dtype == bool for p in picks)
  np.testing.assert_array_equal(picks[0], world_model.choose_anchors(8, 3, seed=0, step=1))
  assert len({p.tobytes() for p in picks}) > 1  # varies over steps
  assert not all(np.array_equal(world_model.choose_anchors(8, 3, seed=1, step=s), p)
                 for s, p in enumerate(picks, 1))  # and over seeds
  assert world_model.choose_anchors(4, 0, seed=0, step=1).sum() == 0
  with pytest.raises(ValueError, match="k=5"):
    world_model.choose_anchors(4, 5, seed=0, step=1)


# ---- the hook ----


def test_rewards_hook_hand_checked():
  part = world_model.build_world_model(_config(), TASK)
  step = _step_with_anchor(part, 0)
  verified, metrics = part.rewards(_method(), _ctx(step))
  # Group 0 is the anchor: its pairs (1, 1.1), (½, 0.1), (0, 0.1), (0, 0) are pushed; 4 =
  # min_pairs, so f̂ fits. Bins of width ½ (a value on an edge goes up): bin 0 = {0, 0} with
  # mean y 0.05, bin 1 = {½, 1} with mean x ¾ and mean y 0.6, already monotone:
  knots = [(0.0, 0.05), (0.75, 0.6)]
  d = [_interp(x, knots) for x in R_WM[:G]]
  y = R_TRUE[:G]
  dc, yc = [v - sum(d) / G for v in d], [v - sum(y) / G for v in y]
  s2 = sum((a - b) ** 2 for a, b in zip(dc, yc)) / G / (sum(v * v for v in yc) / G)
  # warmup 1: c = (2 − 1)/s² right away, so w = 1 + c·s² = 2 (the target).
  want = [2.0 * a for a in _grpo(list(y))]
  # Group 1 is the world model's: f̂(r_wm) = 0.6, 0.05 + (½/¾)·0.55, 0.05 + (⅔/¾)·0.55, 0.05.
  f1 = [_interp(x, knots) for x in R_WM[G:]]
  np.testing.assert_allclose(f1, [0.6, 0.05 + 0.55 * 2 / 3, 0.05 + 0.55 * 8 / 9, 0.05])
  want += _grpo(f1)
  np.testing.assert_allclose(np.asarray(verified.adv), want, rtol=1e-5, atol=1e-6)
  assert verified.adv.shape == (2 * G,) and verified.adv.dtype == jnp.float32
  np.testing.assert_array_equal(verified.correct, _ctx(step).verified.correct)  # kept
  assert metrics["wmrl/env_rows"] == G
  assert metrics["wmrl/ivd_weight"] == pytest.approx(2.0)
  assert metrics["wmrl/calibrator_fitted"] == 1.0 and metrics["wmrl/pairs"] == 4.0
  assert metrics["wmrl/disagreement"] == pytest.approx(s2, rel=1e-5)
  assert metrics["wmrl/rwm_corr"] == pytest.approx(np.corrcoef(R_WM, R_TRUE)[0, 1], rel=1e-5)
  assert metrics["wmrl/reward_mae"] == pytest.approx(np.mean(np.abs(np.array(f1) - R_TRUE[G:])),
                                                     rel=1e-5)
  assert metrics["wmrl/wm_failures"] == 0.0
  assert float(part.ivd.c) == pytest.approx(1 / s2, rel=1e-5)


def test_non_anchor_true_rewards_are_not_used():
  a = world_model.build_world_model(_config(), TASK)
  b = world_model.build_world_model(_config(), TASK)
  step = _step_with_anchor(a, 0)
  ctx = _ctx(step)
  # Group 1's verifier outcome changed (all wrong, one NaN): advantages must not move.
  correct = ctx.verified.correct.copy()
  correct[G:] = [0.0, np.nan, 0.0, 0.0]
  changed = ctx._replace(verified=ctx.verified._replace(correct=correct))
  adv_a = np.asarray(a.rewards(_method(), ctx)[0].adv)
  adv_b = np.asarray(b.rewards(_method(), changed)[0].adv)
  np.testing.assert_array_equal(adv_a, adv_b)
  # ...but group 0's (the anchor's) do.
  c = world_model.build_world_model(_config(), TASK)
  correct = ctx.verified.correct.copy()
  correct[:G] = [0.0, 1.0, 0.0, 0.0]
  moved = ctx._replace(verified=ctx.verified._replace(correct=correct))
  assert not np.allclose(np.asarray(c.rewards(_method(), moved)[0].adv)[:G], adv_a[:G])


def test_modes_env_raw_and_the_ablations():
  env = world_model.build_world_model(_config(mode="env"), TASK)
  verified, metrics = env.rewards(_method(), _ctx(1))
  np.testing.assert_allclose(np.asarray(verified.adv),
                             _grpo(list(R_TRUE[:G])) + _grpo(list(R_TRUE[G:])), rtol=1e-5)
  assert metrics["wmrl/env_rows"] == 2 * G and metrics["wmrl/ivd_weight"] == 1.0

  raw = world_model.build_world_model(_config(mode="raw"), TASK)
  verified, metrics = raw.rewards(_method(), _ctx(1))
  np.testing.assert_allclose(np.asarray(verified.adv),
                             _grpo(list(R_WM[:G])) + _grpo(list(R_WM[G:])), rtol=1e-5)
  assert metrics["wmrl/env_rows"] == 0 and metrics["wmrl/pairs"] == 0
  assert metrics["wmrl/calibrator_fitted"] == 0.0
  assert np.isnan(metrics["wmrl/disagreement"])

  # No debiasing, no IVD: the anchor group on r_env, the other on raw r_wm, weight 1.
  plain = world_model.build_world_model(_config(calibrator="identity", ivd=False), TASK)
  step = _step_with_anchor(plain, 1)
  verified, metrics = plain.rewards(_method(), _ctx(step))
  np.testing.assert_allclose(np.asarray(verified.adv),
                             _grpo(list(R_WM[:G])) + _grpo(list(R_TRUE[G:])), rtol=1e-5)
  assert metrics["wmrl/ivd_weight"] == 1.0 and metrics["wmrl/env_rows"] == G
  assert metrics["wmrl/pairs"] == 4.0  # the buffer fills even when f̂ is not applied


def test_ungraded_rows_are_left_out():
  part = world_model.build_world_model(_config(min_pairs=16, mode="env"), TASK)
  ctx = _ctx(1)
  correct = ctx.verified.correct.copy()
  fmt = ctx.verified.format.copy()
  correct[0] = fmt[0] = np.nan  # a verifier time-out: excluded, not scored 0
  ctx = ctx._replace(verified=ctx.verified._replace(correct=correct, format=fmt))
  adv = np.asarray(part.rewards(_method(), ctx)[0].adv)
  np.testing.assert_allclose(adv[:G], [0.0, *_grpo(list(R_TRUE[1:G]))], rtol=1e-5, atol=1e-6)


def test_array_state_round_trip_continues_exactly():
  config = _config(warmup=3, min_pairs=4, refit_every=2, noise_std=0.1)
  first = world_model.build_world_model(config, TASK)
  for step in (1, 2, 3):
    first.rewards(_method(), _ctx(step))
  saved = {k: {n: np.array(v) for n, v in d.items()} for k, d in first.array_state().items()}
  assert set(saved) == {"calibrator", "ivd"} and saved["calibrator"]["count"] == 12
  restored = world_model.build_world_model(config, TASK)
  restored.load_array_state(saved)
  a, ma = first.rewards(_method(), _ctx(4))
  b, mb = restored.rewards(_method(), _ctx(4))
  np.testing.assert_array_equal(np.asarray(a.adv), np.asarray(b.adv))
  assert {k: v for k, v in ma.items() if k != "time/world_model"} == pytest.approx(
    {k: v for k, v in mb.items() if k != "time/world_model"}, nan_ok=True)
  fresh = world_model.build_world_model(config, TASK)  # without the state: differs
  c, _ = fresh.rewards(_method(), _ctx(4))
  assert not np.allclose(np.asarray(c.adv), np.asarray(a.adv))


# ---- building and errors ----


def test_build_and_run_order():
  config = _config()
  assert world_model.build_world_model(ml_collections.ConfigDict(dict(prompts_per_step=2)),
                                       TASK) is None
  config.world_model.name = "none"
  assert world_model.build_world_model(config, TASK) is None
  config = _config()
  config.sample_scale = ml_collections.ConfigDict(dict(name="none"))
  parts = step_parts.build_step_parts(config, TASK)
  assert list(parts) == ["world_model"]


@pytest.mark.parametrize("knobs, match", [
  ({"name": "oracle"}, r"config.world_model.name='oracle'; valid: none, digit_overlap"),
  ({"mode": "mix"}, "config.world_model.mode='mix'"),
  ({"calibrator": "platt"}, "config.world_model.calibrator='platt'"),
  ({"anchor_fraction": 1.5}, "config.world_model.anchor_fraction must be in"),
  ({"min_anchors": -1}, "config.world_model.min_anchors must be >= 0"),
  ({"max_anchors": 0}, r"config.world_model.max_anchors \(0\) must be >= "),
  ({"capacity": 0}, "config.world_model.capacity must be >= 1"),
  ({"bins": 1}, "config.world_model.bins must be >= 2"),
  ({"min_pairs": 17}, r"config.world_model.min_pairs \(17\) exceeds"),
  ({"refit_every": 0}, "config.world_model.refit_every must be >= 1"),
  ({"noise_std": -0.1}, "config.world_model.noise_std must be >= 0"),
  ({"half_life": 0.0}, "config.world_model.half_life must be > 0"),
  ({"w_max": 0.5}, "config.world_model.w_max must be >= 1"),
  ({"min_anchors": 0}, "give 0 anchor groups"),  # no anchors in mode wmrl
  ({"min_anchors": 2}, "give 2 anchor groups"),  # every group an anchor
])
def test_config_errors_name_the_key(knobs, match):
  with pytest.raises(ValueError, match=match):
    world_model.build_world_model(_config(**knobs), TASK)


def test_ivd_must_be_a_bool():
  config = _config()
  config.world_model = ml_collections.ConfigDict({**config.world_model.to_dict(), "ivd": "yes"})
  with pytest.raises(ValueError, match="config.world_model.ivd must be True or False"):
    world_model.build_world_model(config, TASK)


def test_world_model_must_fit_the_task():
  class DecimalTask:
    def make_example(self, split, index):
      return {"answer": "1.5", "demonstration": "#### 1.5"}

  with pytest.raises(ValueError, match=r"record\['answer'\]='1.5'"):
    world_model.build_world_model(_config(), DecimalTask())
  # "raw" and "env" need no anchor count.
  assert world_model.build_world_model(_config(mode="raw", min_anchors=0), TASK).k == 0
  assert world_model.build_world_model(_config(mode="env", min_anchors=0), TASK).k == 2


def test_doctests():
  doctest.testmod(world_model, raise_on_error=True)
