"""scripts/perception_table.py: its command line (absl flags) on hand-written metrics files."""

import json
from pathlib import Path

import pytest
from absl import app

from jaxrl_post import script_flags
from jaxrl_post.config_args import load_module

ROOT = Path(__file__).resolve().parents[2]


SCRIPT = load_module(ROOT / "scripts" / "perception_table.py")


def test_command_line_prints_the_table_and_writes_the_plots(tmp_path, capsys):
  for seed, f1 in ((0, 0.5), (1, 0.7)):
    run = tmp_path / "root" / f"s{seed}" / "sft"
    run.mkdir(parents=True)
    record = {"step": 400, **{key: f1 for key, _ in SCRIPT.COLUMNS}, "eval/ref/mcc": 0.25,
              **{f"eval/dense/{k}@0.5/{b}": f1 for k in ("f1", "nms_f1") for b in SCRIPT.BUCKETS}}
    (run / "metrics.jsonl").write_text(json.dumps(record) + "\n")
    (run / "done").write_text("30")
  for name in ("rl", "rl_paper"):  # RL training records only (the curves' plots)
    rl = tmp_path / "root" / "s0" / name
    rl.mkdir()
    (rl / "metrics.jsonl").write_text("".join(json.dumps(
      {"step": step, "train/reward": -1.0, "train/pred_per_gt": 1.0, "train/entropy_coord": 2.0,
       "train/update_norm": 1e-3} | ({"eval/dense/f1@0.5": 0.4, "eval/ref/mcc": 0.1}
                                     if name == "rl_paper" and step == 2 else {}))
      + "\n" for step in (1, 2)))
  # As docs/results.md writes it: the root positional, `--plots DIR --prefix NAME` (no `=`).
  argv = script_flags.parse(SCRIPT.FLAGS, ["perception_table.py", str(tmp_path / "root"),
                                           "--plots", str(tmp_path / "plots"),
                                           "--prefix", "pointer"])
  SCRIPT.main(argv)
  text = capsys.readouterr().out
  assert "seeds: [0, 1]" in text
  assert "| SFT (400 steps) (n=2) | 0.600 ± 0.100 |" in text and "0.250 ± 0.000 |" in text
  assert "| 30 |" in text and "s0 0.500/0.250, s1 0.700/0.250" in text
  assert "rl_paper: s0 0.400/0.100" in text
  for name in ("f1_by_count", "nms", "rl_curves", "optimizer"):
    assert (tmp_path / "plots" / f"pointer_{name}.png").exists(), name
  assert script_flags.parse(SCRIPT.FLAGS, ["perception_table.py", "r"]) == ["perception_table.py",
                                                                            "r"]
  assert SCRIPT.FLAGS.plots is None and SCRIPT.FLAGS.prefix == "perception"  # defaults again
  with pytest.raises(app.UsageError, match="expected one root"):
    SCRIPT.main(script_flags.parse(SCRIPT.FLAGS, ["perception_table.py", "a", "b"]))
