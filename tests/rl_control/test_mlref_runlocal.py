"""experiments/mlref.py runlocal runs end to end and writes the fitness JSONL."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run_mlref(config: str, workdir: Path, timeout: int = 300) -> list[dict]:
  """Runs experiments/mlref.py on `configs/<config>`; returns the fitness.jsonl records."""
  env = dict(os.environ, XLA_FLAGS="")  # One CPU device, as a user would have.
  result = subprocess.run(
      [sys.executable, str(ROOT / "experiments/mlref.py"),
       f"--config={ROOT / 'configs' / config}", f"--workdir={workdir}"],
      capture_output=True, text=True, env=env, timeout=timeout, check=False, cwd=ROOT)
  assert result.returncode == 0, result.stderr[-3000:]
  return [json.loads(x) for x in (workdir / "fitness.jsonl").read_text().splitlines()]


def test_mlref_runlocal(tmp_path):
  lines = _run_mlref("mlref_gymnax.py:runlocal", tmp_path)
  assert [(r["method"], r["iteration"]) for r in lines] == [("mlref", 1), ("mlref", 2)]
  assert all(r["best_so_far"] is not None and r["best_so_far"] > 0 for r in lines)
  assert (tmp_path / "mlref" / "p0" / "module_pool.json").exists()
  summary = json.loads((tmp_path / "summary.json").read_text())
  assert set(summary["mlref"]) == {"1", "2"}
  cands = (tmp_path / "candidates.jsonl").read_text().splitlines()
  assert len(cands) == 2 and len(json.loads(cands[0])["performance"]) == 4


@pytest.mark.slow
def test_mlref_runlocal_brax(tmp_path):
  # Reacher, 50-step episodes: two candidate rewards, each one XLA compile of PPO + brax.
  lines = _run_mlref("mlref_brax.py:runlocal", tmp_path, timeout=900)
  assert [(r["method"], r["iteration"]) for r in lines] == [("mlref", 1), ("mlref", 2)]
  # Fitness is the reacher's own return: negative (distance and control costs), finite.
  assert all(r["best_so_far"] is not None and -200 < r["best_so_far"] < 0 for r in lines)
  cands = [json.loads(x) for x in (tmp_path / "candidates.jsonl").read_text().splitlines()]
  assert len(cands) == 2 and len(cands[0]["performance"]) == 4
