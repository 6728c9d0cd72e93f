"""scripts/multiturn_table.py and scripts/multiturn_grid.sh: the paired table on hand-written
runs, and the grid's commands (dry run) against the config."""

import json
import os
import shlex
import subprocess
from pathlib import Path

import numpy as np
import pytest

from jaxrl_post import script_flags
from jaxrl_post.config_args import load_module
from jaxrl_post.training import grid_report
from jaxrl_post.training.metrics import write_eval_outcomes

ROOT = Path(__file__).resolve().parents[2]


SCRIPT = load_module(ROOT / "scripts" / "multiturn_table.py")
START = [0, 0, 1, 1]  # the cold start's per-episode success (sampled and greedy)


def _run(root, arm, seed, sampled, greedy, steps=2, minutes=3.0, extra=()):
  run = root / "runs" / arm / f"seed{seed}"
  run.mkdir(parents=True)
  records = [{"step": 0, "eval/sampled_success": float(np.mean(START))}]
  records += [{"step": k, "budget/step_tokens": 100, "budget/generated_tokens": 100 * k,
               **dict(extra)} for k in range(1, steps + 1)]
  records += [{"step": steps, "eval/sampled_success": float(np.mean(sampled))}]
  (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
  (run / "DONE").write_text(str(60 * minutes))
  write_eval_outcomes(run, 0, greedy_success=START, sampled_success=START)
  write_eval_outcomes(run, steps, greedy_success=greedy, sampled_success=sampled)


def test_sampled_curve_over_steps_or_generated_tokens(tmp_path):
  # Seeds stopped after 2 and 3 steps, 100 tokens a step: step 0 (both evaluated) and the
  # seeds' last evaluations (1.0 at step 2, 0.5 at step 3) at the mean of their steps / tokens.
  _run(tmp_path, "a", 0, [1, 1, 1, 1], START, steps=2)
  _run(tmp_path, "a", 1, [1, 1, 0, 0], START, steps=3)
  seeds = grid_report.collect_runs(tmp_path)["a"]
  assert SCRIPT.sampled_curve(seeds) == ([0.0, 2.5], [0.5, 0.75])
  assert SCRIPT.sampled_curve(seeds, "tokens") == ([0.0, 250.0], [0.5, 0.75])


def test_table_pairs_arms_with_the_baseline(tmp_path):
  # Baseline: seed 0 solves one more episode (+25), seed 1 nothing more.
  _run(tmp_path, "turn_grpo", 0, [1, 0, 1, 1], [1, 0, 1, 1])
  _run(tmp_path, "turn_grpo", 1, [0, 0, 1, 1], [0, 0, 1, 1])
  # The method: all four in both seeds (sampled), greedy as the baseline; a diagnostic 0.5.
  for seed in (0, 1):
    _run(tmp_path, "temporal_grpo", seed, [1, 1, 1, 1], [0, 0, 1, 1], steps=3,
         extra={"stage/participation": 0.5})
  rows = grid_report.collect_runs(tmp_path)
  text = SCRIPT.table(rows, "turn_grpo", ["stage/participation"])
  line = next(x for x in text.splitlines() if x.startswith("| temporal_grpo | 2 |"))
  cells = [c.strip() for c in line.strip("|").split("|")]
  assert cells[2] == "0.500 ± 0.000 → 1.000 ± 0.000"
  assert cells[3] == "0.500 ± 0.000 → 0.500 ± 0.000"
  assert cells[4] == "+50.0 ± 0.0 (28.9 ± 0.0)"  # 2 of 4 episodes gained: SE std([0,0,1,1])/2
  assert cells[5] == "3.0 ± 0.0" and cells[6] == "300 ± 0" and cells[8] == "0.500 ± 0.000"
  base = next(x for x in text.splitlines() if x.startswith("| turn_grpo | 2 |"))
  assert [c.strip() for c in base.strip("|").split("|")][8] == "—"  # never logged
  vs = next(x for x in text.splitlines() if x.startswith("| temporal_grpo | +"))
  cells = [c.strip() for c in vs.strip("|").split("|")]
  assert cells[1:6] == ["+25.0 / +50.0", "+37.5 ± 17.7", "2/2", "-25.0 / +0.0", "-12.5 ± 17.7"]
  with pytest.raises(ValueError, match="--baseline='grpo'"):
    SCRIPT.table(rows, "grpo")
  out, png = tmp_path / "table.md", tmp_path / "plot.png"
  SCRIPT.main(script_flags.parse(SCRIPT.FLAGS, [
    "x", f"--root={tmp_path}", "--baseline=turn_grpo", "--metrics=stage/participation",
    f"--out={out}", f"--plot={png}"]))
  assert out.read_text() == text and png.stat().st_size > 0


def test_grid_commands_build_valid_configs(tmp_path):
  env = dict(os.environ, DRY_RUN="1", SEEDS="0 1", CONFIG="configs/temporal_grpo.py",
             ARMS="turn_grpo stage_reward temporal_grpo")
  out = subprocess.run(["bash", str(ROOT / "scripts" / "multiturn_grid.sh"), str(tmp_path)],
                       capture_output=True, text=True, env=env, check=True, timeout=60).stdout
  commands = [shlex.split(line[len("+ "):]) for line in out.splitlines() if line.startswith("+ ")]
  assert len(commands) == 1 + 3 * 2
  config_module = load_module(ROOT / "configs" / "temporal_grpo.py", "temporal_grpo_config")
  methods = []
  for command in commands:
    args = dict(a[2:].split("=", 1) for a in command if a.startswith("--") and "=" in a)
    config = config_module.get_config(args["config"].split(":", 1)[1])
    methods.append(config.method)
    if config.method != "sft":
      assert args["config.init_from"] == f"{tmp_path}/sft"
      assert args["workdir"] == f"{tmp_path}/runs/{config.method}/seed{config.seed}"
    else:
      assert args["config.steps"] == "400"
  assert methods[0] == "sft" and sorted(methods[1:]) == sorted(
    ["turn_grpo", "stage_reward", "temporal_grpo"] * 2)


def test_grid_arms_with_config_words_run_under_their_label(tmp_path):
  env = dict(os.environ, DRY_RUN="1", SEEDS="1", CONFIG="configs/canopy.py",
             ARMS="turn_grpo no_kl:ablation=no_kl", VARIANT="budget=1000")
  out = subprocess.run(["bash", str(ROOT / "scripts" / "multiturn_grid.sh"), str(tmp_path)],
                       capture_output=True, text=True, env=env, check=True, timeout=60).stdout
  commands = [shlex.split(line[len("+ "):]) for line in out.splitlines() if line.startswith("+ ")]
  config_module = load_module(ROOT / "configs" / "canopy.py", "canopy_config")
  runs = {}
  for command in commands[1:]:
    args = dict(a[2:].split("=", 1) for a in command if a.startswith("--") and "=" in a)
    runs[args["workdir"]] = config_module.get_config(args["config"].split(":", 1)[1])
  host, no_kl = runs[f"{tmp_path}/runs/turn_grpo/seed1"], runs[f"{tmp_path}/runs/no_kl/seed1"]
  assert host.method == "turn_grpo" and host.loss.beta == 1e-4 and host.seed == 1
  assert no_kl.method == "canopy" and no_kl.loss.beta == 0.0 and no_kl.seed == 1
  assert len(runs) == 2
