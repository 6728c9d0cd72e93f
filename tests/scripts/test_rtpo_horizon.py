"""scripts/rtpo_horizon.py: the grid's command lines, and the table and plot of finished runs."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load():
  # Loaded once: the script defines absl flags, which cannot be defined twice.
  path = ROOT / "scripts" / "rtpo_horizon.py"
  spec = importlib.util.spec_from_file_location("rtpo_horizon", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


SCRIPT = _load()


def test_commands_put_sft_first_and_start_the_methods_from_it(tmp_path):
  grid = SCRIPT.commands("configs/rtpo_kv.py", tmp_path, ["2", "4"], ["0"],
                            ["flat_grpo", "rtpo"], "--config.steps=3")
  assert len(grid) == 2 * 3
  sft, flat, rtpo = grid[:3]
  assert sft[-2:] == [f"--workdir={tmp_path}/k2/s0/sft", "--config.steps=3"]
  assert "--config=configs/rtpo_kv.py:method=rtpo,horizon=2,seed=0" in rtpo
  assert f"--config.init_from={tmp_path}/k2/s0/sft" in flat and not any(
    "init_from" in arg for arg in sft)


def test_summarize_tabulates_mean_and_std_over_seeds(tmp_path):
  def write(k, seed, method, success, tokens=1000):
    workdir = tmp_path / f"k{k}" / f"s{seed}" / method
    workdir.mkdir(parents=True)
    lines = [{"step": 0, "eval/success": 0.0, "budget/generated_tokens": 0},
             {"step": 5, "time/wall": 120.0, "budget/step_tokens": tokens},
             {"step": 5, "eval/success": success, "budget/generated_tokens": tokens}]
    (workdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))

  for seed, (a, b) in enumerate([(0.5, 0.25), (0.75, 0.25)]):
    write(2, seed, "sft", 0.1)
    write(2, seed, "rtpo", a)
    write(2, seed, "flat_grpo", b)
  table = SCRIPT.summarize(tmp_path)
  header, _, row = table.splitlines()
  assert header == "| K | sft | flat_grpo | rtpo |"
  assert row.startswith("| 2 | 0.100 ± 0.000 (n=2) | 0.250 ± 0.000 (n=2), 1k tok, 2 min |")
  assert "0.625 ± 0.125 (n=2)" in row
  assert (tmp_path / "success_vs_horizon.png").stat().st_size > 0
  with pytest.raises(ValueError, match="no finished runs"):
    SCRIPT.summarize(tmp_path / "empty")
