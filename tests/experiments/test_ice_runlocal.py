"""experiments/ice.py in runlocal mode: a run finishes with finite `ice/*` metrics and a
distillation term that trains the policy, and a rerun with more steps resumes exactly.

The tiny policy starts from scratch, so it is never correct and every advantage is 0; the filter
reads the format reward with threshold 0 (`ice.filter_reward=format`, `ice.correct_reward=0`, the
paper's unfiltered ablation), so every conditioned row is distilled and the update is
β_S · KL alone: `train/loss` = 0.1 · `ice/kl` > 0 with a non-zero gradient. (A random policy's
next-token distribution depends on the instruction line; the format-writer policy of
tests/experiments/conftest.py is nearly a bigram model whose KL is ≈ 1e-6.) The correctness
filter and the loss's values are checked in tests/methods/test_ice.py. Measured on 2 cores
shared with a background job (load ≈ 6): ≈ 30 s with a warm compilation cache, ≈ 55 s cold.
"""

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

from jaxrl_post.training.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "ice.py"


def _run(arg, workdir, *extra):
  command = [sys.executable, str(ROOT / "experiments" / "ice.py"), f"--config={CONFIG}:{arg}",
             f"--workdir={workdir}", *extra]
  result = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  return result


def _train(workdir):
  return [r for r in read_metrics(workdir) if "train/loss" in r]


def test_ice_runlocal_and_resume_with_more_steps(tmp_path):
  run = tmp_path / "ice"
  flags = ("--config.ice.filter_reward=format", "--config.ice.correct_reward=0")
  _run("runlocal", run, *flags)
  train = _train(run)
  assert [r["step"] for r in train] == [1, 2, 3]
  for r in train:
    for key, value in r.items():
      assert isinstance(value, (int, float)) and math.isfinite(value), (r["step"], key, value)
    # 2 prompts × 4 rows, contexts 0..3 once per group: 6 of 8 rows distilled.
    assert r["ice/distilled_frac"] == 0.75 and r["ice/kept_tokens"] > 0
    # Bare rows are never distilled, even with threshold 0.
    assert r["ice/kept_tokens"] < 8 * r["rollout/completion_length_mean"]
    assert r["ice/kl"] > 1e-4 and r["train/grad_norm"] > 0
    assert abs(r["train/loss"] - 0.1 * r["ice/kl"]) < 1e-6  # no reward: β_S · KL alone
    assert all(f"ice/reward_by_context/{j}" in r for j in range(4))
    assert "ice/reward_with_instruction" in r and "ice/reward_without_instruction" in r
  evals = [r for r in read_metrics(run) if "eval/accuracy" in r]
  assert [r["step"] for r in evals] == [0, 1, 2, 3]
  assert all("eval/accuracy_instruction/3" in r and "eval/accuracy_with_instructions" in r
             for r in evals)

  # Drop checkpoint 3 and rerun with 4 steps: step 3 is redone from checkpoint 2 (train state,
  # data position; contexts from (seed, step)) and matches the first run, then step 4 runs.
  shutil.rmtree(run / "checkpoints" / "3")
  result = _run("runlocal,steps=4", run, *flags)
  assert "start workdir" in result.stderr
  again = _train(run)
  assert [r["step"] for r in again] == [1, 2, 3, 4]
  assert again[:2] == train[:2]  # the history before the checkpoint is kept as it was
  for key in ("train/loss", "train/grad_norm", "ice/kl", "ice/kept_tokens",
              "rollout/completion_length_mean", "ice/reward_by_context/0"):
    assert abs(again[2][key] - train[2][key]) < 1e-6, (key, again[2][key], train[2][key])
  meta = json.loads((run / "checkpoints" / "4" / "extra" / "metadata").read_text())
  assert meta["step"] == 4 and meta["method"]["data"]["next_index"] == 4
