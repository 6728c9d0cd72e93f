"""Verifier failures and time-outs, PPO mini-batches, and metrics files cut by a kill."""

import json
import time

import numpy as np
import pytest

from jaxrl_post.training import rl
from jaxrl_post.training.metrics import MetricWriter, read_metrics


class _FlakyTask:
  """Reward 1 for "ok", raises for "boom", hangs for "hang"."""

  def reward(self, record, text):
    if text == "boom":
      raise ZeroDivisionError("verifier bug")
    if text == "hang":
      time.sleep(30)
    return float(text == "ok"), 1.0


def test_raising_and_hanging_verifiers_become_missing_rewards():
  texts = ["ok", "boom", "hang", "no"]
  tic = time.perf_counter()
  correct, fmt, failures = rl.rewards_for(_FlakyTask(), [{}, {}], texts, 2, timeout_s=0.2)
  assert time.perf_counter() - tic < 5  # the hang was cut at 0.2 s
  np.testing.assert_array_equal(correct, [1.0, np.nan, np.nan, 0.0])
  np.testing.assert_array_equal(fmt, [1.0, np.nan, np.nan, 1.0])
  assert failures == rl.RewardFailures(errors=1, timeouts=1) and failures.total == 2


def test_ppo_mini_batches_partition_rows_with_their_own_normalizers():
  rows = 8
  mask = np.zeros((rows, 5), bool)
  for i in range(rows):
    mask[i, :i % 5 + 1] = True  # 1..5 tokens per row
  batch = {"completion_mask": mask, "adv": np.arange(rows, dtype=np.float32)}
  parts = rl.ppo_mini_batches(batch, 4, np.random.default_rng(0))
  assert len(parts) == 4
  seen = np.sort(np.concatenate([np.asarray(p["adv"]) for p in parts]))
  np.testing.assert_array_equal(seen, np.arange(rows))  # every rollout exactly once
  for part in parts:
    assert part["adv"].shape == (2,)
    assert float(part["num_tokens"]) == part["completion_mask"].sum()
    assert float(part["num_sequences"]) == 2
  # One mini-batch is the whole batch in its original order.
  (whole,) = rl.ppo_mini_batches(batch, 1, np.random.default_rng(0))
  np.testing.assert_array_equal(whole["adv"], batch["adv"])
  with pytest.raises(ValueError, match="ppo_mini_batches=3"):
    rl.ppo_mini_batches(batch, 3, np.random.default_rng(0))


def test_mean_update_metrics_keeps_counters():
  updates = [{"loss": 1.0, "skipped": 0.0, "nonfinite_streak": 0.0},
             {"loss": 3.0, "skipped": 1.0, "nonfinite_streak": 1.0}]
  assert rl.mean_update_metrics(updates) == {"loss": 2.0, "skipped": 1.0,
                                             "nonfinite_streak": 1.0, "num_updates": 2.0}


def test_truncated_last_metrics_line_is_skipped_and_resume_drops_it(tmp_path):
  writer = MetricWriter(tmp_path, tensorboard=False)
  for step in (1, 2, 3):
    writer.write(step, {"loss": float(step)})
  writer.close()
  with open(tmp_path / "metrics.jsonl", "a") as f:
    f.write(json.dumps({"step": 4, "loss": 4.0})[:9])  # killed mid-write
  assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3]
  writer = MetricWriter(tmp_path, resume_step=2, tensorboard=False)
  writer.write(3, {"loss": 30.0})
  writer.close()
  assert [(r["step"], r["loss"]) for r in read_metrics(tmp_path)] == [(1, 1.0), (2, 2.0),
                                                                      (3, 30.0)]
  (tmp_path / "metrics.jsonl").write_text('{"step": 1}\nnot json\n{"step": 2}\n')
  with pytest.raises(ValueError, match="line 2 is not JSON"):
    read_metrics(tmp_path)
