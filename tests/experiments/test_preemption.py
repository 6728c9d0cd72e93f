"""SIGTERM during training: the step in flight finishes, is checkpointed, and a rerun resumes."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from jaxrl_post.training.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[2]


def test_sigterm_checkpoints_and_the_same_command_resumes(tmp_path):
  workdir = tmp_path / "sft"
  # Many steps and no periodic checkpoint: only the SIGTERM save can exist.
  cmd = [sys.executable, str(ROOT / "experiments" / "sft.py"),
         f"--config={ROOT / 'configs' / 'sft_arith.py'}:runlocal", f"--workdir={workdir}",
         "--config.steps=400", "--config.checkpoint_every=1000", "--config.eval_every=1000"]
  env = dict(os.environ, XLA_FLAGS="")
  process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=env)
  deadline = time.time() + 300
  while time.time() < deadline and len(read_metrics(workdir)) < 4:
    time.sleep(0.5)
  process.send_signal(signal.SIGTERM)
  stdout, stderr = process.communicate(timeout=300)
  assert process.returncode == 0, stderr[-2000:]
  assert "SIGTERM: stopped after step" in stdout
  saved = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
  assert len(saved) == 1 and 3 <= saved[0] < 400
  stopped = saved[0]

  # The same command resumes at the next step and logs no step twice.
  result = subprocess.run([*cmd[:-3], "--config.steps=" + str(stopped + 2),
                           "--config.checkpoint_every=1000", "--config.eval_every=1000"],
                          capture_output=True, text=True, env=env, timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-2000:]
  steps = [r["step"] for r in read_metrics(workdir) if "train/loss" in r]
  assert steps == list(range(1, stopped + 3))
