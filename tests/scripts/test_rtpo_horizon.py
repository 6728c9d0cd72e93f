"""scripts/rtpo_horizon.py: the grid's command lines, and the table and plot of finished runs."""

import json
from pathlib import Path

import pytest

from jaxrl_post.config_args import load_module

ROOT = Path(__file__).resolve().parents[2]


def _load():
  # Loaded once: the script defines absl flags, which cannot be defined twice.
  path = ROOT / "scripts" / "rtpo_horizon.py"
  return load_module(path, "rtpo_horizon")


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


def test_shared_cold_start_skips_sft_and_fills_in_the_seed(tmp_path):
  grid = SCRIPT.commands("configs/rtpo_kv.py", tmp_path, ["2", "8"], ["0", "1"], ["rtpo"], "",
                         init_from="/ckpt/s{seed}/sft")
  assert len(grid) == 2 * 2
  assert not any("method=sft" in arg for command in grid for arg in command)
  assert "--config.init_from=/ckpt/s1/sft" in grid[1]
  assert f"--workdir={tmp_path}/k8/s1/rtpo" in grid[3]


def test_off_policy_variant_runs_rtpo_with_its_flag_in_its_own_workdir(tmp_path):
  (command,) = SCRIPT.commands("configs/rtpo_kv.py", tmp_path, ["6"], ["2"], ["rtpo_offpolicy"],
                               "", init_from="/ckpt")
  assert "--config=configs/rtpo_kv.py:method=rtpo,horizon=6,seed=2" in command
  assert f"--workdir={tmp_path}/k6/s2/rtpo_offpolicy" in command
  assert "--config.continuation=off_policy" in command


def test_summarize_tabulates_mean_and_std_over_seeds(tmp_path):
  def write(k, seed, method, success, tokens=1000, sampled=None, start=0.0):
    workdir = tmp_path / f"k{k}" / f"s{seed}" / method
    workdir.mkdir(parents=True)
    lines = [{"step": 0, "eval/success": start, "eval/sampled_success": start / 2,
              "budget/generated_tokens": 0},
             {"step": 5, "time/wall": 120.0, "budget/step_tokens": tokens,
              "train/consistency_ratio": 0.5 + 0.1 * seed},
             {"step": 5, "eval/success": success, "budget/generated_tokens": tokens,
              "eval/sampled_success": success if sampled is None else sampled}]
    (workdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))

  for seed, (a, b) in enumerate([(0.5, 0.25), (0.75, 0.25)]):
    write(2, seed, "sft", 0.1)
    write(2, seed, "rtpo", a, start=0.2)
    write(2, seed, "flat_grpo", b, start=0.2)
  tables = SCRIPT.summarize(tmp_path).split("\n\n")
  greedy = tables[1].splitlines()
  assert greedy[0] == "| K | start | sft | flat_grpo | rtpo |"
  assert greedy[2] == ("| 2 | 0.200 ± 0.000 | 0.100 ± 0.000 (n=2) | 0.250 ± 0.000 (n=2) "
                       "| 0.625 ± 0.125 (n=2) |")
  sampled = tables[3].splitlines()
  assert sampled[2] == "| 2 | 0.100 ± 0.000 | 0.250 ± 0.000 | 0.625 ± 0.125 |"
  cost = tables[5].splitlines()
  assert cost[2] == "| 2 | 1k tok, 2.0 min, ratio 0.550 | 1k tok, 2.0 min, ratio 0.550 |"
  gain = tables[7].splitlines()
  # Start (sampled) 0.1: (0.625 − 0.25) / 0.1 and 0.625 / 0.25 − 1.
  assert gain[0] == "| K | vs flat_grpo |" and gain[2] == "| 2 | +375.0 % / +150.0 % |"
  assert (tmp_path / "success_vs_horizon.png").stat().st_size > 0
  with pytest.raises(ValueError, match="no finished runs"):
    SCRIPT.summarize(tmp_path / "empty")
