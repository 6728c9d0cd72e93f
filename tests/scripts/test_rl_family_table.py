"""scripts/rl_family_table.py and scripts/rl_family_grid.sh: the table's arithmetic on
hand-written runs, and every row's command (dry run) builds a valid config."""

import json
import os
import shlex
import subprocess
from pathlib import Path

import numpy as np

from jaxrl_post import script_flags
from jaxrl_post.config_args import load_module
from jaxrl_post.training.metrics import write_eval_outcomes

ROOT = Path(__file__).resolve().parents[2]


SCRIPT = load_module(ROOT / "scripts" / "rl_family_table.py")


def _run(root, name, seed, last, curve, extra=(), minutes=2.0):
  run = root / "runs" / name / f"seed{seed}"
  run.mkdir(parents=True)
  records = [{"step": s, "eval/accuracy": v} for s, v in curve] + list(extra)
  (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
  (run / "DONE").write_text(str(60 * minutes))
  write_eval_outcomes(run, 0, greedy_correct=np.zeros(4))
  write_eval_outcomes(run, 10, greedy_correct=np.asarray(last, np.float64))


def test_table_pairs_auc_and_steps_to_the_baseline_peak(tmp_path):
  for seed in (0, 1):
    _run(tmp_path, "grpo", seed, [1, 0, 0, 1], [(0, 0.2), (5, 0.5), (10, 0.4)])
    # Reaches GRPO's best (0.5) at step 5 in seed 0 and never in seed 1.
    _run(tmp_path, "trajval", seed, [1, 1, 0, 1] if seed == 0 else [1, 0, 0, 1],
         [(0, 0.2), (5, 0.5 if seed == 0 else 0.3), (10, 0.45)],
         extra=[{"step": 1, "prior/learnable_fraction": 0.25}])
  text = SCRIPT.table(grid_rows := SCRIPT.grid_report.collect_runs(tmp_path))
  row = next(line for line in text.splitlines() if line.startswith("| trajval |"))
  cells = [c.strip() for c in row.strip("|").split("|")]
  assert cells[1] == "2" and cells[2] == "0.625 ± 0.177"
  assert cells[3] == "+12.5 ± 17.7 (1/2)"  # +25 and +0 points over GRPO, paired
  assert cells[4] == "0.425 ± 0.071"  # AUC: 0.475 = mean(0.5, 0.45) and 0.375 = mean(0.3, 0.45)
  assert cells[5] == "5.0 (1 never)"
  assert cells[8] == "0.250 ± 0.000"  # learnable fraction, one value per seed
  question = next(line for line in text.splitlines() if line.startswith("| TrajVal"))
  assert [c.strip() for c in question.strip("|").split("|")][1:4] == [
    "+25.0 / +0.0", "+12.5 ± 17.7", "1/2"]
  assert "Headroom-Drift" not in text  # questions whose rows did not run are left out
  SCRIPT.plots(grid_rows, tmp_path / "plots")
  assert (tmp_path / "plots" / "rl_family_accuracy.png").stat().st_size > 0
  out = tmp_path / "table.md"
  SCRIPT.main(script_flags.parse(SCRIPT.FLAGS, ["x", f"--root={tmp_path}", f"--out={out}"]))
  assert out.read_text() == text


def test_grid_rows_are_valid_configs(tmp_path):
  env = dict(os.environ, DRY_RUN="1", SEEDS="0 1", STUDENT="/student")
  out = subprocess.run(["bash", str(ROOT / "scripts" / "rl_family_grid.sh"), str(tmp_path)],
                       capture_output=True, text=True, env=env, check=True, timeout=60).stdout
  commands = [shlex.split(line[len("+ "):]) for line in out.splitlines() if line.startswith("+ ")]
  assert len(commands) == 22 * 2, out  # 21 rows + the probe, per seed
  for command in commands:
    flags = dict(a[2:].split("=", 1) for a in command if a.startswith("--") and "=" in a)
    path, _, arg = flags["config"].partition(":")
    config = load_module(ROOT / path).get_config(arg or None)
    for key, value in flags.items():  # the command's --config.* overrides, as strings
      if key.startswith("config."):
        *parents, last = key[len("config."):].split(".")
        node = config
        for parent in parents:
          node = node[parent]
        node[last] = type(node[last])(value)
    assert config.init_from == "/student"
    arith = any(name in flags["config"] for name in ("wmrl", "care", "rail"))
    assert config.task == ("arith" if arith else "mixture")
    if "cd_rft" in flags["config"]:  # the rows' γ, from the row name
      assert config.control.gamma in (0.0, 0.01, 0.1)
    if "rail" in flags["config"]:
      assert config.intervention.mode in ("rail", "heuristic", "none")
    replay = config.get("replay")
    replayed = replay.budget if replay is not None and replay.name != "none" else 0
    rows = (config.prompts_per_step + replayed) * config.group_size
    assert rows % (config.ppo_mini_batches * config.num_micro_batches) == 0


def test_retention_rows_report_the_change_of_each_domain(tmp_path):
  def run(name, seed, arith, countdown):
    out = tmp_path / "runs" / name / f"seed{seed}"
    out.mkdir(parents=True)
    (out / "metrics.jsonl").write_text(json.dumps({"step": 0, "eval/accuracy": 0.5}) + "\n")
    (out / "DONE").write_text("60")
    for step, (a, c) in enumerate(zip(arith, countdown)):
      write_eval_outcomes(out, 12 * step, greedy_correct=np.asarray(a, np.float64),
                          **{"greedy_correct/countdown": np.asarray(c, np.float64),
                             "greedy_correct/format": np.ones(2)})

  for seed in (0, 1):
    run("retain_grpo", seed, ([0, 0], [1, 0]), ([1, 1], [0, 1]))  # +50 arith, −50 countdown
    run("retain_gcpo", seed, ([0, 0], [1, 0]), ([1, 1], [1, 1]))  # +50 arith, kept countdown
  text = SCRIPT.table(SCRIPT.grid_report.collect_runs(tmp_path))
  row = next(line for line in text.splitlines() if line.startswith("| retain_gcpo |"))
  cells = [c.strip() for c in row.strip("|").split("|")]
  assert cells[3:6] == ["+50.0 ± 0.0", "+0.0 ± 0.0", "+0.0 ± 0.0"]
  question = next(line for line in text.splitlines() if line.startswith("| GCPO vs GRPO"))
  cells = [c.strip() for c in question.strip("|").split("|")]
  assert cells[1:3] == ["+0.0 / +0.0; +0.0 ± 0.0", "+50.0 / +50.0; +50.0 ± 0.0"]


def test_reward_side_rows_get_their_own_table():
  import tempfile

  with tempfile.TemporaryDirectory() as tmp:
    root = Path(tmp)
    for seed in (0, 1):
      _run(root, "wmrl_env", seed, [1, 0, 0, 1], [(0, 0.5), (16, 0.5)],
           extra=[{"step": 1, "wmrl/env_rows": 128.0}])
      _run(root, "wmrl", seed, [1, 1, 0, 1], [(0, 0.5), (16, 0.75)],
           extra=[{"step": 1, "wmrl/env_rows": 16.0}, {"step": 2, "wmrl/env_rows": 32.0}])
    text = SCRIPT.table(SCRIPT.grid_report.collect_runs(root))
  assert "| grpo |" not in text and "Reward side" in text
  row = next(line for line in text.splitlines() if line.startswith("| wmrl |"))
  cells = [c.strip() for c in row.strip("|").split("|")]
  assert cells[2:5] == ["0.750 ± 0.000", "+75.0 ± 0.0", "24.000 ± 0.000"]
  question = next(line for line in text.splitlines() if line.startswith("| WMRL vs GRPO"))
  assert [c.strip() for c in question.strip("|").split("|")][1:4] == [
    "+25.0 / +25.0", "+25.0 ± 0.0", "2/2"]


def test_rail_and_cd_rft_rows_get_their_own_tables(tmp_path):
  for seed in (0, 1):
    _run(tmp_path, "rail_none", seed, [1, 0, 0, 1], [(0, 0.5), (20, 0.5)])
    _run(tmp_path, "rail", seed, [1, 1, 0, 1], [(0, 0.5), (20, 0.75)],
         extra=[{"step": 1, "rail/extra_tokens": 100.0}, {"step": 2, "rail/extra_tokens": 300.0}])
    _run(tmp_path, "cd_rft_g0", seed, [0, 0, 0, 1], [(0, 0.5), (20, 0.25)])
    _run(tmp_path, "cd_rft", seed, [0, 0, 1, 1], [(0, 0.5), (20, 0.5)],
         extra=[{"step": 1, "train/cd_rft_scb": 0.5}])
  text = SCRIPT.table(SCRIPT.grid_report.collect_runs(tmp_path))
  assert "Rollout interventions" in text and "Shared control" in text
  row = next(line for line in text.splitlines() if line.startswith("| rail |"))
  cells = [c.strip() for c in row.strip("|").split("|")]
  assert cells[2] == "0.750 ± 0.000" and cells[5] == "200.000 ± 0.000"  # mean extra tokens
  question = next(line for line in text.splitlines() if line.startswith("| RAIL vs GRPO"))
  assert [c.strip() for c in question.strip("|").split("|")][1:4] == [
    "+25.0 / +25.0", "+25.0 ± 0.0", "2/2"]
  question = next(line for line in text.splitlines() if line.startswith("| CD-RFT γ = 0.01"))
  assert [c.strip() for c in question.strip("|").split("|")][1:3] == [
    "+25.0 / +25.0", "+25.0 ± 0.0"]
  assert "scaled penalty" not in text  # its row did not run
  assert text.startswith("Rollout interventions")  # no empty main table above the groups
  # One plot per group that ran, none for the empty main rows.
  SCRIPT.plots(SCRIPT.grid_report.collect_runs(tmp_path), tmp_path / "plots")
  assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == [
    "rl_family_cd_rft.png", "rl_family_rail.png"]
