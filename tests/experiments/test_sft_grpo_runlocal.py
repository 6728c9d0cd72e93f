"""The quickstart (SFT → GRPO → plot) in runlocal mode, and an exact GRPO resume after SIGKILL."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from jaxrl_post.training.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, XLA_FLAGS="")


def _command(binary, config, workdir, *extra):
  return [sys.executable, str(ROOT / "experiments" / binary),
          f"--config={ROOT / 'configs' / config}", f"--workdir={workdir}", *extra]


def _run(*args):
  result = subprocess.run(_command(*args), capture_output=True, text=True, env=ENV, timeout=600,
                          check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  return result


def _finished_checkpoints(workdir):
  root = workdir / "checkpoints"
  return sorted(int(p.name) for p in root.iterdir() if p.name.isdigit()) if root.is_dir() else []


def test_quickstart_then_grpo_resumes_exactly_after_sigkill(tmp_path, format_writer_policy):
  result = subprocess.run([sys.executable, str(ROOT / "experiments" / "quickstart.py"),
                           "--runlocal", f"--workdir={tmp_path}"], capture_output=True,
                          text=True, env=ENV, timeout=900, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "held-out greedy accuracy during SFT" in result.stdout
  assert "held-out sample accuracy (T = 1, 2 per prompt" in result.stdout
  assert "points, paired over 4 prompts" in result.stdout
  assert (tmp_path / "quickstart.png").stat().st_size > 0
  sft, grpo = tmp_path / "sft", tmp_path / "grpo"
  assert _finished_checkpoints(sft) == [3, 6]
  assert any("eval/accuracy" in r for r in read_metrics(sft))
  full = [r for r in read_metrics(grpo) if "train/loss" in r]
  assert [r["step"] for r in full] == [1, 2, 3, 4]
  assert all(r["train/num_updates"] == 2 for r in full)  # ppo_mini_batches=2 in runlocal
  assert all("rollout/logp_abs_diff_max" in r and r["rollout/logp_abs_diff_max"] < 1e-4
             for r in full)

  # A 6-step run, SIGKILLed (no handler runs) once step 3 is logged after
  # checkpoint 2 finished, then the same command again: its steps 1-4 equal an
  # uninterrupted 4-step run (the learning-rate schedule does not depend on
  # `steps`). Both start from a policy that earns the format reward now and then
  # (conftest.py): the runlocal SFT never does in 12 tokens, and a comparison of
  # all-zero losses and gradients would pass whatever the resume did.
  args = ("grpo.py", "grpo_arith.py:runlocal")
  # 4 prompts per step (runlocal: 2), so that some groups see a reward whatever the draws.
  init = (f"--config.init_from={format_writer_policy}", "--config.prompts_per_step=4")
  _run(*args, tmp_path / "grpo_uninterrupted", *init, "--config.steps=4")
  full = [r for r in read_metrics(tmp_path / "grpo_uninterrupted") if "train/loss" in r]
  assert max(r["train/grad_norm"] for r in full) > 1e-2
  assert max(abs(r["train/loss"]) for r in full) > 1e-3
  extra = (*init, "--config.steps=6")
  resumed = tmp_path / "grpo_killed"
  process = subprocess.Popen(_command(*args, resumed, *extra), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, env=ENV)
  deadline = time.time() + 300
  while time.time() < deadline and process.poll() is None:
    steps = [r["step"] for r in read_metrics(resumed) if "train/loss" in r]
    if steps and steps[-1] >= 3 and _finished_checkpoints(resumed):
      break
    time.sleep(0.02)
  process.send_signal(signal.SIGKILL)
  assert process.wait(timeout=60) == -signal.SIGKILL, "the run ended before it could be killed"
  assert _finished_checkpoints(resumed)[-1] < 6
  _run(*args, resumed, *extra)
  again = [r for r in read_metrics(resumed) if "train/loss" in r]
  assert [r["step"] for r in again] == [1, 2, 3, 4, 5, 6]
  for a, b in zip(full, again):
    for key in ("train/loss", "train/reward_format", "train/grad_norm"):
      assert abs(a[key] - b[key]) < 1e-5, (key, a, b)
