"""experiments/mlref.py runlocal runs end to end and writes the fitness JSONL."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_mlref_runlocal(tmp_path):
  env = dict(os.environ, XLA_FLAGS="")  # One CPU device, as a user would have.
  result = subprocess.run(
      [sys.executable, str(ROOT / "experiments/mlref.py"),
       f"--config={ROOT / 'configs/mlref_gymnax.py'}:runlocal", f"--workdir={tmp_path}"],
      capture_output=True, text=True, env=env, timeout=300, check=False, cwd=ROOT)
  assert result.returncode == 0, result.stderr[-3000:]
  lines = [json.loads(x) for x in (tmp_path / "fitness.jsonl").read_text().splitlines()]
  assert [(r["method"], r["iteration"]) for r in lines] == [("mlref", 1), ("mlref", 2)]
  assert all(r["best_so_far"] is not None and r["best_so_far"] > 0 for r in lines)
  assert (tmp_path / "mlref" / "p0" / "module_pool.json").exists()
  summary = json.loads((tmp_path / "summary.json").read_text())
  assert set(summary["mlref"]) == {"1", "2"}
  cands = (tmp_path / "candidates.jsonl").read_text().splitlines()
  assert len(cands) == 2 and len(json.loads(cands[0])["performance"]) == 4
