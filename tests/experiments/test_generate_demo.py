"""experiments/generate_demo.py, shrunk: a model, `Sampler.generate`, the decoded text, tokens/s."""

import ast
import os
import re
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
  lines = result.stdout.splitlines()
  assert lines[0] == "prompt:     '3+4='"
  completion = re.fullmatch(r"completion: (['\"].*['\"]) \(finished by (eos|length|stop)\)",
                            lines[1])
  assert completion, lines[1]
  # A character tokenizer: at most one character a generated token (EOS prints nothing).
  assert len(ast.literal_eval(completion.group(1))) <= 6
  speed = re.fullmatch(r"[\d,]+ tokens/s \((\d+) tokens generated over 2 rows of at most 6 .*",
                       lines[2])
  assert speed and 2 <= int(speed.group(1)) <= 2 * 6, lines[2]
