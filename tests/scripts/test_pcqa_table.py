"""scripts/pcqa_table.py on a hand-written workdir: the `capable` stage is a row when present."""

import json
from pathlib import Path

import pytest
from absl import app, flags

from jaxrl_post import script_flags
from jaxrl_post.config_args import load_module

ROOT = Path(__file__).resolve().parents[2]
DATASETS = ("syn_a", "syn_b", "syn_c")


def _write_run(run: Path, srcc: float, steps=(10,)):
  run.mkdir(parents=True)
  final = {"time/run": 1.0}
  for d in DATASETS:
    final |= {f"{d}/plcc": srcc, f"{d}/srcc": srcc, f"{d}/score_std": 0.5, f"{d}/unparseable": 0}
  (run / "final.json").write_text(json.dumps(final))
  (run / "metrics.jsonl").write_text("".join(
    json.dumps({"step": s, "eval/ood_avg/srcc": srcc}) + "\n" for s in steps))


def _workdir(tmp_path: Path, *, capable: bool) -> Path:
  seed = tmp_path / "seed_0"
  (seed / "base").mkdir(parents=True)
  (seed / "base" / "config.json").write_text(json.dumps({"datasets": ",".join(DATASETS),
                                                         "source": "syn_a"}))
  if capable:
    _write_run(seed / "capable", 0.5, steps=(50, 100))
  _write_run(seed / "sft", 0.6, steps=(150, 200))
  _write_run(seed / "rank", 0.4, steps=(150, 200))
  return tmp_path


def _main(workdir: Path, out: Path) -> list[str]:
  # The command line `pcqa_table.py --workdir=W --out=PREFIX` (absl flags).
  script = load_module(ROOT / "scripts" / "pcqa_table.py")
  script.main(script_flags.parse(script.FLAGS, ["pcqa_table.py", f"--workdir={workdir}",
                                                f"--out={out}"]))
  return Path(f"{out}_table.md").read_text().splitlines()


def test_capable_stage_is_the_first_row_when_present(tmp_path):
  rows = _main(_workdir(tmp_path / "cap", capable=True), tmp_path / "cap_out")
  assert [r.split("|")[1].strip() for r in rows[2:]] == ["capable", "sft", "rank"]
  assert rows[2].startswith("| capable | 1 | 0.500±0.000 / 0.500±0.000")
  assert Path(f"{tmp_path / 'cap_out'}_curves.png").exists()
  rows = _main(_workdir(tmp_path / "plain", capable=False), tmp_path / "plain_out")
  assert [r.split("|")[1].strip() for r in rows[2:]] == ["sft", "rank"]


def test_flags_are_required_and_positionals_refused(tmp_path):
  script = load_module(ROOT / "scripts" / "pcqa_table.py")
  with pytest.raises(flags.IllegalFlagValueError, match="--workdir"):
    script_flags.parse(script.FLAGS, ["pcqa_table.py", f"--out={tmp_path / 'x'}"])
  argv = script_flags.parse(script.FLAGS, ["pcqa_table.py", f"--workdir={tmp_path}",
                                           f"--out={tmp_path / 'x'}", "stray"])
  with pytest.raises(app.UsageError, match="stray"):
    script.main(argv)


def test_hidden_quality_reference_row_scores_q_against_each_target_mos(tmp_path):
  from scipy import stats

  from jaxrl_post.tasks import point_clouds as pc

  script = load_module(ROOT / "scripts" / "pcqa_table.py")
  datasets = ("syn_a", "syn_d", "syn_e")
  row = script.hidden_quality_row(datasets, source="syn_a", test_size=40, num_points=16)
  for d in datasets:
    samples = [pc.make_sample(d, "test", i, num_points=16) for i in range(40)]
    expected = stats.spearmanr([s.quality for s in samples], [s.mos for s in samples])[0]
    assert row[f"{d}/srcc"] == pytest.approx([expected, 0.0])
  assert row["syn_a/srcc"][0] > 0.9 and row["syn_d/srcc"][0] < 0.6  # the shift is not monotone
  assert row["ood_avg/srcc"][0] == pytest.approx(
    (row["syn_d/srcc"][0] + row["syn_e/srcc"][0]) / 2)
  # --reference appends it as the table's last row (the run's test_size / num_points).
  workdir = _workdir(tmp_path / "w", capable=False)
  config = workdir / "seed_0" / "base" / "config.json"
  config.write_text(json.dumps({"datasets": ",".join(DATASETS), "source": "syn_a",
                                "test_size": 8, "num_points": 16}))
  out = tmp_path / "out"
  script.main(script_flags.parse(script.FLAGS, ["pcqa_table.py", f"--workdir={workdir}",
                                                f"--out={out}", "--reference"]))
  rows = Path(f"{out}_table.md").read_text().splitlines()
  assert rows[-1].startswith("| source's hidden q (reference) | 1 |")
