"""scripts/opd_family_table.py and scripts/opd_family_grid.sh: the grid's table arithmetic on
hand-written runs, and every row's command (dry run) against the config's validation."""

import json
import os
import shlex
import subprocess
from pathlib import Path

import numpy as np

from jaxrl_post import script_flags
from jaxrl_post.config_args import load_module
from jaxrl_post.methods import opd_family
from jaxrl_post.training.metrics import write_eval_outcomes

ROOT = Path(__file__).resolve().parents[2]


SCRIPT = load_module(ROOT / "scripts" / "opd_family_table.py")


def _run(root: Path, name: str, seed: int, before, after, records, minutes=2.0):
  run = root / "runs" / name / f"seed{seed}"
  run.mkdir(parents=True)
  (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
  (run / "DONE").write_text(str(60 * minutes))
  write_eval_outcomes(run, 0, greedy_correct=np.asarray(before, np.float64))
  write_eval_outcomes(run, 4, greedy_correct=np.asarray(after, np.float64))


def test_table_pairs_gains_and_differences(tmp_path):
  student = [0, 0, 1, 1]
  # GRPO: seed 0 ends at [1, 0, 1, 1] (+25 points), seed 1 at [0, 0, 1, 1] (+0).
  for seed, after in enumerate(([1, 0, 1, 1], [0, 0, 1, 1])):
    _run(tmp_path, "grpo_none", seed, student, after,
         [{"step": 0, "eval/accuracy": 0.5}, {"step": 2, "eval/accuracy": 0.6},
          {"step": 4, "eval/accuracy": float(np.mean(after))}])
  # TV-OPD with the strong teacher: both seeds at [1, 1, 1, 1]; c_k 1.0 → 0.4 and 1.0 → 0.6.
  for seed, c_last in enumerate((0.4, 0.6)):
    _run(tmp_path, "tv_opd_S", seed, student, [1, 1, 1, 1],
         [{"step": 0, "eval/accuracy": 0.5},
          {"step": 1, "distill/tv_coef": 1.0, "distill/adv_abs_mean": 0.5},
          {"step": 4, "distill/tv_coef": c_last, "distill/adv_abs_mean": 0.3},
          {"step": 4, "eval/accuracy": 1.0}], minutes=3.0)
  for seed in (0, 1):  # raw OPD: one prompt short of TV-OPD in both seeds
    _run(tmp_path, "opd_S", seed, student, [1, 1, 1, 0],
         [{"step": 0, "eval/accuracy": 0.5}, {"step": 4, "eval/accuracy": 0.75}])
  (tmp_path / "weak").mkdir()
  (tmp_path / "weak" / "metrics.jsonl").write_text(
    json.dumps({"step": 20, "eval/accuracy": 0.33}) + "\n")

  data = SCRIPT.collect(tmp_path)
  assert set(data["rows"]) == {"grpo_none", "tv_opd_S", "opd_S"}
  assert data["teachers"]["weak"] == 0.33 and np.isnan(data["teachers"]["strong"])
  text = SCRIPT.table(data)
  row = next(line for line in text.splitlines() if line.startswith("| tv_opd |"))
  cells = [c.strip() for c in row.strip("|").split("|")]
  assert cells[1] == "strong" and cells[2] == "2"
  assert cells[3] == "1.000 ± 0.000"
  assert cells[4] == "+50.0 ± 0.0 (28.9 ± 0.0)"  # paired gain 2/4, SE std([0,0,1,1])/2
  assert cells[5] == "+37.5 ± 17.7 (2/2)"  # vs GRPO: +25 and +50 points
  assert cells[7] == "1.000 ± 0.000 → 0.500 ± 0.141"
  assert cells[8] == "0.400 ± 0.000" and cells[9] == "3.0 ± 0.0"
  grpo = next(line for line in text.splitlines() if line.startswith("| grpo |"))
  assert [c.strip() for c in grpo.strip("|").split("|")][6] == "0.600 ± 0.000"  # mid budget
  question = next(line for line in text.splitlines() if line.startswith("| TV-OPD vs raw OPD"))
  assert [c.strip() for c in question.strip("|").split("|")][1:] == [
    "+25.0 / +25.0", "+25.0 ± 0.0", "2/2", "25.0 ± 0.0"]
  assert "OPRD vs OPD" not in text  # a question whose rows did not run is left out
  SCRIPT.plots(data, tmp_path / "plots")
  assert (tmp_path / "plots" / "opd_family_accuracy.png").stat().st_size > 0
  assert (tmp_path / "plots" / "opd_family_tv.png").stat().st_size > 0
  out = tmp_path / "table.md"
  SCRIPT.main(script_flags.parse(SCRIPT.FLAGS, ["x", f"--root={tmp_path}", f"--out={out}"]))
  assert out.read_text() == text


def test_oprd_alignment_lines_and_weak_reference(tmp_path):
  student = [0, 0, 1, 1]
  # Two OPRD seeds: aligned share over steps (0.6, 0.8) → run mean 0.7; (0.5, 0.5) → 0.5.
  for seed, aligned in enumerate(((0.6, 0.8), (0.5, 0.5))):
    _run(tmp_path, "oprd_W", seed, student, [1, 0, 1, 1],
         [{"step": 0, "eval/accuracy": 0.5}]
         + [{"step": k + 1, "oprd/aligned_frac": a, "oprd/cos_abs_mean": 0.2,
             "oprd/rel_correction_mean": 0.1, "oprd/active_frac": 1.0}
            for k, a in enumerate(aligned)]
         + [{"step": 4, "eval/accuracy": 0.75}])
  _run(tmp_path, "opd_W", 0, student, [0, 0, 0, 1],  # no OPRD metrics: no alignment line
       [{"step": 0, "eval/accuracy": 0.5}, {"step": 4, "eval/accuracy": 0.25}])
  (tmp_path / "weak").mkdir()
  (tmp_path / "weak" / "metrics.jsonl").write_text(
    json.dumps({"step": 0, "eval/accuracy": 0.27}) + "\n"
    + json.dumps({"step": 80, "eval/accuracy": 0.41}) + "\n")
  data = SCRIPT.collect(tmp_path)
  assert data["teachers"]["weak"] == 0.41 and data["teachers"]["weak_ref"] == 0.27
  text = SCRIPT.table(data)
  assert "weak teacher 0.410, its pre-RL reference 0.270 (held-out" in text
  lines = SCRIPT.oprd_lines(data["rows"])
  assert len(lines) == 3 and lines[2].startswith("| oprd (weak) | 2 |")
  cells = [c.strip() for c in lines[2].strip("|").split("|")]
  assert cells[2:] == ["0.600 ± 0.141", "0.200 ± 0.000", "0.100 ± 0.000", "1.000 ± 0.000"]
  SCRIPT.plots(data, tmp_path / "plots")
  assert (tmp_path / "plots" / "opd_family_oprd.png").stat().st_size > 0


def test_grid_rows_are_valid_configs(tmp_path):
  env = dict(os.environ, DRY_RUN="1", SEEDS="0 1")
  out = subprocess.run(["bash", str(ROOT / "scripts" / "opd_family_grid.sh"), str(tmp_path)],
                       capture_output=True, text=True, env=env, check=True, timeout=60).stdout
  commands = [shlex.split(line[len("+ "):]) for line in out.splitlines() if line.startswith("+ ")]
  runs = [c for c in commands if "experiments/opd_family.py" in c]
  assert len(runs) == 19 * 2, out
  assert any("experiments/quickstart.py" in c for c in commands)
  config_module = load_module(ROOT / "configs" / "opd_family.py", "opd_family_config")
  methods = set()
  for command in runs:
    flags = dict(a[2:].split("=", 1) for a in command if a.startswith("--") and "=" in a)
    config = config_module.get_config(flags["config"].split(":", 1)[1])
    for key, value in flags.items():  # the command's --config.* overrides, as strings
      if key.startswith("config.distill."):
        name = key[len("config.distill."):]
        config.distill[name] = type(config.distill[name])(value)  # as config_flags parses
    methods.add(opd_family.validate_distill(config).name)
    assert flags["config.steps"] == "40" and flags["config.eval_examples"] == "256"
  assert methods == {"grpo", "opd", "tv_opd", "opd_then_rl", "joint:kdrl", "joint:hdpo", "oprd",
                     "joint:kdrl_mask", "joint:srpo", "joint:trrd", "joint:rlsd",
                     "joint:kdrl_annealing", "opdvr", "tgopd", "grpd"}
