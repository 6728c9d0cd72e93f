"""Temporal GRPO (arXiv 2608.13026): hand-worked example, numpy loops, errors, jit, sharding."""

import doctest
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxrl_post.advantages import temporal_grpo
from jaxrl_post.advantages.step_credit import STEP_CREDIT
from jaxrl_post.advantages.temporal_grpo import (
  check_stage_times,
  stage_success_delta,
  temporal_grpo_advantages,
  temporal_grpo_stages,
)


def test_doctests():
  assert doctest.testmod(temporal_grpo, raise_on_error=True).attempted >= 6


def test_registered():
  assert STEP_CREDIT.get("temporal_grpo") is temporal_grpo_advantages


# G = 4 rollouts of one task with K = 3 stages, S = 8 steps (t = 1..8 at index t − 1).
HAND_DONE = np.array([[[2, 4, 6],      # rollout 0: success at step 6 (length 6)
                       [3, -1, -1],    # rollout 1: fails stage 2
                       [-1, -1, -1],   # rollout 2: fails stage 1
                       [2, 5, -1]]],   # rollout 3: fails stage 3
                     np.int32)
HAND_LEN = np.array([[6, 8, 8, 7]], np.int32)


def test_hand_worked_example():
  out = temporal_grpo_stages(HAND_DONE, HAND_LEN, num_steps=8, eps=0.0)
  # Stage 1: all 4 participate, R = 1,1,0,1: μ = 3/4, σ = √3/4 → 1/√3 and −√3.
  # Stage 2: rollouts 0,1,3 participate, R = 1,0,1: μ = 2/3, σ = √2/3 → 1/√2 and −√2.
  # Stage 3: rollouts 0,3 participate, R = 1,0: μ = 1/2, σ = 1/2 → ±1.
  a1, f1 = 1 / math.sqrt(3), -math.sqrt(3)
  a2, f2 = 1 / math.sqrt(2), -math.sqrt(2)
  np.testing.assert_allclose(out.stage_adv[0], [[a1, a2, 1.0], [a1, f2, 0.0], [f1, 0.0, 0.0],
                                                [a1, a2, -1.0]], rtol=1e-6)
  assert out.participation[0].tolist() == [[True, True, True], [True, True, False],
                                           [True, False, False], [True, True, True]]
  assert out.outcome[0].tolist() == [[True, True, True], [True, False, False],
                                     [False, False, False], [True, True, False]]
  expected = [
      # t=1  t=2  t=3  t=4  t=5  t=6  t=7  t=8
      [a1, a1, a2, a2, 1.0, 1.0, 0.0, 0.0],   # (0,2] (2,4] (4,6]; past T_0 = 6: 0
      [a1, a1, a1, f2, f2, f2, f2, f2],       # (0,3], first failed stage 2: (3, 8]
      [f1] * 8,                               # first failed stage 1: (0, 8]
      [a1, a1, a2, a2, a2, -1.0, -1.0, 0.0],  # (0,2] (2,5], failed stage 3: (5, 7]
  ]
  np.testing.assert_allclose(out.step_adv[0], expected, rtol=1e-6)
  # Sign not preserved: failed rollouts 1 and 3 get positive credit for the stages they did.
  assert (np.asarray(out.step_adv[0, 1, :3]) > 0).all()
  assert (np.asarray(out.step_adv[0, 3, :5]) > 0).all()
  np.testing.assert_allclose(temporal_grpo_advantages(HAND_DONE, HAND_LEN, num_steps=8, eps=0.0),
                             out.step_adv)


def _np_temporal_grpo(done, length, valid, num_steps, eps):
  """Independent loop implementation of the paper's definitions (1-based steps)."""
  b_, g_, k_ = done.shape
  adv = np.zeros((b_, g_, num_steps))
  for b in range(b_):
    n_stages = [k for k in range(k_) if valid[b, k]]
    # Chain completion per rollout.
    comp = np.zeros((g_, k_), bool)
    for g in range(g_):
      for k in n_stages:
        if done[b, g, k] >= 1 and (k == 0 or comp[g, k - 1]):
          comp[g, k] = True
    for k in n_stages:
      parts = [g for g in range(g_) if k == 0 or comp[g, k - 1]]
      if not parts:
        continue
      rs = [float(comp[g, k]) for g in parts]
      mu = sum(rs) / len(rs)
      sd = math.sqrt(sum((r - mu) ** 2 for r in rs) / len(rs))
      for g, r in zip(parts, rs):
        a = 0.0 if sd + eps == 0 else (r - mu) / (sd + eps)
        lo = 0 if k == 0 else done[b, g, k - 1]
        hi = done[b, g, k] if comp[g, k] else length[b, g]
        for t in range(lo + 1, hi + 1):
          adv[b, g, t - 1] += a
  return adv


def _random_batch(seed, b=8, g=6, k=4, s=12):
  """Valid stage times: monotone completions, a random first failure, ragged stage counts."""
  rng = np.random.default_rng(seed)
  done = -np.ones((b, g, k), np.int32)
  length = np.zeros((b, g), np.int32)
  valid = np.zeros((b, k), bool)
  for i in range(b):
    n_stage = rng.integers(1, k + 1)
    valid[i, :n_stage] = True
    for j in range(g):
      n_done = rng.integers(0, n_stage + 1)
      times = np.sort(rng.choice(np.arange(1, s + 1), size=n_done, replace=True))
      done[i, j, :n_done] = times
      last = times[-1] if n_done else 0
      length[i, j] = last if n_done == n_stage and rng.random() < 0.7 else rng.integers(
          max(last, 1), s + 1)
      # Padding stages may hold junk: they must be ignored.
      done[i, j, n_stage:] = rng.integers(-1, s + 1, size=k - n_stage)
  return done, length, valid


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_numpy_loops(seed):
  done, length, valid = _random_batch(seed)
  got = jax.jit(lambda d, n, v: temporal_grpo_advantages(d, n, v, num_steps=12))(
      done, length, valid)
  want = _np_temporal_grpo(done, length, valid, 12, 1e-6)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  assert np.abs(want).sum() > 0


def test_single_participant_gets_zero_and_stage_one_uses_all():
  done = np.array([[[3, 5], [-1, -1], [-1, -1]]], np.int32)  # only rollout 0 enters stage 2
  out = temporal_grpo_stages(done, np.array([[6, 6, 6]], np.int32), num_steps=6)
  assert out.participation[0, :, 0].tolist() == [True, True, True]
  assert out.participation[0, :, 1].tolist() == [True, False, False]
  assert float(out.stage_adv[0, 0, 1]) == 0.0  # σ_2 = 0: no signal from a lone participant
  # Stage 1 statistics over all 3 rollouts: μ = 1/3, σ = √2/3.
  np.testing.assert_allclose(out.stage_adv[0, :, 0], [math.sqrt(2), -1 / math.sqrt(2),
                                                      -1 / math.sqrt(2)], rtol=1e-5)
  np.testing.assert_allclose(out.step_adv[0, 0], [math.sqrt(2)] * 3 + [0.0] * 3, rtol=1e-5)


def test_out_of_chain_completion_is_not_counted_under_jit():
  # Rollout 1 flags stage 2 without stage 1. Under jit (no value check) it counts as failing
  # stage 1 and its whole rollout is stage 1's interval; intervals stay disjoint.
  done = np.array([[[2, 4], [-1, 3]]], np.int32)
  length = np.array([[4, 5]], np.int32)
  out = jax.jit(lambda d, n: temporal_grpo_stages(d, n, num_steps=5, eps=0.0))(done, length)
  assert out.outcome[0].tolist() == [[True, True], [False, False]]
  np.testing.assert_allclose(out.step_adv[0], [[1, 1, 0, 0, 0], [-1, -1, -1, -1, -1]])
  with pytest.raises(ValueError, match="stage_done"):
    temporal_grpo_advantages(done, length, num_steps=5)


def test_bad_inputs_raise_naming_the_argument():
  length = np.array([[6, 6]], np.int32)
  with pytest.raises(ValueError, match=r"stage_done\[0, 1, 1\] = 7 is a step outside"):
    temporal_grpo_advantages(np.array([[[2, 5], [3, 7]]], np.int32), length, num_steps=8)
  with pytest.raises(ValueError, match="stage_done.*outside"):
    temporal_grpo_advantages(np.array([[[0, 5], [3, 4]]], np.int32), length, num_steps=8)
  with pytest.raises(ValueError, match="stage_done.*non-decreasing"):
    temporal_grpo_advantages(np.array([[[4, 2], [3, 4]]], np.int32), length, num_steps=8)
  with pytest.raises(ValueError, match="rollout_len"):
    temporal_grpo_advantages(np.array([[[2, 5], [3, 4]]], np.int32), np.array([[6, 9]]),
                             num_steps=8)
  with pytest.raises(ValueError, match="rollout_len"):
    temporal_grpo_advantages(np.ones((1, 2, 2), np.int32), np.ones((2, 1), np.int32),
                             num_steps=8)
  with pytest.raises(ValueError, match="stage_valid"):
    temporal_grpo_advantages(np.ones((1, 2, 2), np.int32), length, np.ones((1, 3)),
                             num_steps=8)
  with pytest.raises(ValueError, match="stage_done"):
    temporal_grpo_advantages(np.ones((2, 2), np.int32), length, num_steps=8)
  with pytest.raises(ValueError, match="num_steps"):
    temporal_grpo_advantages(np.ones((1, 2, 2), np.int32), length, num_steps=0)
  # Junk on an invalid (padding) stage is allowed.
  check_stage_times(np.array([[[2, 99]]]), np.array([[6]]), np.array([[True, False]]))


def test_stage_success_delta():
  r_new = np.array([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
  v_new = np.array([[1, 1, 1], [1, 1, 0], [1, 0, 0]])
  r_old = np.array([[1, 0, 0], [0, 0, 0]])
  v_old = np.array([[1, 1, 0], [1, 0, 0]])
  got = jax.jit(stage_success_delta)(r_new, v_new, r_old, v_old)
  # Stage 1: 2/3 vs 1/2; stage 2: 1/2 vs 0/1; stage 3: 0/1 vs no participant (NaN).
  np.testing.assert_allclose(got, [100 * (2 / 3 - 1 / 2), 50.0, np.nan], rtol=1e-6)
  with pytest.raises(ValueError, match="r_old"):
    stage_success_delta(r_new, v_new, r_old[:, :2], v_old[:, :2])


def test_sharded_matches_single_device():
  assert jax.device_count() == 8, "tests/conftest.py should give 8 fake CPU devices"
  done, length, valid = _random_batch(5, b=16)
  mesh = Mesh(np.array(jax.devices()), ("data",))
  rows = NamedSharding(mesh, P("data"))

  @jax.jit
  def fn(d, n, v):
    out = temporal_grpo_stages(d, n, v, num_steps=12)
    return out.step_adv, stage_success_delta(out.outcome, out.participation,
                                             jnp.zeros_like(out.outcome), out.participation)

  args = (done, length, valid)
  single = fn(*[jax.device_put(a, jax.devices()[0]) for a in args])
  sharded = [jax.device_put(a, rows) for a in args]
  assert len(sharded[0].sharding.device_set) == 8
  got = fn(*sharded)
  for a, b in zip(got, single):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
