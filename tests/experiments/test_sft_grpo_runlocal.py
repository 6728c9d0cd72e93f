"""The SFT and GRPO binaries in runlocal mode, chained, and an exact resume of GRPO."""

import os
import subprocess
import sys
from pathlib import Path

from jaxrl_post.training.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[2]


def _run(binary, config, workdir, *extra):
  env = dict(os.environ, XLA_FLAGS="")
  result = subprocess.run(
    [sys.executable, str(ROOT / "experiments" / binary), f"--config={ROOT / 'configs' / config}",
     f"--workdir={workdir}", *extra], capture_output=True, text=True, env=env, timeout=600,
    check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  return result


def test_sft_then_grpo_then_resume(tmp_path):
  sft = tmp_path / "sft"
  _run("sft.py", "sft_arith.py:runlocal", sft)
  assert (sft / "checkpoints" / "6").is_dir()
  assert any("eval/accuracy" in r for r in read_metrics(sft))

  grpo = tmp_path / "grpo"
  result = _run("grpo.py", "grpo_arith.py:runlocal", grpo, f"--config.init_from={sft}")
  assert "held-out accuracy" in result.stdout
  full = [r for r in read_metrics(grpo) if "train/loss" in r]
  assert [r["step"] for r in full] == [1, 2, 3, 4]
  assert all("rollout/logp_abs_diff_max" in r and r["rollout/logp_abs_diff_max"] < 1e-4
             for r in full)

  # Interrupted after step 2 (its checkpoint), then the same command again:
  # the resumed run reproduces the uninterrupted metrics of steps 3-4.
  resumed = tmp_path / "grpo_resumed"
  _run("grpo.py", "grpo_arith.py:runlocal", resumed, f"--config.init_from={sft}",
       "--config.steps=2")
  _run("grpo.py", "grpo_arith.py:runlocal", resumed, f"--config.init_from={sft}")
  again = [r for r in read_metrics(resumed) if "train/loss" in r]
  assert [r["step"] for r in again] == [1, 2, 3, 4]
  for a, b in zip(full, again):
    for key in ("train/loss", "train/reward_correct", "train/grad_norm"):
      assert abs(a[key] - b[key]) < 1e-5, (key, a, b)
