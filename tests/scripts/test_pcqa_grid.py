"""scripts/pcqa_grid.py's command line (absl flags; the words after `--` go to every run)."""

import subprocess
import sys
from pathlib import Path

import pytest
from absl import flags

from jaxrl_post import script_flags
from jaxrl_post.config_args import load_module

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "pcqa_synthetic.py"


SCRIPT = load_module(ROOT / "scripts" / "pcqa_grid.py")


def test_dry_run_prints_every_run_with_the_extra_flags(tmp_path, capsys):
  argv = script_flags.parse(SCRIPT.FLAGS, ["pcqa_grid.py", f"--config={CONFIG}:runlocal",
                                           f"--workdir={tmp_path}", "--dry-run", "--",
                                           "--config.eval_every=100"])
  assert argv == ["pcqa_grid.py", "--config.eval_every=100"]
  assert SCRIPT.main(argv) == 0
  lines = capsys.readouterr().out.splitlines()
  assert [line.split("method=")[1].split()[0] for line in lines] == [
    run.name for run, _ in SCRIPT.grid_runs(f"{CONFIG}:runlocal", str(tmp_path))]
  assert all(line.endswith(" --config.eval_every=100") for line in lines)
  assert not any(tmp_path.iterdir())  # nothing run
  with pytest.raises(flags.IllegalFlagValueError, match="--config"):
    script_flags.parse(SCRIPT.FLAGS, ["pcqa_grid.py", f"--workdir={tmp_path}"])


def test_command_line_through_absl_app(tmp_path):
  command = [sys.executable, str(ROOT / "scripts" / "pcqa_grid.py"), f"--config={CONFIG}",
             f"--workdir={tmp_path}", "--dry-run"]
  result = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  assert f"--workdir={tmp_path / 'seed_0' / 'base'}" in result.stdout
