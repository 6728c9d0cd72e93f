"""scripts/opd_table.py: the Open-MOPD table's arithmetic on hand-written metrics files."""

import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest
from absl import app

from jaxrl_post import script_flags
from jaxrl_post.config_args import load_module

ROOT = Path(__file__).resolve().parents[2]


SCRIPT = load_module(ROOT / "scripts" / "opd_table.py")


def _write(run: Path, records, seconds=None):
  run.mkdir(parents=True)
  (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
  if seconds is not None:
    (run / "DONE").write_text(str(seconds))


def _accuracies(prefix, values):
  return {f"{prefix}/{d}/accuracy": v for d, v in zip(SCRIPT.DOMAINS, values)}


def test_table_reads_references_and_computes_recovery_and_gap(tmp_path):
  # MixSFT Total 0.5, RouteRL Total 0.8, RouteOPD Total (0.9 + 0.6 + 0.9) / 3 = 0.8.
  _write(tmp_path / "route", [{"step": 0, **_accuracies("route", (0.9, 0.6, 0.9)),
                               **_accuracies("eval", (0.6, 0.3, 0.6))}])
  for d, acc in zip(SCRIPT.DOMAINS, (0.9, 0.6, 0.9)):
    _write(tmp_path / f"route_opd_{d}", [{"step": 2, f"eval/{d}/accuracy": acc}], 60)
  # Two naive seeds: Totals 0.6 and 0.7 → recovery 33.3 % and 66.7 %, gap 0.2 and 0.1.
  for seed, (accs, share) in enumerate([((0.6, 0.6, 0.6), 0.5), ((0.8, 0.5, 0.8), 0.7)]):
    _write(tmp_path / "naive" / f"seed{seed}",
           [{"step": 0, **_accuracies("eval", (0.6, 0.3, 0.6))},
            {"step": 1, "domain/arith/token_share": share, "domain/arith/budget_share": 0.4},
            {"step": 2, "domain/arith/token_share": share, "domain/arith/budget_share": 0.6},
            {"step": 2, **_accuracies("eval", accs)}], 120)
  # An unfinished run (no DONE) is left out.
  _write(tmp_path / "naive" / "seed2", [{"step": 2, **_accuracies("eval", (1.0, 1.0, 1.0))}])

  data = SCRIPT.collect(tmp_path)
  assert data["mixsft"] == pytest.approx(dict(zip(SCRIPT.DOMAINS, (0.6, 0.3, 0.6))))
  assert data["route_opd"]["countdown"] == 0.6
  text = SCRIPT.table(data)
  row = next(line for line in text.splitlines() if line.startswith("| naive M-OPD"))
  cells = [c.strip() for c in row.strip("|").split("|")]
  assert cells[1] == "2"  # seeds
  assert cells[5] == "0.650 ± 0.071"  # Total: mean and sample std of 0.6, 0.7
  assert cells[6] == "50.0 ± 23.6 %"  # recovery: 1/3 and 2/3
  assert cells[7] == "0.150 ± 0.071"  # integration gap: 0.2 and 0.1
  assert cells[8].startswith("0.60 ± 0.14 / —")  # arith token share: means 0.5 and 0.7
  assert cells[10] == "2.0 ± 0.0"  # minutes per run
  assert "route_opd_arith 1.0" in text
  SCRIPT.plots(data, tmp_path)
  assert (tmp_path / "opd_domains.png").stat().st_size > 0
  assert (tmp_path / "opd_shares.png").stat().st_size > 0


def test_command_line_writes_the_table_and_the_plots(tmp_path, capsys):
  # `opd_table.py ROOT --out=FILE --plots=DIR` (absl flags; the root positional).
  _write(tmp_path / "route", [{"step": 0, **_accuracies("route", (0.9, 0.6, 0.9)),
                               **_accuracies("eval", (0.6, 0.3, 0.6))}])
  _write(tmp_path / "naive" / "seed0",
         [{"step": 1, "domain/arith/token_share": 0.5, "domain/arith/budget_share": 0.4},
          {"step": 2, **_accuracies("eval", (0.6, 0.6, 0.6))}], 60)
  out, plot_dir = tmp_path / "table.md", tmp_path / "plots"
  SCRIPT.main(script_flags.parse(SCRIPT.FLAGS, ["opd_table.py", str(tmp_path), f"--out={out}",
                                                f"--plots={plot_dir}"]))
  assert "| naive M-OPD" in out.read_text() and out.read_text() in capsys.readouterr().out
  assert (plot_dir / "opd_domains.png").exists() and (plot_dir / "opd_shares.png").exists()
  argv = script_flags.parse(SCRIPT.FLAGS, ["opd_table.py", f"--out={out}"])
  with pytest.raises(app.UsageError, match="expected one root"):
    SCRIPT.main(argv)


def test_reproduce_script_commands(tmp_path):
  """scripts/opd_reproduce.sh, dry run: every stage once, each with its own workdir."""
  env = dict(os.environ, DRY_RUN="1", SEEDS="0 1", FORMAT_SFT_STEPS="5")
  out = subprocess.run(["bash", str(ROOT / "scripts" / "opd_reproduce.sh"), str(tmp_path)],
                       capture_output=True, text=True, env=env, check=True, timeout=60).stdout
  commands = [shlex.split(line[len("+ "):]) for line in out.splitlines() if line.startswith("+ ")]
  # MixSFT, the format SFT, 3 teachers, the references, 6 methods × 2 seeds, 3 RouteOPD students.
  assert len(commands) == 1 + 1 + 3 + 1 + 6 * 2 + 3, out
  workdirs = [a.split("=", 1)[1] for c in commands for a in c if a.startswith("--workdir=")]
  assert len(workdirs) == len(commands) == len(set(workdirs))
  assert f"{tmp_path}/open_mopd/seed1" in workdirs and f"{tmp_path}/route" in workdirs
