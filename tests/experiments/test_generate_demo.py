"""The README's first command, shrunk: the demo binary runs end to end."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_generate_demo_runs():
  env = dict(os.environ, XLA_FLAGS="")  # one CPU device, as a user would have
  result = subprocess.run(
    [sys.executable, str(ROOT / "experiments" / "generate_demo.py"), "--model=tiny",
     "--max_new_tokens=6", "--batch=2", "--prompt=3+4="],
    capture_output=True, text=True, env=env, timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-2000:]
  assert "completion:" in result.stdout and "tokens/s" in result.stdout
